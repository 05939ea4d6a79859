//! The compile fence of `cargo kopt check`: every reference and every accepted variant
//! compiled with NVRTC for its architecture, on the CPU (NVRTC needs no GPU).
//!
//! NVRTC is the authority on what a source defines: an entry made by a macro or a
//! template, which the lexical scan of the build could only note, is confirmed here by
//! ptxas' list of the module's entry functions. The figures ptxas prints (registers,
//! spills, stack, static shared memory) are compared with what a variant's evidence
//! recorded.

use kopt::CompiledEntry;
use kopt_spec::files;
use kopt_spec::store::Problem;
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
    /// NVRTC's warnings (the log without ptxas' info lines).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub warnings: String,
}

/// The fence's outcome.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum CompileCheck {
    /// NVRTC could not be loaded: nothing was compiled (one line says why).
    Skipped { reason: String },
    Ran {
        nvrtc: String,
        include_dirs: Vec<String>,
        versions: Vec<CompiledVersion>,
        /// Failures: a compile error, an entry the module lacks, a variant that spills.
        problems: Vec<Problem>,
        /// What changed without failing: registers other than recorded.
        notes: Vec<String>,
    },
}

impl CompileCheck {
    pub fn problems(&self) -> &[Problem] {
        match self {
            CompileCheck::Skipped { .. } => &[],
            CompileCheck::Ran { problems, .. } => problems,
        }
    }
}

/// Compiles every gathered kernel's reference (for each architecture its lock names, or
/// [`DEFAULT_ARCH`]) and every usable accepted variant (for its architecture).
pub fn compile_check(g: &Gathered) -> CompileCheck {
    let Some((major, minor)) = kopt::nvrtc_version() else {
        return CompileCheck::Skipped {
            reason: "NVRTC (libnvrtc.so) could not be loaded, so no kernel was compiled: install the CUDA toolkit's NVRTC or the NVIDIA wheels (scripts/cuda-wheels.sh) and put its lib folder on LD_LIBRARY_PATH".into(),
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
        for arch in &archs {
            let options = k.spec.reference_options();
            versions.push(compile_one(
                k,
                "reference",
                &k.reference.text,
                &k.spec.entry,
                &options,
                arch,
                None,
                &mut problems,
                &mut notes,
            ));
        }
        for e in &k.state.entries {
            let Ok(u) = &e.status else { continue };
            let mut options: Vec<String> =
                kopt_spec::spec::define_options(&u.variant.defines).collect();
            options.extend(u.variant.options.iter().cloned());
            let recorded = recorded_registers(k, &e.entry.variant);
            versions.push(compile_one(
                k,
                &e.entry.variant,
                &u.source,
                &u.variant.entry,
                &options,
                &e.entry.arch,
                recorded,
                &mut problems,
                &mut notes,
            ));
        }
    }
    CompileCheck::Ran {
        nvrtc: format!("{major}.{minor}"),
        include_dirs: kopt::cuda_include_dirs(),
        versions,
        problems,
        notes,
    }
}

#[allow(clippy::too_many_arguments)]
fn compile_one(
    k: &Kernel,
    version: &str,
    source: &str,
    entry: &str,
    options: &[String],
    arch: &str,
    recorded_registers: Option<u32>,
    problems: &mut Vec<Problem>,
    notes: &mut Vec<String>,
) -> CompiledVersion {
    let path = if version == "reference" {
        format!("{}/{}", k.package, k.spec.reference)
    } else {
        format!(
            "{}/kopt/{}/{version}/{}",
            k.package,
            k.spec.name,
            files::SOURCE_FILE
        )
    };
    let mut opts: Vec<&str> = options.iter().map(String::as_str).collect();
    opts.push("--ptxas-options=-v");
    let mut out = CompiledVersion {
        package: k.package.clone(),
        kernel: k.spec.name.clone(),
        version: version.to_string(),
        arch: arch.to_string(),
        entry: entry.to_string(),
        resources: None,
        recorded_registers,
        warnings: String::new(),
    };
    let native = match kopt::compile_native(&k.spec.name, version, source, &opts, arch, Some(entry))
    {
        Ok(n) => n,
        Err(e) => {
            let log = match e {
                kopt::Error::Compile { log, .. } => log,
                other => other.to_string(),
            };
            problems.push(Problem {
                kernel: k.spec.name.clone(),
                path,
                problem: format!("`{version}` does not compile for {arch}:\n{log}"),
                fix: "fix the source (NVRTC's messages name the file and line)".into(),
            });
            return out;
        }
    };
    out.warnings = native
        .log
        .lines()
        .filter(|l| !l.starts_with("ptxas"))
        .collect::<Vec<_>>()
        .join("\n");
    let symbol = native.entry.clone().unwrap_or_else(|| entry.to_string());
    let entries = kopt::ptxas_entries(&native.log);
    match entries.into_iter().find(|e| e.name == symbol) {
        None => problems.push(Problem {
            kernel: k.spec.name.clone(),
            path,
            problem: format!(
                "the module NVRTC compiled from `{version}` for {arch} has no kernel `{entry}`"
            ),
            fix: "set `entry` to a `__global__` function the source defines (or a macro of it generates)".into(),
        }),
        Some(r) => {
            if r.spill_stores > 0 || r.spill_loads > 0 {
                problems.push(Problem {
                    kernel: k.spec.name.clone(),
                    path: path.clone(),
                    problem: format!(
                        "`{version}` spills for {arch}: {} bytes stored, {} loaded ({} registers)",
                        r.spill_stores, r.spill_loads, r.registers
                    ),
                    fix: "the compile has changed since verification: re-run `cargo kopt verify`, or lower the register pressure".into(),
                });
            }
            if let Some(rec) = recorded_registers.filter(|rec| *rec != r.registers) {
                notes.push(format!(
                    "{}::{} `{version}` for {arch}: {} registers with this NVRTC; its evidence recorded {rec}",
                    k.package, k.spec.name, r.registers
                ));
            }
            out.resources = Some(r);
        }
    }
    out
}

/// The registers a variant's rationale recorded (its first figure that has them).
fn recorded_registers(k: &Kernel, variant: &str) -> Option<u32> {
    let path = k.state.dir.join(variant).join(files::RATIONALE_JSON);
    let text = std::fs::read_to_string(path).ok()?;
    let r: files::Rationale = serde_json::from_str(&text).ok()?;
    r.figures.iter().find_map(|f| f.registers)
}
