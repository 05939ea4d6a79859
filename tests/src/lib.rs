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
kopt = {{ path = "{}", package = "kopt-runtime" }}
rand = "0.9"
rand_distr = "0.5"

[profile.dev]
debug = "line-tables-only"

[profile.dev.package."*"]
debug = false
"#,
                repo.join("crates/kopt-runtime").display()
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

    /// `cargo <args>` in the workspace, offline, with a target folder of its own inside
    /// the repository's (so dependencies build once across tests and runs).
    pub fn cargo(&self, args: &[&str]) -> Output {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo_root().join("target"))
            .join("kopt-e2e");
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

/// stdout and stderr of a finished command, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "status: {}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
