//! Per-process state: the slice this process runs in, its usage record, and
//! the fail-closed decision.
//!
//! - Initialised lazily on the first intercepted call (no constructor), in a
//!   non-blocking `once_cell::race` cell (racing first calls may each attach;
//!   one attachment is kept), so a fork never inherits a half-done init.
//! - If the slice table is missing, corrupt or of another ABI version, every
//!   intercepted CUDA entry point returns `CUDA_ERROR_NOT_INITIALIZED` and
//!   every NVML one `NVML_ERROR_UNINITIALIZED`, and one line on stderr says
//!   what is wrong and what to do. `cuInit` failing keeps the real driver
//!   uninitialised, so entry points we do not intercept fail too.
//! - The usage record is claimed on the first charge. A fork child starts
//!   with none (POSIX record locks are not inherited) and claims its own.

use crate::util::{SpinLock, say, say_once};
use egpu_abi::{ChargeError, LimitsReader, ProcSlot, SliceState, UsageFile, paths};
use egpu_cuda::{CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_OUT_OF_MEMORY, CUresult, NVML_ERROR_UNINITIALIZED, nvmlReturn_t};
use std::path::PathBuf;
use once_cell::race::OnceBox;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Status every CUDA entry point returns when the hook fails closed.
pub const CUDA_FAIL_CLOSED: CUresult = CUDA_ERROR_NOT_INITIALIZED;
/// Status every NVML entry point returns when the hook fails closed.
pub const NVML_FAIL_CLOSED: nvmlReturn_t = NVML_ERROR_UNINITIALIZED;

/// The slice this process is attached to.
pub struct Slice {
    pub dir: PathBuf,
    pub limits: LimitsReader,
    pub usage: UsageFile,
    pub name: String,
    /// Device UUIDs in slice order.
    pub uuids: Vec<String>,
}

// One per process, already on the heap in `STATE`: boxing the slice would
// only add an indirection.
#[allow(clippy::large_enum_variant)]
enum Init {
    Ready(Slice),
    Failed(String),
}

static STATE: OnceBox<Init> = OnceBox::new();
static ATFORK: AtomicBool = AtomicBool::new(false);
static SAID_FAILED: AtomicBool = AtomicBool::new(false);
const NO_SLOT: usize = usize::MAX;
static SLOT: AtomicUsize = AtomicUsize::new(NO_SLOT);
static CLAIM: SpinLock<()> = SpinLock::new(());

/// Debug builds only, for the tests of racing attachments: with
/// `EGPU_HOOK_TEST_INIT_DELAY_MS=D` the k-th attachment of this process
/// (counting from 1) first creates `$EGPU_HOOK_TEST_INIT_MARK.k` (if set),
/// then sleeps k·D, so a test knows when a thread is inside its attachment
/// and which of two racing attachments finishes first.
#[cfg(debug_assertions)]
fn test_delay() {
    static ENTERED: AtomicUsize = AtomicUsize::new(0);
    let Some(ms) = std::env::var("EGPU_HOOK_TEST_INIT_DELAY_MS").ok().and_then(|v| v.parse::<u64>().ok()) else { return };
    let k = ENTERED.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(mark) = std::env::var_os("EGPU_HOOK_TEST_INIT_MARK") {
        let mut path = mark;
        path.push(format!(".{k}"));
        let _ = std::fs::write(path, b"");
    }
    std::thread::sleep(std::time::Duration::from_millis(ms * k as u64));
}

/// Debug builds only, for the control of the tests of several processes
/// in one slice: with `EGPU_HOOK_TEST_NO_PEER_FLAG=1` the record is claimed
/// as an older hook claims it, without `CAP_PEER_INFLIGHT`, so the slice's
/// other processes do not count its unfinished work (and with every process
/// so, each gate checks only its own, as before the flag); with
/// `EGPU_HOOK_TEST_NO_TURNS=1`, without `CAP_TURNS`, so the process neither
/// takes turns nor is waited for (a bound of one launch holds per process).
#[cfg(debug_assertions)]
fn test_blind_record(usage: &egpu_abi::UsageFile, i: usize) {
    if std::env::var_os("EGPU_HOOK_TEST_NO_PEER_FLAG").is_some_and(|v| v == "1") {
        usage.region().procs[i].caps.fetch_and(!egpu_abi::usage::CAP_PEER_INFLIGHT, Ordering::Relaxed);
    }
    if std::env::var_os("EGPU_HOOK_TEST_NO_TURNS").is_some_and(|v| v == "1") {
        usage.region().procs[i].caps.fetch_and(!egpu_abi::usage::CAP_TURNS, Ordering::Relaxed);
    }
}

