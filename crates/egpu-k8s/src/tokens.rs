//! Memory tokens: the device IDs the plugin advertises to the kubelet.
//!
//! Each GPU of the node is cut into tokens of one memory unit (default
//! 1 GiB): token `<GPU UUID>_<k>`, k from 0. A container that asks for
//! `egpu.io/gpu-memory: 10` is given ten tokens by the kubelet, which keeps
//! the node-wide count; the plugin turns them into a slice of ten units on
//! the GPU they belong to. Pure code: no IO.

use std::collections::BTreeMap;

/// The separator between a token's GPU UUID and its number.
const SEP: char = '_';

/// A GPU as the plugin sees it: its index and UUID in egpud, its memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    /// The model name, e.g. `NVIDIA H200`.
    pub model: String,
    pub memory_bytes: u64,
    /// Its NVLink group, as egpud reports it (`None`: unknown).
    pub nvlink: Option<u32>,
    /// The NUMA node nearest it, as egpud reports it (`None`: none or unknown).
    pub numa: Option<u32>,
    /// Its PCI address (sysfs form) and PCIe root complex, when known.
    pub pci_bus_id: Option<String>,
    pub pcie_root: Option<String>,
    /// Its PCIe switch group, as egpud reports it (`None`: unknown).
    pub pcie: Option<u32>,
}

impl Gpu {
    /// Where it is, for picking whole GPUs that work well together.
    pub fn link(&self) -> Link {
        Link { nvlink: self.nvlink, numa: self.numa, pcie: self.pcie }
    }
}

impl From<&egpu_node::proto::Device> for Gpu {
    /// A GPU as egpud's `GetNode` lists it.
    fn from(d: &egpu_node::proto::Device) -> Gpu {
        Gpu {
            index: d.index,
            uuid: d.uuid.clone(),
            model: d.name.clone(),
            memory_bytes: d.memory_bytes,
            nvlink: d.nvlink_group,
            numa: d.numa_node,
            pci_bus_id: d.pci_bus_id.clone(),
            pcie_root: d.pcie_root.clone(),
            pcie: d.pcie_switch_group,
        }
    }
}

/// Where a GPU is, as far as picking several whole GPUs for one container
/// goes: its NVLink group, its NUMA node and its PCIe switch group
/// (`None`: unknown).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Link {
    pub nvlink: Option<u32>,
    pub numa: Option<u32>,
    pub pcie: Option<u32>,
}

/// The node's GPUs and the size of one token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    pub unit_bytes: u64,
    pub gpus: Vec<Gpu>,
}

/// Why a set of tokens cannot become a slice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("device ID '{0}' is not one this plugin advertised (expected <GPU UUID>_<number>); was the plugin restarted with another --memory-unit, or the GPUs changed?")]
    Unknown(String),
    #[error("no devices requested")]
    Empty,
    #[error(
        "the kubelet chose memory on {gpus} GPUs ({detail}), but a slice's memory comes from one GPU, or from whole GPUs of one size for a container larger than any one GPU: either no GPU had {want} unit(s) free when the pod was admitted, or (for a container larger than a GPU) not enough GPUs were entirely free or {want} is not a multiple of a GPU's units (the `units` of the node's egpu.io/gpus annotation). Ask for less, or for such a multiple, or let the scheduler place the pod on a node with room"
    )]
    Spread { gpus: usize, detail: String, want: usize },
}

/// The device ID of token `k` of the GPU `uuid`.
pub fn token_id(uuid: &str, k: u32) -> String {
    format!("{uuid}{SEP}{k}")
}

/// Splits a device ID into its GPU UUID and token number.
pub fn parse_token(id: &str) -> Option<(&str, u32)> {
    let (uuid, k) = id.rsplit_once(SEP)?;
    if uuid.is_empty() || k.is_empty() || !k.bytes().all(|b| b.is_ascii_digit()) || (k.len() > 1 && k.starts_with('0')) {
        return None;
    }
    Some((uuid, k.parse().ok()?))
}

impl Inventory {
    /// How many tokens GPU `gpu` has (whole units only).
    pub fn tokens_of(&self, gpu: &Gpu) -> u32 {
        u32::try_from(gpu.memory_bytes / self.unit_bytes.max(1)).unwrap_or(u32::MAX)
    }

