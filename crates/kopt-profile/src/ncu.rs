//! Nsight Compute's CSV output: parsing, unit normalisation, its messages, and running
//! it on the kopt worker.
//!
//! # What is parsed
//!
//! `ncu --csv --page raw` prints one header row (identity columns such as `ID`, `Kernel
//! Name`, `Block Size`, then one column per metric, named as ncu spells it:
//! `dram__bytes.sum.per_second`), one units row (`""`, ..., `"byte/s"`), and one row per
//! profiled kernel launch. `ncu --csv` without `--page raw` (the details page) prints one
//! row per metric instead (`..., "Section Name", "Metric Name", "Metric Unit", "Metric
//! Value"`); both are read into the same [`NcuKernel`] records.
//!
//! Anything else on the stream is kept aside, not parsed as CSV: ncu's own lines
//! (`==PROF==`, `==WARNING==`, `==ERROR==`) become [`NcuMessage`]s, and other lines (the
//! profiled program's output, such as a kopt worker's JSON report when it printed to
//! stdout) are kept verbatim in [`NcuOutput::other`].
//!
//! # Values and units
//!
//! Numbers are printed with thousands separators (`37,986,659,825.55`); they are read
//! without them. A value in a scaled unit is normalised to its base unit: bytes
//! (`Kbyte`, `Mbyte`... are powers of 1000), bytes per second, nanoseconds (`usecond`,
//! `msecond`, `second`...), hertz (`Khz`..., `cycle/nsecond`...). Other units (`%`,
//! `cycle`, `inst`, `warp`, `sector`, `block`...) are kept as they are. `no data`, `n/a`
//! and empty cells are missing values; launch tuples like `(256, 1, 1)` and names are
//! text.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// One metric of one kernel, as ncu printed it and normalised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// The value as printed.
    pub raw: String,
    /// The unit as printed (may be empty).
    pub unit: String,
    /// The value in `base_unit`, when it is a number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    /// The unit `value` is in (`byte`, `byte/s`, `ns`, `hz`, or `unit` unchanged).
    pub base_unit: String,
}

impl Metric {
    pub fn new(raw: &str, unit: &str) -> Self {
        let raw = raw.trim();
        let unit = unit.trim();
        let (factor, base) = unit_scale(unit);
        Metric {
            raw: raw.to_string(),
            unit: unit.to_string(),
            value: parse_number(raw).map(|v| v * factor),
            base_unit: base,
        }
    }
}

/// The factor from `unit` to its base unit, and that base unit's name.
pub fn unit_scale(unit: &str) -> (f64, String) {
    const SI: [(&str, f64); 5] = [("", 1.0), ("K", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12)];
    for (prefix, f) in SI {
        for base in ["byte/s", "byte/second", "byte"] {
            if unit == format!("{prefix}{base}") {
                let b = if base == "byte" { "byte" } else { "byte/s" };
                return (f, b.to_string());
            }
        }
        if unit.eq_ignore_ascii_case(&format!("{prefix}hz")) {
            return (f, "hz".into());
        }
    }
    match unit {
        "ns" | "nsecond" => (1.0, "ns".into()),
        "us" | "usecond" => (1e3, "ns".into()),
        "ms" | "msecond" => (1e6, "ns".into()),
        "s" | "second" => (1e9, "ns".into()),
        "cycle/nsecond" => (1e9, "hz".into()),
        "cycle/usecond" => (1e6, "hz".into()),
        "cycle/msecond" => (1e3, "hz".into()),
        "cycle/second" => (1.0, "hz".into()),
        other => (1.0, other.to_string()),
    }
}

