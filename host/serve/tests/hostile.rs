//! The hostile corpus (`arbiter-hostile`) against a live `arbiter serve`
//! over loopback gRPC: refused uploads say why in bounded, escaped text and
//! leave nothing behind; misbehaving schedulers, tenant policies, reclaim
//! policies and matchers are faulted, quarantined and replaced by their
//! fallback while jobs keep running and servers go back; a tenant's policies share one memory budget; the components of
//! generations that leave a slot leave the store.

mod common;

use arbiter_host::runtime::{MAX_ERROR_TEXT, RuntimeConfig, is_plain};
use arbiter_hostile::{Case, Expect, Role};
use arbiter_proto::v1;
use arbiter_serve::plane::{PlaneConfig, default_pool};
use arbiter_serve::records::SlotRecord;
use arbiter_serve::server::Running;
use arbiter_serve::store::Store;
use common::*;
use std::collections::HashSet;
use std::time::Duration;

async fn hostile_server(dir: &std::path::Path, tenant_memory_bytes: usize) -> Running {
    hostile_server_with(
        dir,
        PlaneConfig {
            tenant_memory_bytes,
            ..PlaneConfig::default()
        },
        Duration::from_secs(1),
    )
    .await
}

/// The plane the hostile tests run: `cfg`'s tenant budgets, fast rounds,
/// short jobs, and `deadline` (1 s where hanging cases pay it per call).
async fn hostile_server_with(
    dir: &std::path::Path,
    cfg: PlaneConfig,
    deadline: Duration,
) -> Running {
    server_with(
        dir,
        PlaneConfig {
            nodes: default_pool(2, 8),
            default_duration: Duration::from_millis(200),
            // The matcher cases are asked every few rounds, not every 10 s.
            match_interval: Some(Duration::from_millis(100)),
            runtime: RuntimeConfig {
                deadline,
                ..cfg.runtime
            },
            ..cfg
        },
    )
    .await
}

/// Whether a case is refused at upload.
fn refused_at_upload(case: &Case) -> bool {
    matches!(case.expect, Expect::Refused(_) | Expect::Unusable(_))
}

/// Uploads a case that must be refused: the refusal says why in bounded,
/// escaped text, and leaves the compile cache no larger than one entry more,
/// within its bound.
async fn upload_is_refused(running: &Running, tenant: &mut Client, case: &Case) {
    let name = case.name.as_str();
    let cache_bound = RuntimeConfig::default().compiled_cache_bytes;
    let before = cached_components(running).await;
    let refused = upload_case(tenant, "", case)
        .await
        .expect_err(&format!("{name}: the upload was accepted"));
    assert_ne!(refused.code(), tonic::Code::Ok);
    assert_shown(name, "refusal", refused.message());
    if let Expect::Refused(text) = case.expect {
        // Over the upload cap, the transport refuses it first.
        assert!(
            refused.message().contains(text)
                || refused.code() == tonic::Code::ResourceExhausted
                || refused.code() == tonic::Code::OutOfRange,
            "{name}: {refused:?}"
        );
    }
    let after = cached_components(running).await;
    assert!(
        after.0 <= before.0 + 1 && after.1 <= cache_bound,
        "{name}: a refused upload grew the compile cache {before:?} -> {after:?}"
    );
}

/// Text a policy made the plane say: bounded and printable.
/// The compile cache's (entries, bytes).
async fn cached_components(running: &Running) -> (usize, usize) {
    running
        .plane
        .lock()
        .await
        .registry()
        .engine()
        .cached_components()
}

fn assert_shown(case: &str, what: &str, text: &str) {
    // Cut texts end with " … (N bytes cut)", and the plane adds context.
    assert!(
        text.len() <= MAX_ERROR_TEXT + 512,
        "{case}: {what} is {} bytes",
        text.len()
    );
    assert!(is_plain(text), "{case}: {what} is not escaped: {text:?}");
}

async fn upload_case(
    c: &mut Client,
    slot: &str,
    case: &Case,
) -> Result<v1::GenerationInfo, tonic::Status> {
    upload(
        c,
        slot,
        &case.wasm,
        case.config.as_deref().unwrap_or_default(),
    )
    .await
}

