//! What to evaluate: a candidate against the reference on a set of shapes, under a policy.
//! Built on the parent side from a spec and the committed (or proposed) files; sent to the
//! worker as is.

use std::collections::BTreeMap;

use kopt_spec::expr::{self, Expr};
use kopt_spec::files::VariantFile;
use kopt_spec::shapes::ShapeCase;
use kopt_spec::spec::{ArgValue, KernelSpec, LaunchRule, Number};
use serde::{Deserialize, Serialize};

use crate::stats;

/// One compilable version of a kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelVersion {
    /// `reference` or the variant's name.
    pub id: String,
    /// Self-contained CUDA C++ source (includes already inlined).
    pub source: String,
    pub entry: String,
    /// Its kernel arguments, when they are not the reference's
    /// ([`KernelSpec::version_args`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
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
            args: None,
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
            args: v.args.clone(),
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

    /// The kernel's argument values for this version on a shape: its own argument list,
    /// computed arguments and tensor maps under its launch rule and defines
    /// ([`KernelSpec::kernel_arg_values`]).
    pub fn arg_values(
        &self,
        spec: &KernelSpec,
        values: &BTreeMap<String, Number>,
    ) -> Result<Vec<ArgValue>, String> {
        spec.kernel_arg_values(self.args.as_deref(), &self.launch, &self.defines, values)
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

/// Above this launch time (µs) a version is timed launch by launch, each launch between
/// two CUDA events, and not in a graph: what a graph amortises, a launch's overhead of a
/// few microseconds, is under 0.5% of such a launch, and a graph of the policy's 32
/// launches would take longer than a shape's whole time budget.
pub const PER_LAUNCH_ABOVE_US: f64 = 1000.0;

/// The fewest samples a version is timed with when the policy's minimum does not fit in
/// its time budget ([`TimingPolicy::max_seconds`]): a kernel of 400 ms a launch is timed
/// 5 times, not 15.
pub const MIN_SLOW_SAMPLES: u32 = 5;

/// The share of the time budget that the warm-up of per-launch versions may take (the
/// checks before the timing have run each version three times already).
const PER_LAUNCH_WARMUP_SHARE: f64 = 0.1;

/// How one version is timed on one shape: chosen by [`TimingPolicy::plan`] from the
/// measured launch times and reported with the version's figures, so that verdicts and
/// tables can say how a time was measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimingPlan {
    /// Each sample is one launch between two CUDA events, without a graph.
    pub per_launch: bool,
    /// Launches per sample: the graph's length, 1 when `per_launch`.
    pub graph_launches: u32,
    /// Untimed launches before sampling.
    pub warmup: u32,
    /// Samples at least and at most, and the seconds of sampling after which reaching the
    /// minimum ends it. The two versions of a job are sampled in alternation under one
    /// rule, so these are the same in both plans.
    pub min_samples: u32,
    pub max_samples: u32,
    #[serde(with = "crate::jsonf")]
    pub max_seconds: f64,
    /// The version's own measured launch time the plan was chosen from, µs.
    #[serde(with = "crate::jsonf")]
    pub launch_us: f64,
    /// The plan departs from the policy (no graph, a shorter graph or fewer samples)
    /// because the launches are long: verdicts note it.
    pub scaled: bool,
    /// Why: the policy's graph, or what was scaled down and why.
    pub reason: String,
}

impl TimingPlan {
    /// The method text of the timing this plan gives, over `sets` input sets (`cold`:
    /// their bytes exceed twice the L2).
    pub fn method(&self, sets: usize, cold: bool) -> String {
        if self.per_launch {
            per_launch_method(sets, cold)
        } else {
            graph_method(self.graph_launches as usize, sets, cold)
        }
    }
}

/// The method text of a graph replay of `reps` launches over `sets` input sets.
pub fn graph_method(reps: usize, sets: usize, cold: bool) -> String {
    format!(
        "graph of {reps} launches over {sets} input set(s), L2 {}",
        if cold { "cold" } else { "warm" }
    )
}

/// The method text of launches timed one by one over `sets` input sets.
pub fn per_launch_method(sets: usize, cold: bool) -> String {
    format!(
        "each launch timed alone between events over {sets} input set(s), L2 {}",
        if cold { "cold" } else { "warm" }
    )
}

