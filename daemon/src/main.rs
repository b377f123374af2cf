//! The `llamad` binary: parse, init tracing, run.
fn main() {}
