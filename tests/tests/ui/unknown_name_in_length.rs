#![allow(unused_imports)]
use kopt::prelude::*;

#[kopt::kernel(reference = "kernels/k.cu", x: [rowz * cols], y: [rows * cols], grid = rows, block = 1, shapes = [{ rows: 4, cols: 4 }])]
pub fn k(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);

fn main() {}
