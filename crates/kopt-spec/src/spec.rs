//! [`KernelSpec`]: everything kopt needs to compile, launch, verify and measure a kernel,
//! parsed from a `#[kopt::kernel(...)]` attribute and the launcher's signature.
//!
//! The macro and `cargo kopt` both call [`parse_kernel`]; there is no second parser.

use std::collections::BTreeMap;
use std::fmt;

use proc_macro2::{Span, TokenStream};
use serde::{Deserialize, Serialize};
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{braced, bracketed, parenthesized, Ident, LitStr, Token};

use crate::expr::{self, Expr, Ty, VarKind};
use crate::tensor_map::{self, Evaluated, TensorMapArgs, TensorMapDecl, MAX_RANK};

/// The element type of a device buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F64,
    F32,
    F16,
    Bf16,
    I64,
    I32,
    I16,
    I8,
    U64,
    U32,
    U16,
    U8,
}

impl DType {
    pub const ALL: &'static [DType] = &[
        DType::F64,
        DType::F32,
        DType::F16,
        DType::Bf16,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U64,
        DType::U32,
        DType::U16,
        DType::U8,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::U64 => "u64",
            DType::U32 => "u32",
            DType::U16 => "u16",
            DType::U8 => "u8",
        }
    }

    pub fn from_name(s: &str) -> Option<DType> {
        Self::ALL.iter().copied().find(|d| d.name() == s)
    }

    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::Bf16 | DType::I16 | DType::U16 => 2,
            DType::I8 | DType::U8 => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F64 | DType::F32 | DType::F16 | DType::Bf16)
    }

    /// The unit roundoff of values stored as this type (half the distance from 1 to the
    /// next value); 0 for integers, which compare exactly.
    pub fn unit_roundoff(self) -> f64 {
        match self {
            DType::F64 => f64::EPSILON / 2.0,
            DType::F32 => f32::EPSILON as f64 / 2.0,
            // 2^-10 and 2^-7: the distances from 1 to the next f16 and bf16.
            DType::F16 => 0.0009765625 / 2.0,
            DType::Bf16 => 0.0078125 / 2.0,
            _ => 0.0,
        }
    }

    /// The unit roundoff of the arithmetic that produced an output of this type: fp32 for
    /// fp32, fp16 and bf16 outputs (half-precision kernels accumulate in fp32, and a floor
    /// from fp16's own roundoff would pass the fp16 accumulation the numeric fence exists
    /// to reject), fp64 for fp64; 0 for integers.
    pub fn accumulation_unit_roundoff(self) -> f64 {
        match self {
            DType::F64 => f64::EPSILON / 2.0,
            DType::F32 | DType::F16 | DType::Bf16 => f32::EPSILON as f64 / 2.0,
            _ => 0.0,
        }
    }

    /// Whether an element of this type holds the integer `v` exactly: within the range of
    /// an integer type, or with few enough significant bits (and a small enough exponent)
    /// for a float type. Fixed contents (`values(...)`) must arrive as written.
    pub fn holds_exactly(self, v: i64) -> bool {
        let (significand, max_bit) = match self {
            DType::F64 => (53, 1023),
            DType::F32 => (24, 127),
            DType::Bf16 => (8, 127),
            DType::F16 => (11, 15),
            DType::I64 => return true,
            DType::U64 => return v >= 0,
            DType::I32 => return i32::try_from(v).is_ok(),
            DType::U32 => return u32::try_from(v).is_ok(),
            DType::I16 => return i16::try_from(v).is_ok(),
            DType::U16 => return u16::try_from(v).is_ok(),
            DType::I8 => return i8::try_from(v).is_ok(),
            DType::U8 => return u8::try_from(v).is_ok(),
        };
        let a = v.unsigned_abs();
        if a == 0 {
            return true;
        }
        let top = 63 - a.leading_zeros();
        let bits = top + 1 - a.trailing_zeros();
        bits <= significand && top <= max_bit
    }

    /// The default tolerance for outputs of this type (DESIGN.md §4).
    pub fn default_tolerance(self) -> Tolerance {
        match self {
            DType::F64 => Tolerance {
                rtol: 1e-9,
                atol: 1e-12,
            },
            DType::F32 => Tolerance {
                rtol: 1e-4,
                atol: 1e-5,
            },
            DType::F16 | DType::Bf16 => Tolerance {
                rtol: 1e-2,
                atol: 1e-2,
            },
            _ => Tolerance {
                rtol: 0.0,
                atol: 0.0,
            },
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The type of a scalar argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScalarTy {
    I32,
    U32,
    I64,
    U64,
    Usize,
    F32,
    F64,
}

impl ScalarTy {
    const ALL: &'static [(&'static str, ScalarTy)] = &[
        ("i32", ScalarTy::I32),
        ("u32", ScalarTy::U32),
        ("i64", ScalarTy::I64),
        ("u64", ScalarTy::U64),
        ("usize", ScalarTy::Usize),
        ("f32", ScalarTy::F32),
        ("f64", ScalarTy::F64),
    ];

    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|(_, t)| *t == self).unwrap().0
    }

    pub fn is_float(self) -> bool {
        matches!(self, ScalarTy::F32 | ScalarTy::F64)
    }

    pub fn from_name(s: &str) -> Option<ScalarTy> {
        Self::ALL.iter().find(|(n, _)| *n == s).map(|(_, t)| *t)
    }

    /// Whether an integer type holds `v` (`usize` is 64 bits, as on every CUDA host).
    /// Float types hold every integer an expression can give, rounded.
    pub fn holds(self, v: i64) -> bool {
        match self {
            ScalarTy::I32 => i32::try_from(v).is_ok(),
            ScalarTy::U32 => u32::try_from(v).is_ok(),
            ScalarTy::I64 => true,
            ScalarTy::U64 | ScalarTy::Usize => v >= 0,
            ScalarTy::F32 | ScalarTy::F64 => true,
        }
    }
}

/// How a buffer is used by the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    In,
    Out,
    InOut,
}

/// How verification fills an input buffer. Bounds are expressions of the scalars.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum Distribution {
    /// Normal with the given mean and standard deviation (floats; the default N(0, 1)).
    Normal { mean: f64, std: f64 },
    /// Uniform over `[lo, hi)` (floats).
    Uniform { lo: f64, hi: f64 },
    /// Integers uniform over `[lo, hi)`: indices into other buffers, such as a paged KV
    /// cache's block table.
    Range { lo: Expr, hi: Expr },
    /// Integers spread evenly over `[lo, hi)` in an order drawn from the seed: element `i`
    /// of the unshuffled list is `lo + floor(i * (hi - lo) / len)`. Every draw holds the
    /// same values, so sums over them are known from the scalars; with `len == hi - lo`
    /// it is a permutation (a block table whose sequences share no page).
    Spread { lo: Expr, hi: Expr },
    /// Fixed contents, one expression of the scalars per element (a dims-and-strides
    /// array): the same for every seed and variation, so only the shape changes them.
    /// Integer expressions; a float buffer holds them converted (exactly, or the spec is
    /// refused).
    Values { values: Vec<Expr> },
}

/// Combined tolerance of an output. Verification passes an element when
/// `|a - b| <= atol + rtol * max(|b|, rms)`, `rms` being that of the reference's values in
/// the element's row (the last dimension of the buffer's declared length, or the whole
/// buffer when the length is not a product), or within the computation's estimated
/// rounding noise where that is larger (`kopt_engine::compare::compare` states the rule).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    pub name: String,
    pub dtype: DType,
    /// Number of elements, an expression of the integer scalars.
    pub len: Expr,
    pub direction: Direction,
    /// Present for inputs (`in` and `inout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distribution: Option<Distribution>,
    /// Present for outputs when the spec overrides the dtype default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<Tolerance>,
}

impl Buffer {
    /// The fixed contents of a `values(...)` buffer for a shape (`args` in scalar order);
    /// `None` for a buffer drawn at random. An error names what is wrong: an expression
    /// that cannot be evaluated, fewer or more values than the buffer's length, or a value
    /// the element type cannot hold exactly.
    pub fn fixed_values(
        &self,
        spec: &KernelSpec,
        args: &[i64],
    ) -> Option<Result<Vec<i64>, String>> {
        let Some(Distribution::Values { values }) = &self.distribution else {
            return None;
        };
        let run = || -> Result<Vec<i64>, String> {
            let eval = |e: &Expr| -> Result<i64, String> {
                let p = spec.compile_expr(e, &BTreeMap::new())?;
                expr::eval(&p, args).map_err(|err| format!("`{}`: value `{e}`: {err}", self.name))
            };
            let len = eval(&self.len)?;
            if len != values.len() as i64 {
                return Err(format!(
                    "buffer `{}` has {} values but its length `{}` is {len}: give one value per element, for every shape",
                    self.name,
                    values.len(),
                    self.len
                ));
            }
            let out = values
                .iter()
                .map(eval)
                .collect::<Result<Vec<i64>, String>>()?;
            if let Some((i, v)) = out
                .iter()
                .enumerate()
                .find(|(_, v)| !self.dtype.holds_exactly(**v))
            {
                return Err(format!(
                    "buffer `{}`: value {} (`{}`) is {v}, which {} cannot hold exactly",
                    self.name,
                    i + 1,
                    values[i],
                    self.dtype
                ));
            }
            Ok(out)
        };
        Some(run())
    }

    /// The tolerance verification applies to this output.
    pub fn effective_tolerance(&self, spec: &KernelSpec) -> Tolerance {
        self.tolerance
            .or(spec.tolerance)
            .unwrap_or_else(|| self.dtype.default_tolerance())
    }

    pub fn is_output(&self) -> bool {
        self.direction != Direction::In
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scalar {
    pub name: String,
    pub ty: ScalarTy,
}

/// One kernel argument, in launch order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "param")]
pub enum Param {
    Buffer(Buffer),
    Scalar(Scalar),
}

impl Param {
    pub fn name(&self) -> &str {
        match self {
            Param::Buffer(b) => &b.name,
            Param::Scalar(s) => &s.name,
        }
    }
}

/// One argument of the kernel, when the annotation lists them (`args = (...)`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "arg")]
pub enum KernelArg {
    /// A launcher parameter, passed as the launcher receives it.
    Param { name: String },
    /// An integer the launcher computes for every launch.
    Computed(ComputedArg),
    /// A TMA tensor map of `tensor_maps`, encoded by the launcher, passed by value.
    Map { name: String },
}

/// A kernel argument computed by the launcher: `block_size: i32 = block_x`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComputedArg {
    /// The argument's name, for people (kernel arguments are positional).
    pub name: String,
    /// An integer type.
    pub ty: ScalarTy,
    /// An expression of the integer scalars, the tunables (a version's own defines replace
    /// them) and the version's launch geometry ([`GEOMETRY_NAMES`]).
    pub value: Expr,
}

/// Most entries a launch's pool holds ([`KernelSpec::pool_index`]): parameters, computed
/// arguments and tensor maps together. Each version's arguments are some of them.
pub const MAX_LAUNCH_ARGS: usize = 64;

/// The names a computed argument's expression may use for the launch geometry of the
/// version that runs: its launch rule evaluated for the shape (`cluster_*` is 1 where the
/// rule sets no cluster; `smem` is the dynamic shared memory in bytes).
pub const GEOMETRY_NAMES: &[&str] = &[
    "grid_x",
    "grid_y",
    "grid_z",
    "block_x",
    "block_y",
    "block_z",
    "cluster_x",
    "cluster_y",
    "cluster_z",
    "smem",
];

/// One kernel argument, resolved against the spec: what [`KernelSpec::kernel_args`] gives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArgRef<'a> {
    /// A device buffer: its index in [`KernelSpec::params`] and among the buffers.
    Buffer {
        param: usize,
        buffer: usize,
        def: &'a Buffer,
    },
    /// A launcher scalar: its index in [`KernelSpec::params`].
    Scalar { param: usize, def: &'a Scalar },
    /// A computed argument: its index among the computed arguments.
    Computed { index: usize, def: &'a ComputedArg },
    /// A tensor map: its index in [`KernelSpec::tensor_maps`].
    TensorMap {
        index: usize,
        def: &'a TensorMapDecl,
    },
}

impl<'a> KernelArgRef<'a> {
    pub fn name(&self) -> &'a str {
        match self {
            KernelArgRef::Buffer { def, .. } => &def.name,
            KernelArgRef::Scalar { def, .. } => &def.name,
            KernelArgRef::Computed { def, .. } => &def.name,
            KernelArgRef::TensorMap { def, .. } => &def.name,
        }
    }
}

/// A kernel argument's value for one launch of one version.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ArgValue {
    /// The device pointer of buffer number N (in [`KernelSpec::buffers`] order).
    Buffer(usize),
    /// A scalar of this type.
    Scalar(ScalarTy, Number),
    /// Tensor map number `index` (in [`KernelSpec::tensor_maps`] order) over a buffer:
    /// `cuTensorMapEncodeTiled`'s arguments but the address.
    TensorMap { index: usize, args: TensorMapArgs },
}

/// A scalar's value in a shape: integers for sizes, floats for things like `eps`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Number {
    Int(i64),
    Float(f64),
}

impl Number {
    pub fn as_i64(self) -> Option<i64> {
        match self {
            Number::Int(i) => Some(i),
            Number::Float(_) => None,
        }
    }

    pub fn as_f64(self) -> f64 {
        match self {
            Number::Int(i) => i as f64,
            Number::Float(f) => f,
        }
    }
}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Number::Int(i) => write!(f, "{i}"),
            Number::Float(x) => write!(f, "{x:?}"),
        }
    }
}

/// A real problem shape: a value for every scalar argument.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shape {
    /// Values in scalar-argument order (defaults filled in).
    pub values: BTreeMap<String, Number>,
    /// Relative importance in summaries (default 1).
    pub weight: f64,
}

/// A preprocessor define the search may vary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tunable {
    pub name: String,
    pub values: Vec<i64>,
    /// The value the reference kernel is built and launched with.
    pub default: i64,
}

/// Launch geometry: expressions of the integer scalars and tunables.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaunchRule {
    pub grid: [Expr; 3],
    pub block: [Expr; 3],
    pub smem: Expr,
    /// Thread-block cluster dimensions set at launch (sm_90+), in blocks; each must divide
    /// the grid's. Absent, or all 1 for a shape, is a launch without the attribute, so a
    /// kernel compiled with `__cluster_dims__` keeps its own. A shape-dependent cluster
    /// lets one kernel run in clusters where it needs them and unconstrained elsewhere: a
    /// compile-time cluster binds the block scheduler for every launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<[Expr; 3]>,
}

