//! Helpers shared by the fuzz targets: splitting a byte stream into RPC frames the way the server
//! reads them, and one in-process llamad reached over loopback TCP.
//!
//! The targets live in `fuzz_targets/`; `scripts/fuzz.sh` runs each for a bounded time.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use llamad::config::Config;
use llamad::Shared;

/// Memory budget of the fuzzed servers and sessions: small, so that every graph the fuzzer builds
/// runs in bounded time.
pub const FUZZ_MEM: u64 = 1 << 20;

/// The configuration every fuzzed server runs with.
pub fn fuzz_config() -> Config {
    Config {
        threads: 1,
        mem: Some(FUZZ_MEM),
        max_frame: 1 << 20,
        max_connections: 4,
        hello_timeout: Duration::from_secs(5),
        ..Config::default()
    }
}

/// One frame of a request stream: command byte and payload (cut short when the stream ends early).
pub struct Frame<'a> {
    /// Command byte.
    pub cmd: u8,
    /// Declared payload length.
    pub len: u64,
    /// The payload bytes present in the stream (`len` of them unless the stream was truncated).
    pub payload: &'a [u8],
}

/// Splits `data` into `u8 cmd, u64 len, payload` frames (ref: ggml-rpc-protocol.md §3.1).
pub fn frames(mut data: &[u8]) -> Vec<Frame<'_>> {
    let mut out = Vec::new();
    while data.len() >= 9 {
        let cmd = data[0];
        let mut l = [0u8; 8];
        l.copy_from_slice(&data[1..9]);
        let len = u64::from_le_bytes(l);
        let rest = &data[9..];
        let take = usize::try_from(len).unwrap_or(usize::MAX).min(rest.len());
        out.push(Frame { cmd, len, payload: &rest[..take] });
        data = &rest[take..];
    }
    out
}

/// A llamad server on 127.0.0.1 in this process, started once.
pub struct Server {
    /// Its address.
    pub addr: SocketAddr,
    /// Its shared state (memory account, counters).
    pub shared: Arc<Shared>,
}

/// The process-wide 7.0.0 server (started on first use, on its own runtime thread); the seeds are
/// captured 7.0.0 sessions.
pub fn server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| start(&llamad_proto::version::V7))
}

/// The process-wide 8.0.0 server.
pub fn server_v8() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| start(&llamad_proto::version::V8))
}

fn start(proto: &'static llamad_proto::Protocol) -> Server {
    {
        // libFuzzer's main does not run Rust's runtime setup, which ignores SIGPIPE.
        // SAFETY: setting a signal disposition to SIG_IGN has no memory-safety preconditions.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        let shared = Shared::new(fuzz_config());
        let s = shared.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
                tx.send(l.local_addr().expect("addr")).expect("send addr");
                llamad::serve_all(s, vec![(l, proto)], std::future::pending()).await.expect("serve");
            });
        });
        let addr = rx.recv().expect("server address");
        Server { addr, shared }
    }
}

impl Server {
    /// Sends `bytes` on a fresh connection, half-closes it and reads until the server closes.
    /// Returns the bytes the server sent.
    pub fn exchange(&self, bytes: &[u8]) -> Vec<u8> {
        let mut s = TcpStream::connect(self.addr).expect("connect");
        s.set_nodelay(true).ok();
        s.set_read_timeout(Some(Duration::from_secs(30))).ok();
        let mut w = s.try_clone().expect("clone socket");
        let data = bytes.to_vec();
        // Write from another thread so that large responses cannot dead-lock the exchange.
        let writer = std::thread::spawn(move || {
            let _ = w.write_all(&data);
            let _ = w.shutdown(std::net::Shutdown::Write);
        });
        let mut out = Vec::new();
        if let Err(e) = s.read_to_end(&mut out) {
            assert!(
                e.kind() == std::io::ErrorKind::ConnectionReset,
                "server did not close the connection: {e}"
            );
        }
        writer.join().expect("writer thread");
        out
    }

    /// Waits until every connection has ended, then checks that no buffer memory is held.
    pub fn assert_baseline(&self) {
        for _ in 0..2000 {
            if self.shared.stats.active.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        let active = self.shared.stats.active.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(active, 0, "connections still open after their peer left");
        assert_eq!(self.shared.memory.allocated(), 0, "buffer memory held after every connection closed");
    }
}
