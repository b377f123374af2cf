//! One connection: the HELLO handshake, then frames read and executed strictly in order, responses
//! written for the commands that have one, and a log line when it closes. The one overlap: a cache
//! lookup (SET_TENSOR_HASH) runs while the next one, already received, starts ([`LOOKAHEAD`]); their
//! answers still go out in order, and every other command waits for them.
//!
//! ref: ggml-rpc-protocol.md §3 (framing), §6 (handshake), §3.4 (ordering). A protocol violation
//! closes only this connection, with a `warn!` naming the peer, the command and the reason.
//! Before HELLO the first byte picks plain TCP or TLS ([`crate::rpc::tls`]); the protocol that
//! follows is the same over both.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use llamad_proto::cmd::{
    Cmd, CONN_CAPS_SIZE, REQUEST_HEADER_SIZE, SET_TENSOR_HEADER_SIZE, TENSOR_2D_HEADER_SIZE,
};
use llamad_proto::msg::{Command, SetTensorHeader, Tensor2d};
use llamad_proto::Protocol;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, debug_span, info, warn, Instrument};

use crate::error::{refuse, Error, Result};
use crate::rpc::limits::{Phase, Timed};
use crate::rpc::server::Shared;
use crate::rpc::session::{Reply, Session};
use crate::rpc::stats::{ConnStats, LiveConn};
use crate::rpc::{auth, cache, exec};
use llamad_proto::ext;

/// Fills and copies at least this large run on a blocking thread, not on the runtime.
const BLOCKING_BYTES: usize = 1 << 20;

/// Cache lookups (SET_TENSOR_HASH) run at once at most, when the peer has already sent the next one:
/// a lookup is mostly one core hashing a cache object, so a master that pipelines its requests (as
/// llamactl does) gets a warm load on two cores.
const LOOKAHEAD: usize = 2;

/// A cache lookup whose one-byte answer is not written yet.
struct Lookup {
    load: cache::PendingLoad,
    hash: llamad_proto::WireHash,
    started: Instant,
}

struct Conn<R, W> {
    /// The protocol version this connection speaks (its listener's).
    proto: &'static Protocol,
    /// Commands after HELLO (a peer that leaves without one probably refused our version).
    after_hello: u64,
    reader: BufReader<Timed<R>>,
    writer: BufWriter<Timed<W>>,
    session: Session,
    shared: Arc<Shared>,
    stats: ConnStats,
    live: Arc<LiveConn>,
    current: Option<Cmd>,
    /// Our address on a plain connection (where extension links are offered); `None` over TLS.
    local: Option<IpAddr>,
    /// Cache lookups running, oldest first; their answers are written in this order, before any other
    /// response, and no other command runs until they are (see [`LOOKAHEAD`]).
    lookups: std::collections::VecDeque<Lookup>,
}

/// What a connection did, for its closing log line.
struct Ended {
    end: &'static str,
    stats: ConnStats,
    buffers: usize,
}

impl Ended {
    /// A connection closed before the protocol started (at the TLS/plain decision).
    fn early(end: &'static str) -> Ended {
        Ended { end, stats: ConnStats::default(), buffers: 0 }
    }
}

/// How a connection speaks, told by its first byte.
enum Kind {
    Plain,
    Tls,
    Left,
}

/// Logs and counts why a connection ends, before its socket is closed (so a peer that sees the
/// close finds the reason already recorded).
fn conclude(
    shared: &Shared,
    peer: SocketAddr,
    cmd: Option<Cmd>,
    outcome: Result<&'static str>,
) -> &'static str {
    match outcome {
        Ok(reason) => reason,
        Err(e) => {
            let cmd = cmd.map(Cmd::name).unwrap_or("-");
            warn!(%peer, cmd, reason = %e, "closing connection");
            shared.stats.record_refusal(format!("{cmd}: {e}"));
            "refused"
        }
    }
}

