//! SOFT_MAX (masks F32/F16, per-head masks, ALiBi, sinks, scale), DIAG_MASK_INF and
//! FLASH_ATTN_EXT (the F16 KV-cache views llama.cpp sends, GQA, masks, ALiBi, softcap).
//!
//! ref: ggml-compute-semantics.md §3.3 SOFT_MAX, FLASH_ATTN_EXT, §4.3. SOFT_MAX uses ggml's
//! vectorised `exp` and f64 sums: exact. Flash attention keeps ggml's f16 V accumulator only
//! approximately (tests/interop/README.md): bounded by NMSE.

use compute::{GgmlOp, GgmlType};
use half::f16;
use GgmlType::*;

use super::{f32_input, input, push, tn, Case, Form, EXACT};
use crate::opdiff::compare::Bound;
use crate::opdiff::data;
use crate::opdiff::graph::{f32p, Graph, Id};
use crate::opdiff::Result;

const D: u64 = 64;
const HKV: u64 = 3;
const H: u64 = 9;
const NKV: u64 = 256;
const KV: u64 = 512;

/// The causal mask of `t` queries after `past` cached tokens over `nkv` cells (−inf beyond).
fn causal(t: u64, nkv: u64, past: u64) -> Vec<f32> {
    let mut m = vec![0f32; (t * nkv) as usize];
    for i in 0..t {
        for j in (past + i + 1)..nkv {
            m[(i * nkv + j) as usize] = f32::NEG_INFINITY;
        }
    }
    m
}

fn mask_input(g: &mut Graph, t: GgmlType, ne: [u64; 4], vals: &[f32]) -> Result<Id> {
    match t {
        F16 => g.input(F16, ne, vals.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect()),
        _ => f32_input(g, ne, vals),
    }
}

pub fn cases(v: &mut Vec<Case>) {
    softmax(v);
    flash_attn(v);
    flash_attn_back(v);
}

/// FLASH_ATTN_BACK (ggml-opt's legacy attention gradient): head size 40 (a vector part and
/// leftovers), 5 queries over 37 keys, 4 query heads sharing 2 key heads; masked and not. The three
/// gradients come back in one flat result, each at a 16-byte multiple.
fn flash_attn_back(v: &mut Vec<Case>) {
    const DB: u64 = 40;
    const NQ: u64 = 5;
    const M: u64 = 37;
    for masked in [0, 1] {
        push(
            v,
            "FLASH_ATTN_BACK",
            format!("flash_attn_back/f32/{DB}x{NQ}x4-kv{M}x2/masked{masked}"),
            EXACT,
            move |rng| {
                let mut g = Graph::new();
                let q = input(&mut g, rng, F32, [DB, NQ, 4, 1], 0.5, Form::Contig)?;
                let k = input(&mut g, rng, F32, [DB, M, 2, 1], 0.5, Form::Contig)?;
                let vt = input(&mut g, rng, F32, [M, DB, 2, 1], 0.5, Form::Contig)?;
                let d = input(&mut g, rng, F32, [DB, NQ, 4, 1], 0.5, Form::Contig)?;
                let pad = |x: u64| x.next_multiple_of(16);
                let end = pad(4 * DB * NQ * 4) + pad(4 * DB * M * 2) + pad(4 * M * DB * 2);
                let out = g.op(GgmlOp::FlashAttnBack, F32, [end / 4, 1, 1, 1], &[q, k, vt, d], &[masked])?;
                g.output(out);
                Ok(g)
            },
        );
    }
}

