//! Element-wise ops of one operand (UNARY, SQR, SQRT, LOG, SIN, COS, SCALE, CLAMP, FILL) and GLU.
//!
//! ref: ggml-compute-semantics.md §3.3 UNARY, GLU, SCALE, CLAMP, FILL. GELU, GELU_QUICK and the
//! GEGLU variants go through the f16 lookup table the ggml CPU backend uses, so their results
//! carry f16 precision exactly as ggml's do.

use std::sync::OnceLock;

use half::f16;

use crate::error::{Error, Result};
use crate::graph::Node;
use crate::op::{GgmlOp, GluOp, UnaryOp};

use super::access::{is_float, Tv};
use super::{check_overlap, opt_tv, param_f32, shape_err, src, tv, types_err, Alias, Ctx, Kind, Plan};

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_COEF_A: f32 = 0.044_715;
const GELU_QUICK_COEF: f32 = -1.702;

/// tanh-approximated GELU in f32 (the function the table is filled from).
///
/// `1 + a·x·x` is one fused multiply-add, `fma(a·x, x, 1)`, as in ggml's x86 builds (the compiler
/// contracts it there): the f16 table then equals ggml's entry for entry (one entry, at
/// x = -1.999, differs otherwise).
pub fn gelu_f32(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (GELU_COEF_A * x).mul_add(x, 1.0)).tanh())
}

/// GELU_QUICK in f32.
pub fn gelu_quick_f32(x: f32) -> f32 {
    x * (1.0 / (1.0 + (GELU_QUICK_COEF * x).exp()))
}

fn table(f: fn(f32) -> f32) -> Box<[u16]> {
    (0..=u16::MAX).map(|h| f16::from_f32(f(f16::from_bits(h).to_f32())).to_bits()).collect()
}

fn gelu_table() -> &'static [u16] {
    static T: OnceLock<Box<[u16]>> = OnceLock::new();
    T.get_or_init(|| table(gelu_f32))
}

fn gelu_quick_table() -> &'static [u16] {
    static T: OnceLock<Box<[u16]>> = OnceLock::new();
    T.get_or_init(|| table(gelu_quick_f32))
}

/// GELU as the ggml CPU backend evaluates it on f32 (f16 table between -10 and 10).
pub fn gelu_ggml(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        f16::from_bits(gelu_table()[f16::from_f32(x).to_bits() as usize]).to_f32()
    }
}

/// GELU_QUICK as the ggml CPU backend evaluates it on f32 (f16 table).
pub fn gelu_quick_ggml(x: f32) -> f32 {
    f16::from_bits(gelu_quick_table()[f16::from_f32(x).to_bits() as usize]).to_f32()
}

/// The error function, |error| < 1.2e-7 (Numerical Recipes' erfc Chebyshev fit, in f64).
pub fn erf(x: f32) -> f32 {
    let x = x as f64;
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * poly.exp();
    (if x >= 0.0 { 1.0 - erfc } else { erfc - 1.0 }) as f32
}

/// GELU with the exact error function.
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// SiLU.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[derive(Clone, Copy)]
enum Func {
    Unary(UnaryOp, [f32; 4]),
    Sqr,
    Sqrt,
    Log,
    Sin,
    Cos,
    Scale(f32, f32),
    Clamp(f32, f32),
    Fill(f32),
    /// `max(x, 0) + slope·min(x, 0)`.
    LeakyRelu(f32),
}

