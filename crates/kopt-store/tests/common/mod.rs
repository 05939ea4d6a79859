//! A scratch crate with the example's softmax (its reference, include and annotation)
//! and its shipped variant, for tests of the store without cargo.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kopt_spec::files::{self, Rationale, VariantFile, VerifiedBy};
use kopt_spec::selection::Hashes;
use kopt_spec::source::{self, Amalgamated};
use kopt_spec::spec::{self, KernelSpec};
use kopt_store::accept::KernelTarget;
use kopt_store::pending::{EvidenceSummary, Fence, PendingMeta, PendingVariant};
use kopt_store::KoptDir;
use quote::quote;

pub fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/llm-kernels")
}

/// A crate holding the example crate's committed softmax files as they were before the
/// loop's winners replaced `online-vec4` (fixed, unlike the example crate): a copy of
/// `tests/fixtures/llm-kernels-online-vec4` with a `Cargo.toml`, in a temporary folder.
pub fn example_online_vec4() -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                copy(&p, &to.join(e.file_name()));
            } else {
                std::fs::copy(&p, to.join(e.file_name())).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let from =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llm-kernels-online-vec4");
    copy(&from, dir.path());
    std::fs::write(
        dir.path().join("Cargo.toml"),
        "[package]\nname = \"llm-kernels\"\n",
    )
    .unwrap();
    dir
}

pub struct Fixture {
    _dir: tempfile::TempDir,
    pub crate_root: PathBuf,
    pub target: PathBuf,
    pub kopt: KoptDir,
    pub spec: KernelSpec,
    pub reference: Amalgamated,
    pub hashes: Hashes,
}

pub fn softmax_spec() -> KernelSpec {
    let item = spec::parse_item(quote! {
        pub fn softmax(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);
    })
    .unwrap();
    spec::parse_kernel(
        quote! {
            reference = "kernels/softmax.cu",
            entry = "softmax_f32",
            x: [rows * cols],
            y: [rows * cols],
            grid = rows,
            block = 256,
            shapes = [
                { rows: 4096, cols: 4096 },
                { rows: 16, cols: 65536 },
                { rows: 32768, cols: 1024 },
                { rows: 8, cols: 50257 },
            ],
            flops = 5 * rows * cols,
            constraints = [cols >= 1],
        },
        &item,
    )
    .unwrap()
    .0
}

impl Fixture {
    /// A crate with the softmax reference and no variant.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let crate_root = dir.path().join("crate");
        let kernels = crate_root.join("kernels");
        std::fs::create_dir_all(&kernels).unwrap();
        for f in ["softmax.cu", "common.cuh"] {
            std::fs::copy(example().join("kernels").join(f), kernels.join(f)).unwrap();
        }
        std::fs::write(
            crate_root.join("Cargo.toml"),
            "[package]\nname = \"fixture-kernels\"\nversion = \"0.1.0\"\n",
        )
        .unwrap();
        let target = dir.path().join("target");
        let spec = softmax_spec();
        let reference = source::amalgamate(&crate_root, &spec.reference, &spec.include).unwrap();
        let hashes = Hashes::of(&spec, &reference);
        Fixture {
            kopt: KoptDir::new(&target),
            _dir: dir,
            crate_root,
            target,
            spec,
            reference,
            hashes,
        }
    }

    pub fn target(&self) -> KernelTarget<'_> {
        KernelTarget {
            package: "fixture-kernels",
            crate_root: &self.crate_root,
            spec: &self.spec,
            hashes: &self.hashes,
            reference: &self.reference,
        }
    }

    /// Re-reads the reference after an edit (as gathering would).
    pub fn refresh(&mut self) {
        self.reference =
            source::amalgamate(&self.crate_root, &self.spec.reference, &self.spec.include).unwrap();
        self.hashes = Hashes::of(&self.spec, &self.reference);
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.crate_root.join(rel)
    }

    pub fn write(&self, rel: &str, text: &str) {
        std::fs::write(self.path(rel), text).unwrap();
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap()
    }

    /// The shipped online-vec4 variant as a pending variant named `variant` from run
    /// `run_id`, with today's hashes. `tweak` changes its source (to make variants differ).
    pub fn pending(&self, variant: &str, run_id: &str, tweak: &str) -> PendingVariant {
        let shipped = example().join("kopt/softmax/online-vec4");
        let mut v =
            VariantFile::parse(&std::fs::read_to_string(shipped.join("variant.toml")).unwrap())
                .unwrap();
        v.id = variant.into();
        let mut r =
            Rationale::parse(&std::fs::read_to_string(shipped.join("rationale.json")).unwrap())
                .unwrap();
        r.variant = variant.into();
        r.claim = None;
        let source = format!(
            "{}{tweak}",
            std::fs::read_to_string(shipped.join("kernel.cu")).unwrap()
        );
        PendingVariant {
            ptx: None,
            meta: PendingMeta {
                format: files::FORMAT,
                package: "fixture-kernels".into(),
                kernel: "softmax".into(),
                arch: "sm_90".into(),
                variant: variant.into(),
                region: Some("cols % 4 == 0".into()),
                reference_hash: self.hashes.reference.clone(),
                spec_hash: self.hashes.spec.clone(),
                verified_by: VerifiedBy::Kopt,
                created_at: "2026-11-30T10:00:00Z".into(),
                run_id: run_id.into(),
                session: Some(format!("target/kopt/runs/{run_id}/journal.jsonl")),
                kind: None,
                baseline: None,
                retires: None,
                ptx: None,
                evidence: EvidenceSummary {
                    shapes_checked: vec!["cols=4096 rows=4096".into(), "cols=65536 rows=16".into()],
                    held_out_shapes: vec!["cols=1000 rows=3".into()],
                    fences: vec![Fence {
                        name: "numerics".into(),
                        passed: true,
                        detail: "max rel error 1.0e-6 <= rtol 1e-4".into(),
                    }],
                },
            },
            source,
            variant: v,
            rationale: r,
        }
    }

    /// Names in the kernel's folder, hidden ones included, sorted.
    pub fn kernel_dir_names(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.path("kopt/softmax"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

/// Shape maps for figures, from pairs.
pub fn shape(pairs: &[(&str, i64)]) -> BTreeMap<String, kopt_spec::spec::Number> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), kopt_spec::spec::Number::Int(*v)))
        .collect()
}
