//! The committed files under `<crate>/kopt/<kernel>/`, written by `cargo kopt` and read by
//! the macro at build time (the pattern of sqlx's offline mode).
//!
//! ```text
//! <crate>/kopt/<kernel>/
//!     kopt.lock                 which variant runs on which architecture, and the hashes
//!                               it was verified against
//!     <variant>/kernel.cu       the variant's full, self-contained source
//!     <variant>/variant.toml    its entry point, launch rule, defines, compile options
//!     <variant>/rationale.json  the audit record: diagnosis, changes, risks, evidence,
//!                               figures per shape
//!     <variant>/RATIONALE.md    the same facts, rendered for a reviewer
//! ```
//!
//! Every format carries its version (`format = 1`; the lock is at [`LOCK_FORMAT`]); fields
//! are written in a fixed order, lists in a defined order, so that diffs show only what
//! changed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::spec::{LaunchRule, Number};

/// The version of the variant, rationale and pending files this crate reads and writes.
pub const FORMAT: u32 = 1;

/// The version of `kopt.lock` this crate writes. Format 2 added entries keyed by a
/// device (`device = "NVIDIA H200"`); format 1 locks, whose entries are all keyed by their
/// architecture alone, are read as they are and rewritten as format 2.
pub const LOCK_FORMAT: u32 = 2;

pub const LOCK_FILE: &str = "kopt.lock";
pub const SOURCE_FILE: &str = "kernel.cu";
pub const VARIANT_FILE: &str = "variant.toml";
pub const RATIONALE_JSON: &str = "rationale.json";
pub const RATIONALE_MD: &str = "RATIONALE.md";
/// The PTX that verification loaded, kept with the variant (see [`PtxRecord`]).
pub const PTX_FILE: &str = "kernel.ptx";

/// Whether `name` may name a variant (a folder under `kopt/<kernel>/`): ASCII letters,
/// digits, `-`, `_` and `.`, not starting with `.` (kopt's own temporary folders do).
pub fn is_valid_variant_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

/// `<crate>/kopt/<kernel>`.
pub fn kernel_dir(crate_root: &Path, kernel: &str) -> PathBuf {
    crate_root.join("kopt").join(kernel)
}

// ---------------------------------------------------------------------------------------
// kopt.lock

/// Who vouched for a lock entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VerifiedBy {
    /// kopt's verification engine (numerics, anti-cheat, watchdog).
    Kopt,
    /// A person, with `cargo kopt pin`; kopt's own verification has not run on it.
    Manual,
}

/// One accepted variant for one architecture, or for one device of it. On a device, its
/// architecture's entries that name that device are tried first, then those that name no
/// device, each group in file order: the first whose region holds for the launch's
/// arguments runs, else the reference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockEntry {
    /// `sm_90` for compute capability 9.0.
    pub arch: String,
    /// The device it was verified for (the driver's name, `NVIDIA H200`); absent: every
    /// device of the architecture.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    pub variant: String,
    /// A condition over the scalar arguments; absent means every shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    pub verified_by: VerifiedBy,
    /// Hash of the amalgamated reference source the variant was verified against.
    pub reference_hash: String,
    /// Hash of the kernel's spec (the annotation) at verification.
    pub spec_hash: String,
    /// Hash of the variant's `kernel.cu`.
    pub source_hash: String,
    /// Hash of the variant's `variant.toml`.
    pub variant_hash: String,
    /// The variant's `kernel.ptx`, the PTX its verification loaded: its hash and what
    /// compiled it. Absent for a variant accepted without one (the launcher compiles
    /// `kernel.cu` with NVRTC at first launch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptx: Option<PtxRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockFile {
    pub format: u32,
    pub kernel: String,
    #[serde(default)]
    pub accepted: Vec<LockEntry>,
}

const LOCK_HEADER: &str = "\
# kopt lock file: the accepted variants of this kernel for each GPU architecture (or
# device), the shapes each runs on, and the hashes it was verified against. Written by
# `cargo kopt`; change it with `cargo kopt review`, `accept`, `revert` or `pin`, not by
# hand. A hash that no longer matches makes the build fall back to the reference kernel
# and `cargo kopt check` fail.
";

impl LockFile {
    pub fn new(kernel: &str) -> Self {
        LockFile {
            format: LOCK_FORMAT,
            kernel: kernel.to_string(),
            accepted: Vec::new(),
        }
    }

    /// Reads a lock of format 1 or 2. A format 1 lock cannot key an entry by device: one
    /// that does was not written by kopt, and is refused rather than read as if every
    /// device of the architecture were meant.
    pub fn parse(text: &str) -> Result<Self, String> {
        let format = read_format(text, &[1, LOCK_FORMAT])?;
        let lock: LockFile = toml::from_str(text).map_err(|e| e.to_string())?;
        if format == 1 {
            if let Some(e) = lock.accepted.iter().find(|e| e.device.is_some()) {
                return Err(format!(
                    "entry `{}` names a device, which a format 1 lock cannot (devices came with format {LOCK_FORMAT}); restore the file from version control",
                    e.variant
                ));
            }
        }
        Ok(lock)
    }

