//! What a generated launcher does besides launching, when the process asks for it:
//!
//! - **capture** (`KOPT_CAPTURE=DIR`): per kernel and tuple of scalar arguments, the launch
//!   count, the versions that ran, the GPU time of sampled launches (CUDA events around
//!   one launch in `KOPT_CAPTURE_TIME_EVERY`, read when they complete: the program is not
//!   serialised), and the input buffers of the first `KOPT_CAPTURE_INPUTS` launches (within
//!   `KOPT_CAPTURE_MAX_BYTES` for the process). Copying inputs waits for the stream to
//!   reach the launch (a synchronisation) and copies them to the host: what it costs is
//!   the price of the first few launches of each case, not of the others. The format is
//!   [`kopt_spec::capture`].
//! - **shadow checks** (`KOPT_SHADOW=RATE`): one launch in `1 / RATE` of an accepted
//!   variant also runs the reference, on the same stream, into scratch buffers, and kopt's
//!   comparison kernel judges every output element on the device by the kernel's
//!   tolerance rule ([`kopt_spec::capture::ToleranceRule`], the engine's). The result is read
//!   when its event completes. Divergences are counted and the first few recorded
//!   ([`Kernel::shadow_report`]); with `KOPT_SHADOW_FALLBACK=1` the kernel runs the
//!   reference for the rest of the process after one.
//!
//! Unset, neither costs more than one load of a once-initialised value per launch. The
//! settings are read at the first launch of the process; a malformed one fails that
//! launch with an error naming the variable.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use kopt_spec::capture::{
    self, CaptureManifest, CaptureSettings, CaseCapture, Divergence, InputSample, KernelCapture,
    ShadowRecord, Tensor, ToleranceRule,
};
use kopt_spec::spec::{DType, Direction, Number, ScalarTy};

use crate::kernel::{Kernel, Launch};
use crate::Error;

/// The folder captures go to (each process writes a folder of its own in it).
pub const CAPTURE: &str = "KOPT_CAPTURE";
/// Launches of each case whose inputs are kept (default 2).
pub const CAPTURE_INPUTS: &str = "KOPT_CAPTURE_INPUTS";
/// The most input bytes one process keeps (default 1 GiB; `K`, `M`, `G` suffixes).
pub const CAPTURE_MAX_BYTES: &str = "KOPT_CAPTURE_MAX_BYTES";
/// One launch in this many of a case is timed (default 16; the first timed is the first
/// whose inputs are not kept).
pub const CAPTURE_TIME_EVERY: &str = "KOPT_CAPTURE_TIME_EVERY";
/// The share of an accepted variant's launches checked against the reference (0 to 1).
pub const SHADOW: &str = "KOPT_SHADOW";
/// After a divergence, the kernel runs the reference for the rest of the process.
pub const SHADOW_FALLBACK: &str = "KOPT_SHADOW_FALLBACK";

/// Divergences kept per kernel in full.
const FIRST_DIVERGENCES: usize = 8;
/// Checks in flight before a launch waits for the oldest.
const CHECKS_IN_FLIGHT: usize = 64;

/// The process's observer, or `None` when nothing was asked for.
pub(crate) fn observer() -> Result<Option<&'static Observer>, Error> {
    static OBSERVER: OnceLock<Result<Option<Observer>, String>> = OnceLock::new();
    match OBSERVER.get_or_init(|| Observer::from_env(&|k| std::env::var(k).ok())) {
        Ok(o) => Ok(o.as_ref()),
        Err(e) => Err(Error::Observe(e.clone())),
    }
}

/// Waits for the timings and shadow checks in flight, records them, and writes the
/// capture's manifest: call it before the process ends (a manifest is also written as
/// launches go, at most once a second, and at exit without what was still in flight).
/// Does nothing when neither capture nor shadow checks are on.
pub fn flush() -> Result<(), Error> {
    let Some(o) = observer()? else {
        return Ok(());
    };
    let mut st = o.lock();
    st.poll(o, true)?;
    if let Some(c) = &o.capture {
        st.write_manifest(o, c)?;
    }
    Ok(())
}

/// The folder this process's capture goes to, when `KOPT_CAPTURE` is set.
pub fn capture_dir() -> Option<PathBuf> {
    observer()
        .ok()
        .flatten()
        .and_then(|o| o.capture.as_ref())
        .map(|c| c.dir.clone())
}

pub(crate) struct Observer {
    capture: Option<Capture>,
    shadow: Option<Shadow>,
    state: Mutex<State>,
}

struct Capture {
    /// The program's name (its executable's file stem), and this process's folder.
    program: String,
    dir: PathBuf,
    settings: CaptureSettings,
}

struct Shadow {
    /// Check one launch in this many (0: none).
    period: u64,
    fallback: bool,
}

fn env_flag(v: Option<String>) -> bool {
    v.is_some_and(|v| !matches!(v.trim(), "" | "0" | "false" | "no" | "off"))
}

fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => (&t[..i], t[i..].trim()),
        None => (t, ""),
    };
    let n: u64 = digits.parse().ok()?;
    let mult = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

