//! `greedy-matcher`: a baseline `matcher` — pairs offline jobs with online
//! jobs greedily, without MuxFlow's maximum-weight matching.
//!
//! With `order = "complementary"` (the default) the quietest online job (lowest
//! SM activity alone) gets the busiest offline job, the next quietest the next
//! busiest, and so on; with `order = "arrival"` the online jobs go in request
//! order and the offline jobs in request (arrival) order: no pairing judgement
//! at all (MuxFlow's "-M" and "S-M" ablations). One offline job per online
//! job, on the online job's first GPU; a pairing the host would refuse (the GPU
//! is not healthy, already holds offline work, lacks memory) is skipped for the
//! next offline job in order, so the answer is never a fault. The offline job's
//! SM share is what the online job leaves (`100 − its SM activity`), kept
//! within `[min_sm, max_sm]` (defaults 10 and 90; `min_sm = max_sm` fixes it:
//! no dynamic SM). A job with no profile counts as fully active online (it is
//! paired last) or idle offline. MuxFlow's maximum-weight matching (KM over
//! predicted speeds) is the paper's policy; this is the simple baseline it is
//! compared against.

use arbiter_policy_sdk::prelude::*;

pub struct GreedyMatcher {
    min_sm: u8,
    max_sm: u8,
    /// Pair by arrival instead of by complementary SM activity.
    by_arrival: bool,
}

fn sm_activity(request: &MatchRequest, job: u32) -> Option<u8> {
    request
        .profiles
        .iter()
        .find(|p| p.job == job)
        .map(|p| p.sm_activity_pct.min(100))
}

impl Policy for GreedyMatcher {
    fn manifest() -> Manifest {
        let mut m = manifest(
            "greedy-matcher",
            env!("CARGO_PKG_VERSION"),
            &[Role::Matcher],
            "Online/offline pairs by complementary SM activity, greedily.",
        );
        m.default_config = "min_sm = 10\nmax_sm = 90\norder = \"complementary\"\n".into();
        m
    }

    fn create() -> Self {
        GreedyMatcher {
            min_sm: 10,
            max_sm: 90,
            by_arrival: false,
        }
    }

    fn configure(&mut self, config: &str) -> Result<(), PolicyError> {
        let table: toml::Table = config
            .parse()
            .map_err(|e| PolicyError::Failed(format!("bad configuration: {e}")))?;
        let percent = |key: &str, default: u8| -> Result<u8, PolicyError> {
            match table.get(key) {
                None => Ok(default),
                Some(v) => v
                    .as_integer()
                    .and_then(|n| u8::try_from(n).ok())
                    .filter(|n| (1..=100).contains(n))
                    .ok_or_else(|| PolicyError::Failed(format!("`{key}` must be 1..=100"))),
            }
        };
        let (min_sm, max_sm) = (percent("min_sm", 10)?, percent("max_sm", 90)?);
        if min_sm > max_sm {
            return Err(PolicyError::Failed("`min_sm` is above `max_sm`".into()));
        }
        let by_arrival = match table.get("order").map(|v| v.as_str()) {
            None | Some(Some("complementary")) => false,
            Some(Some("arrival")) => true,
            Some(_) => {
                return Err(PolicyError::Failed(
                    "`order` must be \"complementary\" or \"arrival\"".into(),
                ));
            }
        };
        if let Some(key) = table
            .keys()
            .find(|k| !matches!(k.as_str(), "min_sm" | "max_sm" | "order"))
        {
            return Err(PolicyError::Failed(format!("unknown key `{key}`")));
        }
        self.min_sm = min_sm;
        self.max_sm = max_sm;
        self.by_arrival = by_arrival;
        Ok(())
    }

    fn match_workloads(
        &mut self,
        cluster: &Cluster,
        request: &MatchRequest,
    ) -> Result<Vec<Pairing>, PolicyError> {
        let mut online: Vec<(u8, u32)> = request
            .online
            .iter()
            .map(|&j| (sm_activity(request, j).unwrap_or(100), j))
            .collect();
        let mut offline: Vec<(u8, u32)> = request
            .offline
            .iter()
            .map(|&j| (sm_activity(request, j).unwrap_or(0), j))
            .collect();
        if !self.by_arrival {
            online.sort_unstable();
            offline.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        }
        let mut seen = std::collections::BTreeSet::new();
        online.retain(|(_, j)| seen.insert(*j));
        seen.clear();
        offline.retain(|(_, j)| seen.insert(*j) && (*j as usize) < cluster.job_count());
        // Online jobs that are not running (no GPU to join) are skipped.
        let first_gpu = |job: u32| -> Option<(u32, u32)> {
            let j = (job < cluster.job_count() as u32).then(|| cluster.job(job))?;
            let w = j.placement().first()?;
            Some((w.node, *w.gpus.first()?))
        };
        let mut plan = Plan::new(cluster);
        let mut taken = vec![false; offline.len()];
        let mut pairs = Vec::new();
        for &(busy, on) in &online {
            let Some((node, gpu)) = first_gpu(on) else {
                continue;
            };
            for (i, &(_, off)) in offline.iter().enumerate() {
                if taken[i] {
                    continue;
                }
                let job = cluster.job(off);
                let here = job.placement().first().and_then(|w| w.gpus.first()) == Some(&gpu);
                if !here {
                    let worker = vec![WorkerPlacement {
                        node,
                        gpus: vec![gpu],
                    }];
                    let decision = if job.is_running() {
                        Decision::Migrate(off, worker)
                    } else {
                        Decision::Place(off, worker)
                    };
                    if plan.apply(decision).is_err() {
                        continue;
                    }
                }
                taken[i] = true;
                pairs.push(Pairing {
                    online: on,
                    offline: off,
                    gpu,
                    sm_percent: (100 - busy).clamp(self.min_sm, self.max_sm),
                });
                break;
            }
        }
        Ok(pairs)
    }
}

