//! The numeric fence on synthetic data, on the CPU: fp32 kernels that only reorder their
//! reductions pass against a serial reference, and kernels that are wrong fail.
//!
//! Every kernel here is emulated in `f32` (or `f16` where it accumulates in half), element
//! by element as the GPU would round, so the differences are real rounding differences.
//! Rust does not contract `a * b + c` into a fused multiply-add unless asked
//! (`mul_add`), so each emulation rounds exactly where it says.

use half::f16;
use kopt_engine::compare::{compare, OutputComparison, ScaleOf};
use kopt_spec::spec::{DType, Tolerance};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

const F32_TOL: Tolerance = Tolerance {
    rtol: 1e-4,
    atol: 1e-5,
};

/// Threads of the emulated block: each reduces a strided slice of the row, then the block
/// combines the partials in a tree, as warp shuffles and shared memory do.
const THREADS: usize = 256;

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn dims(rows: usize, cols: usize) -> Vec<(String, u64)> {
    vec![("rows".into(), rows as u64), ("cols".into(), cols as u64)]
}

fn normals(rng: &mut StdRng, n: usize, mean: f64, std: f64) -> Vec<f32> {
    let d = Normal::new(mean, std).unwrap();
    (0..n).map(|_| d.sample(rng) as f32).collect()
}

/// Elements failing the element-wise rule this fence used before it judged elements
/// against their row's scale: `|got - want| <= atol + rtol * |want|`.
fn elementwise_failures(got: &[f32], want: &[f32], tol: Tolerance) -> usize {
    got.iter()
        .zip(want)
        .filter(|(g, w)| {
            let (g, w) = (**g as f64, **w as f64);
            !(g.is_finite() && w.is_finite() && (g - w).abs() <= tol.atol + tol.rtol * w.abs())
        })
        .count()
}

fn compare_f32(tol: Tolerance, got: &[f32], want: &[f32], rows: usize) -> OutputComparison {
    let cols = want.len() / rows;
    compare(
        "y",
        DType::F32,
        tol,
        &bytes(got),
        &bytes(want),
        Some(&dims(rows, cols)),
    )
}

/// A tree over the partials, pairwise as shuffles combine them.
fn tree(mut v: Vec<f32>, combine: impl Fn(f32, f32) -> f32) -> f32 {
    while v.len() > 1 {
        let half = v.len() / 2;
        for i in 0..half {
            v[i] = combine(v[i], v[i + half]);
        }
        v.truncate(half);
    }
    v[0]
}

/// Per-thread strided sums of `f(x)`, combined in a tree.
fn block_sum(row: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut partial = vec![0.0f32; THREADS];
    for (i, &x) in row.iter().enumerate() {
        partial[i % THREADS] += f(x);
    }
    tree(partial, |a, b| a + b)
}

// ---------------------------------------------------------------------------------------
// Layer norm, y = (x - mean) * rstd * w + b, over rows.

const EPS: f32 = 1e-5;

#[derive(Clone, Copy, Debug)]
enum LayerNorm {
    /// The reference: one thread, left to right, two passes (mean, then the variance
    /// around it), as a first kernel is written.
    Serial,
    /// Two passes, each reduced by a block: strided partials and a shuffle tree.
    TwoPassTree,
    /// Welford's running mean and M2 per thread, merged pairwise (Chan et al.).
    Welford,
    /// One pass: sum and sum of squares, variance `E[x^2] - E[x]^2`.
    OnePass,
    /// One pass as `--use_fast_math` builds it: `rsqrtf` two units in the last place off
    /// the correctly rounded value, and the affine folded into one fused multiply-add,
    /// `fma(x, w * rstd, b - mean * w * rstd)`.
    OnePassFastMath,
}

const REORDERED: [LayerNorm; 4] = [
    LayerNorm::TwoPassTree,
    LayerNorm::Welford,
    LayerNorm::OnePass,
    LayerNorm::OnePassFastMath,
];

