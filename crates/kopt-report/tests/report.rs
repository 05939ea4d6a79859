//! The report of the H200 runs in `docs/runs/` (bench, committed and pending evidence) and
//! of a search benchmark on the fake device: its structure and charts as snapshots, its
//! empty sections, and (with chromium) that the charts render in a browser.

use std::path::{Path, PathBuf};
use std::process::Command;

use kopt_report::{input, render, Report};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The fixture: real H200 measurements from `docs/runs/`, the example crate's committed
/// softmax variant as it was then (`tests/fixtures/llm-kernels-online-vec4`), and `cargo kopt
/// search-bench row_sum --seeds 5` on the fake device (fixed, unlike the GPU runs).
fn fixture() -> Report {
    let r = repo();
    let (pending, pending_broken) =
        input::read_pending(&r.join("docs/runs/2026-11-29-h200-optimize/pending"));
    Report {
        title: "kopt report: fixture".into(),
        generated: Some("2026-11-29".into()),
        sources: vec!["bench: docs/runs/2026-11-29-h200-evaluation/bench1.json".into()],
        bench: Some(
            input::read_bench(&r.join("docs/runs/2026-11-29-h200-evaluation/bench1.json")).unwrap(),
        ),
        search_benches: vec![input::read_search_bench(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/search-bench-fake-device.json"),
        )
        .unwrap()],
        // The example crate's committed files as they were when those runs were made (the
        // crate's own change as the loop accepts new winners).
        committed: input::read_committed(
            "llm-kernels",
            &r.join("tests/fixtures/llm-kernels-online-vec4"),
        ),
        pending,
        pending_broken,
    }
}

/// Headings, charts (with their element counts), tables and empty-section lines, in order.
fn outline(html: &str) -> String {
    let mut out = Vec::new();
    let mut chart: Option<(String, [usize; 4])> = None;
    for line in html.lines() {
        let l = line.trim_start();
        if let Some((head, counts)) = chart.as_mut() {
            counts[0] += l.matches("<rect").count();
            counts[1] += l.matches("<circle").count();
            counts[2] += l.matches("<path").count() + l.matches("<polyline").count();
            counts[3] += l.matches("<text").count();
            if l.starts_with("</svg>") {
                out.push(format!(
                    "{head} rects={} circles={} paths={} texts={}",
                    counts[0], counts[1], counts[2], counts[3]
                ));
                chart = None;
            }
            continue;
        }
        if l.starts_with("<svg") {
            let label = l
                .split("aria-label=\"")
                .nth(1)
                .and_then(|s| s.split('"').next());
            chart = Some((format!("  svg {:?}", label.unwrap_or("")), [0; 4]));
        } else if l.starts_with("<h1") || l.starts_with("<h2") || l.starts_with("<h3") {
            out.push(l.split("</h").next().unwrap_or(l).to_string());
        } else if l.starts_with("<table") {
            out.push("  table".into());
        } else if l.starts_with("<p class=\"empty\"") {
            out.push(format!("  {l}"));
        }
    }
    out.join("\n")
}

fn svg_by_id<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html
        .find(&format!("<svg id=\"{id}\""))
        .expect("chart present");
    let end = html[start..].find("</svg>").unwrap() + start + "</svg>".len();
    &html[start..end]
}

#[test]
fn the_report_of_the_h200_runs_has_its_sections_and_charts() {
    let html = render(&fixture());
    insta::assert_snapshot!("outline", outline(&html));
    insta::assert_snapshot!("roofline_svg", svg_by_id(&html, "roofline-chart"));
    insta::assert_snapshot!(
        "softmax_bars_svg",
        svg_by_id(&html, "bars-llm-kernels-softmax")
    );
    // Self-contained: no script, no external resource.
    for banned in ["<script", "http://", "https://", "@import", "url("] {
        let hits: Vec<&str> = html
            .lines()
            .filter(|l| l.contains(banned) && !l.contains("xmlns=\"http://www.w3.org/2000/svg\""))
            .collect();
        assert!(hits.is_empty(), "{banned} in {hits:?}");
    }
    assert_eq!(
        html,
        render(&fixture()),
        "the same inputs give the same file"
    );
}

#[test]
fn the_roofline_places_points_from_the_measured_shares() {
    let b = fixture().bench.unwrap();
    let c = b.ceilings.as_ref().unwrap();
    let softmax = &b.rows[0];
    // 81.9% of 4212 GB/s and 0.2795% of 771 TFLOP/s: 0.625 FLOP per byte, 2156 GFLOP/s.
    let gflops = softmax.flops_pct.unwrap() / 100.0 * c.matmul_peak_tflops().unwrap() * 1e3;
    let gbs = softmax.copy_bandwidth_pct.unwrap() / 100.0 * c.copy_gbs;
    assert!((gflops / gbs - 0.625).abs() < 0.01, "{}", gflops / gbs);
    let html = render(&fixture());
    let roof = svg_by_id(&html, "roofline-chart");
    assert!(
        roof.contains("softmax cols=4096 rows=4096 online-vec4: 0.62 FLOP/B, 2156 GFLOP/s"),
        "{roof}"
    );
    assert_eq!(softmax.roofline_pct().map(|p| p.1), Some("bw"));
}

