//! Tensor parallelism ("row split"): one shard of every layer per device.
//!
//! Each device holds a slice of every weight matrix (the scheme of Megatron-LM and
//! distributed-llama): attention by query heads (their Q rows, the K/V rows of the KV heads they
//! read, the matching input columns of `attn_output`), the feed-forward by `n_ff` (rows of
//! `ffn_gate`/`ffn_up`, input columns of `ffn_down`) and the LM head by vocabulary rows. Norm
//! weights are replicated. A device's KV cache holds the KV heads its query heads read.
//!
//! Query heads are split in proportion to the devices' weights, not whole KV groups: with nine
//! query heads over three KV heads, two devices get 5 and 4 query heads (2:1 by KV groups would
//! leave one device waiting for the other's extra attention every layer). A KV head whose group
//! is cut is projected and cached on both devices, and each device attends its heads group by
//! group ([`HeadGroup`]). The feed-forward channels are then split so that each device's whole
//! layer, attention included, is in proportion to its weight: the device with the extra head gets
//! fewer channels.
//!
//! Per layer there are two phases. In each, every device gets the residual stream `x` `[E, T]`,
//! computes norm → its part → its partial `[E, T]` output projection, and the caller sums the
//! partials into the residual. The LM head phase returns each device's vocabulary rows of the
//! logits. A shard is therefore a narrower copy of the model — `n_head`, `n_head_kv`, `n_ff` and
//! `n_vocab` reduced — so the graph blocks of [`crate::model::arch::blocks`] build it unchanged.
//!
//! Column slices of quantized matrices must fall on block boundaries; [`plan_shards`] checks it.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::model::arch::blocks::{attention_grouped, ffn_gated, rms_norm_mul, AttnOptions, HeadGroup};
use crate::model::arch::{BuildParams, Built, Ctx};
use crate::model::graph_def::TensorId;
use crate::model::hparams::{Arch, HParams};
use crate::model::weights::{MetaValue, WeightSource, WeightView};
use crate::op::GluOp;
use crate::tensor::MAX_DIMS;

/// The part of the model one device computes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardSpec {
    /// Query heads `[h0, h1)`.
    pub q_heads: Range<u64>,
    /// Query heads per KV head in the model.
    pub group_size: u64,
    /// Feed-forward channels `[f0, f1)`.
    pub ff: Range<u64>,
    /// Vocabulary rows of the LM head `[v0, v1)`.
    pub vocab: Range<u64>,
    /// The first shard also adds the biases of the output projections (they must count once).
    pub first: bool,
}

impl ShardSpec {
    /// KV heads `[g0, g1)`: those the query heads read.
    pub fn kv_heads(&self) -> Range<u64> {
        let gs = self.group_size.max(1);
        self.q_heads.start / gs..self.q_heads.end.div_ceil(gs)
    }

    /// The shard's query heads by KV head (in the shard's numbering), or `None` when every KV head
    /// it holds has its whole group (the broadcast form of attention applies).
    pub fn head_groups(&self) -> Option<Vec<HeadGroup>> {
        let gs = self.group_size.max(1);
        let (q, kv) = (&self.q_heads, self.kv_heads());
        let groups: Vec<HeadGroup> = kv
            .clone()
            .map(|j| {
                let (a, b) = (q.start.max(j * gs), q.end.min((j + 1) * gs));
                HeadGroup { kv: j - kv.start, q0: a - q.start, n: b.saturating_sub(a) }
            })
            .collect();
        if groups.iter().all(|g| g.n == gs) {
            None
        } else {
            Some(groups)
        }
    }
}

fn model_err(msg: impl Into<String>) -> Error {
    Error::Model(msg.into())
}

/// The attention options of `hp.arch`, or an error for architectures without row split.
pub fn attn_options(hp: &HParams) -> Result<AttnOptions> {
    if hp.n_expert > 0 {
        return Err(model_err(
            "row split does not support mixture-of-experts models yet (use --split-mode layer)",
        ));
    }
    match hp.arch {
        Arch::Llama | Arch::Mistral3 | Arch::Qwen2 => Ok(AttnOptions::default()),
        Arch::Qwen3 => Ok(AttnOptions { qk_norm: true, ..AttnOptions::default() }),
        other => Err(model_err(format!(
            "row split does not support {other:?} models yet (use --split-mode layer)"
        ))),
    }
}

