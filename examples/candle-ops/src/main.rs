//! Times candle's ops against kopt's, and says which version runs where.
//!
//! ```text
//! candle-ops bench [--samples N]    candle's kernels and ops against kopt's (GPU)
//! candle-ops explain [--arch A]     which version each declared shape runs (no GPU)
//! ```
//!
//! The bench, for every declared shape of every kernel, in one process, on one stream:
//!
//! - kernel level, per launch: candle's own kernel (the PTX candle-kernels built with
//!   nvcc, launched as candle-nn launches it), kopt's reference (the same source as kopt
//!   embeds it, compiled with NVRTC, launched by its annotation's launch rule, which must
//!   equal candle's) and kopt's launcher (the version it selects: the accepted variant for
//!   the GPU's architecture, or the reference). Each is captured in a CUDA graph of
//!   launches that rotate over enough input and output buffers to exceed twice the L2
//!   cache, so every launch reads from device memory; a sample is one replay between two
//!   events, divided by its launches; the sides alternate sample by sample; the median and
//!   the quartiles over `--samples` samples are given, after three warm-up replays each.
//!   Before timing, kopt's output is compared with candle's under the kernel's tolerance.
//! - op level, per call: `candle_nn::ops` against `candle_ops::ops` through candle's
//!   tensor API (output allocation and candle's dispatch included), calls back to back
//!   between two events, over rotating input tensors.

use std::process::ExitCode;
use std::sync::Arc;

use candle_core::cuda_backend::kernels as candle_kernels;
use candle_core::{CudaDevice, DType, Device, Tensor};
use candle_ops::check::{compare, Tolerance};
use candle_ops::kernels::{self as k, KERNELS};
use candle_ops::ops;
use kopt::cudarc::driver::sys::{CUdevice_attribute, CUevent_flags, CUstreamCaptureMode};
use kopt::cudarc::driver::{
    CudaFunction, CudaGraph, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
    ValidAsZeroBits,
};
use kopt::prelude::bf16;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cmd = args.first().map(String::as_str).unwrap_or("bench");
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let result = match cmd {
        "explain" => {
            explain(&flag("--arch").unwrap_or_else(|| "sm_90".into()));
            Ok(())
        }
        "bench" => match kopt::gpu::missing() {
            Some(why) => {
                eprintln!("candle-ops: {why}");
                return ExitCode::from(2);
            }
            None => bench(flag("--samples").and_then(|v| v.parse().ok()).unwrap_or(50)),
        },
        other => {
            eprintln!("candle-ops: unknown command `{other}`; use bench or explain");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("candle-ops: {e}");
            ExitCode::from(1)
        }
    }
}

/// Which version runs for each declared shape on `arch`: needs no GPU.
fn explain(arch: &str) {
    for kernel in KERNELS {
        for shape in &kernel.spec().shapes {
            let args = kernel.spec().shape_args(shape);
            println!("{:?}: {}", &args[..2], kernel.explain_for(arch, &args));
        }
    }
}

/// The two ops of the example.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Softmax,
    RmsNorm,
}

const EPS: f32 = 1e-6;

/// The buffers of one launch: input, output, and the norm's weight (unused by softmax).
type Buffers<'a, T> = (&'a CudaSlice<T>, &'a mut CudaSlice<T>, &'a CudaSlice<T>);

/// An element type of the kernels, with its launchers.
trait Elem: DeviceRepr + ValidAsZeroBits + Copy + Unpin + 'static {
    const DTYPE: DType;
    const SUFFIX: &'static str;
    fn of(v: f32) -> Self;
    fn to_f32(self) -> f32;
    /// kopt's generated launcher of `op` for this type.
    fn launch_kopt(
        op: Op,
        stream: &Arc<CudaStream>,
        b: Buffers<'_, Self>,
        rows: u32,
        ncols: i32,
    ) -> Result<(), kopt::Error>;
}

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
    const SUFFIX: &'static str = "f32";
    fn of(v: f32) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn launch_kopt(
        op: Op,
        stream: &Arc<CudaStream>,
        (x, y, alpha): Buffers<'_, Self>,
        rows: u32,
        ncols: i32,
    ) -> Result<(), kopt::Error> {
        match op {
            Op::Softmax => k::softmax_f32(stream, &x.as_view(), y, rows, ncols),
            Op::RmsNorm => {
                k::rmsnorm_f32(stream, &x.as_view(), y, &alpha.as_view(), rows, ncols, EPS)
            }
        }
    }
}

