//! Admin API tests, one binary: authentication and token secrecy, the OpenAPI description against the
//! route table, cache routes on a real `cachestore::Store`, workers against an in-process RPC server,
//! jobs on a tiny GGUF model (SSE, cancel, persistence), and `/metrics`.

mod auth;
mod cache;
mod common;
mod jobs;
mod openapi;
mod workers;
