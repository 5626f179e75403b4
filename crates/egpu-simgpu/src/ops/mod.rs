//! The safe implementations behind the exported driver-API symbols, one
//! module per family. Each function takes the C arguments (raw pointers are
//! only touched through [`crate::cptr`]) and returns `Result<(), CUresult>`.

pub mod arena;
pub mod array;
pub mod capture;
pub mod context;
pub mod copy;
pub mod device;
pub mod graph;
pub mod ipc;
pub mod launch;
pub mod memory;
pub mod module;
pub mod pool;
pub mod stream;
pub mod vmm;
