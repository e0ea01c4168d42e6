//! GPU memory: partitioning a shared GPU between guaranteed and opportunistic work (A10,
//! A12, Table 2) and memory by trial among opportunistic workloads alone (A14, Fig. 10).

use super::{GpuCtl, Opportunistic, Trial, UNLIMITED_MIB, share_cap};
use crate::config::CoordinatorConfig;
use arbiter_policy_sdk::prelude::*;

/// `total` split in `n` parts, the first `total % n` one larger.
fn split(total: u32, n: u32, i: u32) -> u32 {
    match n {
        0 => 0,
        n => total / n + u32::from(i < total % n),
    }
}

/// Limits for opportunistic workloads that share a GPU with no guaranteed work and have no
/// limit of ours yet: what they have, when that fits the GPU; otherwise what they use and an
/// equal part of what is left (or, when even their use is more than the GPU, their use
/// scaled down to it).
fn initial_limits(total: u32, os: &[&WorkloadStatus]) -> Vec<u32> {
    let current: Vec<u32> = os.iter().map(|w| w.memory_limit_mib.min(total)).collect();
    if current.iter().map(|&l| u64::from(l)).sum::<u64>() <= u64::from(total) {
        return current;
    }
    let uses: Vec<u32> = os.iter().map(|w| w.memory_used_mib.min(total)).collect();
    let used: u64 = uses.iter().map(|&u| u64::from(u)).sum();
    if used <= u64::from(total) {
        let free = total - used as u32;
        let n = uses.len() as u32;
        uses.iter()
            .enumerate()
            .map(|(i, &u)| u + split(free, n, i as u32))
            .collect()
    } else {
        uses.iter()
            .map(|&u| (u64::from(u) * u64::from(total) / used.max(1)) as u32)
            .collect()
    }
}

impl GpuCtl {
    /// A10 and A12: the guaranteed workloads get what they have used (plus any surge room
    /// and the headroom); the opportunistic ones split the rest — while the guaranteed job
    /// is not yet running stably, no more than they used when it arrived. The guaranteed
    /// limit is what the opportunistic limits leave.
    pub(super) fn memory_shared(
        &mut self,
        cfg: &CoordinatorConfig,
        gpu: &GpuStatus,
        gs: &[&WorkloadStatus],
        os: &[&WorkloadStatus],
        now: u64,
        out: &mut Vec<NodeAction>,
    ) {
        let total = gpu.memory_total_mib;
        if total == 0 || os.is_empty() {
            return;
        }
        let headroom = cfg.guaranteed_headroom_mib;
        let mut needs: Vec<(&WorkloadStatus, u32)> = Vec::with_capacity(gs.len());
        for w in gs {
            let Some(g) = self.guaranteed.get_mut(&w.id) else {
                continue;
            };
            // A12: refused allocations, or less than half the headroom left.
            let near = w.memory_used_mib.saturating_add(headroom / 2) > w.memory_limit_mib;
            if g.denied || near {
                g.surge_mib = g
                    .surge_mib
                    .max(w.memory_used_mib.saturating_add(cfg.surge_step_mib));
                g.surge_until = now.saturating_add(cfg.surge_hold_ms);
            } else if now >= g.surge_until {
                g.surge_mib = 0;
            }
            needs.push((w, g.peak_used.max(g.surge_mib).min(total)));
        }
        let need: u32 = needs.iter().fold(0, |a, (_, n)| a.saturating_add(*n));
        let budget = total.saturating_sub(need).saturating_sub(headroom);
        let n = os.len() as u32;
        let mut given: u32 = 0;
        for (i, w) in os.iter().enumerate() {
            let Some(o) = self.opportunistic.get(&w.id) else {
                continue;
            };
            let part = split(budget, n, i as u32);
            let limit = if self.settled {
                part
            } else {
                part.min(o.arrival_use)
            };
            given = given.saturating_add(limit);
            if limit != w.memory_limit_mib {
                out.push(NodeAction::SetMemoryLimit(w.id, limit));
            }
        }
        let slack = total.saturating_sub(need).saturating_sub(given);
        let k = needs.len() as u32;
        for (i, (w, need)) in needs.iter().enumerate() {
            let limit = need.saturating_add(split(slack, k, i as u32));
            if limit != w.memory_limit_mib {
                out.push(NodeAction::SetMemoryLimit(w.id, limit));
            }
        }
    }