/// A number as ncu prints it (`1,234.5`, `-0.29`, `1e+06`), or `None` for anything else.
pub fn parse_number(raw: &str) -> Option<f64> {
    let s: String = raw.trim().chars().filter(|c| *c != ',').collect();
    if s.is_empty() || !s.chars().any(|c| c.is_ascii_digit()) {
        return None;
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'))
    {
        return None;
    }
    s.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// One profiled kernel launch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NcuKernel {
    /// ncu's `ID` of the launch.
    pub id: String,
    pub name: String,
    /// `(256, 1, 1)`.
    pub block: String,
    pub grid: String,
    /// Identity columns (`Process ID`, `Device`, `CC`, ...), as printed.
    pub identity: BTreeMap<String, String>,
    /// Metrics by ncu's name.
    pub metrics: BTreeMap<String, Metric>,
}

impl NcuKernel {
    /// A metric's value in its base unit.
    pub fn value(&self, name: &str) -> Option<f64> {
        self.metrics.get(name).and_then(|m| m.value)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Prof,
    Info,
    Warning,
    Error,
}

/// One of ncu's own lines (`==ERROR== ...`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NcuMessage {
    pub level: Level,
    pub text: String,
}

/// Everything read from ncu's output.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NcuOutput {
    pub kernels: Vec<NcuKernel>,
    pub messages: Vec<NcuMessage>,
    /// Lines that are neither CSV nor ncu's (the profiled program's own output).
    pub other: Vec<String>,
}

impl NcuOutput {
    pub fn errors(&self) -> impl Iterator<Item = &str> {
        self.messages
            .iter()
            .filter(|m| m.level == Level::Error)
            .map(|m| m.text.as_str())
    }

    pub fn warnings(&self) -> impl Iterator<Item = &str> {
        self.messages
            .iter()
            .filter(|m| m.level == Level::Warning)
            .map(|m| m.text.as_str())
    }

    /// Merges another stream's parse (ncu's stderr) into this one.
    pub fn absorb(&mut self, other: NcuOutput) {
        self.kernels.extend(other.kernels);
        self.messages.extend(other.messages);
        self.other.extend(other.other);
    }

    /// The kopt worker's JSON report, when the worker printed it among ncu's output (as
    /// the oneshot worker does without `--report-file`).
    pub fn worker_report_line(&self) -> Option<&str> {
        self.other
            .iter()
            .map(|l| l.trim())
            .find(|l| l.starts_with('{') && l.contains("\"type\":\"report\""))
    }
}

fn message(line: &str) -> Option<NcuMessage> {
    let t = line.trim_start();
    for (tag, level) in [
        ("==PROF==", Level::Prof),
        ("==INFO==", Level::Info),
        ("==WARNING==", Level::Warning),
        ("==ERROR==", Level::Error),
    ] {
        if let Some(rest) = t.strip_prefix(tag) {
            return Some(NcuMessage {
                level,
                text: rest.trim().to_string(),
            });
        }
    }
    None
}

/// Splits CSV records out of `lines` starting at a line that opens with a quote; a record
/// whose quotes are still open at the end of a line continues on the next one.
fn csv_record(first: &str, rest: &mut std::iter::Peekable<std::str::Lines>) -> Vec<String> {
    let mut text = first.to_string();
    while quotes_open(&text) {
        match rest.next() {
            Some(l) => {
                text.push('\n');
                text.push_str(l);
            }
            None => break,
        }
    }
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                chars.next();
                cur.push('"');
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut cur)),
            '\r' if !quoted => {}
            c => cur.push(c),
        }
    }
    fields.push(cur);
    fields
}

fn quotes_open(text: &str) -> bool {
    text.chars().filter(|c| *c == '"').count() % 2 == 1
}

const DETAILS_COLUMNS: [&str; 4] = ["Section Name", "Metric Name", "Metric Unit", "Metric Value"];

