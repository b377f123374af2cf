//! The sampling loop over any [`Forward`]: decode the prompt, then sample, accept and decode one
//! token at a time (the same steps as `compute::model::Session::generate`, so a job run on workers
//! samples exactly as one run in-process).

use compute::sample::Sampler;

use crate::error::{err, Context, Result};
use crate::Forward;

/// Decodes `prompt` through `fwd`, then samples up to `max_new` tokens one step at a time. Every
/// prompt and generated token is shown to the sampler's penalty history. Generation stops after an
/// end-of-generation token (`is_eog`, which is still returned but not passed to `on_token`) or when
/// `on_token` returns false. Returns the generated tokens.
pub fn generate(
    fwd: &mut dyn Forward,
    prompt: &[u32],
    sampler: &mut Sampler,
    max_new: usize,
    is_eog: impl Fn(u32) -> bool,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<Vec<u32>> {
    for &t in prompt {
        sampler.accept(t);
    }
    let mut out = Vec::new();
    if max_new == 0 {
        return Ok(out);
    }
    let mut logits = fwd.decode(prompt).context("decoding the prompt")?;
    loop {
        let t = sampler.sample(logits).ok_or_else(|| err!("sampling from empty logits"))?;
        sampler.accept(t);
        out.push(t);
        if is_eog(t) || !on_token(t) || out.len() == max_new {
            break;
        }
        logits = fwd.decode(&[t]).with_context(|| format!("decoding generated token {}", out.len()))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use compute::sample::SamplerParams;

    /// A forward whose logits favour token `(last + 1) % 4`: a known sequence to sample greedily.
    struct Counter {
        n_past: u64,
        logits: Vec<f32>,
        decoded: Vec<Vec<u32>>,
    }

    impl Forward for Counter {
        fn decode(&mut self, tokens: &[u32]) -> Result<&[f32]> {
            self.decoded.push(tokens.to_vec());
            self.n_past += tokens.len() as u64;
            let next = (tokens[tokens.len() - 1] + 1) % 4;
            self.logits = (0..4).map(|i| if i == next { 1.0 } else { 0.0 }).collect();
            Ok(&self.logits)
        }
        fn n_past(&self) -> u64 {
            self.n_past
        }
        fn clear(&mut self) -> Result<()> {
            self.n_past = 0;
            Ok(())
        }
    }

    fn greedy() -> Sampler {
        let p = SamplerParams { temp: 0.0, ..SamplerParams::default() };
        Sampler::new(p)
    }

    #[test]
    fn stops_at_max_at_eog_and_when_told() {
        let mut f = Counter { n_past: 0, logits: Vec::new(), decoded: Vec::new() };
        let out = generate(&mut f, &[0], &mut greedy(), 5, |_| false, |_| true).unwrap();
        assert_eq!(out, vec![1, 2, 3, 0, 1]);
        // The prompt once, then every generated token but the last.
        assert_eq!(f.decoded, vec![vec![0], vec![1], vec![2], vec![3], vec![0]]);

        let mut f = Counter { n_past: 0, logits: Vec::new(), decoded: Vec::new() };
        let mut seen = Vec::new();
        let out = generate(
            &mut f,
            &[1],
            &mut greedy(),
            9,
            |t| t == 3,
            |t| {
                seen.push(t);
                true
            },
        )
        .unwrap();
        assert_eq!((out, seen), (vec![2, 3], vec![2]), "the end token is returned, not reported");

        let mut f = Counter { n_past: 0, logits: Vec::new(), decoded: Vec::new() };
        let out = generate(&mut f, &[1], &mut greedy(), 9, |_| false, |t| t != 3).unwrap();
        assert_eq!(out, vec![2, 3]);
        assert_eq!(f.n_past, 2, "no decode after on_token said stop");
    }
}
