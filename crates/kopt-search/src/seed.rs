//! Seeding: from a bottleneck snapshot to a prioritised parameter matrix, and from a
//! matrix to the [`Guide`] strategies follow.
//!
//! [`SnapshotHints`] is the little the heuristic needs of a snapshot: a classification
//! and a few named metrics. `cargo kopt search --hints snapshot.json` converts a
//! profiler's snapshot into it; `cargo kopt search --seeded` alone derives it from the
//! engine's evaluation of the reference (registers, occupancy, effective bandwidth, grid
//! size) and the reference's PTX (the widest global load). This crate knows neither.
//!
//! [`heuristic`] gives each axis a *role* and then applies rules:
//!
//! | role | how it is recognised |
//! | --- | --- |
//! | vector width | a tunable named `VEC`, `VECTOR`, `VEC_WIDTH`, `VW`, `PACK`, `LOAD_WIDTH`... |
//! | unroll | a tunable named `UNROLL`, `ILP`, `ITEMS`, `ITEMS_PER_THREAD`... |
//! | block size | threads per block grow with the tunable (launch rule, heaviest shape) |
//! | work per block | the grid shrinks as the tunable grows (rows or tiles per block) |
//! | blocks per item | the grid grows with the tunable (blocks per row, split-K) |
//! | register cap, fast math, vectorizer | the option axes |
//!
//! | snapshot | preferred |
//! | --- | --- |
//! | occupancy-limited (or < 50% occupancy with > 64 registers) | a register cap (64, 32), smaller blocks, less unrolling |
//! | tiny grid (fewer blocks than multiprocessors) | more blocks (less work per block, more blocks per item), bigger blocks, wider vectors, more unrolling |
//! | memory-bound with narrow loads (< 16 bytes) | the widest vector width first, more unrolling, the vectorizer |
//! | memory-bound | more unrolling, wider vectors, mid-size blocks |
//! | latency-bound | more unrolling, wider vectors, bigger blocks |
//! | compute-bound | fast math, more unrolling, no register cap |
//! | spills (local memory) | no register cap or a high one, less unrolling |
//! | launch-bound | more work per block |
//!
//! A row of the matrix names an axis, its values from most to least preferred, a
//! priority in [0, 1] and the reason. An agent may hand kopt a matrix of the same type
//! (JSON, [`ParameterMatrix`]); both go through [`Guide::new`], which refuses axes and
//! values the space does not have.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::interesting::{Direction, MetricGoal};
use crate::space::{AxisKind, Point, Space};

/// The bottleneck classification of a snapshot (DESIGN.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bottleneck {
    MemoryBound,
    LatencyBound,
    ComputeBound,
    OccupancyLimited,
    SharedMemoryBankBound,
    LaunchBound,
    #[default]
    Unknown,
}

impl Bottleneck {
    pub fn name(self) -> &'static str {
        match self {
            Bottleneck::MemoryBound => "memory-bound",
            Bottleneck::LatencyBound => "latency-bound",
            Bottleneck::ComputeBound => "compute-bound",
            Bottleneck::OccupancyLimited => "occupancy-limited",
            Bottleneck::SharedMemoryBankBound => "shared-memory-bank-bound",
            Bottleneck::LaunchBound => "launch-bound",
            Bottleneck::Unknown => "unknown",
        }
    }
}

/// What the seeding heuristic reads of a bottleneck snapshot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SnapshotHints {
    pub class: Bottleneck,
    /// Achieved occupancy where a profiler measured it, else theoretical; percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occupancy_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registers: Option<u32>,
    /// Local memory per thread (spills), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_bytes: Option<u32>,
    /// The widest global load a thread issues, bytes (4: scalar f32, 16: float4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_load_bytes: Option<u32>,
    /// Blocks of the grid per multiprocessor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grid_blocks_per_sm: Option<f64>,
    /// Effective bandwidth against the measured copy bandwidth, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_bandwidth_pct: Option<f64>,
}

