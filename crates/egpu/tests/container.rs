//! A container runs in a slice the way a container runtime puts it there:
//! egpud (`--cdi-dir`) writes the slice's CDI spec, the CNCF reference CDI
//! library validates it and injects it into the OCI spec `runc spec` makes, and
//! a real `runc` runs the container, in its own pid and mount namespaces.
//!
//! Needs `runc` and root. Elsewhere the test says why and passes, unless
//! `EGPU_REQUIRE_RUNC=1` (set by `.ci/run`, which installs runc) makes that a
//! failure.

mod common;
use common::*;
use container_device_interface::cache::{new_cache, with_auto_refresh};
use container_device_interface::spec_dirs::with_spec_dirs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);
const HOOK_IN_CONTAINER: &str = "/run/egpu/libegpu.so";

/// Why runc cannot run containers here, if it cannot.
fn runc_missing() -> Option<String> {
    match Command::new("runc").arg("--version").output() {
        Err(e) => return Some(format!("runc not found ({e}); install it (apt-get install runc)")),
        Ok(o) if !o.status.success() => return Some("runc --version failed".into()),
        Ok(_) => {}
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (the test runs rootful containers)".into());
    }
    None
}

fn skip_unless_runc() -> bool {
    let Some(why) = runc_missing() else { return false };
    assert!(std::env::var("EGPU_REQUIRE_RUNC").as_deref() != Ok("1"), "EGPU_REQUIRE_RUNC=1 but {why}");
    eprintln!("skipped: {why}");
    true
}

/// One container; killed and deleted on drop.
struct Container {
    runc_root: PathBuf,
    id: String,
}

impl Container {
    fn runc(&self) -> Command {
        let mut c = Command::new("runc");
        c.arg("--root").arg(&self.runc_root);
        c
    }

    fn run(&self, bundle: &Path) -> Command {
        let mut c = self.runc();
        c.args(["run", "--bundle"]).arg(bundle).arg(&self.id);
        c
    }

    /// The host pid of the container's first process.
    fn host_pid(&self) -> u64 {
        let o = self.runc().args(["state", &self.id]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("runc state: {}", String::from_utf8_lossy(&o.stderr)));
        v["pid"].as_u64().unwrap()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.runc().args(["kill", &self.id, "KILL"]).output();
        let _ = self.runc().args(["delete", "--force", &self.id]).output();
    }
}

/// What a test container's root file system holds: the `/usr` (and `/bin`,
/// `/lib`, `/lib64`, `/sbin`) of `system`, read-only, and the directory
/// `opt` at `/opt/egpu`.
struct Image<'a> {
    system: &'a Path,
    opt: &'a Path,
}

/// The host's own system, and the test binaries built with it.
fn host_image(opt: &Path) -> Image<'_> {
    Image { system: Path::new("/"), opt }
}

/// A bundle running `sh -c script`, with the CDI device `device` injected
/// from the specs in `cdi_dir`, its root file system made of `image`; with
/// none, it is empty: an image without a C library, as a musl or static
/// image is to glibc's loader.
fn bundle(dir: &Path, cdi_dir: &Path, device: &str, script: &str, image: Option<Image>) -> PathBuf {
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    let mut binds = Vec::new();
    if let Some(image) = &image {
        binds.push((image.system.join("usr").display().to_string(), "/usr".to_string()));
        binds.push((image.opt.display().to_string(), "/opt/egpu".to_string()));
        for d in ["bin", "lib", "lib64", "sbin"] {
            let there = image.system.join(d);
            match std::fs::read_link(&there) {
                Ok(to) => std::os::unix::fs::symlink(to, rootfs.join(d)).unwrap(),
                Err(_) if there.is_dir() => binds.push((there.display().to_string(), format!("/{d}"))),
                Err(_) => {}
            }
        }
        if let Ok(cache) = std::fs::read(image.system.join("etc/ld.so.cache")) {
            std::fs::write(rootfs.join("etc/ld.so.cache"), cache).unwrap();
        }
    }
    std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(rootfs.join("etc/group"), "root:x:0:\n").unwrap();
    let o = Command::new("runc").args(["spec", "--bundle"]).arg(dir).output().unwrap();
    assert!(o.status.success(), "runc spec: {}", String::from_utf8_lossy(&o.stderr));
    let config = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    // Relative to the bundle, as containerd writes it.
    v["root"] = serde_json::json!({"path": "rootfs", "readonly": true});
    v["process"]["terminal"] = false.into();
    v["process"]["args"] = serde_json::json!(["/bin/sh", "-c", script]);
    let mounts = v["mounts"].as_array_mut().unwrap();
    for (src, dst) in binds {
        mounts.push(serde_json::json!({"destination": dst, "type": "bind", "source": src, "options": ["rbind", "ro"]}));
    }
    std::fs::write(&config, v.to_string()).unwrap();

    // What a CDI-aware runtime does with `--device egpu.io/slice=NAME`.
    let mut spec = oci_spec::runtime::Spec::load(&config).unwrap();
    let cache = new_cache(vec![with_spec_dirs(&[cdi_dir.to_str().unwrap()]), with_auto_refresh(false)]);
    let mut cache = cache.lock().unwrap();
    cache.refresh().unwrap_or_else(|e| panic!("the CDI specs egpud wrote do not load: {e}"));
    assert!(cache.list_devices().contains(&device.to_string()), "{device} not among {:?}", cache.list_devices());
    cache.inject_devices(Some(&mut spec), vec![device.to_string()]).unwrap_or_else(|e| panic!("injecting {device}: {e}"));
    spec.save(&config).unwrap();
    dir.to_path_buf()
}

