//! The backends against real HTTP servers on loopback (wiremock) playing an
//! OpenAI-compatible and an Anthropic endpoint; the command backend against a script;
//! recording and replay.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kopt_agent::backend::{Backend, BackendError, Client, Prices};
use kopt_agent::chat::{ChatRequest, Message};
use kopt_agent::command::External;
use kopt_agent::http::{Anthropic, Endpoint, OpenAi};
use kopt_agent::session::{Recorder, Replay};
use kopt_redact::Redactor;
use serde_json::json;
use wiremock::matchers::{body_partial_json, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn request(purpose: &str, text: &str) -> ChatRequest {
    ChatRequest {
        purpose: purpose.into(),
        system: "You optimise CUDA kernels.".into(),
        messages: vec![Message::user(text)],
        max_tokens: 512,
        temperature: 0.2,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

fn openai_reply(text: &str) -> serde_json::Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "served-model",
        "choices": [{ "index": 0, "message": { "role": "assistant", "content": text }, "finish_reason": "stop" }],
        "usage": { "prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150 }
    })
}

fn endpoint(server: &MockServer, key: Option<&str>) -> Endpoint {
    Endpoint {
        base_url: format!("{}/v1", server.uri()),
        model: "test-model".into(),
        key: key.map(String::from),
        timeout: Duration::from_secs(5),
    }
}

#[test]
fn openai_compatible_request_and_accounting() {
    let rt = runtime();
    let server = rt.block_on(MockServer::start());
    rt.block_on(
        Mock::given(method("POST"))
            .and(path("/v1/chat/completions"))
            .and(header("authorization", "Bearer sk-test-0123456789abcdef"))
            .and(body_partial_json(json!({ "model": "test-model", "messages": [{ "role": "system" }, { "role": "user", "content": "hello" }] })))
            .respond_with(ResponseTemplate::new(200).set_body_json(openai_reply("hi there")))
            .expect(1)
            .mount(&server),
    );
    let mut client = Client::new(Box::new(OpenAi::new(endpoint(
        &server,
        Some("sk-test-0123456789abcdef"),
    ))));
    client.prices = Prices {
        input_per_mtok: 2.0,
        output_per_mtok: 10.0,
    };
    let r = client.complete(&request("propose", "hello")).unwrap();
    assert_eq!(r.text, "hi there");
    assert_eq!(r.model, "served-model");
    assert_eq!(
        (
            client.spend.usage.input_tokens,
            client.spend.usage.output_tokens
        ),
        (120, 30)
    );
    assert!((client.spend.dollars - (120.0 * 2.0 + 30.0 * 10.0) / 1e6).abs() < 1e-12);
    assert_eq!(client.name(), "openai:test-model");
    rt.block_on(server.verify());
}

#[test]
fn local_servers_need_no_key() {
    let rt = runtime();
    let server = rt.block_on(MockServer::start());
    rt.block_on(
        Mock::given(method("POST"))
            .and(path("/v1/chat/completions"))
            .respond_with(ResponseTemplate::new(200).set_body_json(openai_reply("local")))
            .mount(&server),
    );
    let ep = Endpoint::from_env(
        &format!("{}/v1/", server.uri()),
        "qwen",
        "KOPT_TEST_UNSET_KEY_VARIABLE",
        Duration::from_secs(5),
    );
    assert!(ep.key.is_none());
    let r = OpenAi::new(ep).complete(&request("propose", "x")).unwrap();
    assert_eq!(r.text, "local");
    let reqs = rt.block_on(server.received_requests()).unwrap();
    assert!(
        reqs[0].headers.get("authorization").is_none(),
        "no Authorization header without a key"
    );
}

#[test]
fn anthropic_messages() {
    let rt = runtime();
    let server = rt.block_on(MockServer::start());
    rt.block_on(
        Mock::given(method("POST"))
            .and(path("/v1/messages"))
            .and(header("x-api-key", "anthropic-test-key-000"))
            .and(header("anthropic-version", Anthropic::VERSION))
            .and(body_partial_json(json!({ "model": "test-model", "system": "You optimise CUDA kernels.", "messages": [{ "role": "user", "content": "hello" }] })))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
                "content": [{ "type": "text", "text": "part one, " }, { "type": "text", "text": "part two" }],
                "usage": { "input_tokens": 11, "output_tokens": 7 }
            })))
            .expect(1)
            .mount(&server),
    );
    let ep = Endpoint {
        base_url: server.uri(),
        model: "test-model".into(),
        key: Some("anthropic-test-key-000".into()),
        timeout: Duration::from_secs(5),
    };
    let r = Anthropic::new(ep)
        .complete(&request("propose", "hello"))
        .unwrap();
    assert_eq!(r.text, "part one, part two");
    assert_eq!((r.usage.input_tokens, r.usage.output_tokens), (11, 7));
    rt.block_on(server.verify());
}

