//! NVRTC compilation and module loading for the generated launchers.

use std::sync::Arc;

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction};

use crate::kernel::VariantDef;
use crate::Error;

/// Folders holding CUDA's own headers, for `#include <...>` (and quoted includes that
/// are not the crate's own): `KOPT_CUDA_INCLUDE` (a path list) first, then for each
/// toolkit root among `$CUDA_HOME`, `$CUDA_PATH`, `$CUDA_ROOT` and `/usr/local/cuda` its
/// `include` folder and, where the toolkit keeps CCCL apart (CUDA 13: libcu++, CUB and
/// Thrust under `include/cccl`), that folder too. A root counts when its `include` holds
/// `cuda_fp16.h`. The NVIDIA wheels' layout (`.../site-packages/nvidia/cu13`) is such a
/// root.
pub fn cuda_include_dirs() -> Vec<String> {
    use std::path::PathBuf;
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(list) = std::env::var_os("KOPT_CUDA_INCLUDE") {
        dirs.extend(std::env::split_paths(&list).filter(|d| d.is_dir()));
    }
    let mut roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    roots.push("/usr/local/cuda".into());
    for root in roots {
        let include = root.join("include");
        if include.join("cuda_fp16.h").is_file() {
            dirs.push(include.clone());
            let cccl = include.join("cccl");
            if cccl.join("cuda").join("std").is_dir() {
                dirs.push(cccl);
            }
        }
    }
    let mut out: Vec<String> = Vec::new();
    for d in dirs {
        let s = d.to_string_lossy().into_owned();
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// Everything besides a version's source and options that changes what NVRTC makes of
/// it, as one string for cache keys: NVRTC's version, the CUDA include folders and a
/// digest of their files (path, size, modification time), the standard-header shims'
/// version, and the environment variables that choose the toolkit. Computed once per
/// process (a walk over the toolkit's headers).
pub fn compile_environment() -> &'static str {
    static ENV: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ENV.get_or_init(|| {
        let dirs = cuda_include_dirs();
        let vars: Vec<String> = ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "KOPT_CUDA_INCLUDE"]
            .iter()
            .map(|v| format!("{v}={}", std::env::var(v).unwrap_or_default()))
            .collect();
        format!(
            "nvrtc {:?}; shims {}; {}; include {:?} {}",
            nvrtc_version(),
            crate::headers::SHIMS_VERSION,
            vars.join(" "),
            dirs,
            include_digest(
                &dirs
                    .iter()
                    .map(std::path::PathBuf::from)
                    .collect::<Vec<_>>()
            )
        )
    })
}

/// A digest of every file under `dirs`: relative path, size and modification time, in a
/// fixed order. A header edited, added or removed changes it.
pub fn include_digest(dirs: &[std::path::PathBuf]) -> String {
    fn walk(dir: &std::path::Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<_> = entries.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let path = e.path();
            match e.metadata() {
                Ok(m) if m.is_dir() => walk(&path, out),
                Ok(m) => {
                    let mtime = m
                        .modified()
                        .ok()
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map_or(0, |d| d.as_nanos());
                    out.push(format!("{}|{}|{mtime}", path.display(), m.len()));
                }
                Err(_) => {}
            }
        }
    }
    let mut lines = Vec::new();
    for d in dirs {
        walk(d, &mut lines);
    }
    use std::hash::{Hash, Hasher};
    // Not a security boundary: a stable 64-bit digest of the listing is enough to tell
    // one toolkit state from another.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    lines.hash(&mut h);
    format!("{} files, {:016x}", lines.len(), h.finish())
}

