//! Where the store keeps its working files: `<target>/kopt/`, next to the build, so that
//! nothing of it is committed by accident.
//!
//! ```text
//! <target>/kopt/pending/<package>/<kernel>/<arch>/   a pending variant (pending.json,
//!                                                    kernel.cu, variant.toml, rationale.json)
//! <target>/kopt/runs/<run-id>/journal.jsonl          an optimisation run's journal
//! <target>/kopt/runs/<run-id>/artefacts/             its candidates, profiles, ...
//! <target>/kopt/runs/<run-id>/replaced/              pending variants a newer one replaced
//! <target>/kopt/runs/<run-id>/rejected/              pending variants rejected in review
//! <target>/kopt/scratch/                             short-lived checks (removed after use)
//! ```
//!
//! `cargo clean` removes all of it; committed variants live in the crate's `kopt/` folder.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// `<target>/kopt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KoptDir {
    root: PathBuf,
}

impl KoptDir {
    /// The store of the workspace whose target folder is `target_dir` (as `cargo metadata`
    /// reports it).
    pub fn new(target_dir: &Path) -> Self {
        KoptDir {
            root: target_dir.join("kopt"),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn pending_root(&self) -> PathBuf {
        self.root.join("pending")
    }

    pub fn pending_dir(&self, package: &str, kernel: &str, arch: &str) -> PathBuf {
        self.pending_root().join(package).join(kernel).join(arch)
    }

    pub fn runs_root(&self) -> PathBuf {
        self.root.join("runs")
    }

    pub fn run_dir(&self, run_id: &str) -> PathBuf {
        self.runs_root().join(run_id)
    }

    pub fn scratch_root(&self) -> PathBuf {
        self.root.join("scratch")
    }
}

/// Whether `name` is usable as one component of a path the store builds (a package,
/// kernel, architecture or run id): no separators, no `..`, not hidden.
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+'))
}

/// Now, as RFC 3339 in UTC to the second: `2026-11-29T10:15:00Z`.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// A new run id: the UTC time to the second and a suffix unique within this machine,
/// `20261129T101500Z-3f2a9c`, so that ids sort by start time.
pub fn new_run_id() -> String {
    let now = SystemTime::now();
    let stamp: String = humantime::format_rfc3339_seconds(now)
        .to_string()
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect();
    let nanos = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mix = (u64::from(std::process::id()) << 32 | u64::from(nanos))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    format!("{stamp}-{:06x}", mix >> 40)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids() {
        assert!(is_plain_name("llm-kernels"));
        assert!(is_plain_name("sm_90"));
        for bad in ["", ".", "..", ".hidden", "a/b", "a\\b", "a b"] {
            assert!(!is_plain_name(bad), "{bad:?}");
        }
        let id = new_run_id();
        assert!(is_plain_name(&id), "{id}");
        assert_eq!(id.len(), "20261129T101500Z-3f2a9c".len(), "{id}");
        assert!(
            id.as_bytes()[8] == b'T' && id.as_bytes()[15] == b'Z',
            "{id}"
        );
        let t = now_rfc3339();
        assert!(t.ends_with('Z') && t.len() == 20, "{t}");
    }

    #[test]
    fn layout() {
        let k = KoptDir::new(Path::new("/w/target"));
        assert_eq!(
            k.pending_dir("p", "softmax", "sm_90"),
            Path::new("/w/target/kopt/pending/p/softmax/sm_90")
        );
        assert_eq!(k.run_dir("r1"), Path::new("/w/target/kopt/runs/r1"));
    }
}
