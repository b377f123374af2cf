//! SSM_CONV, SSM_SCAN, RWKV_WKV6, GATED_LINEAR_ATTN and RWKV_WKV7: hand-computed values, f64
//! references written here from the ops' definitions, thread-count independence, and refusal of
//! malformed nodes.

use compute::{Error, GgmlOp, GgmlType};

use crate::harness::*;

const F32: GgmlType = GgmlType::F32;

/// Elements of `ne`.
fn nel(ne: [u64; 4]) -> usize {
    ne.iter().product::<u64>() as usize
}

/// A random F32 tensor.
fn rand_t(r: &mut rand::rngs::StdRng, ne: [u64; 4], s: f32) -> T {
    T::from_f32(F32, ne, &randv(r, nel(ne), s))
}

/// An F32 tensor of `f` applied to random values.
fn mapped_t(r: &mut rand::rngs::StdRng, ne: [u64; 4], f: impl Fn(f32) -> f32) -> T {
    T::from_f32(F32, ne, &randv(r, nel(ne), 1.0).into_iter().map(f).collect::<Vec<_>>())
}

/// Runs `n` on 1 and 3 threads: both succeed with the same bits; returns the values.
fn run_both(make: impl Fn(&T) -> compute::graph::Node, dst_ne: [u64; 4]) -> Vec<f64> {
    let d1 = T::new(F32, dst_ne);
    run(vec![make(&d1)], 1).unwrap();
    let d3 = T::new(F32, dst_ne);
    run(vec![make(&d3)], 3).unwrap();
    let (a, b) = (d1.values(), d3.values());
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "thread count changes the result");
    a
}

#[test]
fn ssm_conv_by_hand() {
    // d_conv 2, d_inner 2, 2 tokens, 1 sequence.
    let sx = T::from_f32(F32, [3, 2, 1, 1], &[1.0, 2.0, 3.0, 0.5, -1.0, 4.0]);
    let c = T::from_f32(F32, [2, 2, 1, 1], &[10.0, 100.0, -2.0, 0.25]);
    let d = T::new(F32, [2, 2, 1, 1]);
    run(vec![node(GgmlOp::SsmConv, d.t(), &[sx.t(), c.t()])], 2).unwrap();
    // dst[i, t] = sx[t, i]·c[0, i] + sx[t + 1, i]·c[1, i].
    assert_eq!(d.values(), [210.0, -1.25, 320.0, 3.0]);
}

#[test]
fn ssm_conv_matches_f64_reference() {
    let mut r = rng(7001);
    let (d_conv, d_inner, n_t, n_s) = (4usize, 24usize, 5usize, 2usize);
    let ncs = d_conv - 1 + n_t;
    let sx = rand_t(&mut r, [ncs as u64, d_inner as u64, n_s as u64, 1], 1.0);
    let c = rand_t(&mut r, [d_conv as u64, d_inner as u64, 1, 1], 1.0);
    let dne = [d_inner as u64, n_t as u64, n_s as u64, 1];
    let got = run_both(|d| node(GgmlOp::SsmConv, d.t(), &[sx.t(), c.t()]), dne);
    let (xv, cv) = (sx.values(), c.values());
    let mut want = Vec::new();
    for s in 0..n_s {
        for t in 0..n_t {
            for i in 0..d_inner {
                want.push(
                    (0..d_conv).map(|k| xv[(s * d_inner + i) * ncs + t + k] * cv[i * d_conv + k]).sum(),
                );
            }
        }
    }
    check("ssm_conv", &got, &want, 1e-12);
}

