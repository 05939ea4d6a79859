//! A small decode step through the crate's launchers, on inputs with the structure real
//! activations have: what `llm-kernels decode` runs, and what `KOPT_CAPTURE` records of a
//! program's own launches.
//!
//! The model: hidden size 4096, 32 query heads sharing 8 KV heads of dimension 128, an MLP
//! of 11008, a vocabulary of 32000; a batch of 8 sequences decoding one token each over a
//! KV cache of 1024 positions. Weights are drawn (seeded, uniform with the variance of
//! N(0, 1/fan in)): nothing is downloaded. One step:
//!
//! 1. **embedding**: each token's row of the table, copied into the hidden state (a device
//!    copy; the crate has no gather kernel);
//! 2. `rmsnorm` of the hidden state; `gemm` by `W_q` (8 x 4096 by 4096 x 4096);
//! 3. `gqa_decode` of the queries over the cache;
//! 4. `gemm` by `W_o`; `layer_norm`;
//! 5. `gemm` by `W_up` (to 2 x 11008), `silu_mul`, `gemm` by `W_down` (11008 to 4096);
//! 6. `gemm` by the unembedding (4096 to 32000): the step's logits, fp16.
//!
//! Then the sampling and its diagnostics, on fp32 logits drawn as peaked rows (the crate
//! has no fp16-to-fp32 cast, so these logits are not the step's): `softmax`, the bf16
//! `candle_softmax` of the same logits, `row_sum` of the probabilities (each row sums to
//! one), their total (`reduce_sum`), and the probabilities vocabulary-major (`transpose`).
//! Every annotated kernel of the crate runs, on shapes a decode step launches: most of
//! them are not the declared (prefill-sized) shapes, which is what a capture shows.
//!
//! The inputs' structure, after what is measured in LLMs:
//! - **massive activations** (Sun et al., 2024): four fixed channels of the hidden state
//!   hold values of 200 to 800 in every token, where the others are about 0.02 (some
//!   10^4 times the median); each token's scale varies by 0.5x to 2x;
//! - **key outlier channels** (as KIVI and KVQuant report): 4 of the 128 dimensions of
//!   every KV head's keys are 16 times the others;
//! - **peaked logits**: each row is N(0, 2) with 3 tokens 15 to 25 above the rest, so that
//!   the softmax is dominated by a few entries and `exp` without the row's maximum
//!   overflows.

use std::sync::Arc;

use kopt::cudarc::driver::{CudaSlice, CudaStream};
use kopt::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

use crate::check::Res;
use crate::{
    candle_softmax, gemm, gqa_decode, layer_norm, reduce_sum, rmsnorm, row_sum, silu_mul, softmax,
    transpose,
};

pub const BATCH: usize = 8;
pub const HIDDEN: usize = 4096;
pub const Q_HEADS: usize = 32;
pub const KV_HEADS: usize = 8;
pub const HEAD_DIM: usize = 128;
pub const SEQ_LEN: usize = 1024;
pub const FFN: usize = 11008;
pub const VOCAB: usize = 32000;
/// Embedding rows kept on the device (token ids are drawn below this).
const TABLE_ROWS: usize = 4096;
/// The hidden state's channels of massive activations.
pub const MASSIVE_CHANNELS: [usize; 4] = [1337, 2048, 3001, 3990];
/// Key dimensions (of 128) that carry the outliers in every KV head.
pub const KEY_OUTLIER_DIMS: [usize; 4] = [7, 31, 64, 100];

fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

fn normal(n: usize, std: f32, seed: u64) -> Vec<f32> {
    let mut r = rng(seed);
    let d = Normal::new(0.0f32, std).unwrap();
    (0..n).map(|_| d.sample(&mut r)).collect()
}

/// Uniform in `[-a, a]` with `a = std * sqrt(3)`: the variance of N(0, std^2), drawn
/// several times faster (the weights are 330 M values).
fn uniform(n: usize, std: f32, seed: u64) -> Vec<f32> {
    let mut r = rng(seed);
    let a = std * 3f32.sqrt();
    (0..n).map(|_| r.random_range(-a..a)).collect()
}

