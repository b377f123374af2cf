//! Shared test support for the model engine: tiny random models, an independent f64 forward pass,
//! and a plain interpreter of abstract graphs (`GraphDef`) written from the op semantics in
//! ggml-compute-semantics.md §3.3, so the graph builders can be checked without the optimized
//! executor.
#![allow(dead_code, clippy::needless_range_loop)]

pub mod interp;
pub mod reference;

use std::collections::HashMap;

use compute::gguf::{Gguf, GgufWriter, Value};
use compute::model::{MemWeights, MetaValue, WeightSource};
use compute::quant::kernels;
use compute::GgmlType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Shape and flavour of a tiny model.
#[derive(Clone, Debug)]
pub struct Spec {
    pub arch: &'static str,
    pub e: usize,
    pub n_layer: usize,
    pub h: usize,
    pub hkv: usize,
    pub d: usize,
    pub f: usize,
    pub vocab: usize,
    pub rope_base: f32,
    pub eps: f32,
    pub qkv_bias: bool,
    pub qk_norm: bool,
    pub gemma: bool,
    pub n_expert: usize,
    pub n_used: usize,
    pub f_exp: usize,
    pub n_swa: usize,
    pub swa_pattern: usize,
    pub tied: bool,
    /// Qwen2-MoE shared-expert width (0 = none).
    pub f_shexp: usize,
    /// Mistral 3 attention temperature scale (0 = off) and its period (`n_ctx_orig`).
    pub temp_scale: f32,
    pub temp_floor: usize,
}

impl Spec {
    /// E=64, 2 layers, 4 heads, 2 KV heads (GQA), D=16, F=96, vocab 100.
    pub fn base(arch: &'static str) -> Spec {
        Spec {
            arch,
            e: 64,
            n_layer: 2,
            h: 4,
            hkv: 2,
            d: 16,
            f: 96,
            vocab: 100,
            rope_base: 10000.0,
            eps: 1e-5,
            qkv_bias: false,
            qk_norm: false,
            gemma: false,
            n_expert: 0,
            n_used: 0,
            f_exp: 0,
            n_swa: 0,
            swa_pattern: 6,
            tied: false,
            f_shexp: 0,
            temp_scale: 0.0,
            temp_floor: 0,
        }
    }

    pub fn llama() -> Spec {
        Spec { tied: true, ..Spec::base("llama") }
    }

    pub fn qwen2() -> Spec {
        Spec { qkv_bias: true, rope_base: 1e6, ..Spec::base("qwen2") }
    }

    pub fn qwen3() -> Spec {
        Spec { qk_norm: true, ..Spec::base("qwen3") }
    }

    pub fn gemma3() -> Spec {
        // Layer 0 is a sliding-window layer (0 % 2 < 1) with a window of 3; layer 1 is global.
        Spec {
            qk_norm: true,
            gemma: true,
            n_swa: 3,
            swa_pattern: 2,
            tied: true,
            rope_base: 1e6,
            ..Spec::base("gemma3")
        }
    }

    pub fn qwen3moe() -> Spec {
        Spec { qk_norm: true, n_expert: 4, n_used: 2, f_exp: 32, ..Spec::base("qwen3moe") }
    }

    /// Qwen2-MoE: Q/K/V biases, 4 experts of which 2 are used (weights not renormalised), and a
    /// shared expert of width 48.
    pub fn qwen2moe() -> Spec {
        Spec { qkv_bias: true, n_expert: 4, n_used: 2, f_exp: 32, f_shexp: 48, ..Spec::base("qwen2moe") }
    }

    /// Mistral 3 with the attention temperature: period 2, so the factor changes every other
    /// position (llama.cpp takes the period from `n_ctx_orig`; real models use 16384).
    pub fn mistral3() -> Spec {
        Spec { temp_scale: 0.5, temp_floor: 2, ..Spec::base("mistral3") }
    }

    pub fn is_swa_layer(&self, il: usize) -> bool {
        self.gemma && self.n_swa > 0 && il % self.swa_pattern < self.swa_pattern - 1
    }
}

/// A generated model: the weights as f32 values (shape `ne`) and the same in a `MemWeights`.
pub struct Tiny {
    pub spec: Spec,
    pub w: HashMap<String, (Vec<f32>, [u64; 4])>,
    pub src: MemWeights,
}

impl Tiny {
    pub fn get(&self, name: &str) -> &[f32] {
        &self.w.get(name).unwrap_or_else(|| panic!("no weight {name}")).0
    }

    pub fn has(&self, name: &str) -> bool {
        self.w.contains_key(name)
    }
}

