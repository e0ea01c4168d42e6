//! `tenant-deadline-first`: an example `tenant` policy, written step by step
//! in `docs/writing-policies.md`.
//!
//! Each round the host hands a tenant policy that tenant's own jobs (pending
//! ones waiting for admission, and running ones), its GPU quota and the GPUs
//! it already uses. This policy answers with:
//!
//! 1. **Urgency order.** Pending jobs are ranked in three classes, most urgent
//!    first:
//!    - jobs with a deadline that can still be met, earliest deadline first;
//!    - jobs without a deadline;
//!    - *hopeless* jobs — a deadline with `now + estimate > deadline` —
//!      earliest deadline first (with `drop_hopeless = true` they are held
//!      instead, see below).
//!
//!    Ties break on priority (higher first), then submit time (older first),
//!    then position in the view.
//! 2. **Quota backfill** (`backfill = true`, the default; only when the
//!    tenant has a quota). Walking that order with `left = quota − in use`
//!    GPUs: a job with `gpus ≤ left` is ordered and takes its GPUs from
//!    `left`; a job with `gpus > left` is held this round, and the walk goes
//!    on, so smaller, less urgent jobs behind it use the quota that is left.
//!    A held job is not released this round even if a running job finishes
//!    part-way; it is considered again next round. With `backfill = false`
//!    nothing is held for quota: the host releases in order and stops at the
//!    first job that does not fit.
//! 3. **Hopeless jobs** (`drop_hopeless = true`): held every round. Time only
//!    moves forward, so such a job is never released; cancel it.
//!
//! A job with no estimate (`estimate-ms = 0`) is hopeless only once its
//! deadline has passed.

use arbiter_policy_sdk::prelude::*;
use std::cmp::Reverse;

/// The default configuration, shown by `arbiter policy check` and
/// `arbiter policy describe`.
pub const DEFAULT_CONFIG: &str = "\
# tenant-deadline-first configuration.

# Hold pending jobs that can no longer meet their deadline
# (now + estimate > deadline) instead of releasing them last.
drop_hopeless = false

# Hold a job that does not fit the quota left this round and let smaller,
# less urgent jobs behind it through. false: strict order, the host stops
# releasing at the first job that does not fit.
backfill = true
";

/// The policy's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub drop_hopeless: bool,
    pub backfill: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            drop_hopeless: false,
            backfill: true,
        }
    }
}

impl Config {
    /// Parses a TOML document; missing keys keep their defaults, unknown keys
    /// and wrong types are errors.
    pub fn parse(text: &str) -> Result<Config, String> {
        let mut table: toml::Table = text.parse().map_err(|e| format!("{e}"))?;
        let mut config = Config::default();
        for (key, slot) in [
            ("drop_hopeless", &mut config.drop_hopeless),
            ("backfill", &mut config.backfill),
        ] {
            match table.remove(key) {
                None => {}
                Some(toml::Value::Boolean(b)) => *slot = b,
                Some(other) => {
                    return Err(format!(
                        "`{key}` must be true or false, not {}",
                        other.type_str()
                    ));
                }
            }
        }
        if let Some(key) = table.keys().next() {
            return Err(format!(
                "unknown key `{key}` (known: drop_hopeless, backfill)"
            ));
        }
        Ok(config)
    }
}

/// The policy: its configuration is all its state.
#[derive(Default)]
pub struct DeadlineFirst {
    config: Config,
}

impl DeadlineFirst {
    pub fn config(&self) -> Config {
        self.config
    }
}

/// Whether `job` can no longer meet its deadline at `now_ms`.
pub fn hopeless(job: &TenantJob, now_ms: u64) -> bool {
    job.deadline_ms != 0 && now_ms.saturating_add(job.estimate_ms) > job.deadline_ms
}

/// The verdict for one round; a pure function of the view and the config.
pub fn verdict(view: &TenantView, config: Config) -> TenantVerdict {
    let mut hold = Vec::new();
    let mut ranked: Vec<(u8, &TenantJob)> = Vec::new();
    for job in view.jobs.iter().filter(|j| !j.running) {
        let class = match (job.deadline_ms, hopeless(job, view.now_ms)) {
            // No deadline.
            (0, _) => 1,
            // Deadline still reachable.
            (_, false) => 0,
            // Hopeless: held, or kept and ranked last.
            (_, true) if config.drop_hopeless => {
                hold.push(job.position);
                continue;
            }
            (_, true) => 2,
        };
        ranked.push((class, job));
    }
    ranked.sort_by_key(|&(class, j)| {
        (
            class,
            j.deadline_ms,
            Reverse(j.priority),
            j.submit_ms,
            j.position,
        )
    });

    let mut order = Vec::with_capacity(ranked.len());
    if view.gpu_quota == 0 || !config.backfill {
        order.extend(ranked.iter().map(|(_, j)| j.position));
    } else {
        let mut left = view.gpu_quota.saturating_sub(view.gpus_in_use);
        for (_, job) in ranked {
            if job.gpus <= left {
                left -= job.gpus;
                order.push(job.position);
            } else {
                hold.push(job.position);
            }
        }
    }
    TenantVerdict { order, hold }
}

