//! Token sampling: llama.cpp's default sampler chain (ref: ggml-compute-semantics.md §7).
//!
//! Order: logit bias → penalties → top_k → top_p → min_p → temperature → dist. With `temp <= 0` the
//! temperature stage keeps only the highest logit, so sampling is greedy. The random draw uses an
//! MT19937 seeded with the seed (a `seed` of `u32::MAX` means "pick one at random") and
//! `u ∈ [0, 1)` built from two 32-bit draws as libstdc++'s `generate_canonical<double>` does.
//!
//! Model-recommended values (`general.sampling.*` in the GGUF) replace the defaults for every
//! parameter the user did not set ([`SamplerParams::resolve`]).

use std::collections::VecDeque;

use crate::error::Result;
use crate::model::weights::{MetaExt, WeightSource};

/// The sampler's parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerParams {
    /// RNG seed; `u32::MAX` = random.
    pub seed: u32,
    /// Keep the k highest logits (≤ 0 disables).
    pub top_k: i32,
    /// Nucleus threshold (≥ 1 disables).
    pub top_p: f32,
    /// Minimum probability relative to the best token (≤ 0 disables).
    pub min_p: f32,
    /// Temperature (≤ 0 = greedy).
    pub temp: f32,
    /// Tokens of history the penalties look at (0 disables, -1 = all).
    pub penalty_last_n: i32,
    /// Repetition penalty (1 = off).
    pub penalty_repeat: f32,
    /// Frequency penalty (0 = off).
    pub penalty_freq: f32,
    /// Presence penalty (0 = off).
    pub penalty_present: f32,
    /// Each truncating stage keeps at least this many candidates (0 behaves as 1).
    pub min_keep: usize,
    /// Added to the logits before every other stage (llama.cpp's logit-bias sampler heads its
    /// chain): token id, bias. Minus infinity on the end-of-generation tokens is llama.cpp's
    /// `--ignore-eos`. Ids outside the logits are ignored.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplerParams {
    /// llama.cpp's `common_params_sampling` defaults (ref §7).
    fn default() -> Self {
        SamplerParams {
            seed: u32::MAX,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            temp: 0.80,
            penalty_last_n: 64,
            penalty_repeat: 1.0,
            penalty_freq: 0.0,
            penalty_present: 0.0,
            min_keep: 0,
            logit_bias: Vec::new(),
        }
    }
}

/// The parameters a user set explicitly (`None` = not given).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UserSampling {
    /// Seed.
    pub seed: Option<u32>,
    /// top_k.
    pub top_k: Option<i32>,
    /// top_p.
    pub top_p: Option<f32>,
    /// min_p.
    pub min_p: Option<f32>,
    /// Temperature.
    pub temp: Option<f32>,
    /// penalty_last_n.
    pub penalty_last_n: Option<i32>,
    /// Repetition penalty.
    pub penalty_repeat: Option<f32>,
    /// Frequency penalty.
    pub penalty_freq: Option<f32>,
    /// Presence penalty.
    pub penalty_present: Option<f32>,
}

impl SamplerParams {
    /// User values, else the model's `general.sampling.*`, else the defaults.
    pub fn resolve(user: &UserSampling, model: Option<&dyn WeightSource>) -> Result<SamplerParams> {
        let d = SamplerParams::default();
        let mi = |k: &str| -> Result<Option<i32>> {
            match model {
                Some(m) => match m.meta(&format!("general.sampling.{k}")) {
                    Some(crate::model::MetaValue::Int(v)) => Ok(i32::try_from(v).ok()),
                    _ => Ok(None),
                },
                None => Ok(None),
            }
        };
        let mf = |k: &str| -> Result<Option<f32>> {
            match model {
                Some(m) => m.meta_f32(&format!("general.sampling.{k}")).or(Ok(None)),
                None => Ok(None),
            }
        };
        Ok(SamplerParams {
            seed: user.seed.unwrap_or(d.seed),
            top_k: user.top_k.or(mi("top_k")?).unwrap_or(d.top_k),
            top_p: user.top_p.or(mf("top_p")?).unwrap_or(d.top_p),
            min_p: user.min_p.or(mf("min_p")?).unwrap_or(d.min_p),
            temp: user.temp.or(mf("temp")?).unwrap_or(d.temp),
            penalty_last_n: user.penalty_last_n.or(mi("penalty_last_n")?).unwrap_or(d.penalty_last_n),
            penalty_repeat: user.penalty_repeat.or(mf("penalty_repeat")?).unwrap_or(d.penalty_repeat),
            penalty_freq: user.penalty_freq.unwrap_or(d.penalty_freq),
            penalty_present: user.penalty_present.unwrap_or(d.penalty_present),
            min_keep: d.min_keep,
            logit_bias: Vec::new(),
        })
    }
}

