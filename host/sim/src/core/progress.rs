//! The job-progress integrator: the simulator's ground truth of how far
//! every job got.
//!
//! Work is counted in "one reference worker" milliseconds. A running job
//! progresses at the rate its workload model gives it (throughput of its
//! workers, at its slowest worker's speed, slowed by interference…); the
//! integrator only integrates. Rules it keeps, whatever the model:
//!
//! * a job makes no progress for `restart_overhead_ms` after a start that
//!   follows a preemption;
//! * a preempted job keeps its progress only with a checkpoint, otherwise
//!   it starts over;
//! * a job finishes at `begin + ⌈remaining / rate⌉` ms, predicted whenever
//!   its rate, start or stop changes (work is integrated lazily then).
//!
//! Nothing here reads a policy's estimate: the host hears of a job's
//! progress only through [`ClusterState::report_progress`], and only when a
//! model asks for reports (as a training framework would send them).

use anyhow::Context;
use arbiter_host::state::{ClusterState, JobId};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// How a job's throughput grows with its workers (the simulator's ground
/// truth; a policy may be told the same law, but never supplies it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "law", rename_all = "kebab-case")]
pub enum SpeedupLaw {
    /// `throughput(w) = w`.
    #[default]
    Linear,
    /// Linear up to the midpoint of the job's scaling range (rounded down);
    /// each worker past it costs `loss_per_step` of the ideal:
    /// `w · (1 − loss_per_step · k)` for `k` steps past the midpoint, never
    /// below zero (Aryl §7.2's imperfect scaling).
    SubLinear { loss_per_step: f64 },
}

impl SpeedupLaw {
    /// Relative throughput of `workers` workers of a job whose scaling range
    /// is `min..=max`.
    pub fn throughput(self, workers: u32, min: u32, max: u32) -> f64 {
        let w = f64::from(workers);
        match self {
            SpeedupLaw::Linear => w,
            SpeedupLaw::SubLinear { loss_per_step } => {
                let mid = min + max.saturating_sub(min) / 2;
                let steps = f64::from(workers.saturating_sub(mid));
                (w * (1.0 - loss_per_step * steps)).max(0.0)
            }
        }
    }
}

/// What the integrator does beyond integrating.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgressRules {
    /// No progress for this long after a restart that follows a preemption.
    pub restart_overhead_ms: u64,
    /// Report each running job's remaining time to the host whenever its
    /// rate changes (the contract's `job-progress`).
    pub report_progress: bool,
}

/// Where one job stands.
#[derive(Clone, Debug, Default)]
pub struct JobTrack {
    /// The host's id while the job is submitted.
    pub id: Option<JobId>,
    /// Total work, in one-reference-worker milliseconds (infinite: never ends).
    pub work: f64,
    /// Work left as of `since` (see [`Progress::remaining`] for "now").
    pub remaining: f64,
    /// Work per millisecond now (0 when not running).
    pub rate: f64,
    pub running: bool,
    pub first_start: Option<u64>,
    pub end: Option<u64>,
    /// No progress before this time (restart overhead).
    pub resume_at: u64,
    /// Preempted since its last start: the next start pays the overhead.
    pub restart_pending: bool,
    /// The rate of the last progress report to the host (0 = none since it stopped).
    reported_rate: f64,
    pub checkpointed: bool,
    /// Times preempted.
    pub preemptions: u32,
    /// When `remaining` was last brought up to date.
    since: u64,
    /// Bumped on every change of rate, start or stop: older completion
    /// predictions are stale.
    stamp: u32,
}

impl JobTrack {
    /// Work left at `now` at today's rate (`now` not before `since`).
    fn remaining_at(&self, now: u64) -> f64 {
        if !(self.running && self.rate > 0.0) {
            return self.remaining;
        }
        let begin = self.since.max(self.resume_at);
        if now > begin {
            self.remaining - self.rate * (now - begin) as f64
        } else {
            self.remaining
        }
    }

    /// Brings `remaining` up to `now`.
    fn settle(&mut self, now: u64) {
        self.remaining = self.remaining_at(now);
        self.since = self.since.max(now);
    }

