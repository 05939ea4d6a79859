//! The built-in heuristic agent: no model. It reads the same context a model reads (the
//! current best's source, launch rule and figures) and proposes safe mechanical rewrites,
//! one step a round, each with its rationale:
//!
//! 1. `__restrict__` on the entry's pointer parameters (kopt's buffers never alias one
//!    another) and `__launch_bounds__(N)` when the block size is a constant;
//! 2. `#pragma unroll 4` on the source's loops that have no pragma;
//! 3. `#pragma unroll 8` instead.
//!
//! A rewrite that does not apply (nothing to change) is skipped. Vectorising loads is not
//! among them (it needs alignment facts this agent cannot check in the source).
//!
//! When the kernel declares tunables, each proposal also carries a parameter matrix: every
//! tunable's default and its next value (the one above, or below at the top of its list),
//! tunables taken in their declared order while the combinations stay within
//! [`EXHAUSTIVE_MATRIX_POINTS`]. The loop sweeps it around the rewrite, so the defaults the author
//! chose are measured against their neighbours on the device.

use std::collections::BTreeMap;

use crate::proposal::EXHAUSTIVE_MATRIX_POINTS;

use crate::backend::{Backend, BackendError};
use crate::chat::{ChatRequest, ChatResponse, Usage};

pub struct Heuristic {
    entry: String,
    step: usize,
}

impl Heuristic {
    pub fn new(entry: &str) -> Self {
        Heuristic {
            entry: entry.to_string(),
            step: 0,
        }
    }
}

/// The text of the fenced block after `heading` in a prompt.
fn section<'a>(prompt: &'a str, heading: &str) -> Option<&'a str> {
    let at = prompt.find(heading)?;
    let rest = &prompt[at + heading.len()..];
    let end = rest.find("\n## ").unwrap_or(rest.len());
    Some(&rest[..end])
}

fn code_block(text: &str) -> Option<String> {
    let start = text.find("```cuda\n")? + 8;
    let end = start + text[start..].find("\n```")?;
    Some(text[start..end].to_string() + "\n")
}

/// The code tokens of the entry's definition: the index of its name, of the `(` and of
/// the matching `)`. Only a definition written out counts (a macro's body is not code the
/// rewrites may touch), and only after `__global__`.
fn entry_params<'a>(
    toks: &[kopt_spec::source::CodeToken<'a>],
    entry: &str,
) -> Option<(usize, usize, usize)> {
    let name = toks.iter().enumerate().position(|(i, t)| {
        t.text == entry
            && toks.get(i + 1).is_some_and(|n| n.text == "(")
            && toks[..i]
                .iter()
                .rev()
                .take_while(|p| p.text != ";" && p.text != "}" && p.text != "{")
                .any(|p| p.text == "__global__")
    })?;
    let open = name + 1;
    let mut depth = 0;
    for (j, t) in toks.iter().enumerate().skip(open) {
        match t.text {
            "(" => depth += 1,
            ")" => {
                depth -= 1;
                if depth == 0 {
                    return Some((name, open, j));
                }
            }
            _ => {}
        }
    }
    None
}

/// Adds `__restrict__` to the pointer parameters of `entry`: after each parameter's last
/// `*`, with a space on both sides, on the code tokens of a written-out definition (never
/// inside a macro, a comment or a string).
pub fn add_restrict(source: &str, entry: &str) -> Option<String> {
    let toks = kopt_spec::source::code_tokens(source);
    let (_, open, close) = entry_params(&toks, entry)?;
    // Each parameter's tokens, split at the top-level commas.
    let mut inserts = Vec::new();
    let mut param: Vec<&kopt_spec::source::CodeToken> = Vec::new();
    let mut depth = 0;
    for t in &toks[open + 1..=close] {
        let end_of_param = depth == 0 && (t.text == "," || t.text == ")");
        if end_of_param {
            let has_restrict = param.iter().any(|p| p.text == "__restrict__");
            if let Some(star) = param.iter().rev().find(|p| p.text == "*") {
                if !has_restrict {
                    inserts.push(star.start + 1);
                }
            }
            param.clear();
            continue;
        }
        match t.text {
            "(" | "[" | "<" => depth += 1,
            ")" | "]" | ">" => depth -= 1,
            _ => {}
        }
        param.push(t);
    }
    if inserts.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(source.len() + 16 * inserts.len());
    let mut last = 0;
    for at in inserts {
        out.push_str(&source[last..at]);
        out.push_str(" __restrict__");
        if !source[at..].starts_with(|c: char| c.is_whitespace()) {
            out.push(' ');
        }
        last = at;
    }
    out.push_str(&source[last..]);
    Some(out)
}

