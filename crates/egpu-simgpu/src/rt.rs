//! The per-process runtime: attachment to the shared state, handle tables,
//! the current-context stack, fork detection and log-once.
//!
//! One [`Proc`] exists per process. It is found through an `AtomicPtr`
//! and carries the pid that made it: after `fork` the child sees a pid
//! mismatch and builds its own `Proc` (claiming its own slot) instead of
//! touching the parent's, whose mutex may have been held at fork time.

use crate::config::Config;
use crate::state::{Shared, live};
use egpu_cuda::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

pub use crate::cptr::R;

/// Whether `cuInit` succeeded in this process (inherited by fork children,
/// which re-attach lazily).
static INITIALIZED: AtomicBool = AtomicBool::new(false);
static CURRENT: AtomicPtr<Proc> = AtomicPtr::new(std::ptr::null_mut());
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);
static ERR_PRINTED: AtomicBool = AtomicBool::new(false);

/// A fresh, process-unique, never-reused opaque handle value. Values never
/// collide with NULL, `CU_STREAM_LEGACY` or `CU_STREAM_PER_THREAD`, and keep
/// counting across fork so a child never mistakes a parent's handle for one
/// of its own.
pub fn new_handle() -> u64 {
    0x5e6d_0000_0000 + NEXT_HANDLE.fetch_add(1, Ordering::Relaxed) * 16
}

/// Prints `msg` on stderr once per process (for configuration errors).
fn print_error_once(msg: &str) {
    if !ERR_PRINTED.swap(true, Ordering::SeqCst) {
        eprintln!("egpu-simgpu: {msg}");
    }
}

/// Logs "`name` is not implemented" once per symbol per process.
pub fn log_unimplemented(name: &str) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut g = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if g.get_or_insert_with(HashSet::new).insert(name.to_string()) {
        eprintln!("egpu-simgpu: {name} is not implemented by the simulated GPU; returning NOT_SUPPORTED");
    }
}

pub struct Proc {
    pub pid: u32,
    pub cfg: Config,
    pub shm: &'static Shared,
    /// This process's hold on its slot (and liveness test of the others').
    pub locks: live::SlotLocks,
    pub slot: usize,
    /// CUDA ordinal -> physical device index (CUDA_VISIBLE_DEVICES).
    pub visible: Vec<usize>,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Proc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proc").field("pid", &self.pid).field("slot", &self.slot).finish_non_exhaustive()
    }
}

impl Proc {
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn ndev(&self) -> usize {
        self.visible.len()
    }

    /// Physical index of CUDA ordinal `dev`.
    pub fn phys(&self, dev: CUdevice) -> R<usize> {
        usize::try_from(dev).ok().and_then(|d| self.visible.get(d).copied()).ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    fn attach() -> Result<Proc, String> {
        let cfg = Config::from_env()?;
        let totals: Vec<u64> = cfg.spec.devices.iter().map(|d| d.memory.0).collect();
        // The slot locks go on a new description of the very file mapped.
        let (shm, fd) = Shared::attach_fd(&cfg.state_path, &cfg.canonical_spec(), &cfg.spec_text, &totals)?;
        let locks = live::SlotLocks::reopen(fd, &cfg.state_path)?;
        let pid = live::my_pid();
        shm.sweep(&locks);
        let slot = shm
            .claim_slot(&locks, pid, live::start_time(pid).unwrap_or(0))
            .ok_or_else(|| format!("simulated-GPU state {}: all process slots are in use", cfg.state_path.display()))?;
        let uuids: Vec<String> = cfg.spec.devices.iter().map(|d| d.uuid.clone()).collect();
        let visible = crate::visible::parse_visible(cfg.visible.as_deref(), &uuids);
        let inner = Inner::new(visible.len());
        Ok(Proc { pid, cfg, shm, locks, slot, visible, inner: Mutex::new(inner) })
    }
}

/// This process's runtime, attaching (or re-attaching after fork) if needed.
/// Does not require `cuInit` (NVML uses it too).
pub fn attach() -> Result<&'static Proc, String> {
    let pid = live::my_pid();
    let cur = CURRENT.load(Ordering::SeqCst);
    if !cur.is_null() {
        // SAFETY: CURRENT only ever holds pointers from Box::leak below,
        // which are never freed.
        let p = unsafe { &*cur };
        if p.pid == pid {
            return Ok(p);
        }
    }
    let fresh: &'static Proc = Box::leak(Box::new(Proc::attach()?));
    match CURRENT.compare_exchange(cur, fresh as *const Proc as *mut Proc, Ordering::SeqCst, Ordering::SeqCst) {
        // (A fork child's reference to its parent's lock description was
        // closed at fork: `live::SlotLocks`.)
        Ok(_) => Ok(fresh),
        Err(other) => {
            // Another thread attached first: use theirs, give our slot back.
            fresh.shm.release_slot(&fresh.locks, fresh.slot);
            fresh.locks.close();
            // SAFETY: as above, a leaked, never-freed Proc.
            let o = unsafe { &*other };
            if o.pid == pid { Ok(o) } else { attach() }
        }
    }
}