/// Parses ncu's output (stdout, or stdout and stderr together). Never fails: what is not
/// understood is kept in [`NcuOutput::other`].
pub fn parse(text: &str) -> NcuOutput {
    let mut out = NcuOutput::default();
    let mut lines = text.lines().peekable();
    let mut header: Option<Vec<String>> = None;
    let mut units: Option<Vec<String>> = None;
    // Details page: kernels by ID, in order of appearance.
    let mut details: Vec<NcuKernel> = Vec::new();
    while let Some(line) = lines.next() {
        if let Some(m) = message(line) {
            out.messages.push(m);
            continue;
        }
        if !line.trim_start().starts_with('"') {
            if !line.trim().is_empty() {
                out.other.push(line.to_string());
            }
            continue;
        }
        let rec = csv_record(line.trim_start(), &mut lines);
        let is_header =
            rec.first().map(String::as_str) == Some("ID") && rec.iter().any(|f| f == "Kernel Name");
        if is_header {
            header = Some(rec);
            units = None;
            continue;
        }
        let Some(h) = &header else {
            out.other.push(line.to_string());
            continue;
        };
        let details_page = DETAILS_COLUMNS.iter().all(|c| h.iter().any(|f| f == c));
        if details_page {
            let col = |name: &str| h.iter().position(|f| f == name);
            let get = |name: &str| col(name).and_then(|i| rec.get(i)).cloned();
            let id = get("ID").unwrap_or_default();
            let idx = match details.iter().position(|k| k.id == id) {
                Some(i) => i,
                None => {
                    details.push(kernel_identity(h, &rec, DETAILS_COLUMNS[0]));
                    details.len() - 1
                }
            };
            if let (Some(name), Some(unit), Some(value)) =
                (get("Metric Name"), get("Metric Unit"), get("Metric Value"))
            {
                details[idx]
                    .metrics
                    .insert(name, Metric::new(&value, &unit));
            }
            continue;
        }
        // Raw page: the row after the header holds the units (its ID cell is empty).
        if units.is_none() && rec.first().is_some_and(|f| f.is_empty()) {
            units = Some(rec);
            continue;
        }
        let first_metric = h.iter().position(|f| f.contains("__")).unwrap_or(h.len());
        let mut k = kernel_identity(&h[..first_metric], &rec, "");
        for (i, name) in h.iter().enumerate().skip(first_metric) {
            let raw = rec.get(i).map(String::as_str).unwrap_or("");
            let unit = units
                .as_ref()
                .and_then(|u| u.get(i))
                .map(String::as_str)
                .unwrap_or("");
            k.metrics.insert(name.clone(), Metric::new(raw, unit));
        }
        out.kernels.push(k);
    }
    out.kernels.extend(details);
    out
}

fn kernel_identity(header: &[String], rec: &[String], stop_at: &str) -> NcuKernel {
    let mut k = NcuKernel {
        id: String::new(),
        name: String::new(),
        block: String::new(),
        grid: String::new(),
        identity: BTreeMap::new(),
        metrics: BTreeMap::new(),
    };
    for (i, col) in header.iter().enumerate() {
        if col == stop_at {
            break;
        }
        let v = rec.get(i).cloned().unwrap_or_default();
        match col.as_str() {
            "ID" => k.id = v,
            "Kernel Name" => k.name = v,
            "Block Size" => k.block = v,
            "Grid Size" => k.grid = v,
            _ => {
                k.identity.insert(col.clone(), v);
            }
        }
    }
    k
}

// ---------------------------------------------------------------------------------------
// Running ncu.

/// What to collect: the curated metric list (`--metrics`), or the sections the recorded
/// H200 captures used (`--section ...`), for an ncu that does not know some metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Collection {
    Metrics,
    Sections,
}

/// How to run the profiled program: the kopt worker in oneshot mode.
#[derive(Debug, Clone)]
pub struct Target {
    pub program: PathBuf,
    /// Arguments before `--oneshot` (`kopt __worker --device 0`).
    pub args: Vec<String>,
    pub job: PathBuf,
    /// Where the worker writes its report, so that ncu's stdout is ncu's alone.
    pub report_file: PathBuf,
}

/// The full ncu command line (program first).
pub fn command_line(
    ncu: &Path,
    collection: Collection,
    entry: &str,
    target: &Target,
) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec![ncu.into()];
    for a in ["--clock-control", "none", "--csv", "--page", "raw"] {
        v.push(a.into());
    }
    match collection {
        Collection::Metrics => {
            v.push("--metrics".into());
            v.push(crate::metrics::metrics_argument().into());
        }
        Collection::Sections => {
            for s in crate::metrics::SECTIONS {
                v.push("--section".into());
                v.push((*s).into());
            }
        }
    }
    v.push("-k".into());
    v.push(format!("regex:^{entry}$").into());
    v.push("--launch-count".into());
    v.push("1".into());
    v.push(target.program.clone().into());
    for a in &target.args {
        v.push(a.into());
    }
    v.push("--oneshot".into());
    v.push(target.job.clone().into());
    v.push("--report-file".into());
    v.push(target.report_file.clone().into());
    v
}

