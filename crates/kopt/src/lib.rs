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
//!
//! # Cargo features and cudarc
//!
//! kopt has no cargo features of its own. It uses the one `cudarc` of your build (the
//! launcher takes your `CudaStream` and `CudaSlice`s) and asks of it `std`, `driver`,
//! `nvrtc` and `f16`, plus three features that leave the build's choices to the rest of
//! your dependency graph:
//!
//! - **How CUDA is linked**: `fallback-dynamic-loading`. When any crate enables cudarc's
//!   `dynamic-linking` (candle does) or `static-linking`, that is used; otherwise cudarc
//!   loads libcuda and NVRTC at run time, so a binary starts on a machine without CUDA.
//! - **Which CUDA API the bindings describe**: `cuda-version-from-build-system` and
//!   `fallback-latest`. cudarc's build script takes, first that applies:
//!   `CUDARC_CUDA_VERSION` (e.g. `12080`); an explicit `cuda-12000`...`cuda-13040`
//!   feature that another crate enables; the version `nvcc --version` reports; and,
//!   without nvcc, cudarc's newest (13.4 for cudarc 0.19.10: the build script says so in a
//!   warning that cargo shows only when a build fails). kopt names no version itself
//!   because two different ones in one graph do not compile (cudarc's bindings define
//!   their types once per version), nor does `CUDARC_CUDA_VERSION` beside a different
//!   explicit feature. `fallback-latest` also applies to cudarc's NCCL, cuDNN and cuTENSOR
//!   versions where a crate asks for them `-from-build-system` and their headers are
//!   missing.
//!
//! kopt compiles against bindings for CUDA 12.0 to 13.4 ([`driver::BINDINGS_VERSION`] is
//! the one chosen); older bindings stop the build with a message saying how to choose
//! newer ones. At run time kopt needs, of the driver, calls every CUDA 12 driver has
//! (thread-block cluster launches need 11.8, and kopt checks the driver's version before
//! one: [`driver`]); the NVRTC it finds must be no newer than the driver, which loads the
//! PTX NVRTC writes ([`Error::PtxNewerThanDriver`] otherwise). Loading at run time,
//! cudarc looks libraries up by the bindings' major version: with CUDA 12 bindings
//! `libnvrtc.so` and `libnvrtc.so.12` (not `.so.13`), with CUDA 13 bindings
//! `libnvrtc.so.13` first.

mod compile;
pub mod driver;
mod error;
pub mod gpu;
pub mod headers;
mod kernel;
mod launch;
pub mod observe;
pub mod tensor_map;

pub use compile::{
    compile_cubin, compile_entry, compile_environment, compile_module, compile_native, compile_ptx,
    compile_warnings, cuda_headers_version, cuda_headers_version_in, cuda_include_dirs,
    include_digest, is_name_expression, module_load_error, nvrtc_version, open_launch_limits,
    options_arch, ptxas_entries, warning_count, CompiledEntry, EntryCompile, Module, Native,
    NVRTC_CACHE_SWITCH,
};
pub use error::Error;
pub use kernel::{
    disabled, BufferDef, CodeOrigin, ComputedArgDef, Kernel, KernelDef, Launch, MapPrograms,
    PtxDef, Reason, RegionDef, Selection, TensorMapDef, UnusableDef, VariantDef, IGNORE_PTX,
    MAX_CONTEXTS, MAX_KERNEL_ARGS,
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
    pub use kopt_spec::tensor_map::TensorMapArgs;
}
