//! The bottleneck classification: documented, deterministic rules over the data layer's
//! figures ([`crate::measure`]), and the ranked findings, each with its evidence.
//!
//! # The rules
//!
//! Each class gets a score in `[0, 1]` from the figures that define it; the class is the
//! highest score (ties go to the more specific class, in the order of [`CLASSES`]), and
//! the **margin** is its score minus the runner-up's. `ramp(x, a, b)` is 0 at or below
//! `a`, 1 at or above `b`, linear between. Percentages are of the unit's peak unless said
//! otherwise. `bw` is the highest of DRAM %, L2 %, and the engine's % of copy bandwidth;
//! stall shares are % of warp cycles per issued instruction (ncu's
//! `smsp__average_warps_issue_stalled_*_per_issue_active.ratio` over
//! `smsp__average_warp_latency_per_inst_issued.ratio`); the latency share is long and
//! short scoreboard, wait, barrier, membar and branch resolving together.
//!
//! | class | score | reads as |
//! | --- | --- | --- |
//! | `launch-bound` | `ramp(launch_overhead_pct, 20, 60)`, `launch_overhead_pct = 100 · 1.24 µs / time` | a launch of a few µs is mostly launch cost |
//! | `compute-bound` | `ramp(max(SM %, issue %), 50, 80)`; without ncu `ramp(FLOP %, 50, 80)` | an SM pipe or the issue slots are near their peak |
//! | `memory-bound` | the highest of: **roof** `ramp(bw, 40, 75)`; **waiting** `long-scoreboard share · ramp(achieved occupancy, 25, 50) · ramp(bw, 10, 25)`; **L1** `ramp(L1 %, 50, 80) · (1 − ramp(shared excess wavefronts, 0.5, 2))`; without ncu, **little arithmetic** `0.6 · ramp(copy %, 10, 40) · (1 − ramp(FLOP %, 10, 50))` | bandwidth near the roof, or a full GPU whose warps wait on memory that moves a real share of the roof |
//! | `latency-bound` | the highest of: **parallelism** `ramp(theoretical − achieved occupancy, 10, 40)` (without ncu `ramp(1 − waves, 0.2, 0.8)`); **dependencies** `latency share · (1 − ramp(max(DRAM, L2, SM, issue, copy %), 20, 50))` | too few warps to hide latency, or nothing busy while warps wait |
//! | `occupancy-limited` | `ramp(60 − theoretical occupancy, 0, 30) · ramp(latency share, 30, 60)` (without ncu `· (1 − ramp(bw, 40, 75))`) | registers, shared memory or block size cap the warps, and the kernel needs them to hide latency |
//! | `shared-memory-bank-bound` | `ramp(shared excess wavefronts, 0.5, 2) · max(ramp(short scoreboard + MIO throttle share, 10, 40), ramp(L1 %, 40, 70))` | bank conflicts multiply shared-memory wavefronts and warps wait on them |
//!
//! Below 0.1 for every class the snapshot is `unclassified`. The qualifier names the part
//! that decided (`at the bandwidth roof`, `below the bandwidth roof: warps wait on
//! memory`, `too little parallelism`...).
//!
//! Why these rules: a kernel is bound by a unit when that unit is near its peak (the
//! roofline's reading, with Nsight Compute's usual 60 % mark inside the ramps). When no
//! unit is, what the warps wait on decides: memory (long scoreboard) at a full GPU with
//! the memory system doing a real share of the roof is a memory-bound kernel below its
//! roof (too few bytes in flight, extra passes: the fixes are memory fixes); idle units
//! with too few warps, or warps in dependent chains, is latency.
//!
//! # The findings
//!
//! Findings are the facts worth acting on, each with a weight in `[0, 1]` (how much it
//! bears on the time) and its evidence: the figure's key, the metric or formula it comes
//! from, the value and the threshold. They are ranked by weight (ties in the order below):
//! bandwidth use, memory stalls, extra passes, narrow accesses, uncoalesced accesses,
//! parallelism, occupancy limit, serial loops, barrier stalls, bank conflicts, spills,
//! compute, launch cost, atomics, divergence, idle issue slots.

use serde::{Deserialize, Serialize};

use crate::measure::{describe, Measurements, Source};

/// The classes, most specific first (ties go to the earlier). The same names as
/// `kopt_store::cases::BOTTLENECK_CLASSES`.
pub const CLASSES: [&str; 6] = [
    "shared-memory-bank-bound",
    "occupancy-limited",
    "memory-bound",
    "latency-bound",
    "compute-bound",
    "launch-bound",
];

