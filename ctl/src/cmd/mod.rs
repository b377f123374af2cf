//! One module per noun of the command line.

pub mod bench;
pub mod cache;
pub mod jobs;
pub mod run;
pub mod status;
pub mod workers;
