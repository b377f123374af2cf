//! A decoding session: the KV state and positions of one sequence on a [`LocalBackend`].
//!
//! [`Session::decode`] feeds tokens — a prompt in ubatches of at most `n_ubatch` tokens, then one
//! token per step — and returns the logits of the last token. Each ubatch fills the graph inputs
//! as llama.cpp does for a single sequence with a unified cache (ref: ggml-compute-semantics.md
//! §4.2): cell `i` holds position `i`, so the K/V destination rows are the positions, the causal
//! mask is `0` for cells `<= p` and `-inf` otherwise. `Nkv`, the cells attended, is the used
//! extent rounded up to [`SessionConfig::kv_pad`] while short, to a granule growing to 256 as it
//! grows (capped at the cache size; [`n_kv_for`]): 256 by default, llama.cpp's rounding, so the
//! graphs have llama.cpp's shapes; 64 attends fewer empty cells with the same logits bit for bit
//! (see [`KV_PAD`]).

use std::sync::Arc;

use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::model::arch::{BuildParams, Built, InputSink};
use crate::model::graph_def::TensorId;
use crate::model::hparams::HParams;
use crate::model::local::{write_float, write_i32, write_i64, LocalBackend};
use crate::model::weights::WeightSource;
use crate::sample::Sampler;

/// Session settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionConfig {
    /// KV-cache cells (maximum sequence length).
    pub n_ctx: u64,
    /// Largest ubatch (llama.cpp default 512).
    pub n_ubatch: u64,
    /// Flash attention on or off.
    pub flash_attn: bool,
    /// KV-cache type (F16 by default).
    pub kv_type: GgmlType,
    /// Executor threads.
    pub n_threads: usize,
    /// `Nkv` is the used extent rounded up to a multiple of this while short ([`KV_PAD`], llama.cpp's
    /// 256, by default; see [`n_kv_for`]). Must be a positive multiple of 64.
    pub kv_pad: u64,
}

/// The default rounding of the attended extent `Nkv`: llama.cpp's 256, so that every graph has the
/// shapes llama.cpp's master gives it (`tests/interop/test_graphs.py` compares them node by node).
///
/// Any multiple of 64 gives the same logits. Cells past the used extent are masked (`-inf`), so
/// they add exact zeros: to the softmax sum, to every lane of the `Σ softmax · v` dot products, and
/// nothing at all to flash attention, which skips masked cells. As long as `Nkv` is a multiple of 64,
/// the F16 dot products' vector step in every x86 profile (four 8-lane accumulators in ggml's AVX2
/// order, four 16-lane ones in its AVX-512 order), no nonzero term changes lane or order, so the
/// logits equal those of the 256-cell rounding bit for bit (tested in
/// `compute/tests/model_session.rs`; 32 was enough before the AVX-512 profile). With 64
/// (`--kv-pad 64`), generation from a short context
/// attends up to 224 fewer empty cells per step (tg128 from an empty cache: 80 cells on average
/// instead of 256), at the price of more graphs to build and keep (about 2 MB each for SmolLM2 on a
/// worker that caches them), which is why the granule grows with the extent ([`n_kv_for`]): 28
/// graph extents for a 4096-cell context against llama.cpp's 16.
pub const KV_PAD: u64 = 256;

/// Checks a [`SessionConfig::kv_pad`]: a positive multiple of 64 (see [`KV_PAD`]).
pub fn check_kv_pad(pad: u64) -> Result<()> {
    if pad == 0 || !pad.is_multiple_of(64) {
        return Err(Error::Model(format!("kv_pad {pad} is not a positive multiple of 64")));
    }
    Ok(())
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            n_ctx: 4096,
            n_ubatch: 512,
            flash_attn: true,
            kv_type: GgmlType::F16,
            n_threads: 1,
            kv_pad: KV_PAD,
        }
    }
}

