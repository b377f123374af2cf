//! The numerics profile: whose arithmetic order the kernels follow, chosen once per process.
//!
//! A llama.cpp CPU backend computes differently depending on the instructions it was built for: its
//! SIMD macros widen to 512 bits on AVX-512 (other accumulator counts and reduction orders in the
//! F16/F32 dot products and the float GEMM), its vector `exp` (softmax, SiLU, SwiGLU) has an
//! AVX-512 variant, and its aarch64 builds have NEON, i8mm and SVE paths of their own. A profile
//! names one such build; the kernels then give that build's bits.
//!
//! | profile | reproduces | x86 paths it turns on / off |
//! |---|---|---|
//! | `avx2` | ggml built for x86-64 AVX2 (FMA, F16C) | packed panels off (their order is not ggml's); everything else in ggml's AVX2 order |
//! | `avx512` | ggml built natively for AVX-512 (F/BW/VL/DQ; VNNI gives the same integer sums) | as `avx2`, plus 16-lane F32/F16 `vec_dot` and float GEMM orders, the AVX-512 vector `exp` in SOFT_MAX and SwiGLU |
//! | `neon-dotprod`, `neon-i8mm`, `sve` | ggml built for armv8.2-a+dotprod, armv8.6-a+i8mm, SVE (Graviton 3) | aarch64 kernels in ggml's NEON order (see `quant::aarch64`); `neon-dotprod` runs the dotprod set (llamafile's orders, no `smmla`) on an i8mm CPU too; `neon-i8mm` and `sve` need the i8mm set; `sve` adds the SVE build's F32/F16 dot and SOFT_MAX/SwiGLU orders for the CPU's vector length (its quantized dots are still the i8mm build's) |
//! | `portable` | none: the fastest kernels, each in its own order | every fast path, panels included |
//!
//! Choosing: [`init`] takes an explicit request (`llamad --numerics`, its config key `numerics`,
//! `llamactl run/bench --numerics`), else `LLAMAD_NUMERICS`, else [`detect`]s the profile ggml's
//! CPU-variant loader would load on this CPU. A profile this CPU (or the kernel set forced by
//! `LLAMAD_KERNELS`) cannot run falls back to the detected one with a warning. [`active`] answers the
//! choice (calling it first fixes the profile as `init(None)` would).
//!
//! How it combines with `LLAMAD_KERNELS` (which selects instruction sets, see `quant::dispatch`):
//! `LLAMAD_KERNELS=scalar` runs the scalar reference kernels, whose order is their own, so the
//! profile is `portable`. Otherwise the kernel set provides the integer kernels and the profile
//! selects the orders: the `avx512` profile installs its 512-bit float kernels over either x86 set
//! (they need only AVX-512F), and removes the panels of the `avx512` set.
//!
//! This module is the whole interface for kernels that depend on the profile: they ask [`active`]
//! (or receive the profile when a kernel table is built) and need nothing else.

use std::sync::OnceLock;

/// One numerics profile (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Numerics {
    /// ggml's x86-64 AVX2 build.
    Avx2,
    /// ggml's native AVX-512 build.
    Avx512,
    /// ggml's armv8.2-a+dotprod build.
    NeonDotprod,
    /// ggml's armv8.6-a+i8mm build.
    NeonI8mm,
    /// ggml's SVE build (256-bit vectors, Graviton 3 class).
    Sve,
    /// The fastest kernels, each in its own order.
    Portable,
}

/// Every profile, in the order names are listed in messages.
pub const ALL: [Numerics; 6] = [
    Numerics::Avx2,
    Numerics::Avx512,
    Numerics::NeonDotprod,
    Numerics::NeonI8mm,
    Numerics::Sve,
    Numerics::Portable,
];

