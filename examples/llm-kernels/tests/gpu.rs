//! On a GPU: every generated launcher against the CPU reference, with the accepted
//! variants selected on sm_90, each loaded from its verified PTX.

use kopt::cudarc::driver::CudaContext;
use kopt::{CodeOrigin, IGNORE_PTX};
use llm_kernels::{check, KERNELS};

/// On the first declared shape each variant covers, how the launcher loaded the variant
/// that runs: `(kernel, variant, origin)`.
fn origins(
    stream: &std::sync::Arc<kopt::cudarc::driver::CudaStream>,
) -> Vec<(String, String, CodeOrigin)> {
    let mut out = Vec::new();
    for k in KERNELS {
        for shape in &k.spec().shapes {
            let s = k.explain(stream, &k.spec().shape_args(shape)).unwrap();
            if let Some(code) = s.code {
                if !out.iter().any(|(n, v, _)| n == k.name() && v == s.variant) {
                    out.push((k.name().to_string(), s.variant.to_string(), code));
                }
            }
        }
    }
    out
}

/// Every variant with verified PTX embedded runs from it, without NVRTC; under
/// `KOPT_IGNORE_PTX` (a child process of this test) each is compiled from its source and
/// says why.
#[test]
#[ignore = "needs a CUDA GPU"]
fn variants_run_from_their_verified_ptx() {
    if !kopt::gpu::available_for_test() {
        return;
    }
    let ctx = CudaContext::new(0).unwrap();
    if ctx.compute_capability().unwrap() != (9, 0) || kopt::disabled() {
        return;
    }
    let stream = ctx.default_stream();
    let with_ptx: Vec<(&str, &str)> = KERNELS
        .iter()
        .flat_map(|k| {
            k.def()
                .variants
                .iter()
                .filter(|v| v.ptx.is_some() && v.arch == Some("sm_90"))
                .map(|v| (k.name(), v.id))
        })
        .collect();
    assert!(
        !with_ptx.is_empty(),
        "no accepted variant of the example has verified PTX"
    );
    let ignored = std::env::var_os(IGNORE_PTX).is_some();
    let loaded = origins(&stream);
    for (kernel, variant) in &with_ptx {
        let Some((_, _, code)) = loaded.iter().find(|(k, v, _)| k == kernel && v == variant) else {
            continue; // Not chosen on any declared shape here (another device's entry).
        };
        match (ignored, code) {
            (false, CodeOrigin::VerifiedPtx { .. }) => {}
            (true, CodeOrigin::Compiled { why }) => assert!(why.contains(IGNORE_PTX), "{why}"),
            other => panic!("{kernel}/{variant}: {other:?}"),
        }
    }
    if !ignored {
        // The same checks with every variant compiled from its source instead.
        let me = std::env::current_exe().unwrap();
        let o = std::process::Command::new(me)
            .args([
                "--ignored",
                "--exact",
                "variants_run_from_their_verified_ptx",
            ])
            .env(IGNORE_PTX, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && text.contains("1 passed"),
            "{text}{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

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
        // So does every other kernel's where its region, build and tensor maps hold. A
        // variant that failed to compile here (the GEMM's targets compute_90a) would fall
        // back to the reference and still pass the numerics: check that the variants ran.
        // The GEMM's variant takes TMA maps, whose row pitch must be a multiple of 16
        // bytes: on 33x17x19 they do not encode and the reference runs, saying why.
        let maps_refused = |c: &check::Check| {
            c.kernel == "gemm"
                && c.shape == "33x17x19"
                && c.ran.contains("cannot take its tensor map")
        };
        let fell_back: Vec<&check::Check> = checks
            .iter()
            .filter(|c| c.ran.starts_with("reference") && !c.ran.contains("claims only"))
            .filter(|c| !maps_refused(c))
            .collect();
        assert!(fell_back.is_empty(), "{fell_back:?}");
        let odd_gemm = checks.iter().find(|c| c.shape == "33x17x19").unwrap();
        assert!(
            odd_gemm.ran.starts_with("reference") && maps_refused(odd_gemm),
            "{odd_gemm:?}"
        );
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
