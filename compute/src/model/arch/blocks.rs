//! Building blocks shared by the architectures: norms, Q/K/V projections with RoPE, the KV-cache
//! store, attention with and without flash attention, and the dense feed-forward block (the MoE
//! block is in [`super::moe`]).
//!
//! ref: ggml-compute-semantics.md §4.3 (FA on), §4.4 (FA off), §4.6 (deltas).

use crate::error::Result;
use crate::model::arch::{moe, Ctx};
use crate::model::graph_def::{KvKind, RopeParams, TensorId};
use crate::model::hparams::Arch;
use crate::op::{GluOp, UnaryOp};

/// `RMS_NORM` then `MUL` by `weight` (named `{name}-{il}`).
pub fn rms_norm_mul(b: &mut Ctx<'_>, x: TensorId, weight: TensorId, name: &str, il: u32) -> Result<TensorId> {
    let n = b.g.rms_norm(x, b.hp.rms_eps)?;
    b.name(n, "norm", il);
    let y = b.g.mul(n, weight)?;
    Ok(b.name(y, name, il))
}

/// What differs between the architectures' attention blocks.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttnOptions {
    /// Per-head RMS norm of Q and K with `attn_{q,k}_norm.weight` before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Scale Q by this after RoPE and use KQ scale 1 (Gemma 3); 0 = use `1/√D` in the attention op.
    pub q_scale: f32,
}

/// Query heads `[q0, q0 + n)` of the graph's Q projection that attend to its KV head `kv`.
///
/// A row-split shard may hold query heads from the middle of a KV group (nine query heads over
/// three KV heads split 5:4 puts KV head 1 on both devices), so its heads do not all share the same
/// number of KV heads; it lists its groups and [`attention_grouped`] attends each on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadGroup {
    /// The KV head (of the graph's `n_head_kv`).
    pub kv: u64,
    /// First query head (of the graph's `n_head`).
    pub q0: u64,
    /// Number of query heads.
    pub n: u64,
}

/// The RoPE parameters of layer `il`.
pub fn rope_params(b: &Ctx<'_>, il: u32) -> RopeParams {
    let hp = b.hp;
    let (base, scale) = if hp.is_swa_layer(il) {
        (hp.rope_freq_base_swa, 1.0)
    } else {
        (hp.rope_freq_base, hp.rope_freq_scale)
    };
    RopeParams {
        n_dims: hp.n_rot as i32,
        mode: hp.arch.rope_mode(),
        n_ctx_orig: hp.n_ctx_orig as i32,
        freq_base: base,
        freq_scale: scale,
        ext_factor: hp.yarn_ext_factor,
        attn_factor: hp.yarn_attn_factor,
        beta_fast: hp.yarn_beta_fast,
        beta_slow: hp.yarn_beta_slow,
    }
}

/// Self-attention of layer `il` on the normed input `cur` `[E, T]`; returns the output projection
/// `[E, T]` (before the residual).
pub fn attention(b: &mut Ctx<'_>, il: u32, cur: TensorId, o: AttnOptions) -> Result<TensorId> {
    attention_grouped(b, il, cur, o, None)
}

