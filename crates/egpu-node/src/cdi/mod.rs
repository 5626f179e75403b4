//! Container Device Interface (CDI) specs for slices: how a container runtime
//! (containerd, CRI-O, Podman, Docker) puts a container into a slice.
//!
//! With `--cdi-dir DIR` (usually `/var/run/cdi`) egpud keeps one spec file per
//! slice there, `egpu.io-slice_<name>.json`, naming the CDI device
//! `egpu.io/slice=<name>`: written before `egpu create` returns, removed when
//! the slice goes, reconciled at start and at every sweep. The edits it makes
//! to a container (design and rejected alternatives: `docs/containers.md`):
//!
//! - `libegpu.so` at [`CONTAINER_HOOK`], and an `/etc/ld.so.preload` naming
//!   it, both read-only: every process of the container, children and shells
//!   included, loads the hook whatever its environment says;
//! - the slice's `limits` file read-only and its `usage` file read-write at
//!   [`egpu_abi::paths::CONTAINER_SLICE_DIR`] (a read-only mount of the whole
//!   directory would refuse the usage records), and only this slice's;
//! - `EGPU_SLICE_DIR` and `CUDA_VISIBLE_DEVICES` (the slice's GPUs by UUID);
//! - on a simulated node, the simulated driver and its shared state.
//!
//! The GPU itself (device nodes, the NVIDIA driver's libraries) comes from the
//! NVIDIA Container Toolkit's own CDI spec on a real node: ask for both devices.

use crate::config::{NodeConfig, SIM_GPUS_ENV, SIM_PASSTHROUGH_ENV, SIM_STATE_ENV};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The CDI kind (vendor `egpu.io`, class `slice`).
pub const KIND: &str = "egpu.io/slice";
/// Written specs use nothing newer than mount types (0.4.0); runtimes whose
/// CDI library is 0.5.0 or newer read them.
pub const CDI_VERSION: &str = "0.5.0";
/// Spec file names: this prefix, the slice name, `.json`.
pub const SPEC_PREFIX: &str = "egpu.io-slice_";
pub use egpu_abi::paths::CONTAINER_HOOK;
/// Where the container sees the simulated driver (simulated nodes only).
pub const CONTAINER_SIMLIB: &str = "/run/egpu/simlib";
/// Where the container sees the simulated GPUs' shared state.
pub const CONTAINER_SIM_STATE: &str = "/run/egpu/simgpu.state";
/// The `/etc/ld.so.preload` egpud writes for containers, under the run directory.
pub const PRELOAD_FILE: &str = "cdi/ld.so.preload";

/// The fully qualified CDI device name of a slice.
pub fn device_name(slice: &str) -> String {
    format!("{KIND}={slice}")
}

#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("cannot write CDI spec {path} (is --cdi-dir writable by egpud?)")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot list --cdi-dir {path}")]
    List {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot remove stale CDI spec {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<Device>,
}

#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    pub name: String,
    pub container_edits: Edits,
}

#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Edits {
    pub env: Vec<String>,
    pub mounts: Vec<Mount>,
    pub hooks: Vec<Hook>,
}

#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hook {
    pub hook_name: String,
    pub path: String,
    pub args: Vec<String>,
    /// Seconds; the runtime kills the hook and fails the start after it.
    pub timeout: u32,
}

#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub options: Vec<String>,
}

fn bind(host: &Path, container: &str, writable: bool) -> Mount {
    let rw = if writable { "rw" } else { "ro" };
    Mount {
        host_path: host.display().to_string(),
        container_path: container.into(),
        kind: "bind".into(),
        options: vec!["bind".into(), rw.into(), "nosuid".into(), "nodev".into()],
    }
}

