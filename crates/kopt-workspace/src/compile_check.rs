//! The compile fence of `cargo kopt check`: every reference and every accepted variant
//! compiled with NVRTC for its architecture, on the CPU (NVRTC needs no GPU), through the
//! function that also compiles every candidate before a GPU worker sees it
//! ([`kopt_engine::precompile::precompile`]).
//!
//! NVRTC is the authority on what a source defines: an entry made by a macro or a
//! template, which the lexical scan of the build could only note, is confirmed here by
//! ptxas' list of the module's entry functions. The figures ptxas prints (registers,
//! spills, stack, static shared memory) are compared with what a variant's evidence
//! recorded ([`kopt_engine::precompile::compare`] says which difference fails the check
//! and which is a note).
//!
//! A variant with verified PTX (its `kernel.ptx`, which the launcher loads) is compared
//! with the PTX this compile made of its source: with the NVRTC that made it, they must
//! be the same text but for `//` comment lines (NVRTC's build banner), else the PTX that
//! runs is not what the source compiles to.
//!
//! Problems (exit 1): a version that does not compile, a module without the entry, a
//! variant that now spills where its evidence recorded no spill, verified PTX other than
//! what its source compiles to with the same NVRTC, and NVRTC missing under
//! `KOPT_REQUIRE_NVRTC=1`. Notes: NVRTC missing otherwise (one line, nothing compiled),
//! another compiler or other figures than the evidence's, verified PTX made by another
//! NVRTC than this one (not compared), warnings, a reference that spills (a reference has
//! no evidence to compare with).

use kopt::CompiledEntry;
use kopt_engine::job::KernelVersion;
use kopt_engine::precompile::{self, Match, Refused};
use kopt_spec::files::{self, CompileFigures};
use kopt_spec::selection::Problem;
use serde::Serialize;

use crate::gather::{Gathered, Kernel};

/// The architecture a reference is compiled for when no lock entry names one.
pub const DEFAULT_ARCH: &str = "sm_90";

/// One version compiled for one architecture.
#[derive(Debug, Clone, Serialize)]
pub struct CompiledVersion {
    pub package: String,
    pub kernel: String,
    /// `reference` or the variant's name.
    pub version: String,
    pub arch: String,
    pub entry: String,
    /// What ptxas reported of the entry; `None` when the compile failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<CompiledEntry>,
    /// Registers the variant's evidence recorded (its rationale's figures), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_registers: Option<u32>,
    /// The compile figures the variant's evidence recorded, if it recorded them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded: Option<CompileFigures>,
    /// How this compile compares with the evidence (variants that compiled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<Match>,
    /// NVRTC's and ptxas' warnings (the log without ptxas' info lines).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub warnings: String,
    /// How many warnings `warnings` holds.
    pub warning_count: usize,
    /// Why it failed, where it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// How its verified PTX compares with this compile's, where it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ptx: Option<PtxCheck>,
}

/// A variant's verified PTX against the PTX this check's compile made of its source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PtxCheck {
    /// The same text (comment lines aside).
    Matches,
    /// Another text, from the same NVRTC: the first line that differs (1-based).
    Differs { line: usize },
    /// Made by another NVRTC than this check's: not compared.
    OtherNvrtc { recorded: String, here: String },
}

/// Compares two PTX texts without their `//` comment lines (NVRTC writes its build into
/// them); `None`: the same, else the first differing line of `verified`, 1-based.
pub fn ptx_difference(verified: &str, compiled: &str) -> Option<usize> {
    let code = |t: &str| -> Vec<(usize, String)> {
        t.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim_start().starts_with("//"))
            .map(|(i, l)| (i + 1, l.trim_end().to_string()))
            .collect()
    };
    let (a, b) = (code(verified), code(compiled));
    let first = a.iter().zip(&b).find(|(x, y)| x.1 != y.1);
    match first {
        Some((x, _)) => Some(x.0),
        None if a.len() == b.len() => None,
        None => Some(a.get(b.len()).map_or(verified.lines().count() + 1, |x| x.0)),
    }
}

/// A version the fence refused.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    pub kind: FailureKind,
    /// NVRTC's log, or the entries the module holds instead.
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureKind {
    /// NVRTC reported errors.
    Compile,
    /// It compiled, but the module has no kernel of the entry's name.
    NoEntry,
    /// NVRTC could not be loaded.
    NoNvrtc,
    /// NVRTC gave no ptxas report (a compile answered from its cache).
    NoReport,
}

impl FailureKind {
    /// For a table cell.
    pub fn text(self) -> &'static str {
        match self {
            FailureKind::Compile => "failed",
            FailureKind::NoEntry => "no entry",
            FailureKind::NoNvrtc => "no NVRTC",
            FailureKind::NoReport => "no report",
        }
    }
}

