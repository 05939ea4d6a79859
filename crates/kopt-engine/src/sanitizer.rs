//! compute-sanitizer on a winner: memcheck (out-of-bounds and misaligned accesses) and
//! racecheck (shared-memory hazards), run on a one-shot worker over the job's smallest
//! shape. Skipped, with the reason, where the tool is missing.

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

/// Runs `tool` (`memcheck` or `racecheck`) over a one-shot worker evaluating `job`
/// (numerics only, smallest shape), for at most [`time_limit`]. `scratch` holds the job
/// file and the tool's log.
pub fn run(worker: &WorkerCommand, job: &EvalJob, tool: &str, scratch: &Path) -> SanitizerResult {
    run_with_limit(worker, job, tool, scratch, time_limit())
}

pub fn run_with_limit(
    worker: &WorkerCommand,
    job: &EvalJob,
    tool: &str,
    scratch: &Path,
    limit: Duration,
) -> SanitizerResult {
    let Some(bin) = find_tool() else {
        return SanitizerResult::Skipped {
            tool: tool.into(),
            reason: "compute-sanitizer was not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)"
                .into(),
        };
    };
    run_tool(&bin, worker, job, tool, scratch, limit)
}

/// [`run_with_limit`] with the tool's binary given.
pub fn run_tool(
    bin: &Path,
    worker: &WorkerCommand,
    job: &EvalJob,
    tool: &str,
    scratch: &Path,
    limit: Duration,
) -> SanitizerResult {
    let mut small = job.clone();
    small.timing = None;
    small.shapes.sort_by_key(|s| {
        crate::job::shape_bytes(
            &job.spec,
            &job.spec.shape_args(&kopt_spec::spec::Shape {
                values: s.values.clone(),
                weight: 1.0,
            }),
        )
    });
    small.shapes.truncate(1);
    let _ = std::fs::create_dir_all(scratch);
    let job_path = scratch.join(format!("sanitize-{tool}.json"));
    let log_path = scratch.join(format!("sanitize-{tool}.log"));
    if let Err(e) = std::fs::write(
        &job_path,
        serde_json::to_string(&small).expect("serialises"),
    ) {
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
                    "did not finish within {} s on the smallest shape and was stopped \
                     (KOPT_SANITIZER_TIMEOUT=SECONDS raises the limit)",
                    limit.as_secs()
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