/// Serves one connection, speaking `proto`, until the peer leaves, breaks a rule, or shutdown is
/// requested.
pub async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    proto: &'static Protocol,
    cancel: CancellationToken,
) {
    let start = Instant::now();
    shared.stats.connections.fetch_add(1, Ordering::Relaxed);
    shared.stats.active.fetch_add(1, Ordering::Relaxed);
    debug!(%peer, "connection accepted");
    let live = shared.stats.live.open(peer);
    let mut tls = false;
    let ended = match sniff(&stream, &shared).await {
        Ok(Kind::Plain) => {
            let local = stream.local_addr().ok().map(|a| a.ip());
            let master = watch_handle(&stream);
            let (r, w) = stream.into_split();
            let ends = Ends { peer, local, ext_ip: local, proto };
            drive(r, w, ends, &shared, live.clone(), &cancel, master).await
        }
        Ok(Kind::Tls) => {
            let local = stream.local_addr().ok().map(|a| a.ip());
            let master = watch_handle(&stream);
            match handshake(stream, &shared).await {
                Ok(s) => {
                    tls = true;
                    debug!(%peer, "TLS established");
                    let (r, w) = tokio::io::split(s);
                    // No extension over TLS: its links would be plain TCP.
                    let ends = Ends { peer, local, ext_ip: None, proto };
                    drive(r, w, ends, &shared, live.clone(), &cancel, master).await
                }
                Err(e) => Ended::early(conclude(&shared, peer, None, Err(e))),
            }
        }
        Ok(Kind::Left) => Ended::early("peer left before HELLO"),
        Err(e) => {
            let end = conclude(&shared, peer, None, Err(e));
            drop(stream);
            Ended::early(end)
        }
    };
    shared.stats.live.close(live.id);
    shared.stats.active.fetch_sub(1, Ordering::Relaxed);
    info!(
        %peer,
        tls,
        duration_ms = start.elapsed().as_millis() as u64,
        bytes_in = ended.stats.bytes_in,
        bytes_out = ended.stats.bytes_out,
        commands = %ended.stats.by_command(),
        graphs = ended.stats.graphs,
        buffers_freed = ended.buffers,
        end = ended.end,
        "connection closed"
    );
}

/// A second handle on the connection's socket (a duplicated descriptor, non-blocking like the
/// original), for an all-reduce to see the master leave ([`crate::rpc::comm::MasterWatch`]).
fn watch_handle(stream: &TcpStream) -> Option<std::net::TcpStream> {
    use std::os::fd::AsFd;
    stream.as_fd().try_clone_to_owned().ok().map(std::net::TcpStream::from)
}

/// Tells a TLS ClientHello from a plain HELLO by the first byte (peeked, not consumed), and
/// refuses the peer when its choice does not match `[tls]`.
async fn sniff(stream: &TcpStream, shared: &Shared) -> Result<Kind> {
    let hello_timeout = shared.cfg.hello_timeout;
    let mut first = [0u8; 1];
    let n = match tokio::time::timeout(hello_timeout, stream.peek(&mut first)).await {
        Ok(r) => r?,
        Err(_) => refuse!("no HELLO within {hello_timeout:?}"),
    };
    if n == 0 {
        return Ok(Kind::Left);
    }
    let tls_hello = first[0] == llamad_proto::tls::TLS_HANDSHAKE_BYTE;
    match &shared.cfg.tls {
        Some(_) if tls_hello => Ok(Kind::Tls),
        None if tls_hello => refuse!(
            "the peer started a TLS handshake but TLS is not configured here (tls.cert and tls.key, \
             or --tls-cert and --tls-key)"
        ),
        Some(t) if t.require => refuse!(
            "TLS is required (tls.require) but the peer spoke plain TCP (first byte {:#04x}); llama.cpp \
             masters cannot use TLS: set tls.require = false (--tls-optional) to serve them in plain",
            first[0]
        ),
        _ => Ok(Kind::Plain),
    }
}

/// The server side of the TLS handshake, bounded by the HELLO timeout.
async fn handshake(stream: TcpStream, shared: &Shared) -> Result<tokio_rustls::server::TlsStream<TcpStream>> {
    let hello_timeout = shared.cfg.hello_timeout;
    let Some(t) = &shared.cfg.tls else { refuse!("TLS is not configured here") };
    match tokio::time::timeout(hello_timeout, t.acceptor().accept(stream)).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => refuse!("TLS handshake failed: {e}"),
        Err(_) => refuse!("TLS handshake not finished within {hello_timeout:?}"),
    }
}

