//! Reading a kernel's committed files and deciding, for each lock entry, whether the
//! variant may run: the one decision the macro (at build time) and `cargo kopt check`
//! (in CI) must make identically.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::expr::{self, Ty, VarKind};
use crate::files::{self, LockEntry, LockFile, Rationale, VariantFile};
use crate::source::{self, Amalgamated};
use crate::spec::KernelSpec;

/// Why a lock entry cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unusable {
    /// Verified against another reference or spec: correct once, unproven now.
    Stale(String),
    /// The files do not match their hashes, or do not parse.
    Corrupt(String),
}

impl Unusable {
    pub fn describe(&self) -> String {
        match self {
            Unusable::Stale(m) => format!("stale: {m}"),
            Unusable::Corrupt(m) => format!("corrupt: {m}"),
        }
    }
}

/// A variant the build may embed, with everything needed to do so.
#[derive(Debug, Clone)]
pub struct UsableVariant {
    pub variant: VariantFile,
    pub source: String,
    /// The region's text and its parsed form.
    pub region: Option<expr::Expr>,
}

#[derive(Debug, Clone)]
pub struct ResolvedEntry {
    pub entry: LockEntry,
    pub status: Result<UsableVariant, Unusable>,
}

/// Something `cargo kopt check` reports: what is wrong, where, and the command that fixes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    pub kernel: String,
    pub path: String,
    pub problem: String,
    pub fix: String,
}

/// Everything known about a kernel's committed files.
#[derive(Debug, Clone)]
pub struct KernelState {
    pub dir: PathBuf,
    pub lock: Option<LockFile>,
    pub entries: Vec<ResolvedEntry>,
    /// Files read, which the build must track so that it reruns when they change.
    pub tracked: Vec<PathBuf>,
    pub problems: Vec<Problem>,
}

impl KernelState {
    /// The entries that may run on `arch`, in the order they are tried.
    pub fn usable_for<'a>(
        &'a self,
        arch: &'a str,
    ) -> impl Iterator<Item = (&'a LockEntry, &'a UsableVariant)> + 'a {
        self.entries
            .iter()
            .filter(move |e| e.entry.arch == arch)
            .filter_map(|e| e.status.as_ref().ok().map(|u| (&e.entry, u)))
    }

    /// Architectures named in the lock, sorted.
    pub fn archs(&self) -> Vec<String> {
        let mut a: Vec<String> = self.entries.iter().map(|e| e.entry.arch.clone()).collect();
        a.dedup();
        a.sort_by_key(|x| {
            files::parse_arch(x)
                .map(|(m, n)| m * 10 + n)
                .unwrap_or(u32::MAX)
        });
        a.dedup();
        a
    }
}

/// The hashes a lock entry must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hashes {
    pub reference: String,
    pub spec: String,
}

impl Hashes {
    pub fn of(spec: &KernelSpec, reference: &Amalgamated) -> Self {
        Hashes {
            reference: source::hash(reference.text.as_bytes()),
            spec: source::hash(spec.canonical_json().as_bytes()),
        }
    }
}

