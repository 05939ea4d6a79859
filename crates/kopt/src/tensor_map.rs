//! TMA tensor maps for launches: encoding with the driver, and the cache that keeps the
//! launcher's hot path free of encoding and of allocation.
//!
//! A map is keyed by its buffer's device address and by everything the declaration
//! evaluated to for the launch ([`TensorMapArgs`]: shape, strides, box, layout). A launch
//! whose key is in its kernel's cache copies the 128 bytes it holds; otherwise the map is
//! encoded (`cuTensorMapEncodeTiled`, a host call) and replaces the oldest of the
//! [`CACHE_ENTRIES`] entries. So a decode loop that launches over the same buffers and
//! shapes encodes each map once, and one that alternates between a few buffers (ping-pong
//! activations, several layers' weights) keeps up to that many. The cache is a fixed
//! array behind the kernel's mutex, held only for the lookup.

use std::sync::Mutex;

use cudarc::driver::sys;
use kopt_spec::spec::DType;
use kopt_spec::tensor_map::{Interleave, L2Promotion, OobFill, Swizzle, TensorMapArgs};

use crate::Error;

/// An encoded tensor map: what the kernel receives by value (`const __grid_constant__
/// CUtensorMap`).
pub type TensorMap = sys::CUtensorMap;

/// Maps a kernel's cache holds, over all its tensor maps.
pub const CACHE_ENTRIES: usize = 8;

/// A zeroed map, for launch slots the running version does not take.
pub const fn unused() -> TensorMap {
    sys::CUtensorMap { opaque: [0; 16] }
}

/// Encodes a tiled map of `args` over the device address `address` (checked by
/// [`TensorMapArgs::check_address`] first). `name` names the map in errors.
pub fn encode(name: &str, args: &TensorMapArgs, address: u64) -> Result<TensorMap, String> {
    args.check_address(name, address)?;
    let mut map = unused();
    let rank = args.rank as usize;
    // SAFETY: every array holds at least `rank` (strides: `rank - 1`) elements, the map is
    // written by the driver, and the address is only recorded in it.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            data_type(args.dtype),
            args.rank,
            address as *mut std::ffi::c_void,
            args.dims[..rank].as_ptr(),
            args.strides.as_ptr(),
            args.box_dims[..rank].as_ptr(),
            args.element_strides[..rank].as_ptr(),
            interleave(args.interleave),
            swizzle(args.swizzle),
            l2_promotion(args.l2_promotion),
            oob_fill(args.oob_fill),
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(format!(
            "tensor map `{name}`: the driver refused to encode it ({r:?}) for dims {:?}, byte strides {:?}, box {:?}, element strides {:?}",
            &args.dims[..rank],
            &args.strides[..rank.saturating_sub(1)],
            &args.box_dims[..rank],
            &args.element_strides[..rank],
        ));
    }
    Ok(map)
}

fn data_type(d: DType) -> sys::CUtensorMapDataType {
    use sys::CUtensorMapDataType as T;
    match d {
        DType::U8 | DType::I8 => T::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        DType::U16 | DType::I16 => T::CU_TENSOR_MAP_DATA_TYPE_UINT16,
        DType::U32 => T::CU_TENSOR_MAP_DATA_TYPE_UINT32,
        DType::I32 => T::CU_TENSOR_MAP_DATA_TYPE_INT32,
        DType::U64 => T::CU_TENSOR_MAP_DATA_TYPE_UINT64,
        DType::I64 => T::CU_TENSOR_MAP_DATA_TYPE_INT64,
        DType::F16 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::F32 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        DType::F64 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
        DType::Bf16 => T::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
    }
}

fn interleave(i: Interleave) -> sys::CUtensorMapInterleave {
    use sys::CUtensorMapInterleave as T;
    match i {
        Interleave::None => T::CU_TENSOR_MAP_INTERLEAVE_NONE,
        Interleave::B16 => T::CU_TENSOR_MAP_INTERLEAVE_16B,
        Interleave::B32 => T::CU_TENSOR_MAP_INTERLEAVE_32B,
    }
}

fn swizzle(s: Swizzle) -> sys::CUtensorMapSwizzle {
    use sys::CUtensorMapSwizzle as T;
    match s {
        Swizzle::None => T::CU_TENSOR_MAP_SWIZZLE_NONE,
        Swizzle::B32 => T::CU_TENSOR_MAP_SWIZZLE_32B,
        Swizzle::B64 => T::CU_TENSOR_MAP_SWIZZLE_64B,
        Swizzle::B128 => T::CU_TENSOR_MAP_SWIZZLE_128B,
    }
}

fn l2_promotion(l: L2Promotion) -> sys::CUtensorMapL2promotion {
    use sys::CUtensorMapL2promotion as T;
    match l {
        L2Promotion::None => T::CU_TENSOR_MAP_L2_PROMOTION_NONE,
        L2Promotion::B64 => T::CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
        L2Promotion::B128 => T::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        L2Promotion::B256 => T::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
    }
}

fn oob_fill(o: OobFill) -> sys::CUtensorMapFloatOOBfill {
    use sys::CUtensorMapFloatOOBfill as T;
    match o {
        OobFill::Zero => T::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        OobFill::Nan => T::CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA,
    }
}

#[derive(Clone, Copy)]
struct Entry {
    map: usize,
    address: u64,
    args: TensorMapArgs,
    encoded: TensorMap,
}

/// A kernel's encoded maps (see the module's documentation).
pub(crate) struct Cache {
    entries: Mutex<([Option<Entry>; CACHE_ENTRIES], usize)>,
}

impl Cache {
    pub(crate) const fn new() -> Self {
        Cache {
            entries: Mutex::new(([None; CACHE_ENTRIES], 0)),
        }
    }

    /// Map number `map` of its kernel for `args` over `address`: from the cache, else
    /// encoded and kept.
    pub(crate) fn get(
        &self,
        kernel: &'static str,
        map: usize,
        name: &'static str,
        args: &TensorMapArgs,
        address: u64,
    ) -> Result<TensorMap, Error> {
        {
            let guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            let hit = guard
                .0
                .iter()
                .flatten()
                .find(|e| e.map == map && e.address == address && e.args == *args);
            if let Some(e) = hit {
                return Ok(e.encoded);
            }
        }
        let encoded =
            encode(name, args, address).map_err(|problem| Error::TensorMap { kernel, problem })?;
        let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let slot = guard.1;
        guard.0[slot] = Some(Entry {
            map,
            address,
            args: *args,
            encoded,
        });
        guard.1 = (slot + 1) % CACHE_ENTRIES;
        Ok(encoded)
    }
}
