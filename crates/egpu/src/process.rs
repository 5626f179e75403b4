//! Running a workload: apply the environment egpud computed, start the
//! program, forward SIGINT/SIGTERM/SIGHUP/SIGQUIT to it, and return its
//! status the way a shell does (128 + signal number when killed).

use crate::exit::{CANNOT_START, Failure};
use egpu_node::launch::{EnvEntry, combine};
use std::os::unix::process::ExitStatusExt;
use tokio::signal::unix::{SignalKind, signal};

/// Builds the command for `cmd` with `env` applied over this process's environment.
pub fn command(cmd: &[String], env: &[EnvEntry]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(&cmd[0]);
    c.args(&cmd[1..]);
    for e in env {
        let existing = std::env::var(&e.name).ok();
        c.env(&e.name, combine(e, existing.as_deref()));
    }
    c
}

/// Exit code of a finished process, shell style.
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

/// Sends `sig` to `pid` (a child of ours that has not been reaped).
pub fn send_signal(pid: u32, sig: i32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; the
    // pid is our own child, which has not been reaped yet (we are still
    // waiting for it), so it cannot have been reused.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Starts `cmd` with `env`, forwards termination signals, waits, returns its exit code.
pub async fn run(cmd: &[String], env: &[EnvEntry]) -> anyhow::Result<i32> {
    // Handlers first: a signal that arrives while the child starts is forwarded, not fatal.
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut quit = signal(SignalKind::quit())?;
    let mut child = command(cmd, env)
        .spawn()
        .map_err(|e| Failure::new(CANNOT_START, format!("cannot start {}: {e}", cmd[0])))?;
    let pid = child.id().unwrap_or(0);
    loop {
        tokio::select! {
            st = child.wait() => return Ok(exit_code(st?)),
            _ = int.recv() => send_signal(pid, libc::SIGINT),
            _ = term.recv() => send_signal(pid, libc::SIGTERM),
            _ = hup.recv() => send_signal(pid, libc::SIGHUP),
            _ = quit.recv() => send_signal(pid, libc::SIGQUIT),
        }
    }
}
