//! `deploy/` checked offline: every object parses as its Kubernetes type
//! (k8s-openapi) and writes back the same (so a misspelt field, which the
//! parser would skip, is caught), every flag the manifests pass exists in the
//! binary they run, every host path a flag names is mounted where the runtime
//! on the host finds it too, and the scheduler's configuration, the extender,
//! the plugin and the example pod agree on names, ports and the resource, and
//! the DRA driver, its DeviceClass and the example claim on the driver.

mod common;

use common::target_dir;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, PodSpec};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Every YAML document of `deploy/<file>`, as JSON values.
fn docs(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
    serde_yaml::Deserializer::from_str(&text).map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{file}: {e}"))).collect()
}

fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(v: &Value) -> T {
    let t: T = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{} {}: {e}", v["kind"], v["metadata"]["name"]));
    // The parser skips unknown fields; what it kept must be all there was.
    assert_eq!(&serde_json::to_value(&t).unwrap(), v, "{} {}: a field the type does not have (misspelt?)", v["kind"], v["metadata"]["name"]);
    t
}

/// The objects of every manifest, each parsed as its type.
fn all_objects() -> Vec<Value> {
    let mut out = Vec::new();
    for f in ["egpu-node.yaml", "egpu-scheduler.yaml", "example-pod.yaml", "egpu-dra.yaml", "example-claim.yaml"] {
        for d in docs(f) {
            match d["kind"].as_str().unwrap() {
                "Namespace" => drop(typed::<k8s_openapi::api::core::v1::Namespace>(&d)),
                "ServiceAccount" => drop(typed::<k8s_openapi::api::core::v1::ServiceAccount>(&d)),
                "ClusterRole" => drop(typed::<ClusterRole>(&d)),
                "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(&d)),
                "Role" => drop(typed::<Role>(&d)),
                "RoleBinding" => drop(typed::<RoleBinding>(&d)),
                "ConfigMap" => drop(typed::<ConfigMap>(&d)),
                "DaemonSet" => drop(typed::<DaemonSet>(&d)),
                "Deployment" => drop(typed::<Deployment>(&d)),
                "Pod" => drop(typed::<Pod>(&d)),
                "DeviceClass" => drop(typed::<k8s_openapi::api::resource::v1::DeviceClass>(&d)),
                "ResourceClaimTemplate" => drop(typed::<k8s_openapi::api::resource::v1::ResourceClaimTemplate>(&d)),
                k => panic!("{f}: unexpected kind {k}"),
            }
            out.push(d);
        }
    }
    out
}

fn find<'a>(objs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objs.iter().find(|o| o["kind"] == kind && o["metadata"]["name"] == name).unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn pod_spec(workload: &Value) -> PodSpec {
    serde_json::from_value(workload["spec"]["template"]["spec"].clone()).unwrap()
}

/// `--flag` or `--flag=value` arguments: (flag, value).
fn flags(c: &Container) -> Vec<(String, Option<String>)> {
    c.args
        .iter()
        .flatten()
        .filter(|a| a.starts_with("--"))
        .map(|a| match a.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (a.clone(), None),
        })
        .collect()
}

/// A container of eGPU's image (not, e.g., kube-scheduler's).
fn is_ours(c: &Container) -> bool {
    c.image.as_deref().is_some_and(|i| i.contains("/egpu:"))
}

fn flag(c: &Container, name: &str) -> String {
    flags(c).into_iter().find(|(f, _)| f == name).and_then(|(_, v)| v).unwrap_or_else(|| panic!("{} has no {name}=", c.name))
}

/// Each workload's name and pod spec.
fn pod_specs(objs: &[Value]) -> Vec<(String, PodSpec)> {
    objs.iter().filter_map(|o| Some((o["metadata"]["name"].as_str()?.to_string(), serde_json::from_value(o["spec"]["template"]["spec"].as_object()?.clone().into()).unwrap()))).collect()
}

