//! Bounds-checked access to the memory of a validated tensor.
//!
//! A [`Tv`] ("tensor view") is built only from a tensor whose memory the caller of
//! `Graph::new` vouched for: `[data, data + nbytes)` is valid while the graph runs. Every address
//! it computes is `data + Σ i_k * nb_k` with each `i_k < ne_k` checked here, which by the definition
//! of `nbytes` (ref: ggml-compute-semantics.md §1.2) lies inside that range. This is what lets
//! kernels iterate over tensors without trusting the peer's shapes.

use half::{bf16, f16};

use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::quant::{self, FromF32Fn, ToF32Fn};
use crate::tensor::Layout;

/// A tensor whose memory may be read and written within its own shape.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tv {
    /// The layout (type, ne, nb).
    pub l: Layout,
    data: *mut u8,
    /// `ne` as `usize`.
    pub ne: [usize; 4],
    /// `nb` as `usize`.
    pub nb: [usize; 4],
    /// Bytes per block.
    pub ts: usize,
    /// Elements per block.
    pub bs: usize,
    /// Bytes of one packed row of `ne[0]` elements.
    pub row_size: usize,
    /// True when the elements (blocks) of a row are packed (`nb[0] == type_size`).
    pub packed: bool,
    to_f32: Option<ToF32Fn>,
    from_f32: Option<FromF32Fn>,
}

// SAFETY: a Tv is an address plus a layout; the graph's contract makes concurrent use sound (ops
// only write rows no other thread of the same node reads or writes).
unsafe impl Send for Tv {}
// SAFETY: as above.
unsafe impl Sync for Tv {}

fn to_usize(v: u64, what: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::Layout(format!("{what} {v} does not fit in usize")))
}

impl Tv {
    /// Wraps `t` after checking its layout (whole blocks, no overflow, extent inside the address
    /// space, non-null data when not empty).
    ///
    /// # Safety
    /// `[t.data, t.data + t.layout.nbytes())` must be valid for reads and writes for as long as the
    /// returned value (or a copy) is used, under the sharing rules of `Graph::new`.
    pub(crate) unsafe fn new(t: &Tensor) -> Result<Tv> {
        let l = t.layout;
        l.check()?;
        let nbytes = l.nbytes().ok_or_else(|| Error::Layout("extent overflows".into()))?;
        let nbytes = to_usize(nbytes, "extent")?;
        if nbytes > 0 {
            if t.data.is_null() {
                return Err(Error::Layout("tensor with elements has no data".into()));
            }
            (t.data as usize)
                .checked_add(nbytes)
                .ok_or_else(|| Error::Layout("tensor extent overflows the address space".into()))?;
        }
        let mut ne = [0usize; 4];
        let mut nb = [0usize; 4];
        for i in 0..4 {
            ne[i] = to_usize(l.ne[i], "ne")?;
            nb[i] = to_usize(l.nb[i], "nb")?;
        }
        let ts = l.dtype.type_size();
        let bs = l.dtype.blck_size();
        let row_size =
            to_usize(l.row_bytes().ok_or_else(|| Error::Layout("row size overflows".into()))?, "row")?;
        let k = quant::kernels(l.dtype);
        Ok(Tv {
            l,
            data: t.data,
            ne,
            nb,
            ts,
            bs,
            row_size,
            packed: nb[0] == ts || ne[0] == bs,
            to_f32: k.to_f32,
            from_f32: k.from_f32,
        })
    }

    /// The element type.
    pub fn dtype(&self) -> GgmlType {
        self.l.dtype
    }

    /// Number of rows (`ne1 * ne2 * ne3`).
    pub fn nrows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// Number of elements.
    pub fn nelements(&self) -> usize {
        self.ne[0] * self.nrows()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.ne.contains(&0)
    }

    /// Start address and byte extent.
    pub fn extent(&self) -> (usize, usize) {
        (self.data as usize, self.l.nbytes().unwrap_or(0) as usize)
    }

    /// True when no two elements (blocks) of the tensor share memory: sorted by stride, every
    /// dimension steps over the whole extent of the smaller ones. Destinations must satisfy this,
    /// so that threads writing different elements never write the same bytes.
    pub fn self_disjoint(&self) -> bool {
        if self.is_empty() {
            return true;
        }
        let mut dims: Vec<(usize, usize)> = (0..4)
            .map(|i| (self.nb[i], if i == 0 { self.ne[0] / self.bs } else { self.ne[i] }))
            .filter(|&(_, n)| n > 1)
            .collect();
        dims.sort_unstable();
        let mut extent = self.ts;
        for (nb, n) in dims {
            if nb < extent {
                return false;
            }
            extent += nb * (n - 1);
        }
        true
    }

