//! The evaluation engine against the fake worker: a real worker process speaking the real
//! protocol, with a fake device whose behaviour the candidate's source directs.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kopt_engine::engine::Engine;
use kopt_engine::job::{EvalJob, KernelVersion, TimingPolicy};
use kopt_engine::parent::{WorkerCommand, WorkerFailure};
use kopt_engine::verdict::{Fence, Judge, Verdict};
use kopt_loop::eval::{self, Settings};
use kopt_workspace::gather::{self, Gathered};

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cargo-kopt"))
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/llm-kernels")
}

struct Fixture {
    _dir: tempfile::TempDir,
    g: Gathered,
    engine: Engine,
}

fn fixture(cache: bool) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let g = gather::gather_crate("llm-kernels", &example(), dir.path());
    let mut engine = Engine::new(
        WorkerCommand::fake(exe()),
        cache.then(|| dir.path().join("cache")),
        kopt_engine::ceilings::CeilingsCache::at(dir.path().join("ceilings.json")),
    );
    engine.worker.step_timeout = Duration::from_secs(2);
    Fixture {
        _dir: dir,
        g,
        engine,
    }
}

/// The softmax reference with fake directives appended.
fn candidate(f: &Fixture, directives: &str) -> EvalJob {
    let k =
        f.g.kernels
            .iter()
            .find(|k| k.spec.name == "softmax")
            .unwrap();
    let mut v = KernelVersion::reference(&k.spec, &k.reference.text);
    v.id = "candidate".into();
    v.source = format!("{}\n{directives}\n", k.reference.text);
    eval::job(&f.g, k, v, None, &Settings::default(), true)
}

/// The softmax job on its first declared shape alone: the reference's source with
/// `reference` directives appended, the candidate the reference's text with `candidate`.
fn slow_job(f: &Fixture, reference: &str, candidate: &str, timed: bool) -> EvalJob {
    let k =
        f.g.kernels
            .iter()
            .find(|k| k.spec.name == "softmax")
            .unwrap();
    let mut v = KernelVersion::reference(&k.spec, &k.reference.text);
    v.id = "candidate".into();
    v.source = format!("{}\n{candidate}\n", k.reference.text);
    let mut job = eval::job(&f.g, k, v, None, &Settings::default(), timed);
    job.reference.source = format!("{}\n{reference}\n", job.reference.source);
    job.shapes.retain(|s| !s.held_out);
    job.shapes.truncate(1);
    job
}

fn judge(f: &mut Fixture, job: &EvalJob) -> Verdict {
    let ceilings = f.engine.ceilings(false).unwrap();
    let ev = f.engine.evaluate(job, &mut |_| {});
    Judge::new(Some(ceilings)).judge(&ev.report)
}

fn check(f: &mut Fixture, directives: &str) -> Verdict {
    let job = candidate(f, directives);
    judge(f, &job)
}

#[test]
fn a_plain_candidate_is_accepted_with_figures_and_held_out_shapes() {
    let mut f = fixture(false);
    let job = candidate(&f, "");
    assert!(
        job.shapes.iter().any(|s| s.held_out),
        "held-out shapes are added"
    );
    assert!(job.shapes.iter().filter(|s| !s.held_out).count() == 4);
    let v = judge(&mut f, &job);
    assert!(v.accepted, "{}", v.summary());
    let declared = v.shapes.iter().find(|s| !s.held_out).unwrap();
    assert!(declared.speedup.is_some() && declared.copy_bandwidth_pct.is_some());
    assert!(
        v.shapes
            .iter()
            .filter(|s| s.held_out)
            .all(|s| s.candidate_us.is_none()),
        "held-out shapes are checked, not timed"
    );
}

