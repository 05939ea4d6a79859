//! Runs the example kernels through their generated launchers.
//!
//! ```text
//! llm-kernels run                  check every kernel against the CPU reference (GPU)
//! llm-kernels explain [--arch A]   which version runs for each declared shape (no GPU)
//! llm-kernels bench [--launches N] launcher overhead and per-shape times (GPU)
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use kopt::cudarc::driver::{CudaContext, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use kopt::{f16, Kernel};
use llm_kernels::{cpu, gqa_decode, reduce_sum, rmsnorm, softmax, KERNELS};
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cmd = args.first().map(String::as_str).unwrap_or("run");
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let result = match cmd {
        "explain" => {
            explain(&flag("--arch").unwrap_or_else(|| "sm_90".into()));
            Ok(true)
        }
        "run" | "bench" => match kopt::gpu::missing() {
            Some(why) => {
                eprintln!("llm-kernels: {why}");
                return ExitCode::from(2);
            }
            None if cmd == "run" => run(),
            None => bench(flag("--launches").and_then(|v| v.parse().ok()).unwrap_or(20_000)),
        },
        other => {
            eprintln!("llm-kernels: unknown command `{other}`; use run, explain or bench");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("llm-kernels: {e}");
            ExitCode::from(1)
        }
    }
}

/// Which version runs for each declared shape on `arch`: needs no GPU.
fn explain(arch: &str) {
    for k in KERNELS {
        for shape in &k.spec().shapes {
            let args = k.spec().shape_args(shape);
            println!(
                "{:<12} {:<40} {}",
                k.name(),
                kopt::spec::shape_label(shape),
                k.explain_for(arch, &args)
            );
        }
    }
}

fn normal_f32(n: usize, mean: f32, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let d = Normal::new(mean, 1.0f32).unwrap();
    (0..n).map(|_| d.sample(&mut rng)).collect()
}

/// Rounds through f16, so the CPU reference sees exactly the GPU's inputs.
fn to_f16(v: &[f32]) -> (Vec<f16>, Vec<f32>) {
    let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
    let back = h.iter().map(|x| x.to_f32()).collect();
    (h, back)
}

struct Check {
    kernel: &'static str,
    shape: String,
    selected: String,
    max_abs: f64,
    max_rel: f64,
    failing: usize,
}

/// Element-wise |got - want| <= atol + rtol * |want|; NaN never passes.
fn compare(kernel: &'static str, shape: String, selected: String, got: &[f64], want: &[f64], rtol: f64, atol: f64) -> Check {
    let mut c = Check { kernel, shape, selected, max_abs: 0.0, max_rel: 0.0, failing: 0 };
    for (g, w) in got.iter().zip(want) {
        let abs = (g - w).abs();
        if !(abs <= atol + rtol * w.abs()) {
            c.failing += 1;
        }
        if abs.is_finite() {
            c.max_abs = c.max_abs.max(abs);
            c.max_rel = c.max_rel.max(abs / w.abs().max(1e-12));
        } else {
            c.max_abs = f64::INFINITY;
        }
    }
    if got.len() != want.len() {
        c.failing += want.len().abs_diff(got.len());
    }
    c
}

fn selected(k: &Kernel, stream: &CudaStream, args: &[i64]) -> Res<String> {
    let s = k.explain(stream, args)?;
    Ok(match &s.reason {
        kopt::Reason::Accepted { .. } => format!("{} ({})", s.variant, s.arch),
        kopt::Reason::Disabled => "reference (KOPT_DISABLE)".into(),
        _ => format!("reference ({})", s.arch),
    })
}

