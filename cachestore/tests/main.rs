//! The public-API tests of `cachestore`, built into one binary (`autotests = false`).

mod basic;
mod common;
mod corruption;
mod crash;
mod eviction;
mod index;
mod rebuild;
mod watch;
mod wire;
