//! The *usage* region: one record per attached process, updated with atomics.
//!
//! Liveness: a process owns record `i` while it holds a POSIX write lock on
//! byte [`UsageFile::lock_offset`]`(i)` of the file. The kernel releases the
//! lock when the process exits or is killed, and POSIX locks are not inherited
//! across `fork` and are dropped at `exec` (the file is opened close-on-exec),
//! so "locked by another process" means "that process is alive and attached".
//! Nothing else in the protocol needs the pid, so it works across pid
//! namespaces and is immune to pid reuse.
//!
//! Charging: per device, a charge lock word holds `1 + slot` of its owner.
//! Inside it the owner sums every record's `charged` and, if the sum plus the
//! request fits the limit, adds to its own record with one atomic operation.
//! The slice's usage is by definition the sum of the records, so a process
//! that dies anywhere leaves it consistent. A waiter that finds the owner's
//! record unlocked (owner dead) takes the lock over; reclaiming a dead record
//! also frees any charge lock it held. Uncharging needs no lock.

use crate::map::{self, Mapping};
use crate::{AbiError, ABI_VERSION, MAX_DEVICES, MAX_PROCS, USAGE_MAGIC};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering, fence};

/// Serialises, within this process, every section that takes the record lock
/// of a record this process does not own (sweep, charge-lock takeover).
/// POSIX record locks belong to the process, not the thread: two threads
/// could both "take" the same byte, and the first to unlock would let a new
/// process claim the record while the second still resets it. A spin flag
/// rather than a `Mutex`, so a fork child can reset it ([`reset_after_fork`]).
static FOREIGN: AtomicBool = AtomicBool::new(false);

struct ForeignGuard;

fn foreign_guard() -> ForeignGuard {
    let mut spins = 0u32;
    while FOREIGN.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    ForeignGuard
}

impl Drop for ForeignGuard {
    fn drop(&mut self) {
        FOREIGN.store(false, Ordering::Release);
    }
}

/// Fork child only (from a `pthread_atfork` handler): releases the
/// process-local guard a thread of the parent may have held at the fork.
pub fn reset_after_fork() {
    FOREIGN.store(false, Ordering::Release);
}

/// One attached process.
#[derive(Debug)]
#[repr(C, align(64))]
pub struct ProcRecord {
    /// Pid as the process sees itself (informational; liveness is the record lock).
    pub pid: AtomicU32,
    /// 0 free, 1 attached.
    pub state: AtomicU32,
    /// CLOCK_MONOTONIC ns at attach.
    pub attached_ns: AtomicU64,
    /// CLOCK_MONOTONIC ns of the process's last intercepted call that refreshed it.
    pub heartbeat_ns: AtomicU64,
    /// Bytes charged per slice device.
    pub charged: [AtomicU64; MAX_DEVICES],
    /// Measured GPU time per slice device, ns.
    pub gpu_time_ns: [AtomicU64; MAX_DEVICES],
    /// Kernel launches per slice device.
    pub launches: [AtomicU64; MAX_DEVICES],
    /// Time spent held back by the compute gate per slice device, ns.
    pub throttled_ns: [AtomicU64; MAX_DEVICES],
    /// What this process's hook does ([`CAP_LIMIT_IN_LOCK`],
    /// [`CAP_PEER_INFLIGHT`]); set at claim. Carved out of reserved space:
    /// zero for hooks older than the field.
    pub caps: AtomicU64,
    /// The compute gate's estimate of this process's unfinished work per
    /// slice device, µs. Only the owning process writes it (the hook stores
    /// its total less its silent threads' at each launch and completion);
    /// the gates of the slice's other processes count it against the
    /// slice's allowance with their own, while
    /// it is fresh ([`ProcRecord::gate_ns`]) and the record has
    /// [`CAP_PEER_INFLIGHT`] (`docs/compute-arbiter.md`, "Several processes in
    /// one slice"). Carved out of the reserved words and the record's tail
    /// padding: `size_of` and every older offset are unchanged.
    pub inflight_us: [AtomicU32; MAX_DEVICES],
    /// CLOCK_MONOTONIC ns of the process's last decision by the compute gate
    /// (kept to within a sixteenth of a period). A record whose `inflight_us`
    /// has not been refreshed for two arbiter periods is not counted: its
    /// process stopped calling CUDA with launches unreaped, or sleeps in a
    /// long synchronisation.
    pub gate_ns: AtomicU64,
    /// The slice device this process waits on for its turn at the slice's
    /// one launch (a best-effort slice beside an active high-priority one),
    /// and since when: CLOCK_MONOTONIC ns with its low 4 bits replaced by the
    /// device index; with bit 63 set, the device where it holds the turn and
    /// since when; 0: neither. A wait counts while
    /// [`ProcRecord::turn_poll_ns`] is recent, a hold while its launch is
    /// unfinished and young, and only if the record has [`CAP_TURNS`]
    /// (`docs/compute-arbiter.md`, "Turns at a best-effort slice's one
    /// launch"). Carved out of reserved space.
    pub turn_since: AtomicU64,
    /// CLOCK_MONOTONIC ns of the waiter's last look at its turn.
    pub turn_poll_ns: AtomicU64,
    /// Rung (incremented, then woken as a futex shared between processes)
    /// by a peer that finds the slice's one launch free and this process
    /// the oldest waiter: the waiter sleeps on it, so the turn passes at
    /// once rather than at the waiter's next look.
    pub turn_bell: AtomicU32,
    /// Reserved; zero.
    pub reserved: AtomicU32,
}

