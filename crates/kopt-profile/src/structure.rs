//! Collector (d): a structural summary of a kernel's CUDA source, for the snapshot and for
//! the agent's context: the loops (with their trip count per thread for the profiled
//! launch, where it is fixed), the memory each function touches by space (global buffers
//! and how many loops read them, shared arrays and how they are indexed, local arrays),
//! atomics, and synchronisation.
//!
//! Like [`kopt_store::features`] (whose comment stripping and one-line summary it reuses),
//! it is lexical: tokens, braces and a few patterns, not a C++ parser. It follows the entry
//! point and the `__device__` functions it calls (by name, templates included). An entry
//! that is not written out but made by a function-like macro (`#define SOFTMAX_OP(T, NAME)
//! extern "C" __global__ void NAME(...) {...}` then `SOFTMAX_OP(float, softmax_f32)`) is
//! read from the invocation that makes it, expanded as the preprocessor would (parameters
//! substituted, `##` pasted, nested macros rescanned); what the expansion holds reports the
//! invocation's line, where that entry is instantiated. Trip counts
//! come from a small integer evaluator over the shape's scalars, the version's defines,
//! `#define`d integers, `const` locals, and the launch geometry (`blockDim.x`,
//! `gridDim.x`; `threadIdx` and `blockIdx` taken as 0, so a count is the busiest thread's).
//! Anything it cannot read is left out rather than guessed.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// What the trip counts are evaluated with.
#[derive(Debug, Clone, Default)]
pub struct Env {
    /// Shape scalars, the version's defines (integers).
    pub values: BTreeMap<String, i64>,
    pub block: [u32; 3],
    pub grid: [u32; 3],
    /// Dynamic shared memory of the launch, bytes.
    pub smem: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Loop {
    pub function: String,
    /// `file:line` in the original sources (from the `#line` markers).
    pub at: String,
    /// `for`, `while` or `do`.
    pub kind: String,
    /// `block-stride` (threads of a block share the iterations), `grid-stride`,
    /// `sequential` (every thread runs all of them), `halving`, `doubling`, `other`.
    pub pattern: String,
    /// The loop's condition as written, compacted.
    pub condition: String,
    /// Iterations per thread for the profiled launch, when fixed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trips: Option<u64>,
    /// Iterations per thread including the enclosing loops'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_trips: Option<u64>,
    /// Loops around it in the same function.
    pub depth: u32,
    /// Global buffers read and written in its body (by the kernel's parameter names).
    pub reads: Vec<String>,
    pub writes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BufferUse {
    /// The kernel's pointer parameter.
    pub name: String,
    /// The element type accessed (through an alias such as `reinterpret_cast<const
    /// float4*>` when there is one).
    pub element: String,
    /// Element size in bits, when the type is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bits: Option<u32>,
    /// Indexing sites (static).
    pub reads: usize,
    pub writes: usize,
    /// Loops not nested in another loop of their function whose body reads it: passes
    /// over the data.
    pub read_passes: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharedArray {
    pub function: String,
    pub name: String,
    pub element: String,
    /// As declared (`32`, `HEAD_DIM`); empty for `extern __shared__` (dynamic).
    pub size: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    pub dynamic: bool,
    pub reads: usize,
    pub writes: usize,
    /// Index expressions, distinct, as written (at most 6).
    pub indices: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocalArray {
    pub function: String,
    pub name: String,
    pub element: String,
    pub size: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AtomicUse {
    pub function: String,
    pub op: String,
    /// What it updates: a global buffer, a shared array, or the expression.
    pub target: String,
    /// `global`, `shared` or `unknown`.
    pub space: String,
    /// Inside a loop.
    pub in_loop: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sync {
    pub syncthreads: usize,
    pub syncwarp: usize,
    pub shuffles: usize,
    pub fences: usize,
}

/// The structural summary of one entry point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Structure {
    pub entry: String,
    /// The entry, then the functions it calls, in the order found.
    pub functions: Vec<String>,
    /// The case library's one-line summary ([`kopt_store::features::structural_summary`])
    /// of the functions followed (the text of [`Structure::functions`]), not of the whole
    /// translation unit, which may define other entries.
    pub summary: String,
    pub loops: Vec<Loop>,
    pub buffers: Vec<BufferUse>,
    pub shared: Vec<SharedArray>,
    pub local_arrays: Vec<LocalArray>,
    pub atomics: Vec<AtomicUse>,
    /// Static counts in the functions followed.
    pub sync: Sync,
}

impl Structure {
    /// The most passes any buffer is read in, and that buffer.
    pub fn max_read_passes(&self) -> Option<(&str, usize)> {
        self.buffers
            .iter()
            .filter(|b| b.read_passes > 0)
            .max_by(|a, b| a.read_passes.cmp(&b.read_passes).then(b.name.cmp(&a.name)))
            .map(|b| (b.name.as_str(), b.read_passes))
    }

    /// The sequential loop (every thread runs all of its iterations) with the most
    /// iterations per thread that reads global memory.
    pub fn longest_serial_loop(&self) -> Option<&Loop> {
        self.loops
            .iter()
            .filter(|l| l.pattern == "sequential" && !l.reads.is_empty())
            .filter(|l| l.trips.is_some())
            .max_by_key(|l| l.trips)
    }

    /// A few lines for people and agents.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let loops: Vec<String> = self
            .loops
            .iter()
            .map(|l| {
                let trips = match (l.trips, l.total_trips) {
                    (Some(t), Some(tt)) if tt != t => {
                        format!(", {t}/thread ({tt} with outer loops)")
                    }
                    (Some(t), _) => format!(", {t}/thread"),
                    _ => String::new(),
                };
                let mem = if l.reads.is_empty() && l.writes.is_empty() {
                    String::new()
                } else {
                    let mut v = Vec::new();
                    if !l.reads.is_empty() {
                        v.push(format!("reads {}", l.reads.join(", ")));
                    }
                    if !l.writes.is_empty() {
                        v.push(format!("writes {}", l.writes.join(", ")));
                    }
                    format!("; {}", v.join(", "))
                };
                format!(
                    "{}{} `{}` {}{trips}{mem} ({})",
                    "  ".repeat(l.depth as usize),
                    l.pattern,
                    l.condition,
                    l.function,
                    l.at
                )
            })
            .collect();
        if loops.is_empty() {
            out.push("loops: none".to_string());
        } else {
            out.push(format!("loops ({}):", loops.len()));
            out.extend(loops.into_iter().map(|l| format!("  {l}")));
        }
        for b in &self.buffers {
            let bits = b.bits.map(|b| format!(", {b}-bit")).unwrap_or_default();
            out.push(format!(
                "global `{}` ({}{bits}): {} read site(s) in {} pass(es), {} write site(s)",
                b.name, b.element, b.reads, b.read_passes, b.writes
            ));
        }
        for s in &self.shared {
            out.push(format!(
                "shared `{}` {}[{}]{} in {}: {} read(s), {} write(s), indexed by {}",
                s.name,
                s.element,
                if s.dynamic { "dynamic" } else { &s.size },
                s.bytes.map(|b| format!(" = {b} bytes")).unwrap_or_default(),
                s.function,
                s.reads,
                s.writes,
                if s.indices.is_empty() {
                    "-".to_string()
                } else {
                    s.indices.join(" | ")
                }
            ));
        }
        for l in &self.local_arrays {
            out.push(format!(
                "local array `{}` {}[{}] in {}",
                l.name, l.element, l.size, l.function
            ));
        }
        if self.atomics.is_empty() {
            out.push("atomics: none".into());
        }
        for a in &self.atomics {
            out.push(format!(
                "atomic {} on {} ({}){} in {}",
                a.op,
                a.target,
                a.space,
                if a.in_loop { " inside a loop" } else { "" },
                a.function
            ));
        }
        out.push(format!(
            "synchronisation: {} __syncthreads, {} __syncwarp, {} shuffles, {} fences",
            self.sync.syncthreads, self.sync.syncwarp, self.sync.shuffles, self.sync.fences
        ));
        out.join("\n")
    }
}

// ---------------------------------------------------------------------------------------
// Tokens.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Ident,
    Number,
    Punct,
}

#[derive(Debug, Clone)]
struct Tok {
    text: String,
    kind: Kind,
    /// Index into the line map.
    line: usize,
}

const PUNCT3: [&str; 2] = ["<<=", ">>="];
/// `##` only occurs in macro bodies (directives are blanked from the code).
const PUNCT2: [&str; 20] = [
    "==", "!=", "<=", ">=", "+=", "-=", "*=", "/=", "%=", "|=", "&=", "^=", "<<", ">>", "++", "--",
    "->", "&&", "||", "##",
];

fn tokenize(code: &str) -> Vec<Tok> {
    let mut toks = Vec::new();
    for (line, text) in code.lines().enumerate() {
        let chars: Vec<char> = text.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if c.is_whitespace() {
                i += 1;
            } else if c.is_ascii_alphabetic() || c == '_' {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                toks.push(Tok {
                    text: chars[start..i].iter().collect(),
                    kind: Kind::Ident,
                    line,
                });
            } else if c.is_ascii_digit()
                || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
            {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric()
                        || chars[i] == '.'
                        || ((chars[i] == '+' || chars[i] == '-')
                            && matches!(chars[i - 1], 'e' | 'E')
                            && !chars[start..i].iter().any(|c| *c == 'x' || *c == 'X')))
                {
                    i += 1;
                }
                toks.push(Tok {
                    text: chars[start..i].iter().collect(),
                    kind: Kind::Number,
                    line,
                });
            } else {
                let rest: String = chars[i..chars.len().min(i + 3)].iter().collect();
                let p = PUNCT3
                    .iter()
                    .chain(PUNCT2.iter())
                    .find(|p| rest.starts_with(*p))
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| c.to_string());
                i += p.chars().count();
                toks.push(Tok {
                    text: p,
                    kind: Kind::Punct,
                    line,
                });
            }
        }
    }
    toks
}

