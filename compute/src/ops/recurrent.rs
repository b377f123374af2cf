//! SSM_CONV, SSM_SCAN, RWKV_WKV6, GATED_LINEAR_ATTN and RWKV_WKV7: the recurrent ops of Mamba,
//! Mamba-2 (and the hybrid models built on them), RWKV-6, RWKV-7 and gated linear attention. All
//! F32.
//!
//! - **SSM_CONV** (src0 `sx` {d_conv−1+n_t, d_inner, n_s}, src1 `c` {d_conv, d_inner}; dst
//!   {d_inner, n_t, n_s}): the causal depthwise convolution of Mamba,
//!   `dst[i, t, s] = Σ_{k<d_conv} sx[t+k, i, s] · c[k, i]`.
//! - **SSM_SCAN** (src0 states `s` {d_state, head_dim, n_head, n_states}, src1 `x` {head_dim,
//!   n_head, n_tok, n_seqs}, src2 `dt` {n_head, n_tok, n_seqs}, src3 `A` {d_state, n_head}
//!   (Mamba-1, one decay per state element) or {1, n_head} (Mamba-2, one per head), src4 `B` and
//!   src5 `C` {d_state, n_group, n_tok, n_seqs}, src6 `ids` I32 {n_seqs}; op_params i32\[0\] = K ≥ 1
//!   state slots): the selective scan. dst is one flat F32 vector: `y` laid out as `x` is shaped
//!   (contiguous), then K·n_seqs states laid out as `s`, slot `k` of sequence `q` at element
//!   `nelements(x) + (k·n_seqs + q)·d_state·head_dim·n_head`. Slot 0 is the final state; slot
//!   `k` (`0 < k < K`, Mamba-2 only) the state after token `n_tok − 1 − k`, which a rollback of
//!   `k` tokens restores (slots of no token, `k ≥ n_tok`, are left as they are). Sequence `q`
//!   starts from state `s[.., ids[q]]`; for each token in order and head `h` (group
//!   `g = h / (n_head / n_group)`), with `δ = softplus(dt[h]) = ln(1 + exp(dt[h]))` (`dt` itself
//!   above 20): `st[i0, i1, h] = st[i0, i1, h] · exp(δ·A[·, h]) + B[i0, g] · (x[i1, h] · δ)` and
//!   `y[i1, h] = Σ_{i0} st[i0, i1, h] · C[i0, g]`. Mamba-1 runs with head_dim 1 and n_head =
//!   d_inner. An id outside `0..n_states` skips its sequence and fails the graph
//!   (`IndexOutOfRange`).
//! - **RWKV_WKV6** (src0 `k`, src1 `v`, src2 `r`, src4 `td` each {S, H, T}; src3 `tf` {S, H};
//!   src5 state {S·S·H, n_seqs}), **GATED_LINEAR_ATTN** (src0 `k`, src1 `v`, src2 `q`, src3 `g`
//!   each {S, H, T}; src4 state; op_params f32\[0\] = scale) and **RWKV_WKV7** (src0 `r`, src1 `w`,
//!   src2 `k`, src3 `v`, src4 `a`, src5 `b` each {S, H, T}; src6 state): dst {S·H, T + S·n_seqs},
//!   rows `0..T` the outputs `y` (token `t`, head `h`, channel `j` at `h·S + j`), then the final
//!   states (sequence `q`'s S·S·H values, head `h`'s matrix at `h·S·S`, row-major). The T tokens
//!   are `n_seqs` sequences of equal length; each starts from its state in src5 (src4, src6) and
//!   goes on from the state the previous token left. Per head, with `prev[i, j]` the state:
//!   - WKV6: `kv = v[j]·k[i]`, `y[j] = Σ_i r[i]·(kv·tf[i] + prev[i, j])`,
//!     `new[i, j] = prev[i, j]·td[i] + kv`;
//!   - GLA: `new[i, j] = prev[i, j]·g[i] + v[j]·k[i]`, `y[j] = Σ_i new[i, j]·(q[i]·scale)`;
//!   - WKV7: `sa_i = Σ_j a[j]·prev[i, j]`, `new[i, j] = prev[i, j]·w[j] + k[j]·v[i] + sa_i·b[j]`,
//!     `y[i] = Σ_j new[i, j]·r[j]`.
//!
//! The arithmetic is that of ggml's x86 build (AVX2 with FMA, compiled by GCC, as read from the
//! reference's machine code), so the results are ggml's bit for bit: every sum runs in the order
//! ggml's loops take, and a product is fused into its sum (`mul_add`) exactly where ggml's code
//! fuses it (its vector kernels' multiply-adds, and the scalar loops where the compiler contracts
//! `a·b + c`, fusing the first product of the sum). Where that is not the obvious reading:
//! SSM_CONV's sum, which the compiler vectorises keeping the order of the additions, rounds the
//! products of the first multiple of 4 taps before adding them (the last `d_conv mod 4` are fused);
//! GLA's channels past the last multiple of 8 (ggml's scalar loop) fuse `v·k` into the rounded
//! decay product, the others the decay into `v·k`; the sums ggml forms in 8-lane vectors with four
//! accumulators (Mamba-2's `y` over the first multiple of 32 state elements, WKV7's `sa` and `y`)
//! keep 32 partial sums reduced as ggml's AVX reduction does ([`reduce32`]). exp and ln are the C
//! library's, as in ggml. ggml's AVX2 WKV7 kernel assumes S is a multiple of 32 (it reads and
//! writes past the head otherwise); other S are computed here with the leftover elements summed
//! after the reduction, which no reference checks.
//!
//! Layouts: ggml addresses these tensors with fixed strides in places (a state row, a head of
//! `x`, the WKV tensors as a whole), so `prepare` refuses layouts where those would differ from the
//! logical ones; within them every access here goes through [`Tv`]'s checked indexing.

