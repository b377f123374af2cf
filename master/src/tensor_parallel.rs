//! Split mode `row`: tensor parallelism across RPC workers (see [`compute::model::shard`]).
//!
//! Every worker holds one shard of every layer (its query heads, its feed-forward channels, its
//! vocabulary rows) and the KV cache of the KV heads its query heads read. This process keeps the
//! residual stream: the embedding lookup runs here; per layer, the attention phase and then the
//! feed-forward phase are sent to all workers at once — SET_TENSOR of the residual, GRAPH_COMPUTE
//! of that phase's segment, GET_TENSOR of the partial result, written back to back so a phase
//! costs one round trip per worker, overlapped across workers — and the partial sums are added to
//! the residual here.
//! The last phase returns each worker's vocabulary rows of the logits.
//!
//! With llama.cpp's own `ggml-rpc-server` (or `--no-worker-links`, or TLS) only commands of the
//! plain protocol 7.0.0 are used. When every worker is llamad and granted its extension
//! ([`llamad_proto::ext`]), the workers are linked to each other once after loading; each phase
//! graph is stored on its worker once per graph shape, and a ubatch is one TP_RUN per worker: the
//! workers exchange their partial sums over the links and add them in shard order — the same bits
//! as the relay — and only the logits come back here. That turns `2 × layers + 1` master round trips
//! per token into one. The per-ubatch inputs (positions, mask, KV indices) are written once per
//! ubatch; every phase's graph blob is encoded once per graph shape. A long ubatch on linked
//! workers of extension version 2 runs as two streams (its halves, interleaved phase by phase on
//! the workers, [`STREAM_MIN_TOKENS`]), so that one half computes while the other's partial sums
//! travel.
//!
//! The sums run in a different order than one device's matmul, so the logits differ from the
//! in-process run in the last bits (split mode `layer` stays token-identical to llama.cpp).

use std::collections::HashSet;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{bail, err, Context, Result};
use compute::model::local::{plan, Plan};
use compute::model::session::{fill_inputs, ubatch_params};
use compute::model::shard::{build_shard, plan_shards, shard_hparams, ShardGraph, ShardSource, ShardSpec};
use compute::model::{BuildParams, HParams, Model, SessionConfig, Storage, TensorId, WeightSource};
use llamad_proto::client::read_response;
use llamad_proto::msg::{GetTensorReq, SetTensorHeader};
use llamad_proto::{ext, Cmd, Command, RpcTensor};

use super::export::{export_nodes, wire_id};
use super::pipeline::{free_of, LoadEvent, SplitOptions};
use super::remote::{mib, Region, StagingSink, Worker, WorkerLayout};
use super::Forward;

/// Everything a worker needs for one graph shape.
struct Prepared {
    sg: ShardGraph,
    plan: Plan,
    /// Per segment: the encoded GRAPH_COMPUTE frame.
    frames: Vec<Vec<u8>>,
    /// Per segment at protocol 8.0.0: the graph's uid (0 at 7.0.0) and the GRAPH_RECOMPUTE frame
    /// that replays it once the server stores it.
    recomputes: Vec<(u64, Vec<u8>)>,
    /// Per segment: the encoded GET_TENSOR frame of its output and the output's size.
    gets: Vec<(Vec<u8>, u64)>,
    /// Per segment: the rpc_tensor of its input (`x` or `x_out`).
    inputs: Vec<RpcTensor>,
}

/// One worker and its shard.
struct Shard {
    w: Worker,
    spec: ShardSpec,
    hp: HParams,
    src: Arc<ShardSource>,
    /// Per stream (see [`STREAM_MIN_TOKENS`]): the graph of its latest shape.
    prepared: [Option<Prepared>; 2],
    /// The second stream's compute buffer (the first uses the worker's).
    alt_compute: Option<Region>,
    /// Time spent waiting for this worker's partial results.
    wait: Duration,
}

/// The row-split master.
pub struct TensorParallel {
    hp: HParams,
    src: Arc<dyn WeightSource>,
    cfg: SessionConfig,
    shards: Vec<Shard>,
    n_past: u64,
    phases: u64,
    /// The workers exchange partial sums over their own links (see the module doc).
    linked: bool,
    /// Linked workers run long ubatches as two interleaved streams (TP_RUN_STREAMS).
    streams: bool,
    /// The last token's logits of the latest decode (lent out by [`Forward::decode`]).
    logits: Vec<f32>,
}

