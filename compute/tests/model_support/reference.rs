//! An independent forward pass in f64, written plainly from the model definitions: per-token
//! loops, causal attention over all earlier positions, RoPE from its formula
//! (ref: ggml-compute-semantics.md §3.3 ROPE), no graphs, no KV-cache indexing.
//!
//! The only concession to the engine's numerics is `kv_f16`: keys and values are rounded to f16
//! when stored, because the engine's KV cache is F16 by configuration.

use super::Tiny;

fn rms_norm(x: &[f64], w: &[f32], eps: f32) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + eps as f64).sqrt();
    x.iter().zip(w).map(|(v, g)| v * r * *g as f64).collect()
}

/// `y = W x` for a GGUF `[K, M]` weight (row m holds the K inputs of output m).
fn matvec(w: &[f32], x: &[f64], m: usize) -> Vec<f64> {
    let k = x.len();
    assert_eq!(w.len(), k * m);
    (0..m).map(|r| w[r * k..(r + 1) * k].iter().zip(x).map(|(a, b)| *a as f64 * b).sum()).collect()
}

fn add_bias(x: &mut [f64], b: &[f32]) {
    for (v, c) in x.iter_mut().zip(b) {
        *v += *c as f64;
    }
}

fn rope(x: &mut [f64], pos: usize, n_rot: usize, base: f64, neox: bool) {
    for i in 0..n_rot / 2 {
        let theta = pos as f64 * base.powf(-2.0 * i as f64 / n_rot as f64);
        let (c, s) = (theta.cos(), theta.sin());
        let (a, b) = if neox { (i, i + n_rot / 2) } else { (2 * i, 2 * i + 1) };
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * x * (1.0 + 0.044715 * x * x)).tanh())
}

fn f16_round(x: f64) -> f64 {
    half::f16::from_f64(x).to_f64()
}

/// Logits at every position of `tokens`.
pub fn forward(m: &Tiny, tokens: &[u32], kv_f16: bool) -> Vec<Vec<f64>> {
    let s = &m.spec;
    let (e, h, hkv, d) = (s.e, s.h, s.hkv, s.d);
    let neox = !matches!(s.arch, "llama" | "mistral3");
    let n = tokens.len();
    let embd = m.get("token_embd.weight");
    let mut x: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| {
            let row = &embd[t as usize * e..(t as usize + 1) * e];
            row.iter().map(|&v| if s.gemma { v as f64 * (e as f64).sqrt() } else { v as f64 }).collect()
        })
        .collect();
    for il in 0..s.n_layer {
        let w = |name: &str| m.get(&format!("blk.{il}.{name}"));
        let swa = s.is_swa_layer(il);
        let base = if swa { 10000.0 } else { s.rope_base as f64 };
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (t, xt) in x.iter().enumerate() {
            let xn = rms_norm(xt, w("attn_norm.weight"), s.eps);
            let mut q = matvec(w("attn_q.weight"), &xn, h * d);
            let mut k = matvec(w("attn_k.weight"), &xn, hkv * d);
            let mut v = matvec(w("attn_v.weight"), &xn, hkv * d);
            if s.qkv_bias {
                add_bias(&mut q, w("attn_q.bias"));
                add_bias(&mut k, w("attn_k.bias"));
                add_bias(&mut v, w("attn_v.bias"));
            }
            for hh in 0..h {
                let qh = &mut q[hh * d..(hh + 1) * d];
                if s.qk_norm {
                    let nq = rms_norm(qh, w("attn_q_norm.weight"), s.eps);
                    qh.copy_from_slice(&nq);
                }
                rope(qh, t, d, base, neox);
                if s.temp_scale != 0.0 {
                    // Mistral 3: ln(⌊pos / period⌋ + 1) · scale + 1 (llama 4's temperature, offset 0).
                    let f = ((t / s.temp_floor) as f64 + 1.0).ln() * s.temp_scale as f64 + 1.0;
                    qh.iter_mut().for_each(|v| *v *= f);
                }
                if s.gemma {
                    qh.iter_mut().for_each(|v| *v /= (d as f64).sqrt());
                }
            }
            for hh in 0..hkv {
                let kh = &mut k[hh * d..(hh + 1) * d];
                if s.qk_norm {
                    let nk = rms_norm(kh, w("attn_k_norm.weight"), s.eps);
                    kh.copy_from_slice(&nk);
                }
                rope(kh, t, d, base, neox);
            }
            if kv_f16 {
                k.iter_mut().for_each(|v| *v = f16_round(*v));
                v.iter_mut().for_each(|x| *x = f16_round(*x));
            }
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        let scale = if s.gemma { 1.0 } else { 1.0 / (d as f64).sqrt() };
        let mut new_x = Vec::with_capacity(n);
        for t in 0..n {
            let mut o = vec![0.0; h * d];
            for hh in 0..h {
                let kh = hh / (h / hkv);
                let q = &qs[t][hh * d..(hh + 1) * d];
                let visible: Vec<usize> = (0..=t).filter(|&j| !(swa && t - j >= s.n_swa)).collect();
                let sc: Vec<f64> = visible
                    .iter()
                    .map(|&j| {
                        q.iter().zip(&ks[j][kh * d..(kh + 1) * d]).map(|(a, b)| a * b).sum::<f64>() * scale
                    })
                    .collect();
                let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = sc.iter().map(|v| (v - mx).exp()).collect();
                let sum: f64 = ex.iter().sum();
                for (p, &j) in ex.iter().zip(&visible) {
                    for c in 0..d {
                        o[hh * d + c] += p / sum * vs[j][kh * d + c];
                    }
                }
            }
            let mut attn = matvec(w("attn_output.weight"), &o, e);
            if s.gemma {
                attn = rms_norm(&attn, w("post_attention_norm.weight"), s.eps);
            }
            let h1: Vec<f64> = x[t].iter().zip(&attn).map(|(a, b)| a + b).collect();
            let hn = rms_norm(&h1, w("ffn_norm.weight"), s.eps);
            let mut ffn = if s.n_expert > 0 {
                moe(m, il, &hn)
            } else {
                let g = matvec(w("ffn_gate.weight"), &hn, s.f);
                let u = matvec(w("ffn_up.weight"), &hn, s.f);
                let act: Vec<f64> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| if s.gemma { gelu_tanh(*g) * u } else { silu(*g) * u })
                    .collect();
                matvec(w("ffn_down.weight"), &act, e)
            };
            if s.gemma {
                ffn = rms_norm(&ffn, w("post_ffw_norm.weight"), s.eps);
            }
            new_x.push(h1.iter().zip(&ffn).map(|(a, b)| a + b).collect());
        }
        x = new_x;
    }
    let head = if m.has("output.weight") { "output.weight" } else { "token_embd.weight" };
    x.iter()
        .map(|xt| {
            let xn = rms_norm(xt, m.get("output_norm.weight"), s.eps);
            matvec(m.get(head), &xn, s.vocab)
        })
        .collect()
}

