//! `CUDA_VISIBLE_DEVICES`, parsed the way the real driver does.
//!
//! - Unset: every device, in order.
//! - A comma-separated list of entries; each is a device index (decimal) or a
//!   UUID (`GPU-...`, any unique prefix of it, case-insensitive).
//! - Parsing stops at the first invalid entry: an index out of range, an
//!   unknown or ambiguous UUID, a MIG id, a repeated device, or anything else.
//!   The devices before it stay visible.
//! - Empty (or only invalid): no devices.

/// Physical device indices visible as CUDA ordinals 0, 1, ...
pub fn parse_visible(value: Option<&str>, uuids: &[String]) -> Vec<usize> {
    let Some(value) = value else {
        return (0..uuids.len()).collect();
    };
    let mut out = Vec::new();
    for entry in value.split(',') {
        let entry = entry.trim();
        let Some(dev) = resolve(entry, uuids) else { break };
        if out.contains(&dev) {
            break;
        }
        out.push(dev);
    }
    out
}

fn resolve(entry: &str, uuids: &[String]) -> Option<usize> {
    if entry.is_empty() {
        return None;
    }
    if entry.bytes().all(|b| b.is_ascii_digit()) {
        let i: usize = entry.parse().ok()?;
        return (i < uuids.len()).then_some(i);
    }
    let lower = entry.to_ascii_lowercase();
    if !lower.starts_with("gpu-") || lower.len() <= 4 {
        return None;
    }
    let mut hits = uuids.iter().enumerate().filter(|(_, u)| u.to_ascii_lowercase().starts_with(&lower));
    let first = hits.next()?;
    if hits.next().is_some() {
        return None; // ambiguous prefix
    }
    Some(first.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use egpu_core::simspec::sim_uuid;
    use proptest::prelude::*;

    fn uuids(n: u32) -> Vec<String> {
        (0..n).map(sim_uuid).collect()
    }

    #[test]
    fn indices_and_uuids() {
        let u = uuids(4);
        assert_eq!(parse_visible(None, &u), vec![0, 1, 2, 3]);
        assert_eq!(parse_visible(Some("2,0"), &u), vec![2, 0]);
        assert_eq!(parse_visible(Some(" 1 , 3 "), &u), vec![1, 3]);
        assert_eq!(parse_visible(Some(""), &u), Vec::<usize>::new());
        assert_eq!(parse_visible(Some("1,7,2"), &u), vec![1]);
        assert_eq!(parse_visible(Some("1,x,2"), &u), vec![1]);
        assert_eq!(parse_visible(Some("1,1,2"), &u), vec![1]);
        assert_eq!(parse_visible(Some("-1"), &u), Vec::<usize>::new());
        assert_eq!(parse_visible(Some(&u[3].clone()), &u), vec![3]);
        let upper = u[2].to_ascii_uppercase();
        assert_eq!(parse_visible(Some(&format!("{upper},0")), &u), vec![2, 0]);
        // All simulated UUIDs share a long prefix: a short prefix is ambiguous.
        assert_eq!(parse_visible(Some("GPU-5e6d"), &u), Vec::<usize>::new());
        assert_eq!(parse_visible(Some(&u[1][..u[1].len() - 1]), &u), Vec::<usize>::new(), "ambiguous");
        let u12: Vec<String> = (0..12).map(sim_uuid).collect();
        // ...000a is the only uuid starting with ...000a.
        assert_eq!(parse_visible(Some(&u12[10]), &u12), vec![10]);
        assert_eq!(parse_visible(Some(&u12[10][..u12[10].len() - 1]), &u12), Vec::<usize>::new(), "ambiguous");
        assert_eq!(parse_visible(Some("MIG-abc"), &u), Vec::<usize>::new());
    }

    proptest! {
        #[test]
        fn result_is_a_prefix_of_distinct_valid_devices(n in 1u32..8, s in "[0-9, a-zGPU-]{0,24}") {
            let u = uuids(n);
            let v = parse_visible(Some(&s), &u);
            let mut seen = std::collections::HashSet::new();
            for d in &v {
                prop_assert!(*d < n as usize);
                prop_assert!(seen.insert(*d));
            }
            prop_assert!(v.len() <= s.split(',').count());
        }

        #[test]
        fn index_lists_roundtrip(perm in Just((0..6usize).collect::<Vec<_>>()).prop_shuffle(), k in 0usize..=6) {
            let u = uuids(6);
            let chosen = &perm[..k];
            let text = chosen.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
            prop_assert_eq!(parse_visible(Some(&text), &u), chosen.to_vec());
        }
    }
}
