//! The case library: what kopt learnt from past optimisations, in an SQLite database
//! (bundled SQLite, FTS5), to find the cases most similar to a new kernel.
//!
//! A [`Case`] holds a kernel's features (the bottleneck snapshot's metric vector, the
//! kernel's kind, a structural summary, its source tokens), the diagnosis, the change
//! made, and the outcome (speedup; accepted, rejected or failed; the failure class).
//! Rejected and failed candidates are kept as negative cases: they teach what did not
//! work.
//!
//! # Where it lives
//!
//! `--cases PATH`, else `$KOPT_CASES`, else `<data dir>/kopt/cases.sqlite`
//! (`~/.local/share/kopt/cases.sqlite` on Linux). Its schema is versioned in a `meta`
//! table; opening migrates it (idempotently) and refuses a newer schema.
//!
//! # Retrieval
//!
//! For a query with metric vector `q` (named values), text `t` and optional kind:
//!
//! - **metric similarity** of a case with metrics `c`, over the query's dimensions `Q`:
//!
//!   `m = (1/|Q|) · Σ_{d ∈ Q ∩ C} (1 − |q_d − c_d| / range_d)`
//!
//!   where `range_d` is the spread (max − min) of dimension `d` over the library and the
//!   query (a dimension with no spread counts 1 when equal). Only the dimensions both
//!   share compare; a query dimension the case lacks counts 0, so a case measured on
//!   fewer of the query's metrics is less similar. `m` is in `[0, 1]`.
//! - **text similarity**: FTS5 `bm25` over the case's kind, structural summary, source
//!   tokens, diagnosis and change, matching any word of `t` (identifiers kept whole);
//!   normalised by the best match of the query: `x = bm25 / bm25_best` in `[0, 1]`
//!   (`bm25` is negative, lower is better), 0 for cases that match no word.
//! - **score** `s = w_m · m + w_t · x` with `w_m = 0.6`, `w_t = 0.4` ([`Weights`]); when
//!   the query has no metrics (or no text) the other weight becomes 1.
//!
//! The `k` cases with the highest positive score are returned, ties by id, each with its
//! three numbers and whether it is negative. The **confidence** of a diagnosis
//! ([`confidence`]) is the score of the nearest accepted case with the same bottleneck
//! class: similarity to what worked before, not the model's own certainty.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kopt_spec::files::{self, LockFile, Rationale};
use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

use crate::features;
use crate::{Error, Result};

pub const SCHEMA_VERSION: i64 = 1;
pub const ENV_VAR: &str = "KOPT_CASES";

/// One past optimisation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// Unique, stable: `<repo>/<crate>/<kernel>/<variant>@<arch>` for committed variants.
    pub id: String,
    /// One of [`features::KINDS`].
    pub kind: String,
    pub features: Features,
    pub diagnosis: CaseDiagnosis,
    /// What was changed, and why.
    pub change: String,
    pub outcome: CaseOutcome,
    pub origin: Origin,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Features {
    /// The bottleneck snapshot's metric vector of the version that was optimised.
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
    /// A structural summary ([`features::structural_summary`]).
    pub structure: String,
    /// Identifier tokens of the source ([`features::source_tokens`]).
    pub source_tokens: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseDiagnosis {
    /// `memory-bound`, `latency-bound`, ...
    pub bottleneck: String,
    pub explanation: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseOutcome {
    /// Over the version it was compared with (geometric mean over shapes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speedup: Option<f64>,
    pub status: Status,
    /// Why it failed or was rejected: `numerics`, `compile`, `watchdog`, `review`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_class: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Accepted,
    Rejected,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Accepted => "accepted",
            Status::Rejected => "rejected",
            Status::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "accepted" => Ok(Status::Accepted),
            "rejected" => Ok(Status::Rejected),
            "failed" => Ok(Status::Failed),
            other => Err(Error::Invalid(format!(
                "`{other}` is not a case status; use accepted, rejected or failed"
            ))),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Origin {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    #[serde(rename = "crate", default, skip_serializing_if = "Option::is_none")]
    pub krate: Option<String>,
    pub kernel: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
}

impl Case {
    pub fn is_negative(&self) -> bool {
        self.outcome.status != Status::Accepted
    }

    /// Every reason this case cannot be stored.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Invalid(format!("case `{}`: {m}", self.id)));
        if self.id.trim().is_empty() || self.id.contains('\n') {
            return bad("the id is empty or spans lines".into());
        }
        if !features::is_kind(&self.kind) {
            return bad(format!(
                "kind `{}` is unknown; use one of {}",
                self.kind,
                features::KINDS.join(", ")
            ));
        }
        if let Some((k, v)) = self.features.metrics.iter().find(|(_, v)| !v.is_finite()) {
            return bad(format!("metric `{k}` = {v} is not a finite number"));
        }
        if let Some(s) = self.outcome.speedup {
            if !(s.is_finite() && s > 0.0) {
                return bad(format!("speedup {s} is not a positive number"));
            }
        }
        if self.diagnosis.bottleneck.trim().is_empty() {
            return bad("the diagnosis names no bottleneck".into());
        }
        if self.origin.kernel.trim().is_empty() {
            return bad("the origin names no kernel".into());
        }
        Ok(())
    }
}

/// The weights of the two similarities in a score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    pub metrics: f64,
    pub text: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            metrics: 0.6,
            text: 0.4,
        }
    }
}