impl Observer {
    /// The observer the environment asks for (`var` reads a variable), or what is wrong
    /// with it.
    fn from_env(var: &dyn Fn(&str) -> Option<String>) -> Result<Option<Observer>, String> {
        let number = |name: &str, default: u64| -> Result<u64, String> {
            match var(name) {
                None => Ok(default),
                Some(v) => v.trim().parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                    format!("{name}={v} is not a positive whole number; unset it or give one (e.g. {name}={default})")
                }),
            }
        };
        let capture = match var(CAPTURE).filter(|v| !v.trim().is_empty()) {
            None => None,
            Some(dir) => {
                let max_bytes = match var(CAPTURE_MAX_BYTES) {
                    None => 1 << 30,
                    Some(v) => parse_bytes(&v).ok_or_else(|| {
                        format!("{CAPTURE_MAX_BYTES}={v} is not a byte count; give one such as 512M or 2G")
                    })?,
                };
                let settings = CaptureSettings {
                    inputs_per_case: number(CAPTURE_INPUTS, 2)? as u32,
                    max_bytes,
                    time_every: number(CAPTURE_TIME_EVERY, 16)? as u32,
                };
                let program = std::env::current_exe()
                    .ok()
                    .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
                    .unwrap_or_else(|| "program".into());
                let folder = format!(
                    "{program}-{}-{}",
                    std::process::id(),
                    unix_ms(SystemTime::now())
                );
                Some(Capture {
                    dir: Path::new(&dir).join(folder),
                    program,
                    settings,
                })
            }
        };
        let shadow = match var(SHADOW).filter(|v| !v.trim().is_empty()) {
            None => None,
            Some(v) => {
                let rate: f64 = v
                    .trim()
                    .parse()
                    .ok()
                    .filter(|r: &f64| (0.0..=1.0).contains(r))
                    .ok_or_else(|| {
                        format!("{SHADOW}={v} is not a rate between 0 and 1 (the share of a variant's launches checked against the reference, e.g. 0.001)")
                    })?;
                Some(Shadow {
                    period: if rate > 0.0 {
                        (1.0 / rate).round().max(1.0) as u64
                    } else {
                        0
                    },
                    fallback: env_flag(var(SHADOW_FALLBACK)),
                })
            }
        };
        if capture.is_none() && shadow.is_none() {
            return Ok(None);
        }
        let observer = Observer {
            capture,
            shadow,
            state: Mutex::new(State::default()),
        };
        if observer.capture.is_some() {
            register_exit_write();
        }
        Ok(Some(observer))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A launch with what was asked for around it.
    ///
    /// # Safety
    /// As [`Launch::launch`].
    pub(crate) unsafe fn launch(
        &'static self,
        l: &Launch<'_>,
        stream: &CudaStream,
        params: &mut [*mut c_void],
    ) -> Result<(), Error> {
        let kernel = l.owner;
        let mut st = self.lock();
        st.poll(self, false)?;
        if st.started_ms == 0 {
            st.started_ms = unix_ms(SystemTime::now());
            let ctx = stream.context();
            st.device = ctx.name().unwrap_or_default();
            if let Ok((major, minor)) = ctx.compute_capability() {
                st.arch = kopt_spec::files::arch_name(major as u32, minor as u32);
            }
        }
        let spec = kernel.spec();
        let k = st.kernel_index(kernel);
        let variant = l
            .version
            .map(|i| kernel.def().variants[i].id)
            .unwrap_or("reference");
        // Capture: the case, its inputs, and whether this launch is timed.
        let mut timed = None;
        if let Some(c) = &self.capture {
            let numbers = scalar_numbers(spec, l.args, params);
            let case = st.case_index(k, spec, &numbers);
            let n = {
                let rec = &mut st.kernels[k].cases[case].record;
                rec.launches += 1;
                match rec.versions.get_mut(variant) {
                    Some(count) => *count += 1,
                    None => {
                        rec.versions.insert(variant.to_string(), 1);
                    }
                }
                rec.launches
            };
            let keep =
                st.kernels[k].cases[case].record.inputs.len() < c.settings.inputs_per_case as usize;
            if keep {
                st.keep_inputs(c, l, stream, params, (k, case), (n, variant))?;
            }
            if timed_launch(n, &c.settings) {
                timed = Some(case);
            }
        }
        // Shadow: this launch of a variant is checked.
        let checked = match (&self.shadow, l.version) {
            (Some(s), Some(_)) if s.period > 0 => {
                let sh = &mut st.kernels[k].shadow;
                sh.launches += 1;
                (sh.launches - 1).is_multiple_of(s.period)
            }
            _ => false,
        };
        let pre = if checked {
            Some(st.shadow_prepare(kernel, l, stream, params)?)
        } else {
            None
        };
        match timed {
            Some(case) => {
                let start = cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                    .map_err(Error::driver)?;
                let end = cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                    .map_err(Error::driver)?;
                cu::event::record(start, stream.cu_stream()).map_err(Error::driver)?;
                l.enqueue(stream, params)?;
                cu::event::record(end, stream.cu_stream()).map_err(Error::driver)?;
                st.timings.push(PendingTiming {
                    kernel: k,
                    case,
                    start,
                    end,
                });
            }
            None => l.enqueue(stream, params)?,
        }
        if let Some(pre) = pre {
            st.shadow_check(kernel, k, l, stream, params, pre, variant)?;
        }
        if let Some(c) = &self.capture {
            let due = st
                .last_manifest
                .is_none_or(|t| t.elapsed().as_secs_f64() >= 1.0);
            if due || st.new_case {
                st.new_case = false;
                st.write_manifest(self, c)?;
            }
        }
        Ok(())
    }
}

/// Whether launch `n` (1 the first) of a case is timed: the first after those whose
/// inputs are kept, then one in `time_every`. The kept launches are not: the stream was
/// synchronised before them, so their events would count the launch's latency from an
/// idle device, and a case's first launch may load its code (the driver's lazy loading).
fn timed_launch(n: u64, s: &CaptureSettings) -> bool {
    let first = s.inputs_per_case as u64 + 1;
    n >= first && (n - first).is_multiple_of(s.time_every as u64)
}

