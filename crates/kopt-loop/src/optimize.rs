//! `cargo kopt optimize`: the agent loop over the selected kernels, with the engine as
//! its judge, the run journal and recorded sessions as its record, and verified winners
//! left as pending variants with their rationale.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kopt_agent::backend::{Backend, Client, Prices};
use kopt_agent::command::External;
use kopt_agent::http::{Anthropic, Endpoint, OpenAi};
use kopt_agent::run::{self, Budget, Evaluate, Rules, Stop, Task};
use kopt_agent::session::{Recorder, Replay, Resume, ResumeLog};
use kopt_engine::engine::Engine;
use kopt_engine::job::{EvalJob, KernelVersion};
use kopt_engine::pool::{DeviceSelection, Slot};
use kopt_engine::verdict::{Judge, Verdict};
use kopt_redact::Redactor;
use kopt_spec::files::{self, OutputCheck, VariantFile, VerifiedBy};
use kopt_store::evidence::{self, Evidence, NumericEvidence, NumericResult, ShapeMeasurement};
use kopt_store::journal::{Event, Journal};
use kopt_store::layout::KoptDir;
use kopt_store::pending::{
    Baseline, EvidenceSummary, Fence as PendingFence, PendingMeta, PendingVariant,
};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::eval::{self, Settings};
use crate::loop_record::{
    self, Counts, PendingRecord, RecordedStart, RecordedVerdicts, RunRecord, StartRecord,
    VerdictRecord,
};
use kopt_workspace::gather::{Gathered, Kernel};

/// Verifies candidates through the engine, judging against the current best.
pub struct LoopEvaluator<'a> {
    pub g: &'a Gathered,
    pub k: &'a Kernel,
    pub engine: &'a mut Engine,
    pub judge: Judge,
    pub settings: Settings,
    /// The last job evaluated (its shapes and seeds go into the evidence).
    pub last_job: Option<EvalJob>,
    /// A resumed run's recorded verdicts: a candidate given the same job on the same
    /// device against the same best is answered from its record, not the GPU.
    pub recorded: RecordedVerdicts,
    /// What candidates are compiled for on the CPU before the worker sees them: the
    /// device's architecture, and whether it is the fake device (`None`: the device
    /// could not be asked, and the engine reports that failure itself).
    pub target: Option<(String, bool)>,
}

impl Evaluate for LoopEvaluator<'_> {
    fn evaluate(
        &mut self,
        candidate: &mut KernelVersion,
        best_us: Option<&BTreeMap<String, f64>>,
        region: Option<&str>,
    ) -> Verdict {
        // A region was validated against the spec when the proposal was read, or found
        // by the loop in the spec's own language.
        let region = match region.map(|r| self.k.spec.parse_region(r)).transpose() {
            Ok(r) => r,
            Err(e) => return Verdict::not_launched(&format!("its region {e}")),
        };
        // Code carried in the version passed the compile fence in the compile pool. Else
        // the fence compiles it here, and on a GPU its PTX goes into the job: the worker
        // loads exactly that PTX through the driver, as the generated launcher will.
        let compiled_ahead = candidate.cubin.is_some() || candidate.ptx.is_some();
        let refused = match (compiled_ahead, self.fence(candidate)) {
            (false, Err(why)) => Some(kopt_engine::precompile::rejected(&why)),
            (false, Ok(Some(code))) if !self.target.as_ref().is_some_and(|t| t.1) => {
                candidate.ptx = code.ptx;
                candidate.symbol = code.symbol;
                None
            }
            _ => None,
        };
        let job = eval::job(
            self.g,
            self.k,
            candidate.clone(),
            region.as_ref(),
            &self.settings,
            true,
        );
        if let Some(verdict) = refused {
            self.last_job = Some(job);
            return verdict;
        }
        if let Some(verdict) = self.recorded.answer(&job, best_us) {
            self.last_job = Some(job);
            return verdict;
        }
        let ev = self.engine.evaluate(&job, &mut |_| {});
        let mut judge = self.judge.clone();
        judge.best_us = best_us.cloned();
        let mut verdict = judge.judge(&ev.report);
        // A candidate that passed every other fence would become the best: compute-sanitizer
        // first, so that no winner skips it (out-of-bounds writes that corrupt nothing
        // visible, races the numerics miss).
        if verdict.accepted && self.settings.sanitize {
            let scratch = eval::kopt_dir(self.g)
                .join("sanitizer")
                .join(&self.k.spec.name)
                .join(&candidate.id);
            let run =
                kopt_engine::sanitizer::sanitize(self.engine.worker.command(), &job, &scratch);
            kopt_engine::sanitizer::apply(&mut verdict, run);
        }
        self.last_job = Some(job);
        verdict
    }

    fn last_from_record(&self) -> bool {
        self.recorded.last()
    }

    /// The compile fence of `cargo kopt search` ([`crate::search::NvrtcCompiler`]) for the
    /// device's architecture, so that a matrix's points compile in the search's pool.
    fn point_compiler(
        &self,
        base: &KernelVersion,
    ) -> Option<std::sync::Arc<dyn kopt_search::run::Compiler>> {
        let (arch, fake) = self.target.as_ref()?;
        let (major, minor) = files::parse_arch(arch)?;
        Some(std::sync::Arc::new(crate::search::NvrtcCompiler {
            kernel: self.k.spec.name.clone(),
            template: base.clone(),
            spec_options: self.k.spec.options.clone(),
            cc: (major as i32, minor as i32),
            fake: *fake,
            hand_ptx: true,
        }))
    }

    /// The pool hands PTX (`hand_ptx`), the fake device's pseudo-PTX on the fake one.
    fn attach_code(&self, version: &mut KernelVersion, code: &str) {
        version.ptx = Some(code.to_string());
    }
}

impl<'a> LoopEvaluator<'a> {
    /// The evaluator of `k` on `engine`'s device: its judge with the device's ceilings and
    /// the watchdog threshold of `settings` (`--threshold`).
    pub fn new(g: &'a Gathered, k: &'a Kernel, engine: &'a mut Engine, settings: Settings) -> Self {
        let mut judge = Judge::new(engine.ceilings(false).ok());
        judge.threshold = settings.threshold;
        let fake = engine.worker.command().is_fake();
        let target = engine.device().ok().map(|d| (d.arch, fake));
        LoopEvaluator {
            g,
            k,
            engine,
            judge,
            settings,
            last_job: None,
            recorded: RecordedVerdicts::default(),
            target,
        }
    }

    /// The compile fence on the CPU ([`kopt_engine::precompile`]): a version that does not
    /// compile for the device's architecture, or whose module lacks its entry, gets its
    /// verdict here (from `Err`), and no worker sees it. `Ok(None)`: the device could not
    /// be asked its architecture, and the engine reports that itself.
    fn fence(
        &self,
        version: &KernelVersion,
    ) -> Result<Option<kopt_engine::precompile::Precompiled>, kopt_engine::precompile::Refused>
    {
        let Some((arch, fake)) = self.target.as_ref() else {
            return Ok(None);
        };
        kopt_engine::precompile::precompile(&self.k.spec.name, version, arch, *fake).map(Some)
    }

    fn refused(&self, version: &KernelVersion) -> Option<Verdict> {
        let why = self.fence(version).err()?;
        Some(kopt_engine::precompile::rejected(&why))
    }

    /// Verifies `version` against the reference with figures measured now, never from
    /// the cache: a starting point candidates are compared with, or its second timing.
    pub fn evaluate_now(&mut self, version: &KernelVersion) -> Verdict {
        if let Some(verdict) = self.refused(version) {
            return verdict;
        }
        let settings = self.settings.clone();
        self.judge_now(version, &settings)
    }

    /// A job of `version` under `settings`, measured now, judged.
    fn judge_now(&mut self, version: &KernelVersion, settings: &eval::Settings) -> Verdict {
        let job = eval::job(self.g, self.k, version.clone(), None, settings, true);
        let ev = self.engine.evaluate_now(&job, &mut |_| {});
        self.judge.judge(&ev.report)
    }

    /// [`Self::evaluate_now`] on the declared shapes only: a timing of a version already
    /// verified (the noise's second job), where checks on held-out shapes would only
    /// repeat the verification, at up to twice the declared shapes' size each.
    pub fn time_now(&mut self, version: &KernelVersion) -> Verdict {
        let settings = eval::Settings {
            held_out_per_shape: 0,
            ..self.settings.clone()
        };
        self.judge_now(version, &settings)
    }
}

/// Where the agents are, from `[agent]` tables (the user's configuration, the workspace's
/// `Cargo.toml` and `kopt.toml`) and the environment.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    pub openai_base_url: String,
    pub openai_key_env: String,
    pub anthropic_base_url: String,
    pub anthropic_key_env: String,
    pub timeout_s: u64,
    /// Dollars per million input and output tokens, by backend name (`openai:gpt-x`).
    pub prices: BTreeMap<String, Prices>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            openai_base_url: "https://api.openai.com/v1".into(),
            openai_key_env: "OPENAI_API_KEY".into(),
            anthropic_base_url: "https://api.anthropic.com".into(),
            anthropic_key_env: "ANTHROPIC_API_KEY".into(),
            timeout_s: 300,
            prices: BTreeMap::new(),
        }
    }
}

