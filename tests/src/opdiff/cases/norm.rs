//! RMS_NORM (and RMS_NORM + MUL as llama graphs use it), NORM, L2_NORM, and ROPE (normal, NeoX,
//! YaRN, frequency factors, partial rotation; permuted and F16 inputs).
//!
//! ref: ggml-compute-semantics.md §3.3 RMS_NORM, NORM, ROPE.

use compute::op::rope_mode;
use compute::{GgmlOp, GgmlType};
use GgmlType::*;

use super::{f32_input, i32_input, input, push, tn, Case, Form, EXACT, ORDER};
use crate::opdiff::graph::{f32p, Graph};

pub fn cases(v: &mut Vec<Case>) {
    norms(v);
    rope(v);
}

fn norms(v: &mut Vec<Case>) {
    // RMS_NORM sums f32 squares in f64 as ggml does, NORM its variance in the groups of ggml's AVX2
    // build: exact. L2_NORM: summation order.
    for (op, name, eps, bound) in [
        (GgmlOp::RmsNorm, "rms_norm", 1e-5f32, EXACT),
        (GgmlOp::Norm, "norm", 1e-5, EXACT),
        (GgmlOp::L2Norm, "l2_norm", 1e-12, ORDER),
    ] {
        for form in [Form::Contig, Form::Permuted, Form::Strided, Form::Offset] {
            push(v, op.name(), format!("{name}/f32/576x5x2/{}", form.name()), bound, move |rng| {
                let mut g = Graph::new();
                let x = input(&mut g, rng, F32, [576, 5, 2, 1], 3.0, form)?;
                let d = g.op(op, F32, [576, 5, 2, 1], &[x], &[f32p(eps)])?;
                g.output(d);
                Ok(g)
            });
        }
    }
    // The attention/FFN norm of SmolLM2: RMS_NORM then MUL by the weight (broadcast row).
    push(v, "RMS_NORM", "rms_norm+mul/f32/576x5/smollm".into(), EXACT, |rng| {
        let mut g = Graph::new();
        let x = input(&mut g, rng, F32, [576, 5, 1, 1], 3.0, Form::Contig)?;
        let w = input(&mut g, rng, F32, [576, 1, 1, 1], 1.0, Form::Contig)?;
        let n = g.op(GgmlOp::RmsNorm, F32, [576, 5, 1, 1], &[x], &[f32p(1e-5)])?;
        let m = g.op(GgmlOp::Mul, F32, [576, 5, 1, 1], &[n, w], &[])?;
        g.output(m);
        Ok(g)
    });
}

/// ROPE parameters: n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor,
/// beta_fast, beta_slow.
#[derive(Clone, Copy)]
struct RopeP {
    n_dims: i32,
    mode: i32,
    n_ctx_orig: i32,
    freq_base: f32,
    freq_scale: f32,
    ext_factor: f32,
    attn_factor: f32,
    /// M-RoPE / vision sections (op_params 11..14).
    sections: [i32; 4],
}

impl RopeP {
    fn params(&self) -> Vec<i32> {
        let mut p = vec![
            0,
            self.n_dims,
            self.mode,
            0,
            self.n_ctx_orig,
            f32p(self.freq_base),
            f32p(self.freq_scale),
            f32p(self.ext_factor),
            f32p(self.attn_factor),
            f32p(32.0),
            f32p(1.0),
        ];
        if self.sections != [0; 4] {
            p.extend(self.sections);
        }
        p
    }
}

