//! Kernel sources: resolving `#include "..."` inside the crate into one self-contained
//! translation unit, and the hashes that tie a variant to what it was verified against.
//!
//! The runtime compiles with NVRTC from an embedded string and has no files, so the
//! reference is *amalgamated*: each quoted include found in the crate is inlined once (as
//! `#pragma once` would), wrapped in `#line` directives so that compiler messages name the
//! original file and line. A quoted include that is not found beside the including file
//! or in the declared include folders falls back to the system search path, as the C
//! preprocessor does: it is left in place for NVRTC, which looks in CUDA's include
//! folders (`#include "cuda_fp16.h"` in a helper header is common). `#include <...>`
//! is left to NVRTC too.

use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

/// A source with its quoted includes inlined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Amalgamated {
    pub text: String,
    /// Every file read, the reference first (absolute paths, for build tracking).
    pub files: Vec<PathBuf>,
    /// Quoted includes found nowhere in the crate, left for NVRTC's search path (CUDA's
    /// include folders), in the order met: `(file, line, include)`.
    pub system_includes: Vec<(String, usize, String)>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SourceError {
    #[error("cannot read `{path}`: {reason}")]
    Read { path: String, reason: String },
    #[error("{file}:{line}: `#include \"{include}\"` leaves the crate; kernel includes must stay inside it")]
    IncludeEscapes {
        file: String,
        line: usize,
        include: String,
    },
}

/// Reads `reference` (relative to `crate_root`) and inlines its quoted includes, searching
/// the including file's folder first, then `include_dirs` (relative to the crate root).
pub fn amalgamate(
    crate_root: &Path,
    reference: &str,
    include_dirs: &[String],
) -> Result<Amalgamated, SourceError> {
    let mut out = Amalgamated {
        text: String::new(),
        files: Vec::new(),
        system_includes: Vec::new(),
    };
    let root = crate_root.canonicalize().map_err(|e| SourceError::Read {
        path: crate_root.display().to_string(),
        reason: e.to_string(),
    })?;
    let dirs: Vec<PathBuf> = include_dirs.iter().map(|d| root.join(d)).collect();
    inline(&root, &root.join(reference), &dirs, &mut out)?;
    Ok(out)
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root)
        .unwrap_or(p)
        .components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// Lexical normalisation (no symlinks resolved) so `a/./b/../c` compares equal to `a/c`.
fn normalise(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

fn inline(
    root: &Path,
    file: &Path,
    dirs: &[PathBuf],
    out: &mut Amalgamated,
) -> Result<(), SourceError> {
    let file = normalise(file);
    let name = rel(root, &file);
    let text = std::fs::read_to_string(&file).map_err(|e| SourceError::Read {
        path: name.clone(),
        reason: e.to_string(),
    })?;
    out.files.push(file.clone());
    let dir = file.parent().unwrap_or(root).to_path_buf();
    // Whether the next line written needs a `#line` marker first: at the file's start,
    // and after a marker-less gap.
    let mut need_marker = true;
    for (i, line) in text.lines().enumerate() {
        let lineno = i + 1;
        if let Some(inc) = quoted_include(line) {
            let candidates: Vec<PathBuf> = std::iter::once(dir.join(&inc))
                .chain(dirs.iter().map(|d| d.join(&inc)))
                .map(|p| normalise(&p))
                .collect();
            let Some(found) = candidates.iter().find(|p| p.is_file()) else {
                if Path::new(&inc).is_absolute() || inc.split(['/', '\\']).any(|c| c == "..") {
                    return Err(SourceError::IncludeEscapes {
                        file: name,
                        line: lineno,
                        include: inc,
                    });
                }
                // Not the crate's: the system search path's, as for `<...>`.
                out.system_includes.push((name.clone(), lineno, inc));
                if need_marker {
                    out.text.push_str(&format!("#line {lineno} \"{name}\"\n"));
                    need_marker = false;
                }
                out.text.push_str(line);
                out.text.push('\n');
                continue;
            };
            let resolved = found.canonicalize().unwrap_or_else(|_| found.clone());
            if Path::new(&inc).is_absolute() || !resolved.starts_with(root) {
                return Err(SourceError::IncludeEscapes {
                    file: name,
                    line: lineno,
                    include: inc,
                });
            }
            if !out.files.contains(found) {
                inline(root, found, dirs, out)?;
                out.text
                    .push_str(&format!("#line {} \"{}\"\n", lineno + 1, name));
                need_marker = false;
            } else {
                out.text.push('\n');
            }
            continue;
        }
        if need_marker {
            out.text.push_str(&format!("#line {lineno} \"{name}\"\n"));
            need_marker = false;
        }
        if line.trim() == "#pragma once" {
            out.text.push('\n');
            continue;
        }
        out.text.push_str(line);
        out.text.push('\n');
    }
    Ok(())
}

/// `#include "x.cuh"` -> `x.cuh`; anything else -> None.
fn quoted_include(line: &str) -> Option<String> {
    let t = line.trim_start();
    let rest = t.strip_prefix('#')?.trim_start().strip_prefix("include")?;
    let rest = rest.trim_start().strip_prefix('"')?;
    let end = rest.find('"')?;
    Some(rest[..end].to_string())
}

/// A token of CUDA C++ code outside comments, string and character literals and
/// preprocessor directives (their continuation lines included): what a rewrite may touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeToken<'a> {
    pub text: &'a str,
    /// Byte offset in the source.
    pub start: usize,
    /// Whether the token is the first of its line (only blanks before it).
    pub starts_line: bool,
}

