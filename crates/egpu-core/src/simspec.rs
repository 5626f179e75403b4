//! The simulated-GPU spec, `EGPU_SIM_GPUS`.
//!
//! Grammar: a comma-separated list of groups, each `COUNTxSIZE` or
//! `COUNTxMODEL-SIZE`, for example `2x80GiB`, `8xH100-80GB`,
//! `1xA100-40GB,2x16GiB`. `SIZE` uses the units of [`Bytes`]; for a model
//! name the size suffix `GB` is read the way vendors mean it (binary, as in
//! "H100 80GB" = 80 GiB), because that is what the model names say.
//!
//! Both the simulated driver and `egpud --simulate` parse the same string with
//! this code and derive device UUIDs with [`sim_uuid`], so they agree on
//! identity without talking to each other.

use crate::quantity::{Bytes, QuantityError};

/// One simulated device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimDevice {
    pub index: u32,
    /// Marketing name as NVML and `cuDeviceGetName` report it.
    pub name: String,
    pub memory: Bytes,
    pub sm_count: u32,
    pub uuid: String,
}

/// A parsed `EGPU_SIM_GPUS` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimSpec {
    pub devices: Vec<SimDevice>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimSpecError {
    #[error("empty simulated-GPU spec: give e.g. 2x80GiB or 8xH100-80GB")]
    Empty,
    #[error("'{group}' is not COUNTxSIZE or COUNTxMODEL-SIZE (e.g. 2x80GiB, 8xH100-80GB)")]
    Syntax { group: String },
    #[error("'{group}': device count must be 1..=64")]
    Count { group: String },
    #[error("'{group}': bad memory size")]
    Size {
        group: String,
        #[source]
        source: QuantityError,
    },
    #[error("'{group}': a device needs at least 64MiB of memory")]
    TooSmall { group: String },
    #[error("spec has {0} devices; at most 64 simulated devices are supported")]
    TooMany(usize),
}

/// Deterministic UUID of simulated device `index`, in NVML's `GPU-` form.
pub fn sim_uuid(index: u32) -> String {
    format!("GPU-5e6d0000-0000-4000-8000-{:012x}", 0xE6B0_0000u64 + index as u64)
}

fn sm_count_for(model: &str) -> u32 {
    let m = model.to_ascii_uppercase();
    if m.starts_with("H100") || m.starts_with("H200") || m.starts_with("H800") || m.starts_with("H20") {
        132
    } else if m.starts_with("A100") || m.starts_with("A800") {
        108
    } else if m.starts_with("V100") {
        80
    } else if m.starts_with("T4") {
        40
    } else if m.starts_with("A10") {
        72
    } else {
        108
    }
}

impl std::str::FromStr for SimSpec {
    type Err = SimSpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(SimSpecError::Empty);
        }
        let mut devices = Vec::new();
        for group in s.split(',') {
            let group = group.trim();
            let syntax = || SimSpecError::Syntax { group: group.to_string() };
            let (count, rest) = group.split_once(['x', 'X']).ok_or_else(syntax)?;
            let count: usize = count.trim().parse().map_err(|_| syntax())?;
            if count == 0 || count > 64 {
                return Err(SimSpecError::Count { group: group.to_string() });
            }
            let rest = rest.trim();
            let (model, size) = match rest.rsplit_once('-') {
                Some((m, sz)) if !m.is_empty() => (Some(m), sz),
                _ => (None, rest),
            };
            // Vendor model names say "80GB" and mean 80 GiB.
            let size_str = match model {
                Some(_) if size.to_ascii_uppercase().ends_with("GB") && !size.to_ascii_uppercase().ends_with("GIB") => {
                    format!("{}GiB", &size[..size.len() - 2])
                }
                _ => size.to_string(),
            };
            let memory: Bytes = size_str
                .parse()
                .map_err(|source| SimSpecError::Size { group: group.to_string(), source })?;
            if memory.0 < 64 * Bytes::MIB {
                return Err(SimSpecError::TooSmall { group: group.to_string() });
            }
            let name = match model {
                Some(m) => format!("NVIDIA {m}-{size} (eGPU simulated)"),
                None => format!("eGPU Simulated GPU {memory}"),
            };
            let sm_count = sm_count_for(model.unwrap_or(""));
            for _ in 0..count {
                let index = devices.len() as u32;
                devices.push(SimDevice { index, name: name.clone(), memory, sm_count, uuid: sim_uuid(index) });
            }
        }
        if devices.len() > 64 {
            return Err(SimSpecError::TooMany(devices.len()));
        }
        Ok(SimSpec { devices })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_model_specs() {
        let s: SimSpec = "2x80GiB".parse().unwrap();
        assert_eq!(s.devices.len(), 2);
        assert_eq!(s.devices[1].memory, Bytes::gib(80));
        assert_ne!(s.devices[0].uuid, s.devices[1].uuid);

        let s: SimSpec = "8xH100-80GB".parse().unwrap();
        assert_eq!(s.devices.len(), 8);
        assert_eq!(s.devices[0].memory, Bytes::gib(80));
        assert!(s.devices[0].name.contains("H100"));
        assert_eq!(s.devices[0].sm_count, 132);

        let s: SimSpec = "1xA100-40GB, 2x16GiB".parse().unwrap();
        assert_eq!(s.devices.len(), 3);
        assert_eq!(s.devices[2].index, 2);
        assert_eq!(s.devices[2].memory, Bytes::gib(16));
    }

    #[test]
    fn errors_name_the_group() {
        for bad in ["", "x80GiB", "0x80GiB", "2x", "2xfoo", "2x1KiB", "65x1GiB", "two x 8GiB"] {
            let e = bad.parse::<SimSpec>().unwrap_err();
            assert!(!e.to_string().is_empty(), "{bad}");
        }
        assert!(matches!("2x1KiB".parse::<SimSpec>(), Err(SimSpecError::TooSmall { .. })));
        assert!(matches!("40x1GiB,40x1GiB".parse::<SimSpec>(), Err(SimSpecError::TooMany(80))));
    }
}