/// Whether NVRTC (where it can be loaded) compiles `source` but not `rewrite`, for
/// compute capability 9.0 (the rewrites touch no architecture-specific code). Without
/// NVRTC nothing is known and nothing is refused.
fn breaks_compile(source: &str, rewrite: &str) -> bool {
    if !kopt::gpu::nvrtc_present() {
        return false;
    }
    let compiles = |s: &str| kopt::compile_ptx("heuristic", "rewrite", s, &[], (9, 0)).is_ok();
    compiles(source) && !compiles(rewrite)
}

/// Adds `__launch_bounds__(threads)` after `__global__` on the entry's definition.
pub fn add_launch_bounds(source: &str, entry: &str, threads: u32) -> Option<String> {
    let at = source.find(&format!("{entry}("))?;
    let g = source[..at].rfind("__global__")?;
    if source[g..at].contains("__launch_bounds__") {
        return None;
    }
    let after = g + "__global__".len();
    Some(format!(
        "{} __launch_bounds__({threads}){}",
        &source[..after],
        &source[after..]
    ))
}

/// `#pragma unroll N` before each `for` of the source without that pragma (the entry and
/// the device functions it calls; unrolling never changes results). Only a `for` that is
/// code (not in a macro's body, a comment or a string) and begins its line gets one, so
/// the pragma stands on a line of its own.
pub fn unroll_loops(source: &str, _entry: &str, factor: u32) -> Option<String> {
    let loops: Vec<usize> = kopt_spec::source::code_tokens(source)
        .iter()
        .filter(|t| t.text == "for" && t.starts_line)
        .map(|t| t.start)
        .collect();
    let mut out = String::with_capacity(source.len());
    let mut changed = false;
    let mut last = 0;
    for at in loops {
        let line_start = source[..at].rfind('\n').map_or(0, |i| i + 1);
        let indent = &source[line_start..at];
        // The line before: an existing pragma is kept if it has this factor, else replaced.
        let before = &source[last..line_start];
        let prev_start = before
            .trim_end_matches('\n')
            .rfind('\n')
            .map_or(0, |i| i + 1);
        let previous = before[prev_start..].trim_end_matches('\n');
        if previous.trim_start().starts_with("#pragma unroll") {
            if previous.trim() == format!("#pragma unroll {factor}") {
                continue;
            }
            out.push_str(&before[..prev_start]);
        } else {
            out.push_str(before);
        }
        out.push_str(&format!("{indent}#pragma unroll {factor}\n"));
        changed = true;
        last = line_start;
    }
    out.push_str(&source[last..]);
    changed.then_some(out)
}

/// The constant block size of a launch rule text `256, 1, 1`, if it is constant.
fn constant_threads(prompt: &str) -> Option<u32> {
    let at = prompt.find("block (")? + 7;
    let end = at + prompt[at..].find(')')?;
    prompt[at..end]
        .split(',')
        .map(|d| d.trim().parse::<u32>().ok())
        .try_fold(1u32, |acc, d| d.map(|d| acc * d))
}

