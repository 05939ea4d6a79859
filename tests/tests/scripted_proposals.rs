//! The hand-written candidates that `examples/llm-kernels/agents/scripted-agent.sh` feeds
//! to `cargo kopt optimize --agent cmd:...` are checked here without a GPU: each proposal
//! passes the validation the loop applies to a model's reply (kopt_agent::proposal::parse)
//! as the agent answers it (each source written out from the file it points at: an accepted
//! variant, a patch of one, or a kernel of `agents/`), and its launch rule gives
//! a geometry the kernel can run on every declared shape and on every held-out shape the
//! engine can draw (the invariants the kernels compile in: the cluster size divides the
//! grid, and the GQA kernel's split scratch is never overrun).
//! No file of `agents/` is a copy of an accepted variant.

use std::collections::BTreeMap;
use std::path::Path;

use kopt_agent::proposal::{self, ProposalSet};
use kopt_spec::expr::Expr;
use kopt_spec::spec::KernelSpec;
use kopt_tests::repo_root;

const CLUSTER_ATTR: &str = "__cluster_dims__(";

/// The candidates of each proposal file, in order, where there are several.
const CANDIDATES: &[(&str, usize)] = &[
    // The register-tiled kernel of agents/gemm.cu, then the accepted wgmma variant.
    ("gemm", 2),
    // The same kernel with other block orders (`ORDER`), for the loop to measure.
    ("transpose", 3),
    // The same kernel on the 2-D grid instead of the flat one (`FLAT`).
    ("silu_mul", 2),
    // The same kernel with the accepted block size of the split mode (`SPLIT_CACHE`).
    ("softmax", 2),
    // Register loads (agents/gqa_decode.cu), then K and V through a per-warp cp.async
    // shared-memory ring (a patch of the accepted variant).
    ("gqa_decode", 2),
];

/// The most dynamic shared memory one block may have on the GPUs kopt targets (sm_90:
/// 227 KB).
const MAX_DYNAMIC_SMEM: i64 = 227 * 1024;

fn agents_dir() -> std::path::PathBuf {
    repo_root().join("examples/llm-kernels/agents")
}

fn kernels() -> Vec<kopt_workspace::gather::Kernel> {
    let root = repo_root().join("examples/llm-kernels");
    let g = kopt_workspace::gather::gather_crate("llm-kernels", &root, &repo_root().join("target"));
    assert!(g.errors.is_empty(), "{:?}", g.errors);
    g.kernels
}

/// The value of `#define NAME <value>` in `source`, where the value is an integer or a
/// product of integers and other such defines (`(1024 * HEADS)`); `None` when there is no
/// such define or its value is anything else.
fn define(source: &str, name: &str) -> Option<i64> {
    let text = source.lines().find_map(|l| {
        let l = l.split("//").next().unwrap_or("");
        let rest = l.trim_start().strip_prefix("#define")?;
        let rest = rest.trim_start().strip_prefix(name)?;
        rest.starts_with(char::is_whitespace).then(|| rest.trim())
    })?;
    let text = text
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .unwrap_or(text);
    text.split('*')
        .map(|f| {
            let f = f.trim();
            f.parse::<i64>()
                .ok()
                .or_else(|| (f != name).then(|| define(source, f)).flatten())
        })
        .product()
}

/// The compiled-in cluster size along x, if the kernel has one: a number, or a define that
/// the proposal's `defines` (passed as `-D`) set or else the source does.
fn cluster_x(source: &str, defines: &BTreeMap<String, i64>) -> Option<i64> {
    let start = source.find(CLUSTER_ATTR)? + CLUSTER_ATTR.len();
    let arg = source[start..].split([',', ')']).next()?.trim();
    arg.parse()
        .ok()
        .or_else(|| defines.get(arg).copied())
        .or_else(|| define(source, arg))
}

