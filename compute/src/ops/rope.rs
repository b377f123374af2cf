//! ROPE: rotary position embedding, NORMAL and NEOX modes, frequency factors and YaRN.
//!
//! ref: ggml-compute-semantics.md §3.3 ROPE. M-RoPE, vision and interleaved M-RoPE modes are
//! refused (the target text models do not use them).

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
    neox: bool,
    freq_base: f32,
    freq_scale: f32,
    ext_factor: f32,
    attn_factor: f32,
    corr: [f32; 2],
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
    let mode = n.op_params[2];
    if mode != rope_mode::NORMAL && mode != rope_mode::NEOX {
        return Err(Error::UnsupportedOp { op, detail: format!("rope mode {mode} (only NORMAL and NEOX)") });
    }
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
    if pos.ne[0] < a.ne[2] {
        return Err(shape_err(op, format!("{} positions for {} tokens", pos.ne[0], a.ne[2])));
    }
    if let Some(f) = &freq {
        if f.dtype() != GgmlType::F32 || f.ne[0] < n_dims / 2 {
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
        neox: mode == rope_mode::NEOX,
        freq_base,
        freq_scale: param_f32(n, 6),
        ext_factor: param_f32(n, 7),
        attn_factor: param_f32(n, 8),
        corr,
    };
    Ok(super::simple(Kind::Rope(Box::new(plan)), a.ne[0] + n_dims))
}

impl Rope {
    /// Fills `cache` with (cos, sin) for each pair at position `p`.
    fn fill_cache(&self, p: f32, cache: &mut [f32]) {
        let theta_scale = self.freq_base.powf(-2.0 / self.n_dims as f32);
        let mut theta = p;
        for k in 0..self.n_dims / 2 {
            let ff = self.freq.as_ref().map_or(1.0, |f| f.get_f32(k, 0, 0, 0));
            let theta_extrap = theta / ff;
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
            cache[2 * k + 1] = th.sin() * mscale;
            theta *= theta_scale;
        }
    }

    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        let d = &self.dst;
        let n0 = d.ne[0];
        let half = self.n_dims / 2;
        let mut cached: Option<(usize, usize)> = None;
        for r in ctx.range(d.nrows()) {
            let (i1, i2, i3) = d.unravel_row(r);
            let (x, cache) = ctx.local.split_at_mut(n0);
            if cached != Some((i2, i3)) {
                let p = self.pos.get_index(i2, 0, 0, 0) as f32;
                self.fill_cache(p, cache);
                cached = Some((i2, i3));
            }
            self.a.load_row(i1, i2, i3, x);
            let w = &mut x[self.n_offs..self.n_offs + self.n_dims];
            for k in 0..half {
                let (c, s) = (cache[2 * k], cache[2 * k + 1]);
                let (j0, j1) = if self.neox { (k, k + half) } else { (2 * k, 2 * k + 1) };
                let (x0, x1) = (w[j0], w[j1]);
                w[j0] = x0.mul_add(c, -(x1 * s));
                w[j1] = x0.mul_add(s, x1 * c);
            }
            d.store_row(i1, i2, i3, x);
        }
    }
}
