//! Pending variants: the optimisation loop's verified winners, waiting for review.
//!
//! One per kernel, architecture and region, in `<target>/kopt/pending/<package>/<kernel>/<slot>/`
//! (the slot is the architecture, `sm_90`, for a winner on every shape, and
//! `sm_90@<hash of the region>` for a winner of a region):
//!
//! ```text
//! pending.json     format 1: what it is, what it was verified against, where it came from
//! kernel.cu        the candidate's self-contained source
//! variant.toml     its entry point, launch rule, defines and options (the committed format)
//! rationale.json   its audit record (the committed format; RATIONALE.md is rendered on accept)
//! kernel.ptx       the PTX its verification loaded, when pending.json's `ptx` records one
//! ```
//!
//! [`save`] writes the folder atomically (temporary folder, synced, renamed), so an
//! interrupted run leaves the old pending variant, the new one, or none, never half of
//! one. A newer pending variant for the same kernel, architecture and region replaces the older,
//! which is moved into the new run's folder (`runs/<run-id>/replaced/`), not deleted.

use std::path::{Path, PathBuf};

use kopt_spec::files::{self, Rationale, VariantFile, VerifiedBy};
use kopt_spec::source;
use serde::{Deserialize, Serialize};

use crate::layout::{is_plain_name, KoptDir};
use crate::{fsx, io, Error, Result};

pub const PENDING_FILE: &str = "pending.json";

/// `pending.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingMeta {
    pub format: u32,
    pub package: String,
    pub kernel: String,
    pub arch: String,
    pub variant: String,
    /// The condition over the scalar arguments where it was verified and wins; absent
    /// means every shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Hash of the amalgamated reference source it was verified against.
    pub reference_hash: String,
    /// Hash of the kernel's spec (the annotation) it was verified against.
    pub spec_hash: String,
    pub verified_by: VerifiedBy,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// The optimisation run that produced it (`<target>/kopt/runs/<run_id>/`).
    pub run_id: String,
    /// The run's recorded session, relative to the workspace root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The kernel's kind for the case library (`softmax`, `norm`, ...); inferred from
    /// its name and source when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The accepted variant it had to beat (the optimisation loop's starting point);
    /// absent: it was compared with the reference only. Its speedups are relative to the
    /// reference either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Baseline>,
    /// An accepted variant that accepting this one removes from the lock: the loop
    /// measured it no faster than the reference on the shapes this one's region leaves
    /// out (a winner narrowed to where it is not slower than the reference), so the
    /// reference runs them. Absent: accepting replaces only what the region covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retires: Option<Baseline>,
    /// Its `kernel.ptx`, the PTX the worker loaded when it verified the variant: hash and
    /// what compiled it (the lock entry records the same on accept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptx: Option<files::PtxRecord>,
    pub evidence: EvidenceSummary,
}

/// An accepted variant, identified by its source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Baseline {
    pub variant: String,
    pub source_hash: String,
}

/// What verification established, in brief (the numbers are in rationale.json).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvidenceSummary {
    /// Declared shapes the numeric check ran on, as `cols=4096 rows=4096`.
    pub shapes_checked: Vec<String>,
    /// Shapes the agent never saw, checked too.
    #[serde(default)]
    pub held_out_shapes: Vec<String>,
    /// Every fence the candidate went through, in order.
    pub fences: Vec<Fence>,
}

/// One verification fence: numerics, poisoned outputs, inputs unmodified, watchdog, ...
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

/// A pending variant: its metadata and the three files it will commit.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingVariant {
    pub meta: PendingMeta,
    pub source: String,
    pub variant: VariantFile,
    pub rationale: Rationale,
    /// The PTX the worker loaded when it verified the variant (`kernel.ptx`), present
    /// exactly when `meta.ptx` records it.
    pub ptx: Option<String>,
}

impl PendingVariant {
    /// `llm-kernels/softmax/sm_90`, or `llm-kernels/softmax/sm_90 where cols <= 1024`.
    pub fn label(&self) -> String {
        let m = &self.meta;
        match &m.region {
            None => format!("{}/{}/{}", m.package, m.kernel, m.arch),
            Some(r) => format!("{}/{}/{} where {r}", m.package, m.kernel, m.arch),
        }
    }

