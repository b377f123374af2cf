//! Op and executor tests: every op × type the target models use against independent f64
//! references, validation of malformed graphs, and thread-count independence.

mod attention;
mod coverage;
mod elementwise;
mod encoder;
mod fuzz;
mod graph;
mod harness;
mod llama;
mod matmul;
mod recurrent;
mod rows;
