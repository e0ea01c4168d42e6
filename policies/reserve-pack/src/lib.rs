//! `reserve-pack`: reserving-and-packing, "MLaaS in the Wild" (NSDI '22,
//! §6.3). High-end machines are kept for high-GPU tasks, the rest of the
//! work is packed onto the other machines first.
//!
//! Each job follows an ordered allocation plan: a list of tiers of GPU
//! models. A job may use the first tier at once; each `attempt_timeout_s` it
//! has waited opens the next one (an attempt timeout). Among the open tiers
//! it takes the earliest tier where it fits, and within it the node its
//! placement leaves with the least free GPU capacity (packing). High-GPU
//! jobs follow `high_plan` (default: V100, then V100M32, then anything),
//! the others `low_plan` (default: T4, P100 and MISC, then V100M32, then
//! V100 — high-end machines last).
//!
//! Which jobs are high-GPU comes from what a job states, since the paper's
//! features (parallelism, model, embedding size) are not in the contract: a
//! job whose workers each ask for `high_gpu_min_gpus` whole GPUs or more —
//! GPUs that must sit in one machine, the paper's GPU-locality request
//! (§3.1, §6.1) — or (if set) with priority at least `high_gpu_priority`.
//! A gang of many small or fractional workers is not high-GPU: it needs
//! neither whole high-end GPUs nor their interconnect. The defaults — 8
//! GPUs, a 300 s timeout — are ours; the paper gives none.

use arbiter_policy_sdk::node_order::NodeOrder;
use arbiter_policy_sdk::prelude::*;

pub struct ReservePack {
    high_gpu_min_gpus: u32,
    high_gpu_priority: Option<i32>,
    timeout_ms: u64,
    high_plan: Vec<Vec<String>>,
    low_plan: Vec<Vec<String>>,
}

const DEFAULT_CONFIG: &str = r#"high_gpu_min_gpus = 8
attempt_timeout_s = 300
high_plan = [["V100"], ["V100M32"], ["*"]]
low_plan = [["T4", "P100", "MISC"], ["V100M32"], ["V100"]]
"#;

/// Tier of a node's model in a plan (`NONE`: in no tier).
const NONE: u8 = u8::MAX;

fn tier_of(plan: &[Vec<String>], model: &str) -> u8 {
    plan.iter()
        .position(|tier| tier.iter().any(|m| m == "*" || m == model))
        .map_or(NONE, |t| t.min(usize::from(NONE - 1)) as u8)
}

fn parse_plan(table: &toml::Table, key: &str) -> Result<Option<Vec<Vec<String>>>, PolicyError> {
    let bad = || PolicyError::Failed(format!("`{key}` must be a list of lists of model names"));
    let Some(value) = table.get(key) else {
        return Ok(None);
    };
    let tiers = value.as_array().ok_or_else(bad)?;
    let plan = tiers
        .iter()
        .map(|tier| {
            tier.as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|m| m.as_str().map(str::to_string).ok_or_else(bad))
                .collect::<Result<Vec<String>, PolicyError>>()
        })
        .collect::<Result<Vec<_>, _>>()?;
    if plan.is_empty() || plan.len() >= usize::from(NONE) {
        return Err(bad());
    }
    Ok(Some(plan))
}

impl ReservePack {
    fn is_high_gpu(&self, job: &Job<'_>) -> bool {
        (!job.is_fractional() && job.gpus_per_worker() >= self.high_gpu_min_gpus)
            || self.high_gpu_priority.is_some_and(|p| job.priority() >= p)
    }

    /// Tiers open to a job that has waited `waited_ms`.
    fn open_tiers(&self, waited_ms: u64) -> u8 {
        let opened = waited_ms.checked_div(self.timeout_ms).unwrap_or(u64::MAX);
        opened.min(u64::from(NONE - 1)) as u8
    }
}

