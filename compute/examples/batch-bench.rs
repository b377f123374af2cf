//! Times greedy generation of 1, 4 and 8 sequences decoded together in a [`BatchSession`] (the
//! OpenAI engine's in-process path) and prints aggregate tokens/s per sequence count:
//! `cargo run --release -p compute --example batch-bench -- MODEL.gguf [THREADS] [TOKENS] [COUNTS]`
//! (COUNTS comma-separated, default `1,4,8`). Each sequence's prompt is decoded first (not timed);
//! then TOKENS steps of one token per sequence are timed.

use std::time::Instant;

use anyhow::Context;
use compute::model::{BatchSession, Model, SeqChunk, SessionConfig};

const PROMPTS: [&[u32]; 8] = [
    &[504, 3575, 282, 4649, 314],
    &[11477, 2220, 253, 655],
    &[1111, 28263, 30, 94, 2167],
    &[504, 1450, 970, 288, 1462, 253, 2596, 314],
    &[788, 216, 33, 36, 41, 34, 28, 4281],
    &[9251, 48326, 418],
    &[3142, 14273, 1842, 314],
    &[504, 3845, 282, 37061],
];

fn argmax(l: &[f32]) -> u32 {
    (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap_or(0) as u32
}

/// CPU seconds of the whole process (every thread) so far.
fn cpu_secs() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec to write; the clock id is a constant of the platform.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args.first().context("usage: batch-bench MODEL.gguf [THREADS] [TOKENS] [COUNTS]")?;
    let threads: usize = args.get(1).map_or(Ok(2), |s| s.parse())?;
    let n_gen: usize = args.get(2).map_or(Ok(64), |s| s.parse())?;
    let counts: Vec<usize> =
        args.get(3).map_or("1,4,8", String::as_str).split(',').map(str::parse).collect::<Result<_, _>>()?;
    // SAFETY: the file is only read while this process runs; we do not modify it.
    let model = unsafe { Model::open(path) }.with_context(|| format!("opening {path}"))?;
    println!("| sequences | aggregate tokens/s | vs one | ms per step | CPU ms per step |");
    println!("|---|---|---|---|---|");
    let mut one = None;
    for &n in &counts {
        let cfg = SessionConfig { n_ctx: 512, n_ubatch: 512, n_threads: threads, ..SessionConfig::default() };
        let mut b = BatchSession::new(model.clone(), cfg, 8)?;
        let mut last = Vec::with_capacity(n);
        for (slot, p) in PROMPTS.iter().take(n).enumerate() {
            let l = b.decode(&[SeqChunk { slot, tokens: p }])?;
            last.push(argmax(l));
        }
        let (t0, c0) = (Instant::now(), cpu_secs());
        for _ in 0..n_gen {
            let toks: Vec<[u32; 1]> = last.iter().map(|&t| [t]).collect();
            let chunks: Vec<SeqChunk<'_>> =
                toks.iter().enumerate().map(|(slot, t)| SeqChunk { slot, tokens: t }).collect();
            let l = b.decode(&chunks)?;
            let nv = l.len() / n;
            for (i, t) in last.iter_mut().enumerate() {
                *t = argmax(&l[i * nv..(i + 1) * nv]);
            }
        }
        let dt = t0.elapsed().as_secs_f64();
        let cpu = cpu_secs() - c0;
        let rate = (n * n_gen) as f64 / dt;
        let base = *one.get_or_insert(rate);
        println!(
            "| {n} | {rate:.1} | {:.2}x | {:.2} | {:.2} |",
            rate / base,
            dt * 1e3 / n_gen as f64,
            cpu * 1e3 / n_gen as f64
        );
    }
    Ok(())
}
