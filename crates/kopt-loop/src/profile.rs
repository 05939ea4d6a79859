//! `cargo kopt profile KERNEL`: the profile data layer and bottleneck snapshot of one
//! version of a kernel on one declared shape. The collectors, the rules and the
//! snapshot are in `kopt_profile`; this module picks the kernel, builds its jobs with the
//! code `cargo kopt __job` uses, lays out the run folder, records the run in its journal,
//! and brings in the case library.
//!
//! Run folder: `<target>/kopt/runs/<run-id>/profile/<kernel>/` (every raw artefact, and
//! `snapshot.json` / `snapshot.txt`), next to the run's `journal.jsonl`.
//!
//! Exit codes: 0 when the snapshot is classified from measurements; 1 when nothing could
//! be measured (no GPU: the snapshot holds what could be produced without one, and says
//! what is missing); 2 for errors (unknown kernel, shape or variant, unwritable folder).

use std::path::PathBuf;
use std::time::Duration;

use kopt_profile::collect::{self, Gpu, NcuChoice, Request};
use kopt_profile::snapshot::{self, Snapshot};
use kopt_store::cases::{self, CaseLibrary};
use kopt_store::journal::{Event, Journal};
use kopt_store::KoptDir;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::eval::{self, Settings};
use kopt_workspace::commands;
use kopt_workspace::gather::Gathered;

/// What `cargo kopt profile` was asked.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub kernel: String,
    /// Index or label (default: the first declared shape).
    pub shape: Option<String>,
    /// A committed variant (default: the reference).
    pub variant: Option<String>,
    pub device: usize,
    pub ncu: NcuChoice,
    /// Architecture for PTX and SASS when no GPU says.
    pub arch: Option<String>,
    /// `--cases PATH`.
    pub cases: Option<PathBuf>,
    pub no_cases: bool,
    /// Measure again even when the engine's cache holds this evaluation.
    pub no_cache: bool,
}

#[derive(Debug, Serialize)]
pub struct ProfileOutcome {
    pub run_id: String,
    /// The run folder's profile of this kernel.
    pub dir: PathBuf,
    pub snapshot: Snapshot,
}

impl ProfileOutcome {
    /// 0 classified; 1 nothing measured.
    pub fn exit_code(&self) -> u8 {
        if self.snapshot.classification.is_some() {
            0
        } else {
            1
        }
    }
}

pub fn profile(
    g: &Gathered,
    o: &Options,
    progress: &mut dyn FnMut(&str),
) -> Result<ProfileOutcome> {
    let k = commands::find(g, &o.kernel)?;
    let version = eval::chosen_version(k, o.variant.as_deref())?;
    let shape = match &o.shape {
        Some(s) => eval::shape_index(k, s)?,
        None => 0,
    };
    let check_job = eval::shape_job(g, k, version.clone(), shape, false)?;
    let timed_job = eval::shape_job(g, k, version, shape, true)?;

    let kopt = KoptDir::new(&g.target_dir);
    let run_id = kopt_store::layout::new_run_id();
    let (mut journal, _) = Journal::open_or_resume(&kopt, &run_id)?;
    let dir = journal.dir().join("profile").join(&k.spec.name);
    journal.append(Event::RunStarted {
        config: serde_json::json!({
            "command": "profile",
            "package": k.package,
            "kernel": k.spec.name,
            "version": check_job.candidate.id,
            "shape": check_job.shapes.first().map(|s| s.label.clone()),
            "device": o.device,
        }),
        budget: serde_json::Value::Null,
    })?;

    let settings = Settings {
        device: o.device,
        use_cache: !o.no_cache,
        ..Settings::default()
    };
    let worker = eval::worker_command(o.device);
    let mut engine = match &worker {
        Ok(_) => Some(eval::engine(g, &settings)?),
        Err(_) => None,
    };
    let gpu = match (&worker, engine.as_mut()) {
        (Ok(cmd), Some(engine)) => {
            engine.worker.step_timeout = Duration::from_secs(60);
            Gpu::Available {
                engine,
                worker_program: cmd.program.clone(),
                worker_args: cmd.args.clone(),
            }
        }
        (Err(why), _) => Gpu::Missing(why.to_string()),
        (Ok(_), None) => Gpu::Missing("the engine could not be set up".into()),
    };
    let collected = collect::run(
        Request {
            kernel: &k.spec.name,
            check_job: &check_job,
            timed_job: &timed_job,
            dir: &dir,
            gpu,
            ncu: o.ncu.clone(),
            arch: o.arch.clone(),
        },
        progress,
    )
    .map_err(|message| Error::File {
        path: dir.clone(),
        message,
        source: None,
    })?;
    let mut snap = snapshot::build(collected);

    // Confidence from past cases, where a library exists.
    if !o.no_cases {
        match cases::library_path(o.cases.as_deref()) {
            Ok(path) if path.is_file() => match CaseLibrary::open(&path) {
                Ok(lib) => {
                    let kind = kopt_store::features::infer_kind(&k.spec.name, &k.reference.text);
                    let text = kopt_store::features::search_text(&check_job.candidate.source);
                    if let Err(e) = snap.use_case_library(&lib, kind, &text) {
                        note(
                            &mut snap,
                            &format!("the case library could not be searched: {e}"),
                        );
                    }
                }
                Err(e) => note(
                    &mut snap,
                    &format!("the case library could not be opened: {e}"),
                ),
            },
            Ok(path) => note(&mut snap, &format!("no case library at {}", path.display())),
            Err(e) => note(&mut snap, &e.to_string()),
        }
    }

    let json = serde_json::to_string_pretty(&snap).expect("serialises") + "\n";
    let text = snap.render(usize::MAX) + "\n";
    for (name, body) in [("snapshot.json", &json), ("snapshot.txt", &text)] {
        let p = dir.join(name);
        kopt_spec::files::write_atomic(&p, body.as_bytes()).map_err(|e| {
            let message = format!("cannot write {}: {e}", p.display());
            Error::file(&p, message, e)
        })?;
    }
    let mut artefacts: Vec<String> = snap
        .collectors
        .iter()
        .flat_map(|c| c.artefacts.iter())
        .chain(["snapshot.json".to_string(), "snapshot.txt".to_string()].iter())
        .map(|a| format!("profile/{}/{a}", k.spec.name))
        .collect();
    artefacts.sort();
    artefacts.dedup();
    let summary = match &snap.classification {
        Some(c) => format!("{} on {}: {}", snap.version, snap.shape, c.label()),
        None => format!(
            "{} on {}: not classified (nothing measured)",
            snap.version, snap.shape
        ),
    };
    journal
        .append(Event::Profile {
            kernel: k.spec.name.clone(),
            candidate: (snap.version != "reference").then(|| snap.version.clone()),
            summary: summary.clone(),
            artefacts,
        })
        .and_then(|_| journal.append(Event::RunFinished { summary }))?;
    Ok(ProfileOutcome {
        run_id,
        dir,
        snapshot: snap,
    })
}

fn note(s: &mut Snapshot, text: &str) {
    if let Some(c) = &mut s.confidence {
        if c.source != "case-library" {
            c.note = format!("{}; {text}", c.note);
        }
    }
}
