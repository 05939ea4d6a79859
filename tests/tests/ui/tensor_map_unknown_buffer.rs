#![allow(unused_imports)]
use kopt::prelude::*;

#[kopt::kernel(reference = "kernels/k.cu", x: [n], y: [n], tensor_maps = { x_map: tensor_map(z, dims = [n], box = [32]) }, grid = n, block = 256, shapes = [{ n: 1024 }])]
pub fn k(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: u32);

fn main() {}
