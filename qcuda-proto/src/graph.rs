// SPDX-License-Identifier: Apache-2.0 OR MIT
//! CUDA graph node parameters on the wire: the In buffer of `GraphAddNode`, `GraphNodeSetParams`
//! and `GraphExecNodeSetParams`, one explicit little-endian encoding per node type. Decoding
//! checks lengths and returns `None` for anything malformed; the host checks the values
//! (handles, device ranges) itself.
//!
//! Node types are the `cudaGraphNodeType` numbers (the driver's `CUgraphNodeType` has the same).

/// `cudaGraphNodeTypeKernel`.
pub const NODE_KERNEL: u32 = 0;
/// `cudaGraphNodeTypeMemcpy`.
pub const NODE_MEMCPY: u32 = 1;
/// `cudaGraphNodeTypeMemset`.
pub const NODE_MEMSET: u32 = 2;
/// `cudaGraphNodeTypeHost`: params are one u64, the guest's callback id (reserved for host
/// functions run in the guest; not served yet).
pub const NODE_HOST: u32 = 3;
/// `cudaGraphNodeTypeGraph` (child graph): params are one u64 graph handle (the driver clones
/// the graph into the node), or that handle and a u64 [`CHILD_MOVE`] (`GraphAddNode` only: the
/// graph itself becomes the node's, `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`).
pub const NODE_GRAPH: u32 = 4;
/// `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`, in a child graph node's second word.
pub const CHILD_MOVE: u64 = 1;
/// `cudaGraphNodeTypeEmpty`: no params.
pub const NODE_EMPTY: u32 = 5;
/// `cudaGraphNodeTypeWaitEvent`: params are one u64 event handle.
pub const NODE_WAIT_EVENT: u32 = 6;
/// `cudaGraphNodeTypeEventRecord`: params are one u64 event handle.
pub const NODE_EVENT_RECORD: u32 = 7;
/// `cudaGraphNodeTypeMemAlloc`: params are one u64, the size in bytes (device memory of the
/// request's device); `GraphAddNode` returns the allocation's device address in rets[1].
pub const NODE_MEM_ALLOC: u32 = 10;
/// `cudaGraphNodeTypeMemFree`: params are one u64, the device address of a graph allocation.
pub const NODE_MEM_FREE: u32 = 11;
/// `cudaGraphNodeTypeConditional`: params are a [`ConditionalNode`]. `GraphAddNode` returns
/// the number of body graphs the driver made in rets[1]; `GraphQuery` (what 4) names each.
pub const NODE_CONDITIONAL: u32 = 13;

/// `cudaGraphCondTypeIf`: one body (run when the value is non-zero), or two (if/else).
pub const COND_IF: u32 = 0;
/// `cudaGraphCondTypeWhile`: one body, run while the value is non-zero.
pub const COND_WHILE: u32 = 1;
/// `cudaGraphCondTypeSwitch`: `size` bodies, body n run when the value is n.
pub const COND_SWITCH: u32 = 2;
/// Most bodies a conditional node may have (a switch's `size`).
pub const MAX_COND_BODIES: u32 = 1024;

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at + 4)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    let s = b.get(at..at + 8)?;
    let mut w = [0u8; 8];
    w.copy_from_slice(s);
    Some(u64::from_le_bytes(w))
}

fn put(out: &mut [u8], at: usize, v: &[u8]) {
    out[at..at + v.len()].copy_from_slice(v);
}

/// A kernel node: function handle (from `ModuleGetFunction`), geometry, then the parameter
/// block packed at the function's `ParamInfo` offsets, as `LaunchKernel` takes it.
///
/// Layout: function u64 @0, grid [u32; 3] @8, block [u32; 3] @20, shared_mem u32 @32,
/// parameter block @36..
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelNode<'a> {
    /// Function handle.
    pub function: u64,
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory bytes.
    pub shared_mem: u32,
    /// The parameter block.
    pub params: &'a [u8],
}

/// Bytes of a [`KernelNode`] before its parameter block.
pub const KERNEL_NODE_HEADER: usize = 36;

impl<'a> KernelNode<'a> {
    /// Appends the encoding to `out` (`out` must be `KERNEL_NODE_HEADER + params.len()` long).
    pub fn encode(&self, out: &mut [u8]) {
        put(out, 0, &self.function.to_le_bytes());
        for i in 0..3 {
            put(out, 8 + 4 * i, &self.grid[i].to_le_bytes());
            put(out, 20 + 4 * i, &self.block[i].to_le_bytes());
        }
        put(out, 32, &self.shared_mem.to_le_bytes());
        put(out, KERNEL_NODE_HEADER, self.params);
    }

