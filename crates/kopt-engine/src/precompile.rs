//! The compile fence on the CPU: every version is compiled by NVRTC in the parent process
//! before any GPU worker sees it (`optimize`'s loop, the MCP server, `search`'s compile
//! pool and its final verification), and `cargo kopt check` compiles every reference and
//! accepted variant through the same function. A version that does not compile, or whose
//! module lacks its entry, is refused here with the compiler's message; the worker is
//! never involved.
//!
//! [`compare`] decides what a compile that differs from a variant's recorded figures
//! means:
//!
//! - a **problem** (it fails `check`): the variant now spills where its evidence recorded
//!   no spill (or recorded no compile figures at all, so nothing shows it spilled when it
//!   was verified); a compile that fails or a missing entry is already a problem of
//!   [`precompile`];
//! - a **note**: another NVRTC or other CUDA headers than the evidence's; registers,
//!   spills, stack or static shared memory other than recorded; a variant that spilled
//!   when it was verified and still does. The numbers moved, but the code that was
//!   verified still builds without a new spill, and only a new verification can say
//!   whether it is slower.

use kopt_spec::files::CompileFigures;

use crate::job::KernelVersion;
use crate::verdict::Verdict;

/// What the CPU-side compile made of a version: the code the worker may load instead of
/// compiling, and ptxas' figures of the entry.
#[derive(Debug, Clone)]
pub struct Precompiled {
    /// PTX where NVRTC keeps it (or the fake device's pseudo-PTX).
    pub ptx: Option<String>,
    /// The machine code for the real architecture (none on the fake device).
    pub cubin: Option<Vec<u8>>,
    /// The entry's lowered name where it differs from the version's entry.
    pub symbol: Option<String>,
    /// What ptxas reported of the entry (none on the fake device).
    pub resources: Option<kopt::CompiledEntry>,
    /// The same figures as a variant's evidence records them, with the compiler's version.
    pub figures: Option<CompileFigures>,
    /// NVRTC's and ptxas' warnings, empty for a clean compile.
    pub warnings: String,
}

/// The switch a process that compiles through [`precompile`] sets to `1` to get ptxas'
/// report from every compile (see [`kopt::NVRTC_CACHE_SWITCH`]).
pub use kopt::NVRTC_CACHE_SWITCH;

/// Why [`precompile`] refused a version, with what to show its author.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// NVRTC's log (file and line of each error).
    Compile(String),
    /// The module compiled, but holds no entry of that name: which entries it holds.
    NoEntry(String),
    /// NVRTC cannot be loaded.
    NoNvrtc(String),
    /// NVRTC compiled it but gave no ptxas report to check it against (a compile answered
    /// from NVRTC's cache): not the version's fault, and nothing is known of it.
    NoReport(String),
}

