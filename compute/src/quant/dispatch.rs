//! Run-time choice of kernels: the instruction set is detected once and the table filled.
//!
//! `LLAMAD_KERNELS=scalar|avx2|avx512|neon|neon-dotprod|neon-i8mm` forces a path (for tests and
//! benchmarks); a forced path the CPU cannot run falls back to the best available one, with a warning.
//! On aarch64 the three NEON levels are separate sets, so one CPU with i8mm tests all three.

use std::sync::OnceLock;

use super::{scalar, FromF32Fn, ToF32Fn, TypeKernels, VecDotFn};
use crate::dtype::{GgmlType, GGML_TYPE_COUNT};
use crate::numerics::Numerics;

/// An instruction-set level with its own kernel table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust: the reference kernels.
    Scalar,
    /// x86_64 with AVX2, FMA and F16C.
    Avx2,
    /// x86_64 with AVX-512 F/BW/VL/VNNI on top of AVX2.
    Avx512,
    /// aarch64 baseline NEON (widening multiplies, no `sdot`).
    Neon,
    /// aarch64 NEON with dotprod (`sdot`).
    NeonDotprod,
    /// aarch64 NEON with dotprod and i8mm (`smmla` in the two-row kernels).
    NeonI8mm,
}

/// Every kernel set, worst first.
const ALL: [Isa; 6] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon, Isa::NeonDotprod, Isa::NeonI8mm];

impl Isa {
    /// The name used by `LLAMAD_KERNELS` and [`super::active_isa`].
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
            Isa::NeonDotprod => "neon-dotprod",
            Isa::NeonI8mm => "neon-i8mm",
        }
    }

    /// Whether this CPU can run the kernel set.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => super::x86_64::avx2_available(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => super::x86_64::avx512_available(),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => super::aarch64::level_available(super::aarch64::Level::Neon),
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDotprod => super::aarch64::level_available(super::aarch64::Level::Dotprod),
            #[cfg(target_arch = "aarch64")]
            Isa::NeonI8mm => super::aarch64::level_available(super::aarch64::Level::I8mm),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Every kernel set this CPU can run, best last.
    pub fn all_available() -> Vec<Isa> {
        ALL.into_iter().filter(|i| i.available()).collect()
    }

    /// The kernel set that runs the numerics profile `numerics` when `self` was chosen: the
    /// `neon-dotprod` profile lowers `neon-i8mm` to `neon-dotprod`; every other pair keeps `self`.
    pub fn for_profile(self, numerics: Numerics) -> Isa {
        match (self, numerics) {
            (Isa::NeonI8mm, Numerics::NeonDotprod) => Isa::NeonDotprod,
            _ => self,
        }
    }

    fn parse(s: &str) -> Option<Isa> {
        ALL.into_iter().find(|i| i.name() == s)
    }
}

/// Kernel tables for every type, indexed by the type's numeric value.
pub struct Kernels {
    isa: Isa,
    types: [TypeKernels; GGML_TYPE_COUNT as usize],
}

impl Kernels {
    /// The kernels of `t`.
    pub fn get(&self, t: GgmlType) -> &TypeKernels {
        &self.types[t as usize]
    }

    /// The instruction set this table was built for.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Builds the `portable` table for `isa` (see [`Kernels::build_for`]).
    pub fn build(isa: Isa) -> Kernels {
        Kernels::build_for(isa, Numerics::Portable)
    }

    /// Builds the table for `isa` and the numerics profile `numerics` (scalar kernels where the
    /// ISA has no faster one). The caller must have checked `isa.available()`; an unavailable ISA
    /// yields the scalar table. On x86: every profile but `portable` drops the packed panels (their
    /// summation order is not ggml's); `avx512` replaces the F32/F16 dot products, float GEMM
    /// orders and the F16 tile with the 16-lane ones of ggml's AVX-512 build (when the CPU has
    /// AVX-512 F/BW/VL/DQ). On aarch64 the profile caps the NEON level: `neon-dotprod` builds the
    /// dotprod table on a CPU with i8mm too (ggml's armv8.2-a+dotprod build has no `smmla` kernels
    /// and keeps llamafile on, so its orders differ from the i8mm build's); the other profiles take
    /// `isa`'s table (see [`Isa::for_profile`]), and `sve` installs the SVE build's F32 / F16 dot
    /// orders over the i8mm table (`quant::aarch64::install_sve_order`).
    pub fn build_for(isa: Isa, numerics: Numerics) -> Kernels {
        #[cfg(target_arch = "x86_64")]
        {
            let mut k = Kernels::build_isa(isa);
            if k.isa != Isa::Scalar && matches!(numerics, Numerics::Avx2 | Numerics::Avx512) {
                super::x86_64::install_ggml_orders(&mut k, numerics == Numerics::Avx512);
            }
            k
        }
        #[cfg(target_arch = "aarch64")]
        {
            let mut k = Kernels::build_isa(isa.for_profile(numerics));
            if numerics == Numerics::Sve && k.isa == Isa::NeonI8mm {
                super::aarch64::install_sve_order(&mut k);
            }
            k
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            Kernels::build_isa(isa.for_profile(numerics))
        }
    }

