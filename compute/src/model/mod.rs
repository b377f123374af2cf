//! The model engine: forward graphs for the supported architectures, a local backend that runs
//! them, decoding sessions.
//!
//! Architecture (what `llamactl run` in-process and the RPC master build on):
//!
//! * [`graph_def`] — an abstract, ggml-context-like graph: tensors with ggml's exact fields
//!   (layout, op, `op_params`, flags, ten source ids, `view_src`/`view_offs`, name) plus a storage
//!   class (weight by GGUF name, graph input, KV cache of a layer, intermediate, view). It holds no
//!   memory, so the same graph can be given addresses by the [`local`] backend or serialized to
//!   `rpc_tensor`s for a remote `llamad` / `ggml-rpc-server` (ids, src ids, view_src, view_offs,
//!   and a data address the remote side assigns per storage class).
//! * [`hparams`] and [`weights`] — hyper-parameters from GGUF metadata, and the [`WeightSource`]
//!   trait behind which a GGUF mmap or an in-memory model sits.
//! * [`arch`] — per-architecture builders for one ubatch over a layer range `[first, last)`:
//!   the hidden state is the boundary tensor between ranges, so a model can be split across
//!   devices; only the last range has `out_ids`, the output norm and the LM head.
//! * [`local`] — gives every tensor memory (weights zero-copy, persistent KV buffers, one arena
//!   for inputs and intermediates with liveness-based reuse), converts to a
//!   [`crate::graph::Graph`], runs it on the executor and caches it while shapes stay the same.
//! * [`session`] — one sequence: positions, KV state, prompt in ubatches, logits of the last token.
//! * [`batch`] — several sequences in one KV cache, decoded together in shared ubatches.
//!
//! Sampling lives next door in [`crate::sample`].

pub mod arch;
pub mod batch;
pub mod gguf_source;
pub mod graph_def;
pub mod hparams;
pub mod local;
pub mod session;
pub mod shard;
pub mod synth;
pub mod weights;

pub use arch::{build, BuildParams, Built, Inputs};
pub use batch::{BatchSession, BatchUbatch, SeqChunk};
pub use graph_def::{GraphDef, KvKind, RopeParams, Storage, TensorDef, TensorId};
pub use hparams::{Arch, HParams};
pub use local::LocalBackend;
pub use session::{check_kv_pad, Model, Session, SessionConfig, KV_PAD};
pub use weights::{MemWeights, MetaValue, WeightSource, WeightView};