/// A figure cited as evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// The figure's key ([`crate::measure::KEYS`]).
    pub key: String,
    /// The metric or formula it comes from, as its source names it.
    pub metric: String,
    pub source: Source,
    pub value: f64,
    pub unit: String,
    /// What it is compared with (`>= 40`, `ramp 25..50`).
    pub threshold: String,
}

impl Evidence {
    /// `ncu lts__t_sector_hit_rate.pct = 62.45 % (>= 40)`.
    pub fn render(&self) -> String {
        format!(
            "{} {} = {}{} ({})",
            self.source.name(),
            self.metric,
            fmt_num(self.value),
            if self.unit.is_empty() || self.unit == "x" {
                String::new()
            } else {
                format!(" {}", self.unit)
            },
            self.threshold
        )
    }
}

/// One way a class's score was reached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Part {
    pub name: String,
    pub score: f64,
    pub formula: String,
    pub evidence: Vec<Evidence>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassScore {
    pub class: String,
    pub score: f64,
    /// Its parts, the deciding (highest) first.
    pub parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Classification {
    /// One of [`CLASSES`], or `unclassified`.
    pub class: String,
    /// What decided, in words.
    pub qualifier: String,
    pub score: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_up: Option<String>,
    /// Score minus the runner-up's.
    pub margin: f64,
    /// Every class, highest first.
    pub scores: Vec<ClassScore>,
}

impl Classification {
    /// `memory-bound (below the bandwidth roof: warps wait on memory)`.
    pub fn label(&self) -> String {
        if self.qualifier.is_empty() {
            self.class.clone()
        } else {
            format!("{} ({})", self.class, self.qualifier)
        }
    }

    /// The evidence of the deciding part.
    pub fn evidence(&self) -> &[Evidence] {
        self.scores
            .first()
            .and_then(|s| s.parts.first())
            .map_or(&[], |p| p.evidence.as_slice())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub rank: usize,
    pub id: String,
    pub claim: String,
    pub weight: f64,
    pub evidence: Vec<Evidence>,
}

pub fn ramp(x: f64, lo: f64, hi: f64) -> f64 {
    ((x - lo) / (hi - lo)).clamp(0.0, 1.0)
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// A number for people: integers as they are, else two decimals (one from 100 up, more
/// below 0.01).
pub fn fmt_num(x: f64) -> String {
    if x == x.trunc() && x.abs() < 1e15 {
        format!("{x:.0}")
    } else if x.abs() >= 100.0 {
        format!("{x:.1}")
    } else if x.abs() >= 0.01 {
        format!("{x:.2}")
    } else {
        format!("{x:.4}")
    }
}

struct Ctx<'a> {
    m: &'a Measurements,
}

impl Ctx<'_> {
    fn get(&self, key: &str) -> Option<f64> {
        self.m.get(key).map(|m| m.value)
    }
    fn ev(&self, key: &str, threshold: &str) -> Option<Evidence> {
        let m = self.m.get(key)?;
        Some(Evidence {
            key: key.to_string(),
            metric: m.from.clone(),
            source: m.source,
            value: round2(m.value),
            unit: m.unit.clone(),
            threshold: threshold.to_string(),
        })
    }
    fn evs(&self, items: &[(&str, &str)]) -> Vec<Evidence> {
        items.iter().filter_map(|(k, t)| self.ev(k, t)).collect()
    }
    /// The highest of the keys that are present.
    fn max_of(&self, keys: &[&str]) -> Option<f64> {
        keys.iter().filter_map(|k| self.get(k)).reduce(f64::max)
    }
    fn latency_share(&self) -> Option<(f64, Vec<Evidence>)> {
        let keys = [
            "stall_long_scoreboard_pct",
            "stall_short_scoreboard_pct",
            "stall_wait_pct",
            "stall_barrier_pct",
            "stall_membar_pct",
            "stall_branch_resolving_pct",
        ];
        let present: Vec<&str> = keys
            .iter()
            .copied()
            .filter(|k| self.get(k).is_some())
            .collect();
        if present.is_empty() {
            return None;
        }
        let sum: f64 = present.iter().filter_map(|k| self.get(k)).sum();
        Some((
            sum.min(100.0),
            present
                .iter()
                .filter_map(|k| self.ev(k, "part of the latency share"))
                .collect(),
        ))
    }
}

fn part(name: &str, score: f64, formula: String, evidence: Vec<Evidence>) -> Part {
    Part {
        name: name.to_string(),
        score: round2(score),
        formula,
        evidence,
    }
}

/// Classifies from the figures; `None` when there is no measurement at all (no time, no
/// hardware counter).
pub fn classify(m: &Measurements) -> Option<Classification> {
    let c = Ctx { m };
    let measured = ["duration_us", "dram_pct", "copy_bw_pct", "sm_sol_pct"]
        .iter()
        .any(|k| c.get(k).is_some());
    if !measured {
        return None;
    }
    let has_ncu = c.get("sm_sol_pct").is_some();
    let bw = c.max_of(&["dram_pct", "l2_pct", "copy_bw_pct"]);
    let bw_evidence = |t: &str| c.evs(&[("dram_pct", t), ("l2_pct", t), ("copy_bw_pct", t)]);
    let latency = c.latency_share();
    let mut scores: Vec<ClassScore> = Vec::new();

    // launch-bound
    {
        let mut parts = vec![];
        if let Some(o) = c.get("launch_overhead_pct") {
            parts.push(part(
                "launch cost",
                ramp(o, 20.0, 60.0),
                "ramp(launch_overhead_pct, 20, 60)".into(),
                c.evs(&[
                    ("launch_overhead_pct", "ramp 20..60"),
                    ("duration_us", "the time per launch"),
                ]),
            ));
        }
        scores.push(score("launch-bound", parts));
    }
    // compute-bound
    {
        let mut parts = vec![];
        if let Some(v) = c.max_of(&["sm_sol_pct", "issue_pct"]) {
            parts.push(part(
                "SM near its peak",
                ramp(v, 50.0, 80.0),
                "ramp(max(sm_sol_pct, issue_pct), 50, 80)".into(),
                c.evs(&[("sm_sol_pct", "ramp 50..80"), ("issue_pct", "ramp 50..80")]),
            ));
        } else if let Some(f) = c.get("flops_pct") {
            parts.push(part(
                "FLOP rate near the peak",
                ramp(f, 50.0, 80.0),
                "ramp(flops_pct, 50, 80)".into(),
                c.evs(&[("flops_pct", "ramp 50..80")]),
            ));
        }
        scores.push(score("compute-bound", parts));
    }
    // memory-bound
    {
        let mut parts = vec![];
        if let Some(b) = bw {
            parts.push(part(
                "at the bandwidth roof",
                ramp(b, 40.0, 75.0),
                "ramp(max(dram_pct, l2_pct, copy_bw_pct), 40, 75)".into(),
                bw_evidence("ramp 40..75 on the highest"),
            ));
        }
        if let (Some(ls), Some(occ), Some(b)) = (
            c.get("stall_long_scoreboard_pct"),
            c.get("occupancy_achieved_pct"),
            bw,
        ) {
            let mut ev = c.evs(&[
                ("stall_long_scoreboard_pct", "share, the higher the more"),
                ("occupancy_achieved_pct", "ramp 25..50"),
            ]);
            ev.extend(bw_evidence("ramp 10..25 on the highest"));
            parts.push(part(
                "below the bandwidth roof: warps wait on memory",
                ls / 100.0 * ramp(occ, 25.0, 50.0) * ramp(b, 10.0, 25.0),
                "stall_long_scoreboard_pct/100 * ramp(occupancy_achieved_pct, 25, 50) * ramp(bw, 10, 25)".into(),
                ev,
            ));
        }
        if !has_ncu {
            // Without counters: little arithmetic per byte and a real share of the roof.
            if let (Some(copy), Some(flops)) = (c.get("copy_bw_pct"), c.get("flops_pct")) {
                parts.push(part(
                    "below the bandwidth roof, little arithmetic (no counters to say why)",
                    0.6 * ramp(copy, 10.0, 40.0) * (1.0 - ramp(flops, 10.0, 50.0)),
                    "0.6 * ramp(copy_bw_pct, 10, 40) * (1 - ramp(flops_pct, 10, 50))".into(),
                    c.evs(&[
                        ("copy_bw_pct", "ramp 10..40"),
                        ("flops_pct", "1 - ramp 10..50"),
                    ]),
                ));
            }
        }
        if let Some(l1) = c.get("l1_pct") {
            let bank = c.get("shared_excess_wavefronts").unwrap_or(0.0);
            let mut ev = c.evs(&[("l1_pct", "ramp 50..80")]);
            ev.extend(c.evs(&[
                ("global_sectors_excess", "global traffic the L1 serves"),
                (
                    "shared_excess_wavefronts",
                    "1 - ramp 0.5..2 (bank conflicts are their own class)",
                ),
            ]));
            parts.push(part(
                "L1 throughput",
                ramp(l1, 50.0, 80.0) * (1.0 - ramp(bank, 0.5, 2.0)),
                "ramp(l1_pct, 50, 80) * (1 - ramp(shared_excess_wavefronts, 0.5, 2))".into(),
                ev,
            ));
        }
        scores.push(score("memory-bound", parts));
    }
    // latency-bound
    {
        let mut parts = vec![];
        if let (Some(theo), Some(ach)) = (
            c.get("occupancy_theoretical_pct"),
            c.get("occupancy_achieved_pct"),
        ) {
            parts.push(part(
                "too little parallelism",
                ramp(theo - ach, 10.0, 40.0),
                "ramp(occupancy_theoretical_pct - occupancy_achieved_pct, 10, 40)".into(),
                c.evs(&[
                    (
                        "occupancy_achieved_pct",
                        "ramp 10..40 below the theoretical",
                    ),
                    ("occupancy_theoretical_pct", "what the launch allows"),
                    ("waves", "< 1: the grid does not fill the GPU once"),
                    ("blocks", "blocks in the grid"),
                ]),
            ));
        } else if let Some(w) = c.get("waves") {
            parts.push(part(
                "too little parallelism",
                ramp(1.0 - w, 0.2, 0.8),
                "ramp(1 - waves, 0.2, 0.8)".into(),
                c.evs(&[
                    ("waves", "ramp 0.8..0.2 (fewer is worse)"),
                    ("blocks", "blocks in the grid"),
                ]),
            ));
        }
        if let Some((share, mut ev)) = latency.clone() {
            if let Some(busy) = c.max_of(&[
                "dram_pct",
                "l2_pct",
                "sm_sol_pct",
                "issue_pct",
                "copy_bw_pct",
            ]) {
                ev.extend(c.evs(&[
                    ("dram_pct", "1 - ramp 20..50 on the busiest unit"),
                    ("l2_pct", "1 - ramp 20..50 on the busiest unit"),
                    ("sm_sol_pct", "1 - ramp 20..50 on the busiest unit"),
                    ("issue_pct", "1 - ramp 20..50 on the busiest unit"),
                    ("copy_bw_pct", "1 - ramp 20..50 on the busiest unit"),
                ]));
                parts.push(part(
                    "dependent instructions, nothing busy",
                    share / 100.0 * (1.0 - ramp(busy, 20.0, 50.0)),
                    "latency_share/100 * (1 - ramp(max(dram, l2, sm, issue, copy %), 20, 50))"
                        .into(),
                    ev,
                ));
            }
        }
        scores.push(score("latency-bound", parts));
    }
    // occupancy-limited
    {
        let mut parts = vec![];
        if let Some(theo) = c.get("occupancy_theoretical_pct") {
            let limit = ramp(60.0 - theo, 0.0, 30.0);
            let mut ev = c.evs(&[
                ("occupancy_theoretical_pct", "ramp 60..30 (lower is worse)"),
                ("occupancy_limit_registers", "blocks per SM"),
                ("occupancy_limit_shared_mem", "blocks per SM"),
                ("occupancy_limit_warps", "blocks per SM"),
                ("registers", "per thread"),
            ]);
            if let Some((share, lev)) = latency.clone() {
                ev.extend(lev);
                parts.push(part(
                    "the launch caps the warps",
                    limit * ramp(share, 30.0, 60.0),
                    "ramp(60 - occupancy_theoretical_pct, 0, 30) * ramp(latency_share, 30, 60)"
                        .into(),
                    ev,
                ));
            } else if !has_ncu {
                let b = bw.unwrap_or(0.0);
                ev.extend(bw_evidence("1 - ramp 40..75"));
                parts.push(part(
                    "the launch caps the warps",
                    limit * (1.0 - ramp(b, 40.0, 75.0)),
                    "ramp(60 - occupancy_theoretical_pct, 0, 30) * (1 - ramp(bw, 40, 75))".into(),
                    ev,
                ));
            }
        }
        scores.push(score("occupancy-limited", parts));
    }
    // shared-memory-bank-bound
    {
        let mut parts = vec![];
        if let Some(x) = c.get("shared_excess_wavefronts") {
            let mio = c.get("stall_short_scoreboard_pct").unwrap_or(0.0)
                + c.get("stall_mio_throttle_pct").unwrap_or(0.0);
            let l1 = c.get("l1_pct").unwrap_or(0.0);
            parts.push(part(
                "bank conflicts",
                ramp(x, 0.5, 2.0) * ramp(mio, 10.0, 40.0).max(ramp(l1, 40.0, 70.0)),
                "ramp(shared_excess_wavefronts, 0.5, 2) * max(ramp(short scoreboard + MIO throttle share, 10, 40), ramp(l1_pct, 40, 70))".into(),
                c.evs(&[
                    ("shared_excess_wavefronts", "ramp 0.5..2"),
                    ("stall_short_scoreboard_pct", "with MIO throttle: ramp 10..40"),
                    ("stall_mio_throttle_pct", "with short scoreboard: ramp 10..40"),
                    ("l1_pct", "ramp 40..70"),
                ]),
            ));
        }
        scores.push(score("shared-memory-bank-bound", parts));
    }

    let order = |c: &str| {
        CLASSES
            .iter()
            .position(|x| *x == c)
            .unwrap_or(CLASSES.len())
    };
    scores.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(order(&a.class).cmp(&order(&b.class)))
    });
    let top = &scores[0];
    let second = scores.get(1);
    let (class, qualifier) = if top.score < 0.1 {
        (
            "unclassified".to_string(),
            "no rule fits the measurements".to_string(),
        )
    } else {
        (
            top.class.clone(),
            qualifier(&top.class, top.parts.first(), &c),
        )
    };
    Some(Classification {
        class,
        qualifier,
        score: top.score,
        runner_up: second.filter(|s| s.score > 0.0).map(|s| s.class.clone()),
        margin: round2(top.score - second.map_or(0.0, |s| s.score)),
        scores,
    })
}

