//! The GPU backend: compiles with NVRTC, runs the numeric fence and times, on one CUDA
//! context. A sticky CUDA error (illegal address, launch failure...) ends the job with a
//! fault; the worker then exits, and the parent starts a fresh one.

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::{CUdevice_attribute as A, CUevent_flags, CUresult, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DriverError};
use kopt_spec::expr;
use kopt_spec::spec::{ArgValue, Direction, KernelSpec, Number, ScalarTy, Shape};

use super::{Backend, StepProgress};
use crate::compare::{compare, OutputComparison};
use crate::inputs::{self, Bytes, Variation};
use crate::job::{
    graph_method, graph_reps, EvalJob, Geometry, KernelVersion, TimingPlan, TimingPolicy,
};
use crate::protocol::*;
use crate::stats::{self, Timing};
use kopt_spec::shapes::{buffer_dims, ShapeCase};

pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    modules: HashMap<String, (Option<CudaFunction>, CompileReport)>,
    /// Generated inputs, by spec, shape, seed and variation: a search sends hundreds of
    /// jobs with the same spec, shapes and seeds, and drawing millions of normals on the
    /// CPU would otherwise dominate each evaluation. Deterministic, so reuse is exact.
    inputs: InputCache,
    /// Device copies of the output poison, by element type and length (each run restores
    /// outputs from them with a device-to-device copy).
    poison: HashMap<(kopt_spec::spec::DType, usize), DeviceBuf>,
    /// A kernel that flags whether two device buffers differ, so that the input-modified
    /// check needs no download; `None` until first needed, `Some(None)` if it did not
    /// compile (the check then downloads the inputs).
    differ: Option<Option<CudaFunction>>,
    /// The 4-byte flag `differ` writes, allocated once.
    differ_flag: Option<DeviceBuf>,
    /// Each shape's buffers and the timing loop's extra input sets, kept between jobs.
    pool: BufferPool,
    /// The reference's timing graphs: every job of a search times the same reference on
    /// the same shapes, over the same pooled buffers.
    reference_graphs: GraphCache,
    /// The reference's measured launch time (µs) by function, geometry and shape: the
    /// expected durations of a shape's steps, and so the parent's hang limits, follow from
    /// it. Measured once per worker, before the first candidate launch on the shape.
    reference_launch_us: HashMap<ProbeKey, f64>,
    /// A parent watches the steps (see [`Backend::set_watched`]).
    watched: bool,
}

/// What a reference launch time is kept under: the function (modules are never unloaded,
/// so its handle names it for the process), the geometry and the shape's arguments.
#[derive(Clone, PartialEq, Eq, Hash)]
struct ProbeKey {
    function: usize,
    geometry: Geometry,
    args: Vec<i64>,
}

/// Instantiated timing graphs by what they launch: the function (modules are never
/// unloaded, so its handle names it for the process), the geometry, the launch count and
/// every launch's arguments (buffer addresses and scalars). A hit therefore replays
/// exactly the launches a fresh capture would record. The newest few are kept.
#[derive(Default)]
struct GraphCache {
    entries: std::collections::VecDeque<(GraphKey, cudarc::driver::CudaGraph)>,
}

#[derive(PartialEq)]
struct GraphKey {
    function: usize,
    geometry: Geometry,
    reps: usize,
    args: Vec<Vec<u64>>,
}

impl GraphCache {
    const LIMIT: usize = 8;

    fn key(f: &CudaFunction, g: &Geometry, p: &[Params], reps: usize) -> GraphKey {
        GraphKey {
            function: f.cu_function() as usize,
            geometry: *g,
            reps,
            args: p.iter().map(|p| p.cells.clone()).collect(),
        }
    }

    fn take(&mut self, key: &GraphKey) -> Option<cudarc::driver::CudaGraph> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        self.entries.remove(i).map(|(_, g)| g)
    }

    fn put(&mut self, key: GraphKey, graph: cudarc::driver::CudaGraph) {
        if self.entries.len() >= Self::LIMIT {
            self.entries.pop_front();
        }
        self.entries.push_back((key, graph));
    }
}

/// Device buffers kept between jobs, by their sizes: a search runs the same shapes
/// hundreds of times, and every `cuMemAlloc`/`cuMemFree` pair costs tens of microseconds
/// (the free synchronises the device). Only the allocations are reused, never the
/// contents: each run restores its inputs and poisons its outputs first, and the timing
/// sets are copied afresh. Plain allocations, so compute-sanitizer still sees each
/// buffer's exact bounds. Bounded in bytes; the oldest go first, and all of them when an
/// allocation fails.
#[derive(Default)]
struct BufferPool {
    /// Oldest first.
    free: Vec<Buffers>,
    bytes: usize,
}

impl BufferPool {
    const LIMIT_BYTES: usize = 8 << 30;

    /// Buffers of exactly `sizes` bytes (by parameter order), pooled or new.
    fn take(&mut self, sizes: &[usize], elems: &[usize]) -> Result<Buffers, DriverError> {
        if let Some(i) = self.free.iter().rposition(|b| b.sizes() == sizes) {
            let mut b = self.free.remove(i);
            self.bytes -= b.total();
            b.elems = elems.to_vec();
            return Ok(b);
        }
        let alloc = || -> Result<Buffers, DriverError> {
            let mut dev = Vec::with_capacity(sizes.len());
            for &bytes in sizes {
                dev.push(DeviceBuf::new(bytes)?);
            }
            Ok(Buffers {
                dev,
                elems: elems.to_vec(),
            })
        };
        match alloc() {
            Err(_) if !self.free.is_empty() => {
                self.free.clear();
                self.bytes = 0;
                alloc()
            }
            other => other,
        }
    }

    /// Keeps `b` for a later job. Only for buffers no queued work still uses (the stream
    /// was synchronised).
    fn put(&mut self, b: Buffers) {
        let n = b.total();
        if n > Self::LIMIT_BYTES {
            return;
        }
        while self.bytes + n > Self::LIMIT_BYTES && !self.free.is_empty() {
            let old = self.free.remove(0);
            self.bytes -= old.total();
        }
        self.bytes += n;
        self.free.push(b);
    }
}

/// A shape's generated inputs, on the host (for comparisons) and on the device (each run
/// restores its inputs from there with a device-to-device copy).
struct Pristine {
    host: Vec<Option<Bytes>>,
    dev: Vec<Option<DeviceBuf>>,
}

/// Inputs kept across jobs, bounded in bytes (host and device alike); the oldest entries
/// go first.
#[derive(Default)]
struct InputCache {
    entries: HashMap<String, Arc<Pristine>>,
    order: std::collections::VecDeque<String>,
    bytes: usize,
}

impl InputCache {
    const LIMIT_BYTES: usize = 2 << 30;

    fn size(v: &Pristine) -> usize {
        v.host.iter().flatten().map(Vec::len).sum()
    }

    fn get_or_fill(
        &mut self,
        key: String,
        fill: impl FnOnce() -> Result<Pristine, String>,
    ) -> Result<Arc<Pristine>, String> {
        if let Some(v) = self.entries.get(&key) {
            return Ok(v.clone());
        }
        let v = Arc::new(fill()?);
        let size = Self::size(&v);
        while self.bytes + size > Self::LIMIT_BYTES {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(e) = self.entries.remove(&old) {
                self.bytes -= Self::size(&e);
            }
        }
        if size <= Self::LIMIT_BYTES {
            self.bytes += size;
            self.order.push_back(key.clone());
            self.entries.insert(key, v.clone());
        }
        Ok(v)
    }
}

/// Errors after which the context cannot be used again.
fn is_sticky(e: &DriverError) -> bool {
    use CUresult::*;
    matches!(
        e.0,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_LAUNCH_FAILED
    )
}