    fn build_isa(isa: Isa) -> Kernels {
        let mut k = build_scalar();
        if !isa.available() {
            return k;
        }
        k.isa = isa;
        match isa {
            Isa::Scalar => {}
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => super::x86_64::install_avx2(&mut k),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                super::x86_64::install_avx2(&mut k);
                super::x86_64::install_avx512(&mut k);
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => super::aarch64::install_neon(&mut k, super::aarch64::Level::Neon),
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDotprod => super::aarch64::install_neon(&mut k, super::aarch64::Level::Dotprod),
            #[cfg(target_arch = "aarch64")]
            Isa::NeonI8mm => super::aarch64::install_neon(&mut k, super::aarch64::Level::I8mm),
            #[allow(unreachable_patterns)]
            _ => k.isa = Isa::Scalar,
        }
        k
    }

    /// Replaces the dot product of `t`.
    /// Replaces the dot product of `t`; its four-row form, which must give the same bits, goes
    /// with it (the caller installs the new one's after this).
    pub(crate) fn set_vec_dot(&mut self, t: GgmlType, f: VecDotFn) {
        self.types[t as usize].vec_dot = Some(f);
        self.types[t as usize].vec_dot_rows4 = None;
    }

    /// Removes every packed-panel product (see `quant::panel`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn clear_panels(&mut self) {
        self.types.iter_mut().for_each(|t| t.panel = None);
    }

    /// Sets the dot product in ggml's tiled-product order of `t` (see `TypeKernels::vec_dot_batch`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn set_vec_dot_batch(&mut self, t: GgmlType, f: VecDotFn) {
        self.types[t as usize].vec_dot_batch = Some(f);
        self.types[t as usize].vec_dot_batch_x4 = None;
    }

    /// Sets the four-column form of `t`'s tiled-order dot (after [`Self::set_vec_dot_batch`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn set_vec_dot_batch_x4(&mut self, t: GgmlType, f: super::VecDotX4Fn) {
        self.types[t as usize].vec_dot_batch_x4 = Some(f);
    }

    /// Sets the four-row dot product of `t`.
    pub(crate) fn set_vec_dot_x4(&mut self, t: GgmlType, f: super::VecDotX4Fn) {
        self.types[t as usize].vec_dot_x4 = Some(f);
    }

    /// Sets the four-row, one-column dot product of `t` (the same bits as its `vec_dot`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn set_vec_dot_rows4(&mut self, t: GgmlType, f: super::VecDotRows4Fn) {
        self.types[t as usize].vec_dot_rows4 = Some(f);
    }

    /// Sets the two-row × two-column dot product of `t`.
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    pub(crate) fn set_vec_dot_2x2(&mut self, t: GgmlType, f: super::VecDot2x2Fn) {
        self.types[t as usize].vec_dot_2x2 = Some(f);
    }

    /// Removes the two-row × two-column dot product of `t`.
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    pub(crate) fn clear_vec_dot_2x2(&mut self, t: GgmlType) {
        self.types[t as usize].vec_dot_2x2 = None;
    }

    /// Sets the register-tiled matrix × matrix kernel of `t`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn set_gemm(&mut self, t: GgmlType, f: super::GemmFn) {
        self.types[t as usize].gemm = Some(f);
    }

    /// Sets the prepared-activation dot of `t`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn set_vec_dot_prepared(&mut self, t: GgmlType, bias: i32, dot: VecDotFn) {
        self.types[t as usize].vec_dot_prepared =
            Some(super::prepared::PreparedDot { bias, dot, gemm: None });
    }

    /// Sets the tiled product of `t`'s weights × prepared rows, for the prepared dot of the same
    /// `bias` (installed before it); does nothing otherwise.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn set_gemm_prepared(&mut self, t: GgmlType, bias: i32, f: super::GemmFn) {
        if let Some(p) = self.types[t as usize].vec_dot_prepared.as_mut().filter(|p| p.bias == bias) {
            p.gemm = Some(f);
        }
    }

    /// Sets the panel product of `t` (see [`super::panel`]), with the type's packers; does nothing
    /// for a type without panel packers.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn set_panel(&mut self, t: GgmlType, run: super::panel::PanelRunFn) {
        if let Some((format, pack_rows, pack_col)) = super::panel::packers(t) {
            self.types[t as usize].panel =
                Some(super::panel::PanelKernels { format, pack_rows, pack_col, run });
        }
    }

    /// Replaces the weight packer of `t`'s panel product (a SIMD twin of the scalar one); does
    /// nothing when `t` has no panel product.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn set_panel_pack_rows(&mut self, t: GgmlType, pack_rows: super::panel::PackRowsFn) {
        if let Some(p) = self.types[t as usize].panel.as_mut() {
            p.pack_rows = pack_rows;
        }
    }

    /// Replaces the activation packer of `t`'s panel product (a SIMD twin of the scalar one);
    /// does nothing when `t` has no panel product.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn set_panel_pack_col(&mut self, t: GgmlType, pack_col: super::panel::PackColFn) {
        if let Some(p) = self.types[t as usize].panel.as_mut() {
            p.pack_col = pack_col;
        }
    }

    /// Sets the kernels of `t` in llama.cpp's local order (see [`super::local`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn set_local(&mut self, t: GgmlType, k: super::local::LocalKernels) {
        self.types[t as usize].local = Some(k);
    }

    /// Sets the interleaved-weight product of `t` (see [`super::interleave`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn set_interleaved_dot(&mut self, t: GgmlType, f: super::interleave::InterleavedDotFn) {
        self.types[t as usize].interleaved_dot = Some(f);
    }

    /// Sets the GEMM-order dot product of `t` (see [`TypeKernels::vec_dot_gemm`]).
    pub(crate) fn set_vec_dot_gemm(&mut self, t: GgmlType, f: VecDotFn) {
        self.types[t as usize].vec_dot_gemm = Some(f);
    }

    /// Sets when the GEMM-order dot of `t` runs (see [`super::GemmRule`]).
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    pub(crate) fn set_gemm_rule(&mut self, t: GgmlType, rule: super::GemmRule) {
        self.types[t as usize].gemm_rule = rule;
    }

    /// Removes the float-GEMM-order dot of `t` (a kernel set that prefers its own product).
    pub(crate) fn clear_vec_dot_gemm(&mut self, t: GgmlType) {
        self.types[t as usize].vec_dot_gemm = None;
    }

    /// Replaces the quantizer (or narrowing) of `t`.
    pub(crate) fn set_from_f32(&mut self, t: GgmlType, f: FromF32Fn) {
        self.types[t as usize].from_f32 = Some(f);
    }

    /// Replaces the dequantizer (or widening) of `t`.
    pub(crate) fn set_to_f32(&mut self, t: GgmlType, f: ToF32Fn) {
        self.types[t as usize].to_f32 = Some(f);
    }
}