impl LaunchRule {
    /// The expression behind a name of [`GEOMETRY_NAMES`] (`block_x` is `block[0]`).
    pub fn geometry_expr(&self, name: &str) -> Option<Expr> {
        if name == "smem" {
            return Some(self.smem.clone());
        }
        let (what, axis) = name.split_once('_')?;
        let i = ["x", "y", "z"].iter().position(|a| *a == axis)?;
        match what {
            "grid" => Some(self.grid[i].clone()),
            "block" => Some(self.block[i].clone()),
            "cluster" => Some(self.cluster.as_ref().map_or(Expr::Int(1), |c| c[i].clone())),
            _ => None,
        }
    }

    /// Every expression of the rule with what it sets: `grid`, `block`, `smem`, `cluster`.
    pub fn exprs(&self) -> impl Iterator<Item = (&'static str, &Expr)> {
        self.grid
            .iter()
            .map(|e| ("grid", e))
            .chain(self.block.iter().map(|e| ("block", e)))
            .chain(std::iter::once(("smem", &self.smem)))
            .chain(self.cluster.iter().flatten().map(|e| ("cluster", e)))
    }
}

/// Why cluster dimensions `cluster` cannot launch over `grid`: a zero dimension, or one
/// that does not divide the grid's (the driver would refuse the launch).
pub fn cluster_problem(grid: [i64; 3], cluster: [i64; 3]) -> Option<String> {
    if cluster.iter().any(|c| *c <= 0) {
        return Some(format!("cluster {cluster:?} has a dimension below 1"));
    }
    (0..3).find(|&i| grid[i] % cluster[i] != 0).map(|i| {
        format!(
            "grid {grid:?} is not a whole number of clusters {cluster:?} (dimension {}): round the grid up to a multiple of the cluster",
            ["x", "y", "z"][i]
        )
    })
}

/// The cluster a launch over `grid` uses (`[1, 1, 1]` when its rule sets none), or why
/// the rule's cluster cannot launch over that grid ([`cluster_problem`]).
pub fn launch_cluster(grid: [u32; 3], cluster: Option<[u32; 3]>) -> Result<[u32; 3], String> {
    let cluster = cluster.unwrap_or([1; 3]);
    match cluster_problem(grid.map(i64::from), cluster.map(i64::from)) {
        Some(problem) => Err(problem),
        None => Ok(cluster),
    }
}

/// The whole annotation, normalised. Serialised (JSON) it is what the spec hash covers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelSpec {
    /// The launcher's name: the kernel's name in kopt's files and commands.
    pub name: String,
    /// Path of the CUDA C++ source, relative to the crate root.
    pub reference: String,
    /// The `extern "C" __global__` entry point.
    pub entry: String,
    /// The launcher's parameters after the stream, in order: the names expressions read.
    /// Without `args` they are also the kernel's arguments; with it, see
    /// [`Self::kernel_args`] (the one meaning of "the kernel's arguments").
    pub params: Vec<Param>,
    /// The kernel's arguments in order, when they are not the launcher's parameters: the
    /// launcher scalars it leaves out are launch-only, and computed ones are evaluated at
    /// each launch. Absent: every parameter, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<KernelArg>>,
    pub launch: LaunchRule,
    pub shapes: Vec<Shape>,
    /// Ideal bytes moved (each input read once, each output written once).
    pub bytes: Expr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flops: Option<Expr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<Tolerance>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tunables: Vec<Tunable>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<Expr>,
    /// NVRTC options of the reference build.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Folders (relative to the crate root) searched for `#include "..."`; the reference's
    /// own folder is always searched first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    /// TMA tensor maps over the buffers, which a version may take as arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensor_maps: Vec<TensorMapDecl>,
}

impl KernelSpec {
    pub fn buffers(&self) -> impl Iterator<Item = &Buffer> {
        self.params.iter().filter_map(|p| match p {
            Param::Buffer(b) => Some(b),
            _ => None,
        })
    }

    pub fn scalars(&self) -> impl Iterator<Item = &Scalar> {
        self.params.iter().filter_map(|p| match p {
            Param::Scalar(s) => Some(s),
            _ => None,
        })
    }

    /// Names bound in expressions, in slot order: every scalar parameter of the launcher
    /// (floats included, so indices match the parameter order; launch-only ones too).
    pub fn scalar_names(&self) -> Vec<&str> {
        self.scalars().map(|s| s.name.as_str()).collect()
    }

    /// The reference's arguments in launch order: the launcher's parameters named in
    /// `args`, the computed ones and tensor maps, or every parameter when `args` is
    /// absent. Everything that launches the reference, or describes its signature, reads
    /// this; a variant's own list is [`Self::version_args`].
    pub fn kernel_args(&self) -> Vec<KernelArgRef<'_>> {
        let param = |i: usize| self.param_arg(i);
        let Some(list) = &self.args else {
            return (0..self.params.len()).map(param).collect();
        };
        let mut computed = 0;
        list.iter()
            .map(|a| match a {
                KernelArg::Param { name } => param(
                    self.params
                        .iter()
                        .position(|p| p.name() == name)
                        .unwrap_or_else(|| {
                            panic!("`args` names `{name}`, which is not a parameter (the parser refuses such a spec)")
                        }),
                ),
                KernelArg::Computed(c) => {
                    computed += 1;
                    KernelArgRef::Computed {
                        index: computed - 1,
                        def: c,
                    }
                }
                KernelArg::Map { name } => self
                    .tensor_map_arg(name)
                    .expect("the parser refuses `args` naming an undeclared tensor map"),
            })
            .collect()
    }

    fn param_arg(&self, i: usize) -> KernelArgRef<'_> {
        match &self.params[i] {
            Param::Buffer(b) => KernelArgRef::Buffer {
                param: i,
                buffer: self.params[..i]
                    .iter()
                    .filter(|p| matches!(p, Param::Buffer(_)))
                    .count(),
                def: b,
            },
            Param::Scalar(s) => KernelArgRef::Scalar { param: i, def: s },
        }
    }

    fn tensor_map_arg(&self, name: &str) -> Option<KernelArgRef<'_>> {
        self.tensor_maps
            .iter()
            .position(|m| m.name == name)
            .map(|index| KernelArgRef::TensorMap {
                index,
                def: &self.tensor_maps[index],
            })
    }

    /// A version's arguments in launch order: `names` as a variant lists them (launcher
    /// parameters, the annotation's computed arguments, tensor maps), or the reference's
    /// ([`Self::kernel_args`]) when it lists none. Every buffer must be reached, directly
    /// or through a map, and no name twice.
    pub fn version_args(&self, names: Option<&[String]>) -> Result<Vec<KernelArgRef<'_>>, String> {
        let Some(names) = names else {
            return Ok(self.kernel_args());
        };
        let mut out: Vec<KernelArgRef<'_>> = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(format!(
                    "`{name}` is listed twice in the variant's arguments"
                ));
            }
            let arg = if let Some(p) = self.params.iter().position(|p| p.name() == name) {
                self.param_arg(p)
            } else if let Some(m) = self.tensor_map_arg(name) {
                m
            } else if let Some((index, def)) = self
                .computed_args()
                .enumerate()
                .find(|(_, c)| c.name == *name)
            {
                KernelArgRef::Computed { index, def }
            } else {
                let known: Vec<String> = self
                    .params
                    .iter()
                    .map(|p| p.name().to_string())
                    .chain(self.computed_args().map(|c| c.name.clone()))
                    .chain(self.tensor_maps.iter().map(|m| m.name.clone()))
                    .collect();
                let hint = expr::closest(name, &known)
                    .map(|c| format!("; did you mean `{c}`?"))
                    .unwrap_or_default();
                return Err(format!(
                    "the variant's arguments name `{name}`, which is not a parameter, computed argument or tensor map of `{}`{hint} (known: {})",
                    self.name,
                    known.join(", ")
                ));
            };
            out.push(arg);
        }
        for b in self.buffers() {
            let reached = out.iter().any(|a| match a {
                KernelArgRef::Buffer { def, .. } => def.name == b.name,
                KernelArgRef::TensorMap { def, .. } => def.buffer == b.name,
                _ => false,
            });
            if !reached {
                return Err(format!(
                    "the variant's arguments do not reach buffer `{}`: list it, or a tensor map over it",
                    b.name
                ));
            }
        }
        Ok(out)
    }

    /// Where an argument sits in the launch's pool, the one order every version's
    /// arguments are picked from: the launcher's parameters in order, then the computed
    /// arguments, then the tensor maps.
    pub fn pool_index(&self, a: &KernelArgRef<'_>) -> usize {
        let computed = self.computed_args().count();
        match a {
            KernelArgRef::Buffer { param, .. } | KernelArgRef::Scalar { param, .. } => *param,
            KernelArgRef::Computed { index, .. } => self.params.len() + index,
            KernelArgRef::TensorMap { index, .. } => self.params.len() + computed + index,
        }
    }

    /// Why a version taking `names` (its argument list) built with `defines` cannot take
    /// its tensor maps for the scalar arguments `args`: the first map that does not encode.
    /// `None`: it can. The launcher runs the reference where a variant cannot
    /// (`kopt::Kernel`'s choice), and so does the CLI's choice of version
    /// ([`crate::selection::applies`]).
    pub fn maps_problem(
        &self,
        names: Option<&[String]>,
        defines: &BTreeMap<String, i64>,
        args: &[i64],
    ) -> Option<String> {
        let taken = self.version_args(names).ok()?;
        taken.iter().find_map(|a| match a {
            KernelArgRef::TensorMap { index, .. } => {
                self.tensor_map_args(*index, defines, args).err()
            }
            _ => None,
        })
    }

    /// The size of the launch's pool ([`Self::pool_index`]).
    pub fn pool_len(&self) -> usize {
        self.params.len() + self.computed_args().count() + self.tensor_maps.len()
    }

    /// A tensor map's fields evaluated for a version (its defines and launch rule, as for
    /// computed arguments) over the scalar arguments `args`, checked against the driver's
    /// rules and the buffer's length.
    pub fn tensor_map_args(
        &self,
        index: usize,
        defines: &BTreeMap<String, i64>,
        args: &[i64],
    ) -> Result<TensorMapArgs, String> {
        let m = &self.tensor_maps[index];
        let (buffer, def) = self
            .buffers()
            .enumerate()
            .find(|(_, b)| b.name == m.buffer)
            .expect("the parser refuses a map over an unknown buffer");
        let eval_list = |list: &[Expr], out: &mut [i64; MAX_RANK]| -> Result<usize, String> {
            for (i, e) in list.iter().enumerate() {
                let p = self.compile_expr(e, defines)?;
                out[i] = expr::eval(&p, args)
                    .map_err(|err| format!("tensor map `{}`: `{e}`: {err}", m.name))?;
            }
            Ok(list.len())
        };
        let (mut d, mut s, mut b, mut es) =
            ([0; MAX_RANK], [0; MAX_RANK], [0; MAX_RANK], [1; MAX_RANK]);
        let rank = eval_list(&m.dims, &mut d)?;
        let ns = eval_list(m.strides.as_deref().unwrap_or(&[]), &mut s)?;
        eval_list(&m.box_dims, &mut b)?;
        eval_list(m.element_strides.as_deref().unwrap_or(&[]), &mut es)?;
        let t = TensorMapArgs::new(
            m,
            buffer,
            def.dtype,
            Evaluated {
                dims: &d[..rank],
                strides: &s[..ns],
                box_dims: &b[..rank],
                element_strides: &es[..rank],
            },
        )?;
        let len = expr::eval(&self.compile_expr(&def.len, &BTreeMap::new())?, args)
            .map_err(|e| format!("`{}`: {e}", def.name))?;
        t.check_extent(&m.name, &def.name, len.max(0) as u64)?;
        Ok(t)
    }

    /// The computed kernel arguments, in order.
    pub fn computed_args(&self) -> impl Iterator<Item = &ComputedArg> {
        self.args.iter().flatten().filter_map(|a| match a {
            KernelArg::Computed(c) => Some(c),
            KernelArg::Param { .. } | KernelArg::Map { .. } => None,
        })
    }

    /// Launcher scalars the kernel is not given: they drive lengths, geometry and
    /// computed arguments only.
    pub fn launch_only(&self) -> impl Iterator<Item = &Scalar> {
        self.scalars().filter(|s| match &self.args {
            None => false,
            Some(list) => !list
                .iter()
                .any(|a| matches!(a, KernelArg::Param { name } if *name == s.name)),
        })
    }

    /// A computed argument's program for a version with launch rule `launch` built with
    /// `defines`: its geometry names replaced by that rule's expressions, its tunables by
    /// the defines. Evaluated over the scalar arguments, like the launch rule.
    pub fn computed_program(
        &self,
        c: &ComputedArg,
        launch: &LaunchRule,
        defines: &BTreeMap<String, i64>,
    ) -> Result<Vec<expr::Op>, String> {
        let e = c.value.substitute(&|n| {
            GEOMETRY_NAMES
                .contains(&n)
                .then(|| launch.geometry_expr(n))
                .flatten()
        });
        self.compile_expr(&e, defines)
            .map_err(|m| format!("computed argument `{}` = `{}`: {m}", c.name, c.value))
    }

    /// The kernel's argument values for one launch of a version (its argument list,
    /// launch rule and defines) on a shape: buffers by index, launcher scalars from the
    /// shape, computed ones evaluated and checked against their type, tensor maps
    /// evaluated and checked ([`Self::tensor_map_args`]).
    pub fn kernel_arg_values(
        &self,
        names: Option<&[String]>,
        launch: &LaunchRule,
        defines: &BTreeMap<String, i64>,
        values: &BTreeMap<String, Number>,
    ) -> Result<Vec<ArgValue>, String> {
        let args = self.value_args(values);
        self.version_args(names)?
            .into_iter()
            .map(|a| match a {
                KernelArgRef::Buffer { buffer, .. } => Ok(ArgValue::Buffer(buffer)),
                KernelArgRef::Scalar { def, .. } => Ok(ArgValue::Scalar(
                    def.ty,
                    values.get(&def.name).copied().unwrap_or(Number::Int(0)),
                )),
                KernelArgRef::Computed { def, .. } => {
                    let p = self.computed_program(def, launch, defines)?;
                    let v = expr::eval(&p, &args).map_err(|e| {
                        format!("computed argument `{}` = `{}`: {e}", def.name, def.value)
                    })?;
                    if !def.ty.holds(v) {
                        return Err(format!(
                            "computed argument `{}` = `{}` is {v}, outside the range of {}",
                            def.name,
                            def.value,
                            def.ty.name()
                        ));
                    }
                    Ok(ArgValue::Scalar(def.ty, Number::Int(v)))
                }
                KernelArgRef::TensorMap { index, .. } => Ok(ArgValue::TensorMap {
                    index,
                    args: self.tensor_map_args(index, defines, &args)?,
                }),
            })
            .collect()
    }

    /// The reference build's defines: each tunable at its default.
    pub fn default_defines(&self) -> BTreeMap<String, i64> {
        self.tunables
            .iter()
            .map(|t| (t.name.clone(), t.default))
            .collect()
    }

    /// The reference's compile options: defines first, then the declared options.
    pub fn reference_options(&self) -> Vec<String> {
        define_options(&self.default_defines())
            .chain(self.options.iter().cloned())
            .collect()
    }

    /// Compiles an expression of this spec with the given define values substituted.
    /// Scalars map to their argument index.
    pub fn compile_expr(
        &self,
        e: &Expr,
        defines: &BTreeMap<String, i64>,
    ) -> Result<Vec<expr::Op>, String> {
        let scalars = self.scalar_names();
        e.compile(&|n| {
            if let Some(i) = scalars.iter().position(|s| *s == n) {
                Some(expr::Slot::Index(i as u16))
            } else {
                defines.get(n).map(|v| expr::Slot::Const(*v))
            }
        })
    }

    /// Integer values of a shape, in scalar order (floats as 0: expressions never read them).
    pub fn shape_args(&self, shape: &Shape) -> Vec<i64> {
        self.value_args(&shape.values)
    }

    /// [`Self::shape_args`] of a shape's values.
    pub fn value_args(&self, values: &BTreeMap<String, Number>) -> Vec<i64> {
        self.scalars()
            .map(|s| values.get(&s.name).and_then(|v| v.as_i64()).unwrap_or(0))
            .collect()
    }

    /// What an identifier names in this spec's expressions (scalars, then tunables).
    pub fn var_kind(&self, name: &str) -> Option<VarKind> {
        self.var_kind_with(name, &[])
    }

    /// Like [`Self::var_kind`], with extra integer names (a variant's own defines).
    pub fn var_kind_with(&self, name: &str, extra: &[&str]) -> Option<VarKind> {
        if let Some(s) = self.scalars().find(|s| s.name == name) {
            return Some(if s.ty.is_float() {
                VarKind::Float
            } else {
                VarKind::Int
            });
        }
        if self.tunables.iter().any(|t| t.name == name) || extra.contains(&name) {
            return Some(VarKind::Int);
        }
        None
    }

    /// Integer names usable in expressions, for error hints.
    pub fn int_names(&self) -> Vec<String> {
        self.scalars()
            .filter(|s| !s.ty.is_float())
            .map(|s| s.name.clone())
            .chain(self.tunables.iter().map(|t| t.name.clone()))
            .collect()
    }

    /// Where a version built with `defines` may run: its claimed `region` (text and
    /// predicate over the scalar arguments) and every constraint that names both a scalar
    /// argument and a tunable, under those defines. A variant built with `VEC = 2` must not
    /// run where `cols % VEC == 0` fails, though the reference, built with `VEC = 1`, may:
    /// its verification drew no such shape. `None`: every shape. The text is for people
    /// (`cols % VEC == 0 with VEC = 2`); compile the predicate with `defines`.
    pub fn variant_applies(
        &self,
        region: Option<(&str, &Expr)>,
        defines: &BTreeMap<String, i64>,
    ) -> Option<(String, Expr)> {
        let scalars = self.scalar_names();
        let is_tunable = |v: &str| self.tunables.iter().any(|t| t.name == v);
        let build_dependent: Vec<&Expr> = self
            .constraints
            .iter()
            .filter(|c| {
                let vars = c.vars();
                vars.iter().any(|v| scalars.contains(v)) && vars.iter().any(|v| is_tunable(v))
            })
            .collect();
        let mut texts: Vec<String> = region.iter().map(|(t, _)| t.to_string()).collect();
        let mut parts: Vec<Expr> = region.iter().map(|(_, e)| (*e).clone()).collect();
        let mut named: BTreeMap<&str, i64> = BTreeMap::new();
        for c in build_dependent {
            texts.push(c.to_string());
            parts.push(c.clone());
            for v in c.vars() {
                if let (true, Some(d)) = (is_tunable(v), defines.get(v)) {
                    named.insert(v, *d);
                }
            }
        }
        let predicate = parts
            .into_iter()
            .reduce(|a, b| Expr::Binary(expr::BinOp::And, Box::new(a), Box::new(b)))?;
        let mut text = texts.join(" && ");
        if !named.is_empty() {
            let values: Vec<String> = named.iter().map(|(n, v)| format!("{n} = {v}")).collect();
            text = format!("{text} with {}", values.join(", "));
        }
        Some((text, predicate))
    }

    /// Parses a shape-region predicate (as written in a lock file) against this spec:
    /// only scalar arguments may appear.
    pub fn parse_region(&self, text: &str) -> Result<Expr, String> {
        let names: Vec<String> = self
            .scalars()
            .filter(|s| !s.ty.is_float())
            .map(|s| s.name.clone())
            .collect();
        let vars = |n: &str| {
            self.scalars().find(|s| s.name == n).map(|s| {
                if s.ty.is_float() {
                    VarKind::Float
                } else {
                    VarKind::Int
                }
            })
        };
        expr::parse_str(text, Ty::Bool, &vars, &names)
    }

    /// Whether a region (parsed by [`Self::parse_region`]) holds for these scalar
    /// arguments; one that cannot be evaluated for them (a division by zero) does not.
    pub fn region_holds(&self, region: &Expr, args: &[i64]) -> bool {
        self.compile_expr(region, &BTreeMap::new())
            .ok()
            .and_then(|p| expr::eval(&p, args).ok())
            .is_some_and(|v| v != 0)
    }

    /// Canonical JSON: the input of the spec hash.
    pub fn canonical_json(&self) -> String {
        serde_json::to_string(self).expect("a spec always serialises")
    }
}