/// What to find neighbours for: a new kernel's snapshot metrics, and text (its
/// structural summary, source tokens, the snapshot's rendering).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Query {
    /// Only cases of this kind, when given.
    pub kind: Option<String>,
    pub metrics: BTreeMap<String, f64>,
    pub text: String,
    pub weights: Weights,
}

/// A retrieved case, with how similar it is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Neighbour {
    pub case: Case,
    pub metric_similarity: f64,
    pub text_similarity: f64,
    pub score: f64,
    /// Rejected or failed: an example of what did not work.
    pub negative: bool,
}

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ImportReport {
    pub added: usize,
    pub updated: usize,
    pub unchanged: usize,
    /// Things found but not imported, with why.
    pub skipped: Vec<String>,
}

/// How an upsert changed the library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upsert {
    Added,
    Updated,
    Unchanged,
}

/// The library's location: `explicit`, else `$KOPT_CASES`, else the user's data folder.
pub fn library_path(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os(ENV_VAR).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    dirs::data_dir()
        .map(|d| d.join("kopt").join("cases.sqlite"))
        .ok_or_else(|| {
            Error::Invalid(format!(
                "this system has no per-user data folder; give the case library a path with `--cases PATH` or `{ENV_VAR}`"
            ))
        })
}

pub struct CaseLibrary {
    conn: Connection,
    path: String,
}

const COLUMNS: &str = "id, kind, metrics, structure, source_tokens, bottleneck, explanation, change, speedup, status, failure_class, origin_repo, origin_crate, origin_kernel, origin_variant, origin_arch";

