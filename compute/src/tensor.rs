//! Tensor layout: `ne` element counts and `nb` byte strides, as ggml has them.
//!
//! ref: ggml-compute-semantics.md §1.2–§1.4. Views, permutes, transposes and reshapes are zero-copy:
//! they produce a new [`Layout`] (and a byte offset) over the same memory.

use crate::dtype::GgmlType;
use crate::error::{Error, Result};

/// Number of dimensions ggml tensors have (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// The shape, strides and type of a tensor; no data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    /// Element type.
    pub dtype: GgmlType,
    /// Elements per dimension; dimension 0 varies fastest.
    pub ne: [u64; MAX_DIMS],
    /// Byte stride per dimension.
    pub nb: [u64; MAX_DIMS],
}

impl Layout {
    /// A freshly created, contiguous tensor of shape `ne` (ggml's default strides).
    ///
    /// Fails if `ne[0]` is not a whole number of blocks or the size overflows.
    pub fn contiguous(dtype: GgmlType, ne: [u64; MAX_DIMS]) -> Result<Self> {
        let row = dtype
            .row_size(ne[0])
            .ok_or_else(|| Error::Layout(format!("{dtype} row of {} elements", ne[0])))?;
        let nb0 = dtype.type_size() as u64;
        let nb1 = row;
        let nb2 = nb1.checked_mul(ne[1]).ok_or_else(|| Error::Layout("size overflows".into()))?;
        let nb3 = nb2.checked_mul(ne[2]).ok_or_else(|| Error::Layout("size overflows".into()))?;
        nb3.checked_mul(ne[3]).ok_or_else(|| Error::Layout("size overflows".into()))?;
        Ok(Layout { dtype, ne, nb: [nb0, nb1, nb2, nb3] })
    }

    /// Number of elements, or `None` on overflow.
    pub fn nelements(&self) -> Option<u64> {
        self.ne.iter().try_fold(1u64, |acc, &n| acc.checked_mul(n))
    }

    /// Number of rows (`ne1 * ne2 * ne3`), or `None` on overflow.
    pub fn nrows(&self) -> Option<u64> {
        self.ne[1..].iter().try_fold(1u64, |acc, &n| acc.checked_mul(n))
    }

    /// Bytes of one contiguous row of `ne[0]` elements.
    pub fn row_bytes(&self) -> Option<u64> {
        self.dtype.row_size(self.ne[0])
    }

    /// The byte extent ggml computes (`ggml_nbytes`), in checked arithmetic.
    ///
    /// ref: ggml-rpc-protocol.md §12.2. `None` on overflow; 0 when any dimension is empty.
    pub fn nbytes(&self) -> Option<u64> {
        if self.ne.contains(&0) {
            return Some(0);
        }
        let b = self.dtype.blck_size() as u64;
        let s = self.dtype.type_size() as u64;
        let mut total = if b == 1 {
            let mut t = s;
            for i in 0..MAX_DIMS {
                t = t.checked_add((self.ne[i] - 1).checked_mul(self.nb[i])?)?;
            }
            return Some(t);
        } else {
            self.ne[0].checked_mul(self.nb[0])? / b
        };
        for i in 1..MAX_DIMS {
            total = total.checked_add((self.ne[i] - 1).checked_mul(self.nb[i])?)?;
        }
        Some(total)
    }

    /// Checks the layout is one a kernel may iterate over without leaving `nbytes()`: the first
    /// dimension is a whole number of blocks, the element count and extent do not overflow, and
    /// the first stride is the block size (`nb[0] == type_size`) unless the caller allows otherwise.
    pub fn check(&self) -> Result<()> {
        let b = self.dtype.blck_size() as u64;
        if !self.ne[0].is_multiple_of(b) {
            return Err(Error::Layout(format!(
                "{} ne[0] = {} is not a multiple of the block size {b}",
                self.dtype, self.ne[0]
            )));
        }
        self.nelements().ok_or_else(|| Error::Layout(format!("element count overflows: {:?}", self.ne)))?;
        self.nbytes()
            .ok_or_else(|| Error::Layout(format!("extent overflows: ne {:?} nb {:?}", self.ne, self.nb)))?;
        Ok(())
    }

