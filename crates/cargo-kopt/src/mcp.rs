//! `cargo kopt mcp`: the session of `kopt_loop::session` served as Model Context
//! Protocol tools (rmcp, stdio). Every call, candidate and verdict is written to the run
//! journal (`<target>/kopt/runs/<run>/journal.jsonl`, keys redacted).
//!
//! A bad request is answered with a JSON-RPC error that says what was wrong and how to fix
//! it: arguments that do not match a tool's schema as invalid params, and the session's
//! own refusals ([`ToolError`]) with their codes.

use std::sync::{Arc, Mutex, MutexGuard};

use kopt_loop::session::{
    Config, ExplainArgs, KernelArgs, NoArgs, ProfileArgs, ProposeArgs, SearchArgs, Session,
    ToolError,
};
use kopt_workspace::gather::Gathered;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router, ErrorData};
use schemars::JsonSchema;
use serde_json::Value;

/// The MCP server: one session over one gathered workspace.
#[derive(Clone)]
pub struct KoptMcp {
    session: Arc<Mutex<Session>>,
}

/// A tool's input schema, from its argument type.
fn input_schema<T: JsonSchema + 'static>() -> Arc<rmcp::model::JsonObject> {
    rmcp::handler::server::common::schema_for_input::<T>()
        .unwrap_or_else(|e| panic!("the input schema of {}: {e}", std::any::type_name::<T>()))
}

/// A tool's arguments. Arguments that do not match the schema are a JSON-RPC error
/// (invalid params) naming what is wrong, not a tool result: the request was malformed.
fn arguments<T: serde::de::DeserializeOwned>(tool: &str, args: Value) -> Result<T, ErrorData> {
    serde_json::from_value(args).map_err(|e| {
        invalid(format!(
            "the arguments of `{tool}` do not match its input schema (see tools/list): {e}"
        ))
    })
}

fn invalid(msg: impl Into<String>) -> ErrorData {
    ErrorData::invalid_params(msg.into(), None)
}

fn internal(msg: impl Into<String>) -> ErrorData {
    ErrorData::internal_error(msg.into(), None)
}

/// The session's refusal as a JSON-RPC error.
fn tool_error(e: ToolError) -> ErrorData {
    match e {
        ToolError::InvalidParams(m) => invalid(m),
        ToolError::InvalidRequest(m) => ErrorData::invalid_request(m, None),
        ToolError::Internal(m) => internal(m),
    }
}

/// A tool's answer: the JSON as structured content, and as text for clients that only
/// read text.
fn answer(v: Value) -> CallToolResult {
    CallToolResult::structured(v)
}

impl KoptMcp {
    /// Starts a session: opens the run journal and records the configuration. The engine
    /// (and with it the GPU) starts at the first tool that needs it.
    pub fn new(g: Gathered, cfg: Config) -> Result<Self, String> {
        let session = Session::new(g, cfg).map_err(|e| e.to_string())?;
        Ok(KoptMcp {
            session: Arc::new(Mutex::new(session)),
        })
    }

    /// The session's run folder: its journal and artefacts.
    pub fn run_dir(&self) -> std::path::PathBuf {
        self.lock().run_dir()
    }

