//! `cargo kopt search` and `search-bench` end to end on the fake device: a scratch copy of
//! the example crate whose `row_sum` source carries a fake timing model.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kopt_tests::{text, ExampleWorkspace};
use serde_json::Value;

/// The fake device's timing model of `row_sum` (factors on the reference's time): the
/// optimum is BLOCK=1024 VEC=8 ROWS_PER_BLOCK=1 UNROLL=4 at 0.8 x 0.6 x 0.8 x 0.9.
const MODEL: &str = "
// kopt-fake: time-table BLOCK=32:3 BLOCK=64:2 BLOCK=128:1.4 BLOCK=512:0.9 BLOCK=1024:0.8
// kopt-fake: time-table VEC=2:0.8 VEC=4:0.65 VEC=8:0.6 UNROLL=2:0.9 UNROLL=4:0.8
// kopt-fake: time-table ROWS_PER_BLOCK=2:1.1 ROWS_PER_BLOCK=4:1.3 ROWS_PER_BLOCK=8:1.6
// kopt-fake: time-table BLOCK=1024&VEC=8&UNROLL=4:0.9 --use_fast_math:0.9
// kopt-fake: wrong-if --use_fast_math y
";
const OPTIMUM: &str = "BLOCK=1024 VEC=8 ROWS_PER_BLOCK=1 UNROLL=4";
const OPTIMUM_COST: f64 = 0.8 * 0.6 * 0.8 * 0.9;

struct Ws {
    ws: ExampleWorkspace,
    target: PathBuf,
}

fn ws(extra: &str) -> Ws {
    let ws = ExampleWorkspace::new();
    let src = "kernels/row_sum.cu";
    ws.write(src, &format!("{}{MODEL}{extra}", ws.read(src)));
    let target = ws.root.join("target");
    Ws { ws, target }
}

impl Ws {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cargo-kopt"));
        c.arg("kopt")
            .args(args)
            .arg("--manifest-path")
            .arg(self.ws.manifest())
            .env("KOPT_WORKER", "fake")
            .env("CARGO_TARGET_DIR", &self.target)
            .env("KOPT_CACHE_DIR", self.ws.root.join("cache"));
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["--message-format", "json"]);
        let o = self.run(&a);
        assert!(o.status.success(), "{}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)))
    }

    /// `cargo kopt search row_sum ARGS`, in JSON; it must succeed.
    fn search_row_sum(&self, args: &[&str]) -> Value {
        self.json(&[&["search", "row_sum"], args].concat())
    }

    /// The human rendering of a command that must succeed.
    fn human(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn runs(&self) -> PathBuf {
        self.target.join("kopt/runs")
    }
}

