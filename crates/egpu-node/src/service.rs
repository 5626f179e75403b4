//! The gRPC service `egpu.v1.Node`. Handlers decode, run the slice operation
//! on a blocking thread (store writes are fsynced), and encode.

use crate::agent::Node;
use crate::proto::{self, node_server};
use crate::wire;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct NodeService {
    node: Arc<Node>,
}

impl NodeService {
    pub fn new(node: Arc<Node>) -> NodeService {
        NodeService { node }
    }

    async fn blocking<T: Send + 'static>(&self, f: impl FnOnce(&Node) -> Result<T, Status> + Send + 'static) -> Result<Response<T>, Status> {
        let node = self.node.clone();
        match tokio::task::spawn_blocking(move || f(&node)).await {
            Ok(r) => r.map(Response::new),
            Err(e) => Err(Status::internal(format!("request handler failed: {e}"))),
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
}

#[tonic::async_trait]
impl node_server::Node for NodeService {
    async fn get_node(&self, _: Request<proto::GetNodeRequest>) -> Result<Response<proto::GetNodeResponse>, Status> {
        self.blocking(|node| {
            let (alloc, count, lent, unmanaged) = {
                let m = node.slices();
                let unmanaged: Vec<Option<u64>> = node.inventory.devices.iter().map(|d| m.unmanaged(d.index)).collect();
                (m.allocated(), m.slices().count(), crate::burst::lent(&m), unmanaged)
            };
            let devices = node
                .inventory
                .devices
                .iter()
                .map(|d| {
                    let a = alloc.get(d.index as usize).copied().unwrap_or_default();
                    proto::Device {
                        index: d.index,
                        uuid: d.uuid.clone(),
                        name: d.name.clone(),
                        memory_bytes: d.memory_bytes,
                        sm_count: d.sm_count,
                        allocated_memory_bytes: a.memory,
                        allocated_compute_bps: a.compute_share_bps,
                        driver_used_bytes: node.gpus.used_bytes(d.index).unwrap_or(0),
                        lent_memory_bytes: lent.get(d.index as usize).copied().unwrap_or(0),
                        unmanaged_bytes: unmanaged.get(d.index as usize).copied().flatten(),
                        nvlink_group: d.nvlink_group,
                        pci_bus_id: d.pci_bus_id.clone(),
                        numa_node: d.numa_node,
                        pcie_root: d.pcie_root.clone(),
                        pcie_switch_group: d.pcie_switch_group,
                    }
                })
                .collect();
            Ok(proto::GetNodeResponse {
                hostname: hostname(),
                simulated: node.config.simulate.is_some(),
                simulate_spec: node.config.simulate.clone().unwrap_or_default(),
                devices,
                agent_version: env!("CARGO_PKG_VERSION").into(),
                abi_version: egpu_abi::ABI_VERSION,
                driver_version: node.inventory.driver_version.clone(),
                run_dir: node.config.run_dir.display().to_string(),
                slice_count: count as u32,
            })
        })
        .await
    }

    async fn create_slice(&self, req: Request<proto::CreateSliceRequest>) -> Result<Response<proto::Slice>, Status> {
        let mut create = wire::decode_create(req.get_ref())?;
        let peer = peer_pid(&req);
        self.blocking(move |node| {
            if let Some(pid) = create.owner_pid {
                create.owner_pid = Some(caller_pid(peer, pid, "owner_pid")?);
            }
            let mut m = node.slices();
            let s = m.create(create)?;
            Ok(wire::with_compute(wire::slice_to_wire(s), node.compute.slice(s.name())))
        })
        .await
    }

    async fn resize_slice(&self, req: Request<proto::ResizeSliceRequest>) -> Result<Response<proto::Slice>, Status> {
        let resize = wire::decode_resize(req.get_ref())?;
        let name = req.into_inner().name;
        self.blocking(move |node| {
            let mut m = node.slices();
            let s = m.resize(&name, resize)?;
            node.compute.resized();
            Ok(wire::with_compute(wire::slice_to_wire(s), node.compute.slice(s.name())))
        })
        .await
    }

    async fn delete_slice(&self, req: Request<proto::DeleteSliceRequest>) -> Result<Response<proto::DeleteSliceResponse>, Status> {
        let r = req.into_inner();
        self.blocking(move |node| {
            let attached_pids = node.slices().delete(&r.name, r.force)?;
            Ok(proto::DeleteSliceResponse { attached_pids })
        })
        .await
    }

    async fn list_slices(&self, _: Request<proto::ListSlicesRequest>) -> Result<Response<proto::ListSlicesResponse>, Status> {
        self.blocking(|node| {
            let m = node.slices();
            Ok(proto::ListSlicesResponse {
                slices: m.slices().map(|s| wire::with_compute(wire::slice_to_wire(s), node.compute.slice(s.name()))).collect(),
                unadopted: m.unadopted().map(|u| proto::UnadoptedSlice { name: u.record.spec.name.clone(), id: u.record.id.clone(), error: u.error.clone() }).collect(),
            })
        })
        .await
    }

    async fn get_slice(&self, req: Request<proto::GetSliceRequest>) -> Result<Response<proto::Slice>, Status> {
        let name = req.into_inner().name;
        self.blocking(move |node| {
            let m = node.slices();
            let s = m.get(&name)?;
            Ok(wire::with_compute(wire::slice_to_wire(s), node.compute.slice(s.name())))
        })
        .await
    }

    async fn launch_env(&self, req: Request<proto::LaunchEnvRequest>) -> Result<Response<proto::LaunchEnvResponse>, Status> {
        let name = req.into_inner().name;
        self.blocking(move |node| {
            let m = node.slices();
            let s = m.get(&name)?;
            let env = crate::launch::launch_env(&node.config, &s.dir, &s.record.device_uuids);
            Ok(proto::LaunchEnvResponse { env: env.into_iter().map(wire::env_to_wire).collect() })
        })
        .await
    }

    async fn set_workload(&self, req: Request<proto::SetWorkloadRequest>) -> Result<Response<proto::Slice>, Status> {
        let peer = peer_pid(&req);
        let r = req.into_inner();
        self.blocking(move |node| {
            let r = proto::SetWorkloadRequest { pid: caller_pid(peer, r.pid, "pid")?, ..r };
            let mut m = node.slices();
            let s = m.set_workload(&r.name, r.pid)?;
            Ok(wire::with_compute(wire::slice_to_wire(s), node.compute.slice(s.name())))
        })
        .await
    }
}

/// The caller's pid as egpud's namespace sees it, from `SO_PEERCRED` on the
/// unix socket (0: a process egpud cannot see). Taken when the connection
/// was accepted: the CLI makes its requests itself and waits for them.
fn peer_pid<T>(req: &Request<T>) -> Option<u32> {
    req.extensions()
        .get::<tonic::transport::server::UdsConnectInfo>()
        .and_then(|c| c.peer_cred)
        .and_then(|c| c.pid())
        .and_then(|p| u32::try_from(p).ok())
}

/// A pid the caller sent, as egpud's pid namespace sees it: a CLI in a
/// container numbers processes in its own namespace (`owner::translate`,
/// which reads `/proc`: call it off the async workers).
fn caller_pid(peer: Option<u32>, pid: u32, field: &str) -> Result<u32, Status> {
    crate::owner::translate(peer, pid).map_err(|e| Status::invalid_argument(format!("{field} {pid}: {e}")))
}
