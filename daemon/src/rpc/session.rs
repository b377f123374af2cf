//! Per-connection state and the semantics of every command: buffer handles, stored graphs (the last
//! graph per device at 7.0.0, a store of up to 1024 graphs by uid per device at 8.0.0), the
//! all-reduce links of 8.0.0, and the checks of ggml-rpc-protocol.md §4.4, §7, §14 and §16 and of
//! ggml-rpc-protocol-8.md (all in checked arithmetic).
//!
//! The session does no IO. [`Session::handle`] turns a decoded command into a [`Reply`]; SET_TENSOR is
//! split so that its data can be streamed straight into the destination ([`Session::set_tensor_target`]).

use std::collections::HashMap;
use std::sync::Arc;

use compute::Layout;
use llamad_proto::msg::{
    AllocBufferRsp, Command, GetAllocSizeReq, GetTensorReq, MemsetTensorReq, SetTensorHashReq,
    SetTensorHeader, Tensor2d,
};
use llamad_proto::{Protocol, RpcTensor, WireHash};
use std::sync::atomic::Ordering;
use tracing::debug;

use crate::error::{refuse, Error, Result};
use crate::rpc::buffer::{Buffer, Region, ADVERTISED_ALIGNMENT};
use crate::rpc::cache::WireCache;
use crate::rpc::comm::CommState;
use crate::rpc::exec::{self, StoredGraph};
use crate::rpc::ext::{BlockingJob, ExtState, Slot};
use crate::rpc::graph_cache::GraphCache;
use crate::rpc::server::Shared;

/// What the connection must do after a command.
pub enum Reply {
    /// Nothing goes on the wire.
    Nothing,
    /// Send this payload in a response frame.
    Bytes(Vec<u8>),
    /// Send these buffer bytes in a response frame (GET_TENSOR), without copying them first.
    Region(Arc<Buffer>, Region),
    /// Send these rows, packed, in one response frame (GET_TENSOR_2D), without gathering them first.
    Rows(Arc<Buffer>, Rows),
    /// Run this graph, then send nothing.
    Compute(Arc<StoredGraph>),
    /// Look `hash` up in the cache straight into `region`, then answer `01` (hit) or `00`.
    CacheLoad(Arc<dyn WireCache>, WireHash, Arc<Buffer>, Region),
    /// Fill or copy buffer memory (off the runtime when large), then send the payload if any.
    Job(MemJob, Option<Vec<u8>>),
    /// Run this off the runtime (links, TP_RUN; see [`crate::rpc::ext`]), then send its answer if any.
    Blocking(BlockingJob),
}

/// Bulk memory work whose regions were validated by the session; holds its buffers alive.
pub enum MemJob {
    /// Set every byte of `region` to `value`.
    Fill(Arc<Buffer>, Region, u8),
    /// Copy `from` (in the first buffer) to `to` (in the second); the ranges may overlap.
    Copy(Arc<Buffer>, Region, Arc<Buffer>, Region),
}

impl MemJob {
    /// Bytes touched.
    pub fn len(&self) -> usize {
        match self {
            MemJob::Fill(_, r, _) => r.len(),
            MemJob::Copy(_, r, _, _) => r.len(),
        }
    }

    /// True when there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Does the work.
    pub fn run(self) {
        match self {
            MemJob::Fill(buf, r, v) => {
                // A whole mapped buffer writes zeros only over the pages in memory and hands the rest
                // back (BUFFER_CLEAR of a fresh KV cache: nothing to write at all).
                if v == 0 && buf.zero_whole(r) {
                    return;
                }
                // SAFETY: `r` lies inside the live buffer `buf` (validated by the session, held here);
                // the session runs one command at a time and awaits this job before the next.
                unsafe { r.as_mut_slice() }.fill(v);
            }
            MemJob::Copy(_a, from, _b, to) => {
                let n = from.len().min(to.len());
                // SAFETY: both regions lie inside live buffers held here; `copy` allows overlap; no
                // other access happens while the job runs (as for `Fill`).
                unsafe { std::ptr::copy(from.ptr(), to.ptr(), n) };
            }
        }
    }
}