/// Why a shape stopped: a plain error (bad geometry, launch refused) or a fault.
enum Stop {
    Error(String),
    Fault(String),
}

impl Stop {
    /// A driver's error (`DriverError`), or kopt's launch path's (which adds a driver too
    /// old for a cluster launch).
    fn driver(what: &str, e: impl Into<kopt::Error>) -> Stop {
        match e.into() {
            kopt::Error::Driver(e) if is_sticky(&e) => Stop::Fault(format!("{what}: {e:?}")),
            kopt::Error::Driver(e) => Stop::Error(format!("{what}: {e:?}")),
            other => Stop::Error(format!("{what}: {other}")),
        }
    }
}

fn device_info(ctx: &Arc<CudaContext>, ordinal: usize) -> Result<DeviceInfo, DriverError> {
    let attr = |a: A| ctx.attribute(a).map(|v| v.max(0) as u32);
    let (major, minor) = ctx.compute_capability()?;
    let uuid = ctx.uuid()?;
    let uuid: String = uuid
        .bytes
        .iter()
        .map(|b| format!("{:02x}", *b as u8))
        .collect();
    let mut driver: std::ffi::c_int = 0;
    // SAFETY: writes one int.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) }.result()?;
    Ok(DeviceInfo {
        ordinal,
        name: ctx.name()?,
        uuid: format!("GPU-{uuid}"),
        compute_capability: (major as u32, minor as u32),
        arch: kopt_spec::files::arch_name(major as u32, minor as u32),
        multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        l2_bytes: attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as u64,
        memory_bytes: ctx.total_mem()? as u64,
        sm_clock_mhz: attr(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)? / 1000,
        memory_clock_mhz: attr(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)? / 1000,
        driver_api: driver as u32,
        max_threads_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        max_shared_per_block_optin: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        max_warps_per_sm: attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)? / 32,
        registers_per_sm: attr(A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)?,
    })
}

impl CudaBackend {
    pub fn new(ordinal: usize) -> Result<Self, String> {
        if let Some(why) = kopt::gpu::missing() {
            return Err(why);
        }
        // Timing reads CUDA events through the call these bindings make, which an older
        // driver may not export (cudarc would panic at the first reading).
        kopt::driver::require(kopt::driver::EVENT_TIMING).map_err(|e| e.to_string())?;
        let ctx =
            CudaContext::new(ordinal).map_err(|e| format!("cannot open GPU {ordinal}: {e:?}"))?;
        // One stream, explicit synchronisation: cudarc's per-buffer events are not needed
        // and would add work to every launch.
        // SAFETY: all work of this backend goes through `stream`.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| format!("{e:?}"))?;
        let info = device_info(&ctx, ordinal).map_err(|e| format!("{e:?}"))?;
        Ok(CudaBackend {
            ctx,
            stream,
            info,
            modules: HashMap::new(),
            inputs: InputCache::default(),
            poison: HashMap::new(),
            differ: None,
            differ_flag: None,
            pool: BufferPool::default(),
            reference_graphs: GraphCache::default(),
            reference_launch_us: HashMap::new(),
            watched: true,
        })
    }

    /// Compiles a version with NVRTC, or loads the PTX the parent compiled ahead
    /// ([`KernelVersion::ptx`]), and loads its entry point; modules are kept per source,
    /// options, entry, architecture and PTX.
    fn compile(&mut self, v: &KernelVersion) -> (Option<CudaFunction>, CompileReport) {
        let options = v.compile_options();
        let key = crate::cache::hash_parts(&[
            &v.source,
            &options.join("\u{1}"),
            &v.entry,
            &self.info.arch,
            v.ptx.as_deref().unwrap_or(""),
            v.cubin.as_deref().unwrap_or(""),
        ]);
        if let Some((f, r)) = self.modules.get(&key) {
            let mut r = r.clone();
            r.cached = true;
            return (f.clone(), r);
        }
        let opts: Vec<&str> = options.iter().map(String::as_str).collect();
        let cc = (
            self.info.compute_capability.0 as i32,
            self.info.compute_capability.1 as i32,
        );
        let given_symbol = || v.symbol.clone().unwrap_or_else(|| v.entry.clone());
        let compiled = match (v.cubin_bytes(), &v.ptx) {
            (Some(cubin), _) => cubin.map(|c| (cudarc::nvrtc::Ptx::from_binary(c), given_symbol())),
            (None, Some(ptx)) => Ok((cudarc::nvrtc::Ptx::from_src(ptx.clone()), given_symbol())),
            (None, None) => {
                kopt::compile_module("candidate", &v.id, &v.source, &opts, cc, Some(&v.entry))
                    .map(|m| {
                        let symbol = m.entry.unwrap_or_else(|| v.entry.clone());
                        (m.ptx, symbol)
                    })
                    .map_err(|e| match e {
                        kopt::Error::Compile { log, .. } => log,
                        other => other.to_string(),
                    })
            }
        };
        let result = compiled.and_then(|(ptx, symbol)| {
            let module = self
                .ctx
                .load_module(ptx)
                .map_err(|e| match kopt::module_load_error("candidate", &v.id, e) {
                    kopt::Error::Driver(e) => format!("module load: {e:?}"),
                    clearer => format!("module load: {clearer}"),
                })?;
            let f = module
                .load_function(&symbol)
                .map_err(|e| {
                    format!(
                        "the compiled module has no kernel `{}` ({e:?}): the source neither defines it nor generates it through a macro or template",
                        v.entry
                    )
                })?;
            let optin = self.info.max_shared_per_block_optin as i32;
            let attrs = FunctionAttributes {
                registers: f.num_regs().unwrap_or(0) as u32,
                static_shared_bytes: f.shared_size_bytes().unwrap_or(0) as u32,
                local_bytes: f.local_size_bytes().unwrap_or(0) as u32,
                max_threads_per_block: f.max_threads_per_block().unwrap_or(0) as u32,
            };
            // As the generated launcher does (kopt::open_launch_limits), so that what is
            // verified here launches there; a refusal shows at the launch that needs it.
            let _ = kopt::open_launch_limits(&f, optin, cc);
            Ok((f, attrs))
        });
        let entry = match result {
            Ok((f, attrs)) => (
                Some(f),
                CompileReport {
                    ok: true,
                    log: String::new(),
                    options,
                    cached: false,
                    attributes: Some(attrs),
                },
            ),
            Err(log) => (
                None,
                CompileReport {
                    ok: false,
                    log,
                    options,
                    cached: false,
                    attributes: None,
                },
            ),
        };
        self.modules.insert(key, entry.clone());
        entry
    }
}

/// Device memory from plain `cuMemAlloc`, not a stream-ordered pool, so that
/// compute-sanitizer knows each buffer's exact bounds.
struct DeviceBuf {
    ptr: cudarc::driver::sys::CUdeviceptr,
    bytes: usize,
}

impl DeviceBuf {
    fn new(bytes: usize) -> Result<Self, DriverError> {
        // SAFETY: a plain allocation, freed in Drop.
        let ptr = unsafe { cudarc::driver::result::malloc_sync(bytes.max(1)) }?;
        Ok(DeviceBuf { ptr, bytes })
    }
}

impl Drop for DeviceBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by `new`; the stream was synchronised before buffers drop.
        unsafe {
            let _ = cudarc::driver::result::free_sync(self.ptr);
        }
    }
}

/// Device buffers of one shape, by parameter order.
struct Buffers {
    dev: Vec<DeviceBuf>,
    elems: Vec<usize>,
}

impl Buffers {
    fn sizes(&self) -> Vec<usize> {
        self.dev.iter().map(|d| d.bytes).collect()
    }

