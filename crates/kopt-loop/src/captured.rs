//! A program's capture (`KOPT_CAPTURE`, [`kopt_spec::capture`]) as evaluation cases:
//! `verify --inputs`, `bench --inputs` and `optimize --inputs` add each kept launch's
//! recorded inputs to the numeric fence, and the bench weighs its shapes by the launch
//! counts. A capture made with another annotation than today's is refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kopt_spec::capture::{self, CaptureRun, CaseCapture};
use kopt_spec::expr::Expr;
use kopt_spec::shapes::{CapturedInputs, ShapeCase};
use kopt_spec::spec::{KernelSpec, Number};
use kopt_workspace::gather::Gathered;
use serde::Serialize;

use crate::{Error, Result};

/// The captured cases of a workspace's kernels, by kernel name.
#[derive(Debug, Clone, Default)]
pub struct Captured {
    /// Where they were read from, and the processes' captures as read.
    pub dir: Option<PathBuf>,
    pub runs: Vec<CaptureRun>,
    pub kernels: BTreeMap<String, Vec<Case>>,
    /// Kernels of the capture that this workspace does not hold (another crate's).
    pub unknown: Vec<String>,
}

/// One kernel's launches with one tuple of scalar arguments, over every process read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Case {
    pub scalars: BTreeMap<String, Number>,
    pub launches: u64,
    /// The estimated GPU time of all its launches (sampled mean times launches), µs.
    pub total_us: Option<f64>,
    /// The kept launches' input files, with their launch number and program.
    pub inputs: Vec<(PathBuf, u64, String)>,
}

impl Case {
    /// `cols=4096 rows=8`, as kopt labels shapes.
    pub fn label(&self) -> String {
        capture::scalars_label(&self.scalars)
    }

    /// An evaluation case of these scalars named `label`, on the recorded inputs of
    /// `file` (drawn ones without).
    fn shape_case(&self, label: String, file: Option<&PathBuf>, timed: bool) -> ShapeCase {
        ShapeCase {
            label,
            values: self.scalars.clone(),
            held_out: false,
            timed,
            captured: file.map(|f| CapturedInputs {
                file: f.clone(),
                launches: self.launches,
            }),
        }
    }
}

/// A captured case no declared shape of its kernel covers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Uncovered {
    pub kernel: String,
    pub case: String,
    pub launches: u64,
    /// Its share of the kernel's captured GPU time, percent (when timed).
    pub share_pct: Option<f64>,
    /// The annotation's `shapes = [...]` with the case added: the line to paste.
    pub annotation: String,
}

impl Captured {
    /// The captures under `dir` ([`capture::load`]) for `g`'s kernels. A kernel whose
    /// capture recorded another annotation (spec hash) than today's is refused, naming
    /// both hashes and the program that made it.
    pub fn load(g: &Gathered, dir: &Path) -> Result<Captured> {
        let runs = capture::load(dir).map_err(Error::Invalid)?;
        Self::from_runs(g, dir, runs)
    }

    /// [`Captured::load`] of captures already read from `dir`.
    pub fn from_runs(g: &Gathered, dir: &Path, runs: Vec<CaptureRun>) -> Result<Captured> {
        let mut out = Captured {
            dir: Some(dir.to_path_buf()),
            ..Default::default()
        };
        for run in &runs {
            let m = &run.manifest;
            for kc in &m.kernels {
                let Some(k) = g
                    .kernels
                    .iter()
                    .find(|k| k.spec.name == kc.kernel && k.package == kc.krate)
                else {
                    let name = format!("{} ({})", kc.kernel, kc.krate);
                    if !out.unknown.contains(&name) {
                        out.unknown.push(name);
                    }
                    continue;
                };
                if kc.spec_hash != k.hashes.spec {
                    return Err(Error::Invalid(format!(
                        "{} recorded `{}` of {} built with another #[kopt::kernel] annotation than today's (its spec hash {}, today's {}): its inputs may not fit today's buffers and shapes; run `{}` again with KOPT_CAPTURE, built from today's code",
                        run.dir.join(capture::MANIFEST).display(),
                        kc.kernel,
                        kc.krate,
                        short(&kc.spec_hash),
                        short(&k.hashes.spec),
                        m.program
                    )));
                }
                let cases = out.kernels.entry(kc.kernel.clone()).or_default();
                for c in &kc.cases {
                    merge(cases, c, run, &m.program);
                }
            }
        }
        out.runs = runs;
        Ok(out)
    }

    /// Whether nothing was captured for the workspace's kernels.
    pub fn is_empty(&self) -> bool {
        self.kernels.is_empty()
    }

    /// The evaluation cases of `spec`'s kernel inside `region`: one per kept launch,
    /// checked against the reference on its recorded inputs (`timed`: timed as well).
    pub fn shape_cases(
        &self,
        spec: &KernelSpec,
        region: Option<&Expr>,
        timed: bool,
    ) -> Vec<ShapeCase> {
        let Some(cases) = self.kernels.get(&spec.name) else {
            return Vec::new();
        };
        cases
            .iter()
            .filter(|c| region.is_none_or(|r| spec.region_holds(r, &spec.value_args(&c.scalars))))
            .flat_map(|c| {
                c.inputs.iter().map(move |(file, launch, program)| {
                    c.shape_case(
                        captured_label(&c.label(), *launch, program),
                        Some(file),
                        timed,
                    )
                })
            })
            .collect()
    }

