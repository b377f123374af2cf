//! Scalar models of ggml's x86 BF16 dot products: the bit-exact twins of the kernels the `avx2` and
//! `avx512` numerics profiles install (`quant::x86_64::avx2::float`, `quant::x86_64::bf16_512`), read
//! from ggml-cpu's `ggml_vec_dot_bf16` (`vec.cpp`) and llamafile's tinyBLAS (`sgemm.cpp`) and from both
//! reference builds' machine code.
//!
//! * AVX2 `vec_dot`: four 8-lane accumulators over steps of 32 elements, `acc_k = fma(x, y, acc_k)`
//!   (GCC contracts ggml's `add(mul(x, y), acc)`), reduced as `(a0 + a2) + (a1 + a3)` and then
//!   `hsum_float_8`; the sum goes to an f64 (`0.0 + sum`), the leftovers past the last 32 elements are
//!   added in f64 as rounded f32 products, and the f64 is rounded to f32.
//! * AVX2 tinyBLAS (matrix products of two or more activation rows, shared dimension a multiple of
//!   8, else `vec_dot`): one 8-lane accumulator per output, `fma` per 8 elements, `hsum_float_8`.
//! * AVX512-BF16 `vec_dot` (ggml built natively for a CPU with `avx512bf16`): two 16-lane
//!   `vdpbf16ps` accumulators over steps of 64 elements (the first and second 32), each reduced
//!   with GCC's `_mm512_reduce_add_ps` and added in f64 (`(0.0 + r1) + r2`), leftovers as above.
//! * AVX512-BF16 tinyBLAS (shared dimension a multiple of 32, else `vec_dot`): one `vdpbf16ps`
//!   accumulator per output, one instruction per 32 elements, `_mm512_reduce_add_ps`.
//!
//! `vdpbf16ps` lane `j` adds the products of elements `2j + 1` and then `2j` to the f32 lane, each
//! add rounded to nearest even (the bf16 products are exact in f32), with bf16 denormal inputs read
//! as zero and denormal results flushed to zero (no MXCSR).

use crate::quant::blocks::bf16_bits_to_f32;

use super::kquants_x86::hsum8;

/// Element `i` of a bf16 row.
fn bf(b: &[u8], i: usize) -> f32 {
    bf16_bits_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]))
}

fn check(n: usize, x: &[u8], y: &[u8]) {
    assert!(x.len() >= 2 * n && y.len() >= 2 * n, "vec_dot: rows shorter than {n} elements");
}

/// GCC's `_mm512_reduce_add_ps`: the 256-bit halves added, then [`hsum8`].
fn reduce16(a: [f32; 16]) -> f32 {
    hsum8(std::array::from_fn(|j| a[j + 8] + a[j]))
}

/// The leftovers from `from` on, added in f64 to `sum` as rounded f32 products; the result in f32.
fn tail_f64(n: usize, x: &[u8], y: &[u8], from: usize, mut sum: f64) -> f32 {
    for i in from..n {
        sum += (bf(x, i) * bf(y, i)) as f64;
    }
    sum as f32
}

/// BF16 · BF16 as ggml's AVX2 `ggml_vec_dot_bf16`.
pub fn vec_dot_bf16_avx2_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y);
    let head = n / 32 * 32;
    let mut acc = [[0f32; 8]; 4];
    for i in (0..head).step_by(32) {
        for (k, a) in acc.iter_mut().enumerate() {
            for (l, a) in a.iter_mut().enumerate() {
                let e = i + 8 * k + l;
                *a = bf(x, e).mul_add(bf(y, e), *a);
            }
        }
    }
    let v: [f32; 8] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    tail_f64(n, x, y, head, 0.0 + hsum8(v) as f64)
}

/// BF16 · BF16 in the order of ggml's AVX2 tinyBLAS (`n % 8 == 0`, else [`vec_dot_bf16_avx2_x86`]).
pub fn vec_dot_bf16_gemm_avx2_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y);
    if !n.is_multiple_of(8) {
        return vec_dot_bf16_avx2_x86(n, x, y);
    }
    let mut acc = [0f32; 8];
    for i in (0..n).step_by(8) {
        for (l, a) in acc.iter_mut().enumerate() {
            *a = bf(x, i + l).mul_add(bf(y, i + l), *a);
        }
    }
    hsum8(acc)
}

/// `v`, or zero of its sign where it is denormal.
fn flush(v: f32) -> f32 {
    if v.is_subnormal() {
        0.0f32.copysign(v)
    } else {
        v
    }
}

/// One `vdpbf16ps` lane: `acc + x1·y1`, rounded, then `+ x0·y0`, rounded (DAZ inputs, FTZ results).
fn dpbf16_lane(acc: f32, x: [f32; 2], y: [f32; 2]) -> f32 {
    let [x0, x1] = x.map(flush);
    let [y0, y1] = y.map(flush);
    let acc = flush(x1.mul_add(y1, flush(acc)));
    flush(x0.mul_add(y0, acc))
}

/// `vdpbf16ps` over the 32 elements from `i`: 16 lanes of element pairs.
fn dpbf16(acc: &mut [f32; 16], x: &[u8], y: &[u8], i: usize) {
    for (j, a) in acc.iter_mut().enumerate() {
        let e = i + 2 * j;
        *a = dpbf16_lane(*a, [bf(x, e), bf(x, e + 1)], [bf(y, e), bf(y, e + 1)]);
    }
}

/// BF16 · BF16 as ggml's `ggml_vec_dot_bf16` built for AVX512-BF16.
pub fn vec_dot_bf16_avx512bf16_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y);
    let head = n / 64 * 64;
    let (mut c1, mut c2) = ([0f32; 16], [0f32; 16]);
    for i in (0..head).step_by(64) {
        dpbf16(&mut c1, x, y, i);
        dpbf16(&mut c2, x, y, i + 32);
    }
    let sum = (0.0 + reduce16(c1) as f64) + reduce16(c2) as f64;
    tail_f64(n, x, y, head, sum)
}

/// BF16 · BF16 in the order of tinyBLAS built for AVX512-BF16 (`n % 32 == 0`, else
/// [`vec_dot_bf16_avx512bf16_x86`]).
pub fn vec_dot_bf16_gemm_avx512bf16_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y);
    if !n.is_multiple_of(32) {
        return vec_dot_bf16_avx512bf16_x86(n, x, y);
    }
    let mut acc = [0f32; 16];
    for i in (0..n).step_by(32) {
        dpbf16(&mut acc, x, y, i);
    }
    reduce16(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpbf16_lane_adds_the_odd_product_first() {
        // Each add rounds: 1 + 2^-24 is a tie that rounds to 1, twice (the products summed first
        // would give 1 + 2^-23, which is exact).
        let t = 2f32.powi(-24);
        assert_eq!(dpbf16_lane(1.0, [1.0, 1.0], [t, t]), 1.0);
        // acc = 0: the odd product lands exactly, then the even one adds to it.
        assert_eq!(dpbf16_lane(0.0, [3.0, 5.0], [1.0, 1.0]), 8.0);
        // A denormal input reads as zero.
        assert_eq!(dpbf16_lane(1.0, [f32::from_bits(1), 0.0], [1e30, 0.0]), 1.0);
    }
}
