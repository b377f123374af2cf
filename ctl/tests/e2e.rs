//! The operator's scenario end to end, with the real binaries on loopback: two `llamad` workers
//! (tensor cache on, admin API on) and one `llamad` master (admin API); the workers registered with
//! `llamactl workers add` and labels; a job submitted with `llamactl run --server … --worker-label`
//! whose streamed text equals an independent in-process `llamactl run`; a second job by address
//! served from the workers' caches; `cache ls|rm|verify` on a worker (verify finds an object
//! corrupted on disk); `jobs ls` with its figures; `/metrics` of master and workers; Ctrl-C on
//! `run --server` cancelling its job; a worker that stops answering (SIGSTOP) and one killed in the
//! middle of a job each failing it with an error that names it; tokens never in any log.
//!
//! Needs SmolLM2 (`scripts/fetch-model.sh`, or `LLAMAD_MODEL`) and the `llamad` binary next to
//! `llamactl` (`cargo build -p llamad`; `cargo test --workspace` builds it) or at `$LLAMAD_BIN`.

mod support;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::smollm2;

/// Prompt and length of the generation compared across runs.
const PROMPT: &str = "The capital of France is";
const N_PREDICT: &str = "12";
/// Weights above this many bytes go through the workers' caches (SmolLM2's norms, 2304 bytes, do not).
const HASH_THRESHOLD: &str = "4096";
/// The master's `admin.job_io_timeout_secs`.
const JOB_IO_TIMEOUT_SECS: &str = "5";
/// Bound on waiting for a daemon to come up or a job to end (a hang guard, not a timing assertion).
const DEADLINE: Duration = Duration::from_secs(120);

fn llamad_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("LLAMAD_BIN") {
        return PathBuf::from(p);
    }
    let p = Path::new(env!("CARGO_BIN_EXE_llamactl")).with_file_name("llamad");
    assert!(
        p.is_file(),
        "{} not found: build it with `cargo build -p llamad` or set LLAMAD_BIN",
        p.display()
    );
    p
}

/// A port nothing holds, below the ephemeral range (see `e2e::server::free_port`): a `bind(0)` port
/// may become an outgoing connection's local port before the daemon binds it.
fn free_port() -> u16 {
    e2e::server::free_port().unwrap()
}

/// One `llamad` process; killed on drop. Its stderr (the log) goes to `log`.
struct Daemon {
    name: &'static str,
    child: Child,
    rpc: String,
    admin: String,
    token_file: PathBuf,
    cache_dir: PathBuf,
    log: PathBuf,
}

impl Daemon {
    fn start(name: &'static str, dir: &Path, cache: bool) -> Daemon {
        let root = dir.join(name);
        std::fs::create_dir_all(&root).unwrap();
        let config = root.join("llamad.toml");
        std::fs::write(&config, "").unwrap();
        let (rpc_port, admin_port) = (free_port(), free_port());
        let token_file = root.join("admin.token");
        let cache_dir = root.join("cache");
        let log = root.join("stderr.log");
        let mut cmd = Command::new(llamad_bin());
        cmd.args(["-H", "127.0.0.1", "-p", &rpc_port.to_string(), "-t", "1", "--mem", "1G"])
            .args(["--config", config.to_str().unwrap()])
            .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
            .args(["--admin-token-file", token_file.to_str().unwrap()])
            .env("STATE_DIRECTORY", root.join("state"))
            // Every request and connection logged, to check that the token never shows.
            .env("RUST_LOG", "llamad=debug")
            // A job's worker silent this long fails the job (the stopped-worker step below).
            .env("LLAMAD__ADMIN__JOB_IO_TIMEOUT_SECS", JOB_IO_TIMEOUT_SECS)
            .env_remove("JOURNAL_STREAM")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if cache {
            cmd.args(["-c", "--cache-dir", cache_dir.to_str().unwrap()]);
        }
        let child = cmd.spawn().unwrap();
        let d = Daemon {
            name,
            child,
            rpc: format!("127.0.0.1:{rpc_port}"),
            admin: format!("http://127.0.0.1:{admin_port}"),
            token_file,
            cache_dir,
            log,
        };
        d.wait_ready();
        d
    }

