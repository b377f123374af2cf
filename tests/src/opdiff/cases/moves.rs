//! Generators, element moves and small reductions that encoder, state-space and training graphs
//! use: ARANGE, TIMESTEP_EMBEDDING, ROLL, PAD_REFLECT_1D, DIAG, TRI, ACC, SET, LEAKY_RELU,
//! DIAG_MASK_ZERO, CUMSUM, COUNT_EQUAL, GROUP_NORM; and the vision/audio encoder ops UPSCALE,
//! IM2COL, POOL_1D, POOL_2D, CONV_2D_DW.
//!
//! Pure element moves and IEEE arithmetic in ggml's order are compared exactly; functions through
//! libm (`exp`, `cos`, `sin`) within one ulp; sums where ggml vectorises within summation order.

use compute::{GgmlOp, GgmlType};
use rand::Rng;
use GgmlType::*;

use super::{i32_input, input, push, tn, Case, Form, EXACT, ORDER, ULP};
use crate::opdiff::graph::{f32p, Graph};

pub fn cases(v: &mut Vec<Case>) {
    gradients(v);
    generators(v);
    moves(v);
    reductions(v);
    encoder(v);
    encoder_3d_and_grads(v);
}

/// The training ops (ggml-opt): gradients of the forward ops, the loss and the SGD step.
fn gradients(v: &mut Vec<Case>) {
    let ne = [64u64, 6, 3, 1];
    for (op, name, params, bound) in [
        (GgmlOp::SiluBack, "silu_back", vec![], ULP),
        (GgmlOp::RmsNormBack, "rms_norm_back", vec![f32p(1e-6)], ORDER),
        (GgmlOp::SoftMaxBack, "soft_max_back", vec![f32p(0.5), f32p(0.0)], ORDER),
    ] {
        push(v, name.to_uppercase().leak(), format!("{name}/f32/64x6x3"), bound, move |rng| {
            let mut g = Graph::new();
            let dy = input(&mut g, rng, F32, ne, 1.0, Form::Contig)?;
            let x = input(&mut g, rng, F32, ne, 1.0, Form::Contig)?;
            let d = g.op(op, F32, ne, &[dy, x], &params)?;
            g.output(d);
            Ok(g)
        });
    }
    push(v, "REPEAT_BACK", "repeat_back/f32/64x8x3x2-to-32x4x3x1".into(), EXACT, |rng| {
        let mut g = Graph::new();
        let a = input(&mut g, rng, F32, [64, 8, 3, 2], 1.0, Form::Contig)?;
        let d = g.op(GgmlOp::RepeatBack, F32, [32, 4, 3, 1], &[a], &[])?;
        g.output(d);
        Ok(g)
    });
    push(v, "GET_ROWS_BACK", "get_rows_back/f32/32x7-to-32x5".into(), EXACT, |rng| {
        let mut g = Graph::new();
        let grad = input(&mut g, rng, F32, [32, 7, 1, 1], 1.0, Form::Contig)?;
        let ids: Vec<i32> = (0..7).map(|_| rng.random_range(0..5)).collect();
        let ids = i32_input(&mut g, [7, 1, 1, 1], &ids)?;
        let d = g.op(GgmlOp::GetRowsBack, F32, [32, 5, 1, 1], &[grad, ids], &[])?;
        g.output(d);
        Ok(g)
    });
    push(v, "CROSS_ENTROPY_LOSS", "cross_entropy_loss/f32/50x6".into(), ORDER, |rng| {
        let mut g = Graph::new();
        let logits = input(&mut g, rng, F32, [50, 6, 1, 1], 2.0, Form::Contig)?;
        let mut labels = vec![0f32; 300];
        for r in 0..6 {
            labels[r * 50 + rng.random_range(0..50)] = 1.0;
        }
        let labels = super::f32_input(&mut g, [50, 6, 1, 1], &labels)?;
        let d = g.op(GgmlOp::CrossEntropyLoss, F32, [1, 1, 1, 1], &[logits, labels], &[])?;
        g.output(d);
        Ok(g)
    });
    push(v, "CROSS_ENTROPY_LOSS_BACK", "cross_entropy_loss_back/f32/50x6".into(), ORDER, |rng| {
        let mut g = Graph::new();
        let dl = super::f32_input(&mut g, [1, 1, 1, 1], &[0.75])?;
        let logits = input(&mut g, rng, F32, [50, 6, 1, 1], 2.0, Form::Contig)?;
        let labels: Vec<f32> = (0..300).map(|_| rng.random_range(0.0f32..0.04)).collect();
        let labels = super::f32_input(&mut g, [50, 6, 1, 1], &labels)?;
        let d = g.op(GgmlOp::CrossEntropyLossBack, F32, [50, 6, 1, 1], &[dl, logits, labels], &[])?;
        g.output(d);
        Ok(g)
    });
    push(v, "OPT_STEP_SGD", "opt_step_sgd/f32/64x6".into(), EXACT, |rng| {
        let mut g = Graph::new();
        let x = input(&mut g, rng, F32, [64, 6, 1, 1], 1.0, Form::Contig)?;
        let grad = input(&mut g, rng, F32, [64, 6, 1, 1], 1.0, Form::Contig)?;
        let p = super::f32_input(&mut g, [2, 1, 1, 1], &[0.01, 0.1])?;
        g.op_into(GgmlOp::OptStepSgd, x, &[x, grad, p], &[]);
        g.output(x);
        Ok(g)
    });
}

