//! Unit and property tests of the DRA plugin's pure parts.

use super::state::load_prepared;
use super::*;
use crate::tokens::Gpu;
use egpu_node::proto as node;
use k8s_openapi::api::resource::v1 as res;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

fn gpus() -> Vec<Gpu> {
    (0..2).map(|i| Gpu { index: i, uuid: format!("GPU-{i}"), model: "NVIDIA H200".into(), memory_bytes: 16 << 30, nvlink: None, ..Default::default() }).collect()
}

fn claim(v: serde_json::Value) -> res::ResourceClaim {
    serde_json::from_value(v).unwrap()
}

fn result(request: &str, device: &str, consumed: Option<(&str, &str)>) -> serde_json::Value {
    let mut r = serde_json::json!({"request": request, "driver": DEFAULT_DRIVER, "pool": "node-a", "device": device});
    if let Some((m, c)) = consumed {
        r["consumedCapacity"] = serde_json::json!({MEMORY: m, COMPUTE: c});
        r["shareID"] = serde_json::json!("7c3f0c9e-5b0e-4b9e-9b43-0b8f2f0e7a11");
    }
    r
}

fn allocated(results: Vec<serde_json::Value>, config: serde_json::Value) -> res::ResourceClaim {
    claim(serde_json::json!({
        "metadata": {"name": "c", "namespace": "ns", "uid": "u-1"},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": results, "config": config}}}
    }))
}

#[test]
fn the_resource_slice_publishes_each_gpu_with_consumable_memory_and_compute() {
    let spec = resource_slice_spec(DEFAULT_DRIVER, "node-a", &gpus(), &BTreeMap::new(), 3);
    assert_eq!((spec.driver.as_str(), spec.node_name.as_deref(), spec.pool.name.as_str(), spec.pool.generation), (DEFAULT_DRIVER, Some("node-a"), "node-a", 3));
    let d = spec.devices.as_ref().unwrap();
    assert_eq!(d.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["gpu-0", "gpu-1"]);
    assert_eq!(d[1].allow_multiple_allocations, Some(true));
    let cap = d[1].capacity.as_ref().unwrap();
    assert_eq!(cap[MEMORY].value.0, (16u64 << 30).to_string());
    assert_eq!(cap[MEMORY].request_policy.as_ref().unwrap().default.as_ref().unwrap().0, (16u64 << 30).to_string(), "no amount: the whole GPU's memory");
    assert_eq!(cap[COMPUTE].value.0, "100");
    assert_eq!(cap[COMPUTE].request_policy.as_ref().unwrap().default.as_ref().unwrap().0, "0", "no amount: no guarantee");
    let attrs = d[1].attributes.as_ref().unwrap();
    assert_eq!(attrs["index"].int, Some(1));
    assert_eq!(attrs["uuid"].string.as_deref(), Some("GPU-1"));
    assert_eq!(attrs.len(), 3, "nothing is known of where the GPU is: no more attributes");
    // Where egpud knows where a GPU is, the slice says so.
    let mut placed = gpus();
    placed[0] = Gpu { nvlink: Some(0), pcie: Some(0), numa: Some(1), pci_bus_id: Some("0000:3b:00.0".into()), pcie_root: Some("pci0000:3a".into()), ..placed[0].clone() };
    let spec = resource_slice_spec(DEFAULT_DRIVER, "node-a", &placed, &BTreeMap::new(), 3);
    let attrs = spec.devices.as_ref().unwrap()[0].attributes.clone().unwrap();
    assert_eq!((attrs["nvlinkGroup"].int, attrs["pcieSwitchGroup"].int, attrs["resource.kubernetes.io/numaNode"].int), (Some(0), Some(0), Some(1)));
    assert_eq!(attrs["resource.kubernetes.io/pciBusID"].string.as_deref(), Some("0000:3b:00.0"));
    assert_eq!(attrs["resource.kubernetes.io/pcieRoot"].string.as_deref(), Some("pci0000:3a"));
    // The API's JSON names.
    let j = serde_json::to_value(&spec).unwrap();
    assert_eq!(j["devices"][0]["allowMultipleAllocations"], true);
    assert_eq!(j["devices"][0]["capacity"]["memory"]["requestPolicy"]["validRange"]["min"], "1048576");
    assert_eq!(j["pool"]["resourceSliceCount"], 1);
    assert_eq!(resource_slice_name("node-a", DEFAULT_DRIVER), "node-a-gpu.egpu.io");
}