impl CaseLibrary {
    /// Opens (creating and migrating as needed) the library at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::Cases {
                path: path.display().to_string(),
                message: format!("cannot create its folder: {e}"),
            })?;
        }
        let conn = Connection::open(path).map_err(|e| Error::Cases {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::init(conn, path.display().to_string())
    }

    /// A library that lives in memory (tests, one-off searches).
    pub fn open_in_memory() -> Result<Self> {
        let conn = Connection::open_in_memory().map_err(|e| Error::Cases {
            path: ":memory:".into(),
            message: e.to_string(),
        })?;
        Self::init(conn, ":memory:".into())
    }

    fn init(conn: Connection, path: String) -> Result<Self> {
        let lib = CaseLibrary { conn, path };
        lib.conn
            .busy_timeout(std::time::Duration::from_secs(5))
            .map_err(|e| lib.err(e))?;
        lib.migrate()?;
        Ok(lib)
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// A copy in memory of every case the library holds now, under the same path (for
    /// messages). A run with several kernels queries the copy, so that no kernel's similar
    /// cases depend on what another kernel recorded first, while its outcomes go to the
    /// file.
    pub fn frozen(&self) -> Result<Self> {
        let mut copy = Self::open_in_memory()?;
        copy.upsert_all(&self.list(None, None)?)?;
        copy.path = self.path.clone();
        Ok(copy)
    }

    fn err(&self, e: impl std::fmt::Display) -> Error {
        Error::Cases {
            path: self.path.clone(),
            message: e.to_string(),
        }
    }

    /// The schema version stored in the database.
    pub fn schema_version(&self) -> Result<i64> {
        let v: Option<String> = self
            .conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        v.map_or(Ok(0), |v| {
            v.parse()
                .map_err(|_| self.err(format!("schema_version `{v}` is not a number")))
        })
    }

    /// Brings the schema to [`SCHEMA_VERSION`]; running it again changes nothing.
    fn migrate(&self) -> Result<()> {
        self.conn
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
            )
            .map_err(|e| self.err(e))?;
        let version = self.schema_version()?;
        if version > SCHEMA_VERSION {
            return Err(self.err(format!(
                "its schema is version {version}, written by a newer kopt (this one reads {SCHEMA_VERSION}); upgrade cargo-kopt, or use another library with --cases"
            )));
        }
        if version < 1 {
            self.conn
                .execute_batch(
                    "BEGIN;
                     CREATE TABLE IF NOT EXISTS cases (
                         id TEXT PRIMARY KEY,
                         kind TEXT NOT NULL,
                         metrics TEXT NOT NULL,
                         structure TEXT NOT NULL,
                         source_tokens TEXT NOT NULL,
                         bottleneck TEXT NOT NULL,
                         explanation TEXT NOT NULL,
                         change TEXT NOT NULL,
                         speedup REAL,
                         status TEXT NOT NULL CHECK (status IN ('accepted', 'rejected', 'failed')),
                         failure_class TEXT,
                         origin_repo TEXT,
                         origin_crate TEXT,
                         origin_kernel TEXT NOT NULL,
                         origin_variant TEXT,
                         origin_arch TEXT
                     );
                     CREATE INDEX IF NOT EXISTS cases_by_kind ON cases (kind);
                     CREATE VIRTUAL TABLE IF NOT EXISTS cases_fts USING fts5(
                         id UNINDEXED, kind, structure, source_tokens, diagnosis, change,
                         tokenize = \"unicode61 tokenchars '_'\"
                     );
                     INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '1');
                     COMMIT;",
                )
                .map_err(|e| {
                    let _ = self.conn.execute_batch("ROLLBACK;");
                    self.err(format!("cannot create the schema: {e}"))
                })?;
        }
        Ok(())
    }

    fn row_to_case(r: &rusqlite::Row) -> rusqlite::Result<(Case, String)> {
        let metrics: String = r.get(2)?;
        let status: String = r.get(9)?;
        Ok((
            Case {
                id: r.get(0)?,
                kind: r.get(1)?,
                features: Features {
                    metrics: BTreeMap::new(),
                    structure: r.get(3)?,
                    source_tokens: r.get(4)?,
                },
                diagnosis: CaseDiagnosis {
                    bottleneck: r.get(5)?,
                    explanation: r.get(6)?,
                },
                change: r.get(7)?,
                outcome: CaseOutcome {
                    speedup: r.get(8)?,
                    status: Status::parse(&status).map_err(|e| {
                        rusqlite::Error::FromSqlConversionFailure(
                            9,
                            rusqlite::types::Type::Text,
                            Box::new(e),
                        )
                    })?,
                    failure_class: r.get(10)?,
                },
                origin: Origin {
                    repo: r.get(11)?,
                    krate: r.get(12)?,
                    kernel: r.get(13)?,
                    variant: r.get(14)?,
                    arch: r.get(15)?,
                },
            },
            metrics,
        ))
    }

    fn finish(&self, (mut case, metrics): (Case, String)) -> Result<Case> {
        case.features.metrics = serde_json::from_str(&metrics)
            .map_err(|e| self.err(format!("case `{}`: metrics: {e}", case.id)))?;
        Ok(case)
    }

    pub fn get(&self, id: &str) -> Result<Option<Case>> {
        let row = self
            .conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM cases WHERE id = ?1"),
                [id],
                Self::row_to_case,
            )
            .optional()
            .map_err(|e| self.err(e))?;
        row.map(|r| self.finish(r)).transpose()
    }

    /// Every case, by id; optionally only one kind and/or status.
    pub fn list(&self, kind: Option<&str>, status: Option<Status>) -> Result<Vec<Case>> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {COLUMNS} FROM cases
                 WHERE (?1 IS NULL OR kind = ?1) AND (?2 IS NULL OR status = ?2)
                 ORDER BY id"
            ))
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params![kind, status.map(Status::as_str)], Self::row_to_case)
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for r in rows {
            out.push(self.finish(r.map_err(|e| self.err(e))?)?);
        }
        Ok(out)
    }

    pub fn len(&self) -> Result<usize> {
        self.conn
            .query_row("SELECT COUNT(*) FROM cases", [], |r| r.get::<_, i64>(0))
            .map(|n| n as usize)
            .map_err(|e| self.err(e))
    }

    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Adds a case, or replaces the one with its id.
    pub fn upsert(&mut self, case: &Case) -> Result<Upsert> {
        let tx = self.conn.transaction().map_err(|e| Error::Cases {
            path: self.path.clone(),
            message: e.to_string(),
        })?;
        let r = upsert_in(&tx, case);
        let r = r.and_then(|u| {
            tx.commit().map_err(|e| e.to_string())?;
            Ok(u)
        });
        r.map_err(|e| self.err(e))
    }

    /// Adds or replaces many cases, all or none.
    pub fn upsert_all(&mut self, cases: &[Case]) -> Result<ImportReport> {
        for c in cases {
            c.validate()?;
        }
        let path = self.path.clone();
        let err = |e: String| Error::Cases {
            path: path.clone(),
            message: e,
        };
        let tx = self.conn.transaction().map_err(|e| err(e.to_string()))?;
        let mut report = ImportReport::default();
        for c in cases {
            match upsert_in(&tx, c).map_err(err)? {
                Upsert::Added => report.added += 1,
                Upsert::Updated => report.updated += 1,
                Upsert::Unchanged => report.unchanged += 1,
            }
        }
        tx.commit().map_err(|e| err(e.to_string()))?;
        Ok(report)
    }

    pub fn remove(&mut self, id: &str) -> Result<bool> {
        let n = self
            .conn
            .execute("DELETE FROM cases WHERE id = ?1", [id])
            .map_err(|e| self.err(e))?;
        self.conn
            .execute("DELETE FROM cases_fts WHERE id = ?1", [id])
            .map_err(|e| self.err(e))?;
        Ok(n > 0)
    }

    /// Every case as JSON lines, by id: the exchange format (`cases export`).
    pub fn export_jsonl(&self, out: &mut dyn std::io::Write) -> Result<usize> {
        let cases = self.list(None, None)?;
        for c in &cases {
            let line = serde_json::to_string(c).expect("cases serialise");
            writeln!(out, "{line}").map_err(|e| self.err(format!("export: {e}")))?;
        }
        Ok(cases.len())
    }

    /// Imports JSON lines (as [`CaseLibrary::export_jsonl`] writes them); all or none:
    /// a bad line names its number and nothing is imported.
    pub fn import_jsonl(&mut self, text: &str) -> Result<ImportReport> {
        let mut cases = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let c: Case = serde_json::from_str(line).map_err(|e| {
                Error::Invalid(format!(
                    "line {}: not a case: {e}; nothing was imported",
                    i + 1
                ))
            })?;
            c.validate().map_err(|e| {
                Error::Invalid(format!("line {}: {e}; nothing was imported", i + 1))
            })?;
            cases.push(c);
        }
        self.upsert_all(&cases)
    }

    /// The `k` cases most similar to `q` (see the module documentation for the formula).
    pub fn search(&self, q: &Query, k: usize) -> Result<Vec<Neighbour>> {
        let all = self.list(None, None)?;
        // Per-dimension spread over the library and the query.
        let mut ranges: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        let vectors = all
            .iter()
            .map(|c| &c.features.metrics)
            .chain(std::iter::once(&q.metrics));
        for m in vectors {
            for (name, v) in m {
                let r = ranges.entry(name.clone()).or_insert((*v, *v));
                r.0 = r.0.min(*v);
                r.1 = r.1.max(*v);
            }
        }
        let text_scores = self.text_scores(&q.text)?;
        let best_text = text_scores.values().copied().fold(0.0_f64, f64::max);
        let query_metrics: Vec<(&String, f64)> = q
            .metrics
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(k, v)| (k, *v))
            .collect();
        let (mut wm, mut wt) = (q.weights.metrics, q.weights.text);
        if query_metrics.is_empty() {
            (wm, wt) = (0.0, 1.0);
        } else if text_scores.is_empty() && fts_terms(&q.text).is_empty() {
            (wm, wt) = (1.0, 0.0);
        }
        let mut out: Vec<Neighbour> = all
            .into_iter()
            .filter(|c| q.kind.as_deref().is_none_or(|k| c.kind == k))
            .map(|c| {
                let m = if query_metrics.is_empty() {
                    0.0
                } else {
                    let sum: f64 = query_metrics
                        .iter()
                        .filter_map(|(name, qv)| {
                            let cv = c.features.metrics.get(*name)?;
                            let (lo, hi) = ranges[*name];
                            let spread = hi - lo;
                            Some(if spread > 0.0 {
                                1.0 - (qv - cv).abs() / spread
                            } else if qv == cv {
                                1.0
                            } else {
                                0.0
                            })
                        })
                        .sum();
                    sum / query_metrics.len() as f64
                };
                let x = match text_scores.get(&c.id) {
                    Some(s) if best_text > 0.0 => s / best_text,
                    _ => 0.0,
                };
                Neighbour {
                    negative: c.is_negative(),
                    metric_similarity: m,
                    text_similarity: x,
                    score: wm * m + wt * x,
                    case: c,
                }
            })
            .filter(|n| n.score > 0.0)
            .collect();
        out.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then_with(|| a.case.id.cmp(&b.case.id))
        });
        out.truncate(k);
        Ok(out)
    }

    /// `-bm25` (higher is better) of every case matching any word of `text`.
    fn text_scores(&self, text: &str) -> Result<BTreeMap<String, f64>> {
        let terms = fts_terms(text);
        if terms.is_empty() {
            return Ok(BTreeMap::new());
        }
        let expr = terms
            .iter()
            .map(|t| format!("\"{t}\""))
            .collect::<Vec<_>>()
            .join(" OR ");
        let mut stmt = self
            .conn
            .prepare("SELECT id, bm25(cases_fts) FROM cases_fts WHERE cases_fts MATCH ?1")
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([expr], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, f64>(1)?))
            })
            .map_err(|e| self.err(e))?;
        let mut out = BTreeMap::new();
        for r in rows {
            let (id, bm25) = r.map_err(|e| self.err(e))?;
            out.insert(id, (-bm25).max(0.0));
        }
        Ok(out)
    }

    /// Imports the accepted variants committed in a repository (see
    /// [`cases_from_committed`]).
    pub fn import_committed(
        &mut self,
        repo: &Path,
        opts: &CommittedImport,
    ) -> Result<ImportReport> {
        let (cases, skipped) = cases_from_committed(repo, opts)?;
        let mut report = self.upsert_all(&cases)?;
        report.skipped = skipped;
        Ok(report)
    }
}

