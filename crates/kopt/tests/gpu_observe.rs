//! Capture and shadow checks through a launcher, on the GPU. The kernel is built here as
//! the macro would build it (the same `KernelDef`), with a variant that is right on
//! N(0, 1) rows and wrong on peaked ones: a softmax without the row's maximum, whose
//! `exp` overflows at logits of 100. One test: the settings are read once per process.

use std::sync::Arc;

use kopt::cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};
use kopt::expr::Op;
use kopt::{BufferDef, Kernel, KernelDef, VariantDef};

const SAFE: &str = r#"
extern "C" __global__ void softmax_f32(const float* x, float* y, unsigned int rows, unsigned int cols) {
    __shared__ float red[256];
    const unsigned int r = blockIdx.x;
    if (r >= rows) return;
    float m = -3.4e38f;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, x[r * cols + c]);
    red[threadIdx.x] = m; __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) { if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]); __syncthreads(); }
    m = red[0]; __syncthreads();
    float sum = 0.0f;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(x[r * cols + c] - m);
    red[threadIdx.x] = sum; __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) { if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s]; __syncthreads(); }
    sum = red[0];
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) y[r * cols + c] = expf(x[r * cols + c] - m) / sum;
}
"#;

/// The same, without subtracting the row's maximum: `exp(100)` is infinite in fp32.
const NO_MAX: &str = r#"
extern "C" __global__ void softmax_f32(const float* x, float* y, unsigned int rows, unsigned int cols) {
    __shared__ float red[256];
    const unsigned int r = blockIdx.x;
    if (r >= rows) return;
    float sum = 0.0f;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(x[r * cols + c]);
    red[threadIdx.x] = sum; __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) { if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s]; __syncthreads(); }
    sum = red[0];
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) y[r * cols + c] = expf(x[r * cols + c]) / sum;
}
"#;

fn leak<T>(v: Vec<T>) -> &'static [T] {
    Box::leak(v.into_boxed_slice())
}

/// The kernel `peaked_softmax(x, y, rows, cols)`, its variant `no-max` accepted for `arch`.
fn kernel(arch: &str) -> &'static Kernel {
    let item = kopt::spec::parse_item(
        "pub fn peaked_softmax(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);"
            .parse()
            .unwrap(),
    )
    .unwrap();
    let spec = kopt::spec::parse_kernel(
        "reference = \"softmax.cu\", entry = \"softmax_f32\", x: [rows * cols], y: [rows * cols], grid = rows, block = 256, shapes = [{ rows: 64, cols: 4096 }]"
            .parse()
            .unwrap(),
        &item,
    )
    .unwrap()
    .0;
    let program = |e: &kopt::expr::Expr| -> &'static [Op] {
        leak(spec.compile_expr(e, &Default::default()).unwrap())
    };
    let grid = [
        program(&spec.launch.grid[0]),
        program(&spec.launch.grid[1]),
        program(&spec.launch.grid[2]),
    ];
    let block = [
        program(&spec.launch.block[0]),
        program(&spec.launch.block[1]),
        program(&spec.launch.block[2]),
    ];
    let version = |id: &'static str, arch: Option<&'static str>, source: &'static str| VariantDef {
        id,
        arch,
        device: None,
        region: None,
        source,
        entry: "softmax_f32",
        options: &[],
        grid,
        block,
        smem: program(&spec.launch.smem),
        cluster: None,
        ptx: None,
        args: &[0, 1, 2, 3],
    };
    let buffers = leak(
        spec.buffers()
            .map(|b| BufferDef {
                name: Box::leak(b.name.clone().into_boxed_str()),
                len: program(&b.len),
            })
            .collect(),
    );
    let arch: &'static str = Box::leak(arch.to_string().into_boxed_str());
    Box::leak(Box::new(Kernel::new(KernelDef {
        name: "peaked_softmax",
        crate_name: "kopt",
        spec_json: Box::leak(spec.canonical_json().into_boxed_str()),
        scalars: &["rows", "cols"],
        buffers,
        reference: version("reference", None, SAFE),
        variants: leak(vec![version("no-max", Some(arch), NO_MAX)]),
        unusable: &[],
    })))
}

fn launch(
    k: &'static Kernel,
    stream: &Arc<CudaStream>,
    x: &[f32],
    rows: u32,
    cols: u32,
) -> Vec<f32> {
    let xd = stream.clone_htod(x).unwrap();
    let mut yd = stream.alloc_zeros::<f32>(x.len()).unwrap();
    let args = [rows as i64, cols as i64];
    let l = k.prepare(stream, &args, &mut []).unwrap();
    {
        let (px, _gx) = xd.device_ptr(stream);
        let (py, _gy) = yd.device_ptr_mut(stream);
        let mut params = [
            &px as *const _ as *mut std::ffi::c_void,
            &py as *const _ as *mut std::ffi::c_void,
            &rows as *const _ as *mut std::ffi::c_void,
            &cols as *const _ as *mut std::ffi::c_void,
        ];
        unsafe { l.launch(stream, &mut params) }.unwrap();
    }
    stream.clone_dtoh(&yd).unwrap()
}

