//! The progress bar of `search` and `search-bench`: points done, the best so far, what the
//! device is doing. Drawn from the search's events ([`SearchObserver`]).

use kopt_loop::search::SearchObserver;
use kopt_search::run::Record;

pub struct SearchBar {
    hidden: bool,
    bar: Option<indicatif::ProgressBar>,
}

impl SearchBar {
    /// A bar drawn on stderr, or none at all when `hidden` (`--message-format json`).
    pub fn new(hidden: bool) -> Self {
        SearchBar { hidden, bar: None }
    }

    /// The bar, drawn from the first event on.
    fn bar(&mut self) -> &indicatif::ProgressBar {
        let hidden = self.hidden;
        self.bar.get_or_insert_with(|| {
            if hidden {
                return indicatif::ProgressBar::hidden();
            }
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} {pos}/{len} points {elapsed:>4} | best: {prefix} | {wide_msg}",
                )
                .expect("valid template"),
            );
            bar.set_prefix("–");
            bar.enable_steady_tick(std::time::Duration::from_millis(120));
            bar
        })
    }
}

impl SearchObserver for SearchBar {
    fn started(&mut self, points: u64) {
        self.bar().set_length(points);
    }

    fn point_done(&mut self, r: &Record, best: Option<&Record>) {
        let bar = self.bar();
        bar.inc(1);
        if let Some(b) = best.and_then(|b| Some((b, b.outcome.cost?))) {
            bar.set_prefix(format!("{} ({:.2}x)", b.0.label, 1.0 / b.1));
        }
        bar.set_message(format!(
            "{}: {}",
            r.label,
            match r.outcome.cost {
                Some(c) => format!("{:.2}x", 1.0 / c),
                None => r.outcome.failure.clone().unwrap_or_default(),
            }
        ));
    }

    fn message(&mut self, message: &str) {
        self.bar().set_message(message.to_string());
    }

    fn finished(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