fn upsert_in(tx: &rusqlite::Transaction, c: &Case) -> std::result::Result<Upsert, String> {
    c.validate().map_err(|e| e.to_string())?;
    let existing = tx
        .query_row(
            &format!("SELECT {COLUMNS} FROM cases WHERE id = ?1"),
            [&c.id],
            CaseLibrary::row_to_case,
        )
        .optional()
        .map_err(|e| e.to_string())?
        .map(|(mut old, metrics)| {
            old.features.metrics = serde_json::from_str(&metrics).unwrap_or_default();
            old
        });
    if existing.as_ref() == Some(c) {
        return Ok(Upsert::Unchanged);
    }
    let metrics = serde_json::to_string(&c.features.metrics).expect("metrics serialise");
    tx.execute(
        &format!(
            "INSERT OR REPLACE INTO cases ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)"
        ),
        params![
            c.id,
            c.kind,
            metrics,
            c.features.structure,
            c.features.source_tokens,
            c.diagnosis.bottleneck,
            c.diagnosis.explanation,
            c.change,
            c.outcome.speedup,
            c.outcome.status.as_str(),
            c.outcome.failure_class,
            c.origin.repo,
            c.origin.krate,
            c.origin.kernel,
            c.origin.variant,
            c.origin.arch,
        ],
    )
    .map_err(|e| e.to_string())?;
    tx.execute("DELETE FROM cases_fts WHERE id = ?1", [&c.id])
        .map_err(|e| e.to_string())?;
    tx.execute(
        "INSERT INTO cases_fts (id, kind, structure, source_tokens, diagnosis, change) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            c.id,
            c.kind,
            c.features.structure,
            c.features.source_tokens,
            format!("{} {}", c.diagnosis.bottleneck, c.diagnosis.explanation),
            c.change,
        ],
    )
    .map_err(|e| e.to_string())?;
    Ok(if existing.is_some() {
        Upsert::Updated
    } else {
        Upsert::Added
    })
}