/// `n` rows of `size` bytes, `stride` apart, starting `start` bytes into a buffer; validated: every
/// row lies inside the buffer, and `size·n` does not overflow. Empty transfers have `n = 0`.
#[derive(Clone, Copy, Debug)]
pub struct Rows {
    /// Offset of the first row in the buffer.
    pub start: u64,
    /// Bytes per row.
    pub size: u64,
    /// Rows.
    pub n: u64,
    /// Distance between row starts.
    pub stride: u64,
}

impl Rows {
    /// Bytes of all rows packed.
    pub fn packed_len(&self) -> u64 {
        self.size * self.n
    }

    /// Row `i` (`i < n`) in `buf`.
    pub fn row(&self, buf: &Buffer, i: u64) -> Option<Region> {
        buf.region(self.start + i * self.stride, self.size)
    }
}

/// A validated descriptor (ref: §4.4): layout, extent and, when it has one, its place in a buffer.
struct Resolved {
    layout: Layout,
    nbytes: u64,
    storage: Option<(Arc<Buffer>, u64)>,
}

/// One connection's state.
pub struct Session {
    shared: Arc<Shared>,
    /// The protocol version this connection speaks.
    proto: &'static Protocol,
    /// Our address as the peer reached it (to tell whether COMM_INIT's host names this server).
    local: Option<std::net::IpAddr>,
    buffers: HashMap<u64, Arc<Buffer>>,
    /// 7.0.0: the last graph per device.
    graphs: Vec<Option<Arc<StoredGraph>>>,
    /// 8.0.0: the stored graphs per device, by uid.
    stored: Vec<HashMap<u64, Arc<StoredGraph>>>,
    /// 8.0.0: all-reduce links.
    comm: CommState,
    /// A second handle on the master connection's socket, for all-reduces to watch.
    master: Option<crate::rpc::comm::MasterWatch>,
    built: GraphCache,
    /// Bytes held by this connection's buffers.
    held: u64,
    /// llamad's extension: granted at HELLO ([`Session::grant_ext`]), with its links and slots.
    ext: Option<(std::net::IpAddr, ExtState)>,
}

impl Session {
    /// A fresh session speaking `proto`: no handles, no stored graphs (ref: §15 item 26). `local` is
    /// our address as the peer reached it.
    pub fn new(shared: Arc<Shared>, proto: &'static Protocol, local: Option<std::net::IpAddr>) -> Session {
        let n = shared.cfg.devices.len();
        Session {
            shared,
            proto,
            local,
            buffers: HashMap::new(),
            graphs: vec![None; n],
            stored: vec![HashMap::new(); n],
            comm: CommState::default(),
            master: None,
            built: GraphCache::default(),
            held: 0,
            ext: None,
        }
    }

    /// Lets all-reduces see the master connection close (`socket` duplicates its descriptor).
    pub fn watch_master(&mut self, socket: std::net::TcpStream) {
        self.master = Some(crate::rpc::comm::MasterWatch::new(socket));
    }

    /// Enables llamad's extension commands on this connection; links are offered on `local_ip` (the
    /// address the master reached).
    pub fn grant_ext(&mut self, local_ip: std::net::IpAddr) {
        self.ext = Some((local_ip, ExtState::default()));
    }

