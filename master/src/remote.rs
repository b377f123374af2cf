//! One RPC worker: connection and probing, buffer layout, weight upload, ubatch execution.
//!
//! Command flow (ref: ggml-rpc-protocol.md §11.5): HELLO (version check), DEVICE_COUNT,
//! GET_DEVICE_MEMORY, GET_ALIGNMENT, GET_MAX_SIZE; ALLOC_BUFFER + BUFFER_GET_BASE for the weights
//! (several buffers when GET_MAX_SIZE demands), SET_TENSOR per weight or per run of small weights of
//! a layer (SET_TENSOR_HASH first above the hash threshold, pipelined, then SET_TENSOR with
//! `cache_flag = 1` on a miss, ref §9; see [`crate::upload`]); one KV buffer
//! (BUFFER_CLEAR 0); one compute buffer sized once for the largest ubatch. Per ubatch: SET_TENSOR
//! for every graph input, GRAPH_COMPUTE — or GRAPH_RECOMPUTE when the graph (same build
//! parameters, hence same shapes and addresses) is the one last sent on this connection (§8.4,
//! §15 item 33) — and GET_TENSOR of the output (the hidden state or the logits).

use std::collections::{HashMap, HashSet};
use std::net::{TcpStream, ToSocketAddrs};
use std::ops::Range;
use std::time::Duration;

use crate::error::{bail, err, Context, Result};
use compute::model::arch::InputSink;
use compute::model::local::{plan, Plan};
use compute::model::{build, BuildParams, Built, HParams, KvKind, Storage, TensorId, WeightSource};
use compute::tensor::Layout;
use llamad_proto::version::GraphFormat;
use llamad_proto::{GraphBlob, RpcClient, RpcTensor};

use super::export::{export, wire_id, Place};
use super::upload::{self, Placed, UploadOptions};

/// Alignment of our compute-buffer offsets (`compute::model::local::ALIGN`); workers must not
/// require more.
const PLAN_ALIGN: u64 = compute::model::local::ALIGN;

/// How long to wait for a TCP connection to a worker.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One remote buffer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Region {
    pub(super) handle: u64,
    pub(super) base: u64,
    pub(super) size: u64,
}

/// What the worker reported when probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Devices on the server (only device 0 is used).
    pub devices: u32,
    /// Free bytes of device 0.
    pub free: u64,
    /// Total bytes of device 0.
    pub total: u64,
    /// Buffer alignment.
    pub alignment: u64,
    /// Largest single buffer.
    pub max_size: u64,
}

/// One weight buffer: its size and `(name, offset, bytes)` of each weight in it.
pub type WeightBuffer = (u64, Vec<(String, u64, u64)>);

/// Memory a worker needs for its layer range.
#[derive(Clone, Debug, Default)]
pub struct WorkerLayout {
    /// Weight buffers: size and `(name, offset, bytes)` of each weight.
    pub weight_bufs: Vec<WeightBuffer>,
    /// KV buffer size.
    pub kv_size: u64,
    /// Offset of each (layer, K|V) cache in the KV buffer.
    pub kv_offsets: HashMap<(u32, KvKind), u64>,
    /// Compute buffer size (inputs and intermediates of the largest ubatch).
    pub compute_size: u64,
    /// A weight larger than the worker's maximum buffer size, if any.
    pub oversize: Option<(String, u64)>,
}

impl WorkerLayout {
    /// Lays out `weights` (`(name, bytes)` in graph order) in weight buffers of at most `max_size`
    /// bytes, each weight at [`upload::place_after`]'s offset, and notes the first one larger than
    /// `max_size`.
    pub(crate) fn pack_weights(
        &mut self,
        weights: impl IntoIterator<Item = (String, u64)>,
        align: u64,
        max_size: u64,
    ) {
        let mut cur: WeightBuffer = (0, Vec::new());
        for (name, bytes) in weights {
            let padded = bytes.div_ceil(align) * align;
            if padded > max_size && self.oversize.is_none() {
                self.oversize = Some((name.clone(), bytes));
            }
            let prev = cur.1.last().map(|(n, _, b)| (n.as_str(), *b));
            let mut off = upload::place_after(prev, cur.0, &name, bytes, align);
            if !cur.1.is_empty() && off + padded > max_size {
                self.weight_bufs.push(std::mem::take(&mut cur));
                off = 0;
            }
            cur.1.push((name, off, bytes));
            cur.0 = off + padded;
        }
        if !cur.1.is_empty() {
            self.weight_bufs.push(cur);
        }
    }

