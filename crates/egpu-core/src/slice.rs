//! Slice specifications and their validation.
//!
//! A slice is a set of per-device shares. Each share has a hard memory limit,
//! a guaranteed compute share, a compute cap (at least the share) and a
//! priority class. Validation against a device's capacity (memory free, sum
//! of shares ≤ 100%) belongs to the node agent, which knows the other slices;
//! what can be checked from the spec alone is checked here.

use crate::quantity::{Bytes, Percent};
use std::fmt;

/// Longest slice name, in bytes. Names are also directory names.
pub const MAX_NAME_LEN: usize = 63;

/// Scheduling class of a slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Priority {
    /// Gets its guaranteed share back within one arbiter period when it wakes.
    High,
    #[default]
    Normal,
    /// Yields first; gets only what others leave.
    BestEffort,
}

impl Priority {
    /// Stable numeric code used on the wire and in the slice table.
    pub fn code(self) -> u32 {
        match self {
            Priority::High => 0,
            Priority::Normal => 1,
            Priority::BestEffort => 2,
        }
    }
    pub fn from_code(c: u32) -> Option<Priority> {
        Some(match c {
            0 => Priority::High,
            1 => Priority::Normal,
            2 => Priority::BestEffort,
            _ => return None,
        })
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::BestEffort => "best-effort",
        })
    }
}

impl std::str::FromStr for Priority {
    type Err = SliceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "high" => Ok(Priority::High),
            "normal" => Ok(Priority::Normal),
            "best-effort" | "besteffort" | "best_effort" => Ok(Priority::BestEffort),
            _ => Err(SliceError::BadPriority(s.to_string())),
        }
    }
}

/// One device's part of a slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceShare {
    /// Node-local device index (NVML order).
    pub device: u32,
    /// Guaranteed memory: reserved for the slice, and its hard limit unless
    /// it bursts.
    pub memory: Bytes,
    /// Burst cap: the slice's memory limit may be raised up to this, on
    /// demand, by borrowing device memory that no slice has reserved (the
    /// device's burst pool); 0 = no burst. At least `memory` when set.
    #[serde(default)]
    pub memory_burst: Bytes,
    /// Guaranteed share of the device's time whenever the slice has work.
    pub compute_share: Percent,
    /// Cap on the device's time; at least `compute_share`.
    pub compute_limit: Percent,
}

/// A whole slice as requested.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SliceSpec {
    pub name: String,
    pub priority: Priority,
    pub devices: Vec<DeviceShare>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SliceError {
    #[error("slice name '{0}' is invalid: use 1-63 characters from a-z, 0-9, '-', '_' and '.', starting and ending with a letter or digit")]
    BadName(String),
    #[error("unknown priority '{0}': use high, normal or best-effort")]
    BadPriority(String),
    #[error("a slice needs at least one device")]
    NoDevices,
    #[error("device {0} appears twice in the slice")]
    DuplicateDevice(u32),
    #[error("device {device}: memory limit must be greater than zero")]
    ZeroMemory { device: u32 },
    #[error("device {device}: compute limit {limit} is below the guaranteed share {share}; the limit must be at least the share")]
    LimitBelowShare { device: u32, share: Percent, limit: Percent },
    #[error("device {device}: memory burst cap {burst} is below the guaranteed memory {memory}; the burst cap must be at least the memory (or 0 for no burst)")]
    BurstBelowMemory { device: u32, memory: Bytes, burst: Bytes },
    #[error("device {device}: compute limit must be greater than 0%")]
    ZeroLimit { device: u32 },
}

/// Checks a slice name.
pub fn validate_name(name: &str) -> Result<(), SliceError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        // As Kubernetes names and CDI device names (`egpu.io/slice=NAME`) end.
        && name.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'));
    if ok { Ok(()) } else { Err(SliceError::BadName(shown(name))) }
}

/// A name as an error message shows it: at most 80 characters, then `…`
/// (a request may carry megabytes, and a gRPC status must fit in a header).
pub fn shown(name: &str) -> String {
    match name.char_indices().nth(80) {
        Some((at, _)) => format!("{}…", &name[..at]),
        None => name.to_string(),
    }
}

