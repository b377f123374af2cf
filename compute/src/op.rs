//! `ggml_op`, `ggml_unary_op` and `ggml_glu_op`: numeric values of protocol 7.0.0.
//!
//! ref: ggml-compute-semantics.md §3.1. Op numbers are not stable across llama.cpp versions; these
//! are the values for `GGML_OP_COUNT == 101`, the set the RPC protocol 7.0.0 header asserts.

use std::fmt;

/// `GGML_OP_COUNT` at protocol 7.0.0.
pub const GGML_OP_COUNT: u32 = 101;

/// A `ggml_op`, with its exact numeric value.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum GgmlOp {
    None = 0,
    Dup = 1,
    Add = 2,
    AddId = 3,
    Add1 = 4,
    Acc = 5,
    Sub = 6,
    Mul = 7,
    Div = 8,
    Sqr = 9,
    Sqrt = 10,
    Log = 11,
    Sin = 12,
    Cos = 13,
    Sum = 14,
    SumRows = 15,
    Cumsum = 16,
    Mean = 17,
    Argmax = 18,
    CountEqual = 19,
    Repeat = 20,
    RepeatBack = 21,
    Concat = 22,
    SiluBack = 23,
    Norm = 24,
    RmsNorm = 25,
    RmsNormBack = 26,
    GroupNorm = 27,
    L2Norm = 28,
    MulMat = 29,
    MulMatId = 30,
    OutProd = 31,
    Scale = 32,
    Set = 33,
    Cpy = 34,
    Cont = 35,
    Reshape = 36,
    View = 37,
    Permute = 38,
    Transpose = 39,
    GetRows = 40,
    GetRowsBack = 41,
    SetRows = 42,
    Diag = 43,
    DiagMaskInf = 44,
    DiagMaskZero = 45,
    SoftMax = 46,
    SoftMaxBack = 47,
    Rope = 48,
    RopeBack = 49,
    Clamp = 50,
    ConvTranspose1d = 51,
    Im2col = 52,
    Im2colBack = 53,
    Im2col3d = 54,
    Col2im1d = 55,
    Conv2d = 56,
    Conv3d = 57,
    Conv2dDw = 58,
    ConvTranspose2d = 59,
    Pool1d = 60,
    Pool2d = 61,
    Pool2dBack = 62,
    Upscale = 63,
    Pad = 64,
    PadReflect1d = 65,
    Roll = 66,
    Arange = 67,
    TimestepEmbedding = 68,
    Argsort = 69,
    TopK = 70,
    LeakyRelu = 71,
    Tri = 72,
    Fill = 73,
    FlashAttnExt = 74,
    FlashAttnBack = 75,
    SsmConv = 76,
    SsmScan = 77,
    WinPart = 78,
    WinUnpart = 79,
    GetRelPos = 80,
    AddRelPos = 81,
    RwkvWkv6 = 82,
    GatedLinearAttn = 83,
    RwkvWkv7 = 84,
    SolveTri = 85,
    GatedDeltaNet = 86,
    LightningIndexer = 87,
    Dsv4HcComb = 88,
    Dsv4HcPre = 89,
    Dsv4HcPost = 90,
    Unary = 91,
    MapCustom1 = 92,
    MapCustom2 = 93,
    MapCustom3 = 94,
    Custom = 95,
    CrossEntropyLoss = 96,
    CrossEntropyLossBack = 97,
    OptStepAdamw = 98,
    OptStepSgd = 99,
    Glu = 100,
}

