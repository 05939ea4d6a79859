//! Runs the example kernels through their generated launchers.
//!
//! ```text
//! llm-kernels run                  check every kernel against the CPU reference (GPU)
//! llm-kernels explain [--arch A] [--device NAME]
//!                                  which version runs for each declared shape (no GPU)
//! llm-kernels bench [--launches N] launcher overhead and per-shape times (GPU)
//! llm-kernels overhead [--launches N]
//!                                  launcher overhead only (GPU)
//! llm-kernels first-launch         per kernel, the first launch's load time (GPU)
//! llm-kernels decode [--steps N]   a decode step on inputs with real activations'
//!                                  structure, every kernel launched (GPU; see decode.rs)
//! ```

use std::process::ExitCode;
use std::time::Instant;

use kopt::cudarc::driver::{CudaContext, CudaSlice, LaunchConfig, PushKernelArg};
use llm_kernels::check::{self, normal_f32, Res};
use llm_kernels::{softmax, KERNELS};

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
            explain(
                &flag("--arch").unwrap_or_else(|| "sm_90".into()),
                flag("--device").as_deref(),
            );
            Ok(true)
        }
        "run" | "bench" | "overhead" | "first-launch" | "decode" => match kopt::gpu::missing() {
            Some(why) => {
                eprintln!("llm-kernels: {why}");
                return ExitCode::from(2);
            }
            None if cmd == "run" => run(),
            None if cmd == "first-launch" => first_launch(),
            None if cmd == "decode" => {
                llm_kernels::decode::run(flag("--steps").and_then(|v| v.parse().ok()).unwrap_or(4))
            }
            None if cmd == "overhead" => overhead(
                flag("--launches")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(20_000),
            )
            .map(|_| true),
            None => bench(
                flag("--launches")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(20_000),
            ),
        },
        other => {
            eprintln!(
                "llm-kernels: unknown command `{other}`; use run, explain, bench, overhead, first-launch or decode"
            );
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

/// Which version runs for each declared shape on `arch` (on the device `device`, when
/// given): needs no GPU.
fn explain(arch: &str, device: Option<&str>) {
    for k in KERNELS {
        for shape in &k.spec().shapes {
            let args = k.spec().shape_args(shape);
            println!(
                "{:<12} {:<40} {}",
                k.name(),
                kopt::spec::shape_label(shape),
                match device {
                    Some(d) => k.explain_on(arch, d, &args),
                    None => k.explain_for(arch, &args),
                }
            );
        }
    }
}

fn run() -> Res<bool> {
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    let (major, minor) = ctx.compute_capability()?;
    println!("device: {} (sm_{major}{minor})", ctx.name()?);
    let checks = check::check_all(&stream)?;
    let refused = check::short_buffer_is_refused(&stream)?;
    println!(
        "{:<11} {:<24} {:<28} {:>10} {:>10} {:>8}",
        "kernel", "shape", "ran", "max abs", "max rel", "result"
    );
    for c in &checks {
        let result = if c.failing == 0 {
            "ok".to_string()
        } else {
            format!("{} bad", c.failing)
        };
        println!(
            "{:<11} {:<24} {:<28} {:>10.2e} {:>10.2e} {:>8}",
            c.kernel, c.shape, c.ran, c.max_abs, c.max_rel, result
        );
    }
    println!(
        "short buffer refused without a launch: {}",
        if refused { "yes" } else { "NO" }
    );
    let failed = checks.iter().filter(|c| c.failing != 0).count() + usize::from(!refused);
    println!("{} passed, {failed} failed", checks.len() + 1 - failed);
    Ok(failed == 0)
}

/// The first launch of each kernel in this process: the time its launcher's first step
/// (`prepare`, which loads the kernel's versions into the context and picks one) takes
/// on its first declared shape, and what then runs. Everything a first call costs on the
/// host before the kernel is enqueued; run it in a fresh process.
fn first_launch() -> Res<bool> {
    let t = Instant::now();
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    let context_ms = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "device: {}; context created in {context_ms:.1} ms",
        ctx.name()?
    );
    println!(
        "{:<12} {:>9}  what runs on the first declared shape",
        "kernel", "first ms"
    );
    let mut total = 0.0;
    for k in KERNELS {
        let args = k.spec().shape_args(&k.spec().shapes[0]);
        let mut maps = vec![None; k.spec().tensor_maps.len()];
        let t = Instant::now();
        k.prepare(&stream, &args, &mut maps)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        total += ms;
        println!("{:<12} {ms:>9.1}  {}", k.name(), k.explain(&stream, &args)?);
    }
    println!("{:<12} {total:>9.1}", format!("all {}", KERNELS.len()));
    Ok(true)
}

