//! Per-architecture forward graphs, one micro-batch (ubatch) at a time.
//!
//! [`build`] records the graph llama.cpp builds for a model (ref: ggml-compute-semantics.md
//! §4.3–§4.7) for a range of layers `[first, last)`, so a model can be split across devices: the
//! first range starts from the token ids (`inp_tokens` → GET_ROWS on `token_embd.weight`), later
//! ranges start from the previous range's hidden state (an F32 `[E, T]` input), and only the range
//! that ends at `n_layer` carries the `out_ids` row selection, the output norm and the LM head.
//!
//! The shared pieces (projections, RoPE, KV-cache store, attention with and without flash
//! attention, dense feed-forward) live in [`blocks`], the expert block in [`moe`]; each architecture file strings them
//! together in its own order.

pub mod blocks;
pub mod gemma3;
pub mod llama;
pub mod moe;
pub mod qwen2;
pub mod qwen3;

use std::collections::HashMap;
use std::ops::Range;

use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::model::graph_def::{GraphDef, KvKind, TensorId};
use crate::model::hparams::{Arch, HParams};
use crate::model::weights::{WeightSource, Weights};
use crate::tensor::MAX_DIMS;

/// Shape parameters of one ubatch graph; two graphs with equal parameters are identical.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BuildParams {
    /// Tokens in the ubatch (`T`).
    pub n_tokens: u64,
    /// Rows of logits wanted (`O`, ≤ `T`).
    pub n_outputs: u64,
    /// KV cells attended (`Nkv`, a multiple of 256 or the cache size).
    pub n_kv: u64,
    /// KV-cache cells per layer.
    pub kv_size: u64,
    /// KV-cache element type (F16 by default).
    pub kv_type: GgmlType,
    /// Flash attention on (FLASH_ATTN_EXT, F16 mask) or off (MUL_MAT + SOFT_MAX, F32 mask,
    /// transposed V cache).
    pub flash_attn: bool,
    /// The layers this graph computes.
    pub layers: Range<u32>,
}

/// The graph inputs of a built ubatch graph (ref: ggml-compute-semantics.md §4.2).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inputs {
    /// `inp_tokens` I32 `[T]` (first range only).
    pub tokens: Option<TensorId>,
    /// Hidden state F32 `[E, T]` from the previous range (later ranges only).
    pub hidden: Option<TensorId>,
    /// `inp_pos` I32 `[T]`.
    pub pos: Option<TensorId>,
    /// `attn_inp_kq_mask` `[Nkv, T]` (F16 with flash attention, F32 without).
    pub kq_mask: Option<TensorId>,
    /// The sliding-window mask (Gemma 3), same name and shape.
    pub kq_mask_swa: Option<TensorId>,
    /// `attn_inp_k_idxs` I64 `[T]`.
    pub k_idxs: Option<TensorId>,
    /// `attn_inp_v_idxs` I64 `[T]` (flash attention) or `[T*Hkv*D]` (transposed V).
    pub v_idxs: Option<TensorId>,
    /// `out_ids` I32 `[O]` (last range only).
    pub out_ids: Option<TensorId>,
    /// `inp_attn_scale` F32 `[1, 1, T]`: the per-token attention temperature (Mistral 3 with
    /// `attention.temperature_scale`), see [`HParams::attn_temperature`].
    pub attn_scale: Option<TensorId>,
}

/// Gives access to the bytes of a graph's input tensors (implemented by each backend).
pub trait InputSink {
    /// The bytes of input `id`, exactly its `nbytes()` long.
    fn bytes(&mut self, id: TensorId) -> Result<&mut [u8]>;
}

/// A built ubatch graph.
#[derive(Clone, Debug)]
pub struct Built {
    /// The graph.
    pub graph: GraphDef,
    /// Its inputs.
    pub inputs: Inputs,
    /// The result: logits F32 `[n_vocab, O]` for the last range, else the hidden state F32 `[E, T]`.
    pub output: TensorId,
    /// The parameters it was built with.
    pub params: BuildParams,
}

