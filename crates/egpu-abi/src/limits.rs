//! The *limits* region: what a slice may use, written by `egpud` only.
//!
//! Every field is an atomic, so any number of processes may map the file
//! while `egpud` writes it. Fields fall in three groups:
//!
//! - immutable after the file is published (magic, version, size, name,
//!   device count, device UUIDs and host indices): written before the file is
//!   renamed into place;
//! - seqlocked (state, priority, per-device memory limit, compute share and
//!   limit): a writer makes `seq` odd, stores, makes it even again; a reader
//!   retries until it reads the same even `seq` before and after. A reader's
//!   hot path is one acquire load of `seq`, compared with its cached value;
//! - arbiter fields (`budget_epoch`, `budget_ns`, `allowance_ns`,
//!   `epoch_start_ns`, `queue_launches`, `queue_ns`, `scale_ppm`, the agent
//!   heartbeat, the arbiter period), each meaningful on its own, stored
//!   without the seqlock (see `docs/compute-arbiter.md`).

use crate::map::{self, Mapping};
use crate::{AbiError, LIMITS_MAGIC, ABI_VERSION, MAX_DEVICES, NAME_LEN, UUID_LEN};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering, fence};

/// One device of the slice.
#[repr(C, align(64))]
pub struct DeviceLimits {
    /// Device UUID, NUL-padded (immutable).
    pub uuid: [AtomicU8; UUID_LEN],
    /// Node-local device index, NVML order (immutable).
    pub host_index: AtomicU32,
    /// Compute share in basis points (seqlocked).
    pub compute_share_bps: AtomicU32,
    /// Hard memory limit in bytes (seqlocked).
    pub mem_limit: AtomicU64,
    /// Compute cap in basis points (seqlocked).
    pub compute_limit_bps: AtomicU32,
    _pad: AtomicU32,
    /// Arbiter: the period number the budget below belongs to.
    pub budget_epoch: AtomicU64,
    /// Arbiter: GPU time in ns the whole slice may use on this device in that period.
    pub budget_ns: AtomicU64,
    /// Arbiter: cumulative GPU-time allowance of the whole slice on this
    /// device, in the hook's measured ns (the unit of `UsageRegion::consumed_ns`).
    /// A launch may start while `consumed_ns` plus the launcher's unfinished
    /// work is below it. Set each period to the slice's `consumed_ns` at the
    /// tick plus its budget, so unused allowance is not banked (it may
    /// decrease). Ignored while `arbiter_period_ns` is 0.
    pub allowance_ns: AtomicU64,
    /// Arbiter: CLOCK_MONOTONIC ns at which the epoch `budget_epoch` started;
    /// the next allowance is due at `epoch_start_ns + arbiter_period_ns`.
    pub epoch_start_ns: AtomicU64,
    /// Arbiter: most unfinished launches one process may keep queued on this
    /// device (0: no bound).
    pub queue_launches: AtomicU64,
    /// Arbiter: most unfinished estimated GPU time (measured ns) one process
    /// may keep queued on this device (0: no bound).
    pub queue_ns: AtomicU64,
    /// Arbiter: measured-to-true GPU time ratio it applied, parts per million
    /// (informational: `egpu top`, metrics).
    pub scale_ppm: AtomicU64,
    /// Burst cap in bytes: the most the memory limit may be raised to by
    /// borrowing from the device's burst pool (0: the slice does not burst).
    /// Written by `egpud` before the limits it goes with; the hook only uses
    /// it to decide whether asking for a grant can help (`egpud` checks every
    /// grant itself). Carved out of reserved space: zero in older tables.
    pub mem_burst: AtomicU64,
    /// Memory the driver reports for the slice's processes on this device
    /// beyond what their usage records charge (bytes; `egpud`'s memory audit
    /// with `--memory-audit charge`, else 0). The hook counts it as used: in
    /// admission (inside the charge lock) and in the memory it reports.
    /// Written by `egpud` alone, not seqlocked. Carved out of reserved space:
    /// zero in older tables.
    pub mem_untracked: AtomicU64,
    /// The slice's memory guarantee on this device in bytes (seqlocked;
    /// written by [`LimitsWriter::publish_spec`]). The hook does not read it:
    /// `mem_limit` is the guarantee plus any burst grant, and this word is
    /// what lets a restarted `egpud` tell the two apart when it takes the
    /// slice's spec back from the file ([`LimitsRegion::published_spec`]).
    /// Carved out of reserved space: zero in older tables.
    pub mem_guarantee: AtomicU64,
}

