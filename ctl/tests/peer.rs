//! The master against llama.cpp's own RPC server (`e2e::server`, from the reference peer built by
//! `tests/peer/build-peer.sh`): the greedy text equals what llama.cpp itself
//! generates for SmolLM2 (llama-cpp-python 0.3.36, `temp=0`, FA on and off both give this text),
//! with the model on one server, split over two, and with leading layers computed here.
//! ref: ggml-rpc-protocol.md §15 item 34. Skipped with a message when the peer is not built.

mod support;

use e2e::server::{peer_python, Server};
use support::{run_text, smollm2};

/// llama.cpp's greedy continuation of "Hello world, this is" (16 tokens).
const LLAMA_CPP_TEXT: &str =
    " a world where the rules of the universe are subtly woven into the fabric of reality\n";

/// The reference server (1 thread) with `extra` flags; `None`, with a message, when the peer is
/// not built.
fn start_peer_with(extra: &[&str]) -> Option<Server> {
    let Some(python) = peer_python() else {
        eprintln!("skipping: no reference peer (run tests/peer/build-peer.sh)");
        return None;
    };
    Some(Server::reference_with(&python, extra).expect("start the reference server"))
}

fn start_peer() -> Option<Server> {
    start_peer_with(&[])
}

#[test]
fn master_on_reference_servers_matches_llama_cpp() {
    let (Some(p1), Some(p2)) = (start_peer(), start_peer()) else { return };
    let model = smollm2();
    let m = model.to_str().unwrap();
    let base = ["-m", m, "-p", "Hello world, this is", "-n", "16", "--temp", "0", "-t", "1", "-c", "256"];
    let run = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        run_text(&a)
    };
    assert_eq!(run(&["--workers", &p1.addr.to_string()]), LLAMA_CPP_TEXT, "one reference server");
    let two = format!("{},{}", p1.addr, p2.addr);
    assert_eq!(run(&["--workers", &two]), LLAMA_CPP_TEXT, "two reference servers");
    assert_eq!(run(&["--workers", &two, "--flash-attn", "off"]), LLAMA_CPP_TEXT, "two, FA off");
}

#[test]
fn row_split_on_reference_servers_equals_row_split_on_llamad() {
    // Split mode row uses only protocol 7.0.0 commands, so llama.cpp's server runs the shards too;
    // llamad's ops are bit-exact with ggml's, so the text is the same as over llamad workers.
    let (Some(p1), Some(p2)) = (start_peer(), start_peer()) else { return };
    let model = smollm2();
    let m = model.to_str().unwrap();
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
fn pipelined_prompts_on_reference_servers_give_the_in_process_text() {
    // A 177-token prompt over two workers in split mode layer runs as two pipelined micro-batches
    // (protocol 7.0.0 commands only, so llama.cpp's servers run them too). Each micro-batch is
    // computed as a ubatch of its own, which for this model gives the bits of the whole prompt,
    // so the text is the in-process text on llamad workers and on the reference servers alike.
    // Flash attention is off: for 64 and more query rows ggml's CPU backend tiles it in another
    // order (tests/interop/README.md), and this prompt's text then differs from ours.
    let (Some(p1), Some(p2)) = (start_peer(), start_peer()) else { return };
    let model = smollm2();
    let m = model.to_str().unwrap();
    // Everything in the numerics profile of the peer's build (the in-process run, llamactl's master
    // and the llamad workers), so that all three compute llama.cpp's bits.
    let numerics = peer_python().and_then(|p| e2e::server::peer_numerics(&p)).unwrap_or("avx2");
    let llamad = |_| {
        Server::llamad_with(&e2e::server::llamad_bin(), None, &["--numerics", numerics, "--protocol", "7"])
            .expect("start llamad")
    };
    let (w1, w2) = (llamad(1), llamad(2));
    let prompt = "Hello world, this is a test of the pipeline. ".repeat(16);
    let base = [
        "-m",
        m,
        "-p",
        &prompt,
        "-n",
        "12",
        "--temp",
        "0",
        "-t",
        "1",
        "-c",
        "512",
        "--flash-attn",
        "off",
        "--numerics",
        numerics,
    ];
    let run = |workers: Option<String>| {
        let mut a = vec!["run"];
        a.extend_from_slice(&base);
        if let Some(w) = &workers {
            a.extend_from_slice(&["--workers", w]);
        }
        let out = support::llamactl(&a);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        if workers.is_some() {
            // Two micro-batches and 11 decode steps on each worker.
            assert_eq!(err.matches(": 13 graphs").count(), 2, "{err}");
        }
        String::from_utf8(out.stdout).unwrap()
    };
    let local = run(None);
    assert!(local.split_whitespace().count() > 5, "too little text: {local:?}");
    assert_eq!(run(Some(format!("{},{}", w1.addr, w2.addr))), local, "two llamad workers");
    assert_eq!(run(Some(format!("{},{}", p1.addr, p2.addr))), local, "two reference servers");
}

#[test]
fn coalesced_writes_go_through_the_reference_servers_cache() {
    // llamactl sends each SmolLM2 layer's weights as one write (an I8 range over them): llama.cpp's
    // server with its cache (`-c`) stores those by their FNV-1a like any other write and serves them
    // on the next load, which then sends next to nothing and still gives llama.cpp's text.
    if peer_python().is_none() {
        eprintln!("skipping: no reference peer (run tests/peer/build-peer.sh)");
        return;
    }
    let model = smollm2();
    let m = model.to_str().unwrap();
    let cache = tempfile::tempdir().unwrap();
    // A fresh server for each load, on the same cache directory: the cache outlives the process
    // (and a load never depends on a reference server surviving the previous master's disconnect,
    // which once refused the second load's connection).
    let start = || start_peer_with(&["--cache-dir", cache.path().to_str().unwrap()]).unwrap();
    let args =
        ["run", "-m", m, "-p", "Hello world, this is", "-n", "16", "--temp", "0", "-t", "1", "-c", "256"];
    let run = || {
        let mut p = start();
        let out =
            support::llamactl_cmd().args(args).args(["--workers", &p.addr.to_string()]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}\n{}", p.state());
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
