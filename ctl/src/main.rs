//! The `llamactl` binary.
fn main() {}
