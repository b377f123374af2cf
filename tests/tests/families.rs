//! Model families llamactl does not run, end to end through llama.cpp's own master (issue 24,
//! point 3): a tiny GGUF written by our GGUF writer, evaluated by llama.cpp (the reference peer's
//! `tests/interop/ref_master.py`) three ways — on its local CPU, with every layer on its own RPC
//! server, and with every layer on llamad — and the logits at every prompt position compared.
//!
//! - **Mamba** (state-space): SSM_CONV and SSM_SCAN with the recurrent state in the worker's
//!   buffers, plus the ops around them (GET_ROWS of the state, CONCAT, the scans' state views).
//! - **Mamba-2** (the state-space half of hybrid models): the multi-head scan with groups and the
//!   grouped RMS norm.
//! - **Qwen3-MoE with IQ/TQ experts**: MUL_MAT_ID over every grid IQ type, IQ4_XS, TQ1_0 and TQ2_0.
//! - **RWKV-7**: RWKV_WKV7 with its state in the worker's buffers, L2_NORM of the keys, the token
//!   shift (CONCAT of the shift state with views of the normed input), the fused lerp (REPEAT, MUL
//!   and ADD with broadcast), the head-wise group norm (NORM), the decay, ICLR, value-residual and
//!   gate LoRAs (TANH, SIGMOID, EXP, SCALE), SUM_ROWS of the bonus term and ReLU² channel mix.
//! - **RWKV-6**: RWKV_WKV6, the data-dependent token shift (TANH, PERMUTE and CONT, a MUL_MAT
//!   broadcast over the five lerps), the decay LoRA (EXP of NEG of EXP), the group norm and the
//!   SiLU-gated output.
//! - **Qwen3-Next** (the gated-delta-net hybrid): GATED_DELTA_NET over the whole prompt (the
//!   fused chunked path), SSM_CONV after CONCAT with the conv state, SOFTPLUS of the decay, the
//!   keys' L2 norm (RMS_NORM and SCALE in this llama.cpp), keys repeated to the value heads, the
//!   SiLU-gated RMS norm; a full-attention layer with the sigmoid query gate, Q/K norms and NEOX
//!   RoPE; MoE with a sigmoid-gated shared expert.
//! - **A vision encoder** through libmtmd (`tests/interop/ref_mtmd.py`): a LLaVA-style `mlp`
//!   projector (CLIP ViT) and a llama text model, the image embeddings and the logits after the
//!   image compared. clip places its whole graph on the RPC device (ggml-rpc reports a GPU that
//!   supports every op): IM2COL of the F16 patch kernel and the patch MUL_MAT (F16 × F16), CONCAT
//!   of the class embedding, GET_ROWS of the positions, NORM (pre-layer and layer norms), the
//!   attention (MUL_MAT with 65 keys, SOFT_MAX; with flash attention CPY to F16 via `ggml_cast`
//!   and FLASH_ATTN_EXT), GELU_QUICK in the FFN, GET_ROWS of the patch tokens and GELU in the
//!   projector.
//!
//! llamad's kernels for these ops equal ggml's bit for bit (the differential op tests), so the
//! logits through llamad must equal those through llama.cpp's RPC server (NMSE ≤ 1e-12; the
//! vision encoder with flash attention ≤ 1e-7, see its test), and
//! both equal llama.cpp's local CPU within ggml's own bound (NMSE ≤ 5e-4; measured below).
//!
//! Needs the peer (skipped with a reason without it, unless `LLAMAD_REQUIRE_PEER=1`) and the
//! release llamad (`$LLAMAD_BIN`, else target/release/llamad).

use std::path::{Path, PathBuf};
use std::process::Command;

use compute::gguf::{Array, GgufWriter, Value};
use compute::quant::testing::Xorshift;
use compute::GgmlType;
use e2e::server::{llamad_bin, peer_python, workspace_root, Server};

const PROMPT: [u32; 9] = [1, 17, 42, 99, 5, 56, 11, 72, 5];
const VOCAB: usize = 100;

/// A deterministic generator of small values.
struct Gen(Xorshift);

impl Gen {
    fn f(&mut self) -> f32 {
        self.0.unit() * 2.0 - 1.0
    }

