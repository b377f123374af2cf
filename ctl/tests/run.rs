//! `llamactl run` end to end: greedy output computed in-process equals the output with the layers
//! on one and on two llamad workers (in-process servers on 127.0.0.1:0), on SmolLM2 and on a tiny
//! random model written with the GGUF writer; and the errors a user can act on.

mod support;

use std::io::{Read, Write};
use std::net::TcpListener;

use support::{llamactl, run_ok, run_text, smollm2, write_tiny_model, write_tiny_model_arch, Worker};

const MEM: u64 = 512 << 20;

fn greedy<'a>(model: &'a str, prompt: &'a str, n: &'a str) -> Vec<&'a str> {
    vec!["-m", model, "-p", prompt, "-n", n, "--temp", "0", "-t", "1", "-c", "256"]
}

fn with<'a>(mut base: Vec<&'a str>, extra: &[&'a str]) -> Vec<&'a str> {
    base.extend_from_slice(extra);
    base
}

#[test]
fn tiny_model_local_equals_one_and_two_workers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, 4);
    let m = path.to_str().unwrap();
    let (w1, w2) = (Worker::start(MEM), Worker::start(MEM));
    let two = format!("{},{}", w1.addr, w2.addr);
    for fa in ["on", "off"] {
        let base = with(greedy(m, "the cat sat on the mat", "24"), &["--flash-attn", fa]);
        let local = run_ok(&base);
        assert!(local.len() > 8, "the tiny model produced too little: {local:?}");
        // By host name: `localhost` may resolve to ::1 first; the worker listens on 127.0.0.1 only.
        let by_name = w1.addr.replace("127.0.0.1", "localhost");
        let one = run_ok(&with(base.clone(), &["--workers", &by_name]));
        assert_eq!(one, local, "one worker, fa {fa}");
        let both = run_ok(&with(base.clone(), &["--workers", &two]));
        assert_eq!(both, local, "two workers, fa {fa}");
        // Leading layers here (-ngl 3 of 5 slots: layers 0, 1 local), the rest split 1:3.
        let mixed = run_ok(&with(base.clone(), &["--workers", &two, "-ngl", "3", "--tensor-split", "1,3"]));
        assert_eq!(mixed, local, "two layers local, fa {fa}");
        // A prompt longer than the ubatch: several ubatches per prompt.
        let small_ub = with(base.clone(), &["--ubatch-size", "2"]);
        let local_ub = run_ok(&small_ub);
        assert_eq!(run_ok(&with(small_ub, &["--workers", &two])), local_ub, "ubatch 2, fa {fa}");
    }
}

#[test]
fn other_architectures_local_equals_two_workers() {
    let (w1, w2) = (Worker::start(MEM), Worker::start(MEM));
    let two = format!("{},{}", w1.addr, w2.addr);
    for arch in ["qwen2", "qwen3", "gemma3"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("{arch}.gguf"));
        write_tiny_model_arch(&path, 4, arch);
        let base = greedy(path.to_str().unwrap(), "the theme of the thesis", "16");
        let local = run_ok(&base);
        assert!(local.len() > 4, "{arch}: too little output {local:?}");
        assert_eq!(run_ok(&with(base.clone(), &["--workers", &two])), local, "{arch}");
        assert_eq!(run_ok(&with(base, &["--workers", &two, "-ngl", "2"])), local, "{arch}, -ngl 2");
    }
}

#[test]
fn generation_across_the_256_cell_boundary() {
    // 241 prompt tokens + 24 generated: n_kv grows from 256 to 512 mid-generation, so the workers
    // get new graphs (and a larger compute buffer) after a run of GRAPH_RECOMPUTEs.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, 2);
    let prompt = vec!["the"; 240].join(" ");
    let base =
        vec!["-m", path.to_str().unwrap(), "-p", &prompt, "-n", "24", "--temp", "0", "-t", "1", "-c", "600"];
    let out = llamactl(&with(vec!["run"], &base));
    let err = String::from_utf8_lossy(&out.stderr);
    // No early end of text: 241 prompt tokens, then 23 decode steps (the last passes cell 256).
    assert!(err.contains("/   241 tokens") && err.contains("/    23 runs"), "{err}");
    let local = out.stdout;
    let (w1, w2) = (Worker::start(MEM), Worker::start(MEM));
    let two = format!("{},{}", w1.addr, w2.addr);
    assert_eq!(run_ok(&with(base, &["--workers", &two])), local);
}

