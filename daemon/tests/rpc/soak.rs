//! Soak test: 32 clients at once against the real `llamad` binary on loopback, each looping
//! ALLOC_BUFFER, BUFFER_GET_BASE, SET_TENSOR uploads, a small two-node GRAPH_COMPUTE
//! (`out = (a + b) * a`, checked element by element against the same arithmetic done here),
//! GET_TENSOR and FREE_BUFFER, for a bounded time. Then every client disconnects and the test
//! asserts: zero errors, every byte of the budget free again (GET_DEVICE_MEMORY), and the
//! daemon's resident memory no more than [`RSS_SLACK_MIB`] above what it was after the warm-up.
//! It prints per-command latency percentiles.
//!
//! Duration: `LLAMAD_SOAK_SECS` (scripts/test.sh sets 15 and runs it with `--nocapture` so the
//! figures reach the CI log); otherwise 60 s with `LLAMAD_SLOW_TESTS=1`, else a 3 s smoke run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use llamad_proto::{GraphBlob, RpcClient, RpcTensor};

use crate::common::*;
use crate::process::{free_port, Daemon};

const CLIENTS: usize = 32;
/// Allowed growth of the daemon's RSS between the end of the warm-up and the end, after every
/// client left. A leak of one buffer per iteration would exceed it within seconds.
const RSS_SLACK_MIB: u64 = 64;
const BUDGET: u64 = 1 << 30;

fn duration() -> Duration {
    let secs = match std::env::var("LLAMAD_SOAK_SECS").ok().and_then(|s| s.parse::<u64>().ok()) {
        Some(s) => s.max(1),
        None if std::env::var("LLAMAD_SLOW_TESTS").as_deref() == Ok("1") => 60,
        None => 3,
    };
    Duration::from_secs(secs)
}

/// Commands timed. Those without a response are timed to the end of the write; the graph is
/// timed together with the GET_TENSOR that reads its result (the protocol's barrier).
const NAMES: [&str; 6] = [
    "ALLOC_BUFFER",
    "BUFFER_GET_BASE",
    "SET_TENSOR (send)",
    "GRAPH_COMPUTE+GET_TENSOR",
    "FREE_BUFFER (send)",
    "iteration",
];

/// A tiny seeded generator (xorshift64*), so every client's data differs and runs repeat.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn f32(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
    }
}

/// `t = a + b; out = t * a` over f32[n]: a, b, t, out at 0, 4n, 8n, 12n of one buffer.
fn graph(buf: u64, base: u64, n: u32) -> (GraphBlob, RpcTensor, RpcTensor, RpcTensor) {
    let a = f32_tensor(1, buf, base, n);
    let b = f32_tensor(2, buf, base + 4 * n as u64, n);
    let mut t = f32_tensor(3, buf, base + 8 * n as u64, n);
    t.op = compute::GgmlOp::Add as u32;
    t.flags = 16; // GGML_TENSOR_FLAG_COMPUTE: nodes without it are skipped
    t.src[0] = 1;
    t.src[1] = 2;
    let mut out = f32_tensor(4, buf, base + 12 * n as u64, n);
    out.op = compute::GgmlOp::Mul as u32;
    out.flags = 16;
    out.src[0] = 3;
    out.src[1] = 1;
    (GraphBlob { device: 0, nodes: vec![3, 4], tensors: vec![a, b, t, out] }, a, b, out)
}

#[derive(Default)]
struct Tally {
    lat: [Vec<Duration>; 6],
    iterations: u64,
    bytes_up: u64,
    errors: Vec<String>,
}

