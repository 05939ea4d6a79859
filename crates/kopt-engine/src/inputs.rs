//! Input buffers for verification: seeded draws from each buffer's declared distribution,
//! and the poison written into outputs before every run.

use std::collections::BTreeMap;

use half::{bf16, f16};
use kopt_spec::expr;
use kopt_spec::spec::{Buffer, DType, Distribution, KernelSpec};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution as _, Normal, Uniform};

/// Which variation of the declared distributions a check uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variation {
    /// As declared.
    Declared,
    /// Normals shifted by one standard deviation: outputs that cancel on symmetric data
    /// (or a kernel that only works on centred inputs) show up.
    Shifted,
}

impl Variation {
    pub fn name(self) -> &'static str {
        match self {
            Variation::Declared => "declared",
            Variation::Shifted => "shifted",
        }
    }
}

/// Host bytes of a buffer, in the dtype's device layout (little-endian).
pub type Bytes = Vec<u8>;

/// The per-buffer seed: distinct buffers never share a stream of numbers.
fn buffer_seed(seed: u64, index: usize) -> u64 {
    seed ^ (index as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03)
}

/// Elements drawn from one generator; larger buffers are drawn chunk by chunk, each chunk
/// from its own generator (chunk 0 from the buffer's seed), so that the values depend
/// only on the seed, never on how many threads drew them.
pub const CHUNK: usize = 1 << 16;

/// Buffers at least this large are drawn on several threads.
const PARALLEL_FROM: usize = 4 * CHUNK;

fn chunk_seed(seed: u64, chunk: usize) -> u64 {
    if chunk == 0 {
        seed
    } else {
        seed ^ (chunk as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(17)
    }
}

/// Fills an input buffer of `n` elements.
pub fn fill(
    buffer: &Buffer,
    spec: &KernelSpec,
    args: &[i64],
    n: usize,
    seed: u64,
    variation: Variation,
) -> Result<Bytes, String> {
    // Fixed contents: the same for every seed and variation (only the shape changes them).
    if let Some(values) = buffer.fixed_values(spec, args) {
        let values = values?;
        if values.len() != n {
            return Err(format!(
                "`{}`: {} values for a buffer of {n} elements",
                buffer.name,
                values.len()
            ));
        }
        let dtype = buffer.dtype;
        let mut out = vec![0u8; n * dtype.size()];
        for (cell, &v) in out.chunks_exact_mut(dtype.size()).zip(&values) {
            if dtype.is_float() {
                put_float(dtype, cell, v as f64);
            } else {
                put_int(dtype, cell, v);
            }
        }
        return Ok(out);
    }
    let dist = buffer.distribution.clone().unwrap_or(Distribution::Normal {
        mean: 0.0,
        std: 1.0,
    });
    // Resolve the distribution once (errors before any drawing).
    enum Draw {
        Normal(Normal<f64>),
        Uniform(Uniform<f64>),
        Range(i64, i64),
    }
    let draw = match (&dist, buffer.dtype.is_float()) {
        (Distribution::Normal { mean, std }, true) => {
            let mean = if variation == Variation::Shifted {
                mean + std
            } else {
                *mean
            };
            Draw::Normal(Normal::new(mean, *std).map_err(|e| e.to_string())?)
        }
        (Distribution::Uniform { lo, hi }, true) => {
            Draw::Uniform(Uniform::new(*lo, *hi).map_err(|e| e.to_string())?)
        }
        (Distribution::Range { .. } | Distribution::Spread { .. }, true) => {
            return Err(format!(
                "`{}`: an integer range on a float buffer",
                buffer.name
            ))
        }
        (Distribution::Range { lo, hi } | Distribution::Spread { lo, hi }, false) => {
            let eval = |e: &kopt_spec::expr::Expr| -> Result<i64, String> {
                let p = spec.compile_expr(e, &BTreeMap::new())?;
                expr::eval(&p, args).map_err(|err| format!("`{e}`: {err}"))
            };
            let (lo, hi) = (eval(lo)?, eval(hi)?);
            if lo >= hi {
                return Err(format!(
                    "`{}`: the range {lo}..{hi} is empty for this shape",
                    buffer.name
                ));
            }
            if matches!(dist, Distribution::Spread { .. }) {
                return Ok(spread(buffer.dtype, lo, hi, n, seed));
            }
            Draw::Range(lo, hi)
        }
        (_, false) => {
            return Err(format!(
                "`{}`: integer buffers take `range(lo..hi)`",
                buffer.name
            ))
        }
        (Distribution::Values { .. }, true) => unreachable!("fixed contents are written above"),
    };
    let dtype = buffer.dtype;
    let size = dtype.size();
    let fill_chunk = |chunk: usize, out: &mut [u8]| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(chunk_seed(seed, chunk));
        for cell in out.chunks_exact_mut(size) {
            match &draw {
                Draw::Normal(d) => put_float(dtype, cell, d.sample(&mut rng)),
                Draw::Uniform(d) => put_float(dtype, cell, d.sample(&mut rng)),
                Draw::Range(lo, hi) => put_int(dtype, cell, rng.random_range(*lo..*hi)),
            }
        }
    };
    let mut out = vec![0u8; n * size];
    if n < PARALLEL_FROM {
        for (c, part) in out.chunks_mut(CHUNK * size).enumerate() {
            fill_chunk(c, part);
        }
    } else {
        let threads = std::thread::available_parallelism()
            .map(|t| t.get())
            .unwrap_or(1)
            .clamp(1, 16);
        let mut parts: Vec<Vec<(usize, &mut [u8])>> = (0..threads).map(|_| Vec::new()).collect();
        for (c, part) in out.chunks_mut(CHUNK * size).enumerate() {
            parts[c % threads].push((c, part));
        }
        std::thread::scope(|s| {
            for mine in parts {
                let fill_chunk = &fill_chunk;
                s.spawn(move || {
                    for (c, part) in mine {
                        fill_chunk(c, part);
                    }
                });
            }
        });
    }
    Ok(out)
}

