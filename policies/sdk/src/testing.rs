//! Building small clusters by hand, for policy unit tests and examples.

use crate::cluster::Cluster;
use crate::model::*;
use crate::plan::Plan;
use crate::runtime::Policy;
use std::collections::HashMap;

/// A cluster built event by event, exactly as the host builds its own.
#[derive(Default)]
pub struct TestCluster {
    cluster: Cluster,
    interned: HashMap<String, u32>,
}

impl TestCluster {
    pub fn new() -> Self {
        Self::default()
    }

    fn event(&mut self, event: Event) {
        // Events built here are well-formed by construction; a failure would be a bug in this builder.
        if let Err(e) = self.cluster.apply_event(&event) {
            panic!("TestCluster built an invalid event {event:?}: {e}");
        }
    }

    /// Interns a string, returning its id.
    pub fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.interned.get(s) {
            return id;
        }
        let id = self.cluster.strings().len() as u32;
        self.interned.insert(s.to_string(), id);
        self.event(Event::StringsAdded(vec![s.to_string()]));
        id
    }

    fn model_bit(&mut self, model: &str) -> u64 {
        let id = self.intern(model);
        let slot = match self.cluster.gpu_models().iter().position(|&m| m == id) {
            Some(slot) => slot,
            None => {
                self.event(Event::GpuModelsAdded(vec![(id, REFERENCE_SPEED_PERMILLE)]));
                self.cluster.gpu_models().len() - 1
            }
        };
        1u64 << slot
    }

    /// Adds a node with `gpus` GPUs of one model; returns its index.
    #[allow(clippy::too_many_arguments)]
    pub fn node(
        &mut self,
        name: &str,
        pool: &str,
        cpu_milli: u32,
        memory_mib: u32,
        model: &str,
        gpu_memory_mib: u32,
        gpus: u32,
    ) -> u32 {
        self.model_bit(model);
        let spec = NodeSpec {
            name: self.intern(name),
            pool: self.intern(pool),
            cpu_milli,
            memory_mib,
            gpu_model: self.intern(model),
            gpu_memory_mib,
            gpu_count: gpus,
            on_loan: false,
            fabric: self.intern(""),
        };
        let index = self.cluster.node_count() as u32;
        self.event(Event::NodeAdded(spec));
        index
    }

    /// Adds a pending gang job of `workers` × `gpus_per_worker` whole GPUs
    /// (1 CPU, 1 GiB per worker); returns its index.
    pub fn job(&mut self, name: &str, tenant: &str, workers: u32, gpus_per_worker: u32) -> u32 {
        let spec = JobSpec {
            name: self.intern(name),
            tenant: self.intern(tenant),
            workers,
            min_workers: workers,
            max_workers: workers,
            cpu_milli: 1000,
            memory_mib: 1024,
            gpus_per_worker,
            gpu_milli: FULL_GPU_MILLI,
            submit_ms: self.cluster.job_count() as u64,
            group: self.intern(""),
            ..JobSpec::default()
        };
        self.job_spec(spec)
    }

    /// Adds a pending one-worker job of one GPU with this QoS, compute share
    /// (milli-GPU; 1000 = the whole GPU) and declared GPU memory (0 = by
    /// share); returns its index.
    pub fn job_on_one_gpu(
        &mut self,
        name: &str,
        tenant: &str,
        qos: u8,
        gpu_milli: u32,
        gpu_memory_mib: u32,
    ) -> u32 {
        let spec = JobSpec {
            name: self.intern(name),
            tenant: self.intern(tenant),
            qos,
            workers: 1,
            min_workers: 1,
            max_workers: 1,
            cpu_milli: 1000,
            memory_mib: 1024,
            gpus_per_worker: 1,
            gpu_milli,
            gpu_memory_mib,
            submit_ms: self.cluster.job_count() as u64,
            group: self.intern(""),
            ..JobSpec::default()
        };
        self.job_spec(spec)
    }

    /// Sets the operator's sharing rules.
    pub fn sharing(&mut self, rules: SharingRules) {
        self.event(Event::SharingChanged(rules));
    }

    /// Sets a tenant's GPU quota in milli-GPU (`None`: unlimited).
    pub fn quota(&mut self, tenant: &str, milli: Option<u64>) {
        let id = self.intern(tenant);
        self.event(match milli {
            Some(q) => Event::TenantQuotaChanged(id, q),
            None => Event::TenantQuotaRemoved(id),
        });
    }

    /// Publishes a GPU's health.
    pub fn health(&mut self, gpu: u32, health: u8) {
        self.event(Event::GpuHealthChanged(gpu, health));
    }

    /// A gang's spec: `workers` workers (no elasticity) of tenant "t",
    /// 1 CPU and 1 GiB each, no GPU; set the rest by struct update:
    /// `c.job_spec(JobSpec { gpus_per_worker: 2, ..c.gang_spec("j", 3) })`.
    pub fn gang_spec(&mut self, name: &str, workers: u32) -> JobSpec {
        JobSpec {
            name: self.intern(name),
            tenant: self.intern("t"),
            workers,
            min_workers: workers,
            max_workers: workers,
            cpu_milli: 1000,
            memory_mib: 1024,
            group: self.intern(""),
            ..JobSpec::default()
        }
    }

    /// For a placement policy with two ways to one answer (a node index and
    /// a scan): `rounds` rounds, each adding jobs with `add_jobs(self,
    /// round)` and asking `decide(self, indexed)` both ways; asserts the
    /// answers are equal (naming `label` and the round) and carries out the
    /// placements. Returns how many decisions were compared.
    pub fn same_answer_both_ways(
        &mut self,
        label: &str,
        rounds: u64,
        mut add_jobs: impl FnMut(&mut TestCluster, u64),
        decide: impl Fn(&TestCluster, bool) -> Vec<Decision>,
    ) -> usize {
        let mut compared = 0;
        for round in 0..rounds {
            add_jobs(self, round);
            let scan = decide(self, false);
            let indexed = decide(self, true);
            assert_eq!(scan, indexed, "{label}, round {round}");
            compared += scan.len();
            for d in scan {
                if let Decision::Place(job, workers) = d {
                    self.run(job, workers);
                }
            }
        }
        compared
    }

    /// Adds a job from a full spec; returns its index.
    pub fn job_spec(&mut self, spec: JobSpec) -> u32 {
        let index = self.cluster.job_count() as u32;
        self.event(Event::JobAdded(spec));
        index
    }

    /// Bit of `model` for a job's `gpu_model_mask`.
    pub fn model_mask(&mut self, models: &[&str]) -> u64 {
        models
            .iter()
            .map(|m| self.model_bit(m))
            .fold(0, |a, b| a | b)
    }

    /// Sets a GPU model's speed (permille of the reference), adding the model if new.
    pub fn model_speed(&mut self, model: &str, speed_permille: u32) {
        let slot = self.model_bit(model).trailing_zeros();
        self.event(Event::GpuModelSpeedChanged(slot, speed_permille));
    }

    /// Reports a job's progress, as the host would.
    pub fn progress(&mut self, progress: JobProgress) {
        self.event(Event::JobProgress(vec![progress]));
    }

    /// Moves the clock (and the epoch) forward.
    pub fn at(&mut self, now_ms: u64) {
        let epoch = self.cluster.epoch() + 1;
        self.cluster.set_epoch(epoch, now_ms);
    }

    /// Marks a job as running on these workers.
    pub fn run(&mut self, job: u32, workers: Vec<WorkerPlacement>) {
        self.event(Event::JobPlaced(job, workers));
    }

    /// Applies any event.
    pub fn apply(&mut self, event: Event) {
        self.event(event);
    }

    /// Reports GPU utilizations (`(gpu, percent)`), as a node's `gpu-metrics` would.
    pub fn utilization(&mut self, pct: &[(u32, u8)]) {
        self.event(Event::GpuMetrics(
            pct.iter()
                .map(|&(gpu, utilization_pct)| GpuMetric {
                    gpu,
                    utilization_pct,
                    ..GpuMetric::default()
                })
                .collect(),
        ));
    }

    /// The index of the job named `name` (panics if there is none: a test's typo).
    pub fn index_of(&self, name: &str) -> u32 {
        match self.cluster.jobs().find(|j| j.name() == name) {
            Some(j) => j.index(),
            None => panic!("no job {name}"),
        }
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    pub fn snapshot(&self) -> Snapshot {
        self.cluster.to_snapshot()
    }

    /// Round info at the cluster's epoch.
    pub fn round(&self, max_decisions: u32) -> RoundInfo {
        RoundInfo {
            epoch: self.cluster.epoch(),
            now_ms: self.cluster.now_ms(),
            max_decisions,
        }
    }

    /// One scheduling round of `policy` at `now_ms`, as the host runs it: the policy's
    /// decisions, each checked by a fresh [`Plan`] (a decision the host's validator would
    /// refuse panics, failing the test), then carried out as the host's events
    /// ([`TestCluster::carry_out`]). Returns the decisions.
    pub fn run_round<P: Policy>(&mut self, policy: &mut P, now_ms: u64) -> Vec<Decision> {
        self.at(now_ms);
        let decisions = match policy.schedule(&self.cluster, &self.round(1000)) {
            Ok(d) => d,
            Err(e) => panic!("the policy failed the round: {e:?}"),
        };
        let mut plan = Plan::new(&self.cluster);
        for d in &decisions {
            if let Err(e) = plan.apply(d.clone()) {
                panic!("{d:?} refused by the validator: {e}");
            }
        }
        self.carry_out(&decisions);
        decisions
    }

    /// Carries out validated decisions as the host does (`ClusterState::apply`): placement
    /// events, a start's progress (`started-ms`), evictions, reservations, QoS changes.
    pub fn carry_out(&mut self, decisions: &[Decision]) {
        let now = self.cluster.now_ms();
        for d in decisions {
            match d.clone() {
                Decision::Place(j, workers) | Decision::Migrate(j, workers) => {
                    let starting = self.cluster.job(j).phase() != job_phase::RUNNING;
                    self.event(Event::JobPlaced(j, workers));
                    if starting {
                        let p = self.cluster.job(j).progress();
                        self.progress(JobProgress {
                            started_ms: now.max(1),
                            ..p
                        });
                    }
                }
                Decision::ScaleOut(j, added) => {
                    let workers = self.cluster.job(j).placement_with(&added);
                    self.event(Event::JobPlaced(j, workers));
                }
                Decision::ScaleIn(j, positions) => {
                    let workers = self.cluster.job(j).placement_without(&positions);
                    self.event(Event::JobPlaced(j, workers));
                }
                Decision::Preempt(j) => {
                    self.event(Event::JobEvicted(j));
                    let p = self.cluster.job(j).progress();
                    self.progress(JobProgress { started_ms: 0, ..p });
                }
                Decision::Reserve(j, nodes) => self.event(Event::JobReserved(j, nodes)),
                Decision::Unreserve(j) => {
                    self.event(Event::JobReserved(j, Vec::new()));
                    self.event(Event::JobReservedGpus(j, Vec::new()));
                }
                Decision::ReserveGpus(j, gpus) => self.event(Event::JobReservedGpus(j, gpus)),
                Decision::SetQos(j, q) => self.event(Event::JobQosChanged(j, q)),
            }
        }
    }
}
