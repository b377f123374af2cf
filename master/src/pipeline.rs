//! The RPC master: embeds tokens here, runs the leading `L + 1 - ngl` layers here (if any), then
//! hands the hidden state through each worker's layer range; the last range returns the logits.
//!
//! With `n_slots` > 1 ([`Pipeline::with_slots`]) the workers' KV caches hold several sequences,
//! interleaved by position as in-process ([`compute::model::batch`]), and
//! [`Pipeline::decode_batch`] decodes chunks of several of them in one ubatch: each token with its
//! own slot, position, cell and mask row, the logits of each chunk's last token out of the last
//! range. The ubatch is built by [`BatchUbatch`], the in-process batch's own construction; one
//! sequence is the case of one slot.
//!
//! ref: ggml-rpc-protocol.md §11.3 (assignment), §11.5 (command flow); ggml-compute-semantics.md
//! §4.8 (the input layer stays on the master; each layer's KV cache lives with the layer).

use std::ops::Range;
use std::sync::Arc;

use crate::error::{bail, err, Context, Result};
use compute::model::batch::check_chunks;
use compute::model::local::LocalBackend;
use compute::model::session::ubatch_params;
use compute::model::{BatchUbatch, BuildParams, HParams, Model, SeqChunk, SessionConfig, WeightSource};
use compute::quant::kernels;
use compute::GgmlType;

use super::hash_memo::HashMemo;
use super::remote::{mib, UploadStats, Worker, WorkerLayout};
use super::split::{assign_slots, LayerPlan};
use super::upload::UploadOptions;
use super::Forward;

/// How the model is split.
#[derive(Clone, Debug, Default)]
pub struct SplitOptions {
    /// Longest silence allowed from a worker while an answer is awaited, after HELLO (None: wait as
    /// long as it takes; a graph may legitimately compute for minutes). With it, a worker whose host
    /// vanished without closing the connection fails the call instead of blocking it forever.
    pub io_timeout: Option<std::time::Duration>,
    /// `--tensor-split` weights (empty or all zero = by free memory).
    pub tensor_split: Vec<f64>,
    /// `-ngl` (None = all layers and the output on the workers).
    pub n_gpu_layers: Option<u32>,
    /// Weight writes above this size try SET_TENSOR_HASH first (a write is one weight, or a run of
    /// small neighbouring weights of one layer; see [`crate::upload`]).
    pub hash_threshold: u64,
    /// Known wire hashes of the model file's writes, and where new ones are recorded (`None`: every
    /// hash is computed).
    pub hash_memo: Option<Arc<HashMemo>>,
    /// Shared secret for workers that ask for authentication (`--secret-file`).
    pub auth: Option<llamad_proto::auth::AuthKey>,
    /// TLS to the workers, trusting this CA (`--tls-ca`); `None`: plain TCP.
    pub tls: Option<llamad_proto::TlsClient>,
    /// Split mode row: relay every partial sum through this process even when all workers are
    /// llamad and could exchange them directly (`--no-worker-links`).
    pub no_worker_links: bool,
}

/// Called while loading: `(worker index, event)`.
pub enum LoadEvent<'a> {
    /// Upload of `total` bytes of weights to the worker starts.
    Start {
        /// Worker address.
        addr: &'a str,
        /// Layers it holds.
        layers: Range<u32>,
        /// Bytes of weights.
        total: u64,
    },
    /// `bytes` more were uploaded.
    Progress(u64),
    /// Done.
    Done(UploadStats),
}

/// The master pipeline.
pub struct Pipeline {
    hp: HParams,
    src: Arc<dyn WeightSource>,
    /// `n_ctx` is the cells of one slot.
    cfg: SessionConfig,
    local: Option<LocalBackend>,
    local_layers: u32,
    workers: Vec<Worker>,
    /// Tokens each slot's sequence holds (one slot unless [`Pipeline::with_slots`]).
    n_past: Vec<u64>,
    /// The last ubatch's logits, one row per output (reused between tokens).
    logits: Vec<f32>,
    /// Long ubatches run as pipelined micro-batches (see [`Pipeline::decode_pipelined`]): two or
    /// more workers, no layers here, and not turned off with `LLAMACTL_PIPELINE=0`.
    pipelined: bool,
}

/// One worker's upload: its index, the worker, its layout, the layers it holds, the weights' source.
pub(super) type UploadJob<'w> = (usize, &'w mut Worker, &'w WorkerLayout, Range<u32>, &'w dyn WeightSource);

