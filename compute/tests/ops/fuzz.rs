//! The security boundary: malformed nodes (wrong shapes, escaping strides, wrong types, random
//! indices) are either refused by `Graph::new` or computed without touching memory outside any
//! tensor. Every tensor is placed against a `PROT_NONE` guard page (once ending at it, once
//! starting after it), so an out-of-bounds read or write crashes the test.
//! ref: ggml-rpc-protocol.md §14 items 7–11.

use compute::graph::{Executor, Graph, Tensor};
use compute::{GgmlOp, GgmlType, Layout};
use rand::rngs::StdRng;
use rand::Rng;

use crate::harness::*;

/// An anonymous mapping with a guard page on each side and the tensor flush against one of them.
struct Guarded {
    base: *mut libc::c_void,
    len: usize,
    data: *mut u8,
}

impl Guarded {
    fn new(nbytes: usize, at_end: bool, r: &mut StdRng) -> Guarded {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let body = nbytes.div_ceil(page).max(1) * page;
        let len = body + 2 * page;
        // SAFETY: a fresh private anonymous mapping; checked for failure below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let b = base as *mut u8;
        // SAFETY: both guard pages lie inside the mapping.
        unsafe {
            assert_eq!(libc::mprotect(base, page, libc::PROT_NONE), 0);
            assert_eq!(libc::mprotect(b.add(page + body) as *mut libc::c_void, page, libc::PROT_NONE), 0);
        }
        let data = if at_end { b.wrapping_add(page + body - nbytes) } else { b.wrapping_add(page) };
        // Random contents: indices come out of range, floats are anything.
        // SAFETY: `nbytes` bytes from `data` lie inside the writable body.
        let bytes = unsafe { std::slice::from_raw_parts_mut(data, nbytes) };
        r.fill(bytes);
        bytes.iter_mut().for_each(|b| *b &= 7);
        Guarded { base, len, data }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// A valid template node: op, op_params, dst layout, src layouts.
type Template = (GgmlOp, Vec<i32>, Layout, Vec<Layout>);

fn c(t: GgmlType, ne: [u64; 4]) -> Layout {
    Layout::contiguous(t, ne).unwrap()
}

fn templates() -> Vec<Template> {
    use GgmlType::*;
    let f = |v: f32| v.to_bits() as i32;
    vec![
        (GgmlOp::MulMat, vec![], c(F32, [4, 3, 2, 1]), vec![c(Q8_0, [64, 4, 1, 1]), c(F32, [64, 3, 2, 1])]),
        (GgmlOp::MulMat, vec![], c(F32, [5, 2, 4, 1]), vec![c(F16, [32, 5, 2, 1]), c(F32, [32, 2, 4, 1])]),
        (
            GgmlOp::MulMatId,
            vec![],
            c(F32, [4, 2, 3, 1]),
            vec![c(Q4_0, [32, 4, 3, 1]), c(F32, [32, 1, 3, 1]), c(I32, [2, 3, 1, 1])],
        ),
        (GgmlOp::GetRows, vec![], c(F32, [8, 3, 2, 1]), vec![c(F16, [8, 5, 2, 1]), c(I32, [3, 2, 1, 1])]),
        (GgmlOp::GetRows, vec![], c(F32, [32, 2, 1, 1]), vec![c(Q4_0, [32, 5, 1, 1]), c(I32, [2, 1, 1, 1])]),
        (GgmlOp::SetRows, vec![], c(F16, [8, 6, 2, 1]), vec![c(F32, [8, 3, 2, 1]), c(I64, [3, 1, 1, 1])]),
        (GgmlOp::SetRows, vec![], c(Q8_0, [32, 6, 1, 1]), vec![c(F32, [32, 2, 1, 1]), c(I32, [2, 1, 1, 1])]),
        (GgmlOp::Cpy, vec![], c(F16, [6, 4, 1, 1]), vec![c(F32, [4, 6, 1, 1])]),
        (GgmlOp::Cont, vec![], c(F32, [12, 2, 1, 1]), vec![c(F32, [3, 2, 4, 1])]),
        (GgmlOp::Add, vec![], c(F32, [8, 3, 2, 1]), vec![c(F32, [8, 3, 2, 1]), c(F32, [8, 1, 2, 1])]),
        (GgmlOp::Mul, vec![], c(F16, [8, 3, 1, 1]), vec![c(F16, [8, 3, 1, 1]), c(F32, [4, 1, 1, 1])]),
        (GgmlOp::RmsNorm, vec![f(1e-5)], c(F32, [8, 3, 1, 1]), vec![c(F32, [8, 3, 1, 1])]),
        (
            GgmlOp::SoftMax,
            vec![f(0.5), f(0.0)],
            c(F32, [8, 3, 2, 1]),
            vec![c(F32, [8, 3, 2, 1]), c(F16, [8, 4, 1, 1]), c(F32, [2, 1, 1, 1])],
        ),
        (
            GgmlOp::Rope,
            vec![0, 8, 2, 0, 512, f(1e4), f(1.0), f(0.5), f(1.0), f(32.0), f(1.0)],
            c(F32, [8, 2, 3, 1]),
            vec![c(F32, [8, 2, 3, 1]), c(I32, [3, 1, 1, 1]), c(F32, [4, 1, 1, 1])],
        ),
        (
            GgmlOp::FlashAttnExt,
            vec![f(0.3), f(0.0), f(0.0), 10],
            c(F32, [32, 4, 3, 1]),
            vec![
                c(F32, [32, 3, 4, 1]),
                c(F16, [32, 5, 2, 1]),
                c(F16, [32, 5, 2, 1]),
                c(F16, [5, 4, 1, 1]),
                c(F32, [4, 1, 1, 1]),
            ],
        ),
        (GgmlOp::Glu, vec![2, 0], c(F32, [4, 3, 1, 1]), vec![c(F32, [8, 3, 1, 1])]),
        (GgmlOp::Glu, vec![1, 0], c(F32, [4, 3, 1, 1]), vec![c(F32, [4, 3, 1, 1]), c(F32, [4, 3, 1, 1])]),
        (GgmlOp::Unary, vec![10], c(F32, [4, 3, 1, 1]), vec![c(F32, [4, 3, 1, 1])]),
        (GgmlOp::Argsort, vec![1], c(I32, [6, 2, 1, 1]), vec![c(F32, [6, 2, 1, 1])]),
        (GgmlOp::TopK, vec![], c(I32, [2, 2, 1, 1]), vec![c(F32, [6, 2, 1, 1])]),
        (GgmlOp::SumRows, vec![], c(F32, [1, 3, 2, 1]), vec![c(F32, [5, 3, 2, 1])]),
        (GgmlOp::Concat, vec![1], c(F32, [4, 5, 1, 1]), vec![c(F32, [4, 2, 1, 1]), c(F32, [4, 3, 1, 1])]),
        (GgmlOp::Pad, vec![1, 1, 0, 2], c(F32, [6, 5, 1, 1]), vec![c(F32, [4, 3, 1, 1])]),
        (GgmlOp::Repeat, vec![], c(F32, [4, 6, 1, 1]), vec![c(F32, [2, 3, 1, 1])]),
        (
            GgmlOp::AddId,
            vec![],
            c(F32, [8, 2, 3, 1]),
            vec![c(F32, [8, 2, 3, 1]), c(F32, [8, 4, 1, 1]), c(I32, [2, 3, 1, 1])],
        ),
        (GgmlOp::Argmax, vec![], c(I32, [3, 1, 1, 1]), vec![c(F32, [7, 3, 1, 1])]),
        (GgmlOp::SsmConv, vec![], c(F32, [8, 3, 2, 1]), vec![c(F32, [6, 8, 2, 1]), c(F32, [4, 8, 1, 1])]),
        (
            GgmlOp::SsmScan,
            vec![1],
            c(F32, [4 * 4 * 3 * 2 + 8 * 4 * 4 * 2, 1, 1, 1]),
            vec![
                c(F32, [8, 4, 4, 3]),
                c(F32, [4, 4, 3, 2]),
                c(F32, [4, 3, 2, 1]),
                c(F32, [1, 4, 1, 1]),
                c(F32, [8, 2, 3, 2]),
                c(F32, [8, 2, 3, 2]),
                c(I32, [2, 1, 1, 1]),
            ],
        ),
        (
            GgmlOp::RwkvWkv6,
            vec![],
            c(F32, [8, 4 + 4 * 2, 1, 1]),
            vec![
                c(F32, [4, 2, 4, 1]),
                c(F32, [4, 2, 4, 1]),
                c(F32, [4, 2, 4, 1]),
                c(F32, [4, 2, 1, 1]),
                c(F32, [4, 2, 4, 1]),
                c(F32, [32, 2, 1, 1]),
            ],
        ),
        (
            GgmlOp::GatedLinearAttn,
            vec![f(0.5)],
            c(F32, [8, 4 + 4, 1, 1]),
            vec![
                c(F32, [4, 2, 4, 1]),
                c(F32, [4, 2, 4, 1]),
                c(F32, [4, 2, 4, 1]),
                c(F32, [4, 2, 4, 1]),
                c(F32, [32, 1, 1, 1]),
            ],
        ),
        (
            GgmlOp::RwkvWkv7,
            vec![],
            c(F32, [8, 2 + 4 * 2, 1, 1]),
            vec![
                c(F32, [4, 2, 2, 1]),
                c(F32, [4, 2, 2, 1]),
                c(F32, [4, 2, 2, 1]),
                c(F32, [4, 2, 2, 1]),
                c(F32, [4, 2, 2, 1]),
                c(F32, [4, 2, 2, 1]),
                c(F32, [32, 2, 1, 1]),
            ],
        ),
    ]
}

fn mutate(l: &mut Layout, r: &mut StdRng) {
    let types = [GgmlType::F32, GgmlType::F16, GgmlType::I32, GgmlType::I64, GgmlType::Q8_0, GgmlType::Q4_0];
    match r.random_range(0..6) {
        0 => {
            let d = r.random_range(0..4);
            l.ne[d] = [0, 1, 2, l.ne[d] + 1, l.ne[d] * 2, 33][r.random_range(0..6)];
        }
        1 => {
            let d = r.random_range(0..4);
            l.nb[d] = [0, 1, 2, 4, l.nb[d] * 3, 1 << 20, 1 << 40][r.random_range(0..7)];
        }
        2 => {
            let t = types[r.random_range(0..types.len())];
            *l = Layout::contiguous(t, l.ne).unwrap_or(Layout { dtype: t, ..*l });
        }
        3 => {
            *l = l.permute([1, 0, 2, 3]).unwrap();
        }
        4 => {
            let d = r.random_range(1..4);
            l.ne[d] = 1;
            l.nb[d] = 1 << 40;
        }
        _ => {}
    }
}

fn run_case(
    ex: &mut Executor,
    op: GgmlOp,
    params: &[i32],
    dst: Layout,
    srcs: &[Layout],
    at_end: bool,
    r: &mut StdRng,
) -> Option<bool> {
    let mut all = vec![dst];
    all.extend_from_slice(srcs);
    let mut bufs = Vec::new();
    for l in &all {
        let n = l.nbytes()?;
        if n > 1 << 18 {
            return None;
        }
        bufs.push(Guarded::new(n as usize, at_end, r));
    }
    let t: Vec<Tensor> = all.iter().zip(&bufs).map(|(l, b)| Tensor { layout: *l, data: b.data }).collect();
    let n = node_p(op, params, t[0], &t[1..]);
    // SAFETY: every tensor's extent lies inside its own live mapping.
    let g: Graph = match unsafe { Graph::new(vec![n]) } {
        Ok(g) => g,
        Err(_) => return Some(false),
    };
    assert_eq!(g.nodes().len(), 1);
    let _ = ex.compute(&g);
    Some(true)
}

#[test]
fn malformed_nodes_never_touch_memory_outside_their_tensors() {
    let mut r = rng(4242);
    let mut ex = Executor::new(2);
    let mut accepted = 0usize;
    let mut refused = 0usize;
    for (op, params, dst, srcs) in templates() {
        // The template itself is valid and runs.
        assert_eq!(run_case(&mut ex, op, &params, dst, &srcs, true, &mut r), Some(true), "template {op:?}");
        for i in 0..60 {
            let (mut d, mut s) = (dst, srcs.clone());
            for _ in 0..r.random_range(1..3) {
                let k = r.random_range(0..=s.len());
                if k == 0 {
                    mutate(&mut d, &mut r);
                } else {
                    mutate(&mut s[k - 1], &mut r);
                }
            }
            match run_case(&mut ex, op, &params, d, &s, i % 2 == 0, &mut r) {
                Some(true) => accepted += 1,
                Some(false) => refused += 1,
                None => {}
            }
        }
    }
    eprintln!("fuzzed nodes: {accepted} accepted and run, {refused} refused");
    assert!(accepted > 100 && refused > 100, "{accepted} accepted, {refused} refused");
}