impl Refused {
    pub fn message(&self) -> &str {
        match self {
            Refused::Compile(m)
            | Refused::NoEntry(m)
            | Refused::NoNvrtc(m)
            | Refused::NoReport(m) => m,
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

/// Compiles `v` (a version of the kernel `kernel`) for the real architecture `arch`
/// (`sm_90`) with NVRTC on the CPU and confirms that the module holds its entry; `fake`:
/// the fake device's pseudo-compiler ([`crate::worker::fake::fake_compile`]) instead, as
/// the fake worker would compile.
pub fn precompile(
    kernel: &str,
    v: &KernelVersion,
    arch: &str,
    fake: bool,
) -> Result<Precompiled, Refused> {
    if fake {
        // The fake device compiles no module to look in: the lexical scan the build
        // makes stands in for ptxas' list of entries.
        if kopt_spec::source::entry_presence(&v.source, &v.entry)
            == kopt_spec::source::EntryPresence::Absent
        {
            return Err(Refused::NoEntry(
                kopt::Error::NoEntry {
                    kernel: kernel.to_string(),
                    variant: v.id.clone(),
                    entry: v.entry.clone(),
                    detail: "the fake device's compiler finds it neither written nor made by a macro or template".into(),
                }
                .to_string(),
            ));
        }
        return crate::worker::fake::fake_compile(v)
            .map(|ptx| Precompiled {
                ptx: Some(ptx),
                cubin: None,
                symbol: None,
                resources: None,
                figures: None,
                warnings: String::new(),
            })
            .map_err(Refused::Compile);
    }
    let options = v.compile_options();
    let opts: Vec<&str> = options.iter().map(String::as_str).collect();
    let c =
        kopt::compile_entry(kernel, &v.id, &v.source, &opts, arch, &v.entry).map_err(
            |e| match e {
                kopt::Error::Compile { log, .. } => Refused::Compile(log),
                e @ kopt::Error::NoEntry { .. } => Refused::NoEntry(e.to_string()),
                e @ kopt::Error::NoPtxasReport { .. } => Refused::NoReport(e.to_string()),
                other => Refused::NoNvrtc(other.to_string()),
            },
        )?;
    let figures = figures(&c);
    Ok(Precompiled {
        symbol: c.native.entry.clone().filter(|s| *s != v.entry),
        ptx: c.native.ptx,
        cubin: Some(c.native.cubin),
        resources: Some(c.resources),
        figures: Some(figures),
        warnings: c.warnings,
    })
}

/// The lock's record of a PTX that `figures`' compile produced (NVRTC and architecture),
/// `symbol` its entry's lowered name where that differs from the entry.
pub fn ptx_record(
    ptx: &str,
    figures: &CompileFigures,
    symbol: Option<String>,
) -> kopt_spec::files::PtxRecord {
    kopt_spec::files::PtxRecord {
        hash: kopt_spec::source::hash(ptx.as_bytes()),
        nvrtc: figures.nvrtc.clone(),
        arch: figures.arch.clone(),
        symbol,
    }
}

/// The verdict of a version [`precompile`] refused: the compile fence failed, with the
/// compiler's message, and nothing ran on a GPU.
pub fn rejected(why: &Refused) -> Verdict {
    Verdict::compile_rejected(why.message())
}

/// The recorded form of a compile: ptxas' figures of the entry, and the NVRTC and CUDA
/// headers that produced them.
pub fn figures(c: &kopt::EntryCompile) -> CompileFigures {
    let (nvrtc, cuda_headers) = compiler_identity();
    CompileFigures {
        nvrtc: nvrtc.clone(),
        cuda_headers: cuda_headers.clone(),
        arch: c.arch.clone(),
        registers: c.resources.registers,
        spill_stores: c.resources.spill_stores,
        spill_loads: c.resources.spill_loads,
        stack_bytes: c.resources.stack_bytes,
        shared_bytes: c.resources.shared_bytes,
    }
}

/// NVRTC's version and the CUDA headers' version, read once per process.
fn compiler_identity() -> &'static (String, Option<String>) {
    static ID: std::sync::OnceLock<(String, Option<String>)> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let nvrtc = kopt::nvrtc_version()
            .map(|(major, minor)| format!("{major}.{minor}"))
            .unwrap_or_else(|| "unknown".into());
        (nvrtc, kopt::cuda_headers_version())
    })
}

/// The figures a variant's evidence would record for `v` on `arch`: NVRTC's compile on
/// the CPU, whatever device verified it (the figures are the compiler's, not the
/// device's). `None` where NVRTC cannot be loaded or does not compile `v` (a fake
/// device's candidate need not be CUDA).
pub fn record(kernel: &str, v: &KernelVersion, arch: &str) -> Option<CompileFigures> {
    if !kopt::gpu::nvrtc_present() {
        return None;
    }
    precompile(kernel, v, arch, false).ok()?.figures
}

/// How a compile compares with what a variant's evidence recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Match {
    /// Every recorded figure, and the compiler, are the same.
    Same,
    /// Something differs (the notes and problems say what).
    Differs,
    /// Only registers were recorded (evidence from before kopt recorded compile
    /// figures), and they are the same.
    RegistersSame,
    /// Only registers were recorded, and they differ.
    RegistersDiffer,
    /// The evidence records no compile figure.
    NotRecorded,
}

