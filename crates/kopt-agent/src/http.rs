//! The HTTP backends: OpenAI-compatible chat completions (OpenAI, vLLM, Ollama, llama.cpp's
//! server) and Anthropic messages. Keys are read from an environment variable when the
//! backend is created and are never logged or recorded.

use std::time::Duration;

use serde_json::{json, Value};

use crate::backend::{Backend, BackendError};
use crate::chat::{ChatRequest, ChatResponse, Role, Usage};

/// Where an HTTP backend sends its requests.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// e.g. `https://api.openai.com/v1`, `http://localhost:11434/v1` (Ollama),
    /// `http://localhost:8000/v1` (vLLM), `http://localhost:8080/v1` (llama.cpp).
    pub base_url: String,
    pub model: String,
    /// The key, if the endpoint needs one (local servers usually do not).
    pub key: Option<String>,
    pub timeout: Duration,
}

impl Endpoint {
    /// Reads the key from `key_env`; an unset variable means no key.
    pub fn from_env(base_url: &str, model: &str, key_env: &str, timeout: Duration) -> Self {
        Endpoint {
            base_url: base_url.trim_end_matches('/').to_string(),
            model: model.to_string(),
            key: std::env::var(key_env).ok().filter(|k| !k.is_empty()),
            timeout,
        }
    }
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::AgentBuilder::new().timeout(timeout).build()
}

/// Sends a JSON POST and maps failures onto [`BackendError`].
fn post(
    agent: &ureq::Agent,
    url: &str,
    headers: &[(&str, String)],
    body: &Value,
    timeout: Duration,
) -> Result<Value, BackendError> {
    let mut req = agent.post(url).set("content-type", "application/json");
    for (k, v) in headers {
        req = req.set(k, v);
    }
    match req.send_json(body.clone()) {
        Ok(resp) => resp
            .into_json::<Value>()
            .map_err(|e| BackendError::Malformed(format!("not JSON: {e}"))),
        Err(ureq::Error::Status(status, resp)) => {
            let retry_after = resp
                .header("retry-after")
                .and_then(|v| v.trim().parse::<f64>().ok())
                .map(Duration::from_secs_f64);
            let text = resp.into_string().unwrap_or_default();
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| {
                    v.pointer("/error/message")
                        .and_then(Value::as_str)
                        .map(String::from)
                })
                .unwrap_or_else(|| text.chars().take(300).collect());
            if status == 429 || status >= 500 {
                Err(BackendError::Transient {
                    status,
                    message,
                    retry_after,
                })
            } else {
                Err(BackendError::Fatal(format!("HTTP {status}: {message}")))
            }
        }
        Err(ureq::Error::Transport(t)) => {
            let s = t.to_string();
            if s.contains("timed out") || s.contains("Timeout") {
                Err(BackendError::Timeout(timeout))
            } else {
                Err(BackendError::Transient {
                    status: 0,
                    message: s,
                    retry_after: None,
                })
            }
        }
    }
}

fn role(r: Role) -> &'static str {
    match r {
        Role::User => "user",
        Role::Assistant => "assistant",
    }
}

/// An OpenAI-compatible `/chat/completions` endpoint.
pub struct OpenAi {
    endpoint: Endpoint,
    agent: ureq::Agent,
}

impl OpenAi {
    pub fn new(endpoint: Endpoint) -> Self {
        let agent = agent(endpoint.timeout);
        OpenAi { endpoint, agent }
    }
}

impl Backend for OpenAi {
    fn name(&self) -> String {
        format!("openai:{}", self.endpoint.model)
    }

    fn complete(&mut self, req: &ChatRequest) -> Result<ChatResponse, BackendError> {
        let mut messages = vec![json!({ "role": "system", "content": req.system })];
        messages.extend(
            req.messages
                .iter()
                .map(|m| json!({ "role": role(m.role), "content": m.content })),
        );
        let body = json!({
            "model": self.endpoint.model,
            "messages": messages,
            "max_tokens": req.max_tokens,
            "temperature": req.temperature,
        });
        let headers: Vec<(&str, String)> = self
            .endpoint
            .key
            .iter()
            .map(|k| ("authorization", format!("Bearer {k}")))
            .collect();
        let url = format!("{}/chat/completions", self.endpoint.base_url);
        let v = post(&self.agent, &url, &headers, &body, self.endpoint.timeout)?;
        let text = v
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .ok_or_else(|| BackendError::Malformed("no choices[0].message.content".into()))?;
        let usage = Usage {
            input_tokens: v
                .pointer("/usage/prompt_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            output_tokens: v
                .pointer("/usage/completion_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        };
        Ok(ChatResponse {
            text: text.to_string(),
            usage,
            model: v
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or(&self.endpoint.model)
                .to_string(),
        })
    }
}

/// The Anthropic messages API.
pub struct Anthropic {
    endpoint: Endpoint,
    agent: ureq::Agent,
}

impl Anthropic {
    pub const VERSION: &'static str = "2023-06-01";

    pub fn new(endpoint: Endpoint) -> Self {
        let agent = agent(endpoint.timeout);
        Anthropic { endpoint, agent }
    }
}

impl Backend for Anthropic {
    fn name(&self) -> String {
        format!("anthropic:{}", self.endpoint.model)
    }

    fn complete(&mut self, req: &ChatRequest) -> Result<ChatResponse, BackendError> {
        let body = json!({
            "model": self.endpoint.model,
            "system": req.system,
            "messages": req.messages.iter().map(|m| json!({ "role": role(m.role), "content": m.content })).collect::<Vec<_>>(),
            "max_tokens": req.max_tokens,
            "temperature": req.temperature,
        });
        let mut headers = vec![("anthropic-version", Self::VERSION.to_string())];
        if let Some(k) = &self.endpoint.key {
            headers.push(("x-api-key", k.clone()));
        }
        let url = format!("{}/v1/messages", self.endpoint.base_url);
        let v = post(&self.agent, &url, &headers, &body, self.endpoint.timeout)?;
        let text: String = v
            .get("content")
            .and_then(Value::as_array)
            .ok_or_else(|| BackendError::Malformed("no content".into()))?
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect();
        let usage = Usage {
            input_tokens: v
                .pointer("/usage/input_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            output_tokens: v
                .pointer("/usage/output_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        };
        Ok(ChatResponse {
            text,
            usage,
            model: v
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or(&self.endpoint.model)
                .to_string(),
        })
    }
}
