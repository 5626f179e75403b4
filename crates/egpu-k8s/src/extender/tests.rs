//! Unit and property tests of the extender.

use super::*;
use crate::annotation::{GpuFree, VERSION};
use serde_json::json;

const R: &str = "egpu.io/gpu-memory";

fn node(name: &str, free: &[u32]) -> Value {
    node_of(name, 16, free)
}

/// [`node`] with GPUs of `units` units each.
fn node_of(name: &str, units: u32, free: &[u32]) -> Value {
    let g = NodeGpus {
        v: VERSION,
        unit_bytes: 1 << 30,
        gpus: free.iter().enumerate().map(|(i, &f)| GpuFree { index: i as u32, uuid: format!("GPU-{name}-{i}"), model: "m".into(), units, free: f, nvlink: None, numa: None, pcie: None }).collect(),
        pods: None,
        holds: None,
    };
    json!({"metadata": {"name": name, "annotations": {"egpu.io/gpus": g.to_json()}}, "status": {"capacity": {"egpu.io/gpu-memory": "32"}}})
}

fn pod(units: &[&str]) -> Value {
    let containers: Vec<Value> =
        units.iter().enumerate().map(|(i, u)| json!({"name": format!("c{i}"), "resources": {"limits": {R: u}, "requests": {R: u}}})).collect();
    json!({"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": containers}})
}

fn args(pod: Value, nodes: Vec<Value>) -> ExtenderArgs {
    serde_json::from_value(json!({"Pod": pod, "Nodes": {"items": nodes}})).unwrap()
}

#[test]
fn demand_reads_containers_and_refuses_nonsense() {
    assert_eq!(Demand::of_pod(&pod(&["4", "10"]), R).unwrap().units, [10, 4]);
    let e = Demand::of_pod(&pod(&["1.5"]), R).unwrap_err();
    assert!(e.to_string().contains("'1.5'") && e.to_string().contains("c0"), "{e}");
    assert_eq!(Demand::of_pod(&pod(&["2k"]), R).unwrap().units, [2000], "canonical form of 2000");
    let p = json!({"spec": {"containers": [{"name": "m", "resources": {"limits": {R: "4"}, "requests": {R: "2"}}}]}});
    assert!(matches!(Demand::of_pod(&p, R), Err(RequestError::Mismatch { .. })));
    let p = json!({"spec": {"initContainers": [{"name": "i", "resources": {"limits": {R: 3}}}], "containers": [{"name": "m"}]}});
    let e = Demand::of_pod(&p, R).unwrap_err();
    assert_eq!(e, RequestError::InitContainer { container: "i".into(), resource: R.into(), sidecar: false });
    assert!(e.to_string().starts_with("init container 'i' asks for") && e.to_string().contains("pass to the app containers"), "{e}");
    let p = json!({"spec": {"initContainers": [{"name": "log", "restartPolicy": "Always", "resources": {"limits": {R: 3}}}], "containers": [{"name": "m"}]}});
    let e = Demand::of_pod(&p, R).unwrap_err().to_string();
    assert!(e.starts_with("sidecar container (an init container with restartPolicy: Always) 'log' asks for") && !e.contains("pass to the app containers"), "{e}");
    let p = json!({"spec": {"initContainers": [{"name": "i"}], "containers": [{"name": "m", "resources": {"limits": {R: 3}}}]}});
    assert_eq!(Demand::of_pod(&p, R).unwrap().units, [3], "init containers that ask nothing are fine");
    // Bytes where units are meant: the number asked is said as it is, not
    // cut to what a u32 holds, and the message says what a unit is.
    for (q, units) in [("8Gi", "8589934592"), ("99999999999999999999999", "99999999999999999999999")] {
        let e = Demand::of_pod(&pod(&[q]), R).unwrap_err();
        assert!(matches!(e, RequestError::TooLarge { .. }) && e.to_string().contains(&format!("which is {units} units")) && e.to_string().contains("not bytes"), "{e}");
    }
    assert_eq!(Demand::of_pod(&pod(&["4294967295"]), R).unwrap().units, [u32::MAX], "the largest count is still one");
}

