//! Shape arithmetic: the shapes a version is checked and timed on, the bytes a shape's
//! buffers take, the coordinates of a flat index, and the held-out shapes derived from the
//! declared ones ([`held_out_shapes`]). The engine's jobs, the loop and the tests all take
//! them from here.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::expr::{self, Expr};
use crate::spec::{KernelSpec, Number, Shape};

/// A shape to check (and maybe time).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShapeCase {
    pub label: String,
    pub values: BTreeMap<String, Number>,
    /// Derived from the declared shapes, never shown to an agent.
    pub held_out: bool,
    /// Timed as well as checked (declared shapes are; held-out ones only checked).
    pub timed: bool,
    /// Inputs a program's launch recorded (`KOPT_CAPTURE`), used instead of drawn ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub captured: Option<CapturedInputs>,
}

/// The recorded inputs of one launch of a captured case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapturedInputs {
    /// The safetensors file holding its input buffers by name.
    pub file: std::path::PathBuf,
    /// How many launches of this case the program made (the bench's weight).
    pub launches: u64,
}

impl ShapeCase {
    pub fn declared(shape: &Shape) -> Self {
        ShapeCase {
            label: crate::spec::shape_label(shape),
            values: shape.values.clone(),
            held_out: false,
            timed: true,
            captured: None,
        }
    }
}

mod held_out;
pub use held_out::{
    held_out_byte_cap, held_out_label, held_out_shapes, held_out_shapes_for, parse_held_out_label,
    seed_independent_held_out_shapes, shape_is_valid,
};

/// The bytes a shape ideally moves: the annotation's `bytes` (every buffer once when it
/// gives none), for bandwidth figures. A kernel that reads part of its buffers (a paged KV
/// cache's pool, of which the sequences hold half) declares what it reads; where the
/// expression cannot be evaluated, the buffers' total.
pub fn ideal_bytes(spec: &KernelSpec, args: &[i64]) -> u64 {
    spec.compile_expr(&spec.bytes, &BTreeMap::new())
        .ok()
        .and_then(|p| expr::eval(&p, args).ok())
        .filter(|b| *b > 0)
        .map_or_else(|| shape_bytes(spec, args), |b| b as u64)
}

/// Total bytes of the buffers of a shape: the memory it takes.
pub fn shape_bytes(spec: &KernelSpec, args: &[i64]) -> u64 {
    spec.buffers()
        .filter_map(|b| {
            spec.compile_expr(&b.len, &BTreeMap::new())
                .ok()
                .and_then(|p| expr::eval(&p, args).ok())
                .map(|n| n.max(0) as u64 * b.dtype.size() as u64)
        })
        .sum()
}

/// The logical dimensions of a buffer, when its length is a product of factors
/// (`rows * cols` -> [rows, cols]): used to report a failing element's coordinates.
pub fn buffer_dims(len: &Expr, spec: &KernelSpec, args: &[i64]) -> Option<Vec<(String, u64)>> {
    fn factors<'a>(e: &'a Expr, out: &mut Vec<&'a Expr>) {
        match e {
            Expr::Binary(expr::BinOp::Mul, a, b) => {
                factors(a, out);
                factors(b, out);
            }
            other => out.push(other),
        }
    }
    let mut fs = Vec::new();
    factors(len, &mut fs);
    if fs.len() < 2 {
        return None;
    }
    fs.iter()
        .map(|f| {
            let v = spec
                .compile_expr(f, &BTreeMap::new())
                .ok()
                .and_then(|p| expr::eval(&p, args).ok())?;
            Some((f.to_string(), u64::try_from(v).ok()?))
        })
        .collect()
}

