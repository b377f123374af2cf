//! The sampler chain against hand-computed distributions (ref: ggml-compute-semantics.md §7).

use std::collections::VecDeque;

use compute::model::{MemWeights, MetaValue};
use compute::sample::{
    dist, greedy, min_p, penalties, top_k, top_p, Candidate, Mt19937, Sampler, SamplerParams, UserSampling,
};

fn cands(logits: &[f32]) -> Vec<Candidate> {
    logits.iter().enumerate().map(|(i, &l)| Candidate { id: i as u32, logit: l }).collect()
}

fn ids(c: &[Candidate]) -> Vec<u32> {
    c.iter().map(|c| c.id).collect()
}

fn ln(p: &[f64]) -> Vec<f32> {
    p.iter().map(|x| x.ln() as f32).collect()
}

#[test]
fn mt19937_matches_the_standard_sequence() {
    // std::mt19937 default seed 5489: first output 3499211612, 10000th output 4123659995.
    let mut r = Mt19937::new(5489);
    assert_eq!(r.next_u32(), 3_499_211_612);
    for _ in 1..9999 {
        r.next_u32();
    }
    assert_eq!(r.next_u32(), 4_123_659_995);
    let mut r = Mt19937::new(1);
    for _ in 0..1000 {
        let u = r.next_f64();
        assert!((0.0..1.0).contains(&u));
    }
}

#[test]
fn penalties_divide_positive_and_multiply_negative_logits() {
    let mut c = cands(&[2.0, -1.0, 3.0, 0.5]);
    let hist: VecDeque<u32> = [0, 1, 1].into_iter().collect();
    let p = SamplerParams {
        penalty_repeat: 2.0,
        penalty_freq: 0.25,
        penalty_present: 0.5,
        ..SamplerParams::default()
    };
    penalties(&mut c, &hist, &p);
    // token 0: 2/2 - 1*0.25 - 0.5 = 0.25; token 1: -1*2 - 2*0.25 - 0.5 = -3; others unchanged.
    let l: Vec<f32> = c.iter().map(|c| c.logit).collect();
    assert_eq!(l, vec![0.25, -3.0, 3.0, 0.5]);
}

#[test]
fn greedy_with_zero_temperature_respects_penalties() {
    let p = SamplerParams { temp: 0.0, penalty_repeat: 2.0, seed: 1, ..SamplerParams::default() };
    let mut s = Sampler::new(p);
    assert_eq!(s.sample(&[1.0, 3.0, 2.0]), Some(1));
    s.accept(1);
    // 3 / 2 = 1.5 < 2.0 now.
    assert_eq!(s.sample(&[1.0, 3.0, 2.0]), Some(2));
    assert_eq!(greedy(&cands(&[5.0, 5.0, 1.0])), Some(0), "ties go to the first token");
}

#[test]
fn logit_bias_comes_before_the_penalties_and_bans_with_minus_infinity() {
    // Greedy, no penalties: the bias decides alone (the argmax fast path).
    let mut s = Sampler::new(SamplerParams {
        temp: 0.0,
        logit_bias: vec![(1, f32::NEG_INFINITY)],
        ..SamplerParams::default()
    });
    assert_eq!(s.sample(&[1.0, 3.0, 2.0]), Some(2));
    s.set_logit_bias(vec![(0, 5.0), (99, 100.0)]);
    assert_eq!(s.sample(&[1.0, 3.0, 2.0]), Some(0), "ids past the logits are ignored");
    // With the repetition penalty: token 0 was seen. Bias first (llama.cpp's order):
    // (1.0 + 0.8) / 2 = 0.9 < 1.2, so token 1; the other order would give 0.5 + 0.8 = 1.3 > 1.2.
    let p = SamplerParams {
        temp: 0.0,
        penalty_repeat: 2.0,
        logit_bias: vec![(0, 0.8)],
        ..SamplerParams::default()
    };
    let mut s = Sampler::new(p);
    s.accept(0);
    assert_eq!(s.sample(&[1.0, 1.2]), Some(1));
    // Sampling at a temperature never draws a banned token.
    let p = SamplerParams {
        seed: 7,
        temp: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        logit_bias: vec![(2, f32::NEG_INFINITY)],
        ..SamplerParams::default()
    };
    let mut s = Sampler::new(p);
    for _ in 0..200 {
        assert_ne!(s.sample(&[0.0, 0.1, 5.0, 0.2]), Some(2));
    }
}

