//! What `kopt` (the crate users link) adds to a user's build: nothing of the command line's
//! weight. The async runtime, SQLite, the MCP server, HTTP clients and argument parsing
//! belong to `cargo kopt` only.

use std::collections::BTreeSet;
use std::process::Command;

use kopt_tests::{repo_root, text};

/// Packages that only the CLI may pull in.
const CLI_ONLY: &[&str] = &[
    "tokio",
    "rusqlite",
    "libsqlite3-sys",
    "rmcp",
    "reqwest",
    "hyper",
    "ureq",
    "clap",
];

/// The packages `package` builds with on this machine's target: its normal and build
/// dependencies and theirs, with the features a build of `package` alone resolves
/// (`cargo tree`; every target would need other platforms' crates, which an offline
/// machine has not downloaded, and the CLI's dependencies are not platform-specific).
fn build_graph(package: &str) -> BTreeSet<String> {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["tree", "--locked", "--offline", "-p", package])
        .args(["-e", "normal,build", "--prefix", "none"])
        .args(["--format", "{p}"])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn kopt_pulls_in_nothing_the_cli_alone_needs() {
    let graph = build_graph("kopt");
    assert!(
        graph.contains("cudarc"),
        "the query found kopt's graph: {graph:?}"
    );
    let heavy: Vec<&&str> = CLI_ONLY.iter().filter(|p| graph.contains(**p)).collect();
    assert!(
        heavy.is_empty(),
        "kopt's build graph holds {heavy:?}, which belong to cargo-kopt only: \
         `cargo tree -p kopt -e normal,build -i <package>` shows the path"
    );
}

/// The same query sees the CLI's dependencies where they are, so the test above cannot
/// pass for want of looking.
#[test]
fn the_query_sees_the_cli_dependencies_in_cargo_kopt() {
    let graph = build_graph("cargo-kopt");
    for p in ["tokio", "rusqlite", "rmcp", "clap"] {
        assert!(graph.contains(p), "cargo-kopt's graph lacks {p}: {graph:?}");
    }
}
