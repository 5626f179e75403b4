//! Graph memory nodes.
//!
//! Choice: a graph's memory-alloc nodes are charged when the graph is
//! *instantiated* (the sum of their sizes, per device), before the real
//! instantiation. A graph that does not fit fails to instantiate with
//! `CUDA_ERROR_OUT_OF_MEMORY`, so nothing has to be refused on the launch
//! path (which stays free of system calls). The driver keeps graph memory
//! in the device's graph memory pool after the executable is destroyed,
//! until `cuDeviceGraphMemTrim`, and reuses it for later graphs: per device
//! the slice is charged the larger of what live executables need and what
//! the pool still holds (`GraphAcct`; the driver's reserved size, asked at
//! every destroy and trim), so an instantiation charges only what the pool
//! does not already cover, and destroying a graph frees only what the pool
//! gave back. Pool memory in use (`CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`)
//! beyond what the live executables are charged is not counted as
//! reusable: an allocation a graph did not free outlives the graph
//! ([`crate::ledger::GraphAcct::instantiate`]). Live graphs that could share physical
//! memory are charged each in full (an over-charge).
//!
//! The nodes are found by walking the graph (`cuGraphGetNodes`, child graphs
//! included), which covers nodes made by stream capture as well as by
//! `cuGraphAddMemAllocNode`; where the driver cannot enumerate, the nodes
//! recorded by our `cuGraphAddMemAllocNode` are used.

use super::drv::real as drv;
use super::sig;
use crate::detour::Outcome;
use crate::devmap;
use crate::ledger::{Charge, LEDGER};
use crate::state::{charge, uncharge};
use egpu_cuda::{
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, CU_GRAPH_NODE_TYPE_GRAPH, CU_GRAPH_NODE_TYPE_MEM_ALLOC, CUDA_MEM_ALLOC_NODE_PARAMS, CUdevice, CUgraph, CUgraphExec,
    CUgraphNode, CUresult,
};
use std::ffi::{c_char, c_void};

fn node_charge(p: &CUDA_MEM_ALLOC_NODE_PARAMS) -> Result<Charge, CUresult> {
    let loc = p.poolProps.location;
    let dev = match devmap::placed(loc)? {
        devmap::Placed::Device(d) => d,
        _ => devmap::current()?.1,
    };
    Ok(Charge { dev, bytes: p.bytesize as u64 })
}

