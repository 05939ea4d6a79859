//! The parent's side of a worker: start it, speak the protocol, watch it. A worker that
//! stops sending messages for longer than the step's limit is killed (a hung kernel); one
//! that dies is reported with its exit status and the end of its stderr. Either way the
//! next request starts a fresh worker.
//!
//! The limit of a step is the step timeout, or [`HANG_FACTOR`] times the duration the
//! worker expects for the step (from the reference's measured launch time) where that is
//! longer: a reference of seconds a launch is given the time it needs, and a candidate
//! that takes more than ten times the reference's time for the same work, and more than
//! the step timeout, is still killed within that bound.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::job::EvalJob;
use crate::protocol::*;

/// How to start a worker process.
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl WorkerCommand {
    /// The running `cargo-kopt` binary's hidden worker subcommand, on GPU `device`.
    pub fn cuda(program: PathBuf, device: usize) -> Self {
        WorkerCommand {
            program,
            args: vec![
                "kopt".into(),
                crate::worker::SUBCOMMAND.into(),
                "--device".into(),
                device.to_string(),
            ],
        }
    }

    /// The same binary, with the fake device of the tests.
    pub fn fake(program: PathBuf) -> Self {
        WorkerCommand {
            program,
            args: vec![
                "kopt".into(),
                crate::worker::SUBCOMMAND.into(),
                "--fake".into(),
            ],
        }
    }

    /// Fake device `device` (`KOPT_FAKE_DEVICES` says how many there are).
    pub fn fake_on(program: PathBuf, device: usize) -> Self {
        let mut c = Self::fake(program);
        c.args.extend(["--device".into(), device.to_string()]);
        c
    }

    pub fn is_fake(&self) -> bool {
        self.args.iter().any(|a| a == "--fake")
    }
}

/// How many times a step's expected duration (reported by the worker, from the
/// reference's measured launch time) the parent waits before it calls the step a hang,
/// when that is longer than the step timeout. Ten: timing noise and a first launch's
/// extra cost stay far inside it, and a candidate ten times slower than the reference
/// has no use an optimiser would keep.
pub const HANG_FACTOR: f64 = 10.0;

/// The longest silence tolerated during a step: `base`, or [`HANG_FACTOR`] times the
/// step's expected duration where that is longer.
pub fn step_limit(base: Duration, expected_s: Option<f64>) -> Duration {
    match expected_s.filter(|e| e.is_finite() && *e > 0.0) {
        // Capped at a day: a bound, and a value `Duration` can hold.
        Some(e) => base.max(Duration::from_secs_f64((HANG_FACTOR * e).min(86_400.0))),
        None => base,
    }
}

/// How a request ended when no regular answer came.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerFailure {
    /// No message for `seconds` during `step`: the worker was killed. `expected_s`: what
    /// the worker expected the step to take, when it could tell (the limit was then the
    /// larger of the step timeout and [`HANG_FACTOR`] times it).
    Hang {
        step: String,
        seconds: f64,
        expected_s: Option<f64>,
    },
    /// The worker exited without answering.
    Died { status: String, stderr: String },
    /// It answered with an error message.
    Refused(String),
    /// It could not be started, or spoke another protocol.
    Start(String),
}

impl std::fmt::Display for WorkerFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerFailure::Hang {
                step,
                seconds,
                expected_s,
            } => {
                write!(
                    f,
                    "no progress for {} during `{step}`: the kernel never finished (worker killed)",
                    seconds_text(*seconds)
                )?;
                match expected_s {
                    Some(e) if HANG_FACTOR * e > *seconds * 0.999 => write!(
                        f,
                        "; the reference's measured launch time predicts {} for this step, and the limit is {HANG_FACTOR} times that",
                        seconds_text(*e)
                    ),
                    Some(e) => write!(
                        f,
                        "; the reference's measured launch time predicts {} for this step, inside the step timeout (`--step-timeout` raises it)",
                        seconds_text(*e)
                    ),
                    None => write!(f, " (`--step-timeout` raises the limit for a kernel this slow on purpose)"),
                }
            }
            WorkerFailure::Died { status, stderr } => write!(
                f,
                "the worker died ({status}){}",
                if stderr.is_empty() {
                    String::new()
                } else {
                    format!(": {stderr}")
                }
            ),
            WorkerFailure::Refused(m) => write!(f, "{m}"),
            WorkerFailure::Start(m) => write!(f, "cannot start the worker: {m}"),
        }
    }
}

/// So that a caller's error can name a worker's failure as its source.
impl std::error::Error for WorkerFailure {}