/// `x` moved `k` units in the last place up.
fn ulps_up(x: f32, k: u32) -> f32 {
    f32::from_bits(x.to_bits() + k)
}

fn welford(row: &[f32]) -> (f32, f32) {
    // (count, mean, M2) per thread, then a tree of Chan's merges.
    let mut parts = vec![(0.0f32, 0.0f32, 0.0f32); THREADS];
    for (i, &x) in row.iter().enumerate() {
        let (n, mean, m2) = &mut parts[i % THREADS];
        *n += 1.0;
        let d = x - *mean;
        *mean += d / *n;
        *m2 += d * (x - *mean);
    }
    while parts.len() > 1 {
        let half = parts.len() / 2;
        for i in 0..half {
            let (na, ma, sa) = parts[i];
            let (nb, mb, sb) = parts[i + half];
            let n = na + nb;
            let d = mb - ma;
            parts[i] = (n, ma + d * (nb / n), sa + sb + d * d * (na * nb / n));
        }
        parts.truncate(half);
    }
    let (n, mean, m2) = parts[0];
    (mean, m2 / n)
}

fn layer_norm(kind: LayerNorm, x: &[f32], w: &[f32], b: &[f32], y: &mut [f32]) {
    let cols = w.len();
    for (xr, yr) in x.chunks(cols).zip(y.chunks_mut(cols)) {
        let n = cols as f32;
        let (mean, var) = match kind {
            LayerNorm::Serial => {
                let mut s = 0.0f32;
                for &v in xr {
                    s += v;
                }
                let mean = s / n;
                let mut ss = 0.0f32;
                for &v in xr {
                    ss += (v - mean) * (v - mean);
                }
                (mean, ss / n)
            }
            LayerNorm::TwoPassTree => {
                let mean = block_sum(xr, |v| v) / n;
                (mean, block_sum(xr, |v| (v - mean) * (v - mean)) / n)
            }
            LayerNorm::Welford => welford(xr),
            LayerNorm::OnePass | LayerNorm::OnePassFastMath => {
                let mean = block_sum(xr, |v| v) / n;
                let sq = block_sum(xr, |v| v * v) / n;
                (mean, (sq - mean * mean).max(0.0))
            }
        };
        let rstd = 1.0 / (var + EPS).sqrt();
        if let LayerNorm::OnePassFastMath = kind {
            let rstd = ulps_up(rstd, 2);
            for c in 0..cols {
                let scale = w[c] * rstd;
                yr[c] = xr[c].mul_add(scale, b[c] - mean * scale);
            }
        } else {
            for c in 0..cols {
                yr[c] = (xr[c] - mean) * rstd * w[c] + b[c];
            }
        }
    }
}

/// Activations with a mean offset (a residual stream's), a weight near one, and a bias
/// wide enough that `x_hat * w + b` cancels to near zero at many elements of every row:
/// the outputs there are small while the terms that cancelled are of order one.
fn layer_norm_data(seed: u64, rows: usize, cols: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let w = normals(&mut rng, cols, 1.0, 0.5);
    let b = normals(&mut rng, cols, 0.0, 2.0);
    let x = normals(&mut rng, rows * cols, 3.0, 1.0);
    (x, w, b)
}

const LN_ROWS: usize = 512;
const LN_COLS: usize = 4096;
const SEEDS: u64 = 8;

