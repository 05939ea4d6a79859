//! The loop as a state that is stepped one round at a time: the built-in driver
//! ([`super::optimize`]) asks a model for each round's proposals, the MCP server takes
//! them from a coding agent's tool calls, and both hand them to [`LoopState::round`],
//! which verifies them, judges them against the best so far, applies the rules and the
//! budgets (both plain data: [`Rules`], [`Budget`]) and says whether the loop goes on.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Instant;

use kopt_engine::job::KernelVersion;
use kopt_engine::verdict::{Fence, Verdict};

use super::{
    candidate_version, describe_defines, feedback, improvement, Budget, Evaluate, Event,
    FoundRegion, LoopOutcome, LostTo, MatrixPoint, MatrixSweep, RegionalWinner, Rules, RunBudget,
    RunCharge, Start, Stop, SweptPoint, Task, Tried,
};
use crate::backend::Spend;
use crate::chat::ChatRequest;
use crate::context::{self, ContextInput, Feedback};
use crate::proposal::{self, Resolved};
use kopt_search::interesting::Interesting;
use kopt_search::run::{
    run as search_run, Budget as SearchBudget, Compiled, Compiler, Control,
    Evaluator as SearchEvaluator, Observer as SearchObserver, PointOutcome, PointSpec, Prior,
    Record, Settings as SearchSettings, Status, StopReason,
};
use kopt_search::seed::{Guide, ParameterMatrix};
use kopt_search::space::{Limits, OptionAxes, Space};
use kopt_search::strategy::{Exhaustive, HillClimb, Strategy};
use kopt_spec::spec::{KernelSpec, Tunable};

/// What a round needs of the agents besides their proposals.
pub trait Agents {
    /// Tokens and dollars the agents spent so far, which the budgets read before each
    /// candidate.
    fn spent(&self) -> (u64, f64);

    /// A chance to revise candidate `id` before it is verified (the built-in loop's
    /// reviewer and the proposer's answer to it); `best_source` is what a revised
    /// proposal's diff applies to. An error stops the loop.
    fn review(
        &mut self,
        round: u32,
        id: &str,
        candidate: Resolved,
        best_source: &str,
        on: &mut dyn FnMut(Event),
    ) -> Result<Resolved, Stop> {
        let _ = (round, id, best_source, on);
        Ok(candidate)
    }
}

/// Agents whose spending the loop does not count and who review nothing: proposals made
/// elsewhere (the MCP server's coding agent) and handed in.
pub struct Unreviewed;

impl Agents for Unreviewed {
    fn spent(&self) -> (u64, f64) {
        (0, 0.0)
    }
}

/// One candidate a round verified, a point of a searched matrix included.
#[derive(Debug, Clone)]
pub struct Checked {
    pub id: String,
    pub version: KernelVersion,
    pub verdict: Verdict,
    /// What the agent is told of it.
    pub feedback: Feedback,
    /// Whether it became the best.
    pub improved: bool,
}

/// What one round did.
#[derive(Debug, Clone)]
pub struct Round {
    pub number: u32,
    /// The candidates verified, in order, with their matrices' points.
    pub checked: Vec<Checked>,
    /// Whether the best changed.
    pub improved: bool,
    /// Why the loop stops after this round (`None`: it goes on).
    pub stop: Option<Stop>,
}

/// The current best as the loop carries it: the version candidates are built from and
/// compared with, its time per shape (the watchdog's yardstick; `None` for the
/// reference, timed in each job), and its figures for the context.
struct LoopBest {
    label: String,
    version: KernelVersion,
    verdict: Option<Verdict>,
    us: Option<BTreeMap<String, f64>>,
    figures: Vec<String>,
}

impl LoopBest {
    /// Makes a verified version the best.
    fn adopt(&mut self, label: &str, version: &KernelVersion, verdict: &Verdict) {
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
        self.label = label.to_string();
        self.version = version.clone();
        self.verdict = Some(verdict.clone());
    }
}

/// The loop for one kernel between two rounds: the best so far, what the agent has been
/// told, the counts the rules read, and what was tried.
pub struct LoopState<'r> {
    /// The kernel's spec: a candidate's matrix is searched over its constraints and shapes.
    spec: KernelSpec,
    rules: Rules,
    budget: Budget,
    run: RunCharge<'r>,
    started: Instant,
    reference_source: String,
    best: LoopBest,
    history: Vec<Feedback>,
    compile_failures: u32,
    failed_in_a_row: u32,
    rounds_without_gain: u32,
    seen_errors: BTreeMap<(Fence, String), u32>,
    last_compile_log: String,
    candidates: u32,
    rounds: u32,
    tried: Vec<Tried>,
    found: Option<(KernelVersion, Resolved, Verdict)>,
    found_sweep: Option<MatrixSweep>,
    /// The winner of each region, in the order the regions first won.
    regional: Vec<RegionalWinner>,
    /// The accepted variant the loop started from, as verified at the start (`None`: the
    /// reference).
    start: Option<Start>,
}

mod narrow;
pub use narrow::NARROWING_FLOOR;

