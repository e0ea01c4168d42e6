//! The fragmentation measure of the FGD paper (Weng et al., ATC'23, §4).
//!
//! For a node n and a task class m, the GPU fragment is the unallocated GPU
//! capacity that m cannot use on n:
//! * all of the node's free GPU if m needs no GPU, may not run on the node's
//!   GPU model, or does not fit the node at all (too little CPU, too few GPUs
//!   with enough free milli-GPU);
//! * otherwise the free milli-GPU of the GPUs that each have less free than
//!   m's per-GPU request.
//!
//! F_n(M) = Σ_m p_m · frag_n(m) is the expected fragment for the target
//! workload M; FGD places a task where F grows least. The measure reads CPU
//! and milli-GPU only, as the paper and its reference simulator do.
//!
//! Written as F_n = T_n − Σ_m p_m · U_n(m), with T_n the node's free milli-GPU
//! and U_n(m) the free milli-GPU that m can use there (the GPUs with at least
//! its per-GPU request, if it fits at all), the per-class quantities U are a
//! count and a sum over GPUs that one placement changes by a few terms: that
//! is what [`FragIndex`] caches so a candidate costs O(classes), not
//! O(classes × GPUs).

use crate::workload::{TargetWorkload, TaskClass};
use arbiter_policy_sdk::prelude::*;

fn accessible(class: &TaskClass, model: &str) -> bool {
    class.gpu_models.is_empty() || class.gpu_models.iter().any(|m| m == model)
}

/// F_n(M) computed directly from its definition, for one node with GPUs of
/// `gpu_model`, `cpu_free` milli-CPU and these free milli-GPU per GPU.
pub fn node_fragmentation(
    workload: &TargetWorkload,
    gpu_model: &str,
    cpu_free: u32,
    gpu_free: &[u32],
) -> f64 {
    let total: u64 = gpu_free.iter().map(|&f| u64::from(f)).sum();
    let mut frag = 0.0;
    for class in workload.classes() {
        let fragment = if class.num_gpu == 0 || !accessible(class, gpu_model) {
            total
        } else {
            let fitting = gpu_free.iter().filter(|&&f| f >= class.gpu_milli).count();
            if cpu_free >= class.cpu_milli && fitting >= class.num_gpu as usize {
                gpu_free
                    .iter()
                    .filter(|&&f| f < class.gpu_milli)
                    .map(|&f| u64::from(f))
                    .sum()
            } else {
                total
            }
        };
        frag += class.weight * fragment as f64;
    }
    frag
}

/// A GPU class as seen from one GPU model.
#[derive(Clone, Copy, Debug)]
struct Term {
    cpu: u32,
    gpu_milli: u32,
    num_gpu: u32,
    weight: f64,
}

/// Per node and term: the GPUs with at least the term's per-GPU request free.
#[derive(Clone, Copy, Debug, Default)]
struct Stat {
    count: u32,
    sum: u32,
}

#[derive(Clone, Debug, Default)]
struct NodeCache {
    /// The node version this cache was computed at (0: never).
    version: u64,
    /// Index into `FragIndex::term_sets`.
    terms: usize,
    first_gpu: u32,
    cpu_free: u32,
    gpu_free: Vec<u32>,
    total: u32,
    stats: Vec<Stat>,
    frag: f64,
}

/// F_n(M) of every node, kept up to date incrementally.
#[derive(Clone, Debug, Default)]
pub struct FragIndex {
    workload: TargetWorkload,
    /// Per GPU model (by name: string ids change when the host compacts its
    /// string table; `None`: no GPU), the accessible GPU classes.
    term_sets: Vec<(Option<String>, Vec<Term>)>,
    nodes: Vec<NodeCache>,
}

impl FragIndex {
    pub fn new(workload: TargetWorkload) -> Self {
        FragIndex {
            workload,
            term_sets: Vec::new(),
            nodes: Vec::new(),
        }
    }

    pub fn workload(&self) -> &TargetWorkload {
        &self.workload
    }

