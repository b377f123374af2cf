//! What the master puts on the wire, counted by an in-process llamad: GRAPH_RECOMPUTE for repeated
//! decode steps (ref: ggml-rpc-protocol.md §8.4, §15 item 33), and the SET_TENSOR_HASH path for
//! weights above the threshold with a cache hit on the second load (§9, §15 item 32): pipelined
//! answers matched to their writes through mixed hits and misses, and the hash memo.

mod support;

use std::sync::Arc;

use llamad::rpc::cache::MemoryCache;
use llamad::{Config, Shared};
use llamad_proto::Cmd;
use support::{llamactl, llamactl_cmd, write_tiny_model, Worker};

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
    // 2 layers × 9 weights + output norm + output head; the embedding table stays here. Each layer's
    // weights are neighbours in one buffer and small, so they go as one write, as do the output norm
    // and head: 3 writes.
    let n_weights = 2 * 9 + 2;
    let n_writes = 3;
    assert_eq!(count(&shared, Cmd::SetTensorHash), n_writes, "{err1}");
    assert!(
        err1.contains(&format!("{n_weights} tensors in {n_writes} writes"))
            && err1.contains("0.00 MiB from the worker's cache"),
        "{err1}"
    );
    assert_eq!(cache.len() as u64, n_writes, "every miss was resent with cache_flag = 1");
    // Prompt: GRAPH_COMPUTE; first decode step (new shape): GRAPH_COMPUTE; then 6 recomputes
    // (8 tokens sampled, 7 decode steps).
    assert_eq!(count(&shared, Cmd::GraphCompute), 2, "{err1}");
    assert_eq!(count(&shared, Cmd::GraphRecompute), 6, "{err1}");
    let sets_before = count(&shared, Cmd::SetTensor);

    let (second, err2) = run(&args);
    assert_eq!(second, first, "same greedy output from cached weights");
    assert!(err2.contains("0.00 MiB sent"), "every weight is a cache hit: {err2}");
    assert_eq!(count(&shared, Cmd::SetTensorHash), 2 * n_writes);
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

/// More writes than the SET_TENSOR_HASH window, a worker cache holding some of them (and garbage
/// under the key of others): every answer must be matched to its own write, so each weight reads
/// back byte for byte from the worker, and the byte counts add up to the entries that were good.
#[test]
fn pipelined_hash_answers_match_their_writes_through_hits_and_misses() {
    use compute::gguf::Gguf;
    use compute::model::{Model, SessionConfig};
    use llamactl::master::hash_memo::{FileIdentity, HashMemo, MemoOptions};
    use llamactl::master::pipeline::{Pipeline, SplitOptions};
    use llamactl::master::upload::WINDOW;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let n_layer = WINDOW + 6;
    write_tiny_model(&path, n_layer);
    let cache = Arc::new(MemoryCache::default());
    let cfg = Config { threads: 1, mem: Some(256 << 20), ..Config::default() };
    let shared = Shared::with_cache(cfg, Some(cache.clone()));
    let w = Worker::with_shared(shared.clone());
    let identity = FileIdentity::of(&path).unwrap();
    // SAFETY: the test never writes the file while it is mapped.
    let gguf = Arc::new(unsafe { Gguf::open(&path) }.unwrap());
    let model = Model::new(gguf.clone()).unwrap();
    let scfg = SessionConfig {
        n_ctx: 64,
        n_ubatch: 8,
        flash_attn: false,
        kv_type: compute::GgmlType::F16,
        n_threads: 1,
        ..SessionConfig::default()
    };
    let memo = HashMemo::open_with(
        &dir.path().join("memo"),
        &path,
        identity,
        gguf.clone(),
        MemoOptions { racy: std::time::Duration::ZERO },
    )
    .map(Arc::new);
    assert!(memo.is_some());
    let opts = SplitOptions { hash_threshold: 0, hash_memo: memo.clone(), ..SplitOptions::default() };
    let addrs = [w.addr.clone()];
    let load = || {
        let stats = std::sync::Mutex::new(None);
        let p = Pipeline::new(&model, scfg.clone(), &addrs, &opts, &|_, ev| {
            if let llamactl::master::pipeline::LoadEvent::Done(s) = ev {
                *stats.lock().unwrap() = Some(s);
            }
        })
        .unwrap();
        let s = stats.lock().unwrap().unwrap();
        (p, s)
    };
    let check = |p: &mut Pipeline| {
        let names: Vec<String> = gguf.tensors().iter().map(|t| t.name.clone()).collect();
        let mut seen = 0;
        for name in names {
            let want = model.src.tensor(&name).unwrap().data;
            if let Some(got) = p.workers_mut()[0].read_weight(&name, want.len() as u64).unwrap() {
                assert!(got == want, "{name} differs on the worker");
                seen += 1;
            }
        }
        seen
    };

    // First load: all misses; every write lands in the cache (the hashes are computed and memoized).
    let (mut p, s1) = load();
    assert_eq!((s1.bytes_cached, s1.hashed), (0, s1.writes));
    assert!(s1.writes > WINDOW as u64, "{s1:?}");
    assert_eq!(cache.len() as u64, s1.writes);
    let n_weights = check(&mut p);
    assert_eq!(n_weights as u64, s1.tensors);
    drop(p);
    assert_eq!(memo.as_ref().unwrap().counts().2, s1.writes, "every hash memoized");

    // Drop every third entry and overwrite every third other with garbage of the same length.
    let mut keys = cache.keys();
    keys.sort();
    let mut good = 0;
    for (i, (h, len)) in keys.iter().enumerate() {
        match i % 3 {
            0 => assert!(cache.remove(*h, *len)),
            1 => cache.insert_raw(*h, vec![0x5a; *len as usize]),
            _ => good += len,
        }
    }
    assert!(good > 0);
    let (mut p, s2) = load();
    assert_eq!(s2.bytes_cached, good, "{s2:?}");
    assert_eq!(s2.bytes_cached + s2.bytes_sent, s1.bytes_sent);
    assert_eq!(memo.as_ref().unwrap().counts().1, s1.writes, "the second load took every hash from the memo");
    assert_eq!(check(&mut p), n_weights);
    drop(p);
    // The misses were stored again: a third load is all hits.
    let (mut p, s3) = load();
    assert_eq!(s3.bytes_cached, s1.bytes_sent);
    assert_eq!(check(&mut p), n_weights);
}

