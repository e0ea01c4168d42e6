//! What an arm of an experiment measured, and the guardrail's verdict on a
//! split experiment's two arms. The control plane and the simulator's A/A
//! check (`tests/ab_statistics.rs`) feed the same types.
//!
//! The design an operator can act on:
//!
//! * **Who counts.** Only jobs *enrolled* in the experiment — submitted
//!   while it runs, assigned an arm by [`super::Assigner`] on their first
//!   release — contribute job metrics, and `submitted ≥ started ≥
//!   finished` holds for them (a job counts as started once, at its first
//!   start). Jobs from before run in an arm but are not measured: they
//!   would mix the old policy's backlog into the new one's numbers.
//! * **Correlation.** Every metric is a [`BatchMeans`]: per-job metrics in
//!   the order they were observed, per-round metrics per round.
//! * **Peeking.** The guardrail acts on an always-valid p-value
//!   ([`AlwaysValidP`]), so checking it every tick keeps the false-rollback
//!   rate at `alpha`.

use super::batch::BatchMeans;
use super::compare::{AlwaysValidP, Difference};
use crate::records::GuardrailRecord;
use serde::{Deserialize, Serialize};

/// Effect sizes the guardrail's mixture covers: `min_effect` times 1, 2,
/// 4, … 64 of the control's mean.
const EFFECT_SCALES: u32 = 7;

/// Per-job outcomes of an arm's enrolled jobs. Rebuilt from the job table
/// after a restart (see `Plane::activate_experiment`), so it is exactly as
/// durable as the jobs themselves.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobStats {
    pub submitted: u64,
    pub started: u64,
    pub finished: u64,
    pub queue_delay_ms: BatchMeans,
    pub jct_ms: BatchMeans,
    /// 1 per finished job that missed its deadline, 0 otherwise.
    pub slo_sample: BatchMeans,
    pub slo_violations: u64,
    pub preemptions: u64,
}

impl JobStats {
    /// A job joined the arm.
    pub fn enrolled(&mut self) {
        self.submitted += 1;
    }

    /// A job's first start, `delay_ms` after its submission.
    pub fn started(&mut self, delay_ms: f64) {
        self.started += 1;
        self.queue_delay_ms.push(delay_ms);
    }

    /// A job finished successfully `jct_ms` after its submission; a
    /// `deadline_ms` of 0 is none.
    pub fn finished(&mut self, jct_ms: f64, deadline_ms: u64) {
        self.finished += 1;
        self.jct_ms.push(jct_ms);
        let missed = deadline_ms > 0 && jct_ms > deadline_ms as f64;
        self.slo_violations += u64::from(missed);
        self.slo_sample.push(if missed { 1.0 } else { 0.0 });
    }
}

/// Per-round measurements of an arm's cell. Persisted periodically: a
/// `kill -9` loses at most the rounds since the last write.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoundStats {
    pub alloc_pct: BatchMeans,
    pub frag_pct: BatchMeans,
    pub policy_ms: BatchMeans,
    pub faults: u64,
}

/// Everything an arm measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArmStats {
    pub jobs: JobStats,
    pub rounds: RoundStats,
}

impl ArmStats {
    /// The per-job sample a guardrail metric reads (`None` for `faults`,
    /// which is guarded by its count alone).
    pub fn guarded(&self, metric: &str) -> Option<&BatchMeans> {
        match metric {
            "jct" => Some(&self.jobs.jct_ms),
            "slo_violations" => Some(&self.jobs.slo_sample),
            "queue_delay" => Some(&self.jobs.queue_delay_ms),
            _ => None,
        }
    }
}

/// Candidate minus control on the guarded metric.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    pub difference: f64,
    /// 95 % interval (Welch on batch means).
    pub low: f64,
    pub high: f64,
    /// The always-valid p-value as of this look.
    pub p: f64,
}

/// What one look at a split experiment concluded.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub comparison: Option<Comparison>,
    /// Why the candidate must be rolled back, if it must.
    pub roll_back: Option<String>,
}

