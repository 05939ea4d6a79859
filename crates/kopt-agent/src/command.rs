//! An external command as the agent: the request as JSON on its stdin, the response as
//! JSON on its stdout (`{"text": "...", "usage": {...}}`, usage optional). One process per
//! request, so the command may be a script in any language.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::backend::{Backend, BackendError};
use crate::chat::{ChatRequest, ChatResponse, Usage};

pub struct External {
    pub program: PathBuf,
    pub timeout: Duration,
}

#[derive(Deserialize)]
struct Reply {
    text: String,
    #[serde(default)]
    usage: Usage,
    #[serde(default)]
    model: Option<String>,
}

impl Backend for External {
    fn name(&self) -> String {
        format!("cmd:{}", self.program.display())
    }

    fn complete(&mut self, req: &ChatRequest) -> Result<ChatResponse, BackendError> {
        let mut child = Command::new(&self.program)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                BackendError::Fatal(format!("cannot run {}: {e}", self.program.display()))
            })?;
        let input = serde_json::to_vec(req).expect("requests serialise");
        let mut stdin = child.stdin.take().expect("piped");
        // Written from a thread so a command that answers before reading cannot deadlock us.
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let mut stdout = child.stdout.take().expect("piped");
        let reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            s
        });
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child
                .try_wait()
                .map_err(|e| BackendError::Fatal(e.to_string()))?
            {
                break s;
            }
            if start.elapsed() > self.timeout {
                let _ = child.kill();
                let _ = child.wait();
                return Err(BackendError::Timeout(self.timeout));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let _ = writer.join();
        let out = reader.join().unwrap_or_default();
        if !status.success() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return Err(BackendError::Fatal(format!(
                "{} exited with {status}: {}",
                self.program.display(),
                err.trim()
            )));
        }
        let reply: Reply = serde_json::from_str(out.trim())
            .map_err(|e| BackendError::Malformed(format!("{}: {e}", self.program.display())))?;
        Ok(ChatResponse {
            text: reply.text,
            usage: reply.usage,
            model: reply.model.unwrap_or_else(|| self.name()),
        })
    }
}