impl Match {
    /// For a table cell.
    pub fn text(self) -> &'static str {
        match self {
            Match::Same => "same",
            Match::Differs => "differs",
            Match::RegistersSame => "registers same",
            Match::RegistersDiffer => "registers differ",
            Match::NotRecorded => "not recorded",
        }
    }
}

/// [`compare`]'s findings: problems fail `check`, notes do not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comparison {
    pub matched: Match,
    pub problems: Vec<String>,
    pub notes: Vec<String>,
}

/// Compares a variant's compile now with what its evidence recorded: `recorded`, the
/// compile figures (absent in evidence written before kopt recorded them), else
/// `recorded_registers`, the registers of its measured figures. The rules are the
/// module's ([`self`]).
pub fn compare(
    now: &CompileFigures,
    recorded: Option<&CompileFigures>,
    recorded_registers: Option<u32>,
) -> Comparison {
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let spill_text = |f: &CompileFigures| {
        format!(
            "{} bytes of spill stores, {} of spill loads ({} registers)",
            f.spill_stores, f.spill_loads, f.registers
        )
    };
    let matched = match recorded {
        Some(r) => {
            if now.nvrtc != r.nvrtc || now.cuda_headers != r.cuda_headers {
                notes.push(format!(
                    "compiled with NVRTC {}{}, its evidence with NVRTC {}{}",
                    now.nvrtc,
                    headers(&now.cuda_headers),
                    r.nvrtc,
                    headers(&r.cuda_headers)
                ));
            }
            let changed: Vec<String> = [
                ("registers", r.registers, now.registers, ""),
                ("spill stores", r.spill_stores, now.spill_stores, " B"),
                ("spill loads", r.spill_loads, now.spill_loads, " B"),
                ("stack", r.stack_bytes, now.stack_bytes, " B"),
                (
                    "static shared memory",
                    r.shared_bytes,
                    now.shared_bytes,
                    " B",
                ),
            ]
            .into_iter()
            .filter(|(_, was, is, _)| was != is)
            .map(|(what, was, is, unit)| format!("{what} {was}{unit} -> {is}{unit}"))
            .collect();
            if now.spills() && !r.spills() {
                problems.push(format!(
                    "spills for {}: {}, where its evidence recorded none ({}); a spill makes local-memory traffic the verification never measured",
                    now.arch,
                    spill_text(now),
                    r.describe()
                ));
            } else if !changed.is_empty() {
                notes.push(format!(
                    "its compile for {} changed since it was verified: {}",
                    now.arch,
                    changed.join(", ")
                ));
            }
            if now.spills() && r.spills() {
                notes.push(format!(
                    "spills for {} ({}), as it did when it was verified",
                    now.arch,
                    spill_text(now)
                ));
            }
            if notes.is_empty() && problems.is_empty() {
                Match::Same
            } else {
                Match::Differs
            }
        }
        None => {
            if now.spills() {
                problems.push(format!(
                    "spills for {}: {}, and its evidence records no compile figures to show that it spilled when it was verified",
                    now.arch,
                    spill_text(now)
                ));
            }
            match recorded_registers {
                Some(rec) if rec != now.registers => {
                    notes.push(format!(
                        "{} registers with NVRTC {}; its evidence recorded {rec} (measured on the device, before kopt recorded compile figures)",
                        now.registers, now.nvrtc
                    ));
                    Match::RegistersDiffer
                }
                Some(_) => Match::RegistersSame,
                None => Match::NotRecorded,
            }
        }
    };
    Comparison {
        matched,
        problems,
        notes,
    }
}

