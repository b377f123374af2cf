//! Protocol 8.0.0's server-to-server all-reduce: COMM_INIT, COMM_ALLREDUCE and COMM_FREE, with
//! which a master's tensor split (`-sm tensor`) has two servers add their partial sums directly.
//!
//! ref: ggml-rpc-protocol-8.md, "COMM_INIT / COMM_ALLREDUCE / COMM_FREE".
//! * COMM_INIT `{device, rank, world, port, host}`: only `world == 2`. Rank 0 listens on
//!   `0.0.0.0:port` and accepts one peer; rank 1 connects to `host:port`, retrying as the version's
//!   table says (100 × 50 ms). Each side then sends its 24-byte `conn_caps` (zeros: TCP only) and
//!   reads the peer's. The answer is `1` once the link is up, `0` when it could not be made.
//! * COMM_ALLREDUCE `{device, tensor}`: an F32, contiguous tensor flagged COMPUTE. Rank 0 sends its
//!   values first, then reads rank 1's; rank 1 reads, then sends. Tensors of at least 32 768
//!   elements travel as BF16 (round to nearest even, ggml's conversion), smaller ones as F32; each
//!   side adds the peer's values into its own tensor in place (`own + peer`, element by element).
//!   The values are raw little-endian elements, no header: both sides know the count.
//! * COMM_FREE `{device}`: closes the link.
//!
//! Hardening beyond the reference: rank 1 dials only hosts the `--allow` list admits (the master
//! cannot aim a worker at arbitrary addresses); rank 0 admits only the address `host` names, or,
//! when `host` is this server itself (what upstream masters send rank 0), a peer the `--allow` list
//! admits; every wait is bounded; a link belongs to its master connection and closes with it, also
//! when the master leaves while an all-reduce waits on a silent peer (the wait looks at the master's
//! socket every 200 ms, [`MasterWatch`]); a peer that dies fails the all-reduce, which closes the
//! master connection with the reason instead of hanging the worker.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use compute::quant::blocks::{bf16_bits_to_f32, f32_to_bf16_bits};
use llamad_proto::cmd::CONN_CAPS_SIZE;
use llamad_proto::msg::CommInitReq;
use llamad_proto::version::CommSpec;
use tracing::{debug, info, warn};

use crate::error::{refuse, Error, Result};
use crate::rpc::access::{canonical, AllowList};
use crate::rpc::buffer::{Buffer, Region};
use crate::rpc::ext::BlockingJob;
use crate::rpc::link;

/// Longest silence of the peer inside an all-reduce (it may still be computing its partial).
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(300);
/// How often an all-reduce waiting on its peer looks whether its own master is still connected.
const MASTER_CHECK: Duration = Duration::from_millis(200);

/// One device's link to its peer.
struct CommLink {
    rank: u32,
    stream: TcpStream,
    peer: SocketAddr,
}

/// The links of one master connection, per device.
#[derive(Default)]
pub struct CommState {
    links: Arc<Mutex<HashMap<u32, CommLink>>>,
}

fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>> {
    m.lock().map_err(|_| Error::Refused("comm link table poisoned".into()))
}

/// Where and how a COMM_INIT may link, checked before anything is bound or dialled.
struct Plan {
    device: u32,
    rank: u32,
    port: u16,
    host: String,
}

impl Plan {
    /// The addresses `host` names (a name is resolved here, on the job's thread, never on the
    /// runtime); for rank 1, at least one must be in the allow list.
    fn named(&self, allow: &AllowList) -> Result<Vec<IpAddr>> {
        let named: Vec<IpAddr> = match (self.host.as_str(), self.port).to_socket_addrs() {
            Ok(a) => a.map(|a| canonical(a.ip())).collect(),
            Err(e) => refuse!("COMM_INIT host {:?} does not resolve: {e}", self.host),
        };
        if named.is_empty() {
            refuse!("COMM_INIT host {:?} resolves to no address", self.host);
        }
        if self.rank == 1 && !named.iter().any(|ip| allow.allows(*ip)) {
            refuse!(
                "COMM_INIT rank 1: host {} is not in the allow list ({allow}); add it to --allow (server.allow) \
                 to let this worker link to it",
                self.host
            );
        }
        Ok(named)
    }
}

