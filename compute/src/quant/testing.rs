//! Valid random blocks of the types no quantizer writes (the grid-based IQ types): for tests and
//! benchmarks that need weights of those types (differential op tests, tiny models, speed tables).
//!
//! Any grid index, sign pattern and sub-block scale is a valid encoding; only the f16 super-block
//! scale must be a finite number of the right size. It is set so that elements are of order
//! `mag` (grid magnitudes reach 62 and sub-block scales 31 for IQ3, 43 and 31 for IQ2, 1.125 and 15
//! for IQ1). Deterministic in `seed`.

use crate::dtype::GgmlType;

/// A small xorshift generator for test data (no dependency; quality is irrelevant here). The seed
/// must not be 0.
pub struct Xorshift(pub u64);

impl Xorshift {
    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// `nblocks` random blocks of the grid type `t` (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
/// IQ3_S) with elements of order `mag`; `None` for other types (quantize values instead).
pub fn random_grid_blocks(t: GgmlType, nblocks: usize, mag: f32, seed: u64) -> Option<Vec<u8>> {
    use GgmlType::*;
    // The largest |element| per unit of d, roughly: grid magnitude × sub-block scale × constant.
    let per_d = match t {
        IQ2_XXS | IQ2_XS | IQ2_S => 43.0 * 31.0 * 0.125,
        IQ3_XXS => 62.0 * 31.0 * 0.25,
        IQ3_S => 15.0 * 31.0,
        IQ1_S | IQ1_M => 1.125 * 15.0,
        _ => return None,
    };
    let size = t.type_size();
    let mut rng = Xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut out = vec![0u8; nblocks * size];
    for b in out.chunks_exact_mut(size) {
        for x in b.iter_mut() {
            *x = rng.next_u64() as u8;
        }
        // Typical elements sit well below the largest: aim the largest at a few times `mag`.
        let d = (4.0 * mag / per_d) * (0.5 + rng.unit());
        let bits = half::f16::from_f32(d).to_bits();
        if t == IQ1_M {
            // The scale is spread over the top nibbles of the four u16 scale words (bytes 48..56).
            for i in 0..4 {
                let hi = &mut b[48 + 2 * i + 1];
                *hi = (*hi & 0x0F) | ((((bits >> (4 * i)) & 0xF) as u8) << 4);
            }
        } else {
            b[..2].copy_from_slice(&bits.to_le_bytes());
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::kernels;

    #[test]
    fn random_grid_blocks_decode_to_finite_values_of_the_asked_size() {
        for t in [
            GgmlType::IQ1_S,
            GgmlType::IQ1_M,
            GgmlType::IQ2_XXS,
            GgmlType::IQ2_XS,
            GgmlType::IQ2_S,
            GgmlType::IQ3_XXS,
            GgmlType::IQ3_S,
        ] {
            let raw = random_grid_blocks(t, 16, 1.0, 7).unwrap();
            let mut v = vec![0f32; 16 * 256];
            (kernels(t).to_f32.unwrap())(&raw, &mut v);
            let rms = (v.iter().map(|x| (x * x) as f64).sum::<f64>() / v.len() as f64).sqrt();
            assert!(v.iter().all(|x| x.is_finite()), "{t}");
            assert!((0.05..20.0).contains(&rms), "{t}: rms {rms}");
        }
        assert!(random_grid_blocks(GgmlType::Q4_K, 1, 1.0, 1).is_none());
    }
}
