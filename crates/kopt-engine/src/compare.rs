//! The numeric fence's comparison: each element's error is judged against the scale of
//! the output around it (the RMS of the reference's row, or of the whole buffer when its
//! length is not a product) and against an estimate of the computation's own rounding
//! noise; NaN and Inf never pass; a failure is localised (first bad index, its
//! coordinates, both values, what it was allowed and why, the neighbourhood, and how many
//! elements fail).
//!
//! Why not element-wise `atol + rtol * |want|` alone: where an affine shift or a
//! subtraction cancels a value of order one down to near zero (a layer norm's bias, a
//! residual), the rounding of the terms that cancelled is still there, of the order of the
//! terms, not of the result. A correct fp32 layer norm that only reorders its reduction
//! differs from a serial reference by about 1e-5 at such elements (1.1e-5 at outputs near
//! 7e-4 was seen), more than `atol 1e-5 + rtol 1e-4 * |want|` allows there, in rows whose
//! outputs are of order one. The row's RMS is the size of the terms that cancelled.

use kopt_spec::capture::ToleranceRule;
use kopt_spec::spec::{DType, Tolerance};
use serde::{Deserialize, Serialize};

use crate::inputs::element;

/// The factor of the rounding-noise floor ([`kopt_spec::capture::NOISE_LAMBDA`]).
pub use kopt_spec::capture::NOISE_LAMBDA;

/// Which magnitude an element's relative tolerance multiplied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScaleOf {
    /// The element's own reference value, `|want|`: it is at least its row's RMS.
    Element,
    /// The RMS of the reference's row (the last dimension of the declared shape).
    Row,
    /// The RMS of the reference's whole buffer (its length is not a product).
    Buffer,
}

/// What one element was allowed, and why.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Allowance {
    /// `max(|want|, rms)`: what `rtol` multiplied.
    #[serde(with = "crate::jsonf")]
    pub scale: f64,
    pub scale_of: ScaleOf,
    /// The RMS of the reference's finite values in the element's row (or buffer).
    #[serde(with = "crate::jsonf")]
    pub rms: f64,
    /// The reduction length the noise floor assumed: the row's length (1 for a flat buffer).
    pub noise_len: u64,
    /// `NOISE_LAMBDA * u_acc * sqrt(noise_len) * rms + 2 * u_out * |want|`.
    #[serde(with = "crate::jsonf")]
    pub noise_floor: f64,
    /// `max(atol + rtol * scale, noise_floor)`: the largest `|got - want|` that passes.
    #[serde(with = "crate::jsonf")]
    pub allowed: f64,
}

impl Allowance {
    /// Whether the noise floor, not the tolerance, set `allowed`.
    pub fn noise_bound(&self, tol: Tolerance) -> bool {
        self.noise_floor > tol.atol + tol.rtol * self.scale
    }

    /// `allowed 1.1e-4 (rtol 1e-4 x row rms 0.98 + atol 1e-5)`, or where the noise floor
    /// is larger, `allowed 2.2e-5 (rounding noise of f32: 6 x 6.0e-8 x sqrt(4096) x row
    /// rms 0.98 + 2 x 6.0e-8 x |want|; rtol 1e-7 x row rms 0.98 + atol 0 gives 9.8e-8)`.
    pub fn explain(&self, tol: Tolerance, dtype: DType) -> String {
        let scale = match self.scale_of {
            ScaleOf::Element => format!("|want| {}", sig(self.scale)),
            ScaleOf::Row => format!("row rms {}", sig(self.rms)),
            ScaleOf::Buffer => format!("buffer rms {}", sig(self.rms)),
        };
        let tolerance = format!(
            "rtol {} x {scale} + atol {}",
            short(tol.rtol),
            short(tol.atol)
        );
        if !self.noise_bound(tol) {
            return format!("allowed {:.1e} ({tolerance})", self.allowed);
        }
        let (acc, out) = (dtype.accumulation_unit_roundoff(), dtype.unit_roundoff());
        let over = match self.scale_of {
            ScaleOf::Buffer => "buffer",
            _ => "row",
        };
        format!(
            "allowed {:.1e} (rounding noise of {dtype}: {NOISE_LAMBDA} x {acc:.1e} x sqrt({}) x {over} rms {} + 2 x {out:.1e} x |want|; {tolerance} gives {:.1e})",
            self.allowed,
            self.noise_len,
            sig(self.rms),
            tol.atol + tol.rtol * self.scale,
        )
    }
}

