//! A slow, plain interpreter of abstract graphs (`GraphDef`): every tensor gets its own byte
//! buffer (views alias their owner's), every op is evaluated element by element from its
//! definition in ggml-compute-semantics.md §3.3, including the matmul's conversion of src1 to f16
//! when src0 is F16 (§2.3). KV buffers persist across steps, like a backend's.

use std::collections::HashMap;

use compute::model::arch::{build, InputSink};
use compute::model::session::{fill_inputs, ubatch_params};
use compute::model::{GraphDef, HParams, KvKind, SessionConfig, Storage, TensorId, WeightSource};
use compute::op::{GgmlOp, GluOp, UnaryOp};
use compute::{GgmlType, Layout, Result};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Owner(u32),
    Kv(u32, KvKind),
}

/// Buffers of one graph run.
pub struct Mem<'a> {
    g: &'a GraphDef,
    bufs: HashMap<Key, Vec<u8>>,
}

fn key(g: &GraphDef, id: TensorId) -> Key {
    let o = g.owner(id);
    match g.get(o).storage {
        Storage::KvCache { layer, kind } => Key::Kv(layer, kind),
        _ => Key::Owner(o.0),
    }
}

impl InputSink for Mem<'_> {
    fn bytes(&mut self, id: TensorId) -> Result<&mut [u8]> {
        let n = self.g.layout(id).nbytes().unwrap() as usize;
        let k = key(self.g, id);
        Ok(&mut self.bufs.get_mut(&k).unwrap()[..n])
    }
}

impl Mem<'_> {
    fn at(&self, id: TensorId, i: [u64; 4]) -> (Key, usize, GgmlType) {
        let t = self.g.get(id);
        let l = t.layout;
        let off = t.view_offs + (0..4).map(|d| i[d] * l.nb[d]).sum::<u64>();
        (key(self.g, id), off as usize, l.dtype)
    }

    fn rd(&self, id: TensorId, i: [u64; 4]) -> f64 {
        let (k, o, dt) = self.at(id, i);
        let b = &self.bufs[&k];
        match dt {
            GgmlType::F32 => f32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as f64,
            GgmlType::F16 => {
                half::f16::from_bits(u16::from_le_bytes(b[o..o + 2].try_into().unwrap())).to_f64()
            }
            GgmlType::I32 => i32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as f64,
            GgmlType::I64 => i64::from_le_bytes(b[o..o + 8].try_into().unwrap()) as f64,
            t => panic!("interp: type {t}"),
        }
    }

    fn wr(&mut self, id: TensorId, i: [u64; 4], v: f64) {
        let (k, o, dt) = self.at(id, i);
        let b = self.bufs.get_mut(&k).unwrap();
        match dt {
            GgmlType::F32 => b[o..o + 4].copy_from_slice(&(v as f32).to_le_bytes()),
            GgmlType::F16 => b[o..o + 2].copy_from_slice(&half::f16::from_f64(v).to_bits().to_le_bytes()),
            GgmlType::I32 => b[o..o + 4].copy_from_slice(&(v as i32).to_le_bytes()),
            GgmlType::I64 => b[o..o + 8].copy_from_slice(&(v as i64).to_le_bytes()),
            t => panic!("interp: type {t}"),
        }
    }

    fn ne(&self, id: TensorId) -> [u64; 4] {
        self.g.layout(id).ne
    }
}

fn each(ne: [u64; 4]) -> impl Iterator<Item = [u64; 4]> {
    (0..ne[3]).flat_map(move |i3| {
        (0..ne[2])
            .flat_map(move |i2| (0..ne[1]).flat_map(move |i1| (0..ne[0]).map(move |i0| [i0, i1, i2, i3])))
    })
}

fn pf(p: &[i32; 16], i: usize) -> f64 {
    f32::from_bits(p[i] as u32) as f64
}

fn f16r(x: f64) -> f64 {
    half::f16::from_f64(x).to_f64()
}

