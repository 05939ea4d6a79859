use kopt::prelude::*;

#[kopt::kernel(
    reference = "kernels/k.cu",
    x: [n],
    y: [n],
    grid = ceil_div(n, BLOCK),
    block = BLOCK,
    shapes = [{ n: 1024 }, { n: 1000000, weight: 3 }],
    tunables = { BLOCK: 256 in [128, 256, 512] },
    constraints = [BLOCK % 32 == 0],
)]
pub fn k(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: u32);

fn main() {
    assert_eq!(K.name(), "k");
    assert_eq!(K.spec().tunables[0].default, 256);
    let _launcher: fn(&CudaStream, &CudaSlice<f32>, &mut CudaSlice<f32>, u32) -> Result<(), kopt::Error> = k;
}