/// The proposal's defines, then the same with each combination of its `matrix` (the loop
/// searches those around the candidate, so every one must launch too).
fn define_sets(p: &proposal::Proposal) -> Vec<BTreeMap<String, i64>> {
    let mut sets = vec![p.defines.clone()];
    for (name, values) in p.matrix.iter().flatten() {
        sets = sets
            .iter()
            .flat_map(|set| {
                values.iter().map(move |v| {
                    let mut s = set.clone();
                    s.insert(name.clone(), *v);
                    s
                })
            })
            .collect();
    }
    if p.matrix.is_some() {
        sets.insert(0, p.defines.clone());
    }
    sets
}

/// The proposal's launch rule gives a runnable geometry on every declared and held-out shape,
/// with its defines and with each combination of its matrix, and keeps the invariants its
/// source compiles in (cluster size, GQA split scratch).
fn check_launchable(spec: &KernelSpec, name: &str, p: &proposal::Proposal, source: &str) {
    for defines in define_sets(p) {
        check_launchable_with(spec, name, p, source, &defines);
    }
}

fn check_launchable_with(
    spec: &KernelSpec,
    name: &str,
    p: &proposal::Proposal,
    source: &str,
    defines: &BTreeMap<String, i64>,
) {
    let launch = p
        .launch
        .as_ref()
        .unwrap_or_else(|| panic!("{name}: the candidate needs its own launch rule"));
    let grid: Vec<Expr> = launch
        .grid
        .iter()
        .map(|e| kopt_tests::parse_launch_expr(spec, defines, e))
        .collect();
    let block: Vec<Expr> = launch
        .block
        .iter()
        .map(|e| kopt_tests::parse_launch_expr(spec, defines, e))
        .collect();
    let smem = kopt_tests::parse_launch_expr(spec, defines, &launch.smem);
    let cluster = cluster_x(source, defines);
    let launch_cluster: Option<Vec<Expr>> = launch.cluster.as_ref().map(|c| {
        c.iter()
            .map(|e| kopt_tests::parse_launch_expr(spec, defines, e))
            .collect()
    });
    let split_scratch = (define(source, "MAX_ITEMS"), define(source, "MAX_PARTIALS"));
    assert_eq!(
        split_scratch.0.is_some(),
        split_scratch.1.is_some(),
        "{name}: MAX_ITEMS and MAX_PARTIALS must both be readable (an integer or a product of integers and defines), or the scratch check would not run"
    );

    let shapes = kopt_tests::every_drawable_shape(spec);
    assert!(
        shapes.len() > spec.shapes.len(),
        "{name}: no held-out shape drawn"
    );
    for values in &shapes {
        let mut vars: Vec<(&str, i64)> = values
            .iter()
            .filter_map(|(n, v)| v.as_i64().map(|i| (n.as_str(), i)))
            .collect();
        vars.extend(defines.iter().map(|(n, v)| (n.as_str(), *v)));
        let eval = |e: &Expr| e.eval_named(&vars).unwrap();
        let g: Vec<i64> = grid.iter().map(eval).collect();
        let b: Vec<i64> = block.iter().map(eval).collect();
        let dynamic_smem = eval(&smem);
        let shape = format!("{name} {values:?} {defines:?}: grid {g:?} block {b:?}");
        assert!(
            (0..=MAX_DYNAMIC_SMEM).contains(&dynamic_smem),
            "{shape}: dynamic shared memory {dynamic_smem} bytes"
        );
        assert!(
            g.iter().all(|&d| d >= 1) && g[1] <= 65535 && g[2] <= 65535,
            "{shape}"
        );
        assert!(b.iter().all(|&d| d >= 1), "{shape}");
        assert!(b[0] * b[1] * b[2] <= 1024 && b[0] % 32 == 0, "{shape}");
        if let Some(c) = cluster {
            assert_eq!(
                g[0] % c,
                0,
                "{shape}: the compiled-in cluster size {c} must divide the grid"
            );
        }
        if let Some(lc) = &launch_cluster {
            let c: Vec<i64> = lc.iter().map(eval).collect();
            let c = [c[0], c[1], c[2]];
            if let Some(problem) = kopt_spec::spec::cluster_problem([g[0], g[1], g[2]], c) {
                panic!("{shape}: cluster set at launch: {problem}");
            }
            assert!(
                cluster.is_none() || c == [1, 1, 1],
                "{shape}: a cluster {c:?} set at launch on a kernel compiled with __cluster_dims__"
            );
            assert!(
                c.iter().product::<i64>() <= 16,
                "{shape}: clusters of more than 16 blocks"
            );
        }
        if let (Some(items), Some(partials)) = split_scratch {
            let heads = define(source, "HEADS").unwrap();
            if g[0] > 1 {
                assert!(
                    g[1] <= items && g[0] * g[1] * heads <= partials,
                    "{shape}: scratch overrun"
                );
            }
        }
    }
}

