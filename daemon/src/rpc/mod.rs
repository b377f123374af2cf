//! The RPC server: accept loop ([`server`]), one task per connection ([`conn`]), per-connection
//! command semantics ([`session`]), graph build and execution ([`exec`]), buffers ([`buffer`]) and
//! counters ([`stats`]). The wire format itself lives in `llamad-proto`.

pub mod buffer;
pub mod conn;
pub mod exec;
pub mod server;
pub mod session;
pub mod stats;