/// The fence's outcome.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum CompileCheck {
    /// NVRTC could not be loaded: nothing was compiled (one line says why). A problem
    /// only under `KOPT_REQUIRE_NVRTC`.
    Skipped {
        reason: String,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        problems: Vec<Problem>,
    },
    Ran {
        nvrtc: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        cuda_headers: Option<String>,
        include_dirs: Vec<String>,
        versions: Vec<CompiledVersion>,
        /// Failures: a compile error, an entry the module lacks, a variant that spills
        /// where its evidence recorded none.
        problems: Vec<Problem>,
        /// What changed without failing: the compiler, the figures, warnings.
        notes: Vec<String>,
    },
}

impl CompileCheck {
    pub fn problems(&self) -> &[Problem] {
        match self {
            CompileCheck::Skipped { problems, .. } | CompileCheck::Ran { problems, .. } => problems,
        }
    }
}

/// The one line `check` prints when NVRTC cannot be loaded.
pub const NO_NVRTC: &str = "NVRTC (libnvrtc.so) could not be loaded, so no kernel was compiled: install the CUDA toolkit's NVRTC or the NVIDIA wheels (scripts/cuda-wheels.sh) and put its lib folder on LD_LIBRARY_PATH";

/// Compiles every gathered kernel's reference (for each architecture its lock names, or
/// [`DEFAULT_ARCH`]) and every usable accepted variant (for its architecture).
pub fn compile_check(g: &Gathered) -> CompileCheck {
    let Some((major, minor)) = kopt::nvrtc_version() else {
        let problems = if kopt::gpu::nvrtc_required() {
            vec![Problem {
                kernel: String::new(),
                path: "KOPT_REQUIRE_NVRTC".into(),
                problem: format!("KOPT_REQUIRE_NVRTC is set, but {NO_NVRTC}"),
                fix: "source target/cuda-wheels/cu13/env.sh (scripts/cuda-wheels.sh writes it), or unset KOPT_REQUIRE_NVRTC to let check pass without compiling".into(),
            }]
        } else {
            Vec::new()
        };
        return CompileCheck::Skipped {
            reason: NO_NVRTC.into(),
            problems,
        };
    };
    let mut versions = Vec::new();
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    for k in &g.kernels {
        let mut archs: Vec<String> = k
            .state
            .entries
            .iter()
            .filter(|e| e.status.is_ok())
            .map(|e| e.entry.arch.clone())
            .collect();
        archs.dedup();
        if archs.is_empty() {
            archs.push(DEFAULT_ARCH.into());
        }
        let reference = KernelVersion::reference(&k.spec, &k.reference.text);
        for arch in &archs {
            let (out, _) = compile_one(k, &reference, arch, None, &mut problems, &mut notes);
            versions.push(out);
        }
        for e in &k.state.entries {
            let Ok(u) = &e.status else { continue };
            let variant = KernelVersion::variant(&u.variant, &u.source);
            let evidence = recorded(k, &e.entry.variant);
            let (mut out, compiled) = compile_one(
                k,
                &variant,
                &e.entry.arch,
                Some(evidence),
                &mut problems,
                &mut notes,
            );
            if let (Some(p), Some(compiled)) = (&u.ptx, compiled) {
                let here = format!("{major}.{minor}");
                out.ptx = Some(check_ptx(
                    k,
                    &e.entry,
                    p,
                    &compiled,
                    &here,
                    &mut problems,
                    &mut notes,
                ));
            }
            versions.push(out);
        }
    }
    CompileCheck::Ran {
        nvrtc: format!("{major}.{minor}"),
        cuda_headers: kopt::cuda_headers_version(),
        include_dirs: kopt::cuda_include_dirs(),
        versions,
        problems,
        notes,
    }
}

/// Compares an entry's verified PTX with `compiled`, this check's PTX of its source.
fn check_ptx(
    k: &Kernel,
    entry: &files::LockEntry,
    verified: &kopt_spec::selection::VerifiedPtx,
    compiled: &str,
    here: &str,
    problems: &mut Vec<Problem>,
    notes: &mut Vec<String>,
) -> PtxCheck {
    let rel = format!(
        "{}/kopt/{}/{}/{}",
        k.package,
        k.spec.name,
        entry.variant,
        files::PTX_FILE
    );
    if verified.record.nvrtc != here {
        notes.push(format!(
            "{rel}: made by NVRTC {}, this check has NVRTC {here}; not compared (the launcher loads it as it is)",
            verified.record.nvrtc
        ));
        return PtxCheck::OtherNvrtc {
            recorded: verified.record.nvrtc.clone(),
            here: here.to_string(),
        };
    }
    match ptx_difference(&verified.text, compiled) {
        None => PtxCheck::Matches,
        Some(line) => {
            problems.push(Problem {
                kernel: k.spec.name.clone(),
                path: rel.clone(),
                problem: format!(
                    "the verified PTX of `{}` is not what NVRTC {here} compiles its {} to for {} (they differ from line {line}): the code the launcher loads is not the source's",
                    entry.variant,
                    files::SOURCE_FILE,
                    entry.arch
                ),
                fix: format!(
                    "restore both files from version control (`git checkout -- {}`); if the CUDA headers differ from the ones it was verified with, verify it again here (`cargo kopt verify`)",
                    rel.trim_end_matches(files::PTX_FILE)
                ),
            });
            PtxCheck::Differs { line }
        }
    }
}

