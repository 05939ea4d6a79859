//! `cargo kopt profile` on a scratch copy of the example crate: with no GPU at all, with
//! a GPU (the fake worker) but no profiler, with a profiler that answers from a recorded
//! H200 capture, one that is refused the counters, and one that does not know a metric.
//! Also the worker's `--report-file` and `__job --shape LABEL`, which the profiler uses.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kopt_tests::{text, ExampleWorkspace};
use serde_json::Value;

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cargo-kopt"))
}

fn capture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../kopt-profile/tests/fixtures")
        .join(name)
}

/// `cargo kopt profile ARGS` with the fake worker (`fake = true`) or no GPU at all.
fn profile(ws: &ExampleWorkspace, fake: bool, args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut c = Command::new(exe());
    c.arg("kopt")
        .arg("profile")
        .args(args)
        .arg("--manifest-path")
        .arg(ws.manifest())
        .env("KOPT_CACHE_DIR", ws.root.join("cache"))
        .env_remove("KOPT_NCU")
        .env_remove("NO_COLOR");
    if fake {
        c.env("KOPT_WORKER", "fake");
    } else {
        // No GPU, also on a machine that has one.
        c.env_remove("KOPT_WORKER").env("CUDA_VISIBLE_DEVICES", "");
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(o)))
}

fn collector<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["snapshot"]["collectors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no collector {name}"))
}

/// An executable `ncu` stand-in: it records its arguments, prints `stdout` (a file), and
/// exits with `code`. `refuse` prints that line instead when the arguments contain it.
fn fake_ncu(dir: &Path, stdout: &Path, code: i32, refuse: Option<(&str, &str)>) -> PathBuf {
    let path = dir.join("ncu");
    let refuse = refuse
        .map(|(arg, line)| {
            format!("case \" $* \" in *\" {arg} \"*) echo '{line}'; exit 1 ;; esac\n")
        })
        .unwrap_or_default();
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\necho \"$*\" >> \"{}\"\n{refuse}cat \"{}\"\nexit {code}\n",
            dir.join("ncu-args.txt").display(),
            stdout.display()
        ),
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    path
}

#[test]
fn without_a_gpu_it_says_what_is_missing_and_summarises_the_source() {
    let ws = ExampleWorkspace::new();
    let o = profile(&ws, false, &["softmax"], &[]);
    assert_eq!(o.status.code(), Some(1), "nothing measured: {}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("bottleneck: not classified: nothing was measured"),
        "{out}"
    );
    let engine = out
        .lines()
        .find(|l| l.trim_start().starts_with("engine "))
        .unwrap();
    assert!(engine.contains("skipped: needs a GPU: "), "{engine}");
    let ncu = out
        .lines()
        .find(|l| l.trim_start().starts_with("ncu "))
        .unwrap();
    assert!(ncu.contains("skipped: needs a GPU: "), "{ncu}");
    assert!(
        out.contains("structure ran: 6 loop(s), 2 global buffer(s)"),
        "{out}"
    );
    assert!(
        out.contains("the data is read in 3 passes (loops reading `x`)"),
        "{out}"
    );
    if !kopt::gpu::nvrtc_present() {
        assert!(
            out.contains("ptx       skipped: NVRTC (libnvrtc.so) could not be loaded"),
            "{out}"
        );
    }

    let o = profile(&ws, false, &["gqa_decode", "--message-format", "json"], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v = json(&o);
    let s = &v["snapshot"];
    assert!(s.get("classification").is_none());
    assert_eq!(collector(&v, "engine")["status"], "skipped");
    assert_eq!(collector(&v, "structure")["status"], "ran");
    assert_eq!(s["measurements"]["serial_loop_trips"]["value"], 1024.0);
    let dir = PathBuf::from(v["dir"].as_str().unwrap());
    assert!(dir.ends_with("profile/gqa_decode"), "{}", dir.display());
    for f in ["snapshot.json", "snapshot.txt", "structure.txt"] {
        assert!(dir.join(f).is_file(), "{f} is kept");
    }
    let journal = std::fs::read_to_string(dir.join("../../journal.jsonl")).unwrap();
    let events: Vec<Value> = journal
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["run_started", "profile", "run_finished"]);
    assert!(events[1]["summary"]
        .as_str()
        .unwrap()
        .contains("not classified"));
}

