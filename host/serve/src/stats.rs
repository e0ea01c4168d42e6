//! Per-arm statistics: means with 95% confidence intervals, the one-sided
//! Welch test the guardrails use, and the fragmentation measure.

use arbiter_policy_sdk::cluster::Cluster;
use arbiter_policy_sdk::plan::Plan;

/// Running sample of one metric (Welford), so arms never keep every value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    n: u64,
    mean: f64,
    m2: f64,
}

impl Sample {
    pub fn push(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        self.n += 1;
        let d = x - self.mean;
        self.mean += d / self.n as f64;
        self.m2 += d * (x - self.mean);
    }

    pub fn n(&self) -> u64 {
        self.n
    }

    pub fn mean(&self) -> f64 {
        self.mean
    }

    /// Unbiased sample variance (0 below two samples).
    pub fn variance(&self) -> f64 {
        if self.n < 2 {
            0.0
        } else {
            self.m2 / (self.n - 1) as f64
        }
    }

    /// Mean and 95% confidence interval (normal approximation).
    pub fn estimate(&self) -> arbiter_proto::v1::Estimate {
        let half = if self.n < 2 {
            0.0
        } else {
            1.96 * (self.variance() / self.n as f64).sqrt()
        };
        arbiter_proto::v1::Estimate {
            mean: self.mean,
            ci_low: self.mean - half,
            ci_high: self.mean + half,
            samples: self.n,
        }
    }
}

/// One-sided Welch test that `candidate` has a larger mean than `control`:
/// the p-value (normal approximation of the t statistic; arms have at least
/// tens of samples before a guardrail may fire).
pub fn p_worse(candidate: &Sample, control: &Sample) -> Option<f64> {
    if candidate.n < 2 || control.n < 2 {
        return None;
    }
    let se =
        (candidate.variance() / candidate.n as f64 + control.variance() / control.n as f64).sqrt();
    let diff = candidate.mean - control.mean;
    if se == 0.0 {
        return Some(if diff > 0.0 { 0.0 } else { 1.0 });
    }
    Some(1.0 - normal_cdf(diff / se))
}

/// Standard normal CDF (Abramowitz & Stegun 7.1.26 for erf, |error| < 1.5e-7).
pub fn normal_cdf(z: f64) -> f64 {
    let x = z / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-x * x).exp();
    let erf = if x >= 0.0 { erf } else { -erf };
    0.5 * (1.0 + erf)
}

/// Share of free GPU capacity that is stranded, in percent: free milli-GPU on
/// partly used GPUs, plus idle GPUs on nodes with fewer idle GPUs than
/// `demand` (GPUs per worker of the most demanding pending job, at least 1).
/// Measured on `plan`, i.e. after the decisions applied to it.
pub fn fragmentation_pct(plan: &Plan<'_>, demand: u32) -> f64 {
    let cluster = plan.cluster();
    let (mut free, mut stranded) = (0u64, 0u64);
    for node in cluster.nodes().filter(|n| n.is_ready()) {
        let idle = plan.node_idle_gpus(node.index());
        for gpu in node.gpu_range() {
            let f = u64::from(plan.free_milli(gpu));
            free += f;
            let whole = f == u64::from(arbiter_policy_sdk::model::FULL_GPU_MILLI);
            if !whole || idle < demand.max(1) {
                stranded += f;
            }
        }
    }
    if free == 0 {
        0.0
    } else {
        100.0 * stranded as f64 / free as f64
    }
}

/// GPUs per worker of the most demanding pending job (at least 1).
pub fn pending_demand(cluster: &Cluster) -> u32 {
    cluster
        .pending_jobs()
        .map(|j| j.gpus_per_worker())
        .max()
        .unwrap_or(1)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbiter_policy_sdk::testing::TestCluster;

    #[test]
    fn welford_matches_two_pass() {
        let xs = [3.0, 7.0, 7.0, 19.0, 24.0];
        let mut s = Sample::default();
        xs.iter().for_each(|&x| s.push(x));
        let mean = xs.iter().sum::<f64>() / 5.0;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 4.0;
        assert!((s.mean() - mean).abs() < 1e-12);
        assert!((s.variance() - var).abs() < 1e-9);
        let e = s.estimate();
        assert!(e.ci_low < mean && mean < e.ci_high);
    }

    #[test]
    fn welch_separates_clear_differences_only() {
        let (mut a, mut b, mut c) = (Sample::default(), Sample::default(), Sample::default());
        for i in 0..50 {
            let noise = f64::from(i % 5);
            a.push(100.0 + noise);
            b.push(10.0 + noise);
            c.push(10.5 + noise);
        }
        assert!(p_worse(&a, &b).is_some_and(|p| p < 1e-6));
        assert!(p_worse(&b, &a).is_some_and(|p| p > 0.99));
        assert!(p_worse(&c, &b).is_some_and(|p| p > 0.01));
        assert!((normal_cdf(1.96) - 0.975).abs() < 1e-4);
    }

    #[test]
    fn fragmentation_counts_partial_gpus_and_short_nodes() {
        // Two nodes with two GPUs each; half a GPU used on node 0.
        let mut tc = TestCluster::new();
        tc.node("n0", "p", 64_000, 256_000, "A100", 80_000, 2);
        tc.node("n1", "p", 64_000, 256_000, "A100", 80_000, 2);
        let job = tc.job_spec(arbiter_policy_sdk::model::JobSpec {
            workers: 1,
            min_workers: 1,
            max_workers: 1,
            gpus_per_worker: 1,
            gpu_milli: 500,
            ..Default::default()
        });
        tc.run(
            job,
            vec![arbiter_policy_sdk::model::WorkerPlacement {
                node: 0,
                gpus: vec![0],
            }],
        );
        let cluster = tc.cluster();
        let plan = Plan::new(cluster);
        // Free: 500 (partial) + 1000 (n0 idle) + 2000 (n1) = 3500.
        // demand 1: only the partial 500 is stranded.
        assert!((fragmentation_pct(&plan, 1) - 100.0 * 500.0 / 3500.0).abs() < 1e-9);
        // demand 2: node 0's single idle GPU is stranded too.
        assert!((fragmentation_pct(&plan, 2) - 100.0 * 1500.0 / 3500.0).abs() < 1e-9);
    }
}
