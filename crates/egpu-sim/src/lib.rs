//! eGPU trace-driven simulation: openb trace loaders, the FGD evaluation
//! methodology, reports, the elastic-sharing evaluation, and the
//! `egpu simulate` command.
//!
//! Contract:
//! - Placement decisions come from `egpu-place`, the same code the live
//!   scheduler runs; this crate only feeds it pods and records results.
//! - Runs are reproducible: the same inputs, policy and seed give the same
//!   result on every machine.
//! - Loaders never panic on any input: bad rows give line-numbered errors,
//!   or are counted as skipped in lenient mode.
//! - `anyhow` is used only in [`cli`]; library modules return typed errors.
#![forbid(unsafe_code)]

pub mod cli;
pub mod data;
pub mod elastic;
pub mod gpuspec;
pub mod report;
pub mod sim;
pub mod sweep;
pub mod text;
pub mod trace;
pub mod workload;
