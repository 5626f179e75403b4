//! The few driver-API calls egpu-burn makes, resolved from `libcuda.so.1` at
//! run time (dlopen), so an interposer such as `libegpu.so` sees them.
//! All the unsafe code of the crate is here.

use anyhow::{Context, Result, bail};
use egpu_cuda::{CUDA_SUCCESS, CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUmodule, CUresult, CUstream};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

type BeginToGraph = unsafe extern "C" fn(CUstream, egpu_cuda::CUgraph, *const egpu_cuda::CUgraphNode, *const c_void, usize, c_uint) -> CUresult;
type BeginRecapture = unsafe extern "C" fn(CUstream, c_uint, egpu_cuda::CUgraph, *mut c_void, *mut c_void) -> CUresult;
type Launch = unsafe extern "C" fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void) -> CUresult;

/// Function pointers of the driver, valid while `_lib` is loaded.
pub struct Driver {
    init: unsafe extern "C" fn(c_uint) -> CUresult,
    device_get: unsafe extern "C" fn(*mut CUdevice, c_int) -> CUresult,
    ctx_create: unsafe extern "C" fn(*mut CUcontext, c_uint, CUdevice) -> CUresult,
    module_load_data: unsafe extern "C" fn(*mut CUmodule, *const c_void) -> CUresult,
    module_get_function: unsafe extern "C" fn(*mut CUfunction, CUmodule, *const c_char) -> CUresult,
    mem_alloc: unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult,
    stream_create: unsafe extern "C" fn(*mut CUstream, c_uint) -> CUresult,
    stream_sync: unsafe extern "C" fn(CUstream) -> CUresult,
    event_create: unsafe extern "C" fn(*mut CUevent, c_uint) -> CUresult,
    event_record: unsafe extern "C" fn(CUevent, CUstream) -> CUresult,
    event_sync: unsafe extern "C" fn(CUevent) -> CUresult,
    event_elapsed: unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CUresult,
    launch: Launch,
    begin_capture: unsafe extern "C" fn(CUstream, c_uint) -> CUresult,
    end_capture: unsafe extern "C" fn(CUstream, *mut egpu_cuda::CUgraph) -> CUresult,
    graph_create: unsafe extern "C" fn(*mut egpu_cuda::CUgraph, c_uint) -> CUresult,
    exchange_capture_mode: unsafe extern "C" fn(*mut c_uint) -> CUresult,
    /// CUDA 12.3 and later only.
    begin_capture_to_graph: Option<BeginToGraph>,
    /// CUDA 13.3 and later only.
    begin_recapture: Option<BeginRecapture>,
    error_name: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult,
    _lib: libloading::Library,
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {{
        // SAFETY: the symbol is a driver-API function whose C signature is
        // the type of the field it is stored in (CUDA 12 `cuda.h`); the
        // pointer is copied out and only used while the library stays loaded
        // (it lives in the same `Driver`).
        let s = unsafe { $lib.get(concat!($name, "\0").as_bytes()) }.with_context(|| format!("libcuda.so.1 has no {}", $name))?;
        *s
    }};
}

