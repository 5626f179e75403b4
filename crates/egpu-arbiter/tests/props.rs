//! Invariants of the allocation, over random slice sets.

use egpu_arbiter::alloc::{Claim, FULL_BPS, allocate};
use egpu_core::Priority;
use proptest::prelude::*;

const P: u64 = 10_000_000;

fn claims() -> impl Strategy<Value = Vec<Claim>> {
    let one = (0u32..=10_000, 0u32..=10_000, 0u32..3, 0u64..=P, any::<bool>()).prop_map(|(a, b, pr, used, hungry)| Claim {
        share_bps: a.min(b),
        limit_bps: a.max(b),
        priority: Priority::from_code(pr).expect("0..3"),
        used_ns: used,
        hungry,
    });
    proptest::collection::vec(one, 0..12).prop_map(|mut v| {
        // egpud never admits shares summing over 100% on a device: scale them down.
        let sum: u64 = v.iter().map(|c| u64::from(c.share_bps)).sum();
        if sum > FULL_BPS {
            for c in &mut v {
                c.share_bps = (u64::from(c.share_bps) * FULL_BPS / sum) as u32;
            }
        }
        v
    })
}

proptest! {
    #[test]
    fn invariants(cs in claims()) {
        let mut b = vec![0; cs.len()];
        allocate(P, &cs, &mut b);
        let mut expected = 0u64;
        for (c, &x) in cs.iter().zip(&b) {
            let (cap, g) = c.cap_and_guarantee(P);
            // Never above the limit, never below the guarantee (busy or not).
            prop_assert!(x <= cap, "{c:?} got {x} > cap {cap}");
            prop_assert!(x >= g, "{c:?} got {x} < guarantee {g}");
            expected += c.want(P).min(g);
        }
        // Overbooking is bounded by the guarantees idle slices keep.
        let total: u64 = b.iter().sum();
        let idle_guarantees: u64 = cs.iter().map(|c| { let (_, g) = c.cap_and_guarantee(P); g - c.want(P).min(g) }).sum();
        prop_assert!(total <= P + idle_guarantees + cs.len() as u64, "total {total}");
        // What slices are expected to use never exceeds the period.
        let expected_use: u64 = cs.iter().zip(&b).map(|(c, &x)| c.want(P).min(x)).sum();
        prop_assert!(expected_use <= P.max(expected) + cs.len() as u64);
        // Work conservation: if a hungry slice is below its cap, nothing was left over.
        let left = P.saturating_sub(expected_use);
        for (c, &x) in cs.iter().zip(&b) {
            let (cap, _) = c.cap_and_guarantee(P);
            if c.hungry && x + (cs.len() as u64) < cap {
                prop_assert!(left <= cs.len() as u64, "hungry {c:?} at {x} < {cap} while {left} ns idle");
            }
        }
        // Best-effort yields: a best-effort slice above its guarantee means no
        // hungry high/normal slice is below its cap.
        for (c, &x) in cs.iter().zip(&b) {
            if c.priority == Priority::BestEffort && x > c.cap_and_guarantee(P).1.max(c.want(P).min(x)) {
                continue; // headroom only; pass 2
            }
            if c.priority == Priority::BestEffort && x > c.cap_and_guarantee(P).1 {
                for (o, &y) in cs.iter().zip(&b) {
                    if o.priority != Priority::BestEffort && o.hungry {
                        prop_assert!(y + cs.len() as u64 >= o.cap_and_guarantee(P).0, "best-effort {c:?} got surplus while {o:?} starved at {y}");
                    }
                }
            }
        }
    }
}