#[test]
fn filter_says_why_a_node_without_gpus_or_with_a_gpu_listed_twice_is_passed_over() {
    let ext = Extender::new(R);
    let r = ext.filter(args(pod(&["8"]), vec![node("empty", &[]), node("a", &[16])]));
    assert_eq!(r.nodes.unwrap().items.len(), 1);
    let why = &r.failed_and_unresolvable_nodes["empty"];
    assert!(why.contains("lists no GPU with memory units") && !why.contains("multiple of 0"), "{why}");
    // Units that look like bytes: the reason says what a unit is.
    let r = ext.filter(args(pod(&["1Gi"]), vec![node("a", &[16])]));
    assert!(r.failed_and_unresolvable_nodes["a"].contains("a unit is 1.0 GiB, not a byte"), "{r:?}");
    // One GPU listed twice: that node is passed over with the reason, and
    // the rest of the request is answered.
    let mut twice = node("twice", &[2, 10]);
    let text = twice["metadata"]["annotations"]["egpu.io/gpus"].as_str().unwrap().replace("GPU-twice-1", "GPU-twice-0");
    twice["metadata"]["annotations"]["egpu.io/gpus"] = text.into();
    let r = ext.filter(args(pod(&["8"]), vec![twice, node("a", &[16])]));
    let names: Vec<&str> = r.nodes.as_ref().unwrap().items.iter().map(node_name).collect();
    assert_eq!(names, ["a"]);
    assert!(r.failed_and_unresolvable_nodes["twice"].contains("two GPUs have UUID"), "{r:?}");
}

#[test]
fn filter_keeps_nodes_where_each_container_fits_one_gpu() {
    let ext = Extender::new(R);
    let mut unannotated = node("c", &[16]);
    unannotated["metadata"]["annotations"] = json!({});
    let r = ext.filter(args(pod(&["10"]), vec![node("a", &[6, 6]), node("b", &[12, 0]), unannotated]));
    let names: Vec<&str> = r.nodes.as_ref().unwrap().items.iter().map(node_name).collect();
    assert_eq!(names, ["b"]);
    assert!(r.failed_nodes["a"].contains("no GPU has 10 units") && r.failed_nodes["a"].contains("is 6"), "{:?}", r.failed_nodes);
    assert!(r.failed_and_unresolvable_nodes["c"].contains("--node-name"), "{:?}", r.failed_and_unresolvable_nodes);
    // Two containers share a GPU when it has room for both, or take one each.
    let r = ext.filter(args(pod(&["8", "8"]), vec![node("one", &[16]), node("split", &[8, 7]), node("two", &[8, 8])]));
    let names: Vec<&str> = r.nodes.as_ref().unwrap().items.iter().map(node_name).collect();
    assert_eq!(names, ["one", "two"]);
    assert!(r.failed_nodes["split"].contains("[8, 8]"), "{:?}", r.failed_nodes);
    // Larger than a GPU: whole free GPUs, a multiple of one.
    let r = ext.filter(args(pod(&["32"]), vec![node("two", &[16, 16]), node("one", &[16, 15]), node("odd", &[16, 16])]));
    assert_eq!(r.nodes.unwrap().items.len(), 2);
    assert!(r.failed_nodes["one"].contains("2 whole GPUs of 16") && r.failed_nodes["one"].contains("1 GPU(s) are entirely free"), "{:?}", r.failed_nodes);
    // What no eviction could fix is unresolvable, so the scheduler does
    // not preempt there: not a multiple of a GPU, more whole GPUs than
    // the node has, more than one GPU's units on a node of small GPUs.
    let r = ext.filter(args(pod(&["20"]), vec![node("two", &[16, 16])]));
    assert!(r.failed_and_unresolvable_nodes["two"].contains("ask for a multiple of 16"), "{:?}", r.failed_and_unresolvable_nodes);
    let r = ext.filter(args(pod(&["48"]), vec![node("two", &[16, 16]), node("three", &[16, 16, 0])]));
    assert!(r.failed_and_unresolvable_nodes["two"].contains("even with every GPU of the node free"), "{r:?}");
    assert!(r.failed_nodes["three"].contains("3 whole GPUs of 16"), "{r:?}");
    let r = ext.filter(args(pod(&["10", "10"]), vec![node("a", &[6, 6])]));
    assert!(r.failed_nodes.contains_key("a") && r.failed_and_unresolvable_nodes.is_empty(), "evicting makes room for both: {r:?}");
    // Scored as a pod of two whole GPUs: a node with exactly two free wins.
    let s = ext.prioritize(args(pod(&["32"]), vec![node("four", &[16, 16, 16, 16]), node("two", &[16, 16, 0, 0]), node("one", &[16, 0, 0, 0])])).unwrap();
    assert_eq!(s.iter().find(|h| h.host == "two").unwrap().score, MAX_SCORE, "{s:?}");
    assert_eq!(s.iter().find(|h| h.host == "one").unwrap().score, 0, "two whole GPUs do not fit one: {s:?}");
    // A pod that asks for none passes everywhere, untouched.
    let r = ext.filter(args(json!({"spec": {"containers": [{"name": "x"}]}}), vec![node("a", &[0])]));
    assert_eq!(r.nodes.unwrap().items.len(), 1);
    // Errors go back in Error.
    let r = ext.filter(serde_json::from_value(json!({"Pod": pod(&["1"])})).unwrap());
    assert_eq!(r.error, RequestError::NoCandidates.to_string());
}