    fn total(&self) -> usize {
        self.dev.iter().map(|d| d.bytes).sum()
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn device(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn ceilings(&mut self) -> Result<Ceilings, String> {
        crate::ceilings::measure(&self.stream, &self.info).map_err(|e| format!("{e:?}"))
    }

    /// Each byte count as `bytes / 2` (rounded up to 16) read and written, by the faster of
    /// a vectorised copy kernel and a driver copy, timed by the kernels' method: graph
    /// replays cycling over enough buffer pairs to keep the L2 cold, median per launch.
    fn copy_times(
        &mut self,
        bytes: &[u64],
        progress: &mut dyn FnMut(&str),
    ) -> Result<Vec<CopyTime>, String> {
        let text = |e: Stop| match e {
            Stop::Error(m) | Stop::Fault(m) => m,
        };
        let f = self
            .builtin("copy", COPY_SOURCE, "kopt_copy")
            .map_err(|e| format!("kopt's copy kernel did not compile: {e}"))?;
        let policy = TimingPolicy::default();
        let s = self.stream.clone();
        let mut out = Vec::with_capacity(bytes.len());
        for &b in bytes {
            progress(&format!("copy of {b} bytes"));
            let vectors = (b / 2).div_ceil(16).max(1);
            let half = (vectors * 16) as usize;
            let (sets, cold) =
                timing_sets(2 * half as u64, self.info.l2_bytes, policy.max_input_sets);
            let mut pairs = Vec::with_capacity(sets);
            for _ in 0..sets {
                let src = DeviceBuf::new(half).map_err(|e| format!("allocation: {e:?}"))?;
                let dst = DeviceBuf::new(half).map_err(|e| format!("allocation: {e:?}"))?;
                // SAFETY: `src` holds `half` bytes.
                unsafe { cudarc::driver::result::memset_d8_async(src.ptr, 0, half, s.cu_stream()) }
                    .map_err(|e| format!("memset: {e:?}"))?;
                pairs.push((src, dst));
            }
            let mut p: Vec<Params> = pairs
                .iter()
                .map(|(src, dst)| Params::cells(vec![src.ptr, dst.ptr, vectors]))
                .collect();
            // Every SM full (2048 threads), no more: the loop strides over the rest.
            let g = Geometry::plain(
                [
                    vectors
                        .div_ceil(256)
                        .min(8 * self.info.multiprocessors as u64)
                        .max(1) as u32,
                    1,
                    1,
                ],
                [256, 1, 1],
                0,
            );
            for _ in 0..policy.warmup {
                launch(&s, &f, &g, &mut p[0]).map_err(|e| text(Stop::driver("copy launch", e)))?;
            }
            s.synchronize()
                .map_err(|e| format!("copy warm-up: {e:?}"))?;
            let est = estimate_us(&s, &f, &g, &mut p[0]).map_err(text)?;
            let reps = graph_reps(&policy, est, sets);
            let kernel = capture(&s, &f, &g, &mut p, reps).map_err(text)?;
            let driver = capture_copies(&s, &pairs, half, reps).map_err(text)?;
            let samples =
                replay_until_stable(&s, &[&kernel, &driver], reps, &policy).map_err(text)?;
            drop((kernel, driver));
            s.synchronize().map_err(|e| format!("copy: {e:?}"))?;
            let median = |v: &[f64]| stats::summarise("", 1, v).median_us;
            let (how, best) = if median(&samples[0]) <= median(&samples[1]) {
                ("copy kernel", &samples[0])
            } else {
                ("cuMemcpyDtoD", &samples[1])
            };
            out.push(CopyTime {
                bytes: b,
                timing: stats::summarise(
                    &format!("{how}: {}", graph_method(reps, sets, cold)),
                    reps as u32,
                    best,
                ),
            });
        }
        Ok(out)
    }

    fn set_watched(&mut self, watched: bool) {
        self.watched = watched;
    }

    fn evaluate(&mut self, job: &EvalJob, progress: StepProgress) -> EvalReport {
        progress("compile", None);
        let (rf, reference) = self.compile(&job.reference);
        let (cf, candidate) = self.compile(&job.candidate);
        let mut report = EvalReport {
            device: self.info.clone(),
            reference,
            candidate,
            shapes: Vec::new(),
            fault: None,
        };
        let (Some(rf), Some(cf)) = (rf, cf) else {
            return report;
        };
        for case in &job.shapes {
            match self.run_shape(job, case, &rf, &cf, progress) {
                Ok(s) => report.shapes.push(s),
                Err((partial, Stop::Error(e))) => {
                    let mut s = partial;
                    s.error = Some(e);
                    report.shapes.push(s);
                }
                Err((partial, Stop::Fault(e))) => {
                    report.shapes.push(partial);
                    report.fault = Some(e);
                    return report;
                }
            }
        }
        report
    }
}

type ShapeResult = Result<ShapeReport, (ShapeReport, Stop)>;

impl CudaBackend {
    /// A shape's generated inputs, from the cache when this spec, shape, seed and
    /// variation were drawn before.
    fn inputs_for(
        &mut self,
        spec: &KernelSpec,
        case: &ShapeCase,
        args: &[i64],
        elems: &[usize],
        seed: u64,
        variation: Variation,
    ) -> Result<Arc<Pristine>, String> {
        let spec_json = serde_json::to_string(spec).map_err(|e| e.to_string())?;
        let values = serde_json::to_string(&case.values).map_err(|e| e.to_string())?;
        let key =
            crate::cache::hash_parts(&[&spec_json, &values, &seed.to_string(), variation.name()]);
        let s = self.stream.clone();
        let key = match &case.captured {
            // Recorded inputs are the same for every seed and variation.
            Some(c) => crate::cache::hash_parts(&[&spec_json, &values, &c.file.to_string_lossy()]),
            None => key,
        };
        self.inputs.get_or_fill(key, || {
            let host = match &case.captured {
                Some(c) => inputs::captured_all(spec, elems, &c.file)?,
                None => inputs::fill_all(spec, args, elems, seed, variation)?,
            };
            let dev = host
                .iter()
                .map(|h| h.as_deref().map(|data| upload(&s, data)).transpose())
                .collect::<Result<Vec<_>, String>>()?;
            Ok(Pristine { host, dev })
        })
    }

    /// The device copy of the poison for `n` elements of `dtype`.
    fn poison_for(
        &mut self,
        dtype: kopt_spec::spec::DType,
        n: usize,
    ) -> Result<cudarc::driver::sys::CUdeviceptr, String> {
        if !self.poison.contains_key(&(dtype, n)) {
            if self.poison.len() >= 64 {
                self.poison.clear();
            }
            let buf = upload(&self.stream, &inputs::poison(dtype, n))?;
            self.poison.insert((dtype, n), buf);
        }
        Ok(self.poison[&(dtype, n)].ptr)
    }

    /// One of kopt's own kernels, compiled for this device.
    fn builtin(&self, name: &str, source: &str, entry: &str) -> Result<CudaFunction, String> {
        let cc = (
            self.info.compute_capability.0 as i32,
            self.info.compute_capability.1 as i32,
        );
        let ptx = kopt::compile_ptx("kopt", name, source, &[], cc).map_err(|e| e.to_string())?;
        let module = self.ctx.load_module(ptx).map_err(|e| format!("{e:?}"))?;
        module.load_function(entry).map_err(|e| format!("{e:?}"))
    }

    /// Whether the device buffers at `a` and `b` differ in their first `bytes` bytes; `None`
    /// when the comparison kernel is not available.
    fn device_differs(
        &mut self,
        a: cudarc::driver::sys::CUdeviceptr,
        b: cudarc::driver::sys::CUdeviceptr,
        bytes: usize,
    ) -> Result<Option<bool>, Stop> {
        if self.differ.is_none() {
            self.differ = Some(
                self.builtin("bytes_differ", DIFFER_SOURCE, "kopt_bytes_differ")
                    .ok(),
            );
        }
        let Some(Some(f)) = self.differ.clone() else {
            return Ok(None);
        };
        if self.differ_flag.is_none() {
            self.differ_flag = Some(DeviceBuf::new(4).map_err(|e| Stop::driver("allocation", e))?);
        }
        let flag = self.differ_flag.as_ref().expect("allocated above");
        let s = self.stream.clone();
        // SAFETY: `flag` holds 4 bytes.
        unsafe { cudarc::driver::result::memset_d8_async(flag.ptr, 0, 4, s.cu_stream()) }
            .map_err(|e| Stop::driver("memset", e))?;
        let mut p = Params::cells(vec![a, b, bytes as u64, flag.ptr]);
        let g = Geometry::plain(
            [(bytes.div_ceil(256 * 16) as u32).clamp(1, 1024), 1, 1],
            [256, 1, 1],
            0,
        );
        launch(&s, &f, &g, &mut p).map_err(|e| Stop::driver("compare launch", e))?;
        let mut out = [0u8; 4];
        // SAFETY: `flag` holds 4 bytes.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut out, flag.ptr, s.cu_stream()) }
            .map_err(|e| Stop::driver("download", e))?;
        s.synchronize().map_err(|e| Stop::driver("compare", e))?;
        Ok(Some(u32::from_le_bytes(out) != 0))
    }

    // The error carries the partial report: a cold path, once per failing shape.
    #[allow(clippy::result_large_err)]
    fn run_shape(
        &mut self,
        job: &EvalJob,
        case: &ShapeCase,
        rf: &CudaFunction,
        cf: &CudaFunction,
        progress: StepProgress,
    ) -> ShapeResult {
        let spec = &job.spec;
        let shape = Shape {
            values: case.values.clone(),
            weight: 1.0,
        };
        let args = spec.shape_args(&shape);
        let eval = |e: &expr::Expr| {
            spec.compile_expr(e, &BTreeMap::new())
                .ok()
                .and_then(|p| expr::eval(&p, &args).ok())
        };
        let mut out = ShapeReport {
            label: case.label.clone(),
            held_out: case.held_out,
            bytes: kopt_spec::shapes::ideal_bytes(spec, &args),
            flops: spec.flops.as_ref().and_then(eval).map(|v| v.max(0) as u64),
            error: None,
            checks: Vec::new(),
            inputs_modified: Vec::new(),
            reference: None,
            candidate: None,
        };
        let (rg, cg) = match (
            job.reference.geometry(spec, &args),
            job.candidate.geometry(spec, &args),
        ) {
            (Ok(r), Ok(c)) => (r, c),
            (Err(e), _) => return Err((out, Stop::Error(format!("reference geometry: {e}")))),
            (_, Err(e)) => return Err((out, Stop::Error(format!("candidate geometry: {e}")))),
        };
        // Each version's kernel arguments: computed ones differ with its defines and rule.
        let (ra, ca) = match (
            job.reference.arg_values(spec, &case.values),
            job.candidate.arg_values(spec, &case.values),
        ) {
            (Ok(r), Ok(c)) => (r, c),
            (Err(e), _) => return Err((out, Stop::Error(format!("reference arguments: {e}")))),
            (_, Err(e)) => return Err((out, Stop::Error(format!("candidate arguments: {e}")))),
        };
        out.reference = Some(LaunchFigures {
            geometry: rg,
            occupancy: occupancy(rf, &rg, &self.info),
            timing: None,
            timing_plan: None,
        });
        out.candidate = Some(LaunchFigures {
            geometry: cg,
            occupancy: occupancy(cf, &cg, &self.info),
            timing: None,
            timing_plan: None,
        });
        let elems: Vec<usize> = spec
            .buffers()
            .map(|b| eval(&b.len).unwrap_or(0).max(0) as usize)
            .collect();
        let sizes: Vec<usize> = spec
            .buffers()
            .zip(&elems)
            .map(|(b, n)| n * b.dtype.size())
            .collect();
        let mut bufs = match self.pool.take(&sizes, &elems) {
            Ok(b) => b,
            Err(e) => return Err((out, Stop::driver("allocation", e))),
        };
        let result = self.run_shape_on(
            job,
            case,
            (rf, &rg),
            (cf, &cg),
            (&ra, &ca),
            &args,
            &elems,
            &mut bufs,
            out,
            progress,
        );
        // Every path that returns without a fault has synchronised the stream; after a
        // fault the context is gone and so are the buffers.
        if !matches!(result, Err((_, Stop::Fault(_)))) {
            self.pool.put(bufs);
        }
        result
    }

    /// [`Self::run_shape`] on its buffers: the checks, the timing and the re-check.
    ///
    /// Every step is announced before it runs, with its expected duration where one
    /// follows from the reference's launch time: the reference is launched once alone on
    /// the shape (once per worker, and only when a parent watches: under a profiler the
    /// entry's first launch stays the candidate's) before the candidate's first launch, and each later
    /// step's launches are counted at that time, a candidate's launch as one of the
    /// reference's. No step runs more than one launch of a version or one graph replay
    /// without a message, so a slow reference never looks like a hang.
    #[allow(clippy::too_many_arguments, clippy::result_large_err)]
    fn run_shape_on(
        &mut self,
        job: &EvalJob,
        case: &ShapeCase,
        (rf, rg): (&CudaFunction, &Geometry),
        (cf, cg): (&CudaFunction, &Geometry),
        (ra, ca): (&[ArgValue], &[ArgValue]),
        args: &[i64],
        elems: &[usize],
        bufs: &mut Buffers,
        mut out: ShapeReport,
        progress: StepProgress,
    ) -> ShapeResult {
        let spec = &job.spec;
        let label = case.label.as_str();
        // A step that stops the shape returns the report so far with the reason.
        macro_rules! step {
            ($e:expr) => {
                match $e {
                    Ok(v) => v,
                    Err(stop) => return Err((out, stop)),
                }
            };
        }
        let probe_key = ProbeKey {
            function: rf.cu_function() as usize,
            geometry: *rg,
            args: args.to_vec(),
        };
        let mut reference_us = self.reference_launch_us.get(&probe_key).copied();
        // Each version's launch in the latest check (µs): what the timing is planned from.
        let mut launch_us = [f64::NAN; 2];

        // Two checks with fresh inputs: declared, then shifted distributions. In each, the
        // candidate runs before and after the reference, on poisoned outputs.
        for (variation, seed) in [
            (Variation::Declared, job.seeds.first),
            (Variation::Shifted, job.seeds.second),
        ] {
            let check = format!("{label}: check ({})", variation.name());
            progress(&check, None);
            let pristine = step!(self
                .inputs_for(spec, case, args, elems, seed, variation)
                .map_err(|e| Stop::Error(format!("inputs: {e}"))));
            if reference_us.is_none() && self.watched {
                // Before any candidate launch on the shape (its inputs and outputs are
                // restored and poisoned again before each run below).
                progress(
                    &format!("{label}: reference launch (its time sets the hang limits)"),
                    None,
                );
                let t = step!(self.launch_alone(spec, rf, rg, ra, bufs, &pristine));
                if self.reference_launch_us.len() >= 1024 {
                    self.reference_launch_us.clear();
                }
                self.reference_launch_us.insert(probe_key.clone(), t);
                reference_us = Some(t);
            }
            let one = reference_us.map(|t| t * 1e-6);
            progress(&format!("{check}: candidate"), one);
            let (c1, modified, _) = step!(self.run_once(spec, cf, cg, ca, bufs, &pristine, true));
            progress(&format!("{check}: reference"), one);
            let (reference, _, r_us) =
                step!(self.run_once(spec, rf, rg, ra, bufs, &pristine, false));
            // Unwatched, the reference's first run here is its measured launch.
            let one = Some(*reference_us.get_or_insert(r_us) * 1e-6);
            progress(&format!("{check}: candidate again"), one);
            let (c2, modified2, c_us) =
                step!(self.run_once(spec, cf, cg, ca, bufs, &pristine, true));
            launch_us = [r_us, c_us];
            progress(&format!("{check}: comparison"), None);
            let mut m = modified;
            m.extend(
                modified2
                    .into_iter()
                    .filter(|x| !m.contains(x))
                    .collect::<Vec<_>>(),
            );
            for m in m {
                if !out.inputs_modified.contains(&m) {
                    out.inputs_modified.push(m);
                }
            }
            out.checks.push(CheckReport {
                phase: Phase::BeforeReference,
                variation,
                seed,
                outputs: compare_outputs(spec, args, &c1, &reference),
            });
            out.checks.push(CheckReport {
                phase: Phase::AfterReference,
                variation,
                seed,
                outputs: compare_outputs(spec, args, &c2, &reference),
            });
        }
        let t_ref = reference_us.unwrap_or(launch_us[0]);

        let Some(policy) = job.timing.as_ref().filter(|_| case.timed) else {
            return Ok(out);
        };
        let mut step_progress =
            |what: &str, expect: Option<f64>| progress(&format!("{label}: {what}"), expect);
        let times = self.time_pair(
            spec,
            policy,
            (ra, ca),
            (rf, rg),
            (cf, cg),
            bufs,
            (launch_us, t_ref),
            &mut step_progress,
        );
        let [(tr, plan_r), (tc, plan_c)] = step!(times);
        let figures = out.reference.as_mut().expect("set above");
        figures.timing = Some(tr);
        figures.timing_plan = Some(plan_r);
        let figures = out.candidate.as_mut().expect("set above");
        figures.timing = Some(tc);
        figures.timing_plan = Some(plan_c);

        // Correctness again, on new inputs, after the timing loop.
        let recheck = format!("{label}: re-check after timing");
        progress(&recheck, None);
        let pristine = step!(self
            .inputs_for(
                spec,
                case,
                args,
                elems,
                job.seeds.after_timing,
                Variation::Declared,
            )
            .map_err(|e| Stop::Error(format!("inputs: {e}"))));
        let one = Some(t_ref * 1e-6);
        progress(&format!("{recheck}: reference"), one);
        let (reference, _, _) = step!(self.run_once(spec, rf, rg, ra, bufs, &pristine, false));
        progress(&format!("{recheck}: candidate"), one);
        let (c, _, _) = step!(self.run_once(spec, cf, cg, ca, bufs, &pristine, true));
        progress(&format!("{recheck}: comparison"), None);
        out.checks.push(CheckReport {
            phase: Phase::AfterTiming,
            variation: Variation::Declared,
            seed: job.seeds.after_timing,
            outputs: compare_outputs(spec, args, &c, &reference),
        });
        Ok(out)
    }

    /// Restores every buffer of a run: inputs from their pristine device copies, outputs
    /// from the poison.
    fn restore(
        &mut self,
        spec: &KernelSpec,
        bufs: &mut Buffers,
        pristine: &Pristine,
    ) -> Result<(), Stop> {
        let s = self.stream.clone();
        for ((b, dev), (n, source)) in spec
            .buffers()
            .zip(bufs.dev.iter_mut())
            .zip(bufs.elems.iter().zip(&pristine.dev))
        {
            let from = match source {
                Some(p) => p.ptr,
                None => self.poison_for(b.dtype, *n).map_err(Stop::Error)?,
            };
            if dev.bytes > 0 {
                // SAFETY: both hold `dev.bytes` bytes (same spec, shape and dtype).
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(
                        dev.ptr,
                        from,
                        dev.bytes,
                        s.cu_stream(),
                    )
                }
                .map_err(|e| Stop::driver("restore", e))?;
            }
        }
        Ok(())
    }

    /// Restores the buffers and times one launch between events (µs), downloading nothing.
    fn launch_alone(
        &mut self,
        spec: &KernelSpec,
        f: &CudaFunction,
        g: &Geometry,
        kernel_args: &[ArgValue],
        bufs: &mut Buffers,
        pristine: &Pristine,
    ) -> Result<f64, Stop> {
        self.restore(spec, bufs, pristine)?;
        let mut p = params(spec, kernel_args, bufs)?;
        timed_launch(&self.stream, f, g, &mut p)
    }

    /// Restores pristine inputs, poisons outputs, launches once between events,
    /// synchronises, and returns the outputs (and, when `check_inputs`, the input buffers
    /// the kernel changed) with the launch's time in µs.
    #[allow(clippy::too_many_arguments)]
    fn run_once(
        &mut self,
        spec: &KernelSpec,
        f: &CudaFunction,
        g: &Geometry,
        kernel_args: &[ArgValue],
        bufs: &mut Buffers,
        pristine: &Pristine,
        check_inputs: bool,
    ) -> Result<(Vec<Bytes>, Vec<String>, f64), Stop> {
        let s = self.stream.clone();
        self.restore(spec, bufs, pristine)?;
        let mut p = params(spec, kernel_args, bufs)?;
        let launch_us = timed_launch(&s, f, g, &mut p)?;
        let mut outputs = Vec::new();
        let mut modified = Vec::new();
        for (((b, dev), host), source) in spec
            .buffers()
            .zip(bufs.dev.iter())
            .zip(&pristine.host)
            .zip(&pristine.dev)
        {
            let is_output = b.direction != Direction::In;
            if !is_output && !check_inputs {
                continue;
            }
            if let (false, Some(src)) = (is_output, source) {
                if let Some(differs) = self.device_differs(dev.ptr, src.ptr, dev.bytes)? {
                    if differs {
                        modified.push(b.name.clone());
                    }
                    continue;
                }
            }
            let mut data = vec![0u8; dev.bytes];
            // SAFETY: `dev` holds `dev.bytes` bytes.
            unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut data, dev.ptr, s.cu_stream()) }
                .map_err(|e| Stop::driver("download", e))?;
            s.synchronize().map_err(|e| Stop::driver("download", e))?;
            if is_output {
                outputs.push(data);
            } else if host.as_deref() != Some(&data[..]) {
                modified.push(b.name.clone());
            }
        }
        Ok((outputs, modified, launch_us))
    }

    /// Times both versions by the plan their measured launch times call for
    /// ([`TimingPolicy::plan`]): CUDA-graph replays of back-to-back launches that cycle
    /// over enough copies of the inputs to exceed twice the L2 (so every launch reads cold
    /// data), or, for a launch too long for a graph, each launch alone between two events,
    /// cycling over the same copies; one sample of each version in turn, so that drift
    /// affects both alike. Small shapes whose copies cannot exceed the L2 are timed warm,
    /// and the method says so. `launch_us`: each version's launch in the last check, and
    /// the reference's launch time that the steps' expected durations follow from.
    #[allow(clippy::too_many_arguments)]
    fn time_pair(
        &mut self,
        spec: &KernelSpec,
        policy: &TimingPolicy,
        kernel_args: (&[ArgValue], &[ArgValue]),
        r: (&CudaFunction, &Geometry),
        c: (&CudaFunction, &Geometry),
        base: &Buffers,
        (launch_us, reference_us): ([f64; 2], f64),
        progress: StepProgress,
    ) -> Result<[(Timing, TimingPlan); 2], Stop> {
        let s = self.stream.clone();
        let per_set: u64 = base.dev.iter().map(|d| d.bytes as u64).sum();
        let (sets, cold) = timing_sets(per_set, self.info.l2_bytes, policy.max_input_sets);
        // Seconds that `launches` launches take at the reference's measured speed.
        let expect = |launches: usize| Some(launches as f64 * reference_us * 1e-6);
        // Copies of the inputs (and outputs) for sets 1..: pooled allocations, contents
        // copied afresh every time.
        progress("timing (setup)", None);
        let sizes = base.sizes();
        let mut extra: Vec<Buffers> = Vec::with_capacity(sets - 1);
        for _ in 1..sets {
            extra.push(
                self.pool
                    .take(&sizes, &base.elems)
                    .map_err(|e| Stop::driver("allocation", e))?,
            );
        }
        for set in &extra {
            for (n, d) in set.dev.iter().zip(&base.dev) {
                // SAFETY: both hold `d.bytes` bytes.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(n.ptr, d.ptr, d.bytes, s.cu_stream())
                }
                .map_err(|e| Stop::driver("copy", e))?;
            }
        }
        let all: Vec<&Buffers> = std::iter::once(base).chain(extra.iter()).collect();
        let mut pr: Vec<Params> = all
            .iter()
            .map(|b| params(spec, kernel_args.0, b))
            .collect::<Result<_, _>>()?;
        let mut pc: Vec<Params> = all
            .iter()
            .map(|b| params(spec, kernel_args.1, b))
            .collect::<Result<_, _>>()?;
        // A first plan from the checks' launches: how many warm-up launches, and which
        // versions are too slow for a graph.
        let first = policy.plan(launch_us, sets);
        let (wr, wc) = (first[0].warmup, first[1].warmup);
        progress("timing (warm-up)", expect((wr + wc) as usize));
        for i in 0..wr.max(wc) {
            if i < wr {
                launch(&s, r.0, r.1, &mut pr[0])
                    .map_err(|e| Stop::driver("reference launch", e))?;
            }
            if i < wc {
                launch(&s, c.0, c.1, &mut pc[0])
                    .map_err(|e| Stop::driver("candidate launch", e))?;
            }
        }
        s.synchronize().map_err(|e| Stop::driver("warm-up", e))?;
        // The graph's length comes, as it always has, from a few back-to-back launches;
        // so does the choice of a graph, unless a single launch already took long enough
        // to settle it (one slowed by a hiccup is estimated again).
        let estimated = [0, 1].map(|i| !first[i].per_launch || launch_us[i] <= ESTIMATE_UP_TO_US);
        let count = estimated.iter().filter(|e| **e).count();
        if count > 0 {
            progress("timing (estimate)", expect(ESTIMATE_LAUNCHES * count));
        }
        let est_r = match estimated[0] {
            true => estimate_us(&s, r.0, r.1, &mut pr[0])?,
            false => launch_us[0],
        };
        let est_c = match estimated[1] {
            true => estimate_us(&s, c.0, c.1, &mut pc[0])?,
            false => launch_us[1],
        };
        let plan = policy.plan([est_r, est_c], sets);
        let reps = plan
            .iter()
            .find(|p| !p.per_launch)
            .map_or(0, |p| p.graph_launches as usize);
        if reps > 0 {
            progress("timing (graph capture)", None);
        }
        let reference_key = GraphCache::key(r.0, r.1, &pr, reps);
        let gr = match plan[0].per_launch {
            true => None,
            false => Some(match self.reference_graphs.take(&reference_key) {
                Some(g) => g,
                None => capture(&s, r.0, r.1, &mut pr, reps)?,
            }),
        };
        let gc = match plan[1].per_launch {
            true => None,
            false => Some(capture(&s, c.0, c.1, &mut pc, reps)?),
        };
        let round_launches: usize = plan.iter().map(|p| p.graph_launches as usize).sum();
        let per_launch_any = plan.iter().any(|p| p.per_launch);
        if !per_launch_any {
            // One message for the whole sampling: an untimed replay of each graph, rounds
            // up to the minimum or the budget, and one round past it.
            let round_s = expect(round_launches).unwrap_or(0.0);
            progress(
                "timing (replays)",
                Some(
                    (plan[0].min_samples as f64 * round_s).max(plan[0].max_seconds) + 2.0 * round_s,
                ),
            );
        }
        let samples = {
            let mut samplers = [
                Sampler::of(gr.as_ref(), reps, r, &mut pr),
                Sampler::of(gc.as_ref(), reps, c, &mut pc),
            ];
            let rule = Rule::of_plan(&plan[0], policy.target_spread);
            // Launches timed one by one send a message each round, at the reference's
            // time for the round's launches.
            let mut heartbeat = |round: usize| {
                if per_launch_any {
                    progress(&format!("timing (sample {round})"), expect(round_launches));
                }
            };
            sample_until_stable(&s, &mut samplers, &rule, &mut heartbeat)?
        };
        let figures = [0, 1].map(|i| {
            (
                stats::summarise(
                    &plan[i].method(sets, cold),
                    plan[i].graph_launches,
                    &samples[i],
                ),
                plan[i].clone(),
            )
        });
        drop(gc);
        if let Some(gr) = gr {
            self.reference_graphs.put(reference_key, gr);
        }
        // Last taken, first reused: put back in reverse, so the next job takes the same
        // sets in the same order and finds the reference's graph.
        for set in extra.into_iter().rev() {
            self.pool.put(set);
        }
        Ok(figures)
    }
}

