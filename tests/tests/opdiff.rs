//! Differential op tests (issue 3): every case of `e2e::opdiff::cases` runs on llama.cpp's RPC
//! server (the reference peer, `$LLAMAD_PEER_PYTHON`) and on llamad (`$LLAMAD_BIN`), and the
//! results must agree within the case's bound. Prints a per-op summary.
//!
//! Without `LLAMAD_PEER_PYTHON` the test is skipped, unless `LLAMAD_REQUIRE_PEER=1` (scripts/test.sh)
//! makes that a failure. `LLAMAD_OPDIFF_FILTER=substring[|substring...]` runs only the matching cases,
//! `LLAMAD_OPDIFF_VERBOSE=1` prints every case's figures, `LLAMAD_OPDIFF_DUMP=dir` writes every
//! case's inputs and results there.
//!
//! `LLAMAD_OPDIFF_PROFILE=avx2|avx512|portable` chooses llamad's numerics profile (`--numerics`;
//! default: the one reproducing the peer's build, see `tests/interop/peer_build.py`). Under `avx2`
//! llamad runs its AVX2 kernel set (`LLAMAD_KERNELS=avx2`), under `avx512` its best set; both must
//! meet the cases' bit-exactness requirements when the CPU runs the profile. Under `portable` (own
//! summation orders) exact cases are held to the summation-order bound only.
//!
//! Other references and servers under test (scripts/test-arm64-parity.sh): `LLAMAD_OPDIFF_REF_CMD`
//! is a shell command line with `{port}` that starts the reference instead of the peer's Python
//! (llama.cpp's aarch64 `ggml-rpc-server` under qemu-user; no profile is passed then unless
//! `LLAMAD_OPDIFF_PROFILE` names one); `LLAMAD_BIN` may be a wrapper that runs an aarch64 llamad
//! under qemu-user. `LLAMAD_OPDIFF_KERNELS=<set>` forces llamad's kernel set and
//! `LLAMAD_OPDIFF_EXACT=1|0` says whether the cases that require bit-identical results keep that
//! requirement (defaults: as the profile says).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use e2e::opdiff::cases::{self, Case, ORDER};
use e2e::opdiff::compare::{compare, Bound};
use e2e::opdiff::data;
use e2e::opdiff::run::run_graph;
use e2e::server::{llamad_bin, Server};

/// How the reference server starts.
enum Reference {
    /// `tests/interop/ref_server.py` under the peer's Python.
    Python(PathBuf),
    /// A command line with `{port}` (`LLAMAD_OPDIFF_REF_CMD`).
    Command(String),
}

impl Reference {
    fn start(&self) -> e2e::Result<Server> {
        match self {
            Reference::Python(p) => Server::reference(p),
            Reference::Command(c) => Server::reference_cmd(c),
        }
    }
}

/// The reference, or `None` when the test is to be skipped.
fn reference() -> Option<Reference> {
    if let Some(c) = std::env::var("LLAMAD_OPDIFF_REF_CMD").ok().filter(|c| !c.is_empty()) {
        return Some(Reference::Command(c));
    }
    match std::env::var_os("LLAMAD_PEER_PYTHON").filter(|p| !p.is_empty()) {
        Some(p) => Some(Reference::Python(PathBuf::from(p))),
        None if std::env::var("LLAMAD_REQUIRE_PEER").as_deref() == Ok("1") => panic!(
            "LLAMAD_REQUIRE_PEER=1 but LLAMAD_PEER_PYTHON is not set: point it at the reference peer's \
             python (tests/peer/build-peer.sh prints it)"
        ),
        None => None,
    }
}

/// Whether this CPU runs llamad's x86 profile `profile` (whose kernels reproduce ggml's build of
/// that name); elsewhere exact cases fall back to the summation-order bound.
fn exact_profile(profile: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
        match profile {
            "avx2" => avx2,
            "avx512" => {
                avx2 && std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
                    && std::is_x86_feature_detected!("avx512vl")
                    && std::is_x86_feature_detected!("avx512dq")
            }
            _ => false,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = profile;
        false
    }
}

/// Writes a case's inputs and both results to `dir` (`LLAMAD_OPDIFF_DUMP`, for bisecting a
/// difference): `<case>.in<k>.bin`, `<case>.out<k>.reference.bin`, `<case>.out<k>.llamad.bin`.
fn dump(dir: &std::path::Path, name: &str, g: &e2e::opdiff::graph::Graph, want: &[Vec<u8>], got: &[Vec<u8>]) {
    let stem = name.replace('/', "__");
    let _ = std::fs::create_dir_all(dir);
    let inputs = g.tensors.iter().filter_map(|t| t.data.as_ref());
    for (k, d) in inputs.enumerate() {
        let _ = std::fs::write(dir.join(format!("{stem}.in{k}.bin")), d);
    }
    for (k, (w, h)) in want.iter().zip(got).enumerate() {
        let _ = std::fs::write(dir.join(format!("{stem}.out{k}.reference.bin")), w);
        let _ = std::fs::write(dir.join(format!("{stem}.out{k}.llamad.bin")), h);
    }
}

/// Ops whose AVX-512 build llamad's `avx512` profile does not reproduce yet (ggml's 16-lane WKV
/// loops and GCC's AVX-512 vectorisation of the SSM/GLA sums): under that profile their exact cases
/// are held to the summation-order bound. None of them is in a llama-architecture graph.
const AVX512_NOT_YET: [&str; 4] = ["SSM_CONV", "SSM_SCAN", "GATED_LINEAR_ATTN", "RWKV_WKV7"];

#[derive(Default)]
struct OpStats {
    cases: usize,
    identical: usize,
    exact_required: usize,
    max_nmse: f64,
    max_rel: f64,
    failed: usize,
}

