//! `cargo kopt report` end to end on the fake device: it reads exactly the JSON that
//! `cargo kopt bench --message-format json` prints and `cargo kopt search-bench --json-out`
//! writes, and refuses other files naming the command that writes the right one.

use std::process::{Command, Output};

use kopt_tests::{text, ExampleWorkspace};

fn kopt(ws: &ExampleWorkspace, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cargo-kopt"))
        .arg("kopt")
        .args(args)
        .arg("--manifest-path")
        .arg(ws.manifest())
        .env("KOPT_WORKER", "fake")
        .env("CARGO_TARGET_DIR", ws.root.join("target"))
        .env("KOPT_CACHE_DIR", ws.root.join("cache"))
        .output()
        .unwrap()
}

#[test]
fn the_report_reads_what_bench_and_search_bench_write() {
    let ws = ExampleWorkspace::new();
    let o = kopt(&ws, &["bench", "--message-format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let bench = ws.root.join("bench.json");
    std::fs::write(&bench, &o.stdout).unwrap();
    let sb = ws.root.join("search-bench.json");
    let o = kopt(
        &ws,
        &[
            "search-bench",
            "row_sum",
            "--seeds",
            "2",
            "--strategies",
            "random,hill",
            "--json-out",
            sb.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));

    let html = ws.root.join("out/report.html");
    let o = kopt(
        &ws,
        &[
            "report",
            "--bench",
            bench.to_str().unwrap(),
            "--search-bench",
            sb.to_str().unwrap(),
            "-o",
            html.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("wrote "), "{out}");
    assert!(out.contains("empty: pending variants: none"), "{out}");
    let page = std::fs::read_to_string(&html).unwrap();
    for needle in [
        "id=\"bars-llm-kernels-softmax\"",
        // The fake device reports no FLOP counts, so the roofline says why it is empty.
        "no bench row has both a FLOP share and a bandwidth share",
        "id=\"convergence-0-row_sum\"",
        "random (seeded)",
        "committed-llm-kernels-softmax-online-vec4",
        "bench: bench.json",
    ] {
        assert!(page.contains(needle), "{needle} missing");
    }

    // A file of the wrong kind: exit 2, naming the command that writes the right one.
    let o = kopt(&ws, &["report", "--bench", sb.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("cargo kopt bench --message-format json > FILE"),
        "{}",
        text(&o)
    );
    // Without measurements: the default path, and the empty sections listed as JSON.
    let o = kopt(&ws, &["report", "--message-format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["path"]
            .as_str()
            .unwrap()
            .ends_with("target/kopt/report.html"),
        "{v}"
    );
    assert!(ws.root.join("target/kopt/report.html").exists());
    assert_eq!(v["empty"].as_array().unwrap().len(), 4, "{v}");
}
