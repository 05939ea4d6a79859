//! Accepting a pending variant into the crate's committed files, rejecting it, and
//! re-activating an earlier variant.
//!
//! Accepting is planned first ([`plan_accept`]: refuses a stale or unusable variant, and
//! says which accepted variants it replaces, so that review can show them), then applied
//! ([`apply_accept`]) in an order a crash cannot break:
//!
//! 1. the variant's folder `kopt/<kernel>/<variant>/` is written under a hidden temporary
//!    name, synced, and renamed into place (a folder nothing refers to yet);
//! 2. `kopt.lock` is rewritten atomically: **the commit point**. Before it the build uses
//!    the old variants, after it the new one; it never sees a half-written state;
//! 3. the reference source is touched if the lock file is new (cargo tracks only files
//!    that existed at the last build), and the pending variant is moved into its run's
//!    folder (`runs/<run-id>/accepted/`).
//!
//! An accepted variant's files are never overwritten: a folder of the same name holding
//! other code is a conflict (accept under another name with `--as`).

use std::path::{Path, PathBuf};

use kopt_spec::files::{
    self, Claim, ClaimedFiles, LockEntry, LockFile, PtxRecord, Rationale, VariantFile, VerifiedBy,
};
use kopt_spec::selection::{self, Hashes, Placement, RegionRow, Unusable, UsableVariant};
use kopt_spec::source::{self, Amalgamated};
use kopt_spec::spec::KernelSpec;
use serde::Serialize;

use crate::journal::{self, Decision, Event};
use crate::layout::KoptDir;
use crate::pending::{self, PendingVariant};
use crate::{fsx, io, Error, Result};

/// The kernel a variant is for, as gathered from the workspace today.
#[derive(Debug, Clone, Copy)]
pub struct KernelTarget<'a> {
    pub package: &'a str,
    pub crate_root: &'a Path,
    pub spec: &'a KernelSpec,
    /// Today's hashes of the reference and the spec.
    pub hashes: &'a Hashes,
    /// Today's amalgamated reference (for diffs, and the files cargo tracks).
    pub reference: &'a Amalgamated,
}

impl KernelTarget<'_> {
    pub fn kernel(&self) -> &str {
        &self.spec.name
    }

    pub fn kernel_dir(&self) -> PathBuf {
        files::kernel_dir(self.crate_root, &self.spec.name)
    }

    fn lock_path(&self) -> PathBuf {
        self.kernel_dir().join(files::LOCK_FILE)
    }

    /// `kopt/softmax/kopt.lock`, relative to the crate root.
    pub fn rel(&self, p: &Path) -> String {
        p.strip_prefix(self.crate_root)
            .unwrap_or(p)
            .components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/")
    }

    /// The current lock file, or `None` when the kernel has none.
    fn read_lock(&self) -> Result<Option<LockFile>> {
        let path = self.lock_path();
        match std::fs::read_to_string(&path) {
            Ok(t) => LockFile::parse(&t).map(Some).map_err(|e| {
                Error::Invalid(format!(
                    "{}: {e}; restore it from version control first (`git checkout -- {}`)",
                    self.rel(&path),
                    self.rel(&path)
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path)(e)),
        }
    }
}

/// An accepted variant that an accept (or a re-activation) takes out of the lock file.
#[derive(Debug, Clone, Serialize)]
pub struct ReplacedVariant {
    pub entry: LockEntry,
    /// `active`, `stale` or `corrupt` today.
    pub status: String,
    /// Its kernel.cu, when it can be read (for the diff).
    #[serde(skip)]
    pub source: Option<String>,
    /// The first line of its rationale's summary.
    pub summary: Option<String>,
}

/// What happens to the variant's folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FolderAction {
    /// The folder is new.
    Create,
    /// The folder holds the same kernel.cu and variant.toml (the same variant verified
    /// again): only its audit files are rewritten.
    RefreshAudit,
}

/// How an accept names and keys the variant.
#[derive(Debug, Clone, Copy, Default)]
pub struct AcceptAs<'a> {
    /// Accept it under this name rather than its run's (`--as`).
    pub name: Option<&'a str>,
    /// Key the lock entry by the device the variant was measured on (its rationale's
    /// `provenance.device`, the driver's name), not by its architecture alone
    /// (`--device-specific`).
    pub device_specific: bool,
}

impl<'a> AcceptAs<'a> {
    /// Under another name, keyed by architecture.
    pub fn named(name: &'a str) -> Self {
        AcceptAs {
            name: Some(name),
            device_specific: false,
        }
    }
}