/// Seconds as a limit reads: whole seconds from 10 s, tenths below (`0.4 s`), thousandths
/// below a tenth.
fn seconds_text(s: f64) -> String {
    if s >= 10.0 {
        format!("{s:.0} s")
    } else if s >= 0.1 {
        format!("{s:.1} s")
    } else {
        format!("{s:.3} s")
    }
}

struct Running {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    device: DeviceInfo,
}

/// One worker process, restarted on demand.
pub struct Worker {
    cmd: WorkerCommand,
    running: Option<Running>,
    /// The longest silence tolerated while a request runs, unless the worker expects a
    /// step to take longer (see [`step_limit`]).
    pub step_timeout: Duration,
    /// Workers started so far (1 + restarts).
    pub starts: u32,
}

impl Worker {
    pub fn new(cmd: WorkerCommand) -> Self {
        Worker {
            cmd,
            running: None,
            step_timeout: Duration::from_secs(30),
            starts: 0,
        }
    }

    pub fn command(&self) -> &WorkerCommand {
        &self.cmd
    }

    fn start(&mut self) -> Result<(), WorkerFailure> {
        let mut child = Command::new(&self.cmd.program)
            .args(&self.cmd.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| WorkerFailure::Start(format!("{}: {e}", self.cmd.program.display())))?;
        self.starts += 1;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let stderr_pipe = child.stderr.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let tail = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr_pipe).lines() {
                let Ok(line) = line else { break };
                let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                t.push_back(line);
                if t.len() > 20 {
                    t.pop_front();
                }
            }
        });
        let mut r = Running {
            child,
            stdin,
            lines: rx,
            stderr,
            device: crate::worker::fake::fake_device(),
        };
        match exchange(
            &mut r,
            &Request::Hello {
                version: PROTOCOL_VERSION,
            },
            Duration::from_secs(120),
            &mut |_| {},
        ) {
            Ok(Message::Hello {
                version, device, ..
            }) if version == PROTOCOL_VERSION => {
                r.device = device;
                self.running = Some(r);
                Ok(())
            }
            Ok(Message::Error { message }) => {
                let _ = r.child.kill();
                let _ = r.child.wait();
                Err(WorkerFailure::Start(message))
            }
            Ok(other) => {
                let _ = r.child.kill();
                let _ = r.child.wait();
                Err(WorkerFailure::Start(format!(
                    "unexpected greeting {other:?}"
                )))
            }
            Err(e) => {
                let _ = r.child.kill();
                let _ = r.child.wait();
                Err(match e {
                    WorkerFailure::Died { stderr, status } => {
                        WorkerFailure::Start(format!("{status}: {stderr}"))
                    }
                    other => other,
                })
            }
        }
    }

    /// The device the worker runs on (starting it if needed).
    pub fn device(&mut self) -> Result<DeviceInfo, WorkerFailure> {
        if self.running.is_none() {
            self.start()?;
        }
        Ok(self.running.as_ref().expect("started").device.clone())
    }

    /// Sends one request and waits for its answer, killing the worker on a hang and
    /// forgetting it when it dies or faults.
    pub fn request(
        &mut self,
        req: &Request,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Message, WorkerFailure> {
        if self.running.is_none() {
            self.start()?;
        }
        let r = self.running.as_mut().expect("started");
        let result = exchange(r, req, self.step_timeout, progress);
        let keep = match &result {
            Ok(Message::Report { report }) => report.fault.is_none(),
            Ok(_) => true,
            Err(_) => false,
        };
        if !keep {
            let mut r = self.running.take().expect("present");
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
        result
    }

    pub fn evaluate(
        &mut self,
        job: &EvalJob,
        progress: &mut dyn FnMut(&str),
    ) -> Result<EvalReport, WorkerFailure> {
        match self.request(
            &Request::Evaluate {
                job: Box::new(job.clone()),
            },
            progress,
        )? {
            Message::Report { report } => Ok(*report),
            Message::Error { message } => Err(WorkerFailure::Refused(message)),
            other => Err(WorkerFailure::Refused(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }

    pub fn ceilings(&mut self) -> Result<Ceilings, WorkerFailure> {
        let saved = self.step_timeout;
        // Measuring takes a while and sends no progress.
        self.step_timeout = saved.max(Duration::from_secs(300));
        let r = self.request(&Request::Ceilings, &mut |_| {});
        self.step_timeout = saved;
        match r? {
            Message::Ceilings { ceilings } => Ok(ceilings),
            Message::Error { message } => Err(WorkerFailure::Refused(message)),
            other => Err(WorkerFailure::Refused(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }

    /// Times a one-launch copy of each byte count (see [`CopyTime`]).
    pub fn copy_times(
        &mut self,
        bytes: &[u64],
        progress: &mut dyn FnMut(&str),
    ) -> Result<Vec<CopyTime>, WorkerFailure> {
        match self.request(
            &Request::CopyTimes {
                bytes: bytes.to_vec(),
            },
            progress,
        )? {
            Message::CopyTimes { copies } => Ok(copies),
            Message::Error { message } => Err(WorkerFailure::Refused(message)),
            other => Err(WorkerFailure::Refused(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }

    pub fn shutdown(&mut self) {
        if let Some(mut r) = self.running.take() {
            let _ = writeln!(
                r.stdin,
                "{}",
                serde_json::to_string(&Request::Shutdown).expect("serialises")
            );
            let _ = r.stdin.flush();
            let _ = r.child.wait();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(mut r) = self.running.take() {
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
    }
}

fn exchange(
    r: &mut Running,
    req: &Request,
    timeout: Duration,
    progress: &mut dyn FnMut(&str),
) -> Result<Message, WorkerFailure> {
    let line = serde_json::to_string(req).expect("requests serialise");
    let sent = writeln!(r.stdin, "{line}").and_then(|_| r.stdin.flush());
    let mut step = match req {
        Request::Evaluate { .. } => "start".to_string(),
        Request::Ceilings => "measuring ceilings".to_string(),
        Request::CopyTimes { .. } => "timing copies".to_string(),
        _ => "greeting".to_string(),
    };
    if sent.is_err() {
        return Err(died(r));
    }
    let mut expected_s: Option<f64> = None;
    let mut limit = timeout;
    loop {
        match r.lines.recv_timeout(limit) {
            Ok(line) => match serde_json::from_str::<Message>(&line) {
                Ok(Message::Progress { step: s, expect_s }) => {
                    progress(&s);
                    step = s;
                    expected_s = expect_s;
                    limit = step_limit(timeout, expect_s);
                }
                Ok(m) => return Ok(m),
                // Anything else on stdout (a library printing) is not ours to parse.
                Err(_) => continue,
            },
            Err(RecvTimeoutError::Timeout) => {
                let _ = r.child.kill();
                let _ = r.child.wait();
                return Err(WorkerFailure::Hang {
                    step,
                    seconds: limit.as_secs_f64(),
                    expected_s,
                });
            }
            Err(RecvTimeoutError::Disconnected) => return Err(died(r)),
        }
    }
}

fn died(r: &mut Running) -> WorkerFailure {
    let status = match r.child.wait() {
        Ok(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            _ => s.to_string(),
        },
        Err(e) => e.to_string(),
    };
    // Give the stderr reader a moment to drain.
    std::thread::sleep(Duration::from_millis(50));
    let stderr = r
        .stderr
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .cloned()
        .collect::<Vec<_>>()
        .join("\n");
    WorkerFailure::Died { status, stderr }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_allowed_ten_times_what_the_reference_predicts_and_never_less_than_the_base() {
        let base = Duration::from_secs(30);
        assert_eq!(step_limit(base, None), base);
        // A launch of 400 ms: the base is longer.
        assert_eq!(step_limit(base, Some(0.4)), base);
        // A step of 8 s (a check of a reference of seconds): 80 s.
        assert_eq!(step_limit(base, Some(8.0)), Duration::from_secs(80));
        // Nonsense from a worker does not lift or break the limit.
        for bad in [f64::NAN, f64::INFINITY, -1.0, 0.0] {
            assert_eq!(step_limit(base, Some(bad)), base, "{bad}");
        }
        assert_eq!(step_limit(base, Some(1e12)), Duration::from_secs(86_400));
    }

    #[test]
    fn a_hang_says_what_limit_killed_it() {
        let plain = WorkerFailure::Hang {
            step: "shape: check (declared): candidate".into(),
            seconds: 30.0,
            expected_s: None,
        };
        assert_eq!(
            plain.to_string(),
            "no progress for 30 s during `shape: check (declared): candidate`: the kernel never finished (worker killed) (`--step-timeout` raises the limit for a kernel this slow on purpose)"
        );
        let derived = WorkerFailure::Hang {
            step: "s: timing (sample 2)".into(),
            seconds: 80.0,
            expected_s: Some(8.0),
        };
        let text = derived.to_string();
        assert!(text.contains("no progress for 80 s"), "{text}");
        assert!(
            text.contains("predicts 8.0 s for this step, and the limit is 10 times that"),
            "{text}"
        );
        let inside = WorkerFailure::Hang {
            step: "s".into(),
            seconds: 0.3,
            expected_s: Some(0.004),
        };
        let text = inside.to_string();
        assert!(text.contains("no progress for 0.3 s"), "{text}");
        assert!(text.contains("inside the step timeout"), "{text}");
    }
}
