//! The device's ceilings, measured on it: device-to-device copy bandwidth (bytes read plus
//! bytes written) and matrix-multiply peaks through cuBLAS, on random data. Measured once
//! per device and driver; the parent caches them (see [`CeilingsCache`]).

use std::path::PathBuf;
use std::sync::Arc;

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaStream, DeviceRepr, DriverError};
use rand::{Rng, SeedableRng};

use crate::protocol::{Ceilings, DeviceInfo};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median over `n` timed repetitions of `work` (ms), after `warm` untimed ones.
fn time_ms(
    s: &Arc<CudaStream>,
    warm: usize,
    n: usize,
    mut work: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    for _ in 0..warm {
        work()?;
    }
    s.synchronize().map_err(|e| format!("{e:?}"))?;
    let mut t = Vec::new();
    for _ in 0..n {
        let e0 = s
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| format!("{e:?}"))?;
        work()?;
        let e1 = s
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| format!("{e:?}"))?;
        e1.synchronize().map_err(|e| format!("{e:?}"))?;
        t.push(e0.elapsed_ms(&e1).map_err(|e| format!("{e:?}"))? as f64);
    }
    Ok(median(t))
}

/// Copy bandwidth of a `bytes`-sized device-to-device copy, GB/s (read + write).
pub fn copy_bandwidth(s: &Arc<CudaStream>, bytes: usize) -> Result<f64, String> {
    let src = s.alloc_zeros::<u8>(bytes).map_err(|e| format!("{e:?}"))?;
    let mut dst = s.alloc_zeros::<u8>(bytes).map_err(|e| format!("{e:?}"))?;
    let ms = time_ms(s, 3, 20, || {
        s.memcpy_dtod(&src, &mut dst).map_err(|e| format!("{e:?}"))
    })?;
    Ok(2.0 * bytes as f64 / (ms * 1e-3) / 1e9)
}

fn random_matrix<T: DeviceRepr>(
    s: &Arc<CudaStream>,
    n: usize,
    seed: u64,
    conv: impl Fn(f32) -> T,
) -> Result<cudarc::driver::CudaSlice<T>, String> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let host: Vec<T> = (0..n * n)
        .map(|_| conv(rng.random_range(-1.0f32..1.0)))
        .collect();
    s.clone_htod(&host).map_err(|e| format!("{e:?}"))
}

/// TFLOP/s of an n³ matrix product on random data.
fn matmul<T: DeviceRepr + Copy>(
    s: &Arc<CudaStream>,
    blas: &CudaBlas,
    n: usize,
    conv: impl Fn(f32) -> T + Copy,
    one: T,
    zero: T,
) -> Result<f64, String>
where
    CudaBlas: Gemm<T>,
{
    let a = random_matrix(s, n, 1, conv)?;
    let b = random_matrix(s, n, 2, conv)?;
    let mut c = random_matrix(s, n, 3, conv)?;
    let cfg = GemmConfig {
        transa: cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
        transb: cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: n as i32,
        k: n as i32,
        alpha: one,
        lda: n as i32,
        ldb: n as i32,
        beta: zero,
        ldc: n as i32,
    };
    // SAFETY: a, b, c are n x n.
    let ms = time_ms(s, 3, 10, || {
        unsafe { blas.gemm(cfg, &a, &b, &mut c) }.map_err(|e| format!("{e:?}"))
    })?;
    Ok(2.0 * (n as f64).powi(3) / (ms * 1e-3) / 1e12)
}

pub fn measure(s: &Arc<CudaStream>, info: &DeviceInfo) -> Result<Ceilings, DriverError> {
    let copy = copy_bandwidth(s, 1 << 30).unwrap_or(f64::NAN);
    let blas = if unsafe { cudarc::cublas::sys::is_culib_present() } {
        CudaBlas::new(s.clone()).ok()
    } else {
        None
    };
    let (bf16, f16, f32) = match &blas {
        Some(b) => (
            matmul(
                s,
                b,
                8192,
                half::bf16::from_f32,
                half::bf16::ONE,
                half::bf16::ZERO,
            )
            .ok(),
            matmul(
                s,
                b,
                8192,
                half::f16::from_f32,
                half::f16::ONE,
                half::f16::ZERO,
            )
            .ok(),
            matmul(s, b, 8192, |x| x, 1.0f32, 0.0f32).ok(),
        ),
        None => (None, None, None),
    };
    Ok(Ceilings {
        device: info.name.clone(),
        identity: info.identity(),
        copy_gbs: copy,
        matmul_bf16_tflops: bf16,
        matmul_f16_tflops: f16,
        matmul_f32_tflops: f32,
        method: format!(
            "copy: 1 GiB cuMemcpyDtoD, median of 20 after 3 warm-ups, (read+write)/time; matmul: cuBLAS gemm 8192^3 on uniform(-1,1) data, median of 10 after 3{}",
            if blas.is_none() { " (cuBLAS not found: no matmul peaks)" } else { "" }
        ),
    })
}

/// Ceilings cached per device identity and driver, as JSON in the user's cache folder.
#[derive(Debug, Clone)]
pub struct CeilingsCache {
    path: PathBuf,
}

impl CeilingsCache {
    /// `$KOPT_CACHE_DIR`, else `$XDG_CACHE_HOME/kopt`, else `~/.cache/kopt`.
    pub fn default_location() -> Self {
        let dir = std::env::var_os("KOPT_CACHE_DIR")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("kopt")))
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/kopt")))
            .unwrap_or_else(|| PathBuf::from(".kopt-cache"));
        CeilingsCache {
            path: dir.join("ceilings.json"),
        }
    }

    pub fn at(path: impl Into<PathBuf>) -> Self {
        CeilingsCache { path: path.into() }
    }

    fn all(&self) -> Vec<Ceilings> {
        std::fs::read_to_string(&self.path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default()
    }

    pub fn get(&self, identity: &str) -> Option<Ceilings> {
        self.all().into_iter().find(|c| c.identity == identity)
    }

    pub fn put(&self, c: &Ceilings) -> std::io::Result<()> {
        let mut all: Vec<Ceilings> = self
            .all()
            .into_iter()
            .filter(|x| x.identity != c.identity)
            .collect();
        all.push(c.clone());
        let json = serde_json::to_string_pretty(&all).expect("serialises");
        kopt_spec::files::write_atomic(&self.path, json.as_bytes())
    }
}