impl<'r> LoopState<'r> {
    /// A loop for `spec`'s kernel from `reference`, or from `start` (a version verified
    /// in this run) when given; its wall-time budget counts from now.
    pub fn new(
        spec: &KernelSpec,
        reference: &KernelVersion,
        start: Option<&Start>,
        rules: Rules,
        budget: Budget,
        run_budget: Option<&'r RunBudget>,
    ) -> Self {
        let mut best = LoopBest {
            label: reference.id.clone(),
            version: reference.clone(),
            verdict: None,
            us: None,
            figures: Vec::new(),
        };
        if let Some(s) = start {
            best.adopt(&s.version.id, &s.version, &s.verdict);
        }
        LoopState {
            spec: spec.clone(),
            rules,
            budget,
            run: RunCharge {
                budget: run_budget,
                candidates: 0,
                tokens: 0,
                dollars: 0.0,
            },
            started: Instant::now(),
            reference_source: reference.source.clone(),
            best,
            history: Vec::new(),
            compile_failures: 0,
            failed_in_a_row: 0,
            rounds_without_gain: 0,
            seen_errors: BTreeMap::new(),
            last_compile_log: String::new(),
            candidates: 0,
            rounds: 0,
            tried: Vec::new(),
            found: None,
            found_sweep: None,
            regional: Vec::new(),
            start: start.cloned(),
        }
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// The rounds opened so far.
    pub fn rounds(&self) -> u32 {
        self.rounds
    }

    /// The candidates verified so far, matrix points included.
    pub fn candidates(&self) -> u32 {
        self.candidates
    }

    /// The best's name: `reference`, a candidate's id, or what [`LoopState::set_best`] named it.
    pub fn best_label(&self) -> &str {
        &self.best.label
    }

    /// The version candidates are built from.
    pub fn best_version(&self) -> &KernelVersion {
        &self.best.version
    }

    /// The best's verdict (`None` while the best is the reference).
    pub fn best_verdict(&self) -> Option<&Verdict> {
        self.best.verdict.as_ref()
    }

    /// The best's time per shape, which a candidate's watchdog compares with (`None`:
    /// the reference, timed in each candidate's job).
    pub fn best_times(&self) -> Option<&BTreeMap<String, f64>> {
        self.best.us.as_ref()
    }

    /// What the agent was told of each candidate so far.
    pub fn history(&self) -> &[Feedback] {
        &self.history
    }

    /// Makes a version verified elsewhere the best (a search's winner, say).
    pub fn set_best(&mut self, label: &str, version: &KernelVersion, verdict: &Verdict) {
        self.best.adopt(label, version, verdict);
    }

    /// The budget reached before the next round or candidate, if one is: the kernel's
    /// wall time, tokens and dollars (read only at a round's start), its candidates, then
    /// the run's.
    fn over_budget(
        &mut self,
        (tokens, dollars): (u64, f64),
        round_start: bool,
    ) -> Option<&'static str> {
        let b = &self.budget;
        let over = if round_start && self.started.elapsed() > b.wall {
            Some("wall time")
        } else if round_start && tokens >= b.tokens {
            Some("tokens")
        } else if round_start && dollars >= b.dollars {
            Some("dollars")
        } else if self.candidates >= b.candidates {
            Some("candidates")
        } else {
            None
        };
        over.or_else(|| self.run.check(self.candidates, tokens, dollars))
    }

    /// Opens the next round, unless the round budget is used up or another budget ran out
    /// (the round is then counted as opened, and `Event::Round` sent, as the budgets are
    /// read at its start).
    pub fn open_round(
        &mut self,
        agents: &dyn Agents,
        on: &mut dyn FnMut(Event),
    ) -> Result<u32, Stop> {
        if self.rounds >= self.budget.rounds {
            return Err(Stop::Rounds);
        }
        self.rounds += 1;
        let round = self.rounds;
        on(Event::Round { round });
        match self.over_budget(agents.spent(), true) {
            Some(which) => Err(Stop::Budget {
                which: which.into(),
            }),
            None => Ok(round),
        }
    }

    /// The request of round `round`: a reflection turn after repeated compile failures
    /// (the agent re-reads its last candidate against the reference), else a proposal.
    pub fn request(
        &mut self,
        task: &Task,
        round: u32,
        schema: &str,
        on: &mut dyn FnMut(Event),
    ) -> Result<ChatRequest, Stop> {
        let input = ContextInput {
            spec: task.spec,
            round,
            best_label: self.best.label.clone(),
            best_source: &self.best.version.source,
            best_launch: context::launch_text(&self.best.version.launch),
            device: task.device.clone(),
            ceilings: task.ceilings.clone(),
            figures: self.best.figures.clone(),
            regions: self.regional_lines(),
            snapshot: task.snapshot.clone(),
            structure: task.structure.clone(),
            cases: task.cases.clone(),
            history: self.history.clone(),
            hint: task.hint.clone(),
            budget_tokens: task.context_tokens,
        };
        let mut req = context::propose(&input, schema).map_err(|e| Stop::Escalated {
            reason: format!("the context does not fit: {e}"),
            suspicion: "raise --context-tokens or shorten the kernel's source".into(),
        })?;
        if self.compile_failures >= self.rules.compile_failures_before_reflection {
            on(Event::Reflection);
            let reflect = context::fill(
                context::REFLECT,
                &BTreeMap::from([
                    ("log", self.last_compile_log.clone()),
                    ("reference_source", self.reference_source.clone()),
                ]),
            )
            .expect("template values");
            req.purpose = "reflect".into();
            req.messages[0].content.push_str("\n\n");
            req.messages[0].content.push_str(&reflect);
            self.compile_failures = 0;
        }
        Ok(req)
    }

