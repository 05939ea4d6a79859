//! The driver: asks a strategy for points, has them compiled on CPU threads while the
//! device measures, records every outcome, keeps interesting points, drops fast math
//! when it breaks tolerance, and stops at the budget.
//!
//! **Parallel compilation.** When the [`Evaluator`] has a [`Compiler`] (the engine's is
//! NVRTC, producing the PTX the worker then loads instead of compiling), a pool of CPU
//! threads compiles ahead of the device: first the points of the batch being measured
//! (in order: the first one is needed first), then the points the strategy says it may
//! ask for next ([`Strategy::lookahead`]), then the rest of the unevaluated space in
//! canonical order, up to `compile_ahead` points held at once. A point that does not
//! compile is recorded as a compile failure without the device ever seeing it.
//! Compilation is a pure function of the point, so the pool's timing never changes what
//! a run decides.
//!
//! **Resumption.** A run's outcomes come back as a [`Prior`] (from its journal): the
//! strategy is started again from the same seed, and every point it asks for that the
//! prior knows is answered from it instead of being evaluated. Strategies are
//! deterministic, so the resumed run asks for exactly the points the interrupted one
//! did, evaluates none twice, and goes on where it stopped.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::interesting::Interesting;
use crate::seed::Guide;
use crate::space::{AxisKind, Space};
use crate::strategy::{Context, Strategy};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    Passed,
    CompileFailed,
    Failed,
}

/// What evaluating one point gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointOutcome {
    pub status: Status,
    /// Lower is better; present when the point passed. The engine's is the weighted
    /// geometric mean, over the timed shapes, of the point's time over the reference's
    /// time measured in the same job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// The fence that rejected the point (`compile`, `numerics`, `fault`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// The point's median time per timed shape, µs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shapes_us: BTreeMap<String, f64>,
    /// The reference's median per timed shape in the same evaluation, µs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reference_us: BTreeMap<String, f64>,
    /// Snapshot metrics of the point (`registers`, `occupancy_pct`,
    /// `global_load_bytes`, `local_bytes`, `grid_blocks_per_sm`, `copy_bandwidth_pct`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, f64>,
    /// Wall time of the evaluation on the device side, seconds.
    pub seconds: f64,
    /// CPU time its compilation took (in the pool, overlapped with other work).
    #[serde(default)]
    pub compile_seconds: f64,
    /// Served from the engine's evaluation cache.
    #[serde(default)]
    pub cached: bool,
}

impl PointOutcome {
    pub fn passed(cost: f64) -> Self {
        PointOutcome {
            status: Status::Passed,
            cost: Some(cost),
            failure: None,
            detail: String::new(),
            shapes_us: BTreeMap::new(),
            reference_us: BTreeMap::new(),
            metrics: BTreeMap::new(),
            seconds: 0.0,
            compile_seconds: 0.0,
            cached: false,
        }
    }

    pub fn failed(status: Status, failure: &str, detail: String) -> Self {
        PointOutcome {
            status,
            cost: None,
            failure: Some(failure.to_string()),
            detail,
            ..PointOutcome::passed(0.0)
        }
    }

    /// Failed a numeric fence (the tolerance did not hold).
    pub fn broke_tolerance(&self) -> bool {
        matches!(
            self.failure.as_deref(),
            Some("numerics" | "held-out" | "after-timing")
        )
    }
}

/// A point as the evaluator and the compiler see it.
#[derive(Debug, Clone, PartialEq)]
pub struct PointSpec {
    pub id: usize,
    pub label: String,
    pub defines: BTreeMap<String, i64>,
    pub options: Vec<String>,
}

impl PointSpec {
    pub fn of(space: &Space, id: usize) -> Self {
        PointSpec {
            id,
            label: space.label(id),
            defines: space.defines(id),
            options: space.options(id),
        }
    }
}

/// The result of compiling a point on the CPU.
#[derive(Debug, Clone, PartialEq)]
pub enum Compiled {
    Ok {
        /// What the device loads (PTX for the engine).
        code: String,
        seconds: f64,
        /// Metrics read off the compiled code (the widest global load...).
        metrics: BTreeMap<String, f64>,
    },
    Failed {
        log: String,
        seconds: f64,
    },
}

impl Compiled {
    pub fn seconds(&self) -> f64 {
        match self {
            Compiled::Ok { seconds, .. } | Compiled::Failed { seconds, .. } => *seconds,
        }
    }
}

/// Compiles points; called from several threads at once.
pub trait Compiler: Send + Sync {
    fn compile(&self, p: &PointSpec) -> Compiled;
}