fn client(mut c: RpcClient, seed: u64, stop: Arc<AtomicBool>) -> Tally {
    let mut rng = Rng(seed | 1);
    let mut tally = Tally::default();
    let mut step = |tally: &mut Tally| -> Result<(), String> {
        let it = Instant::now();
        // Mostly small graphs; every 16th iteration uploads 1 MiB per input.
        let n: u32 = if rng.next().is_multiple_of(16) { 1 << 18 } else { 16 + (rng.next() % 4096) as u32 };
        let size = 16 * n as u64;
        let t0 = Instant::now();
        let r = c.alloc_buffer(0, size).map_err(|e| format!("ALLOC_BUFFER: {e}"))?;
        tally.lat[0].push(t0.elapsed());
        if r.remote_ptr == 0 || r.remote_size < size {
            return Err(format!("ALLOC_BUFFER of {size} bytes answered {r:?}"));
        }
        let t0 = Instant::now();
        let base = c.buffer_get_base(r.remote_ptr).map_err(|e| format!("BUFFER_GET_BASE: {e}"))?;
        tally.lat[1].push(t0.elapsed());
        let (g, a, b, out) = graph(r.remote_ptr, base, n);
        let av: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
        let bv: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
        for (t, v) in [(&a, &av), (&b, &bv)] {
            let bytes = f32_bytes(v);
            let t0 = Instant::now();
            c.set_tensor(t, 0, &bytes, false).map_err(|e| format!("SET_TENSOR: {e}"))?;
            tally.lat[2].push(t0.elapsed());
            tally.bytes_up += bytes.len() as u64;
        }
        let t0 = Instant::now();
        c.graph_compute(&g).map_err(|e| format!("GRAPH_COMPUTE: {e}"))?;
        let got = c.get_tensor(&out, 0, 4 * n as u64).map_err(|e| format!("GET_TENSOR: {e}"))?;
        tally.lat[3].push(t0.elapsed());
        for (i, g) in bytes_f32(&got).into_iter().enumerate() {
            let want = (av[i] + bv[i]) * av[i];
            if g.to_bits() != want.to_bits() {
                return Err(format!(
                    "element {i} of {n}: got {g}, want ({} + {}) * {} = {want}",
                    av[i], bv[i], av[i]
                ));
            }
        }
        let t0 = Instant::now();
        c.free_buffer(r.remote_ptr).map_err(|e| format!("FREE_BUFFER: {e}"))?;
        tally.lat[4].push(t0.elapsed());
        tally.lat[5].push(it.elapsed());
        tally.iterations += 1;
        Ok(())
    };
    while !stop.load(Ordering::Relaxed) {
        if let Err(e) = step(&mut tally) {
            tally.errors.push(e);
            break;
        }
    }
    tally
}

fn pct(v: &[Duration], p: f64) -> f64 {
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1e3
}

#[test]
fn soak_32_clients() {
    let secs = duration();
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::spawn_on(
        free_port(),
        &["-t", "2", "--mem", &BUDGET.to_string(), "--admin-listen", "off"],
        &dir.path().join("llamad.log"),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let c = d.client();
            let stop = stop.clone();
            std::thread::spawn(move || client(c, 0x9e37_79b9_7f4a_7c15 ^ (i as u64 * 7919), stop))
        })
        .collect();
    let start = Instant::now();
    let warm = (secs / 10).max(Duration::from_millis(500));
    std::thread::sleep(warm);
    let (rss_warm, _) = d.rss_kib();
    std::thread::sleep(secs.saturating_sub(warm));
    stop.store(true, Ordering::Relaxed);
    let tallies: Vec<Tally> = clients.into_iter().map(|h| h.join().unwrap()).collect();
    let elapsed = start.elapsed();
    let mem = d.wait_all_free();
    // Give the allocator a moment after the last free, then read RSS.
    std::thread::sleep(Duration::from_millis(200));
    let (rss_end, rss_peak) = d.rss_kib();

    let errors: Vec<&String> = tallies.iter().flat_map(|t| &t.errors).collect();
    let iterations: u64 = tallies.iter().map(|t| t.iterations).sum();
    let up: u64 = tallies.iter().map(|t| t.bytes_up).sum();
    println!(
        "soak: {CLIENTS} clients, {:.1} s, {iterations} iterations ({:.0}/s), {:.1} MiB uploaded, {} errors",
        elapsed.as_secs_f64(),
        iterations as f64 / elapsed.as_secs_f64(),
        up as f64 / (1 << 20) as f64,
        errors.len()
    );
    println!("soak: latency in ms         count      p50      p90      p99      max");
    for (k, name) in NAMES.iter().enumerate() {
        let mut v: Vec<Duration> = tallies.iter().flat_map(|t| t.lat[k].iter().copied()).collect();
        v.sort();
        if v.is_empty() {
            continue;
        }
        println!(
            "soak: {name:<26} {:>6} {:>8.3} {:>8.3} {:>8.3} {:>8.3}",
            v.len(),
            pct(&v, 0.50),
            pct(&v, 0.90),
            pct(&v, 0.99),
            pct(&v, 1.0)
        );
    }
    println!(
        "soak: after disconnect: free {} of {} bytes; RSS {} KiB after warm-up, {} KiB at the end (peak {} KiB)",
        mem.free, mem.total, rss_warm, rss_end, rss_peak
    );

    assert!(errors.is_empty(), "{} client errors, first: {}", errors.len(), errors[0]);
    assert!(tallies.iter().all(|t| t.iterations > 0), "a client made no progress");
    assert_eq!((mem.free, mem.total), (BUDGET, BUDGET), "buffers still held after every client left");
    assert!(
        rss_end <= rss_warm + RSS_SLACK_MIB * 1024,
        "RSS grew from {rss_warm} KiB to {rss_end} KiB (more than {RSS_SLACK_MIB} MiB)"
    );
    let log = d.log_text();
    assert!(!log.contains("closing connection"), "the daemon refused a client:\n{log}");
}
