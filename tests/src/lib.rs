//! Helpers shared by kopt's integration tests: a scratch copy of the example workspace
//! that tests may corrupt, edit and build without touching the repository.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The workspace's target folder: `CARGO_TARGET_DIR` where the tests were started with
/// one, else the repository's `target/`. Tests that run cargo on another workspace give it
/// a folder inside this one, so that its dependencies build once across tests and runs.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

/// `cargo check` of a workspace other than this one (a fixture crate, an example with its
/// own workspace), as its user would run it, with `args` after `check` and `env` set. They
/// all share `target/other-workspaces`, so that what they have in common (syn, serde,
/// cudarc, kopt's own crates) builds once; without incremental caches or debug
/// information, which would only take disk (CI has little). The CUDA version comes from
/// the checked crate's own features, not from a `CUDARC_CUDA_VERSION` this test run was
/// given for the workspace.
pub fn cargo_check_other_workspace(
    dir: &Path,
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> Output {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.arg("check")
        .args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target_dir().join("other-workspaces"))
        .env("CARGO_INCREMENTAL", "0")
        .env("CARGO_PROFILE_DEV_DEBUG", "false")
        .env_remove("CUDARC_CUDA_VERSION");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("cargo runs")
}

/// Whether `nvcc` runs; when not, a failure under `KOPT_REQUIRE_NVCC=1`
/// (`scripts/with-cuda-wheels` sets it and puts the wheels' nvcc on the PATH), else a skip
/// said on stderr.
pub fn nvcc_or_skip() -> bool {
    let ok = Command::new("nvcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let why = "nvcc is not on the PATH (scripts/with-cuda-wheels puts the wheels' nvcc there)";
        if std::env::var_os("KOPT_REQUIRE_NVCC").is_some_and(|v| v != "0") {
            panic!("KOPT_REQUIRE_NVCC is set, but {why}");
        }
        eprintln!("skipped: {why}");
    }
    ok
}

/// Runs a scripted agent (`cmd` with `KOPT_PROPOSALS` unset) on a request for `kernel`, as
/// the loop would: the request on stdin, the answer on stdout.
pub fn ask_scripted_agent(mut cmd: Command, kernel: &str) -> Output {
    use std::io::Write;
    let mut child = cmd
        .env_remove("KOPT_PROPOSALS")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the scripted agent starts (it needs python3)");
    let request = format!("# Kernel `{kernel}`\n\nAnswer with a proposal.\n");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// What the scripted agent of `agents_dir` (`examples/*/agents/scripted-agent.sh`) answers
/// the loop for `kernel`: the text of its proposal, every candidate's source written out
/// from the file it points at (`scripts/scripted_agent.py`). Panics with the agent's stderr
/// when it fails.
pub fn scripted_answer(agents_dir: &Path, kernel: &str) -> String {
    scripted_answer_from(agents_dir, None, kernel)
}

/// As [`scripted_answer`], with the proposal files read from `proposals` when given (as
/// the Hopper runs answer from `agents/hopper/`, with `KOPT_PROPOSALS`): the agent's
/// script with that folder.
pub fn scripted_answer_from(agents_dir: &Path, proposals: Option<&Path>, kernel: &str) -> String {
    let cmd = match proposals {
        None => Command::new(agents_dir.join("scripted-agent.sh")),
        Some(dir) => {
            let mut c = Command::new("python3");
            c.arg(agents_dir.join("../../../scripts/scripted_agent.py"))
                .arg("answer")
                .arg(dir);
            c
        }
    };
    let out = ask_scripted_agent(cmd, kernel);
    assert!(
        out.status.success(),
        "{}/scripted-agent.sh for {kernel}: {}",
        agents_dir.display(),
        text(&out)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the scripted agent's answer is not JSON ({e}): {}",
            text(&out)
        )
    });
    answer["text"]
        .as_str()
        .expect("the answer's text")
        .to_string()
}

