//! compute-sanitizer on a winner: memcheck (out-of-bounds and misaligned accesses),
//! racecheck (shared-memory hazards), initcheck (reads of uninitialised device memory)
//! and synccheck (barriers misused), each run on a one-shot worker over a few of the job's
//! shapes ([`sanitizer_shapes`]). Skipped, with the reason, where the tool is missing or
//! runs past its limit: never reported clean without having run.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::job::EvalJob;
use crate::parent::WorkerCommand;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum SanitizerResult {
    Clean {
        tool: String,
    },
    Errors {
        tool: String,
        count: u64,
        excerpt: String,
    },
    Skipped {
        tool: String,
        reason: String,
    },
}

impl SanitizerResult {
    pub fn is_error(&self) -> bool {
        matches!(self, SanitizerResult::Errors { .. })
    }

    pub fn tool(&self) -> &str {
        match self {
            SanitizerResult::Clean { tool }
            | SanitizerResult::Errors { tool, .. }
            | SanitizerResult::Skipped { tool, .. } => tool,
        }
    }

    /// `memcheck: clean`, `memcheck: 2 errors`, `memcheck: skipped (reason)`.
    pub fn describe(&self) -> String {
        match self {
            SanitizerResult::Clean { tool } => format!("{tool}: clean"),
            SanitizerResult::Errors { tool, count, .. } => format!("{tool}: {count} error(s)"),
            SanitizerResult::Skipped { tool, reason } => format!("{tool}: skipped ({reason})"),
        }
    }
}

/// `compute-sanitizer` on PATH, or under `$CUDA_HOME/bin`, `/usr/local/cuda/bin`.
pub fn find_tool() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.push(PathBuf::from(v).join("bin"));
        }
    }
    dirs.push("/usr/local/cuda/bin".into());
    dirs.into_iter()
        .map(|d| d.join("compute-sanitizer"))
        .find(|p| p.is_file())
}

/// The number in a summary line such as `ERROR SUMMARY: 3 errors` or
/// `RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)`.
pub fn parse_error_count(log: &str) -> Option<u64> {
    for line in log.lines().rev() {
        let l = line.trim_start_matches('=').trim();
        if let Some(rest) = l.strip_prefix("ERROR SUMMARY:") {
            return rest.split_whitespace().next()?.parse().ok();
        }
        if let Some(rest) = l.strip_prefix("RACECHECK SUMMARY:") {
            if let Some(i) = rest.find('(') {
                return rest[i + 1..].split_whitespace().next()?.parse().ok();
            }
            return rest.split_whitespace().next()?.parse().ok();
        }
    }
    None
}