    /// When it finishes at today's rate, seen from `now`.
    fn completion(&self, now: u64) -> Option<u64> {
        (self.running && self.rate > 0.0 && self.work.is_finite()).then(|| {
            let begin = now.max(self.resume_at);
            let done = begin as f64 + (self.remaining_at(now).max(0.0) / self.rate).ceil();
            done.min(u64::MAX as f64) as u64
        })
    }
}

/// Every job's progress, by the model's job index.
///
/// Integration is lazy: a job's work is brought up to date only when its
/// rate, start or stop changes, and its completion is predicted then (one
/// heap entry per prediction; a newer change makes an older entry stale).
/// An event costs O(log jobs), whatever the number of running jobs.
pub struct Progress {
    tracks: Vec<JobTrack>,
    /// Jobs with a positive rate, sorted by job.
    active: Vec<usize>,
    /// Predicted completions: (time, job, stamp).
    completions: BinaryHeap<Reverse<(u64, usize, u32)>>,
    by_id: HashMap<JobId, usize>,
    rules: ProgressRules,
    finished: usize,
}

impl Progress {
    /// One track per job: its total work and whether it checkpoints.
    pub fn new(jobs: impl IntoIterator<Item = (f64, bool)>, rules: ProgressRules) -> Self {
        let tracks = jobs
            .into_iter()
            .map(|(work, checkpointed)| JobTrack {
                work,
                remaining: work,
                checkpointed,
                ..JobTrack::default()
            })
            .collect();
        Progress {
            tracks,
            active: Vec::new(),
            completions: BinaryHeap::new(),
            by_id: HashMap::new(),
            rules,
            finished: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.tracks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tracks.is_empty()
    }

    pub fn track(&self, job: usize) -> &JobTrack {
        &self.tracks[job]
    }

    pub fn tracks(&self) -> &[JobTrack] {
        &self.tracks
    }

    /// Work left of `job` at `now`.
    pub fn remaining(&self, job: usize, now: u64) -> f64 {
        self.tracks[job].remaining_at(now)
    }

    /// Jobs finished so far.
    pub fn finished(&self) -> usize {
        self.finished
    }

    pub fn all_finished(&self) -> bool {
        self.finished == self.tracks.len()
    }

    /// The model's index of the host's job `id`, while submitted.
    pub fn job_of(&self, id: JobId) -> Option<usize> {
        self.by_id.get(&id).copied()
    }

    /// Job `job` was submitted to the host as `id`.
    pub fn submitted(&mut self, job: usize, id: JobId) {
        self.tracks[job].id = Some(id);
        self.by_id.insert(id, job);
    }

    fn activate(&mut self, job: usize) {
        if let Err(at) = self.active.binary_search(&job) {
            self.active.insert(at, job);
        }
    }

    fn deactivate(&mut self, job: usize) {
        if let Ok(at) = self.active.binary_search(&job) {
            self.active.remove(at);
        }
    }

    /// Job `job` left the host without finishing (dropped, cancelled).
    pub fn withdrawn(&mut self, job: usize) {
        let t = &mut self.tracks[job];
        if let Some(id) = t.id.take() {
            self.by_id.remove(&id);
        }
        t.running = false;
        t.rate = 0.0;
        t.stamp = t.stamp.wrapping_add(1);
        self.deactivate(job);
    }

    /// Drops stale predictions from the top of the heap.
    fn prune(&mut self) {
        while let Some(&Reverse((_, k, stamp))) = self.completions.peek() {
            let t = &self.tracks[k];
            if t.stamp == stamp && t.running && t.rate > 0.0 {
                break;
            }
            self.completions.pop();
        }
    }

    /// The earliest time a progressing job finishes at today's rates.
    pub fn next_completion(&mut self, now: u64) -> Option<u64> {
        self.prune();
        self.completions
            .peek()
            .map(|&Reverse((done, _, _))| done.max(now))
    }

    /// Marks the jobs finished by `now` and returns them in job order with
    /// the host ids they had (the caller removes them from the host).
    pub fn take_finished(&mut self, now: u64) -> Vec<(usize, Option<JobId>)> {
        let mut done = Vec::new();
        loop {
            self.prune();
            match self.completions.peek() {
                Some(&Reverse((at, k, _))) if at <= now => {
                    self.completions.pop();
                    done.push(k);
                }
                _ => break,
            }
        }
        done.sort_unstable();
        let mut out = Vec::with_capacity(done.len());
        for k in done {
            self.deactivate(k);
            let t = &mut self.tracks[k];
            t.remaining = 0.0;
            t.since = now;
            t.running = false;
            t.rate = 0.0;
            t.stamp = t.stamp.wrapping_add(1);
            t.end = Some(now);
            let id = t.id.take();
            if let Some(id) = id {
                self.by_id.remove(&id);
            }
            self.finished += 1;
            out.push((k, id));
        }
        out
    }

    /// The host started (or restarted) `id` at `now`.
    pub fn started(&mut self, id: JobId, now: u64) -> Option<usize> {
        let k = self.job_of(id)?;
        let overhead = self.rules.restart_overhead_ms;
        let t = &mut self.tracks[k];
        t.running = true;
        t.since = now;
        t.stamp = t.stamp.wrapping_add(1);
        t.first_start.get_or_insert(now);
        if t.restart_pending {
            t.resume_at = now + overhead;
            t.restart_pending = false;
        } else {
            t.resume_at = now;
        }
        Some(k)
    }

    /// The host preempted `id` at `now`: it waits with what it has left, or
    /// starts over without a checkpoint. `None` when it was not running.
    pub fn preempted(&mut self, id: JobId, now: u64) -> Option<usize> {
        let k = self.job_of(id)?;
        let t = &mut self.tracks[k];
        if !t.running {
            return None;
        }
        t.settle(now);
        t.running = false;
        t.rate = 0.0;
        t.reported_rate = 0.0;
        t.restart_pending = true;
        t.preemptions += 1;
        t.stamp = t.stamp.wrapping_add(1);
        if !t.checkpointed {
            t.remaining = t.work;
        }
        self.deactivate(k);
        Some(k)
    }

    /// Sets the rate of a running job at the state's time (its placement
    /// changed). With `report_progress`, tells the host what the job has
    /// left when its rate changed (as a training framework would).
    pub fn set_rate(
        &mut self,
        state: &mut ClusterState,
        job: usize,
        rate: f64,
    ) -> anyhow::Result<()> {
        if !self.tracks[job].running {
            return Ok(());
        }
        let now = state.now_ms();
        if rate > 0.0 {
            self.activate(job);
        } else {
            self.deactivate(job);
        }
        self.tracks[job].settle(now);
        self.tracks[job].rate = rate;
        self.repredict(job, now);
        let t = &mut self.tracks[job];
        if self.rules.report_progress && rate > 0.0 && rate != t.reported_rate {
            t.reported_rate = rate;
            let left =
                t.resume_at.saturating_sub(now) + (t.remaining.max(0.0) / rate).ceil() as u64;
            if let Some(id) = t.id {
                state
                    .report_progress(id, left.max(1))
                    .with_context(|| format!("reporting progress of job #{job}"))?;
            }
        }
        Ok(())
    }

    /// A running job makes no progress until `until` (a rescale: workers
    /// join or leave and the job re-forms; the model's cost). Its completion
    /// is predicted again.
    pub fn pause_until(&mut self, job: usize, now: u64, until: u64) {
        let t = &mut self.tracks[job];
        if !t.running {
            return;
        }
        t.settle(now);
        t.resume_at = t.resume_at.max(until);
        self.repredict(job, now);
    }

    /// The job's rate or pause changed (after `settle`): its completion is predicted again,
    /// and the earlier prediction, stamped with the old `stamp`, becomes stale in the queue.
    fn repredict(&mut self, job: usize, now: u64) {
        let t = &mut self.tracks[job];
        t.stamp = t.stamp.wrapping_add(1);
        if let Some(done) = t.completion(now) {
            self.completions.push(Reverse((done, job, t.stamp)));
        }
    }

    /// Reports to the host what a waiting job has left at `throughput`
    /// (after a preemption with a checkpoint).
    pub fn report_waiting(
        &self,
        state: &mut ClusterState,
        job: usize,
        throughput: f64,
    ) -> anyhow::Result<()> {
        let t = &self.tracks[job];
        let Some(id) = t.id else { return Ok(()) };
        if !(self.rules.report_progress && t.checkpointed && throughput > 0.0) {
            return Ok(());
        }
        let left = (t.remaining.max(0.0) / throughput).ceil() as u64;
        state
            .report_progress(id, left.max(1))
            .with_context(|| format!("reporting progress of job #{job}"))
    }

    /// The running jobs that make progress now, past their restart overhead.
    pub fn progressing(&self, now: u64) -> impl Iterator<Item = usize> + '_ {
        self.active
            .iter()
            .copied()
            .filter(move |&k| self.tracks[k].rate > 0.0 && now >= self.tracks[k].resume_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_linear_loses_past_the_midpoint() {
        let law = SpeedupLaw::SubLinear { loss_per_step: 0.1 };
        assert_eq!(law.throughput(4, 2, 8), 4.0);
        assert_eq!(law.throughput(5, 2, 8), 5.0);
        assert!((law.throughput(7, 2, 8) - 7.0 * 0.8).abs() < 1e-12);
        assert_eq!(SpeedupLaw::Linear.throughput(7, 2, 8), 7.0);
    }

    #[test]
    fn a_job_ends_when_its_work_is_done_and_not_before() {
        let mut state = ClusterState::new();
        let id = state
            .submit(arbiter_host::state::JobRequest::gpus("j", "t", 1, 1))
            .expect("submit");
        let mut p = Progress::new(
            [(1000.0, false)],
            ProgressRules {
                restart_overhead_ms: 100,
                report_progress: false,
            },
        );
        p.submitted(0, id);
        p.started(id, 0);
        p.set_rate(&mut state, 0, 2.0).expect("rate");
        assert_eq!(p.next_completion(0), Some(500));
        assert!(p.take_finished(300).is_empty());
        // Preempted without a checkpoint: starts over, and pays the overhead.
        assert_eq!(p.preempted(id, 300), Some(0));
        assert_eq!(p.track(0).remaining, 1000.0);
        p.started(id, 400);
        state.set_now(400);
        p.set_rate(&mut state, 0, 1.0).expect("rate");
        assert_eq!(p.next_completion(400), Some(1500));
        assert!(p.take_finished(1499).is_empty());
        assert_eq!(p.take_finished(1500), vec![(0, Some(id))]);
        assert_eq!(p.track(0).end, Some(1500));
        assert!(p.all_finished());
    }

    #[test]
    fn a_checkpointed_job_keeps_its_progress() {
        let mut state = ClusterState::new();
        let id = state
            .submit(arbiter_host::state::JobRequest::gpus("j", "t", 1, 1))
            .expect("submit");
        let mut p = Progress::new([(1000.0, true)], ProgressRules::default());
        p.submitted(0, id);
        p.started(id, 0);
        p.set_rate(&mut state, 0, 1.0).expect("rate");
        assert_eq!(p.remaining(0, 600), 400.0);
        p.preempted(id, 600);
        assert_eq!(p.track(0).remaining, 400.0);
        assert_eq!(p.track(0).preemptions, 1);
    }

    #[test]
    fn a_pause_delays_completion_by_its_length() {
        let mut state = ClusterState::new();
        let id = state
            .submit(arbiter_host::state::JobRequest::gpus("j", "t", 1, 1))
            .expect("submit");
        let mut p = Progress::new([(1000.0, true)], ProgressRules::default());
        p.submitted(0, id);
        p.started(id, 0);
        p.set_rate(&mut state, 0, 1.0).expect("rate");
        p.pause_until(0, 400, 700);
        assert_eq!(p.remaining(0, 700), 600.0);
        assert_eq!(p.next_completion(400), Some(1300));
        assert!(p.take_finished(1000).is_empty());
        assert_eq!(p.take_finished(1300), vec![(0, Some(id))]);
    }

    #[test]
    fn endless_work_never_finishes() {
        let mut state = ClusterState::new();
        let mut p = Progress::new([(f64::INFINITY, false)], ProgressRules::default());
        let id = state
            .submit(arbiter_host::state::JobRequest::gpus("j", "t", 1, 1))
            .expect("submit");
        p.submitted(0, id);
        p.started(id, 0);
        p.set_rate(&mut state, 0, 1.0).expect("rate");
        assert_eq!(p.next_completion(0), None);
        assert!(p.take_finished(u64::MAX / 2).is_empty());
    }
}