#[test]
fn a_429_is_retried_after_the_servers_retry_after() {
    let rt = runtime();
    let server = rt.block_on(MockServer::start());
    rt.block_on(async {
        Mock::given(method("POST"))
            .respond_with(
                ResponseTemplate::new(429)
                    .insert_header("retry-after", "7")
                    .set_body_json(json!({ "error": { "message": "rate limited" } })),
            )
            .up_to_n_times(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(200).set_body_json(openai_reply("after the wait")))
            .mount(&server)
            .await;
    });
    let waits = Arc::new(Mutex::new(Vec::new()));
    let w = waits.clone();
    let mut client = Client::new(Box::new(OpenAi::new(endpoint(&server, None))))
        .with_sleep(move |d| w.lock().unwrap().push(d));
    let r = client.complete(&request("propose", "x")).unwrap();
    assert_eq!(r.text, "after the wait");
    assert_eq!(*waits.lock().unwrap(), vec![Duration::from_secs(7)]);
    assert_eq!((client.spend.requests, client.spend.retries), (2, 1));
}

#[test]
fn server_errors_back_off_and_client_errors_do_not_retry() {
    let rt = runtime();
    let server = rt.block_on(MockServer::start());
    rt.block_on(async {
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(503))
            .up_to_n_times(2)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(200).set_body_json(openai_reply("ok")))
            .mount(&server)
            .await;
    });
    let waits = Arc::new(Mutex::new(Vec::new()));
    let w = waits.clone();
    let mut client = Client::new(Box::new(OpenAi::new(endpoint(&server, None))))
        .with_sleep(move |d| w.lock().unwrap().push(d));
    assert_eq!(
        client.complete(&request("propose", "x")).unwrap().text,
        "ok"
    );
    assert_eq!(
        *waits.lock().unwrap(),
        vec![Duration::from_millis(500), Duration::from_millis(1000)],
        "exponential backoff"
    );

    let bad = rt.block_on(MockServer::start());
    rt.block_on(
        Mock::given(method("POST"))
            .respond_with(
                ResponseTemplate::new(401)
                    .set_body_json(json!({ "error": { "message": "invalid key" } })),
            )
            .expect(1)
            .mount(&bad),
    );
    let mut client = Client::new(Box::new(OpenAi::new(endpoint(&bad, None))))
        .with_sleep(|_| panic!("no retry on 401"));
    let e = client.complete(&request("propose", "x")).unwrap_err();
    assert_eq!(e, BackendError::Fatal("HTTP 401: invalid key".into()));
    rt.block_on(bad.verify());
}

