//! ROPE (and ROPE_BACK, the same rotation with the sine negated): rotary position embedding in every mode ggml's CPU backend runs (NORMAL, NEOX, M-RoPE,
//! interleaved M-RoPE, vision), frequency factors and YaRN.
//!
//! ref: ggml-compute-semantics.md §3.3 ROPE. The multi-section modes take four positions per token
//! (`pos[i2 + s·n_tokens]` for section s: time, height, width, extra) and pick, for pair `k`, the
//! section `k mod Σsections` falls in:
//! - **M-RoPE (8)**: consecutive sections (`sections[0]` pairs of time, then height, width, extra);
//!   pairs rotate as in NEOX (`k`, `k + n_dims/2`), channels past `n_dims` are copied.
//! - **interleaved M-RoPE (40)** (Qwen3-VL): sector `s` takes height when `s mod 3 = 1` and
//!   `s < 3·sections[1]`, width when `s mod 3 = 2` and `s < 3·sections[2]`, time when `s mod 3 = 0`
//!   and `s < 3·sections[0]`, else extra; NEOX pairs.
//! - **vision (24)**: consecutive sections, each section's angle restarting at its own position
//!   (the angle's geometric progression starts again at the first pair of each section); all
//!   `ne0/2` pairs rotate, pairing `k` with `k + n_dims` (so `n_dims = ne0/2`).
//!
//! The angle for pair `k` of a section with position `p` is `p · base^(-2k/n_dims)`, computed as
//! ggml does by repeated multiplication from the first pair.

use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::graph::Node;
use crate::op::rope_mode;

use super::access::{is_float, Tv};
use super::{check_overlap, opt_tv, param_f32, shape_err, src, tv, types_err, Alias, Ctx, Kind, Plan};

/// A planned ROPE.
pub(crate) struct Rope {
    a: Tv,
    pos: Tv,
    freq: Option<Tv>,
    dst: Tv,
    n_dims: usize,
    n_offs: usize,
    mode: Mode,
    /// −1 for ROPE_BACK (the inverse rotation), else 1.
    sin_sign: f32,
    freq_base: f32,
    freq_scale: f32,
    ext_factor: f32,
    attn_factor: f32,
    corr: [f32; 2],
}

/// How pairs are formed and which position each pair's angle uses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// Adjacent channels `(2k, 2k + 1)`.
    Normal,
    /// Split halves `(k, k + n_dims/2)`.
    Neox,
    /// Split halves, angle per section (consecutive or interleaved sections).
    Multi { sections: [usize; 4], interleaved: bool },
    /// All `ne0/2` pairs `(k, k + n_dims)`, sections restart their angle.
    Vision { sections: [usize; 4] },
}

impl Mode {
    fn sections(self) -> Option<[usize; 4]> {
        match self {
            Mode::Multi { sections, .. } | Mode::Vision { sections } => Some(sections),
            _ => None,
        }
    }

    /// Which of the four positions pair `k` uses (0 time, 1 height, 2 width, 3 extra).
    fn section_of(self, k: usize) -> usize {
        let Some(s) = self.sections() else { return 0 };
        let sector = k % (s[0] + s[1] + s[2] + s[3]);
        match self {
            Mode::Multi { interleaved: true, .. } => {
                if sector % 3 == 1 && sector < 3 * s[1] {
                    1
                } else if sector % 3 == 2 && sector < 3 * s[2] {
                    2
                } else if sector.is_multiple_of(3) && sector < 3 * s[0] {
                    0
                } else {
                    3
                }
            }
            _ => {
                if sector < s[0] {
                    0
                } else if sector < s[0] + s[1] {
                    1
                } else if sector < s[0] + s[1] + s[2] {
                    2
                } else {
                    3
                }
            }
        }
    }

    /// For vision: whether pair `k` starts a section (its angle restarts at the section's position).
    fn restarts(self, k: usize) -> Option<usize> {
        let Mode::Vision { sections: s } = self else { return None };
        let sector = k % (s[0] + s[1] + s[2] + s[3]);
        [0, s[0], s[0] + s[1], s[0] + s[1] + s[2]].iter().position(|&b| b == sector)
    }
}

/// The YaRN correction dimension for `n_rot` rotations (ref: §3.3 ROPE corr_dims).
fn corr_dim(n_dims: usize, n_ctx_orig: i32, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln())
}