/// Generates a tiny model with uniform random weights (fixed seed).
pub fn tiny(spec: Spec, seed: u64) -> Tiny {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut w = HashMap::new();
    let mut add = |name: &str, ne: [u64; 4], scale: f32, offset: f32, rng: &mut StdRng| {
        let n = ne.iter().product::<u64>() as usize;
        let v: Vec<f32> = (0..n).map(|_| offset + scale * (rng.random::<f32>() * 2.0 - 1.0)).collect();
        w.insert(name.to_string(), (v, ne));
    };
    let s = &spec;
    let (e, h, hkv, d, f, nv) =
        (s.e as u64, s.h as u64, s.hkv as u64, s.d as u64, s.f as u64, s.vocab as u64);
    let lin = |k: u64| 1.0 / (k as f32).sqrt() * 1.5;
    add("token_embd.weight", [e, nv, 1, 1], 1.0, 0.0, &mut rng);
    add("output_norm.weight", [e, 1, 1, 1], 0.2, 1.0, &mut rng);
    if !s.tied {
        add("output.weight", [e, nv, 1, 1], lin(e), 0.0, &mut rng);
    }
    for il in 0..s.n_layer {
        let b = |n: &str| format!("blk.{il}.{n}");
        add(&b("attn_norm.weight"), [e, 1, 1, 1], 0.2, 1.0, &mut rng);
        add(&b("attn_q.weight"), [e, h * d, 1, 1], lin(e), 0.0, &mut rng);
        add(&b("attn_k.weight"), [e, hkv * d, 1, 1], lin(e), 0.0, &mut rng);
        add(&b("attn_v.weight"), [e, hkv * d, 1, 1], lin(e), 0.0, &mut rng);
        add(&b("attn_output.weight"), [h * d, e, 1, 1], lin(h * d), 0.0, &mut rng);
        if s.qkv_bias {
            add(&b("attn_q.bias"), [h * d, 1, 1, 1], 0.3, 0.0, &mut rng);
            add(&b("attn_k.bias"), [hkv * d, 1, 1, 1], 0.3, 0.0, &mut rng);
            add(&b("attn_v.bias"), [hkv * d, 1, 1, 1], 0.3, 0.0, &mut rng);
        }
        if s.qk_norm {
            add(&b("attn_q_norm.weight"), [d, 1, 1, 1], 0.2, 1.0, &mut rng);
            add(&b("attn_k_norm.weight"), [d, 1, 1, 1], 0.2, 1.0, &mut rng);
        }
        if s.gemma {
            add(&b("post_attention_norm.weight"), [e, 1, 1, 1], 0.2, 1.0, &mut rng);
            add(&b("post_ffw_norm.weight"), [e, 1, 1, 1], 0.2, 1.0, &mut rng);
        }
        add(&b("ffn_norm.weight"), [e, 1, 1, 1], 0.2, 1.0, &mut rng);
        if s.n_expert > 0 {
            let (ne_, fe) = (s.n_expert as u64, s.f_exp as u64);
            add(&b("ffn_gate_inp.weight"), [e, ne_, 1, 1], lin(e), 0.0, &mut rng);
            add(&b("ffn_gate_exps.weight"), [e, fe, ne_, 1], lin(e), 0.0, &mut rng);
            add(&b("ffn_up_exps.weight"), [e, fe, ne_, 1], lin(e), 0.0, &mut rng);
            add(&b("ffn_down_exps.weight"), [fe, e, ne_, 1], lin(fe), 0.0, &mut rng);
            if s.f_shexp > 0 {
                let fs = s.f_shexp as u64;
                add(&b("ffn_gate_inp_shexp.weight"), [e, 1, 1, 1], lin(e), 0.0, &mut rng);
                add(&b("ffn_gate_shexp.weight"), [e, fs, 1, 1], lin(e), 0.0, &mut rng);
                add(&b("ffn_up_shexp.weight"), [e, fs, 1, 1], lin(e), 0.0, &mut rng);
                add(&b("ffn_down_shexp.weight"), [fs, e, 1, 1], lin(fs), 0.0, &mut rng);
            }
        } else {
            add(&b("ffn_gate.weight"), [e, f, 1, 1], lin(e), 0.0, &mut rng);
            add(&b("ffn_up.weight"), [e, f, 1, 1], lin(e), 0.0, &mut rng);
            add(&b("ffn_down.weight"), [f, e, 1, 1], lin(f), 0.0, &mut rng);
        }
    }
    let mut src = MemWeights::new();
    for (name, (v, ne)) in &w {
        src.add_f32(name, *ne, v).unwrap();
    }
    let a = s.arch;
    let k = |x: &str| format!("{a}.{x}");
    src.set_meta("general.architecture", MetaValue::Str(a.to_string()));
    src.set_meta(&k("embedding_length"), MetaValue::Int(s.e as i64));
    src.set_meta(&k("block_count"), MetaValue::Int(s.n_layer as i64));
    src.set_meta(&k("feed_forward_length"), MetaValue::Int(s.f as i64));
    src.set_meta(&k("attention.head_count"), MetaValue::Int(s.h as i64));
    src.set_meta(&k("attention.head_count_kv"), MetaValue::Int(s.hkv as i64));
    src.set_meta(&k("attention.key_length"), MetaValue::Int(s.d as i64));
    src.set_meta(&k("attention.value_length"), MetaValue::Int(s.d as i64));
    src.set_meta(&k("attention.layer_norm_rms_epsilon"), MetaValue::Float(s.eps as f64));
    src.set_meta(&k("rope.freq_base"), MetaValue::Float(s.rope_base as f64));
    src.set_meta(&k("context_length"), MetaValue::Int(512));
    src.set_meta(&k("vocab_size"), MetaValue::Int(s.vocab as i64));
    if s.n_expert > 0 {
        src.set_meta(&k("expert_count"), MetaValue::Int(s.n_expert as i64));
        src.set_meta(&k("expert_used_count"), MetaValue::Int(s.n_used as i64));
        src.set_meta(&k("expert_feed_forward_length"), MetaValue::Int(s.f_exp as i64));
    }
    if s.f_shexp > 0 {
        src.set_meta(&k("expert_shared_feed_forward_length"), MetaValue::Int(s.f_shexp as i64));
    }
    if s.temp_scale != 0.0 {
        src.set_meta(&k("attention.temperature_scale"), MetaValue::Float(s.temp_scale as f64));
        src.set_meta(&k("rope.scaling.original_context_length"), MetaValue::Int(s.temp_floor as i64));
    }
    if s.gemma {
        src.set_meta(&k("attention.sliding_window"), MetaValue::Int(s.n_swa as i64));
        src.set_meta(&k("attention.sliding_window_pattern"), MetaValue::Int(s.swa_pattern as i64));
        src.set_meta(&k("rope.freq_base_swa"), MetaValue::Float(10000.0));
    }
    Tiny { spec, w, src }
}

