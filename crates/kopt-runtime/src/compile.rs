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

/// Whether the options already choose a target architecture.
fn names_arch(options: &[&str]) -> bool {
    options
        .iter()
        .any(|o| o.starts_with("--gpu-architecture") || o.starts_with("-arch"))
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
    // Let launches use the device's opt-in shared memory (above 48 KiB needs this).
    let optin = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .map_err(Error::driver)?;
    let static_smem = f.shared_size_bytes().map_err(Error::driver)?;
    if optin > static_smem {
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            optin - static_smem,
        )
        .map_err(Error::driver)?;
    }
    Ok(f)
}
