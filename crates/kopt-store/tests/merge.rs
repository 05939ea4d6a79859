//! Merging the work of other machines: pending variants (with their run folders) and case
//! libraries, refusing conflicts, without the command line.

mod common;

use std::path::{Path, PathBuf};

use common::Fixture;
use kopt_store::cases::CaseLibrary;
use kopt_store::merge::{self, MergeReport};
use kopt_store::pending::{self, PendingVariant};
use kopt_store::{Error, KoptDir};

/// Another machine's workspace: its folder (holding `target/kopt/`) and its store.
fn machine(root: &Path, name: &str) -> (PathBuf, KoptDir) {
    let dir = root.join(name);
    (dir.clone(), KoptDir::new(&dir.join("target")))
}

/// `p` for architecture `arch`.
fn for_arch(mut p: PendingVariant, arch: &str) -> PendingVariant {
    p.meta.arch = arch.into();
    p.rationale.arch = arch.into();
    p
}

/// Saves `p` in `kopt`'s pending area with a run folder holding a journal line.
fn produce(kopt: &KoptDir, p: &PendingVariant) {
    pending::save(kopt, p).unwrap();
    let run = kopt.run_dir(&p.meta.run_id);
    std::fs::create_dir_all(run.join("sessions")).unwrap();
    std::fs::write(
        run.join("journal.jsonl"),
        format!("{{\"run\":\"{}\"}}\n", p.meta.run_id),
    )
    .unwrap();
    std::fs::write(run.join("sessions/softmax.jsonl"), "{}\n").unwrap();
}

fn roots(dirs: &[&Path]) -> Vec<PathBuf> {
    dirs.iter()
        .map(|d| merge::pending_root_in(d).expect("a pending area"))
        .collect()
}

fn labels(r: &MergeReport) -> Vec<String> {
    r.added.iter().map(|m| m.label.clone()).collect()
}

#[test]
fn parts_merge_with_their_run_folders_and_merging_again_changes_nothing() {
    let f = Fixture::new();
    let scratch = tempfile::tempdir().unwrap();
    let (a_dir, a) = machine(scratch.path(), "part-1");
    let (b_dir, b) = machine(scratch.path(), "part-2");
    let va = f.pending("vec4-a", "run-part-1", "");
    let vb = for_arch(f.pending("vec4-b", "run-part-2", "// b\n"), "sm_80");
    produce(&a, &va);
    produce(&b, &vb);
    // Both layouts are found: a target folder's parent and a bare pending area.
    let r = merge::merge_pending(
        &f.kopt,
        &[
            merge::pending_root_in(&a_dir).unwrap(),
            merge::pending_root_in(&b.pending_root()).unwrap(),
        ],
    )
    .unwrap();
    assert_eq!(
        labels(&r),
        [
            "fixture-kernels/softmax/sm_80",
            "fixture-kernels/softmax/sm_90"
        ]
    );
    assert_eq!(
        r.runs_copied,
        ["run-part-2", "run-part-1"],
        "each variant brings the run folder its session cites"
    );
    let listing = pending::list(&f.kopt);
    assert_eq!(listing.variants, vec![vb.clone(), va.clone()]);
    assert_eq!(
        std::fs::read_to_string(f.kopt.run_dir("run-part-1").join("journal.jsonl")).unwrap(),
        "{\"run\":\"run-part-1\"}\n"
    );
    assert!(f
        .kopt
        .run_dir("run-part-2")
        .join("sessions/softmax.jsonl")
        .is_file());

    let again = merge::merge_pending(&f.kopt, &roots(&[&a_dir, &b_dir])).unwrap();
    assert!(again.added.is_empty(), "{again:?}");
    assert_eq!(again.unchanged.len(), 2);
    assert_eq!(pending::list(&f.kopt).variants, vec![vb, va]);
}