/// Evaluates points on the device, one at a time.
pub trait Evaluator {
    /// The CPU-side compiler the driver's pool runs, if the evaluator has one.
    fn compiler(&self) -> Option<Arc<dyn Compiler>> {
        None
    }
    /// Evaluates a point; `compiled` is the pool's successful result when there is a
    /// compiler (compile failures never reach here).
    fn evaluate(
        &mut self,
        p: &PointSpec,
        compiled: Option<&Compiled>,
        progress: &mut dyn FnMut(&str),
    ) -> PointOutcome;
}

// ---------------------------------------------------------------------------------------
// The compile pool.

struct PoolState {
    urgent: VecDeque<PointSpec>,
    speculative: VecDeque<PointSpec>,
    busy: HashSet<usize>,
    done: HashMap<usize, Compiled>,
    /// Ids the speculation currently wants kept.
    wanted: HashSet<usize>,
    ahead: usize,
    shutdown: bool,
}

struct PoolShared {
    state: Mutex<PoolState>,
    cv: Condvar,
}

/// CPU threads compiling points ahead of the device.
pub struct CompilePool {
    shared: Arc<PoolShared>,
    threads: Vec<JoinHandle<()>>,
}

impl CompilePool {
    pub fn new(compiler: Arc<dyn Compiler>, threads: usize, ahead: usize) -> Self {
        let shared = Arc::new(PoolShared {
            state: Mutex::new(PoolState {
                urgent: VecDeque::new(),
                speculative: VecDeque::new(),
                busy: HashSet::new(),
                done: HashMap::new(),
                wanted: HashSet::new(),
                ahead: ahead.max(1),
                shutdown: false,
            }),
            cv: Condvar::new(),
        });
        let threads = (0..threads.max(1))
            .map(|i| {
                let shared = shared.clone();
                let compiler = compiler.clone();
                std::thread::Builder::new()
                    .name(format!("kopt-compile-{i}"))
                    .spawn(move || worker(&shared, compiler.as_ref()))
                    .expect("threads can be spawned")
            })
            .collect();
        CompilePool { shared, threads }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Points needed now, in the order they will be taken.
    pub fn want(&self, specs: &[PointSpec]) {
        let mut s = self.lock();
        for p in specs.iter().rev() {
            if s.done.contains_key(&p.id) || s.busy.contains(&p.id) {
                continue;
            }
            s.speculative.retain(|q| q.id != p.id);
            s.urgent.retain(|q| q.id != p.id);
            s.urgent.push_front(p.clone());
        }
        drop(s);
        self.shared.cv.notify_all();
    }

    /// Points worth keeping compiled, most likely first (the batch being measured
    /// included): those not compiled yet are compiled when the threads are free of urgent
    /// work; compiled points no longer in the list are dropped.
    pub fn speculate(&self, specs: Vec<PointSpec>) {
        let mut s = self.lock();
        let ahead = s.ahead;
        let list: Vec<PointSpec> = specs.into_iter().take(ahead.max(16)).collect();
        s.wanted = list.iter().map(|p| p.id).collect();
        let urgent: HashSet<usize> = s.urgent.iter().map(|p| p.id).collect();
        let wanted = s.wanted.clone();
        s.done
            .retain(|id, _| wanted.contains(id) || urgent.contains(id));
        s.speculative = list
            .into_iter()
            .filter(|p| {
                !s.done.contains_key(&p.id) && !s.busy.contains(&p.id) && !urgent.contains(&p.id)
            })
            .collect();
        drop(s);
        self.shared.cv.notify_all();
    }

    /// The compiled point, waiting for it (and asking for it first if nobody has).
    pub fn take(&self, p: &PointSpec) -> Compiled {
        let mut s = self.lock();
        loop {
            if let Some(c) = s.done.remove(&p.id) {
                return c;
            }
            if !s.busy.contains(&p.id) && !s.urgent.iter().any(|q| q.id == p.id) {
                s.speculative.retain(|q| q.id != p.id);
                s.urgent.push_front(p.clone());
                self.shared.cv.notify_all();
            }
            s = self.shared.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }
}

fn worker(shared: &PoolShared, compiler: &dyn Compiler) {
    loop {
        // The job is marked busy under the same lock that takes it off its queue: in
        // between, `take` would find it nowhere and queue it again (compiled twice).
        let job = {
            let mut s = shared.state.lock().unwrap_or_else(|p| p.into_inner());
            let job = loop {
                if s.shutdown {
                    return;
                }
                if let Some(p) = s.urgent.pop_front() {
                    break p;
                }
                let held = s.done.len() + s.busy.len();
                if held < s.ahead {
                    if let Some(p) = s.speculative.pop_front() {
                        break p;
                    }
                }
                s = shared.cv.wait(s).unwrap_or_else(|e| e.into_inner());
            };
            s.busy.insert(job.id);
            job
        };
        // A compiler that panics fails this point; it must not leave `take` waiting.
        let c = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| compiler.compile(&job)))
            .unwrap_or_else(|e| Compiled::Failed {
                log: format!(
                    "the compiler panicked on `{}`: {}",
                    job.label,
                    e.downcast_ref::<String>()
                        .map(String::as_str)
                        .or_else(|| e.downcast_ref::<&str>().copied())
                        .unwrap_or("(no message)")
                ),
                seconds: 0.0,
            });
        let mut s = shared.state.lock().unwrap_or_else(|p| p.into_inner());
        s.busy.remove(&job.id);
        s.done.insert(job.id, c);
        drop(s);
        shared.cv.notify_all();
    }
}