/// The words of a query for FTS5: identifiers of two characters or more, lower-cased,
/// each once, numbers left out; at most 256 of them.
fn fts_terms(text: &str) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| w.chars().count() >= 2 && !w.chars().all(|c| c.is_ascii_digit() || c == '_'))
        .map(str::to_lowercase)
        .filter(|w| seen.insert(w.clone()))
        .take(256)
        .collect()
}

/// The known bottleneck classes, most specific first.
pub const BOTTLENECK_CLASSES: &[&str] = &[
    "shared-memory-bank-bound",
    "occupancy-limited",
    "memory-bound",
    "latency-bound",
    "compute-bound",
    "launch-bound",
];

/// The first known class a diagnosis names (`memory-bound (extra passes), and ...` ->
/// `memory-bound`), else the diagnosis itself, lower-cased.
pub fn bottleneck_class(diagnosis: &str) -> String {
    let d = diagnosis.to_ascii_lowercase();
    BOTTLENECK_CLASSES
        .iter()
        .filter_map(|c| d.find(c).map(|at| (at, *c)))
        .min()
        .map_or(d.trim().to_string(), |(_, c)| c.to_string())
}

/// A case's bottleneck: the diagnosis as the agent wrote it when it names a known class;
/// otherwise the class the profiler measured on the version before the change, followed by
/// the diagnosis. A case whose agent described its bottleneck in its own words ("few long
/// rows: ...") still counts for its class's confidence, as the metrics it is found by
/// come from that same snapshot.
pub fn case_bottleneck(diagnosis: &str, measured_before: Option<&str>) -> String {
    let named = BOTTLENECK_CLASSES.contains(&bottleneck_class(diagnosis).as_str());
    match measured_before.map(str::trim) {
        Some(class) if !named && BOTTLENECK_CLASSES.contains(&class) => {
            format!("{class} (measured before the change): {diagnosis}")
        }
        _ => diagnosis.to_string(),
    }
}

