//! The loop for one kernel: propose, review, verify, feed back, until an improvement
//! stalls, a rule escalates to a person, or a budget runs out.
//!
//! Rules (DESIGN.md §5):
//! - after 3 compile failures in the task, the next request is a reflection turn (the agent
//!   re-reads its last candidate against the reference) instead of a plain proposal;
//! - escalate when 3 rounds bring no improvement, when the same error (the same fence with
//!   the same first message line) comes back twice after its first occurrence, or when 3
//!   compiled candidates in a row fail verification;
//! - budgets cap rounds, candidates, wall time, tokens and dollars, per kernel ([`Budget`])
//!   and, shared by every kernel of a run, candidates, wall time, tokens and dollars
//!   ([`RunBudget`]): a loop charges the run what it spent before each round and each
//!   candidate, and stops when a run limit is reached.
//!
//! A proposal's `matrix` is searched by the loop itself, exhaustively (at most
//! [`proposal::MAX_MATRIX_POINTS`] points): once the candidate's own defines passed every
//! fence but perhaps the watchdog, each other combination of the matrix's values is built
//! from the same source and verified in full through the same [`Evaluate`], with an id
//! `<candidate>-m<k>`, and judged by the same rule as any candidate ([`improvement`]).
//! Each point counts against the candidate budget; a budget that runs out mid-matrix
//! stops the sweep and the loop, the best so far kept. A failing point is recorded in
//! `tried` with its verdict but never counts towards an escalation.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kopt_engine::job::KernelVersion;
use kopt_engine::verdict::{Fence, Verdict};
use kopt_spec::KernelSpec;
use serde::{Deserialize, Serialize};

use crate::backend::{BackendError, Client, Spend};
use crate::chat::{ChatRequest, Message};
use crate::context::{self, CaseLine, ContextInput, Feedback};
use crate::proposal::{self, Resolved};

/// Verifies a candidate against the reference, its watchdog comparing with `best_us`
/// (the current best's time per shape; `None`: the reference measured in the same job).
pub trait Evaluate {
    fn evaluate(
        &mut self,
        candidate: &KernelVersion,
        best_us: Option<&BTreeMap<String, f64>>,
    ) -> Verdict;

    /// Whether the last verdict was answered from this run's own record (a resumed run)
    /// rather than measured now: [`Event::Verdict`] says so, and the record is not
    /// written twice.
    fn last_from_record(&self) -> bool {
        false
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Budget {
    pub rounds: u32,
    pub candidates: u32,
    pub wall: Duration,
    pub tokens: u64,
    pub dollars: f64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            rounds: 8,
            candidates: 24,
            wall: Duration::from_secs(3600),
            tokens: 2_000_000,
            dollars: 20.0,
        }
    }
}

/// Limits on a whole run, over all its kernels; `None`: no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunLimits {
    pub candidates: Option<u32>,
    pub wall: Option<Duration>,
    pub tokens: Option<u64>,
    pub dollars: Option<f64>,
}

impl RunLimits {
    pub fn is_unlimited(&self) -> bool {
        *self == RunLimits::default()
    }
}

/// What the kernels of a run spent together so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RunSpent {
    pub candidates: u32,
    pub tokens: u64,
    pub dollars: f64,
}

/// A run's budget, shared by its kernels' loops (several at once on several GPUs): each
/// charges what it spends, and every loop stops at its next check once a limit is reached.
/// A candidate being verified when another loop reaches the limit finishes.
#[derive(Debug)]
pub struct RunBudget {
    pub limits: RunLimits,
    start: Instant,
    spent: Mutex<RunSpent>,
}

impl RunBudget {
    /// Starts the run's clock.
    pub fn new(limits: RunLimits) -> Self {
        RunBudget {
            limits,
            start: Instant::now(),
            spent: Mutex::new(RunSpent::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RunSpent> {
        self.spent.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn charge(&self, candidates: u32, tokens: u64, dollars: f64) {
        let mut s = self.lock();
        s.candidates += candidates;
        s.tokens += tokens;
        s.dollars += dollars;
    }

    pub fn spent(&self) -> RunSpent {
        self.lock().clone()
    }

    /// The limit the run has reached, as a stop names it (`run's dollars`).
    pub fn exhausted(&self) -> Option<&'static str> {
        let s = self.lock();
        let l = &self.limits;
        if l.wall.is_some_and(|w| self.start.elapsed() > w) {
            Some("run's wall time")
        } else if l.tokens.is_some_and(|t| s.tokens >= t) {
            Some("run's tokens")
        } else if l.dollars.is_some_and(|d| s.dollars >= d) {
            Some("run's dollars")
        } else if l.candidates.is_some_and(|c| s.candidates >= c) {
            Some("run's candidates")
        } else {
            None
        }
    }
}

/// What one loop has charged its run so far: each check charges the difference.
struct RunCharge<'a> {
    budget: Option<&'a RunBudget>,
    candidates: u32,
    tokens: u64,
    dollars: f64,
}

impl RunCharge<'_> {
    /// Charges the loop's totals so far and answers the run limit reached, if any.
    fn check(&mut self, candidates: u32, tokens: u64, dollars: f64) -> Option<&'static str> {
        let b = self.budget?;
        b.charge(
            candidates.saturating_sub(self.candidates),
            tokens.saturating_sub(self.tokens),
            (dollars - self.dollars).max(0.0),
        );
        (self.candidates, self.tokens, self.dollars) = (candidates, tokens, dollars);
        b.exhausted()
    }
}

#[derive(Debug, Clone)]
pub struct Rules {
    pub compile_failures_before_reflection: u32,
    pub rounds_without_improvement: u32,
    pub repeats_of_an_error: u32,
    pub failed_verifications_in_a_row: u32,
    /// A win must be faster than the best by this fraction on some shape...
    pub min_gain: f64,
    /// ... or faster on every shape, by this fraction in geometric mean: a candidate
    /// 2.4-2.9% faster on each of three shapes is better, though no shape clears
    /// `min_gain` (a transpose block order on the H200, docs/runs/2026-11-29-h200-dsmem-merge).
    pub min_uniform_gain: f64,
    /// Per shape, how far the same version's time moved between two jobs (the measured
    /// noise; empty when it was not measured). "Slower on none" tolerates a shape this much
    /// slower: a shape whose code path a candidate leaves unchanged measures a little slower
    /// half the time, and failing it then would decide a win by a coin toss.
    pub noise: BTreeMap<String, f64>,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            compile_failures_before_reflection: 3,
            rounds_without_improvement: 3,
            repeats_of_an_error: 2,
            failed_verifications_in_a_row: 3,
            min_gain: 0.03,
            min_uniform_gain: 0.01,
            noise: BTreeMap::new(),
        }
    }
}

