//! The agent loop end to end without a GPU: real local HTTP servers (wiremock) play an
//! OpenAI-compatible and an Anthropic endpoint, the engine's fake worker plays the GPU.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kopt_agent::backend::Client;
use kopt_agent::http::{Anthropic, Endpoint, OpenAi};
use kopt_agent::run::{self, Budget, Rules, Stop, Task};
use kopt_agent::session::{Recorder, Replay};
use kopt_engine::engine::Engine;
use kopt_engine::job::KernelVersion;
use kopt_engine::parent::WorkerCommand;
use kopt_engine::verdict::Judge;
use kopt_loop::eval::Settings;
use kopt_loop::optimize::LoopEvaluator;
use kopt_workspace::gather::{self, Gathered, Kernel};
use serde_json::json;
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

struct Setup {
    dir: tempfile::TempDir,
    g: Gathered,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/llm-kernels");
    let g = gather::gather_crate("llm-kernels", &root, dir.path());
    Setup { dir, g }
}

impl Setup {
    fn kernel(&self) -> &Kernel {
        self.g
            .kernels
            .iter()
            .find(|k| k.spec.name == "softmax")
            .unwrap()
    }

    fn engine(&self) -> Engine {
        let mut engine = Engine::new(
            WorkerCommand::fake(PathBuf::from(env!("CARGO_BIN_EXE_cargo-kopt"))),
            None,
            kopt_engine::ceilings::CeilingsCache::at(self.dir.path().join("ceilings.json")),
        );
        engine.worker.step_timeout = Duration::from_secs(5);
        engine
    }

    /// The fake device as the loop's judge, through the evaluator `optimize` uses.
    fn gpu<'a>(&'a self, engine: &'a mut Engine) -> LoopEvaluator<'a> {
        let ceilings = engine.ceilings(false).ok();
        LoopEvaluator {
            g: &self.g,
            k: self.kernel(),
            engine,
            judge: Judge::new(ceilings),
            settings: Settings::default(),
            last_job: None,
            recorded: Default::default(),
            target: Some(("sm_90".into(), true)),
        }
    }

    /// The loop against a mock endpoint answering `replies` in order, its events
    /// collected.
    fn optimize_scripted(
        &self,
        replies: &[String],
        budget: &Budget,
    ) -> (run::LoopOutcome, Vec<run::Event>) {
        let rt = runtime();
        let server = rt.block_on(MockServer::start());
        script(&rt, &server, replies.iter().map(|r| openai(r)).collect());
        let mut c = client(&server);
        let mut engine = self.engine();
        let mut gpu = self.gpu(&mut engine);
        let mut events = Vec::new();
        let out = run::optimize(
            &self.task(),
            &mut c,
            None,
            &mut gpu,
            budget,
            &Rules::default(),
            &mut |e| events.push(e),
        );
        (out, events)
    }

    fn task(&self) -> Task<'_> {
        let k = self.kernel();
        Task {
            spec: &k.spec,
            reference: KernelVersion::reference(&k.spec, &k.reference.text),
            start: None,
            run_budget: None,
            device: "kopt fake GPU (sm_90)".into(),
            ceilings: "copy 4000 GB/s".into(),
            snapshot: Some("memory-bound: 3 passes over each row".into()),
            structure: "3 loops over cols".into(),
            cases: vec![],
            hint: None,
            context_tokens: 60_000,
        }
    }

    /// The loop on the example's softmax, judged by a fresh fake device.
    fn optimize(
        &self,
        client: &mut Client,
        reviewer: Option<&mut Client>,
        budget: &Budget,
    ) -> run::LoopOutcome {
        let mut engine = self.engine();
        let mut gpu = self.gpu(&mut engine);
        run::optimize(
            &self.task(),
            client,
            reviewer,
            &mut gpu,
            budget,
            &Rules::default(),
            &mut |_| {},
        )
    }

    /// The reference's source with fake-device directives: what a proposal carries.
    fn source(&self, directives: &str) -> String {
        format!("{}\n{directives}\n", self.kernel().reference.text)
    }
}

fn proposal(source: &str) -> String {
    json!({ "proposals": [{
        "diagnosis": { "bottleneck": "memory-bound", "summary": "three passes over each row", "evidence": ["2034 GB/s of 4212"] },
        "changes": [{ "what": "online max and sum", "why": "one pass fewer over the row" }],
        "risks": ["rescaling accuracy"],
        "expected": [{ "metric": "time", "change": "a third less" }],
        "candidate": { "source": source }
    }]})
    .to_string()
}

/// A proposal with defines `TILE` = 1 and a matrix over `TILE`: on the fake device `TILE`
/// scales the candidate's time by the table below (each of 1, 2 and 4 more than 3% faster
/// than the one before, 8 slower than 4; the fastest stays under the copy-bandwidth bound).
fn matrix_proposal(s: &Setup, tiles: &[i64], more_directives: &str) -> String {
    let source = s.source(&format!(
        "// kopt-fake: time-table TILE=1:0.95 TILE=2:0.9 TILE=4:0.75 TILE=8:0.8\n{more_directives}"
    ));
    let mut v: serde_json::Value = serde_json::from_str(&proposal(&source)).unwrap();
    v["proposals"][0]["defines"] = json!({ "TILE": 1 });
    v["proposals"][0]["matrix"] = json!({ "TILE": tiles });
    v.to_string()
}

/// An agent for `cargo kopt optimize --agent`: a script that answers every request with
/// `text` (and a token count).
fn scripted_agent(ws: &kopt_tests::ExampleWorkspace, text: &str) -> String {
    let reply = json!({ "text": text, "usage": { "input_tokens": 900, "output_tokens": 100 } });
    let reply_file = ws.root.join("reply.json");
    std::fs::write(&reply_file, reply.to_string()).unwrap();
    let script = ws.root.join("agent.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncat > /dev/null\ncat '{}'\n",
            reply_file.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    format!("cmd:{}", script.display())
}

/// `cargo kopt optimize softmax` on the fake device: one round of `agent`, run `run_id`,
/// JSON out, then `extra`.
fn optimize_softmax(
    ws: &kopt_tests::ExampleWorkspace,
    agent: &str,
    run_id: &str,
    extra: &[&str],
) -> std::process::Output {
    let mut args = vec![
        "optimize",
        "softmax",
        "--no-ncu",
        "--agent",
        agent,
        "--budget",
        "rounds=1",
        "--run",
        run_id,
        "--message-format",
        "json",
    ];
    args.extend_from_slice(extra);
    kopt_on_fake(ws, &args)
}

/// `cargo kopt ARGS` on the fake device, in a workspace copy, to completion.
fn kopt_on_fake(ws: &kopt_tests::ExampleWorkspace, args: &[&str]) -> std::process::Output {
    ws.kopt_on_fake(Path::new(env!("CARGO_BIN_EXE_cargo-kopt")), args)
        .output()
        .unwrap()
}

/// The journal of run `run_id` of a workspace ("" when there is none).
fn journal_of(ws: &kopt_tests::ExampleWorkspace, run_id: &str) -> String {
    std::fs::read_to_string(
        ws.root
            .join(format!("target/kopt/runs/{run_id}/journal.jsonl")),
    )
    .unwrap_or_default()
}

fn openai(text: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "model": "mock", "choices": [{ "message": { "role": "assistant", "content": text } }],
        "usage": { "prompt_tokens": 1000, "completion_tokens": 200 }
    }))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Mounts replies in order: each answers one request.
fn script(rt: &tokio::runtime::Runtime, server: &MockServer, replies: Vec<ResponseTemplate>) {
    for r in replies {
        rt.block_on(
            Mock::given(method("POST"))
                .respond_with(r)
                .up_to_n_times(1)
                .mount(server),
        );
    }
}

/// The mock OpenAI-compatible endpoint, with a key the recordings must not contain.
fn endpoint(server: &MockServer) -> Endpoint {
    Endpoint {
        base_url: format!("{}/v1", server.uri()),
        model: "mock".into(),
        key: Some("sk-e2e-test-key-123456".into()),
        timeout: Duration::from_secs(5),
    }
}

fn client(server: &MockServer) -> Client {
    Client::new(Box::new(OpenAi::new(endpoint(server)))).with_sleep(|_| {})
}