const OPS: [GgmlOp; 101] = [
    GgmlOp::None,
    GgmlOp::Dup,
    GgmlOp::Add,
    GgmlOp::AddId,
    GgmlOp::Add1,
    GgmlOp::Acc,
    GgmlOp::Sub,
    GgmlOp::Mul,
    GgmlOp::Div,
    GgmlOp::Sqr,
    GgmlOp::Sqrt,
    GgmlOp::Log,
    GgmlOp::Sin,
    GgmlOp::Cos,
    GgmlOp::Sum,
    GgmlOp::SumRows,
    GgmlOp::Cumsum,
    GgmlOp::Mean,
    GgmlOp::Argmax,
    GgmlOp::CountEqual,
    GgmlOp::Repeat,
    GgmlOp::RepeatBack,
    GgmlOp::Concat,
    GgmlOp::SiluBack,
    GgmlOp::Norm,
    GgmlOp::RmsNorm,
    GgmlOp::RmsNormBack,
    GgmlOp::GroupNorm,
    GgmlOp::L2Norm,
    GgmlOp::MulMat,
    GgmlOp::MulMatId,
    GgmlOp::OutProd,
    GgmlOp::Scale,
    GgmlOp::Set,
    GgmlOp::Cpy,
    GgmlOp::Cont,
    GgmlOp::Reshape,
    GgmlOp::View,
    GgmlOp::Permute,
    GgmlOp::Transpose,
    GgmlOp::GetRows,
    GgmlOp::GetRowsBack,
    GgmlOp::SetRows,
    GgmlOp::Diag,
    GgmlOp::DiagMaskInf,
    GgmlOp::DiagMaskZero,
    GgmlOp::SoftMax,
    GgmlOp::SoftMaxBack,
    GgmlOp::Rope,
    GgmlOp::RopeBack,
    GgmlOp::Clamp,
    GgmlOp::ConvTranspose1d,
    GgmlOp::Im2col,
    GgmlOp::Im2colBack,
    GgmlOp::Im2col3d,
    GgmlOp::Col2im1d,
    GgmlOp::Conv2d,
    GgmlOp::Conv3d,
    GgmlOp::Conv2dDw,
    GgmlOp::ConvTranspose2d,
    GgmlOp::Pool1d,
    GgmlOp::Pool2d,
    GgmlOp::Pool2dBack,
    GgmlOp::Upscale,
    GgmlOp::Pad,
    GgmlOp::PadReflect1d,
    GgmlOp::Roll,
    GgmlOp::Arange,
    GgmlOp::TimestepEmbedding,
    GgmlOp::Argsort,
    GgmlOp::TopK,
    GgmlOp::LeakyRelu,
    GgmlOp::Tri,
    GgmlOp::Fill,
    GgmlOp::FlashAttnExt,
    GgmlOp::FlashAttnBack,
    GgmlOp::SsmConv,
    GgmlOp::SsmScan,
    GgmlOp::WinPart,
    GgmlOp::WinUnpart,
    GgmlOp::GetRelPos,
    GgmlOp::AddRelPos,
    GgmlOp::RwkvWkv6,
    GgmlOp::GatedLinearAttn,
    GgmlOp::RwkvWkv7,
    GgmlOp::SolveTri,
    GgmlOp::GatedDeltaNet,
    GgmlOp::LightningIndexer,
    GgmlOp::Dsv4HcComb,
    GgmlOp::Dsv4HcPre,
    GgmlOp::Dsv4HcPost,
    GgmlOp::Unary,
    GgmlOp::MapCustom1,
    GgmlOp::MapCustom2,
    GgmlOp::MapCustom3,
    GgmlOp::Custom,
    GgmlOp::CrossEntropyLoss,
    GgmlOp::CrossEntropyLossBack,
    GgmlOp::OptStepAdamw,
    GgmlOp::OptStepSgd,
    GgmlOp::Glu,
];

