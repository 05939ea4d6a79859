//! End to end, without a GPU: a pending variant is accepted, the build of a scratch copy
//! of the example selects it, a revert makes the build fall back, and `revert --to`
//! brings it back. Three incremental builds.

use kopt_store::pending;
use kopt_tests::{pending_from_shipped, ExampleWorkspace};
use kopt_workspace::{commands, gather, store};

fn gathered(ws: &ExampleWorkspace) -> gather::Gathered {
    gather::gather(&gather::Selection {
        manifest_path: Some(ws.manifest()),
        ..Default::default()
    })
    .unwrap()
}

/// Builds the copy (incrementally) and returns the softmax line for 4096x4096 on sm_90.
fn softmax_4096(ws: &ExampleWorkspace) -> String {
    ws.explain("sm_90")
        .lines()
        .find(|l| l.starts_with("softmax") && l.contains("cols=4096 rows=4096"))
        .expect("a softmax line for 4096x4096")
        .to_string()
}

#[test]
fn pending_accept_build_revert_fallback() {
    let ws = ExampleWorkspace::new();
    let g = gathered(&ws);
    let k = commands::find(&g, "softmax").unwrap();
    commands::revert(k, Some("sm_90")).unwrap();

    // The loop leaves a winner pending (the shipped kernel under a new name).
    let p = pending_from_shipped(
        &ws,
        "online-vec4-rt",
        "run-e2e",
        "sm_90",
        (&k.hashes.reference, &k.hashes.spec),
        "",
    );
    pending::save(&store::kopt_dir(&g), &p).unwrap();
    let g = gathered(&ws);
    let chosen = store::select_pending(&g, Some("softmax"), None, false).unwrap();
    assert_eq!(chosen.len(), 1);

    // Accept: the files are written and the lock names the variant.
    let reports =
        store::accept_pending(&g, &chosen, kopt_store::accept::AcceptAs::default(), None).unwrap();
    assert_eq!(reports[0].accepted.variant, "online-vec4-rt");
    assert!(reports[0].replaced.is_empty(), "the reference ran on sm_90");
    for f in [
        "kernel.cu",
        "variant.toml",
        "rationale.json",
        "RATIONALE.md",
    ] {
        assert!(
            ws.path(&format!("kopt/softmax/online-vec4-rt/{f}"))
                .is_file(),
            "{f}"
        );
    }
    assert!(ws
        .read("kopt/softmax/kopt.lock")
        .contains("variant = \"online-vec4-rt\""));
    assert!(commands::check(&gathered(&ws)).problems.is_empty());
    assert!(pending::list(&store::kopt_dir(&g)).variants.is_empty());

    // The build selects it.
    let line = softmax_4096(&ws);
    assert!(
        line.contains("variant `online-vec4-rt` (accepted for sm_90 where `cols % 4 == 0`)"),
        "{line}"
    );

    // Revert: the build falls back to the reference.
    let g = gathered(&ws);
    commands::revert(commands::find(&g, "softmax").unwrap(), Some("sm_90")).unwrap();
    let line = softmax_4096(&ws);
    assert!(line.contains("no accepted variant for sm_90"), "{line}");

    // And `revert --to` re-activates it from its folder, its claim being current.
    let g = gathered(&ws);
    let r = store::revert_to(
        &g,
        commands::find(&g, "softmax").unwrap(),
        "online-vec4-rt",
        None,
    )
    .unwrap();
    assert_eq!(r.region.as_deref(), Some("cols % 4 == 0"));
    let line = softmax_4096(&ws);
    assert!(line.contains("variant `online-vec4-rt`"), "{line}");
}