    /// Every token of the node, GPU by GPU.
    pub fn all_tokens(&self) -> impl Iterator<Item = (&Gpu, u32, String)> + '_ {
        self.gpus.iter().flat_map(move |g| (0..self.tokens_of(g)).map(move |k| (g, k, token_id(&g.uuid, k))))
    }

    /// How many tokens the GPU `uuid` has.
    pub fn tokens_of_uuid(&self, uuid: &str) -> Option<u32> {
        self.gpus.iter().find(|g| g.uuid == uuid).map(|g| self.tokens_of(g))
    }

    /// The tokens and the NVLink group and NUMA node of the GPU `uuid`.
    pub fn whole_of_uuid(&self, uuid: &str) -> Option<(u32, Link)> {
        self.gpus.iter().find(|g| g.uuid == uuid).map(|g| (self.tokens_of(g), g.link()))
    }

    /// Whether egpud knows every GPU's NUMA node.
    pub fn numa_known(&self) -> bool {
        self.gpus.iter().all(|g| g.numa.is_some())
    }

    /// The most tokens one GPU has.
    pub fn max_tokens(&self) -> u32 {
        self.gpus.iter().map(|g| self.tokens_of(g)).max().unwrap_or(0)
    }

    /// The GPUs a set of tokens lies on, with how many on each (by index):
    /// one GPU, or several whole GPUs (every token of each: a multi-GPU
    /// container). Refused when they are unknown, empty, or spread over
    /// GPUs without covering each whole.
    pub fn resolve(&self, ids: &[String]) -> Result<Vec<(&Gpu, usize)>, TokenError> {
        let mut per_gpu: BTreeMap<u32, usize> = BTreeMap::new();
        let mut seen = std::collections::HashSet::new();
        for id in ids {
            let gpu = parse_token(id)
                .and_then(|(uuid, k)| self.gpus.iter().find(|g| g.uuid == uuid && k < self.tokens_of(g)))
                .ok_or_else(|| TokenError::Unknown(egpu_core::slice::shown(id)))?;
            if seen.insert(id.as_str()) {
                *per_gpu.entry(gpu.index).or_default() += 1;
            }
        }
        let on: Vec<(&Gpu, usize)> = per_gpu.iter().map(|(&index, &n)| (self.gpus.iter().find(|g| g.index == index).expect("resolved above"), n)).collect();
        // Several GPUs: each whole, all of one size, for a container larger
        // than any one GPU (what the preference and the extender choose).
        let whole = |(g, n): &(&Gpu, usize)| *n == self.tokens_of(g) as usize;
        let one_size = on.windows(2).all(|w| self.tokens_of(w[0].0) == self.tokens_of(w[1].0));
        match on.len() {
            0 => Err(TokenError::Empty),
            1 => Ok(on),
            _ if on.iter().all(whole) && one_size && seen.len() > self.max_tokens() as usize => Ok(on),
            gpus => Err(TokenError::Spread {
                gpus,
                detail: per_gpu.iter().map(|(i, n)| format!("{n} on GPU {i}")).collect::<Vec<_>>().join(", "),
                want: seen.len(),
            }),
        }
    }
}

