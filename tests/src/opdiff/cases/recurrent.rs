//! The recurrent ops: SSM_CONV and SSM_SCAN (Mamba-1, Mamba-2), RWKV_WKV6, GATED_LINEAR_ATTN and
//! RWKV_WKV7, with several sequences and state ids that permute or pick states.
//!
//! All exact: llamad forms every sum in ggml's order and fuses the products ggml's AVX2 build fuses
//! (compute/src/ops/recurrent.rs), and the exp/ln of SSM_SCAN are the C library's on both sides.
//! SSM_SCAN takes K (op_params\[0\], the state slots kept for rollback); K = 1 is the plain scan.
//! Values are small and decays lie in (0, 1), so the states stay of order 1.

use compute::{GgmlOp, GgmlType};
use rand::rngs::StdRng;
use rand::Rng;
use GgmlType::*;

use super::{f32_input, i32_input, input, nel, push, Case, Form, EXACT};
use crate::opdiff::data;
use crate::opdiff::graph::{f32p, Graph, Id};
use crate::opdiff::Result;

pub fn cases(v: &mut Vec<Case>) {
    ssm_conv(v);
    ssm_scan(v);
    wkv(v);
    delta(v);
}

/// An F32 input of shape `ne` whose values are `f` of normal values of deviation `scale`.
fn mapped(g: &mut Graph, rng: &mut StdRng, ne: [u64; 4], scale: f32, f: impl Fn(f32) -> f32) -> Result<Id> {
    let vals: Vec<f32> = data::normal(rng, nel(ne), scale).into_iter().map(f).collect();
    f32_input(g, ne, &vals)
}

/// A decay in (0, 1): `exp(-exp(x))`, as RWKV forms it.
fn decay(x: f32) -> f32 {
    (-(x - 0.5).exp()).exp()
}

fn ssm_conv(v: &mut Vec<Case>) {
    const D_CONV: u64 = 4;
    const D_INNER: u64 = 64;
    for n_t in [1u64, 5] {
        for n_s in [1u64, 2] {
            for form in [Form::Contig, Form::Offset] {
                let name = format!("ssm_conv/f32/{D_CONV}x{D_INNER}/t{n_t}/s{n_s}/{}", form.name());
                push(v, "SSM_CONV", name, EXACT, move |rng| {
                    let mut g = Graph::new();
                    let sx = input(&mut g, rng, F32, [D_CONV - 1 + n_t, D_INNER, n_s, 1], 0.5, form)?;
                    let c = input(&mut g, rng, F32, [D_CONV, D_INNER, 1, 1], 0.5, Form::Contig)?;
                    let d = g.op(GgmlOp::SsmConv, F32, [D_INNER, n_t, n_s, 1], &[sx, c], &[])?;
                    g.output(d);
                    Ok(g)
                });
            }
        }
    }
    // Other kernel widths: ggml's compiler rounds the products of the first multiple of 4 taps and
    // fuses the rest (3: all fused; 7: 4 + 3; 9: 8 + 1; 12: none fused).
    for d_conv in [3u64, 7, 9, 12] {
        push(v, "SSM_CONV", format!("ssm_conv/f32/{d_conv}x{D_INNER}/t5/s2/contig"), EXACT, move |rng| {
            let mut g = Graph::new();
            let sx = input(&mut g, rng, F32, [d_conv + 4, D_INNER, 2, 1], 0.5, Form::Contig)?;
            let c = input(&mut g, rng, F32, [d_conv, D_INNER, 1, 1], 0.5, Form::Contig)?;
            let d = g.op(GgmlOp::SsmConv, F32, [D_INNER, 5, 2, 1], &[sx, c], &[])?;
            g.output(d);
            Ok(g)
        });
    }
}

/// One SSM_SCAN case: `a_per_state` is Mamba-1 (A {d_state, n_head}), else Mamba-2 (A {1, n_head});
/// `slots` is K, the states kept per sequence (the last and K − 1 before it, for rollback).
#[derive(Clone, Copy)]
struct Scan {
    d_state: u64,
    head_dim: u64,
    n_head: u64,
    n_group: u64,
    n_tok: u64,
    n_seqs: u64,
    a_per_state: bool,
    slots: u64,
}

/// States stored in the input (the ids choose among them).
const N_STATES: u64 = 3;