#[test]
fn preempt_keeps_the_nodes_where_the_victims_make_room_on_one_gpu() {
    // GPUs of 16 with 3 and 1 free; pods a (5 on GPU 0, 5 on GPU 1) and
    // b (10 on GPU 1); 8 units of GPU 0 are held by pods not named.
    let mut g: NodeGpus = serde_json::from_str(node("n", &[3, 1])["metadata"]["annotations"][crate::annotation::ANNOTATION].as_str().unwrap()).unwrap();
    g.holds = Some([("a".to_string(), [(0, 5), (1, 5)].into()), ("b".to_string(), [(1, 10)].into())].into());
    let meta = json!({"name": "n", "annotations": {crate::annotation::ANNOTATION: g.to_json()}});
    let cache = Arc::new(NodeCache::new("egpu.io/enabled=true"));
    cache.replace(vec![serde_json::from_value(meta).unwrap()]);
    let ext = Extender::new(R).with_node_cache(cache);
    let victims = |uids: &[&str]| MetaVictims { pods: uids.iter().map(|u| MetaPod { uid: u.to_string() }).collect(), num_pdb_violations: 0 };
    let kept = |units: &str, uids: &[&str]| {
        let args = PreemptionArgs { pod: Some(pod(&[units])), node_name_to_victims: None, node_name_to_meta_victims: Some([("n".to_string(), victims(uids))].into()) };
        ext.preempt(args).unwrap().node_name_to_meta_victims.contains_key("n")
    };
    // a frees 5 on each GPU (8 and 6 free): not 12 on one; b frees 10
    // on GPU 1 (11); both free 8 and 16.
    assert!(!kept("12", &["a"]));
    assert!(!kept("12", &["b"]) && kept("11", &["b"]));
    assert!(kept("12", &["a", "b"]));
    assert!(!kept("12", &["unknown"]) && !kept("4", &["unknown"]), "a pod the annotation does not place frees nothing");
    // After a (8 and 6 free), 8 fits and 9 does not.
    assert!(kept("8", &["a"]) && !kept("9", &["a"]));
    // Whole pods (without nodeCacheCapable) are read by their UIDs.
    let full = json!({"Pod": pod(&["11"]), "NodeNameToVictims": {"n": {"Pods": [{"metadata": {"uid": "b"}}], "NumPDBViolations": 2}}});
    let r = ext.preempt(serde_json::from_value(full).unwrap()).unwrap();
    assert_eq!(r.node_name_to_meta_victims["n"], MetaVictims { num_pdb_violations: 2, ..victims(&["b"]) });
    // A pod that asks for no units keeps every node; so does an extender
    // without a node cache, which cannot see the nodes.
    let none = json!({"Pod": {"spec": {"containers": [{"name": "x"}]}}, "NodeNameToMetaVictims": {"zz": {"Pods": []}}});
    assert!(ext.preempt(serde_json::from_value(none).unwrap()).unwrap().node_name_to_meta_victims.contains_key("zz"));
    let blind = Extender::new(R);
    let args = PreemptionArgs { pod: Some(pod(&["12"])), node_name_to_victims: None, node_name_to_meta_victims: Some([("n".to_string(), victims(&["a"]))].into()) };
    assert!(blind.preempt(args).unwrap().node_name_to_meta_victims.contains_key("n"));
    // The wire names are Go's.
    let wire = serde_json::to_value(PreemptionResult { node_name_to_meta_victims: [("n".to_string(), victims(&["b"]))].into() }).unwrap();
    assert_eq!(wire, json!({"NodeNameToMetaVictims": {"n": {"Pods": [{"UID": "b"}], "NumPDBViolations": 0}}}));
    assert_eq!(ext.preempt(serde_json::from_value(json!({"NodeNameToMetaVictims": {}})).unwrap()), Err(RequestError::NoPod));
    // A Pod that is not an object is no Pod, for every verb.
    let not_a_pod = || serde_json::from_value::<ExtenderArgs>(json!({"Pod": 5, "Nodes": {"items": [node("a", &[16])]}})).unwrap();
    assert_eq!(ext.filter(not_a_pod()).error, RequestError::NoPod.to_string());
    assert_eq!(ext.prioritize(not_a_pod()), Err(RequestError::NoPod));
    assert_eq!(ext.preempt(serde_json::from_value(json!({"Pod": "x", "NodeNameToMetaVictims": {}})).unwrap()), Err(RequestError::NoPod));
}