    fn v(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
}

/// The SentencePiece vocabulary llama.cpp needs to load the model (unknown, BOS, EOS, the newline
/// byte, then plain pieces).
fn add_vocab(w: &mut GgufWriter) {
    let tokens: Vec<String> = (0..VOCAB)
        .map(|i| match i {
            0 => "<unk>".into(),
            1 => "<s>".into(),
            2 => "</s>".into(),
            3 => "<0x0A>".into(),
            _ => format!("\u{2581}t{i}"),
        })
        .collect();
    let types: Vec<i32> = (0..VOCAB).map(|i| [2, 3, 3, 6].get(i).copied().unwrap_or(1)).collect();
    let scores: Vec<f32> = (0..VOCAB).map(|i| -(i as f32)).collect();
    w.add("tokenizer.ggml.model", "llama");
    w.add_strings("tokenizer.ggml.tokens", &tokens);
    w.add("tokenizer.ggml.scores", Value::Array(Array::F32(scores)));
    w.add("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
}

/// A writer for `arch`: its u32 then f32 hyper-parameters (keys without the `arch.` prefix, in
/// order) and the vocabulary.
fn model_writer(arch: &str, u32s: &[(&str, u64)], f32s: &[(&str, f32)]) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add("general.architecture", arch);
    for &(k, v) in u32s {
        w.add(&format!("{arch}.{k}"), Value::U32(v as u32));
    }
    for &(k, v) in f32s {
        w.add(&format!("{arch}.{k}"), Value::F32(v));
    }
    add_vocab(&mut w);
    w
}

/// An F32 tensor.
fn t(w: &mut GgufWriter, name: &str, ne: &[u64], vals: Vec<f32>) {
    w.add_f32_tensor(name, ne, &vals).unwrap();
}

/// An F32 tensor of shape `ne`, normal-ish values of deviation about `scale` (its element count
/// drawn from `g`).
fn rt(w: &mut GgufWriter, g: &mut Gen, name: &str, ne: &[u64], scale: f32) {
    t(w, name, ne, g.v(ne.iter().product::<u64>() as usize, scale));
}

/// Norm weights around 1.
fn norm(g: &mut Gen, n: u64) -> Vec<f32> {
    g.v(n as usize, 0.2).iter().map(|x| 1.0 + x).collect()
}

/// The token embeddings, the output norm and the output matrix (values of deviation `out_scale`).
fn add_head(w: &mut GgufWriter, g: &mut Gen, e: u64, out_scale: f32) {
    rt(w, g, "token_embd.weight", &[e, VOCAB as u64], 1.0);
    t(w, "output_norm.weight", &[e], norm(g, e));
    rt(w, g, "output.weight", &[e, VOCAB as u64], out_scale);
}

/// A two-layer Mamba (v1): E = 64, d_inner = 128, d_state = 16, d_conv = 4, dt_rank = 4.
fn mamba(path: &Path) {
    let (e, di, ds, dc, dr, nl) = (64u64, 128u64, 16u64, 4u64, 4u64, 2);
    let mut g = Gen(Xorshift(0x5eed_0001));
    let mut w = model_writer(
        "mamba",
        &[
            ("context_length", 512),
            ("embedding_length", e),
            ("block_count", nl),
            ("feed_forward_length", 0),
            ("attention.head_count", 0),
            ("ssm.conv_kernel", dc),
            ("ssm.inner_size", di),
            ("ssm.state_size", ds),
            ("ssm.time_step_rank", dr),
        ],
        &[("attention.layer_norm_rms_epsilon", 1e-5)],
    );
    add_head(&mut w, &mut g, e, 0.3);
    for il in 0..nl {
        let b = |s: &str| format!("blk.{il}.{s}");
        t(&mut w, &b("attn_norm.weight"), &[e], norm(&mut g, e));
        rt(&mut w, &mut g, &b("ssm_in.weight"), &[e, 2 * di], 0.15);
        rt(&mut w, &mut g, &b("ssm_conv1d.weight"), &[dc, di], 0.5);
        rt(&mut w, &mut g, &b("ssm_conv1d.bias"), &[di], 0.1);
        rt(&mut w, &mut g, &b("ssm_x.weight"), &[di, dr + 2 * ds], 0.1);
        rt(&mut w, &mut g, &b("ssm_dt.weight"), &[dr, di], 0.5);
        rt(&mut w, &mut g, &b("ssm_dt.bias"), &[di], 0.5);
        // A = −exp(A_log): negative, so the state decays.
        let a: Vec<f32> = g.v((ds * di) as usize, 1.0).iter().map(|x| -(0.5 + x.abs())).collect();
        t(&mut w, &b("ssm_a"), &[ds, di], a);
        rt(&mut w, &mut g, &b("ssm_d"), &[di], 1.0);
        rt(&mut w, &mut g, &b("ssm_out.weight"), &[di, e], 0.1);
    }
    w.write_file(path).unwrap();
}

/// A two-layer Mamba-2 (the state-space half of hybrid models such as Granite 4 and Nemotron-H):
/// E = 64, d_inner = 128 in 8 heads of 16, d_state = 16, 2 groups, d_conv = 4.
fn mamba2(path: &Path) {
    let (e, di, ds, dc, nh, ng, nl) = (64u64, 128u64, 16u64, 4u64, 8u64, 2u64, 2);
    let mut g = Gen(Xorshift(0x5eed_0002));
    let mut w = model_writer(
        "mamba2",
        &[
            ("context_length", 512),
            ("embedding_length", e),
            ("block_count", nl),
            ("feed_forward_length", 0),
            ("attention.head_count", 0),
            ("ssm.conv_kernel", dc),
            ("ssm.inner_size", di),
            ("ssm.state_size", ds),
            ("ssm.time_step_rank", nh),
            ("ssm.group_count", ng),
        ],
        &[("attention.layer_norm_rms_epsilon", 1e-5)],
    );
    let conv_ch = di + 2 * ng * ds;
    add_head(&mut w, &mut g, e, 0.3);
    for il in 0..nl {
        let b = |s: &str| format!("blk.{il}.{s}");
        t(&mut w, &b("attn_norm.weight"), &[e], norm(&mut g, e));
        let d_in_proj = 2 * di + 2 * ng * ds + nh;
        rt(&mut w, &mut g, &b("ssm_in.weight"), &[e, d_in_proj], 0.15);
        rt(&mut w, &mut g, &b("ssm_conv1d.weight"), &[dc, conv_ch], 0.5);
        rt(&mut w, &mut g, &b("ssm_conv1d.bias"), &[conv_ch], 0.1);
        rt(&mut w, &mut g, &b("ssm_dt.bias"), &[nh], 0.5);
        let a: Vec<f32> = g.v(nh as usize, 1.0).iter().map(|x| -(0.5 + x.abs())).collect();
        t(&mut w, &b("ssm_a"), &[1, nh], a);
        t(&mut w, &b("ssm_d"), &[1, nh], g.v(nh as usize, 1.0));
        t(&mut w, &b("ssm_norm.weight"), &[di / ng, ng], norm(&mut g, di));
        rt(&mut w, &mut g, &b("ssm_out.weight"), &[di, e], 0.1);
    }
    w.write_file(path).unwrap();
}

/// A layer norm's weight (around 1) and bias (small).
fn layer_norm(w: &mut GgufWriter, g: &mut Gen, name: &str, n: u64) {
    t(w, &format!("{name}.weight"), &[n], norm(g, n));
    rt(w, g, &format!("{name}.bias"), &[n], 0.1);
}

/// The parts RWKV-6 and RWKV-7 share: the embedding with its layer norm (`LN0`), the output layer
/// norm with bias and the output matrix.
fn add_rwkv_head(w: &mut GgufWriter, g: &mut Gen, e: u64) {
    rt(w, g, "token_embd.weight", &[e, VOCAB as u64], 1.0);
    layer_norm(w, g, "token_embd_norm", e);
    layer_norm(w, g, "output_norm", e);
    rt(w, g, "output.weight", &[e, VOCAB as u64], 0.3);
}

/// A two-layer RWKV-7 ("Goose"): E = 128 in 2 heads of 64, FFN 256, every LoRA of rank 16, with
/// the output gate.
fn rwkv7(path: &Path) {
    let (e, hs, ff, r, nl) = (128u64, 64u64, 256u64, 16u64, 2);
    let mut g = Gen(Xorshift(0x5eed_0004));
    let mut w = model_writer(
        "rwkv7",
        &[
            ("context_length", 512),
            ("embedding_length", e),
            ("block_count", nl),
            ("feed_forward_length", ff),
            ("attention.head_count", 0),
            ("wkv.head_size", hs),
            ("attention.decay_lora_rank", r),
            ("attention.iclr_lora_rank", r),
            ("attention.value_residual_mix_lora_rank", r),
            ("attention.gate_lora_rank", r),
            ("token_shift_count", 2),
        ],
        &[("attention.layer_norm_epsilon", 1e-5)],
    );
    add_rwkv_head(&mut w, &mut g, e);
    for il in 0..nl {
        let b = |s: &str| format!("blk.{il}.{s}");
        layer_norm(&mut w, &mut g, &b("attn_norm"), e);
        layer_norm(&mut w, &mut g, &b("attn_norm_2"), e);
        // The decay, in-context learning rate, value-residual and gate LoRAs.
        for (x, s0) in [("w", 0.5), ("a", 0.5), ("v", 0.5)] {
            rt(&mut w, &mut g, &b(&format!("time_mix_{x}0.weight")), &[e], s0);
            rt(&mut w, &mut g, &b(&format!("time_mix_{x}1.weight")), &[e, r], 0.2);
            rt(&mut w, &mut g, &b(&format!("time_mix_{x}2.weight")), &[r, e], 0.2);
        }
        rt(&mut w, &mut g, &b("time_mix_g1.weight"), &[e, r], 0.2);
        rt(&mut w, &mut g, &b("time_mix_g2.weight"), &[r, e], 0.3);
        // Token-shift interpolation factors in [0, 1] for r, w, k, v, a, g.
        let lerp: Vec<f32> = g.v((e * 6) as usize, 0.5).iter().map(|x| 0.5 + x).collect();
        t(&mut w, &b("time_mix_lerp_fused.weight"), &[e, 1, 1, 6], lerp);
        t(&mut w, &b("time_mix_k_k.weight"), &[e], norm(&mut g, e));
        t(&mut w, &b("time_mix_k_a.weight"), &[e], norm(&mut g, e));
        rt(&mut w, &mut g, &b("time_mix_r_k.weight"), &[e], 0.3);
        for m in ["key", "value", "receptance"] {
            rt(&mut w, &mut g, &b(&format!("time_mix_{m}.weight")), &[e, e], 0.1);
        }
        layer_norm(&mut w, &mut g, &b("time_mix_ln"), e);
        rt(&mut w, &mut g, &b("time_mix_output.weight"), &[e, e], 0.1);
        let lerp: Vec<f32> = g.v(e as usize, 0.5).iter().map(|x| 0.5 + x).collect();
        t(&mut w, &b("channel_mix_lerp_k.weight"), &[e, 1, 1], lerp);
        rt(&mut w, &mut g, &b("channel_mix_key.weight"), &[e, ff], 0.1);
        rt(&mut w, &mut g, &b("channel_mix_value.weight"), &[ff, e], 0.1);
    }
    w.write_file(path).unwrap();
}

/// A two-layer RWKV-6 ("Finch"): E = 128 in 2 heads of 64, FFN 256, the data-dependent
/// token-shift LoRA of rank 8 (five of them, fused) and the decay LoRA of rank 16.
fn rwkv6(path: &Path) {
    let (e, hs, ff, xm, xd, nl) = (128u64, 64u64, 256u64, 8u64, 16u64, 2);
    let mut g = Gen(Xorshift(0x5eed_0005));
    let mut w = model_writer(
        "rwkv6",
        &[
            ("context_length", 512),
            ("embedding_length", e),
            ("block_count", nl),
            ("feed_forward_length", ff),
            ("attention.head_count", 0),
            ("wkv.head_size", hs),
            ("time_mix_extra_dim", xm),
            ("time_decay_extra_dim", xd),
            ("rescale_every_n_layers", 0),
            ("token_shift_count", 2),
        ],
        &[("attention.layer_norm_epsilon", 1e-5)],
    );
    add_rwkv_head(&mut w, &mut g, e);
    let lerp = |g: &mut Gen, k: usize| -> Vec<f32> { g.v(k, 0.5).iter().map(|x| 0.5 + x).collect() };
    for il in 0..nl {
        let b = |s: &str| format!("blk.{il}.{s}");
        layer_norm(&mut w, &mut g, &b("attn_norm"), e);
        layer_norm(&mut w, &mut g, &b("attn_norm_2"), e);
        rt(&mut w, &mut g, &b("time_mix_w1.weight"), &[e, xm * 5], 0.2);
        rt(&mut w, &mut g, &b("time_mix_w2.weight"), &[xm, e, 5], 0.2);
        t(&mut w, &b("time_mix_lerp_x.weight"), &[e, 1, 1], lerp(&mut g, e as usize));
        t(&mut w, &b("time_mix_lerp_fused.weight"), &[e, 1, 1, 5], lerp(&mut g, (e * 5) as usize));
        t(&mut w, &b("time_mix_first.weight"), &[hs, e / hs], g.v(e as usize, 0.3));
        // w = exp(−exp(decay + LoRA)): decay around −1 keeps w near 0.7.
        let decay: Vec<f32> = g.v(e as usize, 0.5).iter().map(|x| x - 1.0).collect();
        t(&mut w, &b("time_mix_decay.weight"), &[e], decay);
        rt(&mut w, &mut g, &b("time_mix_decay_w1.weight"), &[e, xd], 0.2);
        rt(&mut w, &mut g, &b("time_mix_decay_w2.weight"), &[xd, e], 0.2);
        for m in ["key", "value", "receptance", "gate"] {
            rt(&mut w, &mut g, &b(&format!("time_mix_{m}.weight")), &[e, e], 0.1);
        }
        layer_norm(&mut w, &mut g, &b("time_mix_ln"), e);
        rt(&mut w, &mut g, &b("time_mix_output.weight"), &[e, e], 0.1);
        t(&mut w, &b("channel_mix_lerp_k.weight"), &[e, 1, 1], lerp(&mut g, e as usize));
        t(&mut w, &b("channel_mix_lerp_r.weight"), &[e, 1, 1], lerp(&mut g, e as usize));
        rt(&mut w, &mut g, &b("channel_mix_key.weight"), &[e, ff], 0.1);
        rt(&mut w, &mut g, &b("channel_mix_value.weight"), &[ff, e], 0.1);
        rt(&mut w, &mut g, &b("channel_mix_receptance.weight"), &[e, e], 0.1);
    }
    w.write_file(path).unwrap();
}

/// A two-layer Qwen3-Next, the gated-delta-net hybrid: layer 0 linear attention (one key head and
/// two value heads of 64, so the keys are repeated; conv kernel 4), layer 1 full attention (two
/// gated query heads of 64, one KV head, Q/K norms); both with a MoE FFN of 4 experts (2 used,
/// width 64) plus a gated shared expert.
fn qwen3next(path: &Path) {
    let (e, h, hkv, d, nl) = (128u64, 2u64, 1u64, 64u64, 2);
    let (ds, nk, nv, dc) = (64u64, 1u64, 2u64, 4u64);
    let (ne, fe) = (4u64, 64u64);
    let (key_dim, value_dim) = (ds * nk, ds * nv);
    let conv_dim = 2 * key_dim + value_dim;
    let mut g = Gen(Xorshift(0x5eed_0006));
    let mut w = model_writer(
        "qwen3next",
        &[
            ("context_length", 512),
            ("embedding_length", e),
            ("block_count", nl),
            ("feed_forward_length", 256),
            ("attention.head_count", h),
            ("attention.head_count_kv", hkv),
            ("attention.key_length", d),
            ("attention.value_length", d),
            ("expert_count", ne),
            ("expert_used_count", 2),
            ("expert_feed_forward_length", fe),
            ("expert_shared_feed_forward_length", fe),
            ("ssm.conv_kernel", dc),
            ("ssm.inner_size", value_dim),
            ("ssm.state_size", ds),
            ("ssm.time_step_rank", nv),
            ("ssm.group_count", nk),
            ("full_attention_interval", 2),
        ],
        &[("rope.freq_base", 1e6), ("attention.layer_norm_rms_epsilon", 1e-6)],
    );
    add_head(&mut w, &mut g, e, 0.3);
    for il in 0..nl {
        let b = |s: &str| format!("blk.{il}.{s}");
        t(&mut w, &b("attn_norm.weight"), &[e], norm(&mut g, e));
        t(&mut w, &b("post_attention_norm.weight"), &[e], norm(&mut g, e));
        if il == 0 {
            // Gated delta net.
            rt(&mut w, &mut g, &b("attn_qkv.weight"), &[e, conv_dim], 0.1);
            rt(&mut w, &mut g, &b("attn_gate.weight"), &[e, value_dim], 0.1);
            rt(&mut w, &mut g, &b("ssm_conv1d.weight"), &[dc, conv_dim], 0.5);
            rt(&mut w, &mut g, &b("ssm_dt.bias"), &[nv], 0.5);
            // A = −exp(A_log): negative, so the state decays.
            let a: Vec<f32> = g.v(nv as usize, 0.5).iter().map(|x| -(1.0 + x)).collect();
            t(&mut w, &b("ssm_a"), &[nv], a);
            rt(&mut w, &mut g, &b("ssm_ba.weight"), &[e, 2 * nv], 0.2);
            t(&mut w, &b("ssm_norm.weight"), &[ds], norm(&mut g, ds));
            rt(&mut w, &mut g, &b("ssm_out.weight"), &[value_dim, e], 0.1);
        } else {
            // Full attention with the query's output gate.
            rt(&mut w, &mut g, &b("attn_q.weight"), &[e, 2 * h * d], 0.1);
            rt(&mut w, &mut g, &b("attn_k.weight"), &[e, hkv * d], 0.1);
            rt(&mut w, &mut g, &b("attn_v.weight"), &[e, hkv * d], 0.1);
            rt(&mut w, &mut g, &b("attn_output.weight"), &[h * d, e], 0.1);
            t(&mut w, &b("attn_q_norm.weight"), &[d], norm(&mut g, d));
            t(&mut w, &b("attn_k_norm.weight"), &[d], norm(&mut g, d));
        }
        rt(&mut w, &mut g, &b("ffn_gate_inp.weight"), &[e, ne], 0.3);
        rt(&mut w, &mut g, &b("ffn_gate_exps.weight"), &[e, fe, ne], 0.1);
        rt(&mut w, &mut g, &b("ffn_up_exps.weight"), &[e, fe, ne], 0.1);
        rt(&mut w, &mut g, &b("ffn_down_exps.weight"), &[fe, e, ne], 0.1);
        rt(&mut w, &mut g, &b("ffn_gate_inp_shexp.weight"), &[e], 0.1);
        rt(&mut w, &mut g, &b("ffn_gate_shexp.weight"), &[e, fe], 0.1);
        rt(&mut w, &mut g, &b("ffn_up_shexp.weight"), &[e, fe], 0.1);
        rt(&mut w, &mut g, &b("ffn_down_shexp.weight"), &[fe, e], 0.1);
    }
    w.write_file(path).unwrap();
}

/// llama.cpp's logits at every position of [`PROMPT`], with every layer on `endpoint` when given.
fn logits(python: &Path, model: &Path, endpoint: Option<&str>) -> Vec<Vec<f32>> {
    let dir = tempfile::tempdir().unwrap();
    let eps = endpoint.map(|e| format!("[\"{e}\"]")).unwrap_or_else(|| "[]".into());
    let ngl = if endpoint.is_some() { 99 } else { 0 };
    let toks: Vec<String> = PROMPT.iter().map(|t| t.to_string()).collect();
    let args = format!(
        "{{\"model\": \"{}\", \"endpoints\": {eps}, \"n_gpu_layers\": {ngl}, \"n_ctx\": 64, \"n_threads\": 1, \
         \"verbose\": false, \"token_prompts\": [[{}]], \"logits_dir\": \"{}\"}}",
        model.display(),
        toks.join(", "),
        dir.path().display()
    );
    let args_path = dir.path().join("args.json");
    std::fs::write(&args_path, args).unwrap();
    let script = workspace_root().join("tests/interop/ref_master.py");
    let out = Command::new(python)
        .arg(&script)
        .arg(&args_path)
        .arg(dir.path().join("out.json"))
        .current_dir(workspace_root().join("tests/interop"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ref_master.py ({endpoint:?}) failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    read_npy_f32_2d(&dir.path().join("logits-0.npy"))
}

/// Reads a little-endian f32 2-D `.npy` file (format versions 1–3, C order).
fn read_npy_f32_2d(path: &Path) -> Vec<Vec<f32>> {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..6], b"\x93NUMPY", "not an npy file");
    let (hlen, start) = if b[6] == 1 {
        (u16::from_le_bytes([b[8], b[9]]) as usize, 10)
    } else {
        (u32::from_le_bytes(b[8..12].try_into().unwrap()) as usize, 12)
    };
    let header = std::str::from_utf8(&b[start..start + hlen]).unwrap();
    assert!(header.contains("'descr': '<f4'") && header.contains("'fortran_order': False"), "{header}");
    let shape = &header[header.find("'shape': (").unwrap() + 10..];
    let dims: Vec<usize> =
        shape[..shape.find(')').unwrap()].split(',').filter_map(|s| s.trim().parse().ok()).collect();
    let data: Vec<f32> =
        b[start + hlen..].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(data.len(), dims.iter().product::<usize>());
    data.chunks_exact(dims[1]).map(|r| r.to_vec()).collect()
}

/// NMSE of `got` against `want` over all positions.
fn nmse(got: &[Vec<f32>], want: &[Vec<f32>]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut e, mut s) = (0.0f64, 0.0f64);
    for (g, w) in got.iter().zip(want) {
        for (&a, &b) in g.iter().zip(w) {
            e += (a as f64 - b as f64).powi(2);
            s += (b as f64).powi(2);
        }
    }
    e / s
}

