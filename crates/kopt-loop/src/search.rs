//! `cargo kopt search` and `cargo kopt search-bench`: the search of `kopt-search` over a
//! gathered kernel, evaluated by the engine.
//!
//! - Points are compiled on CPU threads ([`NvrtcCompiler`]: the compile fence of
//!   `kopt_engine::precompile`, a cubin for the device's `sm_XY` with the entry confirmed
//!   in the module; the fake device's pseudo-compiler under `KOPT_WORKER=fake`), and the
//!   worker loads the code instead of compiling ([`KernelVersion::cubin`]); a point that
//!   does not compile is a compile failure that no worker sees.
//! - Each point is evaluated by one engine job on the declared shapes (checks on fresh
//!   inputs, then timing against the reference in the same job) with a lighter timing
//!   policy than `verify` ([`search_timing`]); the best point (and the best of each
//!   shape) is then verified in full: held-out shapes chosen for its own defines, the
//!   default timing policy, every fence.
//! - `--seeded` derives [`SnapshotHints`] from the reference's own evaluation (registers,
//!   occupancy, effective bandwidth and grid size of the shape that takes the reference
//!   longest) and the widest global load of its PTX, and seeds the search with the
//!   built-in heuristic's matrix; `--matrix FILE` takes an agent's matrix instead,
//!   `--hints FILE` a profiler's snapshot (`cargo kopt profile`'s `snapshot.json`, read by
//!   [`hints_from_snapshot`]) or the hints themselves.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use kopt_engine::engine::Engine;
use kopt_engine::job::{KernelVersion, TimingPolicy};
use kopt_engine::protocol::{Ceilings, DeviceInfo};
use kopt_engine::verdict::{Fence, Judge, Verdict};
use kopt_search::bench::{self, Landscape, Row};
use kopt_search::interesting::Interesting;
use kopt_search::journal::{self, Header, SearchJournal};
use kopt_search::run::{
    self, Both, Budget, Compiled, Compiler, Control, Evaluator, Observer, PointOutcome, PointSpec,
    Prior, Record, Settings, Status, Summary,
};
use kopt_search::seed::{self, Bottleneck, Guide, ParameterMatrix, SnapshotHints};
use kopt_search::space::{Limits, OptionAxes, Space};
use kopt_search::strategy::{MakeStrategy, StrategyKind};
use kopt_spec::shapes::{held_out_byte_cap, held_out_shapes_for};
use kopt_store::KoptDir;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::eval::{self, kopt_dir};
use kopt_workspace::gather::{Gathered, Kernel};

/// The timing policy of search evaluations: fewer samples than `verify` (a point is
/// compared with the reference timed in the same job, alternating, so drift cancels),
/// shorter graph replays (at least 100 µs, and at least one launch per cold input set,
/// with no 32-launch minimum),
/// at most half a second per shape.
pub fn search_timing() -> TimingPolicy {
    TimingPolicy {
        warmup: 3,
        min_samples: 7,
        max_samples: 60,
        target_spread: 0.02,
        max_seconds: 0.5,
        graph_target_us: 100.0,
        // A point and the reference are timed in one job with the same graph length:
        // short graphs keep the search cheap and the comparison fair.
        min_graph_launches: 1,
        max_input_sets: 64,
    }
}

/// The widest global load in PTX, in bytes per thread (`ld.global.nc.v4.f32`: 16).
pub fn ptx_global_load_bytes(ptx: &str) -> Option<u32> {
    let mut widest: Option<u32> = None;
    for line in ptx.lines() {
        let Some(at) = line.find("ld.global") else {
            continue;
        };
        let op = line[at..].split_whitespace().next().unwrap_or("");
        let mut vec = 1u32;
        let mut size = 0u32;
        for q in op.split('.').skip(2) {
            match q {
                "v2" => vec = 2,
                "v4" => vec = 4,
                "v8" => vec = 8,
                _ => {
                    let bits = q
                        .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                        .parse::<u32>()
                        .ok()
                        .filter(|_| matches!(q.as_bytes()[0], b'f' | b'b' | b'u' | b's'));
                    if let Some(b) = bits {
                        size = b / 8;
                    }
                }
            }
        }
        if size > 0 {
            widest = Some(widest.unwrap_or(0).max(vec * size));
        }
    }
    widest
}

/// Compiles points on CPU threads: NVRTC, or the fake device's compiler.
pub struct NvrtcCompiler {
    /// The kernel's name (NVRTC names the program after it).
    pub kernel: String,
    /// The version points vary (the reference, or the candidate searched around).
    pub template: KernelVersion,
    /// The spec's own NVRTC options (every point carries them already).
    pub spec_options: Vec<String>,
    pub cc: (i32, i32),
    pub fake: bool,
    /// Hand the worker a point's PTX (loaded through the driver, as the generated
    /// launcher loads a variant's verified PTX) rather than its cubin (loaded without the
    /// driver's JIT: quicker for a search over many points). The optimisation loop's
    /// matrices hand PTX, so that a winning point keeps the PTX that was verified.
    pub hand_ptx: bool,
}

/// The version a point stands for: `base` (the reference, or the candidate searched
/// around) with the point's defines over the base's, and the point's options followed by
/// the base's own options that the spec does not already give.
pub fn point_version(
    base: &KernelVersion,
    spec_options: &[String],
    p: &PointSpec,
) -> KernelVersion {
    let mut defines = base.defines.clone();
    defines.extend(p.defines.iter().map(|(k, v)| (k.clone(), *v)));
    let mut options = p.options.clone();
    for o in &base.options {
        if !spec_options.contains(o) && !options.contains(o) {
            options.push(o.clone());
        }
    }
    KernelVersion {
        id: p.label.clone(),
        defines,
        options,
        ptx: None,
        cubin: None,
        symbol: None,
        ..base.clone()
    }
}

impl NvrtcCompiler {
    fn version(&self, p: &PointSpec) -> KernelVersion {
        point_version(&self.template, &self.spec_options, p)
    }

    /// Compiles a version for the worker's exact architecture (a cubin, so that the
    /// worker loads it without the driver's PTX JIT), or the fake device's pseudo-PTX:
    /// the compile fence on the CPU ([`kopt_engine::precompile`]), so that a point that
    /// does not compile, or whose module lacks the entry, never reaches the worker.
    pub fn compile_version(&self, v: &KernelVersion) -> Result<CompiledCode> {
        let arch = kopt_spec::files::arch_name(self.cc.0 as u32, self.cc.1 as u32);
        kopt_engine::precompile::precompile(&self.kernel, v, &arch, self.fake)
            .map(|p| CompiledCode {
                ptx: p.ptx,
                cubin: p.cubin,
                symbol: p.symbol,
            })
            .map_err(|why| Error::Kernel(why.message().to_string()))
    }
}

