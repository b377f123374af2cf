//! The real `llamad` binary as a child process on a free loopback port, for the tests that need a
//! process (SIGKILL, restart, RSS): spawned with a log file, waited for until it answers HELLO,
//! killed on drop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use llamad_proto::RpcClient;

/// A port on 127.0.0.1 that nothing holds right now, below the kernel's ephemeral range
/// (`e2e::server::free_port`): a port from `bind(0)` lies in that range, where the next outgoing
/// connection of any process may take it as its local port before the daemon binds it.
pub fn free_port() -> u16 {
    e2e::server::free_port().unwrap()
}

/// A running `llamad`.
pub struct Daemon {
    pub addr: SocketAddr,
    pub child: Child,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `llamad serve` on `port` with `args` (besides host and port), logging to `log`;
    /// waits up to 30 s for it to answer HELLO.
    pub fn spawn_on(port: u16, args: &[&str], log: &Path) -> Daemon {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_llamad"));
        cmd.env("RUST_LOG", "llamad=info");
        for (k, _) in std::env::vars() {
            if k.starts_with("LLAMAD__") {
                cmd.env_remove(k);
            }
        }
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        let child = cmd
            .args(["serve", "-H", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut d = Daemon { addr, child, log: log.to_path_buf() };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if RpcClient::connect_timeout(&addr, Duration::from_secs(2)).is_ok() {
                return d;
            }
            if let Ok(Some(status)) = d.child.try_wait() {
                panic!("llamad exited at start ({status}):\n{}", d.log_text());
            }
            assert!(Instant::now() < deadline, "llamad did not come up:\n{}", d.log_text());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The daemon's stderr so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A connected client.
    pub fn client(&self) -> RpcClient {
        let c = RpcClient::connect_timeout(&self.addr, Duration::from_secs(10)).unwrap();
        c.socket().set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        c
    }

    /// Resident set size (VmRSS) and its peak (VmHWM), in KiB.
    pub fn rss_kib(&self) -> (u64, u64) {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let field = |name: &str| -> u64 {
            let line = s.lines().find(|l| l.starts_with(name)).unwrap();
            line[name.len()..].trim().trim_end_matches("kB").trim().parse().unwrap()
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// Waits until GET_DEVICE_MEMORY reports every byte of the budget free again (all buffers
    /// returned), up to 10 s; returns the last report.
    pub fn wait_all_free(&self) -> llamad_proto::msg::DeviceMemoryRsp {
        let mut c = self.client();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let m = c.get_device_memory(0).unwrap();
            if m.free == m.total || Instant::now() > deadline {
                return m;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, then reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill9();
        }
    }
}
