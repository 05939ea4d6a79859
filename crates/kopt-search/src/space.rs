//! The search space: every combination of the spec's tunables (preprocessor defines) and
//! of the compile options kopt may vary, with the invalid ones pruned before anything is
//! compiled.
//!
//! A point gives one value to each [`Axis`]. Launch geometry is not an axis of its own:
//! it comes from the spec's launch rule evaluated with the point's defines, so the
//! "launch-geometry parameters" are the tunables that appear in the `grid`, `block` and
//! `smem` expressions.
//!
//! A point is *valid* when, on **every** declared shape,
//!
//! - every constraint of the spec holds with the point's defines;
//! - the launch rule evaluates (no overflow, no division by zero) to positive dimensions;
//! - the block fits the device: threads per block at most `max_threads_per_block`, block
//!   dimensions at most (1024, 1024, 64), grid dimensions at most (2^31 - 1, 65535,
//!   65535), dynamic shared memory at most the opt-in maximum per block;
//! - with `--maxrregcount=R`, a block of the point's size can hold R registers per thread
//!   (R rounded up to the allocation unit of 8, times the threads rounded up to whole
//!   warps, at most the registers of a block): otherwise the cap cannot be honoured.
//!
//! Compile-option axes (each offered only when the spec's own options do not already
//! decide it):
//!
//! - `fast-math`: `--use_fast_math`, only when an output buffer is floating point; the
//!   driver drops it for the rest of a run as soon as a point with it fails tolerance
//!   ([`Space::ban`]).
//! - `extra-device-vectorization`: `--extra-device-vectorization`.
//! - `maxrregcount`: `--maxrregcount=N` for N in 32, 64, 128, 255 (0: the compiler's
//!   choice).
//!
//! These three are NVRTC options that NVRTC-based projects pass to
//! `nvrtcCompileProgram` (cudarc's `CompileOptions` has `--maxrregcount` and
//! `--use_fast_math`; NVIDIA Warp passes `--extra-device-vectorization`). `-Xptxas`
//! options are not offered: kopt compiles to PTX for `compute_XY` (as the generated
//! launchers do, so that what is measured is what ships) and the driver assembles it at
//! load time, so NVRTC never runs ptxas and a ptxas option would change nothing that
//! runs.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use kopt_engine::job::KernelVersion;
use kopt_engine::protocol::DeviceInfo;
use kopt_spec::expr::{self, Expr};
use kopt_spec::spec::KernelSpec;
use serde::{Deserialize, Serialize};

/// The most points (product of the tunables' value counts) kopt enumerates.
pub const MAX_RAW_POINTS: u64 = 1 << 20;

/// What an axis varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AxisKind {
    /// A tunable: `-DNAME=VALUE`.
    Define,
    /// `--use_fast_math` (value 1) or not (0).
    FastMath,
    /// `--extra-device-vectorization` (1) or not (0).
    ExtraDeviceVectorization,
    /// `--maxrregcount=VALUE`, or nothing for 0.
    MaxRegisters,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Axis {
    /// The tunable's name, or `fast-math`, `extra-device-vectorization`, `maxrregcount`.
    pub name: String,
    pub kind: AxisKind,
    /// In the spec's order for tunables; ascending for options.
    pub values: Vec<i64>,
    /// Index of the reference's value.
    pub default: usize,
}

impl Axis {
    /// How one value reads in labels: `BLOCK=256`, `fast-math`, `maxrregcount=64`; the
    /// option axes' "off" values read as nothing.
    pub fn label(&self, index: usize) -> Option<String> {
        let v = self.values[index];
        match self.kind {
            AxisKind::Define => Some(format!("{}={v}", self.name)),
            AxisKind::FastMath | AxisKind::ExtraDeviceVectorization => {
                (v != 0).then(|| self.name.clone())
            }
            AxisKind::MaxRegisters => (v != 0).then(|| format!("maxrregcount={v}")),
        }
    }