fn moe(m: &Tiny, il: usize, x: &[f64]) -> Vec<f64> {
    let s = &m.spec;
    let w = |name: &str| m.get(&format!("blk.{il}.{name}"));
    let logits = matvec(w("ffn_gate_inp.weight"), x, s.n_expert);
    let mx = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let ex: Vec<f64> = logits.iter().map(|v| (v - mx).exp()).collect();
    let sum: f64 = ex.iter().sum();
    let probs: Vec<f64> = ex.iter().map(|v| v / sum).collect();
    let mut order: Vec<usize> = (0..s.n_expert).collect();
    order.sort_by(|a, b| probs[*b].total_cmp(&probs[*a]));
    let chosen = &order[..s.n_used];
    // Qwen2-MoE uses the softmax probabilities as they are; the others renormalise the top k.
    let wsum: f64 = if s.arch == "qwen2moe" { 1.0 } else { chosen.iter().map(|&i| probs[i]).sum() };
    let (fe, e) = (s.f_exp, s.e);
    let mut out = vec![0.0; e];
    for &ex_i in chosen {
        let slice = |name: &str, rows: usize, cols: usize| -> Vec<f32> {
            w(name)[ex_i * rows * cols..(ex_i + 1) * rows * cols].to_vec()
        };
        let g = matvec(&slice("ffn_gate_exps.weight", fe, e), x, fe);
        let u = matvec(&slice("ffn_up_exps.weight", fe, e), x, fe);
        let act: Vec<f64> = g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect();
        let dn = matvec(&slice("ffn_down_exps.weight", e, fe), &act, e);
        let wt = probs[ex_i] / wsum;
        for (o, v) in out.iter_mut().zip(&dn) {
            *o += wt * v;
        }
    }
    if s.f_shexp > 0 {
        // Shared expert: SwiGLU FFN scaled by sigmoid(gate_inp_shexp · x).
        let g = matvec(w("ffn_gate_shexp.weight"), x, s.f_shexp);
        let u = matvec(w("ffn_up_shexp.weight"), x, s.f_shexp);
        let act: Vec<f64> = g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect();
        let dn = matvec(w("ffn_down_shexp.weight"), &act, e);
        let z = matvec(w("ffn_gate_inp_shexp.weight"), x, 1)[0];
        let sig = 1.0 / (1.0 + (-z).exp());
        for (o, v) in out.iter_mut().zip(&dn) {
            *o += sig * v;
        }
    }
    out
}
