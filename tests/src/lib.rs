//! End-to-end test support for llamad and llamactl.
//!
//! [`opdiff`]: the differential op tests against llama.cpp's RPC server (`tests/tests/opdiff.rs`).

pub mod opdiff;
pub mod server;

/// Errors of the test harness (servers, cases, RPC).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A case could not be built (its shapes or types are inconsistent).
    #[error("case: {0}")]
    Case(String),
    /// A server could not be started or answered badly.
    #[error("server: {0}")]
    Server(String),
    /// A server exited before listening because another process held its port (try another).
    #[error("server: {0}")]
    PortTaken(String),
    /// The RPC client failed (connection closed, bad response).
    #[error("rpc: {0}")]
    Rpc(#[from] llamad_proto::Error),
    /// Process or file IO.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// Result of the test harness.
pub type Result<T> = std::result::Result<T, Error>;
