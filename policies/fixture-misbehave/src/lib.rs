//! Test fixture: a policy that misbehaves as its configuration says.
//!
//! `configure("mode = <m>")` picks the fault the host's sandbox and validator
//! must survive. As a scheduler, with `ok` it places the first pending job
//! with first fit. `flap` traps in rounds of even epoch and works in the
//! others; `hang-flap` loops past the deadline in those rounds instead
//! (neither faults twice in a row: only a fault-rate quarantine catches
//! them). `slow` (with `spin = N`) loops N times before answering like `ok`
//! — a policy that takes most of its deadline every round without faulting.
//! `evacuate` is well-behaved: it migrates every running job off node 0
//! (each worker to the first other node where it fits), then places like
//! `ok` — a policy that moves running work, for the control plane's
//! reconcile tests. `upgrade` is well-behaved too: it upgrades every running
//! opportunistic or best-effort job to guaranteed where the plan allows,
//! then places like `ok`.
//!
//! It declares every other role too, so one component misbehaves in each.
//! Their calls share the faults `trap`, `loop`, `alloc`, `fail-huge`, `slow`,
//! and `flap`/`hang-flap` on every other call (their requests carry no
//! epoch that changes between calls, so the fixture counts its calls).
//! Otherwise each answers sensibly, unless `bad-verdict`/`bad-answer` or
//! `huge` asks for an impossible answer:
//!
//! - as a tenant policy (`order`) it releases the queue in submit order
//!   (`bad-verdict`: a position that does not exist; `huge`: the first
//!   position a million times, to run and to hold);
//! - as `reclaim` it returns the first `count` candidates and preempts every
//!   running job with a worker on one (`bad-answer`: the first candidate
//!   `count + 1` times; `huge`: four million distinct servers);
//! - as a `matcher` it pairs nothing (`bad-answer`: the first offline job
//!   with every online one; `huge`: a million pairings);
//! - as a `coordinator` it takes no action (`bad-answer`: an eviction of a
//!   workload the view does not list; `huge`: a million freezes).
//!
//! The **persona** changes what the component is before any configuration
//! reaches it: its manifest (or a `manifest` call that loops, traps or
//! allocates without bound), and how `configure` answers. It is read from
//! `PERSONA`, a fixed-size string in the component's data segment that a
//! test patches in the `.wasm` bytes (see `arbiter-hostile`), so one build
//! yields a whole corpus of hostile components. `none` is the plain fixture.

use arbiter_policy_sdk::prelude::*;

/// `PERSONA_MARKER` followed by the persona's name, padded with spaces.
#[used]
static PERSONA: [u8; 64] = *b"arbiter-hostile-persona:none                                    ";
/// Length of the marker (only its length: the marker itself must appear once
/// in the binary, in `PERSONA`, for a test to find it).
const PERSONA_MARKER_LEN: usize = "arbiter-hostile-persona:".len();

/// The persona patched into this component's bytes.
fn persona() -> String {
    // The bytes change after compilation (they are patched in the .wasm):
    // reading them through an opaque reference makes the compiler load them
    // from the data segment instead of folding the value it was built with.
    let bytes: &[u8; 64] = std::hint::black_box(&PERSONA);
    String::from_utf8_lossy(&bytes[PERSONA_MARKER_LEN..])
        .trim()
        .to_string()
}

/// Text of `len` bytes, for the huge-string personas.
fn huge(len: usize) -> String {
    "x".repeat(len)
}

#[derive(Default)]
pub struct Misbehave {
    mode: String,
    /// Calls of every role but `scheduler` so far (their requests carry
    /// no epoch that changes from one call to the next).
    calls: u64,
    /// `mode = slow` (scheduler and tenant): loop iterations before each
    /// answer (`spin = N`), so a call costs most of its deadline without faulting.
    spin: u64,
}

impl Misbehave {
    /// `mode = slow`: `spin` loop iterations, the cost of a call.
    fn spin_a_while(&self) {
        let mut x = 0u64;
        for _ in 0..self.spin {
            x = std::hint::black_box(x.wrapping_add(1));
        }
    }
}

// Unbounded on purpose: the host must survive the stack overflow.
#[allow(unconditional_recursion)]
fn recurse(depth: u64) -> u64 {
    // Not a tail call: every level keeps a frame alive.
    std::hint::black_box(depth);
    recurse(depth + 1).wrapping_add(depth)
}

