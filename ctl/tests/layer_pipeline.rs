//! Split mode `layer` with prompt pipelining: a ubatch of 128 tokens or more on two or more workers
//! runs as micro-batches in a wavefront (worker `w` computes micro-batch `s - w` at step `s`). Its
//! logits must be the bits of the same micro-batches decoded one after another, for the prompt and
//! the generation steps after it, and each worker must have computed one graph per micro-batch.

mod support;

use std::sync::Arc;

use compute::gguf::Gguf;
use compute::model::{Model, SessionConfig};
use compute::GgmlType;
use llamactl::master::pipeline::{Pipeline, SplitOptions};
use llamactl::master::Forward;
use support::{write_tiny_model, Worker};

const MEM: u64 = 256 << 20;

fn cfg(flash_attn: bool) -> SessionConfig {
    SessionConfig {
        n_ctx: 1024,
        n_ubatch: 512,
        flash_attn,
        kv_type: GgmlType::F16,
        n_threads: 1,
        ..SessionConfig::default()
    }
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32).unwrap()
}

/// Graphs each worker computed, from the pipeline's summary lines (`... N graphs (...`).
fn graphs(p: &Pipeline) -> Vec<u64> {
    p.summary()
        .iter()
        .map(|l| {
            let before = l.split(" graphs").next().unwrap();
            before.rsplit(' ').next().unwrap().parse().unwrap()
        })
        .collect()
}

#[test]
fn pipelined_prompts_give_the_bits_of_their_micro_batches_in_turn() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, 6);
    let model = Model::new(Arc::new(Gguf::read(&path).unwrap())).unwrap();
    let n_vocab = model.hp.n_vocab as u32;
    let workers: Vec<Worker> = (0..3).map(|_| Worker::start(MEM)).collect();
    // (workers, prompt length, micro-batches the wavefront must use: min(n / 64, 4 per worker))
    for (k, n, m, fa, split) in [
        (2, 256, 4, false, vec![]),
        (2, 300, 4, true, vec![]),
        (3, 200, 3, false, vec![]),
        (2, 512, 8, false, vec![2.0, 1.0]),
    ] {
        let addrs: Vec<String> = workers[..k].iter().map(|w| w.addr.clone()).collect();
        let opts = SplitOptions { tensor_split: split.clone(), ..SplitOptions::default() };
        let mut piped = Pipeline::new(&model, cfg(fa), &addrs, &opts, &|_, _| {}).unwrap();
        let mut turns = Pipeline::new(&model, cfg(fa), &addrs, &opts, &|_, _| {}).unwrap();
        let prompt: Vec<u32> = (0..n as u32).map(|i| (i * 7919 + 13) % n_vocab).collect();
        let mut a = piped.decode(&prompt).unwrap().to_vec();
        assert_eq!(graphs(&piped), vec![m as u64; k], "k {k}, n {n}: one graph per micro-batch per worker");
        // The same micro-batches, each too short to be pipelined itself, decoded in turn.
        let mut b = Vec::new();
        for i in 0..m {
            b = turns.decode(&prompt[i * n / m..(i + 1) * n / m]).unwrap().to_vec();
        }
        assert_eq!(graphs(&turns), vec![m as u64; k]);
        for step in 0..4 {
            assert_eq!(a.len(), b.len());
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "k {k}, n {n}, fa {fa}, step {step}: logits differ"
            );
            let t = argmax(&a);
            a = piped.decode(&[t]).unwrap().to_vec();
            b = turns.decode(&[t]).unwrap().to_vec();
        }
        assert_eq!(piped.n_past(), n as u64 + 4);
    }
}

/// Below two micro-batches' worth of tokens, or with one worker, a ubatch runs whole: one graph per
/// worker.
#[test]
fn short_prompts_and_single_workers_run_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, 4);
    let model = Model::new(Arc::new(Gguf::read(&path).unwrap())).unwrap();
    let (w1, w2) = (Worker::start(MEM), Worker::start(MEM));
    let prompt: Vec<u32> = (0..127).map(|i| (i * 31 + 5) % model.hp.n_vocab as u32).collect();
    let two = [w1.addr.clone(), w2.addr.clone()];
    let mut p = Pipeline::new(&model, cfg(false), &two, &SplitOptions::default(), &|_, _| {}).unwrap();
    p.decode(&prompt).unwrap();
    assert_eq!(graphs(&p), vec![1, 1]);
    let one = [w1.addr.clone()];
    let mut p = Pipeline::new(&model, cfg(false), &one, &SplitOptions::default(), &|_, _| {}).unwrap();
    p.decode(&[prompt.clone(), prompt].concat()).unwrap();
    assert_eq!(graphs(&p), vec![1]);
}