/// [`attention`], with `groups` (when given) saying which query heads attend to which KV head:
/// each group is attended on its own and the results are concatenated in group order, which must
/// cover the query heads `0..n_head` in order. Per head this is the same arithmetic as the
/// broadcast form.
pub fn attention_grouped(
    b: &mut Ctx<'_>,
    il: u32,
    cur: TensorId,
    o: AttnOptions,
    groups: Option<&[HeadGroup]>,
) -> Result<TensorId> {
    let hp = b.hp;
    if let Some(gs) = groups {
        let mut next = 0;
        for g in gs {
            if g.q0 != next || g.n == 0 || g.kv >= hp.n_head_kv {
                return Err(crate::Error::Model(format!(
                    "head groups {gs:?} do not cover {} query heads over {} KV heads in order",
                    hp.n_head, hp.n_head_kv
                )));
            }
            next = g.q0 + g.n;
        }
        if next != hp.n_head {
            return Err(crate::Error::Model(format!(
                "head groups {gs:?} cover {next} of {} query heads",
                hp.n_head
            )));
        }
    }
    let (e, h, hkv, d, dv, t) =
        (hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v, b.p.n_tokens);
    let pos = b.inputs.pos.ok_or_else(|| crate::Error::Model("attention inputs not created".into()))?;
    let rope = rope_params(b, il);
    let freqs = b.weight_opt("rope_freqs.weight", [hp.n_rot / 2, 1, 1, 1])?;

    // Projections (+ optional biases).
    let proj = |b: &mut Ctx<'_>, w: &str, bias: &str, rows: u64, name: &str| -> Result<TensorId> {
        let wt = b.lw(il, w, [e, rows, 1, 1])?;
        let mut x = b.g.mul_mat(wt, cur)?;
        b.name(x, name, il);
        if let Some(bs) = b.lw_opt(il, bias, [rows, 1, 1, 1])? {
            x = b.g.add(x, bs)?;
            b.name(x, name, il);
        }
        Ok(x)
    };
    // Biases (Qwen2 q/k/v, optional elsewhere) are added whenever the model has them (ref §4.6).
    // Node order as llama.cpp emits it (ref §4.3): the Q chain, V, then the K chain.
    let q = proj(b, "attn_q.weight", "attn_q.bias", h * d, "Qcur")?;
    let mut q = b.g.reshape(q, [d, h, t, 1])?;
    if o.qk_norm {
        let qn = b.lw(il, "attn_q_norm.weight", [d, 1, 1, 1])?;
        q = rms_norm_mul(b, q, qn, "Qcur_normed", il)?;
    }
    let mut q = b.g.rope_ext(q, pos, freqs, &rope)?;
    b.name(q, "Qcur", il);
    if let Some(temp) = b.inputs.attn_scale {
        // Mistral 3's per-token attention temperature, broadcast over D and H (ref §4.6).
        q = b.g.mul(q, temp)?;
        b.name(q, "Qcur_attn_temp_scaled", il);
    }
    let v = proj(b, "attn_v.weight", "attn_v.bias", hkv * dv, "Vcur")?;
    let v = b.g.reshape(v, [dv, hkv, t, 1])?;
    let k = proj(b, "attn_k.weight", "attn_k.bias", hkv * d, "Kcur")?;
    let mut k = b.g.reshape(k, [d, hkv, t, 1])?;
    if o.qk_norm {
        let kn = b.lw(il, "attn_k_norm.weight", [d, 1, 1, 1])?;
        k = rms_norm_mul(b, k, kn, "Kcur_normed", il)?;
    }
    let k = b.g.rope_ext(k, pos, freqs, &rope)?;
    b.name(k, "Kcur", il);
    let kq_scale = if o.q_scale != 0.0 {
        q = b.g.scale(q, o.q_scale)?;
        b.name(q, "Qcur_scaled", il);
        1.0
    } else if hp.attention_scale != 0.0 {
        hp.attention_scale
    } else {
        1.0 / (d as f32).sqrt()
    };

    // llama.cpp adds Q, V and K to the graph together, and then each cache store, so its node
    // order does not depend on what reads them later (ref §4.3 / §4.4). Models with sliding-window
    // layers (llama.cpp's iSWA cache: Gemma 3) add Q, K, V; the others Q, V, K.
    b.g.expand(q);
    if (0..hp.n_layer).any(|l| hp.is_swa_layer(l)) {
        b.g.expand(k);
        b.g.expand(v);
    } else {
        b.g.expand(v);
        b.g.expand(k);
    }

    // Store K and V for this ubatch into the cache (ref §4.3 / §4.4).
    let cache_k = b.kv_cache(il, KvKind::K)?;
    let cache_v = b.kv_cache(il, KvKind::V)?;
    let k_idxs = b.inputs.k_idxs.ok_or_else(|| crate::Error::Model("attention inputs not created".into()))?;
    let v_idxs = b.inputs.v_idxs.ok_or_else(|| crate::Error::Model("attention inputs not created".into()))?;
    let k_rows = b.g.view_2d(k, hkv * d, t, b.g.layout(k).nb[2], 0)?;
    let store_k = b.g.set_rows(cache_k, k_rows, k_idxs)?;
    b.g.expand(store_k);
    let store_v = if b.p.flash_attn {
        let v_rows = b.g.view_2d(v, hkv * dv, t, b.g.layout(v).nb[2], 0)?;
        b.g.set_rows(cache_v, v_rows, v_idxs)?
    } else {
        // Transposed V cache: one row per element, as llama.cpp stores it (a 2-D reshape of the
        // heads, the cache and the rows flattened to one element per row).
        let v_2d = b.g.reshape(v, [hkv * dv, t, 1, 1])?;
        let cache_flat = b.g.reshape(cache_v, [1, hkv * dv * b.p.kv_size, 1, 1])?;
        let v_flat = b.g.reshape(v_2d, [1, t * hkv * dv, 1, 1])?;
        b.g.set_rows(cache_flat, v_flat, v_idxs)?
    };
    b.g.expand(store_v);

    // Views of the attended cells.
    let nkv = b.p.n_kv;
    let kv_size = b.p.kv_size;
    // Row sizes in the cache type (block-quantized caches are addressed by whole rows).
    let kt = b.p.kv_type;
    let row =
        |n: u64| kt.row_size(n).ok_or_else(|| crate::Error::Model(format!("{kt} rows of {n} elements")));
    let (rk, rk_all) = (row(d)?, row(hkv * d)?);
    let mask = if hp.is_swa_layer(il) { b.inputs.kq_mask_swa } else { b.inputs.kq_mask };
    let kqv_out = match groups {
        None => {
            // llama.cpp views Q as one stream per sequence before permuting it (one stream here).
            let ql = b.g.layout(q);
            let qv = b.g.view(q, ql.ne, [ql.nb[1], ql.nb[2], ql.nb[3]], 0)?;
            let qperm = b.g.permute(qv, [0, 2, 1, 3])?;
            let kview = b.g.view(cache_k, [d, hkv, nkv, 1], [rk, rk_all, kv_size * rk_all], 0)?;
            let kperm = b.g.permute(kview, [0, 2, 1, 3])?;
            attend(b, il, AttendArgs { q: qperm, k: kperm, kv: 0, nv: hkv, n_q: h, mask, kq_scale })?
        }
        Some(gs) => {
            let nb = b.g.layout(q).nb;
            let mut out: Option<TensorId> = None;
            for g in gs {
                let qg = b.g.view(q, [d, g.n, t, 1], [nb[1], nb[2], nb[3]], g.q0 * nb[1])?;
                let qperm = b.g.permute(qg, [0, 2, 1, 3])?;
                let kview = b.g.view(cache_k, [d, 1, nkv, 1], [rk, rk_all, kv_size * rk_all], g.kv * rk)?;
                let kperm = b.g.permute(kview, [0, 2, 1, 3])?;
                let a = attend(
                    b,
                    il,
                    AttendArgs { q: qperm, k: kperm, kv: g.kv, nv: 1, n_q: g.n, mask, kq_scale },
                )?;
                out = Some(match out {
                    None => a,
                    Some(prev) => b.g.concat(prev, a, 0)?,
                });
            }
            out.ok_or_else(|| crate::Error::Model("no head groups".into()))?
        }
    };
    b.name(kqv_out, "kqv_out", il);
    b.g.expand(kqv_out);
    let wo = b.lw(il, "attn_output.weight", [h * dv, e, 1, 1])?;
    let mut out = b.g.mul_mat(wo, kqv_out)?;
    if let Some(bias) = b.lw_opt(il, "attn_output.bias", [e, 1, 1, 1])? {
        out = b.g.add(out, bias)?;
    }
    Ok(b.name(out, "attn_out", il))
}