use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::graph::Node;
use crate::op::GgmlOp;

use super::access::Tv;
use super::{check_overlap, param_f32, shape_err, src, tv, types_err, Alias, Ctx, Kind, Plan, MAX_UNITS};

/// Lanes of ggml's AVX2 vector loops: four accumulators of eight floats.
const LANES: usize = 32;

/// ggml's `GGML_F32_VEC_REDUCE` on AVX: accumulator `k` lane `l` is `acc[8k + l]`; `(a0 + a2) +
/// (a1 + a3)`, then the two 128-bit halves added, then two horizontal adds.
fn reduce32(acc: &[f32; LANES]) -> f32 {
    let a: [f32; 8] = std::array::from_fn(|l| (acc[l] + acc[16 + l]) + (acc[8 + l] + acc[24 + l]));
    let t: [f32; 4] = std::array::from_fn(|l| a[l] + a[l + 4]);
    (t[0] + t[1]) + (t[2] + t[3])
}

/// ggml's softplus of the time step: `ln(1 + exp(x))`, `x` itself above 20.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// True when dims `0..k` of `t` are packed F32 (element `(i0, i1, ..)` at `4·(i0 + ne0·(i1 + ..))`):
/// `nb[0]` is 4 (as ggml asserts, and as the span copies here need), higher dims of one element may
/// have any stride.
fn packed_to(t: &Tv, k: usize) -> bool {
    let mut want = 4usize;
    for d in 0..k {
        if (d == 0 || t.ne[d] > 1) && t.nb[d] != want {
            return false;
        }
        want = want.saturating_mul(t.ne[d]);
    }
    true
}

/// Per-thread scratch of `terms` (each a product of sizes), or a shape error when it overflows.
fn scratch(op: GgmlOp, terms: &[&[usize]]) -> Result<usize> {
    terms
        .iter()
        .try_fold(0usize, |acc, t| t.iter().try_fold(1usize, |p, &x| p.checked_mul(x))?.checked_add(acc))
        .ok_or_else(|| shape_err(op, "scratch size overflows"))
}

/// Refuses any tensor of `ts` that is not F32.
fn all_f32(op: GgmlOp, ts: &[(&str, &Tv)]) -> Result<()> {
    match ts.iter().find(|(_, t)| t.dtype() != GgmlType::F32) {
        Some((what, t)) => Err(types_err(op, format!("{what} must be F32, got {}", t.dtype()))),
        None => Ok(()),
    }
}

/// Refuses a destination that overlaps any of `srcs`.
fn no_overlap(op: GgmlOp, dst: &Tv, srcs: &[&Tv]) -> Result<()> {
    srcs.iter().try_for_each(|s| check_overlap(op, dst, s, Alias::Never))
}

/// A one-phase plan of `units` units.
fn plan(kind: Kind, units: usize, local_f32: usize) -> Plan {
    Plan { phases: 1, units: [units.clamp(1, MAX_UNITS), 0], shared_bytes: 0, local_f32, kind }
}

/// A planned SSM_CONV.
pub(crate) struct SsmConv {
    sx: Tv,
    c: Tv,
    dst: Tv,
}

