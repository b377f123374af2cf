//! The cases: one builder per op/type/shape/input-form, each with the bound it must meet.
//!
//! Shapes are small (cheap in a debug-free release run) but keep SmolLM2's where a case stands for a
//! llama graph node (E=576, H=9, Hkv=3, D=64, F=1536; ref: ggml-compute-semantics.md §4.3, §4.4).
//! Bounds (see [`Bound`]): [`EXACT`] where our AVX2 kernels are designed to reproduce ggml's AVX2
//! arithmetic bit for bit (tests/interop/README.md) or the op is a pure IEEE computation; otherwise
//! the documented numeric difference (float summation order, libm versus ggml's vector functions,
//! f16 accumulation in flash attention) with a margin far below what a wrong layout, broadcast or
//! parameter gives (NMSE 1e-3 .. 1).

mod attention;
mod binary;
mod hyper;
mod matmul;
mod misc;
mod moves;
mod norm;
mod recurrent;
mod rows;
mod unary;

use compute::GgmlType;
use rand::rngs::StdRng;

use super::compare::Bound;
use super::data;
use super::graph::{Graph, Id};
use super::{Error, Result};

/// Bit-identical results.
pub const EXACT: Bound = Bound::EXACT;
/// Float summation order only (dot products, sums over rows).
pub const ORDER: Bound = Bound::close(1e-10, 1e-4);
/// Elementwise functions through libm versus ggml's vector functions (about one ulp).
pub const ULP: Bound = Bound::close(1e-12, 1e-5);

/// Builds a case's graph from its seeded generator.
pub type Build = Box<dyn Fn(&mut StdRng) -> Result<Graph> + Send + Sync>;

/// One differential test case.
pub struct Case {
    /// Unique name: `op/type/shape/form`.
    pub name: String,
    /// The op family (summary row).
    pub op: &'static str,
    /// What llamad's result must meet.
    pub bound: Bound,
    /// The graph builder.
    pub build: Build,
}

/// Every case.
pub fn all() -> Vec<Case> {
    let mut v = Vec::new();
    matmul::cases(&mut v);
    rows::cases(&mut v);
    binary::cases(&mut v);
    unary::cases(&mut v);
    norm::cases(&mut v);
    attention::cases(&mut v);
    misc::cases(&mut v);
    moves::cases(&mut v);
    recurrent::cases(&mut v);
    hyper::cases(&mut v);
    v
}

/// Adds a case.
fn push(
    v: &mut Vec<Case>,
    op: &'static str,
    name: String,
    bound: Bound,
    build: impl Fn(&mut StdRng) -> Result<Graph> + Send + Sync + 'static,
) {
    v.push(Case { name, op, bound, build: Box::new(build) });
}

/// How an input is laid out in memory (its logical shape is always the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// A contiguous tensor.
    Contig,
    /// Stored with dims 1 and 2 swapped, then `permute(0, 2, 1, 3)`.
    Permuted,
    /// Stored with dims 0 and 1 swapped, then `transpose` (element types only).
    Transposed,
    /// A view of a wider tensor: rows padded by one block, starting one block in.
    Strided,
    /// A contiguous view one row into a larger tensor.
    Offset,
}

impl Form {
    /// Short name for case names.
    pub fn name(self) -> &'static str {
        match self {
            Form::Contig => "contig",
            Form::Permuted => "permuted",
            Form::Transposed => "transposed",
            Form::Strided => "strided",
            Form::Offset => "offset",
        }
    }
}

/// Type name for case names.
pub fn tn(t: GgmlType) -> String {
    format!("{t}").to_lowercase()
}

/// An input of logical shape `ne` in form `form`, filled with seeded values of deviation `scale`.
pub fn input(
    g: &mut Graph,
    rng: &mut StdRng,
    t: GgmlType,
    ne: [u64; 4],
    scale: f32,
    form: Form,
) -> Result<Id> {
    let bs = t.blck_size() as u64;
    let fill = |g: &mut Graph, rng: &mut StdRng, ne: [u64; 4]| -> Result<Id> {
        let n = ne.iter().product::<u64>() as usize;
        let bytes = data::random(rng, t, ne[0] as usize, n, scale)?;
        g.input(t, ne, bytes)
    };
    match form {
        Form::Contig => fill(g, rng, ne),
        Form::Permuted => {
            let p = fill(g, rng, [ne[0], ne[2], ne[1], ne[3]])?;
            g.permute(p, [0, 2, 1, 3])
        }
        Form::Transposed => {
            if bs != 1 {
                return Err(Error::Case(format!("cannot transpose {t}")));
            }
            let p = fill(g, rng, [ne[1], ne[0], ne[2], ne[3]])?;
            Ok(g.transpose(p))
        }
        Form::Strided => {
            let p = fill(g, rng, [ne[0] + bs, ne[1], ne[2], ne[3]])?;
            let nb = g.layout(p).nb;
            Ok(g.view(p, ne, [nb[1], nb[2], nb[3]], t.type_size() as u64))
        }
        Form::Offset => {
            let rows = ne[1] * ne[2] * ne[3];
            let p = fill(g, rng, [ne[0], rows + 1, 1, 1])?;
            let row = g.layout(p).nb[1];
            Ok(g.view(p, ne, [row, row * ne[1], row * ne[1] * ne[2]], row))
        }
    }
}

/// A contiguous f32 input of values `v`.
pub fn f32_input(g: &mut Graph, ne: [u64; 4], v: &[f32]) -> Result<Id> {
    g.input(GgmlType::F32, ne, data::f32_bytes(v))
}

/// A contiguous I32 input.
pub fn i32_input(g: &mut Graph, ne: [u64; 4], v: &[i32]) -> Result<Id> {
    g.input(GgmlType::I32, ne, data::i32_bytes(v))
}

/// Elements of `ne`.
pub fn nel(ne: [u64; 4]) -> usize {
    ne.iter().product::<u64>() as usize
}
