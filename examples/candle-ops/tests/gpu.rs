//! kopt's ops against candle's own, on candle tensors, on a GPU: every declared shape of
//! every kernel, shapes that take the kernels' other paths (odd lengths, views with an
//! offset, three dimensions), and the decoder step end to end. Each comparison uses the
//! tolerance the kernel's annotation declares (kopt's rule; `src/kernels.rs` says why each
//! is what it is), which is what the loop verified the accepted variants with.
//!
//! `KOPT_REQUIRE_GPU=1` makes a missing GPU a failure instead of a skip.

use candle_core::{DType, Device, IndexOp, Tensor};
use candle_ops::check::{compare, Tolerance};
use candle_ops::kernels::{RMSNORM_BF16, RMSNORM_F32, SOFTMAX_BF16, SOFTMAX_F32};
use candle_ops::model::{Config, DecoderStep, Ops};
use candle_ops::ops;

fn gpu() -> Option<Device> {
    if !kopt::gpu::available_for_test() {
        return None;
    }
    Some(Device::new_cuda(0).expect("a CUDA device for candle"))
}

fn dtype_of(kernel: &kopt::Kernel) -> DType {
    if kernel.name().ends_with("bf16") {
        DType::BF16
    } else {
        DType::F32
    }
}

/// N(0, 1) inputs of `dims`, fresh for each `seed`.
fn normal(dims: &[usize], dtype: DType, device: &Device, seed: u64) -> Tensor {
    device.set_seed(seed).unwrap();
    Tensor::randn(0f32, 1f32, dims, device)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// The shapes `kernel` declares, as (rows, ncols).
fn declared(kernel: &kopt::Kernel) -> Vec<(usize, usize)> {
    let spec = kernel.spec();
    spec.shapes
        .iter()
        .map(|s| {
            let args = spec.shape_args(s);
            (args[0] as usize, args[1] as usize)
        })
        .collect()
}

/// Which version of `kernel` ran for (rows, ncols), for the failure messages.
fn ran(kernel: &kopt::Kernel, device: &Device, rows: usize, ncols: usize) -> String {
    let stream = device.as_cuda_device().unwrap().cuda_stream();
    let mut args = vec![rows as i64, ncols as i64];
    if kernel.spec().scalars().count() == 3 {
        args.push(0); // eps, which selection does not read
    }
    kernel
        .explain(&stream, &args)
        .map(|s| s.to_string())
        .unwrap_or_else(|e| format!("(explain failed: {e})"))
}

fn check_softmax(kernel: &kopt::Kernel, x: &Tensor, what: &str, device: &Device) {
    let want = candle_nn::ops::softmax_last_dim(x).unwrap();
    let got = ops::softmax_last_dim(x).unwrap();
    let c = compare(&got, &want, Tolerance::of(kernel, "dst")).unwrap();
    let dims = x.dims();
    let ncols = dims[dims.len() - 1];
    let why = ran(kernel, device, x.elem_count() / ncols, ncols);
    assert!(c.passed(), "{what} {dims:?}: {c}; {why}");
    eprintln!(
        "{what} {dims:?}: {:.3} of the allowance; {why}",
        c.worst_ratio
    );
}

fn check_rms_norm(kernel: &kopt::Kernel, x: &Tensor, alpha: &Tensor, what: &str, device: &Device) {
    let eps = 1e-6;
    let want = candle_nn::ops::rms_norm(x, alpha, eps).unwrap();
    let got = ops::rms_norm(x, alpha, eps).unwrap();
    let c = compare(&got, &want, Tolerance::of(kernel, "dst")).unwrap();
    let dims = x.dims();
    let ncols = dims[dims.len() - 1];
    let why = ran(kernel, device, x.elem_count() / ncols, ncols);
    assert!(c.passed(), "{what} {dims:?}: {c}; {why}");
    eprintln!(
        "{what} {dims:?}: {:.3} of the allowance; {why}",
        c.worst_ratio
    );
}

/// Rows and columns off the declared ones, where the kernels take other paths: lengths
/// that are not a multiple of a vector (scalar loops), one row, one column, a row longer
/// than the candidates keep in registers, and row counts that do not divide a block's.
const OTHER_SHAPES: &[(usize, usize)] = &[
    (1, 1),
    (3, 7),
    (33, 1001),
    (17, 4099),
    (5, 40000),
    (100, 128),
    (1, 4096),
];

#[test]
#[ignore = "needs a CUDA GPU"]
fn softmax_matches_candle_on_every_declared_shape_and_more() {
    let Some(device) = gpu() else { return };
    for kernel in [&SOFTMAX_BF16, &SOFTMAX_F32] {
        let dtype = dtype_of(kernel);
        for (seed, &(rows, ncols)) in declared(kernel).iter().chain(OTHER_SHAPES).enumerate() {
            let x = normal(&[rows, ncols], dtype, &device, 100 + seed as u64);
            check_softmax(kernel, &x, kernel.name(), &device);
        }
        // Three dimensions (rows are all but the last), and a view whose storage starts
        // past an element: contiguous, but not 16-byte aligned.
        let x = normal(&[8, 64, 1000], dtype, &device, 7);
        check_softmax(kernel, &x, kernel.name(), &device);
        let wide = normal(&[64, 1025], dtype, &device, 8);
        let view = wide.i((.., 1..)).unwrap().contiguous().unwrap();
        check_softmax(kernel, &view, kernel.name(), &device);
        let offset = normal(&[1 + 32 * 1024], dtype, &device, 9)
            .narrow(0, 1, 32 * 1024)
            .unwrap()
            .reshape((32, 1024))
            .unwrap();
        check_softmax(kernel, &offset, "offset view", &device);
        // Large magnitudes and a causal mask's -inf: the max and the exponentials' range.
        let big = (normal(&[256, 4096], dtype, &device, 10) * 30.0).unwrap();
        check_softmax(kernel, &big, "inputs of N(0, 30)", &device);
        let mask: Vec<f32> = (0..64 * 64)
            .map(|i| {
                if i % 64 > i / 64 {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let masked = normal(&[64, 64], dtype, &device, 11)
            .broadcast_add(
                &Tensor::from_vec(mask, (64, 64), &device)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap(),
            )
            .unwrap();
        check_softmax(kernel, &masked, "causal mask", &device);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn rms_norm_matches_candle_on_every_declared_shape_and_more() {
    let Some(device) = gpu() else { return };
    for kernel in [&RMSNORM_BF16, &RMSNORM_F32] {
        let dtype = dtype_of(kernel);
        for (seed, &(rows, ncols)) in declared(kernel).iter().chain(OTHER_SHAPES).enumerate() {
            let x = normal(&[rows, ncols], dtype, &device, 200 + seed as u64);
            device.set_seed(300 + seed as u64).unwrap();
            let alpha = Tensor::rand(0.5f32, 1.5f32, ncols, &device)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            check_rms_norm(kernel, &x, &alpha, kernel.name(), &device);
        }
        // Three dimensions (a per-head norm: tokens x heads x head_dim), and a weight that
        // is a view with an offset.
        let x = normal(&[512, 8, 128], dtype, &device, 12);
        let alpha_store = (normal(&[129], dtype, &device, 13).abs().unwrap() + 0.5).unwrap();
        let alpha = alpha_store.narrow(0, 1, 128).unwrap();
        check_rms_norm(kernel, &x, &alpha, "head norm, offset weight", &device);
        let big = (normal(&[64, 4096], dtype, &device, 14) * 100.0).unwrap();
        let ones = Tensor::ones(4096, dtype, &device).unwrap();
        check_rms_norm(kernel, &big, &ones, "inputs of N(0, 100)", &device);
    }
}

/// The decoder step with kopt's ops against the same step with candle-nn's: the same
/// weights and inputs, every norm and softmax replaced. Only the last op's output is
/// compared, so the tolerance is wider than one op's: the few outputs that move by a
/// rounding step in an early op move the activations of the later ones. For bf16, twice
/// the softmax's own (4%, against the row's scale); for f32, 1e-3.
#[test]
#[ignore = "needs a CUDA GPU"]
fn decoder_step_with_kopt_ops_matches_candle() {
    let Some(device) = gpu() else { return };
    for (dtype, tol) in [
        (
            DType::BF16,
            Tolerance {
                rtol: 4e-2,
                atol: 1e-9,
            },
        ),
        (
            DType::F32,
            Tolerance {
                rtol: 1e-3,
                atol: 1e-9,
            },
        ),
    ] {
        let step = DecoderStep::new(Config::SMALL, dtype, &device, 42).unwrap();
        let x = step.input(dtype, &device, 43).unwrap();
        let want = step.forward(&x, Ops::Candle).unwrap();
        let got = step.forward(&x, Ops::Kopt).unwrap();
        assert_eq!(got.dims(), [Config::SMALL.tokens, Config::SMALL.vocab]);
        let c = compare(&got, &want, tol).unwrap();
        assert!(c.passed(), "decoder step, {dtype:?}: {c}");
        let sums = got
            .to_dtype(DType::F32)
            .unwrap()
            .sum(1)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let tolerance = if dtype == DType::BF16 { 3e-2 } else { 1e-4 };
        for (row, s) in sums.iter().enumerate() {
            assert!(
                (s - 1.0).abs() < tolerance,
                "decoder step, {dtype:?}: row {row}'s probabilities sum to {s}"
            );
        }
        eprintln!(
            "decoder step {dtype:?}: {:.3} of the allowance",
            c.worst_ratio
        );
    }
}

/// On the CPU the ops are candle-nn's: the same results exactly.
#[test]
fn cpu_tensors_go_to_candle_nn() {
    let x = Tensor::arange(0f32, 24.0, &Device::Cpu)
        .unwrap()
        .reshape((4, 6))
        .unwrap();
    let alpha = Tensor::ones(6, DType::F32, &Device::Cpu).unwrap();
    let a = ops::softmax_last_dim(&x).unwrap().to_vec2::<f32>().unwrap();
    let b = candle_nn::ops::softmax_last_dim(&x)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    assert_eq!(a, b);
    let a = ops::rms_norm(&x, &alpha, 1e-6)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let b = candle_nn::ops::rms_norm(&x, &alpha, 1e-6)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    assert_eq!(a, b);
    let wrong = Tensor::ones(5, DType::F32, &Device::Cpu).unwrap();
    let e = ops::rms_norm(&x, &wrong, 1e-6).unwrap_err().to_string();
    assert!(e.contains("shape mismatch"), "{e}");
}
