//! SM control of a GPU shared by guaranteed and opportunistic work (A10, A11, A13).

use super::{Compute, GpuCtl, Sample, share_cap, share_floor};
use crate::config::{CoordinatorConfig, Throttle};
use arbiter_policy_sdk::prelude::*;

/// Median of same-kind samples (the baseline), `None` if they are of mixed kinds. The
/// median, not the mean: one period still slowed by something else (the tail of a memory
/// shortage, a data-loader stall) must not raise the baseline, or a real slowdown later
/// passes as "holding".
fn median(samples: &[Sample]) -> Option<Sample> {
    let first = *samples.first()?;
    if !samples.iter().all(|s| s.same_kind(first)) {
        return None;
    }
    let mut values: Vec<f64> = samples.iter().map(|s| s.value()).collect();
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    let m = if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    };
    Some(match first {
        Sample::Iteration(_) => Sample::Iteration(m),
        Sample::LaunchGap(_) => Sample::LaunchGap(m),
    })
}

impl GpuCtl {
    /// One period of the compute controller; sets the opportunistic shares.
    pub(super) fn compute_shared(
        &mut self,
        cfg: &CoordinatorConfig,
        os: &[&WorkloadStatus],
        now: u64,
        out: &mut Vec<NodeAction>,
    ) {
        if self.ceiling.is_some_and(|(_, until)| now >= until) {
            self.ceiling = None;
        }
        match self.compute {
            Compute::Measuring => {
                let k = cfg.baseline_samples.max(1) as usize;
                for g in self.guaranteed.values_mut() {
                    // A guaranteed job refused memory this period runs short of it (it
                    // waits, or spills): its speed now is not its baseline. Start over.
                    if g.denied {
                        g.samples.clear();
                        continue;
                    }
                    if let Some(s) = g.sample {
                        if g.samples.last().is_some_and(|last| !last.same_kind(s)) {
                            g.samples.clear();
                        }
                        g.samples.push(s);
                        if g.samples.len() > k {
                            g.samples.remove(0);
                        }
                    }
                }
                let measured = self.guaranteed.values().all(|g| g.samples.len() >= k);
                if measured {
                    for g in self.guaranteed.values_mut() {
                        g.baseline = median(&g.samples);
                        g.samples.clear();
                    }
                    self.settled = true;
                    self.compute = Compute::Raising {
                        last_change: now,
                        evidence: false,
                    };
                } else if now.saturating_sub(self.arrived) >= cfg.settle_timeout_ms {
                    // No signal: memory may settle; compute stays held until one comes.
                    self.settled = true;
                }
            }
            Compute::Raising {
                last_change,
                evidence,
            } => {
                let tolerance = 1.0 + cfg.slowdown_tolerance_pct / 100.0;
                let slower = self
                    .guaranteed
                    .values()
                    .any(|g| match (g.sample, g.baseline) {
                        (Some(s), Some(b)) => s.same_kind(b) && s.value() > b.value() * tolerance,
                        _ => false,
                    });
                if slower {
                    self.throttle(cfg, os, now);
                } else {
                    let all_sampled = self.guaranteed.values().all(
                        |g| matches!((g.sample, g.baseline), (Some(s), Some(b)) if s.same_kind(b)),
                    );
                    let evidence = evidence || all_sampled;
                    if evidence && now.saturating_sub(last_change) >= cfg.step_interval_ms {
                        self.raise(cfg, os);
                        self.compute = Compute::Raising {
                            last_change: now,
                            evidence: false,
                        };
                    } else {
                        self.compute = Compute::Raising {
                            last_change,
                            evidence,
                        };
                    }
                }
            }
        }
        for w in os {
            if let Some(o) = self.opportunistic.get(&w.id)
                && o.share != w.compute_share
            {
                out.push(NodeAction::SetComputeShare(w.id, o.share));
            }
        }
    }

    /// A11: one step up for every opportunistic workload, within its limit and the ceiling.
    fn raise(&mut self, cfg: &CoordinatorConfig, os: &[&WorkloadStatus]) {
        let ceiling = self.ceiling.map(|(c, _)| c);
        for w in os {
            if let Some(o) = self.opportunistic.get_mut(&w.id) {
                let mut top = share_cap(w).min(cfg.opportunistic_max_permille);
                if let Some(c) = ceiling {
                    top = top.min(c.max(share_floor(cfg, w)));
                }
                let up = o.share.saturating_add(cfg.share_step_permille).min(top);
                o.share = o.share.max(up);
            }
        }
    }

    /// A13: the guaranteed job slowed down — throttle at once, remember the share that
    /// held as a ceiling, and measure the baseline again.
    fn throttle(&mut self, cfg: &CoordinatorConfig, os: &[&WorkloadStatus], now: u64) {
        let mut highest = 0;
        for w in os {
            if let Some(o) = self.opportunistic.get_mut(&w.id) {
                highest = highest.max(o.share);
                let floor = share_floor(cfg, w);
                o.share = match cfg.throttle {
                    Throttle::Floor => floor,
                    Throttle::Halve => (o.share / 2).max(floor),
                };
            }
        }
        let held = highest
            .saturating_sub(cfg.share_step_permille)
            .max(cfg.share_floor_permille);
        self.ceiling = Some((held, now.saturating_add(cfg.ceiling_hold_ms)));
        for g in self.guaranteed.values_mut() {
            g.samples.clear();
        }
        self.compute = Compute::Measuring;
    }
}
