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
//! records are read just before and just after the driver's list, and the
//! larger reading is used: a figure above it means memory held at the
//! moment of the driver's list that no charge covered at either reading,
//! which only an allocation made and freed within the driver call can fake;
//! [`SAMPLES`] audits in a row take the smallest figure.

use crate::agent::{Node, NodeTask};
use crate::devices::ProcMemory;
use std::collections::BTreeMap;
use std::time::Duration;

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

/// Charges read before the driver's list: per slice id, per slice device.
pub type Charges = BTreeMap<String, Vec<(usize, u64)>>;

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
            let before = node.slices().charges_on(d.index);
            let listed = node.gpus.process_memory(d.index);
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

    #[test]
    fn modes_parse_and_print() {
        for m in [AuditMode::Off, AuditMode::Report, AuditMode::Charge] {
            assert_eq!(m.to_string().parse::<AuditMode>(), Ok(m));
        }
        let e = "on".parse::<AuditMode>().unwrap_err();
        assert!(e.contains("off, report or charge"), "{e}");
    }
}
