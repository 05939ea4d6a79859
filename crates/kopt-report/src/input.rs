//! What a report is made of, and how it is read from disk.
//!
//! Three kinds of input, each optional:
//!
//! - the committed evidence: every variant folder under a crate's `kopt/<kernel>/` (its
//!   `rationale.json`) and whether `kopt.lock` accepts it;
//! - the pending area: `<package>/<kernel>/<arch>/` folders as the optimisation loop
//!   leaves them (`pending.json` holds the fences, held-out shapes and shapes checked);
//! - measurement files: the JSON `cargo kopt bench --message-format json` prints
//!   ([`BenchFile`]) and the JSON `cargo kopt search-bench --json-out FILE` writes
//!   ([`SearchBenchFile`]).

use std::path::{Path, PathBuf};

use kopt_engine::protocol::{Ceilings, DeviceInfo};
use kopt_spec::files::{LockFile, Rationale};
use kopt_spec::search_bench::{Landscape, Row};
use kopt_store::pending::{self, PendingVariant};
use serde::{Deserialize, Serialize};

/// One row of `cargo kopt bench`: the reference and the active version on one declared
/// shape. `cargo kopt bench` writes this type, so the report reads exactly what it prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRow {
    pub package: String,
    pub kernel: String,
    pub shape: String,
    /// The version that runs on this device for this shape.
    pub active: String,
    pub reference_us: Option<f64>,
    pub active_us: Option<f64>,
    pub speedup: Option<f64>,
    pub copy_bandwidth_pct: Option<f64>,
    pub reference_copy_bandwidth_pct: Option<f64>,
    pub flops_pct: Option<f64>,
    pub spread: Option<f64>,
    pub method: Option<String>,
    pub cached: bool,
    /// Set when the measurement itself failed (the active version did not pass).
    pub problem: Option<String>,
    /// The shape's ideal bytes (read plus written), from the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// A one-launch copy of the same bytes, timed the same way, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_size_copy_us: Option<f64>,
    /// That copy's time over the active version's, percent: how close the version comes to
    /// the best a single launch moving its bytes does, launch and latency included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_size_copy_pct: Option<f64>,
    /// For a shape a program launched (`bench --inputs`): how many times it did, the
    /// weight of this row in the kernel's time in that program.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launches: Option<u64>,
}

/// A kernel's time in a captured program: each captured shape's time weighted by its
/// launch count, with the reference and with the active versions.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightedKernel {
    pub kernel: String,
    pub launches: u64,
    pub reference_ms: f64,
    pub active_ms: f64,
}

impl WeightedKernel {
    pub fn speedup(&self) -> f64 {
        self.reference_ms / self.active_ms
    }
}

impl BenchFile {
    /// Per kernel with captured shapes timed, its time in the program: the sum over those
    /// shapes of launches times the time per launch.
    pub fn weighted(&self) -> Vec<WeightedKernel> {
        let mut out: Vec<WeightedKernel> = Vec::new();
        for r in self.rows.iter().filter(|r| r.problem.is_none()) {
            let (Some(n), Some(rt), Some(at)) = (r.launches, r.reference_us, r.active_us) else {
                continue;
            };
            let w = match out.iter_mut().find(|w| w.kernel == r.kernel) {
                Some(w) => w,
                None => {
                    out.push(WeightedKernel {
                        kernel: r.kernel.clone(),
                        launches: 0,
                        reference_ms: 0.0,
                        active_ms: 0.0,
                    });
                    out.last_mut().expect("just pushed")
                }
            };
            w.launches += n;
            w.reference_ms += n as f64 * rt / 1e3;
            w.active_ms += n as f64 * at / 1e3;
        }
        out
    }
}