/// What the compile pool hands the worker: machine code on a GPU, the fake device's
/// pseudo-PTX on the fake one; PTX where NVRTC gave it, for the load-width hint.
#[derive(Debug, Clone)]
pub struct CompiledCode {
    pub ptx: Option<String>,
    pub cubin: Option<Vec<u8>>,
    /// The entry's lowered name where it differs from the version's entry.
    pub symbol: Option<String>,
}

impl CompiledCode {
    /// Attaches the code to `v` for the worker to load instead of compiling: the cubin
    /// where there is one, else the PTX.
    pub fn attach(&self, v: &mut KernelVersion) {
        match &self.cubin {
            Some(c) => v.set_cubin(c),
            None => v.ptx = self.ptx.clone(),
        }
        v.symbol = self.symbol.clone();
    }

    /// Attaches the PTX only (where NVRTC gave one, else the cubin): what a variant's
    /// verification loads, so that the PTX kept with it is the one that was verified.
    pub fn attach_ptx(&self, v: &mut KernelVersion) {
        match &self.ptx {
            Some(p) => {
                v.ptx = Some(p.clone());
                v.symbol = self.symbol.clone();
            }
            None => self.attach(v),
        }
    }

    /// One string for the search's compile pool: the base64 cubin, or the PTX.
    fn to_pool(&self, v: &mut KernelVersion, hand_ptx: bool) -> String {
        if hand_ptx {
            self.attach_ptx(v);
        } else {
            self.attach(v);
        }
        v.cubin
            .clone()
            .or_else(|| v.ptx.clone())
            .unwrap_or_default()
    }
}

impl Compiler for NvrtcCompiler {
    fn compile(&self, p: &PointSpec) -> Compiled {
        let t = Instant::now();
        let mut v = self.version(p);
        match self.compile_version(&v) {
            Ok(compiled) => {
                let mut metrics = BTreeMap::new();
                if let Some(b) = compiled.ptx.as_deref().and_then(ptx_global_load_bytes) {
                    metrics.insert("global_load_bytes".into(), f64::from(b));
                }
                Compiled::Ok {
                    code: compiled.to_pool(&mut v, self.hand_ptx),
                    seconds: t.elapsed().as_secs_f64(),
                    metrics,
                }
            }
            Err(log) => Compiled::Failed {
                log: log.to_string(),
                seconds: t.elapsed().as_secs_f64(),
            },
        }
    }
}

/// The engine as the search's evaluator.
pub struct EngineEvaluator<'a> {
    pub g: &'a Gathered,
    pub k: &'a Kernel,
    pub engine: Engine,
    pub settings: eval::Settings,
    pub judge: Judge,
    pub device: DeviceInfo,
    pub compiler: Arc<NvrtcCompiler>,
    /// The reference, with its PTX compiled once.
    pub reference: KernelVersion,
    /// What points vary: the reference, or a candidate ([`EngineEvaluator::around`]).
    pub base: KernelVersion,
    /// Wall seconds per worker step (`compile`, `check (declared)`, `timing`...), summed
    /// over every evaluation: where the device side spends its time.
    pub steps: BTreeMap<String, f64>,
}

impl<'a> EngineEvaluator<'a> {
    pub fn new(
        g: &'a Gathered,
        k: &'a Kernel,
        mut engine: Engine,
        settings: eval::Settings,
    ) -> Result<Self> {
        let device = engine.device()?;
        let ceilings = engine.ceilings(false).ok();
        let fake = engine.worker.command().is_fake();
        let template = KernelVersion::reference(&k.spec, &k.reference.text);
        let compiler = Arc::new(NvrtcCompiler {
            kernel: k.spec.name.clone(),
            template: template.clone(),
            spec_options: k.spec.options.clone(),
            cc: (
                device.compute_capability.0 as i32,
                device.compute_capability.1 as i32,
            ),
            fake,
            hand_ptx: false,
        });
        let base = template.clone();
        let mut reference = template;
        compiler
            .compile_version(&reference)
            .map_err(|log| {
                Error::Kernel(format!(
                    "the reference of `{}` does not compile: {}",
                    k.spec.name,
                    log.to_string()
                        .lines()
                        .take(6)
                        .collect::<Vec<_>>()
                        .join("\n")
                ))
            })?
            .attach(&mut reference);
        let mut judge = Judge::new(ceilings);
        judge.threshold = settings.threshold;
        Ok(EngineEvaluator {
            g,
            k,
            engine,
            settings,
            judge,
            device,
            compiler,
            reference,
            base,
            steps: BTreeMap::new(),
        })
    }

    /// Searches around `base` (a candidate's source, launch rule, defines and options)
    /// instead of the reference; the reference stays what every point is checked and
    /// timed against.
    pub fn around(mut self, base: KernelVersion) -> Self {
        self.compiler = Arc::new(NvrtcCompiler {
            kernel: self.k.spec.name.clone(),
            template: base.clone(),
            spec_options: self.k.spec.options.clone(),
            cc: self.compiler.cc,
            fake: self.compiler.fake,
            hand_ptx: false,
        });
        self.base = base;
        self
    }

    pub fn ceilings(&self) -> Option<&Ceilings> {
        self.judge.ceilings.as_ref()
    }

    fn version(&self, p: &PointSpec, code: Option<&str>) -> KernelVersion {
        let mut v = point_version(&self.base, &self.k.spec.options, p);
        if self.compiler.fake {
            v.ptx = code.map(String::from);
        } else {
            v.cubin = code.map(String::from);
        }
        v
    }

    /// A search evaluation: the declared shapes, the settings' timing policy.
    fn evaluate_version(
        &mut self,
        v: KernelVersion,
        progress: &mut dyn FnMut(&str),
    ) -> (PointOutcome, Verdict) {
        let mut job = eval::job(self.g, self.k, v, None, &self.settings, true);
        job.reference = self.reference.clone();
        let t = Instant::now();
        let mut last = (Instant::now(), "sending the job".to_string());
        let steps = &mut self.steps;
        let ev = self.engine.evaluate(&job, &mut |m: &str| {
            *steps.entry(last.1.clone()).or_default() += last.0.elapsed().as_secs_f64();
            let kind = m.rsplit(": ").next().unwrap_or(m).to_string();
            last = (Instant::now(), kind);
            progress(m)
        });
        *steps.entry(last.1).or_default() += last.0.elapsed().as_secs_f64();
        let verdict = self.judge.judge(&ev.report);
        let mut o = outcome(&self.k.spec, &self.device, &ev.report, &verdict);
        o.seconds = t.elapsed().as_secs_f64();
        o.cached = ev.cached;
        (o, verdict)
    }

