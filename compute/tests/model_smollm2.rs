//! End-to-end check on the real model (ref: ggml-compute-semantics.md §4.11): SmolLM2-135M-Instruct
//! Q4_1, prompt "Hello world, this is" = [19556, 905, 28, 451, 314] (no BOS) → greedy 253 ('Ġa'),
//! then after feeding 253 → 905 ('Ġworld'); logit of 253 ≈ 17.2532 with FA on, 17.4569 with FA off
//! in llama.cpp. The argmaxes must match exactly; the logit within 0.25 (the scalar and NEON kernels,
//! whose summation order differs from the x86 SIMD one, give 17.618 with FA off: 0.161 away; llama.cpp's
//! own FA-on and FA-off values of this logit differ by 0.20). Measured when ops and
//! quant were first joined: 17.186 (FA on) and 17.351 (FA off); over the whole vocabulary against
//! llama-cpp-python 0.3.36 max |Δ| 0.45 / 0.57, correlation 0.9996, same top 5 (FA on) — for
//! scale, llama.cpp's own FA-on and FA-off logits differ by up to 0.45. The graphs themselves are
//! pinned to 1e-4 by the F32-cache tiny-model tests in `model_graphs.rs`.
//!
//! Skipped with a printed reason when the model is absent (`$LLAMAD_MODEL` or `models/`; `scripts/fetch-model.sh`
//! fetches it), unless `LLAMAD_REQUIRE_PEER=1`.

use compute::model::{Model, Session, SessionConfig};

mod peer_support;

/// One executor thread: on the shared 2-core test machine a second spinning thread only waits.
const THREADS: usize = 1;

fn argmax(l: &[f32]) -> u32 {
    (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap() as u32
}

fn run(flash_attn: bool, want_logit: f32) {
    let Some(path) = peer_support::model("smollm2 greedy") else { return };
    // SAFETY: the test does not modify the model file while it is mapped.
    let model = unsafe { Model::open(&path) }.unwrap();
    assert_eq!(model.hp.n_layer, 30);
    assert_eq!(model.hp.n_vocab, 49152);
    let cfg = SessionConfig { n_ctx: 512, flash_attn, n_threads: THREADS, ..SessionConfig::default() };
    let mut s = Session::new(model, cfg).unwrap();
    let logits = s.decode(&[19556, 905, 28, 451, 314]).unwrap().to_vec();
    assert_eq!(logits.len(), 49152);
    assert_eq!(argmax(&logits), 253);
    let l = logits[253];
    // The bound is a sanity check of the whole model against x86 llama.cpp, not a parity test (those
    // are the op differential tests and the interop tests, per numerics profile). On aarch64 the
    // legacy dot products now follow ggml's NEON order and the rest the scalar reference's: 17.192 with
    // FA off there (0.265 away from x86 llama.cpp; 17.618, 0.161 away, before), so aarch64 gets 0.3.
    let bound = if cfg!(target_arch = "aarch64") { 0.3 } else { 0.25 };
    assert!((l - want_logit).abs() < bound, "logit of 253: {l}, llama.cpp {want_logit}");
    let logits = s.decode(&[253]).unwrap().to_vec();
    assert_eq!(argmax(&logits), 905);
    // Graph reuse: further single-token steps build no new graph and allocate no arena.
    let (built, arena) = (s.backend().graphs_built(), s.backend().arena_bytes());
    let t0 = std::time::Instant::now();
    let mut tok = 905;
    for _ in 0..8 {
        tok = argmax(s.decode(&[tok]).unwrap());
    }
    let dt = t0.elapsed();
    assert_eq!(s.backend().graphs_built(), built);
    assert_eq!(s.backend().arena_bytes(), arena);
    eprintln!(
        "fa={flash_attn}: 8 decode steps in {dt:?} ({:.1} tok/s, {THREADS} thread(s)), arena {arena} bytes",
        8.0 / dt.as_secs_f64()
    );
}

#[test]
fn smollm2_greedy_fa_on() {
    run(true, 17.2532);
}

#[test]
fn smollm2_greedy_fa_off() {
    run(false, 17.4569);
}

#[test]
fn smollm2_text_in_text_out() {
    // Text → tokenizer → Session::generate with a greedy sampler → text, as `llamactl run` does.
    let Some(path) = peer_support::model("smollm2_text_in_text_out") else { return };
    // SAFETY: the test does not modify the model file while it is mapped.
    let gguf = std::sync::Arc::new(unsafe { compute::gguf::Gguf::open(&path) }.unwrap());
    let tok = compute::tokenizer::Tokenizer::from_gguf(&gguf).unwrap();
    let prompt = tok.encode("Hello world, this is", tok.add_bos(), false);
    assert_eq!(prompt, vec![19556, 905, 28, 451, 314]);
    let model = Model::new(gguf).unwrap();
    let cfg = SessionConfig { n_ctx: 256, n_threads: THREADS, ..SessionConfig::default() };
    let mut s = Session::new(model, cfg).unwrap();
    let params = compute::sample::SamplerParams { temp: 0.0, ..Default::default() };
    let mut sampler = compute::sample::Sampler::new(params);
    let out = s.generate(&prompt, &mut sampler, 2, |t| tok.is_eog(t), |_| true).unwrap();
    assert_eq!(out, vec![253, 905]);
    assert_eq!(String::from_utf8(tok.decode(&out, false)).unwrap(), " a world");
}