/// The arguments of [`attend`].
struct AttendArgs {
    /// Queries `[D, T, n_q]` (permuted).
    q: TensorId,
    /// Keys `[D, n_kv, H_kv']` (a permuted view of the cache).
    k: TensorId,
    /// The values' KV heads `[kv, kv + nv)` of the cache.
    kv: u64,
    nv: u64,
    /// Query heads.
    n_q: u64,
    mask: Option<TensorId>,
    kq_scale: f32,
}

/// Attention of the queries `a.q` over keys `a.k` and the values of the matching cache heads
/// (flash attention or KQ → softmax → KQV, as `b.p.flash_attn` says): `[n_q * Dv, T]`.
fn attend(b: &mut Ctx<'_>, il: u32, a: AttendArgs) -> Result<TensorId> {
    let (dv, t, nkv, kv_size, kt) = (b.hp.head_dim_v, b.p.n_tokens, b.p.n_kv, b.p.kv_size, b.p.kv_type);
    let (hkv, nv) = (b.hp.n_head_kv, a.nv);
    let cache_v = b.kv_cache(il, KvKind::V)?;
    let row =
        |n: u64| kt.row_size(n).ok_or_else(|| crate::Error::Model(format!("{kt} rows of {n} elements")));
    if b.p.flash_attn {
        let (rv, rv_all) = (row(dv)?, row(hkv * dv)?);
        let vview = b.g.view(cache_v, [dv, nv, nkv, 1], [rv, rv_all, kv_size * rv_all], a.kv * rv)?;
        let vperm = b.g.permute(vview, [0, 2, 1, 3])?;
        let fa = b.g.flash_attn_ext(a.q, a.k, vperm, a.mask, a.kq_scale, 0.0, 0.0)?;
        b.name(fa, "fattn", il);
        b.g.reshape(fa, [a.n_q * dv, t, 1, 1])
    } else {
        // Transposed V: element (channel c, cell p) at c*kv_size + p (needs a non-block cache type).
        if kt.blck_size() != 1 {
            return Err(crate::Error::Model(format!("a {kt} V cache needs flash attention")));
        }
        let es = kt.type_size() as u64;
        let vview = b.g.view(
            cache_v,
            [nkv, nv, dv, 1],
            [kv_size * dv * es, kv_size * es, kv_size * hkv * dv * es],
            a.kv * kv_size * dv * es,
        )?;
        let vperm = b.g.permute(vview, [0, 2, 1, 3])?;
        let kq = b.g.mul_mat(a.k, a.q)?;
        b.g.set_prec_f32(kq);
        b.name(kq, "kq", il);
        let sm = b.g.soft_max_ext(kq, a.mask, a.kq_scale, 0.0)?;
        b.name(sm, "kq_soft_max", il);
        let kqv = b.g.mul_mat(vperm, sm)?;
        b.name(kqv, "kqv", il);
        let p = b.g.permute(kqv, [0, 2, 1, 3])?;
        b.g.cont_4d(p, [a.n_q * dv, t, 1, 1])
    }
}

