//! Admission: may a slice spec be placed on this node next to the others?
//!
//! Pure functions over the inventory and the other slices' specs, so they are
//! property-tested on their own. Rules, per device:
//! - the sum of the slices' memory limits is at most the device's memory;
//! - the sum of the guaranteed compute shares is at most 100%;
//! - a burst cap is at most the device's memory.
//!
//! Next to slices that burst, what is lent out now must fit too
//! ([`crate::burst::check_lent`]).

use crate::devices::DeviceInfo;
use egpu_core::{Bytes, Percent, SliceError, SliceSpec};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapacityError {
    #[error(transparent)]
    Spec(#[from] SliceError),
    #[error("device {device} does not exist: this node has {count} device(s), 0..{count} (see `egpu devices`)")]
    NoSuchDevice { device: u32, count: usize },
    #[error("a slice may span at most {max} devices, {requested} requested")]
    TooManyDevices { requested: usize, max: usize },
    #[error("device {device}: {requested} requested but the device has only {total} of memory")]
    AboveDevice { device: u32, requested: Bytes, total: Bytes },
    #[error("device {device}: {requested} of memory requested but only {free} of {total} is free (other slices hold the rest; see `egpu devices`)")]
    Memory { device: u32, requested: Bytes, free: Bytes, total: Bytes },
    #[error("device {device}: {requested} of memory requested but only {free} is free now: {lent} of the device is lent out to bursting slices; it comes back as they free it (retry later, or lower the request)")]
    Lent { device: u32, requested: Bytes, free: Bytes, lent: Bytes },
    #[error("device {device}: a burst cap of {requested} requested but the device has only {total} of memory")]
    BurstAboveDevice { device: u32, requested: Bytes, total: Bytes },
    #[error("device {device}: a compute share of {requested} requested but only {free} is unreserved (shares on a device add up to at most 100%)")]
    Compute { device: u32, requested: Percent, free: Percent },
}

impl CapacityError {
    /// Whether the request was well-formed but does not fit (overcommit).
    pub fn is_overcommit(&self) -> bool {
        matches!(self, CapacityError::AboveDevice { .. } | CapacityError::BurstAboveDevice { .. } | CapacityError::Memory { .. } | CapacityError::Lent { .. } | CapacityError::Compute { .. })
    }
}

/// What the other slices hold on one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allocated {
    pub memory: u64,
    pub compute_share_bps: u32,
}

/// Sums of the memory limits and compute shares of `slices`, per device index.
pub fn allocated<'a>(n_devices: usize, slices: impl IntoIterator<Item = &'a SliceSpec>) -> Vec<Allocated> {
    let mut out = vec![Allocated::default(); n_devices];
    for s in slices {
        for d in &s.devices {
            if let Some(a) = out.get_mut(d.device as usize) {
                a.memory = a.memory.saturating_add(d.memory.0);
                a.compute_share_bps = a.compute_share_bps.saturating_add(d.compute_share.0);
            }
        }
    }
    out
}

