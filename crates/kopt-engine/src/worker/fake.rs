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
//! // kopt-fake: hang                    the candidate's first launch never returns (the
//! //                                    parent's watchdog must act)
//! // kopt-fake: crash                   the process aborts
//! // kopt-fake: delay-ms 40              each evaluation takes 40 ms more (interruption tests)
//! // kopt-fake: wrong-if TOKEN BUFFER    BUFFER is wrong when the version matches TOKEN
//! // kopt-fake: wrong-if-input-over IN LIMIT OUT  OUT is wrong in a check whose input
//! //                                    IN holds an element beyond LIMIT in magnitude
//! //                                    (recorded by KOPT_CAPTURE; of drawn inputs, the
//! //                                    first 64 Ki elements are looked at)
//! // kopt-fake: time-table TOKEN:F ...   a timing model over defines and options (below)
//! // kopt-fake: max-active-clusters N   launches with a cluster hold N clusters at once
//! // kopt-fake: jitter F                the candidate's time is (1 + F) times the model's
//! //                                    on odd evaluations of this job by this worker,
//! //                                    (1 - F) on even ones: timing noise between jobs
//! // kopt-fake: launch-ms MS            in a version's own source (the reference's too):
//! //                                    each launch of it takes MS ms of device time
//! //                                    (`speedup`, `slower-on`, `time-table` and `jitter`
//! //                                    then leave the candidate's time alone)
//! // kopt-fake: real-time F             every launch also takes F times its device time
//! //                                    of real time (default 0: none), so that the
//! //                                    parent's hang limits meet a slow device
//! // kopt-fake: expect-args x y n=4 b=256  this version must be launched with exactly
//! //                                    these kernel arguments (buffers by name, scalars
//! //                                    as name=value), on every shape
//! // kopt-fake: expect-input BUFFER 4 1 2  that input holds these elements, in both
//! //                                    checks' variations (fixed contents)
//! ```
//!
//! **Steps and timing.** The fake device goes through a shape's steps as the GPU does
//! and announces each with the same expected durations (the reference launched alone
//! first, once per worker and shape; each check's candidate, reference and candidate
//! again; the timing; the re-check), its launches taking `real-time` times their device
//! time. Each version is timed by the plan the policy gives for its device time
//! ([`crate::job::TimingPolicy::plan`]), sampled under the same stopping rule on the
//! device's clock, the samples 0.995, 1, 1.005 and 1 times the time in turn (so that the
//! median is the time itself).
//!
//! The fake device builds each version's kernel arguments as the CUDA worker does
//! ([`KernelVersion::arg_values`]): a failure to compute them, or a version whose
//! `expect-args`/`expect-input` lines do not match, is a shape error naming what the
//! version was given.
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

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kopt_spec::spec::{ArgValue, Direction, KernelSpec, Shape};

use super::{Backend, StepProgress};
use crate::compare::{BadElement, OutputComparison, Rule, Worst};
use crate::inputs::Variation;
use crate::job::{EvalJob, Geometry, KernelVersion, TimingPlan, TimingPolicy};
use crate::protocol::*;
use crate::stats::{self, summarise, Timing};

pub struct FakeBackend {
    compiled: BTreeMap<String, ()>,
    device: DeviceInfo,
    /// Evaluations so far of each candidate source (for `jitter`).
    evaluations: BTreeMap<String, u64>,
    /// References launched alone once on a shape (by source, options and shape), as the
    /// GPU's worker does before the first candidate launch.
    probed: BTreeSet<String>,
    /// A parent watches the steps (see [`Backend::set_watched`]).
    watched: bool,
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
            probed: BTreeSet::new(),
            watched: true,
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

    fn set_watched(&mut self, watched: bool) {
        self.watched = watched;
    }

