//! On a GPU: a catalogue of deliberately bad candidates for the example's softmax, each
//! rejected for the right reason, while the good ones are accepted.
//!
//! Run with `--nocapture` to see the verdict table.

use std::path::{Path, PathBuf};

use kopt_engine::engine::Engine;
use kopt_engine::job::{KernelVersion, TimingPolicy};
use kopt_engine::parent::WorkerCommand;
use kopt_engine::sanitizer;
use kopt_engine::verdict::{Fence, Judge};
use kopt_loop::eval::{self, Settings};
use kopt_spec::shapes::ShapeCase;
use kopt_workspace::gather;

/// The worker binary: this build's, else (on a GPU runner) the staged one on PATH.
fn worker_program() -> PathBuf {
    kopt_tests::cargo_kopt_binary(env!("CARGO_BIN_EXE_cargo-kopt"))
}

fn example_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/llm-kernels")
}

/// The example crate gathered into `scratch` (the example's softmax is `softmax_of` it).
fn gathered(scratch: &Path) -> gather::Gathered {
    gather::gather_crate("llm-kernels", &example_root(), scratch)
}

fn softmax_of(g: &gather::Gathered) -> &gather::Kernel {
    g.kernels
        .iter()
        .find(|k| k.spec.name == "softmax")
        .expect("the example's softmax")
}

/// An engine on GPU 0 through the staged worker, its ceilings cached in `scratch`, each
/// step allowed `step_timeout_s` seconds.
fn gpu_engine(scratch: &Path, step_timeout_s: u64) -> Engine {
    let mut engine = Engine::new(
        WorkerCommand::cuda(worker_program(), 0),
        None,
        kopt_engine::ceilings::CeilingsCache::at(scratch.join("ceilings.json")),
    );
    engine.worker.step_timeout = std::time::Duration::from_secs(step_timeout_s);
    engine
}

/// The example gathered into `scratch` and an engine on the GPU, for a test of thread-block
/// clusters; None (said on stdout) on a device before sm_90, which has none.
fn cluster_device(scratch: &Path) -> Option<(gather::Gathered, Engine)> {
    let g = gathered(scratch);
    let mut engine = gpu_engine(scratch, 15);
    let info = engine.device().expect("device info");
    if info.compute_capability.0 < 9 {
        println!("{}: no thread-block clusters before sm_90", info.name);
        return None;
    }
    Some((g, engine))
}

/// Settings that time briefly (0.2 s, at most 15 samples): for tests of what launches and
/// passes, not of how fast.
fn brief_timing() -> Settings {
    Settings {
        timing: TimingPolicy {
            max_seconds: 0.2,
            max_samples: 15,
            ..TimingPolicy::default()
        },
        ..Settings::default()
    }
}

const HEADER: &str = "#define NEG_INF __int_as_float(0xff800000)\n";

/// The reference's algorithm with a twist: `body` replaces the final loop (the write);
/// `pre` goes before the max loop.
fn softmax_with(write: &str, extra: &str) -> String {
    format!(
        r#"{HEADER}
__device__ float block_max(float v, float* s) {{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = NEG_INF;
    for (int w = 0; w < (blockDim.x + 31) / 32; ++w) r = fmaxf(r, s[w]);
    __syncthreads();
    return r;
}}
__device__ float block_sum(float v, float* s) {{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = 0.0f;
    for (int w = 0; w < (blockDim.x + 31) / 32; ++w) r += s[w];
    __syncthreads();
    return r;
}}
extern "C" __global__ void softmax_f32(const float* __restrict__ x, float* __restrict__ y,
                                       unsigned int rows, unsigned int cols) {{
    __shared__ float scratch[32];
    const unsigned int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;
    {extra}
    float m = NEG_INF;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
    m = block_max(m, scratch);
    float s = 0.0f;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) s += __expf(xr[c] - m);
    s = block_sum(s, scratch);
    const float inv = 1.0f / s;
    {write}
}}
"#
    )
}

const GOOD_WRITE: &str = "for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = __expf(xr[c] - m) * inv;";