/// Attaches, printing a configuration error once on stderr.
pub fn attach_logged() -> Option<&'static Proc> {
    match attach() {
        Ok(p) => Some(p),
        Err(e) => {
            print_error_once(&e);
            None
        }
    }
}

pub fn set_initialized() {
    INITIALIZED.store(true, Ordering::SeqCst);
}

/// The runtime for driver-API calls: `CUDA_ERROR_NOT_INITIALIZED` before
/// `cuInit`.
pub fn cu() -> R<&'static Proc> {
    if !INITIALIZED.load(Ordering::SeqCst) {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    attach_logged().ok_or(CUDA_ERROR_NOT_INITIALIZED)
}

// ---------------------------------------------------------------------------
// Per-process tables.

#[derive(Debug, Default)]
pub struct Primary {
    pub handle: u64,
    pub refcount: u32,
    pub flags: u32,
}

#[derive(Debug)]
pub struct Ctx {
    pub ord: usize,
    pub phys: usize,
    pub flags: u32,
    pub primary: bool,
    pub charged: u64,
    pub legacy_tail: u64,
    pub ptds_tail: u64,
    pub limits: HashMap<u32, usize>,
    pub peers: HashSet<u64>,
}

#[derive(Debug)]
pub struct Stream {
    pub ctx: u64,
    pub flags: u32,
    pub priority: i32,
    pub tail: u64,
    /// The capture in progress on this stream, if any.
    pub capture: Option<Capture>,
}

/// A stream capture in progress (`ops::capture`).
#[derive(Debug)]
pub struct Capture {
    /// The graph the stream's work goes into.
    pub graph: u64,
    /// Made by the capture (`cuStreamBeginCapture`), not the caller's
    /// (`cuStreamBeginCaptureToGraph`): dropped if the capture is invalidated.
    pub owned: bool,
    /// `CUstreamCaptureMode` it was begun with.
    pub mode: u32,
    /// The thread that began it.
    pub thread: std::thread::ThreadId,
    /// A forbidden call invalidated it: its end fails.
    pub invalid: bool,
    /// A recapture (`cuStreamBeginRecaptureToGraph`): the graph's nodes
    /// before it, which the recaptured ones must repeat in order.
    pub recapture: Option<Vec<Node>>,
}

#[derive(Debug)]
pub struct Event {
    pub flags: u32,
    pub time: Option<u64>,
}

/// What a device-address range is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Device,
    Managed,
    Pool(u64),
    GraphAlloc,
    ModuleGlobal,
    HostAlloc,
    HostRegistered,
    IpcImport,
    /// A `cuMemMap` of a physical allocation (handle, offset into it).
    Vmm { handle: u64, offset: u64 },
}

#[derive(Debug, Clone)]
pub struct Alloc {
    pub base: u64,
    pub size: u64,
    /// Bytes of address space it occupies (arena span or mapping length).
    pub span: u64,
    pub kind: Kind,
    /// CUDA ordinal and physical index (ordinal of the creating process).
    pub ord: usize,
    pub phys: usize,
    pub ctx: u64,
    /// Bytes charged to this process for it.
    pub charged: u64,
    pub id: u64,
    /// cuMemSetAccess flags (VMM mappings); RW for everything else.
    pub access: u32,
    pub host_flags: u32,
}

/// A per-device sparse memfd mapped once; allocations are offsets in it.
#[derive(Debug)]
pub struct Arena {
    pub fd: i32,
    pub base: u64,
    pub size: u64,
    /// Free ranges: offset -> length, coalesced.
    pub free: BTreeMap<u64, u64>,
}

#[derive(Debug)]
pub struct Phys {
    pub fd: i32,
    pub size: u64,
    pub prop_type: u32,
    pub loc_type: u32,
    pub loc_id: i32,
    pub handle_types: u32,
    pub charged_phys: Option<usize>,
    pub charged: u64,
    pub handle_refs: u32,
    pub map_refs: u32,
    pub multicast: bool,
}

#[derive(Debug)]
pub struct Pool {
    pub ord: usize,
    pub phys: usize,
    pub reserved: u64,
    pub used: u64,
    pub reserved_high: u64,
    pub used_high: u64,
    pub threshold: u64,
    pub max_size: u64,
    pub reuse: [i32; 3],
}

#[derive(Debug, Default)]
pub struct GraphMem {
    pub reserved: u64,
    pub used: u64,
    pub reserved_high: u64,
    pub used_high: u64,
}

#[derive(Debug, Clone)]
pub enum Node {
    Kernel { threads: u64 },
    MemAlloc { dptr: u64, size: u64, ord: usize },
    MemFree { dptr: u64 },
    Empty,
}

#[derive(Debug, Default)]
pub struct Graph {
    pub nodes: Vec<(u64, Node)>,
}

#[derive(Debug)]
pub struct Func {
    pub name: std::ffi::CString,
    pub attrs: HashMap<u32, i32>,
}

