//! Hyper-parameters read from GGUF metadata (ref: ggml-compute-semantics.md §4.1, §5.1).

use crate::error::{Error, Result};
use crate::model::weights::{MetaExt, MetaValue, WeightSource};
use crate::op::rope_mode;

/// The architectures the engine builds graphs for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, TinyLlama, SmolLM2, Mistral 7B; Mixtral when `expert_count > 0`.
    Llama,
    /// Mistral Small 3.x: llama plus optional attention temperature.
    Mistral3,
    /// Qwen2 / Qwen2.5.
    Qwen2,
    /// Qwen1.5-MoE / Qwen2-MoE: qwen2 attention, softmax-gated experts plus a sigmoid-gated shared
    /// expert.
    Qwen2Moe,
    /// Qwen3.
    Qwen3,
    /// Qwen3-MoE.
    Qwen3Moe,
    /// Gemma 3.
    Gemma3,
}

impl Arch {
    /// The arch for a `general.architecture` value.
    pub fn from_name(s: &str) -> Result<Arch> {
        Ok(match s {
            "llama" => Arch::Llama,
            "mistral3" => Arch::Mistral3,
            "qwen2" => Arch::Qwen2,
            "qwen2moe" => Arch::Qwen2Moe,
            "qwen3" => Arch::Qwen3,
            "qwen3moe" => Arch::Qwen3Moe,
            "gemma3" => Arch::Gemma3,
            other => return Err(Error::Model(format!("unsupported architecture {other:?}"))),
        })
    }

    /// The `general.architecture` value.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral3 => "mistral3",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen2Moe => "qwen2moe",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Gemma3 => "gemma3",
        }
    }

    /// RoPE mode: NORMAL for llama-likes, NEOX for Qwen and Gemma (ref: §4.6).
    pub fn rope_mode(self) -> i32 {
        match self {
            Arch::Llama | Arch::Mistral3 => rope_mode::NORMAL,
            Arch::Qwen2 | Arch::Qwen2Moe | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3 => rope_mode::NEOX,
        }
    }
}

/// YaRN's magnitude correction `0.1 · m · ln s + 1` (1 for `s ≤ 1`).
fn yarn_mscale(s: f32, m: f32) -> f32 {
    if s <= 1.0 {
        1.0
    } else {
        0.1 * m * s.ln() + 1.0
    }
}

/// The RoPE `attn_factor` llama.cpp 0.3.36 uses for a mistral3 model with
/// `rope.scaling.yarn_log_multiplier` (`mscale_all_dims`; `mscale` taken as 1): the HF ratio
/// `mscale(s, 1) / mscale(s, log_mul)`, divided by the `mscale(s, 1)` that ROPE itself multiplies
/// in when `ext_factor ≠ 0`, so the rotated values carry the HF ratio. Without the key the factor
/// stays 1 (and ROPE's own correction applies). Measured against llama.cpp in
/// `tests/model_llamacpp.rs` (scaling factor 4, log_mul 0.5/1/2: best fits 0.936/0.878/0.782).
fn mistral3_yarn_attn_factor(factor: f32, log_mul: f32) -> f32 {
    yarn_mscale(factor, 1.0) / yarn_mscale(factor, log_mul) / yarn_mscale(factor, 1.0)
}

/// Position offset of the Mistral 3 attention temperature (see [`HParams::attn_temperature`]).
const ATTN_TEMP_OFFSET: f32 = 0.0;