fn eval(f: Func, x: f32) -> f32 {
    match f {
        Func::Sqr => x * x,
        Func::Sqrt => x.sqrt(),
        Func::Log => x.ln(),
        Func::Sin => x.sin(),
        Func::Cos => x.cos(),
        Func::Scale(s, b) => {
            if b == 0.0 {
                x * s
            } else {
                x * s + b
            }
        }
        Func::Clamp(lo, hi) => x.max(lo).min(hi),
        Func::Fill(c) => c,
        Func::LeakyRelu(slope) => (if x > 0.0 { x } else { 0.0 }) + slope * (if x < 0.0 { x } else { 0.0 }),
        Func::Unary(u, p) => match u {
            UnaryOp::Abs => x.abs(),
            UnaryOp::Sgn => {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            }
            UnaryOp::Neg => -x,
            UnaryOp::Step => {
                if x > 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Elu => {
                if x > 0.0 {
                    x
                } else {
                    x.exp_m1()
                }
            }
            UnaryOp::Relu => {
                if x > 0.0 {
                    x
                } else {
                    0.0
                }
            }
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Gelu => gelu_ggml(x),
            UnaryOp::GeluQuick => gelu_quick_ggml(x),
            UnaryOp::Silu => silu(x),
            UnaryOp::Hardswish => x * ((x + 3.0) / 6.0).clamp(0.0, 1.0),
            UnaryOp::Hardsigmoid => ((x + 3.0) / 6.0).clamp(0.0, 1.0),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Expm1 => x.exp_m1(),
            UnaryOp::Softplus => {
                if x > 20.0 {
                    x
                } else {
                    x.exp().ln_1p()
                }
            }
            UnaryOp::GeluErf => gelu_erf(x),
            UnaryOp::Xielu => {
                // op_params f32[1..5] = alpha_n, alpha_p, beta, eps.
                let (alpha_n, alpha_p, beta, eps) = (p[0], p[1], p[2], p[3]);
                if x > 0.0 {
                    alpha_p * x * x + beta * x
                } else {
                    ((x.min(eps)).exp_m1() - x) * alpha_n + beta * x
                }
            }
            UnaryOp::Floor => x.floor(),
            UnaryOp::Ceil => x.ceil(),
            UnaryOp::Round => x.round(),
            UnaryOp::Trunc => x.trunc(),
        },
    }
}

/// A planned one-operand element-wise op.
pub(crate) struct Unary {
    a: Option<Tv>,
    dst: Tv,
    f: Func,
}

/// Validates UNARY and the other one-operand element-wise ops.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let dst = unsafe { tv(&n.dst)? };
    let f = match op {
        GgmlOp::Unary => {
            let u = UnaryOp::from_i32(n.op_params[0])
                .ok_or_else(|| Error::UnsupportedOp { op, detail: format!("unary op {}", n.op_params[0]) })?;
            let p = [param_f32(n, 1), param_f32(n, 2), param_f32(n, 3), param_f32(n, 4)];
            Func::Unary(u, p)
        }
        GgmlOp::Sqr => Func::Sqr,
        GgmlOp::Sqrt => Func::Sqrt,
        GgmlOp::Log => Func::Log,
        GgmlOp::Sin => Func::Sin,
        GgmlOp::Cos => Func::Cos,
        GgmlOp::Scale => Func::Scale(param_f32(n, 0), param_f32(n, 1)),
        GgmlOp::Clamp => Func::Clamp(param_f32(n, 0), param_f32(n, 1)),
        GgmlOp::LeakyRelu => Func::LeakyRelu(param_f32(n, 0)),
        _ => Func::Fill(param_f32(n, 0)),
    };
    if !is_float(dst.dtype()) {
        return Err(types_err(op, format!("dst {}", dst.dtype())));
    }
    let a = if op == GgmlOp::Fill {
        None
    } else {
        // SAFETY: forwarded contract.
        let a = unsafe { tv(src(n, 0)?)? };
        if !is_float(a.dtype()) {
            return Err(types_err(op, format!("src0 {}", a.dtype())));
        }
        if a.ne != dst.ne {
            return Err(shape_err(op, format!("src0 {:?} vs dst {:?}", a.ne, dst.ne)));
        }
        check_overlap(op, &dst, &a, Alias::RowLocal)?;
        Some(a)
    };
    Ok(super::simple(Kind::Unary(Unary { a, dst, f }), dst.ne[0]))
}

impl Unary {
    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        let d = &self.dst;
        let n0 = d.ne[0];
        for r in ctx.range(d.nrows()) {
            let (i1, i2, i3) = d.unravel_row(r);
            let x = &mut ctx.local[..n0];
            match &self.a {
                Some(a) => {
                    a.load_row(i1, i2, i3, x);
                    x.iter_mut().for_each(|v| *v = eval(self.f, *v));
                }
                None => x.fill(eval(self.f, 0.0)),
            }
            d.store_row(i1, i2, i3, x);
        }
    }
}

/// A planned GLU.
pub(crate) struct Glu {
    a: Tv,
    b: Option<Tv>,
    dst: Tv,
    op: GluOp,
    swapped: bool,
    alpha: f32,
    limit: f32,
    /// All operands F32: SWIGLU goes through ggml's vectorised `exp`.
    vexp: bool,
}