/// A launch whose clusters the device cannot hold at once is accepted (it is correct) but
/// noted per declared shape: the rest of its grid waits for a second wave of clusters.
#[test]
fn clusters_beyond_what_the_device_holds_at_once_are_noted() {
    let mut f = fixture(false);
    let mut job = candidate(&f, "// kopt-fake: max-active-clusters 16");
    let k =
        f.g.kernels
            .iter()
            .find(|k| k.spec.name == "softmax")
            .unwrap();
    let names = k.spec.int_names();
    let kinds = |n: &str| k.spec.var_kind_with(n, &[]);
    let parse =
        |t: &str| kopt_spec::expr::parse_str(t, kopt_spec::expr::Ty::Int, &kinds, &names).unwrap();
    // grid = rows: clusters of 4 blocks wherever the rows allow.
    job.candidate.launch.cluster = Some([
        parse("if rows % 4 == 0 { 4 } else { 1 }"),
        parse("1"),
        parse("1"),
    ]);
    let v = judge(&mut f, &job);
    assert!(v.accepted, "{}", v.summary());
    let notes: Vec<&String> = v
        .notes
        .iter()
        .filter(|n| n.contains("waves of clusters"))
        .collect();
    // 4096 and 32768 rows: 1024 and 8192 clusters; 16 and 8 rows: 4 and 2, which fit.
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(
        notes.iter().any(|n| n.as_str()
            == "cols=1024 rows=32768: 8192 clusters of 4 blocks, of which the device holds 16 at once: 512.00 waves of clusters"),
        "{notes:?}"
    );
    // Without a cluster the figure is not asked for, and nothing is noted.
    let plain = check(&mut f, "// kopt-fake: max-active-clusters 16");
    assert!(
        !plain.notes.iter().any(|n| n.contains("clusters")),
        "{:?}",
        plain.notes
    );
}

#[test]
fn each_fence_rejects_its_failure() {
    let mut f = fixture(false);
    let cases: &[(&str, Fence, &str)] = &[
        (
            "// kopt-fake: compile-error expected a ';'",
            Fence::Compile,
            "error: expected a ';'",
        ),
        (
            "// kopt-fake: wrong y 7",
            Fence::Numerics,
            "first at index 7",
        ),
        ("// kopt-fake: nan y", Fence::Numerics, "NaN/Inf"),
        (
            "// kopt-fake: wrong-held-out y",
            Fence::HeldOut,
            "(held out: ",
        ),
        (
            "// kopt-fake: wrong-after-timing",
            Fence::AfterTiming,
            "AfterTiming",
        ),
        (
            "// kopt-fake: modifies-input x",
            Fence::InputModified,
            "input `x` was written",
        ),
        (
            "// kopt-fake: slower-on rows=16 1.5",
            Fence::Watchdog,
            "threshold 3%",
        ),
        (
            "// kopt-fake: speedup 100",
            Fence::Roofline,
            "measurement error",
        ),
        (
            "// kopt-fake: fault",
            Fence::Fault,
            "CUDA_ERROR_ILLEGAL_ADDRESS",
        ),
        ("// kopt-fake: hang", Fence::Hang, "never finished"),
        ("// kopt-fake: crash", Fence::Crash, "signal"),
    ];
    for (directive, fence, text) in cases {
        let v = check(&mut f, directive);
        assert!(!v.accepted, "{directive} passed");
        let hit = v.failures.iter().find(|x| x.fence == *fence);
        assert!(
            hit.is_some_and(
                |x| x.message.contains(text) || x.shape.as_deref().unwrap_or("").contains(text)
            ),
            "{directive}: expected {fence:?} with {text:?}, got {:#?}",
            v.failures
        );
    }
    let v = check(&mut f, "");
    assert!(
        v.accepted,
        "the engine goes on after failures: {}",
        v.summary()
    );
    // The fault, the hang and the crash each cost a worker; fresh ones were started.
    assert_eq!(f.engine.worker.starts, 4, "1 + 3 restarts");
}

/// Kernels of microseconds are timed as they always were: the policy's graph (at least 32
/// launches) and its minimum of 15 samples, and the plan says it is the policy's.
#[test]
fn fast_kernels_keep_the_policys_graph_and_samples() {
    let mut f = fixture(false);
    let job = candidate(&f, "");
    let report = f.engine.evaluate(&job, &mut |_| {}).report.unwrap();
    let policy = TimingPolicy::default();
    let declared: Vec<_> = report.shapes.iter().filter(|s| !s.held_out).collect();
    assert_eq!(declared.len(), 4);
    for s in declared {
        for l in [&s.reference, &s.candidate] {
            let l = l.as_ref().unwrap();
            let (t, p) = (l.timing.as_ref().unwrap(), l.timing_plan.as_ref().unwrap());
            assert!(!p.per_launch && !p.scaled, "{}: {p:?}", s.label);
            assert!(p.graph_launches >= policy.min_graph_launches, "{p:?}");
            assert_eq!((p.min_samples, t.samples), (15, 15), "{}", s.label);
            assert_eq!(p.warmup, policy.warmup);
            assert_eq!(
                t.method,
                format!(
                    "graph of {} launches over 1 input set(s), L2 cold",
                    p.graph_launches
                )
            );
        }
    }
}

