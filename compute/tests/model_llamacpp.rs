//! Tiny random models against llama.cpp itself: the model is written by our GGUF writer (with a
//! minimal SentencePiece vocabulary so llama.cpp loads it), llama.cpp 0.3.36 (the reference peer,
//! `tests/interop/ref_master.py` with `token_prompts`) evaluates a 9-token prompt and returns the
//! logits at every position, and `Session::decode_all` must give the same logits. This checks what
//! the f64 reference cannot: that our reading of the GGUF keys, the tensor roles and the graph agree
//! with llama.cpp's for the architectures added after the SmolLM2 parity work (Qwen2-MoE with its
//! shared expert, Mistral 3 with the attention temperature and with YaRN's `yarn_log_multiplier`).
//!
//! Both sides keep K/V in F16 and compute in f32 from F32 weights. Measured max |Δlogit| on logits
//! of magnitude ~1–3 (FA off / on): llama 0, qwen2moe 3.0e-7 / 2.4e-7 (2.3e-5 / 4.8e-7 before its
//! shared-expert gate became llama.cpp's silu(x)/x), mistral3 0 / 0, so the dense
//! models are asserted bit-identical and qwen2moe within 1e-4; a wrong key, role or op moves them by
//! 0.05 or more (measured: the temperature with offset 1 instead of 0 differs by 0.097).
//!
//! Needs the peer's Python (`$LLAMAD_PEER_PYTHON`, else the default AVX2 venv of
//! `tests/peer/build-peer.sh`); fails when it is absent.

mod model_support;

use std::path::Path;
use std::process::Command;

use compute::gguf::{Array, Value};
use compute::model::{MetaValue, Model, Session, SessionConfig};
use compute::GgmlType;
use model_support::{gguf_writer_typed, max_abs_diff, reference, tiny, Spec, Tiny};

const PROMPT: [u32; 9] = [1, 17, 42, 99, 5, 56, 11, 72, 5];

mod peer_support;

/// Writes `m` as a GGUF llama.cpp can load: a SentencePiece vocabulary of `vocab` tokens (unknown,
/// BOS, EOS, the newline byte, then plain pieces).
fn write_model(m: &Tiny, path: &Path) {
    write_model_typed(m, path, None);
}

/// As [`write_model`], with every matrix in `weights` (see `gguf_writer_typed`).
fn write_model_typed(m: &Tiny, path: &Path, weights: Option<GgmlType>) {
    // Quantizing fixes the kernel table: reproduce the peer's build from the start.
    peer_support::align();
    let mut w = gguf_writer_typed(&m.src, weights);
    let n = m.spec.vocab;
    let tokens: Vec<String> = (0..n)
        .map(|i| match i {
            0 => "<unk>".into(),
            1 => "<s>".into(),
            2 => "</s>".into(),
            3 => "<0x0A>".into(),
            _ => format!("\u{2581}t{i}"),
        })
        .collect();
    let types: Vec<i32> = (0..n).map(|i| [2, 3, 3, 6].get(i).copied().unwrap_or(1)).collect();
    let scores: Vec<f32> = (0..n).map(|i| -(i as f32)).collect();
    w.add("tokenizer.ggml.model", "llama");
    w.add_strings("tokenizer.ggml.tokens", &tokens);
    w.add("tokenizer.ggml.scores", Value::Array(Array::F32(scores)));
    w.add("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    w.write_file(path).unwrap();
}

/// llama.cpp's logits at every position of `tokens` (CPU, one thread, F16 KV cache); `None` (the test
/// is skipped, with a printed reason) without the reference peer, unless `LLAMAD_REQUIRE_PEER=1`.
fn llamacpp_logits(model: &Path, tokens: &[u32], flash_attn: bool) -> Option<Vec<Vec<f32>>> {
    let python = peer_support::python("llama.cpp's logits")?;
    let dir = tempfile::tempdir().unwrap();
    let args = serde_json::json!({
        "model": model, "flash_attn": flash_attn, "n_ctx": 64, "n_threads": 1, "verbose": false,
        "token_prompts": [tokens], "logits_dir": dir.path(),
    });
    let args_path = dir.path().join("args.json");
    std::fs::write(&args_path, args.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/interop/ref_master.py");
    let out =
        Command::new(python).arg(&script).arg(&args_path).arg(dir.path().join("out.json")).output().unwrap();
    assert!(out.status.success(), "ref_master.py failed: {}", String::from_utf8_lossy(&out.stderr));
    let rows = read_npy_f32_2d(&dir.path().join("logits-0.npy"));
    assert_eq!(rows.len(), tokens.len());
    Some(rows)
}

/// Reads a little-endian f32 2-D `.npy` file (format versions 1–3, C order).
fn read_npy_f32_2d(path: &Path) -> Vec<Vec<f32>> {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..6], b"\x93NUMPY", "not an npy file");
    let (hlen, start) = if b[6] == 1 {
        (u16::from_le_bytes([b[8], b[9]]) as usize, 10)
    } else {
        (u32::from_le_bytes(b[8..12].try_into().unwrap()) as usize, 12)
    };
    let header = std::str::from_utf8(&b[start..start + hlen]).unwrap();
    assert!(header.contains("'descr': '<f4'") && header.contains("'fortran_order': False"), "{header}");
    let shape = &header[header.find("'shape': (").unwrap() + 10..];
    let dims: Vec<usize> =
        shape[..shape.find(')').unwrap()].split(',').filter_map(|s| s.trim().parse().ok()).collect();
    assert_eq!(dims.len(), 2, "{header}");
    let data: Vec<f32> =
        b[start + hlen..].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(data.len(), dims[0] * dims[1]);
    data.chunks_exact(dims[1]).map(<[f32]>::to_vec).collect()
}