/// Launches per graph replay: enough that the replay's own overhead is noise; a power of
/// two (times the sets), so that the reference's graph of the last job is reused when the
/// candidates' speeds are alike.
pub(crate) fn graph_reps(policy: &TimingPolicy, estimate_us: f64, sets: usize) -> usize {
    let reps = ((policy.graph_target_us / estimate_us.max(0.5)).ceil() as usize)
        .next_power_of_two()
        .max(policy.min_graph_launches as usize)
        .clamp(sets, 2048);
    reps.div_ceil(sets) * sets
}

impl TimingPolicy {
    /// How to time a reference and a candidate, sampled in alternation, from their
    /// measured launch times (µs, `[reference, candidate]`) and the number of input sets
    /// their launches cycle over:
    ///
    /// - a version whose launch takes more than [`PER_LAUNCH_ABOVE_US`] is timed launch by
    ///   launch, without a graph;
    /// - the others share one graph length, the policy's (`graph_target_us` over the
    ///   faster one's time, at least `min_graph_launches`, a power of two times the sets),
    ///   shortened where one replay of each would take more than `max_seconds` over
    ///   `min_samples`; a version for which even one launch per input set would take more
    ///   than that is timed launch by launch as well;
    /// - the minimum of samples falls from `min_samples` to what fits in `max_seconds`,
    ///   never below [`MIN_SLOW_SAMPLES`];
    /// - per-launch versions warm up with what a tenth of the budget allows, at most
    ///   `warmup` launches.
    ///
    /// Kernels of microseconds get exactly the policy (its graph length, `min_samples`
    /// and `warmup`), so that their figures compare with earlier ones.
    pub fn plan(&self, launch_us: [f64; 2], sets: usize) -> [TimingPlan; 2] {
        let sets = sets.max(1);
        let budget_us = self.max_seconds.max(0.0) * 1e6;
        // A time the events could not measure (zero, NaN) counts as a short launch.
        let t = launch_us.map(|t| if t.is_finite() && t > 0.0 { t } else { 0.5 });
        let mut per_launch = t.map(|t| t > PER_LAUNCH_ABOVE_US);
        let mut reasons: [Vec<String>; 2] = Default::default();
        for i in 0..2 {
            if per_launch[i] {
                reasons[i].push(format!(
                    "a launch takes {}, over the {} above which each launch is timed alone, without a graph",
                    stats::duration_text(t[i]),
                    stats::duration_text(PER_LAUNCH_ABOVE_US)
                ));
            }
        }
        let replay_cap_us = budget_us / self.min_samples.max(1) as f64;
        let mut reps = 0usize;
        loop {
            let graphed: Vec<usize> = (0..2).filter(|&i| !per_launch[i]).collect();
            let Some(&slowest) = graphed.iter().max_by(|&&a, &&b| t[a].total_cmp(&t[b])) else {
                break;
            };
            let fastest = graphed.iter().map(|&i| t[i]).fold(f64::INFINITY, f64::min);
            let per_launch_of_all: f64 = graphed.iter().map(|&i| t[i]).sum();
            let policy_reps = graph_reps(self, fastest, sets);
            if policy_reps as f64 * per_launch_of_all <= replay_cap_us {
                reps = policy_reps;
                break;
            }
            let whole_rounds = (replay_cap_us / per_launch_of_all / sets as f64).floor();
            if whole_rounds >= 1.0 {
                reps = prev_power_of_two(whole_rounds as usize) * sets;
                for &i in &graphed {
                    reasons[i].push(format!(
                        "graph shortened from {policy_reps} to {reps} launches, so that {} replays fit in {}",
                        self.min_samples,
                        stats::duration_text(budget_us)
                    ));
                }
                break;
            }
            per_launch[slowest] = true;
            reasons[slowest].push(format!(
                "a graph of one launch of each version on each of the {sets} input sets would take {}, over the {} a replay may take",
                stats::duration_text(sets as f64 * per_launch_of_all),
                stats::duration_text(replay_cap_us)
            ));
        }
        let round_us: f64 = (0..2)
            .map(|i| {
                if per_launch[i] {
                    t[i]
                } else {
                    reps as f64 * t[i]
                }
            })
            .sum();
        let fit = (budget_us / round_us).floor();
        let min_samples = if fit >= self.min_samples as f64 {
            self.min_samples
        } else {
            (fit as u32).max(MIN_SLOW_SAMPLES.min(self.min_samples))
        };
        let fewer = (min_samples < self.min_samples).then(|| {
            format!(
                "at least {min_samples} samples, not {}: {} would take {}, over the {} budget",
                self.min_samples,
                self.min_samples,
                stats::duration_text(self.min_samples as f64 * round_us),
                stats::duration_text(budget_us)
            )
        });
        let per_launch_us: f64 = (0..2).filter(|&i| per_launch[i]).map(|i| t[i]).sum();
        let per_launch_warmup = if per_launch_us > 0.0 {
            ((PER_LAUNCH_WARMUP_SHARE * budget_us / per_launch_us).floor() as u32).min(self.warmup)
        } else {
            self.warmup
        };
        std::array::from_fn(|i| {
            let mut reason = reasons[i].clone();
            reason.extend(fewer.clone());
            TimingPlan {
                per_launch: per_launch[i],
                graph_launches: if per_launch[i] { 1 } else { reps as u32 },
                warmup: if per_launch[i] {
                    per_launch_warmup
                } else {
                    self.warmup
                },
                min_samples,
                max_samples: self.max_samples.max(min_samples),
                max_seconds: self.max_seconds,
                launch_us: t[i],
                scaled: !reason.is_empty(),
                reason: if reason.is_empty() {
                    format!(
                        "the policy's: a graph of {reps} launches, at least {min_samples} samples"
                    )
                } else {
                    reason.join("; ")
                },
            }
        })
    }
}