/// The kernel's tunables as the context lists them:
/// `- tunables: NAME (default D, values [a, b]); ...` (`none` when there are none).
fn tunables(prompt: &str) -> Vec<(String, i64, Vec<i64>)> {
    let Some(line) = prompt.lines().find_map(|l| l.strip_prefix("- tunables: ")) else {
        return vec![];
    };
    line.split("; ")
        .filter_map(|t| {
            let (name, rest) = t.split_once(" (default ")?;
            let (default, rest) = rest.split_once(", values [")?;
            let values = rest.strip_suffix("])")?;
            Some((
                name.trim().to_string(),
                default.trim().parse().ok()?,
                values
                    .split(',')
                    .map(|v| v.trim().parse().ok())
                    .collect::<Option<Vec<i64>>>()?,
            ))
        })
        .collect()
}

/// Each tunable's default and its neighbour in its list of values, in declared order while
/// the number of combinations stays within [`EXHAUSTIVE_MATRIX_POINTS`].
fn neighbour_matrix(tunables: &[(String, i64, Vec<i64>)]) -> BTreeMap<String, Vec<i64>> {
    let mut matrix = BTreeMap::new();
    let mut points = 1;
    for (name, default, values) in tunables {
        let Some(i) = values.iter().position(|v| v == default) else {
            continue;
        };
        let neighbour = values
            .get(i + 1)
            .or(i.checked_sub(1).and_then(|j| values.get(j)));
        let Some(&neighbour) = neighbour else {
            continue;
        };
        if points * 2 > EXHAUSTIVE_MATRIX_POINTS {
            break;
        }
        points *= 2;
        let mut pair = vec![*default, neighbour];
        pair.sort_unstable();
        matrix.insert(name.clone(), pair);
    }
    matrix
}

impl Backend for Heuristic {
    fn name(&self) -> String {
        "heuristic".into()
    }