fn scan_graph(p: Scan, rng: &mut StdRng) -> Result<Graph> {
    let Scan { d_state, head_dim, n_head, n_group, n_tok, n_seqs, a_per_state, slots } = p;
    let mut g = Graph::new();
    let s = input(&mut g, rng, F32, [d_state, head_dim, n_head, N_STATES], 0.5, Form::Contig)?;
    let x = input(&mut g, rng, F32, [head_dim, n_head, n_tok, n_seqs], 0.5, Form::Contig)?;
    // Time steps around 0 (softplus of both signs), one far above 20 (softplus is the identity
    // there) when there are enough of them.
    let dt_ne = [n_head, n_tok, n_seqs, 1];
    let mut dts = data::normal(rng, nel(dt_ne), 1.0);
    if dts.len() > 2 {
        dts[2] = 21.5;
    }
    let dt = f32_input(&mut g, dt_ne, &dts)?;
    // A < 0: the decay exp(δ·A) lies in (0, 1).
    let a_ne = [if a_per_state { d_state } else { 1 }, n_head, 1, 1];
    let a = mapped(&mut g, rng, a_ne, 1.0, |x| -(x.abs() + 0.5))?;
    let b = input(&mut g, rng, F32, [d_state, n_group, n_tok, n_seqs], 0.5, Form::Contig)?;
    let c = input(&mut g, rng, F32, [d_state, n_group, n_tok, n_seqs], 0.5, Form::Contig)?;
    // Sequence q takes state (2 + 2q) mod 3: [2] for one sequence, [2, 1] for two.
    let ids: Vec<i32> = (0..n_seqs as i32).map(|q| (2 + 2 * q) % N_STATES as i32).collect();
    let ids = i32_input(&mut g, [n_seqs, 1, 1, 1], &ids)?;
    let len = head_dim * n_head * n_tok * n_seqs + slots * d_state * head_dim * n_head * n_seqs;
    let d = g.op(GgmlOp::SsmScan, F32, [len, 1, 1, 1], &[s, x, dt, a, b, c, ids], &[slots as i32])?;
    g.output(d);
    Ok(g)
}

fn ssm_scan(v: &mut Vec<Case>) {
    let mut scans = Vec::new();
    // Mamba-2: d_state 16 runs ggml's scalar loop; 128 (the models' size) its vector loop; 48 both.
    for n_group in [1, 2] {
        for n_tok in [1, 4] {
            for n_seqs in [1, 2] {
                let p = Scan {
                    d_state: 16,
                    head_dim: 8,
                    n_head: 4,
                    n_group,
                    n_tok,
                    n_seqs,
                    a_per_state: false,
                    slots: 1,
                };
                scans.push(("mamba2", p));
            }
        }
    }
    let big = |d_state, slots| Scan {
        d_state,
        head_dim: 8,
        n_head: 4,
        n_group: 2,
        n_tok: 4,
        n_seqs: 2,
        a_per_state: false,
        slots,
    };
    for d_state in [48, 128] {
        scans.push(("mamba2", big(d_state, 1)));
    }
    // Rollback slots: the states after the last K tokens (K ≤ n_tok, so every slot is written).
    scans.push(("mamba2", big(16, 3)));
    scans.push(("mamba2", big(128, 4)));
    scans.push(("mamba2", Scan { n_head: 8, n_group: 4, ..big(32, 2) }));
    // A group count that is not a power of two (ggml only needs it to divide the heads).
    scans.push(("mamba2", Scan { n_head: 6, n_group: 3, ..big(16, 1) }));
    // Mamba-1: head_dim 1, one head per channel (d_inner 32), a decay per state element.
    for n_tok in [1, 4] {
        for n_seqs in [1, 2] {
            let p = Scan {
                d_state: 16,
                head_dim: 1,
                n_head: 32,
                n_group: 1,
                n_tok,
                n_seqs,
                a_per_state: true,
                slots: 1,
            };
            scans.push(("mamba1", p));
        }
    }
    for (kind, p) in scans {
        let name = format!(
            "ssm_scan/{kind}/f32/st{}x{}x{}/g{}/t{}/s{}/k{}",
            p.d_state, p.head_dim, p.n_head, p.n_group, p.n_tok, p.n_seqs, p.slots
        );
        push(v, "SSM_SCAN", name, EXACT, move |rng| scan_graph(p, rng));
    }
}

/// The linear-attention ops: each input's role.
#[derive(Clone, Copy, PartialEq)]
enum In {
    /// Normal values of deviation 0.5.
    Plain,
    /// A decay in (0, 1).
    Decay,
    /// One row per head ({S, H}), normal values.
    PerHead,
}