/// A function-like macro, `#define NAME(params) body` with its continuation lines joined.
#[derive(Debug, Clone)]
struct Macro {
    params: Vec<String>,
    /// The last parameter is `...` (`__VA_ARGS__`).
    variadic: bool,
    body: Vec<Tok>,
}

/// The source as the tokenizer sees it.
struct Prepared {
    /// The source's lines with comments, string contents and preprocessor directives
    /// (continuation lines included) blanked: as many lines as the source.
    code: String,
    /// The `file:line` of each line (from the `#line` markers).
    at: Vec<String>,
    /// The `#define`s of one word.
    defines: BTreeMap<String, String>,
    /// The function-like macros, by name.
    macros: BTreeMap<String, Macro>,
}

fn preprocess(source: &str) -> Prepared {
    // Line numbers first, from the raw text (comment stripping blanks the file names).
    let mut at = Vec::new();
    let (mut file, mut line) = ("source".to_string(), 1usize);
    for text in source.lines() {
        let t = text.trim_start();
        if let Some(marker) = t
            .strip_prefix('#')
            .map(str::trim_start)
            .and_then(|r| r.strip_prefix("line"))
        {
            let mut words = marker.split_whitespace();
            if let Some(n) = words.next().and_then(|n| n.parse::<usize>().ok()) {
                line = n;
                if let Some(f) = words.next() {
                    file = f.trim_matches('"').to_string();
                }
                at.push(String::new());
                continue;
            }
        }
        at.push(format!("{file}:{line}"));
        line += 1;
    }
    let code = kopt_spec::source::strip_comments(source);
    let lines: Vec<&str> = code.lines().collect();
    let mut out = String::with_capacity(code.len());
    let mut defines = BTreeMap::new();
    let mut macros = BTreeMap::new();
    let mut k = 0;
    while k < lines.len() {
        let Some(rest) = lines[k].trim_start().strip_prefix('#') else {
            out.push_str(lines[k]);
            out.push('\n');
            k += 1;
            continue;
        };
        // A directive and its continuation lines, joined; every line of it blanked.
        let mut directive = String::new();
        let mut part = rest;
        loop {
            out.push('\n');
            k += 1;
            match part.trim_end().strip_suffix('\\') {
                Some(head) if k < lines.len() => {
                    directive.push_str(head);
                    directive.push(' ');
                    part = lines[k];
                }
                _ => {
                    directive.push_str(part.trim_end().trim_end_matches('\\'));
                    break;
                }
            }
        }
        define(&directive, &mut defines, &mut macros);
    }
    Prepared {
        code: out,
        at,
        defines,
        macros,
    }
}

/// Records a `define` directive (the text after `#`): a one-word value, or a
/// function-like macro.
fn define(
    directive: &str,
    defines: &mut BTreeMap<String, String>,
    macros: &mut BTreeMap<String, Macro>,
) {
    let Some(d) = directive.trim_start().strip_prefix("define") else {
        return;
    };
    if !d.starts_with(char::is_whitespace) {
        return;
    }
    let d = d.trim_start();
    let end = d
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(d.len());
    let (name, rest) = d.split_at(end);
    if name.is_empty() {
        return;
    }
    // `NAME(` with no space between: function-like.
    if let Some(p) = rest.strip_prefix('(') {
        let Some(close) = p.find(')') else {
            return;
        };
        let mut params: Vec<String> = p[..close]
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        let variadic = params.last().is_some_and(|p| p == "...");
        if variadic {
            params.pop();
        }
        macros.insert(
            name.to_string(),
            Macro {
                params,
                variadic,
                body: tokenize(&p[close + 1..]),
            },
        );
        return;
    }
    let mut words = rest.split_whitespace();
    if let (Some(value), None) = (words.next(), words.next()) {
        defines.insert(name.to_string(), value.to_string());
    }
}

// ---------------------------------------------------------------------------------------
// Macro-made functions.

/// The arguments of the invocation whose `(` and `)` are `open` and `close`: split at
/// the commas outside parentheses (the preprocessor's rule: brackets and braces do not
/// protect a comma).
fn macro_args(toks: &[Tok], open: usize, close: usize) -> Vec<Vec<Tok>> {
    let mut args = vec![Vec::new()];
    let mut depth = 0;
    for t in &toks[open + 1..close] {
        match t.text.as_str() {
            "(" => depth += 1,
            ")" => depth -= 1,
            "," if depth == 0 => {
                args.push(Vec::new());
                continue;
            }
            _ => {}
        }
        args.last_mut()
            .expect("one argument at least")
            .push(t.clone());
    }
    args
}