#[test]
fn what_slices_made_elsewhere_hold_is_not_published() {
    let slice = |name: &str, device: u32, memory: u64, share: u32| node::Slice {
        name: name.into(),
        devices: vec![node::SliceDevice { device, memory_limit_bytes: memory, compute_share_bps: share, ..Default::default() }],
        ..Default::default()
    };
    // An `egpu create` slice on GPU 0 (6 GiB, 12.5%), one of ours on GPU 1, and a second outside one filling GPU 1.
    let slices = [slice("train", 0, 6 << 30, 1250), slice("dra-u-1", 1, 8 << 30, 5000), slice("big", 1, (16 << 30) - 4096, 0)];
    let reserved = reserved_elsewhere(&slices);
    assert_eq!(reserved[&0], Reserved { memory_bytes: 6 << 30, compute_bps: 1250 });
    let spec = resource_slice_spec(DEFAULT_DRIVER, "node-a", &gpus(), &reserved, 1);
    let d = spec.devices.unwrap();
    assert_eq!(d.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["gpu-0"], "GPU 1 has 4 KiB left for claims: not published");
    let cap = d[0].capacity.as_ref().unwrap();
    assert_eq!(cap[MEMORY].value.0, (10u64 << 30).to_string());
    assert_eq!(cap[MEMORY].request_policy.as_ref().unwrap().valid_range.as_ref().unwrap().max.as_ref().unwrap().0, (10u64 << 30).to_string());
    assert_eq!(cap[COMPUTE].value.0, "87", "12.5% taken: 87 whole percents left");
    // Burst memory lent, to one of ours or to an outside slice, is not
    // published either (egpud would refuse a guarantee there); our own
    // guarantees are the scheduler's to count.
    let mut lent = slices.to_vec();
    lent[0].devices[0].memory_granted_bytes = 1 << 30;
    lent[1].devices[0].memory_granted_bytes = 2 << 30;
    let reserved = reserved_elsewhere(&lent);
    assert_eq!(reserved[&0], Reserved { memory_bytes: 7 << 30, compute_bps: 1250 });
    assert_eq!(reserved[&1], Reserved { memory_bytes: (18 << 30) - 4096, compute_bps: 0 });
}

#[test]
fn a_claim_becomes_one_slice_with_its_consumed_capacity() {
    let cfg = serde_json::json!([{"source": "FromClaim", "opaque": {"driver": DEFAULT_DRIVER, "parameters": {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "computeLimit": "50%", "memoryBurst": "12GiB", "priority": "high"}}}]);
    let p = plan(&allocated(vec![result("gpu", "gpu-1", Some(("10Gi", "30")))], cfg), DEFAULT_DRIVER, "node-a", &gpus()).unwrap();
    assert_eq!(p.devices, [node::DeviceShareSpec { device: 1, memory_bytes: 10 << 30, compute_share_bps: 3000, compute_limit_bps: 5000, memory_burst_bytes: 12 << 30 }]);
    assert_eq!(p.priority, node::Priority::High);
    assert_eq!(p.results, [("gpu".to_string(), "gpu-1".to_string(), 1)]);
    // Without consumable capacity (the feature off): whole GPUs, no guarantee, defaults.
    let p = plan(&allocated(vec![result("a", "gpu-0", None), result("a", "gpu-1", None)], serde_json::json!([])), DEFAULT_DRIVER, "node-a", &gpus()).unwrap();
    assert_eq!(p.devices.iter().map(|d| (d.device, d.memory_bytes, d.compute_share_bps, d.compute_limit_bps, d.memory_burst_bytes)).collect::<Vec<_>>(), [(0, 16 << 30, 0, 10_000, 0), (1, 16 << 30, 0, 10_000, 0)]);
    assert_eq!(p.priority, node::Priority::Normal);
    // Two shares of one GPU (two requests): summed on one device.
    let p = plan(&allocated(vec![result("a", "gpu-0", Some(("2Gi", "10"))), result("b", "gpu-0", Some(("3Gi", "15")))], serde_json::json!([])), DEFAULT_DRIVER, "node-a", &gpus()).unwrap();
    assert_eq!(p.devices.iter().map(|d| (d.device, d.memory_bytes, d.compute_share_bps)).collect::<Vec<_>>(), [(0, 5 << 30, 2500)]);
    // A burst cap below the guarantee is raised to it.
    let cfg = serde_json::json!([{"source": "FromClass", "opaque": {"driver": DEFAULT_DRIVER, "parameters": {"memoryBurst": "1GiB"}}}]);
    let p = plan(&allocated(vec![result("a", "gpu-0", Some(("2Gi", "0")))], cfg), DEFAULT_DRIVER, "node-a", &gpus()).unwrap();
    assert_eq!(p.devices[0].memory_burst_bytes, 2 << 30);
}

