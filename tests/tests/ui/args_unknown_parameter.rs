#![allow(unused_imports)]
use kopt::prelude::*;

#[kopt::kernel(reference = "kernels/k.cu", x: [rows * n], y: [rows * n], args = (x, y, nn), grid = rows, block = 256, shapes = [{ rows: 4, n: 1024 }])]
pub fn k(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, n: u32);

fn main() {}