    /// The NVRTC option of one value, if any.
    pub fn option(&self, index: usize) -> Option<String> {
        let v = self.values[index];
        match self.kind {
            AxisKind::Define => None,
            AxisKind::FastMath => (v != 0).then(|| "--use_fast_math".to_string()),
            AxisKind::ExtraDeviceVectorization => {
                (v != 0).then(|| "--extra-device-vectorization".to_string())
            }
            AxisKind::MaxRegisters => (v != 0).then(|| format!("--maxrregcount={v}")),
        }
    }

    pub fn index_of(&self, value: i64) -> Option<usize> {
        self.values.iter().position(|v| *v == value)
    }
}

/// One value index per axis.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Point(pub Vec<u16>);

/// The device limits that prune points.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub max_threads_per_block: u32,
    pub max_block_dims: [u32; 3],
    pub max_grid_dims: [u32; 3],
    pub max_shared_per_block_optin: u32,
    pub registers_per_block: u32,
}

impl Limits {
    /// The limits of a device as the worker describes it. Block and grid dimension limits
    /// are the same on every architecture kopt supports (sm_50 and later); the registers
    /// of a block equal those of a multiprocessor on them (64 Ki).
    pub fn from_device(d: &DeviceInfo) -> Self {
        Limits {
            max_threads_per_block: d.max_threads_per_block,
            max_shared_per_block_optin: d.max_shared_per_block_optin,
            registers_per_block: d.registers_per_sm.min(65536),
            ..Limits::any_device()
        }
    }

    /// What every architecture kopt supports allows, for a space built before a device is
    /// known (a loop's matrix): shared memory is left to the worker's own check.
    pub fn any_device() -> Self {
        Limits {
            max_threads_per_block: 1024,
            max_block_dims: [1024, 1024, 64],
            max_grid_dims: [i32::MAX as u32, 65535, 65535],
            max_shared_per_block_optin: u32::MAX,
            registers_per_block: 65536,
        }
    }
}

/// Which compile-option axes to offer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OptionAxes {
    pub fast_math: bool,
    pub extra_device_vectorization: bool,
    /// `--maxrregcount` values besides "unset" (empty: no axis).
    pub maxrregcount: Vec<i64>,
}

impl OptionAxes {
    /// Tunables only.
    pub fn none() -> Self {
        OptionAxes {
            fast_math: false,
            extra_device_vectorization: false,
            maxrregcount: vec![],
        }
    }

    /// Every option axis kopt knows.
    pub fn standard() -> Self {
        OptionAxes {
            fast_math: true,
            extra_device_vectorization: true,
            maxrregcount: vec![32, 64, 128, 255],
        }
    }
}

/// Why points were left out, with a first example of each.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Pruned {
    pub constraints: usize,
    pub geometry: usize,
    pub device_limits: usize,
    pub registers: usize,
    pub examples: Vec<String>,
}

impl Pruned {
    fn note(&mut self, why: String) {
        if self.examples.len() < 4 {
            self.examples.push(why);
        }
    }
}

/// The launch of a point on one declared shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Launch {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub smem: u32,
    /// Thread-block cluster set at launch; `[1, 1, 1]` (left out of the JSON) is none.
    #[serde(skip_serializing_if = "no_cluster")]
    pub cluster: [u32; 3],
}

fn no_cluster(c: &[u32; 3]) -> bool {
    *c == [1; 3]
}

impl Launch {
    pub fn threads(&self) -> u32 {
        self.block[0] * self.block[1] * self.block[2]
    }
    pub fn blocks(&self) -> u64 {
        self.grid.iter().map(|g| u64::from(*g)).product()
    }
}

