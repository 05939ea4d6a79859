//! The budgets of `cargo kopt optimize` as written on its command line: a kernel's
//! (`rounds=8,candidates=24,minutes=60,tokens=2000000,dollars=20`) and the whole run's
//! (`candidates=N,minutes=N,tokens=N,dollars=N`), any subset of each.

use kopt_agent::run::{Budget, RunLimits};

/// A budget that does not parse, naming what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error("`{0}`: write name=value (rounds, candidates, minutes, tokens, dollars)")]
    NotNameValue(String),
    #[error("`{part}`: `{value}` is not a number")]
    NotANumber { part: String, value: String },
    #[error("unknown budget `{0}`: use rounds, candidates, minutes, tokens, dollars")]
    Unknown(String),
    #[error("--run-budget `{0}`: write name=value (candidates, minutes, tokens, dollars)")]
    RunNotNameValue(String),
    #[error("--run-budget `{part}`: `{value}` is not a number")]
    RunNotANumber { part: String, value: String },
    #[error("--run-budget has no `rounds`: rounds are per kernel (`--budget rounds=N`)")]
    RunRounds,
    #[error("unknown run budget `{0}`: use candidates, minutes, tokens, dollars")]
    RunUnknown(String),
}

/// Each `name=value` of a budget, with its value parsed as `T`.
fn number<T: std::str::FromStr>(v: &str, bad: impl Fn() -> BudgetError) -> Result<T, BudgetError> {
    v.trim().parse().map_err(|_| bad())
}

fn minutes(v: &str, bad: impl Fn() -> BudgetError) -> Result<std::time::Duration, BudgetError> {
    Ok(std::time::Duration::from_secs_f64(
        number::<f64>(v, bad)? * 60.0,
    ))
}

/// A kernel's budget (`--budget`); none given is the default budget.
pub fn parse_budget(text: Option<&str>) -> Result<Budget, BudgetError> {
    let mut b = Budget::default();
    let Some(text) = text else { return Ok(b) };
    for part in text.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| BudgetError::NotNameValue(part.into()))?;
        let bad = || BudgetError::NotANumber {
            part: part.into(),
            value: v.into(),
        };
        match k.trim() {
            "rounds" => b.rounds = number(v, bad)?,
            "candidates" => b.candidates = number(v, bad)?,
            "minutes" => b.wall = minutes(v, bad)?,
            "tokens" => b.tokens = number(v, bad)?,
            "dollars" => b.dollars = number(v, bad)?,
            other => return Err(BudgetError::Unknown(other.into())),
        }
    }
    Ok(b)
}

/// The whole run's limits (`--run-budget`); none given is no limit.
pub fn parse_run_budget(text: Option<&str>) -> Result<RunLimits, BudgetError> {
    let mut l = RunLimits::default();
    let Some(text) = text else { return Ok(l) };
    for part in text.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| BudgetError::RunNotNameValue(part.into()))?;
        let bad = || BudgetError::RunNotANumber {
            part: part.into(),
            value: v.into(),
        };
        match k.trim() {
            "candidates" => l.candidates = Some(number(v, bad)?),
            "minutes" => l.wall = Some(minutes(v, bad)?),
            "tokens" => l.tokens = Some(number(v, bad)?),
            "dollars" => l.dollars = Some(number(v, bad)?),
            "rounds" => return Err(BudgetError::RunRounds),
            other => return Err(BudgetError::RunUnknown(other.into())),
        }
    }
    Ok(l)
}
