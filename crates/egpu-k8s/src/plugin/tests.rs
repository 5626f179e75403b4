//! Unit tests of the device plugin's pure parts.

use super::*;

fn slice(name: &str, device: u32, gib: u64) -> node::Slice {
    node::Slice {
        name: name.into(),
        devices: vec![node::SliceDevice { device, memory_limit_bytes: gib << 30, ..Default::default() }],
        ..Default::default()
    }
}

#[test]
fn the_annotation_says_which_gpus_each_known_pod_holds() {
    let gpu = |index: u32, uuid: &str| tokens::Gpu { index, uuid: uuid.into(), model: "m".into(), memory_bytes: 4 << 30, nvlink: None, ..Default::default() };
    let inv = Inventory { unit_bytes: 1 << 30, gpus: vec![gpu(0, "GPU-a"), gpu(1, "GPU-b")] };
    let devices = advertise(&inv, &[], None, false);
    let holder = |pod: &str, ids: &[&str]| Holder { namespace: "ns".into(), pod: pod.into(), ids: ids.iter().map(|s| s.to_string()).collect() };
    // Pod p: two containers, on both GPUs; pod q is not in the followed list.
    let holders = [holder("p", &["GPU-a_0", "GPU-a_1"]), holder("p", &["GPU-b_0"]), holder("q", &["GPU-b_1", "GPU-b_2"])];
    let known: PodAnnotations = [(("ns".to_string(), "p".to_string()), PodInfo { uid: "uid-p".into(), ..Default::default() })].into();
    let g = node_gpus(&inv, &devices, &holders, &[], Some(&known));
    assert_eq!(g.gpus.iter().map(|x| x.free).collect::<Vec<_>>(), [2, 1]);
    // Units only the kubelet's checkpoint names (its list not synced) are not free either.
    let also = [vec!["GPU-a_2".to_string(), "GPU-b_0".into()]];
    assert_eq!(node_gpus(&inv, &devices, &holders, &also, None).gpus.iter().map(|x| x.free).collect::<Vec<_>>(), [1, 1]);
    assert_eq!(g.pods, Some([("ns/p".to_string(), 3), ("ns/q".to_string(), 2)].into()));
    assert_eq!(g.holds, Some([("uid-p".to_string(), [(0, 2), (1, 1)].into())].into()), "q's UID is unknown: left out");
    assert_eq!(node_gpus(&inv, &devices, &holders, &[], None).holds, Some(Default::default()));
}

#[test]
fn every_token_carries_its_gpus_numa_node_for_the_topology_manager() {
    let gpu = |index: u32, numa: Option<u32>| tokens::Gpu { index, uuid: format!("GPU-{index}"), memory_bytes: 2 << 30, numa, ..Default::default() };
    let inv = Inventory { unit_bytes: 1 << 30, gpus: vec![gpu(0, Some(1)), gpu(1, Some(0))] };
    assert!(advertise(&inv, &[], None, false).iter().all(|d| d.topology.is_none()), "off unless asked for");
    let d = advertise(&inv, &[], None, true);
    let nodes: Vec<(&str, Option<Vec<i64>>)> = d.iter().map(|d| (d.id.as_str(), d.topology.as_ref().map(|t| t.nodes.iter().map(|n| n.id).collect()))).collect();
    assert_eq!(nodes, [("GPU-0_0", Some(vec![1])), ("GPU-0_1", Some(vec![1])), ("GPU-1_0", Some(vec![0])), ("GPU-1_1", Some(vec![0]))]);
    // One GPU's node unknown: none is given one, since the kubelet would
    // never count the units of a GPU without.
    let some = Inventory { gpus: vec![gpu(0, Some(1)), gpu(1, None)], ..inv.clone() };
    assert!(advertise(&some, &[], None, true).iter().all(|d| d.topology.is_none()));
    let g = node_gpus(&some, &d, &[], &[], None);
    assert_eq!(g.gpus.iter().map(|x| x.numa).collect::<Vec<_>>(), [Some(1), None], "the annotation says what is known, for the extender's view of whole GPUs");
}

