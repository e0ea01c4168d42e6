//! Which arm a job joins in a split experiment, and whether the arms stayed
//! balanced.
//!
//! Each arm runs on its share of the nodes, so an arm that happens to get
//! more than its share of the demand queues longer for no fault of its
//! policy. A hash of the job id is random but can be lopsided in a short
//! experiment (44 against 72 jobs was seen), and with heavy-tailed job
//! sizes even equal job counts can carry very unequal work. Efron's biased
//! coin (Efron 1971, "Forcing a sequential experiment to be balanced")
//! keeps the randomisation — no one can predict a job's arm — while pulling
//! each arm's requested work (GPUs × the job's stated run time, the load it
//! brings) towards the target share: the arm behind its share is chosen
//! with a higher probability (2/3 at an even split). The draw is a
//! hash of the experiment's seed and the job id, so an assignment can be
//! re-derived, and the running totals are rebuilt from the enrolled jobs
//! after a restart.
//!
//! The balance check is the sample-ratio-mismatch test every A/B platform
//! runs: a χ² test of the enrolled job counts against the target share.

use serde::{Deserialize, Serialize};

/// How strongly the coin leans towards the arm behind its share: the
/// lagging arm's probability moves this fraction of the way to 1 (Efron's
/// p = 2/3 at an even split).
const BIAS: f64 = 1.0 / 3.0;

/// A sample-ratio mismatch below this p-value is flagged (the threshold
/// A/B platforms use: the check runs continuously, so it is strict).
pub const SRM_ALERT_P: f64 = 0.001;

/// The running assignment of one split experiment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Assigner {
    /// The candidate's target share of demand, in (0, 1).
    pub share: f64,
    pub seed: u64,
    pub balance: Balance,
}

/// What each arm has been given so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Balance {
    pub control_jobs: u64,
    pub candidate_jobs: u64,
    /// Requested work, in GPU-hours.
    pub control_work: f64,
    pub candidate_work: f64,
}

impl Assigner {
    pub fn new(share: f64, seed: u64) -> Assigner {
        Assigner {
            share,
            seed,
            balance: Balance::default(),
        }
    }

    /// Decides a job's arm (`true` = candidate) and counts it.
    pub fn assign(&mut self, job_id: u64, work: f64) -> bool {
        let candidate = self.choose(job_id);
        self.count(candidate, work);
        candidate
    }

    /// The arm the coin gives a job now (`true` = candidate), not counted:
    /// a job that is refused on its way into the arm never joins it.
    pub fn choose(&self, job_id: u64) -> bool {
        let b = &self.balance;
        let total = b.control_work + b.candidate_work;
        let behind = b.candidate_work - self.share * total;
        let p_candidate = if behind < 0.0 {
            self.share + (1.0 - self.share) * BIAS
        } else if behind > 0.0 {
            self.share * (1.0 - BIAS)
        } else {
            self.share
        };
        unit_draw(self.seed, job_id) < p_candidate
    }

    /// Counts a job already assigned (rebuilding the totals after a restart).
    pub fn count(&mut self, candidate: bool, work: f64) {
        let b = &mut self.balance;
        if candidate {
            b.candidate_jobs += 1;
            b.candidate_work += work;
        } else {
            b.control_jobs += 1;
            b.control_work += work;
        }
    }

    /// P-value of the χ² (1 degree of freedom) test of the job counts against
    /// the target share; 1 with no jobs.
    pub fn sample_ratio_p(&self) -> f64 {
        let b = &self.balance;
        let n = (b.control_jobs + b.candidate_jobs) as f64;
        if n == 0.0 {
            return 1.0;
        }
        let expected_candidate = n * self.share;
        let expected_control = n - expected_candidate;
        let chi2 = (b.candidate_jobs as f64 - expected_candidate).powi(2) / expected_candidate
            + (b.control_jobs as f64 - expected_control).powi(2) / expected_control;
        // χ²(1) is the square of a standard normal.
        let z = chi2.sqrt();
        (2.0 * super::dist::normal_cdf(-z)).clamp(0.0, 1.0)
    }
}

/// A uniform draw in [0, 1) from the experiment's seed and a job id
/// (SplitMix64's finaliser).
pub fn unit_draw(seed: u64, id: u64) -> f64 {
    let mut z = (seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_biased_coin_keeps_demand_near_the_share_where_a_hash_drifts() {
        for share in [0.5, 0.3] {
            let mut coin = Assigner::new(share, 7);
            let mut hash = Balance::default();
            for id in 0..2_000u64 {
                // Mixed demand: 1, 2, 4 or 8 GPUs.
                let gpus = f64::from(1u32 << (id % 4));
                coin.assign(id, gpus);
                if unit_draw(7, id) < share {
                    hash.candidate_work += gpus;
                } else {
                    hash.control_work += gpus;
                }
            }
            let b = coin.balance;
            let got = b.candidate_work / (b.candidate_work + b.control_work);
            assert!((got - share).abs() < 0.01, "share {share}: coin gave {got}");
            assert!(coin.sample_ratio_p() > SRM_ALERT_P, "{b:?}");
            let drifted = hash.candidate_work / (hash.candidate_work + hash.control_work);
            assert!((got - share).abs() <= (drifted - share).abs() + 1e-9);
        }
    }

    #[test]
    fn assignments_are_random_not_alternating() {
        // The coin must not be predictable: at an even split and equal
        // demand, runs of the same arm happen.
        let mut coin = Assigner::new(0.5, 11);
        let arms: Vec<bool> = (0..400).map(|id| coin.assign(id, 1.0)).collect();
        let repeats = arms.windows(2).filter(|w| w[0] == w[1]).count();
        assert!(repeats > 40, "only {repeats} repeats: the coin alternates");
        // Re-derivable: the same seed and ids give the same arms.
        let mut again = Assigner::new(0.5, 11);
        assert!((0..400).all(|id| again.assign(id, 1.0) == arms[id as usize]));
    }

    #[test]
    fn a_lopsided_split_is_flagged() {
        let mut a = Assigner::new(0.5, 1);
        for _ in 0..44 {
            a.count(true, 1.0);
        }
        for _ in 0..72 {
            a.count(false, 1.0);
        }
        // χ² = 2 · 14² / 58 = 6.76, p ≈ 0.0093: suspicious but not alarming.
        assert!((a.sample_ratio_p() - 0.0093).abs() < 5e-4);
        for _ in 0..400 {
            a.count(false, 1.0);
        }
        assert!(a.sample_ratio_p() < SRM_ALERT_P);
    }
}