fn softmax(v: &mut Vec<Case>) {
    // (name, mask type, per-head mask, max_bias, sinks)
    let variants: [(&str, Option<GgmlType>, bool, f32, bool); 7] = [
        ("nomask", None, false, 0.0, false),
        ("mask-f32", Some(F32), false, 0.0, false),
        ("mask-f16", Some(F16), false, 0.0, false),
        ("mask-f16-per-head", Some(F16), true, 0.0, false),
        ("alibi-f16", Some(F16), false, 8.0, false),
        ("alibi-f32-per-head", Some(F32), true, 8.0, false),
        ("sinks-f16", Some(F16), false, 0.0, true),
    ];
    for t in [1u64, 5] {
        for (vname, mt, per_head, max_bias, sinks) in variants {
            for form in [Form::Contig, Form::Offset] {
                let name = format!("soft_max/{vname}/f32/256x{t}x9/{}", form.name());
                push(v, "SOFT_MAX", name, EXACT, move |rng| {
                    let mut g = Graph::new();
                    let kq = input(&mut g, rng, F32, [NKV, t, H, 1], 4.0, form)?;
                    let mut src = vec![kq];
                    if let Some(mt) = mt {
                        let heads = if per_head { H } else { 1 };
                        let mut m = Vec::new();
                        for h in 0..heads {
                            m.extend(causal(t, NKV, 10 + h));
                        }
                        // Mask rows padded past the query count, as llama.cpp pads them.
                        src.push(mask_input(&mut g, mt, [NKV, t, heads, 1], &m)?);
                    }
                    if sinks {
                        let s = data::normal(rng, H as usize, 1.0);
                        src.push(f32_input(&mut g, [H, 1, 1, 1], &s)?);
                    }
                    let d =
                        g.op(GgmlOp::SoftMax, F32, [NKV, t, H, 1], &src, &[f32p(0.125), f32p(max_bias)])?;
                    g.output(d);
                    Ok(g)
                });
            }
        }
    }
    push(v, "DIAG_MASK_INF", "diag_mask_inf/f32/32x5x3/past2".into(), EXACT, |rng| {
        let mut g = Graph::new();
        let x = input(&mut g, rng, F32, [32, 5, 3, 1], 1.0, Form::Contig)?;
        let d = g.op(GgmlOp::DiagMaskInf, F32, [32, 5, 3, 1], &[x], &[2])?;
        g.output(d);
        Ok(g)
    });
}

/// A permuted `[D, NKV, HKV]` view of a `[HKV*D, KV]` cache of type `t` (ref: §4.3).
fn kv_view(g: &mut Graph, cache: Id, t: GgmlType) -> Result<Id> {
    let row = t.row_size(D).unwrap_or(0);
    let v = g.view(cache, [D, HKV, NKV, 1], [row, HKV * row, HKV * row * NKV], 0);
    g.permute(v, [0, 2, 1, 3])
}

fn flash_attn(v: &mut Vec<Case>) {
    // (name, kv type, mask, max_bias, softcap)
    let variants: [(&str, GgmlType, bool, f32, f32); 5] = [
        ("mask", F16, true, 0.0, 0.0),
        ("nomask", F16, false, 0.0, 0.0),
        ("alibi", F16, true, 8.0, 0.0),
        ("softcap", F16, true, 0.0, 30.0),
        ("mask", F32, true, 0.0, 0.0),
    ];
    // Under 64 query rows llamad follows ggml's per-row path bit for bit (f16 V accumulator for F16);
    // from 64 rows ggml switches to a tiled f32 path whose order llamad does not reproduce.
    for t in [1u64, 5, 70] {
        let bound = if t < 64 { EXACT } else { Bound::close(1e-11, 1e-5) };
        for (vname, kt, masked, max_bias, softcap) in variants {
            let name = format!("flash_attn_ext/{vname}/{}/d64h9kv3/t{t}", tn(kt));
            push(v, "FLASH_ATTN_EXT", name, bound, move |rng| {
                let mut g = Graph::new();
                let n = (HKV * D * KV) as usize;
                let ck =
                    g.input(kt, [HKV * D, KV, 1, 1], data::convert(kt, n, &data::normal(rng, n, 1.0))?)?;
                let cv =
                    g.input(kt, [HKV * D, KV, 1, 1], data::convert(kt, n, &data::normal(rng, n, 1.0))?)?;
                let kp = kv_view(&mut g, ck, kt)?;
                let vp = kv_view(&mut g, cv, kt)?;
                let q = input(&mut g, rng, F32, [D, H, t, 1], 1.0, Form::Contig)?;
                let qp = g.permute(q, [0, 2, 1, 3])?;
                let mut src = vec![qp, kp, vp];
                if masked {
                    src.push(mask_input(&mut g, F16, [NKV, t, 1, 1], &causal(t, NKV, 10))?);
                }
                let params = [f32p(0.125), f32p(max_bias), f32p(softcap), 10];
                let d = g.op(GgmlOp::FlashAttnExt, F32, [D, H, t, 1], &src, &params)?;
                g.output(d);
                Ok(g)
            });
        }
    }
}