/// Our logits at every position, and the largest difference from llama.cpp's (also checked: the
/// f64 reference agrees with both, so a shared misreading cannot pass).
fn compare(spec: Spec, seed: u64, flash_attn: bool) -> Option<f64> {
    let name = spec.arch;
    let m = tiny(spec, seed);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{name}.gguf"));
    write_model(&m, &path);
    let theirs = llamacpp_logits(&path, &PROMPT, flash_attn)?;
    // SAFETY: the file is not modified while mapped.
    let model = unsafe { Model::open(&path) }.unwrap();
    let cfg = SessionConfig { n_ctx: 64, flash_attn, n_threads: 1, ..SessionConfig::default() };
    let mut s = Session::new(model, cfg).unwrap();
    let ours = s.decode_all(&PROMPT).unwrap().to_vec();
    let want = reference::forward(&m, &PROMPT, true);
    let mut worst: f64 = 0.0;
    for (i, (row, theirs)) in ours.chunks_exact(m.spec.vocab).zip(&theirs).enumerate() {
        let t: Vec<f64> = theirs.iter().map(|&x| x as f64).collect();
        let d = max_abs_diff(row, &t);
        let dr = max_abs_diff(theirs, &want[i]);
        assert!(dr <= 5e-3, "{name} fa={flash_attn} position {i}: llama.cpp vs the f64 reference {dr}");
        worst = worst.max(d);
    }
    eprintln!("{name} fa={flash_attn}: max |Δlogit| vs llama.cpp {worst:.2e}");
    Some(worst)
}

#[test]
fn qwen2moe_with_shared_expert_matches_llamacpp() {
    for fa in [false, true] {
        let Some(d) = compare(Spec::qwen2moe(), 31, fa) else { return };
        assert!(d <= 1e-4, "qwen2moe fa={fa}: {d}");
    }
}

#[test]
fn mistral3_attention_temperature_matches_llamacpp() {
    for fa in [false, true] {
        let Some(d) = compare(Spec::mistral3(), 32, fa) else { return };
        assert!(d == 0.0, "mistral3 fa={fa}: {d}");
    }
}

#[test]
fn llama_tiny_model_matches_llamacpp() {
    // The control: the architecture whose parity is established on SmolLM2.
    let Some(d) = compare(Spec { tied: false, ..Spec::llama() }, 33, false) else { return };
    assert!(d == 0.0, "llama: {d}");
}