/// `[low, high]` of the YaRN ramp.
pub(crate) fn corr_dims(
    n_dims: usize,
    n_ctx_orig: i32,
    base: f32,
    beta_fast: f32,
    beta_slow: f32,
) -> [f32; 2] {
    let start = corr_dim(n_dims, n_ctx_orig, beta_fast, base).floor();
    let end = corr_dim(n_dims, n_ctx_orig, beta_slow, base).ceil();
    [start.max(0.0), end.min(n_dims as f32 - 1.0)]
}

/// Validates ROPE.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let (a, pos, dst) = unsafe { (tv(src(n, 0)?)?, tv(src(n, 1)?)?, tv(&n.dst)?) };
    // SAFETY: forwarded contract.
    let freq = unsafe { opt_tv(n, 2)? };
    let sections = [11, 12, 13, 14].map(|i| n.op_params[i]);
    let mode = match n.op_params[2] {
        rope_mode::NORMAL => Mode::Normal,
        rope_mode::NEOX => Mode::Neox,
        m @ (rope_mode::MROPE | rope_mode::IMROPE | rope_mode::VISION) => {
            if sections.iter().any(|&s| s < 0) || sections.iter().map(|&s| s as i64).sum::<i64>() <= 0 {
                return Err(shape_err(op, format!("rope sections {sections:?}")));
            }
            let sections = sections.map(|s| s as usize);
            if sections.iter().sum::<usize>() > a.ne[0] {
                return Err(shape_err(op, format!("rope sections {sections:?} for rows of {}", a.ne[0])));
            }
            match m {
                rope_mode::VISION => Mode::Vision { sections },
                _ => Mode::Multi { sections, interleaved: m == rope_mode::IMROPE },
            }
        }
        m => {
            return Err(Error::UnsupportedOp {
                op,
                detail: format!("rope mode {m} (ggml's CPU backend runs 0, 2, 8, 24 and 40)"),
            })
        }
    };
    if !is_float(a.dtype()) || !is_float(dst.dtype()) || pos.dtype() != GgmlType::I32 {
        return Err(types_err(op, format!("x {} positions {} dst {}", a.dtype(), pos.dtype(), dst.dtype())));
    }
    if a.ne != dst.ne {
        return Err(shape_err(op, format!("src0 {:?} vs dst {:?}", a.ne, dst.ne)));
    }
    let n_dims = n.op_params[1];
    let n_offs = n.op_params[15];
    if n_dims <= 0
        || n_dims % 2 != 0
        || n_offs < 0
        || (n_dims as usize).saturating_add(n_offs as usize) > a.ne[0]
    {
        return Err(shape_err(op, format!("n_dims {n_dims}, n_offs {n_offs} for rows of {}", a.ne[0])));
    }
    let (n_dims, n_offs) = (n_dims as usize, n_offs as usize);
    let per_token = if mode.sections().is_some() { 4 } else { 1 };
    if pos.ne[0] < a.ne[2].saturating_mul(per_token) {
        return Err(shape_err(op, format!("{} positions for {} tokens × {per_token}", pos.ne[0], a.ne[2])));
    }
    if matches!(mode, Mode::Vision { .. }) && (2 * n_dims != a.ne[0] || n_offs != 0) {
        return Err(shape_err(op, format!("vision rope needs n_dims = ne0/2, got {n_dims} for {}", a.ne[0])));
    }
    // Pairs that get an angle: n_dims/2, or every pair of the row in vision mode.
    let n_pairs = if matches!(mode, Mode::Vision { .. }) { a.ne[0] / 2 } else { n_dims / 2 };
    if let Some(f) = &freq {
        if f.dtype() != GgmlType::F32 || f.ne[0] < n_pairs {
            return Err(shape_err(op, format!("frequency factors {} {:?}", f.dtype(), f.ne)));
        }
        check_overlap(op, &dst, f, Alias::Never)?;
    }
    check_overlap(op, &dst, &a, Alias::RowLocal)?;
    check_overlap(op, &dst, &pos, Alias::Never)?;
    let freq_base = param_f32(n, 5);
    let corr = corr_dims(n_dims, n.op_params[4], freq_base, param_f32(n, 9), param_f32(n, 10));
    let plan = Rope {
        a,
        pos,
        freq,
        dst,
        n_dims,
        n_offs,
        mode,
        sin_sign: if op == crate::op::GgmlOp::RopeBack { -1.0 } else { 1.0 },
        freq_base,
        freq_scale: param_f32(n, 6),
        ext_factor: param_f32(n, 7),
        attn_factor: param_f32(n, 8),
        corr,
    };
    Ok(super::simple(Kind::Rope(Box::new(plan)), a.ne[0] + 2 * n_pairs))
}

