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
    /// The PTX its verification loaded (`kernel.ptx`, matching the lock entry's record),
    /// for the launcher to load without NVRTC; `None` for a variant without one.
    pub ptx: Option<VerifiedPtx>,
}

/// A lock entry's `kernel.ptx` and its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedPtx {
    pub text: String,
    pub record: files::PtxRecord,
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
    /// The entries that may run on a device of `arch` named `device` (`None`: a device
    /// kopt does not know by name), in the order they are tried: those keyed by that
    /// device first, then those of the whole architecture, each in lock order.
    pub fn usable_for<'a>(
        &'a self,
        arch: &'a str,
        device: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a LockEntry, &'a UsableVariant)> + 'a {
        let usable = move |group: u8| {
            self.entries
                .iter()
                .filter(move |e| e.entry.try_group(arch, device) == Some(group))
                .filter_map(|e| e.status.as_ref().ok().map(|u| (&e.entry, u)))
        };
        usable(0).chain(usable(1))
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
    // Its arguments must name what the annotation declares, and its tensor maps compile
    // under its defines.
    spec.version_args(variant.args.as_deref())
        .map_err(|m| corrupt(format!("arguments: {m}")))?;
    for m in &spec.tensor_maps {
        let fields = m
            .dims
            .iter()
            .chain(m.box_dims.iter())
            .chain(m.strides.iter().flatten())
            .chain(m.element_strides.iter().flatten());
        for e in fields {
            spec.compile_expr(e, &defines)
                .map_err(|err| corrupt(format!("tensor map `{}`: `{e}`: {err}", m.name)))?;
        }
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
    let ptx = resolve_ptx(entry, vdir, tracked)?;
    Ok(UsableVariant {
        variant,
        source: src,
        region,
        ptx,
    })
}

/// The entry's `kernel.ptx`, where the lock records one: present, matching its hash.
/// (A `kernel.ptx` the lock does not name is not read: it cannot run.)
fn resolve_ptx(
    entry: &LockEntry,
    vdir: &Path,
    tracked: &mut Vec<PathBuf>,
) -> Result<Option<VerifiedPtx>, Unusable> {
    let corrupt = |m: String| Unusable::Corrupt(m);
    let Some(record) = &entry.ptx else {
        return Ok(None);
    };
    let path = vdir.join(files::PTX_FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| corrupt(format!("cannot read {}: {e}", files::PTX_FILE)))?;
    tracked.push(path);
    if source::hash(text.as_bytes()) != record.hash {
        return Err(corrupt(format!(
            "{} does not match the hash in the lock file (edited after it was accepted)",
            files::PTX_FILE
        )));
    }
    if files::parse_arch(&record.arch) != files::parse_arch(&entry.arch) {
        return Err(corrupt(format!(
            "its {} was compiled for `{}`, not for the entry's {}",
            files::PTX_FILE,
            record.arch,
            entry.arch
        )));
    }
    Ok(Some(VerifiedPtx {
        text,
        record: record.clone(),
    }))
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
    if let Ok(r) = &r {
        if r.provenance.from_fake_device() {
            problems.push(fake_evidence_problem(
                kernel,
                entry,
                &r.provenance.device,
                rel_dir,
            ));
        }
    }
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

/// A lock entry whose evidence was measured on kopt's fake device: simulated figures and
/// verdicts vouch for nothing on a real architecture.
fn fake_evidence_problem(kernel: &str, entry: &LockEntry, device: &str, rel_dir: &str) -> Problem {
    Problem {
        kernel: kernel.to_string(),
        path: rel_dir.to_string(),
        problem: format!(
            "variant `{}` for {} rests on evidence from kopt's fake device (`{device}` in its {}: `KOPT_WORKER=fake`, whose times and results are simulated), not from a GPU",
            entry.variant,
            entry.arch,
            files::RATIONALE_JSON
        ),
        fix: format!(
            "`cargo kopt revert {kernel} --arch {}` drops it; optimise on a real {} GPU (without KOPT_WORKER=fake) and accept that winner instead",
            entry.arch, entry.arch
        ),
    }
}

/// What [`audit_variant_folders`] found besides problems: folders whose files kopt cannot
/// vouch for, which do not fail the check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FolderAudit {
    pub problems: Vec<Problem>,
    pub notes: Vec<String>,
}

/// The variant folders under `kopt/<kernel>/`, by name: visible subfolders (kopt's own
/// temporary folders start with `.`).
pub fn variant_folders(kernel_dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(kernel_dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    names
}

/// Checks every variant folder of a kernel against its own audit record, not only those
/// the lock names: a superseded folder is kept for `cargo kopt revert --to`, which would
/// re-activate whatever it holds, so an edit there must not go unseen.
///
/// For each folder: its `rationale.json` must parse and name this kernel and variant,
/// `RATIONALE.md` must be its rendering, and the files must be the ones its claim's
/// hashes say were verified (the file that differs is named). A folder the lock names and
/// [`resolve`] already reported is skipped (one problem per folder). Folders kopt cannot
/// vouch for are notes, not problems: no `rationale.json` (a hand-made variant not yet
/// pinned), no claim, or a claim written before kopt recorded file hashes; the lock's own
/// hashes cover such a folder while the lock names it.
pub fn audit_variant_folders(crate_root: &Path, kernel: &str, state: &KernelState) -> FolderAudit {
    let mut out = FolderAudit::default();
    let rel = |p: &Path| -> String {
        p.strip_prefix(crate_root)
            .unwrap_or(p)
            .components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/")
    };
    // An unreadable lock is already a problem, and it leaves no way to tell which
    // folders it named: every folder is then checked as if unreferenced.
    let named: Vec<&str> = state
        .lock
        .iter()
        .flat_map(|l| l.accepted.iter().map(|e| e.variant.as_str()))
        .collect();
    for name in variant_folders(&state.dir) {
        let vdir = state.dir.join(&name);
        let rel_dir = rel(&vdir);
        if state.problems.iter().any(|p| p.path == rel_dir) {
            continue;
        }
        let in_lock = named.contains(&name.as_str());
        let restore = format!("restore it from version control (`git checkout -- {rel_dir}`)");
        let problem = |problem: String, fix: String| Problem {
            kernel: kernel.to_string(),
            path: rel_dir.clone(),
            problem,
            fix,
        };
        if !files::is_valid_variant_name(&name) {
            out.notes.push(format!(
                "{rel_dir}: `{name}` is not a variant name (letters, digits, `-`, `_`, `.`), so no lock entry can name it; kopt ignores it"
            ));
            continue;
        }
        let json_path = vdir.join(files::RATIONALE_JSON);
        let text = match std::fs::read_to_string(&json_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !in_lock => {
                out.notes.push(format!(
                    "{rel_dir} has no {} and no lock entry names it (a hand-made variant not yet pinned?): `cargo kopt pin` needs the audit record first",
                    files::RATIONALE_JSON
                ));
                continue;
            }
            Err(e) => {
                out.problems.push(problem(
                    format!(
                        "the audit record of variant `{name}` is broken: {} cannot be read: {e}",
                        files::RATIONALE_JSON
                    ),
                    restore,
                ));
                continue;
            }
        };
        let r = match Rationale::parse(&text) {
            Ok(r) => r,
            Err(e) => {
                out.problems.push(problem(
                    format!(
                        "the audit record of variant `{name}` is broken: {} cannot be read: {e}",
                        files::RATIONALE_JSON
                    ),
                    restore,
                ));
                continue;
            }
        };
        if r.kernel != kernel || r.variant != name {
            out.problems.push(problem(
                format!(
                    "the audit record of variant `{name}` is broken: {} describes `{}/{}`",
                    files::RATIONALE_JSON,
                    r.kernel,
                    r.variant
                ),
                restore,
            ));
            continue;
        }
        match std::fs::read_to_string(vdir.join(files::RATIONALE_MD)) {
            Ok(md) if md == r.render_markdown() => {}
            Ok(_) => {
                out.problems.push(problem(
                    format!(
                        "the audit record of variant `{name}` is broken: {} does not match {} (one was edited without the other)",
                        files::RATIONALE_MD,
                        files::RATIONALE_JSON
                    ),
                    restore,
                ));
                continue;
            }
            Err(e) => {
                out.problems.push(problem(
                    format!(
                        "the audit record of variant `{name}` is broken: {} cannot be read: {e}",
                        files::RATIONALE_MD
                    ),
                    restore,
                ));
                continue;
            }
        }
        let Some(claim) = &r.claim else {
            if !in_lock {
                out.notes.push(format!(
                    "{rel_dir} is unverifiable: its {} records no claim (what it was verified as), so an edit of its files would go unseen and `cargo kopt revert --to` refuses it; `cargo kopt gc` lists it",
                    files::RATIONALE_JSON
                ));
            }
            continue;
        };
        let read = |file: &str| {
            std::fs::read_to_string(vdir.join(file))
                .map_err(|e| format!("{file} cannot be read: {e}"))
        };
        let (source, variant_text) = match (read(files::SOURCE_FILE), read(files::VARIANT_FILE)) {
            (Ok(s), Ok(v)) => (s, v),
            (Err(e), _) | (_, Err(e)) => {
                out.problems.push(problem(
                    format!("variant folder `{name}` is incomplete: {e}"),
                    restore,
                ));
                continue;
            }
        };
        let ptx = std::fs::read_to_string(vdir.join(files::PTX_FILE)).ok();
        match claim.compare_files(&source, &variant_text, ptx.as_deref()) {
            files::ClaimedFiles::Match => {}
            files::ClaimedFiles::Differs(file) => out.problems.push(problem(
                format!(
                    "{rel_dir}/{file} is not the file variant `{name}` was verified with: its hash differs from the one the claim in {} records (edited after it was accepted){}",
                    files::RATIONALE_JSON,
                    if in_lock { "" } else { "; `cargo kopt revert --to` would re-activate the edited code" }
                ),
                format!(
                    "restore it (`git checkout -- {rel_dir}/{file}`); to keep the edit, verify it as a new variant (`cargo kopt optimize {kernel}`), or copy it to a new folder and vouch for it with `cargo kopt pin`"
                ),
            )),
            files::ClaimedFiles::Unrecorded => {
                if !in_lock {
                    out.notes.push(format!(
                        "{rel_dir} is unverifiable: its claim was written before kopt recorded the hashes of kernel.cu and variant.toml, so an edit of them would go unseen and `cargo kopt revert --to` refuses it; `cargo kopt gc` lists it"
                    ));
                }
            }
        }
    }
    out
}

/// Which lock entry (if any) runs on a device of `arch` named `device` for `args`: the
/// first usable one, in [`KernelState::usable_for`]'s order, whose region and
/// build-dependent constraints hold ([`applies`]), as the generated launcher decides.
pub fn select<'a>(
    state: &'a KernelState,
    spec: &KernelSpec,
    arch: &'a str,
    device: Option<&'a str>,
    args: &[i64],
) -> Option<(&'a LockEntry, &'a UsableVariant)> {
    state
        .usable_for(arch, device)
        .find(|(e, u)| applies(spec, e, u, args))
}

/// Whether a usable entry's variant runs for `args`: its region and the constraints that
/// depend on its build ([`KernelSpec::variant_applies`]) hold, and its tensor maps encode
/// ([`KernelSpec::maps_problem`]). A predicate that cannot be evaluated counts as "no", as
/// in the launcher.
pub fn applies(spec: &KernelSpec, entry: &LockEntry, u: &UsableVariant, args: &[i64]) -> bool {
    let defines = &u.variant.defines;
    if spec
        .maps_problem(u.variant.args.as_deref(), defines, args)
        .is_some()
    {
        return false;
    }
    let region = entry.region.as_deref().unwrap_or_default();
    match spec.variant_applies(u.region.as_ref().map(|r| (region, r)), defines) {
        None => true,
        Some((_, r)) => spec
            .compile_expr(&r, defines)
            .ok()
            .and_then(|p| expr::eval(&p, args).ok())
            .is_some_and(|v| v != 0),
    }
}

/// A shape kopt knows a kernel by, for deciding which version runs where: declared, or
/// one of the held-out shapes drawn whatever the seed.
#[derive(Debug, Clone, PartialEq)]
pub struct KnownShape {
    pub label: String,
    pub held_out: bool,
    /// The scalar arguments, in declaration order.
    pub args: Vec<i64>,
}

/// The declared shapes, then the seed-independent held-out shapes of the reference's
/// build ([`crate::shapes::seed_independent_held_out_shapes`]): the same list on every
/// machine, so a region map drawn over it is reproducible.
pub fn known_shapes(spec: &KernelSpec) -> Vec<KnownShape> {
    let declared = spec.shapes.iter().map(|s| KnownShape {
        label: crate::spec::shape_label(s),
        held_out: false,
        args: spec.shape_args(s),
    });
    let held_out = crate::shapes::seed_independent_held_out_shapes(
        spec,
        &spec.default_defines(),
        None,
        crate::shapes::held_out_byte_cap(spec),
    )
    .into_iter()
    .map(|c| KnownShape {
        args: spec.value_args(&c.values),
        label: c.label,
        held_out: true,
    });
    declared.chain(held_out).collect()
}

/// Where a new entry goes among the entries of its key (its architecture, and its device
/// or none) and which of them it replaces. It is tried before all of them, so it takes
/// over every shape where it applies; an entry it replaces is one that would then never
/// run on a known shape: it applies on at least one, and the new entry on all of those.
/// An entry kopt cannot evaluate (stale or corrupt) is replaced when the new one applies
/// everywhere or claims the same region text. Entries of other keys are untouched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The entries of the key it replaces, in lock order.
    pub replaces: Vec<LockEntry>,
}