impl Default for ProcRecord {
    /// A zeroed record (free), for tables held outside a usage file (the
    /// arbiter's model and tests).
    fn default() -> ProcRecord {
        // SAFETY: every field is an integer atomic, for which all-zero bytes are a valid value.
        unsafe { std::mem::zeroed() }
    }
}

/// [`ProcRecord::caps`]: the process reads the memory limit inside the
/// charge lock ([`UsageFile::try_charge_with`]). `egpud` takes a lowered
/// limit as final only when every live record has it: an older hook reads
/// the limit before the lock and may still charge against the old one.
pub const CAP_LIMIT_IN_LOCK: u64 = 1;

/// [`ProcRecord::caps`]: the process publishes its unfinished work in
/// [`ProcRecord::inflight_us`] and keeps [`ProcRecord::gate_ns`]. Hooks
/// without it leave those words alone (an older hook's reset zeroes only the
/// first 56 bytes of `inflight_us`, its old reserved words), so a record is
/// counted by its peers only when the flag says a current hook claimed it,
/// which zeroed them.
pub const CAP_PEER_INFLIGHT: u64 = 2;

/// [`ProcRecord::caps`]: the process takes turns at its slice's one launch
/// and says so in [`ProcRecord::turn_since`] while it waits; only such
/// records' waits are honoured (a current hook's claim zeroed the words).
pub const CAP_TURNS: u64 = 4;

/// The whole usage file.
#[repr(C, align(64))]
pub struct UsageRegion {
    pub magic: AtomicU64,
    pub abi_version: AtomicU32,
    pub region_size: AtomicU32,
    pub n_devices: AtomicU32,
    /// One more than the highest record index ever claimed; bounds scans.
    pub high_water: AtomicU32,
    /// Per device: `1 + slot` of the charge-lock owner, 0 when free.
    pub charge_locks: [AtomicU32; MAX_DEVICES],
    /// Per device: allocations refused for being over the limit.
    pub refused: [AtomicU64; MAX_DEVICES],
    /// Per device: slice-wide GPU time consumed, measured ns, cumulative
    /// (compute arbiter; every process adds its completed launches).
    pub consumed_ns: [AtomicU64; MAX_DEVICES],
    /// Per device: cumulative number of times a launch of this slice found
    /// its allowance exhausted and had to wait (compute arbiter demand signal).
    pub throttle_waits: [AtomicU64; MAX_DEVICES],
    /// Per device: memory the slice asks `egpud` to raise its limit to
    /// (bytes; 0: no request). A process refused over its limit raises it
    /// with `fetch_max`; `egpud` answers at its next tick by publishing a
    /// higher limit (a grant from the device's burst pool) or not, and then
    /// clears the word. Carved out of reserved space: zero in older tables.
    pub mem_want: [AtomicU64; MAX_DEVICES],
    pub procs: [ProcRecord; MAX_PROCS],
}

/// Ownership of one record by this process.
#[derive(Debug, PartialEq, Eq)]
pub struct ProcSlot {
    pub index: usize,
}

/// Why a charge was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChargeError {
    /// The slice would exceed its limit on that device.
    OverLimit { used: u64, requested: u64, limit: u64 },
    /// The device index is not part of the slice.
    BadDevice(usize),
    /// Another live process of the slice held the device's charge lock for
    /// longer than [`CHARGE_LOCK_PATIENCE`] (it does not run: `SIGSTOP`, a
    /// frozen cgroup, a debugger, or no CPU for seconds). `pid` is the one
    /// it wrote in its record.
    LockHeld { pid: u32 },
}

/// How long a charge waits for a charge lock one live process holds before
/// it is refused ([`ChargeError::LockHeld`]). The section it guards takes
/// nanoseconds, so only a holder that does not run keeps it this long
/// (stopped, frozen, in a debugger, or starved of CPU for seconds); waiting
/// on would hang every allocation of the slice until the holder runs again.
pub const CHARGE_LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// A record reclaimed from a dead process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reclaimed {
    pub index: usize,
    pub pid: u32,
    pub charged: Vec<u64>,
}

/// A copy of one record, for listings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcView {
    pub index: usize,
    /// The process as the reader's pid namespace sees it: the owner of the
    /// record's lock while it is alive (`F_GETLK`), else [`ProcView::record_pid`].
    pub pid: u32,
    /// The pid the process wrote into its record (its own namespace's view).
    pub record_pid: u32,
    /// The record lock's owner as the reader's pid namespace sees it, when
    /// the kernel names one (`None`: no owner, an error, or an owner in a pid
    /// namespace the reader cannot see).
    pub owner_pid: Option<u32>,
    pub alive: bool,
    pub charged: Vec<u64>,
    pub gpu_time_ns: Vec<u64>,
    pub launches: Vec<u64>,
    pub throttled_ns: Vec<u64>,
}

fn region_len() -> usize {
    std::mem::size_of::<UsageRegion>().div_ceil(4096) * 4096
}

