//! Runs every kernel through its generated launcher on the GPU and compares the outputs
//! with the CPU references of [`crate::cpu`]. Used by `llm-kernels run` and the GPU test.

use std::sync::Arc;

use kopt::cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use kopt::{bf16, f16, Kernel, Reason};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

use crate::{
    candle_softmax, cpu, gemm, gqa_decode, layer_norm, paged_decode, reduce_sum, rmsnorm, row_sum,
    silu_mul, softmax, transpose,
};

pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// One comparison of a launcher's output with the CPU reference.
#[derive(Debug)]
pub struct Check {
    pub kernel: &'static str,
    pub shape: String,
    /// Which version ran (`online-vec4 (sm_90)`, `reference (sm_90)`...).
    pub ran: String,
    pub max_abs: f64,
    pub max_rel: f64,
    /// Elements outside `atol + rtol * |want|` (NaN and Inf always count).
    pub failing: usize,
}

pub fn normal_f32(n: usize, mean: f32, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let d = Normal::new(mean, 1.0f32).unwrap();
    (0..n).map(|_| d.sample(&mut rng)).collect()
}

/// `n` values drawn from N(mean, 1) and rounded through f16, on the device, with the
/// rounded values for the CPU reference (which so sees exactly the GPU's inputs).
fn normal_f16(
    stream: &Arc<CudaStream>,
    n: usize,
    mean: f32,
    seed: u64,
) -> Res<(CudaSlice<f16>, Vec<f32>)> {
    let h: Vec<f16> = normal_f32(n, mean, seed)
        .into_iter()
        .map(f16::from_f32)
        .collect();
    let back = h.iter().map(|x| x.to_f32()).collect();
    Ok((stream.clone_htod(&h)?, back))
}

fn compare(
    kernel: &'static str,
    shape: String,
    ran: String,
    got: &[f64],
    want: &[f64],
    rtol: f64,
    atol: f64,
) -> Check {
    let mut c = Check {
        kernel,
        shape,
        ran,
        max_abs: 0.0,
        max_rel: 0.0,
        failing: want.len().abs_diff(got.len()),
    };
    for (g, w) in got.iter().zip(want) {
        let abs = (g - w).abs();
        if abs.is_nan() || abs > atol + rtol * w.abs() {
            c.failing += 1;
        }
        if abs.is_finite() {
            c.max_abs = c.max_abs.max(abs);
            c.max_rel = c.max_rel.max(abs / w.abs().max(1e-12));
        } else {
            c.max_abs = f64::INFINITY;
        }
    }
    c
}

/// Which version runs for these arguments, in a few words.
pub fn ran(k: &Kernel, stream: &CudaStream, args: &[i64]) -> Res<String> {
    let s = k.explain(stream, args)?;
    Ok(match &s.reason {
        Reason::Accepted { .. } => format!("{} ({})", s.variant, s.key()),
        Reason::Disabled => "reference (KOPT_DISABLE)".into(),
        Reason::ShadowFallback => "reference (fell back after a shadow check)".into(),
        Reason::NotApplicable(why) => format!("reference ({}; {})", s.arch, why.join("; ")),
        Reason::NoVariant => format!("reference ({})", s.arch),
    })
}

/// A device buffer (f32, fp16 or bf16) read back as f64, for comparing with the CPU
/// references.
fn to_host_f64<T: DeviceRepr + Copy>(stream: &Arc<CudaStream>, buf: &CudaSlice<T>) -> Res<Vec<f64>>
where
    f64: From<T>,
{
    Ok(stream.clone_dtoh(buf)?.into_iter().map(f64::from).collect())
}

fn poisoned<T: DeviceRepr + Copy>(stream: &Arc<CudaStream>, n: usize, v: T) -> Res<CudaSlice<T>> {
    Ok(stream.clone_htod(&vec![v; n])?)
}

