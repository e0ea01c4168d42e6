//! Comparing two arms: the candidate-minus-control difference with a Welch
//! interval on batch means, and the always-valid p-value the guardrail
//! acts on.
//!
//! A guardrail looks at the data on every tick. A fixed-level test re-run
//! at every look rejects a true null far more often than its level (the
//! old guardrail rolled an identical candidate back in 2 of 5 A/A runs).
//! The mixture sequential probability ratio test (mSPRT; Robbins 1970, and
//! Johari, Koomen, Pekelis & Walsh, "Always Valid Inference", Operations
//! Research 2022, the form used in production A/B platforms) gives a
//! p-value that stays valid however often, and whenever, it is read:
//! with the difference estimate `d ~ N(θ, v)` and a normal mixture
//! `θ ~ N(0, τ²)` over the alternatives, the likelihood ratio
//!
//! ```text
//! Λ = sqrt(v / (v + τ²)) · exp(τ² d² / (2 v (v + τ²)))
//! ```
//!
//! is a martingale under θ = 0, so by Ville's inequality
//! `P(sup Λ ≥ 1/α) ≤ α`, and `p = min over looks of 1/Λ` is always valid.
//! `v` comes from the batch means (so correlation is accounted for); `τ`,
//! the effect size the test is most sensitive to, is the guardrail's
//! `min_effect` times the control's mean.

use super::batch::BatchMeans;
use super::dist::{normal_quantile, t_cdf, t_quantile};
use serde::{Deserialize, Serialize};

/// Candidate minus control, with its standard error and Welch–Satterthwaite
/// degrees of freedom.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Difference {
    pub estimate: f64,
    pub se: f64,
    pub dof: f64,
}

impl Difference {
    /// `None` until both arms have two full batches.
    pub fn between(candidate: &BatchMeans, control: &BatchMeans) -> Option<Difference> {
        let (vc, dc) = candidate.mean_variance()?;
        let (vk, dk) = control.mean_variance()?;
        let v = vc + vk;
        let dof = if v == 0.0 {
            dc + dk
        } else {
            v * v / (vc * vc / dc + vk * vk / dk)
        };
        Some(Difference {
            estimate: candidate.batched_mean() - control.batched_mean(),
            se: v.sqrt(),
            dof,
        })
    }

    /// Two-sided interval at `level` (Student's t).
    pub fn interval(&self, level: f64) -> (f64, f64) {
        let half = t_quantile(0.5 + level / 2.0, self.dof) * self.se;
        (self.estimate - half, self.estimate + half)
    }

    /// 1/Λ of the normal-mixture SPRT with mixing spread `tau` (at most 1).
    ///
    /// The standard error is estimated from few batch means, so the
    /// statistic `d / se` is Student's t, not normal: it is first mapped to
    /// the normal deviate with the same tail probability, which keeps a
    /// short, lucky run of small spread from passing for strong evidence.
    /// No spread at all (every batch mean equal) is no evidence either way.
    pub fn mixture_p(&self, tau: f64) -> f64 {
        self.mixture_p_over(&[tau])
    }

    /// 1/Λ for an equal-weight mixture over several spreads: an average of
    /// likelihood ratios is still a martingale under the null, so the
    /// p-value stays valid, and the test is sensitive to every effect size
    /// the spreads cover rather than only to one.
    pub fn mixture_p_over(&self, taus: &[f64]) -> f64 {
        let v = self.se * self.se;
        if v == 0.0 || !v.is_finite() || taus.is_empty() {
            return 1.0;
        }
        let z = t_as_normal(self.estimate / self.se, self.dof);
        let lambda = taus
            .iter()
            .map(|tau| {
                let t2 = tau * tau;
                if t2 == 0.0 || !t2.is_finite() {
                    return 1.0;
                }
                let log_lambda = 0.5 * (v / (v + t2)).ln() + t2 * z * z / (2.0 * (v + t2));
                log_lambda.exp()
            })
            .sum::<f64>()
            / taus.len() as f64;
        (1.0 / lambda).min(1.0)
    }
}