#[test]
fn ssm_conv_refuses_malformed_nodes() {
    let sx = T::new(F32, [7, 8, 2, 1]);
    let c = T::new(F32, [4, 8, 1, 1]);
    let d = T::new(F32, [8, 4, 2, 1]);
    assert!(validate(vec![node(GgmlOp::SsmConv, d.t(), &[sx.t(), c.t()])]).is_ok());
    let bad = |dst: &T, a: compute::graph::Tensor, b: compute::graph::Tensor| {
        let r = validate(vec![node(GgmlOp::SsmConv, dst.t(), &[a, b])]);
        assert!(r.is_err(), "accepted");
        r.err().unwrap()
    };
    // sx's window is not d_conv − 1 + n_t.
    bad(&d, T::new(F32, [8, 8, 2, 1]).t(), c.t());
    // Channels and sequences disagree.
    bad(&d, sx.t(), T::new(F32, [4, 6, 1, 1]).t());
    bad(&T::new(F32, [8, 4, 3, 1]), sx.t(), c.t());
    bad(&T::new(F32, [8, 4, 2, 2]), T::new(F32, [7, 8, 2, 2]).t(), c.t());
    // d_conv 0.
    bad(&T::new(F32, [8, 4, 2, 1]), T::new(F32, [3, 8, 2, 1]).t(), T::new(F32, [0, 8, 1, 1]).t());
    // Wrong types.
    let e = bad(&d, sx.t(), T::new(GgmlType::F16, [4, 8, 1, 1]).t());
    assert!(matches!(e, Error::UnsupportedTypes { .. }), "{e:?}");
    bad(&T::new(GgmlType::F16, [8, 4, 2, 1]), sx.t(), c.t());
    // sx with rows not packed (a transposed view).
    let sxt = T::new(F32, [8, 7, 2, 1]);
    bad(&d, sxt.permuted([1, 0, 2, 3]), c.t());
    // Missing source; destination over a source.
    assert!(validate(vec![node(GgmlOp::SsmConv, d.t(), &[sx.t()])]).is_err());
    let over = T::new(F32, [8, 8, 1, 1]);
    let (dv, sv) =
        (over.view([8, 4, 1, 1], [4, 32, 128, 128], 0), over.view([7, 8, 1, 1], [4, 28, 224, 224], 0));
    assert!(validate(vec![node(GgmlOp::SsmConv, dv, &[sv, c.t()])]).is_err());
}

/// The shapes of an SSM_SCAN.
#[derive(Clone, Copy)]
struct Scan {
    d_state: usize,
    head_dim: usize,
    n_head: usize,
    n_group: usize,
    n_tok: usize,
    n_seqs: usize,
    n_states: usize,
    mamba1: bool,
    /// K: state slots per sequence (op_params[0]).
    slots: usize,
}

struct ScanTensors {
    s: T,
    x: T,
    dt: T,
    a: T,
    b: T,
    c: T,
    ids: T,
    dst_ne: [u64; 4],
}

fn scan_tensors(p: Scan, ids: &[i32], seed: u64) -> ScanTensors {
    let mut r = rng(seed);
    let u = |v: usize| v as u64;
    let (nc, nr, nh, ng, nt, ns) = (p.d_state, p.head_dim, p.n_head, p.n_group, p.n_tok, p.n_seqs);
    let s = rand_t(&mut r, [u(nc), u(nr), u(nh), u(p.n_states)], 0.5);
    let x = rand_t(&mut r, [u(nr), u(nh), u(nt), u(ns)], 0.5);
    let mut dtv = randv(&mut r, nh * nt * ns, 2.0);
    if dtv.len() > 1 {
        dtv[1] = 22.0;
    }
    let dt = T::from_f32(F32, [u(nh), u(nt), u(ns), 1], &dtv);
    let a_ne = [if p.mamba1 { u(nc) } else { 1 }, u(nh), 1, 1];
    let a = mapped_t(&mut r, a_ne, |v| -(v.abs() + 0.5));
    let b = rand_t(&mut r, [u(nc), u(ng), u(nt), u(ns)], 0.5);
    let c = rand_t(&mut r, [u(nc), u(ng), u(nt), u(ns)], 0.5);
    let ids = T::i32s([u(ns), 1, 1, 1], ids);
    let dst_ne = [u(nr * nh * nt * ns + p.slots * nc * nr * nh * ns), 1, 1, 1];
    ScanTensors { s, x, dt, a, b, c, ids, dst_ne }
}

impl ScanTensors {
    fn srcs(&self) -> Vec<compute::graph::Tensor> {
        [&self.s, &self.x, &self.dt, &self.a, &self.b, &self.c, &self.ids].iter().map(|t| t.t()).collect()
    }
}