    /// Round `round` brought no usable proposal (`errors`, even after its repair): the
    /// agent is told, and replies that stay malformed escalate like a repeated error.
    pub fn malformed(
        &mut self,
        round: u32,
        errors: Vec<String>,
        on: &mut dyn FnMut(Event),
    ) -> Result<(), Stop> {
        let id = format!("r{round}");
        let msg = format!("malformed reply after one repair: {}", errors.join("; "));
        on(Event::Malformed {
            round,
            id: id.clone(),
            error: msg.clone(),
        });
        self.tried.push(Tried {
            round,
            id: id.clone(),
            resolved: None,
            verdict: None,
            error: Some(msg.clone()),
            point: None,
        });
        self.history.push(Feedback {
            round,
            candidate: id,
            verdict: "no usable proposal".into(),
            details: errors,
        });
        let n = self
            .seen_errors
            .entry((Fence::Compile, "malformed reply".into()))
            .or_insert(0);
        *n += 1;
        if *n > self.rules.repeats_of_an_error {
            return Err(Stop::Escalated {
                reason: "the agent's replies stay malformed".into(),
                suspicion: msg,
            });
        }
        self.rounds_without_gain += 1;
        Ok(())
    }

    /// Verifies round `number`'s candidates (each named: `r1c2`), in order, each judged
    /// against the best so far by the loop's rule ([`improvement`]) and, where it carries
    /// a matrix and the rules say so, its matrix searched; then applies the rules: an
    /// error repeated, verifications failing in a row, rounds without improvement, a
    /// budget run out.
    pub fn round(
        &mut self,
        number: u32,
        candidates: Vec<(String, Resolved)>,
        agents: &mut dyn Agents,
        evaluator: &mut dyn Evaluate,
        on: &mut dyn FnMut(Event),
    ) -> Round {
        let mut round = Round {
            number,
            checked: Vec::new(),
            improved: false,
            stop: None,
        };
        for (id, candidate) in candidates {
            if let Some(stop) = self.candidate(&mut round, id, candidate, agents, evaluator, on) {
                round.stop = Some(stop);
                return round;
            }
        }
        if round.improved {
            self.rounds_without_gain = 0;
        } else {
            self.rounds_without_gain += 1;
            if self.rounds_without_gain >= self.rules.rounds_without_improvement {
                round.stop = Some(Stop::Escalated {
                    reason: format!("{} rounds brought no improvement", self.rounds_without_gain),
                    suspicion: self
                        .history
                        .last()
                        .map(|f| format!("the last candidate: {}", f.verdict))
                        .unwrap_or_default(),
                });
            }
        }
        round
    }