/// A mapped usage file.
pub struct UsageFile {
    /// Declared before `file`: the truncation guard holds `file`'s
    /// descriptor number, so the mapping must go first.
    map: Mapping,
    file: File,
    path: PathBuf,
    /// Records this process claimed through this handle (bit per record).
    /// `F_GETLK` cannot see our own locks, so without this a sweep or a
    /// takeover would take one of them for a dead process's and, unlocking
    /// it, drop our own record lock.
    own: [AtomicU64; MAX_PROCS / 64],
    /// The device count, validated once at open. The word in the file is
    /// never read again: workloads may write the whole region, and a count
    /// they changed must not send `egpud` past the end of a per-device array.
    n_devices: usize,
    /// The guard's fault count at the last [`UsageFile::restore_length`].
    faults_seen: AtomicU32,
    /// Whether [`UsageFile::restore_length`] has reported the guard giving up.
    detached_seen: AtomicBool,
}

/// What [`UsageFile::restore_length`] put right.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The length the file was found cut to, if it was still short.
    pub cut_to: Option<u64>,
    /// Faults past the end of the file the guard caught since the last call.
    pub faults: u32,
    /// Whether the header had to be written again.
    pub header: bool,
    /// Whether the guard has just given up on the file (reported once).
    pub detached: bool,
}

/// The 16 header bytes of a usage file of this ABI version.
fn header_bytes() -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..8].copy_from_slice(&USAGE_MAGIC.to_le_bytes());
    h[8..12].copy_from_slice(&ABI_VERSION.to_le_bytes());
    h[12..].copy_from_slice(&(std::mem::size_of::<UsageRegion>() as u32).to_le_bytes());
    h
}

impl UsageFile {
    /// Creates the file atomically, mode 0666 (workloads of any user attach to it).
    pub fn create(path: &Path, n_devices: usize) -> Result<UsageFile, AbiError> {
        if n_devices == 0 || n_devices > MAX_DEVICES {
            return Err(AbiError::BadDevice(n_devices));
        }
        map::create_atomically(path, region_len(), 0o666, |m| {
            let r: &UsageRegion = m.view();
            r.n_devices.store(n_devices as u32, Ordering::Relaxed);
            r.region_size.store(std::mem::size_of::<UsageRegion>() as u32, Ordering::Relaxed);
            r.abi_version.store(ABI_VERSION, Ordering::Relaxed);
            r.magic.store(USAGE_MAGIC, Ordering::Release);
        })
        .map_err(|e| AbiError::Io(path.into(), e))?;
        Self::open(path)
    }