/// MT19937 (32-bit Mersenne Twister), as `std::mt19937`.
#[derive(Clone)]
pub struct Mt19937 {
    mt: [u32; 624],
    idx: usize,
}

impl Mt19937 {
    /// Seeded like `std::mt19937(seed)`.
    pub fn new(seed: u32) -> Mt19937 {
        let mut mt = [0u32; 624];
        mt[0] = seed;
        for i in 1..624 {
            mt[i] = 1_812_433_253u32.wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_add(i as u32);
        }
        Mt19937 { mt, idx: 624 }
    }

    /// The next 32-bit output.
    pub fn next_u32(&mut self) -> u32 {
        if self.idx >= 624 {
            for i in 0..624 {
                let y = (self.mt[i] & 0x8000_0000) | (self.mt[(i + 1) % 624] & 0x7fff_ffff);
                let mut v = self.mt[(i + 397) % 624] ^ (y >> 1);
                if y & 1 != 0 {
                    v ^= 0x9908_b0df;
                }
                self.mt[i] = v;
            }
            self.idx = 0;
        }
        let mut y = self.mt[self.idx];
        self.idx += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// `u ∈ [0, 1)` from two draws (libstdc++ `generate_canonical<double, 53>`).
    pub fn next_f64(&mut self) -> f64 {
        let lo = self.next_u32() as f64;
        let hi = self.next_u32() as f64;
        let u = (lo + hi * 4_294_967_296.0) / 18_446_744_073_709_551_616.0;
        if u >= 1.0 {
            1.0 - f64::EPSILON / 2.0
        } else {
            u
        }
    }
}

/// One candidate token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// Token id.
    pub id: u32,
    /// Its (modified) logit.
    pub logit: f32,
}

/// The sampler chain with its RNG and penalty history.
pub struct Sampler {
    p: SamplerParams,
    rng: Mt19937,
    history: VecDeque<u32>,
    cand: Vec<Candidate>,
    /// The logits with the bias added (reused between calls).
    biased: Vec<f32>,
}

impl Sampler {
    /// A sampler with `p`.
    pub fn new(p: SamplerParams) -> Sampler {
        let seed = if p.seed == u32::MAX { random_seed() } else { p.seed };
        Sampler { rng: Mt19937::new(seed), p, history: VecDeque::new(), cand: Vec::new(), biased: Vec::new() }
    }

    /// Replaces the logit bias ([`SamplerParams::logit_bias`]).
    pub fn set_logit_bias(&mut self, bias: Vec<(u32, f32)>) {
        self.p.logit_bias = bias;
    }

    /// The parameters.
    pub fn params(&self) -> &SamplerParams {
        &self.p
    }

    /// Records a token (prompt or generated) for the penalties.
    pub fn accept(&mut self, token: u32) {
        let n = self.p.penalty_last_n;
        if n == 0 {
            return;
        }
        self.history.push_back(token);
        if n > 0 {
            while self.history.len() > n as usize {
                self.history.pop_front();
            }
        }
    }

    /// Picks the next token from `logits` (one per vocabulary entry). Does not [`accept`](Self::accept) it.
    pub fn sample(&mut self, logits: &[f32]) -> Option<u32> {
        if self.p.logit_bias.is_empty() {
            return self.sample_chain(logits);
        }
        let mut biased = std::mem::take(&mut self.biased);
        biased.clear();
        biased.extend_from_slice(logits);
        for &(id, b) in &self.p.logit_bias {
            if let Some(l) = biased.get_mut(id as usize) {
                *l += b;
            }
        }
        let t = self.sample_chain(&biased);
        self.biased = biased;
        t
    }

    /// The chain after the logit bias.
    fn sample_chain(&mut self, logits: &[f32]) -> Option<u32> {
        if self.p.temp <= 0.0 && !penalties_active(&self.p) {
            // Greedy without penalties: the logits as they are decide, no candidate list needed.
            return argmax(logits);
        }
        self.cand.clear();
        self.cand.extend(logits.iter().enumerate().map(|(i, &l)| Candidate { id: i as u32, logit: l }));
        if self.cand.is_empty() {
            return None;
        }
        penalties(&mut self.cand, &self.history, &self.p);
        if self.p.temp <= 0.0 {
            return greedy(&self.cand);
        }
        let min_keep = self.p.min_keep.max(1);
        top_k(&mut self.cand, self.p.top_k, min_keep);
        top_p(&mut self.cand, self.p.top_p, min_keep);
        min_p(&mut self.cand, self.p.min_p, min_keep);
        for c in &mut self.cand {
            c.logit /= self.p.temp;
        }
        dist(&self.cand, self.rng.next_f64())
    }
}