/// An SSM_SCAN node with K = `slots`.
fn scan_node(dst: &T, srcs: &[compute::graph::Tensor], slots: i32) -> compute::graph::Node {
    node_p(GgmlOp::SsmScan, &[slots], dst.t(), srcs)
}

/// SSM_SCAN in f64 from its definition; slots no token reaches stay 0.
fn scan_reference(p: Scan, t: &ScanTensors, ids: &[i32]) -> Vec<f64> {
    let (nc, nr, nh, ng, nt, ns) = (p.d_state, p.head_dim, p.n_head, p.n_group, p.n_tok, p.n_seqs);
    let (sv, xv, dtv, av, bv, cv) =
        (t.s.values(), t.x.values(), t.dt.values(), t.a.values(), t.b.values(), t.c.values());
    let state = nc * nr * nh;
    let y_len = nr * nh * nt * ns;
    let mut out = vec![0.0f64; y_len + p.slots * state * ns];
    for q in 0..ns {
        let id = ids[q] as usize;
        let mut st: Vec<f64> = sv[id * nc * nr * nh..(id + 1) * nc * nr * nh].to_vec();
        for tok in 0..nt {
            for h in 0..nh {
                let g = h / (nh / ng);
                let d = dtv[(q * nt + tok) * nh + h];
                let d = if d > 20.0 { d } else { (1.0 + d.exp()).ln() };
                for i1 in 0..nr {
                    let x_dt = xv[((q * nt + tok) * nh + h) * nr + i1] * d;
                    let mut y = 0.0;
                    for i0 in 0..nc {
                        let a = if p.mamba1 { av[h * nc + i0] } else { av[h] };
                        let bc = ((q * nt + tok) * ng + g) * nc + i0;
                        let e = &mut st[(h * nr + i1) * nc + i0];
                        *e = *e * (d * a).exp() + bv[bc] * x_dt;
                        y += *e * cv[bc];
                    }
                    out[((q * nt + tok) * nh + h) * nr + i1] = y;
                }
            }
            // Slot k: the state after token n_tok − 1 − k.
            let slot = nt - 1 - tok;
            if slot < p.slots {
                let at = y_len + (slot * ns + q) * state;
                out[at..at + state].copy_from_slice(&st);
            }
        }
    }
    out
}

#[test]
fn ssm_scan_matches_f64_reference() {
    let mamba2 = |d_state, n_group, n_tok, n_seqs, slots| Scan {
        d_state,
        head_dim: 4,
        n_head: 4,
        n_group,
        n_tok,
        n_seqs,
        n_states: 3,
        mamba1: false,
        slots,
    };
    let mamba1 = Scan {
        d_state: 8,
        head_dim: 1,
        n_head: 12,
        n_group: 1,
        n_tok: 3,
        n_seqs: 2,
        n_states: 2,
        mamba1: true,
        slots: 1,
    };
    let cases = [
        (mamba2(16, 1, 3, 2, 1), vec![2, 0]),
        (mamba2(16, 2, 1, 1, 1), vec![1]),
        (mamba2(40, 4, 2, 3, 1), vec![1, 1, 0]),
        (mamba2(16, 2, 4, 2, 3), vec![0, 2]),
        (mamba2(32, 1, 2, 1, 2), vec![1]),
        (Scan { n_head: 6, n_group: 3, ..mamba2(8, 1, 2, 2, 1) }, vec![2, 1]),
        (mamba1, vec![1, 0]),
    ];
    for (i, (p, ids)) in cases.into_iter().enumerate() {
        let t = scan_tensors(p, &ids, 7100 + i as u64);
        let got = run_both(|d| scan_node(d, &t.srcs(), p.slots as i32), t.dst_ne);
        check(&format!("ssm_scan case {i}"), &got, &scan_reference(p, &t, &ids), 1e-10);
    }
}

