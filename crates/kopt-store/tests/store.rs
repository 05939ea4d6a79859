//! Pending variants, accept (including interrupted ones), reject and re-activation, on a
//! scratch crate, with the build's own decision (`kopt_spec::selection::resolve`) as judge.

mod common;

use common::Fixture;
use kopt_spec::files::{self, LockFile, Rationale, VerifiedBy};
use kopt_spec::selection;
use kopt_store::accept::{self, AcceptAs, CrashPoint, FolderAction};
use kopt_store::journal::{Decision, Event, Journal};
use kopt_store::{pending, Error};

/// Which variants the build would use for sm_90, in order; panics on anything unusable.
fn usable(f: &Fixture) -> Vec<String> {
    let state = selection::resolve(&f.crate_root, &f.spec, &f.hashes);
    for e in &state.entries {
        assert!(
            e.status.is_ok(),
            "{} is unusable: {:?}",
            e.entry.variant,
            e.status
        );
    }
    assert!(state.problems.is_empty(), "{:?}", state.problems);
    state
        .usable_for("sm_90", None)
        .map(|(e, _)| e.variant.clone())
        .collect()
}

#[test]
fn pending_round_trip_and_replacement_keeps_the_older() {
    let f = Fixture::new();
    let first = f.pending("vec4-a", "run-1", "");
    let saved = pending::save(&f.kopt, &first).unwrap();
    assert_eq!(saved.replaced, None);
    // Its region is in the folder's name, beside the architecture.
    assert_eq!(
        saved.dir,
        f.kopt
            .pending_dir("fixture-kernels", "softmax", &first.meta.slot())
    );
    assert!(
        first.meta.slot().starts_with("sm_90@"),
        "{}",
        first.meta.slot()
    );
    let mut names: Vec<String> = std::fs::read_dir(&saved.dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "kernel.cu",
            "pending.json",
            "rationale.json",
            "variant.toml"
        ]
    );
    let loaded = pending::load(&f.kopt, "fixture-kernels", "softmax", "sm_90").unwrap();
    assert_eq!(loaded, first, "what is saved is what is loaded");

    // A newer winner from another run replaces it; the older is kept in the new run.
    let (mut journal, _) = Journal::open_or_resume(&f.kopt, "run-2").unwrap();
    let second = f.pending("vec4-b", "run-2", "// second\n");
    let saved = journal.save_pending(&f.kopt, &second).unwrap();
    let replaced = saved.replaced.expect("the older one is reported");
    assert_eq!(
        (replaced.variant.as_str(), replaced.run_id.as_str()),
        ("vec4-a", "run-1")
    );
    assert!(replaced
        .kept_in
        .starts_with(f.kopt.run_dir("run-2").join("replaced")));
    assert_eq!(
        pending::load_dir(&replaced.kept_in).unwrap().meta.variant,
        "vec4-a",
        "kept whole"
    );
    let listing = pending::list(&f.kopt);
    assert!(listing.broken.is_empty());
    assert_eq!(listing.variants.len(), 1);
    assert_eq!(listing.variants[0].meta.variant, "vec4-b");
    let events = Journal::read(&f.kopt, "run-2").unwrap().entries;
    assert!(
        matches!(&events[0].event, Event::PendingSaved { variant, replaced: Some(r), .. } if variant == "vec4-b" && r.contains("vec4-a")),
        "{events:?}"
    );

    // A folder that cannot be read is listed as broken, not hidden.
    let other = f.kopt.pending_dir("fixture-kernels", "softmax", "sm_80");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("pending.json"), "{").unwrap();
    let listing = pending::list(&f.kopt);
    assert_eq!(listing.variants.len(), 1);
    assert_eq!(listing.broken.len(), 1);
    assert_eq!(listing.broken[0].0, other);

    pending::remove(&f.kopt, "fixture-kernels", "softmax", "sm_90").unwrap();
    assert!(matches!(
        pending::load(&f.kopt, "fixture-kernels", "softmax", "sm_90"),
        Err(Error::NotFound(_))
    ));
}

