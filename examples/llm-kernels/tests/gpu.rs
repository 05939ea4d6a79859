//! On a GPU: every generated launcher against the CPU reference, with the shipped
//! softmax variant selected on sm_90.

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
        assert_eq!(softmax[0].ran, "online-vec4 (sm_90)", "{softmax:?}");
        let odd = softmax.iter().find(|c| c.shape == "8x50257").unwrap();
        assert_eq!(odd.ran, "reference (sm_90)", "outside the variant's region");
    }
    assert!(check::short_buffer_is_refused(&stream).unwrap());
}
