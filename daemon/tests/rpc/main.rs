//! Integration tests: the daemon in-process on 127.0.0.1:0, spoken to with raw bytes and `RpcClient`.
//! `conformance` follows ggml-rpc-protocol.md §15, `negative` §14 and §16, `concurrency` the
//! multi-connection behaviour, `limits` access control, connection limits and timeouts, `cli` the binary,
//! `tls` TLS on the port, `v8` protocol 8.0.0's graph store and 2D transfers, `comm` its all-reduce.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod auth;
mod chaos;
mod cli;
mod comm;
mod common;
mod concurrency;
mod conformance;
mod ext;
mod faults;
mod interleave;
mod limits;
mod negative;
mod process;
mod soak;
mod tls;
mod v8;