/// The version a loop starts from when it is not the reference: an accepted variant,
/// verified in this run (its verdict's times are what a candidate must beat).
#[derive(Debug, Clone)]
pub struct Start {
    pub version: KernelVersion,
    pub verdict: Verdict,
}

/// What the loop knows about the kernel before it starts.
#[derive(Debug, Clone)]
pub struct Task<'a> {
    pub spec: &'a KernelSpec,
    pub reference: KernelVersion,
    /// The best before the first round (`None`: the reference). Candidates are built from
    /// its source, launch rule and defines, and must beat its times.
    pub start: Option<Start>,
    /// The run's budget, shared with the run's other kernels.
    pub run_budget: Option<&'a RunBudget>,
    pub device: String,
    pub ceilings: String,
    pub snapshot: Option<String>,
    pub structure: String,
    pub cases: Vec<CaseLine>,
    pub hint: Option<String>,
    pub context_tokens: usize,
}

/// Why the loop stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Stop {
    /// The round budget was used up (the normal end).
    Rounds,
    Budget {
        which: String,
    },
    /// A person should look: the reason, what kopt suspects, and how to resume.
    Escalated {
        reason: String,
        suspicion: String,
    },
    /// The backend failed for good (bad key, unreachable endpoint after retries...).
    Backend {
        error: String,
    },
    /// The agent had nothing more to propose.
    AgentDone {
        reason: String,
    },
}

/// One candidate and what became of it.
#[derive(Debug, Clone)]
pub struct Tried {
    pub round: u32,
    pub id: String,
    pub resolved: Option<Resolved>,
    pub verdict: Option<Verdict>,
    /// Why it never reached verification (a malformed reply after its repair).
    pub error: Option<String>,
    /// Set for a point of a candidate's matrix that the loop searched (not a proposal of
    /// the agent's own): which candidate, and the values the point gives the matrix keys.
    pub point: Option<MatrixPoint>,
}

impl Tried {
    /// A proposal of the agent's that was verified.
    fn of(round: u32, id: &str, resolved: Resolved, verdict: Verdict) -> Self {
        Tried {
            round,
            id: id.to_string(),
            resolved: Some(resolved),
            verdict: Some(verdict),
            error: None,
            point: None,
        }
    }
}

/// A point of a candidate's matrix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MatrixPoint {
    /// The candidate whose matrix it belongs to (`r1c2`).
    pub base: String,
    /// The matrix keys' values at this point; the candidate's other defines are kept.
    pub values: BTreeMap<String, i64>,
}

impl MatrixPoint {
    /// `BLOCK=256 VEC=4`.
    pub fn describe(&self) -> String {
        describe_defines(&self.values)
    }
}

/// `NAME=value` pairs in name order, space-separated.
pub fn describe_defines(d: &BTreeMap<String, i64>) -> String {
    d.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The loop's exhaustive sweep of one candidate's matrix: every point verified in full
/// through [`Evaluate`], the candidate itself (its own defines) first.
#[derive(Debug, Clone)]
pub struct MatrixSweep {
    /// The candidate (`r1c2`).
    pub base: String,
    /// The matrix as the agent gave it.
    pub matrix: BTreeMap<String, Vec<i64>>,
    /// The points in the order they were verified, the candidate's own first; each
    /// point's `defines` are its full defines.
    pub points: Vec<SweptPoint>,
    /// How many points the matrix asked for beyond the candidate's own defines.
    pub planned: usize,
    /// The point that is the loop's best after the sweep, when one of this sweep's is.
    pub chosen: Option<String>,
    /// Why the sweep ended before its last point (the budget that ran out).
    pub stopped: Option<String>,
}

/// One verified point of a sweep.
#[derive(Debug, Clone)]
pub struct SweptPoint {
    pub id: String,
    pub defines: BTreeMap<String, i64>,
    pub verdict: Verdict,
}

/// The end of a task.
#[derive(Debug, Clone)]
pub struct LoopOutcome {
    pub stop: Stop,
    pub rounds: u32,
    pub tried: Vec<Tried>,
    /// The best verified candidate, if it beats the reference.
    pub best: Option<(KernelVersion, Resolved, Verdict)>,
    /// The matrix sweep the best came out of, when its candidate had a matrix (the best
    /// is then the sweep's `chosen` point, perhaps the candidate's own defines).
    pub best_sweep: Option<MatrixSweep>,
    pub spend: Spend,
    /// Every request and reply, in order (the transcript; the recorder keeps it on disk).
    pub transcript: Vec<(ChatRequest, Result<String, String>)>,
}

/// An event for progress displays and the run journal, sent as it happens: a journal
/// written from these alone holds every exchange, candidate and verdict of the loop so far.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum Event {
    Round {
        round: u32,
    },
    Request {
        purpose: String,
    },
    /// A request answered (or failed for good): the prompt (its last message), the reply
    /// or the error, and the tokens the answer used.
    Exchange {
        round: u32,
        purpose: String,
        prompt: String,
        reply: Result<String, String>,
        tokens: Option<u64>,
        /// Answered from the run's own record ([`crate::backend::Backend::last_from_record`]).
        from_record: bool,
    },
    Candidate {
        id: String,
    },
    Verdict {
        id: String,
        accepted: bool,
        summary: String,
        /// The round the candidate belongs to.
        round: u32,
        /// What the agent said the candidate does (its diagnosis' summary).
        diagnosis: String,
        /// Set for a point of a candidate's matrix that the loop searched.
        point: Option<MatrixPoint>,
        /// The version verified: source, entry, launch rule, defines, options.
        version: Box<KernelVersion>,
        /// The verdict in full.
        verdict: Box<Verdict>,
        /// The best's time per shape the watchdog compared with (`None`: the reference,
        /// timed in the same job).
        best_us: Option<BTreeMap<String, f64>>,
        /// Answered from the run's own record ([`Evaluate::last_from_record`]).
        from_record: bool,
    },
    /// A reply that held no usable proposal, even after its repair round: no candidate.
    Malformed {
        round: u32,
        id: String,
        error: String,
    },
    Improved {
        id: String,
        speedup: f64,
    },
    Reflection,
    Review {
        id: String,
        objections: usize,
    },
    /// The loop starts verifying the points of candidate `id`'s matrix.
    Sweep {
        id: String,
        points: usize,
    },
    /// The sweep of `id`'s matrix ended: `evaluated` of `points` verified, the point that
    /// is the best now if one of them is, and why it stopped early (or was not searched).
    SweepDone {
        id: String,
        evaluated: usize,
        points: usize,
        best: Option<String>,
        stopped: Option<String>,
    },
}