/// The rule for one output buffer: its tolerance, its dtype, and how its elements are
/// grouped into rows for the scale ([`ToleranceRule`], the launchers' shadow checks' too).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    pub tolerance: Tolerance,
    pub dtype: DType,
    /// Elements that share one RMS: the last dimension of the declared shape, or the
    /// whole buffer.
    pub row_len: usize,
    /// Whether the rows are declared (a product length) or the buffer is one flat group.
    pub declared_rows: bool,
    /// The rule's factors, as the device computes them.
    factors: ToleranceRule,
}

impl Rule {
    /// The rule for a buffer of `elements` whose declared shape is `dims` (see
    /// [`kopt_spec::shapes::buffer_dims`]): rows of the last dimension when the length is a
    /// product whose last factor divides it, else the whole buffer.
    pub fn new(
        dtype: DType,
        tolerance: Tolerance,
        elements: usize,
        dims: Option<&[(String, u64)]>,
    ) -> Rule {
        let factors = ToleranceRule::new(
            dtype,
            tolerance,
            elements,
            dims.and_then(|d| d.last()).map(|(_, len)| *len),
        );
        Rule {
            tolerance,
            dtype,
            row_len: factors.row_len as usize,
            declared_rows: factors.declared_rows,
            factors,
        }
    }

    /// The allowance of an element whose reference value is `want`, in a row of RMS `rms`.
    pub fn allowance(&self, want: f64, rms: f64) -> Allowance {
        self.row(rms).allowance(want)
    }

    /// The parts of the rule shared by a row of RMS `rms`.
    pub fn row(&self, rms: f64) -> RowRule {
        RowRule {
            rule: *self,
            rms,
            noise_len: if self.declared_rows {
                self.row_len as u64
            } else {
                1
            },
            noise_of_row: self.factors.noise_of_rms * rms,
        }
    }
}

/// [`Rule`] within one row: what its elements share.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowRule {
    rule: Rule,
    rms: f64,
    noise_len: u64,
    /// `NOISE_LAMBDA * u_acc * sqrt(noise_len) * rms`.
    noise_of_row: f64,
}

impl RowRule {
    /// `max(atol + rtol * max(|want|, rms), noise_of_row + 2 u_out |want|)`: the largest
    /// `|got - want|` that passes ([`ToleranceRule::allowed`]).
    #[inline]
    pub fn allowed(&self, want: f64) -> f64 {
        self.rule.factors.allowed(want, self.rms)
    }

    /// [`Self::allowed`] with its reasons.
    pub fn allowance(&self, want: f64) -> Allowance {
        let w = want.abs();
        let (scale, scale_of) = if w >= self.rms {
            (w, ScaleOf::Element)
        } else if self.rule.declared_rows {
            (self.rms, ScaleOf::Row)
        } else {
            (self.rms, ScaleOf::Buffer)
        };
        Allowance {
            scale,
            scale_of,
            rms: self.rms,
            noise_len: self.noise_len,
            noise_floor: self.noise_of_row + self.rule.factors.two_u_out * w,
            allowed: self.allowed(want),
        }
    }
}

/// Whether `got` passes against `want` with `allowed`: both finite and
/// `|got - want| <= allowed`. NaN and Inf never pass (a reference that is itself
/// non-finite fails every candidate, which the caller treats as a reference problem).
pub fn close(got: f64, want: f64, allowed: f64) -> bool {
    got.is_finite() && want.is_finite() && (got - want).abs() <= allowed
}

/// Elements decoded at a time: rows of any length (a flat buffer is one row) are read in
/// pieces of this many, so the comparison never holds more than two such pieces.
const PIECE: usize = 4096;

/// Elements `range` of a device-layout buffer, as `f64`, into `out`.
fn decode(dtype: DType, bytes: &[u8], range: std::ops::Range<usize>, out: &mut Vec<f64>) {
    let size = dtype.size();
    out.clear();
    let raw = bytes[range.start * size..range.end * size].chunks_exact(size);
    macro_rules! each {
        ($conv:expr) => {
            out.extend(raw.map(|b| $conv(b.try_into().unwrap())))
        };
    }
    match dtype {
        DType::F32 => each!(|b| f32::from_le_bytes(b) as f64),
        DType::F64 => each!(f64::from_le_bytes),
        DType::F16 => each!(|b| half::f16::from_le_bytes(b).to_f64()),
        DType::Bf16 => each!(|b| half::bf16::from_le_bytes(b).to_f64()),
        _ => out.extend((range.start..range.end).map(|i| element(dtype, bytes, i))),
    }
}