/// Validates SSM_CONV.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare_ssm_conv(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let (sx, c, dst) = unsafe { (tv(src(n, 0)?)?, tv(src(n, 1)?)?, tv(&n.dst)?) };
    all_f32(op, &[("sx", &sx), ("c", &c), ("dst", &dst)])?;
    let d_conv = c.ne[0];
    let (d_inner, n_t, n_s) = (dst.ne[0], dst.ne[1], dst.ne[2]);
    let window = (d_conv.checked_sub(1)).and_then(|w| w.checked_add(n_t));
    if d_conv == 0
        || window != Some(sx.ne[0])
        || sx.ne[1..] != [d_inner, n_s, 1]
        || c.ne[1..] != [d_inner, 1, 1]
        || dst.ne[3] != 1
    {
        return Err(shape_err(
            op,
            format!(
                "sx {:?}, c {:?}, dst {:?} do not match (sx {{d_conv-1+n_t, d_inner, n_s}})",
                sx.ne, c.ne, dst.ne
            ),
        ));
    }
    // ggml walks a row of sx and of c, and dst's elements, with the packed stride.
    if !packed_to(&sx, 2) || !packed_to(&c, 2) || !packed_to(&dst, 1) {
        return Err(shape_err(
            op,
            "sx and c need packed rows (and rows of sx one after the other), dst packed elements",
        ));
    }
    no_overlap(op, &dst, &[&sx, &c])?;
    let local = scratch(op, &[&[sx.ne[0]], &[d_conv]])?;
    Ok(plan(Kind::SsmConv(SsmConv { sx, c, dst }), d_inner.saturating_mul(n_s), local))
}

impl SsmConv {
    /// Each unit takes some `(channel, sequence)` pairs and computes every token of them.
    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        let (d_inner, n_t) = (self.dst.ne[0], self.dst.ne[1]);
        let (ncs, d_conv) = (self.sx.ne[0], self.c.ne[0]);
        // ggml sums in f32 from k = 0; its compiler computes the products of the first multiple of
        // 4 taps in vectors (rounded) and fuses the others into the sum.
        let split = d_conv / 4 * 4;
        for p in ctx.range(d_inner * self.dst.ne[2]) {
            let (i, s) = (p % d_inner, p / d_inner);
            let (x, w) = ctx.local[..ncs + d_conv].split_at_mut(ncs);
            self.sx.load_row(i, s, 0, x);
            self.c.load_row(i, 0, 0, w);
            for t in 0..n_t {
                let mut sum = 0.0f32;
                for (k, (&a, &b)) in x[t..t + d_conv].iter().zip(w.iter()).enumerate() {
                    sum = if k < split { sum + a * b } else { a.mul_add(b, sum) };
                }
                self.dst.set_f32(i, t, s, 0, sum);
            }
        }
    }
}

/// A planned SSM_SCAN.
pub(crate) struct SsmScan {
    s: Tv,
    x: Tv,
    dt: Tv,
    a: Tv,
    b: Tv,
    c: Tv,
    ids: Tv,
    dst: Tv,
    /// One decay per head (`A` {1, n_head}) rather than per state element.
    mamba2: bool,
    /// State slots per sequence (op_params\[0\]).
    slots: usize,
}

/// Validates SSM_SCAN.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare_ssm_scan(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let (s, x, dt, a, b, c, ids, dst) = unsafe {
        (
            tv(src(n, 0)?)?,
            tv(src(n, 1)?)?,
            tv(src(n, 2)?)?,
            tv(src(n, 3)?)?,
            tv(src(n, 4)?)?,
            tv(src(n, 5)?)?,
            tv(src(n, 6)?)?,
            tv(&n.dst)?,
        )
    };
    all_f32(op, &[("s", &s), ("x", &x), ("dt", &dt), ("A", &a), ("B", &b), ("C", &c), ("dst", &dst)])?;
    if ids.dtype() != GgmlType::I32 {
        return Err(types_err(op, format!("ids must be I32, got {}", ids.dtype())));
    }
    let (nc, nr, nh, nt, ns) = (s.ne[0], x.ne[0], x.ne[1], x.ne[2], x.ne[3]);
    let ng = b.ne[1];
    let mamba2 = a.ne[0] == 1;
    // ggml asserts K ≥ 1 and keeps rollback slots for Mamba-2 only.
    let slots = match usize::try_from(n.op_params[0]) {
        Ok(k) if k >= 1 && (mamba2 || k == 1) => k,
        _ => {
            return Err(shape_err(
                op,
                format!("{} state slots (K ≥ 1; 1 unless A is {{1, n_head}})", n.op_params[0]),
            ))
        }
    };
    let shapes_ok = s.ne[1] == nr
        && s.ne[2] == nh
        && dt.ne == [nh, nt, ns, 1]
        && (mamba2 || a.ne[0] == nc)
        && a.ne[1..] == [nh, 1, 1]
        && b.ne == [nc, ng, nt, ns]
        && c.ne == b.ne
        && ids.ne == [ns, 1, 1, 1];
    if !shapes_ok {
        return Err(shape_err(
            op,
            format!(
                "s {:?}, x {:?}, dt {:?}, A {:?}, B {:?}, C {:?}, ids {:?} do not match",
                s.ne, x.ne, dt.ne, a.ne, b.ne, c.ne, ids.ne
            ),
        ));
    }
    // ggml maps head h to group h / (n_head / n_group).
    if ng == 0 || nh % ng != 0 {
        return Err(shape_err(op, format!("{ng} groups for {nh} heads")));
    }
    let state = nc * nr * nh;
    let states = state.checked_mul(ns).and_then(|v| v.checked_mul(slots));
    let want = states.and_then(|v| v.checked_add(x.nelements()));
    if want.is_none_or(|w| dst.ne != [w, 1, 1, 1]) {
        return Err(shape_err(
            op,
            format!("dst {:?} for y {:?} and {slots}×{ns} states of {state}", dst.ne, x.ne),
        ));
    }
    // ggml addresses a state, a token's x, dt, A, a token's B and C, ids and dst as packed, puts
    // slot k of sequence q (k·n_seqs + q)·nb3(s) bytes after y and copies a slot nb2(s) bytes per
    // head.
    let packed = packed_to(&s, 3)
        && (ns.saturating_mul(slots) <= 1 || Some(s.nb[3]) == state.checked_mul(4))
        && (slots == 1 || Some(s.nb[2]) == (nc * nr).checked_mul(4))
        && packed_to(&x, 2)
        && packed_to(&dt, 1)
        && packed_to(&a, 2)
        && packed_to(&b, 2)
        && packed_to(&c, 2)
        && packed_to(&ids, 1)
        && packed_to(&dst, 1);
    if !packed {
        return Err(shape_err(
            op,
            "states (and their sequences), heads of x, rows of dt, A, B, C, ids and dst must be packed",
        ));
    }
    no_overlap(op, &dst, &[&s, &x, &dt, &a, &b, &c, &ids])?;
    let local = scratch(op, &[&[nr, nc], &[3, nc]])?;
    Ok(plan(Kind::SsmScan(Box::new(SsmScan { s, x, dt, a, b, c, ids, dst, mamba2, slots })), nh, local))
}