/// What accepting a pending variant will do, before it does it.
#[derive(Debug, Clone, Serialize)]
pub struct AcceptPlan {
    #[serde(skip)]
    pub pending: PendingVariant,
    /// The pending variant's own id, when it is accepted under another (`--as`).
    pub renamed_from: Option<String>,
    pub entry: LockEntry,
    /// The entries of its key (architecture, and device if any) that would never run on
    /// a known shape after it: they leave the lock.
    pub replaces: Vec<ReplacedVariant>,
    /// The entries of its key that stay, behind it: they run where it does not apply.
    pub keeps: Vec<String>,
    /// Which version runs on each declared and held-out shape, before and after.
    pub region_map: Vec<RegionRow>,
    #[serde(skip)]
    placement: Placement,
    pub folder: FolderAction,
    pub creates_lock: bool,
    /// Things a reviewer should know (e.g. it was measured against another variant than
    /// the one accepted now).
    pub notes: Vec<String>,
    /// The lock entries of the architecture when planned: applying refuses if they
    /// changed meanwhile.
    #[serde(skip)]
    arch_entries_when_planned: Vec<LockEntry>,
}

fn status_of(state: &selection::KernelState, e: &LockEntry) -> String {
    state
        .entries
        .iter()
        .find(|r| r.entry == *e)
        .map_or("missing".into(), |r| match &r.status {
            Ok(_) => "active".into(),
            Err(Unusable::Stale(m)) => format!("stale: {m}"),
            Err(Unusable::Corrupt(m)) => format!("corrupt: {m}"),
        })
}

fn replaced_variant(
    t: &KernelTarget,
    state: &selection::KernelState,
    e: &LockEntry,
) -> ReplacedVariant {
    let vdir = t.kernel_dir().join(&e.variant);
    ReplacedVariant {
        status: status_of(state, e),
        source: std::fs::read_to_string(vdir.join(files::SOURCE_FILE)).ok(),
        summary: std::fs::read_to_string(vdir.join(files::RATIONALE_JSON))
            .ok()
            .and_then(|t| Rationale::parse(&t).ok())
            .map(|r| r.summary),
        entry: e.clone(),
    }
}

