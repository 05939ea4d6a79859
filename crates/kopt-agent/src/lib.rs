//! kopt's agent side: backends behind one interface, and the proposal an agent answers
//! with.
//!
//! - [`chat`]: requests and responses;
//! - [`backend`]: the [`backend::Backend`] trait, retries with backoff (honouring
//!   `Retry-After`), token and cost accounting;
//! - [`http`]: OpenAI-compatible chat completions (OpenAI, vLLM, Ollama, llama.cpp) and
//!   Anthropic messages;
//! - [`command`]: an external command speaking JSON on stdin/stdout;
//! - [`session`]: recording (redacted) and offline replay;
//! - [`context`]: context assembly from the prompt templates, within a token budget;
//! - [`heuristic`]: the built-in agent that needs no model (mechanical rewrites);
//! - [`proposal`]: the schema, extraction, validation against the kernel, the repair round;
//! - [`run`]: the loop for one kernel, with its escalation rules and budgets.

pub mod backend;
pub mod chat;
pub mod command;
pub mod context;
pub mod heuristic;
pub mod http;
pub mod proposal;
pub mod run;
pub mod session;
