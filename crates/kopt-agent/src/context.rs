//! Context assembly: what the agent reads, summary first, then the source, within a
//! token budget. The prompts are files under `templates/` (snapshot-tested); `{{name}}`
//! placeholders are filled here and nowhere else.

use std::collections::BTreeMap;

use kopt_spec::spec::{shape_label, KernelArgRef};
use kopt_spec::KernelSpec;

use crate::chat::{ChatRequest, Message};

pub const SYSTEM: &str = include_str!("../templates/system.md");
pub const PROPOSE: &str = include_str!("../templates/propose.md");
pub const REFLECT: &str = include_str!("../templates/reflect.md");
pub const REVIEW: &str = include_str!("../templates/review.md");
pub const ANSWER_REVIEW: &str = include_str!("../templates/answer_review.md");

/// Fills `{{name}}` placeholders. A placeholder without a value is an error: a template
/// and its caller must agree.
pub fn fill(template: &str, values: &BTreeMap<&str, String>) -> Result<String, String> {
    let mut out = String::with_capacity(template.len() * 2);
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find("}}").ok_or("an unclosed `{{` in a template")?;
        let name = &after[..end];
        let v = values
            .get(name)
            .ok_or_else(|| format!("the template needs `{name}`"))?;
        out.push_str(v);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A rough token count (4 characters a token): budgets are approximate by nature.
pub fn tokens(text: &str) -> usize {
    text.len().div_ceil(4)
}

/// A past case, as the context shows it (and as a resumed run reads it back).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CaseLine {
    pub title: String,
    pub outcome: String,
    pub diagnosis: String,
    pub change: String,
    /// The library's score: metric and text similarity, weighted.
    pub similarity: f64,
    /// How near the case's metric vector is to the snapshot's; `None` when no snapshot
    /// was taken, so that the score is the text's alone.
    pub metric_similarity: Option<f64>,
    pub text_similarity: f64,
}

/// What one earlier candidate taught, layered: verdict, then each metric's before and
/// after, the compile log verbatim, a numeric failure localised.
#[derive(Debug, Clone, PartialEq)]
pub struct Feedback {
    pub round: u32,
    pub candidate: String,
    pub verdict: String,
    pub details: Vec<String>,
}

/// A launch rule as the context shows it: grid, block, shared memory and the cluster set
/// at launch (empty when there is none), each as expression text.
pub fn launch_text(launch: &kopt_spec::spec::LaunchRule) -> [String; 4] {
    let dims = |d: &[kopt_spec::expr::Expr; 3]| {
        d.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    [
        dims(&launch.grid),
        dims(&launch.block),
        launch.smem.to_string(),
        launch.cluster.as_ref().map(dims).unwrap_or_default(),
    ]
}

/// Everything a propose request is assembled from.
#[derive(Debug, Clone)]
pub struct ContextInput<'a> {
    pub spec: &'a KernelSpec,
    pub round: u32,
    /// `reference` or the variant's name.
    pub best_label: String,
    pub best_source: &'a str,
    pub best_launch: [String; 4],
    pub device: String,
    pub ceilings: String,
    /// Per-shape figures of the current best, one line each.
    pub figures: Vec<String>,
    /// The winners of regions (the best keeps the other shapes), one line each.
    pub regions: Vec<String>,
    /// The bottleneck snapshot's text rendering, when one was taken.
    pub snapshot: Option<String>,
    pub structure: String,
    pub cases: Vec<CaseLine>,
    pub history: Vec<Feedback>,
    pub hint: Option<String>,
    pub budget_tokens: usize,
}

