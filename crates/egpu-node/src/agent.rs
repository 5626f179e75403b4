//! The agent: startup, periodic tasks and the gRPC server.
//!
//! Startup order: lock the run directory (one agent per run dir), link the
//! simulated driver when simulating, discover devices through NVML, open the
//! store, adopt every stored slice, then bind the socket. Shutdown (SIGTERM,
//! SIGINT, or the future passed to [`Agent::serve`]) stops serving and the
//! tasks; slices and their files stay for the next start.

use crate::config::{NodeConfig, SIM_GPUS_ENV, SIM_STATE_ENV};
use crate::devices::{DeviceError, Gpus, Inventory, NvmlGpus};
use crate::lock::{LockError, RunDirLock};
use crate::simlib::{self, SimlibError};
use crate::slices::{SliceManager, SliceOpError};
use crate::store::{Store, StoreError};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot create run directory {path}")]
    RunDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("bad --simulate spec")]
    SimSpec(#[source] egpu_core::SimSpecError),
    #[error("egpud --simulate needs {SIM_GPUS_ENV}={spec} and {SIM_STATE_ENV} in its own environment before it loads the simulated NVML (the egpud binary sets them first thing in main)")]
    SimEnv { spec: String },
    #[error(transparent)]
    Simlib(#[from] SimlibError),
    #[error("the interposer library {path} does not exist: workloads would run without their limits; build it (cargo build --release -p egpu-hook) or pass --hook-lib PATH")]
    HookLib { path: PathBuf },
    #[error(transparent)]
    Devices(Box<DeviceError>),
    #[error("the simulated GPUs for --simulate {spec} did not start (the simulated driver's reason is on the line above); if {state} was made for another --simulate spec, remove it while egpud is stopped, or use another --run-dir")]
    SimStart { spec: String, state: String },
    #[error(transparent)]
    Store(Box<StoreError>),
    #[error("adopting the stored slices failed")]
    Adopt(#[source] Box<SliceOpError>),
    #[error("--cdi-dir")]
    Cdi(#[source] crate::cdi::CdiError),
    #[error("the container check {path} does not exist: a container of an image that cannot load the hook would run unlimited; build it (cargo build -p egpu-cdi-hook) or pass --cdi-hook PATH")]
    CdiHook { path: PathBuf },
    #[error("{path} exists and is not a socket; refusing to replace it (remove it or pass another --socket)")]
    NotASocket { path: PathBuf },
    #[error("something already listens on {path}; another egpud serves it (stop it or pass another --socket)")]
    SocketInUse { path: PathBuf },
    #[error("cannot listen on {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("gRPC server failed")]
    Serve(#[source] tonic::transport::Error),
}

/// Shared state of a running agent.
pub struct Node {
    pub config: NodeConfig,
    pub gpus: Box<dyn Gpus>,
    pub inventory: Inventory,
    /// What the compute arbiter computed at its last tick.
    pub compute: crate::arbiter_loop::ComputeStats,
    slices: Mutex<SliceManager>,
}

impl Node {
    /// The slice manager. Hold the guard briefly: every API call and task takes it.
    pub fn slices(&self) -> MutexGuard<'_, SliceManager> {
        // A panic while holding the lock leaves the manager consistent (every
        // mutation persists before it publishes), so keep serving.
        self.slices.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A periodic job of the agent. The sweeper is one; the compute arbiter
/// (which reads usage records and writes per-device budgets with
/// `LimitsWriter::set_budget`) is meant to be another.
pub trait NodeTask: Send + 'static {
    fn name(&self) -> &'static str;
    fn period(&self) -> Duration;
    fn tick(&mut self, node: &Node);
}

/// Reclaims dead processes' usage records, refreshes the agent heartbeat in
/// every limits file, and removes ephemeral slices whose owner died.
pub struct Sweeper {
    pub period: Duration,
}

impl NodeTask for Sweeper {
    fn name(&self) -> &'static str {
        "sweeper"
    }
    fn period(&self) -> Duration {
        self.period
    }
    fn tick(&mut self, node: &Node) {
        let mut m = node.slices();
        m.sweep();
        m.collect_orphans();
    }
}

/// nvidia_uvm's HMM switch, under the sysfs root.
const HMM_PARAM: &str = "module/nvidia_uvm/parameters/uvm_disable_hmm";

/// Whether nvidia_uvm leaves HMM (GPU access to pageable host memory, which
/// can migrate it into GPU memory) enabled: its `uvm_disable_hmm`
/// parameter under the sysfs root `sysfs`. `None`: no such module or
/// parameter (the module is not loaded, or predates HMM).
pub fn hmm_enabled(sysfs: &Path) -> Option<bool> {
    match crate::devices::read_small(&sysfs.join(HMM_PARAM))?.trim() {
        "N" | "0" => Some(true),
        "Y" | "1" => Some(false),
        _ => None,
    }
}

pub struct Agent {
    node: Arc<Node>,
    _lock: RunDirLock,
    tasks: Vec<Box<dyn NodeTask>>,
}

impl Agent {
    /// Starts on the node's GPUs (NVML, real or simulated per `config.simulate`).
    pub fn start(config: NodeConfig) -> Result<Agent, AgentError> {
        // Every workload gets it preloaded: without it nothing is enforced.
        if !config.hook_lib.is_file() {
            return Err(AgentError::HookLib { path: config.hook_lib.clone() });
        }
        let lock = lock_run_dir(&config.run_dir)?;
        // Before any usage file is mapped: a workload that truncates its
        // usage file must not kill egpud with SIGBUS (docs/threat-model.md).
        if let Err(e) = egpu_abi::map::install_truncation_guard() {
            tracing::warn!(error = %e, "cannot install the SIGBUS handler: a workload that truncates its usage file can stop egpud");
        }
        let (lib, sm_counts) = match &config.simulate {
            Some(spec) => {
                let parsed: egpu_core::SimSpec = spec.parse().map_err(AgentError::SimSpec)?;
                if std::env::var(SIM_GPUS_ENV).ok().as_deref() != Some(spec.as_str()) || std::env::var_os(SIM_STATE_ENV).is_none() {
                    return Err(AgentError::SimEnv { spec: spec.clone() });
                }
                let dir = simlib::link_dir(&config.run_dir, &config.sim_lib)?;
                (dir.join("libnvidia-ml.so.1"), parsed.devices.iter().map(|d| d.sm_count).collect())
            }
            None => (PathBuf::from("libnvidia-ml.so.1"), Vec::new()),
        };
        let gpus = NvmlGpus::load(&lib, sm_counts).map(|g| g.with_sysfs(config.sysfs.clone())).map_err(|e| match (&config.simulate, e) {
            // NVML's own error says nothing useful here ("an internal
            // driver error"); the simulated driver has said why.
            (Some(spec), DeviceError::Load { .. }) => {
                let state = std::env::var_os(SIM_STATE_ENV).map_or_else(|| "the simulated GPUs' state file".to_string(), |p| std::path::PathBuf::from(p).display().to_string());
                AgentError::SimStart { spec: spec.clone(), state }
            }
            (_, e) => AgentError::Devices(Box::new(e)),
        })?;
        if config.simulate.is_none()
            && let Some(root) = &config.sysfs
            && hmm_enabled(root) == Some(true)
        {
            tracing::warn!(param = HMM_PARAM,
                "nvidia_uvm does not disable HMM: where the kernel supports it, a GPU kernel can fault a workload's pageable host memory (malloc, mmap) into GPU memory, which no allocation call charges to its slice; load nvidia_uvm with uvm_disable_hmm=1 on shared nodes (docs/threat-model.md)");
        }
        Self::start_locked(config, Box::new(gpus), lock)
    }

    /// Starts on the given devices (tests use [`crate::devices::FakeGpus`]).
    pub fn start_with(config: NodeConfig, gpus: Box<dyn Gpus>) -> Result<Agent, AgentError> {
        let lock = lock_run_dir(&config.run_dir)?;
        Self::start_locked(config, gpus, lock)
    }

    fn start_locked(config: NodeConfig, gpus: Box<dyn Gpus>, lock: RunDirLock) -> Result<Agent, AgentError> {
        let inventory = gpus.inventory().map_err(|e| AgentError::Devices(Box::new(e)))?;
        for d in &inventory.devices {
            tracing::info!(index = d.index, uuid = %d.uuid, name = %d.name, memory = %egpu_core::Bytes(d.memory_bytes), "device");
        }
        let mounted = egpu_abi::paths::limits_path(Path::new(egpu_abi::paths::CONTAINER_SLICE_DIR));
        if mounted.exists() {
            tracing::warn!(path = %mounted.display(),
                "the hook of every workload on this host uses this slice table whatever EGPU_SLICE_DIR says (it is where a container's CDI spec mounts its slice); remove it unless egpud itself runs in such a container");
        }
        let store = Store::open(&config.state_dir).map_err(|e| AgentError::Store(Box::new(e)))?;
        let (mut mgr, report) = SliceManager::adopt_with(&config.run_dir, inventory.devices.clone(), store, config.unstored()).map_err(|e| AgentError::Adopt(Box::new(e)))?;
        if let Some(dir) = &config.cdi_dir {
            if !config.cdi_hook.is_file() {
                return Err(AgentError::CdiHook { path: config.cdi_hook.clone() });
            }
            let publisher = crate::cdi::CdiPublisher::new(&config, dir).map_err(AgentError::Cdi)?;
            mgr.set_cdi(publisher);
            tracing::info!(dir = %dir.display(), kind = crate::cdi::KIND, "keeping a CDI spec per slice");
        }
        tracing::info!(slices = report.adopted.len(), recreated_files = report.recreated.len(), not_adopted = report.failed.len(),
            restored_from_limits = report.restored.len(), taken_back = report.taken_back.len(), reclaimed_processes = report.reclaimed_processes, "adopted stored slices");
        let audit = config.memory_audit;
        mgr.set_audit(audit == crate::audit::AuditMode::Charge);
        let mut tasks: Vec<Box<dyn NodeTask>> = vec![Box::new(Sweeper { period: config.sweep_period() })];
        if audit != crate::audit::AuditMode::Off {
            tracing::info!(mode = %audit, slack = %egpu_core::Bytes(config.memory_audit_slack), "memory audit: the driver's per-process memory against the slices' charges, once a second");
            tasks.push(Box::new(crate::audit::MemoryAudit::new(config.memory_audit_slack)));
        }
        let node = Arc::new(Node { config, gpus, inventory, compute: Default::default(), slices: Mutex::new(mgr) });
        Ok(Agent { node, _lock: lock, tasks })
    }

    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Adds a periodic task (e.g. the compute arbiter).
    pub fn add_task(&mut self, task: Box<dyn NodeTask>) {
        self.tasks.push(task);
    }

    /// Serves the API until `shutdown` completes; then stops the tasks and removes the socket.
    pub async fn serve(self, shutdown: impl std::future::Future<Output = ()> + Send) -> Result<(), AgentError> {
        let path = self.node.config.socket_path();
        let listener = bind_socket(&path)?;
        tracing::info!(socket = %path.display(), "serving egpu.v1.Node");
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads: Vec<_> = self.tasks.into_iter().map(|t| spawn_task(t, self.node.clone(), stop.clone())).collect();
        threads.push(crate::arbiter_loop::spawn(self.node.clone(), stop.clone()));
        let svc = crate::service::NodeService::new(self.node.clone());
        let result = tonic::transport::Server::builder()
            .add_service(crate::proto::node_server::NodeServer::new(svc))
            .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), shutdown)
            .await;
        stop.store(true, Ordering::Release);
        for t in threads {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&path);
        tracing::info!("stopped; slices stay in place for the next start");
        result.map_err(AgentError::Serve)
    }
}

fn lock_run_dir(run_dir: &Path) -> Result<RunDirLock, AgentError> {
    std::fs::create_dir_all(run_dir).map_err(|source| AgentError::RunDir { path: run_dir.into(), source })?;
    Ok(RunDirLock::acquire(run_dir)?)
}

fn spawn_task(mut task: Box<dyn NodeTask>, node: Arc<Node>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name(format!("egpud-{}", task.name()))
        .spawn(move || {
            let period = task.period();
            let mut next = std::time::Instant::now();
            while !stop.load(Ordering::Acquire) {
                task.tick(&node);
                next += period;
                let now = std::time::Instant::now();
                if next < now {
                    next = now;
                }
                // Sleep in short steps so shutdown is prompt.
                while !stop.load(Ordering::Acquire) {
                    let left = next.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    std::thread::sleep(left.min(Duration::from_millis(50)));
                }
            }
        })
        .expect("spawning a thread")
}

/// Binds the unix socket, replacing a stale socket file but nothing else.
fn bind_socket(path: &Path) -> Result<tokio::net::UnixListener, AgentError> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(AgentError::NotASocket { path: path.into() });
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(AgentError::SocketInUse { path: path.into() });
        }
        tracing::info!(socket = %path.display(), "removing stale socket");
        let _ = std::fs::remove_file(path);
    }
    if let Some(parent) = path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    tokio::net::UnixListener::bind(path).map_err(|source| AgentError::Bind { path: path.into(), source })
}

/// Completes on SIGTERM or SIGINT. The handlers are installed by this call
/// (in a runtime), not when the future is first polled: a daemon that says
/// it is ready after calling it is never killed by a SIGTERM that comes
/// before its server got round to polling the future (the extender once
/// died of one sent right after its /healthz answered).
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmm_is_read_from_nvidia_uvms_parameter() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(hmm_enabled(root.path()), None, "no nvidia_uvm module");
        let p = root.path().join(HMM_PARAM);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        for (text, want) in [("N\n", Some(true)), ("Y\n", Some(false)), ("1", Some(false)), ("maybe", None)] {
            std::fs::write(&p, text).unwrap();
            assert_eq!(hmm_enabled(root.path()), want, "{text:?}");
        }
    }
}
