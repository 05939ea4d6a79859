//! `verify` and `bench`: gathered kernels turned into evaluation jobs, run through the
//! engine, judged.

use std::path::PathBuf;

use kopt_engine::engine::{base_seed, seed_salt, Engine};
use kopt_engine::job::{EvalJob, KernelVersion, Seeds, TimingPolicy};
use kopt_engine::parent::{WorkerCommand, WorkerFailure};
use kopt_engine::pool::{DevicePool, DeviceSelection};
use kopt_engine::protocol::{Ceilings, DeviceInfo};
use kopt_engine::sanitizer::{self, SanitizerResult};
use kopt_engine::verdict::{Judge, Verdict};
use kopt_spec::expr::Expr;
use kopt_spec::files::LockEntry;
use kopt_spec::selection::{self, UsableVariant};
use kopt_spec::shapes::{held_out_byte_cap, held_out_shapes_for, ShapeCase};
use kopt_spec::spec::Shape;
use serde::Serialize;

use kopt_workspace::gather::{Gathered, Kernel};

use crate::error::{Error, Result};

/// Knobs shared by `verify` and `bench`.
#[derive(Debug, Clone)]
pub struct Settings {
    pub timing: TimingPolicy,
    /// Tolerated slowdown against the best (0.03 = 3%).
    pub threshold: f64,
    /// Seeded held-out shapes per declared shape, drawn on top of the seed-independent
    /// ones (per dimension: the fewest factors of two, the smallest size, just above a
    /// power of two; see `kopt_spec::shapes::held_out_shapes`). 0: no held-out shapes at
    /// all (the search's and the bench's own measurements).
    pub held_out_per_shape: usize,
    pub sanitize: bool,
    pub use_cache: bool,
    pub device: usize,
    /// A program's recorded launches (`--inputs`): each kept launch of a kernel is a case
    /// of its jobs, checked on its recorded inputs.
    pub captured: std::sync::Arc<crate::captured::Captured>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            timing: TimingPolicy::default(),
            threshold: 0.03,
            held_out_per_shape: 1,
            sanitize: true,
            use_cache: true,
            device: 0,
            captured: Default::default(),
        }
    }
}

/// `<target>/kopt`: runs, caches, the seed salt.
pub fn kopt_dir(g: &Gathered) -> PathBuf {
    g.target_dir.join("kopt")
}

/// The worker to use: the fake device when `KOPT_WORKER=fake` (tests, demos without a
/// GPU), else CUDA device `device` through this very binary.
pub fn worker_command(device: usize) -> Result<WorkerCommand> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::Environment(format!("cannot locate cargo-kopt: {e}")))?;
    if fake_worker() {
        return Ok(WorkerCommand::fake_on(exe, device));
    }
    if let Some(why) = kopt::gpu::missing() {
        return Err(Error::Environment(why));
    }
    Ok(WorkerCommand::cuda(exe, device))
}

fn fake_worker() -> bool {
    std::env::var("KOPT_WORKER").as_deref() == Ok("fake")
}

/// How many devices there are: `KOPT_FAKE_DEVICES` under the fake worker, else what the
/// CUDA driver counts.
pub fn device_count() -> Result<usize> {
    if fake_worker() {
        return kopt_engine::worker::fake::fake_device_count().map_err(Error::Environment);
    }
    if let Some(why) = kopt::gpu::missing() {
        return Err(Error::Environment(why));
    }
    kopt::cudarc::driver::CudaContext::device_count()
        .map(|n| n as usize)
        .map_err(|e| Error::Environment(format!("cannot count the GPUs: {e:?}")))
}