#[test]
fn ssm_scan_refuses_malformed_nodes_and_bad_ids() {
    let p = Scan {
        d_state: 8,
        head_dim: 2,
        n_head: 4,
        n_group: 2,
        n_tok: 2,
        n_seqs: 2,
        n_states: 3,
        mamba1: false,
        slots: 1,
    };
    let t = scan_tensors(p, &[0, 2], 7200);
    let d = T::new(F32, t.dst_ne);
    assert!(validate(vec![scan_node(&d, &t.srcs(), 1)]).is_ok());
    let with = |k: usize, x: compute::graph::Tensor| {
        let mut s = t.srcs();
        s[k] = x;
        validate(vec![scan_node(&d, &s, 1)])
    };
    // K below 1 (ggml asserts K ≥ 1), or a K the destination has no room for.
    assert!(validate(vec![scan_node(&d, &t.srcs(), 0)]).is_err());
    assert!(validate(vec![scan_node(&d, &t.srcs(), -1)]).is_err());
    assert!(validate(vec![scan_node(&d, &t.srcs(), 2)]).is_err());
    // Rollback slots need Mamba-2's scalar A.
    let p1 = Scan { d_state: 4, head_dim: 1, n_head: 4, n_group: 1, mamba1: true, slots: 2, ..p };
    let t1 = scan_tensors(p1, &[0, 1], 7203);
    let d1 = T::new(F32, t1.dst_ne);
    assert!(validate(vec![scan_node(&d1, &t1.srcs(), 2)]).is_err());
    assert!(validate(vec![scan_node(
        &T::new(F32, scan_tensors(Scan { slots: 1, ..p1 }, &[0, 1], 7203).dst_ne),
        &t1.srcs(),
        1
    )])
    .is_ok());
    // ids of the wrong type, count or shape.
    assert!(matches!(with(6, T::new(F32, [2, 1, 1, 1]).t()), Err(Error::UnsupportedTypes { .. })));
    assert!(with(6, T::i32s([3, 1, 1, 1], &[0, 0, 0]).t()).is_err());
    // A neither {1, n_head} nor {d_state, n_head}; B, C, dt, x of other shapes.
    assert!(with(3, T::new(F32, [4, 4, 1, 1]).t()).is_err());
    assert!(with(3, T::new(F32, [1, 3, 1, 1]).t()).is_err());
    assert!(with(4, T::new(F32, [8, 2, 1, 2]).t()).is_err());
    assert!(with(5, T::new(F32, [8, 1, 2, 2]).t()).is_err());
    assert!(with(2, T::new(F32, [4, 2, 1, 1]).t()).is_err());
    assert!(with(0, T::new(F32, [8, 3, 4, 3]).t()).is_err());
    // F16 anywhere.
    assert!(matches!(with(1, T::new(GgmlType::F16, [2, 4, 2, 2]).t()), Err(Error::UnsupportedTypes { .. })));
    // Four groups for six heads; no groups.
    let p3 = Scan { n_head: 6, n_group: 4, ..p };
    let t3 = scan_tensors(p3, &[0, 1], 7201);
    assert!(validate(vec![scan_node(&T::new(F32, t3.dst_ne), &t3.srcs(), 1)]).is_err());
    let p0 = Scan { n_group: 0, ..p };
    let t0 = scan_tensors(p0, &[0, 1], 7201);
    assert!(validate(vec![scan_node(&T::new(F32, t0.dst_ne), &t0.srcs(), 1)]).is_err());
    // dst one element short, or 2-D.
    let short = T::new(F32, [t.dst_ne[0] - 1, 1, 1, 1]);
    assert!(validate(vec![scan_node(&short, &t.srcs(), 1)]).is_err());
    let two_d = T::new(F32, [t.dst_ne[0] / 2, 2, 1, 1]);
    assert!(validate(vec![scan_node(&two_d, &t.srcs(), 1)]).is_err());
    // States whose sequences are not packed one after the other.
    let wide = T::new(F32, [8, 2, 4, 4]);
    let spaced = wide.view([8, 2, 4, 2], [4, 32, 64, 512], 0);
    assert!(with(0, spaced).is_err());
    // ids missing.
    let mut six = t.srcs();
    six.pop();
    assert!(validate(vec![scan_node(&d, &six, 1)]).is_err());
    // An id out of range (3 states) fails the run without a panic; so does a negative one.
    for bad in [[0, 3], [-1, 0]] {
        let tb = scan_tensors(p, &bad, 7202);
        let r = run(vec![scan_node(&d, &tb.srcs(), 1)], 2);
        assert!(matches!(r, Err(Error::IndexOutOfRange { .. })), "{r:?}");
    }
}