/// The whole limits file.
#[repr(C, align(64))]
pub struct LimitsRegion {
    pub magic: AtomicU64,
    pub abi_version: AtomicU32,
    pub region_size: AtomicU32,
    pub name: [AtomicU8; NAME_LEN],
    pub n_devices: AtomicU32,
    /// [`SliceState`] code (seqlocked).
    pub state: AtomicU32,
    /// Seqlock sequence: odd while a write is in progress.
    pub seq: AtomicU64,
    /// Priority code of `egpu_core::Priority` (seqlocked).
    pub priority: AtomicU32,
    _pad: AtomicU32,
    /// `egpud`'s last sign of life, CLOCK_MONOTONIC ns.
    pub agent_heartbeat_ns: AtomicU64,
    /// Arbiter period in ns; 0 while no arbiter runs.
    pub arbiter_period_ns: AtomicU64,
    /// Revision of the slice's spec that the seqlocked values publish
    /// (seqlocked; written by [`LimitsWriter::publish_spec`]): `egpud`
    /// stores the same number with the spec, one higher at every change, and
    /// commits it before it publishes. A file ahead of the store means the
    /// store lost its last commit. The hook does not read it. Carved out of
    /// reserved space: zero in older tables.
    pub spec_rev: AtomicU64,
    pub reserved: [AtomicU64; 7],
    pub devices: [DeviceLimits; MAX_DEVICES],
}

/// Lifecycle of a slice as the hook sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SliceState {
    Active,
    /// The slice was removed: refuse new allocations, keep running.
    Deleted,
}

impl SliceState {
    fn code(self) -> u32 {
        match self {
            SliceState::Active => 1,
            SliceState::Deleted => 2,
        }
    }
    fn from_code(c: u32) -> SliceState {
        if c == 1 { SliceState::Active } else { SliceState::Deleted }
    }
}

/// A consistent copy of one device's seqlocked limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceLimitsSnapshot {
    pub host_index: u32,
    pub mem_limit: u64,
    pub compute_share_bps: u32,
    pub compute_limit_bps: u32,
}

/// A consistent copy of the seqlocked part of the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitsSnapshot {
    pub seq: u64,
    pub state: SliceState,
    pub priority: u32,
    pub n_devices: usize,
    pub devices: [DeviceLimitsSnapshot; MAX_DEVICES],
}

impl LimitsSnapshot {
    pub fn devices(&self) -> &[DeviceLimitsSnapshot] {
        &self.devices[..self.n_devices]
    }
}

/// A slice's spec as `egpud` last published it ([`LimitsRegion::published_spec`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedSpec {
    /// [`LimitsRegion::spec_rev`]; 0 in a table no `publish_spec` wrote.
    pub rev: u64,
    pub priority: u32,
    pub devices: Vec<PublishedDevice>,
}

/// One device of a [`PublishedSpec`], in slice order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedDevice {
    pub uuid: String,
    pub host_index: u32,
    pub mem_guarantee: u64,
    pub mem_burst: u64,
    pub compute_share_bps: u32,
    pub compute_limit_bps: u32,
}

/// What `egpud` publishes for one device when it creates a slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInit {
    pub uuid: String,
    pub host_index: u32,
    pub limits: DeviceLimitsSnapshot,
}

fn region_len() -> usize {
    let page = 4096;
    std::mem::size_of::<LimitsRegion>().div_ceil(page) * page
}

fn store_str(dst: &[AtomicU8], s: &str) {
    let b = s.as_bytes();
    for (i, slot) in dst.iter().enumerate() {
        slot.store(if i < b.len() && i + 1 < dst.len() { b[i] } else { 0 }, Ordering::Relaxed);
    }
}