/// The enumerated space of one kernel on one device.
#[derive(Debug, Clone)]
pub struct Space {
    pub kernel: String,
    pub axes: Vec<Axis>,
    pub limits: Limits,
    /// The spec's own options (the reference's), which every point keeps.
    pub base_options: Vec<String>,
    points: Vec<Point>,
    ids: HashMap<Point, usize>,
    /// Per valid point, per declared shape.
    launches: Vec<Vec<Launch>>,
    /// Axis values dropped during a run (fast math that broke tolerance).
    banned: Vec<(usize, usize)>,
    pub pruned: Pruned,
    /// Product of the axes' sizes.
    pub raw: u64,
    fingerprint: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum SpaceError {
    NoTunables(String),
    TooLarge(String),
    Empty(String),
}

impl fmt::Display for SpaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpaceError::NoTunables(m) | SpaceError::TooLarge(m) | SpaceError::Empty(m) => {
                f.write_str(m)
            }
        }
    }
}

impl std::error::Error for SpaceError {}

/// Counts in mixed radix; `false` after the last combination (and for no digits).
fn next_digits(digits: &mut [usize], radices: &[usize]) -> bool {
    for i in (0..digits.len()).rev() {
        digits[i] += 1;
        if digits[i] < radices[i] {
            return true;
        }
        digits[i] = 0;
    }
    false
}

fn eval_with(
    spec: &KernelSpec,
    e: &Expr,
    defines: &BTreeMap<String, i64>,
    args: &[i64],
) -> Result<i64, String> {
    let p = spec.compile_expr(e, defines)?;
    expr::eval(&p, args).map_err(|err| format!("`{e}`: {err}"))
}

/// The launch of `spec`'s rule with `defines` on shape arguments `args`.
pub fn launch_of(
    spec: &KernelSpec,
    defines: &BTreeMap<String, i64>,
    args: &[i64],
) -> Result<Launch, String> {
    let dim = |d: &[Expr; 3], what: &str| -> Result<[u32; 3], String> {
        let mut out = [0u32; 3];
        for (i, e) in d.iter().enumerate() {
            let v = eval_with(spec, e, defines, args)?;
            out[i] = u32::try_from(v)
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| format!("{what} dimension `{e}` is {v}"))?;
        }
        Ok(out)
    };
    let smem = eval_with(spec, &spec.launch.smem, defines, args)?;
    let grid = dim(&spec.launch.grid, "grid")?;
    let cluster = kopt_spec::spec::launch_cluster(
        grid,
        spec.launch
            .cluster
            .as_ref()
            .map(|c| dim(c, "cluster"))
            .transpose()?,
    )?;
    Ok(Launch {
        grid,
        block: dim(&spec.launch.block, "block")?,
        smem: u32::try_from(smem)
            .map_err(|_| format!("shared memory `{}` is {smem}", spec.launch.smem))?,
        cluster,
    })
}

