#![allow(unused_imports)]
use kopt::prelude::*;

// The reference takes the map, so every declared shape must encode it: 1001 floats a row
// is a row pitch of 4004 bytes, no multiple of 16.
#[kopt::kernel(reference = "kernels/k.cu", x: [rows * n], y: [rows * n], tensor_maps = { x_map: tensor_map(x, dims = [n, rows], box = [32, 8]) }, args = (x_map, y, n), grid = rows, block = 256, shapes = [{ rows: 4, n: 1024 }, { rows: 4, n: 1001 }])]
pub fn k(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, n: u32);

fn main() {}
