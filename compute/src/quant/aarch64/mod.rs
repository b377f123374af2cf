//! aarch64 kernels: NEON, with `sdot` (dotprod) paths chosen inside each kernel when the CPU has it.

use super::dispatch::Kernels;

/// Installs the NEON kernels.
pub fn install_neon(_k: &mut Kernels) {}