fn random_seed() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0),
    );
    (h.finish() as u32).min(u32::MAX - 1)
}

/// Whether [`penalties`] changes any logit with `p`.
fn penalties_active(p: &SamplerParams) -> bool {
    p.penalty_last_n != 0 && (p.penalty_repeat != 1.0 || p.penalty_freq != 0.0 || p.penalty_present != 0.0)
}

/// Repetition, frequency and presence penalties over the tokens in `history` (ref §7).
pub fn penalties(cand: &mut [Candidate], history: &VecDeque<u32>, p: &SamplerParams) {
    if !penalties_active(p) {
        return;
    }
    let mut counts = std::collections::HashMap::<u32, u32>::new();
    for &t in history {
        *counts.entry(t).or_default() += 1;
    }
    for c in cand.iter_mut() {
        let Some(&n) = counts.get(&c.id) else { continue };
        if c.logit <= 0.0 {
            c.logit *= p.penalty_repeat;
        } else {
            c.logit /= p.penalty_repeat;
        }
        c.logit -= n as f32 * p.penalty_freq + p.penalty_present;
    }
}

/// The highest logit (first on ties).
pub fn greedy(cand: &[Candidate]) -> Option<u32> {
    let mut best: Option<Candidate> = None;
    for &c in cand {
        if best.is_none_or(|b| c.logit > b.logit) {
            best = Some(c);
        }
    }
    best.map(|c| c.id)
}

/// The index of the highest logit (first on ties), as [`greedy`] over unmodified candidates.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map(|(i, _)| i as u32)
}

/// The candidates' order: higher logit first, then lower id (a total order, so every sort and
/// selection below gives one answer).
fn desc(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

fn sort_desc(cand: &mut [Candidate]) {
    cand.sort_by(desc);
}

/// Keeps the `k` highest logits, sorted descending (`k <= 0` disables).
///
/// The `k` best are selected in linear time and only they are sorted: sorting the whole
/// vocabulary (49 152 candidates for SmolLM2) cost milliseconds per token. The order is total,
/// so the result equals sorting everything and truncating.
pub fn top_k(cand: &mut Vec<Candidate>, k: i32, min_keep: usize) {
    if k <= 0 {
        return;
    }
    let keep = (k as usize).max(min_keep);
    if keep < cand.len() {
        cand.select_nth_unstable_by(keep - 1, desc);
        cand.truncate(keep);
    }
    sort_desc(cand);
}

fn softmax(cand: &[Candidate]) -> Vec<f64> {
    let max = cand.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = cand.iter().map(|c| ((c.logit - max) as f64).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

/// Keeps the shortest most-probable prefix with cumulative probability ≥ `p` (`p >= 1` disables).
pub fn top_p(cand: &mut Vec<Candidate>, p: f32, min_keep: usize) {
    if p >= 1.0 || cand.is_empty() {
        return;
    }
    sort_desc(cand);
    let probs = softmax(cand);
    let mut cum = 0.0;
    let mut keep = cand.len();
    for (i, pr) in probs.iter().enumerate() {
        cum += pr;
        if cum >= p as f64 && i + 1 >= min_keep {
            keep = i + 1;
            break;
        }
    }
    cand.truncate(keep);
}

/// Keeps tokens with `logit >= max_logit + ln(p)` (`p <= 0` disables).
pub fn min_p(cand: &mut Vec<Candidate>, p: f32, min_keep: usize) {
    if p <= 0.0 || cand.is_empty() {
        return;
    }
    let max = cand.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max);
    let thr = max + p.ln();
    sort_desc(cand);
    let keep = cand.iter().take_while(|c| c.logit >= thr).count().max(min_keep).min(cand.len());
    cand.truncate(keep);
}

/// Draws from the softmax of the candidates with `u ∈ [0, 1)`: the first token whose cumulative
/// probability exceeds `u · Σp` (so a zero-probability token is never drawn).
pub fn dist(cand: &[Candidate], u: f64) -> Option<u32> {
    let probs = softmax(cand);
    let total: f64 = probs.iter().sum();
    let target = u * total;
    let mut cum = 0.0;
    for (c, p) in cand.iter().zip(&probs) {
        cum += p;
        if cum > target {
            return Some(c.id);
        }
    }
    cand.last().map(|c| c.id)
}