#[test]
fn llama_sliding_window_key_is_ignored_like_llamacpp() {
    // Mistral-family GGUFs of the `llama` arch (Mistral 7B, Ministral 8B, Devstral Small 1.x) may
    // carry `llama.attention.sliding_window`; llama.cpp's llama graph attends to the whole context
    // regardless, and so do we (a window of 3 would hide keys from positions 3 to 8).
    let mut m = tiny(Spec { tied: false, ..Spec::llama() }, 35);
    m.src.set_meta("llama.attention.sliding_window", MetaValue::Int(3));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("llama-swa.gguf");
    write_model(&m, &path);
    let Some(theirs) = llamacpp_logits(&path, &PROMPT, false) else { return };
    let want = reference::forward(&m, &PROMPT, true);
    for (i, th) in theirs.iter().enumerate() {
        let d = max_abs_diff(th, &want[i]);
        assert!(d <= 5e-3, "position {i}: llama.cpp vs the full-attention reference {d}");
    }
    // SAFETY: the file is not modified while mapped.
    let model = unsafe { Model::open(&path) }.unwrap();
    let cfg = SessionConfig { n_ctx: 64, flash_attn: false, n_threads: 1, ..SessionConfig::default() };
    let ours = Session::new(model, cfg).unwrap().decode_all(&PROMPT).unwrap().to_vec();
    for (row, th) in ours.chunks_exact(m.spec.vocab).zip(&theirs) {
        let t: Vec<f64> = th.iter().map(|&x| x as f64).collect();
        assert!(max_abs_diff(row, &t) <= 5e-3);
    }
}

#[test]
fn mistral3_yarn_log_multiplier_matches_llamacpp() {
    // Ministral 3 / Devstral 2 style: YaRN (factor 4 here) with `yarn_log_multiplier`, which sets
    // RoPE's attn_factor (hparams::mistral3_yarn_attn_factor). The f64 reference has no YaRN, so
    // llama.cpp is the only judge here. Measured: 0 for each multiplier (FA off); with the factor
    // left at 1 the logits differ by 0.13 (0.5), 0.25 (1.0).
    for lm in [0.5, 1.0, 2.0] {
        let mut m = tiny(Spec::mistral3(), 34);
        m.src.set_meta("mistral3.rope.scaling.type", MetaValue::Str("yarn".into()));
        m.src.set_meta("mistral3.rope.scaling.factor", MetaValue::Float(4.0));
        m.src.set_meta("mistral3.rope.scaling.yarn_log_multiplier", MetaValue::Float(lm));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mistral3-yarn.gguf");
        write_model(&m, &path);
        let Some(theirs) = llamacpp_logits(&path, &PROMPT, false) else { return };
        // SAFETY: the file is not modified while mapped.
        let model = unsafe { Model::open(&path) }.unwrap();
        let cfg = SessionConfig { n_ctx: 64, flash_attn: false, n_threads: 1, ..SessionConfig::default() };
        let ours = Session::new(model, cfg).unwrap().decode_all(&PROMPT).unwrap().to_vec();
        let mut worst: f64 = 0.0;
        for (row, th) in ours.chunks_exact(m.spec.vocab).zip(&theirs) {
            let t: Vec<f64> = th.iter().map(|&x| x as f64).collect();
            worst = worst.max(max_abs_diff(row, &t));
        }
        eprintln!("mistral3 yarn log_mul {lm}: max |Δlogit| vs llama.cpp {worst:.2e}");
        assert!(worst == 0.0, "log_mul {lm}: {worst}");
    }
}

