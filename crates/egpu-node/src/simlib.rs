//! The simulated driver directory: `<run-dir>/simlib` holds the names the
//! CUDA runtime and NVML users load (`libcuda.so.1`, `libnvidia-ml.so.1`, ...),
//! all symlinks to `libegpu_simgpu.so`.

use std::path::{Path, PathBuf};

pub const SIMLIB_DIR: &str = "simlib";
pub const SIM_STATE_FILE: &str = "simgpu.state";
pub const LINK_NAMES: [&str; 4] = ["libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1", "libnvidia-ml.so"];

#[derive(Debug, thiserror::Error)]
pub enum SimlibError {
    #[error("simulated driver {0} not found: build it with `cargo build -p egpu-simgpu` or pass --sim-lib")]
    Missing(PathBuf),
    #[error("cannot create simulated driver link {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// (Re)creates `<run_dir>/simlib` with links to `sim_lib`; returns the directory.
pub fn link_dir(run_dir: &Path, sim_lib: &Path) -> Result<PathBuf, SimlibError> {
    let target = std::fs::canonicalize(sim_lib).map_err(|_| SimlibError::Missing(sim_lib.into()))?;
    let dir = run_dir.join(SIMLIB_DIR);
    std::fs::create_dir_all(&dir).map_err(|source| SimlibError::Io { path: dir.clone(), source })?;
    for name in LINK_NAMES {
        let link = dir.join(name);
        let tmp = dir.join(format!(".{name}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp).map_err(|source| SimlibError::Io { path: tmp.clone(), source })?;
        std::fs::rename(&tmp, &link).map_err(|source| SimlibError::Io { path: link.clone(), source })?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_point_at_the_library() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("libegpu_simgpu.so");
        std::fs::write(&lib, b"x").unwrap();
        let d = link_dir(dir.path(), &lib).unwrap();
        link_dir(dir.path(), &lib).unwrap(); // idempotent
        for n in LINK_NAMES {
            assert_eq!(std::fs::read_link(d.join(n)).unwrap(), std::fs::canonicalize(&lib).unwrap());
        }
        assert!(matches!(link_dir(dir.path(), &dir.path().join("nope.so")), Err(SimlibError::Missing(_))));
    }
}
