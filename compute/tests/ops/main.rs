//! Op and executor tests: every op × type the target models use against independent f64
//! references, validation of malformed graphs, and thread-count independence.

mod attention;
mod elementwise;
mod graph;
mod harness;
mod matmul;
mod rows;