    /// Replaces the target workload; every node is recomputed at the next sync.
    pub fn set_workload(&mut self, workload: TargetWorkload) {
        *self = FragIndex::new(workload);
    }

    /// The accessible GPU classes of GPUs of `model` (`None`: a node without GPUs).
    fn term_set(&mut self, model: Option<&str>) -> usize {
        if let Some(i) = self
            .term_sets
            .iter()
            .position(|(m, _)| m.as_deref() == model)
        {
            return i;
        }
        let terms = self
            .workload
            .classes()
            .iter()
            .filter(|c| c.num_gpu > 0 && model.is_some_and(|n| accessible(c, n)))
            .map(|c| Term {
                cpu: c.cpu_milli,
                gpu_milli: c.gpu_milli,
                num_gpu: c.num_gpu,
                weight: c.weight,
            })
            .collect();
        self.term_sets.push((model.map(str::to_string), terms));
        self.term_sets.len() - 1
    }

    /// Brings the index in step with the cluster's committed state (a
    /// round's start): only nodes whose version changed since they were last
    /// computed are recomputed.
    pub fn sync(&mut self, cluster: &Cluster) {
        let nc = cluster.node_columns();
        let gc = cluster.gpu_columns();
        let n = cluster.node_count();
        self.nodes.resize_with(n, NodeCache::default);
        for node in 0..n {
            let version = cluster.node_version(node as u32);
            if self.nodes[node].version == version {
                continue;
            }
            // A changed version may also be a different node (after a
            // resync): take its GPU model and range afresh.
            let range = cluster.node(node as u32).gpu_range();
            let model = (!range.is_empty()).then(|| cluster.string(gc.model[range.start as usize]));
            let terms = self.term_set(model);
            let cache = &mut self.nodes[node];
            cache.terms = terms;
            cache.first_gpu = range.start;
            let cpu_free = nc.cpu_milli[node].saturating_sub(nc.cpu_used_milli[node]);
            let first = nc.first_gpu[node] as usize;
            let used = &gc.milli_used[first..first + nc.gpu_count[node] as usize];
            let free = used.iter().map(|&u| FULL_GPU_MILLI.saturating_sub(u));
            self.load(node, version, cpu_free, free);
        }
    }

    /// Recomputes `node` from the plan's tentative state.
    pub fn refresh(&mut self, plan: &Plan<'_>, node: u32) {
        let i = node as usize;
        if i >= self.nodes.len() {
            return;
        }
        let range = plan.cluster().node(node).gpu_range();
        let free: Vec<u32> = range.map(|g| plan.free_milli(g)).collect();
        self.load(
            i,
            plan.node_version(node),
            plan.free_cpu(node),
            free.into_iter(),
        );
    }

    fn load(&mut self, node: usize, version: u64, cpu_free: u32, free: impl Iterator<Item = u32>) {
        let cache = &mut self.nodes[node];
        cache.version = version;
        cache.cpu_free = cpu_free;
        cache.gpu_free.clear();
        cache.gpu_free.extend(free);
        cache.total = cache.gpu_free.iter().sum();
        let terms = &self.term_sets[cache.terms].1;
        cache.stats.clear();
        let mut usable = 0.0;
        for term in terms {
            let mut stat = Stat::default();
            for &f in &cache.gpu_free {
                if f >= term.gpu_milli {
                    stat.count += 1;
                    stat.sum += f;
                }
            }
            if cpu_free >= term.cpu && stat.count >= term.num_gpu {
                usable += term.weight * f64::from(stat.sum);
            }
            cache.stats.push(stat);
        }
        cache.frag = f64::from(cache.total) - usable;
    }

    /// F_n(M) of `node` as last computed (0 for an unknown node).
    pub fn fragmentation(&self, node: u32) -> f64 {
        self.nodes.get(node as usize).map_or(0.0, |c| c.frag)
    }

    /// Σ_n F_n(M) over the cluster.
    pub fn cluster_fragmentation(&self) -> f64 {
        self.nodes.iter().map(|c| c.frag).sum()
    }

