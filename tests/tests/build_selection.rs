//! End to end, without a GPU: what the build of the example crate embeds and selects as
//! its committed files change. Builds a scratch copy of the example several times.

use kopt_tests::{text, ExampleWorkspace};
use kopt_workspace::{commands, gather};

fn explain(ws: &ExampleWorkspace) -> String {
    ws.explain("sm_90")
}

/// Runs the last-built binary without building.
fn explain_built(arch: &str, env: &[(&str, &str)]) -> String {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| kopt_tests::repo_root().join("target"));
    let out = std::process::Command::new(target.join("kopt-e2e/debug/llm-kernels"))
        .args(["explain", "--arch", arch])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8(out.stdout).unwrap()
}

fn softmax_line<'a>(out: &'a str, shape: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with("softmax") && l.contains(shape))
        .unwrap_or_else(|| panic!("no softmax line for {shape} in\n{out}"))
}

fn softmax_kernel(ws: &ExampleWorkspace) -> gather::Kernel {
    let g = gather::gather(&gather::Selection {
        manifest_path: Some(ws.manifest()),
        ..Default::default()
    })
    .unwrap();
    commands::find(&g, "softmax").unwrap().clone()
}

fn pin_online_vec4(ws: &ExampleWorkspace) {
    commands::pin(
        &softmax_kernel(ws),
        "online-vec4",
        "sm_90",
        None,
        Some("cols % 4 == 0"),
    )
    .unwrap();
}

fn assert_online_vec4_runs_at_4096(out: &str) {
    assert!(
        softmax_line(out, "cols=4096 rows=4096")
            .contains("variant `online-vec4` (accepted for sm_90 where `cols % 4 == 0`)"),
        "{out}"
    );
}

#[test]
fn the_build_follows_the_committed_files() {
    let ws = ExampleWorkspace::new();
    // The hand-written online-vec4, pinned for sm_90 where `cols % 4 == 0`, instead of the
    // loop's winner (which claims every shape): a variant with a region.
    commands::revert(&softmax_kernel(&ws), Some("sm_90")).unwrap();
    pin_online_vec4(&ws);

    // The shipped variant runs where its region holds, the reference elsewhere.
    let out = explain(&ws);
    assert_online_vec4_runs_at_4096(&out);
    assert!(
        softmax_line(&out, "cols=50257")
            .contains("reference on sm_90 (`online-vec4` claims only `cols % 4 == 0`)"),
        "{out}"
    );
    // row_sum's variant is built with VEC = 2: it claims no region, but runs only where the
    // spec's `cols % VEC == 0` holds with its defines.
    let row_sum: Vec<&str> = out.lines().filter(|l| l.starts_with("row_sum")).collect();
    assert!(
        !row_sum.is_empty()
            && row_sum
                .iter()
                .all(|l| l.contains("where `cols % VEC == 0 with VEC = 2`")),
        "{out}"
    );
    // A variant keyed by device (lock format 2): on an H200 it is tried before the
    // architecture's entries; on another sm_90 device it does not run, and says so.
    let loop_winner = "run-1796024738-r1c1";
    commands::pin(
        &softmax_kernel(&ws),
        loop_winner,
        "sm_90",
        Some("NVIDIA H200"),
        None,
    )
    .unwrap();
    let lock = ws.read("kopt/softmax/kopt.lock");
    assert!(
        lock.contains("format = 2") && lock.contains("device = \"NVIDIA H200\""),
        "{lock}"
    );
    let on_h200 = ws.explain_on("sm_90", Some("NVIDIA H200"));
    for shape in ["cols=4096 rows=4096", "cols=50257"] {
        assert!(
            softmax_line(&on_h200, shape).contains(&format!(
                // kopt's own claim for these very files records their PTX: the pin keeps it.
                "variant `{loop_winner}` (accepted for NVIDIA H200 (sm_90); verified PTX of NVRTC 13.0 embedded)"
            )),
            "{on_h200}"
        );
    }
    let out = explain(&ws);
    assert_online_vec4_runs_at_4096(&out);
    assert!(
        softmax_line(&out, "cols=50257")
            .contains(&format!("`{loop_winner}` is for NVIDIA H200 only")),
        "{out}"
    );
    commands::revert(&softmax_kernel(&ws), Some("sm_90")).unwrap();
    pin_online_vec4(&ws);

    // On another architecture, the reference.
    let out = explain_built("sm_80", &[]);
    assert!(
        softmax_line(&out, "cols=4096 rows=4096").contains("no accepted variant for sm_80"),
        "{out}"
    );

    // KOPT_DISABLE=1 forces the reference without a rebuild.
    let out = explain_built("sm_90", &[("KOPT_DISABLE", "1")]);
    assert!(
        softmax_line(&out, "cols=4096 rows=4096").contains("reference (KOPT_DISABLE is set)"),
        "{out}"
    );

    // A corrupted variant source: the build falls back to the reference and says why.
    let src = "kopt/softmax/online-vec4/kernel.cu";
    let pristine = ws.read(src);
    ws.write(src, &pristine.replace("__expf(v.x - m) * inv", "0.0f"));
    let out = explain(&ws);
    assert!(
        softmax_line(&out, "cols=4096 rows=4096").contains(
            "`online-vec4` is corrupt: kernel.cu does not match the hash in the lock file"
        ),
        "{out}"
    );
    ws.write(src, &pristine);

    // An edited include of the reference makes the variant stale.
    let inc = "kernels/common.cuh";
    let pristine_inc = ws.read(inc);
    ws.write(
        inc,
        &format!("{pristine_inc}\n// a comment is a change too\n"),
    );
    let out = explain(&ws);
    assert!(
        softmax_line(&out, "cols=4096 rows=4096").contains(
            "`online-vec4` is stale: the reference source (or one of its includes) changed"
        ),
        "{out}"
    );
    ws.write(inc, &pristine_inc);
    let out = explain(&ws);
    assert!(
        softmax_line(&out, "cols=4096 rows=4096").contains("variant `online-vec4`"),
        "restored: {out}"
    );

    // First creation of a lock file: the build did not read it before, yet picks it up.
    std::fs::remove_file(ws.path("kopt/softmax/kopt.lock")).unwrap();
    let out = explain(&ws);
    assert!(
        softmax_line(&out, "cols=4096 rows=4096").contains("no accepted variant for sm_90"),
        "{out}"
    );
    pin_online_vec4(&ws);
    let out = explain(&ws);
    assert!(
        softmax_line(&out, "cols=4096 rows=4096").contains("variant `online-vec4`"),
        "after pin: {out}"
    );
}