    /// Executes an extension command (see [`llamad_proto::ext`]).
    pub fn handle_ext(&mut self, byte: u8, payload: &[u8]) -> Result<Reply> {
        use llamad_proto::ext::{self as x, GraphStore};
        let Some(ip) = self.ext.as_ref().map(|(ip, _)| *ip) else {
            refuse!("extension command {} on a connection that did not negotiate it", x::name(byte));
        };
        if byte == x::CMD_GRAPH_STORE {
            let st = GraphStore::decode(payload, &self.shared.limits)?;
            let graph = exec::build(&st.blob, &self.buffers, self.interleave())?;
            let region = |t: &RpcTensor| -> Result<(Arc<Buffer>, Region)> {
                let r = self.resolve(t)?;
                self.tensor_region(t, 0, r.nbytes)
            };
            let slot = Slot::new(graph, region(&st.input)?, region(&st.output)?);
            debug!(slot = st.slot, tensors = st.blob.tensors.len(), "extension graph stored");
            if let Some((_, ext)) = self.ext.as_mut() {
                ext.store(st.slot, slot);
            }
            return Ok(Reply::Nothing);
        }
        let executor = self.shared.executor.clone();
        let Some((_, ext)) = self.ext.as_mut() else { refuse!("extension not negotiated") };
        match byte {
            x::CMD_LINK_OFFER => Ok(Reply::Bytes(ext.offer(payload, ip)?)),
            x::CMD_LINK_ACCEPT => Ok(Reply::Blocking(ext.accept(payload)?)),
            x::CMD_LINK_DIAL => Ok(Reply::Blocking(ext.dial(payload)?)),
            x::CMD_TP_RUN => Ok(Reply::Blocking(ext.tp_run(payload, executor)?)),
            x::CMD_TP_RUN_STREAMS => Ok(Reply::Blocking(ext.tp_run_streams(payload, executor)?)),
            _ => refuse!("unknown extension command byte {byte}"),
        }
    }

    /// Whether graphs make interleaved weight copies, and on how many threads.
    fn interleave(&self) -> Option<usize> {
        self.shared.cfg.interleave.then_some(self.shared.cfg.threads)
    }

    /// Number of live buffers.
    pub fn buffer_count(&self) -> usize {
        self.buffers.len()
    }

    fn device(&self, device: u32) -> Result<usize> {
        let d = device as usize;
        if d >= self.graphs.len() {
            refuse!("device {device} out of range (device count {})", self.graphs.len());
        }
        Ok(d)
    }

    fn buffer(&self, handle: u64) -> Result<&Arc<Buffer>> {
        match self.buffers.get(&handle) {
            Some(b) => Ok(b),
            None => Err(Error::Refused(format!("unknown buffer handle {handle:#x}"))),
        }
    }

    /// §4.4: type, layout and extent; a descriptor naming a known buffer must lie inside it.
    fn resolve(&self, t: &RpcTensor) -> Result<Resolved> {
        let layout = t.layout().map_err(|e| Error::Refused(format!("tensor {:#x}: {e}", t.id)))?;
        let nbytes = layout.nbytes().ok_or_else(|| Error::Refused("tensor extent overflows".into()))?;
        let storage = match self.buffers.get(&t.buffer) {
            Some(b) if t.buffer != 0 => match b.offset_of(t.data, nbytes) {
                Some(off) => Some((b.clone(), off)),
                None => refuse!(
                    "tensor {:#x} ({}): data {:#x} + {nbytes} bytes leaves buffer [{:#x}, +{})",
                    t.id,
                    t.name_str(),
                    t.data,
                    b.base(),
                    b.size()
                ),
            },
            _ => None,
        };
        Ok(Resolved { layout, nbytes, storage })
    }

    fn resolve_stored(&self, t: &RpcTensor) -> Result<(Resolved, Arc<Buffer>, u64)> {
        let r = self.resolve(t)?;
        match r.storage.clone() {
            Some((b, off)) => Ok((r, b, off)),
            None => refuse!("tensor {:#x}: no buffer of this connection (buffer {:#x})", t.id, t.buffer),
        }
    }

    /// §7 SET_TENSOR / GET_TENSOR region check for `n` bytes at tensor offset `offset`: the start must
    /// lie strictly inside the buffer, the end inside the buffer and inside the tensor.
    fn tensor_region(&self, t: &RpcTensor, offset: u64, n: u64) -> Result<(Arc<Buffer>, Region)> {
        let (r, buf, toff) = self.resolve_stored(t)?;
        let Some(start) = toff.checked_add(offset) else { refuse!("offset {offset:#x} overflows") };
        if start >= buf.size() || n > buf.size() - start {
            refuse!("region [{offset:#x}, +{n}) leaves the buffer");
        }
        match offset.checked_add(n) {
            Some(end) if end <= r.nbytes => {}
            _ => refuse!("region [{offset:#x}, +{n}) leaves the tensor of {} bytes", r.nbytes),
        }
        let Some(region) = buf.region(start, n) else { refuse!("region outside the buffer") };
        Ok((buf, region))
    }

