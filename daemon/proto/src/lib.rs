//! `llamad-proto`: the byte layouts of llama.cpp's RPC protocol, versions 8.0.0 and 7.0.0.
//!
//! This is the only crate that knows the wire format: one table per protocol version
//! ([`version`]: command ids, request sizes, answers, graph layout, constants), command identities
//! ([`cmd`]), the
//! 296-byte tensor descriptor ([`tensor`]), every request and response ([`msg`]), the GRAPH_COMPUTE
//! blob ([`graph`]), the FNV-1a cache key ([`hash`]), a blocking client ([`client`]) over plain TCP or TLS ([`tls`]).
//! Decoders never panic: they return [`Error::Incomplete`] or [`Error::Invalid`].
//!
//! ```
//! use llamad_proto::{hash::WireHash, msg::Command};
//! assert_eq!(WireHash::of(b"a").to_string(), "af63dc4c8601ec8c");
//! let frame = Command::DeviceCount.encode_frame();
//! assert_eq!(frame, [15, 0, 0, 0, 0, 0, 0, 0, 0]);
//! ```
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod auth;
pub mod client;
pub mod cmd;
pub mod error;
pub mod ext;
pub mod graph;
pub mod hash;
pub mod msg;
pub mod tensor;
pub mod tls;
pub mod version;
mod wire;

#[cfg(test)]
mod frames_v8;
#[cfg(test)]
mod prop_tests;

pub use client::{ConnectOptions, RpcClient};
pub use cmd::Cmd;
pub use error::{Error, Result};
pub use graph::GraphBlob;
pub use hash::WireHash;
pub use msg::{Command, Limits};
pub use tensor::RpcTensor;
pub use tls::{TlsClient, Transport};
pub use version::Protocol;