impl AgentConfig {
    /// Layers, each overriding the keys it sets: the user's
    /// `$XDG_CONFIG_HOME/kopt/config.toml` (or `~/.config/kopt/config.toml`), `[agent]`;
    /// the workspace's `Cargo.toml`, `[workspace.metadata.kopt.agent]`; the workspace's
    /// `kopt.toml`, `[agent]`; then `KOPT_OPENAI_BASE_URL`, `KOPT_ANTHROPIC_BASE_URL`,
    /// `KOPT_OPENAI_KEY_ENV` and `KOPT_ANTHROPIC_KEY_ENV`. A layer with a key kopt does not
    /// know, or a value of the wrong type, is an error naming its file and table.
    pub fn load(g: &Gathered) -> Result<Self> {
        let user = std::env::var_os("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
            .map(|d| d.join("kopt").join("config.toml"));
        let layers = user.map(|p| (p, &["agent"][..])).into_iter().chain([
            (
                g.workspace_root.join("Cargo.toml"),
                &["workspace", "metadata", "kopt", "agent"][..],
            ),
            (g.workspace_root.join("kopt.toml"), &["agent"][..]),
        ]);
        let mut merged = toml::Table::new();
        for (path, table_path) in layers {
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let table: toml::Table = toml::from_str(&text).map_err(|e| {
                let message = format!("{}: {e}", path.display());
                Error::file(&path, message, e)
            })?;
            let mut at = Some(&table);
            for key in table_path {
                at = at.and_then(|t| t.get(*key)).and_then(toml::Value::as_table);
            }
            let Some(agent) = at else { continue };
            // Checked alone, so that an error names the layer that has it.
            toml::Value::Table(agent.clone())
                .try_into::<AgentConfig>()
                .map_err(|e| {
                    let message = format!(
                        "{}, [{}]: {}",
                        path.display(),
                        table_path.join("."),
                        e.to_string().trim_end()
                    );
                    Error::file(&path, message, e)
                })?;
            for (k, v) in agent {
                merged.insert(k.clone(), v.clone());
            }
        }
        let mut c: AgentConfig =
            toml::Value::Table(merged)
                .try_into()
                .map_err(|e: toml::de::Error| {
                    Error::Invalid(format!("the [agent] configuration: {e}"))
                })?;
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        if let Some(v) = env("KOPT_OPENAI_BASE_URL") {
            c.openai_base_url = v;
        }
        if let Some(v) = env("KOPT_ANTHROPIC_BASE_URL") {
            c.anthropic_base_url = v;
        }
        if let Some(v) = env("KOPT_OPENAI_KEY_ENV") {
            c.openai_key_env = v;
        }
        if let Some(v) = env("KOPT_ANTHROPIC_KEY_ENV") {
            c.anthropic_key_env = v;
        }
        Ok(c)
    }
}

/// A backend from its spelling: `heuristic`, `openai:MODEL`, `anthropic:MODEL`,
/// `cmd:PATH`, `replay:PATH`.
pub fn backend(spec: &str, cfg: &AgentConfig, entry: &str) -> Result<Box<dyn Backend>> {
    let timeout = Duration::from_secs(cfg.timeout_s);
    let (kind, arg) = spec.split_once(':').unwrap_or((spec, ""));
    match (kind, arg) {
        ("openai", m) if !m.is_empty() => Ok(Box::new(OpenAi::new(Endpoint::from_env(&cfg.openai_base_url, m, &cfg.openai_key_env, timeout)))),
        ("anthropic", m) if !m.is_empty() => Ok(Box::new(Anthropic::new(Endpoint::from_env(&cfg.anthropic_base_url, m, &cfg.anthropic_key_env, timeout)))),
        ("cmd", p) if !p.is_empty() => Ok(Box::new(External { program: PathBuf::from(p), timeout })),
        ("replay", p) if !p.is_empty() => Ok(Box::new(Replay::open(std::path::Path::new(p)).map_err(|e| Error::file(p, e.to_string(), e))?)),
        ("heuristic", "") => Ok(Box::new(kopt_agent::heuristic::Heuristic::new(entry))),
        _ => Err(Error::Invalid(format!("`{spec}` is not an agent: write heuristic, openai:MODEL, anthropic:MODEL, cmd:PATH or replay:PATH"))),
    }
}

/// What a run did for one kernel.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KernelResult {
    pub kernel: String,
    pub stop: Stop,
    pub rounds: u32,
    pub accepted: usize,
    pub rejected: usize,
    pub best_speedup: Option<f64>,
    /// `package/kernel/arch` of the pending variant left for review.
    pub pending: Option<String>,
    /// The pending variants of the regions it won (`package/kernel/arch where REGION`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regional_pending: Vec<String>,
    /// The escalation note, relative to the run folder.
    pub escalation: Option<String>,
    pub tokens: u64,
    pub dollars: f64,
    /// The GPU ordinal the kernel's loop ran on.
    pub device: usize,
    /// Why a verified winner was not left as a pending variant (its evidence did not
    /// support a rationale); the other kernels of the run go on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_refused: Option<String>,
    /// The starting version timed in two jobs: how far each shape's time moved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub noise: Option<TimingNoise>,
    /// In a resumed run: what came from the record of the run's earlier part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<Resumption>,
}

/// What a resumed run took from its record for one kernel.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Resumption {
    /// The kernel's loop had ended before: the result is the recorded one, nothing ran.
    pub finished_before: bool,
    /// The loop started where its record says (snapshot, starting version, noise, similar
    /// cases) rather than measuring them again.
    pub start_from_record: bool,
    /// Exchanges answered from the recorded session.
    pub exchanges: usize,
    /// Verdicts answered from the journal instead of the GPU.
    pub verdicts: usize,
    /// The exchange from which the live agent answered, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_from: Option<(usize, String)>,
}

pub struct Options {
    pub kernels: Vec<String>,
    pub agent: String,
    pub reviewer: Option<String>,
    pub budget: Budget,
    pub hint: Option<String>,
    pub context_tokens: usize,
    pub settings: Settings,
    /// The run's id (`--run`; a new one from the clock when absent). A run whose journal
    /// exists is resumed.
    pub run_id: Option<String>,
    /// `--resume`: the run must exist (its journal), and is continued from its record.
    pub resume: bool,
    /// How the reference's bottleneck snapshot runs Nsight Compute (when it exists).
    pub ncu: kopt_profile::collect::NcuChoice,
    /// `--devices`: one worker per selected GPU, kernels scheduled across them (`None`:
    /// the one GPU of `settings.device`).
    pub devices: Option<DeviceSelection>,
    /// Seconds without progress after which a candidate counts as hung (`--step-timeout`).
    pub step_timeout: Duration,
    /// Start from the reference even where a variant is accepted for the device's
    /// architecture (`--from-reference`).
    pub from_reference: bool,
    /// What a candidate must gain to be a new best (`--min-gain`, `--min-uniform-gain`),
    /// before the run raises it above the timing noise it measures.
    pub rules: Rules,
    /// Limits over all the run's kernels together (`--run-budget`).
    pub run_limits: run::RunLimits,
}

fn now_id() -> String {
    let s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("run-{s}")
}

/// What every kernel of a run shares, whichever device runs it.
struct RunShared<'a> {
    g: &'a Gathered,
    opts: &'a Options,
    cfg: AgentConfig,
    kopt: KoptDir,
    run_id: String,
    run_dir: PathBuf,
    redactor: Redactor,
    journal: Mutex<Journal>,
    /// Where every candidate's outcome is recorded, when a library exists.
    library: Mutex<Option<kopt_store::cases::CaseLibrary>>,
    /// The library as the run found it, which every kernel's similar cases come from.
    cases_at_start: Mutex<Option<kopt_store::cases::CaseLibrary>>,
    /// What the run's kernels spent together, against `--run-budget`.
    run_budget: run::RunBudget,
    /// A resumed run's record of its kernels (empty for a new run).
    record: Option<RunRecord>,
}

impl RunShared<'_> {
    fn journal(&self) -> std::sync::MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The run's configuration as `run_started` records it; a resumed run must keep what
/// [`loop_record::KEPT_OPTIONS`] names.
fn run_config(opts: &Options) -> serde_json::Value {
    serde_json::json!({ "agent": opts.agent, "reviewer": opts.reviewer, "kernels": opts.kernels, "hint": opts.hint, "run_budget": opts.run_limits, "min_gain": opts.rules.min_gain, "min_uniform_gain": opts.rules.min_uniform_gain, "from_reference": opts.from_reference, "context_tokens": opts.context_tokens, "sanitize": opts.settings.sanitize })
}