#[test]
fn two_different_variants_for_one_kernel_and_arch_are_refused_and_nothing_is_merged() {
    let f = Fixture::new();
    let scratch = tempfile::tempdir().unwrap();
    let (a_dir, a) = machine(scratch.path(), "part-1");
    let (b_dir, b) = machine(scratch.path(), "part-2");
    let (c_dir, c) = machine(scratch.path(), "part-3");
    produce(&a, &f.pending("vec4-a", "run-1", ""));
    produce(&b, &f.pending("vec4-b", "run-2", "// different\n"));
    produce(&c, &for_arch(f.pending("vec4-c", "run-3", ""), "sm_80"));
    let e = merge::merge_pending(&f.kopt, &roots(&[&c_dir, &a_dir, &b_dir])).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Conflict(_)), "{msg}");
    for needle in [
        "two different pending variants of `softmax`",
        "`vec4-b` (run run-2)",
        "`vec4-a` (run run-1)",
        "Nothing was merged",
        "cargo kopt review softmax --arch sm_90",
    ] {
        assert!(msg.contains(needle), "`{needle}` in: {msg}");
    }
    assert!(
        pending::list(&f.kopt).variants.is_empty(),
        "not even the part without a conflict was merged"
    );

    // Against a variant pending here: refused, naming how to decide on ours first.
    let ours = f.pending("vec4-ours", "run-0", "// ours\n");
    pending::save(&f.kopt, &ours).unwrap();
    let msg = merge::merge_pending(&f.kopt, &roots(&[&a_dir]))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("pending here") && msg.contains("cargo kopt reject softmax --arch sm_90"),
        "{msg}"
    );
    assert_eq!(pending::list(&f.kopt).variants, vec![ours]);
}

#[test]
fn a_damaged_pending_folder_stops_the_merge_naming_it() {
    let f = Fixture::new();
    let scratch = tempfile::tempdir().unwrap();
    let (a_dir, a) = machine(scratch.path(), "part-1");
    produce(&a, &f.pending("vec4-a", "run-1", ""));
    let p = f.pending("vec4-a", "run-1", "");
    let dir = pending::dir_of(&a, &p.meta);
    std::fs::write(dir.join("variant.toml"), "not toml [").unwrap();
    let msg = merge::merge_pending(&f.kopt, &roots(&[&a_dir]))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("not a readable pending variant") && msg.contains("nothing was merged"),
        "{msg}"
    );
    assert!(merge::pending_root_in(scratch.path()).is_none());
}

#[test]
fn case_libraries_merge_by_import_each_case_once() {
    let lines: Vec<&str> = include_str!("fixtures/cases.jsonl").lines().collect();
    assert!(lines.len() >= 30);
    let scratch = tempfile::tempdir().unwrap();
    let make = |name: &str, part: &[&str]| {
        let path = scratch.path().join(name);
        let mut lib = CaseLibrary::open(&path).unwrap();
        lib.import_jsonl(&part.join("\n")).unwrap();
        path
    };
    let one = make("one.sqlite", &lines[..20]);
    let two = make("two.sqlite", &lines[10..]);
    let mut here = CaseLibrary::open(&scratch.path().join("here.sqlite")).unwrap();
    let r = merge::import_cases(&mut here, &one).unwrap();
    assert_eq!((r.added, r.updated, r.unchanged), (20, 0, 0));
    let r = merge::import_cases(&mut here, &two).unwrap();
    assert_eq!(
        (r.added, r.updated, r.unchanged),
        (lines.len() - 20, 0, 10),
        "the shared cases are not added twice"
    );
    assert_eq!(here.len().unwrap(), lines.len());
    // The exchange format imports the same way.
    let jsonl = scratch.path().join("cases.jsonl");
    std::fs::write(&jsonl, lines.join("\n")).unwrap();
    let r = merge::import_cases(&mut here, &jsonl).unwrap();
    assert_eq!((r.added, r.unchanged), (0, lines.len()));
    assert_eq!(merge::case_libraries_in(scratch.path()), vec![jsonl]);
}