fn score(class: &str, mut parts: Vec<Part>) -> ClassScore {
    parts.sort_by(|a, b| b.score.total_cmp(&a.score));
    ClassScore {
        class: class.to_string(),
        score: parts.first().map_or(0.0, |p| p.score),
        parts,
    }
}

fn qualifier(class: &str, part: Option<&Part>, c: &Ctx) -> String {
    let pct = |k: &str| c.get(k).map(|v| format!("{v:.0}%"));
    let name = part.map(|p| p.name.as_str()).unwrap_or("");
    match (class, name) {
        ("memory-bound", "at the bandwidth roof") => {
            let mut v = vec![];
            if let Some(d) = pct("dram_pct") {
                v.push(format!("DRAM {d}"));
            }
            if let Some(l) = pct("l2_pct") {
                v.push(format!("L2 {l}"));
            }
            if let Some(x) = pct("copy_bw_pct") {
                v.push(format!("{x} of copy bandwidth"));
            }
            format!("at the bandwidth roof: {}", v.join(", "))
        }
        ("memory-bound", "below the bandwidth roof: warps wait on memory") => format!(
            "below the bandwidth roof: {} of warp cycles wait on memory{}",
            pct("stall_long_scoreboard_pct").unwrap_or_default(),
            pct("copy_bw_pct")
                .map(|x| format!(", {x} of copy bandwidth"))
                .unwrap_or_default()
        ),
        ("memory-bound", "L1 throughput") => format!("L1 at {}", pct("l1_pct").unwrap_or_default()),
        ("memory-bound", _) => format!(
            "below the bandwidth roof at {} of copy bandwidth, {} of the FLOP peak; without ncu the reason is not measured",
            pct("copy_bw_pct").unwrap_or_default(),
            c.get("flops_pct").map(|f| format!("{f:.1}%")).unwrap_or_default()
        ),
        ("latency-bound", "too little parallelism") => {
            let mut s = "too little parallelism".to_string();
            if let Some(w) = c.get("waves") {
                s.push_str(&format!(": {} waves", fmt_num(round2(w))));
            }
            if let (Some(a), Some(t)) = (
                c.get("occupancy_achieved_pct"),
                c.get("occupancy_theoretical_pct"),
            ) {
                s.push_str(&format!(", {a:.0}% achieved occupancy of {t:.0}%"));
            }
            s
        }
        ("latency-bound", _) => "warps wait on dependent instructions while no unit is busy".into(),
        ("compute-bound", _) => format!(
            "SM at {}, issue at {}",
            pct("sm_sol_pct").unwrap_or("?".into()),
            pct("issue_pct").unwrap_or("?".into())
        ),
        ("occupancy-limited", _) => {
            let limiter = occupancy_limiter(c);
            format!(
                "theoretical occupancy {}{}",
                pct("occupancy_theoretical_pct").unwrap_or_default(),
                limiter
                    .map(|l| format!(", limited by {l}"))
                    .unwrap_or_default()
            )
        }
        ("shared-memory-bank-bound", _) => format!(
            "{} extra wavefronts per shared-memory wavefront",
            c.get("shared_excess_wavefronts")
                .map(|x| fmt_num(round2(x)))
                .unwrap_or_default()
        ),
        ("launch-bound", _) => format!(
            "{} µs per launch, about {} of it launch cost",
            c.get("duration_us")
                .map(|d| fmt_num(round2(d)))
                .unwrap_or_default(),
            pct("launch_overhead_pct").unwrap_or_default()
        ),
        _ => String::new(),
    }
}