/// The current best as the loop carries it: the version candidates are built from and
/// compared with, its time per shape (the watchdog's yardstick; `None` for the
/// reference, timed in each job), and its figures for the context.
struct LoopBest {
    version: KernelVersion,
    us: Option<BTreeMap<String, f64>>,
    figures: Vec<String>,
}

impl LoopBest {
    fn label(&self) -> String {
        self.version.id.clone()
    }

    /// Makes a verified candidate the best.
    fn adopt(&mut self, version: &KernelVersion, verdict: &Verdict) {
        self.us = Some(verdict.candidate_times());
        self.figures = verdict
            .shapes
            .iter()
            .filter(|s| !s.held_out)
            .filter_map(|s| {
                Some(format!(
                    "{}: {:.2} µs ({:.2}x the reference){}",
                    s.shape,
                    s.candidate_us?,
                    s.speedup.unwrap_or(1.0),
                    s.copy_bandwidth_pct
                        .map(|p| format!(", {p:.1}% of copy bandwidth"))
                        .unwrap_or_default()
                ))
            })
            .collect();
        self.version = version.clone();
    }
}

impl Rules {
    /// The rules with their gains raised above the measured timing noise: `deviations`
    /// is, per shape, how far the same version's time moved between two jobs (`0.01`:
    /// 1%). A win must then be at least twice the largest deviation on some shape, or
    /// twice the mean deviation in geometric mean, so that the noise alone cannot make one;
    /// and a shape within its own deviation of the best counts as not slower.
    pub fn above_noise(&self, deviations: &BTreeMap<String, f64>) -> Rules {
        let logs: Vec<f64> = deviations.values().map(|d| (1.0 + d).ln().abs()).collect();
        if logs.is_empty() {
            return self.clone();
        }
        let largest = logs.iter().copied().fold(0.0, f64::max).exp() - 1.0;
        let mean = (logs.iter().sum::<f64>() / logs.len() as f64).exp() - 1.0;
        Rules {
            min_gain: self.min_gain.max(2.0 * largest),
            min_uniform_gain: self.min_uniform_gain.max(2.0 * mean),
            noise: deviations
                .iter()
                .map(|(shape, d)| (shape.clone(), d.abs()))
                .collect(),
            ..self.clone()
        }
    }
}

/// The loop's rule for a new best: every fence passed, and faster than the current best
/// by more than `rules.min_gain` on some shape (returns that largest per-shape gain), or
/// not slower on any shape (beyond that shape's measured noise) and faster by more than
/// `rules.min_uniform_gain` in geometric mean over the shapes (returns that mean).
pub fn improvement(verdict: &Verdict, rules: &Rules) -> Option<f64> {
    if !verdict.failures.is_empty() || verdict.comparisons.is_empty() {
        return None;
    }
    let speedups: Vec<f64> = verdict.comparisons.iter().map(|c| c.speedup).collect();
    let largest = speedups.iter().copied().fold(0.0, f64::max);
    if largest > 1.0 + rules.min_gain {
        return Some(largest);
    }
    let mean = (speedups.iter().map(|s| s.ln()).sum::<f64>() / speedups.len() as f64).exp();
    let everywhere = verdict.comparisons.iter().all(|c| {
        let noise = rules.noise.get(&c.shape).copied().unwrap_or(0.0);
        c.speedup * (1.0 + noise) >= 1.0
    });
    (everywhere && mean > 1.0 + rules.min_uniform_gain).then_some(mean)
}

/// The candidate whose matrix is searched.
struct SweepInput<'a> {
    round: u32,
    id: &'a str,
    base: &'a KernelVersion,
    base_verdict: &'a Verdict,
    resolved: &'a Resolved,
    matrix: &'a BTreeMap<String, Vec<i64>>,
    /// Whether the candidate's own defines just became the best.
    base_won: bool,
}

/// What a sweep reads and moves of the loop's state.
struct SweepState<'a, 'r> {
    evaluator: &'a mut dyn Evaluate,
    best: &'a mut LoopBest,
    out: &'a mut LoopOutcome,
    candidates: &'a mut u32,
    start: Instant,
    budget: &'a Budget,
    /// The run's budget (tokens and dollars do not move during a sweep).
    run: &'a mut RunCharge<'r>,
    spend: (u64, f64),
    rules: &'a Rules,
    on: &'a mut dyn FnMut(Event),
}

struct SweepEnd {
    improved: bool,
    /// The feedback the agent gets: one line per point.
    feedback: Feedback,
    /// The budget that ran out during the sweep, if one did.
    budget_out: Option<&'static str>,
}

