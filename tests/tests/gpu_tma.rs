//! TMA tensor maps, end to end on a GPU (sm_90 or later): a kernel that reads its input
//! through `cp.async.bulk.tensor` launches through the launcher `#[kopt::kernel]`
//! generates, which encodes the map; and a variant that takes the map where the reference
//! takes the pointer verifies against it through the engine's worker, which encodes the
//! same map, while the same variant with its copy's coordinates swapped fails.
//!
//! ```text
//! KOPT_REQUIRE_GPU=1 cargo test -p kopt-tests --test gpu_tma -- --ignored
//! ```

use std::sync::Arc;

use kopt::cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaView};
use kopt_engine::job::{EvalJob, KernelVersion, Seeds};
use kopt_engine::verdict::Judge;
use kopt_engine::worker::cuda::CudaBackend;
use kopt_engine::worker::Backend;
use kopt_spec::shapes::{held_out_shapes, ShapeCase};

/// The pointer reference; the map is declared for variants.
#[kopt::kernel(
    reference = "fixtures/tma/scale.cu",
    entry = "scale_f32",
    x: [rows * cols],
    y: [rows * cols],
    tensor_maps = { x_map: tensor_map(x, dims = [cols, rows], box = [32, 8]) },
    grid = (ceil_div(cols, 32), ceil_div(rows, 8)),
    block = (32, 8),
    shapes = [{ rows: 1000, cols: 4096 }, { rows: 64, cols: 1000 }],
)]
pub fn scale(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);

/// The same operation with the TMA kernel as the reference: the launcher encodes the map.
#[kopt::kernel(
    reference = "fixtures/tma/scale_tma.cu",
    entry = "scale_tma_f32",
    x: [rows * cols],
    y: [rows * cols],
    tensor_maps = { x_map: tensor_map(x, dims = [cols, rows], box = [32, 8]) },
    args = (x_map, y, rows, cols),
    grid = (ceil_div(cols, 32), ceil_div(rows, 8)),
    block = (32, 8),
    shapes = [{ rows: 1000, cols: 4096 }],
)]
pub fn scale_tma(
    stream: &CudaStream,
    x: &CudaView<f32>,
    y: &mut CudaSlice<f32>,
    rows: u32,
    cols: u32,
);

fn gpu() -> Option<(Arc<CudaContext>, Arc<CudaStream>)> {
    if !kopt::gpu::available_for_test() {
        return None;
    }
    let ctx = CudaContext::new(0).unwrap();
    let (major, _) = ctx.compute_capability().unwrap();
    assert!(
        major >= 9,
        "TMA needs sm_90 or later; this GPU is sm_{major}x"
    );
    let stream = ctx.default_stream();
    Some((ctx, stream))
}

fn values(n: usize, salt: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u32).wrapping_mul(2654435761) ^ salt) as f32 / u32::MAX as f32 - 0.5)
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_tma_kernel_launches_through_the_generated_launcher() {
    let Some((_ctx, stream)) = gpu() else { return };
    // Shapes that are not whole tiles, and two buffers of one shape: the second launch
    // over the first buffer finds its map in the kernel's cache.
    for (rows, cols) in [(1000u32, 4096u32), (37, 1000), (8, 32)] {
        let n = (rows * cols) as usize;
        let xs = [values(n, 1), values(n, 2)];
        let xd: Vec<CudaSlice<f32>> = xs.iter().map(|x| stream.clone_htod(x).unwrap()).collect();
        for round in 0..2 {
            for (x, xd) in xs.iter().zip(&xd) {
                let mut yd = stream.alloc_zeros::<f32>(n).unwrap();
                scale_tma(&stream, &xd.as_view(), &mut yd, rows, cols).unwrap();
                let y = stream.clone_dtoh(&yd).unwrap();
                let wrong = y.iter().zip(x).position(|(y, x)| *y != 2.0 * x);
                assert_eq!(
                    wrong, None,
                    "{rows}x{cols}, round {round}: element {wrong:?}"
                );
            }
        }
    }
    // A buffer TMA cannot address: a view that starts 4 bytes into its allocation.
    let x = stream.clone_htod(&values(8 * 33, 3)).unwrap();
    let mut y = stream.alloc_zeros::<f32>(8 * 32).unwrap();
    let err = scale_tma(&stream, &x.slice(1..), &mut y, 8, 32).unwrap_err();
    assert!(
        err.to_string().contains("not 16-byte aligned")
            && err.to_string().contains("nothing was launched"),
        "{err}"
    );
    // A shape whose row pitch is no multiple of 16 bytes: refused before launch.
    let err = scale_tma(&stream, &x.as_view(), &mut y, 8, 31).unwrap_err();
    assert!(err.to_string().contains("multiples of 16 bytes"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_variant_that_takes_the_map_verifies_against_the_pointer_reference() {
    let Some(_gpu) = gpu() else { return };
    let spec = SCALE.spec().clone();
    let root = kopt_tests::repo_root().join("tests/fixtures/tma");
    let reference = std::fs::read_to_string(root.join("scale.cu")).unwrap();
    let tma = std::fs::read_to_string(root.join("scale_tma.cu")).unwrap();
    let variant = |id: &str, swap: i64| {
        let mut v = KernelVersion::reference(&spec, &tma);
        v.id = id.into();
        v.entry = "scale_tma_f32".into();
        v.args = Some(["x_map", "y", "rows", "cols"].map(String::from).to_vec());
        v.defines.insert("SWAP_COORDS".into(), swap);
        v
    };
    // The declared shapes and held-out ones (drawn where the map encodes).
    let mut shapes: Vec<ShapeCase> = spec.shapes.iter().map(ShapeCase::declared).collect();
    shapes.extend(held_out_shapes(&spec, None, 7, 2, 1 << 28));
    assert!(shapes.len() > 2);
    let mut gpu = CudaBackend::new(0).expect("GPU 0");
    let mut judge = |v: &KernelVersion| {
        let job = EvalJob {
            spec: spec.clone(),
            reference: KernelVersion::reference(&spec, &reference),
            candidate: v.clone(),
            shapes: shapes.clone(),
            seeds: Seeds::from_base(11),
            timing: None,
        };
        Judge::new(None).judge(&Ok(gpu.evaluate(&job, &mut |_, _| {})))
    };
    let right = judge(&variant("tma", 0));
    assert!(right.accepted, "{}\n{}", right.summary(), right.compile_log);
    let swapped = judge(&variant("tma-swapped", 1));
    assert!(
        !swapped.accepted,
        "coordinates swapped must fail: {}",
        swapped.summary()
    );
}