fn verdicts(o: &run::LoopOutcome) -> Vec<(String, bool, String)> {
    o.tried
        .iter()
        .map(|t| {
            (
                t.id.clone(),
                t.verdict.as_ref().is_some_and(|v| v.accepted),
                t.verdict
                    .as_ref()
                    .map(|v| v.summary())
                    .or(t.error.clone())
                    .unwrap_or_default(),
            )
        })
        .collect()
}

#[test]
fn a_multi_round_session_with_feedback_repair_retry_and_replay() {
    let s = setup();
    let rt = runtime();
    let server = rt.block_on(MockServer::start());
    script(
        &rt,
        &server,
        vec![
            ResponseTemplate::new(429).insert_header("retry-after", "1"),
            openai("I would vectorise the loads."),
            openai(&proposal(
                &s.source("// kopt-fake: compile-error expected a ';'"),
            )),
            openai(&proposal(&s.source("// kopt-fake: wrong y 7"))),
            openai(&proposal(&s.source("// kopt-fake: speedup 1.3"))),
        ],
    );
    let session = s.dir.path().join("session.jsonl");
    let recorder = Recorder::new(
        Box::new(OpenAi::new(endpoint(&server))),
        &session,
        kopt_redact::Redactor::from_vars([(
            "E2E_API_KEY".to_string(),
            "sk-e2e-test-key-123456".to_string(),
        )]),
    )
    .unwrap();
    let mut c = Client::new(Box::new(recorder)).with_sleep(|_| {});
    let budget = Budget {
        rounds: 3,
        ..Budget::default()
    };
    let out = s.optimize(&mut c, None, &budget);

    assert_eq!(out.stop, Stop::Rounds, "{:?}", out.stop);
    let v = verdicts(&out);
    assert_eq!(v.len(), 3, "{v:?}");
    assert!(
        v[0].2.starts_with("compile") && v[0].2.contains("expected a ';'"),
        "{v:?}"
    );
    assert!(
        v[1].2.starts_with("numerics") && v[1].2.contains("first at index 7"),
        "{v:?}"
    );
    assert!(v[2].1, "the third candidate is accepted: {v:?}");
    assert!(out.best.is_some(), "an improvement was kept");
    assert_eq!(out.spend.retries, 1, "the 429 was retried");
    // The repair round, and the feedback each later round received.
    let purposes: Vec<&str> = out
        .transcript
        .iter()
        .map(|(r, _)| r.purpose.as_str())
        .collect();
    assert_eq!(purposes, vec!["propose", "repair", "propose", "propose"]);
    let round2 = &out.transcript[2].0.messages[0].content;
    assert!(
        round2.contains("kernel.cu(") && round2.contains("error: expected a ';'"),
        "the compile log goes back verbatim"
    );
    let round3 = &out.transcript[3].0.messages[0].content;
    assert!(
        round3.contains("first at index 7"),
        "the numeric failure goes back localised"
    );

    // The recording hides the key and replays offline to the same verdicts.
    let recorded = std::fs::read_to_string(&session).unwrap();
    assert!(!recorded.contains("sk-e2e-test-key-123456"));
    drop(server);
    let mut replayed = Client::new(Box::new(Replay::open(&session).unwrap()));
    let again = s.optimize(&mut replayed, None, &budget);
    assert_eq!(verdicts(&again), v, "the replay reproduces every verdict");
}

#[test]
fn a_reviewer_objection_is_answered_before_verification() {
    let s = setup();
    let rt = runtime();
    let proposer = rt.block_on(MockServer::start());
    let reviewer_server = rt.block_on(MockServer::start());
    script(
        &rt,
        &proposer,
        vec![
            openai(&proposal(&s.source("// kopt-fake: wrong y 3"))),
            // The answer to the objection: a revised candidate.
            openai(&{
                let mut v: serde_json::Value =
                    serde_json::from_str(&proposal(&s.source("// kopt-fake: speedup 1.2")))
                        .unwrap();
                v["answers"] = json!([{ "objection": 1, "response": "revised", "reason": "the tail is now handled" }]);
                v.to_string()
            }),
        ],
    );
    script(
        &rt,
        &reviewer_server,
        vec![ResponseTemplate::new(200).set_body_json(json!({
            "model": "claude-mock", "content": [{ "type": "text", "text": "{\"objections\": [{\"issue\": \"elements past the last multiple of 32 are never written\", \"severity\": \"blocking\", \"where\": \"write loop\"}]}" }],
            "usage": { "input_tokens": 10, "output_tokens": 10 }
        }))],
    );
    let mut c = client(&proposer);
    let mut rv = Client::new(Box::new(Anthropic::new(Endpoint {
        base_url: reviewer_server.uri(),
        model: "claude-mock".into(),
        key: None,
        timeout: Duration::from_secs(5),
    })));
    let budget = Budget {
        rounds: 1,
        ..Budget::default()
    };
    let out = s.optimize(&mut c, Some(&mut rv), &budget);
    let purposes: Vec<&str> = out
        .transcript
        .iter()
        .map(|(r, _)| r.purpose.as_str())
        .collect();
    assert_eq!(purposes, vec!["propose", "review", "answer-review"]);
    assert!(
        out.transcript[2]
            .0
            .messages
            .last()
            .unwrap()
            .content
            .contains("never written"),
        "the objection is put to the proposer"
    );
    let v = verdicts(&out);
    assert_eq!(v.len(), 1);
    assert!(
        v[0].1,
        "the revised candidate is verified and accepted: {v:?}"
    );
}

#[test]
fn the_same_error_three_times_escalates() {
    let s = setup();
    let rt = runtime();
    let server = rt.block_on(MockServer::start());
    script(
        &rt,
        &server,
        (0..5)
            .map(|_| openai(&proposal(&s.source("// kopt-fake: wrong y 5"))))
            .collect(),
    );
    let mut c = client(&server);
    let out = s.optimize(&mut c, None, &Budget::default());
    match &out.stop {
        Stop::Escalated { reason, suspicion } => {
            assert_eq!(reason, "the same numerics error came back 3 times");
            assert!(suspicion.contains("first at index 5"), "{suspicion}");
        }
        other => panic!("expected an escalation, got {other:?}"),
    }
    assert_eq!(out.tried.len(), 3);
}

#[test]
fn the_candidate_budget_stops_the_loop() {
    let s = setup();
    let rt = runtime();
    let server = rt.block_on(MockServer::start());
    let two = |a: &str, b: &str| {
        let mut v: serde_json::Value = serde_json::from_str(&proposal(&s.source(a))).unwrap();
        let second = serde_json::from_str::<serde_json::Value>(&proposal(&s.source(b))).unwrap()
            ["proposals"][0]
            .clone();
        v["proposals"].as_array_mut().unwrap().push(second);
        v.to_string()
    };
    script(
        &rt,
        &server,
        vec![
            openai(&two(
                "// kopt-fake: speedup 1.1",
                "// kopt-fake: speedup 1.2",
            )),
            openai(&two(
                "// kopt-fake: speedup 1.3",
                "// kopt-fake: speedup 1.4",
            )),
        ],
    );
    let mut c = client(&server);
    let budget = Budget {
        candidates: 3,
        ..Budget::default()
    };
    let out = s.optimize(&mut c, None, &budget);
    assert_eq!(
        out.stop,
        Stop::Budget {
            which: "candidates".into()
        }
    );
    assert_eq!(out.tried.len(), 3);
}

#[test]
fn a_backend_that_fails_for_good_stops_the_loop_with_its_error() {
    let s = setup();
    let rt = runtime();
    let server = rt.block_on(MockServer::start());
    script(
        &rt,
        &server,
        vec![ResponseTemplate::new(401)
            .set_body_json(json!({ "error": { "message": "invalid api key" } }))],
    );
    let mut c = client(&server);
    let out = s.optimize(&mut c, None, &Budget::default());
    assert_eq!(
        out.stop,
        Stop::Backend {
            error: "HTTP 401: invalid api key".into()
        }
    );
    let _ = c.name();
}

