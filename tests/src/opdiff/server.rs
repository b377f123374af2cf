//! The two servers under comparison: llama.cpp's own RPC server (`tests/interop/ref_server.py`
//! under the reference peer's Python) and llamad, each a child process on a free local port,
//! killed when its [`Server`] is dropped (also when a test fails).

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::Rng;

use super::{Error, Result};

/// Server ports stay below the ephemeral range (32768+), as in tests/interop/peer.py.
const PORT_RANGE: std::ops::Range<u16> = 20000..32000;

/// The workspace root (this crate lives in `tests/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// `$LLAMAD_BIN`, else `$CARGO_TARGET_DIR/release/llamad`, else the workspace's `target/release/llamad`.
pub fn llamad_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("LLAMAD_BIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join("release").join("llamad")
}

/// A port in [`PORT_RANGE`] nothing listens on right now.
pub fn free_port() -> Result<u16> {
    let mut rng = rand::rng();
    for _ in 0..200 {
        let port = rng.random_range(PORT_RANGE);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(Error::Server("no free port below 32768".into()))
}

/// A running server process.
pub struct Server {
    /// "reference" or "llamad".
    pub kind: &'static str,
    /// Where it listens.
    pub addr: SocketAddr,
    child: Child,
    log: PathBuf,
}

impl Server {
    /// Spawns `cmd` (which must listen on `port`), logging to a temp file, and waits until the
    /// port accepts connections.
    fn spawn(kind: &'static str, mut cmd: Command, port: u16) -> Result<Server> {
        let log = std::env::temp_dir().join(format!("opdiff-{kind}-{}-{port}.log", std::process::id()));
        let out = File::create(&log)?;
        let err = out.try_clone()?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| Error::Server(format!("cannot start {kind} ({:?}): {e}", cmd.get_program())))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut server = Server { kind, addr, child, log };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = server.child.try_wait()? {
                return Err(Error::Server(format!(
                    "{kind} exited with {st} before listening:\n{}",
                    server.log_tail()
                )));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok() {
                return Ok(server);
            }
            if Instant::now() > deadline {
                return Err(Error::Server(format!(
                    "{kind} did not listen on {addr}:\n{}",
                    server.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// llama.cpp's RPC server through `python` (the reference peer's interpreter), 1 thread.
    pub fn reference(python: &Path) -> Result<Server> {
        let port = free_port()?;
        let dir = workspace_root().join("tests").join("interop");
        let mut cmd = Command::new(python);
        cmd.arg(dir.join("ref_server.py")).args(["-p", &port.to_string(), "-t", "1"]).current_dir(&dir);
        Server::spawn("reference", cmd, port)
    }

    /// llamad (`bin`) with 1 thread, the admin API off and `kernels` forced when given
    /// (`LLAMAD_KERNELS`).
    pub fn llamad(bin: &Path, kernels: Option<&str>) -> Result<Server> {
        if !bin.is_file() {
            return Err(Error::Server(format!(
                "llamad binary {} not found (cargo build --release -p llamad, or set LLAMAD_BIN)",
                bin.display()
            )));
        }
        let port = free_port()?;
        let mut cmd = Command::new(bin);
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string(), "-t", "1"])
            .env("LLAMAD__ADMIN__ENABLED", "false");
        if let Some(k) = kernels {
            cmd.env("LLAMAD_KERNELS", k);
        }
        Server::spawn("llamad", cmd, port)
    }

    /// True while the process runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// What the server's log says went wrong: its assertion or error lines when there are any
    /// (a crashing ggml prints a long backtrace after them), else the last lines.
    pub fn log_tail(&self) -> String {
        let data = std::fs::read(&self.log).unwrap_or_default();
        let text = String::from_utf8_lossy(&data);
        let key: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.contains("GGML_ASSERT")
                    || l.contains("GGML_ABORT")
                    || l.contains("error")
                    || l.contains("ERROR")
            })
            .take(5)
            .collect();
        if !key.is_empty() {
            return key.join("\n");
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::env::var("LLAMAD_INTEROP_KEEP_LOGS").as_deref() != Ok("1") {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}
