//! Held-out shapes: derived from the declared ones, checked (never timed), and not told to
//! an agent in advance.
//!
//! A candidate specialised to the declared shapes (one that assumes `cols % 1024 == 0`
//! and skips the tail, or handles the first N rows only) must fail on one of them. Random
//! perturbations alone do not guarantee that: halving or doubling a power of two keeps its
//! large power-of-two factors. So each integer dimension of each declared shape gets, first
//! and whatever the seed, three shapes that differ from the declared one in that dimension
//! only:
//!
//! - *fewest factors of two*: an odd prime near the declared value; where the constraints
//!   forbid odd values (`cols % VEC == 0` with `VEC = 4`), `2^j` times an odd prime with the
//!   smallest `j` the constraints allow (`4 x 1021`);
//! - *smallest*: the smallest valid size;
//! - *just above a power of two*: the smallest valid size above the power of two at or
//!   above the declared value (4097 for 4096, 65537 for 50257), so that a kernel that
//!   assumes it never sees more than the declared sizes fails.
//!
//! Then `seeded_per_shape` seeded perturbations per declared shape (first every dimension
//! at random near its declared size; then one dimension halved, doubled, off by a small
//! odd amount, or at random between half and twice the declared size), so that no one who
//! reads this code can predict every shape: the seed is derived from a per-workspace
//! secret. A candidate that special-cases the seed-independent sizes themselves is left to
//! the seeded shapes. Every shape is kept only where it is valid: the buffers' lengths
//! and the launch rule's grid and block evaluate to positive sizes, the constraints hold
//! (at the version's defines), the claimed region holds, each value fits its scalar's type,
//! and the buffers take at most `max_bytes` ([`held_out_byte_cap`]). A shape equal to a
//! declared one or to one already drawn is skipped, so a category whose value another
//! category already gave adds nothing.

use std::collections::{BTreeMap, BTreeSet};

use crate::expr::{self, Expr, Op};
use crate::spec::{KernelSpec, Number, ScalarTy, Shape};

use super::ShapeCase;

/// Odd parts tried on either side of each centre when looking for a size with few factors
/// of two, and sizes tried above a power of two: prime gaps below 2^40 are far shorter on
/// average (about 28), so a window this wide finds a prime almost always.
const WINDOW: i64 = 128;

/// Draws of a shape with every dimension at random, per declared shape, before the seeded
/// perturbations of one dimension at a time take over (constraints such as
/// `q_heads % kv_heads == 0` reject most such draws).
const RANDOM_SIZES_TRIES: usize = 8;

/// Sizes the smallest-size search tries one by one before it bisects.
const LINEAR_SCAN: i64 = 4096;

/// The most bytes the buffers of one held-out shape may take, as `cargo kopt verify`, the
/// loop and the search draw them: twice the largest declared shape's. Large enough for a
/// size just above the next power of two of the largest declared one, small enough that
/// checking a held-out shape costs at most about twice a declared one.
pub fn held_out_byte_cap(spec: &KernelSpec) -> u64 {
    spec.shapes
        .iter()
        .map(|s| super::shape_bytes(spec, &spec.shape_args(s)))
        .max()
        .unwrap_or(0)
        .saturating_mul(2)
}

/// Held-out shapes for the reference's build (the tunables at their defaults): the
/// seed-independent ones of [`seed_independent_held_out_shapes`], then `seeded_per_shape`
/// seeded perturbations per declared shape. Deterministic in `seed`, which is not shown to
/// agents either. See the module's documentation for what is drawn.
pub fn held_out_shapes(
    spec: &KernelSpec,
    region: Option<&Expr>,
    seed: u64,
    seeded_per_shape: usize,
    max_bytes: u64,
) -> Vec<ShapeCase> {
    held_out_shapes_for(
        spec,
        &spec.default_defines(),
        region,
        seed,
        seeded_per_shape,
        max_bytes,
    )
}

/// [`held_out_shapes`] for a version built with `defines` (a search point): the
/// constraints and the launch rule are evaluated with those values, so that a shape the
/// version cannot run (`cols % VEC != 0` with its `VEC`) is never chosen.
pub fn held_out_shapes_for(
    spec: &KernelSpec,
    defines: &BTreeMap<String, i64>,
    region: Option<&Expr>,
    seed: u64,
    seeded_per_shape: usize,
    max_bytes: u64,
) -> Vec<ShapeCase> {
    let mut draw = Draw::new(spec, defines, region, max_bytes);
    draw.seed_independent();
    draw.seeded(seed, seeded_per_shape);
    draw.out
}

