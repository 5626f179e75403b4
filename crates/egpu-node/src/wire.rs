//! Conversions between the gRPC messages and the agent's types, with the
//! request validation that needs no node state, and the error → status map.

use crate::capacity::CapacityError;
use crate::launch::{EnvEntry, EnvMode};
use crate::proto;
use crate::slices::{CreateRequest, ResizeRequest, Slice, SliceOpError};
use egpu_core::{Bytes, DeviceShare, Percent, Priority, SliceSpec};
use tonic::{Code, Status};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("unknown priority value {0}")]
    Priority(i32),
    #[error("device {device}: {what} of {bps} basis points is above 100%")]
    PercentRange { device: u32, what: &'static str, bps: u32 },
    #[error("{what} of {bps} basis points is above 100%")]
    ResizePercent { what: &'static str, bps: u32 },
    #[error("a slice may span at most {max} devices, {n} given")]
    TooManyDevices { n: usize, max: usize },
    #[error("resize changes nothing: give a memory size, a compute share or limit, or a priority")]
    EmptyResize,
}

pub fn priority_from_wire(p: i32) -> Result<Option<Priority>, DecodeError> {
    match proto::Priority::try_from(p) {
        Ok(proto::Priority::Unspecified) => Ok(None),
        Ok(proto::Priority::High) => Ok(Some(Priority::High)),
        Ok(proto::Priority::Normal) => Ok(Some(Priority::Normal)),
        Ok(proto::Priority::BestEffort) => Ok(Some(Priority::BestEffort)),
        Err(_) => Err(DecodeError::Priority(p)),
    }
}

pub fn priority_to_wire(p: Priority) -> proto::Priority {
    match p {
        Priority::High => proto::Priority::High,
        Priority::Normal => proto::Priority::Normal,
        Priority::BestEffort => proto::Priority::BestEffort,
    }
}

fn percent(device: u32, what: &'static str, bps: u32) -> Result<Percent, DecodeError> {
    if bps > Percent::FULL.0 { Err(DecodeError::PercentRange { device, what, bps }) } else { Ok(Percent(bps)) }
}

/// Decodes a create request. Spec rules (name, zero memory, limit ≥ share,
/// duplicate devices) are checked later by the admission check.
pub fn decode_create(r: &proto::CreateSliceRequest) -> Result<CreateRequest, DecodeError> {
    if r.devices.len() > egpu_abi::MAX_DEVICES {
        return Err(DecodeError::TooManyDevices { n: r.devices.len(), max: egpu_abi::MAX_DEVICES });
    }
    let devices = r
        .devices
        .iter()
        .map(|d| {
            Ok(DeviceShare {
                device: d.device,
                memory: Bytes(d.memory_bytes),
                memory_burst: Bytes(d.memory_burst_bytes),
                compute_share: percent(d.device, "compute share", d.compute_share_bps)?,
                compute_limit: if d.compute_limit_bps == 0 { Percent::FULL } else { percent(d.device, "compute limit", d.compute_limit_bps)? },
            })
        })
        .collect::<Result<Vec<_>, DecodeError>>()?;
    Ok(CreateRequest {
        spec: SliceSpec { name: r.name.clone(), priority: priority_from_wire(r.priority)?.unwrap_or_default(), devices },
        ephemeral: r.ephemeral,
        owner_pid: (r.owner_pid != 0).then_some(r.owner_pid),
    })
}

pub fn decode_resize(r: &proto::ResizeSliceRequest) -> Result<ResizeRequest, DecodeError> {
    let pct = |what, v: Option<u32>| match v {
        Some(bps) if bps > Percent::FULL.0 => Err(DecodeError::ResizePercent { what, bps }),
        v => Ok(v.map(Percent)),
    };
    let req = ResizeRequest {
        devices: r.devices.clone(),
        memory: r.memory_bytes.map(Bytes),
        memory_burst: r.memory_burst_bytes.map(Bytes),
        compute_share: pct("compute share", r.compute_share_bps)?,
        compute_limit: pct("compute limit", r.compute_limit_bps.map(|l| if l == 0 { Percent::FULL.0 } else { l }))?,
        priority: priority_from_wire(r.priority)?,
    };
    if req.memory.is_none() && req.memory_burst.is_none() && req.compute_share.is_none() && req.compute_limit.is_none() && req.priority.is_none() {
        return Err(DecodeError::EmptyResize);
    }
    Ok(req)
}

pub fn slice_to_wire(s: &Slice) -> proto::Slice {
    let rec = &s.record;
    proto::Slice {
        id: rec.id.clone(),
        name: rec.spec.name.clone(),
        priority: priority_to_wire(rec.spec.priority) as i32,
        devices: s
            .device_usage()
            .into_iter()
            .map(|u| proto::SliceDevice {
                device: u.share.device,
                uuid: u.uuid,
                memory_limit_bytes: u.share.memory.0,
                compute_share_bps: u.share.compute_share.0,
                compute_limit_bps: u.share.compute_limit.0,
                used_bytes: u.used,
                refused: u.refused,
                memory_burst_bytes: u.share.memory_burst.0,
                memory_granted_bytes: u.granted,
                driver_used_bytes: u.driver_used,
                untracked_bytes: u.untracked,
                ..Default::default()
            })
            .collect(),
        processes: s.processes().into_iter().map(|p| proto::Process { pid: p.pid, bytes: p.bytes, alive: p.alive }).collect(),
        ephemeral: rec.ephemeral,
        owner_pid: rec.owner.as_ref().map_or(0, |o| o.pid),
        generation: s.generation(),
        created_unix: rec.created_unix,
        slice_dir: s.dir.display().to_string(),
        workload_pid: rec.workload.as_ref().map_or(0, |o| o.pid),
    }
}

/// Adds the compute arbiter's view of the slice (from its last tick).
pub fn with_compute(mut w: proto::Slice, compute: Option<Vec<crate::arbiter_loop::DeviceCompute>>) -> proto::Slice {
    for (d, c) in w.devices.iter_mut().zip(compute.unwrap_or_default()) {
        d.compute_usage_bps = c.usage_bps;
        d.compute_used_ns = c.used_ns_total;
        d.compute_throttled_ns = c.throttled_ns_total;
        d.compute_budget_ns = c.budget_ns;
    }
    w
}

pub fn env_to_wire(e: EnvEntry) -> proto::EnvVar {
    let mode = match e.mode {
        EnvMode::Set => proto::env_var::Mode::Set,
        EnvMode::Prepend => proto::env_var::Mode::Prepend,
        EnvMode::Append => proto::env_var::Mode::Append,
    };
    proto::EnvVar { name: e.name, value: e.value, mode: mode as i32 }
}

pub fn env_from_wire(e: &proto::EnvVar) -> EnvEntry {
    let mode = match proto::env_var::Mode::try_from(e.mode) {
        Ok(proto::env_var::Mode::Prepend) => EnvMode::Prepend,
        Ok(proto::env_var::Mode::Append) => EnvMode::Append,
        _ => EnvMode::Set,
    };
    EnvEntry { name: e.name.clone(), value: e.value.clone(), mode }
}

impl From<DecodeError> for Status {
    fn from(e: DecodeError) -> Status {
        Status::invalid_argument(e.to_string())
    }
}

/// The full error chain on one line.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

impl From<SliceOpError> for Status {
    fn from(e: SliceOpError) -> Status {
        let code = match &e {
            SliceOpError::Capacity(c) if c.is_overcommit() => Code::ResourceExhausted,
            SliceOpError::Capacity(CapacityError::NoSuchDevice { .. }) => Code::NotFound,
            SliceOpError::Capacity(_) | SliceOpError::BadRequest(_) => Code::InvalidArgument,
            SliceOpError::NotFound(_) => Code::NotFound,
            SliceOpError::Exists(_) => Code::AlreadyExists,
            SliceOpError::Busy { .. } | SliceOpError::Unknown { .. } | SliceOpError::Unadopted { .. } | SliceOpError::UsageHeld { .. } => Code::FailedPrecondition,
            SliceOpError::Store(_) | SliceOpError::Abi(_) | SliceOpError::Io { .. } | SliceOpError::Cdi(_) | SliceOpError::NotStored { .. } | SliceOpError::CannotTakeBack { .. } => Code::Internal,
        };
        Status::new(code, chain(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity;
    use crate::devices::FakeGpus;
    use proptest::prelude::*;

    fn arb_share() -> impl Strategy<Value = proto::DeviceShareSpec> {
        let bytes = || prop_oneof![Just(0u64), 1u64..(1 << 36), Just(u64::MAX)];
        (0u32..5, bytes(), 0u32..12_000, 0u32..12_000, bytes()).prop_map(|(device, memory_bytes, s, l, memory_burst_bytes)| {
            proto::DeviceShareSpec { device, memory_bytes, compute_share_bps: s, compute_limit_bps: l, memory_burst_bytes }
        })
    }

    proptest! {
        /// Any create request either decodes and passes admission into a
        /// state that is valid and fits the device, or is refused with an
        /// error of the right class; nothing panics.
        #[test]
        fn create_requests_are_validated(
            name in "[a-zA-Z0-9._/ -]{0,70}",
            priority in -2i32..6,
            devices in proptest::collection::vec(arb_share(), 0..20),
        ) {
            let req = proto::CreateSliceRequest { name, priority, devices, ephemeral: false, owner_pid: 0 };
            let node = FakeGpus::new(3, 16 << 30).devices;
            match decode_create(&req) {
                Err(e) => prop_assert_eq!(Status::from(e).code(), Code::InvalidArgument),
                Ok(c) => match capacity::check(&node, [], &c.spec) {
                    Ok(()) => {
                        prop_assert!(c.spec.validate().is_ok());
                        for d in &c.spec.devices {
                            prop_assert!(d.device < 3);
                            prop_assert!(d.memory.0 > 0 && d.memory.0 <= 16 << 30);
                            prop_assert!(d.compute_share <= d.compute_limit && d.compute_limit <= Percent::FULL);
                        }
                    }
                    Err(e) => {
                        let code = Status::from(SliceOpError::Capacity(e.clone())).code();
                        prop_assert!(matches!(code, Code::InvalidArgument | Code::NotFound | Code::ResourceExhausted), "{e}");
                        prop_assert!(!e.to_string().is_empty());
                    }
                }
            }
        }

        #[test]
        fn resize_requests_are_validated(mem in proptest::option::of(any::<u64>()), burst in proptest::option::of(any::<u64>()), share in proptest::option::of(0u32..20_000), prio in -1i32..5) {
            let req = proto::ResizeSliceRequest { name: "a".into(), devices: vec![], memory_bytes: mem, compute_share_bps: share, compute_limit_bps: None, priority: prio, memory_burst_bytes: burst };
            match decode_resize(&req) {
                Ok(r) => {
                    prop_assert!(r.compute_share.is_none_or(|s| s <= Percent::FULL));
                    prop_assert!(r.memory.is_some() || r.memory_burst.is_some() || r.compute_share.is_some() || r.priority.is_some());
                }
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }
    }
}
