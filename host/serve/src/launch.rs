//! From a placement to what each node runs: one resolved launch per job per
//! node.
//!
//! A job's workers may share a node (a gang of two 4-GPU workers on one
//! 8-GPU server): the node gets **one** `Launch` with all of the job's GPUs
//! there, never one per worker (an agent runs a job once). Ranks and world
//! size are the job's, not the node's: rank `r` is the job's `r`-th GPU in
//! placement order, and every node is told the job's world size. The GPU
//! share is resolved here, by the contract's rule
//! ([`arbiter_policy_sdk::model::gpu_share`], the rule the scheduler charged;
//! [`arbiter_policy_sdk::model::shared_gpu_share`] for shared work): a
//! fractional job that states no memory gets its share of the GPU's memory
//! as a hard quota, not "the whole GPU"; a shared (qos >= 1 while sharing is
//! on) whole-GPU job that states its memory gets that as its quota, since it
//! runs beside the GPU's owner. A running job whose terms change (a QoS
//! upgrade) gets an [`update_of`] its new launch: the same rule, once.

use crate::records::{JobSpecRecord, WorkerAt};
use arbiter_policy_sdk::model::{self, FULL_GPU_MILLI};

/// One node's part of a job.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeLaunch {
    pub node: String,
    pub launch: Launch,
}

/// What one node runs of a job: its command on some of the node's GPUs,
/// under the terms the contract's rule resolved.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Launch {
    pub job_id: u64,
    pub name: String,
    pub command: Vec<String>,
    /// Node-local GPU ordinals.
    pub gpus: Vec<u32>,
    /// Device-memory quota per GPU (MiB); 0 = the whole GPU.
    pub memory_limit_mib: u32,
    /// Compute share in permille; 1000 = unthrottled.
    pub compute_share_permille: u32,
    /// 0 online (latency-critical), 1 offline (best effort).
    pub role: u32,
    /// The job's rank of this node's first GPU.
    pub rank_base: u32,
    /// The job's ranks across all its nodes.
    pub world_size: u32,
    /// MPS active thread percentage (1..=100; 0 = the daemon's default).
    pub mps_thread_pct: u32,
    /// The job's contract `qos` code.
    pub qos: u32,
    /// GPU share request and limit in permille (limit 0 = the request).
    pub request_permille: u32,
    pub limit_permille: u32,
    /// Which launch of the job this is (numbered by the plane when it sends it).
    pub launch_seq: u64,
}

/// A change to a running job's terms on one node; `None` keeps a value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Update {
    pub job_id: u64,
    pub seq: u64,
    pub role: Option<u32>,
    pub qos: Option<u32>,
    pub memory_limit_mib: Option<u32>,
    pub compute_share_permille: Option<u32>,
    pub mps_thread_pct: Option<u32>,
    pub request_permille: Option<u32>,
    pub limit_permille: Option<u32>,
}

/// The launches of job `job_id` placed at `placement`. `gpu_memory_mib`
/// gives a node's per-GPU memory (`None`: a node the plane does not know,
/// which a placement cannot name; the error says which).
pub fn resolve(
    job_id: u64,
    spec: &JobSpecRecord,
    placement: &[WorkerAt],
    shared: bool,
    gpu_memory_mib: impl Fn(&str) -> Option<u32>,
) -> Result<Vec<NodeLaunch>, String> {
    let mut by_node: Vec<(&str, Vec<u32>)> = Vec::new();
    for w in placement {
        match by_node.iter_mut().find(|(n, _)| *n == w.node) {
            Some((_, gpus)) => gpus.extend(&w.gpus),
            None => by_node.push((&w.node, w.gpus.clone())),
        }
    }
    let world_size: u32 = by_node.iter().map(|(_, g)| g.len() as u32).sum();
    let gpus_per_worker = if spec.gpus == 0 {
        0
    } else {
        spec.gpus_per_worker
    };
    let role = u32::from(spec.qos != model::qos::GUARANTEED);
    let mut rank_base = 0;
    let mut out = Vec::with_capacity(by_node.len());
    for (node, gpus) in by_node {
        let total = gpu_memory_mib(node)
            .ok_or_else(|| format!("job {job_id} is placed on unknown node `{node}`"))?;
        let share = if shared {
            model::shared_gpu_share
        } else {
            model::gpu_share
        };
        let (milli, memory) = share(gpus_per_worker, spec.gpu_milli, spec.gpu_memory_mib, total);
        // The whole GPU's memory is no quota at all.
        let unlimited = memory >= total;
        let count = gpus.len() as u32;
        out.push(NodeLaunch {
            node: node.to_string(),
            launch: Launch {
                job_id,
                name: spec.name.clone(),
                command: spec.command.clone(),
                gpus,
                // 0 = the whole GPU; a share is a hard quota.
                memory_limit_mib: if unlimited { 0 } else { memory },
                compute_share_permille: milli.min(FULL_GPU_MILLI),
                role,
                rank_base,
                world_size,
                mps_thread_pct: 0,
                qos: u32::from(spec.qos),
                request_permille: milli.min(FULL_GPU_MILLI),
                limit_permille: spec.gpu_milli_limit,
                // Numbered by the plane when it sends the launch.
                launch_seq: 0,
            },
        });
        rank_base += count;
    }
    Ok(out)
}