/// The record of run `run_id` to resume, after checking that this command is the same run.
fn resume_record(
    resumed: &kopt_store::journal::Resumed,
    journal: &Journal,
    config: &serde_json::Value,
    run_id: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<RunRecord> {
    let recorded = resumed
        .entries
        .iter()
        .find_map(|e| match &e.event {
            Event::RunStarted { config, .. } => Some(config),
            _ => None,
        })
        .ok_or_else(|| {
            Error::Invalid(format!("run `{run_id}` has no `run_started` event: it is not a run that can be resumed; start a new run"))
        })?;
    if recorded.get("agent").is_none() {
        return Err(Error::Invalid(format!(
            "run `{run_id}` is not an optimisation run: resume it with the command that started it"
        )));
    }
    let diff = loop_record::config_differences(recorded, config);
    if !diff.is_empty() {
        return Err(Error::Invalid(format!(
            "run `{run_id}` cannot be resumed by this command: {}. Resume with the run's kernels, agent, reviewer, hint, gain thresholds, --from-reference, --context-tokens and --no-sanitize (budgets may change), or start a new run",
            diff.join("; ")
        )));
    }
    if let Some(t) = &resumed.torn {
        progress(&format!(
            "run `{run_id}`: the journal's line {} was cut short when the run stopped; kept in {} and cut",
            t.line,
            t.kept_in.display()
        ));
    }
    RunRecord::read(&resumed.entries, journal.dir())
}

/// The case library as a resumed run found it when it started: without the cases its own
/// candidates became (kernels that finished before the interruption recorded theirs).
fn without_run_cases(
    mut lib: kopt_store::cases::CaseLibrary,
    record: &RunRecord,
    run_id: &str,
) -> kopt_store::cases::CaseLibrary {
    let ours: BTreeSet<(String, String)> = record
        .kernels
        .iter()
        .flat_map(|(kernel, r)| {
            r.verdicts
                .keys()
                .map(move |c| (kernel.clone(), format!("{run_id}-{c}")))
        })
        .collect();
    for case in lib.list(None, None).unwrap_or_default() {
        if let Some(variant) = &case.origin.variant {
            if ours.contains(&(case.origin.kernel.clone(), variant.clone())) {
                let _ = lib.remove(&case.id);
            }
        }
    }
    lib
}

/// Runs the loop over the selected kernels: one kernel at a time on each device of
/// `opts.devices`, the devices in parallel (see `kopt_engine::pool`). A run whose journal
/// exists (`--resume`, or `--run` with its id) goes on from its record
/// ([`crate::loop_record`]).
pub fn optimize(g: &Gathered, opts: &Options, progress: &mut dyn FnMut(&str)) -> Result<RunResult> {
    let cfg = AgentConfig::load(g)?;
    let kopt = KoptDir::new(&g.target_dir);
    let run_id = opts.run_id.clone().unwrap_or_else(now_id);
    let exists = journal_exists(&kopt, &run_id);
    if opts.resume && !exists {
        return Err(Error::Invalid(format!(
            "run `{run_id}` has no journal in {}: `--resume` goes on with a run that was started (they are in {}); start one with `--run {run_id}`",
            kopt.run_dir(&run_id).display(),
            kopt.runs_root().display()
        )));
    }
    let (mut journal, resumed) = Journal::open_or_resume(&kopt, &run_id)?;
    let config = run_config(opts);
    let record = if resumed.entries.is_empty() {
        journal.append(Event::RunStarted {
            config,
            budget: serde_json::to_value(&opts.budget).expect("serialises"),
        })?;
        None
    } else {
        Some(resume_record(
            &resumed, &journal, &config, &run_id, progress,
        )?)
    };
    let mut pool = eval::pool(g, &opts.settings, opts.devices.as_ref())?;
    for (_, engine) in pool.engines_mut() {
        engine.worker.step_timeout = opts.step_timeout;
    }
    eval::one_architecture(
        &mut pool,
        "a run's pending variants are for one architecture",
    )?;
    // The case library, when there is one: similar cases for the context, and every
    // candidate's outcome recorded (rejected and failed ones as negative cases). The
    // similar cases come from a copy taken before any kernel starts, so that a kernel's
    // context never depends on which kernels another device finished first; they are
    // looked up once the kernel's snapshot gives its metric vector.
    let library = existing_case_library();
    let cases_at_start = library
        .as_ref()
        .and_then(|l| l.frozen().ok())
        .map(|l| match &record {
            Some(r) => without_run_cases(l, r, &run_id),
            None => l,
        });
    // In the order they were named (a capture's ranking by time share, say), else the
    // workspace's.
    let mut kernels: Vec<&Kernel> = g
        .kernels
        .iter()
        .filter(|k| opts.kernels.is_empty() || opts.kernels.contains(&k.spec.name))
        .collect();
    kernels.sort_by_key(|k| opts.kernels.iter().position(|n| *n == k.spec.name));
    let run_budget = run::RunBudget::new(opts.run_limits.clone());
    if let Some(r) = &record {
        // What the kernels that had finished spent stays spent.
        let finished: Vec<&KernelResult> = kernels
            .iter()
            .filter_map(|k| r.kernels.get(&k.spec.name)?.finished.as_ref())
            .map(|(result, _)| result)
            .collect();
        for f in &finished {
            run_budget.charge((f.accepted + f.rejected) as u32, f.tokens, f.dollars);
        }
        let detail = format!(
            "resumed: {} of {} kernel(s) had finished and are not run again",
            finished.len(),
            kernels.len()
        );
        progress(&format!("run `{run_id}` {detail}"));
        journal.append(Event::Resumed {
            kernel: None,
            detail,
        })?;
    }
    let shared = RunShared {
        g,
        opts,
        cfg,
        kopt,
        run_dir: journal.dir().to_path_buf(),
        run_id: run_id.clone(),
        redactor: Redactor::from_env(),
        journal: Mutex::new(journal),
        library: Mutex::new(library),
        cases_at_start: Mutex::new(cases_at_start),
        run_budget,
        record,
    };
    let results = pool.try_map(
        &kernels,
        |slot, k| optimize_kernel(&shared, slot, k),
        progress,
    )?;
    let results: Vec<KernelResult> = results.into_iter().map(|r| r.value).collect();
    let spent = shared.run_budget.spent();
    // The counts the summary gives are the journal's own.
    let counts = {
        let mut journal = shared.journal();
        let mut total = Counts::default();
        for c in shared.counts(&journal).into_values() {
            total += c;
        }
        let _ = journal.append(Event::RunFinished {
            summary: format!(
                "{} kernel(s); {} candidate(s), {} token(s), ${:.2}; {} accepted, {} rejected",
                results.len(),
                total.candidates,
                spent.tokens,
                spent.dollars,
                total.accepted,
                total.rejected
            ),
        });
        total
    };
    Ok(RunResult {
        dir: shared.run_dir.clone(),
        run: run_id,
        kernels: results,
        spent,
        counts,
    })
}

/// Whether run `run_id` has a journal.
fn journal_exists(kopt: &KoptDir, run_id: &str) -> bool {
    kopt_store::layout::is_plain_name(run_id)
        && kopt
            .run_dir(run_id)
            .join(kopt_store::journal::JOURNAL_FILE)
            .is_file()
}

impl RunShared<'_> {
    /// The journal's candidate counts per kernel, read back under its lock (`_journal`:
    /// the guard, so that no line is half written meanwhile).
    fn counts(&self, _journal: &Journal) -> BTreeMap<String, Counts> {
        Journal::read(&self.kopt, &self.run_id)
            .map(|r| loop_record::journal_counts(&r.entries))
            .unwrap_or_default()
    }

    /// Appends a resumed run's note on `kernel`.
    fn note(&self, kernel: &str, detail: String) {
        let _ = self.journal().append(Event::Resumed {
            kernel: Some(kernel.to_string()),
            detail,
        });
    }

    /// The agent backend of a kernel's session at `path`: recorded as it answers, and in
    /// a resumed run answering from the recording first.
    fn session_backend(
        &self,
        live: Box<dyn Backend>,
        path: &std::path::Path,
    ) -> Result<(Box<dyn Backend>, Option<ResumeLog>)> {
        if self.record.is_some() {
            let r =
                Resume::open(path, live, self.redactor.clone()).map_err(|message| Error::File {
                    path: path.to_path_buf(),
                    message,
                    source: None,
                })?;
            let log = r.log();
            Ok((Box::new(r), Some(log)))
        } else {
            let r = Recorder::new(live, path, self.redactor.clone())
                .map_err(|e| Error::file(path, e.to_string(), e))?;
            Ok((Box::new(r), None))
        }
    }
}

/// What `cargo kopt optimize` did: the run, each kernel's result, and what the kernels
/// spent together (what `--run-budget` limits).
#[derive(Debug, Serialize)]
pub struct RunResult {
    pub run: String,
    /// The run's folder: its journal, recorded sessions and escalation notes.
    pub dir: PathBuf,
    pub kernels: Vec<KernelResult>,
    pub spent: run::RunSpent,
    /// Candidates, accepted and rejected, as the run's journal records them (what its
    /// `run_finished` summary says).
    pub counts: Counts,
}

/// A kernel whose loop had ended before the run was resumed: its recorded result, and its
/// winner saved if the interruption came before that.
fn finished_before(
    run: &RunShared,
    name: &str,
    (result, pending): (&KernelResult, &[PendingRecord]),
    pending_saved: usize,
    progress: &dyn Fn(&str),
) -> Result<KernelResult> {
    let mut result = result.clone();
    for p in pending.iter().skip(pending_saved) {
        let p = p.clone().into_pending();
        run.journal().save_pending(&run.kopt, &p)?;
        progress(&format!(
            "{name}: its winner {} is saved for review now (the run stopped before it was)",
            p.label()
        ));
    }
    progress(&format!("{name}: its loop had finished; not run again"));
    result.resumed = Some(Resumption {
        finished_before: true,
        ..Resumption::default()
    });
    Ok(result)
}

/// Writes a verified candidate to the journal: its source and its verdict in full as
/// artefacts, then its `candidate` and `verdict` events.
fn journal_verdict(
    journal: &mut Journal,
    kernel: &str,
    key: String,
    e: &run::Event,
) -> kopt_store::Result<()> {
    let run::Event::Verdict {
        id,
        round,
        diagnosis,
        point,
        version,
        verdict,
        best_us,
        ..
    } = e
    else {
        return Ok(());
    };
    let stem = format!("{kernel}-{id}");
    let source = journal.save_artefact(
        &loop_record::unused_artefact(journal, None, &stem, "cu"),
        &version.source,
    )?;
    let record = VerdictRecord {
        format: loop_record::FORMAT,
        kernel: kernel.to_string(),
        candidate: id.clone(),
        key,
        best_us: best_us.clone(),
        verdict: (**verdict).clone(),
    };
    let full = journal.save_artefact(
        &loop_record::unused_artefact(journal, Some("verdicts"), &stem, "json"),
        &serde_json::to_string(&record).expect("verdicts serialise"),
    )?;
    journal.append(Event::Candidate {
        kernel: kernel.to_string(),
        round: *round,
        candidate: id.clone(),
        summary: match point {
            Some(p) => format!(
                "a point of {}'s matrix, searched by the loop: {}",
                p.base,
                p.describe()
            ),
            None => diagnosis.clone(),
        },
        artefacts: vec![source],
    })?;
    journal.append(Event::Verdict {
        kernel: kernel.to_string(),
        candidate: id.clone(),
        passed: verdict.accepted,
        failure_class: verdict.failures.first().map(|f| f.fence.name().to_string()),
        detail: verdict.summary(),
        times_us: verdict.candidate_times(),
        artefacts: vec![full],
    })?;
    Ok(())
}

