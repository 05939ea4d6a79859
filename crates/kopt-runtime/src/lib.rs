//! kopt: verified, explained CUDA kernel variants for Rust crates that use cudarc.
//!
//! Annotate a launcher with [`kernel`]; the macro generates a safe launcher that runs the
//! accepted variant for the GPU's architecture (from the crate's committed `kopt/`
//! files), with the reference kernel as the fallback, and a `static` of the kernel's
//! upper-cased name for introspection. See the README for the grammar.
//!
//! ```ignore
//! use kopt::prelude::*;
//!
//! #[kopt::kernel(
//!     reference = "kernels/softmax.cu", entry = "softmax_f32",
//!     x: [rows * cols], y: [rows * cols],
//!     grid = rows, block = 256,
//!     shapes = [{ rows: 4096, cols: 4096 }, { rows: 16, cols: 65536 }],
//! )]
//! pub fn softmax(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);
//!
//! softmax(&stream, &x, &mut y, 4096, 4096)?;
//! println!("{}", SOFTMAX.explain(&stream, &[4096, 4096])?);
//! ```

mod compile;
mod error;
pub mod gpu;
pub mod headers;
mod kernel;
mod launch;

pub use compile::{
    compile_cubin, compile_entry, compile_environment, compile_module, compile_native, compile_ptx,
    compile_warnings, cuda_headers_version, cuda_headers_version_in, cuda_include_dirs,
    include_digest, is_name_expression, nvrtc_version, open_launch_limits, options_arch,
    ptxas_entries, warning_count, CompiledEntry, EntryCompile, Module, Native,
};
pub use error::Error;
pub use kernel::{
    disabled, BufferDef, ComputedArgDef, Kernel, KernelDef, Launch, Reason, RegionDef, Selection,
    UnusableDef, VariantDef, MAX_CONTEXTS,
};
pub use kopt_macros::kernel;
pub use kopt_spec::{expr, spec, KernelSpec};
pub use launch::{launch_kernel, max_active_clusters};

pub use cudarc;
pub use half::{bf16, f16};

/// What a file with kopt launchers needs in scope.
pub mod prelude {
    pub use cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut};
    pub use half::{bf16, f16};
    pub use std::sync::Arc;
}

#[doc(hidden)]
pub mod __private {
    pub use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice};
}
