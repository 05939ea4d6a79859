//! The structured proposal an agent answers with, how it is found in a model's reply,
//! validated against the kernel, and repaired once when malformed.

use std::collections::BTreeMap;

use kopt_spec::expr::{self, Ty, VarKind};
use kopt_spec::KernelSpec;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A round's answer: one or more candidates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProposalSet {
    pub proposals: Vec<Proposal>,
}

/// One candidate, with the reasoning that makes it reviewable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Proposal {
    pub diagnosis: Diagnosis,
    /// Each change, tied to the diagnosis.
    pub changes: Vec<ProposedChange>,
    pub risks: Vec<String>,
    /// The expected effect on each metric the diagnosis names.
    pub expected: Vec<ExpectedEffect>,
    pub candidate: Candidate,
    /// The launch rule, when it differs from the current best's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<LaunchText>,
    /// Preprocessor defines of the candidate.
    #[serde(default)]
    pub defines: BTreeMap<String, i64>,
    /// Further NVRTC options.
    #[serde(default)]
    pub options: Vec<String>,
    /// Values to search around the candidate (define name -> values): `cargo kopt
    /// optimize` verifies the combinations with the candidate's other defines (every one
    /// of at most 16; a larger matrix, at most 1024, is hill-climbed from the candidate's
    /// values), each counted as a candidate, and keeps the best that verifies by the rule
    /// any candidate is judged by. A key must be in `defines`, a tunable of the kernel, or
    /// a name the source uses. (The MCP server's `propose_variant` verifies the
    /// candidate's own defines only; its `search` tool searches.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matrix: Option<BTreeMap<String, Vec<i64>>>,
    /// The shapes the candidate is for, when not every shape: a condition over the
    /// kernel's scalar arguments in the annotation's expression language (`cols <= 1024`,
    /// `rows >= 4096 && cols % 8 == 0`), holding on at least one declared shape. The
    /// candidate is verified and timed on the declared and held-out shapes where it holds,
    /// and a winner there is kept for that region only: the current best (or the
    /// reference) keeps the other shapes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

/// The most points a proposal's `matrix` may hold (the product of its value counts).
/// Each point the loop verifies counts against the candidate budget: a matrix of at most
/// [`EXHAUSTIVE_MATRIX_POINTS`] is verified point by point, a larger one is hill-climbed
/// from the candidate's own point until the budget runs out.
pub const MAX_MATRIX_POINTS: usize = 1024;

/// The largest matrix whose every point the loop verifies.
pub const EXHAUSTIVE_MATRIX_POINTS: usize = 16;

/// Every combination of a matrix's values, in a fixed order: keys in name order, the last
/// key's values changing fastest, each key's values in the order given.
pub fn matrix_points(matrix: &BTreeMap<String, Vec<i64>>) -> Vec<BTreeMap<String, i64>> {
    let mut points = vec![BTreeMap::new()];
    for (name, values) in matrix {
        points = points
            .into_iter()
            .flat_map(|p| {
                values.iter().map(move |v| {
                    let mut q = p.clone();
                    q.insert(name.clone(), *v);
                    q
                })
            })
            .collect();
    }
    if matrix.is_empty() {
        points.clear();
    }
    points
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Diagnosis {
    /// The bottleneck class, e.g. `memory-bound`.
    pub bottleneck: String,
    pub summary: String,
    /// The measurements it rests on, each naming a metric or figure of the context.
    pub evidence: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProposedChange {
    pub what: String,
    /// How it addresses the diagnosis.
    pub why: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ExpectedEffect {
    pub metric: String,
    /// e.g. `down by a third`, `from 47% to above 80%`.
    pub change: String,
}

/// The candidate's code: the full source, or a unified diff against the current best.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Candidate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
    /// The candidate's `__global__` entry when it has a name of its own
    /// (`softmax_kernel4`); absent, the kernel's entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<String>,
    /// The candidate kernel's arguments in order, when they differ from the current
    /// best's: names of the launcher's parameters, the annotation's computed arguments
    /// and its tensor maps (each passed as a `const __grid_constant__ CUtensorMap`).
    /// Every buffer must be reached, itself or through a map. Absent: the best's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
}

/// A launch rule as expression text over the scalar arguments and the defines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LaunchText {
    pub grid: [String; 3],
    pub block: [String; 3],
    #[serde(default = "zero")]
    pub smem: String,
    /// Thread-block cluster dimensions set at launch (sm_90+), in blocks; each must divide
    /// the grid's. Left out, or 1 for a shape, is a launch without clusters. Use it
    /// instead of `__cluster_dims__` when only some shapes need clusters: a compile-time
    /// cluster constrains every launch. Example: `["if rows < 256 { 8 } else { 1 }", "1", "1"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<[String; 3]>,
}

fn zero() -> String {
    "0".into()
}

/// The JSON schema of [`ProposalSet`], given to models and MCP clients.
pub fn schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(ProposalSet)).expect("schemas serialise")
}