impl BenchRow {
    /// The share of the roofline the active version reaches, and the roof that binds it
    /// (`bw`: the copy bandwidth, `peak`: the matrix peak).
    /// Achieved over attainable, where attainable is min(peak, bandwidth x intensity), is
    /// the larger of the two shares: no intensity is needed.
    pub fn roofline_pct(&self) -> Option<(f64, &'static str)> {
        match (self.copy_bandwidth_pct, self.flops_pct) {
            (Some(b), Some(f)) if f > b => Some((f, "peak")),
            (Some(b), _) => Some((b, "bw")),
            (None, Some(f)) => Some((f, "peak")),
            (None, None) => None,
        }
    }
}

/// Shapes that move at least this many ideal bytes are "large" in
/// [`MemoryBoundSummary`]: 64 MiB, well past the H200's 60 MiB L2, where a kernel can
/// stream at the copy bandwidth.
pub const LARGE_BYTES: u64 = 64 << 20;

/// How the memory-bound shapes of a bench stand against their roof: geometric means of the
/// share of the measured copy bandwidth (over every such shape, and over the large ones)
/// and of the share of a same-size one-launch copy. A shape is memory-bound when its
/// roofline share is the bandwidth's ([`BenchRow::roofline_pct`]); failed rows are left
/// out.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryBoundSummary {
    pub shapes: usize,
    pub copy_bw_pct: f64,
    pub large_shapes: usize,
    pub large_copy_bw_pct: Option<f64>,
    pub same_size_shapes: usize,
    pub same_size_copy_pct: Option<f64>,
}

fn geomean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty() && xs.iter().all(|x| *x > 0.0))
        .then(|| (xs.iter().map(|x| x.ln()).sum::<f64>() / xs.len() as f64).exp())
}

/// The output of `cargo kopt bench --message-format json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchFile {
    pub device: DeviceInfo,
    pub ceilings: Option<Ceilings>,
    pub rows: Vec<BenchRow>,
    /// How the same-size copies were timed, or why they were not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_size_copy: Option<String>,
}

impl BenchFile {
    /// The memory-bound shapes' standing (see [`MemoryBoundSummary`]); `None` without any.
    pub fn memory_bound_summary(&self) -> Option<MemoryBoundSummary> {
        let rows: Vec<(&BenchRow, f64)> = self
            .rows
            .iter()
            .filter(|r| r.problem.is_none())
            .filter_map(|r| match r.roofline_pct() {
                Some((_, "bw")) => Some((r, r.copy_bandwidth_pct?)),
                _ => None,
            })
            .collect();
        let all: Vec<f64> = rows.iter().map(|(_, p)| *p).collect();
        let large: Vec<f64> = rows
            .iter()
            .filter(|(r, _)| r.bytes.is_some_and(|b| b >= LARGE_BYTES))
            .map(|(_, p)| *p)
            .collect();
        let same: Vec<f64> = rows
            .iter()
            .filter_map(|(r, _)| r.same_size_copy_pct)
            .collect();
        Some(MemoryBoundSummary {
            shapes: all.len(),
            copy_bw_pct: geomean(&all)?,
            large_shapes: large.len(),
            large_copy_bw_pct: geomean(&large),
            same_size_shapes: same.len(),
            same_size_copy_pct: geomean(&same),
        })
    }
}

impl MemoryBoundSummary {
    /// One sentence for people.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "memory-bound shapes: {:.1}% of the copy bandwidth in geometric mean over all {}",
            self.copy_bw_pct, self.shapes
        );
        if let Some(l) = self.large_copy_bw_pct {
            s += &format!(
                ", {l:.1}% over the {} that move {} MiB or more",
                self.large_shapes,
                LARGE_BYTES >> 20
            );
        }
        if let Some(c) = self.same_size_copy_pct {
            s += &format!(
                "; {c:.1}% of a same-size one-launch copy over {}",
                self.same_size_shapes
            );
        }
        s
    }
}

/// The part of `cargo kopt search-bench --json-out FILE` the report shows.
#[derive(Debug, Clone, Deserialize)]
pub struct SearchBenchFile {
    pub package: String,
    pub kernel: String,
    pub device: DeviceInfo,
    pub landscape: Landscape,
    pub exhaustive_evaluations_per_second: f64,
    pub seconds_are: String,
    /// Within this fraction of the best counts as converged.
    pub target: f64,
    pub rows: Vec<Row>,
}