    /// Every reason this pending variant is not self-consistent, or not a winner.
    pub fn validate(&self) -> Result<()> {
        let m = &self.meta;
        let bad = |msg: String| {
            Err(Error::Invalid(format!(
                "pending variant {}: {msg}",
                self.label()
            )))
        };
        if m.format != files::FORMAT {
            return bad(format!(
                "{PENDING_FILE} has format {}, this kopt reads {}; upgrade cargo-kopt",
                m.format,
                files::FORMAT
            ));
        }
        for (what, name) in [
            ("package", &m.package),
            ("kernel", &m.kernel),
            ("run id", &m.run_id),
        ] {
            if !is_plain_name(name) {
                return bad(format!("`{name}` is not a usable {what} name"));
            }
        }
        if files::parse_arch(&m.arch).is_none() {
            return bad(format!(
                "`{}` is not an architecture name (e.g. `sm_90`)",
                m.arch
            ));
        }
        if !files::is_valid_variant_name(&m.variant) {
            return bad(format!(
                "`{}` is not a valid variant name (letters, digits, `-`, `_`, `.`)",
                m.variant
            ));
        }
        let v = &self.variant;
        if v.kernel != m.kernel || v.id != m.variant {
            return bad(format!(
                "{} describes `{}/{}`, not `{}/{}`",
                files::VARIANT_FILE,
                v.kernel,
                v.id,
                m.kernel,
                m.variant
            ));
        }
        let r = &self.rationale;
        if r.kernel != m.kernel || r.variant != m.variant || r.arch != m.arch {
            return bad(format!(
                "{} describes `{}/{}` on {}",
                files::RATIONALE_JSON,
                r.kernel,
                r.variant,
                r.arch
            ));
        }
        if let Some(c) = &r.claim {
            if c.region != m.region
                || c.reference_hash != m.reference_hash
                || c.spec_hash != m.spec_hash
                || c.verified_by != m.verified_by
            {
                return bad(format!(
                    "the claim in {} (region, hashes, verified_by) differs from {PENDING_FILE}",
                    files::RATIONALE_JSON
                ));
            }
        }
        if !source::may_define_entry(&self.source, &v.entry) {
            return bad(format!(
                "{} defines no `__global__` function `{}`",
                files::SOURCE_FILE,
                v.entry
            ));
        }
        match (&m.ptx, &self.ptx) {
            (Some(_), None) => {
                return bad(format!(
                    "{PENDING_FILE} records a PTX, but there is no {}",
                    files::PTX_FILE
                ))
            }
            (None, Some(_)) => {
                return bad(format!(
                    "there is a {}, but {PENDING_FILE} does not record it",
                    files::PTX_FILE
                ))
            }
            (Some(r), Some(text)) => {
                if r.hash != source::hash(text.as_bytes()) {
                    return bad(format!(
                        "{} does not match the hash {PENDING_FILE} records (edited since it was verified)",
                        files::PTX_FILE
                    ));
                }
                if files::parse_arch(&r.arch) != files::parse_arch(&m.arch) {
                    return bad(format!(
                        "its PTX was compiled for {}, not {}",
                        r.arch, m.arch
                    ));
                }
            }
            (None, None) => {}
        }
        if m.evidence.fences.is_empty() || m.evidence.shapes_checked.is_empty() {
            return bad("no verification evidence (fences and shapes checked): only verified candidates may wait for review".into());
        }
        if let Some(f) = m.evidence.fences.iter().find(|f| !f.passed) {
            return bad(format!(
                "it failed the `{}` fence ({}); a candidate that fails a fence is no winner",
                f.name, f.detail
            ));
        }
        Ok(())
    }

    /// The files of the pending folder, by name.
    fn files(&self) -> Vec<(&'static str, Vec<u8>)> {
        let mut meta = serde_json::to_string_pretty(&self.meta).expect("pending serialises");
        meta.push('\n');
        let mut files = vec![
            (PENDING_FILE, meta.into_bytes()),
            (files::SOURCE_FILE, self.source.clone().into_bytes()),
            (files::VARIANT_FILE, self.variant.render().into_bytes()),
            (files::RATIONALE_JSON, self.rationale.to_json().into_bytes()),
        ];
        if let Some(ptx) = &self.ptx {
            files.push((files::PTX_FILE, ptx.clone().into_bytes()));
        }
        files
    }