static KERNELS: OnceLock<Kernels> = OnceLock::new();
static ISA: OnceLock<Isa> = OnceLock::new();

/// The table for this CPU and the numerics profile in force (built on first use).
pub fn table() -> &'static Kernels {
    KERNELS.get_or_init(|| Kernels::build_for(chosen_isa(), crate::numerics::active()))
}

/// The kernel set chosen for this process (from the CPU and `LLAMAD_KERNELS`; fixed on first use).
pub fn chosen_isa() -> Isa {
    *ISA.get_or_init(choose)
}

/// The best available ISA, or the one `LLAMAD_KERNELS` forces.
fn choose() -> Isa {
    let isa = choose_from(std::env::var("LLAMAD_KERNELS").ok().as_deref());
    tracing::info!(isa = isa.name(), "quant kernels chosen");
    isa
}

/// The ISA for a `LLAMAD_KERNELS` value: the named set if this CPU runs it, else the best one.
fn choose_from(requested: Option<&str>) -> Isa {
    let best = *Isa::all_available().last().unwrap_or(&Isa::Scalar);
    match requested {
        Some(s) if !s.is_empty() => match Isa::parse(s) {
            Some(isa) if isa.available() => isa,
            _ => {
                tracing::warn!(requested = %s, using = best.name(), "LLAMAD_KERNELS names no kernel set this CPU runs");
                best
            }
        },
        _ => best,
    }
}

