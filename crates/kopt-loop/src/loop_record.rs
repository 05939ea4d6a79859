//! The optimisation loop's record in the run journal, written as the loop goes, and what
//! a resumed run reads back from it.
//!
//! ```text
//! <target>/kopt/runs/<run-id>/journal.jsonl
//!     run_started     {config, budget}
//!     profile         {kernel, summary, artefacts}                   the reference's snapshot
//!     baseline, noise {kernel, ...}                                  the loop's starting point
//!     kernel_started  {kernel, device, artefacts: [loop/<kernel>-start.json]}
//!     prompt, reply   {kernel, round, role, text}                    one pair per exchange
//!     candidate       {kernel, round, candidate, summary, artefacts: [<kernel>-<id>.cu]}
//!     verdict         {kernel, candidate, passed, failure_class?, detail, times_us,
//!                      artefacts: [verdicts/<kernel>-<id>.json]}
//!     kernel_finished {kernel, result, artefacts: [pending/<kernel>.json]?}
//!     pending_saved   {package, kernel, arch, variant}
//!     resumed         {kernel?, detail}                              a resumed run's notes
//!     run_finished    {summary}
//! ```
//!
//! Each event is written (and synced) when it happens, so a killed run keeps everything up
//! to its last whole line. A resumed run (`cargo kopt optimize --resume RUN`) reads every
//! kernel's record back: a kernel with a `kernel_finished` event is not run again (its
//! winner is saved again if the kill came between the two); any other kernel starts where
//! its `kernel_started` record says (the snapshot, starting version, noise and similar
//! cases it had), its agent answered from the recorded session while the requests are the
//! recorded ones (`kopt_agent::session::Resume`), and each candidate whose job (versions,
//! shapes, seeds, timing policy) and device hash to its recorded verdict's key, judged
//! against the same best, answered from that verdict instead of the GPU.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use kopt_agent::context::CaseLine;
use kopt_engine::job::{EvalJob, KernelVersion};
use kopt_engine::verdict::Verdict;
use kopt_spec::files::{Rationale, VariantFile};
use kopt_store::journal::{Entry, Event, Journal};
use kopt_store::pending::{PendingMeta, PendingVariant};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::optimize::{BaselineTimes, KernelResult, TimingNoise};

/// The version of the loop's record files (`verdicts/`, `loop/`, `pending/`).
pub const FORMAT: u32 = 1;

/// A reply that held no usable proposal is journalled as a verdict of this class; it is
/// no candidate.
pub const MALFORMED: &str = "malformed";

/// What a verdict answers: the evaluation job (both versions, the shapes, seeds and timing
/// policy) on one device. A recorded verdict answers a candidate again only under the same
/// key.
pub fn verdict_key(job: &EvalJob, device: &str) -> String {
    let json = serde_json::to_string(job).expect("jobs serialise");
    kopt_engine::cache::hash_parts(&["kopt-loop-verdict-v1", &json, device])
}

/// `verdicts/<kernel>-<candidate>.json`: a verdict in full, with what it answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerdictRecord {
    pub format: u32,
    pub kernel: String,
    pub candidate: String,
    /// [`verdict_key`] of the job it came from.
    pub key: String,
    /// The best's time per shape the watchdog compared with (`None`: the reference in the
    /// same job).
    pub best_us: Option<BTreeMap<String, f64>>,
    pub verdict: Verdict,
}

/// The accepted variant a loop started from, as its record keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedStart {
    pub version: KernelVersion,
    pub verdict: Verdict,
    pub baseline: Option<BaselineTimes>,
}

/// `loop/<kernel>-start.json`: what a kernel's loop started from, so that a resumed loop
/// starts from the same place and asks the agent the same first question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartRecord {
    pub format: u32,
    /// The hashes of the kernel's reference and spec it was measured with: a resumed run
    /// that finds them changed settles the start again.
    pub reference_hash: String,
    pub spec_hash: String,
    /// The lock entry for the device's architecture when the loop started (variant and
    /// source hash), whether or not the loop could start from it: a resumed run that finds
    /// another one settles the start again.
    pub accepted: Option<(String, String)>,
    pub start: Option<RecordedStart>,
    pub noise: Option<TimingNoise>,
    pub cases: Vec<CaseLine>,
    pub snapshot: Option<kopt_profile::snapshot::Snapshot>,
}

