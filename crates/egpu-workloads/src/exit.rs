//! `egpu-probe` exit codes.

/// Everything asked for succeeded.
pub const OK: i32 = 0;
/// An unexpected driver error (the JSON line says which call and code).
pub const FAILED: i32 = 1;
/// Command-line usage error (clap's code).
pub const USAGE: i32 = 2;
/// Stopped at an out-of-memory refusal before the requested count/size.
pub const OOM: i32 = 3;
/// The driver could not be initialised (`cuInit`, context): e.g. the hook failed closed.
pub const INIT: i32 = 4;