#[test]
fn only_verified_consistent_candidates_may_wait() {
    let f = Fixture::new();
    let mut p = f.pending("v", "run-1", "");
    p.meta.evidence.fences.push(kopt_store::pending::Fence {
        name: "watchdog".into(),
        passed: false,
        detail: "3.4% slower on cols=1024 rows=32768".into(),
    });
    let err = pending::save(&f.kopt, &p).unwrap_err().to_string();
    assert!(err.contains("failed the `watchdog` fence"), "{err}");

    let mut p = f.pending("v", "run-1", "");
    p.variant.id = "w".into();
    let err = pending::save(&f.kopt, &p).unwrap_err().to_string();
    assert!(err.contains("variant.toml describes `softmax/w`"), "{err}");

    let mut p = f.pending("v", "run-1", "");
    p.meta.arch = "hopper".into();
    p.rationale.arch = "hopper".into();
    let err = pending::save(&f.kopt, &p).unwrap_err().to_string();
    assert!(err.contains("not an architecture name"), "{err}");
    assert!(
        !f.kopt.pending_root().exists(),
        "nothing written on refusal"
    );
}

#[test]
fn accept_writes_the_files_and_the_lock_and_replaces_with_notice() {
    let f = Fixture::new();
    let t = f.target();
    // First accept: no lock yet.
    let p = f.pending("vec4-a", "run-1", "");
    pending::save(&f.kopt, &p).unwrap();
    Journal::open_or_resume(&f.kopt, "run-1").unwrap();
    let plan = accept::plan_accept(&t, &f.kopt, &p, AcceptAs::default()).unwrap();
    assert!(plan.creates_lock && plan.replaces.is_empty());
    assert_eq!(plan.folder, FolderAction::Create);
    let done = accept::apply_accept(&t, &f.kopt, &plan).unwrap();
    assert_eq!(done.folder, "kopt/softmax/vec4-a");
    assert!(done.created_lock);
    assert_eq!(usable(&f), ["vec4-a"]);
    let lock = LockFile::parse(&f.read("kopt/softmax/kopt.lock")).unwrap();
    assert_eq!(lock.accepted[0].verified_by, VerifiedBy::Kopt);
    assert_eq!(lock.accepted[0].region.as_deref(), Some("cols % 4 == 0"));
    let r = Rationale::parse(&f.read("kopt/softmax/vec4-a/rationale.json")).unwrap();
    let claim = r
        .claim
        .as_ref()
        .expect("the committed rationale records its claim");
    assert_eq!(claim.reference_hash, f.hashes.reference);
    assert_eq!(
        f.read("kopt/softmax/vec4-a/RATIONALE.md"),
        r.render_markdown()
    );
    assert_eq!(f.read("kopt/softmax/vec4-a/kernel.cu"), p.source);
    assert!(
        pending::list(&f.kopt).variants.is_empty(),
        "no longer pending"
    );
    let kept = done.pending_kept_in.unwrap();
    assert!(
        kept.starts_with(f.kopt.run_dir("run-1").join("accepted")),
        "{kept:?}"
    );
    let events = Journal::read(&f.kopt, "run-1").unwrap().entries;
    assert!(matches!(
        events.last().map(|e| &e.event),
        Some(Event::Reviewed {
            decision: Decision::Accepted,
            ..
        })
    ));

    // A second winner replaces it, and the plan says so with the old source.
    let q = f.pending("vec4-b", "run-2", "// b\n");
    let plan = accept::plan_accept(&t, &f.kopt, &q, AcceptAs::default()).unwrap();
    assert_eq!(plan.replaces.len(), 1);
    assert_eq!(plan.replaces[0].entry.variant, "vec4-a");
    assert_eq!(plan.replaces[0].status, "active");
    assert_eq!(plan.replaces[0].source.as_deref(), Some(p.source.as_str()));
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("measured against the reference only, but `vec4-a` is accepted")),
        "{:?}",
        plan.notes
    );
    let done = accept::apply_accept(&t, &f.kopt, &plan).unwrap();
    assert_eq!(done.replaced, ["vec4-a"]);
    assert_eq!(usable(&f), ["vec4-b"]);
    assert!(
        f.path("kopt/softmax/vec4-a/kernel.cu").exists(),
        "the old folder stays"
    );
}

