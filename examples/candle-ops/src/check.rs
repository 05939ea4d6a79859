//! Comparison of two results by the rule kopt's verification applies to an output (the
//! tolerance the kernel's annotation declares for it): every element within
//! `atol + rtol * max(|want|, RMS of want's row)`, where a row is the last dimension, and
//! no NaN or infinity on either side unless both agree on it.

use candle_core::{DType, Result, Tensor, D};

/// kopt's tolerance for a kernel's output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

impl Tolerance {
    /// The tolerance `kernel`'s annotation gives its output buffer `name`.
    pub fn of(kernel: &kopt::Kernel, name: &str) -> Tolerance {
        let spec = kernel.spec();
        let buffer = spec
            .buffers()
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("{} has no buffer `{name}`", spec.name));
        let t = buffer.effective_tolerance(spec);
        Tolerance {
            rtol: t.rtol,
            atol: t.atol,
        }
    }
}

/// Where two results differ most, measured against the allowance.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// The largest `|got - want| / allowance` over all elements: at most 1 passes.
    pub worst_ratio: f64,
    pub worst_index: usize,
    pub got: f32,
    pub want: f32,
    /// Elements where one side is not finite and the other differs from it.
    pub non_finite: usize,
    pub elements: usize,
}

impl Comparison {
    pub fn passed(&self) -> bool {
        self.non_finite == 0 && self.worst_ratio <= 1.0
    }
}

impl std::fmt::Display for Comparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} elements, worst at {} (got {:e}, want {:e}): {:.3} of the allowance, {} non-finite mismatches",
            self.elements, self.worst_index, self.got, self.want, self.worst_ratio, self.non_finite
        )
    }
}

fn host_f32(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

/// Compares `got` with `want` (same shape) under `tol`.
pub fn compare(got: &Tensor, want: &Tensor, tol: Tolerance) -> Result<Comparison> {
    if got.shape() != want.shape() {
        candle_core::bail!(
            "shapes differ: {:?} against {:?}",
            got.shape(),
            want.shape()
        )
    }
    let row = want.dim(D::Minus1)?.max(1);
    let (g, w) = (host_f32(got)?, host_f32(want)?);
    let mut out = Comparison {
        worst_ratio: 0.0,
        worst_index: 0,
        got: 0.0,
        want: 0.0,
        non_finite: 0,
        elements: w.len(),
    };
    for (r, (gr, wr)) in g.chunks(row).zip(w.chunks(row)).enumerate() {
        let finite: Vec<f64> = wr
            .iter()
            .filter(|v| v.is_finite())
            .map(|&v| f64::from(v))
            .collect();
        let rms = (finite.iter().map(|v| v * v).sum::<f64>() / finite.len().max(1) as f64).sqrt();
        for (i, (&gv, &wv)) in gr.iter().zip(wr).enumerate() {
            if !(gv.is_finite() && wv.is_finite()) {
                let same = gv == wv || (gv.is_nan() && wv.is_nan());
                out.non_finite += usize::from(!same);
                continue;
            }
            let allowance = tol.atol + tol.rtol * f64::from(wv.abs()).max(rms);
            let ratio = (f64::from(gv) - f64::from(wv)).abs() / allowance;
            if ratio > out.worst_ratio {
                out.worst_ratio = ratio;
                out.worst_index = r * row + i;
                out.got = gv;
                out.want = wv;
            }
        }
    }
    Ok(out)
}
