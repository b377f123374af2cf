//! Differential op tests (issue 3): single-op graphs of every op and type `compute` supports, with
//! contiguous, permuted, transposed, broadcast and view inputs, sent over `llamad_proto::RpcClient`
//! to llamad and to llama.cpp's own RPC server, results compared within each case's bounds.
//!
//! - [`graph`]: tensors as a master describes them (`rpc_tensor`), views, the node under test;
//! - [`data`]: seeded inputs of every type (compute's quantizers for quantized weights);
//! - [`cases`]: the case builders, one module per op family, each case with its [`compare::Bound`];
//! - [`server`]: the two server processes (killed on drop);
//! - [`run`]: one graph on one server; [`compare`]: bit-exact / NMSE / max-abs checks.
//!
//! The driver is `tests/tests/opdiff.rs`.

pub mod cases;
pub mod compare;
pub mod data;
pub mod graph;
pub mod run;
pub mod server;

/// Errors of the differential test harness.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A case could not be built (its shapes or types are inconsistent).
    #[error("case: {0}")]
    Case(String),
    /// A server could not be started or answered badly.
    #[error("server: {0}")]
    Server(String),
    /// The RPC client failed (connection closed, bad response).
    #[error("rpc: {0}")]
    Rpc(#[from] llamad_proto::Error),
    /// Process or file IO.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// Result of the harness.
pub type Result<T> = std::result::Result<T, Error>;