#[test]
fn reordered_fp32_layer_norms_pass_where_the_elementwise_rule_rejected_them() {
    let results: Vec<(u64, LayerNorm, OutputComparison, usize, usize)> =
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..2u64)
                .map(|part| {
                    scope.spawn(move || {
                        let mut out = Vec::new();
                        for seed in (0..SEEDS).filter(|s| s % 2 == part) {
                            let (x, w, b) = layer_norm_data(seed, LN_ROWS, LN_COLS);
                            let mut want = vec![0.0f32; x.len()];
                            layer_norm(LayerNorm::Serial, &x, &w, &b, &mut want);
                            let near_zero = want.iter().filter(|v| v.abs() < 1e-2).count();
                            for kind in REORDERED {
                                let mut got = vec![0.0f32; x.len()];
                                layer_norm(kind, &x, &w, &b, &mut got);
                                let c = compare_f32(F32_TOL, &got, &want, LN_ROWS);
                                let old = elementwise_failures(&got, &want, F32_TOL);
                                out.push((seed, kind, c, old, near_zero));
                            }
                        }
                        out
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap())
                .collect()
        });
    assert_eq!(results.len(), SEEDS as usize * REORDERED.len());
    for (seed, kind, c, old, near_zero) in &results {
        println!(
            "seed {seed} {kind:?}: {} (element-wise rule: {old} fail; {near_zero} outputs below 1e-2)",
            c.describe()
        );
        assert!(c.passed(), "seed {seed}, {kind:?}: {}", c.describe());
        // Not a pass by a hair: the largest error is well inside the allowance.
        assert!(
            c.max_error_ratio < 0.5,
            "seed {seed}, {kind:?}: {}",
            c.describe()
        );
        assert!(*near_zero > 1000, "the data cancels near zero: {near_zero}");
    }
    // The test has teeth: on the same data the element-wise rule rejects the one-pass
    // variance on every seed, for errors at outputs near zero.
    for (seed, kind, _, old, _) in &results {
        if matches!(kind, LayerNorm::OnePass | LayerNorm::OnePassFastMath) {
            assert!(
                *old > 0,
                "seed {seed}, {kind:?}: the element-wise rule passed it"
            );
        }
    }
}

#[test]
fn the_noise_floor_passes_reordering_under_a_tolerance_tighter_than_fp32_rounding() {
    // rtol 1e-7 is below what an fp32 reduction of 4096 terms can promise: the tolerance
    // alone rejects a tree-reduced layer norm; the rounding-noise floor (6 u sqrt(4096)
    // x row rms) is what passes it. Centred inputs: the two-pass algorithms' own regime.
    let tight = Tolerance {
        rtol: 1e-7,
        atol: 0.0,
    };
    let mut rng = StdRng::seed_from_u64(11);
    let (rows, cols) = (256, 4096);
    let w = normals(&mut rng, cols, 1.0, 0.5);
    let b = normals(&mut rng, cols, 0.0, 2.0);
    let x = normals(&mut rng, rows * cols, 0.0, 1.0);
    let mut want = vec![0.0f32; x.len()];
    layer_norm(LayerNorm::Serial, &x, &w, &b, &mut want);
    for kind in [LayerNorm::TwoPassTree, LayerNorm::Welford] {
        let mut got = vec![0.0f32; x.len()];
        layer_norm(kind, &x, &w, &b, &mut got);
        let c = compare_f32(tight, &got, &want, rows);
        println!("{kind:?}: {}", c.describe());
        assert!(c.passed(), "{kind:?}: {}", c.describe());
        let worst = c.worst.as_ref().unwrap();
        assert!(
            worst.allowance.noise_bound(tight),
            "{kind:?}: the floor, not rtol, set the allowance: {}",
            c.describe()
        );
        assert!(
            c.describe().contains("rounding noise of f32"),
            "{}",
            c.describe()
        );
        assert!(elementwise_failures(&got, &want, tight) > 0);
    }
}

// ---------------------------------------------------------------------------------------
// Softmax over rows, fp32 outputs.

/// The reference: serial max, serial fp32 sum of `exp(x - max)`, then `exp(x - max) / sum`.
fn softmax_serial(x: &[f32], cols: usize, y: &mut [f32]) {
    for (xr, yr) in x.chunks(cols).zip(y.chunks_mut(cols)) {
        let m = xr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut s = 0.0f32;
        for &v in xr {
            s += (v - m).exp();
        }
        let inv = 1.0 / s;
        for (o, &v) in yr.iter_mut().zip(xr) {
            *o = (v - m).exp() * inv;
        }
    }
}

