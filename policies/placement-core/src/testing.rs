//! Test support shared by the placement policies' unit tests: one-worker
//! jobs, single-worker placements and a one-round run through the SDK
//! [`Runtime`]. Plain helpers over the SDK's [`TestCluster`]; nothing here is
//! used by the policies themselves.

use arbiter_policy_sdk::prelude::*;

/// A pending one-worker job spec (`workers = min = max = 1`) asking for
/// `cpu_milli`, and `gpus` GPUs of `gpu_milli` each; every other field is the
/// default. Interns `name` in `c`.
pub fn worker_spec(
    c: &mut TestCluster,
    name: &str,
    cpu_milli: u32,
    gpus: u32,
    gpu_milli: u32,
) -> JobSpec {
    JobSpec {
        name: c.intern(name),
        workers: 1,
        min_workers: 1,
        max_workers: 1,
        cpu_milli,
        gpus_per_worker: gpus,
        gpu_milli,
        ..JobSpec::default()
    }
}

/// Adds the job of [`worker_spec`] to `c`; returns its index.
pub fn worker_job(
    c: &mut TestCluster,
    name: &str,
    cpu_milli: u32,
    gpus: u32,
    gpu_milli: u32,
) -> u32 {
    let spec = worker_spec(c, name, cpu_milli, gpus, gpu_milli);
    c.job_spec(spec)
}

/// One worker on `node` using `gpus`.
pub fn worker(node: u32, gpus: Vec<u32>) -> Vec<WorkerPlacement> {
    vec![WorkerPlacement { node, gpus }]
}

/// Marks `job` as running with one worker on `node` using `gpus`.
pub fn run_on(c: &mut TestCluster, job: u32, node: u32, gpus: Vec<u32>) {
    c.run(job, worker(node, gpus));
}

/// The decision placing `job`'s one worker on `node` using `gpus`.
pub fn place(job: u32, node: u32, gpus: Vec<u32>) -> Decision {
    Decision::Place(job, worker(node, gpus))
}

/// One scheduling round of a fresh `P` on `c`'s snapshot, after
/// `configure(config)` when a configuration is given.
pub fn schedule<P: Policy>(
    c: &TestCluster,
    config: Option<&str>,
    max_decisions: u32,
) -> Vec<Decision> {
    let mut rt = Runtime::<P>::new();
    if let Some(config) = config {
        rt.configure(config).unwrap();
    }
    rt.resync(c.snapshot()).unwrap();
    rt.schedule(c.round(max_decisions)).unwrap()
}