#[test]
fn a_runc_container_runs_in_its_slice_through_the_cdi_spec() {
    if skip_unless_runc() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let cdi_dir = tmp.path().join("cdi");
    let mut node = Node::start_with("1x16GiB", &["--cdi-dir", cdi_dir.to_str().unwrap()]);
    node.ok(&["create", "--name", "svc", "--gpu-memory", "1GiB"]);
    let spec_file = cdi_dir.join("egpu.io-slice_svc.json");
    // Written before `egpu create` returned, and valid for the reference implementation.
    container_device_interface::spec::read_spec(&spec_file, 0).unwrap_or_else(|e| panic!("{}: {e:#}", spec_file.display()));
    let runc_root = tmp.path().join("runc");
    let uuid = node.slice("svc")["devices"][0]["uuid"].as_str().unwrap().to_string();

    // 1. The hook comes from /etc/ld.so.preload and the slice from
    //    /run/egpu/slice: the environment can neither remove the one nor
    //    point the other elsewhere (at a limits file the workload made).
    let grow = Container { runc_root: runc_root.clone(), id: format!("egpu-grow-{}", std::process::id()) };
    let b = bundle(&tmp.path().join("grow"), &cdi_dir, "egpu.io/slice=svc", "unset LD_PRELOAD; export EGPU_SLICE_DIR=/tmp/forged; exec /opt/egpu/egpu-probe grow --step 256MiB --until 2GiB --hold", Some(host_image(&target_dir())));
    let mut p = Lines::spawn(grow.run(&b));
    let blocked = p.wait_event("blocked", T).unwrap_or_else(|| panic!("the container's probe never blocked at its 1 GiB limit (a 16 GiB GPU): {:?}", p.seen));
    assert!(blocked["total"].as_u64().unwrap() < 1 << 30, "{blocked}");

    // egpud sees the process by its host pid (it is pid 1 in the container).
    let host_pid = grow.host_pid();
    let s = node.slice("svc");
    let pids: Vec<u64> = s["processes"].as_array().unwrap().iter().map(|p| p["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids, [host_pid], "{s}");
    assert_ne!(host_pid, 1);

    // 2. A live resize from the host reaches the running container.
    node.ok(&["resize", "svc", "--gpu-memory", "3GiB"]);
    p.wait_event("unblocked", T).unwrap_or_else(|| panic!("the resize did not reach the container: {:?}", p.seen));
    p.wait_event("holding", T).expect("the probe reaches --until after the resize");
    assert!(node.slice("svc")["devices"][0]["used_bytes"].as_u64().unwrap() >= 2 << 30);
    // The (simulated) driver counts it too: egpud, in another pid namespace,
    // lists the device's processes (which sweeps the dead ones) and must not
    // take the container's for dead.
    let dev = &node.json(&["devices", "-o", "json"])["devices"][0];
    assert!(dev["driver_used_bytes"].as_u64().unwrap() >= 2 << 30, "the driver lost the container's memory: {dev}");

    // 3. egpud crashes and comes back: it adopts the container's process, and
    //    keeps the spec.
    node.kill9();
    node.restart();
    let s = node.slice("svc");
    assert_eq!(s["processes"][0]["pid"].as_u64(), Some(host_pid), "{s}");
    assert!(spec_file.is_file(), "a restarted egpud removed the spec of a live slice");

    // 4. A SIGKILLed container's memory is reclaimed.
    let o = grow.runc().args(["kill", &grow.id, "KILL"]).output().unwrap();
    assert!(o.status.success(), "runc kill: {}", String::from_utf8_lossy(&o.stderr));
    assert!(wait_until(T, || p.child.try_wait().unwrap().is_some()), "runc run did not end after the kill");
    assert!(
        wait_until(T, || {
            let s = node.slice("svc");
            s["devices"][0]["used_bytes"] == 0 && s["processes"].as_array().unwrap().is_empty()
        }),
        "the killed container's usage was not reclaimed: {}",
        node.slice("svc")
    );
    let driver_used = || node.json(&["devices", "-o", "json"])["devices"][0]["driver_used_bytes"].as_u64().unwrap();
    assert!(wait_until(T, || driver_used() == 0), "the driver kept the killed container's memory: {}", driver_used());

    // 5. Inside, the slice's limits and the preload list cannot be written,
    //    and CUDA sees the slice: its one GPU, at the resized limit.
    let look = Container { runc_root, id: format!("egpu-look-{}", std::process::id()) };
    let script = "cat /etc/ld.so.preload; \
        echo x > /run/egpu/slice/limits && echo WROTE-LIMITS; \
        echo x > /etc/ld.so.preload && echo WROTE-PRELOAD; \
        exec /opt/egpu/egpu-probe info";
    let b = bundle(&tmp.path().join("look"), &cdi_dir, "egpu.io/slice=svc", script, Some(host_image(&target_dir())));
    let o = look.run(&b).output().unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.lines().next() == Some(HOOK_IN_CONTAINER), "{out}");
    assert!(!out.contains("WROTE"), "a container wrote its limits or preload list: {out}");
    assert_eq!(err.matches("Read-only file system").count(), 2, "{err}");
    let info: serde_json::Value = out.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).find(|v| v["event"] == "info").unwrap_or_else(|| panic!("{out}"));
    assert_eq!(info["device_count"], 1, "{info}");
    assert_eq!(info["devices"][0]["uuid"], uuid.as_str(), "{info}");
    assert_eq!(info["devices"][0]["total_mem"], 3u64 << 30, "{info}");
    assert_eq!(info["nvml"]["devices"][0]["memory"]["total"], 3u64 << 30, "NVML shows the slice too: {info}");
    assert_eq!(info["pid"], 1, "the container has a pid namespace of its own: {info}");

    // 6. An image that cannot load the hook is not started: its programs
    //    would run unlimited.
    let bare = Container { runc_root: look.runc_root.clone(), id: format!("egpu-bare-{}", std::process::id()) };
    let b = bundle(&tmp.path().join("bare"), &cdi_dir, "egpu.io/slice=svc", "exit 0", None);
    let o = bare.run(&b).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a container without a C library was started: {err}");
    assert!(err.contains("cannot be held to its GPU slice") && err.contains("an image without glibc"), "{err}");

    // 7. The spec goes with the slice.
    node.ok(&["rm", "svc"]);
    assert!(!spec_file.exists(), "the CDI spec outlived its slice");
}