fn peer() -> Option<PathBuf> {
    let p = peer_python();
    if p.is_none() {
        assert!(
            std::env::var("LLAMAD_REQUIRE_PEER").as_deref() != Ok("1"),
            "LLAMAD_REQUIRE_PEER=1 but there is no reference peer (tests/peer/build-peer.sh)"
        );
        eprintln!("skipped: no reference peer (tests/peer/build-peer.sh)");
    }
    p
}

/// A two-layer Qwen3-MoE (4 experts, 2 used per token) whose expert matrices are of type
/// `EXPERTS` (valid random blocks for the grid IQ types, quantized values otherwise); E = 256 and
/// expert width 256 so that every block size fits. MUL_MAT_ID over IQ weights, the MoE router
/// (ARGSORT/TOP_K, GET_ROWS of the weights, SOFT_MAX) and Q/K norms.
fn qwen3moe(path: &Path, experts: GgmlType) {
    let (e, h, hkv, d, fe, ne, nl) = (256u64, 4u64, 2u64, 64u64, 256u64, 4u64, 2);
    let mut g = Gen(Xorshift(0x5eed_0003 ^ experts as u64));
    let mut w = model_writer(
        "qwen3moe",
        &[
            ("context_length", 512),
            ("embedding_length", e),
            ("block_count", nl),
            ("feed_forward_length", 512),
            ("attention.head_count", h),
            ("attention.head_count_kv", hkv),
            ("expert_count", ne),
            ("expert_used_count", 2),
            ("expert_feed_forward_length", fe),
        ],
        &[("rope.freq_base", 1e6), ("attention.layer_norm_rms_epsilon", 1e-6)],
    );
    let typed = |w: &mut GgufWriter, g: &mut Gen, name: &str, ne: &[u64]| {
        let n: u64 = ne.iter().product();
        let vals = g.v(n as usize, 0.06);
        let bytes = match compute::quant::kernels(experts).from_f32 {
            Some(from) => {
                let row = experts.row_size(ne[0]).unwrap() as usize;
                let mut q = vec![0u8; row * (n / ne[0]) as usize];
                for (src, dst) in vals.chunks_exact(ne[0] as usize).zip(q.chunks_exact_mut(row)) {
                    from(src, dst);
                }
                q
            }
            None => {
                let nb = (n as usize) / experts.blck_size();
                compute::quant::testing::random_grid_blocks(experts, nb, 0.035, n ^ 17).expect("grid type")
            }
        };
        w.add_tensor(name, experts, ne, bytes).unwrap();
    };
    add_head(&mut w, &mut g, e, 0.1);
    for il in 0..nl {
        let b = |s: &str| format!("blk.{il}.{s}");
        t(&mut w, &b("attn_norm.weight"), &[e], norm(&mut g, e));
        rt(&mut w, &mut g, &b("attn_q.weight"), &[e, h * d], 0.06);
        rt(&mut w, &mut g, &b("attn_k.weight"), &[e, hkv * d], 0.06);
        rt(&mut w, &mut g, &b("attn_v.weight"), &[e, hkv * d], 0.06);
        rt(&mut w, &mut g, &b("attn_output.weight"), &[h * d, e], 0.06);
        t(&mut w, &b("attn_q_norm.weight"), &[d], norm(&mut g, d));
        t(&mut w, &b("attn_k_norm.weight"), &[d], norm(&mut g, d));
        t(&mut w, &b("ffn_norm.weight"), &[e], norm(&mut g, e));
        rt(&mut w, &mut g, &b("ffn_gate_inp.weight"), &[e, ne], 0.3);
        typed(&mut w, &mut g, &b("ffn_gate_exps.weight"), &[e, fe, ne]);
        typed(&mut w, &mut g, &b("ffn_up_exps.weight"), &[e, fe, ne]);
        typed(&mut w, &mut g, &b("ffn_down_exps.weight"), &[fe, e, ne]);
    }
    w.write_file(path).unwrap();
}