/// A block softmax whose row sum is reduced in `f16`: each thread's partial in fp32
/// rounded to half, then a shuffle tree of half additions (`__hadd`), as a kernel that
/// keeps its reduction in `__half` to halve the shuffle traffic does. With `in_half`
/// false, the same tree in fp32: the control.
fn softmax_block(x: &[f32], cols: usize, y: &mut [f32], in_half: bool) {
    for (xr, yr) in x.chunks(cols).zip(y.chunks_mut(cols)) {
        let m = xr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut partial = vec![0.0f32; THREADS];
        for (i, &v) in xr.iter().enumerate() {
            partial[i % THREADS] += (v - m).exp();
        }
        let s = if in_half {
            let halves: Vec<f16> = partial.iter().map(|p| f16::from_f32(*p)).collect();
            let mut v = halves;
            while v.len() > 1 {
                let half = v.len() / 2;
                for i in 0..half {
                    v[i] = f16::from_f32(v[i].to_f32() + v[i + half].to_f32());
                }
                v.truncate(half);
            }
            v[0].to_f32()
        } else {
            tree(partial, |a, b| a + b)
        };
        let inv = 1.0 / s;
        for (o, &v) in yr.iter_mut().zip(xr) {
            *o = (v - m).exp() * inv;
        }
    }
}

#[test]
fn a_softmax_that_accumulates_its_row_sum_in_fp16_fails() {
    // Attention-like scores (std 2) over rows of 1024: the largest outputs of a row are
    // of order 0.1, where fp16's rounding of the sum shows.
    let (rows, cols) = (512, 1024);
    let mut rng = StdRng::seed_from_u64(5);
    let x = normals(&mut rng, rows * cols, 0.0, 2.0);
    let mut want = vec![0.0f32; x.len()];
    softmax_serial(&x, cols, &mut want);

    let mut control = vec![0.0f32; x.len()];
    softmax_block(&x, cols, &mut control, false);
    let c = compare_f32(F32_TOL, &control, &want, rows);
    assert!(
        c.passed(),
        "the fp32 tree is only reordered: {}",
        c.describe()
    );

    let mut got = vec![0.0f32; x.len()];
    softmax_block(&x, cols, &mut got, true);
    // The error is what the bug gives: a relative error of a few 1e-4 on every output of
    // a row, its largest included.
    let mut worst_rel_at_max = 0.0f64;
    for (g, w) in got.chunks(cols).zip(want.chunks(cols)) {
        let (i, wmax) = w
            .iter()
            .enumerate()
            .fold((0, 0.0f32), |a, (i, v)| if *v > a.1 { (i, *v) } else { a });
        let rel = ((g[i] - wmax) / wmax).abs() as f64;
        worst_rel_at_max = worst_rel_at_max.max(rel);
    }
    assert!(
        (1e-4..2e-3).contains(&worst_rel_at_max),
        "{worst_rel_at_max}"
    );
    let c = compare_f32(F32_TOL, &got, &want, rows);
    println!(
        "{} (worst |diff|/allowed {})",
        c.describe(),
        c.max_error_ratio
    );
    assert!(!c.passed(), "{}", c.describe());
    // Not by a hair: the worst element is several times its allowance.
    assert!(c.max_error_ratio > 3.0, "{}", c.max_error_ratio);
    let bad = c.first_bad.as_ref().unwrap();
    let a = bad.allowance.unwrap();
    // It fails at a large output, judged against its own value, as element-wise.
    assert_eq!(a.scale_of, ScaleOf::Element, "{}", c.describe());
    assert!(bad.want > 0.02, "{}", c.describe());
    // At or above its row's RMS an element is judged element-wise, as before: every
    // element the element-wise rule rejects there is rejected still.
    let mut rejected_above_rms = 0;
    for (g, w) in got.chunks(cols).zip(want.chunks(cols)) {
        let rms = (w.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / cols as f64).sqrt();
        let large: Vec<usize> = (0..cols).filter(|i| (w[*i] as f64).abs() >= rms).collect();
        let (gl, wl): (Vec<f32>, Vec<f32>) = large.iter().map(|i| (g[*i], w[*i])).unzip();
        rejected_above_rms += elementwise_failures(&gl, &wl, F32_TOL);
    }
    assert!(rejected_above_rms > 0);
    assert!(c.failing as usize >= rejected_above_rms, "{}", c.describe());

    // A tolerance tighter than fp32 rounding brings in the noise floor; it is fp32's
    // (the arithmetic's), not fp16's, so it does not excuse half accumulation.
    let tight = Tolerance {
        rtol: 1e-7,
        atol: 0.0,
    };
    let c = compare_f32(tight, &got, &want, rows);
    assert!(!c.passed(), "{}", c.describe());
    assert!(
        c.describe().contains("rounding noise of f32"),
        "{}",
        c.describe()
    );
}