impl SnapshotHints {
    /// The metrics as the search's outcomes name them (the baseline of "interesting").
    pub fn metrics(&self) -> BTreeMap<String, f64> {
        let mut m = BTreeMap::new();
        let mut put = |k: &str, v: Option<f64>| {
            if let Some(v) = v {
                m.insert(k.to_string(), v);
            }
        };
        put("occupancy_pct", self.occupancy_pct);
        put("registers", self.registers.map(f64::from));
        put("local_bytes", self.local_bytes.map(f64::from));
        put("global_load_bytes", self.global_load_bytes.map(f64::from));
        put("grid_blocks_per_sm", self.grid_blocks_per_sm);
        put("copy_bandwidth_pct", self.copy_bandwidth_pct);
        m
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        let mut parts = vec![self.class.name().to_string()];
        if let Some(v) = self.copy_bandwidth_pct {
            parts.push(format!("{v:.0}% of copy bandwidth"));
        }
        if let Some(v) = self.occupancy_pct {
            parts.push(format!("{v:.0}% occupancy"));
        }
        if let Some(v) = self.registers {
            parts.push(format!("{v} registers"));
        }
        if let Some(v) = self.global_load_bytes {
            parts.push(format!("{v}-byte loads"));
        }
        if let Some(v) = self.grid_blocks_per_sm {
            parts.push(format!("{v:.2} blocks per SM"));
        }
        if let Some(v) = self.local_bytes.filter(|v| *v > 0) {
            parts.push(format!("{v} bytes of local memory"));
        }
        parts.join(", ")
    }
}

/// One row of a parameter matrix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatrixRow {
    /// An axis of the space: a tunable's name, `fast-math`, `extra-device-vectorization`
    /// or `maxrregcount`.
    pub axis: String,
    /// Values, most preferred first (option axes: 0/1, or the register cap, 0 = none).
    pub prefer: Vec<i64>,
    /// How much this row matters, in [0, 1].
    pub priority: f64,
    pub reason: String,
}

/// Where a search starts and which way it leans.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ParameterMatrix {
    /// `heuristic (<snapshot>)`, or who supplied it.
    pub source: String,
    pub rows: Vec<MatrixRow>,
    /// Explicit starting points (values by axis name; axes left out take the reference's
    /// value), tried before the generated ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub starts: Vec<BTreeMap<String, i64>>,
    /// Metrics whose strong movement makes a point interesting.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub goals: Vec<MetricGoal>,
}

/// What an axis does, as far as the heuristic can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    VectorWidth,
    Unroll,
    BlockSize,
    WorkPerBlock,
    BlocksPerItem,
    RegisterCap,
    FastMath,
    Vectorizer,
    Other,
}

const VECTOR_NAMES: &[&str] = &[
    "VEC",
    "VECTOR",
    "VEC_WIDTH",
    "VECTOR_WIDTH",
    "VECTOR_SIZE",
    "VEC_SIZE",
    "VW",
    "PACK",
    "LOAD_WIDTH",
    "ELEMS_PER_LOAD",
];
const UNROLL_NAMES: &[&str] = &[
    "UNROLL",
    "ILP",
    "ITEMS",
    "ITEMS_PER_THREAD",
    "ELEMS_PER_THREAD",
    "LOADS_IN_FLIGHT",
];