impl CommState {
    /// COMM_INIT: validates the request (a violation closes the connection), then returns the job
    /// that makes the link (its answer: `1`, or `0` when the peer never came). `local` is this
    /// server's address as the master reached it.
    pub fn init(
        &mut self,
        req: &CommInitReq,
        spec: &CommSpec,
        local: Option<IpAddr>,
        shared: Arc<crate::Shared>,
    ) -> Result<BlockingJob> {
        // The link's set-up is bounded as a handshake is (`limits.hello_timeout_secs`).
        let wait = shared.cfg.hello_timeout;
        let allow = &shared.cfg.allow;
        let plan = Self::plan(req, spec)?;
        // An address literal is checked now (no lookup), so that a refused host closes the connection
        // before anything is bound; a name is looked up in the job.
        if plan.host.parse::<IpAddr>().is_ok() {
            plan.named(allow)?;
        }
        // A new COMM_INIT on a device replaces its link (the old one closes).
        if lock(&self.links)?.remove(&plan.device).is_some() {
            debug!(device = plan.device, "COMM_INIT replaces the device's link");
        }
        let links = self.links.clone();
        let spec = *spec;
        if plan.rank == 0 {
            // Bind now, so that a taken port is the master's error (the connection closes), not a
            // silent `0`.
            let listener = TcpListener::bind((IpAddr::from([0u8; 4]), plan.port)).map_err(|e| {
                Error::Refused(format!("COMM_INIT rank 0: cannot listen on port {}: {e}", plan.port))
            })?;
            listener.set_nonblocking(true)?;
            let allow = allow.clone();
            Ok(Box::new(move || {
                let named = plan.named(&allow)?;
                let is_self = named.iter().any(|ip| Some(*ip) == local.map(canonical) || ip.is_unspecified());
                let admit = |ip: IpAddr| allow.allows(ip) && (is_self || named.contains(&canonical(ip)));
                let made = link::accept_one(&listener, wait, "the COMM_INIT listener", |s, from| {
                    if !admit(from.ip()) {
                        warn!(%from, host = %plan.host, "COMM link: a peer the master did not name connected; dropped");
                        return Ok(false);
                    }
                    Ok(greet(s).is_ok())
                });
                drop(listener);
                finish(made, &plan, links, &shared)
            }))
        } else {
            let allow = allow.clone();
            Ok(Box::new(move || {
                plan.named(&allow)?;
                let interval = Duration::from_millis(spec.connect_interval_ms);
                let made = link::dial(&plan.host, plan.port, spec.connect_attempts, interval, wait)
                    .and_then(|(mut s, _)| greet(&mut s).map(|()| s));
                finish(made, &plan, links, &shared)
            }))
        }
    }

    fn plan(req: &CommInitReq, spec: &CommSpec) -> Result<Plan> {
        if req.world != spec.world {
            refuse!("COMM_INIT with world {} (only {} is supported)", req.world, spec.world);
        }
        if req.rank >= req.world {
            refuse!("COMM_INIT rank {} out of range for world {}", req.rank, req.world);
        }
        let Ok(port) = u16::try_from(req.port) else { refuse!("COMM_INIT port {} out of range", req.port) };
        if port == 0 {
            refuse!("COMM_INIT port 0");
        }
        let Some(host) = req.host_str().filter(|h| !h.is_empty()) else {
            refuse!("COMM_INIT host is empty, not NUL-terminated or not UTF-8");
        };
        Ok(Plan { device: req.device, rank: req.rank, port, host: host.to_string() })
    }

    /// COMM_FREE: closes the device's link (none: nothing to do).
    pub fn free(&mut self, device: u32) -> Result<()> {
        match lock(&self.links)?.remove(&device) {
            Some(l) => debug!(device, peer = %l.peer, "COMM link closed"),
            None => debug!(device, "COMM_FREE without a link"),
        }
        Ok(())
    }