/// Which linear-attention op.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Wkv {
    V6,
    Gla,
    V7,
}

impl Wkv {
    fn op(self) -> GgmlOp {
        match self {
            Wkv::V6 => GgmlOp::RwkvWkv6,
            Wkv::Gla => GgmlOp::GatedLinearAttn,
            Wkv::V7 => GgmlOp::RwkvWkv7,
        }
    }

    /// Per-token inputs (before the state).
    fn n_in(self) -> usize {
        match self {
            Wkv::V6 => 5,
            Wkv::Gla => 4,
            Wkv::V7 => 6,
        }
    }

    /// True for the inputs that are decays (kept in (0, 1)).
    fn is_decay(self, i: usize) -> bool {
        matches!((self, i), (Wkv::V6, 4) | (Wkv::Gla, 3) | (Wkv::V7, 1))
    }
}

/// The inputs of a WKV op: per-token tensors, then the state.
fn wkv_inputs(op: Wkv, s: usize, h: usize, t: usize, n_seqs: usize, seed: u64) -> Vec<T> {
    let mut r = rng(seed);
    let u = |v: usize| v as u64;
    let mut v = Vec::new();
    for i in 0..op.n_in() {
        let ne = if op == Wkv::V6 && i == 3 { [u(s), u(h), 1, 1] } else { [u(s), u(h), u(t), 1] };
        v.push(if op.is_decay(i) {
            mapped_t(&mut r, ne, |x| 0.5 + 0.45 * x)
        } else {
            rand_t(&mut r, ne, 0.5)
        });
    }
    v.push(rand_t(&mut r, [u(s * s * h), u(n_seqs), 1, 1], 0.5));
    v
}

/// The three ops in f64 from their definitions; dst {S·H, T + S·n_seqs} flattened.
fn wkv_reference(op: Wkv, ins: &[T], s: usize, h: usize, t: usize, n_seqs: usize, scale: f64) -> Vec<f64> {
    let vals: Vec<Vec<f64>> = ins.iter().map(|x| x.values()).collect();
    let c = s * h;
    let mut out = vec![0.0; c * (t + s * n_seqs)];
    let per = t / n_seqs;
    // Element (channel i of head hh, token tok) of input k.
    let at = |k: usize, tok: usize, hh: usize, i: usize| {
        let tok = if op == Wkv::V6 && k == 3 { 0 } else { tok };
        vals[k][(tok * h + hh) * s + i]
    };
    let state_in = &vals[op.n_in()];
    for q in 0..n_seqs {
        let mut st: Vec<f64> = state_in[q * s * c..(q + 1) * s * c].to_vec();
        for tok in q * per..(q + 1) * per {
            for hh in 0..h {
                let m = &mut st[hh * s * s..(hh + 1) * s * s];
                let y = &mut out[tok * c + hh * s..tok * c + (hh + 1) * s];
                match op {
                    Wkv::V6 => {
                        for i in 0..s {
                            for j in 0..s {
                                let kv = at(1, tok, hh, j) * at(0, tok, hh, i);
                                let prev = m[i * s + j];
                                y[j] += at(2, tok, hh, i) * (kv * at(3, tok, hh, i) + prev);
                                m[i * s + j] = prev * at(4, tok, hh, i) + kv;
                            }
                        }
                    }
                    Wkv::Gla => {
                        for i in 0..s {
                            for j in 0..s {
                                let new =
                                    m[i * s + j] * at(3, tok, hh, i) + at(1, tok, hh, j) * at(0, tok, hh, i);
                                m[i * s + j] = new;
                                y[j] += new * at(2, tok, hh, i) * scale;
                            }
                        }
                    }
                    Wkv::V7 => {
                        for i in 0..s {
                            let sa: f64 = (0..s).map(|j| at(4, tok, hh, j) * m[i * s + j]).sum();
                            for j in 0..s {
                                let new = m[i * s + j] * at(1, tok, hh, j)
                                    + at(2, tok, hh, j) * at(3, tok, hh, i)
                                    + sa * at(5, tok, hh, j);
                                m[i * s + j] = new;
                                y[i] += new * at(0, tok, hh, j);
                            }
                        }
                    }
                }
            }
        }
        out[(t + q * s) * c..(t + (q + 1) * s) * c].copy_from_slice(&st);
    }
    out
}

