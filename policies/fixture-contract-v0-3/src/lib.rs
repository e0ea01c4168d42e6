//! Test fixture: a policy built against the frozen contract 0.3.0
//! (`wit/v0.3/policy.wit`) with raw `wit-bindgen`, as a third party's
//! compiled `.wasm` from before 0.4.0 would be. The host must load it and
//! serve it through its 0.3 adapter: arrivals as one `job-added` per job,
//! answers as one `place` per job.
//!
//! It keeps its own small mirror (nodes, free whole GPUs, jobs) from the
//! 0.3 snapshot and deltas, and schedules oldest-first, first-fit, whole
//! GPUs, on GPUs that nothing runs on (guaranteed or shared).
#![cfg(target_arch = "wasm32")]

wit_bindgen::generate!({ path: "../../wit/v0.3", world: "scheduler-policy" });

use arbiter::policy::types::*;
use exports::arbiter::policy::{meta, scheduler, sync};
use std::cell::RefCell;

#[derive(Default)]
struct Mirror {
    epoch: u64,
    /// Per GPU: (node, in use).
    gpus: Vec<(u32, bool)>,
    /// Per node: ready.
    ready: Vec<bool>,
    /// Per job: (workers, gpus per worker, running, its GPUs).
    jobs: Vec<(u32, u32, bool, Vec<u32>)>,
    models: usize,
}

thread_local! {
    static MIRROR: RefCell<Mirror> = RefCell::new(Mirror::default());
}

fn failed(msg: impl Into<String>) -> PolicyError {
    PolicyError::Failed(msg.into())
}

impl Mirror {
    fn job(&mut self, j: u32) -> Result<&mut (u32, u32, bool, Vec<u32>), PolicyError> {
        let len = self.jobs.len();
        self.jobs
            .get_mut(j as usize)
            .ok_or_else(|| failed(format!("event names job {j}, mirror has {len}")))
    }

    fn free_job(&mut self, j: u32) -> Result<(), PolicyError> {
        let gpus = std::mem::take(&mut self.job(j)?.3);
        for g in gpus {
            if let Some(slot) = self.gpus.get_mut(g as usize) {
                slot.1 = false;
            }
        }
        self.job(j)?.2 = false;
        Ok(())
    }

    fn apply(&mut self, event: Event) -> Result<(), PolicyError> {
        match event {
            Event::GpuModelsAdded(models) => self.models += models.len(),
            Event::NodeAdded(spec) => {
                let node = self.ready.len() as u32;
                self.ready.push(true);
                self.gpus.extend((0..spec.gpu_count).map(|_| (node, false)));
            }
            Event::NodeStateChanged((node, state)) => {
                if let Some(r) = self.ready.get_mut(node as usize) {
                    *r = state == 0;
                }
            }
            Event::JobAdded(spec) => {
                self.jobs
                    .push((spec.workers, spec.gpus_per_worker.max(1), false, Vec::new()))
            }
            Event::JobRemoved(j) => {
                self.free_job(j)?;
                self.jobs.swap_remove(j as usize);
            }
            Event::JobPlaced((j, workers)) => {
                self.free_job(j)?;
                let gpus: Vec<u32> = workers.iter().flat_map(|w| w.gpus.clone()).collect();
                for &g in &gpus {
                    if let Some(slot) = self.gpus.get_mut(g as usize) {
                        slot.1 = true;
                    }
                }
                let job = self.job(j)?;
                job.0 = workers.len() as u32;
                job.2 = true;
                job.3 = gpus;
            }
            Event::JobEvicted(j) => self.free_job(j)?,
            Event::StringsAdded(_)
            | Event::NodeLoanChanged(_)
            | Event::JobQosChanged(_)
            | Event::JobReserved(_)
            | Event::GpuModelSpeedChanged(_)
            | Event::JobProgress(_)
            | Event::GpuMetrics(_)
            | Event::TenantQuotaChanged(_)
            | Event::TenantQuotaRemoved(_)
            | Event::SharingChanged(_)
            | Event::GpuHealthChanged(_)
            | Event::JobReservedGpus(_)
            | Event::JobMetrics(_)
            | Event::ServiceMetrics(_)
            | Event::NodeMetrics(_) => {}
        }
        Ok(())
    }