fn generators(v: &mut Vec<Case>) {
    for (start, stop, step) in [(0.0f32, 10.0f32, 1.0f32), (-3.0, 5.5, 0.25), (10.0, 0.0, -1.5)] {
        let n = ((stop - start) / step).ceil() as u64;
        push(v, "ARANGE", format!("arange/f32/{start}..{stop}by{step}"), EXACT, move |_| {
            let mut g = Graph::new();
            let d = g.op(GgmlOp::Arange, F32, [n, 1, 1, 1], &[], &[f32p(start), f32p(stop), f32p(step)])?;
            g.output(d);
            Ok(g)
        });
    }
    for dim in [64u64, 33] {
        push(v, "TIMESTEP_EMBEDDING", format!("timestep_embedding/f32/dim{dim}x5"), ULP, move |rng| {
            let mut g = Graph::new();
            let t: Vec<f32> = (0..5).map(|_| rng.random_range(0.0f32..1000.0)).collect();
            let t = super::f32_input(&mut g, [5, 1, 1, 1], &t)?;
            let d = g.op(GgmlOp::TimestepEmbedding, F32, [dim, 5, 1, 1], &[t], &[dim as i32, 10000])?;
            g.output(d);
            Ok(g)
        });
    }
}

fn moves(v: &mut Vec<Case>) {
    let ne = [16u64, 6, 3, 2];
    for (shift, form) in [([3, -2, 1, 0], Form::Contig), ([-5, 5, 0, 1], Form::Permuted)] {
        let name = format!("roll/f32/16x6x3x2/{shift:?}-{}", form.name()).replace(' ', "");
        push(v, "ROLL", name, EXACT, move |rng| {
            let mut g = Graph::new();
            let a = input(&mut g, rng, F32, ne, 1.0, form)?;
            let d = g.op(GgmlOp::Roll, F32, ne, &[a], &shift)?;
            g.output(d);
            Ok(g)
        });
    }
    for (p0, p1) in [(3, 2), (0, 5), (15, 15)] {
        push(v, "PAD_REFLECT_1D", format!("pad_reflect_1d/f32/16x6x3/{p0}-{p1}"), EXACT, move |rng| {
            let mut g = Graph::new();
            let a = input(&mut g, rng, F32, [16, 6, 3, 1], 1.0, Form::Contig)?;
            let d =
                g.op(GgmlOp::PadReflect1d, F32, [16 + p0 as u64 + p1 as u64, 6, 3, 1], &[a], &[p0, p1])?;
            g.output(d);
            Ok(g)
        });
    }
    push(v, "DIAG", "diag/f32/12x1x3x2".into(), EXACT, |rng| {
        let mut g = Graph::new();
        let a = input(&mut g, rng, F32, [12, 1, 3, 2], 1.0, Form::Contig)?;
        let d = g.op(GgmlOp::Diag, F32, [12, 12, 3, 2], &[a], &[])?;
        g.output(d);
        Ok(g)
    });
    for tri in 0..4 {
        push(v, "TRI", format!("tri/f32/9x9x2/type{tri}"), EXACT, move |rng| {
            let mut g = Graph::new();
            let a = input(&mut g, rng, F32, [9, 9, 2, 1], 1.0, Form::Contig)?;
            let d = g.op(GgmlOp::Tri, F32, [9, 9, 2, 1], &[a], &[tri])?;
            g.output(d);
            Ok(g)
        });
    }
    // ACC / SET: a [16, 6, 3] with a [5, 2, 2] window at element (2, 1, 1) of a's own strides,
    // and one with rows of the window two destination rows apart.
    for op in [GgmlOp::Acc, GgmlOp::Set] {
        for (wnb1, tag) in [(64, "rows"), (128, "every-other-row")] {
            let name =
                format!("{}/f32/16x6x3/window5x2x2-{tag}", if op == GgmlOp::Acc { "acc" } else { "set" });
            push(v, if op == GgmlOp::Acc { "ACC" } else { "SET" }, name, EXACT, move |rng| {
                let mut g = Graph::new();
                let a = input(&mut g, rng, F32, [16, 6, 3, 1], 1.0, Form::Contig)?;
                let b = input(&mut g, rng, F32, [5, 2, 2, 1], 1.0, Form::Contig)?;
                let offset = (2 + 16 + 96) * 4;
                let p = [wnb1, 96 * 4, 288 * 4, offset, 0];
                let d = g.op(op, F32, [16, 6, 3, 1], &[a, b], &p)?;
                g.output(d);
                Ok(g)
            });
        }
    }
    for (slope, form) in [(0.01f32, Form::Contig), (0.2, Form::Strided)] {
        push(v, "LEAKY_RELU", format!("leaky_relu/f32/64x6x3/{slope}-{}", form.name()), EXACT, move |rng| {
            let mut g = Graph::new();
            let a = input(&mut g, rng, F32, [64, 6, 3, 1], 1.0, form)?;
            let d = g.op(GgmlOp::LeakyRelu, F32, [64, 6, 3, 1], &[a], &[f32p(slope)])?;
            g.output(d);
            Ok(g)
        });
    }
    for n_past in [0, 3] {
        push(v, "DIAG_MASK_ZERO", format!("diag_mask_zero/f32/8x5x2/past{n_past}"), EXACT, move |rng| {
            let mut g = Graph::new();
            let a = input(&mut g, rng, F32, [8, 5, 2, 1], 1.0, Form::Contig)?;
            let d = g.op(GgmlOp::DiagMaskZero, F32, [8, 5, 2, 1], &[a], &[n_past])?;
            g.output(d);
            Ok(g)
        });
    }
}