    /// Validates a SET_TENSOR header for `n` data bytes and returns where they go.
    pub fn set_tensor_target(&mut self, h: &SetTensorHeader, n: u64) -> Result<(Arc<Buffer>, Region)> {
        let (buf, r) = self.tensor_region(&h.tensor, h.offset, n)?;
        buf.invalidate_region(&r);
        Ok((buf, r))
    }

    /// Executes one command (SET_TENSOR only in its already-buffered form).
    pub fn handle(&mut self, cmd: Command<'_>) -> Result<Reply> {
        match cmd {
            Command::Hello(_) => refuse!("HELLO after the handshake"),
            Command::DeviceCount => Ok(Reply::Bytes((self.graphs.len() as u32).to_le_bytes().to_vec())),
            Command::AllocBuffer(a) => {
                self.device(a.device)?;
                let quota = self.shared.cfg.max_connection_mem.unwrap_or(u64::MAX);
                let within_quota = self.held.checked_add(a.size).is_some_and(|n| n <= quota);
                let buffer = if within_quota { Buffer::alloc(&self.shared.memory, a.size) } else { None };
                let rsp = match buffer {
                    Some(b) => {
                        self.held += b.size();
                        let rsp = AllocBufferRsp { remote_ptr: b.handle(), remote_size: b.size() };
                        debug!(size = a.size, handle = b.handle(), base = b.base(), "buffer allocated");
                        self.buffers.insert(b.handle(), Arc::new(b));
                        rsp
                    }
                    None => {
                        debug!(size = a.size, "allocation refused");
                        AllocBufferRsp::default()
                    }
                };
                let mut v = rsp.remote_ptr.to_le_bytes().to_vec();
                v.extend_from_slice(&rsp.remote_size.to_le_bytes());
                Ok(Reply::Bytes(v))
            }
            Command::GetAlignment { device } => {
                self.device(device)?;
                Ok(Reply::Bytes(ADVERTISED_ALIGNMENT.to_le_bytes().to_vec()))
            }
            Command::GetMaxSize { device } => {
                self.device(device)?;
                Ok(Reply::Bytes(self.shared.max_size.to_le_bytes().to_vec()))
            }
            Command::GetDeviceMemory { device } => {
                self.device(device)?;
                let m = self.shared.memory.report();
                let mut v = m.free.min(m.total).to_le_bytes().to_vec();
                v.extend_from_slice(&m.total.to_le_bytes());
                Ok(Reply::Bytes(v))
            }
            Command::BufferGetBase { remote_ptr } => {
                Ok(Reply::Bytes(self.buffer(remote_ptr)?.base().to_le_bytes().to_vec()))
            }
            Command::FreeBuffer { remote_ptr } => {
                let Some(b) = self.buffers.remove(&remote_ptr) else {
                    refuse!("FREE_BUFFER of unknown handle {remote_ptr:#x}");
                };
                self.held -= b.size();
                // Stored graphs may point into the freed buffer (§14 item 5): drop them all, as the reference does
                // (at 8.0.0 the whole store: the master forgets its uids on FREE_BUFFER too).
                self.graphs.iter_mut().for_each(|g| *g = None);
                self.stored.iter_mut().for_each(HashMap::clear);
                self.built.clear();
                if let Some((_, ext)) = self.ext.as_mut() {
                    ext.clear_slots();
                }
                Ok(Reply::Nothing)
            }
            Command::BufferClear { remote_ptr, value } => {
                let b = self.buffer(remote_ptr)?;
                let Some(r) = b.region(0, b.size()) else { refuse!("buffer region") };
                b.invalidate(0, b.size());
                Ok(Reply::Job(MemJob::Fill(b.clone(), r, value), None))
            }
            Command::SetTensor(h, data) => {
                let (_buf, r) = self.set_tensor_target(&h, data.len() as u64)?;
                // SAFETY: `r` lies inside the live buffer `_buf`, held for this scope; no graph is running.
                unsafe { r.as_mut_slice() }.copy_from_slice(data);
                Ok(Reply::Nothing)
            }
            Command::SetTensorHash(req) => self.set_tensor_hash(&req),
            Command::GetTensor(GetTensorReq { tensor, offset, size }) => {
                let (buf, r) = self.tensor_region(&tensor, offset, size)?;
                Ok(Reply::Region(buf, r))
            }
            Command::CopyTensor { src, dst } => self.copy_tensor(&src, &dst),
            Command::MemsetTensor(m) => self.memset_tensor(&m),
            Command::InitTensor(t) => {
                let r = self.resolve(&t)?;
                if r.storage.is_none() {
                    // The reference only logs this and keeps the connection (ref: §7 INIT_TENSOR).
                    debug!(id = t.id, "INIT_TENSOR of a tensor without a buffer");
                }
                Ok(Reply::Nothing)
            }
            Command::GetAllocSize(req) => self.get_alloc_size(&req),
            Command::GraphCompute(blob, uid) => {
                let d = self.device(blob.device)?;
                let (buffers, interleave) = (&self.buffers, self.interleave());
                let g = self.built.get_or_build(&blob, |b| exec::build(b, buffers, interleave))?;
                debug!(nodes = g.n_nodes, run = g.n_run, tensors = blob.tensors.len(), ?uid, "graph built");
                match uid {
                    None => self.graphs[d] = Some(g.clone()),
                    Some(0) => {}
                    Some(uid) => self.store_graph(d, uid, g.clone()),
                }
                Ok(Reply::Compute(g))
            }
            Command::GraphRecompute { device, uid: None } => {
                let d = self.device(device)?;
                match &self.graphs[d] {
                    Some(g) => Ok(Reply::Compute(g.clone())),
                    None => refuse!("GRAPH_RECOMPUTE without a stored graph on device {device}"),
                }
            }
            Command::GraphRecompute { device, uid: Some(uid) } => {
                let d = self.device(device)?;
                match self.stored[d].get(&uid) {
                    Some(g) => {
                        self.shared.stats.graph_store_hits.fetch_add(1, Ordering::Relaxed);
                        Ok(Reply::Compute(g.clone()))
                    }
                    None => refuse!(
                        "GRAPH_RECOMPUTE of graph uid {uid:#x} on device {device}, which this connection does not \
                         store (never sent, cleared when the store was full, or dropped by FREE_BUFFER)"
                    ),
                }
            }
            Command::SetTensor2d(h, data) => {
                let (buf, rows) = self.rows_2d(&h, true)?;
                for (i, chunk) in (0..rows.n).zip(data.chunks_exact(rows.size.max(1) as usize)) {
                    let Some(r) = rows.row(&buf, i) else { refuse!("SET_TENSOR_2D row outside the buffer") };
                    // SAFETY: `r` lies inside the live buffer `buf`, held for this scope; no graph is running.
                    unsafe { r.as_mut_slice() }.copy_from_slice(chunk);
                }
                Ok(Reply::Nothing)
            }
            Command::GetTensor2d(h) => {
                let (buf, rows) = self.rows_2d(&h, false)?;
                Ok(Reply::Rows(buf, rows))
            }
            Command::CommInit(req) => {
                self.device(req.device)?;
                let Some(spec) = self.proto.comm else {
                    refuse!("COMM_INIT is not part of protocol {}", self.proto)
                };
                let job = self.comm.init(&req, &spec, self.local, self.shared.clone())?;
                Ok(Reply::Blocking(job))
            }
            Command::CommAllreduce { device, tensor } => {
                self.device(device)?;
                let Some(spec) = self.proto.comm else {
                    refuse!("COMM_ALLREDUCE is not part of protocol {}", self.proto)
                };
                let (r, buf, off) = self.resolve_stored(&tensor)?;
                if r.layout.dtype != compute::GgmlType::F32 {
                    refuse!("COMM_ALLREDUCE of a {:?} tensor (only F32)", r.layout.dtype);
                }
                if !r.layout.is_contiguous() {
                    refuse!("COMM_ALLREDUCE of a non-contiguous tensor");
                }
                if tensor.flags & compute::op::flags::COMPUTE == 0 {
                    refuse!("COMM_ALLREDUCE of a tensor without the COMPUTE flag");
                }
                let Some(region) = buf.region(off, r.nbytes) else {
                    refuse!("COMM_ALLREDUCE leaves the buffer")
                };
                buf.invalidate(off, r.nbytes);
                let watch = self.master.clone();
                let job = self.comm.allreduce(device, &spec, buf, region, self.shared.clone(), watch)?;
                Ok(Reply::Blocking(job))
            }
            Command::CommFree { device } => {
                self.device(device)?;
                self.comm.free(device)?;
                Ok(Reply::Nothing)
            }
        }
    }

