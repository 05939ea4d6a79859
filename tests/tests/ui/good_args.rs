// The kernel's arguments are not the launcher's parameters: `rows` only sizes the grid,
// `block_size` is computed for every launch, and `info` has fixed contents.
use kopt::prelude::*;

#[kopt::kernel(
    reference = "kernels/softmax.cu",
    entry = "softmax_f32",
    x: [rows * ncols],
    y: [rows * ncols],
    args = (x, y, ncols, block_size: i32 = block_x),
    grid = rows,
    block = BLOCK,
    shapes = [{ rows: 8192, ncols: 4096 }, { rows: 3, ncols: 50257 }],
    tunables = { BLOCK: 256 in [128, 256, 512, 1024] },
)]
pub fn softmax(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, ncols: u32);

#[kopt::kernel(
    reference = "kernels/sum_rows.cu",
    entry = "sum_rows_f32",
    info: [4] values(rows, cols, cols, 1),
    x: [rows * cols],
    y: [rows],
    args = (src_numel: u64 = rows * cols, el_to_sum_per_block: u64 = cols, num_dims: u64 = 2, info, x, y),
    grid = rows,
    block = min(BLOCK, next_pow2(cols)),
    tunables = { BLOCK: 256 in [128, 256, 512, 1024] },
    shapes = [{ rows: 4096, cols: 4096 }],
)]
pub fn sum_rows(stream: &CudaStream, info: &CudaSlice<u64>, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);

fn main() {
    let names = |s: &kopt::KernelSpec| -> Vec<String> {
        s.kernel_args().iter().map(|a| a.name().to_string()).collect()
    };
    assert_eq!(names(SOFTMAX.spec()), ["x", "y", "ncols", "block_size"]);
    assert_eq!(SOFTMAX.spec().launch_only().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["rows"]);
    assert_eq!(names(SUM_ROWS.spec()), ["src_numel", "el_to_sum_per_block", "num_dims", "info", "x", "y"]);
    // The launchers keep the annotated signatures.
    let _softmax: fn(&CudaStream, &CudaSlice<f32>, &mut CudaSlice<f32>, u32, u32) -> Result<(), kopt::Error> = softmax;
    let _sum_rows: fn(&CudaStream, &CudaSlice<u64>, &CudaSlice<f32>, &mut CudaSlice<f32>, u32, u32) -> Result<(), kopt::Error> = sum_rows;
}
