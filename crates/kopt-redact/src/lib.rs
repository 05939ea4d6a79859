//! Secrets never reach a journal or an artefact: API keys are replaced by `[REDACTED]`
//! before anything is written.
//!
//! Two nets: the values of environment variables whose names end in `_API_KEY`,
//! `_TOKEN` or `_SECRET` (or are `API_KEY`), wherever they appear; and the shapes of
//! common keys whatever their source: `sk-...` (OpenAI, Anthropic `sk-ant-...`),
//! GitHub (`ghp_`, `gho_`, `ghu_`, `ghs_`, `ghr_`, `github_pat_`), Slack (`xox?-`),
//! Hugging Face (`hf_`), GitLab (`glpat-`), Google (`AIza`), AWS access key ids
//! (`AKIA` + 16), and `Bearer <token>`.

use std::borrow::Cow;

use serde_json::Value;

pub const REDACTED: &str = "[REDACTED]";

/// A known key shape: a prefix, then at least `min` characters of the key's alphabet.
struct Shape {
    prefix: &'static str,
    min: usize,
    case_insensitive: bool,
    alphabet: fn(char) -> bool,
}

fn key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

fn upper_or_digit(c: char) -> bool {
    c.is_ascii_uppercase() || c.is_ascii_digit()
}

fn bearer_char(c: char) -> bool {
    key_char(c) || matches!(c, '.' | '~' | '+' | '/' | '=')
}

const SHAPES: &[Shape] = &[
    Shape {
        prefix: "sk-",
        min: 20,
        case_insensitive: false,
        alphabet: key_char,
    },
    Shape {
        prefix: "github_pat_",
        min: 20,
        case_insensitive: false,
        alphabet: key_char,
    },
    Shape {
        prefix: "ghp_",
        min: 30,
        case_insensitive: false,
        alphabet: key_char,
    },
    Shape {
        prefix: "gho_",
        min: 30,
        case_insensitive: false,
        alphabet: key_char,
    },
    Shape {
        prefix: "ghu_",
        min: 30,
        case_insensitive: false,
        alphabet: key_char,
    },
    Shape {
        prefix: "ghs_",
        min: 30,
        case_insensitive: false,
        alphabet: key_char,
    },
    Shape {
        prefix: "ghr_",
        min: 30,
        case_insensitive: false,
        alphabet: key_char,
    },
    Shape {
        prefix: "xoxb-",
        min: 10,
        case_insensitive: false,
        alphabet: key_char,
    },
    Shape {
        prefix: "xoxa-",
        min: 10,
        case_insensitive: false,
        alphabet: key_char,
    },
    Shape {
        prefix: "xoxp-",
        min: 10,
        case_insensitive: false,
        alphabet: key_char,
    },
    Shape {
        prefix: "xoxr-",
        min: 10,
        case_insensitive: false,
        alphabet: key_char,
    },
    Shape {
        prefix: "xoxs-",
        min: 10,
        case_insensitive: false,
        alphabet: key_char,
    },
    Shape {
        prefix: "hf_",
        min: 30,
        case_insensitive: false,
        alphabet: key_char,
    },
    Shape {
        prefix: "glpat-",
        min: 20,
        case_insensitive: false,
        alphabet: key_char,
    },
    Shape {
        prefix: "AIza",
        min: 35,
        case_insensitive: false,
        alphabet: key_char,
    },
    Shape {
        prefix: "AKIA",
        min: 16,
        case_insensitive: false,
        alphabet: upper_or_digit,
    },
    Shape {
        prefix: "bearer ",
        min: 16,
        case_insensitive: true,
        alphabet: bearer_char,
    },
];

/// Values shorter than this are not redacted from the environment: too likely to occur
/// by chance (a variable set to `1`).
const MIN_SECRET_LEN: usize = 8;

#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// Secret values and the variable each came from, longest first (so that a secret
    /// containing another is replaced whole).
    secrets: Vec<(String, String)>,
}

/// Whether an environment variable's name says it holds a secret.
pub fn is_secret_name(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    n == "API_KEY" || n.ends_with("_API_KEY") || n.ends_with("_TOKEN") || n.ends_with("_SECRET")
}

impl Redactor {
    /// Secrets from this process's environment.
    pub fn from_env() -> Self {
        Self::from_vars(
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        )
    }

