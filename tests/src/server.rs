//! Server processes for the end-to-end tests: llama.cpp's own RPC server
//! (`tests/interop/ref_server.py` under the reference peer's Python) and llamad, each a child on a
//! free local port, logging to a temp file, killed when its [`Server`] is dropped (also when a
//! test fails).
//!
//! A server counts as started only when the child itself holds a socket listening on its port
//! (its `/proc/PID/fd` against `/proc/net/tcp`), not when some connection to the port succeeds: a
//! port picked free can be taken by another test's server before the child binds it, and a probe
//! would then reach that other server (which goes away with its test). A child that loses its port
//! that way is restarted on another.

use std::collections::HashSet;
use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::Rng;

use crate::{Error, Result};

/// Server ports stay below the ephemeral range (32768+), as in tests/interop/peer.py.
const PORT_RANGE: std::ops::Range<u16> = 20000..32000;

/// How many ports a server is tried on when another process takes the one it was given.
const PORT_TRIES: usize = 4;

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
        if port_free(port) {
            return Ok(port);
        }
    }
    Err(Error::Server("no free port below 32768".into()))
}

/// Whether nothing holds 127.0.0.1:`port` (a bind succeeds).
fn port_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
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
    /// Starts the command `make(port)` builds on a free port and waits until the child listens
    /// there; on a port another process took first, tries another.
    fn spawn(kind: &'static str, make: impl Fn(u16) -> Command) -> Result<Server> {
        let mut last = String::new();
        for _ in 0..PORT_TRIES {
            let port = free_port()?;
            match Server::spawn_on(kind, make(port), port) {
                Err(Error::PortTaken(why)) => last = why,
                started => return started,
            }
        }
        Err(Error::Server(format!("{kind} found no port in {PORT_TRIES} tries; last: {last}")))
    }

    /// Spawns `cmd` (which must listen on `port`), logging to a temp file, and waits until the
    /// child holds a listening socket on `port`. [`Error::PortTaken`]: the child exited while
    /// another process held the port.
    fn spawn_on(kind: &'static str, mut cmd: Command, port: u16) -> Result<Server> {
        let log = std::env::temp_dir().join(format!("e2e-{kind}-{}-{port}.log", std::process::id()));
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
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(st) = server.child.try_wait()? {
                let why =
                    format!("{kind} exited with {st} before listening on {addr}:\n{}", server.log_tail());
                return Err(if port_free(port) { Error::Server(why) } else { Error::PortTaken(why) });
            }
            if server.listening() {
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

    /// True when the child holds a socket listening on the server's port. Where `/proc` cannot
    /// tell (no such file system), a connection to the port that succeeds counts.
    fn listening(&self) -> bool {
        match listens(self.child.id(), self.addr.port()) {
            Some(yes) => yes,
            None => TcpStream::connect_timeout(&self.addr, Duration::from_millis(500)).is_ok(),
        }
    }

    /// llama.cpp's RPC server through `python` (the reference peer's interpreter), 1 thread.
    pub fn reference(python: &Path) -> Result<Server> {
        Server::reference_with(python, &[])
    }

    /// llama.cpp's RPC server with 1 thread and `extra` flags of `ref_server.py` (`-c`,
    /// `--cache-dir DIR`).
    pub fn reference_with(python: &Path, extra: &[&str]) -> Result<Server> {
        let dir = workspace_root().join("tests").join("interop");
        Server::spawn("reference", |port| {
            let mut cmd = Command::new(python);
            cmd.arg(dir.join("ref_server.py"))
                .args(["-p", &port.to_string(), "-t", "1"])
                .args(extra)
                .current_dir(&dir);
            cmd
        })
    }

    /// A reference server started from a shell command line in which `{port}` stands for the port
    /// (`LLAMAD_OPDIFF_REF_CMD`, e.g. llama.cpp's aarch64 `ggml-rpc-server` under qemu-user:
    /// `tests/peer/ggml-rpc-server-aarch64 neon-dotprod -H 127.0.0.1 -p {port} -t 1`). The command
    /// runs through `sh -c 'exec ...'`, so the child is the server itself (its listening socket is
    /// what [`Server::spawn_on`] waits for).
    pub fn reference_cmd(template: &str) -> Result<Server> {
        if !template.contains("{port}") {
            return Err(Error::Server(format!("reference command has no {{port}}: {template}")));
        }
        let root = workspace_root();
        Server::spawn("reference", |port| {
            let mut cmd = Command::new("sh");
            cmd.arg("-c")
                .arg(format!("exec {}", template.replace("{port}", &port.to_string())))
                .current_dir(&root);
            cmd
        })
    }

    /// llamad (`bin`) with 1 thread, the admin API off and `kernels` forced when given
    /// (`LLAMAD_KERNELS`).
    pub fn llamad(bin: &Path, kernels: Option<&str>) -> Result<Server> {
        Server::llamad_with(bin, kernels, &[])
    }

    /// As [`Server::llamad`], with `extra` command-line flags (`--protocol 7` for llama.cpp's
    /// 7.0.0 masters).
    pub fn llamad_with(bin: &Path, kernels: Option<&str>, extra: &[&str]) -> Result<Server> {
        if !bin.is_file() {
            return Err(Error::Server(format!(
                "llamad binary {} not found (cargo build --release -p llamad, or set LLAMAD_BIN)",
                bin.display()
            )));
        }
        Server::spawn("llamad", |port| {
            let mut cmd = Command::new(bin);
            cmd.args(["-H", "127.0.0.1", "-p", &port.to_string(), "-t", "1"])
                .args(extra)
                .env("LLAMAD__ADMIN__ENABLED", "false");
            if let Some(k) = kernels {
                cmd.env("LLAMAD_KERNELS", k);
            }
            // Reproduce the reference peer's build unless the caller chose a profile.
            if !extra.contains(&"--numerics") && std::env::var_os("LLAMAD_NUMERICS").is_none() {
                if let Some(p) = peer_python().as_deref().and_then(peer_numerics) {
                    cmd.env("LLAMAD_NUMERICS", p);
                }
            }
            cmd
        })
    }

    /// True while the process runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The server's state for a failure message: "running", or how it ended and what it logged.
    pub fn state(&mut self) -> String {
        match self.child.try_wait() {
            Ok(None) => format!("{} on {} is running", self.kind, self.addr),
            Ok(Some(st)) => format!("{} on {} exited with {st}:\n{}", self.kind, self.addr, self.log_tail()),
            Err(e) => format!("{} on {}: {e}", self.kind, self.addr),
        }
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

/// The Python of the reference peer: `$LLAMAD_PEER_PYTHON`, else the first
/// `venv-*/bin/python` that `tests/peer/build-peer.sh` left in `$LLAMAD_PEER_CACHE` (default
/// `~/.cache/llamad-peer`). `None` when neither exists.
pub fn peer_python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("LLAMAD_PEER_PYTHON").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let root = std::env::var_os("LLAMAD_PEER_CACHE")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/llamad-peer")))?;
    let mut venvs: Vec<PathBuf> = std::fs::read_dir(root)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("venv-"))
        .map(|e| e.path().join("bin").join("python"))
        .filter(|p| p.exists())
        .collect();
    venvs.sort();
    venvs.into_iter().next()
}

/// The llamad numerics profile that reproduces the build of the peer at `python`
/// (`tests/interop/peer_build.py` asks its ggml library); `None` when the peer cannot say.
/// Answered once per process.
pub fn peer_numerics(python: &Path) -> Option<&'static str> {
    static ANSWER: std::sync::OnceLock<Option<&'static str>> = std::sync::OnceLock::new();
    *ANSWER.get_or_init(|| {
        let script = workspace_root().join("tests/interop/peer_build.py");
        let out = Command::new(python).arg(script).stderr(Stdio::null()).output().ok()?;
        let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
        ["avx2", "avx512", "portable"].into_iter().find(|p| *p == name)
    })
}

/// Whether process `pid` holds a TCP socket listening on `port` (IPv4, any local address):
/// the socket inodes among its open files against the LISTEN rows of `/proc/net/tcp`.
/// `None` when `/proc` cannot say.
fn listens(pid: u32, port: u16) -> Option<bool> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    let inodes: HashSet<u64> = fds
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect();
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    Some(table.lines().skip(1).any(|row| {
        let f: Vec<&str> = row.split_whitespace().collect();
        let (Some(local), Some(&"0A"), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
            return false;
        };
        let listens_on_port = local
            .rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            .is_some_and(|p| p == port);
        listens_on_port && inode.parse().is_ok_and(|i: u64| inodes.contains(&i))
    }))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listens_sees_only_this_processs_listening_port() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let me = std::process::id();
        assert_eq!(listens(me, port), Some(true));
        // This process's connected socket is not a listener.
        let c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let theirs = c.local_addr().unwrap().port();
        assert_eq!(listens(me, theirs), Some(false));
        drop(l);
        assert_eq!(listens(me, port), Some(false));
        // This process's listener is not another process's.
        let l2 = TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(!listens(1, l2.local_addr().unwrap().port()).unwrap_or(false));
    }
}