/// Whether the work before `event` is done: waiting for it with `wait`, else asking.
fn done(event: sys::CUevent, wait: bool) -> Result<bool, Error> {
    // SAFETY: the events this module records, not yet destroyed.
    unsafe {
        if wait {
            cu::event::synchronize(event).map_err(Error::driver)?;
            Ok(true)
        } else {
            Ok(cu::event::query(event).is_ok())
        }
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn number_bits(n: Number) -> u64 {
    match n {
        Number::Int(i) => i as u64,
        Number::Float(f) => f.to_bits(),
    }
}

/// Every launcher scalar of this launch, in the spec's order: the integers as the launcher
/// received them (`args`, which holds sizes that are no kernel argument too, such as a row
/// count that only sets the grid), the floats read from the kernel's parameters (0 for a
/// float the kernel is not passed). Allocates the kernel's argument list only for a kernel
/// with a float scalar.
///
/// # Safety
/// `pool` holds the launch's pool ([`KernelSpec::pool_index`]): the parameters first.
unsafe fn scalar_numbers(
    spec: &kopt_spec::KernelSpec,
    args: &[i64],
    pool: &[*mut c_void],
) -> Vec<Number> {
    let scalars = spec
        .params
        .iter()
        .zip(pool)
        .filter_map(|(p, slot)| match p {
            kopt_spec::spec::Param::Scalar(s) => Some((s, *slot)),
            kopt_spec::spec::Param::Buffer(_) => None,
        });
    scalars
        .zip(args)
        .map(|((s, slot), &v)| {
            if s.ty.is_float() {
                read_float(s.ty, slot)
            } else {
                Number::Int(v)
            }
        })
        .collect()
}

/// Scalars by name, from [`scalar_numbers`].
fn named(spec: &kopt_spec::KernelSpec, numbers: &[Number]) -> BTreeMap<String, Number> {
    spec.scalars()
        .zip(numbers)
        .map(|(s, v)| (s.name.clone(), *v))
        .collect()
}

/// A float argument: an `f32` as the shortest decimal that reads back as it (`1e-5`, not
/// `9.99999974737875e-6`), the value a shape would declare.
unsafe fn read_float(ty: ScalarTy, p: *mut c_void) -> Number {
    match ty {
        ScalarTy::F32 => {
            let v = *(p as *const f32);
            Number::Float(format!("{v}").parse().unwrap_or(v as f64))
        }
        _ => Number::Float(*(p as *const f64)),
    }
}

/// The device pointer a buffer's parameter slot holds.
unsafe fn device_ptr(p: *mut c_void) -> sys::CUdeviceptr {
    *(p as *const sys::CUdeviceptr)
}

/// A buffer of a launch.
struct Output {
    /// Its slot in the launch's pool (its parameter's position).
    slot: usize,
    name: &'static str,
    def: &'static kopt_spec::spec::Buffer,
    /// Its length at this launch, in elements.
    n: usize,
}

/// A kernel's buffers at this launch, in parameter order (their slots in the launch's
/// pool).
fn buffers(kernel: &'static Kernel, args: &[i64]) -> Result<Vec<Output>, Error> {
    kernel
        .spec()
        .params
        .iter()
        .enumerate()
        .filter_map(|(slot, p)| match p {
            kopt_spec::spec::Param::Buffer(def) => Some((slot, def)),
            kopt_spec::spec::Param::Scalar(_) => None,
        })
        .enumerate()
        .map(|(buffer, (slot, def))| {
            let b = &kernel.def().buffers[buffer];
            let n = kopt_spec::expr::eval(b.len, args).map_err(|e| Error::Expr {
                kernel: kernel.name(),
                what: "the length of",
                item: b.name,
                error: e,
            })?;
            Ok(Output {
                slot,
                name: b.name,
                def,
                n: n.max(0) as usize,
            })
        })
        .collect()
}

#[derive(Default)]
struct State {
    started_ms: u64,
    device: String,
    arch: String,
    kernels: Vec<KernelState>,
    timings: Vec<PendingTiming>,
    checks: Vec<PendingCheck>,
    bytes_written: u64,
    last_manifest: Option<Instant>,
    /// A case appeared since the last manifest.
    new_case: bool,
    /// kopt's comparison kernels, per context.
    comparers: Vec<(usize, Arc<Comparers>)>,
    /// Device results buffers no check uses, per context.
    result_pool: Vec<(usize, DeviceBuf)>,
    /// Pinned host results no check uses (pinning memory is slow: each is reused).
    host_pool: Vec<HostResults>,
}

struct KernelState {
    kernel: &'static Kernel,
    cases: Vec<CaseState>,
    shadow: ShadowState,
}

struct CaseState {
    key: Vec<u64>,
    record: CaseCapture,
}

#[derive(Default)]
struct ShadowState {
    /// Launches of a variant seen (sampling counts these).
    launches: u64,
    checks: u64,
    divergences: u64,
    first: Vec<Divergence>,
    /// Scratch outputs and in-out copies, per stream (checks on one stream run in order;
    /// two streams must not share them): (stream, buffers).
    scratch: Vec<(usize, Vec<DeviceBuf>)>,
}

struct PendingTiming {
    kernel: usize,
    case: usize,
    start: sys::CUevent,
    end: sys::CUevent,
}

// SAFETY: CUDA events may be used from any thread; these are touched only under the
// observer's lock.
unsafe impl Send for PendingTiming {}
unsafe impl Send for PendingCheck {}

struct PendingCheck {
    kernel: usize,
    /// The device results, back to the pool once read.
    device: Option<(usize, DeviceBuf)>,
    variant: &'static str,
    scalars: BTreeMap<String, Number>,
    /// Output buffer names, in the results' order.
    outputs: Vec<&'static str>,
    results: HostResults,
    done: sys::CUevent,
}

/// A device allocation kopt owns.
struct DeviceBuf {
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl DeviceBuf {
    fn new(bytes: usize) -> Result<DeviceBuf, Error> {
        // SAFETY: a plain allocation in the current context.
        let ptr = unsafe { cu::malloc_sync(bytes.max(1)) }.map_err(Error::driver)?;
        Ok(DeviceBuf { ptr, bytes })
    }
}

impl Drop for DeviceBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by `new`, freed once; callers drop a buffer only once no work
        // on the device uses it.
        let _ = unsafe { cu::free_sync(self.ptr) };
    }
}

/// Pinned host memory the device's results are copied into.
struct HostResults {
    ptr: *mut c_void,
    len: usize,
}

// SAFETY: the pinned buffer is plain memory owned by one pending check, touched only under
// the observer's lock.
unsafe impl Send for HostResults {}

impl HostResults {
    fn new(outputs: usize) -> Result<HostResults, Error> {
        let len = outputs * RESULT_BYTES;
        // SAFETY: pinned host allocation of `len` bytes.
        let ptr = unsafe { cu::malloc_host(len.max(1), 0) }.map_err(Error::driver)?;
        Ok(HostResults { ptr, len })
    }

    fn read(&self, i: usize) -> DeviceResult {
        // SAFETY: `ptr` holds `len` bytes, `i` results of RESULT_BYTES fit.
        let b = unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) };
        let r = &b[i * RESULT_BYTES..(i + 1) * RESULT_BYTES];
        let u = |o: usize| u64::from_le_bytes(r[o..o + 8].try_into().expect("8 bytes"));
        let f = |o: usize| f64::from_bits(u(o));
        DeviceResult {
            failing: u(0),
            first: u(8),
            got: f(16),
            want: f(24),
            allowed: f(32),
        }
    }
}