/// A loaded model: hyper-parameters plus its weight source.
#[derive(Clone)]
pub struct Model {
    /// Hyper-parameters.
    pub hp: HParams,
    /// Metadata and weights.
    pub src: Arc<dyn WeightSource>,
}

impl Model {
    /// Reads the hyper-parameters of `src`.
    pub fn new(src: Arc<dyn WeightSource>) -> Result<Model> {
        let hp = HParams::from_source(src.as_ref())?;
        Ok(Model { hp, src })
    }

    /// Bytes of the model's weights (0 where the source cannot tell).
    pub fn weight_bytes(&self) -> u64 {
        self.src.weight_bytes().unwrap_or(0)
    }

    /// Opens a GGUF file memory-mapped (weights are used in place).
    ///
    /// # Safety
    /// The file must not be modified or truncated while the model, or a session using it, is
    /// alive (the weights are read through a shared mapping; see [`Gguf::open`]).
    pub unsafe fn open(path: impl AsRef<std::path::Path>) -> Result<Model> {
        // SAFETY: forwarded to the caller (this function's contract).
        let g = unsafe { Gguf::open(path) }?;
        Model::new(Arc::new(g))
    }

    /// Reads a GGUF file into memory (no mapping, so no contract; costs the file's size in RAM).
    pub fn read(path: impl AsRef<std::path::Path>) -> Result<Model> {
        Model::new(Arc::new(Gguf::read(path)?))
    }
}

/// The cells attended for a cache of `kv_size` cells holding `used`: `used` rounded up to a
/// granule, capped at the cache size. The granule is `pad` while `used` ≤ 8 · `pad`, then an
/// eighth of the next power of two above `used`, at most 256 (or `pad` when larger): llama.cpp's
/// rounding (`pad` = 256, ref §4.1) never attends fewer cells, and a long context builds few
/// graphs (with `pad` = 32: eight extents up to 256, four each up to 512 and 1024, then one per 256
/// cells as llama.cpp). See [`KV_PAD`].
pub fn n_kv_for(used: u64, kv_size: u64, pad: u64) -> u64 {
    let pad = pad.max(1);
    let granule = (used.max(1).next_power_of_two() / 8).clamp(pad, pad.max(256));
    used.div_ceil(granule).max(1).saturating_mul(granule).min(kv_size)
}

/// One sequence being decoded.
pub struct Session {
    model: Model,
    cfg: SessionConfig,
    backend: LocalBackend,
    n_past: u64,
    logits: Vec<f32>,
}

impl Session {
    /// A fresh session (empty KV cache).
    pub fn new(model: Model, cfg: SessionConfig) -> Result<Session> {
        if cfg.n_ctx == 0 || cfg.n_ubatch == 0 {
            return Err(Error::Model("n_ctx and n_ubatch must be positive".into()));
        }
        check_kv_pad(cfg.kv_pad)?;
        let backend = LocalBackend::new(model.src.clone(), model.hp.clone(), cfg.n_threads)?;
        Ok(Session { model, cfg, backend, n_past: 0, logits: Vec::new() })
    }