    fn evaluate(&mut self, job: &EvalJob, progress: StepProgress) -> EvalReport {
        let spec = &job.spec;
        let d = Directives::parse(&job.candidate.source);
        let rd = Directives::parse(&job.reference.source);
        // Real seconds per second of device time.
        let clock = [&d, &rd]
            .iter()
            .find_map(|d| d.get("real-time")?.1.first()?.parse::<f64>().ok())
            .filter(|f| f.is_finite() && *f > 0.0)
            .unwrap_or(0.0);
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
            progress(&format!("shape {}", case.label), None);
            if d.get("crash").is_some() {
                std::process::abort();
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
            let bytes = kopt_spec::shapes::ideal_bytes(spec, &args);
            let geometry = |v: &KernelVersion| v.geometry(spec, &args);
            let (rg, cg) = match (geometry(&job.reference), geometry(&job.candidate)) {
                (Ok(r), Ok(c)) => (r, c),
                (Err(e), _) | (_, Err(e)) => {
                    report.shapes.push(shape_error(case, bytes, e));
                    continue;
                }
            };
            let expectations = match (
                job.reference.arg_values(spec, &case.values),
                job.candidate.arg_values(spec, &case.values),
            ) {
                (Ok(ra), Ok(ca)) => [(&job.reference, ra), (&job.candidate, ca)]
                    .iter()
                    .flat_map(|(v, a)| expectations(spec, v, a, &args, job))
                    .collect::<Vec<String>>(),
                (Err(e), _) => vec![format!("reference arguments: {e}")],
                (_, Err(e)) => vec![format!("candidate arguments: {e}")],
            };
            if !expectations.is_empty() {
                report
                    .shapes
                    .push(shape_error(case, bytes, expectations.join("; ")));
                continue;
            }
            // The buffers' declared lengths here; a captured case's inputs load as the GPU
            // worker loads them (a file that does not match is the shape's error).
            let lens: Vec<usize> = spec
                .buffers()
                .map(|b| {
                    spec.compile_expr(&b.len, &BTreeMap::new())
                        .ok()
                        .and_then(|p| kopt_spec::expr::eval(&p, &args).ok())
                        .unwrap_or(0)
                        .max(0) as usize
                })
                .collect();
            let captured = match &case.captured {
                Some(c) => match crate::inputs::captured_all(spec, &lens, &c.file) {
                    Ok(host) => Some(host),
                    Err(e) => {
                        report.shapes.push(shape_error(case, bytes, e));
                        continue;
                    }
                },
                None => None,
            };
            // `wrong-if-input-over INPUT LIMIT OUTPUT`: the outputs wrong in a check whose
            // inputs hold an element of INPUT beyond LIMIT in magnitude.
            let input_over = |variation: Variation, seed: u64| -> Vec<String> {
                let rules: Vec<(&String, f64, &String)> = d
                    .all("wrong-if-input-over")
                    .filter_map(|w| Some((w.first()?, w.get(1)?.parse().ok()?, w.get(2)?)))
                    .collect();
                if rules.is_empty() {
                    return Vec::new();
                }
                // Drawn inputs are looked at over their first chunk only (the values a
                // full draw starts with): drawing 16M normals per check is slow here.
                let first: Vec<usize> = lens
                    .iter()
                    .map(|n| (*n).min(crate::inputs::CHUNK))
                    .collect();
                let drawn;
                let host = match &captured {
                    Some(h) => h,
                    None => match crate::inputs::fill_all(spec, &args, &first, seed, variation) {
                        Ok(h) => {
                            drawn = h;
                            &drawn
                        }
                        Err(_) => return Vec::new(),
                    },
                };
                rules
                    .into_iter()
                    .filter(|(input, limit, _)| {
                        spec.buffers().zip(host).any(|(b, h)| {
                            &&b.name == input
                                && h.as_ref().is_some_and(|bytes| {
                                    (0..bytes.len() / b.dtype.size()).any(|i| {
                                        crate::inputs::element(b.dtype, bytes, i).abs() > *limit
                                    })
                                })
                        })
                    })
                    .map(|(_, _, output)| output.clone())
                    .collect()
            };
            let base_us = bytes as f64 / 3000e3 + 3.0;
            let ref_us = launch_ms(&rd)
                .map(|ms| ms * 1e3)
                .unwrap_or(base_us * table_factor(&d, &job.reference));
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
            let cand_us = match launch_ms(&d) {
                Some(ms) => ms * 1e3,
                None => ref_us * factor * jitter,
            };
            let device = FakeClock {
                real_per_device_s: clock,
                reference_us: ref_us,
            };
            // The steps of the GPU's worker, announced with the same expected durations.
            let label = case.label.as_str();
            let probe = crate::cache::hash_parts(&[
                &job.reference.source,
                &job.reference.compile_options().join(" "),
                &job.reference.entry,
                label,
            ]);
            if self.watched && self.probed.insert(probe) {
                progress(
                    &format!("{label}: reference launch (its time sets the hang limits)"),
                    None,
                );
                device.run(ref_us);
            }
            for variation in [Variation::Declared, Variation::Shifted] {
                let check = format!("{label}: check ({})", variation.name());
                progress(&check, None);
                progress(&format!("{check}: candidate"), device.expect(1));
                if d.get("hang").is_some() {
                    loop {
                        std::thread::sleep(Duration::from_secs(3600));
                    }
                }
                device.run(cand_us);
                progress(&format!("{check}: reference"), device.expect(1));
                device.run(ref_us);
                progress(&format!("{check}: candidate again"), device.expect(1));
                device.run(cand_us);
                progress(&format!("{check}: comparison"), None);
            }
            let timed = job.timing.as_ref().filter(|_| case.timed);
            let timings = timed.map(|policy| {
                let mut step =
                    |what: &str, expect: Option<f64>| progress(&format!("{label}: {what}"), expect);
                let t = device.time_pair(policy, [ref_us, cand_us], &mut step);
                let recheck = format!("{label}: re-check after timing");
                progress(&recheck, None);
                progress(&format!("{recheck}: reference"), device.expect(1));
                device.run(ref_us);
                progress(&format!("{recheck}: candidate"), device.expect(1));
                device.run(cand_us);
                progress(&format!("{recheck}: comparison"), None);
                t
            });
            let [(tr, pr), (tc, pc)] = match timings {
                Some([(tr, pr), (tc, pc)]) => [(Some(tr), Some(pr)), (Some(tc), Some(pc))],
                None => [(None, None), (None, None)],
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
                .map(|(phase, variation, seed)| {
                    (phase, variation, seed, input_over(variation, seed))
                })
                .map(|(phase, variation, seed, over)| CheckReport {
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
                            if over.contains(&b.name) {
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
                    timing: tr,
                    timing_plan: pr,
                }),
                candidate: Some(LaunchFigures {
                    geometry: cg,
                    occupancy: occupancy(&cg),
                    timing: tc,
                    timing_plan: pc,
                }),
            });
        }
        report
    }
}

