//! One module per noun of the command line.

pub mod bench;
pub mod cache;
pub mod docs;
pub mod jobs;
pub mod run;
pub mod run_job;
pub mod status;
pub mod workers;

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use compute::gguf::Gguf;
use compute::model::Model;
use compute::quant::kernels;

/// The model of an opened GGUF file (`run`, `bench`), refused with the file's name when its
/// architecture is unsupported or a tensor has a type this build cannot compute.
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
