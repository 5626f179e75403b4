//! Scheduler invariants, property-tested over random clusters and pods:
//! no GPU is over-allocated, milli-GPU accounting is exact (placing then
//! releasing everything restores the empty cluster), and pods land only on
//! GPUs of an allowed type, for every policy.

use egpu_place::{Cluster, GpuTypeId, MILLI, NodeSpec, Placement, Pod, PolicyKind, Qos, TargetWorkload, TypeSet};
use proptest::prelude::*;

fn cluster(nodes: &[(u64, u8, u8)]) -> Cluster {
    let mut c = Cluster::new();
    let types = [c.gpu_type_or_insert("A", 16).unwrap(), c.gpu_type_or_insert("B", 32).unwrap(), c.gpu_type_or_insert("C", 80).unwrap()];
    for (i, &(cpu, gpus, t)) in nodes.iter().enumerate() {
        let spec = NodeSpec { name: format!("n{i:03}"), cpu_milli: cpu, memory_mib: 1 << 20, gpu_type: (gpus > 0).then_some(types[usize::from(t % 3)]), nvlink_groups: (0..gpus).map(|g| g / 4).collect(), max_pods: 64 };
        c.add_node(spec).unwrap();
    }
    c
}

fn pod_strategy() -> impl Strategy<Value = Pod> {
    let share = (1u32..1000).prop_map(|m| (1u32, m));
    let whole = prop_oneof![Just((0u32, 0u32)), Just((1, MILLI)), Just((2, MILLI)), Just((4, MILLI)), Just((8, MILLI))];
    (prop_oneof![share, whole], 0u64..40_000, 0u64..4, 0u64..8).prop_map(|((n, m), cpu, tmask, mem)| {
        let types = match tmask {
            0 => TypeSet::ANY,
            1 => TypeSet::only(GpuTypeId(0)),
            2 => TypeSet::only(GpuTypeId(1)).with(GpuTypeId(2)),
            _ => TypeSet::only(GpuTypeId(2)),
        };
        Pod::new(cpu, mem * 1024, n, m, types, Qos::Be).unwrap()
    })
}

fn check_all(c: &Cluster) {
    let mut used = 0u64;
    for n in c.nodes() {
        for g in n.gpus() {
            assert!(g.free_milli <= MILLI && g.free_mem_milli <= MILLI, "GPU over-released");
            used += u64::from(MILLI - g.free_milli);
        }
        assert!(n.cpu_free() <= n.cpu_capacity());
    }
    assert_eq!(used, c.gpu_allocated_milli(), "milli-GPU accounting drifted");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_policy_keeps_the_invariants(
        nodes in prop::collection::vec((8_000u64..128_000, 0u8..9, 0u8..3), 1..12),
        pods in prop::collection::vec(pod_strategy(), 1..60),
        seed in 0u64..1000,
    ) {
        let target = TargetWorkload::from_pods(&pods, 0.95);
        for kind in PolicyKind::ALL {
            let mut c = cluster(&nodes);
            let mut policy = kind.build(&target, seed);
            let mut placed: Vec<Placement> = Vec::new();
            for pod in &pods {
                let fits_somewhere = c.nodes().iter().any(|n| n.fits(pod));
                match policy.place(&c, pod) {
                    Some(p) => {
                        let node = c.node(p.node).unwrap();
                        prop_assert!(pod.gpu_types().allows(node.gpu_type()) || pod.gpu_count() == 0, "{}: disallowed GPU type", kind.name());
                        prop_assert_eq!(p.gpus.len(), pod.gpu_count() as usize);
                        prop_assert!(p.gpus.iter().all(|g| g.milli == pod.gpu_milli()));
                        prop_assert!(c.apply(&p).is_ok(), "{}: placement refused", kind.name());
                        placed.push(p);
                    }
                    None => prop_assert!(!fits_somewhere, "{} found no place although one exists", kind.name()),
                }
                check_all(&c);
            }
            for p in placed.iter().rev() {
                prop_assert!(c.release(p).is_ok());
            }
            check_all(&c);
            prop_assert_eq!(c.gpu_allocated_milli(), 0);
            prop_assert!(c.nodes().iter().all(|n| n.cpu_free() == n.cpu_capacity() && n.pods() == 0));
        }
    }

    #[test]
    fn apply_refuses_over_allocation(milli in 1u32..=1000, extra in 1u32..1000) {
        let mut c = cluster(&[(64_000, 1, 0)]);
        let a = Pod::new(0, 0, 1, milli, TypeSet::ANY, Qos::Be).unwrap();
        prop_assert!(c.apply(&Placement::new(0, &a, &[0])).is_ok());
        let b = Pod::new(0, 0, 1, (MILLI - milli + extra).min(MILLI), TypeSet::ANY, Qos::Be).unwrap();
        let over = MILLI - milli < b.gpu_milli();
        prop_assert_eq!(c.apply(&Placement::new(0, &b, &[0])).is_err(), over);
        check_all(&c);
    }
}

#[test]
fn placements_name_exact_gpus_and_refuse_bad_indices() {
    let mut c = cluster(&[(64_000, 2, 0)]);
    let p = Pod::new(1000, 0, 1, 500, TypeSet::ANY, Qos::Be).unwrap();
    assert!(c.apply(&Placement::new(0, &p, &[5])).is_err());
    assert!(c.apply(&Placement::new(0, &Pod::new(0, 0, 2, 1000, TypeSet::ANY, Qos::Be).unwrap(), &[1, 1])).is_err());
    assert!(c.release(&Placement::new(0, &p, &[0])).is_err(), "releasing what was never placed");
    check_all(&c);
}

#[test]
fn egpu_is_deterministic_and_keeps_multi_gpu_pods_in_one_nvlink_group() {
    let mut c = cluster(&[(128_000, 8, 0)]);
    let one = Pod::new(1000, 0, 1, MILLI, TypeSet::ANY, Qos::Be).unwrap();
    let four = Pod::new(1000, 0, 4, MILLI, TypeSet::ANY, Qos::Be).unwrap();
    let target = TargetWorkload::from_pods([&one, &four], 1.0);
    let mut pol = PolicyKind::Egpu.build(&target, 0);
    let p1 = pol.place(&c, &one).unwrap();
    assert_eq!(PolicyKind::Egpu.build(&target, 9).place(&c, &one), Some(p1.clone()));
    c.apply(&p1).unwrap();
    let p4 = pol.place(&c, &four).unwrap();
    let groups: Vec<u8> = p4.gpus.iter().map(|g| c.nodes()[0].gpus()[usize::from(g.index)].nvlink_group).collect();
    assert!(groups.iter().all(|&g| g == groups[0]), "4 GPUs split across NVLink groups: {groups:?}");
}
