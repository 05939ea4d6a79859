use kopt::prelude::*;

// A cluster set at launch for the large shape only; the grid is a whole number of them.
#[kopt::kernel(
    reference = "kernels/k.cu",
    x: [n],
    y: [n],
    grid = round_up(ceil_div(n, 256), 4),
    block = 256,
    cluster = (if n >= 4096 { 4 } else { 1 }, 1, 1),
    shapes = [{ n: 1000 }, { n: 1048576 }],
)]
pub fn k(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: u32);

fn main() {
    let cluster = K.spec().launch.cluster.as_ref().expect("the cluster rule");
    assert_eq!(cluster[1].to_string(), "1");
}
