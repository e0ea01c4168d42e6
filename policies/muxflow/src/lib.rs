//! `muxflow`: MuxFlow's cluster half (Zhao et al., 2023, §4.3, §5, Alg. 1)
//! as a `matcher` policy. The node half is the `sysmonitor` coordinator.
//!
//! Each call pairs the request's offline jobs with its online jobs' GPUs:
//!
//! 1. **Slots.** Every *healthy* GPU (`gpu-columns.health` = 1; X10, §4.1)
//!    that a running online job of the request uses is one slot (a left
//!    node of the bipartite graph). The paper's online workload *is* its
//!    GPU; a multi-GPU online job gives one slot per healthy GPU (the host
//!    takes at most one offline job per (online job, GPU)). A GPU two online
//!    jobs share is one slot, named for the first of them in request order,
//!    with their SM activities summed (capped at 100 %).
//! 2. **DynamicSM** (Alg. 1 l. 5–6): the offline share on a slot is
//!    `100 − the online SM activity`, within `[dynamic_sm]` bounds.
//! 3. **Edge weights** (l. 7–8): the offline job's predicted normalised
//!    throughput at that share on that GPU model (`muxflow_core::predictor`,
//!    our linear model; the paper's MLP is unpublished). An edge exists only
//!    where the placement would pass the host's checks now (model mask,
//!    node ready, the sharing rules' shared-milli, worker and memory caps,
//!    host CPU and memory) and the prediction exceeds `min_throughput`.
//! 4. **KM** (l. 9–10): the maximum-weight matching; each matched edge
//!    becomes a `pairing { online, offline, gpu, sm-percent }`. The pairings
//!    are re-checked in order as one plan (as the host will) and any that
//!    would not pass is dropped, so the answer is never a fault.
//!
//! A job without a profile in the request counts as fully busy (100 %
//! utilization and SM activity) on either side. With sharing off
//! (`oversub-milli` = 0) offline jobs are charged as guaranteed and no
//! occupied GPU admits them: the matcher then pairs nothing.
//!
//! Configuration (TOML, unknown keys refused): [`DEFAULT_CONFIG`].

use arbiter_policy_sdk::prelude::*;
use muxflow_core::{
    EdgeFeatures, Predictor, PredictorConfig, Profile, SmBounds, WeightMatrix, dynamic_sm,
    max_weight_matching,
};
use serde::Deserialize;
use std::collections::BTreeMap;

pub use muxflow_core;

/// The default configuration, as returned in the manifest. Parses to [`Config::default`].
pub const DEFAULT_CONFIG: &str = r#"# muxflow: MuxFlow's matcher (KM over predicted normalised throughput, dynamic SM).

# Edges whose predicted normalised throughput is at or below this never pair
# (ours: 0, the paper pairs any positive edge).
min_throughput = 0.0
# Added to the weight of keeping a running offline job on the GPU it already
# shares, to damp checkpoint/restart migrations between rounds (ours: 0, the
# paper reschedules globally with no such term).
stay_bonus = 0.0

[dynamic_sm]
# §4.3: the offline SM % is 100 - the online SM activity. The bounds and the
# headroom are ours (the paper gives none).
min_pct = 10
max_pct = 90
headroom_pct = 0

[predictor]
# Linear model P = clamp(w . phi, 0, 1) with
# phi = [1, r, r*u_on*u_off, r*occ_on, r*sm_on], r = min(1, sm% / sm_off):
# the default is P = r * (1 - 0.5 * u_on * u_off) (ours; see muxflow-core's
# predictor docs). Per-GPU-model weights (the paper trains one MLP per GPU
# type) go in [predictor.per_model], e.g. T4 = [0.0, 1.0, -0.5, 0.0, 0.0].
weights = [0.0, 1.0, -0.5, 0.0, 0.0]

[predictor.per_model]
"#;

/// The whole configuration (see [`DEFAULT_CONFIG`]).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub min_throughput: f64,
    pub stay_bonus: f64,
    pub dynamic_sm: SmBounds,
    pub predictor: PredictorConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            min_throughput: 0.0,
            stay_bonus: 0.0,
            dynamic_sm: SmBounds::default(),
            predictor: PredictorConfig::default(),
        }
    }
}

