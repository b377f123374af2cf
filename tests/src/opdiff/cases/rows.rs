//! GET_ROWS (every type with a dequantizer), SET_ROWS (every type with a quantizer: the KV-cache
//! store, row-wise and into the transposed V cache), and the copies CPY / CONT / DUP. Quantized
//! destinations are compared exactly: every quantizer follows ggml's reference one byte for byte
//! (compute/tests/quant_peer.rs).
//!
//! ref: ggml-compute-semantics.md §3.3 GET_ROWS, SET_ROWS, CPY/DUP/CONT, §4.4.

use compute::{GgmlOp, GgmlType};
use rand::Rng;
use GgmlType::*;

use super::matmul::WEIGHT_TYPES;
use super::{i32_input, input, nel, push, tn, Case, Form, EXACT};
use crate::opdiff::data;
use crate::opdiff::graph::Graph;

pub fn cases(v: &mut Vec<Case>) {
    get_rows(v);
    set_rows(v);
    copies(v);
}

fn get_rows(v: &mut Vec<Case>) {
    for t in WEIGHT_TYPES.iter().copied().chain([I32]) {
        let forms: &[Form] = if matches!(t, F32 | F16 | Q4_0 | Q8_0 | I32) {
            &[Form::Contig, Form::Permuted, Form::Strided, Form::Offset]
        } else {
            &[Form::Contig]
        };
        for &form in forms {
            let name = format!("get_rows/{}/256x10x2/{}", tn(t), form.name());
            push(v, "GET_ROWS", name, EXACT, move |rng| {
                let mut g = Graph::new();
                let table = input(&mut g, rng, t, [256, 10, 2, 1], 1.0, form)?;
                let idx: Vec<i32> = (0..8).map(|_| rng.random_range(0..10)).collect();
                let ids = i32_input(&mut g, [4, 2, 1, 1], &idx)?;
                let dt = if t == I32 { I32 } else { F32 };
                let d = g.op(GgmlOp::GetRows, dt, [256, 4, 2, 1], &[table, ids], &[])?;
                g.output(d);
                Ok(g)
            });
        }
    }
    // The last-token row of the final hidden state (SmolLM2 E, prompt of 5).
    push(v, "GET_ROWS", "get_rows/f32/576x5/last-row".into(), EXACT, |rng| {
        let mut g = Graph::new();
        let x = input(&mut g, rng, F32, [576, 5, 1, 1], 1.0, Form::Contig)?;
        let ids = i32_input(&mut g, [1, 1, 1, 1], &[4])?;
        let d = g.op(GgmlOp::GetRows, F32, [576, 1, 1, 1], &[x, ids], &[])?;
        g.output(d);
        Ok(g)
    });
}

/// Every destination type ggml's CPU backend quantizes into (its CPU `from_float` table: all but the
/// grid-based IQ1/IQ2/IQ3 types, which need an importance matrix).
pub const SET_ROWS_TYPES: [GgmlType; 21] = [
    F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, NVFP4,
    Q1_0, Q2_0, TQ1_0, TQ2_0,
];

fn set_rows(v: &mut Vec<Case>) {
    for t in SET_ROWS_TYPES {
        for (idx_t, src_t, form) in
            [(I64, F32, Form::Contig), (I32, F32, Form::Strided), (I64, F16, Form::Contig)]
        {
            if src_t == F16 && t != F16 && t != F32 {
                continue;
            }
            let name = format!("set_rows/{}/256x16x4/{}-{}-{}", tn(t), tn(src_t), tn(idx_t), form.name());
            push(v, "SET_ROWS", name, EXACT, move |rng| {
                let mut g = Graph::new();
                // The destination keeps rows the indices miss (their old contents are compared too).
                let cache = input(&mut g, rng, t, [256, 16, 4, 1], 1.0, Form::Contig)?;
                let rows = input(&mut g, rng, src_t, [256, 3, 4, 1], 1.0, form)?;
                // Indices broadcast over dim 2 (2 index rows for 4 destination planes).
                let ix: Vec<i64> = (0..6).map(|i| (i * 5 + rng.random_range(0..5)) % 16).collect();
                let ids = match idx_t {
                    I64 => g.input(I64, [3, 2, 1, 1], data::i64_bytes(&ix))?,
                    _ => i32_input(&mut g, [3, 2, 1, 1], &ix.iter().map(|&x| x as i32).collect::<Vec<_>>())?,
                };
                g.op_into(GgmlOp::SetRows, cache, &[rows, ids, cache], &[]);
                g.output(cache);
                Ok(g)
            });
        }
    }
    // The KV store of SmolLM2: one F16 row per token (K), into the cache and into a view one row in.
    for offset_rows in [0u64, 1] {
        let name = format!("set_rows/f16/192x512/kv-rows-offset{offset_rows}");
        push(v, "SET_ROWS", name, EXACT, move |rng| {
            let mut g = Graph::new();
            let cache = g.input(F16, [192, 512, 1, 1], vec![0; 192 * 512 * 2])?;
            let n = 512 - offset_rows;
            let view = g.view(cache, [192, n, 1, 1], [384, 384 * n, 384 * n], 384 * offset_rows);
            let src = input(&mut g, rng, F32, [192, 5, 1, 1], 1.0, Form::Contig)?;
            let ids = g.input(I64, [5, 1, 1, 1], data::i64_bytes(&[7, 0, 300, n as i64 - 1, 42]))?;
            g.op_into(GgmlOp::SetRows, view, &[src, ids, view], &[]);
            g.output(cache);
            Ok(g)
        });
    }
    // Without flash attention V is stored transposed: one element per row (ref: §4.4).
    for t in [1u64, 5] {
        push(v, "SET_ROWS", format!("set_rows/f16/v-transposed/t{t}"), EXACT, move |rng| {
            let (n, kv) = (192u64, 512u64);
            let mut g = Graph::new();
            let cache =
                g.input(F16, [n * kv, 1, 1, 1], data::f16_bytes(&data::normal(rng, (n * kv) as usize, 1.0)))?;
            let cache_r = g.reshape(cache, [1, n * kv, 1, 1])?;
            let src = input(&mut g, rng, F32, [1, t * n, 1, 1], 1.0, Form::Contig)?;
            let idx: Vec<i64> =
                (0..t).flat_map(|tok| (0..n).map(move |c| (c * kv + 3 + tok) as i64)).collect();
            let ids = g.input(I64, [t * n, 1, 1, 1], data::i64_bytes(&idx))?;
            g.op_into(GgmlOp::SetRows, cache_r, &[src, ids, cache_r], &[]);
            g.output(cache);
            Ok(g)
        });
    }
}