impl TensorParallel {
    /// Connects, splits every layer across the workers (in proportion to `--tensor-split`, else
    /// evenly), allocates and uploads the shards.
    pub fn new(
        model: &Model,
        cfg: SessionConfig,
        addrs: &[String],
        opts: &SplitOptions,
        on_load: &(dyn Fn(usize, LoadEvent<'_>) + Sync),
    ) -> Result<TensorParallel> {
        if addrs.is_empty() {
            bail!("split mode row needs at least one worker");
        }
        if opts.n_gpu_layers.is_some_and(|n| n <= model.hp.n_layer) {
            bail!("split mode row puts every layer on the workers; -ngl applies to split mode layer only");
        }
        let hp = model.hp.clone();
        let src = model.src.clone();
        let weights: Vec<f64> = if opts.tensor_split.iter().any(|&w| w > 0.0) {
            if opts.tensor_split.len() != addrs.len() {
                bail!("--tensor-split has {} values for {} workers", opts.tensor_split.len(), addrs.len());
            }
            opts.tensor_split.clone()
        } else {
            vec![1.0; addrs.len()]
        };
        let specs =
            plan_shards(&hp, src.as_ref(), &weights).context("splitting the layers across the workers")?;
        let mut shards = Vec::new();
        for (a, spec) in addrs.iter().zip(specs) {
            let w = Worker::connect_auth(a, opts.auth.as_ref(), opts.tls.as_ref())?;
            let shp = shard_hparams(&hp, &spec);
            let ssrc = Arc::new(ShardSource::new(src.clone(), &hp, &spec)?);
            tracing::info!(addr = %a, ?spec, "row split shard");
            shards.push(Shard {
                w,
                spec,
                hp: shp,
                src: ssrc,
                prepared: [None, None],
                alt_compute: None,
                wait: Duration::ZERO,
            });
        }
        let n_tok = cfg.n_ubatch.min(cfg.n_ctx);
        let max_params = BuildParams { n_kv: cfg.n_ctx, ..ubatch_params(&hp, &cfg, 0, n_tok, 1) };
        crate::set_io_timeout(shards.iter_mut().map(|s| &mut s.w), opts.io_timeout)?;
        let mut layouts = Vec::new();
        // Streams need a second compute buffer, for half a ubatch; without room for it the ubatch
        // runs as one stream.
        let mut room_for_streams = n_tok as usize >= STREAM_MIN_TOKENS;
        for s in &shards {
            let lay = layout(s, &max_params)?;
            let free = free_of(&s.w);
            if room_for_streams {
                let half =
                    BuildParams { n_kv: cfg.n_ctx, ..ubatch_params(&hp, &cfg, 0, n_tok.div_ceil(2), 1) };
                let sg = build_shard(&s.hp, s.src.as_ref(), &s.spec, &half)?;
                room_for_streams = lay.total() + plan(&sg.built.graph, &[])?.size <= free;
            }
            if lay.total() > free {
                bail!(
                    "worker {} needs {} for its shard ({} weights, {} KV cache, {} compute) but reports {} free",
                    s.w.addr,
                    mib(lay.total()),
                    mib(lay.weight_bytes()),
                    mib(lay.kv_size),
                    mib(lay.compute_size),
                    mib(free)
                );
            }
            if let Some((name, bytes)) = &lay.oversize {
                bail!(
                    "weight {name} ({}) exceeds worker {}'s maximum buffer size ({})",
                    mib(*bytes),
                    s.w.addr,
                    mib(s.w.probe.max_size)
                );
            }
            layouts.push(lay);
        }
        let n_layer = hp.n_layer;
        let jobs = shards.iter_mut().zip(&layouts).enumerate().map(|(i, (s, lay))| {
            let src: &dyn WeightSource = s.src.as_ref();
            (i, &mut s.w, lay, 0..n_layer, src)
        });
        super::pipeline::upload_all(jobs, opts, on_load)?;
        let can_link = shards.len() >= 2
            && !opts.no_worker_links
            && opts.tls.is_none()
            && shards.iter().all(|s| s.w.client.ext_version().is_some_and(|v| v >= 1));
        // TP_RUN_STREAMS came with version 2.
        let streams = room_for_streams
            && shards.iter().all(|s| s.w.client.ext_version().is_some_and(|v| v >= 2))
            && std::env::var("LLAMACTL_TP_STREAMS").as_deref() != Ok("0");
        let linked = can_link
            && match link_workers(&mut shards)? {
                Ok(()) => true,
                Err(why) => {
                    tracing::warn!(%why, "the workers could not link to each other; partial sums go through this process");
                    false
                }
            };
        let streams = linked && streams;
        tracing::info!(linked, streams, workers = shards.len(), "split mode row");
        Ok(TensorParallel { hp, src, cfg, shards, n_past: 0, phases: 0, linked, streams, logits: Vec::new() })
    }

    /// Whether the workers exchange partial sums directly (see the module doc).
    pub fn linked(&self) -> bool {
        self.linked
    }

    /// Whether long ubatches run as two interleaved streams on the linked workers.
    pub fn streams(&self) -> bool {
        self.streams
    }

    /// `(address, shard)` of each worker.
    pub fn shards(&self) -> Vec<(String, ShardSpec)> {
        self.shards.iter().map(|s| (s.w.addr.clone(), s.spec.clone())).collect()
    }

    /// Bytes of each shard's KV cache, in shard order.
    pub fn kv_bytes(&self) -> Vec<u64> {
        self.shards.iter().map(|s| s.w.kv_bytes()).collect()
    }

    fn decode_ubatch(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        if self.streams && tokens.len() >= STREAM_MIN_TOKENS {
            return self.decode_streams(tokens);
        }
        let hp = &self.hp;
        let p = ubatch_params(hp, &self.cfg, self.n_past, tokens.len() as u64, 1);
        let n_past = self.n_past;
        let linked = self.linked;
        for s in &mut self.shards {
            prepare(s, &p, linked, 0)?;
            write_attention_inputs(s, 0, n_past, tokens)?;
        }
        let (e, t, o) = (hp.n_embd as usize, p.n_tokens as usize, p.n_outputs as usize);
        if linked {
            let x = super::pipeline::embed(self.src.as_ref(), tokens)?;
            let logits = run_linked(&mut self.shards, &[(&x, t)], o, e, 2 * hp.n_layer + 1)?;
            self.phases += u64::from(2 * hp.n_layer + 1);
            self.n_past += tokens.len() as u64;
            return Ok(logits);
        }
        let mut x: Vec<f32> = super::pipeline::embed(self.src.as_ref(), tokens)?
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let mut x_out: Vec<f32> = Vec::new();
        let n_seg = 2 * hp.n_layer as usize + 1;
        let mut bytes = Vec::new();
        let mut logits = Vec::new();
        for k in 0..n_seg {
            let head = k + 1 == n_seg;
            let last_ffn = k + 2 == n_seg;
            let cur: &mut Vec<f32> = if head || last_ffn { &mut x_out } else { &mut x };
            bytes.clear();
            bytes.extend(cur.iter().flat_map(|v| v.to_le_bytes()));
            // Send the phase to every worker, then collect: the workers compute concurrently.
            for s in &mut self.shards {
                send_phase(s, k, &bytes)?;
            }
            self.phases += 1;
            for s in &mut self.shards {
                let part = recv_phase(s, k)?;
                if head {
                    logits.push(part);
                    continue;
                }
                if part.len() != cur.len() * 4 {
                    bail!("worker {}: partial of {} bytes, expected {}", s.w.addr, part.len(), cur.len() * 4);
                }
                for (v, b) in cur.iter_mut().zip(part.chunks_exact(4)) {
                    *v += f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            if k + 3 == n_seg {
                // After the last layer's attention only the output rows go on (llama.cpp's out_ids).
                x_out = x[(t - o) * e..].to_vec();
            }
        }
        // Logits of the last output row: each worker's vocabulary slice, in shard order.
        let mut out = Vec::with_capacity(hp.n_vocab as usize);
        for (s, part) in self.shards.iter().zip(&logits) {
            let nv = (s.spec.vocab.end - s.spec.vocab.start) as usize;
            if part.len() != nv * o * 4 {
                bail!("worker {}: {} bytes of logits, expected {}", s.w.addr, part.len(), nv * o * 4);
            }
            let row = &part[(o - 1) * nv * 4..];
            out.extend(row.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
        }
        self.n_past += tokens.len() as u64;
        Ok(out)
    }

    /// A long ubatch on linked workers as two micro-batches, the first `⌈T/2⌉` tokens and the rest,
    /// each a ubatch of its own (its own graphs, slots and compute buffer) that the workers run
    /// interleaved, so the partial sums of one travel while the other computes. The logits are
    /// those of running the two halves one after the other.
    fn decode_streams(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let hp = &self.hp;
        let half = tokens.len().div_ceil(2);
        let parts = [(self.n_past, &tokens[..half]), (self.n_past + half as u64, &tokens[half..])];
        let e = hp.n_embd as usize;
        let params: Vec<BuildParams> = parts
            .iter()
            .map(|(n_past, toks)| ubatch_params(hp, &self.cfg, *n_past, toks.len() as u64, 1))
            .collect();
        for s in &mut self.shards {
            // Growing one stream's compute buffer frees the old one, and the worker then drops every
            // graph it stored, the other stream's too (`prepare` forgets both): prepare both until
            // neither was dropped (a second pass finds the buffers large enough).
            for _ in 0..3 {
                for (stream, p) in params.iter().enumerate() {
                    prepare(s, p, true, stream)?;
                }
                if s.prepared.iter().all(Option::is_some) {
                    break;
                }
            }
            if !s.prepared.iter().all(Option::is_some) {
                bail!("internal: worker {}: the two streams' graphs could not both be stored", s.w.addr);
            }
        }
        let mut xs = Vec::with_capacity(2);
        for (stream, (n_past, toks)) in parts.iter().enumerate() {
            for s in &mut self.shards {
                write_attention_inputs(s, stream, *n_past, toks)?;
            }
            xs.push((super::pipeline::embed(self.src.as_ref(), toks)?, toks.len()));
        }
        let n_seg = 2 * hp.n_layer + 1;
        let xs: Vec<(&[u8], usize)> = xs.iter().map(|(x, t)| (x.as_slice(), *t)).collect();
        let logits = run_linked(&mut self.shards, &xs, 1, e, n_seg)?;
        self.phases += u64::from(2 * n_seg);
        self.n_past += tokens.len() as u64;
        Ok(logits)
    }
}

/// Ubatches of at least this many tokens run as two streams on linked workers (version 2): the
/// overlap pays for the extra phase per layer once a phase computes for milliseconds.
const STREAM_MIN_TOKENS: usize = 128;

/// The buffers of a shard (no network traffic).
fn layout(s: &Shard, max_params: &BuildParams) -> Result<WorkerLayout> {
    let align = s.w.probe.alignment.max(1);
    let sg = build_shard(&s.hp, s.src.as_ref(), &s.spec, max_params).context("building the shard graph")?;
    let mut out = WorkerLayout::default();
    let weights = sg.built.graph.tensors().iter().filter_map(|t| match &t.storage {
        Storage::Weight(name) => Some((name.clone(), t.layout.nbytes().unwrap_or(0))),
        _ => None,
    });
    out.pack_weights(weights, align, s.w.probe.max_size);
    out.add_kv(
        0..s.hp.n_layer,
        (s.hp.n_embd_k_gqa(), s.hp.n_embd_v_gqa()),
        max_params.kv_type,
        max_params.kv_size,
        align,
    )?;
    out.compute_size = plan(&sg.built.graph, &[])?.size;
    Ok(out)
}

/// The compute buffer of `stream` (the first uses the worker's).
fn compute_slot(s: &mut Shard, stream: usize) -> &mut Option<Region> {
    if stream == 0 {
        &mut s.w.compute
    } else {
        &mut s.alt_compute
    }
}

/// Builds, places and encodes the shard graph of `p` for `stream` (kept while the shape stays the
/// same); when `linked`, stores each segment on the worker as extension slot
/// `stream × segments + index`.
fn prepare(s: &mut Shard, p: &BuildParams, linked: bool, stream: usize) -> Result<()> {
    if s.prepared[stream].as_ref().is_some_and(|pr| pr.sg.built.params == *p) {
        return Ok(());
    }
    s.prepared[stream] = None;
    let sg = build_shard(&s.hp, s.src.as_ref(), &s.spec, p)?;
    let pl = plan(&sg.built.graph, &[])?;
    let have = compute_slot(s, stream).map_or(0, |c| c.size);
    if pl.size > have {
        tracing::info!(addr = %s.w.addr, stream, old = have, new = pl.size, "growing the compute buffer");
        if let Some(c) = compute_slot(s, stream).take() {
            s.w.client.free_buffer(c.handle)?;
            s.w.all_regions.retain(|&h| h != c.handle);
            // A freed buffer drops every graph the worker stored: the other stream stores anew.
            s.prepared = [None, None];
        }
        let c = s.w.alloc(pl.size, "compute buffer")?;
        *compute_slot(s, stream) = Some(c);
    }
    let slot_base = stream * sg.segments.len();
    let uids = s.w.client.protocol().graph == llamad_proto::version::GraphFormat::Uid;
    let first_uid = if uids { s.w.client.reserve_uids(sg.segments.len() as u64) } else { 0 };
    let compute = *compute_slot(s, stream);
    let g = &sg.built.graph;
    let w = &s.w;
    let place = |id: TensorId, t: &compute::model::TensorDef| w.place_in(&pl, id, &t.storage, compute);
    let rpc = |id: TensorId| -> Result<RpcTensor> {
        let def = g.get(id);
        let owner = g.owner(id);
        let (b, d) = w
            .place_in(&pl, owner, &g.get(owner).storage, compute)
            .ok_or_else(|| err!("internal: tensor {} has no place", def.name))?;
        Ok(RpcTensor::new(wire_id(id), &def.layout, b, d + def.view_offs))
    };
    let mut frames = Vec::new();
    let mut recomputes = Vec::new();

    let mut gets = Vec::new();
    let mut inputs = Vec::new();
    let mut stores = Vec::new();
    for (k, seg) in sg.segments.iter().enumerate() {
        let blob = export_nodes(g, &g.nodes()[seg.nodes.clone()], &HashSet::new(), w.device, &place);
        for t in &blob.tensors {
            let def = g.get(TensorId((t.id - 1) as u32));
            if t.data == 0 && def.layout.nbytes().unwrap_or(0) > 0 {
                bail!("internal: tensor {} has no place on worker {}", def.name, w.addr);
            }
        }
        let size = g.layout(seg.output).nbytes().unwrap_or(0);
        let (input, output) = (rpc(seg.input)?, rpc(seg.output)?);
        if linked {
            stores.extend(ext::graph_store_frame((slot_base + k) as u32, &input, &output, &blob));
        }
        let uid = if uids { first_uid + k as u64 } else { 0 };
        frames.push(Command::GraphCompute(blob, uids.then_some(uid)).encode_frame());
        let device = s.w.device;
        recomputes.push((uid, Command::GraphRecompute { device, uid: Some(uid) }.encode_frame()));
        let req = GetTensorReq { tensor: output, offset: 0, size };
        gets.push((Command::GetTensor(req).encode_frame(), size));
        inputs.push(input);
    }
    if linked {
        s.w.client
            .stream()
            .write_all(&stores)
            .with_context(|| format!("worker {}: storing the phase graphs", s.w.addr))?;
    }
    s.prepared[stream] = Some(Prepared { sg, plan: pl, frames, recomputes, gets, inputs });
    Ok(())
}

/// Links every pair of workers (LINK_OFFER on the lower rank, then LINK_DIAL and LINK_ACCEPT).
/// The outer error is a broken connection; the inner one a link that could not be made (the workers
/// stay usable and the caller relays instead).
fn link_workers(shards: &mut [Shard]) -> Result<std::result::Result<(), String>> {
    for i in 0..shards.len() {
        for j in i + 1..shards.len() {
            let token: [u8; ext::TOKEN_SIZE] = rand::random();
            let (lo, hi) = shards.split_at_mut(j);
            let (a, b) = (&mut lo[i].w, &mut hi[0].w);
            let host = a.client.socket().peer_addr().map_err(crate::Error::from)?.ip().to_string();
            a.client.stream().write_all(&ext::link_offer_frame(&token))?;
            let port = read_answer(a, 2, "LINK_OFFER")?;
            let port = u16::from_le_bytes([port[0], port[1]]);
            let dial = ext::LinkDial { peer_rank: i as u32, token, port, host };
            b.client.stream().write_all(&dial.encode_frame())?;
            a.client.stream().write_all(&ext::link_accept_frame(j as u32, &token))?;
            let accepted = read_answer(a, 1, "LINK_ACCEPT")?;
            let dialled = read_answer(b, 1, "LINK_DIAL")?;
            if accepted != [1] || dialled != [1] {
                return Ok(Err(format!("{} could not reach {}:{port}", b.addr, dial.host)));
            }
        }
    }
    Ok(Ok(()))
}

/// The first worker that no longer accepts connections (the likely cause when a linked run fails
/// on another worker, which only lost its link to it).
fn unreachable(shards: &[Shard]) -> Option<String> {
    use std::net::ToSocketAddrs;
    shards
        .iter()
        .map(|s| &s.w.addr)
        .find(|a| match a.to_socket_addrs().ok().and_then(|mut v| v.next()) {
            Some(sock) => std::net::TcpStream::connect_timeout(&sock, Duration::from_secs(1)).is_err(),
            None => true,
        })
        .cloned()
}

fn read_answer(w: &mut Worker, size: u64, what: &str) -> Result<Vec<u8>> {
    read_response(w.client.stream(), Cmd::GraphCompute, size)
        .with_context(|| format!("worker {}: answer to the extension's {what}", w.addr))
}

/// Worker `i`'s answer to a linked run (`size` bytes); when it failed, says which worker is gone.
fn read_linked_answer(shards: &mut [Shard], i: usize, size: u64) -> Result<Vec<u8>> {
    let t0 = Instant::now();
    let s = &mut shards[i];
    match read_response(s.w.client.stream(), Cmd::GraphCompute, size) {
        Ok(p) => {
            s.wait += t0.elapsed();
            Ok(p)
        }
        Err(e) => {
            let e = crate::Error::from(e).context(format!(
                "worker {} failed in the linked ubatch; if it closed the connection, its log says why",
                s.w.addr
            ));
            Err(match unreachable(shards) {
                Some(gone) => e.context(format!("worker {gone} is gone (the others lost their link to it)")),
                None => e,
            })
        }
    }
}

/// One ubatch on linked workers, as one stream or several (`xs`: per stream its residual and
/// token count, the stream `k` in slots `k × n_seg..`, the last `o` rows of each wanted): TP_RUN
/// (one stream) or TP_RUN_STREAMS to all, then each worker's slice of the logits of the last
/// output row of the last stream, in shard order.
fn run_linked(
    shards: &mut [Shard],
    xs: &[(&[u8], usize)],
    o: usize,
    e: usize,
    n_seg: u32,
) -> Result<Vec<f32>> {
    let n = shards.len() as u32;
    for (rank, s) in shards.iter_mut().enumerate() {
        let runs: Vec<ext::TpRun<'_>> = (0u32..)
            .zip(xs)
            .map(|(k, &(x, t))| ext::TpRun {
                rank: rank as u32,
                n_ranks: n,
                n_tokens: t as u32,
                n_outputs: o as u32,
                n_embd: e as u32,
                slots: (k * n_seg..(k + 1) * n_seg).collect(),
                x,
            })
            .collect();
        let frame = match runs.as_slice() {
            [one] => one.encode_frame(),
            _ => ext::tp_run_streams_frame(&runs),
        };
        s.w.client
            .stream()
            .write_all(&frame)
            .with_context(|| format!("worker {}: sending the ubatch", s.w.addr))?;
    }
    let mut out = Vec::new();
    for i in 0..shards.len() {
        let nv = (shards[i].spec.vocab.end - shards[i].spec.vocab.start) as usize;
        // Each stream answers its output rows, one after the other.
        let part = read_linked_answer(shards, i, (nv * o * 4 * xs.len()) as u64)?;
        let row = &part[part.len() - nv * 4..];
        out.extend(row.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
    }
    Ok(out)
}

/// Writes the ubatch's positions, mask and KV indices (every input but the residual stream) for
/// `stream`'s graph.
fn write_attention_inputs(s: &mut Shard, stream: usize, n_past: u64, tokens: &[u32]) -> Result<()> {
    let compute = *compute_slot(s, stream);
    let pr = s.prepared[stream].as_ref().ok_or_else(|| err!("internal: not prepared"))?;
    let g = &pr.sg.built.graph;
    let mut sink = StagingSink::new(&pr.sg.built);
    // The residual stream goes with each phase (or TP_RUN), not here.
    sink.staged.remove(&pr.sg.x);
    sink.staged.remove(&pr.sg.x_out);
    fill_inputs(&s.hp, &pr.sg.built, n_past, tokens, &mut sink)?;
    for (id, bytes) in &sink.staged {
        let def = g.get(*id);
        let (b, d) =
            s.w.place_in(&pr.plan, *id, &def.storage, compute)
                .ok_or_else(|| err!("internal: input {} has no place", def.name))?;
        let t = RpcTensor::new(wire_id(*id), &def.layout, b, d);
        s.w.client.set_tensor(&t, 0, bytes, false).with_context(|| format!("worker {}", s.w.addr))?;
    }
    Ok(())
}

/// SET_TENSOR of the phase input, GRAPH_COMPUTE of segment `k` (at 8.0.0 GRAPH_RECOMPUTE by uid
/// once the server stores it), GET_TENSOR of its output, in one write.
fn send_phase(s: &mut Shard, k: usize, input: &[u8]) -> Result<()> {
    let pr = s.prepared[0].as_ref().ok_or_else(|| err!("internal: not prepared"))?;
    let h = SetTensorHeader { tensor: pr.inputs[k], cache_flag: 0, offset: 0 };
    let mut msg = Command::SetTensor(h, input).encode_frame();
    let (uid, recompute) = &pr.recomputes[k];
    if s.w.client.holds_graph(s.w.device, *uid) {
        msg.extend_from_slice(recompute);
    } else {
        msg.extend_from_slice(&pr.frames[k]);
        s.w.client.track_graph(s.w.device, *uid);
    }
    msg.extend_from_slice(&pr.gets[k].0);
    s.w.client.stream().write_all(&msg).with_context(|| format!("worker {}: sending phase {k}", s.w.addr))
}

/// The GET_TENSOR answer of segment `k`.
fn recv_phase(s: &mut Shard, k: usize) -> Result<Vec<u8>> {
    let t0 = Instant::now();
    let pr = s.prepared[0].as_ref().ok_or_else(|| err!("internal: not prepared"))?;
    let size = pr.gets[k].1;
    let r = read_response(s.w.client.stream(), Cmd::GetTensor, size).with_context(|| {
        format!("worker {} failed in phase {k}; if it closed the connection, its log says why", s.w.addr)
    });
    s.wait += t0.elapsed();
    r
}

impl Forward for TensorParallel {
    fn decode(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        crate::check_decode(tokens, self.hp.n_vocab, self.n_past, self.cfg.n_ctx)?;
        for chunk in tokens.chunks(self.cfg.n_ubatch as usize) {
            self.logits = self.decode_ubatch(chunk).context("forward pass (split mode row)")?;
        }
        Ok(&self.logits)
    }

    fn n_past(&self) -> u64 {
        self.n_past
    }

    fn clear(&mut self) -> Result<()> {
        for s in &mut self.shards {
            s.w.clear_kv().with_context(|| format!("worker {}: clearing the KV cache", s.w.addr))?;
        }
        self.n_past = 0;
        Ok(())
    }

    fn summary(&self) -> Vec<String> {
        let how = if self.linked { "linked workers" } else { "relayed here" };
        let mut v =
            vec![format!("split mode row: {} phases on {} workers ({how})", self.phases, self.shards.len())];
        v.extend(self.shards.iter().map(|s| {
            format!(
                "{} heads {:?} (kv {:?}), ffn {:?}, vocab {:?}: {:.2} ms waiting",
                s.w.addr,
                s.spec.q_heads,
                s.spec.kv_heads(),
                s.spec.ff,
                s.spec.vocab,
                s.wait.as_secs_f64() * 1000.0
            )
        }));
        v
    }
}
