//! Test harness: owned tensors, node builders, f64 readers and error metrics.

use compute::graph::{Executor, Graph, Node, Tensor, MAX_SRC};
use compute::op::flags;
use compute::quant::kernels;
use compute::{GgmlOp, GgmlType, Layout, Result};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// An owned, 64-byte-padded tensor buffer.
pub struct T {
    _mem: Vec<u64>,
    pub ptr: *mut u8,
    pub l: Layout,
    pub bytes: usize,
}

impl T {
    /// A zeroed contiguous tensor.
    pub fn new(dtype: GgmlType, ne: [u64; 4]) -> T {
        let l = Layout::contiguous(dtype, ne).unwrap();
        T::with_bytes(l, l.nbytes().unwrap() as usize)
    }

    /// A zeroed buffer of `bytes` bytes with layout `l`.
    pub fn with_bytes(l: Layout, bytes: usize) -> T {
        let mut mem = vec![0u64; bytes.div_ceil(8) + 8];
        let ptr = mem.as_mut_ptr() as *mut u8;
        T { _mem: mem, ptr, l, bytes }
    }

    /// A contiguous tensor of `dtype` holding `vals` (quantized / rounded row by row).
    pub fn from_f32(dtype: GgmlType, ne: [u64; 4], vals: &[f32]) -> T {
        let t = T::new(dtype, ne);
        let n0 = ne[0] as usize;
        let row = t.l.nb[1] as usize;
        assert_eq!(vals.len(), t.l.nelements().unwrap() as usize);
        for (r, chunk) in vals.chunks(n0).enumerate() {
            let out = t.slice_mut(r * row, row);
            encode_row(dtype, chunk, out);
        }
        t
    }

    /// A contiguous I32 tensor.
    pub fn i32s(ne: [u64; 4], vals: &[i32]) -> T {
        let t = T::new(GgmlType::I32, ne);
        for (i, v) in vals.iter().enumerate() {
            t.slice_mut(4 * i, 4).copy_from_slice(&v.to_le_bytes());
        }
        t
    }

    /// A contiguous I64 tensor.
    pub fn i64s(ne: [u64; 4], vals: &[i64]) -> T {
        let t = T::new(GgmlType::I64, ne);
        for (i, v) in vals.iter().enumerate() {
            t.slice_mut(8 * i, 8).copy_from_slice(&v.to_le_bytes());
        }
        t
    }

    #[allow(clippy::mut_from_ref)]
    pub fn slice_mut(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(off + len <= self.bytes + 64);
        // SAFETY: inside the owned buffer (padded by 64 bytes).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) }
    }

    /// The whole tensor.
    pub fn t(&self) -> Tensor {
        Tensor { layout: self.l, data: self.ptr }
    }

    /// A view with its own shape, strides and byte offset.
    pub fn view(&self, ne: [u64; 4], nb: [u64; 4], off: usize) -> Tensor {
        let layout = Layout { dtype: self.l.dtype, ne, nb };
        assert!(off + layout.nbytes().unwrap() as usize <= self.bytes);
        Tensor { layout, data: self.ptr.wrapping_add(off) }
    }

    /// A permuted view (ggml_permute semantics).
    pub fn permuted(&self, axes: [usize; 4]) -> Tensor {
        Tensor { layout: self.l.permute(axes).unwrap(), data: self.ptr }
    }

    /// All elements of a contiguous tensor, dequantized, in f64.
    pub fn values(&self) -> Vec<f64> {
        read_all(&self.t())
    }
}

/// Encodes a row of f32 values as `dtype`.
pub fn encode_row(dtype: GgmlType, vals: &[f32], out: &mut [u8]) {
    match dtype {
        GgmlType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(vals) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(vals) {
                o.copy_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(vals) {
                o.copy_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        t => (kernels(t).from_f32.expect("quantizer"))(vals, out),
    }
}

/// Decodes a packed row of `n` elements of `dtype` to f64 (scalar kernels for block types).
pub fn decode_row(dtype: GgmlType, bytes: &[u8], n: usize) -> Vec<f64> {
    match dtype {
        GgmlType::F32 => {
            bytes.chunks_exact(4).take(n).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect()
        }
        GgmlType::F16 => bytes
            .chunks_exact(2)
            .take(n)
            .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64())
            .collect(),
        GgmlType::BF16 => bytes
            .chunks_exact(2)
            .take(n)
            .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64())
            .collect(),
        GgmlType::I32 => {
            bytes.chunks_exact(4).take(n).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64).collect()
        }
        GgmlType::I64 => {
            bytes.chunks_exact(8).take(n).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64).collect()
        }
        t => {
            let mut out = vec![0f32; n];
            (kernels(t).to_f32.expect("dequantizer"))(bytes, &mut out);
            out.into_iter().map(|v| v as f64).collect()
        }
    }
}