/// The kernel's arguments in order (what its signature must take), then the launcher's
/// launch-only scalars, which the kernel is not given.
fn params(spec: &KernelSpec) -> String {
    spec.kernel_args()
        .into_iter()
        .map(|a| match a {
            KernelArgRef::Buffer { def: b, .. } => format!(
                "{} ({} {:?}, {} elements)",
                b.name, b.dtype, b.direction, b.len
            )
            .to_lowercase(),
            KernelArgRef::Scalar { def: s, .. } => format!("{}: {}", s.name, s.ty.name()),
            KernelArgRef::Computed { def: c, .. } => format!(
                "{}: {} = {} (computed by the launcher for each launch)",
                c.name,
                c.ty.name(),
                c.value
            ),
            KernelArgRef::TensorMap { def: m, .. } => tensor_map_line(m, ""),
        })
        .chain(
            spec.tensor_maps
                .iter()
                .filter(|m| !spec.kernel_args().iter().any(|a| a.name() == m.name))
                .map(|m| {
                    tensor_map_line(
                        m,
                        ", not taken by the reference: list it in `candidate.args` to use it",
                    )
                }),
        )
        .chain(spec.launch_only().map(|s| {
            format!(
                "{}: {} (launch only: sizes the launch, not a kernel argument)",
                s.name,
                s.ty.name()
            )
        }))
        .collect::<Vec<_>>()
        .join("; ")
}

