//! Weight upload to one worker: which bytes go in which write, their FNV-1a wire hashes, and the
//! SET_TENSOR_HASH / SET_TENSOR exchange.
//!
//! ref: ggml-rpc-protocol.md §9 (the tensor cache), §3.4 (ordering). Three things keep a load through a
//! worker's cache cheap:
//!
//! * **Coalescing.** Small weights of one layer that lie next to each other in a weight buffer are sent
//!   as one write (an `I8` byte range over them, the alignment padding between them sent as zeros), at
//!   most [`COALESCE_MAX`] bytes. A model with small layers (SmolLM2-135M: nine weights of under 1 MiB
//!   per layer) then costs the worker's cache one object per layer instead of nine, and a warm load one
//!   lookup per layer. Weights above [`COALESCE_MAX`] (and so every weight llama.cpp's own master hashes,
//!   those above 10 MiB) are always written alone, so their cache entries stay shared with llama.cpp.
//!   Any RPC server accepts such a write: it is an ordinary tensor inside the buffer.
//! * **Hashes without a pass over the model.** A write's hash comes from the [`HashMemo`] when the
//!   caller keeps one, else it is computed on helper threads, in write order, while this thread sends.
//! * **Pipelining.** SET_TENSOR_HASH requests go out in a window of up to [`WINDOW`] before their
//!   one-byte answers are read (the server answers in order); a miss is resent with SET_TENSOR and the
//!   cache flag as soon as its answer is read.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use crate::error::{err, Result};
use crate::hash_memo::{HashMemo, WriteKey};
use crate::remote::UploadStats;
use compute::tensor::Layout;
use compute::GgmlType;
use llamad_proto::hash::Fnv1a;
use llamad_proto::{RpcClient, RpcTensor, WireHash};

/// Largest write that several weights are coalesced into; a larger weight is written alone. Below
/// the 10 MiB above which llama.cpp's master hashes (ref §9), so those weights keep their own entries.
pub const COALESCE_MAX: u64 = 8 << 20;

/// Default hash threshold of `llamactl run`/`bench` and of llamad's jobs: writes larger than this go
/// through the workers' caches.
pub const DEFAULT_HASH_THRESHOLD: u64 = 1 << 20;

/// SET_TENSOR_HASH requests in flight at most (321 bytes each out, 9 bytes each back).
pub const WINDOW: usize = 64;

/// Helper threads hashing at most.
const MAX_HASH_THREADS: usize = 8;

/// Zeros for the padding between coalesced weights.
static ZEROS: [u8; 4096] = [0; 4096];

/// How the weights go through the workers' caches.
#[derive(Clone, Copy, Debug, Default)]
pub struct UploadOptions<'a> {
    /// Writes larger than this many bytes are offered with SET_TENSOR_HASH first.
    pub hash_threshold: u64,
    /// Where known hashes are looked up and new ones recorded.
    pub memo: Option<&'a HashMemo>,
}

/// One weight at its place in a weight buffer.
pub struct Placed<'a> {
    /// Weight name.
    pub name: &'a str,
    /// Offset in the buffer.
    pub off: u64,
    /// Its bytes.
    pub data: &'a [u8],
    /// Its layout (for its own descriptor when written alone).
    pub layout: Layout,
}

/// One SET_TENSOR (or SET_TENSOR_HASH) of the upload.
pub struct Write<'a> {
    /// The descriptor written: the weight's own, or an `I8` range over coalesced weights.
    pub tensor: RpcTensor,
    /// `(offset in the write, bytes)` of each weight in it, in order; zeros elsewhere.
    pub pieces: Vec<(u64, &'a [u8])>,
    /// Bytes in the write.
    pub len: u64,
}

