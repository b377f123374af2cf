//! The server side of llamad's split-mode-row extension ([`llamad_proto::ext`]): one-shot links to
//! the other workers of a tensor-parallel group, stored layer-phase graphs, and TP_RUN, which runs
//! a whole ubatch with the partial sums exchanged over the links instead of through the master.
//!
//! Links are plain TCP: the extension is granted only on plain connections, so TLS users keep every
//! byte on their encrypted master connections (the master relays). A link is authenticated by a
//! 32-byte single-use token that the master handed to both ends over their (authenticated)
//! connections; a listener serves one link and closes, and a dialler that does not present the
//! token is dropped. All blocking work (accept, connect, compute, exchange) runs off the async
//! runtime through [`Reply::Blocking`], with timeouts, so a vanished peer fails the run instead of
//! hanging it, and the connection closes with the reason.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use llamad_proto::ext::{self, LinkDial, TpRun, TOKEN_SIZE};
use tracing::{debug, warn};

use crate::error::{refuse, Error, Result};
use crate::rpc::buffer::{Buffer, Region};
use crate::rpc::exec::{SharedExecutor, StoredGraph};
use crate::rpc::link::{self, read_exact_polling};

/// Longest wait for the other end of a link to show up.
const LINK_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest silence from a peer inside a TP_RUN (a phase of a large ubatch may compute for long).
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(300);
/// Partials up to this size are written before reading the peers' (they fit in the socket
/// buffers); larger ones are written from a second thread so that two ranks writing to each other
/// cannot both block.
const INLINE_SEND: usize = 32 * 1024;

/// A stored phase graph with the places TP_RUN writes its input to and reads its output from.
pub struct Slot {
    graph: Arc<StoredGraph>,
    input: (Arc<Buffer>, Region),
    output: (Arc<Buffer>, Region),
}

// SAFETY: a slot is shared (through `Arc`) only between its connection's session and the one
// TP_RUN that connection is executing; the session runs one command at a time, so the regions'
// bytes are never accessed from two threads at once (as for `Region`'s `Send`).
unsafe impl Sync for Slot {}

impl Slot {
    /// A slot over a built graph and two validated regions.
    pub fn new(graph: StoredGraph, input: (Arc<Buffer>, Region), output: (Arc<Buffer>, Region)) -> Slot {
        Slot { graph: Arc::new(graph), input, output }
    }
}

/// A listener offered for one link.
struct Pending {
    token: [u8; TOKEN_SIZE],
    listener: TcpListener,
}

/// The per-connection extension state.
#[derive(Default)]
pub struct ExtState {
    pending: Option<Pending>,
    links: Arc<Mutex<HashMap<u32, TcpStream>>>,
    slots: HashMap<u32, Arc<Slot>>,
}

/// Blocking work for the connection to run off the runtime; `Some(bytes)` is sent as the answer.
pub type BlockingJob = Box<dyn FnOnce() -> Result<Option<Vec<u8>>> + Send>;

impl ExtState {
    /// Drops every stored slot (a buffer was freed: a slot may point into it).
    pub fn clear_slots(&mut self) {
        self.slots.clear();
    }

    /// Stores a slot.
    pub fn store(&mut self, slot: u32, s: Slot) {
        self.slots.insert(slot, Arc::new(s));
    }

    /// LINK_OFFER: a one-shot listener on `ip`; answers its port.
    pub fn offer(&mut self, payload: &[u8], ip: IpAddr) -> Result<Vec<u8>> {
        let token = ext::decode_link_offer(payload)?;
        let listener = TcpListener::bind((ip, 0))?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        debug!(%ip, port, "link offered");
        self.pending = Some(Pending { token, listener });
        Ok(port.to_le_bytes().to_vec())
    }

    /// LINK_ACCEPT: waits for the dialler that presents the offered token.
    pub fn accept(&mut self, payload: &[u8]) -> Result<BlockingJob> {
        let (peer_rank, token) = ext::decode_link_accept(payload)?;
        let Some(p) = self.pending.take() else { refuse!("EXT_LINK_ACCEPT without a LINK_OFFER") };
        if p.token != token {
            refuse!("EXT_LINK_ACCEPT with another token than the offer's");
        }
        self.check_rank(peer_rank)?;
        let links = self.links.clone();
        Ok(Box::new(move || match accept_link(&p) {
            Ok(s) => {
                lock(&links)?.insert(peer_rank, s);
                debug!(peer_rank, "link accepted");
                Ok(Some(vec![1]))
            }
            // No link is not a protocol error: the master relays instead.
            Err(e) => {
                warn!(peer_rank, reason = %e, "link not made");
                Ok(Some(vec![0]))
            }
        }))
    }

