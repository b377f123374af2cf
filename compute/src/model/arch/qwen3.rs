//! `qwen3` and `qwen3moe`: the llama layer with NEOX RoPE and per-head Q/K RMS norm before RoPE;
//! the MoE variant uses the expert block (ref: ggml-compute-semantics.md §4.6, §4.7).

use crate::error::Result;
use crate::model::arch::blocks::{layers_and_head, pre_norm_layer, AttnOptions};
use crate::model::arch::Ctx;
use crate::model::graph_def::TensorId;

/// Builds the qwen3 graph; returns its output tensor.
pub fn build(b: &mut Ctx<'_>) -> Result<TensorId> {
    let x = b.input_embeddings()?;
    let o = AttnOptions { qk_norm: true, ..AttnOptions::default() };
    layers_and_head(b, x, |b, il, x| pre_norm_layer(b, il, x, o))
}
