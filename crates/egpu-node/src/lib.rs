//! egpu-node (placeholder while the crate is built).
#![forbid(unsafe_code)]