/// The normal deviate with the same tail probability as `t` has under
/// Student's t with `dof` degrees of freedom.
fn t_as_normal(t: f64, dof: f64) -> f64 {
    let tail = t_cdf(-t.abs(), dof).max(f64::MIN_POSITIVE);
    -normal_quantile(tail) * t.signum()
}

/// The always-valid p-value of one metric: the smallest 1/Λ seen so far.
/// Durable (it is part of what an experiment persists): a restart must not
/// forget evidence already seen.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AlwaysValidP {
    pub p: f64,
    /// Looks taken (each with new data).
    pub looks: u64,
}

impl Default for AlwaysValidP {
    fn default() -> Self {
        AlwaysValidP { p: 1.0, looks: 0 }
    }
}

impl AlwaysValidP {
    /// Takes one look with the mixture over `taus`; returns the p-value after it.
    pub fn observe(&mut self, difference: &Difference, taus: &[f64]) -> f64 {
        self.looks += 1;
        self.p = self.p.min(difference.mixture_p_over(taus));
        self.p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arm(values: impl IntoIterator<Item = f64>) -> BatchMeans {
        let mut s = BatchMeans::default();
        values.into_iter().for_each(|x| s.push(x));
        s
    }

    #[test]
    fn welch_difference_matches_the_textbook_on_independent_batches() {
        // Fewer samples than the batch bound: each is its own batch.
        let a = arm([10.0, 12.0, 11.0, 13.0, 9.0]);
        let b = arm([20.0, 22.0, 19.0, 21.0, 23.0, 24.0]);
        let d = Difference::between(&b, &a).unwrap();
        let (va, vb): (f64, f64) = (2.5 / 5.0, 3.5 / 6.0);
        assert!((d.estimate - (21.5 - 11.0)).abs() < 1e-12);
        assert!((d.se - (va + vb).sqrt()).abs() < 1e-12);
        let dof = (va + vb).powi(2) / (va * va / 4.0 + vb * vb / 5.0);
        assert!((d.dof - dof).abs() < 1e-9);
        let (lo, hi) = d.interval(0.95);
        assert!(lo > 0.0 && hi > lo);
    }

    #[test]
    fn the_mixture_p_value_falls_with_evidence_and_never_rises() {
        let tau = 1.0;
        let null = Difference {
            estimate: 0.0,
            se: 0.5,
            dof: 30.0,
        };
        // No difference: Λ < 1, p = 1.
        assert_eq!(null.mixture_p(tau), 1.0);
        let strong = Difference {
            estimate: 3.0,
            se: 0.5,
            dof: 30.0,
        };
        let weak = Difference {
            estimate: 0.5,
            ..strong
        };
        assert!(strong.mixture_p(tau) < 1e-3);
        assert!(weak.mixture_p(tau) > 0.05);
        let mut p = AlwaysValidP::default();
        p.observe(&strong, &[tau]);
        let after = p.observe(&weak, &[tau]);
        assert_eq!(after, strong.mixture_p(tau), "evidence seen is kept");
        assert_eq!(p.looks, 2);
    }

    #[test]
    fn the_mixture_statistic_is_the_closed_form() {
        // v = 1, τ² = 3, d = 2: Λ = sqrt(1/4) · exp(3·4 / (2·1·4)) = 0.5 · e^1.5.
        // (At many degrees of freedom t is normal.)
        let d = Difference {
            estimate: 2.0,
            se: 1.0,
            dof: 1e9,
        };
        let expected = 1.0 / (0.5 * 1.5f64.exp());
        assert!((d.mixture_p(3f64.sqrt()) - expected).abs() < 1e-6);
        // Few degrees of freedom weigh the same difference less.
        let few = Difference { dof: 5.0, ..d };
        assert!(few.mixture_p(3f64.sqrt()) > d.mixture_p(3f64.sqrt()));
        // No spread: no evidence.
        let flat = Difference { se: 0.0, ..d };
        assert_eq!(flat.mixture_p(1.0), 1.0);
    }
}