    /// A14: a GPU shared by opportunistic workloads only.
    pub(super) fn opportunistic_only(
        &mut self,
        cfg: &CoordinatorConfig,
        gpu: &GpuStatus,
        os: &[&WorkloadStatus],
        now: u64,
        out: &mut Vec<NodeAction>,
    ) {
        // Compute: unconstrained, within each workload's own limit.
        for w in os {
            let cap = share_cap(w);
            if let Some(o) = self.opportunistic.get_mut(&w.id) {
                o.share = cap;
            }
            if w.compute_share != cap {
                out.push(NodeAction::SetComputeShare(w.id, cap));
            }
        }
        let total = gpu.memory_total_mib;
        if total == 0 {
            return;
        }
        if let [w] = os {
            // "The GPU resources can be fully utilized by this job without any constraints."
            self.trial = None;
            if let Some(o) = self.opportunistic.get_mut(&w.id) {
                o.limit = None;
            }
            if w.memory_limit_mib < total {
                out.push(NodeAction::SetMemoryLimit(w.id, UNLIMITED_MIB));
            }
            return;
        }
        let unbooked = os.iter().any(|w| {
            self.opportunistic
                .get(&w.id)
                .is_none_or(|o| o.limit.is_none())
        });
        if unbooked {
            self.trial = None;
            for (w, limit) in os.iter().zip(initial_limits(total, os)) {
                if let Some(o) = self.opportunistic.get_mut(&w.id) {
                    o.limit = Some(limit);
                }
            }
        }
        self.finish_trial(cfg, now);
        // Workloads whose allocations were refused want more: free memory first, else a
        // trade on trial.
        let wanting: Vec<u32> = os
            .iter()
            .filter(|w| self.opportunistic.get(&w.id).is_some_and(|o| o.denied))
            .map(|w| w.id)
            .collect();
        for r in wanting {
            let booked: u32 = self
                .opportunistic
                .values()
                .filter_map(|o| o.limit)
                .fold(0, u32::saturating_add);
            let free = total.saturating_sub(booked);
            if free > 0 {
                if let Some(limit) = self
                    .opportunistic
                    .get_mut(&r)
                    .and_then(|o| o.limit.as_mut())
                {
                    *limit = limit.saturating_add(cfg.memory_step_mib.min(free));
                }
            } else if self.trial.is_none() {
                self.start_trial(cfg, r, now);
            }
        }
        for w in os {
            if let Some(limit) = self.opportunistic.get(&w.id).and_then(|o| o.limit)
                && limit != w.memory_limit_mib
            {
                out.push(NodeAction::SetMemoryLimit(w.id, limit));
            }
        }
    }

    /// Moves a step of memory to `to` from the opportunistic workload with the most, on
    /// trial (both must have a performance sample to compare against).
    fn start_trial(&mut self, cfg: &CoordinatorConfig, to: u32, now: u64) {
        let step = cfg.memory_step_mib;
        let Some(before_to) = self
            .opportunistic
            .get(&to)
            .and_then(|o| o.perf.latest)
            .map(|(s, _)| s)
        else {
            return;
        };
        let donor = self
            .opportunistic
            .iter()
            .filter(|(id, o)| {
                **id != to
                    && o.limit.is_some_and(|l| l >= step)
                    && o.perf.latest.is_some()
                    && !self.cooldown.contains_key(&(to, **id))
            })
            .max_by_key(|(id, o)| (o.limit, std::cmp::Reverse(**id)))
            .and_then(|(id, o)| Some((*id, o.perf.latest?.0)));
        let Some((from, before_from)) = donor else {
            return;
        };
        self.move_memory(from, to, step);
        self.trial = Some(Trial {
            to,
            from,
            step,
            started: now,
            before_to,
            before_from,
        });
    }

    fn move_memory(&mut self, from: u32, to: u32, step: u32) {
        if let Some(l) = self
            .opportunistic
            .get_mut(&from)
            .and_then(|o| o.limit.as_mut())
        {
            *l = l.saturating_sub(step);
        }
        if let Some(l) = self
            .opportunistic
            .get_mut(&to)
            .and_then(|o| o.limit.as_mut())
        {
            *l = l.saturating_add(step);
        }
    }

    /// Judges a trade once `trial_period_ms` has passed and both workloads have given a
    /// sample since: kept when the sum of their normalised performance (before / after)
    /// rose by `trial_min_gain_pct`, undone otherwise — and undone when no evidence came
    /// within twice the period.
    fn finish_trial(&mut self, cfg: &CoordinatorConfig, now: u64) {
        let Some(t) = self.trial else { return };
        let after = |o: Option<&Opportunistic>| {
            o.and_then(|o| o.perf.latest)
                .filter(|(_, at)| *at > t.started)
                .map(|(s, _)| s)
        };
        if !self.opportunistic.contains_key(&t.to) || !self.opportunistic.contains_key(&t.from) {
            // One of them left: give back what is left of the trade.
            self.move_memory(t.to, t.from, t.step);
            self.trial = None;
            return;
        }
        let elapsed = now.saturating_sub(t.started);
        if elapsed < cfg.trial_period_ms {
            return;
        }
        let judged = match (
            after(self.opportunistic.get(&t.to)),
            after(self.opportunistic.get(&t.from)),
        ) {
            (Some(a_to), Some(a_from))
                if a_to.same_kind(t.before_to)
                    && a_from.same_kind(t.before_from)
                    && a_to.value() > 0.0
                    && a_from.value() > 0.0 =>
            {
                let gain = (t.before_to.value() / a_to.value() - 1.0)
                    + (t.before_from.value() / a_from.value() - 1.0);
                Some(gain * 100.0 >= cfg.trial_min_gain_pct)
            }
            _ if elapsed >= cfg.trial_period_ms.saturating_mul(2) => Some(false),
            _ => None,
        };
        match judged {
            Some(true) => self.trial = None,
            Some(false) => {
                self.move_memory(t.to, t.from, t.step);
                self.cooldown
                    .insert((t.to, t.from), now.saturating_add(cfg.trial_cooldown_ms));
                self.trial = None;
            }
            None => {}
        }
    }
}