fn halves(v: &[f32]) -> Vec<f16> {
    v.iter().map(|&x| f16::from_f32(x)).collect()
}

/// An embedding table of `rows` rows: values of about 0.02 with the massive channels at
/// 200 to 800 (their sign fixed per channel), each row scaled by 0.5 to 2.
pub fn embedding_table(rows: usize, seed: u64) -> Vec<f32> {
    let mut t = normal(rows * HIDDEN, 0.02, seed);
    let mut r = rng(seed ^ 0xE3B);
    for row in t.chunks_mut(HIDDEN) {
        let scale: f32 = r.random_range(0.5..2.0);
        for v in row.iter_mut() {
            *v *= scale;
        }
        for (i, &c) in MASSIVE_CHANNELS.iter().enumerate() {
            let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
            row[c] = sign * r.random_range(200.0..800.0);
        }
    }
    t
}

/// A KV cache of `rows` key and value rows of `head_dim` (`[batch, kv_heads, seq_len]`
/// of them for the model): keys with their outlier dimensions 16 times the others,
/// values plain.
pub fn kv_cache(rows: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let n = rows * HEAD_DIM;
    let mut k = normal(n, 1.0, seed);
    for row in k.chunks_mut(HEAD_DIM) {
        for &d in &KEY_OUTLIER_DIMS {
            row[d] *= 16.0;
        }
    }
    (k, normal(n, 1.0, seed ^ 0x5EED))
}

/// `rows x VOCAB` logits: N(0, 2), with 3 tokens of each row 15 to 25 above the rest.
pub fn peaked_logits(rows: usize, seed: u64) -> Vec<f32> {
    let mut l = normal(rows * VOCAB, 2.0, seed);
    let mut r = rng(seed ^ 0x9EA);
    for row in l.chunks_mut(VOCAB) {
        for _ in 0..3 {
            let t = r.random_range(0..VOCAB);
            row[t] += r.random_range(15.0..25.0);
        }
    }
    l
}

/// The model's weights and cache on the device.
pub struct Model {
    table: CudaSlice<f16>,
    norm_w: CudaSlice<f16>,
    ln_w: CudaSlice<f16>,
    ln_b: CudaSlice<f16>,
    w_q: CudaSlice<f16>,
    w_o: CudaSlice<f16>,
    w_up: CudaSlice<f16>,
    w_down: CudaSlice<f16>,
    w_vocab: CudaSlice<f16>,
    k_cache: CudaSlice<f16>,
    v_cache: CudaSlice<f16>,
}

impl Model {
    pub fn new(stream: &Arc<CudaStream>, seed: u64) -> Res<Model> {
        let up = |v: Vec<f32>| -> Res<CudaSlice<f16>> { Ok(stream.clone_htod(&halves(&v))?) };
        let weight =
            |k: usize, n: usize, s: u64| up(uniform(k * n, 1.0 / (k as f32).sqrt(), seed ^ s));
        let (k, v) = kv_cache(BATCH * KV_HEADS * SEQ_LEN, seed ^ 0xCAC4E);
        Ok(Model {
            table: up(embedding_table(TABLE_ROWS, seed ^ 0xE))?,
            norm_w: up(vec![1.0; HIDDEN])?,
            ln_w: up(vec![1.0; HIDDEN])?,
            ln_b: up(vec![0.0; HIDDEN])?,
            w_q: weight(HIDDEN, Q_HEADS * HEAD_DIM, 1)?,
            w_o: weight(Q_HEADS * HEAD_DIM, HIDDEN, 2)?,
            w_up: weight(HIDDEN, 2 * FFN, 3)?,
            w_down: weight(FFN, HIDDEN, 4)?,
            w_vocab: weight(HIDDEN, VOCAB, 5)?,
            k_cache: up(k)?,
            v_cache: up(v)?,
        })
    }
}

/// What one step leaves for the caller to look at.
pub struct Step {
    /// The step's logits, `BATCH x VOCAB`, fp16.
    pub logits: Vec<f16>,
    /// The sampling's probabilities' row sums (each should be 1) and their total.
    pub row_sums: Vec<f32>,
    pub total: f32,
}