#[test]
fn with_a_gpu_but_no_profiler_it_classifies_from_the_engine() {
    let ws = ExampleWorkspace::new();
    let o = profile(
        &ws,
        true,
        &["softmax", "--ncu", "/nonexistent/ncu", "--no-cases"],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("ncu       skipped: /nonexistent/ncu does not exist (--ncu PATH)"),
        "{out}"
    );
    assert!(
        out.contains("engine    ran: reference on kopt fake GPU"),
        "{out}"
    );
    assert!(out.contains("bottleneck: memory-bound"), "{out}");
    assert!(out.contains("rules' margin"), "{out}");

    let o = profile(
        &ws,
        true,
        &[
            "softmax",
            "--no-ncu",
            "--no-cases",
            "--message-format",
            "json",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    assert_eq!(collector(&v, "ncu")["detail"], "--no-ncu");
    let s = &v["snapshot"];
    assert_eq!(s["classification"]["class"], "memory-bound");
    assert_eq!(s["confidence"]["source"], "rules-margin");
    assert_eq!(
        s["metric_sources"]["dram_throughput_pct"]
            .as_str()
            .unwrap()
            .split(':')
            .next(),
        Some("engine")
    );
    let dir = PathBuf::from(v["dir"].as_str().unwrap());
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("engine-report.json")).unwrap())
            .unwrap();
    assert_eq!(report["device"]["name"], "kopt fake GPU");
    let job: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("eval-job.json")).unwrap()).unwrap();
    assert_eq!(
        job["shapes"].as_array().unwrap().len(),
        1,
        "the one shape, no held-out shapes"
    );
    assert!(!job["timing"].is_null(), "the engine's job is timed");
}

#[test]
fn with_a_profiler_the_capture_decides_and_every_artefact_is_kept() {
    let ws = ExampleWorkspace::new();
    let tools = tempfile::tempdir().unwrap();
    let ncu = fake_ncu(tools.path(), &capture("softmax-shape0.csv"), 0, None);
    let o = profile(
        &ws,
        true,
        &[
            "softmax",
            "--shape",
            "cols=4096 rows=4096",
            "--ncu",
            ncu.to_str().unwrap(),
            "--no-cases",
            "--message-format",
            "json",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    let s = &v["snapshot"];
    let n = collector(&v, "ncu");
    assert_eq!(n["status"], "ran", "{n}");
    assert!(
        n["detail"]
            .as_str()
            .unwrap()
            .contains("metrics of one launch of `softmax_f32` (--metrics, --clock-control none)"),
        "{n}"
    );
    assert_eq!(s["ncu_collection"], "metrics");
    // The capture's counters are in the snapshot (the engine here is the fake device,
    // whose own figures differ from the H200's: the class still comes out memory-bound).
    assert_eq!(s["classification"]["class"], "memory-bound");
    assert_eq!(s["metrics"]["stall_long_scoreboard_pct"], 69.5);
    assert_eq!(s["metrics"]["dram_throughput_pct"], 37.91);
    assert!(s["metric_sources"]["dram_throughput_pct"]
        .as_str()
        .unwrap()
        .starts_with("ncu: "));
    let ids: Vec<&str> = s["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"memory-stalls") && ids.contains(&"passes"),
        "{ids:?}"
    );
    // How ncu was run: the worker in oneshot mode, one launch of the entry, the clocks alone.
    let args = std::fs::read_to_string(tools.path().join("ncu-args.txt")).unwrap();
    for needle in [
        "--clock-control none --csv --page raw --metrics gpu__time_duration.sum,",
        "-k regex:^softmax_f32$ --launch-count 1",
        "kopt __worker --fake --device 0 --oneshot",
        "job.json --report-file",
        "worker-report.json",
    ] {
        assert!(args.contains(needle), "{needle} not in {args}");
    }
    let dir = PathBuf::from(v["dir"].as_str().unwrap());
    for f in [
        "job.json",
        "ncu.csv",
        "ncu.stderr",
        "ncu-command.txt",
        "eval-job.json",
        "engine-report.json",
        "structure.txt",
        "snapshot.json",
        "snapshot.txt",
    ] {
        assert!(dir.join(f).is_file(), "{f} is kept in {}", dir.display());
    }
    let job: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("job.json")).unwrap()).unwrap();
    assert!(job["timing"].is_null(), "under ncu the job only checks");
    assert_eq!(job["shapes"][0]["label"], "cols=4096 rows=4096");
    let kept: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("snapshot.json")).unwrap()).unwrap();
    assert_eq!(&kept, s);
}