/// The held-out shapes drawn whatever the seed, at `defines`: per declared shape and per
/// integer dimension, the size with the fewest factors of two, the smallest size and the
/// size just above a power of two (where valid and new). [`held_out_shapes_for`] always
/// starts with these.
pub fn seed_independent_held_out_shapes(
    spec: &KernelSpec,
    defines: &BTreeMap<String, i64>,
    region: Option<&Expr>,
    max_bytes: u64,
) -> Vec<ShapeCase> {
    let mut draw = Draw::new(spec, defines, region, max_bytes);
    draw.seed_independent();
    draw.out
}

/// Whether a shape (its arguments, in scalar order) may be drawn as held out for a
/// version built with `defines`: every buffer's length is positive and the buffers take at
/// most `max_bytes`, the launch rule's grid and block sizes are positive and fit in 32
/// bits, every constraint holds, and `region` (the candidate's claim) holds.
pub fn shape_is_valid(
    spec: &KernelSpec,
    defines: &BTreeMap<String, i64>,
    region: Option<&Expr>,
    args: &[i64],
    max_bytes: u64,
) -> bool {
    Validity::new(spec, defines, region, max_bytes).holds(spec, args)
}

/// The checks of [`shape_is_valid`], compiled once: the drawing evaluates them thousands
/// of times.
struct Validity {
    /// Each buffer's length (`None`: it does not compile) and element size.
    buffers: Vec<(Option<Vec<Op>>, u64)>,
    launch: Vec<Option<Vec<Op>>>,
    constraints: Vec<Option<Vec<Op>>>,
    region: Option<Option<Vec<Op>>>,
    max_bytes: u64,
    /// The version's defines, for its computed kernel arguments.
    defines: BTreeMap<String, i64>,
}

impl Validity {
    fn new(
        spec: &KernelSpec,
        defines: &BTreeMap<String, i64>,
        region: Option<&Expr>,
        max_bytes: u64,
    ) -> Self {
        let compile = |e: &Expr| spec.compile_expr(e, defines).ok();
        Validity {
            buffers: spec
                .buffers()
                .map(|b| (compile(&b.len), b.dtype.size() as u64))
                .collect(),
            launch: spec
                .launch
                .grid
                .iter()
                .chain(spec.launch.block.iter())
                .map(compile)
                .collect(),
            constraints: spec.constraints.iter().map(compile).collect(),
            region: region.map(compile),
            max_bytes,
            defines: defines.clone(),
        }
    }

    fn holds(&self, spec: &KernelSpec, args: &[i64]) -> bool {
        let eval = |p: &Option<Vec<Op>>| p.as_ref().and_then(|p| expr::eval(p, args).ok());
        let mut bytes: u64 = 0;
        for (len, size) in &self.buffers {
            match eval(len) {
                Some(n) if n > 0 => bytes = bytes.saturating_add((n as u64).saturating_mul(*size)),
                _ => return false,
            }
        }
        if bytes > self.max_bytes {
            return false;
        }
        if !self
            .launch
            .iter()
            .all(|d| matches!(eval(d), Some(v) if v > 0 && v <= u32::MAX as i64))
        {
            return false;
        }
        if !self.constraints.iter().all(|c| eval(c) == Some(1)) {
            return false;
        }
        // A `values(...)` buffer must get one value per element, and computed arguments must
        // fit their types, as on the declared shapes.
        if spec
            .buffers()
            .any(|b| matches!(b.fixed_values(spec, args), Some(Err(_))))
        {
            return false;
        }
        if spec.computed_args().next().is_some() {
            let values: BTreeMap<String, crate::spec::Number> = spec
                .scalars()
                .zip(args)
                .map(|(s, v)| (s.name.clone(), crate::spec::Number::Int(*v)))
                .collect();
            if spec
                .kernel_arg_values(None, &spec.launch, &self.defines, &values)
                .is_err()
            {
                return false;
            }
        }
        // Every declared tensor map must encode: a shape where one cannot (a row pitch
        // that is no multiple of 16 bytes) is outside what a version taking it can run.
        if (0..spec.tensor_maps.len())
            .any(|i| spec.tensor_map_args(i, &self.defines, args).is_err())
        {
            return false;
        }
        match &self.region {
            None => true,
            Some(r) => eval(r) == Some(1),
        }
    }
}