#[test]
fn empty_sections_say_which_file_fills_them() {
    let html = render(&Report {
        title: "empty".into(),
        ..Report::default()
    });
    assert!(!html.contains("<svg"), "no chart without data");
    for needle in [
        "no bench file was given",
        "cargo kopt bench --message-format json",
        "the roofline needs the bench file",
        "cargo kopt search-bench KERNEL --json-out",
        "No input was read.",
    ] {
        assert!(html.contains(needle), "{needle}");
    }
    assert_eq!(kopt_report::gaps(&Report::default()).len(), 5);
}

#[test]
fn a_file_of_the_wrong_kind_is_refused_naming_the_command_that_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.json");
    std::fs::write(&p, r#"{"rows": 3}"#).unwrap();
    let e = input::read_bench(&p).unwrap_err();
    assert!(
        e.contains("cargo kopt bench --message-format json > FILE"),
        "{e}"
    );
    let e = input::read_search_bench(&p).unwrap_err();
    assert!(e.contains("--json-out FILE"), "{e}");
    let e = input::read_bench(&dir.path().join("missing.json")).unwrap_err();
    assert!(e.contains("cannot read"), "{e}");
}

/// Colours of the light scheme (the page's style sheet) and the fewest pixels each must
/// cover: the reference and variant bars, the first kernels' roofline points and the
/// strategies' lines (a legend swatch alone covers under 100 pixels).
const SERIES: [(&str, [u8; 3], usize); 5] = [
    ("reference bars", [0x6c, 0x8e, 0xbf], 20_000),
    ("variant bars", [0xe6, 0x9f, 0x00], 20_000),
    ("softmax points / exhaustive line", [0x00, 0x72, 0xb2], 300),
    ("rmsnorm points / random line", [0xd5, 0x5e, 0x00], 250),
    ("reduce_sum points / hill line", [0x00, 0x9e, 0x73], 200),
];

fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|n| dirs.iter().map(move |d| d.join(n)))
        .find(|p| p.is_file())
}

/// Renders `html_path` in headless chromium and returns the screenshot.
fn screenshot(chromium: &Path, html_path: &Path, png_path: &Path, size: &str) {
    let profile = tempfile::tempdir().unwrap();
    let o = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--force-prefers-reduced-motion",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--screenshot={}", png_path.display()))
        .arg(format!("--window-size={size}"))
        .arg(format!("file://{}", html_path.display()))
        .output()
        .unwrap();
    assert!(
        o.status.success() && png_path.exists(),
        "chromium failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
#[ignore = "needs chromium (apt-get install chromium)"]
fn the_charts_render_in_headless_chromium() {
    let Some(chromium) = chromium() else {
        assert!(
            std::env::var("KOPT_REQUIRE_CHROMIUM").as_deref() != Ok("1"),
            "KOPT_REQUIRE_CHROMIUM=1 but no chromium on PATH (apt-get install chromium)"
        );
        eprintln!("skipped: no chromium on PATH (apt-get install chromium)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("report.html");
    let png_path = dir.path().join("report.png");
    std::fs::write(&html, render(&fixture())).unwrap();
    screenshot(&chromium, &html, &png_path, "1280,4400");
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(&png_path).unwrap(),
    ));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (1280, 4400));
    let channels = info.color_type.samples();
    let pixels: Vec<[u8; 3]> = buf[..info.buffer_size()]
        .chunks(channels)
        .map(|p| [p[0], p[1], p[2]])
        .collect();
    let count = |c: [u8; 3]| {
        pixels
            .iter()
            .filter(|p| p.iter().zip(c).all(|(a, b)| a.abs_diff(b) <= 6))
            .count()
    };
    for (what, colour, least) in SERIES {
        let n = count(colour);
        assert!(
            n >= least,
            "{what}: {n} pixels of {colour:?} (at least {least}): the chart did not render"
        );
    }
    // The per-shape bars come first: their colour fills the top of the page.
    let top = &pixels[..1280 * 1200];
    let bars = top
        .iter()
        .filter(|p| p.iter().zip(SERIES[0].1).all(|(a, b)| a.abs_diff(b) <= 6))
        .count();
    assert!(
        bars > 5_000,
        "reference bars: {bars} pixels in the first 1200 rows"
    );
}

#[test]
fn the_memory_bound_summary_of_an_h200_bench() {
    // One round of the suite on the H200: the GEMM's share is the matrix peak's, so the
    // other 23 shapes are the memory-bound ones (as the TABLE.md section of
    // docs/runs/2026-11-29-h200-dsmem-merge/README.md counts them over four rounds: 36.4%,
    // 93.0% and 83.6% in medians).
    let b = input::read_bench(
        &repo().join("docs/runs/2026-11-29-h200-dsmem-merge/rounds/bench-3.json"),
    )
    .unwrap();
    let m = b.memory_bound_summary().unwrap();
    let round1 = |x: f64| (x * 10.0).round() / 10.0;
    assert_eq!((m.shapes, m.large_shapes, m.same_size_shapes), (23, 14, 23));
    assert_eq!(round1(m.copy_bw_pct), 36.4);
    assert_eq!(m.large_copy_bw_pct.map(round1), Some(93.2));
    assert_eq!(m.same_size_copy_pct.map(round1), Some(83.4));
    assert_eq!(
        m.describe(),
        "memory-bound shapes: 36.4% of the copy bandwidth in geometric mean over all 23, 93.2% over the 14 that move 64 MiB or more; 83.4% of a same-size one-launch copy over 23"
    );
    let html = render(&Report {
        bench: Some(b),
        ..fixture()
    });
    assert!(html.contains("<p><strong>Memory-bound shapes: 36.4% of the copy bandwidth"));
}