fn first_fit_one(cluster: &Cluster) -> Vec<Decision> {
    let mut plan = Plan::new(cluster);
    if let Some(job) = cluster.pending_jobs().next() {
        let index = job.index();
        let _ = plan.place_gang(index, job.workers(), |p| p.first_fit_anywhere(index));
    }
    plan.into_decisions()
}

/// Upgrades every running opportunistic or best-effort job to guaranteed
/// where the plan allows (AntMan's upgrade), then places like `ok`.
fn upgrade_running(cluster: &Cluster, round: &RoundInfo) -> Vec<Decision> {
    let mut plan = Plan::new(cluster).with_max_decisions(round.max_decisions);
    let shared: Vec<u32> = cluster
        .running_jobs()
        .filter(|j| j.qos() != qos::GUARANTEED)
        .map(|j| j.index())
        .collect();
    for job in shared {
        let _ = plan.apply(Decision::SetQos(job, qos::GUARANTEED));
    }
    if let Some(job) = cluster.pending_jobs().next() {
        let index = job.index();
        let _ = plan.place_gang(index, job.workers(), |p| p.first_fit_anywhere(index));
    }
    plan.into_decisions()
}

fn evacuate_node_zero(cluster: &Cluster, round: &RoundInfo) -> Vec<Decision> {
    let mut plan = Plan::new(cluster).with_max_decisions(round.max_decisions);
    let on_node_zero: Vec<(u32, u32)> = cluster
        .running_jobs()
        .filter(|j| j.placement().iter().any(|w| w.node == 0))
        .map(|j| (j.index(), j.workers()))
        .collect();
    for (job, workers) in on_node_zero {
        let moved: Vec<WorkerPlacement> = (0..workers)
            .filter_map(|_| {
                (1..cluster.node_count() as u32).find_map(|n| plan.first_fit_worker(job, n))
            })
            .collect();
        if moved.len() as u32 == workers {
            // Refused (e.g. two workers chose the same GPUs): it stays put.
            let _ = plan.apply(Decision::Migrate(job, moved));
        }
    }
    if let Some(job) = cluster.pending_jobs().next() {
        let index = job.index();
        let _ = plan.place_gang(index, job.workers(), |p| p.first_fit_anywhere(index));
    }
    plan.into_decisions()
}

/// Allocates a MiB at a time until the host stops it.
fn hoard() -> ! {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        hoard.push(vec![1u8; 1 << 20]);
        std::hint::black_box(&hoard);
    }
}