/// One run of ncu.
#[derive(Debug, Clone)]
pub struct Run {
    pub command: Vec<OsString>,
    pub collection: Collection,
    /// `None` when it was killed at the timeout.
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub seconds: f64,
    pub stdout_file: PathBuf,
    pub stderr_file: PathBuf,
    /// stdout and stderr parsed together.
    pub output: NcuOutput,
}

impl Run {
    /// The command as one shell-quoted line, for the record.
    pub fn command_text(&self) -> String {
        self.command
            .iter()
            .map(|a| shell_quote(&a.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Why this run gave no usable kernel, or `None` when it did.
    pub fn failure(&self, entry: &str) -> Option<String> {
        if self.timed_out {
            return Some(format!(
                "ncu did not finish within {:.0} s and was stopped",
                self.seconds
            ));
        }
        if self.output.kernels.iter().any(|k| k.name == entry) {
            return None;
        }
        if let Some(e) = self.output.errors().next() {
            return Some(explain_error(e));
        }
        if let Some(w) = self
            .output
            .warnings()
            .find(|w| w.contains("No kernels were profiled"))
        {
            return Some(format!(
                "ncu: {w} (no launch of `{entry}` was seen: the worker did not launch it, or launched another entry point)"
            ));
        }
        if !self.output.kernels.is_empty() {
            let names: Vec<&str> = self
                .output
                .kernels
                .iter()
                .map(|k| k.name.as_str())
                .collect();
            return Some(format!(
                "ncu profiled {} but not `{entry}`",
                names.join(", ")
            ));
        }
        Some(format!(
            "ncu exited with {} and printed no profile (see {})",
            self.exit_code
                .map_or("a signal".to_string(), |c| format!("code {c}")),
            self.stderr_file.display()
        ))
    }

    /// Whether the failure is an unknown metric, which collecting by sections avoids.
    pub fn unknown_metric(&self) -> bool {
        self.output
            .errors()
            .any(|e| e.contains("Failed to find metric"))
    }
}

/// One of ncu's error lines, with what to do about the known ones.
pub fn explain_error(e: &str) -> String {
    if e.contains("ERR_NVGPUCTRPERM") {
        format!("ncu: {e} -- the profiler may not read the GPU's performance counters: run as root, or let every user profile (driver option NVreg_RestrictProfilingToAdminUsers=0)")
    } else if e.contains("Failed to find metric") {
        format!("ncu: {e} -- this ncu does not know one of kopt's metrics (Nsight Compute 2025.3 on CUDA 13.0 does)")
    } else {
        format!("ncu: {e}")
    }
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,^$@%+".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Runs ncu on the worker, writing its stdout and stderr to `out_dir/<stem>.csv` and
/// `out_dir/<stem>.stderr`. A run that outlasts `timeout` is killed (with the worker).
pub fn run(
    ncu: &Path,
    collection: Collection,
    entry: &str,
    target: &Target,
    out_dir: &Path,
    stem: &str,
    timeout: Duration,
) -> Result<Run, String> {
    let command = command_line(ncu, collection, entry, target);
    let stdout_file = out_dir.join(format!("{stem}.csv"));
    let stderr_file = out_dir.join(format!("{stem}.stderr"));
    let create = |p: &Path| {
        std::fs::File::create(p).map_err(|e| format!("cannot write {}: {e}", p.display()))
    };
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..])
        .stdin(Stdio::null())
        .stdout(create(&stdout_file)?)
        .stderr(create(&stderr_file)?);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // Its own process group, so that a timeout stops the worker under it too.
        cmd.process_group(0);
    }
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", ncu.display()))?;
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if start.elapsed() > timeout => {
                timed_out = true;
                kill_group(&mut child);
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("waiting for ncu: {e}")),
        }
    };
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let mut output = parse(&read(&stdout_file));
    output.absorb(parse(&read(&stderr_file)));
    Ok(Run {
        command,
        collection,
        exit_code: status.and_then(|s| s.code()),
        timed_out,
        seconds: start.elapsed().as_secs_f64(),
        stdout_file,
        stderr_file,
        output,
    })
}