    fn complete(&mut self, req: &ChatRequest) -> Result<ChatResponse, BackendError> {
        let prompt = req
            .messages
            .first()
            .map(|m| m.content.as_str())
            .unwrap_or("");
        let source = section(prompt, "## Source of the current best")
            .and_then(code_block)
            .ok_or_else(|| {
                BackendError::Fatal("the heuristic agent found no source in the context".into())
            })?;
        let evidence: Vec<String> = section(prompt, "## Current figures")
            .map(|s| {
                s.lines()
                    .filter_map(|l| l.strip_prefix("- "))
                    .map(String::from)
                    .collect()
            })
            .filter(|v: &Vec<String>| !v.is_empty())
            .unwrap_or_else(|| {
                vec!["no figures yet: a mechanical rewrite that cannot change results".into()]
            });
        loop {
            self.step += 1;
            let (candidate, changes, expected): (Option<String>, Vec<(&str, &str)>, &str) =
                match self.step {
                    1 => {
                        let mut s = add_restrict(&source, &self.entry);
                        let mut changes = vec![];
                        if s.is_some() {
                            changes.push(("`__restrict__` on the pointer parameters", "the compiler may keep loaded values in registers and use the read-only path, since kopt's buffers never alias"));
                        }
                        if let Some(t) = constant_threads(prompt) {
                            if let Some(b) =
                                add_launch_bounds(s.as_deref().unwrap_or(&source), &self.entry, t)
                            {
                                s = Some(b);
                                changes.push(("`__launch_bounds__` with the launch's block size", "the register allocator plans for the block size actually launched, which can raise occupancy"));
                            }
                        }
                        (
                            s,
                            changes,
                            "fewer instructions per load; occupancy unchanged or higher",
                        )
                    }
                    2 => (
                        unroll_loops(&source, &self.entry, 4),
                        vec![(
                            "`#pragma unroll 4` on the loops",
                            "more independent loads in flight per thread hide memory latency",
                        )],
                        "more bytes in flight; the same results",
                    ),
                    3 => (
                        unroll_loops(&source, &self.entry, 8),
                        vec![(
                            "`#pragma unroll 8` on the loops",
                            "a deeper unroll for loops with long trip counts",
                        )],
                        "more bytes in flight; register use may rise",
                    ),
                    _ => {
                        return Err(BackendError::Exhausted(
                            "the heuristic agent has no further rewrite to propose".into(),
                        ))
                    }
                };
            let Some(candidate) = candidate else { continue };
            if breaks_compile(&source, &candidate) {
                // A rewrite that NVRTC refuses where the source compiles never reaches
                // the GPU: the next step is tried instead.
                continue;
            }
            let matrix = neighbour_matrix(&tunables(prompt));
            let mut changes = changes;
            if !matrix.is_empty() {
                changes.push((
                    "a parameter matrix over the declared tunables: each one's default and its next value",
                    "the defaults are a guess about this device too; the loop verifies and times their neighbours around the rewrite",
                ));
            }
            let mut proposal = serde_json::json!({ "proposals": [{
                "diagnosis": {
                    "bottleneck": "unknown (no model: mechanical rewrites)",
                    "summary": format!("Heuristic step {}: {}", self.step, changes.iter().map(|c| c.0).collect::<Vec<_>>().join(" and ")),
                    "evidence": evidence,
                },
                "changes": changes.iter().map(|(w, y)| serde_json::json!({ "what": w, "why": y })).collect::<Vec<_>>(),
                "risks": ["a different register allocation could spill; the watchdog and the figures cover it"],
                "expected": [{ "metric": "time", "change": expected }],
                "candidate": { "source": candidate },
            }]});
            if !matrix.is_empty() {
                proposal["proposals"][0]["matrix"] = serde_json::json!(matrix);
            }
            return Ok(ChatResponse {
                text: proposal.to_string(),
                usage: Usage::default(),
                model: "heuristic".into(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: &str = "extern \"C\" __global__ void k(const float* x, float *y, unsigned int n) {\n    for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {\n        y[i] = x[i];\n    }\n}\n";

    #[test]
    fn rewrites_touch_code_only_and_keep_tokens_apart() {
        // `float *src` must not become `__restrict__src`; a macro's body and a comment are
        // not rewritten; the pragma never lands inside a `#define ... \\` body.
        let src = "// for (int i = 0; i < n; ++i) in a comment\n#define LOOP(N) \\\n  for (int j = 0; j < N; ++j) { }\nextern \"C\" __global__ void k(const float *src, float *dst, int n /* float *x */) {\n  for (int i = 0; i < n; ++i) dst[i] = src[i];\n}\n";
        let r = add_restrict(src, "k").unwrap();
        assert!(
            r.contains(
                "const float * __restrict__ src, float * __restrict__ dst, int n /* float *x */"
            ),
            "{r}"
        );
        assert!(r.starts_with("// for (int i"), "{r}");
        let u = unroll_loops(src, "k", 4).unwrap();
        assert_eq!(u.matches("#pragma unroll 4").count(), 1, "{u}");
        assert!(
            u.contains("#pragma unroll 4\n  for (int i = 0; i < n; ++i) dst"),
            "{u}"
        );
        assert!(u.contains("#define LOOP(N) \\\n  for (int j"), "{u}");
        // A macro-made entry has no written-out definition to rewrite.
        let made =
            "#define OP(NAME) extern \"C\" __global__ void NAME(float *y) { y[0] = 1; }\nOP(k)\n";
        assert!(add_restrict(made, "k").is_none());
        // A `for` after other code on its line is left alone.
        assert!(unroll_loops("void f() { int i; for (i = 0; i < 4; ++i) {} }\n", "f", 4).is_none());
    }

    #[test]
    fn a_rewrite_nvrtc_refuses_is_told_from_one_it_compiles() {
        if !kopt::gpu::nvrtc_for_test() {
            return;
        }
        let r = add_restrict(K, "k").unwrap();
        assert!(!breaks_compile(K, &r), "{r}");
        // What the old text rewrite made of `float *y`: one identifier `__restrict__y`.
        let broken = K.replace("float *y", "float * __restrict__y");
        assert!(breaks_compile(K, &broken));
    }

    #[test]
    fn rewrites() {
        let r = add_restrict(K, "k").unwrap();
        assert!(
            r.contains("const float* __restrict__ x, float * __restrict__ y"),
            "{r}"
        );
        assert!(add_restrict(&r, "k").is_none(), "idempotent");
        let b = add_launch_bounds(&r, "k", 256).unwrap();
        assert!(b.contains("__global__ __launch_bounds__(256) void k("));
        assert!(add_launch_bounds(&b, "k", 256).is_none());
        let u = unroll_loops(K, "k", 4).unwrap();
        assert!(
            u.contains("    #pragma unroll 4\n    for (unsigned i"),
            "{u}"
        );
        let u8 = unroll_loops(&u, "k", 8).unwrap();
        assert!(
            u8.contains("#pragma unroll 8\n    for") && !u8.contains("unroll 4"),
            "{u8}"
        );
        assert!(unroll_loops(&u8, "k", 8).is_none());
    }

    #[test]
    fn a_matrix_of_each_tunables_default_and_its_neighbour() {
        let prompt = "- tunables: BLOCK (default 256, values [32, 64, 128, 256, 512, 1024]); VEC (default 8, values [1, 2, 4, 8]); ROWS (default 1, values [1, 2]); UNROLL (default 1, values [1, 2, 4]); EXTRA (default 3, values [3, 5])\n";
        let t = tunables(prompt);
        assert_eq!(t.len(), 5);
        assert_eq!(t[1], ("VEC".to_string(), 8, vec![1, 2, 4, 8]));
        let m = neighbour_matrix(&t);
        // 2 x 2 x 2 x 2 = 16 points: the fifth tunable would exceed the cap.
        assert_eq!(
            m,
            BTreeMap::from([
                ("BLOCK".to_string(), vec![256, 512]),
                ("VEC".to_string(), vec![4, 8]),
                ("ROWS".to_string(), vec![1, 2]),
                ("UNROLL".to_string(), vec![1, 2]),
            ])
        );
        assert!(tunables("- tunables: none\n").is_empty());
        assert!(neighbour_matrix(&[("ONE".into(), 4, vec![4])]).is_empty());
    }

    #[test]
    fn reads_the_context_and_proposes_step_by_step() {
        let prompt = format!("## Summary\n- launch rule of the current best: grid (n, 1, 1), block (256, 1, 1), dynamic shared memory 0 bytes\n\n## Current figures\n- n=1024: 3.2 µs\n\n## Source of the current best\n\n```cuda\n{K}```\n");
        let req = ChatRequest {
            purpose: "propose".into(),
            system: String::new(),
            messages: vec![crate::chat::Message::user(prompt)],
            max_tokens: 1,
            temperature: 0.0,
        };
        let mut h = Heuristic::new("k");
        let spec_item = kopt_spec::spec::parse_item(
            "fn k(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: u32);"
                .parse()
                .unwrap(),
        )
        .unwrap();
        let spec = kopt_spec::spec::parse_kernel(
            "reference = \"k.cu\", x: [n], y: [n], grid = n, block = 256, shapes = [{ n: 1024 }]"
                .parse()
                .unwrap(),
            &spec_item,
        )
        .unwrap()
        .0;
        let first = crate::proposal::parse(&h.complete(&req).unwrap().text, &spec, K).unwrap();
        assert!(
            first[0].source.contains("__launch_bounds__(256)")
                && first[0].source.contains("__restrict__")
        );
        assert_eq!(first[0].proposal.diagnosis.evidence, vec!["n=1024: 3.2 µs"]);
        let second = crate::proposal::parse(&h.complete(&req).unwrap().text, &spec, K).unwrap();
        assert!(second[0].source.contains("#pragma unroll 4"));
        h.complete(&req).unwrap();
        assert!(
            matches!(h.complete(&req), Err(BackendError::Exhausted(_))),
            "no fourth step"
        );
    }
}