#[test]
fn ops_match_llama_cpp() {
    let Some(reference_kind) = reference() else {
        eprintln!(
            "opdiff: skipped (LLAMAD_PEER_PYTHON is not set; LLAMAD_REQUIRE_PEER=1 makes this a failure)"
        );
        return;
    };
    let profile =
        std::env::var("LLAMAD_OPDIFF_PROFILE").ok().filter(|p| !p.is_empty()).or_else(
            || match &reference_kind {
                Reference::Python(python) => {
                    Some(e2e::server::peer_numerics(python).unwrap_or("avx2").to_string())
                }
                Reference::Command(_) => None,
            },
        );
    let exact_kernels = match std::env::var("LLAMAD_OPDIFF_EXACT").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        // An external reference (LLAMAD_OPDIFF_REF_CMD) names no profile: exact where the AVX2 one runs.
        _ => exact_profile(profile.as_deref().unwrap_or("avx2")),
    };
    let kernels = std::env::var("LLAMAD_OPDIFF_KERNELS")
        .ok()
        .filter(|k| !k.is_empty())
        .or_else(|| (exact_kernels && profile.as_deref() == Some("avx2")).then(|| "avx2".to_string()));
    let mut reference = reference_kind.start().expect("start the reference server");
    let numerics_flag: Vec<&str> = profile.as_deref().map(|p| vec!["--numerics", p]).unwrap_or_default();
    let llamad =
        Server::llamad_with(&llamad_bin(), kernels.as_deref(), &numerics_flag).expect("start llamad");
    let profile = profile.unwrap_or_else(|| "default".to_string());
    let filter = std::env::var("LLAMAD_OPDIFF_FILTER").unwrap_or_default();

    let all = cases::all();
    let mut names = std::collections::HashSet::new();
    for c in &all {
        assert!(names.insert(c.name.clone()), "duplicate case name {}", c.name);
    }
    // `a|b|c`: the cases whose name contains any of the substrings.
    let selected: Vec<&Case> = all.iter().filter(|c| filter.split('|').any(|f| c.name.contains(f))).collect();
    assert!(!selected.is_empty(), "no case matches LLAMAD_OPDIFF_FILTER={filter}");

    let started = Instant::now();
    let mut stats: BTreeMap<&str, OpStats> = BTreeMap::new();
    let mut failures = Vec::new();
    for case in &selected {
        let s = stats.entry(case.op).or_default();
        s.cases += 1;
        let mut bound = case.bound;
        let not_yet = profile == "avx512" && AVX512_NOT_YET.contains(&case.op);
        if bound.exact && (!exact_kernels || not_yet) {
            bound = Bound { exact: false, ..ORDER };
        }
        s.exact_required += usize::from(bound.exact);
        let g = match (case.build)(&mut data::rng(data::seed_of(&case.name))) {
            Ok(g) => g,
            Err(e) => {
                failures.push(format!("{}: build: {e}", case.name));
                s.failed += 1;
                continue;
            }
        };
        let want = match run_graph(reference.addr, &g) {
            Ok(r) => r,
            Err(e) => {
                // ggml aborts on graphs it does not support: report why and start afresh (the
                // process may still be writing its backtrace, so it is replaced either way).
                std::thread::sleep(std::time::Duration::from_millis(300));
                let state = if reference.alive() { "still running" } else { "died" };
                failures.push(format!(
                    "{}: reference: {e} (server {state}: {})",
                    case.name,
                    reference.log_tail()
                ));
                drop(reference);
                reference = reference_kind.start().expect("restart the reference server");
                s.failed += 1;
                continue;
            }
        };
        let got = match run_graph(llamad.addr, &g) {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{}: llamad: {e}", case.name));
                s.failed += 1;
                continue;
            }
        };
        if let Some(dir) = std::env::var_os("LLAMAD_OPDIFF_DUMP") {
            dump(std::path::Path::new(&dir), &case.name, &g, &want, &got);
        }
        let mut ok = true;
        let mut identical = true;
        for ((&o, w), h) in g.outputs.iter().zip(&want).zip(&got) {
            match compare(g.layout(o).dtype, w, h, &bound) {
                Ok(d) => {
                    identical &= d.identical;
                    s.max_nmse = s.max_nmse.max(d.nmse);
                    s.max_rel = s.max_rel.max(d.max_rel);
                    if std::env::var("LLAMAD_OPDIFF_VERBOSE").as_deref() == Ok("1") {
                        eprintln!(
                            "{:<60} identical {} nmse {:.3e} max_rel {:.3e}",
                            case.name, d.identical, d.nmse, d.max_rel
                        );
                    }
                }
                Err(e) => {
                    failures.push(format!("{}: {e}", case.name));
                    ok = false;
                }
            }
        }
        s.identical += usize::from(ok && identical);
        s.failed += usize::from(!ok);
    }

    eprintln!(
        "\nopdiff: {} cases in {:.1} s (llamad --numerics {profile}, kernels {}, exact cases {})",
        selected.len(),
        started.elapsed().as_secs_f64(),
        kernels.as_deref().unwrap_or("default"),
        if exact_kernels { "required" } else { "held to the order bound" }
    );
    eprintln!(
        "{:<16} {:>6} {:>10} {:>10} {:>11} {:>11} {:>7}",
        "op", "cases", "identical", "exact-req", "max nmse", "max rel", "failed"
    );
    for (op, s) in &stats {
        eprintln!(
            "{op:<16} {:>6} {:>10} {:>10} {:>11.3e} {:>11.3e} {:>7}",
            s.cases, s.identical, s.exact_required, s.max_nmse, s.max_rel, s.failed
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        selected.len(),
        failures.join("\n")
    );
}
