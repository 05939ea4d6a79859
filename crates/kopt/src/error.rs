use kopt_spec::expr::EvalError;

/// Errors of a generated launcher.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("`{kernel}`: buffer `{buffer}` holds {actual} elements, but the spec needs {expected} for these arguments; nothing was launched")]
    BufferTooShort {
        kernel: &'static str,
        buffer: &'static str,
        expected: i64,
        actual: usize,
    },
    #[error("`{kernel}`: {what} `{item}` cannot be computed for these arguments: {error}; nothing was launched")]
    Expr {
        kernel: &'static str,
        what: &'static str,
        item: &'static str,
        error: EvalError,
    },
    #[error(
        "`{kernel}`: {what} of `{variant}` is {value}, outside 1..=u32::MAX; nothing was launched"
    )]
    Geometry {
        kernel: &'static str,
        variant: &'static str,
        what: &'static str,
        value: i64,
    },
    #[error("`{kernel}`: computed argument `{arg}` of `{variant}` is {value}, outside the range of {ty}; nothing was launched")]
    ComputedArg {
        kernel: &'static str,
        variant: &'static str,
        arg: &'static str,
        ty: &'static str,
        value: i64,
    },
    #[error("`{kernel}`: `{variant}` cannot launch: {problem}; nothing was launched")]
    Cluster {
        kernel: &'static str,
        variant: &'static str,
        problem: String,
    },
    #[error("`{kernel}`: NVRTC could not compile `{variant}`:\n{log}")]
    Compile {
        kernel: String,
        variant: String,
        log: String,
    },
    #[error("`{kernel}`: the module NVRTC compiled for `{variant}` has no kernel `{entry}` ({detail}): the source neither defines it nor generates it through a macro or template; set `entry = \"...\"` to a name the compiled module holds")]
    NoEntry {
        kernel: String,
        variant: String,
        entry: String,
        detail: String,
    },
    #[error("`{kernel}`: NVRTC compiled `{variant}` but returned no ptxas report, which is what a compile it answers from its cache returns, so the module's kernels, registers and spills are unknown: set {switch}=1 for this process (it is {value})")]
    NoPtxasReport {
        kernel: String,
        variant: String,
        switch: &'static str,
        /// The switch's value, or `unset`.
        value: String,
    },
    #[error("NVRTC (libnvrtc.so) could not be loaded: install the CUDA toolkit's NVRTC, or add its folder to LD_LIBRARY_PATH")]
    NoNvrtc,
    #[error("no CUDA driver found (libcuda could not be loaded): kopt needs an NVIDIA GPU with its driver for this")]
    NoDriver,
    #[error("{purpose} needs `{call}`, which CUDA drivers before {needed} lack; this machine's driver is CUDA {found}: update the NVIDIA driver{alternative}")]
    DriverTooOld {
        call: &'static str,
        purpose: &'static str,
        needed: String,
        found: String,
        alternative: &'static str,
    },
    #[error("`{kernel}`: the CUDA {driver} driver cannot load the PTX NVRTC {nvrtc} compiled for `{variant}` (PTX is loadable only by drivers at least as new as the compiler): put an NVRTC no newer than {driver} first on LD_LIBRARY_PATH, or update the NVIDIA driver")]
    PtxNewerThanDriver {
        kernel: String,
        variant: String,
        nvrtc: String,
        driver: String,
    },
    #[error("`{kernel}`: {problem}; nothing was launched")]
    TensorMap {
        kernel: &'static str,
        problem: String,
    },
    #[error("kopt's capture or shadow checks: {0}")]
    Observe(String),
    #[error("`{kernel}` was used from more than {max} CUDA contexts")]
    TooManyContexts { kernel: &'static str, max: usize },
    #[error("CUDA driver error: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
}

impl Error {
    pub(crate) fn driver(e: cudarc::driver::DriverError) -> Self {
        Error::Driver(e)
    }
}
