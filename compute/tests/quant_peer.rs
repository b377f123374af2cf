//! Every quantized type against ggml itself (the reference peer's libggml, through
//! `data/quant_ref.py`): dequantization bit for bit on random blocks, dot products against the
//! type's `vec_dot_type` within float summation order, and quantization (the CPU backend's
//! `from_float`, which CPY and SET_ROWS use) byte for byte. The scalar kernels are the
//! specification and are checked here; the active SIMD set is checked too (it is what llamad runs).

use std::path::{Path, PathBuf};
use std::process::Command;

use compute::quant::{dispatch, kernels, TypeKernels};
use compute::GgmlType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod peer_support;

use GgmlType::*;

/// Every quantized type ggml's CPU backend can dequantize (all but the activation formats).
const WEIGHT_TYPES: [GgmlType; 27] = [
    Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL,
    IQ3_S, IQ2_S, IQ4_XS, IQ1_M, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0, F16, BF16,
];

/// Byte offsets of each block's f16 scale fields (kept finite and small in random blocks).
fn f16_fields(t: GgmlType) -> &'static [usize] {
    match t {
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        TQ1_0 => &[52],
        TQ2_0 => &[64],
        MXFP4 | NVFP4 | IQ1_M | F16 | BF16 => &[],
        _ => &[0],
    }
}

/// A random row of `nb` valid blocks of `t`.
fn random_blocks(t: GgmlType, nb: usize, rng: &mut StdRng) -> Vec<u8> {
    let size = t.type_size();
    let mut v = vec![0u8; nb * size];
    rng.fill(&mut v[..]);
    for b in v.chunks_exact_mut(size) {
        for &o in f16_fields(t) {
            let x: f32 = rng.random_range(0.001..0.05) * if rng.random::<bool>() { 1.0 } else { -1.0 };
            b[o..o + 2].copy_from_slice(&half::f16::from_f32(x).to_le_bytes());
        }
        match t {
            // Shared exponents near 1 (2^-8 .. 2^8).
            MXFP4 => b[0] = rng.random_range(120..136),
            // The f16 scale's top nibble is bits 12..15 of the fourth scale word: no Inf/NaN.
            IQ1_M => b[QK_K_IQ1M_SCALE_HI] &= !0x40,
            _ => {}
        }
    }
    if matches!(t, F16 | BF16) {
        for (i, x) in v.chunks_exact_mut(2).enumerate() {
            let f = ((i * 7919) % 1000) as f32 / 500.0 - 1.0;
            let bits =
                if t == F16 { half::f16::from_f32(f).to_bits() } else { half::bf16::from_f32(f).to_bits() };
            x.copy_from_slice(&bits.to_le_bytes());
        }
    }
    v
}

/// IQ1_M: the byte holding bits 8..15 of the last scale word (bit 6 there is the f16's bit 14).
const QK_K_IQ1M_SCALE_HI: usize = 32 + 16 + 7;

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Jobs for `quant_ref.py`, run in one process.
struct Jobs {
    dir: PathBuf,
    lines: Vec<String>,
}

impl Jobs {
    fn new(name: &str) -> Jobs {
        let dir = std::env::temp_dir().join(format!("llamad-quant-peer-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Jobs { dir, lines: Vec::new() }
    }

    fn file(&self, name: &str, data: &[u8]) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, data).unwrap();
        p
    }