/// `m`'s body with `args` substituted: a parameter becomes its argument as written,
/// `#param` an empty string literal (string contents are blanked everywhere else too),
/// and `a ## b` one token.
fn substitute(m: &Macro, args: &[Vec<Tok>]) -> Vec<Tok> {
    let arg = |name: &str| -> Option<Vec<Tok>> {
        if let Some(k) = m.params.iter().position(|p| p == name) {
            return Some(args.get(k).cloned().unwrap_or_default());
        }
        if m.variadic && name == "__VA_ARGS__" {
            let mut v = Vec::new();
            for (k, a) in args.iter().enumerate().skip(m.params.len()) {
                if k > m.params.len() {
                    v.push(Tok {
                        text: ",".into(),
                        kind: Kind::Punct,
                        line: 0,
                    });
                }
                v.extend(a.iter().cloned());
            }
            return Some(v);
        }
        None
    };
    // An empty argument next to `##` leaves a placemarker (an empty token), so that the
    // paste does not reach the token before it.
    let placemarker = || Tok {
        text: String::new(),
        kind: Kind::Punct,
        line: 0,
    };
    let body = &m.body;
    let mut out: Vec<Tok> = Vec::new();
    let mut k = 0;
    while k < body.len() {
        let t = &body[k];
        if t.text == "#" && body.get(k + 1).is_some_and(|n| arg(&n.text).is_some()) {
            for _ in 0..2 {
                out.push(Tok {
                    text: "\"".into(),
                    kind: Kind::Punct,
                    line: 0,
                });
            }
            k += 2;
            continue;
        }
        if t.text == "##" {
            let right = match body.get(k + 1) {
                Some(n) => arg(&n.text).unwrap_or_else(|| vec![n.clone()]),
                None => Vec::new(),
            };
            k += 2;
            let mut right = right.into_iter();
            match (out.pop(), right.next()) {
                (Some(l), Some(r)) => {
                    let pasted = tokenize(&format!("{}{}", l.text, r.text));
                    if pasted.is_empty() {
                        out.push(placemarker());
                    }
                    out.extend(pasted);
                }
                (Some(l), None) => out.push(l),
                (None, Some(r)) => out.push(r),
                (None, None) => {}
            }
            out.extend(right);
            continue;
        }
        match arg(&t.text) {
            Some(a) if a.is_empty() => {
                let pasted = body.get(k + 1).is_some_and(|n| n.text == "##")
                    || (k > 0 && body[k - 1].text == "##");
                if pasted {
                    out.push(placemarker());
                }
            }
            Some(a) => out.extend(a),
            None => out.push(t.clone()),
        }
        k += 1;
    }
    out.retain(|t| !t.text.is_empty());
    out
}

/// `toks` with the function-like macro invocations expanded, the result of each rescanned
/// for more; a macro is not expanded inside its own expansion (`active`), as in C.
fn expand(toks: &[Tok], macros: &BTreeMap<String, Macro>, active: &mut Vec<String>) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let t = &toks[i];
        if let Some(m) = macros
            .get(&t.text)
            .filter(|_| t.kind == Kind::Ident && !active.contains(&t.text) && active.len() < 32)
        {
            if toks.get(i + 1).is_some_and(|n| n.text == "(") {
                let close = matching(toks, i + 1);
                if toks[close].text == ")" {
                    let body = substitute(m, &macro_args(toks, i + 1, close));
                    active.push(t.text.clone());
                    out.extend(expand(&body, macros, active));
                    active.pop();
                    i = close + 1;
                    continue;
                }
            }
        }
        out.push(t.clone());
        i += 1;
    }
    out
}

/// The function-like macro invocation outside every function body that defines `entry`
/// when expanded: its first and last token, and the expansion, every token of it placed
/// on the invocation's line (so a loop written in the macro reports where the entry is
/// instantiated, as a compiler reports an error in an expansion). A macro that makes only
/// the signature (`KERNEL(name) { ... }`) counts, with the body written after it.
fn generating_invocation(
    toks: &[Tok],
    funcs: &[Function],
    macros: &BTreeMap<String, Macro>,
    entry: &str,
) -> Option<(usize, usize, Vec<Tok>)> {
    if macros.is_empty() {
        return None;
    }
    let in_body = |i: usize| funcs.iter().any(|f| f.body.0 < i && i < f.body.1);
    for i in 0..toks.len().saturating_sub(1) {
        if toks[i].kind != Kind::Ident
            || !macros.contains_key(&toks[i].text)
            || toks[i + 1].text != "("
            || in_body(i)
        {
            continue;
        }
        let close = matching(toks, i + 1);
        if toks[close].text != ")" {
            continue;
        }
        let mut expansion = expand(&toks[i..=close], macros, &mut Vec::new());
        for t in &mut expansion {
            t.line = toks[i].line;
        }
        let mut probe = expansion.clone();
        if toks.get(close + 1).is_some_and(|t| t.text == "{") {
            probe.extend_from_slice(&toks[close + 1..=matching(toks, close + 1)]);
        }
        if functions(&probe).iter().any(|f| f.name == entry) {
            return Some((i, close, expansion));
        }
    }
    None
}

// ---------------------------------------------------------------------------------------
// Functions.

#[derive(Debug, Clone)]
struct Function {
    name: String,
    /// The first token of its declaration (`template`, `extern`, qualifiers).
    start: usize,
    /// Token indices of the parameter list's `(` and `)`, and the body's `{` and `}`.
    params: (usize, usize),
    body: (usize, usize),
}

fn matching(toks: &[Tok], open: usize) -> usize {
    let (o, c) = match toks[open].text.as_str() {
        "(" => ("(", ")"),
        "[" => ("[", "]"),
        "{" => ("{", "}"),
        _ => return open,
    };
    let mut depth = 0i32;
    for (i, t) in toks.iter().enumerate().skip(open) {
        if t.text == o {
            depth += 1;
        } else if t.text == c {
            depth -= 1;
            if depth == 0 {
                return i;
            }
        }
    }
    toks.len() - 1
}

