// The attribute under the names a `use` gives it: `cargo kopt` finds these too.
use kopt::kernel;
use kopt::prelude::*;

#[kernel(
    reference = "kernels/k.cu",
    x: [n],
    y: [n],
    grid = ceil_div(n, 256),
    block = 256,
    shapes = [{ n: 1024 }],
)]
pub fn k(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: u32);

mod renamed {
    use kopt::kernel as gpu_kernel;
    use kopt::prelude::*;

    #[gpu_kernel(
        reference = "kernels/k.cu",
        entry = "k",
        x: [n],
        y: [n],
        grid = ceil_div(n, 128),
        block = 128,
        shapes = [{ n: 1024 }],
    )]
    pub fn k2(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: u32);
}

fn main() {
    assert_eq!(K.name(), "k");
    let _launcher: fn(&CudaStream, &CudaSlice<f32>, &mut CudaSlice<f32>, u32) -> Result<(), kopt::Error> = renamed::k2;
}