impl Config {
    /// Parses and checks a configuration document.
    pub fn parse(text: &str) -> Result<Config, String> {
        let cfg: Config = toml::from_str(text).map_err(|e| format!("bad configuration: {e}"))?;
        cfg.dynamic_sm.validate()?;
        if !(cfg.min_throughput.is_finite() && (0.0..1.0).contains(&cfg.min_throughput)) {
            return Err("`min_throughput` must be in [0, 1)".into());
        }
        if !(cfg.stay_bonus.is_finite() && cfg.stay_bonus >= 0.0) {
            return Err("`stay_bonus` must be a non-negative number".into());
        }
        Predictor::from_config(&cfg.predictor)?;
        Ok(cfg)
    }
}

/// The policy.
#[derive(Clone, Debug, Default)]
pub struct MuxFlow {
    cfg: Config,
    predictor: Predictor,
}

impl MuxFlow {
    pub fn config(&self) -> &Config {
        &self.cfg
    }
}

/// One left node: a healthy GPU of an online job.
struct Slot {
    gpu: u32,
    node: u32,
    online: u32,
    profile: Profile,
}

fn profile_of(p: Option<&WorkloadProfile>) -> Profile {
    match p {
        Some(p) => Profile {
            utilization_pct: p.utilization_pct.min(100),
            sm_activity_pct: p.sm_activity_pct.min(100),
            sm_occupancy_pct: p.sm_occupancy_pct.min(100),
            solo_iteration_ms: p.solo_iteration_ms,
        },
        // No profile: fully busy (module doc).
        None => Profile {
            utilization_pct: 100,
            sm_activity_pct: 100,
            sm_occupancy_pct: 0,
            solo_iteration_ms: 0,
        },
    }
}

/// Request job indices, deduplicated in order, that exist in the mirror.
/// A memoised per-(node, job) answer in `memo[at]` (0 unknown, 1 yes, 2 no).
fn node_open(memo: &mut [u8], at: usize, ask: impl FnOnce() -> bool) -> bool {
    match memo.get(at).copied() {
        Some(1) => true,
        Some(2) => false,
        _ => {
            let yes = ask();
            if let Some(m) = memo.get_mut(at) {
                *m = if yes { 1 } else { 2 };
            }
            yes
        }
    }
}

fn candidates(cluster: &Cluster, jobs: &[u32]) -> Vec<u32> {
    let mut seen = std::collections::BTreeSet::new();
    jobs.iter()
        .copied()
        .filter(|&j| (j as usize) < cluster.job_count() && seen.insert(j))
        .collect()
}

impl Policy for MuxFlow {
    fn manifest() -> Manifest {
        let mut m = manifest(
            "muxflow",
            env!("CARGO_PKG_VERSION"),
            &[Role::Matcher],
            "MuxFlow matcher: offline jobs onto online jobs' healthy GPUs by KM maximum-weight \
             matching over predicted normalised throughput, with dynamic SM shares.",
        );
        m.default_config = DEFAULT_CONFIG.into();
        m
    }

    fn create() -> Self {
        MuxFlow::default()
    }

    fn configure(&mut self, config: &str) -> Result<(), PolicyError> {
        let cfg = Config::parse(config).map_err(PolicyError::Failed)?;
        self.predictor = Predictor::from_config(&cfg.predictor).map_err(PolicyError::Failed)?;
        self.cfg = cfg;
        Ok(())
    }