#[test]
fn the_claims_configuration_overrides_the_class_and_other_drivers_are_left_alone() {
    let cfg = serde_json::json!([
        {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DEFAULT_DRIVER, "parameters": {"computeLimit": "40%"}}},
        {"source": "FromClass", "opaque": {"driver": DEFAULT_DRIVER, "parameters": {"computeLimit": "90%", "priority": "best-effort"}}},
        {"source": "FromClaim", "opaque": {"driver": "other.example.com", "parameters": {"anything": 1}}},
        {"source": "FromClaim", "requests": ["other-request"], "opaque": {"driver": DEFAULT_DRIVER, "parameters": {"computeLimit": "10%"}}}
    ]);
    let mut results = vec![result("gpu", "gpu-0", Some(("1Gi", "5")))];
    results.push(serde_json::json!({"request": "nic", "driver": "other.example.com", "pool": "p", "device": "eth0"}));
    let p = plan(&allocated(results, cfg), DEFAULT_DRIVER, "node-a", &gpus()).unwrap();
    assert_eq!((p.devices[0].compute_limit_bps, p.priority), (4000, node::Priority::BestEffort));
    assert_eq!(p.results.len(), 1, "the other driver's device is not ours");
}

#[test]
fn what_cannot_become_a_slice_says_why() {
    let none = serde_json::json!([]);
    let err = |c: res::ResourceClaim| plan(&c, DEFAULT_DRIVER, "node-a", &gpus()).unwrap_err();
    let unallocated = claim(serde_json::json!({"metadata": {"name": "c"}, "spec": {"devices": {}}}));
    assert!(err(unallocated).contains("not allocated"));
    let mut wrong_pool = result("a", "gpu-0", None);
    wrong_pool["pool"] = "node-b".into();
    assert!(err(allocated(vec![wrong_pool], none.clone())).contains("pool 'node-b'"));
    assert!(err(allocated(vec![result("a", "gpu-7", None)], none.clone())).contains("GPU 7"));
    assert!(err(allocated(vec![result("a", "nic-0", None)], none.clone())).contains("not one this driver publishes"));
    assert!(err(allocated(vec![result("a", "gpu-00", None)], none.clone())).contains("not one this driver publishes"));
    assert!(err(allocated(vec![result("a", "gpu-0", Some(("lots", "0")))], none.clone())).contains("consumed memory of gpu-0"));
    assert!(err(allocated(vec![result("a", "gpu-0", Some(("0", "0")))], none.clone())).contains("no memory"));
    assert!(err(allocated(vec![result("a", "gpu-0", Some(("1Gi", "60"))), result("b", "gpu-0", Some(("1Gi", "60")))], none.clone())).contains("more than the whole GPU"));
    let capped = serde_json::json!([{"source": "FromClaim", "opaque": {"driver": DEFAULT_DRIVER, "parameters": {"computeLimit": "20%"}}}]);
    assert!(err(allocated(vec![result("a", "gpu-1", Some(("1Gi", "30")))], capped)).contains("computeLimit 20% is below the 30% guaranteed on GPU 1"));
    let mut admin = result("a", "gpu-0", None);
    admin["adminAccess"] = true.into();
    assert!(err(allocated(vec![admin], none.clone())).contains("admin access"));
    let other = serde_json::json!({"request": "nic", "driver": "other.example.com", "pool": "p", "device": "eth0"});
    assert!(err(allocated(vec![other], none)).contains("none of its allocated devices"));
    let bad = |params: serde_json::Value| {
        let cfg = serde_json::json!([{"source": "FromClaim", "opaque": {"driver": DEFAULT_DRIVER, "parameters": params}}]);
        err(allocated(vec![result("a", "gpu-0", None)], cfg))
    };
    assert!(bad(serde_json::json!({"computeLimt": "50%"})).contains("unknown field `computeLimt`"));
    assert!(bad(serde_json::json!({"computeLimit": "150%"})).starts_with("computeLimit:"));
    assert!(bad(serde_json::json!({"computeLimit": "0%"})).contains("never run"));
    assert!(bad(serde_json::json!({"memoryBurst": "lots"})).starts_with("memoryBurst:"));
    assert!(bad(serde_json::json!({"priority": "urgent"})).contains("'urgent'"));
    assert!(bad(serde_json::json!({"apiVersion": "gpu.egpu.io/v2"})).contains("apiVersion 'gpu.egpu.io/v2'"));
    assert!(bad(serde_json::json!({"kind": "Gpu"})).contains("kind 'Gpu'"));
    assert!(bad(serde_json::json!("a string")).contains("does not parse"));
    // Two requests with different configurations: one slice cannot have both.
    let cfg = serde_json::json!([{"source": "FromClaim", "requests": ["b"], "opaque": {"driver": DEFAULT_DRIVER, "parameters": {"computeLimit": "20%"}}}]);
    assert!(err(allocated(vec![result("a", "gpu-0", None), result("b", "gpu-1", None)], cfg)).contains("configurations differ"));
}