/// A reference of 400 ms a launch (device time; 120 ms of real time on the fake device)
/// timed against itself, as `cargo kopt bench` times a kernel without variants: launch by
/// launch, 5 samples, its time stated. Its sample rounds (two launches, 240 ms) outlast
/// the step timeout of 150 ms, and it is not called a hang: the worker announces each
/// round with the time the reference's launch predicts, and the parent waits ten times
/// that.
#[test]
fn a_slow_reference_is_measured_launch_by_launch_not_called_a_hang() {
    let mut f = fixture(false);
    f.engine.worker.step_timeout = Duration::from_millis(150);
    let slow = "// kopt-fake: launch-ms 400\n// kopt-fake: real-time 0.3";
    let job = slow_job(&f, slow, slow, true);
    let mut seen: Vec<(Instant, String)> = Vec::new();
    let t0 = Instant::now();
    let ev = f
        .engine
        .evaluate(&job, &mut |s| seen.push((Instant::now(), s.to_string())));
    let wall = t0.elapsed();
    let report = ev.report.as_ref().unwrap_or_else(|e| panic!("{e}"));
    let shape = &report.shapes[0];
    for (who, l) in [
        ("reference", &shape.reference),
        ("candidate", &shape.candidate),
    ] {
        let l = l.as_ref().unwrap();
        let (t, p) = (l.timing.as_ref().unwrap(), l.timing_plan.as_ref().unwrap());
        assert!(p.per_launch && p.scaled, "{who}: {p:?}");
        assert_eq!((t.samples, t.launches_per_sample), (5, 1), "{who}: {t:?}");
        assert_eq!(t.median_us, 400_000.0, "{who}");
        assert!(
            t.method
                .starts_with("each launch timed alone between events"),
            "{who}: {}",
            t.method
        );
    }
    assert!(
        seen.iter().any(|(_, s)| s.ends_with("timing (sample 5)")),
        "{:?}",
        seen.iter().map(|(_, s)| s).collect::<Vec<_>>()
    );
    let longest = seen.windows(2).map(|w| w[1].0 - w[0].0).max().unwrap();
    assert!(
        longest > Duration::from_millis(150),
        "no step outlasted the step timeout ({longest:?}): the test proves nothing"
    );
    let v = Judge::new(None).judge(&ev.report);
    assert!(v.accepted, "{}", v.summary());
    assert!(
        v.notes.iter().any(|n| n.contains(
            "reference and candidate timed launch by launch, 5 samples (a launch takes 400.0 ms"
        )),
        "{:?}",
        v.notes
    );
    assert_eq!(v.shapes[0].candidate_us, Some(400_000.0));
    assert!(v.shapes[0].timing_plan.as_ref().unwrap().per_launch);
    assert!(wall < Duration::from_secs(15), "{wall:?}");
}

/// Against a reference of 400 ms (100 ms of real time), a candidate that never finishes,
/// and one twenty times slower, are killed at their first launch once it has taken ten
/// times the reference's launch (1 s), not before, though the step timeout is 150 ms.
#[test]
fn a_candidate_far_slower_than_a_slow_reference_is_killed_at_ten_times_its_launch() {
    let reference = "// kopt-fake: launch-ms 400\n// kopt-fake: real-time 0.25";
    for (candidate, what) in [
        ("// kopt-fake: hang", "never finishes"),
        ("// kopt-fake: launch-ms 8000", "20 times slower"),
    ] {
        let mut f = fixture(false);
        f.engine.worker.step_timeout = Duration::from_millis(150);
        let job = slow_job(&f, reference, candidate, true);
        let t0 = Instant::now();
        let ev = f.engine.evaluate(&job, &mut |_| {});
        let wall = t0.elapsed();
        match &ev.report {
            Err(WorkerFailure::Hang {
                step,
                seconds,
                expected_s,
            }) => {
                assert!(
                    step.ends_with("check (declared): candidate"),
                    "{what}: {step}"
                );
                let e = expected_s.expect("the step's expected duration");
                assert!((e - 0.1).abs() < 1e-9, "{what}: {e}");
                assert!((seconds - 1.0).abs() < 1e-6, "{what}: {seconds}");
            }
            other => panic!("{what}: {other:?}"),
        }
        assert!(
            wall >= Duration::from_secs(1) && wall < Duration::from_secs(6),
            "{what}: {wall:?}"
        );
        let v = Judge::new(None).judge(&ev.report);
        assert_eq!(v.fences(), vec![Fence::Hang], "{what}");
        assert!(
            v.summary().contains("the limit is 10 times that"),
            "{what}: {}",
            v.summary()
        );
    }
}

