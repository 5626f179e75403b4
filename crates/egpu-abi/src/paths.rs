//! Where slice tables live, shared by `egpud`, the CLI and the hook.
//!
//! `<run-dir>/slices/<name>/limits` and `<run-dir>/slices/<name>/usage`.
//! A workload finds its slice directory at [`CONTAINER_SLICE_DIR`] when a
//! container's CDI spec mounted its files there (limits read-only, usage
//! read-write; `docs/containers.md`), else in `EGPU_SLICE_DIR`.

use std::path::{Path, PathBuf};

/// Environment variable naming the slice directory of a workload.
pub const SLICE_DIR_ENV: &str = "EGPU_SLICE_DIR";
/// Where a container sees its slice's files (bind mounts from its CDI spec).
pub const CONTAINER_SLICE_DIR: &str = "/run/egpu/slice";
/// Where a container sees the interposer (its CDI spec mounts it there and
/// names it in the container's `/etc/ld.so.preload`).
pub const CONTAINER_HOOK: &str = "/run/egpu/libegpu.so";

pub fn slices_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("slices")
}

pub fn slice_dir(run_dir: &Path, name: &str) -> PathBuf {
    slices_dir(run_dir).join(name)
}

pub fn limits_path(slice_dir: &Path) -> PathBuf {
    slice_dir.join("limits")
}

pub fn usage_path(slice_dir: &Path) -> PathBuf {
    slice_dir.join("usage")
}