    /// Stores graph `uid` for device `d` (8.0.0): a new uid when the store is full clears it first,
    /// at the same point as the master (ref: ggml-rpc-protocol-8.md, "Graph uid and the graph
    /// cache"). A uid already stored is replaced without a clear: it is not new.
    fn store_graph(&mut self, d: usize, uid: u64, g: Arc<StoredGraph>) {
        let store = &mut self.stored[d];
        if !store.contains_key(&uid) && store.len() >= self.proto.graph_store {
            debug!(device = d, graphs = store.len(), "graph store full: cleared");
            store.clear();
            self.shared.stats.graph_store_clears.fetch_add(1, Ordering::Relaxed);
        }
        store.insert(uid, g);
        self.shared.stats.graph_store_inserts.fetch_add(1, Ordering::Relaxed);
    }

    /// SET_TENSOR_2D / GET_TENSOR_2D: the rows, each checked as SET_TENSOR/GET_TENSOR check their
    /// region (start strictly inside the buffer, end inside the buffer and inside the tensor), every
    /// product and sum in checked arithmetic, and `size·n_copies` at most the tensor's bytes (rows
    /// that do not overlap cannot hold more), which bounds a GET_TENSOR_2D's answer.
    fn rows_2d(&self, h: &Tensor2d, write: bool) -> Result<(Arc<Buffer>, Rows)> {
        let what = if write { "SET_TENSOR_2D" } else { "GET_TENSOR_2D" };
        let (r, buf, toff) = self.resolve_stored(&h.tensor)?;
        let Some(packed) = h.packed_len() else {
            refuse!("{what}: size {} × n_copies {} overflows", h.size, h.n_copies);
        };
        if packed > r.nbytes {
            refuse!("{what}: {packed} bytes of rows for a tensor of {} bytes", r.nbytes);
        }
        if packed == 0 {
            // Zero rows, or rows of zero bytes: nothing to move.
            return Ok((buf, Rows { start: 0, size: 0, n: 0, stride: 0 }));
        }
        // The last row starts at offset + (n-1)·stride; rows ascend, so the first and last bound all.
        let last = (h.n_copies - 1)
            .checked_mul(h.stride)
            .and_then(|x| x.checked_add(h.offset))
            .ok_or_else(|| Error::Refused(format!("{what}: offset + (n_copies-1)·stride overflows")))?;
        let end = match last.checked_add(h.size) {
            Some(e) if e <= r.nbytes => e,
            _ => refuse!(
                "{what}: rows [{:#x}, +{}) every {} bytes, {} of them, leave the tensor of {} bytes",
                h.offset,
                h.size,
                h.stride,
                h.n_copies,
                r.nbytes
            ),
        };
        let Some(start) = toff.checked_add(h.offset) else { refuse!("{what}: offset overflows") };
        match toff.checked_add(end) {
            Some(e) if start < buf.size() && e <= buf.size() => {}
            _ => refuse!("{what}: rows leave the buffer"),
        }
        if write {
            buf.invalidate(start, end - h.offset);
        }
        Ok((buf, Rows { start, size: h.size, n: h.n_copies, stride: h.stride }))
    }