/// Plans accepting `pending` (under `rename` if given): refuses it when it was verified
/// against another reference or annotation than today's, when the build could not use
/// it, or when its folder name is taken by other code.
pub fn plan_accept(
    t: &KernelTarget,
    kopt: &KoptDir,
    pending: &PendingVariant,
    how: AcceptAs,
) -> Result<AcceptPlan> {
    let rename = how.name;
    pending.validate()?;
    let m = &pending.meta;
    let kernel = t.kernel();
    if m.kernel != kernel || m.package != t.package {
        return Err(Error::Invalid(format!(
            "pending variant {} is not for `{kernel}` of `{}`",
            pending.label(),
            t.package
        )));
    }
    let reject_hint = format!(
        "or drop it with `cargo kopt reject {kernel} --arch {}`",
        m.arch
    );
    // Every architecture a pending variant can name is a real one (`validate` requires an
    // `sm_XY` name), and the fake device's figures are made up: nothing it measured can
    // vouch for a variant there.
    if pending.rationale.provenance.from_fake_device() {
        return Err(Error::Invalid(format!(
            "pending variant `{}` of `{kernel}` for {} was measured on kopt's fake device (`{}` in its rationale's provenance: `KOPT_WORKER=fake`, a simulated GPU whose times and results are made up), so nothing vouches for it on a real {} GPU and it cannot be accepted; optimise on a {} GPU without KOPT_WORKER=fake, {reject_hint}",
            m.variant, m.arch, pending.rationale.provenance.device, m.arch, m.arch
        )));
    }
    if m.reference_hash != t.hashes.reference {
        return Err(Error::Stale(format!(
            "pending variant `{}` of `{kernel}` for {} is stale: the reference source (or one of its includes) changed since run {} verified it, so its verification no longer holds; re-verify it against today's reference by optimising again (`cargo kopt optimize {kernel}`), {reject_hint}",
            m.variant, m.arch, m.run_id
        )));
    }
    if m.spec_hash != t.hashes.spec {
        return Err(Error::Stale(format!(
            "pending variant `{}` of `{kernel}` for {} is stale: the #[kopt::kernel] annotation changed since run {} verified it (shapes, tolerances or geometry may differ); re-verify it by optimising again (`cargo kopt optimize {kernel}`), {reject_hint}",
            m.variant, m.arch, m.run_id
        )));
    }
    let mut p = pending.clone();
    let mut renamed_from = None;
    if let Some(new) = rename.filter(|n| *n != m.variant) {
        if !files::is_valid_variant_name(new) {
            return Err(Error::Invalid(format!(
                "`{new}` is not a valid variant name (letters, digits, `-`, `_`, `.`)"
            )));
        }
        renamed_from = Some(m.variant.clone());
        p.meta.variant = new.to_string();
        p.variant.id = new.to_string();
        p.rationale.variant = new.to_string();
    }
    // The committed rationale records what it vouches for, the hashes of the variant's own
    // files included, so that the folder stays tamper-evident after the lock no longer names
    // it, and can be re-activated later (`cargo kopt revert --to`) while the reference and
    // annotation it was verified against are still today's.
    let variant_text = p.variant.render();
    let device = how
        .device_specific
        .then(|| p.rationale.provenance.device_name(&m.arch).to_string());
    if device.as_deref().is_some_and(|d| d.trim().is_empty()) {
        return Err(Error::Invalid(format!(
            "pending variant `{}` of `{kernel}` records no device in its rationale's provenance, so it cannot be keyed by one; accept it for {} (without --device-specific)",
            m.variant, m.arch
        )));
    }
    p.rationale.claim = Some(Claim {
        region: p.meta.region.clone(),
        device: device.clone(),
        verified_by: p.meta.verified_by,
        reference_hash: p.meta.reference_hash.clone(),
        spec_hash: p.meta.spec_hash.clone(),
        source_hash: Some(source::hash(p.source.as_bytes())),
        variant_hash: Some(source::hash(variant_text.as_bytes())),
        ptx: p.meta.ptx.clone(),
    });
    let entry = LockEntry {
        arch: p.meta.arch.clone(),
        device,
        variant: p.meta.variant.clone(),
        region: p.meta.region.clone(),
        verified_by: p.meta.verified_by,
        reference_hash: p.meta.reference_hash.clone(),
        spec_hash: p.meta.spec_hash.clone(),
        source_hash: source::hash(p.source.as_bytes()),
        variant_hash: source::hash(variant_text.as_bytes()),
        ptx: p.meta.ptx.clone(),
    };

    // The folder: new, or the same code verified again; anything else is a conflict.
    let vdir = t.kernel_dir().join(&entry.variant);
    let folder = if vdir.exists() {
        let same = std::fs::read_to_string(vdir.join(files::SOURCE_FILE))
            .ok()
            .as_deref()
            == Some(p.source.as_str())
            && std::fs::read_to_string(vdir.join(files::VARIANT_FILE))
                .ok()
                .as_deref()
                == Some(variant_text.as_str())
            && p.ptx.as_ref().is_none_or(|ptx| {
                std::fs::read_to_string(vdir.join(files::PTX_FILE))
                    .ok()
                    .as_ref()
                    == Some(ptx)
            });
        if !same {
            return Err(Error::Conflict(format!(
                "{} already holds another variant of that name (an accepted variant's files are never overwritten); accept this one under a new name: `cargo kopt accept {kernel} --arch {} --as {}-2`",
                t.rel(&vdir),
                entry.arch,
                entry.variant
            )));
        }
        FolderAction::RefreshAudit
    } else {
        FolderAction::Create
    };

    // The build must be able to use it: resolve it exactly as the macro will.
    check_usable(
        t,
        kopt,
        &entry,
        (&p.source, &variant_text, p.ptx.as_deref()),
        &p.rationale,
    )?;

    let lock = t.read_lock()?;
    let state = selection::resolve(t.crate_root, t.spec, t.hashes);
    let arch_entries: Vec<LockEntry> = lock
        .as_ref()
        .map(|l| l.entries_for(&entry.arch).cloned().collect())
        .unwrap_or_default();
    let (placement, region_map) = place(
        t,
        &state,
        &entry,
        (&p.variant, &p.source),
        m.retires.as_ref(),
    )?;
    let replaces: Vec<ReplacedVariant> = placement
        .replaces
        .iter()
        .map(|e| replaced_variant(t, &state, e))
        .collect();
    let keeps: Vec<String> = arch_entries
        .iter()
        .filter(|e| e.same_key(&entry) && !placement.replaces.contains(e))
        .map(|e| e.variant.clone())
        .collect();
    let mut notes = Vec::new();
    if !keeps.is_empty() {
        notes.push(format!(
            "{} stay{} for {}, behind it: {} where `{}` does not apply",
            keeps
                .iter()
                .map(|v| format!("`{v}`"))
                .collect::<Vec<_>>()
                .join(", "),
            if keeps.len() == 1 { "s" } else { "" },
            entry.key(),
            if keeps.len() == 1 {
                "it runs"
            } else {
                "they run"
            },
            entry.variant
        ));
    }
    if entry.device.is_none() {
        let keyed: Vec<String> = arch_entries
            .iter()
            .filter_map(|e| e.device.as_ref().map(|d| format!("`{}` on {d}", e.variant)))
            .collect();
        if !keyed.is_empty() {
            notes.push(format!(
                "entries keyed by device are tried before it on their device: {}",
                keyed.join(", ")
            ));
        }
    }
    if let Some(b) = m
        .retires
        .as_ref()
        .filter(|b| placement.replaces.iter().any(|e| e.variant == b.variant))
    {
        notes.push(format!(
            "it retires `{}`: the loop measured it no faster than the reference on the shapes where `{}` does not hold, so the reference runs those",
            b.variant,
            entry.region.as_deref().unwrap_or("true")
        ));
    }
    let accepted_now = arch_entries.iter().find(|e| e.same_key(&entry));
    // A narrowed start is the accepted variant itself: nothing to compare it with.
    let retires_now = accepted_now.is_some_and(|now| {
        m.retires
            .as_ref()
            .is_some_and(|b| b.source_hash == now.source_hash)
    });
    match (&p.meta.baseline, accepted_now.filter(|_| !retires_now)) {
        (Some(b), Some(now)) if b.source_hash != now.source_hash => notes.push(format!(
            "it had to beat `{}`, but `{}` is accepted for {} now: it was never compared with the latter (`cargo kopt bench` after accepting, or `cargo kopt optimize` again)",
            b.variant, now.variant, entry.arch
        )),
        (Some(b), None) => notes.push(format!(
            "it had to beat `{}`, which is no longer accepted for {}",
            b.variant, entry.arch
        )),
        (None, Some(now)) => notes.push(format!(
            "it was measured against the reference only, but `{}` is accepted for {} now: it may be slower than it",
            now.variant, entry.arch
        )),
        _ => {}
    }
    if renamed_from.is_some() {
        notes.push(format!(
            "accepted as `{}` (its run called it `{}`)",
            entry.variant, m.variant
        ));
    }
    Ok(AcceptPlan {
        pending: p,
        renamed_from,
        entry,
        replaces,
        keeps,
        region_map,
        placement,
        folder,
        creates_lock: lock.is_none(),
        notes,
        arch_entries_when_planned: arch_entries,
    })
}