#[test]
fn top_k_keeps_the_k_best_sorted() {
    let mut c = cands(&[0.1, 2.0, -1.0, 1.5, 1.9]);
    top_k(&mut c, 3, 1);
    assert_eq!(ids(&c), vec![1, 4, 3]);
    let mut c = cands(&[0.1, 2.0]);
    top_k(&mut c, 0, 1);
    assert_eq!(ids(&c), vec![0, 1], "k = 0 disables");
}

#[test]
fn top_k_equals_a_full_sort_then_truncate() {
    // Many ties (logits on a coarse grid), a -inf and a NaN-free vocabulary-sized input: the
    // selection must give exactly the prefix of the full (logit desc, id asc) sort.
    let mut r = Mt19937::new(7);
    let logits: Vec<f32> = (0..5000)
        .map(|i| if i == 17 { f32::NEG_INFINITY } else { (r.next_u32() % 64) as f32 / 8.0 - 4.0 })
        .collect();
    let mut full = cands(&logits);
    full.sort_by(|a, b| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id)));
    for (k, min_keep) in [(1, 1), (40, 1), (40, 100), (4999, 1), (5000, 1), (9000, 1)] {
        let mut c = cands(&logits);
        top_k(&mut c, k, min_keep);
        let n = (k as usize).max(min_keep).min(logits.len());
        assert_eq!(c, full[..n].to_vec(), "k {k} min_keep {min_keep}");
    }
}

#[test]
fn top_p_keeps_the_shortest_prefix_reaching_p() {
    let probs = [0.05, 0.5, 0.15, 0.3];
    let mut c = cands(&ln(&probs));
    top_p(&mut c, 0.75, 1);
    assert_eq!(ids(&c), vec![1, 3], "0.5 + 0.3 >= 0.75");
    let mut c = cands(&ln(&probs));
    top_p(&mut c, 0.81, 1);
    assert_eq!(ids(&c), vec![1, 3, 2]);
    let mut c = cands(&ln(&probs));
    top_p(&mut c, 0.1, 3);
    assert_eq!(ids(&c), vec![1, 3, 2], "min_keep");
}

#[test]
fn min_p_drops_tokens_below_p_times_the_best() {
    let probs = [0.04, 0.5, 0.3, 0.1, 0.06];
    let mut c = cands(&ln(&probs));
    min_p(&mut c, 0.1, 1);
    // threshold 0.05: keeps 0.5, 0.3, 0.1, 0.06.
    assert_eq!(ids(&c), vec![1, 2, 3, 4]);
    let mut c = cands(&ln(&probs));
    min_p(&mut c, 0.5, 1);
    assert_eq!(ids(&c), vec![1, 2]);
}

#[test]
fn dist_picks_by_cumulative_probability() {
    let c = cands(&ln(&[0.25, 0.5, 0.25]));
    assert_eq!(dist(&c, 0.0), Some(0));
    assert_eq!(dist(&c, 0.24), Some(0));
    assert_eq!(dist(&c, 0.26), Some(1));
    assert_eq!(dist(&c, 0.74), Some(1));
    assert_eq!(dist(&c, 0.76), Some(2));
}