/// One look of the guardrail: faults first (a count), then the sequential
/// test on the guarded metric. `p` carries the evidence across looks.
pub fn look(
    g: &GuardrailRecord,
    candidate: &ArmStats,
    control: &ArmStats,
    p: &mut AlwaysValidP,
) -> Verdict {
    if candidate.rounds.faults >= u64::from(g.max_faults) {
        return Verdict {
            comparison: None,
            roll_back: Some(format!(
                "candidate faulted {} times (limit {})",
                candidate.rounds.faults, g.max_faults
            )),
        };
    }
    let (Some(c), Some(k)) = (candidate.guarded(&g.metric), control.guarded(&g.metric)) else {
        return Verdict {
            comparison: None,
            roll_back: None,
        };
    };
    let Some(d) = Difference::between(c, k) else {
        return Verdict {
            comparison: None,
            roll_back: None,
        };
    };
    let enough = c.n() >= u64::from(g.min_samples) && k.n() >= u64::from(g.min_samples);
    // The mixture spans regressions from `min_effect` of the arms' scale
    // to 64 times that: a guardrail must catch a tenfold regression as
    // surely as a 10 % one. The scale is the larger arm mean: a control
    // with no delay at all must not make every regression invisible.
    let base = g.min_effect * k.batched_mean().abs().max(c.batched_mean().abs());
    let taus: Vec<f64> = (0..EFFECT_SCALES)
        .map(|i| base * f64::from(1u32 << i))
        .collect();
    // Evidence accrues only once both arms have their minimum: the first
    // few samples of a queue say little about it.
    let pv = if enough { p.observe(&d, &taus) } else { p.p };
    let (low, high) = d.interval(0.95);
    let comparison = Comparison {
        difference: d.estimate,
        low,
        high,
        p: pv,
    };
    let unit = if g.metric == "slo_violations" {
        "share"
    } else {
        "ms"
    };
    let roll_back = (enough && d.estimate > 0.0 && pv < g.alpha).then(|| {
        format!(
            "candidate {} {:.1} {unit} vs control {:.1} {unit}: difference {:+.1} [95% CI {:.1}, {:.1}], always-valid p = {pv:.2e} < {}",
            g.metric,
            c.mean(),
            k.mean(),
            d.estimate,
            low,
            high,
            g.alpha
        )
    });
    Verdict {
        comparison: Some(comparison),
        roll_back,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guardrail() -> GuardrailRecord {
        GuardrailRecord::resolved(None).unwrap()
    }

    fn arm_with_delays(delays: impl IntoIterator<Item = f64>) -> ArmStats {
        let mut a = ArmStats::default();
        for d in delays {
            a.jobs.enrolled();
            a.jobs.started(d);
        }
        a
    }

    #[test]
    fn a_clearly_worse_candidate_is_rolled_back_and_a_tie_is_not() {
        let g = guardrail();
        let noise = |i: u32| f64::from(i % 7) * 10.0;
        let control = arm_with_delays((0..200).map(|i| 100.0 + noise(i)));
        let worse = arm_with_delays((0..200).map(|i| 200.0 + noise(i)));
        let same = arm_with_delays((0..200).map(|i| 100.0 + noise(i + 3)));
        let mut p = AlwaysValidP::default();
        let v = look(&g, &worse, &control, &mut p);
        assert!(v.roll_back.is_some(), "{v:?}");
        let mut p = AlwaysValidP::default();
        let v = look(&g, &same, &control, &mut p);
        assert!(v.roll_back.is_none(), "{v:?}");
        let c = v.comparison.unwrap();
        assert!(c.low <= 0.0 && 0.0 <= c.high, "{c:?}");
        // A better candidate is never rolled back, however clear.
        let better = arm_with_delays((0..200).map(|i| 10.0 + noise(i)));
        let mut p = AlwaysValidP::default();
        assert!(look(&g, &better, &control, &mut p).roll_back.is_none());
    }

    #[test]
    fn a_regression_from_zero_is_still_seen() {
        // Control jobs never wait; the candidate's wait.
        let g = guardrail();
        let control = arm_with_delays((0..200).map(|_| 0.0));
        let worse = arm_with_delays((0..200).map(|i| 5_000.0 + f64::from(i % 7) * 100.0));
        let mut p = AlwaysValidP::default();
        assert!(look(&g, &worse, &control, &mut p).roll_back.is_some());
    }

    #[test]
    fn faults_roll_back_at_their_limit_and_too_few_samples_never_do() {
        let g = guardrail();
        let mut faulty = ArmStats::default();
        faulty.rounds.faults = u64::from(g.max_faults);
        let mut p = AlwaysValidP::default();
        assert!(
            look(&g, &faulty, &ArmStats::default(), &mut p)
                .roll_back
                .is_some_and(|r| r.contains("faulted"))
        );
        let control = arm_with_delays((0..10).map(f64::from));
        let worse = arm_with_delays((0..10).map(|i| 1e6 + f64::from(i)));
        let v = look(&g, &worse, &control, &mut p);
        assert!(v.roll_back.is_none(), "10 < min_samples: {v:?}");
        assert_eq!(p.looks, 0, "no evidence counted before the minimum");
    }

    #[test]
    fn counters_add_up_for_enrolled_jobs() {
        let mut j = JobStats::default();
        j.enrolled();
        j.enrolled();
        j.started(5.0);
        j.finished(50.0, 40);
        assert_eq!((j.submitted, j.started, j.finished), (2, 1, 1));
        assert_eq!(j.slo_violations, 1);
    }
}
