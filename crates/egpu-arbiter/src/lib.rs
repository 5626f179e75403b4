//! The eGPU compute arbiter.
//!
//! Contract (the design and the measurements are in `docs/compute-arbiter.md`):
//!
//! - [`alloc`]: the per-period algorithm. Shares, limits, priorities and
//!   measured demand in; GPU-time budgets out. Weighted fair by share,
//!   work-conserving by water-filling, best-effort served last, a busy slice
//!   never below its guarantee. Pure; no allocation.
//! - [`gate`]: the hook side. A per-process, per-device [`gate::ProcGate`]
//!   decides each launch (`Go`, wait for the next period, or wait for one of
//!   its own launches to finish) against the slice's cumulative allowance in
//!   the limits region. No allocation and no system call; the fast path is a
//!   handful of relaxed atomic loads.
//! - [`measure`]: what a finished launch costs, from event timestamps on its
//!   stream, and how the arbiter reconciles those with the device's own
//!   per-process accounting.
//! - [`arbiter`]: the `egpud` side. [`Arbiter::tick`] turns per-slice inputs
//!   into budgets and allowances; [`tables`] applies it to the slice table.
//! - [`model`]: a discrete-event model of a FIFO GPU with the gate and the
//!   arbiter in the loop, in virtual time, used by the tests and by
//!   `cargo run --release -p egpu-arbiter --example model-report`.
#![forbid(unsafe_code)]

pub mod alloc;
pub mod arbiter;
pub mod gate;
pub mod measure;
pub mod model;
pub mod tables;

pub use alloc::{Claim, allocate};
pub use arbiter::{Arbiter, ArbiterConfig, Budget, SliceInput, SliceKey};
pub use gate::{Decision, GateView, ProcGate};
pub use tables::{TableRef, TablesError};