impl Elem for bf16 {
    const DTYPE: DType = DType::BF16;
    const SUFFIX: &'static str = "bf16";
    fn of(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn launch_kopt(
        op: Op,
        stream: &Arc<CudaStream>,
        (x, y, alpha): Buffers<'_, Self>,
        rows: u32,
        ncols: i32,
    ) -> Result<(), kopt::Error> {
        match op {
            Op::Softmax => k::softmax_bf16(stream, &x.as_view(), y, rows, ncols),
            Op::RmsNorm => {
                k::rmsnorm_bf16(stream, &x.as_view(), y, &alpha.as_view(), rows, ncols, EPS)
            }
        }
    }
}

/// N(0, 1) values from a seeded xorshift generator and the Box-Muller transform, or
/// U(0.5, 1.5) for a norm's weight.
fn values(n: usize, seed: u64, weight: bool) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut uniform = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            if weight {
                (0.5 + uniform()) as f32
            } else {
                let (u, v) = (uniform(), uniform());
                ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
            }
        })
        .collect()
}

/// Median and quartiles of a sample, in microseconds.
#[derive(Debug, Clone, Copy)]
struct Stats {
    median: f64,
    q1: f64,
    q3: f64,
}

fn stats(mut v: Vec<f64>) -> Stats {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    Stats {
        median: at(0.5),
        q1: at(0.25),
        q3: at(0.75),
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:>9.2} ({:.2}-{:.2})", self.median, self.q1, self.q3)
    }
}

/// A timed region's device time in microseconds: events around `work`.
fn device_us(stream: &Arc<CudaStream>, work: impl FnOnce() -> Res<()>) -> Res<f64> {
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let start = stream.record_event(flags)?;
    work()?;
    let end = stream.record_event(flags)?;
    end.synchronize()?;
    Ok(f64::from(start.elapsed_ms(&end)?) * 1e3)
}

/// `launches` calls of `enqueue(i)` captured into one graph.
fn capture(
    stream: &Arc<CudaStream>,
    launches: usize,
    mut enqueue: impl FnMut(usize) -> Res<()>,
) -> Res<CudaGraph> {
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
    let mut result = Ok(());
    for i in 0..launches {
        result = enqueue(i);
        if result.is_err() {
            break;
        }
    }
    let graph = stream.end_capture(kopt::cudarc::driver::sys::CUgraphInstantiate_flags(0))?;
    result?;
    graph.ok_or_else(|| "the capture recorded nothing".into())
}

/// Samples of each graph, alternating between them, after three warm-up replays each:
/// microseconds per launch.
fn sample_graphs(
    stream: &Arc<CudaStream>,
    graphs: &[CudaGraph],
    launches: usize,
    samples: usize,
) -> Res<Vec<Stats>> {
    for g in graphs {
        g.upload()?;
        for _ in 0..3 {
            g.launch()?;
        }
    }
    stream.synchronize()?;
    let mut times = vec![Vec::with_capacity(samples); graphs.len()];
    for _ in 0..samples {
        for (g, t) in graphs.iter().zip(&mut times) {
            t.push(device_us(stream, || Ok(g.launch()?))? / launches as f64);
        }
    }
    Ok(times.into_iter().map(stats).collect())
}

/// One row of the table.
struct Row {
    kernel: &'static str,
    shape: String,
    ran: String,
    candle: Stats,
    reference: Stats,
    kopt: Stats,
    op_candle: Stats,
    op_kopt: Stats,
    check: String,
}