/// `src` written by the GGUF writer (matrices quantized to Q8_0 when `quantize`), plus extra metadata.
pub fn gguf_writer(src: &MemWeights, quantize: bool) -> GgufWriter {
    gguf_writer_typed(src, quantize.then_some(GgmlType::Q8_0))
}

/// `src` as a GGUF with every matrix (2-D and 3-D tensors) in `weights` (F32 otherwise): quantized
/// with compute's quantizer, or valid random blocks of about the same size for the grid IQ types
/// (which have none).
pub fn gguf_writer_typed(src: &MemWeights, weights: Option<GgmlType>) -> GgufWriter {
    let mut w = GgufWriter::new();
    let mut meta: Vec<_> = src.metadata().collect();
    meta.sort_by_key(|(k, _)| *k);
    for (k, v) in meta {
        let v: Value = match v {
            MetaValue::Int(i) => Value::U32(*i as u32),
            MetaValue::Float(f) => Value::F32(*f as f32),
            MetaValue::Str(s) => Value::String(s.clone()),
            MetaValue::Bool(b) => Value::Bool(*b),
            other => panic!("unexpected {other:?}"),
        };
        w.add(k, v);
    }
    let mut names: Vec<_> = src.tensors().map(|(n, _)| n.to_string()).collect();
    names.sort();
    for n in names {
        let t = src.tensor(&n).unwrap();
        let dims = if t.ne[2] > 1 {
            3
        } else if t.ne[1] > 1 {
            2
        } else {
            1
        };
        if let Some(ty) = weights.filter(|_| dims >= 2) {
            let vals: Vec<f32> =
                t.data.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
            let row = ty.row_size(t.ne[0]).unwrap() as usize;
            let rows = vals.len() / t.ne[0] as usize;
            let q = match kernels(ty).from_f32 {
                Some(from) => {
                    let mut q = vec![0u8; row * rows];
                    for (src_row, dst_row) in vals.chunks_exact(t.ne[0] as usize).zip(q.chunks_exact_mut(row))
                    {
                        from(src_row, dst_row);
                    }
                    q
                }
                None => {
                    let rms = (vals.iter().map(|v| v * v).sum::<f32>() / vals.len() as f32).sqrt();
                    let seed = n.bytes().fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
                    let nb = row * rows / ty.type_size();
                    compute::quant::testing::random_grid_blocks(ty, nb, rms, seed).expect("a grid type")
                }
            };
            w.add_tensor(&n, ty, &t.ne[..dims], q).unwrap();
        } else {
            w.add_tensor(&n, t.dtype, &t.ne[..dims], t.data.to_vec()).unwrap();
        }
    }
    w
}

/// `src` written by the GGUF writer and read back.
pub fn to_gguf(src: &MemWeights, quantize: bool) -> Gguf {
    Gguf::from_bytes(gguf_writer(src, quantize).to_bytes().unwrap()).unwrap()
}

/// Largest absolute difference.
pub fn max_abs_diff(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(&x, &y)| (x as f64 - y).abs()).fold(0.0, f64::max)
}