impl Driver {
    /// dlopens `libcuda.so.1` (whatever the loader finds: the real driver,
    /// the simulated one, or the one an interposer hands out).
    pub fn load() -> Result<Driver> {
        // SAFETY: loading the CUDA driver runs its initialisers, which are
        // designed to be loaded into any process.
        let lib = unsafe { libloading::Library::new("libcuda.so.1") }.context("cannot load libcuda.so.1 (is a driver or the simulated GPU on LD_LIBRARY_PATH?)")?;
        Ok(Driver {
            init: sym!(lib, "cuInit"),
            device_get: sym!(lib, "cuDeviceGet"),
            ctx_create: sym!(lib, "cuCtxCreate_v2"),
            module_load_data: sym!(lib, "cuModuleLoadData"),
            module_get_function: sym!(lib, "cuModuleGetFunction"),
            mem_alloc: sym!(lib, "cuMemAlloc_v2"),
            stream_create: sym!(lib, "cuStreamCreate"),
            stream_sync: sym!(lib, "cuStreamSynchronize"),
            event_create: sym!(lib, "cuEventCreate"),
            event_record: sym!(lib, "cuEventRecord"),
            event_sync: sym!(lib, "cuEventSynchronize"),
            event_elapsed: sym!(lib, "cuEventElapsedTime"),
            launch: sym!(lib, "cuLaunchKernel"),
            begin_capture: sym!(lib, "cuStreamBeginCapture_v2"),
            end_capture: sym!(lib, "cuStreamEndCapture"),
            graph_create: sym!(lib, "cuGraphCreate"),
            exchange_capture_mode: sym!(lib, "cuThreadExchangeStreamCaptureMode"),
            // SAFETY: as in `sym!`; a driver older than CUDA 12.3 lacks it.
            begin_capture_to_graph: unsafe { lib.get::<BeginToGraph>(b"cuStreamBeginCaptureToGraph\0") }.ok().map(|s| *s),
            // SAFETY: as in `sym!`; a driver older than CUDA 13.3 lacks it.
            begin_recapture: unsafe { lib.get::<BeginRecapture>(b"cuStreamBeginRecaptureToGraph\0") }.ok().map(|s| *s),
            error_name: sym!(lib, "cuGetErrorName"),
            _lib: lib,
        })
    }

    /// Maps a status to an error naming the call and the code.
    fn check(&self, r: CUresult, what: &str) -> Result<()> {
        if r == CUDA_SUCCESS {
            return Ok(());
        }
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a pointer to a static string or fails.
        let named = unsafe { (self.error_name)(r, &mut name) } == CUDA_SUCCESS && !name.is_null();
        let text = if named {
            // SAFETY: on success the driver returned a NUL-terminated static string.
            unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
        } else {
            format!("error {r}")
        };
        bail!("{what} failed: {text}")
    }
}

/// A context, the busy kernel, a stream and its argument buffer on one device.
pub struct Burner<'d> {
    d: &'d Driver,
    func: CUfunction,
    stream: CUstream,
    sink: CUdeviceptr,
}

/// How `--open-capture` begins its capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureKind {
    /// `cuStreamBeginCapture_v2` with this `CUstreamCaptureMode`.
    Mode(c_uint),
    /// `cuStreamBeginCaptureToGraph` into a graph of its own, global mode.
    ToGraph,
    /// `cuStreamBeginRecaptureToGraph` into a graph first captured (global
    /// mode) with the one launch the recapture then repeats, global mode.
    Recapture,
}

/// A stream capture left open while the burner runs (`--open-capture`).
pub struct OpenCapture {
    stream: usize,
    /// Launches captured so far.
    pub launches: u32,
}