#[test]
fn every_flag_exists_in_the_binary_it_is_passed_to() {
    let mut checked = 0;
    for (_, spec) in pod_specs(&all_objects()) {
        for c in spec.containers.iter().filter(|c| is_ours(c)) {
            let bin = &c.command.as_ref().unwrap()[0];
            let help = std::process::Command::new(target_dir().join(bin)).arg("--help").output().unwrap();
            assert!(help.status.success(), "{bin} --help");
            let help = String::from_utf8(help.stdout).unwrap();
            for (f, _) in flags(c) {
                assert!(help.contains(&format!("{f} ")) || help.contains(&format!("{f}\n")), "{bin} has no flag {f}:\n{help}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 12, "only {checked} flags checked");
}

#[test]
fn every_metrics_address_is_a_declared_port_of_its_container() {
    let mut checked = 0;
    for (name, spec) in pod_specs(&all_objects()) {
        for c in spec.containers.iter().filter(|c| is_ours(c)) {
            for f in ["--metrics-listen", "--metrics-addr"] {
                let Some(addr) = flags(c).into_iter().find(|(g, _)| g == f).and_then(|(_, v)| v) else { continue };
                let addr: std::net::SocketAddr = addr.parse().unwrap();
                assert!(addr.ip().is_unspecified(), "{}: {f} {addr} is not reachable from outside the pod", c.name);
                let port = c.ports.iter().flatten().find(|p| p.container_port == i32::from(addr.port()));
                assert!(port.is_some_and(|p| p.name.as_deref().is_some_and(|n| n.contains("metrics"))), "{}: {f} {addr} is not a declared metrics port: {:?}", c.name, c.ports);
                checked += 1;
            }
        }
        // Port names and numbers are unique within a pod.
        let ports: Vec<_> = spec.containers.iter().flat_map(|c| c.ports.iter().flatten()).map(|p| (p.name.clone(), p.container_port)).collect();
        assert!(ports.iter().enumerate().all(|(i, a)| ports[i + 1..].iter().all(|b| a.0 != b.0 && a.1 != b.1)), "{name}: {ports:?}");
    }
    // egpud twice, both kubelet plugins, the extender.
    assert_eq!(checked, 5);
}

#[test]
fn host_paths_are_mounted_where_the_host_sees_them() {
    let objs = all_objects();
    let ds = find(&objs, "DaemonSet", "egpu-node");
    let spec = pod_spec(ds);
    assert_eq!(spec.host_pid, Some(true), "egpud follows workloads by host pid");
    let host_path = |volume: &str| -> String {
        let v = spec.volumes.iter().flatten().find(|v| v.name == volume).unwrap_or_else(|| panic!("no volume {volume}"));
        v.host_path.as_ref().unwrap_or_else(|| panic!("{volume} is not a hostPath")).path.clone()
    };
    // A path given to a binary must be inside one of its mounts; the paths
    // the runtime reads on the host (CDI specs, the hook, slice files) must
    // be mounted at the same path as on the host.
    let mounted = |c: &Container, path: &str| -> (String, String) {
        let m = c
            .volume_mounts
            .iter()
            .flatten()
            .filter(|m| path == m.mount_path || path.starts_with(&format!("{}/", m.mount_path)))
            .max_by_key(|m| m.mount_path.len())
            .unwrap_or_else(|| panic!("{}: {path} is not on any mount", c.name));
        (m.mount_path.clone(), host_path(&m.name))
    };
    let egpud = spec.containers.iter().find(|c| c.name == "egpud").unwrap();
    let plugin = spec.containers.iter().find(|c| c.name == "device-plugin").unwrap();
    for f in ["--run-dir", "--state-dir", "--cdi-dir", "--hook-lib", "--cdi-hook"] {
        let (mp, hp) = mounted(egpud, &flag(egpud, f));
        if f != "--state-dir" {
            assert_eq!(mp, hp, "egpud {f}: the host must see it at the same path");
        }
    }
    // The plugin reaches egpud's socket and reads its CDI specs through the same host directories.
    let (_, sock_host) = mounted(plugin, &flag(plugin, "--socket"));
    assert_eq!(sock_host, mounted(egpud, &flag(egpud, "--run-dir")).1);
    assert_eq!(mounted(plugin, &flag(plugin, "--cdi-dir")).1, mounted(egpud, &flag(egpud, "--cdi-dir")).1);
    let kubelet = flag(plugin, "--kubelet-dir");
    for sub in ["device-plugins", "pod-resources"] {
        let (mp, hp) = mounted(plugin, &format!("{kubelet}/{sub}"));
        assert_eq!((mp.as_str(), hp.as_str()), (format!("{kubelet}/{sub}").as_str(), format!("/var/lib/kubelet/{sub}").as_str()));
    }
    // The init container installs the hook where egpud's flags say it is.
    let install = &spec.init_containers.as_ref().unwrap()[0];
    let script = install.command.as_ref().unwrap().join(" ");
    let dest = install.volume_mounts.as_ref().unwrap()[0].clone();
    assert_eq!(host_path(&dest.name), mounted(egpud, &flag(egpud, "--hook-lib")).1);
    for f in ["--hook-lib", "--cdi-hook"] {
        let file = Path::new(&flag(egpud, f)).file_name().unwrap().to_str().unwrap().to_string();
        assert!(script.contains(&format!("/{file}")) && script.contains(&dest.mount_path), "{script}");
    }
    // NODE_NAME, POD_NAME and POD_NAMESPACE from the downward API (the
    // plugin's own pod tells it when the kubelet has synced), and RBAC to
    // patch the Node.
    for (var, field) in [("NODE_NAME", "spec.nodeName"), ("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")] {
        let env = plugin.env.iter().flatten().find(|e| e.name == var).unwrap_or_else(|| panic!("the device plugin has no {var}"));
        assert_eq!(env.value_from.as_ref().unwrap().field_ref.as_ref().unwrap().field_path, field);
    }
    let role: ClusterRole = typed(find(&objs, "ClusterRole", "egpu-node"));
    let allows = |resource: &str, verb: &str| role.rules.iter().flatten().any(|r| r.resources.iter().flatten().any(|x| x == resource) && r.verbs.iter().any(|v| v == verb));
    assert!(allows("nodes", "patch") && allows("pods", "list") && allows("pods", "watch"), "the plugin patches its Node and lists and watches its pods");
    let binding: ClusterRoleBinding = typed(find(&objs, "ClusterRoleBinding", "egpu-node"));
    let subject = &binding.subjects.as_ref().unwrap()[0];
    assert_eq!((Some(subject.name.clone()), subject.namespace.clone()), (spec.service_account_name.clone(), ds["metadata"]["namespace"].as_str().map(String::from)));
}

#[test]
fn the_scheduler_its_extender_and_the_example_pod_agree() {
    let objs = all_objects();
    let dep = find(&objs, "Deployment", "egpu-scheduler");
    let ns = dep["metadata"]["namespace"].as_str().unwrap().to_string();
    let spec = pod_spec(dep);
    let sched = spec.containers.iter().find(|c| c.name == "kube-scheduler").unwrap();
    let ext_c = spec.containers.iter().find(|c| c.name == "extender").unwrap();
    // kube-scheduler's --config is a key of the ConfigMap mounted there.
    let cfg_path = sched.command.as_ref().unwrap().iter().find_map(|a| a.strip_prefix("--config=")).unwrap().to_string();
    let mount = sched.volume_mounts.iter().flatten().find(|m| cfg_path.starts_with(&format!("{}/", m.mount_path))).expect("--config is not on a mount");
    let vol = spec.volumes.iter().flatten().find(|v| v.name == mount.name).unwrap();
    let cm_name = vol.config_map.as_ref().unwrap().name.clone();
    let cm: ConfigMap = typed(find(&objs, "ConfigMap", &cm_name));
    let key = cfg_path.rsplit('/').next().unwrap();
    let cfg: Value = serde_yaml::from_str(&cm.data.unwrap()[key]).unwrap();
    assert_eq!((cfg["apiVersion"].as_str(), cfg["kind"].as_str()), (Some("kubescheduler.config.k8s.io/v1"), Some("KubeSchedulerConfiguration")));
    // The extender entry: on the pod's loopback, at the port it listens on.
    let ext = &cfg["extenders"][0];
    // Node names suffice: the extender follows the nodes the DaemonSet runs on.
    assert_eq!(ext["nodeCacheCapable"], true, "the extender keeps a node cache");
    assert!(flags(ext_c).iter().all(|(f, _)| f != "--no-bind"), "a node cache needs the API: no --no-bind");
    let ds_selector = pod_spec(find(&objs, "DaemonSet", "egpu-node")).node_selector.unwrap();
    let (k, v) = flag(ext_c, "--node-selector").split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).unwrap();
    assert_eq!(ds_selector.get(&k), Some(&v), "the extender follows the nodes eGPU runs on");
    assert_eq!((ext["enableHTTPS"].as_bool(), ext["ignorable"].as_bool()), (Some(false), Some(false)));
    assert_eq!((ext["filterVerb"].as_str(), ext["prioritizeVerb"].as_str(), ext["bindVerb"].as_str()), (Some("filter"), Some("prioritize"), Some("bind")));
    assert_eq!(ext["preemptVerb"].as_str(), Some("preempt"), "without it the scheduler evicts by the node's total units, GPU by GPU blind");
    // Its answer, not the scheduler's timeout, ends a bind.
    let timeout = humantime::parse_duration(ext["httpTimeout"].as_str().expect("httpTimeout set")).unwrap();
    assert!(timeout > egpu_k8s::extender::BIND_DEADLINE, "httpTimeout {timeout:?}");
    // It binds with the pod's service account token.
    assert_ne!(spec.automount_service_account_token, Some(false), "the extender binds pods: it needs the service account's token");
    assert!(ext["weight"].as_i64().unwrap() > 0);
    assert_eq!(ext["urlPrefix"].as_str().unwrap(), format!("http://{}", flag(ext_c, "--listen")));
    // One resource name everywhere: the extender's, the plugin's default, the
    // scheduler's managed resource, the example pod's.
    let resource = flag(ext_c, "--resource");
    assert_eq!(ext["managedResources"][0]["name"].as_str(), Some(resource.as_str()));
    assert_eq!(resource, egpu_k8s::plugin::DEFAULT_RESOURCE);
    let plugin = pod_spec(find(&objs, "DaemonSet", "egpu-node")).containers.into_iter().find(|c| c.name == "device-plugin").unwrap();
    assert!(flags(&plugin).iter().all(|(f, _)| f != "--resource"), "the plugin runs with its default resource");
    let pod: Pod = typed(find(&objs, "Pod", "cuda-sample"));
    let pspec = pod.spec.unwrap();
    assert!(pspec.containers[0].resources.clone().unwrap().limits.unwrap().contains_key(&resource));
    // The example pod asks for this scheduler by its profile's name.
    assert_eq!(cfg["profiles"][0]["schedulerName"].as_str(), pspec.scheduler_name.as_deref());
    // Leader election in its own namespace, which a Role lets it use.
    assert_eq!(cfg["leaderElection"]["resourceNamespace"].as_str(), Some(ns.as_str()));
    let sa = spec.service_account_name.clone().unwrap();
    let bound = |kind: &str, role: &str| {
        objs.iter().filter(|o| o["kind"] == kind).any(|o| {
            o["roleRef"]["name"] == role && o["subjects"].as_array().unwrap().iter().any(|s| s["name"] == sa.as_str() && s["namespace"] == ns.as_str())
        })
    };
    assert!(bound("ClusterRoleBinding", "system:kube-scheduler") && bound("ClusterRoleBinding", "system:volume-scheduler"));
    assert!(bound("RoleBinding", "extension-apiserver-authentication-reader"));
    let leases: Role = typed(find(&objs, "Role", "egpu-scheduler-leases"));
    assert_eq!(leases.metadata.namespace.as_deref(), Some(ns.as_str()));
    assert!(leases.rules.iter().flatten().any(|r| r.resources.iter().flatten().any(|x| x == "leases") && ["get", "create", "update"].iter().all(|v| r.verbs.iter().any(|x| x == v))));
    assert!(bound("RoleBinding", "egpu-scheduler-leases"));
    // It patches pods (their GPU hint), which system:kube-scheduler may not.
    let hints: ClusterRole = typed(find(&objs, "ClusterRole", "egpu-scheduler-hints"));
    assert!(hints.rules.iter().flatten().any(|r| r.resources.iter().flatten().any(|x| x == "pods") && r.verbs.iter().any(|v| v == "patch")));
    assert!(bound("ClusterRoleBinding", "egpu-scheduler-hints"));
}

#[test]
fn the_image_holds_what_the_manifests_run() {
    let dockerfile = std::fs::read_to_string(deploy_dir().join("Dockerfile")).unwrap();
    let objs = all_objects();
    for o in &objs {
        let Some(spec) = o["spec"]["template"]["spec"].as_object() else { continue };
        let spec: PodSpec = serde_json::from_value(Value::Object(spec.clone())).unwrap();
        for c in spec.containers.iter().filter(|c| is_ours(c)) {
            let bin = &c.command.as_ref().unwrap()[0];
            assert!(dockerfile.contains(&format!("/release/{bin} ")), "the Dockerfile does not install {bin}");
        }
        for c in spec.init_containers.iter().flatten() {
            let script = c.command.as_ref().unwrap().join(" ");
            let sources: Vec<&str> = script.split(|c: char| c.is_whitespace() || c == ';').filter(|w| w.starts_with("/usr/local/")).collect();
            assert!(sources.len() >= 2, "{script}");
            for src in sources {
                let (dir, file) = src.rsplit_once('/').unwrap();
                // It leaves the image for the host and its containers, whatever
                // their C library: the glibc 2.17 build (scripts/build-compat.sh),
                // copied to /out/compat.
                let installed = format!("COPY --from=build /out/compat/{file} {}", if dir.ends_with("/bin") { format!("{dir}/") } else { src.to_string() });
                assert!(dockerfile.contains(&installed), "the Dockerfile does not install {src} from the glibc 2.17 build: want `{installed}`");
                assert!(dockerfile.contains(&format!("-unknown-linux-gnu/release/{file}\"")) && dockerfile.contains("./scripts/build-compat.sh --release"), "{file} is not built by scripts/build-compat.sh");
            }
        }
    }
}

#[test]
fn the_dra_driver_its_class_and_the_example_claim_agree() {
    let objs = all_objects();
    let ds = find(&objs, "DaemonSet", "egpu-dra");
    let spec = pod_spec(ds);
    let plugin = spec.containers.iter().find(|c| c.name == "dra-plugin").unwrap();
    let egpud = spec.containers.iter().find(|c| c.name == "egpud").unwrap();
    let host_path = |c: &Container, path: &str| -> (String, String) {
        let m = c.volume_mounts.iter().flatten().filter(|m| path == m.mount_path || path.starts_with(&format!("{}/", m.mount_path))).max_by_key(|m| m.mount_path.len()).unwrap_or_else(|| panic!("{}: {path} is not on any mount", c.name));
        let v = spec.volumes.iter().flatten().find(|v| v.name == m.name).unwrap();
        (m.mount_path.clone(), v.host_path.as_ref().unwrap().path.clone())
    };
    // The kubelet finds the plugin's sockets where the host has them.
    let kubelet = flag(plugin, "--kubelet-dir");
    for sub in ["plugins", "plugins_registry"] {
        let (mp, hp) = host_path(plugin, &format!("{kubelet}/{sub}"));
        assert_eq!((mp.as_str(), hp.as_str()), (format!("{kubelet}/{sub}").as_str(), format!("/var/lib/kubelet/{sub}").as_str()));
    }
    assert_eq!(host_path(plugin, &flag(plugin, "--socket")).1, host_path(egpud, &flag(egpud, "--run-dir")).1);
    assert_eq!(host_path(plugin, &flag(plugin, "--cdi-dir")).1, host_path(egpud, &flag(egpud, "--cdi-dir")).1);
    let env = plugin.env.iter().flatten().find(|e| e.name == "NODE_NAME").unwrap();
    assert_eq!(env.value_from.as_ref().unwrap().field_ref.as_ref().unwrap().field_path, "spec.nodeName");
    // Never two egpud on one node: the two DaemonSets select different labels.
    let selector = |name: &str| pod_spec(find(&objs, "DaemonSet", name)).node_selector.unwrap();
    assert!(selector("egpu-dra").keys().all(|k| !selector("egpu-node").contains_key(k)));
    // The class selects the plugin's driver (its default), and the claim names the class and the driver.
    let driver = egpu_k8s::dra::DEFAULT_DRIVER;
    assert!(flags(plugin).iter().all(|(f, _)| f != "--driver"), "the manifests use the default driver name");
    let class = find(&objs, "DeviceClass", driver);
    assert_eq!(class["spec"]["selectors"][0]["cel"]["expression"], format!("device.driver == \"{driver}\""));
    let tmpl = find(&objs, "ResourceClaimTemplate", "gpu-10gib");
    let devices = &tmpl["spec"]["spec"]["devices"];
    assert_eq!(devices["requests"][0]["exactly"]["deviceClassName"], driver);
    let caps = devices["requests"][0]["exactly"]["capacity"]["requests"].as_object().unwrap();
    assert_eq!(caps.keys().map(String::as_str).collect::<Vec<_>>(), [egpu_k8s::dra::COMPUTE, egpu_k8s::dra::MEMORY]);
    let opaque = &devices["config"][0]["opaque"];
    assert_eq!(opaque["driver"], driver);
    let cfg: egpu_k8s::dra::SliceConfig = serde_json::from_value(opaque["parameters"].clone()).unwrap();
    assert_eq!((cfg.api_version.as_deref(), cfg.kind.as_deref()), (Some(egpu_k8s::dra::CONFIG_API_VERSION), Some(egpu_k8s::dra::CONFIG_KIND)));
    let pod = find(&objs, "Pod", "cuda-sample-dra");
    assert_eq!(pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"], "gpu-10gib");
    assert_eq!(pod["spec"]["containers"][0]["resources"]["claims"][0]["name"], pod["spec"]["resourceClaims"][0]["name"]);
    // RBAC: read claims, write the ResourceSlice, for the pod's service account.
    let role: ClusterRole = typed(find(&objs, "ClusterRole", "egpu-dra"));
    let allows = |resource: &str, verb: &str| role.rules.iter().flatten().any(|r| r.resources.iter().flatten().any(|x| x == resource) && r.verbs.iter().any(|v| v == verb));
    assert!(allows("nodes", "get") && allows("pods", "list") && allows("pods", "watch") && allows("resourceclaims", "get") && ["get", "create", "update"].iter().all(|v| allows("resourceslices", v)));
    let binding: ClusterRoleBinding = typed(find(&objs, "ClusterRoleBinding", "egpu-dra"));
    assert_eq!(Some(binding.subjects.as_ref().unwrap()[0].name.clone()), spec.service_account_name);
}