/// Builds the ubatch graph of `hp`'s architecture.
pub fn build(hp: &HParams, src: &dyn WeightSource, p: &BuildParams) -> Result<Built> {
    if p.layers.start >= p.layers.end || p.layers.end > hp.n_layer {
        return Err(Error::Model(format!("layer range {:?} of {} layers", p.layers, hp.n_layer)));
    }
    if p.n_tokens == 0 || p.n_outputs == 0 || p.n_outputs > p.n_tokens || p.n_kv == 0 || p.n_kv > p.kv_size {
        return Err(Error::Model(format!(
            "invalid ubatch: {} tokens, {} outputs, {} of {} kv cells",
            p.n_tokens, p.n_outputs, p.n_kv, p.kv_size
        )));
    }
    let mut b = Ctx::new(hp, src, p)?;
    let output = match hp.arch {
        Arch::Llama | Arch::Mistral3 => llama::build(&mut b)?,
        Arch::Qwen2 | Arch::Qwen2Moe => qwen2::build(&mut b)?,
        Arch::Qwen3 | Arch::Qwen3Moe => qwen3::build(&mut b)?,
        Arch::Gemma3 => gemma3::build(&mut b)?,
    };
    // llama.cpp flags the logits as an output; a range's hidden state is only copied to the next
    // device by its scheduler, unflagged.
    if p.layers.end == hp.n_layer {
        b.g.set_output(output);
    }
    b.g.expand(output);
    Ok(Built { graph: b.g, inputs: b.inputs, output, params: p.clone() })
}

/// Builder state shared by the architecture files.
pub struct Ctx<'a> {
    /// The graph under construction.
    pub g: GraphDef,
    /// Hyper-parameters.
    pub hp: &'a HParams,
    /// Build parameters.
    pub p: &'a BuildParams,
    /// Inputs created so far.
    pub inputs: Inputs,
    w: Weights<'a>,
    src: &'a dyn WeightSource,
    leaves: HashMap<String, TensorId>,
}

