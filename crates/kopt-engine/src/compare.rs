//! The numeric fence's comparison: element-wise, combined tolerance, NaN and Inf never
//! pass, and a failure is localised (first bad index, its coordinates, both values, the
//! neighbourhood, and how many elements fail).

use kopt_spec::spec::{DType, Tolerance};
use serde::{Deserialize, Serialize};

use crate::inputs::element;

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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_bad: Option<BadElement>,
}

impl OutputComparison {
    pub fn passed(&self) -> bool {
        self.failing == 0
    }

    /// One line: `y: 12 of 16777216 elements fail; first at 4097 (rows=1, cols=1): got 0, want 0.0012`.
    pub fn describe(&self) -> String {
        if self.passed() {
            return format!(
                "{}: ok (max abs {:.2e}, max rel {:.2e})",
                self.buffer, self.max_abs_error, self.max_rel_error
            );
        }
        let mut s = format!(
            "{}: {} of {} elements fail",
            self.buffer, self.failing, self.elements
        );
        if self.non_finite > 0 {
            s.push_str(&format!(" ({} NaN/Inf)", self.non_finite));
        }
        if let Some(b) = &self.first_bad {
            let coords = if b.coords.is_empty() {
                String::new()
            } else {
                format!(
                    " ({})",
                    b.coords
                        .iter()
                        .map(|(n, v)| format!("{n}={v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            s.push_str(&format!(
                "; first at index {}{coords}: got {}, want {}",
                b.index, b.got, b.want
            ));
        }
        s
    }
}

/// Whether `got` is within tolerance of `want`: `|got - want| <= atol + rtol * |want|`,
/// with NaN and Inf never passing (a reference that is itself non-finite matches only
/// the identical bit pattern, which the caller treats as a reference problem).
pub fn close(got: f64, want: f64, tol: Tolerance) -> bool {
    if !got.is_finite() || !want.is_finite() {
        return false;
    }
    (got - want).abs() <= tol.atol + tol.rtol * want.abs()
}

/// Compares two device-layout buffers of `dtype`.
pub fn compare(
    buffer: &str,
    dtype: DType,
    tol: Tolerance,
    got: &[u8],
    want: &[u8],
    dims: Option<&[(String, u64)]>,
) -> OutputComparison {
    let n = (want.len() / dtype.size()) as u64;
    let mut c = OutputComparison {
        buffer: buffer.to_string(),
        dtype,
        elements: n,
        tolerance: tol,
        failing: 0,
        non_finite: 0,
        max_abs_error: 0.0,
        max_rel_error: 0.0,
        first_bad: None,
    };
    if got.len() != want.len() {
        c.failing = n;
        return c;
    }
    for i in 0..n as usize {
        let (g, w) = (element(dtype, got, i), element(dtype, want, i));
        if close(g, w, tol) {
            let abs = (g - w).abs();
            c.max_abs_error = c.max_abs_error.max(abs);
            if w != 0.0 {
                c.max_rel_error = c.max_rel_error.max(abs / w.abs());
            }
            continue;
        }
        c.failing += 1;
        if !g.is_finite() && w.is_finite() {
            c.non_finite += 1;
        }
        if g.is_finite() && w.is_finite() {
            let abs = (g - w).abs();
            c.max_abs_error = c.max_abs_error.max(abs);
            if w != 0.0 {
                c.max_rel_error = c.max_rel_error.max(abs / w.abs());
            }
        } else {
            c.max_abs_error = f64::INFINITY;
        }
        if c.first_bad.is_none() {
            let lo = i.saturating_sub(2);
            let hi = (i + 3).min(n as usize);
            c.first_bad = Some(BadElement {
                index: i as u64,
                coords: dims
                    .map(|d| crate::job::coordinates(i as u64, d))
                    .unwrap_or_default(),
                got: g,
                want: w,
                neighbourhood: (lo..hi)
                    .map(|j| (j as u64, element(dtype, got, j), element(dtype, want, j)))
                    .collect(),
            });
        }
    }
    c
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

    #[test]
    fn tolerance_is_combined() {
        assert!(close(1.0 + 5e-5, 1.0, TOL));
        assert!(!close(1.0 + 2e-4, 1.0, TOL));
        assert!(close(5e-6, 0.0, TOL), "atol covers values near zero");
        assert!(!close(f64::NAN, f64::NAN, TOL), "NaN never passes");
        assert!(
            !close(f64::INFINITY, f64::INFINITY, TOL),
            "Inf never passes"
        );
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
