//! `--partition`: every kernel in exactly one part, the same parts whatever the order the
//! kernels were found in, and clear errors for specs that name no part.

use kopt_workspace::partition::{fnv1a64, Partition, Scheme};

fn names() -> Vec<String> {
    [
        "llm-kernels::softmax",
        "llm-kernels::rmsnorm",
        "llm-kernels::reduce_sum",
        "llm-kernels::gqa_decode",
        "llm-kernels::row_sum",
        "other::softmax",
        "other::gemm",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn parts_of(spec_scheme: &str, total: u64, names: &[String]) -> Vec<u64> {
    let mut part_of = vec![0u64; names.len()];
    for m in 1..=total {
        let p: Partition = format!("{spec_scheme}:{m}/{total}").parse().unwrap();
        for (i, member) in p.members(names).into_iter().enumerate() {
            if member {
                assert_eq!(part_of[i], 0, "{} is in two parts", names[i]);
                part_of[i] = m;
            }
        }
    }
    assert!(
        part_of.iter().all(|&p| p > 0),
        "every kernel lands in a part: {part_of:?}"
    );
    part_of
}

#[test]
fn every_kernel_lands_in_exactly_one_part() {
    for scheme in ["slice", "hash"] {
        for total in 1..=8 {
            parts_of(scheme, total, &names());
        }
    }
    // slice: the i-th name in sorted order goes to part i mod N + 1, so parts are even.
    let mut sorted = names();
    sorted.sort();
    assert_eq!(parts_of("slice", 3, &sorted), [1, 2, 3, 1, 2, 3, 1]);
}

#[test]
fn parts_depend_on_the_names_only_not_on_their_order() {
    let forward = names();
    let mut backward = names();
    backward.reverse();
    for scheme in ["slice", "hash"] {
        for total in [2, 3, 5] {
            let a = parts_of(scheme, total, &forward);
            let mut b = parts_of(scheme, total, &backward);
            b.reverse();
            assert_eq!(a, b, "{scheme} over {total} parts");
        }
    }
    // hash: a kernel keeps its part whatever else is in the workspace.
    let alone = parts_of("hash", 4, &names()[..1]);
    assert_eq!(alone[0], parts_of("hash", 4, &names())[0]);
}

#[test]
fn the_hash_is_fixed_fnv1a() {
    // Published FNV-1a 64 test vectors: the parts must not change between releases.
    assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
}

#[test]
fn specs_parse_and_bad_ones_say_how_to_write_them() {
    assert_eq!(
        "hash:2/3".parse::<Partition>().unwrap(),
        Partition {
            scheme: Scheme::Hash,
            part: 2,
            total: 3
        }
    );
    assert_eq!(
        "slice:1/4".parse::<Partition>().unwrap().to_string(),
        "slice:1/4"
    );
    for (spec, needle) in [
        (
            "slice:0/2",
            "part 0 does not exist, parts are numbered 1 to 2",
        ),
        (
            "slice:3/2",
            "part 3 does not exist, parts are numbered 1 to 2",
        ),
        ("foo:1/2", "`foo` is not a partition scheme"),
        ("slice:1/0", "at least one part"),
        ("slice:x/2", "`x` is not a part number"),
        ("slice", "write `slice:M/N` or `hash:M/N`"),
        ("hash:1-2", "write `slice:M/N` or `hash:M/N`"),
    ] {
        let e = spec.parse::<Partition>().unwrap_err();
        assert!(e.contains(needle) && e.contains("slice:M/N"), "{spec}: {e}");
    }
}