#[test]
fn cargo_kopt_optimize_leaves_a_pending_variant_with_its_record() {
    let ws = kopt_tests::ExampleWorkspace::new();
    let s = setup();
    // A scripted agent: whatever it is asked, one proposal 30% faster on the fake device.
    let agent = scripted_agent(&ws, &proposal(&s.source("// kopt-fake: speedup 1.3")));
    let run = |args: &[&str]| kopt_on_fake(&ws, args);
    // A case library holding the example's committed variants (each accepted one).
    let committed = std::fs::read_dir(ws.krate.join("kopt"))
        .unwrap()
        .flatten()
        .filter(|d| d.path().join("kopt.lock").is_file())
        .count();
    let o = run(&["cases", "import", &ws.krate.display().to_string()]);
    assert!(
        o.status.success()
            && String::from_utf8_lossy(&o.stdout).contains(&format!("{committed} added")),
        "{}",
        kopt_tests::text(&o)
    );
    let o = run(&[
        "optimize",
        "softmax",
        "--no-ncu",
        "--agent",
        &agent,
        "--budget",
        "rounds=1",
        "--run",
        "e2e",
        "--message-format",
        "json",
    ]);
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["kernels"][0]["pending"], "llm-kernels/softmax/sm_90",
        "{v}"
    );
    assert_eq!(v["kernels"][0]["accepted"], 1);
    let runs = ws.root.join("target/kopt/runs/e2e");
    assert!(runs.join("journal.jsonl").is_file(), "the run journal");
    assert!(
        std::fs::read_to_string(runs.join("sessions/softmax.jsonl"))
            .unwrap()
            .contains("\"purpose\":\"propose\""),
        "the recorded session"
    );
    let session = std::fs::read_to_string(runs.join("sessions/softmax.jsonl")).unwrap();
    assert!(
        session.contains("@sm_90 (accepted"),
        "similar cases reach the context: {}",
        session
            .split("Similar past cases")
            .nth(1)
            .unwrap_or("(no such section)")
            .chars()
            .take(400)
            .collect::<String>()
    );
    // One section of the recorded prompt, up to the next heading.
    let section = |heading: &str| {
        session
            .split(heading)
            .nth(1)
            .unwrap_or("")
            .split("## ")
            .next()
            .unwrap_or("")
            .to_string()
    };
    let similar = section("Similar past cases");
    assert!(
        similar.contains(": metrics ") && !similar.contains("by text alone"),
        "the reference snapshot's metric vector is part of the query: {similar}"
    );
    let snapshot = section("## Bottleneck snapshot");
    assert!(
        !snapshot.contains("not available") && snapshot.len() > 40,
        "the reference's snapshot reaches the context: {snapshot}"
    );
    assert!(
        snapshot.contains("; confidence ") && snapshot.contains("(case library: "),
        "its confidence comes from the accepted cases nearest to it: {snapshot}"
    );
    assert!(runs.join("profile/softmax/snapshot.json").is_file());
    // The winner went through the sanitizer pass before it became pending: on the fake
    // device every tool is recorded as skipped, never as clean.
    let pending = std::fs::read_to_string(
        ws.root
            .join("target/kopt/pending/llm-kernels/softmax/sm_90/pending.json"),
    )
    .unwrap();
    for tool in ["memcheck", "racecheck", "initcheck", "synccheck"] {
        assert!(
            pending.contains(&format!("\"sanitizer:{tool}\"")),
            "{tool} in the evidence: {pending}"
        );
    }
    assert!(
        pending.contains("skipped (the fake device runs no kernel to sanitize)"),
        "{pending}"
    );
    assert!(!pending.contains(": clean"), "{pending}");
    let o = run(&["cases", "list", "--message-format", "json"]);
    let listed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let tried = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"].as_str().is_some_and(|id| id.contains("e2e-r1c1")))
        .unwrap_or_else(|| panic!("the loop's candidate is a case now: {listed}"));
    assert!(
        tried["features"]["metrics"]
            .as_object()
            .is_some_and(|m| m.contains_key("dram_throughput_pct")),
        "with the reference snapshot's metrics: {tried}"
    );
    let o = run(&["pending", "--message-format", "json"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("e2e-r1c1"),
        "{}",
        kopt_tests::text(&o)
    );

    // The default agent needs no model: the heuristic's mechanical rewrites (of the
    // reference here; by default they apply to the accepted variant).
    let o = run(&[
        "optimize",
        "softmax",
        "--from-reference",
        "--budget",
        "rounds=2",
        "--run",
        "heuristic",
        "--message-format",
        "json",
    ]);
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["kernels"][0]["rounds"], 2, "{v}");
    let session = std::fs::read_to_string(
        ws.root
            .join("target/kopt/runs/heuristic/sessions/softmax.jsonl"),
    )
    .unwrap();
    assert!(
        session.contains("__restrict__") && session.contains("__launch_bounds__(256)"),
        "the heuristic's first step"
    );
    // On a kernel with tunables, the heuristic hands the loop a matrix around the defaults.
    let o = run(&[
        "optimize",
        "row_sum",
        "--budget",
        "rounds=1",
        "--run",
        "heuristic-matrix",
    ]);
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let journal = std::fs::read_to_string(
        ws.root
            .join("target/kopt/runs/heuristic-matrix/journal.jsonl"),
    )
    .unwrap();
    let swept = journal
        .lines()
        .filter(|l| l.contains("a point of r1c1's matrix, searched by the loop"))
        .count();
    assert_eq!(
        swept, 15,
        "16 points, the candidate's own among them: {journal}"
    );
    let o = run(&["optimize", "softmax", "--agent", "gpt4"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("`gpt4` is not an agent"));
}

#[test]
fn a_candidates_matrix_is_searched_and_its_best_point_wins() {
    let s = setup();
    let budget = Budget {
        rounds: 1,
        ..Budget::default()
    };
    let (out, events) = s.optimize_scripted(&[matrix_proposal(&s, &[1, 2, 4, 8], "")], &budget);
    assert_eq!(out.stop, Stop::Rounds, "{:?}", out.stop);
    let v = verdicts(&out);
    let ids: Vec<&str> = v.iter().map(|t| t.0.as_str()).collect();
    assert_eq!(
        ids,
        ["r1c1", "r1c1-m1", "r1c1-m2", "r1c1-m3"],
        "the candidate, then every other point of its matrix: {v:?}"
    );
    let points: Vec<String> = out
        .tried
        .iter()
        .map(|t| t.point.as_ref().map(|p| p.describe()).unwrap_or_default())
        .collect();
    assert_eq!(points, ["", "TILE=2", "TILE=4", "TILE=8"]);
    // Each point is judged against the best so far: TILE=2 and TILE=4 improve on it,
    // TILE=8 is slower than TILE=4 and fails the watchdog (data, not an escalation).
    assert!(v[0].1 && v[1].1 && v[2].1, "{v:?}");
    assert!(v[3].2.starts_with("watchdog"), "{v:?}");
    let (best, resolved, _) = out.best.as_ref().expect("a best");
    assert_eq!(best.id, "r1c1-m2");
    assert_eq!(best.defines["TILE"], 4);
    assert_eq!(resolved.proposal.defines["TILE"], 4);
    let sweep = out
        .best_sweep
        .as_ref()
        .expect("the sweep that chose the best");
    assert_eq!(sweep.base, "r1c1");
    assert_eq!(sweep.chosen.as_deref(), Some("r1c1-m2"));
    assert_eq!((sweep.planned, sweep.points.len()), (3, 4));
    assert_eq!(sweep.stopped, None);
    assert!(events
        .iter()
        .any(|e| matches!(e, run::Event::Sweep { id, points: 3 } if id == "r1c1")));
    assert!(events.iter().any(|e| matches!(
        e,
        run::Event::SweepDone { evaluated: 3, points: 3, best: Some(b), stopped: None, .. } if b == "r1c1-m2"
    )));
}

#[test]
fn a_matrix_s_points_reach_the_device_compiled_by_the_search_pool() {
    let s = setup();
    let budget = Budget {
        rounds: 1,
        ..Budget::default()
    };
    let (out, events) = s.optimize_scripted(&[matrix_proposal(&s, &[1, 2, 4], "")], &budget);
    assert_eq!(out.stop, Stop::Rounds, "{:?}", out.stop);
    // The candidate is compiled by the worker; each other point arrives with the code the
    // pool compiled for it (the fake device's pseudo-PTX of its own source and defines).
    let compiled: Vec<(String, bool)> = events
        .iter()
        .filter_map(|e| match e {
            run::Event::Verdict { id, version, .. } => Some((id.clone(), version.ptx.is_some())),
            _ => None,
        })
        .collect();
    assert_eq!(
        compiled,
        [
            ("r1c1".to_string(), false),
            ("r1c1-m1".to_string(), true),
            ("r1c1-m2".to_string(), true)
        ]
    );
    assert!(verdicts(&out).iter().all(|v| v.1), "{:?}", verdicts(&out));
}

