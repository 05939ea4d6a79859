//! The capture format: what a program's launchers record with `KOPT_CAPTURE=DIR`, and what
//! `cargo kopt verify --inputs`, `bench --inputs`, `optimize --inputs` and
//! `profile --program` read. Written by the `kopt` runtime, read by the CLI and by any
//! other tool: JSON and safetensors, nothing kopt-specific in the tensor files.
//!
//! ```text
//! DIR/
//!   <program>-<pid>-<unix ms>/       one process (several processes may share DIR)
//!     manifest.json                  CaptureManifest
//!     <kernel>/c<case>-l<launch>.safetensors
//!                                    the input buffers (in and inout) of one recorded
//!                                    launch, named by buffer, shaped by their declared
//!                                    dimensions; `__metadata__` holds the kernel, the spec
//!                                    hash, the scalars (JSON) and the launch number
//! ```
//!
//! A case is one kernel with one tuple of scalar arguments. Its launch count is exact; its
//! GPU time is sampled (`timed_launches` of them, with events), and `launches *
//! timed_us / timed_launches` estimates its total.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::spec::{DType, Number};

/// The manifest's format version.
pub const FORMAT: u32 = 1;
/// The manifest's file name in a process's folder.
pub const MANIFEST: &str = "manifest.json";
/// The value of [`CaptureManifest::kind`].
pub const KIND: &str = "kopt-capture";

/// One process's capture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaptureManifest {
    pub format: u32,
    /// Always [`KIND`]: what the file is, for a tool that finds it.
    pub kind: String,
    /// The program's name (its executable's file name).
    pub program: String,
    pub pid: u32,
    /// The device of the first observed launch (`NVIDIA H200`) and its architecture.
    pub device: String,
    pub arch: String,
    /// Milliseconds since the Unix epoch: the first observed launch, and this write.
    pub started_ms: u64,
    pub written_ms: u64,
    pub settings: CaptureSettings,
    /// Bytes of input tensors written so far.
    pub bytes_written: u64,
    pub kernels: Vec<KernelCapture>,
    /// Shadow checks (`KOPT_SHADOW`), when they ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shadow: Vec<ShadowRecord>,
}

/// How the capture was configured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaptureSettings {
    /// Launches of each case whose inputs were kept (the first ones).
    pub inputs_per_case: u32,
    /// The cap on input bytes for the whole process.
    pub max_bytes: u64,
    /// One launch in this many of a case is timed with events, from the first whose
    /// inputs are not kept (`inputs_per_case + 1`).
    pub time_every: u32,
}

/// One annotated kernel's launches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelCapture {
    pub kernel: String,
    #[serde(rename = "crate")]
    pub krate: String,
    /// The hash of the annotation the program was built with (`sha256:...`), as
    /// `kopt.lock` records it: a capture of another annotation is refused.
    pub spec_hash: String,
    pub cases: Vec<CaseCapture>,
}

/// One tuple of scalar arguments of a kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseCapture {
    /// Every scalar argument by name, floats included.
    pub scalars: BTreeMap<String, Number>,
    pub launches: u64,
    /// Launches per version that ran (`reference` or a variant's name).
    pub versions: BTreeMap<String, u64>,
    /// Launches timed with events, and their summed GPU time.
    pub timed_launches: u64,
    pub timed_us: f64,
    /// The launches whose inputs were kept.
    #[serde(default)]
    pub inputs: Vec<InputSample>,
    /// Launches whose inputs were not kept because the byte cap was reached.
    #[serde(default)]
    pub inputs_over_cap: u64,
}

impl CaseCapture {
    /// The mean GPU time of a launch, where any was timed.
    pub fn mean_us(&self) -> Option<f64> {
        (self.timed_launches > 0).then(|| self.timed_us / self.timed_launches as f64)
    }

    /// The estimated GPU time of all its launches: launches times the mean.
    pub fn total_us(&self) -> Option<f64> {
        self.mean_us().map(|m| m * self.launches as f64)
    }