// ---------------------------------------------------------------------------------------
// Reductions that drop elements.

#[test]
fn a_row_sum_that_drops_the_tail_element_fails() {
    // A vectorised row sum whose tail loop is missing: the last element of each row is
    // never added. The output, one value per row, has a flat length (`rows`): its scale
    // is the whole buffer's RMS (about sqrt(cols)), and the dropped element of order one
    // is far above rtol of it.
    let (rows, cols) = (512, 4097);
    let mut rng = StdRng::seed_from_u64(21);
    let x = normals(&mut rng, rows * cols, 0.0, 1.0);
    let want: Vec<f32> = x.chunks(cols).map(|r| r.iter().sum()).collect();
    let got: Vec<f32> = x
        .chunks(cols)
        .map(|r| block_sum(&r[..cols - 1], |v| v))
        .collect();
    let c = compare("y", DType::F32, F32_TOL, &bytes(&got), &bytes(&want), None);
    println!("{}", c.describe());
    assert!(!c.passed());
    assert!(c.failing as usize > rows * 9 / 10, "{}", c.describe());
    assert_eq!(
        c.first_bad.as_ref().unwrap().allowance.unwrap().scale_of,
        ScaleOf::Buffer
    );
    assert!(c.describe().contains("buffer rms"), "{}", c.describe());
    // And the same sum, only reordered, passes.
    let tree_sum: Vec<f32> = x.chunks(cols).map(|r| block_sum(r, |v| v)).collect();
    let c = compare(
        "y",
        DType::F32,
        F32_TOL,
        &bytes(&tree_sum),
        &bytes(&want),
        None,
    );
    assert!(c.passed(), "{}", c.describe());
}

#[test]
fn a_layer_norm_whose_statistics_skip_elements_fails() {
    // The mean and variance skip each row's last 4 elements (a vector loop without its
    // tail); every output is then slightly off, by far more than reordering gives.
    let (rows, cols) = (64, LN_COLS);
    let (x, w, b) = layer_norm_data(3, rows, cols);
    let mut want = vec![0.0f32; x.len()];
    layer_norm(LayerNorm::Serial, &x, &w, &b, &mut want);
    let mut got = vec![0.0f32; x.len()];
    for (xr, yr) in x.chunks(cols).zip(got.chunks_mut(cols)) {
        let seen = &xr[..cols - 4];
        let n = seen.len() as f32;
        let mean = block_sum(seen, |v| v) / n;
        let var = block_sum(seen, |v| (v - mean) * (v - mean)) / n;
        let rstd = 1.0 / (var + EPS).sqrt();
        for c in 0..cols {
            yr[c] = (xr[c] - mean) * rstd * w[c] + b[c];
        }
    }
    let c = compare_f32(F32_TOL, &got, &want, rows);
    println!("{}", c.describe());
    assert!(!c.passed());
    assert!(c.failing > 1000, "{}", c.describe());
}

// ---------------------------------------------------------------------------------------
// Wrong by a modest amount, wrong where everything is small, NaN.

