//! Faults against the real `llamad` binary on loopback (issue 9): a master that disconnects in the
//! middle of an upload, or after allocating without freeing, leaves no memory held; a restart keeps
//! the tensor cache and the job history (a finished job with its result, a running one shown
//! `interrupted`); `kill -9` in the middle of cache writes leaves a cache whose every object
//! verifies, with no temp file listed or left behind.
//!
//! The cache's own crash tests (a writer killed at random points, `cachestore/tests/`) cover the
//! store; these cover the daemon around it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use llamad_proto::msg::{Command, SetTensorHeader};
use llamad_proto::WireHash;
use serde_json::{json, Value};

use crate::common::*;
use crate::process::{free_port, Daemon};

const MIB: u64 = 1 << 20;

/// The admin API of a daemon started with `--admin-listen`.
struct Admin {
    base: String,
    token: String,
}

impl Admin {
    fn new(port: u16, token_file: &Path) -> Admin {
        let token = std::fs::read_to_string(token_file).unwrap().trim().to_string();
        Admin { base: format!("http://127.0.0.1:{port}"), token }
    }

    fn get(&self, path: &str) -> Value {
        ureq::get(format!("{}{path}", self.base))
            .header("Authorization", format!("Bearer {}", self.token))
            .call()
            .unwrap()
            .body_mut()
            .read_json()
            .unwrap()
    }

    fn post(&self, path: &str, body: Value) -> Value {
        ureq::post(format!("{}{path}", self.base))
            .header("Authorization", format!("Bearer {}", self.token))
            .send_json(body)
            .unwrap()
            .body_mut()
            .read_json()
            .unwrap()
    }