fn put_float(dtype: DType, cell: &mut [u8], v: f64) {
    match dtype {
        DType::F64 => cell.copy_from_slice(&v.to_le_bytes()),
        DType::F32 => cell.copy_from_slice(&(v as f32).to_le_bytes()),
        DType::F16 => cell.copy_from_slice(&f16::from_f64(v).to_le_bytes()),
        DType::Bf16 => cell.copy_from_slice(&bf16::from_f64(v).to_le_bytes()),
        _ => unreachable!("float draws go to float buffers"),
    }
}

/// `spread(lo..hi)`'s contents: `lo + floor(i * (hi - lo) / n)` for `i` in `0..n`, in an
/// order drawn from the seed (Fisher-Yates), so every seed holds the same values.
fn spread(dtype: DType, lo: i64, hi: i64, n: usize, seed: u64) -> Bytes {
    let span = i128::from(hi) - i128::from(lo);
    let mut values: Vec<i64> = (0..n)
        .map(|i| lo + (i as i128 * span / n as i128) as i64)
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(chunk_seed(seed, 0));
    values.shuffle(&mut rng);
    let mut out = vec![0u8; n * dtype.size()];
    for (cell, v) in out.chunks_exact_mut(dtype.size()).zip(values) {
        put_int(dtype, cell, v);
    }
    out
}

fn put_int(dtype: DType, cell: &mut [u8], v: i64) {
    match dtype {
        DType::I64 | DType::U64 => cell.copy_from_slice(&v.to_le_bytes()),
        DType::I32 | DType::U32 => cell.copy_from_slice(&(v as i32).to_le_bytes()),
        DType::I16 | DType::U16 => cell.copy_from_slice(&(v as i16).to_le_bytes()),
        DType::I8 | DType::U8 => cell[0] = v as u8,
        _ => unreachable!("integer draws go to integer buffers"),
    }
}