/// `-DNAME=VALUE` options for a set of defines, in name order.
pub fn define_options(defines: &BTreeMap<String, i64>) -> impl Iterator<Item = String> + '_ {
    defines.iter().map(|(k, v)| format!("-D{k}={v}"))
}

// =======================================================================================
// Parsing.

/// The parts of the annotated function the generated code needs, beside the spec.
#[derive(Debug, Clone)]
pub struct Launcher {
    pub vis: syn::Visibility,
    pub attrs: Vec<syn::Attribute>,
    pub ident: Ident,
    /// The stream parameter's name.
    pub stream: Ident,
    /// Every parameter after the stream, with its type as written.
    pub params: Vec<(Ident, syn::Type)>,
    /// Where `reference = "..."` was written (errors about the file point there).
    pub reference_span: Span,
    /// Where `entry = "..."` was written, or the function's name.
    pub entry_span: Span,
}

/// Parses `#[kopt::kernel(<args>)]` on `item`. Errors carry the span of the offending token.
pub fn parse_kernel(args: TokenStream, item: &syn::ItemFn) -> syn::Result<(KernelSpec, Launcher)> {
    let opts = Punctuated::<Opt, Token![,]>::parse_terminated.parse2(args)?;
    let launcher = parse_signature(item)?;
    build_spec(opts.into_iter().collect(), &launcher, item)
}

/// The annotated item may be written without a body (`fn f(...);`), which is not a valid
/// `syn::ItemFn`; this parses both forms.
pub fn parse_item(item: TokenStream) -> syn::Result<syn::ItemFn> {
    if let Ok(f) = syn::parse2::<syn::ItemFn>(item.clone()) {
        return Ok(f);
    }
    let f: syn::ForeignItemFn = syn::parse2(item)?;
    Ok(syn::ItemFn {
        attrs: f.attrs,
        vis: f.vis,
        sig: f.sig,
        block: Box::new(syn::parse_quote!({})),
    })
}

enum Opt {
    /// `key = value`
    Key(Ident, TokenStream),
    /// `buffer: [len] modifiers...`
    Buffer(Box<BufferDecl>),
}

struct BufferDecl {
    name: Ident,
    len: syn::Expr,
    direction: Option<(Direction, Span)>,
    distribution: Option<(DistDecl, Span)>,
    tolerance: Option<(Tolerance, Span)>,
}

enum DistDecl {
    Normal(f64, f64),
    Uniform(f64, f64),
    Range(Box<syn::Expr>, Box<syn::Expr>),
    Spread(Box<syn::Expr>, Box<syn::Expr>),
    Values(Vec<syn::Expr>),
}

impl Parse for Opt {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name: Ident = input.call(syn::ext::IdentExt::parse_any)?;
        if input.peek(Token![=]) {
            input.parse::<Token![=]>()?;
            // The value runs to the next top-level comma.
            let mut value = TokenStream::new();
            while !input.is_empty() && !input.peek(Token![,]) {
                let tt: proc_macro2::TokenTree = input.parse()?;
                value.extend([tt]);
            }
            if value.is_empty() {
                return Err(syn::Error::new(
                    name.span(),
                    format!("`{name} =` needs a value"),
                ));
            }
            return Ok(Opt::Key(name, value));
        }
        if input.peek(Token![:]) {
            input.parse::<Token![:]>()?;
            let content;
            let bracket = bracketed!(content in input);
            if content.is_empty() {
                return Err(syn::Error::new(
                    bracket.span.join(),
                    format!("`{name}: []` needs a length, e.g. `{name}: [rows * cols]`"),
                ));
            }
            let len: syn::Expr = content.parse()?;
            let mut decl = BufferDecl {
                name,
                len,
                direction: None,
                distribution: None,
                tolerance: None,
            };
            while !input.is_empty() && !input.peek(Token![,]) {
                parse_buffer_modifier(input, &mut decl)?;
            }
            return Ok(Opt::Buffer(Box::new(decl)));
        }
        Err(syn::Error::new(
            name.span(),
            format!(
                "expected `{name} = ...` (an option) or `{name}: [length]` (a buffer argument)"
            ),
        ))
    }
}

fn parse_buffer_modifier(input: ParseStream, d: &mut BufferDecl) -> syn::Result<()> {
    if input.peek(Token![in]) {
        let t: Token![in] = input.parse()?;
        return set_once(&mut d.direction, (Direction::In, t.span), "direction");
    }
    let word: Ident = input.call(syn::ext::IdentExt::parse_any).map_err(|e| {
        syn::Error::new(
            e.span(),
            "expected a buffer modifier: in, out, inout, normal(..), uniform(..), range(..), spread(..), values(..) or tol(..)",
        )
    })?;
    let span = word.span();
    match word.to_string().as_str() {
        "out" => set_once(&mut d.direction, (Direction::Out, span), "direction"),
        "inout" => set_once(&mut d.direction, (Direction::InOut, span), "direction"),
        "normal" => {
            let (mean, std) = if input.peek(syn::token::Paren) {
                let c;
                parenthesized!(c in input);
                let m = parse_f64(&c)?;
                c.parse::<Token![,]>()?;
                let s = parse_f64(&c)?;
                (m, s)
            } else {
                (0.0, 1.0)
            };
            set_once(&mut d.distribution, (DistDecl::Normal(mean, std), span), "distribution")
        }
        "uniform" => {
            let c;
            parenthesized!(c in input);
            let lo = parse_f64(&c)?;
            c.parse::<Token![..]>()?;
            let hi = parse_f64(&c)?;
            if lo >= hi {
                return Err(syn::Error::new(span, "uniform(lo..hi) needs lo < hi"));
            }
            set_once(&mut d.distribution, (DistDecl::Uniform(lo, hi), span), "distribution")
        }
        word @ ("range" | "spread") => {
            let c;
            parenthesized!(c in input);
            let r: syn::ExprRange = c.parse().map_err(|e| {
                syn::Error::new(
                    e.span(),
                    format!("expected `{word}(lo..hi)` (half-open, expressions of the scalars)"),
                )
            })?;
            let (Some(lo), Some(hi)) = (r.start, r.end) else {
                return Err(syn::Error::new(span, format!("{word}(lo..hi) needs both bounds")));
            };
            if matches!(r.limits, syn::RangeLimits::Closed(_)) {
                return Err(syn::Error::new(span, "write a half-open range `lo..hi`"));
            }
            let decl = if word == "range" {
                DistDecl::Range(lo, hi)
            } else {
                DistDecl::Spread(lo, hi)
            };
            set_once(&mut d.distribution, (decl, span), "distribution")
        }
        "values" => {
            let c;
            let paren = parenthesized!(c in input);
            let list = Punctuated::<syn::Expr, Token![,]>::parse_terminated(&c)?;
            if list.is_empty() {
                return Err(syn::Error::new(
                    paren.span.join(),
                    "`values()` needs the buffer's contents, one expression per element, e.g. `values(rows, cols, cols, 1)`",
                ));
            }
            set_once(
                &mut d.distribution,
                (DistDecl::Values(list.into_iter().collect()), span),
                "distribution",
            )
        }
        "tol" => {
            let c;
            parenthesized!(c in input);
            let t = parse_tolerance_fields(&c, span)?;
            set_once(&mut d.tolerance, (t, span), "tolerance")
        }
        other => Err(syn::Error::new(
            span,
            format!(
                "unknown buffer modifier `{other}`; expected in, out, inout, normal(mean, std), uniform(lo..hi), range(lo..hi), spread(lo..hi), values(a, b, ..) or tol(rtol = .., atol = ..)"
            ),
        )),
    }
}

fn set_once<T>(slot: &mut Option<(T, Span)>, v: (T, Span), what: &str) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(v.1, format!("the {what} is given twice")));
    }
    *slot = Some(v);
    Ok(())
}

fn parse_f64(input: ParseStream) -> syn::Result<f64> {
    let neg = input.peek(Token![-]);
    if neg {
        input.parse::<Token![-]>()?;
    }
    let v = if input.peek(syn::LitFloat) {
        input.parse::<syn::LitFloat>()?.base10_parse::<f64>()?
    } else if input.peek(syn::LitInt) {
        input.parse::<syn::LitInt>()?.base10_parse::<f64>()?
    } else {
        return Err(input.error("expected a number"));
    };
    Ok(if neg { -v } else { v })
}

fn parse_number(input: ParseStream) -> syn::Result<Number> {
    let neg = input.peek(Token![-]);
    if neg {
        input.parse::<Token![-]>()?;
    }
    let sign = if neg { -1 } else { 1 };
    if input.peek(syn::LitFloat) {
        let v = input.parse::<syn::LitFloat>()?.base10_parse::<f64>()?;
        Ok(Number::Float(sign as f64 * v))
    } else if input.peek(syn::LitInt) {
        let v = input.parse::<syn::LitInt>()?.base10_parse::<i64>()?;
        Ok(Number::Int(sign * v))
    } else {
        Err(input.error("expected a number"))
    }
}

