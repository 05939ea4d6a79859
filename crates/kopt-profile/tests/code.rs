//! The SASS and PTX summaries, on hand-written excerpts laid out as `cuobjdump -sass`,
//! `nvdisasm` and NVRTC print them (marked as excerpts in the files: no GPU toolkit was
//! available where these were written).

mod common;

use std::collections::BTreeMap;

use kopt_profile::sass;

fn counts<K: Ord + Clone>(items: &[(K, usize)]) -> BTreeMap<K, usize> {
    items.iter().cloned().collect()
}

#[test]
fn cuobjdump_sass_of_a_vectorised_softmax() {
    let s = sass::summarize_sass(&common::read("excerpt-softmax-vec4.sass"));
    assert_eq!(s.kind, "sass");
    assert_eq!(s.functions, ["softmax_f32"]);
    assert_eq!(
        s.instructions, 24,
        "encoding lines and headers are not instructions"
    );
    assert_eq!(s.global_loads, counts(&[(128, 2)]));
    assert_eq!(s.global_stores, counts(&[(128, 1)]));
    assert_eq!(s.main_global_load_bits(), Some(128));
    assert_eq!(
        (
            s.shared_loads.values().sum::<usize>(),
            s.shared_stores.values().sum::<usize>()
        ),
        (1, 1)
    );
    assert_eq!(s.barriers, 2);
    assert_eq!((s.local_loads, s.local_stores), (0, 0));
    assert!(s.tensor.is_empty() && s.atomics.is_empty());
    assert_eq!(s.classes["fp32"], 4);
    assert_eq!(s.classes["special function"], 1);
    assert_eq!(s.classes["control"], 4, "a predicated EXIT counts as EXIT");
    assert_eq!(s.opcodes["LDG"], 2);
    assert_eq!(
        s.one_line(),
        "24 instructions; global loads 2 x 128-bit; global stores 1 x 128-bit; 2 barriers; no tensor-core instructions"
    );
}

#[test]
fn nvdisasm_sass_with_spills_tensor_cores_and_atomics() {
    let s = sass::summarize_sass(&common::read("excerpt-spills-mma.sass"));
    assert_eq!(s.functions, ["mma_kernel"]);
    assert_eq!(s.instructions, 15);
    assert_eq!((s.local_loads, s.local_stores), (1, 2));
    assert_eq!(s.global_loads, counts(&[(16, 1), (64, 1)]));
    assert_eq!(s.global_stores, counts(&[(16, 1)]));
    assert_eq!(
        s.main_global_load_bits(),
        Some(16),
        "a tie goes to the narrower width"
    );
    assert_eq!(
        s.tensor,
        counts(&[("HGMMA".to_string(), 1), ("HMMA".to_string(), 1)])
    );
    assert_eq!(
        s.atomics,
        counts(&[("ATOMG".to_string(), 1), ("RED".to_string(), 1)])
    );
    assert_eq!(s.classes["shared load"], 1, "LDSM");
    assert!(
        s.one_line().contains("local memory 1 loads, 2 stores"),
        "{}",
        s.one_line()
    );
    assert!(
        s.one_line().contains("tensor cores HGMMA x1, HMMA x1"),
        "{}",
        s.one_line()
    );
}

#[test]
fn nvrtc_ptx() {
    let s = sass::summarize_ptx(&common::read("excerpt-softmax-vec4.ptx"));
    assert_eq!(s.kind, "ptx");
    assert_eq!(s.functions, ["softmax_f32"]);
    assert_eq!(
        s.instructions, 25,
        "directives, labels, braces and comments are not instructions"
    );
    assert_eq!(s.global_loads, counts(&[(16, 1), (128, 2)]));
    assert_eq!(s.global_stores, counts(&[(128, 1)]));
    assert_eq!(
        s.classes["parameter/constant"], 2,
        "ld.param is not a global load"
    );
    assert_eq!(s.barriers, 1);
    assert_eq!(s.classes["fp32"], 4);
    assert_eq!(s.classes["integer"], 3);
    assert_eq!(s.classes["special function"], 1);
    assert_eq!(s.atomics, counts(&[("atom".to_string(), 1)]));
    assert_eq!(s.tensor, counts(&[("mma".to_string(), 1)]));
    assert_eq!(s.opcodes["ld.global"], 3);
}

#[test]
fn code_summaries_feed_the_figures() {
    use kopt_profile::measure::{self, Inputs, Source};
    let sass = sass::summarize_sass(&common::read("excerpt-spills-mma.sass"));
    let m = measure::collect(Inputs {
        sass: Some(&sass),
        ..Default::default()
    });
    assert_eq!(m["global_load_bits"].value, 16.0);
    assert_eq!(m["global_load_bits"].source, Source::Sass);
    assert_eq!(m["local_memory_ops"].value, 3.0);
    assert_eq!(m["tensor_ops"].value, 2.0);
    let findings = kopt_profile::classify::findings(&m);
    assert!(findings.iter().any(|f| f.id == "spills"), "{findings:?}");
}