/// Every input buffer of a shape (in-out buffers included), by parameter order.
pub fn fill_all(
    spec: &KernelSpec,
    args: &[i64],
    lens: &[usize],
    seed: u64,
    variation: Variation,
) -> Result<Vec<Option<Bytes>>, String> {
    spec.buffers()
        .zip(lens)
        .enumerate()
        .map(|(i, (b, &n))| {
            if b.direction == kopt_spec::spec::Direction::Out {
                Ok(None)
            } else {
                fill(b, spec, args, n, buffer_seed(seed, i), variation).map(Some)
            }
        })
        .collect()
}

/// Every input buffer of a shape from a program's recorded launch (`KOPT_CAPTURE`), by
/// parameter order: the safetensors `file`'s tensor of each input's name, of its dtype and
/// `lens` elements. An error names the file, the buffer and what does not match (a
/// capture of another annotation is refused before a worker sees it; this catches a file
/// that was edited or truncated).
pub fn captured_all(
    spec: &KernelSpec,
    lens: &[usize],
    file: &std::path::Path,
) -> Result<Vec<Option<Bytes>>, String> {
    let bytes = std::fs::read(file)
        .map_err(|e| format!("cannot read the captured inputs {}: {e}", file.display()))?;
    let (mut tensors, _) = kopt_spec::capture::read_safetensors(&bytes)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    spec.buffers()
        .zip(lens)
        .map(|(b, &n)| {
            if b.direction == kopt_spec::spec::Direction::Out {
                return Ok(None);
            }
            let i = tensors
                .iter()
                .position(|t| t.name == b.name)
                .ok_or_else(|| format!("{} holds no tensor `{}`", file.display(), b.name))?;
            let t = tensors.swap_remove(i);
            let elements: u64 = t.shape.iter().product();
            if t.dtype != b.dtype || elements != n as u64 {
                return Err(format!(
                    "{}: `{}` is {} of {elements} elements, the kernel's is {} of {n}",
                    file.display(),
                    b.name,
                    t.dtype.name(),
                    b.dtype.name()
                ));
            }
            Ok(Some(t.data))
        })
        .collect()
}

/// The poison for outputs: a NaN pattern for floats (a quiet NaN with a payload no
/// arithmetic produces), `0xA5` bytes for integers. An element a kernel does not write
/// keeps it and fails the comparison.
pub fn poison(dtype: DType, n: usize) -> Bytes {
    let one: Vec<u8> = match dtype {
        DType::F64 => 0x7FF8_DEAD_BEEF_0001u64.to_le_bytes().to_vec(),
        DType::F32 => 0x7FC0_DEADu32.to_le_bytes().to_vec(),
        DType::F16 => 0x7E5Au16.to_le_bytes().to_vec(),
        DType::Bf16 => 0x7FDAu16.to_le_bytes().to_vec(),
        other => vec![0xA5; other.size()],
    };
    one.iter().copied().cycle().take(n * dtype.size()).collect()
}