#[test]
fn failing_points_are_data_not_an_escalation() {
    let s = setup();
    // Three points fail numerics the same way: three failures in a row and the same error
    // three times would each escalate an agent's proposals.
    let wrong = "// kopt-fake: wrong-if TILE=3 y\n// kopt-fake: wrong-if TILE=5 y\n// kopt-fake: wrong-if TILE=6 y";
    let budget = Budget {
        rounds: 2,
        ..Budget::default()
    };
    let (out, _) = s.optimize_scripted(
        &[
            matrix_proposal(&s, &[3, 5, 6, 4], wrong),
            proposal(&s.source("// kopt-fake: speedup 1.3")),
        ],
        &budget,
    );
    assert_eq!(out.stop, Stop::Rounds, "{:?}", out.stop);
    let v = verdicts(&out);
    let ids: Vec<&str> = v.iter().map(|t| t.0.as_str()).collect();
    assert_eq!(
        ids,
        ["r1c1", "r1c1-m1", "r1c1-m2", "r1c1-m3", "r1c1-m4", "r2c1"],
        "{v:?}"
    );
    for failed in &v[1..4] {
        assert!(
            failed.2.starts_with("numerics"),
            "recorded with its verdict: {v:?}"
        );
    }
    assert!(v[4].1, "TILE=4 verifies: {v:?}");
    // The second round's context carries the sweep, one line per point.
    let round2 = &out.transcript[1].0.messages[0].content;
    assert!(
        round2.contains("r1c1-m1 (TILE=3): rejected: numerics")
            && round2.contains("r1c1-m4 (TILE=4): verified"),
        "{round2}"
    );
}

#[test]
fn the_candidate_budget_cuts_a_matrix_short_and_keeps_the_best_so_far() {
    let s = setup();
    let budget = Budget {
        candidates: 3,
        ..Budget::default()
    };
    let (out, events) = s.optimize_scripted(&[matrix_proposal(&s, &[2, 4, 8], "")], &budget);
    assert_eq!(
        out.stop,
        Stop::Budget {
            which: "candidates".into()
        }
    );
    let ids: Vec<String> = out.tried.iter().map(|t| t.id.clone()).collect();
    assert_eq!(ids, ["r1c1", "r1c1-m1", "r1c1-m2"], "TILE=8 never ran");
    assert_eq!(out.best.as_ref().unwrap().0.defines["TILE"], 4);
    let sweep = out.best_sweep.as_ref().unwrap();
    assert_eq!(sweep.chosen.as_deref(), Some("r1c1-m2"));
    assert_eq!(
        sweep.stopped.as_deref(),
        Some("the candidates budget ran out")
    );
    assert!(events.iter().any(|e| matches!(
        e,
        run::Event::SweepDone {
            evaluated: 2,
            points: 3,
            stopped: Some(_),
            ..
        }
    )));
}

#[test]
fn a_wrong_candidate_s_matrix_is_not_searched() {
    let s = setup();
    let budget = Budget {
        rounds: 1,
        ..Budget::default()
    };
    let (out, events) = s.optimize_scripted(
        &[matrix_proposal(
            &s,
            &[2, 4],
            "// kopt-fake: wrong-if TILE=1 y",
        )],
        &budget,
    );
    assert_eq!(out.tried.len(), 1, "{:?}", verdicts(&out));
    assert!(out.best.is_none());
    assert!(events.iter().any(|e| matches!(
        e,
        run::Event::SweepDone { evaluated: 0, points: 2, stopped: Some(why), .. } if why.contains("failed the numerics fence")
    )));
}

#[test]
fn cargo_kopt_optimize_records_the_matrix_search_in_the_rationale() {
    let ws = kopt_tests::ExampleWorkspace::new();
    let s = setup();
    let agent = scripted_agent(
        &ws,
        &matrix_proposal(&s, &[1, 2, 4, 8], "// kopt-fake: wrong-if TILE=2 y"),
    );
    // The matrix is over the reference's source (the accepted variant's launch rule names
    // defines this candidate does not set).
    let o = optimize_softmax(&ws, &agent, "sweep", &["--from-reference"]);
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["kernels"][0]["pending"],
        "llm-kernels/softmax/sm_90",
        "{v}\n{}",
        journal_of(&ws, "sweep")
    );
    let pending = ws
        .root
        .join("target/kopt/pending/llm-kernels/softmax/sm_90");
    let variant = std::fs::read_to_string(pending.join("variant.toml")).unwrap();
    assert!(
        variant.contains("sweep-r1c1-m2") && variant.contains("TILE = 4"),
        "{variant}"
    );
    let r = kopt_spec::files::Rationale::parse(
        &std::fs::read_to_string(pending.join("rationale.json")).unwrap(),
    )
    .unwrap();
    let search = r.search.as_ref().expect("the search is recorded");
    assert_eq!(
        search.chosen, "r1c1-m2",
        "TILE=4, the fastest that verified"
    );
    let outcomes: Vec<(&str, &str)> = search
        .points
        .iter()
        .map(|p| {
            (
                p.point.as_str(),
                p.outcome.split([' ', ':']).next().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            ("r1c1", "verified"),
            ("r1c1-m1", "numerics"),
            ("r1c1-m2", "verified"),
            ("r1c1-m3", "watchdog")
        ]
    );
    assert!(
        search.points[2].times_us.len() == 4 && search.points[1].times_us.is_empty(),
        "every declared shape's time of a timed point: {search:?}"
    );
    let md = r.render_markdown();
    assert!(
        md.contains("chosen by the optimisation loop's search over the agent's parameter matrix")
            && md.contains("## Parameter search")
            && md.contains("| **r1c1-m2** (chosen) | 4 | verified |"),
        "{md}"
    );
    let journal =
        std::fs::read_to_string(ws.root.join("target/kopt/runs/sweep/journal.jsonl")).unwrap();
    assert!(
        journal.contains("a point of r1c1's matrix, searched by the loop: TILE=8"),
        "every point is in the journal"
    );
    // A rejected point's times stay in the journal (the watchdog's point was timed).
    let rejected: serde_json::Value = journal
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["event"] == "verdict" && e["candidate"] == "r1c1-m3")
        .expect("the watchdog point's verdict");
    assert_eq!(rejected["failure_class"], "watchdog");
    assert!(
        rejected["times_us"]
            .as_object()
            .is_some_and(|t| t.len() >= 4),
        "{rejected}"
    );
}

