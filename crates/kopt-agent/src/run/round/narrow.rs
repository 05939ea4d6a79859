//! The loop's last step: a winner slower than the reference on some declared shapes is
//! narrowed to the shapes where it is not, and the reference keeps the others.
//!
//! A winner is judged against the best of its time, and a new best may be a little slower
//! than the reference on some shape and still win (faster by more than the rule's gain
//! elsewhere, and inside the watchdog's threshold there): one variant then covers a shape
//! the reference runs faster. The reference is timed in every job, so the winner's own
//! verdict says where; narrowing turns such a winner into the winner of the region where
//! it is not slower, found and verified again as a found region is.

use super::*;
use crate::proposal::{Candidate, Diagnosis, ExpectedEffect, Proposal, ProposedChange};
use crate::run::Narrowed;

/// The least difference called slower than the reference when the noise measured between
/// two jobs is smaller (or was not measured): differences of about 1% move between
/// sessions on the H200 (`examples/llm-kernels/FINDINGS.md`).
pub const NARROWING_FLOOR: f64 = 0.01;

/// A winner to narrow: its version, its proposal, its verdict and where it came from.
struct Subject {
    version: KernelVersion,
    resolved: Resolved,
    verdict: Verdict,
    /// Its region, when it already wins only part of the shapes.
    region: Option<String>,
    was_best: bool,
    is_start: bool,
}

impl LoopState<'_> {
    /// The loop's last step before [`LoopState::finish`]. Each winner (the best on every
    /// shape, or the accepted variant the loop started from when nothing beat it, and each
    /// region's) that is slower than the reference, timed in the same job, on some declared
    /// shape it was timed on, by more than that shape's timing noise (at least
    /// [`NARROWING_FLOOR`]), is narrowed: the tightest condition that holds on the shapes
    /// where it is not slower and on none where it is
    /// ([`kopt_spec::regions::separating_region`]), the winner verified again there against
    /// the reference (candidate `<id>-narrowed`, counted as a candidate but never stopped
    /// by a budget: it verifies a winner, it does not explore). Where it wins there, it
    /// becomes that region's winner ([`RegionalWinner::narrowed`]) and the reference keeps
    /// the rest; where no condition separates the shapes or the second verification does
    /// not win, it stays as it was. Each outcome is sent as an [`Event::Narrowing`].
    pub fn narrow_to_reference(&mut self, evaluator: &mut dyn Evaluate, on: &mut dyn FnMut(Event)) {
        self.settle_regions();
        let mut subjects = Vec::new();
        match (&self.found, &self.start) {
            (Some((version, resolved, verdict)), _) => subjects.push(Subject {
                version: version.clone(),
                resolved: resolved.clone(),
                verdict: verdict.clone(),
                region: None,
                was_best: true,
                is_start: false,
            }),
            (None, Some(s)) => subjects.push(Subject {
                version: s.version.clone(),
                resolved: start_resolved(s),
                verdict: s.verdict.clone(),
                region: None,
                was_best: true,
                is_start: true,
            }),
            (None, None) => {}
        }
        for w in self.regional.iter().filter(|w| w.narrowed.is_none()) {
            subjects.push(Subject {
                version: w.version.clone(),
                resolved: w.resolved.clone(),
                verdict: w.verdict.clone(),
                region: Some(w.region.clone()),
                was_best: false,
                is_start: false,
            });
        }
        for s in subjects {
            self.narrow(s, evaluator, on);
        }
    }

    /// The declared shapes `verdict` timed where the candidate is slower than the reference
    /// by more than the shape's noise, and those where it is not.
    fn against_reference(&self, verdict: &Verdict) -> (Vec<String>, Vec<String>) {
        let (mut slow, mut not_slow) = (Vec::new(), Vec::new());
        for s in verdict.shapes.iter().filter(|s| !s.held_out) {
            let (Some(c), Some(r)) = (s.candidate_us, s.reference_us) else {
                continue;
            };
            if c > r * (1.0 + self.slack(&s.shape)) {
                slow.push(s.shape.clone());
            } else {
                not_slow.push(s.shape.clone());
            }
        }
        (slow, not_slow)
    }

    /// How much slower than the reference a shape may be and still count as not slower.
    fn slack(&self, shape: &str) -> f64 {
        self.rules
            .noise
            .get(shape)
            .copied()
            .unwrap_or(0.0)
            .max(NARROWING_FLOOR)
    }

    fn narrow(&mut self, s: Subject, evaluator: &mut dyn Evaluate, on: &mut dyn FnMut(Event)) {
        let id = s.version.id.clone();
        let (slow, won) = self.against_reference(&s.verdict);
        if slow.is_empty() {
            return;
        }
        let figures: Vec<String> = s
            .verdict
            .shapes
            .iter()
            .filter(|f| slow.contains(&f.shape))
            .filter_map(|f| {
                Some(format!(
                    "{}: {:.2} µs against the reference's {:.2} µs",
                    f.shape, f.candidate_us?, f.reference_us?
                ))
            })
            .collect();
        let mut say = |detail: String| {
            on(Event::Narrowing {
                id: id.clone(),
                detail,
            })
        };
        if won.is_empty() {
            say(format!(
                "slower than the reference on every declared shape it was timed on ({}): kept as it was",
                figures.join("; ")
            ));
            return;
        }
        let args = |labels: &[String]| -> Vec<Vec<i64>> {
            labels
                .iter()
                .filter_map(|l| kopt_spec::regions::label_args(&self.spec, l))
                .collect()
        };
        let held_out: Vec<String> = s
            .verdict
            .shapes
            .iter()
            .filter(|f| f.held_out)
            .map(|f| f.shape.clone())
            .collect();
        let Some(found) = kopt_spec::regions::separating_region(
            &self.spec,
            &args(&won),
            &args(&slow),
            &args(&held_out),
        ) else {
            say(format!(
                "slower than the reference on {}, but no condition over the scalar arguments separates those shapes from the others: kept for every shape it won",
                figures.join("; ")
            ));
            return;
        };
        let region = match &s.region {
            Some(old) => format!("({old}) && ({})", found.text),
            None => found.text.clone(),
        };
        let again = format!("{id}-narrowed");
        self.candidates += 1;
        on(Event::Candidate { id: again.clone() });
        let mut v = s.version.clone();
        v.id = again.clone();
        let second = evaluator.evaluate(&mut v, None, Some(&region));
        on(Event::Verdict {
            id: again.clone(),
            accepted: second.accepted,
            summary: second.summary(),
            round: self.rounds,
            diagnosis: format!(
                "{id} on `{region}`, where kopt narrowed it: slower than the reference on {}",
                slow.join("; ")
            ),
            point: None,
            version: Box::new(v.clone()),
            verdict: Box::new(second.clone()),
            best_us: None,
            from_record: evaluator.last_from_record(),
        });
        let mut resolved = s.resolved.clone();
        resolved.proposal.region = Some(region.clone());
        self.tried.push(Tried::of(
            self.rounds,
            &again,
            resolved.clone(),
            second.clone(),
        ));
        let Some(speedup) = improvement(&second, &self.rules) else {
            on(Event::Narrowing {
                id: id.clone(),
                detail: format!(
                    "slower than the reference on {}; verified again where `{region}`, it did not win there ({}): kept as it was",
                    figures.join("; "),
                    second.summary().lines().next().unwrap_or("")
                ),
            });
            return;
        };
        let retires_start =
            s.was_best && self.start.is_some() && (s.is_start || self.start_not_faster_on(&slow));
        on(Event::Narrowing {
            id: id.clone(),
            detail: format!(
                "slower than the reference on {}: narrowed to `{region}` ({speedup:.2}x over the reference there){}",
                figures.join("; "),
                if retires_start {
                    "; accepting it retires the accepted variant the loop started from, so that the reference runs the other shapes"
                } else {
                    ""
                }
            ),
        });
        on(Event::RegionalWinner {
            id: again,
            region: region.clone(),
            found: true,
            speedup,
        });
        let winner = RegionalWinner {
            region,
            found: Some(FoundRegion {
                won,
                lost: slow,
                held_out_inside: found.others_inside,
                lost_to: LostTo::Reference,
            }),
            version: v,
            resolved,
            verdict: second,
            speedup,
            narrowed: Some(Narrowed {
                was_best: s.was_best,
                is_start: s.is_start,
                retires_start,
            }),
        };
        match &s.region {
            Some(old) => self.regional.retain(|w| &w.region != old),
            None => {
                self.found = None;
                self.found_sweep = None;
            }
        }
        self.regional.push(winner);
    }

    /// Whether the accepted variant the loop started from was not faster than the
    /// reference (beyond the noise) on any of `shapes`, in its verification at the start.
    fn start_not_faster_on(&self, shapes: &[String]) -> bool {
        let Some(start) = &self.start else {
            return true;
        };
        start
            .verdict
            .shapes
            .iter()
            .filter(|f| shapes.contains(&f.shape))
            .all(|f| match (f.candidate_us, f.reference_us) {
                (Some(c), Some(r)) => c * (1.0 + self.slack(&f.shape)) >= r,
                _ => true,
            })
    }
}