    /// LINK_DIAL: connects to a peer's offered listener and presents the token.
    pub fn dial(&mut self, payload: &[u8]) -> Result<BlockingJob> {
        let d = LinkDial::decode(payload)?;
        self.check_rank(d.peer_rank)?;
        let links = self.links.clone();
        Ok(Box::new(move || match dial_link(&d) {
            Ok(s) => {
                lock(&links)?.insert(d.peer_rank, s);
                debug!(peer_rank = d.peer_rank, host = %d.host, port = d.port, "link dialled");
                Ok(Some(vec![1]))
            }
            Err(e) => {
                warn!(peer_rank = d.peer_rank, host = %d.host, port = d.port, reason = %e, "link not made");
                Ok(Some(vec![0]))
            }
        }))
    }

    fn check_rank(&self, peer_rank: u32) -> Result<()> {
        if peer_rank >= ext::MAX_RANKS {
            refuse!("link to rank {peer_rank} (at most {} ranks)", ext::MAX_RANKS);
        }
        Ok(())
    }

    /// TP_RUN: checks the request against the stored slots and links, then returns the run.
    pub fn tp_run(&mut self, payload: &[u8], executor: SharedExecutor) -> Result<BlockingJob> {
        let run = TpRun::decode(payload)?;
        let (p, slots, x) = self.checked(&run)?;
        let links = self.links.clone();
        Ok(Box::new(move || {
            let mut links = lock(&links)?;
            p.run(&slots, x, &mut links, &executor).map(Some)
        }))
    }

    /// TP_RUN_STREAMS: as [`ExtState::tp_run`] for each stream; the streams run interleaved.
    pub fn tp_run_streams(&mut self, payload: &[u8], executor: SharedExecutor) -> Result<BlockingJob> {
        let runs = ext::decode_tp_run_streams(payload)?;
        let streams = runs.iter().map(|r| self.checked(r)).collect::<Result<Vec<_>>>()?;
        let links = self.links.clone();
        Ok(Box::new(move || {
            let links = lock(&links)?;
            run_streams(streams, &links, &executor).map(Some)
        }))
    }

    /// A TP_RUN's program, slots and residual, once its slots are stored and its links made.
    fn checked(&self, run: &TpRun<'_>) -> Result<(Program, Vec<Arc<Slot>>, Vec<f32>)> {
        let mut slots = Vec::with_capacity(run.slots.len());
        for s in &run.slots {
            match self.slots.get(s) {
                Some(slot) => slots.push(slot.clone()),
                None => {
                    refuse!("EXT_TP_RUN of slot {s}, which was never stored (or a buffer was freed since)")
                }
            }
        }
        {
            let links = lock(&self.links)?;
            if let Some(missing) = (0..run.n_ranks).find(|&r| r != run.rank && !links.contains_key(&r)) {
                refuse!("EXT_TP_RUN as rank {} of {}: no link to rank {missing}", run.rank, run.n_ranks);
            }
        }
        let x: Vec<f32> =
            run.x.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let p = Program {
            rank: run.rank,
            n_ranks: run.n_ranks,
            n_tokens: run.n_tokens as usize,
            n_outputs: run.n_outputs as usize,
            n_embd: run.n_embd as usize,
        };
        Ok((p, slots, x))
    }
}

fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>> {
    m.lock().map_err(|_| Error::Refused("link table poisoned".into()))
}

fn accept_link(p: &Pending) -> Result<TcpStream> {
    let s = link::accept_one(&p.listener, LINK_TIMEOUT, "the offered link", |s, from| {
        let mut token = [0u8; TOKEN_SIZE];
        match s.read_exact(&mut token) {
            Ok(()) if token == p.token => {
                s.write_all(&[1])?;
                Ok(true)
            }
            _ => {
                warn!(%from, "link dialler without the right token; dropped");
                Ok(false)
            }
        }
    })?;
    link::prepare(s, EXCHANGE_TIMEOUT)
}