#[test]
fn never_fits_only_where_no_eviction_could_help() {
    let gpus = |sizes: &[u32], free: &[u32]| NodeGpus {
        v: VERSION,
        unit_bytes: 1 << 30,
        gpus: sizes.iter().zip(free).enumerate().map(|(i, (&units, &free))| GpuFree { index: i as u32, uuid: format!("GPU-{i}"), model: "m".into(), units, free, nvlink: None, numa: None, pcie: None }).collect(),
        pods: None,
        holds: None,
    };
    let demand = |units: &[u32]| Demand { units: { let mut u = units.to_vec(); u.sort_unstable_by(|a, b| b.cmp(a)); u }, in_order: units.to_vec() };
    let two = gpus(&[16, 16], &[0, 0]);
    assert!(demand(&[20]).never_fits(&two), "larger than a GPU, not a multiple");
    assert!(demand(&[48]).never_fits(&two), "three whole GPUs of two");
    assert!(demand(&[10, 10, 10, 10]).never_fits(&two), "more than the node has");
    assert!(!demand(&[32]).never_fits(&two) && !demand(&[16, 16]).never_fits(&two));
    // Mixed sizes: the empty node's placement misfits, yet a fuller node fits.
    let sizes = [16, 16, 8, 8, 8, 8];
    let d = demand(&[32, 16]);
    assert!(d.misfit(&gpus(&sizes, &sizes)).is_some() && d.misfit(&gpus(&sizes, &[15, 16, 8, 8, 8, 8])).is_none());
    assert!(!d.never_fits(&gpus(&sizes, &[0; 6])), "evictions could make room");
}

