//! `cachestore`: a content-addressed object store (BLAKE3) with a redb index.
//!
//! It knows nothing of tensors or ggml: bytes go in, a `Digest` comes out.
#![warn(missing_docs)]
