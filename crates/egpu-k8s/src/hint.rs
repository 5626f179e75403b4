//! The pod annotation `egpu.io/gpu-hint`: the GPU inside the node that
//! eGPU's placement policy chose for each of a pod's containers.
//!
//! The kubelet's device-plugin API names devices, not pods: the plugin's
//! `GetPreferredAllocation` learns only how many units a container wants.
//! So the extender, which picked the node with the policy, writes the
//! policy's GPU for each container onto the pod before it binds it, and the
//! device plugin, which follows its node's pods' `egpu.io/` annotations,
//! prefers the hinted GPU for a request of that size
//! ([`choose`]). A hint is only a preference: where no hint of the size
//! is pending, or its GPU no longer has the room, the plugin's own best fit
//! answers, and the pod is admitted either way.
//!
//! Format: one `<GPU UUID>=<units>` per container that fits one GPU, in the
//! pod's container order, joined by commas, then when it was written (Unix
//! seconds) and the units the whole pod asks for:
//! `GPU-5d1c…=10,GPU-0a9e…=4;at=1764770000;total=14`. A container larger
//! than one GPU (whole GPUs) has no entry: the plugin's choice of whole
//! GPUs stands. Other `;key=value` fields are passed over (a newer
//! extender's). A hint is pending only for [`HINT_TTL`] after it was
//! written and while its pod holds fewer than `total` units: a pod that
//! ended, was refused at admission, or runs, pulls no other pod's request
//! to its GPU. Pure.

use std::collections::BTreeMap;

/// The annotation's key.
pub const HINT_ANNOTATION: &str = "egpu.io/gpu-hint";

/// The most entries a hint may have (containers of one pod that ask).
pub const MAX_ENTRIES: usize = 64;
/// The longest GPU UUID a hint may name (NVIDIA's are 40 bytes; MIG's
/// longer).
pub const MAX_UUID: usize = 128;

/// How long after it was written (by the node's clock) a hint is
/// followed: the kubelet admits a bound pod within seconds (devices are
/// allocated before the images are pulled), and clocks a minute apart
/// still work. The extender's default `--assume-ttl` is as long, so a hint
/// is not followed much longer than the extender counts its pod's units.
pub const HINT_TTL: std::time::Duration = std::time::Duration::from_secs(120);

/// A pod's hint.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hint {
    /// (GPU UUID, units) per container that fits one GPU, in the pod's order.
    pub gpus: Vec<(String, u32)>,
    /// When the extender wrote it, Unix seconds.
    pub at: u64,
    /// The units the whole pod asks for (its containers of whole GPUs too).
    pub total: u64,
}

/// Why an annotation is not a hint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HintError {
    #[error("{HINT_ANNOTATION} is empty; it lists <GPU UUID>=<units> per container, joined by commas, or is absent")]
    Empty,
    #[error("{HINT_ANNOTATION} has {0} entries; at most {MAX_ENTRIES} (one per container that asks)")]
    TooMany(usize),
    #[error("{HINT_ANNOTATION} entry {index} ('{entry}') is not <GPU UUID>=<units>: {why}")]
    Entry { index: usize, entry: String, why: &'static str },
    #[error("{HINT_ANNOTATION} field '{0}' is not a whole number (after ';', at=<Unix seconds> and total=<units>)")]
    Field(String),
    #[error("{HINT_ANNOTATION} has no '{0}=' field (after ';', at=<Unix seconds> and total=<units>)")]
    Missing(&'static str),
}

/// Whether `uuid` may be written in a hint: not empty, at most
/// [`MAX_UUID`] bytes, printable ASCII without spaces, `,`, `;` or `=`.
pub fn valid_uuid(uuid: &str) -> bool {
    !uuid.is_empty() && uuid.len() <= MAX_UUID && uuid.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b',' | b';' | b'='))
}

