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

/// A started program whose termination signals are being caught for forwarding.
pub struct Running {
    child: tokio::process::Child,
    pid: u32,
    signals: [tokio::signal::unix::Signal; 4],
}

/// Starts `cmd` with `env`. Termination signals are caught from before the
/// start, and forwarded to the program by [`Running::wait`].
pub fn start(cmd: &[String], env: &[EnvEntry]) -> anyhow::Result<Running> {
    // Handlers first: a signal that arrives while the child starts is forwarded, not fatal.
    let signals = [signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?, signal(SignalKind::hangup())?, signal(SignalKind::quit())?];
    let child = command(cmd, env)
        .spawn()
        .map_err(|e| Failure::new(CANNOT_START, format!("cannot start {}: {e}", cmd[0])))?;
    let pid = child.id().unwrap_or(0);
    Ok(Running { child, pid, signals })
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Forwards termination signals (also those caught since the start), waits, returns the exit code.
    pub async fn wait(self) -> anyhow::Result<i32> {
        let Running { mut child, pid, signals: [mut int, mut term, mut hup, mut quit] } = self;
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
}

/// Starts `cmd` with `env`, forwards termination signals, waits, returns its exit code.
pub async fn run(cmd: &[String], env: &[EnvEntry]) -> anyhow::Result<i32> {
    start(cmd, env)?.wait().await
}