#[test]
fn foreign_slices_make_free_tokens_unhealthy_from_the_top() {
    let inv = Inventory {
        unit_bytes: 1 << 30,
        gpus: vec![
            tokens::Gpu { index: 0, uuid: "GPU-a".into(), model: "m".into(), memory_bytes: 4 << 30, nvlink: None, ..Default::default() },
            tokens::Gpu { index: 1, uuid: "GPU-b".into(), model: "m".into(), memory_bytes: 4 << 30, nvlink: None, ..Default::default() },
        ],
    };
    let mut half = slice("train", 1, 1);
    half.devices[0].memory_limit_bytes += 1; // 1 GiB + 1 B: two tokens
    let slices = [half, slice(&tokens::slice_name(&["GPU-a_0".into()]), 0, 1)];
    // GPU-b_3 is held by a container: the reserve skips it.
    let held = vec![vec!["GPU-b_3".to_string()]];
    let d = advertise(&inv, &slices, Some(&held), false);
    let unhealthy: Vec<&str> = d.iter().filter(|d| d.health == UNHEALTHY).map(|d| d.id.as_str()).collect();
    // GPU-a: the plugin slice no container holds still has its 1 GiB.
    assert_eq!(unhealthy, ["GPU-a_3", "GPU-b_1", "GPU-b_2"]);
    assert_eq!(d.len(), 8);
    // Held again: its units count for it, nothing more is reserved.
    let held2 = vec![held[0].clone(), vec!["GPU-a_0".to_string()]];
    let d = advertise(&inv, &slices, Some(&held2), false);
    assert_eq!(d.iter().filter(|d| d.health == UNHEALTHY).count(), 2);
    // Borrowed burst memory is reserved too.
    let mut lent = slices.clone();
    lent[0].devices[0].memory_granted_bytes = 1 << 30;
    let d = advertise(&inv, &lent, Some(&held2), false);
    assert_eq!(d.iter().filter(|d| d.health == UNHEALTHY).count(), 3);
    // Without the held set only outside slices count, from the top.
    let d = advertise(&inv, &slices, None, false);
    let unhealthy: Vec<&str> = d.iter().filter(|d| d.health == UNHEALTHY).map(|d| d.id.as_str()).collect();
    assert_eq!(unhealthy, ["GPU-b_2", "GPU-b_3"]);
}

#[test]
fn pod_annotations_ask_for_share_cap_and_burst() {
    let ann = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>();
    assert_eq!(wanted(&ann(&[]), 1250), Ok((1250, 10_000, 0)), "defaults");
    let w = wanted(&ann(&[(COMPUTE_ANNOTATION, "30%"), (COMPUTE_LIMIT_ANNOTATION, "50"), (MEMORY_BURST_ANNOTATION, "12GiB")]), 1250);
    assert_eq!(w, Ok((3000, 5000, 12 << 30)));
    let e = wanted(&ann(&[(COMPUTE_ANNOTATION, "lots")]), 1250).unwrap_err();
    assert!(e.starts_with("egpu.io/gpu-compute:") && e.contains("'lots'"), "{e}");
    let e = wanted(&ann(&[(MEMORY_BURST_ANNOTATION, "12 apples")]), 1250).unwrap_err();
    assert!(e.starts_with("egpu.io/gpu-memory-burst:"), "{e}");
}

#[test]
fn endpoint_and_config_checks() {
    let cfg = PluginConfig {
        egpud_socket: "/x".into(),
        kubelet_dir: "/var/lib/kubelet".into(),
        resource_name: DEFAULT_RESOURCE.into(),
        unit_bytes: 1 << 30,
        cdi_dir: "/var/run/cdi".into(),
        poll: Duration::from_secs(1),
        sweep_grace: Duration::from_secs(30),
        gpu_cdi_kind: None,
        pod_poll: Duration::from_secs(5),
        own_pod: None,
        numa_topology: false,
    };
    assert_eq!(cfg.endpoint(), "egpu-gpu-memory.sock");
    // Synced: the list names the plugin's own pod; not known, always.
    let pods = [("kube-system", "kube-proxy-x"), ("egpu-system", "egpu-node-7")];
    assert!(cfg.synced(pods.iter().copied()) && cfg.synced(std::iter::empty()));
    let own = PluginConfig { own_pod: Some(("egpu-system".into(), "egpu-node-7".into())), ..cfg.clone() };
    assert!(own.synced(pods.iter().copied()));
    assert!(!own.synced(pods[..1].iter().copied()), "a static pod alone is not a synced list");
    assert!(!own.synced([("other", "egpu-node-7")].into_iter()), "the namespace counts too");
    let gpu = tokens::Gpu { index: 3, uuid: "GPU-x".into(), model: "m".into(), memory_bytes: 1 << 30, nvlink: None, ..Default::default() };
    let names = |cfg: &PluginConfig| cdi_devices(cfg, "k8s-1", std::iter::once(&gpu)).into_iter().map(|d| d.name).collect::<Vec<_>>();
    assert_eq!(names(&cfg), ["egpu.io/slice=k8s-1"]);
    let nvidia = PluginConfig { gpu_cdi_kind: Some("nvidia.com/gpu".into()), ..cfg.clone() };
    assert_eq!(names(&nvidia), ["egpu.io/slice=k8s-1", "nvidia.com/gpu=3"]);
    // A multi-GPU slice names each of its GPUs.
    let gpu5 = tokens::Gpu { index: 5, ..gpu.clone() };
    let both: Vec<String> = cdi_devices(&nvidia, "k8s-2", [&gpu, &gpu5].into_iter()).into_iter().map(|d| d.name).collect();
    assert_eq!(both, ["egpu.io/slice=k8s-2", "nvidia.com/gpu=3", "nvidia.com/gpu=5"]);
    // The default share: the memory's fraction, or all of it for every
    // unit of the GPU (an H100 80 GB: 81,559 MiB, 79 units of 1 GiB).
    let h100 = tokens::Gpu { index: 0, uuid: "GPU-h".into(), model: "m".into(), memory_bytes: 81_559 << 20, nvlink: None, ..Default::default() };
    let inv = Inventory { unit_bytes: 1 << 30, gpus: vec![h100.clone()] };
    assert_eq!(default_share(&inv, &h100, 79 << 30), 10_000);
    assert_eq!(default_share(&inv, &h100, 10 << 30), 1255, "10 GiB of 79.6");
    let e = Shared::new(PluginConfig { gpu_cdi_kind: Some("nvidia.com/gpu=0".into()), ..cfg.clone() }, None).unwrap_err();
    assert!(e.to_string().contains("not a CDI kind"), "{e}");
    assert!(Shared::new(cfg.clone(), None).is_ok());
    let e = Shared::new(PluginConfig { unit_bytes: 4096, ..cfg.clone() }, None).unwrap_err();
    assert!(e.to_string().contains("below 1 MiB"), "{e}");
    let e = Shared::new(PluginConfig { resource_name: "gpu-memory".into(), ..cfg }, None).unwrap_err();
    assert!(e.to_string().contains("needs a domain"), "{e}");
}