fn kill_group(child: &mut std::process::Child) {
    #[cfg(unix)]
    {
        // The group this function's caller created for ncu and the worker it started.
        let _ = Command::new("kill")
            .args(["-KILL", &format!("-{}", child.id())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    let _ = child.kill();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_units() {
        assert_eq!(parse_number("37,986,659,825.55"), Some(37_986_659_825.55));
        assert_eq!(parse_number("-0.29"), Some(-0.29));
        assert_eq!(parse_number("no data"), None);
        assert_eq!(parse_number("(256, 1, 1)"), None);
        assert_eq!(parse_number("n/a"), None);
        assert_eq!(parse_number(""), None);
        let m = Metric::new("1.5", "usecond");
        assert_eq!((m.value, m.base_unit.as_str()), (Some(1500.0), "ns"));
        let m = Metric::new("2", "Gbyte/s");
        assert_eq!((m.value, m.base_unit.as_str()), (Some(2e9), "byte/s"));
        let m = Metric::new("3", "Mbyte");
        assert_eq!((m.value, m.base_unit.as_str()), (Some(3e6), "byte"));
        let m = Metric::new("1.98", "cycle/nsecond");
        assert_eq!((m.value, m.base_unit.as_str()), (Some(1.98e9), "hz"));
        let m = Metric::new("1,980", "Mhz");
        assert_eq!((m.value, m.base_unit.as_str()), (Some(1.98e9), "hz"));
        let m = Metric::new("12", "inst");
        assert_eq!((m.value, m.base_unit.as_str()), (Some(12.0), "inst"));
    }

    #[test]
    fn quoted_fields_and_messages() {
        let text = "==PROF== Connected to process 1\nhello from the program\n\"ID\",\"Kernel Name\",\"a__b\",\"c__d\"\n\"\",\"\",\"%\",\"\"\n\"0\",\"k\",\"1,234.5\",\"say \"\"hi\"\", twice\"\n==ERROR== something broke\n";
        let o = parse(text);
        assert_eq!(o.kernels.len(), 1);
        let k = &o.kernels[0];
        assert_eq!(k.name, "k");
        assert_eq!(k.value("a__b"), Some(1234.5));
        assert_eq!(k.metrics["c__d"].raw, "say \"hi\", twice");
        assert_eq!(o.other, ["hello from the program"]);
        assert_eq!(o.errors().collect::<Vec<_>>(), ["something broke"]);
        assert_eq!(o.messages[0].level, Level::Prof);
    }

    #[test]
    fn the_command_line_profiles_one_launch_of_the_entry_with_the_clocks_alone() {
        let t = Target {
            program: "/bin/cargo-kopt".into(),
            args: vec![
                "kopt".into(),
                kopt_engine::worker::SUBCOMMAND.into(),
                "--device".into(),
                "0".into(),
            ],
            job: "/r/job.json".into(),
            report_file: "/r/report.json".into(),
        };
        let line: Vec<String> =
            command_line(Path::new("ncu"), Collection::Sections, "softmax_f32", &t)
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
        let joined = line.join(" ");
        assert!(
            joined.starts_with("ncu --clock-control none --csv --page raw --section SpeedOfLight"),
            "{joined}"
        );
        assert!(joined.contains("-k regex:^softmax_f32$ --launch-count 1 /bin/cargo-kopt kopt __worker --device 0 --oneshot /r/job.json --report-file /r/report.json"), "{joined}");
        let m = command_line(Path::new("ncu"), Collection::Metrics, "e", &t);
        let i = m.iter().position(|a| a == "--metrics").unwrap();
        assert!(m[i + 1]
            .to_string_lossy()
            .contains("gpu__time_duration.sum"));
    }

    #[test]
    fn errors_are_explained() {
        let e = explain_error("ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters on the target device 0.");
        assert!(e.contains("run as root"), "{e}");
        assert!(explain_error("Failed to find metric regex:^x$").contains("does not know"));
    }
}
