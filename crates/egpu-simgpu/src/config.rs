//! Configuration from the environment, read once per process (re-read after
//! `fork` only with the rest of the process state).

use egpu_core::SimSpec;
use std::path::PathBuf;

/// Default `EGPU_SIM_GPUS`.
pub const DEFAULT_SPEC: &str = "1x16GiB";
/// Default `EGPU_SIM_CTX_BYTES`: what one context costs on its device.
pub const DEFAULT_CTX_BYTES: u64 = 32 << 20;

/// How NVLink is modelled (`EGPU_SIM_NVLINK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvLinkMode {
    /// No NVLink: peers talk over PCIe (P2P still supported).
    None,
    /// All devices in one NVLink domain (default).
    All,
    /// Devices 2k and 2k+1 are linked to each other only.
    Pairs,
}

impl NvLinkMode {
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" | "off" | "0" => Some(Self::None),
            "" | "all" | "on" | "1" => Some(Self::All),
            "pairs" => Some(Self::Pairs),
            _ => None,
        }
    }

    /// Whether devices `a` and `b` (physical indices) share an NVLink.
    pub fn linked(self, a: usize, b: usize) -> bool {
        a != b
            && match self {
                Self::None => false,
                Self::All => true,
                Self::Pairs => a / 2 == b / 2,
            }
    }
}

/// Everything the simulator reads from the environment.
#[derive(Debug, Clone)]
pub struct Config {
    /// The `EGPU_SIM_GPUS` text as given (for messages).
    pub spec_text: String,
    pub spec: SimSpec,
    pub state_path: PathBuf,
    pub ctx_bytes: u64,
    /// Kernel cost in nanoseconds per launched thread.
    pub ns_per_thread: f64,
    pub nvlink: NvLinkMode,
    /// `EGPU_SIM_PCIE=pairs`: devices 2k and 2k+1 sit under one PCIe switch
    /// (`NVML_TOPOLOGY_SINGLE`); otherwise (`flat`, the default) every pair
    /// meets at the host bridge.
    pub pcie_pairs: bool,
    /// `CUDA_VISIBLE_DEVICES` (None when unset).
    pub visible: Option<String>,
    /// `EGPU_SIM_POOL_SIZES=hidden`: pools do not report their reserved and
    /// used sizes (`cuMemPoolGetAttribute` fails for them), as a driver might
    /// not for some kinds of pool; for testing the hook's fallback.
    pub pool_sizes_hidden: bool,
    /// `EGPU_SIM_PRIMARY_RESET=drops-retains`: `cuDevicePrimaryCtxReset`
    /// also drops the primary context's reference count to zero. The
    /// default (`keeps-retains`) is what the CUDA documentation says: a
    /// reset destroys the context but does not release it, so the
    /// references retained before it still count.
    pub reset_drops_retains: bool,
}

fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// The default state file for this user.
pub fn default_state_path() -> PathBuf {
    PathBuf::from(format!("/dev/shm/egpu-simgpu.{}.state", uid()))
}

impl Config {
    /// Reads the environment. Errors are one-line messages for stderr.
    pub fn from_env() -> Result<Self, String> {
        let get = |k: &str| std::env::var(k).ok();
        Self::from_lookup(get)
    }

