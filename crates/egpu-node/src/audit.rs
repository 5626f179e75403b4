//! The memory audit: what the driver says each slice's processes hold,
//! against what their usage records charge.
//!
//! The hook charges every allocation it intercepts. Memory it cannot follow
//! still shows in the driver's per-process accounting: a VMM handle exported
//! and imported back, then released (`docs/hook.md`, "Open gaps"), a
//! context that grew after it was measured, any path not intercepted. Once a
//! second, for each device, [`MemoryAudit`] reads what every process holds
//! (NVML's running-process lists), adds it up for the live processes of each
//! slice, and subtracts what the slice's records charge; what is left beyond
//! a slack, in [`SAMPLES`] audits in a row, is the slice's *untracked*
//! memory. It is reported (`egpu ls`, metrics, a warning); with
//! `--memory-audit charge` it is also published in the limits file, and the
//! hook counts it as used, so the slice cannot allocate past its limit
//! through such a path. Why it is built this way: `docs/node.md`, "Memory
//! audit".
//!
//! No false positive from the hook's own timing: it charges before the real
//! allocation and uncharges after the real free, so at every instant the
//! records charge at least what the driver holds for tracked memory. The
//! records are read just before the driver's list, again and again while it
//! is taken ([`ChargeSampler`], a second thread), and just after it, and
//! the largest reading is used: a figure above it means memory held at the
//! moment of the driver's list that no charge covered at any reading, which
//! only an allocation both made and freed between two readings can fake;
//! [`SAMPLES`] audits in a row take the smallest figure.

use crate::agent::{Node, NodeTask};
use crate::devices::ProcMemory;
use egpu_abi::UsageFile;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What `egpud --memory-audit` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditMode {
    /// No audit.
    Off,
    /// Audit and report (listings, metrics, log); limits unchanged.
    #[default]
    Report,
    /// Report, and count untracked memory against the slice's limit.
    Charge,
}

impl std::str::FromStr for AuditMode {
    type Err = String;
    fn from_str(s: &str) -> Result<AuditMode, String> {
        match s {
            "off" => Ok(AuditMode::Off),
            "report" => Ok(AuditMode::Report),
            "charge" => Ok(AuditMode::Charge),
            _ => Err(format!("unknown memory audit mode '{s}': use off, report or charge")),
        }
    }
}

impl std::fmt::Display for AuditMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AuditMode::Off => "off",
            AuditMode::Report => "report",
            AuditMode::Charge => "charge",
        })
    }
}

/// How often the audit runs.
pub const PERIOD: Duration = Duration::from_secs(1);
/// Audits in a row a figure must hold in (the smallest counts).
pub const SAMPLES: usize = 3;
/// Default slack per slice device: what the driver may hold beyond the
/// charges without it counting (page rounding of allocations).
pub const DEFAULT_SLACK: u64 = 64 << 20;

/// One slice device's audit state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceAudit {
    /// What the driver reported for the slice's live processes at the last
    /// audit (`None`: not audited, or the driver cannot say).
    pub driver: Option<u64>,
    /// The last figures, newest last, at most [`SAMPLES`].
    recent: Vec<u64>,
    /// The untracked memory now: the smallest of [`SAMPLES`] figures in a
    /// row (until there are that many, what an earlier `egpud` published).
    pub untracked: u64,
}

impl DeviceAudit {
    /// Starts from what an earlier `egpud` published (0 for a new slice).
    pub fn carried(untracked: u64) -> DeviceAudit {
        DeviceAudit { driver: None, recent: Vec::new(), untracked }
    }

    /// Takes one audit: the driver's figure for the slice's live processes
    /// and the larger of the two readings of their charges. Returns the new
    /// untracked figure.
    pub fn observe(&mut self, driver: u64, charged: u64, slack: u64) -> u64 {
        self.driver = Some(driver);
        if self.recent.len() == SAMPLES {
            self.recent.remove(0);
        }
        self.recent.push(driver.saturating_sub(charged).saturating_sub(slack));
        if self.recent.len() == SAMPLES {
            self.untracked = self.recent.iter().copied().min().unwrap_or(0);
        }
        self.untracked
    }

    /// The driver cannot say: nothing is counted.
    pub fn unknown(&mut self) {
        *self = DeviceAudit::default();
    }
}

/// The largest charges read around the driver's list: per slice id, per
/// slice device.
pub type Charges = BTreeMap<String, Vec<(usize, u64)>>;

/// How long [`ChargeSampler::during`] reads the records back to back (a
/// yield between two readings); a
/// driver call still running after that is sampled once a [`SLOW_SAMPLE`]
/// (a driver that hangs must not keep a core busy).
pub const DENSE: Duration = Duration::from_millis(20);
/// The wait between readings once [`DENSE`] has passed.
pub const SLOW_SAMPLE: Duration = Duration::from_millis(1);