/// Reads `<crate>/kopt/<kernel>/` and resolves each lock entry. Never fails: a missing
/// folder means "no variants", and everything wrong becomes a [`Problem`] and an unusable
/// entry, so that the build falls back to the reference.
pub fn resolve(crate_root: &Path, spec: &KernelSpec, hashes: &Hashes) -> KernelState {
    let dir = files::kernel_dir(crate_root, &spec.name);
    let mut state = KernelState {
        dir: dir.clone(),
        lock: None,
        entries: Vec::new(),
        tracked: Vec::new(),
        problems: Vec::new(),
    };
    let rel = |p: &Path| -> String {
        p.strip_prefix(crate_root)
            .unwrap_or(p)
            .components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/")
    };
    let kernel = spec.name.clone();
    let lock_path = dir.join(files::LOCK_FILE);
    if !lock_path.exists() {
        return state;
    }
    state.tracked.push(lock_path.clone());
    let lock = match std::fs::read_to_string(&lock_path)
        .map_err(|e| e.to_string())
        .and_then(|t| LockFile::parse(&t))
    {
        Ok(l) => l,
        Err(e) => {
            state.problems.push(Problem {
                kernel: kernel.clone(),
                path: rel(&lock_path),
                problem: format!("the lock file cannot be read: {e}; every variant of `{kernel}` is ignored and the reference runs"),
                fix: format!("restore it from version control (`git checkout -- {}`), or delete it to drop every variant", rel(&lock_path)),
            });
            return state;
        }
    };
    if lock.kernel != spec.name {
        state.problems.push(Problem {
            kernel: kernel.clone(),
            path: rel(&lock_path),
            problem: format!(
                "the lock file names kernel `{}`, but it sits in the folder of `{kernel}`",
                lock.kernel
            ),
            fix: format!(
                "restore it from version control (`git checkout -- {}`)",
                rel(&lock_path)
            ),
        });
        state.lock = Some(lock);
        return state;
    }
    for entry in &lock.accepted {
        let vdir = dir.join(&entry.variant);
        let revert = format!(
            "`cargo kopt revert {kernel} --arch {}` drops it (the reference runs meanwhile)",
            entry.arch
        );
        let status = resolve_entry(spec, hashes, entry, &vdir, &mut state.tracked);
        if let Err(why) = &status {
            let (problem, fix) = match why {
                Unusable::Stale(m) => (
                    format!("variant `{}` for {} is stale: {m}; the build uses the reference", entry.variant, entry.arch),
                    format!("re-verify the variant against the new reference and accept it again, or {revert}"),
                ),
                Unusable::Corrupt(m) => (
                    format!("variant `{}` for {} is corrupt: {m}; the build uses the reference", entry.variant, entry.arch),
                    format!("restore `{}` from version control (`git checkout -- {}`), or {revert}", rel(&vdir), rel(&vdir)),
                ),
            };
            state.problems.push(Problem {
                kernel: kernel.clone(),
                path: rel(&vdir),
                problem,
                fix,
            });
        } else {
            check_rationale(&kernel, entry, &vdir, &rel(&vdir), &mut state.problems);
        }
        state.entries.push(ResolvedEntry {
            entry: entry.clone(),
            status,
        });
    }
    state.lock = Some(lock);
    state
}

fn resolve_entry(
    spec: &KernelSpec,
    hashes: &Hashes,
    entry: &LockEntry,
    vdir: &Path,
    tracked: &mut Vec<PathBuf>,
) -> Result<UsableVariant, Unusable> {
    let corrupt = |m: String| Unusable::Corrupt(m);
    if files::parse_arch(&entry.arch).is_none() {
        return Err(corrupt(format!(
            "`{}` is not an architecture name (expected e.g. `sm_90`)",
            entry.arch
        )));
    }
    if !files::is_valid_variant_name(&entry.variant) {
        return Err(corrupt(format!(
            "`{}` is not a valid variant name",
            entry.variant
        )));
    }
    let vpath = vdir.join(files::VARIANT_FILE);
    let spath = vdir.join(files::SOURCE_FILE);
    let read = |p: &Path| -> Result<String, Unusable> {
        std::fs::read_to_string(p).map_err(|e| {
            corrupt(format!(
                "cannot read {}: {}",
                p.file_name().unwrap().to_string_lossy(),
                e
            ))
        })
    };
    let vtext = read(&vpath)?;
    tracked.push(vpath.clone());
    let src = read(&spath)?;
    tracked.push(spath.clone());
    if source::hash(src.as_bytes()) != entry.source_hash {
        return Err(corrupt(format!(
            "{} does not match the hash in the lock file (edited after it was accepted)",
            files::SOURCE_FILE
        )));
    }
    if source::hash(vtext.as_bytes()) != entry.variant_hash {
        return Err(corrupt(format!(
            "{} does not match the hash in the lock file (edited after it was accepted)",
            files::VARIANT_FILE
        )));
    }
    let variant =
        VariantFile::parse(&vtext).map_err(|e| corrupt(format!("{}: {e}", files::VARIANT_FILE)))?;
    if variant.kernel != spec.name || variant.id != entry.variant {
        return Err(corrupt(format!(
            "{} describes `{}/{}`, not `{}/{}`",
            files::VARIANT_FILE,
            variant.kernel,
            variant.id,
            spec.name,
            entry.variant
        )));
    }
    if entry.reference_hash != hashes.reference {
        return Err(Unusable::Stale(
            "the reference source (or one of its includes) changed since it was verified".into(),
        ));
    }
    if entry.spec_hash != hashes.spec {
        return Err(Unusable::Stale(
            "the #[kopt::kernel] annotation changed since it was verified".into(),
        ));
    }
    // Expressions must parse and name only scalars and this variant's defines.
    let define_names: Vec<&str> = variant.defines.keys().map(|k| k.as_str()).collect();
    let kinds = |n: &str| -> Option<VarKind> {
        spec.scalars()
            .find(|s| s.name == n)
            .map(|s| {
                if s.ty.is_float() {
                    VarKind::Float
                } else {
                    VarKind::Int
                }
            })
            .or_else(|| define_names.contains(&n).then_some(VarKind::Int))
    };
    let defines: BTreeMap<String, i64> = variant.defines.clone();
    let launch = &variant.launch;
    for (_, e) in launch.exprs() {
        let text = e.to_string();
        let mut names = spec.int_names();
        names.extend(define_names.iter().map(|s| s.to_string()));
        expr::parse_str(&text, Ty::Int, &kinds, &names)
            .map_err(|m| corrupt(format!("launch rule: {m}")))?;
        spec.compile_expr(e, &defines)
            .map_err(|m| corrupt(format!("launch rule `{text}`: {m}")))?;
    }
    // The launcher computes these arguments under the variant's launch rule and defines.
    for c in spec.computed_args() {
        spec.computed_program(c, launch, &defines)
            .map_err(|m| corrupt(format!("launch rule: {m}")))?;
    }
    let region = entry
        .region
        .as_deref()
        .map(|r| {
            spec.parse_region(r)
                .map_err(|m| corrupt(format!("region: {m}")))
        })
        .transpose()?;
    if !source::may_define_entry(&src, &variant.entry) {
        return Err(corrupt(format!(
            "{} defines no `__global__` function `{}`",
            files::SOURCE_FILE,
            variant.entry
        )));
    }
    Ok(UsableVariant {
        variant,
        source: src,
        region,
    })
}