/// Element `i` of a buffer as f64 (integers exactly up to 2^53).
pub fn element(dtype: DType, bytes: &[u8], i: usize) -> f64 {
    let s = dtype.size();
    let b = &bytes[i * s..(i + 1) * s];
    match dtype {
        DType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
        DType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::F16 => f16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::Bf16 => bf16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::U64 => u64::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::U32 => u32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::I16 => i16::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::U16 => u16::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::I8 => b[0] as i8 as f64,
        DType::U8 => b[0] as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kopt_spec::spec::Direction;

    fn buf(dtype: DType, dist: Distribution) -> Buffer {
        Buffer {
            name: "x".into(),
            dtype,
            len: kopt_spec::expr::Expr::Var("n".into()),
            direction: Direction::In,
            distribution: Some(dist),
            tolerance: None,
        }
    }

    fn spec() -> KernelSpec {
        let item = kopt_spec::spec::parse_item(
            "fn k(s: &CudaStream, x: &CudaSlice<i32>, y: &mut CudaSlice<f32>, n: u32, m: u32);"
                .parse()
                .unwrap(),
        )
        .unwrap();
        kopt_spec::spec::parse_kernel(
            "reference = \"k.cu\", x: [n] range(0..m), y: [n], grid = n, block = 1, shapes = [{ n: 4, m: 7 }]".parse().unwrap(),
            &item,
        )
        .unwrap()
        .0
    }

    #[test]
    fn seeded_fills_are_reproducible_and_never_zero() {
        let s = spec();
        let b = buf(
            DType::F32,
            Distribution::Normal {
                mean: 0.0,
                std: 1.0,
            },
        );
        let a1 = fill(&b, &s, &[1000, 7], 1000, 5, Variation::Declared).unwrap();
        let a2 = fill(&b, &s, &[1000, 7], 1000, 5, Variation::Declared).unwrap();
        let a3 = fill(&b, &s, &[1000, 7], 1000, 6, Variation::Declared).unwrap();
        assert_eq!(a1, a2);
        assert_ne!(a1, a3);
        let zeros = (0..1000)
            .filter(|&i| element(DType::F32, &a1, i) == 0.0)
            .count();
        assert!(zeros < 5, "not all zeros");
        let shifted = fill(&b, &s, &[1000, 7], 1000, 5, Variation::Shifted).unwrap();
        let mean = (0..1000)
            .map(|i| element(DType::F32, &shifted, i))
            .sum::<f64>()
            / 1000.0;
        assert!((mean - 1.0).abs() < 0.2, "shifted by one std: {mean}");
        let h = fill(
            &buf(DType::Bf16, Distribution::Uniform { lo: 2.0, hi: 3.0 }),
            &s,
            &[0, 0],
            100,
            1,
            Variation::Declared,
        )
        .unwrap();
        assert!((0..100).all(|i| (2.0..=3.0).contains(&element(DType::Bf16, &h, i))));
    }

    #[test]
    fn large_buffers_are_drawn_in_parallel_chunks_that_depend_only_on_the_seed() {
        let s = spec();
        let b = buf(
            DType::F32,
            Distribution::Normal {
                mean: 0.0,
                std: 1.0,
            },
        );
        let n = PARALLEL_FROM + 3 * CHUNK + 17;
        let big = fill(&b, &s, &[0, 0], n, 11, Variation::Declared).unwrap();
        assert_eq!(big.len(), n * 4);
        // The first chunk is what a small buffer of the same seed holds.
        let small = fill(&b, &s, &[0, 0], 1000, 11, Variation::Declared).unwrap();
        assert_eq!(&big[..4000], &small[..]);
        // Every chunk is drawn from its own generator, the same on every call.
        assert_eq!(
            big,
            fill(&b, &s, &[0, 0], n, 11, Variation::Declared).unwrap()
        );
        let c1 = &big[CHUNK * 4..CHUNK * 4 + 64];
        assert_ne!(c1, &big[..64], "chunks differ");
        let mean = (0..n).map(|i| element(DType::F32, &big, i)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "{mean}");
        let last = element(DType::F32, &big, n - 1);
        assert!(last.is_finite() && last != 0.0);
    }

    #[test]
    fn spread_inputs_hold_the_same_values_in_an_order_of_the_seed() {
        let s = spec();
        let lo = kopt_spec::expr::Expr::Int(10);
        // A permutation: as many elements as values.
        let perm = buf(
            DType::I32,
            Distribution::Spread {
                lo: lo.clone(),
                hi: kopt_spec::expr::Expr::Int(74),
            },
        );
        let a = fill(&perm, &s, &[64, 0], 64, 3, Variation::Declared).unwrap();
        let b = fill(&perm, &s, &[64, 0], 64, 4, Variation::Shifted).unwrap();
        assert_ne!(a, b, "the order depends on the seed");
        let sorted = |bytes: &[u8], n: usize| {
            let mut v: Vec<i64> = (0..n)
                .map(|i| element(DType::I32, bytes, i) as i64)
                .collect();
            v.sort();
            v
        };
        assert_eq!(sorted(&a, 64), (10..74).collect::<Vec<_>>());
        assert_eq!(sorted(&a, 64), sorted(&b, 64));
        // Fewer elements than values: evenly spaced from lo, the last below hi.
        let lens = buf(
            DType::U32,
            Distribution::Spread {
                lo,
                hi: kopt_spec::expr::Expr::Int(32779),
            },
        );
        let v = sorted(
            &fill(&lens, &s, &[4, 0], 4, 1, Variation::Declared).unwrap(),
            4,
        );
        assert_eq!(v, [10, 8202, 16394, 24586]);
    }

    #[test]
    fn integer_inputs_stay_in_their_declared_range() {
        let s = spec();
        let Some(kopt_spec::spec::Param::Buffer(x)) = s.params.first() else {
            panic!()
        };
        let v = fill(x, &s, &[500, 7], 500, 9, Variation::Shifted).unwrap();
        let vals: Vec<f64> = (0..500).map(|i| element(DType::I32, &v, i)).collect();
        assert!(vals.iter().all(|&e| (0.0..7.0).contains(&e)));
        assert!(vals.contains(&0.0) && vals.contains(&6.0));
        assert!(fill(x, &s, &[500, 0], 500, 9, Variation::Declared)
            .unwrap_err()
            .contains("empty"));
    }

    #[test]
    fn fixed_contents_are_the_values_for_every_seed_and_variation() {
        let item = kopt_spec::spec::parse_item(
            "fn k(s: &CudaStream, info: &CudaSlice<u64>, scale: &CudaSlice<bf16>, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);"
                .parse()
                .unwrap(),
        )
        .unwrap();
        let s = kopt_spec::spec::parse_kernel(
            "reference = \"k.cu\", info: [4] values(rows, cols, cols, 1), scale: [2] values(cols / 4, 0 - 3), x: [rows * cols], y: [rows * cols], grid = rows, block = 1, shapes = [{ rows: 3, cols: 64 }]"
                .parse()
                .unwrap(),
            &item,
        )
        .unwrap()
        .0;
        let args = [3, 64];
        let all = fill_all(&s, &args, &[4, 2, 192, 192], 11, Variation::Declared).unwrap();
        let info = all[0].as_ref().unwrap();
        let got: Vec<f64> = (0..4).map(|i| element(DType::U64, info, i)).collect();
        assert_eq!(got, [3.0, 64.0, 64.0, 1.0]);
        let scale = all[1].as_ref().unwrap();
        assert_eq!(element(DType::Bf16, scale, 0), 16.0);
        assert_eq!(element(DType::Bf16, scale, 1), -3.0);
        for (seed, variation) in [(12, Variation::Declared), (11, Variation::Shifted)] {
            let other = fill_all(&s, &args, &[4, 2, 192, 192], seed, variation).unwrap();
            assert_eq!(other[0], all[0], "fixed contents do not follow the seed");
            assert_eq!(other[1], all[1]);
            assert_ne!(other[2], all[2], "random inputs still do");
        }
        // Another shape, other contents.
        let other = fill_all(&s, &[5, 8], &[4, 2, 40, 40], 11, Variation::Declared).unwrap();
        let got: Vec<f64> = (0..4)
            .map(|i| element(DType::U64, other[0].as_ref().unwrap(), i))
            .collect();
        assert_eq!(got, [5.0, 8.0, 8.0, 1.0]);
        let info_buffer = s.buffers().next().unwrap();
        let e = fill(info_buffer, &s, &args, 5, 1, Variation::Declared).unwrap_err();
        assert!(e.contains("4 values for a buffer of 5 elements"), "{e}");
    }

    #[test]
    fn poison_is_nan_or_sentinel() {
        for d in [DType::F64, DType::F32, DType::F16, DType::Bf16] {
            let p = poison(d, 3);
            assert!((0..3).all(|i| element(d, &p, i).is_nan()), "{d}");
        }
        assert_eq!(poison(DType::I32, 2), vec![0xA5; 8]);
    }
}