impl SsmScan {
    /// Each unit takes some heads and scans every sequence of them, token by token; the head's
    /// state stays in scratch and is stored to the slots that keep it.
    pub(crate) fn run(&self, op: GgmlOp, ctx: &mut Ctx<'_>) {
        let (nc, nr, nh, nt, ns) = (self.s.ne[0], self.x.ne[0], self.x.ne[1], self.x.ne[2], self.x.ne[3]);
        let n_states = self.s.ne[3];
        let heads_per_group = nh / self.b.ne[1];
        let y_len = self.x.nelements();
        let state_len = nc * nr * nh;
        let heads = ctx.range(nh);
        let (st, rest) = ctx.local[..nr * nc + 3 * nc].split_at_mut(nr * nc);
        let (bv, rest) = rest.split_at_mut(nc);
        let (cv, av) = rest.split_at_mut(nc);
        // The first sequence whose state id is out of range, with the id.
        let mut bad = None;
        for h in heads {
            let g = h / heads_per_group;
            if !self.mamba2 {
                self.a.load_row(h, 0, 0, av);
            }
            for q in 0..ns {
                let id = self.ids.get_index(q, 0, 0, 0);
                if id < 0 || id as usize >= n_states {
                    bad = bad.or(Some((q, id)));
                    continue;
                }
                for i1 in 0..nr {
                    self.s.load_row(i1, h, id as usize, &mut st[i1 * nc..(i1 + 1) * nc]);
                }
                for t in 0..nt {
                    let dt = softplus(self.dt.get_f32(h, t, q, 0));
                    self.b.load_row(g, t, q, bv);
                    self.c.load_row(g, t, q, cv);
                    let da = if self.mamba2 { (dt * self.a.get_f32(0, h, 0, 0)).exp() } else { 0.0 };
                    for i1 in 0..nr {
                        let x_dt = self.x.get_f32(i1, h, t, q) * dt;
                        let row = &mut st[i1 * nc..(i1 + 1) * nc];
                        let y = if self.mamba2 {
                            scan_row_mamba2(row, bv, cv, da, x_dt)
                        } else {
                            scan_row_mamba1(row, bv, cv, av, dt, x_dt)
                        };
                        self.dst.set_f32(((q * nt + t) * nh + h) * nr + i1, 0, 0, 0, y);
                    }
                    // Slot 0 takes the state after the last token, slot k the one k tokens before.
                    let slot = nt - 1 - t;
                    if slot < self.slots {
                        let at = y_len + (slot * ns + q) * state_len + h * nr * nc;
                        self.dst.store_f32s(at, 0, 0, 0, st);
                    }
                }
            }
        }
        if let Some((q, id)) = bad {
            ctx.errors.report(Error::IndexOutOfRange {
                op,
                detail: format!("state id {id} of sequence {q} outside 0..{n_states}"),
            });
        }
    }
}

/// One state row of a Mamba-2 head for one token: updates `row` in place and returns `y`. ggml
/// vectorises the first multiple of 32 elements (products fused into the state and into 32 partial
/// sums of `y`) and finishes the rest in scalar code (fused the same way), adding to the reduced sum.
fn scan_row_mamba2(row: &mut [f32], b: &[f32], c: &[f32], da: f32, x_dt: f32) -> f32 {
    let nc = row.len();
    let np = nc / LANES * LANES;
    let mut acc = [0.0f32; LANES];
    for i in 0..np {
        let st = row[i].mul_add(da, b[i] * x_dt);
        acc[i % LANES] = st.mul_add(c[i], acc[i % LANES]);
        row[i] = st;
    }
    let mut y = reduce32(&acc);
    for i in np..nc {
        let st = row[i].mul_add(da, b[i] * x_dt);
        y = st.mul_add(c[i], y);
        row[i] = st;
    }
    y
}