/// Attaches to the slice. Racing first calls (or a child forked while its
/// parent was attaching) may each run this; the first to finish is kept and
/// the others are leaked, never dropped: dropping one would close its
/// descriptor of the usage file, and closing any descriptor of a file
/// releases all of the process's POSIX record locks on it, including the
/// one through which the kept attachment owns this process's record.
fn state() -> &'static Init {
    if let Some(s) = STATE.get() {
        return s;
    }
    #[cfg(debug_assertions)]
    test_delay();
    // Registered before the flag is set, so no thread can see the flag while
    // the handler is still missing (racing threads may register it twice:
    // the handler is idempotent).
    if !ATFORK.load(Ordering::Acquire) {
        // SAFETY: registers a plain extern "C" handler; pthread_atfork has no other precondition.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_child)) };
        ATFORK.store(true, Ordering::Release);
    }
    if let Err(lost) = STATE.set(Box::new(attach())) {
        Box::leak(lost);
    }
    STATE.get().expect("set above, by this thread or another")
}

/// The slice directory: the one a container's CDI spec mounts, when there is
/// one (the environment cannot point a container's hook at a limits file the
/// workload made itself); else `EGPU_SLICE_DIR`; else that same place.
fn slice_dir() -> PathBuf {
    let mounted = PathBuf::from(paths::CONTAINER_SLICE_DIR);
    if paths::limits_path(&mounted).exists() {
        return mounted;
    }
    std::env::var_os(paths::SLICE_DIR_ENV).map(PathBuf::from).unwrap_or(mounted)
}

fn attach() -> Init {
    let dir = slice_dir();
    let how = "run the workload through `egpu run`/`egpu exec` (or set EGPU_SLICE_DIR to <run-dir>/slices/<name>); libegpu never runs a GPU workload without limits";
    let limits = match LimitsReader::open(&paths::limits_path(&dir)) {
        Ok(l) => l,
        Err(e) => return Init::Failed(format!("GPU access refused: {e}. To fix: {how}")),
    };
    let usage = match UsageFile::open(&paths::usage_path(&dir)) {
        Ok(u) => u,
        Err(e) => return Init::Failed(format!("GPU access refused: {e}. To fix: {how}")),
    };
    let n = limits.snapshot().n_devices;
    if usage.n_devices() != n {
        return Init::Failed(format!(
            "GPU access refused: slice {} has {n} devices in its limits file but {} in its usage file; restart egpud to rewrite it",
            dir.display(),
            usage.n_devices()
        ));
    }
    let r = limits.region();
    let uuids = (0..n).map(|i| r.device_uuid(i)).collect();
    let name = r.name();
    crate::util::debug!("attached to slice '{name}' at {} ({n} devices)", dir.display());
    Init::Ready(Slice { dir, limits, usage, name, uuids })
}

fn failed(msg: &str) {
    say_once(&SAID_FAILED, || msg.to_string());
}

/// The slice, or the fail-closed CUDA status (message printed once).
pub fn slice() -> Result<&'static Slice, CUresult> {
    match state() {
        Init::Ready(s) => Ok(s),
        Init::Failed(m) => {
            failed(m);
            Err(CUDA_FAIL_CLOSED)
        }
    }
}

/// Same as [`slice`] with the NVML status.
pub fn slice_nvml() -> Result<&'static Slice, nvmlReturn_t> {
    slice().map_err(|_| NVML_FAIL_CLOSED)
}

/// Hot-path check: one atomic load once initialised.
#[inline]
pub fn gate() -> Result<(), CUresult> {
    match STATE.get() {
        Some(Init::Ready(_)) => Ok(()),
        _ => slice().map(|_| ()),
    }
}

