//! Run-time choice of kernels: the instruction set is detected once and the table filled.

use std::sync::OnceLock;

use super::{scalar, TypeKernels};
use crate::dtype::{GgmlType, GGML_TYPE_COUNT};

/// Kernel tables for every type, indexed by the type's numeric value.
pub struct Kernels {
    types: [TypeKernels; GGML_TYPE_COUNT as usize],
}

impl Kernels {
    /// The kernels of `t`.
    pub fn get(&self, t: GgmlType) -> &TypeKernels {
        &self.types[t as usize]
    }
}

static KERNELS: OnceLock<Kernels> = OnceLock::new();

/// The table for this CPU (built on first use).
pub fn table() -> &'static Kernels {
    KERNELS.get_or_init(build_scalar)
}

fn build_scalar() -> Kernels {
    let empty = TypeKernels { to_f32: None, from_f32: None, vec_dot: None, vec_dot_type: GgmlType::F32 };
    let mut types = [empty; GGML_TYPE_COUNT as usize];
    types[GgmlType::F32 as usize] = TypeKernels {
        to_f32: Some(scalar::f32_to_f32),
        from_f32: Some(scalar::f32_from_f32),
        vec_dot: Some(scalar::vec_dot_f32_f32),
        vec_dot_type: GgmlType::F32,
    };
    types[GgmlType::F16 as usize] = TypeKernels {
        to_f32: Some(scalar::f16_to_f32),
        from_f32: Some(scalar::f16_from_f32),
        vec_dot: Some(scalar::vec_dot_f16_f16),
        vec_dot_type: GgmlType::F16,
    };
    Kernels { types }
}