#[test]
fn a_stale_pending_variant_is_refused_with_how_to_reverify() {
    let mut f = Fixture::new();
    let p = f.pending("vec4-a", "run-1", "");
    std::fs::write(
        f.path("kernels/common.cuh"),
        format!("{}\n// edited\n", f.read("kernels/common.cuh")),
    )
    .unwrap();
    f.refresh();
    let err = accept::plan_accept(&f.target(), &f.kopt, &p, AcceptAs::default()).unwrap_err();
    assert!(matches!(err, Error::Stale(_)), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(
            "the reference source (or one of its includes) changed since run run-1 verified it"
        ),
        "{msg}"
    );
    assert!(
        msg.contains("cargo kopt optimize softmax")
            && msg.contains("cargo kopt reject softmax --arch sm_90"),
        "{msg}"
    );
}

#[test]
fn a_taken_name_is_never_overwritten_and_as_renames() {
    let f = Fixture::new();
    let t = f.target();
    let p = f.pending("vec4", "run-1", "");
    accept::apply_accept(
        &t,
        &f.kopt,
        &accept::plan_accept(&t, &f.kopt, &p, AcceptAs::default()).unwrap(),
    )
    .unwrap();
    let before = f.read("kopt/softmax/vec4/kernel.cu");

    let q = f.pending("vec4", "run-2", "// different code, same name\n");
    let err = accept::plan_accept(&t, &f.kopt, &q, AcceptAs::default()).unwrap_err();
    assert!(matches!(err, Error::Conflict(_)), "{err:?}");
    assert!(err.to_string().contains("--as vec4-2"), "{err}");
    assert_eq!(f.read("kopt/softmax/vec4/kernel.cu"), before);

    let plan = accept::plan_accept(&t, &f.kopt, &q, AcceptAs::named("vec4-2")).unwrap();
    assert_eq!(plan.renamed_from.as_deref(), Some("vec4"));
    accept::apply_accept(&t, &f.kopt, &plan).unwrap();
    assert_eq!(usable(&f), ["vec4-2"]);
    let v = files::VariantFile::parse(&f.read("kopt/softmax/vec4-2/variant.toml")).unwrap();
    assert_eq!(v.id, "vec4-2");

    // The same code verified again refreshes only the audit files.
    let again = f.pending("vec4-2", "run-3", "// different code, same name\n");
    let plan = accept::plan_accept(&t, &f.kopt, &again, AcceptAs::default()).unwrap();
    assert_eq!(plan.folder, FolderAction::RefreshAudit);
    accept::apply_accept(&t, &f.kopt, &plan).unwrap();
    assert_eq!(usable(&f), ["vec4-2"]);
}

#[test]
fn the_build_could_not_use_it_so_accept_refuses() {
    let f = Fixture::new();
    let mut p = f.pending("bad-region", "run-1", "");
    p.meta.region = Some("colz % 4 == 0".into());
    let err = accept::plan_accept(&f.target(), &f.kopt, &p, AcceptAs::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("the build could not use it") && err.contains("region"),
        "{err}"
    );
    assert!(!f.path("kopt").exists(), "nothing written");
}