/// Every shape the engine can draw as held out for `spec`, over 64 seeds, after the declared
/// ones: what a candidate's launch rule must give a geometry for.
pub fn every_drawable_shape(
    spec: &kopt_spec::KernelSpec,
) -> Vec<std::collections::BTreeMap<String, kopt_spec::spec::Number>> {
    let max_bytes = kopt_spec::shapes::held_out_byte_cap(spec);
    let mut out: Vec<_> = spec.shapes.iter().map(|s| s.values.clone()).collect();
    for seed in 0..64 {
        for s in kopt_spec::shapes::held_out_shapes(spec, None, seed, 64, max_bytes) {
            if !out.contains(&s.values) {
                out.push(s.values);
            }
        }
    }
    out
}

/// A launch expression of a proposal (`text`) parsed as the loop parses it: over the spec's
/// integer names and the proposal's `defines`.
pub fn parse_launch_expr(
    spec: &kopt_spec::KernelSpec,
    defines: &std::collections::BTreeMap<String, i64>,
    text: &str,
) -> kopt_spec::expr::Expr {
    use kopt_spec::expr::{Ty, VarKind};
    let names: Vec<&str> = defines.keys().map(String::as_str).collect();
    let kinds = |n: &str| {
        spec.var_kind_with(n, &names)
            .or_else(|| names.contains(&n).then_some(VarKind::Int))
    };
    let mut all = spec.int_names();
    all.extend(names.iter().map(|n| n.to_string()));
    kopt_spec::expr::parse_str(text, Ty::Int, &kinds, &all).unwrap()
}

/// A temporary workspace holding a copy of `examples/llm-kernels`, depending on this
/// repository's kopt crates by path and pinned by this repository's Cargo.lock.
pub struct ExampleWorkspace {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    /// The copied crate's root.
    pub krate: PathBuf,
}

