//! Cross-process behaviour of the usage region: a SIGKILLed process leaves no
//! lock held and its charges are reclaimed by the next sweep.
//!
//! The test re-executes its own binary as the child (selected by an
//! environment variable), so the child is a real separate process.

use egpu_abi::UsageFile;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

const ROLE: &str = "EGPU_ABI_TEST_CHILD";

/// Child role: attach, charge, optionally take the charge lock forever, say "ready", block on stdin.
fn child(path: &Path, hold_lock: bool) {
    let u = UsageFile::open(path).unwrap();
    let s = u.claim(std::process::id()).unwrap();
    u.try_charge(&s, 0, 700, 1000).unwrap();
    if hold_lock {
        // Simulate dying inside the charge critical section: own the lock word.
        u.region().charge_locks[0].store(s.index as u32 + 1, std::sync::atomic::Ordering::Release);
    }
    println!("ready {}", s.index);
    std::io::stdout().flush().unwrap();
    let mut buf = [0u8; 1];
    let _ = std::io::stdin().read(&mut buf);
}

/// Starts the child role on `path` and waits until it says "ready".
fn spawn_ready(path: &Path, hold_lock: bool) -> std::process::Child {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture"])
        .env(ROLE, format!("{}|{}", path.display(), hold_lock))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(c.stdout.take().unwrap()).lines();
    while !lines.next().expect("child exited before ready").unwrap().starts_with("ready") {}
    c
}

fn run_and_kill(u: &UsageFile, path: &Path, hold_lock: bool, mine: Option<usize>) {
    let mut c = spawn_ready(path, hold_lock);
    assert_eq!(u.used(0), 700);
    assert!(u.processes().iter().any(|p| p.alive), "child's record must look alive");
    assert!(u.sweep(mine).is_empty(), "a live process must not be reclaimed");
    c.kill().unwrap();
    c.wait().unwrap();
}

#[test]
fn child_entry() {
    if let Ok(v) = std::env::var(ROLE) {
        let (p, hold) = v.split_once('|').unwrap();
        child(Path::new(p), hold == "true");
    }
}

#[test]
fn killed_process_is_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("usage");
    let u = UsageFile::create(&p, 1).unwrap();
    run_and_kill(&u, &p, false, None);
    let rec = u.sweep(None);
    assert_eq!(rec.len(), 1);
    assert_eq!(rec[0].charged, vec![700]);
    assert_eq!(u.used(0), 0);
    assert!(u.processes().is_empty());
}

#[test]
fn lock_held_by_dead_process_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("usage");
    // One handle per process: closing any descriptor of the file would drop this process's record locks.
    let u = UsageFile::create(&p, 1).unwrap();
    let me = u.claim(std::process::id()).unwrap();
    run_and_kill(&u, &p, true, Some(me.index));
    // No sweep: a live charger must detect the dead owner by itself and proceed.
    // The dead child's 700 bytes still count until a sweep, so 300 fit and 301 do not.
    assert!(matches!(u.try_charge(&me, 0, 301, 1000), Err(egpu_abi::ChargeError::OverLimit { .. })));
    assert_eq!(u.try_charge(&me, 0, 300, 1000), Ok(1000));
    let rec = u.sweep(Some(me.index));
    assert_eq!(rec.len(), 1);
    assert_eq!(u.used(0), 300);
}

/// A live process that keeps the charge lock (stopped inside the section:
/// `SIGSTOP`, a frozen cgroup, a debugger) does not hang every other
/// process of the slice: after `CHARGE_LOCK_PATIENCE` the charge is
/// refused, naming the holder; once the holder is gone it is taken over.
#[test]
fn a_lock_a_live_process_keeps_is_refused_not_waited_on_forever() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("usage");
    let u = UsageFile::create(&p, 1).unwrap();
    let me = u.claim(std::process::id()).unwrap();
    let mut c = spawn_ready(&p, true);
    assert_eq!(u.try_charge(&me, 0, 1, 1000), Err(egpu_abi::usage::ChargeError::LockHeld { pid: c.id() }));
    c.kill().unwrap();
    c.wait().unwrap();
    assert_eq!(u.try_charge(&me, 0, 300, 1000), Ok(1000), "a dead holder's lock is taken over");
}

/// A workload in a container writes its own namespace's pid into its record;
/// a reader outside (egpud on the host, where NVML's pids come from) gets the
/// record lock owner's pid as its own namespace sees it. Run in a new user +
/// pid namespace (`unshare -Urp --fork`), the child is pid 1 to itself.
#[test]
fn a_process_in_another_pid_namespace_is_listed_by_the_readers_pid() {
    let probe = Command::new("unshare").args(["-Urp", "--fork", "true"]).output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        // Not every machine lets an unprivileged test make namespaces (a
        // container without user namespaces); there is nothing to compare then.
        eprintln!("skipped: `unshare -Urp --fork` does not work here: {probe:?}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("usage");
    let u = UsageFile::create(&p, 1).unwrap();
    let mut c = Command::new("unshare")
        .args(["-Urp", "--fork"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture"])
        .env(ROLE, format!("{}|false", p.display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(c.stdout.take().unwrap()).lines();
    while !lines.next().expect("child exited before ready").unwrap().starts_with("ready") {}
    let procs = u.processes();
    assert_eq!(procs.len(), 1, "{procs:?}");
    let v = &procs[0];
    assert!(v.alive);
    assert_eq!(v.record_pid, 1, "the child sees itself as pid 1: {v:?}");
    assert_ne!(v.pid, 1, "the reader must see the child by its own pid: {v:?}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", v.pid)).unwrap();
    let nspid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    assert_eq!(nspid.split_whitespace().skip(1).collect::<Vec<_>>(), [v.pid.to_string(), "1".into()], "{nspid}");
    drop(c.stdin.take());
    assert!(c.wait().unwrap().success());
}
