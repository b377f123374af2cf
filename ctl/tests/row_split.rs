//! Split mode `row` (tensor parallelism): the logits over two llamad workers stay within a
//! tolerance of the in-process run at every step (the partial sums are added in a different order,
//! so they are not bit-identical), greedy text equals the in-process text where the margins allow,
//! and the splits that cannot work are clear errors.

mod support;

use std::sync::Arc;

use compute::gguf::Gguf;
use compute::model::{Model, Session, SessionConfig};
use compute::tokenizer::Tokenizer;
use compute::GgmlType;
use llamactl::master::pipeline::SplitOptions;
use llamactl::master::tensor_parallel::TensorParallel;
use llamactl::master::Forward;
use support::{llamactl, run_text, smollm2, write_tiny_model_arch, Worker};

const MEM: u64 = 512 << 20;

fn load(path: &std::path::Path) -> Model {
    Model::new(Arc::new(Gguf::read(path).unwrap())).unwrap()
}

fn tokenize(path: &std::path::Path, text: &str) -> Vec<u32> {
    let tok = Tokenizer::from_gguf(&Gguf::read(path).unwrap()).unwrap();
    tok.encode(text, tok.add_bos(), true)
}

fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i).unwrap()
}

/// Feeds `prompt` and then `steps` greedy tokens (chosen by the in-process run) to both engines;
/// at every step the logits, less their mean difference, must agree within `tol` over the whole
/// vocabulary, and the argmax must be the same.
fn compare(
    model: &Model,
    cfg: SessionConfig,
    addrs: &[String],
    weights: &[f64],
    prompt: &[u32],
    steps: usize,
    tol: f32,
) {
    let mut local = Session::new(model.clone(), cfg.clone()).unwrap();
    let opts = SplitOptions { tensor_split: weights.to_vec(), ..SplitOptions::default() };
    let mut tp = TensorParallel::new(model, cfg, addrs, &opts, &|_, _| {}).unwrap();
    let mut want = local.decode(prompt).unwrap().to_vec();
    let mut got = tp.decode(prompt).unwrap().to_vec();
    for step in 0..=steps {
        assert_eq!(got.len(), want.len());
        // Softmax ignores a common shift of all logits, so the shift is taken out first.
        let off = want.iter().zip(&got).map(|(a, b)| b - a).sum::<f32>() / want.len() as f32;
        let diff = want.iter().zip(&got).map(|(a, b)| (b - a - off).abs()).fold(0.0f32, f32::max);
        assert!(diff <= tol, "step {step}: logits differ by {diff} (tolerance {tol})");
        let t = argmax(&want);
        assert_eq!(argmax(&got), t, "step {step}: greedy token differs");
        if step < steps {
            want = local.decode(&[t as u32]).unwrap().to_vec();
            got = tp.decode(&[t as u32]).unwrap().to_vec();
        }
    }
    assert_eq!(tp.n_past(), local.n_past());
}

fn cfg(flash_attn: bool, n_ubatch: u64) -> SessionConfig {
    SessionConfig {
        n_ctx: 256,
        n_ubatch,
        flash_attn,
        kv_type: GgmlType::F16,
        n_threads: 1,
        ..SessionConfig::default()
    }
}

#[test]
fn smollm2_logits_close_to_in_process() {
    let path = smollm2();
    let model = load(&path);
    let (w1, w2) = (Worker::start(MEM), Worker::start(MEM));
    let two = vec![w1.addr.clone(), w2.addr.clone()];
    let prompt = tokenize(&path, "The capital of France is");
    // One worker holding every shard computes exactly what the in-process run does.
    compare(&model, cfg(true, 512), &two[..1], &[], &prompt, 4, 0.0);
    // Two: the partial sums are added here in another order, and a last-bit change of the residual
    // can move a Q8 activation quantum in the next layer. Switching flash attention off moves these
    // logits by up to 0.95 (same measure) in the in-process engine; row split by about as much.
    for fa in [true, false] {
        compare(&model, cfg(fa, 512), &two, &[], &prompt, 12, 1.5);
    }
    // Several ubatches per prompt and an uneven split.
    compare(&model, cfg(true, 2), &two, &[3.0, 1.0], &prompt, 4, 1.5);
}