#[test]
fn the_loop_starts_from_the_accepted_variant_and_a_candidate_must_beat_it() {
    let ws = kopt_tests::ExampleWorkspace::new();
    let s = setup();
    let run = |args: &[&str]| kopt_on_fake(&ws, args);
    // An accepted variant 1.2x faster than the reference on the fake device.
    ws.pin_softmax_variant(
        Path::new(env!("CARGO_BIN_EXE_cargo-kopt")),
        "fast",
        "// kopt-fake: speedup 1.2",
    );
    // 1.1x the reference: faster than the reference, slower than the accepted variant.
    let slower = scripted_agent(&ws, &proposal(&s.source("// kopt-fake: speedup 1.1")));
    let optimize = |agent: &str, run_id: &str, more: &[&str]| {
        let o = optimize_softmax(&ws, agent, run_id, more);
        assert!(o.status.success(), "{}", kopt_tests::text(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let v = optimize(&slower, "slower", &[]);
    let runs = ws.root.join("target/kopt/runs");
    let journal = std::fs::read_to_string(runs.join("slower/journal.jsonl")).unwrap();
    assert_eq!(
        v["kernels"][0]["pending"],
        serde_json::Value::Null,
        "{v}\n{journal}"
    );
    let baseline = journal
        .lines()
        .find(|l| l.contains("\"event\":\"baseline\""))
        .unwrap_or_else(|| panic!("the accepted variant is verified first: {journal}"));
    assert!(
        baseline.contains("\"variant\":\"fast\"") && baseline.contains("\"passed\":true"),
        "{baseline}"
    );
    assert!(
        journal.contains("\"failure_class\":\"watchdog\""),
        "slower than the accepted variant is the watchdog's: {journal}"
    );
    let session = std::fs::read_to_string(runs.join("slower/sessions/softmax.jsonl")).unwrap();
    assert!(
        session.contains("speedup 1.2"),
        "the agent is shown the accepted variant's source as the current best"
    );

    // With a looser watchdog (`--threshold 10`: 10% slower than the best passes) the same
    // candidate passes every fence, and is still no win.
    let v = optimize(&slower, "loose", &["--threshold", "10"]);
    assert_eq!(v["kernels"][0]["pending"], serde_json::Value::Null, "{v}");
    assert_eq!(v["kernels"][0]["accepted"], 1, "{v}");

    // From the reference, the same candidate wins.
    let v = optimize(&slower, "from-reference", &["--from-reference"]);
    assert_eq!(
        v["kernels"][0]["pending"], "llm-kernels/softmax/sm_90",
        "{v}"
    );
    let o = run(&["pending", "--message-format", "json"]);
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("\"baseline\""),
        "measured against the reference only: {}",
        kopt_tests::text(&o)
    );

    // 1.32x the reference beats the accepted variant: pending, with what it had to beat.
    let faster = scripted_agent(&ws, &proposal(&s.source("// kopt-fake: speedup 1.32")));
    let v = optimize(&faster, "faster", &[]);
    assert_eq!(
        v["kernels"][0]["pending"],
        "llm-kernels/softmax/sm_90",
        "{v}\n{}",
        std::fs::read_to_string(runs.join("faster/journal.jsonl")).unwrap()
    );
    let pending = ws
        .root
        .join("target/kopt/pending/llm-kernels/softmax/sm_90");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(pending.join("pending.json")).unwrap())
            .unwrap();
    assert_eq!(meta["baseline"]["variant"], "fast", "{meta}");
    let rationale = std::fs::read_to_string(pending.join("rationale.json")).unwrap();
    assert!(
        rationale.contains("The optimisation loop started from `fast`, the variant accepted for sm_90, verified again in the same run (1.10x in geometric mean"),
        "{rationale}"
    );
    // The reviewer sees it before deciding.
    let mut review = ws
        .kopt_on_fake(
            Path::new(env!("CARGO_BIN_EXE_cargo-kopt")),
            &["review", "softmax"],
        )
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(review.stdin.as_mut().unwrap(), b"q\n").unwrap();
    let o = review.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .contains("had to beat `fast`, accepted for sm_90 when the run started"),
        "{}",
        kopt_tests::text(&o)
    );
}

#[test]
fn the_run_budget_is_shared_by_the_kernels_of_a_run() {
    let ws = kopt_tests::ExampleWorkspace::new();
    let s = setup();
    // Whatever it is asked, one proposal: one candidate per round.
    let agent = scripted_agent(&ws, &proposal(&s.source("// kopt-fake: speedup 1.3")));
    let run = |args: &[&str]| kopt_on_fake(&ws, args);
    let o = run(&[
        "optimize",
        "softmax",
        "rmsnorm",
        "--no-ncu",
        "--from-reference",
        "--agent",
        &agent,
        "--budget",
        "rounds=2",
        "--run-budget",
        "candidates=1",
        "--run",
        "shared",
        "--message-format",
        "json",
    ]);
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["spent"]["candidates"], 1, "{v}");
    assert_eq!(v["spent"]["tokens"], 1000, "one reply: {v}");
    let kernels = v["kernels"].as_array().unwrap();
    let (first, second) = (&kernels[0], &kernels[1]);
    assert_eq!(
        first["rounds"], 2,
        "the first kernel's second round finds the run's budget spent: {v}"
    );
    assert_eq!(first["stop"]["which"], "run's candidates", "{v}");
    assert_eq!(second["rounds"], 0, "{v}");
    assert_eq!(second["stop"]["which"], "run's candidates", "{v}");
    let journal =
        std::fs::read_to_string(ws.root.join("target/kopt/runs/shared/journal.jsonl")).unwrap();
    assert!(
        journal.contains("\"run_budget\":{\"candidates\":1")
            && journal.contains("2 kernel(s); 1 candidate(s), 1000 token(s)"),
        "{journal}"
    );

    let o = run(&["optimize", "softmax", "--run-budget", "rounds=2"]);
    assert_eq!(o.status.code(), Some(2), "{}", kopt_tests::text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("rounds are per kernel (`--budget rounds=N`)"),
        "{}",
        kopt_tests::text(&o)
    );
}

#[test]
fn a_win_must_clear_the_timing_noise_measured_in_the_run() {
    let ws = kopt_tests::ExampleWorkspace::new();
    let s = setup();
    // 4.5% faster than the reference on every shape.
    let agent = scripted_agent(&ws, &proposal(&s.source("// kopt-fake: speedup 1.045")));
    let optimize = |run_id: &str| {
        let o = optimize_softmax(&ws, &agent, run_id, &[]);
        assert!(o.status.success(), "{}", kopt_tests::text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (v, journal_of(&ws, run_id))
    };
    // A quiet device: the starting version (the accepted variant) moves by nothing between
    // two jobs, and 4.5% is a win.
    let (v, journal) = optimize("quiet");
    let k = &v["kernels"][0];
    assert_eq!(k["noise"]["version"], ws.accepted_softmax().as_str(), "{v}");
    assert!(k["noise"]["deviations"]
        .as_object()
        .unwrap()
        .values()
        .all(|d| d.as_f64() == Some(0.0)));
    assert_eq!(k["pending"], "llm-kernels/softmax/sm_90", "{v}");
    assert!(journal.contains("\"event\":\"noise\""), "{journal}");

    // The reference's time now moves by 4% between two jobs (the fake device's jitter;
    // the accepted variant is stale after the edit, so the loop starts from the
    // reference): 4.5% is within twice the noise, and not a win.
    let cu = ws.krate.join("kernels/softmax.cu");
    let text = std::fs::read_to_string(&cu).unwrap();
    std::fs::write(&cu, format!("{text}\n// kopt-fake: jitter 0.02\n")).unwrap();
    let (v, journal) = optimize("noisy");
    let k = &v["kernels"][0];
    assert_eq!(k["noise"]["version"], "reference", "{v}");
    let largest = k["noise"]["deviations"]
        .as_object()
        .unwrap()
        .values()
        .map(|d| d.as_f64().unwrap().abs())
        .fold(0.0, f64::max);
    // 1.02 / 0.98 or 0.98 / 1.02, as the worker's evaluations of the reference fall.
    assert!((0.039..0.041).contains(&largest), "{largest}");
    assert_eq!(k["pending"], serde_json::Value::Null, "{v}\n{journal}");
    assert_eq!(k["accepted"], 1, "it passed every fence: {v}");
    let session = std::fs::read_to_string(
        ws.root
            .join("target/kopt/runs/noisy/sessions/softmax.jsonl"),
    )
    .unwrap();
    assert!(
        session.contains("timing noise: the same version timed in two jobs moved by up to 4.")
            && session.contains(", so a win needs 8.2% on some shape"),
        "the agent is told: {}",
        session
            .split("timing noise")
            .nth(1)
            .unwrap_or(&session)
            .chars()
            .take(600)
            .collect::<String>()
    );
}

/// `--min-gain` and `--min-uniform-gain` set what a candidate must gain to be a new best;
/// the run records them and the winner's rationale states them.
#[test]
fn the_win_thresholds_are_set_on_the_command_line_and_stated_in_the_rationale() {
    let ws = kopt_tests::ExampleWorkspace::new();
    let s = setup();
    // 0.7% faster than the reference on every shape: under the default 1% in geometric mean.
    let agent = scripted_agent(&ws, &proposal(&s.source("// kopt-fake: speedup 1.007")));
    let optimize = |run_id: &str, extra: &[&str]| {
        let mut args = vec!["--from-reference"];
        args.extend_from_slice(extra);
        optimize_softmax(&ws, &agent, run_id, &args)
    };
    let journal = |run_id: &str| journal_of(&ws, run_id);

    let o = optimize("defaults", &[]);
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["kernels"][0]["pending"], serde_json::Value::Null, "{v}");
    assert_eq!(v["kernels"][0]["accepted"], 1, "it passed every fence: {v}");
    assert!(
        journal("defaults").contains("\"min_gain\":0.03,\"min_uniform_gain\":0.01"),
        "{}",
        journal("defaults")
    );

    let o = optimize("lower", &["--min-uniform-gain", "0.5"]);
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["kernels"][0]["pending"], "llm-kernels/softmax/sm_90",
        "{v}"
    );
    assert!(journal("lower").contains("\"min_uniform_gain\":0.005"));
    let rationale = std::fs::read_to_string(
        ws.root
            .join("target/kopt/pending/llm-kernels/softmax/sm_90/rationale.json"),
    )
    .unwrap();
    assert!(
        rationale.contains("by more than 3.0% on some shape, or by more than 0.5% in geometric mean and slower on none"),
        "{rationale}"
    );

    // A threshold that is no percentage is refused before anything runs.
    let o = optimize("bad", &["--min-gain", "150"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("a gain threshold is a percentage from 0 to below 100"),
        "{err}"
    );
}