    /// Decodes `b`.
    pub fn decode(b: &'a [u8]) -> Option<Self> {
        let mut grid = [0u32; 3];
        let mut block = [0u32; 3];
        for i in 0..3 {
            grid[i] = u32_at(b, 8 + 4 * i)?;
            block[i] = u32_at(b, 20 + 4 * i)?;
        }
        Some(Self {
            function: u64_at(b, 0)?,
            grid,
            block,
            shared_mem: u32_at(b, 32)?,
            params: b.get(KERNEL_NODE_HEADER..)?,
        })
    }
}

/// A memcpy node between two device-addressable ranges (the session's device memory or its
/// host-mapped guest memory): a box of `width` bytes × `height` rows × `depth` slices, each side
/// with its own row pitch and rows per slice. Offsets (`srcPos`/`dstPos`) are already folded
/// into the addresses.
///
/// Layout: dst u64 @0, dst_pitch u64 @8, dst_rows u64 @16, src u64 @24, src_pitch u64 @32,
/// src_rows u64 @40, width u64 @48, height u64 @56, depth u64 @64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemcpyNode {
    /// Destination device address.
    pub dst: u64,
    /// Destination row pitch in bytes.
    pub dst_pitch: u64,
    /// Destination rows per slice.
    pub dst_rows: u64,
    /// Source device address.
    pub src: u64,
    /// Source row pitch in bytes.
    pub src_pitch: u64,
    /// Source rows per slice.
    pub src_rows: u64,
    /// Bytes per row.
    pub width: u64,
    /// Rows.
    pub height: u64,
    /// Slices.
    pub depth: u64,
}

/// Bytes of an encoded [`MemcpyNode`].
pub const MEMCPY_NODE_SIZE: usize = 72;

impl MemcpyNode {
    /// The encoding.
    pub fn encode(&self) -> [u8; MEMCPY_NODE_SIZE] {
        let mut b = [0u8; MEMCPY_NODE_SIZE];
        let f = [
            self.dst,
            self.dst_pitch,
            self.dst_rows,
            self.src,
            self.src_pitch,
            self.src_rows,
            self.width,
            self.height,
            self.depth,
        ];
        for (i, v) in f.iter().enumerate() {
            put(&mut b, 8 * i, &v.to_le_bytes());
        }
        b
    }

    /// Decodes `b` (exactly `MEMCPY_NODE_SIZE` bytes).
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != MEMCPY_NODE_SIZE {
            return None;
        }
        Some(Self {
            dst: u64_at(b, 0)?,
            dst_pitch: u64_at(b, 8)?,
            dst_rows: u64_at(b, 16)?,
            src: u64_at(b, 24)?,
            src_pitch: u64_at(b, 32)?,
            src_rows: u64_at(b, 40)?,
            width: u64_at(b, 48)?,
            height: u64_at(b, 56)?,
            depth: u64_at(b, 64)?,
        })
    }

    /// Bytes from the first to one past the last byte touched on one side, `None` on overflow.
    /// Zero for an empty box.
    pub fn span(pitch: u64, rows: u64, width: u64, height: u64, depth: u64) -> Option<u64> {
        if width == 0 || height == 0 || depth == 0 {
            return Some(0);
        }
        if height > 1 && pitch < width {
            return None;
        }
        if depth > 1 && (rows < height || pitch < width) {
            return None;
        }
        let slice = pitch.checked_mul(rows)?;
        (depth - 1)
            .checked_mul(slice)?
            .checked_add((height - 1).checked_mul(pitch)?)?
            .checked_add(width)
    }
}

/// A memset node: `height` rows of `width` elements of `element_size` (1, 2 or 4) bytes,
/// `pitch` bytes apart.
///
/// Layout: dst u64 @0, pitch u64 @8, value u32 @16, element_size u32 @20, width u64 @24,
/// height u64 @32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemsetNode {
    /// Destination device address.
    pub dst: u64,
    /// Row pitch in bytes.
    pub pitch: u64,
    /// The value (its low `element_size` bytes).
    pub value: u32,
    /// 1, 2 or 4.
    pub element_size: u32,
    /// Elements per row.
    pub width: u64,
    /// Rows.
    pub height: u64,
}

/// Bytes of an encoded [`MemsetNode`].
pub const MEMSET_NODE_SIZE: usize = 40;

impl MemsetNode {
    /// The encoding.
    pub fn encode(&self) -> [u8; MEMSET_NODE_SIZE] {
        let mut b = [0u8; MEMSET_NODE_SIZE];
        put(&mut b, 0, &self.dst.to_le_bytes());
        put(&mut b, 8, &self.pitch.to_le_bytes());
        put(&mut b, 16, &self.value.to_le_bytes());
        put(&mut b, 20, &self.element_size.to_le_bytes());
        put(&mut b, 24, &self.width.to_le_bytes());
        put(&mut b, 32, &self.height.to_le_bytes());
        b
    }

