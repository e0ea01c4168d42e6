//! Batch means: a running mean whose interval holds for correlated samples.
//!
//! The samples an arm collects one after another are strongly correlated:
//! the queue delays of jobs that waited in one busy queue, the allocation
//! of consecutive rounds. Treating them as independent makes intervals far
//! too narrow — an A/A test of a policy against an identical copy "found"
//! differences at p = 1e-15. Non-overlapping batch means (Schmeiser 1982;
//! Law & Kelton, *Simulation Modeling and Analysis*, §9.5.3) group
//! consecutive samples into batches and treat the batch means, not the
//! samples, as the independent observations: with batches much longer than
//! the correlation they nearly are, and the interval is Student's t on the
//! batch means. The batch count stays between [`MIN_BATCHES`] and twice
//! that by doubling the batch size (merging neighbours) whenever it reaches
//! the upper bound, so memory is constant however long an experiment runs
//! (the idea of Fishman & Yarberry's LABATCH).

use super::dist::t_quantile;
use serde::{Deserialize, Serialize};

/// Batches left after a merge; between this and twice this are kept.
/// Schmeiser's advice is 10 to 30 batches: fewer cost power (the t
/// quantile grows), more leave each batch too short to be independent.
pub const MIN_BATCHES: usize = 10;

/// A mean and its two-sided interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval {
    pub mean: f64,
    pub low: f64,
    pub high: f64,
}

/// The running statistic: every sample in the mean, full batches for the spread.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchMeans {
    n: u64,
    sum: f64,
    /// Samples per batch (0 before the first sample: read as 1).
    batch_size: u64,
    /// Sums of the full batches, oldest first.
    batches: Vec<f64>,
    open_sum: f64,
    open_n: u64,
}

impl BatchMeans {
    /// Adds a sample; a non-finite one is ignored (it carries no measurement).
    pub fn push(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        self.n += 1;
        self.sum += x;
        self.open_sum += x;
        self.open_n += 1;
        let size = self.batch_size.max(1);
        if self.open_n < size {
            return;
        }
        self.batches.push(self.open_sum);
        self.open_sum = 0.0;
        self.open_n = 0;
        if self.batches.len() >= 2 * MIN_BATCHES {
            self.batches = self
                .batches
                .chunks(2)
                .map(|pair| pair.iter().sum())
                .collect();
            self.batch_size = size * 2;
        }
    }

    /// Samples seen.
    pub fn n(&self) -> u64 {
        self.n
    }

    /// Full batches behind the spread.
    pub fn batches(&self) -> usize {
        self.batches.len()
    }

    /// Mean of every sample (0 before the first).
    pub fn mean(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum / self.n as f64
        }
    }

    /// Mean of the full batches: the estimate the spread belongs to (the
    /// open batch, the newest samples, is left out of both; 0 without a
    /// full batch).
    pub fn batched_mean(&self) -> f64 {
        if self.batches.is_empty() {
            return 0.0;
        }
        let covered = self.batches.len() as f64 * self.batch_size.max(1) as f64;
        self.batches.iter().sum::<f64>() / covered
    }

    /// Variance of the mean estimated from the batch means, and its degrees
    /// of freedom; `None` below two full batches.
    pub fn mean_variance(&self) -> Option<(f64, f64)> {
        let k = self.batches.len();
        if k < 2 {
            return None;
        }
        let size = self.batch_size.max(1) as f64;
        let means = self.batches.iter().map(|s| s / size);
        let grand = means.clone().sum::<f64>() / k as f64;
        let ss: f64 = means.map(|m| (m - grand).powi(2)).sum();
        let variance_of_batch_means = ss / (k - 1) as f64;
        Some((variance_of_batch_means / k as f64, (k - 1) as f64))
    }

    /// The mean with its interval at `level` (e.g. 0.95): Student's t on
    /// the batch means; `None` below two full batches.
    pub fn interval(&self, level: f64) -> Option<Interval> {
        let (var, dof) = self.mean_variance()?;
        let half = t_quantile(0.5 + level / 2.0, dof) * var.sqrt();
        let mean = self.mean();
        Some(Interval {
            mean,
            low: mean - half,
            high: mean + half,
        })
    }

    /// The reported form: mean, 95 % interval (collapsed to the mean below
    /// two full batches — `batches` says so), sample and batch counts.
    pub fn estimate(&self) -> Estimate {
        let mean = self.mean();
        let (low, high) = self
            .interval(0.95)
            .map_or((mean, mean), |i| (i.low, i.high));
        Estimate {
            mean,
            ci_low: low,
            ci_high: high,
            samples: self.n,
            batches: self.batches.len() as u32,
        }
    }
}

/// A metric's mean with its 95 % interval, as reports show it.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Estimate {
    #[serde(deserialize_with = "crate::views::nan_if_null")]
    pub mean: f64,
    #[serde(deserialize_with = "crate::views::nan_if_null")]
    pub ci_low: f64,
    #[serde(deserialize_with = "crate::views::nan_if_null")]
    pub ci_high: f64,
    pub samples: u64,
    /// Full batches behind the interval (below two, the interval is the mean).
    pub batches: u32,
}