/// `pending/<kernel>.json`: a winner's pending variant, written before `kernel_finished`
/// so that a kill before its `pending_saved` loses nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingRecord {
    pub format: u32,
    pub meta: PendingMeta,
    pub source: String,
    pub variant: VariantFile,
    pub rationale: Rationale,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptx: Option<String>,
}

impl PendingRecord {
    pub fn of(p: &PendingVariant) -> Self {
        PendingRecord {
            format: FORMAT,
            meta: p.meta.clone(),
            source: p.source.clone(),
            variant: p.variant.clone(),
            rationale: p.rationale.clone(),
            ptx: p.ptx.clone(),
        }
    }

    pub fn into_pending(self) -> PendingVariant {
        PendingVariant {
            meta: self.meta,
            source: self.source,
            variant: self.variant,
            rationale: self.rationale,
            ptx: self.ptx,
        }
    }
}

/// Candidates, and how many passed, as a run journal records them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub candidates: usize,
    pub accepted: usize,
    pub rejected: usize,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.candidates += o.candidates;
        self.accepted += o.accepted;
        self.rejected += o.rejected;
    }
}

/// Per kernel, the candidates of a journal's `verdict` events: each candidate once, by its
/// last verdict (a resumed run that verified a candidate again records it twice), replies
/// without a usable proposal ([`MALFORMED`]) left out. What the run's summary reports.
pub fn journal_counts(entries: &[Entry]) -> BTreeMap<String, Counts> {
    let mut last: BTreeMap<(&str, &str), bool> = BTreeMap::new();
    for e in entries {
        if let Event::Verdict {
            kernel,
            candidate,
            passed,
            failure_class,
            ..
        } = &e.event
        {
            if failure_class.as_deref() == Some(MALFORMED) {
                continue;
            }
            last.insert((kernel, candidate), *passed);
        }
    }
    let mut counts: BTreeMap<String, Counts> = BTreeMap::new();
    for ((kernel, _), passed) in last {
        let c = counts.entry(kernel.to_string()).or_default();
        c.candidates += 1;
        if passed {
            c.accepted += 1;
        } else {
            c.rejected += 1;
        }
    }
    counts
}

/// One kernel's record, as a resumed run reads it.
#[derive(Debug, Default)]
pub struct KernelRecord {
    /// The device its verdicts came from, and where its loop started.
    pub started: Option<(String, StartRecord)>,
    /// Its result, and its pending variants' records (the winner of every shape first,
    /// then the winners of regions, in the order they are saved), once its loop had ended.
    pub finished: Option<(KernelResult, Vec<PendingRecord>)>,
    /// How many `pending_saved` events follow its `kernel_finished`: that many of its
    /// records were saved.
    pub pending_saved: usize,
    /// The last recorded verdict of each candidate.
    pub verdicts: BTreeMap<String, VerdictRecord>,
    /// The replies without a usable proposal: id and error.
    pub malformed: BTreeSet<(String, String)>,
}

/// Every kernel's record in a run's journal.
#[derive(Debug, Default)]
pub struct RunRecord {
    pub kernels: BTreeMap<String, KernelRecord>,
}