impl Policy for DeadlineFirst {
    fn manifest() -> Manifest {
        let mut m = manifest(
            "tenant-deadline-first",
            env!("CARGO_PKG_VERSION"),
            &[Role::Tenant],
            "Earliest deadline first within the tenant's GPU quota, backfilling smaller jobs.",
        );
        m.default_config = DEFAULT_CONFIG.to_string();
        m
    }

    fn create() -> Self {
        DeadlineFirst::default()
    }

    fn configure(&mut self, config: &str) -> Result<(), PolicyError> {
        self.config = Config::parse(config)
            .map_err(|e| PolicyError::Failed(format!("bad configuration: {e}")))?;
        Ok(())
    }

    fn order(&mut self, view: &TenantView) -> Result<TenantVerdict, PolicyError> {
        Ok(verdict(view, self.config))
    }
}

arbiter_policy_sdk::export_policy!(DeadlineFirst);

#[cfg(test)]
mod tests {
    use super::*;

    /// A pending job at `position` (submitted at `position` ms).
    fn job(position: u32, gpus: u32, deadline_ms: u64, estimate_ms: u64) -> TenantJob {
        TenantJob {
            position,
            name: format!("job-{position}"),
            gpus,
            priority: 0,
            submit_ms: u64::from(position),
            estimate_ms,
            deadline_ms,
            running: false,
        }
    }

    fn view(now_ms: u64, gpu_quota: u32, gpus_in_use: u32, jobs: Vec<TenantJob>) -> TenantView {
        TenantView {
            now_ms,
            tenant: "team-a".into(),
            gpu_quota,
            gpus_in_use,
            jobs,
        }
    }

    /// The policy exactly as the component runs it: through the SDK runtime.
    fn run(config: &str, view: TenantView) -> TenantVerdict {
        let mut rt = Runtime::<DeadlineFirst>::new();
        rt.configure(config).unwrap();
        rt.order(view).unwrap()
    }

    #[test]
    fn earliest_deadline_first_then_undated_by_priority_then_submit() {
        let mut low = job(0, 1, 0, 0);
        low.priority = 1;
        let mut high = job(1, 1, 0, 0);
        high.priority = 5;
        let plain = job(2, 1, 0, 0);
        let mut also_prio_1 = job(3, 1, 0, 0);
        also_prio_1.priority = 1;
        let late = job(4, 1, 90_000, 1_000);
        let soon = job(5, 1, 20_000, 1_000);
        let mut running = job(6, 4, 10_000, 1_000);
        running.running = true;
        let v = run(
            "",
            view(
                1_000,
                0,
                4,
                vec![low, high, plain, also_prio_1, late, soon, running],
            ),
        );
        assert_eq!(v.order, vec![5, 4, 1, 0, 3, 2]);
        assert!(v.hold.is_empty());
    }

    #[test]
    fn equal_deadlines_break_on_priority_then_submit() {
        let a = job(0, 1, 50_000, 0);
        let mut b = job(1, 1, 50_000, 0);
        b.priority = 3;
        let c = job(2, 1, 50_000, 0);
        let v = run("", view(0, 0, 0, vec![a, b, c]));
        assert_eq!(v.order, vec![1, 0, 2]);
    }