#[test]
fn wkv6_by_hand() {
    // S 2, H 1, one token: r = (1, 0) makes y the state's row 0 (key index 0) plus tf's term (0).
    let k = T::from_f32(F32, [2, 1, 1, 1], &[1.0, 2.0]);
    let v = T::from_f32(F32, [2, 1, 1, 1], &[3.0, 4.0]);
    let r = T::from_f32(F32, [2, 1, 1, 1], &[1.0, 0.0]);
    let tf = T::from_f32(F32, [2, 1, 1, 1], &[0.0, 0.0]);
    let td = T::from_f32(F32, [2, 1, 1, 1], &[0.5, 0.5]);
    let st = T::from_f32(F32, [4, 1, 1, 1], &[1.0, 2.0, 3.0, 4.0]);
    let d = T::new(F32, [2, 3, 1, 1]);
    run(vec![node(GgmlOp::RwkvWkv6, d.t(), &[k.t(), v.t(), r.t(), tf.t(), td.t(), st.t()])], 2).unwrap();
    // new[i, j] = prev[i, j]·td[i] + v[j]·k[i].
    assert_eq!(d.values(), [1.0, 2.0, 3.5, 5.0, 7.5, 10.0]);

    // S 1, H 1, two tokens of one sequence: the second starts from the state the first left.
    let k = T::from_f32(F32, [1, 1, 2, 1], &[2.0, 1.0]);
    let v = T::from_f32(F32, [1, 1, 2, 1], &[3.0, -1.0]);
    let r = T::from_f32(F32, [1, 1, 2, 1], &[0.5, 2.0]);
    let tf = T::from_f32(F32, [1, 1, 1, 1], &[0.25]);
    let td = T::from_f32(F32, [1, 1, 2, 1], &[0.5, 0.5]);
    let st = T::from_f32(F32, [1, 1, 1, 1], &[1.0]);
    let d = T::new(F32, [1, 3, 1, 1]);
    run(vec![node(GgmlOp::RwkvWkv6, d.t(), &[k.t(), v.t(), r.t(), tf.t(), td.t(), st.t()])], 2).unwrap();
    // t0: kv 6, y = 0.5·(6·0.25 + 1) = 1.25, state 1·0.5 + 6 = 6.5;
    // t1: kv −1, y = 2·(−0.25 + 6.5) = 12.5, state 6.5·0.5 − 1 = 2.25.
    assert_eq!(d.values(), [1.25, 12.5, 2.25]);
}

#[test]
fn wkv_ops_match_f64_reference() {
    let mut seed = 7300;
    for op in [Wkv::V6, Wkv::Gla, Wkv::V7] {
        // S 8 (no 32-lane block), 40 (one block and a tail), 64 (two blocks).
        for (s, h, t, n_seqs) in [(8, 3, 4, 2), (40, 2, 3, 1), (64, 2, 2, 2)] {
            seed += 1;
            let ins = wkv_inputs(op, s, h, t, n_seqs, seed);
            let scale = 0.3f32;
            let params = if op == Wkv::Gla { vec![f(scale)] } else { vec![] };
            let srcs: Vec<_> = ins.iter().map(|x| x.t()).collect();
            let dne = [(s * h) as u64, (t + s * n_seqs) as u64, 1, 1];
            let got = run_both(|d| node_p(op.op(), &params, d.t(), &srcs), dne);
            let want = wkv_reference(op, &ins, s, h, t, n_seqs, scale as f64);
            check(&format!("{op:?} S{s} H{h} T{t} seqs {n_seqs}"), &got, &want, 1e-10);
        }
    }
}