impl Policy for ReservePack {
    fn manifest() -> Manifest {
        let mut m = manifest(
            "reserve-pack",
            env!("CARGO_PKG_VERSION"),
            &[Role::Scheduler],
            "Reserving-and-packing: high-end GPUs kept for high-GPU jobs, the rest packed elsewhere first.",
        );
        m.default_config = DEFAULT_CONFIG.into();
        m
    }

    fn create() -> Self {
        let tiers = |t: &[&[&str]]| {
            t.iter()
                .map(|tier| tier.iter().map(|m| m.to_string()).collect())
                .collect()
        };
        ReservePack {
            high_gpu_min_gpus: 8,
            high_gpu_priority: None,
            timeout_ms: 300_000,
            high_plan: tiers(&[&["V100"], &["V100M32"], &["*"]]),
            low_plan: tiers(&[&["T4", "P100", "MISC"], &["V100M32"], &["V100"]]),
        }
    }

    fn configure(&mut self, config: &str) -> Result<(), PolicyError> {
        let table: toml::Table = config
            .parse()
            .map_err(|e| PolicyError::Failed(format!("bad configuration: {e}")))?;
        if let Some(v) = table.get("high_gpu_min_gpus") {
            self.high_gpu_min_gpus = v
                .as_integer()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| {
                    PolicyError::Failed("`high_gpu_min_gpus` must be positive".into())
                })?;
        }
        if let Some(v) = table.get("high_gpu_priority") {
            self.high_gpu_priority = Some(
                v.as_integer()
                    .and_then(|n| i32::try_from(n).ok())
                    .ok_or_else(|| {
                        PolicyError::Failed("`high_gpu_priority` must be an i32".into())
                    })?,
            );
        }
        if let Some(v) = table.get("attempt_timeout_s") {
            let s = v.as_integer().filter(|&n| n > 0).ok_or_else(|| {
                PolicyError::Failed("`attempt_timeout_s` must be positive".into())
            })?;
            self.timeout_ms = (s as u64).saturating_mul(1000);
        }
        if let Some(plan) = parse_plan(&table, "high_plan")? {
            self.high_plan = plan;
        }
        if let Some(plan) = parse_plan(&table, "low_plan")? {
            self.low_plan = plan;
        }
        Ok(())
    }

    fn schedule(
        &mut self,
        cluster: &Cluster,
        round: &RoundInfo,
    ) -> Result<Vec<Decision>, PolicyError> {
        Ok(self.plan_round(cluster, round, None))
    }
}

/// Below this many pending jobs a round scans every node per worker; above
/// it, it walks a [`NodeOrder`] per plan (built on first use). Both answer
/// the same.
const INDEX_FROM_PENDING: usize = 16;

/// Free milli-GPU fields of a node key: 24 bits (16,777 GPUs' worth; more
/// is held at the cap, and ties go to the lower index).
const MILLI_BITS: u32 = 24;
const MILLI_CAP: u64 = (1 << MILLI_BITS) - 1;

/// A node's place in a plan's order, as one 64-bit integer that sorts like
/// the tuple (tier, free milli-GPU, node index): earliest tier first, then
/// the fullest node (packing), then the lower index. 64 bits, not the SDK's
/// default 128: the tier takes 8, so the order fits, and the round's sorts
/// and walks compare one word instead of two.
fn order_key(tiers: &[u8], plan: &Plan<'_>, node: u32) -> u64 {
    (u64::from(tiers[node as usize]) << (32 + MILLI_BITS))
        | (u64::from(plan.node_free_milli(node)).min(MILLI_CAP) << 32)
        | u64::from(node)
}