#[test]
fn every_scripted_proposal_is_valid_and_launchable_on_every_shape() {
    let mut checked = Vec::new();
    for k in kernels() {
        let name = &k.spec.name;
        let json_path = agents_dir().join(format!("{name}.proposal.json"));
        if !json_path.is_file() {
            continue;
        }
        let text = kopt_tests::scripted_answer(&agents_dir(), name);
        let set: ProposalSet = serde_json::from_str(&text).unwrap();
        let expected = CANDIDATES
            .iter()
            .find(|(k, _)| k == name)
            .map_or(1, |(_, n)| *n);
        assert_eq!(set.proposals.len(), expected, "{name}: its candidates");
        let resolved = proposal::parse(&text, &k.spec, &k.reference.text)
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_eq!(resolved.len(), expected, "{name}: every proposal resolves");
        for r in &resolved {
            check_launchable(&k.spec, name, &r.proposal, &r.source);
        }
        checked.push(name.clone());
    }
    checked.sort();
    assert_eq!(
        checked,
        [
            "candle_softmax",
            "gemm",
            "gqa_decode",
            "layer_norm",
            "reduce_sum",
            "rmsnorm",
            "silu_mul",
            "softmax",
            "transpose"
        ]
    );
}

#[test]
fn cluster_sizes_and_defines_are_read_from_the_source() {
    let src =
        "#define CLUSTER 8\nextern \"C\" __global__ void __cluster_dims__(CLUSTER, 1, 1) f() {}";
    let none = BTreeMap::new();
    assert_eq!(cluster_x(src, &none), Some(8));
    let four = BTreeMap::from([("CLUSTER".to_string(), 4)]);
    assert_eq!(cluster_x(src, &four), Some(4), "a proposal's define wins");
    assert_eq!(
        cluster_x("__global__ void __cluster_dims__(4, 1, 1) f() {}", &none),
        Some(4)
    );
    assert_eq!(cluster_x("__global__ void f() {}", &none), None);
    assert_eq!(define("#define MAX_ITEMS 512 // x", "MAX_ITEMS"), Some(512));
    assert_eq!(define("#define MAX_ITEMS_2 7", "MAX_ITEMS"), None);
    let src = "#define HEADS 8\n#define MAX_PARTIALS (1024 * HEADS)\n#define BAD (HEADS + 1)";
    assert_eq!(define(src, "MAX_PARTIALS"), Some(8192));
    assert_eq!(define(src, "BAD"), None);
}