fn entry(to: ToF32Fn, from: Option<FromF32Fn>, dot: Option<VecDotFn>, vdt: GgmlType) -> TypeKernels {
    TypeKernels {
        to_f32: Some(to),
        from_f32: from,
        vec_dot: dot,
        vec_dot_type: vdt,
        vec_dot_x4: None,
        vec_dot_rows4: None,
        vec_dot_2x2: None,
        vec_dot_gemm: None,
        gemm_rule: super::GemmRule::DEFAULT,
        vec_dot_batch: None,
        vec_dot_batch_x4: None,
        gemm: None,
        vec_dot_prepared: None,
        panel: None,
        interleaved_dot: None,
        local: None,
    }
}

fn build_scalar() -> Kernels {
    use scalar as s;
    use GgmlType::*;
    let empty = TypeKernels {
        to_f32: None,
        from_f32: None,
        vec_dot: None,
        vec_dot_type: F32,
        vec_dot_x4: None,
        vec_dot_rows4: None,
        vec_dot_2x2: None,
        vec_dot_gemm: None,
        gemm_rule: super::GemmRule::DEFAULT,
        vec_dot_batch: None,
        vec_dot_batch_x4: None,
        gemm: None,
        vec_dot_prepared: None,
        panel: None,
        interleaved_dot: None,
        local: None,
    };
    let mut t = [empty; GGML_TYPE_COUNT as usize];
    // ref: ggml-compute-semantics.md §2.3, the vec_dot_type table.
    let rows: [(GgmlType, TypeKernels); 30] = [
        (F32, entry(s::f32_to_f32, Some(s::f32_from_f32), Some(s::vec_dot_f32_f32), F32)),
        (F16, entry(s::f16_to_f32, Some(s::f16_from_f32), Some(s::vec_dot_f16_f16), F16)),
        (BF16, entry(s::bf16_to_f32, Some(s::bf16_from_f32), Some(s::vec_dot_bf16_bf16), BF16)),
        (Q4_0, entry(s::q4_0_to_f32, Some(s::q4_0_from_f32), Some(s::vec_dot_q4_0_q8_0), Q8_0)),
        (Q4_1, entry(s::q4_1_to_f32, Some(s::q4_1_from_f32), Some(s::vec_dot_q4_1_q8_1), Q8_1)),
        (Q5_0, entry(s::q5_0_to_f32, Some(s::q5_0_from_f32), Some(s::vec_dot_q5_0_q8_0), Q8_0)),
        (Q5_1, entry(s::q5_1_to_f32, Some(s::q5_1_from_f32), Some(s::vec_dot_q5_1_q8_1), Q8_1)),
        (Q8_0, entry(s::q8_0_to_f32, Some(s::q8_0_from_f32), Some(s::vec_dot_q8_0_q8_0), Q8_0)),
        (Q8_1, entry(s::q8_1_to_f32, Some(s::q8_1_from_f32), None, Q8_1)),
        (Q2_K, entry(s::q2_k_to_f32, Some(s::q2_k_from_f32), Some(s::vec_dot_q2_k_q8_k), Q8_K)),
        (Q3_K, entry(s::q3_k_to_f32, Some(s::q3_k_from_f32), Some(s::vec_dot_q3_k_q8_k), Q8_K)),
        (Q4_K, entry(s::q4_k_to_f32, Some(s::q4_k_from_f32), Some(s::vec_dot_q4_k_q8_k), Q8_K)),
        (Q5_K, entry(s::q5_k_to_f32, Some(s::q5_k_from_f32), Some(s::vec_dot_q5_k_q8_k), Q8_K)),
        (Q6_K, entry(s::q6_k_to_f32, Some(s::q6_k_from_f32), Some(s::vec_dot_q6_k_q8_k), Q8_K)),
        (Q8_K, entry(s::q8_k_to_f32, Some(s::q8_k_from_f32), None, Q8_K)),
        (IQ4_NL, entry(s::iq4_nl_to_f32, Some(s::iq4_nl_from_f32), Some(s::vec_dot_iq4_nl_q8_0), Q8_0)),
        (IQ4_XS, entry(s::iq4_xs_to_f32, Some(s::iq4_xs_from_f32), Some(s::vec_dot_iq4_xs_q8_k), Q8_K)),
        (MXFP4, entry(s::mxfp4_to_f32, Some(s::mxfp4_from_f32), Some(s::vec_dot_mxfp4_q8_0), Q8_0)),
        (NVFP4, entry(s::nvfp4_to_f32, Some(s::nvfp4_from_f32), Some(s::vec_dot_nvfp4_q8_0), Q8_0)),
        (Q1_0, entry(s::q1_0_to_f32, Some(s::q1_0_from_f32), Some(s::vec_dot_q1_0_q8_0), Q8_0)),
        (Q2_0, entry(s::q2_0_to_f32, Some(s::q2_0_from_f32), Some(s::vec_dot_q2_0_q8_0), Q8_0)),
        (TQ2_0, entry(s::tq2_0_to_f32, Some(s::tq2_0_from_f32), Some(s::vec_dot_tq2_0_q8_k), Q8_K)),
        (TQ1_0, entry(s::tq1_0_to_f32, Some(s::tq1_0_from_f32), Some(s::vec_dot_tq1_0_q8_k), Q8_K)),
        (IQ2_XXS, entry(s::iq2_xxs_to_f32, None, Some(s::vec_dot_iq2_xxs_q8_k), Q8_K)),
        (IQ2_XS, entry(s::iq2_xs_to_f32, None, Some(s::vec_dot_iq2_xs_q8_k), Q8_K)),
        (IQ2_S, entry(s::iq2_s_to_f32, None, Some(s::vec_dot_iq2_s_q8_k), Q8_K)),
        (IQ3_XXS, entry(s::iq3_xxs_to_f32, None, Some(s::vec_dot_iq3_xxs_q8_k), Q8_K)),
        (IQ3_S, entry(s::iq3_s_to_f32, None, Some(s::vec_dot_iq3_s_q8_k), Q8_K)),
        (IQ1_S, entry(s::iq1_s_to_f32, None, Some(s::vec_dot_iq1_s_q8_k), Q8_K)),
        (IQ1_M, entry(s::iq1_m_to_f32, None, Some(s::vec_dot_iq1_m_q8_k), Q8_K)),
    ];
    for (ty, k) in rows {
        t[ty as usize] = k;
    }
    Kernels { isa: Isa::Scalar, types: t }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llamad_kernels_forces_an_available_set() {
        let best = *Isa::all_available().last().unwrap();
        assert_eq!(choose_from(None), best);
        assert_eq!(choose_from(Some("")), best);
        assert_eq!(choose_from(Some("scalar")), Isa::Scalar);
        assert_eq!(choose_from(Some("no-such-set")), best);
        for isa in [Isa::Avx2, Isa::Avx512, Isa::Neon, Isa::NeonDotprod, Isa::NeonI8mm] {
            let want = if isa.available() { isa } else { best };
            assert_eq!(choose_from(Some(isa.name())), want);
        }
    }

    #[test]
    fn profiles_turn_paths_on_and_off() {
        use GgmlType::*;
        for isa in Isa::all_available() {
            // The comparisons with the portable table are x86 ones (aarch64 has no ggml profile yet).
            #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
            let portable = Kernels::build_for(isa, Numerics::Portable);
            #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
            let f16 = |k: &Kernels| k.get(F16).vec_dot.map(|f| f as usize);
            for p in [Numerics::Avx2, Numerics::Avx512] {
                let k = Kernels::build_for(isa, p);
                // No panel anywhere under a ggml profile (their order is not ggml's).
                assert!(k.types.iter().all(|t| t.panel.is_none()), "{} {p}", isa.name());
                #[cfg(target_arch = "x86_64")]
                if isa != Isa::Scalar {
                    let widened = p == Numerics::Avx512 && super::super::x86_64::avx512_numerics_available();
                    assert_eq!(f16(&k) != f16(&portable), widened, "{} {p}", isa.name());
                }
            }
            #[cfg(target_arch = "x86_64")]
            if isa == Isa::Avx512 {
                assert!(portable.get(Q4_0).panel.is_some(), "portable keeps the panels");
            }
        }
    }

    /// `neon-dotprod` on an i8mm CPU builds exactly the dotprod table (ggml's armv8.2-a+dotprod
    /// build: llamafile's Q4_0 / Q8_0 / F32 / F16 orders, no two-row `smmla` kernels), whose orders
    /// differ from the i8mm table's.
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn neon_dotprod_profile_builds_the_dotprod_table_on_i8mm() {
        use GgmlType::*;
        if !Isa::NeonI8mm.available() {
            eprintln!("no i8mm on this CPU: nothing to lower");
            return;
        }
        let (lowered, dotprod, i8mm) = (
            Kernels::build_for(Isa::NeonI8mm, Numerics::NeonDotprod),
            Kernels::build_for(Isa::NeonDotprod, Numerics::NeonDotprod),
            Kernels::build_for(Isa::NeonI8mm, Numerics::NeonI8mm),
        );
        assert_eq!(lowered.isa(), Isa::NeonDotprod);
        assert_eq!(Isa::NeonI8mm.for_profile(Numerics::NeonDotprod), Isa::NeonDotprod);
        assert_eq!(Isa::NeonI8mm.for_profile(Numerics::NeonI8mm), Isa::NeonI8mm);
        assert_eq!(Isa::NeonI8mm.for_profile(Numerics::Sve), Isa::NeonI8mm);
        let addr = |f: Option<usize>| f.unwrap_or(0);
        let fields = |k: &TypeKernels| {
            [
                addr(k.vec_dot.map(|f| f as usize)),
                addr(k.vec_dot_x4.map(|f| f as usize)),
                addr(k.vec_dot_2x2.map(|f| f as usize)),
                addr(k.vec_dot_gemm.map(|f| f as usize)),
                addr(k.from_f32.map(|f| f as usize)),
                addr(k.to_f32.map(|f| f as usize)),
            ]
        };
        for (i, (a, b)) in lowered.types.iter().zip(&dotprod.types).enumerate() {
            assert_eq!(fields(a), fields(b), "type {i}");
            assert_eq!(a.gemm_rule, b.gemm_rule, "type {i}");
        }
        // The orders that separate the two builds.
        for t in [Q4_0, Q8_0, F32, F16] {
            assert!(lowered.get(t).vec_dot_gemm.is_some() && i8mm.get(t).vec_dot_gemm.is_none(), "{t}");
        }
        for t in [Q4_0, Q4_1, Q8_0] {
            assert!(lowered.get(t).vec_dot_2x2.is_none() && i8mm.get(t).vec_dot_2x2.is_some(), "{t}");
        }
        // And they give other bits: Q4_0 rows whose tinyBLAS (one accumulator) and smmla (per-block
        // scaling) sums round differently, each equal to its scalar twin.
        use crate::quant::scalar::neon_order as no;
        let s = build_scalar();
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut row = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
                })
                .collect()
        };
        let n = 32 * 16;
        let q = |t: GgmlType, x: &[f32]| {
            let mut out = vec![0u8; t.row_size(x.len() as u64).unwrap() as usize];
            (s.get(t).from_f32.unwrap())(x, &mut out);
            out
        };
        let mut differ = 0;
        for _ in 0..64 {
            let (x0, x1, y0, y1) = (q(Q4_0, &row(n)), q(Q4_0, &row(n)), q(Q8_0, &row(n)), q(Q8_0, &row(n)));
            let g = (lowered.get(Q4_0).vec_dot_gemm.unwrap())(n, &x0, &y0);
            assert_eq!(g.to_bits(), no::gemm_q4_0_q8_0_neon(n, &x0, &y0).to_bits());
            let m = (i8mm.get(Q4_0).vec_dot_2x2.unwrap())(n, [&x0, &x1], [&y0, &y1])[0];
            assert_eq!(m.to_bits(), no::vec_dot_2x2_q4_0_q8_0_neon(n, [&x0, &x1], [&y0, &y1])[0].to_bits());
            differ += usize::from(g.to_bits() != m.to_bits());
        }
        assert!(differ > 0, "the dotprod and i8mm orders never differed on 64 random rows");
    }

    #[test]
    fn tables_name_their_set_and_differ_from_scalar() {
        for isa in Isa::all_available() {
            let k = Kernels::build(isa);
            assert_eq!(k.isa(), isa);
            // Every SIMD set replaces at least the Q8_0 quantizer.
            if isa != Isa::Scalar {
                let (a, b) = (
                    k.get(GgmlType::Q8_0).from_f32.unwrap(),
                    build_scalar().get(GgmlType::Q8_0).from_f32.unwrap(),
                );
                assert_ne!(a as usize, b as usize, "{}", isa.name());
            }
        }
    }
}
