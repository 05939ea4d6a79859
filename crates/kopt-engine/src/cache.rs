//! The evaluation cache: a finished evaluation is kept under a key of everything that
//! could change its outcome, so an unchanged candidate is not measured again.
//!
//! The key covers both versions' sources, entry points, defines, options and launch
//! rules (and pre-compiled PTX); the shapes; the seeds and timing policy (the input
//! policy); and the device's identity and driver. Entries are JSON files named by the
//! key. The key's version changes when the same seeds would draw other inputs (v2:
//! buffers drawn in chunks) or the same outputs would be judged otherwise (v3: each
//! element's error against its row's scale, not only its own value, so that a report
//! cached under the element-wise rule does not keep rejecting a correct kernel).

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::job::EvalJob;
use crate::protocol::{DeviceInfo, EvalReport};

/// SHA-256 over length-prefixed parts (so `["ab", "c"]` and `["a", "bc"]` differ).
pub fn hash_parts(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The cache key of a job on a device, in this process's compile environment
/// ([`kopt::compile_environment`]: NVRTC's version, the CUDA headers it reads, the
/// variables that choose the toolkit), so that a result is never replayed for code that
/// would now compile differently.
pub fn key(job: &EvalJob, device: &DeviceInfo) -> String {
    key_in(job, device, kopt::compile_environment())
}

/// [`key`] under a given compile environment.
pub fn key_in(job: &EvalJob, device: &DeviceInfo, compile_environment: &str) -> String {
    let json = serde_json::to_string(job).expect("jobs serialise");
    hash_parts(&[
        "kopt-eval-v3",
        &json,
        &device.identity(),
        compile_environment,
    ])
}

#[derive(Debug, Clone)]
pub struct EvalCache {
    dir: PathBuf,
}

impl EvalCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        EvalCache { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn get(&self, key: &str) -> Option<EvalReport> {
        let text = std::fs::read_to_string(self.dir.join(format!("{key}.json"))).ok()?;
        // A corrupt entry is a miss, never an error.
        serde_json::from_str(&text).ok()
    }

    pub fn put(&self, key: &str, report: &EvalReport) -> std::io::Result<()> {
        let json = serde_json::to_string(report).expect("reports serialise");
        kopt_spec::files::write_atomic(&self.dir.join(format!("{key}.json")), json.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{KernelVersion, Seeds};
    use crate::worker::fake::fake_device;
    use kopt_spec::shapes::ShapeCase;

    fn job() -> EvalJob {
        let item = kopt_spec::spec::parse_item(
            "fn k(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: u32);"
                .parse()
                .unwrap(),
        )
        .unwrap();
        let spec = kopt_spec::spec::parse_kernel(
            "reference = \"k.cu\", x: [n], y: [n], grid = n, block = 1, shapes = [{ n: 4 }], tunables = { B: [1, 2] }".parse().unwrap(),
            &item,
        )
        .unwrap()
        .0;
        let r = KernelVersion::reference(&spec, "extern \"C\" __global__ void k() {}");
        EvalJob {
            shapes: spec.shapes.iter().map(ShapeCase::declared).collect(),
            reference: r.clone(),
            candidate: r,
            spec,
            seeds: Seeds::from_base(1),
            timing: None,
        }
    }

    #[test]
    fn keys_change_with_every_input_that_matters() {
        let dev = fake_device();
        let base = key(&job(), &dev);
        assert_eq!(base, key(&job(), &dev), "stable");
        let mut j = job();
        j.candidate.source.push(' ');
        assert_ne!(key(&j, &dev), base, "source");
        let mut j = job();
        j.candidate.defines.insert("B".into(), 2);
        assert_ne!(key(&j, &dev), base, "defines");
        let mut j = job();
        j.candidate.options.push("--use_fast_math".into());
        assert_ne!(key(&j, &dev), base, "options");
        let mut j = job();
        j.candidate.ptx = Some(".visible .entry k()".into());
        let with_ptx = key(&j, &dev);
        assert_ne!(with_ptx, base, "pre-compiled PTX");
        j.candidate.ptx = Some(".visible .entry k() // other".into());
        assert_ne!(key(&j, &dev), with_ptx, "another PTX");
        let mut j = job();
        j.candidate.launch.block[0] = kopt_spec::expr::Expr::Int(2);
        assert_ne!(key(&j, &dev), base, "launch rule");
        let mut j = job();
        j.shapes[0]
            .values
            .insert("n".into(), kopt_spec::spec::Number::Int(8));
        assert_ne!(key(&j, &dev), base, "shape");
        let mut j = job();
        j.seeds = Seeds::from_base(2);
        assert_ne!(key(&j, &dev), base, "input policy");
        let mut d = fake_device();
        d.driver_api = 12080;
        assert_ne!(key(&job(), &d), base, "driver");
        let mut d = fake_device();
        d.uuid = "GPU-other".into();
        assert_ne!(key(&job(), &d), base, "device");
        assert_ne!(hash_parts(&["ab", "c"]), hash_parts(&["a", "bc"]));
        // The compile environment: another NVRTC, other headers, another toolkit.
        let env = |s: &str| key_in(&job(), &dev, s);
        let here = "nvrtc Some((13, 0)); shims 1; CUDA_HOME=/usr/local/cuda; include [\"/usr/local/cuda/include\"] 812 files, 0123";
        assert_ne!(
            env(here),
            env(&here.replace("(13, 0)", "(12, 9)")),
            "NVRTC version"
        );
        assert_ne!(
            env(here),
            env(&here.replace("812 files, 0123", "813 files, 4567")),
            "headers"
        );
        assert_ne!(
            env(here),
            env(&here.replace("CUDA_HOME=/usr/local/cuda", "CUDA_HOME=/opt/cuda")),
            "toolkit"
        );
        assert_eq!(key(&job(), &dev), env(kopt::compile_environment()));
    }

    #[test]
    fn corrupt_entries_are_misses() {
        let d = tempfile::tempdir().unwrap();
        let c = EvalCache::new(d.path());
        std::fs::write(d.path().join("abc.json"), "{ not json").unwrap();
        assert!(c.get("abc").is_none());
    }
}
