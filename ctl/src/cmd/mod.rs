//! One module per noun of the command line.

pub mod bench;
pub mod cache;
pub mod docs;
pub mod jobs;
pub mod models;
pub mod run;
pub mod run_job;
pub mod status;
pub mod synth;
pub mod workers;

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use compute::gguf::Gguf;
use compute::model::Model;
use compute::quant::kernels;

/// The model of an opened GGUF file (`run`, `bench`), refused with the file's name when its
/// architecture is unsupported or a tensor has a type this build cannot compute.
/// Opens the model file: a private copy on huge pages for in-process runs (`resident`), else
/// the file's mapping (the master only streams the weights to workers).
pub(crate) fn open_gguf(path: &Path, resident: bool) -> compute::Result<Gguf> {
    if resident {
        return Gguf::load_resident(path);
    }
    // SAFETY: the model file is mapped read-only; llamactl never writes it, and the user is told
    // (README) not to replace a model file while a run uses it.
    unsafe { Gguf::open(path) }
}

pub(crate) fn open_model(path: &Path, gguf: &Arc<Gguf>) -> Result<Model> {
    let model = Model::new(gguf.clone()).with_context(|| format!("{}: unsupported model", path.display()))?;
    if let Some(t) = gguf.tensors().iter().find(|t| kernels(t.dtype()).to_f32.is_none()) {
        bail!(
            "{}: tensor {} has type {}, which this build cannot compute",
            path.display(),
            t.name,
            t.dtype()
        );
    }
    Ok(model)
}