    /// The bench's cases of `spec`'s kernel: one per tuple of scalars the program
    /// launched, timed on the inputs of its first kept launch (drawn ones when none was
    /// kept), with its launch count.
    pub fn bench_cases(&self, spec: &KernelSpec) -> Vec<(ShapeCase, u64)> {
        let Some(cases) = self.kernels.get(&spec.name) else {
            return Vec::new();
        };
        cases
            .iter()
            .map(|c| {
                let label = format!("{} (captured: {} launches)", c.label(), c.launches);
                let first = c.inputs.first().map(|(file, _, _)| file);
                (c.shape_case(label, first, true), c.launches)
            })
            .collect()
    }

    /// The captured cases of `g`'s kernels that no declared shape covers (its integer
    /// scalars equal), with the annotation line that would add each.
    pub fn uncovered(&self, g: &Gathered) -> Vec<Uncovered> {
        let mut out = Vec::new();
        for k in &g.kernels {
            let Some(cases) = self.kernels.get(&k.spec.name) else {
                continue;
            };
            let total: f64 = cases.iter().filter_map(|c| c.total_us).sum();
            for c in cases {
                let args = k.spec.value_args(&c.scalars);
                if k.spec.shapes.iter().any(|s| k.spec.shape_args(s) == args) {
                    continue;
                }
                out.push(Uncovered {
                    kernel: k.spec.name.clone(),
                    case: c.label(),
                    launches: c.launches,
                    share_pct: c
                        .total_us
                        .filter(|_| total > 0.0)
                        .map(|t| 100.0 * t / total),
                    annotation: shapes_line(&k.spec, &c.scalars),
                });
            }
        }
        out
    }
}

/// A captured case's label: `rows=8 cols=4096 (captured: launch 1 of llm-kernels)`.
pub fn captured_label(shape: &str, launch: u64, program: &str) -> String {
    format!("{shape} (captured: launch {launch} of {program})")
}

fn short(hash: &str) -> &str {
    let h = hash.strip_prefix("sha256:").unwrap_or(hash);
    &h[..h.len().min(12)]
}

/// Adds a process's case to the kernel's cases: the same scalars add up.
fn merge(cases: &mut Vec<Case>, c: &CaseCapture, run: &CaptureRun, program: &str) {
    let inputs = c
        .inputs
        .iter()
        .map(|s| (run.dir.join(&s.file), s.launch, program.to_string()));
    match cases.iter_mut().find(|x| x.scalars == c.scalars) {
        Some(x) => {
            x.launches += c.launches;
            x.total_us = match (x.total_us, c.total_us()) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
            x.inputs.extend(inputs);
        }
        None => cases.push(Case {
            scalars: c.scalars.clone(),
            launches: c.launches,
            total_us: c.total_us(),
            inputs: inputs.collect(),
        }),
    }
}

/// `shapes = [{ ... }, ..., { <case> }]`: the annotation's shapes with the case added,
/// each shape's values in the spec's scalar order.
fn shapes_line(spec: &KernelSpec, case: &BTreeMap<String, Number>) -> String {
    let one = |values: &BTreeMap<String, Number>| {
        let parts: Vec<String> = spec
            .scalars()
            .filter_map(|s| Some(format!("{}: {}", s.name, values.get(&s.name)?)))
            .collect();
        format!("{{ {} }}", parts.join(", "))
    };
    let mut all: Vec<String> = spec.shapes.iter().map(|s| one(&s.values)).collect();
    all.push(one(case));
    format!("shapes = [{}]", all.join(", "))
}

/// A kernel's share of a program's captured GPU time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimeShare {
    pub kernel: String,
    #[serde(rename = "crate")]
    pub krate: String,
    pub launches: u64,
    pub cases: usize,
    /// Estimated GPU time of all its launches, µs (sampled mean times launches per case;
    /// cases never timed count zero).
    pub total_us: f64,
    /// Percent of all annotated kernels' estimated time.
    pub share_pct: f64,
    /// Its costliest case, and that case's share of the kernel's time.
    pub top_case: Option<(String, f64)>,
    /// The versions that ran its launches, with their counts.
    pub versions: BTreeMap<String, u64>,
}