    /// Places the K and V caches of `layers`, `kv_size` cells of `kv_type` each, a cell being
    /// `k_rows` (K) or `v_rows` (V) values (the KV heads this worker holds times the head size), one
    /// after the other in the KV buffer, each padded to `align`. This is what the fit check counts
    /// against the worker's free memory (its `--mem`) at the requested context size.
    pub(crate) fn add_kv(
        &mut self,
        layers: Range<u32>,
        (k_rows, v_rows): (u64, u64),
        kv_type: compute::GgmlType,
        kv_size: u64,
        align: u64,
    ) -> Result<()> {
        for il in layers {
            for (kind, rows) in [(KvKind::K, k_rows), (KvKind::V, v_rows)] {
                let bytes = Layout::contiguous(kv_type, [rows, kv_size, 1, 1])
                    .ok()
                    .and_then(|l| l.nbytes())
                    .ok_or_else(|| err!("KV cache of layer {il} is too large"))?;
                self.kv_offsets.insert((il, kind), self.kv_size);
                self.kv_size = bytes
                    .checked_next_multiple_of(align.max(1))
                    .and_then(|b| self.kv_size.checked_add(b))
                    .ok_or_else(|| err!("KV cache of layer {il} is too large"))?;
            }
        }
        Ok(())
    }

    /// Total bytes of weights.
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bufs.iter().map(|(s, _)| s).sum()
    }

    /// Everything.
    pub fn total(&self) -> u64 {
        self.weight_bytes() + self.kv_size + self.compute_size
    }
}

/// Upload counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct UploadStats {
    /// Weight bytes sent with SET_TENSOR.
    pub bytes_sent: u64,
    /// Weight bytes the worker already had (SET_TENSOR_HASH answered 1).
    pub bytes_cached: u64,
    /// Weights uploaded.
    pub tensors: u64,
    /// Writes they took (neighbouring small weights of a layer share one).
    pub writes: u64,
    /// Writes offered with SET_TENSOR_HASH.
    pub hashed: u64,
}

struct Prepared {
    built: Built,
    plan: Plan,
    blob: GraphBlob,
    /// BLAKE3 of the blob's encoding: two graphs with the same key are the same graph on the server
    /// (same ops, shapes and addresses), so a stored one may be replayed by uid (8.0.0).
    key: [u8; 32],
    /// The token-embedding GET_ROWS result sent as an input (first range only).
    embd: Option<TensorId>,
}

/// A connected worker holding one layer range.
pub struct Worker {
    /// `host:port` as given.
    pub addr: String,
    pub(super) client: RpcClient,
    /// Device used on the server.
    pub device: u32,
    /// Probe results.
    pub probe: Probe,
    /// Layers `[first, last)` this worker computes.
    pub layers: Range<u32>,
    weights: HashMap<String, Place>,
    kv: Option<Region>,
    kv_offsets: HashMap<(u32, KvKind), u64>,
    pub(super) compute: Option<Region>,
    pub(super) all_regions: Vec<u64>,
    prepared: Option<Prepared>,
    /// True when the server's last graph for `device` is `prepared.blob`.
    graph_on_server: bool,
    /// 8.0.0: the uid each graph went with, by its key; the server keeps up to 1024 of them, so a
    /// graph seen before (the next repetition of a benchmark, the next request's first decode steps)
    /// is replayed by uid instead of sent again.
    graph_uids: HashMap<[u8; 32], u64>,
    /// GRAPH_COMPUTE / GRAPH_RECOMPUTE counts.
    pub graphs_sent: u64,
    /// GRAPH_RECOMPUTE count.
    pub recomputes: u64,
    /// Time spent in [`Worker::run_ubatch`] (inputs, compute, output).
    pub busy: std::time::Duration,
    /// The ubatch sent and not yet answered.
    in_flight: Option<InFlight>,
}

/// A ubatch sent with [`Worker::send_ubatch`]: the size of its output and the layers it ran.
struct InFlight {
    bytes: u64,
    layers: Range<u32>,
}

