//! The kernel a port starts from: correct, serial, slow. kopt measures it at the user's
//! real shape (a launch of hundreds of milliseconds is timed per launch, not called a
//! hang) so that the loop can start from it.

use kopt::prelude::*;

/// Row softmax over a `rows x cols` fp32 matrix, one thread per row.
#[kopt::kernel(
    reference = "kernels/naive_softmax.cu",
    x: [rows * cols],
    y: [rows * cols],
    grid = (rows + 255) / 256,
    block = 256,
    shapes = [{ rows: 8192, cols: 50257 }],
    flops = 5 * rows * cols,
    constraints = [rows >= 1, cols >= 1],
)]
pub fn naive_softmax(
    stream: &CudaStream,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    rows: i32,
    cols: i32,
);