/// The labels of a run's `candidate` events, in order.
fn candidates(journal: &Path) -> Vec<String> {
    std::fs::read_to_string(journal)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == "candidate")
        .map(|v| v["candidate"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn exhaustive_search_finds_the_models_optimum_and_verifies_it() {
    let w = ws("");
    let v = w.search_row_sum(&["--strategy", "exhaustive", "--options", "none", "--save"]);
    assert_eq!(v["space"]["valid"], 216);
    assert_eq!(v["space"]["raw"], 288);
    assert_eq!(v["evaluations"], 216);
    assert_eq!(v["stop"], "space exhausted");
    let best = &v["best"];
    assert_eq!(best["label"], OPTIMUM);
    let speedup = best["speedup"].as_f64().unwrap();
    assert!((speedup - 1.0 / OPTIMUM_COST).abs() < 0.02, "{speedup}");
    assert_eq!(
        v["best_verified"]["accepted"], true,
        "{}",
        v["best_verified"]
    );
    assert!(
        v["best_verified"]["shapes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["held_out"] == true),
        "the full verification includes held-out shapes"
    );
    let per_shape = v["per_shape"].as_array().unwrap();
    assert_eq!(per_shape.len(), 2);
    assert!(per_shape
        .iter()
        .all(|s| s["label"] == OPTIMUM && s["verified"] == "accepted"));
    let board = v["leaderboard"].as_array().unwrap();
    assert_eq!(board.len(), 10);
    let costs: Vec<f64> = board.iter().map(|p| p["cost"].as_f64().unwrap()).collect();
    assert!(costs.windows(2).all(|w| w[0] <= w[1]), "{costs:?}");
    // The journal has a candidate and a verdict per point, and the end.
    let journal = PathBuf::from(v["journal"].as_str().unwrap()).join("journal.jsonl");
    assert_eq!(candidates(&journal).len(), 216);
    let text = std::fs::read_to_string(&journal).unwrap();
    assert!(text.lines().last().unwrap().contains("run_finished"));
    // `--save`: the verified winner waits for review, its rationale naming the changes.
    assert_eq!(
        v["pending"], "llm-kernels/row_sum/sm_90",
        "{}",
        v["pending"]
    );
    let pending = w.json(&["pending"]);
    let row = &pending["pending"][0];
    // It waits for review, but was measured on the fake device: it can never be accepted.
    assert_eq!(row["status"], "fake-device", "{pending}");
    assert!(
        row["reason"]
            .as_str()
            .is_some_and(|r| r.contains("measured on kopt's fake device")),
        "{pending}"
    );
    let rationale =
        std::fs::read_to_string(Path::new(row["dir"].as_str().unwrap()).join("rationale.json"))
            .unwrap();
    assert!(rationale.contains("`VEC` 1 -> 8"), "{rationale}");

    // The human rendering: best per shape, the leaderboard, how to resume.
    let out = w.human(&[
        "search",
        "row_sum",
        "--strategy",
        "hill",
        "--seeded",
        "--options",
        "none",
        "--budget-evals",
        "12",
    ]);
    for needle in [
        "best configuration",
        "seed matrix (heuristic",
        "VEC",
        "--resume",
        "evaluations/s",
    ] {
        assert!(out.contains(needle), "{needle} missing in\n{out}");
    }
}

#[test]
fn fast_math_is_offered_then_dropped_when_it_breaks_the_tolerance() {
    let w = ws("");
    let v = w.search_row_sum(&[
        "--strategy",
        "exhaustive",
        "--budget-evals",
        "60",
        "--no-verify",
    ]);
    assert_eq!(
        v["space"]["valid"], 3744,
        "216 define combinations x fast math x vectorizer x register caps that fit"
    );
    let dropped = v["dropped"].as_array().unwrap();
    assert_eq!(dropped.len(), 1, "{v}");
    assert!(dropped[0]
        .as_str()
        .unwrap()
        .contains("--use_fast_math dropped"));
    assert_eq!(
        v["failures"], 1,
        "one fast-math point failed, none after it"
    );
    let journal = PathBuf::from(v["journal"].as_str().unwrap()).join("journal.jsonl");
    let fm: Vec<String> = candidates(&journal)
        .into_iter()
        .filter(|c| c.contains("fast-math"))
        .collect();
    assert_eq!(fm.len(), 1, "{fm:?}");
    assert!(!v["best"]["label"].as_str().unwrap().contains("fast-math"));
}

#[test]
fn a_killed_search_resumes_from_its_journal() {
    let w = ws("// kopt-fake: delay-ms 40\n");
    let args = [
        "search",
        "row_sum",
        "--strategy",
        "hill",
        "--seeded",
        "--options",
        "none",
        "--budget-evals",
        "30",
        "--seed",
        "3",
        "--no-verify",
    ];
    let mut child = w
        .cmd(&args)
        .arg("--message-format")
        .arg("json")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once a few points are in the journal.
    let t = Instant::now();
    let journal = loop {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the run never wrote 8 points"
        );
        let found = std::fs::read_dir(w.runs()).ok().and_then(|d| {
            d.flatten()
                .map(|e| e.path().join("journal.jsonl"))
                .find(|p| p.exists())
        });
        if let Some(j) = found {
            if candidates(&j).len() >= 8 {
                break j;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    let before = candidates(&journal);
    assert!(before.len() >= 8 && before.len() < 30, "{}", before.len());
    let run_id = journal
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();

    // A different command cannot resume it.
    let o = w.run(&[
        "search",
        "row_sum",
        "--strategy",
        "random",
        "--seeded",
        "--options",
        "none",
        "--seed",
        "3",
        "--resume",
        &run_id,
    ]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("strategy: the run has hill, this command random"),
        "{}",
        text(&o)
    );

    let mut resume = args.to_vec();
    resume.extend(["--resume", run_id.as_str()]);
    let v = w.json(&resume);
    assert_eq!(v["evaluations"], 30);
    assert_eq!(v["replayed"].as_u64().unwrap() as usize, before.len());
    let after = candidates(&journal);
    assert_eq!(after.len(), 30);
    let mut uniq = after.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), 30, "no point evaluated twice: {after:?}");
    assert_eq!(&after[..before.len()], &before[..]);

    // The same search without the interruption: the same points, the same best.
    let full = w.json(&args);
    let full_journal = PathBuf::from(full["journal"].as_str().unwrap()).join("journal.jsonl");
    assert_eq!(candidates(&full_journal), after);
    assert_eq!(full["best"]["label"], v["best"]["label"]);
}

/// Three points of a hill climb over row_sum seeded by `flag FILE`, unverified.
fn seeded_hill_search<'a>(flag: &'a str, file: &'a Path) -> Vec<&'a str> {
    vec![
        "search",
        "row_sum",
        "--strategy",
        "hill",
        "--options",
        "none",
        "--budget-evals",
        "3",
        "--no-verify",
        flag,
        file.to_str().unwrap(),
    ]
}

#[test]
fn agent_matrices_seed_the_search_and_bad_ones_are_refused() {
    let w = ws("");
    let m = w.ws.root.join("matrix.json");
    std::fs::write(
        &m,
        r#"{"source": "agent: wide loads, big blocks", "rows": [{"axis": "VEC", "prefer": [8, 4], "priority": 0.9, "reason": "float4 loads"}],
            "starts": [{"BLOCK": 1024, "VEC": 8, "UNROLL": 4}]}"#,
    )
    .unwrap();
    let v = w.json(&seeded_hill_search("--matrix", &m));
    assert_eq!(v["seeded"], true);
    assert_eq!(v["matrix"]["source"], "agent: wide loads, big blocks");
    assert_eq!(
        v["best"]["label"], OPTIMUM,
        "the agent's start is the optimum"
    );
    std::fs::write(&m, r#"{"source": "agent", "rows": [{"axis": "VECTOR", "prefer": [8], "priority": 0.9, "reason": ""}]}"#).unwrap();
    let o = w.run(&[
        "search",
        "row_sum",
        "--options",
        "none",
        "--matrix",
        m.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("`VECTOR`, which is not an axis") && err.contains("VEC in [1, 2, 4, 8]"),
        "{err}"
    );
    // Without tunables only the compile options can vary.
    let o = w.run(&["search", "softmax", "--options", "none"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("declares no tunables"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_profilers_snapshot_seeds_the_search() {
    let w = ws("");
    let p = w.json(&["profile", "row_sum", "--no-ncu", "--no-cases"]);
    let snapshot = PathBuf::from(p["dir"].as_str().unwrap()).join("snapshot.json");
    let mut snap: Value =
        serde_json::from_str(&std::fs::read_to_string(&snapshot).unwrap()).unwrap();
    let m = &snap["measurements"];
    let (registers, blocks) = (
        m["registers"]["value"].as_f64(),
        m["blocks"]["value"].as_f64(),
    );
    assert!(registers.is_some() && blocks.is_some(), "{m}");
    // As Nsight Compute would add it: achieved occupancy wins over the driver's figure.
    snap["measurements"]["occupancy_achieved_pct"] = serde_json::json!({"value": 41.5, "unit": "%", "source": "ncu", "from": "sm__warps_active.avg.pct_of_peak_sustained_active"});
    std::fs::write(&snapshot, serde_json::to_string(&snap).unwrap()).unwrap();
    let v = w.json(&seeded_hill_search("--hints", &snapshot));
    assert_eq!(v["seeded"], true);
    let h = &v["hints"];
    assert_eq!(h["class"], snap["classification"]["class"], "{h}");
    assert_eq!(h["occupancy_pct"], 41.5);
    assert_eq!(h["registers"].as_f64(), registers);
    assert!(
        h["grid_blocks_per_sm"]
            .as_f64()
            .is_some_and(|g| g > 0.0 && g <= blocks.unwrap()),
        "{h}"
    );
    // A snapshot of another kernel is refused, with the command that makes the right one.
    let p = w.json(&["profile", "softmax", "--no-ncu", "--no-cases"]);
    let other = PathBuf::from(p["dir"].as_str().unwrap()).join("snapshot.json");
    let o = w.run(&[
        "search",
        "row_sum",
        "--options",
        "none",
        "--hints",
        other.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("is a snapshot of `softmax`, not of `row_sum`: profile this kernel with `cargo kopt profile row_sum`"),
        "{}",
        text(&o)
    );
}

#[test]
fn the_convergence_benchmark_replays_the_exhaustive_run() {
    let w = ws("");
    let v = w.json(&["search-bench", "row_sum", "--seeds", "3"]);
    let l = &v["landscape"];
    assert_eq!(l["valid"], 216);
    assert_eq!(l["evaluated"], 216);
    assert_eq!(l["best_label"], OPTIMUM);
    assert!(l["best_over_median"].as_f64().unwrap() > 1.5, "{l}");
    assert!(v["exhaustive_evaluations_per_second"].as_f64().unwrap() > 0.0);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 8, "4 strategies x seeded or not");
    let med = |s: &str, seeded: bool| {
        rows.iter()
            .find(|r| r["strategy"] == s && r["seeded"] == seeded)
            .unwrap()["median_evaluations"]
            .as_f64()
            .unwrap()
    };
    for r in rows {
        assert_eq!(
            r["reached"], r["seeds"],
            "every trial reaches the target: {r}"
        );
    }
    assert!(
        med("hill", true) * 3.0 <= med("random", false),
        "seeded hill {} vs random {}",
        med("hill", true),
        med("random", false)
    );
    let out = w.human(&[
        "search-bench",
        "row_sum",
        "--seeds",
        "2",
        "--strategies",
        "random,hill",
    ]);
    for needle in [
        "median evaluations to within target",
        "evaluations/s",
        "faster than the median point",
        "random",
        "hill",
    ] {
        assert!(out.contains(needle), "{needle} missing in\n{out}");
    }
}

/// The fake device's figures are made up: a winner measured on it waits for review like
/// any other, but neither `accept` nor `review` accepts it for sm_90, and a lock entry
/// resting on it (as an earlier kopt accepted) fails `check`.
#[test]
fn a_winner_measured_on_the_fake_device_is_never_accepted() {
    let w = ws("");
    let v = w.search_row_sum(&["--options", "none", "--budget-evals", "20", "--save"]);
    assert_eq!(v["pending"], "llm-kernels/row_sum/sm_90", "{v}");
    let pending = w.json(&["pending"]);
    let dir = PathBuf::from(pending["pending"][0]["dir"].as_str().unwrap());
    let variant = pending["pending"][0]["variant"]
        .as_str()
        .unwrap()
        .to_string();
    let lock_path = "kopt/row_sum/kopt.lock";
    let lock_before = w.ws.read(lock_path);

    let o = w.run(&["accept", "row_sum"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!(
            "pending variant `{variant}` of `row_sum` for sm_90 was measured on kopt's fake device (`kopt fake GPU (sm_90)`"
        )),
        "{err}"
    );
    assert!(
        err.contains("cargo kopt reject row_sum --arch sm_90"),
        "{err}"
    );

    // Review's accept key refuses it too.
    let mut child = w
        .cmd(&["review", "--color", "never"])
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"a\nq\n").unwrap();
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("cannot accept") && out.contains("measured on kopt's fake device"),
        "{}",
        text(&o)
    );
    assert!(out.contains("0 accepted"), "{out}");
    assert_eq!(w.ws.read(lock_path), lock_before, "the lock is untouched");
    assert!(!w.ws.path(&format!("kopt/row_sum/{variant}")).exists());
    assert!(dir.join("pending.json").is_file(), "still pending");

    // As an earlier kopt accepted it: its folder committed, the lock naming it.
    use kopt_spec::files::{self, LockEntry, LockFile, Rationale, VerifiedBy};
    let vdir = w.ws.path(&format!("kopt/row_sum/{variant}"));
    std::fs::create_dir_all(&vdir).unwrap();
    for f in [
        files::SOURCE_FILE,
        files::VARIANT_FILE,
        files::RATIONALE_JSON,
    ] {
        std::fs::copy(dir.join(f), vdir.join(f)).unwrap();
    }
    let r = Rationale::parse(&std::fs::read_to_string(vdir.join(files::RATIONALE_JSON)).unwrap())
        .unwrap();
    std::fs::write(vdir.join(files::RATIONALE_MD), r.render_markdown()).unwrap();
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("pending.json")).unwrap()).unwrap();
    let hash = |f: &str| kopt_spec::source::hash(&std::fs::read(vdir.join(f)).unwrap());
    let mut lock = LockFile::parse(&lock_before).unwrap();
    lock.accepted.retain(|e| e.arch != "sm_90");
    lock.accepted.push(LockEntry {
        arch: "sm_90".into(),
        device: None,
        variant: variant.clone(),
        region: None,
        verified_by: VerifiedBy::Kopt,
        reference_hash: meta["reference_hash"].as_str().unwrap().into(),
        spec_hash: meta["spec_hash"].as_str().unwrap().into(),
        source_hash: hash(files::SOURCE_FILE),
        variant_hash: hash(files::VARIANT_FILE),
        ptx: None,
    });
    w.ws.write(lock_path, &lock.render());
    let o = w.run(&["check"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!(
            "variant `{variant}` for sm_90 rests on evidence from kopt's fake device (`kopt fake GPU (sm_90)`"
        )),
        "{out}"
    );
    assert!(
        out.contains("cargo kopt revert row_sum --arch sm_90"),
        "{out}"
    );
}
