//! egpu-node: the node agent `egpud` as a library.
//!
//! Contract:
//! - [`devices`]: the node's GPUs behind the [`devices::Gpus`] trait; NVML is
//!   loaded at run time from the real driver or the simulated one (one code path).
//! - [`slices`]: the only writer of slice limits. Every create/resize is
//!   admitted by [`capacity`] (no device memory or compute-share overcommit),
//!   persisted in the [`store`] (redb), then published into the slice table
//!   (`egpu-abi`). A restarted agent adopts every stored slice.
//! - [`agent`]: startup (run-dir lock, discovery, store, adoption), periodic
//!   tasks (sweeper, heartbeat, orphan collection; the compute arbiter plugs
//!   in as another [`agent::NodeTask`]), and the gRPC server on a unix socket.
//! - [`service`]: the gRPC `egpu.v1.Node` service and its error mapping;
//!   [`client`]: connecting to it.
#![forbid(unsafe_code)]

pub mod agent;
pub mod arbiter_loop;
pub mod audit;
pub mod burst;
pub mod capacity;
pub mod cdi;
pub mod client;
pub mod config;
mod crash;
pub mod devices;
pub mod launch;
pub mod lock;
pub mod logging;
pub mod metrics;
pub mod owner;
pub mod service;
pub mod simlib;
pub mod slices;
pub mod store;
pub mod wire;

/// Generated gRPC types of `proto/egpu/v1/node.proto`.
#[allow(clippy::all)]
pub mod proto {
    tonic::include_proto!("egpu.v1");
}

pub use config::NodeConfig;