arbiter_policy_sdk::export_policy!(GreedyMatcher);

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(job: u32, sm: u8) -> WorkloadProfile {
        WorkloadProfile {
            job,
            utilization_pct: sm,
            sm_activity_pct: sm,
            memory_mib: 1024,
            throughput: 1.0,
            ..WorkloadProfile::default()
        }
    }

    /// `online` running guaranteed jobs, one per GPU, then `offline`
    /// pending best-effort ones.
    fn cluster(online: u32, offline: u32) -> TestCluster {
        let mut c = TestCluster::new();
        c.node("n0", "p", 64_000, 512_000, "T4", 16_384, online);
        // MuxFlow's: one offline job beside each online one, memory bounded on the node.
        c.sharing(SharingRules {
            oversub_milli: 1000,
            max_shared_workers: 1,
            host_spill: true,
        });
        for j in 0..online {
            let job = c.job_on_one_gpu(&format!("on{j}"), "t", qos::GUARANTEED, 1000, 0);
            c.run(
                job,
                vec![WorkerPlacement {
                    node: 0,
                    gpus: vec![j],
                }],
            );
        }
        for j in 0..offline {
            c.job_on_one_gpu(&format!("off{j}"), "t", qos::BEST_EFFORT, 1000, 1024);
        }
        c
    }

    #[test]
    fn the_quietest_online_job_gets_the_busiest_offline_one() {
        let c = cluster(3, 2);
        let mut rt = Runtime::<GreedyMatcher>::new();
        rt.resync(c.snapshot()).unwrap();
        let request = MatchRequest {
            epoch: c.snapshot().epoch,
            online: vec![0, 1, 2],
            offline: vec![3, 4],
            profiles: vec![
                profile(0, 70),
                profile(1, 20),
                profile(2, 95),
                profile(3, 30),
                profile(4, 80),
            ],
        };
        let pairs = rt.match_workloads(request).unwrap();
        assert_eq!(
            pairs,
            vec![
                Pairing {
                    online: 1,
                    offline: 4,
                    gpu: 1,
                    sm_percent: 80
                },
                Pairing {
                    online: 0,
                    offline: 3,
                    gpu: 0,
                    sm_percent: 30
                },
            ]
        );
    }

    #[test]
    fn by_arrival_pairs_in_request_order_and_skips_what_the_host_would_refuse() {
        let mut c = cluster(3, 3);
        c.health(1, health::UNHEALTHY);
        let mut rt = Runtime::<GreedyMatcher>::new();
        rt.configure("order = \"arrival\"\nmin_sm = 40\nmax_sm = 40")
            .unwrap();
        rt.resync(c.snapshot()).unwrap();
        let request = MatchRequest {
            epoch: c.snapshot().epoch,
            online: vec![0, 1, 2],
            offline: vec![3, 4, 5],
            profiles: vec![
                profile(0, 70),
                profile(2, 5),
                profile(3, 10),
                profile(5, 90),
            ],
        };
        let pairs = rt.match_workloads(request).unwrap();
        // GPU 1 is not healthy: no offline work there; the SM share is fixed at 40 %.
        assert_eq!(
            pairs,
            vec![
                Pairing {
                    online: 0,
                    offline: 3,
                    gpu: 0,
                    sm_percent: 40
                },
                Pairing {
                    online: 2,
                    offline: 4,
                    gpu: 2,
                    sm_percent: 40
                },
            ]
        );
        assert!(rt.configure("order = \"random\"").is_err());
        assert!(rt.configure("ordre = \"arrival\"").is_err());
    }

    #[test]
    fn shares_stay_within_the_configured_bounds() {
        let c = cluster(2, 2);
        let mut rt = Runtime::<GreedyMatcher>::new();
        rt.configure("min_sm = 25\nmax_sm = 60").unwrap();
        rt.resync(c.snapshot()).unwrap();
        let request = MatchRequest {
            epoch: c.snapshot().epoch,
            online: vec![0, 1],
            offline: vec![2, 3],
            profiles: vec![profile(0, 5), profile(1, 99)],
        };
        let shares: Vec<u8> = rt
            .match_workloads(request)
            .unwrap()
            .iter()
            .map(|p| p.sm_percent)
            .collect();
        assert_eq!(shares, vec![60, 25]);
        assert!(rt.configure("min_sm = 70\nmax_sm = 60").is_err());
    }
}