/// Verifies every point of a candidate's matrix (each combination of its values over the
/// candidate's defines, skipping the candidate's own), one after another, each judged by
/// the loop's rule against the best so far ([`improvement`]), so the last point to
/// improve is the best. A point counts as a candidate; when the candidate or wall budget
/// runs out, the sweep stops with the best so far kept. A failing point is recorded with
/// its verdict but never counts towards an escalation: it is the search's data, not the
/// agent repeating an error.
fn sweep_matrix(c: SweepInput<'_>, st: &mut SweepState<'_, '_>) -> SweepEnd {
    let base_defines = c.base.defines.clone();
    let points = other_points(&base_defines, c.matrix);
    let mut sweep = MatrixSweep {
        base: c.id.to_string(),
        matrix: c.matrix.clone(),
        points: vec![SweptPoint {
            id: c.id.to_string(),
            defines: base_defines.clone(),
            verdict: c.base_verdict.clone(),
        }],
        planned: points.len(),
        chosen: c.base_won.then(|| c.id.to_string()),
        stopped: None,
    };
    (st.on)(Event::Sweep {
        id: c.id.to_string(),
        points: points.len(),
    });
    let mut end = SweepEnd {
        improved: false,
        feedback: Feedback {
            round: c.round,
            candidate: format!("{} matrix", c.id),
            verdict: String::new(),
            details: vec![point_line(c.id, &base_defines, c.base_verdict)],
        },
        budget_out: None,
    };
    for (j, defines) in points.into_iter().enumerate() {
        let over = if *st.candidates >= st.budget.candidates {
            Some("candidates")
        } else if st.start.elapsed() > st.budget.wall {
            Some("wall time")
        } else {
            st.run.check(*st.candidates, st.spend.0, st.spend.1)
        };
        if let Some(which) = over {
            sweep.stopped = Some(format!("the {which} budget ran out"));
            end.budget_out = Some(which);
            break;
        }
        *st.candidates += 1;
        let id = format!("{}-m{}", c.id, j + 1);
        (st.on)(Event::Candidate { id: id.clone() });
        let mut version = c.base.clone();
        version.id = id.clone();
        version.defines = defines.clone();
        let verdict = st.evaluator.evaluate(&version, st.best.us.as_ref());
        let values: BTreeMap<String, i64> = defines
            .iter()
            .filter(|(k, _)| c.matrix.contains_key(*k))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        (st.on)(Event::Verdict {
            id: id.clone(),
            accepted: verdict.accepted,
            summary: verdict.summary(),
            round: c.round,
            diagnosis: c.resolved.proposal.diagnosis.summary.clone(),
            point: Some(MatrixPoint {
                base: c.id.to_string(),
                values: values.clone(),
            }),
            version: Box::new(version.clone()),
            verdict: Box::new(verdict.clone()),
            best_us: st.best.us.clone(),
            from_record: st.evaluator.last_from_record(),
        });
        let mut resolved = c.resolved.clone();
        resolved.proposal.defines = defines.clone();
        if let Some(gain) = improvement(&verdict, st.rules) {
            (st.on)(Event::Improved {
                id: id.clone(),
                speedup: gain,
            });
            end.improved = true;
            st.best.adopt(&version, &verdict);
            st.out.best = Some((version.clone(), resolved.clone(), verdict.clone()));
            sweep.chosen = Some(id.clone());
        }
        end.feedback
            .details
            .push(point_line(&id, &defines, &verdict));
        sweep.points.push(SweptPoint {
            id: id.clone(),
            defines,
            verdict: verdict.clone(),
        });
        st.out.tried.push(Tried {
            round: c.round,
            id,
            resolved: Some(resolved),
            verdict: Some(verdict),
            error: None,
            point: Some(MatrixPoint {
                base: c.id.to_string(),
                values,
            }),
        });
    }
    let evaluated = sweep.points.len() - 1;
    let verified = sweep.points.iter().filter(|p| p.verdict.accepted).count();
    end.feedback.verdict = format!(
        "the loop evaluated {evaluated} of the {} other point(s) of your matrix; {verified} of {} point(s), yours included, passed every fence{}{}",
        sweep.planned,
        evaluated + 1,
        match &sweep.chosen {
            Some(p) => format!("; the best is now {p}"),
            None => "; none beat the best".into(),
        },
        sweep
            .stopped
            .as_ref()
            .map(|s| format!("; stopped: {s}"))
            .unwrap_or_default()
    );
    (st.on)(Event::SweepDone {
        id: c.id.to_string(),
        evaluated,
        points: sweep.planned,
        best: sweep.chosen.clone(),
        stopped: sweep.stopped.clone(),
    });
    if sweep.chosen.is_some() {
        st.out.best_sweep = Some(sweep);
    }
    end
}

/// The full defines of every point of `matrix` but the candidate's own (`base`), in the
/// order of [`proposal::matrix_points`].
fn other_points(
    base: &BTreeMap<String, i64>,
    matrix: &BTreeMap<String, Vec<i64>>,
) -> Vec<BTreeMap<String, i64>> {
    proposal::matrix_points(matrix)
        .into_iter()
        .map(|values| {
            let mut d = base.clone();
            d.extend(values);
            d
        })
        .filter(|d| d != base)
        .collect()
}

/// A point's line of the sweep's feedback: its defines, its verdict, its time per shape.
fn point_line(id: &str, defines: &BTreeMap<String, i64>, v: &Verdict) -> String {
    // Times only of correct points: a wrong point's time means nothing.
    let correct = v.correct();
    let times = v
        .shapes
        .iter()
        .filter(|s| correct && !s.held_out)
        .filter_map(|s| Some(format!("{} {:.2} µs", s.shape, s.candidate_us?)))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{id} ({}): {}{}",
        describe_defines(defines),
        if v.accepted {
            "verified".to_string()
        } else {
            format!("rejected: {}", v.summary().lines().next().unwrap_or(""))
        },
        if times.is_empty() {
            String::new()
        } else {
            format!("; {times}")
        }
    )
}

fn error_key(v: &Verdict) -> Option<(Fence, String)> {
    let f = v.failures.first()?;
    let line = f.message.lines().next().unwrap_or("").to_string();
    Some((f.fence, line))
}