impl DeviceShare {
    /// The most memory the slice may hold on this device: the burst cap, or
    /// the guarantee when it does not burst.
    pub fn memory_cap(&self) -> Bytes {
        self.memory.max(self.memory_burst)
    }

    pub fn validate(&self) -> Result<(), SliceError> {
        if self.memory.0 == 0 {
            return Err(SliceError::ZeroMemory { device: self.device });
        }
        if self.memory_burst.0 != 0 && self.memory_burst < self.memory {
            return Err(SliceError::BurstBelowMemory { device: self.device, memory: self.memory, burst: self.memory_burst });
        }
        if self.compute_limit.0 == 0 {
            return Err(SliceError::ZeroLimit { device: self.device });
        }
        if self.compute_limit < self.compute_share {
            return Err(SliceError::LimitBelowShare {
                device: self.device,
                share: self.compute_share,
                limit: self.compute_limit,
            });
        }
        Ok(())
    }
}

impl SliceSpec {
    /// Checks everything that can be checked without knowing the node.
    pub fn validate(&self) -> Result<(), SliceError> {
        validate_name(&self.name)?;
        if self.devices.is_empty() {
            return Err(SliceError::NoDevices);
        }
        let mut seen = Vec::with_capacity(self.devices.len());
        for d in &self.devices {
            if seen.contains(&d.device) {
                return Err(SliceError::DuplicateDevice(d.device));
            }
            seen.push(d.device);
            d.validate()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(device: u32, gib: u64, s: u32, l: u32) -> DeviceShare {
        DeviceShare {
            device,
            memory: Bytes::gib(gib),
            memory_burst: Bytes(0),
            compute_share: Percent::from_pct(s),
            compute_limit: Percent::from_pct(l),
        }
    }

    #[test]
    fn a_long_bad_name_is_shown_shortened() {
        let e = validate_name(&"é".repeat(20_000)).unwrap_err().to_string();
        assert!(e.contains(&format!("'{}…'", "é".repeat(80))) && e.len() < 400, "{e}");
        assert_eq!(shown("short"), "short");
    }

    #[test]
    fn names() {
        assert!(validate_name("train-1").is_ok());
        assert!(validate_name("a.b_c").is_ok());
        for bad in ["", "-x", "x-", "x_", "x.", "Upper", "has space", "a/b", &"x".repeat(64)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn spec_validation() {
        let mut s = SliceSpec { name: "ok".into(), priority: Priority::High, devices: vec![share(0, 8, 25, 100)] };
        assert!(s.validate().is_ok());
        s.devices.push(share(0, 1, 0, 100));
        assert_eq!(s.validate(), Err(SliceError::DuplicateDevice(0)));
        s.devices = vec![share(1, 8, 50, 40)];
        assert!(matches!(s.validate(), Err(SliceError::LimitBelowShare { .. })));
        s.devices = vec![DeviceShare { memory_burst: Bytes::gib(4), ..share(1, 8, 0, 100) }];
        assert!(matches!(s.validate(), Err(SliceError::BurstBelowMemory { device: 1, .. })), "a burst cap below the guarantee");
        s.devices = vec![DeviceShare { memory_burst: Bytes::gib(8), ..share(1, 8, 0, 100) }];
        assert!(s.validate().is_ok(), "a burst cap equal to the guarantee");
        s.devices = vec![share(1, 0, 0, 100)];
        assert_eq!(s.validate(), Err(SliceError::ZeroMemory { device: 1 }));
        s.devices.clear();
        assert_eq!(s.validate(), Err(SliceError::NoDevices));
    }

    #[test]
    fn priority_parse_and_codes() {
        for p in [Priority::High, Priority::Normal, Priority::BestEffort] {
            assert_eq!(p.to_string().parse::<Priority>().unwrap(), p);
            assert_eq!(Priority::from_code(p.code()), Some(p));
        }
        assert!("urgent".parse::<Priority>().is_err());
    }
}