/// The plugin's answer to `GetPreferredAllocation`: `size` tokens from
/// `available`, all of `must_include` among them, on one GPU when any GPU
/// can hold them all. Among the GPUs that can, the one with the fewest
/// tokens available is chosen (best fit), so that larger requests still find
/// a GPU with room; the lowest-numbered tokens are taken. When no single GPU
/// can, the tokens come from the GPUs with the most available first (the
/// allocation will then be refused by `Allocate`, with the reason).
pub fn preferred(available: &[String], must_include: &[String], size: usize) -> Vec<String> {
    // GPU UUID -> its available tokens, by number; unparseable IDs are never preferred.
    let mut by_gpu: BTreeMap<&str, BTreeMap<u32, &String>> = BTreeMap::new();
    for id in available.iter().chain(must_include) {
        if let Some((uuid, k)) = parse_token(id) {
            by_gpu.entry(uuid).or_default().insert(k, id);
        }
    }
    // `size` comes off the wire: never reserve more than can be chosen.
    let mut out: Vec<String> = Vec::with_capacity(size.min(available.len() + must_include.len()));
    for id in must_include {
        if out.len() < size && !out.contains(id) {
            out.push(id.clone());
        }
    }
    let pinned: Vec<&str> = must_include.iter().filter_map(|id| parse_token(id).map(|(u, _)| u)).collect();
    let candidates: Vec<(&str, u32)> = by_gpu.iter().filter(|(u, _)| pinned.iter().all(|p| p == *u)).map(|(u, t)| (*u, u32::try_from(t.len()).unwrap_or(u32::MAX))).collect();
    let best = best_fit(&candidates, u32::try_from(size).unwrap_or(u32::MAX));
    let order: Vec<&str> = match best {
        Some(u) => vec![u],
        None => {
            let mut gpus: Vec<(&str, usize)> = by_gpu.iter().map(|(u, t)| (*u, t.len())).collect();
            // Pinned GPUs first, then the fullest.
            gpus.sort_by_key(|(u, n)| (!pinned.contains(u), std::cmp::Reverse(*n), *u));
            gpus.into_iter().map(|(u, _)| u).collect()
        }
    };
    for uuid in order {
        for id in by_gpu[uuid].values() {
            if out.len() >= size {
                return out;
            }
            if !out.contains(id) {
                out.push((*id).clone());
            }
        }
    }
    out
}

/// The GPU a container of `size` units goes to, from `free` (key, units
/// free): the one with the least free that holds it (best fit, so larger
/// requests still find room), the lower key on a tie. The one rule the
/// plugin's preference and the extender's fit share.
pub fn best_fit<K: Ord + Copy>(free: &[(K, u32)], size: u32) -> Option<K> {
    free.iter().filter(|(_, n)| *n >= size).min_by_key(|(k, n)| (*n, *k)).map(|(k, _)| *k)
}

/// The whole GPUs a container of `size` units larger than any one GPU
/// takes, from the entirely free GPUs `free` (key, units, where it is):
/// those of one size `per` that divides `size` and has enough free GPUs
/// (the largest such size). Of that size, all from one group of GPUs when
/// a group has enough, trying in turn GPUs of one NVLink group and one
/// NUMA node, of one NVLink group, of one PCIe switch group, then of one
/// NUMA node (of the groups
/// that have enough, the one with the fewest free GPUs of the size, so
/// larger groups stay whole for larger requests; then the lowest keys),
/// else any of that size (a smaller size is not tried for the sake of a
/// group); lowest keys first. The `pinned` keys must be among them.
/// The one rule the plugin's preference and the extender's fit share.
pub fn whole_gpus<K: Ord + Copy>(free: &[(K, u32, Link)], size: u32, pinned: &[K]) -> Option<Vec<K>> {
    let mut sizes: Vec<u32> = free.iter().map(|(_, n, _)| *n).filter(|&n| n > 0 && size > n && size.is_multiple_of(n)).collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes.dedup();
    let first = |mut of: Vec<K>, need: usize| {
        of.sort_unstable_by_key(|k| (!pinned.contains(k), *k));
        (of.len() >= need && pinned.iter().all(|p| of[..need].contains(p))).then(|| {
            of.truncate(need);
            of
        })
    };
    // The groupings, closest first: a GPU outside a grouping (a part
    // unknown) is in none of its groups.
    type GroupOf = fn(Link) -> Option<(u32, u32)>;
    let groupings: [GroupOf; 4] = [|l| l.nvlink.zip(l.numa), |l| l.nvlink.map(|g| (g, 0)), |l| l.pcie.map(|g| (g, 0)), |l| l.numa.map(|n| (n, 0))];
    for per in sizes {
        let need = (size / per) as usize;
        for group_of in groupings {
            let mut groups: BTreeMap<(u32, u32), Vec<K>> = BTreeMap::new();
            for (k, _, l) in free.iter().filter(|(_, n, _)| *n == per) {
                if let Some(g) = group_of(*l) {
                    groups.entry(g).or_default().push(*k);
                }
            }
            let best = groups.into_values().filter_map(|of| first(of.clone(), need).map(|chosen| (of.len(), chosen))).min_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
            if let Some((_, chosen)) = best {
                return Some(chosen);
            }
        }
        if let Some(chosen) = first(free.iter().filter(|(_, n, _)| *n == per).map(|(k, _, _)| *k).collect(), need) {
            return Some(chosen);
        }
    }
    None
}

