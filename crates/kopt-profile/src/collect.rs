//! Running the collectors for one version of a kernel on one shape, keeping every raw
//! artefact in the run folder, and building the snapshot. Each collector is optional:
//! what it needs is checked first, and a collector that cannot run is recorded as
//! skipped (or failed) with the reason, in one line; the snapshot is built from the rest.
//!
//! | collector | needs | artefacts |
//! | --- | --- | --- |
//! | `structure` | the source | `structure.txt` |
//! | `engine` | a GPU (or the fake worker) | `eval-job.json`, `engine-report.json` |
//! | `ncu` | a GPU and `ncu` | `job.json`, `ncu-command.txt`, `ncu.csv`, `ncu.stderr`, `worker-report.json` (and `ncu-sections.*` when the metric list was refused) |
//! | `ptx` | NVRTC | `kernel.ptx` |
//! | `sass` | NVRTC (for a cubin) and `cuobjdump` or `nvdisasm` | `kernel.cubin`, `kernel.sass` |

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kopt_engine::engine::Engine;
use kopt_engine::job::{EvalJob, KernelVersion};
use kopt_spec::spec::ArgValue;

use crate::figures::{self, EngineFigures};
use crate::ncu::{self, Collection};
use crate::sass::{self, CodeSummary};
use crate::snapshot::{Collected, CollectorStatus, Status};
use crate::structure::{self, Env};
use crate::tools;

/// Where the GPU work can run, or why it cannot.
pub enum Gpu<'a> {
    /// The engine, and how to start its worker in oneshot mode for ncu: the program and
    /// the arguments before `--oneshot` (`kopt __worker --device 0`).
    Available {
        engine: &'a mut Engine,
        worker_program: PathBuf,
        worker_args: Vec<String>,
    },
    /// Why not (no driver, no device...).
    Missing(String),
}

/// How to find ncu.
#[derive(Debug, Clone, Default)]
pub struct NcuChoice {
    /// `--ncu PATH`.
    pub explicit: Option<PathBuf>,
    /// `--no-ncu`.
    pub disabled: bool,
    /// Longest an ncu run may take.
    pub timeout: Option<Duration>,
}

/// What to profile.
pub struct Request<'a> {
    pub kernel: &'a str,
    /// The version's job of the one shape, check only (what ncu profiles).
    pub check_job: &'a EvalJob,
    /// The same, timed (what the engine measures).
    pub timed_job: &'a EvalJob,
    /// Where the artefacts go (created if needed).
    pub dir: &'a Path,
    pub gpu: Gpu<'a>,
    pub ncu: NcuChoice,
    /// The architecture to compile PTX and SASS for when no GPU says (`sm_90`).
    pub arch: Option<String>,
}

fn status(
    name: &str,
    status: Status,
    detail: impl Into<String>,
    artefacts: Vec<String>,
) -> CollectorStatus {
    CollectorStatus {
        name: name.to_string(),
        status,
        detail: detail.into(),
        artefacts,
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8], artefacts: &mut Vec<String>) -> Result<(), String> {
    let p = dir.join(name);
    kopt_spec::files::write_atomic(&p, bytes)
        .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    artefacts.push(name.to_string());
    Ok(())
}

fn json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    let mut s = serde_json::to_string_pretty(v).expect("serialises");
    s.push('\n');
    s.into_bytes()
}

/// The launch environment of the version on the job's shape, for the source's trip counts.
pub fn env_of(job: &EvalJob) -> Result<Env, String> {
    let case = job.shapes.first().ok_or("the job has no shape")?;
    let shape = kopt_spec::spec::Shape {
        values: case.values.clone(),
        weight: 1.0,
    };
    let args = job.spec.shape_args(&shape);
    let g = job.candidate.geometry(&job.spec, &args)?;
    let mut values: BTreeMap<String, i64> = case
        .values
        .iter()
        .filter_map(|(k, n)| n.as_i64().map(|v| (k.clone(), v)))
        .collect();
    values.extend(job.candidate.defines.iter().map(|(k, v)| (k.clone(), *v)));
    // Computed kernel arguments are parameters of the source too (`block_size`).
    let computed = job.candidate.arg_values(&job.spec, &case.values)?;
    for (a, v) in job.spec.kernel_args().iter().zip(computed) {
        if let (kopt_spec::spec::KernelArgRef::Computed { def, .. }, ArgValue::Scalar(_, n)) =
            (a, v)
        {
            if let Some(n) = n.as_i64() {
                values.insert(def.name.clone(), n);
            }
        }
    }
    Ok(Env {
        values,
        block: g.block,
        grid: g.grid,
        smem: g.smem,
    })
}