fn parse_tolerance_fields(c: ParseStream, span: Span) -> syn::Result<Tolerance> {
    let mut rtol = None;
    let mut atol = None;
    while !c.is_empty() {
        let k: Ident = c.parse()?;
        if !(c.peek(Token![=]) || c.peek(Token![:])) {
            return Err(c.error("expected `=` or `:`"));
        }
        if c.peek(Token![=]) {
            c.parse::<Token![=]>()?;
        } else {
            c.parse::<Token![:]>()?;
        }
        let v = parse_f64(c)?;
        if v < 0.0 {
            return Err(syn::Error::new(k.span(), "a tolerance cannot be negative"));
        }
        match k.to_string().as_str() {
            "rtol" => rtol = Some(v),
            "atol" => atol = Some(v),
            other => {
                return Err(syn::Error::new(
                    k.span(),
                    format!("unknown tolerance field `{other}`; expected `rtol` and/or `atol`"),
                ))
            }
        }
        if !c.is_empty() {
            c.parse::<Token![,]>()?;
        }
    }
    if rtol.is_none() && atol.is_none() {
        return Err(syn::Error::new(span, "give `rtol`, `atol` or both"));
    }
    Ok(Tolerance {
        rtol: rtol.unwrap_or(0.0),
        atol: atol.unwrap_or(0.0),
    })
}

const KEYS: &[&str] = &[
    "reference",
    "entry",
    "grid",
    "block",
    "smem",
    "cluster",
    "shapes",
    "defaults",
    "bytes",
    "flops",
    "tolerance",
    "tunables",
    "constraints",
    "options",
    "include",
    "args",
    "tensor_maps",
];

fn parse_signature(item: &syn::ItemFn) -> syn::Result<Launcher> {
    let sig = &item.sig;
    if let Some(a) = &sig.asyncness {
        return Err(syn::Error::new(a.span(), "a kopt launcher cannot be async"));
    }
    if !sig.generics.params.is_empty() {
        return Err(syn::Error::new(
            sig.generics.span(),
            "a kopt launcher cannot be generic; write one launcher per dtype (entry = \"name_f16\")",
        ));
    }
    if !item.block.stmts.is_empty() {
        return Err(syn::Error::new(
            item.block.span(),
            "kopt generates the launcher's body: leave it empty (`{}`) or end the signature with `;`",
        ));
    }
    match &sig.output {
        syn::ReturnType::Default => {}
        syn::ReturnType::Type(_, ty) => {
            let ok = matches!(&**ty, syn::Type::Path(p)
                if p.path.segments.last().is_some_and(|s| s.ident == "Result"));
            if !ok {
                return Err(syn::Error::new(
                    ty.span(),
                    "a kopt launcher returns `Result<(), kopt::Error>`; leave the return type out and kopt adds it",
                ));
            }
        }
    }
    let mut inputs = sig.inputs.iter();
    let first = inputs.next().ok_or_else(|| {
        syn::Error::new(
            sig.paren_token.span.join(),
            "the first parameter must be the stream: `stream: &CudaStream`",
        )
    })?;
    let (stream, stream_ty) = typed_param(first)?;
    if !is_stream_type(stream_ty) {
        return Err(syn::Error::new(
            stream_ty.span(),
            "the first parameter must be the stream: `&CudaStream` (or `&Arc<CudaStream>`)",
        ));
    }
    let mut params = Vec::new();
    for p in inputs {
        let (ident, ty) = typed_param(p)?;
        params.push((ident, ty.clone()));
    }
    Ok(Launcher {
        vis: item.vis.clone(),
        attrs: item.attrs.clone(),
        ident: sig.ident.clone(),
        stream,
        params,
        reference_span: sig.ident.span(),
        entry_span: sig.ident.span(),
    })
}

fn typed_param(p: &syn::FnArg) -> syn::Result<(Ident, &syn::Type)> {
    match p {
        syn::FnArg::Receiver(r) => Err(syn::Error::new(
            r.span(),
            "a kopt launcher is a free function, not a method",
        )),
        syn::FnArg::Typed(t) => match &*t.pat {
            syn::Pat::Ident(i) if i.by_ref.is_none() && i.subpat.is_none() => {
                Ok((i.ident.clone(), &t.ty))
            }
            other => Err(syn::Error::new(
                other.span(),
                "parameters of a kopt launcher must be plain names",
            )),
        },
    }
}

fn last_segment(ty: &syn::Type) -> Option<&syn::PathSegment> {
    match ty {
        syn::Type::Path(p) if p.qself.is_none() => p.path.segments.last(),
        syn::Type::Group(g) => last_segment(&g.elem),
        syn::Type::Paren(p) => last_segment(&p.elem),
        _ => None,
    }
}

fn single_type_arg(seg: &syn::PathSegment) -> Option<&syn::Type> {
    match &seg.arguments {
        syn::PathArguments::AngleBracketed(a) => a
            .args
            .iter()
            .filter_map(|g| match g {
                syn::GenericArgument::Type(t) => Some(t),
                _ => None,
            })
            .last(),
        _ => None,
    }
}

fn is_stream_type(ty: &syn::Type) -> bool {
    let syn::Type::Reference(r) = ty else {
        return false;
    };
    if r.mutability.is_some() {
        return false;
    }
    let Some(seg) = last_segment(&r.elem) else {
        return false;
    };
    if seg.ident == "CudaStream" {
        return true;
    }
    seg.ident == "Arc"
        && single_type_arg(seg)
            .and_then(last_segment)
            .is_some_and(|s| s.ident == "CudaStream")
}

enum ParamKind {
    Buffer { dtype: DType, mutable: bool },
    Scalar(ScalarTy),
}

