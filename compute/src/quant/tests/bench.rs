//! Throughput of every kernel set's dot products (only with `LLAMAD_SLOW_TESTS=1`; prints
//! GB/s of weight bytes and ns per 4096-element row to stderr). Each run is also checked against
//! the scalar result, so the test cannot pass on a broken kernel.

use std::time::Instant;

use super::*;

/// `reps` passes of `dot` over the rows of `qx` (row size `rs`) against `qy`: the best wall time of
/// 10 trials (the machine is shared, the minimum is the least disturbed) and the last trial's sum.
fn best_of_10(
    dot: crate::quant::VecDotFn,
    n: usize,
    qx: &[u8],
    rs: usize,
    qy: &[u8],
    reps: usize,
) -> (f64, f32) {
    let mut dt = f64::INFINITY;
    let mut acc = 0.0f32;
    for _ in 0..10 {
        let t0 = Instant::now();
        acc = 0.0;
        for _ in 0..reps {
            for row in qx.chunks_exact(rs) {
                acc += dot(n, row, qy);
            }
        }
        dt = dt.min(t0.elapsed().as_secs_f64());
    }
    (dt, acc)
}

#[test]
fn dot_throughput() {
    if std::env::var("LLAMAD_SLOW_TESTS").as_deref() != Ok("1") {
        return;
    }
    // LLAMAD_BENCH_SHAPE=K,ROWS measures another shape (e.g. 576,16384: rows out of cache).
    let shape = std::env::var("LLAMAD_BENCH_SHAPE").ok();
    let mut dims = shape.iter().flat_map(|s| s.split(',')).filter_map(|v| v.parse::<usize>().ok());
    let (n, rows) = (dims.next().unwrap_or(4096), dims.next().unwrap_or(64));
    let s = scalar_table();
    let mut r = rng(1);
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_K,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q5_0,
        GgmlType::IQ4_XS,
        GgmlType::F16,
    ];
    for t in types {
        if !n.is_multiple_of(t.blck_size()) {
            eprintln!("{t:>7}: skipped (K = {n} is not a whole number of blocks)");
            continue;
        }
        let x = gaussian(&mut r, n * rows);
        let qx = quantize(&s, t, &x);
        let vt = s.get(t).vec_dot_type;
        let qy = quantize(&s, vt, &gaussian(&mut r, n));
        let rs = t.row_size(n as u64).unwrap() as usize;
        for isa in Isa::all_available() {
            let k = Kernels::build(isa);
            let dot = k.get(t).vec_dot.unwrap();
            let reps = if isa == Isa::Scalar { 2 } else { 20 };
            let (dt, acc) = best_of_10(dot, n, &qx, rs, &qy, reps);
            let want: f32 =
                qx.chunks_exact(rs).map(|row| (s.get(t).vec_dot.unwrap())(n, row, &qy)).sum::<f32>()
                    * reps as f32;
            assert!((acc - want).abs() <= 1e-3 * want.abs().max(1.0), "{t} {}", isa.name());
            if let Some(x4) = k.get(t).vec_dot_x4 {
                // Four columns at once: ns per row and column, to compare with the line above.
                let mut dt4 = f64::INFINITY;
                for _ in 0..10 {
                    let t0 = Instant::now();
                    for _ in 0..reps {
                        for row in qx.chunks_exact(rs) {
                            std::hint::black_box(x4(n, row, [&qy, &qy, &qy, &qy]));
                        }
                    }
                    dt4 = dt4.min(t0.elapsed().as_secs_f64());
                }
                eprintln!(
                    "{t:>7} {:>7}: x4 {:8.1} ns/row/column",
                    isa.name(),
                    dt4 * 1e9 / (rows * reps * 4) as f64
                );
            }
            let bytes = (qx.len() * reps) as f64;
            eprintln!(
                "{t:>7} {:>7}: {:6.2} GB/s  {:8.1} ns/row",
                isa.name(),
                bytes / dt / 1e9,
                dt * 1e9 / (rows * reps) as f64
            );
        }
    }
}

#[test]
fn interleave_throughput() {
    if std::env::var("LLAMAD_SLOW_TESTS").as_deref() != Ok("1") {
        return;
    }
    // A SmolLM2-sized matrix (the LM head: 49152 rows of 576); GB/s of source bytes.
    let (k, m) = (576usize, 49152usize);
    let mut r = rng(5);
    for t in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0] {
        let src: Vec<u8> = (0..m * k / 32 * t.type_size()).map(|_| r.random()).collect();
        let mut out = vec![0u8; src.len()];
        let mut dt = f64::INFINITY;
        for _ in 0..5 {
            let t0 = Instant::now();
            crate::quant::interleave::interleave(t, k, m, &src, &mut out);
            dt = dt.min(t0.elapsed().as_secs_f64());
        }
        let mut back = vec![0u8; k / 32 * t.type_size()];
        crate::quant::interleave::deinterleave_row(t, k, &out, 3, &mut back);
        assert_eq!(back, src[3 * back.len()..4 * back.len()], "{t}");
        let mut dt2 = f64::INFINITY;
        let mut par = vec![0u8; src.len()];
        for _ in 0..5 {
            let t0 = Instant::now();
            crate::quant::interleave::interleave_parallel(t, k, m, &src, &mut par, 2);
            dt2 = dt2.min(t0.elapsed().as_secs_f64());
        }
        assert!(par == out, "{t}: the parallel interleave differs");
        let gbs = |d: f64| src.len() as f64 / d / 1e9;
        eprintln!(
            "interleave {t:>5}: {:6.2} GB/s, 2 threads {:6.2} GB/s ({} MB)",
            gbs(dt),
            gbs(dt2),
            src.len() / 1_000_000
        );
    }
}

