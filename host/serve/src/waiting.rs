//! Why a job cannot run: never (refused at submit, with the reason) or not
//! yet (the reason `jobs` and `describe` show, like Slurm's REASON column
//! or a Kubernetes scheduling event).
//!
//! * [`Fleet::never_fits`]: a job no known node could ever hold — a worker larger
//!   than every node, a GPU model no node has, more GPUs than the cluster
//!   — is refused at submit rather than accepted to wait forever. Checked
//!   against every node the plane knows (lost and draining ones too: they
//!   may come back); with no node known yet (agents still to join) nothing
//!   is refused.
//! * [`Capacity`] and [`pending_reason`]: for a job released to its cell
//!   but not placed — capacity, fragmentation, or "fits, the policy has not
//!   placed it" — from the GPUs idle in the cell as of the last round.
//! * [`queued_reason`]: for a job still in its tenant's admission queue.

use crate::records::JobSpecRecord;
use arbiter_host::state::{ClusterState, NodeRequest};
use arbiter_policy_sdk::model::FULL_GPU_MILLI;
use arbiter_policy_sdk::plan::Plan;

/// The shapes of the nodes the plane knows, each once: a submit checks
/// its jobs against tens of shapes, not thousands of nodes.
#[derive(Clone, Debug, Default)]
pub struct Fleet {
    shapes: Vec<Shape>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Shape {
    gpu_model: String,
    gpu_count: u32,
    cpu_milli: u32,
    memory_mib: u32,
    gpu_memory_mib: u32,
    /// Nodes of this shape.
    count: u64,
}

impl Fleet {
    pub fn of<'a>(nodes: impl IntoIterator<Item = &'a NodeRequest>) -> Fleet {
        let mut counts: std::collections::BTreeMap<(String, u32, u32, u32, u32), u64> =
            std::collections::BTreeMap::new();
        for n in nodes {
            *counts
                .entry((
                    n.gpu_model.clone(),
                    n.gpu_count,
                    n.cpu_milli,
                    n.memory_mib,
                    n.gpu_memory_mib,
                ))
                .or_default() += 1;
        }
        Fleet {
            shapes: counts
                .into_iter()
                .map(
                    |((gpu_model, gpu_count, cpu_milli, memory_mib, gpu_memory_mib), count)| {
                        Shape {
                            gpu_model,
                            gpu_count,
                            cpu_milli,
                            memory_mib,
                            gpu_memory_mib,
                            count,
                        }
                    },
                )
                .collect(),
        }
    }

    /// Why no known node could ever run `spec`, if none could.
    pub fn never_fits(&self, spec: &JobSpecRecord) -> Option<String> {
        if self.shapes.is_empty() {
            return None;
        }
        let candidates: Vec<&Shape> = self
            .shapes
            .iter()
            .filter(|n| spec.gpu_models.is_empty() || spec.gpu_models.contains(&n.gpu_model))
            .collect();
        if candidates.is_empty() {
            let mut models: Vec<&str> = self.shapes.iter().map(|n| n.gpu_model.as_str()).collect();
            models.dedup();
            return Some(format!(
                "no node has GPU model {} (models here: {})",
                spec.gpu_models.join(" or "),
                models.join(", ")
            ));
        }
        let per_worker = if spec.gpus == 0 {
            0
        } else {
            spec.gpus_per_worker
        };
        let holds_a_worker = |n: &&&Shape| {
            n.gpu_count >= per_worker
                && n.cpu_milli >= spec.cpu_milli
                && n.memory_mib >= spec.memory_mib
                && (spec.gpu_memory_mib == 0 || n.gpu_memory_mib >= spec.gpu_memory_mib)
        };
        if !candidates.iter().any(|n| holds_a_worker(&n)) {
            let most = |f: fn(&Shape) -> u32| candidates.iter().map(|n| f(n)).max().unwrap_or(0);
            return Some(format!(
                "no node can hold one worker ({per_worker} GPUs, {} mCPU, {} MiB, {} MiB per \
                 GPU); the largest offer {} GPUs, {} mCPU, {} MiB, {} MiB per GPU",
                spec.cpu_milli,
                spec.memory_mib,
                spec.gpu_memory_mib,
                most(|n| n.gpu_count),
                most(|n| n.cpu_milli),
                most(|n| n.memory_mib),
                most(|n| n.gpu_memory_mib),
            ));
        }
        let (min_workers, _) = spec.worker_bounds();
        let needed = u64::from(min_workers) * u64::from(per_worker);
        let held: u64 = candidates
            .iter()
            .filter(|n| holds_a_worker(n))
            .map(|n| n.count * u64::from(n.gpu_count / per_worker.max(1) * per_worker))
            .sum();
        (per_worker > 0 && needed > held).then(|| {
            format!(
                "needs {min_workers} workers of {per_worker} GPUs ({needed} GPUs); the nodes \
                 that fit its workers hold {held}"
            )
        })
    }
}