/// Uploads each worker's weights on its own thread, reporting Start/Progress/Done through `on_load`;
/// the first error wins.
pub(super) fn upload_all<'w>(
    jobs: impl Iterator<Item = UploadJob<'w>>,
    opts: &SplitOptions,
    on_load: &(dyn Fn(usize, LoadEvent<'_>) + Sync),
) -> Result<()> {
    let up = UploadOptions { hash_threshold: opts.hash_threshold, memo: opts.hash_memo.as_deref() };
    let up = &up;
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .map(|(i, w, lay, layers, src)| {
                s.spawn(move || -> Result<()> {
                    on_load(
                        i,
                        LoadEvent::Start { addr: &w.addr, layers: layers.clone(), total: lay.weight_bytes() },
                    );
                    let stats = w.load(lay, src, layers, up, &|b| on_load(i, LoadEvent::Progress(b)))?;
                    on_load(i, LoadEvent::Done(stats));
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(err!("upload thread panicked"))))
            .collect()
    });
    results.into_iter().collect()
}

impl Pipeline {
    /// Connects to the workers, splits the layers, allocates and uploads.
    pub fn new(
        model: &Model,
        cfg: SessionConfig,
        addrs: &[String],
        opts: &SplitOptions,
        on_load: &(dyn Fn(usize, LoadEvent<'_>) + Sync),
    ) -> Result<Pipeline> {
        Pipeline::with_slots(model, cfg, 1, addrs, opts, on_load)
    }

    /// [`Pipeline::new`] with KV caches of `n_slots` sequences of `cfg.n_ctx` cells each (a
    /// server's parallel slots), decoded together with [`Pipeline::decode_batch`].
    pub fn with_slots(
        model: &Model,
        cfg: SessionConfig,
        n_slots: usize,
        addrs: &[String],
        opts: &SplitOptions,
        on_load: &(dyn Fn(usize, LoadEvent<'_>) + Sync),
    ) -> Result<Pipeline> {
        if n_slots == 0 || cfg.n_ctx == 0 || cfg.n_ubatch == 0 {
            bail!("n_ctx, n_ubatch and the slot count must be positive");
        }
        let hp = model.hp.clone();
        let src = model.src.clone();
        let mut workers = Vec::new();
        for a in addrs {
            workers.push(Worker::connect_auth(a, opts.auth.as_ref(), opts.tls.as_ref())?);
        }
        let weights: Vec<f64> = if opts.tensor_split.iter().any(|&w| w > 0.0) {
            if opts.tensor_split.len() > workers.len() {
                bail!("--tensor-split has {} values for {} workers", opts.tensor_split.len(), workers.len());
            }
            let mut w = opts.tensor_split.clone();
            w.resize(workers.len(), 0.0);
            w
        } else {
            workers.iter().map(|w| free_of(w) as f64).collect()
        };
        let slots = assign_slots(hp.n_layer, opts.n_gpu_layers, &weights);
        let plan = LayerPlan::from_slots(&slots);
        tracing::info!(?plan, "layer split");
        crate::set_io_timeout(workers.iter_mut(), opts.io_timeout)?;
        if let Some((theirs, ours)) = plan.head_moved() {
            // Same numbers either way (every device computes like the CPU backend); only the memory
            // placement of output_norm/output differs from llama.cpp's.
            tracing::warn!(
                ?theirs,
                ?ours,
                "llama.cpp would run the output layer on another device than the last layer; it runs with \
                 the last layer here"
            );
        }

        // The largest ubatch decides the compute buffers: every cell of every slot attended, a row
        // of logits per slot.
        let kv_size = cfg.n_ctx * n_slots as u64;
        let n_tok = cfg.n_ubatch.min(kv_size);
        let max_params = BuildParams {
            n_kv: kv_size,
            kv_size,
            ..ubatch_params(&hp, &cfg, 0, n_tok, (n_slots as u64).min(n_tok))
        };
        let mut layouts: Vec<Option<(Range<u32>, WorkerLayout)>> = (0..workers.len()).map(|_| None).collect();
        let mut short = Vec::new();
        for (d, range) in &plan.remote {
            let w = &workers[*d];
            let lay = w.layout(&hp, src.as_ref(), range.clone(), &max_params)?;
            let free = free_of(w);
            if lay.total() > free {
                short.push(format!(
                    "worker {} needs {} for layers {}..{} ({} weights, {} KV cache, {} compute) but reports {} \
                     free: short by {}",
                    w.addr,
                    mib(lay.total()),
                    range.start,
                    range.end,
                    mib(lay.weight_bytes()),
                    mib(lay.kv_size),
                    mib(lay.compute_size),
                    mib(free),
                    mib(lay.total() - free)
                ));
            }
            layouts[*d] = Some((range.clone(), lay));
        }
        if short.is_empty() {
            for (d, _) in &plan.remote {
                if let Some((_, lay)) = &layouts[*d] {
                    if let Some((name, bytes)) = &lay.oversize {
                        bail!(
                            "weight {name} ({}) exceeds worker {}'s maximum buffer size ({})",
                            mib(*bytes),
                            workers[*d].addr,
                            mib(workers[*d].probe.max_size)
                        );
                    }
                }
            }
        }
        if !short.is_empty() {
            bail!(
                "the model does not fit in the workers' memory: {} (use a smaller --ctx-size, more workers, \
                 --tensor-split, or -ngl to keep layers here)",
                short.join("; ")
            );
        }
        // Upload to all workers in parallel, one thread per worker.
        let jobs = workers.iter_mut().zip(&layouts).enumerate().filter_map(|(i, (w, lay))| {
            lay.as_ref().map(|(range, lay)| (i, w, lay, range.clone(), src.as_ref()))
        });
        upload_all(jobs, opts, on_load)?;
        // Keep only the workers with layers, in layer order.
        let mut order: Vec<(u32, Worker)> = Vec::new();
        for (w, lay) in workers.into_iter().zip(layouts) {
            match lay {
                Some((range, _)) => order.push((range.start, w)),
                None => tracing::info!(addr = %w.addr, "worker gets no layers"),
            }
        }
        order.sort_by_key(|(s, _)| *s);
        let workers: Vec<Worker> = order.into_iter().map(|(_, w)| w).collect();
        let local = if plan.local > 0 {
            Some(LocalBackend::new(src.clone(), hp.clone(), cfg.n_threads)?)
        } else {
            None
        };
        // Every layer is somewhere: local [0, k) and contiguous remote ranges up to n_layer.
        let mut next = plan.local;
        for w in &workers {
            if w.layers.start != next {
                bail!("internal: layer plan has a gap at layer {next}");
            }
            next = w.layers.end;
        }
        if next != hp.n_layer {
            bail!("internal: layer plan ends at {next} of {}", hp.n_layer);
        }
        let pipelined =
            workers.len() >= 2 && local.is_none() && std::env::var("LLAMACTL_PIPELINE").as_deref() != Ok("0");
        Ok(Pipeline {
            hp,
            src,
            cfg,
            local,
            local_layers: plan.local,
            workers,
            n_past: vec![0; n_slots],
            logits: Vec::new(),
            pipelined,
        })
    }

    /// The workers in layer order.
    pub fn workers(&self) -> &[Worker] {
        &self.workers
    }

    /// The workers, mutable (to read weights back with [`Worker::read_weight`]).
    pub fn workers_mut(&mut self) -> &mut [Worker] {
        &mut self.workers
    }

    /// Layers computed in this process.
    pub fn local_layers(&self) -> u32 {
        self.local_layers
    }

    /// Slots (sequences the KV caches hold).
    pub fn n_slots(&self) -> usize {
        self.n_past.len()
    }

    /// Cells of one slot.
    pub fn slot_ctx(&self) -> u64 {
        self.cfg.n_ctx
    }

    /// Tokens `slot`'s sequence holds.
    pub fn slot_past(&self, slot: usize) -> u64 {
        self.n_past.get(slot).copied().unwrap_or(0)
    }

    /// Decodes `chunks` (distinct slots, at most `n_ubatch` tokens in all) as one ubatch, after the
    /// tokens each slot holds, and returns the logits of each chunk's last token (`chunks.len()`
    /// rows of `n_vocab`, in chunk order), as [`compute::model::BatchSession::decode`] does.
    pub fn decode_batch(&mut self, chunks: &[SeqChunk<'_>]) -> Result<&[f32]> {
        check_chunks(chunks, &self.n_past, self.cfg.n_ctx, self.cfg.n_ubatch, self.hp.n_vocab)?;
        let ub = BatchUbatch::new(chunks, &self.n_past);
        self.decode_ubatch(&ub).context("forward pass")?;
        Ok(&self.logits)
    }

    /// Forgets `slot`'s sequence: its positions restart at 0. Nothing is sent: its stale cells on
    /// the workers are written again before any mask shows them.
    pub fn clear_slot(&mut self, slot: usize) -> Result<()> {
        let n = self.n_past.len();
        *self.n_past.get_mut(slot).ok_or_else(|| err!("slot {slot} out of range ({n} slots)"))? = 0;
        Ok(())
    }

    fn decode_ubatch(&mut self, ub: &BatchUbatch) -> Result<()> {
        let m = if self.pipelined { micro_batches(ub.len(), self.workers.len()) } else { 1 };
        if m > 1 {
            return self.decode_pipelined(ub, m);
        }
        let (hp, src) = (&self.hp, self.src.as_ref());
        let base = ub.params(hp, &self.cfg, self.cfg.n_ctx);
        let fill = |b: &compute::model::Built, w: &mut dyn compute::model::arch::InputSink| ub.fill(hp, b, w);
        let mut cur = if let Some(local) = self.local.as_mut() {
            let p = BuildParams { layers: 0..self.local_layers, ..base.clone() };
            let out = local.run(&p, |b, w| ub.fill(hp, b, w))?.output;
            local.tensor_bytes(out)?.to_vec()
        } else {
            embed(src, &ub.tokens().collect::<Vec<_>>())?
        };
        for w in &mut self.workers {
            let p = BuildParams { layers: w.layers.clone(), ..base.clone() };
            cur = w.run_ubatch(hp, src, &p, &fill, &cur)?;
        }
        self.logits.clear();
        self.take_logits(&cur, ub.n_outputs())?;
        ub.advance(&mut self.n_past);
        Ok(())
    }

    /// Runs a ubatch as `m` micro-batches through the workers' layer ranges in a wavefront: at step
    /// `s` worker `w` computes micro-batch `s - w`, so all workers compute at once instead of in
    /// turn. Each step writes every busy worker's work before reading any answer. Every micro-batch
    /// is computed exactly as a ubatch of its own would be (its tokens, positions and KV extent), so
    /// the logits are those of decoding the micro-batches one after another.
    fn decode_pipelined(&mut self, ub: &BatchUbatch, m: usize) -> Result<()> {
        let n = ub.len();
        let parts: Vec<(BatchUbatch, usize)> = (0..m).map(|i| ub.part(i * n / m..(i + 1) * n / m)).collect();
        let out = self.wavefront(&parts);
        if out.is_err() {
            // An answer left unread would be taken for the next command's: read what still comes.
            for w in &mut self.workers {
                let _ = w.recv_ubatch();
            }
        }
        let outs = out?;
        self.logits.clear();
        // Each micro-batch's real outputs come first; one without any gave a row that is dropped.
        for ((_, real), cur) in parts.iter().zip(&outs) {
            let row = self.hp.n_vocab as usize * 4;
            self.take_logits(cur.get(..real * row).unwrap_or(cur), *real)?;
        }
        ub.advance(&mut self.n_past);
        Ok(())
    }

    /// The last range's outputs of each micro-batch.
    fn wavefront(&mut self, parts: &[(BatchUbatch, usize)]) -> Result<Vec<Vec<u8>>> {
        let (hp, src, cfg) = (&self.hp, self.src.as_ref(), &self.cfg);
        let m = parts.len();
        let k = self.workers.len();
        // carry[i]: micro-batch i's hidden state on its way to the next range.
        let mut carry: Vec<Vec<u8>> = vec![Vec::new(); m];
        for step in 0..m + k - 1 {
            let busy = |w: usize| step.checked_sub(w).filter(|&i| i < m);
            for (w, worker) in self.workers.iter_mut().enumerate() {
                let Some(i) = busy(w) else { continue };
                let part = &parts[i].0;
                let p = BuildParams { layers: worker.layers.clone(), ..part.params(hp, cfg, cfg.n_ctx) };
                let hidden = if w == 0 {
                    embed(src, &part.tokens().collect::<Vec<_>>())?
                } else {
                    std::mem::take(&mut carry[i])
                };
                let fill = |b: &compute::model::Built, s: &mut dyn compute::model::arch::InputSink| {
                    part.fill(hp, b, s)
                };
                worker.send_ubatch(hp, src, &p, &fill, &hidden)?;
            }
            for (w, worker) in self.workers.iter_mut().enumerate() {
                if let Some(i) = busy(w) {
                    carry[i] = worker.recv_ubatch()?;
                }
            }
        }
        Ok(carry)
    }

    /// Appends the last range's output, `n` rows of F32 logits, to the logits.
    fn take_logits(&mut self, cur: &[u8], n: usize) -> Result<()> {
        if cur.len() as u64 != self.hp.n_vocab * 4 * n as u64 {
            bail!("expected {n} rows of {} logits, got {} bytes", self.hp.n_vocab, cur.len());
        }
        self.logits.extend(cur.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
        Ok(())
    }
}

/// How many micro-batches a ubatch of `n_tokens` runs as on a pipelined [`Pipeline`]: enough to give
/// each at least [`MICRO_MIN`] tokens, at most [`MICRO_PER_WORKER`] per worker (1: run it whole).
fn micro_batches(n_tokens: usize, n_workers: usize) -> usize {
    (n_tokens / MICRO_MIN).clamp(1, MICRO_PER_WORKER * n_workers)
}

/// The smallest micro-batch: below it a worker's products lose more to short panels than the
/// pipeline gains.
const MICRO_MIN: usize = 64;

/// At most this many micro-batches per worker: `k` workers finish `m` micro-batches in `m + k - 1`
/// steps, so 4 per worker keeps the pipeline's fill and drain under a fifth of the time.
const MICRO_PER_WORKER: usize = 4;

impl Forward for Pipeline {
    fn decode(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        crate::check_decode(tokens, self.hp.n_vocab, self.n_past[0], self.cfg.n_ctx)?;
        for chunk in tokens.chunks(self.cfg.n_ubatch as usize) {
            let ub = BatchUbatch::new(&[SeqChunk { slot: 0, tokens: chunk }], &self.n_past);
            self.decode_ubatch(&ub).context("forward pass")?;
        }
        Ok(&self.logits)
    }

    fn n_past(&self) -> u64 {
        self.n_past[0]
    }

    fn clear(&mut self) -> Result<()> {
        if let Some(local) = self.local.as_mut() {
            local.clear_kv();
        }
        for w in &mut self.workers {
            w.clear_kv().with_context(|| format!("worker {}: clearing the KV cache", w.addr))?;
        }
        self.n_past.iter_mut().for_each(|n| *n = 0);
        Ok(())
    }

    fn summary(&self) -> Vec<String> {
        self.workers
            .iter()
            .map(|w| {
                format!(
                    "{} layers {}..{}: {} graphs ({} recomputed), {:.2} ms",
                    w.addr,
                    w.layers.start,
                    w.layers.end,
                    w.graphs_sent,
                    w.recomputes,
                    w.busy.as_secs_f64() * 1000.0
                )
            })
            .collect()
    }
}

/// The token embeddings of `tokens` as F32 `[E, T]` bytes (the input layer runs on the master).
pub(super) fn embed(src: &dyn WeightSource, tokens: &[u32]) -> Result<Vec<u8>> {
    // ref: ggml-compute-semantics.md §3.3 GET_ROWS: each row converted to f32.
    let w = src.tensor("token_embd.weight").ok_or_else(|| err!("missing tensor token_embd.weight"))?;
    let e = w.ne[0];
    let row = w.dtype.row_size(e).ok_or_else(|| err!("token_embd.weight: bad row"))? as usize;
    let mut out = Vec::with_capacity(tokens.len() * e as usize * 4);
    let mut f = vec![0f32; e as usize];
    for &t in tokens {
        let start = t as usize * row;
        let bytes =
            w.data.get(start..start + row).ok_or_else(|| err!("token {t} outside token_embd.weight"))?;
        if w.dtype == GgmlType::F32 {
            out.extend_from_slice(bytes);
            continue;
        }
        let to_f32 = kernels(w.dtype)
            .to_f32
            .ok_or_else(|| err!("token_embd.weight of type {} cannot be dequantized", w.dtype))?;
        to_f32(bytes, &mut f);
        out.extend(f.iter().flat_map(|x| x.to_le_bytes()));
    }
    Ok(out)
}

/// A worker's free memory; one reporting 0 free of 0 total counts as this machine's available
/// memory, as llama.cpp's master does (ref: ggml-rpc-protocol.md §11.3 step 1).
pub(super) fn free_of(w: &Worker) -> u64 {
    if w.probe.free == 0 && w.probe.total == 0 {
        host_free()
    } else {
        w.probe.free
    }
}

/// This machine's available memory (for workers that report 0/0, ref §11.3 step 1).
fn host_free() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(1 << 30, |kb| kb * 1024)
}