    /// Hash of kernel.cu, as the lock file will record it.
    pub fn source_hash(&self) -> String {
        source::hash(self.source.as_bytes())
    }
}

/// The folder of a pending variant.
pub fn dir_of(kopt: &KoptDir, meta: &PendingMeta) -> PathBuf {
    kopt.pending_dir(&meta.package, &meta.kernel, &meta.slot())
}

impl PendingMeta {
    /// The name of its folder under the kernel's: the architecture, and for a region's
    /// winner a hash of the region too, so that the winners of different regions (and
    /// the winner of every shape) wait side by side.
    pub fn slot(&self) -> String {
        match &self.region {
            None => self.arch.clone(),
            Some(r) => {
                let h = source::hash(r.as_bytes());
                let hex = h.trim_start_matches("sha256:");
                format!("{}@{}", self.arch, &hex[..hex.len().min(12)])
            }
        }
    }
}

/// What [`save`] did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Saved {
    pub dir: PathBuf,
    pub replaced: Option<Replaced>,
}

/// A pending variant that a newer one replaced, and where it was kept.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Replaced {
    pub variant: String,
    pub run_id: String,
    pub created_at: String,
    pub kept_in: PathBuf,
}

/// Stores a verified winner for review, replacing the pending variant of the same kernel
/// and architecture (kept in `runs/<run-id>/replaced/` of the new variant's run).
pub fn save(kopt: &KoptDir, pending: &PendingVariant) -> Result<Saved> {
    pending.validate()?;
    let dest = dir_of(kopt, &pending.meta);
    let files = pending.files();
    let borrowed: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (*n, b.as_slice())).collect();
    let parent = dest.parent().expect("pending folders have parents");
    fsx::clean_leftovers(parent);
    let tmp = fsx::write_temp_dir(&dest, &borrowed)?;
    let mut replaced = None;
    if dest.exists() {
        let old = read_meta(&dest).ok();
        let label = match &old {
            Some(m) => format!("{}.{}.{}.{}", m.package, m.kernel, m.arch, m.variant),
            None => format!(
                "{}.{}.{}.unreadable",
                pending.meta.package, pending.meta.kernel, pending.meta.arch
            ),
        };
        let kept_in = fsx::unused_path(
            &kopt
                .run_dir(&pending.meta.run_id)
                .join("replaced")
                .join(label),
        );
        if let Err(e) = fsx::move_dir(&dest, &kept_in) {
            let _ = std::fs::remove_dir_all(&tmp);
            fsx::abandon(&tmp);
            return Err(e);
        }
        replaced = Some(Replaced {
            variant: old
                .as_ref()
                .map_or_else(|| "?".into(), |m| m.variant.clone()),
            run_id: old
                .as_ref()
                .map_or_else(|| "?".into(), |m| m.run_id.clone()),
            created_at: old.map_or_else(|| "?".into(), |m| m.created_at),
            kept_in,
        });
    }
    fsx::publish(&tmp, &dest)?;
    Ok(Saved {
        dir: dest,
        replaced,
    })
}

fn read_meta(dir: &Path) -> Result<PendingMeta> {
    let path = dir.join(PENDING_FILE);
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    serde_json::from_str(&text).map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))
}

/// Reads the pending variant stored in `dir`.
pub fn load_dir(dir: &Path) -> Result<PendingVariant> {
    let meta = read_meta(dir)?;
    let read = |name: &str| {
        let p = dir.join(name);
        std::fs::read_to_string(&p).map_err(io(&p))
    };
    let variant = VariantFile::parse(&read(files::VARIANT_FILE)?)
        .map_err(|e| Error::Invalid(format!("{}: {e}", dir.join(files::VARIANT_FILE).display())))?;
    let rationale = Rationale::parse(&read(files::RATIONALE_JSON)?).map_err(|e| {
        Error::Invalid(format!(
            "{}: {e}",
            dir.join(files::RATIONALE_JSON).display()
        ))
    })?;
    let ptx = match &meta.ptx {
        Some(_) => Some(read(files::PTX_FILE)?),
        None => None,
    };
    let p = PendingVariant {
        meta,
        source: read(files::SOURCE_FILE)?,
        variant,
        rationale,
        ptx,
    };
    p.validate()?;
    Ok(p)
}