fn reductions(v: &mut Vec<Case>) {
    for form in [Form::Contig, Form::Permuted] {
        push(v, "CUMSUM", format!("cumsum/f32/100x6x3/{}", form.name()), EXACT, move |rng| {
            let mut g = Graph::new();
            let a = input(&mut g, rng, F32, [100, 6, 3, 1], 1.0, form)?;
            let d = g.op(GgmlOp::Cumsum, F32, [100, 6, 3, 1], &[a], &[])?;
            g.output(d);
            Ok(g)
        });
    }
    push(v, "COUNT_EQUAL", "count_equal/i32/64x5".into(), EXACT, |rng| {
        let mut g = Graph::new();
        let x: Vec<i32> = (0..320).map(|_| rng.random_range(0..4)).collect();
        let y: Vec<i32> = (0..320).map(|_| rng.random_range(0..4)).collect();
        let a = i32_input(&mut g, [64, 5, 1, 1], &x)?;
        let b = i32_input(&mut g, [64, 5, 1, 1], &y)?;
        let d = g.op(GgmlOp::CountEqual, I64, [1, 1, 1, 1], &[a, b], &[])?;
        g.output(d);
        Ok(g)
    });
    for groups in [4, 3] {
        push(v, "GROUP_NORM", format!("group_norm/f32/8x6x12x2/groups{groups}"), ORDER, move |rng| {
            let mut g = Graph::new();
            let a = input(&mut g, rng, F32, [8, 6, 12, 2], 2.0, Form::Contig)?;
            let d = g.op(GgmlOp::GroupNorm, F32, [8, 6, 12, 2], &[a], &[groups, f32p(1e-6)])?;
            g.output(d);
            Ok(g)
        });
    }
}

