//! `--partition slice:M/N|hash:M/N`: a deterministic share of a workspace's kernels, so
//! that N machines (a CI matrix, a Slurm array, a Kubernetes indexed job) each take one
//! part, as `cargo nextest run --partition` does for tests.
//!
//! A kernel is named by its qualified name, `package::kernel`. `slice:M/N` sorts the
//! workspace's qualified names and gives the i-th (from 0) to part `i mod N + 1`: parts
//! differ in size by one at most, but adding a kernel can move others to another part.
//! `hash:M/N` gives a kernel to part `FNV-1a-64(name) mod N + 1`: a kernel stays in its part
//! whatever else is added, at the price of uneven parts. Both depend only on the names
//! (never on the order files were found, on the machine, or on a per-process random hash
//! seed), and M is 1-based.
//!
//! The partition is taken over every kernel the package selection gathers, before the
//! kernel names given on the command line filter them, so that a kernel's part does not
//! depend on which others a job names.

use std::str::FromStr;

use crate::gather::{Gathered, Kernel};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Slice,
    Hash,
}

/// One part of N.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    pub scheme: Scheme,
    /// 1-based.
    pub part: u64,
    pub total: u64,
}

impl FromStr for Partition {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let usage = "write `slice:M/N` or `hash:M/N` with 1 <= M <= N (e.g. `slice:1/4`)";
        let (scheme, rest) = s
            .split_once(':')
            .ok_or_else(|| format!("`--partition {s}`: {usage}"))?;
        let scheme = match scheme {
            "slice" => Scheme::Slice,
            "hash" => Scheme::Hash,
            other => {
                return Err(format!(
                    "`--partition {s}`: `{other}` is not a partition scheme; {usage}"
                ))
            }
        };
        let (m, n) = rest
            .split_once('/')
            .ok_or_else(|| format!("`--partition {s}`: {usage}"))?;
        let parse = |x: &str, what: &str| {
            x.trim()
                .parse::<u64>()
                .map_err(|_| format!("`--partition {s}`: `{x}` is not a {what}; {usage}"))
        };
        let (part, total) = (parse(m, "part number")?, parse(n, "number of parts")?);
        if total == 0 {
            return Err(format!(
                "`--partition {s}`: there must be at least one part; {usage}"
            ));
        }
        if part == 0 || part > total {
            return Err(format!(
                "`--partition {s}`: part {part} does not exist, parts are numbered 1 to {total}; {usage}"
            ));
        }
        Ok(Partition {
            scheme,
            part,
            total,
        })
    }
}

impl std::fmt::Display for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = match self.scheme {
            Scheme::Slice => "slice",
            Scheme::Hash => "hash",
        };
        write!(f, "{scheme}:{}/{}", self.part, self.total)
    }
}

/// FNV-1a, 64 bits: fixed, so a kernel's part is the same on every machine and release.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A kernel's qualified name, what partitions are computed over.
pub fn qualified_name(k: &Kernel) -> String {
    format!("{}::{}", k.package, k.spec.name)
}

impl Partition {
    /// For each name (in the order given), whether it belongs to this part.
    pub fn members(&self, names: &[String]) -> Vec<bool> {
        match self.scheme {
            Scheme::Hash => names
                .iter()
                .map(|n| fnv1a64(n.as_bytes()) % self.total + 1 == self.part)
                .collect(),
            Scheme::Slice => {
                let mut sorted: Vec<&String> = names.iter().collect();
                sorted.sort();
                sorted.dedup();
                names
                    .iter()
                    .map(|n| {
                        let i = sorted.binary_search(&n).expect("every name is in the list") as u64;
                        i % self.total + 1 == self.part
                    })
                    .collect()
            }
        }
    }

    /// Keeps the gathered kernels of this part only.
    pub fn apply(&self, g: &mut Gathered) {
        let names: Vec<String> = g.kernels.iter().map(qualified_name).collect();
        let keep = self.members(&names);
        let mut keep = keep.into_iter();
        g.kernels.retain(|_| keep.next().unwrap_or(false));
    }
}

/// Applies an optional partition.
pub fn select(g: &mut Gathered, partition: Option<&Partition>) {
    if let Some(p) = partition {
        p.apply(g);
    }
}