/// The largest power of two not above `n` (`n` at least 1).
fn prev_power_of_two(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.max(1).leading_zeros())
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

    /// The plan of kernels of microseconds is the policy, unchanged: the graph length of
    /// `graph_reps`, its minimum of samples and warm-up.
    #[test]
    fn microsecond_kernels_are_timed_by_the_policy() {
        let policy = TimingPolicy::default();
        let plans = policy.plan([5.0, 5.0], 1);
        for p in &plans {
            assert!(!p.per_launch && !p.scaled, "{p:?}");
            // 500 µs of 5 µs launches: 100, 128 as a power of two.
            assert_eq!(p.graph_launches, 128);
            assert_eq!((p.min_samples, p.max_samples), (15, 200));
            assert_eq!((p.warmup, p.max_seconds), (5, 2.0));
            assert_eq!(p.launch_us, 5.0);
            assert!(p.reason.starts_with("the policy's"), "{}", p.reason);
        }
        // One graph length for both, from the faster (as before plans).
        let plans = policy.plan([38.0, 5.0], 1);
        assert_eq!(plans.map(|p| p.graph_launches), [128, 128]);
        assert_eq!(policy.plan([38.0, 38.0], 1)[0].graph_launches, 32);
        let sets = policy.plan([38.0, 38.0], 5);
        assert_eq!(sets[0].graph_launches % 5, 0);
        assert_eq!(
            sets[0].graph_launches as usize,
            graph_reps(&policy, 38.0, 5)
        );
        // The search's policy: short graphs, fewer samples, half a second.
        let search = TimingPolicy {
            warmup: 3,
            min_samples: 7,
            max_samples: 60,
            max_seconds: 0.5,
            graph_target_us: 100.0,
            min_graph_launches: 1,
            ..TimingPolicy::default()
        };
        let p = &search.plan([38.0, 40.0], 1)[0];
        assert_eq!((p.graph_launches, p.min_samples, p.warmup), (4, 7, 3));
        assert!(!p.scaled);
        // Up to a launch of a millisecond: still the policy's graph.
        let p = &policy.plan([1000.0, 1000.0], 1)[0];
        assert_eq!(
            (p.per_launch, p.graph_launches, p.min_samples),
            (false, 32, 15)
        );
    }

    /// A naive softmax over 8192x50257 takes about 400 ms a launch: each launch alone, 5
    /// samples, no warm-up beyond the checks', and the reason stated.
    #[test]
    fn launches_of_hundreds_of_milliseconds_are_timed_one_by_one_and_few_times() {
        let policy = TimingPolicy::default();
        let plans = policy.plan([400_000.0, 400_000.0], 1);
        for p in &plans {
            assert!(p.per_launch && p.scaled, "{p:?}");
            assert_eq!(p.graph_launches, 1);
            assert_eq!(p.min_samples, MIN_SLOW_SAMPLES);
            assert_eq!(p.warmup, 0);
            assert!(
                p.reason
                    .contains("a launch takes 400.0 ms, over the 1.0 ms"),
                "{}",
                p.reason
            );
            assert!(
                p.reason.contains("at least 5 samples, not 15"),
                "{}",
                p.reason
            );
            assert!(p.method(1, true).starts_with("each launch timed alone"));
        }
        // 20 ms: one by one, but 15 samples still fit in 2 s (0.6 s).
        let p = &policy.plan([20_000.0, 20_000.0], 1)[0];
        assert!(p.per_launch);
        assert_eq!((p.min_samples, p.warmup), (15, 5));
        // 100 ms: 10 rounds of 200 ms fill the budget.
        let p = &policy.plan([100_000.0, 100_000.0], 1)[0];
        assert_eq!((p.min_samples, p.warmup), (10, 1));
        // 20 s a launch: never fewer than 5 samples.
        assert_eq!(policy.plan([2e7, 2e7], 1)[0].min_samples, 5);
        // A policy asking for fewer than 5 samples keeps its own minimum.
        let few = TimingPolicy {
            min_samples: 3,
            ..TimingPolicy::default()
        };
        assert_eq!(few.plan([4e5, 4e5], 1)[0].min_samples, 3);
    }

    #[test]
    fn a_slow_reference_does_not_take_a_fast_candidate_out_of_its_graph() {
        let policy = TimingPolicy::default();
        let [r, c] = policy.plan([400_000.0, 5.0], 1);
        assert!(r.per_launch && r.scaled);
        // The candidate keeps the graph a 5 µs kernel always gets.
        assert!(!c.per_launch);
        assert_eq!(c.graph_launches, 128);
        // One sampling rule for both: the slow one's round sets the minimum.
        assert_eq!((r.min_samples, c.min_samples), (5, 5));
        assert!(
            c.scaled && c.reason.contains("at least 5 samples"),
            "{}",
            c.reason
        );
        // And the other way round.
        let [r, c] = policy.plan([5.0, 400_000.0], 1);
        assert!(!r.per_launch && c.per_launch);
    }

    #[test]
    fn a_graph_too_long_for_the_budget_is_shortened_or_dropped() {
        let policy = TimingPolicy::default();
        // 1 µs and 0.9 ms: the policy's 512 launches of both would take 461 ms a replay,
        // over the 133 ms that 15 replays in 2 s allow: 128 launches.
        let [r, c] = policy.plan([1.0, 900.0], 1);
        assert_eq!((r.graph_launches, c.graph_launches), (128, 128));
        assert!(
            r.scaled && r.reason.contains("shortened from 512 to 128"),
            "{}",
            r.reason
        );
        assert_eq!(r.min_samples, 15);
        // 0.9 and 0.8 ms over 64 input sets: one launch of each on each set takes
        // 108.8 ms, and a budget of 1 s allows 66.7 ms a replay: the slower goes launch by
        // launch, the faster keeps a graph of one launch a set (51.2 ms).
        let tight = TimingPolicy {
            max_seconds: 1.0,
            ..TimingPolicy::default()
        };
        let [r, c] = tight.plan([900.0, 800.0], 64);
        assert!(r.per_launch && !c.per_launch, "{r:?} {c:?}");
        assert!(
            r.reason
                .contains("on each of the 64 input sets would take 108.8 ms"),
            "{}",
            r.reason
        );
        assert_eq!(c.graph_launches, 64);
    }

    /// Whatever the launch time, the minimum of samples fits in the budget, or is the
    /// floor of 5 rounds.
    #[test]
    fn sampling_to_the_minimum_stays_within_the_budget() {
        let policy = TimingPolicy::default();
        let mut t = 0.3;
        while t < 1e8 {
            for other in [t, 5.0, t * 20.0] {
                let plans = policy.plan([t, other], 3);
                let round: f64 = plans
                    .iter()
                    .zip([t, other])
                    .map(|(p, t)| p.graph_launches as f64 * t)
                    .sum();
                let min = plans[0].min_samples as f64;
                assert!(
                    min * round <= 2e6 * 1.0001 || plans[0].min_samples == MIN_SLOW_SAMPLES,
                    "{t} µs and {other} µs: {plans:?}"
                );
                assert_eq!(plans[0].min_samples, plans[1].min_samples);
                for p in &plans {
                    assert_eq!(p.per_launch, p.graph_launches == 1, "{p:?}");
                    assert!(p.per_launch || p.graph_launches % 3 == 0, "{p:?}");
                }
            }
            t *= 1.7;
        }
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