/// The memory-alloc nodes of `graph` and its child graphs, or `None` if the
/// driver cannot enumerate them.
fn walk(graph: CUgraph, out: &mut Vec<Charge>, depth: u32) -> Option<Result<(), CUresult>> {
    let (nodes_f, type_f, params_f, child_f) = (drv::cuGraphGetNodes.get()?, drv::cuGraphNodeGetType.get()?, drv::cuGraphMemAllocNodeGetParams.get()?, drv::cuGraphChildGraphNodeGetGraph.get()?);
    if depth > 16 {
        return Some(Ok(()));
    }
    let mut n: usize = 0;
    // SAFETY: with a null array the driver only writes the count.
    if unsafe { nodes_f(graph, std::ptr::null_mut(), &mut n) } != 0 {
        return None;
    }
    let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); n];
    // SAFETY: `nodes` has room for `n` handles.
    if unsafe { nodes_f(graph, nodes.as_mut_ptr(), &mut n) } != 0 {
        return None;
    }
    nodes.truncate(n);
    for node in nodes {
        let mut t: u32 = 0;
        // SAFETY: writes one node type.
        if unsafe { type_f(node, &mut t) } != 0 {
            return None;
        }
        if t == CU_GRAPH_NODE_TYPE_MEM_ALLOC {
            // SAFETY: all-zero is a valid value of this plain C struct, then the driver fills it.
            let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
            // SAFETY: writes the node's parameters into `p`.
            if unsafe { params_f(node, &mut p) } != 0 {
                return None;
            }
            match node_charge(&p) {
                Ok(c) => out.push(c),
                Err(e) => return Some(Err(e)),
            }
        } else if t == CU_GRAPH_NODE_TYPE_GRAPH {
            let mut child: CUgraph = std::ptr::null_mut();
            // SAFETY: writes the child graph handle.
            if unsafe { child_f(node, &mut child) } != 0 {
                return None;
            }
            match walk(child, out, depth + 1)? {
                Ok(()) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }
    Some(Ok(()))
}

fn graph_charges(graph: CUgraph) -> Result<Vec<Charge>, CUresult> {
    let mut out = Vec::new();
    match walk(graph, &mut out, 0) {
        Some(Ok(())) => Ok(out),
        Some(Err(e)) => Err(e),
        None => Ok(LEDGER.lock().graph_nodes.get(&(graph as usize)).cloned().unwrap_or_default()),
    }
}

/// Per slice device, the bytes of `charges`.
fn per_device(charges: &[Charge]) -> Vec<Charge> {
    let mut out: Vec<Charge> = Vec::new();
    for c in charges {
        match out.iter_mut().find(|o| o.dev == c.dev) {
            Some(o) => o.bytes = o.bytes.saturating_add(c.bytes),
            None => out.push(*c),
        }
    }
    out
}

/// Takes back `need`'s instantiation on every device in `done` (the extras
/// that were charged are uncharged).
fn undo(done: &[(Charge, u64)]) {
    let mut l = LEDGER.lock();
    for (need, extra) in done {
        l.graph_mem.entry(need.dev).or_default().undo_instantiate(need.bytes, *extra);
    }
    drop(l);
    for (need, extra) in done {
        uncharge(need.dev, *extra);
    }
}

fn instantiate(exec: *mut CUgraphExec, graph: CUgraph, real: impl FnOnce() -> u32) -> Outcome {
    let charges = match graph_charges(graph) {
        Ok(c) => c,
        Err(e) => return Outcome::Error(e),
    };
    // Only what the device's graph memory pool does not already hold for
    // this process is charged (a destroyed graph's memory stays there and
    // is reused). The accounting moves first, under the ledger's lock, so
    // concurrent instantiations each charge their own part.
    let mut done: Vec<(Charge, u64)> = Vec::new();
    for need in per_device(&charges) {
        let in_use = pool_attr(need.dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT).unwrap_or(0);
        let extra = LEDGER.lock().graph_mem.entry(need.dev).or_default().instantiate(need.bytes, in_use);
        if extra > 0
            && let Err(e) = charge(need.dev, extra)
        {
            // Not charged here: only the accounting is undone on this device.
            LEDGER.lock().graph_mem.entry(need.dev).or_default().undo_instantiate(need.bytes, extra);
            undo(&done);
            return Outcome::Error(e);
        }
        done.push((need, extra));
    }
    let r = real();
    if r != 0 || exec.is_null() {
        undo(&done);
        return Outcome::from_code(r);
    }
    // SAFETY: on success the driver wrote the exec handle.
    let e = unsafe { *exec } as usize;
    if !charges.is_empty() {
        LEDGER.lock().graph_execs.insert(e, charges);
    }
    Outcome::Success
}

/// A size of the device's graph memory pool now, from the driver: what it
/// holds (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`) or what of it is
/// allocated (`CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`); `None` if it cannot
/// say, or the device is not known.
fn pool_attr(dev: usize, attr: std::ffi::c_uint) -> Option<u64> {
    let ordinal = devmap::ordinal_of(dev)?;
    let f = drv::cuDeviceGetGraphMemAttribute.get()?;
    let mut v: u64 = 0;
    // SAFETY: both attributes are 64-bit values written into `v`.
    (unsafe { f(ordinal, attr, (&mut v as *mut u64).cast()) } == 0).then_some(v)
}

/// Settles the graph memory charge of `dev` after `need` bytes of live
/// executables went (0 for a trim).
fn settle(dev: usize, need: u64) {
    let reserved = pool_attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT);
    let freed = LEDGER.lock().graph_mem.entry(dev).or_default().settle(need, reserved);
    crate::state::uncharge_freed(dev, freed);
}