/// A version's `launch-ms`, in ms.
fn launch_ms(d: &Directives) -> Option<f64> {
    d.get("launch-ms")
        .and_then(|(_, w)| w.first()?.parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms > 0.0)
}

/// The fake device's clock on one shape: real time per device time (`real-time`), and
/// the reference's launch time the steps' expected durations follow from.
struct FakeClock {
    real_per_device_s: f64,
    reference_us: f64,
}

impl FakeClock {
    /// Lets `device_us` of device time pass.
    fn run(&self, device_us: f64) {
        let s = device_us * 1e-6 * self.real_per_device_s;
        if s > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(s.min(3600.0)));
        }
    }

    /// The real seconds `launches` launches take at the reference's speed, as the GPU's
    /// worker announces a step.
    fn expect(&self, launches: u32) -> Option<f64> {
        Some(launches as f64 * self.reference_us * 1e-6 * self.real_per_device_s)
    }

    /// Times a pair whose launches take `launch_us` of device time, as the GPU's worker
    /// does: planned by the policy (one input set, L2 cold), warmed up, estimated and
    /// sampled in alternation under the stopping rule on the device's clock.
    fn time_pair(
        &self,
        policy: &TimingPolicy,
        launch_us: [f64; 2],
        progress: StepProgress,
    ) -> [(Timing, TimingPlan); 2] {
        progress("timing (setup)", None);
        let plan = policy.plan(launch_us, 1);
        let (wr, wc) = (plan[0].warmup, plan[1].warmup);
        progress("timing (warm-up)", self.expect(wr + wc));
        self.run(wr as f64 * launch_us[0] + wc as f64 * launch_us[1]);
        let graphed: Vec<usize> = (0..2).filter(|&i| !plan[i].per_launch).collect();
        let graph_us = |reps: f64| graphed.iter().map(|&i| reps * launch_us[i]).sum::<f64>();
        if !graphed.is_empty() {
            progress("timing (estimate)", self.expect(4 * graphed.len() as u32));
            self.run(graph_us(4.0));
            progress("timing (graph capture)", None);
        }
        let round_launches: u32 = plan.iter().map(|p| p.graph_launches).sum();
        let round_us: f64 = (0..2)
            .map(|i| plan[i].graph_launches as f64 * launch_us[i])
            .sum();
        let per_launch_any = plan.iter().any(|p| p.per_launch);
        if !per_launch_any {
            let round_s = self.expect(round_launches).unwrap_or(0.0);
            progress(
                "timing (replays)",
                Some(
                    (plan[0].min_samples as f64 * round_s).max(plan[0].max_seconds) + 2.0 * round_s,
                ),
            );
        }
        // The untimed replay of each graph.
        self.run(graph_us(
            plan.iter().map(|p| p.graph_launches).max().unwrap_or(0) as f64,
        ));
        const PATTERN: [f64; 4] = [0.995, 1.0, 1.005, 1.0];
        let mut samples: [Vec<f64>; 2] = Default::default();
        let mut elapsed_s = 0.0;
        loop {
            let n = samples[0].len();
            if per_launch_any {
                progress(
                    &format!("timing (sample {})", n + 1),
                    self.expect(round_launches),
                );
            }
            for (i, v) in samples.iter_mut().enumerate() {
                v.push(launch_us[i] * PATTERN[n % PATTERN.len()]);
            }
            elapsed_s += round_us * 1e-6;
            self.run(round_us);
            if samples.iter().all(|v| {
                stats::should_stop(
                    v,
                    plan[0].min_samples,
                    plan[0].max_samples,
                    policy.target_spread,
                    elapsed_s,
                    plan[0].max_seconds,
                )
            }) {
                break;
            }
        }
        [0, 1].map(|i| {
            (
                summarise(
                    &plan[i].method(1, true),
                    plan[i].graph_launches,
                    &samples[i],
                ),
                plan[i].clone(),
            )
        })
    }
}