/// The first node in `order` (of `tiers`) among the first `open + 1` tiers
/// where one worker of `fit` fits: tier by tier, starting each at the nodes
/// with at least the worker's GPU capacity free.
fn first_in_open_tiers(
    order: &mut NodeOrder<u64>,
    tiers: &[u8],
    tier_count: usize,
    plan: &Plan<'_>,
    fit: &JobFit,
    open: u8,
) -> Option<u32> {
    let per_gpu = if fit.fractional_milli > 0 {
        fit.fractional_milli
    } else {
        FULL_GPU_MILLI
    };
    let need = u64::from(per_gpu.saturating_mul(fit.gpus)).min(MILLI_CAP);
    let last = usize::from(open).min(tier_count.saturating_sub(1)) as u64;
    let tier = |t: u64| t << (32 + MILLI_BITS);
    (0..=last).find_map(|t| {
        order.first_fit(plan, fit, (tier(t) | need << 32)..tier(t + 1), |n| {
            order_key(tiers, plan, n)
        })
    })
}

/// The node a scan of every node picks: the least (tier, free milli-GPU,
/// node) among the fitting nodes of the open tiers.
fn first_by_scan(tiers: &[u8], plan: &Plan<'_>, fit: &JobFit, open: u8) -> Option<u32> {
    let mut best: Option<(u8, u32, u32)> = None;
    plan.each_fitting_node(fit, |node| {
        let tier = tiers[node as usize];
        if tier > open {
            return;
        }
        let key = (tier, plan.node_free_milli(node), node);
        if best.is_none_or(|b| key < b) {
            best = Some(key);
        }
    });
    best.map(|(_, _, node)| node)
}

impl ReservePack {
    /// One round: pending jobs in arrival order, each worker on the first
    /// node of its plan's open tiers. `indexed` forces the node orders on or
    /// off (tests); `None` chooses by the number of pending jobs.
    fn plan_round(
        &self,
        cluster: &Cluster,
        round: &RoundInfo,
        indexed: Option<bool>,
    ) -> Vec<Decision> {
        // Each node's tier in both plans, once per round: by GPU model (a
        // handful), then per node.
        let mut by_model: Vec<(Option<u32>, u8, u8)> = Vec::new();
        let (mut high_tier, mut low_tier) = (Vec::new(), Vec::new());
        for node in cluster.nodes() {
            let gpu = node.gpus().next();
            let id = gpu.as_ref().map(|g| g.model_id());
            let (high, low) = match by_model.iter().find(|m| m.0 == id) {
                Some(&(_, high, low)) => (high, low),
                None => {
                    let model = gpu.map_or("", |g| g.model());
                    let tiers = (
                        tier_of(&self.high_plan, model),
                        tier_of(&self.low_plan, model),
                    );
                    by_model.push((id, tiers.0, tiers.1));
                    tiers
                }
            };
            high_tier.push(high);
            low_tier.push(low);
        }
        let pending = cluster.pending_by_arrival();
        let indexed = indexed.unwrap_or(pending.len() >= INDEX_FROM_PENDING);
        let nodes = cluster.node_count() as u32;
        let (mut high_order, mut low_order): (Option<NodeOrder<u64>>, Option<NodeOrder<u64>>) =
            (None, None);
        let mut plan = Plan::new(cluster).with_max_decisions(round.max_decisions);
        plan.place_each(pending, |plan, job| {
            let high = self.is_high_gpu(&job);
            let (tiers, tier_count) = if high {
                (&high_tier, self.high_plan.len())
            } else {
                (&low_tier, self.low_plan.len())
            };
            let open = self.open_tiers(round.now_ms.saturating_sub(job.submit_ms()));
            let fit = plan.job_fit(job.index());
            let node = if indexed {
                let (mine, other) = if high {
                    (&mut high_order, &mut low_order)
                } else {
                    (&mut low_order, &mut high_order)
                };
                let order = mine
                    .get_or_insert_with(|| NodeOrder::new(nodes, |n| order_key(tiers, plan, n)));
                let node = first_in_open_tiers(order, tiers, tier_count, plan, &fit, open)?;
                // The plan charges the node: the other plan's order re-keys it.
                if let Some(other) = other.as_mut() {
                    other.touch(node);
                }
                node
            } else {
                first_by_scan(tiers, plan, &fit, open)?
            };
            plan.first_fit_worker(job.index(), node)
        });
        plan.into_decisions()
    }
}