impl Space {
    /// Enumerates the valid points of `spec` on a device with `limits`.
    pub fn build(
        spec: &KernelSpec,
        limits: &Limits,
        options: &OptionAxes,
    ) -> Result<Space, SpaceError> {
        let mut axes: Vec<Axis> = spec
            .tunables
            .iter()
            .map(|t| Axis {
                name: t.name.clone(),
                kind: AxisKind::Define,
                values: t.values.clone(),
                default: t.values.iter().position(|v| *v == t.default).unwrap_or(0),
            })
            .collect();
        let has = |prefix: &str| spec.options.iter().any(|o| o.starts_with(prefix));
        let float_out = spec.buffers().any(|b| b.is_output() && b.dtype.is_float());
        if options.fast_math && float_out && !has("--use_fast_math") && !has("-use_fast_math") {
            axes.push(Axis {
                name: "fast-math".into(),
                kind: AxisKind::FastMath,
                values: vec![0, 1],
                default: 0,
            });
        }
        if options.extra_device_vectorization
            && !has("--extra-device-vectorization")
            && !has("-extra-device-vectorization")
        {
            axes.push(Axis {
                name: "extra-device-vectorization".into(),
                kind: AxisKind::ExtraDeviceVectorization,
                values: vec![0, 1],
                default: 0,
            });
        }
        if !options.maxrregcount.is_empty() && !has("--maxrregcount") && !has("-maxrregcount") {
            let mut values = vec![0];
            values.extend(options.maxrregcount.iter().copied().filter(|v| *v > 0));
            values.sort();
            values.dedup();
            axes.push(Axis {
                name: "maxrregcount".into(),
                kind: AxisKind::MaxRegisters,
                values,
                default: 0,
            });
        }
        if axes.is_empty() {
            return Err(SpaceError::NoTunables(format!(
                "`{}` declares no tunables and no compile option can vary: add `tunables = {{ NAME: [values] }}` to its #[kopt::kernel] annotation, or search its compile options",
                spec.name
            )));
        }
        let define_axes: Vec<usize> = (0..axes.len())
            .filter(|a| axes[*a].kind == AxisKind::Define)
            .collect();
        let raw_defines: u64 = define_axes
            .iter()
            .map(|a| axes[*a].values.len() as u64)
            .product();
        if raw_defines > MAX_RAW_POINTS {
            return Err(SpaceError::TooLarge(format!(
                "the tunables of `{}` span {raw_defines} combinations; kopt enumerates at most {MAX_RAW_POINTS}: give the tunables fewer values, or add constraints",
                spec.name
            )));
        }
        let raw: u64 = axes.iter().map(|a| a.values.len() as u64).product();
        let shapes: Vec<Vec<i64>> = spec.shapes.iter().map(|s| spec.shape_args(s)).collect();
        let mut pruned = Pruned::default();
        let mut points = Vec::new();
        let mut launches = Vec::new();
        // Mixed-radix count over the define axes; the option axes are expanded per valid
        // define combination (only `maxrregcount` depends on it).
        let mut digits = vec![0usize; define_axes.len()];
        loop {
            let defines: BTreeMap<String, i64> = define_axes
                .iter()
                .zip(&digits)
                .map(|(a, d)| (axes[*a].name.clone(), axes[*a].values[*d]))
                .collect();
            let label = || {
                defines
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let options_count: u64 = axes
                .iter()
                .filter(|a| a.kind != AxisKind::Define)
                .map(|a| a.values.len() as u64)
                .product();
            let verdict = (|| -> Result<Vec<Launch>, (u8, String)> {
                let mut ls = Vec::new();
                for (s, args) in spec.shapes.iter().zip(&shapes) {
                    let shape = kopt_spec::spec::shape_label(s);
                    for c in &spec.constraints {
                        match eval_with(spec, c, &defines, args) {
                            Ok(1) => {}
                            Ok(_) => {
                                return Err((0, format!("{}: `{c}` fails on {shape}", label())))
                            }
                            Err(e) => return Err((0, format!("{}: {e} on {shape}", label()))),
                        }
                    }
                    let l = launch_of(spec, &defines, args)
                        .map_err(|e| (1, format!("{}: {e} on {shape}", label())))?;
                    let t = u64::from(l.block[0]) * u64::from(l.block[1]) * u64::from(l.block[2]);
                    if t > u64::from(limits.max_threads_per_block) {
                        return Err((
                            2,
                            format!(
                                "{}: {t} threads per block, the device allows {}",
                                label(),
                                limits.max_threads_per_block
                            ),
                        ));
                    }
                    for i in 0..3 {
                        if l.block[i] > limits.max_block_dims[i]
                            || l.grid[i] > limits.max_grid_dims[i]
                        {
                            return Err((
                                2,
                                format!(
                                    "{}: block {:?} or grid {:?} exceeds the device's dimensions on {shape}",
                                    label(),
                                    l.block,
                                    l.grid
                                ),
                            ));
                        }
                    }
                    if l.smem > limits.max_shared_per_block_optin {
                        return Err((
                            2,
                            format!(
                                "{}: {} bytes of shared memory on {shape}, the device allows {} per block",
                                label(),
                                l.smem,
                                limits.max_shared_per_block_optin
                            ),
                        ));
                    }
                    ls.push(l);
                }
                Ok(ls)
            })();
            match verdict {
                Err((kind, why)) => {
                    match kind {
                        0 => pruned.constraints += options_count as usize,
                        1 => pruned.geometry += options_count as usize,
                        _ => pruned.device_limits += options_count as usize,
                    }
                    pruned.note(why);
                }
                Ok(ls) => {
                    let max_threads = ls.iter().map(|l| l.threads()).max().unwrap_or(1);
                    // Expand the option axes.
                    let option_axes: Vec<usize> = (0..axes.len())
                        .filter(|a| axes[*a].kind != AxisKind::Define)
                        .collect();
                    let mut od = vec![0usize; option_axes.len()];
                    loop {
                        let regs_ok = option_axes.iter().zip(&od).all(|(a, d)| {
                            let ax = &axes[*a];
                            ax.kind != AxisKind::MaxRegisters || {
                                let r = ax.values[*d];
                                r == 0
                                    || ((r as u64).div_ceil(8) * 8)
                                        * u64::from(max_threads.div_ceil(32) * 32)
                                        <= u64::from(limits.registers_per_block)
                            }
                        });
                        if regs_ok {
                            let mut p = vec![0u16; axes.len()];
                            for (a, d) in define_axes.iter().zip(&digits) {
                                p[*a] = *d as u16;
                            }
                            for (a, d) in option_axes.iter().zip(&od) {
                                p[*a] = *d as u16;
                            }
                            points.push(Point(p));
                            launches.push(ls.clone());
                        } else {
                            pruned.registers += 1;
                            if pruned.registers == 1 {
                                pruned.note(format!(
                                    "{}: --maxrregcount cannot be met by a block of {max_threads} threads",
                                    label()
                                ));
                            }
                        }
                        let radices: Vec<usize> =
                            option_axes.iter().map(|a| axes[*a].values.len()).collect();
                        if !next_digits(&mut od, &radices) {
                            break;
                        }
                    }
                }
            }
            // Next define combination.
            let radices: Vec<usize> = define_axes.iter().map(|a| axes[*a].values.len()).collect();
            if !next_digits(&mut digits, &radices) {
                break;
            }
        }
        // Canonical order: lexicographic in axis order.
        let mut order: Vec<usize> = (0..points.len()).collect();
        order.sort_by(|a, b| points[*a].cmp(&points[*b]));
        let points: Vec<Point> = order.iter().map(|i| points[*i].clone()).collect();
        let launches: Vec<Vec<Launch>> = order.iter().map(|i| launches[*i].clone()).collect();
        if points.is_empty() {
            return Err(SpaceError::Empty(format!(
                "no point of `{}`'s {raw} is valid on every declared shape and on this device (for example {}): loosen the constraints or change the tunables' values",
                spec.name,
                pruned.examples.first().cloned().unwrap_or_default()
            )));
        }
        let ids = points
            .iter()
            .enumerate()
            .map(|(i, p)| (p.clone(), i))
            .collect();
        let fingerprint = kopt_engine::cache::hash_parts(&[
            "kopt-search-space-v1",
            &spec.name,
            &serde_json::to_string(&axes).expect("axes serialise"),
            &serde_json::to_string(limits).expect("limits serialise"),
            &serde_json::to_string(&spec.constraints).expect("expressions serialise"),
            &serde_json::to_string(&spec.launch).expect("launch rules serialise"),
            &serde_json::to_string(&spec.shapes).expect("shapes serialise"),
            &points.len().to_string(),
        ]);
        Ok(Space {
            kernel: spec.name.clone(),
            axes,
            limits: limits.clone(),
            base_options: spec.options.clone(),
            points,
            ids,
            launches,
            banned: Vec::new(),
            pruned,
            raw,
            fingerprint,
        })
    }

    /// Valid points.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    pub fn point(&self, id: usize) -> &Point {
        &self.points[id]
    }