impl<'a> Ctx<'a> {
    pub(crate) fn new(hp: &'a HParams, src: &'a dyn WeightSource, p: &'a BuildParams) -> Result<Ctx<'a>> {
        Ok(Ctx {
            g: GraphDef::new(),
            hp,
            p,
            inputs: Inputs::default(),
            w: Weights::new(src),
            src,
            leaves: HashMap::new(),
        })
    }

    /// The weight leaf `name` with shape `ne`, created once.
    pub fn weight(&mut self, name: &str, ne: [u64; MAX_DIMS]) -> Result<TensorId> {
        if let Some(&id) = self.leaves.get(name) {
            return Ok(id);
        }
        let w = self.w.require(name, ne)?;
        let id = self.g.weight(name, w.dtype, ne)?;
        self.leaves.insert(name.to_string(), id);
        Ok(id)
    }

    /// The weight leaf `name` if the model has it.
    pub fn weight_opt(&mut self, name: &str, ne: [u64; MAX_DIMS]) -> Result<Option<TensorId>> {
        if self.src.tensor(name).is_none() {
            return Ok(None);
        }
        self.weight(name, ne).map(Some)
    }

    /// Layer weight `blk.{il}.{name}`.
    pub fn lw(&mut self, il: u32, name: &str, ne: [u64; MAX_DIMS]) -> Result<TensorId> {
        self.weight(&format!("blk.{il}.{name}"), ne)
    }

    /// Optional layer weight `blk.{il}.{name}`.
    pub fn lw_opt(&mut self, il: u32, name: &str, ne: [u64; MAX_DIMS]) -> Result<Option<TensorId>> {
        self.weight_opt(&format!("blk.{il}.{name}"), ne)
    }

    /// Names `id` as `{name}-{il}`.
    pub fn name(&mut self, id: TensorId, name: &str, il: u32) -> TensorId {
        self.g.set_name(id, &format!("{name}-{il}"))
    }

    /// The KV-cache leaf of `il`: `[Hkv*D, kv_size]` in the cache type.
    pub fn kv_cache(&mut self, il: u32, kind: KvKind) -> Result<TensorId> {
        let key = format!("\0kv{il}{kind:?}");
        if let Some(&id) = self.leaves.get(&key) {
            return Ok(id);
        }
        let rows = match kind {
            KvKind::K => self.hp.n_embd_k_gqa(),
            KvKind::V => self.hp.n_embd_v_gqa(),
        };
        let id = self.g.kv_cache(il, kind, self.p.kv_type, [rows, self.p.kv_size, 1, 1])?;
        self.leaves.insert(key, id);
        Ok(id)
    }

    /// The model input of this range: token embeddings (first range) or the hidden-state input.
    pub fn input_embeddings(&mut self) -> Result<TensorId> {
        let (e, t) = (self.hp.n_embd, self.p.n_tokens);
        if self.p.layers.start == 0 {
            let tokens = self.g.input("inp_tokens", GgmlType::I32, [t, 1, 1, 1])?;
            self.inputs.tokens = Some(tokens);
            let embd = self.weight("token_embd.weight", [e, self.hp.n_vocab, 1, 1])?;
            let x = self.g.get_rows(embd, tokens)?;
            Ok(self.g.set_name(x, "inp_embd"))
        } else {
            let name = format!("l_out-{}", self.p.layers.start - 1);
            let h = self.g.input(&name, GgmlType::F32, [e, t, 1, 1])?;
            self.inputs.hidden = Some(h);
            Ok(h)
        }
    }

    /// Creates the per-step attention inputs (positions, masks, KV indices).
    pub fn attention_inputs(&mut self) -> Result<()> {
        let (t, nkv) = (self.p.n_tokens, self.p.n_kv);
        self.inputs.pos = Some(self.g.input("inp_pos", GgmlType::I32, [t, 1, 1, 1])?);
        if self.hp.attn_temp_scale != 0.0 {
            self.inputs.attn_scale = Some(self.g.input("inp_attn_scale", GgmlType::F32, [1, 1, t, 1])?);
        }
        let mask_type = if self.p.flash_attn { GgmlType::F16 } else { GgmlType::F32 };
        self.inputs.kq_mask = Some(self.g.input("attn_inp_kq_mask", mask_type, [nkv, t, 1, 1])?);
        if self.p.layers.clone().any(|il| self.hp.is_swa_layer(il)) {
            self.inputs.kq_mask_swa = Some(self.g.input("attn_inp_kq_mask", mask_type, [nkv, t, 1, 1])?);
        }
        self.inputs.k_idxs = Some(self.g.input("attn_inp_k_idxs", GgmlType::I64, [t, 1, 1, 1])?);
        let nv = if self.p.flash_attn { t } else { t * self.hp.n_embd_v_gqa() };
        self.inputs.v_idxs = Some(self.g.input("attn_inp_v_idxs", GgmlType::I64, [nv, 1, 1, 1])?);
        Ok(())
    }

    /// True when layer `il` is the model's last layer and this graph produces logits.
    pub fn is_output_layer(&self, il: u32) -> bool {
        il + 1 == self.hp.n_layer && self.p.layers.end == self.hp.n_layer
    }

    /// The `out_ids` input (created on first use).
    pub fn out_ids(&mut self) -> Result<TensorId> {
        if let Some(id) = self.inputs.out_ids {
            return Ok(id);
        }
        let id = self.g.input("out_ids", GgmlType::I32, [self.p.n_outputs, 1, 1, 1])?;
        self.inputs.out_ids = Some(id);
        Ok(id)
    }

    /// Output norm and LM head (tied to `token_embd.weight` when `output.weight` is absent),
    /// plus Gemma's optional final logit softcapping.
    pub fn output_head(&mut self, cur: TensorId) -> Result<TensorId> {
        let e = self.hp.n_embd;
        let n = self.g.rms_norm(cur, self.hp.rms_eps)?;
        self.g.set_name(n, "norm");
        let w = self.weight("output_norm.weight", [e, 1, 1, 1])?;
        let cur = self.g.mul(n, w)?;
        self.g.set_name(cur, "result_norm");
        self.g.set_output(cur);
        let head = self.w.lm_head_name();
        let wo = self.weight(head, [e, self.hp.n_vocab, 1, 1])?;
        let mut logits = self.g.mul_mat(wo, cur)?;
        if let Some(bias) = self.weight_opt("output.bias", [self.hp.n_vocab, 1, 1, 1])? {
            logits = self.g.add(logits, bias)?;
        }
        let cap = self.hp.final_logit_softcap;
        if cap != 0.0 {
            logits = blocks::softcap(self, logits, cap)?;
        }
        Ok(self.g.set_name(logits, "result_output"))
    }
}