/// Runs every COMPUTE node of the graph over `m`.
pub fn run(m: &mut Mem<'_>) {
    let g = m.g;
    for &id in g.nodes() {
        let t = g.get(id);
        if t.op.is_view() {
            continue;
        }
        let s = |k: usize| t.src[k].unwrap();
        let p = &t.op_params;
        let ne = t.layout.ne;
        match t.op {
            GgmlOp::GetRows => {
                for i in each(ne) {
                    let r = m.rd(s(1), [i[1], i[2], i[3], 0]) as u64;
                    let v = m.rd(s(0), [i[0], r, i[2], i[3]]);
                    m.wr(id, i, v);
                }
            }
            GgmlOp::RmsNorm => {
                let eps = pf(p, 0);
                for r in each([1, ne[1], ne[2], ne[3]]) {
                    let ms = (0..ne[0]).map(|c| m.rd(s(0), [c, r[1], r[2], r[3]]).powi(2)).sum::<f64>()
                        / ne[0] as f64;
                    for c in 0..ne[0] {
                        let v = m.rd(s(0), [c, r[1], r[2], r[3]]) / (ms + eps).sqrt();
                        m.wr(id, [c, r[1], r[2], r[3]], v);
                    }
                }
            }
            GgmlOp::Add | GgmlOp::Mul | GgmlOp::Div => {
                let nb = m.ne(s(1));
                for i in each(ne) {
                    let a = m.rd(s(0), i);
                    let b = m.rd(s(1), [i[0] % nb[0], i[1] % nb[1], i[2] % nb[2], i[3] % nb[3]]);
                    let v = match t.op {
                        GgmlOp::Add => a + b,
                        GgmlOp::Mul => a * b,
                        _ => a / b,
                    };
                    m.wr(id, i, v);
                }
            }
            GgmlOp::Scale => {
                for i in each(ne) {
                    let v = m.rd(s(0), i) * pf(p, 0) + pf(p, 1);
                    m.wr(id, i, v);
                }
            }
            GgmlOp::Clamp => {
                for i in each(ne) {
                    let v = m.rd(s(0), i).max(pf(p, 0)).min(pf(p, 1));
                    m.wr(id, i, v);
                }
            }
            GgmlOp::Unary => {
                for i in each(ne) {
                    let x = m.rd(s(0), i);
                    let v = match UnaryOp::from_i32(p[0]).unwrap() {
                        UnaryOp::Tanh => x.tanh(),
                        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
                        UnaryOp::Silu => x / (1.0 + (-x).exp()),
                        u => panic!("interp: unary {u:?}"),
                    };
                    m.wr(id, i, v);
                }
            }
            GgmlOp::Glu => {
                for i in each(ne) {
                    let (x, gt) = (m.rd(s(0), i), m.rd(s(1), i));
                    let a = match GluOp::from_i32(p[0]).unwrap() {
                        GluOp::Swiglu => x / (1.0 + (-x).exp()),
                        GluOp::Geglu => {
                            0.5 * x
                                * (1.0
                                    + ((2.0 / std::f64::consts::PI).sqrt() * x * (1.0 + 0.044715 * x * x))
                                        .tanh())
                        }
                        o => panic!("interp: glu {o:?}"),
                    };
                    m.wr(id, i, a * gt);
                }
            }
            GgmlOp::SumRows => {
                let na = m.ne(s(0));
                for i in each(ne) {
                    let v = (0..na[0]).map(|c| m.rd(s(0), [c, i[1], i[2], i[3]])).sum();
                    m.wr(id, i, v);
                }
            }
            GgmlOp::Argsort => {
                for r in each([1, ne[1], ne[2], ne[3]]) {
                    let mut idx: Vec<u64> = (0..ne[0]).collect();
                    let vals: Vec<f64> = idx.iter().map(|&c| m.rd(s(0), [c, r[1], r[2], r[3]])).collect();
                    idx.sort_by(|a, b| {
                        let o = vals[*a as usize].total_cmp(&vals[*b as usize]);
                        if p[0] == 1 {
                            o.reverse()
                        } else {
                            o
                        }
                    });
                    for (c, &ix) in idx.iter().enumerate() {
                        m.wr(id, [c as u64, r[1], r[2], r[3]], ix as f64);
                    }
                }
            }
            GgmlOp::MulMat => {
                let (a, b) = (s(0), s(1));
                let (na, nbb) = (m.ne(a), m.ne(b));
                let a_f16 = g.layout(a).dtype == GgmlType::F16;
                let (r2, r3) = (nbb[2] / na[2], nbb[3] / na[3]);
                for i in each(ne) {
                    let mut acc = 0.0;
                    for k in 0..na[0] {
                        let bv = m.rd(b, [k, i[1], i[2], i[3]]);
                        let bv = if a_f16 { f16r(bv) } else { bv };
                        acc += m.rd(a, [k, i[0], i[2] / r2, i[3] / r3]) * bv;
                    }
                    m.wr(id, i, acc);
                }
            }
            GgmlOp::MulMatId => {
                let (a, b, ids) = (s(0), s(1), s(2));
                let (na, nbb) = (m.ne(a), m.ne(b));
                for i in each(ne) {
                    let ex = m.rd(ids, [i[1], i[2], 0, 0]) as u64;
                    let acc = (0..na[0])
                        .map(|k| m.rd(a, [k, i[0], ex, 0]) * m.rd(b, [k, i[1] % nbb[1], i[2], 0]))
                        .sum();
                    m.wr(id, i, acc);
                }
            }
            GgmlOp::Rope => {
                let (n_dims, mode) = (p[1] as u64, p[2]);
                let (base, fscale) = (pf(p, 5), pf(p, 6));
                for r in each([1, ne[1], ne[2], ne[3]]) {
                    let pos = m.rd(s(1), [r[2], 0, 0, 0]);
                    for c in n_dims..ne[0] {
                        let v = m.rd(s(0), [c, r[1], r[2], r[3]]);
                        m.wr(id, [c, r[1], r[2], r[3]], v);
                    }
                    for k in 0..n_dims / 2 {
                        let mut theta = pos * base.powf(-2.0 * k as f64 / n_dims as f64) * fscale;
                        if let Some(ff) = t.src[2] {
                            theta /= m.rd(ff, [k, 0, 0, 0]);
                        }
                        let (i0, i1) = if mode == 2 { (k, k + n_dims / 2) } else { (2 * k, 2 * k + 1) };
                        let x0 = m.rd(s(0), [i0, r[1], r[2], r[3]]);
                        let x1 = m.rd(s(0), [i1, r[1], r[2], r[3]]);
                        m.wr(id, [i0, r[1], r[2], r[3]], x0 * theta.cos() - x1 * theta.sin());
                        m.wr(id, [i1, r[1], r[2], r[3]], x0 * theta.sin() + x1 * theta.cos());
                    }
                }
            }
            GgmlOp::SetRows => {
                let (b, c) = (s(0), s(1));
                let (nb_, nc) = (m.ne(b), m.ne(c));
                for i in each(nb_) {
                    let r = m.rd(c, [i[1], i[2] % nc[1], i[3] % nc[2], 0]) as u64;
                    let v = m.rd(b, i);
                    m.wr(id, [i[0], r, i[2], i[3]], v);
                }
            }
            GgmlOp::Cont | GgmlOp::Cpy => {
                let src: Vec<f64> = each(m.ne(s(0))).map(|i| m.rd(s(0), i)).collect();
                for (i, v) in each(ne).zip(src) {
                    m.wr(id, i, v);
                }
            }
            GgmlOp::SoftMax => {
                let (scale, mask) = (pf(p, 0), t.src[1]);
                for r in each([1, ne[1], ne[2], ne[3]]) {
                    let w: Vec<f64> = (0..ne[0])
                        .map(|c| {
                            let x = m.rd(s(0), [c, r[1], r[2], r[3]]) * scale;
                            match mask {
                                Some(mk) => {
                                    let nm = m.ne(mk);
                                    x + m.rd(mk, [c, r[1], r[2] % nm[2], r[3] % nm[3]])
                                }
                                None => x,
                            }
                        })
                        .collect();
                    let mx = w.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = w.iter().map(|v| (v - mx).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    for (c, v) in e.iter().enumerate() {
                        m.wr(id, [c as u64, r[1], r[2], r[3]], v / sum);
                    }
                }
            }
            GgmlOp::FlashAttnExt => {
                let (q, k, v, mask) = (s(0), s(1), s(2), t.src[3]);
                let (nq, nk) = (m.ne(q), m.ne(k));
                let k_f16 = g.layout(k).dtype == GgmlType::F16;
                let scale = pf(p, 0);
                let rep = nq[2] / nk[2];
                let dv = m.ne(v)[0];
                for iq3 in 0..nq[3] {
                    for h in 0..nq[2] {
                        for iq1 in 0..nq[1] {
                            let hk = h / rep;
                            let mut sc = Vec::new();
                            for j in 0..nk[1] {
                                let mv = match mask {
                                    Some(mk) => {
                                        let nm = m.ne(mk);
                                        m.rd(mk, [j, iq1, h % nm[2], iq3 % nm[3]])
                                    }
                                    None => 0.0,
                                };
                                if mv == f64::NEG_INFINITY {
                                    continue;
                                }
                                let dot: f64 = (0..nq[0])
                                    .map(|c| {
                                        let qv = m.rd(q, [c, iq1, h, iq3]);
                                        let qv = if k_f16 { f16r(qv) } else { qv };
                                        qv * m.rd(k, [c, j, hk, iq3])
                                    })
                                    .sum();
                                sc.push((j, dot * scale + mv));
                            }
                            let mx = sc.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
                            let sum: f64 = sc.iter().map(|x| (x.1 - mx).exp()).sum();
                            for c in 0..dv {
                                let o: f64 = sc
                                    .iter()
                                    .map(|&(j, s_)| (s_ - mx).exp() / sum * m.rd(v, [c, j, hk, iq3]))
                                    .sum();
                                m.wr(id, [c, h, iq1, iq3], o);
                            }
                        }
                    }
                }
            }
            op => panic!("interp: op {op}"),
        }
    }
}

/// A decoding session over the interpreter, mirroring `compute::model::Session`.
pub struct InterpSession<'w> {
    pub hp: HParams,
    pub src: &'w dyn WeightSource,
    pub cfg: SessionConfig,
    kv: HashMap<Key, Vec<u8>>,
    pub n_past: u64,
    pub graphs: Vec<GraphDef>,
}