/// Who is at either end of a connection, and what it speaks.
struct Ends {
    peer: SocketAddr,
    /// Our address as the peer reached it.
    local: Option<IpAddr>,
    /// Where extension links are offered: `local` on a plain connection, `None` over TLS.
    ext_ip: Option<IpAddr>,
    proto: &'static Protocol,
}

/// Runs the protocol over a connection's halves; the session (and its buffers) is freed and the
/// end recorded before the halves (the socket) are dropped.
async fn drive<R, W>(
    r: R,
    w: W,
    ends: Ends,
    shared: &Arc<Shared>,
    live: Arc<LiveConn>,
    cancel: &CancellationToken,
    master: Option<std::net::TcpStream>,
) -> Ended
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send,
{
    let (idle, frame) = (shared.cfg.idle_timeout, shared.cfg.frame_timeout);
    let Ends { peer, local, ext_ip, proto } = ends;
    let mut conn = Conn {
        proto,
        after_hello: 0,
        reader: BufReader::with_capacity(64 * 1024, Timed::new(r, idle, frame)),
        writer: BufWriter::with_capacity(64 * 1024, Timed::new(w, None, frame)),
        session: Session::new(shared.clone(), proto, local),
        shared: shared.clone(),
        stats: ConnStats::default(),
        live,
        current: None,
        local: ext_ip,
        lookups: std::collections::VecDeque::new(),
    };
    if let Some(m) = master {
        conn.session.watch_master(m);
    }
    let outcome = conn.run(cancel).await;
    if matches!(outcome, Ok("peer closed")) && conn.after_hello == 0 {
        // A master of another major checks the version right after HELLO and aborts (llama.cpp:
        // "RPC server version mismatch"), closing the socket without a command.
        let others: Vec<String> = llamad_proto::version::SUPPORTED
            .iter()
            .filter(|p| p.version != proto.version)
            .map(|p| p.name())
            .collect();
        warn!(
            %peer,
            announced = %proto,
            "the peer closed the connection right after HELLO without a command: it probably speaks RPC \
             protocol {} and refused our {proto} (llama.cpp masters abort with \"RPC server version \
             mismatch\"); serve it with --protocol {} (server.protocol) or on --port-v7",
            others.join(" or "),
            others.first().map(|v| &v[..1]).unwrap_or("?"),
        );
    }
    let buffers = conn.session.buffer_count();
    drop(conn.session);
    let end = conclude(shared, peer, conn.current, outcome);
    Ended { end, stats: conn.stats, buffers }
}

impl<R: AsyncRead + Unpin + Send, W: AsyncWrite + Unpin + Send> Conn<R, W> {
    /// Reads a request header; `None` on a clean end of stream before its first byte. Waiting for
    /// the first byte is idle time; from then on the frame timeout applies until the next header.
    async fn header(&mut self) -> Result<Option<(u8, u64)>> {
        let mut b = [0u8; REQUEST_HEADER_SIZE];
        self.reader.get_mut().set_phase(Phase::Idle);
        if self.reader.read(&mut b[..1]).await? == 0 {
            return Ok(None);
        }
        self.reader.get_mut().set_phase(Phase::Frame);
        self.reader.read_exact(&mut b[1..]).await?;
        Ok(Some(llamad_proto::msg::decode_request_header(&b)?))
    }

    /// Reads `len` payload bytes, growing the vector only as data arrives.
    async fn payload(&mut self, len: u64) -> Result<Vec<u8>> {
        let mut v = Vec::with_capacity(len.min(1 << 20) as usize);
        (&mut self.reader).take(len).read_to_end(&mut v).await?;
        if v.len() as u64 != len {
            refuse!("connection ended inside a {len}-byte payload");
        }
        Ok(v)
    }

    async fn respond(&mut self, payload: &[u8]) -> Result<u64> {
        self.writer.write_all(&(payload.len() as u64).to_le_bytes()).await?;
        self.writer.write_all(payload).await?;
        self.writer.flush().await?;
        Ok(8 + payload.len() as u64)
    }