    /// ggml_is_contiguous: rows packed and every higher stride the product of the lower extents
    /// (dimensions of size 1 are exempt).
    pub fn is_contiguous(&self) -> bool {
        self.is_contiguous_n(0)
    }

    /// ggml_is_contiguous_1: dim 0 packed, `nb[1]` arbitrary, dims 2 and 3 follow.
    pub fn is_contiguous_1(&self) -> bool {
        self.is_contiguous_n(1)
    }

    /// ggml_is_contiguous_2: dim 0 packed, `nb[1]` and `nb[2]` arbitrary, dim 3 follows.
    pub fn is_contiguous_2(&self) -> bool {
        self.is_contiguous_n(2)
    }

    fn is_contiguous_n(&self, n: usize) -> bool {
        let ts = self.dtype.type_size() as u64;
        let bs = self.dtype.blck_size() as u64;
        if self.ne[0] != bs && self.nb[0] != ts {
            return false;
        }
        // Expected stride of the next dimension if everything so far is packed.
        let mut next = ts.saturating_mul(self.ne[0] / bs);
        for i in 1..MAX_DIMS {
            if self.ne[i] == 1 {
                continue;
            }
            if i > n {
                if self.nb[i] != next {
                    return false;
                }
                next = next.saturating_mul(self.ne[i]);
            } else {
                // Dimensions up to `n` may have any stride; the next one follows from this one.
                next = self.ne[i].saturating_mul(self.nb[i]);
            }
        }
        true
    }

    /// ggml_is_contiguous_rows: the elements of each row are packed.
    pub fn is_contiguous_rows(&self) -> bool {
        self.nb[0] == self.dtype.type_size() as u64 || self.ne[0] == self.dtype.blck_size() as u64
    }

    /// ggml_is_transposed: `nb[0] > nb[1]`.
    pub fn is_transposed(&self) -> bool {
        self.nb[0] > self.nb[1]
    }

    /// ggml_is_permuted: some `nb[i] > nb[i + 1]`.
    pub fn is_permuted(&self) -> bool {
        (0..MAX_DIMS - 1).any(|i| self.nb[i] > self.nb[i + 1])
    }

    /// Same four element counts.
    pub fn same_shape(&self, other: &Layout) -> bool {
        self.ne == other.ne
    }

    /// ggml_can_repeat(self, to): `self` can be broadcast over `to` by repetition.
    pub fn can_repeat_to(&self, to: &Layout) -> bool {
        if self.ne.contains(&0) {
            return to.ne.contains(&0);
        }
        (0..MAX_DIMS).all(|i| to.ne[i].is_multiple_of(self.ne[i]))
    }

    /// ggml_permute: source dimension `k` moves to position `axes[k]`.
    pub fn permute(&self, axes: [usize; MAX_DIMS]) -> Result<Layout> {
        let mut seen = [false; MAX_DIMS];
        for &a in &axes {
            if a >= MAX_DIMS || seen[a] {
                return Err(Error::Layout(format!("invalid permutation {axes:?}")));
            }
            seen[a] = true;
        }
        let mut out = *self;
        #[allow(clippy::needless_range_loop)]
        for k in 0..MAX_DIMS {
            out.ne[axes[k]] = self.ne[k];
            out.nb[axes[k]] = self.nb[k];
        }
        Ok(out)
    }

    /// ggml_transpose: swaps dimensions 0 and 1.
    pub fn transpose(&self) -> Layout {
        let mut out = *self;
        out.ne.swap(0, 1);
        out.nb.swap(0, 1);
        out
    }