impl<'a> Write<'a> {
    /// The write's bytes in order: the weights and the zero padding between them.
    pub fn parts(&self) -> Vec<&'a [u8]> {
        let mut out = Vec::with_capacity(2 * self.pieces.len());
        let mut at = 0;
        let pad = |out: &mut Vec<&'a [u8]>, mut n: u64| {
            while n > 0 {
                let k = n.min(ZEROS.len() as u64);
                out.push(&ZEROS[..k as usize]);
                n -= k;
            }
        };
        for &(off, d) in &self.pieces {
            pad(&mut out, off - at);
            out.push(d);
            at = off + d.len() as u64;
        }
        pad(&mut out, self.len - at);
        out
    }

    /// llama.cpp's FNV-1a-64 of the write's bytes.
    pub fn hash(&self) -> WireHash {
        let mut h = Fnv1a::new();
        for p in self.parts() {
            h.update(p);
        }
        h.finish()
    }

    /// The write's layout in the memo's terms, when every weight in it lies in the memo's file.
    pub fn memo_key(&self, memo: &HashMemo) -> Option<WriteKey> {
        let pieces = self
            .pieces
            .iter()
            .map(|&(at, d)| memo.file_offset(d).map(|off| (at, off, d.len() as u64)))
            .collect::<Option<Vec<_>>>()?;
        Some(WriteKey { len: self.len, pieces })
    }

    /// Weights in the write.
    pub fn weights(&self) -> u64 {
        self.pieces.len() as u64
    }
}

/// Page size of the workers' cache mappings: a write that starts on such a boundary of its buffer can be
/// served from a llamad worker's cache by mapping the object's pages instead of copying them. 4 KiB is
/// the page of x86-64 and of Ubuntu's generic arm64 kernels; a worker with larger pages copies its hits.
pub const PAGE: u64 = 4096;

/// The offset of a weight of `bytes` bytes named `name` in a weight buffer whose last weight (`prev`:
/// name and bytes) ends at `end`: the next multiple of `align`, or of [`PAGE`] when [`plan`] will start
/// a write with it (the first weight of a layer, a weight written alone, the one after it). A write that
/// [`plan`] starts because the run reached [`COALESCE_MAX`] is not moved; it is copied, not mapped.
pub fn place_after(prev: Option<(&str, u64)>, end: u64, name: &str, bytes: u64, align: u64) -> u64 {
    let starts_write = prev.is_none_or(|(p, pb)| !may_share_write(p, pb, name, bytes));
    let a = if starts_write { align.max(PAGE) } else { align.max(1) };
    end.div_ceil(a) * a
}

/// Whether a weight (`name`, `bytes`) may join the write of the weight before it (`prev`, `prev_bytes`):
/// both of one layer (or of none), and neither larger than [`COALESCE_MAX`], which is written alone.
/// [`plan`] also needs them adjacent and the run within [`COALESCE_MAX`].
fn may_share_write(prev: &str, prev_bytes: u64, name: &str, bytes: u64) -> bool {
    layer_of(prev) == layer_of(name) && prev_bytes <= COALESCE_MAX && bytes <= COALESCE_MAX
}

/// `blk.N` for a weight of layer N, `None` for the others.
fn layer_of(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("blk.")?;
    let n = rest.find('.')?;
    Some(&name[..4 + n])
}