/// The RMS of the finite values among `want`'s elements `range`.
fn row_rms(
    dtype: DType,
    want: &[u8],
    range: std::ops::Range<usize>,
    scratch: &mut Vec<f64>,
) -> f64 {
    let (mut sum, mut count) = (0.0f64, 0usize);
    for start in range.clone().step_by(PIECE) {
        decode(dtype, want, start..(start + PIECE).min(range.end), scratch);
        for &w in scratch.iter().filter(|w| w.is_finite()) {
            sum += w * w;
            count += 1;
        }
    }
    if count == 0 {
        0.0
    } else {
        (sum / count as f64).sqrt()
    }
}

/// The first failing element, located.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BadElement {
    pub index: u64,
    /// Coordinates in the buffer's declared shape (`rows * cols` -> rows, cols), when
    /// its length is a product.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub coords: Vec<(String, u64)>,
    #[serde(with = "crate::jsonf")]
    pub got: f64,
    #[serde(with = "crate::jsonf")]
    pub want: f64,
    /// A few elements around it: (index, got, want).
    #[serde(with = "crate::jsonf::triples")]
    pub neighbourhood: Vec<(u64, f64, f64)>,
    /// What it was allowed (absent in reports written before the rule stated it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowance: Option<Allowance>,
}

/// The element with the largest `|got - want| / allowed` (where every element passes, the
/// one that came closest to failing), located.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Worst {
    pub index: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub coords: Vec<(String, u64)>,
    #[serde(with = "crate::jsonf")]
    pub got: f64,
    #[serde(with = "crate::jsonf")]
    pub want: f64,
    pub allowance: Allowance,
}

/// One output buffer compared with the reference's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputComparison {
    pub buffer: String,
    pub dtype: DType,
    pub elements: u64,
    pub tolerance: Tolerance,
    pub failing: u64,
    /// Elements that are NaN or Inf in the candidate where the reference is finite.
    pub non_finite: u64,
    #[serde(with = "crate::jsonf")]
    pub max_abs_error: f64,
    #[serde(with = "crate::jsonf")]
    pub max_rel_error: f64,
    /// The largest `|got - want| / allowed` over the elements where both are finite: at
    /// most 1 when every element passes, so it says how close a pass came to failing.
    /// (0 in reports written before the rule recorded it.)
    #[serde(default, with = "crate::jsonf")]
    pub max_error_ratio: f64,
    /// Where that largest ratio is, with its allowance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst: Option<Worst>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_bad: Option<BadElement>,
}

