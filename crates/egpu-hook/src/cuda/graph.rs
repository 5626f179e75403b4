//! Graph memory nodes.
//!
//! Choice: a graph's memory-alloc nodes are charged when the graph is
//! *instantiated* (the sum of their sizes, per device), before the real
//! instantiation, and uncharged when the executable graph is destroyed. A
//! graph that does not fit fails to instantiate with
//! `CUDA_ERROR_OUT_OF_MEMORY`, so nothing has to be refused on the launch
//! path (which stays free of system calls). The driver may reuse physical
//! memory between graphs, so this over-charges rather than under-charges.
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
use egpu_cuda::{CU_GRAPH_NODE_TYPE_GRAPH, CU_GRAPH_NODE_TYPE_MEM_ALLOC, CU_MEM_LOCATION_TYPE_DEVICE, CUDA_MEM_ALLOC_NODE_PARAMS, CUgraph, CUgraphExec, CUgraphNode, CUresult};
use std::ffi::{c_char, c_void};

fn node_charge(p: &CUDA_MEM_ALLOC_NODE_PARAMS) -> Result<Charge, CUresult> {
    let loc = p.poolProps.location;
    let dev = if loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE { devmap::slice_dev(loc.id)? } else { devmap::current()?.1 };
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

fn instantiate(exec: *mut CUgraphExec, graph: CUgraph, real: impl FnOnce() -> u32) -> Outcome {
    let charges = match graph_charges(graph) {
        Ok(c) => c,
        Err(e) => return Outcome::Error(e),
    };
    for (i, c) in charges.iter().enumerate() {
        if let Err(e) = charge(c.dev, c.bytes) {
            for d in &charges[..i] {
                uncharge(d.dev, d.bytes);
            }
            return Outcome::Error(e);
        }
    }
    let r = real();
    if r != 0 || exec.is_null() {
        for d in &charges {
            uncharge(d.dev, d.bytes);
        }
        return Outcome::from_code(r);
    }
    // SAFETY: on success the driver wrote the exec handle.
    let e = unsafe { *exec } as usize;
    if !charges.is_empty() {
        LEDGER.lock().graph_execs.insert(e, charges);
    }
    Outcome::Success
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

/// `cuGraphExecDestroy`: uncharges what instantiation charged. The entry
/// leaves the ledger before the real call (the exec handle may be reused by
/// another thread's instantiation as soon as it is destroyed) and is put back
/// if the call fails.
#[doc(alias = "cuGraphExecDestroy")]
pub(crate) fn exec_destroy(real: sig::cuGraphExecDestroy, exec: CUgraphExec) -> Outcome {
    let charges = LEDGER.lock().graph_execs.remove(&(exec as usize));
    // SAFETY: the real function with the caller's argument.
    let r = unsafe { real(exec) };
    match charges {
        Some(cs) if r == 0 => {
            for c in cs {
                uncharge(c.dev, c.bytes);
            }
        }
        Some(cs) => {
            LEDGER.lock().graph_execs.insert(exec as usize, cs);
        }
        None => {}
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