#[test]
fn smollm2_local_equals_one_and_two_workers() {
    let model = smollm2();
    let m = model.to_str().unwrap();
    let base = greedy(m, "The capital of France is", "24");
    let local = run_text(&base);
    assert!(local.split_whitespace().count() > 5, "too little text: {local:?}");
    let (w1, w2) = (Worker::start(MEM), Worker::start(MEM));
    let one = run_text(&with(base.clone(), &["--workers", &w1.addr]));
    assert_eq!(one, local, "one worker");
    let two = format!("{},{}", w1.addr, w2.addr);
    let both = run_text(&with(base.clone(), &["--workers", &two]));
    assert_eq!(both, local, "two workers");
}

#[test]
fn smollm2_known_continuation() {
    // ref: ggml-compute-semantics.md §4.11: "Hello world, this is" → " a world" greedily.
    let model = smollm2();
    let w = Worker::start(MEM);
    let out = run_text(&with(
        greedy(model.to_str().unwrap(), "Hello world, this is", "2"),
        &["--workers", &w.addr],
    ));
    assert_eq!(out, " a world\n");
}

#[test]
fn smollm2_chat_through_workers_matches_llama_cpp() {
    // llama-cpp-python 0.3.36 create_chat_completion (temperature 0) on the same model: 37 prompt
    // tokens, "The answer to this classic math problem is 4." then end of turn.
    let model = smollm2();
    let (w1, w2) = (Worker::start(MEM), Worker::start(MEM));
    let two = format!("{},{}", w1.addr, w2.addr);
    let m = model.to_str().unwrap();
    let args =
        ["run", "-m", m, "--chat", "-p", "What is 2+2?", "-n", "32", "--temp", "0", "-t", "1", "-c", "256"];
    let out = llamactl(&with(args.to_vec(), &["--workers", &two]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "The answer to this classic math problem is 4.\n");
    assert!(err.contains("/    37 tokens"), "{err}");
}

#[test]
fn prompt_file_equals_prompt_flag() {
    let (dir, m) = tiny();
    let f = dir.path().join("prompt.txt");
    std::fs::write(&f, "the theme").unwrap();
    let by_flag = run_ok(&greedy(&m, "the theme", "12"));
    let by_file =
        run_ok(&["-m", &m, "-f", f.to_str().unwrap(), "-n", "12", "--temp", "0", "-t", "1", "-c", "256"]);
    assert_eq!(by_file, by_flag);
}

/// A server that answers HELLO with another protocol version.
fn fake_server(major: u8, minor: u8) -> (String, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut req = [0u8; 9 + 24];
        s.read_exact(&mut req).unwrap();
        // ref: ggml-rpc-protocol.md §15 item 30: HELLO with a 24-byte caps payload. llamactl's caps ask
        // for llamad's extension (magic, then zeros), which a TCP-only server ignores (§6).
        assert_eq!(req[0], 14, "first command is HELLO");
        assert_eq!(u64::from_le_bytes(req[1..9].try_into().unwrap()), 24);
        assert_eq!(req[9..], llamad_proto::ext::request_caps(), "caps: the extension request");
        let mut rsp = 28u64.to_le_bytes().to_vec();
        rsp.extend_from_slice(&[major, minor, 3, 0]);
        rsp.extend_from_slice(&[0u8; 24]);
        s.write_all(&rsp).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    });
    (addr, t)
}

fn run_err(args: &[&str]) -> String {
    let mut full = vec!["run"];
    full.extend_from_slice(args);
    let out = llamactl(&full);
    assert_eq!(out.status.code(), Some(1), "expected exit code 1 for {full:?}");
    assert!(out.stdout.is_empty() || out.stdout == b"\n");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn tiny() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, 2);
    let s = path.to_str().unwrap().to_string();
    (dir, s)
}

#[test]
fn protocol_version_mismatch_is_a_clear_error() {
    let (_d, m) = tiny();
    // 8.0 and 7.0 are spoken; a newer minor of either, or another major, is refused.
    for (major, minor) in [(6, 0), (7, 1), (8, 1), (9, 0)] {
        let (addr, t) = fake_server(major, minor);
        let err = run_err(&with(greedy(&m, "hi", "2"), &["--workers", &addr]));
        assert!(
            err.contains(&format!("worker {addr} speaks RPC protocol version {major}.{minor}.3"))
                && err.contains("speaks 8.0.x and 7.0.x"),
            "{err}"
        );
        t.join().unwrap();
    }
}