fn coords_text(coords: &[(String, u64)]) -> String {
    if coords.is_empty() {
        String::new()
    } else {
        format!(
            " ({})",
            coords
                .iter()
                .map(|(n, v)| format!("{n}={v}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

impl OutputComparison {
    pub fn passed(&self) -> bool {
        self.failing == 0
    }

    /// One line. A failure: `y: 12 of 16777216 elements fail; first at index 4097 (rows=1,
    /// cols=1): got 0.0007, want 0.00072, |diff| 2.0e-5 > allowed 1.1e-4 (rtol 1e-4 x row
    /// rms 0.98 + atol 1e-5)`. A pass: `y: ok (max abs 1.1e-5, max rel 1.6e-2; largest
    /// |diff|/allowed 0.11 at index 4097 (rows=1, cols=1): |diff| 1.1e-5 <= allowed 1.0e-4
    /// (rtol 1e-4 x row rms 0.98 + atol 1e-5))`.
    pub fn describe(&self) -> String {
        if self.passed() {
            let mut s = format!(
                "{}: ok (max abs {:.2e}, max rel {:.2e}",
                self.buffer, self.max_abs_error, self.max_rel_error
            );
            if let Some(c) = self.worst.as_ref().filter(|_| self.max_error_ratio > 0.0) {
                s.push_str(&format!(
                    "; largest |diff|/allowed {} at index {}{}: |diff| {:.1e} <= {}",
                    sig(self.max_error_ratio),
                    c.index,
                    coords_text(&c.coords),
                    (c.got - c.want).abs(),
                    c.allowance.explain(self.tolerance, self.dtype)
                ));
            }
            s.push(')');
            return s;
        }
        let mut s = format!(
            "{}: {} of {} elements fail",
            self.buffer, self.failing, self.elements
        );
        if self.non_finite > 0 {
            s.push_str(&format!(" ({} NaN/Inf)", self.non_finite));
        }
        if let Some(b) = &self.first_bad {
            s.push_str(&format!(
                "; first at index {}{}: got {}, want {}",
                b.index,
                coords_text(&b.coords),
                value(self.dtype, b.got),
                value(self.dtype, b.want)
            ));
            if !b.got.is_finite() || !b.want.is_finite() {
                s.push_str(" (NaN and Inf never pass)");
            } else if let Some(a) = &b.allowance {
                s.push_str(&format!(
                    ", |diff| {:.1e} > {}",
                    (b.got - b.want).abs(),
                    a.explain(self.tolerance, self.dtype)
                ));
            }
        }
        s
    }
}

/// Compares two device-layout buffers of `dtype`: the numeric fence for one output.
///
/// The rule, exactly. Let `want` be the reference's buffer and `got` the candidate's,
/// grouped into rows: the last dimension of the declared shape `dims` (a length
/// `rows * cols` gives rows of `cols`), or, when the length is not a product, the whole
/// buffer as one row (a flat length declares no structure; a window of invented size would
/// split and join rows at arbitrary points, and a user who wants a row-local scale writes
/// the length as a product). For each row, `rms` is the root mean square of the
/// reference's finite values in it (never of the candidate's: a candidate cannot widen its
/// own tolerance). Element `i` then passes when `got[i]` and `want[i]` are both finite and
///
/// ```text
/// |got[i] - want[i]| <= max(atol + rtol * max(|want[i]|, rms),
///                           NOISE_LAMBDA * u_acc * sqrt(n) * rms + 2 * u_out * |want[i]|)
/// ```
///
/// where `atol` and `rtol` are `tol`'s, and the second term is an estimate (not a
/// measurement) of the computation's own rounding noise: `n` is the row's length for
/// declared rows (1 for a flat buffer, which declares no reduction), `u_acc` the unit
/// roundoff of the arithmetic ([`DType::accumulation_unit_roundoff`]: fp32's for fp32, fp16 and
/// bf16 outputs, fp64's for fp64) and `u_out` that of the output type ([`DType::unit_roundoff`]).
/// A reduction of `n` terms reordered (a tree, warp shuffles, Welford, one-pass variance)
/// differs from a serial one by up to about `NOISE_LAMBDA * sqrt(n) * u_acc` of the size of
/// its terms, and two correct roundings to the output type by one unit in the last place.
/// For fp32 with the default tolerance, the tolerance is the larger term in rows of up to
/// about 78,000 elements; the floor matters where a tolerance is tighter than fp32's
/// reduction noise. Integers (rtol and atol 0, no floor) compare exactly.
///
/// At an element at least as large as its row's RMS this is the element-wise rule
/// `atol + rtol * |want|`; below, the scale stays the row's, so a value that cancelled to
/// near zero is judged against the size of what cancelled, while an all-small buffer is
/// still judged against its own small scale.
pub fn compare(
    buffer: &str,
    dtype: DType,
    tol: Tolerance,
    got: &[u8],
    want: &[u8],
    dims: Option<&[(String, u64)]>,
) -> OutputComparison {
    let n = want.len() / dtype.size();
    let mut c = OutputComparison {
        buffer: buffer.to_string(),
        dtype,
        elements: n as u64,
        tolerance: tol,
        failing: 0,
        non_finite: 0,
        max_abs_error: 0.0,
        max_rel_error: 0.0,
        max_error_ratio: 0.0,
        worst: None,
        first_bad: None,
    };
    if got.len() != want.len() {
        c.failing = n as u64;
        return c;
    }
    let rule = Rule::new(dtype, tol, n, dims);
    let locate = |i: usize| {
        dims.map(|d| kopt_spec::shapes::coordinates(i as u64, d))
            .unwrap_or_default()
    };
    // Whole rows per piece of work (a row's RMS is the row's), pieces in order, merged in
    // order: the result is the serial one exactly, only sooner on large outputs.
    let rows = n.div_ceil(rule.row_len.max(1));
    let threads = if n < PARALLEL_FROM {
        1
    } else {
        std::thread::available_parallelism()
            .map(|t| t.get())
            .unwrap_or(1)
            .clamp(1, 16)
            .min(rows)
    };
    let rows_each = rows.div_ceil(threads.max(1));
    let ranges: Vec<std::ops::Range<usize>> = (0..threads)
        .map(|t| {
            let lo = (t * rows_each * rule.row_len).min(n);
            let hi = ((t + 1) * rows_each * rule.row_len).min(n);
            lo..hi
        })
        .filter(|r| !r.is_empty())
        .collect();
    let partials: Vec<Partial> = if ranges.len() <= 1 {
        vec![compare_rows(dtype, &rule, got, want, 0..n)]
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = ranges
                .iter()
                .map(|r| {
                    let (rule, r) = (&rule, r.clone());
                    scope.spawn(move || compare_rows(dtype, rule, got, want, r))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a comparison thread does not panic"))
                .collect()
        })
    };
    let mut worst: Option<(usize, f64, f64, Allowance)> = None;
    let mut first_bad: Option<(usize, f64, f64, Allowance)> = None;
    for p in partials {
        c.failing += p.failing;
        c.non_finite += p.non_finite;
        c.max_abs_error = c.max_abs_error.max(p.max_abs_error);
        c.max_rel_error = c.max_rel_error.max(p.max_rel_error);
        // As the serial scan: a later piece's worst replaces only a strictly larger ratio.
        if p.worst.is_some() && (worst.is_none() || p.max_error_ratio > c.max_error_ratio) {
            worst = p.worst;
        }
        c.max_error_ratio = c.max_error_ratio.max(p.max_error_ratio);
        if first_bad.is_none() {
            first_bad = p.first_bad;
        }
    }
    c.first_bad = first_bad.map(|(i, g, w, allowance)| {
        let lo = i.saturating_sub(2);
        let hi = (i + 3).min(n);
        BadElement {
            index: i as u64,
            coords: locate(i),
            got: g,
            want: w,
            neighbourhood: (lo..hi)
                .map(|j| (j as u64, element(dtype, got, j), element(dtype, want, j)))
                .collect(),
            allowance: Some(allowance),
        }
    });
    c.worst = worst.map(|(i, got, want, allowance)| Worst {
        index: i as u64,
        coords: locate(i),
        got,
        want,
        allowance,
    });
    c
}

/// Outputs from this many elements are compared on several threads.
const PARALLEL_FROM: usize = 1 << 20;

/// What [`compare_rows`] found in its rows.
struct Partial {
    failing: u64,
    non_finite: u64,
    max_abs_error: f64,
    max_rel_error: f64,
    max_error_ratio: f64,
    /// (index, got, want, allowance) at the first largest ratio.
    worst: Option<(usize, f64, f64, Allowance)>,
    /// The first failing element.
    first_bad: Option<(usize, f64, f64, Allowance)>,
}

/// [`compare`]'s scan over `range` (whole rows of `rule`).
fn compare_rows(
    dtype: DType,
    rule: &Rule,
    got: &[u8],
    want: &[u8],
    range: std::ops::Range<usize>,
) -> Partial {
    let mut p = Partial {
        failing: 0,
        non_finite: 0,
        max_abs_error: 0.0,
        max_rel_error: 0.0,
        max_error_ratio: 0.0,
        worst: None,
        first_bad: None,
    };
    let (mut gs, mut ws) = (Vec::with_capacity(PIECE), Vec::with_capacity(PIECE));
    let end_all = range.end;
    for row_start in range.step_by(rule.row_len.max(1)) {
        let row_end = (row_start + rule.row_len).min(end_all);
        let row = rule.row(row_rms(dtype, want, row_start..row_end, &mut ws));
        for start in (row_start..row_end).step_by(PIECE) {
            let end = (start + PIECE).min(row_end);
            decode(dtype, got, start..end, &mut gs);
            decode(dtype, want, start..end, &mut ws);
            for (k, (&g, &w)) in gs.iter().zip(&ws).enumerate() {
                let i = start + k;
                let allowed = row.allowed(w);
                let finite = g.is_finite() && w.is_finite();
                let abs = (g - w).abs();
                if finite {
                    p.max_abs_error = p.max_abs_error.max(abs);
                    if w != 0.0 {
                        p.max_rel_error = p.max_rel_error.max(abs / w.abs());
                    }
                    let ratio = if abs == 0.0 {
                        0.0
                    } else if allowed > 0.0 {
                        abs / allowed
                    } else {
                        f64::INFINITY
                    };
                    if ratio > p.max_error_ratio || p.worst.is_none() {
                        p.max_error_ratio = p.max_error_ratio.max(ratio);
                        p.worst = Some((i, g, w, row.allowance(w)));
                    }
                    if abs <= allowed {
                        continue;
                    }
                }
                p.failing += 1;
                if !g.is_finite() && w.is_finite() {
                    p.non_finite += 1;
                }
                if !finite {
                    p.max_abs_error = f64::INFINITY;
                }
                if p.first_bad.is_none() {
                    p.first_bad = Some((i, g, w, row.allowance(w)));
                }
            }
        }
    }
    p
}

/// A value of the buffer as its dtype writes it shortest (`0.0017`, not the `f64` widening
/// of an `f32`, `0.0017000000225380063`).
fn value(dtype: DType, x: f64) -> String {
    match dtype {
        DType::F32 | DType::F16 | DType::Bf16 => format!("{}", x as f32),
        _ => format!("{x}"),
    }
}

/// Two significant digits, plainly where that reads well: `0.98`, `1.5`, `64`, `7.2e-4`.
fn sig(x: f64) -> String {
    let a = x.abs();
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    if (1e-2..1e4).contains(&a) {
        let decimals = (1 - a.log10().floor() as i32).max(0) as usize;
        format!("{x:.decimals$}")
    } else {
        format!("{x:.1e}")
    }
}

/// A tolerance as it would be written: `1e-4`, `2.5e-3`, `0`.
fn short(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else {
        format!("{x:e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    const TOL: Tolerance = Tolerance {
        rtol: 1e-4,
        atol: 1e-5,
    };

    /// An element judged alone (a row of one, its RMS its own magnitude): the tolerance
    /// is the element-wise `atol + rtol * |want|`.
    fn alone(got: f64, want: f64) -> bool {
        let rule = Rule::new(DType::F32, TOL, 1, None);
        close(got, want, rule.allowance(want, want.abs()).allowed)
    }

    #[test]
    fn the_shadow_checks_rule_is_the_fences() {
        // The launcher's shadow checks judge on the device by `ToleranceRule`, the fence on
        // the host by `Rule`: one rule, whatever the dtype, tolerance and row layout.
        let item = kopt_spec::spec::parse_item(
            "pub fn k(s: &CudaStream, a: &mut CudaSlice<f32>, b: &mut CudaSlice<f16>, c: &mut CudaSlice<bf16>, d: &mut CudaSlice<f64>, e: &mut CudaSlice<i32>, rows: u32, cols: u32);"
                .parse()
                .unwrap(),
        )
        .unwrap();
        let spec = kopt_spec::spec::parse_kernel(
            "reference = \"k.cu\", a: [rows * cols], b: [rows * cols] tol(rtol = 2e-2), c: [rows + cols], d: [cols], e: [rows * cols], grid = rows, block = 256, shapes = [{ rows: 3, cols: 500 }]"
                .parse()
                .unwrap(),
            &item,
        )
        .unwrap()
        .0;
        let args = [3, 500];
        for b in spec.buffers() {
            let n = match b.name.as_str() {
                "c" => 503,
                "d" => 500,
                _ => 1500,
            };
            let dims = kopt_spec::shapes::buffer_dims(&b.len, &spec, &args);
            let fence = Rule::new(b.dtype, b.effective_tolerance(&spec), n, dims.as_deref());
            let shadow = kopt_spec::capture::ToleranceRule::for_buffer(&spec, b, n, &args);
            assert_eq!(shadow.row_len, fence.row_len as u64, "{}", b.name);
            for (want, rms) in [(0.0, 1.0), (3.0, 1.0), (-1e-3, 2e-3), (7.5, 100.0)] {
                let (x, y) = (shadow.allowed(want, rms), fence.row(rms).allowed(want));
                assert!(
                    (x - y).abs() <= 1e-15 * y.abs().max(1.0),
                    "{}: {x} against {y}",
                    b.name
                );
            }
        }
    }

    #[test]
    fn tolerance_is_combined() {
        assert!(alone(1.0 + 5e-5, 1.0));
        assert!(!alone(1.0 + 2e-4, 1.0));
        assert!(alone(5e-6, 0.0), "atol covers values near zero");
        assert!(!alone(f64::NAN, f64::NAN), "NaN never passes");
        assert!(!alone(f64::INFINITY, f64::INFINITY), "Inf never passes");
    }

    #[test]
    fn failures_are_localised() {
        let want: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let mut got = want.clone();
        got[7] = 99.0;
        got[9] = f32::NAN;
        let dims = vec![("rows".to_string(), 3u64), ("cols".to_string(), 4u64)];
        let c = compare("y", DType::F32, TOL, &f32s(&got), &f32s(&want), Some(&dims));
        assert_eq!(c.failing, 2);
        assert_eq!(c.non_finite, 1);
        let b = c.first_bad.as_ref().unwrap();
        assert_eq!((b.index, b.got, b.want), (7, 99.0, 7.0));
        assert_eq!(b.coords, vec![("rows".into(), 1), ("cols".into(), 3)]);
        assert_eq!(b.neighbourhood.len(), 5);
        assert!(c.describe().contains("2 of 12 elements fail (1 NaN/Inf); first at index 7 (rows=1, cols=3): got 99, want 7"), "{}", c.describe());
    }

    #[test]
    fn a_large_output_compared_on_many_threads_reads_as_the_serial_scan() {
        // 4096 rows of 1024 (4M elements, above PARALLEL_FROM): rows are split between
        // threads; the earliest failure, the first largest ratio and the counts must be
        // those of one scan in order, whichever thread saw them.
        let (rows, cols) = (4096usize, 1024usize);
        // Every row alike, so that two elements of one column have the same allowance.
        let want: Vec<f32> = (0..rows * cols)
            .map(|i| ((i % cols % 97) as f32) * 0.5 - 20.0)
            .collect();
        let mut got = want.clone();
        for (i, off) in [
            (3_000_000, 5.0f32),
            (300_123, 3.0),
            (3_900_096, 5.0),
            (10, f32::NAN),
        ] {
            got[i] += off;
        }
        let dims = vec![
            ("rows".to_string(), rows as u64),
            ("cols".to_string(), cols as u64),
        ];
        let c = compare("y", DType::F32, TOL, &f32s(&got), &f32s(&want), Some(&dims));
        assert_eq!(c.elements, (rows * cols) as u64);
        assert_eq!((c.failing, c.non_finite), (4, 1));
        assert_eq!(c.first_bad.as_ref().unwrap().index, 10);
        let worst = c.worst.as_ref().unwrap();
        // Two elements share the largest error; the earlier one is the worst.
        assert_eq!(worst.index, 3_000_000);
        assert!(c.max_abs_error.is_infinite());
        let one_row = compare(
            "y",
            DType::F32,
            TOL,
            &f32s(&got[3_000_000 - 3_000_000 % cols..][..cols]),
            &f32s(&want[3_000_000 - 3_000_000 % cols..][..cols]),
            Some(&[
                ("rows".to_string(), 1u64),
                ("cols".to_string(), cols as u64),
            ]),
        );
        assert_eq!(c.max_error_ratio, one_row.max_error_ratio);
    }

    #[test]
    fn verdicts_state_the_scale_next_to_the_difference() {
        // Two rows of order one; in row 1 an output that cancelled to 7e-4.
        let dims = vec![("rows".to_string(), 2u64), ("cols".to_string(), 4u64)];
        let want = [1.0, -1.0, 1.0, -1.0, 0.98, -0.98, 7e-4, 0.98];
        let case = |what: &str, got: &[f32], tol: Tolerance, dims: Option<&[(String, u64)]>| {
            let c = compare("y", DType::F32, tol, &f32s(got), &f32s(&want), dims);
            format!("{what}:\n{}\n", c.describe())
        };
        let mut near_zero_off = want;
        near_zero_off[6] += 1.1e-5;
        let mut near_zero_wrong = want;
        near_zero_wrong[6] += 1e-3;
        let mut large_wrong = want;
        large_wrong[0] += 1e-3;
        let mut nan = want;
        nan[3] = f32::NAN;
        let tight = Tolerance {
            rtol: 1e-9,
            atol: 0.0,
        };
        let text = [
            case(
                "near zero, off by rounding: passes on the row's scale",
                &near_zero_off,
                TOL,
                Some(&dims),
            ),
            case("near zero, wrong", &near_zero_wrong, TOL, Some(&dims)),
            case(
                "at or above the row's RMS: its own value",
                &large_wrong,
                TOL,
                Some(&dims),
            ),
            case(
                "a flat buffer: the buffer's RMS",
                &near_zero_wrong,
                TOL,
                None,
            ),
            case(
                "a tolerance below fp32's rounding: the noise floor",
                &near_zero_wrong,
                tight,
                Some(&dims),
            ),
            case("NaN", &nan, TOL, Some(&dims)),
            case("identical", &want, TOL, Some(&dims)),
        ]
        .concat();
        insta::assert_snapshot!("describe", text);
    }

    #[test]
    fn rows_come_from_the_last_dimension_when_it_divides_the_length() {
        let d = |cols: u64| vec![("rows".to_string(), 3u64), ("cols".to_string(), cols)];
        let r = Rule::new(DType::F32, TOL, 12, Some(&d(4)));
        assert_eq!((r.row_len, r.declared_rows), (4, true));
        // A shape that does not describe the buffer: one group, as for a flat length.
        let r = Rule::new(DType::F32, TOL, 12, Some(&d(5)));
        assert_eq!((r.row_len, r.declared_rows), (12, false));
        let r = Rule::new(DType::F32, TOL, 12, None);
        assert_eq!((r.row_len, r.declared_rows), (12, false));
        assert_eq!(r.allowance(0.1, 1.0).noise_len, 1);
    }

    #[test]
    fn the_allowance_is_the_larger_of_the_tolerance_and_the_noise_floor() {
        let rule = Rule::new(DType::F32, TOL, 4096, Some(&[("cols".into(), 4096)]));
        // Below the row's RMS the row's scale; at or above it, the element's.
        let a = rule.allowance(1e-3, 0.5);
        assert_eq!((a.scale, a.scale_of), (0.5, ScaleOf::Row));
        assert_eq!(a.allowed, 1e-5 + 1e-4 * 0.5);
        let a = rule.allowance(-3.0, 0.5);
        assert_eq!((a.scale, a.scale_of), (3.0, ScaleOf::Element));
        // The floor: 6 x 2^-24 x sqrt(4096) x rms + 2 x 2^-24 x |want|.
        let u = 2f64.powi(-24);
        assert_eq!(a.noise_floor, 6.0 * u * 64.0 * 0.5 + 2.0 * u * 3.0);
        assert!(!a.noise_bound(TOL));
        let zero = Tolerance {
            rtol: 0.0,
            atol: 0.0,
        };
        let a =
            Rule::new(DType::F32, zero, 4096, Some(&[("cols".into(), 4096)])).allowance(1.0, 1.0);
        assert_eq!(a.allowed, a.noise_floor);
        // fp16 outputs: the arithmetic's roundoff (fp32) for the reduction, fp16's for the
        // output's own rounding.
        let a =
            Rule::new(DType::F16, zero, 4096, Some(&[("cols".into(), 4096)])).allowance(1.0, 1.0);
        assert_eq!(a.noise_floor, 6.0 * u * 64.0 + 2.0 * 2f64.powi(-11));
        // Integers: nothing.
        let a = Rule::new(DType::I32, zero, 4, None).allowance(7.0, 7.0);
        assert_eq!(a.allowed, 0.0);
    }

    #[test]
    fn identical_buffers_pass_with_zero_error() {
        let v = f32s(&[1.0, -2.0, 3.5]);
        let c = compare("y", DType::F32, TOL, &v, &v, None);
        assert!(c.passed());
        assert_eq!(c.max_abs_error, 0.0);
    }

    #[test]
    fn non_finite_values_survive_json() {
        let want = f32s(&[1.0, 2.0]);
        let got = f32s(&[f32::NAN, f32::INFINITY]);
        let c = compare("y", DType::F32, TOL, &got, &want, None);
        let back: OutputComparison =
            serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert!(back.first_bad.unwrap().got.is_nan());
        assert_eq!(back.max_abs_error, f64::INFINITY);
    }

    #[test]
    fn integers_compare_exactly() {
        let a: Vec<u8> = [1i32, 2, 3].iter().flat_map(|x| x.to_le_bytes()).collect();
        let b: Vec<u8> = [1i32, 2, 4].iter().flat_map(|x| x.to_le_bytes()).collect();
        let c = compare(
            "idx",
            DType::I32,
            DType::I32.default_tolerance(),
            &a,
            &b,
            None,
        );
        assert_eq!(c.failing, 1);
    }
}