#[test]
fn an_interrupted_accept_leaves_the_old_state_or_the_new_never_half() {
    for crash in [
        CrashPoint::DuringFolderWrite,
        CrashPoint::BeforeLock,
        CrashPoint::AfterLock,
    ] {
        let f = Fixture::new();
        let t = f.target();
        let old = f.pending("old", "run-0", "");
        accept::apply_accept(
            &t,
            &f.kopt,
            &accept::plan_accept(&t, &f.kopt, &old, AcceptAs::default()).unwrap(),
        )
        .unwrap();
        let lock_before = f.read("kopt/softmax/kopt.lock");
        let new = f.pending("new", "run-1", "// new\n");
        pending::save(&f.kopt, &new).unwrap();

        let plan = accept::plan_accept(&t, &f.kopt, &new, AcceptAs::default()).unwrap();
        let stopped = accept::apply_accept_until(&t, &f.kopt, &plan, Some(crash)).unwrap();
        assert!(stopped.is_none());

        // What the build sees is whole: the old variant, or (after the commit point) the
        // new one; every entry usable, nothing half-written under a visible name.
        let expected = if crash == CrashPoint::AfterLock {
            "new"
        } else {
            "old"
        };
        assert_eq!(usable(&f), [expected], "{crash:?}");
        if crash != CrashPoint::AfterLock {
            assert_eq!(f.read("kopt/softmax/kopt.lock"), lock_before, "{crash:?}");
        }
        for name in f.kernel_dir_names() {
            if name.starts_with('.') {
                assert!(name.contains(".kopt-tmp-"), "{crash:?}: {name}");
                continue;
            }
            if name == "kopt.lock" {
                continue;
            }
            for file in [
                "kernel.cu",
                "variant.toml",
                "rationale.json",
                "RATIONALE.md",
            ] {
                assert!(
                    f.path(&format!("kopt/softmax/{name}/{file}")).is_file(),
                    "{crash:?}: {name}/{file}"
                );
            }
        }
        // The pending variant is still there to accept again, which completes the job
        // and sweeps the litter away.
        let again = pending::load(&f.kopt, "fixture-kernels", "softmax", "sm_90").unwrap();
        let plan = accept::plan_accept(&t, &f.kopt, &again, AcceptAs::default()).unwrap();
        accept::apply_accept(&t, &f.kopt, &plan).unwrap();
        assert_eq!(usable(&f), ["new"], "{crash:?}");
        assert!(
            f.kernel_dir_names().iter().all(|n| !n.starts_with('.')),
            "{crash:?}: {:?}",
            f.kernel_dir_names()
        );
        assert!(pending::list(&f.kopt).variants.is_empty());
    }
}

#[test]
fn a_lock_changed_after_planning_is_not_overwritten() {
    let f = Fixture::new();
    let t = f.target();
    let a = f.pending("a", "run-1", "");
    let plan_a = accept::plan_accept(&t, &f.kopt, &a, AcceptAs::default()).unwrap();
    let b = f.pending("b", "run-2", "// b\n");
    let plan_b = accept::plan_accept(&t, &f.kopt, &b, AcceptAs::default()).unwrap();
    accept::apply_accept(&t, &f.kopt, &plan_b).unwrap();
    let err = accept::apply_accept(&t, &f.kopt, &plan_a).unwrap_err();
    assert!(matches!(err, Error::Conflict(_)), "{err:?}");
    assert!(err.to_string().contains("review again"), "{err}");
    assert_eq!(usable(&f), ["b"]);
}

#[test]
fn reject_keeps_the_candidate_in_its_run() {
    let f = Fixture::new();
    let p = f.pending("meh", "run-7", "");
    pending::save(&f.kopt, &p).unwrap();
    Journal::open_or_resume(&f.kopt, "run-7").unwrap();
    let r = accept::reject(&f.kopt, &p, Some("not worth the complexity")).unwrap();
    assert!(r
        .kept_in
        .starts_with(f.kopt.run_dir("run-7").join("rejected")));
    assert_eq!(pending::load_dir(&r.kept_in).unwrap(), p);
    assert!(pending::list(&f.kopt).variants.is_empty());
    let events = Journal::read(&f.kopt, "run-7").unwrap().entries;
    assert!(matches!(
        &events.last().unwrap().event,
        Event::Reviewed { decision: Decision::Rejected, detail: Some(d), .. } if d == "not worth the complexity"
    ));
}