/// One integer dimension of the spec: its slot in the arguments, name and type.
struct Dim {
    slot: usize,
    name: String,
    ty: ScalarTy,
}

/// The drawing in progress.
struct Draw<'a> {
    spec: &'a KernelSpec,
    validity: Validity,
    dims: Vec<Dim>,
    /// Arguments of the declared shapes and of every shape drawn so far.
    taken: BTreeSet<Vec<i64>>,
    out: Vec<ShapeCase>,
}

impl<'a> Draw<'a> {
    fn new(
        spec: &'a KernelSpec,
        defines: &BTreeMap<String, i64>,
        region: Option<&Expr>,
        max_bytes: u64,
    ) -> Self {
        Draw {
            spec,
            validity: Validity::new(spec, defines, region, max_bytes),
            dims: spec
                .scalars()
                .enumerate()
                .filter(|(_, s)| !s.ty.is_float())
                .map(|(slot, s)| Dim {
                    slot,
                    name: s.name.clone(),
                    ty: s.ty,
                })
                .collect(),
            taken: spec.shapes.iter().map(|s| spec.shape_args(s)).collect(),
            out: Vec::new(),
        }
    }

    /// Whether `shape` with dimension `dim` set to `x` is valid.
    fn valid(&self, base: &[i64], dim: &Dim, x: i64) -> bool {
        if x < 1 || x > type_max(dim.ty) {
            return false;
        }
        let mut args = base.to_vec();
        args[dim.slot] = x;
        self.validity.holds(self.spec, &args)
    }

    /// Adds `shape` with dimension `d` set to `x`, where that is valid and new.
    fn push(&mut self, shape: &Shape, d: usize, x: i64, category: &str) -> bool {
        self.push_sizes(shape, &[(d, x)], category)
    }

    /// Adds `shape` with each dimension `d` of `sizes` set to its `x`, where that is valid
    /// and new.
    fn push_sizes(&mut self, shape: &Shape, sizes: &[(usize, i64)], category: &str) -> bool {
        let mut args = self.spec.shape_args(shape);
        let mut values = shape.values.clone();
        for &(d, x) in sizes {
            let dim = &self.dims[d];
            if x < 1 || x > type_max(dim.ty) {
                return false;
            }
            args[dim.slot] = x;
            values.insert(dim.name.clone(), Number::Int(x));
        }
        if !self.validity.holds(self.spec, &args) || !self.taken.insert(args) {
            return false;
        }
        let s = Shape {
            values,
            weight: 1.0,
        };
        self.out.push(ShapeCase {
            label: held_out_label(&crate::spec::shape_label(&s), category),
            values: s.values,
            held_out: true,
            timed: false,
            captured: None,
        });
        true
    }

    /// The declared value of dimension `d` in `shape`, where it is an integer.
    fn declared(&self, shape: &Shape, d: usize) -> Option<i64> {
        match shape.values.get(&self.dims[d].name) {
            Some(Number::Int(v)) => Some(*v),
            _ => None,
        }
    }

    fn seed_independent(&mut self) {
        let spec = self.spec;
        for shape in &spec.shapes {
            let base = spec.shape_args(shape);
            for d in 0..self.dims.len() {
                let Some(v) = self.declared(shape, d) else {
                    continue;
                };
                let dim = &self.dims[d];
                let valid = |x: i64| x != v && self.valid(&base, dim, x);
                let name = dim.name.clone();
                let odd = fewest_factors_of_two(v, &valid);
                let smallest = smallest(v, &valid);
                let above = just_above_a_power_of_two(v, &valid);
                if let Some(f) = odd {
                    self.push(shape, d, f.value, &f.category(&name));
                }
                if let Some(x) = smallest {
                    self.push(shape, d, x, &format!("smallest {name}"));
                }
                if let Some((x, p)) = above {
                    self.push(shape, d, x, &format!("{name} just above {p}"));
                }
            }
        }
    }