/// An agent script that answers its Nth request with `replies[N-1]` (the last reply from
/// then on), counting requests in `agent-count`, and that kills the `cargo kopt` process
/// asking it (its parent, with SIGKILL) on request `kill_at`, when there is such a file.
fn agent_that_kills(ws: &kopt_tests::ExampleWorkspace, replies: &[String]) -> String {
    let dir = ws.root.join("killing-agent");
    std::fs::create_dir_all(&dir).unwrap();
    for (i, text) in replies.iter().enumerate() {
        let reply = json!({ "text": text, "usage": { "input_tokens": 900, "output_tokens": 100 } });
        std::fs::write(dir.join(format!("reply-{}.json", i + 1)), reply.to_string()).unwrap();
    }
    let script = dir.join("agent.sh");
    let d = dir.display();
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncat > /dev/null\nn=$(( $(cat '{d}/agent-count' 2>/dev/null || echo 0) + 1 ))\necho $n > '{d}/agent-count'\nif [ -e '{d}/kill-at-'$n ]; then kill -9 $PPID; exit 0; fi\nr=$n\nwhile [ ! -e '{d}/reply-'$r.json ]; do r=$((r - 1)); done\ncat '{d}/reply-'$r.json\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    format!("cmd:{}", script.display())
}

/// An [`agent_that_kills`] whose three replies propose the reference with these fake
/// speedups, set to be killed while asking for its second round (after the first
/// candidate's verdict): the agent's command and the folder it counts requests in.
fn agent_killed_in_round_2(
    ws: &kopt_tests::ExampleWorkspace,
    s: &Setup,
    speedups: [&str; 3],
) -> (String, PathBuf) {
    let replies = speedups.map(|x| proposal(&s.source(&format!("// kopt-fake: speedup {x}"))));
    let agent = agent_that_kills(ws, &replies);
    let agent_dir = ws.root.join("killing-agent");
    std::fs::write(agent_dir.join("kill-at-2"), "").unwrap();
    (agent, agent_dir)
}

/// `cargo kopt optimize softmax --no-ncu EXTRA.. --agent AGENT --budget rounds=2 FLAG RUN
/// --message-format json` on the fake device (`FLAG`: `--run` or `--resume`).
fn optimize_two_rounds(
    ws: &kopt_tests::ExampleWorkspace,
    agent: &str,
    extra: &[&str],
    flag: &str,
    run: &str,
) -> std::process::Output {
    let mut args = vec!["optimize", "softmax", "--no-ncu"];
    args.extend_from_slice(extra);
    args.extend([
        "--agent",
        agent,
        "--budget",
        "rounds=2",
        flag,
        run,
        "--message-format",
        "json",
    ]);
    kopt_on_fake(ws, &args)
}

/// The journal's events, parsed.
fn events(ws: &kopt_tests::ExampleWorkspace, run_id: &str) -> Vec<serde_json::Value> {
    journal_of(ws, run_id)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Per the journal: (candidates, accepted, rejected), each candidate by its last verdict,
/// replies without a proposal left out (counted here independently of kopt's own code).
fn journal_tally(events: &[serde_json::Value]) -> (usize, usize, usize) {
    let mut last = std::collections::BTreeMap::new();
    for e in events.iter().filter(|e| e["event"] == "verdict") {
        if e["failure_class"] != "malformed" {
            last.insert(
                (e["kernel"].to_string(), e["candidate"].to_string()),
                e["passed"].as_bool().unwrap(),
            );
        }
    }
    let accepted = last.values().filter(|p| **p).count();
    (last.len(), accepted, last.len() - accepted)
}

fn summary_of(events: &[serde_json::Value]) -> String {
    events
        .iter()
        .rev()
        .find(|e| e["event"] == "run_finished")
        .map(|e| e["summary"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

#[test]
fn a_killed_run_keeps_its_verdicts_and_resumes_without_evaluating_them_again() {
    let ws = kopt_tests::ExampleWorkspace::new();
    let (agent, agent_dir) = agent_killed_in_round_2(&ws, &setup(), ["1.3", "1.3", "1.5"]);
    let asked = || {
        std::fs::read_to_string(agent_dir.join("agent-count"))
            .unwrap()
            .trim()
            .to_string()
    };
    let optimize = |flag: &str| optimize_two_rounds(&ws, &agent, &[], flag, "killed");
    let o = optimize("--run");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&o.status),
        Some(9),
        "{}",
        kopt_tests::text(&o)
    );
    let before = events(&ws, "killed");
    let kinds: Vec<&str> = before
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert!(
        !kinds.contains(&"run_finished") && !kinds.contains(&"kernel_finished"),
        "{kinds:?}"
    );
    for kind in ["kernel_started", "prompt", "reply", "candidate", "verdict"] {
        assert!(
            kinds.contains(&kind),
            "{kind} reached the journal: {kinds:?}"
        );
    }
    let verdict = before
        .iter()
        .find(|e| e["event"] == "verdict" && e["candidate"] == "r1c1")
        .expect("the first candidate's verdict is in the journal");
    assert_eq!(verdict["passed"], true, "{verdict}");
    let run_dir = ws.root.join("target/kopt/runs/killed");
    let full: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(run_dir.join(verdict["artefacts"][0].as_str().unwrap())).unwrap(),
    )
    .unwrap();
    assert_eq!(full["candidate"], "r1c1");
    assert_eq!(
        full["verdict"]["accepted"], true,
        "the verdict in full: {full}"
    );
    let candidate = before
        .iter()
        .find(|e| e["event"] == "candidate" && e["candidate"] == "r1c1")
        .unwrap();
    assert!(
        std::fs::read_to_string(run_dir.join(candidate["artefacts"][0].as_str().unwrap()))
            .unwrap()
            .contains("kopt-fake: speedup 1.3"),
        "its source"
    );
    assert_eq!(asked(), "2");

    // Resumed: every evaluation the resumed run makes lands in an emptied cache.
    let cache = ws.root.join("target/kopt/cache/eval");
    std::fs::remove_dir_all(&cache).unwrap();
    let o = optimize("--resume");
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let k = &v["kernels"][0];
    assert_eq!(k["rounds"], 2, "{v}");
    assert_eq!(
        k["resumed"],
        json!({
            "finished_before": false,
            "start_from_record": true,
            "exchanges": 1,
            "verdicts": 1,
            "live_from": [1, "the recording ends after 1 exchange(s)"]
        }),
        "{v}"
    );
    assert_eq!(asked(), "3", "the agent was asked round 2 only");
    let evaluated = std::fs::read_dir(&cache).unwrap().count();
    assert_eq!(
        evaluated, 1,
        "only round 2's candidate reached the device: neither r1c1 nor the start was measured again"
    );
    assert_eq!(k["pending"], "llm-kernels/softmax/sm_90", "{v}");
    let after = events(&ws, "killed");
    let verdicts_of = |id: &str| {
        after
            .iter()
            .filter(|e| e["event"] == "verdict" && e["candidate"] == id)
            .count()
    };
    assert_eq!((verdicts_of("r1c1"), verdicts_of("r2c1")), (1, 1));
    assert_eq!(
        after.iter().filter(|e| e["event"] == "prompt").count(),
        2,
        "each exchange once"
    );
    assert!(after.iter().any(|e| e["event"] == "resumed"
        && e["detail"].as_str().unwrap().contains(
            "1 exchange(s) answered from the recorded session and 1 verdict(s) from the journal"
        )));
    // The summary's counts are the journal's.
    let (candidates, accepted, rejected) = journal_tally(&after);
    assert_eq!((candidates, accepted, rejected), (2, 2, 0));
    assert_eq!(
        (k["accepted"].as_u64(), k["rejected"].as_u64()),
        (Some(2), Some(0))
    );
    assert_eq!(
        v["counts"],
        json!({"candidates": 2, "accepted": 2, "rejected": 0}),
        "{v}"
    );
    assert_eq!(v["spent"]["candidates"], 2, "{v}");
    let summary = summary_of(&after);
    assert!(
        summary.starts_with("1 kernel(s); 2 candidate(s), 2000 token(s)")
            && summary.ends_with("; 2 accepted, 0 rejected"),
        "{summary}"
    );

    // A kernel whose loop had finished is not run again.
    let o = optimize("--resume");
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let again: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        again["kernels"][0]["resumed"]["finished_before"], true,
        "{again}"
    );
    assert_eq!(again["kernels"][0]["pending"], k["pending"]);
    assert_eq!(asked(), "3");
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 1);
    let last = events(&ws, "killed");
    assert_eq!(journal_tally(&last), (2, 2, 0));
    assert!(summary_of(&last).contains("2 candidate(s)"));

    // Resuming needs the run's options, and a run that exists.
    let o = kopt_on_fake(
        &ws,
        &[
            "optimize",
            "softmax",
            "--no-ncu",
            "--agent",
            "heuristic",
            "--resume",
            "killed",
        ],
    );
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("cannot be resumed by this command: agent: the run has"),
        "{}",
        kopt_tests::text(&o)
    );
    let o = kopt_on_fake(&ws, &["optimize", "softmax", "--resume", "never-started"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("run `never-started` has no journal"),
        "{}",
        kopt_tests::text(&o)
    );
}

