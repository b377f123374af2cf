//! Several sequences in one KV cache, decoded together: the engine of a server's parallel slots.
//!
//! The cache holds `n_slots · slot_ctx` cells, interleaved by position: the token at position `p`
//! of slot `s` lives in cell `p · n_slots + s`. One ubatch carries chunks of several slots (a
//! prompt chunk of one, a generated token of each of the others): every token has its own
//! position, writes its own cell, and its mask row shows only its own slot's cells up to its
//! position (ref: ggml-compute-semantics.md §4.2, the unified cache with several sequences). The
//! cells attended (`Nkv`) reach only as far as the longest sequence times the slot count, as in
//! llama.cpp's unified cache, rather than to the last slot's region.
//!
//! With flash attention the result is the sequence's own, bit for bit: masked cells are skipped,
//! and a sequence's visible cells come in the order of its positions, as alone. Without it, the
//! KQ and KQV products see the visible values at other lanes and the logits may differ in the last
//! bits (see `compute/tests/model_batch.rs`).
//!
//! A slot is reused by restarting its positions at 0 ([`BatchSession::clear_slot`]): the stale
//! cells of the previous sequence are written before they are ever unmasked.

use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::model::arch::{Built, InputSink};
use crate::model::graph_def::TensorId;
use crate::model::hparams::HParams;
use crate::model::local::{write_float, write_i32, write_i64, LocalBackend};
use crate::model::session::{check_kv_pad, n_kv_for, Model, SessionConfig};

/// One slot's tokens in a ubatch.
#[derive(Clone, Copy, Debug)]
pub struct SeqChunk<'a> {
    /// The slot (`0..n_slots`).
    pub slot: usize,
    /// Its next tokens.
    pub tokens: &'a [u32],
}

/// Sequences decoded together in one KV cache.
pub struct BatchSession {
    model: Model,
    cfg: SessionConfig,
    slot_ctx: u64,
    backend: LocalBackend,
    n_past: Vec<u64>,
    logits: Vec<f32>,
}

impl BatchSession {
    /// `n_slots` slots of `cfg.n_ctx` cells each.
    pub fn new(model: Model, cfg: SessionConfig, n_slots: usize) -> Result<BatchSession> {
        if cfg.n_ctx == 0 || cfg.n_ubatch == 0 || n_slots == 0 {
            return Err(Error::Model("n_ctx, n_ubatch and the slot count must be positive".into()));
        }
        check_kv_pad(cfg.kv_pad)?;
        let slot_ctx = cfg.n_ctx;
        let backend = LocalBackend::new(model.src.clone(), model.hp.clone(), cfg.n_threads)?;
        Ok(BatchSession { model, cfg, slot_ctx, backend, n_past: vec![0; n_slots], logits: Vec::new() })
    }

    /// Slots.
    pub fn n_slots(&self) -> usize {
        self.n_past.len()
    }

    /// Cells per slot (the longest sequence a slot holds).
    pub fn slot_ctx(&self) -> u64 {
        self.slot_ctx
    }