    /// Tokens in the KV cache.
    pub fn n_past(&self) -> u64 {
        self.n_past
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The backend (graph statistics).
    pub fn backend(&self) -> &LocalBackend {
        &self.backend
    }

    /// Forgets the sequence (positions restart at 0).
    pub fn clear(&mut self) {
        self.backend.clear_kv();
        self.n_past = 0;
        self.logits.clear();
    }

    /// Feeds `tokens` after the ones already decoded and returns the logits of the last one.
    pub fn decode(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.check(tokens)?;
        for chunk in tokens.chunks(self.cfg.n_ubatch as usize) {
            self.logits.clear();
            self.decode_ubatch(chunk, false)?;
        }
        Ok(&self.logits)
    }

    /// Like [`Session::decode`], but returns the logits of every token (`tokens.len()` rows of
    /// `n_vocab`, token-major), as perplexity measurements need.
    pub fn decode_all(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.check(tokens)?;
        self.logits.clear();
        for chunk in tokens.chunks(self.cfg.n_ubatch as usize) {
            self.decode_ubatch(chunk, true)?;
        }
        Ok(&self.logits)
    }

    fn check(&self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::Model("decode of zero tokens".into()));
        }
        let n_vocab = self.model.hp.n_vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| u64::from(t) >= n_vocab) {
            return Err(Error::Model(format!("token {bad} out of range (vocabulary of {n_vocab})")));
        }
        if self.n_past + tokens.len() as u64 > self.cfg.n_ctx {
            return Err(Error::Model(format!(
                "context full: {} + {} tokens exceed n_ctx {}",
                self.n_past,
                tokens.len(),
                self.cfg.n_ctx
            )));
        }
        Ok(())
    }

    /// Decodes `prompt`, then samples up to `max_new` tokens one step at a time. Every prompt and
    /// generated token is shown to the sampler's penalty history. Generation stops after an
    /// end-of-generation token (`is_eog`, which is still returned) or when `on_token` returns
    /// false. Returns the generated tokens.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        sampler: &mut Sampler,
        max_new: usize,
        is_eog: impl Fn(u32) -> bool,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<Vec<u32>> {
        for &t in prompt {
            sampler.accept(t);
        }
        let mut out = Vec::new();
        let mut logits = self.decode(prompt)?;
        while out.len() < max_new {
            let t = sampler.sample(logits).ok_or_else(|| Error::Model("empty logits".into()))?;
            sampler.accept(t);
            out.push(t);
            if is_eog(t) || !on_token(t) || out.len() == max_new {
                break;
            }
            logits = self.decode(&[t])?;
        }
        Ok(out)
    }

    /// Runs one ubatch and appends its output rows (the last token's, or all with `all`) to
    /// `self.logits`.
    fn decode_ubatch(&mut self, tokens: &[u32], all: bool) -> Result<()> {
        let hp = &self.model.hp;
        let n_out = if all { tokens.len() as u64 } else { 1 };
        let p = ubatch_params(hp, &self.cfg, self.n_past, tokens.len() as u64, n_out);
        let n_past = self.n_past;
        let output = self.backend.run(&p, |built, w| fill_inputs(hp, built, n_past, tokens, w))?.output;
        let bytes = self.backend.tensor_bytes(output)?;
        self.logits.extend(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
        self.n_past += tokens.len() as u64;
        Ok(())
    }
}

/// The graph shape of a ubatch of `n_tokens` after `n_past` cached tokens (whole model, the last
/// `n_outputs` tokens' logits).
pub fn ubatch_params(
    hp: &HParams,
    cfg: &SessionConfig,
    n_past: u64,
    n_tokens: u64,
    n_outputs: u64,
) -> BuildParams {
    BuildParams {
        n_tokens,
        n_outputs,
        n_kv: n_kv_for(n_past + n_tokens, cfg.n_ctx, cfg.kv_pad),
        kv_size: cfg.n_ctx,
        kv_type: cfg.kv_type,
        flash_attn: cfg.flash_attn,
        layers: 0..hp.n_layer,
    }
}

