//! `rpc_tensor`, the 296-byte tensor descriptor, and its validation into a [`Layout`].
//!
//! ref: ggml-rpc-protocol.md §4.3 (layout), §4.4 (validation), §12.2 (extent).

use compute::{GgmlOp, GgmlType, Layout};

use crate::error::{Error, Result};
use crate::wire::{Put, Reader};

/// Bytes of one encoded `rpc_tensor`.
pub const RPC_TENSOR_SIZE: usize = 296;
/// Maximum number of sources (`GGML_MAX_SRC`).
pub const MAX_SRC: usize = 10;
/// Bytes of the name field (`GGML_MAX_NAME`).
pub const NAME_SIZE: usize = 64;

/// Field offsets inside an encoded `rpc_tensor` (ref: §4.3).
pub mod offsets {
    /// `u64 id`.
    pub const ID: usize = 0;
    /// `u32 type`.
    pub const TYPE: usize = 8;
    /// `u64 buffer`.
    pub const BUFFER: usize = 12;
    /// `u32 ne[4]`.
    pub const NE: usize = 20;
    /// `u32 nb[4]`.
    pub const NB: usize = 36;
    /// `u32 op`.
    pub const OP: usize = 52;
    /// `i32 op_params[16]`.
    pub const OP_PARAMS: usize = 56;
    /// `i32 flags`.
    pub const FLAGS: usize = 120;
    /// `u64 src[10]`.
    pub const SRC: usize = 124;
    /// `u64 view_src`.
    pub const VIEW_SRC: usize = 204;
    /// `u64 view_offs`.
    pub const VIEW_OFFS: usize = 212;
    /// `u64 data`.
    pub const DATA: usize = 220;
    /// `char name[64]`.
    pub const NAME: usize = 228;
    /// `i32 use_count`.
    pub const USE_COUNT: usize = 292;
}

/// The wire tensor descriptor, field for field (ref: §4.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RpcTensor {
    /// Master-side identity; 0 = no tensor.
    pub id: u64,
    /// Raw `ggml_type`.
    pub dtype: u32,
    /// Buffer handle or 0.
    pub buffer: u64,
    /// Element counts.
    pub ne: [u32; 4],
    /// Byte strides (32-bit on the wire).
    pub nb: [u32; 4],
    /// Raw `ggml_op`.
    pub op: u32,
    /// Raw op parameters.
    pub op_params: [i32; 16],
    /// Flags (INPUT 1, OUTPUT 2, PARAM 4, LOSS 8, COMPUTE 16).
    pub flags: i32,
    /// Source ids, 0 = absent.
    pub src: [u64; MAX_SRC],
    /// Id of the viewed tensor, 0 = not a view.
    pub view_src: u64,
    /// Byte offset of the view inside `view_src`.
    pub view_offs: u64,
    /// Address of element 0 (`base + offset`) or 0.
    pub data: u64,
    /// NUL-padded name; not necessarily NUL-terminated when it comes from a peer.
    pub name: [u8; NAME_SIZE],
    /// Uses of this tensor inside the graph.
    pub use_count: i32,
}

impl Default for RpcTensor {
    fn default() -> Self {
        RpcTensor {
            id: 0,
            dtype: 0,
            buffer: 0,
            ne: [0; 4],
            nb: [0; 4],
            op: 0,
            op_params: [0; 16],
            flags: 0,
            src: [0; MAX_SRC],
            view_src: 0,
            view_offs: 0,
            data: 0,
            name: [0; NAME_SIZE],
            use_count: 0,
        }
    }
}

impl RpcTensor {
    /// A descriptor for a tensor of `layout` at `data` in `buffer` (strides truncated to u32 as the
    /// master does; ref: §4.3).
    pub fn new(id: u64, layout: &Layout, buffer: u64, data: u64) -> RpcTensor {
        let mut t = RpcTensor { id, dtype: layout.dtype as u32, buffer, data, ..RpcTensor::default() };
        for i in 0..4 {
            t.ne[i] = layout.ne[i] as u32;
            t.nb[i] = layout.nb[i] as u32;
        }
        t
    }

    /// Sets the name (cut to 63 bytes, NUL-padded).
    pub fn with_name(mut self, name: &str) -> RpcTensor {
        self.name = [0; NAME_SIZE];
        let b = name.as_bytes();
        let n = b.len().min(NAME_SIZE - 1);
        self.name[..n].copy_from_slice(&b[..n]);
        self
    }