/// The writes of the weights `items` of one buffer (`handle`, `base`), in buffer order: runs of
/// neighbouring weights of the same layer (or of no layer) of at most [`COALESCE_MAX`] bytes in all
/// become one write. `next_id` numbers the descriptors.
pub fn plan<'a>(handle: u64, base: u64, items: &[Placed<'a>], next_id: &mut u64) -> Result<Vec<Write<'a>>> {
    let mut out = Vec::new();
    let mut run: Vec<&Placed<'a>> = Vec::new();
    let mut flush = |run: &mut Vec<&Placed<'a>>, out: &mut Vec<Write<'a>>| -> Result<()> {
        let (Some(first), Some(last)) = (run.first(), run.last()) else { return Ok(()) };
        let tensor = if run.len() == 1 {
            RpcTensor::new(*next_id, &first.layout, handle, base + first.off).with_name(first.name)
        } else {
            let span = last.off + last.data.len() as u64 - first.off;
            let layout = Layout::contiguous(GgmlType::I8, [span, 1, 1, 1])?;
            let name = format!("{} ({} weights)", layer_of(first.name).unwrap_or(first.name), run.len());
            RpcTensor::new(*next_id, &layout, handle, base + first.off).with_name(&name)
        };
        *next_id += 1;
        let pieces: Vec<(u64, &'a [u8])> = run.iter().map(|p| (p.off - first.off, p.data)).collect();
        let len = last.off + last.data.len() as u64 - first.off;
        out.push(Write { tensor, pieces, len });
        run.clear();
        Ok(())
    };
    for p in items {
        let bytes = p.data.len() as u64;
        let joins = run.last().is_some_and(|last| {
            let start = run[0].off;
            may_share_write(last.name, last.data.len() as u64, p.name, bytes)
                && p.off >= last.off + last.data.len() as u64
                && p.off + bytes - start <= COALESCE_MAX
        });
        if !joins {
            flush(&mut run, &mut out)?;
        }
        run.push(p);
        if bytes > COALESCE_MAX {
            flush(&mut run, &mut out)?;
        }
    }
    flush(&mut run, &mut out)?;
    Ok(out)
}

/// Hashes being computed: one slot per write, filled by the helper threads.
struct Slots {
    state: Mutex<SlotState>,
    ready: Condvar,
}

struct SlotState {
    hashes: Vec<Option<WireHash>>,
    /// A helper thread died: waiting would never end.
    broken: bool,
    /// The sender gave up: helpers stop.
    cancelled: bool,
}

impl Slots {
    fn new(n: usize) -> Slots {
        Slots {
            state: Mutex::new(SlotState { hashes: vec![None; n], broken: false, cancelled: false }),
            ready: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set(&self, i: usize, h: WireHash) {
        self.lock().hashes[i] = Some(h);
        self.ready.notify_all();
    }

    fn is_ready(&self, i: usize) -> bool {
        self.lock().hashes[i].is_some()
    }

    fn wait(&self, i: usize) -> Result<WireHash> {
        let mut st = self.lock();
        loop {
            if let Some(h) = st.hashes[i] {
                return Ok(h);
            }
            if st.broken {
                return Err(err!("internal: a hashing thread died"));
            }
            st = self.ready.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn cancel(&self) {
        self.lock().cancelled = true;
    }

    fn cancelled(&self) -> bool {
        self.lock().cancelled
    }
}

/// Marks the slots broken if a helper thread unwinds, so the sender does not wait forever.
struct PanicGuard<'a>(&'a Slots);

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.lock().broken = true;
            self.0.ready.notify_all();
        }
    }
}

/// Sends `writes` over `client`: writes above `opts.hash_threshold` bytes through SET_TENSOR_HASH
/// (pipelined), the rest and every miss with SET_TENSOR. `progress(bytes)` is called as each write is
/// settled. Returns the byte counts; the caller still needs a round trip before relying on the data.
pub fn send(
    client: &mut RpcClient,
    writes: &[Write<'_>],
    opts: &UploadOptions<'_>,
    progress: &dyn Fn(u64),
) -> Result<UploadStats> {
    let hashed: Vec<bool> = writes.iter().map(|w| w.len > opts.hash_threshold).collect();
    let slots = Slots::new(writes.len());
    let mut keys: Vec<Option<WriteKey>> = vec![None; writes.len()];
    let mut todo = Vec::new();
    for (i, w) in writes.iter().enumerate().filter(|&(i, _)| hashed[i]) {
        keys[i] = opts.memo.and_then(|m| w.memo_key(m));
        let known = opts.memo.zip(keys[i].as_ref()).and_then(|(m, k)| m.get(k));
        match known {
            Some(h) => slots.set(i, h),
            None => todo.push(i),
        }
    }
    let threads =
        std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_HASH_THREADS).min(todo.len());
    tracing::debug!(
        writes = writes.len(),
        hashed = hashed.iter().filter(|&&h| h).count(),
        to_hash = todo.len(),
        threads,
        "upload plan"
    );
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let _guard = PanicGuard(&slots);
                while let Some(&i) = todo.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if slots.cancelled() {
                        break;
                    }
                    let h = writes[i].hash();
                    if let (Some(m), Some(k)) = (opts.memo, &keys[i]) {
                        m.insert(k.clone(), h);
                    }
                    slots.set(i, h);
                }
            });
        }
        let r = exchange(client, writes, &hashed, &slots, progress);
        slots.cancel();
        r
    })
}