    /// How much F_n(M) of `node` grows if a task takes `cpu_milli` CPU and
    /// `gpu_milli` from each GPU in `gpus`: F after − F before. NaN if a GPU
    /// is not on the node.
    pub fn delta(&self, node: u32, cpu_milli: u32, gpus: &[u32], gpu_milli: u32) -> f64 {
        let Some(cache) = self.nodes.get(node as usize) else {
            return f64::NAN;
        };
        let mut changes = [(0u32, 0u32); 16];
        if gpus.len() > changes.len() {
            return self.delta_slow(cache, cpu_milli, gpus, gpu_milli);
        }
        let mut taken = 0u32;
        for (slot, &g) in changes.iter_mut().zip(gpus) {
            let Some(&old) = g
                .checked_sub(cache.first_gpu)
                .and_then(|l| cache.gpu_free.get(l as usize))
            else {
                return f64::NAN;
            };
            let new = old.saturating_sub(gpu_milli);
            taken += old - new;
            *slot = (old, new);
        }
        let changes = &changes[..gpus.len()];
        let cpu_after = cache.cpu_free.saturating_sub(cpu_milli);
        let terms = &self.term_sets[cache.terms].1;
        let mut usable = 0.0;
        for (term, stat) in terms.iter().zip(&cache.stats) {
            let (mut count, mut sum) = (stat.count, stat.sum);
            for &(old, new) in changes {
                if old >= term.gpu_milli {
                    count = count.saturating_sub(1);
                    sum = sum.saturating_sub(old);
                }
                if new >= term.gpu_milli {
                    count += 1;
                    sum += new;
                }
            }
            if cpu_after >= term.cpu && count >= term.num_gpu {
                usable += term.weight * f64::from(sum);
            }
        }
        let after = f64::from(cache.total - taken) - usable;
        after - cache.frag
    }