fn rope(v: &mut Vec<Case>) {
    const D: u64 = 64;
    const H: u64 = 9;
    let plain = |mode, base| RopeP {
        n_dims: D as i32,
        mode,
        n_ctx_orig: 8192,
        freq_base: base,
        freq_scale: 1.0,
        ext_factor: 0.0,
        attn_factor: 1.0,
        sections: [0; 4],
    };
    let mut variants: Vec<(String, RopeP, bool)> = Vec::new();
    for (mode, mname, base) in [(rope_mode::NORMAL, "normal", 1e5f32), (rope_mode::NEOX, "neox", 1e6)] {
        variants.push((mname.to_string(), plain(mode, base), false));
        // YaRN context extension (scale 1/4, full extrapolation mix) and attention factor.
        let yarn = RopeP {
            freq_scale: 0.25,
            ext_factor: 1.0,
            attn_factor: 0.9,
            n_ctx_orig: 2048,
            ..plain(mode, base)
        };
        variants.push((format!("{mname}-yarn"), yarn, false));
        // Rotating only the first half of each head.
        variants.push((format!("{mname}-partial32"), RopeP { n_dims: 32, ..plain(mode, base) }, false));
        // Llama-3-style frequency factors (src2).
        variants.push((format!("{mname}-freq-factors"), plain(mode, 5e5), true));
    }
    // The multi-section modes (Qwen2-VL M-RoPE, Qwen3-VL interleaved M-RoPE, vision encoders): four
    // positions per token; sections as those models use them, scaled to 64-wide heads.
    let multi = |mode, sections| RopeP { sections, ..plain(mode, 1e6) };
    variants.push(("mrope".into(), multi(rope_mode::MROPE, [16, 8, 8, 0]), false));
    variants.push(("mrope-extra".into(), multi(rope_mode::MROPE, [10, 8, 8, 6]), false));
    variants.push((
        "mrope-partial".into(),
        RopeP { n_dims: 32, ..multi(rope_mode::MROPE, [8, 4, 4, 0]) },
        false,
    ));
    let yarn = RopeP {
        freq_scale: 0.25,
        ext_factor: 1.0,
        attn_factor: 0.9,
        n_ctx_orig: 2048,
        ..multi(rope_mode::MROPE, [16, 8, 8, 0])
    };
    variants.push(("mrope-yarn".into(), yarn, false));
    variants.push(("imrope".into(), multi(rope_mode::IMROPE, [12, 10, 10, 0]), false));
    variants.push(("imrope-freq-factors".into(), multi(rope_mode::IMROPE, [12, 10, 10, 0]), true));
    variants.push((
        "vision".into(),
        RopeP { n_dims: D as i32 / 2, ..multi(rope_mode::VISION, [8, 8, 0, 0]) },
        false,
    ));
    for (vname, p, factors) in variants {
        let npos = if p.sections == [0; 4] { 5 } else { 20 };
        for (t, form) in
            [(F32, Form::Contig), (F32, Form::Permuted), (F32, Form::Strided), (F16, Form::Contig)]
        {
            let name = format!("rope/{vname}/{}/64x9x5/{}", tn(t), form.name());
            // F16 rows are converted to f32, rotated with the same arithmetic and rounded once.
            push(v, "ROPE", name, EXACT, move |rng| {
                let mut g = Graph::new();
                let x = input(&mut g, rng, t, [D, H, 5, 1], 1.0, form)?;
                let pos: Vec<i32> = [3, 4, 5, 6, 1000]
                    .iter()
                    .cycle()
                    .take(npos)
                    .enumerate()
                    .map(|(i, p)| p + 7 * (i as i32 / 5))
                    .collect();
                let pos = i32_input(&mut g, [npos as u64, 1, 1, 1], &pos)?;
                let mut src = vec![x, pos];
                if factors {
                    let f: Vec<f32> = (0..D / 2).map(|k| 1.0 + (k as f32 / 4.0).floor()).collect();
                    src.push(f32_input(&mut g, [D / 2, 1, 1, 1], &f)?);
                }
                let d = g.op(GgmlOp::Rope, t, [D, H, 5, 1], &src, &p.params())?;
                g.output(d);
                Ok(g)
            });
        }
    }
    // Unit pairs (1, 0): the result is YaRN's (cos θ, sin θ) × magnitude scale itself, at
    // position 1000, across the ramp between extrapolation and interpolation.
    for (mode, mname) in [(rope_mode::NORMAL, "normal"), (rope_mode::NEOX, "neox")] {
        push(v, "ROPE", format!("rope/{mname}-yarn/f32/64x1x1/unit-pairs"), EXACT, move |_| {
            let mut g = Graph::new();
            let x: Vec<f32> = (0..D)
                .map(|i| if mode == rope_mode::NEOX { f32::from(i < D / 2) } else { f32::from(i % 2 == 0) })
                .collect();
            let x = f32_input(&mut g, [D, 1, 1, 1], &x)?;
            let pos = i32_input(&mut g, [1, 1, 1, 1], &[1000])?;
            let yarn = RopeP {
                freq_scale: 0.25,
                ext_factor: 1.0,
                attn_factor: 0.9,
                n_ctx_orig: 2048,
                ..plain(mode, 1e5)
            };
            let d = g.op(GgmlOp::Rope, F32, [D, 1, 1, 1], &[x, pos], &yarn.params())?;
            g.output(d);
            Ok(g)
        });
    }
    // ROPE_BACK: the inverse rotation, NORMAL and NEOX, plain and YaRN.
    for (mode, mname) in [(rope_mode::NORMAL, "normal"), (rope_mode::NEOX, "neox")] {
        for (yname, ext) in [("", 0.0f32), ("-yarn", 1.0)] {
            let p =
                RopeP { ext_factor: ext, freq_scale: if ext > 0.0 { 0.25 } else { 1.0 }, ..plain(mode, 1e4) };
            push(v, "ROPE_BACK", format!("rope_back/{mname}{yname}/f32/64x9x5"), EXACT, move |rng| {
                let mut g = Graph::new();
                let x = input(&mut g, rng, F32, [D, H, 5, 1], 1.0, Form::Contig)?;
                let pos = i32_input(&mut g, [5, 1, 1, 1], &[0, 7, 8, 9, 500])?;
                let d = g.op(GgmlOp::RopeBack, F32, [D, H, 5, 1], &[x, pos], &p.params())?;
                g.output(d);
                Ok(g)
            });
        }
    }
    // Two sequences (ne3 = 2) of 3 tokens, positions as a master sends them.
    push(v, "ROPE", "rope/neox/f32/64x3x3x2/seqs".into(), EXACT, move |rng| {
        let mut g = Graph::new();
        let x = input(&mut g, rng, F32, [D, 3, 3, 2], 1.0, Form::Contig)?;
        let pos = i32_input(&mut g, [3, 1, 1, 1], &[0, 1, 2])?;
        let p = plain(rope_mode::NEOX, 1e4).params();
        let d = g.op(GgmlOp::Rope, F32, [D, 3, 3, 2], &[x, pos], &p)?;
        g.output(d);
        Ok(g)
    });
}
