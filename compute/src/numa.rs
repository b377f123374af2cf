//! NUMA placement (`--numa distribute|isolate`, the modes llama.cpp offers): which CPUs each
//! compute thread runs on, and where memory pages are allocated, on servers with several memory
//! nodes (multi-socket, or sub-NUMA clustering).
//!
//! * `distribute`: compute thread `i` runs on the CPUs of node `i mod nodes`, and new pages are
//!   interleaved over all nodes (the memory policy of the process's threads started after
//!   [`init`], which inherit it), so weights and KV cache are spread as evenly as the threads that
//!   read them, and every node's memory controller serves its share.
//! * `isolate`: every compute thread runs on the CPUs of the node the process started on, and new
//!   pages are allocated there first (preferred: another node is used when it is full). For one
//!   worker per node (`numactl`-free): start one llamad per node, each pinned there by its start CPU.
//! * `off` (the default): the scheduler and first-touch allocation decide.
//!
//! The topology comes from `/sys/devices/system/node/node*/cpulist`, restricted to the CPUs this
//! process may run on (`sched_getaffinity`: a cgroup or `taskset` that excludes CPUs keeps them
//! excluded). With fewer than two nodes there is nothing to place: no thread is pinned and no
//! policy changes.

use std::path::Path;
use std::sync::{Arc, OnceLock};

/// Where threads and memory go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum NumaMode {
    /// The scheduler decides.
    #[default]
    Off,
    /// Threads over all nodes in turn; pages interleaved over all nodes.
    Distribute,
    /// Threads and pages on the node the process started on.
    Isolate,
}

impl NumaMode {
    /// `off`, `distribute` or `isolate`.
    pub fn name(self) -> &'static str {
        match self {
            NumaMode::Off => "off",
            NumaMode::Distribute => "distribute",
            NumaMode::Isolate => "isolate",
        }
    }

    /// The mode named `s` (as [`NumaMode::name`]).
    pub fn parse(s: &str) -> Option<NumaMode> {
        [NumaMode::Off, NumaMode::Distribute, NumaMode::Isolate].into_iter().find(|m| m.name() == s)
    }
}

/// One memory node and the CPUs of it this process may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumaNode {
    /// The kernel's node number.
    pub id: usize,
    /// Its CPUs, ascending.
    pub cpus: Vec<usize>,
}

/// The memory nodes, in ascending order, each with at least one usable CPU.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Topology {
    /// The nodes.
    pub nodes: Vec<NumaNode>,
}

/// A Linux CPU list (`0-3,8-11,13`), or `None` when malformed. An empty string is no CPU.
pub fn parse_cpulist(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

impl Topology {
    /// The nodes under `root` (a directory laid out as `/sys/devices/system/node`), keeping only
    /// the CPUs in `allowed` (`None`: all).
    pub fn read(root: &Path, allowed: Option<&[usize]>) -> Topology {
        let mut nodes = Vec::new();
        let Ok(dir) = std::fs::read_dir(root) else { return Topology::default() };
        for e in dir.flatten() {
            let name = e.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_prefix("node")).and_then(|n| n.parse().ok())
            else {
                continue;
            };
            let Some(mut cpus) =
                std::fs::read_to_string(e.path().join("cpulist")).ok().and_then(|s| parse_cpulist(&s))
            else {
                continue;
            };
            if let Some(a) = allowed {
                cpus.retain(|c| a.contains(c));
            }
            if !cpus.is_empty() {
                nodes.push(NumaNode { id, cpus });
            }
        }
        nodes.sort_by_key(|n| n.id);
        Topology { nodes }
    }

    /// This machine's nodes, restricted to the CPUs this process may use.
    pub fn system() -> Topology {
        let allowed = affinity::current();
        Topology::read(Path::new("/sys/devices/system/node"), allowed.as_deref())
    }

    /// The index (into `nodes`) of the node holding `cpu`.
    pub fn node_of_cpu(&self, cpu: usize) -> Option<usize> {
        self.nodes.iter().position(|n| n.cpus.contains(&cpu))
    }
}

/// The placement in force: a mode on a topology of two or more nodes.
#[derive(Clone, Debug)]
pub struct Placement {
    mode: NumaMode,
    topo: Topology,
    /// Index of the node `isolate` keeps to.
    home: usize,
}

impl Placement {
    /// The placement of `mode` on `topo`, whose `isolate` keeps to the node of `home_cpu` (the
    /// first node when unknown); `None` when there is nothing to place (`off`, or one node).
    pub fn new(mode: NumaMode, topo: Topology, home_cpu: Option<usize>) -> Option<Placement> {
        if mode == NumaMode::Off || topo.nodes.len() < 2 {
            return None;
        }
        let home = home_cpu.and_then(|c| topo.node_of_cpu(c)).unwrap_or(0);
        Some(Placement { mode, topo, home })
    }

