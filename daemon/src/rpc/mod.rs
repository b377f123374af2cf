//! The RPC server: accept loop ([`server`]), one task per connection ([`conn`]), per-connection
//! command semantics ([`session`]), TLS on the port ([`tls`]), graph build and execution ([`exec`]), llamad's split-mode-row extension ([`ext`]), buffers ([`buffer`]) and their interleaved weight copies ([`weight_copy`]), the cache hook
//! ([`cache`]) and counters ([`stats`]). The wire format itself lives in `llamad-proto`.

pub mod access;
pub mod auth;
pub mod buffer;
pub mod cache;
pub mod comm;
pub mod conn;
pub mod exec;
pub mod ext;
pub mod graph_cache;
pub mod limits;
pub mod link;
pub mod server;
pub mod session;
pub mod stats;
pub mod store_cache;
pub mod tls;
pub mod weight_copy;