/// `sm_90` -> (9, 0); `sm_100a` -> (10, 0).
pub fn compute_capability(arch: &str) -> Option<(i32, i32)> {
    let digits: String = arch
        .trim_start_matches("sm_")
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    let n: i32 = digits.parse().ok()?;
    Some((n / 10, n % 10))
}

/// Runs every collector that can run; `progress` hears what is going on.
pub fn run(req: Request, progress: &mut dyn FnMut(&str)) -> Result<Collected, String> {
    let Request {
        kernel,
        check_job,
        timed_job,
        dir,
        gpu,
        ncu: ncu_choice,
        arch: arch_hint,
    } = req;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let version: &KernelVersion = &check_job.candidate;
    let shape = check_job
        .shapes
        .first()
        .ok_or("the job has no shape")?
        .label
        .clone();
    let mut c = Collected {
        kernel: kernel.to_string(),
        version: version.id.clone(),
        shape: shape.clone(),
        ..Default::default()
    };

    // (d) The source's structure: always possible.
    progress("structure");
    {
        let mut art = Vec::new();
        match env_of(check_job)
            .and_then(|env| structure::summarize(&version.source, &version.entry, &env))
        {
            Ok(s) => {
                write(
                    dir,
                    "structure.txt",
                    format!("{}\n", s.render()).as_bytes(),
                    &mut art,
                )?;
                c.collectors.push(status(
                    "structure",
                    Status::Ran,
                    format!(
                        "{} loop(s), {} global buffer(s), {} shared array(s), {} atomic(s)",
                        s.loops.len(),
                        s.buffers.len(),
                        s.shared.len(),
                        s.atomics.len()
                    ),
                    art,
                ));
                c.structure = Some(s);
            }
            Err(e) => c
                .collectors
                .push(status("structure", Status::Failed, e, art)),
        }
    }

    // (a) The engine's figures, and (b) ncu: both need the GPU.
    let mut device_arch: Option<String> = None;
    match gpu {
        Gpu::Missing(why) => {
            c.collectors.push(status(
                "engine",
                Status::Skipped,
                format!("needs a GPU: {why}"),
                vec![],
            ));
            c.collectors.push(status(
                "ncu",
                Status::Skipped,
                format!("needs a GPU: {why}"),
                vec![],
            ));
        }
        Gpu::Available {
            engine,
            worker_program,
            worker_args,
        } => {
            progress("engine: evaluating");
            let mut art = Vec::new();
            write(dir, "eval-job.json", &json(timed_job), &mut art)?;
            match figures::collect(engine, timed_job, &shape, progress) {
                Ok((f, report)) => {
                    write(dir, "engine-report.json", &json(&report), &mut art)?;
                    device_arch = Some(f.device.arch.clone());
                    c.collectors
                        .push(status("engine", Status::Ran, engine_line(&f), art));
                    c.engine = Some(f);
                }
                Err(e) => c.collectors.push(status("engine", Status::Failed, e, art)),
            }
            if device_arch.is_none() {
                device_arch = engine.device().ok().map(|d| d.arch);
            }
            let (ncu_status, kernel, collection) = run_ncu(
                check_job,
                dir,
                &ncu_choice,
                &worker_program,
                &worker_args,
                progress,
            )?;
            c.collectors.push(ncu_status);
            c.ncu = kernel;
            c.ncu_collection = collection;
        }
    }

    // (c) PTX and SASS: NVRTC, and a disassembler.
    let (arch, arch_note) = match (device_arch, &arch_hint) {
        (Some(a), _) => (a, "the device's".to_string()),
        (None, Some(a)) => (a.clone(), "--arch".to_string()),
        (None, None) => (
            "sm_90".to_string(),
            "no GPU and no --arch: sm_90 assumed".to_string(),
        ),
    };
    let (ptx_status, sass_status, ptx, sass) = code(version, &arch, &arch_note, dir, progress)?;
    c.collectors.push(ptx_status);
    c.collectors.push(sass_status);
    c.ptx = ptx;
    c.sass = sass;
    // Collectors in a fixed order for the reader.
    let order = ["engine", "ncu", "ptx", "sass", "structure"];
    c.collectors.sort_by_key(|s| {
        order
            .iter()
            .position(|o| *o == s.name)
            .unwrap_or(order.len())
    });
    Ok(c)
}