/// What a cell had idle as of its last round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capacity {
    /// Whole idle GPUs on ready nodes.
    pub idle_gpus: u32,
    /// The most whole idle GPUs on one ready node.
    pub most_idle_on_a_node: u32,
    /// The most milli-GPU free on one GPU of a ready node.
    pub largest_free_milli: u32,
}

impl Capacity {
    pub fn of(state: &ClusterState) -> Capacity {
        let cluster = state.cluster();
        let plan = Plan::new(cluster);
        let mut c = Capacity::default();
        for node in cluster.nodes().filter(|n| n.is_ready()) {
            let idle = plan.node_idle_gpus(node.index());
            c.idle_gpus += idle;
            c.most_idle_on_a_node = c.most_idle_on_a_node.max(idle);
            for gpu in node.gpu_range() {
                c.largest_free_milli = c.largest_free_milli.max(plan.free_milli(gpu));
            }
        }
        c
    }
}

/// Why a job released to its cell has not started, from the GPUs idle
/// there (GPU counts only: CPU, memory and model constraints fall under
/// "fits by GPU count").
pub fn pending_reason(spec: &JobSpecRecord, cap: &Capacity) -> String {
    let (min_workers, _) = spec.worker_bounds();
    if spec.gpus == 0 {
        return "waiting for CPU or memory, or for the policy to place it".into();
    }
    if spec.gpu_milli > 0 && spec.gpu_milli < FULL_GPU_MILLI {
        return if cap.largest_free_milli >= spec.gpu_milli {
            format!(
                "fits by GPU share now ({} milli-GPU free on one GPU): the policy has not \
                 placed it (held back, ranked behind other work, or CPU, memory or model)",
                cap.largest_free_milli
            )
        } else {
            format!(
                "capacity: no GPU has {} milli-GPU free (most: {})",
                spec.gpu_milli, cap.largest_free_milli
            )
        };
    }
    let per_worker = spec.gpus_per_worker;
    let needed = min_workers * per_worker;
    if cap.idle_gpus < needed {
        format!("capacity: {} GPUs idle, it needs {needed}", cap.idle_gpus)
    } else if cap.most_idle_on_a_node < per_worker {
        format!(
            "fragmentation: {} GPUs idle, but no node has the {per_worker} a worker needs \
             (most on one node: {})",
            cap.idle_gpus, cap.most_idle_on_a_node
        )
    } else {
        format!(
            "fits by GPU count now ({} idle): the policy has not placed it (held back, \
             ranked behind other work, or CPU, memory or model)",
            cap.idle_gpus
        )
    }
}

/// Why a job is still in its tenant's admission queue.
pub fn queued_reason(
    spec: &JobSpecRecord,
    tenant: &str,
    quota_gpus: u32,
    claimed_gpus: u32,
) -> String {
    if quota_gpus > 0 && claimed_gpus + spec.gpus > quota_gpus {
        format!(
            "quota: tenant `{tenant}` holds {claimed_gpus} of its {quota_gpus} GPUs; this job \
             needs {}",
            spec.gpus
        )
    } else {
        "waiting for admission (the tenant's policy, or the next round)".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(gpus: u32, per_worker: u32) -> JobSpecRecord {
        JobSpecRecord {
            gpus,
            gpus_per_worker: per_worker,
            ..JobSpecRecord::default()
        }
    }

    fn nodes() -> Vec<NodeRequest> {
        (0..4)
            .map(|i| NodeRequest::gpus(format!("n{i}"), "p", "A100", 81_920, 8))
            .collect()
    }

    #[test]
    fn impossible_jobs_are_named_and_possible_ones_pass() {
        let nodes = nodes();
        let fleet = Fleet::of(&nodes);
        assert_eq!(fleet.shapes.len(), 1);
        let never = |s: &JobSpecRecord| fleet.never_fits(s);
        assert!(never(&spec(16, 16)).is_some_and(|r| r.contains("one worker")));
        assert!(never(&spec(64, 8)).is_some_and(|r| r.contains("hold 32")));
        let mut s = spec(1, 1);
        s.gpu_models = vec!["H100".into()];
        assert!(never(&s).is_some_and(|r| r.contains("H100") && r.contains("A100")));
        let mut s = spec(1, 1);
        s.cpu_milli = 4_000_000_000;
        assert!(never(&s).is_some());
        assert_eq!(never(&spec(32, 8)), None);
        assert_eq!(
            Fleet::of(&[]).never_fits(&spec(16, 16)),
            None,
            "no node known yet"
        );
    }

    #[test]
    fn pending_reasons_tell_capacity_from_fragmentation() {
        let cap = Capacity {
            idle_gpus: 8,
            most_idle_on_a_node: 3,
            largest_free_milli: 1000,
        };
        assert!(pending_reason(&spec(16, 8), &cap).starts_with("capacity"));
        assert!(pending_reason(&spec(4, 4), &cap).starts_with("fragmentation"));
        assert!(pending_reason(&spec(2, 2), &cap).starts_with("fits"));
        assert!(queued_reason(&spec(4, 4), "a", 16, 14).starts_with("quota"));
        assert!(queued_reason(&spec(2, 2), "a", 16, 14).starts_with("waiting"));
    }
}
