#![allow(unused_imports)]
use kopt::prelude::*;

#[kopt::kernel(reference = "kernels/k.cu", x: [n], y: [n], grid = n * eps, block = 1, shapes = [{ n: 4, eps: 1e-5 }])]
pub fn k(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: u32, eps: f32);

fn main() {}