#[test]
fn one_element_wrong_by_one_percent_fails_and_is_located_with_its_scale() {
    let (rows, cols) = (64, LN_COLS);
    let (x, w, b) = layer_norm_data(7, rows, cols);
    let mut want = vec![0.0f32; x.len()];
    layer_norm(LayerNorm::Serial, &x, &w, &b, &mut want);
    let mut got = vec![0.0f32; x.len()];
    layer_norm(LayerNorm::TwoPassTree, &x, &w, &b, &mut got);
    // An output of order one in row 37, wrong by 1e-2 of its value.
    let row = 37;
    let col = (0..cols)
        .find(|c| (0.8..1.2).contains(&want[row * cols + c].abs()))
        .unwrap();
    let i = row * cols + col;
    got[i] = want[i] * 1.01;
    let c = compare_f32(F32_TOL, &got, &want, rows);
    println!("{}", c.describe());
    assert_eq!(c.failing, 1, "{}", c.describe());
    let bad = c.first_bad.as_ref().unwrap();
    assert_eq!(bad.index, i as u64);
    assert_eq!(
        bad.coords,
        vec![("rows".into(), row as u64), ("cols".into(), col as u64)]
    );
    let a = bad.allowance.unwrap();
    // The row's RMS (about 2.2 with this bias) is above the element's ~1: it is the scale.
    assert_eq!(a.scale_of, ScaleOf::Row);
    assert!((1.5..3.5).contains(&a.rms), "{a:?}");
    assert!(((a.allowed - (1e-5 + 1e-4 * a.rms)) / a.allowed).abs() < 1e-12);
    let text = c.describe();
    assert!(
        text.contains(&format!(
            "1 of {} elements fail; first at index {i} (rows={row}, cols={col})",
            rows * cols
        )),
        "{text}"
    );
    assert!(
        text.contains("> allowed") && text.contains("x row rms"),
        "{text}"
    );
}

#[test]
fn an_all_small_output_wrong_by_half_fails() {
    // Every output of order 1e-3: the row scale is small too, so a 50% error is far
    // outside it (the RMS does not borrow a scale the buffer does not have).
    let (rows, cols) = (64, 1024);
    let mut rng = StdRng::seed_from_u64(9);
    let want = normals(&mut rng, rows * cols, 0.0, 1e-3);
    let got: Vec<f32> = want.iter().map(|v| v * 1.5).collect();
    let c = compare_f32(F32_TOL, &got, &want, rows);
    println!("{}", c.describe());
    assert!(
        c.failing as usize > rows * cols * 9 / 10,
        "{}",
        c.describe()
    );
    // Wrong by half in one row only: that row fails, judged by its own small scale,
    // even when the other rows are of order one.
    let mut mixed = normals(&mut rng, rows * cols, 0.0, 1.0);
    mixed[5 * cols..6 * cols].copy_from_slice(&want[5 * cols..6 * cols]);
    let mut got = mixed.clone();
    for v in &mut got[5 * cols..6 * cols] {
        *v *= 1.5;
    }
    let c = compare_f32(F32_TOL, &got, &mixed, rows);
    assert!(c.failing as usize > cols * 9 / 10, "{}", c.describe());
    assert_eq!(c.first_bad.as_ref().unwrap().coords[0], ("rows".into(), 5));
}