/// `rows x cols` values of N(0, 1) (a fixed generator), with `peak` added at one element
/// of each row when given.
fn rows_of(rows: usize, cols: usize, peak: Option<f32>) -> Vec<f32> {
    let mut s = 0x2545F4914F6CDD1Du64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut v: Vec<f32> = (0..rows * cols)
        .map(|_| {
            // Box-Muller.
            let (u, w) = (next().max(1e-12), next());
            ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * w).cos()) as f32
        })
        .collect();
    if let Some(p) = peak {
        for r in 0..rows {
            v[r * cols + (r * 37) % cols] += p;
        }
    }
    v
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_variant_wrong_on_peaked_rows_is_caught_by_the_shadow_check_and_captured() {
    if !kopt::gpu::available_for_test() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Read once, at the process's first launch: set before it.
    std::env::set_var(kopt::observe::CAPTURE, dir.path());
    std::env::set_var(kopt::observe::CAPTURE_TIME_EVERY, "1");
    std::env::set_var(kopt::observe::SHADOW, "1");
    std::env::set_var(kopt::observe::SHADOW_FALLBACK, "1");
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    let (major, minor) = ctx.compute_capability().unwrap();
    let k = kernel(&format!("sm_{major}{minor}"));
    let (rows, cols) = (64u32, 4096u32);

    // N(0, 1) rows: the variant runs, and is right.
    let calm = rows_of(rows as usize, cols as usize, None);
    for _ in 0..3 {
        let y = launch(k, &stream, &calm, rows, cols);
        assert!(y.iter().all(|v| v.is_finite()));
    }
    kopt::observe::flush().unwrap();
    let r = k
        .shadow_report()
        .expect("the variant ran under KOPT_SHADOW");
    assert_eq!((r.checks, r.divergences), (3, 0), "{r:?}");
    assert!(!k.fell_back());

    // Peaked rows: exp(100) overflows, the variant writes NaN; the check sees it.
    let peaked = rows_of(rows as usize, cols as usize, Some(100.0));
    let y = launch(k, &stream, &peaked, rows, cols);
    assert!(
        y.iter().any(|v| !v.is_finite()),
        "the variant is wrong here"
    );
    kopt::observe::flush().unwrap();
    let r = k.shadow_report().unwrap();
    assert_eq!((r.checks, r.divergences), (4, 1), "{r:?}");
    let d = &r.first[0];
    assert_eq!((d.variant.as_str(), d.buffer.as_str()), ("no-max", "y"));
    assert!(d.failing > 0 && d.failing <= (rows * cols) as u64);
    assert!(!d.got.is_finite() && d.want.is_finite(), "{d:?}");
    assert!(
        k.fell_back(),
        "KOPT_SHADOW_FALLBACK: the reference from now on"
    );
    let s = k.explain(&stream, &[rows as i64, cols as i64]).unwrap();
    assert_eq!(s.reason, kopt::Reason::ShadowFallback, "{s}");
    // The reference runs now: the same peaked rows come out right.
    let y = launch(k, &stream, &peaked, rows, cols);
    assert!(y.iter().all(|v| v.is_finite()));
    let row: f32 = y[..cols as usize].iter().sum();
    assert!((row - 1.0).abs() < 1e-4, "{row}");

    // The capture: one case, its five launches (the variant's four, the reference's one),
    // the first two launches' inputs kept as they were uploaded, the other three timed.
    kopt::observe::flush().unwrap();
    let runs = kopt_spec::capture::load(dir.path()).unwrap();
    assert_eq!(runs.len(), 1);
    let m = &runs[0].manifest;
    assert_eq!(m.arch, format!("sm_{major}{minor}"));
    let kc = m
        .kernels
        .iter()
        .find(|c| c.kernel == "peaked_softmax")
        .unwrap();
    // The hash `kopt.lock` records: of the spec's canonical JSON, which the launcher embeds.
    assert_eq!(
        kc.spec_hash,
        kopt_spec::source::hash(k.def().spec_json.as_bytes())
    );
    let case = &kc.cases[0];
    assert_eq!(case.launches, 5);
    assert_eq!(case.versions["no-max"], 4);
    assert_eq!(case.versions["reference"], 1);
    assert_eq!(case.timed_launches, 3);
    assert!(case.timed_us > 0.0);
    assert_eq!(case.inputs.len(), 2);
    let bytes = std::fs::read(runs[0].dir.join(&case.inputs[0].file)).unwrap();
    let (tensors, meta) = kopt_spec::capture::read_safetensors(&bytes).unwrap();
    assert_eq!(meta["kernel"], "peaked_softmax");
    assert_eq!(tensors[0].name, "x");
    assert_eq!(tensors[0].shape, [rows as u64, cols as u64]);
    let first: Vec<f32> = tensors[0]
        .data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(first, calm);
    // The shadow's record is in the manifest too.
    let sh = m
        .shadow
        .iter()
        .find(|s| s.kernel == "peaked_softmax")
        .unwrap();
    assert_eq!(sh.divergences, 1);
    assert!(sh.fell_back);
}