#[test]
fn a_slow_endpoint_times_out() {
    let rt = runtime();
    let server = rt.block_on(MockServer::start());
    rt.block_on(
        Mock::given(method("POST"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(openai_reply("late"))
                    .set_delay(Duration::from_secs(3)),
            )
            .mount(&server),
    );
    let mut ep = endpoint(&server, None);
    ep.timeout = Duration::from_millis(300);
    let e = OpenAi::new(ep)
        .complete(&request("propose", "x"))
        .unwrap_err();
    assert!(matches!(e, BackendError::Timeout(_)), "{e:?}");
}

#[test]
fn an_external_command_speaks_json() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("agent.sh");
    std::fs::write(&script, "#!/bin/sh\nread -r line\ncase \"$line\" in *'\"purpose\":\"propose\"'*) echo '{\"text\": \"from the script\", \"usage\": {\"input_tokens\": 3, \"output_tokens\": 4}}' ;; *) echo 'bad' >&2; exit 3 ;; esac\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut b = External {
        program: script.clone(),
        timeout: Duration::from_secs(10),
    };
    let r = b.complete(&request("propose", "x")).unwrap();
    assert_eq!(r.text, "from the script");
    assert_eq!(r.usage.output_tokens, 4);
    let e = b.complete(&request("review", "x")).unwrap_err();
    assert!(
        e.to_string().contains("exit status: 3") && e.to_string().contains("bad"),
        "{e}"
    );

    let slow = dir.path().join("slow.sh");
    std::fs::write(&slow, "#!/bin/sh\nsleep 5\n").unwrap();
    std::fs::set_permissions(&slow, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let e = External {
        program: slow,
        timeout: Duration::from_millis(200),
    }
    .complete(&request("propose", "x"))
    .unwrap_err();
    assert!(matches!(e, BackendError::Timeout(_)));
}

#[test]
fn a_recorded_session_hides_the_key_and_replays_offline() {
    let rt = runtime();
    let server = rt.block_on(MockServer::start());
    rt.block_on(
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(200).set_body_json(openai_reply("first")))
            .up_to_n_times(1)
            .mount(&server),
    );
    rt.block_on(
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(200).set_body_json(openai_reply("second")))
            .mount(&server),
    );
    let key = "sk-live-abcdefghijklmnopqrstuvwx";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("session.jsonl");
    let redactor = Redactor::from_vars([("KOPT_TEST_OPENAI_API_KEY".to_string(), key.to_string())]);
    let mut rec = Recorder::new(
        Box::new(OpenAi::new(endpoint(&server, Some(key)))),
        &file,
        redactor,
    )
    .unwrap();
    // A prompt that (by accident) quotes the key must not leak it either.
    let r1 = rec
        .complete(&request("propose", &format!("my key is {key}")))
        .unwrap();
    let r2 = rec.complete(&request("review", "second round")).unwrap();
    let recorded = std::fs::read_to_string(&file).unwrap();
    assert!(
        !recorded.contains(key),
        "the key never reaches the recording"
    );
    assert!(recorded.contains("[REDACTED:KOPT_TEST_OPENAI_API_KEY]"));
    assert_eq!(recorded.lines().count(), 2);

    // Offline: the server is gone.
    drop(server);
    let mut replay = Replay::open(&file).unwrap();
    let p1 = request("propose", "my key is [REDACTED:KOPT_TEST_OPENAI_API_KEY]");
    assert_eq!(replay.complete(&p1).unwrap(), r1);
    assert_eq!(
        replay.complete(&request("review", "second round")).unwrap(),
        r2
    );
    assert_eq!(replay.remaining(), 0);

    let mut replay = Replay::open(&file).unwrap();
    let e = replay
        .complete(&request("review", "out of order"))
        .unwrap_err();
    assert!(
        e.to_string().contains(
            "diverged at exchange 0: a `review` request where the recording has `propose`"
        ),
        "{e}"
    );
}

/// A stand-in agent that answers `<tag> N` to its Nth request (or fails for good), and
/// counts what it was asked.
struct Counting {
    tag: &'static str,
    asked: Arc<Mutex<Vec<String>>>,
    fail: bool,
}

impl Backend for Counting {
    fn name(&self) -> String {
        format!("counting:{}", self.tag)
    }

    fn complete(
        &mut self,
        req: &ChatRequest,
    ) -> Result<kopt_agent::chat::ChatResponse, BackendError> {
        let mut asked = self.asked.lock().unwrap();
        asked.push(req.messages.last().unwrap().content.clone());
        if self.fail {
            return Err(BackendError::Fatal("the endpoint is down".into()));
        }
        Ok(kopt_agent::chat::ChatResponse {
            text: format!("{} {}", self.tag, asked.len()),
            usage: Default::default(),
            model: "m".into(),
        })
    }
}

fn counting(tag: &'static str) -> (Box<dyn Backend>, Arc<Mutex<Vec<String>>>) {
    let asked = Arc::new(Mutex::new(Vec::new()));
    (
        Box::new(Counting {
            tag,
            asked: asked.clone(),
            fail: false,
        }),
        asked,
    )
}

