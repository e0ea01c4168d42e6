//! Where whole-GPU workers of one job can go this round: per ready node,
//! the GPUs one worker-share fits on and the CPU and memory left, taken
//! from as workers are chosen so that several workers can be picked before
//! one decision charges them to the plan.

use arbiter_policy_sdk::prelude::*;

struct Room {
    node: u32,
    gpus: Vec<u32>,
    cpu_milli: u32,
    memory_mib: u32,
}

pub(crate) struct Rooms {
    rooms: Vec<Room>,
    gpus_per_worker: usize,
    cpu_milli: u32,
    memory_mib: u32,
}

impl Rooms {
    /// Every node open to `job` with what is left on it under `plan`.
    pub(crate) fn of(plan: &Plan<'_>, job: u32) -> Rooms {
        let cluster = plan.cluster();
        let j = cluster.job(job);
        let rooms = (0..cluster.node_count() as u32)
            .filter(|&node| plan.node_open_for(job, node))
            .map(|node| Room {
                node,
                gpus: plan.fitting_gpus(job, node).collect(),
                cpu_milli: plan.free_cpu(node),
                memory_mib: plan.free_memory(node),
            })
            .collect();
        Rooms {
            rooms,
            gpus_per_worker: j.gpus_per_worker().max(1) as usize,
            cpu_milli: j.cpu_milli(),
            memory_mib: j.memory_mib(),
        }
    }

    fn workers_in(&self, room: &Room) -> u32 {
        let by_gpu = room.gpus.len() / self.gpus_per_worker;
        let by_cpu = room
            .cpu_milli
            .checked_div(self.cpu_milli)
            .unwrap_or(u32::MAX);
        let by_mem = room
            .memory_mib
            .checked_div(self.memory_mib)
            .unwrap_or(u32::MAX);
        (by_gpu as u32).min(by_cpu).min(by_mem)
    }

    /// Workers that fit on `node`.
    pub(crate) fn workers_on(&self, node: u32) -> u32 {
        self.rooms
            .iter()
            .find(|r| r.node == node)
            .map_or(0, |r| self.workers_in(r))
    }

    /// Workers that fit anywhere.
    pub(crate) fn workers_available(&self) -> u32 {
        self.rooms.iter().map(|r| self.workers_in(r)).sum()
    }

    fn take_at(&mut self, k: usize) -> WorkerPlacement {
        let room = &mut self.rooms[k];
        let gpus: Vec<u32> = room.gpus.drain(..self.gpus_per_worker).collect();
        room.cpu_milli = room.cpu_milli.saturating_sub(self.cpu_milli);
        room.memory_mib = room.memory_mib.saturating_sub(self.memory_mib);
        WorkerPlacement {
            node: room.node,
            gpus,
        }
    }

    /// One worker on `node`, if one fits.
    pub(crate) fn take_on(&mut self, node: u32) -> Option<WorkerPlacement> {
        let k = self.rooms.iter().position(|r| r.node == node)?;
        (self.workers_in(&self.rooms[k]) > 0).then(|| self.take_at(k))
    }

    /// Someone else took these GPUs.
    pub(crate) fn remove_gpus(&mut self, gpus: &[u32]) {
        for room in &mut self.rooms {
            room.gpus.retain(|g| !gpus.contains(g));
        }
    }

    /// Up to `count` workers, each on the node with the most workers'
    /// room left (Kubernetes' least-allocated scoring; lower index on ties).
    pub(crate) fn spread_up_to(&mut self, count: u32) -> Vec<WorkerPlacement> {
        let mut out = Vec::new();
        while (out.len() as u32) < count {
            let best = (0..self.rooms.len())
                .filter(|&k| self.workers_in(&self.rooms[k]) > 0)
                .max_by_key(|&k| {
                    (
                        self.rooms[k].gpus.len(),
                        std::cmp::Reverse(self.rooms[k].node),
                    )
                });
            let Some(k) = best else { break };
            out.push(self.take_at(k));
        }
        out
    }

    /// Exactly `count` workers spread as [`Rooms::spread_up_to`], or none.
    pub(crate) fn spread(&mut self, count: u32) -> Option<Vec<WorkerPlacement>> {
        let out = self.spread_up_to(count);
        (out.len() as u32 == count).then_some(out)
    }

    /// Exactly `count` workers on as few nodes as possible: on one node
    /// when one holds them (the one with the most room, so that the job can
    /// grow there and jobs spread over nodes; lower index on ties),
    /// else, if `split`, over the nodes with the most room first. None if
    /// they do not fit.
    pub(crate) fn pack(&mut self, count: u32, split: bool) -> Option<Vec<WorkerPlacement>> {
        let one = (0..self.rooms.len())
            .filter(|&k| self.workers_in(&self.rooms[k]) >= count)
            .min_by_key(|&k| {
                (
                    std::cmp::Reverse(self.workers_in(&self.rooms[k])),
                    self.rooms[k].node,
                )
            });
        if let Some(k) = one {
            return Some((0..count).map(|_| self.take_at(k)).collect());
        }
        if !split || self.workers_available() < count {
            return None;
        }
        let mut order: Vec<usize> = (0..self.rooms.len()).collect();
        order.sort_by_key(|&k| {
            (
                std::cmp::Reverse(self.workers_in(&self.rooms[k])),
                self.rooms[k].node,
            )
        });
        let mut out = Vec::with_capacity(count as usize);
        for k in order {
            while (out.len() as u32) < count && self.workers_in(&self.rooms[k]) > 0 {
                out.push(self.take_at(k));
            }
        }
        Some(out)
    }
}