/// Where `scripts/build-compat.sh` puts the glibc 2.17 build, and where
/// `scripts/old-glibc-rootfs.sh` makes the old image, if both are there;
/// else why not (a failure with `EGPU_REQUIRE_COMPAT=1`, set by `.ci/run`).
fn compat_inputs() -> Result<(PathBuf, PathBuf), String> {
    let target = target_dir().parent().unwrap().to_path_buf();
    let profile = target_dir().file_name().unwrap().to_owned();
    let compat = target.join(format!("{}-unknown-linux-gnu", std::env::consts::ARCH)).join(profile);
    let rootfs = target.join("old-glibc-rootfs");
    for f in ["libegpu.so", "egpu-cdi-hook", "libegpu_simgpu.so", "egpu-probe"] {
        if !compat.join(f).is_file() {
            return Err(format!("{} is missing: run scripts/build-compat.sh", compat.join(f).display()));
        }
    }
    if !rootfs.join(".egpu-complete").is_file() {
        return Err(format!("no old-glibc image at {}: run scripts/old-glibc-rootfs.sh", rootfs.display()));
    }
    Ok((compat, rootfs))
}

/// The glibc symbol versions `file` needs, as (major, minor).
fn glibc_needs(file: &Path) -> Vec<(u32, u32)> {
    let data = std::fs::read(file).unwrap();
    let needs = egpu_cdi_hook::needs(file, &data).unwrap();
    let versions = needs.iter().flat_map(|n| n.versions.iter());
    versions.filter_map(|v| v.strip_prefix("GLIBC_")).map(|v| {
        let mut it = v.split('.').map(|x| x.parse::<u32>().unwrap());
        (it.next().unwrap(), it.next().unwrap_or(0))
    }).collect()
}

