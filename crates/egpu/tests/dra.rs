//! Kubernetes with Dynamic Resource Allocation: `egpu-dra-plugin` against a
//! kubelet stand-in (real gRPC over unix sockets: the plugin watcher's
//! `GetInfo` / `NotifyRegistrationStatus`, then `NodePrepareResources` and
//! `NodeUnprepareResources` in both versions, written here from the
//! published API), an API-server stand-in (real HTTP: the kube client's GET
//! of ResourceClaims and its create / replace of the node's ResourceSlice),
//! and a real egpud on simulated GPUs publishing CDI specs.

mod common;

use common::dra::{DRIVER, NODE, Rig, WAIT, claim, spec_path};
use common::{sample, target_dir, wait_until};
use egpu_k8s::dra::v1beta1;
use std::path::Path;
use std::process::Command;

/// (device, memory, share %, cap %, burst) of each device of a slice.
fn limits(s: &serde_json::Value) -> Vec<(u64, u64, f64, f64, u64)> {
    s["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (d["device"].as_u64().unwrap(), d["memory_limit_bytes"].as_u64().unwrap(), d["compute_share_percent"].as_f64().unwrap(), d["compute_limit_percent"].as_f64().unwrap(), d["memory_burst_bytes"].as_u64().unwrap())
        })
        .collect()
}

