//! A search interrupted mid-way resumes from its journal: no point is evaluated twice,
//! the sequence and the best are those of an uninterrupted run.

mod common;

use common::*;
use kopt_search::interesting::Interesting;
use kopt_search::journal::{self, Header, SearchJournal};
use kopt_search::run::{self, Budget, Control, Observer, Prior, Record, Settings, StopReason};
use kopt_search::seed::{self, Bottleneck, Guide, SnapshotHints};
use kopt_search::space::{OptionAxes, Space};
use kopt_search::strategy::{MakeStrategy, StrategyKind};
use kopt_store::journal::{Event, Journal};
use kopt_store::KoptDir;

/// Stops the run after `n` points (as a kill would, but cleanly enough to test).
struct StopAfter(usize, SearchJournal);

impl Observer for StopAfter {
    fn record(&mut self, space: &Space, r: &Record, best: Option<&Record>) -> Control {
        if self.1.record(space, r, best) == Control::Stop {
            return Control::Stop;
        }
        if r.seq >= self.0 {
            Control::Stop
        } else {
            Control::Continue
        }
    }
}

fn header(space: &Space, kind: StrategyKind) -> Header {
    Header {
        kind: "search".into(),
        package: "p".into(),
        kernel: "k".into(),
        strategy: kind,
        seed: 5,
        seeded: true,
        space: space.fingerprint().into(),
        points: space.len(),
        options: OptionAxes::standard(),
        device: "GPU-fake".into(),
        evaluation: serde_json::json!({"timing": "test"}),
        hints: None,
        matrix: None,
    }
}

fn settings(n: usize) -> Settings {
    Settings {
        budget: Budget {
            evaluations: Some(n),
            ..Budget::default()
        },
        compile_threads: 2,
        compile_ahead: 16,
    }
}

#[test]
fn an_interrupted_run_resumes_without_evaluating_a_point_twice() {
    let space = Space::build(&row_spec(), &limits(), &OptionAxes::standard()).unwrap();
    let hints = SnapshotHints {
        class: Bottleneck::MemoryBound,
        global_load_bytes: Some(4),
        grid_blocks_per_sm: Some(0.12),
        ..SnapshotHints::default()
    };
    let guide = Guide::new(&space, seed::heuristic(&space, &row_spec(), &hints)).unwrap();
    let interesting = || Interesting::new(guide.goals().to_vec(), hints.metrics(), 4);
    for kind in StrategyKind::ALL {
        let tmp = tempfile::tempdir().unwrap();
        let kopt = KoptDir::new(tmp.path());
        // The uninterrupted run.
        let mut full_eval = row_evaluator();
        full_eval.with_compiler = true;
        let mut sp = space.clone();
        let full = run::run(
            &mut sp,
            kind.make(5).as_mut(),
            &mut full_eval,
            Some(&guide),
            interesting(),
            &settings(50),
            Prior::default(),
            &mut run::Quiet,
        );
        assert_eq!(full.evaluations, 50);

        // Interrupted after 17 points...
        let h = header(&space, kind);
        let j = SearchJournal::create(&kopt, "run-1", &h, &settings(50).budget).unwrap();
        let mut first_eval = row_evaluator();
        first_eval.with_compiler = true;
        let mut stop = StopAfter(17, j);
        let mut sp = space.clone();
        let part = run::run(
            &mut sp,
            kind.make(5).as_mut(),
            &mut first_eval,
            Some(&guide),
            interesting(),
            &settings(50),
            Prior::default(),
            &mut stop,
        );
        assert_eq!(part.stop, StopReason::Interrupted);
        stop.1.finish(&part).unwrap();
        assert_eq!(first_eval.evaluated.len(), 17);

        // ... then resumed from the journal.
        assert_eq!(journal::read_header(&kopt, "run-1").unwrap(), h);
        let (mut j, prior) = SearchJournal::resume(&kopt, "run-1", &h, &space).unwrap();
        assert_eq!(prior.outcomes.len(), 17);
        let mut second_eval = row_evaluator();
        second_eval.with_compiler = true;
        let mut sp = space.clone();
        let rest = run::run(
            &mut sp,
            kind.make(5).as_mut(),
            &mut second_eval,
            Some(&guide),
            interesting(),
            &settings(50),
            prior,
            &mut j,
        );
        j.finish(&rest).unwrap();
        assert_eq!(rest.replayed, 17, "{kind}");
        let mut all = first_eval.evaluated.clone();
        all.extend(second_eval.evaluated.clone());
        let mut uniq = all.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), all.len(), "{kind}: no point evaluated twice");
        assert_eq!(all.len(), 50);
        let seq = |s: &run::Summary| {
            s.records
                .iter()
                .map(|r| r.label.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            seq(&rest),
            seq(&full),
            "{kind}: the same sequence as without the interruption"
        );
        assert_eq!(
            rest.best_record().map(|b| b.label.clone()),
            full.best_record().map(|b| b.label.clone()),
            "{kind}: the same best"
        );

        // The journal holds each point once, with its artefact, and both ends.
        let read = Journal::read(&kopt, "run-1").unwrap();
        let candidates: Vec<&str> = read
            .entries
            .iter()
            .filter_map(|e| match &e.event {
                Event::Candidate { candidate, .. } => Some(candidate.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(candidates.len(), 50);
        assert!(read
            .entries
            .iter()
            .any(|e| matches!(e.event, Event::RunInterrupted { .. })));
        assert!(matches!(
            read.entries.last().unwrap().event,
            Event::RunFinished { .. }
        ));
        let verdicts = read
            .entries
            .iter()
            .filter(|e| matches!(e.event, Event::Verdict { .. }))
            .count();
        assert_eq!(verdicts, 50);
    }
}

#[test]
fn a_run_resumes_only_as_itself() {
    let space = row_space();
    let tmp = tempfile::tempdir().unwrap();
    let kopt = KoptDir::new(tmp.path());
    let h = header(&space, StrategyKind::Hill);
    SearchJournal::create(&kopt, "r", &h, &Budget::default()).unwrap();
    let e = SearchJournal::create(&kopt, "r", &h, &Budget::default()).unwrap_err();
    assert!(e.contains("--resume r"), "{e}");
    let mut other = h.clone();
    other.seed = 6;
    other.strategy = StrategyKind::Random;
    let e = SearchJournal::resume(&kopt, "r", &other, &space).unwrap_err();
    assert!(
        e.contains("seed: the run has 5, this command 6") && e.contains("strategy"),
        "{e}"
    );
    let e = journal::read_header(&kopt, "nope").unwrap_err();
    assert!(e.contains("cannot read the journal of run `nope`"), "{e}");
    // A damaged point file is reported, not skipped.
    let mut j = SearchJournal::resume(&kopt, "r", &h, &space).unwrap().0;
    let r = Record {
        seq: 1,
        round: 0,
        id: 0,
        label: space.label(0),
        values: space.values(0),
        outcome: run::PointOutcome::passed(1.0),
        replayed: false,
        elapsed: 0.5,
        interesting: None,
        note: None,
    };
    assert_eq!(j.record(&space, &r, None), Control::Continue);
    let (_, prior) = SearchJournal::resume(&kopt, "r", &h, &space).unwrap();
    assert_eq!(prior.outcomes.len(), 1);
    assert_eq!(prior.elapsed, 0.5);
    std::fs::write(j.dir().join("artefacts/search/000001.json"), "{").unwrap();
    let e = SearchJournal::resume(&kopt, "r", &h, &space).unwrap_err();
    assert!(e.contains("not a search point"), "{e}");
}
