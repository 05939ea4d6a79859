#![allow(unused_imports)]
use kopt::prelude::*;

#[kopt::kernel(reference = "kernels/k.cu", x: [n], y: [n], grid = n, block = 1, shapes = [{ n: 4 }], constraints = [n * 2])]
pub fn k(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: u32);

fn main() {}