impl Worker {
    /// Connects, checks the protocol version and probes device 0.
    pub fn connect(addr: &str) -> Result<Worker> {
        Worker::connect_auth(addr, None, None)
    }

    /// As [`Worker::connect`], over TLS when `tls` is given, authenticating with `key` when the
    /// worker asks for it.
    pub fn connect_auth(
        addr: &str,
        key: Option<&llamad_proto::auth::AuthKey>,
        tls: Option<&llamad_proto::TlsClient>,
    ) -> Result<Worker> {
        let socks: Vec<_> = addr
            .to_socket_addrs()
            .with_context(|| format!("worker {addr}: cannot resolve the address (expected HOST:PORT)"))?
            .collect();
        if socks.is_empty() {
            bail!("worker {addr}: the address resolves to nothing");
        }
        // Every resolved address in turn (`localhost` may give ::1 before 127.0.0.1).
        let mut last = None;
        let mut stream = None;
        for sock in &socks {
            match TcpStream::connect_timeout(sock, CONNECT_TIMEOUT) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = match (stream, last) {
            (Some(s), _) => s,
            (None, e) => {
                let e = e.unwrap_or_else(|| std::io::Error::other("no address"));
                return Err(crate::Error::from(e).context(format!(
                    "worker {addr} is unreachable (is `llamad -H HOST -p PORT` running there?)"
                )));
            }
        };
        stream.set_nodelay(true).ok();
        // HELLO must be answered quickly; compute may take long, so the timeout is lifted after.
        stream.set_read_timeout(Some(CONNECT_TIMEOUT)).ok();
        let mut client = RpcClient::handshake(stream, addr, tls, key).map_err(|e| match e {
            llamad_proto::Error::Tls(why) => err!("worker {addr}: TLS: {why}"),
            llamad_proto::Error::Auth(why) => err!(
                "worker {addr}: {why} (llamactl run --secret-file FILE, the worker's server.secret_file)"
            ),
            llamad_proto::Error::Version { major, minor, patch } => err!(
                "worker {addr} speaks RPC protocol version {major}.{minor}.{patch}, but llamactl speaks \
                 8.0.x and 7.0.x (upgrade the worker or llamactl so both speak the same version)"
            ),
            llamad_proto::Error::Io(io)
                if matches!(io.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
            {
                err!(
                    "worker {addr} accepted the connection but did not answer HELLO within {} s (is it \
                     serving another master? llama.cpp's ggml-rpc-server serves one connection at a time)",
                    CONNECT_TIMEOUT.as_secs()
                )
            }
            other => crate::Error::from(other)
                .context(format!("worker {addr}: HELLO failed (is it an RPC server?)")),
        })?;
        client.socket().set_read_timeout(None).ok();
        let probe = (|| -> llamad_proto::Result<Probe> {
            let devices = client.device_count()?;
            if devices == 0 {
                return Ok(Probe { devices, free: 0, total: 0, alignment: 1, max_size: 0 });
            }
            let m = client.get_device_memory(0)?;
            Ok(Probe {
                devices,
                free: m.free,
                total: m.total,
                alignment: client.get_alignment(0)?,
                max_size: client.get_max_size(0)?,
            })
        })()
        .with_context(|| format!("worker {addr}: probing the device failed"))?;
        if probe.devices == 0 {
            bail!("worker {addr} reports no devices");
        }
        if !probe.alignment.is_power_of_two() || probe.alignment > PLAN_ALIGN {
            bail!(
                "worker {addr}: alignment {} is not supported (a power of two ≤ {PLAN_ALIGN})",
                probe.alignment
            );
        }
        if probe.max_size == 0 {
            bail!("worker {addr} reports a maximum buffer size of 0");
        }
        if probe.devices > 1 {
            tracing::info!(addr, devices = probe.devices, "worker has several devices; using device 0");
        }
        tracing::info!(addr, ?probe, "worker connected");
        Ok(Worker {
            addr: addr.to_string(),
            client,
            device: 0,
            probe,
            layers: 0..0,
            weights: HashMap::new(),
            kv: None,
            kv_offsets: HashMap::new(),
            compute: None,
            all_regions: Vec::new(),
            prepared: None,
            graph_on_server: false,
            graph_uids: HashMap::new(),
            graphs_sent: 0,
            recomputes: 0,
            busy: std::time::Duration::ZERO,
            in_flight: None,
        })
    }

    /// Works out the buffers this worker needs for `layers` (no network traffic).
    pub fn layout(
        &self,
        hp: &HParams,
        src: &dyn WeightSource,
        layers: Range<u32>,
        max_params: &BuildParams,
    ) -> Result<WorkerLayout> {
        let align = self.probe.alignment.max(1);
        let p = BuildParams { layers: layers.clone(), ..max_params.clone() };
        let built = build(hp, src, &p).with_context(|| format!("building the graph of layers {layers:?}"))?;
        let embd = embd_substitute(&built)?;
        // Weights reachable from the executed nodes (the embedding table is not, unless tied to the
        // LM head).
        let as_inputs: HashSet<TensorId> = embd.into_iter().collect();
        let blob = export(&built.graph, &as_inputs, 0, &|_, _| None);
        let mut names = Vec::new();
        for t in &blob.tensors {
            let def = built.graph.get(TensorId((t.id - 1) as u32));
            if let Storage::Weight(name) = &def.storage {
                names.push((name.clone(), def.layout.nbytes().unwrap_or(0)));
            }
        }
        let mut out = WorkerLayout::default();
        out.pack_weights(names, align, self.probe.max_size);
        out.add_kv(layers, (hp.n_embd_k_gqa(), hp.n_embd_v_gqa()), p.kv_type, p.kv_size, align)?;
        out.compute_size = plan(&built.graph, &[built.output])?.size;
        for (what, size) in [("KV cache", out.kv_size), ("compute buffer", out.compute_size)] {
            if size > self.probe.max_size {
                bail!(
                    "worker {}: the {what} of layers {}..{} needs one buffer of {}, above the worker's maximum \
                     buffer size of {} (use a smaller --ctx-size or --ubatch-size, or more workers)",
                    self.addr,
                    p.layers.start,
                    p.layers.end,
                    mib(size),
                    mib(self.probe.max_size)
                );
            }
        }
        Ok(out)
    }

    pub(super) fn alloc(&mut self, size: u64, what: &str) -> Result<Region> {
        let size = size.max(1);
        let r = self
            .client
            .alloc_buffer(self.device, size)
            .with_context(|| format!("worker {}: ALLOC_BUFFER", self.addr))?;
        if r.remote_ptr == 0 {
            bail!(
                "worker {} could not allocate {} for the {what} (it reported {} free)",
                self.addr,
                mib(size),
                mib(self.probe.free)
            );
        }
        if r.remote_size < size {
            bail!("worker {}: ALLOC_BUFFER of {size} bytes returned only {}", self.addr, r.remote_size);
        }
        let base = self.client.buffer_get_base(r.remote_ptr)?;
        if base == 0 || base % self.probe.alignment != 0 {
            bail!("worker {}: buffer base {base:#x} is null or misaligned", self.addr);
        }
        self.all_regions.push(r.remote_ptr);
        Ok(Region { handle: r.remote_ptr, base, size: r.remote_size })
    }

    /// Allocates the buffers of `lay` and uploads the weights (see [`crate::upload`]), calling
    /// `progress(bytes)` as they go.
    pub fn load(
        &mut self,
        lay: &WorkerLayout,
        src: &dyn WeightSource,
        layers: Range<u32>,
        opts: &UploadOptions<'_>,
        progress: &dyn Fn(u64),
    ) -> Result<UploadStats> {
        self.layers = layers;
        let mut views = Vec::new();
        for (size, items) in &lay.weight_bufs {
            let region = self.alloc(*size, "weights")?;
            let mut placed = Vec::with_capacity(items.len());
            for (name, off, bytes) in items {
                let w = src.tensor(name).ok_or_else(|| err!("missing tensor {name}"))?;
                let layout = Layout::contiguous(w.dtype, w.ne)?;
                if w.data.len() as u64 != *bytes {
                    bail!("tensor {name}: {} bytes, expected {bytes}", w.data.len());
                }
                self.weights.insert(name.clone(), (region.handle, region.base + off));
                placed.push(Placed { name, off: *off, data: w.data, layout });
            }
            views.push((region, placed));
        }
        let mut next_id = 1;
        let mut writes = Vec::new();
        for (region, placed) in &views {
            writes.extend(upload::plan(region.handle, region.base, placed, &mut next_id)?);
        }
        let stats = upload::send(&mut self.client, &writes, opts, progress)
            .with_context(|| format!("worker {}: uploading the weights", self.addr))?;
        let kv = self.alloc(lay.kv_size, "KV cache")?;
        self.client.buffer_clear(kv.handle, 0)?;
        self.kv = Some(kv);
        self.kv_offsets = lay.kv_offsets.clone();
        self.compute = Some(self.alloc(lay.compute_size, "compute buffer")?);
        // A round trip: every SET_TENSOR before it has been applied (ref §3.4).
        self.client
            .get_alignment(self.device)
            .with_context(|| format!("worker {}: after upload", self.addr))?;
        Ok(stats)
    }

    /// Reads the first `bytes` bytes of the weight `name` back from the worker (GET_TENSOR), to check
    /// what an upload left there; `None` when this worker holds no such weight.
    pub fn read_weight(&mut self, name: &str, bytes: u64) -> Result<Option<Vec<u8>>> {
        let Some(&(handle, addr)) = self.weights.get(name) else { return Ok(None) };
        let layout = Layout::contiguous(compute::GgmlType::I8, [bytes.max(1), 1, 1, 1])?;
        let t = RpcTensor::new(1, &layout, handle, addr);
        Ok(Some(self.client.get_tensor(&t, 0, bytes)?))
    }

    /// Bytes of this worker's KV cache (0 before the load).
    pub fn kv_bytes(&self) -> u64 {
        self.kv.map_or(0, |r| r.size)
    }

    /// Zeroes the KV cache (a new sequence).
    pub fn clear_kv(&mut self) -> Result<()> {
        if let Some(kv) = self.kv {
            self.client.buffer_clear(kv.handle, 0)?;
        }
        Ok(())
    }

    pub(super) fn place_of(&self, plan: &Plan, id: TensorId, storage: &Storage) -> Option<Place> {
        self.place_in(plan, id, storage, self.compute)
    }

    /// As [`Worker::place_of`], with the graph's inputs and intermediates in `compute`.
    pub(super) fn place_in(
        &self,
        plan: &Plan,
        id: TensorId,
        storage: &Storage,
        compute: Option<Region>,
    ) -> Option<Place> {
        match storage {
            Storage::Weight(name) => self.weights.get(name).copied(),
            Storage::KvCache { layer, kind } => {
                let kv = self.kv?;
                self.kv_offsets.get(&(*layer, *kind)).map(|off| (kv.handle, kv.base + off))
            }
            Storage::Input(_) | Storage::Intermediate => {
                let c = compute?;
                plan.offsets.get(id.index()).copied().flatten().map(|off| (c.handle, c.base + off))
            }
            Storage::View => None,
        }
    }

    fn prepare(&mut self, hp: &HParams, src: &dyn WeightSource, p: &BuildParams) -> Result<()> {
        if self.prepared.as_ref().is_some_and(|pr| pr.built.params == *p) {
            return Ok(());
        }
        self.prepared = None;
        self.graph_on_server = false;
        let built = build(hp, src, p)?;
        let embd = embd_substitute(&built)?;
        let plan = plan(&built.graph, &[built.output])?;
        let have = self.compute.map_or(0, |c| c.size);
        if plan.size > have {
            // Larger than the ubatch the buffer was sized for: replace it (the old graph dies with it).
            tracing::info!(addr = %self.addr, old = have, new = plan.size, "growing the compute buffer");
            if let Some(c) = self.compute.take() {
                self.client.free_buffer(c.handle)?;
                self.all_regions.retain(|&h| h != c.handle);
            }
            self.compute = Some(self.alloc(plan.size, "compute buffer")?);
        }
        let as_inputs: HashSet<TensorId> = embd.into_iter().collect();
        let blob = {
            let g = &built.graph;
            let place = |id: TensorId, t: &compute::model::TensorDef| self.place_of(&plan, id, &t.storage);
            export(g, &as_inputs, self.device, &place)
        };
        // Every executed node and every weight it reads must be placed on this worker.
        for t in &blob.tensors {
            let def = built.graph.get(TensorId((t.id - 1) as u32));
            if t.data == 0 && def.layout.nbytes().unwrap_or(0) > 0 {
                bail!(
                    "internal: tensor {} of layers {:?} has no place on worker {}",
                    def.name,
                    p.layers,
                    self.addr
                );
            }
        }
        let mut encoded = Vec::with_capacity(blob.encoded_len());
        blob.encode_into(&mut encoded);
        let key = *blake3::hash(&encoded).as_bytes();
        self.prepared = Some(Prepared { built, plan, blob, key, embd });
        Ok(())
    }

    /// Runs one ubatch of shape `p`, whose inputs (tokens, positions, cells, masks) `fill` writes,
    /// with `hidden` (F32 `[E, T]`) as this range's input; returns the output bytes (the next hidden
    /// state, or F32 logits for the last range).
    pub fn run_ubatch(
        &mut self,
        hp: &HParams,
        src: &dyn WeightSource,
        p: &BuildParams,
        fill: &FillInputs<'_>,
        hidden: &[u8],
    ) -> Result<Vec<u8>> {
        self.send_ubatch(hp, src, p, fill, hidden)?;
        self.recv_ubatch()
    }

    /// The request half of [`Worker::run_ubatch`]: writes the inputs, the graph and the read of its
    /// output, and returns without waiting, so that other workers can be given work meanwhile. The
    /// answer is read with [`Worker::recv_ubatch`] before anything else is asked of this worker.
    pub fn send_ubatch(
        &mut self,
        hp: &HParams,
        src: &dyn WeightSource,
        p: &BuildParams,
        fill: &FillInputs<'_>,
        hidden: &[u8],
    ) -> Result<()> {
        if self.in_flight.is_some() {
            bail!("internal: worker {} already has a ubatch in flight", self.addr);
        }
        let t0 = std::time::Instant::now();
        self.prepare(hp, src, p)?;
        let Some(pr) = self.prepared.as_ref() else { bail!("internal: no prepared graph") };
        let mut sink = StagingSink::new(&pr.built);
        fill(&pr.built, &mut sink)?;
        let hidden_id =
            pr.embd.or(pr.built.inputs.hidden).ok_or_else(|| err!("graph has no hidden-state input"))?;
        let want = pr.built.graph.layout(hidden_id).nbytes().unwrap_or(0);
        if hidden.len() as u64 != want {
            bail!("hidden state of {} bytes for an input of {want}", hidden.len());
        }
        sink.staged.insert(hidden_id, hidden.to_vec());
        let skip = if pr.embd.is_some() { pr.built.inputs.tokens } else { None };
        let mut writes = Vec::new();
        for (id, bytes) in &sink.staged {
            if Some(*id) == skip {
                continue;
            }
            let def = pr.built.graph.get(*id);
            let (buffer, data) = self
                .place_of(&pr.plan, *id, &def.storage)
                .ok_or_else(|| err!("internal: input {} has no place", def.name))?;
            writes.push((RpcTensor::new(wire_id(*id), &def.layout, buffer, data), bytes));
        }
        let out = pr.built.output;
        let out_def = pr.built.graph.get(out);
        let owner = pr.built.graph.owner(out);
        let (ob, od) = self
            .place_of(&pr.plan, owner, &pr.built.graph.get(owner).storage)
            .ok_or_else(|| err!("internal: output has no place"))?;
        let out_t = RpcTensor::new(wire_id(out), &out_def.layout, ob, od + out_def.view_offs);
        let out_bytes = out_def.layout.nbytes().unwrap_or(0);
        let by_uid = self.client.protocol().graph == GraphFormat::Uid;
        // 8.0.0: the uid this graph went with, if the server still stores it.
        let stored = self
            .graph_uids
            .get(&pr.key)
            .copied()
            .filter(|&u| by_uid && self.client.holds_graph(self.device, u));
        // 7.0.0: the server's one last graph; 8.0.0: any graph it still stores.
        let recompute = if by_uid { stored.is_some() } else { self.graph_on_server };
        let (blob, key) = ((!recompute).then(|| pr.blob.clone()), pr.key);
        let ctx = || Self::failed(&self.addr, &p.layers);
        for (t, bytes) in writes {
            self.client.set_tensor(&t, 0, bytes, false).with_context(ctx)?;
        }
        match blob {
            None => {
                match stored {
                    Some(uid) => self.client.graph_recompute_uid(self.device, uid),
                    None => self.client.graph_recompute(self.device),
                }
                .with_context(ctx)?;
                self.recomputes += 1;
            }
            Some(b) if by_uid => {
                let uid = self.client.fresh_uid();
                self.client.graph_compute_uid(&b, uid).with_context(ctx)?;
                // Remember a few stores' worth; stale entries (cleared by the server long ago) go, and
                // live ones are sent once more.
                if self.graph_uids.len() >= 4 * self.client.protocol().graph_store {
                    self.graph_uids.clear();
                }
                self.graph_uids.insert(key, uid);
            }
            Some(b) => self.client.graph_compute(&b).with_context(ctx)?,
        }
        self.graphs_sent += 1;
        self.graph_on_server = true;
        self.client.send_get_tensor(&out_t, 0, out_bytes).with_context(ctx)?;
        self.in_flight = Some(InFlight { bytes: out_bytes, layers: p.layers.clone() });
        self.busy += t0.elapsed();
        Ok(())
    }

    /// The output of the ubatch sent with [`Worker::send_ubatch`].
    pub fn recv_ubatch(&mut self) -> Result<Vec<u8>> {
        let t0 = std::time::Instant::now();
        let Some(f) = self.in_flight.take() else {
            bail!("internal: worker {} has no ubatch in flight", self.addr)
        };
        let out = self.client.recv_get_tensor(f.bytes).with_context(|| Self::failed(&self.addr, &f.layers));
        self.busy += t0.elapsed();
        out
    }

    fn failed(addr: &str, layers: &Range<u32>) -> String {
        format!(
            "worker {addr} (layers {}..{}) failed; if it closed the connection, its log says why",
            layers.start, layers.end
        )
    }

    /// Frees every buffer (the connection closes on drop as well).
    pub fn release(&mut self) {
        for h in std::mem::take(&mut self.all_regions) {
            let _ = self.client.free_buffer(h);
        }
        self.prepared = None;
        self.graph_on_server = false;
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.release();
    }
}

/// Writes a ubatch graph's inputs: [`compute::model::session::fill_inputs`] for one sequence,
/// [`compute::model::BatchUbatch::fill`] for several.
pub type FillInputs<'a> = dyn Fn(&Built, &mut dyn InputSink) -> compute::Result<()> + 'a;

/// The GET_ROWS node of the token embedding when the graph starts at layer 0: the master computes
/// it and copies the result in. It must be the first node, so nothing runs before it is written.
fn embd_substitute(built: &Built) -> Result<Option<TensorId>> {
    let Some(tokens) = built.inputs.tokens else { return Ok(None) };
    let g = &built.graph;
    let first = g.nodes().first().copied();
    match first {
        Some(n) if g.get(n).src[1] == Some(tokens) && g.get(n).op == compute::GgmlOp::GetRows => Ok(Some(n)),
        _ => bail!("unexpected graph: the token embedding is not the first node"),
    }
}

/// Collects the bytes of every graph input.
pub(super) struct StagingSink {
    pub(super) staged: HashMap<TensorId, Vec<u8>>,
}

impl StagingSink {
    /// A zeroed staging vector for every input of `built`.
    pub(super) fn new(built: &Built) -> StagingSink {
        let staged = built
            .graph
            .inputs()
            .map(|(id, t)| (id, vec![0u8; t.layout.nbytes().unwrap_or(0) as usize]))
            .collect();
        StagingSink { staged }
    }
}

impl InputSink for StagingSink {
    fn bytes(&mut self, id: TensorId) -> compute::Result<&mut [u8]> {
        self.staged
            .get_mut(&id)
            .map(Vec::as_mut_slice)
            .ok_or_else(|| compute::Error::Model(format!("tensor {} is not an input", id.0)))
    }
}

/// Bytes as MiB with two decimals.
pub fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use compute::GgmlType;

    const MIB: u64 = 1 << 20;

    #[test]
    fn kv_cache_of_smollm2_at_8k_and_32k() {
        // SmolLM2-135M: 3 KV heads of 64 → 192 values per cell, F16 (2 bytes). At 8192 cells one
        // layer's K is 192 · 8192 · 2 = 3 145 728 B = 3 MiB; K and V of 30 layers: 180 MiB.
        let mut lay = WorkerLayout::default();
        lay.add_kv(0..30, (192, 192), GgmlType::F16, 8192, 32).unwrap();
        assert_eq!(lay.kv_size, 180 * MIB);
        assert_eq!(lay.kv_offsets.len(), 60);
        assert_eq!(lay.kv_offsets[&(0, KvKind::V)], 3 * MIB);
        assert_eq!(lay.kv_offsets[&(29, KvKind::V)], 59 * 3 * MIB);
        // 32768 cells (four times SmolLM2's training context): 12 MiB per layer and kind. Two equal
        // workers split 31 slots at 0.5: layers 0..16 on the first (16 · 24 = 384 MiB), 16..30 on
        // the second (14 · 24 = 336 MiB), 720 MiB in all.
        let mut first = WorkerLayout::default();
        first.add_kv(0..16, (192, 192), GgmlType::F16, 32768, 32).unwrap();
        assert_eq!(first.kv_size, 384 * MIB);
        let mut second = WorkerLayout::default();
        second.add_kv(16..30, (192, 192), GgmlType::F16, 32768, 32).unwrap();
        assert_eq!(second.kv_size, 336 * MIB);
        assert_eq!(second.kv_offsets[&(16, KvKind::K)], 0);
        assert_eq!(second.kv_offsets[&(17, KvKind::V)], 36 * MIB);
        assert_eq!(first.kv_size + second.kv_size, 720 * MIB);
    }

    #[test]
    fn kv_cache_of_an_8b_layer_shape_and_its_row_split_shards() {
        // The 8B shape: 8 KV heads of 128 → 1024 values per cell. F16 at 32768 cells: 64 MiB per
        // layer and kind, 16 layers → 2 GiB. Split mode row over two workers gives each 4 KV heads
        // (512 values): 1 GiB each.
        let mut whole = WorkerLayout::default();
        whole.add_kv(0..16, (1024, 1024), GgmlType::F16, 32768, 32).unwrap();
        assert_eq!(whole.kv_size, 2048 * MIB);
        let mut shard = WorkerLayout::default();
        shard.add_kv(0..16, (512, 512), GgmlType::F16, 32768, 32).unwrap();
        assert_eq!(shard.kv_size, 1024 * MIB);
        // Q8_0 KV at 8192 cells: 1024 values are 32 blocks of 34 bytes = 1088 B per cell,
        // 8 912 896 B = 8.5 MiB per layer and kind.
        let mut q8 = WorkerLayout::default();
        q8.add_kv(0..1, (1024, 1024), GgmlType::Q8_0, 8192, 32).unwrap();
        assert_eq!(q8.kv_size, 17 * MIB);
    }

    #[test]
    fn kv_caches_are_padded_to_the_worker_alignment() {
        // Q8_0, one KV head of 64: 2 blocks of 34 bytes = 68 B per cell, 3 cells = 204 B, padded to
        // 224 at alignment 32; K at 0, V at 224, 448 in all. Alignment 0 counts as 1 (no padding).
        let mut lay = WorkerLayout::default();
        lay.add_kv(5..6, (64, 64), GgmlType::Q8_0, 3, 32).unwrap();
        assert_eq!(
            (lay.kv_offsets[&(5, KvKind::K)], lay.kv_offsets[&(5, KvKind::V)], lay.kv_size),
            (0, 224, 448)
        );
        let mut lay = WorkerLayout::default();
        lay.add_kv(0..1, (64, 64), GgmlType::Q8_0, 3, 0).unwrap();
        assert_eq!(lay.kv_size, 408);
        // K and V rows may differ (head sizes of K and V): 192 and 128 F16 values, 10 cells:
        // 3840 + 2560 B, each already a multiple of 32.
        let mut lay = WorkerLayout::default();
        lay.add_kv(0..2, (192, 128), GgmlType::F16, 10, 32).unwrap();
        assert_eq!(lay.kv_size, 2 * (3840 + 2560));
        // A size that overflows is an error, not a wrap.
        let mut lay = WorkerLayout::default();
        assert!(lay.add_kv(0..2, (1 << 20, 1 << 20), GgmlType::F16, u64::MAX / 4, 32).is_err());
    }
}