/// A candidate three times slower than a reference of 100 ms (real time) takes longer than
/// the step timeout of 200 ms at every launch, and is still checked: its launches may take
/// ten times the reference's.
#[test]
fn a_candidate_slower_than_the_step_timeout_is_given_ten_times_the_references_launch() {
    let mut f = fixture(false);
    f.engine.worker.step_timeout = Duration::from_millis(200);
    let job = slow_job(
        &f,
        "// kopt-fake: launch-ms 400\n// kopt-fake: real-time 0.25",
        "// kopt-fake: launch-ms 1200",
        false,
    );
    let v = judge(&mut f, &job);
    assert!(v.accepted, "{}", v.summary());
}

#[test]
fn the_compile_log_comes_back_verbatim_with_line_numbers() {
    let mut f = fixture(false);
    let v = check(
        &mut f,
        "// kopt-fake: compile-error identifier \"foo\" is undefined",
    );
    assert!(
        v.compile_log.contains("kernel.cu(")
            && v.compile_log.contains("identifier \"foo\" is undefined"),
        "{}",
        v.compile_log
    );
}

#[test]
fn wins_are_reported_per_shape_for_a_region() {
    let mut f = fixture(false);
    let v = check(&mut f, "// kopt-fake: speedup 1.25");
    assert!(v.accepted, "{}", v.summary());
    assert_eq!(v.wins.len(), 4, "{:?}", v.wins);
    let v = check(
        &mut f,
        "// kopt-fake: speedup 1.25\n// kopt-fake: slower-on rows=8 1.2",
    );
    assert!(v.failures.iter().all(|x| x.fence == Fence::Watchdog));
    assert_eq!(v.wins.len(), 3, "the slow shape is not a win: {:?}", v.wins);
}

#[test]
fn unchanged_candidates_come_from_the_cache() {
    let mut f = fixture(true);
    let job = candidate(&f, "// kopt-fake: speedup 1.1");
    assert!(!f.engine.evaluate(&job, &mut |_| {}).cached);
    assert!(f.engine.evaluate(&job, &mut |_| {}).cached);
    let changed = candidate(&f, "// kopt-fake: speedup 1.2");
    assert!(
        !f.engine.evaluate(&changed, &mut |_| {}).cached,
        "a changed source is measured"
    );
}

#[test]
fn a_compile_failure_is_never_served_from_the_cache() {
    // Fixed outside the key's reach (a header installed): it must compile again.
    let mut f = fixture(true);
    let job = candidate(
        &f,
        "// kopt-fake: compile-error cannot open source file \"cuda/std/type_traits\"",
    );
    let first = f.engine.evaluate(&job, &mut |_| {});
    assert!(!first.cached);
    assert!(!first.report.as_ref().unwrap().candidate.ok);
    let again = f.engine.evaluate(&job, &mut |_| {});
    assert!(!again.cached, "a cached compile failure was served");
}

