//! Assembling a variant's [`Rationale`] from structured evidence.
//!
//! The verification engine and the agent hand over plain data ([`Evidence`]): the
//! diagnosis and changes as the agent stated them, the numeric results, the per-shape
//! measurements, the device. [`build`] checks that the evidence supports a rationale
//! (every change says why, every output was compared, no figure is physically
//! impossible) and derives the figures a reviewer needs: speedups are computed when
//! rendering, and the percentage of copy bandwidth from the declared ideal bytes and the
//! copy bandwidth measured on the device. Nothing in a rationale is typed by hand twice.

use std::collections::BTreeMap;

use kopt_spec::files::{
    self, BottleneckSnapshot, BudgetUsed, Change, Claim, CompileFigures, Diagnosis, OutputCheck,
    ParameterSearch, Provenance, Rationale, Risk, ShapeFigures, Snapshots, Verification,
};
use kopt_spec::spec::Number;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Everything a rationale is made of, as the loop (or a person) recorded it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    pub kernel: String,
    pub variant: String,
    pub arch: String,
    /// The lock entry it was verified as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<Claim>,
    pub summary: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_before: Option<BottleneckSnapshot>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_after: Option<BottleneckSnapshot>,
    pub diagnosis: Diagnosis,
    pub changes: Vec<Change>,
    pub risks: Vec<Risk>,
    pub verification: NumericEvidence,
    pub measurements: Vec<ShapeMeasurement>,
    /// The search over a parameter matrix that chose the variant's defines, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<ParameterSearch>,
    /// ptxas' figures of the variant as NVRTC compiled it on the CPU for its architecture
    /// when it was verified (`cargo kopt check` compares later compiles with them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile: Option<CompileFigures>,
    pub device: Device,
    /// Who or what proposed it: `person (hand-written)`, `heuristic`, `openai:<model>`.
    pub agent: String,
    /// When it was verified, as the verifier wrote it (`2026-11-29`).
    pub date: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetUsed>,
}

/// The numeric check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NumericEvidence {
    /// How it was checked, in a sentence or two.
    pub method: String,
    pub outputs: Vec<NumericResult>,
    /// The seeds of the random inputs, so that the check can be repeated.
    pub seeds: Vec<u64>,
}

/// One output buffer compared with the reference, over every shape checked: what the
/// rationale records of it (its tolerance and largest errors), and the elements that
/// failed (which a rationale never has: they must be none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NumericResult {
    #[serde(flatten)]
    pub check: OutputCheck,
    /// Elements outside the tolerance (`|a - b| > atol + rtol * |b|`, NaN, Inf).
    pub failing_elements: u64,
}

/// One shape, timed for the version replaced and for the variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShapeMeasurement {
    pub shape: BTreeMap<String, Number>,
    pub reference_us: f64,
    pub variant_us: f64,
    /// The ideal bytes moved (the annotation's `bytes`), for the bandwidth figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ideal_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registers: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occupancy_pct: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    /// `NVIDIA H200`.
    pub name: String,
    /// `580.159.04`.
    pub driver: String,
    /// `13.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<String>,
    /// Device-to-device copy bandwidth measured on it, GB/s (read + write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_bandwidth_gbs: Option<f64>,
}

