//! candle custom ops whose CUDA work is done by the kopt launchers of [`crate::kernels`]:
//! drop-in replacements for `candle_nn::ops::softmax_last_dim` and
//! `candle_nn::ops::rms_norm`. On a CUDA tensor of bf16 or f32 the op runs through kopt
//! (candle's kernel, or the variant accepted for the GPU's architecture); on the CPU and
//! for the other dtypes it is candle-nn's own.

use candle_core::backend::BackendStorage;
use candle_core::{
    bail, CpuStorage, CudaStorage, CustomOp1, CustomOp2, DType, Error, Layout, Result, Shape,
    Tensor, D,
};
use kopt::prelude::*;

use crate::kernels;

/// Softmax over the last dimension, as `candle_nn::ops::softmax_last_dim`.
pub fn softmax_last_dim(xs: &Tensor) -> Result<Tensor> {
    if xs.device().is_cuda() && matches!(xs.dtype(), DType::BF16 | DType::F32) {
        xs.apply_op1_no_bwd(&SoftmaxLastDim)
    } else {
        candle_nn::ops::softmax_last_dim(xs)
    }
}

/// RMS norm over the last dimension with the weight `alpha`, as `candle_nn::ops::rms_norm`.
pub fn rms_norm(xs: &Tensor, alpha: &Tensor, eps: f32) -> Result<Tensor> {
    let (hidden, alpha_len) = (xs.dim(D::Minus1)?, alpha.dims1()?);
    if hidden != alpha_len {
        bail!(
            "shape mismatch in rms-norm {:?} {:?}",
            xs.shape(),
            alpha.shape()
        )
    }
    if xs.device().is_cuda()
        && matches!(xs.dtype(), DType::BF16 | DType::F32)
        && alpha.dtype() == xs.dtype()
    {
        xs.apply_op2_no_bwd(alpha, &RmsNorm { eps })
    } else {
        candle_nn::ops::rms_norm(xs, alpha, eps)
    }
}

/// Rows and columns of a contiguous tensor seen as a matrix over its last dimension, and
/// the element range of its storage.
struct Rows {
    rows: u32,
    ncols: i32,
    start: usize,
    end: usize,
}

fn rows_of(layout: &Layout, what: &str) -> Result<Rows> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        bail!("{what}: the input has to be contiguous (call .contiguous() first)")
    };
    let dims = layout.shape().dims();
    let ncols = dims.last().copied().unwrap_or(1);
    let rows = layout.shape().elem_count().checked_div(ncols).unwrap_or(0);
    let (Ok(rows), Ok(ncols)) = (u32::try_from(rows), i32::try_from(ncols)) else {
        bail!("{what}: {rows} rows of {ncols} are more than candle's kernel indexes (u32 rows, i32 columns)")
    };
    Ok(Rows {
        rows,
        ncols,
        start,
        end,
    })
}

fn kopt_error(e: kopt::Error) -> Error {
    Error::wrap(e)
}

struct SoftmaxLastDim;

impl CustomOp1 for SoftmaxLastDim {
    fn name(&self) -> &'static str {
        "kopt-softmax-last-dim"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        bail!("kopt's softmax runs on CUDA; candle_ops::ops::softmax_last_dim gives CPU tensors to candle-nn's")
    }

    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        let r = rows_of(layout, "softmax_last_dim")?;
        let dev = storage.device();
        let stream = dev.cuda_stream();
        let n = r.end - r.start;
        let out = match storage.dtype() {
            DType::BF16 => {
                let src = storage.as_cuda_slice::<bf16>()?.slice(r.start..r.end);
                // SAFETY: every element is written by the kernel before anything reads it.
                let mut dst = unsafe { dev.alloc::<bf16>(n)? };
                if n > 0 {
                    kernels::softmax_bf16(&stream, &src, &mut dst, r.rows, r.ncols)
                        .map_err(kopt_error)?;
                }
                CudaStorage::wrap_cuda_slice(dst, dev.clone())
            }
            DType::F32 => {
                let src = storage.as_cuda_slice::<f32>()?.slice(r.start..r.end);
                // SAFETY: as above.
                let mut dst = unsafe { dev.alloc::<f32>(n)? };
                if n > 0 {
                    kernels::softmax_f32(&stream, &src, &mut dst, r.rows, r.ncols)
                        .map_err(kopt_error)?;
                }
                CudaStorage::wrap_cuda_slice(dst, dev.clone())
            }
            dt => bail!("kopt's softmax_last_dim has no {dt:?} kernel"),
        };
        Ok((out, layout.shape().clone()))
    }
}

struct RmsNorm {
    eps: f32,
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "kopt-rms-norm"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("kopt's rms_norm runs on CUDA; candle_ops::ops::rms_norm gives CPU tensors to candle-nn's")
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let r = rows_of(l1, "rms_norm")?;
        let Some((a0, a1)) = l2.contiguous_offsets() else {
            bail!("rms_norm: alpha has to be contiguous (call .contiguous() first)")
        };
        let dev = s1.device();
        let stream = dev.cuda_stream();
        let n = r.end - r.start;
        let out = match (s1.dtype(), s2.dtype()) {
            (DType::BF16, DType::BF16) => {
                let src = s1.as_cuda_slice::<bf16>()?.slice(r.start..r.end);
                let alpha = s2.as_cuda_slice::<bf16>()?.slice(a0..a1);
                // SAFETY: every element is written by the kernel before anything reads it.
                let mut dst = unsafe { dev.alloc::<bf16>(n)? };
                if n > 0 {
                    kernels::rmsnorm_bf16(
                        &stream, &src, &mut dst, &alpha, r.rows, r.ncols, self.eps,
                    )
                    .map_err(kopt_error)?;
                }
                CudaStorage::wrap_cuda_slice(dst, dev.clone())
            }
            (DType::F32, DType::F32) => {
                let src = s1.as_cuda_slice::<f32>()?.slice(r.start..r.end);
                let alpha = s2.as_cuda_slice::<f32>()?.slice(a0..a1);
                // SAFETY: as above.
                let mut dst = unsafe { dev.alloc::<f32>(n)? };
                if n > 0 {
                    kernels::rmsnorm_f32(
                        &stream, &src, &mut dst, &alpha, r.rows, r.ncols, self.eps,
                    )
                    .map_err(kopt_error)?;
                }
                CudaStorage::wrap_cuda_slice(dst, dev.clone())
            }
            (a, b) => bail!("kopt's rms_norm has no kernel for {a:?} with a {b:?} weight"),
        };
        Ok((out, l1.shape().clone()))
    }
}