    /// `cols=4096 rows=8`, as kopt labels shapes.
    pub fn label(&self) -> String {
        scalars_label(&self.scalars)
    }
}

/// Scalars as kopt labels a shape: `cols=4096 rows=8`, in name order.
pub fn scalars_label(scalars: &BTreeMap<String, Number>) -> String {
    scalars
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The kept inputs of one launch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputSample {
    /// Relative to the process's folder.
    pub file: String,
    /// Which launch of the case (1 is the first).
    pub launch: u64,
    /// The version that ran it.
    pub version: String,
}

/// What the shadow checks of one kernel found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShadowRecord {
    pub kernel: String,
    /// Launches of an accepted variant that were checked against the reference.
    pub checks: u64,
    /// Checks in which some output element broke the kernel's tolerance rule.
    pub divergences: u64,
    /// Whether the kernel runs the reference for the rest of the process
    /// (`KOPT_SHADOW_FALLBACK=1` after a divergence).
    pub fell_back: bool,
    /// The first divergences, in order.
    pub first: Vec<Divergence>,
}

/// One check in which a variant's output broke the rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    pub variant: String,
    pub scalars: BTreeMap<String, Number>,
    pub buffer: String,
    /// Elements that broke the rule, and the first of them.
    pub failing: u64,
    pub index: u64,
    /// The variant's value and the reference's there: `NaN`, `inf` and `-inf` are written
    /// as those strings (JSON has no such numbers).
    #[serde(with = "float_text")]
    pub got: f64,
    #[serde(with = "float_text")]
    pub want: f64,
    /// What that element was allowed (the rule of [`ToleranceRule`]).
    #[serde(with = "float_text")]
    pub allowed: f64,
}

/// An `f64` as a JSON number, or `"NaN"`, `"inf"`, `"-inf"` where it is not finite (which
/// serde_json would write as `null`, and not read back).
mod float_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else if v.is_nan() {
            s.serialize_str("NaN")
        } else if *v > 0.0 {
            s.serialize_str("inf")
        } else {
            s.serialize_str("-inf")
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Number(f64),
            Text(String),
        }
        match Either::deserialize(d)? {
            Either::Number(v) => Ok(v),
            Either::Text(t) => match t.as_str() {
                "NaN" => Ok(f64::NAN),
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                other => Err(serde::de::Error::custom(format!(
                    "`{other}` is not a number (NaN, inf and -inf are written as text)"
                ))),
            },
        }
    }
}

/// The rule an output element is judged by, in the engine's numeric fence and in the
/// launchers' shadow checks alike:
/// `|got - want| <= max(atol + rtol * max(|want|, rms), lambda * u_acc * sqrt(n) * rms +
/// 2 * u_out * |want|)`, `rms` the RMS of the reference's finite values in the element's
/// row (`n` elements; a buffer whose length is no product is one row, and its noise term
/// assumes no reduction, `n = 1`); NaN and Inf never pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ToleranceRule {
    pub rtol: f64,
    pub atol: f64,
    /// `lambda * u_acc * sqrt(n)`, the noise floor's factor on the row's RMS.
    pub noise_of_rms: f64,
    /// `2 * u_out`, its factor on `|want|`.
    pub two_u_out: f64,
    /// Elements that share one RMS: the last declared dimension, or the whole buffer.
    pub row_len: u64,
    /// Whether the rows are declared (a product length) or the buffer is one flat group.
    pub declared_rows: bool,
}

/// The factor of the rounding-noise floor: Higham and Mary's probabilistic bound for a
/// reduction of `n` terms, `lambda * sqrt(n) * u`, holds with probability at least
/// `1 - 2 exp(-lambda^2 / 2)`; 6 makes that one in thirty million per reduction.
pub const NOISE_LAMBDA: f64 = 6.0;

