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
//! A proposal's `matrix` is searched by the loop with kopt-search's driver: once the
//! candidate's own defines passed every fence but perhaps the watchdog, every other point
//! of a matrix of at most [`proposal::EXHAUSTIVE_MATRIX_POINTS`], or a hill climb from the
//! candidate's point in a larger one (at most [`proposal::MAX_MATRIX_POINTS`]), is built
//! from the same source and verified in full through the same [`Evaluate`], with an id
//! `<candidate>-m<k>`, and judged by the same rule as any candidate ([`improvement`]).
//! Each point counts against the candidate budget; a budget that runs out mid-matrix
//! stops the sweep and the loop, the best so far kept. A failing point is recorded in
//! `tried` with its verdict but never counts towards an escalation.
//!
//! The rules, the judging and the budgets live in one [`LoopState`], stepped a round at
//! a time ([`LoopState::round`]); [`optimize`] is the built-in driver that asks a model
//! for each round's proposals, and the MCP server steps the same state with a coding
//! agent's ([`Rules::judge_only`]: it escalates nothing and leaves matrices to its
//! `search` tool).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kopt_engine::job::KernelVersion;
use kopt_engine::verdict::{Fence, Verdict};
use kopt_search::run::Compiler;
use kopt_spec::KernelSpec;
use serde::{Deserialize, Serialize};

use crate::backend::{BackendError, Client, Spend};
use crate::chat::{ChatRequest, Message};
use crate::context::{self, CaseLine, Feedback};
use crate::proposal::{self, Resolved};

mod round;
pub use round::{Agents, Checked, LoopState, Round, Unreviewed, NARROWING_FLOOR};

/// Verifies a candidate against the reference, its watchdog comparing with `best_us`
/// (the current best's time per shape; `None`: the reference measured in the same job).
/// The evaluator may attach to `candidate` the code it compiled and verified
/// ([`KernelVersion::ptx`]), which then stays with it: a winner keeps the PTX that ran.
///
/// `region`: the candidate is for the shapes where this condition over the scalar
/// arguments holds (a proposal's `region`, or one the loop found), verified and timed on
/// the declared and held-out shapes inside it only.
pub trait Evaluate {
    fn evaluate(
        &mut self,
        candidate: &mut KernelVersion,
        best_us: Option<&BTreeMap<String, f64>>,
        region: Option<&str>,
    ) -> Verdict;

    /// Whether the last verdict was answered from this run's own record (a resumed run)
    /// rather than measured now: [`Event::Verdict`] says so, and the record is not
    /// written twice.
    fn last_from_record(&self) -> bool {
        false
    }

    /// A compiler for the points of a matrix searched around `base`: kopt-search's
    /// compile pool runs it on CPU threads ahead of the device, a point that does not
    /// compile never reaches [`Evaluate::evaluate`], and one that does arrives with its
    /// code ([`Evaluate::attach_code`]). `None` (the default): each point compiles in its
    /// evaluation.
    fn point_compiler(&self, base: &KernelVersion) -> Option<Arc<dyn Compiler>> {
        let _ = base;
        None
    }