/// An offline job a matcher paired with an online one (MuxFlow; contract 0.3's G9) runs
/// beside it under MPS with the pairing's share of the SMs: every node's launch carries it as
/// the client's active thread percentage.
pub fn with_sm_share(launches: &mut [NodeLaunch], sm_percent: u8) {
    for l in launches {
        l.launch.mps_thread_pct = u32::from(sm_percent.clamp(1, 100));
    }
}

/// The `Update` that moves a running job's workloads on one node to the
/// terms `launch` resolves (everything but the command and the ranks).
pub fn update_of(launch: &Launch, seq: u64) -> Update {
    Update {
        job_id: launch.job_id,
        seq,
        role: Some(launch.role),
        qos: Some(launch.qos),
        memory_limit_mib: Some(launch.memory_limit_mib),
        compute_share_permille: Some(launch.compute_share_permille),
        mps_thread_pct: (launch.mps_thread_pct > 0).then_some(launch.mps_thread_pct),
        request_permille: Some(launch.request_permille),
        limit_permille: Some(launch.limit_permille),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(gpus: u32, per_worker: u32, milli: u32, memory: u32) -> JobSpecRecord {
        JobSpecRecord {
            name: "j".into(),
            gpus,
            gpus_per_worker: per_worker,
            gpu_milli: milli,
            cpu_milli: 0,
            memory_mib: 0,
            priority: 0,
            qos: 0,
            duration_ms: 0,
            deadline_ms: 0,
            command: vec!["true".into()],
            gpu_models: Vec::new(),
            gpu_memory_mib: memory,
            ..JobSpecRecord::default()
        }
    }

    fn at(node: &str, gpus: &[u32]) -> WorkerAt {
        WorkerAt {
            node: node.into(),
            gpus: gpus.to_vec(),
        }
    }

    const V100: Option<u32> = Some(32_768);

    #[test]
    fn a_half_gpu_without_stated_memory_gets_half_the_memory_as_a_quota() {
        let l = resolve(7, &spec(1, 1, 500, 0), &[at("a", &[3])], false, |_| V100).unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].launch.memory_limit_mib, 16_384);
        assert_eq!(l[0].launch.compute_share_permille, 500);
        let stated = resolve(7, &spec(1, 1, 500, 4096), &[at("a", &[3])], false, |_| V100).unwrap();
        assert_eq!(stated[0].launch.memory_limit_mib, 4096);
    }

    #[test]
    fn a_whole_gpu_job_is_unlimited_on_its_gpus() {
        let l = resolve(7, &spec(2, 2, 0, 0), &[at("a", &[0, 1])], false, |_| V100).unwrap();
        assert_eq!(l[0].launch.memory_limit_mib, 0);
        assert_eq!(l[0].launch.compute_share_permille, 1000);
    }

    #[test]
    fn workers_on_one_node_are_one_launch_and_ranks_are_the_jobs() {
        let placement = [at("a", &[0, 1]), at("b", &[4, 5]), at("a", &[2, 3])];
        let l = resolve(9, &spec(6, 2, 0, 0), &placement, false, |_| V100).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(
            (l[0].node.as_str(), &l[0].launch.gpus[..]),
            ("a", &[0, 1, 2, 3][..])
        );
        assert_eq!(
            (l[1].node.as_str(), &l[1].launch.gpus[..]),
            ("b", &[4, 5][..])
        );
        assert_eq!((l[0].launch.rank_base, l[1].launch.rank_base), (0, 4));
        assert!(l.iter().all(|l| l.launch.world_size == 6));
    }

    /// AntMan's opportunistic job beside a guaranteed one: a whole GPU of
    /// compute, its stated 3.5 GB as the quota, role offline; upgraded to
    /// guaranteed, the update lifts the quota and makes it online.
    #[test]
    fn shared_work_gets_its_stated_memory_and_an_upgrade_updates_it() {
        let mut s = spec(1, 1, 1000, 3_584);
        s.qos = model::qos::OPPORTUNISTIC;
        let l = resolve(7, &s, &[at("a", &[0])], true, |_| V100).unwrap();
        let launch = &l[0].launch;
        assert_eq!(
            (launch.memory_limit_mib, launch.role, launch.qos),
            (3_584, 1, 1)
        );
        // Sharing off: the same job is charged (and launched) as a whole GPU.
        let off = resolve(7, &s, &[at("a", &[0])], false, |_| V100).unwrap();
        assert_eq!(off[0].launch.memory_limit_mib, 0);

        s.qos = model::qos::GUARANTEED;
        let up = resolve(7, &s, &[at("a", &[0])], false, |_| V100).unwrap();
        let u = update_of(&up[0].launch, 42);
        assert_eq!((u.job_id, u.seq), (7, 42));
        assert_eq!(u.role, Some(0));
        assert_eq!(u.qos, Some(0));
        assert_eq!(
            u.memory_limit_mib,
            Some(0),
            "a guaranteed whole GPU is unlimited"
        );
        assert_eq!(u.compute_share_permille, Some(1000));
        assert_eq!(u.mps_thread_pct, None);
    }

    #[test]
    fn an_unknown_node_is_an_error() {
        let e = resolve(1, &spec(1, 1, 0, 0), &[at("ghost", &[0])], false, |_| None).unwrap_err();
        assert!(e.contains("ghost"), "{e}");
    }
}
