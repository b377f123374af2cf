//! The op coverage table (`compute::coverage`) against the executor and ARCHITECTURE.md:
//! - every op of the enum is classified;
//! - every op listed as computed gets through the executor's dispatch (a malformed node of it may
//!   be refused for its shapes, never as an unsupported op), and every op listed as pending or
//!   carrying a callback is refused as unsupported (cleanly: an error, no panic);
//! - ARCHITECTURE.md's "Op coverage" table is exactly the table this list generates
//!   (`LLAMAD_WRITE_COVERAGE=1` rewrites it).

use compute::coverage::{support, Support};
use compute::graph::Node;
use compute::op::GGML_OP_COUNT;
use compute::{Error, GgmlOp, GgmlType};

use super::harness::*;

fn all_ops() -> Vec<GgmlOp> {
    (0..GGML_OP_COUNT).map(|v| GgmlOp::from_u32(v).expect("every op id below the count is an op")).collect()
}

/// A node of `op` over small F32 operands (shapes that fit nothing in particular).
fn some_node(op: GgmlOp, srcs: &[T], d: &T) -> Node {
    let ts: Vec<_> = srcs.iter().map(|t| t.t()).collect();
    node(op, d.t(), &ts)
}

#[test]
fn every_op_is_classified_and_the_executor_agrees() {
    let srcs: Vec<T> = (0..4).map(|_| T::new(GgmlType::F32, [4, 4, 1, 1])).collect();
    let d = T::new(GgmlType::F32, [4, 4, 1, 1]);
    let mut computed = 0;
    let mut pending = Vec::new();
    for op in all_ops() {
        let r = std::panic::catch_unwind(|| validate(vec![some_node(op, &srcs, &d)]))
            .unwrap_or_else(|_| panic!("{op:?}: validating a malformed node panicked"));
        match support(op) {
            Support::Computed { .. } => {
                computed += 1;
                assert!(
                    !matches!(r, Err(Error::UnsupportedOp { .. })),
                    "{op:?} is listed as computed: {r:?}"
                );
            }
            Support::View => assert!(op.is_view(), "{op:?}"),
            Support::Callback | Support::Pending(_) => {
                if let Support::Pending(why) = support(op) {
                    pending.push(format!("{} ({why})", op.name()));
                }
                match r {
                    Err(Error::UnsupportedOp { op: got, .. }) => assert_eq!(got, op),
                    other => panic!("{op:?} is listed as not computed but validated as {other:?}"),
                }
            }
        }
    }
    eprintln!("ops computed: {computed} of {GGML_OP_COUNT}; pending: {}", pending.join(", "));
}

/// The markdown table of ARCHITECTURE.md's "Op coverage" section.
fn table() -> String {
    let mut s = String::from("| id | op | support | module | SIMD |\n|---:|---|---|---|---|\n");
    for op in all_ops() {
        let (what, module, simd) = match support(op) {
            Support::Computed { module, simd } => ("computed", module, simd),
            Support::View => ("view (no compute)", "", ""),
            Support::Callback => ("refused, like ggml's RPC server (function pointer)", "", ""),
            Support::Pending(why) => (why, "", ""),
        };
        let module = if module.is_empty() { String::new() } else { format!("`ops::{module}`") };
        s.push_str(&format!("| {} | {} | {what} | {module} | {simd} |\n", op as u32, op.name()));
    }
    s
}

#[test]
fn architecture_md_has_the_generated_coverage_table() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ARCHITECTURE.md");
    let doc = std::fs::read_to_string(&path).expect("ARCHITECTURE.md");
    let (start, end) = ("<!-- op-coverage:start -->\n", "<!-- op-coverage:end -->");
    let (a, b) = match (doc.find(start), doc.find(end)) {
        (Some(a), Some(b)) if a < b => (a + start.len(), b),
        _ => panic!("ARCHITECTURE.md lacks the op-coverage markers"),
    };
    let want = table();
    if doc[a..b] != want {
        if std::env::var_os("LLAMAD_WRITE_COVERAGE").is_some() {
            std::fs::write(&path, format!("{}{want}{}", &doc[..a], &doc[b..])).unwrap();
            return;
        }
        panic!("ARCHITECTURE.md's op coverage table is stale (LLAMAD_WRITE_COVERAGE=1 rewrites it):\n{want}");
    }
}
