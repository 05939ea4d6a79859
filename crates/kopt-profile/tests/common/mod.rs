//! The H200 captures committed as fixtures, loaded as the profile command would see them.
#![allow(dead_code)]

use std::path::PathBuf;

use kopt_engine::job::EvalJob;
use kopt_engine::protocol::{Ceilings, EvalReport, Message};
use kopt_engine::stats::Timing;
use kopt_profile::figures::EngineFigures;
use kopt_profile::ncu::{self, NcuOutput};
use kopt_profile::structure::{self, Env, Structure};

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn read(name: &str) -> String {
    std::fs::read_to_string(fixtures().join(name)).unwrap()
}

/// The five captures: (fixture stem, kernel, version, first shape's label).
pub const CAPTURES: [(&str, &str, &str); 5] = [
    ("softmax-shape0", "softmax", "reference"),
    ("softmax-shape0-online-vec4", "softmax", "online-vec4"),
    ("rmsnorm-shape0", "rmsnorm", "reference"),
    ("reduce_sum-shape0", "reduce_sum", "reference"),
    ("gqa_decode-shape0", "gqa_decode", "reference"),
];

pub struct Capture {
    pub stem: &'static str,
    pub job: EvalJob,
    pub ncu: NcuOutput,
    /// The worker's report (checks, attributes, occupancy), printed among ncu's output.
    pub report: EvalReport,
}

pub fn capture(stem: &'static str) -> Capture {
    let job: EvalJob = serde_json::from_str(&read(&format!("{stem}.job.json"))).unwrap();
    let out = ncu::parse(&read(&format!("{stem}.csv")));
    let line = out
        .worker_report_line()
        .expect("the worker's report line")
        .to_string();
    let Message::Report { report } = serde_json::from_str(&line).unwrap() else {
        panic!("not a report")
    };
    Capture {
        stem,
        job,
        ncu: out,
        report: *report,
    }
}

/// kopt's own H200 figures of the same version and shape (`cargo kopt bench`, the same
/// day): the engine's collector output, rebuilt from the recorded bench row.
pub fn engine_figures(c: &Capture) -> EngineFigures {
    let bench: serde_json::Value = serde_json::from_str(&read("h200-bench.json")).unwrap();
    let ceilings: Ceilings = serde_json::from_value(bench["ceilings"].clone()).unwrap();
    let shape = &c.job.shapes[0].label;
    let kernel = &c.job.spec.name;
    let row = bench["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kernel"] == kernel.as_str() && r["shape"] == shape.as_str())
        .unwrap();
    let us = if c.job.candidate.id == "reference" {
        row["reference_us"].as_f64().unwrap()
    } else {
        assert_eq!(row["active"], c.job.candidate.id.as_str());
        row["active_us"].as_f64().unwrap()
    };
    let mut report = c.report.clone();
    let s = report
        .shapes
        .iter_mut()
        .find(|s| &s.label == shape)
        .unwrap();
    let timing = Timing {
        method: row["method"].as_str().unwrap_or("graph").to_string(),
        launches_per_sample: 1,
        samples: 1,
        median_us: us,
        min_us: us,
        max_us: us,
        spread: row["spread"].as_f64().unwrap_or(0.0),
    };
    s.candidate.as_mut().unwrap().timing = Some(timing.clone());
    s.reference.as_mut().unwrap().timing = Some(timing);
    EngineFigures::from_report(&report, Some(&ceilings), &c.job.candidate.id, shape).unwrap()
}

pub fn structure(c: &Capture) -> Structure {
    let v = &c.job.candidate;
    let shape = &c.job.shapes[0];
    let spec_shape = kopt_spec::spec::Shape {
        values: shape.values.clone(),
        weight: 1.0,
    };
    let args = c.job.spec.shape_args(&spec_shape);
    let g = v.geometry(&c.job.spec, &args).unwrap();
    let mut values: std::collections::BTreeMap<String, i64> = shape
        .values
        .iter()
        .filter_map(|(k, n)| n.as_i64().map(|v| (k.clone(), v)))
        .collect();
    values.extend(v.defines.iter().map(|(k, v)| (k.clone(), *v)));
    structure::summarize(
        &v.source,
        &v.entry,
        &Env {
            values,
            block: g.block,
            grid: g.grid,
            smem: g.smem,
        },
    )
    .unwrap()
}