/// Plans placing `new` (whose variant is `usable`) into the lock `state` resolved.
pub fn place(
    state: &KernelState,
    spec: &KernelSpec,
    new: &LockEntry,
    usable: &UsableVariant,
    shapes: &[KnownShape],
) -> Placement {
    let new_runs: Vec<bool> = shapes
        .iter()
        .map(|s| applies(spec, new, usable, &s.args))
        .collect();
    let replaces = state
        .entries
        .iter()
        .filter(|r| r.entry.same_key(new))
        .filter(|r| match &r.status {
            Ok(u) => {
                let mut runs = shapes
                    .iter()
                    .zip(&new_runs)
                    .filter(|(s, _)| applies(spec, &r.entry, u, &s.args))
                    .peekable();
                runs.peek().is_some() && runs.all(|(_, covered)| *covered)
            }
            Err(_) => new.region.is_none() || new.region == r.entry.region,
        })
        .map(|r| r.entry.clone())
        .collect();
    Placement { replaces }
}

impl Placement {
    /// The lock with the placement applied: the replaced entries removed and `new` put
    /// before the remaining entries of its key, where the first of them or of the
    /// replaced ones was (at the end when there were none).
    pub fn apply(&self, lock: &mut LockFile, new: &LockEntry) {
        let at = self.position(lock.accepted.iter(), new);
        lock.accepted.retain(|e| !self.replaces.contains(e));
        lock.accepted.insert(at, new.clone());
    }