#[test]
fn subrequests_are_named_by_their_request_and_a_request_is_not_given_one_gpu_twice() {
    let mut r = result("main/small", "gpu-1", Some(("2Gi", "5")));
    r["shareID"] = "s1".into();
    let p = plan(&allocated(vec![r], serde_json::json!([])), DEFAULT_DRIVER, "node-a", &gpus()).unwrap();
    assert_eq!(p.results, [("main".to_string(), "gpu-1".to_string(), 1)]);
    // `count: 2` without a constraint: the allocator may put both shares on one GPU.
    // (The scheduler gives each share an ID of its own.)
    let shares: Vec<serde_json::Value> = ["s-a", "s-b"]
        .into_iter()
        .map(|id| {
            let mut r = result("gpu", "gpu-0", Some(("4Gi", "0")));
            r["shareID"] = id.into();
            r
        })
        .collect();
    let twice = allocated(shares, serde_json::json!([]));
    let e = plan(&twice, DEFAULT_DRIVER, "node-a", &gpus()).unwrap_err();
    assert!(e.contains("gpu-0 twice") && e.contains("distinctAttribute: gpu.egpu.io/uuid"), "{e}");
    // More memory than the GPU has for claims.
    let mut small = gpus();
    small[0].memory_bytes = 6 << 30;
    let e = plan(&allocated(vec![result("gpu", "gpu-0", Some(("8Gi", "0")))], serde_json::json!([])), DEFAULT_DRIVER, "node-a", &small).unwrap_err();
    assert!(e.contains("which has 6442450944 B for claims"), "{e}");
    // memoryBurst: a Kubernetes quantity (G is 10^9), or eGPU's GiB.
    for (burst, bytes) in [("24Gi", 24u64 << 30), ("24G", 24_000_000_000), ("24GiB", 24 << 30)] {
        let cfg = serde_json::json!([{"source": "FromClaim", "opaque": {"driver": DEFAULT_DRIVER, "parameters": {"memoryBurst": burst}}}]);
        let p = plan(&allocated(vec![result("gpu", "gpu-0", Some(("1Gi", "0")))], cfg), DEFAULT_DRIVER, "node-a", &gpus()).unwrap();
        assert_eq!(p.devices[0].memory_burst_bytes, bytes, "{burst}");
    }
}

#[test]
fn each_cdi_device_reaches_a_container_once() {
    let cfg = DraConfig {
        driver: DEFAULT_DRIVER.into(),
        node: "node-a".into(),
        egpud_socket: "/x".into(),
        kubelet_dir: "/k".into(),
        cdi_dir: "/c".into(),
        gpu_cdi_kind: Some("nvidia.com/gpu".into()),
        poll: Duration::from_secs(1),
        pod_poll: Duration::from_secs(5),
    };
    let r = |req: &str, dev: &str, gpu: u32| (req.to_string(), dev.to_string(), gpu);
    // Requests a and b share GPU 0; b also has GPU 1.
    let d = kubelet_devices(&cfg, "dra-u", &[r("a", "gpu-0", 0), r("b", "gpu-0", 0), r("b", "gpu-1", 1)]);
    let got: Vec<(Vec<&str>, &str, Vec<&str>)> = d.iter().map(|d| (d.request_names.iter().map(String::as_str).collect(), d.device_name.as_str(), d.cdi_device_ids.iter().map(String::as_str).collect())).collect();
    assert_eq!(got, [(vec!["a", "b"], "gpu-0", vec!["egpu.io/slice=dra-u", "nvidia.com/gpu=0"]), (vec!["b"], "gpu-1", vec!["nvidia.com/gpu=1"])]);
    // What the kubelet gives a container: the entries naming its request (or all, for the whole claim).
    let given = |req: Option<&str>| -> Vec<String> { d.iter().filter(|d| req.is_none_or(|q| d.request_names.iter().any(|n| n == q))).flat_map(|d| d.cdi_device_ids.clone()).collect() };
    for req in [None, Some("a"), Some("b")] {
        let ids = given(req);
        let unique: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len(), "{req:?}: {ids:?}");
        assert!(ids.contains(&"egpu.io/slice=dra-u".to_string()), "{req:?}");
    }
    assert_eq!(given(Some("a")), ["egpu.io/slice=dra-u", "nvidia.com/gpu=0"]);
}