    /// Waits until `GET path` satisfies `done` (up to `secs`).
    fn wait(&self, path: &str, secs: u64, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.get(path);
            if done(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "timed out waiting on {path}: {v}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A daemon with the cache and the admin API, all state under `dir`.
struct Stateful {
    dir: PathBuf,
    rpc_port: u16,
    admin_port: u16,
}

impl Stateful {
    fn new(dir: &Path) -> Stateful {
        let s = Stateful { dir: dir.to_path_buf(), rpc_port: free_port(), admin_port: free_port() };
        std::fs::create_dir_all(s.dir.join("state")).unwrap();
        std::fs::write(
            s.dir.join("llamad.toml"),
            format!("[admin]\nstate_dir = {:?}\nprobe_interval_secs = 0\n", s.dir.join("state")),
        )
        .unwrap();
        s
    }

    fn start(&self) -> (Daemon, Admin) {
        let cfg = self.dir.join("llamad.toml");
        let cache = self.dir.join("cache");
        let token = self.dir.join("admin.token");
        let admin = format!("127.0.0.1:{}", self.admin_port);
        let d = Daemon::spawn_on(
            self.rpc_port,
            &[
                "-t",
                "2",
                "-c",
                "--mem",
                "512M",
                "--config",
                cfg.to_str().unwrap(),
                "--cache-dir",
                cache.to_str().unwrap(),
                "--admin-listen",
                &admin,
                "--admin-token-file",
                token.to_str().unwrap(),
            ],
            &self.dir.join("llamad.log"),
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while !token.exists() || std::net::TcpStream::connect(&admin).is_err() {
            assert!(Instant::now() < deadline, "admin API did not come up:\n{}", d.log_text());
            std::thread::sleep(Duration::from_millis(50));
        }
        (d, Admin::new(self.admin_port, &token))
    }
}

/// Deterministic, distinct data for tensor `k`.
fn tensor_data(k: u64, len: usize) -> Vec<u8> {
    let mut x = k.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The files under the cache's temp directory (`llamad-v1/tmp`), recursively.
fn temp_files(cache: &Path) -> Vec<PathBuf> {
    fn walk(p: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(p) else { return };
        for e in rd.flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&cache.join("llamad-v1").join("tmp"), &mut out);
    out
}

/// Every object of the cache listed by the admin API, verified by the daemon: (count, digests).
fn listed_and_verified(admin: &Admin) -> Vec<String> {
    let list = admin.get("/v1/cache?limit=100000");
    let items: Vec<String> =
        list["items"].as_array().unwrap().iter().map(|o| o["digest"].as_str().unwrap().to_string()).collect();
    assert_eq!(list["total"].as_u64().unwrap(), items.len() as u64);
    for d in &items {
        assert!(d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()), "listed a non-object: {d}");
    }
    let report = admin.post("/v1/cache/verify", json!({}));
    assert_eq!(report["checked"].as_u64().unwrap(), items.len() as u64, "{report}");
    assert_eq!(report["corrupt"].as_array().unwrap().len(), 0, "{report}");
    items
}

#[test]
fn a_master_leaving_mid_upload_leaves_no_memory_held() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 256 * MIB;
    let d = Daemon::spawn_on(
        free_port(),
        &["-t", "1", "--mem", &budget.to_string(), "--admin-listen", "off"],
        &dir.path().join("llamad.log"),
    );
    let mut by = d.client();
    assert_eq!(by.get_device_memory(0).unwrap().free, budget);

    // Half of an 8 MiB SET_TENSOR's data, then the master goes away.
    let mut c = d.client();
    let (buf, base) = buffer(&mut c, 8 * MIB);
    let t = llamad_proto::RpcTensor { ne: [2 * MIB as u32, 1, 1, 1], ..f32_tensor(1, buf, base, 4) };
    let frame =
        Command::SetTensor(SetTensorHeader { tensor: t, cache_flag: 0, offset: 0 }, &[]).encode_frame();
    let mut head = frame.clone();
    head[1..9].copy_from_slice(&(305 + 8 * MIB).to_le_bytes());
    c.stream().write_all(&head).unwrap();
    c.stream().write_all(&vec![7u8; 4 * MIB as usize]).unwrap();
    assert!(by.get_device_memory(0).unwrap().free <= budget - 8 * MIB);
    drop(c);
    assert_eq!(d.wait_all_free().free, budget, "the half-uploaded buffer is still held");

    // Half of the 305-byte SET_TENSOR header.
    let mut c = d.client();
    let _ = buffer(&mut c, 4 * MIB);
    c.stream().write_all(&frame[..9 + 150]).unwrap();
    drop(c);
    assert_eq!(d.wait_all_free().free, budget, "a buffer is held after a cut header");

    // ALLOC_BUFFER (several, one of them written) and no FREE_BUFFER before leaving.
    let mut c = d.client();
    for k in 1..=5 {
        let (buf, base) = buffer(&mut c, k * 3 * MIB);
        c.set_tensor(&f32_tensor(1, buf, base, 4), 0, &[1; 16], false).unwrap();
    }
    assert_eq!(c.get_device_memory(0).unwrap().free, budget - 45 * MIB);
    drop(c);
    assert_eq!(d.wait_all_free().free, budget, "buffers allocated and never freed are still held");

    // The bystander was never disturbed, and the daemon logged each end.
    assert_eq!(by.device_count().unwrap(), 1);
    let log = d.log_text();
    assert!(log.contains("connection ended inside 8388608 bytes of tensor data"), "{log}");
    assert!(log.matches("buffers_freed=5").count() == 1, "{log}");
}

/// The SmolLM2 model: `$LLAMAD_MODEL`, else the repository's `models/` (scripts/fetch-model.sh).
fn model_path() -> PathBuf {
    let p = match std::env::var_os("LLAMAD_MODEL").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    assert!(p.exists(), "{} is missing: run scripts/fetch-model.sh (or set LLAMAD_MODEL)", p.display());
    p
}

#[test]
fn a_restart_keeps_the_cache_and_the_job_history() {
    let model = model_path();
    let dir = tempfile::tempdir().unwrap();
    let st = Stateful::new(dir.path());
    let (mut d, admin) = st.start();

    // Three tensors stored through the cache flag.
    let mut c = d.client();
    let (buf, base) = buffer(&mut c, 3 * 64 * 1024);
    let mut tensors = Vec::new();
    for k in 0..3u64 {
        let t = f32_tensor(k + 1, buf, base + k * 65536, 16384);
        let data = tensor_data(k, 65536);
        c.set_tensor(&t, 0, &data, true).unwrap();
        tensors.push((t, WireHash::of(&data)));
    }
    assert_eq!(c.device_count().unwrap(), 1);
    drop(c);
    admin.wait("/v1/cache/totals", 20, |v| v["count"] == 3);
    let before = listed_and_verified(&admin);

    // One job finished, one running when the daemon goes down.
    // A counting prompt: greedy decoding keeps counting, so the long job is still running (not
    // ended by an end-of-generation token) when the daemon is killed.
    let job = |n: u32| {
        json!({ "model": model, "prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "n_predict": n,
                "sampling": { "temp": 0.0 } })
    };
    let done_id = admin.post("/v1/jobs", job(6))["id"].as_str().unwrap().to_string();
    let done = admin.wait(&format!("/v1/jobs/{done_id}"), 300, |v| v["state"] == "done");
    assert_eq!(done["generated_tokens"], 6);
    let output = done["output"].as_str().unwrap().to_string();
    assert!(!output.is_empty());
    let run_id = admin.post("/v1/jobs", job(4000))["id"].as_str().unwrap().to_string();
    admin.wait(&format!("/v1/jobs/{run_id}"), 300, |v| {
        v["state"] == "running" && v["generated_tokens"].as_u64().unwrap_or(0) > 0
    });

    d.kill9();
    let (d, admin) = st.start();

    let after = listed_and_verified(&admin);
    assert_eq!(sorted(before), sorted(after));
    // And the daemon serves them: SET_TENSOR_HASH hits and loads the bytes.
    let mut c = d.client();
    let (buf, base) = buffer(&mut c, 3 * 64 * 1024);
    for (k, (t, hash)) in tensors.iter().enumerate() {
        let t = llamad_proto::RpcTensor { buffer: buf, data: base + k as u64 * 65536, ..*t };
        assert!(c.set_tensor_hash(&t, 0, *hash).unwrap(), "cache miss after restart");
        assert!(c.get_tensor(&t, 0, 65536).unwrap() == tensor_data(k as u64, 65536));
    }

    let v = admin.get(&format!("/v1/jobs/{done_id}"));
    assert_eq!((v["state"].as_str(), v["output"].as_str()), (Some("done"), Some(output.as_str())));
    let v = admin.get(&format!("/v1/jobs/{run_id}"));
    assert_eq!(v["state"], "interrupted", "{v}");
    let list = admin.get("/v1/jobs");
    let ids: Vec<&str> = list["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_str().unwrap()).collect();
    assert!(ids.contains(&done_id.as_str()) && ids.contains(&run_id.as_str()), "{list}");
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[test]
fn kill_9_during_cache_writes_leaves_a_consistent_cache() {
    let dir = tempfile::tempdir().unwrap();
    let st = Stateful::new(dir.path());
    let cache = dir.path().join("cache");
    for round in 0..3u64 {
        let (mut d, admin) = st.start();
        let start_count = admin.get("/v1/cache/totals")["count"].as_u64().unwrap();
        // A master uploading distinct 1 MiB tensors with the cache flag, as fast as it can.
        let addr = d.addr;
        let uploader = std::thread::spawn(move || {
            let mut c = llamad_proto::RpcClient::connect(addr).unwrap();
            let Ok(a) = c.alloc_buffer(0, 64 * MIB) else { return 0 };
            let Ok(base) = c.buffer_get_base(a.remote_ptr) else { return 0 };
            let mut sent = 0u64;
            for k in 0..64u64 {
                let t = f32_tensor(k + 1, a.remote_ptr, base + k * MIB, (MIB / 4) as u32);
                if c.set_tensor(&t, 0, &tensor_data(round * 1000 + k, MIB as usize), true).is_err() {
                    break;
                }
                sent += 1;
            }
            sent
        });
        // Kill once writes are under way (the first objects have landed).
        admin.wait("/v1/cache/totals", 60, |v| v["count"].as_u64().unwrap_or(0) >= start_count + 2);
        d.kill9();
        let sent = uploader.join().unwrap();
        drop(admin);

        let (d, admin) = st.start();
        let objects = listed_and_verified(&admin);
        assert!(!objects.is_empty());
        assert!(temp_files(&cache).is_empty(), "temp files left: {:?}", temp_files(&cache));
        eprintln!(
            "round {round}: {sent} uploads sent before kill -9, {} objects after restart",
            objects.len()
        );
        drop(d);
    }
}