    /// Entries sorted by architecture; within one architecture, order is kept (it is the
    /// order regions are tried in).
    pub fn render(&self) -> String {
        let mut sorted = self.clone();
        sorted.format = LOCK_FORMAT;
        sorted.accepted.sort_by_key(|e| arch_key(&e.arch));
        format!(
            "{LOCK_HEADER}{}",
            toml::to_string(&sorted).expect("lock serialises")
        )
    }

    /// Every entry of an architecture, device-keyed or not, in file order.
    pub fn entries_for<'a>(&'a self, arch: &'a str) -> impl Iterator<Item = &'a LockEntry> + 'a {
        self.accepted.iter().filter(move |e| e.arch == arch)
    }

    /// The entries of one key (an architecture, and a device or none), in file order:
    /// those an accept for that key places itself among.
    pub fn entries_keyed<'a>(
        &'a self,
        arch: &'a str,
        device: Option<&'a str>,
    ) -> impl Iterator<Item = &'a LockEntry> + 'a {
        self.accepted
            .iter()
            .filter(move |e| e.arch == arch && e.device.as_deref() == device)
    }
}

impl LockEntry {
    /// `sm_90`, or `NVIDIA H200 (sm_90)` for a device-keyed entry.
    pub fn key(&self) -> String {
        key_text(&self.arch, self.device.as_deref())
    }

    /// Whether it has the same key as `other`: the same architecture and device (or none).
    pub fn same_key(&self, other: &LockEntry) -> bool {
        self.arch == other.arch && self.device == other.device
    }

    /// Where it is tried on a device of `arch` named `device` (see [`try_group`]).
    pub fn try_group(&self, arch: &str, device: Option<&str>) -> Option<u8> {
        try_group(&self.arch, self.device.as_deref(), arch, device)
    }
}

/// What an entry for `arch` and `device` is keyed by, as kopt prints it: `sm_90`, or
/// `NVIDIA H200 (sm_90)`.
pub fn key_text(arch: &str, device: Option<&str>) -> String {
    match device {
        Some(d) => format!("{d} ({arch})"),
        None => arch.to_string(),
    }
}

/// The one rule of which entries run where, for the CLI's choice and the launcher's:
/// on a device of `arch` named `device` (`None`: a name kopt does not know), an entry for
/// `entry_arch` keyed by `entry_device` is tried in group 0 when it names that device, in
/// group 1 (after every group-0 entry) when it names no device, and not at all otherwise.
pub fn try_group(
    entry_arch: &str,
    entry_device: Option<&str>,
    arch: &str,
    device: Option<&str>,
) -> Option<u8> {
    match entry_device {
        _ if entry_arch != arch => None,
        None => Some(1),
        Some(d) => (device == Some(d)).then_some(0),
    }
}

/// Sorts `sm_100` after `sm_90`.
fn arch_key(arch: &str) -> (u32, String) {
    (
        parse_arch(arch)
            .map(|(a, b)| a * 10 + b)
            .unwrap_or(u32::MAX),
        arch.to_string(),
    )
}

/// `sm_90` -> (9, 0); `sm_120` -> (12, 0). The letter suffixes (`sm_90a`) are accepted.
pub fn parse_arch(arch: &str) -> Option<(u32, u32)> {
    let digits = arch.strip_prefix("sm_")?.trim_end_matches(['a', 'f']);
    if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (maj, min) = digits.split_at(digits.len() - 1);
    Some((maj.parse().ok()?, min.parse().ok()?))
}

/// The architecture name of a compute capability.
pub fn arch_name(major: u32, minor: u32) -> String {
    format!("sm_{major}{minor}")
}

fn check_format(text: &str) -> Result<(), String> {
    read_format(text, &[FORMAT]).map(|_| ())
}

/// The file's `format`, if it is one of `known`.
fn read_format(text: &str, known: &[u32]) -> Result<u32, String> {
    #[derive(Deserialize)]
    struct Probe {
        format: Option<u32>,
    }
    let probe: Probe = toml::from_str(text).map_err(|e| e.to_string())?;
    match probe.format {
        Some(v) if known.contains(&v) => Ok(v),
        Some(v) => Err(format!(
            "format {v} is not supported by this kopt (it reads format {}); upgrade cargo-kopt and the kopt crate together",
            known.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(" and ")
        )),
        None => Err("no `format` field: not a kopt file".into()),
    }
}

// ---------------------------------------------------------------------------------------
// variant.toml

