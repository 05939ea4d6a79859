//! The journal of an optimisation run: every prompt, reply, candidate, verdict and
//! profile, in order, so that a run can be resumed after an interruption and audited
//! after the fact.
//!
//! ```text
//! <target>/kopt/runs/<run-id>/journal.jsonl   one JSON event per line, append-only
//! <target>/kopt/runs/<run-id>/artefacts/      candidate sources, profiles, prompts too
//!                                             long for a line, ...
//! ```
//!
//! Each line is `{"seq": N, "at": "<RFC 3339>", "event": "<kind>", ...}`, written with one
//! `write` and synced before [`Journal::append`] returns, so a crash loses at most the
//! line being written. Such a torn last line is tolerated on
//! [`Journal::open_or_resume`]: it is reported, kept in `torn-line-<N>.txt`, and cut off so
//! that appends go on from the last whole event. Secrets are redacted (see
//! [`crate::redact`]) from every event and artefact before it is written.

use std::io::{Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::layout::{is_plain_name, now_rfc3339, KoptDir};
use crate::pending::{self, PendingVariant, Saved};
use crate::{fsx, io, Error, Result};
use kopt_redact::Redactor;

pub const JOURNAL_FILE: &str = "journal.jsonl";
pub const ARTEFACTS_DIR: &str = "artefacts";

/// What happened. New kinds may be added; a reader skips none silently (an unknown kind
/// is an error naming the line, so that a newer journal is not half understood).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The run's configuration and budget, as the loop understood them.
    RunStarted {
        config: Value,
        budget: Value,
    },
    /// A prompt sent to an agent (`role`: proposer, reviewer, ...).
    Prompt {
        kernel: String,
        round: u32,
        role: String,
        text: String,
    },
    Reply {
        kernel: String,
        round: u32,
        role: String,
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tokens: Option<u64>,
    },
    /// A candidate proposed; its files are in `artefacts`.
    Candidate {
        kernel: String,
        round: u32,
        candidate: String,
        summary: String,
        #[serde(default)]
        artefacts: Vec<String>,
    },
    /// The verification verdict on a candidate.
    Verdict {
        kernel: String,
        candidate: String,
        passed: bool,
        /// `compile`, `numerics`, `anti-cheat`, `watchdog`, `crash`, ... when it failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failure_class: Option<String>,
        detail: String,
        /// The candidate's median time per shape (declared and held out) where it was
        /// timed, whatever the verdict: a rejected candidate's figures stay auditable.
        #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
        times_us: std::collections::BTreeMap<String, f64>,
        /// Files with the verdict in full (the optimisation loop's
        /// `verdicts/<kernel>-<candidate>.json`, which a resumed run answers from).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        artefacts: Vec<String>,
    },
    /// The accepted variant the loop starts from, verified again in this run: candidates
    /// must beat its times (`passed: false`: it failed, and the loop starts from the
    /// reference).
    Baseline {
        kernel: String,
        variant: String,
        passed: bool,
        detail: String,
        #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
        times_us: std::collections::BTreeMap<String, f64>,
    },
    /// The loop's starting version timed in two jobs: per declared shape, how far its
    /// time moved (second / first - 1). A win must clear twice that.
    Noise {
        kernel: String,
        version: String,
        deviations: std::collections::BTreeMap<String, f64>,
    },
    /// A profile of the reference or a candidate.
    Profile {
        kernel: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        candidate: Option<String>,
        summary: String,
        #[serde(default)]
        artefacts: Vec<String>,
    },
    /// A winner stored for review; `replaced` names the pending variant it replaced.
    PendingSaved {
        package: String,
        kernel: String,
        arch: String,
        variant: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replaced: Option<String>,
    },
    /// A person's decision on the run's pending variant, after the run.
    Reviewed {
        package: String,
        kernel: String,
        arch: String,
        variant: String,
        decision: Decision,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// A kernel's loop is about to ask its first question: where it starts (the version,
    /// its verdict, the timing noise, the similar cases, the snapshot) is in `artefacts`,
    /// so that a resumed run starts the loop where it started.
    KernelStarted {
        kernel: String,
        /// The device's identity (`uuid|name|driver`) the kernel's verdicts come from.
        device: String,
        #[serde(default)]
        artefacts: Vec<String>,
    },
    /// A kernel's loop has ended and its winner, if any, is about to be saved for review:
    /// `result` is what the run reports for it; `artefacts` holds the pending variant
    /// when there is one (saved again on resume if no `pending_saved` follows).
    KernelFinished {
        kernel: String,
        result: Value,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        artefacts: Vec<String>,
    },
    /// A run taken up again after an interruption (`kernel` absent: the run as a whole):
    /// what was answered from the record, and where it went live.
    Resumed {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kernel: Option<String>,
        detail: String,
    },
    RunFinished {
        summary: String,
    },
    RunInterrupted {
        reason: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Accepted,
    Rejected,
}

/// One line of the journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub seq: u64,
    pub at: String,
    #[serde(flatten)]
    pub event: Event,
}

/// What reading a journal found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resumed {
    pub entries: Vec<Entry>,
    /// A last line cut short by a crash, if there was one.
    pub torn: Option<TornTail>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TornTail {
    /// Its line number (1-based).
    pub line: usize,
    pub bytes: usize,
    /// Where its bytes were kept.
    pub kept_in: PathBuf,
}

/// An open journal, appending.
pub struct Journal {
    run_id: String,
    dir: PathBuf,
    file: std::fs::File,
    next_seq: u64,
    redactor: Redactor,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("run_id", &self.run_id)
            .field("dir", &self.dir)
            .field("next_seq", &self.next_seq)
            .finish()
    }
}