/// Validates GLU (split form with src1, or fused with both halves in src0).
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare_glu(n: &Node) -> Result<Plan> {
    let op = n.op;
    let g = GluOp::from_i32(n.op_params[0])
        .ok_or_else(|| Error::UnsupportedOp { op, detail: format!("glu op {}", n.op_params[0]) })?;
    // SAFETY: forwarded contract.
    let (a, dst) = unsafe { (tv(src(n, 0)?)?, tv(&n.dst)?) };
    // SAFETY: forwarded contract.
    let b = unsafe { opt_tv(n, 1)? };
    if !is_float(a.dtype()) || !is_float(dst.dtype()) || b.as_ref().is_some_and(|b| !is_float(b.dtype())) {
        return Err(types_err(op, "GLU operands must be F32/F16/BF16"));
    }
    match &b {
        Some(b) => {
            if b.ne != a.ne || dst.ne != a.ne {
                return Err(shape_err(op, format!("a {:?}, b {:?}, dst {:?}", a.ne, b.ne, dst.ne)));
            }
            check_overlap(op, &dst, b, Alias::RowLocal)?;
        }
        None => {
            if a.ne[0] % 2 != 0 || dst.ne != [a.ne[0] / 2, a.ne[1], a.ne[2], a.ne[3]] {
                return Err(shape_err(op, format!("fused a {:?} vs dst {:?}", a.ne, dst.ne)));
            }
        }
    }
    let alias = if b.is_some() { Alias::RowLocal } else { Alias::Never };
    check_overlap(op, &dst, &a, alias)?;
    let local = 2 * a.ne[0];
    let f32_only = [Some(a.dtype()), b.as_ref().map(|b| b.dtype()), Some(dst.dtype())]
        .iter()
        .all(|t| t.is_none_or(|t| t == crate::GgmlType::F32));
    Ok(super::simple(
        Kind::Glu(Glu {
            a,
            b,
            dst,
            op: g,
            swapped: n.op_params[1] != 0,
            alpha: param_f32(n, 2),
            limit: param_f32(n, 3),
            vexp: f32_only,
        }),
        local,
    ))
}

impl Glu {
    fn combine(&self, x: f32, g: f32) -> f32 {
        match self.op {
            GluOp::Reglu => {
                if x > 0.0 {
                    x * g
                } else {
                    0.0
                }
            }
            GluOp::Geglu => gelu_ggml(x) * g,
            GluOp::Swiglu => silu(x) * g,
            GluOp::SwigluOai => {
                let x = x.min(self.limit);
                let g = g.clamp(-self.limit, self.limit);
                x / (1.0 + (self.alpha * -x).exp()) * (g + 1.0)
            }
            GluOp::GegluErf => gelu_erf(x) * g,
            GluOp::GegluQuick => gelu_quick_ggml(x) * g,
            // SwiGLU with the gated input capped at `limit` and the gate clamped to ±limit.
            GluOp::SwigluClamp => {
                let x = x.min(self.limit);
                silu(x) * g.clamp(-self.limit, self.limit)
            }
        }
    }

    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        let d = &self.dst;
        let n0 = d.ne[0];
        for r in ctx.range(d.nrows()) {
            let (i1, i2, i3) = d.unravel_row(r);
            let (xs, gs) = match &self.b {
                Some(b) => {
                    let (x, g) = ctx.local.split_at_mut(n0);
                    self.a.load_row(i1, i2, i3, x);
                    b.load_row(i1, i2, i3, g);
                    (x, g)
                }
                None => {
                    let row = &mut ctx.local[..2 * n0];
                    self.a.load_row(i1, i2, i3, row);
                    let (first, second) = row.split_at_mut(n0);
                    if self.swapped {
                        (second, first)
                    } else {
                        (first, second)
                    }
                }
            };
            if self.op == GluOp::Swiglu && self.vexp {
                // ggml's vectorised SiLU, for bit-identical results (ops/vexp.rs); ggml's F16
                // SWIGLU is the scalar formula with libm's expf (`combine`).
                let n = xs.len();
                super::vexp::swiglu_in_place(xs, &gs[..n]);
                d.store_row(i1, i2, i3, xs);
                continue;
            }
            for (x, g) in xs.iter_mut().zip(gs.iter()) {
                *x = self.combine(*x, *g);
            }
            d.store_row(i1, i2, i3, xs);
        }
    }
}
