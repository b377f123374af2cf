//! Single-op test graphs: tensors described field for field as a llama.cpp master sends them
//! (`rpc_tensor`, ref: ggml-rpc-protocol.md §4.3, §8.1), with the bytes of every input.
//!
//! A [`Graph`] is built with [`Graph::input`] (leaves that carry data), the zero-copy view ops
//! ([`Graph::view`], [`Graph::permute`], [`Graph::transpose`], [`Graph::reshape`]) and
//! [`Graph::op`] / [`Graph::op_into`] (the node under test). Views always point at their root
//! tensor, as ggml's do.

use compute::op::flags;
use compute::{GgmlOp, GgmlType, Layout};

use super::{Error, Result};

/// Index of a tensor in its [`Graph`]; the wire id is `index + 1` (0 means "no tensor").
pub type Id = usize;

/// One tensor of a test graph.
#[derive(Clone, Debug)]
pub struct Tensor {
    /// Shape, strides and type.
    pub layout: Layout,
    /// The op that produced it (`NONE` for inputs).
    pub op: GgmlOp,
    /// Raw op parameters.
    pub params: [i32; 16],
    /// Tensor flags (COMPUTE for the node under test).
    pub flags: i32,
    /// Sources.
    pub src: Vec<Id>,
    /// Root tensor whose memory this one views.
    pub view_src: Option<Id>,
    /// Byte offset inside the root.
    pub view_offs: u64,
    /// Bytes uploaded before the graph runs (inputs only).
    pub data: Option<Vec<u8>>,
}

/// A graph of one op (plus the view nodes that shape its inputs) with its inputs and outputs.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    /// Every tensor.
    pub tensors: Vec<Tensor>,
    /// Graph nodes in execution order (views included, as ggml lists them).
    pub nodes: Vec<Id>,
    /// Tensors read back and compared after the run.
    pub outputs: Vec<Id>,
}

/// Packs op parameters: integers as they are, floats by their bits.
pub fn f32p(x: f32) -> i32 {
    x.to_bits() as i32
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// The tensor `id`.
    pub fn t(&self, id: Id) -> &Tensor {
        &self.tensors[id]
    }

    /// The layout of `id`.
    pub fn layout(&self, id: Id) -> Layout {
        self.tensors[id].layout
    }

    fn push(&mut self, t: Tensor) -> Id {
        self.tensors.push(t);
        self.tensors.len() - 1
    }

    /// A contiguous input of shape `ne` holding `data` (exactly `nbytes` bytes).
    pub fn input(&mut self, dtype: GgmlType, ne: [u64; 4], data: Vec<u8>) -> Result<Id> {
        let layout = Layout::contiguous(dtype, ne).map_err(|e| Error::Case(e.to_string()))?;
        let want = layout.nbytes().unwrap_or(u64::MAX);
        if data.len() as u64 != want {
            return Err(Error::Case(format!(
                "{dtype} {ne:?}: {} bytes of data, expected {want}",
                data.len()
            )));
        }
        Ok(self.push(Tensor {
            layout,
            op: GgmlOp::None,
            params: [0; 16],
            flags: flags::INPUT,
            src: Vec::new(),
            view_src: None,
            view_offs: 0,
            data: Some(data),
        }))
    }

    fn root_of(&self, id: Id) -> (Id, u64) {
        let t = &self.tensors[id];
        match t.view_src {
            Some(r) => (r, t.view_offs),
            None => (id, 0),
        }
    }

    fn view_node(&mut self, of: Id, op: GgmlOp, layout: Layout, offs: u64, params: [i32; 16]) -> Id {
        let (root, base) = self.root_of(of);
        let id = self.push(Tensor {
            layout,
            op,
            params,
            flags: 0,
            src: vec![of],
            view_src: Some(root),
            view_offs: base + offs,
            data: None,
        });
        self.nodes.push(id);
        id
    }

    /// `ggml_view_4d(of, ne, nb1..nb3, offs)`: `offs` bytes past `of`'s first element.
    pub fn view(&mut self, of: Id, ne: [u64; 4], nb123: [u64; 3], offs: u64) -> Id {
        let layout = self.layout(of).view(ne, nb123);
        // op_params[0..2] hold the offset as a 64-bit size_t (ref: ggml-compute-semantics.md §1.4).
        let mut p = [0; 16];
        p[0] = offs as u32 as i32;
        p[1] = (offs >> 32) as u32 as i32;
        self.view_node(of, GgmlOp::View, layout, offs, p)
    }

    /// `ggml_permute(of, axes)`: source dimension `k` becomes dimension `axes[k]`.
    pub fn permute(&mut self, of: Id, axes: [usize; 4]) -> Result<Id> {
        let layout = self.layout(of).permute(axes).map_err(|e| Error::Case(e.to_string()))?;
        let mut p = [0; 16];
        for (k, a) in axes.iter().enumerate() {
            p[k] = *a as i32;
        }
        Ok(self.view_node(of, GgmlOp::Permute, layout, 0, p))
    }

    /// `ggml_transpose(of)`.
    pub fn transpose(&mut self, of: Id) -> Id {
        let layout = self.layout(of).transpose();
        self.view_node(of, GgmlOp::Transpose, layout, 0, [0; 16])
    }

    /// `ggml_reshape_4d(of, ne)` (of must be contiguous).
    pub fn reshape(&mut self, of: Id, ne: [u64; 4]) -> Result<Id> {
        let layout = self.layout(of).reshape(ne).map_err(|e| Error::Case(e.to_string()))?;
        Ok(self.view_node(of, GgmlOp::Reshape, layout, 0, [0; 16]))
    }

    /// A computed node: a new contiguous `dtype` tensor of shape `ne`.
    pub fn op(
        &mut self,
        op: GgmlOp,
        dtype: GgmlType,
        ne: [u64; 4],
        src: &[Id],
        params: &[i32],
    ) -> Result<Id> {
        let layout = Layout::contiguous(dtype, ne).map_err(|e| Error::Case(e.to_string()))?;
        let mut p = [0; 16];
        p[..params.len()].copy_from_slice(params);
        let id = self.push(Tensor {
            layout,
            op,
            params: p,
            flags: flags::COMPUTE,
            src: src.to_vec(),
            view_src: None,
            view_offs: 0,
            data: None,
        });
        self.nodes.push(id);
        Ok(id)
    }

    /// A computed node that writes into `dst`'s memory with `dst`'s layout (SET_ROWS, CPY).
    pub fn op_into(&mut self, op: GgmlOp, dst: Id, src: &[Id], params: &[i32]) -> Id {
        let (root, offs) = self.root_of(dst);
        let mut p = [0; 16];
        p[..params.len()].copy_from_slice(params);
        let id = self.push(Tensor {
            layout: self.layout(dst),
            op,
            params: p,
            flags: flags::COMPUTE,
            src: src.to_vec(),
            view_src: Some(root),
            view_offs: offs,
            data: None,
        });
        self.nodes.push(id);
        id
    }

    /// Marks `id` as an output (read back and compared).
    pub fn output(&mut self, id: Id) -> Id {
        self.outputs.push(id);
        id
    }
}
