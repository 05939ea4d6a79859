//! The session of `cargo kopt mcp`: the verified loop as tools, so that a coding agent in
//! an editor or terminal can act as the optimiser while kopt profiles, verifies, measures
//! and records. (The Model Context Protocol's transport is the CLI's.) The agent only proposes: a candidate goes
//! through the engine exactly as the built-in loop's do ([`LoopEvaluator`], the same
//! judge against the session's current best), a verified winner becomes a *pending*
//! variant (never a committed file: accepting stays with `cargo kopt review`), and every
//! call, candidate and verdict is written to the run journal
//! (`<target>/kopt/runs/<run>/journal.jsonl`, keys redacted).
//!
//! The tools' input schemas are derived (schemars) from the types below and from
//! [`kopt_agent::proposal::Proposal`], the schema the built-in loop gives models. A bad
//! request (unknown kernel or candidate, a proposal that does not validate, a candidate
//! over the size limit, a spent budget) is a [`ToolError`] that says what was wrong and
//! how to fix it; the transport answers it as a JSON-RPC error.

use std::collections::BTreeMap;

use kopt_agent::context::{self, ContextInput, Feedback};
use kopt_agent::proposal::{self, Proposal, ProposalSet, Resolved};
use kopt_agent::run::{self, LoopState};
use kopt_engine::engine::Engine;
use kopt_engine::job::KernelVersion;
use kopt_engine::verdict::Verdict;
use kopt_profile::collect::NcuChoice;
use kopt_redact::Redactor;
use kopt_search::strategy::StrategyKind;
use kopt_store::journal::{Event, Journal};
use kopt_store::layout::KoptDir;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::eval::{self, Settings};
use crate::optimize::{self, geo_speedup, LoopEvaluator, Winner};
use crate::search;
use kopt_workspace::gather::{Gathered, Kernel};
use kopt_workspace::{commands, store};

/// A session's limits.
#[derive(Debug, Clone, Serialize)]
pub struct Limits {
    /// `propose_variant` calls that reach verification.
    pub max_proposals: u32,
    /// Points evaluated by `search`, over the whole session.
    pub max_search_evals: usize,
    /// Bytes of a candidate's source or diff.
    pub max_candidate_bytes: usize,
    /// A winner must beat the current best by this fraction on some shape...
    pub min_gain: f64,
    /// ... or by this fraction in geometric mean, slower on no shape (beyond its measured noise).
    pub min_uniform_gain: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_proposals: 24,
            max_search_evals: 200,
            max_candidate_bytes: 64 * 1024,
            min_gain: 0.03,
            min_uniform_gain: 0.01,
        }
    }
}

/// How the server was started.
#[derive(Debug, Clone)]
pub struct Config {
    /// The agent's name, as journals and rationales record it (`mcp:NAME`).
    pub agent: String,
    pub limits: Limits,
    pub settings: Settings,
    pub ncu: NcuChoice,
    pub step_timeout: u64,
    /// Start every kernel from the reference even where a variant is accepted for the
    /// GPU's architecture.
    pub from_reference: bool,
}

/// What the session learnt about one kernel.
#[derive(Default)]
struct KernelState {
    /// Whether the session's starting point was settled (see `Session::start`).
    started: bool,
    /// The accepted variant the session started from, with its times in this session.
    baseline: Option<optimize::BaselineTimes>,
    /// The starting version timed twice (see `cargo kopt optimize`): a win must clear it.
    noise: Option<optimize::TimingNoise>,
    /// The kernel's loop, stepped by `propose_variant` (created when the session's
    /// starting point is settled): the best so far, what the agent was told.
    steps: Option<LoopState<'static>>,
    /// The reference's bottleneck snapshot, once `profile` or `get_context` took it.
    snapshot: Option<kopt_profile::snapshot::Snapshot>,
}

/// A candidate of this session and its verdict, for `explain_verdict` and `search`.
struct Tried {
    kernel: String,
    resolved: Resolved,
    version: KernelVersion,
    verdict: Verdict,
}

pub struct Session {
    g: Gathered,
    cfg: Config,
    journal: Journal,
    engine: Option<Engine>,
    proposals: u32,
    search_evals: usize,
    kernels: BTreeMap<String, KernelState>,
    tried: BTreeMap<String, Tried>,
    /// Tool calls so far (the journal's round number of each exchange).
    calls: u32,
}