#[test]
fn claims_become_slices_through_the_kubelets_dra_calls() {
    let mut rig = Rig::start();
    let mut plugin = rig.plugin();
    let info = rig.register();
    assert_eq!((info.r#type.as_str(), info.name.as_str()), ("DRAPlugin", DRIVER));
    assert_eq!(info.supported_versions, ["v1.DRAPlugin", "v1beta1.DRAPlugin"]);
    assert_eq!(Path::new(&info.endpoint), rig.kdir.join(format!("plugins/{DRIVER}/dra.sock")));
    let ep = info.endpoint.clone();

    // The node's GPUs, published.
    assert!(wait_until(WAIT, || rig.published().is_some()), "no ResourceSlice; log:\n{}", rig.log());
    let s = rig.published().unwrap();
    assert_eq!(s["spec"]["driver"], DRIVER);
    assert_eq!(s["spec"]["nodeName"], NODE);
    assert_eq!(s["spec"]["pool"]["name"], NODE);
    let devices = s["spec"]["devices"].as_array().unwrap();
    assert_eq!(devices.iter().map(|d| d["name"].as_str().unwrap()).collect::<Vec<_>>(), ["gpu-0", "gpu-1"]);
    assert_eq!(devices[0]["capacity"]["memory"]["value"], "16Gi");
    assert_eq!(s["metadata"]["ownerReferences"][0]["uid"], "node-uid-1", "owned by its Node");
    assert_eq!(devices[0]["capacity"]["compute"]["value"], "100");
    assert_eq!(devices[0]["allowMultipleAllocations"], true);
    // A slice made on the node outside Kubernetes: its memory and guarantee
    // are not published for claims, and come back when it goes.
    rig.node.ok(&["create", "--name", "train", "--gpu-memory", "6GiB", "--gpu-compute", "25%", "--device", "1"]);
    let gpu1 = |field: &str| rig.published().and_then(|s| s["spec"]["devices"].as_array().and_then(|d| d.iter().find(|d| d["name"] == "gpu-1").map(|d| d["capacity"][field]["value"].clone())));
    assert!(wait_until(WAIT, || gpu1("memory") == Some("10Gi".into())), "{:?}", rig.published());
    assert_eq!(gpu1("compute"), Some("75".into()));
    assert_eq!(rig.published().unwrap()["spec"]["pool"]["generation"], 1, "a changed ResourceSlice is a new generation of the pool");
    rig.node.ok(&["rm", "train"]);
    assert!(wait_until(WAIT, || gpu1("memory") == Some("16Gi".into())));
    assert_eq!(*rig.api.writes.lock().unwrap(), 3, "created, then replaced twice");
    // A starting kubelet deletes its node's ResourceSlices, then registers the plugin again: it is written again.
    rig.api.slices.lock().unwrap().clear();
    rig.register();
    assert!(wait_until(WAIT, || rig.published().is_some()), "not published again; log:\n{}", rig.log());
    let writes = *rig.api.writes.lock().unwrap();
    assert_eq!(writes, 4);

    // A part of GPU 0: 10 GiB, 30% guaranteed, capped at 50%, bursting to 12 GiB, high priority.
    let params = serde_json::json!({"apiVersion": "gpu.egpu.io/v1", "kind": "SliceConfig", "computeLimit": "50%", "memoryBurst": "12GiB", "priority": "high"});
    rig.add(claim("a", "uid-a", &[("gpu", "gpu-0", Some(("10Gi", "30")))], Some(params)));
    let r = rig.prepare(&ep, &[("a", "uid-a")]);
    let a = &r["uid-a"];
    assert_eq!(a.error, "", "log:\n{}", rig.log());
    assert_eq!(a.devices.len(), 1);
    assert_eq!((a.devices[0].pool_name.as_str(), a.devices[0].device_name.as_str()), (NODE, "gpu-0"));
    assert_eq!(a.devices[0].request_names, ["gpu"]);
    assert_eq!(a.devices[0].cdi_device_ids, ["egpu.io/slice=dra-uid-a", "nvidia.com/gpu=0"]);
    let sa = rig.node.slice("dra-uid-a");
    assert_eq!(limits(&sa), [(0, 10 << 30, 30.0, 50.0, 12 << 30)], "{sa}");
    assert_eq!(sa["priority"], "high");
    assert!(spec_path(&rig.cdi, "dra-uid-a").exists());

    // The same claim again, through v1beta1 (an older kubelet): the same answer, no second slice.
    let again = rig.rt.block_on(async {
        let ch = egpu_k8s::unix_channel(Path::new(&ep), WAIT).await.unwrap();
        let claims = vec![v1beta1::Claim { namespace: "default".into(), uid: "uid-a".into(), name: "a".into() }];
        v1beta1::dra_plugin_client::DraPluginClient::new(ch).node_prepare_resources(v1beta1::NodePrepareResourcesRequest { claims }).await.unwrap().into_inner().claims
    });
    assert_eq!(again["uid-a"].error, "");
    assert_eq!(again["uid-a"].devices[0].cdi_device_ids, ["egpu.io/slice=dra-uid-a", "nvidia.com/gpu=0"]);
    assert_eq!(rig.slice_names(), ["dra-uid-a"]);

    // A whole GPU (no consumable capacity: the feature off), and in the same call
    // claims that cannot be prepared, each with its reason.
    rig.add(claim("b", "uid-b", &[("gpu", "gpu-1", None)], None));
    rig.add(claim("c", "uid-c", &[("gpu", "gpu-0", Some(("8Gi", "0")))], None));
    rig.add(claim("d", "uid-other", &[("gpu", "gpu-0", Some(("1Gi", "0")))], None));
    let mut unallocated = claim("e", "uid-e", &[], None);
    unallocated["status"] = serde_json::json!({});
    rig.add(unallocated);
    rig.add(claim("f", "uid-f", &[("gpu", "gpu-0", Some(("1Gi", "0")))], Some(serde_json::json!({"computeLimt": "50%"}))));
    let r = rig.prepare(&ep, &[("b", "uid-b"), ("c", "uid-c"), ("d", "uid-d"), ("e", "uid-e"), ("f", "uid-f"), ("missing", "uid-m")]);
    assert_eq!(r.len(), 6, "an entry for every claim");
    assert_eq!(r["uid-b"].error, "");
    assert_eq!(limits(&rig.node.slice("dra-uid-b")), [(1, 16 << 30, 0.0, 100.0, 0)]);
    let e = |uid: &str| r[uid].error.clone();
    assert!(e("uid-c").contains("egpud refused slice dra-uid-c"), "10 + 8 GiB on a 16 GiB GPU: {}", e("uid-c"));
    assert!(e("uid-d").contains("has UID uid-other, not uid-d"), "{}", e("uid-d"));
    assert!(e("uid-e").contains("not allocated"), "{}", e("uid-e"));
    assert!(e("uid-f").contains("unknown field `computeLimt`"), "{}", e("uid-f"));
    assert!(e("uid-m").contains("default/missing does not exist"), "{}", e("uid-m"));
    assert!(r["uid-c"].devices.is_empty());
    assert_eq!(rig.slice_names(), ["dra-uid-a", "dra-uid-b"], "nothing made for the refused claims");

    // Unprepare: the slice and its CDI spec go; again is fine.
    assert_eq!(rig.unprepare(&ep, "a", "uid-a"), "");
    assert_eq!(rig.slice_names(), ["dra-uid-b"]);
    assert!(wait_until(WAIT, || !spec_path(&rig.cdi, "dra-uid-a").exists()));
    assert_eq!(rig.unprepare(&ep, "a", "uid-a"), "", "already gone");
    // Through v1beta1 too.
    let gone = rig.rt.block_on(async {
        let ch = egpu_k8s::unix_channel(Path::new(&ep), WAIT).await.unwrap();
        let claims = vec![v1beta1::Claim { namespace: "default".into(), uid: "uid-b".into(), name: "b".into() }];
        v1beta1::dra_plugin_client::DraPluginClient::new(ch).node_unprepare_resources(v1beta1::NodeUnprepareResourcesRequest { claims }).await.unwrap().into_inner().claims
    });
    assert_eq!(gone["uid-b"].error, "");
    assert!(rig.slice_names().is_empty());

    // Two whole GPUs for one claim: one slice over both (NCCL, IPC and peer access within it).
    rig.add(claim("g", "uid-g", &[("gpus", "gpu-0", None), ("gpus", "gpu-1", None)], None));
    let r = rig.prepare(&ep, &[("g", "uid-g")]);
    assert_eq!(r["uid-g"].error, "");
    assert_eq!(r["uid-g"].devices.iter().map(|d| d.device_name.as_str()).collect::<Vec<_>>(), ["gpu-0", "gpu-1"]);
    let ids: Vec<Vec<String>> = r["uid-g"].devices.iter().map(|d| d.cdi_device_ids.clone()).collect();
    assert_eq!(ids, [vec!["egpu.io/slice=dra-uid-g", "nvidia.com/gpu=0"], vec!["nvidia.com/gpu=1"]], "the slice's CDI device once, each GPU's with it");
    assert_eq!(limits(&rig.node.slice("dra-uid-g")), [(0, 16 << 30, 0.0, 100.0, 0), (1, 16 << 30, 0.0, 100.0, 0)]);

    // The plugin's socket removed under it: served again.
    std::fs::remove_file(&ep).unwrap();
    assert!(wait_until(WAIT, || Path::new(&ep).exists()), "not served again; log:\n{}", rig.log());
    assert_eq!(rig.prepare(&ep, &[("g", "uid-g")])["uid-g"].error, "");

    // What the plugin counted: every claim of every call, the ResourceSlice's
    // writes (two creates: the kubelet deleted it once), and what it holds now.
    // (The plugin counts a write, and the first list of the pods, after the
    // API server answered it: wait for those.)
    let written = |m: &str| {
        let at = |series: &str| sample(m, series);
        (at(r#"egpu_dra_resourceslice_writes_total{outcome="created"}"#), at(r#"egpu_dra_resourceslice_writes_total{outcome="updated"}"#), at("egpu_dra_pods_synced"))
    };
    assert!(wait_until(WAIT, || written(&rig.metrics()) == (Some(2.0), Some(2.0), Some(1.0))), "{}", rig.metrics());
    let m = rig.metrics();
    let at = |series: &str| sample(&m, series);
    assert_eq!(at(r#"egpu_dra_claims_total{verb="prepare",outcome="ok"}"#), Some(5.0), "{m}");
    assert_eq!(at(r#"egpu_dra_claims_total{verb="prepare",outcome="error"}"#), Some(5.0), "{m}");
    assert_eq!(at(r#"egpu_dra_claims_total{verb="unprepare",outcome="ok"}"#), Some(3.0), "{m}");
    assert_eq!(at(r#"egpu_dra_claim_seconds_count{verb="prepare"}"#), Some(10.0), "{m}");
    assert_eq!(at("egpu_dra_prepared_claims"), Some(1.0), "{m}");
    assert_eq!(at("egpu_dra_egpud_up"), Some(1.0), "{m}");
    assert_eq!(at("egpu_dra_resizes_total"), Some(0.0), "{m}");

    // kill -9 and restart. The claim was made for pod-g (its owner): the
    // pod's annotations resize its slice live, also after the restart, with
    // no new prepare (a kubelet does not prepare a running pod's claim
    // again): the plugin kept the claim in claims.json.
    drop(plugin);
    assert!(rig.kdir.join(format!("plugins/{DRIVER}/claims.json")).exists());
    plugin = rig.plugin();
    let info = rig.register();
    rig.api.annotate("pod-g", serde_json::json!({"egpu.io/gpu-compute-limit": "60%", "egpu.io/gpu-memory-burst": "16Gi"}));
    let devices = || limits(&rig.node.slice("dra-uid-g"));
    assert!(wait_until(WAIT, || devices() == [(0, 16 << 30, 0.0, 60.0, 16 << 30), (1, 16 << 30, 0.0, 60.0, 16 << 30)]), "{:?}; log:\n{}", devices(), rig.log());
    // The guarantee is the claim's: asking for it on the pod changes nothing (the
    // pod's other annotations neither), with the reason logged.
    rig.api.annotate("pod-g", serde_json::json!({"egpu.io/gpu-compute": "40%", "egpu.io/gpu-compute-limit": "30%"}));
    assert!(wait_until(WAIT, || rig.log().contains("a DRA claim's guarantee is what the scheduler counted")));
    assert_eq!(devices()[0].3, 60.0);
    let m = rig.metrics();
    assert_eq!(sample(&m, "egpu_dra_resize_problems"), Some(1.0), "{m}");
    assert_eq!(sample(&m, "egpu_dra_resizes_total"), Some(2.0), "one resize of each GPU, by the restarted plugin: {m}");
    // The pod deleted: no pod, so no problem left to apply (and no change).
    rig.api.delete_pod("pod-g");
    assert!(wait_until(WAIT, || sample(&rig.metrics(), "egpu_dra_resize_problems") == Some(0.0)), "{}", rig.metrics());
    assert_eq!(devices()[0].3, 60.0);
    // The annotations removed: the claim's own values (cap 100%, no burst) again.
    rig.api.annotate("pod-g", serde_json::json!({}));
    assert!(wait_until(WAIT, || devices() == [(0, 16 << 30, 0.0, 100.0, 0), (1, 16 << 30, 0.0, 100.0, 0)]), "{:?}", devices());
    assert!(wait_until(WAIT, || sample(&rig.metrics(), "egpu_dra_resize_problems") == Some(0.0)), "applied again: no problem left");
    // A repeated prepare after the restart answers the same; the ResourceSlice
    // (stored by the API server in its own form) was not rewritten.
    let r = rig.prepare(&info.endpoint, &[("g", "uid-g")]);
    assert_eq!(r["uid-g"].error, "", "log:\n{}", rig.log());
    assert_eq!(rig.slice_names(), ["dra-uid-g"]);
    assert_eq!(*rig.api.writes.lock().unwrap(), writes, "the same GPUs: no new write of the ResourceSlice");

    // egpud down: a clear error, and the kubelet will call again.
    rig.add(claim("h", "uid-h", &[("gpu", "gpu-0", None)], None));
    rig.node.kill9();
    let r = rig.prepare(&info.endpoint, &[("h", "uid-h")]);
    assert!(r["uid-h"].error.contains("egpud is not reachable"), "{}", r["uid-h"].error);
    assert!(wait_until(WAIT, || sample(&rig.metrics(), "egpu_dra_egpud_up") == Some(0.0)), "{}", rig.metrics());

    // SIGTERM: a clean exit that removes both sockets.
    common::signal(plugin.0.id(), libc::SIGTERM);
    let mut status = None;
    assert!(wait_until(WAIT, || {
        status = plugin.0.try_wait().unwrap();
        status.is_some()
    }));
    assert!(status.unwrap().success(), "log:\n{}", rig.log());
    assert!(!Path::new(&info.endpoint).exists() && !rig.kdir.join(format!("plugins_registry/{DRIVER}-reg.sock")).exists());
}

#[test]
fn bad_flags_are_refused_before_anything_starts() {
    let path = target_dir().join("egpu-dra-plugin");
    let run = |args: &[&str]| Command::new(&path).env_remove("NODE_NAME").env("KUBECONFIG", "/nonexistent/egpu-test-kubeconfig").args(args).output().unwrap();
    let o = run(&["--node-name", "node-a", "--driver", "egpu"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--driver 'egpu' must be a DNS subdomain"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["--node-name", "node-a", "--poll", "0s"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--poll and --pod-poll must be greater than 0"));
    let o = run(&["--node-name", "node-a"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("needs the Kubernetes API"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&[]);
    assert_eq!(o.status.code(), Some(2), "--node-name is required");
    let o = run(&["--node-name", "node-a", "--metrics-listen", "9403"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("invalid value '9403' for '--metrics-listen"), "{}", String::from_utf8_lossy(&o.stderr));
}