/// llama.cpp's master on the model `write` makes: local CPU, over its own RPC server and over
/// llamad; returns the NMSEs (llamad vs RPC server, llamad vs local).
fn through_llamad(name: &str, write: impl Fn(&Path)) -> Option<(f64, f64)> {
    let python = peer()?;
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join(format!("{name}.gguf"));
    write(&model);
    let local = logits(&python, &model, None);
    assert_eq!(local.len(), PROMPT.len());
    assert!(local.iter().flatten().all(|x| x.is_finite()), "{name}: llama.cpp's local logits are not finite");
    let reference = Server::reference(&python).expect("start llama.cpp's RPC server");
    let over_ref = logits(&python, &model, Some(&reference.addr.to_string()));
    // llama-cpp-python 0.3.36 is a 7.0.0 master.
    let llamad = Server::llamad_with(&llamad_bin(), None, &["--protocol", "7"]).expect("start llamad");
    let over_llamad = logits(&python, &model, Some(&llamad.addr.to_string()));
    let (vs_ref, vs_local, ref_vs_local) =
        (nmse(&over_llamad, &over_ref), nmse(&over_llamad, &local), nmse(&over_ref, &local));
    eprintln!(
        "{name} logits NMSE: llamad vs llama.cpp RPC server {vs_ref:.2e}, llamad vs local CPU {vs_local:.2e} \
         (llama.cpp RPC server vs local CPU {ref_vs_local:.2e})"
    );
    Some((vs_ref, vs_local))
}