/// Splits `total` into `weights.len()` contiguous ranges proportional to `weights`, with the inner
/// boundaries on multiples of `unit` (the last range ends at `total`); every range is non-empty.
fn split_units(total: u64, unit: u64, weights: &[f64], what: &str) -> Result<Vec<Range<u64>>> {
    split_balanced(total, unit, weights, &vec![0.0; weights.len()], what)
}

/// Like [`split_units`], but device `i` already carries the cost `fixed[i]` (in elements of the
/// split, e.g. feed-forward channels' worth of work): the ranges are chosen so that fixed cost plus
/// range length is proportional to `weights`, as near as whole units allow.
fn split_balanced(
    total: u64,
    unit: u64,
    weights: &[f64],
    fixed: &[f64],
    what: &str,
) -> Result<Vec<Range<u64>>> {
    if unit == 0 {
        return Err(model_err(format!("{what}: unit 0")));
    }
    let units = total.div_ceil(unit);
    let sum: f64 = weights.iter().sum();
    let all = fixed.iter().sum::<f64>() + total as f64;
    let mut out = Vec::with_capacity(weights.len());
    let (mut acc, mut acc_fixed, mut start) = (0.0, 0.0, 0u64);
    for (i, (w, f)) in weights.iter().zip(fixed).enumerate() {
        acc += w;
        acc_fixed += f;
        // The boundary nearest the balanced share (measured in elements: the last unit may be short).
        let share = ((acc / sum) * all - acc_fixed) / unit as f64;
        let left = (weights.len() - 1 - i) as u64;
        let end = if i + 1 == weights.len() { units } else { share.round().max(0.0) as u64 };
        // Fixed costs may push a share below one unit: every device still gets one when there are
        // enough (it holds heads, so it needs the layer's other half too).
        let end = if fixed.iter().any(|&f| f != 0.0) { end.max(start + 1) } else { end };
        let end = end.clamp(start, units.saturating_sub(left).max(start));
        if end == start {
            return Err(model_err(format!(
                "{what}: {units} unit(s) of {unit} cannot give each of {} devices a share (use fewer workers \
                 or --split-mode layer)",
                weights.len()
            )));
        }
        out.push(start * unit..(end * unit).min(total));
        start = end;
    }
    Ok(out)
}

/// Each device's attention work in feed-forward channels' worth (a channel is three rows of
/// `n_embd`: gate, up and down), for the feed-forward split to even out. A query head costs its Q
/// rows and `attn_output` columns plus its attention core, reckoned as `2 * head_dim_k` rows (about
/// what a head's scores and weighted sum cost per token in a 512-token prompt); a KV head its K
/// and V rows. The cut of 9 heads into 5 + 4 thus gives the first device fewer channels.
fn attention_cost(hp: &HParams, q: &[Range<u64>], group_size: u64) -> Vec<f64> {
    let (dk, dv) = (hp.head_dim_k as f64, hp.head_dim_v as f64);
    let gs = group_size.max(1);
    q.iter()
        .map(|r| {
            let n_q = (r.end - r.start) as f64;
            let n_kv = (r.end.div_ceil(gs) - r.start / gs) as f64;
            (n_q * (dk + dv + 2.0 * dk) + n_kv * (dk + dv)) / 3.0
        })
        .collect()
}

/// Block size of weight `name` (1 when absent).
fn blck(src: &dyn WeightSource, name: &str) -> u64 {
    src.tensor(name).map_or(1, |w| w.dtype.blck_size() as u64)
}