/// How long one tool may run: `KOPT_SANITIZER_TIMEOUT` seconds, else 120. The tools
/// slow a kernel down by orders of magnitude (racecheck on a tensor-core GEMM most of
/// all); a run cut off is reported as skipped, with the reason, never as clean.
pub fn time_limit() -> Duration {
    let secs = std::env::var("KOPT_SANITIZER_TIMEOUT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(120);
    Duration::from_secs(secs.max(1))
}

const NOT_FOUND: &str =
    "compute-sanitizer was not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)";

/// Every tool a winner goes through, in the order they run.
pub const TOOLS: [&str; 4] = ["memcheck", "racecheck", "initcheck", "synccheck"];

/// The most bytes (the spec's ideal bytes of a shape) a shape may move to be sanitized
/// beside the smallest: `KOPT_SANITIZER_MAX_BYTES`, else 64 MiB. The tools slow a kernel by
/// 10 to 100 times, so large shapes would cost minutes each.
pub fn max_bytes() -> u64 {
    std::env::var("KOPT_SANITIZER_MAX_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64 << 20)
}

/// The shapes of `job` the tools run on: the smallest (by the spec's ideal bytes), and the
/// largest under [`max_bytes`] where that is another shape, so that code paths taken only
/// at size (a split mode, a tail loop of a long row) are sanitized too. Held-out shapes
/// count: they are the odd sizes.
pub fn sanitizer_shapes(job: &EvalJob) -> Vec<kopt_spec::shapes::ShapeCase> {
    let bytes = |s: &kopt_spec::shapes::ShapeCase| {
        kopt_spec::shapes::ideal_bytes(
            &job.spec,
            &job.spec.shape_args(&kopt_spec::spec::Shape {
                values: s.values.clone(),
                weight: 1.0,
            }),
        )
    };
    let mut shapes: Vec<(u64, kopt_spec::shapes::ShapeCase)> =
        job.shapes.iter().map(|s| (bytes(s), s.clone())).collect();
    shapes.sort_by_key(|(b, _)| *b);
    let mut out = Vec::new();
    if let Some((_, first)) = shapes.first() {
        out.push(first.clone());
    }
    let cap = max_bytes();
    if let Some((_, big)) = shapes.iter().rev().find(|(b, _)| *b <= cap) {
        if out.iter().all(|s| s.label != big.label) {
            out.push(big.clone());
        }
    }
    out
}

/// What the sanitizer pass found for one candidate: each tool's result over `shapes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SanitizerRun {
    pub shapes: Vec<String>,
    pub results: Vec<SanitizerResult>,
    /// Wall time of the whole pass, seconds.
    pub seconds: f64,
}

impl SanitizerRun {
    pub fn errors(&self) -> impl Iterator<Item = &SanitizerResult> {
        self.results.iter().filter(|r| r.is_error())
    }

    /// One line per tool: `memcheck: clean`, `initcheck: 3 errors`, `synccheck: skipped (...)`.
    pub fn describe(&self) -> String {
        self.results
            .iter()
            .map(|r| r.describe())
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Runs every tool of [`TOOLS`] over `job` restricted to [`sanitizer_shapes`], numerics
/// only. A fake worker has no GPU to sanitize: every tool is reported skipped.
pub fn sanitize(worker: &WorkerCommand, job: &EvalJob, scratch: &Path) -> SanitizerRun {
    sanitize_with(find_tool().as_deref(), worker, job, scratch, time_limit())
}

/// [`sanitize`] with the tool's binary (`None`: not found) and the limit per tool given.
pub fn sanitize_with(
    bin: Option<&Path>,
    worker: &WorkerCommand,
    job: &EvalJob,
    scratch: &Path,
    limit: Duration,
) -> SanitizerRun {
    let start = Instant::now();
    let shapes = sanitizer_shapes(job);
    let mut small = candidate_alone(job);
    small.shapes = shapes.clone();
    let results = TOOLS
        .iter()
        .map(|tool| match bin {
            _ if worker.is_fake() => SanitizerResult::Skipped {
                tool: tool.to_string(),
                reason: "the fake device runs no kernel to sanitize".into(),
            },
            None => SanitizerResult::Skipped {
                tool: tool.to_string(),
                reason: NOT_FOUND.into(),
            },
            Some(bin) => run_job(bin, worker, &small, tool, scratch, limit),
        })
        .collect();
    SanitizerRun {
        shapes: shapes.into_iter().map(|s| s.label).collect(),
        results,
        seconds: start.elapsed().as_secs_f64(),
    }
}

/// The job a tool runs: numerics only, with the candidate in the reference's place too,
/// so that every launch under the tool is the candidate's. The tools name a kernel by its
/// entry, which the reference and the candidate usually share: with the reference in the
/// job, its own errors were the candidate's (the example's GQA reference reads 16 bytes
/// of its 4-byte shared array at one key, and memcheck rejected a clean variant for it).
/// The numerics were checked against the reference in the verification itself.
fn candidate_alone(job: &EvalJob) -> EvalJob {
    let mut small = job.clone();
    small.timing = None;
    small.reference = job.candidate.clone();
    small
}

/// Adds a sanitizer pass to a verdict: recorded in it, and any tool's errors reject it
/// (fence `sanitizer`).
pub fn apply(verdict: &mut crate::verdict::Verdict, run: SanitizerRun) {
    for r in run.errors() {
        if let SanitizerResult::Errors {
            tool,
            count,
            excerpt,
        } = r
        {
            verdict.accepted = false;
            verdict.failures.push(crate::verdict::Failure {
                fence: crate::verdict::Fence::Sanitizer,
                shape: None,
                message: format!(
                    "compute-sanitizer {tool}: {count} error(s) on {}\n{excerpt}",
                    run.shapes.join(", ")
                ),
            });
        }
    }
    verdict.sanitizer = Some(run);
}

/// One tool over a one-shot worker evaluating `job` (numerics only, its smallest shape),
/// for at most `limit`; `scratch` holds the job file and the tool's log.
pub fn run_tool(
    bin: &Path,
    worker: &WorkerCommand,
    job: &EvalJob,
    tool: &str,
    scratch: &Path,
    limit: Duration,
) -> SanitizerResult {
    let mut small = candidate_alone(job);
    small.shapes.sort_by_key(|s| {
        kopt_spec::shapes::ideal_bytes(
            &job.spec,
            &job.spec.shape_args(&kopt_spec::spec::Shape {
                values: s.values.clone(),
                weight: 1.0,
            }),
        )
    });
    small.shapes.truncate(1);
    run_job(bin, worker, &small, tool, scratch, limit)
}

fn run_job(
    bin: &Path,
    worker: &WorkerCommand,
    small: &EvalJob,
    tool: &str,
    scratch: &Path,
    limit: Duration,
) -> SanitizerResult {
    let _ = std::fs::create_dir_all(scratch);
    let job_path = scratch.join(format!("sanitize-{tool}.json"));
    let log_path = scratch.join(format!("sanitize-{tool}.log"));
    if let Err(e) = std::fs::write(&job_path, serde_json::to_string(small).expect("serialises")) {
        return SanitizerResult::Skipped {
            tool: tool.into(),
            reason: format!("cannot write {}: {e}", job_path.display()),
        };
    }
    let mut args = vec![
        "--tool".to_string(),
        tool.to_string(),
        "--log-file".into(),
        log_path.display().to_string(),
    ];
    if tool == "racecheck" {
        args.extend(["--racecheck-report".into(), "hazard".into()]);
    }
    if tool == "memcheck" {
        // Buffers allocated one after another can be contiguous, and memcheck only asks
        // whether an address belongs to some allocation: a write one element past an
        // output lands in the next buffer unseen. Padding after every allocation makes
        // such an access an error.
        args.extend(["--padding".into(), "512".into()]);
    }
    let stderr_path = scratch.join(format!("sanitize-{tool}.stderr"));
    let status = std::fs::File::create(&stderr_path).and_then(|stderr| {
        let mut child = Command::new(bin)
            .args(&args)
            .arg(&worker.program)
            .args(worker.args.iter().filter(|a| *a != "--fake"))
            .arg("--oneshot")
            .arg(&job_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()?;
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(Some(status));
            }
            if start.elapsed() >= limit {
                let _ = child.kill();
                let _ = child.wait();
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let status = match status {
        Ok(Some(s)) => Ok(s),
        Ok(None) => {
            return SanitizerResult::Skipped {
                tool: tool.into(),
                reason: format!(
                    "did not finish within {} s on {} and was stopped \
                     (KOPT_SANITIZER_TIMEOUT=SECONDS raises the limit)",
                    limit.as_secs(),
                    small
                        .shapes
                        .iter()
                        .map(|s| s.label.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        }
        Err(e) => Err(e),
    };
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    match (status, parse_error_count(&log)) {
        (Err(e), _) => SanitizerResult::Skipped {
            tool: tool.into(),
            reason: format!("could not run {}: {e}", bin.display()),
        },
        (Ok(_), Some(0)) => SanitizerResult::Clean { tool: tool.into() },
        (Ok(_), Some(n)) => SanitizerResult::Errors {
            tool: tool.into(),
            count: n,
            excerpt: log
                .lines()
                .filter(|l| l.contains("========="))
                .take(12)
                .collect::<Vec<_>>()
                .join("\n"),
        },
        (Ok(status), None) => SanitizerResult::Skipped {
            tool: tool.into(),
            reason: format!(
                "no summary in the tool's log (exit {:?}): {}",
                status.code(),
                std::fs::read_to_string(&stderr_path)
                    .unwrap_or_default()
                    .lines()
                    .last()
                    .unwrap_or("")
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_tool_that_runs_past_its_limit_is_stopped_and_reported_skipped() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("compute-sanitizer");
        std::fs::write(&tool, "#!/bin/sh\nexec sleep 30\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let spec = crate::job::tests_support::tiny_spec();
        let job = crate::job::tests_support::tiny_job(&spec);
        let worker = WorkerCommand::fake("/bin/true".into());
        let start = Instant::now();
        let r = run_tool(
            &tool,
            &worker,
            &job,
            "racecheck",
            dir.path(),
            Duration::from_millis(300),
        );
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the tool was not stopped"
        );
        match r {
            SanitizerResult::Skipped { reason, .. } => {
                assert!(reason.contains("did not finish within"), "{reason}")
            }
            other => panic!("expected skipped, got {other:?}"),
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_tool_reporting_errors_rejects_the_verdict_and_every_tool_is_listed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("compute-sanitizer");
        // Stands in for the real tool: memcheck finds 2 errors, the others none.
        std::fs::write(
            &tool,
            "#!/bin/sh\nwhile [ $# -gt 0 ]; do case \"$1\" in --tool) t=$2; shift 2;; --log-file) l=$2; shift 2;; *) shift;; esac; done\nif [ \"$t\" = memcheck ]; then echo '========= Invalid __global__ write of size 4 bytes' > \"$l\"; echo '========= ERROR SUMMARY: 2 errors' >> \"$l\"; else echo '========= ERROR SUMMARY: 0 errors' > \"$l\"; fi\n",
        )
        .unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let spec = crate::job::tests_support::tiny_spec();
        let job = crate::job::tests_support::tiny_job(&spec);
        let worker = WorkerCommand::cuda("/bin/true".into(), 0);
        let run = sanitize_with(
            Some(&tool),
            &worker,
            &job,
            dir.path(),
            Duration::from_secs(20),
        );
        let tools: Vec<&str> = run.results.iter().map(|r| r.tool()).collect();
        assert_eq!(tools, TOOLS.to_vec());
        // What ran under the tool was the candidate alone.
        let ran: EvalJob = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("sanitize-memcheck.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(ran.reference, job.candidate);
        assert_eq!(ran.candidate, job.candidate);
        assert!(ran.timing.is_none());
        assert_eq!(run.errors().count(), 1);
        let mut verdict =
            crate::verdict::Verdict::rejected(crate::verdict::Fence::Compile, "x".into());
        verdict.accepted = true;
        verdict.failures.clear();
        apply(&mut verdict, run);
        assert!(!verdict.accepted);
        assert_eq!(verdict.failures[0].fence, crate::verdict::Fence::Sanitizer);
        assert!(
            verdict.failures[0].message.contains("memcheck: 2 error(s)"),
            "{}",
            verdict.failures[0].message
        );
        assert!(verdict.sanitizer.is_some());

        // Missing tool: skipped with the reason, never clean.
        let run = sanitize_with(None, &worker, &job, dir.path(), Duration::from_secs(1));
        assert!(run.results.iter().all(
            |r| matches!(r, SanitizerResult::Skipped { reason, .. } if reason.contains("not found"))
        ));
    }

    #[test]
    fn the_smallest_shape_and_the_largest_under_the_cap_are_sanitized() {
        let spec = crate::job::tests_support::tiny_spec();
        let mut job = crate::job::tests_support::tiny_job(&spec);
        let case = |rows: i64, cols: i64| {
            let shape = kopt_spec::spec::Shape {
                values: [
                    ("rows".to_string(), kopt_spec::spec::Number::Int(rows)),
                    ("cols".to_string(), kopt_spec::spec::Number::Int(cols)),
                ]
                .into_iter()
                .collect(),
                weight: 1.0,
            };
            kopt_spec::shapes::ShapeCase::declared(&shape)
        };
        // 16 MB, 4 KB, 512 MB (over the 64 MiB cap), 32 MB.
        job.shapes = vec![
            case(1024, 2048),
            case(1, 512),
            case(8192, 8192),
            case(1024, 4096),
        ];
        let labels: Vec<String> = sanitizer_shapes(&job)
            .into_iter()
            .map(|s| s.label)
            .collect();
        assert_eq!(labels, vec![case(1, 512).label, case(1024, 4096).label]);
    }

    #[test]
    fn summaries_parse() {
        assert_eq!(
            parse_error_count("========= ERROR SUMMARY: 0 errors\n"),
            Some(0)
        );
        assert_eq!(
            parse_error_count("x\n========= ERROR SUMMARY: 12 errors\n"),
            Some(12)
        );
        assert_eq!(
            parse_error_count(
                "========= RACECHECK SUMMARY: 3 hazards displayed (2 errors, 1 warnings)\n"
            ),
            Some(2)
        );
        assert_eq!(parse_error_count("nothing"), None);
    }
}