    /// The node (index into the topology) compute thread `ith` runs on.
    pub fn node_for_thread(&self, ith: usize) -> usize {
        match self.mode {
            NumaMode::Distribute => ith % self.topo.nodes.len(),
            _ => self.home,
        }
    }

    /// The CPUs compute thread `ith` may run on.
    pub fn cpus_for_thread(&self, ith: usize) -> &[usize] {
        &self.topo.nodes[self.node_for_thread(ith)].cpus
    }

    /// Pins the calling thread as compute thread `ith`; a failure is logged, not fatal.
    pub fn pin_current(&self, ith: usize) {
        if let Err(e) = affinity::set_current(self.cpus_for_thread(ith)) {
            tracing::warn!(thread = ith, error = %e, "numa: could not pin the compute thread");
        }
    }

    /// Sets the memory policy of the calling thread (and of the threads it starts later): pages
    /// interleaved over all nodes (`distribute`) or preferably on the home node (`isolate`).
    fn apply_memory_policy(&self) -> std::io::Result<()> {
        let ids: Vec<usize> = match self.mode {
            NumaMode::Distribute => self.topo.nodes.iter().map(|n| n.id).collect(),
            _ => vec![self.topo.nodes[self.home].id],
        };
        let policy =
            if self.mode == NumaMode::Distribute { mempolicy::INTERLEAVE } else { mempolicy::PREFERRED };
        mempolicy::set(policy, &ids)
    }
}

static PLACEMENT: OnceLock<Option<Arc<Placement>>> = OnceLock::new();

/// Fixes the process's placement for `mode` from this machine's topology (once: later calls
/// return the first one) and sets the memory policy of the calling thread, which the threads it
/// starts afterwards inherit: call it early in `main`, before the runtime and the servers start.
pub fn init(mode: NumaMode) -> Option<Arc<Placement>> {
    PLACEMENT
        .get_or_init(|| {
            if mode == NumaMode::Off {
                return None;
            }
            let topo = Topology::system();
            let n = topo.nodes.len();
            // SAFETY: sched_getcpu takes no arguments and only reads the calling thread's CPU.
            let cpu = unsafe { libc::sched_getcpu() };
            let Some(p) = Placement::new(mode, topo, usize::try_from(cpu).ok()) else {
                tracing::info!(mode = mode.name(), nodes = n, "numa: one memory node, nothing to place");
                return None;
            };
            if let Err(e) = p.apply_memory_policy() {
                tracing::warn!(mode = mode.name(), error = %e, "numa: could not set the memory policy");
            }
            let nodes: Vec<String> =
                p.topo.nodes.iter().map(|n| format!("{}:{}", n.id, n.cpus.len())).collect();
            tracing::info!(mode = mode.name(), nodes = %nodes.join(","), home = p.topo.nodes[p.home].id,
                "numa: placement (node:cpus)");
            Some(Arc::new(p))
        })
        .clone()
}

/// The placement fixed by [`init`] (`None` before it, and when there is nothing to place).
pub fn placement() -> Option<Arc<Placement>> {
    PLACEMENT.get().cloned().flatten()
}

/// Thread CPU affinity (`sched_setaffinity`/`sched_getaffinity` on the calling thread).
mod affinity {
    /// The CPUs the calling thread may run on (`None` when the call fails).
    pub fn current() -> Option<Vec<usize>> {
        // SAFETY: an all-zero cpu_set_t is a valid empty set; sched_getaffinity writes at most
        // size_of::<cpu_set_t>() bytes into it, and CPU_ISSET reads within it (i < CPU_SETSIZE).
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return None;
            }
            Some((0..libc::CPU_SETSIZE as usize).filter(|&i| libc::CPU_ISSET(i, &set)).collect())
        }
    }

    /// Restricts the calling thread to `cpus` (those beyond `CPU_SETSIZE` are ignored).
    pub fn set_current(cpus: &[usize]) -> std::io::Result<()> {
        // SAFETY: as in `current`; CPU_SET writes within the set (i < CPU_SETSIZE is checked).
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
                libc::CPU_SET(c, &mut set);
            }
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// The memory policy system call (`set_mempolicy(2)`; libc has no wrapper for it).
mod mempolicy {
    pub const PREFERRED: libc::c_long = 1;
    pub const INTERLEAVE: libc::c_long = 3;