#[test]
fn wkv_ops_refuse_malformed_nodes() {
    let (s, h, t, n_seqs) = (4usize, 2usize, 4usize, 2usize);
    let u = |v: usize| v as u64;
    for op in [Wkv::V6, Wkv::Gla, Wkv::V7] {
        let ins = wkv_inputs(op, s, h, t, n_seqs, 7400);
        let d = T::new(F32, [u(s * h), u(t + s * n_seqs), 1, 1]);
        let params = [f(1.0)];
        let try_with = |k: usize, x: Option<compute::graph::Tensor>, dst: &T| {
            let mut srcs: Vec<_> = ins.iter().map(|x| x.t()).collect();
            match x {
                Some(x) => srcs[k] = x,
                None => {
                    srcs.remove(k);
                }
            }
            validate(vec![node_p(op.op(), &params, dst.t(), &srcs)])
        };
        let n = op.n_in();
        assert!(validate(vec![node_p(
            op.op(),
            &params,
            d.t(),
            &ins.iter().map(|x| x.t()).collect::<Vec<_>>()
        )])
        .is_ok());
        // Each per-token input with one token too few, or F16.
        for (k, x) in ins.iter().enumerate().take(n) {
            let ne = if op == Wkv::V6 && k == 3 { [u(s), u(h), 2, 1] } else { [u(s), u(h), u(t - 1), 1] };
            assert!(try_with(k, Some(T::new(F32, ne).t()), &d).is_err(), "{op:?} src{k} shape");
            let r = try_with(k, Some(T::new(GgmlType::F16, x.l.ne).t()), &d);
            assert!(matches!(r, Err(Error::UnsupportedTypes { .. })), "{op:?} src{k} type: {r:?}");
        }
        // A state of the wrong size; tokens that do not split into the sequences (3 sequences of 4
        // tokens); the state missing.
        assert!(try_with(n, Some(T::new(F32, [u(s * s * h + 1), u(n_seqs), 1, 1]).t()), &d).is_err());
        let d3 = T::new(F32, [u(s * h), u(t + s * 3), 1, 1]);
        assert!(try_with(n, Some(T::new(F32, [u(s * s * h), 3, 1, 1]).t()), &d3).is_err());
        assert!(try_with(n, None, &d).is_err());
        // dst one row short; a permuted (non-contiguous) input.
        let short = T::new(F32, [u(s * h), u(t + s * n_seqs - 1), 1, 1]);
        assert!(try_with(0, Some(ins[0].t()), &short).is_err());
        let perm = T::new(F32, [u(s), u(t), u(h), 1]);
        assert!(try_with(0, Some(perm.permuted([0, 2, 1, 3])), &d).is_err(), "{op:?} permuted");
        // dst over a source.
        let both = T::new(F32, [u(s * h), u(t + s * n_seqs), 1, 1]);
        let srcs: Vec<_> = ins.iter().map(|x| x.t()).collect();
        let mut srcs2 = srcs.clone();
        srcs2[0] = both.view([u(s), u(h), u(t), 1], [4, u(4 * s), u(4 * s * h), u(4 * s * h * t)], 0);
        assert!(validate(vec![node_p(op.op(), &params, both.t(), &srcs2)]).is_err());
    }
    // S = H = T = 1: a state element with a stride other than 4 bytes is refused too.
    let one = || T::from_f32(F32, [1, 1, 1, 1], &[0.5]);
    let (k, v, r, tf, td) = (one(), one(), one(), one(), one());
    let wide = T::new(F32, [2, 1, 1, 1]);
    let d = T::new(F32, [1, 2, 1, 1]);
    let srcs = |st: compute::graph::Tensor| vec![k.t(), v.t(), r.t(), tf.t(), td.t(), st];
    assert!(validate(vec![node(GgmlOp::RwkvWkv6, d.t(), &srcs(one().t()))]).is_ok());
    let strided = wide.view([1, 1, 1, 1], [8, 8, 8, 8], 0);
    assert!(validate(vec![node(GgmlOp::RwkvWkv6, d.t(), &srcs(strided))]).is_err());
}
