//! `llamactl`: the command-line client of llamad workers and a Rust RPC master.
//!
//! * [`cli`] — the clap command line (`llamactl run …`; more nouns live next to it in [`cmd`]).
//! * [`cli_admin`] — the admin nouns (`status`, `workers`, `cache`, `jobs`), talking to llamad's
//!   admin API through [`client`] and printing through [`output`].
//! * [`cmd`] — one module per noun; [`cmd::run`] loads a GGUF, tokenizes, samples and streams text.
//! * [`master`] — the engine behind `run` (the `llamad-master` crate, shared with llamad's job
//!   runner): a [`master::Forward`] trait with the in-process [`compute::model::Session`] and the RPC
//!   masters [`master::pipeline::Pipeline`] (layer split: the token embedding and the first
//!   `L + 1 - ngl` layers here, the other layer ranges on llamad / `ggml-rpc-server` workers, ref:
//!   ggml-rpc-protocol.md §11) and [`master::tensor_parallel::TensorParallel`] (row split).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod cli;
pub mod cli_admin;
pub mod client;
pub mod cmd;
pub mod output;

pub use llamad_master as master;