    /// The full verification of one point: held-out shapes valid for its defines, the
    /// default timing policy, every fence. Returns the job too: its shapes and seeds are
    /// a saved winner's evidence.
    pub fn verify(
        &mut self,
        p: &PointSpec,
        progress: &mut dyn FnMut(&str),
    ) -> (Verdict, kopt_engine::job::EvalJob) {
        let mut v = self.version(p, None);
        let compiled = self.compiler.compile_version(&v);
        if let Ok(code) = &compiled {
            code.attach_ptx(&mut v);
        }
        let settings = eval::Settings {
            timing: TimingPolicy::default(),
            held_out_per_shape: 0,
            ..self.settings.clone()
        };
        let mut job = eval::job(self.g, self.k, v, None, &settings, true);
        job.reference = self.reference.clone();
        let spec = &self.k.spec;
        let salt = kopt_engine::engine::seed_salt(&kopt_dir(self.g));
        let defines = job.candidate.defines.clone();
        job.shapes.extend(held_out_shapes_for(
            spec,
            &defines,
            None,
            salt ^ 0x5EED,
            1,
            held_out_byte_cap(spec),
        ));
        if let Err(log) = compiled {
            return (Verdict::compile_rejected(&log.to_string()), job);
        }
        let ev = self.engine.evaluate(&job, progress);
        let mut verdict = self.judge.judge(&ev.report);
        // What may become a pending winner goes through compute-sanitizer, as the loop's do.
        if verdict.accepted && self.settings.sanitize {
            progress(&format!(
                "compute-sanitizer ({})",
                kopt_engine::sanitizer::TOOLS.join(", ")
            ));
            let scratch = kopt_dir(self.g)
                .join("sanitizer")
                .join(&self.k.spec.name)
                .join(&job.candidate.id);
            let run =
                kopt_engine::sanitizer::sanitize(self.engine.worker.command(), &job, &scratch);
            kopt_engine::sanitizer::apply(&mut verdict, run);
        }
        (verdict, job)
    }
}

/// The outcome of a search evaluation: failed on any fence but the watchdog (a slower
/// point is a valid point with a higher cost), else the weighted geometric mean of the
/// point's time over the reference's on each timed declared shape.
fn outcome(
    spec: &kopt_spec::KernelSpec,
    device: &DeviceInfo,
    report: &Result<kopt_engine::protocol::EvalReport, kopt_engine::parent::WorkerFailure>,
    verdict: &Verdict,
) -> PointOutcome {
    let failure = verdict.failures.iter().find(|f| f.fence != Fence::Watchdog);
    let mut o = match failure {
        Some(f) => PointOutcome::failed(
            Status::Failed,
            f.fence.name(),
            format!(
                "{}{}",
                f.shape
                    .as_ref()
                    .map(|s| format!("[{s}] "))
                    .unwrap_or_default(),
                f.message
            ),
        ),
        None => {
            let weights: BTreeMap<String, f64> = spec
                .shapes
                .iter()
                .map(|s| (kopt_spec::spec::shape_label(s), s.weight))
                .collect();
            let mut log_sum = 0.0;
            let mut w_sum = 0.0;
            for f in verdict.shapes.iter().filter(|f| !f.held_out) {
                if let (Some(r), Some(c)) = (f.reference_us, f.candidate_us) {
                    let w = weights.get(&f.shape).copied().unwrap_or(1.0);
                    log_sum += w * (c / r).ln();
                    w_sum += w;
                }
            }
            if w_sum > 0.0 {
                PointOutcome::passed((log_sum / w_sum).exp())
            } else {
                PointOutcome::failed(
                    Status::Failed,
                    "timing",
                    "no declared shape was timed".into(),
                )
            }
        }
    };
    for f in verdict.shapes.iter().filter(|f| !f.held_out) {
        if let Some(c) = f.candidate_us {
            o.shapes_us.insert(f.shape.clone(), c);
        }
        if let Some(r) = f.reference_us {
            o.reference_us.insert(f.shape.clone(), r);
        }
    }
    // Metrics of the shape that takes the reference longest (the snapshot's focus).
    let focus = verdict
        .shapes
        .iter()
        .filter(|f| !f.held_out)
        .max_by(|a, b| {
            a.reference_us
                .unwrap_or(0.0)
                .total_cmp(&b.reference_us.unwrap_or(0.0))
        });
    if let Some(f) = focus {
        if let Some(v) = f.occupancy_pct {
            o.metrics.insert("occupancy_pct".into(), v);
        }
        if let Some(v) = f.copy_bandwidth_pct {
            o.metrics.insert("copy_bandwidth_pct".into(), v);
        }
        if let Ok(r) = report {
            if let Some(g) = r
                .shapes
                .iter()
                .find(|s| s.label == f.shape)
                .and_then(|s| s.candidate.as_ref())
            {
                let blocks: f64 = g.geometry.grid.iter().map(|x| f64::from(*x)).product();
                o.metrics.insert(
                    "grid_blocks_per_sm".into(),
                    blocks / f64::from(device.multiprocessors.max(1)),
                );
            }
        }
    }
    if let Ok(r) = report {
        if let Some(a) = r.candidate.attributes {
            o.metrics.insert("registers".into(), f64::from(a.registers));
            o.metrics
                .insert("local_bytes".into(), f64::from(a.local_bytes));
        }
    }
    o
}

impl Evaluator for EngineEvaluator<'_> {
    fn compiler(&self) -> Option<Arc<dyn Compiler>> {
        Some(self.compiler.clone())
    }

    fn evaluate(
        &mut self,
        p: &PointSpec,
        compiled: Option<&Compiled>,
        progress: &mut dyn FnMut(&str),
    ) -> PointOutcome {
        let code = match compiled {
            Some(Compiled::Ok { code, .. }) => Some(code.as_str()),
            _ => None,
        };
        let v = self.version(p, code);
        self.evaluate_version(v, progress).0
    }
}

/// A snapshot from the reference's own evaluation: the bottleneck of the shape that
/// takes it longest.
pub fn hints_from_reference(reference: &PointOutcome) -> SnapshotHints {
    let m = &reference.metrics;
    let get = |k: &str| m.get(k).copied();
    let occupancy = get("occupancy_pct");
    let registers = get("registers").map(|v| v as u32);
    let bw = get("copy_bandwidth_pct");
    let class = if occupancy.is_some_and(|o| o < 50.0) && registers.is_some_and(|r| r > 64) {
        Bottleneck::OccupancyLimited
    } else if bw.is_some_and(|b| b >= 60.0) {
        Bottleneck::MemoryBound
    } else if bw.is_some() {
        Bottleneck::LatencyBound
    } else {
        Bottleneck::Unknown
    };
    SnapshotHints {
        class,
        occupancy_pct: occupancy,
        registers,
        local_bytes: get("local_bytes").map(|v| v as u32),
        global_load_bytes: get("global_load_bytes").map(|v| v as u32),
        grid_blocks_per_sm: get("grid_blocks_per_sm"),
        copy_bandwidth_pct: bw,
    }
}