#[test]
fn a_pods_annotations_resize_its_claims_slice() {
    let p = Prepared { namespace: "ns".into(), claim: "c".into(), pod: Some("p".into()), pod_uid: Some("pu".into()), limit_bps: 5000, burst_bytes: 0 };
    let dev = |device: u32, memory: u64, limit: u32, burst: u64| node::SliceDevice { device, memory_limit_bytes: memory, compute_limit_bps: limit, memory_burst_bytes: burst, ..Default::default() };
    let slice = node::Slice { name: "dra-u".into(), devices: vec![dev(0, 4 << 30, 5000, 0), dev(1, 8 << 30, 5000, 0)], ..Default::default() };
    let ann = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>();
    assert_eq!(resizes(&p, &ann(&[]), &slice), Ok(vec![]), "no annotation: the claim's values, already there");
    let r = resizes(&p, &ann(&[("egpu.io/gpu-compute-limit", "80%"), ("egpu.io/gpu-memory-burst", "6GiB")]), &slice).unwrap();
    assert_eq!(r, [(0, 8000, 6 << 30), (1, 8000, 8 << 30)], "a burst cap under a GPU's guarantee is raised to it");
    // Already so: nothing to do; the annotation removed: back to the claim's.
    let done = node::Slice { devices: vec![dev(0, 4 << 30, 8000, 6 << 30), dev(1, 8 << 30, 8000, 8 << 30)], ..slice.clone() };
    assert_eq!(resizes(&p, &ann(&[("egpu.io/gpu-compute-limit", "80%"), ("egpu.io/gpu-memory-burst", "6GiB")]), &done), Ok(vec![]));
    assert_eq!(resizes(&p, &ann(&[]), &done), Ok(vec![(0, 5000, 0), (1, 5000, 0)]));
    assert!(resizes(&p, &ann(&[("egpu.io/gpu-compute", "40%")]), &slice).unwrap_err().contains("capacity.requests.compute"));
    assert!(resizes(&p, &ann(&[("egpu.io/gpu-compute-limit", "lots")]), &slice).unwrap_err().starts_with("egpu.io/gpu-compute-limit:"));
    assert!(resizes(&p, &ann(&[("egpu.io/gpu-compute-limit", "0%")]), &slice).unwrap_err().contains("never run"));
    assert!(resizes(&p, &ann(&[("egpu.io/gpu-memory-burst", "512m")]), &slice).unwrap_err().contains("fraction of a byte"));
    assert_eq!(resizes(&p, &ann(&[("egpu.io/gpu-memory-burst", "10G")]), &slice).unwrap()[0].2, 10_000_000_000, "Kubernetes' G");
    let guaranteed = node::Slice { devices: vec![node::SliceDevice { compute_share_bps: 3000, ..dev(0, 4 << 30, 5000, 0) }, dev(1, 8 << 30, 5000, 0)], ..slice.clone() };
    let e = resizes(&p, &ann(&[("egpu.io/gpu-compute-limit", "20%")]), &guaranteed).unwrap_err();
    assert!(e.contains("20% is below the 30% guaranteed on GPU 0"), "{e}");
    assert_eq!(burst_bytes("0"), Ok(0));
    assert!(burst_bytes("1Ki").unwrap_err().contains("under 1 MiB"));
    assert_eq!(burst_bytes("1.5GiB"), Ok(3 << 29));
}