    /// Splits a flat row index into `(i1, i2, i3)`.
    pub fn unravel_row(&self, r: usize) -> (usize, usize, usize) {
        let i1 = r % self.ne[1];
        let i2 = (r / self.ne[1]) % self.ne[2];
        let i3 = r / (self.ne[1] * self.ne[2]);
        (i1, i2, i3)
    }

    /// Address of the first byte of row `(i1, i2, i3)`. Panics when out of the tensor's shape.
    pub fn row_ptr(&self, i1: usize, i2: usize, i3: usize) -> *mut u8 {
        assert!(i1 < self.ne[1] && i2 < self.ne[2] && i3 < self.ne[3], "row index out of shape");
        // The offset is below nbytes (see the module doc), so it stays inside the tensor.
        self.data.wrapping_add(i1 * self.nb[1] + i2 * self.nb[2] + i3 * self.nb[3])
    }

    /// Address of element `(i0, i1, i2, i3)` of a type with one element per block.
    pub fn elem_ptr(&self, i0: usize, i1: usize, i2: usize, i3: usize) -> *mut u8 {
        assert!(self.bs == 1 && i0 < self.ne[0], "element index out of shape");
        self.row_ptr(i1, i2, i3).wrapping_add(i0 * self.nb[0])
    }

    /// Copies block `sb` of `src`'s row `s` over block `db` of this tensor's row `d` (raw bytes; the
    /// same block type, one element per block for the plain types). Panics when out of shape.
    pub fn copy_block_from(
        &self,
        db: usize,
        d: (usize, usize, usize),
        src: &Tv,
        sb: usize,
        s: (usize, usize, usize),
    ) {
        assert!(self.ts == src.ts && self.bs == src.bs);
        assert!(db < self.ne[0] / self.bs && sb < src.ne[0] / src.bs, "block index out of shape");
        let dp = self.row_ptr(d.0, d.1, d.2).wrapping_add(db * self.nb[0]);
        let sp = src.row_ptr(s.0, s.1, s.2).wrapping_add(sb * src.nb[0]);
        // SAFETY: both address one block of `ts` bytes inside their tensors (indices checked, and a
        // row's blocks lie at multiples of nb[0] below ne[0]/bs); `copy` allows overlap.
        unsafe { std::ptr::copy(sp, dp, self.ts) }
    }

    /// The packed bytes of row `(i1, i2, i3)`.
    ///
    /// Only for tensors no thread writes during the current op (sources that do not overlap the
    /// destination, which `Graph::new` checks).
    pub fn row_bytes(&self, i1: usize, i2: usize, i3: usize) -> &[u8] {
        assert!(self.packed, "row of a tensor with strided elements");
        let p = self.row_ptr(i1, i2, i3);
        // SAFETY: the row lies inside the tensor (index checked, rows packed so its row_size bytes
        // are below nbytes); memory valid per Tv::new; not written during this op (see above).
        unsafe { std::slice::from_raw_parts(p, self.row_size) }
    }

    /// Reads element `(i0, i1, i2, i3)` as f32 (F32, F16, BF16, I32, I16, I8, F64).
    pub fn get_f32(&self, i0: usize, i1: usize, i2: usize, i3: usize) -> f32 {
        let p = self.elem_ptr(i0, i1, i2, i3);
        // SAFETY: `p` addresses one element of this tensor (checked in elem_ptr); unaligned reads.
        unsafe {
            match self.l.dtype {
                GgmlType::F32 => (p as *const f32).read_unaligned(),
                GgmlType::F16 => f16::from_bits((p as *const u16).read_unaligned()).to_f32(),
                GgmlType::BF16 => bf16::from_bits((p as *const u16).read_unaligned()).to_f32(),
                GgmlType::I32 => (p as *const i32).read_unaligned() as f32,
                GgmlType::I16 => (p as *const i16).read_unaligned() as f32,
                GgmlType::I8 => (p as *const i8).read_unaligned() as f32,
                GgmlType::F64 => (p as *const f64).read_unaligned() as f32,
                _ => f32::NAN,
            }
        }
    }

    /// Writes element `(i0, i1, i2, i3)` from f32 (F32, F16, BF16, I32, I16, I8, F64).
    pub fn set_f32(&self, i0: usize, i1: usize, i2: usize, i3: usize, v: f32) {
        let p = self.elem_ptr(i0, i1, i2, i3);
        // SAFETY: `p` addresses one element of this tensor (checked in elem_ptr); unaligned writes.
        unsafe {
            match self.l.dtype {
                GgmlType::F32 => (p as *mut f32).write_unaligned(v),
                GgmlType::F16 => (p as *mut u16).write_unaligned(f16::from_f32(v).to_bits()),
                GgmlType::BF16 => (p as *mut u16).write_unaligned(bf16::from_f32(v).to_bits()),
                GgmlType::I32 => (p as *mut i32).write_unaligned(v as i32),
                GgmlType::I16 => (p as *mut i16).write_unaligned(v as i16),
                GgmlType::I8 => (p as *mut i8).write_unaligned(v as i8),
                GgmlType::F64 => (p as *mut f64).write_unaligned(v as f64),
                _ => {}
            }
        }
    }