/// A family whose ops llamad computes bit for bit as ggml: over llamad equals over llama.cpp's RPC
/// server (NMSE ≤ 1e-12), and both equal llama.cpp's local CPU within ggml's bound (5e-4).
fn exact_family(name: &str, write: impl Fn(&Path)) {
    let Some((vs_ref, vs_local)) = through_llamad(name, write) else { return };
    assert!(vs_ref <= 1e-12, "{name}: over llamad vs over llama.cpp's RPC server: NMSE {vs_ref}");
    assert!(vs_local <= 5e-4, "{name}: over llamad vs llama.cpp's local CPU: NMSE {vs_local}");
}

#[test]
fn mamba_through_llamacpp_master_over_llamad() {
    exact_family("mamba", mamba);
}

#[test]
fn mamba2_through_llamacpp_master_over_llamad() {
    exact_family("mamba2", mamba2);
}

#[test]
fn moe_with_iq_experts_through_llamacpp_master_over_llamad() {
    // The grid types (no quantizer anywhere: random valid blocks) and the other IQ/TQ families.
    use GgmlType::*;
    let mut bad = Vec::new();
    for ty in [IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, IQ4_XS, TQ1_0, TQ2_0] {
        let name = format!("qwen3moe-{ty}");
        let Some((vs_ref, vs_local)) = through_llamad(&name, |p| qwen3moe(p, ty)) else { return };
        // The quantized dot products sum each block in integers and differ from ggml's AVX2 ones
        // only in the float order of blocks (the differential op tests: NMSE ≤ 1e-10); the
        // router's softmax and top-k can amplify that into the logits (measured up to 1.1e-6,
        // IQ3_XXS). A wrong kernel gives NMSE of order 1; ggml's own MUL_MAT bound is 5e-4.
        if vs_ref > 1e-4 || vs_local > 5e-4 {
            bad.push(format!("{name}: NMSE {vs_ref:.2e} vs the RPC server, {vs_local:.2e} vs local"));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn rwkv7_through_llamacpp_master_over_llamad() {
    exact_family("rwkv7", rwkv7);
}

#[test]
fn rwkv6_through_llamacpp_master_over_llamad() {
    exact_family("rwkv6", rwkv6);
}

#[test]
fn qwen3next_through_llamacpp_master_over_llamad() {
    exact_family("qwen3next", qwen3next);
}

/// The image side (pixels) of the vision test, a multiple of the patch.
const IMAGE: u64 = 32;

/// A two-layer llama (E = 64 in 4 heads of 16, 2 KV heads, FFN 128): the text model the
/// projector's embeddings feed.
fn llama_text(path: &Path) {
    let (e, h, hkv, ff, nl) = (64u64, 4u64, 2u64, 128u64, 2);
    let d = e / h;
    let mut g = Gen(Xorshift(0x5eed_0007));
    let mut w = model_writer(
        "llama",
        &[
            ("context_length", 512),
            ("embedding_length", e),
            ("block_count", nl),
            ("feed_forward_length", ff),
            ("attention.head_count", h),
            ("attention.head_count_kv", hkv),
        ],
        &[("rope.freq_base", 10000.0), ("attention.layer_norm_rms_epsilon", 1e-5)],
    );
    add_head(&mut w, &mut g, e, 0.3);
    for il in 0..nl {
        let b = |s: &str| format!("blk.{il}.{s}");
        t(&mut w, &b("attn_norm.weight"), &[e], norm(&mut g, e));
        rt(&mut w, &mut g, &b("attn_q.weight"), &[e, h * d], 0.15);
        rt(&mut w, &mut g, &b("attn_k.weight"), &[e, hkv * d], 0.15);
        rt(&mut w, &mut g, &b("attn_v.weight"), &[e, hkv * d], 0.15);
        rt(&mut w, &mut g, &b("attn_output.weight"), &[h * d, e], 0.15);
        t(&mut w, &b("ffn_norm.weight"), &[e], norm(&mut g, e));
        rt(&mut w, &mut g, &b("ffn_gate.weight"), &[e, ff], 0.15);
        rt(&mut w, &mut g, &b("ffn_up.weight"), &[e, ff], 0.15);
        rt(&mut w, &mut g, &b("ffn_down.weight"), &[ff, e], 0.1);
    }
    w.write_file(path).unwrap();
}

/// A LLaVA-1.5-style multimodal projector (`clip.projector_type = "mlp"`): a CLIP ViT with a
/// 4×4 patch embedding (F16, as converters write it) over [`IMAGE`]² pixels (64 patches), a class
/// embedding, learned positions, the pre-layer norm and three pre-norm layers of which LLaVA runs
/// all but the last (E = 64 in 4 heads, FFN 96 with quick GELU), then the two-layer GELU MLP into
/// the text model's 64 dimensions.
fn clip_mlp(path: &Path) {
    let (e, h, ff, nl, p, proj, text_e) = (64u64, 4u64, 96u64, 3u64, 4u64, 128u64, 64u64);
    let n_pos = (IMAGE / p) * (IMAGE / p) + 1;
    let mut g = Gen(Xorshift(0x5eed_0008));
    let mut w = GgufWriter::new();
    w.add("general.architecture", "clip");
    w.add("clip.has_vision_encoder", Value::Bool(true));
    w.add("clip.projector_type", "mlp");
    for (k, v) in [
        ("embedding_length", e),
        ("feed_forward_length", ff),
        ("block_count", nl),
        ("projection_dim", text_e),
        ("attention.head_count", h),
        ("image_size", IMAGE),
        ("patch_size", p),
    ] {
        w.add(&format!("clip.vision.{k}"), Value::U32(v as u32));
    }
    w.add("clip.vision.attention.layer_norm_epsilon", Value::F32(1e-5));
    w.add("clip.vision.image_mean", Value::Array(Array::F32(vec![0.481, 0.458, 0.408])));
    w.add("clip.vision.image_std", Value::Array(Array::F32(vec![0.269, 0.261, 0.276])));
    let patch: Vec<u8> = g
        .v((p * p * 3 * e) as usize, 0.1)
        .iter()
        .flat_map(|&x| compute::quant::blocks::to_f16le(x))
        .collect();
    w.add_tensor("v.patch_embd.weight", GgmlType::F16, &[p, p, 3, e], patch).unwrap();
    rt(&mut w, &mut g, "v.class_embd", &[e], 1.0);
    rt(&mut w, &mut g, "v.position_embd.weight", &[e, n_pos], 0.5);
    layer_norm(&mut w, &mut g, "v.pre_ln", e);
    for il in 0..nl {
        let b = |s: &str| format!("v.blk.{il}.{s}");
        layer_norm(&mut w, &mut g, &b("ln1"), e);
        for m in ["attn_q", "attn_k", "attn_v", "attn_out"] {
            rt(&mut w, &mut g, &b(&format!("{m}.weight")), &[e, e], 0.15);
            rt(&mut w, &mut g, &b(&format!("{m}.bias")), &[e], 0.1);
        }
        layer_norm(&mut w, &mut g, &b("ln2"), e);
        rt(&mut w, &mut g, &b("ffn_up.weight"), &[e, ff], 0.15);
        rt(&mut w, &mut g, &b("ffn_up.bias"), &[ff], 0.1);
        rt(&mut w, &mut g, &b("ffn_down.weight"), &[ff, e], 0.1);
        rt(&mut w, &mut g, &b("ffn_down.bias"), &[e], 0.1);
    }
    rt(&mut w, &mut g, "mm.0.weight", &[e, proj], 0.15);
    rt(&mut w, &mut g, "mm.0.bias", &[proj], 0.1);
    rt(&mut w, &mut g, "mm.2.weight", &[proj, text_e], 0.1);
    rt(&mut w, &mut g, "mm.2.bias", &[text_e], 0.1);
    w.write_file(path).unwrap();
}

/// llama.cpp's libmtmd on `image` (RGB bytes, [`IMAGE`]²) through the projector and text model
/// in `dir`, with the projector and every text layer on `endpoint` when given
/// (`tests/interop/ref_mtmd.py`); returns the image embeddings (one row per image token) and the
/// text model's logits after the prompt.
fn mtmd_run(
    python: &Path,
    dir: &Path,
    endpoint: Option<&str>,
    flash_attn: bool,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let out = tempfile::tempdir().unwrap();
    let eps = endpoint.map(|e| format!("[\"{e}\"]")).unwrap_or_else(|| "[]".into());
    let ngl = if endpoint.is_some() { 99 } else { 0 };
    let args = format!(
        "{{\"model\": \"{d}/text.gguf\", \"mmproj\": \"{d}/mmproj.gguf\", \"endpoints\": {eps}, \
         \"n_gpu_layers\": {ngl}, \"flash_attn\": {flash_attn}, \"n_threads\": 1, \"image\": \"{d}/image.rgb\", \
         \"nx\": {IMAGE}, \"ny\": {IMAGE}, \"prompt\": \"<__media__>\", \"after\": [17, 42, 99], \"out_dir\": \"{o}\"}}",
        d = dir.display(),
        o = out.path().display()
    );
    let args_path = out.path().join("args.json");
    std::fs::write(&args_path, args).unwrap();
    let run = Command::new(python)
        .arg(workspace_root().join("tests/interop/ref_mtmd.py"))
        .arg(&args_path)
        .arg(out.path().join("out.json"))
        .current_dir(workspace_root().join("tests/interop"))
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "ref_mtmd.py ({endpoint:?}) failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    (read_npy_f32_2d(&out.path().join("embd.npy")), read_npy_f32_2d(&out.path().join("logits.npy")))
}

/// The vision encoder through libmtmd three ways (local CPU, llama.cpp's RPC server, llamad);
/// returns the NMSEs of the image embeddings and of the logits, llamad against the RPC server
/// and against local.
fn vision_through_llamad(flash_attn: bool) -> Option<[f64; 4]> {
    let python = peer()?;
    let dir = tempfile::tempdir().unwrap();
    llama_text(&dir.path().join("text.gguf"));
    clip_mlp(&dir.path().join("mmproj.gguf"));
    let mut px = Xorshift(0x1a6e);
    // A smooth gradient with noise, so the patches differ.
    let image: Vec<u8> = (0..IMAGE * IMAGE * 3)
        .map(|i| {
            let (x, y, c) = ((i / 3) % IMAGE, (i / 3) / IMAGE, i % 3);
            ((x * 5 + y * 3 + c * 60) as f32 + px.unit() * 40.0) as u8
        })
        .collect();
    std::fs::write(dir.path().join("image.rgb"), image).unwrap();
    let (local_e, local_l) = mtmd_run(&python, dir.path(), None, flash_attn);
    assert_eq!(local_e.len() as u64, (IMAGE / 4) * (IMAGE / 4), "one image token per patch");
    assert!(local_e.iter().chain(&local_l).flatten().all(|x| x.is_finite()), "local output is not finite");
    let reference = Server::reference(&python).expect("start llama.cpp's RPC server");
    let (ref_e, ref_l) = mtmd_run(&python, dir.path(), Some(&reference.addr.to_string()), flash_attn);
    let llamad = Server::llamad_with(&llamad_bin(), None, &["--protocol", "7"]).expect("start llamad");
    let (ld_e, ld_l) = mtmd_run(&python, dir.path(), Some(&llamad.addr.to_string()), flash_attn);
    let r = [nmse(&ld_e, &ref_e), nmse(&ld_e, &local_e), nmse(&ld_l, &ref_l), nmse(&ld_l, &local_l)];
    eprintln!(
        "llava mlp (flash attention {flash_attn}): image embeddings NMSE llamad vs llama.cpp RPC server {:.2e}, \
         llamad vs local CPU {:.2e} (RPC server vs local {:.2e}); logits after the image {:.2e}, {:.2e} ({:.2e})",
        r[0],
        r[1],
        nmse(&ref_e, &local_e),
        r[2],
        r[3],
        nmse(&ref_l, &local_l)
    );
    Some(r)
}

#[test]
fn vision_projector_through_llamacpp_mtmd_over_llamad() {
    for flash_attn in [false, true] {
        let Some([e_ref, e_local, l_ref, l_local]) = vision_through_llamad(flash_attn) else { return };
        // Without flash attention every op of the encoder equals ggml's bit for bit (measured:
        // NMSE 0). llamad's FLASH_ATTN_EXT differs from ggml's in the last bits of the online
        // softmax (measured 1.1e-9 on the embeddings, 9.4e-9 on the logits); a wrong kernel gives
        // NMSE of order 1.
        let exact = if flash_attn { 1e-7 } else { 1e-12 };
        assert!(
            e_ref <= exact,
            "fa {flash_attn}: image embeddings over llamad vs the RPC server: NMSE {e_ref}"
        );
        assert!(e_local <= 5e-4, "fa {flash_attn}: image embeddings over llamad vs local: NMSE {e_local}");
        assert!(l_ref <= exact, "fa {flash_attn}: logits over llamad vs the RPC server: NMSE {l_ref}");
        assert!(l_local <= 5e-4, "fa {flash_attn}: logits over llamad vs local: NMSE {l_local}");
    }
}