fn wkv(v: &mut Vec<Case>) {
    use In::*;
    let ops: [(GgmlOp, &str, &'static [In]); 3] = [
        // k, v, r, time_first, time_decay.
        (GgmlOp::RwkvWkv6, "rwkv_wkv6", &[Plain, Plain, Plain, PerHead, Decay]),
        // k, v, q, g.
        (GgmlOp::GatedLinearAttn, "gla", &[Plain, Plain, Plain, Decay]),
        // r, w, k, v, a, b.
        (GgmlOp::RwkvWkv7, "rwkv_wkv7", &[Plain, Decay, Plain, Plain, Plain, Plain]),
    ];
    const H: u64 = 2;
    const T: u64 = 4;
    for (op, name, roles) in ops {
        // ggml's AVX2 WKV7 kernel steps over 32 channels at a time: S = 64 only. WKV6 and GLA also
        // at S = 12 (8 channels in vectors, 4 in ggml's scalar loop).
        let sizes: &[u64] = if op == GgmlOp::RwkvWkv7 { &[64] } else { &[12, 16, 64] };
        for &s in sizes {
            for n_seqs in [1u64, 2] {
                let case = format!("{name}/f32/S{s}xH{H}xT{T}/s{n_seqs}");
                push(v, op.name(), case, EXACT, move |rng| {
                    let mut g = Graph::new();
                    let mut srcs = Vec::new();
                    for &role in roles {
                        let id = match role {
                            Plain => input(&mut g, rng, F32, [s, H, T, 1], 0.5, Form::Contig)?,
                            PerHead => input(&mut g, rng, F32, [s, H, 1, 1], 0.5, Form::Contig)?,
                            Decay => mapped(&mut g, rng, [s, H, T, 1], 0.5, decay)?,
                        };
                        srcs.push(id);
                    }
                    srcs.push(input(&mut g, rng, F32, [s * s * H, n_seqs, 1, 1], 0.5, Form::Contig)?);
                    let scale = 1.0 / (s as f32).sqrt() * rng.random_range(0.5..1.5);
                    let params = if op == GgmlOp::GatedLinearAttn { vec![f32p(scale)] } else { vec![] };
                    let d = g.op(op, F32, [s * H, T + s * n_seqs, 1, 1], &srcs, &params)?;
                    g.output(d);
                    Ok(g)
                });
            }
        }
    }
}

/// SOLVE_TRI (the chunked delta net's triangular solve) and GATED_DELTA_NET (Qwen3-Next's fused
/// recurrence; per-head decay and Kimi's per-row KDA decay; snapshot slots K).
pub fn delta(v: &mut Vec<Case>) {
    for (n, k, batch) in [(8u64, 3u64, [1u64, 1]), (64, 16, [2, 3])] {
        let name = format!("solve_tri/f32/{n}x{n}-rhs{k}-b{}x{}", batch[0], batch[1]);
        push(v, "SOLVE_TRI", name, EXACT, move |rng| {
            let mut g = Graph::new();
            // Lower triangular, unit-ish diagonal, small off-diagonal: a well-conditioned solve.
            let mut a = data::normal(rng, nel([n, n, batch[0], batch[1]]), 0.1);
            for (i, x) in a.iter_mut().enumerate() {
                let (c, r) = ((i as u64) % n, (i as u64 / n) % n);
                if c > r {
                    *x = 0.0;
                } else if c == r {
                    *x = 1.0 + x.abs();
                }
            }
            let a = f32_input(&mut g, [n, n, batch[0], batch[1]], &a)?;
            let b = input(&mut g, rng, F32, [k, n, batch[0], batch[1]], 1.0, Form::Contig)?;
            let d = g.op(GgmlOp::SolveTri, F32, [k, n, batch[0], batch[1]], &[a, b], &[])?;
            g.output(d);
            Ok(g)
        });
    }
    // S = 64 and 128 (the models' head size); H = 4 value heads over 2 q/k heads; 1 and 5 tokens;
    // two sequences sharing one q/k sequence.
    for (s, n_t, slots, kda) in [
        (64u64, 1u64, 1u64, false),
        (64, 5, 1, false),
        (64, 5, 3, false),
        (64, 5, 1, true),
        (128, 4, 2, true),
        (16, 3, 1, false),
    ] {
        let name =
            format!("gated_delta_net/f32/S{s}xH4xT{n_t}/s2/k{slots}/{}", if kda { "kda" } else { "scalar" });
        push(v, "GATED_DELTA_NET", name, EXACT, move |rng| {
            const H: u64 = 4;
            const N_SEQS: u64 = 2;
            let mut g = Graph::new();
            let q = input(&mut g, rng, F32, [s, 2, n_t, 1], 0.2, Form::Contig)?;
            let k = input(&mut g, rng, F32, [s, 2, n_t, 1], 0.2, Form::Contig)?;
            let vv = input(&mut g, rng, F32, [s, H, n_t, N_SEQS], 0.5, Form::Contig)?;
            // Log decays below 0, gates β in (0, 1).
            let g_ne = [if kda { s } else { 1 }, H, n_t, N_SEQS];
            let gate = mapped(&mut g, rng, g_ne, 0.5, |x| -(x.abs() + 0.05))?;
            let beta = mapped(&mut g, rng, [1, H, n_t, N_SEQS], 1.0, |x| 1.0 / (1.0 + (-x).exp()))?;
            let st = input(&mut g, rng, F32, [s, s, H, N_SEQS], 0.3, Form::Contig)?;
            let rows = n_t * N_SEQS + slots * s * N_SEQS;
            let d = g.op(
                GgmlOp::GatedDeltaNet,
                F32,
                [s * H, rows, 1, 1],
                &[q, k, vv, gate, beta, st],
                &[slots as i32],
            )?;
            g.output(d);
            Ok(g)
        });
    }
}