/// One decode step and its sampling for the tokens `ids` (below 4096), `step` seeding the
/// sampling's logits.
pub fn step(stream: &Arc<CudaStream>, m: &Model, ids: &[usize], step: u64) -> Res<Step> {
    let (b, h) = (BATCH as u32, HIDDEN as u32);
    // 1. Embedding: the tokens' rows of the table.
    let mut x = stream.alloc_zeros::<f16>(BATCH * HIDDEN)?;
    for (t, &id) in ids.iter().enumerate() {
        let src = m.table.slice(id * HIDDEN..(id + 1) * HIDDEN);
        let mut dst = x.slice_mut(t * HIDDEN..(t + 1) * HIDDEN);
        stream.memcpy_dtod(&src, &mut dst)?;
    }
    // 2. Attention's input: RMS norm, the query projection.
    let mut hn = stream.alloc_zeros::<f16>(BATCH * HIDDEN)?;
    rmsnorm(stream, &x, &m.norm_w, &mut hn, b, h, 1e-5)?;
    let mut q = stream.alloc_zeros::<f16>(BATCH * Q_HEADS * HEAD_DIM)?;
    gemm(
        stream,
        &hn,
        &m.w_q,
        &mut q,
        b,
        (Q_HEADS * HEAD_DIM) as u32,
        h,
    )?;
    // 3. Attention over the cache.
    let mut attn = stream.alloc_zeros::<f16>(BATCH * Q_HEADS * HEAD_DIM)?;
    gqa_decode(
        stream,
        &q,
        &m.k_cache,
        &m.v_cache,
        &mut attn,
        b,
        Q_HEADS as u32,
        KV_HEADS as u32,
        SEQ_LEN as u32,
    )?;
    // 4. Output projection, layer norm.
    let mut o = stream.alloc_zeros::<f16>(BATCH * HIDDEN)?;
    gemm(
        stream,
        &attn,
        &m.w_o,
        &mut o,
        b,
        h,
        (Q_HEADS * HEAD_DIM) as u32,
    )?;
    let mut h2 = stream.alloc_zeros::<f16>(BATCH * HIDDEN)?;
    layer_norm(stream, &o, &m.ln_w, &m.ln_b, &mut h2, b, h, 1e-5)?;
    // 5. The MLP: up to gate and value, SwiGLU, down.
    let mut up = stream.alloc_zeros::<f16>(BATCH * 2 * FFN)?;
    gemm(stream, &h2, &m.w_up, &mut up, b, (2 * FFN) as u32, h)?;
    let mut act = stream.alloc_zeros::<f16>(BATCH * FFN)?;
    silu_mul(stream, &up, &mut act, b, FFN as u32)?;
    let mut down = stream.alloc_zeros::<f16>(BATCH * HIDDEN)?;
    gemm(stream, &act, &m.w_down, &mut down, b, h, FFN as u32)?;
    // 6. Logits.
    let mut logits = stream.alloc_zeros::<f16>(BATCH * VOCAB)?;
    gemm(stream, &down, &m.w_vocab, &mut logits, b, VOCAB as u32, h)?;

    // Sampling and its diagnostics on peaked fp32 logits.
    let l = peaked_logits(BATCH, 0x10617 ^ step);
    let l32 = stream.clone_htod(&l)?;
    let mut p = stream.alloc_zeros::<f32>(BATCH * VOCAB)?;
    softmax(stream, &l32, &mut p, b, VOCAB as u32)?;
    let l16: Vec<bf16> = l.iter().map(|&v| bf16::from_f32(v)).collect();
    let l16 = stream.clone_htod(&l16)?;
    let mut p16 = stream.alloc_zeros::<bf16>(BATCH * VOCAB)?;
    candle_softmax(stream, &l16, &mut p16, b, VOCAB as i32)?;
    let mut sums = stream.alloc_zeros::<f32>(BATCH)?;
    row_sum(stream, &p, &mut sums, b, VOCAB as u32)?;
    let mut total = stream.alloc_zeros::<f32>(1)?;
    reduce_sum(stream, &p, &mut total, (BATCH * VOCAB) as u64)?;
    let mut pt = stream.alloc_zeros::<f32>(BATCH * VOCAB)?;
    transpose(stream, &p, &mut pt, b, VOCAB as u32)?;
    Ok(Step {
        logits: stream.clone_dtoh(&logits)?,
        row_sums: stream.clone_dtoh(&sums)?,
        total: stream.clone_dtoh(&total)?[0],
    })
}

