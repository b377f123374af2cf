//! The K-quant packers: the inverses of the unpackers in `kquants`, used by the reference
//! quantizers in `refquant` (and by tests that build blocks from chosen quants).

use crate::dtype::QK_K;

// ---- packers (inverses of the unpackers in `kquants`) ----

/// Packs 2-bit quants in element order into Q2_K/Q3_K's `qs` layout.
pub fn q2k_pack(q: &[u8; QK_K]) -> [u8; QK_K / 4] {
    let mut qs = [0u8; QK_K / 4];
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                qs[n * 32 + l] |= (q[n * 128 + j * 32 + l] & 3) << (2 * j);
            }
        }
    }
    qs
}

/// Packs Q3_K quants (-4..=3) into `(hmask, qs)`.
pub fn q3k_pack(q: &[i8; QK_K]) -> ([u8; QK_K / 8], [u8; QK_K / 4]) {
    let u: [u8; QK_K] = q.map(|v| (v + 4) as u8);
    let mut hmask = [0u8; QK_K / 8];
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                hmask[l] |= (u[n * 128 + j * 32 + l] >> 2) << (n * 4 + j);
            }
        }
    }
    (hmask, q2k_pack(&u.map(|v| v & 3)))
}

/// Packs 16 Q3_K scales (-32..=31) into 12 bytes.
pub fn q3k_pack_scales(sc: &[i8; 16]) -> [u8; 12] {
    let u = sc.map(|v| (v + 32) as u8);
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = (u[j] & 0xF) | ((u[8 + j] & 0xF) << 4);
        s[4 + j] = (u[4 + j] & 0xF) | ((u[12 + j] & 0xF) << 4);
        s[8 + j] = (u[j] >> 4) | ((u[4 + j] >> 4) << 2) | ((u[8 + j] >> 4) << 4) | ((u[12 + j] >> 4) << 6);
    }
    s
}

/// Packs 8 6-bit scales and mins of Q4_K/Q5_K into 12 bytes.
pub fn k4_pack_scales(sc: &[u8; 8], mn: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4);
    }
    s
}

/// Packs Q4_K nibbles in element order.
pub fn q4k_pack(q: &[u8; QK_K]) -> [u8; QK_K / 2] {
    std::array::from_fn(|i| {
        let (c, l) = (i / 32, i % 32);
        (q[c * 64 + l] & 0xF) | ((q[c * 64 + 32 + l] & 0xF) << 4)
    })
}

/// Packs Q5_K quants (0..=31) into `(qh, qs)`.
pub fn q5k_pack(q: &[u8; QK_K]) -> ([u8; QK_K / 8], [u8; QK_K / 2]) {
    let mut qh = [0u8; QK_K / 8];
    for c in 0..4 {
        for l in 0..32 {
            qh[l] |= ((q[c * 64 + l] >> 4) & 1) << (2 * c);
            qh[l] |= ((q[c * 64 + 32 + l] >> 4) & 1) << (2 * c + 1);
        }
    }
    (qh, q4k_pack(q))
}

/// Packs Q6_K quants (-32..=31) into `(ql, qh)`.
pub fn q6k_pack(q: &[i8; QK_K]) -> ([u8; QK_K / 2], [u8; QK_K / 4]) {
    let u: [u8; QK_K] = q.map(|v| (v + 32) as u8);
    let (mut ql, mut qh) = ([0u8; QK_K / 2], [0u8; QK_K / 4]);
    for n in 0..2 {
        for l in 0..32 {
            let e = n * 128 + l;
            ql[n * 64 + l] = (u[e] & 0xF) | ((u[e + 64] & 0xF) << 4);
            ql[n * 64 + l + 32] = (u[e + 32] & 0xF) | ((u[e + 96] & 0xF) << 4);
            qh[n * 32 + l] =
                (u[e] >> 4) | ((u[e + 32] >> 4) << 2) | ((u[e + 64] >> 4) << 4) | ((u[e + 96] >> 4) << 6);
        }
    }
    (ql, qh)
}