    /// COMM_ALLREDUCE over `region` (an F32 tensor of `n` elements, validated by the session): the
    /// job exchanges the values with the peer and adds the peer's in place. `master` watches the
    /// master connection (see [`MasterWatch`]), so that a wait on a silent peer ends with it.
    pub fn allreduce(
        &mut self,
        device: u32,
        spec: &CommSpec,
        buf: Arc<Buffer>,
        region: Region,
        shared: Arc<crate::Shared>,
        master: Option<MasterWatch>,
    ) -> Result<BlockingJob> {
        if !lock(&self.links)?.contains_key(&device) {
            refuse!("COMM_ALLREDUCE on device {device} before COMM_INIT");
        }
        let links = self.links.clone();
        let bf16 = (region.len() / 4) as u64 >= spec.bf16_min_elements;
        Ok(Box::new(move || {
            let _hold = buf;
            let mut table = lock(&links)?;
            let Some(l) = table.get_mut(&device) else { refuse!("COMM link of device {device} vanished") };
            // SAFETY: `region` lies inside the live buffer `_hold` (validated by the session, held
            // here); the session runs one command at a time and awaits this job before the next.
            let values = unsafe { region.as_mut_slice() };
            match exchange(l, values, bf16, master.as_ref()) {
                Ok(()) => {
                    shared.stats.allreduces.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    Ok(None)
                }
                Err(e) => {
                    let peer = l.peer;
                    table.remove(&device);
                    Err(Error::Refused(format!("COMM_ALLREDUCE with {peer} failed: {e}")))
                }
            }
        }))
    }
}

/// The link's opening: each side sends its 24-byte `conn_caps` (zeros: TCP only) and reads the
/// peer's, which a TCP-only server ignores (ref: ggml-rpc-protocol.md §6).
fn greet(s: &mut TcpStream) -> Result<()> {
    s.write_all(&[0u8; CONN_CAPS_SIZE])?;
    let mut caps = [0u8; CONN_CAPS_SIZE];
    s.read_exact(&mut caps)?;
    Ok(())
}

/// Stores a made link and answers `1`; a link that could not be made answers `0`. The link's socket
/// timeouts are [`MASTER_CHECK`], the slice in which an all-reduce looks at its master.
fn finish(
    made: Result<TcpStream>,
    plan: &Plan,
    links: Arc<Mutex<HashMap<u32, CommLink>>>,
    shared: &crate::Shared,
) -> Result<Option<Vec<u8>>> {
    let stream = match made.and_then(|s| link::prepare(s, MASTER_CHECK)) {
        Ok(s) => s,
        Err(e) => {
            warn!(device = plan.device, rank = plan.rank, host = %plan.host, port = plan.port, reason = %e, "COMM link not made");
            return Ok(Some(vec![0]));
        }
    };
    let peer = stream.peer_addr()?;
    info!(device = plan.device, rank = plan.rank, %peer, "COMM link up");
    shared.stats.comm_links.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    lock(&links)?.insert(plan.device, CommLink { rank: plan.rank, stream, peer });
    Ok(Some(vec![1]))
}

/// A second handle on a master connection's socket, to tell while an all-reduce waits whether the
/// master has gone: the link must not outlive it. One per connection, shared by its all-reduces.
#[derive(Clone)]
pub struct MasterWatch(Arc<TcpStream>);

impl MasterWatch {
    /// Watches `socket` (a duplicate of the master connection's descriptor).
    pub fn new(socket: TcpStream) -> MasterWatch {
        MasterWatch(Arc::new(socket))
    }

    /// True once the master closed its end with nothing left unread in the kernel. Only peeks, so the
    /// connection's own reader still gets every byte.
    fn gone(&self) -> bool {
        // The descriptor is non-blocking (the runtime owns it): no data is `WouldBlock`.
        matches!(self.0.peek(&mut [0u8; 1]), Ok(0))
    }
}

