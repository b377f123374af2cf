//! `compute`: a ggml-compatible CPU tensor backend.
//!
//! It owns everything that turns bytes and tokens into numbers: the `ggml_type` and `ggml_op` tables
//! (wire values, identical to ggml at RPC protocol 7.0.0), quantized block layouts and their kernels
//! (a scalar reference for each, plus SIMD paths chosen at run time), the ops, the graph executor
//! with its persistent thread pool, and the GGUF reader and writer.
//!
//! It knows nothing of sockets, the RPC wire format or the cache: its inputs are slices, shapes and a
//! thread count.
//!
//! ```
//! use compute::dtype::GgmlType;
//! assert_eq!(GgmlType::Q4_K.blck_size(), 256);
//! assert_eq!(GgmlType::Q4_K.type_size(), 144);
//! assert_eq!(GgmlType::Q4_0.row_size(64), Some(36));
//! ```
#![warn(missing_docs)]

pub mod coverage;
pub mod dtype;
pub mod error;
pub mod gguf;
pub mod graph;
pub mod model;
pub mod numa;
pub mod numerics;
pub mod op;
pub(crate) mod ops;
pub mod pool;
pub mod quant;
pub mod sample;
pub mod tensor;
pub mod tokenizer;

pub use dtype::GgmlType;
pub use error::{Error, Result};
pub use op::GgmlOp;
pub use tensor::Layout;
