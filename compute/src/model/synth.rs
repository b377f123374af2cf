//! Synthetic models: a GGUF of any layer shape (the 1B, 8B, 70B and 405B llama shapes, with the layer
//! count cut to fit, or any custom one) of any architecture llamactl runs ([`Arch`]: llama, Mistral 3,
//! Qwen2, Qwen3, Gemma 3, Qwen2-MoE, Qwen3-MoE), in any weight type, with random weights and a real
//! tokenizer copied from another GGUF. Benchmarks and tests use it where model size or weight
//! type matters and no such model can be downloaded (llama.cpp's quantizer cannot even make most
//! IQ types of SmolLM2, whose 576-wide rows are not whole 256-element blocks).
//!
//! Weights are deterministic by seed and cheap to make: for each row length a pool of distinct
//! quantized rows is made once (normal values of deviation [`WEIGHT_STD`] through the type's own
//! quantizer, or random valid blocks for the grid IQ types, whose quantizers need an importance
//! matrix), and every matrix row is a pool row picked by a hash of (seed, tensor, row); the rows of
//! a tensor are filled by several threads. The values mean nothing (the text a synthetic model
//! writes is noise); the arithmetic per weight is that of a real model of the type.

use std::collections::HashMap;
use std::thread;

use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::gguf::{Gguf, GgufWriter, Value};
use crate::quant;

/// Deviation of the random weights (typical of trained llama matrices).
pub const WEIGHT_STD: f32 = 0.02;
/// Distinct rows per row length.
const POOL_ROWS: usize = 64;

/// The layer shape of a llama-family model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Embedding width.
    pub embd: u64,
    /// Feed-forward width.
    pub ff: u64,
    /// Query heads.
    pub heads: u64,
    /// Key/value heads.
    pub kv_heads: u64,
    /// Layers.
    pub layers: u64,
}

impl Shape {
    /// A named shape: `1b` (Llama 3.2 1B), `8b` (Llama 3.1 8B), `70b`, `405b`, all with their full
    /// layer counts (cut them with [`Shape::with_layers`]).
    pub fn preset(name: &str) -> Option<Shape> {
        let (embd, ff, heads, kv_heads, layers) = match name.to_ascii_lowercase().as_str() {
            "1b" => (2048, 8192, 32, 8, 16),
            "8b" => (4096, 14336, 32, 8, 32),
            "70b" => (8192, 28672, 64, 8, 80),
            "405b" => (16384, 53248, 128, 8, 126),
            _ => return None,
        };
        Some(Shape { embd, ff, heads, kv_heads, layers })
    }

    /// The same shape with `layers` layers.
    pub fn with_layers(self, layers: u64) -> Shape {
        Shape { layers, ..self }
    }

    /// Head size.
    pub fn head_dim(&self) -> u64 {
        self.embd / self.heads.max(1)
    }

    fn check(&self, wtype: GgmlType) -> Result<()> {
        let bad = |m: String| Err(Error::Model(format!("synthetic model: {m}")));
        if self.embd == 0 || self.ff == 0 || self.heads == 0 || self.kv_heads == 0 || self.layers == 0 {
            return bad(format!("empty shape {self:?}"));
        }
        if !self.embd.is_multiple_of(self.heads) || !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} heads do not divide the embedding {} into groups of {} kv heads",
                self.heads, self.embd, self.kv_heads
            ));
        }
        let bs = wtype.blck_size() as u64;
        if !self.embd.is_multiple_of(bs) || !self.ff.is_multiple_of(bs) {
            return bad(format!(
                "{wtype} stores rows in blocks of {bs}: embedding {} and feed-forward {} must be multiples",
                self.embd, self.ff
            ));
        }
        Ok(())
    }
}

/// The architecture of a synthetic model: which tensors each layer has and which metadata says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama (untied output).
    Llama,
    /// Mistral 3 (llama tensors under `mistral3.*` keys).
    Mistral3,
    /// Qwen2: Q/K/V biases.
    Qwen2,
    /// Qwen3: per-head Q/K RMS norms.
    Qwen3,
    /// Gemma 3: Q/K norms, post-attention and post-FFN norms, sliding-window layers, tied output.
    Gemma3,
    /// Qwen2-MoE: Qwen2 attention, routed experts and a gated shared expert.
    Qwen2Moe,
    /// Qwen3-MoE: Qwen3 attention and routed experts.
    Qwen3Moe,
}

impl Arch {
    /// Every architecture.
    pub const ALL: [Arch; 7] =
        [Arch::Llama, Arch::Mistral3, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3, Arch::Qwen2Moe, Arch::Qwen3Moe];