fn encoder(v: &mut Vec<Case>) {
    // UPSCALE: nearest by 2 and 3 (and in dims 2..3), bilinear half-pixel and aligned corners.
    for (mode, mname) in [(0, "nearest"), (1, "bilinear"), (0x101, "bilinear-align-corners")] {
        for (dne, tag) in [([16u64, 12, 3, 2], "x2"), ([24, 18, 6, 2], "x3-channels-x2")] {
            let bound = if mode == 0 { EXACT } else { ULP };
            push(v, "UPSCALE", format!("upscale/{mname}/f32/8x6x3x2-{tag}"), bound, move |rng| {
                let mut g = Graph::new();
                let a = input(&mut g, rng, F32, [8, 6, 3, 2], 1.0, Form::Contig)?;
                let d = g.op(GgmlOp::Upscale, F32, dne, &[a], &[mode])?;
                g.output(d);
                Ok(g)
            });
        }
    }
    // IM2COL: a 3×3 2-D kernel (stride 1 pad 1, stride 2 dilation 2) and a 1-D kernel of 5
    // (Whisper's conv front end), into F32 and F16.
    for dt in [F32, F16] {
        for (s, p, d, tag) in [([1, 1], [1, 1], [1, 1], "s1p1"), ([2, 2], [0, 1], [2, 1], "s2p01d21")] {
            let name = format!("im2col/2d/{}/10x9x3x2-k3x3-{tag}", tn(dt));
            push(v, "IM2COL", name, EXACT, move |rng| {
                let mut g = Graph::new();
                let k = input(&mut g, rng, F16, [3, 3, 3, 4], 1.0, Form::Contig)?;
                let x = input(&mut g, rng, F32, [10, 9, 3, 2], 1.0, Form::Contig)?;
                let ow = (10 + 2 * p[0] - d[0] * 2 - 1) / s[0] + 1;
                let oh = (9 + 2 * p[1] - d[1] * 2 - 1) / s[1] + 1;
                let params = [s[0], s[1], p[0], p[1], d[0], d[1], 1];
                let o = g.op(GgmlOp::Im2col, dt, [27, ow as u64, oh as u64, 2], &[k, x], &params)?;
                g.output(o);
                Ok(g)
            });
        }
        push(v, "IM2COL", format!("im2col/1d/{}/20x4x2-k5-s1p2", tn(dt)), EXACT, move |rng| {
            let mut g = Graph::new();
            let k = input(&mut g, rng, F16, [5, 4, 6, 1], 1.0, Form::Contig)?;
            let x = input(&mut g, rng, F32, [20, 4, 2, 1], 1.0, Form::Contig)?;
            let o = g.op(GgmlOp::Im2col, dt, [20, 20, 2, 1], &[k, x], &[1, 0, 2, 0, 1, 0, 0])?;
            g.output(o);
            Ok(g)
        });
    }
    for (op, oname) in [(0, "max"), (1, "avg")] {
        push(v, "POOL_1D", format!("pool_1d/{oname}/f32/24x5x2-k3s3"), EXACT, move |rng| {
            let mut g = Graph::new();
            let a = input(&mut g, rng, F32, [24, 5, 2, 1], 1.0, Form::Contig)?;
            let d = g.op(GgmlOp::Pool1d, F32, [8, 5, 2, 1], &[a], &[op, 3, 3, 0])?;
            g.output(d);
            Ok(g)
        });
        for (k, s, p, tag) in [([2, 2], [2, 2], [0, 0], "k2s2"), ([3, 3], [2, 1], [1, 1], "k3s21p1")] {
            push(v, "POOL_2D", format!("pool_2d/{oname}/f32/12x10x3x2-{tag}"), EXACT, move |rng| {
                let mut g = Graph::new();
                let a = input(&mut g, rng, F32, [12, 10, 3, 2], 1.0, Form::Contig)?;
                let ow = (12 + 2 * p[0] - k[0]) / s[0] + 1;
                let oh = (10 + 2 * p[1] - k[1]) / s[1] + 1;
                let params = [op, k[0], k[1], s[0], s[1], p[0], p[1]];
                let d = g.op(GgmlOp::Pool2d, F32, [ow as u64, oh as u64, 3, 2], &[a], &params)?;
                g.output(d);
                Ok(g)
            });
        }
    }
    for (s, p, d, tag) in [([1, 1], [1, 1], [1, 1], "s1p1"), ([2, 1], [0, 2], [1, 2], "s21p02d12")] {
        push(v, "CONV_2D_DW", format!("conv_2d_dw/f32/11x9x4x2-k3-{tag}"), ORDER, move |rng| {
            let mut g = Graph::new();
            let k = input(&mut g, rng, F32, [3, 3, 1, 4], 1.0, Form::Contig)?;
            let x = input(&mut g, rng, F32, [11, 9, 4, 2], 1.0, Form::Contig)?;
            let ow = (11 + 2 * p[0] - d[0] * 2 - 1) / s[0] + 1;
            let oh = (9 + 2 * p[1] - d[1] * 2 - 1) / s[1] + 1;
            let params = [s[0], s[1], p[0], p[1], d[0], d[1]];
            let o = g.op(GgmlOp::Conv2dDw, F32, [ow as u64, oh as u64, 4, 2], &[k, x], &params)?;
            g.output(o);
            Ok(g)
        });
    }
    // CONV_2D (direct), F32 and F16 kernels; CONV_TRANSPOSE_1D/2D (F16 input rounding with F16
    // kernels); sums over input channels in ggml's vectorised order: summation-order bound.
    for kt in [F32, F16] {
        for (s, p, d, tag) in [([1, 1], [1, 1], [1, 1], "s1p1"), ([2, 1], [0, 2], [1, 2], "s21p02d12")] {
            push(v, "CONV_2D", format!("conv_2d/{}/9x8x4x2-k3x3x4x5-{tag}", tn(kt)), ORDER, move |rng| {
                let mut g = Graph::new();
                let k = input(&mut g, rng, kt, [3, 3, 4, 5], 1.0, Form::Contig)?;
                let x = input(&mut g, rng, F32, [9, 8, 4, 2], 1.0, Form::Contig)?;
                let ow = (9 + 2 * p[0] - d[0] * 2 - 1) / s[0] + 1;
                let oh = (8 + 2 * p[1] - d[1] * 2 - 1) / s[1] + 1;
                let params = [s[0], s[1], p[0], p[1], d[0], d[1]];
                let o = g.op(GgmlOp::Conv2d, F32, [ow as u64, oh as u64, 5, 2], &[k, x], &params)?;
                g.output(o);
                Ok(g)
            });
        }
        for s0 in [1u64, 2] {
            push(
                v,
                "CONV_TRANSPOSE_1D",
                format!("conv_transpose_1d/{}/10x4-k3x5-s{s0}", tn(kt)),
                ORDER,
                move |rng| {
                    let mut g = Graph::new();
                    let k = input(&mut g, rng, kt, [3, 5, 4, 1], 1.0, Form::Contig)?;
                    let x = input(&mut g, rng, F32, [10, 4, 1, 1], 1.0, Form::Contig)?;
                    let o = g.op(
                        GgmlOp::ConvTranspose1d,
                        F32,
                        [9 * s0 + 3, 5, 1, 1],
                        &[k, x],
                        &[s0 as i32, 0, 1],
                    )?;
                    g.output(o);
                    Ok(g)
                },
            );
        }
    }
    push(v, "CONV_TRANSPOSE_2D", "conv_transpose_2d/f16/6x5x4-k3x3x5x4-s2".into(), ORDER, move |rng| {
        let mut g = Graph::new();
        let k = input(&mut g, rng, F16, [3, 3, 5, 4], 1.0, Form::Contig)?;
        let x = input(&mut g, rng, F32, [6, 5, 4, 1], 1.0, Form::Contig)?;
        let o = g.op(GgmlOp::ConvTranspose2d, F32, [13, 11, 5, 1], &[k, x], &[2])?;
        g.output(o);
        Ok(g)
    });
    push(v, "OUT_PROD", "out_prod/f32/16x8x2-12x8x4".into(), ORDER, move |rng| {
        let mut g = Graph::new();
        let a = input(&mut g, rng, F32, [16, 8, 2, 1], 1.0, Form::Contig)?;
        let b = input(&mut g, rng, F32, [12, 8, 4, 1], 1.0, Form::Contig)?;
        let o = g.op(GgmlOp::OutProd, F32, [16, 12, 4, 1], &[a, b], &[])?;
        g.output(o);
        Ok(g)
    });
    // SAM-style windowed attention layout: 13 × 11 positions in 5 × 5 windows (3 × 3 of them).
    push(v, "WIN_PART", "win_part/f32/8x13x11-w5".into(), EXACT, move |rng| {
        let mut g = Graph::new();
        let a = input(&mut g, rng, F32, [8, 13, 11, 1], 1.0, Form::Contig)?;
        let o = g.op(GgmlOp::WinPart, F32, [8, 5, 5, 9], &[a], &[3, 3, 5])?;
        g.output(o);
        Ok(g)
    });
    push(v, "WIN_UNPART", "win_unpart/f32/8x5x5x9-to-13x11-w5".into(), EXACT, move |rng| {
        let mut g = Graph::new();
        let a = input(&mut g, rng, F32, [8, 5, 5, 9], 1.0, Form::Contig)?;
        let o = g.op(GgmlOp::WinUnpart, F32, [8, 13, 11, 1], &[a], &[5])?;
        g.output(o);
        Ok(g)
    });
    push(v, "GET_REL_POS", "get_rel_pos/f16/8x13-to-7x7".into(), EXACT, move |rng| {
        let mut g = Graph::new();
        let a = input(&mut g, rng, F16, [8, 13, 1, 1], 1.0, Form::Contig)?;
        let o = g.op(GgmlOp::GetRelPos, F16, [8, 7, 7, 1], &[a], &[])?;
        g.output(o);
        Ok(g)
    });
}