impl Journal {
    /// Opens the journal of `run_id`, creating it if new, and reads back its events (to
    /// resume the run). Secrets are redacted with the environment's (see
    /// [`Journal::with_redactor`]).
    pub fn open_or_resume(kopt: &KoptDir, run_id: &str) -> Result<(Journal, Resumed)> {
        if !is_plain_name(run_id) {
            return Err(Error::Invalid(format!(
                "`{run_id}` is not a usable run id (letters, digits, `-`, `_`, `.`)"
            )));
        }
        let dir = kopt.run_dir(run_id);
        std::fs::create_dir_all(dir.join(ARTEFACTS_DIR)).map_err(io(&dir))?;
        let path = dir.join(JOURNAL_FILE);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)
            .map_err(io(&path))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io(&path))?;
        let (entries, torn_at) = parse(&bytes, &path)?;
        let mut torn = None;
        if let Some((line, offset)) = torn_at {
            let kept_in = fsx::unused_path(&dir.join(format!("torn-line-{line}.txt")));
            fsx::write_synced(&kept_in, &bytes[offset..])?;
            file.set_len(offset as u64).map_err(io(&path))?;
            file.sync_all().map_err(io(&path))?;
            file.seek(std::io::SeekFrom::End(0)).map_err(io(&path))?;
            torn = Some(TornTail {
                line,
                bytes: bytes.len() - offset,
                kept_in,
            });
        }
        let next_seq = entries.last().map_or(1, |e| e.seq + 1);
        Ok((
            Journal {
                run_id: run_id.to_string(),
                dir,
                file,
                next_seq,
                redactor: Redactor::from_env(),
            },
            Resumed { entries, torn },
        ))
    }

    /// Reads a run's journal without opening it for writing (a torn tail is reported,
    /// not cut).
    pub fn read(kopt: &KoptDir, run_id: &str) -> Result<Resumed> {
        let path = kopt.run_dir(run_id).join(JOURNAL_FILE);
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        let (entries, torn_at) = parse(&bytes, &path)?;
        Ok(Resumed {
            entries,
            torn: torn_at.map(|(line, offset)| TornTail {
                line,
                bytes: bytes.len() - offset,
                kept_in: path.clone(),
            }),
        })
    }

    /// Uses these secrets instead of the environment's.
    pub fn with_redactor(mut self, redactor: Redactor) -> Self {
        self.redactor = redactor;
        self
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends an event (redacted) and syncs it; returns its sequence number.
    pub fn append(&mut self, event: Event) -> Result<u64> {
        let entry = Entry {
            seq: self.next_seq,
            at: now_rfc3339(),
            event,
        };
        let mut value = serde_json::to_value(&entry).expect("events serialise");
        self.redactor.redact_json(&mut value);
        let mut line = serde_json::to_string(&value).expect("values serialise");
        line.push('\n');
        let path = self.dir.join(JOURNAL_FILE);
        self.file.write_all(line.as_bytes()).map_err(io(&path))?;
        self.file.sync_data().map_err(io(&path))?;
        self.next_seq += 1;
        Ok(entry.seq)
    }

    /// Writes an artefact (redacted, atomically) under `artefacts/`; returns its path
    /// relative to the run's folder, for events to cite. `name` may contain `/` for
    /// subfolders, but no `..` and nothing hidden.
    pub fn save_artefact(&mut self, name: &str, contents: &str) -> Result<String> {
        let parts: Vec<&str> = name.split('/').collect();
        if parts.iter().any(|p| !is_plain_name(p)) {
            return Err(Error::Invalid(format!(
                "artefact name `{name}`: use plain names separated by `/`"
            )));
        }
        let rel = format!("{ARTEFACTS_DIR}/{name}");
        let path = self.dir.join(&rel);
        let text = self.redactor.redact(contents);
        kopt_spec::files::write_atomic(&path, text.as_bytes()).map_err(io(&path))?;
        Ok(rel)
    }

    /// Stores a winner for review ([`pending::save`]) and records it, with the pending
    /// variant it replaced.
    pub fn save_pending(&mut self, kopt: &KoptDir, p: &PendingVariant) -> Result<Saved> {
        if p.meta.run_id != self.run_id {
            return Err(Error::Invalid(format!(
                "pending variant {} belongs to run `{}`, not `{}`",
                p.label(),
                p.meta.run_id,
                self.run_id
            )));
        }
        let saved = pending::save(kopt, p)?;
        self.append(Event::PendingSaved {
            package: p.meta.package.clone(),
            kernel: p.meta.kernel.clone(),
            arch: p.meta.arch.clone(),
            variant: p.meta.variant.clone(),
            replaced: saved.replaced.as_ref().map(|r| {
                format!(
                    "`{}` of run {} (kept in {})",
                    r.variant,
                    r.run_id,
                    r.kept_in.display()
                )
            }),
        })?;
        Ok(saved)
    }
}

