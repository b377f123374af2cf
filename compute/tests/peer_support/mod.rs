//! Where the compute tests find llama.cpp's reference peer (llama-cpp-python 0.3.36, built by
//! `tests/peer/build-peer.sh`): `$LLAMAD_PEER_PYTHON`, else the venv the build script leaves in
//! `$LLAMAD_PEER_CACHE` (default `~/.cache/llamad-peer`), preferring the AVX2 build (the parity
//! reference). Without one, a test that needs it is skipped with a printed reason, so a plain
//! `cargo test` on a fresh clone passes; `LLAMAD_REQUIRE_PEER=1` (what `scripts/test.sh` sets)
//! makes a missing peer a failure instead. The lookup is `e2e::server::peer_python`'s; it is written
//! again here because `e2e` depends on `compute`, and a dev-dependency back would build `compute` twice.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The peer's Python, or `None` (with a printed reason) when there is none and it is not required.
pub fn python(test: &str) -> Option<PathBuf> {
    let p = find_python(test)?;
    align_numerics(&p);
    Some(p)
}

/// Fixes this process's numerics profile to the one reproducing the peer's build, when a peer
/// exists; call it before anything uses a kernel (the profile is fixed on first use). Quiet: a
/// missing peer is reported by [`python`].
pub fn align() {
    if let Some(p) = find_python_quiet() {
        align_numerics(&p);
    }
}

fn find_python_quiet() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("LLAMAD_PEER_PYTHON").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let root = std::env::var_os("LLAMAD_PEER_CACHE")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/llamad-peer")))?;
    let mut venvs: Vec<PathBuf> = std::fs::read_dir(root)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("venv-"))
        .map(|e| e.path().join("bin").join("python"))
        .filter(|p| p.exists())
        .collect();
    venvs.sort();
    venvs.into_iter().next()
}

/// Fixes this process's numerics profile to the one reproducing the peer's build
/// (`tests/interop/peer_build.py`), unless `LLAMAD_NUMERICS` chose one. Once per process; callers
/// in other threads wait for the first.
fn align_numerics(python: &Path) {
    static DONE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    DONE.get_or_init(|| align_numerics_now(python));
}

fn align_numerics_now(python: &Path) {
    if std::env::var_os("LLAMAD_NUMERICS").is_some() {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/interop/peer_build.py");
    let Ok(out) = std::process::Command::new(python).arg(script).stderr(std::process::Stdio::null()).output()
    else {
        return;
    };
    let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if compute::numerics::Numerics::parse(&name).is_some() {
        compute::numerics::init(Some(&name));
    }
}

fn find_python(test: &str) -> Option<PathBuf> {
    if let Some(p) = find_python_quiet() {
        return Some(p);
    }
    let why = "no llama.cpp reference peer: set LLAMAD_PEER_PYTHON or run tests/peer/build-peer.sh";
    if std::env::var_os("LLAMAD_REQUIRE_PEER").is_some_and(|v| v == "1") {
        panic!("{test}: {why} (LLAMAD_REQUIRE_PEER=1)");
    }
    eprintln!("skipping {test}: {why}");
    None
}

/// The SmolLM2 test model (`scripts/fetch-model.sh` puts it in the repository's `models/`):
/// `$LLAMAD_MODEL`, else that file; `None` (with a printed reason) when it is absent and not
/// required. `LLAMAD_REQUIRE_PEER=1` (what `scripts/test.sh` sets) makes a missing model a failure.
pub fn model(test: &str) -> Option<PathBuf> {
    let p = match std::env::var_os("LLAMAD_MODEL").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    if p.exists() {
        return Some(p);
    }
    let why = format!(
        "the SmolLM2 test model is missing at {} (run scripts/fetch-model.sh or set LLAMAD_MODEL)",
        p.display()
    );
    if std::env::var_os("LLAMAD_REQUIRE_PEER").is_some_and(|v| v == "1") {
        panic!("{test}: {why} (LLAMAD_REQUIRE_PEER=1)");
    }
    eprintln!("skipping {test}: {why}");
    None
}
