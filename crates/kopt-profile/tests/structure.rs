//! The structural summary on the example kernels' real sources (from the committed jobs),
//! evaluated for the shape each capture profiled.

mod common;

use kopt_profile::structure::{self, Env};

/// A loop as (pattern, condition, trips, trips with outer loops, depth).
type L = (String, String, Option<u64>, Option<u64>, u32);

fn loops(stem: &'static str) -> Vec<L> {
    let s = common::structure(&common::capture(stem));
    s.loops
        .iter()
        .map(|l| {
            (
                l.pattern.clone(),
                l.condition.clone(),
                l.trips,
                l.total_trips,
                l.depth,
            )
        })
        .collect()
}

fn l(p: &str, c: &str, t: u64, tt: u64, d: u32) -> L {
    (p.into(), c.into(), Some(t), Some(tt), d)
}

#[test]
fn softmax_reads_each_row_in_three_block_stride_passes() {
    let c = common::capture("softmax-shape0");
    let s = common::structure(&c);
    assert_eq!(
        s.functions,
        ["softmax_f32", "block_reduce", "warp_max", "warp_sum"]
    );
    assert_eq!(
        loops("softmax-shape0"),
        [
            l("block-stride", "c < cols", 16, 16, 0),
            l("block-stride", "c < cols", 16, 16, 0),
            l("block-stride", "c < cols", 16, 16, 0),
            l("sequential", "w < warps", 8, 8, 0),
            l("halving", "offset > 0", 5, 5, 0),
            l("halving", "offset > 0", 5, 5, 0),
        ]
    );
    assert_eq!(s.loops[0].at, "kernels/softmax.cu:13");
    assert_eq!(s.loops[3].at, "kernels/common.cuh:31");
    let x = &s.buffers[0];
    assert_eq!(
        (
            x.name.as_str(),
            x.element.as_str(),
            x.bits,
            x.reads,
            x.read_passes
        ),
        ("x", "float", Some(32), 3, 3)
    );
    assert_eq!((s.buffers[1].name.as_str(), s.buffers[1].writes), ("y", 1));
    assert_eq!(s.max_read_passes(), Some(("x", 3)));
    let sh = &s.shared[0];
    assert_eq!(
        (sh.name.as_str(), sh.size.as_str(), sh.bytes, sh.dynamic),
        ("scratch", "32", Some(128), false)
    );
    assert_eq!(
        sh.indices,
        ["warp", "w"],
        "the helper's accesses count for the caller's array"
    );
    assert_eq!((s.sync.syncthreads, s.sync.shuffles), (2, 2));
    assert!(s.atomics.is_empty() && s.local_arrays.is_empty());
    assert!(
        s.longest_serial_loop().is_none(),
        "no sequential loop reads global memory"
    );
}

#[test]
fn the_vec4_variant_reads_float4_in_two_passes() {
    let s = common::structure(&common::capture("softmax-shape0-online-vec4"));
    assert_eq!(
        loops("softmax-shape0-online-vec4"),
        [
            l("block-stride", "i < n4", 4, 4, 0),
            l("halving", "off > 0", 5, 5, 0),
            l("halving", "off > 0", 5, 5, 0),
            l("block-stride", "i < n4", 4, 4, 0),
        ]
    );
    assert_eq!(
        (
            s.buffers[0].element.as_str(),
            s.buffers[0].bits,
            s.buffers[0].read_passes
        ),
        ("float4", Some(128), 2)
    );
    let names: Vec<&str> = s.shared.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["wm", "ws"], "two arrays in one declaration");
}