/// How many copies of a launch's buffers (`per_set` bytes each) the timing graph cycles
/// over: enough to exceed twice the L2, so that every launch reads cold data, within
/// `max_sets` and 8 GiB; and whether that many do exceed it (small shapes capped by
/// `max_sets` are timed warm, and the method says so).
fn timing_sets(per_set: u64, l2_bytes: u64, max_sets: u32) -> (usize, bool) {
    let twice_l2 = 2 * l2_bytes;
    let per_set = per_set.max(1);
    let sets = if per_set >= twice_l2 {
        1
    } else {
        (twice_l2.div_ceil(per_set) + 1) as usize
    };
    let sets = sets
        .min(max_sets.max(1) as usize)
        .min(((8u64 << 30) / per_set).max(1) as usize);
    (sets, per_set * sets as u64 >= twice_l2)
}

fn event(s: &Arc<CudaStream>) -> Result<cudarc::driver::CudaEvent, Stop> {
    s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| Stop::driver("event", e))
}

/// One launch between two events, waited for: its time in µs. For launches of
/// milliseconds, what the events add (the host's submission of the launch) is noise.
fn timed_launch(
    s: &Arc<CudaStream>,
    f: &CudaFunction,
    g: &Geometry,
    p: &mut Params,
) -> Result<f64, Stop> {
    let e0 = event(s)?;
    launch(s, f, g, p).map_err(|e| Stop::driver("launch", e))?;
    let e1 = event(s)?;
    e1.synchronize().map_err(|e| Stop::driver("kernel", e))?;
    Ok(e0.elapsed_ms(&e1).map_err(|e| Stop::driver("event", e))? as f64 * 1e3)
}