/// On the model's last layer, keeps only the `out_ids` rows of the attention output and of the
/// residual (ref §4.3); elsewhere returns both unchanged.
pub fn select_outputs(
    b: &mut Ctx<'_>,
    il: u32,
    cur: TensorId,
    residual: TensorId,
) -> Result<(TensorId, TensorId)> {
    if !b.is_output_layer(il) {
        return Ok((cur, residual));
    }
    let ids = b.out_ids()?;
    let c = b.g.get_rows(cur, ids)?;
    let r = b.g.get_rows(residual, ids)?;
    Ok((c, r))
}

/// Dense gated feed-forward: `down(act(gate(x)) * up(x))`.
pub fn ffn_gated(b: &mut Ctx<'_>, il: u32, cur: TensorId, act: GluOp) -> Result<TensorId> {
    let names = ["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"];
    let out = ffn_gated_named(b, il, cur, act, b.hp.n_ff, names)?;
    Ok(b.name(out, "ffn_out", il))
}

/// A gated feed-forward of width `f` over the layer weights `[gate, up, down]`; the result is
/// left for the caller to name.
pub fn ffn_gated_named(
    b: &mut Ctx<'_>,
    il: u32,
    cur: TensorId,
    act: GluOp,
    f: u64,
    [gate_w, up_w, down_w]: [&str; 3],
) -> Result<TensorId> {
    let e = b.hp.n_embd;
    let wg = b.lw(il, gate_w, [e, f, 1, 1])?;
    let wu = b.lw(il, up_w, [e, f, 1, 1])?;
    let wd = b.lw(il, down_w, [f, e, 1, 1])?;
    let gate = b.g.mul_mat(wg, cur)?;
    b.name(gate, "ffn_gate", il);
    let up = b.g.mul_mat(wu, cur)?;
    b.name(up, "ffn_up", il);
    let x = b.g.glu_split(gate, up, act)?;
    b.name(x, if act == GluOp::Geglu { "ffn_geglu" } else { "ffn_swiglu" }, il);
    b.g.mul_mat(wd, x)
}

