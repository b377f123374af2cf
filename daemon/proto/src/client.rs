//! A blocking RPC client over `std::net::TcpStream`, plain or inside TLS ([`crate::tls`]): HELLO with
//! the version check, the optional shared-secret exchange ([`crate::auth`]), then every command.
//!
//! Used by tests and by the Rust master. ref: ggml-rpc-protocol.md §3, §5, §6.
//! The client speaks every version in [`crate::version::SUPPORTED`] and picks the table by the
//! server's HELLO answer. At 8.0.0 it keeps, per device, the uids of the graphs the server stores,
//! with the server's clearing rule, so that [`RpcClient::graph_recompute_uid`] is only sent for a
//! graph the server holds.
//! [`RpcClient::connect_to`] is the one call a master needs: connect (every resolved address in
//! turn), TLS when configured, HELLO, authentication when asked.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::auth::{self, AuthKey};
use crate::cmd::{Cmd, REQUEST_HEADER_SIZE};
use crate::error::{Error, Result};
use crate::graph::GraphBlob;
use crate::hash::WireHash;
use crate::msg::{
    AllocBufferReq, AllocBufferRsp, CommInitReq, Command, DeviceMemoryRsp, GetAllocSizeReq, GetTensorReq,
    HelloRsp, MemsetTensorReq, SetTensorHashReq, SetTensorHeader, Tensor2d,
};
use crate::tensor::{RpcTensor, MAX_SRC};
use crate::tls::{TlsClient, Transport};
use crate::version::{GraphFormat, Protocol};

/// One connection to an RPC server.
pub struct RpcClient {
    stream: Transport,
    server: HelloRsp,
    proto: &'static Protocol,
    ext: Option<u32>,
    graphs: HashMap<u32, StoredUids>,
    next_uid: u64,
}

/// The uids of the graphs a server stores for one device (8.0.0), tracked as the server tracks them.
#[derive(Default)]
struct StoredUids {
    held: HashSet<u64>,
    last: Option<u64>,
}

/// How to reach a server: TLS and shared secret, both optional, and a timeout for connecting and
/// for the handshake.
#[derive(Clone, Debug, Default)]
pub struct ConnectOptions {
    /// Speak TLS, trusting this CA (`None`: plain TCP, as llama.cpp).
    pub tls: Option<TlsClient>,
    /// Answer the server's authentication challenge with this key.
    pub auth: Option<AuthKey>,
    /// Timeout for each TCP connect and for the handshakes (TLS, HELLO, AUTH); lifted afterwards.
    /// `None`: the system's defaults.
    pub timeout: Option<Duration>,
}

