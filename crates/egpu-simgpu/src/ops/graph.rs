//! Minimal CUDA graphs: kernel, empty, memory-allocation and memory-free
//! nodes, stream capture of kernel launches, instantiate and launch.
//!
//! A graph launch is one kernel on the device lasting the sum of its kernel
//! nodes. Graph memory: an allocation node reserves its address range when
//! added (uncharged); running it makes the bytes "used" in the device's
//! graph-memory pool, whose reservation grows (and is charged) as needed and
//! shrinks only at `cuDeviceGraphMemTrim`. A free node, `cuMemFree` or
//! `cuMemFreeAsync` of the pointer makes the bytes unused again.

use crate::cptr::{R, read, write, write_at};
use crate::ops::{launch, memory, stream};
use crate::rt::{Graph, Inner, Kind, Node, Proc, cu, new_handle};
use egpu_cuda::*;
use std::ffi::c_void;

pub fn create(out: *mut CUgraph, _flags: u32) -> R<()> {
    let p = cu()?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = new_handle();
    p.lock().graphs.insert(h, Graph::default());
    write(out, h as CUgraph)
}

pub fn destroy(g: CUgraph) -> R<()> {
    let p = cu()?;
    p.lock().graphs.remove(&(g as u64)).map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE)
}

fn add(p: &Proc, graph: CUgraph, out: *mut CUgraphNode, node: Node) -> R<()> {
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    let gr = g.graphs.get_mut(&(graph as u64)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let h = new_handle();
    gr.nodes.push((h, node));
    write(out, h as CUgraphNode)
}

pub fn add_kernel_node(out: *mut CUgraphNode, graph: CUgraph, params: *const CUDA_KERNEL_NODE_PARAMS) -> R<()> {
    let p = cu()?;
    let k = read(params)?;
    let threads = launch::threads([k.gridDimX, k.gridDimY, k.gridDimZ], [k.blockDimX, k.blockDimY, k.blockDimZ])?;
    add(p, graph, out, Node::Kernel { threads })
}

pub fn add_empty_node(out: *mut CUgraphNode, graph: CUgraph) -> R<()> {
    add(cu()?, graph, out, Node::Empty)
}

pub fn add_mem_alloc_node(out: *mut CUgraphNode, graph: CUgraph, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> R<()> {
    let p = cu()?;
    let mut pr = read(params)?;
    let loc = super::whole_device(pr.poolProps.location)?;
    if loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE || pr.bytesize == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let phys = p.phys(loc.id)?;
    let ord = loc.id as usize;
    let size = pr.bytesize as u64;
    let dptr = {
        let mut g = p.lock();
        if !g.graphs.contains_key(&(graph as u64)) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = memory::cur(&g).map(|c| c.0).unwrap_or(0);
        memory::alloc_arena_on(p, &mut g, ctx, ord, phys, size, Kind::GraphAlloc, 0)?
    };
    pr.dptr = dptr;
    write(params, pr)?;
    add(p, graph, out, Node::MemAlloc { dptr, size, ord })
}

pub fn add_mem_free_node(out: *mut CUgraphNode, graph: CUgraph, dptr: CUdeviceptr) -> R<()> {
    add(cu()?, graph, out, Node::MemFree { dptr })
}

/// The graph a call on stream `r` is captured into: `None` when the stream
/// is not capturing, `Err` when its capture was invalidated (the call fails).
pub fn capture_graph(g: &Inner, r: stream::SRef) -> Option<R<u64>> {
    let c = crate::ops::capture::of(g, r)?;
    Some(if c.invalid { Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) } else { Ok(c.graph) })
}

/// An allocation made on a capturing stream (`cuMemAllocAsync`,
/// `cuMemAllocFromPoolAsync`): as the driver documents, it becomes a
/// memory-allocation node of the capture's graph, owned by the graph and
/// not by any pool (its range is reserved now, its memory used when the
/// graph runs). `None`: the stream is not capturing.
pub fn captured_alloc(p: &Proc, g: &mut Inner, r: stream::SRef, ord: usize, phys: usize, size: u64) -> Option<R<u64>> {
    let graph = capture_graph(g, r)?;
    Some(graph.and_then(|graph| {
        let dptr = memory::alloc_arena_on(p, g, r.ctx(g), ord, phys, size, Kind::GraphAlloc, 0)?;
        g.graphs.entry(graph).or_default().nodes.push((new_handle(), Node::MemAlloc { dptr, size, ord }));
        Ok(dptr)
    }))
}

/// A free made on a capturing stream (`cuMemFreeAsync`): a memory-free
/// node of the capture's graph. `None`: the stream is not capturing.
pub fn captured_free(g: &mut Inner, r: stream::SRef, dptr: CUdeviceptr) -> Option<R<()>> {
    let graph = capture_graph(g, r)?;
    Some(graph.map(|graph| g.graphs.entry(graph).or_default().nodes.push((new_handle(), Node::MemFree { dptr }))))
}

/// `cuGraphGetNodes`: the graph's nodes, in the order they were added.
pub fn get_nodes(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let gr = g.graphs.get(&(graph as u64)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if !nodes.is_null() {
        let room = read(count)?;
        for (i, (h, _)) in gr.nodes.iter().take(room).enumerate() {
            write_at(nodes, i, *h as CUgraphNode)?;
        }
    }
    write(count, gr.nodes.len())
}

fn node(g: &Inner, n: CUgraphNode) -> R<Node> {
    g.graphs.values().flat_map(|gr| gr.nodes.iter()).find(|(h, _)| *h == n as u64).map(|(_, k)| k.clone()).ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// `cuGraphNodeGetType`.
pub fn node_get_type(n: CUgraphNode, out: *mut u32) -> R<()> {
    let p = cu()?;
    let t = match node(&p.lock(), n)? {
        Node::Kernel { .. } => CU_GRAPH_NODE_TYPE_KERNEL,
        Node::MemAlloc { .. } => CU_GRAPH_NODE_TYPE_MEM_ALLOC,
        Node::MemFree { .. } => CU_GRAPH_NODE_TYPE_MEM_FREE,
        Node::Empty => CU_GRAPH_NODE_TYPE_EMPTY,
    };
    write(out, t)
}

/// `cuGraphMemAllocNodeGetParams`: device memory of the node's size and address.
pub fn mem_alloc_node_get_params(n: CUgraphNode, out: *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> R<()> {
    let p = cu()?;
    let Node::MemAlloc { dptr, size, ord } = node(&p.lock(), n)? else { return Err(CUDA_ERROR_INVALID_VALUE) };
    // SAFETY: all-zero bytes are a valid value of this plain C struct.
    let mut pr: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
    pr.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pr.poolProps.location = CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: ord as i32 };
    pr.bytesize = size as usize;
    pr.dptr = dptr;
    write(out, pr)
}

pub fn instantiate(out: *mut CUgraphExec, graph: CUgraph) -> R<()> {
    let p = cu()?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    let nodes = g.graphs.get(&(graph as u64)).ok_or(CUDA_ERROR_INVALID_VALUE)?.nodes.clone();
    let h = new_handle();
    g.execs.insert(h, Graph { nodes });
    write(out, h as CUgraphExec)
}

pub fn exec_destroy(e: CUgraphExec) -> R<()> {
    let p = cu()?;
    p.lock().execs.remove(&(e as u64)).map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE)
}

fn graph_alloc_used(p: &Proc, g: &mut Inner, dptr: u64, live: bool) -> R<()> {
    let a = g.allocs.get_mut(&dptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let was = a.host_flags == 1;
    if was == live {
        return Ok(());
    }
    a.host_flags = live as u32;
    let (phys, ord, size) = (a.phys, a.ord, a.size);
    let gm = g.graph_mem.entry(ord).or_default();
    if live {
        gm.used += size;
        if gm.used > gm.reserved {
            if !p.shm.charge(&p.locks, p.slot, phys, gm.used - gm.reserved) {
                gm.used -= size;
                if let Some(a) = g.allocs.get_mut(&dptr) {
                    a.host_flags = 0;
                }
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            gm.reserved = gm.used;
        }
    } else {
        gm.used = gm.used.saturating_sub(size);
    }
    gm.used_high = gm.used_high.max(gm.used);
    gm.reserved_high = gm.reserved_high.max(gm.reserved);
    Ok(())
}

/// `cuMemFree` / `cuMemFreeAsync` of a graph allocation.
pub fn free_alloc(p: &Proc, g: &mut Inner, base: u64) -> R<()> {
    graph_alloc_used(p, g, base, false)
}

pub fn launch(e: CUgraphExec, s: CUstream, ptsz: bool) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let nodes = g.execs.get(&(e as u64)).ok_or(CUDA_ERROR_INVALID_VALUE)?.nodes.clone();
    let r = stream::resolve(&g, s, ptsz)?;
    let mut threads = 0u64;
    for (_, n) in &nodes {
        match *n {
            Node::Kernel { threads: t } => threads += t,
            Node::MemAlloc { dptr, .. } => graph_alloc_used(p, &mut g, dptr, true)?,
            Node::MemFree { dptr } => graph_alloc_used(p, &mut g, dptr, false)?,
            Node::Empty => {}
        }
    }
    let dur = launch::duration(p, threads);
    launch::enqueue(p, &mut g, r, dur);
    Ok(())
}

pub fn device_graph_mem_trim(dev: CUdevice) -> R<()> {
    let p = cu()?;
    let phys = p.phys(dev)?;
    let mut g = p.lock();
    let gm = g.graph_mem.entry(dev as usize).or_default();
    p.shm.uncharge(p.slot, phys, gm.reserved - gm.used);
    gm.reserved = gm.used;
    Ok(())
}

pub fn get_graph_mem_attribute(dev: CUdevice, attr: u32, value: *mut c_void) -> R<()> {
    let p = cu()?;
    p.phys(dev)?;
    let mut g = p.lock();
    let gm = g.graph_mem.entry(dev as usize).or_default();
    let v = match attr {
        CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT => gm.used,
        CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => gm.used_high,
        CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT => gm.reserved,
        CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => gm.reserved_high,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    write(value as *mut u64, v)
}

pub fn set_graph_mem_attribute(dev: CUdevice, attr: u32, value: *mut c_void) -> R<()> {
    let p = cu()?;
    p.phys(dev)?;
    if read(value as *const u64)? != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    let gm = g.graph_mem.entry(dev as usize).or_default();
    match attr {
        CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => gm.used_high = gm.used,
        CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => gm.reserved_high = gm.reserved,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    Ok(())
}