/// What the build needs to compile and launch a variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VariantFile {
    pub format: u32,
    pub kernel: String,
    pub id: String,
    pub entry: String,
    /// Its kernel arguments in order, when they are not the reference's: names of the
    /// launcher's parameters, computed arguments and tensor maps
    /// (`KernelSpec::version_args`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    /// Launch geometry: expressions of the scalar arguments and this variant's defines.
    pub launch: LaunchRule,
    /// Preprocessor defines (`-DNAME=VALUE`), in name order.
    #[serde(default)]
    pub defines: BTreeMap<String, i64>,
    /// Further NVRTC options.
    #[serde(default)]
    pub options: Vec<String>,
}

/// A variant's `kernel.ptx`: the PTX its verification compiled and the worker loaded
/// through the driver, which the generated launcher embeds and loads the same way (no
/// NVRTC at run time). A lock entry records it (an inline table), so that adding the PTX
/// to an accepted variant is one write of the lock, and the file's hash is checked as the
/// other files' are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtxRecord {
    /// Hash of `kernel.ptx`.
    pub hash: String,
    /// NVRTC's version (`13.0`): a driver older than it may refuse the PTX, and the
    /// launcher then compiles `kernel.cu` instead.
    pub nvrtc: String,
    /// The architecture it was compiled for (`sm_90`, or `sm_90a` where the options
    /// name it): the launcher loads it only on a device of the lock entry's architecture.
    pub arch: String,
    /// The entry's name in the PTX where it differs from `entry` (NVRTC's lowered name
    /// of a name expression such as `softmax<float>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symbol: Option<String>,
}

impl PtxRecord {
    /// `NVRTC 13.0, sm_90`.
    pub fn describe(&self) -> String {
        format!("NVRTC {}, {}", self.nvrtc, self.arch)
    }
}

const VARIANT_HEADER: &str = "\
# kopt variant: how to build and launch this variant's kernel.cu. Its hash is in the
# kernel's kopt.lock; editing it by hand makes the variant corrupt until re-accepted.
";

impl VariantFile {
    pub fn parse(text: &str) -> Result<Self, String> {
        check_format(text)?;
        toml::from_str(text).map_err(|e| e.to_string())
    }

    pub fn render(&self) -> String {
        format!(
            "{VARIANT_HEADER}{}",
            toml::to_string(self).expect("variant serialises")
        )
    }

    /// Compile options: defines first, then the declared options.
    pub fn compile_options(&self) -> Vec<String> {
        crate::spec::define_options(&self.defines)
            .chain(self.options.iter().cloned())
            .collect()
    }
}

// ---------------------------------------------------------------------------------------
// rationale.json and RATIONALE.md

/// The audit record of a variant: why it exists and the evidence that it is right and
/// faster. `RATIONALE.md` is rendered from it, so the two never disagree.
///
/// Optional fields are left out of the JSON when absent, so that a record written before
/// they existed reads and renders exactly as it did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rationale {
    pub format: u32,
    pub kernel: String,
    pub variant: String,
    pub arch: String,
    /// The lock entry the evidence vouches for: region and the hashes it was verified
    /// against. `cargo kopt revert --to` re-activates a variant from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<Claim>,
    /// One paragraph: what changed and what it bought.
    pub summary: String,
    /// The bottleneck snapshot of the version it replaces and of the variant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshots: Option<Snapshots>,
    pub diagnosis: Diagnosis,
    pub changes: Vec<Change>,
    pub risks: Vec<Risk>,
    pub verification: Verification,
    pub figures: Vec<ShapeFigures>,
    /// What NVRTC made of the variant for its architecture when it was verified: the
    /// figures `cargo kopt check` compiles it again to compare with. Absent in records
    /// written before kopt recorded them (their figures' registers are compared instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile: Option<CompileFigures>,
    /// How the variant's defines were chosen, when a search over a parameter matrix chose
    /// them (the optimisation loop's sweep of the agent's matrix).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<ParameterSearch>,
    pub provenance: Provenance,
}

/// ptxas' figures of a variant's entry, compiled by NVRTC on the CPU for a real
/// architecture, and what compiled it. Not a measurement of the device: the same source,
/// options and compiler give the same figures on any machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompileFigures {
    /// NVRTC's version (`13.0`).
    pub nvrtc: String,
    /// The CUDA version of the headers it compiled against (`13.0`), where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_headers: Option<String>,
    /// The real architecture compiled for (`sm_90`, or `sm_90a` where the options name it).
    pub arch: String,
    pub registers: u32,
    /// Bytes of registers spilled to local memory (stores) and read back (loads).
    pub spill_stores: u32,
    pub spill_loads: u32,
    /// Bytes of stack frame per thread: local memory, spills included.
    pub stack_bytes: u32,
    /// Static shared memory per block, bytes (dynamic shared memory is the launch's).
    pub shared_bytes: u32,
}

impl CompileFigures {
    /// Whether ptxas spilled registers.
    pub fn spills(&self) -> bool {
        self.spill_stores > 0 || self.spill_loads > 0
    }

