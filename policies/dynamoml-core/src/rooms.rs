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
        Self::on_nodes(plan, job, 0..plan.cluster().node_count() as u32)
    }

    /// `node` alone, if it is open to `job`: what growing a job on its home node needs, without
    /// a room per node of the cluster for each job (at PAI scale, 1,000 jobs × 1,897 nodes).
    pub(crate) fn at(plan: &Plan<'_>, job: u32, node: u32) -> Rooms {
        Self::on_nodes(plan, job, std::iter::once(node))
    }

    /// `nodes` in ascending order (see [`Rooms::position`]).
    fn on_nodes(plan: &Plan<'_>, job: u32, nodes: impl Iterator<Item = u32>) -> Rooms {
        let j = plan.cluster().job(job);
        let rooms = nodes
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

    /// The room on `node`: rooms are built in node order and never reordered, so a binary
    /// search (a per-node scan made `take_back_for` quadratic in the cluster's nodes).
    fn position(&self, node: u32) -> Option<usize> {
        self.rooms.binary_search_by_key(&node, |r| r.node).ok()
    }

    /// Workers that fit on `node`.
    pub(crate) fn workers_on(&self, node: u32) -> u32 {
        self.position(node)
            .map_or(0, |k| self.workers_in(&self.rooms[k]))
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
        let k = self.position(node)?;
        (self.workers_in(&self.rooms[k]) > 0).then(|| self.take_at(k))
    }

    /// Another job's worker took this placement and that CPU and memory on its node.
    pub(crate) fn remove_worker(
        &mut self,
        worker: &WorkerPlacement,
        cpu_milli: u32,
        memory_mib: u32,
    ) {
        if let Some(k) = self.position(worker.node) {
            let room = &mut self.rooms[k];
            room.gpus.retain(|g| !worker.gpus.contains(g));
            room.cpu_milli = room.cpu_milli.saturating_sub(cpu_milli);
            room.memory_mib = room.memory_mib.saturating_sub(memory_mib);
        }
    }

    /// CPU and memory one worker of this job takes.
    pub(crate) fn worker_needs(&self) -> (u32, u32) {
        (self.cpu_milli, self.memory_mib)
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
