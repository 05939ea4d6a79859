//! The shipped variant's rationale is not typed by hand: it is built by
//! `kopt_store::evidence::build` from the evidence recorded on the H200
//! (`docs/runs/2026-11-29-h200-softmax-online-vec4/evidence.json`, with the raw log in
//! the archive beside it). `KOPT_REGENERATE=1 cargo test -p kopt-tests --test
//! shipped_rationale` rewrites rationale.json and RATIONALE.md from it.

use kopt_spec::files::{self, LockFile};
use kopt_store::evidence::{self, Evidence};
use kopt_tests::repo_root;

#[test]
fn the_shipped_rationale_is_built_from_its_recorded_evidence() {
    let root = repo_root();
    let evidence = Evidence::parse(
        &std::fs::read_to_string(
            root.join("docs/runs/2026-11-29-h200-softmax-online-vec4/evidence.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let r = evidence::build(&evidence).unwrap();
    let dir = root.join("examples/llm-kernels/kopt/softmax/online-vec4");
    if std::env::var_os("KOPT_REGENERATE").is_some_and(|v| v == "1") {
        files::write_atomic(&dir.join(files::RATIONALE_JSON), r.to_json().as_bytes()).unwrap();
        files::write_atomic(
            &dir.join(files::RATIONALE_MD),
            r.render_markdown().as_bytes(),
        )
        .unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(dir.join(files::RATIONALE_JSON)).unwrap(),
        r.to_json(),
        "rationale.json differs from what its evidence builds (KOPT_REGENERATE=1 rewrites it)"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join(files::RATIONALE_MD)).unwrap(),
        r.render_markdown()
    );
    // The bandwidth figures are derived from the measured times, the ideal bytes
    // (8 per element) and the copy bandwidth measured on the H200; they are the figures
    // the run log reports (3187, 456 and 2800 GB/s of 4280).
    let pct: Vec<Option<f64>> = r.figures.iter().map(|f| f.copy_bandwidth_pct).collect();
    assert_eq!(pct, [Some(74.5), Some(10.7), Some(65.4)]);
    // Its claim is what the lock recorded for it. A later winner replaced it for sm_90 (its
    // folder stays, for `revert --to`); the claim was made against the same reference and
    // annotation as the lock's current entry.
    let lock = LockFile::parse(
        &std::fs::read_to_string(root.join("examples/llm-kernels/kopt/softmax/kopt.lock")).unwrap(),
    )
    .unwrap();
    let entry = &lock.accepted[0];
    let claim = r.claim.as_ref().unwrap();
    assert_eq!(
        (&claim.reference_hash, &claim.spec_hash),
        (&entry.reference_hash, &entry.spec_hash)
    );
    if entry.variant == "online-vec4" {
        assert_eq!(
            (&claim.region, claim.verified_by),
            (&entry.region, entry.verified_by)
        );
    }
}

/// Every committed variant folder of the example records, in its rationale's claim, the
/// hashes of the files that were verified, so that `cargo kopt check` can tell an edit of
/// any of them (the lock pins only the accepted ones). `KOPT_REGENERATE=1` fills in the
/// hashes of a claim written before kopt recorded them, from a lock entry that names the
/// variant with these very files' hashes (the lock vouches for those bytes); a folder
/// nothing vouches for that way is left for a person to look at.
#[test]
fn every_committed_variant_claims_the_hashes_of_its_files() {
    let kopt = repo_root().join("examples/llm-kernels/kopt");
    let regenerate = std::env::var_os("KOPT_REGENERATE").is_some_and(|v| v == "1");
    let mut checked = 0;
    for kdir in subdirs(&kopt) {
        let lock = LockFile::parse(&std::fs::read_to_string(kdir.join(files::LOCK_FILE)).unwrap())
            .unwrap();
        for vdir in subdirs(&kdir) {
            let read = |f: &str| std::fs::read_to_string(vdir.join(f)).unwrap();
            let (src, vtext) = (read(files::SOURCE_FILE), read(files::VARIANT_FILE));
            let ptx = std::fs::read_to_string(vdir.join(files::PTX_FILE)).ok();
            let mut r = files::Rationale::parse(&read(files::RATIONALE_JSON)).unwrap();
            let claim = r
                .claim
                .as_mut()
                .unwrap_or_else(|| panic!("{} has no claim", vdir.display()));
            let (source_hash, variant_hash) = (
                kopt_spec::source::hash(src.as_bytes()),
                kopt_spec::source::hash(vtext.as_bytes()),
            );
            let vouched = lock.accepted.iter().any(|e| {
                e.variant == r.variant
                    && e.source_hash == source_hash
                    && e.variant_hash == variant_hash
            });
            if regenerate && vouched && claim.source_hash.is_none() && claim.variant_hash.is_none()
            {
                claim.source_hash = Some(source_hash);
                claim.variant_hash = Some(variant_hash);
                files::write_atomic(&vdir.join(files::RATIONALE_JSON), r.to_json().as_bytes())
                    .unwrap();
                files::write_atomic(
                    &vdir.join(files::RATIONALE_MD),
                    r.render_markdown().as_bytes(),
                )
                .unwrap();
            }
            let claim = r.claim.as_ref().unwrap();
            assert_eq!(
                claim.compare_files(&src, &vtext, ptx.as_deref()),
                files::ClaimedFiles::Match,
                "{}: the claim's hashes are not those of its files (KOPT_REGENERATE=1 fills in missing ones that the lock vouches for)",
                vdir.display()
            );
            checked += 1;
        }
    }
    assert!(
        checked >= lock_entries(&kopt),
        "every accepted variant is among them"
    );
}

fn subdirs(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    v.sort();
    v
}

fn lock_entries(kopt: &std::path::Path) -> usize {
    subdirs(kopt)
        .iter()
        .map(|k| {
            LockFile::parse(&std::fs::read_to_string(k.join(files::LOCK_FILE)).unwrap())
                .unwrap()
                .accepted
                .len()
        })
        .sum()
}