/// `llamactl run` keeps a memo of the model's write hashes under `$XDG_CACHE_HOME/llamad/hash-memo`
/// and uses it on the next load of the same file; `--no-hash-memo` neither reads nor writes it.
#[test]
fn llamactl_keeps_a_hash_memo_per_model_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, 2);
    // A file changed within 2 s is not trusted (its timestamps could hide a change in the same tick).
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let cache = Arc::new(MemoryCache::default());
    let cfg = Config { threads: 1, mem: Some(256 << 20), ..Config::default() };
    let w = Worker::with_shared(Shared::with_cache(cfg, Some(cache.clone())));
    let home = dir.path().join("cache-home");
    let run = |extra: &[&str]| {
        let out = llamactl_cmd()
            .env("XDG_CACHE_HOME", &home)
            .env("LLAMACTL_LOG", "llamactl=debug")
            .args(["run", "-m", path.to_str().unwrap(), "-p", "the theme", "-n", "4", "--temp", "0"])
            .args(["-c", "64", "--workers", &w.addr, "--hash-threshold", "0"])
            .args(extra)
            .output()
            .unwrap();
        let err = strip_ansi(&String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{err}");
        (out.stdout, err)
    };
    let memo_dir = home.join("llamad").join("hash-memo");
    let (a, err) = run(&["--no-hash-memo"]);
    assert!(!memo_dir.exists(), "--no-hash-memo wrote a memo: {err}");
    let (b, err) = run(&[]);
    assert!(err.contains("hits=0 added=3"), "{err}");
    assert_eq!(std::fs::read_dir(&memo_dir).unwrap().count(), 1);
    let (c, err) = run(&[]);
    assert!(err.contains("loaded=3 hits=3 added=0"), "the second load did not use the memo: {err}");
    assert!(a == b && b == c);
}

/// `s` without ANSI colour sequences (the log lines are coloured).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            out.push(c);
        }
    }
    out
}

/// Two in-process workers announcing `proto`.
fn workers(proto: &'static llamad_proto::Protocol) -> [(Worker, Arc<Shared>); 2] {
    std::array::from_fn(|_| {
        let cfg = Config { threads: 1, mem: Some(512 << 20), protocol: proto, ..Config::default() };
        let shared = Shared::new(cfg);
        (Worker::with_shared(shared.clone()), shared)
    })
}

