//! One module per noun of the command line.

pub mod run;
