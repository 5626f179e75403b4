//! The slice manager: the agent's slices, their store records and their
//! slice-table files. The only writer of limits.
//!
//! Every mutation is checked by [`crate::capacity`], persisted in the
//! [`Store`], and only then published to the limits file, so the store is
//! never behind what a workload sees.

use crate::capacity::{self, CapacityError};
use crate::devices::DeviceInfo;
use crate::store::{Owner, SliceRecord, Store, StoreError};
use egpu_abi::limits::DeviceInit;
use egpu_abi::{AbiError, DeviceLimitsSnapshot, LimitsWriter, UsageFile, paths};
use egpu_core::{Bytes, DeviceShare, Percent, Priority, SliceSpec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum SliceOpError {
    #[error(transparent)]
    Capacity(#[from] CapacityError),
    #[error("no slice named '{0}' (see `egpu ls`)")]
    NotFound(String),
    #[error("a slice named '{0}' already exists; pick another name or remove it with `egpu rm {0}`")]
    Exists(String),
    #[error("slice '{name}' has live processes attached (pids {pids:?}); stop them first, or pass --force to remove it anyway (they keep running but can no longer allocate)")]
    Busy { name: String, pids: Vec<u32> },
    #[error("slice '{name}': egpud cannot read its usage file now (a process of the slice truncates it again and again), so it cannot tell whether processes are attached; try again, or pass --force to remove it anyway")]
    Unknown { name: String },
    #[error("slice '{name}' is stored but egpud could not open its slice-table files: {error}. Its processes keep running with their last limits and its memory stays reserved; fix the cause (permissions, a full file system) and egpud adopts it at its next sweep")]
    Unadopted { name: String, error: String },
    #[error("its usage file {} is unusable ({why}), and processes of the slice still hold records in it: a new file would lose their charges, so egpud waits until they exit (stop them to adopt the slice now)", path.display())]
    UsageHeld { path: PathBuf, why: String },
    #[error("{0}")]
    BadRequest(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("slice table")]
    Abi(#[source] AbiError),
    #[error("the slice's CDI spec could not be written, so no container could join it; the slice was removed again")]
    Cdi(#[source] crate::cdi::CdiError),
    #[error("slice directory {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the run directory holds live slices that the store has no record of: {}. Either --state-dir is not the one these slices were made with, or the store lost its last changes (a damaged file: the database then falls back to its previous commit). egpud did not start and changed nothing, so their processes keep their last limits. Start egpud with the state directory that holds them; or, if the store lost them, start it with --adopt-unstored-slices to take them back from their limits files (their processes run on in them); or, to drop them (their processes can then allocate no more; the slice directories under {} go once none is attached), start it with --drop-unstored-slices",
        names.join(", "), slices_dir.display()
    )]
    NotStored { names: Vec<String>, slices_dir: PathBuf },
    #[error(
        "--adopt-unstored-slices: cannot take back {}. egpud did not start and changed nothing, so their processes keep their last limits. Start egpud with the state directory that holds them, or drop these with --drop-unstored-slices instead",
        why.join("; ")
    )]
    CannotTakeBack { why: Vec<String> },
}

/// What adoption does with live slice directories the store has no record
/// of (see [`SliceOpError::NotStored`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unstored {
    /// Refuse to start, changing nothing (the default).
    #[default]
    Refuse,
    /// Mark them deleted and remove them once nothing is attached
    /// (`--drop-unstored-slices`).
    Drop,
    /// Take each back from the spec its limits file publishes, as a new
    /// persistent slice of the same name (`--adopt-unstored-slices`).
    Adopt,
}

/// A live slice: its record and its open slice-table files.
pub struct Slice {
    pub record: SliceRecord,
    pub dir: PathBuf,
    pub limits: LimitsWriter,
    /// Shared with the memory audit's sampler, which reads the records
    /// without the slice manager's lock while the driver's list is taken.
    pub usage: Arc<UsageFile>,
    /// Resizes since this egpud started (for metrics).
    pub resizes: u64,
    /// Times this egpud found the usage file truncated by a process of the
    /// slice and put it right (for metrics; [`SliceManager::sweep`]).
    pub usage_repairs: u64,
    /// Per slice device: memory lent above the guarantee from the device's
    /// burst pool (see [`crate::burst`]); the published limit is the
    /// guarantee plus this.
    pub granted: Vec<u64>,
    /// Per slice device: the memory audit's state ([`crate::audit`]).
    pub audit: Vec<crate::audit::DeviceAudit>,
}

/// Usage of one slice device, for listings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceUsage {
    pub share: DeviceShare,
    pub uuid: String,
    pub used: u64,
    pub refused: u64,
    /// Burst memory lent now, above the guarantee.
    pub granted: u64,
    /// What the driver reports the slice's live processes hold on the
    /// device (the memory audit's last reading; `None` when not audited).
    pub driver_used: Option<u64>,
    /// What of it no usage record charges, beyond the slack
    /// ([`crate::audit`]).
    pub untracked: u64,
}

/// One attached process, for listings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessUsage {
    pub pid: u32,
    pub bytes: Vec<u64>,
    pub alive: bool,
}

impl Slice {
    pub fn name(&self) -> &str {
        &self.record.spec.name
    }

    pub fn device_usage(&self) -> Vec<DeviceUsage> {
        let r = self.usage.region();
        self.record
            .spec
            .devices
            .iter()
            .enumerate()
            .map(|(i, share)| DeviceUsage {
                share: *share,
                uuid: self.record.device_uuids.get(i).cloned().unwrap_or_default(),
                used: self.usage.used(i),
                refused: r.refused[i].load(Ordering::Relaxed),
                granted: self.granted.get(i).copied().unwrap_or(0),
                driver_used: self.audit.get(i).and_then(|a| a.driver),
                untracked: self.audit.get(i).map_or(0, |a| a.untracked),
            })
            .collect()
    }

    pub fn processes(&self) -> Vec<ProcessUsage> {
        self.usage.processes().into_iter().map(|p| ProcessUsage { pid: p.pid, bytes: p.charged, alive: p.alive }).collect()
    }

    pub fn live_pids(&self) -> Vec<u32> {
        self.usage.processes().into_iter().filter(|p| p.alive).map(|p| p.pid).collect()
    }

    pub fn generation(&self) -> u64 {
        self.limits.snapshot().seq
    }

    /// The memory limit of each slice device: the guarantee plus any burst grant.
    pub fn mem_limits(&self) -> Vec<u64> {
        limits_of(&self.record.spec, &self.granted).iter().map(|l| l.mem_limit).collect()
    }

