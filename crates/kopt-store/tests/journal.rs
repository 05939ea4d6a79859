//! The run journal: resume after interruption, a torn last line, redaction of secrets.

use std::io::Write as _;

use kopt_redact::Redactor;
use kopt_store::journal::{self, Event, Journal, JOURNAL_FILE};
use kopt_store::KoptDir;
use serde_json::json;

fn prompt(round: u32, text: &str) -> Event {
    Event::Prompt {
        kernel: "softmax".into(),
        round,
        role: "proposer".into(),
        text: text.into(),
    }
}

#[test]
fn a_run_resumes_where_it_stopped() {
    let d = tempfile::tempdir().unwrap();
    let kopt = KoptDir::new(d.path());
    let (mut j, resumed) = Journal::open_or_resume(&kopt, "r1").unwrap();
    assert!(resumed.entries.is_empty() && resumed.torn.is_none());
    j.append(Event::RunStarted {
        config: json!({"kernels": ["softmax"], "agent": "heuristic"}),
        budget: json!({"rounds": 3}),
    })
    .unwrap();
    j.append(prompt(1, "make it faster")).unwrap();
    let path = j
        .save_artefact("round-1/candidate.cu", "__global__ void k() {}\n")
        .unwrap();
    assert_eq!(path, "artefacts/round-1/candidate.cu");
    j.append(Event::Candidate {
        kernel: "softmax".into(),
        round: 1,
        candidate: "c1".into(),
        summary: "float4 loads".into(),
        artefacts: vec![path.clone()],
    })
    .unwrap();
    drop(j);

    let (mut j, resumed) = Journal::open_or_resume(&kopt, "r1").unwrap();
    assert_eq!(resumed.entries.len(), 3);
    assert_eq!(
        resumed.entries.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert_eq!(resumed.entries[1].event, prompt(1, "make it faster"));
    assert_eq!(
        j.append(Event::RunFinished {
            summary: "1 pending".into()
        })
        .unwrap(),
        4
    );
    assert_eq!(
        std::fs::read_to_string(kopt.run_dir("r1").join(&path)).unwrap(),
        "__global__ void k() {}\n"
    );
    let runs = journal::list_runs(&kopt);
    assert_eq!(runs.len(), 1);
    assert_eq!((runs[0].events, runs[0].state), (4, "finished"));

    for bad in ["../escape", "a/../b", ".hidden", ""] {
        assert!(j.save_artefact(bad, "x").is_err(), "{bad}");
    }
    assert!(Journal::open_or_resume(&kopt, "../r").is_err());
}

#[test]
fn a_torn_last_line_is_reported_kept_and_cut_never_fatal() {
    let d = tempfile::tempdir().unwrap();
    let kopt = KoptDir::new(d.path());
    let (mut j, _) = Journal::open_or_resume(&kopt, "r2").unwrap();
    j.append(prompt(1, "one")).unwrap();
    j.append(prompt(2, "two")).unwrap();
    drop(j);
    // A crash in the middle of writing the third line.
    let file = kopt.run_dir("r2").join(JOURNAL_FILE);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&file)
        .unwrap();
    let torn_bytes = b"{\"seq\":3,\"at\":\"2026-11-30T10:00:00Z\",\"event\":\"pro";
    f.write_all(torn_bytes).unwrap();
    drop(f);

    let read_only = Journal::read(&kopt, "r2").unwrap();
    assert_eq!(read_only.entries.len(), 2);
    assert_eq!(read_only.torn.as_ref().map(|t| t.line), Some(3));

    let (mut j, resumed) = Journal::open_or_resume(&kopt, "r2").unwrap();
    assert_eq!(resumed.entries.len(), 2);
    let torn = resumed.torn.expect("reported");
    assert_eq!(torn.line, 3);
    assert_eq!(torn.bytes, torn_bytes.len());
    assert!(std::fs::read_to_string(&torn.kept_in)
        .unwrap()
        .ends_with("\"event\":\"pro"));
    assert_eq!(
        j.append(prompt(3, "three")).unwrap(),
        3,
        "numbering goes on"
    );
    drop(j);
    let (_, resumed) = Journal::open_or_resume(&kopt, "r2").unwrap();
    assert_eq!(resumed.entries.len(), 3);
    assert!(resumed.torn.is_none());

    // A damaged line in the middle is not a crash: refuse to resume from it.
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replacen("\"seq\":2", "\"seq\":", 1)).unwrap();
    let err = Journal::open_or_resume(&kopt, "r2")
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 2: not a journal event"), "{err}");
}

