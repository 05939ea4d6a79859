//! The store commands (`pending`, `accept`, `reject`, `revert --to`, `cases`) as library
//! functions returning data, over `kopt_store`; cargo-kopt's `cmd::store` renders them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kopt_spec::files;
use kopt_store::accept::{self, Accepted, KernelTarget, Reactivated, Rejected};
use kopt_store::cases::{self, Case, CaseLibrary, Status, VariantCase};
use kopt_store::pending::{self, PendingVariant};
use kopt_store::{review, KoptDir};
use serde::Serialize;

use crate::gather::{self, Gathered, Kernel};

/// The store of the gathered workspace (`<target>/kopt`).
pub fn kopt_dir(g: &Gathered) -> KoptDir {
    KoptDir::new(&g.target_dir)
}

/// What `kopt_store` needs to know of a gathered kernel.
pub fn target(k: &Kernel) -> KernelTarget<'_> {
    KernelTarget {
        package: &k.package,
        crate_root: &k.crate_root,
        spec: &k.spec,
        hashes: &k.hashes,
        reference: &k.reference,
    }
}

/// The gathered kernel a pending variant is for.
pub fn kernel_of<'g>(g: &'g Gathered, p: &PendingVariant) -> Option<&'g Kernel> {
    g.kernels
        .iter()
        .find(|k| k.package == p.meta.package && k.spec.name == p.meta.kernel)
}

// ---------------------------------------------------------------------------------------
// pending