fn matching_back(toks: &[Tok], close: usize) -> Option<usize> {
    let (o, c) = match toks[close].text.as_str() {
        ")" => ("(", ")"),
        "]" => ("[", "]"),
        _ => return None,
    };
    let mut depth = 0i32;
    for i in (0..=close).rev() {
        if toks[i].text == c {
            depth += 1;
        } else if toks[i].text == o {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

/// The function definitions outside function bodies: at file scope, and inside
/// namespaces, `extern "C" { ... }` blocks and class bodies.
fn functions(toks: &[Tok]) -> Vec<Function> {
    let mut out = Vec::new();
    let mut i = 0;
    // Where the declaration being read began: after the last `;`, `{` or `}` met here.
    let mut start = 0;
    while i < toks.len() {
        match toks[i].text.as_str() {
            "{" => {
                let close = matching(toks, i);
                // `name ( params ) [const|noexcept...] {`
                let mut j = i;
                while j > 0
                    && matches!(
                        toks[j - 1].text.as_str(),
                        "const" | "noexcept" | "override" | "final"
                    )
                {
                    j -= 1;
                }
                let mut found = None;
                if j > 0 && toks[j - 1].text == ")" {
                    if let Some(open) = matching_back(toks, j - 1) {
                        if open > 0
                            && toks[open - 1].kind == Kind::Ident
                            && !is_keyword(&toks[open - 1].text)
                        {
                            found = Some(Function {
                                name: toks[open - 1].text.clone(),
                                start: start.min(open - 1),
                                params: (open, j - 1),
                                body: (i, close),
                            });
                        }
                    }
                }
                if let Some(f) = found {
                    out.push(f);
                    i = close + 1;
                } else {
                    // Not a function's body: a namespace, a linkage block, a class, an
                    // initialiser; what it holds is read as declarations.
                    i += 1;
                }
                start = i;
            }
            ";" | "}" => {
                i += 1;
                start = i;
            }
            _ => i += 1,
        }
    }
    out
}

fn is_keyword(w: &str) -> bool {
    matches!(
        w,
        "if" | "for"
            | "while"
            | "switch"
            | "return"
            | "else"
            | "do"
            | "case"
            | "sizeof"
            | "__launch_bounds__"
            | "catch"
            | "goto"
            | "new"
            | "delete"
            | "throw"
            | "typename"
            | "template"
            | "operator"
            | "static_assert"
            | "alignas"
            | "decltype"
    )
}

const TYPE_WORDS: &[&str] = &[
    "const",
    "volatile",
    "__restrict__",
    "restrict",
    "unsigned",
    "signed",
    "struct",
    "static",
    "__shared__",
    "extern",
    "register",
    "auto",
];

/// Element size in bits of a CUDA type name, when known.
fn type_bits(ty: &str) -> Option<u32> {
    Some(match ty {
        "char" | "int8_t" | "uint8_t" | "bool" => 8,
        "short" | "__half" | "half" | "__nv_bfloat16" | "nv_bfloat16" | "int16_t" | "uint16_t" => {
            16
        }
        "float" | "int" | "unsigned" | "uint32_t" | "int32_t" | "__half2" | "half2"
        | "__nv_bfloat162" => 32,
        "double" | "long" | "size_t" | "int64_t" | "uint64_t" | "float2" | "int2" | "uint2" => 64,
        "float4" | "int4" | "uint4" | "double2" | "longlong2" => 128,
        _ => return None,
    })
}

// ---------------------------------------------------------------------------------------
// Integer expressions.

struct Eval<'a> {
    toks: &'a [Tok],
    pos: usize,
    end: usize,
    lookup: &'a dyn Fn(&str) -> Option<i64>,
}

impl Eval<'_> {
    fn peek(&self) -> Option<&str> {
        (self.pos < self.end).then(|| self.toks[self.pos].text.as_str())
    }
    fn next(&mut self) -> Option<&Tok> {
        (self.pos < self.end).then(|| {
            self.pos += 1;
            &self.toks[self.pos - 1]
        })
    }
    fn binary(&mut self, level: usize) -> Option<i64> {
        const LEVELS: [&[&str]; 6] = [
            &["|"],
            &["^"],
            &["&"],
            &["<<", ">>"],
            &["+", "-"],
            &["*", "/", "%"],
        ];
        if level == LEVELS.len() {
            return self.unary();
        }
        let mut v = self.binary(level + 1)?;
        while let Some(op) = self
            .peek()
            .filter(|p| LEVELS[level].contains(p))
            .map(str::to_string)
        {
            self.pos += 1;
            let r = self.binary(level + 1)?;
            v = match op.as_str() {
                "|" => v | r,
                "^" => v ^ r,
                "&" => v & r,
                "<<" => v.checked_shl(u32::try_from(r).ok()?)?,
                ">>" => v.checked_shr(u32::try_from(r).ok()?)?,
                "+" => v.checked_add(r)?,
                "-" => v.checked_sub(r)?,
                "*" => v.checked_mul(r)?,
                "/" => v.checked_div(r)?,
                "%" => v.checked_rem(r)?,
                _ => return None,
            };
        }
        Some(v)
    }
    fn unary(&mut self) -> Option<i64> {
        match self.peek()? {
            "-" => {
                self.pos += 1;
                self.unary()?.checked_neg()
            }
            "+" => {
                self.pos += 1;
                self.unary()
            }
            "(" => {
                // A cast `(size_t)` / `(unsigned int)` is skipped; else a parenthesised
                // expression.
                let close = matching(self.toks, self.pos);
                let inner: Vec<&str> = self.toks[self.pos + 1..close]
                    .iter()
                    .map(|t| t.text.as_str())
                    .collect();
                let is_cast = !inner.is_empty()
                    && inner.iter().all(|w| {
                        TYPE_WORDS.contains(w)
                            || type_bits(w).is_some()
                            || matches!(*w, "int" | "long" | "unsigned" | "size_t" | "*")
                    });
                if is_cast {
                    self.pos = close + 1;
                    return self.unary();
                }
                let mut inner = Eval {
                    toks: self.toks,
                    pos: self.pos + 1,
                    end: close,
                    lookup: self.lookup,
                };
                let v = inner.binary(0)?;
                if inner.pos != close {
                    return None;
                }
                self.pos = close + 1;
                Some(v)
            }
            _ => {
                let t = self.next()?.clone();
                match t.kind {
                    Kind::Number => parse_int(&t.text),
                    Kind::Ident => {
                        // `blockDim.x`
                        if self.peek() == Some(".") {
                            self.pos += 1;
                            let field = self.next()?.text.clone();
                            return (self.lookup)(&format!("{}.{field}", t.text));
                        }
                        if matches!(t.text.as_str(), "min" | "max") && self.peek() == Some("(") {
                            return self.min_max(&t.text);
                        }
                        (self.lookup)(&t.text)
                    }
                    Kind::Punct => None,
                }
            }
        }
    }
    fn min_max(&mut self, f: &str) -> Option<i64> {
        let close = matching(self.toks, self.pos);
        let comma = (self.pos + 1..close).find(|&i| {
            self.toks[i].text == "," && depth_between(self.toks, self.pos + 1, i) == 0
        })?;
        let a = eval_range(self.toks, self.pos + 1, comma, self.lookup)?;
        let b = eval_range(self.toks, comma + 1, close, self.lookup)?;
        self.pos = close + 1;
        Some(if f == "min" { a.min(b) } else { a.max(b) })
    }
}

fn depth_between(toks: &[Tok], from: usize, to: usize) -> i32 {
    let mut d = 0;
    for t in &toks[from..to] {
        match t.text.as_str() {
            "(" | "[" => d += 1,
            ")" | "]" => d -= 1,
            _ => {}
        }
    }
    d
}

fn parse_int(s: &str) -> Option<i64> {
    let t = s.trim_end_matches(['u', 'U', 'l', 'L']);
    if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        return i64::from_str_radix(h, 16).ok();
    }
    t.parse::<i64>().ok()
}

fn eval_range(
    toks: &[Tok],
    from: usize,
    to: usize,
    lookup: &dyn Fn(&str) -> Option<i64>,
) -> Option<i64> {
    if from >= to {
        return None;
    }
    let mut e = Eval {
        toks,
        pos: from,
        end: to,
        lookup,
    };
    let v = e.binary(0)?;
    (e.pos == to).then_some(v)
}

fn text(toks: &[Tok], from: usize, to: usize) -> String {
    let mut s = String::new();
    for (k, t) in toks[from..to.min(toks.len())].iter().enumerate() {
        let prev = if k > 0 {
            Some(&toks[from + k - 1])
        } else {
            None
        };
        let glue = match prev {
            None => false,
            Some(p) => {
                matches!(
                    t.text.as_str(),
                    "." | "[" | "]" | ")" | "," | ";" | "++" | "--"
                ) || matches!(p.text.as_str(), "." | "[" | "(" | "!" | "~")
                    || (t.text == "(" && p.kind == Kind::Ident)
            }
        };
        if !s.is_empty() && !glue {
            s.push(' ');
        }
        s.push_str(&t.text);
    }
    s
}

