//! egpu-workloads (placeholder while the crate is built).
#![forbid(unsafe_code)]