/// Layered feedback from a verdict: the verdict, the compile log verbatim, the first
/// localised numeric failure, per-shape figures against the best, notes.
pub fn feedback(round: u32, id: &str, v: &Verdict) -> Feedback {
    let mut details = Vec::new();
    if !v.compile_log.trim().is_empty() {
        let log: Vec<&str> = v.compile_log.lines().take(40).collect();
        details.push(format!("compile log:\n{}", log.join("\n")));
    }
    for f in v.failures.iter().take(4) {
        if f.fence != Fence::Compile {
            details.push(format!(
                "{}{}: {}",
                f.fence.name(),
                f.shape
                    .as_ref()
                    .map(|s| format!(" [{s}]"))
                    .unwrap_or_default(),
                f.message
            ));
        }
    }
    for c in &v.comparisons {
        details.push(format!(
            "{}: {:.2} µs against the best {:.2} µs ({:.2}x)",
            c.shape, c.candidate_us, c.best_us, c.speedup
        ));
    }
    for s in v.shapes.iter().filter(|s| !s.held_out) {
        let mut parts = Vec::new();
        if let Some(p) = s.copy_bandwidth_pct {
            parts.push(format!("{p:.1}% of copy bandwidth"));
        }
        if let Some(r) = s.registers {
            parts.push(format!("{r} registers"));
        }
        if let Some(o) = s.occupancy_pct {
            parts.push(format!("{o:.0}% theoretical occupancy"));
        }
        if !parts.is_empty() {
            details.push(format!("{}: {}", s.shape, parts.join(", ")));
        }
    }
    details.extend(v.notes.iter().cloned());
    let verdict = if v.accepted {
        "accepted".to_string()
    } else {
        format!("rejected: {}", v.summary().lines().next().unwrap_or(""))
    };
    Feedback {
        round,
        candidate: id.to_string(),
        verdict,
        details,
    }
}

fn ask(
    client: &mut Client,
    (round, req): (u32, ChatRequest),
    transcript: &mut Vec<(ChatRequest, Result<String, String>)>,
    on: &mut dyn FnMut(Event),
) -> Result<String, BackendError> {
    on(Event::Request {
        purpose: req.purpose.clone(),
    });
    let r = client.complete(&req);
    let reply = r
        .as_ref()
        .map(|x| x.text.clone())
        .map_err(|e| e.to_string());
    on(Event::Exchange {
        round,
        purpose: req.purpose.clone(),
        prompt: req
            .messages
            .last()
            .map(|m| m.content.clone())
            .unwrap_or_default(),
        reply: reply.clone(),
        tokens: r
            .as_ref()
            .ok()
            .map(|x| x.usage.input_tokens + x.usage.output_tokens),
        from_record: client.last_from_record(),
    });
    transcript.push((req, reply));
    r.map(|x| x.text)
}

#[derive(Deserialize)]
struct Objections {
    objections: Vec<serde_json::Value>,
}