/// The tokens `from..to` as text, a line for each line of the code they come from.
fn token_text(toks: &[Tok], from: usize, to: usize) -> String {
    let mut s = String::new();
    for (k, t) in toks[from..to.min(toks.len())].iter().enumerate() {
        if k > 0 {
            s.push(if toks[from + k - 1].line == t.line {
                ' '
            } else {
                '\n'
            });
        }
        s.push_str(&t.text);
    }
    s
}

// ---------------------------------------------------------------------------------------
// The analysis.

#[derive(Debug, Clone)]
enum Origin {
    Global(String),
    Shared(String),
}

struct Scope {
    /// Pointer or array name -> where it points, and the element type through it.
    names: BTreeMap<String, (Origin, String)>,
    /// `const` locals and bound parameters -> their expression's tokens (in `toks`).
    consts: BTreeMap<String, (usize, usize)>,
    /// Scalar parameters bound at the call site -> the caller's value.
    bound: BTreeMap<String, i64>,
    /// Token positions of array names in their declarations (not accesses).
    decls: BTreeSet<usize>,
}

impl Scope {
    fn new() -> Self {
        Scope {
            names: BTreeMap::new(),
            consts: BTreeMap::new(),
            bound: BTreeMap::new(),
            decls: BTreeSet::new(),
        }
    }
}