/// The feed-forward of layer `il`: MoE when the model has experts (plus Qwen2-MoE's shared
/// expert), else dense SwiGLU.
pub fn ffn_swiglu_or_moe(b: &mut Ctx<'_>, il: u32, cur: TensorId) -> Result<TensorId> {
    if b.hp.n_expert > 0 {
        let routed = moe::ffn_moe(b, il, cur)?;
        if b.hp.arch == Arch::Qwen2Moe {
            moe::add_shared_expert(b, il, cur, routed)
        } else {
            Ok(routed)
        }
    } else {
        ffn_gated(b, il, cur, GluOp::Swiglu)
    }
}

/// The standard pre-norm layer (llama, qwen2, qwen3): attention and FFN with residuals.
pub fn pre_norm_layer(b: &mut Ctx<'_>, il: u32, inp: TensorId, o: AttnOptions) -> Result<TensorId> {
    let e = b.hp.n_embd;
    let wn = b.lw(il, "attn_norm.weight", [e, 1, 1, 1])?;
    let cur = rms_norm_mul(b, inp, wn, "attn_norm", il)?;
    let cur = attention(b, il, cur, o)?;
    let (cur, inp) = select_outputs(b, il, cur, inp)?;
    let ffn_inp = b.g.add(cur, inp)?;
    b.name(ffn_inp, "ffn_inp", il);
    let wf = b.lw(il, "ffn_norm.weight", [e, 1, 1, 1])?;
    let cur = rms_norm_mul(b, ffn_inp, wf, "ffn_norm", il)?;
    let cur = ffn_swiglu_or_moe(b, il, cur)?;
    let out = b.g.add(cur, ffn_inp)?;
    Ok(b.name(out, "l_out", il))
}

/// Runs `layer` over the graph's layer range and finishes with the output head when the range
/// ends at the last layer.
pub fn layers_and_head(
    b: &mut Ctx<'_>,
    mut x: TensorId,
    mut layer: impl FnMut(&mut Ctx<'_>, u32, TensorId) -> Result<TensorId>,
) -> Result<TensorId> {
    b.attention_inputs()?;
    for il in b.p.layers.clone() {
        x = layer(b, il, x)?;
    }
    if b.p.layers.end == b.hp.n_layer {
        b.output_head(x)
    } else {
        Ok(x)
    }
}

/// Logit softcapping: `cap * tanh(x / cap)` as SCALE, TANH, SCALE.
pub fn softcap(b: &mut Ctx<'_>, x: TensorId, cap: f32) -> Result<TensorId> {
    let y = b.g.scale(x, 1.0 / cap)?;
    let y = b.g.unary(y, UnaryOp::Tanh)?;
    b.g.scale(y, cap)
}
