//! NVRTC compilation and module loading for the generated launchers.

use std::sync::Arc;

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{CompileError, CompileOptions};

use crate::kernel::VariantDef;
use crate::Error;

/// Folders holding CUDA's own headers (`cuda_fp16.h`...), for `#include <...>`:
/// `$CUDA_HOME/include`, `$CUDA_PATH/include`, then `/usr/local/cuda/include`.
pub fn cuda_include_dirs() -> Vec<String> {
    let mut dirs = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.push(std::path::PathBuf::from(v).join("include"));
        }
    }
    dirs.push("/usr/local/cuda/include".into());
    let mut out: Vec<String> = Vec::new();
    for d in dirs {
        if d.join("cuda_fp16.h").is_file() {
            let s = d.to_string_lossy().into_owned();
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out
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
    if !crate::gpu::nvrtc_present() {
        return Err(Error::NoNvrtc);
    }
    let mut opts: Vec<String> = options.iter().map(|s| s.to_string()).collect();
    if !names_arch(options) {
        opts.push(format!("--gpu-architecture=compute_{}{}", cc.0, cc.1));
    }
    let compile_options = CompileOptions {
        options: opts,
        include_paths: cuda_include_dirs(),
        name: Some(format!("{kernel}-{variant}.cu")),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(source, compile_options).map_err(|e| Error::Compile {
        kernel: kernel.to_string(),
        variant: variant.to_string(),
        log: match e {
            CompileError::CompileError { log, options, .. } => format!(
                "{}\n(options: {})",
                log.to_string_lossy().trim_end(),
                options.join(" ")
            ),
            other => other.to_string(),
        },
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
    compile_native(kernel, variant, source, options, arch).map(|n| n.cubin)
}

/// Machine code for one real architecture, and the PTX it came from where NVRTC keeps it.
#[derive(Debug, Clone)]
pub struct Native {
    pub cubin: Vec<u8>,
    /// `None` where this NVRTC does not hand out PTX for a real-architecture build.
    pub ptx: Option<String>,
}

/// [`compile_cubin`], also asking NVRTC for the PTX of the same build (one compilation
/// for code that is both loaded without JIT and read for its load widths).
pub fn compile_native(
    kernel: &str,
    variant: &str,
    source: &str,
    options: &[&str],
    arch: &str,
) -> Result<Native, Error> {
    use cudarc::nvrtc::{result, sys};
    use std::ffi::CString;
    if !crate::gpu::nvrtc_present() {
        return Err(Error::NoNvrtc);
    }
    let fail = |log: String| Error::Compile {
        kernel: kernel.to_string(),
        variant: variant.to_string(),
        log,
    };
    let mut opts: Vec<String> = options
        .iter()
        .map(|o| o.replace("compute_", "sm_"))
        .collect();
    if !names_arch(options) {
        opts.push(format!("--gpu-architecture={arch}"));
    }
    opts.extend(
        cuda_include_dirs()
            .into_iter()
            .map(|d| format!("--include-path={d}")),
    );
    let src = CString::new(source).map_err(|_| fail("the source holds a NUL byte".into()))?;
    let name = CString::new(format!("{kernel}-{variant}.cu"))
        .map_err(|_| fail("the name holds a NUL byte".into()))?;
    let prog = result::create_program(&src, Some(&name)).map_err(|e| fail(e.to_string()))?;
    // SAFETY: `prog` was created above and is destroyed once, below; the buffers are sized
    // by NVRTC's own size queries.
    let out = unsafe {
        let compiled = result::compile_program(prog, &opts);
        let log = result::get_program_log(prog)
            .map(|l| {
                let bytes: Vec<u8> = l.iter().map(|c| *c as u8).take_while(|b| *b != 0).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .unwrap_or_default();
        match compiled {
            Err(_) => Err(fail(format!(
                "{}\n(options: {})",
                log.trim_end(),
                opts.join(" ")
            ))),
            Ok(()) => {
                let mut size: usize = 0;
                match sys::nvrtcGetCUBINSize(prog, &mut size).result() {
                    Err(e) => Err(fail(format!("no cubin: {e:?}"))),
                    Ok(()) => {
                        let mut buf = vec![0u8; size];
                        sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast())
                            .result()
                            .map_err(|e| fail(format!("no cubin: {e:?}")))
                            .map(|_| Native {
                                cubin: buf,
                                ptx: result::get_ptx(prog).ok().map(|p| {
                                    let bytes: Vec<u8> = p
                                        .iter()
                                        .map(|c| *c as u8)
                                        .take_while(|b| *b != 0)
                                        .collect();
                                    String::from_utf8_lossy(&bytes).into_owned()
                                }),
                            })
                    }
                }
            }
        }
    };
    // SAFETY: created above, not destroyed before.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// Compiles and loads a variant's entry point into `ctx`.
pub(crate) fn load(
    ctx: &Arc<CudaContext>,
    kernel: &'static str,
    def: &VariantDef,
    cc: (i32, i32),
) -> Result<CudaFunction, Error> {
    let ptx = compile_ptx(kernel, def.id, def.source, def.options, cc)?;
    let module = ctx.load_module(ptx).map_err(Error::driver)?;
    let f = module.load_function(def.entry).map_err(Error::driver)?;
    let optin = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .map_err(Error::driver)?;
    open_launch_limits(&f, optin, cc).map_err(Error::driver)?;
    Ok(f)
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

#[cfg(test)]
mod tests {
    use super::options_arch;

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
