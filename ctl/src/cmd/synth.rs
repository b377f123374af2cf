//! `llamactl synth`: writes a synthetic model of any architecture llamactl runs (compute::model::synth).

use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use compute::dtype::ALL_TYPES;
use compute::model::synth::{self, Arch, Experts, Shape, Spec};

use crate::cli::{SynthArgs, UsageError};

pub fn run(a: &SynthArgs) -> Result<()> {
    let wtype = ALL_TYPES
        .iter()
        .copied()
        .find(|t| t.name().eq_ignore_ascii_case(&a.wtype))
        .ok_or_else(|| anyhow!(UsageError(format!("unknown weight type {:?}", a.wtype))))?;
    let base = match Shape::preset(&a.shape) {
        Some(s) => s,
        None if a.shape == "custom" => Shape { embd: 0, ff: 0, heads: 0, kv_heads: 0, layers: 1 },
        None => {
            return Err(anyhow!(UsageError(format!(
                "unknown shape {:?} (1b, 8b, 70b, 405b, custom)",
                a.shape
            ))))
        }
    };
    let shape = Shape {
        embd: a.embd.unwrap_or(base.embd),
        ff: a.ff.unwrap_or(base.ff),
        heads: a.heads.unwrap_or(base.heads),
        kv_heads: a.kv_heads.unwrap_or(base.kv_heads),
        layers: a.layers.unwrap_or(base.layers),
    };
    let tok =
        super::open_gguf(&a.vocab_from, false).with_context(|| format!("{}", a.vocab_from.display()))?;
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let started = Instant::now();
    let arch = Arch::parse(&a.arch).ok_or_else(|| {
        let names: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
        anyhow!(UsageError(format!("unknown architecture {:?} ({})", a.arch, names.join(", "))))
    })?;
    let experts = Experts {
        count: a.experts,
        used: a.experts_used,
        ff: a.expert_ff.unwrap_or(0),
        shared_ff: a.shared_expert_ff.unwrap_or(0),
    };
    let spec = Spec { arch, experts, shape, wtype, seed: a.seed, tokenizer: &tok, threads };
    let w = synth::synthesize(&spec)?;
    w.write_file(&a.output).with_context(|| format!("writing {}", a.output.display()))?;
    let bytes = std::fs::metadata(&a.output).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "llamactl: wrote {} ({} {} layers of {}x{}, {} heads / {} kv, {wtype}): {:.1} MiB in {:.1} s",
        a.output.display(),
        arch.name(),
        shape.layers,
        shape.embd,
        shape.ff,
        shape.heads,
        shape.kv_heads,
        bytes as f64 / (1 << 20) as f64,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