    /// `general.architecture`.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral3 => "mistral3",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Qwen2Moe => "qwen2moe",
            Arch::Qwen3Moe => "qwen3moe",
        }
    }

    /// The architecture named `s` (as [`Arch::name`]).
    pub fn parse(s: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name().eq_ignore_ascii_case(s))
    }

    fn qkv_bias(self) -> bool {
        matches!(self, Arch::Qwen2 | Arch::Qwen2Moe)
    }

    fn qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3)
    }

    fn moe(self) -> bool {
        matches!(self, Arch::Qwen2Moe | Arch::Qwen3Moe)
    }
}

/// The experts of a MoE model (ignored by dense architectures).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Experts {
    /// Experts per layer.
    pub count: u64,
    /// Experts used per token.
    pub used: u64,
    /// Feed-forward width of one expert.
    pub ff: u64,
    /// Feed-forward width of the shared expert (Qwen2-MoE; 0 = none).
    pub shared_ff: u64,
}

impl Default for Experts {
    fn default() -> Experts {
        Experts { count: 8, used: 2, ff: 0, shared_ff: 0 }
    }
}

/// What to synthesize.
pub struct Spec<'a> {
    /// Architecture.
    pub arch: Arch,
    /// Experts (MoE architectures; `ff` 0 = the shape's `ff / used`).
    pub experts: Experts,
    /// Layer shape.
    pub shape: Shape,
    /// Type of every matrix (embeddings and output included); norms are F32.
    pub wtype: GgmlType,
    /// Seed of the weights.
    pub seed: u64,
    /// The GGUF whose `tokenizer.*` metadata is copied (its vocabulary sets the vocabulary size).
    pub tokenizer: &'a Gguf,
    /// Worker threads for filling tensors.
    pub threads: usize,
}