    /// Publishes the spec, with any burst grants, to the limits file. The
    /// burst caps go first, so a hook that sees the new limits sees them too.
    pub(crate) fn publish(&self) -> Result<u64, SliceOpError> {
        publish_record(&self.limits, &self.record, &self.granted)
    }
}

/// Publishes `record`'s spec with the burst grants `granted` to the limits
/// file: the burst caps first, then in one seqlock generation the limits, the
/// spec's revision and the guarantees (what adoption reads back to find a
/// change the store lost, [`SliceManager::open_files`]).
fn publish_record(w: &LimitsWriter, record: &SliceRecord, granted: &[u64]) -> Result<u64, SliceOpError> {
    let spec = &record.spec;
    for (i, d) in spec.devices.iter().enumerate() {
        w.set_mem_burst(i, d.memory_burst.0);
    }
    let guarantees: Vec<u64> = spec.devices.iter().map(|d| d.memory.0).collect();
    w.publish_spec(spec.priority.code(), &limits_of(spec, granted), record.rev, &guarantees).map_err(SliceOpError::Abi)
}

/// The share a limits file publishes for one device, at node index
/// `device`; `None` for a compute cap above 100%, which the API refuses, so
/// egpud never published it. (The rest of what egpud admits, memory against
/// the GPU included, the callers check.)
fn published_share(p: &egpu_abi::PublishedDevice, device: u32) -> Option<DeviceShare> {
    let share = DeviceShare {
        device,
        memory: Bytes(p.mem_guarantee),
        memory_burst: Bytes(p.mem_burst),
        compute_share: Percent(p.compute_share_bps),
        compute_limit: Percent(p.compute_limit_bps),
    };
    (share.compute_limit <= Percent::FULL).then_some(share)
}

/// The spec a limits file published, when it is a later revision of
/// `record`'s: the change the store lost. `None` when the file is not ahead,
/// cannot be read consistently, or does not describe `record`'s slice (another
/// name, GPU or device count, or values no spec could have): the store's
/// record then stands. `devices` are the node's GPUs: a guarantee or cap
/// above its GPU's memory is not a spec egpud admitted.
fn lost_change(record: &SliceRecord, file: &egpu_abi::LimitsRegion, devices: &[DeviceInfo]) -> Option<(SliceSpec, u64)> {
    let published = file.published_spec()?;
    if published.rev <= record.rev || file.name() != record.spec.name || published.devices.len() != record.spec.devices.len() {
        return None;
    }
    let mut spec = record.spec.clone();
    spec.priority = Priority::from_code(published.priority)?;
    for (i, (d, p)) in spec.devices.iter_mut().zip(&published.devices).enumerate() {
        if record.device_uuids.get(i) != Some(&p.uuid) {
            return None;
        }
        // The index stays the store's: adoption has moved it to where the GPU is now.
        *d = published_share(p, d.device)?;
        if devices.get(d.device as usize).is_some_and(|g| d.memory_cap().0 > g.memory_bytes) {
            return None;
        }
    }
    spec.validate().ok()?;
    Some((spec, published.rev))
}

fn limits_of(spec: &SliceSpec, granted: &[u64]) -> Vec<DeviceLimitsSnapshot> {
    spec.devices
        .iter()
        .enumerate()
        .map(|(i, d)| DeviceLimitsSnapshot {
            host_index: d.device,
            mem_limit: d.memory.0.saturating_add(granted.get(i).copied().unwrap_or(0)).min(d.memory_cap().0),
            compute_share_bps: d.compute_share.0,
            compute_limit_bps: d.compute_limit.0,
        })
        .collect()
}

/// A create request after decoding.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    pub spec: SliceSpec,
    pub ephemeral: bool,
    pub owner_pid: Option<u32>,
}

/// A resize request: fields that are `None` stay as they are.
#[derive(Debug, Clone, Default)]
pub struct ResizeRequest {
    /// Node device indices to change; empty means every device of the slice.
    pub devices: Vec<u32>,
    pub memory: Option<Bytes>,
    /// Burst cap; `Some(Bytes(0))` turns bursting off.
    pub memory_burst: Option<Bytes>,
    pub compute_share: Option<Percent>,
    pub compute_limit: Option<Percent>,
    pub priority: Option<Priority>,
}

/// What adoption did with each stored slice, for the log and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AdoptReport {
    pub adopted: Vec<String>,
    /// Slice-table files recreated (missing, corrupt or of another ABI version), with why.
    pub recreated: Vec<(PathBuf, String)>,
    pub reclaimed_processes: usize,
    /// Slice directories without a store entry (a crash during a delete): marked
    /// deleted; removed at once, or by a later sweep once no live process is attached.
    pub orphan_dirs: Vec<PathBuf>,
    /// (slice, old index, new index): a slice's GPU found by its UUID at
    /// another index (GPUs renumbered, e.g. one gone after a reboot); the
    /// slice follows its GPU, and the store is rewritten.
    pub moved_devices: Vec<(String, u32, u32)>,
    /// (slice, old index, UUID): a slice's GPU not on the node any more. The
    /// slice keeps it at an index past the node's GPUs, so nothing is
    /// counted against another GPU, and a resize of the slice says the
    /// device is not there.
    pub missing_devices: Vec<(String, u32, String)>,
    /// (slice, error): stored slices whose files could not be opened (an
    /// I/O error such as EACCES or ENOSPC). They stay stored and reserved,
    /// and every sweep tries them again ([`SliceManager::unadopted`]).
    pub failed: Vec<(String, String)>,
    /// (slice, stored revision, published revision): a change the store
    /// lost (rolled back) but the slice's limits file had published, taken
    /// back into the store.
    pub restored: Vec<(String, u64, u64)>,
    /// Live slices the store had no record of, taken back from their
    /// limits files ([`Unstored::Adopt`]).
    pub taken_back: Vec<String>,
}

/// A stored slice whose slice-table files could not be opened at adoption.
#[derive(Debug, Clone)]
pub struct Unadopted {
    pub record: SliceRecord,
    /// The last error, with its cause chain.
    pub error: String,
}

impl Unadopted {
    /// What the slice may hold, for admission: its processes run on with
    /// their last limits, which may include burst grants egpud cannot read
    /// back, so each device counts at the slice's burst cap.
    fn held_spec(&self) -> SliceSpec {
        let mut spec = self.record.spec.clone();
        for d in &mut spec.devices {
            d.memory = d.memory_cap();
        }
        spec
    }
}