    /// Oldest pending job first; each worker on the first node with enough free GPUs.
    fn schedule(&mut self) -> Vec<Decision> {
        let mut out = Vec::new();
        for j in 0..self.jobs.len() {
            let (workers, per, running, _) = self.jobs[j].clone();
            if running {
                continue;
            }
            let mut taken: Vec<u32> = Vec::new();
            let mut placement = Vec::new();
            for _ in 0..workers {
                let found = (0..self.ready.len() as u32).find_map(|node| {
                    if !self.ready[node as usize] {
                        return None;
                    }
                    let free: Vec<u32> = (0..self.gpus.len() as u32)
                        .filter(|&g| {
                            let (n, used) = self.gpus[g as usize];
                            n == node && !used && !taken.contains(&g)
                        })
                        .take(per as usize)
                        .collect();
                    (free.len() == per as usize).then_some(WorkerPlacement { node, gpus: free })
                });
                match found {
                    Some(w) => {
                        taken.extend(&w.gpus);
                        placement.push(w);
                    }
                    None => break,
                }
            }
            if placement.len() == workers as usize {
                for &g in &taken {
                    self.gpus[g as usize].1 = true;
                }
                self.jobs[j].2 = true;
                self.jobs[j].3 = taken;
                out.push(Decision::Place((j as u32, placement)));
            }
        }
        out
    }
}

struct FirstFit;

impl meta::Guest for FirstFit {
    fn describe() -> Manifest {
        Manifest {
            name: "contract-v0-3".into(),
            version: "1.0.0".into(),
            roles: vec!["scheduler".into()],
            description: "first fit, built against arbiter:policy@0.3.0".into(),
            default_config: String::new(),
        }
    }
    fn configure(_config: String) -> Result<(), PolicyError> {
        Ok(())
    }
}

impl sync::Guest for FirstFit {
    fn resync(s: Snapshot) -> Result<(), PolicyError> {
        let mut m = Mirror {
            epoch: s.epoch,
            models: s.gpu_models.len(),
            ready: s.nodes.state.iter().map(|&st| st == 0).collect(),
            gpus: s.gpus.node.iter().map(|&n| (n, false)).collect(),
            jobs: (0..s.jobs.name.len())
                .map(|j| {
                    (
                        s.jobs.workers[j],
                        s.jobs.gpus_per_worker[j].max(1),
                        s.jobs.phase[j] == 1,
                        Vec::new(),
                    )
                })
                .collect(),
        };
        let p = &s.placements;
        for w in 0..p.job.len() {
            let start = p.gpu_start[w] as usize;
            for &g in &p.gpus[start..start + p.gpu_len[w] as usize] {
                m.gpus[g as usize].1 = true;
                m.jobs[p.job[w] as usize].3.push(g);
            }
        }
        MIRROR.with(|cell| *cell.borrow_mut() = m);
        Ok(())
    }

    fn apply(delta: Delta) -> Result<(), PolicyError> {
        MIRROR.with(|cell| {
            let mut m = cell.borrow_mut();
            if delta.base_epoch != m.epoch {
                return Err(PolicyError::Stale(m.epoch));
            }
            for e in delta.events {
                m.apply(e)?;
            }
            m.epoch = delta.epoch;
            Ok(())
        })
    }
}

impl scheduler::Guest for FirstFit {
    fn schedule(round: RoundInfo) -> Result<Vec<Decision>, PolicyError> {
        MIRROR.with(|cell| {
            let mut m = cell.borrow_mut();
            if round.epoch != m.epoch {
                return Err(PolicyError::Stale(m.epoch));
            }
            let mut d = m.schedule();
            d.truncate(round.max_decisions as usize);
            Ok(d)
        })
    }
}

export!(FirstFit);