    /// Per declared shape, `per_shape` seeded perturbations that are valid and new: first
    /// one with every dimension drawn at random from half to 1.25 times its declared size
    /// (so that it catches a candidate that knows the seed-independent sizes in every
    /// dimension at once, within about twice the declared bytes for three dimensions), up
    /// to [`RANDOM_SIZES_TRIES`] draws until one is valid; then single dimensions halved,
    /// doubled, off by a small odd amount or drawn from half to twice the declared size,
    /// in a seeded order.
    fn seeded(&mut self, seed: u64, per_shape: usize) {
        let spec = self.spec;
        // Every seed its own sequence (xorshift needs a state other than 0), and every
        // kernel its own: a held-out shape of one kernel, once seen, tells nothing of
        // another's with the same declared sizes.
        let name_hash = spec.name.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01B3)
        });
        let mut state = splitmix(seed ^ name_hash).max(1);
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        // Uniform in `lo..=hi` (`hi >= lo`).
        let mut uniform = |lo: i64, hi: i64| lo + (next() % ((hi - lo) as u64 + 1)) as i64;
        for shape in &spec.shapes {
            let declared: Vec<(usize, i64)> = (0..self.dims.len())
                .filter_map(|d| Some((d, self.declared(shape, d)?)))
                .filter(|(_, v)| *v >= 1)
                .collect();
            let mut taken = 0;
            if per_shape > 0 {
                for _ in 0..RANDOM_SIZES_TRIES {
                    let sizes: Vec<(usize, i64)> = declared
                        .iter()
                        .map(|&(d, v)| {
                            let lo = (v / 2).max(1);
                            (d, uniform(lo, (v.saturating_add(v / 4)).max(lo)))
                        })
                        .collect();
                    if self.push_sizes(shape, &sizes, "random sizes") {
                        taken += 1;
                        break;
                    }
                }
            }
            let mut candidates: Vec<(usize, i64, String)> = Vec::new();
            for &(d, v) in &declared {
                let name = &self.dims[d].name;
                let odd = [1, 3, 5, 7, 13][uniform(0, 4) as usize];
                let random = uniform((v / 2).max(1), v.saturating_mul(2));
                for (x, category) in [
                    (v / 2, format!("halved {name}")),
                    (v.saturating_mul(2), format!("doubled {name}")),
                    (v + odd, format!("{name} off by +{odd}")),
                    (v - odd, format!("{name} off by -{odd}")),
                    (v + 32 + odd, format!("{name} off by +{}", 32 + odd)),
                    (random, format!("random {name}")),
                ] {
                    if x > 0 && x != v {
                        candidates.push((d, x, category));
                    }
                }
            }
            // Fisher-Yates with the seeded generator, then keep the first valid new ones.
            for i in (1..candidates.len()).rev() {
                let j = uniform(0, i as i64) as usize;
                candidates.swap(i, j);
            }
            for (d, x, category) in candidates {
                if taken >= per_shape {
                    break;
                }
                if self.push(shape, d, x, &category) {
                    taken += 1;
                }
            }
        }
    }
}

/// A held-out shape's label: the shape's own, then the category in parentheses
/// (`cols=4099 rows=4096 (held out: odd prime cols)`). [`parse_held_out_label`] reads it
/// back.
pub fn held_out_label(shape_label: &str, category: &str) -> String {
    format!("{shape_label} (held out: {category})")
}

/// The shape's label and the category of a label [`held_out_label`] wrote, or of one
/// written before categories (`cols=4096 rows=8192 (held out)`, category empty); `None`
/// for a declared shape's label.
pub fn parse_held_out_label(label: &str) -> Option<(&str, &str)> {
    if let Some(shape) = label.strip_suffix(" (held out)") {
        return Some((shape, ""));
    }
    let rest = label.strip_suffix(')')?;
    let at = rest.rfind(" (held out: ")?;
    Some((&rest[..at], &rest[at + " (held out: ".len()..]))
}

fn type_max(ty: ScalarTy) -> i64 {
    match ty {
        ScalarTy::I32 => i32::MAX as i64,
        ScalarTy::U32 => u32::MAX as i64,
        _ => i64::MAX,
    }
}

/// A size whose power-of-two factor is as small as the constraints allow.
struct FewTwos {
    value: i64,
    /// Factors of two in `value`.
    twos: u32,
    /// Whether the odd part is a prime (else it is 1: `value` is a power of two).
    prime: bool,
}

impl FewTwos {
    fn category(&self, name: &str) -> String {
        match (self.twos, self.prime) {
            (0, true) => format!("odd prime {name}"),
            (0, false) => format!("odd {name}"),
            (j, true) => format!("{name} of {} x an odd prime", 1i64 << j),
            (_, false) => format!("power of two {name}"),
        }
    }
}