/// UPSCALE's bicubic and antialiased modes, the 3-D encoder ops (IM2COL_3D, CONV_3D), the audio
/// decoder's COL2IM_1D, SAM's ADD_REL_POS, and the encoder gradients IM2COL_BACK, POOL_2D_BACK with
/// the AdamW optimizer step.
fn encoder_3d_and_grads(v: &mut Vec<Case>) {
    for (mode, mname, dne) in [
        (2, "bicubic", [16u64, 12, 3, 2]),
        (0x102, "bicubic-align-corners", [13, 9, 3, 2]),
        (0x201, "bilinear-antialias-down", [5, 4, 3, 2]),
        (0x201, "bilinear-antialias-up", [16, 12, 3, 2]),
    ] {
        push(v, "UPSCALE", format!("upscale/{mname}/f32/8x6x3x2-{}x{}", dne[0], dne[1]), ULP, move |rng| {
            let mut g = Graph::new();
            let a = input(&mut g, rng, F32, [8, 6, 3, 2], 1.0, Form::Contig)?;
            let d = g.op(GgmlOp::Upscale, F32, dne, &[a], &[mode])?;
            g.output(d);
            Ok(g)
        });
    }
    // IM2COL_3D and CONV_3D: a 3×3×2 kernel over a 7×6×5 volume of 3 channels, 2 batches; stride 1
    // pad 1, and stride (2, 1, 2) pad (0, 1, 1) dilation (1, 2, 1).
    const IC: u64 = 3;
    const OC: u64 = 4;
    for (s, p, d, tag) in
        [([1, 1, 1], [1, 1, 1], [1, 1, 1], "s1p1"), ([2, 1, 2], [0, 1, 1], [1, 2, 1], "s212p011d121")]
    {
        let k = [3i32, 3, 2];
        let x = [7i32, 6, 5];
        let o: [i32; 3] = std::array::from_fn(|q| (x[q] + 2 * p[q] - d[q] * (k[q] - 1) - 1) / s[q] + 1);
        let params = [s[0], s[1], s[2], p[0], p[1], p[2], d[0], d[1], d[2]];
        for dt in [F32, F16] {
            let name = format!("im2col_3d/{}/7x6x5x{IC}x2-k3x3x2-{tag}", tn(dt));
            push(v, "IM2COL_3D", name, EXACT, move |rng| {
                let mut g = Graph::new();
                let kt = input(&mut g, rng, F16, [3, 3, 2, OC * IC], 1.0, Form::Contig)?;
                let xt = input(&mut g, rng, F32, [7, 6, 5, 2 * IC], 1.0, Form::Contig)?;
                let mut pr = params.to_vec();
                pr.push(IC as i32);
                let dne = [IC * 18, o[0] as u64, o[1] as u64, 2 * o[2] as u64];
                let out = g.op(GgmlOp::Im2col3d, dt, dne, &[kt, xt], &pr)?;
                g.output(out);
                Ok(g)
            });
        }
        for kt_ty in [F32, F16] {
            let name = format!("conv_3d/{}/7x6x5x{IC}x2-k3x3x2x{OC}-{tag}", tn(kt_ty));
            push(v, "CONV_3D", name, ORDER, move |rng| {
                let mut g = Graph::new();
                let kt = input(&mut g, rng, kt_ty, [3, 3, 2, IC * OC], 1.0, Form::Contig)?;
                let xt = input(&mut g, rng, F32, [7, 6, 5, IC * 2], 1.0, Form::Contig)?;
                let mut pr = params.to_vec();
                pr.extend([IC as i32, 2, OC as i32]);
                let dne = [o[0] as u64, o[1] as u64, o[2] as u64, OC * 2];
                let out = g.op(GgmlOp::Conv3d, F32, dne, &[kt, xt], &pr)?;
                g.output(out);
                Ok(g)
            });
        }
    }
    // IM2COL_BACK: the image gradient of a 3×3 2-D and a 5-tap 1-D im2col (stride 2 skips inputs).
    for (s, p, d, tag) in [([1, 1], [1, 1], [1, 1], "s1p1"), ([2, 2], [0, 1], [2, 1], "s2p01d21")] {
        push(v, "IM2COL_BACK", format!("im2col_back/2d/f32/10x9x3x2-k3x3-{tag}"), EXACT, move |rng| {
            let mut g = Graph::new();
            let ow = (10 + 2 * p[0] - d[0] * 2 - 1) / s[0] + 1;
            let oh = (9 + 2 * p[1] - d[1] * 2 - 1) / s[1] + 1;
            let k = input(&mut g, rng, F16, [3, 3, 3, 4], 1.0, Form::Contig)?;
            let gr = input(&mut g, rng, F32, [27, ow as u64, oh as u64, 2], 1.0, Form::Contig)?;
            let params = [s[0], s[1], p[0], p[1], d[0], d[1], 1];
            let o = g.op(GgmlOp::Im2colBack, F32, [10, 9, 3, 2], &[gr, k], &params)?;
            g.output(o);
            Ok(g)
        });
    }
    push(v, "IM2COL_BACK", "im2col_back/1d/f32/20x4x2-k5-s2p2".into(), EXACT, |rng| {
        let mut g = Graph::new();
        let k = input(&mut g, rng, F16, [5, 4, 6, 1], 1.0, Form::Contig)?;
        let gr = input(&mut g, rng, F32, [20, 10, 2, 1], 1.0, Form::Contig)?;
        let o = g.op(GgmlOp::Im2colBack, F32, [20, 4, 2, 1], &[gr, k], &[2, 0, 2, 0, 1, 0, 0])?;
        g.output(o);
        Ok(g)
    });
    // COL2IM_1D: columns of a 4-tap transposed convolution, stride 2 (overlapping) and 4, cropped.
    for t in [F32, F16, BF16] {
        for (s0, p0) in [(2i32, 1i32), (4, 0)] {
            push(v, "COL2IM_1D", format!("col2im_1d/{}/k4xoc3x9-s{s0}p{p0}", tn(t)), EXACT, move |rng| {
                let mut g = Graph::new();
                let cols = input(&mut g, rng, t, [12, 9, 1, 1], 1.0, Form::Contig)?;
                let len = (9 - 1) * s0 as u64 + 4 - 2 * p0 as u64;
                let o = g.op(GgmlOp::Col2im1d, t, [len, 3, 1, 1], &[cols], &[s0, 3, p0])?;
                g.output(o);
                Ok(g)
            });
        }
    }
    for (op, oname) in [(0, "max"), (1, "avg")] {
        for (k, s, p, tag) in [([2, 2], [2, 2], [0, 0], "k2s2"), ([3, 3], [2, 1], [1, 1], "k3s21p1")] {
            push(v, "POOL_2D_BACK", format!("pool_2d_back/{oname}/f32/12x10x3x2-{tag}"), EXACT, move |rng| {
                let mut g = Graph::new();
                let ow = (12 + 2 * p[0] - k[0]) / s[0] + 1;
                let oh = (10 + 2 * p[1] - k[1]) / s[1] + 1;
                let gr = input(&mut g, rng, F32, [ow as u64, oh as u64, 3, 2], 1.0, Form::Contig)?;
                let f = input(&mut g, rng, F32, [12, 10, 3, 2], 1.0, Form::Contig)?;
                let params = [op, k[0], k[1], s[0], s[1], p[0], p[1]];
                let d = g.op(GgmlOp::Pool2dBack, F32, [12, 10, 3, 2], &[gr, f], &params)?;
                g.output(d);
                Ok(g)
            });
        }
    }
    // ADD_REL_POS: SAM's decomposed relative positions, 6×6 keys for 5×4 queries, 2 heads.
    for inplace in [0, 1] {
        push(v, "ADD_REL_POS", format!("add_rel_pos/f32/36x20x2/inplace{inplace}"), EXACT, move |rng| {
            let mut g = Graph::new();
            let a = input(&mut g, rng, F32, [36, 20, 2, 1], 1.0, Form::Contig)?;
            let pw = input(&mut g, rng, F32, [6, 5, 4, 2], 1.0, Form::Contig)?;
            let ph = input(&mut g, rng, F32, [6, 5, 4, 2], 1.0, Form::Contig)?;
            let d = if inplace == 1 {
                g.op_into(GgmlOp::AddRelPos, a, &[a, pw, ph], &[1])
            } else {
                g.op(GgmlOp::AddRelPos, F32, [36, 20, 2, 1], &[a, pw, ph], &[0])?
            };
            g.output(d);
            Ok(g)
        });
    }
    push(v, "OPT_STEP_ADAMW", "opt_step_adamw/f32/64x6".into(), EXACT, |rng| {
        let mut g = Graph::new();
        let x = input(&mut g, rng, F32, [64, 6, 1, 1], 1.0, Form::Contig)?;
        let grad = input(&mut g, rng, F32, [64, 6, 1, 1], 1.0, Form::Contig)?;
        let m = input(&mut g, rng, F32, [64, 6, 1, 1], 0.1, Form::Contig)?;
        let vals: Vec<f32> = (0..384).map(|_| rng.random_range(0.0f32..0.05)).collect();
        let vv = super::f32_input(&mut g, [64, 6, 1, 1], &vals)?;
        // alpha, beta1, beta2, eps, wd, 1/(1 − beta1^t), 1/(1 − beta2^t) at step 3.
        let (b1, b2) = (0.9f32, 0.999f32);
        let hp = [1e-3, b1, b2, 1e-8, 0.01, 1.0 / (1.0 - b1.powi(3)), 1.0 / (1.0 - b2.powi(3))];
        let p = super::f32_input(&mut g, [7, 1, 1, 1], &hp)?;
        g.op_into(GgmlOp::OptStepAdamw, x, &[x, grad, m, vv, p], &[]);
        g.output(x);
        g.output(m);
        g.output(vv);
        Ok(g)
    });
}