    /// `delta` for a task on more than 16 GPUs: recompute from scratch.
    fn delta_slow(&self, cache: &NodeCache, cpu_milli: u32, gpus: &[u32], gpu_milli: u32) -> f64 {
        let mut free = cache.gpu_free.clone();
        for &g in gpus {
            match g
                .checked_sub(cache.first_gpu)
                .and_then(|l| free.get_mut(l as usize))
            {
                Some(f) => *f = f.saturating_sub(gpu_milli),
                None => return f64::NAN,
            }
        }
        let cpu_after = cache.cpu_free.saturating_sub(cpu_milli);
        let total: u32 = free.iter().sum();
        let mut usable = 0.0;
        for term in &self.term_sets[cache.terms].1 {
            let fitting = free.iter().filter(|&&f| f >= term.gpu_milli);
            let count = fitting.clone().count() as u32;
            if cpu_after >= term.cpu && count >= term.num_gpu {
                usable += term.weight * f64::from(fitting.sum::<u32>());
            }
        }
        f64::from(total) - usable - cache.frag
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SplitMix64;
    use crate::testing::worker_job;
    use crate::workload::TaskClass;

    fn class(cpu: u32, num_gpu: u32, gpu_milli: u32, models: &[&str], weight: f64) -> TaskClass {
        TaskClass {
            cpu_milli: cpu,
            memory_mib: 0,
            num_gpu,
            gpu_milli,
            gpu_models: models.iter().map(|m| m.to_string()).collect(),
            weight,
        }
    }

    #[test]
    fn definition_by_hand() {
        // M: half 0.5-GPU tasks with 4 CPUs, half CPU-only tasks.
        let w = TargetWorkload::new(vec![
            class(4000, 1, 500, &[], 1.0),
            class(1000, 0, 0, &[], 1.0),
        ])
        .unwrap();
        // GPUs with 300 and 1000 free, CPU plenty: the sharing class can use
        // only the 1000, so its fragment is 300; the CPU class can use no GPU:
        // 1300. F = 0.5·300 + 0.5·1300 = 800.
        assert_eq!(node_fragmentation(&w, "T4", 8000, &[300, 1000]), 800.0);
        // Too little CPU for the sharing class: all 1300 is fragment for both.
        assert_eq!(node_fragmentation(&w, "T4", 2000, &[300, 1000]), 1300.0);
        // A model constraint the node does not meet counts like "cannot fit".
        let w = TargetWorkload::new(vec![class(0, 1, 500, &["A10"], 1.0)]).unwrap();
        assert_eq!(node_fragmentation(&w, "T4", 8000, &[1000]), 1000.0);
        assert_eq!(node_fragmentation(&w, "A10", 8000, &[1000]), 0.0);
    }

    #[test]
    fn index_matches_the_definition() {
        let w = TargetWorkload::new(vec![
            class(4000, 1, 500, &[], 3.0),
            class(8000, 1, 250, &["T4"], 1.0),
            class(2000, 1, 1000, &[], 2.0),
            class(16000, 2, 1000, &[], 1.0),
            class(1000, 0, 0, &[], 1.0),
        ])
        .unwrap();
        let mut tc = TestCluster::new();
        for i in 0..6 {
            let model = if i % 2 == 0 { "T4" } else { "V100M32" };
            tc.node(&format!("n{i}"), "p", 32_000, 256_000, model, 32_000, 4);
        }
        let mut rng = SplitMix64::new(3);
        let mut index = FragIndex::new(w.clone());
        let check = |index: &FragIndex, cluster: &Cluster, plan: &Plan<'_>| {
            for node in cluster.nodes() {
                let free: Vec<u32> = node.gpu_range().map(|g| plan.free_milli(g)).collect();
                let model = node.gpus().next().map_or("", |g| g.model());
                let want = node_fragmentation(&w, model, plan.free_cpu(node.index()), &free);
                let got = index.fragmentation(node.index());
                assert!(
                    (want - got).abs() < 1e-6,
                    "node {}: {got} != {want}",
                    node.index()
                );
            }
        };
        for round in 0..40 {
            let milli = [250, 500, 1000, 100][rng.below(4) as usize];
            let cpu_milli = 1000 * (1 + rng.below(4) as u32);
            let job = worker_job(&mut tc, &format!("j{round}"), cpu_milli, 1, milli);
            let cluster = tc.cluster().clone();
            index.sync(&cluster);
            let mut plan = Plan::new(&cluster);
            check(&index, &cluster, &plan);
            let task = crate::task::Task::of(cluster.job(job));
            // Every candidate's delta equals the definition's difference.
            let mut chosen = None;
            let mut scratch = Vec::new();
            for node in 0..cluster.node_count() as u32 {
                crate::task::node_candidates(
                    &plan,
                    &task,
                    node,
                    crate::task::GpuSelection::EachFreeLevel,
                    &mut scratch,
                    |gpus| {
                        let n = cluster.node(node);
                        let model = n.gpus().next().map_or("", |g| g.model());
                        let before: Vec<u32> = n.gpu_range().map(|g| plan.free_milli(g)).collect();
                        let after: Vec<u32> = n
                            .gpu_range()
                            .map(|g| {
                                let f = plan.free_milli(g);
                                if gpus.contains(&g) {
                                    f - task.gpu_milli
                                } else {
                                    f
                                }
                            })
                            .collect();
                        let cpu = plan.free_cpu(node);
                        let want = node_fragmentation(&w, model, cpu - task.cpu_milli, &after)
                            - node_fragmentation(&w, model, cpu, &before);
                        let got = index.delta(node, task.cpu_milli, gpus, task.gpu_milli);
                        assert!((want - got).abs() < 1e-6, "delta {got} != {want}");
                        if chosen.is_none() || rng.below(3) == 0 {
                            chosen = Some(WorkerPlacement {
                                node,
                                gpus: gpus.to_vec(),
                            });
                        }
                    },
                );
            }
            let Some(worker) = chosen else { break };
            let node = worker.node;
            plan.apply(Decision::Place(job, vec![worker.clone()]))
                .unwrap();
            index.refresh(&plan, node);
            check(&index, &cluster, &plan);
            tc.run(job, vec![worker]);
        }
    }
}