#[test]
fn unreachable_worker_is_a_clear_error() {
    let (_d, m) = tiny();
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let err = run_err(&with(greedy(&m, "hi", "2"), &["--workers", &addr]));
    assert!(err.contains(&format!("worker {addr} is unreachable")), "{err}");
}

/// Layers per worker from `llamactl run`'s layer-split line (`ADDR [a..b)` per worker).
fn layers_per_worker(stderr: &str, addrs: &[&str]) -> Vec<u32> {
    let line = stderr.lines().find(|l| l.contains("layers here")).unwrap_or_else(|| panic!("{stderr}"));
    addrs
        .iter()
        .map(|a| {
            let rest = line.split(&format!("{a} [")).nth(1).unwrap_or_else(|| panic!("{a} in {line}"));
            let range = rest.split(')').next().unwrap();
            let (lo, hi) = range.split_once("..").unwrap();
            hi.parse::<u32>().unwrap() - lo.parse::<u32>().unwrap()
        })
        .collect()
}

#[test]
fn smollm2_pooled_across_three_workers_smaller_than_the_model() {
    // SmolLM2's weights are ~92 MiB; no worker can hold them (56, 48, 72 MiB budgets), the three
    // together can. Layer split follows each worker's free memory (llama.cpp's rule) and gives the
    // in-process text bit for bit; split mode row gives each a third.
    let model = smollm2();
    let m = model.to_str().unwrap();
    let base = greedy(m, "The capital of France is", "16");
    let local = run_text(&base);
    let ws = [Worker::start(56 << 20), Worker::start(48 << 20), Worker::start(72 << 20)];
    let addrs: Vec<&str> = ws.iter().map(|w| w.addr.as_str()).collect();
    let three = addrs.join(",");
    let out = llamactl(&with(with(vec!["run"], &base), &["--workers", &three, "--split-mode", "layer"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), local, "layer split");
    let layers = layers_per_worker(&err, &addrs);
    assert_eq!(layers.iter().sum::<u32>(), 30, "{err}");
    // More memory, more layers: 72 > 56 > 48 MiB.
    assert!(layers[2] > layers[0] && layers[0] > layers[1], "{layers:?}: {err}");
    // Row split adds the shards' partial sums in another order than one device's matmul: its logits
    // differ in the last bits, and on this prompt the 16th token (a digit) flips. The first 12
    // tokens are those of the in-process run.
    let row = run_text(&with(
        greedy(m, "The capital of France is", "12"),
        &["--workers", &three, "--split-mode", "row"],
    ));
    let row = row.trim_end_matches('\n');
    assert!(row.len() > 20 && local.starts_with(row), "split mode row: {row:?} vs {local:?}");
    // Two of them alone (104 MiB) cannot hold weights, KV cache and compute buffers: refused
    // before any upload, with the numbers.
    let two = format!("{},{}", addrs[0], addrs[1]);
    let big_ctx = ["run", "-m", m, "-p", "hi", "-n", "2", "--temp", "0", "-t", "1", "-c", "4096"];
    let err = run_err(&with(big_ctx[1..].to_vec(), &["--workers", &two]));
    assert!(err.contains("does not fit in the workers' memory") && err.contains("short by"), "{err}");
}

#[test]
fn a_long_context_that_does_not_fit_is_refused_before_upload_with_its_kv_cache() {
    // SmolLM2 at 32768 cells (4x its training context): K and V of a layer are 2 · 192 · 32768 · 2 B
    // = 24 MiB. Two equal workers split the 31 slots at 0.5: layers 0..16 (384 MiB of KV cache) and
    // 16..30 (336 MiB); with 400 MiB each (--mem also caps one buffer, so the KV buffer itself
    // may be 384 MiB) neither fits once its weights (34 and 58 MiB) and compute buffer (about 45 MiB)
    // are added, and nothing is uploaded.
    let model = smollm2();
    let (w1, w2) = (Worker::start(400 << 20), Worker::start(400 << 20));
    let two = format!("{},{}", w1.addr, w2.addr);
    let m = model.to_str().unwrap();
    let err = run_err(&[
        "-m",
        m,
        "-p",
        "hi",
        "-n",
        "2",
        "--temp",
        "0",
        "-t",
        "1",
        "-c",
        "32768",
        "--workers",
        &two,
    ]);
    assert!(err.contains("--ctx-size 32768 is beyond the model's training context (8192 tokens)"), "{err}");
    assert!(err.contains("does not fit in the workers' memory"), "{err}");
    assert!(
        err.contains(&format!("worker {} needs", w1.addr)) && err.contains("for layers 0..16 ("),
        "{err}"
    );
    assert!(
        err.contains(&format!("worker {} needs", w2.addr)) && err.contains("for layers 16..30 ("),
        "{err}"
    );
    assert!(err.contains("weights, 384.00 MiB KV cache,"), "{err}");
    assert!(err.contains("weights, 336.00 MiB KV cache,"), "{err}");
    assert!(err.contains("reports 400.00 MiB free: short by"), "{err}");
    assert!(!err.contains("llamactl: loading"), "uploaded before refusing: {err}");
    // At 8192 cells (its training context) the same workers hold it: 96 + 84 MiB of KV cache,
    // reported per worker, and no warning.
    let out = llamactl(&[
        "run",
        "-m",
        m,
        "-p",
        "hi",
        "-n",
        "2",
        "--temp",
        "0",
        "-t",
        "1",
        "-c",
        "8192",
        "--workers",
        &two,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("training context"), "{err}");
    assert!(err.contains(&format!("{} [0..16) KV cache 96.00 MiB", w1.addr)), "{err}");
    assert!(err.contains(&format!("{} [16..30) KV cache 84.00 MiB", w2.addr)), "{err}");
}

#[test]
fn model_too_large_for_the_workers_says_by_how_much() {
    let model = smollm2();
    // 8 MiB each cannot hold SmolLM2's ~92 MiB of weights.
    let (w1, w2) = (Worker::start(8 << 20), Worker::start(8 << 20));
    let two = format!("{},{}", w1.addr, w2.addr);
    let err = run_err(&with(greedy(model.to_str().unwrap(), "hi", "2"), &["--workers", &two]));
    assert!(err.contains("does not fit in the workers' memory"), "{err}");
    assert!(err.contains("short by"), "{err}");
}

#[test]
fn malformed_gguf_and_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let err = run_err(&greedy(bad.to_str().unwrap(), "hi", "2"));
    assert!(err.contains("is not a readable GGUF file"), "{err}");
    let err = run_err(&greedy("/nonexistent/model.gguf", "hi", "2"));
    assert!(err.contains("does not exist"), "{err}");
}

#[test]
fn unsupported_architecture_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gptj.gguf");
    write_tiny_model_arch(&path, 1, "gptj");
    let err = run_err(&greedy(path.to_str().unwrap(), "hi", "2"));
    assert!(err.contains("unsupported model") && err.contains("unsupported architecture \"gptj\""), "{err}");
}

