//! Layer assignment across devices, llama.cpp's rule for split mode `layer`.
//!
//! ref: ggml-rpc-protocol.md §11.3. With `L` repeating layers the output head is slot `L`, so there
//! are `L + 1` slots. `ngl` trailing slots are offloaded (`start = L + 1 - ngl`); offloaded slot `i`
//! goes to the first device `d` whose normalised prefix sum `s[d]` exceeds `(i - start) / n`. The
//! weights are the `--tensor-split` values when any is non-zero, else each device's free memory.

use std::ops::Range;

/// Where one slot (a layer, or the output head at index `L`) runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// On this machine.
    Local,
    /// On device (worker) index `d`.
    Device(usize),
}

/// Assigns the `n_layer + 1` slots; `ngl = None` offloads everything. `weights` has one entry per
/// device; all-zero (or empty) weights put every slot on this machine.
pub fn assign_slots(n_layer: u32, ngl: Option<u32>, weights: &[f64]) -> Vec<Slot> {
    let slots = u64::from(n_layer) + 1;
    let ngl = ngl.map_or(slots, u64::from);
    let n = ngl.min(slots);
    let start = slots.saturating_sub(ngl);
    let total: f64 = weights.iter().filter(|w| w.is_finite() && **w > 0.0).sum();
    let mut prefix = Vec::with_capacity(weights.len());
    let mut acc = 0.0;
    for w in weights {
        if w.is_finite() && *w > 0.0 {
            acc += w;
        }
        prefix.push(if total > 0.0 { acc / total } else { 0.0 });
    }
    (0..slots)
        .map(|i| {
            if total <= 0.0 || i < start || i - start >= n {
                return Slot::Local;
            }
            let frac = (i - start) as f64 / n as f64;
            let d = prefix.iter().filter(|&&s| s <= frac).count();
            // Rounding can leave the last prefix a hair below 1.0; clamp to the last device.
            Slot::Device(d.min(weights.len() - 1))
        })
        .collect()
}

/// The slots turned into contiguous layer ranges: `local` layers `[0, local)` run here, then each
/// `(device, range)` in order.
///
/// llama.cpp puts the output layer (`output_norm`, `output`) on the device of slot `L` (its
/// `dev_output`), which is not always the device of the last repeating layer: with `-ngl 1` only the
/// output slot is offloaded, and an uneven split can move slot `L` past the last layer's device
/// (three equal devices, two layers: layers on devices 0 and 1, the output on device 2). Its
/// scheduler then runs the final RMS_NORM with the last layer and the rest of the head on the
/// output device (ref: ggml-compute-semantics.md §4.8). `output` records llama.cpp's choice; our
/// pipeline still runs the whole head with the last layer (see [`LayerPlan::head_moved`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerPlan {
    /// Layers `[0, local)` computed on this machine.
    pub local: u32,
    /// Remote ranges in layer order.
    pub remote: Vec<(usize, Range<u32>)>,
    /// Where llama.cpp places the output layer (slot `L`).
    pub output: Slot,
}

impl LayerPlan {
    /// Groups the repeating layers' slots (the output slot follows the last layer).
    pub fn from_slots(slots: &[Slot]) -> LayerPlan {
        let n_layer = slots.len().saturating_sub(1) as u32;
        let output = slots.last().copied().unwrap_or(Slot::Local);
        let mut plan = LayerPlan { local: 0, remote: Vec::new(), output };
        for il in 0..n_layer {
            match slots[il as usize] {
                Slot::Local => plan.local = il + 1,
                Slot::Device(d) => match plan.remote.last_mut() {
                    Some((last, r)) if *last == d && r.end == il => r.end = il + 1,
                    _ => plan.remote.push((d, il..il + 1)),
                },
            }
        }
        plan
    }

    /// Where the last repeating layer runs.
    pub fn last_layer(&self) -> Slot {
        match self.remote.last() {
            Some((d, _)) => Slot::Device(*d),
            None => Slot::Local,
        }
    }

