//! SOFT_MAX (masks F32/F16, per-head masks, ALiBi, sinks, scale), DIAG_MASK_INF and
//! FLASH_ATTN_EXT (the KV-cache views llama.cpp sends: F16, F32, Q8_0 and Q4_0 caches, GQA ratios
//! 1–8, head sizes 64–256, padded causal masks, ALiBi, softcap, sinks, batches around ggml's 64-row
//! switch to its tiled path and a full ubatch).
//!
//! ref: ggml-compute-semantics.md §3.3 SOFT_MAX, FLASH_ATTN_EXT, §4.3. SOFT_MAX uses ggml's
//! vectorised `exp` and f64 sums: exact. Flash attention follows ggml's per-row path (f16 V
//! accumulator) and its tiled path (from 64 rows): exact.

use compute::{GgmlOp, GgmlType};
use half::f16;
use GgmlType::*;

use super::{f32_input, input, push, tn, Case, Form, EXACT};
use crate::opdiff::data;
use crate::opdiff::graph::{f32p, Graph, Id};
use crate::opdiff::Result;

const D: u64 = 64;
const HKV: u64 = 3;
const H: u64 = 9;
const NKV: u64 = 256;

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

/// One FLASH_ATTN_EXT case: types, shape and options.
#[derive(Clone, Copy)]
struct Fa {
    /// K and V cache type.
    kt: GgmlType,
    /// Head size, query heads, KV heads.
    d: u64,
    h: u64,
    hkv: u64,
    /// Query rows, KV cells, and cached tokens before the queries (the causal mask's offset).
    t: u64,
    nkv: u64,
    past: u64,
    mask: bool,
    max_bias: f32,
    softcap: f32,
    /// Attention sinks (src 4; only with a mask, src 3).
    sinks: bool,
}

impl Fa {
    /// SmolLM2's attention (D 64, 9 heads over 3), F16 cache, causal mask after 10 tokens.
    const fn smol(t: u64, nkv: u64) -> Fa {
        Fa {
            kt: F16,
            d: D,
            h: H,
            hkv: HKV,
            t,
            nkv,
            past: 10,
            mask: true,
            max_bias: 0.0,
            softcap: 0.0,
            sinks: false,
        }
    }
}

/// A permuted `[d, nkv, hkv]` view of a `[hkv*d, nkv]` cache of type `t` (ref: §4.3).
fn kv_view(g: &mut Graph, cache: Id, t: GgmlType, c: &Fa) -> Result<Id> {
    let row = t.row_size(c.d).unwrap_or(0);
    let v = g.view(cache, [c.d, c.hkv, c.nkv, 1], [row, c.hkv * row, c.hkv * row * c.nkv], 0);
    g.permute(v, [0, 2, 1, 3])
}

/// Under 64 query rows ggml runs its per-row path (f16 V accumulator for F16), from 64 rows its tiled
/// f32 path for F16/F32 caches and still the per-row one for quantized caches: llamad reproduces
/// each bit for bit.
fn fa_case(v: &mut Vec<Case>, name: String, c: Fa) {
    push(v, "FLASH_ATTN_EXT", name, EXACT, move |rng| {
        let mut g = Graph::new();
        let n = (c.hkv * c.d * c.nkv) as usize;
        let ne = [c.hkv * c.d, c.nkv, 1, 1];
        let ck = g.input(c.kt, ne, data::convert(c.kt, n, &data::normal(rng, n, 1.0))?)?;
        let cv = g.input(c.kt, ne, data::convert(c.kt, n, &data::normal(rng, n, 1.0))?)?;
        let kp = kv_view(&mut g, ck, c.kt, &c)?;
        let vp = kv_view(&mut g, cv, c.kt, &c)?;
        let q = input(&mut g, rng, F32, [c.d, c.h, c.t, 1], 1.0, Form::Contig)?;
        let qp = g.permute(q, [0, 2, 1, 3])?;
        let mut src = vec![qp, kp, vp];
        if c.mask {
            // Rows padded to a multiple of 64 past the query count, as llama.cpp pads them.
            let rows = c.t.next_multiple_of(64);
            src.push(mask_input(&mut g, F16, [c.nkv, rows, 1, 1], &causal(rows, c.nkv, c.past))?);
            if c.sinks {
                let s = data::normal(rng, c.h as usize, 1.0);
                src.push(f32_input(&mut g, [c.h, 1, 1, 1], &s)?);
            }
        }
        let scale = 1.0 / (c.d as f32).sqrt();
        let params = [f32p(scale), f32p(c.max_bias), f32p(c.softcap), 10];
        let d = g.op(GgmlOp::FlashAttnExt, F32, [c.d, c.h, c.t, 1], &src, &params)?;
        g.output(d);
        Ok(g)
    });
}

fn flash_attn(v: &mut Vec<Case>) {
    // Batch sizes around ggml's 64-row switch and its 64-row tiles, up to a full ubatch.
    for t in [1u64, 5, 64, 65, 70, 127, 128, 512] {
        let nkv = if t > 200 { 768 } else { NKV };
        fa_case(v, format!("flash_attn_ext/mask/f16/d64h9kv3/t{t}"), Fa::smol(t, nkv));
    }
    // The second ubatch of a prompt: 100 rows after 130 cached tokens (blocks across key tiles).
    fa_case(
        v,
        "flash_attn_ext/mask/f16/d64h9kv3/t100-past130".into(),
        Fa { past: 130, ..Fa::smol(100, NKV) },
    );
    // (name, kv type, mask, max_bias, softcap, sinks) at a per-row and two tiled batch sizes.
    let variants: [(&str, GgmlType, bool, f32, f32, bool); 6] = [
        ("nomask", F16, false, 0.0, 0.0, false),
        ("alibi-sinks", F16, true, 8.0, 0.0, true),
        ("softcap", F16, true, 0.0, 30.0, false),
        ("mask", F32, true, 0.0, 0.0, false),
        ("mask", Q8_0, true, 0.0, 0.0, false),
        ("mask", Q4_0, true, 0.0, 0.0, false),
    ];
    for t in [5u64, 70, 128] {
        for (vname, kt, mask, max_bias, softcap, sinks) in variants {
            let c = Fa { kt, mask, max_bias, softcap, sinks, ..Fa::smol(t, NKV) };
            fa_case(v, format!("flash_attn_ext/{vname}/{}/d64h9kv3/t{t}", tn(kt)), c);
        }
    }
    // Head sizes and GQA ratios 1–8.
    let shapes: [(u64, u64, u64); 6] =
        [(80, 4, 4), (96, 8, 4), (128, 8, 2), (256, 8, 1), (64, 6, 2), (64, 5, 1)];
    for (d, h, hkv) in shapes {
        for t in [5u64, 65] {
            let c = Fa { d, h, hkv, ..Fa::smol(t, 128) };
            fa_case(v, format!("flash_attn_ext/mask/f16/d{d}h{h}kv{hkv}/t{t}"), c);
        }
    }
}
