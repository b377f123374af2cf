//! Admin API tests, one binary: authentication and token secrecy, the OpenAPI description against the
//! route table, cache routes on a real `cachestore::Store`, workers against an in-process RPC server,
//! jobs on a tiny GGUF model (SSE, cancel, persistence), the open-connection table, and `/metrics`.

mod auth;
mod cache;
mod common;
mod connections;
mod jobs;
mod openapi;
mod workers;

/// The RPC tests' client helpers (tensor builders, the `a + b` graph); not every one is used here.
#[allow(dead_code)]
#[path = "../rpc/common.rs"]
mod rpc_common;