    /// [`Placement::apply`] to a resolved state: what the build will resolve after it.
    pub fn applied(
        &self,
        state: &KernelState,
        new: &LockEntry,
        usable: &UsableVariant,
    ) -> KernelState {
        let mut after = state.clone();
        let at = self.position(after.entries.iter().map(|r| &r.entry), new);
        after.entries.retain(|r| !self.replaces.contains(&r.entry));
        after.entries.insert(
            at,
            ResolvedEntry {
                entry: new.clone(),
                status: Ok(usable.clone()),
            },
        );
        after
    }

    /// Where `new` goes once the replaced entries are out of `entries`: at the first
    /// entry of its key, counted among those that stay.
    fn position<'a>(&self, entries: impl Iterator<Item = &'a LockEntry>, new: &LockEntry) -> usize {
        let mut kept = 0;
        for e in entries {
            if e.same_key(new) {
                return kept;
            }
            if !self.replaces.contains(e) {
                kept += 1;
            }
        }
        kept
    }
}

/// Which version runs on each known shape, on a device of `arch` named `device`: for
/// review, before and after an accept.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RegionRow {
    pub shape: String,
    pub held_out: bool,
    /// `reference` or the variant's name.
    pub before: String,
    pub after: String,
}

/// The region map of `state` and of `state` with `new` placed (`placement`), over `shapes`,
/// on a device of the new entry's architecture (and device, when it names one).
pub fn region_map(
    state: &KernelState,
    spec: &KernelSpec,
    new: (&LockEntry, &UsableVariant),
    placement: &Placement,
    shapes: &[KnownShape],
) -> Vec<RegionRow> {
    let (entry, usable) = new;
    let after = placement.applied(state, entry, usable);
    let device = entry.device.as_deref();
    let runs = |state: &KernelState, args: &[i64]| {
        select(state, spec, &entry.arch, device, args)
            .map_or("reference".to_string(), |(e, _)| e.variant.clone())
    };
    shapes
        .iter()
        .map(|s| RegionRow {
            shape: s.label.clone(),
            held_out: s.held_out,
            before: runs(state, &s.args),
            after: runs(&after, &s.args),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::{Claim, VerifiedBy};

    const SRC: &str = "__global__ void k_v() {}\n";
    const TOML: &str = "format = 1\n";

    /// A variant folder as kopt writes it; `hashes`: whether its claim records the files'.
    fn folder(kdir: &Path, name: &str, claim: Option<bool>) -> PathBuf {
        let d = kdir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(files::SOURCE_FILE), SRC).unwrap();
        std::fs::write(d.join(files::VARIANT_FILE), TOML).unwrap();
        let mut r = Rationale::skeleton("k", name, "sm_90");
        r.claim = claim.map(|hashes| Claim {
            region: None,
            device: None,
            verified_by: VerifiedBy::Kopt,
            reference_hash: "sha256:r".into(),
            spec_hash: "sha256:s".into(),
            source_hash: hashes.then(|| source::hash(SRC.as_bytes())),
            variant_hash: hashes.then(|| source::hash(TOML.as_bytes())),
            ptx: None,
        });
        std::fs::write(d.join(files::RATIONALE_JSON), r.to_json()).unwrap();
        std::fs::write(d.join(files::RATIONALE_MD), r.render_markdown()).unwrap();
        d
    }

    fn state(kdir: &Path, lock_names: &[&str], problems: Vec<Problem>) -> KernelState {
        let mut lock = LockFile::new("k");
        for v in lock_names {
            lock.accepted.push(LockEntry {
                arch: "sm_90".into(),
                device: None,
                variant: v.to_string(),
                region: None,
                verified_by: VerifiedBy::Kopt,
                reference_hash: "sha256:r".into(),
                spec_hash: "sha256:s".into(),
                source_hash: source::hash(SRC.as_bytes()),
                variant_hash: source::hash(TOML.as_bytes()),
                ptx: None,
            });
        }
        KernelState {
            dir: kdir.to_path_buf(),
            lock: Some(lock),
            entries: Vec::new(),
            tracked: Vec::new(),
            problems,
        }
    }

    #[test]
    fn every_folder_is_checked_against_its_own_claim() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        let kdir = files::kernel_dir(root, "k");
        folder(&kdir, "accepted", Some(true));
        folder(&kdir, "intact", Some(true));
        let edited = folder(&kdir, "edited", Some(true));
        std::fs::write(edited.join(files::SOURCE_FILE), "// edited\n").unwrap();
        let retuned = folder(&kdir, "retuned", Some(true));
        std::fs::write(retuned.join(files::VARIANT_FILE), "format = 1\n# edited\n").unwrap();
        folder(&kdir, "older", Some(false));
        folder(&kdir, "unclaimed", None);
        let md = folder(&kdir, "md-edited", Some(true));
        std::fs::write(md.join(files::RATIONALE_MD), "# by hand\n").unwrap();
        let bare = kdir.join("hand-made");
        std::fs::create_dir_all(&bare).unwrap();
        std::fs::create_dir_all(kdir.join(".x.kopt-tmp-1-1")).unwrap();
        // A folder the lock names and `resolve` already reported is not reported twice.
        let reported = folder(&kdir, "reported", Some(true));
        std::fs::write(reported.join(files::SOURCE_FILE), "// edited too\n").unwrap();
        let already = Problem {
            kernel: "k".into(),
            path: "kopt/k/reported".into(),
            problem: "corrupt".into(),
            fix: "restore".into(),
        };

        let audit = audit_variant_folders(
            root,
            "k",
            &state(&kdir, &["accepted", "reported"], vec![already]),
        );
        let problems: Vec<(&str, &str)> = audit
            .problems
            .iter()
            .map(|p| (p.path.as_str(), p.problem.as_str()))
            .collect();
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(
            problems[0].0 == "kopt/k/edited"
                && problems[0].1.starts_with(
                    "kopt/k/edited/kernel.cu is not the file variant `edited` was verified with"
                )
                && problems[0]
                    .1
                    .contains("`cargo kopt revert --to` would re-activate the edited code"),
            "{problems:#?}"
        );
        assert!(
            problems[1].0 == "kopt/k/md-edited"
                && problems[1].1.contains("RATIONALE.md does not match"),
            "{problems:#?}"
        );
        assert!(
            problems[2].0 == "kopt/k/retuned"
                && problems[2]
                    .1
                    .starts_with("kopt/k/retuned/variant.toml is not the file"),
            "{problems:#?}"
        );
        assert!(audit.problems[0]
            .fix
            .contains("git checkout -- kopt/k/edited/kernel.cu"));
        assert_eq!(audit.notes.len(), 3, "{:#?}", audit.notes);
        assert!(
            audit.notes[0].starts_with("kopt/k/hand-made has no rationale.json"),
            "{:#?}",
            audit.notes
        );
        assert!(
            audit.notes[1]
                .starts_with("kopt/k/older is unverifiable: its claim was written before"),
            "{:#?}",
            audit.notes
        );
        assert!(
            audit.notes[2].starts_with(
                "kopt/k/unclaimed is unverifiable: its rationale.json records no claim"
            ),
            "{:#?}",
            audit.notes
        );

        // The lock's own hashes cover a folder it names: no note for an older claim there.
        let audit =
            audit_variant_folders(root, "k", &state(&kdir, &["older", "unclaimed"], vec![]));
        assert!(
            !audit
                .notes
                .iter()
                .any(|n| n.contains("older") || n.contains("unclaimed")),
            "{:#?}",
            audit.notes
        );
        // A lock entry whose folder lacks its audit record is a problem, not a note.
        let audit = audit_variant_folders(root, "k", &state(&kdir, &["hand-made"], vec![]));
        assert!(
            audit.problems.iter().any(|p| p.path == "kopt/k/hand-made"
                && p.problem.contains("rationale.json cannot be read")),
            "{:#?}",
            audit.problems
        );
    }

    #[test]
    fn a_lock_entry_with_evidence_from_the_fake_device_is_a_problem() {
        let d = tempfile::tempdir().unwrap();
        let kdir = files::kernel_dir(d.path(), "k");
        let vdir = folder(&kdir, "v", Some(true));
        let mut r =
            Rationale::parse(&std::fs::read_to_string(vdir.join(files::RATIONALE_JSON)).unwrap())
                .unwrap();
        r.provenance.device = format!("{} (sm_90)", files::FAKE_DEVICE_NAME);
        std::fs::write(vdir.join(files::RATIONALE_JSON), r.to_json()).unwrap();
        std::fs::write(vdir.join(files::RATIONALE_MD), r.render_markdown()).unwrap();
        let st = state(&kdir, &["v"], vec![]);
        let mut problems = Vec::new();
        check_rationale(
            "k",
            &st.lock.as_ref().unwrap().accepted[0],
            &vdir,
            "kopt/k/v",
            &mut problems,
        );
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(
            problems[0]
                .problem
                .contains("rests on evidence from kopt's fake device (`kopt fake GPU (sm_90)`"),
            "{problems:#?}"
        );
        assert!(
            problems[0].fix.contains("cargo kopt revert k --arch sm_90"),
            "{problems:#?}"
        );
        // A real device's evidence is no problem.
        r.provenance.device = "NVIDIA H200 (sm_90)".into();
        std::fs::write(vdir.join(files::RATIONALE_JSON), r.to_json()).unwrap();
        std::fs::write(vdir.join(files::RATIONALE_MD), r.render_markdown()).unwrap();
        let mut problems = Vec::new();
        check_rationale(
            "k",
            &st.lock.as_ref().unwrap().accepted[0],
            &vdir,
            "kopt/k/v",
            &mut problems,
        );
        assert!(problems.is_empty(), "{problems:#?}");
    }
}