impl ToleranceRule {
    /// The rule for an output of `dtype` judged by `tolerance`, `elements` long, whose
    /// declared dimensions end with `last`: rows of that dimension when it divides the
    /// length, else one row whose noise floor assumes no reduction (one over a whole
    /// flat buffer would loosen a 67M-element output by a factor of 8192).
    pub fn new(
        dtype: crate::spec::DType,
        tolerance: crate::spec::Tolerance,
        elements: usize,
        last: Option<u64>,
    ) -> ToleranceRule {
        let row = last
            .map(|len| len as usize)
            .filter(|len| *len > 0 && elements.is_multiple_of(*len));
        ToleranceRule {
            rtol: tolerance.rtol,
            atol: tolerance.atol,
            noise_of_rms: NOISE_LAMBDA
                * dtype.accumulation_unit_roundoff()
                * (row.unwrap_or(1) as f64).sqrt(),
            two_u_out: 2.0 * dtype.unit_roundoff(),
            row_len: row.unwrap_or(elements).max(1) as u64,
            declared_rows: row.is_some(),
        }
    }

    /// The rule for output `b` of `n` elements at these scalar arguments.
    pub fn for_buffer(
        spec: &crate::KernelSpec,
        b: &crate::spec::Buffer,
        n: usize,
        args: &[i64],
    ) -> ToleranceRule {
        let last = crate::shapes::buffer_dims(&b.len, spec, args)
            .and_then(|d| d.last().map(|(_, len)| *len));
        ToleranceRule::new(b.dtype, b.effective_tolerance(spec), n, last)
    }

    /// The largest `|got - want|` allowed for an element whose reference value is `want`
    /// in a row of RMS `rms`.
    pub fn allowed(&self, want: f64, rms: f64) -> f64 {
        let w = want.abs();
        (self.atol + self.rtol * w.max(rms)).max(self.noise_of_rms * rms + self.two_u_out * w)
    }
}

/// A tensor of a safetensors file.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Little-endian elements, as on the device.
    pub data: Vec<u8>,
}

/// The safetensors name of a dtype.
pub fn safetensors_dtype(d: DType) -> &'static str {
    match d {
        DType::F64 => "F64",
        DType::F32 => "F32",
        DType::F16 => "F16",
        DType::Bf16 => "BF16",
        DType::I64 => "I64",
        DType::I32 => "I32",
        DType::I16 => "I16",
        DType::I8 => "I8",
        DType::U64 => "U64",
        DType::U32 => "U32",
        DType::U16 => "U16",
        DType::U8 => "U8",
    }
}

fn dtype_of_safetensors(s: &str) -> Option<DType> {
    DType::ALL
        .iter()
        .copied()
        .find(|d| safetensors_dtype(*d) == s)
}

/// A safetensors file of `tensors` in order, with `metadata` as its `__metadata__`: an
/// 8-byte little-endian header length, the JSON header (padded with spaces to a multiple
/// of 8, as the reference implementation does), then the tensors' bytes.
pub fn write_safetensors(tensors: &[&Tensor], metadata: &BTreeMap<String, String>) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        header.insert("__metadata__".into(), serde_json::json!(metadata));
    }
    let mut offset = 0u64;
    for t in tensors {
        let end = offset + t.data.len() as u64;
        header.insert(
            t.name.clone(),
            serde_json::json!({
                "dtype": safetensors_dtype(t.dtype),
                "shape": t.shape,
                "data_offsets": [offset, end],
            }),
        );
        offset = end;
    }
    let mut text = serde_json::to_string(&header).expect("headers serialise");
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut out = Vec::with_capacity(8 + text.len() + offset as usize);
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    for t in tensors {
        out.extend_from_slice(&t.data);
    }
    out
}