/// The role of every axis of `space`.
pub fn roles(space: &Space, spec: &kopt_spec::KernelSpec) -> Vec<Role> {
    // The heaviest declared shape (first on ties).
    let shape = spec
        .shapes
        .iter()
        .enumerate()
        .fold(None::<(usize, f64)>, |best, (i, s)| match best {
            Some((_, w)) if w >= s.weight => best,
            _ => Some((i, s.weight)),
        })
        .map(|(i, _)| i)
        .unwrap_or(0);
    let args = spec
        .shapes
        .get(shape)
        .map(|s| spec.shape_args(s))
        .unwrap_or_default();
    let defaults: BTreeMap<String, i64> = space
        .axes
        .iter()
        .filter(|a| a.kind == AxisKind::Define)
        .map(|a| (a.name.clone(), a.values[a.default]))
        .collect();
    space
        .axes
        .iter()
        .map(|a| match a.kind {
            AxisKind::FastMath => Role::FastMath,
            AxisKind::ExtraDeviceVectorization => Role::Vectorizer,
            AxisKind::MaxRegisters => Role::RegisterCap,
            AxisKind::Define => {
                let upper = a.name.to_ascii_uppercase();
                if VECTOR_NAMES.contains(&upper.as_str()) {
                    return Role::VectorWidth;
                }
                if UNROLL_NAMES.contains(&upper.as_str()) || upper.starts_with("UNROLL") {
                    return Role::Unroll;
                }
                // Geometry at each value (others at the reference's), in ascending value order.
                let mut vals: Vec<i64> = a.values.clone();
                vals.sort();
                let geo: Vec<(u32, u64)> = vals
                    .iter()
                    .filter_map(|v| {
                        let mut d = defaults.clone();
                        d.insert(a.name.clone(), *v);
                        crate::space::launch_of(spec, &d, &args)
                            .ok()
                            .map(|l| (l.threads(), l.blocks()))
                    })
                    .collect();
                if geo.len() < 2 {
                    return Role::Other;
                }
                let threads_up =
                    geo.windows(2).all(|w| w[1].0 >= w[0].0) && geo.last().unwrap().0 > geo[0].0;
                let blocks_down =
                    geo.windows(2).all(|w| w[1].1 <= w[0].1) && geo.last().unwrap().1 < geo[0].1;
                let blocks_up =
                    geo.windows(2).all(|w| w[1].1 >= w[0].1) && geo.last().unwrap().1 > geo[0].1;
                if threads_up {
                    Role::BlockSize
                } else if blocks_down {
                    Role::WorkPerBlock
                } else if blocks_up {
                    Role::BlocksPerItem
                } else {
                    Role::Other
                }
            }
        })
        .collect()
}

fn sorted(values: &[i64], descending: bool) -> Vec<i64> {
    let mut v = values.to_vec();
    v.sort();
    if descending {
        v.reverse();
    }
    v
}

/// Values ordered by distance to `target` (nearest first; ties: the smaller).
fn around(values: &[i64], target: i64) -> Vec<i64> {
    let mut v = values.to_vec();
    v.sort_by_key(|x| ((x - target).abs(), *x));
    v
}

