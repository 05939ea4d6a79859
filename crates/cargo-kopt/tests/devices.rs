//! Several GPUs without a GPU: fake devices (`KOPT_FAKE_DEVICES`), the device pool's
//! scheduling, `optimize --devices`, `--partition` and `merge` from the command line.
//!
//! Every test of this file runs with `KOPT_FAKE_DEVICES=2` (set once, before any worker
//! starts), so that they can share the process.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Once;
use std::time::Duration;

use kopt_engine::engine::Engine;
use kopt_engine::job::{EvalJob, KernelVersion};
use kopt_engine::parent::WorkerCommand;
use kopt_engine::pool::{DevicePool, Scheduled};
use kopt_engine::verdict::Judge;
use kopt_loop::eval::{self, Settings};
use kopt_workspace::gather::{self, Gathered};
use serde_json::Value;

fn two_fake_devices() {
    static SET: Once = Once::new();
    SET.call_once(|| std::env::set_var("KOPT_FAKE_DEVICES", "2"));
}

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cargo-kopt"))
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/llm-kernels")
}

fn pool(dir: &Path, ordinals: &[usize]) -> DevicePool {
    DevicePool::new(
        ordinals
            .iter()
            .map(|&d| {
                let mut e = Engine::new(
                    WorkerCommand::fake_on(exe(), d),
                    None,
                    kopt_engine::ceilings::CeilingsCache::at(dir.join("ceilings.json")),
                );
                e.worker.step_timeout = Duration::from_secs(20);
                (d, e)
            })
            .collect(),
    )
}

/// Softmax candidates that each take `delay_ms` on the fake device, with different speedups.
fn jobs(g: &Gathered, delay_ms: u64) -> Vec<EvalJob> {
    let k = g.kernels.iter().find(|k| k.spec.name == "softmax").unwrap();
    ["1.1", "1.25", "0.9", "1.4"]
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut v = KernelVersion::reference(&k.spec, &k.reference.text);
            v.id = format!("c{i}");
            v.source = format!(
                "{}\n// kopt-fake: speedup {s}\n// kopt-fake: delay-ms {delay_ms}\n",
                k.reference.text
            );
            eval::job(g, k, v, None, &Settings::default(), true)
        })
        .collect()
}

/// Per shape: label, reference and candidate time.
type Figures = Vec<(String, Option<f64>, Option<f64>)>;

/// What a verdict says, without the device it was measured on.
fn outcome(report: &kopt_engine::engine::Evaluation) -> (bool, Figures) {
    let v = Judge::new(None).judge(&report.report);
    (
        v.accepted,
        v.shapes
            .iter()
            .map(|s| (s.shape.clone(), s.reference_us, s.candidate_us))
            .collect(),
    )
}

fn run_jobs(
    p: &mut DevicePool,
    jobs: &[EvalJob],
) -> Vec<Scheduled<(usize, kopt_engine::engine::Evaluation)>> {
    p.try_map(
        jobs,
        |slot, job| {
            let ev = slot.engine.evaluate(job, &mut |_| {});
            let ordinal = ev.report.as_ref().map(|r| r.device.ordinal).unwrap_or(99);
            Ok::<_, String>((ordinal, ev))
        },
        &mut |_| {},
    )
    .unwrap()
}

#[test]
fn two_fake_devices_run_jobs_in_parallel_with_the_results_of_one() {
    two_fake_devices();
    let dir = tempfile::tempdir().unwrap();
    let g = gather::gather_crate("llm-kernels", &example(), dir.path());
    let jobs = jobs(&g, 700);

    let mut two = pool(dir.path(), &[0, 1]);
    let devices = two.devices().unwrap();
    assert_eq!(
        devices.iter().map(|d| d.ordinal).collect::<Vec<_>>(),
        [0, 1]
    );
    assert_ne!(
        devices[0].uuid, devices[1].uuid,
        "two devices, two identities"
    );
    let parallel = run_jobs(&mut two, &jobs);
    for s in &parallel {
        assert_eq!(
            s.value.0, s.device,
            "each job's report comes from the worker of the device it was scheduled on"
        );
    }
    let used: std::collections::BTreeSet<usize> = parallel.iter().map(|s| s.device).collect();
    assert_eq!(used.into_iter().collect::<Vec<_>>(), [0, 1]);
    // Jobs on different devices overlap in time: the devices really run in parallel.
    let overlapping = parallel.iter().any(|a| {
        parallel
            .iter()
            .any(|b| a.device != b.device && a.started.max(b.started) < a.finished.min(b.finished))
    });
    assert!(
        overlapping,
        "no two jobs on different devices overlapped: {:?}",
        parallel
            .iter()
            .map(|s| (s.device, s.started, s.finished))
            .collect::<Vec<_>>()
    );

    let mut one = pool(dir.path(), &[0]);
    let sequential = run_jobs(&mut one, &jobs);
    assert!(sequential.iter().all(|s| s.device == 0));
    for w in sequential.windows(2) {
        assert!(
            w[0].finished <= w[1].started,
            "one device: one job at a time, in order"
        );
    }
    assert_eq!(
        parallel
            .iter()
            .map(|s| outcome(&s.value.1))
            .collect::<Vec<_>>(),
        sequential
            .iter()
            .map(|s| outcome(&s.value.1))
            .collect::<Vec<_>>(),
        "the same verdicts and figures, in the items' order"
    );
}