#[test]
fn reactivation_needs_current_hashes() {
    let mut f = Fixture::new();
    {
        let t = f.target();
        for (name, run) in [("a", "run-1"), ("b", "run-2")] {
            let p = f.pending(name, run, &format!("// {name}\n"));
            accept::apply_accept(
                &t,
                &f.kopt,
                &accept::plan_accept(&t, &f.kopt, &p, AcceptAs::default()).unwrap(),
            )
            .unwrap();
        }
        assert_eq!(usable(&f), ["b"]);
        let r = accept::reactivate(&t, &f.kopt, "a", None).unwrap();
        assert_eq!(
            (r.arch.as_str(), r.region.as_deref()),
            ("sm_90", Some("cols % 4 == 0"))
        );
        assert_eq!(r.replaced[0].entry.variant, "b");
        assert_eq!(usable(&f), ["a"]);
        let err = accept::reactivate(&t, &f.kopt, "a", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("already the accepted variant"), "{err}");
        let err = accept::reactivate(&t, &f.kopt, "a", Some("sm_80"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("verified on sm_90, not sm_80"), "{err}");
        let err = accept::reactivate(&t, &f.kopt, "zzz", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("kopt/softmax/zzz does not exist"), "{err}");

        // A rationale without a claim cannot be trusted to be current.
        let path = f.path("kopt/softmax/b/rationale.json");
        let mut r = Rationale::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
        r.claim = None;
        std::fs::write(&path, r.to_json()).unwrap();
        let err = accept::reactivate(&t, &f.kopt, "b", None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("does not record what `b` was verified against"),
            "{err}"
        );
        assert!(
            err.contains("cargo kopt pin softmax b --arch sm_90"),
            "{err}"
        );
    }
    // After the reference changed, neither can come back without verification.
    std::fs::write(
        f.path("kernels/softmax.cu"),
        f.read("kernels/softmax.cu")
            .replace("three passes", "3 passes"),
    )
    .unwrap();
    f.refresh();
    let err = accept::reactivate(&f.target(), &f.kopt, "a", None).unwrap_err();
    assert!(matches!(err, Error::Stale(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("verified against another reference source"),
        "{err}"
    );
}

#[test]
fn evidence_from_the_fake_device_is_never_accepted() {
    let f = Fixture::new();
    let mut p = f.pending("faked", "run-1", "");
    p.rationale.provenance.device = format!("{} (sm_90)", files::FAKE_DEVICE_NAME);
    // It may wait for review (the loop's tests run on the fake device), but not be accepted.
    pending::save(&f.kopt, &p).unwrap();
    let err = accept::plan_accept(&f.target(), &f.kopt, &p, AcceptAs::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("pending variant `faked` of `softmax` for sm_90 was measured on kopt's fake device (`kopt fake GPU (sm_90)`"),
        "{err}"
    );
    assert!(
        err.contains("cargo kopt reject softmax --arch sm_90"),
        "{err}"
    );
    assert!(!f.path("kopt").exists(), "nothing written");
}

#[test]
fn an_accepted_claim_records_the_files_and_an_edit_stops_reactivation() {
    let f = Fixture::new();
    let t = f.target();
    for (name, run) in [("a", "run-1"), ("b", "run-2")] {
        let p = f.pending(name, run, &format!("// {name}\n"));
        accept::apply_accept(
            &t,
            &f.kopt,
            &accept::plan_accept(&t, &f.kopt, &p, AcceptAs::default()).unwrap(),
        )
        .unwrap();
    }
    // The claim holds the hashes the lock recorded when `a` was accepted.
    let claim = Rationale::parse(&f.read("kopt/softmax/a/rationale.json"))
        .unwrap()
        .claim
        .unwrap();
    let src = f.read("kopt/softmax/a/kernel.cu");
    let vtext = f.read("kopt/softmax/a/variant.toml");
    assert_eq!(
        claim.source_hash.as_deref(),
        Some(kopt_spec::source::hash(src.as_bytes()).as_str())
    );
    assert_eq!(
        claim.variant_hash.as_deref(),
        Some(kopt_spec::source::hash(vtext.as_bytes()).as_str())
    );

    // `a` is superseded; an edit of its kernel.cu is caught, naming the file.
    let edited = src.replace("__global__", "__global__ /* edited */");
    assert_ne!(edited, src);
    std::fs::write(f.path("kopt/softmax/a/kernel.cu"), &edited).unwrap();
    let err = accept::reactivate(&t, &f.kopt, "a", None)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("kopt/softmax/a/kernel.cu is not the file `a` was verified with"),
        "{err}"
    );
    assert!(
        err.contains("git checkout -- kopt/softmax/a/kernel.cu"),
        "{err}"
    );
    assert_eq!(usable(&f), ["b"], "the lock is unchanged");
    std::fs::write(f.path("kopt/softmax/a/kernel.cu"), &src).unwrap();
    std::fs::write(
        f.path("kopt/softmax/a/variant.toml"),
        vtext.replace("block", "# edited\nblock"),
    )
    .unwrap();
    let err = accept::reactivate(&t, &f.kopt, "a", None)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("kopt/softmax/a/variant.toml is not the file"),
        "{err}"
    );
    std::fs::write(f.path("kopt/softmax/a/variant.toml"), &vtext).unwrap();

    // A claim written before the hashes were recorded cannot vouch for the files.
    let path = f.path("kopt/softmax/a/rationale.json");
    let mut r = Rationale::parse(&f.read("kopt/softmax/a/rationale.json")).unwrap();
    let full = r.clone();
    let c = r.claim.as_mut().unwrap();
    (c.source_hash, c.variant_hash) = (None, None);
    std::fs::write(&path, r.to_json()).unwrap();
    let err = accept::reactivate(&t, &f.kopt, "a", None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("written before kopt recorded the hashes of kernel.cu and variant.toml"),
        "{err}"
    );
    assert!(
        err.contains("cargo kopt pin softmax a --arch sm_90 --region 'cols % 4 == 0'"),
        "{err}"
    );

    // With the files as verified, it comes back.
    std::fs::write(&path, full.to_json()).unwrap();
    accept::reactivate(&t, &f.kopt, "a", None).unwrap();
    assert_eq!(usable(&f), ["a"]);
}

/// The variants of the lock in order, with their regions and devices.
fn lock_entries(f: &Fixture) -> Vec<(String, Option<String>, Option<String>)> {
    LockFile::parse(&f.read("kopt/softmax/kopt.lock"))
        .unwrap()
        .accepted
        .into_iter()
        .map(|e| (e.variant, e.region, e.device))
        .collect()
}

fn accept_now(f: &Fixture, p: &pending::PendingVariant, how: AcceptAs) -> accept::AcceptPlan {
    let t = f.target();
    let plan = accept::plan_accept(&t, &f.kopt, p, how).unwrap();
    accept::apply_accept(&t, &f.kopt, &plan).unwrap();
    plan
}

fn owned(
    v: &str,
    region: Option<&str>,
    device: Option<&str>,
) -> (String, Option<String>, Option<String>) {
    (v.into(), region.map(Into::into), device.map(Into::into))
}

#[test]
fn an_accept_for_a_region_replaces_only_the_entries_it_covers() {
    let f = Fixture::new();
    let mut a = f.pending("a", "run-1", "");
    a.meta.region = None;
    accept_now(&f, &a, AcceptAs::default());

    // `b` wins where cols <= 4096 only: `a` stays behind it for the other shapes.
    let mut b = f.pending("b", "run-2", "// b\n");
    b.meta.region = Some("cols <= 4096".into());
    let plan = accept_now(&f, &b, AcceptAs::default());
    assert!(plan.replaces.is_empty(), "{:?}", plan.replaces);
    assert_eq!(plan.keeps, ["a"]);
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("`a` stays for sm_90, behind it: it runs where `b` does not apply")),
        "{:?}",
        plan.notes
    );
    let map: Vec<(&str, &str, &str)> = plan
        .region_map
        .iter()
        .filter(|r| !r.held_out)
        .map(|r| (r.shape.as_str(), r.before.as_str(), r.after.as_str()))
        .collect();
    assert_eq!(
        map,
        [
            ("cols=4096 rows=4096", "a", "b"),
            ("cols=65536 rows=16", "a", "a"),
            ("cols=1024 rows=32768", "a", "b"),
            ("cols=50257 rows=8", "a", "a"),
        ]
    );
    // The held-out shapes are in the map too, each on the side of the region it falls.
    let held_out: Vec<_> = plan.region_map.iter().filter(|r| r.held_out).collect();
    assert!(!held_out.is_empty());
    for r in held_out {
        let cols: i64 = r
            .shape
            .split("cols=")
            .nth(1)
            .unwrap()
            .split([' ', '/'])
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(r.after, if cols <= 4096 { "b" } else { "a" }, "{r:?}");
    }
    assert_eq!(
        lock_entries(&f),
        [
            owned("b", Some("cols <= 4096"), None),
            owned("a", None, None)
        ]
    );
    // The build's choice agrees with the map.
    let state = selection::resolve(&f.crate_root, &f.spec, &f.hashes);
    let runs = |rows: i64, cols: i64| {
        selection::select(&state, &f.spec, "sm_90", None, &[rows, cols])
            .map(|(e, _)| e.variant.clone())
    };
    assert_eq!(runs(4096, 4096).as_deref(), Some("b"));
    assert_eq!(runs(16, 65536).as_deref(), Some("a"));

    // `c` runs on every shape where `a` and `b` run: both leave the lock.
    let mut c = f.pending("c", "run-3", "// c\n");
    c.meta.region = Some("cols >= 1".into());
    let plan = accept_now(&f, &c, AcceptAs::default());
    let replaced: Vec<&str> = plan
        .replaces
        .iter()
        .map(|r| r.entry.variant.as_str())
        .collect();
    assert_eq!(replaced, ["b", "a"]);
    assert!(plan.keeps.is_empty());
    assert_eq!(lock_entries(&f), [owned("c", Some("cols >= 1"), None)]);
}