proptest::proptest! {
    /// Preemption's judgement is the filter's on the node as it would
    /// be without the victims (their units freed on their GPUs, worked
    /// out here independently of `release`), and more victims never
    /// lose a node.
    #[test]
    fn preempt_judges_as_filter_would_without_the_victims(
        pods in proptest::collection::vec((0usize..3, 1u32..=8), 0..8),
        ask in proptest::collection::vec(proptest::prop_oneof![4 => 1u32..=16, 1 => proptest::strategy::Just(32u32)], 1..4),
        victims in proptest::collection::vec(proptest::bool::ANY, 8),
        more in proptest::collection::vec(proptest::bool::ANY, 8),
    ) {
        // Three GPUs of 16; each pod (GPU, units) is kept only if it fits.
        let mut free = [16u32; 3];
        let mut holds: BTreeMap<String, BTreeMap<u32, u32>> = BTreeMap::new();
        for (j, &(gpu, units)) in pods.iter().enumerate() {
            if free[gpu] >= units {
                free[gpu] -= units;
                holds.insert(format!("p{j}"), [(gpu as u32, units)].into());
            }
        }
        let annotated = |free: &[u32], holds: &BTreeMap<String, BTreeMap<u32, u32>>| {
            let mut g: NodeGpus = serde_json::from_str(node("n", free)["metadata"]["annotations"][crate::annotation::ANNOTATION].as_str().unwrap()).unwrap();
            g.holds = Some(holds.clone());
            g
        };
        let cache = Arc::new(NodeCache::new("egpu.io/enabled=true"));
        let meta = json!({"name": "n", "annotations": {crate::annotation::ANNOTATION: annotated(&free, &holds).to_json()}});
        cache.replace(vec![serde_json::from_value(meta).unwrap()]);
        let ext = Extender::new(R).with_node_cache(cache);
        let units: Vec<String> = ask.iter().map(u32::to_string).collect();
        let units: Vec<&str> = units.iter().map(String::as_str).collect();
        let pick = |which: &[bool]| -> Vec<String> { (0..pods.len()).filter(|&j| which[j]).map(|j| format!("p{j}")).collect() };
        let kept = |uids: &[String]| {
            let v = MetaVictims { pods: uids.iter().map(|u| MetaPod { uid: u.clone() }).collect(), num_pdb_violations: 0 };
            let args = PreemptionArgs { pod: Some(pod(&units)), node_name_to_victims: None, node_name_to_meta_victims: Some([("n".to_string(), v)].into()) };
            ext.preempt(args).unwrap().node_name_to_meta_victims.contains_key("n")
        };
        let chosen = pick(&victims);
        // The node without the victims, worked out from the pod list.
        let mut after = free;
        for u in &chosen {
            if let Some(h) = holds.get(u) {
                for (&gpu, &n) in h {
                    after[gpu as usize] += n;
                }
            }
        }
        let filtered = Extender::new(R).filter(args(pod(&units), vec![node("n", &after)]));
        proptest::prop_assert_eq!(kept(&chosen), filtered.nodes.unwrap().items.len() == 1);
        let both: Vec<String> = pick(&victims.iter().zip(&more).map(|(a, b)| *a || *b).collect::<Vec<_>>());
        proptest::prop_assert!(!kept(&chosen) || kept(&both), "more victims lost the node");
    }
}

#[test]
fn node_names_with_the_cache_answer_as_node_objects_do() {
    // Passing and failing nodes interleaved, one without the annotation.
    let mut bare = node("c", &[16]);
    bare["metadata"]["annotations"] = json!({});
    let nodes = vec![node("a", &[6, 6]), node("b", &[12, 0]), bare, node("d", &[16, 16]), node("e", &[9, 3])];
    let names: Vec<String> = nodes.iter().map(|n| node_name(n).to_string()).collect();
    let cache = Arc::new(NodeCache::new("egpu.io/enabled=true"));
    let by_names = Extender::new(R).with_node_cache(cache.clone());
    let named = |units: &str| serde_json::from_value::<ExtenderArgs>(json!({"Pod": pod(&[units]), "NodeNames": names})).unwrap();
    // Not filled yet: the scheduler is told to retry.
    assert_eq!(by_names.filter(named("10")).error, RequestError::NotSynced.to_string());
    assert_eq!(by_names.prioritize(named("10")), Err(RequestError::NotSynced));
    cache.replace(nodes.iter().map(|n| serde_json::from_value(n["metadata"].clone()).unwrap()).collect());
    let by_objects = Extender::new(R);
    for units in ["4", "10", "13"] {
        let o = by_objects.filter(args(pod(&[units]), nodes.clone()));
        let n = by_names.filter(named(units));
        let passed: Vec<String> = o.nodes.unwrap().items.iter().map(|x| node_name(x).to_string()).collect();
        assert_eq!(n.node_names, Some(passed), "{units} units");
        assert!(n.nodes.is_none());
        assert_eq!((n.failed_nodes, n.failed_and_unresolvable_nodes), (o.failed_nodes, o.failed_and_unresolvable_nodes), "{units} units");
        assert_eq!(by_names.prioritize(named(units)).unwrap(), by_objects.prioritize(args(pod(&[units]), nodes.clone())).unwrap(), "{units} units");
    }
    // A node the cache does not hold is unresolvable, with the reason.
    let r = by_names.filter(serde_json::from_value(json!({"Pod": pod(&["1"]), "NodeNames": ["zz"]})).unwrap());
    assert!(r.failed_and_unresolvable_nodes["zz"].contains("not selected by 'egpu.io/enabled=true'"), "{r:?}");
    // Names without a cache, or neither field: the reason.
    let e = by_objects.filter(serde_json::from_value(json!({"Pod": pod(&["1"]), "NodeNames": ["a"]})).unwrap()).error;
    assert!(e.contains("nodeCacheCapable: false"), "{e}");
    let e = by_names.filter(serde_json::from_value(json!({"Pod": pod(&["1"])})).unwrap()).error;
    assert_eq!(e, RequestError::NoCandidates.to_string());
}

