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

#[test]
fn qwen2moe_shared_expert_graph_matches_reference() {
    check(Spec::qwen2moe(), true, 512);
    check(Spec::qwen2moe(), false, 4);
}

#[test]
fn mistral3_attention_temperature_matches_reference() {
    // 9 positions with period 2: five different temperature factors (1, 1.35, 1.55, 1.69, 1.80).
    check(Spec::mistral3(), true, 512);
    check(Spec::mistral3(), false, 4);
}

#[test]
fn split_layer_ranges_match_the_whole_model() {
    // Three ranges over a 3-layer model: embeddings + layer 0 | layer 1 | layer 2 + head; the
    // hidden state crosses each boundary. Same logits as one graph, and as the reference.
    let m = tiny(Spec { n_layer: 3, ..Spec::qwen3() }, 11);
    let prompt = [1u32, 2, 3, 4, 5];
    let want = reference::forward(&m, &[1, 2, 3, 4, 5, 6], true);
    let cfg = SessionConfig { n_ctx: 32, ..SessionConfig::default() };
    let mut whole = InterpSession::new(&m.src, cfg.clone());
    let mut split = InterpSession::new(&m.src, cfg);
    let a = whole.decode(&prompt);
    let b = split.decode_split(&prompt, &[0..1, 1..2, 2..3]);
    assert_eq!(a, b);
    assert!(max_abs_diff(&b, &want[4]) <= BOUND);
    let b = split.decode_split(&[6], &[0..2, 2..3]);
    assert!(max_abs_diff(&b, &want[5]) <= BOUND);
    // Only the first range reads tokens, only the last has out_ids and the LM head.
    let g0 = &split.graphs[0];
    assert!(g0.tensors().iter().any(|t| t.name == "inp_tokens"));
    assert!(!g0.tensors().iter().any(|t| t.name == "out_ids" || t.name == "result_output"));
    let g1 = &split.graphs[1];
    assert!(g1.tensors().iter().any(|t| t.name == "l_out-0"));
    assert!(!g1.tensors().iter().any(|t| t.name == "inp_tokens"));
}

#[test]
fn llama_graph_has_the_reference_node_sequence() {
    // ref: ggml-compute-semantics.md §4.3: the ops of the first layer (FA on) in llama.cpp's order,
    // as llama.cpp 0.3.36's master sends them (tests/interop/test_graphs.py compares whole graphs):
    // Q is viewed as one stream before its permute.
    use compute::op::GgmlOp::*;
    let m = tiny(Spec::llama(), 1);
    // llama.cpp's rounding of the attended extent (256 cells), for its shapes below.
    let cfg = SessionConfig { n_ctx: 512, kv_pad: 256, ..SessionConfig::default() };
    let mut s = InterpSession::new(&m.src, cfg);
    s.decode(&[1, 2, 3]);
    let g = &s.graphs[0];
    let ops: Vec<_> = g.nodes().iter().map(|&id| g.get(id).op).collect();
    let layer0: Vec<_> = ops.iter().skip(1).take_while(|&&o| o != Add).copied().collect();
    assert_eq!(
        layer0,
        vec![
            RmsNorm,
            Mul,
            MulMat,
            Reshape,
            Rope,
            MulMat,
            Reshape,
            MulMat,
            Reshape,
            Rope,
            View,
            SetRows,
            View,
            SetRows,
            View,
            Permute,
            View,
            Permute,
            View,
            Permute,
            FlashAttnExt,
            Reshape,
            MulMat
        ]
    );
    assert_eq!(ops[0], GetRows);
    // Nkv is padded to 256 (kv_pad) and the mask is F16 [Nkv, T].
    let mask = g.tensors().iter().find(|t| t.name == "attn_inp_kq_mask").unwrap();
    assert_eq!(mask.layout.ne, [256, 3, 1, 1]);
    assert_eq!(mask.layout.dtype, compute::GgmlType::F16);
    let cache = g.tensors().iter().find(|t| t.name == "cache_k_l1").unwrap();
    assert_eq!(cache.layout.ne, [32, 512, 1, 1]);
    assert_eq!(cache.layout.dtype, compute::GgmlType::F16);
    let logits = g.get(*g.nodes().last().unwrap());
    assert_eq!(logits.name, "result_output");
    assert_eq!(logits.layout.ne, [100, 1, 1, 1]);
}

#[test]
fn f32_cache_matches_reference_to_f32_precision() {
    // With an F32 KV cache nothing is rounded to f16 anywhere, so the graph must agree with the
    // f64 reference to f32 storage precision.
    for spec in [Spec::llama(), Spec::gemma3(), Spec::qwen3moe(), Spec::qwen2moe(), Spec::mistral3()] {
        for flash_attn in [true, false] {
            let m = tiny(spec.clone(), 9);
            let toks = [5u32, 6, 7, 8, 9];
            let want = reference::forward(&m, &toks, false);
            let cfg = SessionConfig {
                n_ctx: 16,
                flash_attn,
                kv_type: compute::GgmlType::F32,
                ..SessionConfig::default()
            };
            let mut s = InterpSession::new(&m.src, cfg);
            let got = s.decode(&toks[..4]);
            assert!(max_abs_diff(&got, &want[3]) <= 1e-4, "{} fa={flash_attn}", spec.arch);
            let got = s.decode(&toks[4..]);
            let d = max_abs_diff(&got, &want[4]);
            assert!(d <= 1e-4, "{} fa={flash_attn}: {d}", spec.arch);
        }
    }
}
