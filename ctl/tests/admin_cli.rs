//! The admin nouns of `llamactl` against a real llamad admin API served in-process on 127.0.0.1:0
//! (TCP, bearer token), with a real cache store, an in-process RPC worker and a tiny model: tables and
//! JSON, follow mode, and the exit outcomes (negative answers, errors, usage).

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Parser;
use llamactl::cli_admin::{execute, AdminCli, Outcome};
use serde_json::Value;

/// An admin API served on its own runtime thread; stopped on drop.
struct Daemon {
    url: String,
    token_file: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Daemon {
    fn start(state_dir: &Path, cache: Option<Arc<cachestore::Store>>) -> Daemon {
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let dir = state_dir.to_path_buf();
        let thread = std::thread::spawn(move || {
            let rt =
                tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
            rt.block_on(async move {
                let shared = llamad::Shared::new(llamad::Config {
                    threads: 1,
                    mem: Some(32 << 20),
                    ..llamad::Config::default()
                });
                let cfg = llamad::admin::AdminConfig {
                    probe_interval: std::time::Duration::ZERO,
                    ..llamad::admin::AdminConfig::with_state_dir(&dir)
                };
                let state = llamad::admin::AdminState::new(cfg, shared, None, cache).unwrap();
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(l.local_addr().unwrap()).unwrap();
                llamad::admin::serve(l, state, async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
            });
        });
        let addr = rx.recv().unwrap();
        Daemon {
            url: format!("http://{addr}"),
            token_file: state_dir.join("admin.token"),
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Runs `llamactl <args>` against this daemon: the outcome (or error) and stdout.
    fn run(&self, args: &[&str]) -> (anyhow::Result<Outcome>, String) {
        let mut argv = vec!["llamactl"];
        argv.extend_from_slice(args);
        argv.extend_from_slice(&["--server", &self.url, "--token-file", self.token_file.to_str().unwrap()]);
        let cli = AdminCli::try_parse_from(&argv).unwrap();
        let mut out = Vec::new();
        let r = execute(&cli.command, &mut out);
        (r, String::from_utf8(out).unwrap())
    }

    fn ok(&self, args: &[&str]) -> String {
        let (r, out) = self.run(args);
        assert_eq!(r.unwrap(), Outcome::Success, "llamactl {args:?}: {out}");
        out
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.ok(&a)).unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn status_and_workers() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), None);
    let out = d.ok(&["status"]);
    assert!(out.contains("protocol") && out.contains("8.0.0"), "{out}");
    assert!(out.contains("32.0 MiB"), "memory in human units: {out}");
    let v = d.json(&["status"]);
    assert_eq!(v["memory"]["total"], 32u64 << 20);

    let w = support::Worker::start(8 << 20);
    d.ok(&["workers", "add", &w.addr, "-l", "rack-a"]);
    let (r, out) = d.run(&["workers", "probe", &w.addr]);
    assert_eq!(r.unwrap(), Outcome::Success, "{out}");
    assert!(out.contains(" ok ") && out.contains("8.0 MiB/8.0 MiB") && out.contains("8.0.0"), "{out}");
    let v = d.json(&["workers", "ls"]);
    assert_eq!(v["workers"][0]["labels"][0], "rack-a");
    assert_eq!(v["workers"][0]["health"]["devices"][0]["total"], 8u64 << 20);
    let out = d.ok(&["workers", "ls"]);
    assert!(out.starts_with("ADDRESS"), "{out}");
    assert!(out.contains("rack-a"), "{out}");
    // A dead worker is a negative answer (exit 1), not an error.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    d.ok(&["workers", "add", &dead]);
    let (r, out) = d.run(&["workers", "probe", &dead]);
    assert_eq!(r.unwrap(), Outcome::Negative, "{out}");
    assert!(out.contains("down"), "{out}");
    d.ok(&["workers", "rm", &dead]);
    let (r, _) = d.run(&["workers", "rm", &dead]);
    let e = format!("{:#}", r.unwrap_err());
    assert!(e.contains("worker-not-found"), "{e}");
}

#[test]
fn cache_verbs() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(cachestore::Store::open(&dir.path().join("cache"), Default::default()).unwrap());
    let a = store.put(&vec![7u8; 3 << 20], None, Some("blk.1.ffn_down.weight")).unwrap();
    let b = store.put(&[1u8; 1536], None, Some("output_norm.weight")).unwrap();
    let d = Daemon::start(&dir.path().join("state"), Some(store.clone()));

    let out = d.ok(&["cache", "ls", "--sort", "size"]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("DIGEST"), "{out}");
    assert!(lines[1].starts_with(&a.to_hex()[..16]) && lines[1].contains("3.0 MiB"), "{out}");
    assert!(lines[2].starts_with(&b.to_hex()[..16]) && lines[2].contains("1.5 KiB"), "{out}");
    assert!(out.contains("2 of 2 shown; cache: 2 objects"), "{out}");
    let v = d.json(&["cache", "ls", "--min-size", "1M"]);
    assert_eq!(v["total"], 1);
    assert_eq!(v["items"][0]["digest"], a.to_hex());
    let v = d.json(&["cache", "ls", "--name", "output"]);
    assert_eq!(v["items"][0]["label"], "output_norm.weight");

    d.ok(&["cache", "pin", &b.to_hex()]);
    assert_eq!(d.json(&["cache", "stat", &b.to_hex()])["pinned"], true);
    d.ok(&["cache", "unpin", &b.to_hex()]);
    assert!(d.ok(&["cache", "stat", &b.to_hex()]).contains("1.5 KiB (1536 bytes)"));

    assert!(d.ok(&["cache", "verify"]).contains("checked 2 objects, 0 corrupt"));
    let p = store.layout().object_path(&b);
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&p, bytes).unwrap();
    let (r, out) = d.run(&["cache", "verify"]);
    assert_eq!(r.unwrap(), Outcome::Negative, "corruption is a negative answer: {out}");
    assert!(out.contains(&format!("corrupt {}", b.to_hex())), "{out}");

