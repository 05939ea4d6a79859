//! The kernels of an LLM decode step, launched through `#[kopt::kernel]`: written as a
//! competent author who has not optimised them yet would write them.
//!
//! Each launcher checks its buffers against the declared lengths, runs the accepted
//! variant for the GPU's architecture (see `kopt/`), else the reference kernel.

pub mod check;
pub mod cpu;

use kopt::prelude::*;

/// Row softmax over a `rows x cols` fp32 matrix.
#[kopt::kernel(
    reference = "kernels/softmax.cu",
    entry = "softmax_f32",
    x: [rows * cols],
    y: [rows * cols],
    grid = rows,
    block = 256,
    shapes = [
        { rows: 4096, cols: 4096 },
        { rows: 16, cols: 65536 },
        { rows: 32768, cols: 1024 },
        { rows: 8, cols: 50257 },
    ],
    flops = 5 * rows * cols,
    constraints = [cols >= 1],
)]
pub fn softmax(
    stream: &CudaStream,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    rows: u32,
    cols: u32,
);

/// RMS norm over rows of fp16, with an fp16 weight; fp32 accumulation.
#[kopt::kernel(
    reference = "kernels/rmsnorm.cu",
    entry = "rmsnorm_f16",
    x: [rows * cols],
    weight: [cols],
    y: [rows * cols],
    grid = rows,
    block = 256,
    defaults = { eps: 1e-5 },
    shapes = [{ rows: 8192, cols: 4096 }, { rows: 64, cols: 8192 }, { rows: 1, cols: 4096 }],
    flops = 4 * rows * cols,
)]
pub fn rmsnorm(
    stream: &CudaStream,
    x: &CudaSlice<f16>,
    weight: &CudaSlice<f16>,
    y: &mut CudaSlice<f16>,
    rows: u32,
    cols: u32,
    eps: f32,
);

/// `out[0] += sum(x)`: a block reduction and one atomic per block.
#[kopt::kernel(
    reference = "kernels/reduce_sum.cu",
    entry = "reduce_sum_f32",
    x: [n] normal(1.0, 1.0),
    out: [1] inout tol(rtol = 1e-4, atol = 1e-2),
    grid = min(ceil_div(n, 256), 1024),
    block = 256,
    shapes = [{ n: 16777216 }, { n: 1048576 }, { n: 1000 }],
    bytes = 4 * n,
    flops = n,
)]
pub fn reduce_sum(stream: &CudaStream, x: &CudaSlice<f32>, out: &mut CudaSlice<f32>, n: u64);

/// One decode step of grouped-query attention (fp16, contiguous KV cache, head dim 128),
/// over sequence lengths from 1k to 32k.
#[kopt::kernel(
    reference = "kernels/gqa_decode.cu",
    entry = "gqa_decode_f16",
    q: [batch * q_heads * 128],
    k: [batch * kv_heads * seq_len * 128],
    v: [batch * kv_heads * seq_len * 128],
    out: [batch * q_heads * 128],
    grid = batch * q_heads,
    block = 128,
    smem = seq_len * 4,
    shapes = [
        { batch: 8, q_heads: 32, kv_heads: 8, seq_len: 1024 },
        { batch: 8, q_heads: 32, kv_heads: 8, seq_len: 4096 },
        { batch: 1, q_heads: 32, kv_heads: 8, seq_len: 16384 },
        { batch: 1, q_heads: 32, kv_heads: 8, seq_len: 32768 },
    ],
    flops = 4 * batch * q_heads * seq_len * 128,
    // The reference keeps seq_len fp32 scores in shared memory: 192 KiB at 49152, under
    // sm_90's 227 KiB opt-in limit per block (which kopt sets when it loads a kernel).
    constraints = [q_heads % kv_heads == 0, seq_len <= 49152],
)]
pub fn gqa_decode(
    stream: &CudaStream,
    q: &CudaSlice<f16>,
    k: &CudaSlice<f16>,
    v: &CudaSlice<f16>,
    out: &mut CudaSlice<f16>,
    batch: u32,
    q_heads: u32,
    kv_heads: u32,
    seq_len: u32,
);

/// Row sums of a `rows x cols` fp32 matrix: the normaliser of a sampling step over a
/// batch of vocabulary-sized rows, and a norm-like reduction over hidden dimensions.
/// Written with the launch configuration as tunables (216 valid combinations), the
/// defaults a cautious author picks.
#[kopt::kernel(
    reference = "kernels/row_sum.cu",
    entry = "row_sum_f32",
    x: [rows * cols],
    y: [rows] tol(rtol = 1e-4, atol = 1e-3),
    grid = ceil_div(rows, ROWS_PER_BLOCK),
    block = BLOCK,
    shapes = [{ rows: 64, cols: 16384 }, { rows: 512, cols: 2048 }],
    flops = rows * cols,
    tunables = {
        BLOCK: 256 in [32, 64, 128, 256, 512, 1024],
        VEC: 1 in [1, 2, 4, 8],
        ROWS_PER_BLOCK: 1 in [1, 2, 4, 8],
        UNROLL: 1 in [1, 2, 4],
    },
    constraints = [BLOCK % (32 * ROWS_PER_BLOCK) == 0, cols % VEC == 0],
)]
pub fn row_sum(
    stream: &CudaStream,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    rows: u32,
    cols: u32,
);

/// Every kernel of the crate, for tools and the example binary.
pub static KERNELS: [&kopt::Kernel; 5] = [&SOFTMAX, &RMSNORM, &REDUCE_SUM, &GQA_DECODE, &ROW_SUM];