    /// One sentence: `NVRTC 13.0 (CUDA headers 13.0), sm_90: 47 registers, no spills, ...`.
    pub fn describe(&self) -> String {
        let headers = self
            .cuda_headers
            .as_ref()
            .map(|h| format!(" (CUDA headers {h})"))
            .unwrap_or_default();
        let spills = if self.spills() {
            format!(
                "{} bytes of spill stores and {} of spill loads",
                self.spill_stores, self.spill_loads
            )
        } else {
            "no spills".to_string()
        };
        format!(
            "NVRTC {}{headers}, {}: {} registers, {spills}, {} bytes of stack, {} bytes of static shared memory",
            self.nvrtc, self.arch, self.registers, self.stack_bytes, self.shared_bytes
        )
    }
}

/// The search that chose a variant's defines: every point it measured, so that a reviewer
/// sees why these values and not the others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParameterSearch {
    /// Who searched, how, and by which rule the point was chosen, in a sentence or two.
    pub method: String,
    /// The matrix searched, define name -> values, as it was given.
    pub matrix: BTreeMap<String, Vec<i64>>,
    /// The point chosen: the variant's own.
    pub chosen: String,
    /// Why the search ended before its last point (a budget), when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// Every point measured, in the order it was.
    pub points: Vec<SearchPoint>,
}

/// One point of a [`ParameterSearch`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchPoint {
    /// Its candidate id in the run (`r1c2`, `r1c2-m3`).
    pub point: String,
    /// The values it gave the matrix's defines.
    pub defines: BTreeMap<String, i64>,
    /// `verified`, or the fence that rejected it and why, in one line.
    pub outcome: String,
    /// Its time per declared shape, microseconds, by shape label: empty for a point whose
    /// results were wrong (only times of correct points are worth comparing).
    pub times_us: BTreeMap<String, f64>,
}

/// What a variant was verified as: the fields of its lock entry, kept in the variant's own
/// folder so that the folder stays checkable (and can be re-activated) after the lock no
/// longer names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// The condition over the scalar arguments where it runs; absent means every shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The device it was accepted for, when it was keyed by device; absent: its
    /// architecture.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    pub verified_by: VerifiedBy,
    /// Hash of the amalgamated reference source at verification.
    pub reference_hash: String,
    /// Hash of the spec (the annotation) at verification.
    pub spec_hash: String,
    /// Hash of the variant's `kernel.cu` as it was verified. Absent in claims written
    /// before kopt recorded it: such a folder's files cannot be told from edited ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_hash: Option<String>,
    /// Hash of the variant's `variant.toml` as it was verified (absent as `source_hash`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant_hash: Option<String>,
    /// The variant's `kernel.ptx` as it was verified (see [`PtxRecord`]); absent for a
    /// variant without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptx: Option<PtxRecord>,
}

/// How a variant folder's `kernel.cu` and `variant.toml` compare with what its claim
/// says was verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimedFiles {
    /// Both are the bytes that were verified.
    Match,
    /// This file (`kernel.cu` or `variant.toml`) is not what was verified: it was edited
    /// after verification.
    Differs(&'static str),
    /// The claim does not record both hashes (it predates them), and the one it records,
    /// if any, matches: kopt cannot tell whether the files are what was verified.
    Unrecorded,
}

impl Claim {
    /// Compares a variant's files with the hashes the claim recorded (`ptx`: its
    /// `kernel.ptx`, where the folder has one).
    pub fn compare_files(
        &self,
        source: &str,
        variant_text: &str,
        ptx: Option<&str>,
    ) -> ClaimedFiles {
        let recorded = [
            (SOURCE_FILE, &self.source_hash, source),
            (VARIANT_FILE, &self.variant_hash, variant_text),
        ];
        for (file, hash, text) in recorded {
            if hash
                .as_ref()
                .is_some_and(|h| *h != crate::source::hash(text.as_bytes()))
            {
                return ClaimedFiles::Differs(file);
            }
        }
        let claimed = self.ptx.as_ref().map(|p| p.hash.as_str());
        if claimed
            .is_some_and(|h| ptx.map(|p| crate::source::hash(p.as_bytes())).as_deref() != Some(h))
        {
            return ClaimedFiles::Differs(PTX_FILE);
        }
        if self.source_hash.is_some() && self.variant_hash.is_some() {
            ClaimedFiles::Match
        } else {
            ClaimedFiles::Unrecorded
        }
    }
}

