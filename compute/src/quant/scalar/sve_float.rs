//! Scalar models of ggml's SVE float dot products (ggml-cpu `vec.cpp` under `__ARM_FEATURE_SVE`, as
//! llama.cpp's armv8.6-a+sve build runs them: SVE without SVE2): the twins of
//! `quant::aarch64::sve_float`, portable so the order can be tested anywhere. `w` is the number of
//! f32 lanes of one SVE vector (the vector length in bits / 32: 4, 8 or 16; 8 on Graviton 3).
//!
//! - `ggml_vec_dot_f32`: eight accumulators of `w` lanes over steps of `8·w` elements (`fma` per
//!   lane, accumulator `k` takes elements `8w·s + w·k + l`); then whole vectors into accumulator 0,
//!   then the last `n mod w` elements into its first lanes (`svmla_f32_m`, predicated, fused). Reduced
//!   as `a0+a1, a2+a3, a4+a5, a6+a7`, then `(a0+a2), (a4+a6)`, then their sum, lane by lane, and the
//!   lanes by `faddv` ([`faddv`]). The result is that f32.
//! - `ggml_vec_dot_f16` (no SVE2: `svtrn1`/`svtrn2` then `svcvt` and `svmla`): each vector of `2w`
//!   halves gives its even elements to a "lo" accumulator and its odd ones to a "hi" accumulator
//!   (lane `j` takes elements `2j` and `2j+1`), widened to f32, fused (the products are exact). Four
//!   lo/hi pairs, vector `k` of a step of `8·2w` elements going to pair `k mod 4`; whole vectors past
//!   the steps to pair 0, the last `n mod 2w` elements zero-padded into pair 0. Reduced as
//!   `(p0+p1) + (p2+p3)` lane by lane, separately for lo and hi; result `faddv(lo) + faddv(hi)` in f32.

use half::f16;

/// SVE `faddv` on all lanes: the architecture's recursive halving, `faddv(lo half) + faddv(hi half)`
/// (8 lanes: `((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7))`).
pub fn faddv(v: &[f32]) -> f32 {
    if v.len() == 1 {
        return v[0];
    }
    let h = v.len() / 2;
    faddv(&v[..h]) + faddv(&v[h..])
}

fn add_lanes(a: &mut [f32], b: &[f32]) {
    a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
}

/// ggml's SVE `ggml_vec_dot_f32` with `w` f32 lanes per vector, on values.
pub fn dot_f32_values(x: &[f32], y: &[f32], w: usize) -> f32 {
    let n = x.len().min(y.len());
    let step = 8 * w;
    let (np, np2) = (n / step * step, n / w * w);
    let mut acc = vec![vec![0.0f32; w]; 8];
    for i in (0..np).step_by(step) {
        for (k, a) in acc.iter_mut().enumerate() {
            for (l, v) in a.iter_mut().enumerate() {
                let e = i + w * k + l;
                *v = x[e].mul_add(y[e], *v);
            }
        }
    }
    for e in np..n {
        // Whole vectors and the predicated tail both go to accumulator 0, lane e mod w.
        let v = &mut acc[0][(e - np) % w];
        *v = x[e].mul_add(y[e], *v);
    }
    debug_assert!(np2 <= n);
    let [a0, a1, a2, a3, a4, a5, a6, a7] = <[Vec<f32>; 8]>::try_from(acc).expect("eight accumulators");
    let (mut s1, mut s3, mut s5, mut s7) = (a0, a2, a4, a6);
    add_lanes(&mut s1, &a1);
    add_lanes(&mut s3, &a3);
    add_lanes(&mut s5, &a5);
    add_lanes(&mut s7, &a7);
    add_lanes(&mut s1, &s3);
    add_lanes(&mut s5, &s7);
    add_lanes(&mut s1, &s5);
    faddv(&s1)
}