#[test]
fn the_worker_refuses_another_protocol_version() {
    let mut child = Command::new(exe())
        .args(["kopt", "__worker", "--fake"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(
        child.stdin.as_mut().unwrap(),
        r#"{{"type":"hello","version":99}}"#
    )
    .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.contains("\"type\":\"error\"") && line.contains("protocol 99"),
        "{line}"
    );
    assert_eq!(child.wait().unwrap().code(), Some(2));
}

#[test]
fn malformed_requests_get_an_error_and_the_worker_goes_on() {
    let mut child = Command::new(exe())
        .args(["kopt", "__worker", "--fake"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.as_mut().unwrap();
    writeln!(stdin, "{{ not json").unwrap();
    writeln!(
        stdin,
        r#"{{"type":"hello","version":{}}}"#,
        kopt_engine::protocol::PROTOCOL_VERSION
    )
    .unwrap();
    writeln!(stdin, r#"{{"type":"shutdown"}}"#).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    assert!(lines.next().unwrap().contains("bad request"));
    assert!(lines.next().unwrap().contains("\"type\":\"hello\""));
    assert!(out.status.success());
}

#[test]
fn verify_and_bench_commands_on_the_fake_device() {
    let ws = kopt_tests::ExampleWorkspace::new();
    let run = |args: &[&str]| {
        Command::new(exe())
            .arg("kopt")
            .args(args)
            .arg("--manifest-path")
            .arg(ws.manifest())
            .env("KOPT_WORKER", "fake")
            .env("KOPT_CACHE_DIR", ws.root.join("cache"))
            .output()
            .unwrap()
    };
    // softmax's hand-written online-vec4, pinned with its region, is the variant under test.
    ws.pin_online_vec4(&exe());
    let o = run(&["verify", "softmax", "--message-format", "json"]);
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["variants"][0]["variant"], "online-vec4");
    let shapes = v["variants"][0]["verdict"]["shapes"].as_array().unwrap();
    assert!(
        shapes
            .iter()
            .all(|s| s["shape"].as_str().unwrap().contains("cols=")),
        "only shapes inside the region `cols % 4 == 0`"
    );
    assert!(
        !shapes.iter().any(|s| s["shape"] == "cols=50257 rows=8"),
        "50257 is outside the region"
    );

    let o = run(&["bench"]);
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for needle in [
        "reference µs",
        "active µs",
        "% copy bw",
        "% same-size copy",
        "online-vec4",
        "gqa_decode",
    ] {
        assert!(out.contains(needle), "{needle} missing in\n{out}");
    }

    // Each shape is also measured against a one-launch copy of its bytes, timed by the
    // worker (the fake device's copy: 4000 GB/s plus 2 µs).
    let o = run(&["bench", "--message-format", "json"]);
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let b: kopt_report::BenchFile = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        b.same_size_copy
            .as_deref()
            .unwrap()
            .contains("one-launch copy"),
        "{:?}",
        b.same_size_copy
    );
    for r in &b.rows {
        let bytes = r.bytes.expect("every measured row has its bytes") as f64;
        let copy = r.same_size_copy_us.unwrap();
        assert!((copy - (bytes / 4000e3 + 2.0)).abs() < 1e-6, "{r:?}");
        let pct = r.same_size_copy_pct.unwrap();
        assert!(
            (pct - 100.0 * copy / r.active_us.unwrap()).abs() < 1e-9,
            "{r:?}"
        );
    }

    // A corrupted variant is not verified: the build would not use it, and check says so.
    let src = "kopt/softmax/online-vec4/kernel.cu";
    ws.write(src, &format!("{}// kopt-fake: wrong y 3\n", ws.read(src)));
    let o = run(&["verify", "softmax", "--message-format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["variants"].as_array().unwrap().len(),
        0,
        "corrupt variants are not usable"
    );
}

/// `cargo kopt bench` of a kernel of 412.3 ms a launch (the fake device's time) states the
/// time in milliseconds and how it was taken.
#[test]
fn bench_states_the_time_of_a_slow_kernel_and_how_it_was_timed() {
    let ws = kopt_tests::ExampleWorkspace::new();
    let src = "kernels/softmax.cu";
    ws.write(
        src,
        &format!("{}// kopt-fake: launch-ms 412.3\n", ws.read(src)),
    );
    let o = ws
        .kopt_on_fake(&exe(), &["bench", "softmax"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("412.3 ms"), "{out}");
    assert!(
        out.contains(
            "timing: median per launch (each launch timed alone between events over 1 input set(s), L2 cold)"
        ),
        "{out}"
    );
    let o = ws
        .kopt_on_fake(&exe(), &["bench", "softmax", "--message-format", "json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let b: kopt_report::BenchFile = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(b.rows.len(), 4);
    for r in &b.rows {
        assert_eq!(r.active, "reference");
        assert!((r.active_us.unwrap() - 412_300.0).abs() < 1e-6, "{r:?}");
        assert!(r.problem.is_none(), "{r:?}");
    }
}

#[test]
fn without_a_gpu_the_commands_say_so_in_one_line() {
    if kopt::gpu::missing().is_none() {
        return; // this machine has a GPU: nothing to show
    }
    let o = Command::new(exe())
        .args(["kopt", "bench"])
        .env_remove("KOPT_WORKER")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("no CUDA driver found"), "{err}");
}
