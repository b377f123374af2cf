//! The crate's one error type.

use crate::dtype::GgmlType;
use crate::op::GgmlOp;

/// Everything that can go wrong inside `compute`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A `ggml_type` value that is out of range or a removed slot.
    #[error("unknown ggml_type {0}")]
    UnknownType(u32),
    /// A `ggml_op` value that is out of range.
    #[error("unknown ggml_op {0}")]
    UnknownOp(u32),
    /// An op (or one of its sub-ops) this backend does not implement.
    #[error("unsupported op {op}: {detail}")]
    UnsupportedOp {
        /// The op.
        op: GgmlOp,
        /// What exactly is missing (sub-op, parameter variant).
        detail: String,
    },
    /// An op this backend implements, but not for these operand types.
    #[error("unsupported types for {op}: {detail}")]
    UnsupportedTypes {
        /// The op.
        op: GgmlOp,
        /// The operand types seen.
        detail: String,
    },
    /// A type without the kernel a caller asked for (dequantize, quantize, dot product).
    #[error("type {dtype} has no {kernel} kernel")]
    MissingKernel {
        /// The type.
        dtype: GgmlType,
        /// Which kernel.
        kernel: &'static str,
    },
    /// Operand shapes or strides that break the op's rules.
    #[error("invalid shapes for {op}: {detail}")]
    Shape {
        /// The op.
        op: GgmlOp,
        /// What is wrong.
        detail: String,
    },
    /// A layout whose size or extent overflows, or whose first dimension is not a whole number of
    /// blocks.
    #[error("invalid layout: {0}")]
    Layout(String),
    /// An index read from tensor data (row id, expert id, position) that is out of range.
    #[error("index out of range in {op}: {detail}")]
    IndexOutOfRange {
        /// The op.
        op: GgmlOp,
        /// Which index, and its bound.
        detail: String,
    },
    /// A malformed GGUF file.
    #[error("malformed gguf: {0}")]
    Gguf(String),
    /// An I/O error with the path it happened on.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Anything a model or tokenizer could not handle.
    #[error("model: {0}")]
    Model(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