    /// Decodes `b` (exactly `MEMSET_NODE_SIZE` bytes).
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != MEMSET_NODE_SIZE {
            return None;
        }
        Some(Self {
            dst: u64_at(b, 0)?,
            pitch: u64_at(b, 8)?,
            value: u32_at(b, 16)?,
            element_size: u32_at(b, 20)?,
            width: u64_at(b, 24)?,
            height: u64_at(b, 32)?,
        })
    }

    /// Bytes from `dst` to one past the last byte written, `None` if malformed or overflowing.
    pub fn span(&self) -> Option<u64> {
        if !matches!(self.element_size, 1 | 2 | 4) {
            return None;
        }
        let row = self.width.checked_mul(u64::from(self.element_size))?;
        if self.width == 0 || self.height == 0 {
            return Some(0);
        }
        if self.height > 1 && self.pitch < row {
            return None;
        }
        (self.height - 1).checked_mul(self.pitch)?.checked_add(row)
    }
}

/// A conditional node: the conditional handle (the driver's own value, from
/// `GraphConditionalHandleCreate`), its kind (`COND_*`) and its number of bodies.
///
/// Layout: handle u64 @0, kind u32 @8, size u32 @12.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConditionalNode {
    /// The conditional handle, created on the node's graph.
    pub handle: u64,
    /// `COND_IF`, `COND_WHILE` or `COND_SWITCH`.
    pub kind: u32,
    /// Number of body graphs.
    pub size: u32,
}

/// Bytes of an encoded [`ConditionalNode`].
pub const CONDITIONAL_NODE_SIZE: usize = 16;

impl ConditionalNode {
    /// The encoding.
    pub fn encode(&self) -> [u8; CONDITIONAL_NODE_SIZE] {
        let mut b = [0u8; CONDITIONAL_NODE_SIZE];
        put(&mut b, 0, &self.handle.to_le_bytes());
        put(&mut b, 8, &self.kind.to_le_bytes());
        put(&mut b, 12, &self.size.to_le_bytes());
        b
    }

    /// Decodes `b` (exactly `CONDITIONAL_NODE_SIZE` bytes) and checks the kind against the
    /// number of bodies CUDA allows for it (if: 1 or 2, while: 1, switch: 1 to
    /// `MAX_COND_BODIES`).
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != CONDITIONAL_NODE_SIZE {
            return None;
        }
        let n = Self {
            handle: u64_at(b, 0)?,
            kind: u32_at(b, 8)?,
            size: u32_at(b, 12)?,
        };
        let fits = match n.kind {
            COND_IF => matches!(n.size, 1 | 2),
            COND_WHILE => n.size == 1,
            COND_SWITCH => (1..=MAX_COND_BODIES).contains(&n.size),
            _ => false,
        };
        fits.then_some(n)
    }
}

/// A child graph node's parameters: the graph handle, and whether the node takes the graph
/// itself (`CHILD_MOVE`) rather than a copy. `None` for any other length or ownership.
pub fn decode_child(b: &[u8]) -> Option<(u64, bool)> {
    match b.len() {
        8 => Some((u64_at(b, 0)?, false)),
        16 if u64_at(b, 8)? == CHILD_MOVE => Some((u64_at(b, 0)?, true)),
        _ => None,
    }
}

/// A node whose only parameter is one u64 handle (child graph, event, host callback id).
pub fn decode_handle(b: &[u8]) -> Option<u64> {
    if b.len() != 8 {
        return None;
    }
    u64_at(b, 0)
}

/// Bytes of one edge's data on the wire: `cudaGraphEdgeData`/`CUgraphEdgeData` as they lie in
/// memory (from port, to port, type, five reserved bytes that must be zero).
pub const EDGE_DATA_SIZE: usize = 8;

/// The data of one graph edge or capture dependency: the ports and type of
/// `cudaGraphEdgeData` (all zero: a default edge, a full dependency on the whole node; the
/// programmatic ones come from programmatic dependent launches). An empty edge list on the
/// wire means default edges for every dependency.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct EdgeData {
    /// `from_port` (`cudaGraphKernelNodePort*` of the node depended on).
    pub from_port: u8,
    /// `to_port` (0: the whole dependent node).
    pub to_port: u8,
    /// `type` (`cudaGraphDependencyType*`).
    pub kind: u8,
}

