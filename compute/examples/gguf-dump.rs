//! Lists the metadata and tensors of a GGUF file: `cargo run -p compute --example gguf-dump -- FILE`.

use anyhow::Context;
use compute::gguf::Gguf;

fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).context("usage: gguf-dump FILE")?;
    // SAFETY: the file is only read while this short-lived process runs; we do not modify it.
    let g = unsafe { Gguf::open(&path) }.with_context(|| format!("opening {path}"))?;
    println!("{path}: GGUF v{}, alignment {}, data at {}", g.version(), g.alignment(), g.data_offset());
    println!("{} metadata pairs:", g.metadata().len());
    for (k, v) in g.metadata() {
        println!("  {k:<48} {:<4} {v}", v.value_type().name());
    }
    println!("{} tensors:", g.tensors().len());
    let mut counts = std::collections::BTreeMap::new();
    for t in g.tensors() {
        *counts.entry(t.dtype().name()).or_insert(0usize) += 1;
        println!(
            "  {:<40} {:<6} {:?} offset {} size {}",
            t.name,
            t.dtype().name(),
            t.shape(),
            t.offset,
            t.size
        );
    }
    println!("types: {counts:?}");
    Ok(())
}