/// Splits `hp`'s model across devices with the given relative `weights` (all positive).
pub fn plan_shards(hp: &HParams, src: &dyn WeightSource, weights: &[f64]) -> Result<Vec<ShardSpec>> {
    attn_options(hp)?;
    if weights.is_empty() || weights.iter().any(|w| !w.is_finite() || *w <= 0.0) {
        return Err(model_err("row split needs a positive weight per device"));
    }
    if hp.n_head_kv == 0 || !hp.n_head.is_multiple_of(hp.n_head_kv) {
        return Err(model_err(format!("{} query heads over {} KV heads", hp.n_head, hp.n_head_kv)));
    }
    let rep = hp.n_head / hp.n_head_kv;
    // Input columns of attn_output and ffn_down are sliced: boundaries on whole blocks.
    let (mut wo_blck, mut down_blck) = (1, 1);
    for il in 0..hp.n_layer {
        wo_blck = wo_blck.max(blck(src, &format!("blk.{il}.attn_output.weight")));
        down_blck = down_blck.max(blck(src, &format!("blk.{il}.ffn_down.weight")));
    }
    // The fewest query heads whose attn_output columns fill whole blocks.
    let dv = hp.head_dim_v.max(1);
    let head_unit = wo_blck / gcd(wo_blck, dv);
    let q = split_units(hp.n_head, head_unit, weights, "query heads")?;
    let ff =
        split_balanced(hp.n_ff, down_blck, weights, &attention_cost(hp, &q, rep), "feed-forward channels")?;
    let vocab = split_units(hp.n_vocab, 1, weights, "vocabulary")?;
    Ok(q.into_iter()
        .zip(ff)
        .zip(vocab)
        .enumerate()
        .map(|(i, ((q_heads, ff), vocab))| ShardSpec { q_heads, group_size: rep, ff, vocab, first: i == 0 })
        .collect())
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The hyper-parameters of a shard: the model narrowed to its heads, channels and vocabulary.
pub fn shard_hparams(hp: &HParams, s: &ShardSpec) -> HParams {
    HParams {
        n_head: s.q_heads.end - s.q_heads.start,
        n_head_kv: s.kv_heads().end - s.kv_heads().start,
        n_ff: s.ff.end - s.ff.start,
        n_vocab: s.vocab.end - s.vocab.start,
        ..hp.clone()
    }
}

/// An owned weight slice.
struct Owned {
    dtype: GgmlType,
    ne: [u64; MAX_DIMS],
    data: Vec<u8>,
}

fn check_2d(name: &str, w: &WeightView<'_>) -> Result<u64> {
    if w.ne[2] != 1 || w.ne[3] != 1 {
        return Err(model_err(format!("{name}: row split needs a matrix, got {:?}", w.ne)));
    }
    w.dtype.row_size(w.ne[0]).ok_or_else(|| model_err(format!("{name}: bad row")))
}

/// Elements `r` of a vector (a bias).
fn slice_elems(name: &str, w: &WeightView<'_>, r: &Range<u64>) -> Result<Owned> {
    if w.ne[1..].iter().any(|&n| n != 1) || w.dtype.blck_size() != 1 || r.end > w.ne[0] {
        return Err(model_err(format!("{name}: elements {r:?} of a {} {:?}", w.dtype, w.ne)));
    }
    let ts = w.dtype.type_size() as u64;
    let data = w.data[(r.start * ts) as usize..(r.end * ts) as usize].to_vec();
    Ok(Owned { dtype: w.dtype, ne: [r.end - r.start, 1, 1, 1], data })
}

/// Rows `r` of a matrix.
fn slice_rows(name: &str, w: &WeightView<'_>, r: &Range<u64>) -> Result<Owned> {
    let row = check_2d(name, w)?;
    if r.end > w.ne[1] {
        return Err(model_err(format!("{name}: rows {r:?} of {}", w.ne[1])));
    }
    let data = w.data[(r.start * row) as usize..(r.end * row) as usize].to_vec();
    Ok(Owned { dtype: w.dtype, ne: [w.ne[0], r.end - r.start, 1, 1], data })
}

/// Input columns `c` of a matrix (on block boundaries).
fn slice_cols(name: &str, w: &WeightView<'_>, c: &Range<u64>) -> Result<Owned> {
    let row = check_2d(name, w)?;
    let bad = || model_err(format!("{name}: columns {c:?} of {} are not on {} blocks", w.ne[0], w.dtype));
    if c.end > w.ne[0] {
        return Err(bad());
    }
    let b0 = w.dtype.row_size(c.start).ok_or_else(bad)?;
    let b1 = w.dtype.row_size(c.end).ok_or_else(bad)?;
    let mut data = Vec::with_capacity(((b1 - b0) * w.ne[1]) as usize);
    for i in 0..w.ne[1] {
        let base = i * row;
        data.extend_from_slice(&w.data[(base + b0) as usize..(base + b1) as usize]);
    }
    Ok(Owned { dtype: w.dtype, ne: [c.end - c.start, w.ne[1], 1, 1], data })
}

/// The weights of one shard: sliced copies of the split matrices, everything else passed through
/// from the model; `attn_output.bias` only on the first shard.
pub struct ShardSource {
    base: Arc<dyn WeightSource>,
    owned: HashMap<String, Owned>,
    hidden: Vec<String>,
}

impl ShardSource {
    /// Slices `base` for shard `s` of `hp`'s model.
    pub fn new(base: Arc<dyn WeightSource>, hp: &HParams, s: &ShardSpec) -> Result<ShardSource> {
        let (d, dv) = (hp.head_dim_k, hp.head_dim_v);
        let (q, g) = (&s.q_heads, &s.kv_heads());
        let q_rows = q.start * d..q.end * d;
        let k_rows = g.start * d..g.end * d;
        let v_rows = g.start * dv..g.end * dv;
        let o_cols = q.start * dv..q.end * dv;
        let mut owned = HashMap::new();
        let mut hidden = Vec::new();
        let mut put = |name: String, f: &dyn Fn(&str, &WeightView<'_>) -> Result<Owned>| -> Result<()> {
            if let Some(w) = base.tensor(&name) {
                let o = f(&name, &w)?;
                owned.insert(name, o);
            }
            Ok(())
        };
        for il in 0..hp.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}");
            for (w, r) in [("attn_q", &q_rows), ("attn_k", &k_rows), ("attn_v", &v_rows)] {
                put(n(&format!("{w}.weight")), &|nm, w| slice_rows(nm, w, r))?;
                put(n(&format!("{w}.bias")), &|nm, w| slice_elems(nm, w, r))?;
            }
            put(n("attn_output.weight"), &|nm, w| slice_cols(nm, w, &o_cols))?;
            put(n("ffn_gate.weight"), &|nm, w| slice_rows(nm, w, &s.ff))?;
            put(n("ffn_up.weight"), &|nm, w| slice_rows(nm, w, &s.ff))?;
            put(n("ffn_down.weight"), &|nm, w| slice_cols(nm, w, &s.ff))?;
            if !s.first {
                hidden.push(n("attn_output.bias"));
            }
        }
        let head = if base.tensor("output.weight").is_some() { "output.weight" } else { "token_embd.weight" };
        put(head.to_string(), &|nm, w| slice_rows(nm, w, &s.vocab))?;
        put("output.bias".to_string(), &|nm, w| slice_elems(nm, w, &s.vocab))?;
        Ok(ShardSource { base, owned, hidden })
    }
}

