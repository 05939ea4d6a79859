//! A variant's verified PTX through the store: pending (validated against its record),
//! accepted (the folder's `kernel.ptx`, the lock entry's record), resolved by the build
//! (usable only with the very bytes the lock records), re-activated, and added to an
//! accepted variant afterwards (`keep_ptx`).

mod common;

use common::Fixture;
use kopt_spec::files::{self, LockFile, PtxRecord, Rationale};
use kopt_spec::selection::{self, Unusable};
use kopt_spec::source;
use kopt_store::accept::{self, AcceptAs};
use kopt_store::journal::Journal;
use kopt_store::{pending, Error};

const PTX: &str = ".version 9.0\n.target sm_90\n.address_size 64\n\n.visible .entry softmax_f32()\n{\n\tret;\n}\n";

fn record(ptx: &str, arch: &str) -> PtxRecord {
    PtxRecord {
        hash: source::hash(ptx.as_bytes()),
        nvrtc: "13.0".into(),
        arch: arch.into(),
        symbol: None,
    }
}

fn with_ptx(mut p: pending::PendingVariant, ptx: &str) -> pending::PendingVariant {
    p.meta.ptx = Some(record(ptx, "sm_90"));
    p.ptx = Some(ptx.to_string());
    p
}

#[test]
fn a_pending_ptx_must_match_its_record() {
    let f = Fixture::new();
    let p = with_ptx(f.pending("vec4-a", "run-1", ""), PTX);
    p.validate().unwrap();

    let mut edited = p.clone();
    edited.ptx = Some(format!("{PTX}// edited\n"));
    let e = edited.validate().unwrap_err().to_string();
    assert!(e.contains("kernel.ptx does not match the hash"), "{e}");

    let mut missing = p.clone();
    missing.ptx = None;
    let e = missing.validate().unwrap_err().to_string();
    assert!(
        e.contains("records a PTX, but there is no kernel.ptx"),
        "{e}"
    );

    let mut unrecorded = p.clone();
    unrecorded.meta.ptx = None;
    let e = unrecorded.validate().unwrap_err().to_string();
    assert!(e.contains("does not record it"), "{e}");

    let mut elsewhere = p.clone();
    elsewhere.meta.ptx = Some(record(PTX, "sm_80"));
    let e = elsewhere.validate().unwrap_err().to_string();
    assert!(e.contains("compiled for sm_80, not sm_90"), "{e}");

    // Saved and loaded with its kernel.ptx.
    let saved = pending::save(&f.kopt, &p).unwrap();
    assert_eq!(
        std::fs::read_to_string(saved.dir.join(files::PTX_FILE)).unwrap(),
        PTX
    );
    let loaded = pending::load(&f.kopt, "fixture-kernels", "softmax", "sm_90").unwrap();
    assert_eq!(loaded, p);
}