/// The built-in heuristic: a prioritised matrix for `space` from a snapshot.
pub fn heuristic(
    space: &Space,
    spec: &kopt_spec::KernelSpec,
    hints: &SnapshotHints,
) -> ParameterMatrix {
    let roles = roles(space, spec);
    let mut rows: BTreeMap<usize, MatrixRow> = BTreeMap::new();
    let mut put = |axis: usize, prefer: Vec<i64>, priority: f64, reason: String| {
        let keep = rows.get(&axis).is_none_or(|r| r.priority < priority);
        if keep {
            rows.insert(
                axis,
                MatrixRow {
                    axis: space.axes[axis].name.clone(),
                    prefer,
                    priority,
                    reason,
                },
            );
        }
    };
    let of = |role: Role| -> Vec<usize> {
        roles
            .iter()
            .enumerate()
            .filter(|(_, r)| **r == role)
            .map(|(i, _)| i)
            .collect()
    };
    let values = |a: usize| space.axes[a].values.clone();
    let occupancy_low = hints.occupancy_pct.is_some_and(|o| o < 50.0);
    let regs_high = hints.registers.is_some_and(|r| r > 64);
    let tiny_grid = hints.grid_blocks_per_sm.is_some_and(|b| b < 1.0);
    let narrow = hints.global_load_bytes.is_none_or(|b| b < 16);
    let spills = hints.local_bytes.is_some_and(|b| b > 0);
    let mut goals: Vec<MetricGoal> = Vec::new();

    if hints.class == Bottleneck::OccupancyLimited || (occupancy_low && regs_high) {
        for a in of(Role::RegisterCap) {
            let v = values(a);
            let mut prefer: Vec<i64> = [64, 32, 128]
                .into_iter()
                .filter(|x| v.contains(x))
                .collect();
            let rest: Vec<i64> = v.iter().copied().filter(|x| !prefer.contains(x)).collect();
            prefer.extend(rest);
            put(
                a,
                prefer,
                0.9,
                format!(
                    "occupancy {}: cap the registers so more warps fit",
                    pct(hints.occupancy_pct)
                ),
            );
        }
        for a in of(Role::BlockSize) {
            put(
                a,
                around(&values(a), 128),
                0.6,
                "occupancy-limited: smaller blocks pack the multiprocessors more finely".into(),
            );
        }
        for a in of(Role::Unroll) {
            put(
                a,
                sorted(&values(a), false),
                0.4,
                "occupancy-limited: less unrolling needs fewer registers".into(),
            );
        }
        goals.push(MetricGoal::new(
            "occupancy_pct",
            Direction::Up,
            0.25,
            "occupancy-limited",
        ));
        goals.push(MetricGoal::new(
            "registers",
            Direction::Down,
            0.2,
            "occupancy-limited by registers",
        ));
    }
    if tiny_grid {
        let why = format!(
            "the grid has {:.2} blocks per multiprocessor: the device is mostly idle",
            hints.grid_blocks_per_sm.unwrap_or(0.0)
        );
        for a in of(Role::WorkPerBlock) {
            put(
                a,
                sorted(&values(a), false),
                0.95,
                format!("{why}; less work per block gives more blocks"),
            );
        }
        for a in of(Role::BlocksPerItem) {
            put(
                a,
                sorted(&values(a), true),
                0.95,
                format!("{why}; more blocks per item"),
            );
        }
        for a in of(Role::BlockSize) {
            put(
                a,
                sorted(&values(a), true),
                0.8,
                format!("{why}; each block must bring more threads"),
            );
        }
        for a in of(Role::VectorWidth) {
            put(
                a,
                sorted(&values(a), true),
                0.85,
                format!("{why}; wider loads put more bytes in flight per thread"),
            );
        }
        for a in of(Role::Unroll) {
            put(
                a,
                sorted(&values(a), true),
                0.75,
                format!("{why}; more independent loads in flight per thread"),
            );
        }
        goals.push(MetricGoal::new(
            "grid_blocks_per_sm",
            Direction::Up,
            0.5,
            "tiny grid",
        ));
    }
    match hints.class {
        Bottleneck::MemoryBound | Bottleneck::LatencyBound => {
            let memory = hints.class == Bottleneck::MemoryBound;
            let wide_priority = if narrow { 0.9 } else { 0.5 };
            for a in of(Role::VectorWidth) {
                put(
                    a,
                    sorted(&values(a), true),
                    wide_priority,
                    match hints.global_load_bytes {
                        Some(b) if b < 16 => {
                            format!("{}, {b}-byte loads: wider vector loads", hints.class.name())
                        }
                        Some(b) => format!("{}, already {b}-byte loads", hints.class.name()),
                        None => format!("{}: wider vector loads", hints.class.name()),
                    },
                );
            }
            for a in of(Role::Unroll) {
                put(
                    a,
                    sorted(&values(a), true),
                    if memory { 0.6 } else { 0.8 },
                    format!("{}: more loads in flight", hints.class.name()),
                );
            }
            for a in of(Role::Vectorizer) {
                put(
                    a,
                    vec![1, 0],
                    0.3,
                    format!("{}: let the optimizer vectorize", hints.class.name()),
                );
            }
            for a in of(Role::BlockSize) {
                if memory {
                    put(
                        a,
                        around(&values(a), 256),
                        0.3,
                        "memory-bound: mid-size blocks".into(),
                    );
                } else {
                    put(
                        a,
                        sorted(&values(a), true),
                        0.6,
                        "latency-bound: more warps per block to hide latency".into(),
                    );
                }
            }
            if narrow {
                goals.push(MetricGoal::new(
                    "global_load_bytes",
                    Direction::Up,
                    0.5,
                    "narrow loads",
                ));
            }
            if !memory {
                goals.push(MetricGoal::new(
                    "occupancy_pct",
                    Direction::Up,
                    0.25,
                    "latency-bound",
                ));
            }
        }
        Bottleneck::ComputeBound => {
            for a in of(Role::FastMath) {
                put(
                    a,
                    vec![1, 0],
                    0.8,
                    "compute-bound: fast math, where the tolerances hold".into(),
                );
            }
            for a in of(Role::Unroll) {
                put(
                    a,
                    sorted(&values(a), true),
                    0.5,
                    "compute-bound: more instruction-level parallelism".into(),
                );
            }
            for a in of(Role::RegisterCap) {
                put(
                    a,
                    sorted(&values(a), false),
                    0.3,
                    "compute-bound: leave the registers to the compiler".into(),
                );
            }
        }
        Bottleneck::LaunchBound => {
            for a in of(Role::WorkPerBlock) {
                put(
                    a,
                    sorted(&values(a), true),
                    0.6,
                    "launch-bound: more work per block".into(),
                );
            }
        }
        _ => {}
    }
    if spills {
        for a in of(Role::RegisterCap) {
            let mut prefer = vec![0];
            prefer.extend(sorted(&values(a), true).into_iter().filter(|v| *v != 0));
            put(
                a,
                prefer,
                0.85,
                format!(
                    "{} bytes of local memory: give the compiler its registers",
                    hints.local_bytes.unwrap_or(0)
                ),
            );
        }
        for a in of(Role::Unroll) {
            put(
                a,
                sorted(&values(a), false),
                0.5,
                "spills: less unrolling".into(),
            );
        }
        goals.push(MetricGoal::new(
            "local_bytes",
            Direction::Down,
            0.5,
            "spills",
        ));
    }
    let mut rows: Vec<MatrixRow> = rows.into_values().collect();
    rows.sort_by(|a, b| b.priority.total_cmp(&a.priority).then(a.axis.cmp(&b.axis)));
    ParameterMatrix {
        source: format!("heuristic ({})", hints.describe()),
        rows,
        starts: vec![],
        goals,
    }
}

