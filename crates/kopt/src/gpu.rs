//! Probing for a usable CUDA installation without panicking (cudarc panics when a
//! library it loads dynamically is missing).

/// Whether the CUDA driver library (`libcuda`) can be loaded.
pub fn driver_present() -> bool {
    probe::driver()
}

/// Whether the NVRTC library can be loaded.
pub fn nvrtc_present() -> bool {
    probe::nvrtc()
}

/// cudarc defines `sys::is_culib_present` only when it loads the library at run time
/// (`dynamic-loading`, or `fallback-dynamic-loading` with no linking feature). A build
/// that links it (`dynamic-linking`, `static-linking`) has it or would not have started,
/// and kopt cannot name cudarc's features. So each probe glob-imports cudarc's `sys`
/// inside its body, where a name the glob brings shadows the module's fallback of the
/// same name, and the fallback (`true`) answers only when cudarc has no probe.
mod probe {
    pub(super) fn driver() -> bool {
        #[allow(unused_imports)]
        use cudarc::driver::sys::*;
        // SAFETY: cudarc's probe only tries to dlopen the library; the fallback does nothing.
        unsafe { is_culib_present() }
    }

    pub(super) fn nvrtc() -> bool {
        #[allow(unused_imports)]
        use cudarc::nvrtc::sys::*;
        // SAFETY: as above.
        unsafe { is_culib_present() }
    }

    /// The linked builds' answer (see the module's note).
    #[allow(dead_code)]
    unsafe fn is_culib_present() -> bool {
        true
    }
}

/// What is missing for GPU work, in one line, or `None` when a GPU can be used.
pub fn missing() -> Option<String> {
    if !driver_present() {
        return Some("no CUDA driver found (libcuda.so could not be loaded): kopt needs an NVIDIA GPU with its driver for this".into());
    }
    match cudarc::driver::CudaContext::device_count() {
        Ok(0) => return Some("the CUDA driver is present but reports no GPU".into()),
        Err(e) => {
            return Some(format!(
                "the CUDA driver is present but failed to initialise: {e}"
            ))
        }
        Ok(_) => {}
    }
    if !nvrtc_present() {
        return Some("NVRTC (libnvrtc.so) could not be loaded: install the CUDA toolkit's NVRTC, or add its folder to LD_LIBRARY_PATH".into());
    }
    None
}

/// For tests that compile CUDA on the CPU: `true` when NVRTC can be loaded. Without it,
/// the test is skipped with a message, unless `KOPT_REQUIRE_NVRTC` is set (as
/// `scripts/with-cuda-wheels` and CI do), in which case this panics.
pub fn nvrtc_for_test() -> bool {
    if nvrtc_present() {
        return true;
    }
    let why = "NVRTC (libnvrtc.so) could not be loaded (scripts/cuda-wheels.sh installs it)";
    if nvrtc_required() {
        panic!("KOPT_REQUIRE_NVRTC is set, but {why}");
    }
    eprintln!("skipped: {why}");
    false
}

/// Whether `KOPT_REQUIRE_NVRTC` is set (to anything but `0`), as `scripts/with-cuda-wheels`
/// and CI set it: a run that cannot load NVRTC must then fail (tests, and the compile
/// fence of `cargo kopt check`) instead of skipping the compile.
pub fn nvrtc_required() -> bool {
    std::env::var_os("KOPT_REQUIRE_NVRTC").is_some_and(|v| v != "0")
}

/// For GPU tests (marked `#[ignore = "needs a CUDA GPU"]`): `true` when a GPU can be
/// used. Without one, the test is skipped with a message, unless `KOPT_REQUIRE_GPU` is
/// set, in which case this panics: a run that asked for the GPU must not pass quietly.
pub fn available_for_test() -> bool {
    match missing() {
        None => true,
        Some(why) if std::env::var_os("KOPT_REQUIRE_GPU").is_some_and(|v| v != "0") => {
            panic!("KOPT_REQUIRE_GPU is set, but {why}")
        }
        Some(why) => {
            eprintln!("skipped: {why}");
            false
        }
    }
}