/// Launches between the events of [`estimate_us`].
const ESTIMATE_LAUNCHES: usize = 4;

/// A version whose single launch in the checks took longer than this (µs) is timed
/// launch by launch on that figure alone, without the estimate's four more launches.
const ESTIMATE_UP_TO_US: f64 = 20_000.0;

/// µs per launch of a few back-to-back launches between events: a first estimate that
/// sizes the timing graph. Not one launch: the events would then also time whatever
/// delays its start (the host's submission of it, for one), which once made a 38 µs
/// kernel launched with a cluster look like more than 62 µs and halved its graph against
/// its rival's (docs/runs/2026-11-29-h200-dsmem-merge); the later launches are submitted
/// while the first runs.
fn estimate_us(
    s: &Arc<CudaStream>,
    f: &CudaFunction,
    g: &Geometry,
    p: &mut Params,
) -> Result<f64, Stop> {
    let e0 = event(s)?;
    for _ in 0..ESTIMATE_LAUNCHES {
        launch(s, f, g, p).map_err(|e| Stop::driver("launch", e))?;
    }
    let e1 = event(s)?;
    e1.synchronize().map_err(|e| Stop::driver("kernel", e))?;
    let ms = e0.elapsed_ms(&e1).map_err(|e| Stop::driver("event", e))? as f64;
    Ok(ms * 1e3 / ESTIMATE_LAUNCHES as f64)
}

