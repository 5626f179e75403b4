//! Mapping real driver pointers to our detours, for `dlsym` and
//! `cuGetProcAddress`.
//!
//! The table pairs the real library's address of every intercepted versioned
//! symbol (looked up with the real `dlsym` on the real library handle) with
//! our detour of the same symbol. A pointer the driver hands out is replaced
//! only if it is exactly one of those addresses, so the caller always gets a
//! detour with the signature it asked for (`_v2`/`_v3`, `_ptsz`/`_ptds`, or
//! the v1 entry for an old `cudaVersion`).

use crate::detour::Hook;
use crate::real::Lib;
use once_cell::race::OnceBox;

static CUDA_MAP: OnceBox<Vec<(usize, usize)>> = OnceBox::new();
static NVML_MAP: OnceBox<Vec<(usize, usize)>> = OnceBox::new();

fn build(hooks: &[Hook]) -> Vec<(usize, usize)> {
    let mut v: Vec<(usize, usize)> = hooks.iter().map(|h| ((h.real)(), (h.hook)())).filter(|&(r, _)| r != 0).collect();
    v.sort_unstable();
    v.dedup_by_key(|e| e.0);
    v
}

fn table(lib: Lib) -> &'static [(usize, usize)] {
    match lib {
        Lib::Cuda => CUDA_MAP.get_or_init(|| Box::new(build(crate::cuda::HOOKS))),
        Lib::Nvml => NVML_MAP.get_or_init(|| Box::new(build(crate::nvml::HOOKS))),
    }
}

/// Our detour for real pointer `p`, or `p` itself when we do not intercept it.
pub fn map_pointer(lib: Lib, p: usize) -> usize {
    let t = table(lib);
    match t.binary_search_by_key(&p, |e| e.0) {
        Ok(i) => t[i].1,
        Err(_) => p,
    }
}

/// Whether `p` is one of our detours.
pub fn is_hook(lib: Lib, p: usize) -> bool {
    table(lib).iter().any(|e| e.1 == p)
}

/// Base names (without `_vN`/`_ptsz`/`_ptds`) of the memory entry points whose
/// every version we intercept. If `cuGetProcAddress` hands out a pointer for
/// one of them that is none of the real addresses we know, the caller would
/// escape accounting, so the request is refused instead.
const GUARDED: &[&str] = &[
    "cuMemAlloc", "cuMemAllocPitch", "cuMemAllocManaged", "cuMemFree", "cuMemGetInfo", "cuDeviceTotalMem",
    "cuArrayCreate", "cuArray3DCreate", "cuArrayDestroy", "cuMipmappedArrayCreate", "cuMipmappedArrayDestroy",
    "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemFreeAsync", "cuMemPoolCreate", "cuMemPoolDestroy", "cuMemPoolTrimTo",
    "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemRetainAllocationHandle", "cuMulticastCreate",
    "cuMemMapArrayAsync",
    "cuGraphAddMemAllocNode", "cuGraphInstantiate", "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams", "cuGraphExecDestroy",
    "cuCtxCreate", "cuCtxDestroy", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxReset",
    "cuGreenCtxCreate", "cuGreenCtxDestroy",
    "cuGetProcAddress",
    // Launches: an unknown pointer would escape the compute gate.
    "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernelMultiDevice", "cuGraphLaunch",
    "cuLaunch", "cuLaunchGrid", "cuLaunchGridAsync",
    // Captures: an unknown pointer would leave a capture uncounted, and the
    // gate would then record its events into the captured graph.
    "cuStreamBeginCapture", "cuStreamBeginCaptureToGraph", "cuStreamBeginRecaptureToGraph", "cuStreamEndCapture",
];

/// The base name of a versioned symbol name, for the `GUARDED` check only.
pub fn base_name(name: &str) -> &str {
    let mut n = name;
    for suffix in ["_ptsz", "_ptds"] {
        if let Some(s) = n.strip_suffix(suffix) {
            n = s;
        }
    }
    if let Some(i) = n.rfind("_v")
        && n[i + 2..].chars().all(|c| c.is_ascii_digit())
        && i + 2 < n.len()
    {
        n = &n[..i];
    }
    n
}

/// Whether a pointer the driver returned for `name` must not be handed out.
pub fn refuse_unknown(name: &str, returned: usize) -> bool {
    GUARDED.contains(&base_name(name)) && !is_hook(Lib::Cuda, map_pointer(Lib::Cuda, returned))
}

#[cfg(test)]
mod tests {
    use super::base_name;

    #[test]
    fn base_names() {
        assert_eq!(base_name("cuMemAlloc_v2"), "cuMemAlloc");
        assert_eq!(base_name("cuMemAllocAsync_ptsz"), "cuMemAllocAsync");
        assert_eq!(base_name("cuCtxCreate_v4"), "cuCtxCreate");
        assert_eq!(base_name("cuMemcpy_ptds"), "cuMemcpy");
        assert_eq!(base_name("cuGetProcAddress"), "cuGetProcAddress");
        assert_eq!(base_name("cuMemAlloc_vx"), "cuMemAlloc_vx");
        assert_eq!(base_name("cu_v"), "cu_v");
    }
}