/// The scripted agents keep pointers and patches, not copies: no file under either
/// example's `agents/` has the bytes of an accepted variant's `kernel.cu`.
#[test]
fn no_agents_file_is_a_copy_of_an_accepted_variant() {
    fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                files(&p, out);
            } else {
                out.push(p);
            }
        }
    }
    for example in ["llm-kernels", "candle-ops"] {
        let root = repo_root().join("examples").join(example);
        let mut accepted = Vec::new();
        files(&root.join("kopt"), &mut accepted);
        let accepted: Vec<(std::path::PathBuf, Vec<u8>)> = accepted
            .into_iter()
            .filter(|p| p.file_name().is_some_and(|n| n == "kernel.cu"))
            .map(|p| {
                let bytes = std::fs::read(&p).unwrap();
                (p, bytes)
            })
            .collect();
        assert!(!accepted.is_empty(), "{example} has accepted variants");
        let mut agents = Vec::new();
        files(&root.join("agents"), &mut agents);
        for f in agents {
            let bytes = std::fs::read(&f).unwrap();
            if let Some((v, _)) = accepted.iter().find(|(_, b)| *b == bytes) {
                panic!(
                    "{} is a copy of {}: point the proposal at it (\"source_file\") instead",
                    f.display(),
                    v.display()
                );
            }
        }
    }
}

/// A proposal whose patch no longer fits its base, or whose source file is missing, is
/// refused by the agent with the file and the fix, not answered with a wrong source.
#[test]
fn the_scripted_agent_refuses_a_stale_patch_and_a_missing_source() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("base.cu"), "a\nb\nc\n").unwrap();
    std::fs::write(
        d.join("k.patch"),
        "--- base.cu\n+++ k.cu\n@@ -1,3 +1,3 @@\n a\n-x\n+y\n c\n",
    )
    .unwrap();
    let proposal = |candidate: serde_json::Value| {
        serde_json::json!({ "proposals": [{ "candidate": candidate }] }).to_string()
    };
    let agent = repo_root().join("scripts/scripted_agent.py");
    let answer = |kernel: &str| {
        let mut cmd = std::process::Command::new("python3");
        cmd.arg(&agent).arg("answer").arg(d);
        kopt_tests::ask_scripted_agent(cmd, kernel)
    };
    std::fs::write(
        d.join("stale.proposal.json"),
        proposal(serde_json::json!({ "source_file": "base.cu", "source_patch": "k.patch" })),
    )
    .unwrap();
    let out = answer("stale");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("k.patch: line 2 of the base is 'b', the patch expects 'x'")
            && err.contains("make the patch again with diff -u"),
        "{err}"
    );
    std::fs::write(
        d.join("missing.proposal.json"),
        proposal(serde_json::json!({ "source_file": "gone.cu" })),
    )
    .unwrap();
    let out = answer("missing");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("missing.proposal.json proposals[0]: source_file gone.cu"),
        "{err}"
    );
    // The same patch over the base it was made from applies.
    std::fs::write(d.join("base.cu"), "a\nx\nc\n").unwrap();
    let out = answer("stale");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let set: serde_json::Value = serde_json::from_str(text["text"].as_str().unwrap()).unwrap();
    assert_eq!(set["proposals"][0]["candidate"]["source"], "a\ny\nc\n");
    assert!(set["proposals"][0]["candidate"]
        .get("source_file")
        .is_none());
}

/// The Hopper candidates of `agents/hopper/` (answered with `KOPT_PROPOSALS` pointing
/// there): valid, and launchable on every shape, as above. The GEMM's takes the annotation's
/// tensor maps.
#[test]
fn the_hopper_proposals_are_valid_and_launchable_on_every_shape() {
    let hopper = agents_dir().join("hopper");
    let mut checked = Vec::new();
    for k in kernels() {
        let name = &k.spec.name;
        let path = hopper.join(format!("{name}.proposal.json"));
        if !path.is_file() {
            continue;
        }
        // What the scripted agent answers: each candidate's source written out, its
        // patch applied.
        let text = kopt_tests::scripted_answer_from(&agents_dir(), Some(&hopper), name);
        let resolved = proposal::parse(&text, &k.spec, &k.reference.text)
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        for r in &resolved {
            check_launchable(&k.spec, name, &r.proposal, &r.source);
        }
        checked.push(name.clone());
    }
    checked.sort();
    assert_eq!(checked, ["gemm", "gqa_decode", "paged_decode"]);
}
