//! `llamad-netem`: a userspace link emulator for `bench/network.sh`.
//!
//! The kernels this project's CI runs on have no `sch_netem` (only `tbf`, `htb`, `pfifo`), so the
//! delays of real links cannot come from `tc`. This program owns one TUN device per node
//! (`{prefix}0`, `{prefix}1`, ...); the bench script moves each into a node's network namespace and
//! gives it the address `{net}.{i + 1}/24`. Every IPv4 packet a node sends into its TUN device is
//! read here, passes through the emulated link from its source node to its destination node, and is
//! written into the destination's TUN device:
//!
//! - the link serialises packets at `--rate-mbit` (a packet leaves when the previous one has left
//!   and its own bits have been sent), queueing at most `--queue-ms` of traffic (beyond that the
//!   packet is dropped, as a shaper's queue limit drops it, and TCP backs off);
//! - then it is held for the one-way `--delay-us` plus a uniform jitter in `±--jitter-us`, never
//!   overtaking the packet before it on the same link (no reordering, unlike netem's default).
//!
//! So a round trip between two nodes costs `2 × delay` plus the emulator's own wake-up latency,
//! which the bench measures and prints. One thread does everything (`ppoll` with a nanosecond
//! timeout and a 1 ns timer slack): the TUN devices take up to 64 KiB packets, so even 25 Gbit/s is
//! about 50 000 packets per second.
//!
//! Why not a crate: opening a TUN device is one `ioctl`, and the TUN crates bring async runtimes
//! and configuration layers this program does not need.

use std::collections::VecDeque;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use rand::{Rng, SeedableRng};

#[derive(Parser, Debug)]
#[command(about = "Userspace link emulator for bench/network.sh (TUN devices, delay, jitter, rate)")]
struct Args {
    /// Number of nodes (TUN devices), at most 250.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// TUN device name prefix (device i is PREFIX{i}).
    #[arg(long, default_value = "llnet")]
    prefix: String,
    /// One-way delay per packet, microseconds.
    #[arg(long, default_value_t = 0)]
    delay_us: u64,
    /// Uniform jitter added to the delay, ± microseconds.
    #[arg(long, default_value_t = 0)]
    jitter_us: u64,
    /// Link rate in Mbit/s (0: unlimited).
    #[arg(long, default_value_t = 0)]
    rate_mbit: u64,
    /// Most traffic a link queues before dropping, in milliseconds at its rate (at least 4 MiB).
    #[arg(long, default_value_t = 200)]
    queue_ms: u64,
    /// Seed of the jitter.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// The largest packet a TUN device hands over (its MTU is set to at most this).
const MAX_PACKET: usize = 65536;

fn main() -> Result<()> {
    let args = Args::parse();
    if args.nodes < 2 || args.nodes > 250 {
        bail!("--nodes must be between 2 and 250");
    }
    if args.jitter_us > args.delay_us {
        bail!("--jitter-us ({}) must not exceed --delay-us ({})", args.jitter_us, args.delay_us);
    }
    set_timer_slack_ns(1);
    let mut tuns = Vec::with_capacity(args.nodes);
    for i in 0..args.nodes {
        let name = format!("{}{i}", args.prefix);
        tuns.push(open_tun(&name).with_context(|| format!("creating TUN device {name}"))?);
    }
    let mut emu = Emulator::new(&args);
    // The bench script waits for this line before configuring the devices.
    let mut out = std::io::stdout();
    writeln!(out, "ready")?;
    out.flush()?;
    emu.run(&tuns)
}

/// One direction between two nodes.
struct Link {
    /// When the link's last queued packet has been serialised.
    busy_until: Instant,
    /// Release time of the last packet (releases never go backwards: no reordering).
    last_release: Instant,
    /// Packets waiting for their release time.
    queue: VecDeque<(Instant, Vec<u8>)>,
    queued_bytes: usize,
}

struct Emulator {
    nodes: usize,
    delay: Duration,
    jitter_us: u64,
    /// Nanoseconds per byte at the link rate (0: unlimited).
    ns_per_byte: f64,
    queue_limit: usize,
    links: Vec<Link>,
    rng: rand::rngs::StdRng,
    dropped: u64,
}

impl Emulator {
    fn new(a: &Args) -> Emulator {
        let now = Instant::now();
        let ns_per_byte = if a.rate_mbit == 0 { 0.0 } else { 8000.0 / a.rate_mbit as f64 };
        let rate_bytes_per_ms = a.rate_mbit.saturating_mul(1000) / 8;
        let queue_limit = (rate_bytes_per_ms.saturating_mul(a.queue_ms) as usize).max(4 << 20);
        Emulator {
            nodes: a.nodes,
            delay: Duration::from_micros(a.delay_us),
            jitter_us: a.jitter_us,
            ns_per_byte,
            queue_limit,
            links: (0..a.nodes * a.nodes)
                .map(|_| Link { busy_until: now, last_release: now, queue: VecDeque::new(), queued_bytes: 0 })
                .collect(),
            rng: rand::rngs::StdRng::seed_from_u64(a.seed),
            dropped: 0,
        }
    }

    /// The destination node of an IPv4 packet (`{net}.{node + 1}`), if it is one of ours.
    fn destination(&self, packet: &[u8]) -> Option<usize> {
        if packet.len() < 20 || packet[0] >> 4 != 4 {
            return None;
        }
        let last = packet[19] as usize;
        (1..=self.nodes).contains(&last).then(|| last - 1)
    }