    fn lock(&self) -> MutexGuard<'_, Session> {
        // A panicking tool leaves the session as it was before the call.
        self.session.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs a tool off the async runtime: parses its arguments (a mismatch is a JSON-RPC
    /// error), does its blocking work, records the call and its answer in the journal.
    async fn call<T, F>(
        &self,
        tool: &'static str,
        raw: rmcp::model::JsonObject,
        f: F,
    ) -> Result<CallToolResult, ErrorData>
    where
        T: serde::de::DeserializeOwned + Send + 'static,
        F: FnOnce(&mut Session, T) -> Result<Value, ToolError> + Send + 'static,
    {
        let session = self.session.clone();
        let r = tokio::task::spawn_blocking(move || {
            let kernel = raw
                .get("kernel")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let args = Value::Object(raw);
            let mut s = session.lock().unwrap_or_else(|p| p.into_inner());
            let r =
                arguments::<T>(tool, args.clone()).and_then(|a| f(&mut s, a).map_err(tool_error));
            let reply = match &r {
                Ok(v) => v.to_string(),
                Err(e) => format!("error {}: {}", e.code.0, e.message),
            };
            s.record(tool, &kernel, &args, &reply);
            r
        })
        .await
        .map_err(|e| internal(format!("the tool `{tool}` failed: {e}")))?;
        r.map(answer)
    }

    /// Ends the session: the journal's last line, the worker shut down.
    pub fn finish(&self) {
        self.lock().finish();
    }
}

type Raw = Parameters<rmcp::model::JsonObject>;

#[tool_router(server_handler)]
impl KoptMcp {
    #[tool(
        description = "The annotated kernels of the workspace: package, entry, reference source, declared shapes, tunables, accepted variants per architecture (active, stale or corrupt), pending variants, and this session's best candidate and budget.",
        input_schema = input_schema::<NoArgs>()
    )]
    async fn list_kernels(&self, Parameters(raw): Raw) -> Result<CallToolResult, ErrorData> {
        self.call("list_kernels", raw, |s, NoArgs {}| Ok(s.list_kernels()))
            .await
    }

    #[tool(
        description = "For one kernel, the context the built-in loop would send an agent: the reference's bottleneck snapshot (profiled on first use), the structural summary, similar past cases, the current best's source and launch rule, device and ceilings, this session's feedback so far; `system` and `prompt` are the assembled messages, with the proposal schema.",
        input_schema = input_schema::<KernelArgs>()
    )]
    async fn get_context(&self, Parameters(raw): Raw) -> Result<CallToolResult, ErrorData> {
        self.call("get_context", raw, |s, a: KernelArgs| {
            s.get_context(&a.kernel)
        })
        .await
    }

    #[tool(
        description = "Runs the profile collectors (kopt's figures, Nsight Compute where it exists, PTX/SASS, structure) on a kernel's reference or committed variant and one declared shape; answers the bottleneck snapshot with its classification and ranked findings.",
        input_schema = input_schema::<ProfileArgs>()
    )]
    async fn profile(&self, Parameters(raw): Raw) -> Result<CallToolResult, ErrorData> {
        self.call("profile", raw, |s, a: ProfileArgs| s.profile(&a))
            .await
    }

    #[tool(
        description = "Proposes a candidate (full source or a unified diff against the current best, launch rule, defines, NVRTC options, and the reasoning: diagnosis with evidence, each change with why, risks, expected effects). kopt compiles, verifies (numerics on fresh poisoned inputs, held-out shapes, anti-cheat checks, the watchdog against the current best) and measures it; the answer is the layered verdict. A verified candidate faster than the current best becomes a pending variant for `cargo kopt review`, its rationale citing these reasons.",
        input_schema = input_schema::<ProposeArgs>()
    )]
    async fn propose_variant(&self, Parameters(raw): Raw) -> Result<CallToolResult, ErrorData> {
        self.call("propose_variant", raw, |s, a: ProposeArgs| s.propose(a))
            .await
    }

    #[tool(
        description = "A parameter search (tunable defines, so launch geometry, and compile options) around a verified candidate of this session (default: the current best), under the session's evaluation budget. The best point is verified in full; when it beats the candidate it becomes a pending variant and the session's current best (answered as `candidate`, an id for `explain_verdict` and later calls).",
        input_schema = input_schema::<SearchArgs>()
    )]
    async fn search(&self, Parameters(raw): Raw) -> Result<CallToolResult, ErrorData> {
        self.call("search", raw, |s, a: SearchArgs| s.search(&a))
            .await
    }

    #[tool(
        description = "The pending variants waiting for review (`cargo kopt review` accepts or rejects them): kernel, architecture, speedups, status, what accepting would replace.",
        input_schema = input_schema::<NoArgs>()
    )]
    async fn list_pending(&self, Parameters(raw): Raw) -> Result<CallToolResult, ErrorData> {
        self.call("list_pending", raw, |s, NoArgs {}| Ok(s.pending()))
            .await
    }

    #[tool(
        description = "The full verdict on one candidate of this session: every fence's result, per-shape figures, comparisons with the best, the compile log, and the proposal it came from.",
        input_schema = input_schema::<ExplainArgs>()
    )]
    async fn explain_verdict(&self, Parameters(raw): Raw) -> Result<CallToolResult, ErrorData> {
        self.call("explain_verdict", raw, |s, a: ExplainArgs| {
            s.explain(&a.candidate)
        })
        .await
    }
}

/// Serves the session over stdin/stdout until the client disconnects.
pub fn serve_stdio(server: KoptMcp) -> Result<(), String> {
    use rmcp::ServiceExt;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let end = server.clone();
    let r = rt.block_on(async move {
        let running = server
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| format!("the MCP handshake failed: {e}"))?;
        running
            .waiting()
            .await
            .map_err(|e| format!("the MCP session ended with an error: {e}"))?;
        Ok::<(), String>(())
    });
    end.finish();
    r
}