/// Where `entry` (of variant `variant` with `source`) goes in the lock `state` resolved,
/// and the region map over the known shapes before and after. `retires`: an entry of the
/// same key that it removes besides those its region covers (a narrowed winner's
/// [`PendingMeta::retires`], matched by variant name and source hash).
fn place(
    t: &KernelTarget,
    state: &selection::KernelState,
    entry: &LockEntry,
    (variant, source): (&VariantFile, &str),
    retires: Option<&crate::pending::Baseline>,
) -> Result<(Placement, Vec<RegionRow>)> {
    let region = entry
        .region
        .as_deref()
        .map(|r| t.spec.parse_region(r))
        .transpose()
        .map_err(|e| Error::Invalid(format!("region of `{}`: {e}", entry.variant)))?;
    let usable = UsableVariant {
        variant: variant.clone(),
        source: source.to_string(),
        region,
        // Where a variant runs does not depend on its PTX.
        ptx: None,
    };
    let shapes = selection::known_shapes(t.spec);
    let mut placement = selection::place(state, t.spec, entry, &usable, &shapes);
    if let Some(b) = retires {
        let retired = state.entries.iter().map(|r| &r.entry).find(|e| {
            e.same_key(entry) && e.variant == b.variant && e.source_hash == b.source_hash
        });
        if let Some(e) = retired.filter(|e| !placement.replaces.contains(e)) {
            placement.replaces.push(e.clone());
        }
    }
    let map = selection::region_map(state, t.spec, (entry, &usable), &placement, &shapes);
    Ok((placement, map))
}