    /// The id of a valid point.
    pub fn id(&self, p: &Point) -> Option<usize> {
        self.ids.get(p).copied()
    }

    /// A hash of everything that defines the space (axes, limits, constraints, launch
    /// rule, shapes): a run resumes only into the same space.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The reference's point, when it is valid here.
    pub fn default_point(&self) -> Option<usize> {
        self.id(&Point(self.axes.iter().map(|a| a.default as u16).collect()))
    }

    pub fn axis(&self, name: &str) -> Option<usize> {
        self.axes.iter().position(|a| a.name == name)
    }

    /// The launch of a valid point on each declared shape (in the spec's order).
    pub fn launches(&self, id: usize) -> &[Launch] {
        &self.launches[id]
    }

    /// Drops an axis value for the rest of a run.
    pub fn ban(&mut self, axis: usize, value: usize) {
        if !self.banned.contains(&(axis, value)) {
            self.banned.push((axis, value));
        }
    }

    pub fn banned(&self) -> &[(usize, usize)] {
        &self.banned
    }

    /// Valid and not banned.
    pub fn allowed(&self, id: usize) -> bool {
        let p = &self.points[id];
        !self.banned.iter().any(|(a, v)| p.0[*a] as usize == *v)
    }

    pub fn defines(&self, id: usize) -> BTreeMap<String, i64> {
        let p = &self.points[id];
        self.axes
            .iter()
            .zip(&p.0)
            .filter(|(a, _)| a.kind == AxisKind::Define)
            .map(|(a, v)| (a.name.clone(), a.values[*v as usize]))
            .collect()
    }