/// The loop for one kernel, on the device of `slot`. Everything it does reaches the run's
/// journal as it happens (shared with the other devices' kernels under a lock; each event
/// names its kernel).
fn optimize_kernel(run: &RunShared, slot: Slot<'_>, k: &Kernel) -> Result<KernelResult> {
    let (g, opts, cfg) = (run.g, run.opts, &run.cfg);
    let progress = slot.progress;
    let slot_ordinal = slot.ordinal;
    let engine = slot.engine;
    let settings = Settings {
        device: slot.ordinal,
        ..opts.settings.clone()
    };
    let name = k.spec.name.clone();
    let record = run.record.as_ref().and_then(|r| r.kernels.get(&name));
    if let Some(rec) = record {
        if let Some((result, pending)) = &rec.finished {
            return finished_before(run, &name, (result, pending), rec.pending_saved, progress);
        }
    }
    let device = engine.device()?;
    let identity = device.identity();
    if let Some(which) = run.run_budget.exhausted() {
        // A kernel the run's budget leaves no room for does not start.
        progress(&format!("{name}: not started, the {which} budget ran out"));
        return Ok(KernelResult {
            kernel: name,
            stop: Stop::Budget {
                which: which.to_string(),
            },
            rounds: 0,
            accepted: 0,
            rejected: 0,
            best_speedup: None,
            pending: None,
            regional_pending: Vec::new(),
            escalation: None,
            tokens: 0,
            dollars: 0.0,
            device: slot_ordinal,
            pending_refused: None,
            noise: None,
            resumed: None,
        });
    }
    let ceilings = engine.ceilings(false).ok();
    let resuming = run.record.is_some();
    progress(&format!(
        "{name}: {}",
        if resuming { "resuming" } else { "starting" }
    ));
    let session = run.run_dir.join("sessions").join(format!("{name}.jsonl"));
    let (proposer, proposer_log) =
        run.session_backend(backend(&opts.agent, cfg, &k.spec.entry)?, &session)?;
    let mut client = Client::new(proposer);
    client.prices = cfg.prices.get(&opts.agent).copied().unwrap_or_default();
    let mut reviewer_log = None;
    let mut reviewer = match &opts.reviewer {
        Some(r) => {
            let (b, log) = run.session_backend(
                backend(r, cfg, &k.spec.entry)?,
                &run.run_dir
                    .join("sessions")
                    .join(format!("{name}-reviewer.jsonl")),
            )?;
            reviewer_log = log;
            let mut c = Client::new(b);
            c.prices = cfg.prices.get(r).copied().unwrap_or_default();
            Some(c)
        }
        None => None,
    };
    // Where the loop starts: from its record when it had started on this device with the
    // same accepted variant (so that the agent is asked the same first question), else
    // measured now.
    let accepted_now = k
        .state
        .entries
        .iter()
        .find(|e| e.entry.arch == device.arch)
        .map(|e| (e.entry.variant.clone(), e.entry.source_hash.clone()));
    let recorded_start = record
        .and_then(|r| r.started.as_ref())
        .and_then(|(dev, s)| {
            let why = if dev != &identity {
                Some(format!("its record comes from another device ({dev})"))
            } else if s.accepted != accepted_now {
                Some("the variant accepted for the architecture changed since".to_string())
            } else if (&s.reference_hash, &s.spec_hash) != (&k.hashes.reference, &k.hashes.spec) {
                Some("the kernel's reference or annotation changed since".to_string())
            } else {
                None
            };
            match why {
                None => Some(s),
                Some(why) => {
                    progress(&format!(
                        "{name}: the loop's start is measured again: {why}"
                    ));
                    run.note(&name, format!("the loop's start is measured again: {why}"));
                    None
                }
            }
        });
    let (snapshot, cases) = match recorded_start {
        Some(s) => (s.snapshot.clone(), s.cases.clone()),
        None => {
            // The reference's bottleneck snapshot: the agent's first input.
            progress(&format!("{name}: profiling the reference"));
            // The kernel's own copy, so that no lock is held while it profiles.
            let cases_at_start = run
                .cases_at_start
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .and_then(|l| l.frozen().ok());
            let snapshot = profile_reference(
                g,
                k,
                engine,
                (&settings, &opts.ncu),
                cases_at_start.as_ref(),
                &run.run_dir.join("profile").join(&name),
                &mut |m| progress(m),
            );
            let metrics = snapshot
                .as_ref()
                .map(|s| s.metrics.clone())
                .unwrap_or_default();
            let cases = similar_cases(cases_at_start.as_ref(), &name, &k.reference.text, &metrics);
            if let Some(s) = &snapshot {
                let _ = run.journal().append(Event::Profile {
                    kernel: name.clone(),
                    candidate: None,
                    summary: s.render(3),
                    artefacts: vec![format!("profile/{name}/snapshot.json")],
                });
            }
            (snapshot, cases)
        }
    };
    let reference_metrics = snapshot
        .as_ref()
        .map(|s| s.metrics.clone())
        .unwrap_or_default();
    let mut evaluator = LoopEvaluator::new(g, k, engine, settings.clone());
    let Starting {
        start,
        baseline,
        noise,
    } = match recorded_start {
        Some(s) => Starting {
            start: s.start.as_ref().map(|r| run::Start {
                version: r.version.clone(),
                verdict: r.verdict.clone(),
            }),
            baseline: s.start.as_ref().and_then(|r| r.baseline.clone()),
            noise: s.noise.clone(),
        },
        None => {
            let starting = settle_start(
                k,
                &device.arch,
                opts.from_reference,
                &mut evaluator,
                &mut |e| {
                    let _ = run.journal().append(e);
                },
                &mut |m| progress(m),
            );
            let start = StartRecord {
                format: loop_record::FORMAT,
                reference_hash: k.hashes.reference.clone(),
                spec_hash: k.hashes.spec.clone(),
                accepted: accepted_now.clone(),
                start: starting.start.as_ref().map(|s| RecordedStart {
                    version: s.version.clone(),
                    verdict: s.verdict.clone(),
                    baseline: starting.baseline.clone(),
                }),
                noise: starting.noise.clone(),
                cases: cases.clone(),
                snapshot: snapshot.clone(),
            };
            let mut journal = run.journal();
            let rel = loop_record::unused_artefact(
                &journal,
                Some("loop"),
                &format!("{name}-start"),
                "json",
            );
            let written = journal
                .save_artefact(
                    &rel,
                    &serde_json::to_string(&start).expect("starts serialise"),
                )
                .and_then(|rel| {
                    journal.append(Event::KernelStarted {
                        kernel: name.clone(),
                        device: identity.clone(),
                        artefacts: vec![rel],
                    })
                });
            if let Err(e) = written {
                progress(&format!(
                    "{name}: the loop's start is not recorded ({e}): a resumed run measures it again"
                ));
            }
            starting
        }
    };
    if let Some(r) = record {
        evaluator.recorded = RecordedVerdicts::new(identity.clone(), r.verdicts.clone());
    }
    let rules = match &noise {
        Some(n) => {
            let r = opts.rules.above_noise(&n.deviations);
            progress(&format!(
                "{}: timing noise up to {:.1}% between two jobs of `{}`; a win needs {:.1}% on a shape or {:.1}% overall",
                name,
                100.0 * n.largest(),
                n.version,
                100.0 * r.min_gain,
                100.0 * r.min_uniform_gain
            ));
            r
        }
        None => opts.rules.clone(),
    };
    let task = Task {
        spec: &k.spec,
        reference: KernelVersion::reference(&k.spec, &k.reference.text),
        start,
        // Always charged, so that the run's summary counts what every kernel spent.
        run_budget: Some(&run.run_budget),
        device: format!(
            "{} ({}, {} SMs, {} MiB L2){}",
            device.name,
            device.arch,
            device.multiprocessors,
            device.l2_bytes >> 20,
            noise
                .as_ref()
                .map(|n| format!("; {}", n.describe(&rules)))
                .unwrap_or_default()
        ),
        ceilings: ceilings
            .as_ref()
            .map(|c| {
                format!(
                    "copy {:.0} GB/s{}",
                    c.copy_gbs,
                    c.matmul_bf16_tflops
                        .map(|t| format!("; bf16 matmul {t:.0} TFLOP/s"))
                        .unwrap_or_default()
                )
            })
            .unwrap_or_else(|| "not measured".into()),
        snapshot: snapshot.as_ref().map(|s| s.render(8)),
        structure: kopt_store::features::structural_summary(&k.reference.text),
        cases,
        hint: opts.hint.clone(),
        context_tokens: opts.context_tokens,
    };
    let (mut accepted, mut rejected, mut best) = (0usize, 0usize, None::<f64>);
    let recorded_ids: BTreeSet<String> = record
        .map(|r| r.verdicts.keys().cloned().collect())
        .unwrap_or_default();
    let recorded_malformed = record.map(|r| r.malformed.clone()).unwrap_or_default();
    let logs: Vec<ResumeLog> = [proposer_log.clone(), reviewer_log.clone()]
        .into_iter()
        .flatten()
        .collect();
    let mut noted_live = vec![false; logs.len()];
    let mut journal_failed = false;
    let outcome = run::optimize(
        &task,
        &mut client,
        reviewer.as_mut(),
        &mut evaluator,
        &opts.budget,
        &rules,
        &mut |e| {
            // The record, as it happens; what a resumed run answered from its record is
            // in the journal already.
            let written = match &e {
                run::Event::Exchange {
                    round,
                    purpose,
                    prompt,
                    reply,
                    tokens,
                    from_record,
                } => {
                    for (log, noted) in logs.iter().zip(noted_live.iter_mut()) {
                        if let (false, Some((at, why))) = (*noted, log.get().live_from) {
                            *noted = true;
                            let kept = log
                                .get()
                                .kept_in
                                .map(|p| {
                                    format!(
                                        "; the recorded exchanges from there are kept in {}",
                                        p.display()
                                    )
                                })
                                .unwrap_or_default();
                            progress(&format!(
                                "{name}: the live agent answers from exchange {at}: {why}"
                            ));
                            run.note(
                                &name,
                                format!("the live agent answers from exchange {at}: {why}{kept}"),
                            );
                        }
                    }
                    if *from_record {
                        Ok(())
                    } else {
                        let mut j = run.journal();
                        j.append(Event::Prompt {
                            kernel: name.clone(),
                            round: *round,
                            role: purpose.clone(),
                            text: prompt.clone(),
                        })
                        .and_then(|_| {
                            j.append(Event::Reply {
                                kernel: name.clone(),
                                round: *round,
                                role: purpose.clone(),
                                text: reply.clone().unwrap_or_else(|e| format!("error: {e}")),
                                tokens: *tokens,
                            })
                        })
                        .map(|_| ())
                    }
                }
                run::Event::Verdict {
                    id,
                    version,
                    from_record,
                    ..
                } if !from_record => {
                    if recorded_ids.contains(id) {
                        run.note(
                            &name,
                            format!("{id} was verified again: its job, device or best differ from those of its recorded verdict"),
                        );
                    }
                    let job = eval::job(g, k, (**version).clone(), None, &settings, true);
                    let key = loop_record::verdict_key(&job, &identity);
                    journal_verdict(&mut run.journal(), &name, key, &e)
                }
                run::Event::Malformed { round, id, error }
                    if !recorded_malformed.contains(&(id.clone(), error.clone())) =>
                {
                    let mut j = run.journal();
                    j.append(Event::Candidate {
                        kernel: name.clone(),
                        round: *round,
                        candidate: id.clone(),
                        summary: String::new(),
                        artefacts: vec![],
                    })
                    .and_then(|_| {
                        j.append(Event::Verdict {
                            kernel: name.clone(),
                            candidate: id.clone(),
                            passed: false,
                            failure_class: Some(loop_record::MALFORMED.into()),
                            detail: error.clone(),
                            times_us: BTreeMap::new(),
                            artefacts: vec![],
                        })
                    })
                    .map(|_| ())
                }
                _ => Ok(()),
            };
            if let (Err(err), false) = (written, journal_failed) {
                journal_failed = true;
                progress(&format!(
                    "{name}: the run's journal could not be written ({err}): a resumed run cannot answer from what follows"
                ));
            }
            match &e {
                run::Event::Verdict { accepted: a, .. } => {
                    if *a {
                        accepted += 1
                    } else {
                        rejected += 1
                    }
                }
                run::Event::Improved { speedup, .. } => {
                    best = Some(best.map_or(*speedup, |b: f64| b.max(*speedup)))
                }
                _ => {}
            }
            let round = match &e {
                run::Event::Round { round } => format!("round {round}"),
                run::Event::Request { purpose } => format!("asking ({purpose})"),
                run::Event::Exchange {
                    purpose,
                    from_record,
                    ..
                } => format!(
                    "{purpose} answered{}",
                    if *from_record { " from the record" } else { "" }
                ),
                run::Event::Candidate { id } => format!("verifying {id}"),
                run::Event::Verdict {
                    id,
                    summary,
                    from_record,
                    ..
                } => {
                    format!(
                        "{id}{}: {}",
                        if *from_record {
                            " (from the journal)"
                        } else {
                            ""
                        },
                        summary.lines().next().unwrap_or("")
                    )
                }
                run::Event::Malformed { id, .. } => format!("{id}: no usable proposal"),
                run::Event::Improved { id, speedup } => format!("{id} improves: {speedup:.2}x"),
                run::Event::RegionalWinner {
                    id,
                    region,
                    speedup,
                    ..
                } => format!("{id} wins where `{region}`: {speedup:.2}x"),
                run::Event::Narrowing { id, detail } => format!("{id}: {detail}"),
                run::Event::Reflection => "reflection turn".into(),
                run::Event::Review { id, objections } => {
                    format!("{id}: {objections} objection(s)")
                }
                run::Event::Sweep { id, points } => {
                    format!("searching {id}'s matrix: {points} other valid point(s)")
                }
                run::Event::SweepDone {
                    id,
                    evaluated,
                    points,
                    best,
                    stopped,
                } => format!(
                    "{id}'s matrix: {evaluated} of {points} point(s) evaluated{}{}",
                    best.as_ref()
                        .map(|b| format!(", best {b}"))
                        .unwrap_or_default(),
                    stopped
                        .as_ref()
                        .map(|s| format!(" ({s})"))
                        .unwrap_or_default()
                ),
            };
            progress(&format!(
                "{name}: {round} | best {} | {accepted} accepted, {rejected} rejected",
                best.map(|b| format!("{b:.2}x"))
                    .unwrap_or_else(|| "–".into())
            ));
        },
    );
    let last_job = evaluator.last_job.clone();
    let resumed = resuming.then(|| {
        let report = proposer_log.as_ref().map(|l| l.get()).unwrap_or_default();
        Resumption {
            finished_before: false,
            start_from_record: recorded_start.is_some(),
            exchanges: logs.iter().map(|l| l.get().replayed).sum(),
            verdicts: evaluator.recorded.answered,
            live_from: report.live_from,
        }
    });
    if let Some(r) = &resumed {
        run.note(
            &name,
            format!(
                "{} exchange(s) answered from the recorded session and {} verdict(s) from the journal; the loop's start {}",
                r.exchanges,
                r.verdicts,
                if r.start_from_record {
                    "from its record"
                } else {
                    "measured again"
                }
            ),
        );
    }
    if let Some(lib) = run
        .library
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_mut()
    {
        for t in &outcome.tried {
            if let (Some(r), Some(v)) = (&t.resolved, &t.verdict) {
                let _ = lib.upsert(&tried_case(
                    k,
                    &reference_metrics,
                    (&run.run_id, &device.arch, &t.id),
                    r,
                    v,
                ));
            }
        }
    }
    // The kernel's counts are the journal's, as the run's summary's are.
    let counts = {
        let journal = run.journal();
        run.counts(&journal).remove(&name).unwrap_or_default()
    };
    let mut result = KernelResult {
        kernel: name.clone(),
        stop: outcome.stop.clone(),
        rounds: outcome.rounds,
        accepted: counts.accepted,
        rejected: counts.rejected,
        best_speedup: best,
        pending: None,
        regional_pending: Vec::new(),
        escalation: None,
        tokens: outcome.spend.usage.input_tokens + outcome.spend.usage.output_tokens,
        dollars: outcome.spend.dollars,
        device: slot_ordinal,
        pending_refused: None,
        noise,
        resumed,
    };
    if let Stop::Escalated { reason, suspicion } = &outcome.stop {
        let note = format!(
            "# `{name}` needs a person\n\n{reason}.\n\nWhat kopt suspects: {suspicion}\n\nThe run's journal, sessions and candidates are in this folder. Resume with guidance:\n\n    cargo kopt optimize {name} --agent {} --hint \"...\"\n",
            opts.agent
        );
        result.escalation = run
            .journal()
            .save_artefact(&format!("{name}-escalation.md"), &note)
            .ok();
    }
    let budget = files::BudgetUsed {
        rounds: Some(outcome.rounds),
        candidates: Some(outcome.tried.len() as u32),
        wall_time_s: None,
        tokens: Some(outcome.spend.usage.input_tokens + outcome.spend.usage.output_tokens),
        cost_usd: Some(outcome.spend.dollars),
    };
    // The winner on every shape (with the last job: every candidate's has its shapes and
    // seeds), then each region's, with the job it was verified in (a job is a function of
    // the candidate, the region and the run's salt).
    let mut winners = Vec::new();
    if let (Some((version, resolved, verdict)), Some(job)) = (&outcome.best, last_job) {
        winners.push((version, &resolved.proposal, verdict, job, None, None));
    }
    for w in &outcome.regional {
        let region = k.spec.parse_region(&w.region).ok();
        let job = eval::job(
            g,
            k,
            w.version.clone(),
            region.as_ref(),
            &opts.settings,
            true,
        );
        let found = Some((w.region.as_str(), w.found.as_ref()));
        winners.push((
            &w.version,
            &w.resolved.proposal,
            &w.verdict,
            job,
            found,
            w.narrowed.as_ref(),
        ));
    }
    let mut pending = Vec::new();
    for (version, proposal, verdict, job, region, narrowed) in winners {
        let everywhere = region.is_none();
        // A winner narrowed at the loop's end was the best on every shape (or the start):
        // its baseline and sweep are still its own.
        let was_best = everywhere || narrowed.is_some_and(|n| n.was_best);
        let is_start = narrowed.is_some_and(|n| n.is_start);
        let winner = Winner {
            k,
            arch: &device.arch,
            device_name: &device.name,
            driver_api: device.driver_api,
            copy_gbs: ceilings.as_ref().map(|c| c.copy_gbs),
            snapshot_before: snapshot.as_ref().map(|s| s.for_rationale()),
            version,
            proposal,
            verdict,
            job: &job,
            agent: if is_start { "kopt" } else { &opts.agent },
            run_id: &run.run_id,
            session: &session,
            root: &g.workspace_root,
            budget: budget.clone(),
            sweep: outcome.best_sweep.as_ref().filter(|_| everywhere),
            baseline: baseline.clone().filter(|_| was_best && !is_start),
            retires: narrowed
                .filter(|n| n.retires_start)
                .and_then(|_| baseline.as_ref().map(|(b, _)| b.clone())),
            rules: Some(&rules),
            region,
        };
        match pending_variant(&winner) {
            Ok(p) => {
                match everywhere {
                    true => result.pending = Some(p.label()),
                    false => result.regional_pending.push(p.label()),
                }
                pending.push(p);
            }
            Err(e) if everywhere => {
                progress(&format!("{name}: the winner is not recorded: {e}"));
                result.pending_refused = Some(e.to_string());
            }
            Err(e) => progress(&format!(
                "{name}: the winner where `{}` is not recorded: {e}",
                region.map_or("", |r| r.0)
            )),
        }
    }
    // The loop's end, with the winner's pending variant in full before it is saved: a run
    // stopped between the two saves it when resumed.
    let mut journal = run.journal();
    let mut artefacts = Vec::new();
    for p in &pending {
        let rel = loop_record::unused_artefact(&journal, Some("pending"), &name, "json");
        artefacts.push(journal.save_artefact(
            &rel,
            &serde_json::to_string(&PendingRecord::of(p)).expect("pending variants serialise"),
        )?);
    }
    journal.append(Event::KernelFinished {
        kernel: name.clone(),
        result: serde_json::to_value(&result).expect("results serialise"),
        artefacts,
    })?;
    for p in &pending {
        journal.save_pending(&run.kopt, p)?;
    }
    Ok(result)
}

