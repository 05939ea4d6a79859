//! Bringing back the work of other machines: `cargo kopt merge DIR...` adds the pending
//! variants found in each DIR (a pending area, a `<target>/kopt` folder or a target folder
//! copied back from a CI job, a Slurm task, ...) to this workspace's pending area, with the
//! run folders they cite, and imports the case libraries found there.
//!
//! The pending area holds one variant per kernel and architecture, so two parts that
//! optimised the same kernel for the same architecture cannot both be kept as they are.
//! A partitioned run never does that (each kernel is in one part), so such a conflict
//! means overlapping runs, and [`merge_pending`] refuses it, naming both variants and the
//! ways out, and merges nothing: picking a winner between two runs measured on different
//! machines is a reviewer's decision, not a merge's. The same variant arriving twice (the
//! same files, as when a folder is merged again) is not a conflict.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::cases::{CaseLibrary, ImportReport};
use crate::layout::KoptDir;
use crate::pending::{self, PendingVariant};
use crate::{fsx, Error, Result};

/// Where a merged variant came from and what became of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MergedVariant {
    /// `package/kernel/arch`.
    pub label: String,
    pub variant: String,
    pub run_id: String,
    pub from: PathBuf,
}

/// What [`merge_pending`] did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MergeReport {
    /// Now pending here.
    pub added: Vec<MergedVariant>,
    /// Already pending here, identical (nothing to do).
    pub unchanged: Vec<MergedVariant>,
    /// Run folders (journal, sessions, artefacts) copied into `<target>/kopt/runs/`.
    pub runs_copied: Vec<String>,
    /// Run folders cited but already here (kept as they are).
    pub runs_present: Vec<String>,
}