/// Builds the synthetic model (held in memory; write it with [`GgufWriter::write_file`]).
pub fn synthesize(spec: &Spec<'_>) -> Result<GgufWriter> {
    let s = spec.shape;
    let arch = spec.arch;
    s.check(spec.wtype)?;
    let mut ex = spec.experts;
    if arch.moe() {
        if ex.ff == 0 {
            ex.ff = s.ff / ex.used.max(1);
        }
        let bs = spec.wtype.blck_size() as u64;
        if ex.count == 0 || ex.used == 0 || ex.used > ex.count || ex.ff == 0 {
            return Err(Error::Model(format!("synthetic model: {ex:?} is not a valid expert layout")));
        }
        if !ex.ff.is_multiple_of(bs) || !ex.shared_ff.is_multiple_of(bs) {
            return Err(Error::Model(format!(
                "synthetic model: {} stores rows in blocks of {bs}: expert widths {} and {} must be multiples",
                spec.wtype, ex.ff, ex.shared_ff
            )));
        }
    }
    let vocab = spec
        .tokenizer
        .get_str_array_opt("tokenizer.ggml.tokens")?
        .ok_or_else(|| {
            Error::Model("synthetic model: the tokenizer GGUF has no tokenizer.ggml.tokens".into())
        })?
        .len() as u64;
    let a = arch.name();
    let mut w = GgufWriter::new();
    w.add("general.architecture", a);
    w.add(
        "general.name",
        format!("llamad synthetic {a} {}x{} {} layers {}", s.embd, s.ff, s.layers, spec.wtype),
    );
    let mut u32s = vec![
        ("context_length", 8192),
        ("embedding_length", s.embd),
        ("block_count", s.layers),
        ("feed_forward_length", s.ff),
        ("attention.head_count", s.heads),
        ("attention.head_count_kv", s.kv_heads),
        ("attention.key_length", s.head_dim()),
        ("attention.value_length", s.head_dim()),
        ("rope.dimension_count", s.head_dim()),
        ("vocab_size", vocab),
    ];
    if arch.moe() {
        u32s.extend([
            ("expert_count", ex.count),
            ("expert_used_count", ex.used),
            ("expert_feed_forward_length", ex.ff),
        ]);
        if arch == Arch::Qwen2Moe && ex.shared_ff > 0 {
            u32s.push(("expert_shared_feed_forward_length", ex.shared_ff));
        }
    }
    if arch == Arch::Gemma3 {
        // Every other layer slides over a window of 128 cells (real Gemma 3: 5 of 6, 512 or 1024).
        u32s.extend([("attention.sliding_window", 128), ("attention.sliding_window_pattern", 2)]);
    }
    for (k, v) in u32s {
        let v =
            u32::try_from(v).map_err(|_| Error::Model(format!("synthetic model: {k} {v} overflows u32")))?;
        w.add(&format!("{a}.{k}"), Value::U32(v));
    }
    let base = if matches!(arch, Arch::Llama | Arch::Mistral3) { 500_000.0 } else { 1_000_000.0 };
    w.add(&format!("{a}.rope.freq_base"), Value::F32(base));
    if arch == Arch::Gemma3 {
        w.add(&format!("{a}.rope.freq_base_swa"), Value::F32(10_000.0));
    }
    let eps = if arch == Arch::Gemma3 { 1e-6 } else { 1e-5 };
    w.add(&format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(eps));
    for (k, v) in spec.tokenizer.metadata() {
        if k.starts_with("tokenizer.") {
            w.add(k, v.clone());
        }
    }
    let mut pools: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut widths = vec![s.embd, s.ff, s.head_dim() * s.heads];
    if arch.moe() {
        widths.extend([ex.ff, ex.shared_ff]);
    }
    for n in widths {
        if n > 0 && !pools.contains_key(&n) {
            pools.insert(n, row_pool(spec.wtype, n as usize, spec.seed ^ n)?);
        }
    }
    let kv = s.kv_heads * s.head_dim();
    let qd = s.heads * s.head_dim();
    let mut id = 0u64;
    let mut matrix = |w: &mut GgufWriter, name: &str, ne: &[u64]| -> Result<()> {
        id += 1;
        let rows = ne[1..].iter().product::<u64>() as usize;
        let data =
            fill(&pools[&ne[0]], rows, spec.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ id, spec.threads);
        w.add_tensor(name, spec.wtype, ne, data)?;
        Ok(())
    };
    let mut rng = quant::testing::Xorshift(spec.seed.wrapping_mul(0xA076_1D64_78BD_642F) | 1);
    // Norm weights near 1 (Gemma's too: its GGUF stores 1 + w), small biases and F32 routers, as
    // llama.cpp's quantizer leaves them.
    let mut f32_tensor =
        |w: &mut GgufWriter, name: &str, ne: &[u64], center: f32, spread: f32| -> Result<()> {
            let n = ne.iter().product::<u64>();
            let v: Vec<f32> = (0..n).map(|_| center + spread * (2.0 * rng.unit() - 1.0)).collect();
            w.add_f32_tensor(name, ne, &v)?;
            Ok(())
        };
    let norm_center = 1.0;
    matrix(&mut w, "token_embd.weight", &[s.embd, vocab])?;
    for l in 0..s.layers {
        let b = |n: &str| format!("blk.{l}.{n}");
        f32_tensor(&mut w, &b("attn_norm.weight"), &[s.embd], norm_center, 0.1)?;
        matrix(&mut w, &b("attn_q.weight"), &[s.embd, qd])?;
        matrix(&mut w, &b("attn_k.weight"), &[s.embd, kv])?;
        matrix(&mut w, &b("attn_v.weight"), &[s.embd, kv])?;
        matrix(&mut w, &b("attn_output.weight"), &[qd, s.embd])?;
        if arch.qkv_bias() {
            f32_tensor(&mut w, &b("attn_q.bias"), &[qd], 0.0, 0.05)?;
            f32_tensor(&mut w, &b("attn_k.bias"), &[kv], 0.0, 0.05)?;
            f32_tensor(&mut w, &b("attn_v.bias"), &[kv], 0.0, 0.05)?;
        }
        if arch.qk_norm() {
            f32_tensor(&mut w, &b("attn_q_norm.weight"), &[s.head_dim()], norm_center, 0.1)?;
            f32_tensor(&mut w, &b("attn_k_norm.weight"), &[s.head_dim()], norm_center, 0.1)?;
        }
        if arch == Arch::Gemma3 {
            f32_tensor(&mut w, &b("post_attention_norm.weight"), &[s.embd], norm_center, 0.1)?;
            f32_tensor(&mut w, &b("post_ffw_norm.weight"), &[s.embd], norm_center, 0.1)?;
        }
        f32_tensor(&mut w, &b("ffn_norm.weight"), &[s.embd], norm_center, 0.1)?;
        if arch.moe() {
            f32_tensor(&mut w, &b("ffn_gate_inp.weight"), &[s.embd, ex.count], 0.0, 0.1)?;
            matrix(&mut w, &b("ffn_gate_exps.weight"), &[s.embd, ex.ff, ex.count])?;
            matrix(&mut w, &b("ffn_up_exps.weight"), &[s.embd, ex.ff, ex.count])?;
            matrix(&mut w, &b("ffn_down_exps.weight"), &[ex.ff, s.embd, ex.count])?;
            if arch == Arch::Qwen2Moe && ex.shared_ff > 0 {
                f32_tensor(&mut w, &b("ffn_gate_inp_shexp.weight"), &[s.embd], 0.0, 0.1)?;
                matrix(&mut w, &b("ffn_gate_shexp.weight"), &[s.embd, ex.shared_ff])?;
                matrix(&mut w, &b("ffn_up_shexp.weight"), &[s.embd, ex.shared_ff])?;
                matrix(&mut w, &b("ffn_down_shexp.weight"), &[ex.shared_ff, s.embd])?;
            }
        } else {
            matrix(&mut w, &b("ffn_gate.weight"), &[s.embd, s.ff])?;
            matrix(&mut w, &b("ffn_up.weight"), &[s.embd, s.ff])?;
            matrix(&mut w, &b("ffn_down.weight"), &[s.ff, s.embd])?;
        }
    }
    f32_tensor(&mut w, "output_norm.weight", &[s.embd], norm_center, 0.1)?;
    if arch != Arch::Gemma3 {
        matrix(&mut w, "output.weight", &[s.embd, vocab])?;
    }
    Ok(w)
}