    fn out(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn push(&mut self, parts: &[&dyn std::fmt::Display]) {
        self.lines.push(parts.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(" "));
    }

    fn run(&self, python: &Path) {
        let jobs = self.file("jobs.txt", self.lines.join("\n").as_bytes());
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/quant_ref.py");
        let out = Command::new(python).arg(script).arg(jobs).output().expect("run quant_ref.py");
        assert!(out.status.success(), "quant_ref.py failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.out(name)).unwrap()
    }
}

impl Drop for Jobs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The kernel tables to check: the scalar specification and the set llamad would run.
fn tables() -> Vec<(&'static str, &'static TypeKernels, GgmlType)> {
    let _ = dispatch::table();
    WEIGHT_TYPES.iter().map(|&t| (t.name(), kernels(t), t)).collect()
}

const N: usize = 1024;

#[test]
fn dequantization_equals_ggml_bit_for_bit() {
    let Some(python) = peer_support::python("quantized dequantization against ggml") else { return };
    let mut rng = StdRng::seed_from_u64(24);
    let mut jobs = Jobs::new("deq");
    let mut rows = Vec::new();
    for &t in &WEIGHT_TYPES {
        let nb = N / t.blck_size();
        let raw = random_blocks(t, nb, &mut rng);
        let inp = jobs.file(&format!("{}.in", t.name()), &raw);
        let out = jobs.out(&format!("{}.out", t.name()));
        jobs.push(&[&"to_float", &(t as u32), &N, &inp.display(), &out.display()]);
        rows.push((t, raw));
    }
    jobs.run(&python);
    let scalar = dispatch::Kernels::build(dispatch::Isa::Scalar);
    let mut bad = Vec::new();
    for (t, raw) in rows {
        let want = floats(&jobs.read(&format!("{}.out", t.name())));
        for (set, k) in [("scalar", scalar.get(t)), ("active", kernels(t))] {
            let to = k.to_f32.unwrap_or_else(|| panic!("{}: no to_f32", t.name()));
            let mut got = vec![0f32; N];
            to(&raw, &mut got);
            if let Some(i) = (0..N).find(|&i| got[i].to_bits() != want[i].to_bits()) {
                bad.push(format!("{} ({set}): element {i}: {} vs ggml {}", t.name(), got[i], want[i]));
            }
        }
    }
    assert!(bad.is_empty(), "dequantization differs from ggml:\n{}", bad.join("\n"));
}

#[test]
fn dot_products_agree_with_ggml() {
    let Some(python) = peer_support::python("quantized dot products against ggml") else { return };
    let mut rng = StdRng::seed_from_u64(2424);
    let mut jobs = Jobs::new("dot");
    let mut rows = Vec::new();
    for (name, k, t) in tables() {
        let nb = N / t.blck_size();
        let x = random_blocks(t, nb, &mut rng);
        let act: Vec<f32> = (0..N).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let vdt = k.vec_dot_type;
        let from = kernels(vdt).from_f32.expect("activation quantizer");
        let mut y = vec![0u8; vdt.row_size(N as u64).unwrap() as usize];
        from(&act, &mut y);
        let xf = jobs.file(&format!("{name}.x"), &x);
        let yf = jobs.file(&format!("{name}.y"), &y);
        let out = jobs.out(&format!("{name}.dot"));
        jobs.push(&[&"vec_dot", &(t as u32), &N, &xf.display(), &yf.display(), &out.display()]);
        // The magnitude the sum's rounding is relative to.
        let mut xd = vec![0f32; N];
        (k.to_f32.unwrap())(&x, &mut xd);
        let mut yd = vec![0f32; N];
        (kernels(vdt).to_f32.unwrap())(&y, &mut yd);
        let scale: f32 = xd.iter().zip(&yd).map(|(a, b)| (a * b).abs()).sum();
        rows.push((t, x, y, scale));
    }
    jobs.run(&python);
    let scalar = dispatch::Kernels::build(dispatch::Isa::Scalar);
    let mut bad = Vec::new();
    for (t, x, y, scale) in rows {
        let want = floats(&jobs.read(&format!("{}.dot", t.name())))[0];
        for (set, k) in [("scalar", scalar.get(t)), ("active", kernels(t))] {
            let dot = k.vec_dot.unwrap_or_else(|| panic!("{}: no vec_dot", t.name()));
            let got = dot(N, &x, &y);
            if (got - want).abs() > 1e-5 * scale.max(1e-6) {
                bad.push(format!("{} ({set}): {got} vs ggml {want} (Σ|xy| = {scale})", t.name()));
            }
        }
    }
    assert!(bad.is_empty(), "dot products differ from ggml:\n{}", bad.join("\n"));
}

/// The types ggml's CPU backend quantizes into (CPY and SET_ROWS destinations).
const QUANTIZE_TYPES: [GgmlType; 20] = [
    Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4, NVFP4,
    Q1_0, Q2_0, F16, BF16,
];

#[test]
fn quantization_equals_ggml_byte_for_byte() {
    let Some(python) = peer_support::python("quantizers against ggml") else { return };
    let mut rng = StdRng::seed_from_u64(242424);
    let mut jobs = Jobs::new("q");
    let mut rows = Vec::new();
    // Gaussian-ish values with a few outliers and an all-zero block, as activations and KV rows are.
    let n = 4096;
    for &t in &QUANTIZE_TYPES {
        let mut x: Vec<f32> = (0..n)
            .map(|_| {
                let s: f32 = (0..4).map(|_| rng.random_range(-1.0f32..1.0)).sum();
                s * if rng.random_range(0..50) == 0 { 8.0 } else { 1.0 }
            })
            .collect();
        // Not the row's first blocks: ggml's IQ4_NL writes an all-zero group with the previous
        // group's indices, and the first group of a row has none (uninitialized memory in ggml).
        x[256..512].fill(0.0);
        let inp = jobs.file(&format!("{}.f32", t.name()), &f32_bytes(&x));
        let out = jobs.out(&format!("{}.q", t.name()));
        jobs.push(&[&"from_float", &(t as u32), &n, &inp.display(), &out.display()]);
        rows.push((t, x));
    }
    jobs.run(&python);
    let scalar = dispatch::Kernels::build(dispatch::Isa::Scalar);
    let mut bad = Vec::new();
    for (t, x) in rows {
        let want = jobs.read(&format!("{}.q", t.name()));
        for (set, k) in [("scalar", scalar.get(t)), ("active", kernels(t))] {
            let Some(from) = k.from_f32 else {
                bad.push(format!("{} ({set}): no quantizer", t.name()));
                continue;
            };
            let mut got = vec![0u8; want.len()];
            from(&x, &mut got);
            if got != want {
                let size = t.type_size();
                let blocks = (0..want.len() / size)
                    .filter(|&b| got[b * size..(b + 1) * size] != want[b * size..(b + 1) * size])
                    .count();
                bad.push(format!("{} ({set}): {blocks} of {} blocks differ", t.name(), want.len() / size));
            }
        }
    }
    assert!(bad.is_empty(), "quantizers differ from ggml's:\n{}", bad.join("\n"));
}

/// Speed of the dot products of the IQ/TQ types against ggml's own (the peer's CPU backend, built
/// for AVX2), same run: nanoseconds per 256-element block over a row of 2048 blocks, best of 200
/// calls. Run by `bench/iq-dots.sh` (`cargo test --release --test quant_peer -- --ignored
/// --nocapture bench_`); prints the table, asserts nothing about time.
#[test]
#[ignore]
fn bench_iq_tq_dots_against_ggml() {
    let Some(python) = peer_support::python("IQ/TQ dot speeds") else { return };
    let types = [IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, IQ4_XS, IQ4_NL, TQ1_0, TQ2_0, Q4_K];
    let nb = 2048usize;
    let n = nb * 256;
    let mut rng = StdRng::seed_from_u64(99);
    let mut jobs = Jobs::new("bench");
    let mut rows = Vec::new();
    for &t in &types {
        let x = random_blocks(t, n / t.blck_size(), &mut rng);
        let act: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let vdt = kernels(t).vec_dot_type;
        let mut y = vec![0u8; vdt.row_size(n as u64).unwrap() as usize];
        (kernels(vdt).from_f32.unwrap())(&act, &mut y);
        let (xf, yf) = (jobs.file(&format!("{}.x", t.name()), &x), jobs.file(&format!("{}.y", t.name()), &y));
        let out = jobs.out(&format!("{}.t", t.name()));
        jobs.push(&[&"bench_dot", &(t as u32), &n, &xf.display(), &yf.display(), &out.display(), &200]);
        rows.push((t, x, y));
    }
    jobs.run(&python);
    let scalar = dispatch::Kernels::build(dispatch::Isa::Scalar);
    let time = |f: compute::quant::VecDotFn, x: &[u8], y: &[u8]| {
        let mut best = f64::INFINITY;
        for _ in 0..200 {
            let t0 = std::time::Instant::now();
            std::hint::black_box(f(n, std::hint::black_box(x), std::hint::black_box(y)));
            best = best.min(t0.elapsed().as_secs_f64());
        }
        best
    };
    eprintln!(
        "ns per 256-element block (row of {nb} blocks, best of 200), llamad kernel set: {}",
        dispatch::table().isa().name()
    );
    eprintln!(
        "{:<8} {:>10} {:>12} {:>12} {:>14}",
        "type", "ggml", "ours scalar", "ours active", "ggml / ours"
    );
    for (t, x, y) in rows {
        let ggml: f64 =
            std::fs::read_to_string(jobs.out(&format!("{}.t", t.name()))).unwrap().trim().parse().unwrap();
        let s = time(scalar.get(t).vec_dot.unwrap(), &x, &y);
        let a = time(kernels(t).vec_dot.unwrap(), &x, &y);
        let per = |v: f64| v * 1e9 * (256.0 / t.blck_size() as f64) / (n / t.blck_size()) as f64;
        eprintln!("{:<8} {:>10.1} {:>12.1} {:>12.1} {:>14.2}", t.name(), per(ggml), per(s), per(a), ggml / a);
    }
}