/// One state row of a Mamba-1 channel for one token: a decay per state element (`exp(δ·A)`), `y`
/// summed in order (ggml's scalar loop, products fused).
fn scan_row_mamba1(row: &mut [f32], b: &[f32], c: &[f32], a: &[f32], dt: f32, x_dt: f32) -> f32 {
    let mut y = 0.0f32;
    for i in 0..row.len() {
        let st = row[i].mul_add((dt * a[i]).exp(), b[i] * x_dt);
        y = st.mul_add(c[i], y);
        row[i] = st;
    }
    y
}

/// Which linear-attention recurrence.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Rule {
    /// RWKV_WKV6: inputs k, v, r, tf, td.
    Wkv6,
    /// GATED_LINEAR_ATTN: inputs k, v, q, g; the query scale.
    Gla(f32),
    /// RWKV_WKV7: inputs r, w, k, v, a, b.
    Wkv7,
}

/// A planned RWKV_WKV6, GATED_LINEAR_ATTN or RWKV_WKV7.
pub(crate) struct Wkv {
    rule: Rule,
    /// The per-token inputs in source order (and WKV6's `tf`).
    ins: Vec<Tv>,
    state: Tv,
    dst: Tv,
    /// Head size S, heads H, tokens T, sequences.
    s: usize,
    h: usize,
    t: usize,
    n_seqs: usize,
}

/// Validates RWKV_WKV6, GATED_LINEAR_ATTN and RWKV_WKV7.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare_wkv(n: &Node) -> Result<Plan> {
    let op = n.op;
    let (rule, n_in, key) = match op {
        GgmlOp::RwkvWkv6 => (Rule::Wkv6, 5, 0),
        GgmlOp::GatedLinearAttn => (Rule::Gla(param_f32(n, 0)), 4, 0),
        _ => (Rule::Wkv7, 6, 2),
    };
    let mut ins = Vec::with_capacity(n_in);
    for i in 0..n_in {
        // SAFETY: forwarded contract.
        ins.push(unsafe { tv(src(n, i)?)? });
    }
    // SAFETY: forwarded contract.
    let (state, dst) = unsafe { (tv(src(n, n_in)?)?, tv(&n.dst)?) };
    for (i, t) in ins.iter().chain([&state, &dst]).enumerate() {
        if t.dtype() != GgmlType::F32 {
            return Err(types_err(
                op,
                format!("tensor {i} (sources, then dst) must be F32, got {}", t.dtype()),
            ));
        }
    }
    let (s, h, t) = (ins[key].ne[0], ins[key].ne[1], ins[key].ne[2]);
    let n_seqs = state.ne[1];
    for (i, x) in ins.iter().enumerate() {
        // WKV6's time_first (src3) is one row per head.
        let want = if rule == Rule::Wkv6 && i == 3 { [s, h, 1, 1] } else { [s, h, t, 1] };
        if x.ne != want {
            return Err(shape_err(op, format!("src{i} {:?}, expected {want:?}", x.ne)));
        }
    }
    let c = s * h;
    let state_ok = s.checked_mul(c).is_some_and(|len| state.ne == [len, n_seqs, 1, 1]);
    let rows = s.checked_mul(n_seqs).and_then(|r| r.checked_add(t));
    if !state_ok || rows.is_none_or(|r| dst.ne != [c, r, 1, 1]) {
        return Err(shape_err(
            op,
            format!("state {:?}, dst {:?} for S {s}, H {h}, T {t} ({n_seqs} sequences)", state.ne, dst.ne),
        ));
    }
    if n_seqs == 0 || t % n_seqs != 0 {
        return Err(shape_err(op, format!("{t} tokens in {n_seqs} sequences of equal length")));
    }
    // ggml addresses every tensor of these ops as contiguous.
    if !ins.iter().chain([&state, &dst]).all(|x| packed_to(x, 4)) {
        return Err(shape_err(op, "every tensor must be contiguous"));
    }
    let srcs: Vec<&Tv> = ins.iter().chain([&state]).collect();
    no_overlap(op, &dst, &srcs)?;
    let local = scratch(op, &[&[s, s], &[n_in + 1, s]])?;
    Ok(plan(Kind::Wkv(Box::new(Wkv { rule, ins, state, dst, s, h, t, n_seqs })), h, local))
}