/// The hints of a profiler's bottleneck snapshot (`cargo kopt profile`'s `snapshot.json`):
/// its classification, achieved occupancy where Nsight Compute measured it (else the
/// driver's theoretical figure), registers, local bytes, the widest global load, and the
/// grid over `multiprocessors`.
pub fn hints_from_snapshot(
    snap: &kopt_profile::snapshot::Snapshot,
    multiprocessors: u32,
) -> SnapshotHints {
    let get = |k: &str| snap.measurements.get(k).map(|m| m.value);
    let class = match snap.classification.as_ref().map(|c| c.class.as_str()) {
        Some("memory-bound") => Bottleneck::MemoryBound,
        Some("latency-bound") => Bottleneck::LatencyBound,
        Some("compute-bound") => Bottleneck::ComputeBound,
        Some("occupancy-limited") => Bottleneck::OccupancyLimited,
        Some("shared-memory-bank-bound") => Bottleneck::SharedMemoryBankBound,
        Some("launch-bound") => Bottleneck::LaunchBound,
        _ => Bottleneck::Unknown,
    };
    SnapshotHints {
        class,
        occupancy_pct: get("occupancy_achieved_pct").or_else(|| get("occupancy_theoretical_pct")),
        registers: get("registers").map(|v| v as u32),
        local_bytes: get("local_bytes").map(|v| v as u32),
        global_load_bytes: get("global_load_bits").map(|v| (v / 8.0) as u32),
        grid_blocks_per_sm: get("blocks")
            .filter(|_| multiprocessors > 0)
            .map(|b| b / f64::from(multiprocessors)),
        copy_bandwidth_pct: get("copy_bw_pct"),
    }
}

/// `--hints FILE`: a profiler's `snapshot.json` of this kernel, or `SnapshotHints` JSON.
fn read_hints(path: &Path, kernel: &str, multiprocessors: u32) -> Result<SnapshotHints> {
    let value: serde_json::Value = read_json(path, "snapshot hints")?;
    if value.get("collectors").is_none() {
        return serde_json::from_value(value).map_err(|e| {
            let message = format!(
                "{}: neither a profiler's snapshot.json (`cargo kopt profile`) nor snapshot hints ({e})",
                path.display()
            );
            Error::file(path, message, e)
        });
    }
    let snap: kopt_profile::snapshot::Snapshot = serde_json::from_value(value).map_err(|e| {
        let message = format!("{}: not a readable snapshot.json ({e})", path.display());
        Error::file(path, message, e)
    })?;
    if snap.kernel != kernel {
        return Err(Error::Invalid(format!(
            "{} is a snapshot of `{}`, not of `{kernel}`: profile this kernel with `cargo kopt profile {kernel}`",
            path.display(),
            snap.kernel
        )));
    }
    Ok(hints_from_snapshot(&snap, multiprocessors))
}

// ---------------------------------------------------------------------------------------
// The command.

/// What `cargo kopt search` was asked.
#[derive(Debug, Clone)]
pub struct SearchOptions {
    pub strategy: StrategyKind,
    pub seeded: bool,
    pub matrix: Option<PathBuf>,
    pub hints: Option<PathBuf>,
    pub budget_evals: Option<usize>,
    pub budget_seconds: Option<f64>,
    pub seed: u64,
    pub options: OptionAxes,
    pub resume: Option<String>,
    pub keep_rounds: usize,
    pub threads: Option<usize>,
    pub eval: eval::Settings,
    pub step_timeout: u64,
    /// Skip the full verification of the best points.
    pub no_verify: bool,
    /// Search around this candidate instead of the reference.
    pub base: Option<SearchBase>,
    /// Save a verified winner that beats the base as a pending variant.
    pub save: Option<SaveWinner>,
}

/// A candidate to search around.
#[derive(Debug, Clone)]
pub struct SearchBase {
    /// Its source, launch rule, defines and options; its defines become the space's
    /// starting point.
    pub version: KernelVersion,
    /// The agent's reasons for it, which a saved winner's rationale cites.
    pub proposal: Option<kopt_agent::proposal::Proposal>,
    /// Its verified speedup over the reference (geometric mean over the declared shapes;
    /// 1 for the reference): a winner must beat it to be saved.
    pub gain_over_reference: f64,
}

/// How a winner is saved as a pending variant.
#[derive(Debug, Clone)]
pub struct SaveWinner {
    /// Who found it (`search`, `mcp:NAME`), as the rationale's agent.
    pub agent: String,
    /// The winner must beat the base by this fraction (geometric mean over the shapes).
    pub min_gain: f64,
}

/// The spec the space is built from when searching around `base`: its launch rule, and
/// each tunable's default moved to the base's value (added to the values when missing),
/// so that strategies start at the base and the space's launch checks are the base's.
pub fn spec_around(spec: &kopt_spec::KernelSpec, base: &KernelVersion) -> kopt_spec::KernelSpec {
    let mut s = spec.clone();
    s.launch = base.launch.clone();
    for t in &mut s.tunables {
        if let Some(v) = base.defines.get(&t.name) {
            if !t.values.contains(v) {
                t.values.push(*v);
            }
            t.default = *v;
        }
    }
    s
}

/// A row of the leaderboard.
#[derive(Debug, Clone, Serialize)]
pub struct Placed {
    pub label: String,
    pub cost: f64,
    /// Reference time over the point's (geometric mean over shapes).
    pub speedup: f64,
    pub shapes_us: BTreeMap<String, f64>,
    pub reference_us: BTreeMap<String, f64>,
}