fn classify_param(name: &Ident, ty: &syn::Type) -> syn::Result<ParamKind> {
    if let syn::Type::Reference(r) = ty {
        let seg = last_segment(&r.elem).filter(|s| {
            matches!(
                s.ident.to_string().as_str(),
                "CudaSlice" | "CudaView" | "CudaViewMut"
            )
        });
        let Some(seg) = seg else {
            return Err(syn::Error::new(
                ty.span(),
                format!("`{name}`: a buffer parameter is `&CudaSlice<T>` (input) or `&mut CudaSlice<T>` (output); views (`&CudaView<T>`, `&mut CudaViewMut<T>`) work too"),
            ));
        };
        let mutable = r.mutability.is_some();
        if seg.ident == "CudaViewMut" && !mutable {
            return Err(syn::Error::new(
                ty.span(),
                "a `CudaViewMut` is passed as `&mut`",
            ));
        }
        let elem = single_type_arg(seg)
            .and_then(last_segment)
            .map(|s| s.ident.to_string());
        let Some(elem) = elem else {
            return Err(syn::Error::new(
                seg.span(),
                "expected an element type, e.g. `CudaSlice<f32>`",
            ));
        };
        let Some(dtype) = DType::from_name(&elem) else {
            return Err(syn::Error::new(
                single_type_arg(seg).unwrap().span(),
                format!(
                    "unsupported element type `{elem}`; supported: {}",
                    DType::ALL
                        .iter()
                        .map(|d| d.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        };
        return Ok(ParamKind::Buffer { dtype, mutable });
    }
    let scalar = last_segment(ty)
        .filter(|s| s.arguments.is_empty())
        .and_then(|s| {
            ScalarTy::ALL
                .iter()
                .find(|(n, _)| s.ident == n)
                .map(|(_, t)| *t)
        });
    match scalar {
        Some(t) => Ok(ParamKind::Scalar(t)),
        None => Err(syn::Error::new(
            ty.span(),
            format!("`{name}`: unsupported parameter type; a kernel argument is a device buffer (`&CudaSlice<T>`) or a scalar (i32, u32, i64, u64, usize, f32, f64)"),
        )),
    }
}

fn build_spec(
    opts: Vec<Opt>,
    launcher: &Launcher,
    item: &syn::ItemFn,
) -> syn::Result<(KernelSpec, Launcher)> {
    let mut keys: BTreeMap<String, (Ident, TokenStream)> = BTreeMap::new();
    let mut decls: Vec<BufferDecl> = Vec::new();
    for opt in opts {
        match opt {
            Opt::Key(k, v) => {
                let name = k.to_string();
                if !KEYS.contains(&name.as_str()) {
                    let known: Vec<String> = KEYS.iter().map(|s| s.to_string()).collect();
                    let hint = expr::closest(&name, &known)
                        .map(|c| format!("; did you mean `{c}`?"))
                        .unwrap_or_else(|| format!("; expected one of: {}", KEYS.join(", ")));
                    return Err(syn::Error::new(
                        k.span(),
                        format!("unknown option `{name}`{hint}"),
                    ));
                }
                if keys.contains_key(&name) {
                    return Err(syn::Error::new(
                        k.span(),
                        format!("`{name}` is given twice"),
                    ));
                }
                keys.insert(name, (k, v));
            }
            Opt::Buffer(d) => {
                if let Some(prev) = decls.iter().find(|p| p.name == d.name) {
                    let _ = prev;
                    return Err(syn::Error::new(
                        d.name.span(),
                        format!("buffer `{}` is declared twice", d.name),
                    ));
                }
                decls.push(*d);
            }
        }
    }
    let call_site = item.sig.ident.span();
    let mut launcher = launcher.clone();

    // --- reference and entry
    let reference = match keys.get("reference") {
        Some((_, v)) => {
            let lit: LitStr = syn::parse2(v.clone())?;
            let path = lit.value();
            check_relative_path(&path, lit.span())?;
            launcher.reference_span = lit.span();
            path
        }
        None => {
            return Err(syn::Error::new(
                call_site,
                "#[kopt::kernel] needs `reference = \"kernels/<file>.cu\"`: the CUDA source, relative to the crate root",
            ))
        }
    };
    let entry = match keys.get("entry") {
        Some((_, v)) => {
            let lit: LitStr = syn::parse2(v.clone())?;
            let e = lit.value();
            launcher.entry_span = lit.span();
            if e.is_empty() || !e.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(syn::Error::new(
                    lit.span(),
                    "an entry point is a C identifier",
                ));
            }
            e
        }
        None => launcher.ident.to_string(),
    };

    // --- tunables first: expressions may name them
    let mut tunables = Vec::new();
    if let Some((_, v)) = keys.get("tunables") {
        tunables = parse_tunables(v.clone())?;
    }

    // --- params, from the signature, with the buffer declarations
    let mut params = Vec::new();
    let mut scalar_names = Vec::new();
    let mut kinds = Vec::new();
    for (ident, ty) in &launcher.params {
        let kind = classify_param(ident, ty)?;
        if let ParamKind::Scalar(t) = kind {
            scalar_names.push((ident.to_string(), t));
        }
        kinds.push((ident.clone(), kind));
    }
    for t in &tunables {
        if scalar_names.iter().any(|(n, _)| *n == t.0.name) {
            return Err(syn::Error::new(
                t.1,
                format!("tunable `{}` has the name of a scalar argument", t.0.name),
            ));
        }
    }
    let tunable_spans: Vec<(String, Span)> =
        tunables.iter().map(|(t, s)| (t.name.clone(), *s)).collect();
    let tunables: Vec<Tunable> = tunables.into_iter().map(|(t, _)| t).collect();
    let var_kind = |n: &str| -> Option<VarKind> {
        if let Some((_, t)) = scalar_names.iter().find(|(s, _)| s == n) {
            return Some(if t.is_float() {
                VarKind::Float
            } else {
                VarKind::Int
            });
        }
        tunables.iter().any(|t| t.name == n).then_some(VarKind::Int)
    };
    let int_names: Vec<String> = scalar_names
        .iter()
        .filter(|(_, t)| !t.is_float())
        .map(|(n, _)| n.clone())
        .chain(tunables.iter().map(|t| t.name.clone()))
        .collect();
    let scalar_only = |n: &str| -> Option<VarKind> {
        scalar_names.iter().find(|(s, _)| s == n).map(|(_, t)| {
            if t.is_float() {
                VarKind::Float
            } else {
                VarKind::Int
            }
        })
    };
    let scalar_int_names: Vec<String> = scalar_names
        .iter()
        .filter(|(_, t)| !t.is_float())
        .map(|(n, _)| n.clone())
        .collect();
    // Fixed contents: integer expressions of the scalars. Tunables are recognised only to
    // say why they cannot appear (every build reads the same inputs).
    let values_vars = |n: &str| -> Option<VarKind> {
        scalar_only(n).or_else(|| tunables.iter().any(|t| t.name == n).then_some(VarKind::Int))
    };
    let values_expr = |buffer: &Ident, e: &syn::Expr| -> syn::Result<Expr> {
        let x = expr::from_syn(e, Ty::Int, &values_vars, &scalar_int_names).map_err(|err| {
            let m = err.to_string();
            if m.contains("float") {
                syn::Error::new(
                    err.span(),
                    format!("{m}: `values(...)` are integer expressions of the integer scalars (a float buffer holds them converted); write integers, or draw floats with `normal(..)` or `uniform(..)`"),
                )
            } else {
                err
            }
        })?;
        if let Some(t) = x
            .vars()
            .into_iter()
            .find(|v| tunables.iter().any(|t| t.name == *v))
        {
            return Err(syn::Error::new(
                e.span(),
                format!("the contents of `{buffer}` cannot depend on the tunable `{t}`: every build of the kernel reads the same inputs; write them over the scalar parameters"),
            ));
        }
        Ok(x)
    };

    for d in &decls {
        match kinds.iter().find(|(i, _)| *i == d.name) {
            None => {
                let names: Vec<String> = kinds
                    .iter()
                    .filter(|(_, k)| matches!(k, ParamKind::Buffer { .. }))
                    .map(|(i, _)| i.to_string())
                    .collect();
                let hint = expr::closest(&d.name.to_string(), &names)
                    .map(|c| format!("; did you mean `{c}`?"))
                    .unwrap_or_default();
                return Err(syn::Error::new(
                    d.name.span(),
                    format!(
                        "`{}` is not a parameter of `{}`{hint}",
                        d.name, launcher.ident
                    ),
                ));
            }
            Some((_, ParamKind::Scalar(_))) => {
                return Err(syn::Error::new(
                    d.name.span(),
                    format!(
                        "`{}` is a scalar parameter; only device buffers take a length",
                        d.name
                    ),
                ))
            }
            Some(_) => {}
        }
    }

    for (ident, kind) in kinds {
        match kind {
            ParamKind::Scalar(ty) => params.push(Param::Scalar(Scalar {
                name: ident.to_string(),
                ty,
            })),
            ParamKind::Buffer { dtype, mutable } => {
                let Some(d) = decls.iter().find(|d| d.name == ident) else {
                    return Err(syn::Error::new(
                        ident.span(),
                        format!("buffer `{ident}` needs a length: add `{ident}: [<elements>]` to #[kopt::kernel(...)], e.g. `{ident}: [rows * cols]`"),
                    ));
                };
                let len = expr::from_syn(&d.len, Ty::Int, &scalar_only, &scalar_int_names)?;
                let direction = match d.direction {
                    None if mutable => Direction::Out,
                    None => Direction::In,
                    Some((Direction::In, s)) if mutable => {
                        return Err(syn::Error::new(
                            s,
                            format!("`{ident}` is `&mut` but declared `in`: pass it as `&` or declare it `inout`"),
                        ))
                    }
                    Some((Direction::Out | Direction::InOut, s)) if !mutable => {
                        return Err(syn::Error::new(
                            s,
                            format!("`{ident}` is written by the kernel, so the launcher must take it as `&mut`"),
                        ))
                    }
                    Some((dir, _)) => dir,
                };
                let distribution = match (&d.distribution, direction) {
                    (Some((DistDecl::Values(_), s)), Direction::Out) => {
                        return Err(syn::Error::new(
                            *s,
                            format!("`{ident}` is an output (the kernel writes it); `values(...)` fixes an input's contents: declare it `inout` if the kernel reads them first, or drop `values`"),
                        ))
                    }
                    (Some((_, s)), Direction::Out) => {
                        return Err(syn::Error::new(
                            *s,
                            format!("`{ident}` is an output; only inputs take a distribution"),
                        ))
                    }
                    (_, Direction::Out) => None,
                    (None, _) if dtype.is_float() => Some(Distribution::Normal {
                        mean: 0.0,
                        std: 1.0,
                    }),
                    (None, _) => Some(Distribution::Range {
                        lo: Expr::Int(0),
                        hi: Expr::Int(if dtype.size() == 1 { 100 } else { 1000 }),
                    }),
                    (Some((DistDecl::Normal(m, s), sp)), _) => {
                        if !dtype.is_float() {
                            return Err(syn::Error::new(
                                *sp,
                                format!("`{ident}` holds integers ({dtype}); use `range(lo..hi)`"),
                            ));
                        }
                        if *s <= 0.0 {
                            return Err(syn::Error::new(
                                *sp,
                                "the standard deviation must be positive",
                            ));
                        }
                        Some(Distribution::Normal { mean: *m, std: *s })
                    }
                    (Some((DistDecl::Uniform(lo, hi), sp)), _) => {
                        if !dtype.is_float() {
                            return Err(syn::Error::new(
                                *sp,
                                format!("`{ident}` holds integers ({dtype}); use `range(lo..hi)`"),
                            ));
                        }
                        Some(Distribution::Uniform { lo: *lo, hi: *hi })
                    }
                    (Some((DistDecl::Range(lo, hi) | DistDecl::Spread(lo, hi), sp)), _) => {
                        if dtype.is_float() {
                            return Err(syn::Error::new(*sp, format!("`{ident}` holds floats ({dtype}); use `normal(mean, std)` or `uniform(lo..hi)`")));
                        }
                        let lo = expr::from_syn(lo, Ty::Int, &scalar_only, &scalar_int_names)?;
                        let hi = expr::from_syn(hi, Ty::Int, &scalar_only, &scalar_int_names)?;
                        Some(match d.distribution {
                            Some((DistDecl::Spread(..), _)) => Distribution::Spread { lo, hi },
                            _ => Distribution::Range { lo, hi },
                        })
                    }
                    (Some((DistDecl::Values(items), _)), _) => Some(Distribution::Values {
                        values: items
                            .iter()
                            .map(|e| values_expr(&ident, e))
                            .collect::<syn::Result<Vec<Expr>>>()?,
                    }),
                };
                let tolerance = match (&d.tolerance, direction) {
                    (Some((_, s)), Direction::In) => {
                        return Err(syn::Error::new(
                            *s,
                            format!("`{ident}` is an input; tolerances apply to outputs"),
                        ))
                    }
                    (t, _) => t.map(|(t, _)| t),
                };
                params.push(Param::Buffer(Buffer {
                    name: ident.to_string(),
                    dtype,
                    len,
                    direction,
                    distribution,
                    tolerance,
                }));
            }
        }
    }
    if !params
        .iter()
        .any(|p| matches!(p, Param::Buffer(b) if b.is_output()))
    {
        return Err(syn::Error::new(
            call_site,
            "the kernel writes no buffer: declare an output as `&mut CudaSlice<T>` (kopt verifies outputs)",
        ));
    }

    // --- the kernel's arguments, when they are not the launcher's parameters
    let tensor_maps = match keys.get("tensor_maps") {
        Some((_, v)) => {
            let buffers: Vec<(String, DType)> = params
                .iter()
                .filter_map(|p| match p {
                    Param::Buffer(b) => Some((b.name.clone(), b.dtype)),
                    Param::Scalar(_) => None,
                })
                .collect();
            let taken: Vec<String> = params
                .iter()
                .map(|p| p.name().to_string())
                .chain(tunables.iter().map(|t| t.name.clone()))
                .collect();
            tensor_map::parse(v.clone(), &buffers, &taken, &var_kind, &int_names)?
        }
        None => Vec::new(),
    };
    let args = match keys.get("args") {
        Some((_, v)) => build_args(
            v.clone(),
            &launcher,
            &params,
            &tunables,
            &tunable_spans,
            &tensor_maps,
        )?,
        None => None,
    };

    let int_expr = |key: &str, v: &TokenStream| -> syn::Result<Expr> {
        let e: syn::Expr = syn::parse2(v.clone())
            .map_err(|e| syn::Error::new(e.span(), format!("`{key}`: expected an expression")))?;
        expr::from_syn(&e, Ty::Int, &var_kind, &int_names)
    };

    // --- launch geometry
    let dims = |key: &str| -> syn::Result<[Expr; 3]> {
        let Some((k, v)) = keys.get(key) else {
            return Err(syn::Error::new(
                call_site,
                format!("#[kopt::kernel] needs `{key} = ...`: the reference launch's {key} size, e.g. `{key} = {}`",
                    if key == "grid" { "(rows, 1, 1)" } else { "256" }),
            ));
        };
        let e: syn::Expr = syn::parse2(v.clone())?;
        match e {
            syn::Expr::Tuple(t) => {
                if t.elems.is_empty() || t.elems.len() > 3 {
                    return Err(syn::Error::new(
                        t.span(),
                        format!("`{k}` takes one to three dimensions: `{k} = (x, y, z)`"),
                    ));
                }
                let mut out = [Expr::Int(1), Expr::Int(1), Expr::Int(1)];
                for (i, el) in t.elems.iter().enumerate() {
                    out[i] = expr::from_syn(el, Ty::Int, &var_kind, &int_names)?;
                }
                Ok(out)
            }
            other => Ok([
                expr::from_syn(&other, Ty::Int, &var_kind, &int_names)?,
                Expr::Int(1),
                Expr::Int(1),
            ]),
        }
    };
    let grid = dims("grid")?;
    let block = dims("block")?;
    let smem = match keys.get("smem") {
        Some((_, v)) => int_expr("smem", v)?,
        None => Expr::Int(0),
    };
    let cluster = keys
        .contains_key("cluster")
        .then(|| dims("cluster"))
        .transpose()?;

    // --- bytes and flops
    let bytes = match keys.get("bytes") {
        Some((_, v)) => int_expr("bytes", v)?,
        None => default_bytes(&params),
    };
    let flops = keys
        .get("flops")
        .map(|(_, v)| int_expr("flops", v))
        .transpose()?;

    // --- tolerance
    let tolerance = keys
        .get("tolerance")
        .map(|(k, v)| {
            let f = |c: ParseStream| {
                let content;
                braced!(content in c);
                parse_tolerance_fields(&content, k.span())
            };
            f.parse2(v.clone()).map_err(|e| {
                syn::Error::new(
                    e.span(),
                    format!("{e} (write `tolerance = {{ rtol: 1e-3, atol: 1e-5 }}`)"),
                )
            })
        })
        .transpose()?;

    // --- defaults and shapes
    let mut defaults = BTreeMap::new();
    if let Some((_, v)) = keys.get("defaults") {
        for (name, span, value) in parse_map(v.clone())? {
            check_scalar_value(&name, span, value, &scalar_names)?;
            defaults.insert(name, value);
        }
    }
    let shapes = match keys.get("shapes") {
        Some((k, v)) => parse_shapes(k, v.clone(), &scalar_names, &defaults)?,
        None => {
            return Err(syn::Error::new(
                call_site,
                "#[kopt::kernel] needs `shapes = [{ ... }]`: the real problem sizes to verify and measure, e.g. `shapes = [{ rows: 4096, cols: 4096 }]`",
            ))
        }
    };

    // --- constraints
    let mut constraints = Vec::new();
    if let Some((_, v)) = keys.get("constraints") {
        let list = (|c: ParseStream| {
            let content;
            bracketed!(content in c);
            Punctuated::<syn::Expr, Token![,]>::parse_terminated(&content)
        })
        .parse2(v.clone())?;
        for e in list {
            constraints.push(expr::from_syn(&e, Ty::Bool, &var_kind, &int_names)?);
        }
    }

    // --- options and include
    let str_list = |key: &str| -> syn::Result<Vec<(String, Span)>> {
        let Some((_, v)) = keys.get(key) else {
            return Ok(Vec::new());
        };
        let list = (|c: ParseStream| {
            let content;
            bracketed!(content in c);
            Punctuated::<LitStr, Token![,]>::parse_terminated(&content)
        })
        .parse2(v.clone())
        .map_err(|e| {
            syn::Error::new(
                e.span(),
                format!("`{key}` is a list of strings: `{key} = [\"...\"]`"),
            )
        })?;
        Ok(list.into_iter().map(|l| (l.value(), l.span())).collect())
    };
    let options = str_list("options")?;
    for (o, span) in &options {
        if o.starts_with("-I") || o.starts_with("--include-path") {
            return Err(syn::Error::new(
                *span,
                "include folders are declared with `include = [\"...\"]`, not as options",
            ));
        }
        if !o.starts_with('-') {
            return Err(syn::Error::new(
                *span,
                "an NVRTC option starts with `-`, e.g. \"--use_fast_math\"",
            ));
        }
    }
    let include = str_list("include")?;
    for (p, span) in &include {
        check_relative_path(p, *span)?;
    }

    let spec = KernelSpec {
        name: launcher.ident.to_string(),
        reference,
        entry,
        params,
        args,
        launch: LaunchRule {
            grid,
            block,
            smem,
            cluster,
        },
        shapes,
        bytes,
        flops,
        tolerance,
        tunables,
        constraints,
        options: options.into_iter().map(|(o, _)| o).collect(),
        include: include.into_iter().map(|(p, _)| p).collect(),
        tensor_maps,
    };
    if spec.pool_len() > MAX_LAUNCH_ARGS {
        return Err(syn::Error::new(
            call_site,
            format!(
                "`{}` has {} parameters, computed arguments and tensor maps; kopt's launcher takes at most {MAX_LAUNCH_ARGS}",
                spec.name,
                spec.pool_len()
            ),
        ));
    }
    check_shapes_against_spec(
        &spec,
        keys.get("shapes")
            .map(|(k, _)| k.span())
            .unwrap_or(call_site),
    )?;
    Ok((spec, launcher))
}

/// `args = (x, y, ncols, block_size: i32 = block_x)`: one item per kernel argument.
struct ArgDecl {
    name: Ident,
    ty: Option<syn::Type>,
    value: Option<syn::Expr>,
}

const ARGS_EXAMPLE: &str = "`args = (x, y, ncols, block_size: i32 = block_x)`";

fn parse_arg_list(v: TokenStream) -> syn::Result<(Span, Vec<ArgDecl>)> {
    let parser = |c: ParseStream| -> syn::Result<(Span, Vec<ArgDecl>)> {
        if !c.peek(syn::token::Paren) {
            return Err(c.error(format!(
                "list the kernel's arguments in order, in parentheses: {ARGS_EXAMPLE}"
            )));
        }
        let content;
        let paren = parenthesized!(content in c);
        let mut out = Vec::new();
        while !content.is_empty() {
            let name: Ident = content.parse().map_err(|e| {
                syn::Error::new(
                    e.span(),
                    "expected a parameter's name, or a computed argument `name: i32 = <expression>`",
                )
            })?;
            let ty = if content.peek(Token![:]) {
                content.parse::<Token![:]>()?;
                Some(content.parse::<syn::Type>()?)
            } else {
                None
            };
            let value = if content.peek(Token![=]) {
                content.parse::<Token![=]>()?;
                Some(content.parse::<syn::Expr>()?)
            } else {
                None
            };
            out.push(ArgDecl { name, ty, value });
            if !content.is_empty() {
                content.parse::<Token![,]>()?;
            }
        }
        Ok((paren.span.join(), out))
    };
    parser.parse2(v)
}

/// The kernel's argument list from `args = (...)`, checked against the launcher: every
/// item a parameter or a typed computed argument, each once; every buffer passed; no
/// floating-point parameter left unused. `None` when the list is every parameter in
/// order, so that writing out the default does not change the spec (nor its hash).
fn build_args(
    v: TokenStream,
    launcher: &Launcher,
    params: &[Param],
    tunables: &[Tunable],
    tunable_spans: &[(String, Span)],
    tensor_maps: &[TensorMapDecl],
) -> syn::Result<Option<Vec<KernelArg>>> {
    let (list_span, decls) = parse_arg_list(v)?;
    let fname = &launcher.ident;
    let param_names: Vec<String> = params.iter().map(|p| p.name().to_string()).collect();
    let param_span = |n: &str| {
        launcher
            .params
            .iter()
            .find(|(i, _)| i == n)
            .map(|(i, _)| i.span())
            .unwrap_or(list_span)
    };
    let scalar = |n: &str| {
        params.iter().find_map(|p| match p {
            Param::Scalar(s) if s.name == n => Some(s),
            _ => None,
        })
    };
    let is_tunable = |n: &str| tunables.iter().any(|t| t.name == n);

    // Geometry names are bound in computed arguments only; there they must be unambiguous.
    let computes = decls
        .iter()
        .any(|d| d.value.is_some() && !param_names.contains(&d.name.to_string()));
    if computes {
        let taken = params
            .iter()
            .filter_map(|p| match p {
                Param::Scalar(s) => Some((s.name.as_str(), "parameter", param_span(&s.name))),
                Param::Buffer(_) => None,
            })
            .chain(
                tunable_spans
                    .iter()
                    .map(|(n, s)| (n.as_str(), "tunable", *s)),
            );
        for (name, what, span) in taken {
            if GEOMETRY_NAMES.contains(&name) {
                return Err(syn::Error::new(
                    span,
                    format!(
                        "`{name}` names the launch geometry in computed arguments ({}): rename this {what}",
                        GEOMETRY_NAMES.join(", ")
                    ),
                ));
            }
        }
    }
    let vars = |n: &str| -> Option<VarKind> {
        if let Some(s) = scalar(n) {
            return Some(if s.ty.is_float() {
                VarKind::Float
            } else {
                VarKind::Int
            });
        }
        (is_tunable(n) || GEOMETRY_NAMES.contains(&n)).then_some(VarKind::Int)
    };
    let names: Vec<String> = params
        .iter()
        .filter_map(|p| match p {
            Param::Scalar(s) if !s.ty.is_float() => Some(s.name.clone()),
            _ => None,
        })
        .chain(tunables.iter().map(|t| t.name.clone()))
        .chain(GEOMETRY_NAMES.iter().map(|g| g.to_string()))
        .collect();

    let mut out: Vec<KernelArg> = Vec::new();
    let mut listed: Vec<String> = Vec::new();
    for d in &decls {
        let name = d.name.to_string();
        let span = d.name.span();
        if listed.contains(&name) {
            return Err(syn::Error::new(
                span,
                format!("`{name}` is listed twice in `args`: list each kernel argument once, in the kernel's order"),
            ));
        }
        listed.push(name.clone());
        let is_param = param_names.contains(&name);
        let is_map = tensor_maps.iter().any(|m| m.name == name);
        match (&d.ty, &d.value) {
            (None, None) if is_param => out.push(KernelArg::Param { name }),
            (None, None) if is_map => out.push(KernelArg::Map { name }),
            (None, None) => {
                let known: Vec<String> = param_names
                    .iter()
                    .cloned()
                    .chain(tensor_maps.iter().map(|m| m.name.clone()))
                    .collect();
                let hint = expr::closest(&name, &known)
                    .map(|c| format!("; did you mean `{c}`?"))
                    .unwrap_or_default();
                let maps = if tensor_maps.is_empty() { "" } else { " nor a tensor map" };
                return Err(syn::Error::new(
                    span,
                    format!("`{name}` is not a parameter of `{fname}`{maps}{hint} (a computed argument is written `{name}: i32 = <expression>`)"),
                ));
            }
            (Some(ty), None) if is_param => {
                return Err(syn::Error::new(
                    ty.span(),
                    format!("`{name}` is a parameter of `{fname}`: list it bare (`{name}`); its type comes from the signature"),
                ))
            }
            (Some(ty), None) => {
                return Err(syn::Error::new(
                    span,
                    format!(
                        "computed argument `{name}` needs its value: `{name}: {} = <expression>`",
                        quote::ToTokens::to_token_stream(ty)
                    ),
                ))
            }
            (_, Some(_)) if is_param => {
                return Err(syn::Error::new(
                    span,
                    format!("`{name}` is a parameter of `{fname}`: list it bare to pass it as the launcher receives it, or give the computed argument a name of its own"),
                ))
            }
            (None, Some(value)) => {
                return Err(syn::Error::new(
                    span,
                    format!(
                        "computed argument `{name}` needs a type: `{name}: i32 = {}` (i32, u32, i64, u64 or usize, as the kernel declares it)",
                        quote::ToTokens::to_token_stream(value)
                    ),
                ))
            }
            (Some(ty), Some(value)) => {
                if is_tunable(&name) {
                    return Err(syn::Error::new(
                        span,
                        format!("`{name}` is a tunable, a preprocessor define that would rename the kernel's parameter in its source: give the computed argument another name"),
                    ));
                }
                let written = last_segment(ty)
                    .filter(|s| s.arguments.is_empty())
                    .map(|s| s.ident.to_string());
                let ty_kind = written.as_deref().and_then(ScalarTy::from_name);
                let ty_kind = match ty_kind {
                    Some(t) if t.is_float() => {
                        return Err(syn::Error::new(
                            ty.span(),
                            format!("computed argument `{name}` is {}: computed arguments are integers (i32, u32, i64, u64 or usize), since kopt's expressions are integer arithmetic; pass a floating-point value as a launcher parameter and list it in `args`", t.name()),
                        ))
                    }
                    Some(t) => t,
                    None => {
                        return Err(syn::Error::new(
                            ty.span(),
                            format!("computed argument `{name}`: expected an integer type, i32, u32, i64, u64 or usize, as the kernel declares it"),
                        ))
                    }
                };
                let value = expr::from_syn(value, Ty::Int, &vars, &names)?;
                out.push(KernelArg::Computed(ComputedArg {
                    name,
                    ty: ty_kind,
                    value,
                }));
            }
        }
    }
    for p in params {
        match p {
            Param::Buffer(b)
                if !listed.contains(&b.name)
                    && !tensor_maps
                        .iter()
                        .any(|m| m.buffer == b.name && listed.contains(&m.name)) =>
            {
                return Err(syn::Error::new(
                    list_span,
                    format!("buffer `{0}` is not in `args`: every device buffer is passed to the kernel, itself or through a tensor map; add `{0}` where the kernel takes it", b.name),
                ))
            }
            Param::Scalar(s) if s.ty.is_float() && !listed.contains(&s.name) => {
                return Err(syn::Error::new(
                    param_span(&s.name),
                    format!("`{0}` is a floating-point parameter the kernel is not given (it is not in `args`), and expressions read integers only, so nothing would use it: add `{0}` to `args`, or remove it", s.name),
                ))
            }
            _ => {}
        }
    }
    let is_every_param = out.len() == params.len()
        && out
            .iter()
            .zip(params)
            .all(|(a, p)| matches!(a, KernelArg::Param { name } if name == p.name()));
    Ok((!is_every_param).then_some(out))
}

/// Each input read once and each output written once (in-out: both).
fn default_bytes(params: &[Param]) -> Expr {
    let mut total: Option<Expr> = None;
    for p in params {
        let Param::Buffer(b) = p else { continue };
        let times = if b.direction == Direction::InOut {
            2
        } else {
            1
        };
        let term = Expr::Binary(
            expr::BinOp::Mul,
            Box::new(b.len.clone()),
            Box::new(Expr::Int((b.dtype.size() * times) as i64)),
        );
        total = Some(match total {
            None => term,
            Some(t) => Expr::Binary(expr::BinOp::Add, Box::new(t), Box::new(term)),
        });
    }
    total.unwrap_or(Expr::Int(0))
}

fn check_relative_path(path: &str, span: Span) -> syn::Result<()> {
    let p = std::path::Path::new(path);
    if path.is_empty() || p.is_absolute() || path.starts_with('/') || path.contains('\\') {
        return Err(syn::Error::new(span, "give a path relative to the crate root, with `/` separators, e.g. \"kernels/softmax.cu\""));
    }
    if p.components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(syn::Error::new(
            span,
            "the path may not leave the crate (`..`): keep kernel sources inside the crate",
        ));
    }
    Ok(())
}

fn parse_tunables(v: TokenStream) -> syn::Result<Vec<(Tunable, Span)>> {
    let parser = |c: ParseStream| {
        let content;
        braced!(content in c);
        let mut out: Vec<(Tunable, Span)> = Vec::new();
        while !content.is_empty() {
            let name: Ident = content.parse()?;
            let s = name.to_string();
            if out.iter().any(|(t, _)| t.name == s) {
                return Err(syn::Error::new(
                    name.span(),
                    format!("tunable `{s}` is given twice"),
                ));
            }
            content.parse::<Token![:]>()?;
            let mut default = None;
            if !content.peek(syn::token::Bracket) {
                let n = parse_number(&content)?;
                let Number::Int(n) = n else {
                    return Err(content.error("a tunable's value is an integer"));
                };
                default = Some((n, name.span()));
                content.parse::<Token![in]>().map_err(|e| {
                    syn::Error::new(
                        e.span(),
                        format!("write `{s}: {n} in [..]` (default, then the candidate values)"),
                    )
                })?;
            }
            let list;
            let br = bracketed!(list in content);
            let mut values = Vec::new();
            while !list.is_empty() {
                match parse_number(&list)? {
                    Number::Int(n) => {
                        if values.contains(&n) {
                            return Err(list.error(format!("{n} is listed twice")));
                        }
                        values.push(n)
                    }
                    Number::Float(_) => return Err(list.error("a tunable's values are integers")),
                }
                if !list.is_empty() {
                    list.parse::<Token![,]>()?;
                }
            }
            if values.is_empty() {
                return Err(syn::Error::new(
                    br.span.join(),
                    format!("tunable `{s}` needs at least one value"),
                ));
            }
            let default = match default {
                Some((d, sp)) => {
                    if !values.contains(&d) {
                        return Err(syn::Error::new(
                            sp,
                            format!(
                                "the default of `{s}` ({d}) is not among its values {values:?}"
                            ),
                        ));
                    }
                    d
                }
                None => values[0],
            };
            out.push((
                Tunable {
                    name: s,
                    values,
                    default,
                },
                name.span(),
            ));
            if !content.is_empty() {
                content.parse::<Token![,]>()?;
            }
        }
        Ok(out)
    };
    parser.parse2(v).map_err(|e| {
        if e.to_string().starts_with("expected") {
            syn::Error::new(
                e.span(),
                format!(
                    "{e} (write `tunables = {{ BLOCK: 256 in [128, 256, 512], VEC: [1, 2, 4] }}`)"
                ),
            )
        } else {
            e
        }
    })
}

fn parse_map(v: TokenStream) -> syn::Result<Vec<(String, Span, Number)>> {
    let parser = |c: ParseStream| parse_map_inner(c);
    parser.parse2(v)
}

fn parse_map_inner(c: ParseStream) -> syn::Result<Vec<(String, Span, Number)>> {
    let content;
    braced!(content in c);
    let mut out: Vec<(String, Span, Number)> = Vec::new();
    while !content.is_empty() {
        let k: Ident = content.parse()?;
        content
            .parse::<Token![:]>()
            .map_err(|e| syn::Error::new(e.span(), format!("write `{k}: <value>`")))?;
        let v = parse_number(&content)?;
        let name = k.to_string();
        if out.iter().any(|(n, _, _)| *n == name) {
            return Err(syn::Error::new(
                k.span(),
                format!("`{name}` is given twice"),
            ));
        }
        out.push((name, k.span(), v));
        if !content.is_empty() {
            content.parse::<Token![,]>()?;
        }
    }
    Ok(out)
}

fn check_scalar_value(
    name: &str,
    span: Span,
    v: Number,
    scalars: &[(String, ScalarTy)],
) -> syn::Result<()> {
    let Some((_, ty)) = scalars.iter().find(|(n, _)| n == name) else {
        let names: Vec<String> = scalars.iter().map(|(n, _)| n.clone()).collect();
        let hint = expr::closest(name, &names)
            .map(|c| format!("; did you mean `{c}`?"))
            .unwrap_or_else(|| format!("; the scalar arguments are: {}", names.join(", ")));
        return Err(syn::Error::new(
            span,
            format!("`{name}` is not a scalar argument{hint}"),
        ));
    };
    match (ty.is_float(), v) {
        (false, Number::Float(_)) => Err(syn::Error::new(
            span,
            format!("`{name}` is {}: give an integer", ty.name()),
        )),
        (false, Number::Int(i))
            if i < 0 && matches!(ty, ScalarTy::U32 | ScalarTy::U64 | ScalarTy::Usize) =>
        {
            Err(syn::Error::new(
                span,
                format!("`{name}` is {}: it cannot be negative", ty.name()),
            ))
        }
        _ => Ok(()),
    }
}

fn parse_shapes(
    key: &Ident,
    v: TokenStream,
    scalars: &[(String, ScalarTy)],
    defaults: &BTreeMap<String, Number>,
) -> syn::Result<Vec<Shape>> {
    let parser = |c: ParseStream| {
        let content;
        let br = bracketed!(content in c);
        let mut out = Vec::new();
        while !content.is_empty() {
            let span = content.span();
            let entries = parse_map_inner(&content)?;
            let mut values = BTreeMap::new();
            let mut weight = 1.0;
            for (name, sp, value) in entries {
                if name == "weight" && !scalars.iter().any(|(n, _)| n == "weight") {
                    weight = value.as_f64();
                    if weight <= 0.0 {
                        return Err(syn::Error::new(sp, "a shape's weight must be positive"));
                    }
                    continue;
                }
                check_scalar_value(&name, sp, value, scalars)?;
                values.insert(name, value);
            }
            for (name, _) in scalars {
                if !values.contains_key(name) {
                    match defaults.get(name) {
                        Some(d) => {
                            values.insert(name.clone(), *d);
                        }
                        None => {
                            return Err(syn::Error::new(
                                span,
                                format!("this shape gives no value for `{name}`; add `{name}: ...` here or `defaults = {{ {name}: ... }}`"),
                            ))
                        }
                    }
                }
            }
            out.push(Shape { values, weight });
            if !content.is_empty() {
                content.parse::<Token![,]>()?;
            }
        }
        if out.is_empty() {
            return Err(syn::Error::new(br.span.join(), "give at least one shape"));
        }
        Ok(out)
    };
    parser.parse2(v).map_err(|e| {
        if e.to_string().starts_with("expected") {
            syn::Error::new(
                e.span(),
                format!("{e} (write `{key} = [{{ rows: 4096, cols: 4096 }}, ...]`)"),
            )
        } else {
            e
        }
    })
}

/// Every declared shape must give valid lengths and geometry, and satisfy the
/// constraints at the tunables' defaults: a spec that cannot launch its own shapes is a
/// mistake best caught at compile time.
fn check_shapes_against_spec(spec: &KernelSpec, span: Span) -> syn::Result<()> {
    let defines = spec.default_defines();
    for (i, shape) in spec.shapes.iter().enumerate() {
        let args = spec.shape_args(shape);
        let desc = shape_label(shape);
        let run = |what: &str, e: &Expr| -> syn::Result<i64> {
            let prog = spec
                .compile_expr(e, &defines)
                .map_err(|m| syn::Error::new(span, m))?;
            crate::expr::eval(&prog, &args).map_err(|err| {
                syn::Error::new(
                    span,
                    format!("shape {} ({desc}): {what} `{e}`: {err}", i + 1),
                )
            })
        };
        for b in spec.buffers() {
            let n = run("length", &b.len)?;
            if n <= 0 {
                return Err(syn::Error::new(
                    span,
                    format!(
                        "shape {} ({desc}): buffer `{}` would have {n} elements",
                        i + 1,
                        b.name
                    ),
                ));
            }
        }
        let mut grid = [1i64; 3];
        for (what, dims) in [("grid", &spec.launch.grid), ("block", &spec.launch.block)] {
            for (k, d) in dims.iter().enumerate() {
                let v = run(what, d)?;
                if v <= 0 || v > u32::MAX as i64 {
                    return Err(syn::Error::new(
                        span,
                        format!("shape {} ({desc}): {what} dimension `{d}` is {v}", i + 1),
                    ));
                }
                if what == "grid" {
                    grid[k] = v;
                }
            }
        }
        if let Some(dims) = &spec.launch.cluster {
            let mut cluster = [1i64; 3];
            for (k, d) in dims.iter().enumerate() {
                cluster[k] = run("cluster", d)?;
            }
            if let Some(problem) = cluster_problem(grid, cluster) {
                return Err(syn::Error::new(
                    span,
                    format!("shape {} ({desc}): {problem}", i + 1),
                ));
            }
        }
        for b in spec.buffers() {
            if let Some(Err(problem)) = b.fixed_values(spec, &args) {
                return Err(syn::Error::new(
                    span,
                    format!("shape {} ({desc}): {problem}", i + 1),
                ));
            }
        }
        if let Err(problem) = spec.kernel_arg_values(None, &spec.launch, &defines, &shape.values) {
            return Err(syn::Error::new(
                span,
                format!(
                    "shape {} ({desc}): {problem} at the tunables' defaults",
                    i + 1
                ),
            ));
        }
        for c in &spec.constraints {
            if run("constraint", c)? == 0 {
                return Err(syn::Error::new(
                    span,
                    format!(
                        "shape {} ({desc}) breaks the constraint `{c}` at the tunables' defaults",
                        i + 1
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `rows=4096 cols=4096`: how shapes are named in tables and errors.
pub fn shape_label(shape: &Shape) -> String {
    shape
        .values
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn parse(args: TokenStream, item: TokenStream) -> syn::Result<KernelSpec> {
        let item = parse_item(item)?;
        parse_kernel(args, &item).map(|(s, _)| s)
    }

    fn softmax_item() -> TokenStream {
        quote! {
            pub fn softmax(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);
        }
    }

    #[test]
    fn full_spec_parses_and_normalises() {
        let spec = parse(
            quote! {
                reference = "kernels/softmax.cu",
                entry = "softmax_f32",
                x: [rows * cols],
                y: [rows * cols] out tol(rtol = 1e-3),
                grid = rows,
                block = BLOCK,
                smem = BLOCK / 32 * 4,
                shapes = [{ rows: 4096, cols: 4096 }, { rows: 16, cols: 65536, weight: 2 }],
                flops = 5 * rows * cols,
                tunables = { BLOCK: 256 in [128, 256, 512, 1024], VEC: [1, 2, 4] },
                constraints = [BLOCK % 32 == 0, BLOCK * VEC <= cols],
                options = ["--use_fast_math"],
            },
            softmax_item(),
        )
        .unwrap();
        assert_eq!(spec.entry, "softmax_f32");
        assert_eq!(spec.bytes.to_string(), "rows * cols * 4 + rows * cols * 4");
        assert_eq!(spec.tunables[0].default, 256);
        assert_eq!(spec.tunables[1].default, 1);
        assert_eq!(spec.shapes[1].weight, 2.0);
        assert_eq!(
            spec.reference_options(),
            vec!["-DBLOCK=256", "-DVEC=1", "--use_fast_math"]
        );
        let Param::Buffer(y) = &spec.params[1] else {
            panic!()
        };
        assert_eq!(y.direction, Direction::Out);
        assert_eq!(y.tolerance.unwrap().rtol, 1e-3);
        let Param::Buffer(x) = &spec.params[0] else {
            panic!()
        };
        assert_eq!(
            x.distribution,
            Some(Distribution::Normal {
                mean: 0.0,
                std: 1.0
            })
        );
    }

    #[test]
    fn a_variant_runs_only_where_the_constraints_of_its_build_hold() {
        let spec = parse(
            quote! {
                reference = "k.cu",
                x: [rows * cols],
                y: [rows * cols],
                grid = rows,
                block = BLOCK,
                shapes = [{ rows: 4, cols: 1024 }],
                tunables = { BLOCK: 256 in [128, 256], VEC: [1, 2, 4] },
                constraints = [BLOCK % 32 == 0, cols % VEC == 0, rows >= 1],
            },
            softmax_item(),
        )
        .unwrap();
        let holds = |region: Option<(&str, &Expr)>, vec: i64, rows: i64, cols: i64| {
            let defines = BTreeMap::from([("BLOCK".to_string(), 256), ("VEC".to_string(), vec)]);
            match spec.variant_applies(region, &defines) {
                None => true,
                Some((_, e)) => {
                    let p = spec.compile_expr(&e, &defines).unwrap();
                    expr::eval(&p, &[rows, cols]).unwrap() != 0
                }
            }
        };
        // Only `cols % VEC == 0` names both a scalar and a tunable.
        let defines = BTreeMap::from([("BLOCK".to_string(), 256), ("VEC".to_string(), 2)]);
        let (text, _) = spec.variant_applies(None, &defines).unwrap();
        assert_eq!(text, "cols % VEC == 0 with VEC = 2");
        assert!(holds(None, 2, 4, 1024) && !holds(None, 2, 4, 1001));
        assert!(holds(None, 1, 4, 1001), "the reference's build runs it");
        let region = spec.parse_region("rows < 8").unwrap();
        assert!(!holds(Some(("rows < 8", &region)), 2, 16, 1024));
        assert!(holds(Some(("rows < 8", &region)), 2, 4, 1024));
        let (text, _) = spec
            .variant_applies(Some(("rows < 8", &region)), &defines)
            .unwrap();
        assert_eq!(text, "rows < 8 && cols % VEC == 0 with VEC = 2");
        let no_build_constraint = parse(
            quote!(reference = "k.cu", x: [rows * cols], y: [rows * cols], grid = rows, block = 256, shapes = [{ rows: 4, cols: 8 }], constraints = [cols >= 1]),
            softmax_item(),
        )
        .unwrap();
        assert!(no_build_constraint
            .variant_applies(None, &BTreeMap::new())
            .is_none());
    }

    #[test]
    fn body_may_be_empty_braces() {
        let spec = parse(
            quote!(reference = "k.cu", x: [n], y: [n], grid = n / 256, block = 256, shapes = [{ n: 1024 }]),
            quote!(fn add(s: &Arc<CudaStream>, x: &CudaSlice<f16>, y: &mut CudaSlice<f16>, n: usize) {}),
        )
        .unwrap();
        assert_eq!(spec.entry, "add");
    }

    fn err(args: TokenStream) -> String {
        parse(args, softmax_item()).unwrap_err().to_string()
    }

    /// candle's softmax: the launcher takes the row count, the kernel does not (it reads
    /// the row from blockIdx), and its last argument must equal the block size.
    fn gemm_item() -> TokenStream {
        quote! {
            pub fn gemm(stream: &CudaStream, a: &CudaSlice<f16>, b: &CudaSlice<f16>, c: &mut CudaSlice<f16>, m: u32, n: u32, k: u32);
        }
    }

    /// A GEMM whose reference takes pointers, with maps over A and B for variants.
    fn gemm_with_maps(extra: TokenStream) -> syn::Result<KernelSpec> {
        parse(
            quote! {
                reference = "kernels/gemm.cu",
                a: [m * k], b: [k * n], c: [m * n],
                tensor_maps = {
                    a_map: tensor_map(a, dims = [k, m], box = [64, BM], swizzle = 128),
                    b_map: tensor_map(b, dims = [n, k], box = [64, 64], swizzle = 128, l2_promotion = 256),
                },
                grid = (ceil_div(n, 128), ceil_div(m, BM)), block = 384,
                tunables = { BM: 128 in [64, 128] },
                shapes = [{ m: 512, n: 4096, k: 4096 }],
                #extra
            },
            gemm_item(),
        )
    }

    /// Two maps over one buffer (A's tiles for two tile heights): each value names its own
    /// map, so an encoding error names the map that failed, not the buffer's first.
    #[test]
    fn two_maps_over_one_buffer_keep_their_own_index() {
        let spec = parse(
            quote! {
                reference = "kernels/gemm.cu",
                a: [m * k], b: [k * n], c: [m * n],
                tensor_maps = {
                    a_tall: tensor_map(a, dims = [k, m], box = [64, 128]),
                    a_short: tensor_map(a, dims = [k, m], box = [64, 64]),
                },
                grid = ceil_div(m, 128), block = 128,
                shapes = [{ m: 512, n: 4096, k: 4096 }],
            },
            gemm_item(),
        )
        .unwrap();
        let list: Vec<String> = ["a_short", "a_tall", "b", "c", "m", "n", "k"]
            .map(String::from)
            .into();
        let v = spec
            .kernel_arg_values(
                Some(&list),
                &spec.launch,
                &BTreeMap::new(),
                &spec.shapes[0].values,
            )
            .unwrap();
        let maps: Vec<(usize, usize, u32)> = v
            .iter()
            .filter_map(|a| match a {
                ArgValue::TensorMap { index, args } => {
                    Some((*index, args.buffer, args.box_dims[1]))
                }
                _ => None,
            })
            .collect();
        assert_eq!(maps, [(1, 0, 64), (0, 0, 128)]);
        assert_eq!(spec.tensor_maps[maps[0].0].name, "a_short");
    }

    #[test]
    fn a_variant_takes_tensor_maps_where_the_reference_takes_pointers() {
        let spec = gemm_with_maps(quote!()).unwrap();
        assert_eq!(spec.tensor_maps.len(), 2);
        assert!(spec.args.is_none(), "the reference takes its parameters");
        // The pool: 6 parameters, no computed argument, then the maps.
        assert_eq!(spec.pool_len(), 8);
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let tma = names(&["a_map", "b_map", "c", "m", "n", "k"]);
        let args = spec.version_args(Some(&tma)).unwrap();
        let pool: Vec<usize> = args.iter().map(|a| spec.pool_index(a)).collect();
        assert_eq!(pool, [6, 7, 2, 3, 4, 5]);
        // Evaluated under the variant's defines: its BM sizes the box.
        let defines: BTreeMap<String, i64> = [("BM".to_string(), 64)].into();
        let values = spec.shapes[0].values.clone();
        let v = spec
            .kernel_arg_values(Some(&tma), &spec.launch, &defines, &values)
            .unwrap();
        let ArgValue::TensorMap { index: 0, args: a } = v[0] else {
            panic!("{v:?}")
        };
        assert_eq!(
            (a.buffer, &a.dims[..2], a.strides[0], &a.box_dims[..2]),
            (0, &[4096u64, 512][..], 8192, &[64u32, 64][..])
        );
        assert!(matches!(
            v[1],
            ArgValue::TensorMap { index: 1, args } if args.buffer == 1
        ));
        assert!(matches!(v[2], ArgValue::Buffer(2)));
        // What a variant's list must be.
        let err = |v: &[&str]| spec.version_args(Some(&names(v))).unwrap_err();
        assert!(err(&["a_map", "c", "m", "n", "k"]).contains("do not reach buffer `b`"));
        assert!(err(&["a_map", "b_map", "c", "c", "m"]).contains("`c` is listed twice"));
        assert!(err(&["a_mapp", "b_map", "c"]).contains("did you mean `a_map`?"));
        // A map over an output is fine; one whose box breaks the swizzle is refused.
        let wide: BTreeMap<String, i64> = [("BM".to_string(), 512)].into();
        let e = spec
            .kernel_arg_values(Some(&tma), &spec.launch, &wide, &values)
            .unwrap_err();
        assert!(
            e.contains("tensor map `a_map`: box[1] = `BM` is 512"),
            "{e}"
        );
    }

    #[test]
    fn the_reference_may_take_a_map_and_then_must_reach_every_buffer() {
        let spec = gemm_with_maps(quote!(args = (a_map, b, c, m, n, k))).unwrap();
        let args = spec.kernel_args();
        assert!(matches!(args[0], KernelArgRef::TensorMap { index: 0, .. }));
        let json = spec.canonical_json();
        assert!(json.contains(r#"{"arg":"map","name":"a_map"}"#), "{json}");
        let e = gemm_with_maps(quote!(args = (a_mapp, b, c, m, n, k)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("nor a tensor map; did you mean `a_map`?"), "{e}");
        let e = gemm_with_maps(quote!(args = (b, c, m, n, k)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("buffer `a` is not in `args`"), "{e}");
        // A map that reaches past its buffer.
        let e = parse(
            quote! {
                reference = "kernels/gemm.cu", a: [m * k], b: [k * n], c: [m * n],
                tensor_maps = { a_map: tensor_map(a, dims = [k, m + 1], box = [64, 64]) },
                args = (a_map, b, c, m, n, k),
                grid = 1, block = 1, shapes = [{ m: 64, n: 64, k: 64 }],
            },
            gemm_item(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("tensor map `a_map` reaches byte 8320 of `a`, which holds 8192"),
            "{e}"
        );
    }

    fn candle_item() -> TokenStream {
        quote! {
            pub fn softmax(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, ncols: u32);
        }
    }

    fn candle_err(args: TokenStream) -> String {
        parse(args, candle_item()).unwrap_err().to_string()
    }

    fn values_of(spec: &KernelSpec, shape: usize) -> Vec<ArgValue> {
        spec.kernel_arg_values(
            None,
            &spec.launch,
            &spec.default_defines(),
            &spec.shapes[shape].values,
        )
        .unwrap()
    }

    #[test]
    fn args_list_the_kernel_arguments_with_launch_only_and_computed_ones() {
        let spec = parse(
            quote! {
                reference = "k.cu",
                entry = "softmax_f32",
                x: [rows * ncols],
                y: [rows * ncols],
                args = (x, y, ncols, block_size: i32 = block_x),
                grid = rows,
                block = BLOCK,
                shapes = [{ rows: 8, ncols: 1000 }],
                tunables = { BLOCK: 256 in [128, 256, 512] },
            },
            candle_item(),
        )
        .unwrap();
        let names: Vec<&str> = spec.kernel_args().iter().map(|a| a.name()).collect();
        assert_eq!(names, ["x", "y", "ncols", "block_size"]);
        let launch_only: Vec<&str> = spec.launch_only().map(|s| s.name.as_str()).collect();
        assert_eq!(launch_only, ["rows"]);
        assert_eq!(
            spec.scalar_names(),
            ["rows", "ncols"],
            "expressions read both"
        );
        assert_eq!(
            values_of(&spec, 0),
            [
                ArgValue::Buffer(0),
                ArgValue::Buffer(1),
                ArgValue::Scalar(ScalarTy::U32, Number::Int(1000)),
                ArgValue::Scalar(ScalarTy::I32, Number::Int(256)),
            ]
        );
        // A version's defines and launch rule give its own value.
        let defines = BTreeMap::from([("BLOCK".to_string(), 512)]);
        let v = spec
            .kernel_arg_values(None, &spec.launch, &defines, &spec.shapes[0].values)
            .unwrap();
        assert_eq!(v[3], ArgValue::Scalar(ScalarTy::I32, Number::Int(512)));
        let mut launch = spec.launch.clone();
        launch.block[0] = Expr::Int(128);
        let v = spec
            .kernel_arg_values(None, &launch, &defines, &spec.shapes[0].values)
            .unwrap();
        assert_eq!(v[3], ArgValue::Scalar(ScalarTy::I32, Number::Int(128)));
        // The spec travels as JSON (jobs, the embedded definition) and reads back the same.
        let json = spec.canonical_json();
        assert!(
            json.contains(r#""args":[{"arg":"param","name":"x"}"#),
            "{json}"
        );
        assert!(
            json.contains(r#"{"arg":"computed","name":"block_size","ty":"i32","value":"block_x"}"#),
            "{json}"
        );
        let back: KernelSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn computed_arguments_read_scalars_tunables_and_every_geometry_name() {
        let spec = parse(
            quote! {
                reference = "k.cu",
                x: [rows * ncols],
                y: [rows * ncols],
                args = (
                    x, y,
                    a: u32 = grid_x * 10 + grid_y,
                    b: i64 = block_x * block_y * block_z,
                    c: u64 = smem + cluster_x + cluster_y + cluster_z,
                    d: usize = ceil_div(ncols, BLOCK) + rows,
                ),
                grid = (rows, 2, 1),
                block = (BLOCK, 2, 3),
                smem = BLOCK * 4,
                shapes = [{ rows: 8, ncols: 1000 }],
                tunables = { BLOCK: [128, 256] },
            },
            candle_item(),
        )
        .unwrap();
        let n = |v: ArgValue| match v {
            ArgValue::Scalar(_, n) => n.as_i64().unwrap(),
            ArgValue::Buffer(_) | ArgValue::TensorMap { .. } => panic!("not a scalar"),
        };
        let v = values_of(&spec, 0);
        assert_eq!(
            v[2..].iter().map(|v| n(*v)).collect::<Vec<_>>(),
            [82, 768, 515, 16]
        );
        assert_eq!(spec.launch_only().count(), 2, "rows and ncols");
        let mut launch = spec.launch.clone();
        launch.cluster = Some([Expr::Int(2), Expr::Int(1), Expr::Int(1)]);
        let v = spec
            .kernel_arg_values(
                None,
                &launch,
                &spec.default_defines(),
                &spec.shapes[0].values,
            )
            .unwrap();
        assert_eq!(n(v[4]), 512 + 4, "cluster_x follows the version's rule");
    }

    #[test]
    fn args_that_repeat_the_parameters_are_no_args() {
        let base = quote!(reference = "k.cu", x: [rows * ncols], y: [rows * ncols], grid = rows, block = 256, shapes = [{ rows: 8, ncols: 1000 }]);
        let plain = parse(base.clone(), candle_item()).unwrap();
        let explicit = parse(quote!(#base, args = (x, y, rows, ncols)), candle_item()).unwrap();
        assert_eq!(explicit.args, None);
        assert_eq!(explicit.canonical_json(), plain.canonical_json());
        let json = plain.canonical_json();
        assert!(
            !json.contains("\"args\"") && !json.contains("\"kind\":\"values\""),
            "{json}"
        );
        let reordered = parse(quote!(#base, args = (y, x, ncols, rows)), candle_item()).unwrap();
        let kinds: Vec<String> = reordered
            .kernel_args()
            .iter()
            .map(|a| match a {
                KernelArgRef::Buffer { param, buffer, .. } => format!("b{param}/{buffer}"),
                KernelArgRef::Scalar { param, .. } => format!("s{param}"),
                KernelArgRef::Computed { index, .. } => format!("c{index}"),
                KernelArgRef::TensorMap { index, .. } => format!("m{index}"),
            })
            .collect();
        assert_eq!(kinds, ["b1/1", "b0/0", "s3", "s2"]);
    }

    #[test]
    fn values_give_fixed_contents_checked_against_the_length() {
        let item = quote! {
            fn k(stream: &CudaStream, x: &CudaSlice<f32>, info: &CudaSlice<u32>, scale: &CudaSlice<f16>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);
        };
        let spec = parse(
            quote! {
                reference = "k.cu",
                x: [rows * cols],
                info: [4] values(rows, cols, cols, 1),
                scale: [1] values(cols / 2),
                y: [rows * cols],
                grid = rows, block = 256,
                shapes = [{ rows: 8, cols: 1000 }, { rows: 2, cols: 64 }],
            },
            item.clone(),
        )
        .unwrap();
        let info = spec.buffers().nth(1).unwrap();
        let args = spec.shape_args(&spec.shapes[1]);
        assert_eq!(
            info.fixed_values(&spec, &args),
            Some(Ok(vec![2, 64, 64, 1]))
        );
        assert_eq!(
            spec.buffers().nth(2).unwrap().fixed_values(&spec, &args),
            Some(Ok(vec![32]))
        );
        assert_eq!(
            spec.buffers().next().unwrap().fixed_values(&spec, &args),
            None
        );
        let back: KernelSpec = serde_json::from_str(&spec.canonical_json()).unwrap();
        assert_eq!(back, spec);

        let e = parse(
            quote!(reference = "k.cu", x: [rows * cols], info: [rows] values(rows, cols, cols, 1), scale: [1], y: [rows * cols], grid = rows, block = 256, shapes = [{ rows: 4, cols: 8 }, { rows: 3, cols: 8 }]),
            item.clone(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("shape 2 (cols=8 rows=3)")
                && e.contains("has 4 values but its length `rows` is 3"),
            "{e}"
        );
        let e = parse(
            quote!(reference = "k.cu", x: [rows * cols], info: [1] values(rows - 9), scale: [1], y: [rows * cols], grid = rows, block = 256, shapes = [{ rows: 4, cols: 8 }]),
            item.clone(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("is -5, which u32 cannot hold exactly"), "{e}");
        let e = parse(
            quote!(reference = "k.cu", x: [rows * cols], info: [1], scale: [1] values(cols + 1), y: [rows * cols], grid = rows, block = 256, shapes = [{ rows: 4, cols: 4096 }]),
            item.clone(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("is 4097, which f16 cannot hold exactly"), "{e}");
    }

    #[test]
    fn exact_representation_of_integers() {
        assert!(DType::F16.holds_exactly(2048) && DType::F16.holds_exactly(65504));
        assert!(!DType::F16.holds_exactly(2049) && !DType::F16.holds_exactly(65536));
        assert!(DType::Bf16.holds_exactly(256) && !DType::Bf16.holds_exactly(257));
        assert!(DType::F32.holds_exactly(1 << 24) && !DType::F32.holds_exactly((1 << 24) + 1));
        assert!(DType::F64.holds_exactly(-(1 << 53)) && !DType::F64.holds_exactly((1 << 53) + 1));
        assert!(DType::U8.holds_exactly(255) && !DType::U8.holds_exactly(256));
        assert!(DType::I8.holds_exactly(-128) && !DType::U32.holds_exactly(-1));
        assert!(ScalarTy::I32.holds(i32::MAX as i64) && !ScalarTy::I32.holds(1 << 31));
        assert!(!ScalarTy::Usize.holds(-1) && ScalarTy::U32.holds(u32::MAX as i64));
    }

    #[test]
    fn args_and_values_errors_name_the_fix() {
        let base = quote!(reference = "k.cu", x: [rows * ncols], y: [rows * ncols], grid = rows, block = BLOCK, shapes = [{ rows: 8, ncols: 1000 }], tunables = { BLOCK: [256] });
        let e = candle_err(quote!(#base, args = (x, y, ncol)));
        assert!(
            e.contains("`ncol` is not a parameter of `softmax`; did you mean `ncols`?"),
            "{e}"
        );
        let e = candle_err(quote!(#base, args = (y, ncols)));
        assert!(e.contains("buffer `x` is not in `args`"), "{e}");
        let e = candle_err(quote!(#base, args = (x, y, ncols, block_size = BLOCK)));
        assert!(e.contains("needs a type: `block_size: i32 = BLOCK`"), "{e}");
        let e = candle_err(quote!(#base, args = (x, y, ncols, scale: f32 = BLOCK)));
        assert!(
            e.contains("computed arguments are integers") && e.contains("launcher parameter"),
            "{e}"
        );
        let e = candle_err(quote!(#base, args = (x, y, ncols, n: char = BLOCK)));
        assert!(e.contains("expected an integer type"), "{e}");
        let e = candle_err(quote!(#base, args = (x, y, ncols, block_size: i32 = blok_x)));
        assert!(
            e.contains("unknown name `blok_x`; did you mean `block_x`?"),
            "{e}"
        );
        let e = candle_err(quote!(#base, args = (x, y, ncols, block_size: i32)));
        assert!(
            e.contains("needs its value: `block_size: i32 = <expression>`"),
            "{e}"
        );
        let e = candle_err(quote!(#base, args = (x, y, ncols: u32)));
        assert!(e.contains("list it bare (`ncols`)"), "{e}");
        let e = candle_err(quote!(#base, args = (x, y, ncols: i32 = rows)));
        assert!(e.contains("`ncols` is a parameter of `softmax`"), "{e}");
        let e = candle_err(quote!(#base, args = (x, y, x)));
        assert!(e.contains("`x` is listed twice"), "{e}");
        let e = candle_err(quote!(#base, args = (x, y, BLOCK: i32 = BLOCK)));
        assert!(e.contains("`BLOCK` is a tunable"), "{e}");
        let e = candle_err(quote!(#base, args = [x, y]));
        assert!(e.contains("in parentheses"), "{e}");
        let e = candle_err(quote!(#base, args = (x, y, b: i32 = rows * 1000000000)));
        assert!(
            e.contains("shape 1 (ncols=1000 rows=8)")
                && e.contains("is 8000000000, outside the range of i32"),
            "{e}"
        );
        let e = candle_err(
            quote!(#base, args = (x, y, ncols, b: i32 = if rows > 1 { 1 } else { 0 } == 1)),
        );
        assert!(e.contains("expected an integer"), "{e}");
        // Geometry names are reserved only where computed arguments read them.
        let geometry_item = quote!(
            pub fn k(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, block_x: u32);
        );
        let g = quote!(reference = "k.cu", x: [block_x], y: [block_x], grid = block_x, block = 1, shapes = [{ block_x: 8 }]);
        assert!(parse(quote!(#g, args = (x, y)), geometry_item.clone()).is_ok());
        let e = parse(quote!(#g, args = (x, y, n: u32 = block_x)), geometry_item)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`block_x` names the launch geometry")
                && e.contains("rename this parameter"),
            "{e}"
        );
        // A floating-point parameter the kernel is not given could not be read at all.
        let e = parse(
            quote!(reference = "k.cu", x: [n], y: [n], args = (x, y, n), grid = n, block = 1, shapes = [{ n: 8, eps: 0.5 }]),
            quote!(fn k(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: u32, eps: f32);),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("`eps` is a floating-point parameter the kernel is not given"),
            "{e}"
        );

        let item = quote!(
            fn k(
                stream: &CudaStream,
                x: &CudaSlice<f32>,
                info: &CudaSlice<i32>,
                y: &mut CudaSlice<f32>,
                n: u32,
                eps: f32,
            );
        );
        let v = |decl: TokenStream| {
            parse(quote!(reference = "k.cu", x: [n], #decl, y: [n], grid = n, block = 1, shapes = [{ n: 8, eps: 0.5 }], tunables = { VEC: [1, 2] }), item.clone())
                .unwrap_err()
                .to_string()
        };
        let e = v(quote!(info: [2] values(n, 1.5)));
        assert!(
            e.contains("float literal") && e.contains("write integers"),
            "{e}"
        );
        let e = v(quote!(info: [2] values(n, eps)));
        assert!(
            e.contains("`eps` is a floating-point scalar") && e.contains("write integers"),
            "{e}"
        );
        let e = v(quote!(info: [2] values(n, VEC)));
        assert!(e.contains("cannot depend on the tunable `VEC`"), "{e}");
        let e = v(quote!(info: [2] values()));
        assert!(e.contains("needs the buffer's contents"), "{e}");
        let e = v(quote!(info: [2] values(n, m)));
        assert!(e.contains("unknown name `m`"), "{e}");
        let e = parse(
            quote!(reference = "k.cu", x: [n], info: [n], y: [2] values(n, 1), grid = n, block = 1, shapes = [{ n: 8, eps: 0.5 }]),
            item.clone(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("`y` is an output") && e.contains("declare it `inout`"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_fix() {
        let base = quote!(reference = "k.cu", x: [rows * cols], y: [rows * cols], grid = rows, block = 256);
        assert!(
            err(quote!(#base, shapes = [{ rows: 1, cols: 2 }], refernce = "x"))
                .contains("did you mean `reference`")
        );
        assert!(err(quote!(#base)).contains("needs `shapes"));
        assert!(err(quote!(#base, shapes = [{ rows: 1 }])).contains("no value for `cols`"));
        assert!(err(quote!(#base, shapes = [{ rows: 1, cols: 2.5 }])).contains("give an integer"));
        assert!(err(quote!(reference = "../k.cu", x: [rows], y: [rows], grid = rows, block = 1, shapes = [{ rows: 1, cols: 1 }]))
            .contains("may not leave the crate"));
        assert!(err(quote!(reference = "k.cu", x: [rows], y: [rows] in, grid = rows, block = 1, shapes = [{ rows: 1, cols: 1 }]))
            .contains("declared `in`"));
        assert!(err(quote!(reference = "k.cu", x: [rows], grid = rows, block = 1, shapes = [{ rows: 1, cols: 1 }]))
            .contains("buffer `y` needs a length"));
        assert!(
            err(quote!(#base, shapes = [{ rows: 1, cols: 2 }], constraints = [cols * 2]))
                .contains("expected a condition")
        );
        assert!(
            err(quote!(#base, shapes = [{ rows: 1, cols: 2 }], tunables = { B: 3 in [1, 2] }))
                .contains("not among its values")
        );
        assert!(
            err(quote!(#base, shapes = [{ rows: 0, cols: 2 }])).contains("would have 0 elements")
        );
    }
}
