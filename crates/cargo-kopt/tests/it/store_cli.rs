//! `cargo kopt pending`, `accept`, `reject`, `review`, `revert --to` and `cases` on a
//! scratch copy of the example crate, with a case library of the test's own.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use kopt_store::pending::{self, PendingVariant};
use kopt_store::KoptDir;
use kopt_tests::{pending_from_shipped, text, ExampleWorkspace};
use kopt_workspace::gather;

struct Env {
    ws: ExampleWorkspace,
    cases: tempfile::TempDir,
}

impl Env {
    /// The example with softmax's `online-vec4` pinned for sm_90: the variant these tests
    /// replace, diff against and record.
    fn new() -> Self {
        let ws = ExampleWorkspace::new();
        ws.pin_online_vec4(std::path::Path::new(env!("CARGO_BIN_EXE_cargo-kopt")));
        Env {
            ws,
            cases: tempfile::tempdir().unwrap(),
        }
    }

    fn cases_db(&self) -> PathBuf {
        self.cases.path().join("cases.sqlite")
    }

    /// The scratch workspace's own target folder: its pending area is this test's alone,
    /// even when the tests run with a shared `CARGO_TARGET_DIR`.
    fn target(&self) -> PathBuf {
        self.ws.root.join("target")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cargo-kopt"));
        c.arg("kopt")
            .args(args)
            .arg("--manifest-path")
            .arg(self.ws.manifest())
            .env("KOPT_CASES", self.cases_db())
            .env("CARGO_TARGET_DIR", self.target())
            .env_remove("NO_COLOR");
        c
    }

    fn kopt(&self, args: &[&str]) -> Output {
        self.command(args).stdin(Stdio::null()).output().unwrap()
    }

