//! The environment a workload of a slice starts with. The agent computes it
//! so that every client (CLI, device plugin) only applies it.

use crate::config::{NodeConfig, SIM_GPUS_ENV, SIM_PASSTHROUGH_ENV, SIM_STATE_ENV};
use std::path::Path;

/// How a variable combines with a value already in the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvMode {
    Set,
    /// `new:old`
    Prepend,
    /// `old:new`
    Append,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvEntry {
    pub name: String,
    pub value: String,
    pub mode: EnvMode,
}

fn e(name: &str, value: impl Into<String>, mode: EnvMode) -> EnvEntry {
    EnvEntry { name: name.into(), value: value.into(), mode }
}

/// Environment for a workload of the slice in `slice_dir` over `device_uuids` (slice order).
pub fn launch_env(cfg: &NodeConfig, slice_dir: &Path, device_uuids: &[String]) -> Vec<EnvEntry> {
    let mut env = vec![
        e("LD_PRELOAD", cfg.hook_lib.display().to_string(), EnvMode::Append),
        e(egpu_abi::paths::SLICE_DIR_ENV, slice_dir.display().to_string(), EnvMode::Set),
        e("CUDA_VISIBLE_DEVICES", device_uuids.join(","), EnvMode::Set),
    ];
    if let Some(spec) = &cfg.simulate {
        let simlib = cfg.run_dir.join(crate::simlib::SIMLIB_DIR);
        env.push(e("LD_LIBRARY_PATH", simlib.display().to_string(), EnvMode::Prepend));
        env.push(e(SIM_GPUS_ENV, spec.clone(), EnvMode::Set));
        env.push(e(SIM_STATE_ENV, cfg.sim_state_path().display().to_string(), EnvMode::Set));
        for name in SIM_PASSTHROUGH_ENV {
            if let Ok(v) = std::env::var(name) {
                env.push(e(name, v, EnvMode::Set));
            }
        }
    }
    env
}

/// Applies `entry` to an existing value of the variable.
pub fn combine(entry: &EnvEntry, existing: Option<&str>) -> String {
    match (entry.mode, existing.filter(|v| !v.is_empty())) {
        (EnvMode::Set, _) | (_, None) => entry.value.clone(),
        (EnvMode::Prepend, Some(old)) => format!("{}:{old}", entry.value),
        (EnvMode::Append, Some(old)) => format!("{old}:{}", entry.value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_env_and_combination() {
        let cfg = NodeConfig {
            run_dir: "/r".into(),
            state_dir: "/s".into(),
            socket: None,
            simulate: Some("2x16GiB".into()),
            hook_lib: "/t/libegpu.so".into(),
            sim_lib: "/t/libegpu_simgpu.so".into(),
            sweep_period_ms: 200,
            cdi_dir: None,
            cdi_hook: "/t/egpu-cdi-hook".into(),
            memory_audit: Default::default(),
            memory_audit_slack: crate::audit::DEFAULT_SLACK,
            drop_unstored_slices: false,
            adopt_unstored_slices: false,
            sysfs: None,
        };
        let env = launch_env(&cfg, Path::new("/r/slices/a"), &["GPU-1".into(), "GPU-0".into()]);
        let get = |n: &str| env.iter().find(|x| x.name == n).unwrap().clone();
        assert_eq!(get("CUDA_VISIBLE_DEVICES").value, "GPU-1,GPU-0");
        assert_eq!(get("EGPU_SIM_STATE").value, "/r/simgpu.state");
        assert_eq!(combine(&get("LD_PRELOAD"), Some("/x.so")), "/x.so:/t/libegpu.so");
        assert_eq!(combine(&get("LD_LIBRARY_PATH"), Some("/usr/lib")), "/r/simlib:/usr/lib");
        assert_eq!(combine(&get("LD_LIBRARY_PATH"), None), "/r/simlib");
        let real = NodeConfig { simulate: None, ..cfg };
        assert!(launch_env(&real, Path::new("/r/slices/a"), &[]).iter().all(|x| !x.name.starts_with("EGPU_SIM")));
    }
}