/// A GPU's tokens and where it is, by UUID ([`Inventory::whole_of_uuid`]).
pub type WholeOf<'a> = dyn Fn(&str) -> Option<(u32, Link)> + 'a;

/// For a container larger than any one GPU: whole GPUs whose tokens are
/// all available, by [`whole_gpus`]; `gpu_of` gives a GPU's tokens and
/// where it is. `None` when no size of entirely free GPUs divides `size`
/// with enough of them (then [`preferred`] answers, and `Allocate` refuses
/// the spread with the reason).
pub fn preferred_whole(available: &[String], must_include: &[String], size: usize, gpu_of: &WholeOf) -> Option<Vec<String>> {
    let mut by_gpu: BTreeMap<&str, std::collections::BTreeSet<(u32, &String)>> = BTreeMap::new();
    for id in available.iter().chain(must_include) {
        if let Some((uuid, k)) = parse_token(id) {
            by_gpu.entry(uuid).or_default().insert((k, id));
        }
    }
    let pinned: Vec<&str> = must_include.iter().filter_map(|id| parse_token(id).map(|(u, _)| u)).collect();
    let free: Vec<(&str, u32, Link)> = by_gpu.iter().filter_map(|(u, t)| gpu_of(u).filter(|&(n, _)| n > 0 && t.len() == n as usize).map(|(n, l)| (*u, n, l))).collect();
    let chosen = whole_gpus(&free, u32::try_from(size).ok()?, &pinned)?;
    // By GPU UUID, then token number.
    Some(chosen.iter().flat_map(|u| by_gpu[u].iter().map(|(_, id)| (*id).clone())).collect())
}