/// Lays the variant and a lock holding only its entry out in a scratch crate and resolves
/// them with [`selection::resolve`], the function the macro uses: if the build could not use
/// the variant, accepting it is refused now rather than discovered at build time.
fn check_usable(
    t: &KernelTarget,
    kopt: &KoptDir,
    entry: &LockEntry,
    (src, variant_text, ptx): (&str, &str, Option<&str>),
    rationale: &Rationale,
) -> Result<()> {
    let scratch = fsx::hidden_sibling(&kopt.scratch_root().join("accept"), "tmp");
    let kdir = files::kernel_dir(&scratch, t.kernel());
    let vdir = kdir.join(&entry.variant);
    let result = (|| {
        std::fs::create_dir_all(&vdir).map_err(io(&vdir))?;
        let write = |p: PathBuf, text: &str| std::fs::write(&p, text).map_err(io(&p));
        write(vdir.join(files::SOURCE_FILE), src)?;
        write(vdir.join(files::VARIANT_FILE), variant_text)?;
        if let Some(ptx) = ptx {
            write(vdir.join(files::PTX_FILE), ptx)?;
        }
        write(vdir.join(files::RATIONALE_JSON), &rationale.to_json())?;
        write(vdir.join(files::RATIONALE_MD), &rationale.render_markdown())?;
        let mut lock = LockFile::new(t.kernel());
        lock.accepted.push(entry.clone());
        write(kdir.join(files::LOCK_FILE), &lock.render())?;
        let state = selection::resolve(&scratch, t.spec, t.hashes);
        match state.entries.first().map(|e| &e.status) {
            Some(Ok(_)) if state.problems.is_empty() => Ok(()),
            Some(Err(why)) => Err(Error::Invalid(format!(
                "variant `{}` cannot be accepted: the build could not use it ({})",
                entry.variant,
                why.describe()
            ))),
            _ => Err(Error::Invalid(format!(
                "variant `{}` cannot be accepted: {}",
                entry.variant,
                state
                    .problems
                    .iter()
                    .map(|p| p.problem.clone())
                    .collect::<Vec<_>>()
                    .join("; ")
            ))),
        }
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// What an accept did.
#[derive(Debug, Clone, Serialize)]
pub struct Accepted {
    pub package: String,
    pub kernel: String,
    pub arch: String,
    /// The device the entry is keyed by, if any.
    pub device: Option<String>,
    /// `sm_90`, or `NVIDIA H200 (sm_90)`.
    pub key: String,
    pub variant: String,
    pub region: Option<String>,
    /// The variant's folder and the lock, relative to the crate root.
    pub folder: String,
    pub lock: String,
    pub replaced: Vec<String>,
    pub created_lock: bool,
    /// Where the pending variant was kept, in its run's folder.
    pub pending_kept_in: Option<PathBuf>,
    pub notes: Vec<String>,
}

/// Where a simulated crash stops [`apply_accept_until`] (tests of interruption).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// Some files of the variant written into its temporary folder.
    DuringFolderWrite,
    /// The variant's folder in place, the lock not yet rewritten.
    BeforeLock,
    /// The lock rewritten, the pending variant not yet moved away.
    AfterLock,
}

/// Applies a plan (see the module documentation for the order of the steps).
pub fn apply_accept(t: &KernelTarget, kopt: &KoptDir, plan: &AcceptPlan) -> Result<Accepted> {
    Ok(apply_accept_until(t, kopt, plan, None)?.expect("runs to the end without a crash point"))
}

/// [`apply_accept`], stopping dead at `crash` as a killed process would (no clean-up):
/// `Ok(None)` then.
#[doc(hidden)]
pub fn apply_accept_until(
    t: &KernelTarget,
    kopt: &KoptDir,
    plan: &AcceptPlan,
    crash: Option<CrashPoint>,
) -> Result<Option<Accepted>> {
    let p = &plan.pending;
    let kdir = t.kernel_dir();
    fsx::clean_leftovers(&kdir);
    let lock_before = t.read_lock()?;
    let arch_now: Vec<LockEntry> = lock_before
        .as_ref()
        .map(|l| l.entries_for(&plan.entry.arch).cloned().collect())
        .unwrap_or_default();
    if arch_now != plan.arch_entries_when_planned || lock_before.is_none() != plan.creates_lock {
        return Err(Error::Conflict(format!(
            "the accepted variants of `{}` for {} changed since this accept was planned; nothing was written: review again",
            t.kernel(),
            plan.entry.arch
        )));
    }

    // 1. The variant's folder.
    let vdir = kdir.join(&plan.entry.variant);
    let variant_text = p.variant.render();
    let json = p.rationale.to_json();
    let md = p.rationale.render_markdown();
    match plan.folder {
        FolderAction::Create => {
            if crash == Some(CrashPoint::DuringFolderWrite) {
                let tmp = fsx::write_temp_dir(&vdir, &[(files::SOURCE_FILE, p.source.as_bytes())])?;
                fsx::abandon(&tmp);
                return Ok(None);
            }
            let mut folder = vec![
                (files::SOURCE_FILE, p.source.as_bytes()),
                (files::VARIANT_FILE, variant_text.as_bytes()),
                (files::RATIONALE_JSON, json.as_bytes()),
                (files::RATIONALE_MD, md.as_bytes()),
            ];
            if let Some(ptx) = &p.ptx {
                folder.push((files::PTX_FILE, ptx.as_bytes()));
            }
            fsx::write_dir_atomic(&vdir, &folder)?;
        }
        FolderAction::RefreshAudit => {
            // kernel.cu and variant.toml (what the lock hashes) are already these bytes;
            // the audit files are replaced one by one, each atomically.
            for (name, text) in [(files::RATIONALE_JSON, &json), (files::RATIONALE_MD, &md)] {
                let path = vdir.join(name);
                files::write_atomic(&path, text.as_bytes()).map_err(io(&path))?;
            }
        }
    }
    if crash == Some(CrashPoint::BeforeLock) {
        return Ok(None);
    }

    // 2. The lock: the commit point.
    let mut lock = lock_before.unwrap_or_else(|| LockFile::new(t.kernel()));
    plan.placement.apply(&mut lock, &plan.entry);
    let lock_path = t.lock_path();
    files::write_atomic(&lock_path, lock.render().as_bytes()).map_err(io(&lock_path))?;
    if crash == Some(CrashPoint::AfterLock) {
        return Ok(None);
    }

    // 3. Make cargo notice, and move the pending variant into its run's folder.
    if plan.creates_lock {
        touch_reference(t.reference);
    }
    let kept = pending::archive(kopt, &plan.pending, "accepted").ok();
    let m = &plan.pending.meta;
    let _ = journal::append_to_run(
        kopt,
        &m.run_id,
        Event::Reviewed {
            package: m.package.clone(),
            kernel: m.kernel.clone(),
            arch: m.arch.clone(),
            variant: m.variant.clone(),
            decision: Decision::Accepted,
            detail: plan
                .renamed_from
                .as_ref()
                .map(|from| format!("accepted as `{}` (was `{from}`)", m.variant)),
        },
    );
    Ok(Some(Accepted {
        package: m.package.clone(),
        kernel: m.kernel.clone(),
        arch: m.arch.clone(),
        device: plan.entry.device.clone(),
        key: plan.entry.key(),
        variant: plan.entry.variant.clone(),
        region: plan.entry.region.clone(),
        folder: t.rel(&vdir),
        lock: t.rel(&lock_path),
        replaced: plan
            .replaces
            .iter()
            .map(|r| r.entry.variant.clone())
            .collect(),
        created_lock: plan.creates_lock,
        pending_kept_in: kept,
        notes: plan.notes.clone(),
    }))
}

/// Cargo tracks the files the macro read. A lock file that did not exist at the last
/// build was not among them, so creating one must also touch a file that was: the
/// reference source (only its modification time changes).
pub fn touch_reference(reference: &Amalgamated) {
    if let Some(first) = reference.files.first() {
        if let Ok(f) = std::fs::File::options().append(true).open(first) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
    }
}

/// What a reject did.
#[derive(Debug, Clone, Serialize)]
pub struct Rejected {
    pub package: String,
    pub kernel: String,
    pub arch: String,
    pub variant: String,
    /// Where the rejected candidate was kept (its run's `rejected/` folder).
    pub kept_in: PathBuf,
}

/// Rejects a pending variant: it leaves the pending area for its run's `rejected/`
/// folder (a negative case, not lost), and the run's journal records the decision.
pub fn reject(kopt: &KoptDir, pending: &PendingVariant, reason: Option<&str>) -> Result<Rejected> {
    let kept_in = pending::archive(kopt, pending, "rejected")?;
    let m = &pending.meta;
    let _ = journal::append_to_run(
        kopt,
        &m.run_id,
        Event::Reviewed {
            package: m.package.clone(),
            kernel: m.kernel.clone(),
            arch: m.arch.clone(),
            variant: m.variant.clone(),
            decision: Decision::Rejected,
            detail: reason.map(str::to_string),
        },
    );
    Ok(Rejected {
        package: m.package.clone(),
        kernel: m.kernel.clone(),
        arch: m.arch.clone(),
        variant: m.variant.clone(),
        kept_in,
    })
}

/// What re-activating an earlier variant did.
#[derive(Debug, Clone, Serialize)]
pub struct Reactivated {
    pub kernel: String,
    pub arch: String,
    pub variant: String,
    pub region: Option<String>,
    pub verified_by: VerifiedBy,
    pub replaced: Vec<ReplacedVariant>,
    pub lock: String,
}

/// `cargo kopt revert KERNEL --to VARIANT`: makes a variant whose folder is still in
/// `kopt/<kernel>/` the accepted one for its architecture again, provided what it was
/// verified against (the claim in its rationale.json) is still today's reference and
/// annotation.
pub fn reactivate(
    t: &KernelTarget,
    kopt: &KoptDir,
    variant: &str,
    arch: Option<&str>,
) -> Result<Reactivated> {
    let kernel = t.kernel();
    if !files::is_valid_variant_name(variant) {
        return Err(Error::Invalid(format!("`{variant}` is not a variant name")));
    }
    let vdir = t.kernel_dir().join(variant);
    let relv = t.rel(&vdir);
    if !vdir.is_dir() {
        return Err(Error::NotFound(format!(
            "{relv} does not exist: only a variant whose folder is still there can be re-activated (restore it from version control first)"
        )));
    }
    let read = |name: &str| {
        std::fs::read_to_string(vdir.join(name))
            .map_err(|e| Error::Invalid(format!("{relv}/{name}: {e}")))
    };
    let src = read(files::SOURCE_FILE)?;
    let vtext = read(files::VARIANT_FILE)?;
    let r = Rationale::parse(&read(files::RATIONALE_JSON)?)
        .map_err(|e| Error::Invalid(format!("{relv}/{}: {e}", files::RATIONALE_JSON)))?;
    let v = VariantFile::parse(&vtext)
        .map_err(|e| Error::Invalid(format!("{relv}/{}: {e}", files::VARIANT_FILE)))?;
    let ptx = match &r.claim.as_ref().and_then(|c| c.ptx.as_ref()) {
        Some(_) => Some(read(files::PTX_FILE)?),
        None => None,
    };
    if v.kernel != kernel || v.id != variant || r.kernel != kernel || r.variant != variant {
        return Err(Error::Invalid(format!(
            "{relv} describes another variant (variant.toml: `{}/{}`, rationale.json: `{}/{}`)",
            v.kernel, v.id, r.kernel, r.variant
        )));
    }
    let arch = arch.unwrap_or(&r.arch);
    if arch != r.arch {
        return Err(Error::Invalid(format!(
            "`{variant}` was verified on {}, not {arch}: it cannot be activated there without verification on that architecture",
            r.arch
        )));
    }
    let Some(claim) = &r.claim else {
        return Err(Error::Invalid(format!(
            "{relv}/{} does not record what `{variant}` was verified against (no `claim`), so kopt cannot tell whether that is today's reference; re-verify it, or vouch for it yourself with `cargo kopt pin {kernel} {variant} --arch {arch}`",
            files::RATIONALE_JSON
        )));
    };
    if r.provenance.from_fake_device() {
        return Err(Error::Invalid(format!(
            "`{variant}` was measured on kopt's fake device (`{}` in {relv}/{}: `KOPT_WORKER=fake`, whose times and results are made up), so nothing vouches for it on a real {arch} GPU and it cannot be re-activated; optimise on a {arch} GPU and accept that winner instead",
            r.provenance.device,
            files::RATIONALE_JSON
        )));
    }
    // Re-activating writes the claim's `verified_by` into the lock: only the very files
    // that were verified may get it.
    match claim.compare_files(&src, &vtext, ptx.as_deref()) {
        ClaimedFiles::Match => {}
        ClaimedFiles::Differs(file) => {
            return Err(Error::Invalid(format!(
                "{relv}/{file} is not the file `{variant}` was verified with (its hash differs from the one the claim in {} records: it was edited since), so it cannot be re-activated as verified; restore it (`git checkout -- {relv}/{file}`), or verify the edited code as a new variant (`cargo kopt optimize {kernel}`)",
                files::RATIONALE_JSON
            )))
        }
        ClaimedFiles::Unrecorded => {
            return Err(Error::Invalid(format!(
                "the claim in {relv}/{} was written before kopt recorded the hashes of kernel.cu and variant.toml, so kopt cannot tell whether they are still the files that were verified and will not re-activate them as verified; vouch for them yourself with `cargo kopt pin {kernel} {variant} --arch {arch}{}` (`verified_by = \"manual\"`), or re-verify them (`cargo kopt optimize {kernel}`)",
                files::RATIONALE_JSON,
                claim.region.as_ref().map(|r| format!(" --region '{r}'")).unwrap_or_default()
            )))
        }
    }
    if claim.reference_hash != t.hashes.reference {
        return Err(Error::Stale(format!(
            "`{variant}` was verified against another reference source than today's (it or an include changed since), so it cannot be re-activated as it is; re-verify it by optimising again (`cargo kopt optimize {kernel}`)"
        )));
    }
    if claim.spec_hash != t.hashes.spec {
        return Err(Error::Stale(format!(
            "`{variant}` was verified against another #[kopt::kernel] annotation than today's, so it cannot be re-activated as it is; re-verify it by optimising again (`cargo kopt optimize {kernel}`)"
        )));
    }
    let entry = LockEntry {
        arch: arch.to_string(),
        device: claim.device.clone(),
        variant: variant.to_string(),
        region: claim.region.clone(),
        verified_by: claim.verified_by,
        reference_hash: claim.reference_hash.clone(),
        spec_hash: claim.spec_hash.clone(),
        source_hash: source::hash(src.as_bytes()),
        variant_hash: source::hash(vtext.as_bytes()),
        ptx: ptx.as_ref().and(claim.ptx.clone()),
    };
    check_usable(t, kopt, &entry, (&src, &vtext, ptx.as_deref()), &r)?;
    fsx::clean_leftovers(&t.kernel_dir());
    let lock = t.read_lock()?;
    let created = lock.is_none();
    let mut lock = lock.unwrap_or_else(|| LockFile::new(kernel));
    let state = selection::resolve(t.crate_root, t.spec, t.hashes);
    if lock.entries_keyed(arch, entry.device.as_deref()).next() == Some(&entry) {
        return Err(Error::Invalid(format!(
            "`{variant}` is already the accepted variant of `{kernel}` for {}, tried first",
            entry.key()
        )));
    }
    let (placement, _) = place(t, &state, &entry, (&v, &src), None)?;
    let replaced = placement
        .replaces
        .iter()
        .map(|e| replaced_variant(t, &state, e))
        .collect();
    lock.accepted.retain(|e| *e != entry);
    placement.apply(&mut lock, &entry);
    let lock_path = t.lock_path();
    files::write_atomic(&lock_path, lock.render().as_bytes()).map_err(io(&lock_path))?;
    if created {
        touch_reference(t.reference);
    }
    Ok(Reactivated {
        kernel: kernel.to_string(),
        arch: arch.to_string(),
        variant: variant.to_string(),
        region: entry.region,
        verified_by: entry.verified_by,
        replaced,
        lock: t.rel(&lock_path),
    })
}

/// What [`keep_ptx`] did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PtxKept {
    pub kernel: String,
    pub variant: String,
    /// The lock entry's key (`sm_90`, `NVIDIA H200 (sm_90)`).
    pub key: String,
    /// `kopt/softmax/online-vec4/kernel.ptx`.
    pub file: String,
    pub record: PtxRecord,
}

/// Keeps `ptx`, the PTX that a verification of the accepted `entry` just loaded and
/// passed with, as its `kernel.ptx`, and records it in the lock entry, so that the
/// launcher loads it without NVRTC. The file is written first and is inert until the
/// lock names it; the lock is written last, in one atomic step, so an interruption leaves
/// the variant as it was. The claim in `rationale.json` records the PTX too, when the
/// claim vouches for the folder's files as they are.
pub fn keep_ptx(
    t: &KernelTarget,
    entry: &LockEntry,
    ptx: &str,
    record: &PtxRecord,
) -> Result<PtxKept> {
    let kernel = t.kernel();
    if record.hash != source::hash(ptx.as_bytes()) {
        return Err(Error::Invalid(format!(
            "the PTX of `{}` does not match its record's hash; nothing was written",
            entry.variant
        )));
    }
    if files::parse_arch(&record.arch) != files::parse_arch(&entry.arch) {
        return Err(Error::Invalid(format!(
            "the PTX of `{}` was compiled for {}, but its entry is for {}; nothing was written",
            entry.variant, record.arch, entry.arch
        )));
    }
    let mut lock = t.read_lock()?.ok_or_else(|| {
        Error::NotFound(format!("`{kernel}` has no lock file; nothing was written"))
    })?;
    let vdir = t.kernel_dir().join(&entry.variant);
    let path = vdir.join(files::PTX_FILE);
    // An entry of the same folder may vouch for a kernel.ptx already: never replace that
    // file with other bytes.
    if let Some(other) = lock
        .accepted
        .iter()
        .filter(|e| e.variant == entry.variant)
        .find_map(|e| e.ptx.as_ref().filter(|p| p.hash != record.hash))
    {
        return Err(Error::Conflict(format!(
            "{} is already the verified PTX of `{}` (NVRTC {}, {}), recorded in the lock; nothing was written",
            t.rel(&path),
            entry.variant,
            other.nvrtc,
            other.arch
        )));
    }
    let Some(at) = lock.accepted.iter().position(|e| e == entry) else {
        return Err(Error::Conflict(format!(
            "the lock entry of `{}` for {} changed since it was verified; nothing was written: verify again",
            entry.variant,
            entry.key()
        )));
    };
    files::write_atomic(&path, ptx.as_bytes()).map_err(io(&path))?;
    // The audit record: only a claim that vouches for these very files gains the PTX.
    let json_path = vdir.join(files::RATIONALE_JSON);
    if let Ok(mut r) = std::fs::read_to_string(&json_path)
        .map_err(|e| e.to_string())
        .and_then(|text| Rationale::parse(&text))
    {
        let src = std::fs::read_to_string(vdir.join(files::SOURCE_FILE)).unwrap_or_default();
        let vtext = std::fs::read_to_string(vdir.join(files::VARIANT_FILE)).unwrap_or_default();
        if let Some(c) = r.claim.as_mut() {
            if c.ptx.is_none() && c.compare_files(&src, &vtext, None) == ClaimedFiles::Match {
                c.ptx = Some(record.clone());
                files::write_atomic(&json_path, r.to_json().as_bytes()).map_err(io(&json_path))?;
                let md = vdir.join(files::RATIONALE_MD);
                files::write_atomic(&md, r.render_markdown().as_bytes()).map_err(io(&md))?;
            }
        }
    }
    lock.accepted[at].ptx = Some(record.clone());
    let lock_path = t.lock_path();
    files::write_atomic(&lock_path, lock.render().as_bytes()).map_err(io(&lock_path))?;
    Ok(PtxKept {
        kernel: kernel.to_string(),
        variant: entry.variant.clone(),
        key: entry.key(),
        file: t.rel(&path),
        record: record.clone(),
    })
}