arbiter_policy_sdk::export_policy!(ReservePack);

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> TestCluster {
        let mut c = TestCluster::new();
        c.node("v100", "p", 96_000, 512_000, "V100", 32_768, 8);
        c.node("v100m32", "p", 96_000, 512_000, "V100M32", 32_768, 8);
        c.node("t4", "p", 96_000, 512_000, "T4", 16_384, 2);
        c
    }

    fn placed_on(decisions: &[Decision], job: u32) -> Option<u32> {
        decisions.iter().find_map(|d| match d {
            Decision::Place(j, w) if *j == job => Some(w[0].node),
            _ => None,
        })
    }

    /// The paper's ordered plans: a high-GPU task takes V100, waits there
    /// until its timeout, then may take V100M32; a low-GPU task goes to T4
    /// first and to the high-end machines only after waiting.
    #[test]
    fn ordered_plans_with_attempt_timeouts() {
        let mut c = cluster();
        let big = c.job("big", "t", 1, 8);
        let small = c.job("small", "t", 1, 1);
        let mut rt = Runtime::<ReservePack>::new();
        rt.resync(c.snapshot()).unwrap();
        let d = rt.schedule(c.round(10)).unwrap();
        assert_eq!(placed_on(&d, big), Some(0), "high-GPU on V100");
        assert_eq!(placed_on(&d, small), Some(2), "low-GPU packed on T4");

        // V100 busy: the next high-GPU task waits, then takes V100M32.
        let mut c = cluster();
        let busy = c.job("busy", "t", 1, 8);
        c.run(
            busy,
            vec![WorkerPlacement {
                node: 0,
                gpus: (0..8).collect(),
            }],
        );
        let big = c.job("big", "t", 1, 8);
        let mut rt = Runtime::<ReservePack>::new();
        rt.resync(c.snapshot()).unwrap();
        assert_eq!(placed_on(&rt.schedule(c.round(10)).unwrap(), big), None);
        c.at(300_000 + c.cluster().job(big).submit_ms());
        let mut rt = Runtime::<ReservePack>::new();
        rt.resync(c.snapshot()).unwrap();
        assert_eq!(placed_on(&rt.schedule(c.round(10)).unwrap(), big), Some(1));

        // T4 full: a low-GPU task waits before touching the high-end tiers.
        let mut c = cluster();
        let fill = c.job("fill", "t", 1, 2);
        c.run(
            fill,
            vec![WorkerPlacement {
                node: 2,
                gpus: vec![16, 17],
            }],
        );
        let small = c.job("small", "t", 1, 1);
        let mut rt = Runtime::<ReservePack>::new();
        rt.resync(c.snapshot()).unwrap();
        assert_eq!(placed_on(&rt.schedule(c.round(10)).unwrap(), small), None);
        c.at(300_000 + c.cluster().job(small).submit_ms());
        let mut rt = Runtime::<ReservePack>::new();
        rt.resync(c.snapshot()).unwrap();
        assert_eq!(
            placed_on(&rt.schedule(c.round(10)).unwrap(), small),
            Some(1)
        );
    }

    /// High-GPU means whole GPUs in one worker: a gang of eight one-GPU
    /// workers packs onto T4 like any other low-GPU task, an eight-GPU
    /// worker goes to V100, and priority marks a task high-GPU when set.
    #[test]
    fn high_gpu_is_gpus_in_one_worker_or_priority() {
        let mut c = cluster();
        c.node("t4-b", "p", 96_000, 512_000, "T4", 16_384, 2);
        c.node("t4-c", "p", 96_000, 512_000, "T4", 16_384, 2);
        c.node("t4-d", "p", 96_000, 512_000, "T4", 16_384, 2);
        let gang = c.job("gang", "t", 4, 1);
        let mut rt = Runtime::<ReservePack>::new();
        rt.resync(c.snapshot()).unwrap();
        let d = rt.schedule(c.round(10)).unwrap();
        let Some(Decision::Place(_, workers)) = d.iter().find(|d| d.job() == gang) else {
            panic!("gang not placed: {d:?}");
        };
        assert!(workers.iter().all(|w| w.node >= 2), "on T4: {workers:?}");

        let mut c = cluster();
        let spec = JobSpec {
            priority: 5,
            gpus_per_worker: 1,
            gpu_milli: FULL_GPU_MILLI,
            ..c.gang_spec("critical", 1)
        };
        let critical = c.job_spec(spec);
        let mut rt = Runtime::<ReservePack>::new();
        rt.configure("high_gpu_priority = 5").unwrap();
        rt.resync(c.snapshot()).unwrap();
        assert_eq!(
            placed_on(&rt.schedule(c.round(10)).unwrap(), critical),
            Some(0)
        );
    }

    /// The node orders decide as the scan does: random clusters of the
    /// paper's models (and CPU-only nodes), queues of high-GPU, whole-GPU,
    /// fractional and gang jobs that have waited for 0 to 3 attempt
    /// timeouts, several rounds each.
    #[test]
    fn the_node_orders_decide_as_the_scan_does() {
        use arbiter_policy_sdk::rng::SplitMix64;
        let models = ["V100", "V100M32", "T4", "P100", "MISC", ""];
        let mut decided = 0;
        for seed in 0..30u64 {
            let mut rng = SplitMix64::new(seed);
            let mut c = TestCluster::new();
            for n in 0..20 + rng.below(40) {
                let model = models[rng.below(models.len() as u64) as usize];
                let gpus = match model {
                    "" => 0,
                    "T4" | "P100" => 2,
                    _ => 8,
                };
                c.node(&format!("n{n}"), "p", 96_000, 512_000, model, 16_384, gpus);
            }
            let mut policy = ReservePack::create();
            policy.configure("attempt_timeout_s = 60").unwrap();
            let add_jobs = |c: &mut TestCluster, round: u64| {
                for j in 0..10 + rng.below(60) {
                    let (workers, gpus, milli) = match rng.below(5) {
                        0 => (1, 8, 1000),
                        1 => (
                            1 + rng.below(4) as u32,
                            1,
                            [250, 500][rng.below(2) as usize],
                        ),
                        2 => (1, 0, 0),
                        _ => (1 + rng.below(3) as u32, 1 + rng.below(2) as u32, 1000),
                    };
                    let spec = JobSpec {
                        cpu_milli: 1_000 * (1 + rng.below(6) as u32),
                        gpus_per_worker: gpus,
                        gpu_milli: milli,
                        submit_ms: round * 60_000 + rng.below(60_000),
                        ..c.gang_spec(&format!("r{round}j{j}"), workers)
                    };
                    c.job_spec(spec);
                }
                // Jobs that waited for 0 to 3 attempt timeouts.
                c.at((round + 1) * 60_000 + rng.below(120_000));
            };
            decided +=
                c.same_answer_both_ways(&format!("seed {seed}"), 4, add_jobs, |c, indexed| {
                    policy.plan_round(c.cluster(), &c.round(10_000), Some(indexed))
                });
        }
        assert!(decided > 500, "too few placements to compare: {decided}");
    }

    #[test]
    fn configuration_is_checked() {
        let mut rt = Runtime::<ReservePack>::new();
        assert!(rt.configure(DEFAULT_CONFIG).is_ok());
        assert!(rt.configure("attempt_timeout_s = 0").is_err());
        assert!(rt.configure("high_plan = [\"V100\"]").is_err());
        assert!(
            rt.configure("high_gpu_priority = 5\nhigh_gpu_min_gpus = 4")
                .is_ok()
        );
    }
}