#[test]
fn a_narrowed_winner_retires_the_start_so_the_reference_runs_the_rest() {
    let f = Fixture::new();
    let mut a = f.pending("a", "run-1", "");
    a.meta.region = None;
    accept_now(&f, &a, AcceptAs::default());
    let a_hash = lock_entry_source_hash(&f, "a");

    // A plain region winner leaves `a` behind it...
    let mut b = f.pending("b", "run-2", "// b\n");
    b.meta.region = Some("cols <= 4096".into());
    let plan = accept::plan_accept(&f.target(), &f.kopt, &b, AcceptAs::default()).unwrap();
    assert_eq!(plan.keeps, ["a"]);
    // ...one narrowed to where it beats the reference, from a loop that started at `a`,
    // retires it: the reference runs the shapes outside its region.
    b.meta.retires = Some(pending::Baseline {
        variant: "a".into(),
        source_hash: a_hash.clone(),
    });
    let plan = accept_now(&f, &b, AcceptAs::default());
    assert!(plan.keeps.is_empty(), "{:?}", plan.keeps);
    assert!(
        plan.notes.iter().any(|n| n.starts_with("it retires `a`")),
        "{:?}",
        plan.notes
    );
    let map: Vec<(&str, &str, &str)> = plan
        .region_map
        .iter()
        .filter(|r| !r.held_out)
        .map(|r| (r.shape.as_str(), r.before.as_str(), r.after.as_str()))
        .collect();
    assert_eq!(
        map,
        [
            ("cols=4096 rows=4096", "a", "b"),
            ("cols=65536 rows=16", "a", "reference"),
            ("cols=1024 rows=32768", "a", "b"),
            ("cols=50257 rows=8", "a", "reference"),
        ]
    );
    assert_eq!(lock_entries(&f), [owned("b", Some("cols <= 4096"), None)]);

    // A `retires` that names another source (the variant was edited and accepted again
    // since) retires nothing.
    let mut c = f.pending("c", "run-3", "// c\n");
    c.meta.region = None;
    accept_now(&f, &c, AcceptAs::default());
    let mut d = f.pending("d", "run-4", "// d\n");
    d.meta.region = Some("cols <= 1024".into());
    d.meta.retires = Some(pending::Baseline {
        variant: "c".into(),
        source_hash: a_hash,
    });
    let plan = accept_now(&f, &d, AcceptAs::default());
    assert_eq!(plan.keeps, ["c"]);
}

