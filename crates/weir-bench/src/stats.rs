//! Small statistics: the median and spread (min–max) of repeated measurements, and
//! nearest-rank percentiles of latency samples.

use serde::Serialize;

/// The median of a set of repetitions and how far they spread.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// How many values (repetitions) it summarises.
    pub n: usize,
}

impl Spread {
    /// `max - min` relative to the median (0.05 = the repetitions lie within 5 %).
    pub fn relative(&self) -> f64 {
        if self.median == 0.0 {
            0.0
        } else {
            (self.max - self.min) / self.median
        }
    }
}

/// Median (mean of the middle two for an even count), min and max; `None` when `xs` holds
/// no finite value. Non-finite values (NaN, infinities) are ignored.
pub fn spread(xs: &[f64]) -> Option<Spread> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(Spread {
        median,
        min: v[0],
        max: v[n - 1],
        n,
    })
}

/// The spread of the values that are present (`None` entries are skipped).
pub fn spread_opt(xs: &[Option<f64>]) -> Option<Spread> {
    let v: Vec<f64> = xs.iter().flatten().copied().collect();
    spread(&v)
}

/// Nearest-rank percentile (`p` in 0..=100) of an ascending slice: the smallest value with at
/// least `p` % of the samples at or below it. `None` for an empty slice.
pub fn percentile_sorted<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    // The epsilon keeps 99.9 % of 1000 at rank 999 despite 0.999 * 1000 = 999.0000000000001.
    let rank = ((p / 100.0) * sorted.len() as f64 - 1e-9).ceil() as usize;
    let idx = rank.clamp(1, sorted.len()) - 1;
    Some(sorted[idx])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        let s = spread(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        let s = spread(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.5, 1.0, 4.0, 4));
        let s = spread(&[7.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (7.0, 7.0, 7.0));
    }

    #[test]
    fn spread_ignores_non_finite_and_empty_is_none() {
        assert!(spread(&[]).is_none());
        assert!(spread(&[f64::NAN]).is_none());
        let s = spread(&[f64::NAN, 10.0, f64::INFINITY, 20.0]).unwrap();
        assert_eq!((s.median, s.n), (15.0, 2));
        let s = spread_opt(&[None, Some(5.0), None]).unwrap();
        assert_eq!(s.median, 5.0);
        assert!(spread_opt(&[None]).is_none());
    }

    #[test]
    fn relative_spread() {
        let s = spread(&[90.0, 100.0, 110.0]).unwrap();
        assert!((s.relative() - 0.2).abs() < 1e-12);
        assert_eq!(spread(&[0.0]).unwrap().relative(), 0.0);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile_sorted(&v, 50.0), Some(500));
        assert_eq!(percentile_sorted(&v, 99.0), Some(990));
        assert_eq!(percentile_sorted(&v, 99.9), Some(999));
        assert_eq!(percentile_sorted(&v, 100.0), Some(1000));
        assert_eq!(percentile_sorted(&v, 0.0), Some(1));
        assert_eq!(percentile_sorted(&[42], 99.9), Some(42));
        assert_eq!(percentile_sorted::<u64>(&[], 50.0), None);
    }
}
