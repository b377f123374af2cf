//! Faults across real binaries on loopback (issue 9): a worker killed with SIGKILL in the middle of
//! `llamactl run --workers A,B` makes the run fail within seconds, with an error naming that worker
//! (no hang, no silent continuation), and the surviving worker gets all its memory back; and a run
//! over TLS (`llamad --tls-cert/--tls-key`, `llamactl --tls-ca`) gives the same tokens as in plain
//! TCP.
//!
//! Binaries: `$LLAMAD_BIN` and `$LLAMACTL_BIN`, else `target/release/`, else `target/debug/`
//! (`cargo build -p llamad -p llamactl`). Model: `$LLAMAD_MODEL`, else `models/` (scripts/fetch-model.sh).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::server::workspace_root;

/// How long a run may take to fail once a worker is gone.
const FAIL_BOUND: Duration = Duration::from_secs(10);

fn binary(name: &str, env: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    for profile in ["release", "debug"] {
        let p = target.join(profile).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("{name} not found: build it (cargo build -p llamad -p llamactl) or set {env}");
}

fn model() -> PathBuf {
    let p = match std::env::var_os("LLAMAD_MODEL").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => workspace_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    assert!(p.exists(), "{} is missing: run scripts/fetch-model.sh (or set LLAMAD_MODEL)", p.display());
    p
}

struct Worker {
    addr: String,
    child: Child,
}

impl Worker {
    fn start(extra: &[&str], log: &Path) -> Worker {
        // Below the ephemeral range, where no outgoing connection takes it first.
        let port = e2e::server::free_port().unwrap();
        let child = Command::new(binary("llamad", "LLAMAD_BIN"))
            .args(["serve", "-H", "127.0.0.1", "-p", &port.to_string(), "-t", "1", "--mem", "1G"])
            .args(["--admin-listen", "off"])
            .args(extra)
            .env("RUST_LOG", "llamad=info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "llamad on {addr} did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        Worker { addr, child }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads a child's pipe into a shared buffer on a thread.
fn collect(mut r: impl Read + Send + 'static) -> Arc<Mutex<Vec<u8>>> {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let b = buf.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 {
                break;
            }
            b.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
    });
    buf
}

fn llamactl_run(workers: &str, n: &str, extra: &[&str]) -> Command {
    let mut c = Command::new(binary("llamactl", "LLAMACTL_BIN"));
    c.args(["run", "-m"]).arg(model());
    c.args(["-p", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "-n", n, "--temp", "0", "-c", "2048"]);
    c.args(["--workers", workers, "--no-progress", "-t", "1"]).args(extra);
    c.env("RUST_LOG", "warn").env("LLAMACTL_SPLIT_MODE", "layer");
    c
}

#[test]
fn a_worker_killed_mid_generation_fails_the_run_within_seconds() {
    killed_mid_generation(&[]);
}

/// The same with split mode row, where the two llamad workers exchange partial sums over their own
/// link: the survivor loses the link, and the run must still fail at once and name the dead worker.
#[test]
fn a_linked_row_split_worker_killed_mid_generation_fails_the_run_within_seconds() {
    killed_mid_generation(&["--split-mode", "row"]);
}

fn killed_mid_generation(extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let a = Worker::start(&[], &dir.path().join("a.log"));
    let mut b = Worker::start(&[], &dir.path().join("b.log"));
    let mut run = llamactl_run(&format!("{},{}", a.addr, b.addr), "1500", extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = collect(run.stdout.take().unwrap());
    let err = collect(run.stderr.take().unwrap());
    // Wait until generation is under way: tokens beyond the prompt's echo are arriving.
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut seen = 0;
    loop {
        let len = out.lock().unwrap().len();
        if len > 60 && seen > 0 && len > seen {
            break;
        }
        seen = seen.max(len);
        if let Some(status) = run.try_wait().unwrap() {
            panic!(
                "llamactl ended before the kill ({status}):\n{}",
                String::from_utf8_lossy(&err.lock().unwrap())
            );
        }
        assert!(Instant::now() < deadline, "no generation within 300 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = out.lock().unwrap().len();
    b.child.kill().unwrap(); // SIGKILL
    let _ = b.child.wait();
    let killed = Instant::now();
    let status = loop {
        if let Some(s) = run.try_wait().unwrap() {
            break s;
        }
        if killed.elapsed() > FAIL_BOUND {
            let _ = run.kill();
            panic!("llamactl still running {FAIL_BOUND:?} after the worker was killed (a hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = killed.elapsed();
    std::thread::sleep(Duration::from_millis(100)); // the pipe readers catch up
    let stderr = String::from_utf8_lossy(&err.lock().unwrap()).to_string();
    eprintln!("run failed {took:?} after SIGKILL of {} ({before} bytes of output before):\n{stderr}", b.addr);
    assert!(!status.success(), "the run succeeded without a worker: {status}");
    assert!(stderr.contains(&b.addr), "the error does not name the killed worker {}:\n{stderr}", b.addr);
    assert!(took < FAIL_BOUND);
    // The surviving worker freed everything the master held there.
    let mut c = llamad_proto::RpcClient::connect(&a.addr[..]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = c.get_device_memory(0).unwrap();
        if m.free == m.total {
            break;
        }
        assert!(Instant::now() < deadline, "worker {} still holds {} bytes", a.addr, m.total - m.free);
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_run_over_tls_gives_the_plain_runs_tokens() {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
    };
    let dir = tempfile::tempdir().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, "e2e CA");
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca = CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap().signed_by(&key, &ca).unwrap();
    let path = |n: &str| dir.path().join(n);
    std::fs::write(path("ca.pem"), ca.pem()).unwrap();
    std::fs::write(path("cert.pem"), cert.pem()).unwrap();
    std::fs::write(path("key.pem"), key.serialize_pem()).unwrap();
    let (cert_s, key_s, ca_s) = (
        path("cert.pem").display().to_string(),
        path("key.pem").display().to_string(),
        path("ca.pem").display().to_string(),
    );

    let tls = Worker::start(&["--tls-cert", &cert_s, "--tls-key", &key_s], &path("tls.log"));
    let plain = Worker::start(&[], &path("plain.log"));
    let over_tls = llamactl_run(&tls.addr, "16", &["--tls-ca", &ca_s]).output().unwrap();
    assert!(over_tls.status.success(), "{}", String::from_utf8_lossy(&over_tls.stderr));
    let over_plain = llamactl_run(&plain.addr, "16", &[]).output().unwrap();
    assert!(over_plain.status.success(), "{}", String::from_utf8_lossy(&over_plain.stderr));
    assert!(!over_tls.stdout.is_empty());
    assert_eq!(String::from_utf8_lossy(&over_tls.stdout), String::from_utf8_lossy(&over_plain.stdout));
    let log = std::fs::read_to_string(path("tls.log")).unwrap();
    assert!(log.contains("tls=true"), "{log}");

    // Without --tls-ca the TLS-only worker refuses the master, and says why.
    let refused = llamactl_run(&tls.addr, "4", &[]).output().unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains(&tls.addr) && stderr.contains("may require TLS"), "{stderr}");
    let log = std::fs::read_to_string(path("tls.log")).unwrap();
    assert!(log.contains("TLS is required"), "{log}");
}
