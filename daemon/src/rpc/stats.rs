//! Counters: process-wide per-command totals (for the admin API) and a per-connection tally (for
//! the close log line).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use llamad_proto::cmd::{Cmd, ALL_CMDS, CMD_COUNT};

/// Totals of one command.
#[derive(Debug, Default)]
pub struct CmdCounter {
    /// Commands received.
    pub count: AtomicU64,
    /// Request bytes (frame headers included).
    pub bytes_in: AtomicU64,
    /// Response bytes (frame headers included).
    pub bytes_out: AtomicU64,
}

/// Process-wide counters, shared by every connection.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Per command, indexed by command id.
    pub cmds: [CmdCounter; CMD_COUNT],
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections open now.
    pub active: AtomicU64,
    /// Connections closed because the peer broke a rule.
    pub refused: AtomicU64,
    /// Connections closed at accept: the peer is not in the allow list.
    pub denied: AtomicU64,
    /// Connections closed at accept: `max_connections` were already open.
    pub over_limit: AtomicU64,
    /// Graphs executed (GRAPH_COMPUTE and GRAPH_RECOMPUTE).
    pub graphs_computed: AtomicU64,
    /// The reason the most recent refused connection was closed (`COMMAND: reason`).
    pub last_refusal: Mutex<Option<String>>,
}

/// A plain copy of one command's totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdSnapshot {
    /// The command.
    pub cmd: Option<Cmd>,
    /// Commands received.
    pub count: u64,
    /// Request bytes.
    pub bytes_in: u64,
    /// Response bytes.
    pub bytes_out: u64,
}

impl ServerStats {
    /// Adds one command's traffic.
    pub fn record(&self, cmd: Cmd, bytes_in: u64, bytes_out: u64) {
        let c = &self.cmds[cmd as usize];
        c.count.fetch_add(1, Ordering::Relaxed);
        c.bytes_in.fetch_add(bytes_in, Ordering::Relaxed);
        c.bytes_out.fetch_add(bytes_out, Ordering::Relaxed);
    }

    /// Remembers why a connection was refused.
    pub fn record_refusal(&self, reason: String) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut g) = self.last_refusal.lock() {
            *g = Some(reason);
        }
    }

    /// Takes the most recent refusal reason.
    pub fn take_last_refusal(&self) -> Option<String> {
        self.last_refusal.lock().ok().and_then(|mut g| g.take())
    }

    /// A copy of every command's totals.
    pub fn snapshot(&self) -> Vec<CmdSnapshot> {
        ALL_CMDS
            .iter()
            .map(|&c| {
                let k = &self.cmds[c as usize];
                CmdSnapshot {
                    cmd: Some(c),
                    count: k.count.load(Ordering::Relaxed),
                    bytes_in: k.bytes_in.load(Ordering::Relaxed),
                    bytes_out: k.bytes_out.load(Ordering::Relaxed),
                }
            })
            .collect()
    }
}

/// One connection's tally.
#[derive(Debug, Default)]
pub struct ConnStats {
    /// Commands per id.
    pub counts: [u64; CMD_COUNT],
    /// Bytes read.
    pub bytes_in: u64,
    /// Bytes written.
    pub bytes_out: u64,
    /// Graphs executed.
    pub graphs: u64,
}

impl ConnStats {
    /// `NAME=count` for every command seen, for the close log line.
    pub fn by_command(&self) -> String {
        let parts: Vec<String> = ALL_CMDS
            .iter()
            .filter(|c| self.counts[**c as usize] > 0)
            .map(|c| format!("{}={}", c.name(), self.counts[*c as usize]))
            .collect();
        parts.join(",")
    }
}