/// Hyper-parameters of a model (symbols as in ref §4.1).
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    /// Architecture.
    pub arch: Arch,
    /// `E`.
    pub n_embd: u64,
    /// Number of repeating layers.
    pub n_layer: u32,
    /// `H`.
    pub n_head: u64,
    /// `Hkv`.
    pub n_head_kv: u64,
    /// `D` for keys.
    pub head_dim_k: u64,
    /// `D` for values.
    pub head_dim_v: u64,
    /// `F`.
    pub n_ff: u64,
    /// Vocabulary size.
    pub n_vocab: u64,
    /// Training context.
    pub n_ctx_train: u64,
    /// RMS norm epsilon.
    pub rms_eps: f32,
    /// Rotated dims.
    pub n_rot: u64,
    /// RoPE base.
    pub rope_freq_base: f32,
    /// RoPE frequency scale (1 / scaling factor).
    pub rope_freq_scale: f32,
    /// `n_ctx_orig` for YaRN.
    pub n_ctx_orig: u64,
    /// YaRN extrapolation factor (0 unless `rope.scaling.type = yarn`).
    pub yarn_ext_factor: f32,
    /// YaRN attention factor.
    pub yarn_attn_factor: f32,
    /// YaRN beta_fast.
    pub yarn_beta_fast: f32,
    /// YaRN beta_slow.
    pub yarn_beta_slow: f32,
    /// Number of experts (0 = dense).
    pub n_expert: u64,
    /// Experts used per token.
    pub n_expert_used: u64,
    /// Expert FFN width.
    pub n_ff_exp: u64,
    /// Normalise the selected expert weights.
    pub expert_weights_norm: bool,
    /// Scale applied to the expert weights (0 / 1 = none).
    pub expert_weights_scale: f32,
    /// Gemma 3 sliding window (0 = none).
    pub n_swa: u64,
    /// Gemma 3: layer `il` is a sliding-window layer when `il % pattern < pattern - 1`.
    pub swa_pattern: u32,
    /// Gemma 3: explicit per-layer sliding-window flags (overrides the pattern when present).
    pub swa_layers: Option<Vec<bool>>,
    /// Gemma 3 local-layer RoPE base.
    pub rope_freq_base_swa: f32,
    /// Final logit softcapping (0 = off).
    pub final_logit_softcap: f32,
    /// Custom KQ scale (0 = `1/√D`).
    pub attention_scale: f32,
    /// Qwen2-MoE shared-expert FFN width (0 = no shared expert).
    pub n_ff_shexp: u64,
    /// Mistral 3 attention temperature (`attention.temperature_scale`; 0 = off): Q is multiplied
    /// per token by [`HParams::attn_temperature`].
    pub attn_temp_scale: f32,
    /// Position period of the attention temperature (`n_ctx_orig`, as llama.cpp takes it for
    /// mistral3).
    pub attn_temp_floor: u64,
}