fn load_str(src: &[AtomicU8]) -> String {
    let bytes: Vec<u8> = src.iter().map(|b| b.load(Ordering::Relaxed)).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// How long a reader waits on an odd `seq` that does not move before it
/// takes the writer for dead (see [`LimitsRegion::snapshot`]).
pub const DEAD_WRITER_NS: u64 = 100_000_000;

impl LimitsRegion {
    /// Reads the seqlocked fields consistently. Only `egpud` writes, and a
    /// write is a handful of stores, so a reader normally spins for at most
    /// that long. A writer killed mid-write leaves `seq` odd until the next
    /// `egpud` publishes again: once the same odd value has stood for
    /// [`DEAD_WRITER_NS`], the reader takes the values as they are (each field
    /// is an atomic, so each is a value `egpud` wrote, old or new) rather than
    /// hang every workload of the slice until the agent restarts.
    pub fn snapshot(&self) -> LimitsSnapshot {
        self.snapshot_knowing(&AtomicU64::new(0))
    }

    /// [`Self::snapshot`] for a reader that remembers, in `dead`, the odd
    /// `seq` it has already waited out: while that value stands, it reads at
    /// once instead of waiting [`DEAD_WRITER_NS`] again on every read. (A
    /// new writer never reuses it: [`LimitsWriter`] starts from the next
    /// odd value.)
    pub fn snapshot_knowing(&self, dead: &AtomicU64) -> LimitsSnapshot {
        let mut odd_since: Option<(u64, u64)> = None;
        let mut spins = 0u32;
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                let now = crate::monotonic_ns();
                let stale = dead.load(Ordering::Relaxed) == s1
                    || match odd_since {
                        Some((seq, since)) if seq == s1 => now.saturating_sub(since) >= DEAD_WRITER_NS,
                        _ => {
                            odd_since = Some((s1, now));
                            false
                        }
                    };
                if stale {
                    dead.store(s1, Ordering::Relaxed);
                } else {
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(64) {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                    continue;
                }
            }
            let n = (self.n_devices.load(Ordering::Relaxed) as usize).min(MAX_DEVICES);
            let mut devices = [DeviceLimitsSnapshot::default(); MAX_DEVICES];
            for (d, out) in self.devices[..n].iter().zip(devices.iter_mut()) {
                *out = DeviceLimitsSnapshot {
                    host_index: d.host_index.load(Ordering::Relaxed),
                    mem_limit: d.mem_limit.load(Ordering::Relaxed),
                    compute_share_bps: d.compute_share_bps.load(Ordering::Relaxed),
                    compute_limit_bps: d.compute_limit_bps.load(Ordering::Relaxed),
                };
            }
            let state = SliceState::from_code(self.state.load(Ordering::Relaxed));
            let priority = self.priority.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s1 {
                return LimitsSnapshot { seq: s1, state, priority, n_devices: n, devices };
            }
        }
    }

    /// The spec `egpud` last published, read for a restarted `egpud` to
    /// check its store against: the revision, priority, guarantees, burst
    /// caps and compute shares and caps, all from one seqlock generation.
    /// `None` when `seq` is odd or moves during the read: a writer died in
    /// the middle of a publish (or one is running), so the values may be
    /// half old and half new and say nothing reliable. The burst caps are
    /// written before the seqlocked values they go with
    /// ([`LimitsWriter::set_mem_burst`]), so a generation's caps are in
    /// place once its `seq` is even.
    pub fn published_spec(&self) -> Option<PublishedSpec> {
        let s1 = self.seq.load(Ordering::Acquire);
        if s1 & 1 == 1 {
            return None;
        }
        let n = (self.n_devices.load(Ordering::Relaxed) as usize).min(MAX_DEVICES);
        let devices = self.devices[..n]
            .iter()
            .map(|d| PublishedDevice {
                uuid: load_str(&d.uuid),
                host_index: d.host_index.load(Ordering::Relaxed),
                mem_guarantee: d.mem_guarantee.load(Ordering::Relaxed),
                mem_burst: d.mem_burst.load(Ordering::Relaxed),
                compute_share_bps: d.compute_share_bps.load(Ordering::Relaxed),
                compute_limit_bps: d.compute_limit_bps.load(Ordering::Relaxed),
            })
            .collect();
        let spec = PublishedSpec { rev: self.spec_rev.load(Ordering::Relaxed), priority: self.priority.load(Ordering::Relaxed), devices };
        fence(Ordering::Acquire);
        (self.seq.load(Ordering::Relaxed) == s1).then_some(spec)
    }

    /// The slice name (immutable).
    pub fn name(&self) -> String {
        load_str(&self.name)
    }

    /// UUID of slice device `i` (immutable).
    pub fn device_uuid(&self, i: usize) -> String {
        load_str(&self.devices[i].uuid)
    }

    fn validate(m: &Mapping, path: &Path) -> Result<(), AbiError> {
        let b = m.bytes();
        if b.len() < 16 {
            return Err(AbiError::Corrupt(path.into(), "file shorter than its header"));
        }
        let word = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        if word(0) != LIMITS_MAGIC {
            return Err(AbiError::Corrupt(path.into(), "not a limits file: bad magic number"));
        }
        let version = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        if version != ABI_VERSION {
            return Err(AbiError::Version { path: path.into(), found: version, expected: ABI_VERSION });
        }
        let size = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes")) as usize;
        if size != std::mem::size_of::<LimitsRegion>() || b.len() < size {
            return Err(AbiError::Corrupt(path.into(), "region size does not match this ABI version"));
        }
        let n = u32::from_le_bytes(b[std::mem::offset_of!(LimitsRegion, n_devices)..][..4].try_into().expect("4 bytes"));
        if n as usize > MAX_DEVICES || n == 0 {
            return Err(AbiError::Corrupt(path.into(), "device count out of range"));
        }
        Ok(())
    }
}