impl Estimate {
    /// The interval cut to the values the metric can take (`[0, ∞)` for a
    /// delay, `[0, 100]` for a percentage). Student's t is symmetric, so a
    /// few spread-out batches of a delay near zero give a negative lower
    /// bound — a value no mean of delays can have, and one that reads as a
    /// broken statistic. The mean of samples in the range lies in it and is
    /// left as it is.
    pub fn within(self, low: f64, high: f64) -> Estimate {
        // `+ 0.0` turns a -0.0 into 0.0, so a bound at zero never prints as "-0.0".
        let cut = |x: f64| x.clamp(low, high) + 0.0;
        Estimate {
            ci_low: cut(self.ci_low),
            ci_high: cut(self.ci_high),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_the_batch_bound_every_sample_is_a_batch() {
        let xs = [3.0, 7.0, 7.0, 19.0, 24.0];
        let mut s = BatchMeans::default();
        xs.iter().for_each(|&x| s.push(x));
        let mean = xs.iter().sum::<f64>() / 5.0;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 4.0;
        assert!((s.mean() - mean).abs() < 1e-12);
        let (v, dof) = s.mean_variance().unwrap();
        assert!((v - var / 5.0).abs() < 1e-9);
        assert_eq!(dof, 4.0);
        // t(4) at 0.975 is 2.776.
        let i = s.interval(0.95).unwrap();
        assert!(((i.high - i.mean) / (var / 5.0).sqrt() - 2.776).abs() < 1e-3);
        assert_eq!(s.estimate().batches, 5);
    }

    #[test]
    fn batches_double_and_memory_stays_bounded() {
        let mut s = BatchMeans::default();
        for i in 0..100_000u32 {
            s.push(f64::from(i % 7));
            assert!(s.batches() < 2 * MIN_BATCHES);
        }
        assert_eq!(s.n(), 100_000);
        assert!(s.batches() >= MIN_BATCHES);
        // Every full batch holds batch_size samples: the batch sums add up
        // to the samples they cover.
        let covered = s.batches.len() as u64 * s.batch_size;
        assert_eq!(covered + s.open_n, 100_000);
        assert!((s.batches.iter().sum::<f64>() + s.open_sum - s.sum).abs() < 1e-6);
    }

    #[test]
    fn a_correlated_series_gets_a_wider_interval_than_iid_would_give() {
        // An AR(1) series with strong correlation (phi = 0.95): the iid
        // standard error understates the mean's spread by sqrt((1+phi)/(1-phi)) ≈ 6.2.
        let mut s = BatchMeans::default();
        let (mut x, mut state) = (0.0f64, 12_345u64);
        let mut naive_sum = 0.0;
        let mut naive_sq = 0.0;
        let n = 20_000;
        for _ in 0..n {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let u = (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
            x = 0.95 * x + u;
            s.push(x);
            naive_sum += x;
            naive_sq += x * x;
        }
        let mean = naive_sum / f64::from(n);
        let naive_se = ((naive_sq / f64::from(n) - mean * mean) / f64::from(n)).sqrt();
        let (var, _) = s.mean_variance().unwrap();
        let ratio = var.sqrt() / naive_se;
        assert!(ratio > 3.0, "batch-means se only {ratio:.2}x the iid one");
    }

    #[test]
    fn non_finite_samples_are_ignored_and_state_round_trips() {
        let mut s = BatchMeans::default();
        for x in [1.0, f64::NAN, 2.0, f64::INFINITY, 3.0] {
            s.push(x);
        }
        assert_eq!(s.n(), 3);
        let json = serde_json::to_string(&s).unwrap();
        let back: BatchMeans = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        assert!(BatchMeans::default().interval(0.95).is_none());
    }

    #[test]
    fn an_interval_is_cut_to_the_metrics_range_and_its_mean_kept() {
        // Queue delays: mostly zero, one long wait — t's interval reaches below zero.
        let mut s = BatchMeans::default();
        for x in [0.0, 0.0, 0.0, 178.0] {
            s.push(x);
        }
        let raw = s.estimate();
        assert!(raw.ci_low < 0.0, "{raw:?}");
        let cut = raw.within(0.0, f64::INFINITY);
        assert_eq!(cut.ci_low.to_bits(), 0.0f64.to_bits());
        assert_eq!((cut.mean, cut.ci_high), (raw.mean, raw.ci_high));
        assert_eq!((cut.samples, cut.batches), (raw.samples, raw.batches));
        // A percentage near full: the upper bound stops at 100.
        let mut p = BatchMeans::default();
        for x in [99.0, 100.0, 92.0, 100.0] {
            p.push(x);
        }
        let raw = p.estimate();
        assert!(raw.ci_high > 100.0, "{raw:?}");
        let cut = raw.within(0.0, 100.0);
        assert_eq!(cut.ci_high, 100.0);
        assert_eq!(cut.ci_low, raw.ci_low);
        // -0.0 (a bound just below zero rounds there) is written as 0.
        let e = Estimate {
            ci_low: -0.0,
            ..Estimate::default()
        };
        assert_eq!(format!("{:.1}", e.within(0.0, 100.0).ci_low), "0.0");
    }
}
