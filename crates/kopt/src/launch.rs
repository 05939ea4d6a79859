//! The one way kopt enqueues a kernel, shared by the generated launcher and the
//! evaluation engine's worker, so that a variant verified there launches here with the
//! same attributes.

use std::ffi::c_void;

use cudarc::driver::sys;

use crate::driver::{self, LAUNCH_KERNEL_EX, MAX_ACTIVE_CLUSTERS};
use crate::Error;

/// Enqueues `function` on `stream`. A `cluster` other than `(1, 1, 1)` launches with the
/// thread-block cluster dimension attribute (`cuLaunchKernelEx`, sm_90+); `(1, 1, 1)` is a
/// plain launch, so a kernel compiled with `__cluster_dims__` keeps its own clusters.
/// A cluster launch on a driver without `cuLaunchKernelEx` is [`Error::DriverTooOld`].
///
/// # Safety
/// `params` must point to the kernel's arguments, in order and of the right types, valid
/// until the launch is enqueued; `function` and `stream` must belong to the current
/// context.
pub unsafe fn launch_kernel(
    function: sys::CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    cluster: (u32, u32, u32),
    smem: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), Error> {
    if cluster == (1, 1, 1) {
        return cudarc::driver::result::launch_kernel(function, grid, block, smem, stream, params)
            .map_err(Error::driver);
    }
    driver::require(LAUNCH_KERNEL_EX)?;
    let mut attr = cluster_attribute(cluster);
    let config = launch_config(grid, block, smem, stream, &mut attr);
    sys::cuLaunchKernelEx(&config, function, params.as_mut_ptr(), std::ptr::null_mut())
        .result()
        .map_err(Error::driver)
}

/// How many clusters of `cluster` blocks of `function`, each of `block` threads and `smem`
/// bytes of dynamic shared memory, the device holds at once (`cuOccupancyMaxActiveClusters`):
/// a grid of more clusters runs in several waves of them. Which SMs can host a cluster
/// depends on the chip's GPCs, so this is the driver's figure, not a division. A driver
/// without `cuOccupancyMaxActiveClusters` is [`Error::DriverTooOld`].
///
/// # Safety
/// `function` must belong to the current context.
pub unsafe fn max_active_clusters(
    function: sys::CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    cluster: (u32, u32, u32),
    smem: u32,
) -> Result<u32, Error> {
    driver::require(MAX_ACTIVE_CLUSTERS)?;
    let mut attr = cluster_attribute(cluster);
    let config = launch_config(grid, block, smem, std::ptr::null_mut(), &mut attr);
    let mut n: std::ffi::c_int = 0;
    sys::cuOccupancyMaxActiveClusters(&mut n, function, &config)
        .result()
        .map_err(Error::driver)?;
    Ok(n.max(0) as u32)
}

/// The launch attribute that sets a thread-block cluster's dimensions.
fn cluster_attribute(cluster: (u32, u32, u32)) -> sys::CUlaunchAttribute {
    // SAFETY: an all-zero attribute is valid plain data; the id and the union member set
    // below are the ones the driver reads for a cluster dimension.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 {
        x: cluster.0,
        y: cluster.1,
        z: cluster.2,
    };
    attr
}

/// A launch configuration carrying the one attribute `attr` (which must outlive its use).
fn launch_config(
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    smem: u32,
    stream: sys::CUstream,
    attr: &mut sys::CUlaunchAttribute,
) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block.0,
        blockDimY: block.1,
        blockDimZ: block.2,
        sharedMemBytes: smem,
        hStream: stream,
        attrs: attr,
        numAttrs: 1,
    }
}