fn headers(h: &Option<String>) -> String {
    h.as_ref()
        .map(|h| format!(" (CUDA headers {h})"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(source: &str, entry: &str) -> KernelVersion {
        let item = kopt_spec::spec::parse_item(
            "fn k(s: &CudaStream, y: &mut CudaSlice<f32>, n: u32);"
                .parse()
                .unwrap(),
        )
        .unwrap();
        let spec = kopt_spec::spec::parse_kernel(
            "reference = \"k.cu\", entry = \"k\", y: [n], grid = n / 256, block = BLOCK, shapes = [{ n: 1024 }], tunables = { BLOCK: 256 in [256, 512] }"
                .parse()
                .unwrap(),
            &item,
        )
        .unwrap()
        .0;
        let mut v = KernelVersion::reference(&spec, source);
        v.id = "candidate".into();
        v.entry = entry.into();
        v
    }

    const KERNEL: &str = "extern \"C\" __global__ void k(float* y, unsigned n) { __shared__ float t[BLOCK]; t[threadIdx.x] = 1.f; __syncthreads(); if (threadIdx.x < n) y[threadIdx.x] = t[BLOCK - 1 - threadIdx.x]; }\n";

    #[test]
    fn nvrtc_compiles_with_the_version_s_defines_and_reports_its_figures() {
        if !kopt::gpu::nvrtc_for_test() {
            return;
        }
        let p = precompile("k", &version(KERNEL, "k"), "sm_90", false).unwrap();
        assert!(p.cubin.as_ref().is_some_and(|c| !c.is_empty()));
        let f = p.figures.unwrap();
        // BLOCK came from the version's defines (256 floats of static shared memory).
        assert_eq!((f.arch.as_str(), f.shared_bytes), ("sm_90", 1024), "{f:?}");
        assert!(!f.spills() && f.registers > 0, "{f:?}");
        let (major, minor) = kopt::nvrtc_version().unwrap();
        assert_eq!(f.nvrtc, format!("{major}.{minor}"));
        assert_eq!(p.resources.unwrap().name, "k");
        assert_eq!(record("k", &version(KERNEL, "k"), "sm_90"), Some(f));
    }

    #[test]
    fn nvrtc_refuses_a_missing_entry_and_a_compile_error_with_their_messages() {
        if !kopt::gpu::nvrtc_for_test() {
            return;
        }
        let why = precompile("k", &version(KERNEL, "k_vec4"), "sm_90", false).unwrap_err();
        assert!(matches!(why, Refused::NoEntry(_)), "{why}");
        assert!(
            why.message().contains("has no kernel `k_vec4`")
                && why.message().contains("it holds `k`"),
            "{why}"
        );
        let broken = KERNEL.replace("t[threadIdx.x] = 1.f;", "t[threadIdx.x] = undeclared;");
        let why = precompile("k", &version(&broken, "k"), "sm_90", false).unwrap_err();
        assert!(matches!(why, Refused::Compile(_)), "{why}");
        assert!(
            why.message()
                .contains("identifier \"undeclared\" is undefined"),
            "{why}"
        );
        let v = rejected(&why);
        assert!(!v.accepted);
        assert_eq!(v.fences(), vec![crate::verdict::Fence::Compile]);
        assert!(v.summary().starts_with("compile: "), "{}", v.summary());
        assert!(
            v.summary().contains("no GPU worker ran it"),
            "{}",
            v.summary()
        );
        assert!(v.compile_log.contains("undeclared"), "{}", v.compile_log);
        assert_eq!(record("k", &version(&broken, "k"), "sm_90"), None);
    }

    #[test]
    fn the_fake_device_s_compiler_refuses_what_the_fake_worker_would() {
        let v = version(
            &format!("{KERNEL}// kopt-fake: compile-error expected a ';'\n"),
            "k",
        );
        let why = precompile("k", &v, "sm_90", true).unwrap_err();
        assert!(matches!(why, Refused::Compile(_)), "{why}");
        assert!(why.message().contains("error: expected a ';'"), "{why}");
        let why = precompile("k", &version(KERNEL, "k_vec4"), "sm_90", true).unwrap_err();
        assert!(matches!(why, Refused::NoEntry(_)), "{why}");
        assert!(why.message().contains("has no kernel `k_vec4`"), "{why}");
        let p = precompile("k", &version(KERNEL, "k"), "sm_90", true).unwrap();
        assert!(p.ptx.unwrap().contains(".entry k("));
        assert!(p.figures.is_none() && p.cubin.is_none());
    }

    fn recorded(registers: u32, spills: u32) -> CompileFigures {
        CompileFigures {
            nvrtc: "13.0".into(),
            cuda_headers: Some("13.0".into()),
            arch: "sm_90".into(),
            registers,
            spill_stores: spills,
            spill_loads: spills,
            stack_bytes: spills,
            shared_bytes: 256,
        }
    }

    #[test]
    fn the_same_compile_is_same() {
        let c = compare(&recorded(40, 0), Some(&recorded(40, 0)), Some(40));
        assert_eq!(c.matched, Match::Same);
        assert!(c.problems.is_empty() && c.notes.is_empty(), "{c:?}");
    }

    #[test]
    fn a_new_spill_is_a_problem() {
        let c = compare(&recorded(255, 16), Some(&recorded(200, 0)), None);
        assert_eq!(c.matched, Match::Differs);
        assert_eq!(c.problems.len(), 1, "{c:?}");
        assert!(
            c.problems[0].starts_with("spills for sm_90: 16 bytes of spill stores, 16 of spill loads (255 registers), where its evidence recorded none (NVRTC 13.0 (CUDA headers 13.0), sm_90: 200 registers, no spills"),
            "{c:?}"
        );
    }

    #[test]
    fn a_spill_recorded_when_verified_is_a_note() {
        let c = compare(&recorded(255, 16), Some(&recorded(255, 8)), None);
        assert!(c.problems.is_empty(), "{c:?}");
        assert_eq!(
            c.notes,
            vec![
                "its compile for sm_90 changed since it was verified: spill stores 8 B -> 16 B, spill loads 8 B -> 16 B, stack 8 B -> 16 B".to_string(),
                "spills for sm_90 (16 bytes of spill stores, 16 of spill loads (255 registers)), as it did when it was verified".to_string(),
            ]
        );
    }

    #[test]
    fn other_figures_and_another_compiler_are_notes() {
        let mut before = recorded(40, 0);
        before.nvrtc = "12.9".into();
        before.cuda_headers = Some("12.9".into());
        before.shared_bytes = 128;
        let c = compare(&recorded(48, 0), Some(&before), None);
        assert_eq!(c.matched, Match::Differs);
        assert!(c.problems.is_empty(), "{c:?}");
        assert_eq!(
            c.notes,
            vec![
                "compiled with NVRTC 13.0 (CUDA headers 13.0), its evidence with NVRTC 12.9 (CUDA headers 12.9)".to_string(),
                "its compile for sm_90 changed since it was verified: registers 40 -> 48, static shared memory 128 B -> 256 B".to_string(),
            ]
        );
        // Another compiler alone, same figures: a note, nothing else.
        let mut same = recorded(48, 0);
        same.nvrtc = "12.9".into();
        let c = compare(&recorded(48, 0), Some(&same), None);
        assert_eq!(c.matched, Match::Differs);
        assert_eq!(c.notes.len(), 1, "{c:?}");
    }

    #[test]
    fn old_evidence_compares_registers_and_fails_any_spill() {
        let c = compare(&recorded(48, 0), None, Some(48));
        assert_eq!((c.matched, c.notes.len()), (Match::RegistersSame, 0));
        let c = compare(&recorded(48, 0), None, Some(40));
        assert_eq!(c.matched, Match::RegistersDiffer);
        assert_eq!(
            c.notes,
            vec!["48 registers with NVRTC 13.0; its evidence recorded 40 (measured on the device, before kopt recorded compile figures)".to_string()]
        );
        let c = compare(&recorded(48, 4), None, None);
        assert_eq!(c.matched, Match::NotRecorded);
        assert_eq!(c.problems.len(), 1, "{c:?}");
        assert!(
            c.problems[0].contains("records no compile figures"),
            "{c:?}"
        );
    }
}
