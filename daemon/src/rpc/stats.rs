//! Counters: process-wide per-command totals, the graph latency histogram and the table of open
//! connections (for the admin API and `/metrics`), and a per-connection tally (for the close log line).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// 8.0.0: GRAPH_RECOMPUTEs served from the graph store by uid.
    pub graph_store_hits: AtomicU64,
    /// 8.0.0: graphs stored by uid (GRAPH_COMPUTE with a non-zero uid).
    pub graph_store_inserts: AtomicU64,
    /// 8.0.0: times a device's graph store was full and cleared (as the master clears its side).
    pub graph_store_clears: AtomicU64,
    /// 8.0.0: COMM_ALLREDUCEs completed.
    pub allreduces: AtomicU64,
    /// 8.0.0: server-to-server links set up by COMM_INIT.
    pub comm_links: AtomicU64,
    /// The reason the most recent refused connection was closed (`COMMAND: reason`).
    pub last_refusal: Mutex<Option<String>>,
    /// Wall time of each GRAPH_COMPUTE / GRAPH_RECOMPUTE.
    pub graph_latency: Histogram,
    /// The connections open now.
    pub live: LiveConns,
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

/// Upper bounds (seconds) of the graph compute latency buckets.
pub const LATENCY_BUCKETS: [f64; 12] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

/// A fixed-bucket latency histogram with atomic counters (Prometheus' cumulative buckets).
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        for (b, le) in self.buckets.iter().zip(LATENCY_BUCKETS) {
            if s <= le {
                b.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Appends the `_bucket`, `_sum` and `_count` lines of metric `name` with `labels` (`k="v",...`).
    pub fn write_prometheus(&self, out: &mut String, name: &str, labels: &str) {
        for (b, le) in self.buckets.iter().zip(LATENCY_BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {}", b.load(Ordering::Relaxed));
        }
        let n = self.count();
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {n}");
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {n}");
    }
}

/// One open connection's live counters.
#[derive(Debug)]
pub struct LiveConn {
    /// Accept order since start.
    pub id: u64,
    /// The peer.
    pub peer: SocketAddr,
    /// When it was accepted.
    pub since: Instant,
    /// Commands received.
    pub commands: AtomicU64,
    /// Request bytes.
    pub bytes_in: AtomicU64,
    /// Response bytes.
    pub bytes_out: AtomicU64,
    /// Graphs computed.
    pub graphs: AtomicU64,
}

/// The table of open connections.
#[derive(Debug, Default)]
pub struct LiveConns {
    next: AtomicU64,
    map: Mutex<BTreeMap<u64, Arc<LiveConn>>>,
}

impl LiveConns {
    /// Registers a connection from `peer`; the caller removes it with [`LiveConns::close`].
    pub fn open(&self, peer: SocketAddr) -> Arc<LiveConn> {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let c = Arc::new(LiveConn {
            id,
            peer,
            since: Instant::now(),
            commands: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            graphs: AtomicU64::new(0),
        });
        if let Ok(mut m) = self.map.lock() {
            m.insert(id, c.clone());
        }
        c
    }

    /// Removes connection `id`.
    pub fn close(&self, id: u64) {
        if let Ok(mut m) = self.map.lock() {
            m.remove(&id);
        }
    }

    /// The open connections, oldest first.
    pub fn snapshot(&self) -> Vec<Arc<LiveConn>> {
        self.map.lock().map(|m| m.values().cloned().collect()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(20));
        h.observe(Duration::from_secs(30));
        let mut out = String::new();
        h.write_prometheus(&mut out, "x", "s=\"rpc\"");
        assert!(out.contains("x_bucket{s=\"rpc\",le=\"0.001\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{s=\"rpc\",le=\"0.025\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{s=\"rpc\",le=\"10\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{s=\"rpc\",le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_sum{s=\"rpc\"} 30.0205\n"), "{out}");
        assert!(out.contains("x_count{s=\"rpc\"} 3\n"), "{out}");
    }

    #[test]
    fn live_table_tracks_open_connections_in_order() {
        let t = LiveConns::default();
        let a = t.open("127.0.0.1:1".parse().unwrap());
        let b = t.open("[::1]:2".parse().unwrap());
        assert_eq!(t.snapshot().iter().map(|c| c.id).collect::<Vec<_>>(), vec![a.id, b.id]);
        t.close(a.id);
        let left = t.snapshot();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].peer, b.peer);
    }
}