/// Checks `spec` against the node's `devices`, given what `others` (every
/// other slice, not the one being created or resized) hold.
pub fn check<'a>(devices: &[DeviceInfo], others: impl IntoIterator<Item = &'a SliceSpec>, spec: &SliceSpec) -> Result<(), CapacityError> {
    spec.validate()?;
    if spec.devices.len() > egpu_abi::MAX_DEVICES {
        return Err(CapacityError::TooManyDevices { requested: spec.devices.len(), max: egpu_abi::MAX_DEVICES });
    }
    for d in &spec.devices {
        if d.device as usize >= devices.len() {
            return Err(CapacityError::NoSuchDevice { device: d.device, count: devices.len() });
        }
    }
    let alloc = allocated(devices.len(), others);
    for d in &spec.devices {
        let dev = &devices[d.device as usize];
        let total = dev.memory_bytes;
        if d.memory.0 > total {
            return Err(CapacityError::AboveDevice { device: d.device, requested: d.memory, total: Bytes(total) });
        }
        if d.memory_burst.0 > total {
            return Err(CapacityError::BurstAboveDevice { device: d.device, requested: d.memory_burst, total: Bytes(total) });
        }
        let a = alloc[d.device as usize];
        let free = total.saturating_sub(a.memory);
        if d.memory.0 > free {
            return Err(CapacityError::Memory { device: d.device, requested: d.memory, free: Bytes(free), total: Bytes(total) });
        }
        let free_bps = Percent::FULL.0.saturating_sub(a.compute_share_bps);
        if d.compute_share.0 > free_bps {
            return Err(CapacityError::Compute { device: d.device, requested: d.compute_share, free: Percent(free_bps) });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::FakeGpus;
    use egpu_core::{DeviceShare, Priority};
    use proptest::prelude::*;

    fn devs(n: u32, gib: u64) -> Vec<DeviceInfo> {
        FakeGpus::new(n, gib * Bytes::GIB).devices
    }

    fn spec(name: &str, shares: &[(u32, u64, u32)]) -> SliceSpec {
        SliceSpec {
            name: name.into(),
            priority: Priority::Normal,
            devices: shares
                .iter()
                .map(|&(device, mib, share)| DeviceShare {
                    device,
                    memory: Bytes::mib(mib),
                    memory_burst: Bytes(0),
                    compute_share: Percent(share),
                    compute_limit: Percent::FULL,
                })
                .collect(),
        }
    }

    #[test]
    fn fits_and_overcommit_messages() {
        let d = devs(2, 16);
        let a = spec("a", &[(0, 12 * 1024, 5000)]);
        assert_eq!(check(&d, [], &a), Ok(()));
        let b = spec("b", &[(0, 8 * 1024, 0)]);
        let e = check(&d, [&a], &b).unwrap_err();
        assert!(e.is_overcommit());
        assert!(e.to_string().contains("only 4GiB of 16GiB is free"), "{e}");
        let c = spec("c", &[(0, 1024, 6000)]);
        let e = check(&d, [&a], &c).unwrap_err();
        assert!(e.to_string().contains("only 50% is unreserved"), "{e}");
        let big = spec("big", &[(1, 17 * 1024, 0)]);
        assert!(check(&d, [], &big).unwrap_err().to_string().contains("has only 16GiB"));
        let nodev = spec("x", &[(2, 1, 0)]);
        assert_eq!(check(&d, [], &nodev), Err(CapacityError::NoSuchDevice { device: 2, count: 2 }));
        assert!(matches!(check(&d, [], &spec("Bad Name", &[(0, 1, 0)])), Err(CapacityError::Spec(_))));
    }

    proptest! {
        /// Whatever sequence of requests is admitted, no device is ever overcommitted,
        /// and a request is refused only if it is invalid or would overcommit.
        #[test]
        fn admitted_never_overcommit(reqs in proptest::collection::vec(
            (proptest::collection::vec((0u32..4, 0u64..20_000, 0u32..12_000), 0..4), any::<bool>()), 1..40)) {
            let d = devs(3, 16);
            let mut admitted: Vec<SliceSpec> = Vec::new();
            for (i, (shares, _)) in reqs.iter().enumerate() {
                let s = spec(&format!("s{i}"), shares);
                match check(&d, admitted.iter(), &s) {
                    Ok(()) => {
                        prop_assert!(s.validate().is_ok());
                        admitted.push(s);
                    }
                    Err(CapacityError::Spec(_)) => prop_assert!(s.validate().is_err()),
                    Err(CapacityError::NoSuchDevice { device, .. }) => prop_assert!(device >= 3),
                    Err(e) => {
                        prop_assert!(e.is_overcommit());
                        // It really would not fit.
                        let mut with = admitted.clone();
                        with.push(s.clone());
                        let a = allocated(3, with.iter());
                        prop_assert!(a.iter().zip(&d).any(|(a, dev)| a.memory > dev.memory_bytes || a.compute_share_bps > 10_000));
                    }
                }
                let a = allocated(3, admitted.iter());
                for (a, dev) in a.iter().zip(&d) {
                    prop_assert!(a.memory <= dev.memory_bytes);
                    prop_assert!(a.compute_share_bps <= 10_000);
                }
            }
        }
    }
}