async fn generation(c: &mut Client, slot: &str, id: u64) -> v1::GenerationInfo {
    describe(c, slot)
        .await
        .generations
        .into_iter()
        .find(|g| g.id == id)
        .unwrap_or_else(|| panic!("generation {id} is not in `{slot}`"))
}

/// `n` jobs of `c`, one after another, each run to completion.
async fn run_jobs(c: &mut Client, name: &str, n: usize) {
    for k in 0..n {
        let job = submit(c, spec(&format!("{name}-{k}"), 1, 50)).await;
        wait_state(c, job, v1::JobState::Succeeded).await;
    }
}

/// Runs jobs of `c` one after another (the policy is asked only while one
/// waits) until generation `id` of `slot` has faulted twice and, for a
/// policy that faults on every call, is quarantined: every job completes
/// meanwhile, so the fallback keeps the cluster scheduling. Then checks
/// what describe shows of the generation.
async fn run_until_faulted(c: &mut Client, case: &Case, slot: &str, id: u64, quarantine: bool) {
    for n in 0..40 {
        run_jobs(c, &format!("{}-{n}", case.name), 1).await;
        let g = generation(c, slot, id).await;
        if g.faults >= 2 && (!quarantine || g.quarantined) {
            assert_shown(&case.name, "last fault", &g.last_fault);
            assert_shown(&case.name, "name", &g.name);
            return;
        }
    }
    let g = generation(c, slot, id).await;
    panic!("{}: 40 jobs later, {g:?}", case.name);
}

/// Lends `sim-01` and takes it back, again and again, until generation `id`
/// of the `reclaim` slot has faulted twice (and, if `quarantine`, is
/// quarantined): every reclaim still returns the node, chosen by a fallback.
async fn reclaim_until_faulted(c: &mut Client, case: &Case, id: u64, quarantine: bool) {
    for _ in 0..40 {
        lend(c, "sim-01").await;
        let r = reclaim_one(c)
            .await
            .unwrap_or_else(|e| panic!("{}: reclaim: {e:?}", case.name))
            .into_inner();
        assert_eq!(r.returned, ["sim-01"], "{}: {r:?}", case.name);
        for fault in &r.faults {
            assert_shown(&case.name, "reclaim fault", fault);
        }
        let g = generation(c, "reclaim", id).await;
        if g.faults >= 2 && (!quarantine || g.quarantined) {
            assert_shown(&case.name, "last fault", &g.last_fault);
            return;
        }
    }
    let g = generation(c, "reclaim", id).await;
    panic!("{}: 40 reclaims later, {g:?}", case.name);
}

/// What the plane asks a matcher about: two running inference services
/// (guaranteed) and a one-GPU opportunistic job, all running for the rest
/// of the test.
async fn start_work_to_match(c: &mut Client) {
    let mut services = Vec::new();
    for k in 0..2 {
        let service = v1::JobSpec {
            kind: 1,
            ..spec(&format!("service-{k}"), 1, 3_600_000)
        };
        services.push(submit(c, service).await);
    }
    let offline = v1::JobSpec {
        qos: 1,
        ..spec("offline", 1, 3_600_000)
    };
    submit(c, offline).await;
    for id in services {
        wait_state(c, id, v1::JobState::Running).await;
    }
}