    #[test]
    fn quota_backfill_holds_what_does_not_fit_and_lets_smaller_jobs_through() {
        // Quota 8, 2 in use: 6 left. Urgency: big (5), huge (4), small (1), medium (2).
        let big = job(0, 5, 10_000, 0);
        let huge = job(1, 4, 20_000, 0);
        let small = job(2, 1, 30_000, 0);
        let medium = job(3, 2, 0, 0);
        let jobs = vec![big, huge, small, medium];
        let v = run("", view(0, 8, 2, jobs.clone()));
        // big takes 5 (1 left); huge (4) and medium (2) wait; small (1) backfills.
        assert_eq!(v.order, vec![0, 2]);
        assert_eq!(v.hold, vec![1, 3]);
        let released: u32 = v.order.iter().map(|&p| jobs[p as usize].gpus).sum();
        assert!(released <= 8 - 2);

        // Strict order: nothing held, the host stops at the first misfit.
        let strict = run("backfill = false", view(0, 8, 2, jobs.clone()));
        assert_eq!(strict.order, vec![0, 1, 2, 3]);
        assert!(strict.hold.is_empty());

        // No quota: nothing held.
        let unlimited = run("", view(0, 0, 2, jobs));
        assert_eq!(unlimited.order, vec![0, 1, 2, 3]);
        assert!(unlimited.hold.is_empty());
    }

    #[test]
    fn over_quota_tenant_holds_everything_that_needs_gpus() {
        // In use above quota (quota lowered while jobs ran): nothing fits but zero-GPU jobs.
        let v = run(
            "",
            view(
                0,
                4,
                6,
                vec![job(0, 1, 0, 0), job(1, 0, 0, 0), job(2, 8, 0, 0)],
            ),
        );
        assert_eq!(v.order, vec![1]);
        assert_eq!(v.hold, vec![0, 2]);
    }

    #[test]
    fn hopeless_jobs_go_last_by_default_and_are_held_when_dropped() {
        let now = 100_000;
        // Deadline at now + 1 min, needs 2 min: hopeless.
        let hopeless_job = job(0, 1, now + 60_000, 120_000);
        // Deadline passed, no estimate: hopeless.
        let passed = job(1, 1, now - 1, 0);
        // Exactly meets its deadline: not hopeless.
        let tight = job(2, 1, now + 60_000, 60_000);
        let undated = job(3, 1, 0, 0);
        let jobs = vec![hopeless_job, passed, tight, undated];
        assert!(hopeless(&jobs[0], now) && hopeless(&jobs[1], now));
        assert!(!hopeless(&jobs[2], now) && !hopeless(&jobs[3], now));

        let v = run("", view(now, 0, 0, jobs.clone()));
        assert_eq!(v.order, vec![2, 3, 1, 0]);
        assert!(v.hold.is_empty());

        let v = run("drop_hopeless = true", view(now, 0, 0, jobs.clone()));
        assert_eq!(v.order, vec![2, 3]);
        assert_eq!(v.hold, vec![0, 1]);

        // Dropped hopeless jobs take no quota: the rest still fits.
        let v = run("drop_hopeless = true", view(now, 2, 0, jobs));
        assert_eq!(v.order, vec![2, 3]);
        assert_eq!(v.hold, vec![0, 1]);
    }

    #[test]
    fn default_config_document_is_the_default() {
        assert_eq!(Config::parse(DEFAULT_CONFIG), Ok(Config::default()));
        assert_eq!(Config::parse(""), Ok(Config::default()));
        assert_eq!(
            DeadlineFirst::manifest().default_config,
            DEFAULT_CONFIG.to_string()
        );
        assert_eq!(DeadlineFirst::manifest().roles, vec!["tenant".to_string()]);
        assert_eq!(
            Config::parse("drop_hopeless = true\nbackfill = false"),
            Ok(Config {
                drop_hopeless: true,
                backfill: false
            })
        );
    }

    #[test]
    fn bad_config_is_rejected_and_keeps_the_previous_one() {
        let mut rt = Runtime::<DeadlineFirst>::new();
        rt.configure("drop_hopeless = true").unwrap();
        for bad in [
            "drop_hopeless = 1",
            "backfill = \"yes\"",
            "deadline_first = true",
            "drop_hopeless = ",
            "[drop_hopeless]",
        ] {
            let err = rt.configure(bad).unwrap_err();
            assert!(
                matches!(&err, PolicyError::Failed(m) if m.starts_with("bad configuration")),
                "{bad:?}: {err:?}"
            );
        }
        // Still the last good configuration.
        let now = 10_000;
        let v = rt
            .order(view(now, 0, 0, vec![job(0, 1, now - 1, 0)]))
            .unwrap();
        assert_eq!(v.hold, vec![0]);
    }

    #[test]
    fn other_roles_are_unsupported() {
        let mut rt = Runtime::<DeadlineFirst>::new();
        let tick = rt.tick(NodeView::default());
        assert!(matches!(tick, Err(PolicyError::Unsupported(r)) if r == "coordinator"));
    }
}
