//! The commands as library functions: each returns data; the CLI renders it.

use std::collections::BTreeMap;
use std::path::Path;

use kopt_spec::files::{
    self, Claim, ClaimedFiles, LockEntry, LockFile, Rationale, VariantFile, VerifiedBy,
};
use kopt_spec::selection::{self, Problem, Unusable};
use kopt_spec::source;
use kopt_spec::spec::shape_label;
use serde::Serialize;

use crate::gather::{rel, Gathered, Kernel};

// ---------------------------------------------------------------------------------------
// list

#[derive(Debug, Serialize)]
pub struct ListedKernel {
    pub package: String,
    pub kernel: String,
    pub source: String,
    pub reference: String,
    pub entry: String,
    pub shapes: Vec<String>,
    pub tunables: Vec<String>,
    pub variants: Vec<ListedVariant>,
}

#[derive(Debug, Serialize)]
pub struct ListedVariant {
    pub arch: String,
    /// The device the entry is keyed by, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// `sm_90`, or `NVIDIA H200 (sm_90)`.
    pub key: String,
    pub variant: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// `active`, `stale` or `corrupt`.
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub verified_by: VerifiedBy,
}

pub fn list(g: &Gathered) -> Vec<ListedKernel> {
    g.kernels
        .iter()
        .map(|k| ListedKernel {
            package: k.package.clone(),
            kernel: k.spec.name.clone(),
            source: format!("{}:{}", k.file, k.line),
            reference: k.spec.reference.clone(),
            entry: k.spec.entry.clone(),
            shapes: k.spec.shapes.iter().map(shape_label).collect(),
            tunables: k
                .spec
                .tunables
                .iter()
                .map(|t| {
                    format!(
                        "{}={} in [{}]",
                        t.name,
                        t.default,
                        t.values
                            .iter()
                            .map(|v| v.to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    )
                })
                .collect(),
            variants: k
                .state
                .entries
                .iter()
                .map(|e| {
                    let (status, reason) = match &e.status {
                        Ok(_) => ("active", None),
                        Err(Unusable::Stale(m)) => ("stale", Some(m.clone())),
                        Err(Unusable::Corrupt(m)) => ("corrupt", Some(m.clone())),
                    };
                    ListedVariant {
                        arch: e.entry.arch.clone(),
                        device: e.entry.device.clone(),
                        key: e.entry.key(),
                        variant: e.entry.variant.clone(),
                        region: e.entry.region.clone(),
                        status,
                        reason,
                        verified_by: e.entry.verified_by,
                    }
                })
                .collect(),
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// check

/// What `check` found: problems fail it; notes do not (folders kopt cannot vouch for,
/// which no lock entry names).
#[derive(Debug, Default, Serialize)]
pub struct Checked {
    pub problems: Vec<Problem>,
    /// `package::kernel: note`.
    pub notes: Vec<String>,
}

/// Every problem of the committed files and annotations; no problem means the check
/// passes. Every variant folder is checked against its own audit record, not only those
/// a lock names (`kopt_spec::selection::audit_variant_folders`).
pub fn check(g: &Gathered) -> Checked {
    let mut notes = Vec::new();
    let mut problems = Vec::new();
    for e in &g.errors {
        problems.push(Problem {
            kernel: "?".into(),
            path: format!("{}/{}:{}:{}", e.package, e.file, e.line, e.column),
            problem: format!("the #[kopt::kernel] annotation is invalid: {}", e.message),
            fix: "fix the annotation (`cargo build` shows the same error at the offending token)"
                .into(),
        });
    }
    for k in &g.kernels {
        problems.extend(k.state.problems.iter().cloned());
        let audit = selection::audit_variant_folders(&k.crate_root, &k.spec.name, &k.state);
        problems.extend(audit.problems);
        notes.extend(
            audit
                .notes
                .into_iter()
                .map(|n| format!("{}::{}: {n}", k.package, k.spec.name)),
        );
    }
    // Folders of kernels that no longer exist (renamed or removed launchers).
    for pkg in &g.packages {
        let Ok(entries) = std::fs::read_dir(pkg.root.join("kopt")) else {
            continue;
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for name in names {
            let known = g
                .kernels
                .iter()
                .any(|k| k.package == pkg.name && k.spec.name == name);
            let broken = g.errors.iter().any(|e| e.package == pkg.name);
            if !known && !broken {
                problems.push(Problem {
                    kernel: name.clone(),
                    path: format!("{}/kopt/{name}", pkg.name),
                    problem: format!("no #[kopt::kernel] named `{name}` exists in `{}` (renamed or removed?)", pkg.name),
                    fix: format!("rename the folder after the kernel's new name, or remove it (`git rm -r kopt/{name}`)"),
                });
            }
        }
    }
    Checked { problems, notes }
}

// ---------------------------------------------------------------------------------------
// pin and revert

#[derive(Debug, thiserror::Error)]
pub enum EditError {
    #[error("no #[kopt::kernel] named `{0}` in the selected packages (see `cargo kopt list`)")]
    NoKernel(String),
    #[error("several packages have a kernel named `{0}`: choose one with `-p`")]
    Ambiguous(String),
    #[error("{0}")]
    Invalid(String),
    #[error("cannot write {path}: {error}")]
    Io { path: String, error: std::io::Error },
}

pub fn find<'a>(g: &'a Gathered, kernel: &str) -> Result<&'a Kernel, EditError> {
    let mut it = g.kernels.iter().filter(|k| k.spec.name == kernel);
    let first = it
        .next()
        .ok_or_else(|| EditError::NoKernel(kernel.into()))?;
    if it.next().is_some() {
        return Err(EditError::Ambiguous(kernel.into()));
    }
    Ok(first)
}

/// What an edit of a lock file did, for the report.
#[derive(Debug, Serialize)]
pub struct Edit {
    pub kernel: String,
    pub lock: String,
    pub summary: String,
}

fn load_lock(k: &Kernel) -> Result<(LockFile, bool), EditError> {
    let path = k.state.dir.join(files::LOCK_FILE);
    match std::fs::read_to_string(&path) {
        Ok(t) => LockFile::parse(&t).map(|l| (l, false)).map_err(|e| {
            EditError::Invalid(format!(
                "{}: {e}; restore it from version control first",
                rel(&k.crate_root, &path)
            ))
        }),
        Err(_) => Ok((LockFile::new(&k.spec.name), true)),
    }
}

fn write(path: &Path, text: &str, root: &Path) -> Result<(), EditError> {
    files::write_atomic(path, text.as_bytes()).map_err(|error| EditError::Io {
        path: rel(root, path),
        error,
    })
}

/// Cargo tracks the files the macro read. A lock file that did not exist at the last
/// build was not among them, so creating one must also touch a file that was: the
/// reference source (only its modification time changes).
fn touch_reference(k: &Kernel) {
    if let Some(first) = k.reference.files.first() {
        if let Ok(f) = std::fs::File::options().append(true).open(first) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
    }
}

/// Records a hand-made variant (already in `kopt/<kernel>/<variant>/`, with its
/// rationale.json) in the lock file for `arch`, with today's hashes and `verified_by =
/// "manual"`; records the person's claim, with the hashes of the variant's files, in
/// rationale.json (unless it holds kopt's claim for these very files) and renders
/// RATIONALE.md from it.
pub fn pin(
    k: &Kernel,
    variant: &str,
    arch: &str,
    device: Option<&str>,
    region: Option<&str>,
) -> Result<Edit, EditError> {
    if device.is_some_and(|d| d.trim().is_empty()) {
        return Err(EditError::Invalid(
            "--device needs the device's name as the driver gives it (`NVIDIA H200`; `cargo kopt devices` lists them)".into(),
        ));
    }
    if files::parse_arch(arch).is_none() {
        return Err(EditError::Invalid(format!(
            "`{arch}` is not an architecture name; write e.g. `sm_90`"
        )));
    }
    if let Some(r) = region {
        k.spec
            .parse_region(r)
            .map_err(|e| EditError::Invalid(format!("region {e}")))?;
    }
    let vdir = k.state.dir.join(variant);
    let relv = rel(&k.crate_root, &vdir);
    let read = |name: &str| {
        std::fs::read_to_string(vdir.join(name))
            .map_err(|e| EditError::Invalid(format!("{relv}/{name}: {e}")))
    };
    let src = read(files::SOURCE_FILE)?;
    let vtext = read(files::VARIANT_FILE)?;
    let v = VariantFile::parse(&vtext)
        .map_err(|e| EditError::Invalid(format!("{relv}/{}: {e}", files::VARIANT_FILE)))?;
    if v.kernel != k.spec.name || v.id != variant {
        return Err(EditError::Invalid(format!(
            "{relv}/{} says kernel `{}` variant `{}`; expected `{}` and `{variant}`",
            files::VARIANT_FILE,
            v.kernel,
            v.id,
            k.spec.name
        )));
    }
    if !source::may_define_entry(&src, &v.entry) {
        return Err(EditError::Invalid(format!(
            "{relv}/{} defines no __global__ function `{}`",
            files::SOURCE_FILE,
            v.entry
        )));
    }
    // `check` requires an audit record of every accepted variant: refuse now rather than
    // record a lock entry that `check` then calls broken.
    let json_path = vdir.join(files::RATIONALE_JSON);
    let text = match std::fs::read_to_string(&json_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(EditError::Invalid(format!(
                "{relv} has no {json}: every accepted variant needs its audit record (what it changes, why, how it was checked, where it was measured; `cargo kopt check` requires it, and RATIONALE.md is rendered from it). Write {relv}/{json}, starting from this (replace every <...>; the fields are described in kopt's book, docs/book/src/reference/file-formats.md), then pin again:\n{}",
                Rationale::skeleton(&k.spec.name, variant, arch).to_json(),
                json = files::RATIONALE_JSON,
            )))
        }
        Err(e) => {
            return Err(EditError::Invalid(format!(
                "{relv}/{}: {e}",
                files::RATIONALE_JSON
            )))
        }
    };
    let mut r = Rationale::parse(&text)
        .map_err(|e| EditError::Invalid(format!("{relv}/{}: {e}", files::RATIONALE_JSON)))?;
    if r.kernel != k.spec.name || r.variant != variant {
        return Err(EditError::Invalid(format!(
            "{relv}/{} describes `{}/{}`; write `\"kernel\": \"{}\"` and `\"variant\": \"{variant}\"` in it (a copied folder keeps its old names)",
            files::RATIONALE_JSON,
            r.kernel,
            r.variant,
            k.spec.name
        )));
    }
    if r.provenance.from_fake_device() {
        return Err(EditError::Invalid(format!(
            "{relv}/{} says the variant was measured on kopt's fake device (`{}`: `KOPT_WORKER=fake`, whose times and results are made up), and `cargo kopt check` fails on a lock entry whose evidence came from it; measure it on a real {arch} GPU and record that device in `provenance.device`",
            files::RATIONALE_JSON,
            r.provenance.device
        )));
    }
    let (mut lock, created) = load_lock(k)?;
    // The person vouches for these very files: their hashes go into the claim, so that the
    // folder stays tamper-evident (and can come back with `revert --to`) after the lock no
    // longer names it. A claim of kopt's own verification of these files is kept.
    let ptx = std::fs::read_to_string(vdir.join(files::PTX_FILE)).ok();
    let kept = r.claim.as_ref().is_some_and(|c| {
        c.verified_by == VerifiedBy::Kopt
            && c.compare_files(&src, &vtext, ptx.as_deref()) == ClaimedFiles::Match
    });
    // The PTX kopt verified with these files runs where it was compiled for.
    let kept_ptx = r
        .claim
        .as_ref()
        .filter(|_| kept)
        .and_then(|c| c.ptx.clone())
        .filter(|p| files::parse_arch(&p.arch) == files::parse_arch(arch));
    if !kept {
        let claim = Claim {
            region: region.map(str::to_string),
            device: device.map(str::to_string),
            verified_by: VerifiedBy::Manual,
            reference_hash: k.hashes.reference.clone(),
            spec_hash: k.hashes.spec.clone(),
            source_hash: Some(source::hash(src.as_bytes())),
            variant_hash: Some(source::hash(vtext.as_bytes())),
            // A person vouches for the source: the launcher compiles it.
            ptx: None,
        };
        if r.claim.as_ref() != Some(&claim) {
            r.claim = Some(claim);
            write(&json_path, &r.to_json(), &k.crate_root)?;
        }
    }
    write(
        &vdir.join(files::RATIONALE_MD),
        &r.render_markdown(),
        &k.crate_root,
    )?;
    let entry = LockEntry {
        arch: arch.to_string(),
        device: device.map(str::to_string),
        variant: variant.to_string(),
        region: region.map(str::to_string),
        verified_by: VerifiedBy::Manual,
        reference_hash: k.hashes.reference.clone(),
        spec_hash: k.hashes.spec.clone(),
        source_hash: source::hash(src.as_bytes()),
        variant_hash: source::hash(vtext.as_bytes()),
        ptx: kept_ptx,
    };
    let key = entry.key();
    let summary = match lock
        .accepted
        .iter_mut()
        .find(|e| e.same_key(&entry) && e.variant == variant)
    {
        Some(e) => {
            *e = entry;
            format!("re-pinned `{variant}` for {key}")
        }
        None => {
            lock.accepted.push(entry);
            format!("pinned `{variant}` for {key}")
        }
    };
    let path = k.state.dir.join(files::LOCK_FILE);
    write(&path, &lock.render(), &k.crate_root)?;
    if created {
        touch_reference(k);
    }
    Ok(Edit {
        kernel: k.spec.name.clone(),
        lock: rel(&k.crate_root, &path),
        summary,
    })
}

/// Drops the accepted variants of a kernel (for one architecture, or all): the reference
/// runs instead. The variant folders stay (they are the audit trail until removed in a
/// commit).
pub fn revert(k: &Kernel, arch: Option<&str>) -> Result<Edit, EditError> {
    let path = k.state.dir.join(files::LOCK_FILE);
    if !path.exists() {
        return Err(EditError::Invalid(format!(
            "`{}` has no accepted variant: the reference already runs everywhere",
            k.spec.name
        )));
    }
    let (mut lock, _) = load_lock(k)?;
    let before = lock.accepted.len();
    let mut dropped: BTreeMap<String, Vec<String>> = BTreeMap::new();
    lock.accepted.retain(|e| {
        let drop = arch.is_none_or(|a| a == e.arch);
        if drop {
            dropped
                .entry(e.arch.clone())
                .or_default()
                .push(e.variant.clone());
        }
        !drop
    });
    if lock.accepted.len() == before {
        return Err(EditError::Invalid(format!(
            "`{}` has no accepted variant for {}",
            k.spec.name,
            arch.unwrap_or("any architecture")
        )));
    }
    // The lock stays, empty if need be, so that cargo keeps tracking it.
    write(&path, &lock.render(), &k.crate_root)?;
    let summary = dropped
        .iter()
        .map(|(a, vs)| format!("{a}: dropped {}", vs.join(", ")))
        .collect::<Vec<_>>()
        .join("; ");
    Ok(Edit {
        kernel: k.spec.name.clone(),
        lock: rel(&k.crate_root, &path),
        summary: format!("{summary}; the reference runs there now"),
    })
}