fn dial_link(d: &LinkDial) -> Result<TcpStream> {
    let (mut s, addr) = link::dial(&d.host, d.port, 1, Duration::ZERO, LINK_TIMEOUT)?;
    s.write_all(&d.token)?;
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack).map_err(|e| Error::Refused(format!("link to {addr} not accepted: {e}")))?;
    if ack != [1] {
        refuse!("link to {addr} not accepted");
    }
    link::prepare(s, EXCHANGE_TIMEOUT)
}

/// One TP_RUN's shape.
struct Program {
    rank: u32,
    n_ranks: u32,
    n_tokens: usize,
    n_outputs: usize,
    n_embd: usize,
}

impl Program {
    /// Runs the slots over the residual `x`; returns the last slot's output.
    fn run(
        &self,
        slots: &[Arc<Slot>],
        mut x: Vec<f32>,
        links: &mut HashMap<u32, TcpStream>,
        executor: &SharedExecutor,
    ) -> Result<Vec<u8>> {
        let n = slots.len();
        let mut x_out: Vec<f32> = Vec::new();
        // The peers' partial sums, by rank, reused from phase to phase.
        let mut partials: Vec<Vec<u8>> = vec![Vec::new(); self.n_ranks as usize];
        let (mut t_compute, mut t_exchange) = (Duration::ZERO, Duration::ZERO);
        for (k, slot) in slots.iter().enumerate() {
            let head = k + 1 == n;
            let cur = if head || k + 2 == n { &mut x_out } else { &mut x };
            slot.write_input(k, cur)?;
            let t0 = Instant::now();
            slot.graph.run_blocking(executor)?;
            t_compute += t0.elapsed();
            let (_ob, output) = &slot.output;
            // SAFETY: as above, for the output region; the graph has finished.
            let out = unsafe { output.as_slice() };
            if head {
                debug!(
                    rank = self.rank,
                    tokens = self.n_tokens,
                    compute_us = t_compute.as_micros() as u64,
                    exchange_us = t_exchange.as_micros() as u64,
                    "tp_run"
                );
                return Ok(out.to_vec());
            }
            if out.len() != cur.len() * 4 {
                refuse!("EXT_TP_RUN slot {k}: output of {} bytes for {} values", out.len(), cur.len());
            }
            let t0 = Instant::now();
            exchange(links, self.rank, k as u32, out, &mut partials)?;
            t_exchange += t0.elapsed();
            add_in_rank_order(cur, self.rank, out, &partials);
            if k + 3 == n {
                x_out = self.output_rows(&x);
            }
        }
        refuse!("EXT_TP_RUN ended without a head slot")
    }

    /// After the last layer's attention only the output rows go on.
    fn output_rows(&self, x: &[f32]) -> Vec<f32> {
        let from = (self.n_tokens - self.n_outputs) * self.n_embd;
        x.get(from..).map(<[f32]>::to_vec).unwrap_or_default()
    }
}

impl Slot {
    /// Writes the residual `cur` to the slot's input (little-endian f32).
    fn write_input(&self, k: usize, cur: &[f32]) -> Result<()> {
        let (ib, input) = &self.input;
        if input.len() != cur.len() * 4 {
            refuse!("EXT_TP_RUN slot {k}: input of {} bytes for {} values", input.len(), cur.len());
        }
        ib.invalidate_region(input);
        // SAFETY: `input` lies inside the live buffer `ib` (validated when the slot was stored and
        // held by it); this connection runs one command at a time, so nothing else touches it.
        let dst = unsafe { input.as_mut_slice() };
        for (d, v) in dst.chunks_exact_mut(4).zip(cur.iter()) {
            d.copy_from_slice(&v.to_le_bytes());
        }
        Ok(())
    }
}

