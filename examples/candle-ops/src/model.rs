//! A small candle model step that uses the two ops where a decoder does: the last layer
//! of a transformer over a window of tokens (RMS norm, attention with RMS-normed queries
//! and keys over each head as Qwen3 does, a residual, the final norm, the vocabulary
//! projection), ending in the next-token probabilities. Its weights are random: the step
//! is here to run the ops inside a real candle graph (matmuls through cuBLAS, reshapes,
//! transposes, broadcasts), once with candle-nn's ops and once with kopt's.

use candle_core::{DType, Device, Result, Tensor};

use crate::ops;

/// Whose implementation of softmax and RMS norm a step uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ops {
    /// `candle_nn::ops`.
    Candle,
    /// [`crate::ops`]: kopt's launchers on CUDA.
    Kopt,
}

impl Ops {
    pub fn softmax_last_dim(self, xs: &Tensor) -> Result<Tensor> {
        match self {
            Ops::Candle => candle_nn::ops::softmax_last_dim(xs),
            Ops::Kopt => ops::softmax_last_dim(xs),
        }
    }

    pub fn rms_norm(self, xs: &Tensor, alpha: &Tensor, eps: f32) -> Result<Tensor> {
        match self {
            Ops::Candle => candle_nn::ops::rms_norm(xs, alpha, eps),
            Ops::Kopt => ops::rms_norm(xs, alpha, eps),
        }
    }
}

/// The step's sizes.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub tokens: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub eps: f32,
}

impl Config {
    /// 256 tokens, 8 heads of 128 (a hidden size of 1024), Llama 2's vocabulary of 32000.
    pub const SMALL: Config = Config {
        tokens: 256,
        heads: 8,
        head_dim: 128,
        vocab: 32000,
        eps: 1e-6,
    };

    pub fn hidden(&self) -> usize {
        self.heads * self.head_dim
    }
}

/// The weights of the step.
pub struct DecoderStep {
    cfg: Config,
    attn_norm: Tensor,
    q_norm: Tensor,
    k_norm: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    final_norm: Tensor,
    lm_head: Tensor,
    /// 0 on and below the diagonal, -inf above: each token attends to itself and the
    /// tokens before it.
    causal_mask: Tensor,
}

/// A matrix of `rows x cols` drawn from N(0, 1/rows), so that a product with it keeps
/// activations of order one.
fn projection(rows: usize, cols: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    Tensor::randn(
        0f32,
        (1.0 / rows as f64).sqrt() as f32,
        (rows, cols),
        device,
    )?
    .to_dtype(dtype)
}

/// A norm's weight, drawn from U(0.5, 1.5) as trained weights roughly are.
fn norm_weight(len: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    Tensor::rand(0.5f32, 1.5f32, len, device)?.to_dtype(dtype)
}

impl DecoderStep {
    /// Random weights, the same for the same `seed` on the same device.
    pub fn new(cfg: Config, dtype: DType, device: &Device, seed: u64) -> Result<Self> {
        device.set_seed(seed)?;
        let h = cfg.hidden();
        let t = cfg.tokens;
        let mask: Vec<f32> = (0..t * t)
            .map(|i| {
                if i % t > i / t {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        Ok(Self {
            cfg,
            attn_norm: norm_weight(h, dtype, device)?,
            q_norm: norm_weight(cfg.head_dim, dtype, device)?,
            k_norm: norm_weight(cfg.head_dim, dtype, device)?,
            wq: projection(h, h, dtype, device)?,
            wk: projection(h, h, dtype, device)?,
            wv: projection(h, h, dtype, device)?,
            wo: projection(h, h, dtype, device)?,
            final_norm: norm_weight(h, dtype, device)?,
            lm_head: projection(h, cfg.vocab, dtype, device)?,
            causal_mask: Tensor::from_vec(mask, (t, t), device)?.to_dtype(dtype)?,
        })
    }

    pub fn config(&self) -> Config {
        self.cfg
    }

    /// Hidden states for the step's tokens, N(0, 1), the same for the same `seed`.
    pub fn input(&self, dtype: DType, device: &Device, seed: u64) -> Result<Tensor> {
        device.set_seed(seed)?;
        Tensor::randn(0f32, 1f32, (self.cfg.tokens, self.cfg.hidden()), device)?.to_dtype(dtype)
    }

    /// The next-token probabilities of each token, `[tokens, vocab]`, from hidden states
    /// `x` of `[tokens, hidden]`.
    pub fn forward(&self, x: &Tensor, ops: Ops) -> Result<Tensor> {
        let Config {
            tokens: t,
            heads,
            head_dim: d,
            eps,
            ..
        } = self.cfg;
        let xn = ops.rms_norm(x, &self.attn_norm, eps)?;
        // [t, heads, d], normed over each head's d, then [heads, t, d].
        let split = |w: &Tensor| xn.matmul(w)?.reshape((t, heads, d));
        let q = ops.rms_norm(&split(&self.wq)?, &self.q_norm, eps)?;
        let k = ops.rms_norm(&split(&self.wk)?, &self.k_norm, eps)?;
        let (q, k) = (
            q.transpose(0, 1)?.contiguous()?,
            k.transpose(0, 1)?.contiguous()?,
        );
        let v = split(&self.wv)?.transpose(0, 1)?.contiguous()?;
        let scores = (q.matmul(&k.t()?)? * (1.0 / (d as f64).sqrt()))?;
        let p = ops.softmax_last_dim(&scores.broadcast_add(&self.causal_mask)?)?;
        let attn = p.matmul(&v)?.transpose(0, 1)?.reshape((t, heads * d))?;
        let x = (x + attn.matmul(&self.wo)?)?;
        let logits = ops
            .rms_norm(&x, &self.final_norm, eps)?
            .matmul(&self.lm_head)?;
        ops.softmax_last_dim(&logits)
    }
}