impl<'w> InterpSession<'w> {
    pub fn new(src: &'w dyn WeightSource, cfg: SessionConfig) -> Self {
        let hp = HParams::from_source(src).unwrap();
        InterpSession { hp, src, cfg, kv: HashMap::new(), n_past: 0, graphs: Vec::new() }
    }

    pub fn decode(&mut self, tokens: &[u32]) -> Vec<f32> {
        let n = self.hp.n_layer;
        self.decode_split(tokens, std::slice::from_ref(&(0..n)))
    }

    /// Decodes with the layers split into consecutive ranges, each its own graph; the hidden
    /// state of one range is copied into the next range's input.
    pub fn decode_split(&mut self, tokens: &[u32], ranges: &[std::ops::Range<u32>]) -> Vec<f32> {
        let mut logits = Vec::new();
        for chunk in tokens.chunks(self.cfg.n_ubatch as usize) {
            let mut hidden: Option<Vec<u8>> = None;
            for r in ranges {
                let mut p = ubatch_params(&self.hp, &self.cfg, self.n_past, chunk.len() as u64, 1);
                p.layers = r.clone();
                let built = build(&self.hp, self.src, &p).unwrap();
                let g = &built.graph;
                let mut bufs = HashMap::new();
                for (i, t) in g.tensors().iter().enumerate() {
                    let id = TensorId(i as u32);
                    match &t.storage {
                        Storage::Weight(name) => {
                            bufs.insert(Key::Owner(id.0), self.src.tensor(name).unwrap().data.to_vec());
                        }
                        Storage::KvCache { layer, kind } => {
                            let k = Key::Kv(*layer, *kind);
                            let n = t.layout.nbytes().unwrap() as usize;
                            let b = self.kv.remove(&k).unwrap_or_else(|| vec![0; n]);
                            bufs.insert(k, b);
                        }
                        Storage::Input(_) | Storage::Intermediate => {
                            bufs.insert(Key::Owner(id.0), vec![0; t.layout.nbytes().unwrap() as usize]);
                        }
                        Storage::View => {}
                    }
                }
                let mut mem = Mem { g, bufs };
                fill_inputs(&self.hp, &built, self.n_past, chunk, &mut mem).unwrap();
                match (built.inputs.hidden, hidden.take()) {
                    (Some(h), Some(bytes)) => mem.bytes(h).unwrap().copy_from_slice(&bytes),
                    (None, None) => {}
                    _ => panic!("hidden state input/output mismatch for range {r:?}"),
                }
                run(&mut mem);
                let out = built.output;
                let l: Layout = g.layout(out);
                if r.end == self.hp.n_layer {
                    logits = (0..l.ne[0]).map(|i| mem.rd(out, [i, 0, 0, 0]) as f32).collect();
                } else {
                    hidden = Some(mem.bytes(out).unwrap().to_vec());
                }
                for (k, b) in mem.bufs.drain() {
                    if matches!(k, Key::Kv(..)) {
                        self.kv.insert(k, b);
                    }
                }
                self.graphs.push(built.graph);
            }
            self.n_past += chunk.len() as u64;
        }
        logits
    }
}