/// `steps` decode steps with drawn token ids: prints each step's probability mass and the
/// largest logit, and returns whether every row's probabilities summed to one.
pub fn run(steps: u64) -> Res<bool> {
    let ctx = kopt::cudarc::driver::CudaContext::new(0)?;
    let stream = ctx.default_stream();
    println!("device: {}", ctx.name()?);
    let model = Model::new(&stream, 0xDEC0DE)?;
    let mut r = rng(0x70CE);
    let mut ok = true;
    for s in 0..steps {
        let ids: Vec<usize> = (0..BATCH).map(|_| r.random_range(0..TABLE_ROWS)).collect();
        let t = std::time::Instant::now();
        let out = step(&stream, &model, &ids, s)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let finite = out.logits.iter().all(|v| v.is_finite());
        let largest = out
            .logits
            .iter()
            .map(|v| v.to_f32().abs())
            .fold(0.0f32, f32::max);
        let worst = out
            .row_sums
            .iter()
            .map(|v| (v - 1.0).abs())
            .fold(0.0f32, f32::max);
        ok &= finite && worst < 1e-3 && (out.total - BATCH as f32).abs() < 1e-2;
        println!(
            "step {s}: {ms:.1} ms (host, the step's results downloaded); logits {} (largest |logit| {largest:.2}), probability rows sum to 1 within {worst:.1e}, total {:.4}",
            if finite { "finite" } else { "NOT FINITE" },
            out.total
        );
    }
    kopt::observe::flush()?;
    if let Some(dir) = kopt::observe::capture_dir() {
        println!("captured: {}", dir.display());
    }
    for k in crate::KERNELS {
        if let Some(r) = k.shadow_report() {
            println!(
                "shadow {}: {} checks, {} divergences{}",
                r.kernel,
                r.checks,
                r.divergences,
                if r.fell_back {
                    ", fell back to the reference"
                } else {
                    ""
                }
            );
        }
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inputs_have_the_documented_structure() {
        let t = embedding_table(2, 1);
        let row = &t[..HIDDEN];
        let mut mags: Vec<f32> = row.iter().map(|v| v.abs()).collect();
        mags.sort_by(|a, b| a.total_cmp(b));
        let median = mags[HIDDEN / 2];
        for &c in &MASSIVE_CHANNELS {
            assert!(row[c].abs() >= 200.0 && row[c].abs() <= 800.0);
            assert!(
                row[c].abs() / median > 5000.0,
                "{} against {median}",
                row[c]
            );
        }
        let (k, _) = kv_cache(4096, 2);
        let rms = |f: &dyn Fn(usize) -> bool| {
            let v: Vec<f32> = k
                .chunks(HEAD_DIM)
                .flat_map(|r| r.iter().enumerate().filter(|(d, _)| f(*d)).map(|(_, v)| *v))
                .collect();
            (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt()
        };
        let outliers = rms(&|d| KEY_OUTLIER_DIMS.contains(&d));
        let rest = rms(&|d| !KEY_OUTLIER_DIMS.contains(&d));
        assert!((outliers / rest - 16.0).abs() < 1.0, "{outliers} / {rest}");
        let l = peaked_logits(2, 3);
        for row in l.chunks(VOCAB) {
            let max = row.iter().copied().fold(f32::MIN, f32::max);
            assert!(max > 15.0, "a peak of at least 15 above N(0, 2): {max}");
            // Peaked, not overflowing: exp overflows f32 from 88.7.
            assert!(max < 40.0);
        }
    }
}