    fn match_workloads(
        &mut self,
        cluster: &Cluster,
        request: &MatchRequest,
    ) -> Result<Vec<Pairing>, PolicyError> {
        let mut profiles: BTreeMap<u32, &WorkloadProfile> = BTreeMap::new();
        for p in &request.profiles {
            profiles.entry(p.job).or_insert(p);
        }
        let profile = |job: u32| profile_of(profiles.get(&job).copied());

        // 1. Slots: healthy GPUs of running online jobs.
        let mut slots: Vec<Slot> = Vec::new();
        let mut slot_of_gpu: BTreeMap<u32, usize> = BTreeMap::new();
        for on in candidates(cluster, &request.online) {
            let job = cluster.job(on);
            if !job.is_running() {
                continue;
            }
            let p = profile(on);
            for w in job.placement() {
                for &g in &w.gpus {
                    if (g as usize) >= cluster.gpu_count() || !cluster.gpu(g).is_healthy() {
                        continue;
                    }
                    match slot_of_gpu.get(&g) {
                        Some(&s) => {
                            let q = &mut slots[s].profile;
                            q.sm_activity_pct =
                                q.sm_activity_pct.saturating_add(p.sm_activity_pct).min(100);
                            q.utilization_pct = q.utilization_pct.max(p.utilization_pct);
                            q.sm_occupancy_pct = q.sm_occupancy_pct.max(p.sm_occupancy_pct);
                        }
                        None => {
                            slot_of_gpu.insert(g, slots.len());
                            slots.push(Slot {
                                gpu: g,
                                node: w.node,
                                online: on,
                                profile: p,
                            });
                        }
                    }
                }
            }
        }
        // Offline candidates: one worker on one GPU (the host refuses others).
        let offline: Vec<u32> = candidates(cluster, &request.offline)
            .into_iter()
            .filter(|&j| {
                let job = cluster.job(j);
                job.workers() == 1 && job.gpus_per_worker() == 1
            })
            .collect();
        if slots.is_empty() || offline.is_empty() {
            return Ok(Vec::new());
        }

        // 2–3. DynamicSM and predicted edge weights.
        let plan = Plan::new(cluster);
        let shares: Vec<u8> = slots
            .iter()
            .map(|s| dynamic_sm(s.profile.sm_activity_pct, &self.cfg.dynamic_sm))
            .collect();
        // Per offline job, once (the matrix has slots × jobs cells): its profile, the GPU it
        // runs on alone (if so: "stays" there), and the nodes it may go to (readiness, host
        // CPU and memory are per node, not per GPU).
        let off_profile: Vec<Profile> = offline.iter().map(|&off| profile(off)).collect();
        let runs_on: Vec<Option<u32>> = offline
            .iter()
            .map(|&off| {
                let j = cluster.job(off);
                match j.placement() {
                    [w] if j.is_running() && w.gpus.len() == 1 => Some(w.gpus[0]),
                    _ => None,
                }
            })
            .collect();
        // (node, job) → 0 unknown, 1 open, 2 closed.
        let mut node_ok = vec![0u8; cluster.node_count() * offline.len()];
        let stays = |c: usize, slot: &Slot| runs_on[c] == Some(slot.gpu);
        let mut weights = WeightMatrix::new(slots.len(), offline.len());
        for (r, slot) in slots.iter().enumerate() {
            let model = self.predictor.model(cluster.gpu(slot.gpu).model());
            for (c, &off) in offline.iter().enumerate() {
                let stay = stays(c, slot);
                let feasible = stay
                    || (node_open(&mut node_ok, slot.node as usize * offline.len() + c, || {
                        plan.node_open_for(off, slot.node)
                            && plan.host_resources_fit(off, slot.node)
                    }) && plan.gpu_fits(off, slot.gpu));
                if !feasible {
                    continue;
                }
                let x = EdgeFeatures {
                    online: slot.profile,
                    offline: off_profile[c],
                    sm_pct: shares[r],
                };
                let mut w = model.predict(&x);
                if w <= self.cfg.min_throughput {
                    continue;
                }
                if stay {
                    w += self.cfg.stay_bonus;
                }
                weights.set(r, c, w);
            }
        }

        // 4. KM, then the host's own check of the whole answer as one plan.
        let matching = max_weight_matching(&weights);
        let mut check = Plan::new(cluster);
        let mut pairings = Vec::with_capacity(matching.pairs.len());
        for (r, c) in matching.pairs {
            let (slot, off) = (&slots[r], offline[c]);
            if !stays(c, slot) {
                let worker = vec![WorkerPlacement {
                    node: slot.node,
                    gpus: vec![slot.gpu],
                }];
                let decision = if cluster.job(off).is_running() {
                    Decision::Migrate(off, worker)
                } else {
                    Decision::Place(off, worker)
                };
                if let Err(e) = check.apply(decision) {
                    log(
                        LogLevel::Debug,
                        &format!(
                            "muxflow: dropped pairing of job {off} on GPU {}: {e:?}",
                            slot.gpu
                        ),
                    );
                    continue;
                }
            }
            pairings.push(Pairing {
                online: slot.online,
                offline: off,
                gpu: slot.gpu,
                sm_percent: shares[r],
            });
        }
        Ok(pairings)
    }
}

arbiter_policy_sdk::export_policy!(MuxFlow);

#[cfg(test)]
mod tests;