/// ggml's SVE `ggml_vec_dot_f16` with `w` f32 lanes per vector, on widened values.
pub fn dot_f16_values(x: &[f32], y: &[f32], w: usize) -> f32 {
    let n = x.len().min(y.len());
    let epr = 2 * w;
    let step = 8 * epr;
    let np = n - n % step;
    let mut lo = vec![vec![0.0f32; w]; 4];
    let mut hi = vec![vec![0.0f32; w]; 4];
    let at = |v: &[f32], e: usize| if e < n { v[e] } else { 0.0 };
    let mut fma_vec = |pair: usize, base: usize| {
        for j in 0..w {
            let (e, o) = (base + 2 * j, base + 2 * j + 1);
            lo[pair][j] = at(x, e).mul_add(at(y, e), lo[pair][j]);
            hi[pair][j] = at(x, o).mul_add(at(y, o), hi[pair][j]);
        }
    };
    for i in (0..np).step_by(step) {
        for k in 0..8 {
            fma_vec(k % 4, i + k * epr);
        }
    }
    // Whole vectors, then the zero-padded tail, into pair 0.
    for base in (np..n).step_by(epr) {
        fma_vec(0, base);
    }
    let reduce = |p: &mut Vec<Vec<f32>>| {
        let (p0, rest) = p.split_at_mut(1);
        add_lanes(&mut p0[0], &rest[0]);
        let (p2, p3) = rest[1..].split_at_mut(1);
        add_lanes(&mut p2[0], &p3[0]);
        add_lanes(&mut p0[0], &p2[0]);
        faddv(&p0[0])
    };
    reduce(&mut lo) + reduce(&mut hi)
}

fn f32s(p: &[u8], n: usize) -> Vec<f32> {
    assert!(p.len() >= 4 * n, "sve_float: {} bytes for {n} f32", p.len());
    p[..4 * n].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn f16s(p: &[u8], n: usize) -> Vec<f32> {
    assert!(p.len() >= 2 * n, "sve_float: {} bytes for {n} f16", p.len());
    p[..2 * n].chunks_exact(2).map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect()
}

/// f32 · f32 as ggml's SVE `ggml_vec_dot_f32` with `w` lanes per vector.
pub fn vec_dot_f32_f32_sve(w: usize, n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_f32_values(&f32s(x, n), &f32s(y, n), w)
}

/// f16 · f16 as ggml's SVE `ggml_vec_dot_f16` with `w` f32 lanes per vector.
pub fn vec_dot_f16_f16_sve(w: usize, n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_f16_values(&f16s(x, n), &f16s(y, n), w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faddv_halves_recursively() {
        // 1e8 cancels only between lanes 0 and 1 of one half.
        assert_eq!(faddv(&[1e8, -1e8, 1.0, 1.0]), 2.0);
        assert_eq!(faddv(&[1e8, 1.0, -1e8, 1.0]), 0.0);
        let v: Vec<f32> = (1..=8).map(|i| i as f32).collect();
        assert_eq!(faddv(&v), 36.0);
    }

    #[test]
    fn orders_are_dot_products_and_follow_hand_computed_reductions() {
        for w in [4usize, 8, 16] {
            for n in [1usize, 3, 7, 8, 9, 31, 64, 65, 100, 130, 257] {
                let x: Vec<f32> = (0..n).map(|i| (i % 7) as f32 - 3.0).collect();
                let y: Vec<f32> = (0..n).map(|i| (i % 5) as f32 * 0.5).collect();
                let exact: f64 = x.iter().zip(&y).map(|(a, b)| (*a as f64) * (*b as f64)).sum();
                // Small integers and halves: every order is exact.
                assert_eq!(dot_f32_values(&x, &y, w) as f64, exact, "f32 w={w} n={n}");
                assert_eq!(dot_f16_values(&x, &y, w) as f64, exact, "f16 w={w} n={n}");
            }
        }
        // Where the order shows (w = 8): 1e8 (accumulator 0, lane 0) and -1e8 (accumulator 1, lane
        // 0) cancel in `a0 + a1` before the lanes meet, so 1.0 (accumulator 0, lane 1) survives;
        // summed in element order 1e8 + 1 rounds to 1e8 and the result would be 0.
        let mut x = vec![0.0f32; 64];
        let y = vec![1.0f32; 64];
        (x[0], x[1], x[8]) = (1e8, 1.0, -1e8);
        assert_eq!(dot_f32_values(&x, &y, 8), 1.0);
        // F16: 60000² (pair 0, lo lane 0) and -60000² (element 16: vector 1, pair 1, lo lane 0)
        // cancel in `p0 + p1`; 1 (element 2: pair 0, lo lane 1) survives.
        let (mut x, mut y) = (vec![0.0f32; 128], vec![0.0f32; 128]);
        (x[0], y[0], x[2], y[2], x[16], y[16]) = (60000.0, 60000.0, 1.0, 1.0, -60000.0, 60000.0);
        assert_eq!(dot_f16_values(&x, &y, 8), 1.0);
    }
}