impl RpcClient {
    /// Connects, sets `TCP_NODELAY` and performs HELLO; fails unless the server is 7.0-compatible.
    pub fn connect(addr: impl ToSocketAddrs) -> Result<RpcClient> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Self::hello(stream)
    }

    /// As [`RpcClient::connect`], with a connect timeout and a read/write timeout for every later call.
    pub fn connect_timeout(addr: &std::net::SocketAddr, timeout: std::time::Duration) -> Result<RpcClient> {
        let stream = TcpStream::connect_timeout(addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Self::hello(stream)
    }

    /// Connects to `addr` (`host:port`; every resolved address is tried in turn) with `opts`: TCP,
    /// then the TLS handshake when `opts.tls` is set, then HELLO and, when the server asks,
    /// authentication. Read and write timeouts are lifted once connected (compute may take long).
    pub fn connect_to(addr: &str, opts: &ConnectOptions) -> Result<RpcClient> {
        let socks: Vec<_> = addr.to_socket_addrs()?.collect();
        let mut last = None;
        let mut stream = None;
        for sock in &socks {
            let s = match opts.timeout {
                Some(t) => TcpStream::connect_timeout(sock, t),
                None => TcpStream::connect(sock),
            };
            match s {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = match (stream, last) {
            (Some(s), _) => s,
            (None, Some(e)) => return Err(e.into()),
            (None, None) => {
                return Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("{addr} resolves to no address"),
                )))
            }
        };
        stream.set_nodelay(true)?;
        stream.set_read_timeout(opts.timeout)?;
        stream.set_write_timeout(opts.timeout)?;
        let c = RpcClient::handshake(stream, addr, opts.tls.as_ref(), opts.auth.as_ref())?;
        c.socket().set_read_timeout(None)?;
        c.socket().set_write_timeout(None)?;
        Ok(c)
    }

    /// On a connected stream to `addr`: TLS when `tls` is given, then HELLO and authentication.
    pub fn handshake(
        stream: TcpStream,
        addr: &str,
        tls: Option<&TlsClient>,
        key: Option<&AuthKey>,
    ) -> Result<RpcClient> {
        let transport = match tls {
            Some(t) => t.handshake(stream, addr)?,
            None => Transport::Plain(stream),
        };
        Self::hello_over(transport, key)
    }

    /// Performs HELLO on an already connected stream.
    pub fn hello(stream: TcpStream) -> Result<RpcClient> {
        Self::hello_auth(stream, None)
    }

    /// Performs HELLO and, when the server asks for it, shared-secret authentication with `key`
    /// (see [`crate::auth`]). A server that does not ask is used as is, with or without a key.
    pub fn hello_auth(stream: TcpStream, key: Option<&AuthKey>) -> Result<RpcClient> {
        Self::hello_over(Transport::Plain(stream), key)
    }

    /// [`RpcClient::hello_auth`] over any transport.
    pub fn hello_over(mut stream: Transport, key: Option<&AuthKey>) -> Result<RpcClient> {
        stream.write_all(&Command::Hello(crate::ext::request_caps()).encode_frame())?;
        let rsp = match read_response(&mut stream, Cmd::Hello, 28) {
            Err(Error::Io(e))
                if !stream.is_tls()
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
                    ) =>
            {
                // llamad closes a plain peer at once when it requires TLS or does not admit the address.
                return Err(Error::Io(std::io::Error::new(
                    e.kind(),
                    format!(
                        "the server closed the connection instead of answering HELLO ({e}): it may require \
                         TLS (connect with a CA: llamactl --tls-ca) or not admit this address (llamad --allow)"
                    ),
                )));
            }
            r => r?,
        };
        let server = HelloRsp::decode(&rsp)?;
        let Some(proto) = Protocol::for_server(&server) else {
            return Err(Error::Version { major: server.major, minor: server.minor, patch: server.patch });
        };
        // Only llamad answers the extension magic or an authentication challenge (which implies it).
        let mut ext = crate::ext::granted(&server.caps);
        if let Some(server_nonce) = auth::challenge_of(&server.caps) {
            ext = Some(crate::ext::EXT_VERSION);
            let Some(key) = key else {
                return Err(Error::Auth("the server requires a shared secret and none was given".into()));
            };
            let client_nonce: [u8; auth::NONCE_SIZE] = rand::random();
            stream.write_all(&auth::request_frame(
                &client_nonce,
                &key.client_mac(&server_nonce, &client_nonce),
            ))?;
            let proof = match read_response(&mut stream, Cmd::Hello, auth::MAC_SIZE as u64) {
                Ok(p) => p,
                Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Err(Error::Auth("the server refused our secret (closed the connection)".into()));
                }
                Err(e) => return Err(e),
            };
            let mut mac = [0u8; auth::MAC_SIZE];
            mac.copy_from_slice(&proof);
            if !key.verify_server(&server_nonce, &client_nonce, &mac) {
                return Err(Error::Auth("the server does not know the shared secret".into()));
            }
        }
        Ok(RpcClient { stream, server, proto, ext, graphs: HashMap::new(), next_uid: 1 })
    }

    /// The protocol version spoken on this connection (the server's, from HELLO).
    pub fn protocol(&self) -> &'static Protocol {
        self.proto
    }

    /// The llamad extension version the server granted (see [`crate::ext`]); `None` for llama.cpp's
    /// rpc-server.
    pub fn ext_version(&self) -> Option<u32> {
        self.ext
    }

    /// The server's HELLO answer.
    pub fn server_version(&self) -> HelloRsp {
        self.server
    }

    /// The underlying TCP socket, shared (for socket options and addresses).
    pub fn socket(&self) -> &TcpStream {
        self.stream.tcp()
    }

    /// The byte stream (for raw frames; encrypted underneath when TLS is on).
    pub fn stream(&mut self) -> &mut Transport {
        &mut self.stream
    }

    /// Whether the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        self.stream.is_tls()
    }

    fn send(&mut self, c: &Command<'_>) -> Result<()> {
        self.stream.write_all(&c.encode_frame())?;
        Ok(())
    }

    fn call(&mut self, c: &Command<'_>, expected: u64) -> Result<Vec<u8>> {
        self.send(c)?;
        read_response(&mut self.stream, c.cmd(), expected)
    }

    fn call_u64(&mut self, c: &Command<'_>) -> Result<u64> {
        let b = self.call(c, 8)?;
        Ok(u64::from_le_bytes(to_array(&b)?))
    }

    /// DEVICE_COUNT.
    pub fn device_count(&mut self) -> Result<u32> {
        let b = self.call(&Command::DeviceCount, 4)?;
        Ok(u32::from_le_bytes(to_array(&b)?))
    }

    /// ALLOC_BUFFER; `{0, 0}` when the server could not allocate.
    pub fn alloc_buffer(&mut self, device: u32, size: u64) -> Result<AllocBufferRsp> {
        let b = self.call(&Command::AllocBuffer(AllocBufferReq { device, size }), 16)?;
        Ok(AllocBufferRsp {
            remote_ptr: u64::from_le_bytes(to_array(&b[..8])?),
            remote_size: u64::from_le_bytes(to_array(&b[8..])?),
        })
    }

    /// GET_ALIGNMENT.
    pub fn get_alignment(&mut self, device: u32) -> Result<u64> {
        self.call_u64(&Command::GetAlignment { device })
    }

    /// GET_MAX_SIZE.
    pub fn get_max_size(&mut self, device: u32) -> Result<u64> {
        self.call_u64(&Command::GetMaxSize { device })
    }

    /// BUFFER_GET_BASE.
    pub fn buffer_get_base(&mut self, remote_ptr: u64) -> Result<u64> {
        self.call_u64(&Command::BufferGetBase { remote_ptr })
    }

    /// FREE_BUFFER (no response). The server drops its stored graphs, so this side forgets them too.
    pub fn free_buffer(&mut self, remote_ptr: u64) -> Result<()> {
        self.graphs.clear();
        self.send(&Command::FreeBuffer { remote_ptr })
    }

    /// BUFFER_CLEAR (no response).
    pub fn buffer_clear(&mut self, remote_ptr: u64, value: u8) -> Result<()> {
        self.send(&Command::BufferClear { remote_ptr, value })
    }

    /// SET_TENSOR (no response).
    pub fn set_tensor(
        &mut self,
        tensor: &RpcTensor,
        offset: u64,
        data: &[u8],
        cache_flag: bool,
    ) -> Result<()> {
        // Header and prefix first, then the data straight from the caller's slice (no copy of large writes).
        self.set_tensor_parts(tensor, offset, &[data], cache_flag)
    }

    /// SET_TENSOR with the data given in pieces, sent one after the other (no response). The pieces
    /// together are the write's bytes; a master coalescing several tensors into one write passes their
    /// bytes and the padding between them without first copying them into one buffer.
    pub fn set_tensor_parts(
        &mut self,
        tensor: &RpcTensor,
        offset: u64,
        parts: &[&[u8]],
        cache_flag: bool,
    ) -> Result<()> {
        let h = SetTensorHeader { tensor: *tensor, cache_flag: u8::from(cache_flag), offset };
        let prefix = Command::SetTensor(h, &[]).encode_payload();
        let len = parts.iter().fold(prefix.len() as u64, |n, p| n + p.len() as u64);
        let mut head = Vec::with_capacity(REQUEST_HEADER_SIZE + prefix.len());
        head.push(Cmd::SetTensor as u8);
        head.extend_from_slice(&len.to_le_bytes());
        head.extend_from_slice(&prefix);
        self.stream.write_all(&head)?;
        for p in parts {
            self.stream.write_all(p)?;
        }
        Ok(())
    }

    /// SET_TENSOR_HASH; true when the server had the data.
    pub fn set_tensor_hash(&mut self, tensor: &RpcTensor, offset: u64, hash: WireHash) -> Result<bool> {
        self.send_set_tensor_hash(tensor, offset, hash)?;
        self.recv_set_tensor_hash()
    }

    /// The request half of SET_TENSOR_HASH, for pipelining: the server executes the commands of a
    /// connection in order and answers them in order (ref: ggml-rpc-protocol.md §3.4), so a master may
    /// send several SET_TENSOR_HASH (and any no-response commands) before reading the answers. Each one
    /// must then be read with [`RpcClient::recv_set_tensor_hash`], in the order sent, before any other
    /// call that reads a response. The answers are one byte each, so a window of them never fills the
    /// socket buffers and cannot deadlock the connection.
    pub fn send_set_tensor_hash(&mut self, tensor: &RpcTensor, offset: u64, hash: WireHash) -> Result<()> {
        self.send(&Command::SetTensorHash(SetTensorHashReq { tensor: *tensor, offset, hash }))
    }

    /// The answer to the oldest SET_TENSOR_HASH sent with [`RpcClient::send_set_tensor_hash`] and not yet
    /// read: true when the server had the data.
    pub fn recv_set_tensor_hash(&mut self) -> Result<bool> {
        let b = read_response(&mut self.stream, Cmd::SetTensorHash, 1)?;
        Ok(b[0] != 0)
    }

    /// GET_TENSOR: exactly `size` bytes.
    pub fn get_tensor(&mut self, tensor: &RpcTensor, offset: u64, size: u64) -> Result<Vec<u8>> {
        self.call(&Command::GetTensor(GetTensorReq { tensor: *tensor, offset, size }), size)
    }

    /// The request half of GET_TENSOR, for a master that keeps several workers busy at once: it
    /// writes to each, then reads each answer with [`RpcClient::recv_get_tensor`] (in the order sent,
    /// before any other call that reads a response). The server answers once the commands before
    /// it, e.g. a GRAPH_COMPUTE, are done.
    pub fn send_get_tensor(&mut self, tensor: &RpcTensor, offset: u64, size: u64) -> Result<()> {
        self.send(&Command::GetTensor(GetTensorReq { tensor: *tensor, offset, size }))
    }

    /// The answer to the oldest GET_TENSOR sent with [`RpcClient::send_get_tensor`]: exactly `size`
    /// bytes.
    pub fn recv_get_tensor(&mut self, size: u64) -> Result<Vec<u8>> {
        read_response(&mut self.stream, Cmd::GetTensor, size)
    }

    /// COPY_TENSOR; true when the server copied.
    pub fn copy_tensor(&mut self, src: &RpcTensor, dst: &RpcTensor) -> Result<bool> {
        let b = self.call(&Command::CopyTensor { src: *src, dst: *dst }, 1)?;
        Ok(b[0] != 0)
    }

    /// GRAPH_COMPUTE (no response; the next response-bearing command is the barrier). At 8.0.0 the
    /// graph gets a fresh uid, so that [`RpcClient::graph_recompute`] can replay it.
    pub fn graph_compute(&mut self, graph: &GraphBlob) -> Result<()> {
        match self.proto.graph {
            GraphFormat::LastGraph => self.send(&Command::GraphCompute(graph.clone(), None)),
            GraphFormat::Uid => {
                let uid = self.fresh_uid();
                self.graph_compute_uid(graph, uid)
            }
        }
    }

    /// A uid this connection has not used.
    pub fn fresh_uid(&mut self) -> u64 {
        self.reserve_uids(1)
    }

    /// `n` consecutive uids this connection has not used; returns the first.
    pub fn reserve_uids(&mut self, n: u64) -> u64 {
        let uid = self.next_uid;
        self.next_uid += n;
        uid
    }

    /// GRAPH_COMPUTE with graph uid `uid` (8.0.0; 0 = not stored). A new non-zero uid on a device
    /// whose store is full clears the store first, on both sides (ref: ggml-rpc-protocol-8.md).
    pub fn graph_compute_uid(&mut self, graph: &GraphBlob, uid: u64) -> Result<()> {
        self.require_uids("GRAPH_COMPUTE")?;
        self.track_graph(graph.device, uid);
        self.send(&Command::GraphCompute(graph.clone(), Some(uid)))
    }

    /// Records that a GRAPH_COMPUTE with `uid` goes to `device` (for a caller that writes its own
    /// frames): the server stores it, clearing a full store first, and so does this side
    /// (ref: ggml-rpc-protocol-8.md). A no-op at 7.0.0.
    pub fn track_graph(&mut self, device: u32, uid: u64) {
        if self.proto.graph != GraphFormat::Uid {
            return;
        }
        let store = self.proto.graph_store;
        let d = self.graphs.entry(device).or_default();
        if uid != 0 && !d.held.contains(&uid) {
            if d.held.len() >= store {
                d.held.clear();
            }
            d.held.insert(uid);
        }
        d.last = (uid != 0).then_some(uid);
    }

    /// Whether the server stores the graph `uid` for `device` (8.0.0).
    pub fn holds_graph(&self, device: u32, uid: u64) -> bool {
        uid != 0 && self.graphs.get(&device).is_some_and(|d| d.held.contains(&uid))
    }

    /// GRAPH_RECOMPUTE (no response): the device's last graph; at 8.0.0, by the uid of the last
    /// graph sent to it (0, which the server refuses, when there is none).
    pub fn graph_recompute(&mut self, device: u32) -> Result<()> {
        match self.proto.graph {
            GraphFormat::LastGraph => self.send(&Command::GraphRecompute { device, uid: None }),
            GraphFormat::Uid => {
                let uid = self.graphs.get(&device).and_then(|d| d.last).unwrap_or(0);
                self.graph_recompute_uid(device, uid)
            }
        }
    }

    /// GRAPH_RECOMPUTE of the stored graph `uid` (8.0.0; no response).
    pub fn graph_recompute_uid(&mut self, device: u32, uid: u64) -> Result<()> {
        self.require_uids("GRAPH_RECOMPUTE")?;
        if let Some(d) = self.graphs.get_mut(&device) {
            if d.held.contains(&uid) {
                d.last = Some(uid);
            }
        }
        self.send(&Command::GraphRecompute { device, uid: Some(uid) })
    }

    /// Fails unless this connection's version sends graphs with uids.
    fn require_uids(&self, what: &'static str) -> Result<()> {
        if self.proto.graph == GraphFormat::Uid {
            Ok(())
        } else {
            Err(Error::invalid(what, format!("protocol {} has no graph uids", self.proto)))
        }
    }

    /// Fails unless this connection's version has `cmd`.
    fn require(&self, cmd: Cmd) -> Result<()> {
        if self.proto.has(cmd) {
            Ok(())
        } else {
            Err(Error::invalid("command", format!("{cmd} is not part of protocol {}", self.proto)))
        }
    }

    /// SET_TENSOR_2D (8.0.0, no response): `rows` packed back to back, `size = rows.len() / n_copies`.
    pub fn set_tensor_2d(&mut self, h: &Tensor2d, rows: &[u8]) -> Result<()> {
        self.require(Cmd::SetTensor2d)?;
        self.send(&Command::SetTensor2d(*h, rows))
    }

    /// GET_TENSOR_2D (8.0.0): the rows, packed (`size·n_copies` bytes).
    pub fn get_tensor_2d(&mut self, h: &Tensor2d) -> Result<Vec<u8>> {
        self.require(Cmd::GetTensor2d)?;
        let n = h.packed_len().ok_or_else(|| Error::invalid("GET_TENSOR_2D", "size·n_copies overflows"))?;
        self.call(&Command::GetTensor2d(*h), n)
    }

    /// COMM_INIT (8.0.0): true once the server's link to its peer is up. Rank 0 answers only when
    /// rank 1 has connected: a master sends both requests ([`RpcClient::send_comm_init`]) before
    /// reading either answer ([`RpcClient::recv_comm_init`]).
    pub fn comm_init(&mut self, req: &CommInitReq) -> Result<bool> {
        self.send_comm_init(req)?;
        self.recv_comm_init()
    }

    /// The request half of COMM_INIT.
    pub fn send_comm_init(&mut self, req: &CommInitReq) -> Result<()> {
        self.require(Cmd::CommInit)?;
        self.send(&Command::CommInit(*req))
    }

    /// The answer to the oldest COMM_INIT sent with [`RpcClient::send_comm_init`].
    pub fn recv_comm_init(&mut self) -> Result<bool> {
        let b = read_response(&mut self.stream, Cmd::CommInit, 1)?;
        Ok(b[0] != 0)
    }

    /// COMM_ALLREDUCE (8.0.0, no response).
    pub fn comm_allreduce(&mut self, device: u32, tensor: &RpcTensor) -> Result<()> {
        self.require(Cmd::CommAllreduce)?;
        self.send(&Command::CommAllreduce { device, tensor: *tensor })
    }

    /// COMM_FREE (8.0.0, no response).
    pub fn comm_free(&mut self, device: u32) -> Result<()> {
        self.require(Cmd::CommFree)?;
        self.send(&Command::CommFree { device })
    }

    /// GET_DEVICE_MEMORY.
    pub fn get_device_memory(&mut self, device: u32) -> Result<DeviceMemoryRsp> {
        let b = self.call(&Command::GetDeviceMemory { device }, 16)?;
        Ok(DeviceMemoryRsp {
            free: u64::from_le_bytes(to_array(&b[..8])?),
            total: u64::from_le_bytes(to_array(&b[8..])?),
        })
    }

    /// INIT_TENSOR (no response).
    pub fn init_tensor(&mut self, tensor: &RpcTensor) -> Result<()> {
        self.send(&Command::InitTensor(*tensor))
    }

    /// GET_ALLOC_SIZE.
    pub fn get_alloc_size(
        &mut self,
        device: u32,
        tensor: &RpcTensor,
        srcs: &[RpcTensor; MAX_SRC],
    ) -> Result<u64> {
        self.call_u64(&Command::GetAllocSize(Box::new(GetAllocSizeReq {
            device,
            tensor: *tensor,
            srcs: *srcs,
        })))
    }

    /// MEMSET_TENSOR (no response).
    pub fn memset_tensor(&mut self, tensor: &RpcTensor, offset: u64, size: u64, value: u8) -> Result<()> {
        self.send(&Command::MemsetTensor(MemsetTensorReq { tensor: *tensor, offset, size, value }))
    }
}

fn to_array<const N: usize>(b: &[u8]) -> Result<[u8; N]> {
    b.try_into().map_err(|_| Error::invalid("response", format!("{} bytes, expected {N}", b.len())))
}

/// Reads one response frame and checks its length is exactly `expected` (ref: §3.2).
pub fn read_response(r: &mut impl Read, cmd: Cmd, expected: u64) -> Result<Vec<u8>> {
    let mut len = [0u8; 8];
    r.read_exact(&mut len)?;
    let got = u64::from_le_bytes(len);
    if got != expected {
        return Err(Error::ResponseLength { cmd: cmd.name(), got, expected });
    }
    let n = usize::try_from(got).map_err(|_| Error::invalid("response", "length does not fit in memory"))?;
    let mut v = vec![0u8; n];
    r.read_exact(&mut v)?;
    Ok(v)
}
