//! What to evaluate: a candidate against the reference on a set of shapes, under a policy.
//! Built on the parent side from a spec and the committed (or proposed) files; sent to the
//! worker as is.

use std::collections::BTreeMap;

use kopt_spec::expr::{self, Expr};
use kopt_spec::files::VariantFile;
use kopt_spec::spec::{KernelSpec, LaunchRule, Number, Shape};
use serde::{Deserialize, Serialize};

/// One compilable version of a kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelVersion {
    /// `reference` or the variant's name.
    pub id: String,
    /// Self-contained CUDA C++ source (includes already inlined).
    pub source: String,
    pub entry: String,
    pub launch: LaunchRule,
    #[serde(default)]
    pub defines: BTreeMap<String, i64>,
    #[serde(default)]
    pub options: Vec<String>,
    /// PTX compiled ahead of the job (by the search's CPU compile pool) from exactly this
    /// source, entry and options for the worker's architecture: the worker loads it
    /// instead of running NVRTC itself. Part of the job, so part of the evaluation
    /// cache's key: a different PTX is a different evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptx: Option<String>,
    /// Machine code (a cubin, base64) compiled ahead of the job for the worker's exact
    /// architecture: the worker loads it without the driver's PTX JIT (tens of
    /// milliseconds a module). Takes precedence over `ptx`; part of the cache key too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cubin: Option<String>,
    /// The entry's name in the attached `ptx` or `cubin` where it differs from `entry`:
    /// NVRTC's lowered name of a name expression (`softmax<float>`). Absent: `entry`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symbol: Option<String>,
}

impl KernelVersion {
    /// The reference: its amalgamated source, built with the tunables' defaults.
    pub fn reference(spec: &KernelSpec, amalgamated_source: &str) -> Self {
        KernelVersion {
            id: "reference".into(),
            source: amalgamated_source.to_string(),
            entry: spec.entry.clone(),
            launch: spec.launch.clone(),
            defines: spec.default_defines(),
            options: spec.options.clone(),
            ptx: None,
            cubin: None,
            symbol: None,
        }
    }

    /// A committed or pending variant.
    pub fn variant(v: &VariantFile, source: &str) -> Self {
        KernelVersion {
            id: v.id.clone(),
            source: source.to_string(),
            entry: v.entry.clone(),
            launch: v.launch.clone(),
            defines: v.defines.clone(),
            options: v.options.clone(),
            ptx: None,
            cubin: None,
            symbol: None,
        }
    }

    /// Attaches machine code compiled ahead for the worker's architecture.
    pub fn set_cubin(&mut self, cubin: &[u8]) {
        use base64::Engine as _;
        self.cubin = Some(base64::engine::general_purpose::STANDARD.encode(cubin));
    }