const OP_NAMES: [&str; 101] = [
    "NONE",
    "DUP",
    "ADD",
    "ADD_ID",
    "ADD1",
    "ACC",
    "SUB",
    "MUL",
    "DIV",
    "SQR",
    "SQRT",
    "LOG",
    "SIN",
    "COS",
    "SUM",
    "SUM_ROWS",
    "CUMSUM",
    "MEAN",
    "ARGMAX",
    "COUNT_EQUAL",
    "REPEAT",
    "REPEAT_BACK",
    "CONCAT",
    "SILU_BACK",
    "NORM",
    "RMS_NORM",
    "RMS_NORM_BACK",
    "GROUP_NORM",
    "L2_NORM",
    "MUL_MAT",
    "MUL_MAT_ID",
    "OUT_PROD",
    "SCALE",
    "SET",
    "CPY",
    "CONT",
    "RESHAPE",
    "VIEW",
    "PERMUTE",
    "TRANSPOSE",
    "GET_ROWS",
    "GET_ROWS_BACK",
    "SET_ROWS",
    "DIAG",
    "DIAG_MASK_INF",
    "DIAG_MASK_ZERO",
    "SOFT_MAX",
    "SOFT_MAX_BACK",
    "ROPE",
    "ROPE_BACK",
    "CLAMP",
    "CONV_TRANSPOSE_1D",
    "IM2COL",
    "IM2COL_BACK",
    "IM2COL_3D",
    "COL2IM_1D",
    "CONV_2D",
    "CONV_3D",
    "CONV_2D_DW",
    "CONV_TRANSPOSE_2D",
    "POOL_1D",
    "POOL_2D",
    "POOL_2D_BACK",
    "UPSCALE",
    "PAD",
    "PAD_REFLECT_1D",
    "ROLL",
    "ARANGE",
    "TIMESTEP_EMBEDDING",
    "ARGSORT",
    "TOP_K",
    "LEAKY_RELU",
    "TRI",
    "FILL",
    "FLASH_ATTN_EXT",
    "FLASH_ATTN_BACK",
    "SSM_CONV",
    "SSM_SCAN",
    "WIN_PART",
    "WIN_UNPART",
    "GET_REL_POS",
    "ADD_REL_POS",
    "RWKV_WKV6",
    "GATED_LINEAR_ATTN",
    "RWKV_WKV7",
    "SOLVE_TRI",
    "GATED_DELTA_NET",
    "LIGHTNING_INDEXER",
    "DSV4_HC_COMB",
    "DSV4_HC_PRE",
    "DSV4_HC_POST",
    "UNARY",
    "MAP_CUSTOM1",
    "MAP_CUSTOM2",
    "MAP_CUSTOM3",
    "CUSTOM",
    "CROSS_ENTROPY_LOSS",
    "CROSS_ENTROPY_LOSS_BACK",
    "OPT_STEP_ADAMW",
    "OPT_STEP_SGD",
    "GLU",
];

impl GgmlOp {
    /// The op with numeric value `v`, or `None` when `v >= GGML_OP_COUNT`.
    pub fn from_u32(v: u32) -> Option<Self> {
        OPS.get(v as usize).copied()
    }

    /// ggml's upper-case name of the op (`MUL_MAT`, `FLASH_ATTN_EXT`, ...).
    pub fn name(self) -> &'static str {
        OP_NAMES[self as usize]
    }

    /// True for ops that only describe memory (no work at compute time).
    pub fn is_view(self) -> bool {
        matches!(self, GgmlOp::None | GgmlOp::Reshape | GgmlOp::View | GgmlOp::Permute | GgmlOp::Transpose)
    }

    /// True for the ops whose `op_params` carry host function pointers; never executed for a peer.
    pub fn carries_function_pointer(self) -> bool {
        matches!(self, GgmlOp::MapCustom1 | GgmlOp::MapCustom2 | GgmlOp::MapCustom3 | GgmlOp::Custom)
    }
}

impl fmt::Display for GgmlOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A `ggml_unary_op` (`op_params[0]` of a UNARY node).
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum UnaryOp {
    Abs = 0,
    Sgn = 1,
    Neg = 2,
    Step = 3,
    Tanh = 4,
    Elu = 5,
    Relu = 6,
    Sigmoid = 7,
    Gelu = 8,
    GeluQuick = 9,
    Silu = 10,
    Hardswish = 11,
    Hardsigmoid = 12,
    Exp = 13,
    Expm1 = 14,
    Softplus = 15,
    GeluErf = 16,
    Xielu = 17,
    Floor = 18,
    Ceil = 19,
    Round = 20,
    Trunc = 21,
}

