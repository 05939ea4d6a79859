//! Kernel sources: resolving `#include "..."` inside the crate into one self-contained
//! translation unit, and the hashes that tie a variant to what it was verified against.
//!
//! The runtime compiles with NVRTC from an embedded string and has no files, so the
//! reference is *amalgamated*: each quoted include is inlined once (as `#pragma once`
//! would), wrapped in `#line` directives so that compiler messages name the original file
//! and line. `#include <...>` (CUDA's own headers) is left to NVRTC.

use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

/// A source with its quoted includes inlined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Amalgamated {
    pub text: String,
    /// Every file read, the reference first (absolute paths, for build tracking).
    pub files: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SourceError {
    #[error("cannot read `{path}`: {reason}")]
    Read { path: String, reason: String },
    #[error("{file}:{line}: `#include \"{include}\"` not found (searched {searched})")]
    IncludeNotFound {
        file: String,
        line: usize,
        include: String,
        searched: String,
    },
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
    let mut first = true;
    for (i, line) in text.lines().enumerate() {
        let lineno = i + 1;
        if let Some(inc) = quoted_include(line) {
            let candidates: Vec<PathBuf> = std::iter::once(dir.join(&inc))
                .chain(dirs.iter().map(|d| d.join(&inc)))
                .map(|p| normalise(&p))
                .collect();
            let Some(found) = candidates.iter().find(|p| p.is_file()) else {
                return Err(SourceError::IncludeNotFound {
                    file: name,
                    line: lineno,
                    include: inc,
                    searched: candidates
                        .iter()
                        .map(|p| rel(root, p.parent().unwrap_or(root)))
                        .collect::<Vec<_>>()
                        .join(", "),
                });
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
            } else {
                out.text.push('\n');
            }
            continue;
        }
        if first {
            out.text.push_str(&format!("#line 1 \"{name}\"\n"));
            first = false;
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

/// Whether `source` defines a `__global__` function named `entry`.
pub fn defines_entry(source: &str, entry: &str) -> bool {
    global_functions(source).iter().any(|n| n == entry)
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
        assert!(matches!(
            amalgamate(d.path(), "kernels/k.cu", &[]),
            Err(SourceError::IncludeNotFound { .. })
        ));
        let a = amalgamate(d.path(), "kernels/k.cu", &["common".into()]).unwrap();
        assert!(a.text.contains("#define TWO 2"));

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
}