impl<'d> Burner<'d> {
    pub fn new(d: &'d Driver, device: i32, ptx: &str, entry: &str) -> Result<Burner<'d>> {
        // SAFETY: plain driver call; its out-pointer (if any) is a live local of the matching type.
        d.check(unsafe { (d.init)(0) }, "cuInit")?;
        let mut dev: CUdevice = 0;
        // SAFETY: plain driver call; its out-pointer (if any) is a live local of the matching type.
        d.check(unsafe { (d.device_get)(&mut dev, device) }, "cuDeviceGet")?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: plain driver call; its out-pointer (if any) is a live local of the matching type.
        d.check(unsafe { (d.ctx_create)(&mut ctx, 0, dev) }, "cuCtxCreate")?;
        if !ptx.ends_with('\0') {
            bail!("PTX image must be NUL-terminated");
        }
        let mut module: CUmodule = std::ptr::null_mut();
        // SAFETY: `ptx` is NUL-terminated (checked above) and outlives the call; out-pointer to a live local.
        d.check(unsafe { (d.module_load_data)(&mut module, ptx.as_ptr().cast()) }, "cuModuleLoadData")?;
        let entry = std::ffi::CString::new(entry)?;
        let mut func: CUfunction = std::ptr::null_mut();
        // SAFETY: `module` was loaded above; `entry` is a live C string; out-pointer to a live local.
        d.check(unsafe { (d.module_get_function)(&mut func, module, entry.as_ptr()) }, "cuModuleGetFunction")?;
        let mut sink: CUdeviceptr = 0;
        // SAFETY: plain driver call; its out-pointer (if any) is a live local of the matching type.
        d.check(unsafe { (d.mem_alloc)(&mut sink, 4) }, "cuMemAlloc")?;
        let mut b = Burner { d, func, stream: std::ptr::null_mut(), sink };
        b.stream = b.new_stream()?;
        Ok(b)
    }

    /// A new non-blocking stream in the burner's context.
    fn new_stream(&self) -> Result<CUstream> {
        let mut s: CUstream = std::ptr::null_mut();
        // SAFETY: plain driver call; its out-pointer is a live local of the matching type.
        self.d.check(unsafe { (self.d.stream_create)(&mut s, egpu_cuda::CU_STREAM_NON_BLOCKING) }, "cuStreamCreate")?;
        Ok(s)
    }

    /// One launch of the busy kernel with `iters` loop steps per thread.
    pub fn launch(&self, grid: u32, block: u32, iters: u32) -> Result<()> {
        self.launch_on(self.stream, grid, block, iters)
    }

    /// Begins a capture on a stream of its own and captures one launch into it.
    pub fn open_capture(&self, kind: CaptureKind) -> Result<OpenCapture> {
        let s = self.new_stream()?;
        self.open_capture_on(s as usize, kind)
    }

    /// A stream for [`Burner::open_capture_on`], made once and captured on again and again.
    pub fn capture_stream(&self) -> Result<usize> {
        Ok(self.new_stream()? as usize)
    }

    /// Begins a capture on `s` (from [`Burner::capture_stream`], not capturing now) and captures one launch into it.
    pub fn open_capture_on(&self, s: usize, kind: CaptureKind) -> Result<OpenCapture> {
        let s = s as CUstream;
        match kind {
            // SAFETY: a stream created above and a documented mode.
            CaptureKind::Mode(m) => self.d.check(unsafe { (self.d.begin_capture)(s, m) }, "cuStreamBeginCapture_v2")?,
            CaptureKind::ToGraph => {
                let Some(begin) = self.d.begin_capture_to_graph else { bail!("the driver has no cuStreamBeginCaptureToGraph (CUDA 12.3 or later)") };
                let mut g: egpu_cuda::CUgraph = std::ptr::null_mut();
                // SAFETY: out-pointer to a live local; flags 0.
                self.d.check(unsafe { (self.d.graph_create)(&mut g, 0) }, "cuGraphCreate")?;
                // SAFETY: the stream and graph created above; no dependencies; global mode.
                self.d.check(unsafe { begin(s, g, std::ptr::null(), std::ptr::null(), 0, egpu_cuda::CU_STREAM_CAPTURE_MODE_GLOBAL) }, "cuStreamBeginCaptureToGraph")?;
            }
            CaptureKind::Recapture => {
                let Some(begin) = self.d.begin_recapture else { bail!("the driver has no cuStreamBeginRecaptureToGraph (CUDA 13.3 or later)") };
                // SAFETY: a stream created above and a documented mode.
                self.d.check(unsafe { (self.d.begin_capture)(s, egpu_cuda::CU_STREAM_CAPTURE_MODE_GLOBAL) }, "cuStreamBeginCapture_v2")?;
                self.launch_on(s, 1, 1, 1).context("the launch of the graph to recapture")?;
                let mut g: egpu_cuda::CUgraph = std::ptr::null_mut();
                // SAFETY: ends the capture begun just above; out-pointer to a live local.
                self.d.check(unsafe { (self.d.end_capture)(s, &mut g) }, "cuStreamEndCapture of the graph to recapture")?;
                // SAFETY: the stream above and the graph its capture returned; no callback.
                self.d.check(unsafe { begin(s, egpu_cuda::CU_STREAM_CAPTURE_MODE_GLOBAL, g, std::ptr::null_mut(), std::ptr::null_mut()) }, "cuStreamBeginRecaptureToGraph")?;
            }
        }
        let mut c = OpenCapture { stream: s as usize, launches: 0 };
        self.capture_one(&mut c)?;
        Ok(c)
    }

    /// Captures one more launch into an open capture.
    pub fn capture_one(&self, c: &mut OpenCapture) -> Result<()> {
        self.launch_on(c.stream as CUstream, 1, 1, 1).context("a launch into the open stream capture")?;
        c.launches += 1;
        Ok(())
    }

    /// Ends an open capture; fails unless the driver hands back a graph.
    pub fn end_open_capture(&self, c: OpenCapture) -> Result<()> {
        let mut g: egpu_cuda::CUgraph = std::ptr::null_mut();
        // SAFETY: ends the capture begun on this stream; out-pointer to a live local.
        self.d.check(unsafe { (self.d.end_capture)(c.stream as CUstream, &mut g) }, "cuStreamEndCapture of the open capture")?;
        if g.is_null() {
            bail!("cuStreamEndCapture of the open capture returned no graph");
        }
        Ok(())
    }

    /// Runs `f` in the relaxed stream-capture mode (the burner's own waits,
    /// which an open capture would otherwise forbid), then restores the mode.
    pub fn relaxed<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let mut m = egpu_cuda::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: in/out pointer to a live local holding a documented mode.
        self.d.check(unsafe { (self.d.exchange_capture_mode)(&mut m) }, "cuThreadExchangeStreamCaptureMode")?;
        let r = f();
        // SAFETY: as above; puts the thread's previous mode back.
        self.d.check(unsafe { (self.d.exchange_capture_mode)(&mut m) }, "cuThreadExchangeStreamCaptureMode")?;
        r
    }