#[test]
fn every_weight_type_matches_llamacpp() {
    // The llama tiny model with its matrices in each weight type ggml's CPU backend multiplies
    // (E = 256 and F = 512 so that every block size fits; the grid IQ types get valid random blocks
    // of the same size, having no quantizer). Both sides quantize activations the same way and sum
    // each block in integers, so the logits differ only by float summation order between blocks.
    // Measured logits NMSE: 0 to 3e-14 for 23 types; BF16 1.9e-7, Q8_0 2.5e-6, IQ1_M 5.6e-5, Q1_0
    // 7.0e-5 (see below). A wrong dequantization or dot product gives NMSE of order 1e-2 or more.
    use GgmlType::*;
    let spec = Spec { tied: false, e: 256, h: 4, hkv: 2, d: 64, f: 512, ..Spec::llama() };
    let m = tiny(spec, 36);
    let dir = tempfile::tempdir().unwrap();
    let (mut report, mut bad) = (Vec::new(), Vec::new());
    for ty in [
        F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, IQ2_XXS,
        IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0,
    ] {
        let path = dir.path().join(format!("llama-{ty}.gguf"));
        write_model_typed(&m, &path, Some(ty));
        let Some(theirs) = llamacpp_logits(&path, &PROMPT, false) else { return };
        // SAFETY: the file is not modified while mapped.
        let model = unsafe { Model::open(&path) }.unwrap();
        let cfg = SessionConfig { n_ctx: 64, flash_attn: false, n_threads: 2, ..SessionConfig::default() };
        let ours = Session::new(model, cfg).unwrap().decode_all(&PROMPT).unwrap().to_vec();
        let (mut worst, mut peak, mut err2, mut sig2) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        for (row, th) in ours.chunks_exact(m.spec.vocab).zip(&theirs) {
            let t: Vec<f64> = th.iter().map(|&x| x as f64).collect();
            worst = worst.max(max_abs_diff(row, &t));
            peak = t.iter().fold(peak, |p, x| p.max(x.abs()));
            err2 += row.iter().zip(&t).map(|(&a, &b)| (a as f64 - b).powi(2)).sum::<f64>();
            sig2 += t.iter().map(|b| b * b).sum::<f64>();
        }
        let nmse = err2 / sig2;
        assert!(peak.is_finite() && peak > 0.0, "{ty}: llama.cpp's logits are degenerate ({peak})");
        report.push(format!("{ty} {nmse:.1e} ({:.1e})", worst / peak));
        // These stay within ggml's own MUL_MAT bound (NMSE 5e-4) but not near 0, every other type
        // within 1e-12. BF16, Q8_0, IQ1_M, Q1_0: not isolated yet; each op of these types matches
        // llama.cpp's RPC server (the differential op tests, GET_ROWS bit for bit, MUL_MAT within
        // summation order), and IQ1_M experts through llama.cpp's master over llamad match llama.cpp's
        // local CPU to 1e-13 (tests/tests/families.rs), so it lies in this in-process path (issue 25).
        // IQ3_XXS: with AVX-512 VNNI the 9-token prompt runs on packed panels (quant::panel), which
        // round per 16-element sub-block where ggml's AVX2 build rounds per block (8.2e-5 here; 1e-14
        // with the AVX2 set); this tiny random model amplifies that, as it does IQ1_M's.
        // Q4_0 the other way round: llama.cpp's local CPU repacks Q4_0 weights (its CPU_REPACK
        // buffer, 8-row GEMM with one fma per block: the panels' order, 7e-15 with them), while the
        // ggml numerics profiles (avx2, avx512) drop the panels to follow llama.cpp's RPC server,
        // which multiplies unpacked weights (vec_dot / tinyBLAS): 1.2e-5 here.
        let panel_rounding = ty == IQ3_XXS && compute::quant::kernels(ty).panel.is_some();
        let no_repack = ty == Q4_0 && compute::quant::kernels(ty).panel.is_none();
        let loose = matches!(ty, BF16 | Q8_0 | IQ1_M | Q1_0) || panel_rounding || no_repack;
        let bound = if loose { 5e-4 } else { 1e-12 };
        if nmse > bound {
            bad.push(format!("{ty}: logits NMSE {nmse:.2e} > {bound:.0e} (max |Δ| {worst} of {peak})"));
        }
    }
    eprintln!("logits NMSE (max |Δ|/max |logit|) vs llama.cpp per weight type: {}", report.join(", "));
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