fn pct(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.0}%"))
        .unwrap_or_else(|| "low".into())
}

/// A matrix bound to a space: per-axis preferences, and the starting points.
#[derive(Debug, Clone)]
pub struct Guide {
    pub matrix: ParameterMatrix,
    /// Per axis, per value index: preference in [0, 1] times the row's priority.
    weight: Vec<Vec<f64>>,
    /// Valid starting points, most promising first.
    pub starts: Vec<usize>,
}

/// How many starting points a guide proposes at most.
pub const MAX_STARTS: usize = 8;

impl Guide {
    /// Binds `matrix` to `space`; an axis or value the space lacks is an error naming the
    /// axes and values it has.
    pub fn new(space: &Space, matrix: ParameterMatrix) -> Result<Guide, String> {
        let mut weight: Vec<Vec<f64>> = space
            .axes
            .iter()
            .map(|a| vec![0.0; a.values.len()])
            .collect();
        let describe = |a: usize| {
            let ax = &space.axes[a];
            format!("{} in {:?}", ax.name, ax.values)
        };
        let axis_of = |name: &str| -> Result<usize, String> {
            space.axis(name).ok_or_else(|| {
                format!(
                    "the parameter matrix names `{name}`, which is not an axis of `{}`'s space (its axes: {})",
                    space.kernel,
                    (0..space.axes.len()).map(describe).collect::<Vec<_>>().join("; ")
                )
            })
        };
        for row in &matrix.rows {
            let a = axis_of(&row.axis)?;
            if !(0.0..=1.0).contains(&row.priority) {
                return Err(format!(
                    "the parameter matrix gives `{}` priority {}: use a number in [0, 1]",
                    row.axis, row.priority
                ));
            }
            let n = row.prefer.len();
            for (rank, v) in row.prefer.iter().enumerate() {
                let i = space.axes[a].index_of(*v).ok_or_else(|| {
                    format!(
                        "the parameter matrix prefers {}={v}, which the space does not have ({})",
                        row.axis,
                        describe(a)
                    )
                })?;
                weight[a][i] = row.priority * (n - rank) as f64 / n as f64;
            }
        }
        // Starting points: explicit ones, then combinations of the top rows' first two
        // preferences (every other row at its first), each made valid.
        let mut starts: Vec<usize> = Vec::new();
        let base: Vec<u16> = space.axes.iter().map(|a| a.default as u16).collect();
        for s in &matrix.starts {
            let mut p = base.clone();
            for (name, v) in s {
                let a = axis_of(name)?;
                p[a] = space.axes[a].index_of(*v).ok_or_else(|| {
                    format!(
                        "a starting point of the parameter matrix sets {name}={v}, which the space does not have ({})",
                        describe(a)
                    )
                })? as u16;
            }
            let id = space.nearest(&Point(p));
            if !starts.contains(&id) {
                starts.push(id);
            }
        }
        let mut all_in = base.clone();
        for row in &matrix.rows {
            let a = space.axis(&row.axis).expect("checked above");
            if let Some(v) = row.prefer.first() {
                all_in[a] = space.axes[a].index_of(*v).expect("checked above") as u16;
            }
        }
        let top: Vec<&MatrixRow> = matrix
            .rows
            .iter()
            .filter(|r| r.prefer.len() > 1)
            .take(3)
            .collect();
        for mask in 0..(1u32 << top.len()) {
            let mut p = all_in.clone();
            for (bit, row) in top.iter().enumerate() {
                if mask & (1 << bit) != 0 {
                    let a = space.axis(&row.axis).expect("checked above");
                    p[a] = space.axes[a]
                        .index_of(row.prefer[1])
                        .expect("checked above") as u16;
                }
            }
            let id = nearest_guided(space, &Point(p), &weight);
            if !starts.contains(&id) {
                starts.push(id);
            }
            if starts.len() >= MAX_STARTS {
                break;
            }
        }
        starts.truncate(MAX_STARTS.max(matrix.starts.len()));
        Ok(Guide {
            matrix,
            weight,
            starts,
        })
    }

