//! Running a workload: apply the environment egpud computed, start the
//! program, forward SIGINT/SIGTERM/SIGHUP/SIGQUIT to it, and return its
//! status the way a shell does (128 + signal number when killed).
//!
//! The program runs in this process's process group, so a signal the
//! terminal sends to its foreground group (Ctrl-C, Ctrl-\) reaches it
//! directly: those are not forwarded again. They are told apart
//! by the signal's `si_code` (`SI_KERNEL`), which needs a `SA_SIGINFO`
//! handler of our own; it hands `(signal, si_code)` to [`Relay`] through a
//! pipe (`write` is async-signal-safe).

use crate::exit::{CANNOT_START, Failure};
use egpu_node::launch::{EnvEntry, combine};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicI32, Ordering};

/// The termination signals forwarded to the program.
const RELAYED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];
/// `si_code` of a signal the kernel sent: the terminal's, to its whole foreground group.
const SI_KERNEL: libc::c_int = 0x80;
/// The write end of the relay pipe (-1 until [`Relay::install`]).
static RELAY_W: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to a SA_SIGINFO handler.
    let code = if info.is_null() { 0 } else { unsafe { (*info).si_code } };
    let rec = [sig, code];
    let w = RELAY_W.load(Ordering::Relaxed);
    if w >= 0 {
        // SAFETY: errno is this thread's; write(2) is async-signal-safe and
        // writes 8 bytes from a live array to our own non-blocking pipe (a
        // full pipe drops the record). errno is put back for the code the
        // signal interrupted.
        unsafe {
            let errno = *libc::__errno_location();
            let _ = libc::write(w, rec.as_ptr().cast(), std::mem::size_of_val(&rec));
            *libc::__errno_location() = errno;
        }
    }
}

/// The caught termination signals, as `(signal, si_code)`.
struct Relay(tokio::io::unix::AsyncFd<OwnedFd>);

impl Relay {
    /// Catches [`RELAYED`] from now on (before the program starts, so a
    /// signal that arrives meanwhile is forwarded, not fatal).
    fn install() -> std::io::Result<Relay> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two fds into a live array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: both fds were just created and are owned by nobody else; the
        // write end stays open for the handler for the rest of the process.
        let read = unsafe { OwnedFd::from_raw_fd(fds[0]) };
        if let Err(old) = RELAY_W.compare_exchange(-1, fds[1], Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: our own fd, not published. One relay per process.
            unsafe { libc::close(fds[1]) };
            return Err(std::io::Error::other(format!("signal relay already installed (fd {old})")));
        }
        for sig in RELAYED {
            // SAFETY: all-zero is a valid sigaction; the handler is an
            // extern "C" fn of the SA_SIGINFO signature.
            let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            // SAFETY: installs a handler with a valid, fully set sigaction.
            if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        // SAFETY: an OwnedFd is a valid open fd, and the AsyncFd owns it (the
        // same fd, the same description) until it is dropped.
        let fd = unsafe { tokio::io::unix::AsyncFd::register_with_interest(read, tokio::io::Interest::READABLE) }.map_err(std::io::Error::from)?;
        Ok(Relay(fd))
    }

    /// The next caught signal.
    async fn next(&mut self) -> std::io::Result<(libc::c_int, libc::c_int)> {
        loop {
            let mut ready = self.0.readable().await?;
            let mut rec = [0 as libc::c_int; 2];
            let got = ready.try_io(|fd| {
                // SAFETY: reads at most 8 bytes into a live array from our own pipe.
                let n = unsafe { libc::read(fd.as_raw_fd(), rec.as_mut_ptr().cast(), std::mem::size_of_val(&rec)) };
                if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(n) }
            });
            match got {
                // Records are written whole (8 bytes, below PIPE_BUF).
                Ok(Ok(8)) => return Ok((rec[0], rec[1])),
                Ok(Ok(n)) => return Err(std::io::Error::other(format!("signal relay: a record of {n} bytes"))),
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }
}

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
    relay: Relay,
}

/// Starts `cmd` with `env`. Termination signals are caught from before the
/// start, and forwarded to the program by [`Running::wait`].
pub fn start(cmd: &[String], env: &[EnvEntry]) -> anyhow::Result<Running> {
    start_command(command(cmd, env), &cmd[0])
}

fn start_command(mut c: tokio::process::Command, prog: &str) -> anyhow::Result<Running> {
    // Handlers first: a signal that arrives while the child starts is forwarded, not fatal.
    let relay = Relay::install()?;
    let child = c.spawn().map_err(|e| Failure::new(CANNOT_START, format!("cannot start {prog}: {e}")))?;
    let pid = child.id().unwrap_or(0);
    Ok(Running { child, pid, relay })
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Forwards termination signals (also those caught since the start),
    /// but not the terminal's, which the program got itself; waits, returns
    /// the exit code.
    pub async fn wait(self) -> anyhow::Result<i32> {
        let Running { mut child, pid, mut relay } = self;
        loop {
            tokio::select! {
                st = child.wait() => return Ok(exit_code(st?)),
                got = relay.next() => match got? {
                    // The terminal's ^C and ^\ go to its whole foreground
                    // group, which the program is in with us. (Not a
                    // SIGHUP: the kernel sends a hangup to the session
                    // leader alone, which may be this process.)
                    (libc::SIGINT | libc::SIGQUIT, SI_KERNEL) => {}
                    (sig, _) => send_signal(pid, sig),
                },
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