/// A pending variant, for `cargo kopt pending`.
#[derive(Debug, Serialize)]
pub struct PendingRow {
    pub package: String,
    pub kernel: String,
    pub arch: String,
    pub variant: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    pub verified_by: files::VerifiedBy,
    pub created_at: String,
    pub run_id: String,
    /// Lowest and highest speedup over its shapes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speedup: Option<(f64, f64)>,
    /// `ready`, `stale`, `conflict`, `invalid`, `fake-device` (measured on the fake device:
    /// never accepted) or `orphan` (its kernel is gone).
    pub status: &'static str,
    /// Why it cannot be accepted as it is, when it cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The accepted variants accepting it would replace.
    pub replaces: Vec<String>,
    pub dir: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct PendingReport {
    pub pending: Vec<PendingRow>,
    /// Folders of the pending area that cannot be read, with why.
    pub broken: Vec<(PathBuf, String)>,
}

pub fn pending_report(g: &Gathered) -> PendingReport {
    let kopt = kopt_dir(g);
    let listing = pending::list(&kopt);
    let selected: Vec<&str> = g.packages.iter().map(|p| p.name.as_str()).collect();
    let pending = listing
        .variants
        .iter()
        .filter(|p| selected.contains(&p.meta.package.as_str()))
        .map(|p| {
            let (status, reason, replaces) = match kernel_of(g, p) {
                None => (
                    "orphan",
                    Some(format!(
                        "no #[kopt::kernel] named `{}` in `{}` any more; reject it",
                        p.meta.kernel, p.meta.package
                    )),
                    Vec::new(),
                ),
                Some(k) => {
                    match accept::plan_accept(&target(k), &kopt, p, accept::AcceptAs::default()) {
                        Ok(plan) => (
                            "ready",
                            None,
                            plan.replaces
                                .iter()
                                .map(|r| r.entry.variant.clone())
                                .collect(),
                        ),
                        Err(e) => (
                            match e {
                                _ if p.rationale.provenance.from_fake_device() => "fake-device",
                                kopt_store::Error::Stale(_) => "stale",
                                kopt_store::Error::Conflict(_) => "conflict",
                                _ => "invalid",
                            },
                            Some(e.to_string()),
                            Vec::new(),
                        ),
                    }
                }
            };
            PendingRow {
                package: p.meta.package.clone(),
                kernel: p.meta.kernel.clone(),
                arch: p.meta.arch.clone(),
                variant: p.meta.variant.clone(),
                region: p.meta.region.clone(),
                verified_by: p.meta.verified_by,
                created_at: p.meta.created_at.clone(),
                run_id: p.meta.run_id.clone(),
                speedup: pending::speedup_range(&p.rationale),
                status,
                reason,
                replaces,
                dir: pending::dir_of(&kopt, &p.meta),
            }
        })
        .collect();
    PendingReport {
        pending,
        broken: listing.broken,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreCmdError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Store(#[from] kopt_store::Error),
}

/// The pending variants a command works on: those of `kernel` (all of the workspace
/// when `None`), on `arch` if given. Several need `all`, so that one command never
/// accepts more than was asked for.
pub fn select_pending(
    g: &Gathered,
    kernel: Option<&str>,
    arch: Option<&str>,
    all: bool,
) -> Result<Vec<PendingVariant>, StoreCmdError> {
    if let Some(a) = arch {
        if files::parse_arch(a).is_none() {
            return Err(StoreCmdError::Usage(format!(
                "`{a}` is not an architecture name; write e.g. `sm_90`"
            )));
        }
    }
    let selected_packages: Vec<&str> = g.packages.iter().map(|p| p.name.as_str()).collect();
    let chosen: Vec<PendingVariant> = pending::list(&kopt_dir(g))
        .variants
        .into_iter()
        .filter(|p| selected_packages.contains(&p.meta.package.as_str()))
        .filter(|p| kernel.is_none_or(|k| p.meta.kernel == k))
        .filter(|p| arch.is_none_or(|a| p.meta.arch == a))
        .collect();
    let what = match (kernel, arch) {
        (Some(k), Some(a)) => format!("`{k}` for {a}"),
        (Some(k), None) => format!("`{k}`"),
        (None, Some(a)) => format!("any kernel for {a}"),
        (None, None) => "any kernel".into(),
    };
    if chosen.is_empty() {
        return Err(StoreCmdError::Usage(format!(
            "no pending variant of {what}; `cargo kopt pending` lists them"
        )));
    }
    if chosen.len() > 1 && !all {
        let names = chosen
            .iter()
            .map(|p| p.label())
            .collect::<Vec<_>>()
            .join(", ");
        let narrow = if kernel.is_some() && arch.is_some() {
            "they are winners of different regions: pass --all (each is placed for its region), or decide one at a time with `cargo kopt review`"
        } else {
            "name a KERNEL and --arch, or pass --all"
        };
        return Err(StoreCmdError::Usage(format!(
            "{} pending variants of {what} ({names}): {narrow}",
            chosen.len()
        )));
    }
    Ok(chosen)
}

// ---------------------------------------------------------------------------------------
// accept and reject

/// One accepted variant, and what the case library made of it.
#[derive(Debug, Serialize)]
pub struct AcceptReport {
    pub accepted: Accepted,
    /// What it replaced, with each one's state before: `online-vec4 (sm_90, where cols %
    /// 4 == 0; active)`.
    pub replaced: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub case: Option<String>,
}

/// Accepts each pending variant in turn (stopping at the first that cannot be); records
/// each in the case library when one is given.
pub fn accept_pending(
    g: &Gathered,
    chosen: &[PendingVariant],
    how: accept::AcceptAs,
    mut lib: Option<&mut CaseLibrary>,
) -> Result<Vec<AcceptReport>, StoreCmdError> {
    if how.name.is_some() && chosen.len() > 1 {
        return Err(StoreCmdError::Usage(
            "--as names one variant: choose one KERNEL and --arch".into(),
        ));
    }
    let kopt = kopt_dir(g);
    let mut out = Vec::new();
    for p in chosen {
        let k = kernel_of(g, p).ok_or_else(|| {
            StoreCmdError::Usage(format!(
                "pending variant {} is for a kernel that no longer exists; reject it with `cargo kopt reject {} --arch {}`",
                p.label(),
                p.meta.kernel,
                p.meta.arch
            ))
        })?;
        let t = target(k);
        let plan = accept::plan_accept(&t, &kopt, p, how)?;
        let replaced = plan.replaces.iter().map(describe_replaced).collect();
        let accepted = accept::apply_accept(&t, &kopt, &plan)?;
        let case = lib
            .as_deref_mut()
            .map(|l| record_case(g, k, &plan.pending, Status::Accepted, l));
        out.push(AcceptReport {
            accepted,
            replaced,
            case: case.and_then(Result::ok),
        });
    }
    Ok(out)
}

pub fn describe_replaced(r: &accept::ReplacedVariant) -> String {
    let region = r
        .entry
        .region
        .as_ref()
        .map(|x| format!(", where `{x}`"))
        .unwrap_or_default();
    let verified = match r.entry.verified_by {
        files::VerifiedBy::Kopt => "kopt",
        files::VerifiedBy::Manual => "manual",
    };
    format!(
        "`{}` ({}{region}; verified by {verified}; {})",
        r.entry.variant, r.entry.arch, r.status
    )
}

#[derive(Debug, Serialize)]
pub struct RejectReport {
    pub rejected: Rejected,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub case: Option<String>,
}

pub fn reject_pending(
    g: &Gathered,
    chosen: &[PendingVariant],
    reason: Option<&str>,
    mut lib: Option<&mut CaseLibrary>,
) -> Result<Vec<RejectReport>, StoreCmdError> {
    let kopt = kopt_dir(g);
    let mut out = Vec::new();
    for p in chosen {
        // Recorded first: once rejected, the candidate leaves the pending area.
        let case = match (kernel_of(g, p), lib.as_deref_mut()) {
            (Some(k), Some(l)) => record_case(g, k, p, Status::Rejected, l).ok(),
            _ => None,
        };
        let rejected = accept::reject(&kopt, p, reason)?;
        out.push(RejectReport { rejected, case });
    }
    Ok(out)
}

/// The repository's name in case ids: the workspace folder's name.
pub fn repo_name(g: &Gathered) -> String {
    g.workspace_root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "workspace".into())
}

/// Records a reviewed pending variant in the case library; returns the case id.
pub fn record_case(
    g: &Gathered,
    k: &Kernel,
    p: &PendingVariant,
    status: Status,
    lib: &mut CaseLibrary,
) -> Result<String, kopt_store::Error> {
    let repo = repo_name(g);
    let mut id = cases::case_id(
        &repo,
        &k.package,
        &k.spec.name,
        &p.meta.variant,
        &p.meta.arch,
    );
    if status != Status::Accepted {
        id = format!("{id}#{}", p.meta.run_id);
    }
    // The features describe the version that was optimised: the accepted variant it was
    // measured against when there is one, else the reference.
    let baseline_source = p.meta.baseline.as_ref().and_then(|b| {
        std::fs::read_to_string(
            files::kernel_dir(&k.crate_root, &k.spec.name)
                .join(&b.variant)
                .join(files::SOURCE_FILE),
        )
        .ok()
    });
    let before =
        baseline_source.unwrap_or_else(|| review::reference_for_display(&k.reference.text));
    let case = cases::case_from_rationale(&VariantCase {
        id: id.clone(),
        repo: Some(&repo),
        krate: &k.package,
        kind: p.meta.kind.as_deref(),
        rationale: &p.rationale,
        before_source: &before,
        status,
        failure_class: (status == Status::Rejected).then(|| "review".to_string()),
    });
    lib.upsert(&case)?;
    Ok(id)
}

// ---------------------------------------------------------------------------------------
// revert --to VARIANT

pub fn revert_to(
    g: &Gathered,
    k: &Kernel,
    variant: &str,
    arch: Option<&str>,
) -> Result<Reactivated, kopt_store::Error> {
    accept::reactivate(&target(k), &kopt_dir(g), variant, arch)
}

// ---------------------------------------------------------------------------------------
// gc

/// What `cargo kopt gc` did with one folder no lock entry names.
#[derive(Debug, Serialize)]
pub struct GcFolder {
    pub package: String,
    #[serde(flatten)]
    pub folder: kopt_store::gc::Unreferenced,
    /// `unreferenced` (listed only), `removed`, `kept` (see `kept`), or `failed` (see
    /// `error`).
    pub action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct GcReport {
    /// Whether folders were removed (`--delete`) or only listed.
    pub delete: bool,
    pub folders: Vec<GcFolder>,
    /// Kernels whose folders were left alone, with why (a lock file that cannot be read).
    pub skipped: Vec<String>,
}

impl GcReport {
    pub fn failed(&self) -> bool {
        !self.skipped.is_empty() || self.folders.iter().any(|f| f.action == "failed")
    }
}

/// `cargo kopt gc [KERNEL...] [--delete]`: the variant folders of the selected kernels
/// (all when `kernels` is empty) that no lock entry names, removed with `delete`.
pub fn gc(g: &Gathered, kernels: &[String], delete: bool) -> GcReport {
    let mut report = GcReport {
        delete,
        folders: Vec::new(),
        skipped: Vec::new(),
    };
    for k in &g.kernels {
        if !kernels.is_empty() && !kernels.contains(&k.spec.name) {
            continue;
        }
        let found = match kopt_store::gc::unreferenced(&k.crate_root, &k.spec.name) {
            Ok(f) => f,
            Err(e) => {
                report
                    .skipped
                    .push(format!("{}::{}: {e}", k.package, k.spec.name));
                continue;
            }
        };
        for folder in found {
            let (action, error) = match (&folder.kept, delete) {
                (Some(_), _) => ("kept", None),
                (None, false) => ("unreferenced", None),
                (None, true) => match kopt_store::gc::remove(&k.crate_root, &folder) {
                    Ok(()) => ("removed", None),
                    Err(e) => ("failed", Some(e.to_string())),
                },
            };
            report.folders.push(GcFolder {
                package: k.package.clone(),
                folder,
                action,
                error,
            });
        }
    }
    report
}

// ---------------------------------------------------------------------------------------
// cases

/// Parses `--metric name=value`.
pub fn parse_metrics(items: &[String]) -> Result<BTreeMap<String, f64>, StoreCmdError> {
    let mut out = BTreeMap::new();
    for item in items {
        let Some((name, value)) = item.split_once('=') else {
            return Err(StoreCmdError::Usage(format!(
                "`--metric {item}`: write NAME=VALUE, e.g. `--metric dram_throughput_pct=47.5`"
            )));
        };
        let v: f64 = value
            .trim()
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite())
            .ok_or_else(|| {
                StoreCmdError::Usage(format!("`--metric {item}`: `{value}` is not a number"))
            })?;
        out.insert(name.trim().to_string(), v);
    }
    Ok(out)
}

/// The query of `cargo kopt cases search`: `--metric NAME=VALUE`s, words, and the words of
/// a source file, of one kind of case if given; something to compare is required.
pub fn case_query(
    metrics: &[String],
    text: Option<String>,
    source: Option<&Path>,
    kind: Option<String>,
) -> Result<cases::Query, StoreCmdError> {
    let mut q = cases::Query {
        kind: kind.clone(),
        metrics: parse_metrics(metrics)?,
        text: text.unwrap_or_default(),
        ..Default::default()
    };
    if let Some(k) = kind
        .as_deref()
        .filter(|k| !kopt_store::features::is_kind(k))
    {
        return Err(StoreCmdError::Usage(format!(
            "kind `{k}` is unknown; use one of {}",
            kopt_store::features::KINDS.join(", ")
        )));
    }
    if let Some(src) = source {
        let t = query_text_of_source(src)?;
        q.text = format!("{} {t}", q.text);
    }
    if q.metrics.is_empty() && q.text.trim().is_empty() {
        return Err(StoreCmdError::Usage(
            "give something to compare: --metric NAME=VALUE, --text WORDS or --source FILE".into(),
        ));
    }
    Ok(q)
}

/// The text of a search for a CUDA source file: its structural summary and identifiers.
pub fn query_text_of_source(path: &Path) -> Result<String, StoreCmdError> {
    let src = std::fs::read_to_string(path)
        .map_err(|e| StoreCmdError::Usage(format!("{}: {e}", path.display())))?;
    Ok(kopt_store::features::search_text(&src))
}

/// Where `cases import PATH` reads: a file (another library, or JSON lines), or a
/// repository.
pub enum ImportSource {
    File(PathBuf),
    Repository(PathBuf),
}

/// What `cargo kopt merge` did.
#[derive(Debug, Serialize)]
pub struct MergeOutcome {
    pub pending: kopt_store::merge::MergeReport,
    /// Each case library imported, with what the import did.
    pub cases: Vec<(PathBuf, cases::ImportReport)>,
    /// Case libraries found but not imported (`--no-cases`).
    pub cases_skipped: Vec<PathBuf>,
}

/// `cargo kopt merge DIR...`: the pending variants of every DIR (see
/// `kopt_store::merge::pending_root_in`), all or none, then the case libraries found at
/// their roots into `library` (skipped when `None`).
pub fn merge(
    g: &Gathered,
    dirs: &[PathBuf],
    mut library: Option<&mut CaseLibrary>,
) -> Result<MergeOutcome, StoreCmdError> {
    let mut roots = Vec::new();
    let mut libraries = Vec::new();
    for dir in dirs {
        if !dir.is_dir() {
            return Err(StoreCmdError::Usage(format!(
                "{} is not a folder; give the folders copied back from the other machines (their target folder, its kopt/ folder, or a pending area)",
                dir.display()
            )));
        }
        let root = kopt_store::merge::pending_root_in(dir);
        let found = kopt_store::merge::case_libraries_in(dir);
        if root.is_none() && found.is_empty() {
            return Err(StoreCmdError::Usage(format!(
                "{} holds neither pending variants (looked for target/kopt/pending, kopt/pending, pending, or PACKAGE/KERNEL/ARCH/pending.json folders) nor a case library (cases.sqlite or cases.jsonl); nothing was merged",
                dir.display()
            )));
        }
        roots.extend(root);
        libraries.extend(found);
    }
    let pending = kopt_store::merge::merge_pending(&kopt_dir(g), &roots)?;
    let mut out = MergeOutcome {
        pending,
        cases: Vec::new(),
        cases_skipped: Vec::new(),
    };
    for path in libraries {
        match library.as_deref_mut() {
            Some(lib) => {
                let r = kopt_store::merge::import_cases(lib, &path)?;
                out.cases.push((path, r));
            }
            None => out.cases_skipped.push(path),
        }
    }
    Ok(out)
}

/// Imports into the library; for a repository, the kernels' references come from its
/// annotations (gathered as `cargo kopt list` does) when its workspace can be read.
pub fn import_cases(
    lib: &mut CaseLibrary,
    path: &Path,
    repo_name: Option<String>,
) -> Result<(cases::ImportReport, Vec<String>), StoreCmdError> {
    let source = if path.is_file() {
        ImportSource::File(path.to_path_buf())
    } else {
        ImportSource::Repository(path.to_path_buf())
    };
    match source {
        ImportSource::File(file) => Ok((kopt_store::merge::import_cases(lib, &file)?, Vec::new())),
        ImportSource::Repository(repo) => {
            let mut notes = Vec::new();
            let mut references: BTreeMap<(PathBuf, String), String> = BTreeMap::new();
            let manifest = repo.join("Cargo.toml");
            if manifest.is_file() {
                match gather::gather(&gather::Selection {
                    manifest_path: Some(manifest),
                    ..Default::default()
                }) {
                    Ok(found) => {
                        for k in found.kernels {
                            let root = k.crate_root.canonicalize().unwrap_or(k.crate_root.clone());
                            references.insert(
                                (root, k.spec.name.clone()),
                                review::reference_for_display(&k.reference.text),
                            );
                        }
                    }
                    Err(e) => notes.push(format!(
                        "its annotations could not be read ({e}): cases describe the variants' own sources"
                    )),
                }
            } else {
                notes.push(
                    "no Cargo.toml at its root: cases describe the variants' own sources".into(),
                );
            }
            let lookup = |root: &Path, kernel: &str| {
                let root = root.canonicalize().unwrap_or(root.to_path_buf());
                references.get(&(root, kernel.to_string())).cloned()
            };
            let opts = cases::CommittedImport {
                repo_name,
                reference_source: &lookup,
            };
            Ok((lib.import_committed(&repo, &opts)?, notes))
        }
    }
}

/// A case, for `cases list`.
#[derive(Debug, Serialize)]
pub struct CaseRow<'a> {
    pub id: &'a str,
    pub kind: &'a str,
    pub bottleneck: &'a str,
    pub status: Status,
    pub speedup: Option<f64>,
}

pub fn case_rows(cases: &[Case]) -> Vec<CaseRow<'_>> {
    cases
        .iter()
        .map(|c| CaseRow {
            id: &c.id,
            kind: &c.kind,
            bottleneck: &c.diagnosis.bottleneck,
            status: c.outcome.status,
            speedup: c.outcome.speedup,
        })
        .collect()
}