/// Writes the inputs of a single-sequence ubatch: tokens, positions `n_past..`, KV destination
/// rows (cell = position), causal (and sliding-window) masks, `out_ids` = the last token.
pub fn fill_inputs(
    hp: &HParams,
    built: &Built,
    n_past: u64,
    tokens: &[u32],
    w: &mut dyn InputSink,
) -> Result<()> {
    let p = &built.params;
    let t = tokens.len() as u64;
    if t != p.n_tokens {
        return Err(Error::Model(format!("{t} tokens for a graph of {}", p.n_tokens)));
    }
    let (n_kv, kv_size, fa, n_swa, nv_rows) = (p.n_kv, p.kv_size, p.flash_attn, hp.n_swa, hp.n_embd_v_gqa());
    let ins = &built.inputs;
    let need =
        |x: Option<TensorId>, what: &str| x.ok_or_else(|| Error::Model(format!("graph has no {what} input")));
    if let Some(id) = ins.tokens {
        write_i32(w.bytes(id)?, tokens.iter().map(|&x| x as i32));
    }
    write_i32(w.bytes(need(ins.pos, "position")?)?, (0..t).map(|i| (n_past + i) as i32));
    write_i64(w.bytes(need(ins.k_idxs, "k index")?)?, (0..t).map(|i| (n_past + i) as i64));
    let v_idxs = w.bytes(need(ins.v_idxs, "v index")?)?;
    if fa {
        write_i64(v_idxs, (0..t).map(|i| (n_past + i) as i64));
    } else {
        // Transposed V cache: element (channel c, cell) at c*kv_size + cell (ref §4.2).
        write_i64(v_idxs, (0..t).flat_map(|i| (0..nv_rows).map(move |c| (c * kv_size + n_past + i) as i64)));
    }
    if let Some(id) = ins.out_ids {
        write_i32(w.bytes(id)?, (t - p.n_outputs..t).map(|i| i as i32));
    }
    if let Some(id) = ins.attn_scale {
        write_float(w.bytes(id)?, GgmlType::F32, (0..t).map(|i| hp.attn_temperature(n_past + i)))?;
    }
    let mask_type = if fa { GgmlType::F16 } else { GgmlType::F32 };
    let causal = |swa: bool| {
        (0..t).flat_map(move |i| {
            let pq = n_past + i;
            (0..n_kv).map(move |cell| {
                let visible = cell <= pq && !(swa && pq - cell >= n_swa);
                if visible {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
    };
    write_float(w.bytes(need(ins.kq_mask, "mask")?)?, mask_type, causal(false))?;
    if let Some(m) = ins.kq_mask_swa {
        write_float(w.bytes(m)?, mask_type, causal(true))?;
    }
    Ok(())
}

/// Sessions move between threads (a daemon's job runner, a CLI's worker thread).
const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<Session>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn n_kv_rounds_to_the_padding_and_caps() {
        assert_eq!(n_kv_for(1, 4096, 256), 256);
        assert_eq!(n_kv_for(256, 4096, 256), 256);
        assert_eq!(n_kv_for(257, 4096, 256), 512);
        assert_eq!(n_kv_for(300, 300, 256), 300);
        assert_eq!(n_kv_for(5, 100, 256), 100);
        assert_eq!(n_kv_for(0, 4096, 32), 32);
        assert_eq!(n_kv_for(1, 4096, 32), 32);
        assert_eq!(n_kv_for(33, 4096, 32), 64);
        assert_eq!(n_kv_for(35, 40, 32), 40);
        // The granule grows with the extent: 32 up to 256, 64 up to 512, 128 up to 1024, then 256.
        assert_eq!(n_kv_for(256, 4096, 32), 256);
        assert_eq!(n_kv_for(257, 4096, 32), 320);
        assert_eq!(n_kv_for(513, 4096, 32), 640);
        assert_eq!(n_kv_for(1025, 4096, 32), 1280);
        assert_eq!(n_kv_for(3000, 4096, 32), 3072);
        let extents: std::collections::BTreeSet<u64> = (1..=4096).map(|u| n_kv_for(u, 4096, 32)).collect();
        assert_eq!(extents.len(), 28);
        assert!(extents.iter().all(|n| n % 32 == 0));
        // Never more cells than llama.cpp's rounding, and 256 is llama.cpp's rounding itself.
        assert!((1..=4096).all(|u| n_kv_for(u, 4096, 32) <= n_kv_for(u, 4096, 256)));
        assert!((1..=4096).all(|u| n_kv_for(u, 4096, 256) == u.div_ceil(256) * 256));
    }
}