impl WeightSource for ShardSource {
    fn meta(&self, key: &str) -> Option<MetaValue> {
        self.base.meta(key)
    }

    fn tensor(&self, name: &str) -> Option<WeightView<'_>> {
        if self.hidden.iter().any(|h| h == name) {
            return None;
        }
        match self.owned.get(name) {
            Some(o) => Some(WeightView { dtype: o.dtype, ne: o.ne, data: &o.data }),
            None => self.base.tensor(name),
        }
    }
}

/// One phase of a shard graph: the nodes `nodes` (indices into the graph's node list) read
/// `input` and produce `output`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Node index range.
    pub nodes: Range<usize>,
    /// The residual-stream input it reads (`x` or `x_out`).
    pub input: TensorId,
    /// Its result: a partial `[E, rows]` sum, or the shard's logits `[n_vocab_shard, O]`.
    pub output: TensorId,
}

/// A shard's ubatch graph: `2 * n_layer + 1` segments (attention and FFN of each layer, then the
/// LM head) sharing the attention inputs, which are written once per ubatch.
#[derive(Clone, Debug)]
pub struct ShardGraph {
    /// The graph and its attention inputs (`tokens`, `hidden` and `out_ids` unused).
    pub built: Built,
    /// The residual stream `[E, T]`.
    pub x: TensorId,
    /// The residual stream's output rows `[E, O]` (last layer's FFN and the LM head).
    pub x_out: TensorId,
    /// The phases in execution order.
    pub segments: Vec<Segment>,
}