    /// `Some((llama.cpp's output slot, ours))` when llama.cpp would run the output layer elsewhere
    /// than with the last layer, where this pipeline runs it.
    pub fn head_moved(&self) -> Option<(Slot, Slot)> {
        (self.output != self.last_layer()).then(|| (self.output, self.last_layer()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_example_of_the_reference() {
        // ref: §11.3 (verified): two servers with 24105 MiB free each, a 4-layer model, -ngl 99:
        // slots 0–2 → RPC0, slot 3 and the output → RPC1.
        let free = 24105.0 * 1024.0 * 1024.0;
        let s = assign_slots(4, Some(99), &[free, free]);
        use Slot::Device as D;
        assert_eq!(s, vec![D(0), D(0), D(0), D(1), D(1)]);
        let p = LayerPlan::from_slots(&s);
        assert_eq!(p, LayerPlan { local: 0, remote: vec![(0, 0..3), (1, 3..4)], output: Slot::Device(1) });
        assert_eq!(p.head_moved(), None);
    }

    #[test]
    fn ngl_keeps_leading_layers_local() {
        // 4 layers, ngl 3: start = 5 - 3 = 2, so layers 0, 1 here; slots 2, 3, 4 on one device.
        let s = assign_slots(4, Some(3), &[1.0]);
        assert_eq!(s, vec![Slot::Local, Slot::Local, Slot::Device(0), Slot::Device(0), Slot::Device(0)]);
        let p = LayerPlan::from_slots(&s);
        assert_eq!(p, LayerPlan { local: 2, remote: vec![(0, 2..4)], output: Slot::Device(0) });
        // ngl 0: everything local.
        let s = assign_slots(4, Some(0), &[1.0, 1.0]);
        assert!(s.iter().all(|&x| x == Slot::Local));
        assert_eq!(LayerPlan::from_slots(&s), LayerPlan { local: 4, remote: vec![], output: Slot::Local });
    }

    #[test]
    fn tensor_split_weights() {
        // 30 layers + output = 31 slots, split 3:1 → s = [0.75, 1.0]: slot i on device 0 while
        // i/31 < 0.75, i.e. i ≤ 23 (23/31 = 0.742), slot 24 (0.774) onwards on device 1.
        let s = assign_slots(30, None, &[3.0, 1.0]);
        let p = LayerPlan::from_slots(&s);
        assert_eq!(p, LayerPlan { local: 0, remote: vec![(0, 0..24), (1, 24..30)], output: Slot::Device(1) });
        // A zero weight skips a device.
        let s = assign_slots(4, None, &[1.0, 0.0, 1.0]);
        let p = LayerPlan::from_slots(&s);
        assert_eq!(p.remote, vec![(0, 0..3), (2, 3..4)]);
        // No usable weight: all local.
        assert!(assign_slots(4, None, &[0.0, 0.0]).iter().all(|&x| x == Slot::Local));
    }

    #[test]
    fn output_layer_can_land_apart_from_the_last_layer() {
        // ref §11.3 with L = 2: three slots. -ngl 1 offloads only slot 2, the output: layers stay
        // here, llama.cpp's dev_output is the device.
        let s = assign_slots(2, Some(1), &[1.0]);
        assert_eq!(s, vec![Slot::Local, Slot::Local, Slot::Device(0)]);
        let p = LayerPlan::from_slots(&s);
        assert_eq!((p.local, p.remote.len()), (2, 0));
        assert_eq!(p.head_moved(), Some((Slot::Device(0), Slot::Local)));
        // Three equal devices: s = [1/3, 2/3, 1]; slot 0 (0) → 0, slot 1 (1/3) → 1, slot 2 (2/3)
        // → 2, so device 2 holds only the output layer.
        let s = assign_slots(2, None, &[1.0, 1.0, 1.0]);
        assert_eq!(s, vec![Slot::Device(0), Slot::Device(1), Slot::Device(2)]);
        let p = LayerPlan::from_slots(&s);
        assert_eq!(p.remote, vec![(0, 0..1), (1, 1..2)]);
        assert_eq!(p.head_moved(), Some((Slot::Device(2), Slot::Device(1))));
    }
}