    /// NVRTC options: the spec's own, then the option axes' in axis order.
    pub fn options(&self, id: usize) -> Vec<String> {
        let p = &self.points[id];
        let mut out = self.base_options.clone();
        out.extend(
            self.axes
                .iter()
                .zip(&p.0)
                .filter_map(|(a, v)| a.option(*v as usize)),
        );
        out
    }

    /// The point's values by axis name (option axes included), as journals record them.
    pub fn values(&self, id: usize) -> BTreeMap<String, i64> {
        let p = &self.points[id];
        self.axes
            .iter()
            .zip(&p.0)
            .map(|(a, v)| (a.name.clone(), a.values[*v as usize]))
            .collect()
    }

    /// The valid point with these values (every axis named), if any.
    pub fn find(&self, values: &BTreeMap<String, i64>) -> Option<usize> {
        if values.len() != self.axes.len() {
            return None;
        }
        let p = self
            .axes
            .iter()
            .map(|a| {
                values
                    .get(&a.name)
                    .and_then(|v| a.index_of(*v))
                    .map(|i| i as u16)
            })
            .collect::<Option<Vec<u16>>>()?;
        self.id(&Point(p))
    }

    /// `BLOCK=256 VEC=4 fast-math maxrregcount=64`.
    pub fn label(&self, id: usize) -> String {
        let p = &self.points[id];
        self.axes
            .iter()
            .zip(&p.0)
            .filter_map(|(a, v)| a.label(*v as usize))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The point as a version of the kernel: the reference's source and entry, this
    /// point's defines and options.
    pub fn version(&self, id: usize, reference: &KernelVersion) -> KernelVersion {
        KernelVersion {
            id: self.label(id),
            source: reference.source.clone(),
            entry: reference.entry.clone(),
            args: reference.args.clone(),
            launch: reference.launch.clone(),
            defines: self.defines(id),
            options: self.options(id),
            ptx: None,
            cubin: None,
            symbol: None,
        }
    }

    /// Valid points that differ from `id` in exactly one axis by at most `step` value
    /// indices (any value when `step` is `usize::MAX`), in axis order then value order.
    pub fn neighbours(&self, id: usize, step: usize) -> Vec<usize> {
        let p = &self.points[id];
        let mut out = Vec::new();
        for (a, axis) in self.axes.iter().enumerate() {
            let cur = p.0[a] as usize;
            for v in 0..axis.values.len() {
                if v == cur || v.abs_diff(cur) > step {
                    continue;
                }
                let mut q = p.clone();
                q.0[a] = v as u16;
                if let Some(i) = self.id(&q) {
                    out.push(i);
                }
            }
        }
        out
    }

    /// Valid points that differ from `id` in exactly two axes, each by one value index.
    pub fn pair_neighbours(&self, id: usize) -> Vec<usize> {
        let p = &self.points[id];
        let mut out = Vec::new();
        for a in 0..self.axes.len() {
            for b in a + 1..self.axes.len() {
                for da in [-1i32, 1] {
                    for db in [-1i32, 1] {
                        let va = p.0[a] as i32 + da;
                        let vb = p.0[b] as i32 + db;
                        if va < 0
                            || vb < 0
                            || va as usize >= self.axes[a].values.len()
                            || vb as usize >= self.axes[b].values.len()
                        {
                            continue;
                        }
                        let mut q = p.clone();
                        q.0[a] = va as u16;
                        q.0[b] = vb as u16;
                        if let Some(i) = self.id(&q) {
                            out.push(i);
                        }
                    }
                }
            }
        }
        out
    }

    /// The valid point nearest to an arbitrary combination of value indices (fewest
    /// differing axes, then the smallest total index distance, then the lowest id).
    pub fn nearest(&self, p: &Point) -> usize {
        if let Some(i) = self.id(p) {
            return i;
        }
        let mut best = (usize::MAX, usize::MAX, 0usize);
        for (i, q) in self.points.iter().enumerate() {
            let diff = p.0.iter().zip(&q.0).filter(|(a, b)| a != b).count();
            let dist: usize =
                p.0.iter()
                    .zip(&q.0)
                    .map(|(a, b)| (*a as usize).abs_diff(*b as usize))
                    .sum();
            if (diff, dist) < (best.0, best.1) {
                best = (diff, dist, i);
            }
        }
        best.2
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::spec;

    fn limits() -> Limits {
        Limits::from_device(&kopt_engine::worker::fake::fake_device())
    }

    #[test]
    fn labels_options_and_lookups() {
        let s = spec(
            "tunables = { BLOCK: 256 in [128, 256, 512], VEC: [1, 2, 4] }, constraints = [BLOCK * VEC <= cols]",
            "grid = rows, block = BLOCK",
            &[(8, 1024)],
        );
        let space = Space::build(&s, &limits(), &OptionAxes::standard()).unwrap();
        assert_eq!(
            space
                .axes
                .iter()
                .map(|a| a.name.as_str())
                .collect::<Vec<_>>(),
            [
                "BLOCK",
                "VEC",
                "fast-math",
                "extra-device-vectorization",
                "maxrregcount"
            ]
        );
        let d = space.default_point().unwrap();
        assert_eq!(space.label(d), "BLOCK=256 VEC=1");
        assert!(space.options(d).is_empty());
        let mut v = space.values(d);
        v.insert("fast-math".into(), 1);
        v.insert("maxrregcount".into(), 64);
        let id = space.find(&v).unwrap();
        assert_eq!(space.label(id), "BLOCK=256 VEC=1 fast-math maxrregcount=64");
        assert_eq!(space.options(id), ["--use_fast_math", "--maxrregcount=64"]);
        assert_eq!(space.defines(id).get("BLOCK"), Some(&256));
        assert!(space.allowed(id));
        let fm = space.axis("fast-math").unwrap();
        let mut banned = space.clone();
        banned.ban(fm, 1);
        assert!(!banned.allowed(id) && banned.allowed(d));
    }
}