/// A compressed, ranked summary of what was measured about one version of a kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BottleneckSnapshot {
    /// `memory-bound`, `latency-bound`, `compute-bound`, `occupancy-limited`, ...
    pub classification: String,
    /// A short text rendering, a few lines, as the agent saw it.
    pub text: String,
    /// Key metrics by name (e.g. `dram_throughput_pct`), in name order.
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshots {
    /// The version the variant replaces (the reference, or the accepted variant).
    pub before: BottleneckSnapshot,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<BottleneckSnapshot>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Diagnosis {
    /// The bottleneck class, e.g. `latency-bound`.
    pub bottleneck: String,
    pub explanation: String,
    /// The measurements the diagnosis rests on.
    pub evidence: Vec<String>,
    /// How much past cases support the diagnosis (from the case library, not the model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<Confidence>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Confidence {
    /// The retrieval similarity of the nearest past case with this diagnosis, 0 to 1.
    pub score: f64,
    /// The ids of the past cases it rests on, nearest first.
    pub cases: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub what: String,
    /// How this change addresses the diagnosis.
    pub why: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Risk {
    pub risk: String,
    /// Which check covered it.
    pub covered_by: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verification {
    /// How the variant was checked, in a sentence.
    pub method: String,
    pub outputs: Vec<OutputCheck>,
    pub seeds: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputCheck {
    pub buffer: String,
    pub rtol: f64,
    pub atol: f64,
    pub max_abs_error: f64,
    pub max_rel_error: f64,
}

/// Verified figures for one shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShapeFigures {
    pub shape: BTreeMap<String, Number>,
    pub reference_us: f64,
    pub variant_us: f64,
    /// Effective bandwidth as a percentage of the measured copy bandwidth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_bandwidth_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registers: Option<u32>,
    /// Theoretical occupancy, percent of the SM's warps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occupancy_pct: Option<f64>,
}

impl ShapeFigures {
    pub fn speedup(&self) -> f64 {
        self.reference_us / self.variant_us
    }
}

/// The name kopt's fake device gives itself (`KOPT_WORKER=fake`: a simulated GPU for tests
/// without one, whose times and results are made up). The fake worker reports it and
/// [`is_fake_device`] recognises it, so that evidence from it can never vouch for a
/// variant on a real architecture.
pub const FAKE_DEVICE_NAME: &str = "kopt fake GPU";

/// Whether `device`, a device's name or a rationale's `provenance.device` (`NAME (sm_XY)`,
/// as [`Provenance`] records it), is kopt's fake device.
pub fn is_fake_device(device: &str) -> bool {
    let name = device.trim();
    name == FAKE_DEVICE_NAME
        || name
            .strip_prefix(FAKE_DEVICE_NAME)
            .is_some_and(|rest| rest.starts_with(" ("))
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// Who or what proposed the variant: `person`, `heuristic`, `openai:<model>`...
    pub agent: String,
    pub device: String,
    pub driver: String,
    pub date: String,
    /// The device-to-device copy bandwidth measured on the device, GB/s: what the
    /// `% copy bandwidth` figures are a percentage of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_bandwidth_gbs: Option<f64>,
    /// The recorded session, relative to the workspace, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// What the run that produced the variant spent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetUsed>,
}

/// What an optimisation run spent on a variant; each figure is optional because not
/// every agent reports every one (the heuristic agent uses no tokens).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BudgetUsed {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidates: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_time_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

impl Provenance {
    /// Whether the evidence was measured on kopt's fake device (see [`is_fake_device`]).
    pub fn from_fake_device(&self) -> bool {
        is_fake_device(&self.device)
    }

    /// The device's name as the driver gives it (`NVIDIA H200`): `device` without the
    /// ` (sm_90)` that kopt appends for `arch`.
    pub fn device_name(&self, arch: &str) -> &str {
        self.device
            .strip_suffix(&format!(" ({arch})"))
            .unwrap_or(&self.device)
            .trim()
    }
}

impl BudgetUsed {
    /// `3 rounds, 7 candidates, 412 s, 51200 tokens, $0.42`; `None` when nothing is known.
    pub fn describe(&self) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(r) = self.rounds {
            parts.push(format!("{r} round{}", if r == 1 { "" } else { "s" }));
        }
        if let Some(c) = self.candidates {
            parts.push(format!("{c} candidate{}", if c == 1 { "" } else { "s" }));
        }
        if let Some(w) = self.wall_time_s {
            parts.push(format!("{w:.0} s of wall time"));
        }
        if let Some(t) = self.tokens {
            parts.push(format!("{t} tokens"));
        }
        if let Some(c) = self.cost_usd {
            parts.push(format!("${c:.2}"));
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

impl Rationale {
    pub fn parse(text: &str) -> Result<Self, String> {
        let r: Rationale = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if r.format != FORMAT {
            return Err(format!(
                "format {} is not supported (this kopt reads {FORMAT})",
                r.format
            ));
        }
        Ok(r)
    }

    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("rationale serialises");
        s.push('\n');
        s
    }

    /// The smallest audit record of a hand-made variant, every text a placeholder that
    /// says what to write there: what `cargo kopt pin` tells a person to start from.
    pub fn skeleton(kernel: &str, variant: &str, arch: &str) -> Self {
        Rationale {
            format: FORMAT,
            kernel: kernel.to_string(),
            variant: variant.to_string(),
            arch: arch.to_string(),
            claim: None,
            summary: "<what the variant changes, and what it buys>".into(),
            snapshots: None,
            diagnosis: Diagnosis {
                bottleneck: "<memory-bound, latency-bound, compute-bound, ...>".into(),
                explanation: "<why the version it replaces is slow>".into(),
                evidence: vec!["<a measurement the diagnosis rests on>".into()],
                confidence: None,
            },
            changes: vec![Change {
                what: "<a change>".into(),
                why: "<how it addresses the diagnosis>".into(),
            }],
            risks: vec![Risk {
                risk: "<what could go wrong>".into(),
                covered_by: "<the check that covered it>".into(),
            }],
            verification: Verification {
                method: "<how you checked it against the reference>".into(),
                outputs: Vec::new(),
                seeds: Vec::new(),
            },
            figures: Vec::new(),
            compile: None,
            search: None,
            provenance: Provenance {
                agent: "person (hand-written)".into(),
                device: "<the GPU it was measured on>".into(),
                driver: "<its driver version>".into(),
                date: "<YYYY-MM-DD>".into(),
                copy_bandwidth_gbs: None,
                session: None,
                budget: None,
            },
        }
    }

    /// RATIONALE.md: written for a reviewer who was not there.
    pub fn render_markdown(&self) -> String {
        let mut md = String::new();
        let region = self
            .claim
            .as_ref()
            .and_then(|c| c.region.as_ref())
            .map(|r| format!(", where `{r}`"))
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "# `{}` / `{}` on {}{region}\n",
            self.kernel, self.variant, self.arch
        );
        let _ = writeln!(md, "{}\n", self.summary);
        if let Some(s) = &self.snapshots {
            render_snapshots(&mut md, s);
        }
        let _ = writeln!(md, "## Diagnosis: {}\n", self.diagnosis.bottleneck);
        let _ = writeln!(md, "{}\n", self.diagnosis.explanation);
        if !self.diagnosis.evidence.is_empty() {
            let _ = writeln!(md, "Evidence:\n");
            for e in &self.diagnosis.evidence {
                let _ = writeln!(md, "- {e}");
            }
            md.push('\n');
        }
        if let Some(c) = &self.diagnosis.confidence {
            let cases = if c.cases.is_empty() {
                "no similar past case".to_string()
            } else {
                c.cases
                    .iter()
                    .map(|id| format!("`{id}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let _ = writeln!(
                md,
                "Confidence: {:.2}, the similarity of past cases with this diagnosis ({cases}).\n",
                c.score
            );
        }
        let _ = writeln!(md, "## Changes\n");
        for (i, c) in self.changes.iter().enumerate() {
            let _ = writeln!(md, "{}. **{}**  \n   {}", i + 1, c.what, c.why);
        }
        md.push('\n');
        let _ = writeln!(md, "## Risks and how they were covered\n");
        let _ = writeln!(md, "| risk | covered by |\n| --- | --- |");
        for r in &self.risks {
            let _ = writeln!(md, "| {} | {} |", cell(&r.risk), cell(&r.covered_by));
        }
        md.push('\n');
        let _ = writeln!(md, "## Figures per shape\n");
        let _ = writeln!(
            md,
            "| shape | reference (µs) | variant (µs) | speedup | % copy bandwidth | registers | occupancy |"
        );
        let _ = writeln!(md, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
        for f in &self.figures {
            let shape = f
                .shape
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ");
            let _ = writeln!(
                md,
                "| {shape} | {:.2} | {:.2} | {:.2}x | {} | {} | {} |",
                f.reference_us,
                f.variant_us,
                f.speedup(),
                opt(f.copy_bandwidth_pct.map(|v| format!("{v:.1}%"))),
                opt(f.registers.map(|v| v.to_string())),
                opt(f.occupancy_pct.map(|v| format!("{v:.0}%"))),
            );
        }
        md.push('\n');
        if let Some(c) = &self.compile {
            let _ = writeln!(
                md,
                "Compiled on the CPU by {}; `cargo kopt check` compiles it again and compares.\n",
                c.describe()
            );
        }
        if let Some(search) = &self.search {
            render_search(&mut md, search);
        }
        let _ = writeln!(md, "## Verification\n");
        let _ = writeln!(md, "{}\n", self.verification.method);
        let _ = writeln!(
            md,
            "| output | rtol | atol | max abs error | max rel error |"
        );
        let _ = writeln!(md, "| --- | ---: | ---: | ---: | ---: |");
        for o in &self.verification.outputs {
            let _ = writeln!(
                md,
                "| `{}` | {:e} | {:e} | {:.3e} | {:.3e} |",
                o.buffer, o.rtol, o.atol, o.max_abs_error, o.max_rel_error
            );
        }
        let seeds = self
            .verification
            .seeds
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(md, "\nSeeds: {seeds}\n");
        if let Some(c) = &self.claim {
            let by = match c.verified_by {
                VerifiedBy::Kopt => "kopt",
                VerifiedBy::Manual => "a person, not by kopt (`verified_by = \"manual\"`),",
            };
            let _ = writeln!(
                md,
                "Verified by {by} against the reference source `{}` and the annotation `{}`.\n",
                c.reference_hash, c.spec_hash
            );
        }
        let _ = writeln!(md, "## Provenance\n");
        let p = &self.provenance;
        let _ = writeln!(md, "- proposed by: {}", p.agent);
        let _ = writeln!(md, "- measured on: {}, driver {}", p.device, p.driver);
        if let Some(bw) = p.copy_bandwidth_gbs {
            let _ = writeln!(md, "- measured copy bandwidth: {bw:.0} GB/s");
        }
        let _ = writeln!(md, "- date: {}", p.date);
        if let Some(b) = p.budget.as_ref().and_then(BudgetUsed::describe) {
            let _ = writeln!(md, "- budget used: {b}");
        }
        match &p.session {
            Some(s) => {
                let _ = writeln!(md, "- recorded session: [{s}]({s})");
            }
            None => {
                let _ = writeln!(
                    md,
                    "- recorded session: none (not produced by the agent loop)"
                );
            }
        }
        md
    }
}

/// The snapshot section: the metrics side by side, then each text rendering.
fn render_snapshots(md: &mut String, s: &Snapshots) {
    let _ = writeln!(md, "## Bottleneck snapshot, before and after\n");
    let after = s.after.as_ref();
    let mut names: Vec<&String> = s.before.metrics.keys().collect();
    if let Some(a) = after {
        names.extend(a.metrics.keys());
    }
    names.sort();
    names.dedup();
    let _ = writeln!(
        md,
        "Before: {}. After: {}.\n",
        s.before.classification,
        after.map_or("not measured", |a| a.classification.as_str())
    );
    if !names.is_empty() {
        let _ = writeln!(md, "| metric | before | after |\n| --- | ---: | ---: |");
        for n in names {
            let _ = writeln!(
                md,
                "| {} | {} | {} |",
                cell(n),
                opt(s.before.metrics.get(n).map(|v| v.to_string())),
                opt(after.and_then(|a| a.metrics.get(n)).map(|v| v.to_string())),
            );
        }
        md.push('\n');
    }
    for (label, snap) in std::iter::once(("Before", &s.before)).chain(after.map(|a| ("After", a))) {
        if snap.text.trim().is_empty() {
            continue;
        }
        let _ = writeln!(md, "{label}:\n\n```text\n{}\n```\n", snap.text.trim_end());
    }
}

/// The search section: the method, then one row per point with its defines, outcome and
/// time per shape (the chosen point in bold).
fn render_search(md: &mut String, s: &ParameterSearch) {
    let _ = writeln!(md, "## Parameter search\n");
    let _ = writeln!(md, "{}\n", s.method);
    if let Some(stopped) = &s.stopped {
        let _ = writeln!(md, "Stopped early: {stopped}.\n");
    }
    let mut shapes: Vec<&String> = s.points.iter().flat_map(|p| p.times_us.keys()).collect();
    shapes.sort();
    shapes.dedup();
    let keys: Vec<&String> = s.matrix.keys().collect();
    let mut header = vec!["point".to_string()];
    header.extend(keys.iter().map(|k| format!("`{k}`")));
    header.push("outcome".into());
    header.extend(shapes.iter().map(|sh| format!("{} (µs)", cell(sh))));
    let _ = writeln!(md, "| {} |", header.join(" | "));
    let mut rule = vec!["---"; 2 + keys.len()];
    rule.extend(std::iter::repeat_n("---:", shapes.len()));
    let _ = writeln!(md, "| {} |", rule.join(" | "));
    for p in &s.points {
        let mut row = vec![if p.point == s.chosen {
            format!("**{}** (chosen)", cell(&p.point))
        } else {
            cell(&p.point)
        }];
        row.extend(
            keys.iter()
                .map(|k| opt(p.defines.get(*k).map(|v| v.to_string()))),
        );
        row.push(cell(&p.outcome));
        row.extend(
            shapes
                .iter()
                .map(|sh| opt(p.times_us.get(*sh).map(|t| format!("{t:.2}")))),
        );
        let _ = writeln!(md, "| {} |", row.join(" | "));
    }
    md.push('\n');
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn opt(s: Option<String>) -> String {
    s.unwrap_or_else(|| "–".into())
}

// ---------------------------------------------------------------------------------------
// Writing.

/// Writes `bytes` to `path` atomically: a temporary file in the same folder, synced, then
/// renamed over the target. A crash leaves either the old file or the new one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.kopt-tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The highest share of the measured copy bandwidth (in percent) a timing from device
/// memory can plausibly reach. The copy ceiling moves reads and writes in equal measure;
/// streams that mostly read run a few percent above it on HBM (on the H200, PyTorch's fused
/// silu*mul, two reads per write, at 105%). Above this, a figure is a measurement error (or
/// the kernel skips work). The engine's roofline fence and the rationale builder share it.
pub const COPY_BANDWIDTH_PLAUSIBLE_PCT: f64 = 110.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names() {
        assert_eq!(parse_arch("sm_90"), Some((9, 0)));
        assert_eq!(parse_arch("sm_90a"), Some((9, 0)));
        assert_eq!(parse_arch("sm_120"), Some((12, 0)));
        assert_eq!(parse_arch("sm_9"), None);
        assert_eq!(parse_arch("compute_90"), None);
        assert_eq!(arch_name(8, 6), "sm_86");
    }

    #[test]
    fn format_version_is_checked() {
        let err = LockFile::parse("format = 7\nkernel = \"k\"\n").unwrap_err();
        assert!(err.contains("format 7 is not supported"), "{err}");
        let err = LockFile::parse("kernel = \"k\"\n").unwrap_err();
        assert!(err.contains("not a kopt file"), "{err}");
    }

    #[test]
    fn the_fake_device_is_recognised_by_name_and_nothing_else_is() {
        assert!(is_fake_device(FAKE_DEVICE_NAME));
        // As a rationale's provenance records it: `NAME (ARCH)`.
        assert!(is_fake_device(&format!("{FAKE_DEVICE_NAME} (sm_90)")));
        for real in [
            "NVIDIA H200 (sm_90)",
            "NVIDIA H200",
            "kopt fake GPU-like card",
            "",
        ] {
            assert!(!is_fake_device(real), "{real:?}");
        }
    }

    fn claim(source: Option<&str>, variant: Option<&str>) -> Claim {
        Claim {
            region: None,
            device: None,
            verified_by: VerifiedBy::Kopt,
            reference_hash: "sha256:r".into(),
            spec_hash: "sha256:s".into(),
            source_hash: source.map(|t| crate::source::hash(t.as_bytes())),
            variant_hash: variant.map(|t| crate::source::hash(t.as_bytes())),
            ptx: None,
        }
    }

    #[test]
    fn a_claim_names_the_file_that_differs_from_what_was_verified() {
        let c = claim(Some("src"), Some("toml"));
        assert_eq!(c.compare_files("src", "toml", None), ClaimedFiles::Match);
        assert_eq!(
            c.compare_files("src // edited", "toml", None),
            ClaimedFiles::Differs(SOURCE_FILE)
        );
        assert_eq!(
            c.compare_files("src", "toml # edited", None),
            ClaimedFiles::Differs(VARIANT_FILE)
        );
        // A PTX the claim does not record is not what it vouches for, and does not
        // count; another PTX than it records, or none, differs.
        assert_eq!(
            c.compare_files("src", "toml", Some(".version 8.8")),
            ClaimedFiles::Match
        );
        let with_ptx = Claim {
            ptx: Some(PtxRecord {
                hash: crate::source::hash(b".version 8.8"),
                nvrtc: "13.0".into(),
                arch: "sm_90".into(),
                symbol: None,
            }),
            ..c.clone()
        };
        assert_eq!(
            with_ptx.compare_files("src", "toml", Some(".version 8.8")),
            ClaimedFiles::Match
        );
        assert_eq!(
            with_ptx.compare_files("src", "toml", Some(".version 8.8 // edited")),
            ClaimedFiles::Differs(PTX_FILE)
        );
        assert_eq!(
            with_ptx.compare_files("src", "toml", None),
            ClaimedFiles::Differs(PTX_FILE)
        );
        // An older claim records no hashes: nothing can be told.
        assert_eq!(
            claim(None, None).compare_files("anything", "at all", None),
            ClaimedFiles::Unrecorded
        );
        // A recorded hash is checked even when the other is missing.
        let half = claim(Some("src"), None);
        assert_eq!(
            half.compare_files("src", "x", None),
            ClaimedFiles::Unrecorded
        );
        assert_eq!(
            half.compare_files("other", "x", None),
            ClaimedFiles::Differs(SOURCE_FILE)
        );
    }

    #[test]
    fn a_claim_without_file_hashes_reads_and_writes_as_before() {
        let old = r#"{"verified_by":"kopt","reference_hash":"sha256:r","spec_hash":"sha256:s"}"#;
        let c: Claim = serde_json::from_str(old).unwrap();
        assert_eq!(c, claim(None, None));
        assert_eq!(serde_json::to_string(&c).unwrap(), old);
    }

    #[test]
    fn the_skeleton_of_a_rationale_is_a_valid_rationale() {
        let r = Rationale::skeleton("softmax", "mine", "sm_90");
        assert_eq!(Rationale::parse(&r.to_json()).unwrap(), r);
        assert!(!r.provenance.from_fake_device());
    }

    #[test]
    fn atomic_write_replaces_whole_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a/b.toml");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let leftovers: Vec<_> = std::fs::read_dir(d.path().join("a")).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file left behind");
    }
}