/// The proposal a narrowed start stands on: kopt's own, since no agent proposed it in this
/// run. It changes no code; the evidence is the start's verification.
fn start_resolved(s: &Start) -> Resolved {
    let evidence = s
        .verdict
        .shapes
        .iter()
        .filter(|f| !f.held_out)
        .filter_map(|f| {
            Some(format!(
                "{}: {:.2} µs, the reference {:.2} µs in the same job",
                f.shape, f.candidate_us?, f.reference_us?
            ))
        })
        .collect();
    Resolved {
        proposal: Proposal {
            diagnosis: Diagnosis {
                bottleneck: "slower than the reference on some shapes".into(),
                summary: format!(
                    "The accepted `{}`, verified again at the start of the loop, is slower than the reference on some declared shapes, and no candidate of the run beat it.",
                    s.version.id
                ),
                evidence,
            },
            changes: vec![ProposedChange {
                what: "none to the code: the same source, launch rule and defines, for the region kopt found only".into(),
                why: "the reference runs the shapes where it was faster".into(),
            }],
            risks: Vec::new(),
            expected: vec![ExpectedEffect {
                metric: "time on the shapes the region leaves out".into(),
                change: "the reference's".into(),
            }],
            candidate: Candidate {
                source: Some(s.version.source.clone()),
                diff: None,
                entry: Some(s.version.entry.clone()),
                args: s.version.args.clone(),
            },
            launch: None,
            defines: s.version.defines.clone(),
            options: s.version.options.clone(),
            matrix: None,
            region: None,
        },
        source: s.version.source.clone(),
    }
}
