//! A fake device for tests without a GPU. It speaks the real protocol from a real worker
//! process; what a candidate "does" is read from directives in its source, one per line:
//!
//! ```text
//! // kopt-fake: speedup 1.25            candidate time = reference time / 1.25
//! // kopt-fake: slower-on rows=16 1.5   on shapes whose label contains `rows=16`
//! // kopt-fake: compile-error MESSAGE   NVRTC-style error at this line
//! // kopt-fake: wrong BUFFER INDEX      that output element is wrong (every check)
//! // kopt-fake: wrong-held-out BUFFER   wrong only on held-out shapes
//! // kopt-fake: wrong-after-timing      wrong only in the re-check after timing
//! // kopt-fake: nan BUFFER              NaN in that output
//! // kopt-fake: modifies-input BUFFER   the candidate writes an input
//! // kopt-fake: fault                   illegal address: the worker exits
//! // kopt-fake: hang                    never returns (the parent's watchdog must act)
//! // kopt-fake: crash                   the process aborts
//! // kopt-fake: delay-ms 40              each evaluation takes 40 ms more (interruption tests)
//! // kopt-fake: wrong-if TOKEN BUFFER    BUFFER is wrong when the version matches TOKEN
//! // kopt-fake: time-table TOKEN:F ...   a timing model over defines and options (below)
//! // kopt-fake: max-active-clusters N   launches with a cluster hold N clusters at once
//! // kopt-fake: jitter F                the candidate's time is (1 + F) times the model's
//! //                                    on odd evaluations of this job by this worker,
//! //                                    (1 - F) on even ones: timing noise between jobs
//! ```
//!
//! The reference runs at 3000 GB/s of its ideal bytes plus 3 µs; a one-launch copy
//! (`copy_times`) at 4000 GB/s plus 2 µs.
//!
//! **Several devices.** `KOPT_FAKE_DEVICES=N` makes N fake devices (ordinals 0 to N-1, each
//! with its own UUID; the worker is started with `--fake --device K`), so that the device
//! pool and its scheduling are tested without a GPU; `delay-ms` makes jobs long enough to
//! see two devices work at once.
//!
//! **Timing model.** Searches build every candidate from the same source with other
//! defines and options, so source directives alone cannot tell their times apart. A
//! `time-table` line lists `TOKEN:FACTOR` pairs; a TOKEN is a define (`VEC=4`), an option
//! as the candidate passes it (`--use_fast_math`, `--maxrregcount=64`), or several joined
//! by `&` (`BLOCK=1024&VEC=8`, all must match). A version's time is the base time above
//! times the FACTOR of every pair it matches, over every `time-table` line; the reference
//! is timed by the same model (so the reference's own defines cost what they cost), and
//! `speedup` and `slower-on` then apply to the candidate as usual. `wrong-if` uses the same
//! TOKENs: `// kopt-fake: wrong-if --use_fast_math y` makes `y` fail every check of a
//! candidate built with fast math.
//!
//! [`fake_compile`] is the parent-side twin of the fake device's compiler: it fails where
//! `compile-error` says so and otherwise returns a pseudo-PTX text that depends on the
//! source, entry and options, as real PTX does; a job carrying PTX is loaded as is.

use std::collections::BTreeMap;

use kopt_spec::spec::{Direction, Shape};

use super::Backend;
use crate::compare::{BadElement, OutputComparison};
use crate::inputs::Variation;
use crate::job::{EvalJob, Geometry, KernelVersion};
use crate::protocol::*;
use crate::stats::summarise;

pub struct FakeBackend {
    compiled: BTreeMap<String, ()>,
    device: DeviceInfo,
    /// Evaluations so far of each candidate source (for `jitter`).
    evaluations: BTreeMap<String, u64>,
}

impl FakeBackend {
    pub fn new() -> Self {
        Self::on(0)
    }

    /// The fake device with this ordinal (see [`fake_device_count`]).
    pub fn on(ordinal: usize) -> Self {
        FakeBackend {
            compiled: BTreeMap::new(),
            device: fake_device_on(ordinal),
            evaluations: BTreeMap::new(),
        }
    }
}

impl Default for FakeBackend {
    fn default() -> Self {
        Self::new()
    }
}

/// The environment variable that says how many fake devices there are (default 1), so that
/// the device pool and its scheduling can be tested without a GPU.
pub const FAKE_DEVICES_VAR: &str = "KOPT_FAKE_DEVICES";

