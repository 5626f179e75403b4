//! Choosing GPUs inside a node once the node is chosen.

use crate::model::{MILLI, Node, Pod};
use rand::Rng;

/// Best fit: a sharing pod goes to the fitting GPU with the least free
/// compute (lowest index on ties); whole GPUs are the lowest-indexed fitting
/// ones. `None` when the pod does not fit the node's GPUs.
pub(crate) fn best_fit(node: &Node, pod: &Pod) -> Option<Vec<u8>> {
    if pod.gpu_count() == 0 {
        return Some(Vec::new());
    }
    if pod.is_sharing() {
        let mut best: Option<(u32, usize)> = None;
        for (i, g) in node.gpus().iter().enumerate() {
            if node.gpu_fits(i, pod) && best.is_none_or(|(f, _)| g.free_milli < f) {
                best = Some((g.free_milli, i));
            }
        }
        return best.map(|(_, i)| vec![i as u8]);
    }
    lowest_fitting(node, pod)
}

/// The lowest-indexed GPUs that fit, `gpu_count` of them.
pub(crate) fn lowest_fitting(node: &Node, pod: &Pod) -> Option<Vec<u8>> {
    let out: Vec<u8> = (0..node.gpus().len()).filter(|&i| node.gpu_fits(i, pod)).take(pod.gpu_count() as usize).map(|i| i as u8).collect();
    (out.len() == pod.gpu_count() as usize).then_some(out)
}

/// Random fit: a sharing pod goes to a fitting GPU chosen uniformly; whole
/// GPUs are the lowest-indexed fitting ones.
pub(crate) fn random_fit(node: &Node, pod: &Pod, rng: &mut impl Rng) -> Option<Vec<u8>> {
    if pod.gpu_count() == 0 {
        return Some(Vec::new());
    }
    if pod.is_sharing() {
        let mut seen = 0u32;
        let mut pick = None;
        for i in 0..node.gpus().len() {
            if node.gpu_fits(i, pod) {
                seen += 1;
                if rng.random_range(0..seen) == 0 {
                    pick = Some(i as u8);
                }
            }
        }
        return pick.map(|i| vec![i]);
    }
    lowest_fitting(node, pod)
}

/// Whole GPUs for a multi-GPU pod, kept inside one NVLink group when one
/// group can hold them all: the group with the fewest idle GPUs that still
/// suffices (so large groups stay whole), lowest indices inside it.
pub(crate) fn nvlink_whole(node: &Node, pod: &Pod) -> Option<Vec<u8>> {
    let want = pod.gpu_count() as usize;
    if want <= 1 || pod.gpu_milli() < MILLI {
        return best_fit(node, pod);
    }
    let mut groups: Vec<(u8, usize)> = Vec::new();
    for (i, g) in node.gpus().iter().enumerate() {
        if node.gpu_fits(i, pod) {
            match groups.iter_mut().find(|(id, _)| *id == g.nvlink_group) {
                Some(e) => e.1 += 1,
                None => groups.push((g.nvlink_group, 1)),
            }
        }
    }
    let group = groups.iter().filter(|(_, n)| *n >= want).min_by_key(|(id, n)| (*n, *id)).map(|(id, _)| *id);
    match group {
        Some(id) => {
            let out: Vec<u8> = (0..node.gpus().len()).filter(|&i| node.gpus()[i].nvlink_group == id && node.gpu_fits(i, pod)).take(want).map(|i| i as u8).collect();
            Some(out)
        }
        None => lowest_fitting(node, pod),
    }
}