#[test]
fn a_refused_profiler_is_reported_with_the_fix_and_the_rest_still_runs() {
    let ws = ExampleWorkspace::new();
    let tools = tempfile::tempdir().unwrap();
    let out = tools.path().join("perm.txt");
    std::fs::write(&out, "==PROF== Connected to process 4242 (/bin/cargo-kopt)\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters on the target device 0. For instructions on enabling permissions and to get more information see https://developer.nvidia.com/ERR_NVGPUCTRPERM\n").unwrap();
    let ncu = fake_ncu(tools.path(), &out, 1, None);
    let o = profile(
        &ws,
        true,
        &[
            "rmsnorm",
            "--ncu",
            ncu.to_str().unwrap(),
            "--no-cases",
            "--message-format",
            "json",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    let n = collector(&v, "ncu");
    assert_eq!(n["status"], "failed");
    let d = n["detail"].as_str().unwrap();
    assert!(d.starts_with("ncu: ERR_NVGPUCTRPERM"), "{d}");
    assert!(d.contains("run as root"), "{d}");
    assert_eq!(collector(&v, "engine")["status"], "ran");
    assert!(v["snapshot"]["classification"]["class"].is_string());
}

#[test]
fn a_metric_the_profiler_does_not_know_falls_back_to_the_sections() {
    let ws = ExampleWorkspace::new();
    let tools = tempfile::tempdir().unwrap();
    let ncu = fake_ncu(
        tools.path(),
        &capture("gqa_decode-shape0.csv"),
        0,
        Some(("--metrics", "==ERROR== Failed to find metric regex:^smsp__average_warp_latency_per_inst_issued.ratio$")),
    );
    let o = profile(
        &ws,
        true,
        &[
            "gqa_decode",
            "--ncu",
            ncu.to_str().unwrap(),
            "--no-cases",
            "--message-format",
            "json",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    let n = collector(&v, "ncu");
    assert_eq!(n["status"], "ran", "{n}");
    assert!(
        n["detail"]
            .as_str()
            .unwrap()
            .contains("collected by sections instead"),
        "{n}"
    );
    assert_eq!(v["snapshot"]["ncu_collection"], "sections");
    assert_eq!(v["snapshot"]["classification"]["class"], "latency-bound");
    let args = std::fs::read_to_string(tools.path().join("ncu-args.txt")).unwrap();
    assert_eq!(args.lines().count(), 2, "{args}");
    assert!(
        args.lines()
            .nth(1)
            .unwrap()
            .contains("--section SpeedOfLight --section Occupancy"),
        "{args}"
    );
    let dir = PathBuf::from(v["dir"].as_str().unwrap());
    assert!(dir.join("ncu-sections.csv").is_file());
    let commands = std::fs::read_to_string(dir.join("ncu-command.txt")).unwrap();
    assert_eq!(commands.lines().count(), 2);
}

#[test]
fn variants_shapes_and_the_case_library() {
    let ws = ExampleWorkspace::new();
    ws.pin_online_vec4(std::path::Path::new(env!("CARGO_BIN_EXE_cargo-kopt")));
    let o = profile(
        &ws,
        true,
        &[
            "softmax",
            "--variant",
            "online-vec4",
            "--shape",
            "2",
            "--no-ncu",
            "--message-format",
            "json",
        ],
        &[("KOPT_CASES", &ws.root.join("none.sqlite"))],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    assert_eq!(v["snapshot"]["version"], "online-vec4");
    assert_eq!(v["snapshot"]["shape"], "cols=1024 rows=32768");
    let note = v["snapshot"]["confidence"]["note"].as_str().unwrap();
    assert!(note.contains("no case library at"), "{note}");
    assert!(
        !ws.root.join("none.sqlite").exists(),
        "profile does not create a library"
    );

    // With a library holding past softmax cases, the confidence rests on them.
    let lib = ws.root.join("cases.sqlite");
    let imported = Command::new(exe())
        .args(["kopt", "cases", "import"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../kopt-store/tests/fixtures/cases.jsonl"))
        .env("KOPT_CASES", &lib)
        .output()
        .unwrap();
    assert!(imported.status.success(), "{}", text(&imported));
    let o = profile(
        &ws,
        true,
        &[
            "softmax",
            "--no-ncu",
            "--cases",
            lib.to_str().unwrap(),
            "--message-format",
            "json",
        ],
        &[],
    );
    let v = json(&o);
    let c = &v["snapshot"]["confidence"];
    assert_eq!(c["source"], "case-library", "{c}");
    assert!(
        c["cases"]
            .as_array()
            .unwrap()
            .iter()
            .any(|id| id.as_str().unwrap().contains("/softmax/")),
        "{c}"
    );

    let o = profile(&ws, true, &["softmax", "--variant", "nope"], &[]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("`softmax` has no accepted variant `nope` (accepted: online-vec4)"),
        "{err}"
    );
    let o = profile(&ws, true, &["softmax", "--shape", "rows=1"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("0: cols=4096 rows=4096"));
}

#[test]
fn the_oneshot_worker_writes_its_report_to_a_file_and_job_takes_a_label() {
    let ws = ExampleWorkspace::new();
    let job = |shape: &str| {
        Command::new(exe())
            .args([
                "kopt",
                "__job",
                "rmsnorm",
                "--shape",
                shape,
                "--manifest-path",
            ])
            .arg(ws.manifest())
            .output()
            .unwrap()
    };
    let by_index = job("1");
    let by_label = job("cols=8192 eps=1e-5 rows=64");
    assert!(by_index.status.success(), "{}", text(&by_index));
    assert_eq!(by_index.stdout, by_label.stdout);
    let path = ws.root.join("job.json");
    std::fs::write(&path, &by_index.stdout).unwrap();
    let report = ws.root.join("report.json");
    let o = Command::new(exe())
        .args(["kopt", "__worker", "--fake", "--oneshot"])
        .arg(&path)
        .arg("--report-file")
        .arg(&report)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(o.stdout.is_empty(), "stdout is left to the profiler");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(v["type"], "report");
    assert_eq!(
        v["report"]["shapes"][0]["label"],
        "cols=8192 eps=1e-5 rows=64"
    );
}
