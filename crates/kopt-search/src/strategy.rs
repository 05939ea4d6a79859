//! Search strategies. Each proposes points through [`Strategy::ask`] and learns their
//! outcomes through [`Strategy::tell`]; given the same seed and the same outcomes it
//! proposes the same points in the same order (no clock, no hash-map iteration order,
//! no thread timing reaches a decision). Budgets are the driver's ([`crate::run`]).
//!
//! - [`Exhaustive`]: every valid point once, in canonical order, or in the guide's
//!   order (best-matching points first) when seeded. For small spaces.
//! - [`Random`]: sampling without replacement; seeded, the guide's starting points come
//!   first and then half the draws follow the guide's per-axis preferences.
//! - [`HillClimb`]: first-improvement hill climbing over variable neighbourhoods (one
//!   axis one step; one axis any value; two axes one step each), restarting at a local
//!   optimum from an interesting point, a starting point, or a random unevaluated one.
//!   Seeded, it starts at the guide's starting points and tries moves towards preferred
//!   values first.
//! - [`Evolution`]: a (mu + lambda) genetic algorithm: tournament selection, uniform
//!   crossover, step or reset mutation, duplicates repaired to unevaluated points.
//!   Seeded, the first population holds the starting points and mutation leans to
//!   preferred values. Interesting points join the parents while they live.

use std::collections::BTreeSet;

use crate::rng::Rng;
use crate::run::{History, PointOutcome};
use crate::seed::Guide;
use crate::space::{Point, Space};

/// What a strategy sees when it proposes.
pub struct Context<'a> {
    pub space: &'a Space,
    pub history: &'a History,
    pub guide: Option<&'a Guide>,
    /// Interesting points alive in this round.
    pub interesting: &'a [usize],
    pub round: usize,
}

impl Context<'_> {
    /// Allowed (valid, not banned) and not evaluated yet.
    pub fn fresh(&self, id: usize) -> bool {
        self.space.allowed(id) && !self.history.contains(id)
    }
}