#[test]
fn a_reused_slice_is_reset_to_the_defaults_where_they_differ() {
    let have = |share: u32, limit: u32, burst: u64| node::SliceDevice { device: 0, memory_limit_bytes: 4 << 30, compute_share_bps: share, compute_limit_bps: limit, memory_burst_bytes: burst, ..Default::default() };
    let want = [node::DeviceShareSpec { device: 0, memory_bytes: 4 << 30, compute_share_bps: 2500, compute_limit_bps: 10_000, memory_burst_bytes: 0 }];
    assert!(stale_limits(&[have(2500, 10_000, 0)], &want).is_empty(), "as created: nothing to reset");
    for stale in [have(8000, 10_000, 0), have(2500, 5000, 0), have(2500, 10_000, 24 << 30)] {
        assert_eq!(stale_limits(&[stale], &want), [&want[0]]);
    }
}


#[test]
fn followed_hint_entries_outlive_a_watch_that_has_not_delivered_their_pod() {
    let t0 = std::time::Instant::now();
    let mut followed: HashMap<crate::hint::EntryKey, std::time::Instant> = [(("uid-new".to_string(), 0), t0), (("uid-gone".to_string(), 0), t0), (("uid-listed".to_string(), 1), t0)].into();
    let live: HashSet<String> = ["uid-listed".to_string()].into();
    // A minute on: the pod the watch has not delivered (followed through a
    // list read at admission) keeps its entry, so its second container of
    // the size is not sent to the first one's GPU.
    forget_followed(&mut followed, &live, t0 + Duration::from_secs(60));
    assert_eq!(followed.len(), 3);
    // Once no hint of theirs can be live, pods gone from the list are forgotten.
    forget_followed(&mut followed, &live, t0 + 2 * crate::hint::HINT_TTL);
    assert_eq!(followed.keys().cloned().collect::<Vec<_>>(), [("uid-listed".to_string(), 1)]);
}

#[test]
fn a_device_list_past_the_kubelets_message_limit_is_refused_with_a_unit_that_fits() {
    // 8 GPUs of 141 GiB with real-length UUIDs.
    let gpu = |index: u32| tokens::Gpu { index, uuid: format!("GPU-{index:08x}-1111-2222-3333-444455556666"), memory_bytes: 141 << 30, ..Default::default() };
    let at = |unit_bytes: u64| Inventory { unit_bytes, gpus: (0..8).map(gpu).collect() };
    let devices = advertise(&at(8 << 20), &[], None, false);
    assert_eq!(devices.len(), 8 * 141 * 128);
    // The size checked is the size the kubelet receives.
    let sent = prost::Message::encoded_len(&dp::ListAndWatchResponse { devices: devices.clone() });
    assert!(sent > devices::KUBELET_MAX_MESSAGE, "{sent} B: the case must be over the limit");
    let e = devices::check_list_size(&devices, 8 << 20).unwrap_err();
    assert!(e.contains(&format!("{} units of 8MiB", devices.len())) && e.contains(&format!("list of {sent} B")), "{e}");
    let fits: u64 = e.split("--memory-unit ").nth(1).and_then(|s| s.split(' ').next()).and_then(|s| s.parse::<egpu_core::quantity::Bytes>().ok()).expect(&e).0;
    // Scaled from this list's bytes per unit, rounded up to a power of two
    // (16.08 MiB -> 32 MiB; the fewer units' shorter IDs are not counted on).
    assert_eq!(fits, 32 << 20, "{e}");
    assert_eq!(devices::check_list_size(&advertise(&at(fits), &[], None, false), fits), Ok(()));
    assert_eq!(devices::check_list_size(&advertise(&at(1 << 30), &[], None, false), 1 << 30), Ok(()));
}