    /// The preference for value index `v` of axis `a`.
    pub fn weight(&self, a: usize, v: usize) -> f64 {
        self.weight[a][v]
    }

    /// How well a point matches the matrix: the sum of its values' preferences.
    pub fn score(&self, space: &Space, id: usize) -> f64 {
        space
            .point(id)
            .0
            .iter()
            .enumerate()
            .map(|(a, v)| self.weight[a][*v as usize])
            .sum()
    }

    /// The goals of "interesting" points.
    pub fn goals(&self) -> &[MetricGoal] {
        &self.matrix.goals
    }
}

/// [`Space::nearest`], ties broken towards the guide's preferences.
fn nearest_guided(space: &Space, p: &Point, weight: &[Vec<f64>]) -> usize {
    if let Some(i) = space.id(p) {
        return i;
    }
    let mut best: Option<(usize, f64, usize)> = None;
    for i in 0..space.len() {
        let q = space.point(i);
        let diff = p.0.iter().zip(&q.0).filter(|(a, b)| a != b).count();
        let score: f64 =
            q.0.iter()
                .enumerate()
                .map(|(a, v)| weight[a][*v as usize])
                .sum();
        let better = match best {
            None => true,
            Some((d, s, _)) => diff < d || (diff == d && score > s + 1e-12),
        };
        if better {
            best = Some((diff, score, i));
        }
    }
    best.map(|b| b.2).unwrap_or(0)
}
