//! Test harness: an in-process server on 127.0.0.1:0, raw-byte helpers, tensor builders, and the
//! "attack" runner every negative test uses (attacker closed, its memory returned, server still
//! accepting, a concurrently connected bystander unaffected).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use llamad::config::Config;
use llamad::Shared;
use llamad_proto::msg::Command;
use llamad_proto::version::{Protocol, V7};
use llamad_proto::{GraphBlob, RpcClient, RpcTensor};

/// Budget used by test servers.
pub const TEST_MEM: u64 = 64 << 20;

/// A server running on its own runtime thread; stopped on drop.
/// The 7.0.0 suites (conformance, negative, …) speak to a server announcing 7.0.0 through these
/// constructors; the 8.0.0 suites (`v8`, `comm`) name their version.
pub struct TestServer {
    pub addr: SocketAddr,
    pub shared: Arc<Shared>,
    pub proto: &'static Protocol,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    pub fn start() -> TestServer {
        TestServer::start_proto(&V7)
    }

    /// A server speaking `proto`.
    pub fn start_proto(proto: &'static Protocol) -> TestServer {
        let cfg = Config { threads: 2, mem: Some(TEST_MEM), ..Config::default() };
        TestServer::with_shared_proto(Shared::new(cfg), "127.0.0.1:0", proto)
    }

    pub fn with_config(cfg: Config) -> TestServer {
        TestServer::with_shared(Shared::new(cfg))
    }

    pub fn with_shared(shared: Arc<Shared>) -> TestServer {
        TestServer::with_shared_on(shared, "127.0.0.1:0")
    }

    /// A server listening on `bind` (e.g. `[::1]:0`, `[::]:0`).
    pub fn with_shared_on(shared: Arc<Shared>, bind: &'static str) -> TestServer {
        TestServer::with_shared_proto(shared, bind, &V7)
    }

    /// A server listening on `bind`, speaking `proto`.
    pub fn with_shared_proto(
        shared: Arc<Shared>,
        bind: &'static str,
        proto: &'static Protocol,
    ) -> TestServer {
        let (tx_addr, rx_addr) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let s = shared.clone();
        let thread = std::thread::spawn(move || {
            let rt =
                tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind(bind).await.unwrap();
                tx_addr.send(l.local_addr().unwrap()).unwrap();
                llamad::serve_all(s, vec![(l, proto)], async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
            });
        });
        let addr = rx_addr.recv().unwrap();
        TestServer { addr, shared, proto, stop: Some(stop), thread: Some(thread) }
    }

    pub fn client(&self) -> RpcClient {
        let c = RpcClient::connect(self.addr).unwrap();
        c.socket().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c
    }

    /// A connection that has not sent HELLO.
    pub fn raw(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    /// A raw connection after HELLO.
    pub fn raw_hello(&self) -> TcpStream {
        let mut s = self.raw();
        s.write_all(&hello_frame()).unwrap();
        let mut rsp = [0u8; 36];
        s.read_exact(&mut rsp).unwrap();
        let mut want = hello_reply();
        want[8] = self.proto.version.major;
        assert_eq!(rsp, want);
        s
    }

    /// The server accepts a new connection and answers DEVICE_COUNT.
    pub fn assert_alive(&self) {
        let mut c = self.client();
        assert_eq!(c.device_count().unwrap(), 1);
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn hello_frame() -> Vec<u8> {
    let mut v = vec![14u8];
    v.extend_from_slice(&24u64.to_le_bytes());
    v.extend_from_slice(&[0u8; 24]);
    v
}

pub fn hello_reply() -> [u8; 36] {
    let mut r = [0u8; 36];
    r[0] = 28;
    r[8] = 7;
    r
}

pub fn frame(cmd: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![cmd];
    v.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// A socket the assertions below can read with a timeout: a raw `TcpStream` or a client's
/// `Transport` (plain or TLS).
pub trait Sock: Read {
    fn read_timeout(&self, t: Option<Duration>);
}

impl Sock for TcpStream {
    fn read_timeout(&self, t: Option<Duration>) {
        self.set_read_timeout(t).unwrap();
    }
}

impl Sock for llamad_proto::Transport {
    fn read_timeout(&self, t: Option<Duration>) {
        self.set_read_timeout(t).unwrap();
    }
}

/// Asserts the server closed `s` without sending anything more.
pub fn assert_closed(s: &mut impl Sock) {
    s.read_timeout(Some(Duration::from_secs(5)));
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return,
            Ok(n) => panic!("expected a closed connection, got {n} bytes: {:?}", &b[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted) => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => panic!("expected a closed connection, got {e} (still open)"),
        }
    }
}

/// Asserts nothing arrives on `s` within `ms` milliseconds (and the connection is not closed).
pub fn assert_silent(s: &mut impl Sock, ms: u64) {
    s.read_timeout(Some(Duration::from_millis(ms)));
    let mut b = [0u8; 16];
    match s.read(&mut b) {
        Ok(0) => panic!("connection closed"),
        Ok(n) => panic!("unexpected {n} bytes: {:?}", &b[..n]),
        Err(e) => assert!(matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "{e}"),
    }
    s.read_timeout(Some(Duration::from_secs(5)));
}

/// An f32 vector of `n` elements at `data` in `buffer`.
pub fn f32_tensor(id: u64, buffer: u64, data: u64, n: u32) -> RpcTensor {
    RpcTensor {
        id,
        dtype: 0,
        buffer,
        ne: [n, 1, 1, 1],
        nb: [4, 4 * n, 4 * n, 4 * n],
        data,
        ..Default::default()
    }
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// A buffer of `size` bytes on a client: (handle, base).
pub fn buffer(c: &mut RpcClient, size: u64) -> (u64, u64) {
    let a = c.alloc_buffer(0, size).unwrap();
    assert_ne!(a.remote_ptr, 0);
    assert!(a.remote_size >= size);
    let base = c.buffer_get_base(a.remote_ptr).unwrap();
    (a.remote_ptr, base)
}

/// `out = a + b` over f32[n] at offsets 0, 4n, 8n of one buffer (ids 1, 2, 3).
pub fn add_graph(buf: u64, base: u64, n: u32) -> (GraphBlob, [RpcTensor; 3]) {
    let a = f32_tensor(1, buf, base, n).with_name("a");
    let b = f32_tensor(2, buf, base + 4 * n as u64, n).with_name("b");
    let mut out = f32_tensor(3, buf, base + 8 * n as u64, n).with_name("out");
    out.op = 2;
    out.flags = 16;
    out.src[0] = 1;
    out.src[1] = 2;
    (GraphBlob { device: 0, nodes: vec![3], tensors: vec![a, b, out] }, [a, b, out])
}

/// A connected attacker with one 1 KiB buffer.
pub struct Attacker {
    pub c: RpcClient,
    pub buf: u64,
    pub base: u64,
}

impl Attacker {
    /// Sends a command frame, ignoring write errors (the server may already have closed).
    pub fn send(&mut self, cmd: &Command<'_>) {
        let _ = self.c.stream().write_all(&cmd.encode_frame());
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        let _ = self.c.stream().write_all(bytes);
    }
}

/// Runs a negative case, which must be refused with a reason containing `expect`: a bystander with data is connected during the attack; afterwards the
/// attacker's connection is closed, the server accepts new connections, and the bystander's data
/// and connection are intact.
pub fn attack(expect: &str, f: impl FnOnce(&mut Attacker)) {
    let server = TestServer::start();
    attack_on(&server, expect, f);
}

pub fn attack_on(server: &TestServer, expect: &str, f: impl FnOnce(&mut Attacker)) {
    let mut by = server.client();
    let (bbuf, bbase) = buffer(&mut by, 64);
    let t = f32_tensor(77, bbuf, bbase, 16);
    let data: Vec<f32> = (0..16).map(|i| i as f32 * 1.5).collect();
    by.set_tensor(&t, 0, &f32_bytes(&data), false).unwrap();

    let baseline = server.shared.memory.allocated();
    let mut c = server.client();
    let (buf, base) = buffer(&mut c, 1024);
    assert!(server.shared.memory.allocated() > baseline);
    let mut a = Attacker { c, buf, base };
    server.shared.stats.take_last_refusal();
    f(&mut a);
    assert_closed(a.c.stream());
    let reason = server.shared.stats.take_last_refusal().unwrap_or_default();
    assert!(reason.contains(expect), "refused for `{reason}`, expected `{expect}`");
    assert_memory_back(server, baseline);

    server.assert_alive();
    assert_eq!(bytes_f32(&by.get_tensor(&t, 0, 64).unwrap()), data);
    assert_eq!(by.device_count().unwrap(), 1);
}

/// Asserts the server's buffers come back to `baseline` bytes (the account of every connection's
/// buffers) within 5 s of a connection closing: whatever the closed peer held was freed.
pub fn assert_memory_back(server: &TestServer, baseline: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now = server.shared.memory.allocated();
        if now == baseline {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "memory not back to baseline: {now} bytes allocated, {baseline} before the connection"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