#[test]
fn a_pod_that_fills_a_hole_exactly_fits_it_whatever_the_gpu_size() {
    // 79-unit GPUs (an 80 GB card's 79 GiB): 10 units are 126.6 milli.
    // A 10-unit pod fits the 10-unit hole; its node is scored, not 0.
    let ext = Extender::new(R);
    let s = ext.prioritize(args(pod(&["10"]), vec![node_of("hole", 79, &[10]), node_of("short", 79, &[9])])).unwrap();
    assert_eq!(s, [HostPriority { host: "hole".into(), score: MAX_SCORE }, HostPriority { host: "short".into(), score: 0 }]);
}

proptest::proptest! {
    /// On any GPU of up to 1,000 units (a milli-GPU each at most; a finer
    /// unit makes several units one milli in the model) the score agrees
    /// with the filter: a node whose one GPU has `free` units scores above
    /// 0 exactly when a pod of `want` units passes the filter (it fits:
    /// `want <= free`).
    #[test]
    fn scored_exactly_where_it_fits(units in 1u32..=1000, free_frac in 0.0f64..=1.0, want_frac in 0.0f64..=1.0) {
        let free = (f64::from(units) * free_frac).round() as u32;
        let want = ((f64::from(units) * want_frac).round() as u32).max(1);
        let ext = Extender::new(R);
        // An idle node beside it, so a fitting node that is not the pick
        // still scores (9 less its rank).
        let nodes = vec![node_of("a", units, &[free]), node_of("idle", units, &[units])];
        let s = ext.prioritize(args(pod(&[&want.to_string()]), nodes.clone())).unwrap();
        let f = ext.filter(args(pod(&[&want.to_string()]), nodes));
        let passed = f.nodes.map(|n| n.items.iter().any(|x| x["metadata"]["name"] == "a")).unwrap_or(false);
        proptest::prop_assert_eq!(passed, want <= free);
        proptest::prop_assert_eq!(s[0].score > 0, want <= free, "{:?}", s);
    }
}