#[test]
fn after_a_failed_item_no_device_starts_another() {
    two_fake_devices();
    let dir = tempfile::tempdir().unwrap();
    let items: Vec<u32> = (0..20).collect();
    let mut p = pool(dir.path(), &[0, 1]);
    let started = std::sync::atomic::AtomicUsize::new(0);
    let r = p.try_map(
        &items,
        |_, &i| {
            started.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
            if i == 3 {
                Err(format!("item {i} failed"))
            } else {
                Ok(i)
            }
        },
        &mut |_| {},
    );
    assert_eq!(r.unwrap_err(), "item 3 failed");
    assert!(
        started.into_inner() < 10,
        "the devices stopped taking items after the failure"
    );
}

#[test]
fn a_fake_device_beyond_the_count_is_refused() {
    two_fake_devices();
    let dir = tempfile::tempdir().unwrap();
    let mut p = pool(dir.path(), &[2]);
    let e = p.devices().unwrap_err().to_string();
    assert!(
        e.contains("fake device 2 does not exist: KOPT_FAKE_DEVICES is 2"),
        "{e}"
    );
}

// --- the command line --------------------------------------------------------------------

fn cargo_kopt(ws: &kopt_tests::ExampleWorkspace, target: Option<&Path>, args: &[&str]) -> Output {
    two_fake_devices();
    let mut c = ws.kopt_on_fake(&exe(), args);
    c.env("NO_COLOR", "1");
    if let Some(t) = target {
        c.env("CARGO_TARGET_DIR", t);
    }
    c.output().unwrap()
}

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "{}", kopt_tests::text(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", kopt_tests::text(o)))
}

/// Makes every candidate of the scratch workspace 30% faster on the fake device: the
/// directive is in each reference source, so the heuristic agent's rewrites carry it (the
/// fake device applies `speedup` to the candidate only).
fn faster_candidates(ws: &kopt_tests::ExampleWorkspace) {
    for e in std::fs::read_dir(ws.krate.join("kernels"))
        .unwrap()
        .flatten()
    {
        if e.path().extension().is_some_and(|x| x == "cu") {
            let text = std::fs::read_to_string(e.path()).unwrap();
            std::fs::write(e.path(), format!("{text}\n// kopt-fake: speedup 1.3\n")).unwrap();
        }
    }
}

/// The pending variants' sources, by `package/kernel/arch`.
fn pending_sources(target: &Path) -> BTreeMap<String, String> {
    let kopt = kopt_store::KoptDir::new(target);
    kopt_store::pending::list(&kopt)
        .variants
        .into_iter()
        .map(|p| (p.label(), p.source))
        .collect()
}