impl Drop for HostResults {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc_host, freed once.
        let _ = unsafe { cu::free_host(self.ptr) };
    }
}

/// What the comparison kernels leave for one output buffer.
struct DeviceResult {
    failing: u64,
    first: u64,
    got: f64,
    want: f64,
    allowed: f64,
}

/// `{ failing, first, got, want, allowed }`, 8 bytes each.
const RESULT_BYTES: usize = 40;

/// The comparison kernels of one context.
struct Comparers {
    /// Per dtype: the comparison over rows, and the fetch of the first failing element.
    kernels: Vec<(DType, CudaFunction, CudaFunction)>,
    _ctx: Arc<CudaContext>,
}

/// What a shadow check sets up before the variant runs: scratch outputs for the reference,
/// in-out buffers copied to them (the reference starts from what the variant started
/// from), and the device results.
struct Prepared {
    /// The outputs at this launch: parameter slot, name, definition, elements.
    outputs: Vec<Output>,
    /// Per output, in that order: the scratch pointer the reference uses instead.
    scratch: Vec<sys::CUdeviceptr>,
    /// The context, and the device results.
    results: (usize, DeviceBuf),
}

impl State {
    fn kernel_index(&mut self, kernel: &'static Kernel) -> usize {
        match self
            .kernels
            .iter()
            .position(|k| std::ptr::eq(k.kernel, kernel))
        {
            Some(i) => i,
            None => {
                self.kernels.push(KernelState {
                    kernel,
                    cases: Vec::new(),
                    shadow: ShadowState::default(),
                });
                self.kernels.len() - 1
            }
        }
    }

    /// The case of these scalars (in the spec's order), made on their first launch.
    fn case_index(&mut self, k: usize, spec: &kopt_spec::KernelSpec, numbers: &[Number]) -> usize {
        let same = |key: &[u64]| {
            key.iter()
                .copied()
                .eq(numbers.iter().map(|n| number_bits(*n)))
        };
        let cases = &mut self.kernels[k].cases;
        if let Some(i) = cases.iter().position(|c| same(&c.key)) {
            return i;
        }
        cases.push(CaseState {
            key: numbers.iter().map(|n| number_bits(*n)).collect(),
            record: CaseCapture {
                scalars: named(spec, numbers),
                launches: 0,
                versions: BTreeMap::new(),
                timed_launches: 0,
                timed_us: 0.0,
                inputs: Vec::new(),
                inputs_over_cap: 0,
            },
        });
        self.new_case = true;
        cases.len() - 1
    }

    /// Copies this launch's inputs to a safetensors file, once the stream has reached it.
    unsafe fn keep_inputs(
        &mut self,
        c: &Capture,
        l: &Launch<'_>,
        stream: &CudaStream,
        params: &[*mut c_void],
        (k, case): (usize, usize),
        (launch, variant): (u64, &str),
    ) -> Result<(), Error> {
        let kernel = l.owner;
        let spec = kernel.spec();
        let inputs: Vec<Output> = buffers(kernel, l.args)?
            .into_iter()
            .filter(|o| o.def.direction != Direction::Out)
            .collect();
        let bytes: u64 = inputs
            .iter()
            .map(|o| (o.n * o.def.dtype.size()) as u64)
            .sum();
        if self.bytes_written + bytes > c.settings.max_bytes {
            self.kernels[k].cases[case].record.inputs_over_cap += 1;
            return Ok(());
        }
        stream.synchronize().map_err(Error::driver)?;
        let args = l.args;
        let mut tensors = Vec::new();
        for Output { slot, name, def, n } in inputs {
            let mut data = vec![0u8; n * def.dtype.size()];
            if !data.is_empty() {
                cu::memcpy_dtoh_sync(&mut data, device_ptr(params[slot])).map_err(Error::driver)?;
            }
            let shape = kopt_spec::shapes::buffer_dims(&def.len, spec, args)
                .filter(|d| d.iter().map(|(_, n)| *n).product::<u64>() == n as u64)
                .map(|d| d.into_iter().map(|(_, n)| n).collect())
                .unwrap_or_else(|| vec![n as u64]);
            tensors.push(Tensor {
                name: name.to_string(),
                dtype: def.dtype,
                shape,
                data,
            });
        }
        let record = &self.kernels[k].cases[case].record;
        let meta = BTreeMap::from([
            ("kernel".to_string(), kernel.name().to_string()),
            (
                "spec_hash".to_string(),
                kopt_spec::source::hash(kernel.def().spec_json.as_bytes()),
            ),
            (
                "scalars".to_string(),
                serde_json::to_string(&record.scalars).expect("numbers serialise"),
            ),
            ("launch".to_string(), launch.to_string()),
            ("version".to_string(), variant.to_string()),
        ]);
        let rel = format!("{}/c{case}-l{launch}.safetensors", kernel.name());
        let refs: Vec<&Tensor> = tensors.iter().collect();
        let file = capture::write_safetensors(&refs, &meta);
        kopt_spec::files::write_atomic(&c.dir.join(&rel), &file).map_err(|e| {
            Error::Observe(format!(
                "cannot write the captured inputs {}: {e}",
                c.dir.join(&rel).display()
            ))
        })?;
        self.bytes_written += bytes;
        self.kernels[k].cases[case].record.inputs.push(InputSample {
            file: rel,
            launch,
            version: variant.to_string(),
        });
        Ok(())
    }

    /// Records what completed: timings and shadow checks (all of them, waiting, with
    /// `wait`; else those done, and the oldest checks beyond [`CHECKS_IN_FLIGHT`]).
    fn poll(&mut self, o: &Observer, wait: bool) -> Result<(), Error> {
        let mut i = 0;
        while i < self.timings.len() {
            if !done(self.timings[i].end, wait)? {
                i += 1;
                continue;
            }
            let t = self.timings.swap_remove(i);
            // SAFETY: both recorded on one stream and complete.
            let ms = unsafe { cu::event::elapsed(t.start, t.end) }.map_err(Error::driver)?;
            unsafe {
                let _ = cu::event::destroy(t.start);
                let _ = cu::event::destroy(t.end);
            }
            let rec = &mut self.kernels[t.kernel].cases[t.case].record;
            rec.timed_launches += 1;
            rec.timed_us += ms as f64 * 1e3;
        }
        let mut i = 0;
        while i < self.checks.len() {
            let must = wait || self.checks.len() > CHECKS_IN_FLIGHT;
            if !done(self.checks[i].done, must)? {
                i += 1;
                continue;
            }
            let mut c = self.checks.remove(i);
            unsafe {
                let _ = cu::event::destroy(c.done);
            }
            self.result_pool.extend(c.device.take());
            self.record_check(o, &c);
            self.host_pool.push(c.results);
        }
        Ok(())
    }