/// Appends one event to an existing run's journal; `Ok(false)` when the run has no
/// journal here (e.g. after `cargo clean`).
pub fn append_to_run(kopt: &KoptDir, run_id: &str, event: Event) -> Result<bool> {
    if !is_plain_name(run_id) || !kopt.run_dir(run_id).join(JOURNAL_FILE).exists() {
        return Ok(false);
    }
    let (mut j, _) = Journal::open_or_resume(kopt, run_id)?;
    j.append(event)?;
    Ok(true)
}

/// The events of a journal's bytes, and where a torn last line starts (its line number
/// and byte offset).
#[allow(clippy::type_complexity)]
fn parse(bytes: &[u8], path: &Path) -> Result<(Vec<Entry>, Option<(usize, usize)>)> {
    let mut entries = Vec::new();
    let mut offset = 0;
    let lines: Vec<&[u8]> = bytes.split_inclusive(|b| *b == b'\n').collect();
    for (i, line) in lines.iter().enumerate() {
        let last = i + 1 == lines.len();
        let complete = line.ends_with(b"\n");
        let parsed = std::str::from_utf8(line)
            .ok()
            .and_then(|t| serde_json::from_str::<Entry>(t.trim_end()).ok());
        match parsed {
            Some(e) if complete => entries.push(e),
            // A crash while writing the last line: tolerated.
            _ if last => return Ok((entries, Some((i + 1, offset)))),
            _ => {
                return Err(Error::Invalid(format!(
                    "{} line {}: not a journal event (the journal was edited or damaged; a run cannot resume from it)",
                    path.display(),
                    i + 1
                )))
            }
        }
        offset += line.len();
    }
    Ok((entries, None))
}

/// A run, in brief.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSummary {
    pub run_id: String,
    pub events: usize,
    pub started_at: Option<String>,
    /// `finished`, `interrupted`, or `open` (no final event: running, or crashed).
    pub state: &'static str,
}

/// Every run with a journal, oldest first.
pub fn list_runs(kopt: &KoptDir) -> Vec<RunSummary> {
    let Ok(dirs) = std::fs::read_dir(kopt.runs_root()) else {
        return Vec::new();
    };
    let mut ids: Vec<String> = dirs
        .flatten()
        .filter(|e| e.path().join(JOURNAL_FILE).exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    ids.sort();
    ids.into_iter()
        .map(|run_id| {
            let read = Journal::read(kopt, &run_id).unwrap_or_default();
            // Reviews are appended after a run ends: look for the last end of the run.
            let state = read
                .entries
                .iter()
                .rev()
                .find_map(|e| match e.event {
                    Event::RunFinished { .. } => Some("finished"),
                    Event::RunInterrupted { .. } => Some("interrupted"),
                    Event::RunStarted { .. } => Some("open"),
                    _ => None,
                })
                .unwrap_or("open");
            RunSummary {
                events: read.entries.len(),
                started_at: read.entries.first().map(|e| e.at.clone()),
                run_id,
                state,
            }
        })
        .collect()
}