#[test]
fn optimize_on_two_fake_devices_gives_what_one_device_gives() {
    let ws = kopt_tests::ExampleWorkspace::new();
    faster_candidates(&ws);
    let optimize = |target: &Path, run: &str, devices: Option<&str>| {
        let mut args = vec![
            "optimize",
            "softmax",
            "rmsnorm",
            "reduce_sum",
            "--no-ncu",
            "--budget",
            "rounds=1",
            "--run",
            run,
            "--message-format",
            "json",
        ];
        if let Some(d) = devices {
            args.extend(["--devices", d]);
        }
        json(&cargo_kopt(&ws, Some(target), &args))
    };
    let (one_t, two_t) = (ws.root.join("t-one"), ws.root.join("t-two"));
    let one = optimize(&one_t, "one", None);
    let two = optimize(&two_t, "two", Some("all"));
    let strip = |v: &Value| -> Vec<Value> {
        v["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| {
                let mut k = k.clone();
                k.as_object_mut().unwrap().remove("device");
                k
            })
            .collect()
    };
    assert_eq!(
        strip(&one),
        strip(&two),
        "the same results, kernel by kernel"
    );
    let devices = |v: &Value| -> Vec<u64> {
        v["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["device"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(devices(&one), [0, 0, 0]);
    assert!(
        devices(&two).contains(&0) && devices(&two).contains(&1),
        "both devices took kernels: {:?}",
        devices(&two)
    );
    let pending = pending_sources(&one_t);
    assert_eq!(
        pending.len(),
        3,
        "the heuristic's winners are pending: {one}"
    );
    assert_eq!(
        pending,
        pending_sources(&two_t),
        "the same pending variants"
    );

    // Ordinals are checked against what exists, and --device and --devices exclude each other.
    let o = cargo_kopt(&ws, None, &["optimize", "softmax", "--devices", "0,5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("GPU 5 does not exist: this machine has 2"),
        "{}",
        kopt_tests::text(&o)
    );
    let o = cargo_kopt(
        &ws,
        None,
        &["optimize", "softmax", "--devices", "all", "--device", "1"],
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot be used with"));
}

#[test]
fn verify_on_two_fake_devices_gives_what_one_device_gives() {
    let ws = kopt_tests::ExampleWorkspace::new();
    let verify = |devices: Option<&str>| {
        let mut args = vec!["verify", "--no-cache", "--message-format", "json"];
        if let Some(d) = devices {
            args.extend(["--devices", d]);
        }
        json(&cargo_kopt(&ws, None, &args))
    };
    let (one, two) = (verify(None), verify(Some("all")));
    let strip = |v: &Value| -> Vec<Value> {
        v["variants"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                let mut o = o.clone();
                o.as_object_mut().unwrap().remove("gpu");
                o
            })
            .collect()
    };
    assert!(strip(&one).len() >= 8, "every committed variant: {one}");
    assert_eq!(strip(&one), strip(&two), "the same verdicts, in lock order");
    assert_eq!(one["ok"], true, "{one}");
    assert_eq!(two["ok"], true);
    assert_eq!(two["devices"].as_array().unwrap().len(), 2);
    let gpus = |v: &Value| -> Vec<u64> {
        v["variants"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|o| o["gpu"].as_u64())
            .collect()
    };
    assert!(gpus(&one).iter().all(|g| *g == 0), "{:?}", gpus(&one));
    assert!(
        gpus(&two).contains(&0) && gpus(&two).contains(&1),
        "both devices took variants: {:?}",
        gpus(&two)
    );
    // People read which GPU verified what.
    let o = cargo_kopt(
        &ws,
        None,
        &["verify", "--no-cache", "--devices", "0,1", "softmax"],
    );
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("GPU 0: kopt fake GPU") && out.contains("GPU 1: kopt fake GPU"),
        "{out}"
    );
    assert!(out.contains(") on GPU "), "{out}");
}

#[test]
fn partitioned_runs_merge_back_into_one_pending_area() {
    let ws = kopt_tests::ExampleWorkspace::new();
    faster_candidates(&ws);
    // list: the parts cover the workspace, once each.
    let names = |v: serde_json::Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|k| k["kernel"].as_str().unwrap().to_string())
            .collect()
    };
    let mut every = names(json(&cargo_kopt(
        &ws,
        None,
        &["list", "--message-format", "json"],
    )));
    every.sort();
    assert!(every.len() >= 5, "{every:?}");
    let mut seen = Vec::new();
    for m in 1..=2 {
        let part = format!("hash:{m}/2");
        let v = json(&cargo_kopt(
            &ws,
            None,
            &["list", "--partition", &part, "--message-format", "json"],
        ));
        seen.extend(names(v));
    }
    seen.sort();
    assert_eq!(seen, every);
    let o = cargo_kopt(&ws, None, &["list", "--partition", "slice:3/2"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("part 3 does not exist"),
        "{}",
        kopt_tests::text(&o)
    );

    // Two "machines" (two target folders), one part each, then merged here.
    let mut parts = Vec::new();
    for m in 1..=2 {
        let target = ws.root.join(format!("machine-{m}"));
        let part = format!("slice:{m}/2");
        let run = format!("part-{m}");
        let v = json(&cargo_kopt(
            &ws,
            Some(&target),
            &[
                "optimize",
                "--partition",
                &part,
                "--no-ncu",
                "--budget",
                "rounds=1",
                "--run",
                &run,
                "--message-format",
                "json",
            ],
        ));
        let kernels: Vec<String> = v["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["kernel"].as_str().unwrap().to_string())
            .collect();
        assert!(!kernels.is_empty(), "part {m} has kernels");
        parts.push((target, kernels));
    }
    let all: Vec<&String> = parts.iter().flat_map(|(_, k)| k).collect();
    assert_eq!(
        all.len(),
        every.len(),
        "every kernel optimised once: {all:?}"
    );
    let expected: BTreeMap<String, String> =
        parts.iter().flat_map(|(t, _)| pending_sources(t)).collect();
    assert!(!expected.is_empty());
    let dirs: Vec<String> = parts.iter().map(|(t, _)| t.display().to_string()).collect();
    let o = cargo_kopt(&ws, None, &["merge", &dirs[0], &dirs[1]]);
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&format!("{} pending variant(s) merged", expected.len())),
        "{text}"
    );
    assert_eq!(pending_sources(&ws.root.join("target")), expected);
    assert!(ws
        .root
        .join("target/kopt/runs/part-1/journal.jsonl")
        .is_file());
    // Merging again changes nothing; a folder without anything to merge is refused.
    let v = json(&cargo_kopt(
        &ws,
        None,
        &["merge", &dirs[0], &dirs[1], "--message-format", "json"],
    ));
    assert_eq!(v["pending"]["added"].as_array().unwrap().len(), 0);
    let o = cargo_kopt(&ws, None, &["merge", &ws.krate.display().to_string()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("holds neither pending variants"));
}