pub trait Strategy {
    fn name(&self) -> &'static str;
    /// The next points to evaluate, in order; empty when the strategy has nothing left.
    fn ask(&mut self, cx: &Context<'_>) -> Vec<usize>;
    /// An evaluated point (asked for, or already known to the run).
    fn tell(&mut self, _cx: &Context<'_>, _id: usize, _outcome: &PointOutcome) {}
    /// Points it may ask for soon, for the compile pool to prepare ahead.
    fn lookahead(&self, _cx: &Context<'_>, _n: usize) -> Vec<usize> {
        Vec::new()
    }
}

pub use kopt_spec::search_bench::StrategyKind;

/// Builds the strategy a [`StrategyKind`] names (the kind itself is a name in files and
/// command lines, so it lives with the file formats in `kopt-spec`).
pub trait MakeStrategy {
    /// A fresh strategy of this kind under `seed`.
    fn make(self, seed: u64) -> Box<dyn Strategy>;
}

impl MakeStrategy for StrategyKind {
    fn make(self, seed: u64) -> Box<dyn Strategy> {
        match self {
            StrategyKind::Exhaustive => Box::new(Exhaustive::new()),
            StrategyKind::Random => Box::new(Random::new(seed)),
            StrategyKind::Hill => Box::new(HillClimb::new(seed)),
            StrategyKind::Evolution => Box::new(Evolution::new(seed)),
        }
    }
}

/// The guide's order of the whole space: starting points, then by descending score.
fn guided_order(cx: &Context<'_>, g: &Guide) -> Vec<usize> {
    let mut order: Vec<usize> = g.starts.clone();
    let mut rest: Vec<(f64, usize)> = (0..cx.space.len())
        .filter(|i| !g.starts.contains(i))
        .map(|i| (g.score(cx.space, i), i))
        .collect();
    rest.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    order.extend(rest.into_iter().map(|(_, i)| i));
    order
}

// ---------------------------------------------------------------------------------------

/// Every point, once.
pub struct Exhaustive {
    order: Option<Vec<usize>>,
    next: usize,
}

impl Exhaustive {
    pub fn new() -> Self {
        Exhaustive {
            order: None,
            next: 0,
        }
    }
}

impl Default for Exhaustive {
    fn default() -> Self {
        Self::new()
    }
}

impl Strategy for Exhaustive {
    fn name(&self) -> &'static str {
        "exhaustive"
    }

    fn ask(&mut self, cx: &Context<'_>) -> Vec<usize> {
        let order = self.order.get_or_insert_with(|| match cx.guide {
            Some(g) => guided_order(cx, g),
            None => (0..cx.space.len()).collect(),
        });
        let mut out = Vec::new();
        while self.next < order.len() && out.len() < 16 {
            let id = order[self.next];
            self.next += 1;
            if cx.fresh(id) {
                out.push(id);
            }
        }
        out
    }

    fn lookahead(&self, cx: &Context<'_>, n: usize) -> Vec<usize> {
        match &self.order {
            Some(o) => o[self.next.min(o.len())..]
                .iter()
                .copied()
                .filter(|i| cx.fresh(*i))
                .take(n)
                .collect(),
            None => Vec::new(),
        }
    }
}

// ---------------------------------------------------------------------------------------

/// Draws an unevaluated point following the guide's per-axis preferences: each axis's
/// value is drawn with weight `0.05 + preference`, then the combination is moved to the
/// nearest valid point; `None` when that point is not fresh.
fn guided_draw(cx: &Context<'_>, g: &Guide, rng: &mut Rng) -> Option<usize> {
    let p: Vec<u16> = cx
        .space
        .axes
        .iter()
        .enumerate()
        .map(|(a, axis)| {
            let w: Vec<f64> = (0..axis.values.len())
                .map(|v| 0.05 + g.weight(a, v))
                .collect();
            rng.weighted(&w) as u16
        })
        .collect();
    let id = cx.space.nearest(&Point(p));
    cx.fresh(id).then_some(id)
}

/// A random fresh neighbour of `id` (one axis moved), if it has one.
fn random_neighbour(cx: &Context<'_>, id: usize, rng: &mut Rng) -> Option<usize> {
    let n: Vec<usize> = cx
        .space
        .neighbours(id, usize::MAX)
        .into_iter()
        .filter(|i| cx.fresh(*i))
        .collect();
    (!n.is_empty()).then(|| n[rng.below(n.len())])
}

/// Sampling without replacement.
pub struct Random {
    rng: Rng,
    perm: Option<Vec<usize>>,
    next: usize,
    starts_done: bool,
}

impl Random {
    pub fn new(seed: u64) -> Self {
        Random {
            rng: Rng::derive(seed, "random"),
            perm: None,
            next: 0,
            starts_done: false,
        }
    }