    /// Sets the calling thread's policy over the node ids `nodes`.
    pub fn set(mode: libc::c_long, nodes: &[usize]) -> std::io::Result<()> {
        const BITS: usize = libc::c_ulong::BITS as usize;
        let words = nodes.iter().max().map_or(1, |m| m / BITS + 1);
        let mut mask = vec![0 as libc::c_ulong; words];
        for &n in nodes {
            mask[n / BITS] |= 1 << (n % BITS);
        }
        // The kernel reads `maxnode - 1` bits of the mask.
        let maxnode = (words * BITS + 1) as libc::c_ulong;
        // SAFETY: the mask holds `words` initialized words, and the kernel reads at most
        // `maxnode - 1 = words * BITS` bits of it; the call changes only this thread's policy.
        let r = unsafe { libc::syscall(libc::SYS_set_mempolicy, mode, mask.as_ptr(), maxnode) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpulist("0-3,8-9,13\n"), Some(vec![0, 1, 2, 3, 8, 9, 13]));
        assert_eq!(parse_cpulist("5"), Some(vec![5]));
        assert_eq!(parse_cpulist(""), Some(vec![]));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("a"), None);
        assert_eq!(parse_cpulist("1-"), None);
    }

    fn fake_sysfs(nodes: &[(usize, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (id, cpus) in nodes {
            let n = d.path().join(format!("node{id}"));
            std::fs::create_dir(&n).unwrap();
            std::fs::write(n.join("cpulist"), format!("{cpus}\n")).unwrap();
        }
        // Entries that are not nodes are ignored.
        std::fs::write(d.path().join("possible"), "0-1\n").unwrap();
        d
    }

    #[test]
    fn topology_and_thread_plan() {
        let d = fake_sysfs(&[(1, "8-15"), (0, "0-7"), (2, "16-23")]);
        let t = Topology::read(d.path(), None);
        assert_eq!(t.nodes.iter().map(|n| n.id).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(t.node_of_cpu(9), Some(1));
        // Restricted to allowed CPUs: node 2 has none left and disappears.
        let allowed: Vec<usize> = (4..12).collect();
        let r = Topology::read(d.path(), Some(&allowed));
        assert_eq!(
            r.nodes,
            [NumaNode { id: 0, cpus: vec![4, 5, 6, 7] }, NumaNode { id: 1, cpus: vec![8, 9, 10, 11] }]
        );
        let p = Placement::new(NumaMode::Distribute, t.clone(), Some(9)).unwrap();
        assert_eq!((0..5).map(|i| p.node_for_thread(i)).collect::<Vec<_>>(), [0, 1, 2, 0, 1]);
        assert_eq!(p.cpus_for_thread(4), &(8..16).collect::<Vec<_>>()[..]);
        let p = Placement::new(NumaMode::Isolate, t.clone(), Some(9)).unwrap();
        assert!((0..5).all(|i| p.node_for_thread(i) == 1));
        assert!(Placement::new(NumaMode::Off, t, None).is_none());
        let one = Topology::read(fake_sysfs(&[(0, "0-3")]).path(), None);
        assert!(Placement::new(NumaMode::Distribute, one, None).is_none(), "one node: nothing to place");
        assert_eq!(NumaMode::parse("isolate"), Some(NumaMode::Isolate));
        assert_eq!(NumaMode::parse("numactl"), None);
    }

    /// Pool threads land on the CPUs of their node: a two-node topology made of this machine's
    /// first two CPUs (one each), so the pinning is real.
    #[test]
    fn pool_threads_are_pinned_per_node() {
        let Some(allowed) = affinity::current().filter(|a| a.len() >= 2) else {
            eprintln!("skipped: fewer than two CPUs");
            return;
        };
        let (c0, c1) = (allowed[0], allowed[1]);
        let d = fake_sysfs(&[(0, &c0.to_string()), (1, &c1.to_string())]);
        let topo = Topology::read(d.path(), Some(&allowed));
        // On a thread of its own: thread 0 of the pool is the caller, which gets pinned too.
        std::thread::spawn(move || {
            for (mode, want) in [
                (NumaMode::Distribute, [vec![c0], vec![c1], vec![c0]]),
                (NumaMode::Isolate, [vec![c1], vec![c1], vec![c1]]),
            ] {
                let p = Arc::new(Placement::new(mode, topo.clone(), Some(c1)).unwrap());
                let pool = crate::pool::Pool::with_placement(3, Some(p));
                let seen: Vec<std::sync::Mutex<Vec<usize>>> = (0..3).map(|_| Default::default()).collect();
                pool.run(&|ith| *seen[ith].lock().unwrap() = affinity::current().unwrap());
                let seen: Vec<Vec<usize>> = seen.into_iter().map(|m| m.into_inner().unwrap()).collect();
                assert_eq!(seen, want, "{mode:?}");
            }
        })
        .join()
        .unwrap();
    }
}