fn engine_line(f: &EngineFigures) -> String {
    let mut v = Vec::new();
    if let Some(t) = &f.timing {
        v.push(format!("{:.2} µs ({})", t.median_us, t.method));
    }
    if let Some(p) = f.copy_bandwidth_pct {
        v.push(format!("{p:.1}% of copy bandwidth"));
    }
    if let Some(a) = f.attributes {
        v.push(format!(
            "{} registers, {} B local",
            a.registers, a.local_bytes
        ));
    }
    if let Some(o) = f.occupancy {
        v.push(format!("theoretical occupancy {:.0}%", o.percent()));
    }
    if !f.checks_passed {
        v.push(format!("CHECKS FAILED: {}", f.problems.join("; ")));
    } else if !f.problems.is_empty() {
        v.push(format!("note: {}", f.problems.join("; ")));
    }
    format!("{} on {}: {}", f.version, f.device.name, v.join(", "))
}

type NcuResult = (
    CollectorStatus,
    Option<crate::ncu::NcuKernel>,
    Option<Collection>,
);

fn run_ncu(
    check_job: &EvalJob,
    dir: &Path,
    choice: &NcuChoice,
    worker_program: &Path,
    worker_args: &[String],
    progress: &mut dyn FnMut(&str),
) -> Result<NcuResult, String> {
    if choice.disabled {
        return Ok((
            status("ncu", Status::Skipped, "--no-ncu", vec![]),
            None,
            None,
        ));
    }
    let ncu_path = match tools::find("ncu", choice.explicit.as_deref(), "--ncu PATH") {
        Ok(p) => p,
        Err(e) => return Ok((status("ncu", Status::Skipped, e, vec![]), None, None)),
    };
    let mut art = Vec::new();
    write(dir, "job.json", &json(check_job), &mut art)?;
    let target = ncu::Target {
        program: worker_program.to_path_buf(),
        args: worker_args.to_vec(),
        job: dir.join("job.json"),
        report_file: dir.join("worker-report.json"),
    };
    let entry = &check_job.candidate.entry;
    let timeout = choice.timeout.unwrap_or(Duration::from_secs(600));
    let mut commands = String::new();
    let mut attempt = |collection: Collection,
                       stem: &str,
                       art: &mut Vec<String>,
                       commands: &mut String|
     -> Result<ncu::Run, String> {
        progress(&format!(
            "ncu ({})",
            match collection {
                Collection::Metrics => "curated metrics",
                Collection::Sections => "sections",
            }
        ));
        let r = ncu::run(&ncu_path, collection, entry, &target, dir, stem, timeout)?;
        art.push(format!("{stem}.csv"));
        art.push(format!("{stem}.stderr"));
        commands.push_str(&r.command_text());
        commands.push('\n');
        Ok(r)
    };
    let mut run = attempt(Collection::Metrics, "ncu", &mut art, &mut commands)?;
    let mut note = String::new();
    if run.failure(entry).is_some() && run.unknown_metric() {
        note = format!(
            " (the curated metric list was refused: {}; collected by sections instead)",
            run.output.errors().next().unwrap_or("")
        );
        run = attempt(
            Collection::Sections,
            "ncu-sections",
            &mut art,
            &mut commands,
        )?;
    }
    write(dir, "ncu-command.txt", commands.as_bytes(), &mut art)?;
    if dir.join("worker-report.json").is_file() {
        art.push("worker-report.json".into());
    }
    art.sort();
    art.dedup();
    if let Some(why) = run.failure(entry) {
        return Ok((status("ncu", Status::Failed, why, art), None, None));
    }
    let kernel = run
        .output
        .kernels
        .iter()
        .find(|k| &k.name == entry)
        .cloned()
        .expect("failure() found it");
    let detail = format!(
        "{} metrics of one launch of `{entry}` ({}, --clock-control none) from {}{note}",
        kernel.metrics.len(),
        match run.collection {
            Collection::Metrics => "--metrics",
            Collection::Sections => "--section",
        },
        ncu_path.display()
    );
    Ok((
        status("ncu", Status::Ran, detail, art),
        Some(kernel),
        Some(run.collection),
    ))
}

type CodeResult = (
    CollectorStatus,
    CollectorStatus,
    Option<CodeSummary>,
    Option<CodeSummary>,
);

