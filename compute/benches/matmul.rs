//! MUL_MAT throughput through the graph executor: matrix × vector and matrix × matrix (N = 512) at
//! SmolLM2 and 7B shapes, for the common weight types, at 1 and 2 threads.
//!
//! Run with `cargo bench -p compute --bench matmul` (add `-- --quick` for the SmolLM2 shapes only,
//! `-- --threads 1,2,4` to choose thread counts). Weights are quantized from random data with the
//! type's `from_f32`. Reported: GB/s of weights streamed (weight bytes / time per MUL_MAT) and
//! GFLOP/s (2·K·M·N / time).

use std::time::{Duration, Instant};

use compute::graph::{Executor, Graph, Node, Tensor, MAX_SRC};
use compute::op::flags;
use compute::quant::{active_isa, kernels};
use compute::{GgmlOp, GgmlType, Layout};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

struct Buf {
    _mem: Vec<u64>,
    ptr: *mut u8,
    layout: Layout,
}

impl Buf {
    fn new(dtype: GgmlType, ne: [u64; 4]) -> Buf {
        let layout = Layout::contiguous(dtype, ne).expect("layout");
        let bytes = layout.nbytes().expect("size") as usize;
        let mut mem = vec![0u64; bytes.div_ceil(8)];
        let ptr = mem.as_mut_ptr() as *mut u8;
        Buf { _mem: mem, ptr, layout }
    }

    fn tensor(&self) -> Tensor {
        Tensor { layout: self.layout, data: self.ptr }
    }

    fn bytes(&self) -> usize {
        self.layout.nbytes().unwrap_or(0) as usize
    }

    fn fill_from(&self, vals: &[f32]) {
        let k = self.layout.ne[0] as usize;
        let row = self.layout.nb[1] as usize;
        let from = kernels(self.layout.dtype).from_f32.expect("quantizer");
        for (r, chunk) in vals.chunks(k).enumerate() {
            // SAFETY: row `r` lies inside the owned buffer.
            let out = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r * row), row) };
            from(chunk, out);
        }
    }
}

fn mul_mat_node(a: &Buf, b: &Buf, d: &Buf) -> Node {
    let mut src: [Option<Tensor>; MAX_SRC] = [None; MAX_SRC];
    src[0] = Some(a.tensor());
    src[1] = Some(b.tensor());
    Node { op: GgmlOp::MulMat, op_params: [0; 16], flags: flags::COMPUTE, dst: d.tensor(), src }
}

/// Seconds per run: one warm-up, then runs until `min_time` has passed (at least one).
fn time(ex: &mut Executor, g: &Graph, min_time: Duration, warmup: bool) -> f64 {
    if warmup {
        ex.compute(g).expect("compute");
    }
    let start = Instant::now();
    let mut runs = 0u32;
    while runs == 0 || start.elapsed() < min_time {
        ex.compute(g).expect("compute");
        runs += 1;
    }
    start.elapsed().as_secs_f64() / runs as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let threads: Vec<usize> = args
        .iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.split(',').filter_map(|t| t.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2]);
    let mut shapes: Vec<(&str, u64, u64)> =
        vec![("smollm2 ffn_up", 576, 1536), ("smollm2 ffn_down", 1536, 576), ("smollm2 output", 576, 49152)];
    if !quick {
        shapes.extend([("7b attn", 4096, 4096), ("7b ffn_up", 4096, 11008), ("7b ffn_down", 11008, 4096)]);
    }
    let types =
        [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::F16];
    let n_mat = 512u64;
    println!("kernels: {}", active_isa());
    println!(
        "{:<18} {:>6} {:>6} {:<5} {:>3} {:>4} {:>10} {:>9} {:>9}",
        "shape", "K", "M", "type", "thr", "N", "ms/op", "GB/s", "GFLOP/s"
    );
    let mut rng = StdRng::seed_from_u64(1);
    for (name, k, m) in shapes {
        let vals: Vec<f32> = (0..k * m).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let acts: Vec<f32> = (0..k * n_mat).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        for t in types {
            if k % t.blck_size() as u64 != 0 {
                println!(
                    "{name:<18} {k:>6} {m:>6} {:<5} skipped: K is not a multiple of {}",
                    t.to_string(),
                    t.blck_size()
                );
                continue;
            }
            let w = Buf::new(t, [k, m, 1, 1]);
            w.fill_from(&vals);
            for n in [1u64, n_mat] {
                let b = Buf::new(GgmlType::F32, [k, n, 1, 1]);
                b.fill_from(&acts[..(k * n) as usize]);
                let d = Buf::new(GgmlType::F32, [m, n, 1, 1]);
                // SAFETY: the buffers outlive the graph and nothing else touches them.
                let g = unsafe { Graph::new(vec![mul_mat_node(&w, &b, &d)]).expect("valid graph") };
                for &nth in &threads {
                    let mut ex = Executor::new(nth);
                    let (min_time, warm) = if n == 1 {
                        (Duration::from_millis(300), true)
                    } else {
                        (Duration::from_millis(1), false)
                    };
                    let s = time(&mut ex, &g, min_time, warm);
                    let gbs = w.bytes() as f64 / s / 1e9;
                    let gflops = 2.0 * (k * m * n) as f64 / s / 1e9;
                    println!(
                        "{name:<18} {k:>6} {m:>6} {:<5} {nth:>3} {n:>4} {:>10.3} {gbs:>9.2} {gflops:>9.2}",
                        t.to_string(),
                        s * 1e3
                    );
                }
            }
        }
    }
}