impl EdgeData {
    /// A default edge.
    pub const DEFAULT: Self = Self {
        from_port: 0,
        to_port: 0,
        kind: 0,
    };

    /// Its eight bytes.
    pub fn encode(self) -> [u8; EDGE_DATA_SIZE] {
        [self.from_port, self.to_port, self.kind, 0, 0, 0, 0, 0]
    }

    /// From eight bytes; `None` unless the reserved bytes are zero (as CUDA requires).
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != EDGE_DATA_SIZE || b[3..].iter().any(|&x| x != 0) {
            return None;
        }
        Some(Self {
            from_port: b[0],
            to_port: b[1],
            kind: b[2],
        })
    }

    /// True for a default edge.
    pub fn is_default(self) -> bool {
        self == Self::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_data_round_trips_and_refuses_reserved_bytes() {
        let e = EdgeData {
            from_port: 1,
            to_port: 0,
            kind: 1,
        };
        assert_eq!(EdgeData::decode(&e.encode()), Some(e));
        assert_eq!(EdgeData::decode(&[1, 0, 1, 0, 0, 0, 0, 9]), None);
        assert_eq!(EdgeData::decode(&[0; 7]), None);
        assert!(EdgeData::decode(&[0; 8]).is_some_and(EdgeData::is_default));
    }

    #[test]
    fn kernel_node_round_trips() {
        let params = [1u8, 2, 3, 4, 5];
        let k = KernelNode {
            function: 7,
            grid: [1, 2, 3],
            block: [4, 5, 6],
            shared_mem: 99,
            params: &params,
        };
        let mut b = [0u8; KERNEL_NODE_HEADER + 5];
        k.encode(&mut b);
        assert_eq!(KernelNode::decode(&b), Some(k));
        assert_eq!(KernelNode::decode(&b[..20]), None);
    }

    #[test]
    fn copy_and_set_nodes_round_trip_and_span() {
        let m = MemcpyNode {
            dst: 1,
            dst_pitch: 16,
            dst_rows: 4,
            src: 2,
            src_pitch: 32,
            src_rows: 4,
            width: 8,
            height: 3,
            depth: 2,
        };
        assert_eq!(MemcpyNode::decode(&m.encode()), Some(m));
        assert_eq!(MemcpyNode::decode(&[0; 71]), None);
        assert_eq!(MemcpyNode::span(16, 4, 8, 3, 2), Some(64 + 32 + 8));
        assert_eq!(MemcpyNode::span(4, 4, 8, 3, 1), None);
        assert_eq!(MemcpyNode::span(u64::MAX, 4, 8, 3, 2), None);
        let s = MemsetNode {
            dst: 5,
            pitch: 64,
            value: 0xab,
            element_size: 4,
            width: 16,
            height: 2,
        };
        assert_eq!(MemsetNode::decode(&s.encode()), Some(s));
        assert_eq!(s.span(), Some(128));
        assert_eq!(
            MemsetNode {
                element_size: 3,
                ..s
            }
            .span(),
            None
        );
        assert_eq!(MemsetNode { pitch: 8, ..s }.span(), None);
        assert_eq!(decode_handle(&9u64.to_le_bytes()), Some(9));
        assert_eq!(decode_child(&9u64.to_le_bytes()), Some((9, false)));
        let mut moved = [0u8; 16];
        moved[..8].copy_from_slice(&9u64.to_le_bytes());
        moved[8..].copy_from_slice(&CHILD_MOVE.to_le_bytes());
        assert_eq!(decode_child(&moved), Some((9, true)));
        moved[8] = 2;
        assert_eq!(decode_child(&moved), None);
        assert_eq!(decode_child(&moved[..12]), None);
        assert_eq!(decode_handle(&[0; 4]), None);
    }

    #[test]
    fn conditional_nodes_round_trip_and_check_their_size() {
        let c = ConditionalNode {
            handle: 0xdead_beef_0000_0001,
            kind: COND_IF,
            size: 2,
        };
        assert_eq!(ConditionalNode::decode(&c.encode()), Some(c));
        let bad =
            |kind, size| ConditionalNode::decode(&ConditionalNode { kind, size, ..c }.encode());
        assert_eq!(bad(COND_IF, 3), None);
        assert_eq!(bad(COND_IF, 0), None);
        assert_eq!(bad(COND_WHILE, 2), None);
        assert_eq!(bad(COND_SWITCH, 0), None);
        assert_eq!(bad(COND_SWITCH, MAX_COND_BODIES + 1), None);
        assert!(bad(COND_SWITCH, 5).is_some());
        assert_eq!(bad(3, 1), None);
        assert_eq!(ConditionalNode::decode(&[0; 15]), None);
    }
}