/// The best of one declared shape.
#[derive(Debug, Clone, Serialize)]
pub struct ShapeBest {
    pub shape: String,
    pub label: String,
    pub us: f64,
    pub reference_us: Option<f64>,
    /// `accepted`, or the full verification's main failure.
    pub verified: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct SearchReport {
    pub package: String,
    pub kernel: String,
    pub run_id: String,
    pub journal: PathBuf,
    pub device: DeviceInfo,
    pub strategy: StrategyKind,
    pub seed: u64,
    pub seeded: bool,
    pub space: SpaceSummary,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hints: Option<SnapshotHints>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matrix: Option<ParameterMatrix>,
    pub stop: String,
    pub evaluations: usize,
    pub replayed: usize,
    pub compile_failures: usize,
    pub failures: usize,
    pub seconds: f64,
    pub evaluations_per_second: f64,
    pub dropped: Vec<String>,
    pub interesting: Vec<(String, String)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best: Option<Placed>,
    /// The full verification of the best point.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_verified: Option<Verdict>,
    pub per_shape: Vec<ShapeBest>,
    pub leaderboard: Vec<Placed>,
    /// `package/kernel/arch` of the winner saved as a pending variant (`--save`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<String>,
    /// The saved winner itself, for callers that build on it (the MCP session).
    #[serde(skip)]
    pub saved: Option<Saved>,
}

/// A search winner saved as a pending variant.
#[derive(Debug, Clone)]
pub struct Saved {
    /// `package/kernel/arch`.
    pub label: String,
    pub version: KernelVersion,
    /// The reasons its rationale cites.
    pub proposal: kopt_agent::proposal::Proposal,
}

#[derive(Debug, Clone, Serialize)]
pub struct SpaceSummary {
    pub axes: Vec<String>,
    pub raw: u64,
    pub valid: usize,
    pub pruned: kopt_search::space::Pruned,
}

fn space_summary(space: &Space) -> SpaceSummary {
    SpaceSummary {
        axes: space
            .axes
            .iter()
            .map(|a| format!("{} {:?}", a.name, a.values))
            .collect(),
        raw: space.raw,
        valid: space.len(),
        pruned: space.pruned.clone(),
    }
}

fn placed(r: &Record) -> Option<Placed> {
    let c = r.outcome.cost?;
    Some(Placed {
        label: r.label.clone(),
        cost: c,
        speedup: 1.0 / c,
        shapes_us: r.outcome.shapes_us.clone(),
        reference_us: r.outcome.reference_us.clone(),
    })
}

/// What a search reports while it runs, for whoever shows it (the CLI's progress bar):
/// the points it will evaluate, each point done with the best so far, what the device is
/// doing, and the end. Every method has a default that ignores the event.
pub trait SearchObserver {
    /// The run will evaluate at most `points` points.
    fn started(&mut self, _points: u64) {}
    /// One point evaluated; `best` is the best so far.
    fn point_done(&mut self, _r: &Record, _best: Option<&Record>) {}
    /// What the driver or the device is doing.
    fn message(&mut self, _message: &str) {}
    /// The run is over: nothing more will be reported.
    fn finished(&mut self) {}
}

/// Observes nothing (the MCP server's searches, `--message-format json`).
pub struct Unobserved;
impl SearchObserver for Unobserved {}

/// A [`SearchObserver`] as the search driver's [`Observer`].
struct Watch<'a>(&'a mut dyn SearchObserver);

impl Observer for Watch<'_> {
    fn record(&mut self, _space: &Space, r: &Record, best: Option<&Record>) -> Control {
        self.0.point_done(r, best);
        Control::Continue
    }

    fn progress(&mut self, message: &str) {
        self.0.message(message);
    }
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        let message = format!("cannot read {what} {}: {e}", path.display());
        Error::file(path, message, e)
    })?;
    serde_json::from_str(&text).map_err(|e| {
        let message = format!("{}: not {what} ({e})", path.display());
        Error::file(path, message, e)
    })
}

/// Builds the evaluator, the space and (seeded) the guide.
fn setup<'a>(
    g: &'a Gathered,
    k: &'a Kernel,
    eval_settings: &eval::Settings,
    step_timeout: u64,
    options: &OptionAxes,
    base: Option<&KernelVersion>,
) -> Result<(EngineEvaluator<'a>, Space)> {
    let mut engine = eval::engine(g, eval_settings)?;
    engine.worker.step_timeout = std::time::Duration::from_secs(step_timeout);
    let mut ev = EngineEvaluator::new(g, k, engine, eval_settings.clone())?;
    let spec = match base {
        Some(b) => {
            ev = ev.around(b.clone());
            spec_around(&k.spec, b)
        }
        None => k.spec.clone(),
    };
    let space = Space::build(&spec, &Limits::from_device(&ev.device), options)
        .map_err(|e| Error::Kernel(e.to_string()))?;
    Ok((ev, space))
}

/// The reference's point evaluated, for the snapshot.
fn measure_reference(
    ev: &mut EngineEvaluator<'_>,
    space: &Space,
    progress: &mut dyn FnMut(&str),
) -> Result<PointOutcome> {
    let p = match space.default_point() {
        Some(id) => PointSpec::of(space, id),
        None => PointSpec {
            id: usize::MAX,
            label: "reference".into(),
            defines: ev.reference.defines.clone(),
            options: ev.reference.options.clone(),
        },
    };
    let compiled = ev.compiler.compile(&p);
    let mut o = ev.evaluate(&p, Some(&compiled), progress);
    if let Compiled::Ok { metrics, .. } = &compiled {
        for (k, v) in metrics {
            o.metrics.entry(k.clone()).or_insert(*v);
        }
    }
    if o.cost.is_none() {
        return Err(Error::Kernel(format!(
            "the reference of `{}` does not pass its own evaluation ({}: {}): fix the kernel or its annotation first (`cargo kopt verify` shows the details)",
            ev.k.spec.name,
            o.failure.as_deref().unwrap_or("?"),
            o.detail.lines().next().unwrap_or("")
        )));
    }
    Ok(o)
}

fn guide_for(
    space: &Space,
    spec: &kopt_spec::KernelSpec,
    hints: Option<&SnapshotHints>,
    matrix: Option<ParameterMatrix>,
) -> Result<Option<Guide>> {
    let m = match (matrix, hints) {
        (Some(m), _) => m,
        (None, Some(h)) => seed::heuristic(space, spec, h),
        (None, None) => return Ok(None),
    };
    Guide::new(space, m).map(Some).map_err(Error::Search)
}

fn evaluation_json(settings: &eval::Settings, spec: &kopt_spec::KernelSpec) -> serde_json::Value {
    serde_json::json!({
        "timing": settings.timing,
        "shapes": spec.shapes.iter().map(kopt_spec::spec::shape_label).collect::<Vec<_>>(),
        "cache": settings.use_cache,
    })
}