#[test]
fn rmsnorm_follows_the_template_and_binds_its_scalars() {
    let s = common::structure(&common::capture("rmsnorm-shape0"));
    assert_eq!(s.functions[..2], ["rmsnorm_f16", "rmsnorm"]);
    assert_eq!(s.loops[0].condition, "c < cols");
    assert_eq!(s.loops[0].function, "rmsnorm");
    assert_eq!(
        (s.loops[0].trips, s.loops[1].trips),
        (Some(16), Some(16)),
        "cols bound through the call"
    );
    assert_eq!(s.loops[1].reads, ["x", "w"]);
    assert_eq!(s.loops[1].writes, ["y"]);
    let bits: Vec<(&str, Option<u32>, usize)> = s
        .buffers
        .iter()
        .map(|b| (b.name.as_str(), b.bits, b.read_passes))
        .collect();
    assert_eq!(
        bits,
        [("x", Some(16), 2), ("w", Some(16), 1), ("y", Some(16), 0)]
    );
}

#[test]
fn reduce_sum_is_a_grid_stride_loop_and_one_atomic() {
    let s = common::structure(&common::capture("reduce_sum-shape0"));
    assert_eq!(s.loops[0].pattern, "grid-stride");
    assert_eq!(
        s.loops[0].trips,
        Some(64),
        "16M elements over 1024 x 256 threads"
    );
    assert_eq!(s.atomics.len(), 1);
    let a = &s.atomics[0];
    assert_eq!(
        (
            a.op.as_str(),
            a.target.as_str(),
            a.space.as_str(),
            a.in_loop
        ),
        ("atomicAdd", "out", "global", false)
    );
}

#[test]
fn gqa_decode_runs_a_serial_loop_over_the_sequence() {
    let s = common::structure(&common::capture("gqa_decode-shape0"));
    assert_eq!(
        loops("gqa_decode-shape0")[..6],
        [
            l("block-stride", "d < HEAD_DIM", 1, 1, 0),
            l("block-stride", "s < seq_len", 8, 8, 0),
            l("sequential", "d < HEAD_DIM", 128, 1024, 1),
            l("block-stride", "s < seq_len", 8, 8, 0),
            l("block-stride", "d < HEAD_DIM", 1, 1, 0),
            l("sequential", "s < seq_len", 1024, 1024, 1),
        ]
    );
    let serial = s.longest_serial_loop().unwrap();
    assert_eq!(
        (
            serial.condition.as_str(),
            serial.trips,
            serial.reads.as_slice()
        ),
        ("s < seq_len", Some(1024), &["v".to_string()][..])
    );
    let scores = s.shared.iter().find(|a| a.name == "scores").unwrap();
    assert!(scores.dynamic);
    assert_eq!(
        scores.bytes,
        Some(4096),
        "seq_len floats of dynamic shared memory"
    );
    let qs = s.shared.iter().find(|a| a.name == "qs").unwrap();
    assert_eq!((qs.size.as_str(), qs.bytes), ("HEAD_DIM", Some(512)));
    assert_eq!(s.sync.syncthreads, 3);
    assert!(s.render().contains("sequential `s < seq_len` gqa_decode_f16, 1024/thread; reads v (kernels/gqa_decode.cu:56)"), "{}", s.render());
}

#[test]
fn local_arrays_and_unknown_bounds() {
    let src = "extern \"C\" __global__ void k(float* out, const float* in, int n) {\n  float acc[8];\n  int i = 0;\n  while (i < n) { acc[i % 8] += in[i]; ++i; }\n  for (int j = 0; j < n * m; ++j) out[j] = acc[j % 8];\n  atomicMax((int*)out, 1);\n}\n";
    let s = structure::summarize(
        src,
        "k",
        &Env {
            values: [("n".to_string(), 100)].into(),
            block: [32, 1, 1],
            grid: [1, 1, 1],
            smem: 0,
        },
    )
    .unwrap();
    assert_eq!(s.local_arrays.len(), 1);
    assert_eq!(
        (
            s.local_arrays[0].name.as_str(),
            s.local_arrays[0].size.as_str()
        ),
        ("acc", "8")
    );
    assert_eq!(s.loops[0].pattern, "other");
    assert_eq!(
        s.loops[1].trips, None,
        "`m` is unknown: no count rather than a guess"
    );
    assert_eq!(s.atomics[0].target, "out");
    assert!(structure::summarize(src, "missing", &Env::default())
        .unwrap_err()
        .contains("no definition of `missing`"));
}