/// The code tokens of `source` (see [`CodeToken`]): identifiers and numbers whole, every
/// other character alone.
pub fn code_tokens(source: &str) -> Vec<CodeToken<'_>> {
    let b = source.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line_start = true;
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line_start = true;
            i += 1;
            continue;
        }
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i = (i + 2).min(b.len());
            continue;
        }
        if c == b'#' && line_start {
            // A directive runs to the end of its line and every continued line.
            while i < b.len() {
                if b[i] == b'\n' {
                    if i > 0 && b[i - 1] == b'\\' {
                        i += 1;
                        continue;
                    }
                    break;
                }
                i += 1;
            }
            continue;
        }
        if c == b'"' || c == b'\'' {
            let quote = c;
            i += 1;
            while i < b.len() && b[i] != quote && b[i] != b'\n' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i = (i + 1).min(b.len());
            line_start = false;
            continue;
        }
        let start = i;
        if c.is_ascii_alphanumeric() || c == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
        } else {
            i += source[i..].chars().next().map_or(1, char::len_utf8);
        }
        out.push(CodeToken {
            text: &source[start..i],
            start,
            starts_line: line_start,
        });
        line_start = false;
    }
    out
}

/// `source` with comments and string literals blanked (newlines kept).
pub fn strip_comments(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut chars = source.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut prev = ' ';
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                    }
                    if prev == '*' && c == '/' {
                        break;
                    }
                    prev = c;
                }
                out.push(' ');
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                    if !escaped && c == '"' {
                        break;
                    }
                    escaped = !escaped && c == '\\';
                }
                out.push_str("\"\"");
            }
            _ => out.push(c),
        }
    }
    out
}

