//! Split mode `auto`: measure the links at connect time and pick `layer` or `row` for the model.
//!
//! The choice is made for generation, one token at a time, where the split matters most (a
//! prompt's long ubatches amortise round trips in both modes). Per token, with `N` workers, a
//! model of `W` weight bytes and `L` layers, each worker streaming its weights at `B` bytes/s:
//!
//! * `layer`: the workers compute their layers in turn, and the hidden state makes one round trip
//!   per worker through this process: `t_layer = W / B + N · rtt`.
//! * `row`: every worker computes `1/N` of every layer, but every layer phase (attention, then
//!   feed-forward: `2L` phases, plus the logits) ends with an exchange of partial sums. Linked llamad
//!   workers send them to each other directly (one way: `rtt / 2` per phase) and the master waits
//!   one round trip per token; otherwise every phase is a master round trip:
//!   `t_row = W / (N · B) + (2L + 1) · rtt / 2 + rtt` (linked) or `W / (N · B) + (2L + 1) · rtt`.
//!
//! `row` is chosen when `t_row < t_layer`. `rtt` is each worker's median round trip of a small
//! command measured here (the worker links cross the same network), `B` this machine's streaming
//! read bandwidth with all its threads (the workers are assumed alike). So tensor parallelism pays
//! while `(2L + 1) · rtt / 2 < W · (1 − 1/N) / B` roughly: for a 30-layer 100 MB model on two
//! workers streaming 15 GB/s, up to a round trip of about 50 µs (loopback, a fast LAN); for a
//! 70B Q4_0 model (80 layers, 38 GB) on three such workers, up to about 10 ms.
//!
//! The rule counts the network only. Each phase also waits for the slowest worker, and on a
//! machine with more busy threads than cores a worker that waits is descheduled: on a 2-core VM
//! running three other builds, two 1-thread workers over a 17 µs link generated SmolLM2 at 6.2
//! t/s in row against 19.9 t/s in layer (about 2 ms lost per phase), while the rule picked row.
//! Give workers cores of their own. On the same VM, quiet (`bench/results/network-2026-11-28.md`),
//! the rule picked the faster mode for generation on every link profile: row at a 114 µs round trip
//! (93.7 against 61.5 t/s), layer from 237 µs on (72.7 against 66.6 t/s, up to 34.6 against 6.7 at
//! 4.2 ms).

use std::time::{Duration, Instant};

use crate::error::Result;
use crate::pipeline::SplitOptions;
use crate::remote::Worker;
use crate::SplitMode;

/// What was measured and decided.
#[derive(Clone, Debug)]
pub struct AutoChoice {
    /// `Layer` or `Row`.
    pub mode: SplitMode,
    /// Estimated time per generated token, layer split.
    pub layer_ms: f64,
    /// Estimated time per generated token, split mode row.
    pub row_ms: f64,
    /// Median round trip per worker.
    pub rtt: Vec<(String, Duration)>,
    /// Whether the workers can exchange partial sums directly (all llamad, links allowed).
    pub linked: bool,
    /// The streaming bandwidth assumed per worker, bytes/s.
    pub bandwidth: f64,
}

impl std::fmt::Display for AutoChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rtts: Vec<String> =
            self.rtt.iter().map(|(a, d)| format!("{a} {:.0} µs", d.as_secs_f64() * 1e6)).collect();
        write!(
            f,
            "split mode auto: {} (estimated per token: layer {:.2} ms, row {:.2} ms; round trips {}; {}; {:.1} GB/s per worker)",
            self.mode.name(),
            self.layer_ms,
            self.row_ms,
            rtts.join(", "),
            if self.linked { "linked workers" } else { "partial sums through the master" },
            self.bandwidth / 1e9
        )
    }
}

/// The rule (see the module documentation), in seconds and bytes.
pub fn estimate(weight_bytes: f64, n_layer: u32, bandwidth: f64, rtts: &[f64], linked: bool) -> (f64, f64) {
    let n = rtts.len().max(1) as f64;
    let compute = weight_bytes / bandwidth.max(1.0);
    let rtt_sum: f64 = rtts.iter().sum();
    let rtt_max = rtts.iter().copied().fold(0.0, f64::max);
    let phases = 2.0 * f64::from(n_layer) + 1.0;
    let layer = compute + rtt_sum;
    let row =
        if linked { compute / n + phases * rtt_max / 2.0 + rtt_max } else { compute / n + phases * rtt_max };
    (layer, row)
}