/// The geometric mean of a verdict's speedups over the reference on its declared (not
/// held-out) shapes; `None` when nothing was timed.
pub fn geo_speedup(v: &Verdict) -> Option<f64> {
    let s: Vec<f64> = v
        .shapes
        .iter()
        .filter(|s| !s.held_out)
        .filter_map(|s| s.speedup)
        .collect();
    (!s.is_empty()).then(|| (s.iter().map(|x| x.ln()).sum::<f64>() / s.len() as f64).exp())
}

/// A verified winner and what its pending variant's rationale is built from.
pub struct Winner<'a> {
    pub k: &'a Kernel,
    pub arch: &'a str,
    pub device_name: &'a str,
    pub driver_api: u32,
    pub copy_gbs: Option<f64>,
    pub snapshot_before: Option<files::BottleneckSnapshot>,
    pub version: &'a KernelVersion,
    /// The stated reasons (diagnosis, changes, risks) the rationale cites.
    pub proposal: &'a kopt_agent::proposal::Proposal,
    pub verdict: &'a Verdict,
    /// The job the verdict came from (its shapes and seeds are the evidence).
    pub job: &'a EvalJob,
    pub agent: &'a str,
    pub run_id: &'a str,
    /// The recorded session (or journal) the rationale points to.
    pub session: &'a std::path::Path,
    pub root: &'a std::path::Path,
    pub budget: files::BudgetUsed,
    /// The loop's sweep of the agent's matrix that chose the winner's defines, if one did:
    /// the rationale records it with every point's time per shape.
    pub sweep: Option<&'a run::MatrixSweep>,
    /// The accepted variant the winner had to beat, and its time per shape measured in
    /// the same run (the winner's speedups stay relative to the reference, timed in the
    /// same job as it).
    pub baseline: Option<BaselineTimes>,
    /// The rule for a new best the winner cleared (after the run's timing noise), which
    /// the rationale states; `None` where the caller's own rule is described elsewhere.
    pub rules: Option<&'a Rules>,
    /// The region it won, when not every shape, and how the loop found it (`None`: its
    /// proposal claimed it).
    pub region: Option<(&'a str, Option<&'a run::FoundRegion>)>,
    /// The accepted variant that accepting the winner retires (a winner narrowed to where
    /// it is not slower than the reference, which leaves the other shapes to the
    /// reference rather than to that variant).
    pub retires: Option<Baseline>,
}

/// An accepted variant a winner had to beat, and its time per shape in the same run.
pub type BaselineTimes = (Baseline, BTreeMap<String, f64>);

/// Where a kernel's loop starts, settled before its first round.
pub struct Starting {
    /// The accepted variant it starts from (`None`: the reference).
    pub start: Option<run::Start>,
    pub baseline: Option<BaselineTimes>,
    /// The starting version timed twice (`None` when a job failed).
    pub noise: Option<TimingNoise>,
}