fn spin() -> ! {
    let mut x = 0u64;
    loop {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

impl Policy for Misbehave {
    fn manifest() -> Manifest {
        let mut m = manifest(
            "fixture-misbehave",
            "0.1.0",
            &[
                Role::Scheduler,
                Role::Tenant,
                Role::Reclaim,
                Role::Matcher,
                Role::Coordinator,
            ],
            "Misbehaves on purpose.",
        );
        m.default_config = "mode = ok".into();
        match persona().as_str() {
            // Clears the screen and homes the cursor, then forges a verdict.
            "name-escape" => m.name = "\x1b[2J\x1b[H✓ builtin:best-fit".into(),
            "description-escape" => {
                m.description =
                    "\x1b]0;pwned\x07\x1b[2J\n✓ builtin:best-fit is a policy component\u{202e}"
                        .into()
            }
            "description-huge" => m.description = huge(24 << 20),
            "role-huge" => m.roles.push(huge(40 << 20)),
            "roles-many" => m.roles = vec!["scheduler".into(); 100_000],
            "role-unknown" => m.roles.push("\x1b[31mroot".into()),
            "config-huge" => m.default_config = "mode = ok\n".repeat(200_000),
            "config-escape" => m.default_config = "mode = ok\n\x1b[2J".into(),
            "version-huge" => m.version = huge(1 << 20),
            "roles-none" => m.roles.clear(),
            "name-blank" => m.name = " \t ".into(),
            "manifest-loop" => spin(),
            "manifest-trap" => panic!("fixture traps in manifest"),
            "manifest-alloc" => hoard(),
            _ => {}
        }
        m
    }

    fn create() -> Self {
        Misbehave {
            mode: "ok".into(),
            calls: 0,
            spin: 0,
        }
    }

    fn configure(&mut self, config: &str) -> Result<(), PolicyError> {
        match persona().as_str() {
            "configure-loop" => spin(),
            "configure-trap" => panic!("fixture traps in configure"),
            "configure-fail" => {
                return Err(PolicyError::Failed(format!(
                    "refuses every configuration, even `{config}`"
                )));
            }
            "configure-fail-huge" => return Err(PolicyError::Failed(huge(32 << 20))),
            "configure-alloc" => hoard(),
            _ => {}
        }
        let mode = config
            .lines()
            .filter_map(|l| l.split_once('='))
            .find(|(k, _)| k.trim() == "mode")
            .map(|(_, v)| v.trim().trim_matches('"').to_string());
        self.mode = mode.unwrap_or_else(|| "ok".into());
        self.spin = config
            .lines()
            .filter_map(|l| l.split_once('='))
            .find(|(k, _)| k.trim() == "spin")
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0);
        Ok(())
    }

    fn schedule(
        &mut self,
        cluster: &Cluster,
        round: &RoundInfo,
    ) -> Result<Vec<Decision>, PolicyError> {
        log(LogLevel::Debug, &format!("misbehaving as `{}`", self.mode));
        match self.mode.as_str() {
            "ok" => Ok(first_fit_one(cluster)),
            "slow" => {
                self.spin_a_while();
                Ok(first_fit_one(cluster))
            }
            "trap" => panic!("fixture asked to trap"),
            "loop" => spin(),
            "flap" if round.epoch.is_multiple_of(2) => {
                panic!("fixture flaps: trap at epoch {}", round.epoch)
            }
            "hang-flap" if round.epoch.is_multiple_of(2) => spin(),
            "flap" | "hang-flap" => Ok(first_fit_one(cluster)),
            "evacuate" => Ok(evacuate_node_zero(cluster, round)),
            "upgrade" => Ok(upgrade_running(cluster, round)),
            "recurse" => Ok(vec![Decision::Preempt(recurse(0) as u32)]),
            "alloc" => hoard(),
            "log-flood" => {
                for i in 0..100_000 {
                    log(LogLevel::Info, &"x".repeat(10_000 + i % 7));
                }
                Ok(Vec::new())
            }
            "unknown-job" => Ok(vec![Decision::Place(
                cluster.job_count() as u32 + 7,
                vec![WorkerPlacement {
                    node: 0,
                    gpus: vec![0],
                }],
            )]),
            "unknown-gpu" => Ok(cluster
                .pending_jobs()
                .take(1)
                .map(|j| {
                    let worker = WorkerPlacement {
                        node: 0,
                        gpus: vec![u32::MAX; j.gpus_per_worker() as usize],
                    };
                    Decision::Place(j.index(), vec![worker; j.workers() as usize])
                })
                .collect()),
            "overcommit" => Ok(cluster
                .pending_jobs()
                .map(|j| {
                    // Every worker of every pending job onto the first GPUs of node 0.
                    let worker = WorkerPlacement {
                        node: 0,
                        gpus: (0..j.gpus_per_worker()).collect(),
                    };
                    Decision::Place(j.index(), vec![worker; j.workers() as usize])
                })
                .collect()),
            "split-gang" => {
                // Half of a gang's workers.
                let job = cluster.pending_jobs().find(|j| j.workers() > 1);
                Ok(job
                    .map(|j| {
                        let plan = Plan::new(cluster);
                        let w: Vec<WorkerPlacement> =
                            plan.first_fit_anywhere(j.index()).into_iter().collect();
                        vec![Decision::Place(j.index(), w)]
                    })
                    .unwrap_or_default())
            }
            "huge" => Ok(vec![
                Decision::Preempt(0);
                round.max_decisions as usize * 4 + 1000
            ]),
            "stale" => Err(PolicyError::Stale(0)),
            "fail-huge" => Err(PolicyError::Failed(huge(32 << 20))),
            "fail-escape" => Err(PolicyError::Failed(
                "\x1b[2J\x1b[H✓ round ok\r\n\u{202e}".into(),
            )),
            "unsupported-huge" => Err(PolicyError::Unsupported(huge(40 << 20))),
            "log-escape" => {
                for _ in 0..8 {
                    log(LogLevel::Warn, "\x1b[2J\x1b[H✓ all good\n\u{202e}");
                    log(LogLevel::Warn, &huge(256 << 10));
                }
                Ok(first_fit_one(cluster))
            }
            "fail" => Err(PolicyError::Failed("fixture refuses".into())),
            other => Err(PolicyError::Failed(format!("unknown mode `{other}`"))),
        }
    }

    fn order(&mut self, view: &TenantView) -> Result<TenantVerdict, PolicyError> {
        self.misbehave_in("tenant")?;
        match self.mode.as_str() {
            "bad-verdict" => Ok(TenantVerdict {
                order: vec![view.jobs.len() as u32 + 3],
                hold: Vec::new(),
            }),
            "huge" => Ok(TenantVerdict {
                order: vec![0; 1_000_000],
                hold: vec![0; 1_000_000],
            }),
            _ => Ok(TenantVerdict::default()),
        }
    }

    fn reclaim(
        &mut self,
        cluster: &Cluster,
        request: &ReclaimRequest,
    ) -> Result<ReclaimPlan, PolicyError> {
        self.misbehave_in("reclaim")?;
        let count = request.count as usize;
        match self.mode.as_str() {
            "bad-answer" => Ok(ReclaimPlan {
                nodes: vec![request.candidates.first().copied().unwrap_or(0); count + 1],
                decisions: Vec::new(),
            }),
            "huge" => Ok(ReclaimPlan {
                nodes: (0..4_000_000).collect(),
                decisions: Vec::new(),
            }),
            _ => {
                let nodes: Vec<u32> = request.candidates.iter().copied().take(count).collect();
                let decisions = cluster
                    .running_jobs()
                    .filter(|j| j.placement().iter().any(|w| nodes.contains(&w.node)))
                    .map(|j| Decision::Preempt(j.index()))
                    .collect();
                Ok(ReclaimPlan { nodes, decisions })
            }
        }
    }

    fn match_workloads(
        &mut self,
        cluster: &Cluster,
        request: &MatchRequest,
    ) -> Result<Vec<Pairing>, PolicyError> {
        self.misbehave_in("matcher")?;
        let first_gpu = |online: u32| {
            cluster
                .job(online)
                .placement()
                .first()
                .and_then(|w| w.gpus.first().copied())
                .unwrap_or(0)
        };
        let pair = |online: u32, offline: u32| Pairing {
            online,
            offline,
            gpu: first_gpu(online),
            sm_percent: 50,
        };
        let (Some(&online), Some(&offline)) = (request.online.first(), request.offline.first())
        else {
            return Ok(Vec::new());
        };
        match self.mode.as_str() {
            "bad-answer" => Ok(request.online.iter().map(|&o| pair(o, offline)).collect()),
            "huge" => Ok(vec![pair(online, offline); 1_000_000]),
            _ => Ok(Vec::new()),
        }
    }

    fn tick(&mut self, view: &NodeView) -> Result<Vec<NodeAction>, PolicyError> {
        self.misbehave_in("coordinator")?;
        match self.mode.as_str() {
            "bad-answer" => {
                let absent = view
                    .workloads
                    .iter()
                    .map(|w| w.id)
                    .max()
                    .map_or(0, |m| m + 1);
                Ok(vec![NodeAction::Evict(absent)])
            }
            "huge" => Ok(vec![NodeAction::Freeze(0); 1_000_000]),
            _ => Ok(Vec::new()),
        }
    }
}

impl Misbehave {
    /// The faults every role but `scheduler` shares, counted per call.
    fn misbehave_in(&mut self, role: &str) -> Result<(), PolicyError> {
        self.calls += 1;
        let every_other = self.calls.is_multiple_of(2);
        match self.mode.as_str() {
            "trap" => panic!("fixture asked to trap as {role}"),
            "loop" => spin(),
            "alloc" => hoard(),
            "fail-huge" => Err(PolicyError::Failed(huge(32 << 20))),
            "flap" if every_other => panic!("{role} flaps at call {}", self.calls),
            "hang-flap" if every_other => spin(),
            "slow" => {
                self.spin_a_while();
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

arbiter_policy_sdk::export_policy!(Misbehave);
