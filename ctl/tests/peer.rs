//! The master against llama.cpp's own RPC server (`tests/peer/ggml-rpc-server`, the reference
//! peer built by `tests/peer/build-peer.sh`): the greedy text equals what llama.cpp itself
//! generates for SmolLM2 (llama-cpp-python 0.3.36, `temp=0`, FA on and off both give this text),
//! with the model on one server, split over two, and with leading layers computed here.
//! ref: ggml-rpc-protocol.md §15 item 34. Skipped with a message when the peer is not built.

mod support;

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{run_text, smollm2};

/// llama.cpp's greedy continuation of "Hello world, this is" (16 tokens).
const LLAMA_CPP_TEXT: &str =
    " a world where the rules of the universe are subtly woven into the fabric of reality\n";

struct Peer {
    addr: String,
    child: Child,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn peer_available() -> bool {
    let home = std::env::var("HOME").unwrap_or_default();
    let root = std::env::var("LLAMAD_PEER_CACHE").unwrap_or(format!("{home}/.cache/llamad-peer"));
    std::env::var("LLAMAD_PEER_PYTHON").is_ok()
        || std::fs::read_dir(root).is_ok_and(|d| {
            d.flatten().any(|e| {
                e.file_name().to_string_lossy().starts_with("venv-") && e.path().join("bin/python").exists()
            })
        })
}

fn start_peer() -> Peer {
    start_peer_with(&[])
}

/// A port below the ephemeral range (32768+) that nothing listens on now, as the interop tests
/// choose theirs: a port from `bind(0)` is one the masters' own short connections may be using.
fn free_port() -> u16 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let mut x = (std::process::id() as u64) << 32 | nanos as u64;
    for _ in 0..500 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let port = 20000 + ((x >> 33) % 12000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below 32768");
}

fn start_peer_with(extra: &[&str]) -> Peer {
    let port = free_port();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/peer/ggml-rpc-server");
    let child = Command::new(script)
        .args(["-H", "127.0.0.1", "-p", &port.to_string(), "-t", "1"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    let t0 = Instant::now();
    // The reference serves one connection at a time; a probe connection closes at once.
    let mut child = child;
    while TcpStream::connect(&addr).is_err() {
        assert!(child.try_wait().unwrap().is_none(), "reference server on {addr} exited at start");
        assert!(t0.elapsed() < Duration::from_secs(60), "reference server did not start on {addr}");
        std::thread::sleep(Duration::from_millis(100));
    }
    Peer { addr, child }
}

#[test]
fn master_on_reference_servers_matches_llama_cpp() {
    if !peer_available() {
        eprintln!("skipping: no reference peer (run tests/peer/build-peer.sh)");
        return;
    }
    let model = smollm2();
    let m = model.to_str().unwrap();
    let (p1, p2) = (start_peer(), start_peer());
    let base = ["-m", m, "-p", "Hello world, this is", "-n", "16", "--temp", "0", "-t", "1", "-c", "256"];
    let run = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        run_text(&a)
    };
    assert_eq!(run(&["--workers", &p1.addr]), LLAMA_CPP_TEXT, "one reference server");
    let two = format!("{},{}", p1.addr, p2.addr);
    assert_eq!(run(&["--workers", &two]), LLAMA_CPP_TEXT, "two reference servers");
    assert_eq!(run(&["--workers", &two, "--flash-attn", "off"]), LLAMA_CPP_TEXT, "two, FA off");
}

#[test]
fn row_split_on_reference_servers_equals_row_split_on_llamad() {
    // Split mode row uses only protocol 7.0.0 commands, so llama.cpp's server runs the shards too;
    // llamad's ops are bit-exact with ggml's, so the text is the same as over llamad workers.
    if !peer_available() {
        eprintln!("skipping: no reference peer (run tests/peer/build-peer.sh)");
        return;
    }
    let model = smollm2();
    let m = model.to_str().unwrap();
    let (p1, p2) = (start_peer(), start_peer());
    let (w1, w2) = (support::Worker::start(512 << 20), support::Worker::start(512 << 20));
    let base = ["-m", m, "-p", "Hello world, this is", "-n", "16", "--temp", "0", "-t", "1", "-c", "256"];
    let run = |workers: &str| {
        let mut a = base.to_vec();
        a.extend_from_slice(&["--workers", workers, "--split-mode", "row"]);
        run_text(&a)
    };
    let reference = run(&format!("{},{}", p1.addr, p2.addr));
    assert!(reference.split_whitespace().count() > 5, "too little text: {reference:?}");
    assert_eq!(reference, run(&format!("{},{}", w1.addr, w2.addr)));
}

#[test]
fn coalesced_writes_go_through_the_reference_servers_cache() {
    // llamactl sends each SmolLM2 layer's weights as one write (an I8 range over them): llama.cpp's
    // server with its cache (`-c`) stores those by their FNV-1a like any other write and serves them
    // on the next load, which then sends next to nothing and still gives llama.cpp's text.
    if !peer_available() {
        eprintln!("skipping: no reference peer (run tests/peer/build-peer.sh)");
        return;
    }
    let model = smollm2();
    let m = model.to_str().unwrap();
    let cache = tempfile::tempdir().unwrap();
    // A fresh server for each load, on the same cache directory: the cache outlives the process
    // (and a load never depends on a reference server surviving the previous master's disconnect,
    // which once refused the second load's connection).
    let start = || start_peer_with(&["-c", "--cache-dir", cache.path().to_str().unwrap()]);
    let args =
        ["run", "-m", m, "-p", "Hello world, this is", "-n", "16", "--temp", "0", "-t", "1", "-c", "256"];
    let run = || {
        let p = start();
        let out = support::llamactl_cmd().args(args).args(["--workers", &p.addr]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        (String::from_utf8(out.stdout).unwrap(), err)
    };
    let (cold, err) = run();
    assert_eq!(cold, LLAMA_CPP_TEXT, "{err}");
    assert!(err.contains("0.00 MiB from the worker's cache"), "{err}");
    let files = walk(cache.path());
    // 30 layers of one write each and the 28 MiB token embedding (the LM head) alone.
    assert_eq!(files, 31, "{err}");
    let (warm, err) = run();
    assert_eq!(warm, LLAMA_CPP_TEXT, "{err}");
    assert!(err.contains(" 0.00 MiB sent"), "the second load resent weights: {err}");
}

/// Regular files under `dir`, recursively.
fn walk(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| if e.path().is_dir() { walk(&e.path()) } else { 1 })
        .sum()
}