fn open_mapping(path: &Path, writable: bool) -> Result<Mapping, AbiError> {
    let file = std::fs::OpenOptions::new().read(true).write(writable).open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => AbiError::Missing(path.into()),
        _ => AbiError::Io(path.into(), e),
    })?;
    let len = file.metadata().map_err(|e| AbiError::Io(path.into(), e))?.len() as usize;
    if len < std::mem::size_of::<LimitsRegion>() {
        // Still read the header if there is one, to report a version mismatch as such.
        if len >= 16 {
            let m = Mapping::map(&file, len, false).map_err(|e| AbiError::Io(path.into(), e))?;
            LimitsRegion::validate(&m, path)?;
        }
        return Err(AbiError::Corrupt(path.into(), "file shorter than the limits region"));
    }
    let m = Mapping::map(&file, len, writable).map_err(|e| AbiError::Io(path.into(), e))?;
    LimitsRegion::validate(&m, path)?;
    Ok(m)
}

/// A workload's read-only view of its slice's limits.
pub struct LimitsReader {
    map: Mapping,
    path: PathBuf,
    /// The odd `seq` of a writer this reader found dead (0: none).
    dead_seq: AtomicU64,
}

impl LimitsReader {
    /// Opens `path` read-only and checks magic, version and size.
    pub fn open(path: &Path) -> Result<LimitsReader, AbiError> {
        Ok(LimitsReader { map: open_mapping(path, false)?, path: path.into(), dead_seq: AtomicU64::new(0) })
    }

    pub fn region(&self) -> &LimitsRegion {
        self.map.view()
    }

    /// The hot-path check: the current sequence number (acquire).
    #[inline]
    pub fn seq(&self) -> u64 {
        self.region().seq.load(Ordering::Acquire)
    }