impl Hint {
    /// The annotation's value. Entries whose UUID [`valid_uuid`] refuses,
    /// or of 0 units, are left out (none is written by the extender).
    pub fn to_annotation(&self) -> String {
        let entries: Vec<String> = self.gpus.iter().filter(|(u, n)| valid_uuid(u) && *n > 0).take(MAX_ENTRIES).map(|(u, n)| format!("{u}={n}")).collect();
        format!("{};at={};total={}", entries.join(","), self.at, self.total)
    }

    /// Reads an annotation's value.
    pub fn parse(value: &str) -> Result<Hint, HintError> {
        let mut fields = value.split(';');
        let entries = fields.next().unwrap_or_default();
        let (mut at, mut total) = (None, None);
        for f in fields {
            let Some((k, v)) = f.trim().split_once('=') else { continue };
            let (k, v) = (k.trim(), v.trim());
            let slot = match k {
                "at" => &mut at,
                "total" => &mut total,
                _ => continue,
            };
            *slot = Some(v.parse::<u64>().ok().filter(|_| v.bytes().all(|b| b.is_ascii_digit())).ok_or_else(|| HintError::Field(egpu_core::slice::shown(f)))?);
        }
        let gpus = Self::parse_entries(entries)?;
        Ok(Hint { gpus, at: at.ok_or(HintError::Missing("at"))?, total: total.ok_or(HintError::Missing("total"))? })
    }

    /// Whether the hint is followed at `now` (Unix seconds): written less
    /// than [`HINT_TTL`] ago, or (a clock behind the extender's) less than
    /// that far ahead.
    pub fn live_at(&self, now: u64) -> bool {
        now.abs_diff(self.at) < HINT_TTL.as_secs()
    }

    fn parse_entries(value: &str) -> Result<Vec<(String, u32)>, HintError> {
        if value.trim().is_empty() {
            return Err(HintError::Empty);
        }
        let parts: Vec<&str> = value.split(',').collect();
        if parts.len() > MAX_ENTRIES {
            return Err(HintError::TooMany(parts.len()));
        }
        let mut out = Vec::with_capacity(parts.len());
        for (index, part) in parts.iter().enumerate() {
            let entry = part.trim();
            let bad = |why| HintError::Entry { index, entry: egpu_core::slice::shown(entry), why };
            let (uuid, units) = entry.rsplit_once('=').ok_or_else(|| bad("no '='"))?;
            if !valid_uuid(uuid) {
                return Err(bad("the GPU UUID is empty, too long, or has a space, ',', ';' or '='"));
            }
            if units.is_empty() || !units.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad("the units are not a whole number"));
            }
            let units: u32 = units.parse().map_err(|_| bad("the units are too large"))?;
            if units == 0 {
                return Err(bad("0 units"));
            }
            out.push((uuid.to_string(), units));
        }
        Ok(out)
    }
}

/// A pending hint entry the plugin may follow: whose it is (`key`), its
/// GPU and its units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending<K> {
    pub key: K,
    pub uuid: String,
    pub units: u32,
}

/// A hint entry's key: its pod's key (UID) and the entry's index.
pub type EntryKey = (String, usize);

/// The pending entries of a node's pods' hints at `now` (Unix seconds),
/// keyed by (pod key, entry index). `pods` gives each pod's key, its hint
/// annotation and the units it holds. Of each hint that parses and is
/// live ([`Hint::live_at`]), whose pod holds fewer than its `total` units,
/// the entries not `followed` yet. Hints that do not parse come back with
/// the reason, under their pod's key.
pub fn pending<'a>(pods: impl IntoIterator<Item = (String, &'a str, u32)>, followed: &std::collections::HashSet<EntryKey>, now: u64) -> (Vec<Pending<EntryKey>>, Vec<(String, HintError)>) {
    let (mut out, mut bad) = (Vec::new(), Vec::new());
    for (key, value, held) in pods {
        let hint = match Hint::parse(value) {
            Ok(h) => h,
            Err(e) => {
                bad.push((key, e));
                continue;
            }
        };
        if !hint.live_at(now) || u64::from(held) >= hint.total {
            continue;
        }
        for (i, (uuid, units)) in hint.gpus.into_iter().enumerate() {
            if !followed.contains(&(key.clone(), i)) {
                out.push(Pending { key: (key.clone(), i), uuid, units });
            }
        }
    }
    (out, bad)
}