/// Summarises `entry` in `source` (amalgamated: includes inlined) for the launch `env`.
///
/// An entry made by a function-like macro (`SOFTMAX_OP(float, softmax_f32)` with
/// `#define SOFTMAX_OP(T, NAME) extern "C" __global__ void NAME(...) { ... }`) is read
/// from the one invocation that defines it, expanded in place; its tokens report the
/// invocation's line.
pub fn summarize(source: &str, entry: &str, env: &Env) -> Result<Structure, String> {
    let Prepared {
        code,
        at,
        defines: file_defines,
        macros,
    } = preprocess(source);
    let mut toks = tokenize(&code);
    let mut funcs = functions(&toks);
    if !funcs.iter().any(|f| f.name == entry) {
        if let Some((first, last, expansion)) = generating_invocation(&toks, &funcs, &macros, entry)
        {
            toks.splice(first..=last, expansion);
            funcs = functions(&toks);
        }
    }
    let toks = toks;
    let by_name: BTreeMap<&str, &Function> = funcs.iter().map(|f| (f.name.as_str(), f)).collect();
    let Some(entry_fn) = funcs.iter().find(|f| f.name == entry) else {
        return Err(format!(
            "no definition of `{entry}` in the source: neither written out nor made by a \
             function-like macro invoked outside a function (check the entry's name)"
        ));
    };
    let mut base: BTreeMap<String, i64> = BTreeMap::new();
    for (k, v) in &file_defines {
        if let Some(n) = parse_int(v) {
            base.insert(k.clone(), n);
        }
    }
    base.extend(env.values.iter().map(|(k, v)| (k.clone(), *v)));
    for (i, d) in ["x", "y", "z"].iter().enumerate() {
        base.insert(format!("blockDim.{d}"), env.block[i] as i64);
        base.insert(format!("gridDim.{d}"), env.grid[i] as i64);
        base.insert(format!("threadIdx.{d}"), 0);
        base.insert(format!("blockIdx.{d}"), 0);
    }
    base.insert("warpSize".into(), 32);

    let mut st = Structure {
        entry: entry.to_string(),
        functions: vec![],
        summary: String::new(),
        loops: vec![],
        buffers: vec![],
        shared: vec![],
        local_arrays: vec![],
        atomics: vec![],
        sync: Sync::default(),
    };
    // Entry first, then callees breadth-first, each analysed with its caller's bindings.
    let mut queue: Vec<(&Function, Scope)> = vec![(entry_fn, Scope::new())];
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut order: Vec<String> = Vec::new();
    let mut reached: Vec<&Function> = Vec::new();
    let mut buffers: BTreeMap<String, BufferUse> = BTreeMap::new();
    let mut buffer_order: Vec<String> = Vec::new();
    let mut qi = 0;
    while qi < queue.len() {
        let f = queue[qi].0;
        if !seen.insert(f.name.clone()) {
            qi += 1;
            continue;
        }
        order.push(f.name.clone());
        reached.push(f);
        let is_entry = f.name == entry;
        let mut scope = std::mem::replace(&mut queue[qi].1, Scope::new());
        // Parameters: pointers of the entry are global buffers.
        for (name, ty, pointer) in params(&toks, f.params) {
            if pointer && is_entry {
                scope
                    .names
                    .insert(name.clone(), (Origin::Global(name.clone()), ty.clone()));
                if !buffers.contains_key(&name) {
                    buffer_order.push(name.clone());
                    buffers.insert(
                        name.clone(),
                        BufferUse {
                            name: name.clone(),
                            bits: type_bits(&ty),
                            element: ty,
                            reads: 0,
                            writes: 0,
                            read_passes: 0,
                        },
                    );
                }
            }
        }
        let (b0, b1) = f.body;
        declarations(
            &toks,
            b0 + 1,
            b1,
            &mut scope,
            &f.name,
            &mut st,
            &base,
            env.smem,
        );
        // A buffer read through an alias of a wider type (`float4`) reports that type.
        for (origin, ty) in scope.names.values() {
            if let (Origin::Global(g), Some(bits)) = (origin, type_bits(ty)) {
                if let Some(b) = buffers.get_mut(g) {
                    if Some(bits) > b.bits {
                        b.bits = Some(bits);
                        b.element = ty.clone();
                    }
                }
            }
        }
        let value =
            |name: &str, scope: &Scope| -> Option<i64> { lookup(name, scope, &toks, &base, 0) };
        // Loops.
        let loops = loops_in(&toks, b0 + 1, b1);
        let mut loop_records: Vec<(usize, usize, Loop)> = Vec::new();
        for (kind, head, body) in &loops {
            let depth = loops
                .iter()
                .filter(|(_, _, ob)| ob.0 < body.0 && body.1 <= ob.1 && *ob != *body)
                .count() as u32;
            let (pattern, condition, trips) =
                classify_loop(&toks, kind, *head, &|n| value(n, &scope));
            loop_records.push((
                body.0,
                body.1,
                Loop {
                    function: f.name.clone(),
                    at: at.get(toks[head.0].line).cloned().unwrap_or_default(),
                    kind: kind.to_string(),
                    pattern,
                    condition,
                    trips,
                    total_trips: None,
                    depth,
                    reads: vec![],
                    writes: vec![],
                },
            ));
        }
        // Accesses.
        let mut i = b0 + 1;
        while i < b1 {
            let t = &toks[i];
            if t.kind == Kind::Ident {
                match t.text.as_str() {
                    "__syncthreads" => st.sync.syncthreads += 1,
                    "__syncwarp" => st.sync.syncwarp += 1,
                    w if w.starts_with("__shfl") => st.sync.shuffles += 1,
                    w if w.starts_with("__threadfence") => st.sync.fences += 1,
                    w if w.starts_with("atomic")
                        && w.len() > 6
                        && toks.get(i + 1).is_some_and(|n| n.text == "(") =>
                    {
                        let close = matching(&toks, i + 1);
                        let comma = (i + 2..close)
                            .find(|&k| toks[k].text == "," && depth_between(&toks, i + 2, k) == 0)
                            .unwrap_or(close);
                        let target_toks: Vec<&Tok> = toks[i + 2..comma].iter().collect();
                        let base_name = target_toks
                            .iter()
                            .find(|t| t.kind == Kind::Ident && scope.names.contains_key(&t.text))
                            .map(|t| t.text.clone());
                        let (target, space) =
                            match base_name.as_ref().and_then(|n| scope.names.get(n)) {
                                Some((Origin::Global(g), _)) => (g.clone(), "global"),
                                Some((Origin::Shared(s), _)) => (s.clone(), "shared"),
                                None => (text(&toks, i + 2, comma), "unknown"),
                            };
                        if let Some((Origin::Global(g), _)) =
                            base_name.as_ref().and_then(|n| scope.names.get(n))
                        {
                            if let Some(b) = buffers.get_mut(g) {
                                b.writes += 1;
                            }
                        }
                        st.atomics.push(AtomicUse {
                            function: f.name.clone(),
                            op: w.to_string(),
                            target,
                            space: space.to_string(),
                            in_loop: loop_records.iter().any(|(s, e, _)| *s < i && i < *e),
                        });
                    }
                    name if toks.get(i + 1).is_some_and(|n| n.text == "[")
                        && (i == 0 || toks[i - 1].text != ".")
                        && !scope.decls.contains(&i) =>
                    {
                        if let Some((origin, _)) = scope.names.get(name).cloned() {
                            let close = matching(&toks, i + 1);
                            let after = toks.get(close + 1).map(|t| t.text.as_str()).unwrap_or("");
                            let write = matches!(
                                after,
                                "=" | "+="
                                    | "-="
                                    | "*="
                                    | "/="
                                    | "|="
                                    | "&="
                                    | "^="
                                    | "<<="
                                    | ">>="
                                    | "++"
                                    | "--"
                            ) || (i > 0
                                && matches!(toks[i - 1].text.as_str(), "++" | "--"));
                            let index = text(&toks, i + 2, close);
                            match &origin {
                                Origin::Global(g) => {
                                    if let Some(b) = buffers.get_mut(g) {
                                        if write {
                                            b.writes += 1;
                                        } else {
                                            b.reads += 1;
                                        }
                                    }
                                    for (s, e, l) in loop_records.iter_mut() {
                                        if *s < i && i < *e {
                                            let v =
                                                if write { &mut l.writes } else { &mut l.reads };
                                            if !v.contains(g) {
                                                v.push(g.clone());
                                            }
                                        }
                                    }
                                }
                                Origin::Shared(sname) => {
                                    if let Some(s) = st.shared.iter_mut().find(|s| &s.name == sname)
                                    {
                                        if write {
                                            s.writes += 1;
                                        } else {
                                            s.reads += 1;
                                        }
                                        if !s.indices.contains(&index) && s.indices.len() < 6 {
                                            s.indices.push(index);
                                        }
                                    }
                                }
                            }
                            i += 1;
                            continue;
                        }
                    }
                    name => {
                        // A call into another function of the source.
                        if let Some(callee) = by_name.get(name).filter(|c| c.name != f.name) {
                            let mut j = i + 1;
                            if toks.get(j).is_some_and(|t| t.text == "<") {
                                // template arguments
                                let mut d = 0;
                                while j < b1 {
                                    match toks[j].text.as_str() {
                                        "<" => d += 1,
                                        ">" => {
                                            d -= 1;
                                            if d == 0 {
                                                break;
                                            }
                                        }
                                        ">>" => {
                                            d -= 2;
                                            if d <= 0 {
                                                break;
                                            }
                                        }
                                        _ => {}
                                    }
                                    j += 1;
                                }
                                j += 1;
                            }
                            if toks.get(j).is_some_and(|t| t.text == "(") {
                                let close = matching(&toks, j);
                                let args = split_args(&toks, j + 1, close);
                                let mut callee_scope = Scope::new();
                                for ((pname, pty, pointer), (a0, a1)) in
                                    params(&toks, callee.params).into_iter().zip(args)
                                {
                                    if pointer {
                                        let origin = toks[a0..a1].iter().find_map(|t| {
                                            scope.names.get(&t.text).map(|(o, _)| o.clone())
                                        });
                                        if let Some(o) = origin {
                                            callee_scope.names.insert(pname, (o, pty));
                                        }
                                    } else if let Some(v) =
                                        eval_range(&toks, a0, a1, &|n| value(n, &scope))
                                    {
                                        callee_scope.bound.insert(pname, v);
                                    }
                                }
                                queue.push((callee, callee_scope));
                            }
                        }
                    }
                }
            }
            i += 1;
        }
        // Nesting: total trips and read passes.
        let snapshot: Vec<(usize, usize, Option<u64>, u32)> = loop_records
            .iter()
            .map(|(s, e, l)| (*s, *e, l.trips, l.depth))
            .collect();
        for (s, e, l) in loop_records.iter_mut() {
            let mut total = l.trips;
            for (os, oe, ot, _) in &snapshot {
                if *os < *s && *e <= *oe && (*os, *oe) != (*s, *e) {
                    total = total.zip(*ot).map(|(a, b)| a.saturating_mul(b));
                }
            }
            l.total_trips = total;
        }
        for (_, _, l) in loop_records.iter().filter(|(_, _, l)| l.depth == 0) {
            for r in &l.reads {
                if let Some(b) = buffers.get_mut(r) {
                    b.read_passes += 1;
                }
            }
        }
        st.loops.extend(loop_records.into_iter().map(|(_, _, l)| l));
        qi += 1;
    }
    st.functions = order;
    // The one-line summary reads only the functions followed, not the rest of a
    // translation unit that may define many entries.
    let text: Vec<String> = reached
        .iter()
        .map(|f| token_text(&toks, f.start, f.body.1 + 1))
        .collect();
    st.summary = kopt_store::features::structural_summary(&text.join("\n"));
    st.buffers = buffer_order
        .into_iter()
        .filter_map(|n| buffers.remove(&n))
        .collect();
    Ok(st)
}

fn lookup(
    name: &str,
    scope: &Scope,
    toks: &[Tok],
    base: &BTreeMap<String, i64>,
    depth: u32,
) -> Option<i64> {
    if depth > 16 {
        return None;
    }
    if let Some(v) = scope.bound.get(name) {
        return Some(*v);
    }
    if let Some((a, b)) = scope.consts.get(name) {
        return eval_range(toks, *a, *b, &|n| lookup(n, scope, toks, base, depth + 1));
    }
    base.get(name).copied()
}

/// Parameters in `(open, close)`: (name, element type, is a pointer).
fn params(toks: &[Tok], (open, close): (usize, usize)) -> Vec<(String, String, bool)> {
    split_args(toks, open + 1, close)
        .into_iter()
        .filter_map(|(a, b)| {
            let words: Vec<&Tok> = toks[a..b].iter().collect();
            let name = words
                .iter()
                .rev()
                .find(|t| t.kind == Kind::Ident)?
                .text
                .clone();
            let pointer = words.iter().any(|t| t.text == "*");
            let ty = words
                .iter()
                .filter(|t| {
                    t.kind == Kind::Ident
                        && t.text != name
                        && !TYPE_WORDS.contains(&t.text.as_str())
                })
                .map(|t| t.text.clone())
                .next_back()
                .unwrap_or_default();
            Some((name, ty, pointer))
        })
        .collect()
}

