//! Which ops of the protocol's op enum this backend computes, op by op: the coverage table of
//! ARCHITECTURE.md ("Op coverage") is this list, and `compute/tests/ops/coverage.rs` checks both
//! that the table is complete (every op of the enum classified) and that it tells the truth (every
//! op listed as computed passes the executor's dispatch, every other one is refused as unsupported).
//!
//! The reference is ggml's CPU backend at protocol 7.0.0 / 8.0.0 (same op numbering): the
//! differential tests (`tests/src/opdiff`) run each computed op against llama.cpp's RPC server.

use crate::op::GgmlOp;

/// How this backend handles one op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// Computed; the module that holds it and the SIMD kernels it has (`""`: scalar only).
    Computed {
        /// `compute::ops` module.
        module: &'static str,
        /// SIMD kernels, or `""`.
        simd: &'static str,
    },
    /// A view (no compute: NONE, RESHAPE, VIEW, PERMUTE, TRANSPOSE).
    View,
    /// Refused like ggml's RPC server refuses it: the node carries a function pointer.
    Callback,
    /// Not computed yet (refused as unsupported, the connection closed cleanly); why.
    Pending(&'static str),
}

/// The support of `op`.
pub fn support(op: GgmlOp) -> Support {
    use GgmlOp::*;
    let c = |module, simd| Support::Computed { module, simd };
    match op {
        None | Reshape | View | Permute | Transpose => Support::View,
        MapCustom1 | MapCustom2 | MapCustom3 | Custom => Support::Callback,
        MulMat | MulMatId => {
            c("matmul", "per weight type: AVX2/AVX-512/NEON dots, GEMM tiles, panels (see quant)")
        }
        GetRows | SetRows => c("rows", ""),
        Dup | Cpy | Cont => c("copy", ""),
        Add | Sub | Mul | Div | Add1 | AddId => c("binary", ""),
        Sqr | Sqrt | Log | Sin | Cos | Scale | Clamp | Fill | Unary | LeakyRelu => {
            c("unary", "x86 vectorised exp (SILU)")
        }
        Glu => c("unary", "x86 vectorised exp (SWIGLU)"),
        RmsNorm | Norm | L2Norm | GroupNorm => c("norm", ""),
        Rope | RopeBack => c("rope", ""),
        SoftMax | DiagMaskInf | DiagMaskZero => c("softmax", "x86 vectorised exp"),
        FlashAttnExt => c("attention", "f16 accumulator (f16acc)"),
        Sum | SumRows | Mean | Argmax | Cumsum | CountEqual => c("reduce", ""),
        Argsort | TopK => c("reduce", ""),
        Concat | Pad | Repeat => c("layout", ""),
        Arange | TimestepEmbedding | Roll | PadReflect1d | Diag | Tri | Acc | Set | Upscale | Im2col
        | Pool1d | Pool2d | Conv2dDw | Conv2d | ConvTranspose1d | ConvTranspose2d | OutProd | WinPart
        | WinUnpart | GetRelPos | Im2col3d | Conv3d | Im2colBack | Col2im1d | Pool2dBack | AddRelPos => {
            c("indexed", "")
        }
        SiluBack | RmsNormBack | SoftMaxBack | RepeatBack | GetRowsBack | CrossEntropyLoss
        | CrossEntropyLossBack | OptStepSgd | OptStepAdamw | FlashAttnBack => c("backward", ""),
        SsmConv | SsmScan | RwkvWkv6 | GatedLinearAttn | RwkvWkv7 | SolveTri | GatedDeltaNet => {
            c("recurrent", "")
        }
        Dsv4HcComb | Dsv4HcPre | Dsv4HcPost | LightningIndexer => c("hyper", ""),
    }
}