    /// ggml_reshape: same (contiguous) memory, new shape with default strides.
    pub fn reshape(&self, ne: [u64; MAX_DIMS]) -> Result<Layout> {
        if !self.is_contiguous() {
            return Err(Error::Layout("reshape of a non-contiguous tensor".into()));
        }
        let out = Layout::contiguous(self.dtype, ne)?;
        if out.nelements() != self.nelements() {
            return Err(Error::Layout(format!("reshape {:?} -> {ne:?} changes the element count", self.ne)));
        }
        Ok(out)
    }

    /// ggml_view_4d: a view with shape `ne` and strides `nb1..nb3` (nb0 is the type size); the byte
    /// offset is the caller's.
    pub fn view(&self, ne: [u64; MAX_DIMS], nb123: [u64; 3]) -> Layout {
        Layout { dtype: self.dtype, ne, nb: [self.dtype.type_size() as u64, nb123[0], nb123[1], nb123[2]] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_strides_and_nbytes() {
        let l = Layout::contiguous(GgmlType::F32, [4, 3, 2, 1]).unwrap();
        assert_eq!(l.nb, [4, 16, 48, 96]);
        assert_eq!(l.nbytes(), Some(96));
        assert!(l.is_contiguous());
        let q = Layout::contiguous(GgmlType::Q4_0, [64, 2, 1, 1]).unwrap();
        assert_eq!(q.nb, [18, 36, 72, 72]);
        assert_eq!(q.nbytes(), Some(72));
        assert!(Layout::contiguous(GgmlType::Q4_0, [33, 1, 1, 1]).is_err());
        let f4 = Layout::contiguous(GgmlType::F32, [4, 1, 1, 1]).unwrap();
        assert_eq!(f4.nbytes(), Some(16)); // ref: protocol §15 item 21
    }

    #[test]
    fn nbytes_overflow_and_empty() {
        let l = Layout {
            dtype: GgmlType::F32,
            ne: [u32::MAX as u64; 4],
            nb: [4, u32::MAX as u64, u32::MAX as u64, u32::MAX as u64],
        };
        assert!(l.nelements().is_none());
        let e = Layout { dtype: GgmlType::F32, ne: [0, 5, 1, 1], nb: [4, 0, 0, 0] };
        assert_eq!(e.nbytes(), Some(0));
    }

    #[test]
    fn permute_transpose_views() {
        let l = Layout::contiguous(GgmlType::F32, [64, 9, 5, 1]).unwrap();
        let p = l.permute([0, 2, 1, 3]).unwrap();
        assert_eq!(p.ne, [64, 5, 9, 1]);
        assert_eq!(p.nb, [4, 256 * 9, 256, 256 * 45]);
        assert!(p.is_permuted());
        assert!(!p.is_contiguous());
        assert_eq!(p.nbytes(), l.nbytes());
        let t = l.transpose();
        assert!(t.is_transposed());
        assert!(l.permute([0, 0, 1, 2]).is_err());
        let r = l.reshape([64 * 9, 5, 1, 1]).unwrap();
        assert_eq!(r.nbytes(), l.nbytes());
        assert!(p.reshape([64 * 9 * 5, 1, 1, 1]).is_err());
    }

    #[test]
    fn contiguity_predicates() {
        // Rows padded: contiguous_1 but not contiguous.
        let l = Layout { dtype: GgmlType::F32, ne: [4, 3, 2, 1], nb: [4, 32, 96, 192] };
        assert!(!l.is_contiguous());
        assert!(l.is_contiguous_1());
        assert!(l.is_contiguous_rows());
        let b = Layout::contiguous(GgmlType::F32, [4, 3, 2, 1]).unwrap();
        assert!(b.can_repeat_to(&Layout::contiguous(GgmlType::F32, [8, 6, 2, 3]).unwrap()));
        assert!(!b.can_repeat_to(&Layout::contiguous(GgmlType::F32, [6, 6, 2, 3]).unwrap()));
    }
}
