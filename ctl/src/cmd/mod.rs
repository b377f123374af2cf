//! One module per noun of the command line.

pub mod bench;
pub mod cache;
pub mod docs;
pub mod jobs;
pub mod run;
pub mod run_job;
pub mod status;
pub mod workers;