/// A committed variant folder and what the lock file says of it.
#[derive(Debug, Clone)]
pub struct Committed {
    pub package: String,
    pub kernel: String,
    pub variant: String,
    /// The architectures whose lock entry names this variant (empty: kept on disk only,
    /// e.g. replaced by a later variant).
    pub accepted_for: Vec<String>,
    /// The evidence, or why it cannot be read.
    pub rationale: Result<Rationale, String>,
}

/// Everything a report shows, with where each part came from.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub title: String,
    /// Shown as given (the report reads no clock, so its output is reproducible).
    pub generated: Option<String>,
    /// One line per input read, e.g. `bench: docs/runs/.../bench1.json`.
    pub sources: Vec<String>,
    pub bench: Option<BenchFile>,
    pub search_benches: Vec<SearchBenchFile>,
    pub committed: Vec<Committed>,
    pub pending: Vec<PendingVariant>,
    /// Pending folders that could not be read, with why.
    pub pending_broken: Vec<(PathBuf, String)>,
}

fn read_json<T: serde::de::DeserializeOwned>(
    path: &Path,
    what: &str,
    fix: &str,
) -> Result<T, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {what} {}: {e}", path.display()))?;
    serde_json::from_str(&text)
        .map_err(|e| format!("{} is not {what} ({e}); {fix}", path.display()))
}

/// Reads the output of `cargo kopt bench --message-format json`.
pub fn read_bench(path: &Path) -> Result<BenchFile, String> {
    read_json(
        path,
        "the JSON of `cargo kopt bench`",
        "write it with `cargo kopt bench --message-format json > FILE`",
    )
}

/// Reads the file `cargo kopt search-bench --json-out FILE` wrote.
pub fn read_search_bench(path: &Path) -> Result<SearchBenchFile, String> {
    read_json(
        path,
        "the JSON of `cargo kopt search-bench`",
        "write it with `cargo kopt search-bench KERNEL --json-out FILE`",
    )
}

/// Visible subfolders, by name.
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && !name(p).starts_with('.'))
        .collect();
    v.sort();
    v
}

fn name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Every variant folder (one holding `rationale.json`) under `crate_root/kopt/<kernel>/`,
/// by kernel and variant, with the architectures its kernel's lock file accepts it for.
pub fn read_committed(package: &str, crate_root: &Path) -> Vec<Committed> {
    let mut out = Vec::new();
    for kdir in subdirs(&crate_root.join("kopt")) {
        let kernel = name(&kdir);
        let lock = std::fs::read_to_string(kdir.join("kopt.lock"))
            .ok()
            .and_then(|t| LockFile::parse(&t).ok());
        for vdir in subdirs(&kdir) {
            let path = vdir.join("rationale.json");
            if !path.exists() {
                continue;
            }
            let variant = name(&vdir);
            let accepted_for = lock
                .iter()
                .flat_map(|l| &l.accepted)
                .filter(|e| e.variant == variant)
                .map(|e| e.arch.clone())
                .collect();
            let rationale = std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|t| Rationale::parse(&t))
                .map_err(|e| format!("{}: {e}", path.display()));
            out.push(Committed {
                package: package.to_string(),
                kernel: kernel.clone(),
                variant,
                accepted_for,
                rationale,
            });
        }
    }
    out
}

/// The pending variants under `root` (`<package>/<kernel>/<arch>/`, the layout of
/// `<target>/kopt/pending/`), read without changing anything there.
pub fn read_pending(root: &Path) -> (Vec<PendingVariant>, Vec<(PathBuf, String)>) {
    let mut ok = Vec::new();
    let mut broken = Vec::new();
    for pkg in subdirs(root) {
        for kernel in subdirs(&pkg) {
            for arch in subdirs(&kernel) {
                match pending::load_dir(&arch) {
                    Ok(p) => ok.push(p),
                    Err(e) => broken.push((arch, e.to_string())),
                }
            }
        }
    }
    (ok, broken)
}