    /// The name up to the first NUL (at most 63 bytes, never past the field; ref: §14 item 19).
    pub fn name_str(&self) -> String {
        let field = &self.name[..NAME_SIZE - 1];
        let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
        String::from_utf8_lossy(&field[..end]).into_owned()
    }

    /// Appends the 296-byte encoding.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.put_u64(self.id);
        out.put_u32(self.dtype);
        out.put_u64(self.buffer);
        for v in self.ne {
            out.put_u32(v);
        }
        for v in self.nb {
            out.put_u32(v);
        }
        out.put_u32(self.op);
        for v in self.op_params {
            out.put_i32(v);
        }
        out.put_i32(self.flags);
        for v in self.src {
            out.put_u64(v);
        }
        out.put_u64(self.view_src);
        out.put_u64(self.view_offs);
        out.put_u64(self.data);
        out.extend_from_slice(&self.name);
        out.put_i32(self.use_count);
    }

    /// The 296-byte encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(RPC_TENSOR_SIZE);
        self.encode_into(&mut v);
        v
    }

    /// Decodes exactly 296 bytes.
    pub fn decode(b: &[u8]) -> Result<RpcTensor> {
        let mut r = Reader::new(b, "rpc_tensor");
        let t = Self::read(&mut r)?;
        r.finish()?;
        Ok(t)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<RpcTensor> {
        let mut t = RpcTensor { id: r.u64()?, dtype: r.u32()?, buffer: r.u64()?, ..RpcTensor::default() };
        for v in t.ne.iter_mut() {
            *v = r.u32()?;
        }
        for v in t.nb.iter_mut() {
            *v = r.u32()?;
        }
        t.op = r.u32()?;
        for v in t.op_params.iter_mut() {
            *v = r.i32()?;
        }
        t.flags = r.i32()?;
        for v in t.src.iter_mut() {
            *v = r.u64()?;
        }
        t.view_src = r.u64()?;
        t.view_offs = r.u64()?;
        t.data = r.u64()?;
        t.name = r.array()?;
        t.use_count = r.i32()?;
        Ok(t)
    }

    /// The element type, refusing values `>= 43` and removed slots (ref: §4.4 steps 1–2).
    pub fn ggml_type(&self) -> Result<GgmlType> {
        GgmlType::from_u32(self.dtype).ok_or_else(|| {
            Error::invalid("rpc_tensor", format!("ggml_type {} is out of range or removed", self.dtype))
        })
    }

    /// The op, refusing values `>= 101` (ref: §14 item 12).
    pub fn ggml_op(&self) -> Result<GgmlOp> {
        GgmlOp::from_u32(self.op)
            .ok_or_else(|| Error::invalid("rpc_tensor", format!("ggml_op {} is out of range", self.op)))
    }

    /// The validated layout: known type, `ne[0]` a whole number of blocks, element count and
    /// extent free of 64-bit overflow (ref: §4.4 step 3, §14 items 6–8).
    pub fn layout(&self) -> Result<Layout> {
        let dtype = self.ggml_type()?;
        let layout = Layout { dtype, ne: self.ne.map(u64::from), nb: self.nb.map(u64::from) };
        layout.check().map_err(|e| Error::invalid("rpc_tensor", e.to_string()))?;
        Ok(layout)
    }

    /// `nbytes` of the validated layout (ref: §12.2).
    pub fn nbytes(&self) -> Result<u64> {
        self.layout()?.nbytes().ok_or_else(|| Error::invalid("rpc_tensor", "extent overflows"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RpcTensor {
        let mut t = RpcTensor {
            id: 0x1122334455667788,
            dtype: 2,
            buffer: 0xa1a2a3a4a5a6a7a8,
            ne: [32, 2, 3, 4],
            nb: [18, 36, 72, 216],
            op: 29,
            flags: 16 | 2,
            view_src: 0xb1b2b3b4b5b6b7b8,
            view_offs: 0xc1c2c3c4c5c6c7c8,
            data: 0xd1d2d3d4d5d6d7d8,
            use_count: -7,
            ..RpcTensor::default()
        };
        for i in 0..16 {
            t.op_params[i] = i as i32 * 1000 - 3;
        }
        for i in 0..10 {
            t.src[i] = 0xe000 + i as u64;
        }
        t.with_name("blk.0.attn_q.weight")
    }

    #[test]
    fn offsets_are_exact() {
        let t = sample();
        let b = t.encode();
        assert_eq!(b.len(), 296);
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        assert_eq!(u64_at(0), t.id);
        assert_eq!(u32_at(8), 2);
        assert_eq!(u64_at(12), t.buffer);
        assert_eq!([u32_at(20), u32_at(24), u32_at(28), u32_at(32)], [32, 2, 3, 4]);
        assert_eq!([u32_at(36), u32_at(40), u32_at(44), u32_at(48)], [18, 36, 72, 216]);
        assert_eq!(u32_at(52), 29);
        assert_eq!(u32_at(56) as i32, -3);
        assert_eq!(u32_at(56 + 15 * 4) as i32, 14997);
        assert_eq!(u32_at(120), 18);
        assert_eq!(u64_at(124), 0xe000);
        assert_eq!(u64_at(124 + 9 * 8), 0xe009);
        assert_eq!(u64_at(204), t.view_src);
        assert_eq!(u64_at(212), t.view_offs);
        assert_eq!(u64_at(220), t.data);
        assert_eq!(&b[228..247], b"blk.0.attn_q.weight");
        assert!(b[247..292].iter().all(|&x| x == 0));
        assert_eq!(u32_at(292) as i32, -7);
        // The named offsets agree with the hand-written ones above.
        assert_eq!(
            [offsets::ID, offsets::TYPE, offsets::BUFFER, offsets::NE, offsets::NB, offsets::OP],
            [0, 8, 12, 20, 36, 52]
        );
        assert_eq!(
            [offsets::OP_PARAMS, offsets::FLAGS, offsets::SRC, offsets::VIEW_SRC, offsets::VIEW_OFFS],
            [56, 120, 124, 204, 212]
        );
        assert_eq!([offsets::DATA, offsets::NAME, offsets::USE_COUNT], [220, 228, 292]);
    }

    #[test]
    fn round_trip() {
        let t = sample();
        assert_eq!(RpcTensor::decode(&t.encode()).unwrap(), t);
        assert_eq!(RpcTensor::decode(&[0u8; 296]).unwrap(), RpcTensor::default());
    }

    #[test]
    fn wrong_sizes_are_errors() {
        assert!(matches!(RpcTensor::decode(&[0u8; 295]), Err(Error::Incomplete { needed: 1, .. })));
        assert!(matches!(RpcTensor::decode(&[0u8; 297]), Err(Error::Invalid { .. })));
    }

    #[test]
    fn name_without_terminator_is_cut() {
        let t = RpcTensor { name: [b'x'; 64], ..RpcTensor::default() };
        assert_eq!(t.name_str().len(), 63);
        assert_eq!(RpcTensor::default().with_name(&"y".repeat(100)).name_str().len(), 63);
    }

    #[test]
    fn validation() {
        let mut t = RpcTensor { dtype: 0, ne: [4, 1, 1, 1], nb: [4, 16, 16, 16], ..RpcTensor::default() };
        assert_eq!(t.nbytes().unwrap(), 16);
        for bad in [4u32, 5, 31, 32, 33, 36, 37, 38, 43, 1000] {
            t.dtype = bad;
            assert!(t.layout().is_err(), "type {bad}");
        }
        // q4_0 with ne[0] = 1 is not a whole block.
        let q = RpcTensor { dtype: 2, ne: [1, 1, 1, 1], nb: [18, 18, 18, 18], ..RpcTensor::default() };
        assert!(q.layout().is_err());
        // Element count overflow.
        let big = RpcTensor {
            dtype: 0,
            ne: [u32::MAX, u32::MAX, u32::MAX, 1],
            nb: [4, 4, 4, 4],
            ..RpcTensor::default()
        };
        assert!(big.layout().is_err());
        // ne == 0 is a zero extent.
        let empty = RpcTensor { dtype: 0, ne: [0, 1, 1, 1], nb: [4, 4, 4, 4], ..RpcTensor::default() };
        assert_eq!(empty.nbytes().unwrap(), 0);
        assert!(RpcTensor { op: 101, ..RpcTensor::default() }.ggml_op().is_err());
        assert_eq!(RpcTensor { op: 2, ..RpcTensor::default() }.ggml_op().unwrap(), GgmlOp::Add);
    }
}