/// Adds every rank's partial to `cur` in rank order (`mine` for `rank`): the same bits on every
/// rank, and the same as a master relaying them.
fn add_in_rank_order(cur: &mut [f32], rank: u32, mine: &[u8], partials: &[Vec<u8>]) {
    for (r, theirs) in partials.iter().enumerate() {
        let p: &[u8] = if r as u32 == rank { mine } else { theirs };
        for (v, b) in cur.iter_mut().zip(p.chunks_exact(4)) {
            *v += f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
}

/// One stream of a TP_RUN_STREAMS: its program, slots, residual and answer.
struct Stream {
    p: Program,
    slots: Vec<Arc<Slot>>,
    x: Vec<f32>,
    x_out: Vec<f32>,
    /// This rank's partial of the slot last run, kept until the peers' partials are added.
    mine: Arc<Vec<u8>>,
    answer: Option<Vec<u8>>,
}

impl Stream {
    /// The residual slot `k` reads.
    fn cur(&mut self, k: usize) -> &mut Vec<f32> {
        if k + 2 >= self.slots.len() {
            &mut self.x_out
        } else {
            &mut self.x
        }
    }
}

/// Runs the streams interleaved slot by slot (see [`llamad_proto::ext`]): each partial goes to the
/// peers from a sender thread as soon as it is computed, and the peers' partials of a stream are
/// read only when that stream's next slot is due. Answers each stream's last output, in order.
fn run_streams(
    streams: Vec<(Program, Vec<Arc<Slot>>, Vec<f32>)>,
    links: &HashMap<u32, TcpStream>,
    executor: &SharedExecutor,
) -> Result<Vec<u8>> {
    let n_streams = streams.len();
    let mut st: Vec<Stream> = streams
        .into_iter()
        .map(|(p, slots, x)| Stream { p, slots, x, x_out: Vec::new(), mine: Arc::default(), answer: None })
        .collect();
    let Some(first) = st.first() else { return Ok(Vec::new()) };
    let (rank, n_ranks, n) = (first.p.rank, first.p.n_ranks, first.slots.len());
    let mut partials: Vec<Vec<u8>> = vec![Vec::new(); n_ranks as usize];
    let (mut t_compute, mut t_wait) = (Duration::ZERO, Duration::ZERO);
    let t_start = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel::<(u32, Arc<Vec<u8>>)>();
    std::thread::scope(|sc| {
        // The sender writes the partials in the order they were computed, which is the order every
        // peer reads them in; the compute thread never blocks on a write.
        let sender = sc.spawn(move || -> Result<()> {
            for (tag, bytes) in rx {
                send_tagged(links, rank, n_ranks, tag, &bytes)?;
            }
            Ok(())
        });
        let computed = (|| -> Result<()> {
            for k in 0..n {
                for (i, s) in st.iter_mut().enumerate() {
                    if k > 0 {
                        // The peers' partials of this stream's previous slot.
                        let t0 = Instant::now();
                        let tag = ((k - 1) * n_streams + i) as u32;
                        recv_tagged(links, rank, n_ranks, tag, s.mine.len(), false, &mut partials)?;
                        t_wait += t0.elapsed();
                        let mine = std::mem::take(&mut s.mine);
                        add_in_rank_order(s.cur(k - 1), rank, &mine, &partials);
                        if k + 2 == n {
                            s.x_out = s.p.output_rows(&s.x);
                        }
                    }
                    let slot = s.slots[k].clone();
                    slot.write_input(k, s.cur(k))?;
                    let t0 = Instant::now();
                    slot.graph.run_blocking(executor)?;
                    t_compute += t0.elapsed();
                    // SAFETY: the output region lies inside the live buffer the slot holds; the graph
                    // has finished and nothing else runs on this connection. It is copied at once,
                    // since a later slot may reuse the region while the sender still writes.
                    let out = unsafe { slot.output.1.as_slice() }.to_vec();
                    if k + 1 == n {
                        s.answer = Some(out);
                        continue;
                    }
                    let want = s.cur(k).len() * 4;
                    if out.len() != want {
                        refuse!("EXT_TP_RUN slot {k}: output of {} bytes for {} values", out.len(), want / 4);
                    }
                    s.mine = Arc::new(out);
                    if tx.send(((k * n_streams + i) as u32, s.mine.clone())).is_err() {
                        refuse!("the link sender stopped");
                    }
                }
            }
            Ok(())
        })();
        drop(tx);
        if computed.is_err() {
            // The run is over and so are the links: a sender blocked on a peer that stopped reading
            // fails now instead of after the link's timeout.
            for l in links.values() {
                let _ = l.shutdown(std::net::Shutdown::Both);
            }
        }
        let sent = sender.join().unwrap_or_else(|_| Err(Error::Refused("link sender panicked".into())));
        computed.and(sent)
    })?;
    debug!(
        rank,
        streams = n_streams,
        tokens = st.iter().map(|s| s.p.n_tokens).sum::<usize>(),
        compute_us = t_compute.as_micros() as u64,
        exchange_us = t_wait.as_micros() as u64,
        total_us = t_start.elapsed().as_micros() as u64,
        "tp_run_streams"
    );
    Ok(st.into_iter().flat_map(|s| s.answer.unwrap_or_default()).collect())
}

/// The link to rank `r`.
fn link(links: &HashMap<u32, TcpStream>, r: u32) -> Result<&TcpStream> {
    links.get(&r).ok_or_else(|| Error::Refused(format!("no link to rank {r}")))
}

/// Writes one partial, tagged `tag`, to every rank but `rank`.
fn send_tagged(
    links: &HashMap<u32, TcpStream>,
    rank: u32,
    n_ranks: u32,
    tag: u32,
    mine: &[u8],
) -> Result<()> {
    let mut header = [0u8; 12];
    header[..4].copy_from_slice(&tag.to_le_bytes());
    header[4..].copy_from_slice(&(mine.len() as u64).to_le_bytes());
    // A small partial goes out as one write with its header: one segment, so the peer wakes once
    // (with TCP_NODELAY, two writes were two segments and often two wake-ups).
    let joined = (mine.len() <= INLINE_SEND).then(|| [&header[..], mine].concat());
    for r in (0..n_ranks).filter(|&r| r != rank) {
        let mut s = link(links, r)?;
        match &joined {
            Some(m) => s.write_all(m),
            None => s.write_all(&header).and_then(|()| s.write_all(mine)),
        }
        .map_err(|e| Error::Refused(format!("sending partial {tag} to rank {r}: {e}")))?;
    }
    Ok(())
}

/// Reads every other rank's partial tagged `tag` (of `len` bytes) into `partials[rank]`; with
/// `poll`, the header is awaited with [`read_exact_polling`] (only when no other thread writes to
/// the links meanwhile).
fn recv_tagged(
    links: &HashMap<u32, TcpStream>,
    rank: u32,
    n_ranks: u32,
    tag: u32,
    len: usize,
    poll: bool,
    partials: &mut [Vec<u8>],
) -> Result<()> {
    for r in (0..n_ranks).filter(|&r| r != rank) {
        let mut s = link(links, r)?;
        let mut h = [0u8; 12];
        let first = if poll { read_exact_polling(s, &mut h) } else { s.read_exact(&mut h) };
        first.map_err(|e| Error::Refused(format!("rank {r}, partial {tag}: {e}")))?;
        let t = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let l = u64::from_le_bytes([h[4], h[5], h[6], h[7], h[8], h[9], h[10], h[11]]);
        if t != tag || l != len as u64 {
            refuse!("rank {r} sent partial {t} ({l} bytes) where partial {tag} ({len} bytes) was due");
        }
        let v = &mut partials[r as usize];
        v.resize(len, 0);
        s.read_exact(v).map_err(|e| Error::Refused(format!("rank {r}, partial {tag}: {e}")))?;
    }
    Ok(())
}

/// Sends `mine` (tagged with the phase) to every other rank and reads each one's into
/// `partials[rank]` (its own entry is left alone).
fn exchange(
    links: &mut HashMap<u32, TcpStream>,
    rank: u32,
    phase: u32,
    mine: &[u8],
    partials: &mut [Vec<u8>],
) -> Result<()> {
    let n_ranks = partials.len() as u32;
    // Polling toggles the link's O_NONBLOCK, so only when no sender thread writes to it meanwhile.
    let poll = mine.len() <= INLINE_SEND;
    if poll {
        send_tagged(links, rank, n_ranks, phase, mine)?;
        return recv_tagged(links, rank, n_ranks, phase, mine.len(), poll, partials);
    }
    let links = &*links;
    std::thread::scope(|sc| {
        let sender = sc.spawn(|| send_tagged(links, rank, n_ranks, phase, mine));
        let got = recv_tagged(links, rank, n_ranks, phase, mine.len(), poll, partials);
        let sent = sender.join().unwrap_or_else(|_| Err(Error::Refused("link sender panicked".into())));
        sent.and(got)
    })
}