    fn record_check(&mut self, o: &Observer, c: &PendingCheck) {
        let ks = &mut self.kernels[c.kernel];
        ks.shadow.checks += 1;
        let mut diverged = false;
        for (i, buffer) in c.outputs.iter().enumerate() {
            let r = c.results.read(i);
            if r.failing == 0 {
                continue;
            }
            diverged = true;
            if ks.shadow.first.len() < FIRST_DIVERGENCES {
                ks.shadow.first.push(Divergence {
                    variant: c.variant.to_string(),
                    scalars: c.scalars.clone(),
                    buffer: buffer.to_string(),
                    failing: r.failing,
                    index: r.first,
                    got: r.got,
                    want: r.want,
                    allowed: r.allowed,
                });
            }
        }
        if diverged {
            ks.shadow.divergences += 1;
            if o.shadow.as_ref().is_some_and(|s| s.fallback) {
                ks.kernel.fell_back.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Scratch buffers for the reference and the device results of one check.
    unsafe fn shadow_prepare(
        &mut self,
        kernel: &'static Kernel,
        l: &Launch<'_>,
        stream: &CudaStream,
        params: &[*mut c_void],
    ) -> Result<Prepared, Error> {
        let ctx = stream.context().cu_ctx() as usize;
        let on = stream.cu_stream() as usize;
        let k = self.kernel_index(kernel);
        let outputs: Vec<Output> = buffers(kernel, l.args)?
            .into_iter()
            .filter(|o| o.def.is_output())
            .collect();
        let sh = &mut self.kernels[k].shadow;
        let pos = match sh.scratch.iter().position(|(s, _)| *s == on) {
            Some(p) => p,
            None => {
                sh.scratch.push((on, Vec::new()));
                sh.scratch.len() - 1
            }
        };
        let bufs = &mut sh.scratch[pos].1;
        let mut scratch = Vec::new();
        for (i, o) in outputs.iter().enumerate() {
            let bytes = o.n * o.def.dtype.size();
            if bufs.len() <= i {
                bufs.push(DeviceBuf::new(bytes)?);
            } else if bufs[i].bytes < bytes {
                // Earlier checks may still use the smaller buffer: free it once they are done.
                stream.synchronize().map_err(Error::driver)?;
                bufs[i] = DeviceBuf::new(bytes)?;
            }
            let p = bufs[i].ptr;
            if o.def.direction == Direction::InOut && bytes > 0 {
                cu::memcpy_dtod_async(p, device_ptr(params[o.slot]), bytes, stream.cu_stream())
                    .map_err(Error::driver)?;
            }
            scratch.push(p);
        }
        let need = outputs.len() * RESULT_BYTES;
        let results = match self
            .result_pool
            .iter()
            .position(|(c, b)| *c == ctx && b.bytes >= need)
        {
            Some(i) => self.result_pool.swap_remove(i).1,
            None => DeviceBuf::new(need.max(RESULT_BYTES * 8))?,
        };
        Ok(Prepared {
            outputs,
            scratch,
            results: (ctx, results),
        })
    }

    /// Runs the reference into the scratch buffers and compares, after the variant's
    /// launch; the result is read when its event completes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn shadow_check(
        &mut self,
        kernel: &'static Kernel,
        k: usize,
        l: &Launch<'_>,
        stream: &CudaStream,
        params: &[*mut c_void],
        pre: Prepared,
        variant: &'static str,
    ) -> Result<(), Error> {
        let spec = kernel.spec();
        let s = stream.cu_stream();
        let mut reference_maps = vec![None; spec.tensor_maps.len()];
        let reference = kernel.reference_launch(stream, l.args, &mut reference_maps)?;
        // The reference's pool: the scratch outputs, its own computed arguments, and its
        // own tensor maps (over the scratch outputs where they describe one).
        let mut slots: Vec<*mut c_void> = params.to_vec();
        let mut scratch = pre.scratch.clone();
        for (o, p) in pre.outputs.iter().zip(scratch.iter_mut()) {
            slots[o.slot] = p as *mut sys::CUdeviceptr as *mut c_void;
        }
        let mut computed: Vec<[u8; 8]> = Vec::new();
        for c in spec.computed_args() {
            let v: i64 = reference.computed(computed.len(), l.args)?;
            let mut cell = [0u8; 8];
            match c.ty {
                ScalarTy::I32 | ScalarTy::U32 => {
                    cell[..4].copy_from_slice(&(v as i32).to_le_bytes())
                }
                _ => cell.copy_from_slice(&v.to_le_bytes()),
            }
            computed.push(cell);
        }
        let base = spec.params.len();
        for (i, cell) in computed.iter_mut().enumerate() {
            slots[base + i] = cell.as_mut_ptr() as *mut c_void;
        }
        let mut maps = Vec::with_capacity(spec.tensor_maps.len());
        for (i, m) in spec.tensor_maps.iter().enumerate() {
            let param = spec
                .params
                .iter()
                .position(|p| p.name() == m.buffer)
                .expect("the parser checks a map's buffer");
            let address = match pre.outputs.iter().position(|o| o.slot == param) {
                Some(o) => scratch[o],
                None => device_ptr(params[param]),
            };
            maps.push(reference.tensor_map(i, address)?);
        }
        let base = base + computed.len();
        for (i, map) in maps.iter_mut().enumerate() {
            slots[base + i] = map as *mut _ as *mut c_void;
        }
        reference.enqueue(stream, &slots)?;
        // Compare each output with the reference's, then fetch the first failing element.
        let comparers = self.comparers(stream)?;
        let results = pre.results.1.ptr;
        cu::memset_d8_async(results, 0, pre.results.1.bytes, s).map_err(Error::driver)?;
        let outputs = &pre.outputs;
        for (i, o) in outputs.iter().enumerate() {
            let rule = ToleranceRule::for_buffer(spec, o.def, o.n, l.args);
            let (cmp, fetch) = comparers
                .kernels
                .iter()
                .find(|(d, _, _)| *d == o.def.dtype)
                .map(|(_, c, f)| (c, f))
                .expect("a comparer for every dtype");
            let result = results + (i * RESULT_BYTES) as u64;
            let mut got = device_ptr(params[o.slot]);
            let mut want = pre.scratch[i];
            let mut n64 = o.n as u64;
            let mut row = rule.row_len;
            let (mut rtol, mut atol, mut noise, mut two_u) =
                (rule.rtol, rule.atol, rule.noise_of_rms, rule.two_u_out);
            let mut res = result;
            let mut p: [*mut c_void; 9] = [
                &mut got as *mut _ as *mut c_void,
                &mut want as *mut _ as *mut c_void,
                &mut n64 as *mut _ as *mut c_void,
                &mut row as *mut _ as *mut c_void,
                &mut rtol as *mut _ as *mut c_void,
                &mut atol as *mut _ as *mut c_void,
                &mut noise as *mut _ as *mut c_void,
                &mut two_u as *mut _ as *mut c_void,
                &mut res as *mut _ as *mut c_void,
            ];
            let rows = n64.div_ceil(row.max(1)).clamp(1, 65535 * 16) as u32;
            crate::launch_kernel(
                cmp.cu_function(),
                (rows.min(65535), 1, 1),
                (256, 1, 1),
                (1, 1, 1),
                0,
                s,
                &mut p,
            )?;
            crate::launch_kernel(
                fetch.cu_function(),
                (1, 1, 1),
                (1, 1, 1),
                (1, 1, 1),
                0,
                s,
                &mut p,
            )?;
        }
        let host = match self
            .host_pool
            .iter()
            .position(|h| h.len >= outputs.len() * RESULT_BYTES)
        {
            Some(i) => self.host_pool.swap_remove(i),
            None => HostResults::new(outputs.len().max(8))?,
        };
        if !outputs.is_empty() {
            let dst =
                std::slice::from_raw_parts_mut(host.ptr as *mut u8, outputs.len() * RESULT_BYTES);
            cu::memcpy_dtoh_async(dst, results, s).map_err(Error::driver)?;
        }
        let done = cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(Error::driver)?;
        cu::event::record(done, s).map_err(Error::driver)?;
        let scalars = named(spec, &scalar_numbers(spec, l.args, params));
        self.checks.push(PendingCheck {
            kernel: k,
            device: Some(pre.results),
            variant,
            scalars,
            outputs: outputs.iter().map(|o| o.name).collect(),
            results: host,
            done,
        });
        Ok(())
    }

    fn comparers(&mut self, stream: &CudaStream) -> Result<Arc<Comparers>, Error> {
        let ctx = stream.context();
        let key = ctx.cu_ctx() as usize;
        if let Some((_, c)) = self.comparers.iter().find(|(k, _)| *k == key) {
            return Ok(c.clone());
        }
        let (major, minor) = ctx.compute_capability().map_err(Error::driver)?;
        let ptx = crate::compile_ptx(
            "kopt",
            "shadow-compare",
            COMPARE_SOURCE,
            &[],
            (major, minor),
        )?;
        let module = ctx.load_module(ptx).map_err(Error::driver)?;
        let mut kernels = Vec::new();
        for d in DType::ALL {
            let f = |what: &str| {
                module
                    .load_function(&format!("kopt_shadow_{what}_{}", d.name()))
                    .map_err(Error::driver)
            };
            kernels.push((*d, f("compare")?, f("fetch")?));
        }
        let c = Arc::new(Comparers {
            kernels,
            _ctx: ctx.clone(),
        });
        self.comparers.push((key, c.clone()));
        Ok(c)
    }

    fn write_manifest(&mut self, o: &Observer, c: &Capture) -> Result<(), Error> {
        let m = self.manifest(o, c);
        let text = serde_json::to_string_pretty(&m).expect("manifests serialise");
        let path = c.dir.join(capture::MANIFEST);
        kopt_spec::files::write_atomic(&path, text.as_bytes()).map_err(|e| {
            Error::Observe(format!("cannot write the capture {}: {e}", path.display()))
        })?;
        self.last_manifest = Some(Instant::now());
        Ok(())
    }

    fn manifest(&self, o: &Observer, c: &Capture) -> CaptureManifest {
        CaptureManifest {
            format: capture::FORMAT,
            kind: capture::KIND.into(),
            program: c.program.clone(),
            pid: std::process::id(),
            device: self.device.clone(),
            arch: self.arch.clone(),
            started_ms: self.started_ms,
            written_ms: unix_ms(SystemTime::now()),
            settings: c.settings.clone(),
            bytes_written: self.bytes_written,
            kernels: self
                .kernels
                .iter()
                .filter(|k| !k.cases.is_empty())
                .map(|k| KernelCapture {
                    kernel: k.kernel.name().to_string(),
                    krate: k.kernel.crate_name().to_string(),
                    spec_hash: kopt_spec::source::hash(k.kernel.def().spec_json.as_bytes()),
                    cases: k.cases.iter().map(|c| c.record.clone()).collect(),
                })
                .collect(),
            shadow: if o.shadow.is_some() {
                self.kernels
                    .iter()
                    .filter(|k| k.shadow.launches > 0)
                    .map(shadow_record)
                    .collect()
            } else {
                Vec::new()
            },
        }
    }
}

fn shadow_record(k: &KernelState) -> ShadowRecord {
    ShadowRecord {
        kernel: k.kernel.name().to_string(),
        checks: k.shadow.checks,
        divergences: k.shadow.divergences,
        fell_back: k.kernel.fell_back.load(Ordering::Relaxed),
        first: k.shadow.first.clone(),
    }
}

impl Kernel {
    /// What this process's shadow checks of this kernel found so far (`KOPT_SHADOW`), or
    /// `None` when they are off or none of its launches ran a variant. Checks still in
    /// flight are not counted: [`flush`] first to wait for them.
    pub fn shadow_report(&'static self) -> Option<ShadowRecord> {
        let o = observer().ok().flatten()?;
        o.shadow.as_ref()?;
        let st = o.lock();
        st.kernels
            .iter()
            .find(|k| std::ptr::eq(k.kernel, self))
            .filter(|k| k.shadow.launches > 0)
            .map(shadow_record)
    }

    /// Whether a shadow check made this kernel fall back to the reference for the rest
    /// of the process (`KOPT_SHADOW_FALLBACK=1`).
    pub fn fell_back(&self) -> bool {
        self.fell_back.load(Ordering::Relaxed)
    }
}

/// Writes the capture's manifest when the process exits (without what was in flight).
fn register_exit_write() {
    extern "C" {
        fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
    }
    extern "C" fn at_exit() {
        let Ok(Some(o)) = observer() else { return };
        let Some(c) = &o.capture else { return };
        // A launch may hold the lock on another thread: skip rather than wait.
        if let Ok(mut st) = o.state.try_lock() {
            if st.started_ms != 0 {
                let _ = st.write_manifest(o, c);
            }
        }
    }
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        // SAFETY: registers a plain function with the C runtime.
        unsafe {
            atexit(at_exit);
        }
    });
}