#[test]
fn a_resumed_run_whose_context_changed_asks_the_agent_again() {
    let ws = kopt_tests::ExampleWorkspace::new();
    let (agent, _) = agent_killed_in_round_2(&ws, &setup(), ["1.3", "1.3", "1.4"]);
    let optimize =
        |flag: &str| optimize_two_rounds(&ws, &agent, &["--from-reference"], flag, "changed");
    let o = optimize("--run");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&o.status),
        Some(9),
        "{}",
        kopt_tests::text(&o)
    );
    // The reference changes: its source is in the agent's first question.
    let cu = ws.krate.join("kernels/softmax.cu");
    let text = std::fs::read_to_string(&cu).unwrap();
    std::fs::write(&cu, format!("{text}\n// edited after the kill\n")).unwrap();
    let o = optimize("--resume");
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let resumed = &v["kernels"][0]["resumed"];
    assert_eq!(resumed["start_from_record"], false, "{v}");
    assert_eq!(resumed["exchanges"], 0, "{v}");
    assert_eq!(resumed["verdicts"], 0, "{v}");
    let why = resumed["live_from"][1].as_str().unwrap();
    assert!(
        why.starts_with("the context changed: message 1 differs from line"),
        "{why}"
    );
    let journal = journal_of(&ws, "changed");
    assert!(
        journal.contains("the live agent answers from exchange 0: the context changed")
            && journal.contains("sessions/softmax.superseded-1.jsonl"),
        "{journal}"
    );
    assert!(
        journal.contains("the loop's start is measured again: the kernel's reference or annotation changed since"),
        "{journal}"
    );
    // r1c1 was proposed again on the new reference and verified again: two verdicts, the
    // summary counting it once.
    let all = events(&ws, "changed");
    assert_eq!(
        all.iter()
            .filter(|e| e["event"] == "verdict" && e["candidate"] == "r1c1")
            .count(),
        2
    );
    assert_eq!(journal_tally(&all), (2, 2, 0));
    assert_eq!(v["counts"]["candidates"], 2, "{v}");
    assert!(
        summary_of(&all).contains("2 candidate(s)"),
        "{}",
        summary_of(&all)
    );
}

/// Two proposals in one reply: one that does not compile, then one 30% faster.
fn broken_then_faster(s: &Setup) -> String {
    let mut two: serde_json::Value =
        serde_json::from_str(&proposal(&s.source("// kopt-fake: speedup 1.3"))).unwrap();
    let mut broken = two["proposals"][0].clone();
    broken["candidate"]["source"] = json!(s.source("// kopt-fake: compile-error no such thing"));
    two["proposals"].as_array_mut().unwrap().insert(0, broken);
    two.to_string()
}

#[test]
fn the_run_summary_counts_what_the_journal_holds() {
    let ws = kopt_tests::ExampleWorkspace::new();
    let s = setup();
    // Two proposals a round: one that does not compile, one 30% faster.
    let agent = scripted_agent(&ws, &broken_then_faster(&s));
    let o = optimize_softmax(&ws, &agent, "counted", &["--from-reference"]);
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let all = events(&ws, "counted");
    let (candidates, accepted, rejected) = journal_tally(&all);
    assert_eq!((candidates, accepted, rejected), (2, 1, 1));
    let k = &v["kernels"][0];
    assert_eq!(
        (k["accepted"].as_u64(), k["rejected"].as_u64()),
        (Some(accepted as u64), Some(rejected as u64)),
        "{v}"
    );
    assert_eq!(
        v["counts"],
        json!({"candidates": candidates, "accepted": accepted, "rejected": rejected})
    );
    // No run budget was given: what the run spent is counted all the same.
    assert_eq!(v["spent"]["candidates"], candidates, "{v}");
    let summary = summary_of(&all);
    assert!(
        summary.starts_with(&format!("1 kernel(s); {candidates} candidate(s), "))
            && summary.ends_with(&format!("; {accepted} accepted, {rejected} rejected")),
        "{summary}"
    );
}

#[test]
fn a_candidate_that_does_not_compile_is_refused_on_the_cpu_and_the_winner_records_its_compile() {
    // Two proposals in one round: one the compiler refuses, one 30% faster. The first gets
    // a compile verdict from the parent's compile fence, never reaching the worker; the
    // winner's rationale records what NVRTC made of it, for `cargo kopt check` to compare
    // with later.
    let ws = kopt_tests::ExampleWorkspace::new();
    let s = setup();
    let agent = scripted_agent(&ws, &broken_then_faster(&s));
    let o = optimize_softmax(&ws, &agent, "fenced", &["--from-reference"]);
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let all = events(&ws, "fenced");
    let verdicts: Vec<&serde_json::Value> =
        all.iter().filter(|e| e["event"] == "verdict").collect();
    assert_eq!(verdicts.len(), 2, "{verdicts:?}");
    let v = verdicts[0];
    assert_eq!(
        (&v["passed"], &v["failure_class"]),
        (&json!(false), &json!("compile")),
        "{v}"
    );
    let detail = v["detail"].as_str().unwrap();
    assert!(detail.starts_with("compile: kernel.cu("), "{detail}");
    assert!(detail.contains("error: no such thing"), "{detail}");
    assert!(
        detail.ends_with("(refused by NVRTC on the CPU: no GPU worker ran it)"),
        "{detail}"
    );
    assert_eq!(verdicts[1]["passed"], true, "{:?}", verdicts[1]);
    let rationale = kopt_spec::files::Rationale::parse(
        &std::fs::read_to_string(
            ws.root
                .join("target/kopt/pending/llm-kernels/softmax/sm_90/rationale.json"),
        )
        .unwrap(),
    )
    .unwrap();
    if kopt::gpu::nvrtc_for_test() {
        let c = rationale.compile.expect("the compile figures are recorded");
        let (major, minor) = kopt::nvrtc_version().unwrap();
        assert_eq!(c.nvrtc, format!("{major}.{minor}"));
        assert_eq!(c.arch, "sm_90");
        assert!(c.registers > 0 && !c.spills(), "{c:?}");
    } else {
        assert_eq!(rationale.compile, None, "no NVRTC, no figures");
    }
}