/// The JSON object in a model's reply: the whole reply, a fenced ```json block, or the
/// outermost braces.
pub fn extract_json(text: &str) -> Option<&str> {
    let t = text.trim();
    if t.starts_with('{') && t.ends_with('}') {
        return Some(t);
    }
    if let Some(start) = t.find("```json") {
        let rest = &t[start + 7..];
        if let Some(end) = rest.find("```") {
            return Some(rest[..end].trim());
        }
    }
    let (a, b) = (t.find('{')?, t.rfind('}')?);
    (a < b).then(|| &t[a..=b])
}

/// Parses and validates a reply. The errors are written for the model: the repair
/// prompt quotes them.
pub fn parse(
    text: &str,
    spec: &KernelSpec,
    current_best: &str,
) -> Result<Vec<Resolved>, Vec<String>> {
    let Some(json) = extract_json(text) else {
        return Err(vec!["the reply holds no JSON object".into()]);
    };
    let set: ProposalSet = match serde_json::from_str::<ProposalSet>(json) {
        Ok(s) => s,
        // A single proposal without the wrapper is accepted too.
        Err(e) => match serde_json::from_str::<Proposal>(json) {
            Ok(p) => ProposalSet { proposals: vec![p] },
            Err(_) => return Err(vec![format!("the JSON does not match the schema: {e}")]),
        },
    };
    if set.proposals.is_empty() {
        return Err(vec!["`proposals` is empty".into()]);
    }
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (i, p) in set.proposals.into_iter().enumerate() {
        match resolve(p, spec, current_best) {
            Ok(r) => out.push(r),
            Err(es) => errors.extend(es.into_iter().map(|e| format!("proposal {}: {e}", i + 1))),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// A validated proposal with its candidate source resolved (a diff applied).
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub proposal: Proposal,
    pub source: String,
}

fn resolve(p: Proposal, spec: &KernelSpec, current_best: &str) -> Result<Resolved, Vec<String>> {
    let mut errors = Vec::new();
    if p.diagnosis.evidence.is_empty() {
        errors.push("the diagnosis cites no evidence (`diagnosis.evidence`)".to_string());
    }
    if p.changes.is_empty() {
        errors.push("no change is listed (`changes`)".into());
    }
    for (i, c) in p.changes.iter().enumerate() {
        if c.why.trim().is_empty() {
            errors.push(format!(
                "change {} (`{}`) does not say why it addresses the diagnosis",
                i + 1,
                c.what
            ));
        }
    }
    let source = match (&p.candidate.source, &p.candidate.diff) {
        (Some(s), None) => Some(s.clone()),
        (None, Some(d)) => match diffy::Patch::from_str(d)
            .map_err(|e| e.to_string())
            .and_then(|patch| diffy::apply(current_best, &patch).map_err(|e| e.to_string()))
        {
            Ok(s) => Some(s),
            Err(e) => {
                errors.push(format!("the diff does not apply to the current best: {e}"));
                None
            }
        },
        (Some(_), Some(_)) => {
            errors.push("give `candidate.source` or `candidate.diff`, not both".into());
            None
        }
        (None, None) => {
            errors.push("`candidate` has neither `source` nor `diff`".into());
            None
        }
    };
    if let Some(r) = &p.region {
        match spec.parse_region(r) {
            Err(e) => errors.push(format!("`region` {e}")),
            Ok(e)
                if !spec
                    .shapes
                    .iter()
                    .any(|s| spec.region_holds(&e, &spec.shape_args(s))) =>
            {
                errors.push(format!(
                    "`region` `{r}` holds on no declared shape ({}): a region must hold on at least one, where the candidate is timed",
                    spec.shapes
                        .iter()
                        .map(kopt_spec::spec::shape_label)
                        .collect::<Vec<_>>()
                        .join("; ")
                ));
            }
            Ok(_) => {}
        }
    }
    if let Some(s) = &source {
        if let Err(m) = spec.version_args(p.candidate.args.as_deref()) {
            errors.push(format!("`candidate.args`: {m}"));
        }
        match p.candidate.entry.as_deref() {
            Some(entry) if !kopt_spec::source::may_define_entry(s, entry) => {
                errors.push(format!("the candidate defines no `__global__` function `{entry}`, which `candidate.entry` names"));
            }
            Some(_) => {}
            None if !kopt_spec::source::may_define_entry(s, &spec.entry) => {
                errors.push(format!("the candidate defines no `__global__` function `{}` (the entry point must keep its signature; a kernel of another name is named in `candidate.entry`)", spec.entry));
            }
            None => {}
        }
    }
    if let Some(l) = &p.launch {
        let defines: Vec<&str> = p.defines.keys().map(String::as_str).collect();
        let kinds = |n: &str| {
            spec.var_kind_with(n, &defines)
                .or_else(|| defines.contains(&n).then_some(VarKind::Int))
        };
        let mut names = spec.int_names();
        names.extend(defines.iter().map(|d| d.to_string()));
        for (what, e) in l
            .grid
            .iter()
            .map(|e| ("grid", e))
            .chain(l.block.iter().map(|e| ("block", e)))
            .chain(std::iter::once(("smem", &l.smem)))
            .chain(l.cluster.iter().flatten().map(|e| ("cluster", e)))
        {
            if let Err(m) = expr::parse_str(e, Ty::Int, &kinds, &names) {
                errors.push(format!("launch {what}: {m}"));
            }
        }
    }
    if let Some(m) = &p.matrix {
        check_matrix(m, &p, spec, source.as_deref(), &mut errors);
    }
    for o in &p.options {
        if !o.starts_with('-') || o.starts_with("-I") || o.starts_with("--include-path") {
            errors.push(format!(
                "option `{o}` is not an NVRTC option kopt accepts (no include paths)"
            ));
        }
    }
    match (errors.is_empty(), source) {
        (true, Some(source)) => Ok(Resolved {
            proposal: p,
            source,
        }),
        _ => Err(errors),
    }
}

/// The matrix rule: every key is a preprocessor name the candidate uses (a key of its
/// `defines`, a tunable of the kernel, or an identifier of its source outside comments;
/// a launch rule can only name those), never an argument of the kernel; every key lists
/// values, each once; and the combinations number at most [`MAX_MATRIX_POINTS`]. An
/// empty matrix (`{}`) asks for nothing and passes.
fn check_matrix(
    m: &BTreeMap<String, Vec<i64>>,
    p: &Proposal,
    spec: &KernelSpec,
    source: Option<&str>,
    errors: &mut Vec<String>,
) {
    let code = source.map(kopt_spec::source::strip_comments);
    let used = |name: &str| {
        p.defines.contains_key(name)
            || spec.tunables.iter().any(|t| t.name == name)
            || code.as_deref().is_some_and(|c| {
                c.split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                    .any(|w| w == name)
            })
    };
    for (name, values) in m {
        let identifier = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !identifier {
            errors.push(format!(
                "matrix key `{name}` is not a preprocessor name (ASCII letters, digits and `_`, not starting with a digit)"
            ));
            continue;
        }
        // Launcher parameters (expressions read them) and the kernel's own arguments
        // (a define of that name would rename the parameter in the source).
        if spec.params.iter().any(|q| q.name() == name)
            || spec.kernel_args().iter().any(|a| a.name() == name)
        {
            errors.push(format!(
                "matrix key `{name}` is an argument of the kernel, not a define: the matrix searches defines only"
            ));
            continue;
        }
        if !used(name) {
            errors.push(format!(
                "matrix key `{name}` is not a define the candidate uses: list it in `defines` (with the candidate's own value) or use it in the source, or drop it from `matrix`"
            ));
        }
        if values.is_empty() {
            errors.push(format!(
                "matrix `{name}` lists no values: give at least one, or drop the key"
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for v in values {
            if !seen.insert(*v) {
                errors.push(format!(
                    "matrix `{name}` lists {v} more than once: give each value once"
                ));
                break;
            }
        }
    }
    let points = m
        .values()
        .fold(1usize, |n, v| n.saturating_mul(v.len().max(1)));
    if !m.is_empty() && points > MAX_MATRIX_POINTS {
        let counts = m
            .iter()
            .map(|(k, v)| format!("{} `{k}`", v.len()))
            .collect::<Vec<_>>()
            .join(" x ");
        errors.push(format!(
            "the matrix has {points} points ({counts}), more than the {MAX_MATRIX_POINTS} the loop searches for one candidate: keep the values you expect to matter (at most {MAX_MATRIX_POINTS} combinations)"
        ));
    }
}

/// The one repair round: the errors, and the instruction to answer with the JSON alone.
pub fn repair_prompt(errors: &[String]) -> String {
    format!(
        "Your reply could not be used:\n{}\n\nAnswer again with only one JSON object matching the schema (`{{\"proposals\": [...]}}`), nothing else.",
        errors.iter().map(|e| format!("- {e}")).collect::<Vec<_>>().join("\n")
    )
}
