//! Times the interleaved generation kernel (`quant::interleave`) of Q4_1 and Q8_0 at SmolLM2's
//! K = 576 for 1..=8 activation rows: CPU ns per group of 16 weight rows and per column, and the
//! multiply-accumulates per ns. `cargo run --release -p compute --example il-bench`.

use compute::quant::{interleave, kernels, prepared};
use compute::GgmlType;

/// CPU seconds of this thread (a busy machine's other processes do not count).
fn cpu_secs() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec to write; the clock id is a constant of the platform.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

fn main() {
    let k = 576usize;
    for t in [GgmlType::Q4_1, GgmlType::Q8_0] {
        let Some(f) = kernels(t).interleaved_dot else {
            println!("{t}: no interleaved kernel");
            continue;
        };
        let groups = 64;
        let gb = interleave::group_bytes(t, k);
        let mut w: Vec<u8> = (0..groups * gb).map(|i| (i * 7 % 251) as u8).collect();
        // Normal scales and mins (f16 0.0123 and -0.5), as a model's: denormals would time the
        // processor's assists instead of the kernel.
        let (bb, qb) = (interleave::block_bytes(t), interleave::quant_bytes(t));
        for blk in w.chunks_exact_mut(bb) {
            for r in 0..2 * interleave::ROWS {
                let v: u16 = if r < interleave::ROWS { 0x224D } else { 0xB800 };
                if qb + 2 * r + 2 <= bb {
                    blk[qb + 2 * r..qb + 2 * r + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        let row = prepared::row_bytes(k);
        let cols: Vec<Vec<u8>> = (0..8)
            .map(|c| {
                let mut y: Vec<u8> = (0..row).map(|i| ((i + c) * 13 % 97) as u8 & 0x3F).collect();
                for b in y.chunks_exact_mut(72) {
                    for l in 0..8 {
                        b[32 + 4 * l..36 + 4 * l].copy_from_slice(&(-(l as i32) * 50).to_le_bytes());
                    }
                    b[64..68].copy_from_slice(&0.02f32.to_le_bytes());
                    b[68..72].copy_from_slice(&1.5f32.to_le_bytes());
                }
                y
            })
            .collect();
        for n in [1usize, 2, 4, 8] {
            let mut out = [0.0f32; 8 * interleave::ROWS];
            let reps = 2000;
            let t0 = cpu_secs();
            for _ in 0..reps {
                for g in 0..groups {
                    let group = &w[g * gb..(g + 1) * gb];
                    let mut c0 = 0;
                    while c0 < n {
                        let nc = interleave::MAX_COLS.min(n - c0);
                        let ys: Vec<&[u8]> = cols[c0..c0 + nc].iter().map(Vec::as_slice).collect();
                        f(k, group, &ys, &mut out[c0 * 16..], &[]);
                        c0 += nc;
                    }
                }
            }
            let ns = (cpu_secs() - t0) * 1e9 / (reps * groups) as f64;
            let macs = (16 * k * n) as f64;
            println!(
                "{t} cols {n}: {ns:.0} ns per group, {:.0} ns per column, {:.1} MAC/ns",
                ns / n as f64,
                macs / ns
            );
            std::hint::black_box(&out);
        }
    }
}