/// How many fake devices `KOPT_FAKE_DEVICES` simulates (1 when unset).
pub fn fake_device_count() -> Result<usize, String> {
    match std::env::var(FAKE_DEVICES_VAR) {
        Err(_) => Ok(1),
        Ok(v) if v.trim().is_empty() => Ok(1),
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=64).contains(n))
            .ok_or_else(|| {
                format!("{FAKE_DEVICES_VAR}={v}: write how many fake devices to simulate, 1 to 64")
            }),
    }
}

/// The fake device: an H200-like sm_90 part.
pub fn fake_device() -> DeviceInfo {
    fake_device_on(0)
}

/// Fake device `ordinal`: the same part, with its own ordinal and UUID (as two GPUs of one
/// model differ), so caches keyed by device identity keep them apart.
pub fn fake_device_on(ordinal: usize) -> DeviceInfo {
    DeviceInfo {
        ordinal,
        name: kopt_spec::files::FAKE_DEVICE_NAME.into(),
        uuid: format!("GPU-fake-{ordinal:04}"),
        compute_capability: (9, 0),
        arch: "sm_90".into(),
        multiprocessors: 132,
        l2_bytes: 50 * 1024 * 1024,
        memory_bytes: 141 << 30,
        sm_clock_mhz: 1980,
        memory_clock_mhz: 3201,
        driver_api: 13000,
        max_threads_per_block: 1024,
        max_shared_per_block_optin: 232448,
        max_warps_per_sm: 64,
        registers_per_sm: 65536,
    }
}

struct Directives {
    lines: Vec<(usize, Vec<String>)>,
}

impl Directives {
    fn parse(source: &str) -> Self {
        Directives {
            lines: source
                .lines()
                .enumerate()
                .filter_map(|(i, l)| {
                    let rest = l.trim().strip_prefix("// kopt-fake:")?;
                    Some((i + 1, rest.split_whitespace().map(String::from).collect()))
                })
                .collect(),
        }
    }

    fn get(&self, word: &str) -> Option<(usize, &[String])> {
        self.lines
            .iter()
            .find(|(_, w)| w.first().map(String::as_str) == Some(word))
            .map(|(line, w)| (*line, &w[1..]))
    }

    fn all<'a>(&'a self, word: &'a str) -> impl Iterator<Item = &'a [String]> + 'a {
        self.lines
            .iter()
            .filter(move |(_, w)| w.first().map(String::as_str) == Some(word))
            .map(|(_, w)| &w[1..])
    }
}

/// Whether a version matches a TOKEN of `time-table` or `wrong-if`: `NAME=VALUE` for a
/// define, an option as passed, or several joined by `&`.
fn matches(v: &KernelVersion, token: &str) -> bool {
    token.split('&').all(|t| {
        if t.starts_with('-') {
            v.options.iter().any(|o| o == t)
        } else {
            match t.split_once('=') {
                Some((name, value)) => v
                    .defines
                    .get(name)
                    .is_some_and(|d| value.parse::<i64>().ok() == Some(*d)),
                None => false,
            }
        }
    })
}

/// The `time-table` factor of a version (1 without a table).
fn table_factor(d: &Directives, v: &KernelVersion) -> f64 {
    let mut f = 1.0;
    for words in d.all("time-table") {
        for pair in words {
            if let Some((token, factor)) = pair.rsplit_once(':') {
                if let Ok(factor) = factor.parse::<f64>() {
                    if matches(v, token) {
                        f *= factor;
                    }
                }
            }
        }
    }
    f
}

/// What the parent's compile pool produces for a version on the fake device: the
/// compile error `compile-error` asks for, or a pseudo-PTX text that changes with the
/// source, the entry point and the options.
pub fn fake_compile(v: &KernelVersion) -> Result<String, String> {
    let d = Directives::parse(&v.source);
    if let Some((line, words)) = d.get("compile-error") {
        return Err(compile_error_log(line, words));
    }
    let options = v.compile_options();
    Ok(format!(
        "// kopt fake PTX\n// source {}\n// options {}\n.visible .entry {}()\n",
        crate::cache::hash_parts(&[&v.source]),
        options.join(" "),
        v.entry
    ))
}

fn compile_error_log(line: usize, words: &[String]) -> String {
    format!(
        "kernel.cu({line}): error: {}\n\n1 error detected in the compilation of \"kernel.cu\".",
        words.join(" ")
    )
}

fn compile(v: &KernelVersion, compiled: &mut BTreeMap<String, ()>) -> CompileReport {
    let d = Directives::parse(&v.source);
    let options = v.compile_options();
    if let (None, Some((line, words))) = (&v.ptx, d.get("compile-error")) {
        return CompileReport {
            ok: false,
            log: compile_error_log(line, words),
            options,
            cached: false,
            attributes: None,
        };
    }
    let key = crate::cache::hash_parts(&[
        &v.source,
        &options.join(" "),
        &v.entry,
        v.ptx.as_deref().unwrap_or(""),
    ]);
    let cached = compiled.insert(key, ()).is_some();
    CompileReport {
        ok: true,
        log: String::new(),
        options,
        cached,
        attributes: Some(FunctionAttributes {
            registers: 32,
            static_shared_bytes: 128,
            local_bytes: 0,
            max_threads_per_block: 1024,
        }),
    }
}