/// The valid size with the fewest factors of two, and among those an odd prime times that
/// power of two nearest `v` (the larger on a tie), else the power of two itself. Searched
/// near `v` and near `v` halved and doubled, so that a constraint or a region far from `v`
/// (`rows < 64` for a declared 4096) still gives a size.
fn fewest_factors_of_two(v: i64, valid: &dyn Fn(i64) -> bool) -> Option<FewTwos> {
    let v = v.max(1);
    let mut anchors: Vec<i64> = std::iter::successors(Some(v), |a| (*a > 1).then(|| a / 2))
        .chain(v.checked_mul(2))
        .collect();
    anchors.sort_by_key(|a| (a - v).abs());
    anchors.dedup();
    for twos in 0..62u32 {
        let step = 1i64 << twos;
        if step > v.saturating_mul(2) {
            break;
        }
        let mut tried = BTreeSet::new();
        for &a in &anchors {
            let centre = a / step;
            for delta in 0..=WINDOW {
                for p in [centre + delta, centre - delta] {
                    if p < 3 || p % 2 == 0 || !tried.insert(p) || !is_prime(p as u64) {
                        continue;
                    }
                    if let Some(x) = p.checked_mul(step).filter(|x| valid(*x)) {
                        return Some(FewTwos {
                            value: x,
                            twos,
                            prime: true,
                        });
                    }
                }
            }
        }
        if valid(step) {
            return Some(FewTwos {
                value: step,
                twos,
                prime: false,
            });
        }
    }
    None
}

/// The smallest valid size below `v`: exact up to [`LINEAR_SCAN`], found by a scan; above
/// it, the first of `LINEAR_SCAN + 1` doubled and doubled again from which a valid size
/// lies within [`WINDOW`], then a bisection below that size (exact where the valid sizes
/// run from a lower bound up).
fn smallest(v: i64, valid: &dyn Fn(i64) -> bool) -> Option<i64> {
    if let Some(x) = (1..v.min(LINEAR_SCAN + 1)).find(|x| valid(*x)) {
        return Some(x);
    }
    let first_in = |from: i64, to: i64| (from..to.min(v)).find(|x| valid(*x));
    // Nothing valid at or below `lo`; `hi` is valid, or `v` (the declared size).
    let mut lo = LINEAR_SCAN;
    let mut hi = v;
    let mut band = LINEAR_SCAN + 1;
    while band < v {
        if let Some(x) = first_in(band, band.saturating_add(WINDOW)) {
            hi = x;
            break;
        }
        lo = band;
        band = band.saturating_mul(2);
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match first_in(mid, mid.saturating_add(WINDOW).min(hi)) {
            Some(x) => hi = x,
            None => lo = mid,
        }
    }
    (hi < v).then_some(hi)
}

/// The smallest valid size above the power of two at or above `v` (and that power of
/// two), within [`WINDOW`] of it; where none is valid (a region, or the byte cap), the same
/// above the next lower power of two, and so on down.
fn just_above_a_power_of_two(v: i64, valid: &dyn Fn(i64) -> bool) -> Option<(i64, i64)> {
    let mut p = next_power_of_two(v)?;
    while p >= 1 {
        if let Some(x) = (p + 1..=p.saturating_add(WINDOW)).find(|x| valid(*x)) {
            return Some((x, p));
        }
        p /= 2;
    }
    None
}

/// SplitMix64's finaliser: spreads consecutive seeds over the whole state space.
fn splitmix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The power of two at or above `v` (1 for `v` below 1), where it fits.
fn next_power_of_two(v: i64) -> Option<i64> {
    u64::try_from(v.max(1))
        .ok()?
        .checked_next_power_of_two()
        .and_then(|p| i64::try_from(p).ok())
}