impl RunRecord {
    /// Reads the record of every kernel from `entries`, the artefacts from `dir` (the run's
    /// folder); a cited file that cannot be read is an error naming it.
    pub fn read(entries: &[Entry], dir: &Path) -> Result<Self> {
        fn load<T: serde::de::DeserializeOwned>(dir: &Path, rel: &str) -> Result<T> {
            let path = dir.join(rel);
            let text = std::fs::read_to_string(&path).map_err(|e| {
                let message = format!(
                    "{} cannot be read ({e}): the run folder was damaged; resume without the kernel's record by moving its events aside, or start a new run",
                    path.display()
                );
                Error::file(&path, message, e)
            })?;
            let not_a_record = |e: serde_json::Error| {
                let message = format!("{}: not a loop record ({e})", path.display());
                Error::file(&path, message, e)
            };
            let value: serde_json::Value = serde_json::from_str(&text).map_err(not_a_record)?;
            let format = value["format"].as_u64().unwrap_or(0);
            if format != u64::from(FORMAT) {
                return Err(Error::File {
                    message: format!(
                        "{}: format {format} (this kopt reads {FORMAT}): resume with the kopt that started the run",
                        path.display()
                    ),
                    path,
                    source: None,
                });
            }
            serde_json::from_value(value).map_err(not_a_record)
        }
        let cited = |artefacts: &[String], folder: &str| -> Option<String> {
            artefacts
                .iter()
                .find(|a| a.starts_with(&format!("artefacts/{folder}/")))
                .cloned()
        };
        let mut run = RunRecord::default();
        for e in entries {
            match &e.event {
                Event::KernelStarted {
                    kernel,
                    device,
                    artefacts,
                } => {
                    if let Some(rel) = cited(artefacts, "loop") {
                        let start: StartRecord = load(dir, &rel)?;
                        run.kernels.entry(kernel.clone()).or_default().started =
                            Some((device.clone(), start));
                    }
                }
                Event::Verdict {
                    kernel,
                    candidate,
                    failure_class,
                    detail,
                    artefacts,
                    ..
                } => {
                    let k = run.kernels.entry(kernel.clone()).or_default();
                    if failure_class.as_deref() == Some(MALFORMED) {
                        k.malformed.insert((candidate.clone(), detail.clone()));
                    } else if let Some(rel) = cited(artefacts, "verdicts") {
                        let v: VerdictRecord = load(dir, &rel)?;
                        k.verdicts.insert(candidate.clone(), v);
                    }
                }
                Event::KernelFinished {
                    kernel,
                    result,
                    artefacts,
                } => {
                    let result: KernelResult =
                        serde_json::from_value(result.clone()).map_err(|e| {
                            let message = format!("the journal's result of `{kernel}` cannot be read ({e}): resume with the kopt that started the run");
                            Error::file(dir.join(kopt_store::journal::JOURNAL_FILE), message, e)
                        })?;
                    let pending = artefacts
                        .iter()
                        .filter(|a| a.starts_with("artefacts/pending/"))
                        .map(|rel| load::<PendingRecord>(dir, rel))
                        .collect::<Result<Vec<_>>>()?;
                    let k = run.kernels.entry(kernel.clone()).or_default();
                    k.finished = Some((result, pending));
                    k.pending_saved = 0;
                }
                Event::PendingSaved { kernel, .. } => {
                    run.kernels.entry(kernel.clone()).or_default().pending_saved += 1;
                }
                _ => {}
            }
        }
        Ok(run)
    }
}

/// The verdicts a resumed loop may answer from, and whether it just did.
#[derive(Debug, Default)]
pub struct RecordedVerdicts {
    /// The identity of the device the kernel runs on now (part of the key).
    pub device: String,
    pub by_id: BTreeMap<String, VerdictRecord>,
    /// Answered from the record so far.
    pub answered: usize,
    last: bool,
}

impl RecordedVerdicts {
    pub fn new(device: String, by_id: BTreeMap<String, VerdictRecord>) -> Self {
        RecordedVerdicts {
            device,
            by_id,
            answered: 0,
            last: false,
        }
    }

    /// The recorded verdict of `job`'s candidate, if it was given the same job on the same
    /// device against the same best; each is answered once.
    pub fn answer(
        &mut self,
        job: &EvalJob,
        best_us: Option<&BTreeMap<String, f64>>,
    ) -> Option<Verdict> {
        self.last = false;
        let r = self.by_id.get(&job.candidate.id)?;
        if r.key != verdict_key(job, &self.device) || !same_times(r.best_us.as_ref(), best_us) {
            return None;
        }
        let r = self.by_id.remove(&job.candidate.id)?;
        self.answered += 1;
        self.last = true;
        Some(r.verdict)
    }

    /// The last candidate was answered from the record.
    pub fn last(&self) -> bool {
        self.last
    }
}

/// The same best's times, to the precision a JSON round trip keeps.
fn same_times(a: Option<&BTreeMap<String, f64>>, b: Option<&BTreeMap<String, f64>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.len() == b.len()
                && a.iter().zip(b).all(|((ka, va), (kb, vb))| {
                    ka == kb && (va - vb).abs() <= 1e-9 * va.abs().max(vb.abs())
                })
        }
        _ => false,
    }
}