/// kopt's comparison kernels: per dtype, `compare` (blocks over rows: the row's RMS of the
/// reference's finite values, then each element against the rule; failures counted, the
/// first index kept) and `fetch` (one thread: the first failing element's values and
/// allowance).
const COMPARE_SOURCE: &str = r#"
struct KoptResult { unsigned long long failing, first; double got, want, allowed; };

__device__ __forceinline__ double kopt_f16(unsigned short h) {
    unsigned int s = ((unsigned int)h & 0x8000u) << 16, e = ((unsigned int)h >> 10) & 0x1fu,
                 m = (unsigned int)h & 0x3ffu;
    float v;
    if (e == 0x1fu) v = __int_as_float(s | 0x7f800000u | (m << 13));
    else if (e == 0) { v = (float)m * 5.9604644775390625e-8f; if (s) v = -v; }
    else v = __int_as_float(s | ((e + 112u) << 23) | (m << 13));
    return (double)v;
}
__device__ __forceinline__ double kopt_bf16(unsigned short h) {
    return (double)__int_as_float(((unsigned int)h) << 16);
}
__device__ __forceinline__ bool kopt_finite(double x) {
    return (__double_as_longlong(x) & 0x7ff0000000000000ll) != 0x7ff0000000000000ll;
}
__device__ __forceinline__ double kopt_allowed(double want, double rms, double rtol, double atol,
                                               double noise, double two_u) {
    double w = fabs(want);
    return fmax(atol + rtol * fmax(w, rms), noise * rms + two_u * w);
}