    /// The attached machine code, decoded.
    pub fn cubin_bytes(&self) -> Option<Result<Vec<u8>, String>> {
        use base64::Engine as _;
        self.cubin.as_ref().map(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b)
                .map_err(|e| format!("the job's cubin is not base64: {e}"))
        })
    }

    /// NVRTC options: defines, then the declared options.
    pub fn compile_options(&self) -> Vec<String> {
        kopt_spec::spec::define_options(&self.defines)
            .chain(self.options.iter().cloned())
            .collect()
    }

    /// Grid, block and dynamic shared memory for one shape.
    pub fn geometry(&self, spec: &KernelSpec, args: &[i64]) -> Result<Geometry, String> {
        let eval = |e: &Expr| -> Result<i64, String> {
            let p = spec.compile_expr(e, &self.defines)?;
            expr::eval(&p, args).map_err(|err| format!("`{e}`: {err}"))
        };
        let dim = |d: &[Expr; 3], what: &str| -> Result<[u32; 3], String> {
            let mut out = [0u32; 3];
            for (i, e) in d.iter().enumerate() {
                let v = eval(e)?;
                out[i] = u32::try_from(v)
                    .ok()
                    .filter(|v| *v > 0)
                    .ok_or_else(|| format!("{what} dimension `{e}` is {v}"))?;
            }
            Ok(out)
        };
        let smem = eval(&self.launch.smem)?;
        let grid = dim(&self.launch.grid, "grid")?;
        let cluster = kopt_spec::spec::launch_cluster(
            grid,
            self.launch
                .cluster
                .as_ref()
                .map(|c| dim(c, "cluster"))
                .transpose()?,
        )?;
        Ok(Geometry {
            grid,
            block: dim(&self.launch.block, "block")?,
            smem: u32::try_from(smem)
                .map_err(|_| format!("shared memory `{}` is {smem}", self.launch.smem))?,
            cluster,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub smem: u32,
    /// Thread-block cluster set at launch; `[1, 1, 1]` launches without the attribute.
    #[serde(default = "no_cluster")]
    pub cluster: [u32; 3],
}

impl Geometry {
    /// Blocks per cluster set at launch (1 without one), and how many such clusters the
    /// grid holds.
    pub fn clusters(&self) -> (u64, u64) {
        let product = |v: [u32; 3]| v.iter().map(|&d| d as u64).product::<u64>();
        let per_cluster = product(self.cluster).max(1);
        (per_cluster, product(self.grid) / per_cluster)
    }

    /// A launch without a cluster attribute.
    pub fn plain(grid: [u32; 3], block: [u32; 3], smem: u32) -> Self {
        Geometry {
            grid,
            block,
            smem,
            cluster: no_cluster(),
        }
    }
}

fn no_cluster() -> [u32; 3] {
    [1; 3]
}

/// A shape to check (and maybe time).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShapeCase {
    pub label: String,
    pub values: BTreeMap<String, Number>,
    /// Derived from the declared shapes, never shown to an agent.
    pub held_out: bool,
    /// Timed as well as checked (declared shapes are; held-out ones only checked).
    pub timed: bool,
}

impl ShapeCase {
    pub fn declared(shape: &Shape) -> Self {
        ShapeCase {
            label: kopt_spec::spec::shape_label(shape),
            values: shape.values.clone(),
            held_out: false,
            timed: true,
        }
    }
}

/// How results are timed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimingPolicy {
    pub warmup: u32,
    pub min_samples: u32,
    pub max_samples: u32,
    /// Stop once the relative interquartile spread of the samples is below this.
    pub target_spread: f64,
    /// Per shape, wall time spent sampling at most.
    pub max_seconds: f64,
    /// Device time of one sample (a graph replay of several launches), µs.
    pub graph_target_us: f64,
    /// Launches per graph at least, whatever `graph_target_us` gives: a replay's start
    /// costs about as much as a short kernel, and a long graph amortises it as a real
    /// model's graph of hundreds of kernels does. 32, as `scripts/torch_compare.py` times
    /// PyTorch (`--min-calls`), so that kopt's and PyTorch's times compare like for like.
    #[serde(default = "default_min_graph_launches")]
    pub min_graph_launches: u32,
    /// Copies of the inputs cycled so that launches read cold data (at most).
    pub max_input_sets: u32,
}

impl Default for TimingPolicy {
    fn default() -> Self {
        TimingPolicy {
            warmup: 5,
            min_samples: 15,
            max_samples: 200,
            target_spread: 0.02,
            max_seconds: 2.0,
            graph_target_us: 500.0,
            min_graph_launches: default_min_graph_launches(),
            max_input_sets: 64,
        }
    }
}

fn default_min_graph_launches() -> u32 {
    32
}

/// Seeds of the input sets. Every check draws fresh inputs from its own seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seeds {
    /// First check: the declared distributions.
    pub first: u64,
    /// Second check: shifted distributions (so symmetric cancellations cannot pass).
    pub second: u64,
    /// Re-check after the timing loop.
    pub after_timing: u64,
}

impl Seeds {
    /// Seeds derived from a base (the run's, or the time of day).
    pub fn from_base(base: u64) -> Self {
        let mix = |k: u64| {
            let mut z = base.wrapping_add(k.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Seeds {
            first: mix(1),
            second: mix(2),
            after_timing: mix(3),
        }
    }
}

/// One evaluation: candidate against reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalJob {
    pub spec: KernelSpec,
    pub reference: KernelVersion,
    pub candidate: KernelVersion,
    pub shapes: Vec<ShapeCase>,
    pub seeds: Seeds,
    /// `None`: check only.
    pub timing: Option<TimingPolicy>,
}

// ---------------------------------------------------------------------------------------
// Held-out shapes.

mod held_out;
pub use held_out::{
    held_out_byte_cap, held_out_label, held_out_shapes, held_out_shapes_for, parse_held_out_label,
    seed_independent_held_out_shapes, shape_is_valid,
};

/// Total bytes of the buffers of a shape.
pub fn shape_bytes(spec: &KernelSpec, args: &[i64]) -> u64 {
    spec.buffers()
        .filter_map(|b| {
            spec.compile_expr(&b.len, &BTreeMap::new())
                .ok()
                .and_then(|p| expr::eval(&p, args).ok())
                .map(|n| n.max(0) as u64 * b.dtype.size() as u64)
        })
        .sum()
}

/// The logical dimensions of a buffer, when its length is a product of factors
/// (`rows * cols` -> [rows, cols]): used to report a failing element's coordinates.
pub fn buffer_dims(len: &Expr, spec: &KernelSpec, args: &[i64]) -> Option<Vec<(String, u64)>> {
    fn factors<'a>(e: &'a Expr, out: &mut Vec<&'a Expr>) {
        match e {
            Expr::Binary(expr::BinOp::Mul, a, b) => {
                factors(a, out);
                factors(b, out);
            }
            other => out.push(other),
        }
    }
    let mut fs = Vec::new();
    factors(len, &mut fs);
    if fs.len() < 2 {
        return None;
    }
    fs.iter()
        .map(|f| {
            let v = spec
                .compile_expr(f, &BTreeMap::new())
                .ok()
                .and_then(|p| expr::eval(&p, args).ok())?;
            Some((f.to_string(), u64::try_from(v).ok()?))
        })
        .collect()
}