/// The confidence of a diagnosis: the score of the nearest accepted neighbour with the
/// same bottleneck class, and the accepted neighbours that support it, nearest first.
pub fn confidence(neighbours: &[Neighbour], bottleneck: &str) -> files::Confidence {
    let class = bottleneck_class(bottleneck);
    let support: Vec<&Neighbour> = neighbours
        .iter()
        .filter(|n| !n.negative && bottleneck_class(&n.case.diagnosis.bottleneck) == class)
        .collect();
    files::Confidence {
        score: support
            .first()
            .map_or(0.0, |n| (n.score * 100.0).round() / 100.0),
        cases: support.iter().map(|n| n.case.id.clone()).collect(),
    }
}

/// The id of a committed variant's case.
pub fn case_id(repo: &str, krate: &str, kernel: &str, variant: &str, arch: &str) -> String {
    format!("{repo}/{krate}/{kernel}/{variant}@{arch}")
}

/// What a case is made from, when it comes from a variant and its rationale.
pub struct VariantCase<'a> {
    pub id: String,
    pub repo: Option<&'a str>,
    pub krate: &'a str,
    pub kind: Option<&'a str>,
    pub rationale: &'a Rationale,
    /// The source of the version that was optimised (the reference), for the features.
    pub before_source: &'a str,
    pub status: Status,
    pub failure_class: Option<String>,
}

/// A case from a variant's rationale: the snapshot before the change gives the metrics,
/// the optimised source the structure and tokens, the figures the speedup (geometric
/// mean over shapes, to two decimals).
pub fn case_from_rationale(v: &VariantCase) -> Case {
    let r = v.rationale;
    let speedups: Vec<f64> = r
        .figures
        .iter()
        .map(|f| f.speedup())
        .filter(|s| s.is_finite() && *s > 0.0)
        .collect();
    let speedup = (!speedups.is_empty()).then(|| {
        let g = (speedups.iter().map(|s| s.ln()).sum::<f64>() / speedups.len() as f64).exp();
        (g * 100.0).round() / 100.0
    });
    let kind = v
        .kind
        .filter(|k| features::is_kind(k))
        .unwrap_or_else(|| features::infer_kind(&r.kernel, v.before_source));
    Case {
        id: v.id.clone(),
        kind: kind.to_string(),
        features: Features {
            metrics: r
                .snapshots
                .as_ref()
                .map(|s| s.before.metrics.clone())
                .unwrap_or_default(),
            structure: features::structural_summary(v.before_source),
            source_tokens: features::source_tokens(v.before_source),
        },
        diagnosis: CaseDiagnosis {
            bottleneck: case_bottleneck(
                &r.diagnosis.bottleneck,
                r.snapshots
                    .as_ref()
                    .map(|s| s.before.classification.as_str()),
            ),
            explanation: r.diagnosis.explanation.clone(),
        },
        change: r
            .changes
            .iter()
            .map(|c| format!("{}: {}", c.what, c.why))
            .collect::<Vec<_>>()
            .join("\n"),
        outcome: CaseOutcome {
            speedup,
            status: v.status,
            failure_class: v.failure_class.clone(),
        },
        origin: Origin {
            repo: v.repo.map(str::to_string),
            krate: Some(v.krate.to_string()),
            kernel: r.kernel.clone(),
            variant: Some(r.variant.clone()),
            arch: Some(r.arch.clone()),
        },
    }
}

/// How to import a repository's committed variants.
pub struct CommittedImport<'a> {
    /// The repository's name in case ids (default: its folder's name).
    pub repo_name: Option<String>,
    /// The reference source of a kernel, given its crate root and name (the caller
    /// gathers annotations; this crate does not parse Rust). When it returns `None`,
    /// the variant's own source stands in for the features.
    pub reference_source: &'a dyn Fn(&Path, &str) -> Option<String>,
}

