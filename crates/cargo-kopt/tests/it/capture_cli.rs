//! A program's capture (`KOPT_CAPTURE`) read by `verify --inputs`, `bench --inputs`,
//! `optimize --inputs` and `profile --program`, on the fake device: captures written here
//! in the documented format (manifest and safetensors), as the launchers write them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kopt_spec::capture::{
    self, CaptureManifest, CaptureSettings, CaseCapture, InputSample, KernelCapture, Tensor,
};
use kopt_spec::spec::{DType, Number};
use kopt_tests::ExampleWorkspace;

/// The `cargo-kopt` under test (on a GPU runner, the staged one on PATH).
fn exe() -> PathBuf {
    kopt_tests::cargo_kopt_binary(env!("CARGO_BIN_EXE_cargo-kopt"))
}

fn kopt(ws: &ExampleWorkspace, args: &[&str]) -> std::process::Output {
    ws.kopt_on_fake(&exe(), args).output().unwrap()
}

/// The spec hash of `kernel` as the workspace copy declares it today.
fn spec_hash(ws: &ExampleWorkspace, kernel: &str) -> String {
    let target = tempfile::tempdir().unwrap();
    let g = kopt_workspace::gather::gather_crate("llm-kernels", &ws.krate, target.path());
    g.kernels
        .iter()
        .find(|k| k.spec.name == kernel)
        .unwrap()
        .hashes
        .spec
        .clone()
}

/// A case of a capture: scalars, launches, (timed launches, their µs), the inputs kept.
fn case(scalars: &[(&str, i64)], launches: u64, timed: (u64, f64), files: &[&str]) -> CaseCapture {
    CaseCapture {
        scalars: scalars
            .iter()
            .map(|(k, v)| (k.to_string(), Number::Int(*v)))
            .collect(),
        launches,
        versions: BTreeMap::from([("reference".to_string(), launches)]),
        timed_launches: timed.0,
        timed_us: timed.1,
        inputs: files
            .iter()
            .enumerate()
            .map(|(i, f)| InputSample {
                file: f.to_string(),
                launch: i as u64 + 1,
                version: "reference".into(),
            })
            .collect(),
        inputs_over_cap: 0,
    }
}

/// Writes a process's capture folder `dir` with `kernels`.
fn write_capture(dir: &Path, kernels: Vec<KernelCapture>) {
    let m = CaptureManifest {
        format: capture::FORMAT,
        kind: capture::KIND.into(),
        program: "decode-app".into(),
        pid: 4242,
        device: "kopt fake GPU (sm_90)".into(),
        arch: "sm_90".into(),
        started_ms: 1,
        written_ms: 2,
        settings: CaptureSettings {
            inputs_per_case: 2,
            max_bytes: 1 << 30,
            time_every: 16,
        },
        bytes_written: 0,
        kernels,
        shadow: vec![],
    };
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join(capture::MANIFEST),
        serde_json::to_string_pretty(&m).unwrap(),
    )
    .unwrap();
}

/// softmax's input `x` of `rows x cols` floats: small values, and `outlier` at index 17
/// (an activation thousands of times the median, as real ones have).
fn write_softmax_input(file: &Path, rows: u64, cols: u64, outlier: f32) {
    let mut data = Vec::new();
    for i in 0..rows * cols {
        let v = if i == 17 {
            outlier
        } else {
            ((i % 13) as f32 - 6.0) * 0.25
        };
        data.extend_from_slice(&v.to_le_bytes());
    }
    let x = Tensor {
        name: "x".into(),
        dtype: DType::F32,
        shape: vec![rows, cols],
        data,
    };
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(file, capture::write_safetensors(&[&x], &BTreeMap::new())).unwrap();
}

fn softmax_capture(ws: &ExampleWorkspace, dir: &Path, outlier: f32, hash: &str) -> PathBuf {
    let process = dir.join("decode-app-4242-1");
    write_softmax_input(&process.join("softmax/c0-l1.safetensors"), 8, 4096, outlier);
    write_capture(
        &process,
        vec![KernelCapture {
            kernel: "softmax".into(),
            krate: "llm-kernels".into(),
            spec_hash: hash.to_string(),
            cases: vec![case(
                &[("rows", 8), ("cols", 4096)],
                1000,
                (63, 189.0),
                &["softmax/c0-l1.safetensors"],
            )],
        }],
    );
    let _ = ws;
    process
}