    /// One candidate of a round: the stop it brings, if any.
    fn candidate(
        &mut self,
        round: &mut Round,
        id: String,
        candidate: Resolved,
        agents: &mut dyn Agents,
        evaluator: &mut dyn Evaluate,
        on: &mut dyn FnMut(Event),
    ) -> Option<Stop> {
        if let Some(which) = self.over_budget(agents.spent(), false) {
            return Some(Stop::Budget {
                which: which.into(),
            });
        }
        self.candidates += 1;
        on(Event::Candidate { id: id.clone() });
        let r = match agents.review(round.number, &id, candidate, &self.best.version.source, on) {
            Ok(r) => r,
            Err(stop) => return Some(stop),
        };
        let claimed = r.proposal.region.clone();
        let mut version = candidate_version(&self.best.version, &id, &r);
        let best_us = self.best_us_in(claimed.as_deref());
        let verdict = evaluator.evaluate(&mut version, best_us.as_ref(), claimed.as_deref());
        on(Event::Verdict {
            id: id.clone(),
            accepted: verdict.accepted,
            summary: verdict.summary(),
            round: round.number,
            diagnosis: r.proposal.diagnosis.summary.clone(),
            point: None,
            version: Box::new(version.clone()),
            verdict: Box::new(verdict.clone()),
            best_us: self.best.us.clone(),
            from_record: evaluator.last_from_record(),
        });
        let fb = feedback(round.number, &id, &verdict);
        self.history.push(fb.clone());
        let mut checked = Checked {
            id: id.clone(),
            version: version.clone(),
            verdict: verdict.clone(),
            feedback: fb,
            improved: false,
        };
        if let Some(key) = error_key(&verdict) {
            if key.0 == Fence::Compile {
                self.compile_failures += 1;
                self.last_compile_log = verdict.compile_log.clone();
            } else {
                self.failed_in_a_row += 1;
            }
            let n = self.seen_errors.entry(key.clone()).or_insert(0);
            *n += 1;
            let stop = if *n > self.rules.repeats_of_an_error {
                Some(Stop::Escalated {
                    reason: format!("the same {} error came back {} times", key.0.name(), *n),
                    suspicion: format!("every attempt fails with: {}", key.1),
                })
            } else if self.failed_in_a_row >= self.rules.failed_verifications_in_a_row {
                Some(Stop::Escalated {
                    reason: format!(
                        "verification failed {} times in a row",
                        self.failed_in_a_row
                    ),
                    suspicion: format!("the last failure: {}", verdict.summary()),
                })
            } else {
                None
            };
            if stop.is_some() {
                self.tried.push(Tried::of(round.number, &id, r, verdict));
                round.checked.push(checked);
                return stop;
            }
        } else {
            self.failed_in_a_row = 0;
        }
        let gain = improvement(&verdict, &self.rules);
        if let (Some(gain), None) = (gain, &claimed) {
            on(Event::Improved {
                id: id.clone(),
                speedup: gain,
            });
            round.improved = true;
            checked.improved = true;
            self.best.adopt(&id, &version, &verdict);
            self.found = Some((version.clone(), r.clone(), verdict.clone()));
            self.found_sweep = None;
        }
        let regional = match (gain, &claimed) {
            (Some(speedup), Some(region)) => Some(RegionalWinner {
                region: region.clone(),
                found: None,
                version: version.clone(),
                resolved: r.clone(),
                verdict: verdict.clone(),
                speedup,
                narrowed: None,
            }),
            (None, None) => {
                let spent = agents.spent();
                self.find_region(
                    round.number,
                    &id,
                    (&version, &r, &verdict),
                    spent,
                    evaluator,
                    on,
                )
            }
            _ => None,
        };
        if let Some(w) = regional {
            if let Some(fb) = self.history.last_mut() {
                fb.details.push(format!(
                    "kept as the winner for the shapes where `{}` holds ({:.2}x over the best there); the best keeps the others",
                    w.region, w.speedup
                ));
                if let Some(f) = &w.found {
                    fb.details.push(f.describe(&w.region));
                }
            }
            on(Event::RegionalWinner {
                id: id.clone(),
                region: w.region.clone(),
                found: w.found.is_some(),
                speedup: w.speedup,
            });
            round.improved = true;
            checked.improved = true;
            self.keep_regional(w);
        }
        round.checked.push(checked);
        // A candidate for a region is not searched around: a matrix's points are judged
        // on every shape.
        if claimed.is_some() {
            self.tried
                .push(Tried::of(round.number, &id, r.clone(), verdict.clone()));
            return None;
        }
        let matrix = r.proposal.matrix.clone().filter(|m| !m.is_empty());
        let base_won = self.found.as_ref().is_some_and(|b| b.0.id == id);
        self.tried
            .push(Tried::of(round.number, &id, r.clone(), verdict.clone()));
        let matrix = matrix.filter(|_| self.rules.search_matrices)?;
        // The candidate's matrix: searched only when the candidate itself is correct
        // (every fence passed but perhaps the watchdog: slower than the best is what
        // another point may fix; wrong code is the agent's to fix).
        if let Some(f) = verdict.failures.iter().find(|f| f.fence != Fence::Watchdog) {
            let reason = format!(
                "not searched: {id} itself failed the {} fence",
                f.fence.name()
            );
            if let Some(fb) = self.history.last_mut() {
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
            return None;
        }
        let spent = agents.spent();
        let end = self.sweep_matrix(
            SweepInput {
                round: round.number,
                id: &id,
                base: &version,
                base_verdict: &verdict,
                resolved: &r,
                matrix: &matrix,
                base_won,
            },
            evaluator,
            spent,
            &mut round.checked,
            on,
        );
        if end.improved {
            round.improved = true;
        }
        self.history.push(end.feedback);
        end.budget_out.map(|which| Stop::Budget {
            which: which.into(),
        })
    }

    /// Searches a candidate's matrix with kopt-search's driver: the space of its values
    /// over the candidate's defines, pruned by the kernel's constraints and the
    /// candidate's launch rule on every declared shape; every point when there are at
    /// most [`proposal::EXHAUSTIVE_MATRIX_POINTS`] (in the order of
    /// [`proposal::matrix_points`]), else a hill climb from the candidate's own point.
    /// Each point is verified in full and judged by the loop's rule against the best so
    /// far ([`improvement`]), so the last point to improve is the best. A point counts as
    /// a candidate; when the candidate, wall or run budget runs out, the sweep stops with
    /// the best so far kept. A failing point is recorded with its verdict but never counts
    /// towards an escalation: it is the search's data, not the agent repeating an error.
    fn sweep_matrix(
        &mut self,
        c: SweepInput<'_>,
        evaluator: &mut dyn Evaluate,
        spent: (u64, f64),
        checked: &mut Vec<Checked>,
        on: &mut dyn FnMut(Event),
    ) -> SweepEnd {
        let base_defines = c.base.defines.clone();
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
        let MatrixSpace {
            mut space,
            base: base_point,
        } = match matrix_space(&self.spec, c.base, c.matrix) {
            Ok(s) => s,
            Err(e) => {
                let reason = format!("not searched: {e}");
                end.feedback.verdict = format!("the loop did not search your matrix: {e}");
                on(Event::SweepDone {
                    id: c.id.to_string(),
                    evaluated: 0,
                    points: 0,
                    best: None,
                    stopped: Some(reason),
                });
                return end;
            }
        };
        let planned = space.len() - usize::from(base_point.is_some());
        let mut sweep = MatrixSweep {
            base: c.id.to_string(),
            matrix: c.matrix.clone(),
            points: vec![SweptPoint {
                id: c.id.to_string(),
                defines: base_defines.clone(),
                verdict: c.base_verdict.clone(),
            }],
            planned,
            exhaustive: planned <= proposal::EXHAUSTIVE_MATRIX_POINTS,
            pruned: usize::try_from(space.raw)
                .unwrap_or(usize::MAX)
                .saturating_sub(space.len()),
            chosen: c.base_won.then(|| c.id.to_string()),
            stopped: None,
        };
        on(Event::Sweep {
            id: c.id.to_string(),
            points: planned,
        });
        // The candidate's own point is known: the search starts from it and never
        // verifies it again.
        let mut prior = Prior::default();
        if let Some(id) = base_point {
            prior.outcomes.insert(id, point_outcome(c.base_verdict));
        }
        let known = prior.outcomes.len();
        let settings = SearchSettings {
            budget: SearchBudget {
                evaluations: Some(
                    self.budget.candidates.saturating_sub(self.candidates) as usize + known,
                ),
                seconds: self
                    .budget
                    .wall
                    .checked_sub(self.started.elapsed())
                    .map(|left| left.as_secs_f64())
                    .filter(|s| s.is_finite() && *s < 1e12),
                target_cost: None,
            },
            // A few threads: the points of one matrix, ahead of the device.
            compile_threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .clamp(1, 4),
            compile_ahead: proposal::EXHAUSTIVE_MATRIX_POINTS,
        };
        let exhaustive = sweep.exhaustive;
        let guide = if exhaustive {
            None
        } else {
            let starts = base_point.map(|id| space.values(id)).into_iter().collect();
            Guide::new(
                &space,
                ParameterMatrix {
                    source: format!("{}'s matrix", c.id),
                    starts,
                    ..ParameterMatrix::default()
                },
            )
            .ok()
        };
        let mut strategy: Box<dyn Strategy> = if exhaustive {
            Box::new(Exhaustive::new())
        } else {
            Box::new(HillClimb::new(0))
        };
        let run_out = Cell::new(None);
        let candidates = self.candidates;
        let judge = RefCell::new(PointJudge {
            c: &c,
            evaluator,
            rules: &self.rules,
            best: &mut self.best,
            found: &mut self.found,
            tried: &mut self.tried,
            candidates: &mut self.candidates,
            sweep: &mut sweep,
            end: &mut end,
            checked,
            on: &mut *on,
            next: 0,
            evaluated: HashSet::new(),
        });
        let mut watch = SweepWatch {
            judge: &judge,
            run: &mut self.run,
            spent,
            candidates,
            run_out: &run_out,
        };
        let summary = search_run(
            &mut space,
            strategy.as_mut(),
            &mut PointEvaluator(&judge),
            guide.as_ref(),
            Interesting::none(),
            &settings,
            prior,
            &mut watch,
        );
        let evaluated = sweep.points.len() - 1;
        // A budget that stopped the search stopped the sweep only if points were left.
        let which = match summary.stop {
            _ if evaluated >= planned => None,
            StopReason::Evaluations => Some("candidates"),
            StopReason::Seconds => Some("wall time"),
            StopReason::Interrupted => run_out.get(),
            _ => None,
        };
        if let Some(which) = which {
            sweep.stopped = Some(format!("the {which} budget ran out"));
            end.budget_out = Some(which);
        }
        let verified = sweep.points.iter().filter(|p| p.verdict.accepted).count();
        end.feedback.verdict = format!(
            "the loop evaluated {evaluated} of the {} other point(s) of your matrix{}; {verified} of {} point(s), yours included, passed every fence{}{}",
            sweep.planned,
            if exhaustive { "" } else { ", climbing from yours" },
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
        on(Event::SweepDone {
            id: c.id.to_string(),
            evaluated,
            points: sweep.planned,
            best: sweep.chosen.clone(),
            stopped: sweep.stopped.clone(),
        });
        if sweep.chosen.is_some() {
            self.found_sweep = Some(sweep);
        }
        end
    }

    /// The region winner that candidate `id` became (itself, or verified again on the
    /// region the loop found for it), if it became one.
    pub fn regional_of(&self, id: &str) -> Option<&RegionalWinner> {
        let again = format!("{id}-region");
        self.regional
            .iter()
            .find(|w| w.version.id == id || w.version.id == again)
    }

    /// The winners of regions as the agent's context lists them, then the region map:
    /// which version runs each declared shape (the first region's winner whose region
    /// holds, else the best).
    pub fn regional_lines(&self) -> Vec<String> {
        if self.regional.is_empty() {
            return Vec::new();
        }
        let mut lines: Vec<String> = self.regional.iter().map(regional_line).collect();
        let map: Vec<String> = self
            .spec
            .shapes
            .iter()
            .map(|s| {
                let args = self.spec.shape_args(s);
                let runs = self
                    .regional
                    .iter()
                    .find(|w| {
                        self.spec
                            .parse_region(&w.region)
                            .is_ok_and(|r| self.spec.region_holds(&r, &args))
                    })
                    .map_or(self.best.label.as_str(), |w| w.version.id.as_str());
                format!("{}: {runs}", kopt_spec::spec::shape_label(s))
            })
            .collect();
        lines.push(format!("region map: {}", map.join("; ")));
        lines
    }

    /// The times a candidate for `region` is compared with: that region's winner's where
    /// one exists, else the best's.
    fn best_us_in(&self, region: Option<&str>) -> Option<BTreeMap<String, f64>> {
        region
            .and_then(|r| self.regional.iter().find(|w| w.region == r))
            .map(|w| w.verdict.candidate_times())
            .or_else(|| self.best.us.clone())
    }

    /// Drops the regions' winners that the final best matches on their shapes: each was
    /// judged against the best of its time, and has nothing left to win there. Winners
    /// narrowed to beat the reference are judged against the reference, and stay.
    fn settle_regions(&mut self) {
        if let Some(best) = &self.best.us {
            let rules = &self.rules;
            self.regional
                .retain(|w| w.narrowed.is_some() || beats_on_its_shapes(w, best, rules));
        }
    }

    /// Keeps `w` as its region's winner, replacing an earlier one of the same region.
    fn keep_regional(&mut self, w: RegionalWinner) {
        match self.regional.iter_mut().find(|x| x.region == w.region) {
            Some(x) => *x = w,
            None => self.regional.push(w),
        }
    }

    /// A region for a candidate that is right but slower than the best on some declared
    /// shapes and faster on others: the tightest condition separating the shapes it won
    /// from those it lost, and the candidate verified again on that region's shapes (a
    /// candidate of its own, `<id>-region`). `None` when no condition separates them or the
    /// second verification does not make it a winner there.
    fn find_region(
        &mut self,
        round: u32,
        id: &str,
        (version, r, verdict): (&KernelVersion, &Resolved, &Verdict),
        spent: (u64, f64),
        evaluator: &mut dyn Evaluate,
        on: &mut dyn FnMut(Event),
    ) -> Option<RegionalWinner> {
        if verdict.accepted || !verdict.correct() || verdict.wins.is_empty() {
            return None;
        }
        let lost: Vec<String> = verdict
            .failures
            .iter()
            .filter_map(|f| f.shape.clone())
            .collect();
        let args = |labels: &[String]| -> Vec<Vec<i64>> {
            labels
                .iter()
                .filter_map(|l| kopt_spec::regions::label_args(&self.spec, l))
                .collect()
        };
        let held_out: Vec<String> = verdict
            .shapes
            .iter()
            .filter(|s| s.held_out)
            .map(|s| s.shape.clone())
            .collect();
        let (wins, losses, others) = (args(&verdict.wins), args(&lost), args(&held_out));
        let region = kopt_spec::regions::separating_region(&self.spec, &wins, &losses, &others)?;
        if self.over_budget(spent, false).is_some() {
            return None;
        }
        let again = format!("{id}-region");
        self.candidates += 1;
        on(Event::Candidate { id: again.clone() });
        let mut v = version.clone();
        v.id = again.clone();
        let best_us = self.best_us_in(Some(&region.text));
        let second = evaluator.evaluate(&mut v, best_us.as_ref(), Some(&region.text));
        on(Event::Verdict {
            id: again.clone(),
            accepted: second.accepted,
            summary: second.summary(),
            round,
            diagnosis: format!("{id} on the region kopt found for it, `{}`", region.text),
            point: None,
            version: Box::new(v.clone()),
            verdict: Box::new(second.clone()),
            best_us: best_us.clone(),
            from_record: evaluator.last_from_record(),
        });
        let mut resolved = r.clone();
        resolved.proposal.region = Some(region.text.clone());
        self.tried
            .push(Tried::of(round, &again, resolved.clone(), second.clone()));
        let speedup = improvement(&second, &self.rules)?;
        Some(RegionalWinner {
            region: region.text,
            found: Some(FoundRegion {
                won: verdict.wins.clone(),
                lost,
                held_out_inside: region.others_inside,
                lost_to: LostTo::Best,
            }),
            version: v,
            resolved,
            verdict: second,
            speedup,
            narrowed: None,
        })
    }

    /// Ends the loop with `stop`, charging the run what the agents spent since the last
    /// check: what it tried and found (the agents' spending and transcript are the
    /// caller's to fill in).
    pub fn finish(mut self, stop: Stop, agents: &dyn Agents) -> LoopOutcome {
        let (tokens, dollars) = agents.spent();
        self.run.check(self.candidates, tokens, dollars);
        self.settle_regions();
        LoopOutcome {
            stop,
            rounds: self.rounds,
            tried: self.tried,
            best: self.found,
            best_sweep: self.found_sweep,
            regional: self.regional,
            spend: Spend::default(),
            transcript: Vec::new(),
        }
    }
}

/// Whether `w` is faster than the times `best` on the declared shapes both were timed on,
/// by the rule of a new best.
fn beats_on_its_shapes(w: &RegionalWinner, best: &BTreeMap<String, f64>, rules: &Rules) -> bool {
    let timed: Vec<(String, f64, f64)> = w
        .verdict
        .shapes
        .iter()
        .filter(|s| !s.held_out)
        .filter_map(|s| Some((s.shape.clone(), *best.get(&s.shape)?, s.candidate_us?)))
        .collect();
    timed.is_empty() || super::gain(&kopt_engine::stats::watchdog(&timed, 0.0), rules).is_some()
}

/// A regional winner as the agent's context lists it.
fn regional_line(w: &RegionalWinner) -> String {
    format!(
        "`{}`: {} ({:.2}x over the best on those shapes; region {})",
        w.region,
        w.version.id,
        w.speedup,
        if w.found.is_some() {
            "found by kopt"
        } else {
            "claimed by its proposal"
        }
    )
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

struct SweepEnd {
    improved: bool,
    /// The feedback the agent gets: one line per point.
    feedback: Feedback,
    /// The budget that ran out during the sweep, if one did.
    budget_out: Option<&'static str>,
}

/// A candidate's matrix as a search space, and the candidate's own point in it (`None`
/// when the matrix leaves out one of the candidate's values).
struct MatrixSpace {
    space: Space,
    base: Option<usize>,
}

/// One axis per define of the candidate and per tunable of the kernel: a matrix key takes
/// its listed values, anything else only the candidate's own value (the tunable's default
/// where the candidate sets none); the candidate's launch rule and options.
fn matrix_space(
    spec: &KernelSpec,
    base: &KernelVersion,
    matrix: &BTreeMap<String, Vec<i64>>,
) -> Result<MatrixSpace, String> {
    let mut names: BTreeSet<&String> = base.defines.keys().collect();
    names.extend(matrix.keys());
    names.extend(spec.tunables.iter().map(|t| &t.name));
    let mut s = spec.clone();
    let mut own_values = BTreeMap::new();
    s.tunables = names
        .into_iter()
        .map(|name| {
            let own = base.defines.get(name).copied().or_else(|| {
                spec.tunables
                    .iter()
                    .find(|t| &t.name == name)
                    .map(|t| t.default)
            });
            let values = matrix
                .get(name)
                .cloned()
                .unwrap_or_else(|| own.into_iter().collect());
            let own = own.filter(|v| values.contains(v));
            if let Some(v) = own {
                own_values.insert(name.clone(), v);
            }
            Tunable {
                name: name.clone(),
                default: own.unwrap_or(values[0]),
                values,
            }
        })
        .collect();
    s.launch = base.launch.clone();
    s.options = base.options.clone();
    let space = Space::build(&s, &Limits::any_device(), &OptionAxes::none())
        .map_err(|e| format!("{e:?}"))?;
    let base = space.find(&own_values);
    Ok(MatrixSpace { space, base })
}

/// A verified point as the search sees it: failed when a fence but the watchdog rejected
/// it (slower than the best is still a place to climb from), else its cost, the geometric
/// mean of the reference's time over its own on the shapes it was timed on.
fn point_outcome(v: &Verdict) -> PointOutcome {
    if let Some(f) = v.failures.iter().find(|f| f.fence != Fence::Watchdog) {
        let status = if f.fence == Fence::Compile {
            Status::CompileFailed
        } else {
            Status::Failed
        };
        return PointOutcome::failed(status, f.fence.name(), v.summary());
    }
    let speedups: Vec<f64> = v
        .shapes
        .iter()
        .filter(|s| !s.held_out)
        .filter_map(|s| s.speedup)
        .filter(|s| *s > 0.0)
        .collect();
    let cost = if speedups.is_empty() {
        1.0
    } else {
        (-speedups.iter().map(|s| s.ln()).sum::<f64>() / speedups.len() as f64).exp()
    };
    let mut o = PointOutcome::passed(cost);
    o.shapes_us = v.candidate_times();
    o
}

/// The loop's judge of a matrix's points, as the search's evaluator: each point a
/// candidate `<candidate>-m<k>`, verified through the loop's [`Evaluate`] and judged
/// against the best so far.
struct PointJudge<'a, 'c> {
    c: &'a SweepInput<'c>,
    evaluator: &'a mut dyn Evaluate,
    rules: &'a Rules,
    best: &'a mut LoopBest,
    found: &'a mut Option<(KernelVersion, Resolved, Verdict)>,
    tried: &'a mut Vec<Tried>,
    candidates: &'a mut u32,
    sweep: &'a mut MatrixSweep,
    end: &'a mut SweepEnd,
    checked: &'a mut Vec<Checked>,
    on: &'a mut dyn FnMut(Event),
    /// Points verified so far.
    next: usize,
    /// The space's ids of the points the evaluator was handed.
    evaluated: HashSet<usize>,
}

impl PointJudge<'_, '_> {
    /// Counts point `p` as the next candidate: its id (`<candidate>-m<k>`), its version
    /// (the candidate's defines with the matrix keys' values of the point: the kernel's
    /// other tunables are axes only to prune the space) and its defines.
    fn begin(&mut self, p: &PointSpec) -> (String, KernelVersion) {
        let c = self.c;
        self.next += 1;
        *self.candidates += 1;
        let id = format!("{}-m{}", c.id, self.next);
        (self.on)(Event::Candidate { id: id.clone() });
        let mut version = c.base.clone();
        version.id = id.clone();
        version.defines = point_defines(&c.base.defines, c.matrix, p);
        // The base's code was compiled with its own defines.
        version.ptx = None;
        version.cubin = None;
        version.symbol = None;
        (id, version)
    }

    /// Judges point `id`'s verdict against the best so far and records it: the journal's
    /// events, the agent's feedback line, what was tried; the search's outcome.
    fn settle(&mut self, id: String, version: KernelVersion, verdict: Verdict) -> PointOutcome {
        let c = self.c;
        let defines = version.defines.clone();
        let values: BTreeMap<String, i64> = defines
            .iter()
            .filter(|(k, _)| c.matrix.contains_key(*k))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        let point = MatrixPoint {
            base: c.id.to_string(),
            values,
        };
        (self.on)(Event::Verdict {
            id: id.clone(),
            accepted: verdict.accepted,
            summary: verdict.summary(),
            round: c.round,
            diagnosis: c.resolved.proposal.diagnosis.summary.clone(),
            point: Some(point.clone()),
            version: Box::new(version.clone()),
            verdict: Box::new(verdict.clone()),
            best_us: self.best.us.clone(),
            from_record: self.evaluator.last_from_record(),
        });
        let mut resolved = c.resolved.clone();
        resolved.proposal.defines = defines.clone();
        let gain = improvement(&verdict, self.rules);
        if let Some(gain) = gain {
            (self.on)(Event::Improved {
                id: id.clone(),
                speedup: gain,
            });
            self.end.improved = true;
            self.best.adopt(&id, &version, &verdict);
            *self.found = Some((version.clone(), resolved.clone(), verdict.clone()));
            self.sweep.chosen = Some(id.clone());
        }
        let line = point_line(&id, &defines, &verdict);
        self.end.feedback.details.push(line.clone());
        self.checked.push(Checked {
            id: id.clone(),
            version,
            verdict: verdict.clone(),
            feedback: Feedback {
                round: c.round,
                candidate: id.clone(),
                verdict: line,
                details: Vec::new(),
            },
            improved: gain.is_some(),
        });
        self.sweep.points.push(SweptPoint {
            id: id.clone(),
            defines,
            verdict: verdict.clone(),
        });
        let outcome = point_outcome(&verdict);
        self.tried.push(Tried {
            round: c.round,
            id,
            resolved: Some(resolved),
            verdict: Some(verdict),
            error: None,
            point: Some(point),
        });
        outcome
    }
}

/// The full defines of point `p` of a matrix around `base`: the base's, with the matrix
/// keys' values of the point.
fn point_defines(
    base: &BTreeMap<String, i64>,
    matrix: &BTreeMap<String, Vec<i64>>,
    p: &PointSpec,
) -> BTreeMap<String, i64> {
    let mut defines = base.clone();
    defines.extend(
        p.defines
            .iter()
            .filter(|(k, _)| matrix.contains_key(*k))
            .map(|(k, v)| (k.clone(), *v)),
    );
    defines
}

/// The judge as the search's evaluator: each point verified through the loop's
/// [`Evaluate`], with the code the compile pool made for it when the evaluator has a
/// compiler.
struct PointEvaluator<'j, 'a, 'c>(&'j RefCell<PointJudge<'a, 'c>>);

impl SearchEvaluator for PointEvaluator<'_, '_, '_> {
    fn compiler(&self) -> Option<Arc<dyn Compiler>> {
        let judge = self.0.borrow();
        let c = judge.c;
        let inner = judge.evaluator.point_compiler(c.base)?;
        Some(Arc::new(MatrixCompiler {
            inner,
            base_defines: c.base.defines.clone(),
            matrix: c.matrix.clone(),
            options: c.base.options.clone(),
        }))
    }

    fn evaluate(
        &mut self,
        p: &PointSpec,
        compiled: Option<&Compiled>,
        _progress: &mut dyn FnMut(&str),
    ) -> PointOutcome {
        let mut guard = self.0.borrow_mut();
        let judge = &mut *guard;
        judge.evaluated.insert(p.id);
        let (id, mut version) = judge.begin(p);
        if let Some(Compiled::Ok { code, .. }) = compiled {
            judge.evaluator.attach_code(&mut version, code);
        }
        let verdict = judge
            .evaluator
            .evaluate(&mut version, judge.best.us.as_ref(), None);
        judge.settle(id, version, verdict)
    }
}

/// The evaluator's compiler for a matrix's points: a point's version is the candidate's
/// with the matrix keys' values (as [`PointJudge::begin`] builds it), never the other
/// axes' values.
struct MatrixCompiler {
    inner: Arc<dyn Compiler>,
    base_defines: BTreeMap<String, i64>,
    matrix: BTreeMap<String, Vec<i64>>,
    options: Vec<String>,
}

impl Compiler for MatrixCompiler {
    fn compile(&self, p: &PointSpec) -> Compiled {
        self.inner.compile(&PointSpec {
            id: p.id,
            label: p.label.clone(),
            defines: point_defines(&self.base_defines, &self.matrix, p),
            options: self.options.clone(),
        })
    }
}

/// Records the points whose compile failed in the pool (they never reach the
/// evaluator), charges the run each point, and stops the search when a run limit is
/// reached (the search's own budgets are the kernel's candidates and wall time).
struct SweepWatch<'w, 'a, 'c, 'r> {
    judge: &'w RefCell<PointJudge<'a, 'c>>,
    run: &'w mut RunCharge<'r>,
    spent: (u64, f64),
    candidates: u32,
    run_out: &'w Cell<Option<&'static str>>,
}

impl SearchObserver for SweepWatch<'_, '_, '_, '_> {
    fn record(&mut self, space: &Space, r: &Record, _best: Option<&Record>) -> Control {
        if r.replayed {
            return Control::Continue;
        }
        let mut judge = self.judge.borrow_mut();
        // A point the pool failed to compile never reached the evaluator, which records
        // every point it was handed.
        if r.outcome.status == Status::CompileFailed && !judge.evaluated.contains(&r.id) {
            let (id, version) = judge.begin(&PointSpec::of(space, r.id));
            judge.settle(id, version, Verdict::compile_rejected(&r.outcome.detail));
        }
        drop(judge);
        self.candidates += 1;
        match self.run.check(self.candidates, self.spent.0, self.spent.1) {
            Some(which) => {
                self.run_out.set(Some(which));
                Control::Stop
            }
            None => Control::Continue,
        }
    }
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
