//! Annotation mistakes are compile errors spanned at the offending token, with a hint.
//! `TRYBUILD=overwrite cargo test -p kopt-tests --test ui` refreshes the expected output.

use std::path::PathBuf;

/// trybuild compiles the cases inside its own project folder, which is therefore the
/// crate root the macro resolves `reference = "kernels/k.cu"` against.
fn trybuild_project_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("tests").join("trybuild").join("kopt-tests")
}

#[test]
fn annotation_errors() {
    let kernels = trybuild_project_dir().join("kernels");
    std::fs::create_dir_all(&kernels).unwrap();
    std::fs::write(
        kernels.join("k.cu"),
        "extern \"C\" __global__ void k(const float* x, float* y, unsigned int n) {\n    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) y[i] = 2.0f * x[i];\n}\n",
    )
    .unwrap();
    // Kernels whose arguments are not the launcher's parameters (`good_args.rs`).
    for k in ["softmax.cu", "sum_rows.cu"] {
        std::fs::copy(
            kopt_tests::repo_root()
                .join("tests/fixtures/candle-style/kernels")
                .join(k),
            kernels.join(k),
        )
        .unwrap();
    }
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/good.rs");
    t.pass("tests/ui/good_cluster.rs");
    t.pass("tests/ui/good_use.rs");
    t.pass("tests/ui/good_args.rs");
    t.compile_fail("tests/ui/[a-fh-z]*.rs");
}