/// The annotated kernels of the captures, ranked by their share of the program's kernel
/// time: the first signal of where optimising pays.
pub fn time_shares(runs: &[CaptureRun]) -> Vec<TimeShare> {
    let mut by: BTreeMap<(String, String), TimeShare> = BTreeMap::new();
    let mut case_times: BTreeMap<(String, String), BTreeMap<String, f64>> = BTreeMap::new();
    for run in runs {
        for k in &run.manifest.kernels {
            let key = (k.kernel.clone(), k.krate.clone());
            let e = by.entry(key.clone()).or_insert_with(|| TimeShare {
                kernel: k.kernel.clone(),
                krate: k.krate.clone(),
                launches: 0,
                cases: 0,
                total_us: 0.0,
                share_pct: 0.0,
                top_case: None,
                versions: BTreeMap::new(),
            });
            for c in &k.cases {
                e.launches += c.launches;
                e.total_us += c.total_us().unwrap_or(0.0);
                for (v, n) in &c.versions {
                    *e.versions.entry(v.clone()).or_insert(0) += n;
                }
                *case_times
                    .entry(key.clone())
                    .or_default()
                    .entry(c.label())
                    .or_insert(0.0) += c.total_us().unwrap_or(0.0);
            }
        }
    }
    let all: f64 = by.values().map(|s| s.total_us).sum();
    let mut out: Vec<TimeShare> = by
        .into_iter()
        .map(|(key, mut s)| {
            let cases = case_times.remove(&key).unwrap_or_default();
            s.cases = cases.len();
            s.top_case = cases
                .into_iter()
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(label, t)| {
                    let pct = if s.total_us > 0.0 {
                        100.0 * t / s.total_us
                    } else {
                        0.0
                    };
                    (label, pct)
                });
            s.share_pct = if all > 0.0 {
                100.0 * s.total_us / all
            } else {
                0.0
            };
            s
        })
        .collect();
    out.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kopt_spec::capture::{CaptureManifest, CaptureSettings, InputSample, KernelCapture};

    fn case(scalars: &[(&str, i64)], launches: u64, timed: (u64, f64)) -> CaseCapture {
        CaseCapture {
            scalars: scalars
                .iter()
                .map(|(k, v)| (k.to_string(), Number::Int(*v)))
                .collect(),
            launches,
            versions: BTreeMap::from([("reference".to_string(), launches)]),
            timed_launches: timed.0,
            timed_us: timed.1,
            inputs: vec![InputSample {
                file: "softmax/c0-l1.safetensors".into(),
                launch: 1,
                version: "reference".into(),
            }],
            inputs_over_cap: 0,
        }
    }

    fn run(kernels: Vec<KernelCapture>) -> CaptureRun {
        CaptureRun {
            dir: "/cap/app-1-2".into(),
            manifest: CaptureManifest {
                format: capture::FORMAT,
                kind: capture::KIND.into(),
                program: "app".into(),
                pid: 1,
                device: "NVIDIA H200".into(),
                arch: "sm_90".into(),
                started_ms: 0,
                written_ms: 0,
                settings: CaptureSettings {
                    inputs_per_case: 2,
                    max_bytes: 1 << 30,
                    time_every: 16,
                },
                bytes_written: 0,
                kernels,
                shadow: vec![],
            },
        }
    }

    fn kernel(name: &str, cases: Vec<CaseCapture>) -> KernelCapture {
        KernelCapture {
            kernel: name.into(),
            krate: "app".into(),
            spec_hash: "sha256:00".into(),
            cases,
        }
    }

    #[test]
    fn kernels_are_ranked_by_their_share_of_the_captured_time() {
        let runs = [
            run(vec![
                // 1000 launches of 2 µs and 10 of 50 µs: 2.5 ms.
                kernel(
                    "softmax",
                    vec![
                        case(&[("rows", 8)], 1000, (63, 126.0)),
                        case(&[("rows", 4096)], 10, (1, 50.0)),
                    ],
                ),
                // 100 launches of 75 µs: 7.5 ms.
                kernel("gemm", vec![case(&[("m", 8)], 100, (7, 525.0))]),
            ]),
            // A second process: more softmax launches of the same case.
            run(vec![kernel(
                "softmax",
                vec![case(&[("rows", 8)], 500, (32, 64.0))],
            )]),
        ];
        let shares = time_shares(&runs);
        let names: Vec<&str> = shares.iter().map(|s| s.kernel.as_str()).collect();
        assert_eq!(names, ["gemm", "softmax"]);
        let (gemm, softmax) = (&shares[0], &shares[1]);
        assert!((gemm.total_us - 7500.0).abs() < 1e-9);
        assert!(
            (softmax.total_us - 3500.0).abs() < 1e-9,
            "{}",
            softmax.total_us
        );
        assert!((gemm.share_pct - 100.0 * 7500.0 / 11000.0).abs() < 1e-9);
        assert_eq!(softmax.launches, 1510);
        assert_eq!(softmax.cases, 2);
        let (top, pct) = softmax.top_case.clone().unwrap();
        assert_eq!(top, "rows=8");
        assert!((pct - 100.0 * 3000.0 / 3500.0).abs() < 1e-9);
        assert_eq!(softmax.versions["reference"], 1510);
    }

    #[test]
    fn a_case_never_timed_counts_its_launches_but_no_time() {
        let shares = time_shares(&[run(vec![kernel(
            "softmax",
            vec![case(&[("rows", 8)], 3, (0, 0.0))],
        )])]);
        assert_eq!(shares[0].launches, 3);
        assert_eq!(shares[0].total_us, 0.0);
        assert_eq!(shares[0].share_pct, 0.0);
    }
}
