//! The interface every backend implements, and what wraps it: retries with backoff on
//! 429 and 5xx (honouring `Retry-After`), and token and cost accounting.

use std::time::Duration;

use crate::chat::{ChatRequest, ChatResponse, Usage};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// Worth retrying: rate limited (429), a server error (5xx), a dropped connection.
    #[error("{message} (HTTP {status})")]
    Transient {
        status: u16,
        message: String,
        /// The server's `Retry-After`, when it sent one.
        retry_after: Option<Duration>,
    },
    #[error("the request timed out after {0:?}")]
    Timeout(Duration),
    /// Not worth retrying: bad credentials, a bad request, a missing model...
    #[error("{0}")]
    Fatal(String),
    /// The endpoint answered something that is not a chat completion.
    #[error("unexpected answer from the endpoint: {0}")]
    Malformed(String),
    /// The agent has nothing more to propose (the heuristic agent's last rewrite is done).
    #[error("{0}")]
    Exhausted(String),
}

impl BackendError {
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            BackendError::Transient { .. } | BackendError::Timeout(_)
        )
    }
}

/// A model (or something standing in for one).
pub trait Backend: Send {
    /// `openai:gpt-x`, `anthropic:claude-y`, `cmd:./agent.py`, `replay:session.jsonl`.
    fn name(&self) -> String;
    fn complete(&mut self, req: &ChatRequest) -> Result<ChatResponse, BackendError>;

    /// Whether the last answer came from this run's own record (a resumed run answering
    /// from its recorded session, [`crate::session::Resume`]) rather than from the agent
    /// now: the loop's record then already holds it.
    fn last_from_record(&self) -> bool {
        false
    }
}

/// How retries back off.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub initial: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            initial: Duration::from_millis(500),
            max_delay: Duration::from_secs(60),
        }
    }
}

/// Prices in dollars per million tokens, for cost accounting.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

impl Prices {
    pub fn cost(&self, u: Usage) -> f64 {
        (u.input_tokens as f64 * self.input_per_mtok
            + u.output_tokens as f64 * self.output_per_mtok)
            / 1e6
    }
}

/// Tokens, cost, requests and retries so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Spend {
    pub requests: u64,
    pub retries: u64,
    pub usage: Usage,
    pub dollars: f64,
}

/// A backend with retries and accounting. `sleep` is injectable so tests need not wait.
pub struct Client {
    backend: Box<dyn Backend>,
    pub policy: RetryPolicy,
    pub prices: Prices,
    pub spend: Spend,
    sleep: Box<dyn Fn(Duration) + Send>,
}

impl Client {
    pub fn new(backend: Box<dyn Backend>) -> Self {
        Client {
            backend,
            policy: RetryPolicy::default(),
            prices: Prices::default(),
            spend: Spend::default(),
            sleep: Box::new(std::thread::sleep),
        }
    }

    pub fn with_sleep(mut self, sleep: impl Fn(Duration) + Send + 'static) -> Self {
        self.sleep = Box::new(sleep);
        self
    }

    pub fn name(&self) -> String {
        self.backend.name()
    }

    /// Whether the last answer came from the run's own record ([`Backend::last_from_record`]).
    pub fn last_from_record(&self) -> bool {
        self.backend.last_from_record()
    }

    /// Sends `req`, retrying transient failures with exponential backoff (or the server's
    /// `Retry-After`, capped by `max_delay`).
    pub fn complete(&mut self, req: &ChatRequest) -> Result<ChatResponse, BackendError> {
        let mut delay = self.policy.initial;
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.spend.requests += 1;
            match self.backend.complete(req) {
                Ok(r) => {
                    self.spend.usage += r.usage;
                    self.spend.dollars += self.prices.cost(r.usage);
                    return Ok(r);
                }
                Err(e) if e.is_transient() && attempt < self.policy.attempts => {
                    let wait = match &e {
                        BackendError::Transient {
                            retry_after: Some(d),
                            ..
                        } => *d,
                        _ => delay,
                    }
                    .min(self.policy.max_delay);
                    self.spend.retries += 1;
                    (self.sleep)(wait);
                    delay = (delay * 2).min(self.policy.max_delay);
                }
                Err(e) => return Err(e),
            }
        }
    }
}
