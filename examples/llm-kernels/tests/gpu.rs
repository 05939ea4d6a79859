//! On a GPU: every generated launcher against the CPU reference, with the accepted
//! variants selected on sm_90.

use kopt::cudarc::driver::CudaContext;
use llm_kernels::check;

#[test]
#[ignore = "needs a CUDA GPU"]
fn launchers_agree_with_the_cpu_reference() {
    if !kopt::gpu::available_for_test() {
        return;
    }
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    let checks = check::check_all(&stream).unwrap();
    for c in &checks {
        assert_eq!(c.failing, 0, "{c:?}");
    }
    let on_hopper = ctx.compute_capability().unwrap() == (9, 0);
    let softmax: Vec<&check::Check> = checks.iter().filter(|c| c.kernel == "softmax").collect();
    if on_hopper && !kopt::disabled() {
        // The accepted softmax variant for sm_90 claims every shape, 8x50257 included.
        assert!(
            softmax.iter().all(|c| !c.ran.starts_with("reference")),
            "{softmax:?}"
        );
        // So does every other kernel's where its region and build hold. A variant that
        // failed to compile here (the GEMM's targets compute_90a) would fall back to the
        // reference and still pass the numerics: check that the variants ran.
        let fell_back: Vec<&check::Check> = checks
            .iter()
            .filter(|c| c.ran.starts_with("reference") && !c.ran.contains("claims only"))
            .collect();
        assert!(fell_back.is_empty(), "{fell_back:?}");
        // row_sum's variant is built with VEC = 2: its 8-byte loads must not run on rows of
        // 1001 floats (`cols % VEC == 0`), where the reference does.
        let odd = checks
            .iter()
            .find(|c| c.kernel == "row_sum" && c.shape == "7x1001")
            .unwrap();
        assert!(
            odd.ran.starts_with("reference") && odd.ran.contains("cols % VEC == 0"),
            "{odd:?}"
        );
    }
    assert!(check::short_buffer_is_refused(&stream).unwrap());
}
