//! What a pod asks of the extender's resource: one GPU's worth of units per
//! container that asks.

use super::RequestError;
use crate::annotation::NodeGpus;
use serde_json::Value;

/// What a pod asks for: one GPU's worth of units per container that asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand {
    /// Units per container, largest first.
    pub units: Vec<u32>,
    /// Units per container, in the pod's order (the kubelet allocates the
    /// containers in that order).
    pub in_order: Vec<u32>,
}

impl Demand {
    /// Reads the resource requests of the pod's containers. Init containers
    /// that ask are refused: the kubelet lends their devices to the app
    /// containers after them, which would put two slices on one set of units
    /// (sidecars, which run beside the app containers, are refused too: the
    /// extender counts only app containers).
    pub fn of_pod(pod: &Value, resource: &str) -> Result<Demand, RequestError> {
        let spec = &pod["spec"];
        // (units, container) for each container of `key` that asks.
        let read = |key: &str| -> Result<Vec<(u32, &Value)>, RequestError> {
            let mut out = Vec::new();
            for c in spec[key].as_array().map(Vec::as_slice).unwrap_or_default() {
                let name = c["name"].as_str().unwrap_or("?").to_string();
                let get = |which: &str| -> Result<Option<u32>, RequestError> {
                    match &c["resources"][which][resource] {
                        Value::Null => Ok(None),
                        v => {
                            let text = v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
                            let value = || egpu_core::slice::shown(&text);
                            let n = whole_quantity_wide(&text).ok_or_else(|| RequestError::BadQuantity { container: name.clone(), resource: resource.into(), value: value() })?;
                            u32::try_from(n).map(Some).map_err(|_| RequestError::TooLarge { container: name.clone(), resource: resource.into(), value: value(), units: n })
                        }
                    }
                };
                let (req, lim) = (get("requests")?, get("limits")?);
                if let (Some(r), Some(l)) = (req, lim)
                    && r != l
                {
                    return Err(RequestError::Mismatch { container: name, resource: resource.into(), requests: r.into(), limits: l.into() });
                }
                let n = lim.or(req).unwrap_or(0);
                if n > 0 {
                    out.push((n, c));
                }
            }
            Ok(out)
        };
        if let Some((_, c)) = read("initContainers")?.first() {
            let container = c["name"].as_str().unwrap_or("?").to_string();
            let sidecar = c["restartPolicy"] == "Always";
            return Err(RequestError::InitContainer { container, resource: resource.into(), sidecar });
        }
        let in_order: Vec<u32> = read("containers")?.into_iter().map(|(n, _)| n).collect();
        let mut units = in_order.clone();
        units.sort_unstable_by(|a, b| b.cmp(a));
        Ok(Demand { units, in_order })
    }

    /// Whether no eviction could make room for the containers on these
    /// GPUs: they ask for more units than the node has, or one of them is
    /// larger than every GPU and no GPU size divides it with enough GPUs of
    /// that size. Only these sure cases: with whole GPUs of mixed sizes,
    /// the placement of an empty node is not always the best one (32 + 16
    /// units on GPUs of 16, 16, 8, 8, 8, 8 misfit empty, and fit once the
    /// 32 takes the four 8s), so a misfit on an empty node proves nothing.
    pub fn never_fits(&self, gpus: &NodeGpus) -> bool {
        let total: u64 = gpus.gpus.iter().map(|g| u64::from(g.units)).sum();
        if self.units.iter().map(|&u| u64::from(u)).sum::<u64>() > total {
            return true;
        }
        let largest = gpus.gpus.iter().map(|g| g.units).max().unwrap_or(0);
        let of_size = |s: u32| gpus.gpus.iter().filter(|g| g.units == s).count() as u64;
        self.units.iter().any(|&u| u > largest && !gpus.gpus.iter().any(|g| g.units > 0 && u % g.units == 0 && of_size(g.units) >= u64::from(u / g.units)))
    }

    /// Whether the containers fit on the GPUs' free units (each container on
    /// one GPU, several may share one; or whole GPUs for a container larger
    /// than one), placed as the plugin places them, largest first. `None`
    /// if they fit, else the reason.
    pub fn misfit(&self, gpus: &NodeGpus) -> Option<String> {
        let mut left = gpus.gpus_only();
        for &u in &self.units {
            if left.take(u) {
                continue;
            }
            let gib = |n: u32| n as f64 * gpus.unit_bytes as f64 / f64::from(1u32 << 30);
            let largest = gpus.gpus.iter().map(|g| g.free).max().unwrap_or(0);
            let per = gpus.gpus.iter().map(|g| g.units).max().unwrap_or(0);
            return Some(if per == 0 {
                format!("the node lists no GPU with memory units (its {} annotation has {} GPU(s), none with units): egpud on the node sees no GPU, or the device plugin has not published them yet", crate::annotation::ANNOTATION, gpus.gpus.len())
            } else if u > per {
                let whole = gpus.gpus.iter().filter(|g| g.units > 0 && g.free == g.units).count();
                // A count this large is most likely bytes.
                let bytes = if u >= 1 << 20 { format!(" (a unit is {:.1} GiB, not a byte)", gib(1)) } else { String::new() };
                if u % per == 0 {
                    format!("a container asks for {u} units{bytes} ({} whole GPUs of {per}); {whole} GPU(s) are entirely free", u / per)
                } else {
                    format!("a container asks for {u} units, more than one GPU ({per}){bytes}: a multi-GPU container takes whole GPUs, so ask for a multiple of {per}")
                }
            } else if self.units.len() == 1 {
                format!("no GPU has {u} units ({:.1} GiB) free; the most free on one GPU is {largest} ({:.1} GiB)", gib(u), gib(largest))
            } else {
                format!(
                    "the containers' {:?} units do not fit the GPUs' free units {:?} (each container's memory comes from one GPU)",
                    self.units,
                    gpus.gpus.iter().map(|g| g.free).collect::<Vec<_>>()
                )
            });
        }
        None
    }
}

/// A Kubernetes quantity that is a whole number: `10`, `2k` (2000), `2Ki`
/// (2048), `1e3`, `1500m` is not (1.5), `1.5k` is (1500). The API server
/// stores quantities in canonical form, so a request of 2000 comes back as
/// `2k`. `None` for anything else.
pub fn whole_quantity(text: &str) -> Option<u64> {
    whole_quantity_wide(text).and_then(|v| u64::try_from(v).ok())
}

/// [`whole_quantity`] up to `u128`, so that a quantity too large to count
/// can be told from one that is not a number.
fn whole_quantity_wide(text: &str) -> Option<u128> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+')).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    let num = num.strip_prefix('+').unwrap_or(num);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) || frac.len() > 18 || int.len() > 38 {
        return None;
    }
    // value = mantissa × 10^exp10 × 2^exp2, mantissa = int.frac as an integer.
    let mantissa: u128 = format!("{int}{frac}").parse().ok()?;
    let (mut exp10, exp2): (i32, u32) = match suffix {
        "" => (0, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        e if e.starts_with(['e', 'E']) => (e[1..].parse::<i32>().ok().filter(|x| x.abs() <= 30)?, 0),
        _ => return None,
    };
    exp10 -= frac.len() as i32;
    let mut v = mantissa.checked_mul(1u128.checked_shl(exp2)?)?;
    if exp10 >= 0 {
        v = v.checked_mul(10u128.checked_pow(exp10 as u32)?)?;
    } else {
        let d = 10u128.checked_pow(exp10.unsigned_abs())?;
        if v % d != 0 {
            return None;
        }
        v /= d;
    }
    Some(v)
}