impl ExampleWorkspace {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        let krate = root.join("llm-kernels");
        copy_dir(&repo_root().join("examples/llm-kernels"), &krate);
        let repo = repo_root();
        std::fs::write(
            root.join("Cargo.toml"),
            format!(
                r#"[workspace]
resolver = "2"
members = ["llm-kernels"]

[workspace.dependencies]
kopt = {{ path = "{}" }}
rand = "0.9"
rand_distr = "0.5"

[profile.dev]
debug = "line-tables-only"

[profile.dev.package."*"]
debug = false
"#,
                repo.join("crates/kopt").display()
            ),
        )
        .unwrap();
        std::fs::copy(repo.join("Cargo.lock"), root.join("Cargo.lock")).unwrap();
        ExampleWorkspace {
            _dir: dir,
            root,
            krate,
        }
    }

    /// A path inside the copied crate.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.krate.join(rel)
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap()
    }

    pub fn write(&self, rel: &str, text: &str) {
        std::fs::write(self.path(rel), text).unwrap();
    }

    pub fn manifest(&self) -> PathBuf {
        self.root.join("Cargo.toml")
    }

    /// `cargo-kopt kopt ARGS --manifest-path <this workspace>` (`exe`: the test's
    /// `CARGO_BIN_EXE_cargo-kopt`) with the fake worker, and the evaluation cache and case
    /// library kept inside the scratch folder.
    pub fn kopt_on_fake(&self, exe: &Path, args: &[&str]) -> Command {
        let mut c = self.kopt_on_gpu(exe, args);
        c.env("KOPT_WORKER", "fake");
        c
    }

    /// [`ExampleWorkspace::kopt_on_fake`] on the machine's GPU (for GPU tests).
    pub fn kopt_on_gpu(&self, exe: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(exe);
        c.arg("kopt")
            .args(args)
            .arg("--manifest-path")
            .arg(self.manifest())
            .env_remove("KOPT_WORKER")
            // The scratch workspace's own target folder holds its runs and pending area,
            // where the tests look, whatever target folder the test build itself uses.
            .env_remove("CARGO_TARGET_DIR")
            .env("KOPT_CACHE_DIR", self.root.join("cache"))
            .env("KOPT_CASES", self.root.join("cases.sqlite"));
        c
    }

    /// The variant accepted for softmax on sm_90 in this copy.
    pub fn accepted_softmax(&self) -> String {
        let text = std::fs::read_to_string(self.krate.join("kopt/softmax/kopt.lock")).unwrap();
        let lock = kopt_spec::files::LockFile::parse(&text).unwrap();
        let variant = lock.entries_for("sm_90").next().unwrap().variant.clone();
        variant
    }

    /// Makes a copy of softmax's accepted variant, named `name`, with `directives` (the
    /// fake device's `// kopt-fake: ...` lines) appended to its source, the only variant
    /// accepted for sm_90 (`revert`, then `pin`: a manual claim for every shape).
    pub fn pin_softmax_variant(&self, exe: &Path, name: &str, directives: &str) {
        self.pin_softmax_variant_with(exe, name, |dir| {
            let cu = dir.join("kernel.cu");
            let text = std::fs::read_to_string(&cu).unwrap();
            std::fs::write(&cu, format!("{text}\n{directives}\n")).unwrap();
        });
    }

    /// [`ExampleWorkspace::pin_softmax_variant`] with the variant's folder changed by
    /// `edit` (its `kernel.cu`, its `variant.toml`) before it is pinned.
    pub fn pin_softmax_variant_with(&self, exe: &Path, name: &str, edit: impl Fn(&Path)) {
        let accepted_id = self.accepted_softmax();
        let from = self.krate.join("kopt/softmax").join(&accepted_id);
        let to = self.krate.join("kopt/softmax").join(name);
        std::fs::create_dir_all(&to).unwrap();
        for f in std::fs::read_dir(&from).unwrap().flatten() {
            // Its verified PTX is the accepted source's, not this one's.
            if f.file_name() != "kernel.ptx" {
                std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
            }
        }
        let rename_in = |file: &str, from: &str, to_text: &str| {
            let path = to.join(file);
            let text = std::fs::read_to_string(&path).unwrap();
            std::fs::write(&path, text.replace(from, to_text)).unwrap();
        };
        rename_in(
            "variant.toml",
            &format!("id = \"{accepted_id}\""),
            &format!("id = \"{name}\""),
        );
        // Its audit record names it too (`pin` refuses one that describes another variant).
        rename_in(
            "rationale.json",
            &format!("\"variant\": \"{accepted_id}\""),
            &format!("\"variant\": \"{name}\""),
        );
        edit(&to);
        for args in [
            &["revert", "softmax", "--arch", "sm_90"][..],
            &["pin", "softmax", name, "--arch", "sm_90"],
        ] {
            let o = self.kopt_on_fake(exe, args).output().unwrap();
            assert!(o.status.success(), "{}", crate::text(&o));
        }
    }

    /// Makes the hand-written `online-vec4` (kept in `kopt/softmax/`) softmax's variant for
    /// sm_90 again, as `cargo kopt pin` records it: a manual claim with the region
    /// `cols % 4 == 0`, the case several tests exercise (the example's accepted softmax
    /// variant is the loop's winner, for every shape).
    pub fn pin_online_vec4(&self, exe: &Path) {
        for args in [
            &["revert", "softmax", "--arch", "sm_90"][..],
            &[
                "pin",
                "softmax",
                "online-vec4",
                "--arch",
                "sm_90",
                "--region",
                "cols % 4 == 0",
            ],
        ] {
            let o = self.kopt_on_fake(exe, args).output().unwrap();
            assert!(o.status.success(), "{}", text(&o));
        }
    }

    /// Builds the copy (incrementally) and returns what its binary's `explain --arch ARCH`
    /// prints: which version of each kernel runs for each declared shape, and why.
    pub fn explain(&self, arch: &str) -> String {
        self.explain_on(arch, None)
    }

    /// [`ExampleWorkspace::explain`] on a device of that name (`--device`).
    pub fn explain_on(&self, arch: &str, device: Option<&str>) -> String {
        let mut args = vec![
            "run",
            "-q",
            "-p",
            "llm-kernels",
            "--",
            "explain",
            "--arch",
            arch,
        ];
        if let Some(d) = device {
            args.extend(["--device", d]);
        }
        let out = self.cargo(&args);
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    }

    /// `cargo <args>` in the workspace, offline, with a target folder of its own inside
    /// the repository's (so dependencies build once across tests and runs).
    pub fn cargo(&self, args: &[&str]) -> Output {
        let target = target_dir().join("kopt-e2e");
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(args)
            .arg("--offline")
            .current_dir(&self.root)
            .env("CARGO_TARGET_DIR", target)
            .env_remove("KOPT_DISABLE")
            .output()
            .unwrap()
    }
}

