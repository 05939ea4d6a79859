//! `cargo kopt mcp` end to end: the real binary spawned over stdio, driven by rmcp's own
//! client, the engine's fake worker playing the GPU, on a scratch copy of the example
//! crate.

use std::path::{Path, PathBuf};

use kopt_tests::ExampleWorkspace;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::ServiceExt;
use serde_json::{json, Value};

type Client = RunningService<RoleClient, ()>;

/// The server: `KOPT_MCP_SERVER`, else this build's binary, else (on the GPU machine, where
/// this build's target folder does not exist) the staged one on PATH.
fn server_program() -> PathBuf {
    std::env::var_os("KOPT_MCP_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| kopt_tests::cargo_kopt_binary(env!("CARGO_BIN_EXE_cargo-kopt")))
}

async fn connect(ws: &ExampleWorkspace, target: &Path, extra: &[&str]) -> Client {
    connect_with(ws, target, extra, true).await
}

async fn connect_with(ws: &ExampleWorkspace, target: &Path, extra: &[&str], fake: bool) -> Client {
    let transport = TokioChildProcess::new(
        tokio::process::Command::new(server_program()).configure(|c| {
            c.args(["kopt", "mcp", "--manifest-path"])
                .arg(ws.manifest())
                .args(["--agent-name", "test-agent", "--no-ncu"])
                .args(extra)
                .env("CARGO_TARGET_DIR", target)
                .env("KOPT_CACHE_DIR", ws.root.join("cache"))
                .env("XDG_DATA_HOME", ws.root.join("data"));
            if fake {
                c.env("KOPT_WORKER", "fake");
            }
        }),
    )
    .expect("cargo-kopt starts");
    ().serve(transport).await.expect("the MCP handshake")
}

async fn call(c: &Client, tool: &'static str, args: Value) -> Result<Value, ServiceError> {
    let r = c
        .call_tool(
            CallToolRequestParams::new(tool).with_arguments(args.as_object().unwrap().clone()),
        )
        .await?;
    assert_ne!(r.is_error, Some(true), "{tool}: {r:?}");
    Ok(r.structured_content.expect("structured answers"))
}

/// The JSON-RPC error's message of a call that must fail.
async fn refused(c: &Client, tool: &'static str, args: Value) -> String {
    match call(c, tool, args).await {
        Err(ServiceError::McpError(e)) => e.message.to_string(),
        other => panic!("{tool} should be refused, got {other:?}"),
    }
}

fn proposal(source: &str) -> Value {
    json!({
        "diagnosis": {
            "bottleneck": "memory-bound",
            "summary": "two passes over each row with 2-byte loads",
            "evidence": ["loads are 16-bit (LDG.E.U16)"]
        },
        "changes": [{ "what": "vectorised loads", "why": "fewer memory instructions for the same bytes" }],
        "risks": ["misaligned rows"],
        "expected": [{ "metric": "time", "change": "down by a third" }],
        "candidate": { "source": source }
    })
}

fn journal(target: &Path) -> String {
    let runs: Vec<PathBuf> = std::fs::read_dir(target.join("kopt/runs"))
        .unwrap()
        .map(|e| e.unwrap().path().join("journal.jsonl"))
        .filter(|p| p.is_file())
        .collect();
    runs.iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_drives_the_verified_loop_over_stdio() {
    let ws = ExampleWorkspace::new();
    let target = ws.root.join("target");
    let committed_before = std::fs::read_dir(ws.path("kopt")).unwrap().count();
    let client = connect(
        &ws,
        &target,
        &["--max-proposals", "3", "--max-candidate-bytes", "20000"],
    )
    .await;

    // The tools and their schemas (derived from kopt's types).
    let mut tools: Vec<Value> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| json!({ "name": t.name, "description": t.description, "input_schema": t.input_schema }))
        .collect();
    tools.sort_by_key(|t| t["name"].as_str().unwrap().to_string());
    insta::assert_json_snapshot!("mcp_tools", tools);

    let listed = call(&client, "list_kernels", json!({})).await.unwrap();
    let names: Vec<&str> = listed["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kernel"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"rmsnorm"), "{names:?}");

    let ctx = call(&client, "get_context", json!({ "kernel": "rmsnorm" }))
        .await
        .unwrap();
    let source = ctx["source"].as_str().unwrap().to_string();
    assert!(source.contains("rmsnorm_f16"));
    // As `cargo kopt optimize`, the session starts from the variant accepted for sm_90.
    let accepted = kopt_spec::files::LockFile::parse(
        &std::fs::read_to_string(ws.path("kopt/rmsnorm/kopt.lock")).unwrap(),
    )
    .unwrap()
    .accepted[0]
        .variant
        .clone();
    assert_eq!(ctx["current_best"], json!(accepted), "{ctx:#}");
    assert!(
        ctx["device"]
            .as_str()
            .unwrap()
            .contains("timing noise: the same version timed in two jobs moved by up to 0.0%, so a win needs 3.0% on some shape"),
        "the starting version was timed twice: {}",
        ctx["device"]
    );
    assert!(ctx["prompt"].as_str().unwrap().contains("rmsnorm_f16"));

    let profiled = call(
        &client,
        "profile",
        json!({ "kernel": "rmsnorm", "shape": "1" }),
    )
    .await
    .unwrap();
    assert!(
        profiled["snapshot"]["shape"]
            .as_str()
            .unwrap()
            .contains("rows=64"),
        "{profiled:#}"
    );

    // A candidate that fails numerics: the verdict localises the failure.
    let wrong = format!("{source}\n// kopt-fake: wrong y 100\n");
    let v = call(
        &client,
        "propose_variant",
        json!({ "kernel": "rmsnorm", "proposal": proposal(&wrong) }),
    )
    .await
    .unwrap();
    assert_eq!(v["accepted"], json!(false), "{v:#}");
    assert_eq!(v["failures"][0]["fence"], json!("numerics"), "{v:#}");
    assert!(
        v["failures"][0]["message"]
            .as_str()
            .unwrap()
            .contains("100"),
        "the first bad index: {v:#}"
    );
    assert_eq!(v["pending"], Value::Null);

    // One that passes and is faster: a pending variant citing the agent's reasons.
    let fast = format!(
        "{source}\n// kopt-fake: speedup 1.1\n// kopt-fake: time-table --use_fast_math:0.9\n"
    );
    let v = call(
        &client,
        "propose_variant",
        json!({ "kernel": "rmsnorm", "proposal": proposal(&fast) }),
    )
    .await
    .unwrap();
    assert_eq!(v["accepted"], json!(true), "{v:#}");
    assert_eq!(v["improved"], json!(true), "{v:#}");
    assert_eq!(v["a_win_needs"]["on_some_shape"], json!(0.03), "{v:#}");
    let pending = v["pending"].as_str().expect("saved as pending").to_string();
    assert!(pending.contains("rmsnorm"), "{pending}");
    let id = v["candidate"].as_str().unwrap().to_string();
    let explained = call(&client, "explain_verdict", json!({ "candidate": id }))
        .await
        .unwrap();
    assert_eq!(
        explained["proposal"]["changes"][0]["what"],
        json!("vectorised loads")
    );

    let p = call(&client, "list_pending", json!({})).await.unwrap();
    let rows = p["pending"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{p:#}");
    let rationale =
        std::fs::read_to_string(Path::new(rows[0]["dir"].as_str().unwrap()).join("rationale.json"))
            .unwrap();
    assert!(
        rationale.contains("fewer memory instructions for the same bytes"),
        "{rationale}"
    );
    assert!(rationale.contains("mcp:test-agent"), "{rationale}");
    assert!(
        rationale.contains(&format!("started from `{accepted}`")),
        "it names the accepted variant it had to beat: {rationale}"
    );

    // A search around the winner: fast math is faster on the fake device, and is saved.
    let s = call(
        &client,
        "search",
        json!({ "kernel": "rmsnorm", "candidate": id, "max_evals": 6 }),
    )
    .await
    .unwrap();
    assert!(s["evaluations"].as_u64().unwrap() <= 6, "{s:#}");
    assert!(s["pending"].is_string(), "{s:#}");
    // ... and the session's current best, a candidate like the agent's own.
    let searched = s["candidate"].as_str().expect("the winner's candidate id");
    let listed = call(&client, "list_kernels", json!({})).await.unwrap();
    let rms = listed["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kernel"] == "rmsnorm")
        .unwrap();
    assert_eq!(rms["session_best"]["candidate"], json!(searched), "{rms:#}");
    let explained = call(&client, "explain_verdict", json!({ "candidate": searched }))
        .await
        .unwrap();
    assert_eq!(explained["accepted"], json!(true));
    assert!(
        explained["proposal"]["changes"]
            .to_string()
            .contains("--use_fast_math"),
        "{explained:#}"
    );

    // Malformed calls get errors that say what was wrong.
    assert!(
        refused(&client, "get_context", json!({ "kernel": "rmsnorn" }))
            .await
            .contains("rmsnorm")
    );
    assert!(
        refused(&client, "propose_variant", json!({ "kernel": "rmsnorm" }))
            .await
            .contains("proposal")
    );
    let mut no_reason = proposal(&fast);
    no_reason["changes"][0]["why"] = json!("");
    assert!(refused(
        &client,
        "propose_variant",
        json!({ "kernel": "rmsnorm", "proposal": no_reason })
    )
    .await
    .contains("does not say why"));
    let huge = format!("{source}{}", " ".repeat(20_000));
    assert!(refused(
        &client,
        "propose_variant",
        json!({ "kernel": "rmsnorm", "proposal": proposal(&huge) })
    )
    .await
    .contains("--max-candidate-bytes"));
    assert!(
        refused(&client, "explain_verdict", json!({ "candidate": "m99" }))
            .await
            .contains("m99")
    );
    // The third verified proposal spends the budget; the fourth is refused.
    call(
        &client,
        "propose_variant",
        json!({ "kernel": "rmsnorm", "proposal": proposal(&wrong) }),
    )
    .await
    .unwrap();
    assert!(refused(
        &client,
        "propose_variant",
        json!({ "kernel": "rmsnorm", "proposal": proposal(&fast) })
    )
    .await
    .contains("--max-proposals"));
    // The server is still there.
    call(&client, "list_kernels", json!({})).await.unwrap();
    client.cancel().await.unwrap();

    let j = journal(&target);
    for needle in [
        "\"mcp:propose_variant\"",
        "\"verdict\"",
        "\"pending_saved\"",
        "\"mcp:search\"",
        "do not match its input schema",
    ] {
        assert!(j.contains(needle), "the journal lacks {needle}:\n{j}");
    }
    assert_eq!(
        std::fs::read_dir(ws.path("kopt")).unwrap().count(),
        committed_before,
        "nothing committed is written"
    );
}

/// The agent an engineer's editor would run, scripted: on the GPU, it reads the context of
/// `rmsnorm`, proposes the hand-written vectorised candidate (what
/// `examples/llm-kernels/agents/scripted-agent.sh` answers for it), searches around it with a small
/// budget, and lists what is pending; it prints the session's figures. The run folder is
/// copied to `$KOPT_MCP_OUT` when set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a CUDA GPU"]
async fn a_scripted_agent_optimises_rmsnorm_on_the_gpu() {
    if std::env::var("KOPT_REQUIRE_GPU").as_deref() != Ok("1") && kopt::gpu::missing().is_some() {
        eprintln!("no GPU found: skipped (KOPT_REQUIRE_GPU=1 makes this a failure)");
        return;
    }
    let ws = ExampleWorkspace::new();
    let target = ws.root.join("target");
    // From the reference, as this test was written and run on the H200: against the
    // accepted variant the same proposal need not win.
    let client = connect_with(
        &ws,
        &target,
        &[
            "--max-proposals",
            "4",
            "--max-search-evals",
            "12",
            "--from-reference",
        ],
        false,
    )
    .await;
    let listed = call(&client, "list_kernels", json!({})).await.unwrap();
    println!(
        "kernels: {}",
        listed["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["kernel"].as_str().unwrap())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let ctx = call(&client, "get_context", json!({ "kernel": "rmsnorm" }))
        .await
        .unwrap();
    println!("device: {} | ceilings: {}", ctx["device"], ctx["ceilings"]);
    println!(
        "snapshot:\n{}",
        ctx["snapshot"].as_str().unwrap_or("(none)")
    );
    // As the example's scripted agent answers it: the proposal with its source written out
    // from the accepted variant it points at.
    let answer = kopt_tests::scripted_answer(
        &kopt_tests::repo_root().join("examples/llm-kernels/agents"),
        "rmsnorm",
    );
    let set: Value = serde_json::from_str(&answer).unwrap();
    let v = call(
        &client,
        "propose_variant",
        json!({ "kernel": "rmsnorm", "proposal": set["proposals"][0] }),
    )
    .await
    .unwrap();
    println!(
        "propose_variant {}: accepted {} improved {} pending {}",
        v["candidate"], v["accepted"], v["improved"], v["pending"]
    );
    println!("{}", v["summary"].as_str().unwrap_or(""));
    for s in v["shapes"].as_array().unwrap() {
        println!(
            "  {:<28} held-out {:<5} candidate {:>9} µs  reference {:>9} µs  speedup {}  copy bw {}%",
            s["shape"].as_str().unwrap(), s["held_out"], s["candidate_us"], s["reference_us"], s["speedup"], s["copy_bandwidth_pct"]
        );
    }
    assert_eq!(v["accepted"], json!(true), "{v:#}");
    let id = v["candidate"].as_str().unwrap().to_string();
    let s = call(
        &client,
        "search",
        json!({ "kernel": "rmsnorm", "candidate": id, "max_evals": 12 }),
    )
    .await
    .unwrap();
    println!(
        "search around {id}: {} evaluations, stop: {}, best {}, pending {}",
        s["evaluations"], s["stop"], s["best"], s["pending"]
    );
    if let Some(b) = s["best_verified"].as_object() {
        println!(
            "  best verified in full: {} ({})",
            b["accepted"],
            b["summary"]
                .as_str()
                .unwrap_or("")
                .lines()
                .next()
                .unwrap_or("")
        );
    }
    let p = call(&client, "list_pending", json!({})).await.unwrap();
    for r in p["pending"].as_array().unwrap() {
        println!(
            "pending: {}/{}/{} {} speedup {} ({})",
            r["package"].as_str().unwrap(),
            r["kernel"].as_str().unwrap(),
            r["arch"].as_str().unwrap(),
            r["variant"].as_str().unwrap(),
            r["speedup"],
            r["status"].as_str().unwrap()
        );
    }
    client.cancel().await.unwrap();
    if let Some(out) = std::env::var_os("KOPT_MCP_OUT") {
        let status = std::process::Command::new("tar")
            .arg("czf")
            .arg(Path::new(&out).join("mcp-runs.tgz"))
            .arg("-C")
            .arg(target.join("kopt"))
            .args(["runs", "pending"])
            .status()
            .unwrap();
        assert!(status.success());
    }
    assert!(
        v["improved"] == json!(true),
        "the hand-written candidate should beat the reference: {v:#}"
    );
}

/// `--min-gain` and `--min-uniform-gain` set the session's rule for a new best: the
/// context and every answer state it, and a candidate under it is verified but not saved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_win_thresholds_are_set_on_the_command_line() {
    let ws = ExampleWorkspace::new();
    let target = ws.root.join("target");
    let client = connect(
        &ws,
        &target,
        &["--min-gain", "12", "--min-uniform-gain", "15"],
    )
    .await;
    let ctx = call(&client, "get_context", json!({ "kernel": "rmsnorm" }))
        .await
        .unwrap();
    assert!(
        ctx["device"]
            .as_str()
            .unwrap()
            .contains("so a win needs 12.0% on some shape or 15.0% over all"),
        "{}",
        ctx["device"]
    );
    let source = ctx["source"].as_str().unwrap().to_string();
    // 10% faster on every shape: a win by the default rule, not by this one.
    let v = call(
        &client,
        "propose_variant",
        json!({ "kernel": "rmsnorm", "proposal": proposal(&format!("{source}\n// kopt-fake: speedup 1.1\n")) }),
    )
    .await
    .unwrap();
    assert_eq!(v["accepted"], json!(true), "{v:#}");
    assert_eq!(v["improved"], json!(false), "{v:#}");
    assert_eq!(v["a_win_needs"]["on_some_shape"], json!(0.12), "{v:#}");
    assert_eq!(v["a_win_needs"]["over_all_shapes"], json!(0.15), "{v:#}");
    assert_eq!(v["pending"], Value::Null, "{v:#}");
    client.cancel().await.unwrap();
}