/// The audit files must exist and agree; they do not affect which kernel runs.
fn check_rationale(
    kernel: &str,
    entry: &LockEntry,
    vdir: &Path,
    rel_dir: &str,
    problems: &mut Vec<Problem>,
) {
    let json = vdir.join(files::RATIONALE_JSON);
    let md = vdir.join(files::RATIONALE_MD);
    let r = std::fs::read_to_string(&json)
        .map_err(|e| e.to_string())
        .and_then(|t| Rationale::parse(&t));
    let problem = match r {
        Err(e) => Some(format!("{} cannot be read: {e}", files::RATIONALE_JSON)),
        Ok(r) if r.kernel != kernel || r.variant != entry.variant => Some(format!(
            "{} describes `{}/{}`",
            files::RATIONALE_JSON,
            r.kernel,
            r.variant
        )),
        Ok(r) => match std::fs::read_to_string(&md) {
            Err(e) => Some(format!("{} cannot be read: {e}", files::RATIONALE_MD)),
            Ok(text) if text != r.render_markdown() => Some(format!(
                "{} does not match {} (one was edited without the other)",
                files::RATIONALE_MD,
                files::RATIONALE_JSON
            )),
            Ok(_) => None,
        },
    };
    if let Some(p) = problem {
        problems.push(Problem {
            kernel: kernel.to_string(),
            path: rel_dir.to_string(),
            problem: format!(
                "the audit record of variant `{}` is broken: {p}",
                entry.variant
            ),
            fix: format!("restore it from version control (`git checkout -- {rel_dir}`)"),
        });
    }
}

/// Which lock entry (if any) runs for `arch` and `args`: the first usable one whose region
/// and build-dependent constraints hold ([`KernelSpec::variant_applies`]), as the
/// generated launcher decides. A predicate that cannot be evaluated counts as "no".
pub fn select<'a>(
    state: &'a KernelState,
    spec: &KernelSpec,
    arch: &'a str,
    args: &[i64],
) -> Option<(&'a LockEntry, &'a UsableVariant)> {
    state.usable_for(arch).find(|(e, u)| {
        let defines = &u.variant.defines;
        let region = e.region.as_deref().unwrap_or_default();
        match spec.variant_applies(u.region.as_ref().map(|r| (region, r)), defines) {
            None => true,
            Some((_, r)) => spec
                .compile_expr(&r, defines)
                .ok()
                .and_then(|p| expr::eval(&p, args).ok())
                .is_some_and(|v| v != 0),
        }
    })
}