impl Drop for CompilePool {
    fn drop(&mut self) {
        self.lock().shutdown = true;
        self.shared.cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------------------------------
// History and the driver.

/// Every point evaluated in a run (or replayed from its journal).
#[derive(Debug, Clone, Default)]
pub struct History {
    order: Vec<usize>,
    outcomes: HashMap<usize, PointOutcome>,
    best: Option<usize>,
}

impl History {
    pub fn contains(&self, id: usize) -> bool {
        self.outcomes.contains_key(&id)
    }

    pub fn get(&self, id: usize) -> Option<&PointOutcome> {
        self.outcomes.get(&id)
    }

    /// The cost of a point that passed.
    pub fn cost(&self, id: usize) -> Option<f64> {
        self.outcomes.get(&id).and_then(|o| o.cost)
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Ids in evaluation order.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// The cheapest allowed point that passed (ties: the first evaluated).
    pub fn best(&self) -> Option<usize> {
        self.best
    }

    fn insert(&mut self, space: &Space, id: usize, o: PointOutcome) {
        self.order.push(id);
        let better = match (o.cost, self.best.and_then(|b| self.cost(b))) {
            (Some(c), Some(b)) => c < b,
            (Some(_), None) => true,
            _ => false,
        };
        self.outcomes.insert(id, o);
        if better && space.allowed(id) {
            self.best = Some(id);
        }
    }

    fn recompute_best(&mut self, space: &Space) {
        self.best = None;
        for &id in &self.order {
            if !space.allowed(id) {
                continue;
            }
            if let Some(c) = self.cost(id) {
                if self.best.and_then(|b| self.cost(b)).is_none_or(|b| c < b) {
                    self.best = Some(id);
                }
            }
        }
    }
}

/// When to stop.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// Points evaluated (compile failures and replayed points included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluations: Option<usize>,
    /// Wall time, seconds (time before an interruption included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// Stop once the best cost is at most this (the convergence benchmark's target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_cost: Option<f64>,
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub budget: Budget,
    pub compile_threads: usize,
    /// Points compiled ahead and held at most.
    pub compile_ahead: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            budget: Budget::default(),
            compile_threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
                .clamp(1, 16),
            compile_ahead: 256,
        }
    }
}

/// Outcomes known before the run starts (from an interrupted run's journal).
#[derive(Debug, Clone, Default)]
pub struct Prior {
    pub outcomes: HashMap<usize, PointOutcome>,
    /// Wall time the interrupted run had spent, seconds.
    pub elapsed: f64,
}

/// One evaluated point.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Record {
    /// 1-based, in evaluation order.
    pub seq: usize,
    pub round: usize,
    pub id: usize,
    pub label: String,
    pub values: BTreeMap<String, i64>,
    pub outcome: PointOutcome,
    /// Answered from the prior (journal), not evaluated in this process.
    pub replayed: bool,
    /// Seconds since the run started (its interrupted part included).
    pub elapsed: f64,
    /// Why the point was kept as interesting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interesting: Option<String>,
    /// Something the run decided because of this point (fast math dropped...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    Continue,
    Stop,
}

/// Watches a run: journal, progress bar, tests that interrupt.
pub trait Observer {
    fn record(&mut self, _space: &Space, _r: &Record, _best: Option<&Record>) -> Control {
        Control::Continue
    }
    /// What the device is doing (worker steps).
    fn progress(&mut self, _message: &str) {}
}

/// Watches nothing.
pub struct Quiet;
impl Observer for Quiet {}

/// Two observers in turn (a journal and a progress bar); the run stops when either asks.
pub struct Both<'a, 'b>(pub &'a mut dyn Observer, pub &'b mut dyn Observer);

