//! `arbiter serve --policies-dir`: a component dropped into the directory loads
//! into the slot its file names, through the plane (stored, published); its
//! `.toml` is its configuration; one the plane cannot take yet (a tenant's
//! policy before the tenant) loads once it can; removing it unloads it (but
//! never `default`'s active generation); a restart adopts what already serves
//! instead of loading a copy.

mod common;

use arbiter_proto::v1;
use arbiter_serve::server::{Running, ServeConfig, start};
use common::*;
use std::path::Path;
use std::time::Duration;

async fn serve_watching(data: &Path, policies: &Path) -> Running {
    start(ServeConfig {
        policies_dir: Some(policies.to_path_buf()),
        ..serve_config(data, patient_plane())
    })
    .await
    .unwrap()
}

/// Every slot's generations: (slot, generations).
async fn slots(c: &mut Client) -> Vec<(String, Vec<v1::GenerationInfo>)> {
    c.policies
        .list(v1::ListPoliciesRequest {})
        .await
        .unwrap()
        .into_inner()
        .slots
        .into_iter()
        .map(|s| (s.slot, s.generations))
        .collect()
}

/// The active generation of `slot`, if it has one.
async fn active(c: &mut Client, slot: &str) -> Option<v1::GenerationInfo> {
    slots(c)
        .await
        .into_iter()
        .find(|(name, _)| name == slot)
        .and_then(|(_, gs)| gs.into_iter().find(|g| g.active))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_directory_loads_through_the_plane_and_survives_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let policies = tempfile::tempdir().unwrap();
    let dir = policies.path();
    let fifo = arbiter_policies::get("fifo").unwrap();
    std::fs::write(dir.join("default.wasm"), fifo).unwrap();

    let running = serve_watching(data.path(), dir).await;
    let token = running.new_admin_token.clone().unwrap();
    let mut admin = client(&running, Some(&token)).await;
    // What the directory held is loaded before `start` returns, into the slot
    // its file names (the manifest says `fifo`; the file says `default`).
    let first = active(&mut admin, "default").await.expect("default active");
    assert_eq!(first.name, "fifo");
    // And it schedules: a job runs under it.
    let job = submit(&mut admin, spec("under-fifo", 1, 50)).await;
    wait_state(&admin, job, v1::JobState::Succeeded).await;

    // A component dropped in, written elsewhere and renamed in as `install` does.
    let staged = data.path().join("staged");
    std::fs::write(&staged, arbiter_policies::get("greedy-matcher").unwrap()).unwrap();
    std::fs::rename(&staged, dir.join("matcher.wasm")).unwrap();
    wait_for("the matcher to load", || {
        let mut c = client_clone(&admin);
        async move {
            active(&mut c, "matcher")
                .await
                .is_some_and(|g| g.name == "greedy-matcher")
        }
    })
    .await;

    // Its configuration alone changes: a new generation with it.
    std::fs::write(dir.join("default.toml"), "# tuned\n").unwrap();
    wait_for("default to take its configuration", || {
        let mut c = client_clone(&admin);
        async move {
            active(&mut c, "default")
                .await
                .is_some_and(|g| g.config == "# tuned\n")
        }
    })
    .await;
    let tuned = active(&mut admin, "default").await.unwrap();
    assert_ne!(tuned.id, first.id);

    // Removed: the matcher's generation unloads.
    std::fs::remove_file(dir.join("matcher.wasm")).unwrap();
    wait_for("the matcher to unload", || {
        let mut c = client_clone(&admin);
        async move { active(&mut c, "matcher").await.is_none() }
    })
    .await;

    // A tenant's policy dropped in before the tenant exists waits for it: it
    // loads once `tenant add` has made the slot's tenant, file untouched.
    let tenant_policy = arbiter_policies::fixture("tenant-deadline-first").unwrap();
    std::fs::write(dir.join("tenant:acme.wasm"), tenant_policy).unwrap();
    // Longer than the directory's 2 s poll: it has been tried and refused.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(active(&mut admin, "tenant:acme").await.is_none());
    add_tenant(&mut admin, "acme", 0).await;
    wait_for("the tenant's policy to load", || {
        let mut c = client_clone(&admin);
        async move {
            active(&mut c, "tenant:acme")
                .await
                .is_some_and(|g| g.name == "tenant-deadline-first")
        }
    })
    .await;

    // Restarted with the same files: the generation already serving them is
    // adopted, not loaded again.
    let before = slots(&mut admin).await;
    running.shutdown().await.unwrap();
    let running = serve_watching(data.path(), dir).await;
    let mut admin = client(&running, Some(&token)).await;
    let after = slots(&mut admin).await;
    let ids = |s: &[(String, Vec<v1::GenerationInfo>)], slot: &str| -> Vec<(u64, bool)> {
        s.iter()
            .filter(|(name, _)| name == slot)
            .flat_map(|(_, gs)| gs.iter().map(|g| (g.id, g.active)))
            .collect()
    };
    assert_eq!(ids(&after, "default"), ids(&before, "default"));
    assert_eq!(active(&mut admin, "default").await.unwrap().id, tuned.id);

    // `default`'s active generation is never unloaded, file or not: the
    // cluster keeps a scheduler.
    std::fs::remove_file(dir.join("default.wasm")).unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(active(&mut admin, "default").await.unwrap().id, tuned.id);
    let job = submit(&mut admin, spec("still-scheduled", 1, 50)).await;
    wait_state(&admin, job, v1::JobState::Succeeded).await;
    running.shutdown().await.unwrap();
}