impl Default for ExampleWorkspace {
    fn default() -> Self {
        Self::new()
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let name = e.file_name();
        if name == "target" {
            continue;
        }
        let (src, dst) = (e.path(), to.join(&name));
        if src.is_dir() {
            copy_dir(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// The `cargo-kopt` binary a test runs: `built` (the test's `CARGO_BIN_EXE_cargo-kopt`)
/// where it exists, else the one on PATH. On a GPU runner the test binaries are built on
/// another machine, whose target folder is not there, and `gpu-stage` puts the release
/// `cargo-kopt` on PATH instead.
pub fn cargo_kopt_binary(built: &str) -> PathBuf {
    let built = PathBuf::from(built);
    if built.is_file() {
        return built;
    }
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("cargo-kopt"))
                .find(|p| p.is_file())
        })
        .unwrap_or(built)
}

/// stdout and stderr of a finished command, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "status: {}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The shipped `online-vec4` softmax variant of a workspace copy, as the optimisation
/// loop would leave it pending: renamed `variant`, from run `run_id`, verified against
/// `hashes` (reference, spec) for `arch`, its source ending with `tweak` (so that variants
/// can differ). Tests seed the pending area with it through `kopt_store::pending::save`.
pub fn pending_from_shipped(
    ws: &ExampleWorkspace,
    variant: &str,
    run_id: &str,
    arch: &str,
    hashes: (&str, &str),
    tweak: &str,
) -> kopt_store::pending::PendingVariant {
    use kopt_spec::files::{Rationale, VariantFile, VerifiedBy, FORMAT};
    use kopt_store::pending::{EvidenceSummary, Fence, PendingMeta, PendingVariant};
    let dir = "kopt/softmax/online-vec4";
    let mut v = VariantFile::parse(&ws.read(&format!("{dir}/variant.toml"))).unwrap();
    v.id = variant.into();
    let mut r = Rationale::parse(&ws.read(&format!("{dir}/rationale.json"))).unwrap();
    r.variant = variant.into();
    r.arch = arch.into();
    r.claim = None;
    PendingVariant {
        ptx: None,
        meta: PendingMeta {
            format: FORMAT,
            package: "llm-kernels".into(),
            kernel: "softmax".into(),
            arch: arch.into(),
            variant: variant.into(),
            region: Some("cols % 4 == 0".into()),
            reference_hash: hashes.0.into(),
            spec_hash: hashes.1.into(),
            verified_by: VerifiedBy::Kopt,
            created_at: "2026-11-30T10:00:00Z".into(),
            run_id: run_id.into(),
            session: None,
            kind: Some("softmax".into()),
            baseline: None,
            retires: None,
            ptx: None,
            evidence: EvidenceSummary {
                shapes_checked: vec![
                    "cols=4096 rows=4096".into(),
                    "cols=65536 rows=16".into(),
                    "cols=1024 rows=32768".into(),
                ],
                held_out_shapes: vec!["cols=1000 rows=3".into()],
                fences: vec![
                    Fence {
                        name: "numerics".into(),
                        passed: true,
                        detail: "max rel error 1.01e-6 <= rtol 1e-4 on 3 seeds".into(),
                    },
                    Fence {
                        name: "poisoned outputs".into(),
                        passed: true,
                        detail: "every output element written".into(),
                    },
                ],
            },
        },
        source: format!("{}{tweak}", ws.read(&format!("{dir}/kernel.cu"))),
        variant: v,
        rationale: r,
    }
}