/// NVRTC's version (`(13, 0)`), or `None` where NVRTC cannot be loaded.
pub fn nvrtc_version() -> Option<(i32, i32)> {
    if !crate::gpu::nvrtc_present() {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loadable (checked above); the out-pointers are valid.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .ok()?;
    Some((major, minor))
}

/// Whether `entry` is a C++ name expression (`softmax<float, 256>`, `ns::k`) rather than
/// a plain `extern "C"` identifier: NVRTC then lowers it to the mangled name the module
/// holds.
pub fn is_name_expression(entry: &str) -> bool {
    !entry.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `option` chooses the target architecture (`--gpu-architecture=...`, `-arch=...`).
fn is_arch_option(option: &str) -> bool {
    option.starts_with("--gpu-architecture") || option.starts_with("-arch")
}

/// Whether the options already choose a target architecture.
fn names_arch(options: &[&str]) -> bool {
    options.iter().any(|o| is_arch_option(o))
}

/// The real architecture that options such as `--gpu-architecture=compute_90a` choose
/// (`sm_90a`), where they choose one: a variant that needs arch-specific instructions
/// (wgmma) names it, and tools that report what they compiled say so.
pub fn options_arch(options: &[&str]) -> Option<String> {
    let option = options.iter().find(|o| is_arch_option(o))?;
    let (_, value) = option.split_once(['=', ' '])?;
    Some(value.trim().replace("compute_", "sm_"))
}

/// Compiles `source` to PTX for compute capability `cc`. The error carries NVRTC's full
/// log (file names and line numbers come from the `#line` markers of the source).
pub fn compile_ptx(
    kernel: &str,
    variant: &str,
    source: &str,
    options: &[&str],
    cc: (i32, i32),
) -> Result<cudarc::nvrtc::Ptx, Error> {
    compile_module(kernel, variant, source, options, cc, None).map(|m| m.ptx)
}

/// A compiled module and what the loader needs to find its entry in it.
#[derive(Debug)]
pub struct Module {
    pub ptx: cudarc::nvrtc::Ptx,
    /// The entry's name in the module: the entry itself, or NVRTC's lowered (mangled)
    /// name of a name expression such as `softmax<float>`.
    pub entry: Option<String>,
    /// NVRTC's log of a successful compile (warnings), trimmed; often empty.
    pub log: String,
}

/// [`compile_ptx`], also lowering `entry` when it is a name expression
/// ([`is_name_expression`]).
pub fn compile_module(
    kernel: &str,
    variant: &str,
    source: &str,
    options: &[&str],
    cc: (i32, i32),
    entry: Option<&str>,
) -> Result<Module, Error> {
    let mut opts: Vec<String> = options.iter().map(|s| s.to_string()).collect();
    if !names_arch(options) {
        opts.push(format!("--gpu-architecture=compute_{}{}", cc.0, cc.1));
    }
    let out = nvrtc(kernel, variant, source, opts, entry, false)?;
    Ok(Module {
        ptx: cudarc::nvrtc::Ptx::from_src(out.ptx.unwrap_or_default()),
        entry: out.entry,
        log: out.log,
    })
}

/// Compiles `source` to a cubin for the real architecture `arch` (`sm_90`), for tools that
/// read machine code (`cuobjdump -sass`, `nvdisasm`). Needs NVRTC, not a GPU. An option
/// that names a virtual architecture (`compute_90`) is turned into the real one.
pub fn compile_cubin(
    kernel: &str,
    variant: &str,
    source: &str,
    options: &[&str],
    arch: &str,
) -> Result<Vec<u8>, Error> {
    compile_native(kernel, variant, source, options, arch, None).map(|n| n.cubin)
}

/// Machine code for one real architecture, and the PTX it came from where NVRTC keeps it.
#[derive(Debug, Clone)]
pub struct Native {
    pub cubin: Vec<u8>,
    /// `None` where this NVRTC does not hand out PTX for a real-architecture build.
    pub ptx: Option<String>,
    /// The entry's name in the module (see [`Module::entry`]), where one was asked for.
    pub entry: Option<String>,
    /// NVRTC's log of the successful compile (warnings; ptxas' figures with `-v`).
    pub log: String,
}

/// [`compile_cubin`], also asking NVRTC for the PTX of the same build (one compilation
/// for code that is both loaded without JIT and read for its load widths), and lowering
/// `entry` when it is a name expression.
pub fn compile_native(
    kernel: &str,
    variant: &str,
    source: &str,
    options: &[&str],
    arch: &str,
    entry: Option<&str>,
) -> Result<Native, Error> {
    let mut opts: Vec<String> = options
        .iter()
        .map(|o| o.replace("compute_", "sm_"))
        .collect();
    if !names_arch(options) {
        opts.push(format!("--gpu-architecture={arch}"));
    }
    let out = nvrtc(kernel, variant, source, opts, entry, true)?;
    Ok(Native {
        cubin: out.cubin.unwrap_or_default(),
        ptx: out.ptx,
        entry: out.entry,
        log: out.log,
    })
}

/// One entry compiled to machine code for a real architecture, with ptxas' report of it:
/// what `cargo kopt check` shows and compares with a variant's evidence, and what the
/// parent's compile fence checks before a candidate reaches a GPU worker.
#[derive(Debug, Clone)]
pub struct EntryCompile {
    pub native: Native,
    /// The real architecture compiled for: `arch`, or the one the options name
    /// (`--gpu-architecture=compute_90a` compiles for `sm_90a`).
    pub arch: String,
    /// ptxas' figures of the entry (its lowered name for a name expression).
    pub resources: CompiledEntry,
    /// NVRTC's and ptxas' warnings: the log without ptxas' informational lines. Empty
    /// when the compile was clean.
    pub warnings: String,
}

impl EntryCompile {
    /// How many warnings the log holds (`file(line): warning ...`, `ptxas warning : ...`).
    pub fn warning_count(&self) -> usize {
        warning_count(&self.warnings)
    }
}

/// How many warnings a compile log holds: NVRTC's `file(line): warning #N-D: ...` and
/// ptxas' `ptxas warning : ...` lines (the source excerpts under them are not counted).
pub fn warning_count(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains(": warning") || l.starts_with("ptxas warning"))
        .count()
}

/// The compile log without ptxas' informational lines (`ptxas info : ...` and the
/// `ptxas .` continuation lines of `-v`): what is left are warnings, NVRTC's and ptxas'.
pub fn compile_warnings(log: &str) -> String {
    log.lines()
        .filter(|l| {
            let rest = l.strip_prefix("ptxas").map(str::trim_start);
            !matches!(rest, Some(r) if r.starts_with("info") || r.starts_with('.'))
        })
        .collect::<Vec<_>>()
        .join("\n")
        .trim()
        .to_string()
}

/// The environment variable that turns off NVRTC's compile cache (NVRTC 12.9 and later;
/// it is also the driver's JIT-cache switch). A compile NVRTC answers from that cache
/// returns the same cubin but an empty log, so ptxas' report of the entries, registers and
/// spills that [`compile_entry`] reads is missing. `cargo kopt` sets it to `1` for itself
/// and its workers unless the user set it; NVRTC reads it when it loads.
pub const NVRTC_CACHE_SWITCH: &str = "CUDA_CACHE_DISABLE";

/// Compiles `source` to a cubin for the real architecture `arch` with ptxas' `-v` report,
/// and confirms that the module holds `entry` (lowered when it is a name expression):
/// the one CPU-side compile of a version, whoever asks. Needs NVRTC, not a GPU.
///
/// Errors: [`Error::NoNvrtc`]; [`Error::Compile`] with NVRTC's log; [`Error::NoEntry`]
/// naming the entry functions the module does hold.
pub fn compile_entry(
    kernel: &str,
    variant: &str,
    source: &str,
    options: &[&str],
    arch: &str,
    entry: &str,
) -> Result<EntryCompile, Error> {
    let mut opts: Vec<&str> = options.to_vec();
    if !opts.contains(&"--ptxas-options=-v") {
        opts.push("--ptxas-options=-v");
    }
    let native = compile_native(kernel, variant, source, &opts, arch, Some(entry))?;
    let compiled_arch = options_arch(options).unwrap_or_else(|| arch.to_string());
    let symbol = native.entry.clone().unwrap_or_else(|| entry.to_string());
    let entries = ptxas_entries(&native.log);
    // ptxas lists every entry it compiles under `-v`: a successful compile with no log at
    // all came from NVRTC's cache, which keeps the cubin but not the report.
    if native.log.trim().is_empty() {
        return Err(Error::NoPtxasReport {
            kernel: kernel.to_string(),
            variant: variant.to_string(),
            switch: NVRTC_CACHE_SWITCH,
            value: std::env::var(NVRTC_CACHE_SWITCH)
                .map(|v| format!("`{v}`"))
                .unwrap_or_else(|_| "unset".into()),
        });
    }
    let Some(resources) = entries.iter().find(|e| e.name == symbol).cloned() else {
        let held = if entries.is_empty() {
            "it holds no kernel at all".to_string()
        } else {
            format!(
                "it holds {}",
                entries
                    .iter()
                    .map(|e| format!("`{}`", e.name))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        return Err(Error::NoEntry {
            kernel: kernel.to_string(),
            variant: variant.to_string(),
            entry: entry.to_string(),
            detail: format!("ptxas compiled the module for {compiled_arch}; {held}"),
        });
    };
    let warnings = compile_warnings(&native.log);
    Ok(EntryCompile {
        native,
        arch: compiled_arch,
        resources,
        warnings,
    })
}

/// The CUDA version of the headers NVRTC compiles against (`13.0`): see
/// [`cuda_headers_version_in`] over [`cuda_include_dirs`].
pub fn cuda_headers_version() -> Option<String> {
    let dirs: Vec<std::path::PathBuf> = cuda_include_dirs().into_iter().map(Into::into).collect();
    cuda_headers_version_in(&dirs)
}

/// `CUDA_VERSION` of the first `cuda.h` among `dirs`, else `CUDART_VERSION` of the first
/// `cuda_runtime_api.h`, as `major.minor`; `None` where neither is found.
pub fn cuda_headers_version_in(dirs: &[std::path::PathBuf]) -> Option<String> {
    fn defined(path: &std::path::Path, name: &str) -> Option<u32> {
        let text = std::fs::read_to_string(path).ok()?;
        text.lines().find_map(|l| {
            let mut words = l.split_whitespace();
            if words.next()? != "#define" || words.next()? != name {
                return None;
            }
            words.next()?.parse().ok()
        })
    }
    let version = dirs
        .iter()
        .find_map(|d| defined(&d.join("cuda.h"), "CUDA_VERSION"))
        .or_else(|| {
            dirs.iter()
                .find_map(|d| defined(&d.join("cuda_runtime_api.h"), "CUDART_VERSION"))
        })?;
    Some(format!("{}.{}", version / 1000, (version % 1000) / 10))
}

struct Output {
    ptx: Option<String>,
    cubin: Option<Vec<u8>>,
    entry: Option<String>,
    log: String,
}

/// Text NVRTC hands out as a NUL-terminated buffer.
fn c_text(buf: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .map(|c| *c as u8)
        .take_while(|b| *b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The one NVRTC compile every path goes through: the CUDA include folders
/// ([`cuda_include_dirs`]) as `--include-path` options, the standard-header shims
/// ([`crate::headers`]) as in-memory headers, and `entry` registered as a name
/// expression when it is one. A failure's log ends with the options used, include folders
/// included, so that a missing header says where it was looked for.
fn nvrtc(
    kernel: &str,
    variant: &str,
    source: &str,
    mut opts: Vec<String>,
    entry: Option<&str>,
    want_cubin: bool,
) -> Result<Output, Error> {
    use cudarc::nvrtc::{result, sys};
    use std::ffi::{c_char, CString};
    if !crate::gpu::nvrtc_present() {
        return Err(Error::NoNvrtc);
    }
    let fail = |log: String| Error::Compile {
        kernel: kernel.to_string(),
        variant: variant.to_string(),
        log,
    };
    let includes = cuda_include_dirs();
    let no_includes = if includes.is_empty() {
        "\n(no CUDA include folder was found: set CUDA_HOME to the toolkit's root, or KOPT_CUDA_INCLUDE to its include folders)"
    } else {
        ""
    };
    opts.extend(includes.iter().map(|d| format!("--include-path={d}")));
    let src = CString::new(source).map_err(|_| fail("the source holds a NUL byte".into()))?;
    let name = CString::new(format!("{kernel}-{variant}.cu"))
        .map_err(|_| fail("the name holds a NUL byte".into()))?;
    let shims = crate::headers::STD_HEADER_SHIMS;
    let texts: Vec<CString> = shims
        .iter()
        .map(|(_, t)| CString::new(*t).expect("shims hold no NUL"))
        .collect();
    let names: Vec<CString> = shims
        .iter()
        .map(|(n, _)| CString::new(*n).expect("shim names hold no NUL"))
        .collect();
    let text_ptrs: Vec<*const c_char> = texts.iter().map(|t| t.as_ptr()).collect();
    let name_ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let expression = match entry.filter(|e| is_name_expression(e)) {
        Some(e) => Some(CString::new(e).map_err(|_| fail("the entry holds a NUL byte".into()))?),
        None => None,
    };
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer handed to NVRTC points into a CString that outlives the
    // program; the arrays have `shims.len()` elements each; `prog` is destroyed once,
    // below, and only after NVRTC's buffers have been copied out.
    unsafe {
        sys::nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            name.as_ptr(),
            shims.len() as i32,
            text_ptrs.as_ptr(),
            name_ptrs.as_ptr(),
        )
        .result()
        .map_err(|e| fail(format!("nvrtcCreateProgram: {e:?}")))?;
        let out = (|| {
            if let Some(e) = &expression {
                sys::nvrtcAddNameExpression(prog, e.as_ptr())
                    .result()
                    .map_err(|err| fail(format!("nvrtcAddNameExpression: {err:?}")))?;
            }
            let compiled = result::compile_program(prog, &opts);
            let log = result::get_program_log(prog)
                .map(|l| c_text(&l))
                .unwrap_or_default();
            if compiled.is_err() {
                return Err(fail(format!(
                    "{}\n(options: {}){no_includes}",
                    log.trim_end(),
                    opts.join(" ")
                )));
            }
            let lowered = match &expression {
                None => entry.map(str::to_string),
                Some(e) => {
                    let mut p: *const c_char = std::ptr::null();
                    sys::nvrtcGetLoweredName(prog, e.as_ptr(), &mut p)
                        .result()
                        .map_err(|err| {
                            fail(format!(
                                "NVRTC could not lower the entry `{}`: {err:?} (a name expression must name one instantiation of a __global__ template, such as `softmax<float>`)",
                                e.to_string_lossy()
                            ))
                        })?;
                    Some(std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned())
                }
            };
            let ptx = result::get_ptx(prog).ok().map(|p| c_text(&p));
            let cubin = if want_cubin {
                let mut size: usize = 0;
                sys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .map_err(|e| fail(format!("no cubin: {e:?}")))?;
                let mut buf = vec![0u8; size];
                sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast())
                    .result()
                    .map_err(|e| fail(format!("no cubin: {e:?}")))?;
                Some(buf)
            } else {
                None
            };
            Ok(Output {
                ptx,
                cubin,
                entry: lowered,
                log: log.trim().to_string(),
            })
        })();
        let _ = result::destroy_program(prog);
        out
    }
}

/// Compiles and loads a variant's entry point into `ctx`.
pub(crate) fn load(
    ctx: &Arc<CudaContext>,
    kernel: &'static str,
    def: &VariantDef,
    cc: (i32, i32),
) -> Result<CudaFunction, Error> {
    let compiled = compile_module(kernel, def.id, def.source, def.options, cc, Some(def.entry))?;
    let symbol = compiled.entry.as_deref().unwrap_or(def.entry);
    load_function(ctx, kernel, def, compiled.ptx, symbol, cc)
}

/// Loads a variant's embedded verified PTX into `ctx` through the driver: no NVRTC.
pub(crate) fn load_ptx(
    ctx: &Arc<CudaContext>,
    kernel: &'static str,
    def: &VariantDef,
    ptx: &crate::kernel::PtxDef,
    cc: (i32, i32),
) -> Result<CudaFunction, Error> {
    let code = cudarc::nvrtc::Ptx::from_src(ptx.text);
    load_function(ctx, kernel, def, code, ptx.symbol, cc)
}

/// Loads `code` into `ctx`, finds `symbol` and opens the function's launch limits.
fn load_function(
    ctx: &Arc<CudaContext>,
    kernel: &'static str,
    def: &VariantDef,
    code: cudarc::nvrtc::Ptx,
    symbol: &str,
    cc: (i32, i32),
) -> Result<CudaFunction, Error> {
    let module = ctx
        .load_module(code)
        .map_err(|e| module_load_error(kernel, def.id, e))?;
    let f = module.load_function(symbol).map_err(|e| Error::NoEntry {
        kernel: kernel.to_string(),
        variant: def.id.to_string(),
        entry: def.entry.to_string(),
        detail: e.to_string(),
    })?;
    let optin = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .map_err(Error::driver)?;
    open_launch_limits(&f, optin, cc).map_err(Error::driver)?;
    Ok(f)
}

/// A module load's error. PTX that NVRTC wrote for a newer CUDA than the driver's is
/// refused by the driver with `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`; that one is told with
/// both versions and the fix.
pub fn module_load_error(kernel: &str, variant: &str, e: cudarc::driver::DriverError) -> Error {
    let versions = || Some((nvrtc_version()?, crate::driver::driver_version().ok()?));
    explain_module_load(kernel, variant, e, versions)
}

/// [`module_load_error`] with the versions given (`None`: unknown, the driver's error is
/// kept), read only for a PTX version refusal.
fn explain_module_load(
    kernel: &str,
    variant: &str,
    e: cudarc::driver::DriverError,
    versions: impl FnOnce() -> Option<((i32, i32), i32)>,
) -> Error {
    use cudarc::driver::sys::CUresult;
    if e.0 != CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION {
        return Error::driver(e);
    }
    match versions() {
        Some(((major, minor), driver)) => Error::PtxNewerThanDriver {
            kernel: kernel.to_string(),
            variant: variant.to_string(),
            nvrtc: format!("{major}.{minor}"),
            driver: crate::driver::version_text(driver),
        },
        None => Error::driver(e),
    }
}

/// Lets launches of `f` use what the device allows beyond the defaults, so that a variant
/// the engine verified launches the same way from the generated launcher: dynamic shared
/// memory up to the device's opt-in limit per block (`max_shared_optin`; above 48 KiB
/// needs this) and, from sm_90, thread-block clusters larger than the portable 8 blocks
/// (a kernel compiled with `__cluster_dims__(16, 1, 1)` does not launch without it).
/// Errors: the driver's, when it refuses the shared-memory limit.
pub fn open_launch_limits(
    f: &CudaFunction,
    max_shared_optin: i32,
    cc: (i32, i32),
) -> Result<(), cudarc::driver::DriverError> {
    let static_smem = f.shared_size_bytes()?;
    if max_shared_optin > static_smem {
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            max_shared_optin - static_smem,
        )?;
    }
    if cc.0 >= 9 {
        // Only widens what a launch may ask: a device that refuses it keeps the portable
        // limit, and a kernel that needs more fails at its launch with the driver's error.
        let _ = f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
            1,
        );
    }
    Ok(())
}

/// What ptxas reported of one entry function (`--ptxas-options=-v`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CompiledEntry {
    /// The name in the module (lowered for a template instantiation).
    pub name: String,
    pub arch: String,
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    /// Bytes of stack frame (local memory per thread).
    pub stack_bytes: u32,
    /// Static shared memory, bytes.
    pub shared_bytes: u32,
}