/// What a variant's rationale recorded of its compile.
#[derive(Debug, Clone, Default)]
struct Recorded {
    figures: Option<CompileFigures>,
    registers: Option<u32>,
}

/// `evidence`: `None` for the reference, which has none.
fn compile_one(
    k: &Kernel,
    v: &KernelVersion,
    arch: &str,
    evidence: Option<Recorded>,
    problems: &mut Vec<Problem>,
    notes: &mut Vec<String>,
) -> (CompiledVersion, Option<String>) {
    let version = v.id.as_str();
    let path = if evidence.is_none() {
        format!("{}/{}", k.package, k.spec.reference)
    } else {
        format!(
            "{}/kopt/{}/{version}/{}",
            k.package,
            k.spec.name,
            files::SOURCE_FILE
        )
    };
    let who = format!("{}::{} `{version}` for {arch}", k.package, k.spec.name);
    let recorded = evidence.clone().unwrap_or_default();
    let mut out = CompiledVersion {
        package: k.package.clone(),
        kernel: k.spec.name.clone(),
        version: version.to_string(),
        arch: arch.to_string(),
        entry: v.entry.clone(),
        resources: None,
        recorded_registers: recorded.registers,
        recorded: recorded.figures.clone(),
        evidence: None,
        warnings: String::new(),
        warning_count: 0,
        failure: None,
        ptx: None,
    };
    let problem = |problem: String, fix: &str| Problem {
        kernel: k.spec.name.clone(),
        path: path.clone(),
        problem,
        fix: fix.to_string(),
    };
    let compiled = match precompile::precompile(&k.spec.name, v, arch, false) {
        Ok(c) => c,
        Err(why) => {
            problems.push(match &why {
                Refused::Compile(log) => problem(
                    format!("`{version}` does not compile for {arch}:\n{log}"),
                    "fix the source (NVRTC's messages name the file and line)",
                ),
                Refused::NoEntry(detail) => problem(
                    format!(
                        "the module NVRTC compiled from `{version}` for {arch} has no kernel `{}`: {detail}",
                        v.entry
                    ),
                    "set `entry` to a `__global__` function the source defines (or a macro of it generates)",
                ),
                Refused::NoNvrtc(m) => problem(m.clone(), "install NVRTC (scripts/cuda-wheels.sh)"),
                Refused::NoReport(m) => problem(
                    m.clone(),
                    &format!("run it again with {}=1", kopt::NVRTC_CACHE_SWITCH),
                ),
            });
            out.failure = Some(Failure {
                kind: match why {
                    Refused::Compile(_) => FailureKind::Compile,
                    Refused::NoEntry(_) => FailureKind::NoEntry,
                    Refused::NoNvrtc(_) => FailureKind::NoNvrtc,
                    Refused::NoReport(_) => FailureKind::NoReport,
                },
                message: why.message().to_string(),
            });
            return (out, None);
        }
    };
    out.warning_count = kopt::warning_count(&compiled.warnings);
    if out.warning_count > 0 {
        notes.push(format!(
            "{who}: {} warning(s):\n{}",
            out.warning_count, compiled.warnings
        ));
    }
    out.warnings = compiled.warnings;
    out.resources = compiled.resources;
    let ptx = compiled.ptx;
    let Some(now) = compiled.figures else {
        return (out, ptx);
    };
    match evidence {
        None => {
            if now.spills() {
                notes.push(format!(
                    "{who}: spills ({} bytes of spill stores, {} of spill loads, {} registers); not a failure, since a reference has no evidence to compare with",
                    now.spill_stores, now.spill_loads, now.registers
                ));
            }
        }
        Some(r) => {
            let c = precompile::compare(&now, r.figures.as_ref(), r.registers);
            out.evidence = Some(c.matched);
            for p in c.problems {
                problems.push(problem(
                    format!("`{version}` {p}"),
                    "its compile has changed since it was verified (another NVRTC or CUDA headers): verify it again (`cargo kopt verify`) and accept a new variant, or lower its register pressure (`__launch_bounds__`, fewer live values)",
                ));
            }
            notes.extend(c.notes.into_iter().map(|n| format!("{who}: {n}")));
        }
    }
    (out, ptx)
}

/// What a variant's rationale recorded: its compile figures, and the registers of its
/// first measured figure that has them.
fn recorded(k: &Kernel, variant: &str) -> Recorded {
    let path = k.state.dir.join(variant).join(files::RATIONALE_JSON);
    let Some(r) = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| files::Rationale::parse(&text).ok())
    else {
        return Recorded::default();
    };
    Recorded {
        registers: r.figures.iter().find_map(|f| f.registers),
        figures: r.compile,
    }
}