/// Settles a kernel's start, as `cargo kopt optimize` and the MCP server both do: the
/// accepted variant unless `from_reference` ([`starting_point`]), then that version timed
/// again for the noise ([`timing_noise`]); `baseline` and `noise` events go to `record`.
pub fn settle_start(
    k: &Kernel,
    arch: &str,
    from_reference: bool,
    evaluator: &mut LoopEvaluator,
    record: &mut dyn FnMut(Event),
    progress: &mut dyn FnMut(&str),
) -> Starting {
    let (start, baseline) = if from_reference {
        (None, None)
    } else {
        starting_point(k, arch, evaluator, record, progress)
    };
    // The same version timed twice: the noise between two jobs on this device now, which
    // a win must clear.
    let noise = timing_noise(k, start.as_ref(), evaluator, progress);
    if let Some(n) = &noise {
        record(Event::Noise {
            kernel: k.spec.name.clone(),
            version: n.version.clone(),
            deviations: n.deviations.clone(),
        });
    }
    Starting {
        start,
        baseline,
        noise,
    }
}

/// The same version timed in two jobs: per declared shape, how far its time moved
/// (second / first - 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimingNoise {
    /// The version timed twice: the loop's starting point.
    pub version: String,
    pub deviations: BTreeMap<String, f64>,
}

impl TimingNoise {
    /// The largest deviation, either way.
    pub fn largest(&self) -> f64 {
        self.deviations.values().fold(0.0, |a, d| a.max(d.abs()))
    }

    /// What the agent's context says of it, with the thresholds it led to.
    pub fn describe(&self, rules: &Rules) -> String {
        format!(
            "timing noise: the same version timed in two jobs moved by up to {:.1}%, so a win needs {:.1}% on some shape or {:.1}% over all",
            100.0 * self.largest(),
            100.0 * rules.min_gain,
            100.0 * rules.min_uniform_gain
        )
    }
}

/// Times the loop's starting version a second time, measured now: its first timing is the
/// accepted variant's verification ([`starting_point`]), or for the reference a job of its
/// own. `None` (and a progress line) when either job failed.
fn timing_noise(
    k: &Kernel,
    start: Option<&run::Start>,
    evaluator: &mut LoopEvaluator,
    progress: &mut dyn FnMut(&str),
) -> Option<TimingNoise> {
    let times = |v: &Verdict| -> BTreeMap<String, f64> {
        v.shapes
            .iter()
            .filter(|s| !s.held_out)
            .filter_map(|s| Some((s.shape.clone(), s.candidate_us?)))
            .collect()
    };
    let (version, first) = match start {
        Some(s) => (s.version.clone(), s.verdict.clone()),
        None => {
            let r = KernelVersion::reference(&k.spec, &k.reference.text);
            progress(&format!(
                "{}: timing the reference twice, for the noise",
                k.spec.name
            ));
            let v = evaluator.time_now(&r);
            (r, v)
        }
    };
    let second = evaluator.time_now(&version);
    let (a, b) = (times(&first), times(&second));
    let deviations: BTreeMap<String, f64> = a
        .iter()
        .filter_map(|(shape, t0)| Some((shape.clone(), b.get(shape)? / t0 - 1.0)))
        .filter(|(_, d)| d.is_finite())
        .collect();
    if !first.accepted || !second.accepted || deviations.is_empty() {
        progress(&format!(
            "{}: the noise was not measured ({}): the loop's default thresholds apply",
            k.spec.name,
            [&first, &second]
                .iter()
                .find(|v| !v.accepted)
                .map(|v| v.summary().lines().next().unwrap_or("").to_string())
                .unwrap_or_else(|| "no timed shape".into())
        ));
        return None;
    }
    Some(TimingNoise {
        version: version.id.clone(),
        deviations,
    })
}

/// The accepted variant of `arch` a kernel's loop starts from, verified again on this
/// device: the one variant accepted there for every shape. None (the reference) when no
/// variant is accepted for `arch`, when the accepted one claims only a region (a
/// candidate is one source for every shape), or when it fails verification now; each case
/// is said in the progress, and the verification is `record`ed (a `baseline` event).
fn starting_point(
    k: &Kernel,
    arch: &str,
    evaluator: &mut LoopEvaluator,
    record: &mut dyn FnMut(Event),
    progress: &mut dyn FnMut(&str),
) -> (Option<run::Start>, Option<BaselineTimes>) {
    let name = &k.spec.name;
    let Some(e) = k.state.entries.iter().find(|e| e.entry.arch == arch) else {
        return (None, None);
    };
    let variant = &e.entry.variant;
    let usable = match &e.status {
        Ok(u) if u.region.is_none() => u,
        Ok(_) => {
            progress(&format!(
                "{name}: `{variant}` is accepted for {arch} only where `{}`: the loop starts from the reference",
                e.entry.region.as_deref().unwrap_or("")
            ));
            return (None, None);
        }
        Err(why) => {
            progress(&format!(
                "{name}: `{variant}` cannot be used ({}): the loop starts from the reference",
                why.describe()
            ));
            return (None, None);
        }
    };
    progress(&format!(
        "{name}: verifying the accepted `{variant}`, the loop's starting point"
    ));
    let version = eval::version(usable);
    let verdict = evaluator.evaluate_now(&version);
    record(Event::Baseline {
        kernel: name.clone(),
        variant: variant.clone(),
        passed: verdict.accepted,
        detail: verdict.summary(),
        times_us: verdict.candidate_times(),
    });
    if !verdict.accepted {
        progress(&format!(
            "{name}: the accepted `{variant}` fails verification now ({}): the loop starts from the reference; `cargo kopt verify {name}` says more",
            verdict.summary().lines().next().unwrap_or("")
        ));
        return (None, None);
    }
    let baseline = Baseline {
        variant: variant.clone(),
        source_hash: e.entry.source_hash.clone(),
    };
    let times = verdict.candidate_times();
    (
        Some(run::Start { version, verdict }),
        Some((baseline, times)),
    )
}

/// The pending variant of a verified winner, its rationale built (and checked) from the
/// evidence: refuses a winner whose evidence does not support it.
/// The sanitizer pass of a winner as evidence fences (`sanitizer:memcheck`, ...): passed
/// when the tool ran clean or could not run, the detail saying which; a winner without a
/// pass (a caller that ran none) says so in one fence rather than claiming a clean run.
fn sanitizer_fences(verdict: &Verdict) -> Vec<PendingFence> {
    match &verdict.sanitizer {
        None => vec![PendingFence {
            name: "sanitizer".into(),
            passed: true,
            detail: "not run (--no-sanitize)".into(),
        }],
        Some(run) => run
            .results
            .iter()
            .map(|r| PendingFence {
                name: format!("sanitizer:{}", r.tool()),
                passed: !r.is_error(),
                detail: format!(
                    "{} on {} ({:.1} s for the pass)",
                    r.describe(),
                    run.shapes.join(", "),
                    run.seconds
                ),
            })
            .collect(),
    }
}

/// The sanitizer pass in one sentence for the rationale.
fn sanitizer_sentence(verdict: &Verdict) -> String {
    match &verdict.sanitizer {
        None => "compute-sanitizer was not run (--no-sanitize)".into(),
        Some(run) => format!(
            "compute-sanitizer on {} ({}; {:.1} s)",
            run.shapes.join(", "),
            run.describe(),
            run.seconds
        ),
    }
}