/// The tensors and metadata of a safetensors file, checked: the header's length, each
/// tensor's dtype, its shape against its byte range, and the ranges against the file.
pub fn read_safetensors(bytes: &[u8]) -> Result<(Vec<Tensor>, BTreeMap<String, String>), String> {
    let len = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or("shorter than the 8-byte header length")?;
    let end = 8usize
        .checked_add(usize::try_from(len).map_err(|_| "header length out of range")?)
        .filter(|e| *e <= bytes.len())
        .ok_or_else(|| format!("the header's length ({len} bytes) runs past the file"))?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..end])
        .map_err(|e| format!("the header is not a JSON object: {e}"))?;
    let data = &bytes[end..];
    let mut metadata = BTreeMap::new();
    let mut tensors = Vec::new();
    for (name, v) in header {
        if name == "__metadata__" {
            for (k, v) in v.as_object().ok_or("__metadata__ is not an object")? {
                let s = v
                    .as_str()
                    .ok_or_else(|| format!("__metadata__ `{k}` is not a string"))?;
                metadata.insert(k.clone(), s.to_string());
            }
            continue;
        }
        let bad = |what: &str| format!("tensor `{name}`: {what}");
        let dtype = v["dtype"]
            .as_str()
            .and_then(dtype_of_safetensors)
            .ok_or_else(|| bad(&format!("dtype {} is not one kopt reads", v["dtype"])))?;
        let shape: Vec<u64> = serde_json::from_value(v["shape"].clone())
            .map_err(|_| bad("shape is not a list of sizes"))?;
        let [from, to]: [u64; 2] = serde_json::from_value(v["data_offsets"].clone())
            .map_err(|_| bad("data_offsets is not [begin, end]"))?;
        let elements: u64 = shape.iter().product();
        if to < from || to > data.len() as u64 {
            return Err(bad(&format!(
                "data_offsets [{from}, {to}] lie outside the {} data bytes",
                data.len()
            )));
        }
        if to - from != elements * dtype.size() as u64 {
            return Err(bad(&format!(
                "{} bytes for shape {shape:?} of {}",
                to - from,
                safetensors_dtype(dtype)
            )));
        }
        tensors.push(Tensor {
            name,
            dtype,
            shape,
            data: data[from as usize..to as usize].to_vec(),
        });
    }
    Ok((tensors, metadata))
}

/// A process's capture as read: its folder and its manifest.
#[derive(Debug, Clone)]
pub struct CaptureRun {
    pub dir: PathBuf,
    pub manifest: CaptureManifest,
}