/// Four workers split SmolLM2's nine query heads 2+3+2+2 over its three KV heads: every worker
/// holds a part of a KV group, attends group by group, and two of them share a KV head.
#[test]
fn four_workers_split_kv_groups() {
    let path = smollm2();
    let model = load(&path);
    let ws: Vec<Worker> = (0..4).map(|_| Worker::start(MEM)).collect();
    let four: Vec<String> = ws.iter().map(|w| w.addr.clone()).collect();
    let prompt = tokenize(&path, "The capital of France is");
    for fa in [true, false] {
        compare(&model, cfg(fa, 512), &four, &[], &prompt, 8, 1.5);
    }
}

#[test]
fn tiny_qwen_and_llama_logits_close_to_in_process() {
    let (w1, w2) = (Worker::start(MEM), Worker::start(MEM));
    let two = vec![w1.addr.clone(), w2.addr.clone()];
    for arch in ["llama", "qwen2", "qwen3"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("{arch}.gguf"));
        write_tiny_model_arch(&path, 3, arch);
        let model = load(&path);
        compare(&model, cfg(true, 512), &two[..1], &[], &[1, 2, 3, 4, 5, 6, 7], 6, 0.0);
        // Quantized weights: the same activation-quantum effect as on SmolLM2, on smaller logits.
        compare(&model, cfg(true, 512), &two, &[], &[1, 2, 3, 4, 5, 6, 7], 6, 0.05);
        compare(&model, cfg(false, 3), &two, &[], &[1, 2, 3, 4, 5, 6, 7], 3, 0.05);
    }
}

#[test]
fn smollm2_greedy_text_equals_in_process() {
    // 12 tokens: later on this continuation has a near tie between two digit tokens ("311" and
    // "321" million) that the reordered sums may break either way.
    let model = smollm2();
    let m = model.to_str().unwrap();
    let base = ["-m", m, "-p", "The capital of France is", "-n", "12", "--temp", "0", "-t", "1", "-c", "256"];
    let local = run_text(&base);
    assert!(local.split_whitespace().count() > 5, "too little text: {local:?}");
    let (w1, w2) = (Worker::start(MEM), Worker::start(MEM));
    let two = format!("{},{}", w1.addr, w2.addr);
    let mut args = base.to_vec();
    args.extend_from_slice(&["--workers", &two, "--split-mode", "row"]);
    assert_eq!(run_text(&args), local);
}

