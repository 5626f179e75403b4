//! Crash points, for tests: with `EGPU_CRASH_AT=<name>` in its environment, a
//! debug build of `egpud` kills itself with `SIGKILL` when it reaches the
//! point of that name, leaving its files exactly as a `kill -9` there would
//! (`tests/crash_points.rs` restarts it and checks what it adopts). The
//! points sit between the durable steps of a create, a resize and a delete.
//! Release builds have none: the check compiles to nothing.

/// Dies here if `EGPU_CRASH_AT` names this point (debug builds only).
#[inline]
pub(crate) fn point(name: &str) {
    #[cfg(debug_assertions)]
    if std::env::var_os("EGPU_CRASH_AT").is_some_and(|v| v == name) {
        tracing::error!(point = name, "EGPU_CRASH_AT: killing egpud here");
        let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        unreachable!("SIGKILL sent to itself");
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}
