//! Seeded input data of every type: f32 values from a fixed-seed generator, converted to the
//! tensor type with `compute`'s own quantizers (ref: ggml-compute-semantics.md §2.2), or random
//! blocks with sane scales for the read-only types that have no quantizer.
//!
//! Both servers receive the same bytes, so the quantizer only has to produce valid blocks.

use compute::quant;
use compute::GgmlType;
use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Error, Result};

/// The generator for one case (`seed` is derived from the case name).
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// FNV-1a of a case name: a stable seed per case.
pub fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// `n` values, roughly normal with standard deviation `scale` (sum of four uniforms).
pub fn normal(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let s: f32 = (0..4).map(|_| rng.random::<f32>()).sum::<f32>() - 2.0;
            s * scale * 1.732_050_8
        })
        .collect()
}

/// f32 values as little-endian bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// i32 values as little-endian bytes.
pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// i64 values as little-endian bytes.
pub fn i64_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// f32 values as f16 bytes (round to nearest even).
pub fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect()
}

/// `values` (rows of `ne0`) converted to `dtype` with compute's quantizer, row by row.
pub fn convert(dtype: GgmlType, ne0: usize, values: &[f32]) -> Result<Vec<u8>> {
    let from =
        quant::kernels(dtype).from_f32.ok_or_else(|| Error::Case(format!("{dtype} has no quantizer")))?;
    let row =
        dtype.row_size(ne0 as u64).ok_or_else(|| Error::Case(format!("{dtype} row of {ne0}")))? as usize;
    if ne0 == 0 || !values.len().is_multiple_of(ne0) {
        return Err(Error::Case(format!("{} values are not rows of {ne0}", values.len())));
    }
    let mut out = vec![0u8; values.len() / ne0 * row];
    for (src, dst) in values.chunks(ne0).zip(out.chunks_mut(row)) {
        from(src, dst);
    }
    Ok(out)
}

/// `nblocks` random blocks of a read-only type, with its scale fields set to `mag`-sized values
/// so that dequantized elements are of order 1 (ref: the block layouts in `compute::quant::blocks`).
pub fn random_blocks(rng: &mut StdRng, dtype: GgmlType, nblocks: usize) -> Result<Vec<u8>> {
    let size = dtype.type_size();
    let mut raw: Vec<u8> = (0..nblocks * size).map(|_| rng.random::<u8>()).collect();
    for b in raw.chunks_mut(size) {
        match dtype {
            // d: f16 at byte 0.
            GgmlType::Q1_0 | GgmlType::Q2_0 => {
                let d = f16::from_f32(0.5 + rng.random::<f32>());
                b[..2].copy_from_slice(&d.to_le_bytes());
            }
            // qs: u8[64] then d: f16; ternary codes are 0..2 per 2 bits (3 is not a valid code).
            GgmlType::TQ2_0 => {
                for q in &mut b[..64] {
                    let mut v = 0u8;
                    for k in 0..4 {
                        v |= rng.random_range(0..3u8) << (2 * k);
                    }
                    *q = v;
                }
                let d = f16::from_f32(0.5 + rng.random::<f32>());
                b[64..66].copy_from_slice(&d.to_le_bytes());
            }
            // d: four UE4M3 sub-block scales; exponent 5..8, no NaN codes.
            GgmlType::NVFP4 => {
                for s in &mut b[..4] {
                    *s = (rng.random_range(5..9u8) << 3) | rng.random_range(0..8u8);
                }
            }
            // TQ1_0: any byte holds valid base-3 digits; d: f16 at byte 52.
            GgmlType::TQ1_0 => {
                let d = f16::from_f32(0.5 + rng.random::<f32>());
                b[52..54].copy_from_slice(&d.to_le_bytes());
            }
            // The grid types: compute's recipe (any index, sign and sub-block scale is valid).
            t if quant::testing::random_grid_blocks(t, 0, 1.0, 0).is_some() => {
                let blk = quant::testing::random_grid_blocks(t, 1, 1.0, rng.random())
                    .ok_or_else(|| Error::Case(format!("{t}")))?;
                b.copy_from_slice(&blk);
            }
            t => return Err(Error::Case(format!("no random-block recipe for {t}"))),
        }
    }
    Ok(raw)
}

/// A tensor's worth of `dtype` data: `n` normal values of deviation `scale` in rows of `ne0`,
/// quantized with compute's quantizer; random valid blocks for the types without one.
pub fn random(rng: &mut StdRng, dtype: GgmlType, ne0: usize, n: usize, scale: f32) -> Result<Vec<u8>> {
    match dtype {
        GgmlType::I32 => Ok(i32_bytes(&(0..n).map(|_| rng.random_range(-1000..1000)).collect::<Vec<_>>())),
        GgmlType::I64 => Ok(i64_bytes(&(0..n).map(|_| rng.random::<i64>()).collect::<Vec<_>>())),
        GgmlType::I16 => Ok((0..n).flat_map(|_| rng.random::<i16>().to_le_bytes()).collect()),
        t if quant::kernels(t).from_f32.is_some() => convert(t, ne0, &normal(rng, n, scale)),
        t => random_blocks(rng, t, n / t.blck_size()),
    }
}

/// Bytes of `dtype` decoded to f64 (`None` for types that cannot be decoded).
pub fn decode(dtype: GgmlType, bytes: &[u8]) -> Option<Vec<f64>> {
    match dtype {
        GgmlType::I32 => {
            Some(bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect())
        }
        GgmlType::I64 => Some(
            bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64)
                .collect(),
        ),
        t => {
            let to = quant::kernels(t).to_f32?;
            let bs = t.blck_size();
            let nblocks = bytes.len() / t.type_size();
            let mut out = vec![0f32; nblocks * bs];
            to(&bytes[..nblocks * t.type_size()], &mut out);
            Some(out.into_iter().map(f64::from).collect())
        }
    }
}