#[test]
fn prepared_claims_survive_a_restart_and_a_bad_file_is_set_aside() {
    let dir = std::env::temp_dir().join(format!("egpu-dra-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("claims.json");
    assert!(load_prepared(&path).is_empty(), "no file: no claims");
    let m = BTreeMap::from([("u".to_string(), Prepared { namespace: "ns".into(), claim: "c".into(), pod: None, pod_uid: None, limit_bps: 10_000, burst_bytes: 1 })]);
    std::fs::write(&path, serde_json::to_vec(&m).unwrap()).unwrap();
    assert_eq!(load_prepared(&path), m);
    std::fs::write(&path, b"{\"u\": {\"namespace\": 3").unwrap();
    assert!(load_prepared(&path).is_empty());
    assert!(!path.exists() && dir.join("claims.json.bad").exists(), "set aside, not lost");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_digest_follows_the_spec() {
    let a = resource_slice_spec(DEFAULT_DRIVER, "node-a", &gpus(), &BTreeMap::new(), 0);
    assert_eq!(digest(&a), digest(&a.clone()));
    assert_eq!(digest(&a).len(), 16);
    let reserved = BTreeMap::from([(0, Reserved { memory_bytes: 1 << 30, compute_bps: 0 })]);
    assert_ne!(digest(&a), digest(&resource_slice_spec(DEFAULT_DRIVER, "node-a", &gpus(), &reserved, 0)));
}

#[test]
fn config_and_names() {
    let cfg = DraConfig {
        driver: DEFAULT_DRIVER.into(),
        node: "node-a".into(),
        egpud_socket: "/x".into(),
        kubelet_dir: "/var/lib/kubelet".into(),
        cdi_dir: "/var/run/cdi".into(),
        gpu_cdi_kind: None,
        poll: Duration::from_secs(1),
        pod_poll: Duration::from_secs(5),
    };
    assert_eq!(cfg.check(), Ok(()));
    assert_eq!(cfg.registration_socket(), Path::new("/var/lib/kubelet/plugins_registry/gpu.egpu.io-reg.sock"));
    assert_eq!(cfg.plugin_socket(), Path::new("/var/lib/kubelet/plugins/gpu.egpu.io/dra.sock"));
    assert!(DraConfig { driver: "egpu".into(), ..cfg.clone() }.check().unwrap_err().contains("--driver"));
    assert!(DraConfig { driver: "GPU.egpu.io".into(), ..cfg.clone() }.check().unwrap_err().contains("--driver"));
    assert!(DraConfig { node: "Node_A".into(), ..cfg.clone() }.check().unwrap_err().contains("--node-name"));
    assert!(DraConfig { gpu_cdi_kind: Some("nvidia.com/gpu=0".into()), ..cfg.clone() }.check().unwrap_err().contains("not a CDI kind"));
    assert!(DraConfig { poll: Duration::ZERO, ..cfg.clone() }.check().unwrap_err().contains("--poll"));
    assert!(DraConfig { pod_poll: Duration::ZERO, ..cfg }.check().unwrap_err().contains("--pod-poll"));
    assert_eq!(slice_name("u-1"), "dra-u-1");
    assert_eq!((device_index("gpu-12"), device_index("gpu-"), device_index("gpu-1a")), (Some(12), None, None));
    // The longest claim UID (36 characters) makes a valid slice name.
    assert!(egpu_core::slice::validate_name(&slice_name("0b8f2f0e-7a11-4b9e-9b43-7c3f0c9e5b0e")).is_ok());
}

proptest! {
    /// Whatever the allocation says, planning answers (a plan or a
    /// reason) and never guarantees more than a GPU.
    #[test]
    fn planning_never_panics_nor_overcommits(
        results in proptest::collection::vec((0u32..4, proptest::option::of((0u64..40, 0u64..120)), 0usize..3), 0..6),
        limit in proptest::option::of(0u32..200),
    ) {
        let rs: Vec<serde_json::Value> = results
            .iter()
            .map(|(gpu, consumed, req)| {
                let c = consumed.map(|(m, c)| (format!("{m}Gi"), c.to_string()));
                result(["a", "b", "c"][*req], &format!("gpu-{gpu}"), c.as_ref().map(|(m, c)| (m.as_str(), c.as_str())))
            })
            .collect();
        let cfg = match limit {
            Some(l) => serde_json::json!([{"source": "FromClaim", "opaque": {"driver": DEFAULT_DRIVER, "parameters": {"computeLimit": format!("{l}%")}}}]),
            None => serde_json::json!([]),
        };
        if let Ok(p) = plan(&allocated(rs, cfg), DEFAULT_DRIVER, "node-a", &gpus()) {
            prop_assert!(!p.devices.is_empty());
            for d in &p.devices {
                prop_assert!(d.device < 2 && d.compute_share_bps <= 10_000 && d.memory_bytes > 0 && d.memory_bytes <= 16 << 30);
                prop_assert!(d.compute_limit_bps > 0 && d.compute_limit_bps <= 10_000 && d.compute_limit_bps >= d.compute_share_bps);
            }
        }
    }
}