/// Cases from the accepted variants committed in `repo`: every `kopt/<kernel>/kopt.lock`
/// under it (`target`, `node_modules` and hidden folders skipped), each lock entry with
/// its variant's rationale.json becoming an accepted case. Variants not in a lock are not
/// imported (their outcome is unknown). Returns the cases, by id, and what was skipped.
pub fn cases_from_committed(
    repo: &Path,
    opts: &CommittedImport,
) -> Result<(Vec<Case>, Vec<String>)> {
    if !repo.is_dir() {
        return Err(Error::NotFound(format!(
            "{} is not a folder; give the root of a repository (or a .jsonl file of cases)",
            repo.display()
        )));
    }
    let repo_name = opts.repo_name.clone().unwrap_or_else(|| {
        repo.canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "repo".into())
    });
    let mut kopt_dirs = Vec::new();
    find_kopt_dirs(repo, 0, &mut kopt_dirs);
    kopt_dirs.sort();
    let mut cases = Vec::new();
    let mut skipped = Vec::new();
    let rel = |p: &Path| p.strip_prefix(repo).unwrap_or(p).display().to_string();
    for kopt in kopt_dirs {
        let crate_root = kopt.parent().unwrap_or(repo).to_path_buf();
        let krate = crate_name(&crate_root);
        let Ok(entries) = std::fs::read_dir(&kopt) else {
            continue;
        };
        let mut kernels: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join(files::LOCK_FILE).is_file())
            .collect();
        kernels.sort();
        for kdir in kernels {
            let lock_path = kdir.join(files::LOCK_FILE);
            let lock = match std::fs::read_to_string(&lock_path)
                .map_err(|e| e.to_string())
                .and_then(|t| LockFile::parse(&t))
            {
                Ok(l) => l,
                Err(e) => {
                    skipped.push(format!("{}: {e}", rel(&lock_path)));
                    continue;
                }
            };
            let reference = (opts.reference_source)(&crate_root, &lock.kernel);
            for entry in &lock.accepted {
                let vdir = kdir.join(&entry.variant);
                let r = match std::fs::read_to_string(vdir.join(files::RATIONALE_JSON))
                    .map_err(|e| e.to_string())
                    .and_then(|t| Rationale::parse(&t))
                {
                    Ok(r) => r,
                    Err(e) => {
                        skipped.push(format!("{}/{}: {e}", rel(&vdir), files::RATIONALE_JSON));
                        continue;
                    }
                };
                let variant_source =
                    std::fs::read_to_string(vdir.join(files::SOURCE_FILE)).unwrap_or_default();
                let before = reference.as_deref().unwrap_or(&variant_source);
                let id = case_id(
                    &repo_name,
                    &krate,
                    &lock.kernel,
                    &entry.variant,
                    &entry.arch,
                );
                let mut case = case_from_rationale(&VariantCase {
                    id,
                    repo: Some(&repo_name),
                    krate: &krate,
                    kind: None,
                    rationale: &r,
                    before_source: before,
                    status: Status::Accepted,
                    failure_class: None,
                });
                // The lock, not the rationale, says where it runs.
                case.origin.arch = Some(entry.arch.clone());
                cases.push(case);
            }
        }
    }
    cases.sort_by(|a, b| a.id.cmp(&b.id));
    Ok((cases, skipped))
}

fn find_kopt_dirs(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    if depth > 12 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        if !path.is_dir() || name.starts_with('.') || name == "target" || name == "node_modules" {
            continue;
        }
        if name == "kopt" && dir.join("Cargo.toml").is_file() {
            out.push(path);
        } else {
            find_kopt_dirs(&path, depth + 1, out);
        }
    }
}