/// The SET_TENSOR_HASH window and the SET_TENSORs, in write order.
fn exchange(
    client: &mut RpcClient,
    writes: &[Write<'_>],
    hashed: &[bool],
    slots: &Slots,
    progress: &dyn Fn(u64),
) -> Result<UploadStats> {
    let mut stats = UploadStats::default();
    let mut inflight: VecDeque<usize> = VecDeque::new();
    let settle = |client: &mut RpcClient, i: usize, stats: &mut UploadStats| -> Result<()> {
        let w = &writes[i];
        if client.recv_set_tensor_hash()? {
            stats.bytes_cached += w.len;
        } else {
            client.set_tensor_parts(&w.tensor, 0, &w.parts(), true)?;
            stats.bytes_sent += w.len;
        }
        progress(w.len);
        Ok(())
    };
    for (i, w) in writes.iter().enumerate() {
        stats.tensors += w.weights();
        stats.writes += 1;
        if !hashed[i] {
            client.set_tensor_parts(&w.tensor, 0, &w.parts(), false)?;
            stats.bytes_sent += w.len;
            progress(w.len);
            continue;
        }
        // Read the answers already due while this write's hash is still being computed, and keep at
        // most WINDOW requests in flight.
        while let Some(&j) = inflight.front() {
            if inflight.len() < WINDOW && slots.is_ready(i) {
                break;
            }
            inflight.pop_front();
            settle(client, j, &mut stats)?;
        }
        let h = slots.wait(i)?;
        client.send_set_tensor_hash(&w.tensor, 0, h)?;
        stats.hashed += 1;
        inflight.push_back(i);
    }
    while let Some(j) = inflight.pop_front() {
        settle(client, j, &mut stats)?;
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed<'a>(name: &'a str, off: u64, data: &'a [u8]) -> Placed<'a> {
        let layout = Layout::contiguous(GgmlType::I8, [data.len() as u64, 1, 1, 1]).unwrap();
        Placed { name, off, data, layout }
    }

    #[test]
    fn neighbours_of_one_layer_are_coalesced_with_zero_padding() {
        let (a, b, c, d) = (vec![1u8; 100], vec![2u8; 64], vec![3u8; 10], vec![4u8; 32]);
        let big = vec![5u8; COALESCE_MAX as usize + 1];
        let items = [
            placed("blk.0.attn_q.weight", 0, &a),
            placed("blk.0.attn_k.weight", 128, &b),
            placed("blk.1.attn_q.weight", 192, &c),
            placed("blk.1.ffn_up.weight", 224, &big),
            placed("blk.1.ffn_down.weight", 224 + COALESCE_MAX + 32, &d),
            placed("output_norm.weight", 256 + COALESCE_MAX + 32, &d),
        ];
        let mut id = 1;
        let w = plan(7, 4096, &items, &mut id).unwrap();
        let lens: Vec<u64> = w.iter().map(|w| w.len).collect();
        assert_eq!(lens, [192, 10, COALESCE_MAX + 1, 32, 32]);
        assert_eq!(id, 6);
        // The coalesced write: an I8 range from the first weight's address, the gap zero-filled.
        assert_eq!(
            (w[0].tensor.dtype, w[0].tensor.ne, w[0].tensor.data),
            (GgmlType::I8 as u32, [192, 1, 1, 1], 4096)
        );
        let bytes: Vec<u8> = w[0].parts().concat();
        let mut want = a.clone();
        want.resize(128, 0);
        want.extend_from_slice(&b);
        assert_eq!(bytes, want);
        assert_eq!(w[0].hash(), WireHash::of(&want));
        // A weight alone keeps its own descriptor and address.
        assert_eq!((w[1].tensor.data, w[1].tensor.id), (4096 + 192, 2));
        assert_eq!(w[2].parts().concat(), big);
        // Different layers (and the layer-less output norm) are never mixed.
        assert_eq!(w.iter().map(Write::weights).sum::<u64>(), 6);
    }

    #[test]
    fn a_run_stops_at_the_size_limit() {
        let half = vec![9u8; (COALESCE_MAX / 2) as usize];
        let items = [
            placed("blk.3.a", 0, &half),
            placed("blk.3.b", COALESCE_MAX / 2, &half),
            placed("blk.3.c", COALESCE_MAX, &half),
        ];
        let w = plan(1, 0, &items, &mut 1).unwrap();
        assert_eq!(w.iter().map(|w| w.len).collect::<Vec<_>>(), [COALESCE_MAX, COALESCE_MAX / 2]);
    }

    #[test]
    fn writes_the_cache_serves_start_on_pages() {
        // SmolLM2-like sizes: a layer of small weights, a weight above COALESCE_MAX, layer-less ones.
        let big = COALESCE_MAX + 5;
        let sizes: [(&str, u64); 9] = [
            ("token_embd.weight", 3000),
            ("blk.0.attn_norm.weight", 2304),
            ("blk.0.attn_q.weight", 207_360),
            ("blk.0.ffn_up.weight", 552_970),
            ("blk.1.attn_norm.weight", 2304),
            ("blk.1.ffn_down.weight", big),
            ("blk.1.ffn_up.weight", 999),
            ("output_norm.weight", 2304),
            ("output.weight", 70_001),
        ];
        let mut lay = crate::remote::WorkerLayout::default();
        lay.pack_weights(sizes.iter().map(|&(n, b)| (n.to_string(), b)), 32, u64::MAX);
        assert_eq!(lay.weight_bufs.len(), 1);
        let (size, items) = &lay.weight_bufs[0];
        let offs: Vec<u64> = items.iter().map(|(_, o, _)| *o).collect();
        let up = |x: u64, a: u64| x.div_ceil(a) * a;
        // The first weight of each layer, the big weight and the one after it start on pages; the other
        // weights of a layer follow at the buffer's alignment.
        assert_eq!(offs[0], 0);
        assert_eq!(offs[1], PAGE);
        assert_eq!(offs[2], offs[1] + up(2304, 32));
        assert_eq!(offs[3], offs[2] + up(207_360, 32));
        assert_eq!(offs[4], up(offs[3] + up(552_970, 32), PAGE));
        assert_eq!(offs[5], up(offs[4] + 2304, PAGE));
        assert_eq!(offs[6], up(offs[5] + up(big, 32), PAGE));
        assert_eq!(offs[7], up(offs[6] + up(999, 32), PAGE), "a layer-less weight after a layer");
        assert_eq!(offs[8], offs[7] + up(2304, 32), "layer-less neighbours coalesce");
        assert_eq!(*size, offs[8] + up(70_001, 32));

        // And every write planned over them starts on a page.
        let data: Vec<Vec<u8>> = sizes.iter().map(|&(_, b)| vec![1u8; b as usize]).collect();
        let placed_items: Vec<Placed<'_>> =
            items.iter().zip(&data).map(|((n, o, _), d)| placed(n, *o, d)).collect();
        let base = 0x1000_0000;
        let writes = plan(1, base, &placed_items, &mut 1).unwrap();
        assert_eq!(writes.len(), 6);
        for w in &writes {
            assert_eq!((w.tensor.data - base) % PAGE, 0, "{}", w.tensor.name_str());
        }

        // A weight that opens a new buffer starts it.
        let mut lay = crate::remote::WorkerLayout::default();
        lay.pack_weights([("blk.0.a".to_string(), 5000), ("blk.0.b".to_string(), 5000)], 32, 8192);
        assert_eq!(
            lay.weight_bufs.iter().map(|(s, w)| (*s, w[0].1)).collect::<Vec<_>>(),
            [(5024, 0), (5024, 0)]
        );
    }
}
