//! DeepSeek-V4's hyper-connection ops (DSV4_HC_COMB, DSV4_HC_PRE plain and gated, DSV4_HC_POST with
//! and without a combination) and its LIGHTNING_INDEXER (F32 and F16 keys, a causal F16 mask).
//!
//! All exact: llamad forms each sum in ggml's order, fuses the products ggml's x86 build fuses and
//! takes the q·k dot products through its F32 dot kernel in ggml's order
//! (compute/src/ops/hyper.rs).

use compute::{GgmlOp, GgmlType};
use rand::Rng;
use GgmlType::*;

use super::{input, push, tn, Case, Form, EXACT};
use crate::opdiff::data;
use crate::opdiff::graph::{f32p, Graph};

const HC: u64 = 4;
const E: u64 = 48;

pub fn cases(v: &mut Vec<Case>) {
    for (t, n_iter) in [(1u64, 1), (5, 3), (7, 20)] {
        push(v, "DSV4_HC_COMB", format!("dsv4_hc_comb/f32/t{t}/iter{n_iter}"), EXACT, move |rng| {
            let mut g = Graph::new();
            let mix = (2 + HC) * HC;
            let m = input(&mut g, rng, F32, [mix, t, 1, 1], 1.0, Form::Contig)?;
            let sc = input(&mut g, rng, F32, [3, 1, 1, 1], 1.0, Form::Contig)?;
            let b = input(&mut g, rng, F32, [mix, 1, 1, 1], 0.5, Form::Contig)?;
            let d = g.op(GgmlOp::Dsv4HcComb, F32, [HC, HC, t, 1], &[m, sc, b], &[f32p(1e-6), n_iter])?;
            g.output(d);
            Ok(g)
        });
    }
    for t in [1u64, 6] {
        push(v, "DSV4_HC_PRE", format!("dsv4_hc_pre/f32/{E}x{HC}x{t}"), EXACT, move |rng| {
            let mut g = Graph::new();
            let x = input(&mut g, rng, F32, [E, HC, t, 1], 1.0, Form::Contig)?;
            let w = input(&mut g, rng, F32, [HC, t, 1, 1], 1.0, Form::Contig)?;
            // ggml's constructor stores scale 1.
            let d = g.op(GgmlOp::Dsv4HcPre, F32, [E, t, 1, 1], &[x, w], &[f32p(1.0), 0])?;
            g.output(d);
            Ok(g)
        });
        push(v, "DSV4_HC_PRE", format!("dsv4_hc_pre/gated/f32/{E}x{HC}x{t}"), EXACT, move |rng| {
            let mut g = Graph::new();
            let x = input(&mut g, rng, F32, [E, HC, t, 1], 1.0, Form::Contig)?;
            let gate = input(&mut g, rng, F32, [E, HC, t, 1], 2.0, Form::Contig)?;
            let d = g.op(GgmlOp::Dsv4HcPre, F32, [E, t, 1, 1], &[x, gate], &[f32p(0.25), 1])?;
            g.output(d);
            Ok(g)
        });
        for comb in [true, false] {
            let name = format!("dsv4_hc_post/f32/{E}x{HC}x{t}/{}", if comb { "comb" } else { "identity" });
            push(v, "DSV4_HC_POST", name, EXACT, move |rng| {
                let mut g = Graph::new();
                let x = input(&mut g, rng, F32, [E, t, 1, 1], 1.0, Form::Contig)?;
                let r = input(&mut g, rng, F32, [E, HC, t, 1], 1.0, Form::Contig)?;
                let p = input(&mut g, rng, F32, [HC, t, 1, 1], 1.0, Form::Contig)?;
                let mut src = vec![x, r, p];
                if comb {
                    src.push(input(&mut g, rng, F32, [HC, HC, t, 1], 0.5, Form::Contig)?);
                }
                let d = g.op(GgmlOp::Dsv4HcPost, F32, [E, HC, t, 1], &src, &[])?;
                g.output(d);
                Ok(g)
            });
        }
    }
    // LIGHTNING_INDEXER: 4 index heads of 64 over 24 keys, 5 queries; two streams sharing one
    // mask; the mask causal (−inf past the query's position).
    const D: u64 = 64;
    const NH: u64 = 4;
    const NKV: u64 = 24;
    const T: u64 = 5;
    for kt in [F32, F16] {
        push(
            v,
            "LIGHTNING_INDEXER",
            format!("lightning_indexer/k{}/{D}x{NH}x{T}-kv{NKV}-s2", tn(kt)),
            EXACT,
            move |rng| {
                let mut g = Graph::new();
                let q = input(&mut g, rng, F32, [D, NH, T, 2], 0.5, Form::Contig)?;
                let k = input(&mut g, rng, kt, [D, 1, NKV, 2], 0.5, Form::Contig)?;
                let w = input(&mut g, rng, F32, [NH, T, 1, 2], 0.5, Form::Contig)?;
                let mut mask = Vec::new();
                for t in 0..T {
                    for j in 0..NKV {
                        let past = j <= NKV - T + t;
                        mask.push(if past { rng.random_range(-0.5f32..0.5) } else { f32::NEG_INFINITY });
                    }
                }
                let m = g.input(F16, [NKV, T, 1, 1], data::f16_bytes(&mask))?;
                let d = g.op(GgmlOp::LightningIndexer, F32, [NKV, T, 1, 2], &[q, k, w, m], &[])?;
                g.output(d);
                Ok(g)
            },
        );
    }
}