/// What limits the theoretical occupancy: the smallest of ncu's per-resource limits.
fn occupancy_limiter(c: &Ctx) -> Option<&'static str> {
    let limits = [
        ("occupancy_limit_registers", "registers"),
        ("occupancy_limit_shared_mem", "shared memory"),
        ("occupancy_limit_warps", "the block size"),
        ("occupancy_limit_blocks", "the blocks per SM"),
        ("occupancy_limit_barriers", "barriers"),
    ];
    let min = limits
        .iter()
        .filter_map(|(k, _)| c.get(k))
        .fold(f64::INFINITY, f64::min);
    if !min.is_finite() {
        return None;
    }
    limits
        .iter()
        .find(|(k, _)| c.get(k) == Some(min))
        .map(|(_, n)| *n)
}

/// The ranked findings.
pub fn findings(m: &Measurements) -> Vec<Finding> {
    let c = Ctx { m };
    let mut out: Vec<(String, String, f64, Vec<Evidence>)> = Vec::new();
    let mut add = |id: &str, claim: String, weight: f64, evidence: Vec<Evidence>| {
        if weight > 0.0 && !evidence.is_empty() {
            out.push((
                id.to_string(),
                claim,
                round2(weight.clamp(0.0, 1.0)),
                evidence,
            ));
        }
    };
    let pct = |k: &str| c.get(k).map(|v| format!("{v:.1}%"));
    let bw = c.max_of(&["dram_pct", "l2_pct", "copy_bw_pct"]);

    if let Some(b) = bw {
        let mut parts = vec![];
        if let Some(d) = pct("dram_pct") {
            parts.push(format!("DRAM {d} of peak"));
        }
        if let Some(l) = pct("l2_pct") {
            parts.push(format!("L2 {l}"));
        }
        if let Some(x) = pct("copy_bw_pct") {
            parts.push(format!("{x} of the measured copy bandwidth"));
        }
        let claim = if b >= 60.0 {
            format!("memory bandwidth near the roof: {}", parts.join(", "))
        } else {
            format!("memory bandwidth under-used: {}", parts.join(", "))
        };
        add(
            "bandwidth",
            claim,
            ramp(b, 20.0, 75.0),
            c.evs(&[
                ("dram_pct", ">= 60 is near the roof"),
                ("l2_pct", ">= 60 is near the roof"),
                ("copy_bw_pct", ">= 60 is near the roof"),
            ]),
        );
    }
    if let Some(ls) = c.get("stall_long_scoreboard_pct").filter(|v| *v >= 40.0) {
        add(
            "memory-stalls",
            format!(
                "warps wait on global memory: {ls:.1}% of warp cycles stall on the long scoreboard"
            ),
            ls / 100.0,
            c.evs(&[
                ("stall_long_scoreboard_pct", ">= 40"),
                ("warp_cycles_per_issue", "all states"),
            ]),
        );
    }
    if let Some(p) = c.get("read_passes").filter(|p| *p >= 2.0) {
        let src = m
            .get("read_passes")
            .map(|x| x.from.clone())
            .unwrap_or_default();
        let mut claim = format!("the data is read in {p:.0} passes ({src})");
        if let Some(h) = c.get("l2_hit_pct").filter(|h| *h >= 40.0) {
            claim.push_str(&format!(
                "; the re-reads hit L2 ({h:.1}% hit rate) but still cost L2 bandwidth and latency"
            ));
        }
        add(
            "passes",
            claim,
            0.6 * (p - 1.0) / p,
            c.evs(&[
                ("read_passes", ">= 2"),
                ("l2_hit_pct", ">= 40: re-reads served by L2"),
            ]),
        );
    }
    if let Some(bits) = c.get("global_load_bits").filter(|b| *b < 128.0) {
        let mut claim =
            format!("global loads are {bits:.0}-bit per thread (128-bit is the widest)");
        if let Some(s) = c.get("global_sectors_per_request") {
            claim.push_str(&format!(
                "; {:.2} sectors ({:.0} bytes) per L1 request",
                s,
                s * 32.0
            ));
            if s >= 3.9 {
                claim.push_str(": whole lines, so the cost is more requests and fewer bytes in flight per thread, not wasted bytes");
            } else if s <= 2.5 {
                claim.push_str(": part of a 128-byte line each");
            }
        }
        let memoryish = bw.is_some_and(|b| b < 75.0);
        add(
            "narrow-accesses",
            claim,
            if memoryish {
                0.5 * (1.0 - bits / 128.0)
            } else {
                0.1
            },
            c.evs(&[
                ("global_load_bits", "< 128"),
                (
                    "global_sectors_per_request",
                    "< 4: less than a 128-byte line per request",
                ),
            ]),
        );
    }
    if let Some(x) = c.get("global_sectors_excess").filter(|x| *x >= 1.5) {
        add(
            "uncoalesced",
            format!(
                "global accesses are uncoalesced: {x:.2}x the L2 sectors of coalesced access{}",
                pct("l1_pct")
                    .map(|l| format!("; L1 {l} busy"))
                    .unwrap_or_default()
            ),
            0.9 * ramp(x, 1.5, 8.0),
            c.evs(&[
                ("global_sectors_excess", ">= 1.5"),
                (
                    "global_sectors_per_request",
                    "~1 when each thread hits its own line",
                ),
                ("l1_pct", "L1 work the excess costs"),
            ]),
        );
    }
    let par = match (
        c.get("occupancy_theoretical_pct"),
        c.get("occupancy_achieved_pct"),
    ) {
        (Some(t), Some(a)) => Some(ramp(t - a, 10.0, 40.0)),
        _ => c.get("waves").map(|w| ramp(1.0 - w, 0.2, 0.8)),
    };
    if let Some(p) = par.filter(|p| *p >= 0.25) {
        let mut claim = "too little parallelism".to_string();
        if let (Some(b), Some(w)) = (c.get("blocks"), c.get("waves")) {
            claim.push_str(&format!(": {b:.0} blocks fill {:.2} waves of the GPU", w));
        }
        if let (Some(a), Some(t)) = (
            c.get("occupancy_achieved_pct"),
            c.get("occupancy_theoretical_pct"),
        ) {
            claim.push_str(&format!(
                "; achieved occupancy {a:.1}% of a theoretical {t:.1}%{}",
                occupancy_limiter(&c)
                    .map(|l| format!(" (limited by {l})"))
                    .unwrap_or_default()
            ));
        }
        add(
            "parallelism",
            claim,
            p,
            c.evs(&[
                ("waves", "< 1"),
                ("blocks", "blocks in the grid"),
                ("occupancy_achieved_pct", "10..40 below the theoretical"),
                ("occupancy_theoretical_pct", "what the launch allows"),
                (
                    "occupancy_limit_registers",
                    "blocks per SM the registers allow",
                ),
            ]),
        );
    }
    if let Some(t) = c.get("occupancy_theoretical_pct").filter(|t| *t < 60.0) {
        add(
            "occupancy-limit",
            format!(
                "theoretical occupancy is {t:.1}%{}",
                occupancy_limiter(&c)
                    .map(|l| format!(", limited by {l}"))
                    .unwrap_or_default()
            ),
            0.6 * ramp(60.0 - t, 0.0, 30.0),
            c.evs(&[
                ("occupancy_theoretical_pct", "< 60"),
                ("occupancy_limit_registers", "blocks per SM"),
                ("occupancy_limit_shared_mem", "blocks per SM"),
                ("occupancy_limit_warps", "blocks per SM"),
                ("registers", "per thread"),
            ]),
        );
    }
    if let Some(t) = c.get("serial_loop_trips").filter(|t| *t >= 256.0) {
        let src = m
            .get("serial_loop_trips")
            .map(|x| x.from.clone())
            .unwrap_or_default();
        add(
            "serial-loop",
            format!("every thread runs a loop of {t:.0} iterations that reads global memory ({src}): a long chain of loads per thread"),
            0.7 * ramp(t, 128.0, 1024.0),
            c.evs(&[("serial_loop_trips", ">= 256")]),
        );
    }
    if let Some(b) = c.get("stall_barrier_pct").filter(|b| *b >= 10.0) {
        add(
            "barrier-stalls",
            format!("{b:.1}% of warp cycles wait at block barriers"),
            0.6 * ramp(b, 5.0, 40.0),
            c.evs(&[
                ("stall_barrier_pct", ">= 10"),
                ("barrier_ops", "barriers in the code"),
            ]),
        );
    }
    if let Some(x) = c.get("shared_excess_wavefronts").filter(|x| *x >= 0.25) {
        add(
            "bank-conflicts",
            format!(
                "shared-memory bank conflicts: {x:.2} extra wavefronts per conflict-free wavefront"
            ),
            ramp(x, 0.25, 2.0),
            c.evs(&[
                ("shared_excess_wavefronts", ">= 0.25"),
                ("stall_short_scoreboard_pct", "waits on shared memory"),
                ("stall_mio_throttle_pct", "shared-memory queue pressure"),
            ]),
        );
    }
    let spills = [
        c.get("local_bytes"),
        c.get("spill_insts"),
        c.get("local_memory_ops"),
    ];
    if spills.iter().flatten().any(|v| *v > 0.0) {
        add(
            "spills",
            "registers spill to local memory (or a local array lives there)".into(),
            0.5,
            c.evs(&[
                ("local_bytes", "> 0"),
                ("spill_insts", "> 0"),
                ("local_memory_ops", "> 0"),
            ]),
        );
    }
    if let Some(v) = c
        .max_of(&["sm_sol_pct", "issue_pct"])
        .filter(|v| *v >= 50.0)
    {
        let pipes = [
            "pipe_alu_pct",
            "pipe_fma_pct",
            "pipe_fp16_pct",
            "pipe_fp64_pct",
            "pipe_lsu_pct",
            "pipe_xu_pct",
            "tensor_pipe_pct",
        ];
        let top = pipes
            .iter()
            .filter_map(|k| c.get(k).map(|v| (*k, v)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let mut ev = c.evs(&[("sm_sol_pct", ">= 50"), ("issue_pct", ">= 50")]);
        if let Some((k, _)) = top {
            ev.extend(c.evs(&[(k, "the busiest pipe")]));
        }
        add(
            "compute",
            format!(
                "the SM is busy: {v:.1}% of its peak{}",
                top.map(|(k, p)| format!(
                    ", busiest pipe {} at {p:.1}%",
                    k.trim_start_matches("pipe_").trim_end_matches("_pct")
                ))
                .unwrap_or_default()
            ),
            ramp(v, 40.0, 80.0),
            ev,
        );
    }
    if let Some(o) = c.get("launch_overhead_pct").filter(|o| *o >= 20.0) {
        add(
            "launch-cost",
            format!("{o:.0}% of the time per launch is launch cost"),
            ramp(o, 10.0, 60.0),
            c.evs(&[
                ("launch_overhead_pct", ">= 20"),
                ("duration_us", "the time per launch"),
            ]),
        );
    }
    if let Some(a) = c.get("atomic_pct").filter(|a| *a >= 20.0) {
        add(
            "atomics",
            format!("the L2 atomic unit is {a:.1}% busy: contended atomics"),
            ramp(a, 20.0, 80.0),
            c.evs(&[("atomic_pct", ">= 20")]),
        );
    }
    if let Some(u) = c.get("branch_uniform_pct").filter(|u| *u < 90.0) {
        add(
            "divergence",
            format!("only {u:.1}% of branches are uniform across their warp"),
            0.3 * ramp(100.0 - u, 10.0, 50.0).max(0.2),
            c.evs(&[("branch_uniform_pct", "< 90")]),
        );
    }
    if let (Some(i), Some(e)) = (c.get("issue_pct"), c.get("eligible_warps")) {
        if i < 30.0 && e < 1.0 {
            add(
                "idle-issue",
                format!("the schedulers issue in {i:.1}% of cycles: {e:.2} eligible warps per scheduler per cycle"),
                0.5 * (1.0 - i / 30.0),
                c.evs(&[("issue_pct", "< 30"), ("eligible_warps", "< 1"), ("active_warps", "resident per scheduler")]),
            );
        }
    }
    let order = [
        "bandwidth",
        "memory-stalls",
        "passes",
        "narrow-accesses",
        "uncoalesced",
        "parallelism",
        "occupancy-limit",
        "serial-loop",
        "barrier-stalls",
        "bank-conflicts",
        "spills",
        "compute",
        "launch-cost",
        "atomics",
        "divergence",
        "idle-issue",
    ];
    let pos = |id: &str| order.iter().position(|o| *o == id).unwrap_or(order.len());
    out.sort_by(|a, b| b.2.total_cmp(&a.2).then(pos(&a.0).cmp(&pos(&b.0))));
    out.into_iter()
        .enumerate()
        .map(|(i, (id, claim, weight, evidence))| Finding {
            rank: i + 1,
            id,
            claim,
            weight,
            evidence,
        })
        .collect()
}

/// The unit and meaning of an evidence key, for documentation.
pub fn meaning(key: &str) -> Option<&'static str> {
    describe(key).map(|(_, m)| m)
}