    /// Validates a SET_TENSOR_2D header for `n` data bytes and returns where its rows go.
    pub fn set_tensor_2d_target(&mut self, h: &Tensor2d, n: u64) -> Result<(Arc<Buffer>, Rows)> {
        if h.packed_len() != Some(n) {
            refuse!("SET_TENSOR_2D of {n} data bytes for {} rows of {} bytes", h.n_copies, h.size);
        }
        self.rows_2d(h, true)
    }

    fn set_tensor_hash(&mut self, req: &SetTensorHashReq) -> Result<Reply> {
        // Without a cache every hash is a miss and the descriptor is not examined, as the reference
        // does (ref: §7 SET_TENSOR_HASH, §15 item 23).
        let Some(cache) = self.shared.cache.clone() else { return Ok(Reply::Bytes(vec![0])) };
        // With one, the descriptor is validated and the entry must fill the tensor from `offset` to its
        // end (whole-tensor uploads; ref: §9 hardened recommendations).
        let (r, _, _) = self.resolve_stored(&req.tensor)?;
        let Some(len) = r.nbytes.checked_sub(req.offset) else {
            refuse!("SET_TENSOR_HASH offset {:#x} beyond the tensor of {} bytes", req.offset, r.nbytes);
        };
        if len == 0 {
            return Ok(Reply::Bytes(vec![0]));
        }
        let (buf, region) = self.tensor_region(&req.tensor, req.offset, len)?;
        buf.invalidate_region(&region);
        Ok(Reply::CacheLoad(cache, req.hash, buf, region))
    }

