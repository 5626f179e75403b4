//! Workloads for testing eGPU, chiefly `egpu-probe`.
//!
//! Contract:
//! - [`api::Api`] is the table of CUDA driver API and NVML functions the
//!   probe calls, filled one of three ways ([`via::Via`]): bound at link time
//!   (`direct`), `dlopen("libcuda.so.1")` + `dlsym` (`dlopen`), or
//!   `cuGetProcAddress_v2` (`procaddr`, what the CUDA runtime does). The
//!   interposer must hold its limits whichever way is used.
//! - Every probe event is one JSON object per line on stdout ([`out`]);
//!   exit codes are in [`exit`].

pub mod api;
pub mod exit;
pub mod out;
pub mod via;

/// Parses a human size such as `64MiB` or `1.5GiB`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    s.parse::<egpu_core::Bytes>().map(|b| b.0).map_err(|e| format!("{s}: {e}"))
}

/// CLOCK_MONOTONIC in ns (comparable across processes on the machine).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