impl Backend for FakeBackend {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn device(&self) -> DeviceInfo {
        self.device.clone()
    }

    fn ceilings(&mut self) -> Result<Ceilings, String> {
        Ok(Ceilings {
            device: self.device.name.clone(),
            identity: self.device.identity(),
            copy_gbs: 4000.0,
            matmul_bf16_tflops: Some(750.0),
            matmul_f16_tflops: Some(740.0),
            matmul_f32_tflops: Some(50.0),
            method: "fake device: fixed figures".into(),
        })
    }

    fn copy_times(
        &mut self,
        bytes: &[u64],
        progress: &mut dyn FnMut(&str),
    ) -> Result<Vec<CopyTime>, String> {
        Ok(bytes
            .iter()
            .map(|&b| {
                progress(&format!("copy of {b} bytes"));
                let us = b as f64 / 4000e3 + 2.0;
                CopyTime {
                    bytes: b,
                    timing: summarise(
                        "graph of 10 launches over 1 input set(s), L2 cold",
                        10,
                        &[us * 0.995, us, us * 1.005, us],
                    ),
                }
            })
            .collect())
    }

    fn evaluate(&mut self, job: &EvalJob, progress: &mut dyn FnMut(&str)) -> EvalReport {
        let spec = &job.spec;
        let d = Directives::parse(&job.candidate.source);
        let mut report = EvalReport {
            device: self.device.clone(),
            reference: compile(&job.reference, &mut self.compiled),
            candidate: compile(&job.candidate, &mut self.compiled),
            shapes: Vec::new(),
            fault: None,
        };
        if !report.reference.ok || !report.candidate.ok {
            return report;
        }
        if let Some(ms) = d
            .get("delay-ms")
            .and_then(|(_, w)| w.first()?.parse::<u64>().ok())
        {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        let nth = {
            let n = self
                .evaluations
                .entry(crate::cache::hash_parts(&[&job.candidate.source]))
                .or_insert(0);
            *n += 1;
            *n
        };
        let jitter = d
            .get("jitter")
            .and_then(|(_, w)| w.first()?.parse::<f64>().ok())
            .map_or(1.0, |f| if nth % 2 == 1 { 1.0 + f } else { 1.0 - f });
        for case in &job.shapes {
            progress(&format!("shape {}", case.label));
            if d.get("crash").is_some() {
                std::process::abort();
            }
            if d.get("hang").is_some() {
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                }
            }
            if d.get("fault").is_some() {
                report.fault = Some("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered (candidate, first check)".into());
                return report;
            }
            let shape = Shape {
                values: case.values.clone(),
                weight: 1.0,
            };
            let args = spec.shape_args(&shape);
            let bytes = crate::job::shape_bytes(spec, &args);
            let geometry = |v: &KernelVersion| v.geometry(spec, &args);
            let (rg, cg) = match (geometry(&job.reference), geometry(&job.candidate)) {
                (Ok(r), Ok(c)) => (r, c),
                (Err(e), _) | (_, Err(e)) => {
                    report.shapes.push(ShapeReport {
                        label: case.label.clone(),
                        held_out: case.held_out,
                        bytes,
                        flops: None,
                        error: Some(e),
                        checks: vec![],
                        inputs_modified: vec![],
                        reference: None,
                        candidate: None,
                    });
                    continue;
                }
            };
            let mut phases = vec![
                (Phase::BeforeReference, Variation::Declared, job.seeds.first),
                (Phase::AfterReference, Variation::Declared, job.seeds.first),
                (Phase::BeforeReference, Variation::Shifted, job.seeds.second),
                (Phase::AfterReference, Variation::Shifted, job.seeds.second),
            ];
            if job.timing.is_some() && case.timed {
                phases.push((
                    Phase::AfterTiming,
                    Variation::Declared,
                    job.seeds.after_timing,
                ));
            }
            let checks = phases
                .into_iter()
                .map(|(phase, variation, seed)| CheckReport {
                    phase,
                    variation,
                    seed,
                    outputs: spec
                        .buffers()
                        .filter(|b| b.is_output())
                        .map(|b| {
                            let n = spec
                                .compile_expr(&b.len, &BTreeMap::new())
                                .ok()
                                .and_then(|p| kopt_spec::expr::eval(&p, &args).ok())
                                .unwrap_or(0) as u64;
                            let mut wrong_at = d
                                .all("wrong")
                                .find(|w| w.first() == Some(&b.name))
                                .and_then(|w| w.get(1)?.parse::<u64>().ok());
                            if case.held_out
                                && d.all("wrong-held-out").any(|w| w.first() == Some(&b.name))
                            {
                                wrong_at = Some(n / 2);
                            }
                            if phase == Phase::AfterTiming && d.get("wrong-after-timing").is_some()
                            {
                                wrong_at = Some(0);
                            }
                            if d.all("wrong-if").any(|w| {
                                w.first().is_some_and(|t| matches(&job.candidate, t))
                                    && w.get(1) == Some(&b.name)
                            }) {
                                wrong_at = Some(0);
                            }
                            let nan = d.all("nan").any(|w| w.first() == Some(&b.name));
                            fake_comparison(
                                &b.name,
                                b.dtype,
                                b.effective_tolerance(spec),
                                n,
                                wrong_at,
                                nan,
                            )
                        })
                        .collect(),
                })
                .collect();
            let inputs_modified = d
                .all("modifies-input")
                .filter_map(|w| w.first().cloned())
                .filter(|name| {
                    spec.buffers()
                        .any(|b| &b.name == name && b.direction == Direction::In)
                })
                .collect();
            let base_us = bytes as f64 / 3000e3 + 3.0;
            let ref_us = base_us * table_factor(&d, &job.reference);
            let table = table_factor(&d, &job.candidate) / table_factor(&d, &job.reference);
            let mut factor = table
                * d.get("speedup")
                    .and_then(|(_, w)| w.first()?.parse::<f64>().ok())
                    .map(|s| 1.0 / s)
                    .unwrap_or(1.0);
            for w in d.all("slower-on") {
                if let (Some(pat), Some(f)) =
                    (w.first(), w.get(1).and_then(|f| f.parse::<f64>().ok()))
                {
                    if case.label.contains(pat.as_str()) {
                        factor = table * f;
                    }
                }
            }
            let timed = job.timing.is_some() && case.timed;
            let timing = |us: f64| {
                timed.then(|| {
                    summarise(
                        "graph of 10 launches over 1 input set(s), L2 cold",
                        10,
                        &[us * 0.995, us, us * 1.005, us],
                    )
                })
            };
            let max_active_clusters = d
                .get("max-active-clusters")
                .and_then(|(_, w)| w.first()?.parse::<u32>().ok());
            let occupancy = |g: &Geometry| {
                Some(Occupancy {
                    blocks_per_sm: 8,
                    warps_per_sm: 64,
                    max_warps_per_sm: 64,
                    max_active_clusters: max_active_clusters.filter(|_| g.cluster != [1, 1, 1]),
                })
            };
            report.shapes.push(ShapeReport {
                label: case.label.clone(),
                held_out: case.held_out,
                bytes,
                flops: None,
                error: None,
                checks,
                inputs_modified,
                reference: Some(LaunchFigures {
                    geometry: rg,
                    occupancy: occupancy(&rg),
                    timing: timing(ref_us),
                }),
                candidate: Some(LaunchFigures {
                    geometry: cg,
                    occupancy: occupancy(&cg),
                    timing: timing(ref_us * factor * jitter),
                }),
            });
        }
        report
    }
}

fn fake_comparison(
    buffer: &str,
    dtype: kopt_spec::spec::DType,
    tolerance: kopt_spec::spec::Tolerance,
    n: u64,
    wrong_at: Option<u64>,
    nan: bool,
) -> OutputComparison {
    let bad = wrong_at.filter(|i| *i < n).map(|i| BadElement {
        index: i,
        coords: vec![],
        got: 0.0,
        want: 0.5,
        neighbourhood: vec![(i, 0.0, 0.5)],
    });
    let nan_bad = nan.then(|| BadElement {
        index: 0,
        coords: vec![],
        got: f64::NAN,
        want: 0.25,
        neighbourhood: vec![(0, f64::NAN, 0.25)],
    });
    let failing = u64::from(bad.is_some()) + u64::from(nan_bad.is_some());
    OutputComparison {
        buffer: buffer.to_string(),
        dtype,
        elements: n,
        tolerance,
        failing,
        non_finite: u64::from(nan),
        max_abs_error: if nan {
            f64::INFINITY
        } else if bad.is_some() {
            0.5
        } else {
            1e-7
        },
        max_rel_error: if bad.is_some() || nan { 1.0 } else { 1e-6 },
        first_bad: nan_bad.or(bad),
    }
}