/// `POOL_ROWS` distinct rows of `n` elements of `t`, concatenated.
fn row_pool(t: GgmlType, n: usize, seed: u64) -> Result<Vec<u8>> {
    let row = t
        .row_size(n as u64)
        .ok_or_else(|| Error::Model(format!("synthetic model: {n} is not whole {t} blocks")))?
        as usize;
    if let Some(b) = quant::testing::random_grid_blocks(t, POOL_ROWS * n / t.blck_size(), WEIGHT_STD, seed) {
        return Ok(b);
    }
    let from = quant::kernels(t).from_f32.ok_or(Error::MissingKernel { dtype: t, kernel: "from_f32" })?;
    let mut rng = quant::testing::Xorshift(seed | 1);
    let mut vals = vec![0.0f32; n];
    let mut out = vec![0u8; POOL_ROWS * row];
    for r in out.chunks_exact_mut(row) {
        for v in vals.iter_mut() {
            // A sum of four uniforms: close enough to normal, deviation WEIGHT_STD.
            let u: f32 = (0..4).map(|_| rng.unit()).sum::<f32>() - 2.0;
            *v = u * (WEIGHT_STD * 3.0f32.sqrt());
        }
        from(&vals, r);
    }
    Ok(out)
}

/// `rows` rows, each a pool row picked by a hash of (`seed`, row), filled by `threads` threads.
fn fill(pool: &[u8], rows: usize, seed: u64, threads: usize) -> Vec<u8> {
    let row = pool.len() / POOL_ROWS;
    let mut out = vec![0u8; rows * row];
    let per = rows.div_ceil(threads.max(1)).max(1);
    thread::scope(|sc| {
        for (c, chunk) in out.chunks_mut(per * row).enumerate() {
            sc.spawn(move || {
                for (i, dst) in chunk.chunks_exact_mut(row).enumerate() {
                    let r = (c * per + i) as u64;
                    let h =
                        (seed ^ r.wrapping_mul(0xD6E8_FEB8_6659_FD93)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    let p = (h >> 32) as usize % POOL_ROWS;
                    dst.copy_from_slice(&pool[p * row..(p + 1) * row]);
                }
            });
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_and_shape_checks() {
        let s = Shape::preset("8B").unwrap().with_layers(2);
        assert_eq!((s.embd, s.ff, s.heads, s.kv_heads, s.layers, s.head_dim()), (4096, 14336, 32, 8, 2, 128));
        assert!(Shape::preset("13b").is_none());
        // 576-wide rows are not whole 256-element blocks.
        let smol = Shape { embd: 576, ff: 1536, heads: 9, kv_heads: 3, layers: 1 };
        assert!(smol.check(GgmlType::IQ2_XS).is_err());
        assert!(smol.check(GgmlType::Q4_0).is_ok());
        assert!(Shape { heads: 7, ..smol }.check(GgmlType::Q4_0).is_err());
    }

    #[test]
    fn fill_is_deterministic_and_uses_the_pool() {
        let pool: Vec<u8> = (0..POOL_ROWS * 4).map(|i| (i / 4) as u8).collect();
        let a = fill(&pool, 100, 7, 3);
        assert_eq!(a, fill(&pool, 100, 7, 1));
        assert_ne!(a, fill(&pool, 100, 8, 1));
        for r in a.chunks_exact(4) {
            assert!(r.iter().all(|&b| b == r[0]) && (r[0] as usize) < POOL_ROWS);
        }
    }
}