/// The pending variant of a kernel for an architecture, when it has one (winners of
/// several regions: [`list`] them, or [`load_dir`] the [`dir_of`] one).
pub fn load(kopt: &KoptDir, package: &str, kernel: &str, arch: &str) -> Result<PendingVariant> {
    load_dir(&the_one_dir(kopt, package, kernel, arch)?)
}

/// The one pending folder of a kernel for an architecture.
fn the_one_dir(kopt: &KoptDir, package: &str, kernel: &str, arch: &str) -> Result<PathBuf> {
    let slots: Vec<PathBuf> = sorted_subdirs(&kopt.pending_root().join(package).join(kernel))
        .into_iter()
        .filter(|d| {
            d.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n == arch || n.starts_with(&format!("{arch}@")))
        })
        .collect();
    match slots.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(Error::NotFound(format!(
            "no pending variant of `{kernel}` ({package}) for {arch}; `cargo kopt pending` lists them"
        ))),
        several => Err(Error::Invalid(format!(
            "{} pending variants of `{kernel}` ({package}) for {arch}, winners of different regions; `cargo kopt pending` lists them",
            several.len()
        ))),
    }
}

/// Every pending variant, sorted by package, kernel and architecture, and the folders
/// that cannot be read (with why).
#[derive(Debug, Default)]
pub struct Listing {
    pub variants: Vec<PendingVariant>,
    pub broken: Vec<(PathBuf, String)>,
}

pub fn list(kopt: &KoptDir) -> Listing {
    list_root(&kopt.pending_root())
}

/// Every pending variant under a pending area's root (`<target>/kopt/pending`, or a copy
/// of one brought from another machine).
pub fn list_root(root: &Path) -> Listing {
    let mut out = Listing::default();
    for pkg in sorted_subdirs(root) {
        for kernel in sorted_subdirs(&pkg) {
            fsx::clean_leftovers(&kernel);
            for arch in sorted_subdirs(&kernel) {
                match load_dir(&arch) {
                    Ok(p) => out.variants.push(p),
                    Err(e) => out.broken.push((arch, e.to_string())),
                }
            }
        }
    }
    // Within a kernel and architecture, the winner of every shape first: accepted in
    // this order (`accept --all`), each region's winner is then placed before it.
    out.variants.sort_by(|a, b| {
        (
            a.meta.package.as_str(),
            a.meta.kernel.as_str(),
            arch_order(&a.meta.arch),
            &a.meta.region,
        )
            .cmp(&(
                b.meta.package.as_str(),
                b.meta.kernel.as_str(),
                arch_order(&b.meta.arch),
                &b.meta.region,
            ))
    });
    out
}

fn arch_order(arch: &str) -> u32 {
    files::parse_arch(arch).map_or(u32::MAX, |(a, b)| a * 10 + b)
}

/// Visible subfolders, by name (hidden ones are temporary or trash).
fn sorted_subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.path().is_dir() && !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// Deletes a pending variant (atomically: no reader sees half of it).
pub fn remove(kopt: &KoptDir, package: &str, kernel: &str, arch: &str) -> Result<()> {
    fsx::remove_dir_atomic(&the_one_dir(kopt, package, kernel, arch)?)
}

/// Moves a pending variant into its run's folder under `subfolder` (`rejected`, ...),
/// where the run's audit trail keeps it; returns where.
pub fn archive(kopt: &KoptDir, pending: &PendingVariant, subfolder: &str) -> Result<PathBuf> {
    let dir = dir_of(kopt, &pending.meta);
    let m = &pending.meta;
    let to = fsx::unused_path(&kopt.run_dir(&m.run_id).join(subfolder).join(format!(
        "{}.{}.{}.{}",
        m.package, m.kernel, m.arch, m.variant
    )));
    fsx::move_dir(&dir, &to)?;
    Ok(to)
}

/// A pending variant's figures in brief: the lowest and highest speedup over its shapes.
pub fn speedup_range(r: &Rationale) -> Option<(f64, f64)> {
    let s: Vec<f64> = r
        .figures
        .iter()
        .map(|f| f.speedup())
        .filter(|s| s.is_finite())
        .collect();
    if s.is_empty() {
        return None;
    }
    Some((
        s.iter().copied().fold(f64::INFINITY, f64::min),
        s.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    ))
}