pub fn pending_variant(w: &Winner) -> Result<PendingVariant> {
    let Winner {
        k,
        arch,
        device_name,
        driver_api,
        copy_gbs,
        version,
        verdict,
        job,
        agent,
        run_id,
        session,
        root,
        ..
    } = *w;
    let snapshot_before = w.snapshot_before.clone();
    let variant_id = format!("{}-{}", run_id, version.id).replace(['/', ' '], "-");
    let p = w.proposal;
    let session_rel = session
        .strip_prefix(root)
        .unwrap_or(session)
        .display()
        .to_string();
    let measurements: Vec<ShapeMeasurement> = verdict
        .shapes
        .iter()
        .filter(|s| !s.held_out)
        .filter_map(|s| {
            let case = job.shapes.iter().find(|c| c.label == s.shape)?;
            let args = k.spec.shape_args(&kopt_spec::spec::Shape {
                values: case.values.clone(),
                weight: 1.0,
            });
            Some(ShapeMeasurement {
                shape: case.values.clone(),
                reference_us: s.reference_us?,
                variant_us: s.candidate_us?,
                ideal_bytes: Some(kopt_spec::shapes::ideal_bytes(&k.spec, &args)),
                registers: s.registers,
                occupancy_pct: s.occupancy_pct,
            })
        })
        .collect();
    let mut outputs: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for s in &verdict.shapes {
        for (b, (a, r)) in &s.outputs {
            let e = outputs.entry(b.clone()).or_insert((0.0, 0.0));
            e.0 = e.0.max(*a);
            e.1 = e.1.max(*r);
        }
    }
    let fences_passed = "numerics on poisoned outputs (candidate before and after the reference), unmodified inputs, held-out shapes, the re-check after timing, the roofline bound and the watchdog";
    let search = w.sweep.map(|s| parameter_search(s, version));
    let summary = match &search {
        Some(s) if s.chosen != version.id || s.points.len() > 1 => {
            let said = p.diagnosis.summary.trim_end();
            format!(
                "{said}{} Its defines ({}) were chosen by the optimisation loop's search over the agent's parameter matrix, among the {} point(s) it verified in full (see Parameter search).",
                if said.ends_with('.') { "" } else { "." },
                run::describe_defines(&version.defines),
                s.points.len()
            )
        }
        _ => p.diagnosis.summary.clone(),
    };
    let summary = match &w.baseline {
        Some((b, before)) => format!(
            "{}{} {}",
            summary.trim_end(),
            if summary.trim_end().ends_with('.') {
                ""
            } else {
                "."
            },
            against_baseline(&b.variant, arch, before, verdict)
        ),
        None => summary,
    };
    let summary = match w.rules {
        Some(r) => format!("{} {}", summary.trim_end(), win_rule(r)),
        None => summary,
    };
    let summary = match w.region {
        None => summary,
        Some((region, found)) => format!(
            "{} It is a winner where `{region}` holds, and only there: {}.",
            summary.trim_end(),
            match found {
                Some(f) => f.describe(region),
                None => "its proposal claimed that region, and it was verified and timed on the declared and held-out shapes inside it".to_string(),
            }
        ),
    };
    let compile = kopt_engine::precompile::record(&k.spec.name, version, arch);
    let (ptx, ptx_record) = verified_ptx(version, device_name, compile.as_ref());
    let e = Evidence {
        kernel: k.spec.name.clone(),
        variant: variant_id.clone(),
        arch: arch.to_string(),
        claim: None,
        summary,
        snapshot_before,
        snapshot_after: None,
        diagnosis: files::Diagnosis {
            bottleneck: p.diagnosis.bottleneck.clone(),
            explanation: p.diagnosis.summary.clone(),
            evidence: p.diagnosis.evidence.clone(),
            confidence: None,
        },
        changes: p
            .changes
            .iter()
            .map(|c| files::Change {
                what: c.what.clone(),
                why: c.why.clone(),
            })
            .collect(),
        risks: p
            .risks
            .iter()
            .map(|r| files::Risk {
                risk: r.clone(),
                covered_by: fences_passed.into(),
            })
            .collect(),
        verification: NumericEvidence {
            method: format!(
                "kopt's evaluation engine: {fences_passed}; {} declared and {} held-out shapes; {}.",
                job.shapes.iter().filter(|s| !s.held_out).count(),
                job.shapes.iter().filter(|s| s.held_out).count(),
                sanitizer_sentence(verdict)
            ),
            outputs: k
                .spec
                .buffers()
                .filter(|b| b.is_output())
                .map(|b| {
                    let t = b.effective_tolerance(&k.spec);
                    let (a, r) = outputs.get(&b.name).copied().unwrap_or((0.0, 0.0));
                    NumericResult {
                        check: OutputCheck {
                            buffer: b.name.clone(),
                            rtol: t.rtol,
                            atol: t.atol,
                            max_abs_error: a,
                            max_rel_error: r,
                        },
                        failing_elements: 0,
                    }
                })
                .collect(),
            seeds: verdict.seeds.clone(),
        },
        measurements,
        search,
        compile: compile.clone(),
        device: evidence::Device {
            name: device_name.to_string(),
            driver: format!("CUDA {}.{}", driver_api / 1000, (driver_api % 1000) / 10),
            cuda: None,
            copy_bandwidth_gbs: copy_gbs,
        },
        agent: agent.to_string(),
        date: run_id.to_string(),
        session: Some(session_rel.clone()),
        budget: Some(w.budget.clone()),
    };
    let rationale = evidence::build(&e).map_err(Error::Refused)?;
    let variant = VariantFile {
        format: files::FORMAT,
        kernel: k.spec.name.clone(),
        id: variant_id.clone(),
        entry: version.entry.clone(),
        args: version.args.clone(),
        launch: version.launch.clone(),
        defines: version.defines.clone(),
        options: version.options.clone(),
    };
    let meta = PendingMeta {
        format: files::FORMAT,
        package: k.package.clone(),
        kernel: k.spec.name.clone(),
        arch: arch.to_string(),
        variant: variant_id,
        region: w.region.map(|(r, _)| r.to_string()),
        reference_hash: k.hashes.reference.clone(),
        spec_hash: k.hashes.spec.clone(),
        verified_by: VerifiedBy::Kopt,
        created_at: run_id.to_string(),
        run_id: run_id.to_string(),
        session: Some(session_rel),
        kind: None,
        baseline: w.baseline.as_ref().map(|(b, _)| b.clone()),
        retires: w.retires.clone(),
        ptx: ptx_record,
        evidence: EvidenceSummary {
            shapes_checked: job
                .shapes
                .iter()
                .filter(|s| !s.held_out)
                .map(|s| s.label.clone())
                .collect(),
            held_out_shapes: job
                .shapes
                .iter()
                .filter(|s| s.held_out)
                .map(|s| s.label.clone())
                .collect(),
            fences: [
                "compile",
                "numerics",
                "held-out",
                "inputs-unmodified",
                "after-timing",
                "roofline",
                "watchdog",
            ]
            .iter()
            .map(|f| PendingFence {
                name: f.to_string(),
                passed: true,
                detail: "passed".into(),
            })
            .chain(sanitizer_fences(verdict))
            .collect(),
        },
    };
    let p = PendingVariant {
        meta,
        source: version.source.clone(),
        variant,
        rationale,
        ptx,
    };
    p.validate().map_err(Error::Refused)?;
    Ok(p)
}

/// The PTX a winner's verification loaded, and what compiled it, to keep with the pending
/// variant: the worker loaded `version.ptx` (the compile fence's PTX, attached to the job
/// by the loop's evaluator and the search's verification). None on the fake device (its
/// "PTX" is made up), for a version the worker loaded as a cubin, or without the compile
/// figures that name the NVRTC (then the launcher compiles the source).
fn verified_ptx(
    version: &KernelVersion,
    device_name: &str,
    compile: Option<&files::CompileFigures>,
) -> (Option<String>, Option<files::PtxRecord>) {
    let (Some(ptx), Some(c)) = (&version.ptx, compile) else {
        return (None, None);
    };
    if files::is_fake_device(device_name) || version.cubin.is_some() {
        return (None, None);
    }
    let record = kopt_engine::precompile::ptx_record(ptx, c, version.symbol.clone());
    (Some(ptx.clone()), Some(record))
}

/// The rationale's sentence on the rule for a new best that a winner cleared.
fn win_rule(r: &Rules) -> String {
    format!(
        "A new best had to be faster than the best before it by more than {:.1}% on some shape, or by more than {:.1}% in geometric mean and slower on none beyond the timing noise measured there (the run's thresholds, never below twice the timing noise it measured).",
        100.0 * r.min_gain,
        100.0 * r.min_uniform_gain
    )
}