/// llamactl speaks 8.0.0 and 7.0.0, picked by each worker's HELLO answer: over one and two workers
/// of either version (and one of each), in split mode layer and row (relayed through the master, and
/// linked), the greedy text is the in-process text. At 8.0.0 every graph goes with a uid and a
/// repeated graph is replayed by uid from the worker's graph store (counted in its stats); at 7.0.0
/// no uid is sent and the store stays empty.
#[test]
fn llamactl_speaks_both_versions_in_layer_and_row_split() {
    use llamad_proto::version::{V7, V8};
    use std::sync::atomic::Ordering::Relaxed;
    let model = support::smollm2();
    let m = model.to_str().unwrap();
    let base = ["-m", m, "-p", "Hello world, this is", "-n", "12", "--temp", "0", "-t", "1", "-c", "256"];
    let text = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        support::run_text(&a)
    };
    let local = text(&[]);
    assert!(local.split_whitespace().count() > 4, "{local:?}");
    let [(a8, s8a), (b8, s8b)] = workers(&V8);
    let [(a7, s7a), (b7, s7b)] = workers(&V7);
    let runs: [(&str, String, &[&str]); 9] = [
        ("8.0.0, one worker", a8.addr.clone(), &[]),
        ("8.0.0, row split on one worker", a8.addr.clone(), &["--split-mode", "row"]),
        ("8.0.0, two workers", format!("{},{}", a8.addr, b8.addr), &[]),
        ("8.0.0, row split linked", format!("{},{}", a8.addr, b8.addr), &["--split-mode", "row"]),
        (
            "8.0.0, row split relayed",
            format!("{},{}", a8.addr, b8.addr),
            &["--split-mode", "row", "--no-worker-links"],
        ),
        ("7.0.0, one worker", a7.addr.clone(), &[]),
        ("7.0.0, two workers", format!("{},{}", a7.addr, b7.addr), &[]),
        (
            "7.0.0, row split relayed",
            format!("{},{}", a7.addr, b7.addr),
            &["--split-mode", "row", "--no-worker-links"],
        ),
        ("one 8.0.0 and one 7.0.0 worker", format!("{},{}", a8.addr, b7.addr), &[]),
    ];
    for (name, workers, extra) in runs {
        let mut a = vec!["--workers", workers.as_str()];
        a.extend_from_slice(extra);
        let got = text(&a);
        if extra.is_empty() || !workers.contains(',') {
            // Layer split, and row split on one worker, give the in-process logits bit for bit.
            assert_eq!(got, local, "{name}");
        } else {
            // Row split adds partial sums in another order: the text may drift, but it is the same
            // whichever version carries it (checked below) and it starts like the local text.
            let first: Vec<&str> = local.split_whitespace().take(3).collect();
            assert!(got.split_whitespace().take(3).eq(first.iter().copied()), "{name}: {got:?} vs {local:?}");
        }
    }
    let row8 =
        text(&["--workers", &format!("{},{}", a8.addr, b8.addr), "--split-mode", "row", "--no-worker-links"]);
    let row7 =
        text(&["--workers", &format!("{},{}", a7.addr, b7.addr), "--split-mode", "row", "--no-worker-links"]);
    assert_eq!(row8, row7, "the same bits over either version");
    for s in [&s8a, &s8b] {
        let hits = s.stats.graph_store_hits.load(Relaxed);
        assert!(hits > 0, "8.0.0 worker replayed nothing from its graph store");
        assert_eq!(hits, count(s, Cmd::GraphRecompute), "every 8.0.0 RECOMPUTE is by uid and found");
        assert!(s.stats.graph_store_inserts.load(Relaxed) > 0);
    }
    for s in [&s7a, &s7b] {
        assert!(count(s, Cmd::GraphRecompute) > 0, "7.0.0 workers replay their last graph");
        assert_eq!(s.stats.graph_store_inserts.load(Relaxed), 0);
        assert_eq!(s.stats.graph_store_hits.load(Relaxed), 0);
    }
}

/// At 8.0.0 the worker keeps every graph by uid, so a benchmark's later repetitions (new KV extents
/// from 0 again, the same graphs as the first) replay them all by uid: `-r 3` sends no more
/// GRAPH_COMPUTE than `-r 1`. At 7.0.0 only the last graph is kept and each repetition resends.
#[test]
fn later_bench_repetitions_replay_every_graph_from_the_store() {
    use llamad_proto::version::{V7, V8};
    let model = support::smollm2();
    let m = model.to_str().unwrap();
    for proto in [&V8, &V7] {
        let cfg = Config { threads: 1, mem: Some(512 << 20), protocol: proto, ..Config::default() };
        let shared = Shared::new(cfg);
        let w = Worker::with_shared(shared.clone());
        let bench = |r: &str| {
            let out = llamactl(&[
                "bench",
                "-m",
                m,
                "-p",
                "0",
                "-n",
                "70",
                "-r",
                r,
                "-t",
                "1",
                // 64-cell extents: 70 steps from an empty cache build two graphs (at 256, one).
                "--kv-pad",
                "64",
                "--workers",
                &w.addr,
            ]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            count(&shared, Cmd::GraphCompute)
        };
        let one = bench("1");
        let three = bench("3") - one;
        assert!(one >= 2, "{proto}: {one}");
        if proto.graph_store > 0 {
            assert_eq!(three, one, "{proto}: repetitions 2 and 3 sent graphs again");
            let hits = shared.stats.graph_store_hits.load(std::sync::atomic::Ordering::Relaxed);
            assert_eq!(hits, count(&shared, Cmd::GraphRecompute));
        } else {
            assert!(three > one, "{proto}: {three} vs {one}");
        }
    }
}
