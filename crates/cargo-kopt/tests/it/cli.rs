//! `cargo kopt list`, `check`, `pin` and `revert` on a scratch copy of the example crate.

use std::process::{Command, Output};

use kopt_tests::{text, ExampleWorkspace};

fn kopt(ws: &ExampleWorkspace, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cargo-kopt"))
        .arg("kopt")
        .args(args)
        .arg("--manifest-path")
        .arg(ws.manifest())
        .env_remove("NO_COLOR")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Kernels of the example with an accepted variant (a lock file).
fn accepted_count(ws: &ExampleWorkspace) -> usize {
    std::fs::read_dir(ws.path("kopt"))
        .unwrap()
        .flatten()
        .filter(|d| d.path().join("kopt.lock").is_file())
        .count()
}

#[test]
fn list_prints_a_table_and_json() {
    let ws = ExampleWorkspace::new();
    ws.pin_online_vec4(std::path::Path::new(env!("CARGO_BIN_EXE_cargo-kopt")));
    let o = kopt(&ws, &["list"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = stdout(&o);
    for needle in [
        "crate",
        "kernel",
        "softmax",
        "rmsnorm",
        "reduce_sum",
        "gqa_decode",
        "layer_norm",
        "transpose",
        "silu_mul",
        "gemm",
        "sm_90: online-vec4 where cols % 4 == 0",
        "kernels/softmax.cu (softmax_f32)",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in\n{out}");
    }
    assert!(
        !out.contains('\u{1b}'),
        "no colour when stdout is not a terminal"
    );

    let o = kopt(&ws, &["list", "--message-format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let softmax = v
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kernel"] == "softmax")
        .unwrap();
    assert_eq!(softmax["variants"][0]["status"], "active");
    assert_eq!(softmax["variants"][0]["region"], "cols % 4 == 0");
    assert_eq!(softmax["variants"][0]["verified_by"], "manual");
    assert_eq!(softmax["shapes"].as_array().unwrap().len(), 4);
}

#[test]
fn colour_is_forced_or_refused_by_flag() {
    let ws = ExampleWorkspace::new();
    let o = kopt(&ws, &["list", "--color", "always"]);
    assert!(stdout(&o).contains('\u{1b}'));
    let o = Command::new(env!("CARGO_BIN_EXE_cargo-kopt"))
        .args(["kopt", "list", "--color", "never", "--manifest-path"])
        .arg(ws.manifest())
        .output()
        .unwrap();
    assert!(!stdout(&o).contains('\u{1b}'));
}

#[test]
fn check_passes_on_the_example() {
    let ws = ExampleWorkspace::new();
    let o = kopt(&ws, &["check"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        stdout(&o).contains(&format!(
            "ok: 11 kernel(s), {} accepted variant(s)",
            accepted_count(&ws)
        )),
        "{}",
        text(&o)
    );
}

#[test]
fn a_corrupted_variant_fails_check_naming_kernel_and_fix() {
    let ws = ExampleWorkspace::new();
    ws.pin_online_vec4(std::path::Path::new(env!("CARGO_BIN_EXE_cargo-kopt")));
    let src = "kopt/softmax/online-vec4/kernel.cu";
    ws.write(src, &ws.read(src).replace("1.0f / ws[0]", "0.5f / ws[0]"));
    let o = kopt(&ws, &["check"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = stdout(&o);
    assert!(
        out.contains("variant `online-vec4` for sm_90 is corrupt: kernel.cu does not match the hash in the lock file"),
        "{out}"
    );
    assert!(
        out.contains("git checkout -- kopt/softmax/online-vec4"),
        "{out}"
    );
    assert!(
        out.contains("cargo kopt revert softmax --arch sm_90"),
        "{out}"
    );

    let o = kopt(&ws, &["check", "--message-format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["problems"][0]["kernel"], "softmax");
}

#[test]
fn an_edited_reference_makes_the_variant_stale() {
    let ws = ExampleWorkspace::new();
    ws.pin_online_vec4(std::path::Path::new(env!("CARGO_BIN_EXE_cargo-kopt")));
    let r = "kernels/softmax.cu";
    ws.write(r, &ws.read(r).replace("three passes", "3 passes"));
    let o = kopt(&ws, &["check"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = stdout(&o);
    assert!(
        out.contains("variant `online-vec4` for sm_90 is stale: the reference source (or one of its includes) changed since it was verified"),
        "{out}"
    );
    assert!(out.contains("re-verify"), "{out}");
    let listed = stdout(&kopt(&ws, &["list"]));
    assert!(listed.contains("[STALE]"), "{listed}");
}

#[test]
fn an_edited_annotation_makes_the_variant_stale() {
    let ws = ExampleWorkspace::new();
    ws.write(
        "src/lib.rs",
        &ws.read("src/lib.rs")
            .replace("{ rows: 16, cols: 65536 },", "{ rows: 32, cols: 65536 },"),
    );
    let out = stdout(&kopt(&ws, &["check"]));
    assert!(
        out.contains("the #[kopt::kernel] annotation changed since it was verified"),
        "{out}"
    );
}

#[test]
fn broken_lock_and_audit_files_are_reported() {
    let ws = ExampleWorkspace::new();
    ws.pin_online_vec4(std::path::Path::new(env!("CARGO_BIN_EXE_cargo-kopt")));
    ws.write(
        "kopt/softmax/online-vec4/RATIONALE.md",
        "# edited by hand\n",
    );
    let out = stdout(&kopt(&ws, &["check"]));
    assert!(
        out.contains("RATIONALE.md does not match rationale.json"),
        "{out}"
    );

    ws.write(
        "kopt/softmax/kopt.lock",
        "format = 1\nkernel = \"softmax\"\n[[accepted]]\narch = 90\n",
    );
    let o = kopt(&ws, &["check"]);
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    assert!(out.contains("the lock file cannot be read"), "{out}");
    assert!(
        out.contains("git checkout -- kopt/softmax/kopt.lock"),
        "{out}"
    );

    ws.write(
        "kopt/softmax/kopt.lock",
        "format = 3\nkernel = \"softmax\"\n",
    );
    let out = stdout(&kopt(&ws, &["check"]));
    assert!(out.contains("format 3 is not supported"), "{out}");
}

#[test]
fn a_folder_without_a_kernel_is_reported() {
    let ws = ExampleWorkspace::new();
    std::fs::create_dir_all(ws.path("kopt/old_softmax")).unwrap();
    let out = stdout(&kopt(&ws, &["check"]));
    assert!(
        out.contains("no #[kopt::kernel] named `old_softmax`"),
        "{out}"
    );
}

#[test]
fn revert_then_pin_round_trip() {
    let ws = ExampleWorkspace::new();
    ws.pin_online_vec4(std::path::Path::new(env!("CARGO_BIN_EXE_cargo-kopt")));
    let o = kopt(&ws, &["revert", "softmax", "--arch", "sm_90"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(stdout(&o).contains("sm_90: dropped online-vec4"));
    assert!(stdout(&kopt(&ws, &["list"])).contains("reference everywhere"));
    assert!(kopt(&ws, &["check"]).status.success());

    let o = kopt(&ws, &["revert", "softmax"]);
    assert_eq!(o.status.code(), Some(2), "nothing left to revert");
    assert!(String::from_utf8_lossy(&o.stderr).contains("has no accepted variant"));

    let o = kopt(
        &ws,
        &[
            "pin",
            "softmax",
            "online-vec4",
            "--arch",
            "sm_90",
            "--region",
            "cols % 4 == 0",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(kopt(&ws, &["check"]).status.success());
}

#[test]
fn pin_refuses_bad_input() {
    let ws = ExampleWorkspace::new();
    let err = |args: &[&str]| {
        let o = kopt(&ws, args);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    assert!(err(&["pin", "softmax", "online-vec4", "--arch", "ampere"])
        .contains("not an architecture name"));
    assert!(err(&[
        "pin",
        "softmax",
        "online-vec4",
        "--arch",
        "sm_90",
        "--region",
        "colz > 4"
    ])
    .contains("did you mean `cols`"));
    assert!(
        err(&["pin", "softmax", "nope", "--arch", "sm_90"]).contains("kopt/softmax/nope/kernel.cu")
    );
    assert!(err(&["pin", "softmaks", "online-vec4", "--arch", "sm_90"])
        .contains("no #[kopt::kernel] named `softmaks`"));
    assert!(err(&["list", "-p", "nonexistent"]).contains("not a member of this workspace"));
}

#[test]
fn an_invalid_annotation_is_reported_with_its_location() {
    let ws = ExampleWorkspace::new();
    ws.write(
        "src/lib.rs",
        &ws.read("src/lib.rs").replace(
            "entry = \"softmax_f32\",",
            "entry = \"softmax_f32\", blok = 3,",
        ),
    );
    let o = kopt(&ws, &["check"]);
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    assert!(
        out.contains("unknown option `blok`; did you mean `block`?"),
        "{out}"
    );
    assert!(out.contains("llm-kernels/src/lib.rs:"), "{out}");
}

#[test]
fn the_readme_commands_pass_on_this_repository() {
    // `cargo kopt list && cargo kopt check` from the repository root: crates that only
    // dev-depend on kopt (the trybuild cases of invalid annotations) are not gathered.
    let manifest = kopt_tests::repo_root().join("Cargo.toml");
    for cmd in ["list", "check"] {
        let o = Command::new(env!("CARGO_BIN_EXE_cargo-kopt"))
            .args(["kopt", cmd, "--manifest-path"])
            .arg(&manifest)
            .output()
            .unwrap();
        assert!(o.status.success(), "cargo kopt {cmd}: {}", text(&o));
    }
}

#[test]
fn a_committed_variant_that_no_longer_compiles_fails_check() {
    // The compile fence, on the CPU: hashes intact (as after an accept made with another
    // NVRTC), but the variant's source no longer compiles.
    if !kopt::gpu::nvrtc_for_test() {
        return;
    }
    let ws = ExampleWorkspace::new();
    let variant = "heuristic-row_sum-r1c1-m11";
    let src = format!("kopt/row_sum/{variant}/kernel.cu");
    let old = ws.read(&src);
    let new = format!("{old}\n__device__ int kopt_check_broken = undeclared_in_this_file;\n");
    ws.write(&src, &new);
    let lock = "kopt/row_sum/kopt.lock";
    ws.write(
        lock,
        &ws.read(lock).replace(
            &kopt_spec::source::hash(old.as_bytes()),
            &kopt_spec::source::hash(new.as_bytes()),
        ),
    );
    let o = kopt(&ws, &["check"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = stdout(&o);
    assert!(
        out.contains(&format!("`{variant}` does not compile for sm_90")),
        "{out}"
    );
    assert!(out.contains("undeclared_in_this_file"), "{out}");
    assert!(out.contains("compiled with NVRTC"), "{out}");
    assert!(
        !out.contains("is corrupt"),
        "the hashes match: only the compile fails\n{out}"
    );
}

#[test]
fn verified_ptx_other_than_its_source_compiles_to_fails_check() {
    // The launcher loads kernel.ptx without NVRTC; `check` compiles kernel.cu again with
    // the same NVRTC and requires the same PTX (comment lines aside).
    if !kopt::gpu::nvrtc_for_test() {
        return;
    }
    let ws = ExampleWorkspace::new();
    let (kernel, variant) = ("row_sum", "heuristic-row_sum-r1c1-m11");
    let (code, v) = check_json(&ws, &[]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(compiled(&v, kernel, variant)["ptx"], "matches", "{v}");
    let path = format!("kopt/{kernel}/{variant}/kernel.ptx");
    let old = ws.read(&path);
    // A comment is not code: NVRTC writes its build into them.
    let commented = format!("// reviewed\n{old}");
    // The lock's record and the rationale's claim follow each edit, as though it had
    // been accepted so.
    let lock = format!("kopt/{kernel}/kopt.lock");
    let claim = format!("kopt/{kernel}/{variant}/rationale.json");
    let rehash = |from: &str, to: &str| {
        for file in [&lock, &claim] {
            let text = ws.read(file).replace(
                &kopt_spec::source::hash(from.as_bytes()),
                &kopt_spec::source::hash(to.as_bytes()),
            );
            ws.write(file, &text);
        }
    };
    ws.write(&path, &commented);
    rehash(&old, &commented);
    let (code, v) = check_json(&ws, &[]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(compiled(&v, kernel, variant)["ptx"], "matches", "{v}");
    // Another instruction, with the lock's hash following it: only the compare objects.
    let edited = commented.replacen("ret;", "trap;\n\tret;", 1);
    assert_ne!(edited, commented, "the PTX has a `ret;`");
    ws.write(&path, &edited);
    rehash(&commented, &edited);
    let o = kopt(&ws, &["check"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = stdout(&o);
    assert!(
        out.contains(&format!(
            "the verified PTX of `{variant}` is not what NVRTC"
        )),
        "{out}"
    );
    assert!(!out.contains("is corrupt"), "the hashes match\n{out}");
}

/// Rewrites `file` of the committed variant `kernel/variant` as though it had been accepted
/// so: the hashes of the lock and of the rationale's claim follow, so that only the
/// compile fence can object.
fn rewrite_accepted(ws: &ExampleWorkspace, kernel: &str, variant: &str, file: &str, text: &str) {
    let path = format!("kopt/{kernel}/{variant}/{file}");
    let (old, new) = (
        kopt_spec::source::hash(ws.read(&path).as_bytes()),
        kopt_spec::source::hash(text.as_bytes()),
    );
    ws.write(&path, text);
    for f in [
        format!("kopt/{kernel}/kopt.lock"),
        format!("kopt/{kernel}/{variant}/rationale.json"),
    ] {
        let before = ws.read(&f);
        assert!(before.contains(&old), "{f} records no {old}");
        ws.write(&f, &before.replace(&old, &new));
    }
}

/// Sets the compile figures the variant's evidence records (its rationale.json, and the
/// RATIONALE.md rendered from it).
fn record_compile(
    ws: &ExampleWorkspace,
    kernel: &str,
    variant: &str,
    figures: Option<kopt_spec::files::CompileFigures>,
) {
    let dir = format!("kopt/{kernel}/{variant}");
    let mut r =
        kopt_spec::files::Rationale::parse(&ws.read(&format!("{dir}/rationale.json"))).unwrap();
    r.compile = figures;
    ws.write(&format!("{dir}/rationale.json"), &r.to_json());
    ws.write(&format!("{dir}/RATIONALE.md"), &r.render_markdown());
}

fn check_json(ws: &ExampleWorkspace, env: &[(&str, &str)]) -> (Option<i32>, serde_json::Value) {
    let o = Command::new(env!("CARGO_BIN_EXE_cargo-kopt"))
        .args([
            "kopt",
            "check",
            "--message-format",
            "json",
            "--manifest-path",
        ])
        .arg(ws.manifest())
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let v = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    (o.status.code(), v)
}

/// The compile fence's row of one version in `check --message-format json`.
fn compiled<'a>(v: &'a serde_json::Value, kernel: &str, version: &str) -> &'a serde_json::Value {
    v["compile"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kernel"] == kernel && r["version"] == version)
        .unwrap_or_else(|| panic!("no row for {kernel} {version} in {v}"))
}

/// Its figures as a variant's evidence would record them.
fn figures_of(
    v: &serde_json::Value,
    kernel: &str,
    version: &str,
) -> kopt_spec::files::CompileFigures {
    let row = compiled(v, kernel, version);
    let r = &row["resources"];
    let n = |k: &str| r[k].as_u64().unwrap() as u32;
    kopt_spec::files::CompileFigures {
        nvrtc: v["compile"]["nvrtc"].as_str().unwrap().into(),
        cuda_headers: v["compile"]["cuda_headers"].as_str().map(String::from),
        arch: r["arch"].as_str().unwrap().into(),
        registers: n("registers"),
        spill_stores: n("spill_stores"),
        spill_loads: n("spill_loads"),
        stack_bytes: n("stack_bytes"),
        shared_bytes: n("shared_bytes"),
    }
}

#[test]
fn check_compiles_the_example_crates_kernels_with_nvrtc() {
    // What CI runs (`scripts/with-cuda-wheels cargo test`): `cargo kopt check` of this
    // repository compiles every kernel of examples/llm-kernels and examples/first-kernel,
    // reference and accepted variants, with NVRTC from the wheels, on a machine without a
    // GPU; without NVRTC this fails under KOPT_REQUIRE_NVRTC instead of skipping.
    if !kopt::gpu::nvrtc_for_test() {
        return;
    }
    let o = Command::new(env!("CARGO_BIN_EXE_cargo-kopt"))
        .args([
            "kopt",
            "check",
            "--message-format",
            "json",
            "--manifest-path",
        ])
        .arg(kopt_tests::repo_root().join("Cargo.toml"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let c = &v["compile"];
    assert_eq!(c["status"], "ran", "{c}");
    assert_eq!(c["problems"], serde_json::json!([]), "{c}");
    let rows = c["versions"].as_array().unwrap();
    let examples = kopt_tests::repo_root().join("examples");
    let mut expected = 0;
    for (package, dir) in [
        ("first-kernel", "first-kernel"),
        ("llm-kernels", "llm-kernels"),
    ] {
        let mine: Vec<&serde_json::Value> =
            rows.iter().filter(|r| r["package"] == package).collect();
        let references = mine.iter().filter(|r| r["version"] == "reference").count();
        assert!(references > 0, "no kernel of {package} was compiled: {c}");
        expected += references;
        // Every accepted variant of the crate's lock files was compiled for its
        // architecture.
        let kopt_dir = examples.join(dir).join("kopt");
        for lock in std::fs::read_dir(&kopt_dir).into_iter().flatten().flatten() {
            let Ok(text) = std::fs::read_to_string(lock.path().join("kopt.lock")) else {
                continue;
            };
            let lock = kopt_spec::files::LockFile::parse(&text).unwrap();
            for e in &lock.accepted {
                expected += 1;
                assert!(
                    mine.iter().any(|r| r["kernel"] == lock.kernel.as_str()
                        && r["version"] == e.variant.as_str()
                        && r["arch"] == e.arch.as_str()),
                    "{}/{} for {} was not compiled: {c}",
                    lock.kernel,
                    e.variant,
                    e.arch
                );
            }
        }
        for r in &mine {
            assert!(
                r["resources"]["registers"].as_u64().is_some_and(|n| n > 0),
                "no ptxas figures for {r}"
            );
        }
        // Every verified PTX committed is what this NVRTC makes of its source (the PTX
        // the H200 verified was compiled by the same NVRTC, 13.0).
        for r in mine.iter().filter(|r| !r["ptx"].is_null()) {
            assert_eq!(r["ptx"], "matches", "{r}");
        }
    }
    assert_eq!(rows.len(), expected, "{c}");
}

#[test]
fn a_committed_variant_without_its_entry_fails_check() {
    if !kopt::gpu::nvrtc_for_test() {
        return;
    }
    let ws = ExampleWorkspace::new();
    let variant = "heuristic-row_sum-r1c1-m11";
    let src = ws.read(&format!("kopt/row_sum/{variant}/kernel.cu"));
    // Made by a macro, the entry is one the build's lexical scan cannot refute (it notes
    // it): only NVRTC can say that the module lacks it.
    let signature = "extern \"C\" __global__ void __launch_bounds__(BLOCK)\nrow_sum_f32(";
    assert!(src.contains(signature), "{src}");
    let renamed = src.replace(
        signature,
        "#define ROW_SUM_KERNEL(name) extern \"C\" __global__ void __launch_bounds__(BLOCK) name\nROW_SUM_KERNEL(row_sum_f32_v2)(",
    );
    rewrite_accepted(&ws, "row_sum", variant, "kernel.cu", &renamed);
    let (code, v) = check_json(&ws, &[]);
    assert_eq!(code, Some(1), "{v}");
    let problems = v["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "only the compile fence objects: {v}");
    let p = problems[0]["problem"].as_str().unwrap();
    assert!(
        p.starts_with(&format!(
            "the module NVRTC compiled from `{variant}` for sm_90 has no kernel `row_sum_f32`"
        )) && p.contains("it holds `row_sum_f32_v2`"),
        "{p}"
    );
    assert_eq!(
        problems[0]["path"],
        format!("llm-kernels/kopt/row_sum/{variant}/kernel.cu")
    );
    let row = compiled(&v, "row_sum", variant);
    assert_eq!(row["failure"]["kind"], "no-entry", "{row}");
}

#[test]
fn a_variant_that_now_spills_fails_check_and_other_compile_changes_are_notes() {
    if !kopt::gpu::nvrtc_for_test() {
        return;
    }
    let ws = ExampleWorkspace::new();
    // A variant without `__launch_bounds__`, which would override a register cap.
    let (kernel, variant) = ("candle_softmax", "run-1796127251-r1c1");
    // Accepted without verified PTX, as before kopt kept it: its options change below,
    // and a kept PTX would then (rightly) be a second problem.
    let lock_path = format!("kopt/{kernel}/kopt.lock");
    let mut lock = kopt_spec::files::LockFile::parse(&ws.read(&lock_path)).unwrap();
    lock.accepted.iter_mut().for_each(|e| e.ptx = None);
    ws.write(&lock_path, &lock.render());
    // Today's figures, from the function check compiles with.
    let dir = format!("kopt/{kernel}/{variant}");
    let file =
        kopt_spec::files::VariantFile::parse(&ws.read(&format!("{dir}/variant.toml"))).unwrap();
    let version =
        kopt_engine::job::KernelVersion::variant(&file, &ws.read(&format!("{dir}/kernel.cu")));
    let now = kopt_engine::precompile::precompile(kernel, &version, "sm_90", false)
        .unwrap()
        .figures
        .unwrap();
    assert!(!now.spills(), "{now:?}");
    // Evidence recorded with today's figures: the same.
    record_compile(&ws, kernel, variant, Some(now.clone()));
    let (code, v) = check_json(&ws, &[]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(compiled(&v, kernel, variant)["evidence"], "same");
    assert_eq!(figures_of(&v, kernel, variant), now);

    // Recorded by another NVRTC, with other figures: notes, and check passes.
    let mut other = now.clone();
    other.nvrtc = "12.4".into();
    other.cuda_headers = Some("12.4".into());
    other.registers += 8;
    other.shared_bytes *= 2;
    record_compile(&ws, kernel, variant, Some(other.clone()));
    let o = kopt(&ws, &["check"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = stdout(&o);
    let who = format!("llm-kernels::{kernel} `{variant}` for sm_90");
    assert!(
        out.contains(&format!(
            "note: {who}: compiled with NVRTC {}{}, its evidence with NVRTC 12.4 (CUDA headers 12.4)",
            now.nvrtc,
            now.cuda_headers.as_ref().map(|h| format!(" (CUDA headers {h})")).unwrap_or_default()
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "note: {who}: its compile for sm_90 changed since it was verified: registers {} -> {}, static shared memory {} B -> {} B",
            other.registers, now.registers, other.shared_bytes, now.shared_bytes
        )),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with(kernel) && l.contains(variant) && l.ends_with("differs")),
        "{out}"
    );

    // The same evidence (no spill), and a compile that now spills: a problem.
    record_compile(&ws, kernel, variant, Some(now.clone()));
    let path = format!("kopt/{kernel}/{variant}/variant.toml");
    let toml = ws.read(&path);
    let capped = toml.replace("options = []", "options = [\"--maxrregcount=24\"]");
    assert_ne!(capped, toml, "{toml}");
    rewrite_accepted(&ws, kernel, variant, "variant.toml", &capped);
    let (code, v) = check_json(&ws, &[]);
    assert_eq!(code, Some(1), "{v}");
    let problems = v["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "only the compile fence objects: {v}");
    let p = problems[0]["problem"].as_str().unwrap();
    assert!(
        p.starts_with(&format!("`{variant}` spills for sm_90: ")) && p.ends_with(&format!(
            "where its evidence recorded none ({}); a spill makes local-memory traffic the verification never measured",
            now.describe()
        )),
        "{p}"
    );
    assert!(
        problems[0]["fix"]
            .as_str()
            .unwrap()
            .contains("cargo kopt verify"),
        "{v}"
    );
    let row = compiled(&v, kernel, variant);
    assert!(
        row["resources"]["spill_stores"].as_u64().unwrap() > 0,
        "{row}"
    );
    assert_eq!(row["evidence"], "differs");
}

#[test]
fn check_says_in_one_line_when_nvrtc_cannot_be_loaded() {
    // NVRTC out of reach: no library path, no toolkit variables.
    let ws = ExampleWorkspace::new();
    let run = |require: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cargo-kopt"));
        c.args(["kopt", "check", "--manifest-path"])
            .arg(ws.manifest())
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("CUDA_HOME")
            .env_remove("CUDA_PATH")
            .env_remove("CUDA_ROOT")
            .env_remove("KOPT_CUDA_INCLUDE")
            .env_remove("KOPT_REQUIRE_NVRTC");
        if let Some(v) = require {
            c.env("KOPT_REQUIRE_NVRTC", v);
        }
        c.output().unwrap()
    };
    let o = run(None);
    let out = stdout(&o);
    if out.contains("compiled with NVRTC") {
        eprintln!("skipped: this machine has NVRTC on its default library path");
        return;
    }
    assert!(o.status.success(), "{}", text(&o));
    let skipped: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("NVRTC (libnvrtc.so)"))
        .collect();
    assert_eq!(
        skipped,
        vec!["compile fence skipped: NVRTC (libnvrtc.so) could not be loaded, so no kernel was compiled: install the CUDA toolkit's NVRTC or the NVIDIA wheels (scripts/cuda-wheels.sh) and put its lib folder on LD_LIBRARY_PATH"],
        "{out}"
    );
    assert!(out.contains("ok: 11 kernel(s)"), "{out}");
    // CI requires it: then it is a problem.
    let o = run(Some("1"));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = stdout(&o);
    assert!(
        out.contains(
            "problem: KOPT_REQUIRE_NVRTC is set, but NVRTC (libnvrtc.so) could not be loaded"
        ),
        "{out}"
    );
    assert!(
        out.contains("fix: source target/cuda-wheels/cu13/env.sh"),
        "{out}"
    );
}

#[test]
fn the_compile_fence_table() {
    use kopt_engine::precompile::Match;
    use kopt_workspace::compile_check::{CompileCheck, CompiledVersion, Failure, FailureKind};
    let row =
        |version: &str, registers: u32, spills: u32, evidence: Option<Match>| CompiledVersion {
            package: "llm-kernels".into(),
            kernel: "softmax".into(),
            version: version.into(),
            arch: "sm_90".into(),
            entry: "softmax_f32".into(),
            resources: Some(kopt::CompiledEntry {
                name: "softmax_f32".into(),
                arch: "sm_90".into(),
                registers,
                spill_stores: spills,
                spill_loads: spills,
                stack_bytes: spills,
                shared_bytes: 128,
            }),
            recorded_registers: None,
            recorded: None,
            evidence,
            warnings: String::new(),
            warning_count: 0,
            failure: None,
            ptx: None,
        };
    let mut warned = row("online-vec4", 40, 0, Some(Match::RegistersSame));
    warned.warning_count = 1;
    let mut broken = row("run-1-r1c1", 0, 0, None);
    broken.resources = None;
    broken.failure = Some(Failure {
        kind: FailureKind::Compile,
        message: "kernel.cu(3): error: expected a ';'".into(),
    });
    let mut missing = row("run-3-r1c1", 0, 0, None);
    missing.resources = None;
    missing.failure = Some(Failure {
        kind: FailureKind::NoEntry,
        message: "the module has no kernel `softmax_f32`".into(),
    });
    let c = CompileCheck::Ran {
        nvrtc: "13.0".into(),
        cuda_headers: Some("13.0".into()),
        include_dirs: vec!["/usr/local/cuda/include".into()],
        versions: vec![
            row("reference", 26, 0, None),
            warned,
            row("run-2-r1c1", 255, 16, Some(Match::Differs)),
            broken,
            missing,
        ],
        problems: vec![],
        notes: vec![
            "llm-kernels::softmax `online-vec4` for sm_90: 1 warning(s):\nkernel.cu(3): warning #177-D: variable \"x\" was declared but never referenced".into(),
        ],
    };
    insta::assert_snapshot!(
        anstream::adapter::strip_str(&cargo_kopt::render::compile_check(&c)).to_string()
    );
    let skipped = CompileCheck::Skipped {
        reason: kopt_workspace::compile_check::NO_NVRTC.into(),
        problems: vec![],
    };
    assert_eq!(
        anstream::adapter::strip_str(&cargo_kopt::render::compile_check(&skipped)).to_string(),
        format!(
            "compile fence skipped: {}\n",
            kopt_workspace::compile_check::NO_NVRTC
        )
    );
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn pin_without_an_audit_record_is_refused_up_front_with_what_to_write() {
    use kopt_spec::files::{ClaimedFiles, Rationale, VerifiedBy};
    let ws = ExampleWorkspace::new();
    let dir = "kopt/softmax/mine";
    std::fs::create_dir_all(ws.path(dir)).unwrap();
    ws.write(
        &format!("{dir}/kernel.cu"),
        &ws.read("kopt/softmax/online-vec4/kernel.cu"),
    );
    ws.write(
        &format!("{dir}/variant.toml"),
        &ws.read("kopt/softmax/online-vec4/variant.toml")
            .replace("id = \"online-vec4\"", "id = \"mine\""),
    );
    let lock = ws.read("kopt/softmax/kopt.lock");
    let pin = [
        "pin",
        "softmax",
        "mine",
        "--arch",
        "sm_90",
        "--region",
        "cols % 4 == 0",
    ];
    let o = kopt(&ws, &pin);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = stderr(&o);
    assert!(
        err.contains("kopt/softmax/mine has no rationale.json: every accepted variant needs its audit record"),
        "{err}"
    );
    assert!(
        err.contains("Write kopt/softmax/mine/rationale.json"),
        "{err}"
    );
    assert_eq!(
        ws.read("kopt/softmax/kopt.lock"),
        lock,
        "nothing was recorded"
    );
    // Not pinned, it is a note of `check`, not a failure.
    let o = kopt(&ws, &["check"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        stdout(&o).contains("kopt/softmax/mine has no rationale.json and no lock entry names it"),
        "{}",
        text(&o)
    );

    // The skeleton it prints is a rationale to fill in: as it is, pin takes it, and records
    // the person's claim with the hashes of the files pinned.
    let skeleton = &err[err.find("{\n").expect("a JSON skeleton")..];
    ws.write(
        &format!("{dir}/rationale.json"),
        &format!("{}\n", skeleton.trim_end()),
    );
    let o = kopt(&ws, &pin);
    assert!(o.status.success(), "{}", text(&o));
    let r = Rationale::parse(&ws.read(&format!("{dir}/rationale.json"))).unwrap();
    let claim = r.claim.as_ref().unwrap();
    assert_eq!(claim.verified_by, VerifiedBy::Manual);
    assert_eq!(claim.region.as_deref(), Some("cols % 4 == 0"));
    assert_eq!(
        claim.compare_files(
            &ws.read(&format!("{dir}/kernel.cu")),
            &ws.read(&format!("{dir}/variant.toml")),
            None
        ),
        ClaimedFiles::Match
    );
    assert_eq!(ws.read(&format!("{dir}/RATIONALE.md")), r.render_markdown());
    let o = kopt(&ws, &["check"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!stdout(&o).contains("kopt/softmax/mine"), "{}", text(&o));
}

#[test]
fn an_edited_superseded_variant_fails_check_and_revert_to_refuses_it() {
    let ws = ExampleWorkspace::new();
    let lock = ws.read("kopt/softmax/kopt.lock");
    // `online-vec4` is superseded in the example: the lock no longer pins its files.
    assert_ne!(ws.accepted_softmax(), "online-vec4");
    for file in ["kernel.cu", "variant.toml"] {
        let path = format!("kopt/softmax/online-vec4/{file}");
        let original = ws.read(&path);
        let edited = match file {
            "kernel.cu" => original.replace("1.0f / ws[0]", "0.5f / ws[0]"),
            _ => format!("{original}# tuned by hand\n"),
        };
        assert_ne!(edited, original);
        ws.write(&path, &edited);
        let o = kopt(&ws, &["check"]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        let out = stdout(&o);
        assert!(
            out.contains(&format!(
                "{path} is not the file variant `online-vec4` was verified with: its hash differs from the one the claim in rationale.json records"
            )),
            "{out}"
        );
        assert!(out.contains(&format!("git checkout -- {path}")), "{out}");

        let o = kopt(&ws, &["revert", "softmax", "--to", "online-vec4"]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(
            stderr(&o).contains(&format!(
                "{path} is not the file `online-vec4` was verified with"
            )),
            "{}",
            text(&o)
        );
        assert_eq!(
            ws.read("kopt/softmax/kopt.lock"),
            lock,
            "nothing re-activated"
        );
        ws.write(&path, &original);
    }
    // As verified, it passes and can come back.
    assert!(kopt(&ws, &["check"]).status.success());
    let o = kopt(&ws, &["revert", "softmax", "--to", "online-vec4"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(kopt(&ws, &["check"]).status.success());
}

#[test]
fn check_fails_on_a_lock_entry_whose_evidence_came_from_the_fake_device() {
    use kopt_spec::files::{Rationale, FAKE_DEVICE_NAME};
    let ws = ExampleWorkspace::new();
    let v = ws.accepted_softmax();
    let json = format!("kopt/softmax/{v}/rationale.json");
    let mut r = Rationale::parse(&ws.read(&json)).unwrap();
    r.provenance.device = format!("{FAKE_DEVICE_NAME} (sm_90)");
    ws.write(&json, &r.to_json());
    ws.write(
        &format!("kopt/softmax/{v}/RATIONALE.md"),
        &r.render_markdown(),
    );
    let o = kopt(&ws, &["check"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = stdout(&o);
    assert!(
        out.contains(&format!(
            "variant `{v}` for sm_90 rests on evidence from kopt's fake device (`kopt fake GPU (sm_90)`"
        )),
        "{out}"
    );
    assert!(
        out.contains("cargo kopt revert softmax --arch sm_90"),
        "{out}"
    );
    let o = kopt(&ws, &["check", "--message-format", "json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["ok"], false);
    assert_eq!(j["problems"][0]["path"], format!("kopt/softmax/{v}"));
}

#[test]
fn gc_lists_then_deletes_unreferenced_folders_and_check_passes_after() {
    let ws = ExampleWorkspace::new();
    // The loop's softmax winner is superseded once `online-vec4` is pinned instead.
    let superseded = ws.accepted_softmax();
    ws.pin_online_vec4(std::path::Path::new(env!("CARGO_BIN_EXE_cargo-kopt")));
    // A hand-made variant nobody accepted yet.
    std::fs::create_dir_all(ws.path("kopt/softmax/mine")).unwrap();
    ws.write("kopt/softmax/mine/kernel.cu", "// work in progress\n");

    let o = kopt(&ws, &["gc"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = stdout(&o);
    for needle in [
        format!("kopt/softmax/{superseded}"),
        "no lock entry names it".into(),
        "kept kopt/softmax/mine: its rationale.json records no claim".into(),
        "2 variant folder(s) no lock entry names; `cargo kopt gc --delete` removes 1 of them"
            .into(),
    ] {
        assert!(out.contains(&needle), "{needle:?} in\n{out}");
    }
    assert!(
        ws.path(&format!("kopt/softmax/{superseded}")).is_dir(),
        "only listed"
    );

    let o = kopt(&ws, &["gc", "--delete", "--message-format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["delete"], true);
    let folders: Vec<(&str, &str)> = v["folders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["variant"].as_str().unwrap(),
                f["action"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        folders,
        [("mine", "kept"), (superseded.as_str(), "removed")],
        "{v}"
    );
    assert_eq!(
        v["folders"][1]["folder"],
        format!("kopt/softmax/{superseded}")
    );
    assert!(!ws.path(&format!("kopt/softmax/{superseded}")).exists());
    assert!(ws.path("kopt/softmax/mine/kernel.cu").is_file());
    for kept in ["online-vec4", "kopt.lock"] {
        assert!(ws.path(&format!("kopt/softmax/{kept}")).exists(), "{kept}");
    }

    let o = kopt(&ws, &["check"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = stdout(&kopt(&ws, &["gc", "softmax"]));
    assert!(
        out.contains(
            "1 variant folder(s) no lock entry names; `cargo kopt gc --delete` removes 0 of them"
        ),
        "{out}"
    );
    let o = kopt(&ws, &["gc", "softmaks"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no #[kopt::kernel] named `softmaks`"));
}