impl Rope {
    /// Pairs that get an angle.
    fn n_pairs(&self) -> usize {
        if matches!(self.mode, Mode::Vision { .. }) {
            self.dst.ne[0] / 2
        } else {
            self.n_dims / 2
        }
    }

    /// Fills `cache` with (cos, sin) for each pair at positions `p` (one per section; the plain
    /// modes use `p[0]`).
    fn fill_cache(&self, p: [f32; 4], cache: &mut [f32]) {
        let theta_scale = self.freq_base.powf(-2.0 / self.n_dims as f32);
        let mut theta = p;
        for k in 0..self.n_pairs() {
            if let Some(s) = self.mode.restarts(k) {
                theta[s] = p[s];
            }
            let ff = self.freq.as_ref().map_or(1.0, |f| f.get_f32(k, 0, 0, 0));
            let theta_extrap = theta[self.mode.section_of(k)] / ff;
            let theta_interp = self.freq_scale * theta_extrap;
            let mut th = theta_interp;
            let mut mscale = self.attn_factor;
            if self.ext_factor != 0.0 {
                let y = (k as f32 - self.corr[0]) / (self.corr[1] - self.corr[0]).max(0.001);
                let ramp = 1.0 - y.clamp(0.0, 1.0);
                let mix = ramp * self.ext_factor;
                // Fused as ggml's x86 builds compute them (the compiler contracts the first
                // product of each sum into a multiply-add).
                th = theta_interp.mul_add(1.0 - mix, theta_extrap * mix);
                mscale *= 0.1f32.mul_add((1.0 / self.freq_scale).ln(), 1.0);
            }
            cache[2 * k] = th.cos() * mscale;
            cache[2 * k + 1] = th.sin() * mscale * self.sin_sign;
            for t in theta.iter_mut() {
                *t *= theta_scale;
            }
        }
    }

    /// The four section positions of token `i2` (`pos[i2 + s·n_tokens]`), or its one position.
    fn positions(&self, i2: usize) -> [f32; 4] {
        match self.mode.sections() {
            Some(_) => {
                let nt = self.dst.ne[2];
                std::array::from_fn(|s| self.pos.get_index(i2 + s * nt, 0, 0, 0) as f32)
            }
            None => [self.pos.get_index(i2, 0, 0, 0) as f32; 4],
        }
    }

    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        let d = &self.dst;
        let n0 = d.ne[0];
        let n_pairs = self.n_pairs();
        let mut cached: Option<(usize, usize)> = None;
        for r in ctx.range(d.nrows()) {
            let (i1, i2, i3) = d.unravel_row(r);
            let (x, cache) = ctx.local.split_at_mut(n0);
            if cached != Some((i2, i3)) {
                self.fill_cache(self.positions(i2), cache);
                cached = Some((i2, i3));
            }
            self.a.load_row(i1, i2, i3, x);
            let w = &mut x[self.n_offs..];
            let stride = match self.mode {
                Mode::Normal => 0,
                Mode::Neox | Mode::Multi { .. } => self.n_dims / 2,
                Mode::Vision { .. } => self.n_dims,
            };
            let vector = vector_pairs(self.mode, self.n_dims, self.a.dtype() == crate::dtype::GgmlType::F32);
            rotate_row(w, cache, n_pairs, stride, vector);
            d.store_row(i1, i2, i3, x);
        }
    }
}

/// Rotates the first `n_pairs` pairs of `w` by the (cos, sin) pairs of `cache`: pair `k` is
/// `(w[2k], w[2k+1])` when `stride` is 0, else `(w[k], w[k + stride])`; the first `vector` pairs
/// in the other contraction (see [`vector_pairs`]).
#[inline(always)]
fn rotate(w: &mut [f32], cache: &[f32], n_pairs: usize, stride: usize, vector: usize) {
    for k in 0..n_pairs {
        let (c, s) = (cache[2 * k], cache[2 * k + 1]);
        let (j0, j1) = if stride == 0 { (2 * k, 2 * k + 1) } else { (k, k + stride) };
        let (x0, x1) = (w[j0], w[j1]);
        w[j0] = if k < vector {
            // GCC's vectorised NORMAL loop on aarch64 (`ld2`, `fmul` + `fmls`).
            (-x1).mul_add(s, x0 * c)
        } else {
            x0.mul_add(c, -(x1 * s))
        };
        w[j1] = x0.mul_add(s, x1 * c);
    }
}