impl UnaryOp {
    /// The unary op with numeric value `v`.
    pub fn from_i32(v: i32) -> Option<Self> {
        use UnaryOp::*;
        Some(match v {
            0 => Abs,
            1 => Sgn,
            2 => Neg,
            3 => Step,
            4 => Tanh,
            5 => Elu,
            6 => Relu,
            7 => Sigmoid,
            8 => Gelu,
            9 => GeluQuick,
            10 => Silu,
            11 => Hardswish,
            12 => Hardsigmoid,
            13 => Exp,
            14 => Expm1,
            15 => Softplus,
            16 => GeluErf,
            17 => Xielu,
            18 => Floor,
            19 => Ceil,
            20 => Round,
            21 => Trunc,
            _ => return None,
        })
    }
}

/// A `ggml_glu_op` (`op_params[0]` of a GLU node).
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GluOp {
    Reglu = 0,
    Geglu = 1,
    Swiglu = 2,
    SwigluOai = 3,
    GegluErf = 4,
    GegluQuick = 5,
    SwigluClamp = 6,
}

impl GluOp {
    /// The GLU op with numeric value `v`.
    pub fn from_i32(v: i32) -> Option<Self> {
        use GluOp::*;
        Some(match v {
            0 => Reglu,
            1 => Geglu,
            2 => Swiglu,
            3 => SwigluOai,
            4 => GegluErf,
            5 => GegluQuick,
            6 => SwigluClamp,
            _ => return None,
        })
    }
}

/// Tensor flag bits (`ggml_tensor_flag`).
pub mod flags {
    /// Graph input.
    pub const INPUT: i32 = 1;
    /// Graph output.
    pub const OUTPUT: i32 = 2;
    /// Trainable parameter.
    pub const PARAM: i32 = 4;
    /// Loss.
    pub const LOSS: i32 = 8;
    /// The node is to be computed; nodes without it are skipped.
    pub const COMPUTE: i32 = 16;
}

/// RoPE mode values (`op_params[2]` of ROPE).
pub mod rope_mode {
    /// Adjacent pairs (llama, mistral).
    pub const NORMAL: i32 = 0;
    /// Split halves (qwen, gemma).
    pub const NEOX: i32 = 2;
    /// Multi-section RoPE.
    pub const MROPE: i32 = 8;
    /// Vision RoPE.
    pub const VISION: i32 = 24;
    /// Interleaved M-RoPE.
    pub const IMROPE: i32 = 40;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spot_values_match_reference() {
        // ref: ggml-compute-semantics.md §3.1.
        assert_eq!(GgmlOp::Add as u32, 2);
        assert_eq!(GgmlOp::RmsNorm as u32, 25);
        assert_eq!(GgmlOp::MulMat as u32, 29);
        assert_eq!(GgmlOp::Cpy as u32, 34);
        assert_eq!(GgmlOp::GetRows as u32, 40);
        assert_eq!(GgmlOp::SetRows as u32, 42);
        assert_eq!(GgmlOp::SoftMax as u32, 46);
        assert_eq!(GgmlOp::Rope as u32, 48);
        assert_eq!(GgmlOp::FlashAttnExt as u32, 74);
        assert_eq!(GgmlOp::Unary as u32, 91);
        assert_eq!(GgmlOp::Custom as u32, 95);
        assert_eq!(GgmlOp::Glu as u32, 100);
        assert!(GgmlOp::from_u32(101).is_none());
        for v in 0..GGML_OP_COUNT {
            assert_eq!(GgmlOp::from_u32(v).unwrap() as u32, v);
        }
        assert_eq!(UnaryOp::from_i32(10), Some(UnaryOp::Silu));
        assert_eq!(UnaryOp::from_i32(21), Some(UnaryOp::Trunc));
        assert_eq!(GluOp::from_i32(2), Some(GluOp::Swiglu));
        assert_eq!(GluOp::from_i32(7), None);
    }
}
