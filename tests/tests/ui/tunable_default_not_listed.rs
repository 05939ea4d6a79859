#![allow(unused_imports)]
use kopt::prelude::*;

#[kopt::kernel(reference = "kernels/k.cu", x: [n], y: [n], grid = n, block = B, shapes = [{ n: 4 }], tunables = { B: 64 in [128, 256] })]
pub fn k(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: u32);

fn main() {}