/// `cuGraphInstantiateWithFlags`.
#[doc(alias = "cuGraphInstantiateWithFlags")]
pub(crate) fn instantiate_with_flags(real: sig::cuGraphInstantiateWithFlags, exec: *mut CUgraphExec, graph: CUgraph, flags: u64) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    instantiate(exec, graph, || unsafe { real(exec, graph, flags) })
}

/// `cuGraphInstantiate_v2` (the form with an error node and log buffer).
#[doc(alias = "cuGraphInstantiate_v2")]
pub(crate) fn instantiate_v2(real: sig::cuGraphInstantiate_v2, exec: *mut CUgraphExec, graph: CUgraph, err_node: *mut CUgraphNode, log: *mut c_char, log_size: usize) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    instantiate(exec, graph, || unsafe { real(exec, graph, err_node, log, log_size) })
}

/// `cuGraphInstantiateWithParams` / `_ptsz`.
#[doc(alias = "cuGraphInstantiateWithParams")]
pub(crate) fn instantiate_with_params(real: sig::cuGraphInstantiateWithParams, exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    instantiate(exec, graph, || unsafe { real(exec, graph, params) })
}

/// `cuGraphExecDestroy`: the executable's graph memory is no longer needed
/// by it, but the driver keeps it in the device's graph memory pool; the
/// charge follows what the pool holds (the driver's reserved size), so
/// destroying and re-creating graphs cannot take memory past the limit. The
/// entry leaves the ledger before the real call (the exec handle may be
/// reused by another thread's instantiation as soon as it is destroyed) and
/// is put back if the call fails.
#[doc(alias = "cuGraphExecDestroy")]
pub(crate) fn exec_destroy(real: sig::cuGraphExecDestroy, exec: CUgraphExec) -> Outcome {
    let charges = LEDGER.lock().graph_execs.remove(&(exec as usize));
    // SAFETY: the real function with the caller's argument.
    let r = unsafe { real(exec) };
    match charges {
        Some(cs) if r == 0 => {
            for need in per_device(&cs) {
                settle(need.dev, need.bytes);
            }
        }
        Some(cs) => {
            LEDGER.lock().graph_execs.insert(exec as usize, cs);
        }
        None => {}
    }
    Outcome::from_code(r)
}

/// `cuDeviceGraphMemTrim`: the pool gives back what no graph uses; the
/// charge follows it down.
#[doc(alias = "cuDeviceGraphMemTrim")]
pub(crate) fn trim(real: sig::cuDeviceGraphMemTrim, device: CUdevice) -> Outcome {
    // SAFETY: the real function with the caller's argument.
    let r = unsafe { real(device) };
    if r == 0
        && let Ok(dev) = devmap::slice_dev(device)
    {
        settle(dev, 0);
    }
    Outcome::from_code(r)
}

/// `cuGraphAddMemAllocNode`: records the node for drivers that cannot enumerate.
#[doc(alias = "cuGraphAddMemAllocNode")]
pub(crate) fn add_mem_alloc_node(real: sig::cuGraphAddMemAllocNode, node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, ndeps: usize, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    let r = unsafe { real(node, graph, deps, ndeps, params) };
    if r == 0 && !params.is_null() {
        // SAFETY: the caller's params (non-null), which the driver updated.
        let p = unsafe { *params };
        if let Ok(c) = node_charge(&p) {
            LEDGER.lock().graph_nodes.entry(graph as usize).or_default().push(c);
        }
    }
    Outcome::from_code(r)
}

/// `cuGraphDestroy`: forgets recorded nodes.
#[doc(alias = "cuGraphDestroy")]
pub(crate) fn destroy(real: sig::cuGraphDestroy, graph: CUgraph) -> Outcome {
    // Taken first, as for exec handles: the graph handle may be reused at once.
    let nodes = LEDGER.lock().graph_nodes.remove(&(graph as usize));
    // SAFETY: the real function with the caller's argument.
    let r = unsafe { real(graph) };
    if r != 0
        && let Some(n) = nodes
    {
        LEDGER.lock().graph_nodes.insert(graph as usize, n);
    }
    Outcome::from_code(r)
}