    /// Writes `vals` to elements `i0..i0 + vals.len()` of row `(i1, i2, i3)` of a packed F32 tensor
    /// (one copy instead of a checked store per element). Panics outside the tensor's shape.
    pub fn store_f32s(&self, i0: usize, i1: usize, i2: usize, i3: usize, vals: &[f32]) {
        assert!(self.l.dtype == GgmlType::F32 && self.nb[0] == 4, "store_f32s needs packed F32");
        assert!(i0.checked_add(vals.len()).is_some_and(|e| e <= self.ne[0]), "elements out of shape");
        let p = self.row_ptr(i1, i2, i3).wrapping_add(i0 * 4) as *mut f32;
        // Fixed-size chunks compile to vector stores; a copy of variable length would be a libc
        // call per column of a matrix product.
        let mut chunks = vals.chunks_exact(4);
        let mut at = 0;
        for c in &mut chunks {
            let v = [c[0], c[1], c[2], c[3]];
            // SAFETY: elements i0 + at .. + 4 of a packed F32 row lie inside the tensor (indices
            // checked above and in row_ptr); unaligned write.
            unsafe { (p.add(at) as *mut [f32; 4]).write_unaligned(v) };
            at += 4;
        }
        for &v in chunks.remainder() {
            // SAFETY: as above, one element.
            unsafe { p.add(at).write_unaligned(v) };
            at += 1;
        }
    }

    /// Reads elements `i0..i0 + out.len()` of row `(i1, i2, i3)` of a packed F32 tensor into `out`
    /// (one copy instead of a checked load per element). Panics outside the tensor's shape.
    ///
    /// Only for spans no other thread writes during the current op.
    pub fn load_f32s(&self, i0: usize, i1: usize, i2: usize, i3: usize, out: &mut [f32]) {
        assert!(self.l.dtype == GgmlType::F32 && self.nb[0] == 4, "load_f32s needs packed F32");
        assert!(i0.checked_add(out.len()).is_some_and(|e| e <= self.ne[0]), "elements out of shape");
        let p = self.row_ptr(i1, i2, i3).wrapping_add(i0 * 4);
        // SAFETY: elements i0 .. i0 + out.len() of a packed F32 row lie inside the tensor (indices
        // checked above and in row_ptr); `out` is scratch memory that overlaps no tensor; nobody
        // writes the span meanwhile (see above).
        unsafe { std::ptr::copy_nonoverlapping(p as *const u8, out.as_mut_ptr() as *mut u8, out.len() * 4) };
    }

    /// Reads an integer index element (I32 or I64).
    pub fn get_index(&self, i0: usize, i1: usize, i2: usize, i3: usize) -> i64 {
        let p = self.elem_ptr(i0, i1, i2, i3);
        // SAFETY: `p` addresses one element of this tensor (checked in elem_ptr).
        unsafe {
            match self.l.dtype {
                GgmlType::I64 => (p as *const i64).read_unaligned(),
                _ => (p as *const i32).read_unaligned() as i64,
            }
        }
    }

    /// Writes an I32 element.
    pub fn set_i32(&self, i0: usize, i1: usize, i2: usize, i3: usize, v: i32) {
        assert!(self.l.dtype == GgmlType::I32);
        let p = self.elem_ptr(i0, i1, i2, i3);
        // SAFETY: `p` addresses one I32 element of this tensor (checked in elem_ptr).
        unsafe { (p as *mut i32).write_unaligned(v) }
    }

    /// Writes an I64 element.
    pub fn set_i64(&self, i0: usize, i1: usize, i2: usize, i3: usize, v: i64) {
        assert!(self.l.dtype == GgmlType::I64);
        let p = self.elem_ptr(i0, i1, i2, i3);
        // SAFETY: `p` addresses one I64 element of this tensor (checked in elem_ptr).
        unsafe { (p as *mut i64).write_unaligned(v) }
    }

