//! The kernels of an LLM decode step, launched through `#[kopt::kernel]`: written as a
//! competent author who has not optimised them yet would write them.
//!
//! Each launcher checks its buffers against the declared lengths, runs the accepted
//! variant for the GPU's architecture (see `kopt/`), else the reference kernel.

pub mod check;
pub mod cpu;
pub mod decode;

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

/// Row softmax of bf16 as a Rust inference framework writes its CUDA
/// (`kernels/candle_softmax.cu`): helper headers that include CUDA's by quotes, cooperative
/// groups and libcu++, the f32/f16/bf16 entries stamped out by a macro, the row count
/// known to the launch only (one block a row), and a `block_size` argument the launcher
/// computes from the block of the version that runs.
#[kopt::kernel(
    reference = "kernels/candle_softmax.cu",
    entry = "softmax_bf16",
    src: [rows * ncols],
    dst: [rows * ncols],
    args = (src, dst, ncols, block_size: i32 = block_x),
    grid = rows,
    block = 32,
    shapes = [
        { rows: 4096, ncols: 4096 },
        { rows: 16384, ncols: 1024 },
        { rows: 64, ncols: 32000 },
    ],
    flops = 5 * rows * ncols,
    constraints = [ncols >= 1],
)]
pub fn candle_softmax(
    stream: &CudaStream,
    src: &CudaSlice<bf16>,
    dst: &mut CudaSlice<bf16>,
    rows: u32,
    ncols: i32,
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

/// One decode step of grouped-query attention over a paged KV cache, as vLLM, mistral.rs
/// and candle's paged attention lay it out (fp16, head dim 128): `k_cache` and `v_cache` are
/// `[num_pages, kv_heads, page_size, 128]`, each (page, KV head) a contiguous tile;
/// position `p` of sequence `b` is row `p % page_size` of page `block_table[b * max_pages +
/// p / page_size]`. The inputs are drawn as an engine holds them: the block table a
/// shuffled permutation of the pool's pages (`num_pages = batch * max_pages`: no page
/// shared), the lengths spread evenly from `min_len` to `max_len` in a shuffled order (1k to
/// 32k keys: a decode batch mixes short and long requests). `batch`, `num_pages`, `min_len`
/// and `max_len` only size the buffers and the grid; the kernel takes the rest. The reference
/// gives one block of 128 threads to each (sequence, KV head), its 4 query heads sharing each
/// K and V row, with an online softmax in fp32 over steps of 64 keys.
#[kopt::kernel(
    reference = "kernels/paged_decode.cu",
    entry = "paged_decode_f16",
    q: [batch * q_heads * 128],
    k_cache: [num_pages * kv_heads * page_size * 128],
    v_cache: [num_pages * kv_heads * page_size * 128],
    block_table: [batch * max_pages] spread(0..num_pages),
    seq_lens: [batch] spread(min_len..max_len + 1),
    out: [batch * q_heads * 128],
    args = (q, k_cache, v_cache, block_table, seq_lens, out, q_heads, kv_heads, page_size, max_pages),
    grid = batch * kv_heads,
    block = 128,
    // The pools: 1.1, 1.1 and 4.3 GB each of K and V (batch * 32768 keys * 8 heads * 256 B),
    // about half of it read (the lengths average 16.9k keys).
    shapes = [
        { batch: 8, q_heads: 32, kv_heads: 8, page_size: 16, max_pages: 2048, num_pages: 16384, min_len: 1024, max_len: 32768 },
        { batch: 8, q_heads: 32, kv_heads: 8, page_size: 64, max_pages: 512, num_pages: 4096, min_len: 1024, max_len: 32768 },
        { batch: 32, q_heads: 32, kv_heads: 8, page_size: 16, max_pages: 2048, num_pages: 65536, min_len: 1024, max_len: 32768 },
    ],
    // The ideal bytes: q and out, the block table and the lengths, and the K and V rows of the
    // sequences, read once. The lengths sum to batch * min_len + sum(floor(i * (max_len -
    // min_len + 1) / batch)) over i < batch, which is batch * min_len + (max_len - min_len) *
    // (batch - 1) / 2 up to (gcd(max_len - min_len + 1, batch) - 1) / 2 keys: exact to within
    // batch / 2 rows. (Not batch * (min_len + max_len) / 2: the spread's largest length is
    // about (max_len - min_len) / batch below max_len, and that figure would be half a long
    // sequence too many, 13% at batch 8.)
    bytes = 2 * batch * q_heads * 128 * 2 + batch * max_pages * 4 + batch * 4
        + (batch * min_len + (max_len - min_len) * (batch - 1) / 2) * kv_heads * 128 * 2 * 2,
    flops = 4 * q_heads * 128 * (batch * min_len + (max_len - min_len) * (batch - 1) / 2),
    // A group of at most 8 query heads (the mma rows of the candidate); whole tiles of 16
    // keys per page (the candidate's tile never straddles a page); every length fits the
    // table's pages; the candidate's grid.y is batch * kv_heads.
    constraints = [
        q_heads % kv_heads == 0,
        q_heads / kv_heads <= 8,
        page_size % 16 == 0,
        min_len >= 1,
        min_len <= max_len,
        max_len <= max_pages * page_size,
        batch * kv_heads <= 65535,
    ],
)]
pub fn paged_decode(
    stream: &CudaStream,
    q: &CudaSlice<f16>,
    k_cache: &CudaSlice<f16>,
    v_cache: &CudaSlice<f16>,
    block_table: &CudaSlice<i32>,
    seq_lens: &CudaSlice<i32>,
    out: &mut CudaSlice<f16>,
    batch: u32,
    q_heads: u32,
    kv_heads: u32,
    page_size: u32,
    max_pages: u32,
    num_pages: u32,
    min_len: u32,
    max_len: u32,
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

/// Layer norm over rows of fp16, with fp16 weight and bias; fp32 accumulation. The two
/// prefill-sized shapes are memory-bound; the decode shape (64 rows) is launch-bound.
#[kopt::kernel(
    reference = "kernels/layer_norm.cu",
    entry = "layer_norm_f16",
    x: [rows * cols],
    weight: [cols] uniform(0.5..1.5),
    bias: [cols],
    y: [rows * cols],
    grid = rows,
    block = 256,
    defaults = { eps: 1e-5 },
    shapes = [
        { rows: 8192, cols: 4096 },
        { rows: 4096, cols: 8192 },
        { rows: 64, cols: 4096 },
    ],
    flops = 8 * rows * cols,
)]
pub fn layer_norm(
    stream: &CudaStream,
    x: &CudaSlice<f16>,
    weight: &CudaSlice<f16>,
    bias: &CudaSlice<f16>,
    y: &mut CudaSlice<f16>,
    rows: u32,
    cols: u32,
    eps: f32,
);