/// Element `(i0, i1, i2, i3)` of a tensor with one element per block, in f64.
pub fn get(t: &Tensor, i: [usize; 4]) -> f64 {
    let l = &t.layout;
    let off: u64 = (0..4).map(|k| i[k] as u64 * l.nb[k]).sum();
    // SAFETY: test tensors point into owned buffers; indices are within the shape.
    let b = unsafe { std::slice::from_raw_parts(t.data.add(off as usize), l.dtype.type_size()) };
    decode_row(l.dtype, b, 1)[0]
}

/// Row `(i1, i2, i3)` of a tensor with packed rows, dequantized.
pub fn row(t: &Tensor, i1: usize, i2: usize, i3: usize) -> Vec<f64> {
    let l = &t.layout;
    let off = i1 as u64 * l.nb[1] + i2 as u64 * l.nb[2] + i3 as u64 * l.nb[3];
    let len = l.row_bytes().unwrap() as usize;
    // SAFETY: as in `get`.
    let b = unsafe { std::slice::from_raw_parts(t.data.add(off as usize), len) };
    decode_row(l.dtype, b, l.ne[0] as usize)
}

/// Every element in logical order, in f64.
pub fn read_all(t: &Tensor) -> Vec<f64> {
    let ne = t.layout.ne.map(|v| v as usize);
    let mut out = Vec::new();
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                if t.layout.dtype.blck_size() > 1 || t.layout.nb[0] == t.layout.dtype.type_size() as u64 {
                    out.extend(row(t, i1, i2, i3));
                } else {
                    for i0 in 0..ne[0] {
                        out.push(get(t, [i0, i1, i2, i3]));
                    }
                }
            }
        }
    }
    out
}

/// A node computing `op` into `dst` from `srcs`.
pub fn node(op: GgmlOp, dst: Tensor, srcs: &[Tensor]) -> Node {
    let mut src: [Option<Tensor>; MAX_SRC] = [None; MAX_SRC];
    for (s, t) in src.iter_mut().zip(srcs) {
        *s = Some(*t);
    }
    Node { op, op_params: [0; 16], flags: flags::COMPUTE, dst, src }
}

/// A node with op_params.
pub fn node_p(op: GgmlOp, params: &[i32], dst: Tensor, srcs: &[Tensor]) -> Node {
    let mut n = node(op, dst, srcs);
    n.op_params[..params.len()].copy_from_slice(params);
    n
}

/// Sets optional sources at given slots.
pub fn with_src(mut n: Node, i: usize, t: Option<Tensor>) -> Node {
    n.src[i] = t;
    n
}

/// f32 op_param bits.
pub fn f(v: f32) -> i32 {
    v.to_bits() as i32
}

/// Validates and runs `nodes` on `nth` threads.
pub fn run(nodes: Vec<Node>, nth: usize) -> Result<()> {
    // SAFETY: every tensor of the test points into a live owned buffer, used by nobody else.
    let g = unsafe { Graph::new(nodes)? };
    Executor::new(nth).compute(&g)
}

/// Validation only.
pub fn validate(nodes: Vec<Node>) -> Result<()> {
    // SAFETY: as in `run`.
    unsafe { Graph::new(nodes).map(|_| ()) }
}

/// A seeded RNG.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `n` uniform values in `[-s, s)`.
pub fn randv(r: &mut StdRng, n: usize, s: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-s..s)).collect()
}

/// Normalized mean squared error `Σ(got - want)² / Σ want²` (ggml's test-backend-ops metric).
pub fn nmse(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let mut num = 0.0;
    let mut den = 0.0;
    for (g, w) in got.iter().zip(want) {
        if g.is_nan() != w.is_nan() {
            return f64::INFINITY;
        }
        if w.is_infinite() || w.is_nan() {
            if g != w && !(g.is_nan() && w.is_nan()) {
                return f64::INFINITY;
            }
            continue;
        }
        num += (g - w) * (g - w);
        den += w * w;
    }
    if den == 0.0 {
        num
    } else {
        num / den
    }
}

/// Asserts `nmse(got, want) <= bound`, naming the case.
pub fn check(name: &str, got: &[f64], want: &[f64], bound: f64) {
    let e = nmse(got, want);
    assert!(e <= bound, "{name}: nmse {e:e} > {bound:e}");
}

/// True when the kernel table can quantize, dequantize and dot this type.
pub fn has_matmul_kernels(t: GgmlType) -> bool {
    let k = kernels(t);
    k.to_f32.is_some()
        && k.from_f32.is_some()
        && k.vec_dot.is_some()
        && kernels(k.vec_dot_type).from_f32.is_some()
}

/// True when the type can be quantized and dequantized.
pub fn has_codec(t: GgmlType) -> bool {
    matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
        || kernels(t).to_f32.is_some() && kernels(t).from_f32.is_some()
}
