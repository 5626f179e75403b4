//! The claims this plugin prepared, as `claims.json` keeps them, and what
//! the annotations of a claim's pod make of its slice.

use super::claim::burst_bytes;
use egpu_node::proto as node;
use std::collections::BTreeMap;
use std::path::Path;

/// Reads `claims.json`; a missing file is no claims, and a file that does
/// not parse is set aside (renamed `.bad`) with a warning.
pub(super) fn load_prepared(path: &Path) -> BTreeMap<String, Prepared> {
    match std::fs::read(path) {
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(m) => m,
            Err(e) => {
                let bad = path.with_extension("json.bad");
                let _ = std::fs::rename(path, &bad);
                tracing::warn!("{} does not parse ({e}); moved to {}: the slices of the claims prepared before are not resized from their pods' annotations", path.display(), bad.display());
                BTreeMap::new()
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
        Err(e) => {
            tracing::warn!("cannot read {} ({e}): the slices of the claims prepared before are not resized from their pods' annotations", path.display());
            BTreeMap::new()
        }
    }
}

/// A claim this plugin prepared, as `claims.json` in the plugin's
/// directory keeps it (so that a restarted plugin still resizes it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Prepared {
    pub namespace: String,
    pub claim: String,
    /// The pod the claim was made for (from its template), whose
    /// annotations resize the slice; `None` for a claim of its own.
    pub pod: Option<String>,
    /// That pod's UID: a later pod of the same name is not it.
    #[serde(default)]
    pub pod_uid: Option<String>,
    /// The cap and burst cap the claim's configuration asks.
    pub limit_bps: u32,
    pub burst_bytes: u64,
}

/// What the annotations of a claim's pod make of its slice's devices:
/// (device, cap, burst) for each device whose cap or burst is not that yet;
/// or why the annotations cannot be applied.
pub fn resizes(p: &Prepared, annotations: &BTreeMap<String, String>, slice: &node::Slice) -> Result<Vec<(u32, u32, u64)>, String> {
    use crate::plugin::{COMPUTE_ANNOTATION, MEMORY_BURST_ANNOTATION, wanted_over};
    if annotations.contains_key(COMPUTE_ANNOTATION) {
        return Err(format!("{COMPUTE_ANNOTATION}: a DRA claim's guarantee is what the scheduler counted; ask for it in the claim (capacity.requests.compute), and remove the annotation"));
    }
    // The burst cap in the claim's units (as in its SliceConfig).
    let mut rest = annotations.clone();
    let burst = match rest.remove(MEMORY_BURST_ANNOTATION) {
        Some(v) => burst_bytes(&v).map_err(|e| format!("{MEMORY_BURST_ANNOTATION}: {e}"))?,
        None => p.burst_bytes,
    };
    let (_, limit, _) = wanted_over(&rest, (0, p.limit_bps, 0))?;
    if limit == 0 {
        return Err("egpu.io/gpu-compute-limit: 0% would never run".into());
    }
    // All of the slice's GPUs or none: one cap for the slice.
    if let Some(d) = slice.devices.iter().find(|d| d.compute_share_bps > limit) {
        return Err(format!("egpu.io/gpu-compute-limit: {}% is below the {}% guaranteed on GPU {}", f64::from(limit) / 100.0, f64::from(d.compute_share_bps) / 100.0, d.device));
    }
    Ok(slice
        .devices
        .iter()
        .map(|d| (d.device, limit, if burst == 0 { 0 } else { burst.max(d.memory_limit_bytes) }, d))
        .filter(|(_, l, b, d)| (*l, *b) != (d.compute_limit_bps, d.memory_burst_bytes))
        .map(|(dev, l, b, _)| (dev, l, b))
        .collect())
}