/// The pending area inside `dir`: `dir/target/kopt/pending`, `dir/kopt/pending`,
/// `dir/pending`, or `dir` itself when it holds `PACKAGE/KERNEL/ARCH/pending.json` folders.
pub fn pending_root_in(dir: &Path) -> Option<PathBuf> {
    for c in [
        dir.join("target").join("kopt").join("pending"),
        dir.join("kopt").join("pending"),
        dir.join("pending"),
    ] {
        if c.is_dir() {
            return Some(c);
        }
    }
    let subdirs = |d: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(d)
            .map(|r| {
                r.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default()
    };
    let holds_pending = subdirs(dir).iter().any(|package| {
        subdirs(package).iter().any(|kernel| {
            subdirs(kernel)
                .iter()
                .any(|arch| arch.join(pending::PENDING_FILE).is_file())
        })
    });
    holds_pending.then(|| dir.to_path_buf())
}

/// The case libraries a folder brings: `cases.sqlite` and `cases.jsonl` at its root.
pub fn case_libraries_in(dir: &Path) -> Vec<PathBuf> {
    ["cases.sqlite", "cases.jsonl"]
        .iter()
        .map(|n| dir.join(n))
        .filter(|p| p.is_file())
        .collect()
}

fn label(p: &PendingVariant) -> String {
    format!("{}/{}/{}", p.meta.package, p.meta.kernel, p.meta.arch)
}

fn merged(p: &PendingVariant, from: &Path) -> MergedVariant {
    MergedVariant {
        label: label(p),
        variant: p.meta.variant.clone(),
        run_id: p.meta.run_id.clone(),
        from: from.to_path_buf(),
    }
}

/// Adds the pending variants of `roots` (pending areas, see [`pending_root_in`]) to
/// `kopt`'s pending area, all or nothing: a folder that cannot be read, or two different
/// variants for one kernel, architecture and region (among the roots, or against one pending here
/// already), stops it before anything is written. Each variant's run folder
/// (`<root>/../runs/<run-id>/`, when the root is a `kopt/pending` folder) is copied along
/// unless this workspace has one of that name.
pub fn merge_pending(kopt: &KoptDir, roots: &[PathBuf]) -> Result<MergeReport> {
    let mut incoming: BTreeMap<(String, String, String), (PendingVariant, PathBuf)> =
        BTreeMap::new();
    for root in roots {
        let listing = pending::list_root(root);
        if let Some((dir, why)) = listing.broken.first() {
            return Err(Error::Invalid(format!(
                "{}: not a readable pending variant ({why}); nothing was merged. Copy the folder again, or delete it from {} and merge the rest",
                dir.display(),
                root.display()
            )));
        }
        for p in listing.variants {
            let key = (p.meta.package.clone(), p.meta.kernel.clone(), p.meta.slot());
            match incoming.get(&key) {
                Some((q, _)) if *q == p => {}
                Some((q, other)) => {
                    return Err(conflict(&p, root, q, other, false));
                }
                None => {
                    incoming.insert(key, (p, root.clone()));
                }
            }
        }
    }
    let mut report = MergeReport::default();
    let mut to_add = Vec::new();
    for ((package, kernel, slot), (p, root)) in incoming {
        let dir = kopt.pending_dir(&package, &kernel, &slot);
        if dir.exists() {
            let here = pending::load_dir(&dir)?;
            if here == p {
                report.unchanged.push(merged(&p, &root));
                continue;
            }
            return Err(conflict(&p, &root, &here, &kopt.pending_root(), true));
        }
        to_add.push((p, root));
    }
    for (p, root) in &to_add {
        pending::save(kopt, p)?;
        report.added.push(merged(p, root));
        let Some(source_runs) = root
            .file_name()
            .filter(|n| *n == "pending")
            .and_then(|_| root.parent())
            .map(|k| k.join("runs").join(&p.meta.run_id))
            .filter(|d| d.is_dir())
        else {
            continue;
        };
        let id = p.meta.run_id.clone();
        if report.runs_copied.contains(&id) || report.runs_present.contains(&id) {
            continue;
        }
        let dest = kopt.run_dir(&id);
        if dest.exists() {
            report.runs_present.push(id);
        } else {
            fsx::copy_dir_atomic(&source_runs, &dest)?;
            report.runs_copied.push(id);
        }
    }
    Ok(report)
}

fn conflict(
    a: &PendingVariant,
    a_from: &Path,
    b: &PendingVariant,
    b_from: &Path,
    b_is_here: bool,
) -> Error {
    let (kernel, arch) = (&a.meta.kernel, &a.meta.arch);
    let way_out = if b_is_here {
        format!(
            "decide on the one pending here first (`cargo kopt review {kernel} --arch {arch}`, or `cargo kopt reject {kernel} --arch {arch}`), then merge again"
        )
    } else {
        format!(
            "merge one of the two folders, decide on it (`cargo kopt review {kernel} --arch {arch}`), then merge the other"
        )
    };
    Error::Conflict(format!(
        "two different pending variants of `{kernel}` ({}) for {arch}: `{}` (run {}) from {} and `{}` (run {}) {}; the pending area keeps one per kernel and architecture, and a partitioned run never optimises a kernel twice, so these come from overlapping runs. Nothing was merged: {way_out}",
        a.meta.package,
        a.meta.variant,
        a.meta.run_id,
        a_from.display(),
        b.meta.variant,
        b.meta.run_id,
        if b_is_here {
            "pending here".to_string()
        } else {
            format!("from {}", b_from.display())
        },
    ))
}

/// Imports a case library file into `lib`: another library (SQLite) or JSON lines (as
/// `cases export` writes them). Cases are keyed by id, so importing the same library
/// twice, or two libraries that share cases, adds each case once.
pub fn import_cases(lib: &mut CaseLibrary, path: &Path) -> Result<ImportReport> {
    let is_sqlite = std::fs::read(path)
        .map(|b| b.starts_with(b"SQLite format 3\0"))
        .map_err(|e| Error::Io {
            path: path.display().to_string(),
            source: e,
        })?;
    if is_sqlite {
        let other = CaseLibrary::open(path)?;
        if other.path() == lib.path() {
            return Ok(ImportReport::default());
        }
        let cases = other.list(None, None)?;
        lib.upsert_all(&cases)
    } else {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Io {
            path: path.display().to_string(),
            source: e,
        })?;
        lib.import_jsonl(&text)
    }
}