/// Launcher overhead per call against a hand-written cudarc launch of the same kernel
/// (softmax at 1 x 32, whose accepted variant runs), as the host times the calls: what
/// `KOPT_CAPTURE` and `KOPT_SHADOW` add is measured by running it with them set. Returns
/// the medians (hand-written, generated), µs.
fn overhead(launches: usize) -> Res<(f64, f64)> {
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    println!("device: {}", ctx.name()?);
    let set: Vec<String> = [kopt::observe::CAPTURE, kopt::observe::SHADOW]
        .iter()
        .filter_map(|v| Some(format!("{v}={}", std::env::var(v).ok()?)))
        .collect();
    println!(
        "observation: {}",
        if set.is_empty() {
            "none (KOPT_CAPTURE and KOPT_SHADOW unset)".to_string()
        } else {
            set.join(", ")
        }
    );

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
    let cfg = LaunchConfig {
        grid_dim: (rows, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };

    let hand = |n: usize, y: &mut CudaSlice<f32>| -> Res<f64> {
        let t = Instant::now();
        for _ in 0..n {
            unsafe {
                stream
                    .launch_builder(&f)
                    .arg(&x)
                    .arg(&mut *y)
                    .arg(&rows)
                    .arg(&cols)
                    .launch(cfg)
            }?;
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
    println!(
        "\nlaunch overhead (host time per call, median of {} batches of {batch})",
        th.len()
    );
    println!("{:<34} {:>10}", "path", "µs/launch");
    println!("{:<34} {:>10.3}", "hand-written cudarc launch_builder", h);
    println!("{:<34} {:>10.3}", "kopt generated launcher", g);
    println!("{:<34} {:>10.3}", "difference (kopt - hand-written)", g - h);
    kopt::observe::flush()?;
    Ok((h, g))
}

/// [`overhead`], then per-shape times of softmax (the kernel with a shipped variant).
fn bench(launches: usize) -> Res<bool> {
    overhead(launches)?;
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    // Per-shape device time of softmax, CUDA events, L2 flushed before each sample.
    let flush_len = 2 * ctx.attribute(
        kopt::cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
    )? as usize;
    let mut flush = stream.alloc_zeros::<u8>(flush_len)?;
    println!(
        "\nsoftmax device time (median of 50, L2 flushed), {}",
        llm_kernels::SOFTMAX.explain_for("sm_90", &[4096, 4096])
    );
    println!("{:<22} {:<26} {:>10} {:>10}", "shape", "ran", "µs", "GB/s");
    for shape in &llm_kernels::SOFTMAX.spec().shapes {
        let args = llm_kernels::SOFTMAX.spec().shape_args(shape);
        let (r, c) = (args[0] as usize, args[1] as usize);
        let x = stream.clone_htod(&normal_f32(r * c, 0.0, 5))?;
        let mut y = stream.alloc_zeros::<f32>(r * c)?;
        let mut samples = Vec::new();
        for i in 0..60 {
            stream.memset_zeros(&mut flush)?;
            let start = stream.record_event(Some(
                kopt::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT,
            ))?;
            softmax(&stream, &x, &mut y, r as u32, c as u32)?;
            let end = stream.record_event(Some(
                kopt::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT,
            ))?;
            end.synchronize()?;
            if i >= 10 {
                samples.push(start.elapsed_ms(&end)? as f64 * 1e3);
            }
        }
        samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let us = samples[samples.len() / 2];
        let bytes = 8.0 * (r * c) as f64;
        println!(
            "{:<22} {:<26} {:>10.2} {:>10.0}",
            format!("{r}x{c}"),
            check::ran(&llm_kernels::SOFTMAX, &stream, &args)?,
            us,
            bytes / us / 1e3
        );
    }
    Ok(true)
}