/// `index` as coordinates in `dims` (row-major).
pub fn coordinates(index: u64, dims: &[(String, u64)]) -> Vec<(String, u64)> {
    let mut rem = index;
    let mut out = vec![(String::new(), 0); dims.len()];
    for (i, (name, d)) in dims.iter().enumerate().rev() {
        let d = (*d).max(1);
        out[i] = (name.clone(), rem % d);
        rem /= d;
    }
    out
}

#[cfg(test)]
pub(crate) mod tests_support {
    use kopt_spec::spec;
    pub fn tiny_spec() -> kopt_spec::KernelSpec {
        let item = spec::parse_item(
            "pub fn softmax(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);"
                .parse()
                .unwrap(),
        )
        .unwrap();
        spec::parse_kernel(
            "reference = \"k.cu\", x: [rows * cols], y: [rows * cols], grid = rows, block = 256, shapes = [{ rows: 4096, cols: 4096 }, { rows: 16, cols: 65536 }], constraints = [cols % 4 == 0]"
                .parse()
                .unwrap(),
            &item,
        )
        .unwrap()
        .0
    }

    /// A check-only job of the reference against itself, without shapes.
    pub fn tiny_job(spec: &kopt_spec::KernelSpec) -> super::EvalJob {
        let v = super::KernelVersion::reference(spec, "__global__ void softmax() {}");
        super::EvalJob {
            spec: spec.clone(),
            reference: v.clone(),
            candidate: v,
            shapes: Vec::new(),
            seeds: super::Seeds {
                first: 1,
                second: 2,
                after_timing: 3,
            },
            timing: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tests_support::tiny_spec as sample;

    #[test]
    fn held_out_shapes_are_new_valid_and_deterministic() {
        let spec = sample();
        let a = held_out_shapes(&spec, None, 42, 2, 1 << 30);
        let b = held_out_shapes(&spec, None, 42, 2, 1 << 30);
        assert_eq!(a, b, "deterministic under a seed");
        // The seed-independent shapes, then two seeded ones per declared shape.
        let fixed = seed_independent_held_out_shapes(&spec, &spec.default_defines(), None, 1 << 30);
        assert_eq!(a.len(), fixed.len() + 4);
        for s in &a {
            assert!(s.held_out && !s.timed);
            let cols = s.values["cols"].as_i64().unwrap();
            assert_eq!(cols % 4, 0, "constraint holds: {s:?}");
            let args = spec.shape_args(&Shape {
                values: s.values.clone(),
                weight: 1.0,
            });
            assert!(
                !spec.shapes.iter().any(|d| spec.shape_args(d) == args),
                "not a declared shape"
            );
        }
        let c = held_out_shapes(&spec, None, 7, 2, 1 << 30);
        assert_ne!(a, c, "another seed, other shapes");
        let region = spec.parse_region("rows >= 1000").unwrap();
        for s in held_out_shapes(&spec, Some(&region), 42, 2, 1 << 30) {
            assert!(
                s.values["rows"].as_i64().unwrap() >= 1000,
                "inside the region"
            );
        }
        // Under a 1000-byte cap only the smallest sizes fit (16 rows of 4 columns: 512
        // bytes); under 100 bytes, nothing.
        let small = held_out_shapes(&spec, None, 42, 2, 1000);
        assert!(!small.is_empty());
        for s in &small {
            let args = spec.shape_args(&Shape {
                values: s.values.clone(),
                weight: 1.0,
            });
            assert!(shape_bytes(&spec, &args) <= 1000, "memory cap: {}", s.label);
        }
        assert!(
            held_out_shapes(&spec, None, 42, 2, 100).is_empty(),
            "memory cap"
        );
    }

    #[test]
    fn held_out_shapes_respect_the_versions_own_defines() {
        let item = kopt_spec::spec::parse_item(
            "fn k(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);"
                .parse()
                .unwrap(),
        )
        .unwrap();
        let spec = kopt_spec::spec::parse_kernel(
            "reference = \"k.cu\", x: [rows * cols], y: [rows], grid = rows, block = 256, shapes = [{ rows: 64, cols: 4096 }, { rows: 16, cols: 65536 }], tunables = { VEC: [1, 2, 4, 8] }, constraints = [cols % VEC == 0]"
                .parse()
                .unwrap(),
            &item,
        )
        .unwrap()
        .0;
        let odd = |shapes: &[ShapeCase]| {
            shapes
                .iter()
                .any(|s| s.values["cols"].as_i64().unwrap() % 8 != 0)
        };
        // At the defaults (VEC=1) odd column counts are fair game...
        let mut any_odd = false;
        for seed in 0..20 {
            any_odd |= odd(&held_out_shapes(&spec, None, seed, 3, 1 << 30));
        }
        assert!(any_odd);
        // ... but never for a version built with VEC=8.
        let mut d = spec.default_defines();
        d.insert("VEC".into(), 8);
        for seed in 0..20 {
            let shapes = held_out_shapes_for(&spec, &d, None, seed, 3, 1 << 30);
            assert!(!shapes.is_empty());
            assert!(!odd(&shapes), "{shapes:?}");
        }
    }

    #[test]
    fn coordinates_of_a_flat_index() {
        let spec = sample();
        let dims = buffer_dims(
            &spec
                .params
                .iter()
                .find_map(|p| match p {
                    kopt_spec::spec::Param::Buffer(b) => Some(b.len.clone()),
                    _ => None,
                })
                .unwrap(),
            &spec,
            &[16, 65536],
        )
        .unwrap();
        assert_eq!(dims, vec![("rows".into(), 16), ("cols".into(), 65536)]);
        assert_eq!(
            coordinates(65536 * 3 + 17, &dims),
            vec![("rows".into(), 3), ("cols".into(), 17)]
        );
    }

    #[test]
    fn geometry_uses_defines() {
        let spec = sample();
        let mut v = KernelVersion::reference(&spec, "");
        v.launch.block[0] = kopt_spec::expr::parse_str(
            "BLOCK",
            kopt_spec::expr::Ty::Int,
            &|_| Some(kopt_spec::expr::VarKind::Int),
            &[],
        )
        .unwrap();
        v.defines.insert("BLOCK".into(), 512);
        assert_eq!(
            v.geometry(&spec, &[8, 1024]).unwrap(),
            Geometry::plain([8, 1, 1], [512, 1, 1], 0)
        );
        v.defines.insert("BLOCK".into(), 0);
        assert!(v
            .geometry(&spec, &[8, 1024])
            .unwrap_err()
            .contains("block dimension"));
    }

    #[test]
    fn a_cluster_set_at_launch_must_divide_the_grid() {
        let spec = sample();
        let mut v = KernelVersion::reference(&spec, "");
        let parse = |t: &str| {
            kopt_spec::expr::parse_str(
                t,
                kopt_spec::expr::Ty::Int,
                &|_| Some(kopt_spec::expr::VarKind::Int),
                &["rows".to_string()],
            )
            .unwrap()
        };
        v.launch.cluster = Some([
            parse("if rows < 16 { CLUSTER } else { 1 }"),
            parse("1"),
            parse("1"),
        ]);
        v.defines.insert("CLUSTER".into(), 4);
        // grid = rows (sample's rule): 8 rows in clusters of 4, 100 rows without.
        assert_eq!(v.geometry(&spec, &[8, 1024]).unwrap().cluster, [4, 1, 1]);
        assert_eq!(v.geometry(&spec, &[100, 1024]).unwrap().cluster, [1, 1, 1]);
        let err = v.geometry(&spec, &[6, 1024]).unwrap_err();
        assert!(err.contains("not a whole number of clusters"), "{err}");
        v.defines.insert("CLUSTER".into(), 0);
        assert!(v
            .geometry(&spec, &[8, 1024])
            .unwrap_err()
            .contains("cluster dimension"));
    }

    #[test]
    fn a_geometry_without_cluster_reads_as_a_plain_launch() {
        // A report written before launch-time clusters (journals and evidence keep the
        // launch figures' geometry).
        let g: Geometry =
            serde_json::from_str(r#"{"grid":[8,1,1],"block":[256,1,1],"smem":0}"#).unwrap();
        assert_eq!(g, Geometry::plain([8, 1, 1], [256, 1, 1], 0));
    }
}
