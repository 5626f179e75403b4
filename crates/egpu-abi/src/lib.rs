//! The slice table: the shared-memory contract between `egpud` and `libegpu.so`.
//!
//! Contract (see `docs/slice-table.md` for the byte layout and the reasoning):
//!
//! - Each slice has a directory `<run-dir>/slices/<name>/` with two files.
//!   - `limits` ([`LimitsRegion`]): written by `egpud` only, mapped read-only
//!     by workloads. Per-device memory limits and compute share/limit, under a
//!     seqlock so readers never see a torn value; the arbiter's per-period GPU
//!     time budgets as independent atomics beside it.
//!   - `usage` ([`UsageRegion`]): one [`ProcRecord`] per attached process,
//!     updated with atomics. A process owns its record by holding a POSIX
//!     record lock (`fcntl(F_SETLK)`) on the record's first byte; the kernel
//!     drops that lock when the process dies, however it dies, so liveness is
//!     exact, survives pid reuse and works across pid namespaces.
//! - Memory is charged under a per-device *charge lock* that holds only a
//!   slot number. Inside it the charger sums the records and adds to its own
//!   record with one atomic store, so a process killed at any instruction
//!   leaves the accounting consistent, and a waiter that finds the owner dead
//!   takes the lock over. The slice's usage is always the sum of the records.
//! - Both regions start with a magic number, the ABI version and their size;
//!   a mismatch is an error ([`AbiError`]) that the hook turns into a refusal
//!   to use the GPU, never into running unlimited.
//!
//! All the unsafe code of the slice table lives in [`map`] and is documented there.

pub mod limits;
pub mod map;
pub mod paths;
pub mod usage;

pub use limits::{DeviceLimitsSnapshot, LimitsReader, LimitsRegion, LimitsSnapshot, LimitsWriter, PublishedDevice, PublishedSpec, SliceState};
pub use usage::{ChargeError, ProcRecord, ProcSlot, ProcView, Reclaimed, Restored, UsageFile, UsageRegion};

/// Version of the layout in this crate. Bump on any change to a `#[repr(C)]` region.
pub const ABI_VERSION: u32 = 1;
/// Most devices one slice can span.
pub const MAX_DEVICES: usize = 16;
/// Most processes attached to one slice at once.
pub const MAX_PROCS: usize = 128;
/// Longest device UUID string stored (NVML's v2 buffer is 96; real UUIDs are 40 bytes).
pub const UUID_LEN: usize = 64;
/// Longest slice name stored.
pub const NAME_LEN: usize = 64;

pub(crate) const LIMITS_MAGIC: u64 = u64::from_le_bytes(*b"EGPULIM\0");
pub(crate) const USAGE_MAGIC: u64 = u64::from_le_bytes(*b"EGPUUSE\0");

/// Why a slice-table file could not be used.
#[derive(Debug)]
pub enum AbiError {
    /// The file does not exist.
    Missing(std::path::PathBuf),
    /// Any other IO failure, with the path.
    Io(std::path::PathBuf, std::io::Error),
    /// The file is not a slice table (wrong magic) or is truncated.
    Corrupt(std::path::PathBuf, &'static str),
    /// The file was written by another ABI version.
    Version { path: std::path::PathBuf, found: u32, expected: u32 },
    /// Every process record of the slice is in use.
    Full(std::path::PathBuf),
    /// A request named a device the slice does not have, or too many devices.
    BadDevice(usize),
}

impl std::fmt::Display for AbiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AbiError::Missing(p) => write!(f, "slice table {} does not exist (is the slice still there? `egpu ls` lists slices)", p.display()),
            AbiError::Io(p, e) => write!(f, "slice table {}: {e}", p.display()),
            AbiError::Corrupt(p, why) => write!(f, "slice table {} is corrupt ({why}); restart egpud to rewrite it", p.display()),
            AbiError::Version { path, found, expected } => write!(
                f,
                "slice table {} has ABI version {found}, this build speaks version {expected}; run workloads with the libegpu.so that matches the running egpud",
                path.display()
            ),
            AbiError::Full(p) => write!(f, "slice table {} has no free process record ({MAX_PROCS} processes attached)", p.display()),
            AbiError::BadDevice(i) => write!(f, "device index {i} is not part of the slice (at most {MAX_DEVICES})"),
        }
    }
}

impl std::error::Error for AbiError {}


/// Monotonic clock in nanoseconds (CLOCK_MONOTONIC is system-wide, so values
/// compare across processes). A vDSO call: no system call on Linux.
pub fn monotonic_ns() -> u64 {
    map::monotonic_ns()
}