    async fn run(&mut self, cancel: &CancellationToken) -> Result<&'static str> {
        // HELLO first, exactly 24 bytes (ref: §6; §15 items 1–2).
        let hello_timeout = self.shared.cfg.hello_timeout;
        let first = match tokio::time::timeout(hello_timeout, self.header()).await {
            Ok(h) => h?,
            Err(_) => refuse!("no HELLO within {hello_timeout:?}"),
        };
        let Some((cmd, len)) = first else { return Ok("peer left before HELLO") };
        self.current = self.proto.spec(cmd).map(|s| s.cmd);
        if cmd != Cmd::Hello as u8 {
            refuse!("expected HELLO, got command byte {cmd}");
        }
        if len != CONN_CAPS_SIZE as u64 {
            refuse!("HELLO of {len} bytes (client needs protocol v{})", self.proto.version.major);
        }
        let caps = self.payload(len).await?;
        let mut hello = self.proto.hello();
        // A master that asks for llamad's extension (never llama.cpp's, whose caps are zeros or RDMA
        // parameters without the magic) gets it on plain connections; everyone else gets zeros.
        let ext = caps.get(..8) == Some(&ext::EXT_MAGIC[..]) && self.local.is_some();
        if let (true, Some(ip)) = (ext, self.local) {
            hello.caps = ext::grant_caps();
            self.session.grant_ext(ip);
        }
        let challenge = self.shared.cfg.auth.as_ref().map(|_| auth::challenge());
        if let Some(nonce) = &challenge {
            hello.caps = llamad_proto::auth::challenge_caps(nonce);
        }
        let out = self.respond(&hello.encode()).await?;
        self.account(Cmd::Hello, REQUEST_HEADER_SIZE as u64 + len, out);
        if let (Some(key), Some(nonce)) = (self.shared.cfg.auth.clone(), challenge) {
            let header = match tokio::time::timeout(hello_timeout, self.header()).await {
                Ok(h) => h?,
                Err(_) => refuse!("no AUTH within {hello_timeout:?}"),
            };
            let proof = match header {
                Some((cmd, len)) if auth::is_request(cmd, len) => {
                    let payload = self.payload(len).await?;
                    auth::verify(&key, &nonce, &payload)?
                }
                Some((cmd, _)) => refuse!("{}", auth::missing(cmd)),
                None => return Ok("peer left before authenticating"),
            };
            self.respond(&proof).await?;
            debug!("peer authenticated");
        }
        loop {
            self.current = None;
            if !self.lookups.is_empty() && !self.lookup_is_next() {
                // Nothing to overlap with: answer the lookups before waiting for the peer, who may be
                // waiting for them.
                self.finish_lookups(0).await?;
            }
            let header = tokio::select! {
                _ = cancel.cancelled() => return Ok("shutdown"),
                h = self.header() => h?,
            };
            let Some((byte, len)) = header else { return Ok("peer closed") };
            self.after_hello += 1;
            if byte != Cmd::SetTensorHash as u8 {
                // Every other command may touch the buffers the lookups fill: they finish first.
                self.finish_lookups(0).await?;
            }
            if ext::is_ext(byte) {
                let span = debug_span!("cmd", cmd = ext::name(byte), len);
                let out = self.ext_command(byte, len).instrument(span).await?;
                self.account_bytes(REQUEST_HEADER_SIZE as u64 + len, out);
                continue;
            }
            let Some(spec) = self.proto.spec(byte) else {
                refuse!("unknown command byte {byte} (protocol {})", self.proto)
            };
            let cmd = spec.cmd;
            self.current = Some(cmd);
            if !spec.request.accepts(len) {
                refuse!("payload length {len} does not match {:?}", spec.request);
            }
            let span = debug_span!("cmd", cmd = cmd.name(), len);
            let out = self.command(cmd, len).instrument(span).await?;
            self.account(cmd, REQUEST_HEADER_SIZE as u64 + len, out);
        }
    }

    /// Whether the next request is a SET_TENSOR_HASH that has arrived whole (it can be read without
    /// waiting for the peer).
    fn lookup_is_next(&self) -> bool {
        let b = self.reader.buffer();
        let Some(Ok((cmd, len))) = b.get(..REQUEST_HEADER_SIZE).map(llamad_proto::msg::decode_request_header)
        else {
            return false;
        };
        cmd == Cmd::SetTensorHash as u8
            && self.proto.spec(cmd).is_some_and(|s| s.request.accepts(len))
            && (b.len() as u64) >= REQUEST_HEADER_SIZE as u64 + len
    }

    /// Answers running cache lookups, oldest first, until at most `keep` are left.
    async fn finish_lookups(&mut self, keep: usize) -> Result<()> {
        while self.lookups.len() > keep {
            let Some(Lookup { load, hash, started }) = self.lookups.pop_front() else { break };
            let len = load.region.len();
            let hit = load.hit().await;
            debug!(%hash, hit, len, us = started.elapsed().as_micros() as u64, "cache lookup");
            self.respond(&[u8::from(hit)]).await?;
        }
        Ok(())
    }

    /// Reads and executes one command whose header has been checked; returns the response bytes sent.
    async fn command(&mut self, cmd: Cmd, len: u64) -> Result<u64> {
        let out = if cmd == Cmd::SetTensor {
            self.set_tensor(len).await?
        } else if cmd == Cmd::SetTensor2d {
            self.set_tensor_2d(len).await?
        } else {
            if len > self.shared.max_frame {
                refuse!("payload of {len} bytes exceeds max_frame {}", self.shared.max_frame);
            }
            let payload = self.payload(len).await?;
            let command = Command::decode(self.proto, cmd as u8, &payload, &self.shared.limits)?;
            let reply = self.session.handle(command)?;
            self.reply(reply).await?
        };
        debug!(out, "done");
        Ok(out)
    }

    /// An extension command (see [`crate::rpc::ext`]); refused unless negotiated at HELLO.
    async fn ext_command(&mut self, byte: u8, len: u64) -> Result<u64> {
        if len > self.shared.max_frame {
            refuse!("payload of {len} bytes exceeds max_frame {}", self.shared.max_frame);
        }
        let payload = self.payload(len).await?;
        let reply = self.session.handle_ext(byte, &payload)?;
        self.reply(reply).await
    }

    /// SET_TENSOR: validate the 305-byte header, then read the data straight into the buffer.
    async fn set_tensor(&mut self, len: u64) -> Result<u64> {
        let mut h = [0u8; SET_TENSOR_HEADER_SIZE];
        self.reader.read_exact(&mut h).await?;
        let header = SetTensorHeader::decode(&h)?;
        let n = len - SET_TENSOR_HEADER_SIZE as u64; // accepts_len guarantees len >= 305
        let (buf, region) = self.session.set_tensor_target(&header, n)?;
        region.prefault_for_write();
        // SAFETY: `region` lies inside the live buffer `buf`, held until the end of this function;
        // no graph is running (every run is awaited) and no other command executes meanwhile.
        let dst = unsafe { region.as_mut_slice() };
        read_exact_or_refuse(&mut self.reader, dst).await?;
        if let Some(cache) = self.session.cache_for_store(&header) {
            if n > 0 {
                cache::store(cache, buf, region).await;
            }
        }
        Ok(0)
    }

    /// SET_TENSOR_2D: validate the 328-byte header and every row, then read each row straight into
    /// its place (no buffering of the payload, however many rows).
    async fn set_tensor_2d(&mut self, len: u64) -> Result<u64> {
        let mut h = [0u8; TENSOR_2D_HEADER_SIZE];
        self.reader.read_exact(&mut h).await?;
        let header = Tensor2d::decode(&h)?;
        let n = len - TENSOR_2D_HEADER_SIZE as u64; // the table guarantees len >= 328
        let (buf, rows) = self.session.set_tensor_2d_target(&header, n)?;
        for i in 0..rows.n {
            let Some(region) = rows.row(&buf, i) else { refuse!("SET_TENSOR_2D row {i} outside the buffer") };
            // SAFETY: `region` lies inside the live buffer `buf` (every row validated), held until the
            // end of this function; no graph is running and no other command executes meanwhile.
            let dst = unsafe { region.as_mut_slice() };
            read_exact_or_refuse(&mut self.reader, dst).await?;
        }
        Ok(0)
    }

    /// A response frame of `rows` packed, written row by row.
    async fn respond_rows(
        &mut self,
        buf: &crate::rpc::buffer::Buffer,
        rows: crate::rpc::session::Rows,
    ) -> Result<u64> {
        let len = rows.packed_len();
        self.writer.write_all(&len.to_le_bytes()).await?;
        for i in 0..rows.n {
            let Some(region) = rows.row(buf, i) else { refuse!("GET_TENSOR_2D row {i} outside the buffer") };
            // SAFETY: the row lies inside the live buffer `buf`, held by the caller; nothing writes
            // buffers while a response is written.
            let bytes = unsafe { region.as_slice() };
            self.writer.write_all(bytes).await?;
        }
        self.writer.flush().await?;
        Ok(8 + len)
    }

    async fn reply(&mut self, reply: Reply) -> Result<u64> {
        if !matches!(reply, Reply::CacheLoad(..)) {
            // A SET_TENSOR_HASH answered without a lookup (no cache, nothing to fill) still answers in
            // order.
            self.finish_lookups(0).await?;
        }
        match reply {
            Reply::Nothing => Ok(0),
            Reply::Bytes(b) => self.respond(&b).await,
            Reply::Rows(buf, rows) => self.respond_rows(&buf, rows).await,
            Reply::Region(_buf, region) => {
                // SAFETY: `region` lies inside the live buffer `_buf`, held for this scope; nothing
                // writes buffers while a response is written.
                let bytes = unsafe { region.as_slice() };
                self.respond(bytes).await
            }
            Reply::CacheLoad(cache, hash, buf, region) => {
                // Two loads never fill the same bytes at once: the later one waits for the earlier.
                if self.lookups.iter().any(|l| l.load.region.overlaps(&region)) {
                    self.finish_lookups(0).await?;
                }
                let load = cache::start_load(cache, hash, buf, region);
                self.lookups.push_back(Lookup { load, hash, started: Instant::now() });
                self.finish_lookups(LOOKAHEAD - 1).await?;
                // The answer (written by `finish_lookups`, now or later) is 8 + 1 bytes.
                Ok(9)
            }
            Reply::Job(job, rsp) => {
                if job.len() >= BLOCKING_BYTES {
                    tokio::task::spawn_blocking(move || job.run())
                        .await
                        .map_err(|e| Error::Refused(format!("memory job failed: {e}")))?;
                } else {
                    job.run();
                }
                match rsp {
                    Some(b) => self.respond(&b).await,
                    None => Ok(0),
                }
            }
            Reply::Blocking(job) => match exec::blocking(job).await? {
                Some(b) => self.respond(&b).await,
                None => Ok(0),
            },
            Reply::Compute(graph) => {
                let t0 = Instant::now();
                exec::run(self.shared.executor.clone(), graph).await?;
                self.shared.stats.graph_latency.observe(t0.elapsed());
                self.stats.graphs += 1;
                self.live.graphs.fetch_add(1, Ordering::Relaxed);
                self.shared.stats.graphs_computed.fetch_add(1, Ordering::Relaxed);
                Ok(0)
            }
        }
    }

    fn account(&mut self, cmd: Cmd, bytes_in: u64, bytes_out: u64) {
        self.stats.counts[cmd as usize] += 1;
        self.account_bytes(bytes_in, bytes_out);
        self.shared.stats.record(cmd, bytes_in, bytes_out);
    }

    /// Bytes of a command outside the reference's command table (extension commands).
    fn account_bytes(&mut self, bytes_in: u64, bytes_out: u64) {
        self.stats.bytes_in += bytes_in;
        self.stats.bytes_out += bytes_out;
        self.live.commands.fetch_add(1, Ordering::Relaxed);
        self.live.bytes_in.fetch_add(bytes_in, Ordering::Relaxed);
        self.live.bytes_out.fetch_add(bytes_out, Ordering::Relaxed);
    }
}

async fn read_exact_or_refuse(r: &mut (impl AsyncRead + Unpin), dst: &mut [u8]) -> Result<()> {
    match r.read_exact(dst).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err(Error::Refused(format!("connection ended inside {} bytes of tensor data", dst.len())))
        }
        Err(e) => Err(e.into()),
    }
}