#[test]
fn an_accepted_ptx_runs_only_as_the_lock_records_it() {
    let f = Fixture::new();
    let t = f.target();
    let p = with_ptx(f.pending("vec4-a", "run-1", ""), PTX);
    pending::save(&f.kopt, &p).unwrap();
    Journal::open_or_resume(&f.kopt, "run-1").unwrap();
    let plan = accept::plan_accept(&t, &f.kopt, &p, AcceptAs::default()).unwrap();
    accept::apply_accept(&t, &f.kopt, &plan).unwrap();
    assert_eq!(f.read("kopt/softmax/vec4-a/kernel.ptx"), PTX);
    let lock = LockFile::parse(&f.read("kopt/softmax/kopt.lock")).unwrap();
    assert_eq!(lock.accepted[0].ptx, Some(record(PTX, "sm_90")));
    let r = Rationale::parse(&f.read("kopt/softmax/vec4-a/rationale.json")).unwrap();
    assert_eq!(r.claim.unwrap().ptx, Some(record(PTX, "sm_90")));
    let state = selection::resolve(&f.crate_root, &f.spec, &f.hashes);
    let u = state.entries[0].status.as_ref().unwrap();
    assert_eq!(u.ptx.as_ref().map(|p| p.text.as_str()), Some(PTX));
    assert!(
        state
            .tracked
            .iter()
            .any(|p| p.ends_with("vec4-a/kernel.ptx")),
        "the build reruns when the PTX changes"
    );

    // An edited PTX makes the entry corrupt: the reference runs, check fails.
    f.write("kopt/softmax/vec4-a/kernel.ptx", &format!("{PTX}\n"));
    let state = selection::resolve(&f.crate_root, &f.spec, &f.hashes);
    match &state.entries[0].status {
        Err(Unusable::Corrupt(m)) => assert!(m.contains("kernel.ptx does not match"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(!state.problems.is_empty());
    // So does a missing one.
    std::fs::remove_file(f.path("kopt/softmax/vec4-a/kernel.ptx")).unwrap();
    let state = selection::resolve(&f.crate_root, &f.spec, &f.hashes);
    match &state.entries[0].status {
        Err(Unusable::Corrupt(m)) => assert!(m.contains("cannot read kernel.ptx"), "{m}"),
        other => panic!("{other:?}"),
    }
    // And a record of PTX for another architecture than the entry's.
    f.write("kopt/softmax/vec4-a/kernel.ptx", PTX);
    let mut lock = LockFile::parse(&f.read("kopt/softmax/kopt.lock")).unwrap();
    lock.accepted[0].ptx = Some(record(PTX, "sm_80"));
    f.write("kopt/softmax/kopt.lock", &lock.render());
    let state = selection::resolve(&f.crate_root, &f.spec, &f.hashes);
    match &state.entries[0].status {
        Err(Unusable::Corrupt(m)) => assert!(m.contains("compiled for `sm_80`"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn verified_ptx_is_kept_with_an_accepted_variant_in_one_lock_write() {
    let f = Fixture::new();
    let t = f.target();
    let p = f.pending("vec4-a", "run-1", "");
    pending::save(&f.kopt, &p).unwrap();
    Journal::open_or_resume(&f.kopt, "run-1").unwrap();
    let plan = accept::plan_accept(&t, &f.kopt, &p, AcceptAs::default()).unwrap();
    accept::apply_accept(&t, &f.kopt, &plan).unwrap();
    let entry = LockFile::parse(&f.read("kopt/softmax/kopt.lock"))
        .unwrap()
        .accepted[0]
        .clone();
    assert_eq!(entry.ptx, None);
    let variant_before = f.read("kopt/softmax/vec4-a/variant.toml");

    // A record that does not match the bytes, or is for another architecture: refused,
    // nothing written.
    let e = accept::keep_ptx(&t, &entry, PTX, &record("other", "sm_90")).unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e}");
    let e = accept::keep_ptx(&t, &entry, PTX, &record(PTX, "sm_80")).unwrap_err();
    assert!(e.to_string().contains("compiled for sm_80"), "{e}");
    assert!(!f.path("kopt/softmax/vec4-a/kernel.ptx").exists());

    let kept = accept::keep_ptx(&t, &entry, PTX, &record(PTX, "sm_90")).unwrap();
    assert_eq!(kept.file, "kopt/softmax/vec4-a/kernel.ptx");
    assert_eq!(f.read("kopt/softmax/vec4-a/kernel.ptx"), PTX);
    assert_eq!(
        f.read("kopt/softmax/vec4-a/variant.toml"),
        variant_before,
        "the files the lock hashed are untouched"
    );
    let lock = LockFile::parse(&f.read("kopt/softmax/kopt.lock")).unwrap();
    assert_eq!(lock.accepted[0].ptx, Some(record(PTX, "sm_90")));
    let r = Rationale::parse(&f.read("kopt/softmax/vec4-a/rationale.json")).unwrap();
    assert_eq!(r.claim.as_ref().unwrap().ptx, Some(record(PTX, "sm_90")));
    assert_eq!(
        f.read("kopt/softmax/vec4-a/RATIONALE.md"),
        r.render_markdown()
    );
    let state = selection::resolve(&f.crate_root, &f.spec, &f.hashes);
    assert!(
        state.entries[0].status.is_ok(),
        "{:?}",
        state.entries[0].status
    );
    assert!(state.problems.is_empty(), "{:?}", state.problems);

    // The entry it was verified as has changed since (it now records the PTX): another
    // PTX for it is refused, and the file stays.
    let other = format!("{PTX}// another build\n");
    let e = accept::keep_ptx(&t, &entry, &other, &record(&other, "sm_90")).unwrap_err();
    assert!(matches!(e, Error::Conflict(_)), "{e}");
    assert_eq!(f.read("kopt/softmax/vec4-a/kernel.ptx"), PTX);
}