/// `cargo kopt search`.
pub fn search(
    g: &Gathered,
    k: &Kernel,
    o: &SearchOptions,
    progress: &mut dyn SearchObserver,
) -> Result<SearchReport> {
    let mut eval_settings = o.eval.clone();
    eval_settings.timing = search_timing();
    eval_settings.held_out_per_shape = 0;
    let (mut ev, mut space) = setup(
        g,
        k,
        &eval_settings,
        o.step_timeout,
        &o.options,
        o.base.as_ref().map(|b| &b.version),
    )?;
    let kopt = KoptDir::new(&g.target_dir);
    let run_id = o
        .resume
        .clone()
        .unwrap_or_else(kopt_store::layout::new_run_id);
    let seeded = o.seeded || o.matrix.is_some() || o.hints.is_some();
    // The seed: recorded in the journal, so that a resumed run reuses it.
    let recorded = match &o.resume {
        Some(id) => Some(journal::read_header(&kopt, id).map_err(Error::Search)?),
        None => None,
    };
    let (hints, matrix) = match &recorded {
        Some(h) => (h.hints.clone(), h.matrix.clone()),
        None if seeded => {
            let matrix: Option<ParameterMatrix> = match &o.matrix {
                Some(p) => Some(read_json(p, "a parameter matrix")?),
                None => None,
            };
            let hints = match (&o.hints, &matrix) {
                (Some(p), _) => Some(read_hints(p, &k.spec.name, ev.device.multiprocessors)?),
                (None, Some(_)) => None,
                (None, None) => {
                    progress.message("measuring the reference for the seed");
                    let r = measure_reference(&mut ev, &space, &mut |m| progress.message(m))?;
                    Some(hints_from_reference(&r))
                }
            };
            let guide = guide_for(&space, &k.spec, hints.as_ref(), matrix)?;
            (hints, guide.map(|g| g.matrix))
        }
        None => (None, None),
    };
    let guide = match &matrix {
        Some(m) => Some(Guide::new(&space, m.clone()).map_err(Error::Search)?),
        None => None,
    };
    let header = Header {
        kind: "search".into(),
        package: k.package.clone(),
        kernel: k.spec.name.clone(),
        strategy: o.strategy,
        seed: o.seed,
        seeded,
        space: space.fingerprint().into(),
        points: space.len(),
        options: o.options.clone(),
        device: ev.device.identity(),
        evaluation: evaluation_json(&eval_settings, &k.spec),
        hints: hints.clone(),
        matrix: matrix.clone(),
    };
    let budget = Budget {
        evaluations: o.budget_evals.or(match (o.strategy, o.budget_seconds) {
            (StrategyKind::Exhaustive, _) | (_, Some(_)) => None,
            _ => Some(space.len().min(100)),
        }),
        seconds: o.budget_seconds,
        target_cost: None,
    };
    let (mut j, prior) = match &o.resume {
        Some(id) => SearchJournal::resume(&kopt, id, &header, &space).map_err(Error::Search)?,
        None => (
            SearchJournal::create(&kopt, &run_id, &header, &budget).map_err(Error::Search)?,
            Prior::default(),
        ),
    };
    let interesting = match &guide {
        Some(gd) => Interesting::new(
            gd.goals().to_vec(),
            hints.as_ref().map(|h| h.metrics()).unwrap_or_default(),
            o.keep_rounds,
        ),
        None => Interesting::none(),
    };
    let mut settings = Settings {
        budget,
        ..Settings::default()
    };
    if let Some(t) = o.threads {
        settings.compile_threads = t.max(1);
    }
    progress.started(
        settings
            .budget
            .evaluations
            .unwrap_or(space.len())
            .min(space.len()) as u64,
    );
    let mut strategy = o.strategy.make(o.seed);
    let summary = {
        let mut watch = Watch(&mut *progress);
        let mut both = Both(&mut j, &mut watch);
        run::run(
            &mut space,
            strategy.as_mut(),
            &mut ev,
            guide.as_ref(),
            interesting,
            &settings,
            prior,
            &mut both,
        )
    };
    if let Some(e) = j.error.take() {
        progress.finished();
        return Err(Error::Search(e));
    }
    j.finish(&summary).map_err(Error::Search)?;
    // Full verification of the best point and of each shape's best.
    let mut per_shape = best_per_shape(&summary);
    let mut best_verified = None;
    let mut best_job = None;
    if !o.no_verify {
        let mut verified: HashMap<String, Verdict> = HashMap::new();
        let mut labels: Vec<(usize, String)> = Vec::new();
        if let Some(b) = summary.best_record() {
            labels.push((b.id, b.label.clone()));
        }
        for s in &per_shape {
            if let Some(r) = summary.records.iter().find(|r| r.label == s.label) {
                if !labels.iter().any(|(_, l)| l == &s.label) {
                    labels.push((r.id, r.label.clone()));
                }
            }
        }
        for (id, label) in labels {
            progress.message(&format!("verifying {label} in full"));
            let (v, job) = ev.verify(&PointSpec::of(&space, id), &mut |m| progress.message(m));
            if summary.best_record().is_some_and(|b| b.id == id) {
                best_job = Some(job);
            }
            verified.insert(label, v);
        }
        for s in &mut per_shape {
            s.verified = verified.get(&s.label).map(|v| v.summary());
        }
        best_verified = summary
            .best_record()
            .and_then(|b| verified.remove(&b.label));
    }
    progress.finished();
    let pending = match (&o.save, &best_verified, &best_job, summary.best_record()) {
        (Some(save), Some(verdict), Some(job), Some(best)) => save_winner(
            g,
            k,
            &mut ev,
            &space,
            WinnerFound {
                best,
                verdict,
                job,
                base: o.base.as_ref(),
                save,
                run_id: j.run_id(),
                journal: j.dir(),
                evaluations: summary.evaluations,
                seconds: summary.seconds,
            },
        )?,
        _ => None,
    };
    ev.engine.worker.shutdown();
    let mut r = report(
        k,
        &space,
        &ev.device,
        &summary,
        ReportParts {
            run_id: j.run_id().to_string(),
            journal: j.dir().to_path_buf(),
            strategy: o.strategy,
            seed: o.seed,
            seeded,
            hints,
            matrix,
            per_shape,
            best_verified,
        },
    );
    r.pending = pending.as_ref().map(|p| p.label.clone());
    r.saved = pending;
    Ok(r)
}

/// The search's best point, verified in full, and what it is saved with.
struct WinnerFound<'a> {
    best: &'a Record,
    verdict: &'a Verdict,
    job: &'a kopt_engine::job::EvalJob,
    base: Option<&'a SearchBase>,
    save: &'a SaveWinner,
    run_id: &'a str,
    journal: &'a Path,
    evaluations: usize,
    seconds: f64,
}