/// Runs the loop for one kernel.
pub fn optimize(
    task: &Task,
    client: &mut Client,
    mut reviewer: Option<&mut Client>,
    evaluator: &mut dyn Evaluate,
    budget: &Budget,
    rules: &Rules,
    on: &mut dyn FnMut(Event),
) -> LoopOutcome {
    let start = Instant::now();
    let spec = task.spec;
    let schema = serde_json::to_string_pretty(&proposal::schema()).expect("serialises");
    let mut out = LoopOutcome {
        stop: Stop::Rounds,
        rounds: 0,
        tried: vec![],
        best: None,
        best_sweep: None,
        spend: Spend::default(),
        transcript: vec![],
    };
    let mut best = LoopBest {
        version: task.reference.clone(),
        us: None,
        figures: Vec::new(),
    };
    if let Some(s) = &task.start {
        best.adopt(&s.version, &s.verdict);
    }
    let mut history: Vec<Feedback> = Vec::new();
    let mut compile_failures = 0u32;
    let mut failed_in_a_row = 0u32;
    let mut rounds_without_gain = 0u32;
    let mut seen_errors: BTreeMap<(Fence, String), u32> = BTreeMap::new();
    let mut last_compile_log = String::new();
    let mut candidates = 0u32;
    let mut run_charge = RunCharge {
        budget: task.run_budget,
        candidates: 0,
        tokens: 0,
        dollars: 0.0,
    };
    // Tokens and dollars of the proposer and the reviewer so far.
    let spend = |client: &Client, reviewer: &Option<&mut Client>| {
        let tokens = client.spend.usage.input_tokens
            + client.spend.usage.output_tokens
            + reviewer
                .as_ref()
                .map(|r| r.spend.usage.input_tokens + r.spend.usage.output_tokens)
                .unwrap_or(0);
        let dollars =
            client.spend.dollars + reviewer.as_ref().map(|r| r.spend.dollars).unwrap_or(0.0);
        (tokens, dollars)
    };

    'rounds: for round in 1..=budget.rounds {
        out.rounds = round;
        on(Event::Round { round });
        let (spent, dollars) = spend(client, &reviewer);
        let over = if start.elapsed() > budget.wall {
            Some("wall time")
        } else if spent >= budget.tokens {
            Some("tokens")
        } else if dollars >= budget.dollars {
            Some("dollars")
        } else if candidates >= budget.candidates {
            Some("candidates")
        } else {
            run_charge.check(candidates, spent, dollars)
        };
        if let Some(which) = over {
            out.stop = Stop::Budget {
                which: which.into(),
            };
            break;
        }

        // The request: a reflection turn after repeated compile failures, else a proposal.
        let launch = context::launch_text(&best.version.launch);
        let input = ContextInput {
            spec,
            round,
            best_label: best.label(),
            best_source: &best.version.source,
            best_launch: launch,
            device: task.device.clone(),
            ceilings: task.ceilings.clone(),
            figures: best.figures.clone(),
            snapshot: task.snapshot.clone(),
            structure: task.structure.clone(),
            cases: task.cases.clone(),
            history: history.clone(),
            hint: task.hint.clone(),
            budget_tokens: task.context_tokens,
        };
        let mut req = match context::propose(&input, &schema) {
            Ok(r) => r,
            Err(e) => {
                out.stop = Stop::Escalated {
                    reason: format!("the context does not fit: {e}"),
                    suspicion: "raise --context-tokens or shorten the kernel's source".into(),
                };
                break;
            }
        };
        if compile_failures >= rules.compile_failures_before_reflection {
            on(Event::Reflection);
            let reflect = context::fill(
                context::REFLECT,
                &BTreeMap::from([
                    ("log", last_compile_log.clone()),
                    ("reference_source", task.reference.source.clone()),
                ]),
            )
            .expect("template values");
            req.purpose = "reflect".into();
            req.messages[0].content.push_str("\n\n");
            req.messages[0].content.push_str(&reflect);
            compile_failures = 0;
        }
        let text = match ask(client, (round, req.clone()), &mut out.transcript, on) {
            Ok(t) => t,
            Err(BackendError::Exhausted(reason)) => {
                out.stop = Stop::AgentDone { reason };
                break;
            }
            Err(e) => {
                out.stop = Stop::Backend {
                    error: e.to_string(),
                };
                break;
            }
        };
        // One repair round for a malformed reply.
        let resolved = match proposal::parse(&text, spec, &best.version.source) {
            Ok(r) => r,
            Err(errors) => {
                let mut repair = req.clone();
                repair.purpose = "repair".into();
                repair.messages.push(Message::assistant(text.clone()));
                repair
                    .messages
                    .push(Message::user(proposal::repair_prompt(&errors)));
                let fixed = match ask(client, (round, repair), &mut out.transcript, on) {
                    Ok(t) => t,
                    Err(e) => {
                        out.stop = Stop::Backend {
                            error: e.to_string(),
                        };
                        break;
                    }
                };
                match proposal::parse(&fixed, spec, &best.version.source) {
                    Ok(r) => r,
                    Err(errors) => {
                        let msg =
                            format!("malformed reply after one repair: {}", errors.join("; "));
                        on(Event::Malformed {
                            round,
                            id: format!("r{round}"),
                            error: msg.clone(),
                        });
                        out.tried.push(Tried {
                            round,
                            id: format!("r{round}"),
                            resolved: None,
                            verdict: None,
                            error: Some(msg.clone()),
                            point: None,
                        });
                        history.push(Feedback {
                            round,
                            candidate: format!("r{round}"),
                            verdict: "no usable proposal".into(),
                            details: errors,
                        });
                        let n = seen_errors
                            .entry((Fence::Compile, "malformed reply".into()))
                            .or_insert(0);
                        *n += 1;
                        if *n > rules.repeats_of_an_error {
                            out.stop = Stop::Escalated {
                                reason: "the agent's replies stay malformed".into(),
                                suspicion: msg,
                            };
                            break;
                        }
                        rounds_without_gain += 1;
                        continue;
                    }
                }
            }
        };

        let mut improved = false;
        for (i, mut r) in resolved.into_iter().enumerate() {
            let (spent, dollars) = spend(client, &reviewer);
            let over = if candidates >= budget.candidates {
                Some("candidates")
            } else {
                run_charge.check(candidates, spent, dollars)
            };
            if let Some(which) = over {
                out.stop = Stop::Budget {
                    which: which.into(),
                };
                break 'rounds;
            }
            candidates += 1;
            let id = format!("r{round}c{}", i + 1);
            on(Event::Candidate { id: id.clone() });
            // The reviewer's objections, and the proposer's answers, before verification.
            if let Some(rv) = reviewer.as_deref_mut() {
                let review = ChatRequest {
                    purpose: "review".into(),
                    system: "You review CUDA kernels for correctness before they are run.".into(),
                    messages: vec![Message::user(
                        context::fill(
                            context::REVIEW,
                            &BTreeMap::from([
                                (
                                    "params",
                                    spec.kernel_args()
                                        .iter()
                                        .map(|a| a.name().to_string())
                                        .collect::<Vec<_>>()
                                        .join(", "),
                                ),
                                ("shapes", context::shapes(spec)),
                                (
                                    "proposal",
                                    serde_json::to_string_pretty(&r.proposal).expect("serialises"),
                                ),
                                ("source", r.source.clone()),
                            ]),
                        )
                        .expect("template values"),
                    )],
                    max_tokens: 2048,
                    temperature: 0.0,
                };
                let objections = match ask(rv, (round, review), &mut out.transcript, on) {
                    Ok(t) => proposal::extract_json(&t)
                        .and_then(|j| serde_json::from_str::<Objections>(j).ok())
                        .map(|o| o.objections)
                        .unwrap_or_default(),
                    Err(e) => {
                        out.stop = Stop::Backend {
                            error: format!("reviewer: {e}"),
                        };
                        break 'rounds;
                    }
                };
                on(Event::Review {
                    id: id.clone(),
                    objections: objections.len(),
                });
                if !objections.is_empty() {
                    let mut answer = req.clone();
                    answer.purpose = "answer-review".into();
                    answer.messages.push(Message::assistant(
                        serde_json::to_string(&proposal::ProposalSet {
                            proposals: vec![r.proposal.clone()],
                        })
                        .expect("serialises"),
                    ));
                    answer.messages.push(Message::user(
                        context::fill(
                            context::ANSWER_REVIEW,
                            &BTreeMap::from([(
                                "objections",
                                objections
                                    .iter()
                                    .enumerate()
                                    .map(|(k, o)| format!("{}. {}", k + 1, o))
                                    .collect::<Vec<_>>()
                                    .join("\n"),
                            )]),
                        )
                        .expect("template values"),
                    ));
                    match ask(client, (round, answer), &mut out.transcript, on) {
                        Ok(t) => {
                            if let Ok(mut revised) = proposal::parse(&t, spec, &best.version.source)
                            {
                                r = revised.remove(0);
                            }
                        }
                        Err(e) => {
                            out.stop = Stop::Backend {
                                error: e.to_string(),
                            };
                            break 'rounds;
                        }
                    }
                }
            }
            let version = candidate_version(&best.version, &id, &r);
            let verdict = evaluator.evaluate(&version, best.us.as_ref());
            on(Event::Verdict {
                id: id.clone(),
                accepted: verdict.accepted,
                summary: verdict.summary(),
                round,
                diagnosis: r.proposal.diagnosis.summary.clone(),
                point: None,
                version: Box::new(version.clone()),
                verdict: Box::new(verdict.clone()),
                best_us: best.us.clone(),
                from_record: evaluator.last_from_record(),
            });
            let fb = feedback(round, &id, &verdict);
            history.push(fb);
            if let Some(key) = error_key(&verdict) {
                if key.0 == Fence::Compile {
                    compile_failures += 1;
                    last_compile_log = verdict.compile_log.clone();
                } else {
                    failed_in_a_row += 1;
                }
                let n = seen_errors.entry(key.clone()).or_insert(0);
                *n += 1;
                if *n > rules.repeats_of_an_error {
                    out.tried.push(Tried::of(round, &id, r, verdict));
                    out.stop = Stop::Escalated {
                        reason: format!("the same {} error came back {} times", key.0.name(), *n),
                        suspicion: format!("every attempt fails with: {}", key.1),
                    };
                    break 'rounds;
                }
                if failed_in_a_row >= rules.failed_verifications_in_a_row {
                    let summary = verdict.summary();
                    out.tried.push(Tried::of(round, &id, r, verdict));
                    out.stop = Stop::Escalated {
                        reason: format!("verification failed {failed_in_a_row} times in a row"),
                        suspicion: format!("the last failure: {summary}"),
                    };
                    break 'rounds;
                }
            } else {
                failed_in_a_row = 0;
            }
            if let Some(gain) = improvement(&verdict, rules) {
                on(Event::Improved {
                    id: id.clone(),
                    speedup: gain,
                });
                improved = true;
                best.adopt(&version, &verdict);
                out.best = Some((version.clone(), r.clone(), verdict.clone()));
                out.best_sweep = None;
            }
            let matrix = r.proposal.matrix.clone().filter(|m| !m.is_empty());
            let base_won = out.best.as_ref().is_some_and(|b| b.0.id == id);
            out.tried
                .push(Tried::of(round, &id, r.clone(), verdict.clone()));
            let Some(matrix) = matrix else { continue };
            // The candidate's matrix: searched only when the candidate itself is correct
            // (every fence passed but perhaps the watchdog: slower than the best is what
            // another point may fix; wrong code is the agent's to fix).
            if let Some(f) = verdict.failures.iter().find(|f| f.fence != Fence::Watchdog) {
                let reason = format!(
                    "not searched: {id} itself failed the {} fence",
                    f.fence.name()
                );
                if let Some(fb) = history.last_mut() {
                    fb.details.push(format!(
                        "its matrix was {reason}; a matrix is searched once the candidate passes every fence but the watchdog"
                    ));
                }
                on(Event::SweepDone {
                    id: id.clone(),
                    evaluated: 0,
                    points: other_points(&version.defines, &matrix).len(),
                    best: None,
                    stopped: Some(reason),
                });
                continue;
            }
            let sweep = sweep_matrix(
                SweepInput {
                    round,
                    id: &id,
                    base: &version,
                    base_verdict: &verdict,
                    resolved: &r,
                    matrix: &matrix,
                    base_won,
                },
                &mut SweepState {
                    evaluator: &mut *evaluator,
                    best: &mut best,
                    out: &mut out,
                    candidates: &mut candidates,
                    start,
                    budget,
                    run: &mut run_charge,
                    spend: spend(client, &reviewer),
                    rules,
                    on: &mut *on,
                },
            );
            if sweep.improved {
                improved = true;
            }
            history.push(sweep.feedback);
            if let Some(which) = sweep.budget_out {
                out.stop = Stop::Budget {
                    which: which.into(),
                };
                break 'rounds;
            }
        }
        if improved {
            rounds_without_gain = 0;
        } else {
            rounds_without_gain += 1;
            if rounds_without_gain >= rules.rounds_without_improvement {
                out.stop = Stop::Escalated {
                    reason: format!("{rounds_without_gain} rounds brought no improvement"),
                    suspicion: history
                        .last()
                        .map(|f| format!("the last candidate: {}", f.verdict))
                        .unwrap_or_default(),
                };
                break;
            }
        }
    }
    // What the last round spent reaches the run too.
    let (spent, dollars) = spend(client, &reviewer);
    run_charge.check(candidates, spent, dollars);
    out.spend = client.spend;
    if let Some(r) = reviewer {
        out.spend.requests += r.spend.requests;
        out.spend.retries += r.spend.retries;
        out.spend.usage += r.spend.usage;
        out.spend.dollars += r.spend.dollars;
    }
    out
}