/// The slice name of a container's tokens: `k8s-` and 16 hex digits of a
/// 64-bit FNV-1a hash of the sorted IDs. The same tokens always give the
/// same name, so a repeated `Allocate` finds its slice, and the sweeper can
/// tell from the kubelet's pod-resources list which slices are still held.
/// (FNV-1a by hand: eight lines, and the name must not change with a
/// hashing crate's version.)
pub fn slice_name(ids: &[String]) -> String {
    let mut sorted: Vec<&str> = ids.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, id) in sorted.iter().enumerate() {
        for b in (if i > 0 { "," } else { "" }).bytes().chain(id.bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{SLICE_PREFIX}{h:016x}")
}

/// The prefix of every slice the plugin creates; the sweeper touches no other.
pub const SLICE_PREFIX: &str = "k8s-";

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn inv() -> Inventory {
        Inventory {
            unit_bytes: 1 << 30,
            gpus: vec![
                Gpu { index: 0, uuid: "GPU-a".into(), model: "m".into(), memory_bytes: 16 << 30, nvlink: None, ..Default::default() },
                Gpu { index: 1, uuid: "GPU-b".into(), model: "m".into(), memory_bytes: (16 << 30) + 5, nvlink: None, ..Default::default() },
            ],
        }
    }

    fn ids(uuid: &str, ks: impl IntoIterator<Item = u32>) -> Vec<String> {
        ks.into_iter().map(|k| token_id(uuid, k)).collect()
    }

    #[test]
    fn token_ids_round_trip_and_reject_garbage() {
        assert_eq!(parse_token("GPU-12ab-cd_7"), Some(("GPU-12ab-cd", 7)));
        assert_eq!(parse_token(&token_id("GPU-x_y", 12)), Some(("GPU-x_y", 12)));
        for bad in ["", "_1", "GPU-a_", "GPU-a_x", "GPU-a_-1", "GPU-a_01", "GPU-a", "GPU-a_99999999999"] {
            assert_eq!(parse_token(bad), None, "{bad}");
        }
    }

    #[test]
    fn inventory_counts_whole_units() {
        let inv = inv();
        assert_eq!(inv.tokens_of(&inv.gpus[1]), 16);
        assert_eq!(inv.all_tokens().count(), 32);
    }

    #[test]
    fn resolve_accepts_one_gpu_and_explains_a_spread() {
        let inv = inv();
        let on = |r: Vec<(&Gpu, usize)>| r.iter().map(|(g, n)| (g.index, *n)).collect::<Vec<_>>();
        assert_eq!(on(inv.resolve(&ids("GPU-b", 3..8)).unwrap()), [(1, 5)]);
        // Whole GPUs: a multi-GPU container.
        let mut both = ids("GPU-b", 0..16);
        both.extend(ids("GPU-a", 0..16));
        assert_eq!(on(inv.resolve(&both).unwrap()), [(0, 16), (1, 16)]);
        // One whole and part of another: refused.
        let mut part = ids("GPU-a", 0..16);
        part.extend(ids("GPU-b", 0..15));
        assert!(matches!(inv.resolve(&part), Err(TokenError::Spread { gpus: 2, .. })));
        // Whole GPUs of two sizes, or no larger than the largest GPU: refused.
        let mixed = Inventory { unit_bytes: 1 << 30, gpus: vec![inv.gpus[0].clone(), Gpu { index: 2, uuid: "GPU-c".into(), model: "m".into(), memory_bytes: 4 << 30, nvlink: None, ..Default::default() }, Gpu { index: 3, uuid: "GPU-d".into(), model: "m".into(), memory_bytes: 4 << 30, nvlink: None, ..Default::default() }] };
        let mut two_sizes = ids("GPU-a", 0..16);
        two_sizes.extend(ids("GPU-c", 0..4));
        assert!(matches!(mixed.resolve(&two_sizes), Err(TokenError::Spread { .. })));
        let mut small = ids("GPU-c", 0..4);
        small.extend(ids("GPU-d", 0..4));
        assert!(matches!(mixed.resolve(&small), Err(TokenError::Spread { .. })), "8 units fit the 16-unit GPU");
        let mut spread = ids("GPU-a", 0..2);
        spread.extend(ids("GPU-b", 0..3));
        let e = inv.resolve(&spread).unwrap_err();
        assert_eq!(e, TokenError::Spread { gpus: 2, detail: "2 on GPU 0, 3 on GPU 1".into(), want: 5 });
        assert!(e.to_string().contains("one GPU"), "{e}");
        assert!(matches!(inv.resolve(&ids("GPU-a", [16])), Err(TokenError::Unknown(_))), "token past the GPU's memory");
        assert!(matches!(inv.resolve(&ids("GPU-z", [0])), Err(TokenError::Unknown(_))));
        assert_eq!(inv.resolve(&[]), Err(TokenError::Empty));
    }

    #[test]
    fn preferred_is_best_fit_on_one_gpu() {
        // GPU-a has 6 tokens left, GPU-b 16.
        let mut avail = ids("GPU-a", 10..16);
        avail.extend(ids("GPU-b", 0..16));
        assert_eq!(preferred(&avail, &[], 4), ids("GPU-a", 10..14), "the tighter GPU that fits");
        assert_eq!(preferred(&avail, &[], 8), ids("GPU-b", 0..8), "only GPU-b fits 8");
        // Nothing fits 20: the fullest GPU first.
        let p = preferred(&avail, &[], 20);
        assert_eq!(p.len(), 20);
        assert_eq!(&p[..16], &ids("GPU-b", 0..16)[..]);
        // A pinned token decides the GPU.
        assert_eq!(preferred(&avail, &ids("GPU-b", [9]), 3), vec![token_id("GPU-b", 9), token_id("GPU-b", 0), token_id("GPU-b", 1)]);
        // A size off the wire far above what is available: all of it, and no huge reservation first.
        assert_eq!(preferred(&avail, &[], i32::MAX as usize).len(), avail.len());
    }

    /// Where nothing is known.
    const U: Link = Link { nvlink: None, numa: None, pcie: None };

    /// In NVLink group `g`, NUMA node unknown.
    fn nv(g: u32) -> Link {
        Link { nvlink: Some(g), ..U }
    }

    #[test]
    fn preferred_whole_takes_entirely_free_gpus_for_a_multi_gpu_container() {
        let n = |_: &str| Some((16, U));
        let (a, b, c) = (ids("GPU-a", 0..16), ids("GPU-b", 0..16), ids("GPU-c", 0..16));
        let avail: Vec<String> = [c.clone(), a.clone(), b.clone()].concat();
        let mut want: Vec<String> = [a.clone(), b.clone()].concat();
        want.sort_by_key(|id| parse_token(id).map(|(u, k)| (u.to_string(), k)));
        assert_eq!(preferred_whole(&avail, &[], 32, &n), Some(want), "the lowest UUIDs");
        assert_eq!(preferred_whole(&avail, &ids("GPU-c", [3]), 16 * 2, &n).map(|p| p.iter().filter(|id| id.starts_with("GPU-c")).count()), Some(16), "a pinned GPU is one of them");
        assert_eq!(preferred_whole(&avail, &[], 20, &n), None, "not a multiple of a GPU");
        assert_eq!(preferred_whole(&avail, &[], 16, &n), None, "one GPU: preferred() answers");
        assert_eq!(preferred_whole(&avail, &[], 64, &n), None, "not enough GPUs");
        // GPU-a is not entirely free: only b and c can be taken.
        let partial: Vec<String> = [ids("GPU-a", 1..16), b.clone(), c.clone()].concat();
        assert_eq!(preferred_whole(&partial, &[], 32, &n).map(|p| p.iter().any(|id| id.starts_with("GPU-a"))), Some(false));
        assert_eq!(preferred_whole(&partial, &ids("GPU-a", [1]), 32, &n), None, "a pinned GPU that is not whole");
    }

    #[test]
    fn whole_gpus_takes_one_size_that_divides_the_request() {
        // The largest size that divides it and has enough free GPUs.
        assert_eq!(whole_gpus(&[(0, 40, U), (1, 80, U), (2, 80, U)], 160, &[]), Some(vec![1, 2]));
        assert_eq!(whole_gpus(&[(0, 40, U), (1, 40, U), (2, 80, U), (3, 40, U), (4, 40, U)], 160, &[]), Some(vec![0, 1, 3, 4]), "one 80 is not enough: four 40s");
        assert_eq!(whole_gpus(&[(0, 80, U), (1, 80, U)], 120, &[]), None, "no size divides 120 with enough GPUs");
        assert_eq!(whole_gpus(&[(0, 80, U), (1, 80, U)], 80, &[]), None, "one GPU is not a multi-GPU request");
        assert_eq!(whole_gpus(&[(0, 80, U), (1, 80, U), (2, 80, U)], 160, &[2]), Some(vec![2, 0]), "pinned first");
        assert_eq!(whole_gpus(&[(0, 80, U), (1, 80, U), (2, 40, U)], 160, &[2]), None, "a pinned GPU of another size");
    }

    #[test]
    fn whole_gpus_keep_to_one_nvlink_group_when_one_has_enough() {
        // GPUs 0-1 and 2-3 are NVLink pairs; GPU 1 is in use. Lowest keys
        // would take 0 and 2, across the pairs: the pair 2-3 is taken.
        let pairs = |free: &[u32]| free.iter().map(|&k| (k, 80, nv(k / 2 * 2))).collect::<Vec<_>>();
        assert_eq!(whole_gpus(&pairs(&[0, 2, 3]), 160, &[]), Some(vec![2, 3]));
        // Of two groups that can, the one with fewer free GPUs of the size,
        // so the larger stays whole: 4 GPUs of group 0, 2 of group 4.
        let two = [(0, 80, nv(0)), (1, 80, nv(0)), (2, 80, nv(0)), (3, 80, nv(0)), (4, 80, nv(4)), (5, 80, nv(4))];
        assert_eq!(whole_gpus(&two, 160, &[]), Some(vec![4, 5]));
        assert_eq!(whole_gpus(&two, 320, &[]), Some(vec![0, 1, 2, 3]));
        // A pinned GPU decides the group; no group with enough: any GPUs.
        assert_eq!(whole_gpus(&two, 160, &[1]), Some(vec![1, 0]));
        assert_eq!(whole_gpus(&pairs(&[0, 2]), 160, &[]), Some(vec![0, 2]));
        // Unknown groups: as before, the lowest keys.
        assert_eq!(whole_gpus(&[(0, 80, U), (2, 80, U), (3, 80, U)], 160, &[]), Some(vec![0, 2]));
    }

    #[test]
    fn whole_gpus_keep_to_one_numa_node_after_the_nvlink_group() {
        let at = |nvlink: Option<u32>, numa: Option<u32>| Link { nvlink, numa, pcie: None };
        // No NVLink; GPUs 0-1 on NUMA node 0, 2-3 on node 1; GPU 1 in use.
        let numa = |free: &[u32]| free.iter().map(|&k| (k, 80, at(None, Some(k / 2)))).collect::<Vec<_>>();
        assert_eq!(whole_gpus(&numa(&[0, 2, 3]), 160, &[]), Some(vec![2, 3]), "one NUMA node, not the lowest keys");
        assert_eq!(whole_gpus(&numa(&[0, 2]), 160, &[]), Some(vec![0, 2]), "no node has enough: any");
        // One NVSwitch group of eight over two NUMA nodes (0-3, 4-7), 1 in
        // use: both nodes' GPUs are linked, the pair comes from one node,
        // the one with fewer free (node 0, three free, keeps node 1 whole).
        let sw = |free: &[u32]| free.iter().map(|&k| (k, 80, at(Some(0), Some(k / 4)))).collect::<Vec<_>>();
        assert_eq!(whole_gpus(&sw(&[0, 2, 3, 4, 5, 6, 7]), 160, &[]), Some(vec![0, 2]));
        assert_eq!(whole_gpus(&sw(&[0, 2, 3, 4, 5, 6, 7]), 320, &[]), Some(vec![4, 5, 6, 7]), "four: the whole node 1");
        assert_eq!(whole_gpus(&sw(&[0, 2, 3, 4, 5, 6]), 320, &[]), Some(vec![0, 2, 3, 4]), "no node has four: the NVLink group");
        // NVLink before NUMA: pairs 0-1 and 2-3 linked, across nodes (0, 2
        // on node 0; 1, 3 on node 1): the linked pair wins.
        let cross = [(0, 80, at(Some(0), Some(0))), (1, 80, at(Some(0), Some(1))), (2, 80, at(Some(2), Some(0))), (3, 80, at(Some(2), Some(1)))];
        assert_eq!(whole_gpus(&cross[1..], 160, &[]), Some(vec![2, 3]));
        // No NVLink: a PCIe switch group (pairs 0-1, 2-3) before a NUMA
        // node (0 and 2 on node 0, 1 and 3 on node 1).
        let pcie = |free: &[u32]| free.iter().map(|&k| (k, 80, Link { nvlink: None, numa: Some(k % 2), pcie: Some(k / 2 * 2) })).collect::<Vec<_>>();
        assert_eq!(whole_gpus(&pcie(&[1, 2, 3]), 160, &[]), Some(vec![2, 3]), "the switch pair, not the NUMA pair 1, 3");
        assert_eq!(whole_gpus(&pcie(&[0, 1, 3]), 160, &[]), Some(vec![0, 1]));
        // As on real hardware: four GPUs of one NUMA node, pairs 0-1 and 2-3
        // under switches, GPU 1 in use: the switch pair, where the node
        // alone would give the lowest keys 0 and 2.
        let one_node = |free: &[u32]| free.iter().map(|&k| (k, 80, Link { nvlink: None, numa: Some(0), pcie: Some(k / 2 * 2) })).collect::<Vec<_>>();
        assert_eq!(whole_gpus(&one_node(&[0, 2, 3]), 160, &[]), Some(vec![2, 3]));
        // A GPU whose node is unknown is in no node's group.
        assert_eq!(whole_gpus(&[(0, 80, at(None, None)), (1, 80, at(None, Some(1))), (2, 80, at(None, Some(1)))], 160, &[]), Some(vec![1, 2]));
    }

    #[test]
    fn slice_names_are_stable_valid_and_order_free() {
        let a = slice_name(&ids("GPU-a", [1, 2, 3]));
        let b = slice_name(&ids("GPU-a", [3, 1, 2]));
        assert_eq!(a, b);
        assert_ne!(a, slice_name(&ids("GPU-a", [1, 2, 4])));
        assert_ne!(a, slice_name(&ids("GPU-a", [1, 2])));
        egpu_core::slice::validate_name(&a).unwrap();
        assert_eq!(a.len(), SLICE_PREFIX.len() + 16);
    }

    proptest! {
        #[test]
        fn preferred_answers_what_was_asked(
            a in proptest::collection::btree_set(0u32..24, 0..24),
            b in proptest::collection::btree_set(0u32..24, 0..24),
            pin in proptest::option::of((any::<bool>(), 0u32..24)),
            size in 0usize..40,
        ) {
            let mut avail = ids("GPU-a", a.iter().copied());
            avail.extend(ids("GPU-b", b.iter().copied()));
            let must: Vec<String> = pin.map(|(on_a, k)| token_id(if on_a { "GPU-a" } else { "GPU-b" }, k)).into_iter().collect();
            let p = preferred(&avail, &must, size);
            let total = {
                let mut all: std::collections::BTreeSet<&String> = avail.iter().collect();
                all.extend(must.iter());
                all.len()
            };
            prop_assert_eq!(p.len(), size.min(total));
            let uniq: std::collections::BTreeSet<&String> = p.iter().collect();
            prop_assert_eq!(uniq.len(), p.len(), "no token twice");
            for id in &p {
                prop_assert!(avail.contains(id) || must.contains(id), "{} was not offered", id);
            }
            if size > 0 {
                for id in &must {
                    prop_assert!(p.contains(id), "must-include {} missing", id);
                }
            }
            // One GPU whenever one GPU can hold it all.
            let count = |u: &str| avail.iter().chain(&must).filter(|t| parse_token(t).unwrap().0 == u).collect::<std::collections::BTreeSet<_>>().len();
            let pinned = must.first().map(|t| parse_token(t).unwrap().0);
            let one_fits = ["GPU-a", "GPU-b"].iter().any(|u| count(u) >= size && pinned.is_none_or(|p| p == *u));
            if one_fits {
                let gpus: std::collections::BTreeSet<&str> = p.iter().map(|t| parse_token(t).unwrap().0).collect();
                prop_assert!(gpus.len() <= 1, "spread over {:?}", gpus);
            }
        }

        #[test]
        fn whole_gpus_are_one_size_and_as_close_together_as_any_choice(
            gpus in proptest::collection::vec((prop_oneof![Just(40u32), Just(80u32)], proptest::option::of(0u32..3), proptest::option::of(0u32..2)), 0..10),
            k in 2u32..5,
            per in prop_oneof![Just(40u32), Just(80u32)],
            pin in proptest::option::of(0usize..10),
        ) {
            let free: Vec<(usize, u32, Link)> = gpus.iter().enumerate().map(|(i, &(n, nvlink, numa))| (i, n, Link { nvlink, numa, pcie: None })).collect();
            let pinned: Vec<usize> = pin.filter(|&p| p < free.len()).into_iter().collect();
            let size = k * per;
            let Some(chosen) = whole_gpus(&free, size, &pinned) else {
                // None only when no size that divides it has enough GPUs (with the pinned one among them).
                for n in [40u32, 80] {
                    let of: Vec<usize> = free.iter().filter(|g| g.1 == n).map(|g| g.0).collect();
                    prop_assert!(!(size > n && size.is_multiple_of(n) && of.len() as u32 >= size / n && pinned.iter().all(|p| of.contains(p))), "{n}-unit GPUs could hold {size}: {free:?}");
                }
                return Ok(());
            };
            let sizes: std::collections::BTreeSet<u32> = chosen.iter().map(|&i| free[i].1).collect();
            prop_assert_eq!(sizes.len(), 1, "one size");
            let n = *sizes.first().unwrap();
            prop_assert_eq!(chosen.len() as u32 * n, size);
            prop_assert!(pinned.iter().all(|p| chosen.contains(p)), "pinned {:?} in {:?}", pinned, chosen);
            let uniq: std::collections::BTreeSet<usize> = chosen.iter().copied().collect();
            prop_assert_eq!(uniq.len(), chosen.len());
            // Where some choice of that size keeps to one NVLink group and
            // NUMA node (the pinned GPU among it), this one does too.
            let links: std::collections::BTreeSet<Link> = chosen.iter().map(|&i| free[i].2).collect();
            let whole_group = free.iter().filter(|g| g.1 == n && g.2.nvlink.is_some() && g.2.numa.is_some()).any(|g| {
                let of: Vec<usize> = free.iter().filter(|h| h.1 == n && h.2 == g.2).map(|h| h.0).collect();
                of.len() >= chosen.len() && pinned.iter().all(|p| of.contains(p))
            });
            if whole_group {
                prop_assert!(links.len() == 1 && links.first().is_some_and(|l| l.nvlink.is_some() && l.numa.is_some()), "{:?} from {:?}", chosen, free);
            }
        }
    }
}