/// The spec of one slice on the node `cfg` describes.
pub fn slice_spec(cfg: &NodeConfig, name: &str, slice_dir: &Path, device_uuids: &[String]) -> Spec {
    let in_slice = egpu_abi::paths::CONTAINER_SLICE_DIR;
    let mut env = vec![format!("{}={in_slice}", egpu_abi::paths::SLICE_DIR_ENV), format!("CUDA_VISIBLE_DEVICES={}", device_uuids.join(","))];
    let mut mounts = vec![
        bind(&cfg.hook_lib, CONTAINER_HOOK, false),
        bind(&cfg.run_dir.join(PRELOAD_FILE), "/etc/ld.so.preload", false),
        bind(&egpu_abi::paths::limits_path(slice_dir), &format!("{in_slice}/limits"), false),
        bind(&egpu_abi::paths::usage_path(slice_dir), &format!("{in_slice}/usage"), true),
    ];
    if let Some(spec) = &cfg.simulate {
        // The simulated driver by file, not through <run-dir>/simlib: its links
        // point at host paths the container does not have.
        let lib = std::fs::canonicalize(&cfg.sim_lib).unwrap_or_else(|_| cfg.sim_lib.clone());
        for link in ["libcuda.so.1", "libnvidia-ml.so.1"] {
            mounts.push(bind(&lib, &format!("{CONTAINER_SIMLIB}/{link}"), false));
        }
        mounts.push(bind(&cfg.sim_state_path(), CONTAINER_SIM_STATE, true));
        env.push(format!("LD_LIBRARY_PATH={CONTAINER_SIMLIB}"));
        env.push(format!("{SIM_GPUS_ENV}={spec}"));
        env.push(format!("{SIM_STATE_ENV}={CONTAINER_SIM_STATE}"));
        for var in SIM_PASSTHROUGH_ENV {
            if let Ok(v) = std::env::var(var) {
                env.push(format!("{var}={v}"));
            }
        }
    }
    // Before the first process: can the image load the hook at all? (the
    // `egpu-cdi-hook` crate)
    let hooks = vec![Hook {
        hook_name: "createContainer".into(),
        path: cfg.cdi_hook.display().to_string(),
        args: vec!["egpu-cdi-hook".into(), "--hook-lib".into(), cfg.hook_lib.display().to_string()],
        timeout: 30,
    }];
    Spec { cdi_version: CDI_VERSION.into(), kind: KIND.into(), devices: vec![Device { name: name.into(), container_edits: Edits { env, mounts, hooks } }] }
}

/// The file name of a slice's spec in the CDI directory.
pub fn spec_file(name: &str) -> String {
    format!("{SPEC_PREFIX}{name}.json")
}

/// Keeps `--cdi-dir` equal to the node's slices: one spec file per slice.
/// Run one egpud per directory: a first sync removes the specs of slices
/// this egpud does not have.
pub struct CdiPublisher {
    cfg: NodeConfig,
    dir: PathBuf,
    /// File name → content as last written, so a sync rewrites only what changed.
    written: BTreeMap<String, String>,
    /// Whether the directory was scanned for a previous run's specs.
    scanned: bool,
    /// The last sync error, logged once rather than at every sweep.
    pub(crate) last_error: Option<String>,
}

/// What a sync needs to know of a slice.
pub struct SliceView<'a> {
    pub name: &'a str,
    pub dir: &'a Path,
    pub device_uuids: &'a [String],
}

impl CdiPublisher {
    /// Creates `dir` and the container `ld.so.preload` under the run directory.
    pub fn new(cfg: &NodeConfig, dir: &Path) -> Result<CdiPublisher, CdiError> {
        let preload = cfg.run_dir.join(PRELOAD_FILE);
        for d in [dir, preload.parent().unwrap_or(dir)] {
            std::fs::create_dir_all(d).map_err(|source| CdiError::Write { path: d.into(), source })?;
        }
        write_atomic(&preload, &format!("{CONTAINER_HOOK}\n"))?;
        // Refuse an unwritable directory now, not at the first slice.
        let probe = dir.join(".egpud-write-probe");
        write_atomic(&probe, "")?;
        let _ = std::fs::remove_file(&probe);
        Ok(CdiPublisher { cfg: cfg.clone(), dir: dir.into(), written: BTreeMap::new(), scanned: false, last_error: None })
    }

    /// Whether slice `name`'s spec is in place as last synced.
    pub fn published(&self, name: &str) -> bool {
        let f = spec_file(name);
        self.written.contains_key(&f) && self.dir.join(f).is_file()
    }