    /// Tokens in `slot`'s part of the cache.
    pub fn n_past(&self, slot: usize) -> u64 {
        self.n_past.get(slot).copied().unwrap_or(0)
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The backend (graph statistics).
    pub fn backend(&self) -> &LocalBackend {
        &self.backend
    }

    /// Forgets `slot`'s sequence (its positions restart at 0).
    pub fn clear_slot(&mut self, slot: usize) {
        if let Some(n) = self.n_past.get_mut(slot) {
            *n = 0;
        }
    }

    /// Decodes `chunks` (distinct slots, at most `n_ubatch` tokens in all) as one ubatch, after the
    /// tokens each slot already holds, and returns the logits of each chunk's last token
    /// (`chunks.len()` rows of `n_vocab`, in chunk order).
    pub fn decode(&mut self, chunks: &[SeqChunk<'_>]) -> Result<&[f32]> {
        check_chunks(chunks, &self.n_past, self.slot_ctx, self.cfg.n_ubatch, self.model.hp.n_vocab)?;
        let hp = &self.model.hp;
        let ub = BatchUbatch::new(chunks, &self.n_past);
        let p =
            crate::model::BuildParams { layers: 0..hp.n_layer, ..ub.params(hp, &self.cfg, self.slot_ctx) };
        let output = self.backend.run(&p, |built, w| ub.fill(hp, built, w))?.output;
        let bytes = self.backend.tensor_bytes(output)?;
        self.logits.clear();
        self.logits.extend(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
        ub.advance(&mut self.n_past);
        Ok(&self.logits)
    }
}

/// The checks of a multi-sequence decode: some chunks, of distinct slots in range, each of some
/// tokens inside the vocabulary and with room in its slot, at most `n_ubatch` tokens in all.
/// `n_past` holds each slot's cached tokens.
pub fn check_chunks(
    chunks: &[SeqChunk<'_>],
    n_past: &[u64],
    slot_ctx: u64,
    n_ubatch: u64,
    n_vocab: u64,
) -> Result<()> {
    if chunks.is_empty() {
        return Err(Error::Model("decode of zero sequences".into()));
    }
    let mut seen = vec![false; n_past.len()];
    let mut total = 0u64;
    for c in chunks {
        let Some(s) = seen.get_mut(c.slot) else {
            return Err(Error::Model(format!("slot {} out of range ({} slots)", c.slot, n_past.len())));
        };
        if std::mem::replace(s, true) {
            return Err(Error::Model(format!("slot {} twice in one ubatch", c.slot)));
        }
        if c.tokens.is_empty() {
            return Err(Error::Model(format!("slot {}: a chunk of zero tokens", c.slot)));
        }
        if let Some(&bad) = c.tokens.iter().find(|&&t| u64::from(t) >= n_vocab) {
            return Err(Error::Model(format!("token {bad} out of range (vocabulary of {n_vocab})")));
        }
        if n_past[c.slot] + c.tokens.len() as u64 > slot_ctx {
            return Err(Error::Model(format!(
                "slot {} full: {} + {} tokens exceed its {} cells",
                c.slot,
                n_past[c.slot],
                c.tokens.len(),
                slot_ctx
            )));
        }
        total += c.tokens.len() as u64;
    }
    if total > n_ubatch {
        return Err(Error::Model(format!("{total} tokens exceed n_ubatch {n_ubatch}")));
    }
    Ok(())
}

/// One multi-sequence ubatch (or a contiguous part of one): its tokens with their slots and
/// positions, and which of them give logits. The one construction of such a ubatch, for the
/// in-process [`BatchSession`] and for the master's worker pipeline alike.
#[derive(Clone, Debug)]
pub struct BatchUbatch {
    /// The slots of the cache (cells are interleaved by them).
    pub n_slots: u64,
    rows: Vec<Row>,
    /// Indices into `rows` of the tokens whose logits are wanted, ascending.
    outs: Vec<u64>,
}

impl BatchUbatch {
    /// `chunks` after the tokens each slot holds (`n_past`): every chunk's last token gives logits.
    pub fn new(chunks: &[SeqChunk<'_>], n_past: &[u64]) -> BatchUbatch {
        let rows: Vec<Row> = chunks
            .iter()
            .flat_map(|c| {
                let (slot, past) = (c.slot as u64, n_past[c.slot]);
                c.tokens.iter().enumerate().map(move |(i, &t)| Row { token: t, slot, pos: past + i as u64 })
            })
            .collect();
        let mut outs = Vec::with_capacity(chunks.len());
        let mut at = 0u64;
        for c in chunks {
            at += c.tokens.len() as u64;
            outs.push(at - 1);
        }
        BatchUbatch { n_slots: n_past.len() as u64, rows, outs }
    }

    /// Tokens.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// No tokens.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Rows of logits this ubatch gives.
    pub fn n_outputs(&self) -> usize {
        self.outs.len()
    }

    /// The tokens, in ubatch order.
    pub fn tokens(&self) -> impl Iterator<Item = u32> + '_ {
        self.rows.iter().map(|r| r.token)
    }

    /// The tokens `range` as a ubatch of their own (a micro-batch), with the outputs among them;
    /// one without any gives its last token's logits, which the caller drops. Also returns how
    /// many of its output rows are real (the first ones).
    pub fn part(&self, range: std::ops::Range<usize>) -> (BatchUbatch, usize) {
        let (a, b) = (range.start as u64, range.end as u64);
        let mut outs: Vec<u64> = self.outs.iter().filter(|&&o| o >= a && o < b).map(|&o| o - a).collect();
        let real = outs.len();
        if outs.is_empty() && b > a {
            outs.push(b - a - 1);
        }
        (BatchUbatch { n_slots: self.n_slots, rows: self.rows[range].to_vec(), outs }, real)
    }

    /// The graph shape over the whole model for a cache of `slot_ctx` cells per slot: the cells
    /// attended reach the highest cell any token writes.
    pub fn params(&self, hp: &HParams, cfg: &SessionConfig, slot_ctx: u64) -> crate::model::BuildParams {
        let kv_size = slot_ctx * self.n_slots;
        let used = self.rows.iter().map(|r| r.cell(self.n_slots) + 1).max().unwrap_or(1);
        crate::model::BuildParams {
            n_tokens: self.rows.len() as u64,
            n_outputs: self.outs.len() as u64,
            n_kv: n_kv_for(used, kv_size, cfg.kv_pad),
            kv_size,
            kv_type: cfg.kv_type,
            flash_attn: cfg.flash_attn,
            layers: 0..hp.n_layer,
        }
    }

    /// Writes the graph inputs (see [`fill_batch_inputs`]).
    pub fn fill(&self, hp: &HParams, built: &Built, w: &mut dyn InputSink) -> Result<()> {
        fill_batch_inputs(hp, built, self.n_slots, &self.rows, &self.outs, w)
    }

    /// Moves each slot's `n_past` past its tokens here.
    pub fn advance(&self, n_past: &mut [u64]) {
        for r in &self.rows {
            if let Some(n) = n_past.get_mut(r.slot as usize) {
                *n = (*n).max(r.pos + 1);
            }
        }
    }
}

/// One token of a multi-sequence ubatch: its slot and position.
#[derive(Clone, Copy, Debug)]
struct Row {
    token: u32,
    slot: u64,
    pos: u64,
}

impl Row {
    fn cell(&self, n_slots: u64) -> u64 {
        self.pos * n_slots + self.slot
    }
}

/// Writes the inputs of a multi-sequence ubatch: each token's position, its cell
/// `pos · n_slots + slot`, a mask row showing its own slot's cells of positions `..= pos` only
/// (and, for sliding-window layers, only the last `n_swa` positions), `out_ids` = `outs`.
fn fill_batch_inputs(
    hp: &HParams,
    built: &Built,
    n_slots: u64,
    rows: &[Row],
    outs: &[u64],
    w: &mut dyn InputSink,
) -> Result<()> {
    let p = &built.params;
    if rows.len() as u64 != p.n_tokens || outs.len() as u64 != p.n_outputs {
        return Err(Error::Model(format!("{} tokens for a graph of {}", rows.len(), p.n_tokens)));
    }
    let (n_kv, kv_size, fa, n_swa, nv_rows) = (p.n_kv, p.kv_size, p.flash_attn, hp.n_swa, hp.n_embd_v_gqa());
    let ins = &built.inputs;
    let need =
        |x: Option<TensorId>, what: &str| x.ok_or_else(|| Error::Model(format!("graph has no {what} input")));
    if let Some(id) = ins.tokens {
        write_i32(w.bytes(id)?, rows.iter().map(|r| r.token as i32));
    }
    write_i32(w.bytes(need(ins.pos, "position")?)?, rows.iter().map(|r| r.pos as i32));
    write_i64(w.bytes(need(ins.k_idxs, "k index")?)?, rows.iter().map(|r| r.cell(n_slots) as i64));
    let v_idxs = w.bytes(need(ins.v_idxs, "v index")?)?;
    if fa {
        write_i64(v_idxs, rows.iter().map(|r| r.cell(n_slots) as i64));
    } else {
        // Transposed V cache: element (channel c, cell) at c*kv_size + cell (ref §4.2).
        write_i64(
            v_idxs,
            rows.iter().flat_map(|r| (0..nv_rows).map(move |c| (c * kv_size + r.cell(n_slots)) as i64)),
        );
    }
    if let Some(id) = ins.out_ids {
        write_i32(w.bytes(id)?, outs.iter().map(|&i| i as i32));
    }
    if let Some(id) = ins.attn_scale {
        write_float(w.bytes(id)?, GgmlType::F32, rows.iter().map(|r| hp.attn_temperature(r.pos)))?;
    }
    let mask_type = if fa { GgmlType::F16 } else { GgmlType::F32 };
    let masks = |swa: bool| {
        rows.iter().flat_map(move |r| {
            (0..n_kv).map(move |cell| {
                let (pos, slot) = (cell / n_slots, cell % n_slots);
                let visible = slot == r.slot && pos <= r.pos && !(swa && r.pos - pos >= n_swa);
                if visible {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
    };
    write_float(w.bytes(need(ins.kq_mask, "mask")?)?, mask_type, masks(false))?;
    if let Some(m) = ins.kq_mask_swa {
        write_float(w.bytes(m)?, mask_type, masks(true))?;
    }
    Ok(())
}

/// Batch sessions move to a server's engine thread.
const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<BatchSession>();
};