    fn kopt_ok(&self, args: &[&str]) -> String {
        let o = self.kopt(args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        String::from_utf8(o.stdout).unwrap()
    }

    fn kopt_err(&self, args: &[&str]) -> String {
        let o = self.kopt(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        String::from_utf8(o.stderr).unwrap()
    }

    /// Leaves a pending variant as the optimisation loop would.
    fn seed(&self, variant: &str, run: &str, arch: &str, tweak: &str) -> PendingVariant {
        let g = gather::gather(&gather::Selection {
            manifest_path: Some(self.ws.manifest()),
            ..Default::default()
        })
        .unwrap();
        let k = g.kernels.iter().find(|k| k.spec.name == "softmax").unwrap();
        let p = pending_from_shipped(
            &self.ws,
            variant,
            run,
            arch,
            (&k.hashes.reference, &k.hashes.spec),
            tweak,
        );
        pending::save(&KoptDir::new(&self.target()), &p).unwrap();
        p
    }
}

#[test]
fn pending_then_accept_prints_what_it_replaces_and_records_a_case() {
    let e = Env::new();
    assert!(e.kopt_ok(&["pending"]).contains("no pending variant"));
    e.seed("online-vec4-b", "run-1", "sm_90", "// b\n");

    let out = e.kopt_ok(&["pending"]);
    for needle in [
        "softmax",
        "sm_90",
        "online-vec4-b",
        "cols % 4 == 0",
        "1.37-10.49x",
        "ready, replaces online-vec4",
        "run-1",
    ] {
        assert!(out.contains(needle), "{needle:?} in\n{out}");
    }
    let v: serde_json::Value =
        serde_json::from_str(&e.kopt_ok(&["pending", "--message-format", "json"])).unwrap();
    assert_eq!(v["pending"][0]["status"], "ready");
    assert_eq!(v["pending"][0]["replaces"][0], "online-vec4");

    let out = e.kopt_ok(&["accept", "softmax"]);
    assert!(
        out.contains(
            "replaces `online-vec4` (sm_90, where `cols % 4 == 0`; verified by manual; active)"
        ),
        "{out}"
    );
    assert!(
        out.contains("accepted `online-vec4-b` for sm_90 of softmax where `cols % 4 == 0`: wrote kopt/softmax/online-vec4-b and kopt/softmax/kopt.lock"),
        "{out}"
    );
    assert!(
        out.contains("recorded as case ws/llm-kernels/softmax/online-vec4-b@sm_90"),
        "{out}"
    );
    let locks = std::fs::read_dir(e.ws.path("kopt"))
        .unwrap()
        .flatten()
        .filter(|d| d.path().join("kopt.lock").is_file())
        .count();
    assert!(e
        .kopt_ok(&["check"])
        .contains(&format!("ok: 11 kernel(s), {locks} accepted variant(s)")));
    assert!(e
        .kopt_ok(&["list"])
        .contains("sm_90: online-vec4-b where cols % 4 == 0"));
    assert!(e.kopt_ok(&["pending"]).contains("no pending variant"));
    assert_eq!(
        e.ws.read("kopt/softmax/online-vec4-b/kernel.cu"),
        format!("{}// b\n", e.ws.read("kopt/softmax/online-vec4/kernel.cu"))
    );

    let cases = e.kopt_ok(&["cases", "list"]);
    assert!(
        cases.contains("ws/llm-kernels/softmax/online-vec4-b@sm_90"),
        "{cases}"
    );
    assert!(cases.contains("accepted"), "{cases}");
    let v: serde_json::Value = serde_json::from_str(&e.kopt_ok(&[
        "cases",
        "show",
        "ws/llm-kernels/softmax/online-vec4-b@sm_90",
        "--message-format",
        "json",
    ]))
    .unwrap();
    assert_eq!(v["kind"], "softmax");
    assert_eq!(v["outcome"]["speedup"], 2.82);

    // Nothing left to accept.
    assert!(e
        .kopt_err(&["accept", "softmax"])
        .contains("no pending variant of `softmax`"));
}

#[test]
fn a_stale_pending_variant_is_refused_naming_the_fix() {
    let e = Env::new();
    e.seed("online-vec4-b", "run-1", "sm_90", "// b\n");
    let r = "kernels/softmax.cu";
    e.ws.write(r, &e.ws.read(r).replace("three passes", "3 passes"));
    let out = e.kopt_ok(&["pending"]);
    assert!(out.contains("stale"), "{out}");
    let err = e.kopt_err(&["accept", "softmax", "--arch", "sm_90"]);
    assert!(err.contains("is stale: the reference source (or one of its includes) changed since run run-1 verified it"), "{err}");
    assert!(
        err.contains("cargo kopt reject softmax --arch sm_90"),
        "{err}"
    );
    assert!(!e.ws.path("kopt/softmax/online-vec4-b").exists());
}

#[test]
fn several_pending_variants_need_all_or_a_choice() {
    let e = Env::new();
    e.seed("vec4-hopper", "run-1", "sm_90", "// 90\n");
    e.seed("vec4-ampere", "run-1", "sm_80", "// 80\n");
    let err = e.kopt_err(&["accept", "softmax"]);
    assert!(err.contains("2 pending variants of `softmax` (llm-kernels/softmax/sm_80 where cols % 4 == 0, llm-kernels/softmax/sm_90 where cols % 4 == 0): name a KERNEL and --arch, or pass --all"), "{err}");
    assert!(e
        .kopt_err(&["accept", "--arch", "ampere"])
        .contains("not an architecture name"));
    let out = e.kopt_ok(&[
        "reject",
        "softmax",
        "--arch",
        "sm_80",
        "--reason",
        "ampere is not a target",
    ]);
    assert!(
        out.contains("rejected `vec4-ampere` for sm_80 of softmax"),
        "{out}"
    );
    assert!(
        out.contains("negative case ws/llm-kernels/softmax/vec4-ampere@sm_80#run-1"),
        "{out}"
    );
    let out = e.kopt_ok(&["accept", "--all"]);
    assert!(out.contains("accepted `vec4-hopper`"), "{out}");
    let out = e.kopt_ok(&["cases", "list", "--status", "rejected"]);
    assert!(
        out.contains("rejected (review)") && !out.contains("vec4-hopper"),
        "{out}"
    );
}

#[test]
fn revert_to_an_earlier_variant_and_back_to_the_reference() {
    let e = Env::new();
    e.seed("online-vec4-b", "run-1", "sm_90", "// b\n");
    e.kopt_ok(&["accept", "softmax"]);
    let out = e.kopt_ok(&["revert", "softmax", "--to", "online-vec4"]);
    assert!(
        out.contains(
            "replaces `online-vec4-b` (sm_90, where `cols % 4 == 0`; verified by kopt; active)"
        ),
        "{out}"
    );
    assert!(
        out.contains("`online-vec4` is the accepted variant for sm_90 again where `cols % 4 == 0`"),
        "{out}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&e.kopt_ok(&["list", "--message-format", "json"])).unwrap();
    let softmax = v
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kernel"] == "softmax")
        .unwrap();
    assert_eq!(softmax["variants"][0]["variant"], "online-vec4");
    assert_eq!(
        softmax["variants"][0]["verified_by"], "manual",
        "its claim says a person vouched for it"
    );
    assert!(e.kopt(&["check"]).status.success());

    let out = e.kopt_ok(&["revert", "softmax", "--to", "reference"]);
    assert!(out.contains("sm_90: dropped online-vec4"), "{out}");
    assert!(e
        .kopt_err(&["revert", "softmax", "--to", "nope"])
        .contains("kopt/softmax/nope does not exist"));

    // After the reference changes, an earlier variant cannot come back unverified.
    let r = "kernels/softmax.cu";
    e.ws.write(r, &e.ws.read(r).replace("three passes", "3 passes"));
    let err = e.kopt_err(&["revert", "softmax", "--to", "online-vec4-b"]);
    assert!(
        err.contains("verified against another reference source than today's"),
        "{err}"
    );
}

#[test]
fn review_from_a_script_shows_the_diff_and_accepts() {
    let e = Env::new();
    e.seed("online-vec4-b", "run-1", "sm_90", "// b: one more line\n");
    let mut child = e
        .command(&["review", "--color", "never"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    // An unknown key, the full diff, then accept.
    child.stdin.take().unwrap().write_all(b"x\nd\na\n").unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    for needle in [
        "[1/1] llm-kernels · softmax · sm_90 · pending `online-vec4-b`",
        "Diagnosis: memory-bound (extra passes), and latency-bound on few long rows",
        "Risks, and how verification covered them",
        "cols=65536 rows=16",
        "10.49x",
        "✓ numerics",
        "Replaces the accepted variant(s) for sm_90:",
        "`online-vec4` (sm_90, where `cols % 4 == 0`; verified by manual; active)",
        "--- kopt/softmax/online-vec4/kernel.cu (accepted for sm_90, would be replaced)",
        "+// b: one more line",
        "`x` is not a key here",
        "accepted `online-vec4-b` for sm_90",
        "1 accepted, 0 rejected, 0 left pending",
    ] {
        assert!(out.contains(needle), "{needle:?} not in\n{out}");
    }
    assert!(!out.contains('\u{1b}'), "--color never");
    assert!(e
        .ws
        .path("kopt/softmax/online-vec4-b/RATIONALE.md")
        .is_file());
    assert!(e.kopt(&["check"]).status.success());
}

/// The interactive path: single keys on a terminal (a pty), no Enter.
#[test]
fn review_on_a_terminal_shows_the_coloured_diff_and_accepts_with_one_key() {
    let e = Env::new();
    // Against the reference: no accepted variant for sm_90 first.
    e.kopt_ok(&["revert", "softmax"]);
    e.seed("online-vec4-c", "run-2", "sm_90", "");
    let mut cmd = e.command(&["review"]);
    cmd.env("TERM", "xterm-256color").env_remove("CI");
    let mut p = rexpect::session::spawn_command(cmd, Some(60_000)).unwrap();
    p.exp_string("pending `online-vec4-c`").unwrap();
    p.exp_string("Replaces:").unwrap();
    p.exp_string("nothing: the reference runs on sm_90 today")
        .unwrap();
    p.exp_string("kernels/softmax.cu (reference, includes inlined)")
        .unwrap();
    // A removed line of the reference's first pass, coloured red, and an added float4 load.
    let before = p.exp_string("[a]").unwrap();
    assert!(
        before.contains("\u{1b}[31m-"),
        "removed lines are red: {before}"
    );
    assert!(
        before.contains("\u{1b}[32m+"),
        "added lines are green: {before}"
    );
    assert!(before.contains("float4"), "{before}");
    p.exp_string("uit > ").unwrap();
    p.send("a").unwrap();
    p.flush().unwrap();
    p.exp_string("accepted").unwrap();
    p.exp_string("1 accepted, 0 rejected, 0 left pending")
        .unwrap();
    p.exp_eof().unwrap();
    assert!(e.ws.path("kopt/softmax/online-vec4-c/kernel.cu").is_file());
    assert!(e
        .kopt_ok(&["list"])
        .contains("sm_90: online-vec4-c where cols % 4 == 0"));
}

#[test]
fn cases_export_import_round_trip_and_repository_import() {
    let e = Env::new();
    let fixture =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../kopt-store/tests/fixtures/cases.jsonl");
    let out = e.kopt_ok(&["cases", "import", fixture.to_str().unwrap()]);
    assert!(out.contains("35 added, 0 updated, 0 unchanged"), "{out}");
    let exported = e.kopt(&["cases", "export"]);
    assert!(exported.status.success());
    assert_eq!(
        String::from_utf8(exported.stdout).unwrap(),
        std::fs::read_to_string(&fixture).unwrap()
    );

    let file = e.cases.path().join("out.jsonl");
    e.kopt_ok(&["cases", "export", "--out", file.to_str().unwrap()]);
    let other = e.cases.path().join("other.sqlite");
    let o = e
        .command(&[
            "cases",
            "--cases",
            other.to_str().unwrap(),
            "import",
            file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let o = e
        .command(&["cases", "--cases", other.to_str().unwrap(), "export"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(o.stdout).unwrap(),
        std::fs::read_to_string(&fixture).unwrap()
    );

    // The example workspace's committed variants (one per kernel with a lock file), with
    // the reference's features.
    let out = e.kopt_ok(&["cases", "import", e.ws.root.to_str().unwrap()]);
    assert!(out.contains(" added"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&e.kopt_ok(&[
        "cases",
        "show",
        "ws/llm-kernels/softmax/online-vec4@sm_90",
        "--message-format",
        "json",
    ]))
    .unwrap();
    // The reference as the build sees it: with common.cuh (block_reduce) inlined.
    let reference = kopt_spec::source::amalgamate(&e.ws.krate, "kernels/softmax.cu", &[]).unwrap();
    let expected = kopt_store::features::structural_summary(&reference.text);
    assert!(
        expected.contains("templated") && !expected.contains("float4"),
        "{expected}"
    );
    assert_eq!(v["features"]["structure"], expected.as_str());

    // Searching with the reference's source finds softmax rewrites first.
    let src = e.ws.path("kernels/softmax.cu");
    let v: serde_json::Value = serde_json::from_str(&e.kopt_ok(&[
        "cases",
        "search",
        "--source",
        src.to_str().unwrap(),
        "--metric",
        "dram_throughput_pct=47.5",
        "-k",
        "3",
        "--message-format",
        "json",
    ]))
    .unwrap();
    let kinds: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["case"]["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["softmax", "softmax", "softmax"], "{v}");
    let out = e.kopt_ok(&[
        "cases",
        "search",
        "--text",
        "atomicAdd contention",
        "--kind",
        "reduction",
    ]);
    assert!(out.contains("NEGATIVE: rejected"), "{out}");

    let err = e.kopt_err(&["cases", "search", "--metric", "dram=lots"]);
    assert!(err.contains("`lots` is not a number"), "{err}");
    let err = e.kopt_err(&["cases", "search", "--text", "x", "--kind", "conv"]);
    assert!(err.contains("kind `conv` is unknown"), "{err}");
    let err = e.kopt_err(&["cases", "show", "nope"]);
    assert!(err.contains("no case `nope`"), "{err}");
}

#[test]
fn an_edited_superseded_variant_cannot_come_back_as_verified() {
    let e = Env::new();
    e.seed("online-vec4-b", "run-1", "sm_90", "// b\n");
    e.kopt_ok(&["accept", "softmax"]);
    e.kopt_ok(&["revert", "softmax", "--to", "online-vec4"]);
    // `online-vec4-b` (accepted by kopt) is superseded now; someone edits its code.
    let src = "kopt/softmax/online-vec4-b/kernel.cu";
    e.ws.write(
        src,
        &e.ws
            .read(src)
            .replace("// b\n", "// b, and a quiet change\n"),
    );
    let lock = e.ws.read("kopt/softmax/kopt.lock");
    let o = e.kopt(&["check"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&format!(
            "{src} is not the file variant `online-vec4-b` was verified with"
        )),
        "{}",
        text(&o)
    );
    let err = e.kopt_err(&["revert", "softmax", "--to", "online-vec4-b"]);
    assert!(
        err.contains(&format!(
            "{src} is not the file `online-vec4-b` was verified with"
        )),
        "{err}"
    );
    assert_eq!(
        e.ws.read("kopt/softmax/kopt.lock"),
        lock,
        "still online-vec4"
    );
}

#[test]
fn a_pending_variant_from_the_fake_device_is_shown_but_never_accepted() {
    let e = Env::new();
    let mut p = e.seed("faked", "run-1", "sm_90", "// faked\n");
    p.rationale.provenance.device = format!("{} (sm_90)", kopt_spec::files::FAKE_DEVICE_NAME);
    pending::save(&KoptDir::new(&e.target()), &p).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&e.kopt_ok(&["pending", "--message-format", "json"])).unwrap();
    assert_eq!(v["pending"][0]["status"], "fake-device", "{v}");
    let err = e.kopt_err(&["accept", "softmax"]);
    assert!(
        err.contains("was measured on kopt's fake device (`kopt fake GPU (sm_90)`"),
        "{err}"
    );
    assert!(!e.ws.path("kopt/softmax/faked").exists());
}