/// Transpose of a `rows x cols` fp32 matrix: `y[c][r] = x[r][c]`, the tiled shared-memory
/// transpose (32x32 tiles, padded), any shape.
#[kopt::kernel(
    reference = "kernels/transpose.cu",
    entry = "transpose_f32",
    x: [rows * cols],
    y: [rows * cols],
    grid = (ceil_div(cols, 32), ceil_div(rows, 32)),
    block = (32, 8),
    shapes = [
        { rows: 8192, cols: 8192 },
        { rows: 4096, cols: 16384 },
        { rows: 16384, cols: 1024 },
    ],
    constraints = [ceil_div(rows, 32) <= 65535],
)]
pub fn transpose(
    stream: &CudaStream,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    rows: u32,
    cols: u32,
);

/// The fused SwiGLU activation, fp16: `out[t, j] = silu(x[t, j]) * x[t, d + j]` for `x` of
/// shape `[tokens, 2d]`; one thread per output element.
#[kopt::kernel(
    reference = "kernels/silu_mul.cu",
    entry = "silu_mul_f16",
    x: [tokens * 2 * d],
    out: [tokens * d],
    grid = ceil_div(tokens * d, 256),
    block = 256,
    shapes = [
        { tokens: 4096, d: 11008 },
        { tokens: 64, d: 14336 },
        { tokens: 16384, d: 4096 },
    ],
    flops = 5 * tokens * d,
)]
pub fn silu_mul(
    stream: &CudaStream,
    x: &CudaSlice<f16>,
    out: &mut CudaSlice<f16>,
    tokens: u32,
    d: u32,
);

/// `C = A * B`, fp16 in and out, fp32 accumulation, all row-major (`B` is `[K, N]`, as
/// `torch.matmul(a, b)` takes it): the tiled shared-memory SIMT kernel, any shape. The
/// shapes are a linear layer of a 4096-wide model over 512, 2048 and 4096 tokens. The
/// tolerance: 1 fp16 ulp of the output is 2^-10 relative at worst, accumulation-order
/// differences in fp32 over K = 4096 stay far under that; `atol` covers outputs that
/// cancel to near zero.
#[kopt::kernel(
    reference = "kernels/gemm.cu",
    entry = "gemm_f16",
    a: [m * k],
    b: [k * n],
    c: [m * n] tol(rtol = 2e-3, atol = 1e-2),
    // TMA tensor maps a variant may take instead of the pointers (the reference takes the
    // pointers): tiles of 64 halves (128 bytes, one 128-byte swizzle row) by 128 rows of A,
    // 64 by 64 of B and of C.
    tensor_maps = {
        a_map: tensor_map(a, dims = [k, m], box = [64, 128], swizzle = 128, l2_promotion = 256),
        b_map: tensor_map(b, dims = [n, k], box = [64, 64], swizzle = 128, l2_promotion = 256),
        c_map: tensor_map(c, dims = [n, m], box = [64, 64], swizzle = 128),
    },
    grid = (ceil_div(n, 32), ceil_div(m, 32)),
    block = (32, 8),
    shapes = [
        { m: 512, n: 4096, k: 4096 },
        { m: 2048, n: 4096, k: 4096 },
        { m: 4096, n: 4096, k: 4096 },
    ],
    flops = 2 * m * n * k,
    constraints = [ceil_div(m, 32) <= 65535],
)]
pub fn gemm(
    stream: &CudaStream,
    a: &CudaSlice<f16>,
    b: &CudaSlice<f16>,
    c: &mut CudaSlice<f16>,
    m: u32,
    n: u32,
    k: u32,
);

/// Every kernel of the crate, for tools and the example binary.
pub static KERNELS: [&kopt::Kernel; 10] = [
    &SOFTMAX,
    &RMSNORM,
    &REDUCE_SUM,
    &GQA_DECODE,
    &PAGED_DECODE,
    &ROW_SUM,
    &LAYER_NORM,
    &TRANSPOSE,
    &SILU_MUL,
    &GEMM,
];
