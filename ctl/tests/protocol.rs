//! What the master puts on the wire, counted by an in-process llamad: GRAPH_RECOMPUTE for repeated
//! decode steps (ref: ggml-rpc-protocol.md §8.4, §15 item 33), and the SET_TENSOR_HASH path for
//! weights above the threshold with a cache hit on the second load (§9, §15 item 32).

mod support;

use std::sync::Arc;

use llamad::rpc::cache::MemoryCache;
use llamad::{Config, Shared};
use llamad_proto::Cmd;
use support::{llamactl, write_tiny_model, Worker};

fn count(shared: &Shared, cmd: Cmd) -> u64 {
    shared.stats.cmds[cmd as usize].count.load(std::sync::atomic::Ordering::Relaxed)
}

fn run(args: &[&str]) -> (Vec<u8>, String) {
    let mut full = vec!["run"];
    full.extend_from_slice(args);
    let out = llamactl(&full);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    (out.stdout, err)
}

#[test]
fn decode_steps_reuse_the_graph_and_weights_come_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, 2);
    let cache = Arc::new(MemoryCache::default());
    let cfg = Config { threads: 1, mem: Some(256 << 20), ..Config::default() };
    let shared = Shared::with_cache(cfg, Some(cache.clone()));
    let w = Worker::with_shared(shared.clone());
    let args = [
        "-m",
        path.to_str().unwrap(),
        "-p",
        "the theme",
        "-n",
        "8",
        "--temp",
        "0",
        "-c",
        "128",
        "--workers",
        &w.addr,
        "--hash-threshold",
        "0",
    ];
    let (first, err1) = run(&args);
    // 2 layers × 9 weights + output norm + output head; the embedding table stays here.
    let n_weights = 2 * 9 + 2;
    assert_eq!(count(&shared, Cmd::SetTensorHash), n_weights, "{err1}");
    assert!(
        err1.contains(&format!("{n_weights} tensors")) && err1.contains("0.00 MiB from the worker's cache"),
        "{err1}"
    );
    assert_eq!(cache.len() as u64, n_weights, "every miss was resent with cache_flag = 1");
    // Prompt: GRAPH_COMPUTE; first decode step (new shape): GRAPH_COMPUTE; then 6 recomputes
    // (8 tokens sampled, 7 decode steps).
    assert_eq!(count(&shared, Cmd::GraphCompute), 2, "{err1}");
    assert_eq!(count(&shared, Cmd::GraphRecompute), 6, "{err1}");
    let sets_before = count(&shared, Cmd::SetTensor);

    let (second, err2) = run(&args);
    assert_eq!(second, first, "same greedy output from cached weights");
    assert!(err2.contains("0.00 MiB sent"), "every weight is a cache hit: {err2}");
    assert_eq!(count(&shared, Cmd::SetTensorHash), 2 * n_weights);
    // The second run's SET_TENSORs are the graph inputs only: per ubatch the embeddings,
    // positions, mask, K and V indices and out_ids; no weights.
    let input_sets = count(&shared, Cmd::SetTensor) - sets_before;
    assert_eq!(input_sets, 8 * 6, "weights were resent");
}

#[test]
fn weights_are_split_into_buffers_of_the_maximum_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, 2);
    let m = path.to_str().unwrap();
    let args = ["-m", m, "-p", "the theme", "-n", "6", "--temp", "0", "-c", "64", "--ubatch-size", "4"];
    let local = run(&args).0;
    // A worker whose largest buffer is 96 KiB: the ~150 KiB of weights need several buffers.
    let cfg = Config { threads: 1, mem: Some(64 << 20), ..Config::default() };
    let mut shared = Arc::try_unwrap(Shared::new(cfg)).ok().unwrap();
    shared.max_size = 96 << 10;
    let shared = Arc::new(shared);
    let w = Worker::with_shared(shared.clone());
    let mut remote_args = args.to_vec();
    remote_args.extend_from_slice(&["--workers", &w.addr]);
    let (remote, err) = run(&remote_args);
    assert_eq!(remote, local, "{err}");
    // Weight buffers (at least 2), the KV cache and the compute buffer.
    assert!(count(&shared, Cmd::AllocBuffer) >= 4, "{err}");

    // A context whose KV cache cannot fit one buffer is a clear error.
    let mut big = remote_args.clone();
    big[9] = "4096";
    let out = llamactl(&[&["run"][..], &big].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("above the worker's maximum buffer size"), "{err}");
}
