//! Domain types shared by every part of eGPU.
//!
//! Contract: everything here is pure (no IO, no unsafe, no global state), so
//! the hook, the simulated GPU, the node agent, the CLI and the placement code
//! can all depend on it without pulling anything else in.
//!
//! - [`quantity`]: human quantities such as `8GiB`, `1.5GB` and `30%`.
//! - [`simspec`]: the `EGPU_SIM_GPUS` grammar shared by the simulated GPU and `egpud`.
//! - [`slice`]: slice specs (per-device memory, compute share/limit, priority) and their validation.
#![forbid(unsafe_code)]

pub mod quantity;
pub mod simspec;
pub mod slice;

pub use quantity::{Bytes, Percent, QuantityError};
pub use simspec::{SimDevice, SimSpec, SimSpecError};
pub use slice::{DeviceShare, Priority, SliceError, SliceSpec};