    /// Writes the spec of every slice whose spec changed and removes the specs
    /// of slices that are gone. The first sync also removes specs a previous
    /// run left for slices that no longer exist (so one egpud per directory).
    /// Every file is tried even when one fails; the first error is returned.
    pub fn sync<'a>(&mut self, slices: impl Iterator<Item = SliceView<'a>>) -> Result<(), CdiError> {
        let mut first_err = None;
        let want: BTreeMap<String, String> = slices
            .map(|s| {
                let spec = slice_spec(&self.cfg, s.name, s.dir, s.device_uuids);
                (spec_file(s.name), serde_json::to_string_pretty(&spec).expect("a spec always serialises") + "\n")
            })
            .collect();
        if !self.scanned {
            match std::fs::read_dir(&self.dir) {
                Ok(entries) => {
                    self.scanned = true;
                    for e in entries.flatten() {
                        let f = e.file_name().to_string_lossy().into_owned();
                        if f.starts_with(SPEC_PREFIX) && f.ends_with(".json") && !want.contains_key(&f) {
                            // Unknown content: a stale spec of a previous run.
                            self.written.insert(f, String::new());
                        }
                    }
                }
                Err(source) => first_err = Some(CdiError::List { path: self.dir.clone(), source }),
            }
        }
        let stale: Vec<String> = self.written.keys().filter(|f| !want.contains_key(*f)).cloned().collect();
        for f in stale {
            let path = self.dir.join(&f);
            match std::fs::remove_file(&path) {
                Ok(()) => tracing::info!(spec = %path.display(), "removed CDI spec"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    first_err.get_or_insert(CdiError::Remove { path, source });
                    continue;
                }
            }
            self.written.remove(&f);
        }
        for (f, content) in want {
            let path = self.dir.join(&f);
            // Rewritten when it changed, or when something removed the file.
            if self.written.get(&f) == Some(&content) && path.is_file() {
                continue;
            }
            match write_atomic(&path, &content) {
                Ok(()) => {
                    tracing::info!(spec = %path.display(), "wrote CDI spec");
                    self.written.insert(f, content);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// Writes `content` under a temporary name and renames it into place, so a
/// runtime scanning the directory never reads half a spec.
fn write_atomic(path: &Path, content: &str) -> Result<(), CdiError> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let err = |source| CdiError::Write { path: path.into(), source };
    std::fs::write(&tmp, content).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        err(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(run: &Path, simulate: bool) -> NodeConfig {
        NodeConfig {
            run_dir: run.into(),
            state_dir: run.join("state"),
            socket: None,
            simulate: simulate.then(|| "2x16GiB".into()),
            hook_lib: "/opt/egpu/libegpu.so".into(),
            sim_lib: "/opt/egpu/libegpu_simgpu.so".into(),
            sweep_period_ms: 200,
            cdi_dir: None,
            cdi_hook: "/opt/egpu/egpu-cdi-hook".into(),
            memory_audit: Default::default(),
            memory_audit_slack: crate::audit::DEFAULT_SLACK,
            drop_unstored_slices: false,
            adopt_unstored_slices: false,
            sysfs: None,
        }
    }

    #[test]
    fn a_slice_spec_mounts_limits_read_only_and_usage_writable() {
        let run = Path::new("/r");
        let s = slice_spec(&cfg(run, false), "svc", Path::new("/r/slices/svc"), &["GPU-a".into(), "GPU-b".into()]);
        assert_eq!((s.kind.as_str(), s.devices.len(), s.devices[0].name.as_str()), (KIND, 1, "svc"));
        let e = &s.devices[0].container_edits;
        let m = |c: &str| e.mounts.iter().find(|m| m.container_path == c).unwrap_or_else(|| panic!("no mount at {c}: {e:?}"));
        assert_eq!(m("/run/egpu/slice/limits").host_path, "/r/slices/svc/limits");
        assert!(m("/run/egpu/slice/limits").options.contains(&"ro".into()));
        assert!(m("/run/egpu/slice/usage").options.contains(&"rw".into()));
        assert!(m("/etc/ld.so.preload").options.contains(&"ro".into()));
        assert_eq!(m(CONTAINER_HOOK).host_path, "/opt/egpu/libegpu.so");
        assert_eq!(e.hooks.len(), 1);
        assert_eq!((e.hooks[0].hook_name.as_str(), e.hooks[0].path.as_str()), ("createContainer", "/opt/egpu/egpu-cdi-hook"));
        assert_eq!(e.hooks[0].args[1..], ["--hook-lib", "/opt/egpu/libegpu.so"]);
        assert!(e.env.contains(&"CUDA_VISIBLE_DEVICES=GPU-a,GPU-b".into()) && e.env.contains(&"EGPU_SLICE_DIR=/run/egpu/slice".into()));
        // No LD_PRELOAD: the hook comes from /etc/ld.so.preload, which a child cannot unset.
        assert!(!e.env.iter().any(|v| v.starts_with("LD_PRELOAD=")), "{e:?}");
        assert!(!e.env.iter().any(|v| v.starts_with("EGPU_SIM")), "a real node passes no simulated driver");
        let sim = slice_spec(&cfg(run, true), "svc", Path::new("/r/slices/svc"), &[]);
        let e = &sim.devices[0].container_edits;
        assert!(e.env.contains(&format!("{SIM_STATE_ENV}={CONTAINER_SIM_STATE}")) && e.env.contains(&format!("LD_LIBRARY_PATH={CONTAINER_SIMLIB}")));
        assert!(e.mounts.iter().any(|m| m.container_path == CONTAINER_SIM_STATE && m.host_path == "/r/simgpu.state" && m.options.contains(&"rw".into())));
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn sync_writes_rewrites_and_removes_only_its_own_specs() {
        let tmp = tempfile::tempdir().unwrap();
        let (run, cdi) = (tmp.path().join("run"), tmp.path().join("cdi"));
        let cfg = cfg(&run, false);
        std::fs::create_dir_all(&cdi).unwrap();
        // A previous run's spec for a slice that is gone, and another vendor's spec.
        std::fs::write(cdi.join(spec_file("gone")), "{}").unwrap();
        std::fs::write(cdi.join("nvidia.com-gpu.json"), "{}").unwrap();
        let mut p = CdiPublisher::new(&cfg, &cdi).unwrap();
        assert_eq!(std::fs::read_to_string(run.join(PRELOAD_FILE)).unwrap(), format!("{CONTAINER_HOOK}\n"));
        let (a, b) = (vec!["GPU-0".to_string()], vec!["GPU-1".to_string()]);
        let view = |name, uuids| SliceView { name, dir: Path::new("/x"), device_uuids: uuids };
        p.sync([view("a", &a), view("b", &b)].into_iter()).unwrap();
        assert_eq!(files(&cdi), ["egpu.io-slice_a.json", "egpu.io-slice_b.json", "nvidia.com-gpu.json"]);
        let read = |f: &str| serde_json::from_str::<Spec>(&std::fs::read_to_string(cdi.join(f)).unwrap()).unwrap();
        assert_eq!(read("egpu.io-slice_b.json"), slice_spec(&cfg, "b", Path::new("/x"), &b));
        // b's GPU changes; a goes.
        p.sync([view("b", &a)].into_iter()).unwrap();
        assert_eq!(files(&cdi), ["egpu.io-slice_b.json", "nvidia.com-gpu.json"]);
        assert_eq!(read("egpu.io-slice_b.json"), slice_spec(&cfg, "b", Path::new("/x"), &a));
        // A spec removed behind egpud's back comes back; a write that fails is
        // reported, and tried again at the next sync.
        std::fs::remove_file(cdi.join("egpu.io-slice_b.json")).unwrap();
        std::fs::create_dir(cdi.join("egpu.io-slice_c.json")).unwrap();
        let err = p.sync([view("b", &a), view("c", &a)].into_iter()).unwrap_err();
        assert!(matches!(&err, CdiError::Write { path, .. } if path.ends_with("egpu.io-slice_c.json")), "{err}");
        std::fs::remove_dir(cdi.join("egpu.io-slice_c.json")).unwrap();
        assert!(files(&cdi).contains(&"egpu.io-slice_b.json".to_string()));
        p.sync([view("b", &a), view("c", &a)].into_iter()).unwrap();
        assert_eq!(files(&cdi), ["egpu.io-slice_b.json", "egpu.io-slice_c.json", "nvidia.com-gpu.json"]);
    }
}
