//! CPU references in f64, to check the GPU launchers against.

pub fn softmax(x: &[f32], rows: usize, cols: usize) -> Vec<f64> {
    let mut y = vec![0.0; rows * cols];
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
        for c in 0..cols {
            y[r * cols + c] = (row[c] as f64 - m).exp() / s;
        }
    }
    y
}

pub fn rmsnorm(x: &[f32], w: &[f32], rows: usize, cols: usize, eps: f64) -> Vec<f64> {
    let mut y = vec![0.0; rows * cols];
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let ms: f64 = row.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / cols as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        for c in 0..cols {
            y[r * cols + c] = row[c] as f64 * inv * w[c] as f64;
        }
    }
    y
}

pub fn sum(x: &[f32]) -> f64 {
    x.iter().map(|&v| v as f64).sum()
}

pub fn row_sum(x: &[f32], rows: usize, cols: usize) -> Vec<f64> {
    (0..rows)
        .map(|r| sum(&x[r * cols..(r + 1) * cols]))
        .collect()
}

/// q: [b, hq, d]; k, v: [b, hkv, s, d].
#[allow(clippy::too_many_arguments)]
pub fn gqa_decode(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    b: usize,
    hq: usize,
    hkv: usize,
    s: usize,
    d: usize,
) -> Vec<f64> {
    let mut out = vec![0.0; b * hq * d];
    let group = hq / hkv;
    let scale = 1.0 / (d as f64).sqrt();
    for bi in 0..b {
        for h in 0..hq {
            let kvh = h / group;
            let qv = &q[(bi * hq + h) * d..(bi * hq + h + 1) * d];
            let base = (bi * hkv + kvh) * s * d;
            let scores: Vec<f64> = (0..s)
                .map(|t| {
                    let kr = &k[base + t * d..base + (t + 1) * d];
                    qv.iter()
                        .zip(kr)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = p.iter().sum();
            for dd in 0..d {
                let acc: f64 = (0..s).map(|t| p[t] * v[base + t * d + dd] as f64).sum();
                out[(bi * hq + h) * d + dd] = acc / z;
            }
        }
    }
    out
}

/// One decode step over a paged KV cache (`[num_pages, hkv, page_size, d]` caches, a
/// `[b, max_pages]` block table): gathers each sequence's rows through its table, then
/// attends as [`gqa_decode`] does.
#[allow(clippy::too_many_arguments)]
pub fn paged_decode(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    block_table: &[i32],
    seq_lens: &[i32],
    hq: usize,
    hkv: usize,
    page_size: usize,
    max_pages: usize,
    d: usize,
) -> Vec<f64> {
    let b = seq_lens.len();
    let mut out = Vec::with_capacity(b * hq * d);
    for (bi, &len) in seq_lens.iter().enumerate() {
        let len = len as usize;
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for kvh in 0..hkv {
            for p in 0..len {
                let page = block_table[bi * max_pages + p / page_size] as usize;
                let row = ((page * hkv + kvh) * page_size + p % page_size) * d;
                k.extend_from_slice(&k_cache[row..row + d]);
                v.extend_from_slice(&v_cache[row..row + d]);
            }
        }
        out.extend(gqa_decode(
            &q[bi * hq * d..(bi + 1) * hq * d],
            &k,
            &v,
            1,
            hq,
            hkv,
            len,
            d,
        ));
    }
    out
}

pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], rows: usize, cols: usize, eps: f64) -> Vec<f64> {
    let mut y = vec![0.0; rows * cols];
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let mean = sum(row) / cols as f64;
        let var = row
            .iter()
            .map(|&v| (v as f64 - mean) * (v as f64 - mean))
            .sum::<f64>()
            / cols as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for c in 0..cols {
            y[r * cols + c] = (row[c] as f64 - mean) * rstd * w[c] as f64 + b[c] as f64;
        }
    }
    y
}

/// `y[c][r] = x[r][c]` for a `rows x cols` input.
pub fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f64> {
    let mut y = vec![0.0; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            y[c * rows + r] = x[r * cols + c] as f64;
        }
    }
    y
}

/// x: [tokens, 2d] (gate, then up); out: [tokens, d].
pub fn silu_mul(x: &[f32], tokens: usize, d: usize) -> Vec<f64> {
    let mut out = vec![0.0; tokens * d];
    for t in 0..tokens {
        for j in 0..d {
            let g = x[t * 2 * d + j] as f64;
            let u = x[t * 2 * d + d + j] as f64;
            out[t * d + j] = g / (1.0 + (-g).exp()) * u;
        }
    }
    out
}

/// a: [m, k], b: [k, n], row-major; returns [m, n].
pub fn gemm(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        let ci = &mut c[i * n..(i + 1) * n];
        for p in 0..k {
            let av = a[i * k + p] as f64;
            for (cv, &bv) in ci.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *cv += av * bv as f64;
            }
        }
    }
    c
}