/// One all-reduce of `values` (F32, little-endian) with the peer: rank 0 sends first.
fn exchange(
    l: &mut CommLink,
    values: &mut [u8],
    bf16: bool,
    master: Option<&MasterWatch>,
) -> std::io::Result<()> {
    // Our values go out as they are (F32) or encoded (BF16); they are added to only after both
    // transfers, so the F32 case needs no copy.
    let encoded = bf16.then(|| encode_bf16(values));
    let mine: &[u8] = encoded.as_deref().unwrap_or(values);
    let mut theirs = vec![0u8; mine.len()];
    let deadline = std::time::Instant::now() + EXCHANGE_TIMEOUT;
    if l.rank == 0 {
        transfer(&mut l.stream, Dir::Send(mine), master, deadline)?;
        transfer(&mut l.stream, Dir::Recv(&mut theirs), master, deadline)?;
    } else {
        transfer(&mut l.stream, Dir::Recv(&mut theirs), master, deadline)?;
        transfer(&mut l.stream, Dir::Send(mine), master, deadline)?;
    }
    add_in_place(values, &theirs, bf16);
    Ok(())
}

enum Dir<'a> {
    Send(&'a [u8]),
    Recv(&'a mut [u8]),
}

/// Sends or receives every byte on the link in slices of [`MASTER_CHECK`] (the link's socket
/// timeouts), failing when the master left, the peer closed, or `deadline` passed.
fn transfer(
    s: &mut TcpStream,
    mut dir: Dir<'_>,
    master: Option<&MasterWatch>,
    deadline: std::time::Instant,
) -> std::io::Result<()> {
    use std::io::{Error as IoError, ErrorKind};
    let total = match &dir {
        Dir::Send(b) => b.len(),
        Dir::Recv(b) => b.len(),
    };
    let mut done = 0;
    while done < total {
        let r = match &mut dir {
            Dir::Send(b) => s.write(&b[done..]),
            Dir::Recv(b) => s.read(&mut b[done..]),
        };
        match r {
            Ok(0) => return Err(IoError::new(ErrorKind::UnexpectedEof, "the peer closed the link")),
            Ok(n) => done += n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                if master.is_some_and(MasterWatch::gone) {
                    return Err(IoError::new(ErrorKind::ConnectionAborted, "the master connection closed"));
                }
                if std::time::Instant::now() >= deadline {
                    return Err(IoError::new(
                        ErrorKind::TimedOut,
                        format!("no progress within {EXCHANGE_TIMEOUT:?}"),
                    ));
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// F32 `values` as BF16 for the link (ggml's round to nearest even).
pub fn encode_bf16(values: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / 2);
    for c in values.chunks_exact(4) {
        let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        out.extend_from_slice(&f32_to_bf16_bits(v).to_le_bytes());
    }
    out
}

/// `values[i] += peer[i]`, the peer's values in the link encoding.
pub fn add_in_place(values: &mut [u8], peer: &[u8], bf16: bool) {
    let width = if bf16 { 2 } else { 4 };
    for (v, p) in values.chunks_exact_mut(4).zip(peer.chunks_exact(width)) {
        let own = f32::from_le_bytes([v[0], v[1], v[2], v[3]]);
        let other = if bf16 {
            bf16_bits_to_f32(u16::from_le_bytes([p[0], p[1]]))
        } else {
            f32::from_le_bytes([p[0], p[1], p[2], p[3]])
        };
        v.copy_from_slice(&(own + other).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_encoding_rounds_to_nearest_even_and_adds_in_place() {
        // 1 + 1/256 lies halfway between two BF16 values: even wins (0x3f80); 1 + 3/256 rounds up.
        let vals: Vec<u8> =
            [1.0f32 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let e = encode_bf16(&vals);
        assert_eq!(e, [0x80, 0x3f, 0x82, 0x3f, 0x00, 0xc0]);
        let mut own: Vec<u8> = [0.5f32, 0.25, 1.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        add_in_place(&mut own, &e, true);
        let got: Vec<f32> = own.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(got, [1.5, 0.25 + 1.0 + 2.0 / 128.0, -1.0]);
        let mut own2 = vals.clone();
        add_in_place(&mut own2, &vals, false);
        assert_eq!(f32::from_le_bytes(own2[8..12].try_into().unwrap()), -4.0);
    }
}