pub struct SliceManager {
    run_dir: PathBuf,
    devices: Vec<DeviceInfo>,
    store: Store,
    slices: BTreeMap<String, Slice>,
    /// Stored slices not adopted yet (their files could not be opened);
    /// retried by [`SliceManager::sweep`].
    unadopted: BTreeMap<String, Unadopted>,
    /// Slice directories of no slice, still attached to live processes; removed by [`SliceManager::sweep`].
    orphan_dirs: Vec<PathBuf>,
    /// Burst-memory state ([`crate::burst`]).
    pub(crate) burst: crate::burst::Burst,
    /// Per host device: memory the driver reports for processes of no
    /// slice (the memory audit's last reading).
    unmanaged: BTreeMap<u32, u64>,
    /// Whether the memory audit publishes untracked memory to the hook.
    audit_charges: bool,
    /// Keeps a CDI spec per slice (`--cdi-dir`).
    cdi: Option<crate::cdi::CdiPublisher>,
    /// Slices whose spec adoption took back from their limits files (a
    /// change, or a whole slice, the store had lost): the metric
    /// `egpu_slices_recovered_from_limits`.
    recovered: usize,
}

fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Whether `name` has the form [`new_id`] gives ids: `s-` and 12 hex digits.
fn looks_like_id(name: &str) -> bool {
    name.strip_prefix("s-").is_some_and(|h| h.len() == 12 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn new_id() -> String {
    use std::sync::atomic::AtomicU64;
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let mix = nanos ^ ((std::process::id() as u64) << 40) ^ COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    format!("s-{:012x}", mix & 0xffff_ffff_ffff)
}

fn recreate_reason(e: &AbiError) -> Option<String> {
    match e {
        AbiError::Missing(_) => Some("missing".into()),
        AbiError::Corrupt(_, why) => Some(format!("corrupt: {why}")),
        AbiError::Version { found, expected, .. } => Some(format!("ABI version {found}, this egpud writes version {expected}")),
        _ => None,
    }
}

impl SliceManager {
    /// Adopts every slice in `store`: opens (or, when missing, corrupt or of
    /// another ABI version, recreates) its slice-table files, republishes the
    /// stored limits and sweeps dead processes.
    pub fn adopt(run_dir: &Path, devices: Vec<DeviceInfo>, store: Store) -> Result<(SliceManager, AdoptReport), SliceOpError> {
        Self::adopt_with(run_dir, devices, store, Unstored::Refuse)
    }

    /// [`SliceManager::adopt`], doing `unstored` with live slice directories
    /// the store has no record of: by default they fail the adoption
    /// ([`SliceOpError::NotStored`]).
    pub fn adopt_with(run_dir: &Path, devices: Vec<DeviceInfo>, store: Store, unstored: Unstored) -> Result<(SliceManager, AdoptReport), SliceOpError> {
        let slices_dir = paths::slices_dir(run_dir);
        std::fs::create_dir_all(&slices_dir).map_err(|source| SliceOpError::Io { path: slices_dir.clone(), source })?;
        let mut mgr = SliceManager {
            run_dir: run_dir.into(),
            devices,
            store,
            slices: BTreeMap::new(),
            unadopted: BTreeMap::new(),
            orphan_dirs: Vec::new(),
            burst: crate::burst::Burst::default(),
            unmanaged: BTreeMap::new(),
            audit_charges: false,
            cdi: None,
            recovered: 0,
        };
        let mut report = AdoptReport::default();
        let mut records = mgr.store.load_all()?;
        // Before anything is adopted, so a refusal changes nothing.
        let mut lost: Vec<(String, PathBuf)> = {
            let stored: std::collections::BTreeSet<&str> = records.iter().map(|r| r.spec.name.as_str()).collect();
            slice_dirs(&slices_dir).into_iter().filter(|(name, dir)| !stored.contains(name.as_str()) && live_dir(dir)).collect()
        };
        lost.sort();
        match unstored {
            Unstored::Refuse if !lost.is_empty() => {
                return Err(SliceOpError::NotStored { names: lost.into_iter().map(|(name, _)| name).collect(), slices_dir });
            }
            Unstored::Adopt if !lost.is_empty() => {
                let taken = mgr.take_back(&records, &lost)?;
                for record in taken {
                    mgr.store.put(&record)?;
                    tracing::warn!(slice = %record.spec.name, id = %record.id, spec = ?record.spec,
                        "live slice the store had no record of, taken back from its limits file (--adopt-unstored-slices) as a persistent slice");
                    report.taken_back.push(record.spec.name.clone());
                    records.push(record);
                }
                records.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
            }
            _ => {}
        }
        for mut record in records {
            // Admission, bursts and shares count a slice at its device index;
            // the workload runs on its GPU by UUID. Where the GPUs were
            // renumbered, the slice follows its GPU.
            let mut moved = false;
            let mut past = mgr.devices.len() as u32;
            for (i, d) in record.spec.devices.iter_mut().enumerate() {
                let Some(uuid) = record.device_uuids.get(i) else { continue };
                if mgr.devices.get(d.device as usize).is_some_and(|x| &x.uuid == uuid) {
                    continue;
                }
                match mgr.devices.iter().position(|x| &x.uuid == uuid) {
                    Some(j) => {
                        tracing::warn!(slice = %record.spec.name, uuid = %uuid, from = d.device, to = j, "the slice's GPU is at another index now; the slice follows it");
                        report.moved_devices.push((record.spec.name.clone(), d.device, j as u32));
                        d.device = j as u32;
                        moved = true;
                    }
                    None => {
                        tracing::error!(slice = %record.spec.name, uuid = %uuid, index = d.device, "the slice's GPU is not on this node any more; the slice keeps it at index {past}, past the node's GPUs, until it is removed (or the GPU is back at the next restart)");
                        report.missing_devices.push((record.spec.name.clone(), d.device, uuid.clone()));
                        d.device = past;
                        past += 1;
                        moved = true;
                    }
                }
            }
            // The next start works the same out from the UUIDs again, so a
            // store that cannot take it now is no reason to stop.
            if moved && let Err(e) = mgr.store.put(&record) {
                tracing::warn!(slice = %record.spec.name, error = %e, "cannot store the slice's new device indices; they are worked out again at the next start");
            }
            let name = record.spec.name.clone();
            // One slice whose files cannot be opened does not stop the
            // others, nor egpud: it stays stored and reserved, and is tried
            // again at every sweep.
            match mgr.adopt_one(record.clone(), &mut report) {
                Ok(slice) => {
                    report.adopted.push(name.clone());
                    mgr.slices.insert(name, slice);
                }
                Err(e) => {
                    let error = crate::wire::chain(&e);
                    tracing::error!(slice = %name, error = %error,
                        "cannot adopt the slice; its processes keep their last limits and its memory stays reserved; fix the cause and egpud adopts it at its next sweep");
                    report.failed.push((name.clone(), error.clone()));
                    mgr.unadopted.insert(name, Unadopted { record, error });
                }
            }
        }
        mgr.adopt_orphan_dirs(&slices_dir, &mut report);
        mgr.recovered = report.restored.len() + report.taken_back.len();
        for (device, over) in crate::burst::overlent(&mgr) {
            tracing::warn!(device, over_bytes = over, "adopted guarantees and burst grants exceed the device's memory; no new grant there until enough is freed");
        }
        Ok((mgr, report))
    }

    /// The records of the live slice directories `lost` (no stored slice
    /// owns them), from the specs their limits files publish: each must be
    /// one a current egpud published (a spec revision), on GPUs of this
    /// node, and fit beside `stored` and the others taken back. All or
    /// nothing: otherwise [`SliceOpError::CannotTakeBack`] names each
    /// that cannot be taken back, and why.
    fn take_back(&self, stored: &[SliceRecord], lost: &[(String, PathBuf)]) -> Result<Vec<SliceRecord>, SliceOpError> {
        let mut held: Vec<SliceSpec> = stored.iter().map(|r| r.spec.clone()).collect();
        let mut taken = Vec::new();
        let mut why = Vec::new();
        for (name, dir) in lost {
            match self.published_record(name, dir, &held) {
                Ok(record) => {
                    held.push(record.spec.clone());
                    taken.push(record);
                }
                Err(e) => why.push(format!("{name}: {e}")),
            }
        }
        if why.is_empty() { Ok(taken) } else { Err(SliceOpError::CannotTakeBack { why }) }
    }

    /// The record of the live slice directory `dir`, from its limits file
    /// ([`SliceManager::take_back`]).
    fn published_record(&self, name: &str, dir: &Path, held: &[SliceSpec]) -> Result<SliceRecord, String> {
        let limits = egpu_abi::LimitsReader::open(&paths::limits_path(dir)).map_err(|e| e.to_string())?;
        let region = limits.region();
        let published = region.published_spec().ok_or("its limits file was left in the middle of a write")?;
        if published.rev == 0 {
            return Err("its limits file does not publish a spec (written by an older egpud)".into());
        }
        if region.name() != name {
            return Err(format!("its limits file names slice '{}'", region.name()));
        }
        let mut devices = Vec::new();
        let mut uuids = Vec::new();
        for p in &published.devices {
            let index = self.devices.iter().position(|d| d.uuid == p.uuid).ok_or_else(|| format!("its GPU {} is not on this node", p.uuid))?;
            devices.push(published_share(p, index as u32).ok_or_else(|| format!("its limits file has a compute cap of {} basis points, above 100%", p.compute_limit_bps))?);
            uuids.push(p.uuid.clone());
        }
        let priority = Priority::from_code(published.priority).ok_or_else(|| format!("its limits file has priority code {}", published.priority))?;
        let spec = SliceSpec { name: name.to_string(), priority, devices };
        capacity::check(&self.devices, held, &spec).map_err(|e| e.to_string())?;
        Ok(SliceRecord { id: new_id(), spec, device_uuids: uuids, ephemeral: false, owner: None, created_unix: now_unix(), workload: None, rev: published.rev })
    }

    /// Opens one stored slice's files, republishes its limits and sweeps it.
    fn adopt_one(&self, record: SliceRecord, report: &mut AdoptReport) -> Result<Slice, SliceOpError> {
        let name = record.spec.name.clone();
        let slice = self.open_files(record, report)?;
        if slice.granted.iter().any(|&g| g > 0) {
            tracing::info!(slice = %name, granted = ?slice.granted, "adopted burst grants from the limits file");
        }
        slice.publish()?;
        slice.limits.heartbeat();
        report.reclaimed_processes += slice.usage.sweep(None).len();
        tracing::info!(slice = %name, processes = slice.live_pids().len(), "adopted slice");
        Ok(slice)
    }

    /// Tries the slices not adopted yet again.
    fn retry_unadopted(&mut self) {
        let names: Vec<String> = self.unadopted.keys().cloned().collect();
        for name in names {
            let record = self.unadopted[&name].record.clone();
            let mut report = AdoptReport::default();
            match self.adopt_one(record, &mut report) {
                Ok(mut slice) => {
                    self.settle_adopted_untracked(&mut slice);
                    self.unadopted.remove(&name);
                    self.slices.insert(name.clone(), slice);
                    tracing::info!(slice = %name, "adopted the slice that could not be adopted before");
                }
                Err(e) => {
                    let error = crate::wire::chain(&e);
                    let u = self.unadopted.get_mut(&name).expect("listed above");
                    if u.error != error {
                        tracing::warn!(slice = %name, error = %error, "still cannot adopt the slice");
                        u.error = error;
                    }
                }
            }
        }
    }

    /// Stored slices whose files could not be opened yet.
    pub fn unadopted(&self) -> impl Iterator<Item = &Unadopted> {
        self.unadopted.values()
    }

    /// How many slices this egpud's adoption took back from their limits
    /// files, because the store had lost a change of theirs or the whole
    /// slice ([`AdoptReport::restored`], [`AdoptReport::taken_back`]).
    pub fn recovered(&self) -> usize {
        self.recovered
    }

    /// The specs admission counts next to a new or resized slice: every
    /// slice but `except`, the unadopted ones at their burst caps.
    fn held_specs(&self, except: Option<&str>) -> Vec<SliceSpec> {
        self.slices
            .values()
            .filter(|s| Some(s.name()) != except)
            .map(|s| s.record.spec.clone())
            .chain(self.unadopted.values().map(Unadopted::held_spec))
            .collect()
    }

    /// Directories under `slices/` that no stored slice owns are what a crash in the
    /// middle of a delete leaves (it marks the limits deleted, then removes the store
    /// entry, then the directory). Each goes once no live process is attached.
    /// Live ones (see [`live_dir`]) got here only with `--drop-unstored-slices`:
    /// without it adoption refused before this ([`SliceOpError::NotStored`]).
    fn adopt_orphan_dirs(&mut self, slices_dir: &Path, report: &mut AdoptReport) {
        let orphans: Vec<(String, PathBuf)> = slice_dirs(slices_dir).into_iter().filter(|(name, _)| !self.slices.contains_key(name) && !self.unadopted.contains_key(name)).collect();
        for (_, dir) in orphans {
            let live = live_dir(&dir);
            self.keep_orphan_dir(&dir);
            let marked = egpu_abi::LimitsReader::open(&paths::limits_path(&dir)).is_ok_and(|l| l.snapshot().state == egpu_abi::SliceState::Deleted);
            match (live, marked) {
                (true, true) => tracing::warn!(dir = %dir.display(), "live slice the store has no record of, dropped (--drop-unstored-slices): limits marked deleted, removed once no process is attached"),
                (true, false) => tracing::warn!(dir = %dir.display(), "live slice the store has no record of, dropped (--drop-unstored-slices), but its limits could not be marked deleted: its processes may still allocate; removed once none is attached"),
                (false, _) => tracing::warn!(dir = %dir.display(), "slice directory of an interrupted delete (no stored slice); removed once no process is attached"),
            }
            report.orphan_dirs.push(dir);
        }
        self.remove_orphan_dirs();
    }

    /// Marks the limits of a slice directory no stored slice owns deleted
    /// (attached processes stop allocating) and hands the directory to the
    /// sweep, which removes it once no live process is attached.
    fn keep_orphan_dir(&mut self, dir: &Path) {
        if let Ok(limits) = LimitsWriter::open(&paths::limits_path(dir)) {
            limits.mark_deleted();
        }
        if !self.orphan_dirs.iter().any(|d| d == dir) {
            self.orphan_dirs.push(dir.to_path_buf());
        }
    }

    /// Removes the directory of a slice that is gone from the store; one that
    /// cannot be removed now is marked deleted and left to the sweep, like
    /// the directory of an interrupted delete.
    fn remove_slice_dir(&mut self, dir: &Path) {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "could not remove the slice directory; the sweep tries again");
                self.keep_orphan_dir(dir);
            }
        }
    }

    /// Removes the orphaned slice directories that no live process is attached to any more.
    fn remove_orphan_dirs(&mut self) {
        self.orphan_dirs.retain(|dir| {
            let live = UsageFile::open(&paths::usage_path(dir)).map(|u| {
                u.sweep(None);
                u.processes().iter().filter(|p| p.alive).map(|p| p.pid).collect::<Vec<_>>()
            });
            // A usage file this build cannot read (another ABI version, a
            // corrupt header) may still have processes attached: their
            // record locks say so whatever the layout, and the directory
            // waits for them.
            let attached = match live {
                Ok(pids) => !pids.is_empty(),
                Err(_) => usage_locked_by_other(dir),
            };
            if attached {
                return true;
            }
            match std::fs::remove_dir_all(dir) {
                Ok(()) => {
                    tracing::info!(dir = %dir.display(), "removed orphaned slice directory");
                    false
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "could not remove orphaned slice directory");
                    true
                }
            }
        });
    }

    fn open_files(&self, record: SliceRecord, report: &mut AdoptReport) -> Result<Slice, SliceOpError> {
        let dir = paths::slice_dir(&self.run_dir, &record.spec.name);
        std::fs::create_dir_all(&dir).map_err(|source| SliceOpError::Io { path: dir.clone(), source })?;
        let lpath = paths::limits_path(&dir);
        let n = record.spec.devices.len();
        let limits = match LimitsWriter::open(&lpath) {
            Ok(w) if w.snapshot().n_devices == n => w,
            Ok(_) => self.recreate_limits(&record, &lpath, "device count differs from the store".into(), report)?,
            Err(e) => match recreate_reason(&e) {
                Some(why) => self.recreate_limits(&record, &lpath, why, report)?,
                None => return Err(SliceOpError::Abi(e)),
            },
        };
        // The store commits a change before egpud publishes it, so a limits
        // file ahead of the store's record means the store lost its last
        // commit (redb rolled a damaged store back to the one before): the
        // file holds what the client was told, and the processes run by it.
        let mut record = record;
        if let Some((spec, rev)) = lost_change(&record, limits.region(), &self.devices) {
            tracing::warn!(slice = %record.spec.name, store_rev = record.rev, published_rev = rev, stored = ?record.spec, published = ?spec,
                "the limits file publishes a later change of the slice than the store holds (the store lost its last commit); taking the published spec back into the store");
            report.restored.push((record.spec.name.clone(), record.rev, rev));
            record.spec = spec;
            record.rev = rev;
            // The file keeps it meanwhile, so a store that cannot take it
            // now loses nothing: the next start finds the same.
            if let Err(e) = self.store.put(&record) {
                tracing::warn!(slice = %record.spec.name, error = %e, "cannot store the published spec; it is taken from the limits file again at the next start");
            }
        }
        // A record from before spec revisions (schema 2) gets its first one,
        // so that its limits file publishes a spec `--adopt-unstored-slices`
        // can take back (revision 0 reads as an older egpud's file). Not
        // stored, it is published anyway: the next start then finds the
        // file ahead of the store, with the same spec.
        if record.rev == 0 {
            record.rev = 1;
            if let Err(e) = self.store.put(&record) {
                tracing::warn!(slice = %record.spec.name, error = %e, "cannot store the slice's first spec revision; it is taken from the limits file at the next start");
            }
        }
        let upath = paths::usage_path(&dir);
        // A file a process of the slice truncated is extended back, not
        // recreated, so the processes still attached keep their records.
        let (usage, cut_to) = match UsageFile::open_restoring(&upath, n) {
            Ok((u, cut_to)) if u.n_devices() == n => {
                if let Some(len) = cut_to {
                    tracing::warn!(file = %upath.display(), cut_to = len,
                        "usage file was truncated (by a process of the slice); extended it back (charges recorded in the cut part are lost)");
                }
                (u, cut_to)
            }
            other => {
                let why = match other {
                    Ok(_) => "device count differs from the store".to_string(),
                    Err(e) => recreate_reason(&e).ok_or(SliceOpError::Abi(e))?,
                };
                // Processes of the slice hold records in it (a header they
                // overwrote, or an older egpud's layout): a new file would
                // drop their charges from egpud's view. The slice stays
                // unadopted, reserved at its burst cap, until they exit.
                if usage_locked_by_other(&dir) {
                    return Err(SliceOpError::UsageHeld { path: upath, why });
                }
                log_recreate(&upath, &why, report);
                (UsageFile::create(&upath, n).map_err(SliceOpError::Abi)?, None)
            }
        };
        // A restarted egpud takes the grants back from the limits file.
        let file = limits.snapshot();
        let granted = record
            .spec
            .devices
            .iter()
            .zip(file.devices())
            .map(|(d, l)| l.mem_limit.min(d.memory_cap().0).saturating_sub(d.memory.0))
            .collect();
        // What an earlier egpud counted as untracked holds until this one
        // has audited the slice (see `SliceManager::set_audit`).
        let audit = (0..n).map(|i| crate::audit::DeviceAudit::carried(limits.region().devices[i].mem_untracked.load(Ordering::Acquire))).collect();
        Ok(Slice { record, dir, limits, usage: Arc::new(usage), resizes: 0, usage_repairs: u64::from(cut_to.is_some()), granted, audit })
    }

    fn recreate_limits(&self, record: &SliceRecord, path: &Path, why: String, report: &mut AdoptReport) -> Result<LimitsWriter, SliceOpError> {
        log_recreate(path, &why, report);
        self.create_limits(record, path)
    }

    fn create_limits(&self, record: &SliceRecord, path: &Path) -> Result<LimitsWriter, SliceOpError> {
        let inits: Vec<DeviceInit> = record
            .spec
            .devices
            .iter()
            .zip(limits_of(&record.spec, &[]))
            .enumerate()
            .map(|(i, (d, limits))| DeviceInit { uuid: record.device_uuids.get(i).cloned().unwrap_or_default(), host_index: d.device, limits })
            .collect();
        let w = LimitsWriter::create(path, &record.spec.name, record.spec.priority.code(), &inits).map_err(SliceOpError::Abi)?;
        // Before any workload can know the slice: its burst caps and its revision.
        publish_record(&w, record, &[])?;
        Ok(w)
    }

    pub fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    pub fn store_path(&self) -> &Path {
        self.store.path()
    }

    pub fn slices(&self) -> impl Iterator<Item = &Slice> {
        self.slices.values()
    }

    /// Finds a slice by name, or by id.
    /// A slice by name, to change its burst grants ([`crate::burst`]).
    pub(crate) fn slice_mut(&mut self, name: &str) -> Option<&mut Slice> {
        self.slices.get_mut(name)
    }

    pub fn get(&self, name_or_id: &str) -> Result<&Slice, SliceOpError> {
        self.slices
            .get(name_or_id)
            .or_else(|| self.slices.values().find(|s| s.record.id == name_or_id))
            .ok_or_else(|| match self.unadopted.values().find(|u| u.record.spec.name == name_or_id || u.record.id == name_or_id) {
                Some(u) => SliceOpError::Unadopted { name: u.record.spec.name.clone(), error: u.error.clone() },
                None => SliceOpError::NotFound(egpu_core::slice::shown(name_or_id)),
            })
    }

    /// Per-device sums over all slices (the unadopted ones at their burst caps).
    pub fn allocated(&self) -> Vec<capacity::Allocated> {
        capacity::allocated(self.devices.len(), &self.held_specs(None))
    }

    pub fn create(&mut self, req: CreateRequest) -> Result<&Slice, SliceOpError> {
        let name = req.spec.name.clone();
        // Slices are found by name or id: a name shaped like an id would
        // make `egpu rm s-…` ambiguous.
        if looks_like_id(&name) {
            return Err(SliceOpError::BadRequest(format!("slice name '{name}' has the form of a slice id (s- and 12 hex digits): pick another name")));
        }
        if self.slices.contains_key(&name) {
            return Err(SliceOpError::Exists(name));
        }
        if let Some(u) = self.unadopted.get(&name) {
            return Err(SliceOpError::Unadopted { name, error: u.error.clone() });
        }
        capacity::check(&self.devices, &self.held_specs(None), &req.spec)?;
        crate::burst::check_lent(self, None, &req.spec)?;
        // With no owner the collector could never tell when an ephemeral
        // slice is done with, and it would stay for ever.
        if req.ephemeral && req.owner_pid.is_none() {
            return Err(SliceOpError::BadRequest(format!(
                "ephemeral slice '{name}' needs owner_pid: the process whose exit ends it (egpu run sends its own pid)"
            )));
        }
        let owner: Option<Owner> = match req.owner_pid {
            Some(pid) => Some(crate::owner::owner_of(pid).ok_or_else(|| SliceOpError::BadRequest(format!("owner process {pid} does not exist")))?),
            None => None,
        };
        let record = SliceRecord {
            id: new_id(),
            device_uuids: req.spec.devices.iter().map(|d| self.devices[d.device as usize].uuid.clone()).collect(),
            spec: req.spec,
            ephemeral: req.ephemeral,
            owner,
            created_unix: now_unix(),
            workload: None,
            rev: 1,
        };
        let dir = paths::slice_dir(&self.run_dir, &name);
        // Leftovers of an older slice of that name (removed while egpud was down) are replaced.
        let _ = std::fs::remove_dir_all(&dir);
        self.orphan_dirs.retain(|d| *d != dir);
        std::fs::create_dir_all(&dir).map_err(|source| SliceOpError::Io { path: dir.clone(), source })?;
        let usage = match UsageFile::create(&paths::usage_path(&dir), record.spec.devices.len()) {
            Ok(u) => u,
            Err(e) => {
                self.remove_slice_dir(&dir);
                return Err(SliceOpError::Abi(e));
            }
        };
        // Store before the limits file appears: a crash in between leaves a stored slice
        // whose files adoption recreates, never files without a slice.
        if let Err(e) = self.store.put(&record) {
            drop(usage);
            self.remove_slice_dir(&dir);
            return Err(e.into());
        }
        crate::crash::point("create-stored");
        let limits = match self.create_limits(&record, &paths::limits_path(&dir)) {
            Ok(l) => l,
            Err(e) => {
                drop(usage);
                // The file may be in place, live, though it could not be
                // opened: it goes before the store entry, so a crash in
                // between never leaves live limits without a stored slice.
                let _ = std::fs::remove_file(paths::limits_path(&dir));
                if let Err(gone) = self.store.remove(&name) {
                    // Still stored, so it would come back at the next start:
                    // it is kept as a slice whose files could not be opened
                    // (reserved, tried again at every sweep), and the error says so.
                    let error = format!("{}; and it could not be taken out of the store again ({})", crate::wire::chain(&e), crate::wire::chain(&gone));
                    tracing::error!(slice = %name, error = %error, "a failed create left the slice stored; egpud keeps it and tries its files again at every sweep");
                    self.unadopted.insert(name.clone(), Unadopted { record, error: error.clone() });
                    return Err(SliceOpError::Unadopted { name, error });
                }
                self.remove_slice_dir(&dir);
                return Err(e);
            }
        };
        crate::crash::point("create-published");
        limits.heartbeat();
        tracing::info!(slice = %name, id = %record.id, spec = ?record.spec, "created slice");
        let granted = vec![0; record.spec.devices.len()];
        let audit = vec![crate::audit::DeviceAudit::default(); record.spec.devices.len()];
        self.slices.insert(name.clone(), Slice { record, dir, limits, usage: Arc::new(usage), resizes: 0, usage_repairs: 0, granted, audit });
        // A slice no container could join is not created (`--cdi-dir`);
        // another slice's spec failing is that slice's problem (logged).
        let synced = self.sync_cdi();
        if self.cdi.as_ref().is_some_and(|p| !p.published(&name)) {
            let e = synced.err().unwrap_or(crate::cdi::CdiError::Write {
                path: PathBuf::from(crate::cdi::device_name(&name)),
                source: std::io::Error::other("the spec is not in place after the sync"),
            });
            // Removed again; if even that fails, say so rather than "not created".
            self.delete(&name, true)?;
            return Err(SliceOpError::Cdi(e));
        }
        if let Err(e) = synced {
            self.note_cdi_error(&e);
        }
        Ok(&self.slices[&name])
    }

    pub fn resize(&mut self, name_or_id: &str, req: ResizeRequest) -> Result<&Slice, SliceOpError> {
        let name = self.get(name_or_id)?.name().to_string();
        let old = self.slices[&name].record.spec.clone();
        for d in &req.devices {
            if !old.devices.iter().any(|x| x.device == *d) {
                let have: Vec<u32> = old.devices.iter().map(|x| x.device).collect();
                return Err(SliceOpError::BadRequest(format!(
                    "slice '{name}' has no device {d} (its devices are {have:?}); a resize changes the limits of the slice's devices, it cannot add one"
                )));
            }
        }
        let mut spec = old.clone();
        for d in spec.devices.iter_mut().filter(|d| req.devices.is_empty() || req.devices.contains(&d.device)) {
            if let Some(m) = req.memory {
                d.memory = m;
            }
            if let Some(b) = req.memory_burst {
                d.memory_burst = b;
            }
            if let Some(s) = req.compute_share {
                d.compute_share = s;
            }
            if let Some(l) = req.compute_limit {
                d.compute_limit = l;
            }
        }
        if let Some(p) = req.priority {
            spec.priority = p;
        }
        // A resize that grows no guarantee and no burst cap commits the node
        // no further, so it is never refused for room: a slice left too big
        // (its device shrank across a restart) can still be shrunk.
        let grows = spec.devices.iter().zip(&old.devices).any(|(n, o)| n.memory > o.memory || n.memory_burst > o.memory_burst || n.compute_share > o.compute_share);
        if grows {
            capacity::check(&self.devices, &self.held_specs(Some(&name)), &spec)?;
            crate::burst::check_lent(self, Some(&name), &spec)?;
        } else {
            spec.validate().map_err(capacity::CapacityError::Spec)?;
        }
        let slice = self.slices.get_mut(&name).expect("looked up above");
        let old_limits = slice.mem_limits();
        let mut record = slice.record.clone();
        record.spec = spec;
        record.rev += 1;
        self.store.put(&record)?;
        crate::crash::point("resize-stored");
        slice.record = record;
        slice.resizes += 1;
        // A grant stays as far as the new burst cap allows.
        for (i, d) in slice.record.spec.devices.iter().enumerate() {
            slice.granted[i] = old_limits[i].min(d.memory_cap().0).saturating_sub(d.memory.0);
        }
        let seq = slice.publish()?;
        crate::crash::point("resize-published");
        for (i, (old, new)) in old_limits.iter().zip(slice.mem_limits()).enumerate() {
            if new < *old {
                self.burst.hold(&name, i, *old);
            }
        }
        tracing::info!(slice = %name, generation = seq, spec = ?slice.record.spec, "resized slice");
        Ok(slice)
    }

    /// Deletes a slice; returns the live pids that were attached (only with `force`).
    pub fn delete(&mut self, name_or_id: &str, force: bool) -> Result<Vec<u32>, SliceOpError> {
        let slice = self.get(name_or_id)?;
        let name = slice.name().to_string();
        if slice.usage.detached() && !force {
            return Err(SliceOpError::Unknown { name });
        }
        slice.usage.sweep(None);
        let pids = slice.live_pids();
        if !pids.is_empty() && !force {
            return Err(SliceOpError::Busy { name, pids });
        }
        // Refuse new allocations first, then look again: a process that was
        // attaching meanwhile has claimed its usage record by now (the hook
        // claims it before it charges, and checks the state after), so it
        // is seen here, and the slice stays.
        slice.limits.mark_deleted();
        // Pairs with the hook's fence after it claims a record (see there).
        std::sync::atomic::fence(Ordering::SeqCst);
        crate::crash::point("delete-marked");
        if !force {
            slice.usage.sweep(None);
            let late = slice.live_pids();
            if !late.is_empty() {
                slice.publish()?;
                return Err(SliceOpError::Busy { name, pids: late });
            }
        }
        if let Err(e) = self.store.remove(&name) {
            // Still stored: still live.
            let _ = slice.publish();
            return Err(e.into());
        }
        crate::crash::point("delete-unstored");
        let slice = self.slices.remove(&name).expect("looked up above");
        self.burst.forget(&name);
        // Attached processes keep their mappings; the directory entry goes
        // (or, if it cannot now, at a later sweep, like an interrupted delete's).
        self.remove_slice_dir(&slice.dir);
        tracing::info!(slice = %name, attached = ?pids, "deleted slice");
        self.publish_cdi();
        Ok(pids)
    }

    /// Starts keeping a CDI spec per slice with `publisher` (made by
    /// [`crate::cdi::CdiPublisher::new`], which refuses an unwritable
    /// directory); a spec that cannot be written now is logged and tried
    /// again at every sweep.
    pub fn set_cdi(&mut self, publisher: crate::cdi::CdiPublisher) {
        self.cdi = Some(publisher);
        self.publish_cdi();
    }

    fn sync_cdi(&mut self) -> Result<(), crate::cdi::CdiError> {
        let Some(p) = self.cdi.as_mut() else { return Ok(()) };
        p.sync(self.slices.values().map(|s| crate::cdi::SliceView { name: s.name(), dir: &s.dir, device_uuids: &s.record.device_uuids }))
    }

    /// Brings the CDI specs up to date; a failure is logged (once until it
    /// changes or clears), and the next sweep tries again.
    fn publish_cdi(&mut self) {
        match self.sync_cdi() {
            Err(e) => self.note_cdi_error(&e),
            Ok(()) => {
                if let Some(p) = self.cdi.as_mut()
                    && p.last_error.take().is_some()
                {
                    tracing::info!("CDI specs up to date again");
                }
            }
        }
    }

    /// Logs a sync error once, until it changes or clears.
    fn note_cdi_error(&mut self, e: &crate::cdi::CdiError) {
        let Some(p) = self.cdi.as_mut() else { return };
        let e = crate::wire::chain(e);
        if p.last_error.as_ref() != Some(&e) {
            tracing::warn!(error = %e, "CDI specs not up to date; retrying at every sweep");
            p.last_error = Some(e);
        }
    }

    /// Reclaims dead processes' records in every slice, refreshes the heartbeat, and
    /// removes orphaned slice directories that no live process uses any more.
    pub fn sweep(&mut self) -> usize {
        self.retry_unadopted();
        self.remove_orphan_dirs();
        self.publish_cdi();
        let mut n = 0;
        for s in self.slices.values_mut() {
            restore_usage(s);
            for r in s.usage.sweep(None) {
                tracing::debug!(slice = %s.name(), pid = r.pid, charged = ?r.charged, "reclaimed dead process");
                n += 1;
            }
            s.limits.heartbeat();
        }
        n
    }

    /// Records the program a slice runs (the child `egpu run` started), by pid and
    /// start time, so that the collector keeps an ephemeral slice while it lives,
    /// even before it has made a single intercepted call.
    pub fn set_workload(&mut self, name_or_id: &str, pid: u32) -> Result<&Slice, SliceOpError> {
        let name = self.get(name_or_id)?.name().to_string();
        let workload = crate::owner::owner_of(pid).ok_or_else(|| SliceOpError::BadRequest(format!("workload process {pid} does not exist")))?;
        let slice = self.slices.get_mut(&name).expect("looked up above");
        let mut record = slice.record.clone();
        record.workload = Some(workload);
        self.store.put(&record)?;
        slice.record = record;
        tracing::info!(slice = %name, pid, "workload registered");
        Ok(slice)
    }

    /// Deletes ephemeral slices that nothing uses any more: the owner (the CLI) has
    /// exited, the workload it reported (if any) has exited, and no live process is
    /// attached. Pids are compared with their start times, so a reused pid is dead.
    pub fn collect_orphans(&mut self) -> Vec<String> {
        let gone = |o: &Option<crate::store::Owner>| o.as_ref().is_none_or(|o| !crate::owner::is_alive(o));
        let dead: Vec<String> = self
            .slices
            .values()
            .filter(|s| s.record.ephemeral && s.record.owner.is_some() && gone(&s.record.owner) && gone(&s.record.workload) && !s.usage.detached() && s.live_pids().is_empty())
            .map(|s| s.name().to_string())
            .collect();
        dead.into_iter()
            .filter(|name| match self.delete(name, false) {
                Ok(_) => {
                    tracing::info!(slice = %name, "removed ephemeral slice whose owner and workload exited");
                    true
                }
                Err(e) => {
                    tracing::warn!(slice = %name, error = %e, "could not remove orphaned ephemeral slice");
                    false
                }
            })
            .collect()
    }
}