/// An artefact name under `folder` for `stem.ext` that the run has not used yet (a
/// candidate verified again after its context changed keeps its first record).
pub fn unused_artefact(journal: &Journal, folder: Option<&str>, stem: &str, ext: &str) -> String {
    let prefix = folder.map(|f| format!("{f}/")).unwrap_or_default();
    (1..)
        .map(|n| match n {
            1 => format!("{prefix}{stem}.{ext}"),
            n => format!("{prefix}{stem}.{n}.{ext}"),
        })
        .find(|name| {
            !journal
                .dir()
                .join(kopt_store::journal::ARTEFACTS_DIR)
                .join(name)
                .exists()
        })
        .expect("some name is free")
}

/// The options of a run a resumed run must keep, as `run_started` records them; the
/// budgets may change.
pub const KEPT_OPTIONS: &[&str] = &[
    "agent",
    "reviewer",
    "kernels",
    "hint",
    "min_gain",
    "min_uniform_gain",
    "from_reference",
    "context_tokens",
    // A verdict recorded without compute-sanitizer must not make a winner of a run that
    // runs it.
    "sanitize",
];

/// How this command's configuration differs from the run's in what a resumed run must
/// keep (an option the run did not record is not compared).
pub fn config_differences(recorded: &serde_json::Value, now: &serde_json::Value) -> Vec<String> {
    KEPT_OPTIONS
        .iter()
        .filter_map(|key| {
            let then = recorded.get(*key)?;
            let now = now.get(*key).unwrap_or(&serde_json::Value::Null);
            (then != now).then(|| format!("{key}: the run has {then}, this command {now}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(kernel: &str, candidate: &str, passed: bool, class: Option<&str>) -> Entry {
        Entry {
            seq: 0,
            at: String::new(),
            event: Event::Verdict {
                kernel: kernel.into(),
                candidate: candidate.into(),
                passed,
                failure_class: class.map(str::to_string),
                detail: String::new(),
                times_us: BTreeMap::new(),
                artefacts: vec![],
            },
        }
    }

    #[test]
    fn a_candidate_counts_once_by_its_last_verdict_and_a_malformed_reply_not_at_all() {
        let entries = [
            verdict("softmax", "r1c1", true, None),
            verdict("softmax", "r2c1", false, Some("numerics")),
            verdict("softmax", "r3", false, Some(MALFORMED)),
            // Verified again after a resume whose context changed.
            verdict("softmax", "r2c1", true, None),
            verdict("rmsnorm", "r1c1", false, Some("compile")),
        ];
        let c = journal_counts(&entries);
        assert_eq!(
            c["softmax"],
            Counts {
                candidates: 2,
                accepted: 2,
                rejected: 0
            }
        );
        assert_eq!(
            c["rmsnorm"],
            Counts {
                candidates: 1,
                accepted: 0,
                rejected: 1
            }
        );
    }

    #[test]
    fn a_resumed_run_must_keep_the_options_that_shape_its_questions() {
        let then = serde_json::json!({"agent": "cmd:a", "hint": null, "min_gain": 0.03, "run_budget": {"candidates": 1}});
        let same = serde_json::json!({"agent": "cmd:a", "hint": null, "min_gain": 0.03, "run_budget": null, "from_reference": true});
        assert!(
            config_differences(&then, &same).is_empty(),
            "budgets may change; what the run did not record is not compared"
        );
        let other = serde_json::json!({"agent": "cmd:b", "hint": "tile it", "min_gain": 0.03});
        assert_eq!(
            config_differences(&then, &other),
            [
                "agent: the run has \"cmd:a\", this command \"cmd:b\"",
                "hint: the run has null, this command \"tile it\""
            ]
        );
    }

    #[test]
    fn times_match_across_a_json_round_trip_and_nothing_else() {
        let a: BTreeMap<String, f64> = [("rows=8".to_string(), 12.345678901234567)].into();
        let back: BTreeMap<String, f64> =
            serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        assert!(same_times(Some(&a), Some(&back)));
        assert!(same_times(None, None));
        assert!(!same_times(Some(&a), None));
        let slower: BTreeMap<String, f64> = [("rows=8".to_string(), 12.35)].into();
        assert!(!same_times(Some(&a), Some(&slower)));
    }
}