fn split_args(toks: &[Tok], from: usize, to: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    if from >= to {
        return out;
    }
    let mut start = from;
    let mut depth = 0;
    for (i, t) in toks.iter().enumerate().take(to).skip(from) {
        match t.text.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => depth -= 1,
            "," if depth == 0 => {
                out.push((start, i));
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push((start, to));
    out
}

/// Declarations in a body: shared and local arrays, pointer aliases, `const` integers.
#[allow(clippy::too_many_arguments)]
fn declarations(
    toks: &[Tok],
    from: usize,
    to: usize,
    scope: &mut Scope,
    function: &str,
    st: &mut Structure,
    base: &BTreeMap<String, i64>,
    smem: u32,
) {
    // Statement by statement (split at `;`, `{`, `}`).
    let mut start = from;
    let mut i = from;
    while i <= to {
        let end = i == to || matches!(toks[i].text.as_str(), ";" | "{" | "}");
        if !end {
            i += 1;
            continue;
        }
        let s0 = start;
        let stmt = &toks[start..i];
        start = i + 1;
        i += 1;
        if stmt.is_empty() {
            continue;
        }
        let words: Vec<&str> = stmt.iter().map(|t| t.text.as_str()).collect();
        let shared = words.contains(&"__shared__");
        if let Some(lb) = words.iter().position(|w| *w == "[") {
            // `T name[SIZE], other[SIZE]` (or `extern __shared__ T name[]`)
            if lb >= 2
                && stmt[lb - 1].kind == Kind::Ident
                && stmt[lb - 2].kind == Kind::Ident
                && !is_keyword(words[lb - 2])
                && !words[..lb].contains(&"=")
                && !words[..lb].contains(&"(")
            {
                let element = words[lb - 2].to_string();
                let mut k = lb - 1;
                while k + 1 < words.len() && stmt[k].kind == Kind::Ident && words[k + 1] == "[" {
                    let name = words[k].to_string();
                    let rb = matching(stmt, k + 1);
                    let size = text(stmt, k + 2, rb);
                    scope.decls.insert(s0 + k);
                    if shared {
                        let dynamic = words.contains(&"extern") || size.is_empty();
                        let bytes = if dynamic {
                            Some(smem as u64)
                        } else {
                            eval_range(stmt, k + 2, rb, &|n| base.get(n).copied())
                                .zip(type_bits(&element))
                                .map(|(c, b)| c.max(0) as u64 * b as u64 / 8)
                        };
                        scope.names.insert(
                            name.clone(),
                            (Origin::Shared(name.clone()), element.clone()),
                        );
                        st.shared.push(SharedArray {
                            function: function.to_string(),
                            name,
                            element: element.clone(),
                            size,
                            bytes,
                            dynamic,
                            reads: 0,
                            writes: 0,
                            indices: vec![],
                        });
                    } else if type_bits(&element).is_some()
                        || element
                            .chars()
                            .next()
                            .is_some_and(|c| c.is_ascii_uppercase())
                    {
                        st.local_arrays.push(LocalArray {
                            function: function.to_string(),
                            name,
                            element: element.clone(),
                            size,
                        });
                    }
                    // `, next[...]`
                    if rb + 2 < words.len() && words[rb + 1] == "," {
                        k = rb + 2;
                    } else {
                        break;
                    }
                }
                continue;
            }
        }
        // `T* name = expr` : an alias of a buffer (the first known name in expr).
        if let Some(eq) = words.iter().position(|w| *w == "=") {
            if eq >= 2
                && stmt[eq - 1].kind == Kind::Ident
                && words[..eq].contains(&"*")
                && !words[..eq].contains(&"[")
            {
                let name = words[eq - 1].to_string();
                let rhs = &stmt[eq + 1..];
                let origin = rhs.iter().find_map(|t| {
                    scope
                        .names
                        .get(&t.text)
                        .map(|(o, ty)| (o.clone(), ty.clone()))
                });
                // The alias's own element type: the declared one, or a cast's.
                let declared = stmt[..eq]
                    .iter()
                    .filter(|t| {
                        t.kind == Kind::Ident
                            && t.text != name
                            && !TYPE_WORDS.contains(&t.text.as_str())
                    })
                    .map(|t| t.text.clone())
                    .next_back();
                if let Some((o, ty)) = origin {
                    let element = declared.unwrap_or(ty);
                    scope.names.insert(name, (o, element));
                }
                continue;
            }
            // `const int n = expr` : an integer constant.
            if eq >= 2
                && stmt[eq - 1].kind == Kind::Ident
                && words[..eq].contains(&"const")
                && !words[..eq].contains(&"*")
            {
                let name = words[eq - 1].to_string();
                scope.consts.insert(name, (s0 + eq + 1, s0 + stmt.len()));
            }
        }
    }
}

/// A loop found: its kind, its header's and its body's token ranges.
type Found = (&'static str, (usize, usize), (usize, usize));

/// Loops in `from..to`.
fn loops_in(toks: &[Tok], from: usize, to: usize) -> Vec<Found> {
    let mut out = Vec::new();
    for i in from..to {
        let kind = match toks[i].text.as_str() {
            "for" => "for",
            "while" => "while",
            "do" => "do",
            _ => continue,
        };
        if kind == "do" {
            if toks.get(i + 1).is_some_and(|t| t.text == "{") {
                let close = matching(toks, i + 1);
                // `} while (cond);`
                let head = if toks.get(close + 1).is_some_and(|t| t.text == "while")
                    && toks.get(close + 2).is_some_and(|t| t.text == "(")
                {
                    (close + 2, matching(toks, close + 2))
                } else {
                    (i, i)
                };
                out.push(("do", head, (i + 1, close)));
            }
            continue;
        }
        if kind == "while" && i > 0 && toks[i - 1].text == "}" {
            // the tail of a do-while
            if let Some(open) = (from..i)
                .rev()
                .find(|&k| toks[k].text == "{" && matching(toks, k) == i - 1)
            {
                if open > 0 && toks[open - 1].text == "do" {
                    continue;
                }
            }
        }
        if toks.get(i + 1).is_none_or(|t| t.text != "(") {
            continue;
        }
        let hclose = matching(toks, i + 1);
        let body = if toks.get(hclose + 1).is_some_and(|t| t.text == "{") {
            (hclose + 1, matching(toks, hclose + 1))
        } else {
            // one statement: to its `;` at depth 0 (a nested loop's body included)
            let mut k = hclose + 1;
            let mut depth = 0;
            while k < to {
                match toks[k].text.as_str() {
                    "(" | "[" | "{" => depth += 1,
                    ")" | "]" | "}" => depth -= 1,
                    ";" if depth == 0 => break,
                    _ => {}
                }
                k += 1;
            }
            (hclose, k)
        };
        out.push((kind, (i + 1, hclose), body));
    }
    out
}

/// A loop's pattern, its condition as written, and its trips per thread.
fn classify_loop(
    toks: &[Tok],
    kind: &str,
    (open, close): (usize, usize),
    value: &dyn Fn(&str) -> Option<i64>,
) -> (String, String, Option<u64>) {
    if kind != "for" {
        let cond = if close > open {
            text(toks, open + 1, close)
        } else {
            String::new()
        };
        return ("other".into(), cond, None);
    }
    let parts = split_on(toks, open + 1, close, ";");
    if parts.len() != 3 {
        return ("other".into(), text(toks, open + 1, close), None);
    }
    let (init, cond, step) = (parts[0], parts[1], parts[2]);
    let condition = text(toks, cond.0, cond.1);
    // The loop variable: the identifier before `=` in the initialiser.
    let Some(eq) = (init.0..init.1).find(|&k| toks[k].text == "=") else {
        return ("other".into(), condition, None);
    };
    let var = toks[eq - 1].text.clone();
    let start = eval_range(toks, eq + 1, init.1, value);
    let start_text = text(toks, eq + 1, init.1);
    // The condition `var OP bound`.
    let cmp =
        (cond.0..cond.1).find(|&k| matches!(toks[k].text.as_str(), "<" | "<=" | ">" | ">=" | "!="));
    let Some(cmp) = cmp.filter(|&k| k == cond.0 + 1 && toks[cond.0].text == var) else {
        return ("other".into(), condition, None);
    };
    let op = toks[cmp].text.clone();
    let bound = eval_range(toks, cmp + 1, cond.1, value);
    // The step.
    let step_words: Vec<&str> = toks[step.0..step.1]
        .iter()
        .map(|t| t.text.as_str())
        .collect();
    let step_text = text(toks, step.0, step.1);
    let (pattern, trips) = match step_words.as_slice() {
        ["++", v] | [v, "++"] if *v == var => {
            let t = start.zip(bound).map(|(s, b)| count_up(s, b, 1, &op));
            ("sequential", t.flatten())
        }
        [v, "+=", ..] if *v == var => {
            let inc = eval_range(toks, step.0 + 2, step.1, value);
            // A thread-dependent start with a stride of the block's size, written as
            // `blockDim.x` or as a value equal to it for this launch (a `block_size`
            // argument the launcher sets to the block size).
            let from_thread = start_text.contains("threadIdx");
            let block_wide = step_text.contains("blockDim")
                || inc.is_some_and(|i| i > 0 && Some(i) == value("blockDim.x"));
            let stride = if step_text.contains("gridDim") {
                "grid-stride"
            } else if from_thread && block_wide {
                "block-stride"
            } else if from_thread && inc.is_none() {
                // Threads start apart and the stride is unknown: whether they share the
                // iterations or each runs them all cannot be read.
                "other"
            } else {
                "sequential"
            };
            let t = match (start, bound, inc) {
                (Some(s), Some(b), Some(i)) => count_up(s, b, i, &op),
                _ => None,
            };
            (stride, t)
        }
        [v, ">>=", "1"] | [v, "/=", "2"] if *v == var => {
            let t = start
                .filter(|s| *s > 0 && (op == ">" || op == ">="))
                .map(|s| {
                    let lo = bound.unwrap_or(0).max(0);
                    let mut n = 0u64;
                    let mut x = s;
                    while (op == ">" && x > lo) || (op == ">=" && x >= lo.max(1)) {
                        n += 1;
                        x >>= 1;
                    }
                    n
                });
            ("halving", t)
        }
        [v, "<<=", "1"] | [v, "*=", "2"] if *v == var => {
            let t = start.zip(bound).and_then(|(s, b)| {
                (s > 0).then(|| {
                    let mut n = 0u64;
                    let mut x = s;
                    while (op == "<" && x < b) || (op == "<=" && x <= b) {
                        n += 1;
                        x <<= 1;
                    }
                    n
                })
            });
            ("doubling", t)
        }
        _ => ("other", None),
    };
    (pattern.into(), condition, trips)
}

fn count_up(start: i64, bound: i64, step: i64, op: &str) -> Option<u64> {
    if step <= 0 {
        return None;
    }
    let end = match op {
        "<" | "!=" => bound,
        "<=" => bound + 1,
        _ => return None,
    };
    Some(if end <= start {
        0
    } else {
        ((end - start + step - 1) / step) as u64
    })
}

fn split_on(toks: &[Tok], from: usize, to: usize, sep: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = from;
    let mut depth = 0;
    for (i, t) in toks.iter().enumerate().take(to).skip(from) {
        match t.text.as_str() {
            "(" | "[" => depth += 1,
            ")" | "]" => depth -= 1,
            s if s == sep && depth == 0 => {
                out.push((start, i));
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push((start, to));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(values: &[(&str, i64)], block: u32, grid: u32) -> Env {
        Env {
            values: values.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            block: [block, 1, 1],
            grid: [grid, 1, 1],
            smem: 0,
        }
    }

    #[test]
    fn loops_and_trips() {
        let src = "#define N 128\nextern \"C\" __global__ void k(const float* x, float* y, int cols) {\n  const int n4 = cols >> 2;\n  for (int i = threadIdx.x; i < n4; i += blockDim.x) y[i] = x[i];\n  for (int o = 16; o > 0; o >>= 1) {}\n  for (int d = 0; d < N; ++d) y[d] += x[d];\n}\n";
        let s = summarize(src, "k", &env(&[("cols", 4096)], 256, 1)).unwrap();
        let l: Vec<(&str, Option<u64>)> = s
            .loops
            .iter()
            .map(|l| (l.pattern.as_str(), l.trips))
            .collect();
        assert_eq!(
            l,
            [
                ("block-stride", Some(4)),
                ("halving", Some(5)),
                ("sequential", Some(128))
            ]
        );
        assert_eq!(s.buffers[0].name, "x");
        assert_eq!(s.buffers[0].read_passes, 2);
        assert_eq!(s.buffers[1].writes, 2);
        assert_eq!(s.loops[0].at, "source:4");
    }

    #[test]
    fn variadic_parameters_empty_pastes_and_namespaced_callees() {
        let src = "namespace ops {\n__device__ float zero() { return 0.0f; }\n}\n#define K(PREFIX, NAME, ...) \\\n  extern \"C\" __global__ void PREFIX##NAME(__VA_ARGS__) { \\\n    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = ops::zero(); }\nK(, fill, float* y, int n)\n";
        let s = summarize(src, "fill", &env(&[("n", 512)], 128, 1)).unwrap();
        assert_eq!(s.functions, ["fill", "zero"]);
        assert_eq!(
            (s.loops[0].pattern.as_str(), s.loops[0].trips),
            ("block-stride", Some(4)),
            "`n` is the second of the variadic arguments"
        );
        assert_eq!((s.buffers[0].name.as_str(), s.buffers[0].writes), ("y", 1));
        assert_eq!(s.loops[0].at, "source:7");
    }

    #[test]
    fn a_stride_equal_to_the_block_is_block_stride() {
        let src = "extern \"C\" __global__ void k(const float* x, float* y, int n, int bs, int step) {\n  for (int i = threadIdx.x; i < n; i += bs) y[i] = x[i];\n  for (int i = threadIdx.x; i < n; i += step) y[i] = x[i];\n  for (int i = 0; i < n; i += bs) y[i] = x[i];\n}\n";
        let s = summarize(src, "k", &env(&[("n", 1024), ("bs", 256)], 256, 1)).unwrap();
        let l: Vec<(&str, Option<u64>)> = s
            .loops
            .iter()
            .map(|l| (l.pattern.as_str(), l.trips))
            .collect();
        assert_eq!(
            l,
            [
                ("block-stride", Some(4)),
                ("other", None),
                ("sequential", Some(4))
            ]
        );
    }
}