/// Puts right a usage file that a process of the slice truncated (the
/// truncation guard's handler extends it at the first fault; this finds a
/// cut nothing has touched yet, writes the header again and reports).
fn restore_usage(s: &mut Slice) {
    match s.usage.restore_length() {
        Ok(None) => {}
        Ok(Some(r)) => {
            s.usage_repairs += 1;
            if r.detached {
                tracing::error!(slice = %s.name(), file = %s.usage.path().display(),
                    "usage file truncated again and again by a process of the slice; egpud maps it anew at every sweep, and until then counts the slice at its burst cap");
            } else {
                tracing::warn!(slice = %s.name(), file = %s.usage.path().display(), cut_to = ?r.cut_to, faults = r.faults, header = r.header,
                    "usage file was truncated (or its header overwritten) by a process of the slice; put it right (charges recorded in a cut part are lost)");
            }
        }
        Err(e) => tracing::warn!(slice = %s.name(), error = %e, "cannot check the usage file's length"),
    }
    // Given up by the guard (cut again and again): a new mapping of the
    // file, now put right, reads the records again.
    if s.usage.detached() {
        match UsageFile::open_restoring(s.usage.path(), s.record.spec.devices.len()) {
            Ok((u, _)) => s.usage = Arc::new(u),
            Err(e) => tracing::warn!(slice = %s.name(), error = %e, "cannot map the usage file anew"),
        }
    }
}

