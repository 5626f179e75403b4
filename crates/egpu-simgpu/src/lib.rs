//! The simulated GPU: one cdylib that is both `libcuda.so.1` (the CUDA driver
//! API) and `libnvidia-ml.so.1` (NVML), for machines with no NVIDIA GPU.
//!
//! Contract:
//! - Devices come from `EGPU_SIM_GPUS` (default `1x16GiB`), parsed by
//!   [`egpu_core::SimSpec`]. Their state (memory in use per process, kernel
//!   queue, utilisation) lives in one file, `EGPU_SIM_STATE` (default
//!   `/dev/shm/egpu-simgpu.<uid>.state`), shared by every process on the
//!   machine through atomics only: see [`state`].
//! - Device memory is real: every allocation is backed by a sparse memfd
//!   mapped into the process, so copies move bytes and IPC / VMM sharing
//!   works across processes. Device pointers are mapping addresses.
//! - Kernel time is modelled: threads x `EGPU_SIM_NS_PER_THREAD` ns, one
//!   kernel at a time per device across all processes.
//! - Every exported function catches panics; unimplemented entry points
//!   return `CUDA_ERROR_NOT_SUPPORTED` / `NVML_ERROR_NOT_SUPPORTED` and log
//!   once. Initialisation is lazy; no threads are started; a `fork`ed child
//!   re-attaches with its own pid.
//!
//! See `docs/simgpu.md` for the model, the state layout and what is missing.

pub mod config;
mod cptr;
mod ffi;
pub mod nvml;
pub mod ops;
pub mod procaddr;
pub mod rt;
pub mod state;
mod sys;
pub mod visible;

use std::io;
use std::path::Path;

/// The library names [`link_dir`] creates.
pub const LINK_NAMES: [&str; 4] = ["libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1", "libnvidia-ml.so"];

/// Makes `dir` (created if missing) a library directory for the simulated
/// GPU: symlinks `libcuda.so.1`, `libcuda.so`, `libnvidia-ml.so.1` and
/// `libnvidia-ml.so` to `lib_path` (usually `target/<profile>/libegpu_simgpu.so`).
/// Existing links are replaced. Put `dir` first on `LD_LIBRARY_PATH`.
///
/// All names resolve to one file, so a process that `dlopen`s both the
/// driver and NVML gets one library instance (the loader matches by inode).
pub fn link_dir(lib_path: &Path, dir: &Path) -> io::Result<()> {
    let target = std::fs::canonicalize(lib_path)?;
    std::fs::create_dir_all(dir)?;
    for name in LINK_NAMES {
        let link = dir.join(name);
        match std::fs::symlink_metadata(&link) {
            Ok(_) => std::fs::remove_file(&link)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::os::unix::fs::symlink(&target, &link)?;
    }
    Ok(())
}