#[test]
fn full_chain_draws_match_the_truncated_tempered_distribution() {
    // logits with probabilities ∝ [8, 4, 2, 1, 0.01]; top_k 4 drops the last; min_p 0.1 keeps all
    // four (1/8 ≥ 0.1); top_p 0.99 keeps all four; temperature 0.5 squares the ratios:
    // ∝ [64, 16, 4, 1] / 85.
    let logits = ln(&[8.0, 4.0, 2.0, 1.0, 0.01]);
    let p =
        SamplerParams { seed: 42, top_k: 4, top_p: 0.99, min_p: 0.1, temp: 0.5, ..SamplerParams::default() };
    let mut s = Sampler::new(p);
    let n = 40_000;
    let mut counts = [0usize; 5];
    for _ in 0..n {
        counts[s.sample(&logits).unwrap() as usize] += 1;
    }
    let want = [64.0 / 85.0, 16.0 / 85.0, 4.0 / 85.0, 1.0 / 85.0, 0.0];
    for (c, w) in counts.iter().zip(want) {
        let f = *c as f64 / n as f64;
        assert!((f - w).abs() < 0.01, "frequency {f} vs {w}: {counts:?}");
    }
    // Same seed, same draws.
    let mut a = Sampler::new(SamplerParams { seed: 7, ..SamplerParams::default() });
    let mut b = Sampler::new(SamplerParams { seed: 7, ..SamplerParams::default() });
    let flat = vec![0.0f32; 50];
    let da: Vec<_> = (0..20).map(|_| a.sample(&flat)).collect();
    let db: Vec<_> = (0..20).map(|_| b.sample(&flat)).collect();
    assert_eq!(da, db);
    assert!(da.iter().collect::<std::collections::HashSet<_>>().len() > 5);
}

#[test]
fn model_sampling_metadata_overrides_defaults_not_user_values() {
    let mut m = MemWeights::new();
    m.set_meta("general.sampling.top_k", MetaValue::Int(20));
    m.set_meta("general.sampling.temp", MetaValue::Float(0.6));
    m.set_meta("general.sampling.top_p", MetaValue::Float(0.9));
    let user = UserSampling { temp: Some(1.2), ..UserSampling::default() };
    let p = SamplerParams::resolve(&user, Some(&m)).unwrap();
    assert_eq!(p.top_k, 20);
    assert!((p.top_p - 0.9).abs() < 1e-6);
    assert_eq!(p.temp, 1.2);
    assert_eq!(p.min_p, 0.05);
    assert_eq!(p.penalty_repeat, 1.0);
    let d = SamplerParams::resolve(&UserSampling::default(), None).unwrap();
    assert_eq!(d, SamplerParams::default());
    assert_eq!((d.top_k, d.top_p, d.min_p, d.temp, d.penalty_last_n), (40, 0.95, 0.05, 0.8, 64));
}

#[test]
fn greedy_without_penalties_is_the_first_highest_logit() {
    // The sampler's shortcut (no candidate list) against `greedy` over the candidates and a
    // hand-picked answer: ties go to the lower id, -inf and a NaN after the maximum lose.
    let p = SamplerParams { temp: 0.0, penalty_repeat: 1.0, seed: 1, ..SamplerParams::default() };
    let mut s = Sampler::new(p);
    let logits = [1.0, 3.5, -2.0, 3.5, f32::NEG_INFINITY, f32::NAN, 0.0];
    assert_eq!(s.sample(&logits), Some(1));
    assert_eq!(greedy(&cands(&logits)), Some(1));
    assert_eq!(s.sample(&[]), None);
    let mut r = Mt19937::new(7);
    for n in [1usize, 2, 17, 49_152] {
        // Few distinct values, so ties are frequent.
        let logits: Vec<f32> = (0..n).map(|_| (r.next_u32() % 64) as f32 * 0.25 - 8.0).collect();
        let want = (0..n).fold(0, |b, i| if logits[i] > logits[b] { i } else { b }) as u32;
        assert_eq!(s.sample(&logits), Some(want));
        assert_eq!(greedy(&cands(&logits)), Some(want));
    }
}