/// How a preferred allocation used the hints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice<K> {
    /// The hint `key` was followed: these device IDs, all on its GPU.
    Followed { key: K, ids: Vec<String> },
    /// Hints of this size are pending, but none of their GPUs has the
    /// units available (or holds the must-include IDs): a stale hint.
    Stale,
    /// No pending hint of this size.
    None,
}

/// The device plugin's use of the hints for a request of `size` units
/// from `available` (with `must_include` among them): of the pending
/// entries of exactly that size whose GPU has `size` units available and
/// holds every must-include ID, the one on the GPU with the fewest
/// available (then the lowest key). Any choice among them leaves the node
/// as the extender assumed it, since they all have the same size. Its
/// lowest-numbered available units are taken, must-include first.
pub fn choose<K: Ord + Clone>(available: &[String], must_include: &[String], size: usize, pending: &[Pending<K>]) -> Choice<K> {
    let Ok(size32) = u32::try_from(size) else { return Choice::None };
    let of_size: Vec<&Pending<K>> = pending.iter().filter(|p| p.units == size32 && size > 0).collect();
    if of_size.is_empty() {
        return Choice::None;
    }
    let mut by_gpu: BTreeMap<&str, BTreeMap<u32, &String>> = BTreeMap::new();
    for id in available.iter().chain(must_include) {
        if let Some((uuid, k)) = crate::tokens::parse_token(id) {
            by_gpu.entry(uuid).or_default().insert(k, id);
        }
    }
    let pinned: Vec<&str> = must_include.iter().filter_map(|id| crate::tokens::parse_token(id).map(|(u, _)| u)).collect();
    if pinned.len() != must_include.len() {
        return Choice::Stale;
    }
    let best = of_size
        .iter()
        .filter(|p| pinned.iter().all(|u| *u == p.uuid))
        .filter_map(|p| by_gpu.get(p.uuid.as_str()).filter(|t| t.len() >= size).map(|t| (t.len(), &p.key, *p)))
        .min_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    let Some((_, _, p)) = best else { return Choice::Stale };
    let tokens = &by_gpu[p.uuid.as_str()];
    let mut ids: Vec<String> = Vec::new();
    for id in must_include {
        if !ids.contains(id) {
            ids.push(id.clone());
        }
    }
    for id in tokens.values() {
        if ids.len() >= size {
            break;
        }
        if !ids.contains(id) {
            ids.push((*id).clone());
        }
    }
    Choice::Followed { key: p.key.clone(), ids }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ids(uuid: &str, ks: &[u32]) -> Vec<String> {
        ks.iter().map(|&k| crate::tokens::token_id(uuid, k)).collect()
    }

    #[test]
    fn a_hint_round_trips_and_bad_ones_say_what_is_wrong() {
        let h = Hint { gpus: vec![("GPU-a".into(), 10), ("MIG-GPU-b/1/0".into(), 4)], at: 1_764_770_000, total: 46 };
        assert_eq!(h.to_annotation(), "GPU-a=10,MIG-GPU-b/1/0=4;at=1764770000;total=46");
        assert_eq!(Hint::parse(&h.to_annotation()), Ok(h.clone()));
        let two = |a, b| vec![("GPU-a".to_string(), a), ("GPU-b".to_string(), b)];
        assert_eq!(Hint::parse(" GPU-a=3 , GPU-b=1; total=4 ;at=7;later=x"), Ok(Hint { gpus: two(3, 1), at: 7, total: 4 }), "spaces, any order, unknown fields passed over");
        assert_eq!(Hint::parse(";at=1;total=1"), Err(HintError::Empty));
        assert_eq!(Hint::parse("GPU-a=1;total=1"), Err(HintError::Missing("at")));
        assert_eq!(Hint::parse("GPU-a=1;at=1"), Err(HintError::Missing("total")));
        for bad in ["GPU-a=1;at=-1;total=1", "GPU-a=1;at=1;total=x", "GPU-a=1;at=;total=1"] {
            assert!(matches!(Hint::parse(bad), Err(HintError::Field(_))), "{bad}");
        }
        assert_eq!(Hint::parse("GPU-a=1; at = 2 ;flag;total=3"), Ok(Hint { gpus: vec![("GPU-a".into(), 1)], at: 2, total: 3 }), "keys trimmed, a bare field passed over");
        for (bad, why) in [("GPU-a", "no '='"), ("=4", "UUID"), ("GPU a=4", "UUID"), ("GPU-a=", "whole number"), ("GPU-a=-1", "whole number"), ("GPU-a=0", "0 units"), ("GPU-a=99999999999", "too large")] {
            let e = Hint::parse(&format!("{bad};at=1;total=1")).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains(HINT_ANNOTATION), "{bad}: {e}");
        }
        let e = Hint::parse("GPU-a=1,GPU-b=x;at=1;total=1").unwrap_err().to_string();
        assert!(e.contains("entry 1 ('GPU-b=x')"), "{e}");
        let many = vec!["G=1"; MAX_ENTRIES + 1].join(",");
        assert_eq!(Hint::parse(&format!("{many};at=1;total=1")), Err(HintError::TooMany(MAX_ENTRIES + 1)));
        // What cannot be read back is never written.
        assert_eq!(Hint { gpus: vec![("GPU a".into(), 1), ("G".into(), 0), ("G2".into(), 2)], at: 1, total: 3 }.to_annotation(), "G2=2;at=1;total=3");
        // Live for HINT_TTL either side of its time.
        let ttl = HINT_TTL.as_secs();
        assert!(h.live_at(h.at) && h.live_at(h.at + ttl - 1) && h.live_at(h.at - ttl + 1));
        assert!(!h.live_at(h.at + ttl) && !h.live_at(h.at - ttl));
    }

    #[test]
    fn the_hinted_gpu_is_preferred_while_it_has_room() {
        let avail: Vec<String> = [ids("GPU-a", &[0, 1, 2, 3, 4, 5]), ids("GPU-b", &[3, 4, 5, 6, 7, 8, 9, 10, 11, 12])].concat();
        let p = |key: u32, uuid: &str, units| Pending { key, uuid: uuid.into(), units };
        // Best fit would take GPU-a (6 available); the hint says GPU-b.
        assert_eq!(choose(&avail, &[], 4, &[p(1, "GPU-b", 4)]), Choice::Followed { key: 1, ids: ids("GPU-b", &[3, 4, 5, 6]) });
        // Another size's hint is not this request's.
        assert_eq!(choose(&avail, &[], 4, &[p(1, "GPU-b", 5)]), Choice::None);
        // The hinted GPU lacks the room (or is not this node's): stale.
        assert_eq!(choose(&avail, &[], 8, &[p(1, "GPU-a", 8)]), Choice::Stale);
        assert_eq!(choose(&avail, &[], 4, &[p(1, "GPU-z", 4)]), Choice::Stale);
        // Of two of the size, the tighter GPU that holds it.
        assert_eq!(choose(&avail, &[], 4, &[p(1, "GPU-b", 4), p(2, "GPU-a", 4)]), Choice::Followed { key: 2, ids: ids("GPU-a", &[0, 1, 2, 3]) });
        // Must-include IDs pin the GPU, and come first.
        let must = ids("GPU-b", &[9]);
        assert_eq!(choose(&avail, &must, 4, &[p(2, "GPU-a", 4)]), Choice::Stale);
        assert_eq!(choose(&avail, &must, 4, &[p(1, "GPU-b", 4), p(2, "GPU-a", 4)]), Choice::Followed { key: 1, ids: [must.clone(), ids("GPU-b", &[3, 4, 5])].concat() });
        // A must-include ID listed twice, apart, is taken once.
        let twice = ids("GPU-b", &[9, 10, 9]);
        assert_eq!(choose(&avail, &twice, 4, &[p(1, "GPU-b", 4)]), Choice::Followed { key: 1, ids: ids("GPU-b", &[9, 10, 3, 4]) });
    }

    #[test]
    fn only_live_hints_of_pods_short_of_their_units_are_pending() {
        let now = 1_000_000;
        let hint = |at: u64| format!("GPU-a=4,GPU-b=6;at={at};total=12");
        let (fresh, old, future) = (hint(now - 5), hint(now - HINT_TTL.as_secs()), hint(now + 60));
        let followed: std::collections::HashSet<(String, usize)> = [("p2".to_string(), 0)].into();
        // "whole" has a container of whole GPUs (8 units, no entry) after
        // its hinted 4: holding 10 (more than its hinted units, less than
        // its total) it still waits for its 4 or its whole GPUs.
        let whole = format!("GPU-a=4;at={now};total=12");
        let pods = vec![("p1".to_string(), fresh.as_str(), 0), ("p2".into(), fresh.as_str(), 4), ("old".into(), old.as_str(), 0), ("ahead".into(), future.as_str(), 0), ("runs".into(), fresh.as_str(), 12), ("whole".into(), whole.as_str(), 10), ("bad".into(), "GPU-a=4", 0)];
        let (p, bad) = pending(pods, &followed, now);
        let keys: Vec<(String, usize)> = p.iter().map(|p| p.key.clone()).collect();
        // p1 both entries; p2 (4 of 12 held: its other containers still to
        // come) the one not followed; a clock a minute behind the
        // extender's still follows; an old hint, and a pod holding all
        // its units, are not pending.
        let want: Vec<(String, usize)> = [("p1", 0), ("p1", 1), ("p2", 1), ("ahead", 0), ("ahead", 1), ("whole", 0)].iter().map(|(k, i)| (k.to_string(), *i)).collect();
        assert_eq!(keys, want);
        assert_eq!((p[1].uuid.as_str(), p[1].units), ("GPU-b", 6));
        assert_eq!(bad, [("bad".to_string(), HintError::Missing("at"))]);
    }

    proptest! {
        #[test]
        fn any_text_parses_or_is_refused_and_what_is_written_reads_back(s in ".{0,200}", entries in proptest::collection::vec(("[A-Za-z0-9/_.;=, -]{0,20}", 0u32..10_000), 1..8), at in any::<u64>(), total in any::<u64>()) {
            let _ = Hint::parse(&s);
            let h = Hint { gpus: entries, at, total };
            // What is written reads back, less the entries that cannot be
            // written (then nothing is: the extender does not patch).
            let kept: Vec<(String, u32)> = h.gpus.iter().filter(|(u, n)| valid_uuid(u) && *n > 0).cloned().collect();
            let back = Hint::parse(&h.to_annotation());
            if kept.is_empty() {
                prop_assert_eq!(back, Err(HintError::Empty));
            } else {
                prop_assert_eq!(back, Ok(Hint { gpus: kept, at, total }));
            }
        }

        #[test]
        fn a_followed_hint_gives_exactly_the_size_on_its_gpu(avail_a in 0u32..20, avail_b in 0u32..20, size in 1usize..20, hinted_b in any::<bool>()) {
            let avail: Vec<String> = [ids("GPU-a", &(0..avail_a).collect::<Vec<_>>()), ids("GPU-b", &(0..avail_b).collect::<Vec<_>>())].concat();
            let uuid = if hinted_b { "GPU-b" } else { "GPU-a" };
            let room = if hinted_b { avail_b } else { avail_a } as usize;
            match choose(&avail, &[], size, &[Pending { key: 0, uuid: uuid.into(), units: size as u32 }]) {
                Choice::Followed { ids, .. } => {
                    prop_assert!(room >= size);
                    prop_assert_eq!(ids.len(), size);
                    prop_assert!(ids.iter().all(|id| crate::tokens::parse_token(id).map(|(u, _)| u) == Some(uuid)));
                    prop_assert!(ids.iter().all(|id| avail.contains(id)));
                }
                Choice::Stale => prop_assert!(room < size),
                Choice::None => prop_assert!(false, "a hint of the size is pending"),
            }
        }
    }
}