#[derive(Debug, Default)]
pub struct Module {
    pub funcs: HashMap<String, u64>,
    pub globals: HashMap<String, (u64, u64)>,
}

#[derive(Debug, Clone, Copy)]
pub struct ArrayDesc {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: u32,
    pub channels: u32,
    pub flags: u32,
    pub phys: usize,
    pub charged: u64,
    /// For mipmapped levels: the parent (levels are views, not charged).
    pub view: bool,
}

#[derive(Debug)]
pub struct Inner {
    pub primary: Vec<Primary>,
    pub ctxs: HashMap<u64, Ctx>,
    pub streams: HashMap<u64, Stream>,
    pub events: HashMap<u64, Event>,
    pub allocs: BTreeMap<u64, Alloc>,
    pub arenas: HashMap<usize, Arena>,
    pub phys: HashMap<u64, Phys>,
    pub reservations: BTreeMap<u64, u64>,
    pub pools: HashMap<u64, Pool>,
    pub default_pool: HashMap<usize, u64>,
    pub current_pool: HashMap<usize, u64>,
    pub graph_mem: HashMap<usize, GraphMem>,
    pub graphs: HashMap<u64, Graph>,
    pub execs: HashMap<u64, Graph>,
    pub modules: HashMap<u64, Module>,
    pub funcs: HashMap<u64, Func>,
    pub libraries: HashMap<u64, HashMap<String, u64>>,
    pub kernels: HashMap<u64, u64>,
    pub arrays: HashMap<u64, ArrayDesc>,
    pub mipmaps: HashMap<u64, (ArrayDesc, u32, Vec<u64>)>,
    /// Tiles of sparse arrays mapped to VMM handles: (array or mipmapped
    /// array, tiles) -> handle (`cuMemMapArrayAsync`).
    pub sparse: BTreeMap<(u64, egpu_cuda::SparseTiles), u64>,
    /// IPC imports: (exporter pid, buffer id) -> (base, refcount).
    pub ipc_imports: HashMap<(u32, u64), (u64, u32)>,
    /// Captures of per-thread default streams: (context, thread) -> capture
    /// (a user stream keeps its own in [`Stream::capture`]).
    pub ptds_captures: HashMap<(u64, std::thread::ThreadId), Capture>,
    /// Green contexts: handle -> device ordinal (each holds a reference to
    /// that device's primary context).
    pub greens: HashMap<u64, usize>,
    pub next_buffer_id: u64,
}

impl Inner {
    fn new(ndev: usize) -> Self {
        Inner {
            primary: (0..ndev).map(|_| Primary::default()).collect(),
            ctxs: HashMap::new(),
            streams: HashMap::new(),
            events: HashMap::new(),
            allocs: BTreeMap::new(),
            arenas: HashMap::new(),
            phys: HashMap::new(),
            reservations: BTreeMap::new(),
            pools: HashMap::new(),
            default_pool: HashMap::new(),
            current_pool: HashMap::new(),
            graph_mem: HashMap::new(),
            graphs: HashMap::new(),
            execs: HashMap::new(),
            modules: HashMap::new(),
            funcs: HashMap::new(),
            libraries: HashMap::new(),
            kernels: HashMap::new(),
            arrays: HashMap::new(),
            mipmaps: HashMap::new(),
            sparse: BTreeMap::new(),
            ipc_imports: HashMap::new(),
            ptds_captures: HashMap::new(),
            greens: HashMap::new(),
            next_buffer_id: 1,
        }
    }

    /// The allocation containing `ptr`, if any.
    pub fn find(&self, ptr: u64) -> Option<&Alloc> {
        let (_, a) = self.allocs.range(..=ptr).next_back()?;
        (ptr < a.base + a.size.max(1)).then_some(a)
    }

    /// Validates `[ptr, ptr+len)` as accessible simulated memory.
    pub fn range(&self, ptr: u64, len: u64) -> R<&Alloc> {
        let a = self.find(ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if ptr.checked_add(len).is_none_or(|end| end > a.base + a.size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if a.access & CU_MEM_ACCESS_FLAGS_PROT_READ == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(a)
    }
}

// ---------------------------------------------------------------------------
// The current-context stack (per thread).

thread_local! {
    static CTX_STACK: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub fn ctx_top() -> Option<u64> {
    CTX_STACK.with(|s| s.borrow().last().copied())
}

pub fn ctx_set_top(h: Option<u64>) {
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        match h {
            Some(h) => match s.last_mut() {
                Some(t) => *t = h,
                None => s.push(h),
            },
            None => {
                s.pop();
            }
        }
    })
}

pub fn ctx_push(h: u64) {
    CTX_STACK.with(|s| s.borrow_mut().push(h))
}

pub fn ctx_pop() -> Option<u64> {
    CTX_STACK.with(|s| s.borrow_mut().pop())
}

/// Removes `h` from this thread's stack (after destroying it).
pub fn ctx_forget(h: u64) {
    CTX_STACK.with(|s| s.borrow_mut().retain(|&c| c != h))
}