/// Saves the best point as a pending variant when its full verification passed and it
/// beats the base (the reference, or the candidate searched around) by `min_gain`; the
/// rationale cites the base's stated reasons, then each parameter the search changed.
/// Returns the saved winner, or `None` when nothing beat the base.
fn save_winner(
    g: &Gathered,
    k: &Kernel,
    ev: &mut EngineEvaluator<'_>,
    space: &Space,
    w: WinnerFound<'_>,
) -> Result<Option<Saved>> {
    use kopt_agent::proposal::{Diagnosis, Proposal, ProposedChange};
    if !w.verdict.accepted {
        return Ok(None);
    }
    let Some(geo) = crate::optimize::geo_speedup(w.verdict) else {
        return Ok(None);
    };
    let base_gain = w.base.map(|b| b.gain_over_reference).unwrap_or(1.0);
    if geo < base_gain * (1.0 + w.save.min_gain) {
        return Ok(None);
    }
    let best_version = point_version(&ev.base, &k.spec.options, &PointSpec::of(space, w.best.id));
    let mut changes: Vec<ProposedChange> = Vec::new();
    for (name, value) in &best_version.defines {
        let before = ev.base.defines.get(name);
        if before != Some(value) {
            changes.push(ProposedChange {
                what: format!(
                    "`{name}` {} -> {value}",
                    before.map(|b| b.to_string()).unwrap_or_else(|| "unset".into())
                ),
                why: format!(
                    "the parameter search measured this point ({}) fastest of {} evaluated, {geo:.2}x the reference's time over the declared shapes",
                    w.best.label, w.evaluations
                ),
            });
        }
    }
    for o in best_version
        .options
        .iter()
        .filter(|o| !ev.base.options.contains(o))
    {
        changes.push(ProposedChange {
            what: format!("NVRTC option `{o}`"),
            why: format!(
                "the parameter search measured this point ({}) fastest of {} evaluated; numerics passed with it on every shape",
                w.best.label, w.evaluations
            ),
        });
    }
    let base_proposal = w.base.and_then(|b| b.proposal.clone());
    if changes.is_empty() && base_proposal.is_none() {
        // The reference's own configuration won: nothing to review.
        return Ok(None);
    }
    let figures: Vec<String> = w
        .verdict
        .shapes
        .iter()
        .filter(|s| !s.held_out)
        .filter_map(|s| {
            Some(format!(
                "{}: {:.2} µs against the reference's {:.2} µs",
                s.shape, s.candidate_us?, s.reference_us?
            ))
        })
        .collect();
    let proposal = match base_proposal {
        Some(mut p) => {
            p.diagnosis.evidence.extend(figures);
            p.changes.extend(changes);
            p
        }
        None => Proposal {
            diagnosis: Diagnosis {
                bottleneck: "launch configuration".into(),
                summary: format!(
                    "A parameter search over the tunables and compile options found {} faster than the reference ({geo:.2}x over the declared shapes).",
                    w.best.label
                ),
                evidence: figures,
            },
            changes,
            risks: vec!["a configuration tuned on the declared shapes may be slower on others".into()],
            expected: vec![],
            candidate: kopt_agent::proposal::Candidate {
                source: Some(best_version.source.clone()),
                diff: None,
                entry: (best_version.entry != ev.base.entry).then(|| best_version.entry.clone()),
                args: best_version.args.clone(),
            },
            launch: None,
            defines: best_version.defines.clone(),
            options: best_version.options.clone(),
            matrix: None,
            region: None,
        },
    };
    // The code its verification loaded (`verify` hands the worker the point's PTX).
    let verified = &w.job.candidate;
    let version = KernelVersion {
        id: format!("search-{}", w.best.label.replace([' ', '='], "-")),
        ptx: verified.ptx.clone(),
        cubin: verified.cubin.clone(),
        symbol: verified.symbol.clone(),
        ..best_version
    };
    let pending = crate::optimize::pending_variant(&crate::optimize::Winner {
        k,
        arch: &ev.device.arch,
        device_name: &ev.device.name,
        driver_api: ev.device.driver_api,
        copy_gbs: ev.ceilings().map(|c| c.copy_gbs),
        snapshot_before: None,
        version: &version,
        proposal: &proposal,
        verdict: w.verdict,
        job: w.job,
        agent: &w.save.agent,
        run_id: w.run_id,
        session: &w.journal.join("journal.jsonl"),
        root: &g.workspace_root,
        budget: kopt_spec::files::BudgetUsed {
            rounds: None,
            candidates: Some(w.evaluations as u32),
            wall_time_s: Some(w.seconds),
            tokens: None,
            cost_usd: None,
        },
        sweep: None,
        baseline: None,
        retires: None,
        rules: None,
        region: None,
    })?;
    let kopt = KoptDir::new(&g.target_dir);
    kopt_store::pending::save(&kopt, &pending)?;
    Ok(Some(Saved {
        label: pending.label(),
        version,
        proposal,
    }))
}

struct ReportParts {
    run_id: String,
    journal: PathBuf,
    strategy: StrategyKind,
    seed: u64,
    seeded: bool,
    hints: Option<SnapshotHints>,
    matrix: Option<ParameterMatrix>,
    per_shape: Vec<ShapeBest>,
    best_verified: Option<Verdict>,
}

fn best_per_shape(s: &Summary) -> Vec<ShapeBest> {
    let mut out: BTreeMap<String, ShapeBest> = BTreeMap::new();
    for r in s.records.iter().filter(|r| r.outcome.cost.is_some()) {
        for (shape, us) in &r.outcome.shapes_us {
            let better = out.get(shape).is_none_or(|b| *us < b.us);
            if better {
                out.insert(
                    shape.clone(),
                    ShapeBest {
                        shape: shape.clone(),
                        label: r.label.clone(),
                        us: *us,
                        reference_us: r.outcome.reference_us.get(shape).copied(),
                        verified: None,
                    },
                );
            }
        }
    }
    out.into_values().collect()
}

fn report(
    k: &Kernel,
    space: &Space,
    device: &DeviceInfo,
    s: &Summary,
    parts: ReportParts,
) -> SearchReport {
    let mut board: Vec<&Record> = s
        .records
        .iter()
        .filter(|r| r.outcome.cost.is_some() && space.allowed(r.id))
        .collect();
    board.sort_by(|a, b| {
        a.outcome
            .cost
            .unwrap_or(f64::INFINITY)
            .total_cmp(&b.outcome.cost.unwrap_or(f64::INFINITY))
            .then(a.seq.cmp(&b.seq))
    });
    let evaluated_here = s.evaluations - s.replayed;
    SearchReport {
        package: k.package.clone(),
        kernel: k.spec.name.clone(),
        run_id: parts.run_id,
        journal: parts.journal,
        device: device.clone(),
        strategy: parts.strategy,
        seed: parts.seed,
        seeded: parts.seeded,
        space: space_summary(space),
        hints: parts.hints,
        matrix: parts.matrix,
        stop: s.stop.describe().into(),
        evaluations: s.evaluations,
        replayed: s.replayed,
        compile_failures: s.compile_failures,
        failures: s
            .records
            .iter()
            .filter(|r| r.outcome.cost.is_none())
            .count(),
        seconds: s.seconds,
        evaluations_per_second: if s.seconds_here > 0.0 {
            evaluated_here as f64 / s.seconds_here
        } else {
            0.0
        },
        dropped: s.dropped.clone(),
        interesting: s
            .records
            .iter()
            .filter_map(|r| r.interesting.clone().map(|w| (r.label.clone(), w)))
            .collect(),
        best: s.best_record().and_then(placed),
        best_verified: parts.best_verified,
        per_shape: parts.per_shape,
        leaderboard: board.into_iter().take(10).filter_map(placed).collect(),
        pending: None,
        saved: None,
    }
}

// ---------------------------------------------------------------------------------------
// The convergence benchmark.

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub seeds: u64,
    /// Relative distance to the best that counts as converged (0.02).
    pub target: f64,
    pub live: bool,
    pub options: OptionAxes,
    pub strategies: Vec<StrategyKind>,
    pub threads: Option<usize>,
    pub eval: eval::Settings,
    pub step_timeout: u64,
}

