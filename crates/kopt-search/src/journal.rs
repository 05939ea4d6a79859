//! A search's record in the run journal (`kopt_store::journal`), and resuming from it.
//!
//! ```text
//! <target>/kopt/runs/<run-id>/journal.jsonl
//!     run_started  {config: Header, budget}
//!     candidate    {kernel, round, candidate: "<label>", summary,
//!                   artefacts: ["artefacts/search/000017.json"]}   one per point
//!     verdict      {kernel, candidate: "<label>", passed, failure_class?, detail}
//!     ...
//!     run_finished {summary} | run_interrupted {reason}
//! <target>/kopt/runs/<run-id>/artefacts/search/000017.json
//!     {format, seq, label, values {axis: value}, elapsed, outcome}
//! ```
//!
//! The point's file is written (atomically) before its `candidate` event, and the event
//! is the commit point: a point is part of the run when its event is in the journal. A
//! resumed run reads the header back (and must match it: kernel, strategy, seed, seeding,
//! space, device, evaluation settings; the budget may change), and every committed point
//! becomes part of the [`Prior`].

use std::collections::BTreeMap;

use kopt_store::journal::{Event, Journal};
use kopt_store::KoptDir;
use serde::{Deserialize, Serialize};

use crate::run::{Budget, Control, Observer, PointOutcome, Prior, Record, StopReason, Summary};
use crate::seed::{ParameterMatrix, SnapshotHints};
use crate::space::{OptionAxes, Space};
use crate::strategy::StrategyKind;

pub const FORMAT: u32 = 1;
const ARTEFACTS: &str = "search";

/// What a search run is; a resumed run must be the same run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// Always `search`.
    pub kind: String,
    pub package: String,
    pub kernel: String,
    pub strategy: StrategyKind,
    pub seed: u64,
    pub seeded: bool,
    /// [`Space::fingerprint`].
    pub space: String,
    pub points: usize,
    pub options: OptionAxes,
    /// The device's identity (`uuid|name|driver`).
    pub device: String,
    /// How points are evaluated (timing policy, shapes...), as the evaluator states it.
    pub evaluation: serde_json::Value,
    /// The snapshot the seed came from, and the matrix (a resumed run reuses them rather
    /// than measuring again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hints: Option<SnapshotHints>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matrix: Option<ParameterMatrix>,
}

impl Header {
    /// What differs from `other` among the fields a resumed run must keep.
    fn differences(&self, other: &Header) -> Vec<String> {
        let mut d = Vec::new();
        let mut cmp = |what: &str, a: String, b: String| {
            if a != b {
                d.push(format!("{what}: the run has {a}, this command {b}"));
            }
        };
        cmp("kind", self.kind.clone(), other.kind.clone());
        cmp("kernel", self.kernel.clone(), other.kernel.clone());
        cmp("package", self.package.clone(), other.package.clone());
        cmp(
            "strategy",
            self.strategy.to_string(),
            other.strategy.to_string(),
        );
        cmp("seed", self.seed.to_string(), other.seed.to_string());
        cmp("seeded", self.seeded.to_string(), other.seeded.to_string());
        cmp(
            "space",
            format!(
                "{} ({} points)",
                &self.space[..12.min(self.space.len())],
                self.points
            ),
            format!(
                "{} ({} points)",
                &other.space[..12.min(other.space.len())],
                other.points
            ),
        );
        cmp(
            "options",
            format!("{:?}", self.options),
            format!("{:?}", other.options),
        );
        cmp("device", self.device.clone(), other.device.clone());
        cmp(
            "evaluation",
            self.evaluation.to_string(),
            other.evaluation.to_string(),
        );
        d
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct PointFile {
    format: u32,
    seq: usize,
    label: String,
    values: BTreeMap<String, i64>,
    elapsed: f64,
    outcome: PointOutcome,
}

/// An open search journal; also the [`Observer`] that writes it.
pub struct SearchJournal {
    journal: Journal,
    kernel: String,
    /// The first write that failed (the run stops on it).
    pub error: Option<String>,
}

impl std::fmt::Debug for SearchJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SearchJournal")
            .field("run_id", &self.journal.run_id())
            .finish()
    }
}

/// The header of a run's journal.
pub fn read_header(kopt: &KoptDir, run_id: &str) -> Result<Header, String> {
    let read = Journal::read(kopt, run_id).map_err(|e| {
        format!(
            "cannot read the journal of run `{run_id}`: {e} (list runs with `ls {}`)",
            kopt.runs_root().display()
        )
    })?;
    header_of(&read.entries, run_id)
}

fn header_of(entries: &[kopt_store::journal::Entry], run_id: &str) -> Result<Header, String> {
    let config = entries
        .iter()
        .find_map(|e| match &e.event {
            Event::RunStarted { config, .. } => Some(config.clone()),
            _ => None,
        })
        .ok_or_else(|| {
            format!(
                "run `{run_id}` has no `run_started` event: it is not a run that can be resumed"
            )
        })?;
    serde_json::from_value(config).map_err(|e| {
        format!(
            "run `{run_id}` is not a search run ({e}): resume it with the command that started it"
        )
    })
}

impl SearchJournal {
    /// Starts the journal of a new run.
    pub fn create(
        kopt: &KoptDir,
        run_id: &str,
        header: &Header,
        budget: &Budget,
    ) -> Result<Self, String> {
        let (mut journal, resumed) =
            Journal::open_or_resume(kopt, run_id).map_err(|e| e.to_string())?;
        if !resumed.entries.is_empty() {
            return Err(format!(
                "run `{run_id}` already has a journal: resume it with `--resume {run_id}`, or start a new run"
            ));
        }
        journal
            .append(Event::RunStarted {
                config: serde_json::to_value(header).expect("headers serialise"),
                budget: serde_json::to_value(budget).expect("budgets serialise"),
            })
            .map_err(|e| e.to_string())?;
        Ok(SearchJournal {
            journal,
            kernel: header.kernel.clone(),
            error: None,
        })
    }