/// Builds the shard graph of one ubatch (`p.layers` must be the whole model). `hp` and `src` are
/// shard `spec`'s ([`shard_hparams`], [`ShardSource`]).
pub fn build_shard(
    hp: &HParams,
    src: &dyn WeightSource,
    spec: &ShardSpec,
    p: &BuildParams,
) -> Result<ShardGraph> {
    let o = attn_options(hp)?;
    if p.layers != (0..hp.n_layer) {
        return Err(model_err(format!("a shard graph covers all layers, not {:?}", p.layers)));
    }
    if p.n_tokens == 0 || p.n_outputs == 0 || p.n_outputs > p.n_tokens || p.n_kv == 0 || p.n_kv > p.kv_size {
        return Err(model_err(format!(
            "invalid ubatch: {} tokens, {} outputs, {} of {} kv cells",
            p.n_tokens, p.n_outputs, p.n_kv, p.kv_size
        )));
    }
    let groups = spec.head_groups();
    let mut b = Ctx::new(hp, src, p)?;
    let e = hp.n_embd;
    b.attention_inputs()?;
    let x = b.g.input("x", GgmlType::F32, [e, p.n_tokens, 1, 1])?;
    let x_out = b.g.input("x_out", GgmlType::F32, [e, p.n_outputs, 1, 1])?;
    let mut segments = Vec::new();
    let mut seg = |b: &mut Ctx<'_>, input: TensorId, f: &mut dyn FnMut(&mut Ctx<'_>) -> Result<TensorId>| {
        let start = b.g.nodes().len();
        let output = f(b)?;
        b.g.expand(output);
        let end = b.g.nodes().len();
        // The output must be the segment's last node: the arena may reuse its memory afterwards.
        if b.g.nodes().last() != Some(&output) || start == end {
            return Err(model_err("internal: a shard segment does not end with its output"));
        }
        b.g.set_output(output);
        segments.push(Segment { nodes: start..end, input, output });
        Ok(())
    };
    for il in 0..hp.n_layer {
        seg(&mut b, x, &mut |b| {
            let wn = b.lw(il, "attn_norm.weight", [e, 1, 1, 1])?;
            let cur = rms_norm_mul(b, x, wn, "attn_norm", il)?;
            attention_grouped(b, il, cur, o, groups.as_deref())
        })?;
        let inp = if il + 1 == hp.n_layer { x_out } else { x };
        seg(&mut b, inp, &mut |b| {
            let wf = b.lw(il, "ffn_norm.weight", [e, 1, 1, 1])?;
            let cur = rms_norm_mul(b, inp, wf, "ffn_norm", il)?;
            ffn_gated(b, il, cur, GluOp::Swiglu)
        })?;
    }
    seg(&mut b, x_out, &mut |b| b.output_head(x_out))?;
    let output = segments.last().map(|s| s.output).ok_or_else(|| model_err("internal: no segments"))?;
    let built = Built { graph: b.g, inputs: b.inputs, output, params: p.clone() };
    Ok(ShardGraph { built, x, x_out, segments })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proportional_units() {
        assert_eq!(split_units(3, 1, &[1.0, 1.0], "h").unwrap(), vec![0..2, 2..3]);
        assert_eq!(split_units(1536, 32, &[1.0, 1.0], "f").unwrap(), vec![0..768, 768..1536]);
        assert_eq!(split_units(1536, 256, &[3.0, 1.0], "f").unwrap(), vec![0..1280, 1280..1536]);
        assert!(split_units(3, 1, &[1.0, 1.0, 1.0, 1.0], "h").is_err());
        assert_eq!(split_units(100, 32, &[1.0], "f").unwrap(), vec![0..100]);
        // Nine heads in units of four (K-quant attn_output, 64-wide heads): 4 + 5, not 8 + 1.
        assert_eq!(split_units(9, 4, &[1.0, 1.0], "h").unwrap(), vec![0..4, 4..9]);
        assert_eq!(split_units(9, 1, &[1.0, 1.0], "h").unwrap(), vec![0..5, 5..9]);
    }

    #[test]
    fn feed_forward_evens_out_the_attention() {
        // SmolLM2-135M: 9 query heads of 64 over 3 KV heads, n_embd 576, n_ff 1536 in Q4_1 blocks.
        let mut m = crate::model::weights::MemWeights::new();
        m.set_meta("general.architecture", MetaValue::Str("llama".into()));
        for (k, v) in [("embedding_length", 576), ("block_count", 30), ("feed_forward_length", 1536)]
            .into_iter()
            .chain([("attention.head_count", 9), ("attention.head_count_kv", 3), ("vocab_size", 49152)])
        {
            m.set_meta(&format!("llama.{k}"), MetaValue::Int(v));
        }
        m.set_meta("llama.attention.layer_norm_rms_epsilon", MetaValue::Float(1e-5));
        let hp = HParams::from_source(&m).unwrap();
        let cost = attention_cost(&hp, &[0..5, 5..9], 3);
        // 5 heads x (Q 64 + O 64 + core 128) + 2 KV heads x (K 64 + V 64) = 1536 rows = 512 channels;
        // 4 x 256 + 2 x 128 = 1280 rows.
        assert_eq!(cost, vec![512.0, 1280.0 / 3.0]);
        // Balanced: 725.3 channels for the first, rounded to whole blocks of 32 -> 736 (not 768).
        let ff = split_balanced(1536, 32, &[1.0, 1.0], &cost, "f").unwrap();
        assert_eq!(ff, vec![0..736, 736..1536]);
        // Even heads: an even split stays even.
        let even = attention_cost(&hp, &[0..3, 3..6, 6..9], 3);
        assert_eq!(
            split_balanced(1536, 32, &[1.0; 3], &even, "f").unwrap(),
            vec![0..512, 512..1024, 1024..1536]
        );
        // A fixed cost larger than a device's share still leaves it one unit, and the rest ends at total.
        let ff = split_balanced(100, 10, &[1.0, 1.0], &[500.0, 0.0], "f").unwrap();
        assert_eq!(ff, vec![0..10, 10..100]);
        assert!(split_balanced(10, 10, &[1.0, 1.0], &[5.0, 0.0], "f").is_err(), "one unit for two devices");
    }

    #[test]
    fn column_and_row_slices_of_a_q8_0_matrix() {
        // Q8_0: blocks of 32 elements, 34 bytes (f16 scale + 32 i8). A 64 x 3 matrix; each block's
        // bytes are filled with its (row, block) index, so a slice shows which blocks it took.
        let (ne0, ne1) = (64u64, 3u64);
        let mut data = Vec::new();
        for r in 0..ne1 {
            for b in 0..2 {
                data.extend(std::iter::repeat_n((r * 2 + b) as u8, 34));
            }
        }
        let w = WeightView { dtype: GgmlType::Q8_0, ne: [ne0, ne1, 1, 1], data: &data };
        let c = slice_cols("w", &w, &(32..64)).unwrap();
        assert_eq!(c.ne, [32, 3, 1, 1]);
        let tags: Vec<u8> = c.data.chunks(34).map(|b| b[0]).collect();
        assert_eq!(tags, vec![1, 3, 5]);
        assert!(slice_cols("w", &w, &(16..64)).is_err(), "not on a block boundary");
        let r = slice_rows("w", &w, &(1..3)).unwrap();
        assert_eq!(r.ne, [64, 2, 1, 1]);
        let tags: Vec<u8> = r.data.chunks(34).map(|b| b[0]).collect();
        assert_eq!(tags, vec![2, 3, 4, 5]);
    }

    #[test]
    fn nine_query_heads_over_three_kv_heads() {
        let spec = |q: std::ops::Range<u64>| ShardSpec {
            q_heads: q,
            group_size: 3,
            ff: 0..1,
            vocab: 0..1,
            first: false,
        };
        let g = |kv, q0, n| HeadGroup { kv, q0, n };
        // 5:4: KV head 1 is on both, with two query heads here and one there.
        assert_eq!(spec(0..5).head_groups(), Some(vec![g(0, 0, 3), g(1, 3, 2)]));
        assert_eq!(spec(5..9).head_groups(), Some(vec![g(0, 0, 1), g(1, 1, 3)]));
        assert_eq!(spec(0..5).kv_heads(), 0..2);
        assert_eq!(spec(5..9).kv_heads(), 1..3);
        // Whole groups: the broadcast form.
        assert_eq!(spec(3..9).head_groups(), None);
        // Inside one group.
        assert_eq!(spec(4..5).head_groups(), Some(vec![g(0, 0, 1)]));
    }
}