/// One version's samples: replays of its timing graph of `reps` launches, or its
/// launches one by one over its input sets.
enum Sampler<'a> {
    Graph {
        graph: &'a cudarc::driver::CudaGraph,
        reps: usize,
    },
    Launches {
        f: &'a CudaFunction,
        g: &'a Geometry,
        params: &'a mut [Params],
    },
}

impl<'a> Sampler<'a> {
    /// Replays of `graph` when there is one, else launches one by one over `params`.
    fn of(
        graph: Option<&'a cudarc::driver::CudaGraph>,
        reps: usize,
        (f, g): (&'a CudaFunction, &'a Geometry),
        params: &'a mut [Params],
    ) -> Self {
        match graph {
            Some(graph) => Sampler::Graph { graph, reps },
            None => Sampler::Launches { f, g, params },
        }
    }
}

/// When sampling stops (see [`stats::should_stop`]).
struct Rule {
    min_samples: u32,
    max_samples: u32,
    target_spread: f64,
    max_seconds: f64,
}

impl Rule {
    fn of_policy(p: &TimingPolicy) -> Self {
        Rule {
            min_samples: p.min_samples,
            max_samples: p.max_samples,
            target_spread: p.target_spread,
            max_seconds: p.max_seconds,
        }
    }

    fn of_plan(p: &TimingPlan, target_spread: f64) -> Self {
        Rule {
            min_samples: p.min_samples,
            max_samples: p.max_samples,
            target_spread,
            max_seconds: p.max_seconds,
        }
    }
}

