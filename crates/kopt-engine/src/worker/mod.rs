//! The worker process: owns one CUDA context (or a fake device), reads requests on stdin,
//! writes messages on stdout. Started by the parent as a hidden subcommand of the
//! `cargo-kopt` binary, so that a faulting or hanging candidate takes down only this
//! process.

use std::io::{BufRead, Write};

use crate::job::EvalJob;
use crate::protocol::{
    Ceilings, CopyTime, DeviceInfo, EvalReport, Message, Request, PROTOCOL_VERSION,
};

pub mod cuda;
pub mod fake;

/// Called before every step that touches the device: the step, and how long it should
/// take in seconds where the reference's measured launch time tells (the parent's hang
/// limit for the step follows from it; see [`crate::parent::step_limit`]).
pub type StepProgress<'a> = &'a mut dyn FnMut(&str, Option<f64>);

/// What runs the jobs: the GPU, or the fake device of the tests.
pub trait Backend {
    fn name(&self) -> &'static str;
    fn device(&self) -> DeviceInfo;
    fn ceilings(&mut self) -> Result<Ceilings, String>;
    /// Runs a job; `progress` is called before every step that touches the device.
    fn evaluate(&mut self, job: &EvalJob, progress: StepProgress) -> EvalReport;
    /// Whether a parent watches the steps (it does unless the worker runs one job alone,
    /// under a profiler or compute-sanitizer). Unwatched, the reference is not launched
    /// alone before the candidate for the hang limits: the first launch of the entry point
    /// stays the candidate's, the one Nsight Compute profiles.
    fn set_watched(&mut self, watched: bool);
    /// Times a one-launch copy of each byte count (see [`CopyTime`]).
    fn copy_times(
        &mut self,
        bytes: &[u64],
        progress: &mut dyn FnMut(&str),
    ) -> Result<Vec<CopyTime>, String>;
}

/// The hidden subcommand of `cargo kopt` that runs a worker:
/// `cargo-kopt kopt __worker [--device N] [--fake] [--oneshot JOB [--report-file FILE]]`.
/// The engine starts its workers with it ([`crate::parent::WorkerCommand`]), the CLI
/// declares it and hands it to [`main`], and the profiler's wrappers run it in oneshot
/// mode.
pub const SUBCOMMAND: &str = "__worker";

/// The worker subcommand's entry point: serves the parent over stdin/stdout, or with
/// `oneshot` evaluates that one job. Returns the process's exit code.
pub fn main(
    device: usize,
    fake: bool,
    oneshot: Option<&std::path::Path>,
    report_file: Option<&std::path::Path>,
) -> i32 {
    let kind = if fake {
        WorkerKind::Fake { device }
    } else {
        WorkerKind::Cuda { device }
    };
    match oneshot {
        Some(job) => self::oneshot(kind, job, report_file),
        None => serve(kind),
    }
}

/// How the worker was asked to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerKind {
    Cuda {
        device: usize,
    },
    /// Fake device `device` (of `KOPT_FAKE_DEVICES`).
    Fake {
        device: usize,
    },
}

impl WorkerKind {
    fn backend(&self) -> Result<Box<dyn Backend>, String> {
        match *self {
            WorkerKind::Fake { device } => {
                let count = fake::fake_device_count()?;
                if device >= count {
                    return Err(format!(
                        "fake device {device} does not exist: {} is {count}",
                        fake::FAKE_DEVICES_VAR
                    ));
                }
                Ok(Box::new(fake::FakeBackend::on(device)))
            }
            WorkerKind::Cuda { device } => Ok(Box::new(cuda::CudaBackend::new(device)?)),
        }
    }
}

/// Serves requests until `Shutdown`, end of input, or a fault. Returns the exit code.
pub fn serve(kind: WorkerKind) -> i32 {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut backend = match kind.backend() {
        Ok(b) => b,
        Err(e) => {
            send(&mut out, &Message::Error { message: e });
            return 2;
        }
    };
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return 1 };
        if line.trim().is_empty() {
            continue;
        }
        let req: Request = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => {
                send(
                    &mut out,
                    &Message::Error {
                        message: format!("bad request: {e}"),
                    },
                );
                continue;
            }
        };
        match req {
            Request::Hello { version } => {
                if version != PROTOCOL_VERSION {
                    send(&mut out, &Message::Error {
                        message: format!("protocol {version} requested, this worker speaks {PROTOCOL_VERSION}"),
                    });
                    return 2;
                }
                send(
                    &mut out,
                    &Message::Hello {
                        version: PROTOCOL_VERSION,
                        backend: backend.name().into(),
                        device: backend.device(),
                    },
                );
            }
            Request::Ceilings => match backend.ceilings() {
                Ok(c) => send(&mut out, &Message::Ceilings { ceilings: c }),
                Err(e) => send(&mut out, &Message::Error { message: e }),
            },
            Request::Evaluate { job } => {
                let report = backend.evaluate(&job, &mut progress_message);
                let fault = report.fault.is_some();
                send(
                    &mut out,
                    &Message::Report {
                        report: Box::new(report),
                    },
                );
                if fault {
                    // The context is poisoned: every later call would fail.
                    return 3;
                }
            }
            Request::CopyTimes { bytes } => {
                match backend.copy_times(&bytes, &mut |step| progress_message(step, None)) {
                    Ok(copies) => send(&mut out, &Message::CopyTimes { copies }),
                    Err(e) => send(&mut out, &Message::Error { message: e }),
                }
            }
            Request::Shutdown => return 0,
        }
    }
    0
}

/// Sends a progress step, so that the parent's watchdog sees a long job move, with the
/// step's expected duration where the backend knows it.
fn progress_message(step: &str, expect_s: Option<f64>) {
    send(
        &mut std::io::stdout().lock(),
        &Message::Progress {
            step: step.to_string(),
            expect_s: expect_s.filter(|e| e.is_finite() && *e >= 0.0),
        },
    )
}

/// Evaluates one job read from a file and prints the report: the form compute-sanitizer
/// and Nsight Compute run the worker in. With `report_file`, the report goes to that file
/// instead of stdout, so that a profiler's output on stdout is the profiler's alone.
pub fn oneshot(
    kind: WorkerKind,
    job: &std::path::Path,
    report_file: Option<&std::path::Path>,
) -> i32 {
    let job: EvalJob = match std::fs::read_to_string(job)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
    {
        Ok(j) => j,
        Err(e) => {
            eprintln!("kopt worker: cannot read the job: {e}");
            return 2;
        }
    };
    let mut backend = match kind.backend() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("kopt worker: {e}");
            return 2;
        }
    };
    backend.set_watched(false);
    let report = backend.evaluate(&job, &mut |_, _| {});
    let fault = report.fault.is_some();
    let message = Message::Report {
        report: Box::new(report),
    };
    match report_file {
        None => send(&mut std::io::stdout().lock(), &message),
        Some(path) => {
            let line = serde_json::to_string(&message).expect("messages serialise") + "\n";
            if let Err(e) = kopt_spec::files::write_atomic(path, line.as_bytes()) {
                eprintln!(
                    "kopt worker: cannot write the report to {}: {e}",
                    path.display()
                );
                return 2;
            }
        }
    }
    if fault {
        3
    } else {
        0
    }
}

fn send(out: &mut impl Write, m: &Message) {
    let line = serde_json::to_string(m).expect("messages serialise");
    // A parent that went away is not this process's problem to report.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
