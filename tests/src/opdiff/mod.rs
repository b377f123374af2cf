//! Differential op tests (issue 3): single-op graphs of every op and type `compute` supports, with
//! contiguous, permuted, transposed, broadcast and view inputs, sent over `llamad_proto::RpcClient`
//! to llamad and to llama.cpp's own RPC server, results compared within each case's bounds.
//!
//! - [`graph`]: tensors as a master describes them (`rpc_tensor`), views, the node under test;
//! - [`data`]: seeded inputs of every type (compute's quantizers for quantized weights);
//! - [`cases`]: the case builders, one module per op family, each case with its [`compare::Bound`];
//! - [`crate::server`]: the two server processes (killed on drop);
//! - [`run`]: one graph on one server; [`compare`]: bit-exact / NMSE / max-abs checks.
//!
//! The driver is `tests/tests/opdiff.rs`.

pub mod cases;
pub mod compare;
pub mod data;
pub mod graph;
pub mod run;

pub use crate::{Error, Result};