/// `index` as coordinates in `dims` (row-major).
pub fn coordinates(index: u64, dims: &[(String, u64)]) -> Vec<(String, u64)> {
    let mut rem = index;
    let mut out = vec![(String::new(), 0); dims.len()];
    for (i, (name, d)) in dims.iter().enumerate().rev() {
        let d = (*d).max(1);
        out[i] = (name.clone(), rem % d);
        rem /= d;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ideal_bytes_are_the_annotations_and_memory_is_the_buffers() {
        let s = tiny_spec();
        // No `bytes`: every buffer once.
        assert_eq!(ideal_bytes(&s, &[16, 64]), 2 * 16 * 64 * 4);
        let item = crate::spec::parse_item(
            "pub fn rows_of(s: &CudaStream, pool: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);"
                .parse()
                .unwrap(),
        )
        .unwrap();
        // A pool of which the kernel reads one row per output.
        let (read, _) = crate::spec::parse_kernel(
            "reference = \"k.cu\", pool: [rows * cols * 8], y: [rows * cols], bytes = 2 * rows * cols * 4, grid = rows, block = 256, shapes = [{ rows: 16, cols: 64 }]"
                .parse()
                .unwrap(),
            &item,
        )
        .unwrap();
        assert_eq!(ideal_bytes(&read, &[16, 64]), 2 * 16 * 64 * 4);
        assert_eq!(shape_bytes(&read, &[16, 64]), 9 * 16 * 64 * 4);
    }

    fn tiny_spec() -> KernelSpec {
        let item = crate::spec::parse_item(
            "pub fn softmax(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);"
                .parse()
                .unwrap(),
        )
        .unwrap();
        crate::spec::parse_kernel(
            "reference = \"k.cu\", x: [rows * cols], y: [rows * cols], grid = rows, block = 256, shapes = [{ rows: 4096, cols: 4096 }, { rows: 16, cols: 65536 }], constraints = [cols % 4 == 0]"
                .parse()
                .unwrap(),
            &item,
        )
        .unwrap()
        .0
    }

    #[test]
    fn held_out_shapes_are_new_valid_and_deterministic() {
        let spec = tiny_spec();
        let a = held_out_shapes(&spec, None, 42, 2, 1 << 30);
        let b = held_out_shapes(&spec, None, 42, 2, 1 << 30);
        assert_eq!(a, b, "deterministic under a seed");
        // The seed-independent shapes, then two seeded ones per declared shape.
        let fixed = seed_independent_held_out_shapes(&spec, &spec.default_defines(), None, 1 << 30);
        assert_eq!(a.len(), fixed.len() + 4);
        for s in &a {
            assert!(s.held_out && !s.timed);
            let cols = s.values["cols"].as_i64().unwrap();
            assert_eq!(cols % 4, 0, "constraint holds: {s:?}");
            let args = spec.shape_args(&Shape {
                values: s.values.clone(),
                weight: 1.0,
            });
            assert!(
                !spec.shapes.iter().any(|d| spec.shape_args(d) == args),
                "not a declared shape"
            );
        }
        let c = held_out_shapes(&spec, None, 7, 2, 1 << 30);
        assert_ne!(a, c, "another seed, other shapes");
        let region = spec.parse_region("rows >= 1000").unwrap();
        for s in held_out_shapes(&spec, Some(&region), 42, 2, 1 << 30) {
            assert!(
                s.values["rows"].as_i64().unwrap() >= 1000,
                "inside the region"
            );
        }
        // Under a 1000-byte cap only the smallest sizes fit (16 rows of 4 columns: 512
        // bytes); under 100 bytes, nothing.
        let small = held_out_shapes(&spec, None, 42, 2, 1000);
        assert!(!small.is_empty());
        for s in &small {
            let args = spec.shape_args(&Shape {
                values: s.values.clone(),
                weight: 1.0,
            });
            assert!(shape_bytes(&spec, &args) <= 1000, "memory cap: {}", s.label);
        }
        assert!(
            held_out_shapes(&spec, None, 42, 2, 100).is_empty(),
            "memory cap"
        );
    }

    #[test]
    fn held_out_shapes_respect_the_versions_own_defines() {
        let item = crate::spec::parse_item(
            "fn k(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);"
                .parse()
                .unwrap(),
        )
        .unwrap();
        let spec = crate::spec::parse_kernel(
            "reference = \"k.cu\", x: [rows * cols], y: [rows], grid = rows, block = 256, shapes = [{ rows: 64, cols: 4096 }, { rows: 16, cols: 65536 }], tunables = { VEC: [1, 2, 4, 8] }, constraints = [cols % VEC == 0]"
                .parse()
                .unwrap(),
            &item,
        )
        .unwrap()
        .0;
        let odd = |shapes: &[ShapeCase]| {
            shapes
                .iter()
                .any(|s| s.values["cols"].as_i64().unwrap() % 8 != 0)
        };
        // At the defaults (VEC=1) odd column counts are fair game...
        let mut any_odd = false;
        for seed in 0..20 {
            any_odd |= odd(&held_out_shapes(&spec, None, seed, 3, 1 << 30));
        }
        assert!(any_odd);
        // ... but never for a version built with VEC=8.
        let mut d = spec.default_defines();
        d.insert("VEC".into(), 8);
        for seed in 0..20 {
            let shapes = held_out_shapes_for(&spec, &d, None, seed, 3, 1 << 30);
            assert!(!shapes.is_empty());
            assert!(!odd(&shapes), "{shapes:?}");
        }
    }

    #[test]
    fn held_out_shapes_keep_fixed_contents_and_computed_arguments_valid() {
        let item = crate::spec::parse_item(
            "fn k(s: &CudaStream, info: &CudaSlice<u32>, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32, n: u32);"
                .parse()
                .unwrap(),
        )
        .unwrap();
        // `info` holds exactly 2 values: a shape with another `n` cannot be filled. `total`
        // is an i32: a shape with more than 2^31 elements cannot be launched.
        let spec = crate::spec::parse_kernel(
            "reference = \"k.cu\", info: [n] values(rows, cols), x: [rows * cols], y: [rows * cols], args = (info, x, y, total: i32 = rows * cols), grid = rows, block = 256, shapes = [{ rows: 32768, cols: 65535, n: 2 }, { rows: 64, cols: 4096, n: 2 }]"
                .parse()
                .unwrap(),
            &item,
        )
        .unwrap()
        .0;
        let mut seen = 0;
        for seed in 0..10 {
            for s in held_out_shapes(&spec, None, seed, 4, u64::MAX) {
                seen += 1;
                assert_eq!(s.values["n"], Number::Int(2), "{s:?}");
                let rows = s.values["rows"].as_i64().unwrap();
                let cols = s.values["cols"].as_i64().unwrap();
                assert!(rows * cols <= i32::MAX as i64, "{s:?}");
            }
        }
        assert!(seen > 20, "{seen}");
    }

    #[test]
    fn coordinates_of_a_flat_index() {
        let spec = tiny_spec();
        let dims = buffer_dims(
            &spec
                .params
                .iter()
                .find_map(|p| match p {
                    crate::spec::Param::Buffer(b) => Some(b.len.clone()),
                    _ => None,
                })
                .unwrap(),
            &spec,
            &[16, 65536],
        )
        .unwrap();
        assert_eq!(dims, vec![("rows".into(), 16), ("cols".into(), 65536)]);
        assert_eq!(
            coordinates(65536 * 3 + 17, &dims),
            vec![("rows".into(), 3), ("cols".into(), 17)]
        );
    }
}