/// Waits while the plane asks the `matcher` slot every 100 ms, until
/// generation `id` has faulted twice (and, if `quarantine`, is quarantined).
async fn matched_until_faulted(c: &mut Client, case: &Case, id: u64, quarantine: bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let g = generation(c, "matcher", id).await;
        if g.faults >= 2 && (!quarantine || g.quarantined) {
            assert_shown(&case.name, "last fault", &g.last_fault);
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{}: a minute of matching later, {g:?}",
            case.name
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hostile_case_meets_its_safe_behaviour_in_a_live_plane() {
    let dir = tempfile::tempdir().unwrap();
    let running = hostile_server(dir.path(), 128 << 20).await;
    let mut admin = client(&running, running.new_admin_token.as_deref()).await;
    let token = add_tenant(&mut admin, "hostile", 0).await;
    let mut tenant = client(&running, Some(&token)).await;
    // Whether the work a matcher is asked about runs yet.
    let mut matching = false;

    for case in arbiter_hostile::corpus() {
        let name = case.name.as_str();
        match &case.expect {
            // Refused for what it is, not for time: a plane with a long
            // deadline checks those (the next test).
            Expect::Refused(_) | Expect::Unusable(_) if !case.hangs => continue,
            Expect::Refused(_) | Expect::Unusable(_) => {
                upload_is_refused(&running, &mut tenant, &case).await;
            }
            Expect::Faults { role, .. } | Expect::Flaps { role } => {
                let quarantine = matches!(case.expect, Expect::Faults { .. });
                let (c, slot) = match role {
                    Role::Scheduler => (&mut admin, "default"),
                    Role::Tenant => (&mut tenant, "tenant:hostile"),
                    Role::Reclaim => (&mut admin, "reclaim"),
                    Role::Matcher => (&mut admin, "matcher"),
                    // A coordinator runs on a node agent: its cases run on a
                    // node in `node/tests/coordinator.rs`.
                    Role::Coordinator => continue,
                };
                if *role == Role::Matcher && !matching {
                    start_work_to_match(c).await;
                    matching = true;
                }
                let g = upload_case(c, slot, &case)
                    .await
                    .unwrap_or_else(|e| panic!("{name}: refused: {e:?}"));
                match role {
                    Role::Reclaim => reclaim_until_faulted(c, &case, g.id, quarantine).await,
                    Role::Matcher => matched_until_faulted(c, &case, g.id, quarantine).await,
                    _ => run_until_faulted(c, &case, slot, g.id, quarantine).await,
                }
            }
            Expect::Works => {
                let g = upload_case(&mut tenant, "", &case)
                    .await
                    .unwrap_or_else(|e| panic!("{name}: refused: {e:?}"));
                assert_shown(name, "name", &g.name);
                assert_shown(name, "config", &g.config);
                run_jobs(&mut tenant, name, 1).await;
            }
        }
    }

    // Tenant policies are counted like every other role's.
    let slot = describe(&mut admin, "tenant:hostile").await;
    assert!(
        slot.generations.iter().any(|g| g.rounds_served > 0),
        "{slot:?}"
    );
    let metrics = metrics_text(&mut admin).await;
    let held: usize = metrics
        .lines()
        .find_map(|l| l.strip_prefix("arbiter_tenant_policy_memory_bytes{tenant=\"hostile\"} "))
        .unwrap_or_else(|| panic!("no tenant memory gauge: {metrics}"))
        .parse()
        .unwrap();
    assert!(held <= 128 << 20, "the tenant holds {held} bytes");
    running.shutdown().await.unwrap();

    // Only the components of generations still in a slot are stored.
    let contents = Store::open(dir.path()).unwrap().read_all().unwrap();
    let referenced: HashSet<String> = contents
        .with_prefix("slot/")
        .flat_map(|(_, bytes)| {
            let record: SlotRecord = serde_json::from_slice(bytes).unwrap();
            record.generations.into_iter().map(|g| g.digest)
        })
        .collect();
    let stored: HashSet<String> = contents
        .with_prefix("blob/")
        .map(|(digest, _)| digest.to_string())
        .collect();
    assert_eq!(stored, referenced);
}

/// The cases refused for what they are (64 MiB hoarded in `manifest`, a
/// 40 MiB role name, a memory over the cap), in a plane with a 30 s
/// deadline: each takes well under a second, but on a loaded machine one
/// once ran past 1 s and was refused for time instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refused_upload_says_what_the_component_is() {
    let dir = tempfile::tempdir().unwrap();
    let running =
        hostile_server_with(dir.path(), PlaneConfig::default(), Duration::from_secs(30)).await;
    let mut admin = client(&running, running.new_admin_token.as_deref()).await;
    let token = add_tenant(&mut admin, "hostile", 0).await;
    let mut tenant = client(&running, Some(&token)).await;
    let cases: Vec<Case> = arbiter_hostile::corpus()
        .into_iter()
        .filter(|c| refused_at_upload(c) && !c.hangs)
        .collect();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    for case in &cases {
        upload_is_refused(&running, &mut tenant, case).await;
    }
    running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_policies_share_one_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 6 << 20;
    // Nothing here hangs: a deadline no stall of a loaded machine reaches, so that a refusal
    // is for memory and an accepted upload is never refused for time.
    let running = hostile_server_with(
        dir.path(),
        PlaneConfig {
            tenant_memory_bytes: budget,
            ..PlaneConfig::default()
        },
        Duration::from_secs(30),
    )
    .await;
    let mut admin = client(&running, running.new_admin_token.as_deref()).await;
    let (a_token, b_token) = (
        add_tenant(&mut admin, "team-a", 0).await,
        add_tenant(&mut admin, "team-b", 0).await,
    );
    let mut a = client(&running, Some(&a_token)).await;
    let mut b = client(&running, Some(&b_token)).await;
    let good = arbiter_policies::fixture("misbehave").unwrap();
    let mut accepted = 0;
    let refusal = loop {
        assert!(accepted < 8, "eight generations fit a {budget}-byte budget");
        match upload(&mut a, "", good, "").await {
            Ok(_) => accepted += 1,
            Err(e) => break e,
        }
    };
    assert!(accepted >= 1, "not even one policy fits: {refusal:?}");
    assert!(
        refusal
            .message()
            .contains("memory budget of account `tenant:team-a` exceeded"),
        "{refusal:?}"
    );
    // The budget is per tenant: team-b is not charged for team-a.
    upload(&mut b, "", good, "").await.unwrap();
    let metrics = metrics_text(&mut admin).await;
    let held = |tenant: &str| -> usize {
        let prefix = format!("arbiter_tenant_policy_memory_bytes{{tenant=\"{tenant}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no gauge for {tenant}: {metrics}"))
            .parse()
            .unwrap()
    };
    let (held_a, held_b) = (held("team-a"), held("team-b"));
    assert!(
        held_a <= budget && held_a > budget / 2,
        "team-a holds {held_a}"
    );
    assert!(held_b > 0 && held_b < held_a, "team-b holds {held_b}");
    // Each instance holds the same: as many fit as the budget allows.
    assert_eq!(accepted, budget / held_b, "{held_a} {held_b}");
    running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_compiled_code_has_a_budget() {
    let one = arbiter_host::runtime::PolicyEngine::new(RuntimeConfig::default())
        .unwrap()
        .compile(&arbiter_hostile::misbehave_as("code-a"))
        .unwrap()
        .code_bytes();
    let dir = tempfile::tempdir().unwrap();
    let running = hostile_server_with(
        dir.path(),
        PlaneConfig {
            // Two components fit, a third does not.
            tenant_code_bytes: one * 5 / 2,
            ..PlaneConfig::default()
        },
        // Nothing here hangs (see above).
        Duration::from_secs(30),
    )
    .await;
    let mut admin = client(&running, running.new_admin_token.as_deref()).await;
    let token = add_tenant(&mut admin, "team-a", 0).await;
    let mut a = client(&running, Some(&token)).await;
    let (x, y, z) = (
        arbiter_hostile::misbehave_as("code-a"),
        arbiter_hostile::misbehave_as("code-b"),
        arbiter_hostile::misbehave_as("code-c"),
    );
    upload(&mut a, "", &x, "").await.unwrap();
    upload(&mut a, "", &y, "").await.unwrap();
    // The same code again is counted once.
    upload(&mut a, "", &x, "").await.unwrap();
    let refused = upload(&mut a, "", &z, "").await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("bytes of compiled code"),
        "{refused:?}"
    );
    // The admin's slots are not the tenant's.
    upload(&mut admin, "scratch", &z, "").await.unwrap();
    running.shutdown().await.unwrap();
}