/// Every kernel on a few shapes (small enough for the CPU reference), outputs poisoned
/// with NaN first so that an unwritten element fails.
pub fn check_all(stream: &Arc<CudaStream>) -> Res<Vec<Check>> {
    let mut checks = Vec::new();

    // Block per row, clusters of blocks per row (set at launch), and a warp per row.
    for &(rows, cols) in &[
        (256usize, 4096usize),
        (16, 65536),
        (8, 50257),
        (64, 1024),
        (300, 1000),
    ] {
        let x = normal_f32(rows * cols, 0.0, 1 + rows as u64);
        let dx = stream.clone_htod(&x)?;
        let mut dy = poisoned::<f32>(stream, rows * cols, f32::NAN)?;
        softmax(stream, &dx, &mut dy, rows as u32, cols as u32)?;
        let y = to_host_f64(stream, &dy)?;
        let ran = ran(&crate::SOFTMAX, stream, &[rows as i64, cols as i64])?;
        checks.push(compare(
            "softmax",
            format!("{rows}x{cols}"),
            ran,
            &y,
            &cpu::softmax(&x, rows, cols),
            1e-4,
            1e-6,
        ));
    }

    // The candle-style bf16 softmax: vector and scalar paths (ncols a multiple of 8 or not),
    // the row count given to the launch only.
    for &(rows, cols) in &[(256usize, 4096usize), (64, 32000), (300, 1001), (3, 17)] {
        let xb: Vec<bf16> = normal_f32(rows * cols, 0.0, 11 + rows as u64)
            .iter()
            .map(|&v| bf16::from_f32(v))
            .collect();
        let x: Vec<f32> = xb.iter().map(|v| v.to_f32()).collect();
        let dx = stream.clone_htod(&xb)?;
        let mut dy = poisoned::<bf16>(stream, rows * cols, bf16::NAN)?;
        candle_softmax(stream, &dx, &mut dy, rows as u32, cols as i32)?;
        let y = to_host_f64(stream, &dy)?;
        let ran = ran(&crate::CANDLE_SOFTMAX, stream, &[rows as i64, cols as i64])?;
        checks.push(compare(
            "candle_softmax",
            format!("{rows}x{cols}"),
            ran,
            &y,
            &cpu::softmax(&x, rows, cols),
            1e-2,
            1e-6,
        ));
    }

    for &(rows, cols) in &[(64usize, 4096usize), (3, 8192)] {
        let (dx, x) = normal_f16(stream, rows * cols, 0.0, 7)?;
        let (dw, w) = normal_f16(stream, cols, 1.0, 8)?;
        let mut dy = poisoned::<f16>(stream, rows * cols, f16::NAN)?;
        rmsnorm(stream, &dx, &dw, &mut dy, rows as u32, cols as u32, 1e-5)?;
        let y = to_host_f64(stream, &dy)?;
        let ran = ran(&crate::RMSNORM, stream, &[rows as i64, cols as i64, 0])?;
        checks.push(compare(
            "rmsnorm",
            format!("{rows}x{cols}"),
            ran,
            &y,
            &cpu::rmsnorm(&x, &w, rows, cols, 1e-5),
            1e-2,
            1e-2,
        ));
    }

    for &n in &[1usize << 20, 1000] {
        let x = normal_f32(n, 1.0, 11);
        let dx = stream.clone_htod(&x)?;
        let mut out = stream.clone_htod(&[0.5f32])?;
        reduce_sum(stream, &dx, &mut out, n as u64)?;
        let got = stream.clone_dtoh(&out)?[0] as f64;
        let ran = ran(&crate::REDUCE_SUM, stream, &[n as i64])?;
        checks.push(compare(
            "reduce_sum",
            format!("n={n}"),
            ran,
            &[got],
            &[0.5 + cpu::sum(&x)],
            1e-4,
            1e-2,
        ));
    }

    for &(rows, cols) in &[(16usize, 65536usize), (512, 2048), (7, 1001)] {
        let x = normal_f32(rows * cols, 0.0, 31 + rows as u64);
        let dx = stream.clone_htod(&x)?;
        let mut dy = poisoned::<f32>(stream, rows, f32::NAN)?;
        row_sum(stream, &dx, &mut dy, rows as u32, cols as u32)?;
        let y = to_host_f64(stream, &dy)?;
        let ran = ran(&crate::ROW_SUM, stream, &[rows as i64, cols as i64])?;
        checks.push(compare(
            "row_sum",
            format!("{rows}x{cols}"),
            ran,
            &y,
            &cpu::row_sum(&x, rows, cols),
            1e-4,
            1e-3,
        ));
    }

    // Few work items (the accepted variant splits the keys and merges the splits) and 64
    // (it does not split: one block a work item).
    for &(b, hq, hkv, s) in &[
        (2usize, 8usize, 2usize, 1024usize),
        (1, 32, 8, 300),
        (8, 32, 8, 256),
    ] {
        let d = 128;
        let (dq, q) = normal_f16(stream, b * hq * d, 0.0, 21)?;
        let (dk, k) = normal_f16(stream, b * hkv * s * d, 0.0, 22)?;
        let (dv, v) = normal_f16(stream, b * hkv * s * d, 0.0, 23)?;
        let mut dout = poisoned::<f16>(stream, b * hq * d, f16::NAN)?;
        gqa_decode(
            stream, &dq, &dk, &dv, &mut dout, b as u32, hq as u32, hkv as u32, s as u32,
        )?;
        let got = to_host_f64(stream, &dout)?;
        let ran = ran(
            &crate::GQA_DECODE,
            stream,
            &[b as i64, hq as i64, hkv as i64, s as i64],
        )?;
        let want = cpu::gqa_decode(&q, &k, &v, b, hq, hkv, s, d);
        checks.push(compare(
            "gqa_decode",
            format!("b={b} hq={hq} hkv={hkv} s={s}"),
            ran,
            &got,
            &want,
            1e-2,
            1e-2,
        ));
    }
    // Pages of 16 and 64, lengths that end inside a page, on a page boundary and at one
    // key; groups of 4 and 8 query heads; the block table a shuffled permutation of the
    // pool's pages, as an engine's allocator leaves it.
    for &(hq, hkv, page, lens) in &[
        (8usize, 2usize, 16usize, &[1i32, 77, 1024, 300][..]),
        (32, 8, 64, &[640, 129][..]),
        (16, 2, 16, &[2048][..]),
    ] {
        let (b, d) = (lens.len(), 128);
        let max_len = *lens.iter().max().unwrap() as usize;
        let max_pages = max_len.div_ceil(page);
        let num_pages = b * max_pages;
        let mut table: Vec<i32> = (0..num_pages as i32).collect();
        table.shuffle(&mut rand::rngs::StdRng::seed_from_u64(31));
        let rows = num_pages * hkv * page * d;
        let (dq, q) = normal_f16(stream, b * hq * d, 0.0, 32)?;
        let (dk, k) = normal_f16(stream, rows, 0.0, 33)?;
        let (dv, v) = normal_f16(stream, rows, 0.0, 34)?;
        let (dt, dl) = (stream.clone_htod(&table)?, stream.clone_htod(lens)?);
        let mut dout = poisoned::<f16>(stream, b * hq * d, f16::NAN)?;
        let min_len = *lens.iter().min().unwrap() as u32;
        paged_decode(
            stream,
            &dq,
            &dk,
            &dv,
            &dt,
            &dl,
            &mut dout,
            b as u32,
            hq as u32,
            hkv as u32,
            page as u32,
            max_pages as u32,
            num_pages as u32,
            min_len,
            max_len as u32,
        )?;
        let got = to_host_f64(stream, &dout)?;
        let args = [
            b,
            hq,
            hkv,
            page,
            max_pages,
            num_pages,
            min_len as usize,
            max_len,
        ];
        let ran = ran(&crate::PAGED_DECODE, stream, &args.map(|a| a as i64))?;
        let want = cpu::paged_decode(&q, &k, &v, &table, lens, hq, hkv, page, max_pages, d);
        checks.push(compare(
            "paged_decode",
            format!("hq={hq} hkv={hkv} page={page} lens={lens:?}"),
            ran,
            &got,
            &want,
            1e-2,
            1e-2,
        ));
    }
    // Row lengths that take a vectorised path (a multiple of 8) and one that does not.
    for &(rows, cols) in &[(64usize, 4096usize), (3, 8192), (5, 1001)] {
        let (dx, x) = normal_f16(stream, rows * cols, 0.5, 41)?;
        let (dw, w) = normal_f16(stream, cols, 1.0, 42)?;
        let (db, b) = normal_f16(stream, cols, 0.0, 43)?;
        let mut dy = poisoned::<f16>(stream, rows * cols, f16::NAN)?;
        layer_norm(
            stream,
            &dx,
            &dw,
            &db,
            &mut dy,
            rows as u32,
            cols as u32,
            1e-5,
        )?;
        let y = to_host_f64(stream, &dy)?;
        let ran = ran(&crate::LAYER_NORM, stream, &[rows as i64, cols as i64, 0])?;
        checks.push(compare(
            "layer_norm",
            format!("{rows}x{cols}"),
            ran,
            &y,
            &cpu::layer_norm(&x, &w, &b, rows, cols, 1e-5),
            1e-2,
            1e-2,
        ));
    }

    // Whole tiles, partial tiles, and sizes that are not a multiple of 4.
    for &(rows, cols) in &[(256usize, 512usize), (200, 72), (37, 101)] {
        let x = normal_f32(rows * cols, 0.0, 51 + rows as u64);
        let dx = stream.clone_htod(&x)?;
        let mut dy = poisoned::<f32>(stream, rows * cols, f32::NAN)?;
        transpose(stream, &dx, &mut dy, rows as u32, cols as u32)?;
        let y = to_host_f64(stream, &dy)?;
        let ran = ran(&crate::TRANSPOSE, stream, &[rows as i64, cols as i64])?;
        checks.push(compare(
            "transpose",
            format!("{rows}x{cols}"),
            ran,
            &y,
            &cpu::transpose(&x, rows, cols),
            0.0,
            0.0,
        ));
    }

    for &(tokens, d) in &[(16usize, 4096usize), (64, 1376), (7, 1001)] {
        let (dx, x) = normal_f16(stream, tokens * 2 * d, 0.0, 61)?;
        let mut dout = poisoned::<f16>(stream, tokens * d, f16::NAN)?;
        silu_mul(stream, &dx, &mut dout, tokens as u32, d as u32)?;
        let got = to_host_f64(stream, &dout)?;
        let ran = ran(&crate::SILU_MUL, stream, &[tokens as i64, d as i64])?;
        checks.push(compare(
            "silu_mul",
            format!("{tokens}x{d}"),
            ran,
            &got,
            &cpu::silu_mul(&x, tokens, d),
            1e-2,
            1e-3,
        ));
    }

    // Whole tiles; M, N and K past the tiles (N and K multiples of 8); odd sizes.
    for &(m, n, k) in &[(256usize, 256usize, 512usize), (130, 136, 40), (33, 17, 19)] {
        let (da, a) = normal_f16(stream, m * k, 0.0, 71)?;
        let (db, b) = normal_f16(stream, k * n, 0.0, 72)?;
        let mut dc = poisoned::<f16>(stream, m * n, f16::NAN)?;
        gemm(stream, &da, &db, &mut dc, m as u32, n as u32, k as u32)?;
        let got = to_host_f64(stream, &dc)?;
        let ran = ran(&crate::GEMM, stream, &[m as i64, n as i64, k as i64])?;
        checks.push(compare(
            "gemm",
            format!("{m}x{n}x{k}"),
            ran,
            &got,
            &cpu::gemm(&a, &b, m, n, k),
            2e-3,
            1e-2,
        ));
    }
    Ok(checks)
}

/// A buffer shorter than the spec says is refused before anything is launched.
pub fn short_buffer_is_refused(stream: &Arc<CudaStream>) -> Res<bool> {
    let short = stream.alloc_zeros::<f32>(10)?;
    let mut y = stream.alloc_zeros::<f32>(4096)?;
    Ok(matches!(
        softmax(stream, &short, &mut y, 1, 4096),
        Err(kopt::Error::BufferTooShort { .. })
    ))
}