/// The captures under `dir`: `dir` itself when it holds a manifest, else each folder in
/// it that does (in name order). An error names the file and what is wrong with it; a
/// folder without any capture is an error too.
pub fn load(dir: &Path) -> Result<Vec<CaptureRun>, String> {
    let read = |d: &Path| -> Result<CaptureRun, String> {
        let path = d.join(MANIFEST);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let manifest: CaptureManifest = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not a kopt capture manifest: {e}", path.display()))?;
        if manifest.kind != KIND || manifest.format != FORMAT {
            return Err(format!(
                "{} is a `{}` of format {}; this kopt reads `{KIND}` format {FORMAT}",
                path.display(),
                manifest.kind,
                manifest.format
            ));
        }
        Ok(CaptureRun {
            dir: d.to_path_buf(),
            manifest,
        })
    };
    if dir.join(MANIFEST).is_file() {
        return Ok(vec![read(dir)?]);
    }
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join(MANIFEST).is_file())
        .collect();
    dirs.sort();
    if dirs.is_empty() {
        return Err(format!(
            "{} holds no capture (no {MANIFEST} in it or in its folders): run the program with KOPT_CAPTURE={} first",
            dir.display(),
            dir.display()
        ));
    }
    dirs.iter().map(|d| read(d)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, dtype: DType, shape: &[u64]) -> Tensor {
        let n: u64 = shape.iter().product();
        Tensor {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            data: (0..n * dtype.size() as u64).map(|i| i as u8).collect(),
        }
    }

    #[test]
    fn safetensors_round_trip_with_metadata() {
        let a = tensor("x", DType::F32, &[2, 3]);
        let b = tensor("ids", DType::I32, &[5]);
        let meta = BTreeMap::from([("kernel".to_string(), "softmax".to_string())]);
        let bytes = write_safetensors(&[&a, &b], &meta);
        let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap());
        assert_eq!(header_len % 8, 0, "padded to 8 bytes");
        let (tensors, m) = read_safetensors(&bytes).unwrap();
        assert_eq!(m, meta);
        let mut want = vec![a, b];
        want.sort_by(|p, q| p.name.cmp(&q.name));
        let mut got = tensors;
        got.sort_by(|p, q| p.name.cmp(&q.name));
        assert_eq!(got, want);
    }

    #[test]
    fn the_reference_implementation_reads_what_kopt_writes_and_kopt_reads_what_it_writes() {
        let a = tensor("x", DType::Bf16, &[3, 4]);
        let b = tensor("ids", DType::U32, &[7]);
        let meta = BTreeMap::from([("scalars".to_string(), "{\"n\":7}".to_string())]);
        let bytes = write_safetensors(&[&a, &b], &meta);
        let (_, m) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(m.metadata().as_ref().unwrap()["scalars"], "{\"n\":7}");
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let x = st.tensor("x").unwrap();
        assert_eq!(x.dtype(), safetensors::Dtype::BF16);
        assert_eq!(x.shape(), [3, 4]);
        assert_eq!(x.data(), &a.data[..]);
        assert_eq!(st.tensor("ids").unwrap().data(), &b.data[..]);

        let views = [(
            "w",
            safetensors::tensor::TensorView::new(
                safetensors::Dtype::F16,
                vec![2, 2],
                &[1, 2, 3, 4, 5, 6, 7, 8],
            )
            .unwrap(),
        )];
        let theirs = safetensors::serialize(views, None).unwrap();
        let (tensors, _) = read_safetensors(&theirs).unwrap();
        assert_eq!(tensors[0].name, "w");
        assert_eq!(tensors[0].dtype, DType::F16);
        assert_eq!(tensors[0].data, [1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn a_damaged_safetensors_file_says_what_is_wrong() {
        let a = tensor("x", DType::F16, &[4]);
        let bytes = write_safetensors(&[&a], &BTreeMap::new());
        let err = read_safetensors(&bytes[..bytes.len() - 1]).unwrap_err();
        assert!(
            err.contains("tensor `x`: data_offsets [0, 8] lie outside"),
            "{err}"
        );
        let err = read_safetensors(&bytes[..4]).unwrap_err();
        assert!(err.contains("shorter than the 8-byte header"), "{err}");
        let text = String::from_utf8_lossy(&bytes).replace("\"F16\"", "\"F8\" ");
        let err = read_safetensors(text.as_bytes()).unwrap_err();
        assert!(err.contains("dtype \"F8\" is not one kopt reads"), "{err}");
    }

    #[test]
    fn a_divergence_with_nan_and_infinity_survives_json() {
        let d = Divergence {
            variant: "v".into(),
            scalars: BTreeMap::new(),
            buffer: "y".into(),
            failing: 3,
            index: 17,
            got: f64::NAN,
            want: f64::INFINITY,
            allowed: 1e-4,
        };
        let text = serde_json::to_string(&d).unwrap();
        assert!(
            text.contains("\"got\":\"NaN\",\"want\":\"inf\",\"allowed\":0.0001"),
            "{text}"
        );
        let back: Divergence = serde_json::from_str(&text).unwrap();
        assert!(back.got.is_nan() && back.want == f64::INFINITY && back.allowed == 1e-4);
        assert!(serde_json::from_str::<Divergence>(&text.replace("\"NaN\"", "\"big\"")).is_err());
    }

    #[test]
    fn the_estimates_of_a_case() {
        let c = CaseCapture {
            scalars: BTreeMap::from([
                ("rows".to_string(), Number::Int(8)),
                ("eps".to_string(), Number::Float(1e-5)),
            ]),
            launches: 100,
            versions: BTreeMap::new(),
            timed_launches: 4,
            timed_us: 10.0,
            inputs: vec![],
            inputs_over_cap: 0,
        };
        assert_eq!(c.mean_us(), Some(2.5));
        assert_eq!(c.total_us(), Some(250.0));
        assert_eq!(c.label(), "eps=1e-5 rows=8");
    }
}