#[test]
fn verify_on_a_programs_own_inputs_catches_what_drawn_inputs_miss() {
    let ws = ExampleWorkspace::new();
    // Right on drawn N(0, 1) inputs, wrong where an input exceeds 50.
    ws.pin_softmax_variant(
        &exe(),
        "outlier-blind",
        "// kopt-fake: wrong-if-input-over x 50 y",
    );
    let o = kopt(&ws, &["verify", "softmax", "--no-sanitize"]);
    assert!(o.status.success(), "{}", kopt_tests::text(&o));

    let hash = spec_hash(&ws, "softmax");
    let dir = ws.root.join("capture");
    softmax_capture(&ws, &dir, 3000.0, &hash);
    let dir_arg = dir.to_str().unwrap();
    let o = kopt(
        &ws,
        &["verify", "softmax", "--no-sanitize", "--inputs", dir_arg],
    );
    let out = kopt_tests::text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("cols=4096 rows=8 (captured: launch 1 of decode-app)"),
        "the captured launch is a case of its own: {out}"
    );
    // The program's shape is not declared: the note says how to add it.
    assert!(
        out.contains("`softmax` was launched on cols=4096 rows=8 (1000 launches, 100.0% of its captured time), which no declared shape covers; to time it too: shapes = [{ rows: 4096, cols: 4096 }, { rows: 16, cols: 65536 }, { rows: 32768, cols: 1024 }, { rows: 8, cols: 50257 }, { rows: 8, cols: 4096 }]"),
        "{out}"
    );

    // The same program without the outlier: the variant is right on it.
    let calm = ws.root.join("calm");
    softmax_capture(&ws, &calm, 1.5, &hash);
    let o = kopt(
        &ws,
        &[
            "verify",
            "softmax",
            "--no-sanitize",
            "--inputs",
            calm.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
}

#[test]
fn a_capture_of_another_annotation_or_a_damaged_file_is_refused_with_the_reason() {
    let ws = ExampleWorkspace::new();
    let dir = ws.root.join("capture");
    let process = softmax_capture(&ws, &dir, 1.0, "sha256:0123456789abcdef0123");
    let o = kopt(
        &ws,
        &["verify", "softmax", "--inputs", dir.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(2), "{}", kopt_tests::text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("recorded `softmax` of llm-kernels built with another #[kopt::kernel] annotation than today's (its spec hash 0123456789ab, today's"),
        "{err}"
    );
    assert!(
        err.contains("run `decode-app` again with KOPT_CAPTURE"),
        "{err}"
    );

    // Today's annotation, but a tensor file cut short: the shape's error names the file.
    let hash = spec_hash(&ws, "softmax");
    let dir = ws.root.join("capture2");
    let process2 = softmax_capture(&ws, &dir, 1.0, &hash);
    let file = process2.join("softmax/c0-l1.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let o = kopt(
        &ws,
        &[
            "verify",
            "softmax",
            "--no-sanitize",
            "--inputs",
            dir.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", kopt_tests::text(&o));
    let out = kopt_tests::text(&o);
    assert!(
        out.contains("c0-l1.safetensors") && out.contains("lie outside"),
        "{out}"
    );
    let _ = process;

    // A folder without any capture says how to make one.
    let empty = ws.root.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let o = kopt(&ws, &["verify", "--inputs", empty.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("holds no capture") && err.contains("KOPT_CAPTURE="),
        "{err}"
    );
}

#[test]
fn the_bench_weighs_captured_shapes_by_the_programs_launches() {
    let ws = ExampleWorkspace::new();
    let hash = spec_hash(&ws, "softmax");
    let process = ws.root.join("capture/decode-app-4242-1");
    write_softmax_input(&process.join("softmax/c0-l1.safetensors"), 8, 4096, 1.0);
    write_capture(
        &process,
        vec![KernelCapture {
            kernel: "softmax".into(),
            krate: "llm-kernels".into(),
            spec_hash: hash,
            cases: vec![
                case(
                    &[("rows", 8), ("cols", 4096)],
                    1000,
                    (63, 189.0),
                    &["softmax/c0-l1.safetensors"],
                ),
                // Launched, its inputs not kept: timed on drawn inputs.
                case(&[("rows", 4096), ("cols", 4096)], 10, (1, 60.0), &[]),
            ],
        }],
    );
    let dir = ws.root.join("capture");
    let o = kopt(
        &ws,
        &[
            "bench",
            "softmax",
            "--inputs",
            dir.to_str().unwrap(),
            "--message-format",
            "json",
        ],
    );
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let file: kopt_report::BenchFile = serde_json::from_slice(&o.stdout).unwrap();
    let launches: Vec<(String, Option<u64>)> = file
        .rows
        .iter()
        .map(|r| (r.shape.clone(), r.launches))
        .collect();
    assert!(
        launches.contains(&(
            "cols=4096 rows=8 (captured: 1000 launches)".into(),
            Some(1000)
        )),
        "{launches:?}"
    );
    assert!(
        launches.contains(&(
            "cols=4096 rows=4096 (captured: 10 launches)".into(),
            Some(10)
        )),
        "{launches:?}"
    );
    assert!(
        launches.contains(&("cols=4096 rows=4096".into(), None)),
        "declared shapes stay: {launches:?}"
    );
    let w = file.weighted();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].launches, 1010);
    let rows: Vec<_> = file.rows.iter().filter(|r| r.launches.is_some()).collect();
    let expect: f64 = rows
        .iter()
        .map(|r| r.launches.unwrap() as f64 * r.reference_us.unwrap() / 1e3)
        .sum();
    assert!((w[0].reference_ms - expect).abs() < 1e-9);

    let o = kopt(
        &ws,
        &["bench", "softmax", "--inputs", dir.to_str().unwrap()],
    );
    let out = kopt_tests::text(&o);
    assert!(
        out.contains(
            "in the captured program (each captured shape's time per launch times its launches)"
        ),
        "{out}"
    );
}

#[test]
fn profile_program_ranks_the_kernels_by_their_share_of_the_programs_time() {
    let ws = ExampleWorkspace::new();
    let process = ws.root.join("capture/decode-app-4242-1");
    write_capture(
        &process,
        vec![
            KernelCapture {
                kernel: "softmax".into(),
                krate: "llm-kernels".into(),
                spec_hash: spec_hash(&ws, "softmax"),
                cases: vec![case(&[("rows", 8), ("cols", 4096)], 1000, (63, 126.0), &[])],
            },
            KernelCapture {
                kernel: "rmsnorm".into(),
                krate: "llm-kernels".into(),
                spec_hash: spec_hash(&ws, "rmsnorm"),
                cases: vec![case(
                    &[("rows", 8), ("cols", 4096)],
                    4000,
                    (250, 1500.0),
                    &[],
                )],
            },
        ],
    );
    let dir = ws.root.join("capture");
    let o = kopt(
        &ws,
        &[
            "profile",
            "--program",
            dir.to_str().unwrap(),
            "--message-format",
            "json",
        ],
    );
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = v["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kernel"].as_str().unwrap())
        .collect();
    // rmsnorm: 4000 launches of 6 µs (24 ms); softmax: 1000 of 2 µs (2 ms).
    assert_eq!(names, ["rmsnorm", "softmax"]);
    let share = v["kernels"][0]["share_pct"].as_f64().unwrap();
    assert!((share - 100.0 * 24.0 / 26.0).abs() < 1e-9, "{share}");

    let o = kopt(&ws, &["profile", "--program", dir.to_str().unwrap()]);
    let out = kopt_tests::text(&o);
    assert!(o.status.success(), "{out}");
    let rms = out.find("rmsnorm").unwrap();
    let soft = out.find("softmax").unwrap();
    assert!(rms < soft, "ranked by share: {out}");
    assert!(out.contains("92.3%"), "{out}");
}

/// softmax as the reference computes it, without subtracting the row's maximum: right on
/// rows of N(0, 1), infinite `exp` (NaN outputs) on a logit of 100.
const NO_MAX_SOFTMAX: &str = r#"extern "C" __global__ void softmax_f32(const float* __restrict__ x, float* __restrict__ y,
                                       unsigned int rows, unsigned int cols) {
    __shared__ float part[256];
    const unsigned int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;
    float s = 0.0f;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) s += __expf(xr[c]);
    part[threadIdx.x] = s;
    __syncthreads();
    for (unsigned int h = blockDim.x / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h) part[threadIdx.x] += part[threadIdx.x + h];
        __syncthreads();
    }
    const float inv = 1.0f / part[0];
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = __expf(xr[c]) * inv;
}
"#;