#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub package: String,
    pub kernel: String,
    pub device: DeviceInfo,
    pub space: SpaceSummary,
    pub hints: SnapshotHints,
    pub matrix: ParameterMatrix,
    pub landscape: Landscape,
    /// The exhaustive run, measured: every valid point once, compiled ahead on CPU
    /// threads, no evaluation cache.
    pub exhaustive_seconds: f64,
    pub exhaustive_evaluations_per_second: f64,
    /// Milliseconds per exhaustive evaluation spent in each worker step (the last step
    /// includes sending the report back).
    pub worker_ms_per_evaluation: BTreeMap<String, f64>,
    /// CPU seconds NVRTC took per point, on the compile threads (overlapped).
    pub compile_ms_per_point: f64,
    /// How the strategies' seconds were obtained.
    pub seconds_are: String,
    pub target: f64,
    pub rows: Vec<Row>,
}

/// `cargo kopt search-bench`.
pub fn search_bench(
    g: &Gathered,
    k: &Kernel,
    o: &BenchOptions,
    progress: &mut dyn SearchObserver,
) -> Result<BenchReport> {
    let mut eval_settings = o.eval.clone();
    eval_settings.timing = search_timing();
    eval_settings.held_out_per_shape = 0;
    // Every evaluation is measured, never answered from the cache.
    eval_settings.use_cache = false;
    let (mut ev, space) = setup(g, k, &eval_settings, o.step_timeout, &o.options, None)?;
    progress.started(space.len() as u64);
    progress.message("measuring the reference for the seed");
    let reference = measure_reference(&mut ev, &space, &mut |m| progress.message(m))?;
    let hints = hints_from_reference(&reference);
    let guide =
        Guide::new(&space, seed::heuristic(&space, &k.spec, &hints)).map_err(Error::Search)?;
    let mut settings = Settings::default();
    if let Some(t) = o.threads {
        settings.compile_threads = t.max(1);
    }
    // The exhaustive run, live.
    ev.steps.clear();
    let mut sp = space.clone();
    let mut ex = StrategyKind::Exhaustive.make(0);
    let t = Instant::now();
    let summary = run::run(
        &mut sp,
        ex.as_mut(),
        &mut ev,
        None,
        Interesting::none(),
        &settings,
        Prior::default(),
        &mut Watch(&mut *progress),
    );
    let exhaustive_seconds = t.elapsed().as_secs_f64();
    let n = summary.evaluations.max(1) as f64;
    let worker_ms_per_evaluation: BTreeMap<String, f64> = ev
        .steps
        .iter()
        .map(|(k, v)| (k.clone(), 1000.0 * v / n))
        .collect();
    let compile_ms_per_point = 1000.0
        * summary
            .records
            .iter()
            .map(|r| r.outcome.compile_seconds)
            .sum::<f64>()
        / n;
    let table: HashMap<usize, PointOutcome> = summary
        .records
        .iter()
        .map(|r| (r.id, r.outcome.clone()))
        .collect();
    let landscape = bench::landscape(&space, &table, o.target);
    let seeds: Vec<u64> = (0..o.seeds).collect();
    let goals = guide.goals().to_vec();
    let baseline = hints.metrics();
    let interesting = || Interesting::new(goals.clone(), baseline.clone(), 8);
    let rows = if o.live {
        let Some(best) = landscape.best_cost else {
            return Err(Error::Kernel(
                "no point passed in the exhaustive run".into(),
            ));
        };
        let mut rows = Vec::new();
        for &kind in &o.strategies {
            for seeded in [false, true] {
                let seeds: &[u64] = if kind == StrategyKind::Exhaustive {
                    &seeds[..1.min(seeds.len())]
                } else {
                    &seeds
                };
                let mut trials = Vec::new();
                for &s in seeds {
                    progress.message(&format!(
                        "{kind}{} seed {s}",
                        if seeded { " seeded" } else { "" }
                    ));
                    trials.push(bench::trial(
                        &space,
                        &mut ev,
                        kind,
                        s,
                        seeded.then_some(&guide),
                        if seeded {
                            interesting()
                        } else {
                            Interesting::none()
                        },
                        best * (1.0 + o.target),
                        &settings,
                        false,
                    ));
                }
                rows.push(bench::row(kind, seeded, trials));
            }
        }
        rows
    } else {
        bench::convergence(
            &space,
            &table,
            Some(&guide),
            &interesting,
            &o.strategies,
            &seeds,
            o.target,
            &settings,
        )
    };
    progress.finished();
    ev.engine.worker.shutdown();
    Ok(BenchReport {
        package: k.package.clone(),
        kernel: k.spec.name.clone(),
        device: ev.device.clone(),
        space: space_summary(&space),
        hints,
        matrix: guide.matrix.clone(),
        exhaustive_seconds,
        exhaustive_evaluations_per_second: summary.evaluations as f64
            / exhaustive_seconds.max(1e-9),
        landscape,
        worker_ms_per_evaluation,
        compile_ms_per_point,
        seconds_are: if o.live {
            "wall clock of live runs (every point measured again, compiled ahead on CPU threads)"
                .into()
        } else {
            "device seconds the exhaustive run measured for the points each strategy asked for, plus the strategy's own time".into()
        },
        target: o.target,
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_widths_from_ptx() {
        let ptx = "\tld.global.nc.f32 \t%f1, [%rd4];\n\tld.global.nc.v4.f32 \t{%f2, %f3, %f4, %f5}, [%rd7];\n";
        assert_eq!(ptx_global_load_bytes(ptx), Some(16));
        assert_eq!(
            ptx_global_load_bytes("ld.global.v2.u32 {%r1, %r2}, [%rd1];"),
            Some(8)
        );
        assert_eq!(
            ptx_global_load_bytes("ld.global.nc.u16 %rs1, [%rd1];"),
            Some(2)
        );
        assert_eq!(ptx_global_load_bytes("ld.shared.f32 %f1, [%r1];"), None);
        assert_eq!(
            ptx_global_load_bytes("ld.global.nc.b128 %r, [%rd1];"),
            Some(16)
        );
    }

    #[test]
    fn the_reference_evaluation_becomes_a_snapshot() {
        let mut o = PointOutcome::passed(1.0);
        for (k, v) in [
            ("occupancy_pct", 100.0),
            ("registers", 18.0),
            ("copy_bandwidth_pct", 2.0),
            ("global_load_bytes", 4.0),
            ("grid_blocks_per_sm", 0.12),
            ("local_bytes", 0.0),
        ] {
            o.metrics.insert(k.into(), v);
        }
        let h = hints_from_reference(&o);
        assert_eq!(h.class, Bottleneck::LatencyBound);
        assert_eq!(h.global_load_bytes, Some(4));
        o.metrics.insert("copy_bandwidth_pct".into(), 80.0);
        assert_eq!(hints_from_reference(&o).class, Bottleneck::MemoryBound);
        o.metrics.insert("occupancy_pct".into(), 25.0);
        o.metrics.insert("registers".into(), 128.0);
        assert_eq!(hints_from_reference(&o).class, Bottleneck::OccupancyLimited);
    }
}
