//! Several sequences on the workers (split mode `layer`, [`Pipeline::with_slots`]): the workers' KV
//! caches hold every slot, and [`Pipeline::decode_batch`] decodes chunks of several slots in one
//! ubatch. The oracles: the in-process [`BatchSession`] fed the same chunks (the same logits, bit
//! for bit, the prompt chunks long enough to run as pipelined micro-batches included), and each
//! sequence decoded alone on the same workers (the same greedy tokens).

mod support;

use std::sync::Arc;

use compute::gguf::Gguf;
use compute::model::{BatchSession, Model, SeqChunk, SessionConfig};
use compute::GgmlType;
use llamactl::master::pipeline::{Pipeline, SplitOptions};
use llamactl::master::Forward;
use support::{write_tiny_model, Worker};

const MEM: u64 = 256 << 20;
const N_GEN: usize = 6;

fn cfg() -> SessionConfig {
    SessionConfig {
        n_ctx: 320,
        n_ubatch: 512,
        flash_attn: true,
        kv_type: GgmlType::F16,
        n_threads: 1,
        ..SessionConfig::default()
    }
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32).unwrap()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Graphs each worker computed, from the pipeline's summary lines (`... N graphs (...`).
fn graphs(p: &Pipeline) -> Vec<u64> {
    p.summary()
        .iter()
        .map(|l| l.split(" graphs").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap())
        .collect()
}

#[test]
fn slots_on_workers_decode_as_in_process_and_as_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, 4);
    let model = Model::new(Arc::new(Gguf::read(&path).unwrap())).unwrap();
    let nv = model.hp.n_vocab as usize;
    let workers: Vec<Worker> = (0..2).map(|_| Worker::start(MEM)).collect();
    let addrs: Vec<String> = workers.iter().map(|w| w.addr.clone()).collect();
    let opts = SplitOptions::default();
    let mut piped = Pipeline::with_slots(&model, cfg(), 3, &addrs, &opts, &|_, _| {}).unwrap();
    let mut local = BatchSession::new(model.clone(), cfg(), 3).unwrap();
    let prompt = |n: u32, k: u32| -> Vec<u32> { (0..n).map(|i| (i * k + 3) % nv as u32).collect() };
    // Slot 2's prompt joins two generating slots in a ubatch of 202 tokens: on two workers it runs
    // as three micro-batches, the middle one without any output row of its own.
    let prompts = [prompt(9, 7919), prompt(5, 104_729), prompt(200, 31)];
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); 3];
    let mut next: Vec<Option<u32>> = vec![None; 3];
    for step in 0..N_GEN + 1 {
        let mut chunks: Vec<(usize, Vec<u32>)> = Vec::new();
        for s in 0..3 {
            match next[s] {
                Some(t) => chunks.push((s, vec![t])),
                None if step == 0 && s < 2 || step == 1 && s == 2 => chunks.push((s, prompts[s].clone())),
                None => {}
            }
        }
        let chunks: Vec<SeqChunk<'_>> =
            chunks.iter().map(|(s, t)| SeqChunk { slot: *s, tokens: t }).collect();
        let before = graphs(&piped);
        let a = piped.decode_batch(&chunks).unwrap().to_vec();
        assert_eq!(a.len(), chunks.len() * nv);
        // In-process, the same ubatch whole, or (step 1) its three micro-batches in turn: tokens
        // [0, 67), [67, 134), [134, 202) of the ubatch, each giving the rows of the chunks that end
        // in it (the middle one none).
        let b = if step == 1 {
            let after = graphs(&piped);
            assert_eq!((after[0] - before[0], after[1] - before[1]), (3, 3), "three micro-batches");
            let (t0, t1) = (chunks[0].tokens, chunks[1].tokens);
            let p2 = chunks[2].tokens;
            let first = [
                SeqChunk { slot: 0, tokens: t0 },
                SeqChunk { slot: 1, tokens: t1 },
                SeqChunk { slot: 2, tokens: &p2[..65] },
            ];
            let mut b = local.decode(&first).unwrap()[..2 * nv].to_vec();
            local.decode(&[SeqChunk { slot: 2, tokens: &p2[65..132] }]).unwrap();
            b.extend_from_slice(local.decode(&[SeqChunk { slot: 2, tokens: &p2[132..] }]).unwrap());
            b
        } else {
            local.decode(&chunks).unwrap().to_vec()
        };
        assert!(same_bits(&a, &b), "step {step}: logits on the workers differ from in-process");
        for (row, c) in chunks.iter().enumerate() {
            let t = argmax(&a[row * nv..(row + 1) * nv]);
            if out[c.slot].len() < N_GEN {
                out[c.slot].push(t);
                next[c.slot] = Some(t);
            } else {
                next[c.slot] = None;
            }
        }
        for s in 0..3 {
            assert_eq!(piped.slot_past(s), local.n_past(s), "step {step}, slot {s}");
        }
    }
    // Each sequence alone on the same workers.
    let mut alone = Pipeline::new(&model, cfg(), &addrs, &opts, &|_, _| {}).unwrap();
    for (s, p) in prompts.iter().enumerate() {
        alone.clear().unwrap();
        let mut t = argmax(alone.decode(p).unwrap());
        let mut want = vec![t];
        while want.len() < out[s].len() {
            t = argmax(alone.decode(&[t]).unwrap());
            want.push(t);
        }
        assert_eq!(out[s], want, "slot {s}: batched on workers vs alone");
    }
    // A freed slot takes a new sequence: positions from 0, the old cells never shown.
    piped.clear_slot(1).unwrap();
    let a = piped.decode_batch(&[SeqChunk { slot: 1, tokens: &prompts[0] }]).unwrap();
    assert_eq!(argmax(a), out[0][0], "slot 1 reused for slot 0's prompt");
    assert_eq!(piped.slot_past(1), prompts[0].len() as u64);
}

#[test]
fn bad_batches_on_workers_are_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, 2);
    let model = Model::new(Arc::new(Gguf::read(&path).unwrap())).unwrap();
    let w = Worker::start(MEM);
    let cfg = SessionConfig { n_ctx: 16, n_ubatch: 8, ..cfg() };
    let mut p = Pipeline::with_slots(
        &model,
        cfg,
        2,
        std::slice::from_ref(&w.addr),
        &SplitOptions::default(),
        &|_, _| {},
    )
    .unwrap();
    let nv = model.hp.n_vocab as u32;
    assert!(p.decode_batch(&[]).is_err());
    assert!(p.decode_batch(&[SeqChunk { slot: 2, tokens: &[1] }]).is_err(), "slot out of range");
    assert!(p
        .decode_batch(&[SeqChunk { slot: 0, tokens: &[1] }, SeqChunk { slot: 0, tokens: &[2] }])
        .is_err());
    assert!(p.decode_batch(&[SeqChunk { slot: 1, tokens: &[1; 9] }]).is_err(), "over n_ubatch");
    assert!(p.decode_batch(&[SeqChunk { slot: 1, tokens: &[nv] }]).is_err(), "out of vocabulary");
    assert!(p.clear_slot(2).is_err());
    assert_eq!((p.slot_past(0), p.slot_past(1)), (0, 0));
    assert_eq!(graphs(&p), vec![0], "nothing sent");
    for _ in 0..2 {
        p.decode_batch(&[SeqChunk { slot: 1, tokens: &[1; 8] }]).unwrap();
    }
    assert!(p.decode_batch(&[SeqChunk { slot: 1, tokens: &[1] }]).is_err(), "slot full");
    assert_eq!(p.slot_past(1), 16);
}