    /// Secrets from the given variables (tests pass their own).
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Self {
        let mut secrets: Vec<(String, String)> = vars
            .into_iter()
            .filter(|(k, v)| is_secret_name(k) && v.trim().len() >= MIN_SECRET_LEN)
            .map(|(k, v)| (v.trim().to_string(), k))
            .collect();
        secrets.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.1.cmp(&b.1)));
        secrets.dedup_by(|a, b| a.0 == b.0);
        Redactor { secrets }
    }

    /// `text` with every secret replaced.
    pub fn redact<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let mut out = Cow::Borrowed(text);
        for (value, name) in &self.secrets {
            if out.contains(value.as_str()) {
                out = Cow::Owned(out.replace(value.as_str(), &format!("[REDACTED:{name}]")));
            }
        }
        match redact_shapes(&out) {
            Some(s) => Cow::Owned(s),
            None => out,
        }
    }

    /// Redacts every string (and object key) of a JSON value in place.
    pub fn redact_json(&self, v: &mut Value) {
        match v {
            Value::String(s) => {
                if let Cow::Owned(r) = self.redact(s) {
                    *s = r;
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.redact_json(x)),
            Value::Object(o) => {
                let entries: Vec<(String, Value)> = std::mem::take(o).into_iter().collect();
                for (k, mut x) in entries {
                    self.redact_json(&mut x);
                    o.insert(self.redact(&k).into_owned(), x);
                }
            }
            _ => {}
        }
    }
}

/// Replaces key-shaped substrings; `None` when there is none.
fn redact_shapes(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    // (start, end) byte ranges to replace; the prefix of `bearer` is kept.
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for shape in SHAPES {
        let hay = if shape.case_insensitive { &lower } else { text };
        let mut from = 0;
        while let Some(pos) = hay[from..].find(shape.prefix) {
            let start = from + pos;
            from = start + shape.prefix.len();
            let boundary = text[..start]
                .chars()
                .next_back()
                .is_none_or(|c| !key_char(c));
            if !boundary {
                continue;
            }
            let body = &text[from..];
            let len: usize = body
                .chars()
                .take_while(|c| (shape.alphabet)(*c))
                .map(char::len_utf8)
                .sum();
            if body[..len].chars().count() >= shape.min {
                let keep = if shape.prefix == "bearer " {
                    shape.prefix.len()
                } else {
                    0
                };
                spans.push((start + keep, from + len));
                from += len;
            }
        }
    }
    if spans.is_empty() {
        return None;
    }
    spans.sort();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (s, e) in spans {
        if e <= at {
            continue;
        }
        out.push_str(&text[at..s.max(at)]);
        out.push_str(REDACTED);
        at = e;
    }
    out.push_str(&text[at..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r() -> Redactor {
        Redactor::from_vars([
            (
                "OPENAI_API_KEY".to_string(),
                "local-proxy-key-123".to_string(),
            ),
            ("HF_TOKEN".to_string(), "abc".to_string()),
            ("PATH".to_string(), "/usr/bin:/bin".to_string()),
        ])
    }

    #[test]
    fn environment_secrets_are_replaced_wherever_they_appear() {
        let out = r().redact("key=local-proxy-key-123; path /usr/bin:/bin");
        assert_eq!(out, "key=[REDACTED:OPENAI_API_KEY]; path /usr/bin:/bin");
        // Short values are not taken for secrets.
        assert_eq!(r().redact("abc"), "abc");
    }

    #[test]
    fn key_shapes_are_replaced() {
        let cases = [
            (
                "auth sk-proj-AbCdEfGhIjKlMnOpQrStUvWx end",
                "auth [REDACTED] end",
            ),
            ("x=sk-ant-api03-AAAAAAAAAAAAAAAAAAAAAAAA", "x=[REDACTED]"),
            ("ghp_0123456789abcdefghijklmnopqrstuvwxyzAB", "[REDACTED]"),
            (
                "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc.def",
                "Authorization: Bearer [REDACTED]",
            ),
            ("aws AKIAIOSFODNN7EXAMPLE.", "aws [REDACTED]."),
            ("hf_abcdefghijklmnopqrstuvwxyzABCDEFG", "[REDACTED]"),
        ];
        for (input, want) in cases {
            assert_eq!(r().redact(input), want, "{input}");
        }
        // Not keys: too short, or inside a longer word.
        for keep in [
            "task-list",
            "sk-short",
            "risk-free",
            "mask-0123456789abcdefghijklmnop",
            "Bearer x",
        ] {
            assert_eq!(r().redact(keep), keep);
        }
    }

    #[test]
    fn json_strings_and_keys_are_redacted() {
        let mut v = serde_json::json!({
            "headers": {"Authorization": "Bearer 0123456789abcdefABCDEF"},
            "list": ["local-proxy-key-123", 3],
            "local-proxy-key-123": true,
        });
        r().redact_json(&mut v);
        let s = v.to_string();
        assert!(
            !s.contains("0123456789abcdefABCDEF") && !s.contains("local-proxy-key-123"),
            "{s}"
        );
        assert!(s.contains("[REDACTED:OPENAI_API_KEY]"), "{s}");
    }
}