fn code(
    version: &KernelVersion,
    arch: &str,
    arch_note: &str,
    dir: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<CodeResult, String> {
    if !kopt::gpu::nvrtc_present() {
        let why = kopt::Error::NoNvrtc.to_string();
        return Ok((
            status("ptx", Status::Skipped, why.clone(), vec![]),
            status(
                "sass",
                Status::Skipped,
                format!("needs a cubin from NVRTC: {why}"),
                vec![],
            ),
            None,
            None,
        ));
    }
    let options = version.compile_options();
    let opts: Vec<&str> = options.iter().map(String::as_str).collect();
    // A variant whose options name an arch-specific target (sm_90a) is compiled for it.
    let label = match kopt::options_arch(&opts) {
        Some(named) if named != arch => format!("{named} (named by the options), {arch_note}"),
        _ => format!("{arch}, {arch_note}"),
    };
    progress("ptx");
    let (ptx_status, ptx) = match compute_capability(arch) {
        None => (
            status(
                "ptx",
                Status::Failed,
                format!("`{arch}` is not an architecture like sm_90"),
                vec![],
            ),
            None,
        ),
        Some(cc) => match kopt::compile_ptx("profile", &version.id, &version.source, &opts, cc) {
            Ok(p) => {
                let text = p.to_src();
                let mut art = Vec::new();
                write(dir, "kernel.ptx", text.as_bytes(), &mut art)?;
                let s = sass::summarize_ptx(&text);
                (
                    status(
                        "ptx",
                        Status::Ran,
                        format!("{label}: {}", s.one_line()),
                        art,
                    ),
                    Some(s),
                )
            }
            Err(e) => (status("ptx", Status::Failed, e.to_string(), vec![]), None),
        },
    };
    progress("sass");
    let cuobjdump = tools::find("cuobjdump", None, "PATH").ok();
    let nvdisasm = tools::find("nvdisasm", None, "PATH").ok();
    if cuobjdump.is_none() && nvdisasm.is_none() {
        return Ok((
            ptx_status,
            status(
                "sass",
                Status::Skipped,
                format!("neither cuobjdump nor nvdisasm found (looked in {}): install the CUDA toolkit's binary utilities", tools::searched("cuobjdump")),
                vec![],
            ),
            ptx,
            None,
        ));
    }
    let mut art = Vec::new();
    let cubin = match kopt::compile_cubin("profile", &version.id, &version.source, &opts, arch) {
        Ok(b) => b,
        Err(e) => {
            return Ok((
                ptx_status,
                status("sass", Status::Failed, format!("no cubin: {e}"), art),
                ptx,
                None,
            ))
        }
    };
    write(dir, "kernel.cubin", &cubin, &mut art)?;
    match sass::disassemble(
        &dir.join("kernel.cubin"),
        cuobjdump.as_deref(),
        nvdisasm.as_deref(),
    ) {
        Ok((tool, text)) => {
            write(dir, "kernel.sass", text.as_bytes(), &mut art)?;
            let s = sass::summarize_sass(&text);
            let detail = format!("{label}, {}: {}", tool.display(), s.one_line());
            Ok((
                ptx_status,
                status("sass", Status::Ran, detail, art),
                ptx,
                Some(s),
            ))
        }
        Err(e) => Ok((
            ptx_status,
            status("sass", Status::Failed, e, art),
            ptx,
            None,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kopt_engine::job::Seeds;
    use kopt_spec::shapes::ShapeCase;

    /// The source's trip counts read kernel parameters by name: a computed `block_size` is
    /// one, with the candidate's value (its own block).
    #[test]
    fn the_launch_environment_holds_computed_arguments() {
        let item = kopt_spec::spec::parse_item(
            "fn softmax(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, ncols: u32);"
                .parse()
                .unwrap(),
        )
        .unwrap();
        let spec = kopt_spec::spec::parse_kernel(
            "reference = \"k.cu\", entry = \"softmax_f32\", x: [rows * ncols], y: [rows * ncols], args = (x, y, ncols, block_size: i32 = block_x), grid = rows, block = BLOCK, shapes = [{ rows: 8, ncols: 1000 }], tunables = { BLOCK: 256 in [256, 512] }"
                .parse()
                .unwrap(),
            &item,
        )
        .unwrap()
        .0;
        let reference = KernelVersion::reference(&spec, "");
        let mut candidate = reference.clone();
        candidate.defines.insert("BLOCK".into(), 512);
        let job = EvalJob {
            shapes: vec![ShapeCase::declared(&spec.shapes[0])],
            spec,
            reference,
            candidate,
            seeds: Seeds::from_base(1),
            timing: None,
        };
        let env = env_of(&job).unwrap();
        assert_eq!(env.values.get("block_size"), Some(&512));
        assert_eq!(env.values.get("ncols"), Some(&1000));
        assert_eq!(env.block, [512, 1, 1]);
    }
}