/// The candidate as a kernel version: its source, and the launch rule, defines and
/// options it names (else the current best's).
pub fn candidate_version(best: &KernelVersion, id: &str, r: &Resolved) -> KernelVersion {
    let mut v = best.clone();
    v.id = id.to_string();
    v.source = r.source.clone();
    if let Some(entry) = &r.proposal.candidate.entry {
        v.entry = entry.clone();
    }
    // Code compiled ahead belongs to the best's source, not to the candidate's.
    v.ptx = None;
    v.cubin = None;
    if let Some(l) = &r.proposal.launch {
        let parse = |t: &str| -> kopt_spec::expr::Expr {
            kopt_spec::expr::parse_str(
                t,
                kopt_spec::expr::Ty::Int,
                &|_| Some(kopt_spec::expr::VarKind::Int),
                &[],
            )
            .expect("validated when the proposal was parsed")
        };
        v.launch.grid = [parse(&l.grid[0]), parse(&l.grid[1]), parse(&l.grid[2])];
        v.launch.block = [parse(&l.block[0]), parse(&l.block[1]), parse(&l.block[2])];
        v.launch.smem = parse(&l.smem);
        v.launch.cluster = l
            .cluster
            .as_ref()
            .map(|c| [parse(&c[0]), parse(&c[1]), parse(&c[2])]);
    }
    if !r.proposal.defines.is_empty() {
        v.defines = r.proposal.defines.clone();
    }
    if !r.proposal.options.is_empty() {
        v.options = r.proposal.options.clone();
    }
    v
}

#[cfg(test)]
mod tests {
    use super::{improvement, Rules, RunBudget, RunCharge, RunLimits, RunSpent};
    use kopt_engine::stats::{watchdog, ShapeComparison};
    use kopt_engine::verdict::{Failure, Fence, Verdict};
    use std::collections::BTreeMap;
    use std::time::Duration;

    /// A verdict that passed every fence, with (shape, best µs, candidate µs) per shape.
    fn verdict(times: &[(&str, f64, f64)]) -> Verdict {
        let timed: Vec<(String, f64, f64)> = times
            .iter()
            .map(|(s, b, c)| (s.to_string(), *b, *c))
            .collect();
        let comparisons: Vec<ShapeComparison> = watchdog(&timed, 0.03);
        Verdict {
            accepted: true,
            failures: vec![],
            shapes: vec![],
            wins: vec![],
            comparisons,
            outliers: vec![],
            notes: vec![],
            compile_log: String::new(),
            seeds: vec![],
            sanitizer: None,
        }
    }

