//! A claim's configuration ([`SliceConfig`]), what the scheduler's
//! allocation of a claim becomes on this node ([`plan`]), and the devices
//! the kubelet is told ([`kubelet_devices`]). Pure.

use super::{CONFIG_API_VERSION, CONFIG_KIND, COMPUTE, DraConfig, MEMORY, MIN_MEMORY, device_index, v1};
use crate::quantity::ceil_times;
use crate::tokens::Gpu;
use egpu_node::proto as node;
use k8s_openapi::api::resource::v1 as res;
use std::collections::BTreeMap;

/// The opaque configuration a claim (or its DeviceClass) may give the
/// driver, in `spec.devices.config[].opaque.parameters`:
/// `{"apiVersion": "gpu.egpu.io/v1", "kind": "SliceConfig", "computeLimit":
/// "50%", "memoryBurst": "24GiB", "priority": "high"}`. Every field is
/// optional; an unknown field is an error (a typo must not pass unnoticed).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SliceConfig {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    /// The compute cap, e.g. `50%` (default: the whole GPU).
    pub compute_limit: Option<String>,
    /// The memory burst cap of each device, e.g. `24Gi` (a Kubernetes
    /// quantity) or `24GiB`: above its
    /// guarantee a slice borrows memory no slice reserved, up to this.
    pub memory_burst: Option<String>,
    /// `high`, `normal` (default) or `best-effort`.
    pub priority: Option<String>,
}

/// A burst cap as the DRA driver reads it, in a claim's configuration and
/// on a pod: a Kubernetes quantity (`24Gi`; `24G` is 24·10^9), as in the
/// rest of the claim, or eGPU's own spelling (`24GiB`). Fractions of a byte
/// (`m`, `u`, `n`: `512m` is half a byte, not 512 MiB) and amounts under
/// 1 MiB are refused; `0` is no burst.
pub fn burst_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.ends_with(['m', 'u', 'n']) {
        return Err(format!("'{s}' is a fraction of a byte in Kubernetes' units (m is milli); write Mi or MiB for MiB"));
    }
    let b = match ceil_times(t, 1) {
        Ok(b) => b,
        Err(_) => t.parse::<egpu_core::quantity::Bytes>().map_err(|e| format!("{e} (or a Kubernetes quantity such as 24Gi)"))?.0,
    };
    if b != 0 && b < MIN_MEMORY {
        return Err(format!("'{s}' is under 1 MiB; give a burst cap such as 24Gi, or 0 for none"));
    }
    Ok(b)
}

/// What a SliceConfig asks, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Asked {
    limit_bps: u32,
    burst_bytes: u64,
    priority: node::Priority,
}

impl SliceConfig {
    fn parse(v: &serde_json::Value) -> Result<SliceConfig, String> {
        let c: SliceConfig = serde_json::from_value(v.clone()).map_err(|e| format!("its {CONFIG_KIND} configuration does not parse: {e}"))?;
        if let Some(a) = &c.api_version
            && a != CONFIG_API_VERSION
        {
            return Err(format!("its configuration has apiVersion '{a}'; this driver reads {CONFIG_API_VERSION}"));
        }
        if let Some(k) = &c.kind
            && k != CONFIG_KIND
        {
            return Err(format!("its configuration has kind '{k}'; this driver reads {CONFIG_KIND}"));
        }
        Ok(c)
    }

    /// Later configurations override earlier ones, field by field.
    fn merged(self, later: SliceConfig) -> SliceConfig {
        SliceConfig {
            api_version: later.api_version.or(self.api_version),
            kind: later.kind.or(self.kind),
            compute_limit: later.compute_limit.or(self.compute_limit),
            memory_burst: later.memory_burst.or(self.memory_burst),
            priority: later.priority.or(self.priority),
        }
    }