fn bench(samples: usize) -> Res<()> {
    let device = Device::new_cuda(0)?;
    let dev = device.as_cuda_device()?.clone();
    let stream = dev.cuda_stream();
    let ctx = stream.context().clone();
    // One stream, so no buffer needs cudarc's cross-stream events; without them every
    // launch is a plain kernel node in the captured graphs.
    // SAFETY: everything below runs on `stream` alone.
    unsafe { ctx.disable_event_tracking() };
    let l2 = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize;
    let (major, minor) = ctx.compute_capability()?;
    println!(
        "device: {} (sm_{major}{minor}), L2 {} MiB; kopt launchers: {}",
        ctx.name()?,
        l2 >> 20,
        if kopt::disabled() {
            "KOPT_DISABLE is set, references only"
        } else {
            "accepted variants where they apply"
        }
    );
    let mut rows = Vec::new();
    for kernel in KERNELS {
        for shape in &kernel.spec().shapes {
            let args = kernel.spec().shape_args(shape);
            let (r, c) = (args[0] as usize, args[1] as usize);
            let row = match kernel.name() {
                "softmax_bf16" => {
                    case::<bf16>(&dev, &device, kernel, Op::Softmax, r, c, l2, samples)?
                }
                "softmax_f32" => {
                    case::<f32>(&dev, &device, kernel, Op::Softmax, r, c, l2, samples)?
                }
                "rmsnorm_bf16" => {
                    case::<bf16>(&dev, &device, kernel, Op::RmsNorm, r, c, l2, samples)?
                }
                "rmsnorm_f32" => {
                    case::<f32>(&dev, &device, kernel, Op::RmsNorm, r, c, l2, samples)?
                }
                other => return Err(format!("no bench for kernel `{other}`").into()),
            };
            eprintln!("{} {}: done", row.kernel, row.shape);
            rows.push(row);
        }
    }
    println!(
        "\nkernel level: µs per launch, median (quartiles) of {samples} graph replays, L2-cold inputs; \
         speedup = candle / kopt"
    );
    println!(
        "{:<13} {:<12} {:>24} {:>24} {:>24} {:>8}  {:<6} ran",
        "kernel", "shape", "candle", "kopt reference", "kopt", "speedup", "check"
    );
    for r in &rows {
        println!(
            "{:<13} {:<12} {:>24} {:>24} {:>24} {:>7.2}x  {:<6} {}",
            r.kernel,
            r.shape,
            r.candle.to_string(),
            r.reference.to_string(),
            r.kopt.to_string(),
            r.candle.median / r.kopt.median,
            r.check,
            r.ran
        );
    }
    println!(
        "\nop level: µs per call through candle's tensor API (allocation included), median (quartiles) of {samples} batches"
    );
    println!(
        "{:<13} {:<12} {:>24} {:>24} {:>8}",
        "kernel", "shape", "candle_nn::ops", "candle_ops::ops", "speedup"
    );
    for r in &rows {
        println!(
            "{:<13} {:<12} {:>24} {:>24} {:>7.2}x",
            r.kernel,
            r.shape,
            r.op_candle.to_string(),
            r.op_kopt.to_string(),
            r.op_candle.median / r.op_kopt.median
        );
    }
    if rows.iter().any(|r| r.check != "ok") {
        return Err(
            "kopt's output differed from candle's beyond the kernel's tolerance (the check column)"
                .into(),
        );
    }
    Ok(())
}

/// The launch candle-nn 0.11.1 gives the kernel (`ops.rs`, the ops' `cuda_fwd`), and its
/// `block_size` argument for rms_norm.
fn candle_launch(op: Op, rows: usize, ncols: usize) -> (LaunchConfig, i32) {
    let (block, block_size) = match op {
        Op::Softmax => ((1, 32, 1), 32),
        Op::RmsNorm => {
            let b = if ncols < 1024 { 32 } else { 1024 };
            ((b, 1, 1), b as i32)
        }
    };
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: block,
        shared_mem_bytes: 0,
    };
    (cfg, block_size)
}

