//! End-to-end test support for llamad and llamactl.
//!
//! [`opdiff`]: the differential op tests against llama.cpp's RPC server (`tests/tests/opdiff.rs`).

pub mod opdiff;