impl Slice {
    /// This process's record, claimed on first use.
    pub fn slot(&self) -> Result<ProcSlot, CUresult> {
        let i = SLOT.load(Ordering::Acquire);
        if i != NO_SLOT {
            return Ok(ProcSlot { index: i });
        }
        let _g = CLAIM.lock();
        let i = SLOT.load(Ordering::Acquire);
        if i != NO_SLOT {
            return Ok(ProcSlot { index: i });
        }
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u32;
        match self.usage.claim(pid) {
            Ok(s) => {
                #[cfg(debug_assertions)]
                test_blind_record(&self.usage, s.index);
                SLOT.store(s.index, Ordering::Release);
                crate::util::debug!("pid {pid} claimed usage record {}", s.index);
                Ok(s)
            }
            Err(e) => {
                say(&format!("cannot attach to slice '{}': {e}; allocation refused", self.name));
                Err(CUDA_ERROR_OUT_OF_MEMORY)
            }
        }
    }

    /// Slice usage on device `dev`: the sum of all records, plus what
    /// `egpud`'s memory audit found the driver holding for the slice's
    /// processes beyond it ([`Slice::untracked`]).
    pub fn used(&self, dev: usize) -> u64 {
        self.usage.used(dev).saturating_add(self.untracked(dev))
    }

    /// Memory `egpud`'s audit counts against device `dev` beyond the records
    /// (0 unless it runs with `--memory-audit charge`).
    pub fn untracked(&self, dev: usize) -> u64 {
        self.limits.region().devices.get(dev).map_or(0, |d| d.mem_untracked.load(Ordering::Acquire))
    }

    /// The burst cap of device `dev` (0: the slice does not burst).
    pub fn mem_burst(&self, dev: usize) -> u64 {
        self.limits.region().devices.get(dev).map_or(0, |d| d.mem_burst.load(Ordering::Acquire))
    }

    /// Asks `egpud` to raise the limit of device `dev` to `want` bytes from
    /// the device's burst pool and waits, at most [`BURST_WAIT`], for its
    /// answer (it clears the request at its next tick, after publishing any
    /// grant). Returns whether it answered; the caller's retry tells whether
    /// the limit was raised. Never holds a lock while waiting.
    pub fn ask_for_burst(&self, dev: usize, want: u64) -> bool {
        self.usage.want_memory(dev, want);
        let deadline = std::time::Instant::now() + BURST_WAIT;
        while self.usage.wanted_memory(dev) != 0 {
            if std::time::Instant::now() >= deadline {
                crate::util::debug!("no burst answer for dev {dev} within {BURST_WAIT:?} (is egpud running?)");
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        true
    }

    /// The current memory limit of device `dev`.
    pub fn limit(&self, dev: usize) -> u64 {
        let s = self.limits.snapshot();
        s.devices().get(dev).map_or(0, |d| d.mem_limit)
    }
}

/// How long an allocation over the limit waits for `egpud` to answer a
/// burst request (its arbiter loop answers every 10 ms) before it is refused.
pub const BURST_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

static SAID_DELETED: AtomicBool = AtomicBool::new(false);
static SAID_UNTRACKED: AtomicBool = AtomicBool::new(false);
static SAID_LOCK_HELD: AtomicBool = AtomicBool::new(false);

/// Whether a slice seen deleted just as this process attached becomes
/// active again within 50 ms: `egpud` found the attaching process and kept
/// the slice (its delete refused).
fn reactivated(s: &Slice) -> bool {
    let until = std::time::Instant::now() + std::time::Duration::from_millis(50);
    while std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(1));
        if s.limits.snapshot().state != SliceState::Deleted {
            return true;
        }
    }
    false
}