/// Builds the rationale, or says which piece of evidence is missing or contradicts it.
pub fn build(e: &Evidence) -> Result<Rationale> {
    let bad = |m: String| {
        Err(Error::Invalid(format!(
            "evidence for `{}/{}`: {m}",
            e.kernel, e.variant
        )))
    };
    if files::parse_arch(&e.arch).is_none() {
        return bad(format!(
            "`{}` is not an architecture name (e.g. `sm_90`)",
            e.arch
        ));
    }
    if !files::is_valid_variant_name(&e.variant) {
        return bad(format!("`{}` is not a valid variant name", e.variant));
    }
    for (what, text) in [
        ("summary", &e.summary),
        ("diagnosis.bottleneck", &e.diagnosis.bottleneck),
        ("diagnosis.explanation", &e.diagnosis.explanation),
        ("verification.method", &e.verification.method),
        ("agent", &e.agent),
        ("date", &e.date),
        ("device.name", &e.device.name),
        ("device.driver", &e.device.driver),
    ] {
        if text.trim().is_empty() {
            return bad(format!("`{what}` is empty"));
        }
    }
    if e.changes.is_empty() {
        return bad("no change is described".into());
    }
    if let Some(c) = e
        .changes
        .iter()
        .find(|c| c.what.trim().is_empty() || c.why.trim().is_empty())
    {
        return bad(format!(
            "change `{}` does not say what it is and why it addresses the diagnosis",
            c.what
        ));
    }
    if let Some(r) = e.risks.iter().find(|r| r.covered_by.trim().is_empty()) {
        return bad(format!(
            "risk `{}` does not say how verification covered it",
            r.risk
        ));
    }
    if e.verification.outputs.is_empty() {
        return bad("no output buffer was compared with the reference".into());
    }
    if e.verification.seeds.is_empty() {
        return bad("no seeds: the numeric check could not be repeated".into());
    }
    let mut outputs = Vec::new();
    for o in &e.verification.outputs {
        let c = &o.check;
        let values = [c.rtol, c.atol, c.max_abs_error, c.max_rel_error];
        if values.iter().any(|v| !v.is_finite() || *v < 0.0) {
            return bad(format!(
                "output `{}`: tolerances and errors must be finite and non-negative",
                c.buffer
            ));
        }
        if o.failing_elements > 0 {
            return bad(format!(
                "output `{}` has {} element(s) outside its tolerance: a variant that fails the numeric check gets no rationale",
                c.buffer, o.failing_elements
            ));
        }
        outputs.push(c.clone());
    }
    if e.measurements.is_empty() {
        return bad("no shape was measured".into());
    }
    let mut figures = Vec::new();
    for m in &e.measurements {
        let label = m
            .shape
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        let times = [m.reference_us, m.variant_us];
        if times.iter().any(|t| !t.is_finite() || *t <= 0.0) {
            return bad(format!("shape {label}: times must be positive"));
        }
        let copy_bandwidth_pct = match (m.ideal_bytes, e.device.copy_bandwidth_gbs) {
            (Some(bytes), Some(peak)) => {
                if !(peak.is_finite() && peak > 0.0) {
                    return bad("device.copy_bandwidth_gbs must be positive".into());
                }
                let achieved_gbs = bytes as f64 / (m.variant_us * 1e-6) / 1e9;
                let pct = achieved_gbs / peak * 100.0;
                let plausible = kopt_spec::files::COPY_BANDWIDTH_PLAUSIBLE_PCT;
                if pct > plausible {
                    return bad(format!(
                        "shape {label}: {achieved_gbs:.0} GB/s is {pct:.1}% of the measured copy bandwidth; above {plausible:.0}% is a measurement error (unflushed caches, an unsynchronised clock, or wrong ideal bytes), not a speedup"
                    ));
                }
                Some((pct * 10.0).round() / 10.0)
            }
            _ => None,
        };
        if let Some(o) = m.occupancy_pct {
            if !(0.0..=100.0).contains(&o) {
                return bad(format!("shape {label}: occupancy {o}% is not a percentage"));
            }
        }
        figures.push(ShapeFigures {
            shape: m.shape.clone(),
            reference_us: m.reference_us,
            variant_us: m.variant_us,
            copy_bandwidth_pct,
            registers: m.registers,
            occupancy_pct: m.occupancy_pct,
        });
    }
    let snapshots = match (&e.snapshot_before, &e.snapshot_after) {
        (Some(before), after) => Some(Snapshots {
            before: before.clone(),
            after: after.clone(),
        }),
        (None, Some(_)) => {
            return bad("a snapshot after the change without one before it compares nothing".into())
        }
        (None, None) => None,
    };
    if let Some(c) = &e.diagnosis.confidence {
        if !(0.0..=1.0).contains(&c.score) {
            return bad(format!("confidence {} is not between 0 and 1", c.score));
        }
    }
    if let Some(c) = &e.compile {
        if c.nvrtc.trim().is_empty() || files::parse_arch(&c.arch).is_none() {
            return bad(format!(
                "the compile figures name no NVRTC version or no architecture (`{}`, `{}`)",
                c.nvrtc, c.arch
            ));
        }
    }
    if let Some(s) = &e.search {
        if s.method.trim().is_empty() {
            return bad("`search.method` is empty".into());
        }
        if !s.points.iter().any(|p| p.point == s.chosen) {
            return bad(format!(
                "the search chose `{}`, which is not one of its points",
                s.chosen
            ));
        }
        if let Some((p, t)) = s.points.iter().find_map(|p| {
            p.times_us
                .values()
                .find(|t| !t.is_finite() || **t <= 0.0)
                .map(|t| (p, t))
        }) {
            return bad(format!(
                "search point `{}`: time {t} µs is not positive",
                p.point
            ));
        }
    }
    let device = format!("{} ({})", e.device.name, e.arch);
    let driver = match &e.device.cuda {
        Some(cuda) => format!("{} (CUDA {cuda})", e.device.driver),
        None => e.device.driver.clone(),
    };
    Ok(Rationale {
        format: files::FORMAT,
        kernel: e.kernel.clone(),
        variant: e.variant.clone(),
        arch: e.arch.clone(),
        claim: e.claim.clone(),
        summary: e.summary.clone(),
        snapshots,
        diagnosis: e.diagnosis.clone(),
        changes: e.changes.clone(),
        risks: e.risks.clone(),
        verification: Verification {
            method: e.verification.method.clone(),
            outputs,
            seeds: e.verification.seeds.clone(),
        },
        figures,
        compile: e.compile.clone(),
        search: e.search.clone(),
        provenance: Provenance {
            agent: e.agent.clone(),
            device,
            driver,
            date: e.date.clone(),
            copy_bandwidth_gbs: e.device.copy_bandwidth_gbs,
            session: e.session.clone(),
            budget: e.budget.clone(),
        },
    })
}

impl Evidence {
    pub fn parse(text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|err| Error::Invalid(format!("evidence: {err}")))
    }
}