    fn uniform(&mut self, cx: &Context<'_>) -> Option<usize> {
        let rng = &mut self.rng;
        let perm = self.perm.get_or_insert_with(|| {
            let mut p: Vec<usize> = (0..cx.space.len()).collect();
            rng.shuffle(&mut p);
            p
        });
        while self.next < perm.len() {
            let id = perm[self.next];
            self.next += 1;
            if cx.fresh(id) {
                return Some(id);
            }
        }
        None
    }
}

impl Strategy for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn ask(&mut self, cx: &Context<'_>) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::new();
        if !self.starts_done {
            self.starts_done = true;
            if let Some(g) = cx.guide {
                out.extend(g.starts.iter().copied().filter(|i| cx.fresh(*i)));
                if !out.is_empty() {
                    return out;
                }
            }
        }
        while out.len() < 8 {
            let mut pick = None;
            if !cx.interesting.is_empty() && self.rng.chance(0.3) {
                let from = cx.interesting[self.rng.below(cx.interesting.len())];
                pick = random_neighbour(cx, from, &mut self.rng);
            }
            if pick.is_none() {
                if let Some(g) = cx.guide {
                    if self.rng.chance(0.5) {
                        pick = guided_draw(cx, g, &mut self.rng);
                    }
                }
            }
            let pick = match pick.filter(|p| !out.contains(p)) {
                Some(p) => Some(p),
                None => self.uniform(cx),
            };
            match pick {
                Some(p) if !out.contains(&p) => out.push(p),
                Some(_) => {}
                None => break,
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------------------

/// First-improvement hill climbing over variable neighbourhoods, with restarts.
pub struct HillClimb {
    rng: Rng,
    current: Option<usize>,
    /// Neighbourhood level: 1 (one axis, one step), 2 (one axis, any value), 3 (two
    /// axes, one step each).
    level: u8,
    queue: Vec<usize>,
    /// Starting points not used yet.
    starts: Option<Vec<usize>>,
    /// Interesting points already restarted from.
    restarted: BTreeSet<usize>,
    perm: Option<Vec<usize>>,
    next: usize,
    /// Neighbours of interesting points (with the point they came from), explored while
    /// that point lives, in turn with the climb.
    side: Vec<(usize, usize)>,
    explored: BTreeSet<usize>,
    side_turn: bool,
}

impl HillClimb {
    pub fn new(seed: u64) -> Self {
        HillClimb {
            rng: Rng::derive(seed, "hill"),
            current: None,
            level: 1,
            queue: Vec::new(),
            starts: None,
            restarted: BTreeSet::new(),
            perm: None,
            next: 0,
            side: Vec::new(),
            explored: BTreeSet::new(),
            side_turn: false,
        }
    }

    /// Moves towards the guide's preferred values first (ties in the space's order), or
    /// in a random order without a guide.
    fn order(&mut self, cx: &Context<'_>, mut n: Vec<usize>) -> Vec<usize> {
        n.retain(|i| cx.space.allowed(*i));
        match cx.guide {
            Some(g) => {
                let mut scored: Vec<(f64, usize)> =
                    n.into_iter().map(|i| (g.score(cx.space, i), i)).collect();
                scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                scored.into_iter().map(|(_, i)| i).collect()
            }
            None => {
                self.rng.shuffle(&mut n);
                n
            }
        }
    }

    /// Every other call, the next neighbour of the first live interesting point (the
    /// strongest) that has one left.
    fn side_step(&mut self, cx: &Context<'_>) -> Option<usize> {
        for &i in cx.interesting {
            if self.explored.insert(i) {
                let n = self.order(cx, cx.space.neighbours(i, usize::MAX));
                self.side.extend(n.into_iter().map(|x| (i, x)));
            }
        }
        self.side
            .retain(|(from, x)| cx.interesting.contains(from) && cx.fresh(*x));
        self.side_turn = !self.side_turn;
        if !self.side_turn {
            return None;
        }
        for &i in cx.interesting {
            if let Some(k) = self.side.iter().position(|(from, _)| *from == i) {
                return Some(self.side.remove(k).1);
            }
        }
        None
    }

    fn neighbourhood(&mut self, cx: &Context<'_>, id: usize) -> Vec<usize> {
        let n: Vec<usize> = match self.level {
            1 => cx.space.neighbours(id, 1),
            2 => cx
                .space
                .neighbours(id, usize::MAX)
                .into_iter()
                .filter(|i| !cx.space.neighbours(id, 1).contains(i))
                .collect(),
            _ => cx.space.pair_neighbours(id),
        };
        self.order(cx, n)
    }

    /// Where to climb from next.
    fn restart(&mut self, cx: &Context<'_>) -> Option<usize> {
        let starts = self
            .starts
            .get_or_insert_with(|| cx.guide.map(|g| g.starts.clone()).unwrap_or_default());
        while !starts.is_empty() {
            let s = starts.remove(0);
            if cx.space.allowed(s) {
                return Some(s);
            }
        }
        if let Some(&i) = cx
            .interesting
            .iter()
            .find(|i| !self.restarted.contains(i) && Some(**i) != self.current)
        {
            self.restarted.insert(i);
            return Some(i);
        }
        let rng = &mut self.rng;
        let perm = self.perm.get_or_insert_with(|| {
            let mut p: Vec<usize> = (0..cx.space.len()).collect();
            rng.shuffle(&mut p);
            p
        });
        while self.next < perm.len() {
            let id = perm[self.next];
            self.next += 1;
            if cx.fresh(id) {
                return Some(id);
            }
        }
        None
    }
}

impl Strategy for HillClimb {
    fn name(&self) -> &'static str {
        "hill"
    }

    fn ask(&mut self, cx: &Context<'_>) -> Vec<usize> {
        loop {
            let Some(cur) = self.current else {
                let Some(s) = self.restart(cx) else {
                    return Vec::new();
                };
                self.current = Some(s);
                self.level = 1;
                self.queue = self.neighbourhood(cx, s);
                if cx.fresh(s) {
                    return vec![s];
                }
                continue;
            };
            // A current point that failed cannot be climbed from.
            if cx.history.get(cur).is_some_and(|o| o.cost.is_none()) {
                self.current = None;
                continue;
            }
            if !cx.history.contains(cur) {
                if !cx.space.allowed(cur) {
                    // Banned before it was evaluated.
                    self.current = None;
                    continue;
                }
                // Asked for and not told yet (a budget cut the batch): ask again.
                return vec![cur];
            }
            if let Some(x) = self.side_step(cx) {
                return vec![x];
            }
            while let Some(n) = (!self.queue.is_empty()).then(|| self.queue.remove(0)) {
                if cx.fresh(n) {
                    return vec![n];
                }
                // Known already (a restart point's neighbour, say): it may improve too.
                if improves(cx.history, n, cur) {
                    self.move_to(cx, n);
                    return self.ask(cx);
                }
            }
            if self.level < 3 {
                self.level += 1;
                self.queue = self.neighbourhood(cx, cur);
                continue;
            }
            // A local optimum: restart.
            self.current = None;
        }
    }

    fn tell(&mut self, cx: &Context<'_>, id: usize, _outcome: &PointOutcome) {
        if let Some(cur) = self.current {
            if id != cur && improves(cx.history, id, cur) {
                self.move_to(cx, id);
            }
        }
    }

    fn lookahead(&self, cx: &Context<'_>, n: usize) -> Vec<usize> {
        self.queue
            .iter()
            .copied()
            .filter(|i| cx.fresh(*i))
            .take(n)
            .collect()
    }
}

impl HillClimb {
    fn move_to(&mut self, cx: &Context<'_>, id: usize) {
        self.current = Some(id);
        self.level = 1;
        self.queue = self.neighbourhood(cx, id);
    }
}

/// Whether `a` is evaluated, passed, and cheaper than `b`.
fn improves(h: &History, a: usize, b: usize) -> bool {
    match (h.cost(a), h.cost(b)) {
        (Some(x), Some(y)) => x < y,
        (Some(_), None) => true,
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------

/// A (mu + lambda) genetic algorithm.
pub struct Evolution {
    rng: Rng,
    size: usize,
    population: Vec<usize>,
    /// Children of the current generation, not all told yet.
    children: Vec<usize>,
    started: bool,
}

impl Evolution {
    pub fn new(seed: u64) -> Self {
        Evolution {
            rng: Rng::derive(seed, "evolution"),
            size: 0,
            population: Vec::new(),
            children: Vec::new(),
            started: false,
        }
    }

    fn fresh_random(&mut self, cx: &Context<'_>, taken: &[usize]) -> Option<usize> {
        // Rejection sampling first (cheap on big spaces), then a scan from a random offset.
        for _ in 0..64 {
            let id = self.rng.below(cx.space.len());
            if cx.fresh(id) && !taken.contains(&id) {
                return Some(id);
            }
        }
        let n = cx.space.len();
        let off = self.rng.below(n);
        (0..n)
            .map(|k| (off + k) % n)
            .find(|id| cx.fresh(*id) && !taken.contains(id))
    }

    fn tournament(&mut self, cx: &Context<'_>, pool: &[usize]) -> usize {
        let a = pool[self.rng.below(pool.len())];
        let b = pool[self.rng.below(pool.len())];
        if improves(cx.history, b, a) {
            b
        } else {
            a
        }
    }

    fn child(&mut self, cx: &Context<'_>, pool: &[usize], taken: &[usize]) -> Option<usize> {
        let axes = cx.space.axes.len();
        for _ in 0..20 {
            let pa = cx.space.point(self.tournament(cx, pool)).0.clone();
            let pb = cx.space.point(self.tournament(cx, pool)).0.clone();
            let mut c: Vec<u16> = (0..axes)
                .map(|a| if self.rng.chance(0.5) { pa[a] } else { pb[a] })
                .collect();
            let mut mutated = false;
            for (a, v) in c.iter_mut().enumerate() {
                if self.rng.chance(1.0 / axes as f64) {
                    *v = self.mutate(cx, a, *v);
                    mutated = true;
                }
            }
            if !mutated || c == pa || c == pb {
                let a = self.rng.below(axes);
                c[a] = self.mutate(cx, a, c[a]);
            }
            let id = cx.space.nearest(&Point(c));
            if cx.fresh(id) && !taken.contains(&id) {
                return Some(id);
            }
        }
        self.fresh_random(cx, taken)
    }

    fn mutate(&mut self, cx: &Context<'_>, a: usize, v: u16) -> u16 {
        let n = cx.space.axes[a].values.len();
        if n < 2 {
            return v;
        }
        if let Some(g) = cx.guide {
            if self.rng.chance(0.5) {
                let w: Vec<f64> = (0..n)
                    .map(|i| {
                        if i == v as usize {
                            0.0
                        } else {
                            0.05 + g.weight(a, i)
                        }
                    })
                    .collect();
                return self.rng.weighted(&w) as u16;
            }
        }
        if self.rng.chance(0.7) {
            let up = self.rng.chance(0.5);
            match (up, v as usize) {
                (true, x) if x + 1 < n => (x + 1) as u16,
                (false, x) if x > 0 => (x - 1) as u16,
                (_, x) if x + 1 < n => (x + 1) as u16,
                _ => v - 1,
            }
        } else {
            let mut r = self.rng.below(n - 1) as u16;
            if r >= v {
                r += 1;
            }
            r
        }
    }
}

impl Strategy for Evolution {
    fn name(&self) -> &'static str {
        "evolution"
    }

    fn ask(&mut self, cx: &Context<'_>) -> Vec<usize> {
        if self.size == 0 {
            self.size = (cx.space.len() / 16).clamp(4, 12);
        }
        if !self.children.is_empty() && self.children.iter().any(|c| !cx.history.contains(*c)) {
            // The generation is not told yet: ask for the rest again.
            return self
                .children
                .iter()
                .copied()
                .filter(|c| !cx.history.contains(*c) && cx.space.allowed(*c))
                .collect();
        }
        // Survivors: the best `size` of the population and the last children.
        let mut pool: Vec<usize> = self.population.clone();
        pool.append(&mut self.children);
        pool.sort_by(|a, b| match (cx.history.cost(*a), cx.history.cost(*b)) {
            (Some(x), Some(y)) => x.total_cmp(&y).then(a.cmp(b)),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => a.cmp(b),
        });
        pool.dedup();
        pool.retain(|i| cx.history.cost(*i).is_some() && cx.space.allowed(*i));
        pool.truncate(self.size);
        self.population = pool;
        let mut children: Vec<usize> = Vec::new();
        if !self.started {
            self.started = true;
            if let Some(g) = cx.guide {
                children.extend(g.starts.iter().copied().filter(|i| cx.fresh(*i)));
            }
            while children.len() < self.size {
                let pick = match cx.guide {
                    Some(g) if self.rng.chance(0.5) => {
                        guided_draw(cx, g, &mut self.rng).filter(|i| !children.contains(i))
                    }
                    _ => None,
                };
                match pick.or_else(|| self.fresh_random(cx, &children)) {
                    Some(i) => children.push(i),
                    None => break,
                }
            }
        } else {
            let mut parents = self.population.clone();
            parents.extend(
                cx.interesting
                    .iter()
                    .copied()
                    .filter(|i| cx.history.cost(*i).is_some()),
            );
            if parents.is_empty() {
                // Every evaluated point failed so far: keep sampling.
                while children.len() < self.size {
                    match self.fresh_random(cx, &children) {
                        Some(i) => children.push(i),
                        None => break,
                    }
                }
            } else {
                while children.len() < self.size {
                    match self.child(cx, &parents, &children) {
                        Some(i) => children.push(i),
                        None => break,
                    }
                }
            }
        }
        self.children = children.clone();
        children
    }
}