    #[test]
    fn the_gains_a_win_needs_rise_above_the_measured_noise() {
        let quiet: BTreeMap<String, f64> =
            [("a".to_string(), 0.002), ("b".to_string(), -0.004)].into();
        let r = Rules::default().above_noise(&quiet);
        assert_eq!(
            (r.min_gain, r.min_uniform_gain),
            (0.03, 0.01),
            "quiet: the defaults"
        );
        let noisy: BTreeMap<String, f64> =
            [("a".to_string(), 0.025), ("b".to_string(), -0.005)].into();
        let r = Rules::default().above_noise(&noisy);
        assert!((r.min_gain - 0.05).abs() < 1e-3, "{}", r.min_gain);
        assert!(
            (r.min_uniform_gain - 0.03).abs() < 1e-3,
            "{}",
            r.min_uniform_gain
        );
        // A candidate 4% faster on one shape won on the quiet device, not on this one.
        let v = verdict(&[("a", 100.0, 96.0), ("b", 100.0, 100.0)]);
        assert!(improvement(&v, &Rules::default()).is_some());
        assert!(improvement(&v, &r).is_none());
        assert_eq!(
            Rules::default().above_noise(&BTreeMap::new()).min_gain,
            0.03
        );
    }

    #[test]
    fn a_run_budget_is_charged_the_difference_and_names_the_limit_reached() {
        let b = RunBudget::new(RunLimits {
            tokens: Some(3000),
            dollars: Some(1.0),
            ..RunLimits::default()
        });
        let mut one = RunCharge {
            budget: Some(&b),
            candidates: 0,
            tokens: 0,
            dollars: 0.0,
        };
        let mut two = RunCharge {
            budget: Some(&b),
            candidates: 0,
            tokens: 0,
            dollars: 0.0,
        };
        assert_eq!(one.check(1, 1000, 0.25), None);
        // A loop's totals are charged once: the same totals again add nothing.
        assert_eq!(one.check(1, 1000, 0.25), None);
        assert_eq!(two.check(2, 1500, 0.25), None);
        assert_eq!(
            b.spent(),
            RunSpent {
                candidates: 3,
                tokens: 2500,
                dollars: 0.5
            }
        );
        assert_eq!(one.check(1, 1500, 0.3), Some("run's tokens"));
        assert_eq!(
            two.check(2, 1500, 0.25),
            Some("run's tokens"),
            "every loop sees it"
        );
        let unlimited = RunBudget::new(RunLimits::default());
        assert!(unlimited.limits.is_unlimited());
        unlimited.charge(1000, u64::MAX / 2, 1e9);
        assert_eq!(unlimited.exhausted(), None);
        let dollars = RunBudget::new(RunLimits {
            dollars: Some(1.0),
            ..RunLimits::default()
        });
        dollars.charge(0, 0, 1.0);
        assert_eq!(dollars.exhausted(), Some("run's dollars"));
        let wall = RunBudget::new(RunLimits {
            wall: Some(Duration::ZERO),
            ..RunLimits::default()
        });
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(wall.exhausted(), Some("run's wall time"));
    }

    #[test]
    fn a_new_best_is_much_faster_somewhere_or_faster_everywhere() {
        let rules = Rules::default();
        // The transpose block orders of docs/runs/2026-11-29-h200-dsmem-merge: ORDER 1
        // against the best so far (ORDER 2), 2.4-2.9% faster on each shape.
        let uniform = verdict(&[
            ("cols=1024 rows=16384", 35.97, 35.11),
            ("cols=16384 rows=4096", 135.46, 132.18),
            ("cols=8192 rows=8192", 135.90, 131.98),
        ]);
        let gain = improvement(&uniform, &rules).expect("faster on every shape");
        assert!((gain - 1.027).abs() < 0.002, "{gain}");
        // More than 3% on one shape, a little slower on another: a win, as before.
        let one = verdict(&[("a", 10.0, 9.0), ("b", 10.0, 10.2)]);
        let gain = improvement(&one, &rules).expect("11% on one shape");
        assert!((gain - 10.0 / 9.0).abs() < 1e-9);
        // 2% faster on two shapes but slower on a third: not a new best.
        let mixed = verdict(&[("a", 10.0, 9.8), ("b", 10.0, 9.8), ("c", 10.0, 10.05)]);
        assert_eq!(improvement(&mixed, &rules), None);
        // Faster everywhere, but by less than 1% in geometric mean: noise, not a win.
        let small = verdict(&[("a", 10.0, 9.95), ("b", 10.0, 9.93)]);
        assert_eq!(improvement(&small, &rules), None);
        // A failed fence, or no timed shape, is never a new best.
        let mut failed = uniform.clone();
        failed.failures.push(Failure {
            fence: Fence::Watchdog,
            shape: None,
            message: "x".into(),
        });
        assert_eq!(improvement(&failed, &rules), None);
        assert_eq!(improvement(&verdict(&[]), &rules), None);
    }

    #[test]
    fn an_unchanged_shape_within_its_noise_does_not_veto_a_uniform_win() {
        // A candidate about 1.2% faster on two large shapes whose few-token shape runs the
        // same code as the best (silu_mul's flat grid on the H200 measured 3.01 against
        // 3.01 us there, docs/runs/2026-11-30-h200-transpose-residency): that shape lands
        // either side of 1.
        let measured: BTreeMap<String, f64> = [
            ("big".to_string(), 0.001),
            ("huge".to_string(), -0.002),
            ("few".to_string(), 0.004),
        ]
        .into();
        let rules = Rules {
            min_uniform_gain: 0.003,
            ..Rules::default()
        }
        .above_noise(&measured);
        assert_eq!(
            rules.noise["huge"], 0.002,
            "the size of a deviation, not its sign"
        );
        let cand = |few: f64| {
            verdict(&[
                ("big", 63.81, 63.0),
                ("huge", 93.67, 92.6),
                ("few", 3.010, few),
            ])
        };
        assert!(
            improvement(&cand(3.009), &rules).is_some(),
            "faster on all three"
        );
        assert!(
            improvement(&cand(3.019), &rules).is_some(),
            "0.3% slower where the noise is 0.4%: not slower"
        );
        assert_eq!(
            improvement(&cand(3.030), &rules),
            None,
            "0.7% slower where the noise is 0.4%: slower"
        );
        // Without a noise measurement, any slowdown vetoes, as before.
        let unmeasured = Rules {
            min_uniform_gain: 0.003,
            ..Rules::default()
        };
        assert_eq!(improvement(&cand(3.019), &unmeasured), None);
    }
}