/// The reference's geometry by its annotation's launch rule, for `args`.
fn kopt_reference_launch(kernel: &kopt::Kernel, args: &[i64]) -> Res<LaunchConfig> {
    let r = &kernel.def().reference;
    let dim = |p| -> Res<u32> { Ok(u32::try_from(kopt::expr::eval(p, args)?)?) };
    Ok(LaunchConfig {
        grid_dim: (dim(r.grid[0])?, dim(r.grid[1])?, dim(r.grid[2])?),
        block_dim: (dim(r.block[0])?, dim(r.block[1])?, dim(r.block[2])?),
        shared_mem_bytes: dim(r.smem)?,
    })
}

/// Launches `f` (candle's kernel or kopt's reference) on input set `x`, output `y`.
fn launch_raw<T: Elem>(
    stream: &Arc<CudaStream>,
    f: &CudaFunction,
    op: Op,
    cfg: LaunchConfig,
    block_size: i32,
    (x, y, alpha): Buffers<'_, T>,
    ncols: i32,
) -> Res<()> {
    let mut b = stream.launch_builder(f);
    b.arg(x).arg(y);
    match op {
        Op::Softmax => {
            b.arg(&ncols);
        }
        Op::RmsNorm => {
            b.arg(alpha).arg(&ncols).arg(&block_size).arg(&EPS);
        }
    }
    // SAFETY: the arguments are the kernel's, in its order, on buffers of the declared
    // lengths for (rows, ncols).
    unsafe { b.launch(cfg) }?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn case<T: Elem>(
    dev: &CudaDevice,
    device: &Device,
    kernel: &'static kopt::Kernel,
    op: Op,
    rows: usize,
    ncols: usize,
    l2: usize,
    samples: usize,
) -> Res<Row> {
    let stream = dev.cuda_stream();
    let n = rows * ncols;
    let set_bytes = 2 * n * std::mem::size_of::<T>();
    // Enough sets that one pass over them is twice the L2; launches a multiple of them.
    let sets = (2 * l2).div_ceil(set_bytes).clamp(1, 256);
    let launches = sets * 20usize.div_ceil(sets);
    let host = |seed: u64, len: usize, weight: bool| -> Vec<T> {
        values(len, seed, weight).into_iter().map(T::of).collect()
    };
    let xs: Vec<CudaSlice<T>> = (0..sets)
        .map(|i| stream.clone_htod(&host(i as u64 + 1, n, false)))
        .collect::<Result<_, _>>()?;
    let mut ys: Vec<CudaSlice<T>> = (0..sets)
        .map(|_| stream.alloc_zeros::<T>(n))
        .collect::<Result<_, _>>()?;
    let alpha = stream.clone_htod(&host(1_000_003, ncols, true))?;

    // candle's kernel, as candle-nn launches it.
    let name = match op {
        Op::Softmax => format!("softmax_{}", T::SUFFIX),
        Op::RmsNorm => format!("rmsnorm_{}", T::SUFFIX),
    };
    let candle_fn = dev.get_or_load_func(&name, &candle_kernels::REDUCE)?;
    let (cfg, block_size) = candle_launch(op, rows, ncols);
    // kopt's reference, compiled from what kopt embeds, by its own launch rule.
    let def = &kernel.def().reference;
    let ptx = kopt::compile_ptx(
        kernel.name(),
        "reference",
        def.source,
        def.options,
        dev_cc(&stream)?,
    )?;
    let module = stream.context().load_module(ptx)?;
    let reference_fn = module.load_function(def.entry)?;
    let args = [rows as i64, ncols as i64, 0];
    let ref_cfg = kopt_reference_launch(kernel, &args)?;
    if (ref_cfg.grid_dim, ref_cfg.block_dim) != (cfg.grid_dim, cfg.block_dim) {
        return Err(format!(
            "{}: the annotation launches {:?} x {:?}, candle {:?} x {:?}",
            kernel.name(),
            ref_cfg.grid_dim,
            ref_cfg.block_dim,
            cfg.grid_dim,
            cfg.block_dim
        )
        .into());
    }
    let (r32, c32) = (rows as u32, ncols as i32);

    // Correct first: kopt's launcher against candle's kernel on set 0.
    let mut want = stream.alloc_zeros::<T>(n)?;
    let candle_fn: &CudaFunction = &candle_fn;
    launch_raw(
        &stream,
        candle_fn,
        op,
        cfg,
        block_size,
        (&xs[0], &mut want, &alpha),
        c32,
    )?;
    T::launch_kopt(op, &stream, (&xs[0], &mut ys[0], &alpha), r32, c32)?;
    let as_tensor = |s: &CudaSlice<T>| -> Res<Tensor> {
        let host: Vec<T> = stream.clone_dtoh(s)?;
        let f: Vec<f32> = host.into_iter().map(T::to_f32).collect();
        Ok(Tensor::from_vec(f, (rows, ncols), &Device::Cpu)?)
    };
    let c = compare(
        &as_tensor(&ys[0])?,
        &as_tensor(&want)?,
        Tolerance::of(kernel, "dst"),
    )?;
    let check = if c.passed() {
        "ok".to_string()
    } else {
        format!("FAIL: {c}")
    };

    let graphs = [
        capture(&stream, launches, |i| {
            let s = i % sets;
            launch_raw(
                &stream,
                candle_fn,
                op,
                cfg,
                block_size,
                (&xs[s], &mut ys[s], &alpha),
                c32,
            )
        })?,
        capture(&stream, launches, |i| {
            let s = i % sets;
            launch_raw(
                &stream,
                &reference_fn,
                op,
                ref_cfg,
                block_size,
                (&xs[s], &mut ys[s], &alpha),
                c32,
            )
        })?,
        capture(&stream, launches, |i| {
            let s = i % sets;
            Ok(T::launch_kopt(
                op,
                &stream,
                (&xs[s], &mut ys[s], &alpha),
                r32,
                c32,
            )?)
        })?,
    ];
    let t = sample_graphs(&stream, &graphs, launches, samples)?;
    drop(graphs);

    // Op level: candle's tensor API, both ops on the same rotating tensors.
    let tensors: Vec<Tensor> = (0..sets.min(16))
        .map(|i| {
            Tensor::from_vec(values(n, 500 + i as u64, false), (rows, ncols), device)?
                .to_dtype(T::DTYPE)
        })
        .collect::<candle_core::Result<_>>()?;
    let weight = Tensor::from_vec(values(ncols, 999, true), ncols, device)?.to_dtype(T::DTYPE)?;
    let calls = 20;
    let run_op = |kopt_side: bool, x: &Tensor| -> candle_core::Result<Tensor> {
        match (op, kopt_side) {
            (Op::Softmax, false) => candle_nn::ops::softmax_last_dim(x),
            (Op::Softmax, true) => ops::softmax_last_dim(x),
            (Op::RmsNorm, false) => candle_nn::ops::rms_norm(x, &weight, EPS),
            (Op::RmsNorm, true) => ops::rms_norm(x, &weight, EPS),
        }
    };
    for side in [false, true] {
        for x in &tensors {
            run_op(side, x)?;
        }
    }
    stream.synchronize()?;
    let (mut oc, mut ok) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        for (side, out) in [(false, &mut oc), (true, &mut ok)] {
            let us = device_us(&stream, || {
                for i in 0..calls {
                    run_op(side, &tensors[i % tensors.len()])?;
                }
                Ok(())
            })?;
            out.push(us / calls as f64);
        }
    }
    let ran = kernel.explain(&stream, &args)?;
    Ok(Row {
        kernel: kernel.name(),
        shape: format!("{rows}x{ncols}"),
        ran: if ran.is_reference() {
            "reference".into()
        } else {
            format!("variant {}", ran.variant)
        },
        candle: t[0],
        reference: t[1],
        kopt: t[2],
        op_candle: stats(oc),
        op_kopt: stats(ok),
        check,
    })
}

fn dev_cc(stream: &Arc<CudaStream>) -> Res<(i32, i32)> {
    Ok(stream.context().compute_capability()?)
}