#[test]
fn impossible_splits_are_clear_errors() {
    let model = smollm2();
    let m = model.to_str().unwrap();
    let ws: Vec<Worker> = (0..1).map(|_| Worker::start(MEM)).collect();
    // Nine query heads cannot go to ten devices (the split is planned before any connection).
    let ten = [ws[0].addr.as_str(); 10].join(",");
    let out = llamactl(&["run", "-m", m, "-p", "hi", "-n", "1", "--workers", &ten, "--split-mode", "row"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("query heads") && err.contains("10 devices"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gemma3.gguf");
    write_tiny_model_arch(&path, 2, "gemma3");
    let g = path.to_str().unwrap();
    let out =
        llamactl(&["run", "-m", g, "-p", "hi", "-n", "1", "--workers", &ws[0].addr, "--split-mode", "row"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("row split does not support"), "{err}");
}

/// llamad workers link to each other and exchange the partial sums themselves (one TP_RUN per
/// ubatch); they add them in the same order as the master's relay, so the logits are the same bits
/// at every step, with one ubatch per prompt and with several.
#[test]
fn linked_workers_give_the_relays_logits_bit_for_bit() {
    let path = smollm2();
    let model = load(&path);
    let (w1, w2) = (Worker::start(MEM), Worker::start(MEM));
    let two = vec![w1.addr.clone(), w2.addr.clone()];
    let prompt = tokenize(&path, "The capital of France is");
    for (c, weights) in [(cfg(false, 512), vec![]), (cfg(true, 3), vec![3.0, 1.0])] {
        let linked_opts = SplitOptions { tensor_split: weights.clone(), ..SplitOptions::default() };
        let relay_opts = SplitOptions { no_worker_links: true, ..linked_opts.clone() };
        let mut linked = TensorParallel::new(&model, c.clone(), &two, &linked_opts, &|_, _| {}).unwrap();
        assert!(linked.linked(), "two llamad workers did not link");
        let mut relay = TensorParallel::new(&model, c.clone(), &two, &relay_opts, &|_, _| {}).unwrap();
        assert!(!relay.linked());
        let mut a = linked.decode(&prompt).unwrap().to_vec();
        let mut b = relay.decode(&prompt).unwrap().to_vec();
        for step in 0..8 {
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "step {step}: logits differ");
            let t = argmax(&a) as u32;
            a = linked.decode(&[t]).unwrap().to_vec();
            b = relay.decode(&[t]).unwrap().to_vec();
        }
        // A new sequence after clear() is linked again from position 0.
        linked.clear().unwrap();
        relay.clear().unwrap();
        let (a, b) = (linked.decode(&prompt).unwrap().to_vec(), relay.decode(&prompt).unwrap().to_vec());
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "after clear: logits differ");
    }
}

/// A prompt of at least 128 tokens runs on linked workers as two interleaved streams (the halves of
/// the ubatch as micro-batches, TP_RUN_STREAMS); the logits are the bits of the relay running the
/// same halves as two ubatches, for the prompt and the greedy steps after it, with flash attention
/// on and off and with an uneven split.
#[test]
fn streamed_prompts_give_the_bits_of_two_half_ubatches() {
    let path = smollm2();
    let model = load(&path);
    let (w1, w2) = (Worker::start(MEM), Worker::start(MEM));
    let two = vec![w1.addr.clone(), w2.addr.clone()];
    let prompt =
        tokenize(&path, &"The quick brown fox jumps over the lazy dog, and then it runs. ".repeat(12));
    assert!((128..=256).contains(&prompt.len()), "{} tokens", prompt.len());
    let half = prompt.len().div_ceil(2) as u64;
    for (fa, weights) in [(false, vec![]), (true, vec![3.0, 1.0])] {
        let linked_opts = SplitOptions { tensor_split: weights.clone(), ..SplitOptions::default() };
        let relay_opts = SplitOptions { no_worker_links: true, ..linked_opts.clone() };
        let c = |n_ubatch| SessionConfig { n_ctx: 512, ..cfg(fa, n_ubatch) };
        let mut linked = TensorParallel::new(&model, c(512), &two, &linked_opts, &|_, _| {}).unwrap();
        assert!(linked.linked() && linked.streams(), "two llamad workers did not link with streams");
        let mut relay = TensorParallel::new(&model, c(half), &two, &relay_opts, &|_, _| {}).unwrap();
        let mut a = linked.decode(&prompt).unwrap().to_vec();
        let mut b = relay.decode(&prompt).unwrap().to_vec();
        for step in 0..4 {
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "fa {fa}, step {step}: logits differ"
            );
            let t = argmax(&a) as u32;
            a = linked.decode(&[t]).unwrap().to_vec();
            b = relay.decode(&[t]).unwrap().to_vec();
        }
        assert!(
            linked.summary()[0].contains(&format!("{} phases", 2 * 61 + 4 * 61)),
            "{:?}",
            linked.summary()
        );
    }
}

/// A prompt of several streamed ubatches: each attends a longer KV extent than the one before, so
/// both streams' compute buffers grow, and growing the second stream's once dropped the graphs the
/// first stream had just stored on the worker (the worker refused `EXT_TP_RUN` of a slot never
/// stored: every prompt longer than one ubatch failed in split mode row). The logits are the bits of
/// the relay running the halves as ubatches of their own, for the prompt and greedy steps after it.
#[test]
fn streamed_prompts_of_several_ubatches_give_the_bits_of_half_ubatches() {
    let path = smollm2();
    let model = load(&path);
    let (w1, w2) = (Worker::start(MEM), Worker::start(MEM));
    let two = vec![w1.addr.clone(), w2.addr.clone()];
    let mut prompt =
        tokenize(&path, &"The quick brown fox jumps over the lazy dog, and then it runs. ".repeat(24));
    assert!(prompt.len() >= 256, "{} tokens", prompt.len());
    // Two ubatches of 128 (each two streams of 64); the relay runs ubatches of 64.
    prompt.truncate(256);
    let relay_opts = SplitOptions { no_worker_links: true, ..SplitOptions::default() };
    let c = |n_ubatch| SessionConfig { n_ctx: 512, ..cfg(false, n_ubatch) };
    let mut linked = TensorParallel::new(&model, c(128), &two, &SplitOptions::default(), &|_, _| {}).unwrap();
    assert!(linked.linked() && linked.streams(), "two llamad workers did not link with streams");
    let mut relay = TensorParallel::new(&model, c(64), &two, &relay_opts, &|_, _| {}).unwrap();
    let mut a = linked.decode(&prompt).unwrap().to_vec();
    let mut b = relay.decode(&prompt).unwrap().to_vec();
    for step in 0..3 {
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "step {step}: logits differ");
        let t = argmax(&a) as u32;
        a = linked.decode(&[t]).unwrap().to_vec();
        b = relay.decode(&[t]).unwrap().to_vec();
    }
    assert_eq!(linked.n_past(), 256 + 3);
}