#[test]
fn usage_errors_exit_2() {
    let out = llamactl(&["run", "-m", "x.gguf"]);
    assert_eq!(out.status.code(), Some(2));
}

/// Split mode `auto` is the default: it measures the workers, says what it picked and why, and
/// runs exactly the mode it names (the text equals that mode's run when asked for by name); one
/// worker is always `layer`; an explicit mode measures nothing.
#[test]
fn split_mode_auto_is_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, 4);
    let m = path.to_str().unwrap();
    let (w1, w2) = (Worker::start(MEM), Worker::start(MEM));
    let two = format!("{},{}", w1.addr, w2.addr);
    let default_run = |workers: &str| {
        let mut a = vec!["run"];
        a.extend(greedy(m, "hello", "6"));
        a.extend(["--workers", workers]);
        let out = support::llamactl_cmd().env_remove("LLAMACTL_SPLIT_MODE").args(&a).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        (out.stdout, err)
    };
    let (text, err) = default_run(&two);
    let line = err.lines().find(|l| l.contains("split mode auto:")).unwrap_or_else(|| panic!("{err}"));
    let picked = if line.contains("split mode auto: row") {
        "row"
    } else {
        assert!(line.contains("split mode auto: layer"), "{line}");
        "layer"
    };
    assert!(line.contains("estimated per token") && line.contains("round trips"), "{line}");
    assert_eq!(text, run_ok(&with(greedy(m, "hello", "6"), &["--workers", &two, "--split-mode", picked])));
    let (_, err) = default_run(&w1.addr);
    assert!(err.contains("split mode auto: layer"), "one worker: {err}");
    let out = llamactl(&with(
        with(vec!["run"], &greedy(m, "hello", "2")),
        &["--workers", &two, "--split-mode", "layer"],
    ));
    assert!(out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("split mode auto"));
}