    /// [`LimitsRegion::snapshot`], waiting out a dead writer once per reader.
    pub fn snapshot(&self) -> LimitsSnapshot {
        self.region().snapshot_knowing(&self.dead_seq)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `egpud`'s handle on a slice's limits file.
pub struct LimitsWriter {
    map: Mapping,
    _file: File,
    path: PathBuf,
}

impl LimitsWriter {
    /// Creates the file atomically (temp file + rename), mode 0644, fully published.
    pub fn create(path: &Path, name: &str, priority: u32, devices: &[DeviceInit]) -> Result<LimitsWriter, AbiError> {
        if devices.is_empty() || devices.len() > MAX_DEVICES {
            return Err(AbiError::BadDevice(devices.len()));
        }
        map::create_atomically(path, region_len(), 0o644, |m| {
            let r: &LimitsRegion = m.view();
            store_str(&r.name, name);
            r.n_devices.store(devices.len() as u32, Ordering::Relaxed);
            for (d, init) in r.devices.iter().zip(devices) {
                store_str(&d.uuid, &init.uuid);
                d.host_index.store(init.host_index, Ordering::Relaxed);
                d.mem_limit.store(init.limits.mem_limit, Ordering::Relaxed);
                d.compute_share_bps.store(init.limits.compute_share_bps, Ordering::Relaxed);
                d.compute_limit_bps.store(init.limits.compute_limit_bps, Ordering::Relaxed);
            }
            r.priority.store(priority, Ordering::Relaxed);
            r.state.store(SliceState::Active.code(), Ordering::Relaxed);
            r.seq.store(2, Ordering::Relaxed);
            r.region_size.store(std::mem::size_of::<LimitsRegion>() as u32, Ordering::Relaxed);
            r.abi_version.store(ABI_VERSION, Ordering::Relaxed);
            r.magic.store(LIMITS_MAGIC, Ordering::Release);
        })
        .map_err(|e| AbiError::Io(path.into(), e))?;
        Self::open(path)
    }

    /// Opens an existing file for writing (a restarted `egpud` adopting a slice).
    pub fn open(path: &Path) -> Result<LimitsWriter, AbiError> {
        let map = open_mapping(path, true)?;
        let file = std::fs::OpenOptions::new().read(true).write(true).open(path).map_err(|e| AbiError::Io(path.into(), e))?;
        Ok(LimitsWriter { map, _file: file, path: path.into() })
    }

    pub fn region(&self) -> &LimitsRegion {
        self.map.view()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn snapshot(&self) -> LimitsSnapshot {
        self.region().snapshot()
    }

    /// Publishes new limits for every device (in slice order: its host
    /// index too, which follows a GPU renumbered at a restart) and a
    /// priority, and marks the slice active: a slice `egpud` publishes is live (a
    /// delete that found a process attaching after it marked the slice
    /// deleted, or a crash between the two, leaves it active again).
    /// Only one thread of one process may write; `egpud` serialises its writes.
    pub fn publish(&self, priority: u32, devices: &[DeviceLimitsSnapshot]) -> Result<u64, AbiError> {
        self.publish_with(priority, devices, None)
    }

    /// [`LimitsWriter::publish`], and in the same seqlock generation the
    /// spec's revision and each device's memory guarantee (`guarantees`, in
    /// slice order): what [`LimitsRegion::published_spec`] reads back.
    pub fn publish_spec(&self, priority: u32, devices: &[DeviceLimitsSnapshot], rev: u64, guarantees: &[u64]) -> Result<u64, AbiError> {
        if guarantees.len() != devices.len() {
            return Err(AbiError::BadDevice(guarantees.len()));
        }
        self.publish_with(priority, devices, Some((rev, guarantees)))
    }

    fn publish_with(&self, priority: u32, devices: &[DeviceLimitsSnapshot], spec: Option<(u64, &[u64])>) -> Result<u64, AbiError> {
        let r = self.region();
        let n = r.n_devices.load(Ordering::Relaxed) as usize;
        if devices.len() != n {
            return Err(AbiError::BadDevice(devices.len()));
        }
        Ok(self.write(|r| {
            if let Some((rev, guarantees)) = spec {
                r.spec_rev.store(rev, Ordering::Relaxed);
                for (d, g) in r.devices.iter().zip(guarantees) {
                    d.mem_guarantee.store(*g, Ordering::Relaxed);
                }
            }
            r.state.store(SliceState::Active.code(), Ordering::Relaxed);
            r.priority.store(priority, Ordering::Relaxed);
            for (d, l) in r.devices.iter().zip(devices) {
                d.host_index.store(l.host_index, Ordering::Relaxed);
                d.mem_limit.store(l.mem_limit, Ordering::Relaxed);
                d.compute_share_bps.store(l.compute_share_bps, Ordering::Relaxed);
                d.compute_limit_bps.store(l.compute_limit_bps, Ordering::Relaxed);
            }
        }))
    }

    /// Marks the slice deleted: attached processes keep running but cannot allocate.
    pub fn mark_deleted(&self) -> u64 {
        self.write(|r| r.state.store(SliceState::Deleted.code(), Ordering::Relaxed))
    }

    fn write(&self, f: impl FnOnce(&LimitsRegion)) -> u64 {
        let r = self.region();
        let s = r.seq.load(Ordering::Relaxed);
        // Recover from a writer that died mid-write (odd seq `s`): this write
        // is `s + 2`, an odd value readers have not taken for a dead writer's.
        let start = if s & 1 == 1 { s + 2 } else { s + 1 };
        r.seq.store(start, Ordering::Relaxed);
        fence(Ordering::Release);
        f(r);
        r.seq.store(start + 1, Ordering::Release);
        start + 1
    }

    /// Records that `egpud` is alive.
    pub fn heartbeat(&self) {
        self.region().agent_heartbeat_ns.store(crate::monotonic_ns(), Ordering::Release);
    }

    /// Publishes the burst cap of slice device `dev` (see
    /// [`DeviceLimits::mem_burst`]).
    pub fn set_mem_burst(&self, dev: usize, bytes: u64) {
        self.region().devices[dev].mem_burst.store(bytes, Ordering::Release);
    }

    /// Publishes the memory the audit found untracked on slice device `dev`
    /// (see [`DeviceLimits::mem_untracked`]).
    pub fn set_mem_untracked(&self, dev: usize, bytes: u64) {
        self.region().devices[dev].mem_untracked.store(bytes, Ordering::Release);
    }

    /// Publishes the arbiter's budget for slice device `dev` in period `epoch`.
    pub fn set_budget(&self, dev: usize, epoch: u64, budget_ns: u64) {
        let d = &self.region().devices[dev];
        d.budget_ns.store(budget_ns, Ordering::Relaxed);
        d.budget_epoch.store(epoch, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(i: u32, limit: u64) -> DeviceInit {
        DeviceInit {
            uuid: format!("GPU-test-{i}"),
            host_index: i,
            limits: DeviceLimitsSnapshot { host_index: i, mem_limit: limit, compute_share_bps: 2500, compute_limit_bps: 10_000 },
        }
    }

    #[test]
    fn create_publish_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("limits");
        let w = LimitsWriter::create(&p, "train", 1, &[dev(0, 1 << 30), dev(3, 2 << 30)]).unwrap();
        let r = LimitsReader::open(&p).unwrap();
        let s = r.snapshot();
        assert_eq!(s.n_devices, 2);
        assert_eq!(s.devices()[1].host_index, 3);
        assert_eq!(s.devices()[1].mem_limit, 2 << 30);
        assert_eq!(r.region().name(), "train");
        assert_eq!(r.region().device_uuid(1), "GPU-test-3");
        let before = r.seq();
        let mut v = s.devices().to_vec();
        v[0].mem_limit = 5 << 30;
        v[1].host_index = 2;
        w.publish(0, &v).unwrap();
        assert!(r.seq() > before);
        assert_eq!(r.snapshot().devices()[0].mem_limit, 5 << 30);
        assert_eq!(r.snapshot().devices()[1].host_index, 2, "the GPU renumbered: published too");
        assert_eq!(r.snapshot().priority, 0);
        assert!(matches!(w.publish(0, &v[..1]), Err(AbiError::BadDevice(1))));
        w.mark_deleted();
        assert_eq!(r.snapshot().state, SliceState::Deleted);
        // egpud publishes only live slices: a publish makes it active again
        // (a delete that found a late attacher, adoption after a crash).
        w.publish(0, &v).unwrap();
        assert_eq!(r.snapshot().state, SliceState::Active);
    }

    #[test]
    fn the_published_spec_reads_back_from_one_generation() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("limits");
        let w = LimitsWriter::create(&p, "spec", 1, &[dev(0, 1 << 30), dev(2, 2 << 30)]).unwrap();
        let r = LimitsReader::open(&p).unwrap();
        // A table no publish_spec wrote (or an older egpud's) reads revision 0.
        let old = r.region().published_spec().unwrap();
        assert_eq!((old.rev, old.devices[1].mem_guarantee), (0, 0));
        // The limit is the guarantee plus a grant; the guarantee is kept apart.
        w.set_mem_burst(1, 6 << 30);
        let mut v = r.snapshot().devices().to_vec();
        v[1].mem_limit = 5 << 30;
        v[1].compute_share_bps = 3000;
        w.publish_spec(0, &v, 7, &[1 << 30, 3 << 30]).unwrap();
        let s = r.region().published_spec().unwrap();
        assert_eq!((s.rev, s.priority), (7, 0));
        let d = &s.devices[1];
        assert_eq!((d.uuid.as_str(), d.host_index, d.mem_guarantee, d.mem_burst, d.compute_share_bps, d.compute_limit_bps), ("GPU-test-2", 2, 3 << 30, 6 << 30, 3000, 10_000));
        // A plain publish (the grants) keeps the revision and the guarantees.
        v[1].mem_limit = 4 << 30;
        w.publish(0, &v).unwrap();
        assert_eq!(r.region().published_spec().unwrap(), PublishedSpec { devices: s.devices.clone(), ..s.clone() });
        assert!(matches!(w.publish_spec(0, &v, 8, &[1]), Err(AbiError::BadDevice(1))));
        // A writer killed inside a publish: nothing reliable to read back.
        let odd = w.region().seq.load(Ordering::Relaxed) | 1;
        w.region().seq.store(odd, Ordering::Release);
        assert_eq!(r.region().published_spec(), None);
    }

    #[test]
    fn rejects_wrong_version_and_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("limits");
        LimitsWriter::create(&p, "x", 1, &[dev(0, 1)]).unwrap();
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[8] = 99;
        std::fs::write(&p, &bytes).unwrap();
        let e = LimitsReader::open(&p).err().unwrap();
        assert!(matches!(e, AbiError::Version { found: 99, .. }), "{e}");
        assert!(e.to_string().contains("ABI version 99"));

        std::fs::write(&p, b"definitely not a slice table, just some bytes").unwrap();
        assert!(matches!(LimitsReader::open(&p), Err(AbiError::Corrupt(..))));
        std::fs::write(&p, b"").unwrap();
        assert!(matches!(LimitsReader::open(&p), Err(AbiError::Corrupt(..))));
        assert!(matches!(LimitsReader::open(&dir.path().join("nope")), Err(AbiError::Missing(_))));
    }

    #[test]
    fn writer_killed_mid_write_does_not_hang_readers() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("limits");
        let w = LimitsWriter::create(&p, "x", 1, &[dev(0, 1)]).unwrap();
        let r = LimitsReader::open(&p).unwrap();
        // What a writer SIGKILLed between its two seq stores leaves behind.
        let odd = w.region().seq.load(Ordering::Relaxed) | 1;
        w.region().seq.store(odd, Ordering::Release);
        let t = std::time::Instant::now();
        let snap = r.snapshot();
        assert_eq!(snap.seq, odd);
        assert_eq!(snap.devices()[0].mem_limit, 1);
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
        // The wait is paid once per reader, not on every read: 50 waits
        // would take at least 5 s.
        assert_eq!(r.dead_seq.load(Ordering::Relaxed), odd);
        let t = std::time::Instant::now();
        for _ in 0..50 {
            assert_eq!(r.snapshot().seq, odd);
        }
        let again = t.elapsed();
        assert!(again < std::time::Duration::from_nanos(50 * DEAD_WRITER_NS), "50 reads of a known dead writer took {again:?}");
        // The next writer's write is an odd value no reader took for dead,
        // and it ends even; readers see it.
        let mut v = snap.devices().to_vec();
        v[0].mem_limit = 7;
        assert_eq!(w.publish(1, &v).unwrap(), odd + 3);
        assert_eq!(r.snapshot().devices()[0].mem_limit, 7);
    }

    #[test]
    fn reader_never_sees_torn_values() {
        // A writer publishes (L, L) pairs for two devices; readers must always see equal pairs.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("limits");
        let w = LimitsWriter::create(&p, "t", 1, &[dev(0, 2500), dev(1, 2500)]).unwrap();
        let r = LimitsReader::open(&p).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 1..20_000u64 {
                    let l = DeviceLimitsSnapshot { host_index: 0, mem_limit: i, compute_share_bps: i as u32, compute_limit_bps: 0 };
                    w.publish(1, &[l, DeviceLimitsSnapshot { host_index: 1, ..l }]).unwrap();
                }
                stop.store(true, Ordering::Release);
            });
            let mut reads = 0u64;
            while !stop.load(Ordering::Acquire) || reads == 0 {
                let s = r.snapshot();
                let d = s.devices();
                assert_eq!(d[0].mem_limit, d[1].mem_limit);
                assert_eq!(d[0].mem_limit as u32, d[0].compute_share_bps);
                reads += 1;
            }
        });
    }
}