#[test]
fn nan_and_inf_never_pass() {
    let (rows, cols) = (8, 512);
    let mut rng = StdRng::seed_from_u64(13);
    let want = normals(&mut rng, rows * cols, 0.0, 1.0);
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut got = want.clone();
        got[1000] = bad;
        let c = compare_f32(F32_TOL, &got, &want, rows);
        assert_eq!((c.failing, c.non_finite), (1, 1), "{}", c.describe());
        assert!(
            c.describe().contains("NaN and Inf never pass"),
            "{}",
            c.describe()
        );
        assert_eq!(c.max_abs_error, f64::INFINITY);
        // A huge tolerance changes nothing.
        let loose = Tolerance {
            rtol: 1e30,
            atol: 1e30,
        };
        assert_eq!(compare_f32(loose, &got, &want, rows).failing, 1);
    }
    // A reference NaN fails every candidate too, even an identical one.
    let mut reference = want.clone();
    reference[7] = f32::NAN;
    let c = compare_f32(F32_TOL, &reference, &reference, rows);
    assert_eq!(c.failing, 1);
    // And a NaN in the reference does not make its row's scale NaN for the others.
    assert!(c.max_error_ratio.is_finite());
}

#[test]
fn reports_written_before_the_row_rule_still_read() {
    // A comparison as an older worker or the evaluation cache wrote it: no allowance, no
    // ratio, no worst element.
    let old = r#"{"buffer":"y","dtype":"f32","elements":12,"tolerance":{"rtol":0.0001,"atol":1e-5},
        "failing":1,"non_finite":0,"max_abs_error":92.0,"max_rel_error":13.1,
        "first_bad":{"index":7,"coords":[["rows",1],["cols",3]],"got":99.0,"want":7.0,
        "neighbourhood":[[7,99.0,7.0]]}}"#;
    let c: OutputComparison = serde_json::from_str(old).unwrap();
    assert_eq!(c.max_error_ratio, 0.0);
    assert!(c.worst.is_none() && c.first_bad.as_ref().unwrap().allowance.is_none());
    assert_eq!(
        c.describe(),
        "y: 1 of 12 elements fail; first at index 7 (rows=1, cols=3): got 99, want 7"
    );
    // And a new one round-trips, non-finite values included.
    let mut got = vec![1.0f32; 12];
    got[3] = f32::NAN;
    let c = compare_f32(F32_TOL, &got, &[1.0; 12], 3);
    let back: OutputComparison = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back.describe(), c.describe());
    assert!(back.first_bad.unwrap().got.is_nan());
}

#[test]
fn shapes_give_rows_through_the_declared_length() {
    // `rows * cols` gives rows of `cols`; a flat `n` one group; what the engine's worker
    // passes is `buffer_dims` of the spec's length.
    let item = kopt_spec::spec::parse_item(
        "fn k(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, z: &mut CudaSlice<f32>, rows: u32, cols: u32);"
            .parse()
            .unwrap(),
    )
    .unwrap();
    let spec = kopt_spec::spec::parse_kernel(
        "reference = \"k.cu\", x: [rows * cols], y: [rows * cols], z: [rows + cols], grid = rows, block = 1, shapes = [{ rows: 4, cols: 8 }]"
            .parse()
            .unwrap(),
        &item,
    )
    .unwrap()
    .0;
    let args = spec.shape_args(&spec.shapes[0]);
    let len = |name: &str| &spec.buffers().find(|b| b.name == name).unwrap().len;
    let y = kopt_spec::shapes::buffer_dims(len("y"), &spec, &args).unwrap();
    assert_eq!(y, dims(4, 8));
    assert!(kopt_spec::shapes::buffer_dims(len("z"), &spec, &args).is_none());
    // Row 0 of order 100, row 1 of order 1e-3: the error 1e-3 at an element of row 1 is
    // judged by row 1's scale, not by the buffer's.
    let mut want = vec![100.0f32; 8];
    want.extend([1e-3f32; 8]);
    want.extend([1.0f32; 16]);
    let mut got = want.clone();
    got[9] += 1e-3;
    let c = compare_f32(F32_TOL, &got, &want, 4);
    assert_eq!(c.failing, 1, "{}", c.describe());
    // Declared flat, the same buffer is one group whose RMS (about 50) passes it: a flat
    // length gives the coarser judgement, which is why the rows come from the shape.
    let flat = compare("y", DType::F32, F32_TOL, &bytes(&got), &bytes(&want), None);
    assert!(flat.passed(), "{}", flat.describe());
}