/// The package name in a crate's Cargo.toml, else the folder's name.
fn crate_name(root: &Path) -> String {
    std::fs::read_to_string(root.join("Cargo.toml"))
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
        .and_then(|t| t.get("package")?.get("name")?.as_str().map(str::to_string))
        .unwrap_or_else(|| {
            root.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(id: &str, metrics: &[(&str, f64)], text: &str, status: Status) -> Case {
        Case {
            id: id.into(),
            kind: "other".into(),
            features: Features {
                metrics: metrics.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                structure: text.into(),
                source_tokens: String::new(),
            },
            diagnosis: CaseDiagnosis {
                bottleneck: "memory-bound".into(),
                explanation: String::new(),
            },
            change: String::new(),
            outcome: CaseOutcome {
                speedup: None,
                status,
                failure_class: None,
            },
            origin: Origin {
                kernel: "k".into(),
                ..Default::default()
            },
        }
    }

    #[test]
    fn metric_similarity_follows_the_formula() {
        let mut lib = CaseLibrary::open_in_memory().unwrap();
        lib.upsert_all(&[
            case("a", &[("dram", 40.0), ("occ", 50.0)], "", Status::Accepted),
            case("b", &[("dram", 90.0)], "", Status::Accepted),
            case("c", &[("l2", 1.0)], "", Status::Rejected),
        ])
        .unwrap();
        let q = Query {
            metrics: BTreeMap::from([("dram".into(), 50.0), ("occ".into(), 50.0)]),
            ..Default::default()
        };
        let n = lib.search(&q, 10).unwrap();
        // dram spread 40..90 = 50, occ spread 0 (equal: counts 1).
        // a: (1 - 10/50 + 1) / 2 = 0.9; b: (1 - 40/50) / 2 = 0.1; c shares nothing.
        let got: Vec<(&str, f64)> = n.iter().map(|n| (n.case.id.as_str(), n.score)).collect();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].0, "a");
        assert!((got[0].1 - 0.9).abs() < 1e-12, "{got:?}");
        assert_eq!(got[1].0, "b");
        assert!((got[1].1 - 0.1).abs() < 1e-12, "{got:?}");
    }

    #[test]
    fn text_and_metrics_combine_and_negatives_are_marked() {
        let mut lib = CaseLibrary::open_in_memory().unwrap();
        lib.upsert_all(&[
            case(
                "a",
                &[("dram", 40.0)],
                "shared memory bank conflicts",
                Status::Accepted,
            ),
            case(
                "b",
                &[("dram", 40.0)],
                "atomicAdd contention",
                Status::Failed,
            ),
        ])
        .unwrap();
        let q = Query {
            metrics: BTreeMap::from([("dram".into(), 40.0)]),
            text: "atomicAdd per block".into(),
            ..Default::default()
        };
        let n = lib.search(&q, 5).unwrap();
        assert_eq!(n[0].case.id, "b");
        assert!(n[0].negative && !n[1].negative);
        assert!(
            (n[0].score - 1.0).abs() < 1e-12,
            "both similarities 1: {:?}",
            n[0]
        );
        assert!((n[1].score - 0.6).abs() < 1e-12, "metrics only: {:?}", n[1]);
        assert_eq!(n[1].text_similarity, 0.0);
        let c = confidence(&n, "memory-bound, and more");
        assert_eq!(
            c.cases,
            vec!["a".to_string()],
            "the failed case supports nothing"
        );
        assert_eq!(c.score, 0.6);
    }

    #[test]
    fn classes() {
        assert_eq!(
            bottleneck_class("memory-bound (extra passes), and latency-bound on few long rows"),
            "memory-bound"
        );
        assert_eq!(bottleneck_class("Latency-bound"), "latency-bound");
        assert_eq!(bottleneck_class("odd one"), "odd one");
    }

    #[test]
    fn a_diagnosis_without_a_class_takes_the_measured_one() {
        let own_words = "few long rows: a dependent global load after the cluster exchange";
        let b = case_bottleneck(own_words, Some("memory-bound"));
        assert_eq!(
            b,
            "memory-bound (measured before the change): few long rows: a dependent global load after the cluster exchange"
        );
        assert_eq!(bottleneck_class(&b), "memory-bound");
        // A named class is the agent's to give; no snapshot, or an unknown class, changes nothing.
        let named = "latency-bound: the exchange waits";
        assert_eq!(case_bottleneck(named, Some("memory-bound")), named);
        assert_eq!(case_bottleneck(own_words, None), own_words);
        assert_eq!(case_bottleneck(own_words, Some("unknown")), own_words);
    }

    #[test]
    fn schema_is_versioned_and_migration_is_idempotent() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub/cases.sqlite");
        let mut lib = CaseLibrary::open(&p).unwrap();
        lib.upsert(&case("a", &[], "x", Status::Accepted)).unwrap();
        drop(lib);
        let lib = CaseLibrary::open(&p).unwrap();
        assert_eq!(lib.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(lib.len().unwrap(), 1);
        lib.conn
            .execute(
                "UPDATE meta SET value = '99' WHERE key = 'schema_version'",
                [],
            )
            .unwrap();
        drop(lib);
        let err = CaseLibrary::open(&p).err().unwrap().to_string();
        assert!(
            err.contains("schema is version 99") && err.contains("upgrade"),
            "{err}"
        );
    }

    #[test]
    fn bad_cases_are_refused_with_the_fix() {
        let mut lib = CaseLibrary::open_in_memory().unwrap();
        let mut c = case("a", &[], "", Status::Accepted);
        c.kind = "conv".into();
        let err = lib.upsert(&c).unwrap_err().to_string();
        assert!(
            err.contains("kind `conv` is unknown; use one of softmax"),
            "{err}"
        );
        let err = lib
            .import_jsonl("{\"id\": \"x\"}\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("line 1: not a case"), "{err}");
        assert!(lib.is_empty().unwrap());
    }
}