#[test]
fn secrets_never_reach_the_disk() {
    let d = tempfile::tempdir().unwrap();
    let kopt = KoptDir::new(d.path());
    let redactor = Redactor::from_vars([
        (
            "ANTHROPIC_API_KEY".to_string(),
            "my-very-private-value".to_string(),
        ),
        ("GH_TOKEN".to_string(), "another-private-value".to_string()),
        ("HOME".to_string(), "/root".to_string()),
    ]);
    let (j, _) = Journal::open_or_resume(&kopt, "r3").unwrap();
    let mut j = j.with_redactor(redactor);
    j.append(Event::RunStarted {
        config: json!({
            "endpoint": "http://localhost:8000/v1",
            "headers": {"x-api-key": "my-very-private-value"},
            "note": "token another-private-value in text",
        }),
        budget: json!({}),
    })
    .unwrap();
    j.append(Event::Reply {
        kernel: "softmax".into(),
        round: 1,
        role: "proposer".into(),
        text: "I used sk-proj-AAAAAAAAAAAAAAAAAAAAAAAAAAAA and Bearer abcdefghijklmnopqrstuvwxyz012345".into(),
        tokens: Some(1200),
    })
    .unwrap();
    j.save_artefact(
        "prompt-1.txt",
        "export OPENAI_API_KEY=sk-live-0123456789abcdefghijklmnop\n",
    )
    .unwrap();
    let run = kopt.run_dir("r3");
    let journal = std::fs::read_to_string(run.join(JOURNAL_FILE)).unwrap();
    let artefact = std::fs::read_to_string(run.join("artefacts/prompt-1.txt")).unwrap();
    for secret in [
        "my-very-private-value",
        "another-private-value",
        "sk-proj-AAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "abcdefghijklmnopqrstuvwxyz012345",
    ] {
        assert!(!journal.contains(secret), "{secret} in {journal}");
    }
    assert!(
        !artefact.contains("sk-live-0123456789abcdefghijklmnop"),
        "{artefact}"
    );
    assert!(
        journal.contains("[REDACTED:ANTHROPIC_API_KEY]"),
        "{journal}"
    );
    assert!(journal.contains("[REDACTED:GH_TOKEN]"), "{journal}");
    assert!(journal.contains("Bearer [REDACTED]"), "{journal}");
    assert!(
        journal.contains("http://localhost:8000/v1"),
        "ordinary values stay: {journal}"
    );
    assert_eq!(artefact, "export OPENAI_API_KEY=[REDACTED]\n");
}

#[test]
fn the_loop_s_own_events_read_back_and_older_verdict_lines_keep_their_shape() {
    let d = tempfile::tempdir().unwrap();
    let kopt = KoptDir::new(d.path());
    let (mut j, _) = Journal::open_or_resume(&kopt, "r4").unwrap();
    let events = [
        Event::KernelStarted {
            kernel: "softmax".into(),
            device: "GPU-fake-0000|kopt fake GPU|driver-13000".into(),
            artefacts: vec!["artefacts/loop/softmax-start.json".into()],
        },
        Event::Verdict {
            kernel: "softmax".into(),
            candidate: "r1c1".into(),
            passed: true,
            failure_class: None,
            detail: "accepted".into(),
            times_us: [("rows=8".to_string(), 12.5)].into(),
            artefacts: vec!["artefacts/verdicts/softmax-r1c1.json".into()],
        },
        Event::KernelFinished {
            kernel: "softmax".into(),
            result: json!({"kernel": "softmax", "rounds": 2}),
            artefacts: vec![],
        },
        Event::Resumed {
            kernel: None,
            detail: "resumed: 1 of 2 kernel(s) had finished".into(),
        },
        Event::Resumed {
            kernel: Some("rmsnorm".into()),
            detail: "the live agent answers from exchange 1".into(),
        },
    ];
    for e in &events {
        j.append(e.clone()).unwrap();
    }
    // A verdict line as kopt wrote it before verdicts cited artefacts.
    let old = r#"{"seq":6,"at":"2026-12-01T00:00:00Z","event":"verdict","kernel":"softmax","candidate":"r1c2","passed":false,"failure_class":"compile","detail":"x"}"#;
    let path = kopt.run_dir("r4").join(JOURNAL_FILE);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    writeln!(f, "{old}").unwrap();
    drop(f);
    let read = Journal::read(&kopt, "r4").unwrap();
    let back: Vec<Event> = read.entries.iter().map(|e| e.event.clone()).collect();
    assert_eq!(&back[..5], &events[..]);
    let Event::Verdict { artefacts, .. } = &back[5] else {
        panic!("{:?}", back[5])
    };
    assert!(artefacts.is_empty());
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[2].contains("\"event\":\"kernel_finished\"") && !lines[2].contains("artefacts"),
        "empty artefacts are left out: {}",
        lines[2]
    );
    assert!(!lines[3].contains("\"kernel\""), "{}", lines[3]);
    let mut again = serde_json::to_value(&read.entries[5]).unwrap();
    again.as_object_mut().unwrap().remove("at");
    let mut then: serde_json::Value = serde_json::from_str(old).unwrap();
    then.as_object_mut().unwrap().remove("at");
    assert_eq!(again, then, "a verdict without artefacts writes as it did");
}