/// `sha256:<hex>` of some bytes: the form every hash takes in kopt's files.
pub fn hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut s = String::with_capacity(71);
    s.push_str("sha256:");
    for b in digest {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Names of the `__global__` functions defined in `source`: for each `__global__`, the
/// identifier just before the next `(` (a lexical scan that catches typos and renamed
/// kernels at compile time; NVRTC has the last word). Comments are not skipped.
pub fn global_functions(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = source;
    while let Some(pos) = rest.find("__global__") {
        rest = &rest[pos + "__global__".len()..];
        // Attributes such as `__launch_bounds__(256)` sit between `__global__` and the
        // name: skip their parenthesised arguments.
        let mut scan = rest;
        let name = loop {
            let Some(paren) = scan.find(['(', ';', '{']) else {
                break None;
            };
            if !scan[paren..].starts_with('(') {
                break None;
            }
            let head = scan[..paren].trim_end();
            let ident: String = head
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            if ident.starts_with("__") && ident.ends_with("__") && ident.len() > 4 {
                let Some(close) = scan[paren..].find(')') else {
                    break None;
                };
                scan = &scan[paren + close + 1..];
                continue;
            }
            break Some(ident);
        };
        if let Some(name) = name.filter(|n| !n.is_empty()) {
            if !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

/// Whether `source` defines a `__global__` function named `entry`, as far as a lexical
/// scan can tell.
pub fn defines_entry(source: &str, entry: &str) -> bool {
    global_functions(source).iter().any(|n| n == entry)
}

/// Whether `source` defines `entry` or may generate it ([`entry_presence`] is not
/// `Absent`): the check every stored variant and proposal passes before NVRTC has its say.
pub fn may_define_entry(source: &str, entry: &str) -> bool {
    entry_presence(source, entry) != EntryPresence::Absent
}

/// What a lexical scan can say of an entry point. NVRTC is the authority: the entry is
/// there when the compiled module holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryPresence {
    /// Written out: `extern "C" __global__ void <entry>(`.
    Defined,
    /// Not written out, but the source can make it: a macro whose body defines a
    /// `__global__` function, or a `__global__` template with a name expression as the
    /// entry (`softmax<float>`). The reason, for a note.
    Unseen(String),
    /// Neither written nor possibly generated: a typo or another file's kernel.
    Absent,
}

/// Looks for `entry` in `source`: see [`EntryPresence`].
pub fn entry_presence(source: &str, entry: &str) -> EntryPresence {
    if defines_entry(source, entry) {
        return EntryPresence::Defined;
    }
    if let Some(open) = entry.find('<') {
        let base = entry[..open].trim();
        let base = base.rsplit("::").next().unwrap_or(base);
        if global_functions(source).iter().any(|n| n == base) {
            return EntryPresence::Unseen(format!(
                "`{entry}` names an instantiation of the `__global__` template `{base}`; NVRTC lowers it when the kernel is compiled"
            ));
        }
        return EntryPresence::Absent;
    }
    let macros = global_macros(source);
    if !macros.is_empty() {
        let listed = macros
            .iter()
            .map(|m| format!("`{m}`"))
            .collect::<Vec<_>>()
            .join(", ");
        return EntryPresence::Unseen(format!(
            "`{entry}` is not written out, but the macro{} {listed} define{} `__global__` functions; NVRTC checks that the compiled module holds it",
            if macros.len() == 1 { "" } else { "s" },
            if macros.len() == 1 { "s" } else { "" },
        ));
    }
    EntryPresence::Absent
}

/// Names of the `#define`d macros whose bodies (continuation lines included) contain
/// `__global__`.
pub fn global_macros(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = source.lines();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        let Some(rest) = t.strip_prefix('#').map(str::trim_start) else {
            continue;
        };
        let Some(rest) = rest.strip_prefix("define") else {
            continue;
        };
        if !rest.starts_with([' ', '\t']) {
            continue;
        }
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let mut body = line.to_string();
        let mut current = line;
        while current.trim_end().ends_with('\\') {
            match lines.next() {
                Some(next) => {
                    body.push_str(next);
                    current = next;
                }
                None => break,
            }
        }
        if body.contains("__global__") && !name.is_empty() && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, rel: &str, text: &str) {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn inlines_each_include_once_with_line_markers() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            "kernels/common.cuh",
            "#pragma once\n__device__ float sq(float x) { return x * x; }\n",
        );
        write(
            d.path(),
            "kernels/more.cuh",
            "#include \"common.cuh\"\n__device__ float q(float x) { return sq(sq(x)); }\n",
        );
        write(
            d.path(),
            "kernels/k.cu",
            "#include <cuda_fp16.h>\n#include \"common.cuh\"\n#include \"more.cuh\"\nextern \"C\" __global__ void k(float* y) { y[0] = q(2.0f); }\n",
        );
        let a = amalgamate(d.path(), "kernels/k.cu", &[]).unwrap();
        assert_eq!(a.files.len(), 3);
        assert_eq!(a.text.matches("__device__ float sq").count(), 1);
        assert!(a.text.contains("#include <cuda_fp16.h>"));
        assert!(a.text.contains("#line 1 \"kernels/common.cuh\""));
        assert!(a.text.contains("#line 4 \"kernels/k.cu\""));
        assert!(defines_entry(&a.text, "k"));
        assert!(
            !defines_entry(&a.text, "q"),
            "a __device__ function is no entry point"
        );
        assert!(!defines_entry(&a.text, "kk"));
        let lb = "extern \"C\" __global__ void __launch_bounds__(MAX_BLOCK, 2)\nsoftmax_f32(const float* x) {}";
        assert_eq!(global_functions(lb), vec!["softmax_f32"]);
    }

    #[test]
    fn include_dirs_and_escapes() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "common/util.cuh", "#define TWO 2\n");
        write(d.path(), "kernels/k.cu", "#include \"util.cuh\"\n");
        // Not in the crate: left for NVRTC's search path, as the preprocessor would.
        let a = amalgamate(d.path(), "kernels/k.cu", &[]).unwrap();
        assert!(a.text.contains("#include \"util.cuh\""));
        assert_eq!(
            a.system_includes,
            vec![("kernels/k.cu".to_string(), 1, "util.cuh".to_string())]
        );
        let a = amalgamate(d.path(), "kernels/k.cu", &["common".into()]).unwrap();
        assert!(a.text.contains("#define TWO 2"));
        assert!(a.system_includes.is_empty());

        let outer = tempfile::tempdir().unwrap();
        write(outer.path(), "secret.h", "x\n");
        let crate_dir = outer.path().join("crate");
        write(&crate_dir, "kernels/k.cu", "#include \"../../secret.h\"\n");
        assert!(matches!(
            amalgamate(&crate_dir, "kernels/k.cu", &[]),
            Err(SourceError::IncludeEscapes { .. })
        ));
    }

    #[test]
    fn hash_format() {
        assert_eq!(
            hash(b"abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_quoted_cuda_header_falls_back_to_the_system_path() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            "kernels/candle/compatibility.cuh",
            "#include \"cuda_fp16.h\"\n#include \"cuda_bf16.h\"\n__device__ int one() { return 1; }\n",
        );
        write(
            d.path(),
            "kernels/candle/k.cu",
            "#include \"compatibility.cuh\"\nextern \"C\" __global__ void k(int* y) { y[0] = one(); }\n",
        );
        let a = amalgamate(d.path(), "kernels/candle/k.cu", &[]).unwrap();
        assert_eq!(a.system_includes.len(), 2);
        assert_eq!(
            a.text,
            "#line 1 \"kernels/candle/compatibility.cuh\"\n#include \"cuda_fp16.h\"\n#include \"cuda_bf16.h\"\n__device__ int one() { return 1; }\n#line 2 \"kernels/candle/k.cu\"\nextern \"C\" __global__ void k(int* y) { y[0] = one(); }\n"
        );
        // An escaping path stays an error even when nothing is found.
        write(d.path(), "kernels/e.cu", "#include \"../../nowhere.h\"\n");
        assert!(matches!(
            amalgamate(d.path(), "kernels/e.cu", &[]),
            Err(SourceError::IncludeEscapes { .. })
        ));
    }

    #[test]
    fn line_markers_are_right_when_a_file_begins_with_an_include() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "kernels/h.cuh", "#pragma once\n#define ONE 1\n");
        write(
            d.path(),
            "kernels/k.cu",
            "#include \"h.cuh\"\nextern \"C\" __global__ void k(int* y) { y[0] = ONE; }\n",
        );
        let a = amalgamate(d.path(), "kernels/k.cu", &[]).unwrap();
        let lines: Vec<&str> = a.text.lines().collect();
        let at = lines.iter().position(|l| l.starts_with("extern")).unwrap();
        assert_eq!(lines[at - 1], "#line 2 \"kernels/k.cu\"");
        assert_eq!(a.text.matches("#line").count(), 2, "{}", a.text);
    }

    #[test]
    fn entries_made_by_macros_and_templates_are_unseen_not_absent() {
        let by_macro = "#define SOFTMAX_OP(T, NAME) \\\n  extern \"C\" __global__ void NAME(const T* x, T* y, int n) { \\\n    softmax<T>(x, y, n); \\\n  }\nSOFTMAX_OP(float, softmax_f32)\nSOFTMAX_OP(__half, softmax_f16)\n";
        assert!(matches!(
            entry_presence(by_macro, "softmax_f32"),
            EntryPresence::Unseen(why) if why.contains("`SOFTMAX_OP`")
        ));
        assert_eq!(global_macros(by_macro), vec!["SOFTMAX_OP"]);
        let template = "template <typename T, int B>\n__global__ void reduce(const T* x, T* y) {}\ntemplate __global__ void reduce<float, 256>(const float*, float*);\n";
        assert!(matches!(
            entry_presence(template, "reduce<float, 256>"),
            EntryPresence::Unseen(_)
        ));
        assert_eq!(
            entry_presence(template, "reduce2<float>"),
            EntryPresence::Absent
        );
        let plain = "extern \"C\" __global__ void k(float* y) {}\n#define TWICE(x) (2 * (x))\n";
        assert_eq!(entry_presence(plain, "k"), EntryPresence::Defined);
        assert_eq!(entry_presence(plain, "k_f64"), EntryPresence::Absent);
    }
}