    /// Copies the raw bytes of one element (non-block types) from `src` at its index.
    pub fn copy_elem_from(&self, d: [usize; 4], src: &Tv, s: [usize; 4]) {
        assert!(self.ts == src.ts);
        let dp = self.elem_ptr(d[0], d[1], d[2], d[3]);
        let sp = src.elem_ptr(s[0], s[1], s[2], s[3]);
        // SAFETY: both address one element of `ts` bytes inside their tensors; `copy` allows overlap.
        unsafe { std::ptr::copy(sp, dp, self.ts) }
    }

    /// Copies elements `[0, n)` of `src`'s row `s` to elements `[d0, d0 + n)` of this tensor's row
    /// `d` (packed rows of the same one-element-per-block type). Panics when out of shape.
    pub fn copy_row_span(
        &self,
        d: (usize, usize, usize),
        d0: usize,
        src: &Tv,
        s: (usize, usize, usize),
        n: usize,
    ) {
        assert!(self.ts == src.ts && self.bs == 1 && src.bs == 1 && self.packed && src.packed);
        assert!(d0.checked_add(n).is_some_and(|e| e <= self.ne[0]) && n <= src.ne[0], "span out of shape");
        if n == 0 {
            return;
        }
        let dp = self.row_ptr(d.0, d.1, d.2).wrapping_add(d0 * self.ts);
        let sp = src.row_ptr(s.0, s.1, s.2);
        // SAFETY: both spans are `n` packed elements inside their rows (checked above); `copy`
        // allows overlap.
        unsafe { std::ptr::copy(sp, dp, n * self.ts) }
    }

    /// True when this type converts to f32 (element-wise or through the kernel table).
    pub fn can_load(&self) -> bool {
        self.bs == 1 && is_elem_type(self.l.dtype) || self.to_f32.is_some()
    }

    /// True when this type converts from f32.
    pub fn can_store(&self) -> bool {
        self.bs == 1 && is_elem_type(self.l.dtype) || self.from_f32.is_some()
    }

    /// Loads row `(i1, i2, i3)` into `out[..ne0]` as f32.
    pub fn load_row(&self, i1: usize, i2: usize, i3: usize, out: &mut [f32]) {
        let n = self.ne[0];
        let out = &mut out[..n];
        if self.packed && self.l.dtype == GgmlType::F32 {
            let p = self.row_ptr(i1, i2, i3);
            // SAFETY: the packed row of n f32 lies inside the tensor; `out` is scratch memory that
            // does not overlap any tensor.
            unsafe { std::ptr::copy_nonoverlapping(p as *const u8, out.as_mut_ptr() as *mut u8, n * 4) };
        } else if self.packed && self.bs > 1 {
            let f = self.to_f32.unwrap_or(nan_fill);
            f(self.row_bytes(i1, i2, i3), out);
        } else if self.packed && self.l.dtype == GgmlType::F16 {
            let b = self.row_bytes(i1, i2, i3);
            for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        } else {
            for (i0, o) in out.iter_mut().enumerate() {
                *o = self.get_f32(i0, i1, i2, i3);
            }
        }
    }

    /// Stores `src[..ne0]` into row `(i1, i2, i3)`, converting from f32.
    pub fn store_row(&self, i1: usize, i2: usize, i3: usize, src: &[f32]) {
        let n = self.ne[0];
        let src = &src[..n];
        if self.packed && self.l.dtype == GgmlType::F32 {
            let p = self.row_ptr(i1, i2, i3);
            // SAFETY: the packed row of n f32 lies inside the tensor; `src` is scratch memory.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr() as *const u8, p, n * 4) };
        } else if self.packed && self.bs > 1 {
            if let Some(f) = self.from_f32 {
                let p = self.row_ptr(i1, i2, i3);
                // SAFETY: the packed row lies inside the tensor; only this thread touches this row
                // during the op and no other reference to it is live.
                let row = unsafe { std::slice::from_raw_parts_mut(p, self.row_size) };
                f(src, row);
            }
        } else {
            for (i0, &v) in src.iter().enumerate() {
                self.set_f32(i0, i1, i2, i3, v);
            }
        }
    }
}

fn nan_fill(_src: &[u8], dst: &mut [f32]) {
    dst.fill(f32::NAN);
}

/// Types read and written element by element here, without the kernel table.
pub(crate) fn is_elem_type(t: GgmlType) -> bool {
    matches!(
        t,
        GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::I32
            | GgmlType::I16
            | GgmlType::I8
            | GgmlType::F64
    )
}

/// True for the float types elementwise ops accept.
pub(crate) fn is_float(t: GgmlType) -> bool {
    matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// The half-open range of `n` items thread `ith` of `nth` handles.
pub(crate) fn split(n: usize, ith: usize, nth: usize) -> std::ops::Range<usize> {
    let per = n.div_ceil(nth.max(1));
    let start = (per * ith).min(n);
    let end = (start + per).min(n);
    start..end
}
