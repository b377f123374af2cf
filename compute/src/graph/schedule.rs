//! Grouping the phases of a graph's nodes into steps.
//!
//! A node's phases run in order, and a node that reads, or writes over, memory another node writes
//! or reads must run after it. Within those rules, independent phases may share a step: their units
//! are claimed from one counter and the threads wait once at its end. Dependencies are found from
//! memory, not from the graph's edges: two nodes conflict when the byte extent one writes overlaps
//! any extent the other reads or writes. That covers views, in-place ops and the arena's reuse of
//! dead tensors' memory alike, since it is the memory that must not be touched concurrently.
//!
//! Each phase goes to the first step after the steps of everything it conflicts with (and after its
//! own previous phase), looking back at most [`WINDOW`] steps, so building stays linear in the node
//! count. Phases that keep data in the shared scratch from one phase to the next (an activation
//! conversion read by the product) get regions of their own while they are live.

use super::Node;
use crate::ops::Plan;

/// How many of the latest steps a phase may join (an older step is always before it).
const WINDOW: usize = 8;

/// Shared scratch that merging may add to what the largest single plan needs: beyond it (a graph of
/// many independent products of large inputs, perhaps a hostile one), every phase gets a step of its
/// own again, and the scratch is the largest plan's, as without merging.
const MERGED_SHARED_EXTRA: usize = 64 << 20;

/// One phase of one plan in a step.
#[derive(Clone, Debug)]
pub(crate) struct Member {
    /// Index into the graph's plans.
    pub plan: usize,
    /// The phase.
    pub phase: u8,
    /// Its first unit in the step's unit numbering.
    pub first: usize,
    /// Its units.
    pub units: usize,
}

/// Phases that run together; the threads wait for all of them before the next step.
#[derive(Clone, Debug, Default)]
pub(crate) struct Step {
    /// The phases, their units numbered one after the other.
    pub members: Vec<Member>,
    /// Units of all members.
    pub units: usize,
}

/// The result of [`schedule`].
pub(crate) struct Schedule {
    pub steps: Vec<Step>,
    /// Per plan: offset of its shared scratch.
    pub shared_off: Vec<usize>,
    /// Shared scratch bytes for the whole run.
    pub shared_bytes: usize,
}

/// Byte extents `[start, end)` a node writes (its destination) and reads (its sources).
struct Extents {
    write: (usize, usize),
    reads: Vec<(usize, usize)>,
}

pub(super) fn extent(t: &super::Tensor) -> Option<(usize, usize)> {
    let n = usize::try_from(t.layout.nbytes()?).ok()?;
    let a = t.data as usize;
    (n > 0).then(|| (a, a.saturating_add(n)))
}

pub(super) fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

impl Extents {
    /// What `n` writes and reads, `also` being a tensor its plan reads besides its sources.
    fn of(n: &Node, also: Option<&super::Tensor>) -> Extents {
        Extents {
            // A destination whose extent cannot be computed was refused by `ops::prepare`; an
            // empty one conflicts with nothing.
            write: extent(&n.dst).unwrap_or((0, 0)),
            reads: n.src.iter().flatten().chain(also).filter_map(extent).collect(),
        }
    }

    fn conflicts(&self, o: &Extents) -> bool {
        let w = |a: (usize, usize), b: (usize, usize)| a.0 < a.1 && overlaps(a, b);
        w(self.write, o.write)
            || o.reads.iter().any(|&r| w(self.write, r))
            || self.reads.iter().any(|&r| w(o.write, r))
    }
}

/// Groups the phases of `plans` (`(node index, plan)` in graph order) into steps; `masks[i]` is a
/// tensor node `i`'s plan also reads (`fusion::masked_products`).
pub(crate) fn schedule(nodes: &[Node], plans: &[(usize, Plan)], masks: &[Option<super::Tensor>]) -> Schedule {
    let ext: Vec<Extents> =
        plans.iter().map(|(i, _)| Extents::of(&nodes[*i], masks.get(*i).and_then(|m| m.as_ref()))).collect();
    let mut steps: Vec<Step> = Vec::new();
    // Per plan: the steps of its first and last phase.
    let mut span = vec![(0usize, 0usize); plans.len()];
    for (pi, (_, plan)) in plans.iter().enumerate() {
        for phase in 0..plan.phases {
            let floor = steps.len().saturating_sub(WINDOW);
            let mut t = floor;
            if phase > 0 {
                t = t.max(span[pi].1 + 1);
            }
            for (si, st) in steps.iter().enumerate().skip(floor).rev() {
                if si < t {
                    break;
                }
                if st.members.iter().any(|m| m.plan != pi && ext[pi].conflicts(&ext[m.plan])) {
                    t = si + 1;
                    break;
                }
            }
            if t == steps.len() {
                steps.push(Step::default());
            }
            let units = plan.units[phase as usize];
            let st = &mut steps[t];
            st.members.push(Member { plan: pi, phase, first: st.units, units });
            st.units += units;
            if phase == 0 {
                span[pi] = (t, t);
            } else {
                span[pi].1 = t;
            }
        }
    }
    // Shared scratch: a plan's region lives from its first step to its last; regions of plans that
    // are live at the same time do not overlap.
    let mut shared_off = vec![0usize; plans.len()];
    let mut shared_bytes = 0usize;
    let mut live: Vec<(usize, usize, usize)> = Vec::new(); // (last step, offset, end)
    let mut order: Vec<usize> = (0..plans.len()).filter(|&i| plans[i].1.shared_bytes > 0).collect();
    order.sort_by_key(|&i| span[i].0);
    for i in order {
        let (first, last) = span[i];
        live.retain(|&(l, _, _)| l >= first);
        let off = live.iter().map(|&(_, _, e)| e).max().unwrap_or(0);
        let end = off.saturating_add(plans[i].1.shared_bytes);
        shared_off[i] = off;
        shared_bytes = shared_bytes.max(end);
        live.push((last, off, end));
    }
    let largest = plans.iter().map(|(_, p)| p.shared_bytes).max().unwrap_or(0);
    if shared_bytes > largest.saturating_add(MERGED_SHARED_EXTRA) {
        return one_phase_per_step(plans);
    }
    Schedule { steps, shared_off, shared_bytes }
}

/// Every phase in a step of its own, in graph order, all plans sharing the scratch from offset 0.
fn one_phase_per_step(plans: &[(usize, Plan)]) -> Schedule {
    let mut steps = Vec::new();
    for (pi, (_, plan)) in plans.iter().enumerate() {
        for phase in 0..plan.phases {
            let units = plan.units[phase as usize];
            steps.push(Step { members: vec![Member { plan: pi, phase, first: 0, units }], units });
        }
    }
    let shared_bytes = plans.iter().map(|(_, p)| p.shared_bytes).max().unwrap_or(0);
    Schedule { steps, shared_off: vec![0; plans.len()], shared_bytes }
}