/// The usage records of the slices on one device, read again and again
/// while the driver's per-process list is taken.
///
/// The driver's list is a snapshot at one instant inside the call. A
/// process that allocates one buffer and frees another (or allocates and
/// frees one) while the call runs holds, at that instant, memory that the
/// records charged only between a reading before the call and one after.
/// Read back to back from a second thread, the records are caught in that
/// state unless both the allocation and the free fall between two
/// readings. The sampler holds the usage files (shared with the slice
/// manager), not the slice manager's lock, so the API is not held up while
/// the driver answers.
pub struct ChargeSampler {
    files: Vec<(String, Arc<UsageFile>, Vec<usize>)>,
    /// Readings taken (for tests).
    samples: AtomicU64,
}

impl ChargeSampler {
    /// `files`: per slice id, its usage file and its slice devices on the
    /// audited device.
    pub fn new(files: Vec<(String, Arc<UsageFile>, Vec<usize>)>) -> ChargeSampler {
        ChargeSampler { files, samples: AtomicU64::new(0) }
    }

    /// Readings taken so far.
    pub fn samples(&self) -> u64 {
        self.samples.load(Ordering::Acquire)
    }

    /// One reading, folded into `max` (per file, per listed device).
    fn read(&self, max: &mut [Vec<u64>]) {
        for ((_, usage, devs), m) in self.files.iter().zip(max.iter_mut()) {
            for (&d, m) in devs.iter().zip(m.iter_mut()) {
                *m = (*m).max(usage.used(d));
            }
        }
        self.samples.fetch_add(1, Ordering::AcqRel);
    }

    /// Runs `call` (the driver's list) on this thread while a second thread
    /// reads the records as often as it can. Returns what `call` returned
    /// and, per slice device, the largest charge read from just before
    /// `call` started to just after it returned. If no thread can be
    /// started, the records are read once before and once after.
    pub fn during<T>(&self, call: impl FnOnce() -> T) -> (T, Charges) {
        let mut max: Vec<Vec<u64>> = self.files.iter().map(|(_, _, d)| vec![0; d.len()]).collect();
        self.read(&mut max);
        let stop = AtomicBool::new(false);
        let out = std::thread::scope(|sc| {
            let (stop, sampler) = (&stop, self);
            let mut mine = max.clone();
            let spawned = std::thread::Builder::new().name("egpud-audit-sampler".into()).spawn_scoped(sc, move || {
                let started = Instant::now();
                loop {
                    // Read once more after the stop: a reading after the call returned.
                    let last = stop.load(Ordering::Acquire);
                    sampler.read(&mut mine);
                    if last {
                        return mine;
                    }
                    if started.elapsed() < DENSE {
                        // Not a spin: on a busy host the thread answering
                        // the driver call (or a workload) gets the core.
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(SLOW_SAMPLE);
                    }
                }
            });
            let out = call();
            stop.store(true, Ordering::Release);
            match spawned.map(|h| h.join()) {
                Ok(Ok(sampled)) => max = sampled,
                Ok(Err(_)) | Err(_) => {
                    tracing::debug!("memory audit: no sampler thread; the records are read before and after the driver's list only");
                    self.read(&mut max);
                }
            }
            out
        });
        let charges = self
            .files
            .iter()
            .zip(max)
            .map(|((id, _, devs), m)| (id.clone(), devs.iter().copied().zip(m).collect()))
            .collect();
        (out, charges)
    }
}

/// The periodic audit task (runs unless `--memory-audit off`; whether it
/// publishes what it finds is the slice manager's
/// [`crate::slices::SliceManager::set_audit`]).
pub struct MemoryAudit {
    pub slack: u64,
    /// Devices whose driver error was logged (once until it clears).
    failing: BTreeMap<u32, String>,
}

impl MemoryAudit {
    pub fn new(slack: u64) -> MemoryAudit {
        MemoryAudit { slack, failing: BTreeMap::new() }
    }
}