    fn asked(&self) -> Result<Asked, String> {
        use egpu_core::quantity::Percent;
        let limit_bps = match &self.compute_limit {
            None => 10_000,
            Some(s) => s.parse::<Percent>().map_err(|e| format!("computeLimit: {e}"))?.0,
        };
        if limit_bps == 0 {
            return Err("computeLimit: 0% would never run; give a cap above 0, e.g. 50%".into());
        }
        let burst_bytes = match &self.memory_burst {
            None => 0,
            Some(s) => burst_bytes(s).map_err(|e| format!("memoryBurst: {e}"))?,
        };
        let priority = match self.priority.as_deref() {
            None | Some("normal") => node::Priority::Normal,
            Some("high") => node::Priority::High,
            Some("best-effort") => node::Priority::BestEffort,
            Some(p) => return Err(format!("priority '{p}' is not high, normal or best-effort")),
        };
        Ok(Asked { limit_bps, burst_bytes, priority })
    }
}

/// What one claim becomes on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The slice's devices, by GPU index.
    pub devices: Vec<node::DeviceShareSpec>,
    pub priority: node::Priority,
    /// The cap and the burst cap the configuration asks (before a GPU's
    /// burst is raised to its guarantee): what pod annotations override.
    pub limit_bps: u32,
    pub burst_bytes: u64,
    /// (request, device name, GPU index) of each allocation result, in
    /// order; the request by its own name, without a subrequest's
    /// (`main/small` is `main`), as containers name it.
    pub results: Vec<(String, String, u32)>,
}

/// Turns what the scheduler allocated a claim into a slice: the results of
/// `driver` (all of which must be in `pool`, this node's), on GPUs of
/// `gpus` (each with the memory it has for claims); memory and compute from
/// their consumed capacity (absent: all that memory, no compute
/// guarantee), summed per GPU over the claim's requests; the cap, burst
/// and priority from the opaque configuration for this driver. One request
/// given the same GPU twice is refused: it asked for two GPUs.
pub fn plan(claim: &res::ResourceClaim, driver: &str, pool: &str, gpus: &[Gpu]) -> Result<Plan, String> {
    let alloc = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .ok_or("it is not allocated yet (status.allocation is empty); the scheduler allocates a claim when it schedules its first pod")?;
    let devices = alloc.devices.as_ref();
    let results: Vec<&res::DeviceRequestAllocationResult> = devices.and_then(|d| d.results.as_ref()).into_iter().flatten().filter(|r| r.driver == driver).collect();
    if results.is_empty() {
        return Err(format!("none of its allocated devices is of driver {driver}"));
    }
    // Configuration: from the class first, then the claim, in order, each for
    // all requests or for some; only this driver's opaque ones.
    let mut configs: Vec<(&res::DeviceAllocationConfiguration, SliceConfig)> = Vec::new();
    for c in devices.and_then(|d| d.config.as_ref()).into_iter().flatten() {
        let Some(o) = c.opaque.as_ref().filter(|o| o.driver == driver) else { continue };
        configs.push((c, SliceConfig::parse(&o.parameters.0)?));
    }
    configs.sort_by_key(|(c, _)| c.source != "FromClass");
    let mut per_gpu: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    let mut asked: Option<Asked> = None;
    let mut out = Vec::new();
    let mut placed = std::collections::HashSet::new();
    for r in results {
        if r.pool != pool {
            return Err(format!("device {} was allocated from pool '{}', but this node's pool is '{pool}' (is the plugin's --node-name this node's?)", r.device, r.pool));
        }
        if r.admin_access == Some(true) {
            return Err(format!("request {} asks for admin access to {}; this driver gives GPUs only as slices", r.request, r.device));
        }
        let index = device_index(&r.device).ok_or_else(|| format!("device '{}' is not one this driver publishes (gpu-<index>)", r.device))?;
        let gpu = gpus.iter().find(|g| g.index == index).ok_or_else(|| format!("GPU {index} ({}) is not on this node any more", r.device))?;
        let consumed = |key: &str, factor: u64| -> Result<Option<u64>, String> {
            r.consumed_capacity.as_ref().and_then(|c| c.get(key)).map(|q| ceil_times(&q.0, factor).map_err(|e| format!("consumed {key} of {}: {e}", r.device))).transpose()
        };
        let memory = consumed(MEMORY, 1)?.unwrap_or(gpu.memory_bytes);
        let share = consumed(COMPUTE, 100)?.unwrap_or(0);
        if memory == 0 {
            return Err(format!("request {} consumes no memory of {}; ask for some (capacity.requests.memory)", r.request, r.device));
        }
        let base = r.request.split('/').next().unwrap_or(&r.request);
        if !placed.insert((base, index)) {
            return Err(format!(
                "request {base} was given {} twice (a GPU can hold several shares); to spread its devices over GPUs, add constraints: [{{requests: [{base}], distinctAttribute: {driver}/uuid}}] to the claim",
                r.device
            ));
        }
        // The request's own configuration, the last that names it (or all).
        let mine = configs
            .iter()
            .filter(|(c, _)| c.requests.as_ref().is_none_or(|q| q.is_empty() || q.iter().any(|n| n == &r.request || n == base)))
            .fold(SliceConfig::default(), |acc, (_, s)| acc.merged(s.clone()));
        let a = mine.asked()?;
        // One slice has one cap, burst rule and priority: its requests must agree.
        match asked {
            None => asked = Some(a),
            Some(prev) if prev != a => return Err("its requests' configurations differ (cap, burst or priority), but one claim is one slice; give them one configuration".into()),
            Some(_) => {}
        }
        let e = per_gpu.entry(index).or_default();
        e.0 = e.0.saturating_add(memory);
        e.1 = e.1.saturating_add(share);
        out.push((base.to_string(), r.device.clone(), index));
    }
    let a = asked.expect("at least one result");
    let mut specs = Vec::new();
    for (index, (memory, share)) in per_gpu {
        let has = gpus.iter().find(|g| g.index == index).map_or(0, |g| g.memory_bytes);
        if memory > has {
            return Err(format!("it is allocated {memory} B of GPU {index}, which has {has} B for claims (memory taken by slices made outside Kubernetes, or lent to bursting slices, since the scheduler read the ResourceSlice?)"));
        }
        if share > 10_000 {
            return Err(format!("it is guaranteed {}% of GPU {index}, more than the whole GPU", share as f64 / 100.0));
        }
        if a.limit_bps < share as u32 {
            return Err(format!("computeLimit {}% is below the {}% guaranteed on GPU {index}; a cap must be at least the guarantee", a.limit_bps as f64 / 100.0, share as f64 / 100.0));
        }
        let burst = if a.burst_bytes == 0 { 0 } else { a.burst_bytes.max(memory) };
        specs.push(node::DeviceShareSpec { device: index, memory_bytes: memory, compute_share_bps: share as u32, compute_limit_bps: a.limit_bps, memory_burst_bytes: burst });
    }
    Ok(Plan { devices: specs, priority: a.priority, limit_bps: a.limit_bps, burst_bytes: a.burst_bytes, results: out })
}

