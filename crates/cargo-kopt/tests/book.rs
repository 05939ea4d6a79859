//! The book under `docs/book/`: its command reference is the CLI's own help, and its links
//! (and those of the repository's other documents) lead somewhere.
//!
//! `KOPT_BLESS=1 cargo test -p cargo-kopt --test book` rewrites
//! `docs/book/src/reference/commands.md` from the built binary's help.

use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn book_src() -> PathBuf {
    repo().join("docs/book/src")
}

const COMMANDS_MD: &str = "docs/book/src/reference/commands.md";

/// `cargo kopt ARGS --help`, as a person reads it: no colour, and no value that the
/// caller's environment would show in `[env: KOPT_...=value]`.
fn help(args: &[&str]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cargo-kopt"));
    cmd.arg("kopt").args(args).arg("--help");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("KOPT_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env("NO_COLOR", "1").env_remove("CLICOLOR_FORCE");
    let out = cmd.output().expect("run cargo-kopt");
    assert!(
        out.status.success(),
        "cargo kopt {} --help failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("help is UTF-8");
    assert!(!text.contains('\u{1b}'), "help coloured despite NO_COLOR");
    text.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The subcommands a help text lists under `Commands:` (clap's own `help` left out).
fn subcommands(help: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut inside = false;
    for line in help.lines() {
        if line == "Commands:" {
            inside = true;
            continue;
        }
        if !inside {
            continue;
        }
        if line.is_empty() || !line.starts_with(' ') {
            break;
        }
        // A command's line is indented by two; its wrapped description by more.
        if line.starts_with("  ") && !line.starts_with("   ") {
            let name = line.split_whitespace().next().unwrap_or_default();
            if name != "help" {
                names.push(name.to_string());
            }
        }
    }
    names
}

/// Every command's help, depth first, in the order `--help` lists them.
fn render_reference() -> String {
    fn walk(path: &mut Vec<String>, out: &mut String) {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let text = help(&args);
        let level = "#".repeat((path.len() + 2).min(4));
        let title = if path.is_empty() {
            "`cargo kopt`".to_string()
        } else {
            format!("`cargo kopt {}`", path.join(" "))
        };
        out.push_str(&format!("{level} {title}\n\n```text\n{text}\n```\n\n"));
        for sub in subcommands(&text) {
            path.push(sub);
            walk(path, out);
            path.pop();
        }
    }
    let mut out = String::from(
        "# Commands\n\n\
         <!-- Generated from the clap definitions by crates/cargo-kopt/tests/book.rs; do not\n     \
         edit. Regenerate: KOPT_BLESS=1 cargo test -p cargo-kopt --test book -->\n\n\
         Every command's `--help`, as the binary prints it. The options common to every\n\
         command (`--manifest-path`, `-p/--package`, `--workspace`, `--exclude`,\n\
         `--message-format`, `--color`) are listed under each.\n\n",
    );
    walk(&mut Vec::new(), &mut out);
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

#[test]
fn command_reference_is_the_clis_help() {
    let want = render_reference();
    let path = repo().join(COMMANDS_MD);
    if std::env::var_os("KOPT_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let first = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(have.lines().count().min(want.lines().count()));
        panic!(
            "{COMMANDS_MD} is not the CLI's help (first difference at line {}: committed {:?}, \
             CLI {:?}). Regenerate it with `KOPT_BLESS=1 cargo test -p cargo-kopt --test book` \
             and commit the result.",
            first + 1,
            have.lines().nth(first).unwrap_or("<end of file>"),
            want.lines().nth(first).unwrap_or("<end of file>"),
        );
    }
}

#[test]
fn subcommands_are_read_from_the_commands_section() {
    let text = "Usage: cargo kopt <COMMAND>\n\nCommands:\n  list    List every kernel\n  pin     Record a variant\n          that spans lines\n  help    Print this message\n\nOptions:\n  -h, --help  Print help";
    assert_eq!(subcommands(text), ["list", "pin"]);
    let top = help(&[]);
    let names = subcommands(&top);
    for name in ["list", "check", "optimize", "review", "cases", "mcp"] {
        assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
    }
    assert!(
        !names.iter().any(|n| n.starts_with("__")),
        "hidden commands stay out of the reference: {names:?}"
    );
    assert!(subcommands(&help(&["cases"])).contains(&"search".to_string()));
}

/// A markdown file's links and headings, outside fenced code and code spans.
struct Doc {
    links: Vec<(usize, String)>,
    anchors: BTreeSet<String>,
}

/// mdBook's heading id (lower-cased ASCII, alphanumerics `-` `_` kept, spaces to `-`, the rest
/// dropped; a repeated id gets `-1`, `-2`, ...). For ASCII headings GitHub's is the same.
fn heading_id(text: &str) -> String {
    text.trim()
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c.to_ascii_lowercase()),
            c if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

/// The visible text of a line of markdown: code spans' contents kept (without the ticks),
/// links reduced to their text, emphasis dropped.
fn visible(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(i) = rest.find(['`', '[', '*']) {
        out.push_str(&rest[..i]);
        let c = rest.as_bytes()[i];
        rest = &rest[i..];
        match c {
            b'`' => {
                let ticks = rest.len() - rest.trim_start_matches('`').len();
                let fence = &rest[..ticks];
                match rest[ticks..].find(fence) {
                    Some(end) => {
                        out.push_str(&rest[ticks..ticks + end]);
                        rest = &rest[ticks + end + ticks..];
                    }
                    None => {
                        out.push_str(fence);
                        rest = &rest[ticks..];
                    }
                }
            }
            b'[' => match (rest.find("]("), rest.find(')')) {
                (Some(close), Some(paren)) if close < paren => {
                    out.push_str(&visible(&rest[1..close]));
                    rest = &rest[paren + 1..];
                }
                _ => {
                    out.push('[');
                    rest = &rest[1..];
                }
            },
            _ => rest = &rest[1..],
        }
    }
    out.push_str(rest);
    out
}

/// A line with its code spans blanked, so that links inside them are not read.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(i) = rest.find('`') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let ticks = rest.len() - rest.trim_start_matches('`').len();
        let fence = &rest[..ticks];
        match rest[ticks..].find(fence) {
            Some(end) => {
                out.push_str(&" ".repeat(end + 2 * ticks));
                rest = &rest[ticks + end + ticks..];
            }
            None => {
                out.push_str(fence);
                rest = &rest[ticks..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn parse(text: &str) -> Doc {
    let mut doc = Doc {
        links: Vec::new(),
        anchors: BTreeSet::new(),
    };
    let mut seen: HashMap<String, u32> = HashMap::new();
    let mut fence: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(f) = &fence {
            if trimmed.starts_with(f.as_str()) {
                fence = None;
            }
            continue;
        }
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fence = Some(trimmed[..3].to_string());
            continue;
        }
        let hashes = trimmed.len() - trimmed.trim_start_matches('#').len();
        if (1..=6).contains(&hashes) && trimmed[hashes..].starts_with(' ') {
            let title = trimmed[hashes..].trim().trim_end_matches('#').trim_end();
            let id = match title.rfind("{#") {
                Some(i) if title.ends_with('}') => title[i + 2..title.len() - 1].to_string(),
                _ => {
                    let base = heading_id(&visible(title));
                    let count = seen.entry(base.clone()).or_insert(0);
                    let id = if *count == 0 {
                        base
                    } else {
                        format!("{base}-{count}")
                    };
                    *count += 1;
                    id
                }
            };
            doc.anchors.insert(id);
        }
        let plain = without_code_spans(line);
        // Inline links and images: `](target)` or `](target "title")`.
        let mut rest = plain.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = rest[..end]
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .trim_matches(|c| c == '<' || c == '>');
            doc.links.push((n + 1, target.to_string()));
            rest = &rest[end..];
        }
        // Reference definitions: `[label]: target`.
        if let Some(def) = plain.trim_start().strip_prefix('[') {
            if let Some((_, target)) = def.split_once("]: ") {
                if let Some(t) = target.split_whitespace().next() {
                    doc.links.push((n + 1, t.to_string()));
                }
            }
        }
    }
    doc
}

/// `a/b/../c` -> `a/c`, without touching the file system.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

fn markdown_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            markdown_under(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// Every relative link of `files` that does not resolve: a missing file, a link that leaves
/// `inside`, or an anchor that is no heading of the target.
fn broken_links(files: &[PathBuf], inside: &Path) -> Vec<String> {
    let inside = normalise(inside);
    let mut docs: HashMap<PathBuf, Doc> = HashMap::new();
    let mut broken = Vec::new();
    for file in files {
        let file = normalise(file);
        let text = std::fs::read_to_string(&file).unwrap();
        let doc = parse(&text);
        for (line, target) in &doc.links {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                normalise(&file.parent().unwrap().join(path))
            };
            let at = format!(
                "{}:{line}: {target}",
                file.strip_prefix(normalise(&repo()))
                    .unwrap_or(&file)
                    .display()
            );
            if !resolved.starts_with(&inside) {
                broken.push(format!("{at} leaves {}", inside.display()));
                continue;
            }
            if !resolved.exists() {
                broken.push(format!("{at}: no such file"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if resolved.extension().is_none_or(|e| e != "md") {
                continue;
            }
            let target_doc = docs
                .entry(resolved.clone())
                .or_insert_with(|| parse(&std::fs::read_to_string(&resolved).unwrap_or_default()));
            if !target_doc.anchors.contains(anchor) {
                broken.push(format!(
                    "{at}: no heading #{anchor} (headings: {:?})",
                    target_doc.anchors
                ));
            }
        }
        docs.insert(file, doc);
    }
    broken
}

#[test]
fn book_links_resolve_inside_the_book() {
    let src = book_src();
    let mut files = Vec::new();
    markdown_under(&src, &mut files);
    files.sort();
    assert!(
        files.len() > 5,
        "the book has chapters under {}",
        src.display()
    );
    let broken = broken_links(&files, &src);
    assert!(
        broken.is_empty(),
        "broken links in the book (a link must name a file under docs/book/src and, with \
         #anchor, one of its headings; name files outside the book in `code` instead):\n{}",
        broken.join("\n")
    );

    // Every chapter is reachable from SUMMARY.md, so mdbook renders it.
    let summary = parse(&std::fs::read_to_string(src.join("SUMMARY.md")).unwrap());
    let listed: BTreeSet<PathBuf> = summary
        .links
        .iter()
        .map(|(_, t)| normalise(&src.join(t.split('#').next().unwrap())))
        .collect();
    let orphans: Vec<_> = files
        .iter()
        .map(|f| normalise(f))
        .filter(|f| !f.ends_with("SUMMARY.md") && !listed.contains(f))
        .collect();
    assert!(
        orphans.is_empty(),
        "chapters that SUMMARY.md does not list: {orphans:?}"
    );
}

#[test]
fn repository_documents_link_to_files_that_exist() {
    let root = repo();
    let mut files: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "examples/llm-kernels/FINDINGS.md",
        "docs/runs/README.md",
    ]
    .iter()
    .map(|f| root.join(f))
    .collect();
    for entry in std::fs::read_dir(root.join("docs/runs")).unwrap() {
        let summary = entry.unwrap().path().join("README.md");
        if summary.is_file() {
            files.push(summary);
        }
    }
    let broken = broken_links(&files, &root);
    assert!(
        broken.is_empty(),
        "broken links (a run's raw files are in its archive: cite the archive):\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_link_reader_sees_what_mdbook_sees() {
    let doc = parse(
        "# The `cargo kopt` book\n## Noise, and *timing*\n## Noise, and timing\n\
         see [a](a.md#x) and ![b](img/b.png \"t\") `[not](a link)`\n\
         ```text\n[nor](this.md)\n# not a heading\n```\n[ref]: other.md\n",
    );
    assert_eq!(
        doc.anchors,
        BTreeSet::from([
            "the-cargo-kopt-book".to_string(),
            "noise-and-timing".to_string(),
            "noise-and-timing-1".to_string(),
        ])
    );
    let targets: Vec<&str> = doc.links.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(targets, ["a.md#x", "img/b.png", "other.md"]);
}