    fn wait_ready(&self) {
        let t0 = Instant::now();
        loop {
            let health = ureq::get(format!("{}/v1/health", self.admin)).call().is_ok();
            if health && TcpStream::connect(&self.rpc).is_ok() {
                return;
            }
            assert!(t0.elapsed() < DEADLINE, "{} did not come up:\n{}", self.name, self.log_text());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn token(&self) -> String {
        std::fs::read_to_string(&self.token_file).unwrap().trim().to_string()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `llamactl ARGS --server <this admin API> --token-file <its token>`.
    fn ctl(&self, args: &[&str]) -> Output {
        let mut full: Vec<&str> = args.to_vec();
        full.extend_from_slice(&["--server", &self.admin, "--token-file", self.token_file.to_str().unwrap()]);
        // Split mode layer, as every test that compares texts (support::llamactl_cmd).
        Command::new(env!("CARGO_BIN_EXE_llamactl"))
            .env("LLAMACTL_SPLIT_MODE", "layer")
            .args(&full)
            .output()
            .unwrap()
    }

    fn ctl_ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(
            out.status.success(),
            "llamactl {args:?} on {} failed ({:?}):\n{}",
            self.name,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn ctl_json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.ctl_ok(&a)).unwrap()
    }

    fn get(&self, path: &str) -> String {
        ureq::get(format!("{}{path}", self.admin))
            .header("Authorization", format!("Bearer {}", self.token()))
            .call()
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap()
    }

    fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics");
        metric(&text, name).unwrap_or_else(|| panic!("{} has no metric {name}:\n{text}", self.name))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of the sample `name` (with its labels) in Prometheus text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn llamactl(args: &[&str]) -> Output {
    support::llamactl_cmd().args(args).output().unwrap()
}

/// Every file under `dir`.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn job(master: &Daemon, id: &str) -> Value {
    serde_json::from_str(&master.get(&format!("/v1/jobs/{id}"))).unwrap()
}

#[test]
fn workers_jobs_cache_and_metrics_end_to_end() {
    let model = smollm2();
    let model = model.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let w1 = Daemon::start("worker1", dir.path(), true);
    let w2 = Daemon::start("worker2", dir.path(), true);
    let master = Daemon::start("master", dir.path(), false);

    // The counters start at zero.
    assert_eq!(master.metric("llamad_tokens_generated_total"), 0.0);
    assert_eq!(master.metric("llamad_jobs{state=\"done\"}"), 0.0);
    for w in [&w1, &w2] {
        assert_eq!(w.metric("llamad_cache_hits_total"), 0.0);
        assert_eq!(w.metric("llamad_rpc_graphs_computed_total"), 0.0);
    }

    // Register the workers, with labels.
    master.ctl_ok(&["workers", "add", &w1.rpc, "-l", "pool", "-l", "one"]);
    master.ctl_ok(&["workers", "add", &w2.rpc, "--label", "pool"]);
    let ls = master.ctl_json(&["workers", "ls"]);
    assert_eq!(ls["workers"].as_array().unwrap().len(), 2, "{ls}");
    let probe = master.ctl_json(&["workers", "probe", &w2.rpc]);
    assert_eq!(probe["health"]["ok"], true, "{probe}");

    // The reference: the same greedy generation in-process.
    let greedy = ["-m", model, "-p", PROMPT, "-n", N_PREDICT, "--temp", "0", "-c", "256", "--no-progress"];
    let local = llamactl(&[&["run"][..], &greedy].concat());
    assert!(local.status.success(), "{}", String::from_utf8_lossy(&local.stderr));
    let want = String::from_utf8(local.stdout).unwrap();
    assert!(want.trim().len() > 5, "{want:?}");

    // Job 1: on the workers labelled `pool`, submitted and streamed by `llamactl run --server`.
    let mut remote = vec!["run"];
    remote.extend_from_slice(&greedy);
    remote.extend_from_slice(&["--worker-label", "pool", "--hash-threshold", HASH_THRESHOLD]);
    let out = master.ctl(&remote);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8(out.stdout).unwrap(), want, "{err}");
    assert!(err.contains("submitted to") && err.contains(" done: "), "{err}");
    for w in [&w1, &w2] {
        assert!(err.contains(&format!("worker {}: layers ", w.rpc)), "{err}");
    }

    // Job 2: the same by address; the weights now come from the workers' caches. A label resolves
    // to its workers in address order, so listing them in that order gives each the same layers.
    let mut order = [w1.rpc.clone(), w2.rpc.clone()];
    order.sort();
    let addrs = order.join(",");
    let mut by_addr = vec!["run"];
    by_addr.extend_from_slice(&greedy);
    by_addr.extend_from_slice(&["--workers", &addrs, "--hash-threshold", HASH_THRESHOLD]);
    let out = master.ctl(&by_addr);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), want);

    // `jobs ls`: both done, with their figures.
    let jobs = master.ctl_json(&["jobs", "ls"]);
    let jobs = jobs["jobs"].as_array().unwrap().clone();
    assert_eq!(jobs.len(), 2);
    let mut generated = 0;
    for j in &jobs {
        assert_eq!(j["state"], "done", "{j}");
        let n = j["generated_tokens"].as_u64().unwrap();
        assert!(n > 0 && n <= N_PREDICT.parse().unwrap(), "{j}");
        generated += n;
        assert!(j["tokens_per_sec"].as_f64().unwrap() > 0.0, "{j}");
    }
    let table = master.ctl_ok(&["jobs", "ls"]);
    assert!(table.contains("TOK/S") && table.matches(" done ").count() == 2, "{table}");
    // The second job's weights came from the caches; the first's were sent.
    let second = job(&master, jobs[0]["id"].as_str().unwrap());
    let first = job(&master, jobs[1]["id"].as_str().unwrap());
    let sum = |j: &Value, k: &str| {
        j["workers"].as_array().unwrap().iter().map(|w| w[k].as_u64().unwrap()).sum::<u64>()
    };
    assert!(sum(&first, "bytes_sent") > 50 << 20, "{first}");
    assert!(sum(&second, "bytes_cached") > 50 << 20, "{second}");
    assert!(sum(&second, "bytes_sent") < 1 << 20, "only the small tensors are sent again: {second}");

    // The master's counters: jobs by state and tokens generated.
    assert_eq!(master.metric("llamad_jobs{state=\"done\"}"), 2.0);
    assert_eq!(master.metric("llamad_tokens_generated_total"), generated as f64);
    // The workers': RPC commands and bytes, cache hits.
    for w in [&w1, &w2] {
        assert!(w.metric("llamad_rpc_commands_total{command=\"GRAPH_COMPUTE\"}") >= 1.0, "{}", w.name);
        assert!(w.metric("llamad_rpc_commands_total{command=\"SET_TENSOR_HASH\"}") >= 2.0, "{}", w.name);
        assert!(
            w.metric("llamad_rpc_bytes_total{command=\"SET_TENSOR\",direction=\"in\"}") > 1e6,
            "{}",
            w.name
        );
        assert!(w.metric("llamad_cache_hits_total") >= 1.0, "{}", w.name);
        assert!(w.metric("llamad_cache_bytes_saved_total") > 1e6, "{}", w.name);
        // One graph per token decoded: the prompt and every generated token but the last, per job.
        assert!(w.metric("llamad_rpc_graphs_computed_total") >= generated as f64, "{}", w.name);
    }

    // `cache ls` on a worker: the cached tensors, their sizes and hits.
    let ls = w1.ctl_json(&["cache", "ls", "--limit", "1000"]);
    let items = ls["items"].as_array().unwrap().clone();
    assert!(items.len() > 10, "{ls}");
    assert_eq!(ls["total"].as_u64(), Some(items.len() as u64), "{ls}");
    for o in &items {
        assert!(o["size"].as_u64().unwrap() > HASH_THRESHOLD.parse().unwrap(), "{o}");
        assert!(o["hits"].as_u64().unwrap() >= 1, "hit by job 2: {o}");
    }
    let table = w1.ctl_ok(&["cache", "ls"]);
    assert!(table.contains("KiB") || table.contains("MiB"), "sizes in human units: {table}");

    // `cache verify`: all good, then a byte flipped on disk is found.
    assert!(w1.ctl_ok(&["cache", "verify"]).contains(", 0 corrupt"));
    let victim = items[0]["digest"].as_str().unwrap().to_string();
    let path = files(&w1.cache_dir)
        .into_iter()
        .find(|p| p.file_name().is_some_and(|n| n == victim.as_str()))
        .expect("the object file");
    let mut perm = std::fs::metadata(&path).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perm.set_readonly(false);
    std::fs::set_permissions(&path, perm).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let out = w1.ctl(&["cache", "verify"]);
    assert_eq!(out.status.code(), Some(1), "corruption is a negative answer");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("corrupt {victim}")));

    // The corrupt object was dropped: the cache lists one fewer and verifies clean again.
    let after = w1.ctl_json(&["cache", "ls", "--limit", "1000"]);
    assert_eq!(after["items"].as_array().unwrap().len(), items.len() - 1);
    assert!(!after.to_string().contains(&victim));
    assert!(w1.ctl_ok(&["cache", "verify"]).contains(", 0 corrupt"));

    // `cache rm` of a healthy object: gone from the list; `cache stat` of it is then an error (exit 1).
    let gone = items[1]["digest"].as_str().unwrap().to_string();
    assert!(w1.ctl_ok(&["cache", "stat", &gone]).contains(&gone));
    w1.ctl_ok(&["cache", "rm", &gone]);
    let after = w1.ctl_json(&["cache", "ls", "--limit", "1000"]);
    assert_eq!(after["items"].as_array().unwrap().len(), items.len() - 2);
    assert!(!after.to_string().contains(&gone));
    assert_eq!(w1.ctl(&["cache", "stat", &gone]).status.code(), Some(1));
    assert_eq!(w1.ctl(&["cache", "frobnicate"]).status.code(), Some(2), "usage errors exit 2");

    // Ctrl-C on `run --server` cancels the job: it stops after its current token, and llamactl exits 1.
    let counting = "1, 2, 3, 4, 5, 6, 7, 8,";
    let mut child = Command::new(env!("CARGO_BIN_EXE_llamactl"))
        .env("LLAMACTL_SPLIT_MODE", "layer")
        .args(["run", "--server", &master.admin, "--token-file", master.token_file.to_str().unwrap()])
        .args(["-m", model, "-p", counting, "-n", "200", "--temp", "0", "-c", "256", "--workers", &addrs])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 1];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    let sigint = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(sigint.success());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cancelling job") && err.contains(" cancelled"), "{err}");
    let newest = master.ctl_json(&["jobs", "ls"])["jobs"][0].clone();
    assert_eq!(newest["state"], "cancelled", "{newest}");
    let n = newest["generated_tokens"].as_u64().unwrap();
    assert!((1..200).contains(&n), "{newest}");
    assert_eq!(master.metric("llamad_jobs{state=\"cancelled\"}"), 1.0);

    // A worker that stops answering but keeps its connection open (its process stopped, as a host
    // that vanished) fails the job after the master's job I/O timeout, naming it.
    let wait_tokens = |id: &str| {
        let t0 = Instant::now();
        while job(&master, id)["generated_tokens"].as_u64().unwrap() < 2 {
            assert!(t0.elapsed() < DEADLINE, "job {id} made no progress: {}", job(&master, id));
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let wait_end = |id: &str| {
        let t0 = Instant::now();
        loop {
            let j = job(&master, id);
            if !["queued", "running"].contains(&j["state"].as_str().unwrap()) {
                break j;
            }
            assert!(t0.elapsed() < DEADLINE, "job {id} hangs on a dead worker: {j}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let submit =
        ["jobs", "submit", "-m", model, "-p", counting, "-n", "200", "--temp", "0", "--workers", &addrs];
    let id = master.ctl_ok(&submit).trim().to_string();
    wait_tokens(&id);
    let pid = w1.child.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let end = wait_end(&id);
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    assert_eq!(end["state"], "failed", "{end}");
    assert_eq!(end["error"]["code"], "worker-failed", "{end}");
    let msg = end["error"]["message"].as_str().unwrap();
    assert!(msg.contains(&format!("worker {}", w1.rpc)), "{msg}");
    assert!(msg.contains(&format!("did not answer within {JOB_IO_TIMEOUT_SECS} s")), "{msg}");

    // A worker killed while a job runs fails the job with an error naming it (no hang).
    let id = master.ctl_ok(&submit).trim().to_string();
    wait_tokens(&id);
    let mut w2 = w2;
    w2.child.kill().unwrap();
    w2.child.wait().unwrap();
    let end = wait_end(&id);
    assert_eq!(end["state"], "failed", "{end}");
    assert_eq!(end["error"]["code"], "worker-failed", "{end}");
    let msg = end["error"]["message"].as_str().unwrap();
    assert!(msg.contains(&format!("worker {}", w2.rpc)), "{msg}");
    let shown = master.ctl(&["jobs", "show", &id]);
    assert_eq!(shown.status.code(), Some(1), "a failed job is a negative answer");
    assert_eq!(master.metric("llamad_jobs{state=\"failed\"}"), 2.0);

    // No daemon logged any admin token, though each logged its requests (debug level).
    let tokens = [w1.token(), w2.token(), master.token()];
    for d in [&w1, &w2, &master] {
        let log = d.log_text();
        assert!(log.contains("admin request"), "{} logs requests", d.name);
        for t in &tokens {
            assert!(!log.contains(t.as_str()) && !log.contains(&t[..16]), "{} logged a token", d.name);
        }
    }
}