/// The kubelet's device list for a prepared claim: one entry per GPU,
/// naming the requests allocated on it and carrying that GPU's own CDI
/// device (with `--gpu-cdi-kind`); the slice's CDI device is on the first
/// entry only, which names every request. The kubelet gives a container
/// the entries of the requests it names (all of them when it names the
/// claim) and does not remove repeats, so each CDI device is given once
/// whichever requests a container names.
pub fn kubelet_devices(cfg: &DraConfig, slice: &str, results: &[(String, String, u32)]) -> Vec<v1::Device> {
    let mut out: Vec<(v1::Device, u32)> = Vec::new();
    let mut all: Vec<String> = Vec::new();
    for (request, device, gpu) in results {
        if !all.contains(request) {
            all.push(request.clone());
        }
        match out.iter_mut().find(|(d, _)| d.device_name == *device) {
            Some((d, _)) if !d.request_names.contains(request) => d.request_names.push(request.clone()),
            Some(_) => {}
            None => out.push((v1::Device { request_names: vec![request.clone()], pool_name: cfg.node.clone(), device_name: device.clone(), cdi_device_ids: vec![] }, *gpu)),
        }
    }
    out.into_iter()
        .enumerate()
        .map(|(i, (mut d, gpu))| {
            if i == 0 {
                d.request_names = all.clone();
                d.cdi_device_ids.push(egpu_node::cdi::device_name(slice));
            }
            if let Some(kind) = &cfg.gpu_cdi_kind {
                d.cdi_device_ids.push(crate::plugin::gpu_cdi_device(kind, gpu));
            }
            d
        })
        .collect()
}
