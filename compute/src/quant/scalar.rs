//! Scalar reference kernels: the specification every SIMD path is tested against.

use half::f16;

/// f32 → f32 copy.
pub fn f32_to_f32(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

/// f32 → f32 store.
pub fn f32_from_f32(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(4)) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}

/// f16 → f32 widening (exact).
pub fn f16_to_f32(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
    }
}

/// f32 → f16 narrowing, round to nearest even (ref: ggml-compute-semantics.md §1.7).
pub fn f16_from_f32(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&f16::from_f32(*s).to_bits().to_le_bytes());
    }
}

/// f32 · f32.
pub fn vec_dot_f32_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sum = 0.0f64;
    for (a, b) in x.chunks_exact(4).zip(y.chunks_exact(4)).take(n) {
        sum += f32::from_le_bytes([a[0], a[1], a[2], a[3]]) as f64 * f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64;
    }
    sum as f32
}

/// f16 · f16, products summed in f64.
pub fn vec_dot_f16_f16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sum = 0.0f64;
    for (a, b) in x.chunks_exact(2).zip(y.chunks_exact(2)).take(n) {
        let a = f16::from_bits(u16::from_le_bytes([a[0], a[1]])).to_f32();
        let b = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
        sum += (a * b) as f64;
    }
    sum as f32
}