    /// Puts into `version` the code that [`Evaluate::point_compiler`]'s compiler made.
    fn attach_code(&self, version: &mut KernelVersion, code: &str) {
        let _ = (version, code);
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

impl Budget {
    /// No limit: for a loop whose caller keeps its own budgets (the MCP server's).
    pub fn unlimited() -> Budget {
        Budget {
            rounds: u32::MAX,
            candidates: u32::MAX,
            wall: Duration::MAX,
            tokens: u64::MAX,
            dollars: f64::INFINITY,
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
    /// Whether a proposal's matrix is searched by the loop (see the module's text); the
    /// MCP server leaves a matrix to its `search` tool.
    pub search_matrices: bool,
}

/// A win threshold in percent (`--min-gain`, `--min-uniform-gain`, `3` or `0.5%`):
/// finite, from 0 to below 100.
pub fn parse_gain_pct(text: &str) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("`{text}` is not a percentage: write e.g. `3` or `0.5`"))?;
    if !(0.0..100.0).contains(&v) {
        return Err(format!(
            "`{text}`: a gain threshold is a percentage from 0 to below 100"
        ));
    }
    Ok(v)
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
            search_matrices: true,
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

/// The loop's search of one candidate's matrix: the points verified in full through
/// [`Evaluate`], the candidate itself (its own defines) first.
#[derive(Debug, Clone)]
pub struct MatrixSweep {
    /// The candidate (`r1c2`).
    pub base: String,
    /// The matrix as the agent gave it.
    pub matrix: BTreeMap<String, Vec<i64>>,
    /// The points in the order they were verified, the candidate's own first; each
    /// point's `defines` are its full defines.
    pub points: Vec<SweptPoint>,
    /// How many valid points the matrix holds beyond the candidate's own defines.
    pub planned: usize,
    /// Whether every one of them was to be verified in turn (`false`: a hill climb from
    /// the candidate's point while the candidate budget lasts).
    pub exhaustive: bool,
    /// The matrix's combinations left out before anything ran: they break the kernel's
    /// constraints or a launch limit on a declared shape.
    pub pruned: usize,
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

/// A candidate verified on the shapes of a region and faster there than the best (which
/// keeps the other shapes): its region claimed by the proposal, or found by the loop.
#[derive(Debug, Clone)]
pub struct RegionalWinner {
    /// The condition over the scalar arguments, in the annotation's language.
    pub region: String,
    /// How the loop found the region, when the proposal did not claim it.
    pub found: Option<FoundRegion>,
    pub version: KernelVersion,
    pub resolved: Resolved,
    /// The verdict on the region's shapes.
    pub verdict: Verdict,
    /// Its gain over the best on those shapes (the rule's figure); for a winner narrowed
    /// at the loop's end, over the reference.
    pub speedup: f64,
    /// Set when kopt narrowed a winner at the loop's end to the shapes where it is not
    /// slower than the reference ([`LoopState::narrow_to_reference`]).
    pub narrowed: Option<Narrowed>,
}

/// How a winner came to be narrowed to where it is not slower than the reference.
#[derive(Debug, Clone, PartialEq)]
pub struct Narrowed {
    /// It was the loop's best on every shape (else a region's winner, narrowed further).
    pub was_best: bool,
    /// It is the accepted variant the loop started from, unchanged: no candidate beat it,
    /// and kopt only narrowed it.
    pub is_start: bool,
    /// Accepting it should retire the accepted variant the loop started from: it was the
    /// best, and the start was no faster than the reference on the shapes it leaves (so
    /// that the reference, not the start, runs there).
    pub retires_start: bool,
}

/// A region the loop proposed for a candidate that is faster than the best on some
/// declared shapes and slower on others, or for a winner slower than the reference on
/// some: the tightest condition that holds on the shapes it won and on none it lost
/// ([`kopt_spec::regions::separating_region`]), verified again on the region's declared
/// and held-out shapes.
#[derive(Debug, Clone, PartialEq)]
pub struct FoundRegion {
    /// The declared shapes it won and lost on the first verification.
    pub won: Vec<String>,
    pub lost: Vec<String>,
    /// How many of that verification's held-out shapes the region holds on.
    pub held_out_inside: usize,
    /// What it lost to.
    pub lost_to: LostTo,
}

/// What a candidate was slower than on the shapes a found region leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostTo {
    /// The loop's best of the time (a region found when the candidate was judged).
    Best,
    /// The reference, timed in the same job (a winner narrowed at the loop's end).
    Reference,
}

impl FoundRegion {
    /// One sentence for a rationale and the agent.
    pub fn describe(&self, region: &str) -> String {
        match self.lost_to {
            LostTo::Best => format!(
                "kopt proposed `{region}`, the tightest condition over the scalar arguments (one bound at the winning shapes' extreme, else an interval, else two) that holds on every declared shape the candidate won ({}) and on none it lost ({}), ties broken by the fewest held-out shapes inside ({} here), and verified the candidate again on the region's declared and held-out shapes",
                self.won.join("; "),
                self.lost.join("; "),
                self.held_out_inside
            ),
            LostTo::Reference => format!(
                "kopt narrowed it to `{region}` at the loop's end, the tightest condition over the scalar arguments (one bound, else an interval, else two) that holds on every declared shape where it was not slower than the reference ({}) and on none where it was ({}: slower than the reference timed in the same job, beyond the timing noise measured between two jobs), ties broken by the fewest held-out shapes inside ({} here), and verified it again against the reference on the region's declared and held-out shapes; the reference runs the shapes it leaves",
                self.won.join("; "),
                self.lost.join("; "),
                self.held_out_inside
            ),
        }
    }
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
    /// Winners for part of the shapes, one per region: the best keeps the others.
    pub regional: Vec<RegionalWinner>,
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
    /// A candidate became the winner of a region (claimed by its proposal, or `found` by
    /// the loop); the best is unchanged.
    RegionalWinner {
        id: String,
        region: String,
        found: bool,
        speedup: f64,
    },
    /// What narrowing a winner to where it is not slower than the reference did (or why
    /// it did not), at the loop's end ([`LoopState::narrow_to_reference`]).
    Narrowing {
        id: String,
        detail: String,
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

impl Rules {
    /// Only the rule for a new best, with these gains: no escalation and no matrix
    /// search, for proposals whose loop another agent runs (the MCP server's).
    pub fn judge_only(min_gain: f64, min_uniform_gain: f64) -> Rules {
        Rules {
            compile_failures_before_reflection: u32::MAX,
            rounds_without_improvement: u32::MAX,
            repeats_of_an_error: u32::MAX,
            failed_verifications_in_a_row: u32::MAX,
            min_gain,
            min_uniform_gain,
            noise: BTreeMap::new(),
            search_matrices: false,
        }
    }

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
    if !verdict.failures.is_empty() {
        return None;
    }
    gain(&verdict.comparisons, rules)
}

/// The rule of [`improvement`] over per-shape comparisons with the best.
pub fn gain(comparisons: &[kopt_engine::stats::ShapeComparison], rules: &Rules) -> Option<f64> {
    if comparisons.is_empty() {
        return None;
    }
    let speedups: Vec<f64> = comparisons.iter().map(|c| c.speedup).collect();
    let largest = speedups.iter().copied().fold(0.0, f64::max);
    if largest > 1.0 + rules.min_gain {
        return Some(largest);
    }
    let mean = (speedups.iter().map(|s| s.ln()).sum::<f64>() / speedups.len() as f64).exp();
    let everywhere = comparisons.iter().all(|c| {
        let noise = rules.noise.get(&c.shape).copied().unwrap_or(0.0);
        c.speedup * (1.0 + noise) >= 1.0
    });
    (everywhere && mean > 1.0 + rules.min_uniform_gain).then_some(mean)
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

/// The built-in loop's agents: the proposer, and the reviewer that reads each candidate
/// before it is verified; every exchange goes into the transcript.
struct LoopAgents<'c> {
    client: &'c mut Client,
    reviewer: Option<&'c mut Client>,
    spec: &'c KernelSpec,
    transcript: Vec<(ChatRequest, Result<String, String>)>,
    /// The round's proposal request, which the proposer's answer to a review continues.
    request: Option<ChatRequest>,
}

impl Agents for LoopAgents<'_> {
    fn spent(&self) -> (u64, f64) {
        let tokens = |c: &Client| c.spend.usage.input_tokens + c.spend.usage.output_tokens;
        (
            tokens(self.client) + self.reviewer.as_deref().map(tokens).unwrap_or(0),
            self.client.spend.dollars
                + self
                    .reviewer
                    .as_ref()
                    .map(|r| r.spend.dollars)
                    .unwrap_or(0.0),
        )
    }

    /// The reviewer's objections, and the proposer's answers, before verification.
    fn review(
        &mut self,
        round: u32,
        id: &str,
        candidate: Resolved,
        best_source: &str,
        on: &mut dyn FnMut(Event),
    ) -> Result<Resolved, Stop> {
        let Some(rv) = self.reviewer.as_deref_mut() else {
            return Ok(candidate);
        };
        let spec = self.spec;
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
                            serde_json::to_string_pretty(&candidate.proposal).expect("serialises"),
                        ),
                        ("source", candidate.source.clone()),
                    ]),
                )
                .expect("template values"),
            )],
            max_tokens: 2048,
            temperature: 0.0,
        };
        let objections = match ask(rv, (round, review), &mut self.transcript, on) {
            Ok(t) => proposal::extract_json(&t)
                .and_then(|j| serde_json::from_str::<Objections>(j).ok())
                .map(|o| o.objections)
                .unwrap_or_default(),
            Err(e) => {
                return Err(Stop::Backend {
                    error: format!("reviewer: {e}"),
                })
            }
        };
        on(Event::Review {
            id: id.to_string(),
            objections: objections.len(),
        });
        if objections.is_empty() {
            return Ok(candidate);
        }
        let mut answer = self
            .request
            .clone()
            .expect("a round's candidates follow its request");
        answer.purpose = "answer-review".into();
        answer.messages.push(Message::assistant(
            serde_json::to_string(&proposal::ProposalSet {
                proposals: vec![candidate.proposal.clone()],
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
        match ask(self.client, (round, answer), &mut self.transcript, on) {
            Ok(t) => Ok(match proposal::parse(&t, spec, best_source) {
                Ok(mut revised) => revised.remove(0),
                Err(_) => candidate,
            }),
            Err(e) => Err(Stop::Backend {
                error: e.to_string(),
            }),
        }
    }
}

impl LoopAgents<'_> {
    /// Round `round`'s proposals, from the proposer's reply to `req` or, when that is
    /// malformed, to one repair round: `Ok(Err(errors))` when both were malformed.
    fn proposals(
        &mut self,
        round: u32,
        req: &ChatRequest,
        best_source: &str,
        on: &mut dyn FnMut(Event),
    ) -> Result<Result<Vec<Resolved>, Vec<String>>, Stop> {
        let backend = |e: BackendError| match e {
            BackendError::Exhausted(reason) => Stop::AgentDone { reason },
            e => Stop::Backend {
                error: e.to_string(),
            },
        };
        let text =
            ask(self.client, (round, req.clone()), &mut self.transcript, on).map_err(backend)?;
        let errors = match proposal::parse(&text, self.spec, best_source) {
            Ok(r) => return Ok(Ok(r)),
            Err(errors) => errors,
        };
        let mut repair = req.clone();
        repair.purpose = "repair".into();
        repair.messages.push(Message::assistant(text));
        repair
            .messages
            .push(Message::user(proposal::repair_prompt(&errors)));
        // A repair that fails is the backend failing, whatever the reason.
        let fixed = ask(self.client, (round, repair), &mut self.transcript, on).map_err(|e| {
            Stop::Backend {
                error: e.to_string(),
            }
        })?;
        Ok(proposal::parse(&fixed, self.spec, best_source))
    }
}

/// Runs the loop for one kernel: asks the agent for each round's proposals (one repair
/// round for a malformed reply) and steps a [`LoopState`] with them until it stops.
pub fn optimize(
    task: &Task,
    client: &mut Client,
    reviewer: Option<&mut Client>,
    evaluator: &mut dyn Evaluate,
    budget: &Budget,
    rules: &Rules,
    on: &mut dyn FnMut(Event),
) -> LoopOutcome {
    let schema = serde_json::to_string_pretty(&proposal::schema()).expect("serialises");
    let mut state = LoopState::new(
        task.spec,
        &task.reference,
        task.start.as_ref(),
        rules.clone(),
        budget.clone(),
        task.run_budget,
    );
    let mut agents = LoopAgents {
        client,
        reviewer,
        spec: task.spec,
        transcript: Vec::new(),
        request: None,
    };
    let stop = loop {
        let round = match state.open_round(&agents, on) {
            Ok(r) => r,
            Err(stop) => break stop,
        };
        let req = match state.request(task, round, &schema, on) {
            Ok(r) => r,
            Err(stop) => break stop,
        };
        let best_source = state.best_version().source.clone();
        let proposals = match agents.proposals(round, &req, &best_source, on) {
            Ok(Ok(p)) => p,
            Ok(Err(errors)) => match state.malformed(round, errors, on) {
                Ok(()) => continue,
                Err(stop) => break stop,
            },
            Err(stop) => break stop,
        };
        agents.request = Some(req);
        let candidates = proposals
            .into_iter()
            .enumerate()
            .map(|(i, r)| (format!("r{round}c{}", i + 1), r))
            .collect();
        if let Some(stop) = state
            .round(round, candidates, &mut agents, evaluator, on)
            .stop
        {
            break stop;
        }
    };
    state.narrow_to_reference(evaluator, on);
    let mut out = state.finish(stop, &agents);
    out.spend = agents.client.spend;
    if let Some(r) = &agents.reviewer {
        out.spend.requests += r.spend.requests;
        out.spend.retries += r.spend.retries;
        out.spend.usage += r.spend.usage;
        out.spend.dollars += r.spend.dollars;
    }
    out.transcript = agents.transcript;
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
    if let Some(args) = &r.proposal.candidate.args {
        v.args = Some(args.clone());
    }
    // Code compiled ahead (or verified) belongs to the best's source, not the candidate's.
    v.ptx = None;
    v.cubin = None;
    v.symbol = None;
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
