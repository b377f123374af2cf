//! The `llamad` binary: version, check-config, device errors, and graceful shutdown on SIGTERM.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn llamad() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_llamad"));
    c.env_remove("RUST_LOG");
    for (k, _) in std::env::vars() {
        if k.starts_with("LLAMAD__") {
            c.env_remove(k);
        }
    }
    c
}

#[test]
fn version_names_the_protocol() {
    let out = llamad().arg("--version").output().unwrap();
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains(env!("CARGO_PKG_VERSION")) && s.contains("RPC protocol 8.0.0") && s.contains("7.0.0"),
        "{s}"
    );
}

#[test]
fn check_config_accepts_and_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(&good, "[server]\nport = 6001\nmem = \"1G\"\n[limits]\nmax_connections = 8\n").unwrap();
    let out = llamad().args(["check-config", "--config"]).arg(&good).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[server]\nthreds = 2\n").unwrap();
    let out = llamad().args(["check-config", "--config"]).arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("threds"));
    let out = llamad()
        .args(["check-config", "--config"])
        .arg(&good)
        .env("LLAMAD__SERVER__PORT", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn unknown_device_lists_the_devices() {
    let out = llamad().args(["check-config", "-d", "CUDA0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("CUDA0") && e.contains("available devices: CPU"), "{e}");
}

#[test]
fn sigterm_shuts_down_gracefully() {
    let port = crate::process::free_port();
    let mut child = llamad()
        .args(["serve", "-H", "127.0.0.1", "-p", &port.to_string(), "-t", "1", "--mem", "64M"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut c = loop {
        match llamad_proto::RpcClient::connect(("127.0.0.1", port)) {
            Ok(c) => break c,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("llamad did not come up: {e}"),
        }
    };
    assert_eq!(c.get_device_memory(0).unwrap().total, 64 << 20);
    let ok = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(ok.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(err.contains("SIGTERM received") && err.contains("shutdown: done"), "{err}");
    assert!(err.contains("connection closed"), "{err}");
}
