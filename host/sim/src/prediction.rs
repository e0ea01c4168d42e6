//! Duration predictions for trace jobs: what a job's `estimate-ms` says, as
//! opposed to how long it runs (the trace's duration, the simulator's ground
//! truth).
//!
//! "MLaaS in the Wild" (NSDI '22, §5.2) schedules by *predicted* durations:
//! its best predictor (CART on group, user and resource features) is within
//! 25 % of the truth for 78 % of task instances; an Oracle is exact; a
//! predictor with fewer features (group only) is noisier. Our traces carry
//! none of those features, so the simulator injects the error instead. The
//! paper gives one point of the error distribution, not its shape; ours (a
//! choice, stated here and in `docs/reproductions/pai.md`) is a mixture: with
//! the predictor's accuracy `p` the prediction is *informed* — the truth
//! times a factor drawn log-uniformly from [0.75, 1.25] — and otherwise
//! *uninformed* — the true run time of another job drawn at random from the
//! same workload, i.e. a guess that knows the population but not the job.
//! (At least `p` of the predictions are within 25 %: an uninformed guess
//! can land there too.) A log-normal error with the same 78 % was tried
//! first: over run times spanning five orders of magnitude it almost never
//! reorders jobs, so every predictor scored like the Oracle, unlike the
//! paper's 63–77 % spread. Each task's error comes from a stream seeded by
//! the run's seed and the task's position, so a run is deterministic.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Which predictor fills a trace job's `estimate-ms`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum Prediction {
    /// The trace's own estimate (0 = unknown for the traces we have).
    #[default]
    None,
    /// Exact: the job's true duration.
    Oracle,
    /// The paper's best predictor: within 25 % for 78 % of instances.
    Best,
    /// A noisier predictor standing for the paper's group-only one. The
    /// paper gives no accuracy for it; ours is within 25 % for half of the
    /// instances (see [`GROUP_ONLY_WITHIN_25`]).
    GroupOnly,
    /// Within 25 % of the truth for this fraction of instances (0 < p < 1).
    Within25(f64),
}

/// The paper's best predictor: 78 % of instances within 25 % (§5.2).
pub const BEST_WITHIN_25: f64 = 0.78;
/// Our stand-in for the group-only predictor (not given by the paper).
pub const GROUP_ONLY_WITHIN_25: f64 = 0.5;

impl Prediction {
    /// The fraction of predictions within 25 % of the truth (`None`: no
    /// prediction is made; 1.0: exact).
    pub fn within_25(self) -> Option<f64> {
        match self {
            Prediction::None => None,
            Prediction::Oracle => Some(1.0),
            Prediction::Best => Some(BEST_WITHIN_25),
            Prediction::GroupOnly => Some(GROUP_ONLY_WITHIN_25),
            Prediction::Within25(p) => Some(p),
        }
    }

    pub fn check(self) -> anyhow::Result<()> {
        if let Prediction::Within25(p) = self {
            anyhow::ensure!(
                p > 0.0 && p < 1.0 && p.is_finite(),
                "a predictor's accuracy within 25 % must be in (0, 1), got {p}"
            );
        }
        Ok(())
    }

    /// Predictions for true durations `truth` (ms; `None` = the task never
    /// ends, predicted as unknown, 0), seeded by `seed`.
    pub fn predict_all(self, truth: &[Option<u64>], seed: u64) -> Vec<u64> {
        let Some(p) = self.within_25() else {
            return vec![0; truth.len()];
        };
        let population: Vec<u64> = truth.iter().flatten().copied().collect();
        let (lo, hi) = (0.75f64.ln(), 1.25f64.ln());
        truth
            .iter()
            .enumerate()
            .map(|(i, t)| match t {
                None => 0,
                Some(ms) if p >= 1.0 => *ms,
                Some(ms) => {
                    let mut rng = ChaCha8Rng::seed_from_u64(
                        seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    );
                    if rng.random::<f64>() < p {
                        let factor = rng.random_range(lo..=hi).exp();
                        ((*ms as f64) * factor).round().max(1.0) as u64
                    } else {
                        // Not empty: it holds at least this task's run time.
                        population[rng.random_range(0..population.len())]
                    }
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_model_has_at_least_the_stated_accuracy() {
        // Run times spread over four orders of magnitude, as in Philly.
        let truth: Vec<Option<u64>> = (0..20_000u64)
            .map(|i| Some(1_000 * (1 + (i * 7919) % 10_000)))
            .collect();
        let within = |prediction: Prediction| {
            let predicted = prediction.predict_all(&truth, 7);
            predicted
                .iter()
                .zip(&truth)
                .filter(|(p, t)| {
                    let t = t.unwrap_or(1) as f64;
                    ((**p as f64) / t - 1.0).abs() <= 0.25
                })
                .count() as f64
                / truth.len() as f64
        };
        for (prediction, p) in [
            (Prediction::Best, BEST_WITHIN_25),
            (Prediction::GroupOnly, GROUP_ONLY_WITHIN_25),
        ] {
            let w = within(prediction);
            // p informed, plus the uninformed guesses that land within 25 %.
            // An uninformed guess lands within 25 % about a third of the
            // time on this spread of run times.
            assert!(
                w >= p - 0.01 && w <= p + (1.0 - p) * 0.35,
                "{prediction:?}: {w} vs {p}"
            );
        }
        assert!(within(Prediction::Best) > within(Prediction::GroupOnly));
        assert_eq!(within(Prediction::Oracle), 1.0);
    }

    #[test]
    fn oracle_is_exact_none_is_unknown_and_runs_repeat() {
        let truth = [Some(3_600_000), None, Some(60_000)];
        assert_eq!(
            Prediction::Oracle.predict_all(&truth, 1),
            vec![3_600_000, 0, 60_000]
        );
        assert_eq!(Prediction::None.predict_all(&truth, 1), vec![0, 0, 0]);
        let a = Prediction::Best.predict_all(&truth, 5);
        assert_eq!(a, Prediction::Best.predict_all(&truth, 5));
        assert_ne!(a, Prediction::Best.predict_all(&truth, 6));
        assert!(Prediction::Within25(1.5).check().is_err());
    }
}