    /// Like [`Config::from_env`], with an injectable lookup (for tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let spec_text = get("EGPU_SIM_GPUS").filter(|s| !s.trim().is_empty()).unwrap_or_else(|| DEFAULT_SPEC.into());
        let spec: SimSpec = spec_text.parse().map_err(|e| format!("EGPU_SIM_GPUS={spec_text:?}: {e}"))?;
        let state_path = get("EGPU_SIM_STATE").filter(|s| !s.is_empty()).map(PathBuf::from).unwrap_or_else(default_state_path);
        let ctx_bytes = match get("EGPU_SIM_CTX_BYTES") {
            None => DEFAULT_CTX_BYTES,
            Some(s) => s
                .parse::<egpu_core::Bytes>()
                .map_err(|e| format!("EGPU_SIM_CTX_BYTES={s:?}: {e}"))?
                .0,
        };
        let ns_per_thread = match get("EGPU_SIM_NS_PER_THREAD") {
            None => 1.0,
            Some(s) => match s.trim().parse::<f64>() {
                Ok(v) if v.is_finite() && v >= 0.0 => v,
                _ => return Err(format!("EGPU_SIM_NS_PER_THREAD={s:?}: expected a non-negative number such as 1 or 0.5")),
            },
        };
        let nvlink = match get("EGPU_SIM_NVLINK") {
            None => NvLinkMode::All,
            Some(s) => NvLinkMode::parse(&s).ok_or_else(|| format!("EGPU_SIM_NVLINK={s:?}: expected none, all or pairs"))?,
        };
        let pcie_pairs = match get("EGPU_SIM_PCIE").as_deref().map(str::trim) {
            None | Some("" | "flat") => false,
            Some("pairs") => true,
            Some(s) => return Err(format!("EGPU_SIM_PCIE={s:?}: expected flat or pairs")),
        };
        let pool_sizes_hidden = match get("EGPU_SIM_POOL_SIZES").as_deref() {
            None | Some("shown") => false,
            Some("hidden") => true,
            Some(s) => return Err(format!("EGPU_SIM_POOL_SIZES={s:?}: expected shown or hidden")),
        };
        let reset_drops_retains = match get("EGPU_SIM_PRIMARY_RESET").as_deref().map(str::trim) {
            None | Some("" | "keeps-retains") => false,
            Some("drops-retains") => true,
            Some(s) => return Err(format!("EGPU_SIM_PRIMARY_RESET={s:?}: expected keeps-retains or drops-retains")),
        };
        let visible = get("CUDA_VISIBLE_DEVICES");
        Ok(Config { spec_text, spec, state_path, ctx_bytes, ns_per_thread, nvlink, pcie_pairs, visible, pool_sizes_hidden, reset_drops_retains })
    }

    /// Canonical form of the spec stored in the state file: two processes
    /// agree on the devices iff these strings are equal.
    pub fn canonical_spec(&self) -> String {
        canonical(&self.spec)
    }
}

/// Canonical text of a spec: `name|bytes|sms` per device, `;`-separated.
pub fn canonical(spec: &SimSpec) -> String {
    spec.devices
        .iter()
        .map(|d| format!("{}|{}|{}", d.name, d.memory.0, d.sm_count))
        .collect::<Vec<_>>()
        .join(";")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config, String> {
        let map: std::collections::HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.spec.devices.len(), 1);
        assert_eq!(c.spec.devices[0].memory.0, 16 << 30);
        assert_eq!(c.ctx_bytes, 32 << 20);
        assert_eq!(c.ns_per_thread, 1.0);
        assert_eq!(c.nvlink, NvLinkMode::All);
        assert!(c.state_path.to_string_lossy().starts_with("/dev/shm/egpu-simgpu."));
    }

    #[test]
    fn overrides_and_errors() {
        let c = cfg(&[("EGPU_SIM_GPUS", "2x80GiB"), ("EGPU_SIM_NS_PER_THREAD", "0.5"), ("EGPU_SIM_CTX_BYTES", "1MiB")]).unwrap();
        assert_eq!(c.spec.devices.len(), 2);
        assert_eq!(c.ns_per_thread, 0.5);
        assert_eq!(c.ctx_bytes, 1 << 20);
        assert!(cfg(&[("EGPU_SIM_GPUS", "2xbanana")]).unwrap_err().contains("EGPU_SIM_GPUS"));
        assert!(cfg(&[("EGPU_SIM_NS_PER_THREAD", "-1")]).is_err());
        assert!(cfg(&[("EGPU_SIM_NVLINK", "mesh")]).is_err());
        assert!(cfg(&[("EGPU_SIM_PCIE", "pairs")]).unwrap().pcie_pairs && !cfg(&[]).unwrap().pcie_pairs);
        assert!(cfg(&[("EGPU_SIM_PCIE", "tree")]).unwrap_err().contains("flat or pairs"));
        assert!(cfg(&[("EGPU_SIM_PRIMARY_RESET", "drops-retains")]).unwrap().reset_drops_retains && !cfg(&[]).unwrap().reset_drops_retains);
        assert!(cfg(&[("EGPU_SIM_PRIMARY_RESET", "releases")]).unwrap_err().contains("keeps-retains or drops-retains"));
        assert_ne!(canonical(&"2x80GiB".parse().unwrap()), canonical(&"2x40GiB".parse().unwrap()));
    }

    #[test]
    fn nvlink_modes() {
        assert!(NvLinkMode::All.linked(0, 5));
        assert!(!NvLinkMode::All.linked(3, 3));
        assert!(NvLinkMode::Pairs.linked(2, 3));
        assert!(!NvLinkMode::Pairs.linked(1, 2));
        assert!(!NvLinkMode::None.linked(0, 1));
    }
}
