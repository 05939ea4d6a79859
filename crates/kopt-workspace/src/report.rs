//! `cargo kopt report`: gathers the committed evidence of the workspace's kernels, the
//! pending area and the measurement files given, for `kopt_report` to render.

use std::path::{Path, PathBuf};

use kopt_report::{input, Report};

use crate::gather::Gathered;

#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The JSON of `cargo kopt bench --message-format json`.
    pub bench: Option<PathBuf>,
    /// Files written by `cargo kopt search-bench --json-out`.
    pub search_bench: Vec<PathBuf>,
    /// A pending root (`<package>/<kernel>/<arch>/`); default the workspace's.
    pub pending: Option<PathBuf>,
    pub title: Option<String>,
    /// Shown as the generation date (the report reads no clock).
    pub generated: Option<String>,
}

/// `path` relative to `root` when it lies inside it, for the report's list of sources.
fn shown(path: &Path, root: &Path) -> String {
    let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    abs.strip_prefix(&root)
        .map(Path::to_path_buf)
        .unwrap_or(abs)
        .display()
        .to_string()
}

/// Why a report could not be built or written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A measurement file that `kopt_report` cannot read (its message names the command
    /// that writes the right one).
    #[error("{0}")]
    Input(String),
    #[error("--pending {}: no such folder (give a pending root holding <package>/<kernel>/<arch>/ folders, e.g. target/kopt/pending)", .0.display())]
    NoPendingRoot(PathBuf),
    #[error("cannot create {}: {source}", .path.display())]
    CreateFolder {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Reads every input; a measurement file that cannot be read is an error naming the fix.
pub fn build(g: &Gathered, o: &Options) -> Result<Report, ReportError> {
    let root = &g.workspace_root;
    let mut r = Report {
        title: o.title.clone().unwrap_or_else(|| "kopt report".to_string()),
        generated: o.generated.clone(),
        ..Report::default()
    };
    if let Some(p) = &o.bench {
        r.bench = Some(input::read_bench(p).map_err(ReportError::Input)?);
        r.sources.push(format!("bench: {}", shown(p, root)));
    }
    for p in &o.search_bench {
        r.search_benches
            .push(input::read_search_bench(p).map_err(ReportError::Input)?);
        r.sources.push(format!("search-bench: {}", shown(p, root)));
    }
    let mut crates: Vec<(&str, &Path)> = g
        .kernels
        .iter()
        .map(|k| (k.package.as_str(), k.crate_root.as_path()))
        .collect();
    crates.sort();
    crates.dedup();
    for (package, crate_root) in crates {
        let found = input::read_committed(package, crate_root);
        if !found.is_empty() {
            r.sources.push(format!(
                "committed: {} ({} variant folder{})",
                shown(&crate_root.join("kopt"), root),
                found.len(),
                if found.len() == 1 { "" } else { "s" }
            ));
        }
        r.committed.extend(found);
    }
    let pending_root = match &o.pending {
        Some(p) if !p.is_dir() => return Err(ReportError::NoPendingRoot(p.clone())),
        Some(p) => p.clone(),
        None => kopt_store::KoptDir::new(&g.target_dir).pending_root(),
    };
    let (pending, broken) = input::read_pending(&pending_root);
    if !pending.is_empty() || !broken.is_empty() {
        r.sources.push(format!(
            "pending: {} ({} variant{})",
            shown(&pending_root, root),
            pending.len(),
            if pending.len() == 1 { "" } else { "s" }
        ));
    }
    r.pending = pending;
    r.pending_broken = broken;
    Ok(r)
}

/// Writes the report's HTML to `out`, creating its folder.
pub fn write(report: &Report, out: &Path) -> Result<(), ReportError> {
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| ReportError::CreateFolder {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    std::fs::write(out, kopt_report::render(report)).map_err(|source| ReportError::Write {
        path: out.to_path_buf(),
        source,
    })
}
