//! The launchers: candle's own kernels (`kernels/candle/reduce.cu`, byte for byte the
//! candle-kernels 0.11.1 file; `tests/kernel_sources.rs` checks it), annotated with the
//! geometry and arguments candle-nn 0.11.1 launches them with (`ops.rs`, the `cuda_fwd` of
//! `SoftmaxLastDim` and `RmsNorm`).
//!
//! candle compiles `reduce.cu` with nvcc (`--expt-relaxed-constexpr -std=c++17 -O3`); kopt
//! compiles it with NVRTC, whose defaults are C++17 and full optimisation. NVRTC 13.0 has
//! no relaxed-constexpr option, and the file compiles without one.
//!
//! Tolerances (kopt's rule: `|got - want| <= atol + rtol * max(|want|, RMS of the row)`).
//! candle's bf16 softmax works in bf16: `hexp` of `x - max` in bf16, the row's sum in f32,
//! its reciprocal rounded to bf16 before the final product. A rewrite that keeps that
//! arithmetic and only sums the row in another order gets the same reciprocal except where
//! it lies at a bf16 rounding boundary; there the reciprocal moves by one ulp and each
//! output by up to two of its own, 2^-6 (1.6%) of the value at most: `rtol = 2e-2`. The
//! absolute term goes from the dtype's 1e-2 to 1e-9, since a softmax element is about
//! 1/ncols (3e-5 at 32000 columns), where 1e-2 would pass an output of zeros. f32: the
//! same `expf`, the same reciprocal, a sum in another order (a relative change of a few
//! 1e-7 at these lengths): `rtol = 1e-4`, with the same small absolute term. rms_norm's
//! outputs are of order one and move by one bf16 ulp (2^-7) at most, or by float rounding
//! in f32, when the sum of squares is added in another order: the dtype defaults (bf16
//! `rtol = atol = 1e-2`, f32 `1e-4` and `1e-5`) apply.

use kopt::prelude::*;

/// candle's `softmax_bf16`: one block of one warp (`block = (1, 32, 1)`) per row.
#[kopt::kernel(
    reference = "kernels/candle/reduce.cu",
    entry = "softmax_bf16",
    src: [rows * ncols],
    dst: [rows * ncols] tol(rtol = 2e-2, atol = 1e-9),
    args = (src, dst, ncols),
    grid = rows,
    block = (1, 32, 1),
    shapes = [
        { rows: 16384, ncols: 1024 },
        { rows: 4096, ncols: 4096 },
        { rows: 64, ncols: 32000 },
    ],
    flops = 4 * rows * ncols,
    constraints = [ncols >= 1],
)]
pub fn softmax_bf16(
    stream: &CudaStream,
    src: &CudaView<bf16>,
    dst: &mut CudaSlice<bf16>,
    rows: u32,
    ncols: i32,
);

/// candle's `softmax_f32`, launched as the bf16 one.
#[kopt::kernel(
    reference = "kernels/candle/reduce.cu",
    entry = "softmax_f32",
    src: [rows * ncols],
    dst: [rows * ncols] tol(rtol = 1e-4, atol = 1e-9),
    args = (src, dst, ncols),
    grid = rows,
    block = (1, 32, 1),
    shapes = [
        { rows: 16384, ncols: 1024 },
        { rows: 4096, ncols: 4096 },
        { rows: 64, ncols: 32000 },
    ],
    flops = 4 * rows * ncols,
    constraints = [ncols >= 1],
)]
pub fn softmax_f32(
    stream: &CudaStream,
    src: &CudaView<f32>,
    dst: &mut CudaSlice<f32>,
    rows: u32,
    ncols: i32,
);

/// candle's `rmsnorm_bf16`: one block per row, of 32 threads below 1024 columns and of
/// 1024 from there, told its size through `block_size`.
#[kopt::kernel(
    reference = "kernels/candle/reduce.cu",
    entry = "rmsnorm_bf16",
    src: [rows * ncols],
    dst: [rows * ncols],
    alpha: [ncols] uniform(0.5..1.5),
    args = (src, dst, alpha, ncols, block_size: i32 = block_x, eps),
    grid = rows,
    block = if ncols < 1024 { 32 } else { 1024 },
    defaults = { eps: 1e-6 },
    shapes = [
        { rows: 4096, ncols: 4096 },
        { rows: 65536, ncols: 128 },
        { rows: 32, ncols: 4096 },
    ],
    flops = 4 * rows * ncols,
    constraints = [ncols >= 1],
)]
pub fn rmsnorm_bf16(
    stream: &CudaStream,
    src: &CudaView<bf16>,
    dst: &mut CudaSlice<bf16>,
    alpha: &CudaView<bf16>,
    rows: u32,
    ncols: i32,
    eps: f32,
);

/// candle's `rmsnorm_f32`, launched as the bf16 one.
#[kopt::kernel(
    reference = "kernels/candle/reduce.cu",
    entry = "rmsnorm_f32",
    src: [rows * ncols],
    dst: [rows * ncols],
    alpha: [ncols] uniform(0.5..1.5),
    args = (src, dst, alpha, ncols, block_size: i32 = block_x, eps),
    grid = rows,
    block = if ncols < 1024 { 32 } else { 1024 },
    defaults = { eps: 1e-6 },
    shapes = [
        { rows: 4096, ncols: 4096 },
        { rows: 65536, ncols: 128 },
        { rows: 32, ncols: 4096 },
    ],
    flops = 4 * rows * ncols,
    constraints = [ncols >= 1],
)]
pub fn rmsnorm_f32(
    stream: &CudaStream,
    src: &CudaView<f32>,
    dst: &mut CudaSlice<f32>,
    alpha: &CudaView<f32>,
    rows: u32,
    ncols: i32,
    eps: f32,
);

/// Every launcher's kernel, for the tests and the bench.
pub static KERNELS: [&kopt::Kernel; 4] = [&SOFTMAX_BF16, &SOFTMAX_F32, &RMSNORM_BF16, &RMSNORM_F32];