    /// Opens an interrupted run to go on with it: checks it is the same run, and reads
    /// every committed point back.
    pub fn resume(
        kopt: &KoptDir,
        run_id: &str,
        header: &Header,
        space: &Space,
    ) -> Result<(Self, Prior), String> {
        let (journal, resumed) =
            Journal::open_or_resume(kopt, run_id).map_err(|e| e.to_string())?;
        let recorded = header_of(&resumed.entries, run_id)?;
        let diff = recorded.differences(header);
        if !diff.is_empty() {
            return Err(format!(
                "run `{run_id}` cannot be resumed by this command: {}. Resume with the same kernel, strategy, seed and options, on the same device",
                diff.join("; ")
            ));
        }
        let mut prior = Prior::default();
        for e in &resumed.entries {
            let Event::Candidate {
                artefacts,
                candidate,
                ..
            } = &e.event
            else {
                continue;
            };
            let Some(rel) = artefacts
                .iter()
                .find(|a| a.contains(&format!("/{ARTEFACTS}/")))
            else {
                continue;
            };
            let path = journal.dir().join(rel);
            let text = std::fs::read_to_string(&path).map_err(|err| {
                format!("run `{run_id}`: the point `{candidate}` cites {} which cannot be read ({err}): the run folder was damaged", path.display())
            })?;
            let pf: PointFile = serde_json::from_str(&text)
                .map_err(|err| format!("{}: not a search point ({err})", path.display()))?;
            if pf.format != FORMAT {
                return Err(format!(
                    "{}: format {} (this kopt reads {FORMAT}): upgrade kopt",
                    path.display(),
                    pf.format
                ));
            }
            let id = space.find(&pf.values).ok_or_else(|| {
                format!(
                    "{}: the point `{}` is not in this space",
                    path.display(),
                    pf.label
                )
            })?;
            prior.elapsed = prior.elapsed.max(pf.elapsed);
            prior.outcomes.insert(id, pf.outcome);
        }
        Ok((
            SearchJournal {
                journal,
                kernel: header.kernel.clone(),
                error: None,
            },
            prior,
        ))
    }

    pub fn run_id(&self) -> &str {
        self.journal.run_id()
    }

    pub fn dir(&self) -> &std::path::Path {
        self.journal.dir()
    }

    fn write(&mut self, r: &Record) -> Result<(), String> {
        let pf = PointFile {
            format: FORMAT,
            seq: r.seq,
            label: r.label.clone(),
            values: r.values.clone(),
            elapsed: r.elapsed,
            outcome: r.outcome.clone(),
        };
        let rel = self
            .journal
            .save_artefact(
                &format!("{ARTEFACTS}/{:06}.json", r.seq),
                &serde_json::to_string(&pf).expect("points serialise"),
            )
            .map_err(|e| e.to_string())?;
        let o = &r.outcome;
        let summary = match (o.cost, &r.interesting) {
            (Some(c), _) if r.replayed => format!("cost {c:.4} (replayed from the journal)"),
            (Some(c), Some(why)) => format!("cost {c:.4}; kept as interesting: {why}"),
            (Some(c), None) => format!("cost {c:.4} ({:.2}x the reference)", 1.0 / c),
            (None, _) => format!("{} failed", o.failure.as_deref().unwrap_or("evaluation")),
        };
        self.journal
            .append(Event::Candidate {
                kernel: self.kernel.clone(),
                round: r.round as u32,
                candidate: r.label.clone(),
                summary,
                artefacts: vec![rel],
            })
            .map_err(|e| e.to_string())?;
        let mut detail = match o.cost {
            Some(_) => o
                .shapes_us
                .iter()
                .map(|(s, us)| format!("{s}: {us:.2} µs"))
                .collect::<Vec<_>>()
                .join(", "),
            None => o.detail.lines().take(3).collect::<Vec<_>>().join(" / "),
        };
        if let Some(n) = &r.note {
            detail = format!("{detail}; {n}");
        }
        self.journal
            .append(Event::Verdict {
                kernel: self.kernel.clone(),
                candidate: r.label.clone(),
                passed: o.cost.is_some(),
                failure_class: o.failure.clone(),
                detail,
                times_us: o.shapes_us.clone(),
                artefacts: vec![],
            })
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Records the end of the run.
    pub fn finish(&mut self, s: &Summary) -> Result<(), String> {
        let best = s
            .best_record()
            .map(|b| {
                format!(
                    "best `{}` cost {:.4}",
                    b.label,
                    b.outcome.cost.unwrap_or(f64::NAN)
                )
            })
            .unwrap_or_else(|| "no point passed".into());
        let text = format!(
            "{}: {} points ({} replayed, {} compile failures) in {:.1} s; {best}",
            s.stop.describe(),
            s.evaluations,
            s.replayed,
            s.compile_failures,
            s.seconds
        );
        let event = if s.stop == StopReason::Interrupted {
            Event::RunInterrupted { reason: text }
        } else {
            Event::RunFinished { summary: text }
        };
        self.journal
            .append(event)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

impl Observer for SearchJournal {
    fn record(&mut self, _space: &Space, r: &Record, _best: Option<&Record>) -> Control {
        if r.replayed {
            // Already in the journal.
            return Control::Continue;
        }
        match self.write(r) {
            Ok(()) => Control::Continue,
            Err(e) => {
                self.error = Some(format!("the run's journal could not be written ({e}); the run stopped, and `--resume {}` goes on from the last recorded point", self.journal.run_id()));
                Control::Stop
            }
        }
    }
}