    /// Queues a packet from `src` on its link.
    fn admit(&mut self, src: usize, packet: Vec<u8>, now: Instant) {
        let Some(dst) = self.destination(&packet) else { return };
        if dst == src {
            return;
        }
        let jitter = if self.jitter_us == 0 {
            0i64
        } else {
            self.rng.random_range(-(self.jitter_us as i64)..=self.jitter_us as i64)
        };
        let link = &mut self.links[src * self.nodes + dst];
        if link.queued_bytes + packet.len() > self.queue_limit {
            self.dropped += 1;
            return;
        }
        let serialise = Duration::from_nanos((packet.len() as f64 * self.ns_per_byte) as u64);
        let departs = link.busy_until.max(now) + serialise;
        link.busy_until = departs;
        let base = departs + self.delay;
        let release = if jitter >= 0 {
            base + Duration::from_micros(jitter as u64)
        } else {
            base.checked_sub(Duration::from_micros(jitter.unsigned_abs())).unwrap_or(base)
        };
        let release = release.max(link.last_release);
        link.last_release = release;
        link.queued_bytes += packet.len();
        link.queue.push_back((release, packet));
    }

    /// Writes every packet whose time has come; returns the earliest release still pending.
    fn release(&mut self, tuns: &[OwnedFd], now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for (i, link) in self.links.iter_mut().enumerate() {
            let dst = i % self.nodes;
            while let Some((at, _)) = link.queue.front() {
                if *at > now {
                    next = Some(next.map_or(*at, |n| n.min(*at)));
                    break;
                }
                let (_, packet) = link.queue.pop_front().expect("front exists");
                link.queued_bytes -= packet.len();
                // A full device queue drops the packet, like a full NIC ring: TCP retransmits.
                let _ = write_packet(&tuns[dst], &packet);
            }
        }
        next
    }

    fn run(&mut self, tuns: &[OwnedFd]) -> Result<()> {
        let mut pollfds: Vec<libc::pollfd> = tuns
            .iter()
            .map(|t| libc::pollfd { fd: t.as_raw_fd(), events: libc::POLLIN, revents: 0 })
            .collect();
        let mut buf = vec![0u8; MAX_PACKET];
        let mut next: Option<Instant> = None;
        loop {
            let timeout = next.map(|at| at.saturating_duration_since(Instant::now()));
            poll(&mut pollfds, timeout)?;
            let now = Instant::now();
            for (src, p) in pollfds.iter().enumerate() {
                if p.revents & libc::POLLIN == 0 {
                    continue;
                }
                // Drain what is there, a bounded number per round so no node starves the others.
                for _ in 0..64 {
                    match read_packet(&tuns[src], &mut buf)? {
                        Some(n) => self.admit(src, buf[..n].to_vec(), now),
                        None => break,
                    }
                }
            }
            next = self.release(tuns, Instant::now());
        }
    }
}

/// Opens `/dev/net/tun` as the TUN device `name` (IPv4 packets without the packet-info header),
/// non-blocking.
fn open_tun(name: &str) -> Result<OwnedFd> {
    if name.len() >= libc::IFNAMSIZ {
        bail!("device name {name:?} is too long");
    }
    // SAFETY: the path is a NUL-terminated literal; open returns a new descriptor or -1.
    let fd =
        unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error())
            .context("opening /dev/net/tun (root and the tun module needed)");
    }
    // SAFETY: fd is a descriptor we just opened and own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // struct ifreq: the name (IFNAMSIZ bytes) then a union whose first member here is ifr_flags.
    let mut ifr = [0u8; 40];
    ifr[..name.len()].copy_from_slice(name.as_bytes());
    let flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    ifr[libc::IFNAMSIZ..libc::IFNAMSIZ + 2].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: TUNSETIFF reads and writes one struct ifreq (40 bytes on Linux), which `ifr` is.
    let rc = unsafe { libc::ioctl(owned.as_raw_fd(), libc::TUNSETIFF, ifr.as_mut_ptr()) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error()).context("TUNSETIFF");
    }
    Ok(owned)
}

/// One packet into `buf`; `None` when none is waiting.
fn read_packet(fd: &OwnedFd, buf: &mut [u8]) -> Result<Option<usize>> {
    // SAFETY: buf is a valid writable slice of buf.len() bytes.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n >= 0 {
        return Ok(Some(n as usize));
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
        _ => Err(e).context("reading a TUN device"),
    }
}

fn write_packet(fd: &OwnedFd, packet: &[u8]) -> std::io::Result<()> {
    // SAFETY: packet is a valid readable slice of packet.len() bytes.
    let n = unsafe { libc::write(fd.as_raw_fd(), packet.as_ptr().cast(), packet.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `ppoll` with a nanosecond timeout (`None`: wait for a packet).
fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> Result<()> {
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: fds is a valid slice of pollfd; tsp is null or points to a live timespec; no sigmask.
    let rc = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, tsp, std::ptr::null()) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e).context("ppoll");
        }
    }
    Ok(())
}

/// Asks the kernel to wake this thread within `ns` of its timers (the default slack is 50 µs,
/// as large as the shortest delay emulated).
fn set_timer_slack_ns(ns: libc::c_ulong) {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and changes only this thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, ns, 0, 0, 0);
    }
}