fn log_recreate(path: &Path, why: &str, report: &mut AdoptReport) {
    tracing::warn!(file = %path.display(), reason = why,
        "slice-table file unusable; recreated it from the store (processes still attached to the old file keep the old limits until they restart)");
    report.recreated.push((path.into(), why.into()));
}

mod audit;
#[cfg(test)]
mod tests;

/// The directories under `slices_dir`, by name (none if it cannot be listed).
fn slice_dirs(slices_dir: &Path) -> Vec<(String, PathBuf)> {
    match std::fs::read_dir(slices_dir) {
        Ok(entries) => entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| (e.file_name().to_string_lossy().into_owned(), e.path())).collect(),
        Err(e) => {
            tracing::warn!(dir = %slices_dir.display(), error = %e, "cannot list slice directories");
            Vec::new()
        }
    }
}

/// Whether the slice directory `dir` holds a live slice: its limits are not
/// marked deleted, or cannot be read (another ABI version, a corrupt file,
/// an error) while a process is attached to its usage file (a record lock
/// held, whatever the layout). A directory with no limits file and nothing
/// attached is what an interrupted create or delete leaves.
fn live_dir(dir: &Path) -> bool {
    match egpu_abi::LimitsReader::open(&paths::limits_path(dir)) {
        Ok(l) => l.snapshot().state != egpu_abi::SliceState::Deleted,
        Err(egpu_abi::AbiError::Missing(_)) => false,
        Err(_) => usage_locked_by_other(dir),
    }
}

/// Whether another process holds a record lock in `dir`'s usage file,
/// whatever its layout (one of another ABI version included).
fn usage_locked_by_other(dir: &Path) -> bool {
    std::fs::File::open(paths::usage_path(dir)).is_ok_and(|f| egpu_abi::map::any_lock_by_other(&f).unwrap_or(false))
}
