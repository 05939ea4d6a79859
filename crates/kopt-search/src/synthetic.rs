//! Objective functions over a space, with known optima: the strategies' tests, and a way
//! to try a strategy without a device.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use kopt_spec::KernelSpec;

use crate::run::{Compiled, Compiler, Evaluator, PointOutcome, PointSpec, Status};

/// A spec for a row kernel `k(x, y, rows, cols)` with the given extra annotation text
/// (tunables, constraints...), launch text (`grid = ..., block = ...`) and
/// `(rows, cols)` shapes. Panics on a bad annotation (it is test input).
pub fn spec(extra: &str, launch: &str, shapes: &[(i64, i64)]) -> KernelSpec {
    let item = kopt_spec::spec::parse_item(
        "pub fn k(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);"
            .parse()
            .expect("tokens"),
    )
    .expect("item");
    let shapes = shapes
        .iter()
        .map(|(r, c)| format!("{{ rows: {r}, cols: {c} }}"))
        .collect::<Vec<_>>()
        .join(", ");
    let args = format!(
        "reference = \"k.cu\", x: [rows * cols], y: [rows], {launch}, shapes = [{shapes}], {extra}"
    );
    kopt_spec::spec::parse_kernel(args.parse().expect("tokens"), &item)
        .unwrap_or_else(|e| panic!("synthetic spec `{args}`: {e}"))
        .0
}

type CostFn = dyn Fn(&BTreeMap<String, i64>, &[String]) -> Option<f64> + Send + Sync;
type MetricsFn = dyn Fn(&BTreeMap<String, i64>, &[String]) -> BTreeMap<String, f64> + Send + Sync;

/// An evaluator from a function of the defines and options: `None` is a failed point.
pub struct Synthetic {
    cost: Arc<CostFn>,
    metrics: Option<Arc<MetricsFn>>,
    /// Options whose points fail the tolerance (`--use_fast_math`, say).
    pub breaks_tolerance: Vec<String>,
    /// Compile on the driver's pool (with a compiler that fails where `cost` says
    /// `f64::INFINITY` and panics where it says `f64::NEG_INFINITY`), to exercise it.
    pub with_compiler: bool,
    /// Evaluations made (not replayed).
    pub evaluated: Vec<String>,
    compiles: Arc<AtomicUsize>,
}

impl Synthetic {
    pub fn new(
        cost: impl Fn(&BTreeMap<String, i64>, &[String]) -> Option<f64> + Send + Sync + 'static,
    ) -> Self {
        Synthetic {
            cost: Arc::new(cost),
            metrics: None,
            breaks_tolerance: Vec::new(),
            with_compiler: false,
            evaluated: Vec::new(),
            compiles: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub fn with_metrics(
        mut self,
        m: impl Fn(&BTreeMap<String, i64>, &[String]) -> BTreeMap<String, f64> + Send + Sync + 'static,
    ) -> Self {
        self.metrics = Some(Arc::new(m));
        self
    }

    /// Points compiled by the pool so far.
    pub fn compiles(&self) -> usize {
        self.compiles.load(Ordering::SeqCst)
    }
}

struct SyntheticCompiler {
    cost: Arc<CostFn>,
    count: Arc<AtomicUsize>,
}

impl Compiler for SyntheticCompiler {
    fn compile(&self, p: &PointSpec) -> Compiled {
        self.count.fetch_add(1, Ordering::SeqCst);
        if (self.cost)(&p.defines, &p.options) == Some(f64::NEG_INFINITY) {
            panic!("internal compiler error on {}", p.label);
        }
        if (self.cost)(&p.defines, &p.options) == Some(f64::INFINITY) {
            return Compiled::Failed {
                log: format!("k.cu(1): error: {} does not compile", p.label),
                seconds: 0.0,
            };
        }
        Compiled::Ok {
            code: format!("// code of {}", p.label),
            seconds: 0.0,
            metrics: BTreeMap::new(),
        }
    }
}

impl Evaluator for Synthetic {
    fn compiler(&self) -> Option<Arc<dyn Compiler>> {
        self.with_compiler.then(|| {
            Arc::new(SyntheticCompiler {
                cost: self.cost.clone(),
                count: self.compiles.clone(),
            }) as Arc<dyn Compiler>
        })
    }

    fn evaluate(
        &mut self,
        p: &PointSpec,
        compiled: Option<&Compiled>,
        _progress: &mut dyn FnMut(&str),
    ) -> PointOutcome {
        if self.with_compiler {
            assert!(
                matches!(compiled, Some(Compiled::Ok { code, .. }) if code == &format!("// code of {}", p.label)),
                "the pool hands each point its own code"
            );
        }
        self.evaluated.push(p.label.clone());
        let metrics = self
            .metrics
            .as_ref()
            .map(|m| m(&p.defines, &p.options))
            .unwrap_or_default();
        if self.breaks_tolerance.iter().any(|o| p.options.contains(o)) {
            let mut o = PointOutcome::failed(
                Status::Failed,
                "numerics",
                format!("{}: y differs", p.label),
            );
            o.metrics = metrics;
            o.seconds = 0.001;
            return o;
        }
        let mut o = match (self.cost)(&p.defines, &p.options) {
            Some(c) if c.is_finite() => PointOutcome::passed(c),
            _ => PointOutcome::failed(Status::Failed, "launch", format!("{} fails", p.label)),
        };
        o.metrics = metrics;
        o.seconds = 0.001;
        o
    }
}