/// The image's dynamic loader and library directory.
fn old_loader(rootfs: &Path) -> (PathBuf, PathBuf) {
    let libdir = rootfs.join(format!("usr/lib/{}-linux-gnu", std::env::consts::ARCH));
    let ld = if cfg!(target_arch = "aarch64") { "ld-linux-aarch64.so.1" } else { "ld-linux-x86-64.so.2" };
    (libdir.join(ld), libdir)
}

#[test]
fn an_image_with_an_old_glibc_runs_in_a_slice_with_the_glibc_2_17_build() {
    if skip_unless_runc() {
        return;
    }
    let (compat, rootfs) = match compat_inputs() {
        Ok(v) => v,
        Err(why) => {
            assert!(std::env::var("EGPU_REQUIRE_COMPAT").as_deref() != Ok("1"), "EGPU_REQUIRE_COMPAT=1 but {why}");
            eprintln!("skipped: {why}");
            return;
        }
    };
    // The image is older than the usual build allows, and the compat build is
    // not: its files need nothing after glibc 2.17; the usual build needs
    // 2.34 (on a build host older than 2.34 these checks fail, on purpose:
    // the test would then prove nothing).
    let (ld, libdir) = old_loader(&rootfs);
    let libc = libdir.join("libc.so.6");
    let defined = egpu_cdi_hook::defines(&libc, &std::fs::read(&libc).unwrap()).unwrap();
    assert!(defined.contains("GLIBC_2.17") && !defined.contains("GLIBC_2.34"), "{} is not an old glibc: {defined:?}", libc.display());
    for f in ["libegpu.so", "egpu-cdi-hook", "libegpu_simgpu.so", "egpu-probe"] {
        let newest = glibc_needs(&compat.join(f)).into_iter().max();
        assert!(newest.is_some_and(|v| v <= (2, 17)), "the compat {f} needs glibc {newest:?}");
    }
    assert!(glibc_needs(&target_dir().join("libegpu.so")).contains(&(2, 34)), "the usual build no longer needs glibc 2.34: is this test still needed?");

    // The container check runs in the host's namespace: run it with the old
    // image's loader and C library, as on an old host. The usual build
    // cannot even start there.
    let o = Command::new(&ld).arg("--library-path").arg(&libdir).arg(target_dir().join("egpu-cdi-hook")).arg("--version").output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("GLIBC_2."), "the usual egpu-cdi-hook started on glibc 2.31: {err}");
    let tmp = tempfile::tempdir().unwrap();
    let old_host_hook = tmp.path().join("egpu-cdi-hook-on-old-glibc");
    std::fs::write(&old_host_hook, format!("#!/bin/sh\nexec '{}' --library-path '{}' '{}' \"$@\"\n", ld.display(), libdir.display(), compat.join("egpu-cdi-hook").display())).unwrap();
    std::fs::set_permissions(&old_host_hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    // 1. With the compat build, a container of the old image runs in its
    //    slice, held to its limit, and a live resize reaches it.
    let cdi_dir = tmp.path().join("cdi");
    let flags = |hook: &Path| -> Vec<String> {
        let v = [("--cdi-dir", cdi_dir.clone()), ("--hook-lib", hook.to_path_buf()), ("--sim-lib", compat.join("libegpu_simgpu.so")), ("--cdi-hook", old_host_hook.clone())];
        v.into_iter().flat_map(|(flag, path)| [flag.to_string(), path.display().to_string()]).collect()
    };
    let f = flags(&compat.join("libegpu.so"));
    let node = Node::start_with("1x16GiB", &f.iter().map(String::as_str).collect::<Vec<_>>());
    node.ok(&["create", "--name", "old", "--gpu-memory", "1GiB"]);
    let runc_root = tmp.path().join("runc");
    let old = Container { runc_root: runc_root.clone(), id: format!("egpu-old-{}", std::process::id()) };
    let image = Image { system: &rootfs, opt: &compat };
    let b = bundle(&tmp.path().join("old"), &cdi_dir, "egpu.io/slice=old", "exec /opt/egpu/egpu-probe grow --step 256MiB --until 2GiB --hold", Some(image));
    let mut p = Lines::spawn(old.run(&b));
    let blocked = p.wait_event("blocked", T).unwrap_or_else(|| panic!("the old image's probe never blocked at its 1 GiB limit: {:?}\n{}", p.seen, node.log()));
    assert!(blocked["total"].as_u64().unwrap() < 1 << 30, "{blocked}");
    // It runs on the image's glibc 2.31, with the hook loaded.
    let host_pid = old.host_pid();
    let maps = std::fs::read_to_string(format!("/proc/{host_pid}/maps")).unwrap();
    assert!(maps.contains("libc-2.31.so") && maps.contains(HOOK_IN_CONTAINER), "{maps}");
    let pids: Vec<u64> = node.slice("old")["processes"].as_array().unwrap().iter().map(|p| p["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids, [host_pid]);
    node.ok(&["resize", "old", "--gpu-memory", "3GiB"]);
    p.wait_event("unblocked", T).unwrap_or_else(|| panic!("the resize did not reach the old image's container: {:?}", p.seen));
    p.wait_event("holding", T).expect("the probe reaches --until after the resize");
    drop(old);
    assert!(wait_until(T, || p.child.try_wait().unwrap().is_some()), "runc run did not end after the kill");

    // 1b. The same build (the one deploy/Dockerfile ships to every node) in
    //     an image of this host's newer glibc, whose programs bind
    //     `dlsym@@GLIBC_2.34`: the usual probe, reaching the driver through
    //     dlopen and dlsym, is held to its limit too.
    node.ok(&["create", "--name", "new", "--gpu-memory", "1GiB"]);
    let new = Container { runc_root: runc_root.clone(), id: format!("egpu-new-{}", std::process::id()) };
    let b = bundle(&tmp.path().join("new"), &cdi_dir, "egpu.io/slice=new", "exec /opt/egpu/egpu-probe --via dlopen grow --step 256MiB --until 2GiB --hold", Some(host_image(&target_dir())));
    let mut p = Lines::spawn(new.run(&b));
    let blocked = p.wait_event("blocked", T).unwrap_or_else(|| panic!("the host image's probe never blocked at its 1 GiB limit under the glibc 2.17 hook: {:?}", p.seen));
    assert!(blocked["total"].as_u64().unwrap() < 1 << 30, "{blocked}");
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", new.host_pid())).unwrap();
    assert!(maps.contains(HOOK_IN_CONTAINER) && !maps.contains("libc-2.31.so"), "{maps}");
    drop(new);
    assert!(wait_until(T, || p.child.try_wait().unwrap().is_some()), "runc run did not end after the kill");
    drop(node);

    // 2. With the usual build, the same image is refused before it starts,
    //    with what its C library lacks and what to do.
    let _ = std::fs::remove_dir_all(&cdi_dir);
    let f = flags(&target_dir().join("libegpu.so"));
    let node = Node::start_with("1x16GiB", &f.iter().map(String::as_str).collect::<Vec<_>>());
    node.ok(&["create", "--name", "old", "--gpu-memory", "1GiB"]);
    let refused = Container { runc_root, id: format!("egpu-old-refused-{}", std::process::id()) };
    let b = bundle(&tmp.path().join("refused"), &cdi_dir, "egpu.io/slice=old", "exit 0", Some(Image { system: &rootfs, opt: &compat }));
    let o = refused.run(&b).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "an image whose glibc is too old for the hook was started: {err}");
    assert!(err.contains("cannot be held to its GPU slice") && err.contains("lacks") && err.contains("GLIBC_2.34") && err.contains("scripts/build-compat.sh"), "{err}");
}
