//! A worker with its caches: the entry point the commands, the search and the agent loop
//! use to evaluate candidates.

use std::path::{Path, PathBuf};

use crate::cache::{self, EvalCache};
use crate::ceilings::CeilingsCache;
use crate::job::EvalJob;
use crate::parent::{Worker, WorkerCommand, WorkerFailure};
use crate::protocol::{Ceilings, CopyTime, DeviceInfo, EvalReport};

/// The outcome of one evaluation.
#[derive(Debug, Clone)]
pub struct Evaluation {
    pub report: Result<EvalReport, WorkerFailure>,
    /// Served from the evaluation cache.
    pub cached: bool,
}

pub struct Engine {
    pub worker: Worker,
    cache: Option<EvalCache>,
    ceilings_cache: CeilingsCache,
    ceilings: Option<Ceilings>,
}

impl Engine {
    /// `cache_dir`: where evaluations are kept (`None`: never cached).
    pub fn new(
        cmd: WorkerCommand,
        cache_dir: Option<PathBuf>,
        ceilings_cache: CeilingsCache,
    ) -> Self {
        Engine {
            worker: Worker::new(cmd),
            cache: cache_dir.map(EvalCache::new),
            ceilings_cache,
            ceilings: None,
        }
    }

    pub fn device(&mut self) -> Result<DeviceInfo, WorkerFailure> {
        self.worker.device()
    }

    /// The device's ceilings: from the cache (keyed by device identity and driver), else
    /// measured now and cached.
    pub fn ceilings(&mut self, refresh: bool) -> Result<Ceilings, WorkerFailure> {
        if let (Some(c), false) = (&self.ceilings, refresh) {
            return Ok(c.clone());
        }
        let dev = self.device()?;
        let c = match self
            .ceilings_cache
            .get(&dev.identity())
            .filter(|_| !refresh)
        {
            Some(c) => c,
            None => {
                let c = self.worker.ceilings()?;
                // A cache that cannot be written only costs a re-measure next time.
                let _ = self.ceilings_cache.put(&c);
                c
            }
        };
        self.ceilings = Some(c.clone());
        Ok(c)
    }

    pub fn evaluate(&mut self, job: &EvalJob, progress: &mut dyn FnMut(&str)) -> Evaluation {
        let dev = match self.device() {
            Ok(d) => d,
            Err(e) => {
                return Evaluation {
                    report: Err(e),
                    cached: false,
                }
            }
        };
        let key = cache::key(job, &dev);
        // A compile failure is never served from the cache: the fix is often outside the
        // key's reach (a header installed, a toolkit fixed), and compiling again is cheap.
        if let Some(hit) = self
            .cache
            .as_ref()
            .and_then(|c| c.get(&key))
            .filter(|r| r.reference.ok && r.candidate.ok)
        {
            return Evaluation {
                report: Ok(hit),
                cached: true,
            };
        }
        let report = self.worker.evaluate(job, progress);
        if let (Ok(r), Some(c)) = (&report, &self.cache) {
            if r.fault.is_none() && r.reference.ok && r.candidate.ok {
                let _ = c.put(&key, r);
            }
        }
        Evaluation {
            report,
            cached: false,
        }
    }

    /// Evaluates `job` now, whatever the cache holds (the result is cached as usual): for
    /// figures that must come from this session, such as a baseline candidates are
    /// compared with, or the same version timed twice to measure the noise.
    pub fn evaluate_now(&mut self, job: &EvalJob, progress: &mut dyn FnMut(&str)) -> Evaluation {
        let report = self.worker.evaluate(job, progress);
        let dev = self.device();
        if let (Ok(r), Some(c), Ok(dev)) = (&report, &self.cache, dev) {
            if r.fault.is_none() {
                let _ = c.put(&cache::key(job, &dev), r);
            }
        }
        Evaluation {
            report,
            cached: false,
        }
    }

    /// Times a one-launch copy of each byte count on the device (not cached: it is a
    /// measurement of this moment, like the bench it serves).
    pub fn copy_times(
        &mut self,
        bytes: &[u64],
        progress: &mut dyn FnMut(&str),
    ) -> Result<Vec<CopyTime>, WorkerFailure> {
        self.worker.copy_times(bytes, progress)
    }

    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache.as_ref().map(|c| c.dir())
    }
}

/// A per-workspace secret mixed into input seeds, so that nobody proposing candidates can
/// predict the inputs; created at first use under `dir`.
pub fn seed_salt(dir: &Path) -> u64 {
    let path = dir.join("seed-salt");
    if let Some(v) = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| t.trim().parse().ok())
    {
        return v;
    }
    let v: u64 = rand::random();
    let _ = kopt_spec::files::write_atomic(&path, v.to_string().as_bytes());
    v
}

/// The base seed of a job: stable for an unchanged candidate (so the evaluation cache can
/// answer), different for any change, and salted.
pub fn base_seed(salt: u64, parts: &[&str]) -> u64 {
    let h = cache::hash_parts(parts);
    u64::from_str_radix(&h[..16], 16).unwrap_or(0) ^ salt
}