/// The entry functions of a `--ptxas-options=-v` compile log, in the order ptxas met
/// them. Lines it does not know are skipped, so another ptxas's extra figures do no harm.
pub fn ptxas_entries(log: &str) -> Vec<CompiledEntry> {
    fn number_before(text: &str, unit: &str) -> Option<u32> {
        let at = text.find(unit)?;
        text[..at].split_whitespace().last()?.parse().ok()
    }
    let mut out: Vec<CompiledEntry> = Vec::new();
    let mut current: Option<usize> = None;
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let mut parts = rest.split('\'');
            let name = parts.next().unwrap_or_default().to_string();
            let arch = parts.nth(1).unwrap_or_default().to_string();
            out.push(CompiledEntry {
                name,
                arch,
                ..Default::default()
            });
            current = Some(out.len() - 1);
            continue;
        }
        if line.contains("Function properties for ") {
            let name = line
                .rsplit("Function properties for ")
                .next()
                .unwrap_or("")
                .trim();
            current = out.iter().position(|e| e.name == name).or(current);
            continue;
        }
        let Some(e) = current.and_then(|i| out.get_mut(i)) else {
            continue;
        };
        if line.contains("stack frame") {
            e.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
            e.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
            e.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
        } else if line.contains("Used ") && line.contains("registers") {
            e.registers = number_before(line, "registers").unwrap_or(0);
            e.shared_bytes = number_before(line, "bytes smem").unwrap_or(0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use cudarc::driver::sys::CUresult;
    use cudarc::driver::DriverError;

    use super::{compile_warnings, options_arch, ptxas_entries, warning_count};
    use crate::Error;

    #[test]
    fn warnings_are_the_log_without_ptxas_info() {
        // As NVRTC 13.0 prints a warning under `--ptxas-options=-v`.
        let log = r#"k-reference.cu(3): warning #177-D: variable "unused" was declared but never referenced
    int unused;
        ^

Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"

ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
ptxas warning : Registers are spilled to local memory in function 'k', 8 bytes spill stores, 8 bytes spill loads"#;
        let w = compile_warnings(log);
        assert!(w.starts_with("k-reference.cu(3): warning #177-D"), "{w}");
        assert!(w.ends_with("8 bytes spill loads"), "{w}");
        assert!(
            !w.contains("ptxas info") && !w.contains("stack frame"),
            "{w}"
        );
        assert_eq!(warning_count(&w), 2);
        assert_eq!(compile_warnings("ptxas info    : Used 8 registers"), "");
        assert_eq!(warning_count(""), 0);
    }

    #[test]
    fn the_headers_version_is_cuda_h_s() {
        let d = tempfile::tempdir().unwrap();
        let dirs = vec![d.path().to_path_buf()];
        assert_eq!(super::cuda_headers_version_in(&dirs), None);
        std::fs::write(
            d.path().join("cuda_runtime_api.h"),
            "#define CUDART_VERSION  12090\n",
        )
        .unwrap();
        assert_eq!(
            super::cuda_headers_version_in(&dirs).as_deref(),
            Some("12.9")
        );
        std::fs::write(
            d.path().join("cuda.h"),
            "#ifndef X\n#define CUDA_VERSION 13000\n#endif\n",
        )
        .unwrap();
        assert_eq!(
            super::cuda_headers_version_in(&dirs).as_deref(),
            Some("13.0")
        );
    }

    #[test]
    fn ptx_newer_than_the_driver_is_told_with_both_versions() {
        let refused = DriverError(CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION);
        let e = super::explain_module_load("softmax", "ref", refused, || Some(((13, 0), 12040)));
        let text = e.to_string();
        assert!(matches!(e, Error::PtxNewerThanDriver { .. }), "{e:?}");
        assert!(text.contains("CUDA 12.4 driver"), "{text}");
        assert!(text.contains("NVRTC 13.0"), "{text}");
        assert!(text.contains("no newer than 12.4"), "{text}");
        // Without the versions, or for another error, the driver's error stays.
        let e = super::explain_module_load("softmax", "ref", refused, || None);
        assert!(matches!(e, Error::Driver(_)), "{e:?}");
        let other = DriverError(CUresult::CUDA_ERROR_INVALID_IMAGE);
        let e = super::explain_module_load("softmax", "ref", other, || panic!("not asked"));
        assert!(matches!(e, Error::Driver(_)), "{e:?}");
    }

    #[test]
    fn the_include_digest_follows_the_headers() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("cuda/std")).unwrap();
        std::fs::write(d.path().join("cuda_fp16.h"), "a").unwrap();
        let dirs = vec![d.path().to_path_buf()];
        let first = super::include_digest(&dirs);
        assert_eq!(first, super::include_digest(&dirs), "stable");
        std::fs::write(d.path().join("cuda/std/limits"), "b").unwrap();
        let added = super::include_digest(&dirs);
        assert_ne!(first, added, "a header added");
        std::fs::write(d.path().join("cuda_fp16.h"), "a longer header").unwrap();
        assert_ne!(added, super::include_digest(&dirs), "a header edited");
    }

    #[test]
    fn ptxas_figures_per_entry() {
        // As NVRTC 13.0 prints them for a macro-made entry and a template instantiation.
        let log = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z1tILi4EEvPf' for 'sm_90'
ptxas info    : Function properties for _Z1tILi4EEvPf
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
ptxas info    : Compile time = 7.463 ms
ptxas info    : Compiling entry function 'b_f32' for 'sm_90'
ptxas info    : Function properties for b_f32
ptxas         .     24 bytes stack frame, 20 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem
";
        let e = ptxas_entries(log);
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].name, "_Z1tILi4EEvPf");
        assert_eq!(e[0].arch, "sm_90");
        assert_eq!((e[0].registers, e[0].shared_bytes), (8, 0));
        assert_eq!(e[1].name, "b_f32");
        assert_eq!(
            (
                e[1].registers,
                e[1].spill_stores,
                e[1].spill_loads,
                e[1].stack_bytes,
                e[1].shared_bytes
            ),
            (255, 20, 16, 24, 1024)
        );
    }

    #[test]
    fn options_name_the_real_architecture() {
        assert_eq!(
            options_arch(&["-DX=1", "--gpu-architecture=compute_90a"]).as_deref(),
            Some("sm_90a")
        );
        assert_eq!(options_arch(&["-arch=sm_80"]).as_deref(), Some("sm_80"));
        assert_eq!(options_arch(&["--use_fast_math"]), None);
    }
}