/// Deterministic Miller-Rabin: these bases decide every 64-bit number.
fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    const BASES: [u64; 12] = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37];
    for p in BASES {
        if n.is_multiple_of(p) {
            return n == p;
        }
    }
    let mul = |a: u64, b: u64| ((a as u128 * b as u128) % n as u128) as u64;
    let pow = |mut b: u64, mut e: u64| {
        let mut r = 1u64;
        while e > 0 {
            if e & 1 == 1 {
                r = mul(r, b);
            }
            b = mul(b, b);
            e >>= 1;
        }
        r
    };
    let s = (n - 1).trailing_zeros();
    let d = (n - 1) >> s;
    'bases: for a in BASES {
        let mut x = pow(a, d);
        if x == 1 || x == n - 1 {
            continue;
        }
        for _ in 1..s {
            x = mul(x, x);
            if x == n - 1 {
                continue 'bases;
            }
        }
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `rows x cols` kernel, one block per row, with the given extra attributes.
    fn rows_cols(attrs: &str) -> KernelSpec {
        let item = crate::spec::parse_item(
            "fn k(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);"
                .parse()
                .unwrap(),
        )
        .unwrap();
        crate::spec::parse_kernel(
            format!("reference = \"k.cu\", x: [rows * cols], y: [rows * cols], grid = rows, block = 256, {attrs}")
                .parse()
                .unwrap(),
            &item,
        )
        .unwrap()
        .0
    }

    fn labels(shapes: &[ShapeCase]) -> Vec<&str> {
        shapes.iter().map(|s| s.label.as_str()).collect()
    }

    fn value(s: &ShapeCase, name: &str) -> i64 {
        s.values[name].as_i64().unwrap()
    }

    /// The seed-independent shape of `category` for dimension... found by its label.
    fn by_category<'s>(shapes: &'s [ShapeCase], category: &str) -> Vec<&'s ShapeCase> {
        shapes
            .iter()
            .filter(|s| parse_held_out_label(&s.label).map(|(_, c)| c) == Some(category))
            .collect()
    }

    #[test]
    fn each_dimension_gets_an_odd_prime_the_smallest_size_and_one_just_above_a_power_of_two() {
        let spec = rows_cols("shapes = [{ rows: 4096, cols: 4096 }, { rows: 8, cols: 50257 }]");
        let shapes = seed_independent_held_out_shapes(
            &spec,
            &spec.default_defines(),
            None,
            held_out_byte_cap(&spec),
        );
        // 4093 and 4099 are both primes 3 from 4096: the larger is taken. For 8 rows, the
        // odd prime 7 is nearer than 11; 50257 is itself odd but not prime (29 x 1733):
        // the nearest prime is 50261; the power of two at or above it is 65536.
        assert_eq!(
            labels(&shapes),
            vec![
                "cols=4096 rows=4099 (held out: odd prime rows)",
                "cols=4096 rows=1 (held out: smallest rows)",
                "cols=4096 rows=4097 (held out: rows just above 4096)",
                "cols=4099 rows=4096 (held out: odd prime cols)",
                "cols=1 rows=4096 (held out: smallest cols)",
                "cols=4097 rows=4096 (held out: cols just above 4096)",
                "cols=50257 rows=7 (held out: odd prime rows)",
                "cols=50257 rows=1 (held out: smallest rows)",
                "cols=50257 rows=9 (held out: rows just above 8)",
                "cols=50261 rows=8 (held out: odd prime cols)",
                "cols=1 rows=8 (held out: smallest cols)",
                "cols=65537 rows=8 (held out: cols just above 65536)",
            ]
        );
        assert!(shapes.iter().all(|s| s.held_out && !s.timed));
    }

    #[test]
    fn where_the_constraints_forbid_odd_sizes_the_fewest_factors_of_two_are_taken() {
        let spec =
            rows_cols("shapes = [{ rows: 4096, cols: 4096 }], constraints = [cols % 4 == 0]");
        let shapes = seed_independent_held_out_shapes(
            &spec,
            &spec.default_defines(),
            None,
            held_out_byte_cap(&spec),
        );
        // 1021 is the prime nearest 4096 / 4.
        let few = by_category(&shapes, "cols of 4 x an odd prime");
        assert_eq!(few.len(), 1, "{:?}", labels(&shapes));
        assert_eq!(value(few[0], "cols"), 4 * 1021);
        assert_eq!(value(by_category(&shapes, "smallest cols")[0], "cols"), 4);
        assert_eq!(
            value(by_category(&shapes, "cols just above 4096")[0], "cols"),
            4100
        );
        // Rows stay free: odd.
        assert_eq!(
            value(by_category(&shapes, "odd prime rows")[0], "rows"),
            4099
        );

        // At a version's own defines: VEC = 8 forces three factors of two, never more.
        let spec = rows_cols(
            "shapes = [{ rows: 64, cols: 4096 }], tunables = { VEC: [1, 2, 4, 8] }, constraints = [cols % VEC == 0]",
        );
        let mut defines = spec.default_defines();
        defines.insert("VEC".into(), 8);
        let shapes =
            seed_independent_held_out_shapes(&spec, &defines, None, held_out_byte_cap(&spec));
        let few = by_category(&shapes, "cols of 8 x an odd prime");
        assert_eq!(value(few[0], "cols"), 8 * 509, "{:?}", labels(&shapes));
        assert!(shapes.iter().all(|s| value(s, "cols") % 8 == 0));
        assert_eq!(value(by_category(&shapes, "smallest cols")[0], "cols"), 8);
    }

    #[test]
    fn a_lower_bound_gives_the_smallest_size() {
        let smallest_cols = |constraints: &str| {
            let spec = rows_cols(&format!(
                "shapes = [{{ rows: 16, cols: 65536 }}], constraints = [{constraints}]"
            ));
            let shapes = seed_independent_held_out_shapes(
                &spec,
                &spec.default_defines(),
                None,
                held_out_byte_cap(&spec),
            );
            by_category(&shapes, "smallest cols")
                .first()
                .map(|s| value(s, "cols"))
        };
        assert_eq!(smallest_cols("cols >= 64"), Some(64));
        // Above the scan: found by bisection.
        assert_eq!(smallest_cols("cols >= 5000"), Some(5000));
        assert_eq!(smallest_cols("cols >= 40001, cols % 4 == 0"), Some(40004));
        // The declared size is the smallest: nothing to add.
        assert_eq!(smallest_cols("cols >= 65536"), None);
    }

    #[test]
    fn a_claimed_region_keeps_every_shape_inside_it() {
        let spec = rows_cols(
            "shapes = [{ rows: 4096, cols: 4096 }, { rows: 16, cols: 65536 }], constraints = [cols % 4 == 0]",
        );
        let region = spec.parse_region("rows < 64").unwrap();
        let shapes = held_out_shapes(&spec, Some(&region), 42, 2, held_out_byte_cap(&spec));
        assert!(
            shapes.iter().all(|s| value(s, "rows") < 64),
            "{:?}",
            labels(&shapes)
        );
        // From 4096 rows: the prime nearest it inside the region, and just above 32 (just
        // above 4096 is outside).
        assert!(labels(&shapes).contains(&"cols=4096 rows=61 (held out: odd prime rows)"));
        assert!(labels(&shapes).contains(&"cols=4096 rows=33 (held out: rows just above 32)"));
        // From 16 rows: 17 is both the nearest odd prime and just above 16; drawn once.
        assert_eq!(
            shapes
                .iter()
                .filter(|s| value(s, "rows") == 17 && value(s, "cols") == 65536)
                .count(),
            1
        );
        assert!(
            labels(&shapes).contains(&"cols=65524 rows=16 (held out: cols of 4 x an odd prime)")
        );
    }

    #[test]
    fn a_divisor_constraint_leaves_odd_sizes_of_one() {
        let item = crate::spec::parse_item(
            "fn k(s: &CudaStream, q: &CudaSlice<f32>, k: &CudaSlice<f32>, o: &mut CudaSlice<f32>, q_heads: u32, kv_heads: u32);"
                .parse()
                .unwrap(),
        )
        .unwrap();
        let spec = crate::spec::parse_kernel(
            "reference = \"k.cu\", q: [q_heads * 128], k: [kv_heads * 128], o: [q_heads * 128], grid = q_heads, block = 128, shapes = [{ q_heads: 32, kv_heads: 8 }], constraints = [q_heads % kv_heads == 0]"
                .parse()
                .unwrap(),
            &item,
        )
        .unwrap()
        .0;
        let shapes = seed_independent_held_out_shapes(
            &spec,
            &spec.default_defines(),
            None,
            held_out_byte_cap(&spec),
        );
        // kv_heads must divide 32: the only odd size is 1 (then also the smallest, drawn
        // once), and just above 8 comes 16. q_heads must be a multiple of 8: 8 x 3 is
        // nearest 32 among 8 x odd primes (24 and 40 tie: the larger), 8 is the smallest
        // and 40 the first above 32, which the first category already drew.
        assert_eq!(
            labels(&shapes),
            vec![
                "kv_heads=8 q_heads=40 (held out: q_heads of 8 x an odd prime)",
                "kv_heads=8 q_heads=8 (held out: smallest q_heads)",
                "kv_heads=1 q_heads=32 (held out: odd kv_heads)",
                "kv_heads=16 q_heads=32 (held out: kv_heads just above 8)",
            ]
        );
    }

    #[test]
    fn the_seed_independent_shapes_come_first_whatever_the_seed() {
        let spec = rows_cols(
            "shapes = [{ rows: 4096, cols: 4096 }, { rows: 16, cols: 65536 }], constraints = [cols % 4 == 0]",
        );
        let cap = held_out_byte_cap(&spec);
        let fixed = seed_independent_held_out_shapes(&spec, &spec.default_defines(), None, cap);
        assert!(!fixed.is_empty());
        let mut seeded_parts = BTreeSet::new();
        for seed in 0..50 {
            let a = held_out_shapes(&spec, None, seed, 2, cap);
            assert_eq!(
                a,
                held_out_shapes(&spec, None, seed, 2, cap),
                "deterministic"
            );
            assert_eq!(&a[..fixed.len()], &fixed[..], "seed {seed}");
            assert_eq!(a.len(), fixed.len() + 2 * spec.shapes.len(), "seed {seed}");
            let mut args: Vec<Vec<i64>> = a
                .iter()
                .map(|s| {
                    spec.shape_args(&Shape {
                        values: s.values.clone(),
                        weight: 1.0,
                    })
                })
                .collect();
            args.extend(spec.shapes.iter().map(|s| spec.shape_args(s)));
            let distinct: BTreeSet<_> = args.iter().collect();
            assert_eq!(distinct.len(), args.len(), "no shape twice, none declared");
            seeded_parts.insert(labels(&a[fixed.len()..]).join("; "));
        }
        assert!(
            seeded_parts.len() > 25,
            "the seeded part varies with the seed: {} of 50 distinct",
            seeded_parts.len()
        );
        assert_eq!(
            held_out_shapes(&spec, None, 3, 0, cap),
            fixed,
            "no seeded shape asked for"
        );
    }

    #[test]
    fn the_byte_cap_bounds_every_shape() {
        let spec = rows_cols("shapes = [{ rows: 4096, cols: 4096 }]");
        let declared = super::super::shape_bytes(&spec, &[4096, 4096]);
        assert_eq!(held_out_byte_cap(&spec), 2 * declared);
        for cap in [2 * declared, declared] {
            for seed in 0..20 {
                for s in held_out_shapes(&spec, None, seed, 3, cap) {
                    let args = spec.shape_args(&Shape {
                        values: s.values.clone(),
                        weight: 1.0,
                    });
                    assert!(
                        super::super::shape_bytes(&spec, &args) <= cap,
                        "{}",
                        s.label
                    );
                }
            }
        }
        // At the declared shape's own size nothing above 4096 fits: the next power of
        // two down is crossed instead.
        let shapes =
            seed_independent_held_out_shapes(&spec, &spec.default_defines(), None, declared);
        assert!(labels(&shapes).contains(&"cols=4096 rows=2049 (held out: rows just above 2048)"));
        assert!(labels(&shapes).contains(&"cols=4096 rows=4093 (held out: odd prime rows)"));
        assert!(held_out_shapes(&spec, None, 42, 2, 1000).is_empty());
    }

    #[test]
    fn labels_read_back() {
        assert_eq!(
            parse_held_out_label(&held_out_label("cols=4099 rows=4096", "odd prime cols")),
            Some(("cols=4099 rows=4096", "odd prime cols"))
        );
        assert_eq!(
            parse_held_out_label("cols=4096 rows=8192 (held out)"),
            Some(("cols=4096 rows=8192", ""))
        );
        assert_eq!(parse_held_out_label("cols=4096 rows=8192"), None);
    }

    #[test]
    fn primes_are_told_from_composites() {
        let trial = |n: u64| {
            n >= 2
                && (2..)
                    .take_while(|d| d * d <= n)
                    .all(|d| !n.is_multiple_of(d))
        };
        for n in 0..20_000u64 {
            assert_eq!(is_prime(n), trial(n), "{n}");
        }
        // A Mersenne prime, a strong pseudoprime to bases 2, 3, 5 and 7, Carmichael numbers.
        assert!(is_prime((1 << 61) - 1));
        assert!(!is_prime(3_215_031_751));
        assert!(!is_prime(561) && !is_prime(41_041));
        assert!(!is_prime(((1u64 << 31) - 1) * ((1 << 31) - 1)));
    }
}
