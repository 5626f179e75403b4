//! A discrete-event model of one GPU shared by slices, with the real gate
//! ([`crate::gate`]) and the real arbiter ([`crate::Arbiter`]) in the loop.
//!
//! The device serves kernels one at a time in submission order across all
//! processes, non-preemptively — the simulated GPU's model. Time is virtual
//! (ns), so runs are deterministic and take milliseconds of CPU. Each process
//! runs one [`Pattern`] on one stream; the hook's charge of a finished kernel
//! is [`crate::measure::StreamClock::attribute`], and the arbiter's device
//! truth (when `reconcile` is on) is the exact per-slice service time, as
//! the simulated GPU's shared state or NVML accounting would report it.
//!
//! This is the algorithm on a model, not the product end to end: launch
//! costs, event polling delays and driver behaviour are idealised.

mod engine;
pub mod scenarios;

pub use engine::{Model, ModelConfig, Pattern, SliceSpec};
