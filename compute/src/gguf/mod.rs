//! GGUF: the model file format — a header, typed metadata and aligned tensor blobs.
//!
//! ref: ggml-compute-semantics.md §5 (layout) and §5.1 (metadata keys). [`Gguf`] reads v2 and v3
//! files (memory-mapped or in memory) and validates them strictly; [`GgufWriter`] writes them.

mod reader;
mod value;
mod writer;

pub use reader::{Gguf, TensorInfo, TensorRef};
pub use value::{Array, Value, ValueType};
pub use writer::{tensor_size, GgufWriter};

/// The four magic bytes every GGUF file starts with.
pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// Alignment of the data section and of each tensor blob when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// The key that overrides the alignment.
pub const KEY_ALIGNMENT: &str = "general.alignment";

/// `GGML_MAX_NAME`: tensor names are at most this many bytes minus one.
pub const MAX_NAME_LEN: usize = 64;