impl Wkv {
    /// Each unit takes some heads and runs every sequence of them, token by token, the head's S×S
    /// state in scratch.
    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        let s = self.s;
        let n_in = self.ins.len();
        let heads = ctx.range(self.h);
        let (st, rest) = ctx.local[..s * s + (n_in + 1) * s].split_at_mut(s * s);
        let (y, rows) = rest.split_at_mut(s);
        let per_seq = self.t / self.n_seqs;
        let c = s * self.h;
        for h in heads {
            for q in 0..self.n_seqs {
                if per_seq == 0 {
                    break;
                }
                self.state.load_f32s(h * s * s, q, 0, 0, st);
                for t in q * per_seq..(q + 1) * per_seq {
                    for (i, x) in self.ins.iter().enumerate() {
                        let tt = if self.rule == Rule::Wkv6 && i == 3 { 0 } else { t };
                        x.load_row(h, tt, 0, &mut rows[i * s..(i + 1) * s]);
                    }
                    let row = |i: usize| &rows[i * s..(i + 1) * s];
                    match self.rule {
                        Rule::Wkv6 => wkv6_token(st, y, row(0), row(1), row(2), row(3), row(4)),
                        Rule::Gla(scale) => gla_token(st, y, row(0), row(1), row(2), row(3), scale),
                        Rule::Wkv7 => wkv7_token(st, y, [row(0), row(1), row(2), row(3), row(4), row(5)]),
                    }
                    self.dst.store_f32s(h * s, t, 0, 0, y);
                }
                // Sequence q's state: rows T + q·S.., head h at h·S·S (rows of the state never
                // straddle rows of dst, whose width S·H is a multiple of S).
                for i in 0..s {
                    let at = h * s * s + i * s;
                    self.dst.store_f32s(at % c, self.t + q * s + at / c, 0, 0, &st[i * s..(i + 1) * s]);
                }
            }
        }
    }
}

/// One WKV6 token of one head: `st` (S×S, row i = key index) updated in place, `y` written.
fn wkv6_token(st: &mut [f32], y: &mut [f32], k: &[f32], v: &[f32], r: &[f32], tf: &[f32], td: &[f32]) {
    let s = y.len();
    y.fill(0.0);
    for i in 0..s {
        let row = &mut st[i * s..(i + 1) * s];
        for j in 0..s {
            let kv = v[j] * k[i];
            let prev = row[j];
            let temp = kv.mul_add(tf[i], prev);
            y[j] = temp.mul_add(r[i], y[j]);
            row[j] = prev.mul_add(td[i], kv);
        }
    }
}

/// One GLA token of one head (as [`wkv6_token`]). ggml's kernel fuses the decay into `kv` for the
/// channels it runs in 8-lane vectors; for the other `S mod 8`, its compiler fuses `v·k` into the
/// rounded decay product instead.
fn gla_token(st: &mut [f32], y: &mut [f32], k: &[f32], v: &[f32], q: &[f32], g: &[f32], scale: f32) {
    let s = y.len();
    let vec = s / 8 * 8;
    y.fill(0.0);
    for i in 0..s {
        let row = &mut st[i * s..(i + 1) * s];
        let qs = q[i] * scale;
        for j in 0..s {
            let new =
                if j < vec { row[j].mul_add(g[i], v[j] * k[i]) } else { v[j].mul_add(k[i], row[j] * g[i]) };
            y[j] = new.mul_add(qs, y[j]);
            row[j] = new;
        }
    }
}

/// One WKV7 token of one head (inputs r, w, k, v, a, b): row `i` of the state is output `i`'s;
/// `sa` and `y` are summed in ggml's 32 lanes (see the module doc).
fn wkv7_token(st: &mut [f32], y: &mut [f32], [r, w, k, v, a, b]: [&[f32]; 6]) {
    let s = y.len();
    let np = s / LANES * LANES;
    for i in 0..s {
        let row = &mut st[i * s..(i + 1) * s];
        let mut acc = [0.0f32; LANES];
        for j in 0..np {
            acc[j % LANES] = a[j].mul_add(row[j], acc[j % LANES]);
        }
        let mut sa = reduce32(&acc);
        for j in np..s {
            sa = a[j].mul_add(row[j], sa);
        }
        let mut acc = [0.0f32; LANES];
        for j in 0..s {
            let kv = v[i] * k[j];
            let new = sa.mul_add(b[j], row[j].mul_add(w[j], kv));
            row[j] = new;
            if j < np {
                acc[j % LANES] = new.mul_add(r[j], acc[j % LANES]);
            }
        }
        let mut yi = reduce32(&acc);
        for j in np..s {
            yi = row[j].mul_add(r[j], yi);
        }
        y[i] = yi;
    }
}

/// A planned SOLVE_TRI: `X` with `A·X = B`, `A` lower triangular (src0 {n, n, B1, B2}, src1 and dst
/// {k, n, B1, B2}), by forward substitution down each column, in ggml's order:
/// `X[c, r] = (B[c, r] − Σ_{t<r} A[t, r]·X[c, t]) / A[r, r]`, summed from t = 0 with the products
/// of the first multiple of 4 terms rounded and the others fused, as ggml's x86 build computes it
/// (bit for bit: the differential test).
pub(crate) struct SolveTri {
    a: Tv,
    b: Tv,
    dst: Tv,
}