#define KOPT_COMPARERS(NAME, T, LOAD)                                                          \
extern "C" __global__ void kopt_shadow_compare_##NAME(                                         \
    const T* got, const T* want, unsigned long long n, unsigned long long row,                 \
    double rtol, double atol, double noise, double two_u, KoptResult* r) {                    \
    __shared__ double sums[32];                                                                \
    __shared__ unsigned long long counts[32];                                                  \
    const unsigned long long rows = (n + row - 1) / row;                                       \
    for (unsigned long long q = blockIdx.x; q < rows; q += gridDim.x) {                        \
        const unsigned long long a = q * row, b = a + row < n ? a + row : n;                  \
        double s = 0.0; unsigned long long c = 0;                                              \
        for (unsigned long long i = a + threadIdx.x; i < b; i += blockDim.x) {                \
            double w = LOAD(want[i]);                                                          \
            if (kopt_finite(w)) { s += w * w; ++c; }                                           \
        }                                                                                      \
        for (int o = 16; o > 0; o >>= 1) {                                                     \
            s += __shfl_xor_sync(0xffffffffu, s, o);                                           \
            c += __shfl_xor_sync(0xffffffffu, c, o);                                           \
        }                                                                                      \
        if ((threadIdx.x & 31) == 0) { sums[threadIdx.x >> 5] = s; counts[threadIdx.x >> 5] = c; } \
        __syncthreads();                                                                       \
        s = 0.0; c = 0;                                                                        \
        for (unsigned int w = 0; w < (blockDim.x + 31) / 32; ++w) { s += sums[w]; c += counts[w]; } \
        __syncthreads();                                                                       \
        const double rms = c ? sqrt(s / (double)c) : 0.0;                                      \
        for (unsigned long long i = a + threadIdx.x; i < b; i += blockDim.x) {                \
            const double g = LOAD(got[i]), w = LOAD(want[i]);                                  \
            const bool ok = kopt_finite(g) && kopt_finite(w) &&                                \
                            fabs(g - w) <= kopt_allowed(w, rms, rtol, atol, noise, two_u);     \
            if (!ok) { atomicAdd(&r->failing, 1ull); atomicMax(&r->first, ~i); }            \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
extern "C" __global__ void kopt_shadow_fetch_##NAME(                                           \
    const T* got, const T* want, unsigned long long n, unsigned long long row,                 \
    double rtol, double atol, double noise, double two_u, KoptResult* r) {                    \
    if (r->failing == 0) return;                                                               \
    const unsigned long long i = ~r->first, a = i / row * row, b = a + row < n ? a + row : n; \
    double s = 0.0; unsigned long long c = 0;                                                  \
    for (unsigned long long j = a; j < b; ++j) {                                               \
        double w = LOAD(want[j]);                                                              \
        if (kopt_finite(w)) { s += w * w; ++c; }                                               \
    }                                                                                          \
    const double rms = c ? sqrt(s / (double)c) : 0.0;                                          \
    r->first = i;                                                                              \
    r->got = LOAD(got[i]);                                                                     \
    r->want = LOAD(want[i]);                                                                   \
    r->allowed = kopt_allowed(r->want, rms, rtol, atol, noise, two_u);                         \
}

#define KOPT_PLAIN(x) ((double)(x))
#define KOPT_HALF(x) kopt_f16(x)
#define KOPT_BHALF(x) kopt_bf16(x)
KOPT_COMPARERS(f64, double, KOPT_PLAIN)
KOPT_COMPARERS(f32, float, KOPT_PLAIN)
KOPT_COMPARERS(f16, unsigned short, KOPT_HALF)
KOPT_COMPARERS(bf16, unsigned short, KOPT_BHALF)
KOPT_COMPARERS(i64, long long, KOPT_PLAIN)
KOPT_COMPARERS(i32, int, KOPT_PLAIN)
KOPT_COMPARERS(i16, short, KOPT_PLAIN)
KOPT_COMPARERS(i8, signed char, KOPT_PLAIN)
KOPT_COMPARERS(u64, unsigned long long, KOPT_PLAIN)
KOPT_COMPARERS(u32, unsigned int, KOPT_PLAIN)
KOPT_COMPARERS(u16, unsigned short, KOPT_PLAIN)
KOPT_COMPARERS(u8, unsigned char, KOPT_PLAIN)
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn nothing_asked_is_no_observer() {
        assert!(Observer::from_env(&env(&[])).unwrap().is_none());
        assert!(Observer::from_env(&env(&[(CAPTURE, " "), (SHADOW, "")]))
            .unwrap()
            .is_none());
    }

    #[test]
    fn settings_are_read_and_bad_ones_name_the_variable() {
        let o = Observer::from_env(&env(&[
            (CAPTURE, "/tmp/cap"),
            (CAPTURE_INPUTS, "3"),
            (CAPTURE_MAX_BYTES, "64M"),
            (SHADOW, "0.001"),
            (SHADOW_FALLBACK, "1"),
        ]))
        .unwrap()
        .unwrap();
        let c = o.capture.as_ref().unwrap();
        assert!(c.dir.starts_with("/tmp/cap"));
        assert_eq!(c.settings.inputs_per_case, 3);
        assert_eq!(c.settings.max_bytes, 64 << 20);
        assert_eq!(c.settings.time_every, 16);
        let s = o.shadow.as_ref().unwrap();
        assert_eq!(s.period, 1000);
        assert!(s.fallback);
        assert_eq!(
            Observer::from_env(&env(&[(SHADOW, "0")]))
                .unwrap()
                .unwrap()
                .shadow
                .unwrap()
                .period,
            0,
            "rate 0: the machinery, no checks"
        );
        let err = Observer::from_env(&env(&[(SHADOW, "2")])).err().unwrap();
        assert!(
            err.starts_with("KOPT_SHADOW=2 is not a rate between 0 and 1"),
            "{err}"
        );
        let err = Observer::from_env(&env(&[(CAPTURE, "d"), (CAPTURE_MAX_BYTES, "lots")]))
            .err()
            .unwrap();
        assert!(
            err.contains("KOPT_CAPTURE_MAX_BYTES=lots is not a byte count"),
            "{err}"
        );
        let err = Observer::from_env(&env(&[(CAPTURE, "d"), (CAPTURE_INPUTS, "0")]))
            .err()
            .unwrap();
        assert!(
            err.contains("KOPT_CAPTURE_INPUTS=0 is not a positive whole number"),
            "{err}"
        );
    }

    #[test]
    fn the_comparison_kernels_compile_with_an_entry_per_dtype() {
        if !crate::gpu::nvrtc_for_test() {
            return;
        }
        let n = crate::compile_native(
            "kopt",
            "shadow-compare",
            COMPARE_SOURCE,
            &["--ptxas-options=-v"],
            "sm_90",
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let entries: Vec<String> = crate::ptxas_entries(&n.log)
            .into_iter()
            .map(|e| e.name)
            .collect();
        for d in DType::ALL {
            for what in ["compare", "fetch"] {
                let name = format!("kopt_shadow_{what}_{}", d.name());
                assert!(entries.contains(&name), "{name} missing from {entries:?}");
            }
        }
    }

    #[test]
    fn the_rule_matches_the_engines_on_rows_and_flat_buffers() {
        let item = kopt_spec::spec::parse_item(
            "pub fn k(s: &CudaStream, x: &CudaSlice<f16>, y: &mut CudaSlice<f16>, z: &mut CudaSlice<f32>, rows: u32, cols: u32);"
                .parse()
                .unwrap(),
        )
        .unwrap();
        let spec = kopt_spec::spec::parse_kernel(
            "reference = \"k.cu\", x: [rows * cols], y: [rows * cols] tol(rtol = 1e-2, atol = 1e-3), z: [rows + cols], grid = rows, block = 256, shapes = [{ rows: 4, cols: 1024 }]"
                .parse()
                .unwrap(),
            &item,
        )
        .unwrap()
        .0;
        let y = spec.buffers().find(|b| b.name == "y").unwrap();
        let r = ToleranceRule::for_buffer(&spec, y, 4096, &[4, 1024]);
        assert_eq!(r.row_len, 1024);
        assert_eq!((r.rtol, r.atol), (1e-2, 1e-3));
        let u = f32::EPSILON as f64 / 2.0;
        assert!(
            (r.noise_of_rms - 6.0 * u * 32.0).abs() < 1e-15,
            "sqrt(1024) = 32"
        );
        assert_eq!(r.two_u_out, half::f16::EPSILON.to_f64(), "2 u of f16");
        // Rows of RMS 1: the tolerance on the row's scale, the element's where larger.
        assert!((r.allowed(0.0, 1.0) - (1e-3 + 1e-2)).abs() < 1e-12);
        assert!((r.allowed(4.0, 1.0) - (1e-3 + 4e-2)).abs() < 1e-12);
        // A flat buffer is one row, its noise floor without a reduction.
        let z = spec.buffers().find(|b| b.name == "z").unwrap();
        let r = ToleranceRule::for_buffer(&spec, z, 1028, &[4, 1024]);
        assert_eq!(r.row_len, 1028);
        assert!((r.noise_of_rms - 6.0 * u).abs() < 1e-20);
    }

    #[test]
    fn the_timed_launches_skip_the_kept_ones() {
        let s = CaptureSettings {
            inputs_per_case: 2,
            max_bytes: 1,
            time_every: 16,
        };
        let timed: Vec<u64> = (1..=40).filter(|n| timed_launch(*n, &s)).collect();
        assert_eq!(timed, [3, 19, 35]);
    }

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("2G"), Some(2 << 30));
        assert_eq!(parse_bytes("512 MiB"), Some(512 << 20));
        assert_eq!(parse_bytes("1T"), None);
        assert_eq!(parse_bytes("x"), None);
    }
}