/// The grid IQ dot products per numerics profile (only with `LLAMAD_SLOW_TESTS=1`): ns per
/// 4096-element row of the `portable` fused kernels and of ggml's one-row and tiled orders that the
/// `avx2` / `avx512` profiles install. Each figure's sum is checked against the scalar kernel.
#[test]
fn grid_iq_order_throughput() {
    use crate::numerics::Numerics;
    use crate::quant::testing::random_grid_blocks;
    if std::env::var("LLAMAD_SLOW_TESTS").as_deref() != Ok("1") {
        return;
    }
    let (n, rows, reps) = (4096usize, 64usize, 20usize);
    let s = scalar_table();
    let mut r = rng(2);
    let qy = quantize(&s, GgmlType::Q8_K, &gaussian(&mut r, n));
    let Some(isa) = Isa::all_available().into_iter().rfind(|i| matches!(i, Isa::Avx2 | Isa::Avx512)) else {
        return;
    };
    use GgmlType::*;
    for t in [IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M] {
        let qx = random_grid_blocks(t, rows * n / 256, 1.0, 3).unwrap();
        let rs = t.row_size(n as u64).unwrap() as usize;
        let want: f32 = qx.chunks_exact(rs).map(|row| (s.get(t).vec_dot.unwrap())(n, row, &qy)).sum();
        let portable = Kernels::build_for(isa, Numerics::Portable);
        let ggml = Kernels::build_for(isa, Numerics::Avx2);
        let kinds = [
            ("portable", portable.get(t).vec_dot.unwrap()),
            ("ggml one-row", ggml.get(t).vec_dot.unwrap()),
            ("ggml tiled", ggml.get(t).vec_dot_batch.unwrap()),
        ];
        for (what, dot) in kinds {
            let (dt, acc) = best_of_10(dot, n, &qx, rs, &qy, reps);
            let want = want * reps as f32;
            assert!((acc - want).abs() <= 1e-3 * want.abs().max(1.0), "{t} {what}: {acc} vs {want}");
            eprintln!("{t:>7} {:>7} {what:>13}: {:8.1} ns/row", isa.name(), dt * 1e9 / (rows * reps) as f64);
        }
    }
}

/// The tiled matrix × matrix kernels in matmul's calls (16 weight rows × 16 activation rows per
/// call, a prompt's worth of calls over one weight matrix): this thread's CPU ns per output and
/// block of 32, the best of 5 runs (the machine is shared; CPU time is less disturbed than wall time; only
/// with `LLAMAD_SLOW_TESTS=1`; `LLAMAD_BENCH_SHAPE=K,ROWS,COLS`, default 576,1536,128). Every output
/// is checked against the kernel set's `vec_dot` bit for bit.
#[test]
fn gemm_throughput() {
    if std::env::var("LLAMAD_SLOW_TESTS").as_deref() != Ok("1") {
        return;
    }
    let shape = std::env::var("LLAMAD_BENCH_SHAPE").ok();
    let mut dims = shape.iter().flat_map(|s| s.split(',')).filter_map(|v| v.parse::<usize>().ok());
    let (n, rows, cols) =
        (dims.next().unwrap_or(576), dims.next().unwrap_or(1536), dims.next().unwrap_or(128));
    let s = scalar_table();
    let mut r = rng(2);
    for t in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q4_K, GgmlType::Q6_K]
    {
        if !n.is_multiple_of(t.blck_size()) {
            continue;
        }
        let qx = quantize(&s, t, &gaussian(&mut r, n * rows));
        let vt = s.get(t).vec_dot_type;
        let qy = quantize(&s, vt, &gaussian(&mut r, n * cols));
        let (rs, ys) = (t.row_size(n as u64).unwrap() as usize, vt.row_size(n as u64).unwrap() as usize);
        let x: Vec<&[u8]> = qx.chunks_exact(rs).collect();
        let y: Vec<&[u8]> = qy.chunks_exact(ys).collect();
        for isa in Isa::all_available() {
            let k = Kernels::build(isa);
            let (Some(gemm), Some(dot)) = (k.get(t).gemm, k.get(t).vec_dot) else { continue };
            let mut out = vec![0.0f32; rows * cols];
            let mut dt = f64::INFINITY;
            for _ in 0..5 {
                let t0 = thread_cpu_secs();
                for (cb, yc) in y.chunks(16).enumerate() {
                    for (rb, xr) in x.chunks(16).enumerate() {
                        let mut o = [0.0f32; 256];
                        gemm(n, xr, yc, &mut o[..xr.len() * yc.len()]);
                        for (j, col) in o[..xr.len() * yc.len()].chunks_exact(xr.len()).enumerate() {
                            let at = (cb * 16 + j) * rows + rb * 16;
                            out[at..at + col.len()].copy_from_slice(col);
                        }
                    }
                }
                dt = dt.min(thread_cpu_secs() - t0);
            }
            for (j, yj) in y.iter().enumerate().step_by(7) {
                for (i, xi) in x.iter().enumerate().step_by(5) {
                    assert_eq!(
                        out[j * rows + i].to_bits(),
                        dot(n, xi, yj).to_bits(),
                        "{t} {} ({i},{j})",
                        isa.name()
                    );
                }
            }
            let blocks = (rows * cols * n / t.blck_size()) as f64;
            eprintln!(
                "{t:>7} {:>7}: gemm {:6.3} ns/output/block  {:7.2} ms CPU",
                isa.name(),
                dt * 1e9 / blocks,
                dt * 1e3
            );
        }
    }
}

/// CPU seconds of this thread so far.
fn thread_cpu_secs() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec to write; the clock id is a constant of the platform.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}