    /// For the node agent (at adoption, and to map anew a file the
    /// truncation guard gave up on): opens `path` like [`UsageFile::open`],
    /// but puts right first what a process of the slice that truncated the
    /// file left: a file shorter than its region is extended back, and a
    /// header and device count that read as zeros (cut away, then extended
    /// with zeros) are written again from `n_devices`, so the processes still
    /// attached keep their records and their record locks. Returns the length
    /// the file was cut to, if it was. A header that is neither this
    /// version's nor zeros is still an error (the caller recreates the file).
    pub fn open_restoring(path: &Path, n_devices: usize) -> Result<(UsageFile, Option<u64>), AbiError> {
        use std::os::unix::fs::FileExt;
        if n_devices == 0 || n_devices > MAX_DEVICES {
            return Err(AbiError::BadDevice(n_devices));
        }
        let io = |e| AbiError::Io(path.into(), e);
        let file = std::fs::OpenOptions::new().read(true).write(true).open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => AbiError::Missing(path.into()),
            _ => AbiError::Io(path.into(), e),
        })?;
        let len = file.metadata().map_err(io)?.len();
        let count_at = std::mem::offset_of!(UsageRegion, n_devices) as u64;
        // The header and the device count, as far as the file still holds them.
        let mut h = [0u8; 20];
        let have = len.min(h.len() as u64) as usize;
        file.read_exact_at(&mut h[..have], 0).map_err(io)?;
        let header_ok = have >= 16 && h[..16] == header_bytes()[..];
        let kept = have.min(16);
        if !header_ok && h[..kept] != header_bytes()[..kept] && h[..kept].iter().any(|&b| b != 0) {
            return Err(AbiError::Corrupt(path.into(), "a cut or zeroed usage file whose header is not a usage file's of this ABI version"));
        }
        let count_gone = have < 20 || h[count_at as usize..count_at as usize + 4] == [0; 4];
        let cut = len < region_len() as u64;
        if cut {
            file.set_len(region_len() as u64).map_err(io)?;
        }
        if count_gone {
            file.write_all_at(&(n_devices as u32).to_le_bytes(), count_at).map_err(io)?;
        }
        if !header_ok {
            file.write_all_at(&header_bytes(), 0).map_err(io)?;
        }
        drop(file);
        let u = Self::open(path)?;
        if cut || count_gone || !header_ok {
            u.region().high_water.store(MAX_PROCS as u32, Ordering::Release);
        }
        Ok((u, cut.then_some(len)))
    }

    /// For the node agent, at every sweep: puts right a usage file that a
    /// process of the slice truncated since the last call. The file is
    /// extended back to the mapping's length if it is short (the guard's
    /// `SIGBUS` handler, [`map::install_truncation_guard`], does the same
    /// when an access finds it short first), the header is written again if
    /// the cut reached it, and scans cover every record from then on (the
    /// high-water mark may have been cut too). What the cut pages held, the
    /// charges of the records there among them, is lost: like any write of a
    /// slice's processes to their own file, it can only make the slice look
    /// smaller. `None` when nothing happened since the last call.
    pub fn restore_length(&self) -> Result<Option<Restored>, AbiError> {
        let io = |e| AbiError::Io(self.path.clone(), e);
        let len = self.file.metadata().map_err(io)?.len();
        let mapped = self.map.len() as u64;
        let cut_to = if len < mapped {
            self.file.set_len(mapped).map_err(io)?;
            Some(len)
        } else {
            None
        };
        let faults = self.map.guard_faults();
        let new_faults = faults.saturating_sub(self.faults_seen.swap(faults, Ordering::AcqRel));
        let r = self.region();
        let header = r.magic.load(Ordering::Acquire) != USAGE_MAGIC
            || r.abi_version.load(Ordering::Relaxed) != ABI_VERSION
            || r.region_size.load(Ordering::Relaxed) != std::mem::size_of::<UsageRegion>() as u32
            || r.n_devices.load(Ordering::Relaxed) != self.n_devices as u32;
        let detached = self.map.guard_detached() && !self.detached_seen.swap(true, Ordering::AcqRel);
        if cut_to.is_none() && new_faults == 0 && !header && !detached {
            return Ok(None);
        }
        if header {
            r.n_devices.store(self.n_devices as u32, Ordering::Relaxed);
            r.region_size.store(std::mem::size_of::<UsageRegion>() as u32, Ordering::Relaxed);
            r.abi_version.store(ABI_VERSION, Ordering::Relaxed);
            r.magic.store(USAGE_MAGIC, Ordering::Release);
        }
        r.high_water.store(MAX_PROCS as u32, Ordering::Release);
        Ok(Some(Restored { cut_to, faults: new_faults, header, detached }))
    }

    /// Whether the truncation guard gave up on this file (it was cut
    /// [`map::MAX_REPAIRS`] times): this handle then reads private zeros.
    pub fn detached(&self) -> bool {
        self.map.guard_detached()
    }

    /// Opens and validates an existing usage file, read-write.
    pub fn open(path: &Path) -> Result<UsageFile, AbiError> {
        let file = std::fs::OpenOptions::new().read(true).write(true).open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => AbiError::Missing(path.into()),
            _ => AbiError::Io(path.into(), e),
        })?;
        let len = file.metadata().map_err(|e| AbiError::Io(path.into(), e))?.len() as usize;
        if len < 16 {
            return Err(AbiError::Corrupt(path.into(), "file shorter than its header"));
        }
        let map = Mapping::map_guarded(&file, len).map_err(|e| AbiError::Io(path.into(), e))?;
        let b = map.bytes();
        if u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")) != USAGE_MAGIC {
            return Err(AbiError::Corrupt(path.into(), "not a usage file: bad magic number"));
        }
        let version = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        if version != ABI_VERSION {
            return Err(AbiError::Version { path: path.into(), found: version, expected: ABI_VERSION });
        }
        let size = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes")) as usize;
        if size != std::mem::size_of::<UsageRegion>() || len < size {
            return Err(AbiError::Corrupt(path.into(), "region size does not match this ABI version"));
        }
        let n = map.view::<UsageRegion>().n_devices.load(Ordering::Relaxed) as usize;
        if n == 0 || n > MAX_DEVICES {
            return Err(AbiError::Corrupt(path.into(), "device count out of range"));
        }
        Ok(UsageFile {
            map,
            file,
            path: path.into(),
            own: [const { AtomicU64::new(0) }; MAX_PROCS / 64],
            n_devices: n,
            faults_seen: AtomicU32::new(0),
            detached_seen: AtomicBool::new(false),
        })
    }

    pub fn region(&self) -> &UsageRegion {
        self.map.view()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn n_devices(&self) -> usize {
        self.n_devices
    }

    /// Byte of the file whose record lock marks record `i` as owned.
    pub fn lock_offset(i: usize) -> u64 {
        (std::mem::offset_of!(UsageRegion, procs) + i * std::mem::size_of::<ProcRecord>()) as u64
    }

    /// Whether another process owns record `i` (a system call; not for hot paths).
    pub fn owned_by_other(&self, i: usize) -> bool {
        // An error here (should not happen on a regular file) counts as alive:
        // never reclaim what might still be in use.
        map::byte_locked_by_other(&self.file, Self::lock_offset(i)).unwrap_or(true)
    }

    fn is_own(&self, i: usize) -> bool {
        i < MAX_PROCS && self.own[i / 64].load(Ordering::Acquire) & (1 << (i % 64)) != 0
    }

    /// Fork child only: the parent's records (and their locks) are not the
    /// child's. Call it before the child claims a record of its own.
    pub fn forget_claims_after_fork(&self) {
        for w in &self.own {
            w.store(0, Ordering::Release);
        }
    }

    /// Attaches this process: takes the first record whose lock is free,
    /// resetting whatever a dead previous owner left in it.
    pub fn claim(&self, pid: u32) -> Result<ProcSlot, AbiError> {
        let r = self.region();
        let _g = foreign_guard();
        for i in 0..MAX_PROCS {
            if self.is_own(i) {
                continue;
            }
            match map::try_lock_byte(&self.file, Self::lock_offset(i)) {
                Ok(true) => {
                    self.own[i / 64].fetch_or(1 << (i % 64), Ordering::AcqRel);
                    self.reset_record(i);
                    let rec = &r.procs[i];
                    let now = crate::monotonic_ns();
                    rec.pid.store(pid, Ordering::Relaxed);
                    rec.attached_ns.store(now, Ordering::Relaxed);
                    rec.heartbeat_ns.store(now, Ordering::Relaxed);
                    rec.caps.store(CAP_LIMIT_IN_LOCK | CAP_PEER_INFLIGHT | CAP_TURNS, Ordering::Relaxed);
                    rec.state.store(1, Ordering::Release);
                    r.high_water.fetch_max(i as u32 + 1, Ordering::AcqRel);
                    return Ok(ProcSlot { index: i });
                }
                Ok(false) => continue,
                Err(e) => return Err(AbiError::Io(self.path.clone(), e)),
            }
        }
        Err(AbiError::Full(self.path.clone()))
    }

    /// Detaches: zeroes the record and drops its lock.
    pub fn release(&self, slot: ProcSlot) {
        let _g = foreign_guard();
        self.reset_record(slot.index);
        self.own[slot.index / 64].fetch_and(!(1 << (slot.index % 64)), Ordering::AcqRel);
        let _ = map::unlock_byte(&self.file, Self::lock_offset(slot.index));
    }

    /// Zeroes record `i` and frees charge locks it held. Caller holds its record lock.
    fn reset_record(&self, i: usize) -> Reclaimed {
        let r = self.region();
        let rec = &r.procs[i];
        rec.state.store(0, Ordering::Release);
        let n = self.n_devices();
        let charged: Vec<u64> = (0..n).map(|d| rec.charged[d].swap(0, Ordering::AcqRel)).collect();
        for d in 0..MAX_DEVICES {
            rec.charged[d].store(0, Ordering::Relaxed);
            rec.gpu_time_ns[d].store(0, Ordering::Relaxed);
            rec.launches[d].store(0, Ordering::Relaxed);
            rec.throttled_ns[d].store(0, Ordering::Relaxed);
            let _ = r.charge_locks[d].compare_exchange(i as u32 + 1, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
        rec.caps.store(0, Ordering::Relaxed);
        for w in &rec.inflight_us {
            w.store(0, Ordering::Relaxed);
        }
        rec.gate_ns.store(0, Ordering::Relaxed);
        rec.turn_since.store(0, Ordering::Relaxed);
        rec.turn_poll_ns.store(0, Ordering::Relaxed);
        rec.turn_bell.store(0, Ordering::Relaxed);
        rec.reserved.store(0, Ordering::Relaxed);
        let pid = rec.pid.swap(0, Ordering::AcqRel);
        Reclaimed { index: i, pid, charged }
    }

    /// Reclaims every record whose owner is dead. Safe to run from any
    /// process at any time (the node agent every few hundred ms; a hook when
    /// an allocation would fail). `skip` is the caller's own record, if any.
    pub fn sweep(&self, skip: Option<usize>) -> Vec<Reclaimed> {
        let r = self.region();
        let hw = (r.high_water.load(Ordering::Acquire) as usize).min(MAX_PROCS);
        let mut out = Vec::new();
        let _g = foreign_guard();
        for i in 0..hw {
            if Some(i) == skip || self.is_own(i) || r.procs[i].state.load(Ordering::Acquire) == 0 {
                continue;
            }
            if let Ok(true) = map::try_lock_byte(&self.file, Self::lock_offset(i)) {
                // We hold the record's lock, so its owner is gone and nobody can claim it meanwhile.
                if r.procs[i].state.load(Ordering::Acquire) != 0 {
                    out.push(self.reset_record(i));
                }
                let _ = map::unlock_byte(&self.file, Self::lock_offset(i));
            }
        }
        out
    }

    /// Sum of all records' charges on slice device `dev`.
    pub fn used(&self, dev: usize) -> u64 {
        let r = self.region();
        let hw = (r.high_water.load(Ordering::Acquire) as usize).min(MAX_PROCS);
        // Saturating: the words are the workload's to write.
        r.procs[..hw].iter().fold(0u64, |a, p| a.saturating_add(p.charged[dev].load(Ordering::Acquire)))
    }

    fn lock_charge(&self, me: usize, dev: usize) -> Result<(), ChargeError> {
        self.lock_charge_within(me, dev, CHARGE_LOCK_PATIENCE)
    }

    /// [`Self::lock_charge`] waiting at most `patience` for a live owner.
    /// It spins first (a holder runs for nanoseconds), then sleeps in short
    /// steps, so a waiter on a stopped holder does not burn a core.
    fn lock_charge_within(&self, me: usize, dev: usize, patience: std::time::Duration) -> Result<(), ChargeError> {
        let l = &self.region().charge_locks[dev];
        let mine = me as u32 + 1;
        let mut spins: u32 = 0;
        // Since when the current owner has held it (a new owner starts the
        // patience again: a waiter that keeps losing to others is not
        // refused).
        let mut since: Option<(u32, std::time::Instant)> = None;
        // Another thread of this process holds it: it will release.
        // Another process: take over only if it is dead.
        let take_over = |owner: u32| owner != 0 && owner != mine && !self.is_own(owner as usize - 1) && !self.owned_by_other(owner as usize - 1) && self.take_over(owner, mine, dev);
        loop {
            match l.compare_exchange_weak(0, mine, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(owner) => {
                    spins = spins.wrapping_add(1);
                    if spins < 1 << 14 {
                        if spins.is_multiple_of(128) {
                            std::thread::yield_now();
                        } else {
                            std::hint::spin_loop();
                        }
                    } else {
                        let t = match since {
                            Some((o, t)) if o == owner => t,
                            _ => since.insert((owner, std::time::Instant::now())).1,
                        };
                        if t.elapsed() >= patience && owner != 0 {
                            // One last look: a holder that died meanwhile is taken over.
                            if take_over(owner) {
                                return Ok(());
                            }
                            let pid = self.region().procs.get(owner as usize - 1).map_or(0, |r| r.pid.load(Ordering::Relaxed));
                            return Err(ChargeError::LockHeld { pid });
                        }
                        std::thread::sleep(std::time::Duration::from_micros(200));
                    }
                    if spins.is_multiple_of(2048) && take_over(owner) {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Takes charge lock `dev` from `owner`, whose record looked dead.
    ///
    /// The compare-and-swap runs while this process holds the owner's record
    /// lock. Without it, a new process could claim that record between the
    /// liveness check and the swap, clear the stale word, and take the charge
    /// lock under the very same value (`1 + index`): the swap would then
    /// succeed against a live owner and put two processes in the section.
    fn take_over(&self, owner: u32, mine: u32, dev: usize) -> bool {
        let i = owner as usize - 1;
        let l = &self.region().charge_locks[dev];
        if i >= MAX_PROCS {
            // Not a record index at all (a corrupted word): nobody can own it.
            return l.compare_exchange(owner, mine, Ordering::Acquire, Ordering::Relaxed).is_ok();
        }
        let _g = foreign_guard();
        if !matches!(map::try_lock_byte(&self.file, Self::lock_offset(i)), Ok(true)) {
            return false;
        }
        let took = l.compare_exchange(owner, mine, Ordering::Acquire, Ordering::Relaxed).is_ok();
        let _ = map::unlock_byte(&self.file, Self::lock_offset(i));
        took
    }

    fn unlock_charge(&self, me: usize, dev: usize) {
        let _ = self.region().charge_locks[dev].compare_exchange(me as u32 + 1, 0, Ordering::Release, Ordering::Relaxed);
    }

    /// Charges `bytes` on slice device `dev` to `slot` if the slice's total
    /// stays within `limit`. Returns the new total.
    pub fn try_charge(&self, slot: &ProcSlot, dev: usize, bytes: u64, limit: u64) -> Result<u64, ChargeError> {
        let r = self.try_charge_with(slot, dev, bytes, &|| limit);
        if matches!(r, Err(ChargeError::OverLimit { .. })) {
            self.count_refusal(dev);
        }
        r
    }

    /// Counts one allocation refused on device `dev` (`refused`).
    pub fn count_refusal(&self, dev: usize) {
        if dev < self.n_devices() {
            self.region().refused[dev].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// [`UsageFile::try_charge`] with the limit read by `limit()` *inside*
    /// the charge lock. `egpud` relies on this when it lowers a limit to take
    /// back burst memory: once it has seen the device's charge lock free
    /// after publishing the lower limit, every later charge checks against
    /// it, and every earlier one is in the records. Refusals are not
    /// counted here (the caller counts an allocation it finally refuses,
    /// [`UsageFile::count_refusal`]).
    pub fn try_charge_with(&self, slot: &ProcSlot, dev: usize, bytes: u64, limit: &dyn Fn() -> u64) -> Result<u64, ChargeError> {
        if dev >= self.n_devices() {
            return Err(ChargeError::BadDevice(dev));
        }
        self.lock_charge(slot.index, dev)?;
        // Unlocks however this returns (a panicking `limit` included).
        struct Unlock<'a>(&'a UsageFile, usize, usize);
        impl Drop for Unlock<'_> {
            fn drop(&mut self) {
                self.0.unlock_charge(self.1, self.2);
            }
        }
        let _unlock = Unlock(self, slot.index, dev);
        // Pairs with the fence in `charge_lock_free`: either `egpud` sees this
        // lock taken, or this read sees the limit it published before looking.
        fence(Ordering::SeqCst);
        let limit = limit();
        let used = self.used(dev);
        match used.checked_add(bytes) {
            Some(total) if total <= limit => {
                self.region().procs[slot.index].charged[dev].fetch_add(bytes, Ordering::AcqRel);
                Ok(total)
            }
            _ => Err(ChargeError::OverLimit { used, requested: bytes, limit }),
        }
    }

    /// Asks `egpud` to raise the limit of device `dev` to at least `bytes`
    /// (see [`UsageRegion::mem_want`]).
    pub fn want_memory(&self, dev: usize, bytes: u64) {
        if dev < self.n_devices() {
            self.region().mem_want[dev].fetch_max(bytes, Ordering::AcqRel);
        }
    }

    /// The pending request of device `dev` (0: none).
    pub fn wanted_memory(&self, dev: usize) -> u64 {
        if dev < self.n_devices() { self.region().mem_want[dev].load(Ordering::Acquire) } else { 0 }
    }

    /// `egpud`: clears the request of device `dev` once answered, if it is
    /// still `seen` (a larger request posted meanwhile stays for the next
    /// answer). Call it only after publishing any new limit.
    pub fn clear_memory_want(&self, dev: usize, seen: u64) {
        if dev < self.n_devices() {
            let _ = self.region().mem_want[dev].compare_exchange(seen, 0, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// Whether some live process other than the caller has a record without
    /// capability `cap` ([`ProcRecord::caps`]).
    pub fn live_record_lacks(&self, cap: u64) -> bool {
        let r = self.region();
        let hw = (r.high_water.load(Ordering::Acquire) as usize).min(MAX_PROCS);
        (0..hw).any(|i| r.procs[i].state.load(Ordering::Acquire) != 0 && r.procs[i].caps.load(Ordering::Acquire) & cap != cap && self.owned_by_other(i))
    }

    /// Whether no live process holds the charge lock of device `dev` now (a
    /// lock word left by a dead owner counts as free).
    pub fn charge_lock_free(&self, dev: usize) -> bool {
        if dev >= self.n_devices() {
            return true;
        }
        // Pairs with the fence in `try_charge_with` (store-buffer pattern:
        // the caller published a limit, a hook took the lock).
        fence(Ordering::SeqCst);
        match self.region().charge_locks[dev].load(Ordering::Acquire) {
            0 => true,
            // A word no record can hold (the file is the workload's to write): not free.
            owner if owner as usize > MAX_PROCS => false,
            owner => !self.owned_by_other(owner as usize - 1),
        }
    }

    /// Returns `bytes` on `dev` from `slot`'s record (saturating at zero).
    pub fn uncharge(&self, slot: &ProcSlot, dev: usize, bytes: u64) {
        if dev >= self.n_devices() {
            return;
        }
        let c = &self.region().procs[slot.index].charged[dev];
        let _ = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_sub(bytes)));
    }

    /// The record owned by `slot`, for counters other than memory.
    pub fn record(&self, slot: &ProcSlot) -> &ProcRecord {
        &self.region().procs[slot.index]
    }

    /// Copies of every attached record.
    pub fn processes(&self) -> Vec<ProcView> {
        let r = self.region();
        let n = self.n_devices();
        let hw = (r.high_water.load(Ordering::Acquire) as usize).min(MAX_PROCS);
        let load = |a: &[AtomicU64; MAX_DEVICES]| a[..n].iter().map(|v| v.load(Ordering::Relaxed)).collect::<Vec<_>>();
        (0..hw)
            .filter(|&i| r.procs[i].state.load(Ordering::Acquire) != 0)
            .map(|i| {
                let p = &r.procs[i];
                let record_pid = p.pid.load(Ordering::Relaxed);
                // Like `owned_by_other`, an error counts as alive.
                let owner = map::byte_lock_owner(&self.file, Self::lock_offset(i)).unwrap_or(Some(0));
                ProcView {
                    index: i,
                    // The lock owner's pid is in the reader's pid namespace
                    // (the one NVML's host pids match when the reader runs on
                    // the host); the record's is the process's own view.
                    pid: owner.filter(|&pid| pid != 0).unwrap_or(record_pid),
                    record_pid,
                    owner_pid: owner.filter(|&pid| pid != 0),
                    alive: owner.is_some(),
                    charged: load(&p.charged),
                    gpu_time_ns: load(&p.gpu_time_ns),
                    launches: load(&p.launches),
                    throttled_ns: load(&p.throttled_ns),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charge_within_limit_only() {
        let dir = tempfile::tempdir().unwrap();
        let u = UsageFile::create(&dir.path().join("usage"), 2).unwrap();
        let s = u.claim(std::process::id()).unwrap();
        assert_eq!(u.try_charge(&s, 0, 600, 1000), Ok(600));
        assert_eq!(u.try_charge(&s, 0, 401, 1000), Err(ChargeError::OverLimit { used: 600, requested: 401, limit: 1000 }));
        assert_eq!(u.try_charge(&s, 0, 400, 1000), Ok(1000));
        assert_eq!(u.try_charge(&s, 1, 1, 1000), Ok(1));
        assert_eq!(u.try_charge(&s, 2, 1, 1000), Err(ChargeError::BadDevice(2)));
        assert_eq!(u.try_charge(&s, 0, u64::MAX, u64::MAX), Err(ChargeError::OverLimit { used: 1000, requested: u64::MAX, limit: u64::MAX }));
        u.uncharge(&s, 0, 1000);
        assert_eq!(u.used(0), 0);
        u.uncharge(&s, 0, 5);
        assert_eq!(u.used(0), 0, "uncharge saturates");
        assert_eq!(u.region().refused[0].load(Ordering::Relaxed), 2);
    }

    #[test]
    fn threads_never_exceed_limit() {
        let dir = tempfile::tempdir().unwrap();
        let u = UsageFile::create(&dir.path().join("usage"), 1).unwrap();
        let s = u.claim(1).unwrap();
        let limit = 10_000;
        std::thread::scope(|sc| {
            for t in 0..4u64 {
                let (u, s) = (&u, &s);
                sc.spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..5_000u64 {
                        let sz = 1 + (i * 7919 + t * 31) % 900;
                        if u.try_charge(s, 0, sz, limit).is_ok() {
                            held.push(sz);
                        }
                        assert!(u.used(0) <= limit);
                        if i % 3 == 0
                            && let Some(x) = held.pop()
                        {
                            u.uncharge(s, 0, x);
                        }
                    }
                    for x in held {
                        u.uncharge(s, 0, x);
                    }
                });
            }
        });
        assert_eq!(u.used(0), 0);
    }

    #[test]
    fn release_and_reclaim() {
        let dir = tempfile::tempdir().unwrap();
        let u = UsageFile::create(&dir.path().join("usage"), 1).unwrap();
        let a = u.claim(10).unwrap();
        u.try_charge(&a, 0, 5, 100).unwrap();
        assert_eq!(u.processes().len(), 1);
        // Our own record is never reclaimed by our own sweep even though F_GETLK can't see our lock.
        assert!(u.sweep(Some(a.index)).is_empty());
        u.release(a);
        assert_eq!(u.used(0), 0);
        assert!(u.processes().is_empty());
    }

    #[test]
    fn own_records_are_never_taken_for_dead() {
        // F_GETLK does not report this process's own locks: neither a sweep
        // nor a charge-lock takeover may treat our records as a dead process's.
        let dir = tempfile::tempdir().unwrap();
        let u = UsageFile::create(&dir.path().join("usage"), 1).unwrap();
        let a = u.claim(1).unwrap();
        let b = u.claim(1).unwrap();
        u.try_charge(&a, 0, 5, 100).unwrap();
        u.try_charge(&b, 0, 7, 100).unwrap();
        assert!(u.sweep(None).is_empty(), "a sweep must skip records this process owns");
        assert_eq!(u.used(0), 12);
        // `b` holds the charge lock; `a` must wait for it, not steal it.
        let word = &u.region().charge_locks[0];
        word.store(b.index as u32 + 1, Ordering::Release);
        std::thread::scope(|sc| {
            let h = sc.spawn(|| u.try_charge(&a, 0, 1, 100));
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert_eq!(word.load(Ordering::Acquire), b.index as u32 + 1, "charge lock of a live record was taken over");
            word.store(0, Ordering::Release);
            assert_eq!(h.join().unwrap(), Ok(13));
        });
        // A corrupted word that names no record is taken over.
        word.store(MAX_PROCS as u32 + 9, Ordering::Release);
        assert_eq!(u.try_charge(&a, 0, 1, 100), Ok(14));
        u.release(a);
        u.release(b);
        assert_eq!(u.used(0), 0);
    }

    #[test]
    fn arbiter_fields_keep_the_v1_layout() {
        use std::mem::{offset_of, size_of};
        // The arbiter words were carved out of reserved space: sizes and
        // neighbours must not move.
        assert_eq!(offset_of!(UsageRegion, throttle_waits), offset_of!(UsageRegion, consumed_ns) + 8 * MAX_DEVICES);
        assert_eq!(offset_of!(UsageRegion, procs), (offset_of!(UsageRegion, throttle_waits) + 8 * 32).next_multiple_of(64));
        use crate::limits::DeviceLimits;
        assert_eq!(offset_of!(DeviceLimits, allowance_ns), offset_of!(DeviceLimits, budget_ns) + 8);
        assert_eq!(offset_of!(DeviceLimits, mem_guarantee) + 8, offset_of!(DeviceLimits, budget_ns) + 8 + 8 * 8);
        assert_eq!(offset_of!(DeviceLimits, mem_burst) + 8, offset_of!(DeviceLimits, mem_untracked));
        assert_eq!(offset_of!(DeviceLimits, mem_untracked) + 8, offset_of!(DeviceLimits, mem_guarantee));
        assert_eq!(size_of::<DeviceLimits>(), 192);
        use crate::limits::LimitsRegion;
        assert_eq!(offset_of!(LimitsRegion, spec_rev), 120);
        assert_eq!(offset_of!(LimitsRegion, spec_rev) + 8, offset_of!(LimitsRegion, reserved));
        assert_eq!(offset_of!(LimitsRegion, devices), 192);
        assert_eq!(offset_of!(UsageRegion, mem_want), offset_of!(UsageRegion, throttle_waits) + 8 * MAX_DEVICES);
        assert_eq!(offset_of!(ProcRecord, caps) + 8, offset_of!(ProcRecord, inflight_us));
        // inflight_us, gate_ns and the rest took the 7 reserved words of ABI v1
        // and the 40 bytes of tail padding after them: the record's size stays.
        assert_eq!(offset_of!(ProcRecord, inflight_us), offset_of!(ProcRecord, throttled_ns) + 8 * MAX_DEVICES + 8);
        assert_eq!(offset_of!(ProcRecord, gate_ns), offset_of!(ProcRecord, inflight_us) + 4 * MAX_DEVICES);
        assert_eq!(offset_of!(ProcRecord, turn_since), offset_of!(ProcRecord, gate_ns) + 8);
        assert_eq!(offset_of!(ProcRecord, turn_poll_ns), offset_of!(ProcRecord, turn_since) + 8);
        assert_eq!(offset_of!(ProcRecord, turn_bell), offset_of!(ProcRecord, turn_poll_ns) + 8);
        assert_eq!(offset_of!(ProcRecord, reserved) + 4, size_of::<ProcRecord>());
        assert_eq!(size_of::<ProcRecord>(), 640);
        assert_eq!(size_of::<DeviceLimits>() % 64, 0);
    }

    #[test]
    fn rejects_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("usage");
        UsageFile::create(&p, 1).unwrap();
        let mut b = std::fs::read(&p).unwrap();
        b[8] = 7;
        std::fs::write(&p, &b).unwrap();
        assert!(matches!(UsageFile::open(&p), Err(AbiError::Version { found: 7, .. })));
        std::fs::write(&p, vec![0u8; 100]).unwrap();
        assert!(matches!(UsageFile::open(&p), Err(AbiError::Corrupt(..))));
        assert!(matches!(UsageFile::create(&dir.path().join("u2"), 0), Err(AbiError::BadDevice(0))));
    }
}