fn copies(v: &mut Vec<Case>) {
    let ne = [64u64, 6, 4, 1];
    // CPY between the element types, from every input form.
    for (from, to) in [(F32, F32), (F32, F16), (F32, BF16), (F16, F32), (F16, F16), (BF16, F32), (F16, BF16)]
    {
        for form in [Form::Contig, Form::Permuted, Form::Transposed, Form::Strided] {
            let name = format!("cpy/{}-{}/64x6x4/{}", tn(from), tn(to), form.name());
            push(v, "CPY", name, EXACT, move |rng| {
                let mut g = Graph::new();
                let a = input(&mut g, rng, from, ne, 1.0, form)?;
                let dst = g.input(to, ne, vec![0; nel(ne) * to.type_size()])?;
                g.op_into(GgmlOp::Cpy, dst, &[a, dst], &[]);
                g.output(dst);
                Ok(g)
            });
        }
    }
    // F32 into a permuted view of the destination (the K/V cast of a no-cache graph).
    push(v, "CPY", "cpy/f32-f16/64x6x4/into-permuted".into(), EXACT, move |rng| {
        let mut g = Graph::new();
        let a = input(&mut g, rng, F32, ne, 1.0, Form::Contig)?;
        let dst = g.input(F16, [64, 4, 6, 1], vec![0; nel(ne) * 2])?;
        let dp = g.permute(dst, [0, 2, 1, 3])?;
        g.op_into(GgmlOp::Cpy, dp, &[a, dp], &[]);
        g.output(dst);
        Ok(g)
    });
    // Quantize (F32 → every quantized type) and dequantize (→ F32), same-type block copies.
    for t in SET_ROWS_TYPES.into_iter().filter(|t| t.blck_size() > 1) {
        let qne = [256u64, 3, 2, 1];
        push(v, "CPY", format!("cpy/f32-{}/256x3x2/contig", tn(t)), EXACT, move |rng| {
            let mut g = Graph::new();
            let a = input(&mut g, rng, F32, qne, 1.0, Form::Contig)?;
            let dst = g.input(t, qne, vec![0; t.row_size(256).unwrap_or(0) as usize * 6])?;
            g.op_into(GgmlOp::Cpy, dst, &[a, dst], &[]);
            g.output(dst);
            Ok(g)
        });
        for form in [Form::Contig, Form::Permuted] {
            push(v, "CPY", format!("cpy/{}-f32/256x3x2/{}", tn(t), form.name()), EXACT, move |rng| {
                let mut g = Graph::new();
                let a = input(&mut g, rng, t, qne, 1.0, form)?;
                let dst = g.input(F32, qne, vec![0; nel(qne) * 4])?;
                g.op_into(GgmlOp::Cpy, dst, &[a, dst], &[]);
                g.output(dst);
                Ok(g)
            });
        }
        push(v, "CPY", format!("cpy/{}-{}/256x3x2/contig", tn(t), tn(t)), EXACT, move |rng| {
            let mut g = Graph::new();
            let a = input(&mut g, rng, t, qne, 1.0, Form::Contig)?;
            let dst = g.input(t, qne, vec![0; t.row_size(256).unwrap_or(0) as usize * 6])?;
            g.op_into(GgmlOp::Cpy, dst, &[a, dst], &[]);
            g.output(dst);
            Ok(g)
        });
    }
    // CONT of the permuted attention output (SmolLM2: D=64, H=9, T=5) into [D*H, T].
    for t in [F32, F16] {
        push(v, "CONT", format!("cont/{}/64x5x9/permute-to-2d", tn(t)), EXACT, move |rng| {
            let mut g = Graph::new();
            let x = input(&mut g, rng, t, [64, 5, 9, 1], 1.0, Form::Contig)?;
            let p = g.permute(x, [0, 2, 1, 3])?;
            let c = g.op(GgmlOp::Cont, t, [64 * 9, 5, 1, 1], &[p], &[])?;
            g.output(c);
            Ok(g)
        });
    }
    for form in [Form::Transposed, Form::Strided] {
        push(v, "CONT", format!("cont/f32/64x6x4/{}", form.name()), EXACT, move |rng| {
            let mut g = Graph::new();
            let x = input(&mut g, rng, F32, ne, 1.0, form)?;
            let c = g.op(GgmlOp::Cont, F32, ne, &[x], &[])?;
            g.output(c);
            Ok(g)
        });
    }
    push(v, "DUP", "dup/f32/64x6x4/permuted".into(), EXACT, move |rng| {
        let mut g = Graph::new();
        let x = input(&mut g, rng, F32, ne, 1.0, Form::Permuted)?;
        let c = g.op(GgmlOp::Dup, F32, ne, &[x], &[])?;
        g.output(c);
        Ok(g)
    });
}