/// [`rotate`] compiled with the FMA instructions: x86-64's baseline has none, so there `mul_add`
/// is a call to libm's `fmaf` per product (the same correctly rounded result, ~5 % of a batched
/// generation step).
///
/// # Safety
/// The CPU has FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn rotate_fma(w: &mut [f32], cache: &[f32], n_pairs: usize, stride: usize, vector: usize) {
    rotate(w, cache, n_pairs, stride, vector);
}

/// [`rotate`] with the fused instructions where the CPU has them (the same bits either way: a
/// fused multiply-add is one rounding, in hardware or in libm).
fn rotate_row(w: &mut [f32], cache: &[f32], n_pairs: usize, stride: usize, vector: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: FMA detected above.
        unsafe { rotate_fma(w, cache, n_pairs, stride, vector) };
        return;
    }
    rotate(w, cache, n_pairs, stride, vector);
}

/// How many leading pairs of a row ggml's build rotates with the other contraction: ggml's
/// `rotate_pairs` is C++ compiled with FP contraction, `x0*cos - x1*sin` and `x0*sin + x1*cos` each
/// fused once. Scalar code (and x86's vectorised loops) fuse the `x0` product; on aarch64 GCC 12
/// vectorises the NORMAL mode loop (pairs interleaved, `ld2`/`st2`, read off the disassembly of the
/// reference built by tests/peer/build-peer-aarch64.sh) when `n_dims > 6`, four pairs at a time, and
/// there rounds `x0*cos` and fuses `x1*sin` in the first output (the second is fused as in scalar
/// code); the last `pairs % 4` stay scalar. Only
/// the F32 instance is vectorised (`f32`: the rows are F32); the F16 one stays scalar. ggml's SVE
/// build vectorises the same loop with predicated `ld2w`/`st2w` over every pair, but there computes
/// both outputs in the scalar contraction (`fmul x1·sin` then `fnmls` with `x0·cos`; `fmul x1·cos`
/// then `fmla` with `x0·sin`), so under the `sve` profile no pair takes the other one.
fn vector_pairs(mode: Mode, n_dims: usize, f32: bool) -> usize {
    if cfg!(target_arch = "aarch64")
        && f32
        && matches!(mode, Mode::Normal)
        && n_dims > 6
        && crate::numerics::active() != crate::numerics::Numerics::Sve
    {
        n_dims / 2 / 4 * 4
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The FMA-instruction form against libm's `fmaf` (the plain build), bit for bit, both
    /// contractions and both pair layouts, with magnitudes where a rounded product would differ.
    #[test]
    fn fused_instructions_equal_libm_fma_bitwise() {
        let mut r = rand::rngs::StdRng::seed_from_u64(31);
        for (stride, vector) in [(0, 0), (0, 8), (32, 0), (32, 16)] {
            let n_pairs = 32;
            let w0: Vec<f32> = (0..64).map(|_| (r.random::<f32>() - 0.5) * 1e4).collect();
            let cache: Vec<f32> = (0..64).map(|_| r.random::<f32>() * 2.0 - 1.0).collect();
            let mut plain = w0.clone();
            rotate(&mut plain, &cache, n_pairs, stride, vector);
            let mut fast = w0.clone();
            rotate_row(&mut fast, &cache, n_pairs, stride, vector);
            assert_eq!(
                plain.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                fast.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "stride {stride}, vector {vector}"
            );
            // And the rotation is one: |(x0, x1)| is kept within rounding when |(c, s)| = 1.
            let mut unit = w0.clone();
            let cs: Vec<f32> = (0..32).flat_map(|k| [(k as f32).cos(), (k as f32).sin()]).collect();
            rotate_row(&mut unit, &cs, n_pairs, 0, 0);
            for k in 0..32 {
                let before = (w0[2 * k] as f64).hypot(w0[2 * k + 1] as f64);
                let after = (unit[2 * k] as f64).hypot(unit[2 * k + 1] as f64);
                assert!((before - after).abs() <= 1e-5 * before + 1e-3, "pair {k}: {before} vs {after}");
            }
        }
    }
}