impl Numerics {
    /// The name used on command lines, in `LLAMAD_NUMERICS`, in `--version` and the status.
    pub const fn name(self) -> &'static str {
        match self {
            Numerics::Avx2 => "avx2",
            Numerics::Avx512 => "avx512",
            Numerics::NeonDotprod => "neon-dotprod",
            Numerics::NeonI8mm => "neon-i8mm",
            Numerics::Sve => "sve",
            Numerics::Portable => "portable",
        }
    }

    /// The profile of a name (exact, lower case).
    pub fn parse(s: &str) -> Option<Numerics> {
        ALL.into_iter().find(|p| p.name() == s)
    }

    /// Whether this CPU, with the kernel set in use, can run the profile.
    pub fn runnable(self) -> bool {
        let isa = crate::quant::dispatch::chosen_isa();
        match self {
            Numerics::Portable => true,
            _ if isa == crate::quant::dispatch::Isa::Scalar => false,
            #[cfg(target_arch = "x86_64")]
            Numerics::Avx2 => crate::quant::x86_64::avx2_available(),
            #[cfg(target_arch = "x86_64")]
            Numerics::Avx512 => crate::quant::x86_64::avx512_numerics_available(),
            // The aarch64 profiles need the kernel set of their level (a lower `LLAMAD_KERNELS`
            // set cannot run them); the set is only chosen where the CPU has its features.
            #[cfg(target_arch = "aarch64")]
            Numerics::NeonDotprod => {
                use crate::quant::dispatch::Isa;
                matches!(isa, Isa::NeonDotprod | Isa::NeonI8mm)
            }
            #[cfg(target_arch = "aarch64")]
            Numerics::NeonI8mm => isa == crate::quant::dispatch::Isa::NeonI8mm,
            #[cfg(target_arch = "aarch64")]
            Numerics::Sve => {
                isa == crate::quant::dispatch::Isa::NeonI8mm && std::arch::is_aarch64_feature_detected!("sve")
            }
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
}

impl std::fmt::Display for Numerics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The profile ggml's CPU-variant loader would pick here: AVX-512 → `avx512`, AVX2 → `avx2`; on
/// aarch64 SVE → `sve`, i8mm → `neon-i8mm`, dotprod → `neon-dotprod`; else `portable`. Profiles the
/// kernel set cannot run are skipped.
pub fn detect() -> Numerics {
    const ORDER: [Numerics; 5] =
        [Numerics::Avx512, Numerics::Avx2, Numerics::Sve, Numerics::NeonI8mm, Numerics::NeonDotprod];
    ORDER.into_iter().find(|p| p.runnable()).unwrap_or(Numerics::Portable)
}

/// The profile for a request (`None` or empty: [`detect`]); an unknown or unrunnable name falls back
/// to [`detect`] with a warning naming `source`.
pub fn resolve(requested: Option<&str>, source: &str) -> Numerics {
    let best = detect();
    match requested.map(str::trim) {
        Some(s) if !s.is_empty() => match Numerics::parse(s) {
            Some(p) if p.runnable() => p,
            Some(_) => {
                tracing::warn!(requested = %s, %source, using = best.name(), "this CPU (or LLAMAD_KERNELS) cannot run the numerics profile");
                best
            }
            None => {
                tracing::warn!(requested = %s, %source, using = best.name(), "unknown numerics profile (avx2|avx512|neon-dotprod|neon-i8mm|sve|portable)");
                best
            }
        },
        _ => best,
    }
}

static ACTIVE: OnceLock<Numerics> = OnceLock::new();

/// Fixes the profile for this process: `requested` (a command-line or config value) if given, else
/// `LLAMAD_NUMERICS`, else [`detect`]. Returns the profile in force; once one is fixed (by an
/// earlier `init` or [`active`]) later requests change nothing (a differing one is warned about).
pub fn init(requested: Option<&str>) -> Numerics {
    let p = *ACTIVE.get_or_init(|| choose(requested));
    if let Some(r) = requested.and_then(Numerics::parse) {
        if r != p && r.runnable() {
            tracing::warn!(requested = r.name(), active = p.name(), "numerics profile already fixed");
        }
    }
    p
}

/// The profile in force (fixed on first use from `LLAMAD_NUMERICS` or detection if [`init`] was not
/// called).
pub fn active() -> Numerics {
    *ACTIVE.get_or_init(|| choose(None))
}

fn choose(requested: Option<&str>) -> Numerics {
    let p = match requested {
        Some(r) => resolve(Some(r), "--numerics"),
        None => resolve(std::env::var("LLAMAD_NUMERICS").ok().as_deref(), "LLAMAD_NUMERICS"),
    };
    tracing::info!(numerics = p.name(), "numerics profile chosen");
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in ALL {
            assert_eq!(Numerics::parse(p.name()), Some(p));
        }
        assert_eq!(Numerics::parse("AVX2"), None);
        assert_eq!(Numerics::parse("neon"), None);
    }

    #[test]
    fn portable_always_runs_and_unknown_falls_back_to_detection() {
        assert!(Numerics::Portable.runnable());
        assert_eq!(resolve(Some("portable"), "test"), Numerics::Portable);
        assert_eq!(resolve(Some("bogus"), "test"), detect());
        assert_eq!(resolve(None, "test"), detect());
        assert!(detect().runnable());
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x86_detection_follows_the_cpu() {
        // Independent of our own predicates: the features ggml's skylakex/haswell variants require.
        let has512 = ["avx512f", "avx512bw", "avx512vl", "avx512dq"].iter().all(|f| match *f {
            "avx512f" => is_x86_feature_detected!("avx512f"),
            "avx512bw" => is_x86_feature_detected!("avx512bw"),
            "avx512vl" => is_x86_feature_detected!("avx512vl"),
            _ => is_x86_feature_detected!("avx512dq"),
        });
        let has2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        if crate::quant::active_isa() == "scalar" {
            assert_eq!(detect(), Numerics::Portable);
        } else if has512 {
            assert_eq!(detect(), Numerics::Avx512);
        } else if has2 {
            assert_eq!(detect(), Numerics::Avx2);
        }
        assert!(!Numerics::Sve.runnable());
    }
}
