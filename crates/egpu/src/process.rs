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
    apply_env(&mut c, env);
    c
}

fn apply_env(c: &mut tokio::process::Command, env: &[EnvEntry]) {
    for e in env {
        let existing = std::env::var(&e.name).ok();
        c.env(&e.name, combine(e, existing.as_deref()));
    }
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
    start_command(command(cmd, env), &cmd[0])
}

fn start_command(mut c: tokio::process::Command, prog: &str) -> anyhow::Result<Running> {
    // Handlers first: a signal that arrives while the child starts is forwarded, not fatal.
    let signals = [signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?, signal(SignalKind::hangup())?, signal(SignalKind::quit())?];
    let child = c.spawn().map_err(|e| Failure::new(CANNOT_START, format!("cannot start {prog}: {e}")))?;
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

/// The write end of a held program's gate (see [`start_gated`]). Dropping
/// it without [`Release::go`] makes the program exit without starting.
pub struct Release(std::os::fd::OwnedFd);

impl Release {
    /// Lets the held program become PROG.
    pub fn go(self) {
        // SAFETY: writes one byte from a live buffer to our own pipe fd.
        let _ = unsafe { libc::write(std::os::fd::AsRawFd::as_raw_fd(&self.0), b"1".as_ptr().cast(), 1) };
    }
}

/// Starts `cmd` held: this binary's `internal-exec-gate` waits for
/// [`Release::go`] and then execs `cmd` in the same process (same pid and
/// start time), so the pid can be registered before PROG runs. If the
/// release is dropped (or this process dies) first, PROG never starts.
pub fn start_gated(cmd: &[String], env: &[EnvEntry]) -> anyhow::Result<(Running, Release)> {
    use std::os::fd::{FromRawFd, OwnedFd};
    // /proc/self/exe still runs this binary after it was replaced on disk.
    let me = match std::path::Path::new("/proc/self/exe") {
        p if p.exists() => p.to_path_buf(),
        _ => std::env::current_exe().map_err(|e| Failure::new(CANNOT_START, format!("cannot find the egpu binary to start {}: {e}", cmd[0])))?,
    };
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into a live array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Failure::new(CANNOT_START, format!("cannot start {}: pipe: {}", cmd[0], std::io::Error::last_os_error())).into());
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // The gate keeps a number of its own, 3 or above and not one this
    // process inherited (a jobserver's, a `3<file`): those reach PROG as
    // they do under `egpu exec`. (Below 3 only when stdin, stdout or
    // stderr was closed.)
    // SAFETY: F_DUPFD_CLOEXEC on an fd this process owns.
    let r = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&read), libc::F_DUPFD_CLOEXEC, 3) };
    if r < 0 {
        return Err(Failure::new(CANNOT_START, format!("cannot start {}: fcntl: {}", cmd[0], std::io::Error::last_os_error())).into());
    }
    drop(read);
    // SAFETY: `r` was just made by the fcntl above and is owned by nobody else.
    let read = unsafe { OwnedFd::from_raw_fd(r) };
    let mut c = tokio::process::Command::new(me);
    c.args(["internal-exec-gate", "--fd", &r.to_string(), "--"]).args(cmd);
    apply_env(&mut c, env);
    // SAFETY: between fork and exec only an async-signal-safe fcntl on an
    // fd this process owns: the gate's end survives the exec.
    unsafe {
        c.pre_exec(move || {
            if libc::fcntl(r, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let running = start_command(c, &cmd[0])?;
    drop(read);
    Ok((running, Release(write)))
}

/// `egpu internal-exec-gate --fd FD -- PROG...`: waits for one byte on FD,
/// then becomes PROG (returns only if that fails). EOF first (the `egpu run`
/// that started it is gone before egpud knew of it): PROG is not started.
pub fn exec_gate(fd: i32, cmd: &[String]) -> i32 {
    use std::os::unix::process::CommandExt;
    if fd < 3 {
        eprintln!("egpu internal-exec-gate: --fd {fd} is not a gate descriptor (it is started by `egpu run`)");
        return CANNOT_START;
    }
    let mut b = [0u8; 1];
    let n = loop {
        // SAFETY: reads at most one byte into a live buffer from an inherited fd.
        let n = unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) };
        if n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break n;
        }
    };
    // SAFETY: closes the gate fd, which nothing else in this process uses.
    unsafe { libc::close(fd) };
    if n != 1 {
        eprintln!("egpu run: the command that started {} exited before egpud registered it; not starting it (its slice is removed)", cmd[0]);
        return CANNOT_START;
    }
    let e = std::process::Command::new(&cmd[0]).args(&cmd[1..]).exec();
    eprintln!("egpu: cannot start {}: {e}", cmd[0]);
    CANNOT_START
}

/// Starts `cmd` with `env`, forwards termination signals, waits, returns its exit code.
pub async fn run(cmd: &[String], env: &[EnvEntry]) -> anyhow::Result<i32> {
    start(cmd, env)?.wait().await
}