#[test]
fn a_resumed_session_answers_from_its_recording_until_the_context_changes() {
    use kopt_agent::session::Resume;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("softmax.jsonl");
    let (first, _) = counting("first");
    let mut rec = Recorder::new(first, &file, Redactor::default()).unwrap();
    for text in ["round 1", "round 2", "round 3"] {
        rec.complete(&request("propose", text)).unwrap();
    }
    // The kill came while a fourth exchange was being written.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&file)
        .unwrap();
    std::io::Write::write_all(&mut f, b"{\"index\":3,\"backend\":\"cou").unwrap();
    drop(f);

    let (live, asked) = counting("live");
    let mut r = Resume::open(&file, live, Redactor::default()).unwrap();
    let log = r.log();
    assert_eq!(log.get().recorded, 3, "the cut line is no exchange");
    let a = r.complete(&request("propose", "round 1")).unwrap();
    assert_eq!(a.text, "first 1");
    assert!(r.last_from_record() && asked.lock().unwrap().is_empty());
    // The second question differs from the recorded one: the live agent from here.
    let b = r
        .complete(&request("propose", "round 2, with a new best"))
        .unwrap();
    assert_eq!(b.text, "live 1");
    assert!(!r.last_from_record());
    let report = log.get();
    assert_eq!(report.replayed, 1);
    let (at, why) = report.live_from.clone().unwrap();
    assert_eq!(at, 1);
    assert!(
        why.starts_with("the context changed: message 1 differs from line 1: now `round 2, with")
            && why.contains("recorded `round 2`"),
        "{why}"
    );
    // What no longer applies is kept beside the session, which goes on from exchange 1.
    let kept = std::fs::read_to_string(report.kept_in.unwrap()).unwrap();
    assert!(
        kept.contains("round 2") && kept.contains("round 3") && kept.ends_with("\"cou"),
        "{kept}"
    );
    let session = std::fs::read_to_string(&file).unwrap();
    assert_eq!(session.lines().count(), 2, "{session}");
    assert!(session.contains("round 2, with a new best") && !session.contains("round 3"));
    drop(r);

    // Resumed again: both exchanges of this session now come from the recording.
    let (live, asked) = counting("again");
    let mut r = Resume::open(&file, live, Redactor::default()).unwrap();
    assert_eq!(
        r.complete(&request("propose", "round 1")).unwrap().text,
        "first 1"
    );
    assert_eq!(
        r.complete(&request("propose", "round 2, with a new best"))
            .unwrap()
            .text,
        "live 1"
    );
    assert!(asked.lock().unwrap().is_empty());
    assert_eq!(
        r.complete(&request("propose", "round 3")).unwrap().text,
        "again 1"
    );
    assert_eq!(
        r.log().get().live_from.unwrap().1,
        "the recording ends after 2 exchange(s)"
    );
    let indices: Vec<u64> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["index"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(indices, [0, 1, 2], "the recording is numbered on");
}

#[test]
fn a_resumed_session_asks_again_where_the_recording_failed() {
    use kopt_agent::session::Resume;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("softmax.jsonl");
    let down = Box::new(Counting {
        tag: "down",
        asked: Arc::default(),
        fail: true,
    });
    let mut rec = Recorder::new(down, &file, Redactor::default()).unwrap();
    assert!(rec.complete(&request("propose", "round 1")).is_err());
    let (live, asked) = counting("live");
    let mut r = Resume::open(&file, live, Redactor::default()).unwrap();
    assert_eq!(
        r.complete(&request("propose", "round 1")).unwrap().text,
        "live 1"
    );
    assert_eq!(asked.lock().unwrap().len(), 1);
    let why = r.log().get().live_from.unwrap().1;
    assert!(
        why.starts_with("the recorded exchange failed (")
            && why.contains("the endpoint is down")
            && why.ends_with("the agent is asked again"),
        "{why}"
    );
    // A damaged line before the end is refused, naming it.
    std::fs::write(&file, "not json\n{}\n").unwrap();
    let (live, _) = counting("live");
    let e = Resume::open(&file, live, Redactor::default())
        .err()
        .unwrap();
    assert!(
        e.contains("softmax.jsonl:1: not a recorded exchange"),
        "{e}"
    );
}