    /// The cache to store a SET_TENSOR's data in, if the flag asks for it and a cache exists.
    pub fn cache_for_store(&self, h: &SetTensorHeader) -> Option<Arc<dyn WireCache>> {
        if h.cache_flag != 0 {
            self.shared.cache.clone()
        } else {
            None
        }
    }

    fn copy_tensor(&mut self, src: &RpcTensor, dst: &RpcTensor) -> Result<Reply> {
        let (s, sbuf, soff) = self.resolve_stored(src)?;
        let (d, dbuf, doff) = self.resolve_stored(dst)?;
        // §14 item 4: the master only copies identical layouts; anything else is refused.
        if s.layout != d.layout {
            refuse!("COPY_TENSOR between different layouts ({:?} -> {:?})", s.layout, d.layout);
        }
        let n = s.nbytes;
        match doff.checked_add(n) {
            Some(end) if end <= dbuf.size() => {}
            _ => refuse!("COPY_TENSOR of {n} bytes leaves the destination buffer"),
        }
        let (Some(from), Some(to)) = (sbuf.region(soff, n), dbuf.region(doff, n)) else {
            refuse!("COPY_TENSOR region outside a buffer");
        };
        dbuf.invalidate(doff, n);
        Ok(Reply::Job(MemJob::Copy(sbuf, from, dbuf, to), Some(vec![1])))
    }

    fn memset_tensor(&mut self, m: &MemsetTensorReq) -> Result<Reply> {
        let (r, buf, toff) = self.resolve_stored(&m.tensor)?;
        // ref: §7 MEMSET_TENSOR.
        if m.offset > r.nbytes || m.size > r.nbytes - m.offset {
            refuse!("MEMSET_TENSOR [{:#x}, +{}) leaves the tensor of {} bytes", m.offset, m.size, r.nbytes);
        }
        let Some(start) = toff.checked_add(m.offset) else { refuse!("MEMSET_TENSOR offset overflows") };
        let Some(region) = buf.region(start, m.size) else { refuse!("MEMSET_TENSOR leaves the buffer") };
        buf.invalidate(start, m.size);
        Ok(Reply::Job(MemJob::Fill(buf, region, m.value), None))
    }

    fn get_alloc_size(&mut self, req: &GetAllocSizeReq) -> Result<Reply> {
        self.device(req.device)?;
        let r = self.resolve(&req.tensor)?;
        // Sources only matter to backends that pad; a failing source is silently absent (ref: §7).
        Ok(Reply::Bytes(r.nbytes.to_le_bytes().to_vec()))
    }
}