// ---------------------------------------------------------------------------------------
// Tool inputs: their schemas are what clients see.

/// One annotated kernel, by name.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KernelArgs {
    /// The kernel's name, as `list_kernels` gives it.
    pub kernel: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfileArgs {
    pub kernel: String,
    /// A declared shape's index or label (default: the first).
    #[serde(default)]
    pub shape: Option<String>,
    /// A committed variant of the kernel (default: the reference).
    #[serde(default)]
    pub variant: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProposeArgs {
    pub kernel: String,
    /// The candidate with its reasoning: the same schema the built-in loop's agents
    /// answer with. `candidate.diff` applies to the current best's source.
    pub proposal: Proposal,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchArgs {
    pub kernel: String,
    /// A candidate id of this session (`propose_variant`'s answer) to search around;
    /// default: the kernel's current best (or the reference).
    #[serde(default)]
    pub candidate: Option<String>,
    /// `hill` (default), `random`, `evolution` or `exhaustive`.
    #[serde(default)]
    pub strategy: Option<String>,
    /// Points to evaluate at most (default and cap: what is left of the session's budget).
    #[serde(default)]
    pub max_evals: Option<usize>,
    /// The strategy's random seed.
    #[serde(default)]
    pub seed: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExplainArgs {
    /// A candidate id of this session.
    pub candidate: String,
}

/// Why a tool call was refused or failed, as the transport answers it.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The arguments name something that is not there or do not validate.
    #[error("{0}")]
    InvalidParams(String),
    /// The session cannot take the request (a spent budget).
    #[error("{0}")]
    InvalidRequest(String),
    /// kopt failed to do what was asked.
    #[error("{0}")]
    Internal(String),
}

fn invalid(msg: impl Into<String>) -> ToolError {
    ToolError::InvalidParams(msg.into())
}

fn internal(msg: impl Into<String>) -> ToolError {
    ToolError::Internal(msg.into())
}

/// The per-shape figures of a verdict, as the answers show them.
fn shape_figures(v: &Verdict) -> Vec<Value> {
    v.shapes
        .iter()
        .map(|s| {
            json!({
                "shape": s.shape,
                "held_out": s.held_out,
                "candidate_us": s.candidate_us,
                "reference_us": s.reference_us,
                "speedup": s.speedup,
                "copy_bandwidth_pct": s.copy_bandwidth_pct,
                "registers": s.registers,
                "occupancy_pct": s.occupancy_pct,
            })
        })
        .collect()
}

/// The layered verdict: numerics and anti-cheat fences, per-shape figures, deltas against
/// the current best, the compile log.
fn layered(id: &str, v: &Verdict, fb: &Feedback) -> Value {
    json!({
        "candidate": id,
        "accepted": v.accepted,
        "summary": v.summary(),
        "failures": v.failures.iter().map(|f| json!({
            "fence": f.fence.name(),
            "shape": f.shape,
            "message": f.message,
        })).collect::<Vec<_>>(),
        "shapes": shape_figures(v),
        "against_best": v.comparisons.iter().map(|c| json!({
            "shape": c.shape,
            "candidate_us": c.candidate_us,
            "best_us": c.best_us,
            "speedup": c.speedup,
        })).collect::<Vec<_>>(),
        "feedback": fb.details,
        "notes": v.notes,
        "compile_log": v.compile_log,
    })
}

impl Session {
    fn kernel(&self, name: &str) -> Result<&Kernel, ToolError> {
        commands::find(&self.g, name).map_err(|e| {
            invalid(format!(
                "{e}; the kernels here are: {}",
                self.g
                    .kernels
                    .iter()
                    .map(|k| k.spec.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
    }

    fn engine(&mut self) -> Result<&mut Engine, ToolError> {
        if self.engine.is_none() {
            let mut e =
                eval::engine(&self.g, &self.cfg.settings).map_err(|e| internal(e.to_string()))?;
            e.worker.step_timeout = std::time::Duration::from_secs(self.cfg.step_timeout);
            self.engine = Some(e);
        }
        Ok(self.engine.as_mut().expect("just set"))
    }

    /// Records a call and its answer (or the transport's error line) in the journal.
    pub fn record(&mut self, tool: &str, kernel: &str, args: &Value, reply: &str) {
        self.calls += 1;
        let round = self.calls;
        let role = format!("mcp:{tool}");
        let _ = self.journal.append(Event::Prompt {
            kernel: kernel.to_string(),
            round,
            role: role.clone(),
            text: args.to_string(),
        });
        let _ = self.journal.append(Event::Reply {
            kernel: kernel.to_string(),
            round,
            role,
            text: reply.to_string(),
            tokens: None,
        });
    }

    /// Settles where a kernel's session starts, once, as `cargo kopt optimize` does: from
    /// the variant accepted for the GPU's architecture (verified again) unless
    /// `--from-reference`, and with the starting version timed twice for the noise.
    fn start(&mut self, name: &str) -> Result<(), ToolError> {
        if self.kernels.get(name).is_some_and(|s| s.started) {
            return Ok(());
        }
        self.kernels.entry(name.to_string()).or_default().started = true;
        let from_reference = self.cfg.from_reference;
        let settings = self.cfg.settings.clone();
        self.engine()?;
        let Session {
            g, engine, journal, ..
        } = &mut *self;
        let k = commands::find(g, name).map_err(|e| invalid(e.to_string()))?;
        let engine = engine.as_mut().expect("started above");
        let device = engine.device().map_err(|e| internal(e.to_string()))?;
        let mut evaluator = LoopEvaluator::new(g, k, engine, settings);
        let optimize::Starting {
            start,
            baseline,
            noise,
        } = optimize::settle_start(
            k,
            &device.arch,
            from_reference,
            &mut evaluator,
            &mut |e| {
                let _ = journal.append(e);
            },
            &mut |_| {},
        );
        self.kernels.entry(name.to_string()).or_default().noise = noise;
        let steps = self.steps(name)?;
        if let (Some(s), Some(b)) = (&start, &baseline) {
            steps.set_best(&b.0.variant, &s.version, &s.verdict);
        }
        self.kernels.entry(name.to_string()).or_default().baseline = baseline;
        Ok(())
    }

    /// The kernel's loop, from the reference with this session's rules if its start did
    /// not settle one.
    fn steps(&mut self, name: &str) -> Result<&mut LoopState<'static>, ToolError> {
        if self.kernels.get(name).is_some_and(|s| s.steps.is_some()) {
            let steps = self.kernels.get_mut(name).and_then(|s| s.steps.as_mut());
            return Ok(steps.expect("just checked"));
        }
        let rules = self.rules(name);
        let (spec, reference) = {
            let k = self.kernel(name)?;
            (
                k.spec.clone(),
                KernelVersion::reference(&k.spec, &k.reference.text),
            )
        };
        Ok(self
            .kernels
            .entry(name.to_string())
            .or_default()
            .steps
            .get_or_insert_with(|| {
                LoopState::new(
                    &spec,
                    &reference,
                    None,
                    rules,
                    run::Budget::unlimited(),
                    None,
                )
            }))
    }

    /// The best verified version of the kernel in this session, with its name and
    /// verdict (`None`: the reference).
    fn best(&self, name: &str) -> Option<(&str, &KernelVersion, &Verdict)> {
        let steps = self.kernels.get(name)?.steps.as_ref()?;
        Some((
            steps.best_label(),
            steps.best_version(),
            steps.best_verdict()?,
        ))
    }

    /// The rule for a new best of this kernel: the session's minimum gain, raised above
    /// the noise measured at its start.
    fn rules(&self, name: &str) -> run::Rules {
        let rules =
            run::Rules::judge_only(self.cfg.limits.min_gain, self.cfg.limits.min_uniform_gain);
        match self.kernels.get(name).and_then(|s| s.noise.as_ref()) {
            Some(n) => rules.above_noise(&n.deviations),
            None => rules,
        }
    }

    fn best_version(&self, k: &Kernel) -> (String, KernelVersion) {
        match self.best(&k.spec.name) {
            Some((label, version, _)) => (label.to_string(), version.clone()),
            None => (
                "reference".into(),
                KernelVersion::reference(&k.spec, &k.reference.text),
            ),
        }
    }

    fn device_line(&mut self) -> Result<(String, String), ToolError> {
        let engine = self.engine()?;
        let d = engine.device().map_err(|e| internal(e.to_string()))?;
        let ceilings = engine
            .ceilings(false)
            .ok()
            .map(|c| format!("copy {:.0} GB/s", c.copy_gbs))
            .unwrap_or_else(|| "not measured".into());
        Ok((
            format!(
                "{} ({}, {} SMs, {} MiB L2)",
                d.name,
                d.arch,
                d.multiprocessors,
                d.l2_bytes >> 20
            ),
            ceilings,
        ))
    }

    fn profile_reference(&mut self, name: &str) -> Result<(), ToolError> {
        if self.kernels.get(name).is_some_and(|s| s.snapshot.is_some()) {
            return Ok(());
        }
        let dir = self.journal.dir().join("profile").join(name);
        let (settings, ncu) = (self.cfg.settings.clone(), self.cfg.ncu.clone());
        self.engine()?;
        let Session { g, engine, .. } = self;
        let k = commands::find(g, name).map_err(|e| invalid(e.to_string()))?;
        let engine = engine.as_mut().expect("started above");
        let snap = optimize::profile_reference(
            g,
            k,
            engine,
            (&settings, &ncu),
            optimize::existing_case_library().as_ref(),
            &dir,
            &mut |_| {},
        );
        if let Some(s) = &snap {
            let _ = self.journal.append(Event::Profile {
                kernel: name.to_string(),
                candidate: None,
                summary: s.render(3),
                artefacts: vec![format!("profile/{name}/snapshot.json")],
            });
        }
        self.kernels.entry(name.to_string()).or_default().snapshot = snap;
        Ok(())
    }

    pub fn list_kernels(&self) -> Value {
        let pending = store::pending_report(&self.g);
        let kernels: Vec<Value> = commands::list(&self.g)
            .into_iter()
            .map(|l| {
                let k = self.g.kernels.iter().find(|k| k.spec.name == l.kernel);
                json!({
                    "package": l.package,
                    "kernel": l.kernel,
                    "entry": l.entry,
                    "reference": l.reference,
                    "annotation": l.source,
                    "shapes": l.shapes,
                    "tunables": l.tunables,
                    "params": k.map(|k| k.spec.kernel_args().iter().map(|a| a.name().to_string()).collect::<Vec<_>>()),
                    "launch_only": k.map(|k| k.spec.launch_only().map(|s| s.name.clone()).collect::<Vec<_>>()),
                    "variants": l.variants,
                    "pending": pending.pending.iter().filter(|p| p.kernel == l.kernel).map(|p| &p.variant).collect::<Vec<_>>(),
                    "session_best": self.best(&l.kernel).map(|(label, _, verdict)| json!({"candidate": label, "speedup": geo_speedup(verdict)})),
                })
            })
            .collect();
        json!({ "kernels": kernels, "limits": self.cfg.limits, "budget_left": self.budget_left() })
    }

    fn budget_left(&self) -> Value {
        json!({
            "proposals": self.cfg.limits.max_proposals.saturating_sub(self.proposals),
            "search_evals": self.cfg.limits.max_search_evals.saturating_sub(self.search_evals),
        })
    }

    pub fn get_context(&mut self, name: &str) -> Result<Value, ToolError> {
        self.kernel(name)?;
        self.profile_reference(name)?;
        self.start(name)?;
        let (device, ceilings) = self.device_line()?;
        let rules = self.steps(name)?.rules().clone();
        let device = match self.kernels.get(name).and_then(|s| s.noise.as_ref()) {
            Some(n) => format!("{device}; {}", n.describe(&rules)),
            None => device,
        };
        let k = self.kernel(name)?;
        let (best_label, best) = self.best_version(k);
        let state = self.kernels.get(name);
        let launch = context::launch_text(&best.launch);
        let figures = self
            .best(name)
            .map(|(_, _, verdict)| {
                verdict
                    .shapes
                    .iter()
                    .filter(|s| !s.held_out)
                    .filter_map(|s| {
                        Some(format!(
                            "{}: {:.2} µs ({:.2}x the reference)",
                            s.shape,
                            s.candidate_us?,
                            s.speedup.unwrap_or(1.0)
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let library = optimize::existing_case_library();
        let snapshot = state.and_then(|s| s.snapshot.as_ref());
        let cases = optimize::similar_cases(
            library.as_ref(),
            name,
            &k.reference.text,
            &snapshot.map(|s| s.metrics.clone()).unwrap_or_default(),
        );
        let snapshot = snapshot.map(|s| s.render(8));
        let structure = kopt_store::features::structural_summary(&k.reference.text);
        let input = ContextInput {
            spec: &k.spec,
            round: self.proposals + 1,
            best_label: best_label.clone(),
            best_source: &best.source,
            best_launch: launch,
            device: device.clone(),
            ceilings: ceilings.clone(),
            figures,
            regions: state
                .and_then(|s| s.steps.as_ref())
                .map(|s| s.regional_lines())
                .unwrap_or_default(),
            snapshot: snapshot.clone(),
            structure: structure.clone(),
            cases: cases.clone(),
            history: state
                .and_then(|s| s.steps.as_ref())
                .map(|s| s.history().to_vec())
                .unwrap_or_default(),
            hint: None,
            budget_tokens: 60_000,
        };
        let schema = serde_json::to_string_pretty(&proposal::schema()).expect("serialises");
        let req = context::propose(&input, &schema).map_err(internal)?;
        Ok(json!({
            "kernel": name,
            "current_best": best_label,
            "device": device,
            "ceilings": ceilings,
            "snapshot": snapshot,
            "structure": structure,
            "similar_cases": cases.iter().map(|c| json!({"case": c.title, "outcome": c.outcome, "diagnosis": c.diagnosis, "change": c.change, "similarity": c.similarity, "metric_similarity": c.metric_similarity, "text_similarity": c.text_similarity})).collect::<Vec<_>>(),
            "source": best.source,
            "system": req.system,
            "prompt": req.messages.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n\n"),
        }))
    }

    pub fn profile(&mut self, a: &ProfileArgs) -> Result<Value, ToolError> {
        self.kernel(&a.kernel)?;
        let o = crate::profile::Options {
            kernel: a.kernel.clone(),
            shape: a.shape.clone(),
            variant: a.variant.clone(),
            device: self.cfg.settings.device,
            ncu: self.cfg.ncu.clone(),
            ..Default::default()
        };
        let out = crate::profile::profile(&self.g, &o, &mut |_| {})
            .map_err(|e| invalid(e.to_string()))?;
        let _ = self.journal.append(Event::Profile {
            kernel: a.kernel.clone(),
            candidate: a.variant.clone(),
            summary: out.snapshot.render(3),
            artefacts: vec![format!("{}", out.dir.display())],
        });
        let text = out.snapshot.render(usize::MAX);
        let v = json!({
            "run_id": out.run_id,
            "dir": out.dir,
            "summary": text,
            "snapshot": out.snapshot,
        });
        if a.variant.is_none() && a.shape.is_none() {
            self.kernels.entry(a.kernel.clone()).or_default().snapshot = Some(out.snapshot);
        }
        Ok(v)
    }

    pub fn propose(&mut self, a: ProposeArgs) -> Result<Value, ToolError> {
        let limits = self.cfg.limits.clone();
        let size = a
            .proposal
            .candidate
            .source
            .as_ref()
            .map(String::len)
            .unwrap_or(0)
            + a.proposal
                .candidate
                .diff
                .as_ref()
                .map(String::len)
                .unwrap_or(0);
        if size > limits.max_candidate_bytes {
            return Err(invalid(format!(
                "the candidate is {size} bytes; this session takes at most {} (`--max-candidate-bytes`): send a diff against the current best, or only the kernel's own code",
                limits.max_candidate_bytes
            )));
        }
        if self.proposals >= limits.max_proposals {
            return Err(ToolError::InvalidRequest(
                format!(
                    "the session's budget of {} proposals is spent; restart `cargo kopt mcp` with a larger --max-proposals",
                    limits.max_proposals
                ),
            ));
        }
        self.kernel(&a.kernel)?;
        self.start(&a.kernel)?;
        let k = self.kernel(&a.kernel)?;
        let (best_label, best) = self.best_version(k);
        let text = serde_json::to_string(&ProposalSet {
            proposals: vec![a.proposal],
        })
        .expect("serialises");
        let resolved = proposal::parse(&text, &k.spec, &best.source)
            .map_err(|errors| {
                invalid(format!(
                    "the proposal does not validate against `{}`: {}",
                    a.kernel,
                    errors.join("; ")
                ))
            })?
            .remove(0);
        self.proposals += 1;
        let id = format!("m{}", self.proposals);
        let artefact = self
            .journal
            .save_artefact(&format!("{}-{id}.cu", a.kernel), &resolved.source)
            .ok();
        let _ = self.journal.append(Event::Candidate {
            kernel: a.kernel.clone(),
            round: self.proposals,
            candidate: id.clone(),
            summary: resolved.proposal.diagnosis.summary.clone(),
            artefacts: artefact.into_iter().collect(),
        });
        let settings = self.cfg.settings.clone();
        self.engine()?;
        self.steps(&a.kernel)?;
        let Session {
            g,
            engine,
            kernels,
            proposals,
            ..
        } = &mut *self;
        let k = commands::find(g, &a.kernel).map_err(|e| invalid(e.to_string()))?;
        let engine = engine.as_mut().expect("started above");
        let ceilings = engine.ceilings(false).ok();
        let device = engine.device().map_err(|e| internal(e.to_string()))?;
        let mut evaluator = LoopEvaluator::new(g, k, engine, settings);
        let steps = kernels
            .get_mut(&a.kernel)
            .and_then(|s| s.steps.as_mut())
            .expect("made above");
        // The loop's round, judged by the loop's rule for a new best with this session's
        // minimum gain, raised above the noise measured when the kernel's session started.
        let round = steps.round(
            *proposals,
            vec![(id.clone(), resolved.clone())],
            &mut run::Unreviewed,
            &mut evaluator,
            &mut |_| {},
        );
        let job = evaluator.last_job.take();
        // The rules the round judged by, which the rationale states.
        let rules = steps.rules().clone();
        // A region's winner is its pending variant for that region (the job just
        // evaluated is its verification there).
        let regional = steps.regional_of(&id).cloned();
        let run::Checked {
            version,
            verdict,
            feedback: fb,
            improved,
            ..
        } = round
            .checked
            .into_iter()
            .next()
            .ok_or_else(|| internal("the round verified no candidate"))?;
        let _ = self.journal.append(Event::Verdict {
            kernel: a.kernel.clone(),
            candidate: id.clone(),
            passed: verdict.accepted,
            failure_class: verdict.failures.first().map(|f| f.fence.name().to_string()),
            detail: verdict.summary(),
            times_us: verdict.candidate_times(),
            artefacts: vec![],
        });
        let mut pending = None;
        let (version, verdict) = match &regional {
            Some(w) => (w.version.clone(), w.verdict.clone()),
            None => (version, verdict),
        };
        if improved {
            let k = self.kernel(&a.kernel)?;
            let job = job.ok_or_else(|| internal("the evaluator kept no job"))?;
            let snapshot = self
                .kernels
                .get(&a.kernel)
                .and_then(|s| s.snapshot.as_ref())
                .map(|s| s.for_rationale());
            let agent = format!("mcp:{}", self.cfg.agent);
            let session = self.journal.dir().join("journal.jsonl");
            let p = optimize::pending_variant(&Winner {
                k,
                arch: &device.arch,
                device_name: &device.name,
                driver_api: device.driver_api,
                copy_gbs: ceilings.as_ref().map(|c| c.copy_gbs),
                snapshot_before: snapshot,
                version: &version,
                proposal: &resolved.proposal,
                verdict: &verdict,
                job: &job,
                agent: &agent,
                run_id: self.journal.run_id(),
                session: &session,
                root: &self.g.workspace_root,
                budget: kopt_spec::files::BudgetUsed {
                    rounds: None,
                    candidates: Some(self.proposals),
                    wall_time_s: None,
                    tokens: None,
                    cost_usd: None,
                },
                sweep: None,
                baseline: self.kernels.get(&a.kernel).and_then(|s| s.baseline.clone()),
                retires: None,
                rules: Some(&rules),
                region: regional
                    .as_ref()
                    .map(|w| (w.region.as_str(), w.found.as_ref())),
            })
            .map_err(|e| internal(e.to_string()))?;
            let kopt = KoptDir::new(&self.g.target_dir);
            self.journal
                .save_pending(&kopt, &p)
                .map_err(|e| internal(e.to_string()))?;
            pending = Some(p.label());
        }
        let mut v = layered(&id, &verdict, &fb);
        v["against"] = json!(best_label);
        v["improved"] = json!(improved);
        v["a_win_needs"] =
            json!({ "on_some_shape": rules.min_gain, "over_all_shapes": rules.min_uniform_gain });
        v["speedup_over_reference"] = json!(geo_speedup(&verdict));
        v["pending"] = json!(pending);
        v["budget_left"] = self.budget_left();
        self.tried.insert(
            id,
            Tried {
                kernel: a.kernel,
                resolved,
                version,
                verdict,
            },
        );
        Ok(v)
    }

    pub fn search(&mut self, a: &SearchArgs) -> Result<Value, ToolError> {
        self.kernel(&a.kernel)?;
        self.start(&a.kernel)?;
        let strategy = match a.strategy.as_deref().unwrap_or("hill") {
            "hill" => StrategyKind::Hill,
            "random" => StrategyKind::Random,
            "evolution" => StrategyKind::Evolution,
            "exhaustive" => StrategyKind::Exhaustive,
            other => {
                return Err(invalid(format!(
                    "`{other}` is not a strategy: write hill, random, evolution or exhaustive"
                )))
            }
        };
        let left = self
            .cfg
            .limits
            .max_search_evals
            .saturating_sub(self.search_evals);
        if left == 0 {
            return Err(ToolError::InvalidRequest(
                format!(
                    "the session's budget of {} search evaluations is spent; restart `cargo kopt mcp` with a larger --max-search-evals",
                    self.cfg.limits.max_search_evals
                ),
            ));
        }
        let evals = a.max_evals.unwrap_or(left).min(left).max(1);
        let base = match &a.candidate {
            Some(id) => {
                let t = self.tried.get(id).ok_or_else(|| {
                    invalid(format!(
                        "no candidate `{id}` in this session (its ids: {})",
                        self.tried.keys().cloned().collect::<Vec<_>>().join(", ")
                    ))
                })?;
                if t.kernel != a.kernel {
                    return Err(invalid(format!(
                        "candidate `{id}` is a candidate of `{}`, not of `{}`",
                        t.kernel, a.kernel
                    )));
                }
                if !t.verdict.accepted {
                    return Err(invalid(format!(
                        "candidate `{id}` failed verification ({}); search around a verified one",
                        t.verdict.summary().lines().next().unwrap_or("")
                    )));
                }
                Some(search::SearchBase {
                    version: t.version.clone(),
                    proposal: Some(t.resolved.proposal.clone()),
                    gain_over_reference: geo_speedup(&t.verdict).unwrap_or(1.0),
                })
            }
            None => self
                .best(&a.kernel)
                .map(|(label, version, verdict)| search::SearchBase {
                    version: version.clone(),
                    proposal: self.tried.get(label).map(|t| t.resolved.proposal.clone()),
                    gain_over_reference: geo_speedup(verdict).unwrap_or(1.0),
                }),
        };
        let o = search::SearchOptions {
            strategy,
            seeded: false,
            matrix: None,
            hints: None,
            budget_evals: Some(evals),
            budget_seconds: None,
            seed: a.seed.unwrap_or(0),
            options: kopt_search::space::OptionAxes::standard(),
            resume: None,
            keep_rounds: 8,
            threads: None,
            eval: self.cfg.settings.clone(),
            step_timeout: self.cfg.step_timeout,
            no_verify: false,
            base,
            save: Some(search::SaveWinner {
                agent: format!("mcp:{}", self.cfg.agent),
                min_gain: self.cfg.limits.min_gain,
            }),
        };
        // The search runs its own worker: hand the session's back first (one GPU).
        if let Some(mut e) = self.engine.take() {
            e.worker.shutdown();
        }
        let k = self.kernel(&a.kernel)?;
        let r = search::search(&self.g, k, &o, &mut search::Unobserved)
            .map_err(|e| internal(e.to_string()))?;
        self.search_evals += r.evaluations;
        let mut became = None;
        if let (Some(saved), Some(verdict)) = (&r.saved, &r.best_verified) {
            let (package, rest) = saved.label.split_once('/').unwrap_or(("", &saved.label));
            let arch = rest.rsplit('/').next().unwrap_or("").to_string();
            let _ = self.journal.append(Event::PendingSaved {
                package: package.to_string(),
                kernel: a.kernel.clone(),
                arch,
                variant: format!("{} (search run {})", saved.version.id, r.run_id),
                replaced: None,
            });
            // The winner becomes the session's current best, a candidate like the others.
            let id = format!("m{}s", self.proposals);
            let id = if self.tried.contains_key(&id) {
                format!("{id}{}", self.tried.len())
            } else {
                id
            };
            let version = KernelVersion {
                id: id.clone(),
                ..saved.version.clone()
            };
            self.tried.insert(
                id.clone(),
                Tried {
                    kernel: a.kernel.clone(),
                    resolved: Resolved {
                        proposal: saved.proposal.clone(),
                        source: version.source.clone(),
                    },
                    version: version.clone(),
                    verdict: verdict.clone(),
                },
            );
            self.steps(&a.kernel)?.set_best(&id, &version, verdict);
            became = Some(id);
        }
        Ok(json!({
            "run_id": r.run_id,
            "around": a.candidate.clone().unwrap_or_else(|| "the current best".into()),
            "stop": r.stop,
            "evaluations": r.evaluations,
            "failures": r.failures,
            "best": r.best,
            "best_verified": r.best_verified.as_ref().map(|v| json!({"accepted": v.accepted, "summary": v.summary(), "shapes": shape_figures(v)})),
            "leaderboard": r.leaderboard,
            "pending": r.pending,
            "candidate": became,
            "budget_left": self.budget_left(),
        }))
    }

    pub fn explain(&self, id: &str) -> Result<Value, ToolError> {
        let t = self.tried.get(id).ok_or_else(|| {
            invalid(format!(
                "no candidate `{id}` in this session (its ids: {})",
                self.tried.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?;
        let fb = run::feedback(0, id, &t.verdict);
        let mut v = layered(id, &t.verdict, &fb);
        v["kernel"] = json!(t.kernel);
        v["proposal"] = serde_json::to_value(&t.resolved.proposal).expect("serialises");
        v["verdict"] = serde_json::to_value(&t.verdict).expect("serialises");
        Ok(v)
    }

    /// Starts a session: opens the run journal and records the configuration. The engine
    /// (and with it the GPU) starts at the first tool that needs it.
    pub fn new(g: Gathered, cfg: Config) -> Result<Self, kopt_store::Error> {
        let kopt = KoptDir::new(&g.target_dir);
        let run_id = kopt_store::layout::new_run_id();
        let (journal, _) = Journal::open_or_resume(&kopt, &run_id)?;
        let mut journal = journal.with_redactor(Redactor::from_env());
        journal
            .append(Event::RunStarted {
                config: json!({ "command": "mcp", "agent": format!("mcp:{}", cfg.agent), "kernels": g.kernels.iter().map(|k| &k.spec.name).collect::<Vec<_>>() }),
                budget: serde_json::to_value(&cfg.limits).expect("serialises"),
            })?;
        Ok(Session {
            g,
            cfg,
            journal,
            engine: None,
            proposals: 0,
            search_evals: 0,
            kernels: BTreeMap::new(),
            tried: BTreeMap::new(),
            calls: 0,
        })
    }

    /// The run's id (its journal is `<target>/kopt/runs/<id>/journal.jsonl`).
    pub fn run_id(&self) -> String {
        self.journal.run_id().to_string()
    }

    /// The session's run folder: its journal and artefacts.
    pub fn run_dir(&self) -> std::path::PathBuf {
        self.journal.dir().to_path_buf()
    }

    /// Ends the session: the journal's last line, the worker shut down.
    pub fn finish(&mut self) {
        let summary = format!(
            "{} call(s), {} proposal(s), {} search evaluation(s)",
            self.calls, self.proposals, self.search_evals
        );
        let _ = self.journal.append(Event::RunFinished { summary });
        if let Some(mut e) = self.engine.take() {
            e.worker.shutdown();
        }
    }

    /// `list_pending`: the pending variants waiting for review.
    pub fn pending(&self) -> Value {
        serde_json::to_value(store::pending_report(&self.g)).expect("serialises")
    }
}

/// The arguments of a tool that takes none.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}
