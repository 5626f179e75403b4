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

use egpu_cuda::{CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN, CUDA_ERROR_INVALID_VALUE, CUmemLocation, CUresult};

/// A location as the simulated devices see it: each has one locality domain,
/// so CUDA 13.4's `DEVICE_LOCALITY_DOMAIN` with domain 0 is the whole device
/// (a `DEVICE` location), and any other domain does not exist.
pub fn whole_device(loc: CUmemLocation) -> Result<CUmemLocation, CUresult> {
    if loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN {
        return Ok(loc);
    }
    match loc.id.to_ne_bytes() {
        [dev, 0, ..] => Ok(CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: i32::from(dev) }),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}
