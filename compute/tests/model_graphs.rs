//! The architecture graphs, checked by interpretation: a tiny random model per architecture is
//! run through the abstract graph (built by `compute::model::arch`, inputs filled by the session
//! code, evaluated by the plain interpreter in `model_support::interp`) for a 6-token prompt and
//! then 3 single-token decode steps (KV-cache reuse), and the logits are compared with the
//! independent f64 forward pass in `model_support::reference`.
//!
//! Bound: max |Δlogit| ≤ 5e-3. The reference stores K/V rounded to f16 like the cache; the
//! remaining differences are f32 storage of intermediates and the f16 rounding of Q (flash
//! attention) or of Q and the softmax output (MUL_MAT against the F16 cache), ~1e-3 on logits of
//! magnitude ~1–3.

mod model_support;

use compute::model::SessionConfig;
use model_support::interp::InterpSession;
use model_support::{max_abs_diff, reference, tiny, Spec};

const BOUND: f64 = 5e-3;

fn check(spec: Spec, flash_attn: bool, n_ubatch: u64) {
    let name = spec.arch;
    let m = tiny(spec, 7);
    let prompt = [3u32, 17, 42, 99, 0, 56];
    let steps = [11u32, 72, 5];
    let all: Vec<u32> = prompt.iter().chain(&steps).copied().collect();
    let want = reference::forward(&m, &all, true);
    let cfg = SessionConfig { n_ctx: 64, n_ubatch, flash_attn, ..SessionConfig::default() };
    let mut s = InterpSession::new(&m.src, cfg);
    let got = s.decode(&prompt);
    let d = max_abs_diff(&got, &want[prompt.len() - 1]);
    eprintln!("{name} fa={flash_attn} ub={n_ubatch}: prompt diff {d:.2e}");
    assert!(d <= BOUND, "{name} fa={flash_attn}: prompt logits differ by {d}");
    let spread = want[prompt.len() - 1].iter().cloned().fold(0.0f64, |a, b| a.max(b.abs()));
    assert!(spread > 0.5, "{name}: degenerate logits (max |logit| {spread})");
    for (i, &t) in steps.iter().enumerate() {
        let got = s.decode(&[t]);
        let d = max_abs_diff(&got, &want[prompt.len() + i]);
        assert!(d <= BOUND, "{name} fa={flash_attn}: step {i} logits differ by {d}");
    }
    assert_eq!(s.n_past, all.len() as u64);
}

#[test]
fn llama_graph_matches_reference_fa_on() {
    check(Spec::llama(), true, 512);
}

#[test]
fn llama_graph_matches_reference_fa_off() {
    check(Spec::llama(), false, 512);
}

#[test]
fn llama_prompt_in_several_ubatches() {
    check(Spec::llama(), true, 4);
}

#[test]
fn qwen2_graph_matches_reference() {
    check(Spec::qwen2(), true, 512);
    check(Spec::qwen2(), false, 512);
}

#[test]
fn qwen3_graph_matches_reference() {
    check(Spec::qwen3(), true, 512);
    check(Spec::qwen3(), false, 512);
}

#[test]
fn gemma3_graph_matches_reference() {
    check(Spec::gemma3(), true, 512);
    check(Spec::gemma3(), false, 512);
}

#[test]
fn moe_graph_matches_reference() {
    check(Spec::qwen3moe(), true, 512);
    check(Spec::qwen3moe(), false, 3);
}