/// The source hash the lock records for `variant`.
fn lock_entry_source_hash(f: &Fixture, variant: &str) -> String {
    LockFile::parse(&f.read("kopt/softmax/kopt.lock"))
        .unwrap()
        .accepted
        .into_iter()
        .find(|e| e.variant == variant)
        .unwrap()
        .source_hash
}

#[test]
fn a_device_specific_accept_is_keyed_by_the_device_and_leaves_the_architecture_alone() {
    let f = Fixture::new();
    let mut a = f.pending("a", "run-1", "");
    a.meta.region = None;
    accept_now(&f, &a, AcceptAs::default());
    let mut d = f.pending("d", "run-2", "// d\n");
    d.meta.region = None;
    let how = AcceptAs {
        name: None,
        device_specific: true,
    };
    let plan = accept_now(&f, &d, how);
    assert!(plan.replaces.is_empty(), "another key: {:?}", plan.replaces);
    assert_eq!(plan.entry.key(), "NVIDIA H200 (sm_90)");
    assert!(plan
        .region_map
        .iter()
        .all(|r| r.before == "a" && r.after == "d"));
    assert_eq!(
        lock_entries(&f),
        [
            owned("a", None, None),
            owned("d", None, Some("NVIDIA H200"))
        ]
    );
    let text = f.read("kopt/softmax/kopt.lock");
    assert!(text.contains("format = 2"), "{text}");
    let claim = Rationale::parse(&f.read("kopt/softmax/d/rationale.json"))
        .unwrap()
        .claim
        .unwrap();
    assert_eq!(claim.device.as_deref(), Some("NVIDIA H200"));
    // The H200 runs `d`; another sm_90 device runs `a`.
    let state = selection::resolve(&f.crate_root, &f.spec, &f.hashes);
    let runs = |device| {
        selection::select(&state, &f.spec, "sm_90", device, &[4096, 4096])
            .map(|(e, _)| e.variant.clone())
    };
    assert_eq!(runs(Some("NVIDIA H200")).as_deref(), Some("d"));
    assert_eq!(runs(Some("NVIDIA H100 80GB HBM3")).as_deref(), Some("a"));
    assert_eq!(runs(None).as_deref(), Some("a"));
    // A later arch-wide accept replaces `a`, not the device's entry, and says it comes second there.
    let mut e = f.pending("e", "run-3", "// e\n");
    e.meta.region = None;
    let plan = accept_now(&f, &e, AcceptAs::default());
    let replaced: Vec<&str> = plan
        .replaces
        .iter()
        .map(|r| r.entry.variant.as_str())
        .collect();
    assert_eq!(replaced, ["a"]);
    assert!(
        plan.notes.iter().any(|n| n.contains(
            "entries keyed by device are tried before it on their device: `d` on NVIDIA H200"
        )),
        "{:?}",
        plan.notes
    );
    assert_eq!(
        lock_entries(&f),
        [
            owned("e", None, None),
            owned("d", None, Some("NVIDIA H200"))
        ]
    );
}