impl NodeTask for MemoryAudit {
    fn name(&self) -> &'static str {
        "memory-audit"
    }
    fn period(&self) -> Duration {
        PERIOD
    }
    fn tick(&mut self, node: &Node) {
        for d in &node.inventory.devices {
            let sampler = node.slices().charge_sampler(d.index);
            let (listed, before) = sampler.during(|| node.gpus.process_memory(d.index));
            let listed: Option<Vec<ProcMemory>> = match listed {
                Ok(l) => {
                    if self.failing.remove(&d.index).is_some() {
                        tracing::info!(device = d.index, "the driver answers the memory audit again");
                    }
                    l
                }
                Err(e) => {
                    let msg = crate::wire::chain(&e);
                    if self.failing.get(&d.index) != Some(&msg) {
                        tracing::warn!(device = d.index, error = %msg, "memory audit: cannot read the driver's per-process memory; nothing is counted on this device until it answers");
                        self.failing.insert(d.index, msg);
                    }
                    None
                }
            };
            node.slices().audit_device(d.index, &before, listed.as_deref(), self.slack);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_counts_after_three_audits_in_a_row_at_its_smallest() {
        let mut a = DeviceAudit::default();
        assert_eq!(a.observe(1000, 100, 0), 0, "one audit is not enough");
        assert_eq!(a.observe(1000, 100, 0), 0);
        assert_eq!(a.observe(700, 100, 0), 600, "the smallest of three");
        assert_eq!(a.observe(1000, 100, 0), 600);
        assert_eq!(a.observe(1000, 100, 0), 600);
        assert_eq!(a.observe(1000, 100, 0), 900, "the 600 left the window");
        // One clean audit clears it.
        assert_eq!(a.observe(100, 100, 0), 0);
        assert_eq!(a.driver, Some(100));
    }

    #[test]
    fn slack_and_charges_above_the_driver_count_nothing() {
        let mut a = DeviceAudit::default();
        for _ in 0..SAMPLES {
            a.observe(100, 500, 0);
        }
        assert_eq!(a.untracked, 0, "charged above what the driver holds (a charge before the real allocation)");
        for _ in 0..SAMPLES {
            a.observe(600, 500, 64);
        }
        assert_eq!(a.untracked, 36);
        for _ in 0..SAMPLES {
            a.observe(560, 500, 64);
        }
        assert_eq!(a.untracked, 0, "within the slack");
    }

    #[test]
    fn a_carried_figure_holds_until_the_window_is_full_and_unknown_clears_it() {
        let mut a = DeviceAudit::carried(4096);
        assert_eq!(a.observe(0, 0, 0), 4096);
        assert_eq!(a.observe(0, 0, 0), 4096);
        assert_eq!(a.observe(0, 0, 0), 0);
        let mut b = DeviceAudit::carried(4096);
        b.unknown();
        assert_eq!(b, DeviceAudit::default());
    }

    /// A buffer allocated and another freed while the driver answers: the
    /// records charge both only in between, and the driver's snapshot may
    /// be taken then. Read only before and after the call (1 GiB, then
    /// 512 MiB), the audit would count the smaller buffer as untracked.
    #[test]
    fn the_sampler_reads_a_charge_held_only_while_the_driver_answers() {
        let dir = tempfile::tempdir().unwrap();
        let u = Arc::new(UsageFile::create(&dir.path().join("usage"), 2).unwrap());
        let slot = u.claim(std::process::id()).unwrap();
        let (a, b) = (1u64 << 30, 512u64 << 20);
        u.try_charge(&slot, 0, a, u64::MAX).unwrap();
        let s = ChargeSampler::new(vec![("x".into(), u.clone(), vec![0, 1])]);
        let (out, max) = s.during(|| {
            u.try_charge(&slot, 0, b, u64::MAX).unwrap();
            // A reading that completes after one that was under way has
            // started after the charge.
            // (Bounded: without a sampler thread the count never moves,
            // and the assertion below then says so.)
            let seen = s.samples();
            for _ in 0..10_000_000 {
                if s.samples() >= seen + 2 {
                    break;
                }
                std::thread::yield_now();
            }
            u.uncharge(&slot, 0, a);
            "listed"
        });
        assert_eq!(out, "listed");
        assert_eq!(u.used(0), b);
        assert_eq!(max["x"], vec![(0, a + b), (1, 0)], "the records read while both buffers were charged");
        let mut audit = DeviceAudit::default();
        for _ in 0..SAMPLES {
            audit.observe(a + b, max["x"][0].1, 0);
        }
        assert_eq!(audit.untracked, 0);
    }

    #[test]
    fn the_sampler_reads_the_records_after_the_call_returns() {
        let dir = tempfile::tempdir().unwrap();
        let u = Arc::new(UsageFile::create(&dir.path().join("usage"), 1).unwrap());
        let slot = u.claim(std::process::id()).unwrap();
        let s = ChargeSampler::new(vec![("x".into(), u.clone(), vec![0])]);
        // The charge is made at the very end of the call: only a reading
        // after it returned can see it.
        let ((), max) = s.during(|| {
            u.try_charge(&slot, 0, 4096, u64::MAX).unwrap();
        });
        assert_eq!(max["x"], vec![(0, 4096)]);
        assert!(s.samples() >= 2, "one reading before the call and one after: {}", s.samples());
        let (_, none) = ChargeSampler::new(Vec::new()).during(|| ());
        assert!(none.is_empty());
    }

    #[test]
    fn modes_parse_and_print() {
        for m in [AuditMode::Off, AuditMode::Report, AuditMode::Charge] {
            assert_eq!(m.to_string().parse::<AuditMode>(), Ok(m));
        }
        let e = "on".parse::<AuditMode>().unwrap_err();
        assert!(e.contains("off, report or charge"), "{e}");
    }
}