fn run() -> Res<bool> {
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    println!("device: {} (sm_{}{})", ctx.name()?, ctx.compute_capability()?.0, ctx.compute_capability()?.1);
    let mut checks = Vec::new();

    for &(rows, cols) in &[(256usize, 4096usize), (16, 65536), (8, 50257), (64, 1024)] {
        let x = normal_f32(rows * cols, 0.0, 1 + rows as u64);
        let dx = stream.clone_htod(&x)?;
        let mut dy = poisoned::<f32>(&stream, rows * cols, f32::NAN)?;
        softmax(&stream, &dx, &mut dy, rows as u32, cols as u32)?;
        let y: Vec<f64> = stream.clone_dtoh(&dy)?.iter().map(|&v| v as f64).collect();
        let args = [rows as i64, cols as i64];
        checks.push(compare("softmax", format!("{rows}x{cols}"), selected(&softmax_kernel(), &stream, &args)?, &y, &cpu::softmax(&x, rows, cols), 1e-4, 1e-6));
    }

    for &(rows, cols) in &[(64usize, 4096usize), (3, 8192)] {
        let (xh, x) = to_f16(&normal_f32(rows * cols, 0.0, 7));
        let (wh, w) = to_f16(&normal_f32(cols, 1.0, 8));
        let dx = stream.clone_htod(&xh)?;
        let dw = stream.clone_htod(&wh)?;
        let mut dy = poisoned::<f16>(&stream, rows * cols, f16::NAN)?;
        rmsnorm(&stream, &dx, &dw, &mut dy, rows as u32, cols as u32, 1e-5)?;
        let y: Vec<f64> = stream.clone_dtoh(&dy)?.iter().map(|v| v.to_f64()).collect();
        let args = [rows as i64, cols as i64, 0];
        checks.push(compare("rmsnorm", format!("{rows}x{cols}"), selected(&llm_kernels::RMSNORM, &stream, &args)?, &y, &cpu::rmsnorm(&x, &w, rows, cols, 1e-5), 1e-2, 1e-2));
    }

    for &n in &[1usize << 20, 1000] {
        let x = normal_f32(n, 1.0, 11);
        let dx = stream.clone_htod(&x)?;
        let mut out = stream.clone_htod(&[0.5f32])?;
        reduce_sum(&stream, &dx, &mut out, n as u64)?;
        let got = stream.clone_dtoh(&out)?[0] as f64;
        checks.push(compare("reduce_sum", format!("n={n}"), selected(&llm_kernels::REDUCE_SUM, &stream, &[n as i64])?, &[got], &[0.5 + cpu::sum(&x)], 1e-4, 1e-2));
    }

    for &(b, hq, hkv, s) in &[(2usize, 8usize, 2usize, 1024usize), (1, 32, 8, 300)] {
        let d = 128;
        let (qh, q) = to_f16(&normal_f32(b * hq * d, 0.0, 21));
        let (kh, k) = to_f16(&normal_f32(b * hkv * s * d, 0.0, 22));
        let (vh, v) = to_f16(&normal_f32(b * hkv * s * d, 0.0, 23));
        let (dq, dk, dv) = (stream.clone_htod(&qh)?, stream.clone_htod(&kh)?, stream.clone_htod(&vh)?);
        let mut dout = poisoned::<f16>(&stream, b * hq * d, f16::NAN)?;
        gqa_decode(&stream, &dq, &dk, &dv, &mut dout, b as u32, hq as u32, hkv as u32, s as u32)?;
        let got: Vec<f64> = stream.clone_dtoh(&dout)?.iter().map(|v| v.to_f64()).collect();
        let args = [b as i64, hq as i64, hkv as i64, s as i64];
        checks.push(compare("gqa_decode", format!("b={b} hq={hq} hkv={hkv} s={s}"), selected(&llm_kernels::GQA_DECODE, &stream, &args)?, &got, &cpu::gqa_decode(&q, &k, &v, b, hq, hkv, s, d), 1e-2, 1e-2));
    }

    // A too-short buffer is refused before anything is launched.
    let short = stream.alloc_zeros::<f32>(10)?;
    let mut y = stream.alloc_zeros::<f32>(4096)?;
    let refused = matches!(softmax(&stream, &short, &mut y, 1, 4096), Err(kopt::Error::BufferTooShort { .. }));

    println!("{:<11} {:<24} {:<28} {:>10} {:>10} {:>8}", "kernel", "shape", "ran", "max abs", "max rel", "result");
    let mut ok = true;
    for c in &checks {
        let pass = c.failing == 0;
        ok &= pass;
        println!(
            "{:<11} {:<24} {:<28} {:>10.2e} {:>10.2e} {:>8}",
            c.kernel, c.shape, c.selected, c.max_abs, c.max_rel,
            if pass { "ok".to_string() } else { format!("{} bad", c.failing) }
        );
    }
    println!("short buffer refused without a launch: {}", if refused { "yes" } else { "NO" });
    ok &= refused;
    println!("{} passed, {} failed", checks.iter().filter(|c| c.failing == 0).count() + refused as usize, checks.iter().filter(|c| c.failing != 0).count() + (!refused) as usize);
    Ok(ok)
}

fn softmax_kernel() -> &'static Kernel {
    &llm_kernels::SOFTMAX
}