/// One engine per selected device (`None`: the one of `settings.device`, as without
/// `--devices`).
pub fn pool(
    g: &Gathered,
    settings: &Settings,
    devices: Option<&DeviceSelection>,
) -> Result<DevicePool> {
    let ordinals = match devices {
        None => vec![settings.device],
        Some(sel) => sel.resolve(device_count()?).map_err(Error::Invalid)?,
    };
    let engines = ordinals
        .into_iter()
        .map(|device| {
            let s = Settings {
                device,
                ..settings.clone()
            };
            Ok((device, engine(g, &s)?))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(DevicePool::new(engines))
}

/// Every GPU with its ceilings (`cargo kopt devices`): measured again with `refresh`, else
/// the cached ones.
pub fn devices(g: &Gathered, refresh: bool) -> Result<Vec<(DeviceInfo, Ceilings)>> {
    let settings = Settings::default();
    let mut list = Vec::new();
    for d in 0..device_count()? {
        let mut engine = engine(
            g,
            &Settings {
                device: d,
                ..settings.clone()
            },
        )?;
        let info = engine.device()?;
        let c = engine.ceilings(refresh)?;
        list.push((info, c));
    }
    Ok(list)
}

pub fn engine(g: &Gathered, settings: &Settings) -> Result<Engine> {
    let cmd = worker_command(settings.device)?;
    let cache = settings.use_cache.then(|| kopt_dir(g).join("cache/eval"));
    Ok(Engine::new(
        cmd,
        cache,
        kopt_engine::ceilings::CeilingsCache::default_location(),
    ))
}

/// A job: `candidate` against the kernel's reference on the declared shapes inside
/// `region`, plus held-out shapes inside it.
pub fn job(
    g: &Gathered,
    k: &Kernel,
    candidate: KernelVersion,
    region: Option<&Expr>,
    settings: &Settings,
    timed: bool,
) -> EvalJob {
    let reference = KernelVersion::reference(&k.spec, &k.reference.text);
    let inside = |s: &Shape| region.is_none_or(|r| k.spec.region_holds(r, &k.spec.shape_args(s)));
    let mut shapes: Vec<ShapeCase> = k
        .spec
        .shapes
        .iter()
        .filter(|s| inside(s))
        .map(ShapeCase::declared)
        .collect();
    let salt = seed_salt(&kopt_dir(g));
    if settings.held_out_per_shape > 0 {
        // Drawn for the candidate's own defines: a shape its build cannot run (`cols %
        // VEC != 0` with its `VEC`) is outside what it claims, not a failure of it.
        shapes.extend(held_out_shapes_for(
            &k.spec,
            &candidate.defines,
            region,
            salt ^ 0x5EED,
            settings.held_out_per_shape,
            held_out_byte_cap(&k.spec),
        ));
    }
    // A program's own launches, on their recorded inputs: checked, not timed (the bench
    // times them on its own).
    shapes.extend(settings.captured.shape_cases(&k.spec, region, false));
    let spec_json = k.spec.canonical_json();
    let base = base_seed(
        salt,
        &[
            &spec_json,
            &reference.source,
            &candidate.source,
            &candidate.compile_options().join(" "),
        ],
    );
    EvalJob {
        spec: k.spec.clone(),
        reference,
        candidate,
        shapes,
        seeds: Seeds::from_base(base),
        timing: timed.then(|| settings.timing.clone()),
    }
}

#[derive(Debug, Serialize)]
pub struct VerifyOutcome {
    pub package: String,
    pub kernel: String,
    pub variant: String,
    pub arch: String,
    /// What its lock entry is keyed by: `sm_90`, or `NVIDIA H200 (sm_90)`.
    pub key: String,
    /// The name of the device it was verified on (not always the one it was measured on
    /// when its entry is for the whole architecture).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    pub cached: bool,
    pub verdict: Option<Verdict>,
    pub sanitizer: Vec<SanitizerResult>,
    /// The shapes the sanitizer ran on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sanitizer_shapes: Vec<String>,
    /// Why it was not verified here (another architecture, or another device).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// The GPU it was verified on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<usize>,
    /// What the worker loaded: `verified PTX (NVRTC 13.0)`, the launcher's code, or
    /// `PTX compiled now (NVRTC 13.0)` under `--keep-ptx`, or `source` (compiled by the
    /// worker, as the launcher compiles a variant without verified PTX).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub loaded: String,
    /// The PTX `--keep-ptx` kept with the variant after it passed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_ptx: Option<kopt_store::accept::PtxKept>,
}

impl VerifyOutcome {
    fn new(k: &Kernel, entry: &LockEntry) -> Self {
        VerifyOutcome {
            package: k.package.clone(),
            kernel: k.spec.name.clone(),
            variant: entry.variant.clone(),
            arch: entry.arch.clone(),
            key: entry.key(),
            device: None,
            cached: false,
            verdict: None,
            sanitizer: vec![],
            sanitizer_shapes: vec![],
            skipped: None,
            gpu: None,
            loaded: String::new(),
            kept_ptx: None,
        }
    }

    pub fn passed(&self) -> bool {
        self.skipped.is_some()
            || (self.verdict.as_ref().is_some_and(|v| v.accepted)
                && !self.sanitizer.iter().any(|s| s.is_error()))
    }
}

/// What `verify` found: the devices it ran on (in pool order), the first device's
/// ceilings, and one outcome per accepted variant, in the order of the lock files.
#[derive(Debug, Serialize)]
pub struct Verified {
    pub devices: Vec<DeviceInfo>,
    pub ceilings: Option<Ceilings>,
    pub outcomes: Vec<VerifyOutcome>,
}

/// The pool's devices, refused when they are not of one architecture (what is accepted,
/// pending or verified is per architecture).
pub fn one_architecture(pool: &mut DevicePool, why: &str) -> Result<Vec<DeviceInfo>> {
    let devices = pool.devices()?;
    if let Some(other) = devices.iter().find(|d| d.arch != devices[0].arch) {
        return Err(Error::Invalid(format!(
            "GPU {} is {} but GPU {} is {}: {why}; choose GPUs of one kind with `--devices` (e.g. `--devices {}`)",
            devices[0].ordinal, devices[0].arch, other.ordinal, other.arch, devices[0].ordinal
        )));
    }
    Ok(devices)
}

/// Re-verifies every usable accepted variant of the selected kernels (numerics,
/// anti-cheat, watchdog against the reference, compute-sanitizer), on the pool's
/// architecture: each variant whole on one device, the devices in parallel, loading its
/// verified PTX where it has one (the code the launcher runs). A variant accepted for
/// another architecture is listed as skipped. `keep_ptx`: a variant without verified PTX
/// is verified with the PTX NVRTC compiles for it now, which is kept with it when it
/// passes ([`kopt_store::accept::keep_ptx`]; not on the fake device).
pub fn verify(
    g: &Gathered,
    kernels: &[String],
    pool: &mut DevicePool,
    settings: &Settings,
    keep_ptx: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<Verified> {
    let devices = one_architecture(pool, "a variant is verified on its own architecture")?;
    let arch = devices[0].arch.clone();
    let ceilings = pool
        .engines_mut()
        .next()
        .and_then(|(_, e)| e.ceilings(false).ok());
    let mut outcomes: Vec<Option<VerifyOutcome>> = Vec::new();
    let mut work: Vec<(usize, &Kernel, &LockEntry, &UsableVariant)> = Vec::new();
    for k in g
        .kernels
        .iter()
        .filter(|k| kernels.is_empty() || kernels.contains(&k.spec.name))
    {
        for e in &k.state.entries {
            let Ok(usable) = &e.status else { continue };
            // A device-keyed entry runs on its device only: verified where every GPU of
            // the pool is that device.
            let other = e.entry.device.as_ref().and_then(|d| {
                devices
                    .iter()
                    .find(|x| x.name != *d)
                    .map(|x| x.name.clone())
            });
            if e.entry.arch != arch || other.is_some() {
                let here = other.unwrap_or_else(|| arch.clone());
                outcomes.push(Some(VerifyOutcome {
                    skipped: Some(format!(
                        "accepted for {} only, this device is {here}",
                        e.entry.key()
                    )),
                    ..VerifyOutcome::new(k, &e.entry)
                }));
            } else {
                work.push((outcomes.len(), k, &e.entry, usable));
                outcomes.push(None);
            }
        }
    }
    let done = pool.try_map(
        &work,
        |slot, (_, k, entry, usable)| {
            let variant = &entry.variant;
            let ceilings = slot.engine.ceilings(false).ok();
            let mut judge = Judge::new(ceilings);
            judge.threshold = settings.threshold;
            let settings = Settings {
                device: slot.ordinal,
                ..settings.clone()
            };
            let mut o = VerifyOutcome::new(k, entry);
            o.gpu = Some(slot.ordinal);
            o.device = slot.engine.device().ok().map(|d| d.name);
            (slot.progress)(&format!("{}/{variant}", k.spec.name));
            let fake = slot.engine.worker.command().is_fake();
            let mut v = version(usable);
            let mut fresh = None;
            o.loaded = match &usable.ptx {
                Some(p) => format!("verified PTX (NVRTC {})", p.record.nvrtc),
                None if keep_ptx && !fake => {
                    match kopt_engine::precompile::precompile(&k.spec.name, &v, &entry.arch, false)
                    {
                        Ok(c) => fresh = fresh_ptx(&mut v, c),
                        Err(why) => {
                            o.verdict = Some(kopt_engine::precompile::rejected(&why));
                            return Ok((o, None));
                        }
                    }
                    match &fresh {
                        Some((_, r)) => format!("PTX compiled now (NVRTC {})", r.nvrtc),
                        None => "source".into(),
                    }
                }
                None => "source".into(),
            };
            let job = job(g, k, v, usable.region.as_ref(), &settings, true);
            let ev = slot.engine.evaluate(&job, &mut |m| (slot.progress)(m));
            let verdict = judge.judge(&ev.report);
            o.cached = ev.cached;
            if verdict.accepted && settings.sanitize && !slot.engine.worker.command().is_fake() {
                let scratch = kopt_dir(g).join("sanitizer").join(&k.spec.name);
                (slot.progress)(&format!(
                    "{}/{variant}: compute-sanitizer ({})",
                    k.spec.name,
                    sanitizer::TOOLS.join(", ")
                ));
                let run = sanitizer::sanitize(slot.engine.worker.command(), &job, &scratch);
                o.sanitizer = run.results.clone();
                o.sanitizer_shapes = run.shapes.clone();
            }
            o.verdict = Some(verdict);
            Ok::<_, Error>((o, fresh))
        },
        progress,
    )?;
    for ((at, k, entry, _), d) in work.iter().zip(done) {
        let (mut o, fresh) = d.value;
        if let Some((ptx, record)) = fresh.filter(|_| o.passed()) {
            let t = kopt_workspace::store::target(k);
            o.kept_ptx = Some(kopt_store::accept::keep_ptx(&t, entry, &ptx, &record)?);
        }
        outcomes[*at] = Some(o);
    }
    Ok(Verified {
        devices,
        ceilings,
        outcomes: outcomes.into_iter().flatten().collect(),
    })
}

/// Attaches the fence's PTX to `v` for the worker to load, and returns it with its record
/// (`None` where NVRTC gave no PTX or no figures to name it by).
fn fresh_ptx(
    v: &mut KernelVersion,
    c: kopt_engine::precompile::Precompiled,
) -> Option<(String, kopt_spec::files::PtxRecord)> {
    let (ptx, figures) = (c.ptx?, c.figures?);
    v.ptx = Some(ptx.clone());
    v.symbol = c.symbol.clone();
    let record = kopt_engine::precompile::ptx_record(&ptx, &figures, c.symbol);
    Some((ptx, record))
}

/// An accepted variant as the generated launcher runs it: with its verified PTX where it
/// has one (the worker loads that PTX through the driver, so `verify` and `bench` measure
/// the bytes that run), else its source, compiled by the worker.
pub fn version(u: &UsableVariant) -> KernelVersion {
    let mut v = KernelVersion::variant(&u.variant, &u.source);
    if let Some(p) = &u.ptx {
        v.ptx = Some(p.text.clone());
        v.symbol = p.record.symbol.clone();
    }
    v
}

/// One row of `cargo kopt bench` (the report reads the same type).
pub use kopt_report::{BenchFile, BenchRow};

/// Times the reference and the active version of each declared shape.
/// Times the active version of each kernel and shape against the reference, then a
/// one-launch copy of each shape's bytes (see [`BenchRow::same_size_copy_pct`]).
pub fn bench(
    g: &Gathered,
    kernels: &[String],
    engine: &mut Engine,
    settings: &Settings,
    progress: &mut dyn FnMut(&str),
) -> Result<BenchFile, WorkerFailure> {
    let device = engine.device()?;
    let ceilings = engine.ceilings(false).ok();
    let judge = Judge::new(ceilings.clone());
    let mut rows = Vec::new();
    // The captured shapes are timed here, once each, not checked per kept launch.
    let bench_settings = Settings {
        held_out_per_shape: 0,
        captured: Default::default(),
        ..settings.clone()
    };
    for k in g
        .kernels
        .iter()
        .filter(|k| kernels.is_empty() || kernels.contains(&k.spec.name))
    {
        // Group the declared shapes, then the captured ones, by the version that runs them.
        let captured = settings.captured.bench_cases(&k.spec);
        let shapes = k
            .spec
            .shapes
            .iter()
            .map(|s| (kopt_spec::spec::shape_label(s), k.spec.shape_args(s)))
            .chain(
                captured
                    .iter()
                    .map(|(c, _)| (c.label.clone(), k.spec.value_args(&c.values))),
            );
        let mut groups: Vec<(String, KernelVersion, Vec<String>)> = Vec::new();
        for (label, args) in shapes {
            let (id, v) =
                match selection::select(&k.state, &k.spec, &device.arch, Some(&device.name), &args)
                {
                    Some((e, u)) => (e.variant.clone(), version(u)),
                    None => (
                        "reference".to_string(),
                        KernelVersion::reference(&k.spec, &k.reference.text),
                    ),
                };
            match groups.iter_mut().find(|(gid, _, _)| *gid == id) {
                Some(gr) => gr.2.push(label),
                None => groups.push((id, v, vec![label])),
            }
        }
        for (id, v, labels) in groups {
            progress(&format!("{} ({id})", k.spec.name));
            let mut j = job(g, k, v, None, &bench_settings, true);
            j.shapes.retain(|s| labels.contains(&s.label));
            j.shapes.extend(
                captured
                    .iter()
                    .filter(|(c, _)| labels.contains(&c.label))
                    .map(|(c, _)| c.clone()),
            );
            let launches_of = |label: &str| {
                captured
                    .iter()
                    .find(|(c, _)| c.label == label)
                    .map(|(_, n)| *n)
            };
            let ev = engine.evaluate(&j, progress);
            let verdict = judge.judge(&ev.report);
            let problem = (!verdict.accepted).then(|| verdict.summary());
            let bytes_of = |label: &str| {
                let r = ev.report.as_ref().ok()?;
                r.shapes.iter().find(|s| s.label == label).map(|s| s.bytes)
            };
            for f in &verdict.shapes {
                rows.push(BenchRow {
                    package: k.package.clone(),
                    kernel: k.spec.name.clone(),
                    shape: f.shape.clone(),
                    active: id.clone(),
                    reference_us: f.reference_us,
                    active_us: f.candidate_us,
                    speedup: f.speedup,
                    copy_bandwidth_pct: f.copy_bandwidth_pct,
                    reference_copy_bandwidth_pct: f.reference_copy_bandwidth_pct,
                    flops_pct: f.flops_pct,
                    spread: f.spread,
                    method: f.method.clone(),
                    cached: ev.cached,
                    problem: problem.clone(),
                    bytes: bytes_of(&f.shape),
                    same_size_copy_us: None,
                    same_size_copy_pct: None,
                    launches: launches_of(&f.shape),
                });
            }
            if verdict.shapes.is_empty() {
                rows.push(BenchRow {
                    package: k.package.clone(),
                    kernel: k.spec.name.clone(),
                    shape: labels.join(", "),
                    active: id.clone(),
                    reference_us: None,
                    active_us: None,
                    speedup: None,
                    copy_bandwidth_pct: None,
                    reference_copy_bandwidth_pct: None,
                    flops_pct: None,
                    spread: None,
                    method: None,
                    cached: ev.cached,
                    problem: Some(verdict.summary()),
                    bytes: None,
                    same_size_copy_us: None,
                    same_size_copy_pct: None,
                    launches: None,
                });
            }
        }
    }
    let mut sizes: Vec<u64> = rows.iter().filter_map(|r| r.bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let same_size_copy = if sizes.is_empty() {
        None
    } else {
        progress("same-size copies");
        Some(match engine.copy_times(&sizes, progress) {
            Ok(copies) => {
                for r in &mut rows {
                    let copy = copies.iter().find(|c| Some(c.bytes) == r.bytes);
                    r.same_size_copy_us = copy.map(|c| c.timing.median_us);
                    r.same_size_copy_pct = match (r.same_size_copy_us, r.active_us) {
                        (Some(c), Some(a)) if a > 0.0 => Some(100.0 * c / a),
                        _ => None,
                    };
                }
                "the faster of a one-launch copy kernel and a driver copy of each shape's ideal bytes (half read, half written), timed like the kernels".to_string()
            }
            Err(e) => format!("not measured: {e}"),
        })
    };
    Ok(BenchFile {
        device,
        ceilings,
        rows,
        same_size_copy,
    })
}

/// The version to evaluate or profile: the reference, or the committed variant `variant`
/// (which must be usable: intact and current).
pub fn chosen_version(k: &Kernel, variant: Option<&str>) -> Result<KernelVersion> {
    match variant {
        None | Some("reference") => Ok(KernelVersion::reference(&k.spec, &k.reference.text)),
        Some(v) => {
            let e = k
                .state
                .entries
                .iter()
                .find(|e| e.entry.variant == v)
                .ok_or_else(|| {
                    let known: Vec<&str> = k
                        .state
                        .entries
                        .iter()
                        .map(|e| e.entry.variant.as_str())
                        .collect();
                    Error::Invalid(format!(
                        "`{}` has no accepted variant `{v}` (accepted: {})",
                        k.spec.name,
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ))
                })?;
            let u = e
                .status
                .as_ref()
                .map_err(|why| Error::Invalid(why.describe()))?;
            Ok(version(u))
        }
    }
}

/// A declared shape by index (`0`) or label (`cols=4096 rows=4096`).
pub fn shape_index(k: &Kernel, shape: &str) -> Result<usize> {
    let labels: Vec<String> = k
        .spec
        .shapes
        .iter()
        .map(kopt_spec::spec::shape_label)
        .collect();
    if let Ok(i) = shape.trim().parse::<usize>() {
        return if i < labels.len() {
            Ok(i)
        } else {
            Err(Error::Invalid(format!(
                "`{}` has {} shape(s); index {i} is out of range",
                k.spec.name,
                labels.len()
            )))
        };
    }
    let wanted: std::collections::BTreeSet<&str> = shape.split_whitespace().collect();
    labels
        .iter()
        .position(|l| {
            l.split_whitespace()
                .collect::<std::collections::BTreeSet<_>>()
                == wanted
        })
        .ok_or_else(|| {
            Error::Invalid(format!(
                "`{}` declares no shape `{shape}`; its shapes: {}",
                k.spec.name,
                labels
                    .iter()
                    .enumerate()
                    .map(|(i, l)| format!("{i}: {l}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

/// The job of one declared shape of `candidate` against the reference, without held-out
/// shapes: what `cargo kopt __job` prints and `cargo kopt profile` runs (`timed` for the
/// engine's figures, check-only under a profiler).
pub fn shape_job(
    g: &Gathered,
    k: &Kernel,
    candidate: KernelVersion,
    shape: usize,
    timed: bool,
) -> Result<EvalJob> {
    let label = k
        .spec
        .shapes
        .get(shape)
        .map(kopt_spec::spec::shape_label)
        .ok_or_else(|| {
            Error::Invalid(format!(
                "`{}` has {} shapes",
                k.spec.name,
                k.spec.shapes.len()
            ))
        })?;
    let settings = Settings {
        held_out_per_shape: 0,
        ..Settings::default()
    };
    let mut job = job(g, k, candidate, None, &settings, timed);
    job.shapes.retain(|s| s.label == label);
    Ok(job)
}
