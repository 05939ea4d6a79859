#![allow(unused_imports)]
use kopt::prelude::*;

#[kopt::kernel(reference = "kernels/k.cu", x: [n], y: [n], grid = n / 4, block = 4, shapes = [{ n: 4096 }, { n: 1001 }], constraints = [n % 4 == 0])]
pub fn k(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: u32);

fn main() {}