/// `x y ncols=1000 block_size=256 x_map=tma(64x32/8x32,swizzle=none)`: a version's kernel
/// arguments as `expect-args` writes them (a map as its dims, then its box).
pub fn render_args(spec: &KernelSpec, v: &KernelVersion, values: &[ArgValue]) -> String {
    let names = spec.version_args(v.args.as_deref()).unwrap_or_default();
    names
        .iter()
        .zip(values)
        .map(|(a, v)| match v {
            ArgValue::Buffer(_) => a.name().to_string(),
            ArgValue::Scalar(_, n) => format!("{}={n}", a.name()),
            ArgValue::TensorMap { args: m, .. } => {
                let r = m.rank as usize;
                let join = |x: &[String]| x.join("x");
                format!(
                    "{}=tma({}/{},swizzle={})",
                    a.name(),
                    join(&m.dims[..r].iter().map(u64::to_string).collect::<Vec<_>>()),
                    join(
                        &m.box_dims[..r]
                            .iter()
                            .map(u32::to_string)
                            .collect::<Vec<_>>()
                    ),
                    match m.swizzle.bytes() {
                        0 => "none".to_string(),
                        b => b.to_string(),
                    }
                )
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// What a version's `expect-args` and `expect-input` lines find wrong with its launch.
fn expectations(
    spec: &KernelSpec,
    v: &KernelVersion,
    values: &[ArgValue],
    args: &[i64],
    job: &EvalJob,
) -> Vec<String> {
    let d = Directives::parse(&v.source);
    let mut out = Vec::new();
    if let Some((_, want)) = d.get("expect-args") {
        let got = render_args(spec, v, values);
        if got != want.join(" ") {
            out.push(format!(
                "fake device: `{}` was launched with arguments `{got}`, but its source expects `{}`",
                v.id,
                want.join(" ")
            ));
        }
    }
    for w in d.all("expect-input") {
        let Some((name, want)) = w.split_first() else {
            continue;
        };
        let Some((index, b)) = spec.buffers().enumerate().find(|(_, b)| &b.name == name) else {
            out.push(format!(
                "fake device: `{}` expects an input `{name}` the spec does not declare",
                v.id
            ));
            continue;
        };
        let n = spec
            .compile_expr(&b.len, &BTreeMap::new())
            .ok()
            .and_then(|p| kopt_spec::expr::eval(&p, args).ok())
            .unwrap_or(0)
            .max(0) as usize;
        for (variation, seed) in [
            (Variation::Declared, job.seeds.first),
            (Variation::Shifted, job.seeds.second),
        ] {
            let got = crate::inputs::fill(b, spec, args, n, seed ^ index as u64, variation).map(
                |bytes| {
                    (0..n)
                        .map(|i| crate::inputs::element(b.dtype, &bytes, i).to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                },
            );
            match got {
                Ok(got) if got == want.join(" ") => {}
                Ok(got) => out.push(format!(
                    "fake device: `{}` read `{name}` = `{got}` ({} inputs), but its source expects `{}`",
                    v.id,
                    variation.name(),
                    want.join(" ")
                )),
                Err(e) => out.push(format!("fake device: inputs of `{name}`: {e}")),
            }
        }
    }
    out
}

fn fake_comparison(
    buffer: &str,
    dtype: kopt_spec::spec::DType,
    tolerance: kopt_spec::spec::Tolerance,
    n: u64,
    wrong_at: Option<u64>,
    nan: bool,
) -> OutputComparison {
    // The fake's outputs are of order 0.5: its row (the whole buffer) has that RMS, and
    // the allowances are the real rule's for such values.
    let rule = Rule::new(dtype, tolerance, n as usize, None);
    let bad = wrong_at.filter(|i| *i < n).map(|i| BadElement {
        index: i,
        coords: vec![],
        got: 0.0,
        want: 0.5,
        neighbourhood: vec![(i, 0.0, 0.5)],
        allowance: Some(rule.allowance(0.5, 0.5)),
    });
    let nan_bad = nan.then(|| BadElement {
        index: 0,
        coords: vec![],
        got: f64::NAN,
        want: 0.25,
        neighbourhood: vec![(0, f64::NAN, 0.25)],
        allowance: Some(rule.allowance(0.25, 0.5)),
    });
    let failing = u64::from(bad.is_some()) + u64::from(nan_bad.is_some());
    let max_abs_error = if nan {
        f64::INFINITY
    } else if bad.is_some() {
        0.5
    } else {
        1e-7
    };
    // The worst finite element: the wrong one, else one off by the fake's 1e-7.
    let worst_diff = if bad.is_some() {
        0.5
    } else if dtype.is_float() {
        1e-7
    } else {
        0.0
    };
    let worst_allowance = rule.allowance(0.5, 0.5);
    let max_error_ratio = match worst_diff {
        0.0 => 0.0,
        d if worst_allowance.allowed > 0.0 => d / worst_allowance.allowed,
        _ => f64::INFINITY,
    };
    OutputComparison {
        buffer: buffer.to_string(),
        dtype,
        elements: n,
        tolerance,
        failing,
        non_finite: u64::from(nan),
        max_abs_error,
        max_rel_error: if bad.is_some() || nan { 1.0 } else { 1e-6 },
        max_error_ratio,
        worst: (n > 0).then(|| Worst {
            index: wrong_at.filter(|i| *i < n).unwrap_or(0),
            coords: vec![],
            got: 0.5 - worst_diff,
            want: 0.5,
            allowance: worst_allowance,
        }),
        first_bad: nan_bad.or(bad),
    }
}

/// A shape the fake device could not run: its error, nothing measured.
fn shape_error(case: &kopt_spec::shapes::ShapeCase, bytes: u64, error: String) -> ShapeReport {
    ShapeReport {
        label: case.label.clone(),
        held_out: case.held_out,
        bytes,
        flops: None,
        error: Some(error),
        checks: vec![],
        inputs_modified: vec![],
        reference: None,
        candidate: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Seeds, TimingPolicy};
    use crate::verdict::Judge;
    use kopt_spec::shapes::{held_out_shapes, ShapeCase};

    /// A candle-style softmax with a dims array: `rows` sizes the grid only, `block_size`
    /// must equal the block (computed per version), and `info` holds the shape.
    fn spec() -> kopt_spec::KernelSpec {
        let item = kopt_spec::spec::parse_item(
            "fn softmax(s: &CudaStream, info: &CudaSlice<i32>, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, ncols: u32);"
                .parse()
                .unwrap(),
        )
        .unwrap();
        kopt_spec::spec::parse_kernel(
            "reference = \"k.cu\", entry = \"softmax_f32\", info: [2] values(rows, ncols), x: [rows * ncols], y: [rows * ncols], args = (x, y, ncols, block_size: i32 = block_x, info), grid = rows, block = BLOCK, shapes = [{ rows: 8, ncols: 1000 }], tunables = { BLOCK: 256 in [256, 512] }"
                .parse()
                .unwrap(),
            &item,
        )
        .unwrap()
        .0
    }

    fn job(spec: &kopt_spec::KernelSpec, reference: &str, candidate: &str) -> EvalJob {
        let mut r = KernelVersion::reference(spec, reference);
        r.entry = "softmax_f32".into();
        let mut c = r.clone();
        c.id = "wide".into();
        c.source = candidate.into();
        c.defines.insert("BLOCK".into(), 512);
        EvalJob {
            spec: spec.clone(),
            reference: r,
            candidate: c,
            shapes: spec.shapes.iter().map(ShapeCase::declared).collect(),
            seeds: Seeds::from_base(7),
            timing: Some(TimingPolicy::default()),
        }
    }

    #[test]
    fn each_version_is_launched_with_exactly_its_kernel_arguments() {
        let spec = spec();
        let job = job(
            &spec,
            "// kopt-fake: expect-args x y ncols=1000 block_size=256 info\n// kopt-fake: expect-input info 8 1000\n",
            "// kopt-fake: expect-args x y ncols=1000 block_size=512 info\n// kopt-fake: expect-input info 8 1000\n",
        );
        let report = FakeBackend::new().evaluate(&job, &mut |_, _| {});
        assert_eq!(report.shapes.len(), 1);
        assert_eq!(report.shapes[0].error, None, "{:?}", report.shapes[0]);
        let verdict = Judge::new(None).judge(&Ok(report));
        assert!(verdict.accepted, "{:?}", verdict.failures);

        // A version given other arguments than its kernel takes is a launch failure that
        // says what it was given.
        let wrong = job_with_candidate(
            &job,
            "// kopt-fake: expect-args x y ncols=1000 block_size=256 info\n",
        );
        let report = FakeBackend::new().evaluate(&wrong, &mut |_, _| {});
        let error = report.shapes[0].error.clone().unwrap();
        assert!(
            error.contains("`wide` was launched with arguments `x y ncols=1000 block_size=512 info`, but its source expects `x y ncols=1000 block_size=256 info`"),
            "{error}"
        );
        assert!(!Judge::new(None).judge(&Ok(report)).accepted);
        let wrong = job_with_candidate(&job, "// kopt-fake: expect-input info 8 999\n");
        let error = FakeBackend::new().evaluate(&wrong, &mut |_, _| {}).shapes[0]
            .error
            .clone()
            .unwrap();
        assert!(
            error.contains("read `info` = `8 1000` (declared inputs)"),
            "{error}"
        );
    }

    fn job_with_candidate(job: &EvalJob, source: &str) -> EvalJob {
        let mut j = job.clone();
        j.candidate.source = source.into();
        j
    }

    #[test]
    fn fixed_contents_follow_held_out_shapes_and_ignore_seeds() {
        let spec = spec();
        let shapes = held_out_shapes(&spec, None, 3, 3, 1 << 30);
        assert!(!shapes.is_empty());
        for case in shapes {
            let rows = case.values["rows"].as_i64().unwrap();
            let ncols = case.values["ncols"].as_i64().unwrap();
            let mut j = job(&spec, "", "");
            j.shapes = vec![case];
            let expect = format!("// kopt-fake: expect-input info {rows} {ncols}\n// kopt-fake: expect-args x y ncols={ncols} block_size=512 info\n");
            j.candidate.source = expect;
            for base in [1, 2, 3] {
                j.seeds = Seeds::from_base(base);
                let report = FakeBackend::new().evaluate(&j, &mut |_, _| {});
                assert_eq!(report.shapes[0].error, None, "{:?}", report.shapes[0]);
            }
        }
    }

    #[test]
    fn a_computed_argument_outside_its_type_is_a_launch_error() {
        let spec = spec();
        let mut j = job(&spec, "", "");
        // A candidate whose block (2^31 threads: a u32, so a geometry) does not fit the
        // kernel's `int block_size`.
        j.candidate.launch.block[0] = kopt_spec::expr::Expr::Binary(
            kopt_spec::expr::BinOp::Mul,
            Box::new(kopt_spec::expr::Expr::Var("BLOCK".into())),
            Box::new(kopt_spec::expr::Expr::Int(1 << 22)),
        );
        let report = FakeBackend::new().evaluate(&j, &mut |_, _| {});
        let error = report.shapes[0].error.clone().unwrap();
        assert_eq!(
            error,
            "candidate arguments: computed argument `block_size` = `block_x` is 2147483648, outside the range of i32"
        );
        let verdict = Judge::new(None).judge(&Ok(report));
        assert!(!verdict.accepted);
    }
}