#[test]
#[ignore = "needs a CUDA GPU"]
fn on_the_gpu_a_variant_right_on_drawn_rows_passes_verify_and_fails_on_the_programs_peaked_rows() {
    if !kopt::gpu::available_for_test() {
        return;
    }
    let exe = exe();
    let ws = ExampleWorkspace::new();
    ws.pin_softmax_variant_with(&exe, "no-max", |dir| {
        std::fs::write(dir.join("kernel.cu"), NO_MAX_SOFTMAX).unwrap();
        std::fs::write(
            dir.join("variant.toml"),
            "format = 1\nkernel = \"softmax\"\nid = \"no-max\"\nentry = \"softmax_f32\"\noptions = []\n\n[launch]\ngrid = [\"rows\", \"1\", \"1\"]\nblock = [\"256\", \"1\", \"1\"]\nsmem = \"0\"\n",
        )
        .unwrap();
    });
    let gpu = |args: &[&str]| ws.kopt_on_gpu(&exe, args).output().unwrap();
    let o = gpu(&["verify", "softmax", "--no-sanitize"]);
    assert!(
        o.status.success(),
        "right on drawn rows: {}",
        kopt_tests::text(&o)
    );

    // The program's logits: peaked rows, one logit of 100 in each.
    let hash = spec_hash(&ws, "softmax");
    let dir = ws.root.join("capture");
    softmax_capture(&ws, &dir, 100.0, &hash);
    let o = gpu(&[
        "verify",
        "softmax",
        "--no-sanitize",
        "--inputs",
        dir.to_str().unwrap(),
    ]);
    let out = kopt_tests::text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("cols=4096 rows=8 (captured: launch 1 of decode-app)"),
        "{out}"
    );
    assert!(out.contains("NaN/Inf"), "{out}");
}
