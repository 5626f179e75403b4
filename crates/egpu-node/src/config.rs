//! Agent configuration, kept apart from flag parsing (the binary maps its
//! flags onto [`NodeConfig`]).

use std::path::PathBuf;
use std::time::Duration;

pub const DEFAULT_RUN_DIR: &str = "/run/egpu";
pub const DEFAULT_STATE_DIR: &str = "/var/lib/egpu";
/// egpud's socket with the default run directory.
pub const DEFAULT_SOCKET: &str = "/run/egpu/egpud.sock";
pub const SOCKET_FILE: &str = "egpud.sock";
/// Environment of the simulated driver (read by `libegpu_simgpu.so`).
pub const SIM_GPUS_ENV: &str = "EGPU_SIM_GPUS";
pub const SIM_STATE_ENV: &str = "EGPU_SIM_STATE";
/// Variables of the simulated driver passed on to workloads when egpud has
/// them: tuning, and the NVLink and PCIe topology (so that workloads see
/// the links egpud reports).
pub const SIM_PASSTHROUGH_ENV: [&str; 4] = ["EGPU_SIM_CTX_BYTES", "EGPU_SIM_NS_PER_THREAD", "EGPU_SIM_NVLINK", "EGPU_SIM_PCIE"];

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    pub run_dir: PathBuf,
    pub state_dir: PathBuf,
    /// Defaults to `<run_dir>/egpud.sock`.
    pub socket: Option<PathBuf>,
    /// `EGPU_SIM_GPUS` spec when the node runs on the simulated GPU.
    pub simulate: Option<String>,
    /// `libegpu.so`, preloaded into workloads.
    pub hook_lib: PathBuf,
    /// `libegpu_simgpu.so`, the simulated driver (only used with `simulate`).
    pub sim_lib: PathBuf,
    /// How often dead processes are swept and the heartbeat refreshed.
    pub sweep_period_ms: u64,
    /// Where to keep a CDI spec per slice (`egpud --cdi-dir`), for container runtimes.
    #[serde(default)]
    pub cdi_dir: Option<PathBuf>,
    /// `egpu-cdi-hook`, the check every slice's CDI spec runs before a container starts.
    #[serde(default)]
    pub cdi_hook: PathBuf,
    /// What the memory audit does (`egpud --memory-audit`, [`crate::audit`]).
    #[serde(default)]
    pub memory_audit: crate::audit::AuditMode,
    /// What the driver may hold per slice device beyond the charges
    /// without it counting as untracked, bytes.
    #[serde(default = "default_audit_slack")]
    pub memory_audit_slack: u64,
    /// Start even where the run directory holds live slices the store has
    /// no record of (`egpud --drop-unstored-slices`): they are marked
    /// deleted instead of stopping the start ([`crate::slices::SliceOpError::NotStored`]).
    #[serde(default)]
    pub drop_unstored_slices: bool,
    /// Take such slices back instead, from the spec their limits files
    /// publish (`egpud --adopt-unstored-slices`; [`crate::slices::Unstored::Adopt`]).
    #[serde(default)]
    pub adopt_unstored_slices: bool,
    /// Where the host's sysfs is mounted (`egpud --sysfs`; `/sys` unless
    /// the GPUs are simulated), read for each GPU's NUMA node and PCIe
    /// root; `None`: not read.
    #[serde(default)]
    pub sysfs: Option<PathBuf>,
}

fn default_audit_slack() -> u64 {
    crate::audit::DEFAULT_SLACK
}

impl NodeConfig {
    pub fn socket_path(&self) -> PathBuf {
        self.socket.clone().unwrap_or_else(|| self.run_dir.join(SOCKET_FILE))
    }

    pub fn sweep_period(&self) -> Duration {
        Duration::from_millis(self.sweep_period_ms.max(1))
    }

    pub fn sim_state_path(&self) -> PathBuf {
        self.run_dir.join(crate::simlib::SIM_STATE_FILE)
    }

    /// What adoption does with live slices the store has no record of
    /// (taking them back wins if a config sets both).
    pub fn unstored(&self) -> crate::slices::Unstored {
        use crate::slices::Unstored;
        match (self.adopt_unstored_slices, self.drop_unstored_slices) {
            (true, _) => Unstored::Adopt,
            (false, true) => Unstored::Drop,
            (false, false) => Unstored::Refuse,
        }
    }
}