/// Connects to every worker, measures its round trip, and picks the mode for a model of
/// `weight_bytes` and `n_layer` layers. One worker, or none, is always `layer`.
pub fn choose(addrs: &[String], opts: &SplitOptions, n_layer: u32, weight_bytes: u64) -> Result<AutoChoice> {
    let mut rtt = Vec::with_capacity(addrs.len());
    let mut linked = !opts.no_worker_links && opts.tls.is_none();
    for addr in addrs {
        let mut w = Worker::connect_auth(addr, opts.auth.as_ref(), opts.tls.as_ref())?;
        linked &= w.client.ext_version().is_some();
        rtt.push((addr.clone(), round_trip(&mut w)?));
        // Dropped here: llama.cpp's server serves one connection at a time.
    }
    let bandwidth = read_bandwidth();
    let secs: Vec<f64> = rtt.iter().map(|(_, d)| d.as_secs_f64()).collect();
    let (layer, row) = estimate(weight_bytes as f64, n_layer, bandwidth, &secs, linked);
    let mode = if addrs.len() >= 2 && row < layer { SplitMode::Row } else { SplitMode::Layer };
    let choice = AutoChoice { mode, layer_ms: layer * 1e3, row_ms: row * 1e3, rtt, linked, bandwidth };
    tracing::info!(%choice, "split mode chosen");
    Ok(choice)
}

/// Median of 9 DEVICE_COUNT round trips (after one to warm the path).
fn round_trip(w: &mut Worker) -> Result<Duration> {
    w.client.device_count()?;
    let mut t: Vec<Duration> = (0..9)
        .map(|_| {
            let t0 = Instant::now();
            w.client.device_count().map(|_| t0.elapsed())
        })
        .collect::<std::result::Result<_, _>>()?;
    t.sort();
    Ok(t[t.len() / 2])
}

/// Streaming read bandwidth of this machine with all its threads, bytes/s (64 MiB, best of 3).
fn read_bandwidth() -> f64 {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let words = (64usize << 20) / 8;
    let buf: Vec<u64> = (0..words as u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
    let chunk = words.div_ceil(threads);
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t0 = Instant::now();
        let sum: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = buf
                .chunks(chunk)
                .map(|c| s.spawn(move || c.iter().fold(0u64, |a, &x| a.wrapping_add(x))))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0)).fold(0u64, u64::wrapping_add)
        });
        std::hint::black_box(sum);
        best = best.max((words * 8) as f64 / t0.elapsed().as_secs_f64());
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_by_hand() {
        // 100 MB, 30 layers, 15 GB/s: compute 6.667 ms. Two linked workers at 50 µs:
        // layer = 6.667 + 0.1 = 6.767 ms; row = 3.333 + 61 · 0.025 + 0.05 = 4.908 ms → row.
        let (l, r) = estimate(100e6, 30, 15e9, &[50e-6, 50e-6], true);
        assert!((l * 1e3 - 6.7667).abs() < 1e-3, "{l}");
        assert!((r * 1e3 - 4.9083).abs() < 1e-3, "{r}");
        assert!(r < l);
        // The same over 1 Gbit/s with 300 µs each way (rtt 600 µs): layer 7.867 ms, row
        // 3.333 + 61 · 0.3 + 0.6 = 22.233 ms → layer.
        let (l, r) = estimate(100e6, 30, 15e9, &[600e-6, 600e-6], true);
        assert!((l * 1e3 - 7.8667).abs() < 1e-3 && (r * 1e3 - 22.2333).abs() < 1e-3, "{l} {r}");
        assert!(r > l);
        // Unlinked (llama.cpp's servers): every phase a full round trip. At 50 µs:
        // row = 3.333 + 61 · 0.05 = 6.383 ms, still below layer's 6.767 ms.
        let (_, r) = estimate(100e6, 30, 15e9, &[50e-6, 50e-6], false);
        assert!((r * 1e3 - 6.3833).abs() < 1e-3, "{r}");
        // A 70B Q4_0 model (38 GB, 80 layers) on three workers at 15 GB/s and a 2 ms round trip:
        // layer = 2533.3 + 6 = 2539.3 ms; row = 844.4 + 161 · 1 + 2 = 1007.4 ms → row.
        let (l, r) = estimate(38e9, 80, 15e9, &[2e-3; 3], true);
        assert!((l * 1e3 - 2539.33).abs() < 0.01 && (r * 1e3 - 1007.44).abs() < 0.01, "{l} {r}");
    }
}