impl HParams {
    /// Reads the hyper-parameters of `src`.
    pub fn from_source(src: &dyn WeightSource) -> Result<HParams> {
        let arch_name = src
            .meta_str("general.architecture")?
            .ok_or_else(|| Error::Model("missing general.architecture".into()))?;
        let arch = Arch::from_name(&arch_name)?;
        let k = |s: &str| format!("{arch_name}.{s}");
        let req = |s: &str| -> Result<u64> {
            src.meta_u64(&k(s))?.ok_or_else(|| Error::Model(format!("missing metadata {}", k(s))))
        };
        let n_embd = req("embedding_length")?;
        let n_layer =
            u32::try_from(req("block_count")?).map_err(|_| Error::Model("block_count too large".into()))?;
        let n_head = req("attention.head_count")?;
        if n_head == 0 || n_embd == 0 || n_layer == 0 {
            return Err(Error::Model("zero embedding_length, block_count or head_count".into()));
        }
        let n_head_kv = src.meta_u64(&k("attention.head_count_kv"))?.unwrap_or(n_head);
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(Error::Model(format!(
                "head_count {n_head} not a multiple of head_count_kv {n_head_kv}"
            )));
        }
        let head_dim_k = src.meta_u64(&k("attention.key_length"))?.unwrap_or(n_embd / n_head);
        let head_dim_v = src.meta_u64(&k("attention.value_length"))?.unwrap_or(n_embd / n_head);
        let n_ff = src.meta_u64(&k("feed_forward_length"))?.unwrap_or(0);
        let n_vocab = match src.meta_u64(&k("vocab_size"))? {
            Some(v) => v,
            None => match src.meta("tokenizer.ggml.tokens") {
                Some(MetaValue::Array(n)) => n as u64,
                _ => src
                    .tensor("token_embd.weight")
                    .map(|t| t.ne[1])
                    .ok_or_else(|| Error::Model("cannot determine the vocabulary size".into()))?,
            },
        };
        let rms_eps = src.meta_f32(&k("attention.layer_norm_rms_epsilon"))?.ok_or_else(|| {
            Error::Model(format!("missing metadata {}", k("attention.layer_norm_rms_epsilon")))
        })?;
        let n_rot = src.meta_u64(&k("rope.dimension_count"))?.unwrap_or(head_dim_k);
        if matches!(arch, Arch::Llama | Arch::Mistral3) && n_rot != head_dim_k {
            return Err(Error::Model(format!("llama requires n_rot == head_dim ({n_rot} != {head_dim_k})")));
        }
        if n_rot > head_dim_k || n_rot % 2 != 0 {
            return Err(Error::Model(format!("invalid rope.dimension_count {n_rot}")));
        }
        let n_ctx_train = src.meta_u64(&k("context_length"))?.unwrap_or(2048);
        let rope_freq_base = src.meta_f32(&k("rope.freq_base"))?.unwrap_or(10000.0);
        let scaling_type = src.meta_str(&k("rope.scaling.type"))?.unwrap_or_else(|| "linear".into());
        let factor = src.meta_f32(&k("rope.scaling.factor"))?.unwrap_or(0.0);
        let rope_freq_scale = if factor == 0.0 || scaling_type == "none" { 1.0 } else { 1.0 / factor };
        let n_ctx_orig = src.meta_u64(&k("rope.scaling.original_context_length"))?.unwrap_or(n_ctx_train);
        let yarn = scaling_type == "yarn";
        let yarn_ext_factor =
            if yarn { src.meta_f32(&k("rope.scaling.yarn_ext_factor"))?.unwrap_or(1.0) } else { 0.0 };
        let mut yarn_attn_factor = src.meta_f32(&k("rope.scaling.attn_factor"))?.unwrap_or(1.0);
        let log_mul = src.meta_f32(&k("rope.scaling.yarn_log_multiplier"))?.unwrap_or(0.0);
        if arch == Arch::Mistral3 && log_mul != 0.0 {
            yarn_attn_factor = mistral3_yarn_attn_factor(1.0 / rope_freq_scale, log_mul);
        }
        let yarn_beta_fast = src.meta_f32(&k("rope.scaling.yarn_beta_fast"))?.unwrap_or(32.0);
        let yarn_beta_slow = src.meta_f32(&k("rope.scaling.yarn_beta_slow"))?.unwrap_or(1.0);
        let n_expert = src.meta_u64(&k("expert_count"))?.unwrap_or(0);
        let n_expert_used = src.meta_u64(&k("expert_used_count"))?.unwrap_or(0);
        if n_expert > 0 && (n_expert_used == 0 || n_expert_used > n_expert) {
            return Err(Error::Model(format!("expert_used_count {n_expert_used} of {n_expert} experts")));
        }
        let qwen2moe = arch == Arch::Qwen2Moe;
        if qwen2moe && n_expert == 0 {
            return Err(Error::Model(format!("qwen2moe without {}", k("expert_count"))));
        }
        // llama.cpp's qwen2moe sizes an expert `F / n_expert_used` and the shared expert `F` unless
        // the model says otherwise.
        let n_ff_exp = match src.meta_u64(&k("expert_feed_forward_length"))? {
            Some(v) => v,
            None if qwen2moe => n_ff / n_expert_used,
            None => n_ff,
        };
        let n_ff_shexp =
            if qwen2moe { src.meta_u64(&k("expert_shared_feed_forward_length"))?.unwrap_or(n_ff) } else { 0 };
        // Mixtral and Qwen3-MoE normalise the top-k weights; Qwen2-MoE never does (its graph
        // builder ignores the key) (ref §4.7).
        let expert_weights_norm =
            !qwen2moe && src.meta_bool(&k("expert_weights_norm"))?.unwrap_or(n_expert > 0);
        let expert_weights_scale = src.meta_f32(&k("expert_weights_scale"))?.unwrap_or(0.0);
        let n_swa = src.meta_u64(&k("attention.sliding_window"))?.unwrap_or(0);
        // `sliding_window_pattern` is a period (u32) or one flag per layer (bool[n_layer], true =
        // sliding-window layer); ref §5.1.
        let key = k("attention.sliding_window_pattern");
        let (swa_pattern, swa_layers) = match src.meta(&key) {
            None => (6, None),
            Some(MetaValue::Int(p)) => (u32::try_from(p).unwrap_or(6), None),
            Some(MetaValue::IntArray(flags)) if flags.len() == n_layer as usize => {
                (6, Some(flags.iter().map(|&f| f != 0).collect()))
            }
            Some(other) => return Err(Error::Model(format!("metadata {key}: unexpected {other:?}"))),
        };
        let rope_freq_base_swa = src.meta_f32(&k("rope.freq_base_swa"))?.unwrap_or(10000.0);
        let final_logit_softcap = src.meta_f32(&k("final_logit_softcapping"))?.unwrap_or(0.0);
        let attention_scale = src.meta_f32(&k("attention.scale"))?.unwrap_or(0.0);
        // Mistral 3 (Ministral 3): llama 4-style attention temperature, with llama.cpp's period
        // `n_ctx_orig` (`rope.scaling.original_context_length`, else `context_length`).
        let attn_temp_scale = if arch == Arch::Mistral3 {
            src.meta_f32(&k("attention.temperature_scale"))?.unwrap_or(0.0)
        } else {
            0.0
        };
        if attn_temp_scale != 0.0 && n_ctx_orig == 0 {
            return Err(Error::Model("attention temperature with n_ctx_orig 0".into()));
        }
        if n_ff == 0 && n_expert == 0 {
            return Err(Error::Model(format!("missing metadata {}", k("feed_forward_length"))));
        }
        Ok(HParams {
            arch,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            n_ff,
            n_vocab,
            n_ctx_train,
            rms_eps,
            n_rot,
            rope_freq_base,
            rope_freq_scale,
            n_ctx_orig,
            yarn_ext_factor,
            yarn_attn_factor,
            yarn_beta_fast,
            yarn_beta_slow,
            n_expert,
            n_expert_used,
            n_ff_exp,
            expert_weights_norm,
            expert_weights_scale,
            n_swa,
            swa_pattern: swa_pattern.max(1),
            swa_layers,
            rope_freq_base_swa,
            final_logit_softcap,
            attention_scale,
            n_ff_shexp,
            attn_temp_scale,
            attn_temp_floor: n_ctx_orig,
        })
    }

    /// `Hkv * D` (one KV-cache row).
    pub fn n_embd_k_gqa(&self) -> u64 {
        self.n_head_kv * self.head_dim_k
    }

    /// `Hkv * D_v`.
    pub fn n_embd_v_gqa(&self) -> u64 {
        self.n_head_kv * self.head_dim_v
    }

    /// The attention temperature of the token at `pos` (Mistral 3):
    /// `ln(⌊(pos + offset) / n_ctx_orig⌋ + 1) · temperature_scale + 1` with offset 0 (llama 4
    /// uses 1; llama.cpp 0.3.36 gives mistral3 0, checked against it in `tests/model_llamacpp.rs`),
    /// rounded as llama.cpp does (the quotient in f32, the rest in f64, stored as f32).
    pub fn attn_temperature(&self, pos: u64) -> f32 {
        let q = ((pos as f32 + ATTN_TEMP_OFFSET) / self.attn_temp_floor as f32).floor();
        ((q as f64 + 1.0).ln() * self.attn_temp_scale as f64 + 1.0) as f32
    }

    /// True when layer `il` of a Gemma 3 model uses sliding-window attention (ref §4.6).
    pub fn is_swa_layer(&self, il: u32) -> bool {
        if self.arch != Arch::Gemma3 || self.n_swa == 0 {
            return false;
        }
        match &self.swa_layers {
            Some(flags) => flags.get(il as usize).copied().unwrap_or(false),
            None => il % self.swa_pattern < self.swa_pattern - 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::weights::MemWeights;

    fn base(arch: &str) -> MemWeights {
        let mut m = MemWeights::new();
        m.set_meta("general.architecture", MetaValue::Str(arch.into()));
        let k = |s: &str| format!("{arch}.{s}");
        m.set_meta(&k("embedding_length"), MetaValue::Int(576));
        m.set_meta(&k("block_count"), MetaValue::Int(30));
        m.set_meta(&k("feed_forward_length"), MetaValue::Int(1536));
        m.set_meta(&k("attention.head_count"), MetaValue::Int(9));
        m.set_meta(&k("attention.layer_norm_rms_epsilon"), MetaValue::Float(1e-5));
        m.set_meta(&k("vocab_size"), MetaValue::Int(49152));
        m
    }

    #[test]
    fn defaults_follow_the_reference() {
        let hp = HParams::from_source(&base("llama")).unwrap();
        assert_eq!((hp.n_embd, hp.n_layer, hp.n_head, hp.n_head_kv), (576, 30, 9, 9));
        assert_eq!((hp.head_dim_k, hp.head_dim_v, hp.n_rot), (64, 64, 64));
        assert_eq!((hp.rope_freq_base, hp.rope_freq_scale, hp.yarn_ext_factor), (10000.0, 1.0, 0.0));
        assert_eq!(hp.arch.rope_mode(), rope_mode::NORMAL);
        assert_eq!(hp.n_expert, 0);
        assert!(!hp.is_swa_layer(0));
    }

    #[test]
    fn per_arch_keys_and_errors() {
        let mut m = base("gemma3");
        m.set_meta("gemma3.attention.head_count_kv", MetaValue::IntArray(vec![3; 30]));
        m.set_meta("gemma3.attention.sliding_window", MetaValue::Int(512));
        m.set_meta("gemma3.rope.scaling.factor", MetaValue::Float(8.0));
        let hp = HParams::from_source(&m).unwrap();
        assert_eq!(hp.n_head_kv, 3);
        assert_eq!(hp.rope_freq_scale, 0.125);
        assert_eq!(hp.arch.rope_mode(), rope_mode::NEOX);
        // Pattern 6: layers 0..4 local, 5 global.
        assert!((0..5).all(|il| hp.is_swa_layer(il)) && !hp.is_swa_layer(5) && hp.is_swa_layer(6));
        let mut flags = vec![0; 30];
        flags[1] = 1;
        m.set_meta("gemma3.attention.sliding_window_pattern", MetaValue::IntArray(flags));
        let hp = HParams::from_source(&m).unwrap();
        assert!(!hp.is_swa_layer(0) && hp.is_swa_layer(1) && !hp.is_swa_layer(2));
        let mut bad = base("llama");
        bad.set_meta("llama.attention.head_count_kv", MetaValue::Int(4));
        assert!(HParams::from_source(&bad).is_err(), "9 heads are not a multiple of 4 kv heads");
        assert!(HParams::from_source(&base("bert")).is_err());
        let mut moe = base("qwen3moe");
        moe.set_meta("qwen3moe.expert_count", MetaValue::Int(8));
        assert!(HParams::from_source(&moe).is_err(), "experts without expert_used_count");
        moe.set_meta("qwen3moe.expert_used_count", MetaValue::Int(2));
        let hp = HParams::from_source(&moe).unwrap();
        assert!(hp.expert_weights_norm);
        assert_eq!(hp.n_ff_exp, 1536);
        assert_eq!(hp.n_ff_shexp, 0);
    }

    #[test]
    fn qwen2moe_defaults_follow_llamacpp() {
        // Expert width F / n_used, shared expert width F, top-k weights never renormalised.
        let mut m = base("qwen2moe");
        assert!(HParams::from_source(&m).is_err(), "qwen2moe without experts");
        m.set_meta("qwen2moe.expert_count", MetaValue::Int(60));
        m.set_meta("qwen2moe.expert_used_count", MetaValue::Int(4));
        m.set_meta("qwen2moe.expert_weights_norm", MetaValue::Bool(true));
        let hp = HParams::from_source(&m).unwrap();
        assert_eq!((hp.n_ff_exp, hp.n_ff_shexp, hp.expert_weights_norm), (384, 1536, false));
        assert_eq!(hp.arch.rope_mode(), rope_mode::NEOX);
        m.set_meta("qwen2moe.expert_feed_forward_length", MetaValue::Int(1408));
        m.set_meta("qwen2moe.expert_shared_feed_forward_length", MetaValue::Int(5632));
        let hp = HParams::from_source(&m).unwrap();
        assert_eq!((hp.n_ff_exp, hp.n_ff_shexp), (1408, 5632));
    }

    #[test]
    fn mistral3_attention_temperature() {
        // Ministral 3: scale 0.1, period = original_context_length 16384.
        let mut m = base("mistral3");
        assert_eq!(HParams::from_source(&m).unwrap().attn_temp_scale, 0.0);
        m.set_meta("mistral3.attention.temperature_scale", MetaValue::Float(0.1));
        m.set_meta("mistral3.rope.scaling.original_context_length", MetaValue::Int(16384));
        let hp = HParams::from_source(&m).unwrap();
        assert_eq!(hp.attn_temp_floor, 16384);
        // Hand-computed: 1 below the first period, then 1 + 0.1·ln 2, 1 + 0.1·ln 3.
        assert_eq!(hp.attn_temperature(0), 1.0);
        assert_eq!(hp.attn_temperature(16383), 1.0);
        assert!((hp.attn_temperature(16384) - 1.069_314_7).abs() < 1e-6);
        assert!((hp.attn_temperature(40000) - 1.109_861_2).abs() < 1e-6);
        // The key means nothing to other architectures.
        let mut l = base("llama");
        l.set_meta("llama.attention.temperature_scale", MetaValue::Float(0.1));
        assert_eq!(HParams::from_source(&l).unwrap().attn_temp_scale, 0.0);
    }
}