/// (name, source, fences that may reject it; empty = must be accepted).
fn catalogue(shipped: &str) -> Vec<(&'static str, String, &'static [Fence])> {
    vec![
        ("good: same algorithm, warp shuffles", softmax_with(GOOD_WRITE, ""), &[]),
        ("good: the shipped online-vec4 variant", shipped.to_string(), &[]),
        (
            "writes only part of its output",
            softmax_with("for (unsigned int c = threadIdx.x; c < cols; c += 2 * blockDim.x) yr[c] = __expf(xr[c] - m) * inv;", ""),
            &[Fence::Numerics],
        ),
        ("writes zeros", softmax_with("for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = 0.0f;", ""), &[Fence::Numerics]),
        ("computes only the first 16 rows", softmax_with(GOOD_WRITE, "if (row >= 16) return;"), &[Fence::Numerics]),
        (
            "special-cases the declared shapes",
            softmax_with(
                "const bool known = (rows == 4096 && cols == 4096) || (rows == 16 && cols == 65536) || (rows == 32768 && cols == 1024) || (rows == 8 && cols == 50257);\n    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = known ? __expf(xr[c] - m) * inv : 1.0f / cols;",
                "",
            ),
            &[Fence::HeldOut],
        ),
        (
            // The classic off-by-one: `<=` reads one element past each row, past the
            // buffer's end in the last row. The values change nothing mathematically (a
            // larger max cancels out): where the buffer ends on a page boundary the read
            // faults, elsewhere only compute-sanitizer can see it.
            "reads out of bounds",
            softmax_with(GOOD_WRITE, "").replace(
                "for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);",
                "for (unsigned int c = threadIdx.x; c <= cols; c += blockDim.x) m = fmaxf(m, xr[c]);",
            ),
            &[Fence::Sanitizer, Fence::Fault, Fence::Numerics],
        ),
        (
            "writes out of bounds",
            softmax_with("for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) yr[c + 1] = __expf(xr[c] - m) * inv;", ""),
            &[Fence::Numerics, Fence::Fault, Fence::Sanitizer],
        ),
        (
            "races on shared memory",
            softmax_with(GOOD_WRITE, "").replace(
                "if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = v;\n    __syncthreads();\n    float r = 0.0f;",
                "if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = v;\n    float r = 0.0f;",
            ),
            &[Fence::Numerics, Fence::Sanitizer],
        ),
        (
            "overwrites its input",
            softmax_with(&format!("{GOOD_WRITE}\n    __syncthreads();\n    if (threadIdx.x == 0) ((float*)xr)[0] = 0.0f;"), ""),
            &[Fence::InputModified],
        ),
        (
            "loses precision (fp16 accumulation)",
            softmax_with(
                "for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = __half2float(__float2half(__expf(xr[c] - m))) * __half2float(__float2half(inv));",
                "",
            )
            .replace(HEADER, &format!("{HEADER}#include <cuda_fp16.h>\n")),
            &[Fence::Numerics],
        ),
        (
            "faults with an illegal address",
            softmax_with(&format!("{GOOD_WRITE}\n    if (threadIdx.x == 0 && row == 0) yr[(size_t)1 << 40] = 1.0f;"), ""),
            &[Fence::Fault],
        ),
        ("never terminates", softmax_with("while (clock64() >= 0) { }", ""), &[Fence::Hang]),
        (
            "correct but slower than the best",
            softmax_with(&format!("for (int rep = 0; rep < 4; ++rep) {{ {GOOD_WRITE} __syncthreads(); }}"), ""),
            &[Fence::Watchdog],
        ),
    ]
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_candidates_are_rejected_for_the_right_reason() {
    if !kopt::gpu::available_for_test() {
        return;
    }
    let root = example_root();
    let scratch = tempfile::tempdir().unwrap();
    let g = gathered(scratch.path());
    let k = softmax_of(&g);
    let shipped = std::fs::read_to_string(root.join("kopt/softmax/online-vec4/kernel.cu")).unwrap();
    let shipped_variant = kopt_spec::files::VariantFile::parse(
        &std::fs::read_to_string(root.join("kopt/softmax/online-vec4/variant.toml")).unwrap(),
    )
    .unwrap();

    let settings = Settings {
        timing: TimingPolicy {
            max_seconds: 0.5,
            max_samples: 40,
            ..TimingPolicy::default()
        },
        ..Settings::default()
    };
    let mut engine = gpu_engine(scratch.path(), 15);
    let ceilings = engine.ceilings(false).expect("ceilings");
    let judge = Judge::new(Some(ceilings));
    let region = k.spec.parse_region("cols % 4 == 0").unwrap();

    let mut table = Vec::new();
    let mut wrong = Vec::new();
    // KOPT_CATALOGUE_ONLY=substring runs a part of the catalogue.
    let only = std::env::var("KOPT_CATALOGUE_ONLY").ok();
    for (name, source, expected) in catalogue(&shipped)
        .into_iter()
        .filter(|(n, _, _)| only.as_deref().is_none_or(|o| n.contains(o)))
    {
        let candidate = if name.contains("online-vec4") {
            KernelVersion::variant(&shipped_variant, &source)
        } else {
            KernelVersion {
                id: name.into(),
                source,
                ..KernelVersion::reference(&k.spec, "")
            }
        };
        let reg = name.contains("online-vec4").then_some(&region);
        let job = eval::job(&g, k, candidate, reg, &settings, true);
        let ev = engine.evaluate(&job, &mut |_| {});
        let mut verdict = judge.judge(&ev.report);
        if verdict.accepted {
            // The pass every winner of the loop goes through: the four tools.
            let run = sanitizer::sanitize(engine.worker.command(), &job, scratch.path());
            sanitizer::apply(&mut verdict, run);
        }
        let got = verdict.fences();
        let ok = if expected.is_empty() {
            verdict.accepted
        } else {
            !verdict.accepted && got.iter().any(|f| expected.contains(f))
        };
        if !ok {
            wrong.push(format!(
                "{name}: expected {expected:?}, got {}",
                verdict.summary()
            ));
        }
        let expected_text = if expected.is_empty() {
            "accepted".to_string()
        } else {
            expected
                .iter()
                .map(|f| f.name())
                .collect::<Vec<_>>()
                .join(" or ")
        };
        table.push(format!(
            "| {name} | {expected_text} | {} | {} |",
            if verdict.accepted {
                "accepted".to_string()
            } else {
                got.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ")
            },
            verdict
                .summary()
                .replace('|', "/")
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(140)
                .collect::<String>()
        ));
    }
    println!("| candidate | expected | verdict | first reason |\n| --- | --- | --- | --- |");
    for row in &table {
        println!("{row}");
    }
    println!(
        "worker starts (1 + restarts after faults and hangs): {}",
        engine.worker.starts
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The example's row_sum with a tail-skipping cheat: it sums only the largest multiple of
/// 1024 columns of each row, right on both declared shapes (16384 and 2048 columns).
fn tail_skipping_row_sum(reference: &str) -> String {
    let cut = "(cols & ~1023u)";
    let s = reference
        .replace(
            "for (; c + (UNROLL - 1) * step < cols; c += UNROLL * step)",
            &format!("for (; c + (UNROLL - 1) * step < {cut}; c += UNROLL * step)"),
        )
        .replace(
            "for (; c < cols; c += step)",
            &format!("for (; c < {cut}; c += step)"),
        );
    assert_ne!(s, reference, "the cheat must change the kernel");
    s
}

/// A candidate that assumes `cols % 1024 == 0` is caught on its held-out shapes under
/// every one of 20 seed salts (the salt picks the seeded part of the held-out shapes; the
/// odd, minimal and power-of-two-crossing sizes are drawn whatever the salt).
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_tail_skipping_candidate_is_caught_under_twenty_seed_salts() {
    if !kopt::gpu::available_for_test() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let g = gathered(scratch.path());
    let k = g
        .kernels
        .iter()
        .find(|k| k.spec.name == "row_sum")
        .expect("the example's row_sum");
    let source = tail_skipping_row_sum(&k.reference.text);
    let candidate = KernelVersion {
        id: "tail-skipping".into(),
        source,
        ..KernelVersion::reference(&k.spec, "")
    };
    let mut engine = gpu_engine(scratch.path(), 30);
    let judge = Judge::new(engine.ceilings(false).ok());
    let settings = Settings::default();
    let mut caught = 0;
    for salt in 0..20u64 {
        let salt_file = eval::kopt_dir(&g).join("seed-salt");
        std::fs::create_dir_all(salt_file.parent().unwrap()).unwrap();
        std::fs::write(
            &salt_file,
            format!("{}", 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(salt + 1)),
        )
        .unwrap();
        let job = eval::job(&g, k, candidate.clone(), None, &settings, false);
        let verdict = judge.judge(&engine.evaluate(&job, &mut |_| {}).report);
        let declared_ok = verdict
            .failures
            .iter()
            .all(|f| f.shape.as_deref().is_none_or(|s| s.contains("held out")));
        let held_out = verdict.fences().contains(&Fence::HeldOut);
        println!(
            "salt {salt}: {} ({} held-out shapes)",
            verdict.summary().lines().next().unwrap_or(""),
            job.shapes.iter().filter(|s| s.held_out).count()
        );
        assert!(
            declared_ok,
            "the cheat is right on the declared shapes: {}",
            verdict.summary()
        );
        if !verdict.accepted && held_out {
            caught += 1;
        }
    }
    println!("caught under {caught} of 20 seed salts");
    assert_eq!(caught, 20);
}

#[test]
fn catalogue_candidates_are_distinct_variations_of_the_good_one() {
    let c = catalogue("shipped");
    let good = &c[0].1;
    for (name, src, _) in &c[2..] {
        assert_ne!(src, good, "`{name}` must differ from the good candidate");
        assert!(
            src.contains("extern \"C\" __global__ void softmax_f32"),
            "{name}"
        );
    }
}

/// The one-launch copies `cargo kopt bench` measures small shapes against: a large copy
/// runs near the measured copy ceiling, a tiny one costs what a launch costs, and time
/// grows with the bytes.
#[test]
#[ignore = "needs a CUDA GPU"]
fn same_size_copies_are_timed_like_kernels() {
    if !kopt::gpu::available_for_test() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let mut engine = gpu_engine(scratch.path(), 60);
    let ceilings = engine.ceilings(false).expect("ceilings");
    let sizes = [16 << 10, 8 << 20, 512 << 20];
    let copies = engine.copy_times(&sizes, &mut |_| {}).expect("copy times");
    for c in &copies {
        println!(
            "copy of {} bytes: {:.2} µs ({:.0} GB/s; {})",
            c.bytes,
            c.timing.median_us,
            c.bytes as f64 / c.timing.median_us / 1e3,
            c.timing.method
        );
    }
    assert_eq!(copies.len(), 3);
    let us: Vec<f64> = copies.iter().map(|c| c.timing.median_us).collect();
    assert!(
        us[0] > 0.3 && us[0] < 20.0,
        "a 16 KB copy takes {} µs",
        us[0]
    );
    assert!(us[0] < us[1] && us[1] < us[2], "{us:?}");
    let large_gbs = sizes[2] as f64 / us[2] / 1e3;
    assert!(
        large_gbs > 0.7 * ceilings.copy_gbs && large_gbs < 1.15 * ceilings.copy_gbs,
        "512 MB copy at {large_gbs:.0} GB/s against the {:.0} GB/s ceiling",
        ceilings.copy_gbs
    );
    assert!(copies[2].timing.method.contains("L2 cold"));
}

/// A kernel compiled with a non-portable cluster size (16 blocks; sm_90 and later) launches
/// through the engine: the worker opens the limit as the generated launcher does
/// (`kopt::open_launch_limits`). Without that the launch fails and the candidate is not
/// correct.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_cluster_of_16_blocks_launches() {
    if !kopt::gpu::available_for_test() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let Some((g, mut engine)) = cluster_device(scratch.path()) else {
        return;
    };
    let k = softmax_of(&g);
    // The reference's algorithm, one block per row, in clusters of 16 (the grid rounded up
    // to whole clusters; the blocks past the last row return).
    let source = softmax_with(GOOD_WRITE, "").replace(
        "extern \"C\" __global__ void softmax_f32",
        "extern \"C\" __global__ void __cluster_dims__(16, 1, 1) softmax_f32",
    );
    let mut candidate = KernelVersion {
        id: "cluster-16".into(),
        source,
        ..KernelVersion::reference(&k.spec, "")
    };
    let names = k.spec.int_names();
    let kinds = |n: &str| k.spec.var_kind_with(n, &[]);
    candidate.launch.grid[0] = kopt_spec::expr::parse_str(
        "round_up(rows, 16)",
        kopt_spec::expr::Ty::Int,
        &kinds,
        &names,
    )
    .unwrap();
    let settings = brief_timing();
    let job = eval::job(&g, k, candidate, None, &settings, true);
    let ev = engine.evaluate(&job, &mut |_| {});
    let verdict = Judge::new(None).judge(&ev.report);
    println!("{}", verdict.summary());
    assert!(verdict.correct(), "{:?}", verdict.failures);
}

/// A cluster set by the launch rule (`cluster`, not `__cluster_dims__`) reaches the kernel
/// through the engine's launch (`kopt::launch_kernel`, as the generated launcher): the
/// kernel traps unless it runs in clusters of 4. The same kernel launched without the rule
/// faults, so the check is live.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_cluster_set_at_launch_reaches_the_kernel() {
    if !kopt::gpu::available_for_test() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let Some((g, mut engine)) = cluster_device(scratch.path()) else {
        return;
    };
    let k = softmax_of(&g);
    let source = softmax_with(GOOD_WRITE, "").replace(
        "    __shared__ float scratch[32];\n",
        "    __shared__ float scratch[32];\n    { unsigned int n; asm volatile(\"mov.u32 %0, %%cluster_nctarank;\" : \"=r\"(n)); if (n != 4) __trap(); }\n",
    );
    assert!(source.contains("cluster_nctarank"));
    let names = k.spec.int_names();
    let kinds = |n: &str| k.spec.var_kind_with(n, &[]);
    let parse =
        |t: &str| kopt_spec::expr::parse_str(t, kopt_spec::expr::Ty::Int, &kinds, &names).unwrap();
    let settings = brief_timing();
    let mut verdicts = Vec::new();
    for with_rule in [true, false] {
        let mut candidate = KernelVersion {
            id: format!("cluster-at-launch-{with_rule}"),
            source: source.clone(),
            ..KernelVersion::reference(&k.spec, "")
        };
        candidate.launch.grid[0] = parse("round_up(rows, 4)");
        if with_rule {
            candidate.launch.cluster = Some([parse("4"), parse("1"), parse("1")]);
        }
        let job = eval::job(&g, k, candidate, None, &settings, true);
        let ev = engine.evaluate(&job, &mut |_| {});
        let verdict = Judge::new(None).judge(&ev.report);
        println!("cluster rule {with_rule}: {}", verdict.summary());
        if with_rule {
            // The driver says how many clusters of 4 fit at once, for every shape run.
            let report = ev.report.as_ref().expect("a report from the worker");
            for s in report.shapes.iter().filter(|s| s.error.is_none()) {
                let o = s.candidate.as_ref().and_then(|c| c.occupancy);
                let n = o.and_then(|o| o.max_active_clusters);
                println!("{}: {n:?} clusters of 4 resident at once", s.label);
                assert!(n.is_some_and(|n| n >= 1), "{}: {o:?}", s.label);
            }
            // 32768 rows are 8192 clusters: more than any device holds at once.
            assert!(
                verdict
                    .notes
                    .iter()
                    .any(|n| n.starts_with("cols=1024 rows=32768: 8192 clusters of 4 blocks")),
                "{:?}",
                verdict.notes
            );
        }
        verdicts.push(verdict);
    }
    assert!(verdicts[0].correct(), "{:?}", verdicts[0].failures);
    assert!(
        !verdicts[1].correct(),
        "without the rule's cluster the kernel should trap"
    );
}

/// The most common first kernel: one thread per row, three serial passes over it.
const NAIVE_SOFTMAX: &str = r#"
extern "C" __global__ void softmax_f32(const float* __restrict__ x, float* __restrict__ y,
                                       unsigned int rows, unsigned int cols) {
    const unsigned int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;
    float m = __int_as_float(0xff800000);
    for (unsigned int c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
    float s = 0.0f;
    for (unsigned int c = 0; c < cols; ++c) s += expf(xr[c] - m);
    for (unsigned int c = 0; c < cols; ++c) yr[c] = expf(xr[c] - m) / s;
}
"#;

/// A naive softmax (one thread per row) over 8192 rows of 50257 fp32 columns takes
/// hundreds of milliseconds a launch on an H200. Timed against itself through the engine,
/// as `cargo kopt bench` times a kernel without variants, under the default step timeout
/// of 30 s: it is measured launch by launch with few samples and the method stated, not
/// called a hang.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_naive_softmax_of_hundreds_of_milliseconds_is_measured_not_called_a_hang() {
    if !kopt::gpu::available_for_test() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let g = gathered(scratch.path());
    let k = softmax_of(&g);
    let mut engine = Engine::new(
        WorkerCommand::cuda(worker_program(), 0),
        None,
        kopt_engine::ceilings::CeilingsCache::at(scratch.path().join("ceilings.json")),
    );
    assert_eq!(
        engine.worker.step_timeout,
        std::time::Duration::from_secs(30)
    );
    let names = k.spec.int_names();
    let kinds = |n: &str| k.spec.var_kind_with(n, &[]);
    let mut naive = KernelVersion {
        id: "naive".into(),
        source: NAIVE_SOFTMAX.into(),
        ..KernelVersion::reference(&k.spec, "")
    };
    naive.launch.grid[0] = kopt_spec::expr::parse_str(
        "(rows + 255) / 256",
        kopt_spec::expr::Ty::Int,
        &kinds,
        &names,
    )
    .unwrap();
    let mut job = eval::job(&g, k, naive.clone(), None, &Settings::default(), true);
    job.reference = KernelVersion {
        id: "reference".into(),
        ..naive
    };
    let values: std::collections::BTreeMap<String, kopt_spec::spec::Number> = [
        ("rows".to_string(), kopt_spec::spec::Number::Int(8192)),
        ("cols".to_string(), kopt_spec::spec::Number::Int(50257)),
    ]
    .into();
    job.shapes = vec![ShapeCase {
        label: "cols=50257 rows=8192".into(),
        values,
        held_out: false,
        timed: true,
        captured: None,
    }];
    let t0 = std::time::Instant::now();
    let ev = engine.evaluate(&job, &mut |step| {
        println!("{:>7.1} s  {step}", t0.elapsed().as_secs_f64())
    });
    let wall = t0.elapsed();
    let verdict = Judge::new(None).judge(&ev.report);
    println!("{} ({:.1} s in all)", verdict.summary(), wall.as_secs_f64());
    for n in &verdict.notes {
        println!("note: {n}");
    }
    let report = ev
        .report
        .as_ref()
        .unwrap_or_else(|e| panic!("the naive softmax was not measured: {e}"));
    let shape = &report.shapes[0];
    assert!(shape.error.is_none(), "{:?}", shape.error);
    for (who, l) in [
        ("reference", &shape.reference),
        ("candidate", &shape.candidate),
    ] {
        let l = l.as_ref().unwrap();
        let t = l.timing.as_ref().expect("timed");
        let p = l.timing_plan.as_ref().expect("a timing plan");
        println!(
            "{who}: {} median over {} samples ({}; {})",
            kopt_engine::stats::duration_text(t.median_us),
            t.samples,
            t.method,
            p.reason
        );
        assert!(
            t.median_us > kopt_engine::job::PER_LAUNCH_ABOVE_US,
            "{who}: {} µs is not the slow kernel this test is about",
            t.median_us
        );
        assert!(p.per_launch && t.launches_per_sample == 1, "{who}: {p:?}");
        assert!(
            t.samples >= kopt_engine::job::MIN_SLOW_SAMPLES,
            "{who}: {t:?}"
        );
        assert!(
            t.method.starts_with("each launch timed alone"),
            "{}",
            t.method
        );
    }
    assert!(verdict.correct(), "{:?}", verdict.failures);
    assert!(
        verdict
            .notes
            .iter()
            .any(|n| n.contains("timed launch by launch")),
        "{:?}",
        verdict.notes
    );
    assert!(wall < std::time::Duration::from_secs(300), "{wall:?}");
}