impl Observer for Both<'_, '_> {
    fn record(&mut self, space: &Space, r: &Record, best: Option<&Record>) -> Control {
        let a = self.0.record(space, r, best);
        let b = self.1.record(space, r, best);
        if a == Control::Stop || b == Control::Stop {
            Control::Stop
        } else {
            Control::Continue
        }
    }

    fn progress(&mut self, message: &str) {
        self.0.progress(message);
        self.1.progress(message);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StopReason {
    Evaluations,
    Seconds,
    Target,
    /// Every allowed point was evaluated (or the strategy had nothing left).
    Exhausted,
    /// The strategy kept proposing known points.
    Stalled,
    /// An observer stopped the run.
    Interrupted,
}

impl StopReason {
    pub fn describe(self) -> &'static str {
        match self {
            StopReason::Evaluations => "evaluation budget spent",
            StopReason::Seconds => "time budget spent",
            StopReason::Target => "target reached",
            StopReason::Exhausted => "space exhausted",
            StopReason::Stalled => "the strategy proposed nothing new",
            StopReason::Interrupted => "interrupted",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub records: Vec<Record>,
    /// Index into `records` of the best point.
    pub best: Option<usize>,
    pub stop: StopReason,
    pub evaluations: usize,
    pub replayed: usize,
    pub compile_failures: usize,
    /// Seconds, the interrupted part included.
    pub seconds: f64,
    /// Seconds spent in this process.
    pub seconds_here: f64,
    /// Axis values dropped during the run, with why.
    pub dropped: Vec<String>,
}

impl Summary {
    pub fn best_record(&self) -> Option<&Record> {
        self.best.map(|i| &self.records[i])
    }
}

/// Runs a search.
#[allow(clippy::too_many_arguments)]
pub fn run(
    space: &mut Space,
    strategy: &mut dyn Strategy,
    evaluator: &mut dyn Evaluator,
    guide: Option<&Guide>,
    mut interesting: Interesting,
    settings: &Settings,
    prior: Prior,
    observer: &mut dyn Observer,
) -> Summary {
    let start = Instant::now();
    let elapsed = |s: &Instant| prior.elapsed + s.elapsed().as_secs_f64();
    let pool = evaluator
        .compiler()
        .map(|c| CompilePool::new(c, settings.compile_threads, settings.compile_ahead));
    let mut history = History::default();
    let mut records: Vec<Record> = Vec::new();
    let mut record_of: HashMap<usize, usize> = HashMap::new();
    let mut dropped: Vec<String> = Vec::new();
    let mut replayed = 0;
    let mut compile_failures = 0;
    let mut stalls = 0;
    let mut round = 0;
    let budget = &settings.budget;
    let stop = 'run: loop {
        if let Some(n) = budget.evaluations {
            if history.len() >= n {
                break StopReason::Evaluations;
            }
        }
        if let Some(s) = budget.seconds {
            if elapsed(&start) >= s {
                break StopReason::Seconds;
            }
        }
        interesting.expire(round);
        let live = interesting.live();
        let batch = {
            let cx = Context {
                space,
                history: &history,
                guide,
                interesting: &live,
                round,
            };
            strategy.ask(&cx)
        };
        if batch.is_empty() {
            break StopReason::Exhausted;
        }
        let mut seen = HashSet::new();
        let batch: Vec<usize> = batch
            .into_iter()
            .filter(|id| seen.insert(*id) && *id < space.len())
            .collect();
        let fresh: Vec<usize> = batch
            .iter()
            .copied()
            .filter(|id| !history.contains(*id) && space.allowed(*id))
            .collect();
        if fresh.is_empty() {
            // Known points only: tell them again, and give up if this goes on.
            for id in &batch {
                if let Some(o) = history.get(*id).cloned() {
                    let cx = Context {
                        space,
                        history: &history,
                        guide,
                        interesting: &live,
                        round,
                    };
                    strategy.tell(&cx, *id, &o);
                }
            }
            stalls += 1;
            if stalls > 1000 {
                break StopReason::Stalled;
            }
            round += 1;
            continue;
        }
        stalls = 0;
        if let Some(pool) = &pool {
            let needed: Vec<PointSpec> = fresh
                .iter()
                .filter(|id| !prior.outcomes.contains_key(id))
                .map(|id| PointSpec::of(space, *id))
                .collect();
            pool.want(&needed);
            let cx = Context {
                space,
                history: &history,
                guide,
                interesting: &live,
                round,
            };
            // The batch first (so that its compiled points are kept), then what the
            // strategy may ask next, then the rest of the space in canonical order.
            let mut ahead: Vec<usize> = fresh.clone();
            ahead.extend(
                strategy
                    .lookahead(&cx, settings.compile_ahead)
                    .into_iter()
                    .filter(|id| !fresh.contains(id)),
            );
            let listed: HashSet<usize> = ahead.iter().copied().collect();
            ahead.extend(
                (0..space.len())
                    .filter(|id| cx.fresh(*id) && !listed.contains(id))
                    .take(settings.compile_ahead),
            );
            ahead.retain(|id| !prior.outcomes.contains_key(id));
            ahead.truncate(settings.compile_ahead.max(fresh.len()));
            pool.speculate(
                ahead
                    .into_iter()
                    .map(|id| PointSpec::of(space, id))
                    .collect(),
            );
        }
        for id in fresh {
            if let Some(n) = budget.evaluations {
                if history.len() >= n {
                    break 'run StopReason::Evaluations;
                }
            }
            if let Some(s) = budget.seconds {
                if elapsed(&start) >= s {
                    break 'run StopReason::Seconds;
                }
            }
            if !space.allowed(id) {
                // Banned by an earlier point of this batch.
                continue;
            }
            let spec = PointSpec::of(space, id);
            let (outcome, was_replayed) = match prior.outcomes.get(&id) {
                Some(o) => (o.clone(), true),
                None => {
                    let compiled = pool.as_ref().map(|p| p.take(&spec));
                    let o = match &compiled {
                        Some(Compiled::Failed { log, seconds }) => {
                            let mut o =
                                PointOutcome::failed(Status::CompileFailed, "compile", log.clone());
                            o.compile_seconds = *seconds;
                            o
                        }
                        _ => {
                            let t = Instant::now();
                            let mut o = evaluator
                                .evaluate(&spec, compiled.as_ref(), &mut |m| observer.progress(m));
                            if o.seconds == 0.0 {
                                o.seconds = t.elapsed().as_secs_f64();
                            }
                            if let Some(c) = &compiled {
                                o.compile_seconds = c.seconds();
                                if let Compiled::Ok { metrics, .. } = c {
                                    for (k, v) in metrics {
                                        o.metrics.entry(k.clone()).or_insert(*v);
                                    }
                                }
                            }
                            o
                        }
                    };
                    (o, false)
                }
            };
            if was_replayed {
                replayed += 1;
            }
            if outcome.status == Status::CompileFailed {
                compile_failures += 1;
            }
            let before = history.best().and_then(|b| {
                let o = history.get(b)?;
                Some((o.cost?, o.metrics.clone()))
            });
            let why = interesting.observe(
                round,
                id,
                outcome.cost,
                &outcome.metrics,
                before.as_ref().map(|(c, m)| (*c, m)),
            );
            // Fast math that breaks the tolerance is dropped for the rest of the run.
            let mut note = None;
            if outcome.broke_tolerance() {
                if let Some(a) = space.axes.iter().position(|a| a.kind == AxisKind::FastMath) {
                    if space.point(id).0[a] == 1 {
                        space.ban(a, 1);
                        let n = format!(
                            "--use_fast_math dropped: `{}` failed the tolerance with it ({})",
                            spec.label,
                            outcome.failure.as_deref().unwrap_or("numerics")
                        );
                        dropped.push(n.clone());
                        note = Some(n);
                    }
                }
            }
            history.insert(space, id, outcome.clone());
            if note.is_some() {
                history.recompute_best(space);
            }
            records.push(Record {
                seq: records.len() + 1,
                round,
                id,
                label: spec.label.clone(),
                values: space.values(id),
                outcome: outcome.clone(),
                replayed: was_replayed,
                elapsed: elapsed(&start),
                interesting: why,
                note,
            });
            record_of.insert(id, records.len() - 1);
            let best = history
                .best()
                .and_then(|b| record_of.get(&b))
                .map(|i| &records[*i]);
            let control = observer.record(space, records.last().expect("pushed"), best);
            {
                let cx = Context {
                    space,
                    history: &history,
                    guide,
                    interesting: &live,
                    round,
                };
                strategy.tell(&cx, id, &outcome);
            }
            if control == Control::Stop {
                break 'run StopReason::Interrupted;
            }
            if let (Some(t), Some(b)) = (
                budget.target_cost,
                history.best().and_then(|b| history.cost(b)),
            ) {
                if b <= t {
                    break 'run StopReason::Target;
                }
            }
        }
        round += 1;
    };
    let best = history.best().and_then(|b| record_of.get(&b)).copied();
    Summary {
        evaluations: records.len(),
        records,
        best,
        stop,
        replayed,
        compile_failures,
        seconds: elapsed(&start),
        seconds_here: start.elapsed().as_secs_f64(),
        dropped,
    }
}
