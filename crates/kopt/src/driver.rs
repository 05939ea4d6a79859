//! Which CUDA API kopt was compiled against, which driver it runs on, and the driver calls
//! it makes that older drivers lack. cudarc resolves a driver function on its first call
//! and panics when the driver does not export it, so kopt asks the driver's version
//! (`cuDriverGetVersion`, which every driver has) before such a call and returns
//! [`Error::DriverTooOld`] instead.

use std::sync::OnceLock;

use crate::Error;

/// The CUDA version of the driver-API bindings this build was compiled against, as
/// `1000 * major + 10 * minor` (12080 is CUDA 12.8): cudarc's choice for the whole build
/// graph (see the crate's documentation).
pub const BINDINGS_VERSION: u32 = cudarc::driver::sys::CUDA_VERSION;

/// The oldest bindings kopt compiles against. Thread-block cluster launches
/// (`cuLaunchKernelEx` with a cluster dimension) are in every CUDA 12 binding.
pub const OLDEST_BINDINGS: u32 = 12000;

/// The newest bindings kopt was built and checked against (cudarc 0.19's newest).
pub const NEWEST_CHECKED_BINDINGS: u32 = 13040;

const _: () = assert!(
    BINDINGS_VERSION >= OLDEST_BINDINGS,
    "kopt needs cudarc's bindings for CUDA 12.0 or newer: enable one of cudarc's \
     `cuda-12000`..`cuda-13040` features, set CUDARC_CUDA_VERSION (e.g. 12080), or put a \
     CUDA 12 or 13 nvcc on the PATH"
);

/// A driver function kopt calls that drivers before `since` do not export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverCall {
    /// The exported symbol.
    pub name: &'static str,
    /// What kopt uses it for, as the start of a sentence.
    pub purpose: &'static str,
    /// The first driver that has it, as `cuDriverGetVersion` reports versions (11080).
    pub since: i32,
    /// Another way out than a newer driver, or `""`.
    pub alternative: &'static str,
}

/// A launch with a thread-block cluster dimension (sm_90).
pub const LAUNCH_KERNEL_EX: DriverCall = DriverCall {
    name: "cuLaunchKernelEx",
    purpose: "A launch with thread-block clusters",
    since: 11080,
    alternative: "",
};

/// How many clusters the device holds at once (the engine's occupancy figure).
pub const MAX_ACTIVE_CLUSTERS: DriverCall = DriverCall {
    name: "cuOccupancyMaxActiveClusters",
    purpose: "Counting the clusters a device holds at once",
    since: 11080,
    alternative: "",
};

/// Timing with CUDA events (`CudaEvent::elapsed_ms`): with CUDA 13 bindings cudarc calls
/// `cuEventElapsedTime_v2`, which drivers before 12.8 lack; with CUDA 12 bindings the
/// original `cuEventElapsedTime`, which every driver has.
pub const EVENT_TIMING: DriverCall = if BINDINGS_VERSION >= 13000 {
    DriverCall {
        name: "cuEventElapsedTime_v2",
        purpose: "Timing with CUDA events, as this build (CUDA 13 bindings) does it,",
        since: 12080,
        alternative: ", or build cargo-kopt against CUDA 12 bindings \
                      (`--no-default-features` with `CUDARC_CUDA_VERSION=12080`)",
    }
} else {
    DriverCall {
        name: "cuEventElapsedTime",
        purpose: "Timing with CUDA events",
        since: 2000,
        alternative: "",
    }
};

/// `12080` as `12.8`.
pub fn version_text(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

/// The driver's CUDA version (`cuDriverGetVersion`: 13000 for a CUDA 13.0 driver), read
/// once per process.
pub fn driver_version() -> Result<i32, Error> {
    static VERSION: OnceLock<i32> = OnceLock::new();
    if let Some(v) = VERSION.get() {
        return Ok(*v);
    }
    if !crate::gpu::driver_present() {
        return Err(Error::NoDriver);
    }
    let mut version: std::ffi::c_int = 0;
    // SAFETY: the driver library is loadable (checked above); writes one int.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(Error::driver)?;
    Ok(*VERSION.get_or_init(|| version))
}

/// `Ok` when this machine's driver has `call`.
pub fn require(call: DriverCall) -> Result<(), Error> {
    check(call, driver_version()?)
}

/// `Ok` when a driver of version `found` has `call`.
pub fn check(call: DriverCall, found: i32) -> Result<(), Error> {
    if found >= call.since {
        return Ok(());
    }
    Err(Error::DriverTooOld {
        call: call.name,
        purpose: call.purpose,
        needed: version_text(call.since),
        found: version_text(found),
        alternative: call.alternative,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_as_cuda_writes_them() {
        assert_eq!(version_text(12080), "12.8");
        assert_eq!(version_text(13000), "13.0");
        assert_eq!(version_text(11040), "11.4");
        assert_eq!(version_text(12090), "12.9");
    }

    #[test]
    fn a_driver_without_the_call_is_an_error_naming_both_versions() {
        let e = check(LAUNCH_KERNEL_EX, 11040).unwrap_err();
        assert!(matches!(e, Error::DriverTooOld { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("`cuLaunchKernelEx`"), "{text}");
        assert!(text.contains("before 11.8"), "{text}");
        assert!(text.contains("driver is CUDA 11.4"), "{text}");
        assert!(text.contains("update the NVIDIA driver"), "{text}");
        check(LAUNCH_KERNEL_EX, 11080).unwrap();
        check(MAX_ACTIVE_CLUSTERS, 13000).unwrap();
        assert!(check(MAX_ACTIVE_CLUSTERS, 11070).is_err());
    }

    #[test]
    fn event_timing_needs_what_these_bindings_call() {
        if BINDINGS_VERSION >= 13000 {
            let text = check(EVENT_TIMING, 12040).unwrap_err().to_string();
            assert!(text.contains("`cuEventElapsedTime_v2`"), "{text}");
            assert!(text.contains("before 12.8"), "{text}");
            assert!(text.contains("CUDA 12 bindings"), "{text}");
            check(EVENT_TIMING, 12080).unwrap();
        } else {
            check(EVENT_TIMING, 12000).unwrap();
        }
    }

    #[test]
    fn the_bindings_are_in_the_checked_range() {
        assert!(
            (OLDEST_BINDINGS..=NEWEST_CHECKED_BINDINGS).contains(&BINDINGS_VERSION),
            "built against CUDA {} bindings, outside the {}..={} kopt was checked against",
            version_text(BINDINGS_VERSION as i32),
            version_text(OLDEST_BINDINGS as i32),
            version_text(NEWEST_CHECKED_BINDINGS as i32)
        );
    }
}