/// A tensor map as the prompt describes it.
fn tensor_map_line(m: &kopt_spec::tensor_map::TensorMapDecl, note: &str) -> String {
    let list = |l: &[kopt_spec::expr::Expr]| {
        l.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut fields = vec![
        format!("dims [{}]", list(&m.dims)),
        format!("box [{}]", list(&m.box_dims)),
    ];
    if let Some(s) = &m.strides {
        fields.push(format!("strides [{}] elements", list(s)));
    }
    if m.swizzle.bytes() > 0 {
        fields.push(format!("swizzle {}B", m.swizzle.bytes()));
    }
    format!(
        "{}: const __grid_constant__ CUtensorMap (TMA map of `{}`, innermost dimension first: {}{note})",
        m.name,
        m.buffer,
        fields.join(", ")
    )
}

fn tolerances(spec: &KernelSpec) -> String {
    spec.buffers()
        .filter(|b| b.is_output())
        .map(|b| {
            let t = b.effective_tolerance(spec);
            format!("{}: rtol {:e}, atol {:e}", b.name, t.rtol, t.atol)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The entry function of `source` (from its `__global__` line to the matching brace):
/// the region the context keeps when the whole source does not fit.
pub fn entry_region(source: &str, entry: &str) -> Option<String> {
    let at = source.find(&format!("{entry}("))?;
    let line_start = source[..at].rfind('\n').map(|i| i + 1).unwrap_or(0);
    let start = source[..line_start]
        .rfind("__global__")
        .map(|g| source[..g].rfind('\n').map(|i| i + 1).unwrap_or(0))
        .filter(|s| line_start - s < 300)
        .unwrap_or(line_start);
    let open = start + source[start..].find('{')?;
    let mut depth = 0usize;
    for (i, c) in source[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(source[start..open + i + 1].to_string());
                }
            }
            _ => {}
        }
    }
    None
}

/// Assembles the system prompt and the propose message. Over budget, it drops what
/// matters least first: older feedback, then cases (keeping 3), then the source outside
/// the entry function.
pub fn propose(input: &ContextInput, schema: &str) -> Result<ChatRequest, String> {
    let spec = input.spec;
    let system = fill(
        SYSTEM,
        &BTreeMap::from([
            ("entry", spec.entry.clone()),
            ("schema", schema.to_string()),
        ]),
    )?;
    let mut history = input.history.clone();
    let mut cases = input.cases.clone();
    cases.truncate(5);
    let mut source = input.best_source.to_string();
    let mut source_note = String::new();
    loop {
        let values =
            BTreeMap::from(
                [
                    ("kernel", spec.name.clone()),
                    ("round", input.round.to_string()),
                    ("entry", spec.entry.clone()),
                    ("reference", spec.reference.clone()),
                    ("best", input.best_label.clone()),
                    ("params", params(spec)),
                    ("grid", input.best_launch[0].clone()),
                    ("block", input.best_launch[1].clone()),
                    ("smem", input.best_launch[2].clone()),
                    (
                        "cluster",
                        if input.best_launch[3].is_empty() {
                            String::new()
                        } else {
                            format!(
                                ", clusters of ({}) blocks set at launch",
                                input.best_launch[3]
                            )
                        },
                    ),
                    (
                        "tunables",
                        if spec.tunables.is_empty() {
                            "none".into()
                        } else {
                            spec.tunables
                                .iter()
                                .map(|t| {
                                    format!(
                                        "{} (default {}, values {:?})",
                                        t.name, t.default, t.values
                                    )
                                })
                                .collect::<Vec<_>>()
                                .join("; ")
                        },
                    ),
                    ("tolerances", tolerances(spec)),
                    ("device", input.device.clone()),
                    ("ceilings", input.ceilings.clone()),
                    ("figures", bullet(&input.figures, "not measured yet")),
                    (
                        "regions",
                        bullet(&input.regions, "none: the current best runs every shape"),
                    ),
                    (
                        "snapshot",
                        input
                            .snapshot
                            .clone()
                            .unwrap_or_else(|| "not available (no profile was taken)".into()),
                    ),
                    ("structure", input.structure.clone()),
                    (
                        "cases",
                        bullet(
                            &cases
                                .iter()
                                .map(|c| {
                                    format!(
                                        "{} ({}, similarity {:.2}: {}): {}; change: {}",
                                        c.title,
                                        c.outcome,
                                        c.similarity,
                                        match c.metric_similarity {
                                            Some(m) => format!(
                                                "metrics {m:.2}, text {:.2}",
                                                c.text_similarity
                                            ),
                                            None => "by text alone, no snapshot".into(),
                                        },
                                        c.diagnosis,
                                        c.change
                                    )
                                })
                                .collect::<Vec<_>>(),
                            "none in the case library",
                        ),
                    ),
                    (
                        "history",
                        if history.is_empty() {
                            "none: this is the first round.".into()
                        } else {
                            history
                                .iter()
                                .map(|f| {
                                    let mut s = format!(
                                        "- round {}, `{}`: {}",
                                        f.round, f.candidate, f.verdict
                                    );
                                    for d in &f.details {
                                        s.push_str(&format!("\n  {}", d.replace('\n', "\n  ")));
                                    }
                                    s
                                })
                                .collect::<Vec<_>>()
                                .join("\n")
                        },
                    ),
                    (
                        "hint",
                        input
                            .hint
                            .as_ref()
                            .map(|h| format!("\n## Guidance from a person\n{h}\n"))
                            .unwrap_or_default(),
                    ),
                    ("source_note", source_note.clone()),
                    ("source", source.clone()),
                ],
            );
        let user = fill(PROPOSE, &values)?;
        let total = tokens(&system) + tokens(&user);
        if total <= input.budget_tokens {
            return Ok(ChatRequest {
                purpose: "propose".into(),
                system,
                messages: vec![Message::user(user)],
                max_tokens: 8192,
                temperature: 0.2,
            });
        }
        if history.len() > 2 {
            history.remove(0);
        } else if cases.len() > 3 {
            cases.pop();
        } else if source_note.is_empty() {
            match entry_region(input.best_source, &spec.entry) {
                Some(region) if region.len() < source.len() => {
                    source_note = format!(
                        "(trimmed to the entry function to fit the context: {} of {} lines; the rest is unchanged)\n",
                        region.lines().count(),
                        input.best_source.lines().count()
                    );
                    source = region;
                }
                _ => {
                    return Err(format!(
                        "the context needs {total} tokens, over the budget of {}",
                        input.budget_tokens
                    ))
                }
            }
        } else {
            return Err(format!(
                "the context needs {total} tokens, over the budget of {}",
                input.budget_tokens
            ));
        }
    }
}

fn bullet(lines: &[String], empty: &str) -> String {
    if lines.is_empty() {
        empty.to_string()
    } else {
        lines
            .iter()
            .map(|l| format!("- {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The shapes as the review prompt lists them.
pub fn shapes(spec: &KernelSpec) -> String {
    spec.shapes
        .iter()
        .map(shape_label)
        .collect::<Vec<_>>()
        .join("; ")
}
