//! kopt beside every cudarc configuration a user's crate may choose. Each fixture under
//! `tests/fixtures/cudarc-configs/` is a workspace of its own, with a committed Cargo.lock,
//! a `#[kopt::kernel]` launcher and its own dependency on cudarc 0.19 in one configuration;
//! `cargo check --locked` of each must pass (cudarc's build script refuses contradictory
//! features, and two CUDA versions in one graph do not compile). They share one
//! target folder with the other workspaces tests check (`kopt_tests::cargo_check_other_workspace`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use kopt_tests::{cargo_check_other_workspace, nvcc_or_skip, repo_root, text};

fn fixtures_dir() -> PathBuf {
    repo_root().join("tests/fixtures/cudarc-configs")
}

/// `cargo check --locked --offline` of fixture `name`, with `env` set; fails with cargo's
/// output.
fn check(name: &str, env: &[(&str, &std::ffi::OsStr)]) {
    let started = Instant::now();
    let out =
        cargo_check_other_workspace(&fixtures_dir().join(name), &["--locked", "--offline"], env);
    eprintln!(
        "cudarc-configs/{name}: cargo check {} in {:.1} s",
        if out.status.success() {
            "passed"
        } else {
            "failed"
        },
        started.elapsed().as_secs_f64()
    );
    assert!(
        out.status.success(),
        "kopt does not build beside cudarc as tests/fixtures/cudarc-configs/{name} configures it.\n\
         A Cargo.lock that no longer fits (kopt's dependencies changed): copy the workspace's \
         Cargo.lock into the fixture and run `cargo metadata --offline` there, which prunes it.\n{}",
        text(&out)
    );
}

#[test]
fn dynamic_linking_with_an_explicit_cuda_12_version() {
    check("dynamic-linking-cuda-12080", &[]);
}

/// candle's configuration: the CUDA version is `nvcc --version`'s, so nvcc must be on the
/// PATH (`scripts/with-cuda-wheels` installs NVIDIA's nvcc wheel and sets
/// `KOPT_REQUIRE_NVCC`, which makes a missing nvcc a failure instead of a skip).
#[test]
fn dynamic_linking_with_the_version_from_nvcc() {
    if !nvcc_or_skip() {
        return;
    }
    check("dynamic-linking-from-nvcc", &[]);
}

/// The static libraries cudarc's `static-linking` names for the `driver` and `nvrtc`
/// features kopt uses (besides `-l dylib=cuda`).
const STATIC_LIBRARIES: &[&str] = &[
    "stdc++",
    "cudart_static",
    "nvrtc_static",
    "nvptxcompiler_static",
    "nvrtc-builtins_static",
];

/// `static-linking` makes cudarc's build script name static libraries
/// (`cargo:rustc-link-lib=static:+whole-archive=...`), and rustc looks each one up on the
/// link search path when it compiles cudarc, `cargo check` included ("could not find
/// native static library"); it does not read them until a binary links. The search path
/// is `CUDA_HOME`'s `lib`, `lib64`, ... when `CUDA_HOME` is set. NVIDIA's wheels carry
/// `libcudart_static.a` but none of NVRTC's static archives, which come only with the full
/// toolkit, and `libstdc++.a` sits in GCC's folder, which cudarc does not search. So this
/// test gathers a `CUDA_HOME` of its own: each library where this machine has it (the
/// toolkit under `CUDA_HOME`, GCC's `libstdc++.a`), else an empty archive of that name.
/// The check then proves what `cargo check` can: kopt and cudarc compile with
/// `static-linking`. Linking a binary needs the real archives (a CUDA toolkit).
#[test]
fn static_linking() {
    let home = kopt_tests::target_dir().join("other-workspaces/static-linking-cuda-home");
    let lib = home.join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    let mut placeholders = Vec::new();
    for name in STATIC_LIBRARIES {
        let file = format!("lib{name}.a");
        let at = lib.join(&file);
        let _ = std::fs::remove_file(&at);
        match find_static_library(&file) {
            Some(real) => std::os::unix::fs::symlink(&real, &at).unwrap(),
            None => {
                std::fs::write(&at, b"!<arch>\n").unwrap();
                placeholders.push(file);
            }
        }
    }
    if !placeholders.is_empty() {
        eprintln!(
            "static-linking: empty archives stand in for {} (not on this machine; a binary would need them to link)",
            placeholders.join(", ")
        );
    }
    check("static-linking", &[("CUDA_HOME", home.as_os_str())]);
}

/// Where this machine keeps `file`: under `CUDA_HOME` (as the toolkit lays it out), or, for
/// `libstdc++.a`, where GCC says.
fn find_static_library(file: &str) -> Option<PathBuf> {
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        for sub in ["lib", "lib64", "targets/x86_64-linux/lib"] {
            let p = Path::new(&home).join(sub).join(file);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    if file == "libstdc++.a" {
        let out = Command::new("gcc")
            .arg(format!("-print-file-name={file}"))
            .output()
            .ok()?;
        let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        // GCC prints the bare name when it has no such file.
        return p.is_absolute().then_some(p).filter(|p| p.is_file());
    }
    None
}

#[test]
fn dynamic_loading_with_cuda_13_0() {
    check("dynamic-loading-cuda-13000", &[]);
}

/// Every fixture folder has its test above, and each lock holds only versions the
/// workspace's lock holds (so `--offline` finds them where the workspace was built).
#[test]
fn every_fixture_is_checked_and_locked_like_the_workspace() {
    let tested = [
        "dynamic-linking-cuda-12080",
        "dynamic-linking-from-nvcc",
        "dynamic-loading-cuda-13000",
        "static-linking",
    ];
    let mut found: Vec<String> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("Cargo.toml").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    assert_eq!(
        found, tested,
        "a fixture without a test, or a test without a fixture"
    );
    let workspace = locked_packages(&repo_root().join("Cargo.lock"));
    for name in tested {
        let lock = fixtures_dir().join(name).join("Cargo.lock");
        let own = format!("cudarc-config-{name}");
        let stray: Vec<String> = locked_packages(&lock)
            .into_iter()
            .filter(|(n, v)| *n != own && !workspace.contains(&(n.clone(), v.clone())))
            .map(|(n, v)| format!("{n} {v}"))
            .collect();
        assert!(
            stray.is_empty(),
            "{} locks versions the workspace's Cargo.lock does not: {stray:?}; copy the \
             workspace's Cargo.lock there and run `cargo metadata --offline` in the fixture",
            lock.display()
        );
    }
}

/// The (name, version) of every `[[package]]` of a Cargo.lock.
fn locked_packages(lock: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(lock).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (each fixture commits its Cargo.lock)",
            lock.display()
        )
    });
    let value = |line: &str, key: &str| {
        line.strip_prefix(key)
            .map(|v| v.trim().trim_matches('"').to_string())
    };
    let mut out = Vec::new();
    let mut name = None;
    for line in text.lines() {
        if let Some(n) = value(line, "name = ") {
            name = Some(n);
        } else if let (Some(v), Some(n)) = (value(line, "version = "), name.take()) {
            out.push((n, v));
        }
    }
    out
}
