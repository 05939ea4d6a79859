//! The search's random numbers: SplitMix64, so that a seed gives the same sequence on
//! every platform and with every version of every dependency (a run is reproducible from
//! its journal's seed alone).

/// A small, deterministic generator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// A generator for one purpose (`stream`) under a seed: strategies derive theirs so
    /// that two strategies under one seed do not share a sequence.
    pub fn derive(seed: u64, stream: &str) -> Self {
        let mut h: u64 = 0xCBF2_9CE4_8422_2325;
        for b in stream.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01B3);
        }
        let mut r = Rng(seed ^ h);
        r.next_u64();
        r
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), without modulo bias worth speaking of (128-bit
    /// multiply-high).
    pub fn below(&mut self, n: usize) -> usize {
        assert!(n > 0, "Rng::below(0)");
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Fisher-Yates.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }

    /// An index drawn with probability proportional to `weights` (non-negative; all zero
    /// means uniform).
    pub fn weighted(&mut self, weights: &[f64]) -> usize {
        assert!(!weights.is_empty(), "Rng::weighted of nothing");
        let total: f64 = weights.iter().map(|w| w.max(0.0)).sum();
        if total <= 0.0 || !total.is_finite() {
            return self.below(weights.len());
        }
        let mut x = self.unit() * total;
        for (i, w) in weights.iter().enumerate() {
            x -= w.max(0.0);
            if x < 0.0 {
                return i;
            }
        }
        weights.len() - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_are_fixed_by_the_seed() {
        let a: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..4).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        // SplitMix64's published first output for seed 0.
        assert_eq!(Rng::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_ne!(Rng::derive(7, "random"), Rng::derive(7, "hill"));
    }

    #[test]
    fn draws_stay_in_range_and_cover_it() {
        let mut r = Rng::new(3);
        let mut seen = [0usize; 5];
        for _ in 0..5000 {
            seen[r.below(5)] += 1;
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
        let mut w = [0usize; 3];
        for _ in 0..3000 {
            w[r.weighted(&[0.0, 1.0, 3.0])] += 1;
        }
        assert_eq!(w[0], 0);
        assert!(w[2] > 2 * w[1], "{w:?}");
        let mut v: Vec<u32> = (0..10).collect();
        r.shuffle(&mut v);
        let mut s = v.clone();
        s.sort();
        assert_eq!(s, (0..10).collect::<Vec<_>>());
    }
}