/// Validates SOLVE_TRI.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare_solve_tri(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let (a, b, dst) = unsafe { (tv(src(n, 0)?)?, tv(src(n, 1)?)?, tv(&n.dst)?) };
    all_f32(op, &[("A", &a), ("B", &b), ("dst", &dst)])?;
    let ok = a.ne[0] == a.ne[1]
        && b.ne[1] == a.ne[1]
        && b.ne[2] == a.ne[2]
        && b.ne[3] == a.ne[3]
        && dst.ne == b.ne;
    if !ok {
        return Err(shape_err(
            op,
            format!("A {:?}, B {:?} -> {:?} (A square, one per batch)", a.ne, b.ne, dst.ne),
        ));
    }
    no_overlap(op, &dst, &[&a, &b])?;
    let units = b.ne[0].saturating_mul(b.ne[2]).saturating_mul(b.ne[3]);
    Ok(plan(Kind::SolveTri(SolveTri { a, b, dst }), units, 0))
}

impl SolveTri {
    /// Each unit takes some `(column, batch)` pairs and substitutes down them.
    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        let (k, n) = (self.b.ne[0], self.b.ne[1]);
        let b2 = self.b.ne[2];
        for p in ctx.range(k * b2 * self.b.ne[3]) {
            let (c, i2, i3) = (p % k, (p / k) % b2, p / (k * b2));
            for r in 0..n {
                // As SSM_CONV's sum: ggml's compiler rounds the products of the first multiple of
                // 4 terms (computed 4 at a time, added in order) and fuses the rest into the sum.
                let split = r / 4 * 4;
                let mut sum = 0.0f32;
                for t in 0..r {
                    let (a, x) = (self.a.get_f32(t, r, i2, i3), self.dst.get_f32(c, t, i2, i3));
                    sum = if t < split { sum + a * x } else { a.mul_add(x, sum) };
                }
                let x = (self.b.get_f32(c, r, i2, i3) - sum) / self.a.get_f32(r, r, i2, i3);
                self.dst.set_f32(c, r, i2, i3, x);
            }
        }
    }
}

/// A planned GATED_DELTA_NET (Qwen3-Next, Kimi's KDA): src0 `q`, src1 `k` {S, H_k, T, n_q}, src2
/// `v` {S, H, T, n_seqs}, src3 `g` {1 or S, H, T, n_seqs} (a decay per head, or per state row:
/// KDA), src4 `beta` {1, H, T, n_seqs}, src5 state {S, S, H, n_seqs}; op_params i32\[0\] = K ≥ 1
/// snapshot slots. dst {S·H, T·n_seqs + K·S·n_seqs}: the outputs (token `t` of sequence `q`, head
/// `h`, channel `j` at row `q·T + t`, column `h·S + j`), then K state snapshots (slot `s` = the state
/// `s` tokens before the last, slot 0 the final one; with K > 1 only slots below T are written).
///
/// Per head `h` (q/k head `h mod H_k`, q/k sequence `q / (n_seqs / n_q)`) and token, with `M` the
/// state stored as ggml stores it (`M[j][i]` = `S[i][j]`, row `j` of the state tensor):
/// `M[j][i] ·= exp(g)` (`exp(g[i])` for KDA); `δ[j] = (v[j] − M[j]·k)·β`; `M[j][i] += k[i]·δ[j]`;
/// `out[j] = (M[j]·q) / √S`. The dot products run through the active F32 dot kernel (ggml's
/// `vec_dot_f32` order on AVX2), the update fused (`mul_add`) as ggml's `vec_mad`.
pub(crate) struct DeltaNet {
    q: Tv,
    k: Tv,
    v: Tv,
    g: Tv,
    beta: Tv,
    state: Tv,
    dst: Tv,
    slots: usize,
}