#[test]
fn prioritize_prefers_the_hole_the_pod_completes() {
    let ext = Extender::new(R);
    // 4 units: "exact" has a GPU with exactly 4 free, "empty" is idle,
    // "ragged" leaves a 3-unit hole.
    let nodes = vec![node("empty", &[16, 16]), node("exact", &[4, 16]), node("ragged", &[7, 16])];
    let s = ext.prioritize(args(pod(&["4"]), nodes)).unwrap();
    let score = |n: &str| s.iter().find(|h| h.host == n).unwrap().score;
    assert_eq!(score("exact"), MAX_SCORE, "{s:?}");
    assert!(score("exact") > score("ragged") && score("ragged") > score("empty"), "idle nodes last; {s:?}");
    // The top score is the node the policy itself places the pod on.
    let mut cluster = Cluster::new();
    let ty = cluster.gpu_type_or_insert("16u", 16).unwrap();
    let p = sharing_pod(250, ty).unwrap();
    for (name, free) in [("empty", [1000, 1000]), ("exact", [250, 1000]), ("ragged", [437, 1000])] {
        let id = cluster.add_node(NodeSpec { name: name.into(), cpu_milli: 1 << 40, memory_mib: 1 << 40, gpu_type: Some(ty), nvlink_groups: vec![0, 0], max_pods: 100 }).unwrap();
        for (g, f) in free.iter().enumerate() {
            if *f < 1000 {
                cluster.apply(&Placement::new(id, &sharing_pod(1000 - f, ty).unwrap(), &[g as u8])).unwrap();
            }
        }
    }
    use egpu_place::Policy;
    let placed = EgpuPolicy::new(TargetWorkload::from_pods([&p], 1.0)).place(&cluster, &p).unwrap();
    assert_eq!(cluster.nodes()[placed.node].name(), "exact");
    assert!(s.iter().all(|h| (0..=MAX_SCORE).contains(&h.score)));
    // A node it does not fit scores 0; a pod asking nothing scores all 0.
    let s = ext.prioritize(args(pod(&["12"]), vec![node("full", &[4, 4]), node("free", &[16, 16])])).unwrap();
    assert_eq!(s, [HostPriority { host: "full".into(), score: 0 }, HostPriority { host: "free".into(), score: MAX_SCORE }]);
}

#[test]
fn quantities_that_are_whole_numbers() {
    for (q, v) in [("10", 10), ("+3", 3), ("2k", 2000), ("2Ki", 2048), ("1Gi", 1 << 30), ("1.5k", 1500), ("1e3", 1000), ("1500m", 0), ("3000m", 3), ("1.", 1), (".5k", 500), ("0", 0), (" 7 ", 7), ("1E2", 100)] {
        if q == "1500m" {
            assert_eq!(whole_quantity(q), None, "1.5 is not whole");
        } else {
            assert_eq!(whole_quantity(q), Some(v), "{q}");
        }
    }
    for q in ["", "x", ".", "-1", "1.5", "2 Gi", "2gi", "1e", "1e-2", "99999999999999999999999", "1Ei0", "1e99"] {
        assert_eq!(whole_quantity(q), None, "{q}");
    }
}

#[test]
fn the_target_window_counts_each_pod_once() {
    let ext = Extender::new(R);
    let mut p = pod(&["4"]);
    p["metadata"]["uid"] = "u1".into();
    for _ in 0..5 {
        ext.filter(args(p.clone(), vec![node("a", &[16])]));
    }
    assert_eq!(ext.recent.lock().unwrap().units.len(), 1);
    p["metadata"]["uid"] = "u2".into();
    ext.filter(args(p, vec![node("a", &[16])]));
    assert_eq!(ext.recent.lock().unwrap().units.len(), 2);
}

#[test]
fn wire_names_are_gos_and_lower_case_is_accepted() {
    let a: ExtenderArgs = serde_json::from_value(json!({"pod": {}, "nodes": {"items": []}, "nodenames": ["x"]})).unwrap();
    assert!(a.pod.is_some() && a.nodes.is_some() && a.node_names.is_some());
    let v = serde_json::to_value(FilterResult { error: "e".into(), ..Default::default() }).unwrap();
    assert_eq!(v, json!({"FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": "e"}));
    assert_eq!(serde_json::to_value(HostPriority { host: "h".into(), score: 3 }).unwrap(), json!({"Host": "h", "Score": 3}));
    // Go writes nil slices and maps as null: read as empty, not refused.
    let a: ExtenderArgs = serde_json::from_value(json!({"Pod": {}, "Nodes": {"items": null}, "NodeNames": null})).unwrap();
    assert!(a.nodes.is_some_and(|n| n.items.is_empty()) && a.node_names.is_none());
    let p: PreemptionArgs = serde_json::from_value(json!({"Pod": {}, "NodeNameToVictims": {"n": {"Pods": null}}, "NodeNameToMetaVictims": {"n": {"Pods": null, "NumPDBViolations": 1}}})).unwrap();
    assert!(p.node_name_to_victims.unwrap()["n"].pods.is_empty());
    assert_eq!(p.node_name_to_meta_victims.unwrap()["n"], MetaVictims { pods: vec![], num_pdb_violations: 1 });
    let r: FilterResult = serde_json::from_value(json!({"FailedNodes": null, "Error": ""})).unwrap();
    assert!(r.failed_nodes.is_empty() && r.failed_and_unresolvable_nodes.is_empty());
}

