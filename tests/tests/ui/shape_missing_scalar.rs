#![allow(unused_imports)]
use kopt::prelude::*;

#[kopt::kernel(reference = "kernels/k.cu", x: [rows * cols], y: [rows * cols], grid = rows, block = 1, shapes = [{ rows: 4 }])]
pub fn k(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);

fn main() {}