/// Per-launch samples (µs) of each graph of `reps` launches: one untimed replay each,
/// then one replay per sample, alternating the graphs so that drift affects them alike,
/// until every series is stable by `policy` (or its sample and time limits).
fn replay_until_stable(
    s: &Arc<CudaStream>,
    graphs: &[&cudarc::driver::CudaGraph],
    reps: usize,
    policy: &TimingPolicy,
) -> Result<Vec<Vec<f64>>, Stop> {
    let mut samplers: Vec<Sampler> = graphs
        .iter()
        .map(|&graph| Sampler::Graph { graph, reps })
        .collect();
    sample_until_stable(s, &mut samplers, &Rule::of_policy(policy), &mut |_| {})
}

/// Per-launch samples (µs) of each sampler: one untimed replay of each graph, then one
/// sample of each in turn, so that drift affects them alike, until every series is
/// stable by `rule` (or its sample and time limits). `heartbeat(n)` comes before the
/// n-th round (from 1). Launches timed one by one take their input sets in turn with one
/// counter for every sampler, so that no launch finds in the L2 the inputs that the
/// launch before it read.
fn sample_until_stable(
    s: &Arc<CudaStream>,
    samplers: &mut [Sampler],
    rule: &Rule,
    heartbeat: &mut dyn FnMut(usize),
) -> Result<Vec<Vec<f64>>, Stop> {
    let time_graph = |g: &cudarc::driver::CudaGraph, reps: usize| -> Result<f64, Stop> {
        let e0 = event(s)?;
        g.launch().map_err(|e| Stop::driver("graph launch", e))?;
        let e1 = event(s)?;
        e1.synchronize().map_err(|e| Stop::driver("kernel", e))?;
        Ok(e0.elapsed_ms(&e1).map_err(|e| Stop::driver("event", e))? as f64 * 1e3 / reps as f64)
    };
    for sampler in samplers.iter() {
        if let Sampler::Graph { graph, reps } = sampler {
            time_graph(graph, *reps)?;
        }
    }
    let mut samples = vec![Vec::new(); samplers.len()];
    let mut next_set = 0usize;
    let t0 = Instant::now();
    loop {
        heartbeat(samples[0].len() + 1);
        for (sampler, out) in samplers.iter_mut().zip(samples.iter_mut()) {
            out.push(match sampler {
                Sampler::Graph { graph, reps } => time_graph(graph, *reps)?,
                Sampler::Launches { f, g, params } => {
                    let n = params.len();
                    let us = timed_launch(s, f, g, &mut params[next_set % n])?;
                    next_set += 1;
                    us
                }
            });
        }
        let el = t0.elapsed().as_secs_f64();
        if samples.iter().all(|v| {
            stats::should_stop(
                v,
                rule.min_samples,
                rule.max_samples,
                rule.target_spread,
                el,
                rule.max_seconds,
            )
        }) {
            return Ok(samples);
        }
    }
}

/// Flags whether two byte ranges differ: the input-modified check, on the device.
const DIFFER_SOURCE: &str = r#"
extern "C" __global__ void kopt_bytes_differ(const unsigned char* a, const unsigned char* b,
                                             unsigned long long n, unsigned int* flag) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += stride) {
        if (a[i] != b[i]) {
            *flag = 1u;
            return;
        }
    }
}
"#;

/// The one-launch copy kernel of the same-size copy roof: 16-byte vectors, four in flight
/// per thread, streaming loads and stores (neither is read again), grid-stride (the launch
/// caps the grid at a full device).
const COPY_SOURCE: &str = r#"
extern "C" __global__ void __launch_bounds__(256) kopt_copy(const uint4* __restrict__ src,
                                                         uint4* __restrict__ dst,
                                                         unsigned long long n) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride),
                    c = __ldcs(src + i + 2 * stride), d = __ldcs(src + i + 3 * stride);
        __stcs(dst + i, a);
        __stcs(dst + i + stride, b);
        __stcs(dst + i + 2 * stride, c);
        __stcs(dst + i + 3 * stride, d);
    }
    for (; i < n; i += stride) __stcs(dst + i, __ldcs(src + i));
}
"#;

/// A device copy of `data` (plain allocation, so compute-sanitizer sees its bounds).
fn upload(s: &CudaStream, data: &[u8]) -> Result<DeviceBuf, String> {
    let buf = DeviceBuf::new(data.len()).map_err(|e| format!("allocation: {e:?}"))?;
    if !data.is_empty() {
        // SAFETY: `buf` holds `data.len()` bytes; the copy completes before return.
        unsafe { cudarc::driver::result::memcpy_htod_async(buf.ptr, data, s.cu_stream()) }
            .map_err(|e| format!("upload: {e:?}"))?;
        s.synchronize().map_err(|e| format!("upload: {e:?}"))?;
    }
    Ok(buf)
}

/// Kernel parameters: one 8-byte cell per pointer or scalar argument (a scalar's bytes in
/// its low bytes), one encoded map per tensor map argument, and the order the driver reads
/// them in.
struct Params {
    cells: Vec<u64>,
    maps: Vec<kopt::tensor_map::TensorMap>,
    order: Vec<Slot>,
}

enum Slot {
    Cell(usize),
    Map(usize),
}

impl Params {
    /// Pointers and scalars only, in order.
    fn cells(cells: Vec<u64>) -> Params {
        Params {
            order: (0..cells.len()).map(Slot::Cell).collect(),
            cells,
            maps: Vec::new(),
        }
    }
}