/// Charges `bytes` on slice device `dev` before the real allocation. On
/// refusal, sweeps records of dead processes, returns pool memory the
/// process no longer uses, and retries once.
pub fn charge(dev: usize, bytes: u64) -> Result<(), CUresult> {
    let s = slice()?;
    let snap = s.limits.snapshot();
    if snap.state == SliceState::Deleted {
        say_once(&SAID_DELETED, || format!("slice '{}' was deleted: new GPU allocations are refused (the process keeps running)", s.name));
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    if dev >= snap.devices().len() {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    let slot = s.slot()?;
    // Again now that this process holds a usage record: `egpud` marks a
    // slice deleted before it looks for attached processes a last time, so
    // either it saw this record (and keeps the slice, active again within
    // moments) or the slice is gone. (The fence pairs with egpud's after
    // its mark: the record's lock and this read are not reordered.)
    std::sync::atomic::fence(Ordering::SeqCst);
    if s.limits.snapshot().state == SliceState::Deleted && !reactivated(s) {
        say_once(&SAID_DELETED, || format!("slice '{}' was deleted: new GPU allocations are refused (the process keeps running)", s.name));
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // The limit is read inside the charge lock (see `try_charge_with`), so a
    // limit `egpud` lowers to take back burst memory is never overrun. What
    // the memory audit found untracked is memory the slice holds: it leaves
    // that much less of the limit to charge.
    let limit = || s.limit(dev).saturating_sub(s.untracked(dev));
    let (mut swept, mut asked) = (false, false);
    loop {
        match s.usage.try_charge_with(&slot, dev, bytes, &limit) {
            Ok(total) => {
                crate::util::debug!("charge dev {dev} +{bytes} -> {total}");
                return Ok(());
            }
            Err(ChargeError::BadDevice(_)) => return Err(CUDA_ERROR_INVALID_DEVICE),
            Err(ChargeError::LockHeld { pid }) => {
                say_once(&SAID_LOCK_HELD, || {
                    format!(
                        "slice '{}': another process of the slice (pid {pid} in its own namespace) has held the slice's charge lock for {} s without running (stopped, frozen, in a debugger, or starved of CPU): GPU allocations are refused while it does",
                        s.name,
                        egpu_abi::usage::CHARGE_LOCK_PATIENCE.as_secs()
                    )
                });
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            Err(ChargeError::OverLimit { used, requested, limit }) => {
                if !swept {
                    swept = true;
                    let reclaimed = s.usage.sweep(Some(slot.index));
                    if !reclaimed.is_empty() {
                        crate::util::debug!("swept {} dead records", reclaimed.len());
                    }
                    crate::cuda::pool::release_unused();
                    continue;
                }
                let untracked = s.untracked(dev);
                let want = used.saturating_add(requested).saturating_add(untracked);
                if !asked && want <= s.mem_burst(dev) {
                    asked = true;
                    if s.ask_for_burst(dev, want) {
                        continue;
                    }
                }
                crate::util::debug!("refuse dev {dev} +{requested}: used {used} limit {limit}");
                if untracked > 0 {
                    say_once(&SAID_UNTRACKED, || {
                        format!(
                            "slice '{}': the driver holds {} MiB for this slice's processes that they were not charged (memory egpu could not follow, such as an exported allocation imported back); egpud counts it against the limit, so allocations are refused sooner",
                            s.name,
                            untracked >> 20
                        )
                    });
                }
                s.usage.count_refusal(dev);
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
        }
    }
}

/// Bytes of device memory this process freed per slice device, ever (what
/// [`uncharge_freed`] gave back): a measurement of device memory across a
/// window adds back what this process freed in it (`cuda::ctx`), so a free
/// on another thread cannot make the measured thing look smaller. Refunds
/// of charges for memory the driver never handed out (a failed
/// allocation, a pre-charge settled down) are not frees and not counted.
static FREED: [std::sync::atomic::AtomicU64; egpu_abi::MAX_DEVICES] = [const { std::sync::atomic::AtomicU64::new(0) }; egpu_abi::MAX_DEVICES];

/// `FREED` of `dev` now: bytes this process freed there, ever.
pub fn freed_so_far(dev: usize) -> u64 {
    FREED.get(dev).map_or(0, |u| u.load(Ordering::Acquire))
}

/// [`uncharge`] for memory the driver just freed (a free, a release, a
/// destroyed context or array, a pool or graph pool that shrank).
pub fn uncharge_freed(dev: usize, bytes: u64) {
    if let Some(u) = FREED.get(dev) {
        u.fetch_add(bytes, Ordering::AcqRel);
    }
    uncharge(dev, bytes);
}

/// Returns `bytes` on `dev` to the slice.
pub fn uncharge(dev: usize, bytes: u64) {
    if bytes == 0 {
        return;
    }
    if let Ok(s) = slice() {
        let i = SLOT.load(Ordering::Acquire);
        if i != NO_SLOT {
            s.usage.uncharge(&ProcSlot { index: i }, dev, bytes);
            crate::util::debug!("uncharge dev {dev} -{bytes} -> {}", s.used(dev));
        }
    }
}

extern "C" fn after_fork_child() {
    SLOT.store(NO_SLOT, Ordering::Release);
    CLAIM.force_unlock();
    egpu_abi::usage::reset_after_fork();
    if let Some(Init::Ready(s)) = STATE.get() {
        s.usage.forget_claims_after_fork();
    }
    crate::ledger::reset_after_fork();
    crate::detour::reset_after_fork();
    crate::compute::reset_after_fork();
}