fn poisoned<T: kopt::cudarc::driver::DeviceRepr + Copy>(stream: &Arc<CudaStream>, n: usize, v: T) -> Res<CudaSlice<T>> {
    Ok(stream.clone_htod(&vec![v; n])?)
}

/// Launcher overhead per call against a hand-written cudarc launch of the same kernel,
/// then per-shape times of softmax (the kernel with a shipped variant).
fn bench(launches: usize) -> Res<bool> {
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    println!("device: {}", ctx.name()?);

    // Hand-written: the same reference source, compiled the same way, launched with
    // cudarc's launch builder, as a crate without kopt would.
    let def = &llm_kernels::SOFTMAX.def().reference;
    let cc = ctx.compute_capability()?;
    let ptx = kopt::compile_ptx("softmax", "hand-written", def.source, def.options, cc)?;
    let module = ctx.load_module(ptx)?;
    let f = module.load_function(def.entry)?;
    let (rows, cols) = (1u32, 32u32);
    let x = stream.alloc_zeros::<f32>(32)?;
    let mut y = stream.alloc_zeros::<f32>(32)?;
    let cfg = LaunchConfig { grid_dim: (rows, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };

    let hand = |n: usize, y: &mut CudaSlice<f32>| -> Res<f64> {
        let t = Instant::now();
        for _ in 0..n {
            unsafe { stream.launch_builder(&f).arg(&x).arg(&mut *y).arg(&rows).arg(&cols).launch(cfg) }?;
        }
        Ok(t.elapsed().as_secs_f64())
    };
    let generated = |n: usize, y: &mut CudaSlice<f32>| -> Res<f64> {
        let t = Instant::now();
        for _ in 0..n {
            softmax(&stream, &x, y, rows, cols)?;
        }
        Ok(t.elapsed().as_secs_f64())
    };
    // Warm up both paths (module load, first-use compile).
    hand(100, &mut y)?;
    generated(100, &mut y)?;
    stream.synchronize()?;
    // Batches small enough never to fill the launch queue, so the host time is the cost
    // of the call itself; alternate the two to share any drift.
    let batch = 256;
    let (mut th, mut tg) = (Vec::new(), Vec::new());
    for _ in 0..launches / batch {
        th.push(hand(batch, &mut y)? / batch as f64);
        stream.synchronize()?;
        tg.push(generated(batch, &mut y)? / batch as f64);
        stream.synchronize()?;
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2] * 1e6
    };
    let (h, g) = (med(&mut th), med(&mut tg));
    println!("\nlaunch overhead (host time per call, median of {} batches of {batch})", th.len());
    println!("{:<34} {:>10}", "path", "µs/launch");
    println!("{:<34} {:>10.3}", "hand-written cudarc launch_builder", h);
    println!("{:<34} {:>10.3}", "kopt generated launcher", g);
    println!("{:<34} {:>10.3}", "difference (kopt - hand-written)", g - h);

    // Per-shape device time of softmax, CUDA events, L2 flushed before each sample.
    let flush_len = 2 * ctx.attribute(kopt::cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize;
    let mut flush = stream.alloc_zeros::<u8>(flush_len)?;
    println!("\nsoftmax device time (median of 50, L2 flushed), {}", llm_kernels::SOFTMAX.explain_for("sm_90", &[4096, 4096]));
    println!("{:<22} {:<26} {:>10} {:>10}", "shape", "ran", "µs", "GB/s");
    for shape in &llm_kernels::SOFTMAX.spec().shapes {
        let args = llm_kernels::SOFTMAX.spec().shape_args(shape);
        let (r, c) = (args[0] as usize, args[1] as usize);
        let x = stream.clone_htod(&normal_f32(r * c, 0.0, 5))?;
        let mut y = stream.alloc_zeros::<f32>(r * c)?;
        let mut samples = Vec::new();
        for i in 0..60 {
            stream.memset_zeros(&mut flush)?;
            let start = stream.record_event(Some(kopt::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            softmax(&stream, &x, &mut y, r as u32, c as u32)?;
            let end = stream.record_event(Some(kopt::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            end.synchronize()?;
            if i >= 10 {
                samples.push(start.elapsed_ms(&end)? as f64 * 1e3);
            }
        }
        samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let us = samples[samples.len() / 2];
        let bytes = 8.0 * (r * c) as f64;
        println!("{:<22} {:<26} {:>10.2} {:>10.0}", format!("{r}x{c}"), selected(&llm_kernels::SOFTMAX, &stream, &args)?, us, bytes / us / 1e3);
    }
    Ok(true)
}