    d.ok(&["cache", "rm", &a.to_hex()]);
    let (r, _) = d.run(&["cache", "stat", &a.to_hex()]);
    assert!(format!("{:#}", r.unwrap_err()).contains("cache-object-not-found"));
    d.ok(&["cache", "gc"]);

    let model = dir.path().join("tiny.gguf");
    support::write_tiny_model(&model, 1);
    let out = d.ok(&["cache", "import", model.to_str().unwrap()]);
    let n = compute::gguf::Gguf::read(&model).unwrap().tensors().len();
    assert!(out.starts_with(&format!("imported {n} tensors")), "{out}");
    assert!(out.trim_end().ends_with(&format!("{n} new")), "{out}");
}

#[test]
fn jobs_and_auth() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    support::write_tiny_model(&model, 1);
    let d = Daemon::start(&dir.path().join("state"), None);
    let m = model.to_str().unwrap();
    let id = d.ok(&[
        "jobs",
        "submit",
        "-m",
        m,
        "-p",
        "hello",
        "-n",
        "8",
        "--temp",
        "0",
        "-c",
        "64",
        "--hash-threshold",
        "9",
    ]);
    let id = id.trim();
    // Follow until the end; the streamed text is the job's output.
    let followed = d.ok(&["jobs", "logs", "-f", id]);
    let job = d.json(&["jobs", "show", id]);
    assert_eq!(job["state"], "done");
    assert_eq!(
        (job["request"]["n_ctx"].as_u64(), job["request"]["hash_threshold"].as_u64()),
        (Some(64), Some(9))
    );
    // llamactl's default split mode (the daemon measures the workers when the job names some).
    assert_eq!(job["request"]["split_mode"], "auto");
    assert_eq!(followed, format!("{}\n", job["output"].as_str().unwrap()));
    assert!(job["generated_tokens"].as_u64().unwrap() >= 1);
    let logs = d.ok(&["jobs", "logs", id]);
    assert_eq!(logs.trim_end_matches('\n'), job["output"].as_str().unwrap().trim_end_matches('\n'));
    let ls = d.ok(&["jobs", "ls"]);
    assert!(ls.lines().nth(1).unwrap().starts_with(id) && ls.contains("done"), "{ls}");
    let (r, _) = d.run(&["jobs", "cancel", id]);
    assert!(format!("{:#}", r.unwrap_err()).contains("job-finished"));
    let (r, _) = d.run(&["jobs", "submit", "-m", "x.gguf", "-p", "a", "--workers", "no-such-label"]);
    let e = format!("{:#}", r.unwrap_err());
    assert!(e.contains("bad-request") && e.contains("no-such-label"), "{e}");

    // A wrong token is refused with a hint; a missing token file is an error before any request.
    let wrong = dir.path().join("wrong.token");
    std::fs::write(&wrong, "nope\n").unwrap();
    let cli = AdminCli::try_parse_from([
        "llamactl",
        "status",
        "--server",
        &d.url,
        "--token-file",
        wrong.to_str().unwrap(),
    ])
    .unwrap();
    let e = format!("{:#}", execute(&cli.command, &mut Vec::new()).unwrap_err());
    assert!(e.contains("403") && e.contains("forbidden") && e.contains("--token-file"), "{e}");
    let cli = AdminCli::try_parse_from([
        "llamactl",
        "status",
        "--server",
        &d.url,
        "--token-file",
        "/nonexistent/t",
    ])
    .unwrap();
    assert!(format!("{:#}", execute(&cli.command, &mut Vec::new()).unwrap_err()).contains("/nonexistent/t"));
}

#[test]
fn usage_errors_are_exit_code_2() {
    for argv in [
        &["llamactl", "cache", "bogus"][..],
        &["llamactl", "cache", "ls", "--min-size", "lots"],
        &["llamactl", "jobs", "show"],
        &["llamactl", "status", "-o", "yaml"],
    ] {
        let e = AdminCli::try_parse_from(argv).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{argv:?}");
    }
}