    fn launch_on(&self, stream: CUstream, grid: u32, block: u32, iters: u32) -> Result<()> {
        let mut iters = iters;
        let mut sink = self.sink;
        let mut params: [*mut c_void; 2] = [(&raw mut iters).cast(), (&raw mut sink).cast()];
        // SAFETY: `func` was loaded from our module and takes (u32, u64);
        // `params` points at two live locals of those types for the call
        // (the driver copies arguments at launch).
        let r = unsafe { (self.d.launch)(self.func, grid, 1, 1, block, 1, 1, 0, stream, params.as_mut_ptr(), std::ptr::null_mut()) };
        self.d.check(r, "cuLaunchKernel")
    }

    /// Begins a stream capture on a stream of its own and ends it with a
    /// null graph pointer, which the driver refuses (`--failed-capture`):
    /// returns the end's status, which is not success.
    pub fn failed_capture(&self) -> Result<CUresult> {
        let s = self.new_stream()?;
        // SAFETY: a stream created above; mode 0 (global).
        self.d.check(unsafe { (self.d.begin_capture)(s, 0) }, "cuStreamBeginCapture_v2")?;
        // SAFETY: a null graph pointer is invalid input the driver answers with an error.
        let r = unsafe { (self.d.end_capture)(s, std::ptr::null_mut()) };
        if r == CUDA_SUCCESS {
            bail!("cuStreamEndCapture accepted a null graph pointer");
        }
        Ok(r)
    }

    pub fn new_event(&self) -> Result<CUevent> {
        let mut e: CUevent = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local.
        self.d.check(unsafe { (self.d.event_create)(&mut e, egpu_cuda::CU_EVENT_DEFAULT) }, "cuEventCreate")?;
        Ok(e)
    }

    pub fn record(&self, e: CUevent) -> Result<()> {
        // SAFETY: `e` came from cuEventCreate in our context; `stream` is ours.
        self.d.check(unsafe { (self.d.event_record)(e, self.stream) }, "cuEventRecord")
    }

    pub fn wait(&self, e: CUevent) -> Result<()> {
        // SAFETY: `e` came from cuEventCreate in our context.
        self.d.check(unsafe { (self.d.event_sync)(e) }, "cuEventSynchronize")
    }

    /// GPU time between two completed events, ns (None if the driver cannot tell).
    pub fn elapsed_ns(&self, a: CUevent, b: CUevent) -> Option<u64> {
        let mut ms = 0f32;
        // SAFETY: both events are ours and recorded; out-pointer to a live local.
        let r = unsafe { (self.d.event_elapsed)(&mut ms, a, b) };
        (r == CUDA_SUCCESS && ms >= 0.0).then(|| (f64::from(ms) * 1e6) as u64)
    }

    pub fn sync(&self) -> Result<()> {
        // SAFETY: `stream` is ours.
        self.d.check(unsafe { (self.d.stream_sync)(self.stream) }, "cuStreamSynchronize")
    }
}