/// The parameters of one launch from the version's kernel arguments
/// ([`KernelVersion::arg_values`]): launch-only scalars are not among them, computed ones
/// and tensor maps (encoded over this buffer set, as the launcher encodes them) are.
fn params(spec: &KernelSpec, kernel_args: &[ArgValue], bufs: &Buffers) -> Result<Params, Stop> {
    let mut p = Params {
        cells: Vec::new(),
        maps: Vec::new(),
        order: Vec::with_capacity(kernel_args.len()),
    };
    for a in kernel_args {
        match *a {
            ArgValue::Buffer(i) => {
                p.cells.push(bufs.dev[i].ptr);
                p.order.push(Slot::Cell(p.cells.len() - 1));
            }
            ArgValue::Scalar(ty, v) => {
                p.cells.push(scalar_cell(ty, v));
                p.order.push(Slot::Cell(p.cells.len() - 1));
            }
            ArgValue::TensorMap { index, args: m } => {
                let name = &spec.tensor_maps[index].name;
                let map = kopt::tensor_map::encode(name, &m, bufs.dev[m.buffer].ptr)
                    .map_err(Stop::Error)?;
                p.maps.push(map);
                p.order.push(Slot::Map(p.maps.len() - 1));
            }
        }
    }
    Ok(p)
}

/// A scalar's bytes in the low bytes of a cell (little-endian, as the driver reads them).
fn scalar_cell(ty: ScalarTy, v: Number) -> u64 {
    let i = v.as_i64().unwrap_or(v.as_f64() as i64);
    match ty {
        ScalarTy::I32 => (i as i32) as u32 as u64,
        ScalarTy::U32 => i as u32 as u64,
        ScalarTy::I64 | ScalarTy::U64 | ScalarTy::Usize => i as u64,
        ScalarTy::F32 => (v.as_f64() as f32).to_bits() as u64,
        ScalarTy::F64 => v.as_f64().to_bits(),
    }
}

fn launch(
    s: &CudaStream,
    f: &CudaFunction,
    g: &Geometry,
    p: &mut Params,
) -> Result<(), kopt::Error> {
    let Params { cells, maps, order } = p;
    let mut ptrs: Vec<*mut c_void> = order
        .iter()
        .map(|s| match *s {
            Slot::Cell(i) => &mut cells[i] as *mut u64 as *mut c_void,
            Slot::Map(i) => &mut maps[i] as *mut _ as *mut c_void,
        })
        .collect();
    // SAFETY: `ptrs` points at one cell or map per kernel parameter, in order, sized for it.
    // The launcher's own path (kopt::launch_kernel), cluster attribute included.
    unsafe {
        kopt::launch_kernel(
            f.cu_function(),
            (g.grid[0], g.grid[1], g.grid[2]),
            (g.block[0], g.block[1], g.block[2]),
            (g.cluster[0], g.cluster[1], g.cluster[2]),
            g.smem,
            s.cu_stream(),
            &mut ptrs,
        )
    }
}

/// A graph of `reps` driver copies of `bytes` bytes, cycling over the (source,
/// destination) pairs: the other half of the same-size copy roof (the faster of this and
/// the copy kernel counts).
fn capture_copies(
    s: &Arc<CudaStream>,
    pairs: &[(DeviceBuf, DeviceBuf)],
    bytes: usize,
    reps: usize,
) -> Result<cudarc::driver::CudaGraph, Stop> {
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(|e| Stop::driver("graph capture", e))?;
    for i in 0..reps {
        let (src, dst) = &pairs[i % pairs.len()];
        // SAFETY: both hold `bytes` bytes.
        let r = unsafe {
            cudarc::driver::result::memcpy_dtod_async(dst.ptr, src.ptr, bytes, s.cu_stream())
        };
        if let Err(e) = r {
            let _ = s.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
            return Err(Stop::driver("copy under capture", e));
        }
    }
    s.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
        .map_err(|e| Stop::driver("graph instantiate", e))?
        .ok_or_else(|| Stop::Error("empty graph".into()))
}

/// A graph of `reps` launches, cycling over the parameter sets.
fn capture(
    s: &Arc<CudaStream>,
    f: &CudaFunction,
    g: &Geometry,
    p: &mut [Params],
    reps: usize,
) -> Result<cudarc::driver::CudaGraph, Stop> {
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(|e| Stop::driver("graph capture", e))?;
    let n = p.len();
    for i in 0..reps {
        if let Err(e) = launch(s, f, g, &mut p[i % n]) {
            let _ = s.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
            return Err(Stop::driver("launch under capture", e));
        }
    }
    s.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
        .map_err(|e| Stop::driver("graph instantiate", e))?
        .ok_or_else(|| Stop::Error("empty graph".into()))
}

fn occupancy(f: &CudaFunction, g: &Geometry, info: &DeviceInfo) -> Option<Occupancy> {
    let threads = g.block[0] * g.block[1] * g.block[2];
    let blocks = f
        .occupancy_max_active_blocks_per_multiprocessor(threads, g.smem as usize, None)
        .ok()?;
    let max_active_clusters = if g.cluster == [1, 1, 1] {
        None
    } else {
        // SAFETY: `f` belongs to this worker's context, current on this thread.
        unsafe {
            kopt::max_active_clusters(
                f.cu_function(),
                (g.grid[0], g.grid[1], g.grid[2]),
                (g.block[0], g.block[1], g.block[2]),
                (g.cluster[0], g.cluster[1], g.cluster[2]),
                g.smem,
            )
        }
        .ok()
    };
    Some(Occupancy {
        blocks_per_sm: blocks,
        warps_per_sm: blocks * threads.div_ceil(32),
        max_warps_per_sm: info.max_warps_per_sm,
        max_active_clusters,
    })
}

fn compare_outputs(
    spec: &KernelSpec,
    args: &[i64],
    got: &[Bytes],
    want: &[Bytes],
) -> Vec<OutputComparison> {
    spec.buffers()
        .filter(|b| b.is_output())
        .zip(got.iter().zip(want))
        .map(|(b, (g, w))| {
            let dims = buffer_dims(&b.len, spec, args);
            compare(
                &b.name,
                b.dtype,
                b.effective_tolerance(spec),
                g,
                w,
                dims.as_deref(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{graph_reps, timing_sets};
    use crate::job::TimingPolicy;

    #[test]
    fn graphs_hold_the_policy_minimum_of_launches_and_whole_rounds_of_input_sets() {
        let policy = TimingPolicy::default();
        // 500 µs of a 38 µs kernel is 14 launches, 16 as a power of two: the minimum wins.
        assert_eq!(graph_reps(&policy, 38.0, 1), 32);
        // Short kernels: the time target gives more.
        assert_eq!(graph_reps(&policy, 2.0, 1), 256);
        // A multiple of the input sets, so that each replay reads every set alike.
        assert_eq!(graph_reps(&policy, 38.0, 5) % 5, 0);
        assert!(graph_reps(&policy, 38.0, 5) >= 32);
        // Never more than 2048, whatever the target.
        let long = TimingPolicy {
            graph_target_us: 1e6,
            ..TimingPolicy::default()
        };
        assert_eq!(graph_reps(&long, 1.0, 1), 2048);
        let search = TimingPolicy {
            min_graph_launches: 1,
            graph_target_us: 100.0,
            ..TimingPolicy::default()
        };
        assert_eq!(graph_reps(&search, 38.0, 1), 4);
    }

    #[test]
    fn timing_sets_exceed_twice_the_l2_when_they_can() {
        let l2 = 60 << 20;
        assert_eq!(timing_sets(200 << 20, l2, 64), (1, true));
        let (sets, cold) = timing_sets(4 << 20, l2, 64);
        assert!(cold && sets as u64 * (4 << 20) >= 2 * l2);
        // Capped: timed warm, and the method says so.
        assert_eq!(timing_sets(1 << 10, l2, 64), (64, false));
    }
}
