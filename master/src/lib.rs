//! The RPC master engine (`llamad-master`), shared by `llamactl run`/`bench` and llamad's job runner:
//! a forward pass that turns tokens into next-token logits, either in-process
//! ([`compute::model::Session`]) or split across RPC workers ([`pipeline`], [`tensor_parallel`]).
//! It does blocking socket I/O on the caller's thread and knows nothing of HTTP or async runtimes.
//!
//! * [`auto_split`] — split mode `auto`: round trips measured at connect time pick `layer` or `row`.
//! * [`split`] — llama.cpp's layer assignment (ref: ggml-rpc-protocol.md §11.3).
//! * [`export`] — abstract graph → GRAPH_COMPUTE blob (ref §4.3, §8.2).
//! * [`remote`] — one worker: probe, buffers, weight upload, per-ubatch execution.
//! * [`upload`] — the weight upload itself: small weights of a layer coalesced into one write, wire
//!   hashes on helper threads or from the [`hash_memo`], SET_TENSOR_HASH pipelined (ref §9, §3.4).
//! * [`hash_memo`] — a persistent memo of a model file's wire hashes, keyed by the file's identity.
//! * [`pipeline`] — the master: embedding (and leading layers) here, layer ranges on workers,
//!   hidden states handed from one to the next through this process.
//! * [`tensor_parallel`] — split mode `row`: every layer split across the workers, the residual
//!   stream kept here.
//! * [`generate`] — the sampling loop over any [`Forward`].
//! * [`error`] — [`Error`], with the context chain of what failed.

pub mod auto_split;
pub mod error;
pub mod export;
pub mod generate;
pub mod hash_memo;
pub mod pipeline;
pub mod remote;
pub mod split;
pub mod tensor_parallel;
pub mod upload;

use compute::model::{Model, Session, SessionConfig};
pub use error::{Error, Result};

/// How the model is spread over the workers (llama.cpp's `--split-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum SplitMode {
    /// Whole layers per worker, run in turn (llama.cpp's default; token-identical to llama.cpp).
    #[default]
    Layer,
    /// Every layer split across the workers, which run each phase together (tensor parallelism).
    Row,
    /// `row` or `layer`, whichever the round trips measured at connect time make faster for the
    /// model ([`auto_split`]).
    Auto,
}

impl SplitMode {
    /// `layer`, `row` or `auto` (the command-line and configuration spelling).
    pub fn name(self) -> &'static str {
        match self {
            SplitMode::Layer => "layer",
            SplitMode::Row => "row",
            SplitMode::Auto => "auto",
        }
    }
}

/// Connects to the workers `addrs` and loads `model` on them in `mode` (for callers that only need
/// a [`Forward`], such as `llamactl bench`).
pub fn open_workers(
    model: &Model,
    cfg: SessionConfig,
    addrs: &[String],
    opts: &pipeline::SplitOptions,
    mode: SplitMode,
    on_load: &(dyn Fn(usize, pipeline::LoadEvent<'_>) + Sync),
) -> Result<Box<dyn Forward>> {
    let mode = match mode {
        SplitMode::Auto => auto_split::choose(addrs, opts, model.hp.n_layer, model.weight_bytes())?.mode,
        m => m,
    };
    Ok(match mode {
        SplitMode::Auto | SplitMode::Layer => {
            Box::new(pipeline::Pipeline::new(model, cfg, addrs, opts, on_load)?)
        }
        SplitMode::Row => Box::new(tensor_parallel::TensorParallel::new(model, cfg, addrs, opts, on_load)?),
    })
}

/// Applies `timeout` (see [`pipeline::SplitOptions::io_timeout`]) to the sockets of `workers`: a read
/// or write that waits longer fails with `WouldBlock`/`TimedOut` (see [`Error::is_timeout`]).
pub(crate) fn set_io_timeout<'w>(
    workers: impl Iterator<Item = &'w mut remote::Worker>,
    timeout: Option<std::time::Duration>,
) -> Result<()> {
    for w in workers {
        let sock = w.client.socket();
        sock.set_read_timeout(timeout)
            .and_then(|()| sock.set_write_timeout(timeout))
            .map_err(|e| Error::from(e).context(format!("worker {}: setting the I/O timeout", w.addr)))?;
    }
    Ok(())
}

/// The checks every remote [`Forward::decode`] makes before it sends anything: some tokens, each
/// inside the vocabulary, and room for them in the context.
pub(crate) fn check_decode(tokens: &[u32], n_vocab: u64, n_past: u64, n_ctx: u64) -> Result<()> {
    if tokens.is_empty() {
        return Err(error::err!("decode of zero tokens"));
    }
    if let Some(&bad) = tokens.iter().find(|&&t| u64::from(t) >= n_vocab) {
        return Err(error::err!("token {bad} out of range (vocabulary of {n_vocab})"));
    }
    if n_past + tokens.len() as u64 > n_ctx {
        return Err(error::err!("context full: {n_past} + {} tokens exceed n_ctx {n_ctx}", tokens.len()));
    }
    Ok(())
}

/// Tokens in, logits of the last token out; positions continue from the previous call.
pub trait Forward {
    /// Feeds `tokens` and returns the last token's logits (borrowed: no copy per token).
    fn decode(&mut self, tokens: &[u32]) -> Result<&[f32]>;
    /// Tokens decoded so far.
    fn n_past(&self) -> u64;
    /// Forgets the sequence: positions restart at 0 (`llamactl bench` between repetitions).
    fn clear(&mut self) -> Result<()>;
    /// Extra lines for the timing summary (per-worker figures).
    fn summary(&self) -> Vec<String> {
        Vec::new()
    }
}

impl Forward for Session {
    fn decode(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        Ok(Session::decode(self, tokens)?)
    }

    fn n_past(&self) -> u64 {
        Session::n_past(self)
    }

    fn clear(&mut self) -> Result<()> {
        Session::clear(self);
        Ok(())
    }
}