#[test]
fn the_loop_s_evaluator_refuses_a_module_without_the_entry_before_the_worker() {
    // A macro-made entry passes the lexical check of proposals; only NVRTC can say the
    // module lacks it. The evaluator compiles for sm_90 as on a GPU; the fake worker behind
    // it would run whatever it were sent.
    if !kopt::gpu::nvrtc_for_test() {
        return;
    }
    let s = setup();
    let mut engine = s.engine();
    let mut gpu = s.gpu(&mut engine);
    gpu.target = Some(("sm_90".into(), false));
    let k = s.kernel();
    let signature = "extern \"C\" __global__ void softmax_f32(";
    assert!(k.reference.text.contains(signature));
    let mut candidate = KernelVersion::reference(&k.spec, &k.reference.text);
    candidate.id = "r1c1".into();
    candidate.source = k.reference.text.replace(
        signature,
        "#define SOFTMAX_KERNEL(name) extern \"C\" __global__ void name\nSOFTMAX_KERNEL(softmax_f32_v2)(",
    );
    assert!(kopt_spec::source::may_define_entry(
        &candidate.source,
        "softmax_f32"
    ));
    let verdict = run::Evaluate::evaluate(&mut gpu, &mut candidate, None, None);
    assert!(!verdict.accepted);
    assert_eq!(verdict.fences(), vec![kopt_engine::verdict::Fence::Compile]);
    let summary = verdict.summary();
    assert!(
        summary.contains("has no kernel `softmax_f32`")
            && summary.contains("it holds `softmax_f32_v2`"),
        "{summary}"
    );
    assert!(summary.contains("no GPU worker ran it"), "{summary}");
    assert!(
        verdict.shapes.is_empty(),
        "nothing was measured: {verdict:?}"
    );
    // With its entry, the same evaluator sends it on, and the worker judges it.
    candidate.source = format!("{}\n// kopt-fake: speedup 1.3\n", k.reference.text);
    let verdict = run::Evaluate::evaluate(&mut gpu, &mut candidate, None, None);
    assert!(verdict.accepted, "{}", verdict.summary());
    assert!(!verdict.shapes.is_empty());
}

#[test]
fn a_candidate_slower_on_one_shape_becomes_the_pending_winner_of_the_region_it_wins() {
    let ws = kopt_tests::ExampleWorkspace::new();
    let s = setup();
    // 30% faster than the reference, but three times slower on the long rows of 16x65536.
    let source = s.source("// kopt-fake: speedup 1.3\n// kopt-fake: slower-on rows=16 3");
    let agent = scripted_agent(&ws, &proposal(&source));
    // `--run regions`, or `--resume regions`: the run's JSON.
    let optimize = |how: &str| -> serde_json::Value {
        let o = kopt_on_fake(
            &ws,
            &[
                "optimize",
                "softmax",
                "--no-ncu",
                "--agent",
                &agent,
                "--budget",
                "rounds=1",
                how,
                "regions",
                "--message-format",
                "json",
            ],
        );
        assert!(o.status.success(), "{}", kopt_tests::text(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    // The folders of the kernel's pending variants.
    let pending_dirs = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(ws.root.join("target/kopt/pending/llm-kernels/softmax"))
            .unwrap()
            .flatten()
            .map(|d| d.path())
            .filter(|p| p.join("pending.json").is_file())
            .collect()
    };
    let v = optimize("--run");
    let k = &v["kernels"][0];
    assert_eq!(
        k["pending"],
        serde_json::Value::Null,
        "no winner on every shape: {v}"
    );
    let label = k["regional_pending"][0]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"));
    let region = label
        .strip_prefix("llm-kernels/softmax/sm_90 where ")
        .unwrap_or_else(|| panic!("{label}"));
    // The condition holds on the three shapes it won, not on rows=16 cols=65536.
    let spec = &s.kernel().spec;
    let expr = spec.parse_region(region).unwrap();
    for shape in &spec.shapes {
        let args = spec.shape_args(shape);
        assert_eq!(
            spec.region_holds(&expr, &args),
            args[0] != 16,
            "{region} on {args:?}"
        );
    }
    let listed = kopt_on_fake(&ws, &["pending", "--message-format", "json"]);
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let text = listed.to_string();
    assert!(text.contains(region), "{text}");
    let pending_dir = pending_dirs().remove(0);
    assert!(
        pending_dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("sm_90@"),
        "{pending_dir:?}"
    );
    let r = kopt_spec::files::Rationale::parse(
        &std::fs::read_to_string(pending_dir.join("rationale.json")).unwrap(),
    )
    .unwrap();
    assert!(
        r.summary.contains(&format!(
            "It is a winner where `{region}` holds, and only there"
        )) && r.summary.contains("kopt proposed"),
        "{}",
        r.summary
    );
    let journal_path = ws.root.join("target/kopt/runs/regions/journal.jsonl");
    let journal = std::fs::read_to_string(&journal_path).unwrap();
    assert!(
        journal.contains("-region"),
        "the second verification is journaled"
    );

    // Killed after the kernel's end was journaled, before its winners were saved: the
    // resumed run saves the region's winner from the journal's record, running nothing.
    std::fs::remove_dir_all(ws.root.join("target/kopt/pending")).unwrap();
    let kept: Vec<&str> = journal
        .lines()
        .filter(|l| !l.contains("\"event\":\"pending_saved\""))
        .collect();
    assert!(kept.len() < journal.lines().count(), "{journal}");
    std::fs::write(&journal_path, format!("{}\n", kept.join("\n"))).unwrap();
    let v = optimize("--resume");
    assert_eq!(v["kernels"][0]["resumed"]["finished_before"], true, "{v}");
    assert_eq!(v["kernels"][0]["regional_pending"][0], label, "{v}");
    let again = pending_dirs().len();
    assert_eq!(again, 1, "the region's winner is pending again");
}

#[test]
fn a_winner_slower_than_the_reference_on_one_shape_is_narrowed_to_retire_the_start() {
    let ws = kopt_tests::ExampleWorkspace::new();
    let s = setup();
    // 30% faster than the reference, but 2% slower on rows=16: inside the watchdog's 3%
    // of the accepted start (which the fake device times as the reference), so the best
    // on every shape until the loop's end narrows it.
    let source = s.source("// kopt-fake: speedup 1.3\n// kopt-fake: slower-on rows=16 1.02");
    let agent = scripted_agent(&ws, &proposal(&source));
    let o = optimize_softmax(&ws, &agent, "narrow", &[]);
    assert!(o.status.success(), "{}", kopt_tests::text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let k = &v["kernels"][0];
    assert_eq!(k["pending"], serde_json::Value::Null, "{v}");
    let label = k["regional_pending"][0]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"));
    let region = label
        .strip_prefix("llm-kernels/softmax/sm_90 where ")
        .unwrap_or_else(|| panic!("{label}"));
    let spec = &s.kernel().spec;
    let expr = spec.parse_region(region).unwrap();
    for shape in &spec.shapes {
        let args = spec.shape_args(shape);
        assert_eq!(spec.region_holds(&expr, &args), args[0] != 16, "{region}");
    }
    let journal = journal_of(&ws, "narrow");
    assert!(
        journal.contains("r1c1-narrowed"),
        "verified again, journaled"
    );
    let dir = std::fs::read_dir(ws.root.join("target/kopt/pending/llm-kernels/softmax"))
        .unwrap()
        .flatten()
        .map(|d| d.path())
        .find(|p| p.join("pending.json").is_file())
        .unwrap();
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("pending.json")).unwrap()).unwrap();
    assert_eq!(meta["retires"]["variant"], "run-1796024738-r1c1", "{meta}");
    let r = kopt_spec::files::Rationale::parse(
        &std::fs::read_to_string(dir.join("rationale.json")).unwrap(),
    )
    .unwrap();
    assert!(
        r.summary.contains("kopt narrowed it to") && r.summary.contains("cols=65536 rows=16"),
        "{}",
        r.summary
    );

    // What accepting it does to the lock is kopt-store's test
    // (`a_narrowed_winner_retires_the_start_so_the_reference_runs_the_rest`): a variant
    // measured on the fake device cannot be accepted.
}