/// The rationale's sentence on the accepted variant a winner had to beat: its time and the
/// winner's per declared shape, both measured in this run.
fn against_baseline(
    variant: &str,
    arch: &str,
    before: &BTreeMap<String, f64>,
    winner: &Verdict,
) -> String {
    let pairs: Vec<(String, f64, f64)> = winner
        .shapes
        .iter()
        .filter(|s| !s.held_out)
        .filter_map(|s| Some((s.shape.clone(), *before.get(&s.shape)?, s.candidate_us?)))
        .collect();
    let mean = (!pairs.is_empty()).then(|| {
        (pairs.iter().map(|(_, b, w)| (b / w).ln()).sum::<f64>() / pairs.len() as f64).exp()
    });
    format!(
        "The optimisation loop started from `{variant}`, the variant accepted for {arch}, verified again in the same run{}: {}.",
        mean.map(|m| format!(" ({m:.2}x in geometric mean over the declared shapes)"))
            .unwrap_or_default(),
        pairs
            .iter()
            .map(|(shape, b, w)| format!("{shape} {w:.2} µs against its {b:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The rationale's record of a matrix sweep: how the point was chosen, and every point's
/// defines, outcome and time per declared shape.
fn parameter_search(s: &run::MatrixSweep, winner: &KernelVersion) -> files::ParameterSearch {
    let chosen = s.chosen.clone().unwrap_or_else(|| winner.id.clone());
    let combos: usize = s.matrix.values().map(Vec::len).product();
    let kept = if chosen == s.base {
        format!("no other point beat the agent's own defines, so `{chosen}` (the agent's candidate) was kept")
    } else {
        format!("`{chosen}` is the last point that rule took, so its defines replace the agent's")
    };
    let keys = s
        .matrix
        .keys()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let over = format!(
        "parameter matrix ({combos} combination(s) of {keys}, over the candidate `{}` and its other defines)",
        s.base
    );
    let judged = format!("verified in full by the same engine and fences as any candidate (numerics on fresh inputs, held-out shapes, the watchdog), one after another, each judged by the loop's rule for a new best (every fence passed, and faster than the best so far by the minimum gain on some shape); {kept}.");
    let mut method = if s.exhaustive {
        format!(
            "The optimisation loop's exhaustive sweep of the agent's {over}: every point {judged}"
        )
    } else {
        format!(
            "The optimisation loop's hill climb over the agent's {over}, from the candidate's own defines, one axis one step first, while the candidate budget lasted: {} of the {} other valid point(s) {judged}",
            s.points.len().saturating_sub(1),
            s.planned,
        )
    };
    if s.pruned > 0 {
        method.push_str(&format!(
            " {} combination(s) were not run: they break the kernel's constraints or a launch limit on a declared shape.",
            s.pruned
        ));
    }
    files::ParameterSearch {
        method,
        matrix: s.matrix.clone(),
        chosen,
        stopped: s.stopped.clone(),
        points: s
            .points
            .iter()
            .map(|p| files::SearchPoint {
                point: p.id.clone(),
                defines: p
                    .defines
                    .iter()
                    .filter(|(k, _)| s.matrix.contains_key(*k))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect(),
                // The verdict's first line up to its details (seeds, neighbourhoods).
                outcome: match p.verdict.failures.first() {
                    None => "verified".into(),
                    Some(_) => {
                        let summary = p.verdict.summary();
                        let line = summary.lines().next().unwrap_or("");
                        line.split("; ").next().unwrap_or(line).to_string()
                    }
                },
                // Times only of correct points: a point that computed wrong results has
                // no time worth comparing (the watchdog's rejection is about time alone).
                times_us: if p.verdict.correct() {
                    p.verdict
                        .shapes
                        .iter()
                        .filter(|sh| !sh.held_out)
                        .filter_map(|sh| Some((sh.shape.clone(), sh.candidate_us?)))
                        .collect()
                } else {
                    BTreeMap::new()
                },
            })
            .collect(),
    }
}

/// The case library at its configured path (`$KOPT_CASES`, else the user's data folder),
/// when one exists there; the loop and the MCP server never create one.
pub fn existing_case_library() -> Option<kopt_store::cases::CaseLibrary> {
    kopt_store::cases::library_path(None)
        .ok()
        .filter(|p| p.exists())
        .and_then(|p| kopt_store::cases::CaseLibrary::open(&p).ok())
}

/// Up to five similar past cases, by the snapshot's metric vector (when one was taken:
/// `metrics` empty otherwise), structure and identifiers.
pub fn similar_cases(
    lib: Option<&kopt_store::cases::CaseLibrary>,
    kernel: &str,
    source: &str,
    metrics: &BTreeMap<String, f64>,
) -> Vec<kopt_agent::context::CaseLine> {
    let Some(lib) = lib else { return vec![] };
    let q = kopt_store::cases::Query {
        kind: Some(kopt_store::features::infer_kind(kernel, source).to_string()),
        metrics: metrics.clone(),
        text: kopt_store::features::search_text(source),
        weights: Default::default(),
    };
    lib.search(&q, 5)
        .unwrap_or_default()
        .into_iter()
        .map(|n| kopt_agent::context::CaseLine {
            title: n.case.id.clone(),
            outcome: match (n.case.outcome.status, n.case.outcome.speedup) {
                (kopt_store::cases::Status::Accepted, Some(s)) => format!("accepted, {s:.2}x"),
                (st, _) => format!(
                    "{}{}",
                    st.as_str(),
                    n.case
                        .outcome
                        .failure_class
                        .as_ref()
                        .map(|f| format!(" ({f})"))
                        .unwrap_or_default()
                ),
            },
            diagnosis: format!(
                "{}: {}",
                n.case.diagnosis.bottleneck, n.case.diagnosis.explanation
            ),
            change: n.case.change.clone(),
            similarity: n.score,
            metric_similarity: (!metrics.is_empty()).then_some(n.metric_similarity),
            text_similarity: n.text_similarity,
        })
        .collect()
}

/// A candidate of the loop as a case: accepted ones with their speedup, the others as
/// negative cases with the fence that stopped them. `metrics` is the metric vector of the
/// reference's snapshot (the version the candidate set out to improve), empty when no
/// snapshot was taken.
pub fn tried_case(
    k: &Kernel,
    metrics: &BTreeMap<String, f64>,
    (run_id, arch, candidate): (&str, &str, &str),
    r: &kopt_agent::proposal::Resolved,
    v: &Verdict,
) -> kopt_store::cases::Case {
    use kopt_store::cases::{Case, CaseDiagnosis, CaseOutcome, Features, Origin, Status};
    let speedups: Vec<f64> = v.shapes.iter().filter_map(|s| s.speedup).collect();
    let geo = (!speedups.is_empty())
        .then(|| (speedups.iter().map(|x| x.ln()).sum::<f64>() / speedups.len() as f64).exp());
    let failure = v.failures.first().map(|f| f.fence.name().to_string());
    Case {
        id: format!(
            "{}/{}/{}-{candidate}@{arch}",
            k.package, k.spec.name, run_id
        ),
        kind: kopt_store::features::infer_kind(&k.spec.name, &r.source).to_string(),
        features: Features {
            metrics: metrics.clone(),
            structure: kopt_store::features::structural_summary(&k.reference.text),
            source_tokens: kopt_store::features::source_tokens(&r.source),
        },
        diagnosis: CaseDiagnosis {
            bottleneck: r.proposal.diagnosis.bottleneck.clone(),
            explanation: r.proposal.diagnosis.summary.clone(),
        },
        change: r
            .proposal
            .changes
            .iter()
            .map(|c| format!("{}: {}", c.what, c.why))
            .collect::<Vec<_>>()
            .join("; "),
        outcome: CaseOutcome {
            speedup: geo,
            status: match (&failure, v.accepted) {
                (None, true) => Status::Accepted,
                (Some(f), _) if f == "compile" || f == "fault" || f == "hang" || f == "crash" => {
                    Status::Failed
                }
                _ => Status::Rejected,
            },
            failure_class: failure,
        },
        origin: Origin {
            repo: None,
            krate: Some(k.package.clone()),
            kernel: k.spec.name.clone(),
            variant: Some(format!("{run_id}-{candidate}")),
            arch: Some(arch.to_string()),
        },
    }
}

/// Profiles the reference on its first declared shape (engine figures, ncu where it
/// exists, PTX/SASS, structure) into `dir`; `None` when nothing could be measured.
/// Profiles the reference on its first shape and writes `snapshot.json` to `dir`. With a
/// case library, the snapshot's confidence is that of the nearest accepted case of its
/// class where the library holds one (a library that cannot be searched leaves the rules'
/// confidence in place).
pub fn profile_reference(
    g: &Gathered,
    k: &Kernel,
    engine: &mut Engine,
    (settings, ncu): (&Settings, &kopt_profile::collect::NcuChoice),
    library: Option<&kopt_store::cases::CaseLibrary>,
    dir: &std::path::Path,
    progress: &mut dyn FnMut(&str),
) -> Option<kopt_profile::snapshot::Snapshot> {
    let reference = KernelVersion::reference(&k.spec, &k.reference.text);
    let check = eval::shape_job(g, k, reference.clone(), 0, false).ok()?;
    let timed = eval::shape_job(g, k, reference, 0, true).ok()?;
    let cmd = eval::worker_command(settings.device).ok()?;
    let collected = kopt_profile::collect::run(
        kopt_profile::collect::Request {
            kernel: &k.spec.name,
            check_job: &check,
            timed_job: &timed,
            dir,
            gpu: kopt_profile::collect::Gpu::Available {
                engine,
                worker_program: cmd.program.clone(),
                worker_args: cmd.args.clone(),
            },
            ncu: ncu.clone(),
            arch: None,
        },
        progress,
    )
    .ok()?;
    let mut snap = kopt_profile::snapshot::build(collected);
    if let Some(lib) = library {
        let kind = kopt_store::features::infer_kind(&k.spec.name, &k.reference.text);
        let _ = snap.use_case_library(
            lib,
            kind,
            &kopt_store::features::search_text(&k.reference.text),
        );
    }
    let json = serde_json::to_string_pretty(&snap).ok()? + "\n";
    let _ = files::write_atomic(&dir.join("snapshot.json"), json.as_bytes());
    Some(snap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_climbed_or_pruned_matrix_is_said_so_in_the_rationale() {
        let item = kopt_spec::spec::parse_item(
            "pub fn scale(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: u32);"
                .parse()
                .unwrap(),
        )
        .unwrap();
        let spec = kopt_spec::spec::parse_kernel("reference = \"k.cu\", x: [n], y: [n], grid = ceil_div(n, 256), block = 256, shapes = [{ n: 4096 }]".parse().unwrap(), &item).unwrap().0;
        let winner = KernelVersion::reference(&spec, "// k.cu");
        let point = |id: &str, block: i64| run::SweptPoint {
            id: id.into(),
            defines: BTreeMap::from([("BLOCK".to_string(), block)]),
            verdict: Verdict::compile_rejected("k.cu(1): error"),
        };
        let mut sweep = run::MatrixSweep {
            base: "r1c1".into(),
            matrix: BTreeMap::from([("BLOCK".to_string(), vec![64, 128, 256, 512, 1024, 2048])]),
            points: vec![point("r1c1", 256), point("r1c1-m1", 512)],
            planned: 4,
            exhaustive: true,
            pruned: 1,
            chosen: Some("r1c1".into()),
            stopped: None,
        };
        let exhaustive = parameter_search(&sweep, &winner).method;
        assert!(
            exhaustive.starts_with("The optimisation loop's exhaustive sweep"),
            "{exhaustive}"
        );
        assert!(
            exhaustive.ends_with(" 1 combination(s) were not run: they break the kernel's constraints or a launch limit on a declared shape."),
            "{exhaustive}"
        );
        sweep.exhaustive = false;
        sweep.pruned = 0;
        let climbed = parameter_search(&sweep, &winner).method;
        assert!(
            climbed.starts_with("The optimisation loop's hill climb over the agent's parameter matrix (6 combination(s) of `BLOCK`"),
            "{climbed}"
        );
        assert!(
            climbed.contains("1 of the 4 other valid point(s) verified in full"),
            "{climbed}"
        );
        assert!(!climbed.contains("every point"), "{climbed}");
        assert!(!climbed.contains("were not run"), "{climbed}");
    }

    #[test]
    fn agent_configuration_layers_user_then_workspace_then_environment() {
        let d = tempfile::tempdir().unwrap();
        let user = d.path().join("config");
        std::fs::create_dir_all(user.join("kopt")).unwrap();
        std::fs::write(user.join("kopt/config.toml"), "[agent]\nopenai_base_url = \"http://user:1/v1\"\nanthropic_key_env = \"MY_ANTHROPIC\"\ntimeout_s = 7\n").unwrap();
        let ws = d.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(ws.join("kopt.toml"), "[agent]\nopenai_base_url = \"http://workspace:2/v1\"\n[agent.prices.\"openai:m\"]\ninput_per_mtok = 1.5\noutput_per_mtok = 6.0\n").unwrap();
        std::env::set_var("XDG_CONFIG_HOME", &user);
        let g = Gathered {
            workspace_root: ws.clone(),
            ..Gathered::default()
        };
        let c = AgentConfig::load(&g).unwrap();
        assert_eq!(
            c.openai_base_url, "http://workspace:2/v1",
            "the workspace overrides the user"
        );
        assert_eq!(
            c.anthropic_key_env, "MY_ANTHROPIC",
            "the user's keys stay where the workspace says nothing"
        );
        assert_eq!(c.timeout_s, 7);
        assert_eq!(c.prices["openai:m"].output_per_mtok, 6.0);
        assert_eq!(
            c.anthropic_base_url, "https://api.anthropic.com",
            "defaults fill the rest"
        );
        // The workspace's Cargo.toml sits between the user's file and kopt.toml.
        std::fs::write(
            ws.join("Cargo.toml"),
            "[workspace]\nmembers = []\n[workspace.metadata.kopt.agent]\nopenai_base_url = \"http://cargo:3/v1\"\nopenai_key_env = \"TEAM_KEY\"\ntimeout_s = 9\n",
        )
        .unwrap();
        let c = AgentConfig::load(&g).unwrap();
        assert_eq!(c.openai_base_url, "http://workspace:2/v1", "kopt.toml wins");
        assert_eq!(c.openai_key_env, "TEAM_KEY", "Cargo.toml over the defaults");
        assert_eq!(c.timeout_s, 9, "Cargo.toml over the user");
        assert_eq!(c.anthropic_key_env, "MY_ANTHROPIC");
        std::fs::write(ws.join("kopt.toml"), "[agent]\ntimeout_s = \"soon\"\n").unwrap();
        let e = AgentConfig::load(&g).unwrap_err().to_string();
        assert!(
            e.contains("kopt.toml, [agent]: ") && e.contains("timeout_s"),
            "{e}"
        );
        std::fs::write(ws.join("kopt.toml"), "").unwrap();
        std::fs::write(
            ws.join("Cargo.toml"),
            "[workspace.metadata.kopt.agent]\nopenai_base_ur = \"http://typo/v1\"\n",
        )
        .unwrap();
        let e = AgentConfig::load(&g).unwrap_err().to_string();
        assert!(
            e.contains("Cargo.toml, [workspace.metadata.kopt.agent]: ")
                && e.contains("unknown field `openai_base_ur`")
                && e.contains("openai_base_url"),
            "a typo is named with the keys kopt knows: {e}"
        );
        std::env::remove_var("XDG_CONFIG_HOME");
    }
}
