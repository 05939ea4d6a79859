//! The Nsight Compute parser on the captures of the H200 (2026-11-29, CUDA 13.0, driver
//! 580.159.04), committed as fixtures: the raw page of each example kernel, with ncu's
//! own lines and the worker's report mixed in, and a details-page run that ended in an
//! error.

mod common;

use kopt_profile::metrics::{self, CURATED};
use kopt_profile::ncu::{self, Level};

#[test]
fn every_capture_parses_into_one_kernel_with_normalised_metrics() {
    for (stem, _, _) in common::CAPTURES {
        let c = common::capture(stem);
        assert_eq!(c.ncu.kernels.len(), 1, "{stem}");
        let k = &c.ncu.kernels[0];
        assert_eq!(k.name, c.job.candidate.entry, "{stem}");
        assert_eq!(k.id, "0");
        // The identity columns, and one column per metric (870 columns in all).
        assert_eq!(k.identity.len() + 4 + k.metrics.len(), 870, "{stem}");
        assert_eq!(k.identity["CC"], "9.0");
        // The launch ncu saw is the one the job describes.
        let g = c.report.shapes[0].candidate.as_ref().unwrap().geometry;
        assert_eq!(
            k.block,
            format!("({}, {}, {})", g.block[0], g.block[1], g.block[2]),
            "{stem}"
        );
        assert_eq!(
            k.grid,
            format!("({}, {}, {})", g.grid[0], g.grid[1], g.grid[2]),
            "{stem}"
        );
        assert_eq!(
            k.value("launch__grid_size"),
            Some(g.grid[0] as f64),
            "{stem}"
        );
        // ncu's messages are recognised, the worker's report line is kept aside.
        assert!(c
            .ncu
            .messages
            .iter()
            .any(|m| m.level == Level::Warning && m.text.contains("unmodified GPU clocks")));
        assert_eq!(
            c.ncu
                .messages
                .iter()
                .filter(|m| m.level == Level::Prof)
                .count(),
            2,
            "{stem}"
        );
        assert_eq!(c.ncu.errors().count(), 0);
        assert_eq!(
            c.ncu.other.len(),
            1,
            "{stem}: only the worker's report is neither CSV nor ncu's"
        );
    }
}

#[test]
fn values_and_units_of_the_softmax_reference() {
    let c = common::capture("softmax-shape0");
    let k = &c.ncu.kernels[0];
    let m = &k.metrics["dram__bytes.sum.per_second"];
    assert_eq!(m.raw, "1,823,359,671,626.48");
    assert_eq!(
        (m.unit.as_str(), m.base_unit.as_str()),
        ("byte/s", "byte/s")
    );
    assert_eq!(m.value, Some(1_823_359_671_626.48));
    assert_eq!(k.value("gpu__time_duration.sum"), Some(62_368.0));
    assert_eq!(k.metrics["gpu__time_duration.sum"].base_unit, "ns");
    assert_eq!(
        k.value("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
        Some(37.91)
    );
    assert_eq!(k.value("lts__t_sector_hit_rate.pct"), Some(62.45));
    assert_eq!(
        k.value("smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"),
        Some(21.17)
    );
    // "no data" is a missing value, a tuple or a name is text.
    let nd = &k.metrics["derived__local_spilling_requests_pct"];
    assert_eq!((nd.raw.as_str(), nd.value), ("no data", None));
    assert_eq!(k.metrics["launch__func_cache_config"].value, None);
    assert_eq!(
        k.metrics["launch__func_cache_config"].raw,
        "CachePreferNone"
    );
    // A negative reading (ncu's min of a noisy counter) stays negative.
    let r = common::capture("rmsnorm-shape0");
    assert_eq!(
        r.ncu.kernels[0].value("sm__pipe_tensor_type_hmma_hgmma_qgmma_imma_igmma_bmma_bgmma_cycles_active.min.pct_of_peak_sustained_elapsed"),
        Some(-0.29)
    );
}

#[test]
fn the_curated_metrics_are_all_in_every_capture() {
    for (stem, _, _) in common::CAPTURES {
        let c = common::capture(stem);
        let k = &c.ncu.kernels[0];
        for m in CURATED {
            assert!(
                k.metrics.contains_key(m.name),
                "{stem}: `{}` is not in the capture",
                m.name
            );
            assert!(
                k.value(m.name).is_some(),
                "{stem}: `{}` has no number",
                m.name
            );
        }
    }
    let arg = metrics::metrics_argument();
    assert_eq!(arg.split(',').count(), CURATED.len());
    assert!(
        !arg.contains("derived__"),
        "derived metrics cannot be collected with --metrics"
    );
}

#[test]
fn the_details_page_and_its_errors() {
    let out = ncu::parse(&common::read("ncu-time-details.csv"));
    assert_eq!(out.kernels.len(), 387);
    assert!(out
        .kernels
        .iter()
        .all(|k| k.name == "rmsnorm_f16" && k.metrics.len() == 1));
    assert_eq!(
        out.kernels[1].value("gpu__time_duration.sum"),
        Some(89_920.0)
    );
    assert_eq!(out.kernels[1].identity["Process ID"], "922");
    assert_eq!(out.kernels[386].grid, "(64, 1, 1)");
    let errors: Vec<&str> = out.errors().collect();
    assert_eq!(
        errors,
        [
            "Failed to profile \"rmsnorm_f16\" in process 922",
            "The application returned an error code (9)."
        ]
    );
    assert!(out.other.is_empty());
}

#[test]
fn nothing_but_messages_is_an_empty_profile_with_its_reason() {
    let text = "==PROF== Connected to process 7 (/bin/cargo-kopt)\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters on the target device 0. For instructions on enabling permissions and to get more information see https://developer.nvidia.com/ERR_NVGPUCTRPERM\n";
    let out = ncu::parse(text);
    assert!(out.kernels.is_empty());
    let e = ncu::explain_error(out.errors().next().unwrap());
    assert!(e.starts_with("ncu: ERR_NVGPUCTRPERM"), "{e}");
    assert!(e.contains("NVreg_RestrictProfilingToAdminUsers=0"), "{e}");
}