/// Validates GATED_DELTA_NET.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare_delta_net(n: &Node) -> Result<Plan> {
    let op = n.op;
    let mut t = Vec::with_capacity(6);
    for i in 0..6 {
        // SAFETY: forwarded contract.
        t.push(unsafe { tv(src(n, i)?)? });
    }
    // SAFETY: forwarded contract.
    let dst = unsafe { tv(&n.dst)? };
    let (q, k, v, g, beta, state) = (t[0], t[1], t[2], t[3], t[4], t[5]);
    all_f32(
        op,
        &[("q", &q), ("k", &k), ("v", &v), ("g", &g), ("beta", &beta), ("state", &state), ("dst", &dst)],
    )?;
    let (s, h, n_t, n_seqs) = (v.ne[0], v.ne[1], v.ne[2], v.ne[3]);
    let slots = n.op_params[0];
    let qk_ok = q.ne == k.ne
        && q.ne[0] == s
        && q.ne[2] == n_t
        && q.ne[1] > 0
        && h % q.ne[1] == 0
        && q.ne[3] > 0
        && n_seqs % q.ne[3] == 0;
    let rows = (slots > 0)
        .then(|| (slots as usize).checked_mul(s)?.checked_mul(n_seqs)?.checked_add(n_t.checked_mul(n_seqs)?))
        .flatten();
    let ok = qk_ok
        && (g.ne[0] == 1 || g.ne[0] == s)
        && g.ne[1..] == [h, n_t, n_seqs]
        && beta.ne == [1, h, n_t, n_seqs]
        && state.ne == [s, s, h, n_seqs]
        && rows.is_some_and(|r| dst.ne == [s * h, r, 1, 1]);
    if !ok {
        return Err(shape_err(
            op,
            format!(
                "q {:?}, k {:?}, v {:?}, g {:?}, beta {:?}, state {:?}, K {slots} -> {:?}",
                q.ne, k.ne, v.ne, g.ne, beta.ne, state.ne, dst.ne
            ),
        ));
    }
    no_overlap(op, &dst, &[&q, &k, &v, &g, &beta, &state])?;
    let local = scratch(op, &[&[s, s], &[5, s]])?;
    let units = h.saturating_mul(n_seqs);
    Ok(plan(
        Kind::DeltaNet(Box::new(DeltaNet { q, k, v, g, beta, state, dst, slots: slots as usize })),
        units,
        local,
    ))
}

impl DeltaNet {
    /// Each unit takes some `(head, sequence)` pairs and runs their tokens in order, the state in
    /// scratch.
    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        let (s, h, n_t, n_seqs) = (self.v.ne[0], self.v.ne[1], self.v.ne[2], self.v.ne[3]);
        let kda = self.g.ne[0] == s;
        let scale = 1.0 / (s as f32).sqrt();
        let dot = crate::quant::kernels(GgmlType::F32).vec_dot.expect("F32 has a dot kernel");
        let dotf = |x: &[f32], y: &[f32]| dot(s, bytemuck::cast_slice(x), bytemuck::cast_slice(y));
        let seqs_per_q = n_seqs / self.q.ne[3];
        let snap_rows = s * n_seqs;
        for p in ctx.range(h * n_seqs) {
            let (hv, sq) = (p % h, p / h);
            let (hq, sqk) = (hv % self.q.ne[1], sq / seqs_per_q);
            let (m, rest) = ctx.local[..s * s + 5 * s].split_at_mut(s * s);
            let (delta, rest) = rest.split_at_mut(s);
            let (qr, rest) = rest.split_at_mut(s);
            let (kr, rest) = rest.split_at_mut(s);
            let (vr, gr) = rest.split_at_mut(s);
            for j in 0..s {
                self.state.load_row(j, hv, sq, &mut m[j * s..(j + 1) * s]);
            }
            // Snapshot `slot` of this head's state: S rows of S, each inside one dst row.
            let store_state = |m: &[f32], slot: usize| {
                for j in 0..s {
                    let at = hv * s * s + j * s;
                    let row = n_t * n_seqs + slot * snap_rows + sq * s + at / (s * h);
                    self.dst.store_f32s(at % (s * h), row, 0, 0, &m[j * s..(j + 1) * s]);
                }
            };
            for t in 0..n_t {
                self.q.load_row(hq, t, sqk, qr);
                self.k.load_row(hq, t, sqk, kr);
                self.v.load_row(hv, t, sq, vr);
                let beta = self.beta.get_f32(0, hv, t, sq);
                if kda {
                    self.g.load_row(hv, t, sq, gr);
                    for e in gr.iter_mut() {
                        *e = e.exp();
                    }
                    for row in m.chunks_exact_mut(s) {
                        for (x, &e) in row.iter_mut().zip(gr.iter()) {
                            *x *= e;
                        }
                    }
                } else {
                    let e = self.g.get_f32(0, hv, t, sq).exp();
                    m.iter_mut().for_each(|x| *x *= e);
                }
                for j in 0..s {
                    delta[j] = (vr[j] - dotf(&m[j * s..(j + 1) * s], kr)) * beta;
                }
                for j in 0..s {
                    for (x, &ki) in m[j * s..(j + 1) * s].iter_mut().zip(kr.iter()) {
                        *x = ki.mul_add(delta[j], *x);
                    }
                }
                for j in 0..s {
                    delta[j] = dotf(&m[j * s..(j + 1) * s], qr) * scale;
                }
                self.dst.store_f32s(hv * s, sq * n_t + t, 0, 0, delta);
                if self.slots > 1 && n_t - 1 - t < self.slots {
                    store_state(m, n_t - 1 - t);
                }
            }
            if self.slots == 1 {
                store_state(m, 0);
            }
        }
    }
}