#[test]
fn a_bound_pods_hint_is_the_policys_gpu_not_the_best_fit() {
    let meta = |name: &str, free: &[u32]| -> kube::api::ObjectMeta { serde_json::from_value(node(name, free)["metadata"].clone()).unwrap() };
    let cache = Arc::new(NodeCache::new("egpu.io/enabled=true"));
    cache.replace(vec![meta("n", &[6, 10]), meta("mixed", &[6, 10]), meta("empty", &[16, 16, 16])]);
    // A node whose GPUs differ in size gets no hint.
    let mut mixed: NodeGpus = serde_json::from_str(node("mixed", &[6, 10])["metadata"]["annotations"][crate::annotation::ANNOTATION].as_str().unwrap()).unwrap();
    mixed.gpus[1].units = 24;
    cache.update(serde_json::from_value(json!({"name": "mixed", "annotations": {crate::annotation::ANNOTATION: mixed.to_json()}})).unwrap(), true);
    let ext = Extender::new(R).with_node_cache(cache);
    // The target: pods of 4 units, as the filter of this one records it.
    let four = pod(&["4"]);
    assert!(ext.filter(args(four.clone(), vec![node("n", &[6, 10])])).error.is_empty());
    // Best fit takes the 6 and leaves 2 that no 4 can use; the policy
    // takes the 10 and leaves two holes of 6 that each take a 4.
    let mut best = NodeGpus::parse(node("n", &[6, 10])["metadata"]["annotations"][crate::annotation::ANNOTATION].as_str()).unwrap();
    assert!(best.take(4));
    assert_eq!(best.gpus.iter().map(|g| g.free).collect::<Vec<_>>(), [2, 10]);
    assert_eq!(ext.hint("n", "default/p", &[4]), [Some("GPU-n-1".to_string())]);
    // Containers go one after another: the second 4 finds [6, 6] and
    // takes the lower GPU.
    assert_eq!(ext.hint("n", "default/p", &[4, 4]), [Some("GPU-n-1".to_string()), Some("GPU-n-0".to_string())]);
    // A container of whole GPUs is not hinted: the plugin picks those by
    // its own rule (entirely free GPUs, lowest UUIDs), which the model then
    // takes off. On [16, 16, 16] the 4 goes to GPU 0 ([12, 16, 16]), the 32
    // takes GPUs 1 and 2, and the last 4 can only go to GPU 0.
    let e = ext.hint("empty", "default/p", &[4, 32, 4]);
    assert_eq!(e, [Some("GPU-empty-0".to_string()), None, Some("GPU-empty-0".to_string())]);
    // Whole GPUs first: the 4 after them finds only GPU 2 free.
    assert_eq!(ext.hint("empty", "default/p", &[32, 4]), [None, Some("GPU-empty-2".to_string())]);
    // What the node cache does not have, or cannot fit, is not hinted.
    assert_eq!(ext.hint("other", "default/p", &[4]), [None]);
    assert_eq!(ext.hint("mixed", "default/p", &[4]), [None]);
    assert_eq!(ext.hint("n", "default/p", &[12, 4]), [None, Some("GPU-n-1".to_string())]);
    // What is assumed on the node counts: with 8 of GPU 1 assumed ([6, 2]
    // free), the 4 goes to GPU 0.
    ext.assumed.lock().unwrap().assume_on("n", "default/q", vec![8], vec![Some("GPU-n-1".into())], Instant::now(), DEFAULT_ASSUME_TTL);
    assert_eq!(ext.hint("n", "default/p", &[4]), [Some("GPU-n-0".to_string())]);
    // ... but not the pod's own (a bind tried again): q is placed on the
    // node as it is without its earlier assumption.
    assert_eq!(ext.hint("n", "default/q", &[4]), [Some("GPU-n-1".to_string())]);
}
