//! The watched policy directory: drop in, replace, remove, and garbage.

use arbiter_host::registry::Registry;
use arbiter_host::runtime::{PolicyEngine, RuntimeConfig};
use arbiter_host::watch::PolicyDirectory;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn registry() -> Arc<Registry> {
    Arc::new(Registry::new(
        // No policy here hangs: a deadline no stall of a loaded machine reaches.
        PolicyEngine::new(RuntimeConfig {
            deadline: std::time::Duration::from_secs(30),
            ..RuntimeConfig::default()
        })
        .unwrap(),
    ))
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn reconcile_loads_replaces_and_unloads() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = registry();
    let dir = PolicyDirectory::new(tmp.path(), reg.clone());
    let fifo = tmp.path().join("fifo.wasm");
    std::fs::write(&fifo, arbiter_policies::get("fifo").unwrap()).unwrap();
    std::fs::write(tmp.path().join("fifo.toml"), "# fifo takes no options\n").unwrap();
    std::fs::write(tmp.path().join("notes.txt"), "ignored").unwrap();
    let r = dir.reconcile();
    assert_eq!(r.loaded.len(), 1, "{r:?}");
    let slot = reg.find("fifo").unwrap();
    let g1 = slot.active().unwrap();
    assert_eq!(g1.config, "# fifo takes no options\n");
    // Nothing changed: nothing happens.
    assert_eq!(dir.reconcile(), Default::default());

    // A broken file is reported once, not retried until it changes, and hurts nothing.
    std::fs::write(tmp.path().join("broken.wasm"), b"\0asm\x01\0\0\0garbage").unwrap();
    let r = dir.reconcile();
    assert_eq!(r.failed.len(), 1);
    assert!(dir.reconcile().failed.is_empty());
    assert_eq!(slot.active_id(), Some(g1.id));

    // A file larger than any component is refused after a bounded read (it is sparse
    // here: no disk is spent), not read whole into memory.
    let huge = std::fs::File::create(tmp.path().join("huge.wasm")).unwrap();
    huge.set_len(arbiter_host::files::MAX_COMPONENT_FILE + 1)
        .unwrap();
    drop(huge);
    let r = dir.reconcile();
    assert_eq!(r.failed.len(), 1, "{r:?}");
    assert!(r.failed[0].1.contains("larger than 64 MiB"), "{r:?}");
    // Reported once, like a file that does not compile, while it stays as it is.
    assert_eq!(dir.reconcile(), Default::default());
    std::fs::remove_file(tmp.path().join("huge.wasm")).unwrap();
    assert_eq!(slot.active_id(), Some(g1.id));

    // A FIFO (or a directory) named `*.wasm` is said once, and never opened: opening a
    // FIFO would block the watcher until something wrote to it.
    let pipe = tmp.path().join("pipe.wasm");
    let made = std::process::Command::new("mkfifo")
        .arg(&pipe)
        .status()
        .unwrap();
    assert!(made.success());
    let r = dir.reconcile();
    assert_eq!(r.failed.len(), 1, "{r:?}");
    assert!(r.failed[0].1.ends_with("is not a regular file"), "{r:?}");
    assert_eq!(dir.reconcile(), Default::default());
    std::fs::remove_file(&pipe).unwrap();

    // A loaded file that cannot be read any more keeps its generation (it is not gone),
    // and says why once.
    let loaded_file = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    loaded_file
        .set_len(arbiter_host::files::MAX_COMPONENT_FILE + 1)
        .unwrap();
    let r = dir.reconcile();
    assert!(r.unloaded.is_empty() && r.failed.len() == 1, "{r:?}");
    assert_eq!(slot.active_id(), Some(g1.id));
    std::fs::write(&fifo, arbiter_policies::get("fifo").unwrap()).unwrap();
    assert_eq!(dir.reconcile(), Default::default());

    // Same file, another policy: the new slot loads, the old generation unloads.
    std::fs::write(&fifo, arbiter_policies::get("sjf").unwrap()).unwrap();
    let r = dir.reconcile();
    assert_eq!(r.loaded.len(), 1);
    assert!(reg.find("sjf").unwrap().active().is_some());
    assert!(slot.active().is_none());

    std::fs::remove_file(&fifo).unwrap();
    let r = dir.reconcile();
    assert_eq!(r.unloaded.len(), 1);
    assert!(reg.find("sjf").unwrap().active().is_none());
}

#[test]
fn watcher_follows_the_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = registry();
    let dir = Arc::new(PolicyDirectory::new(
        tmp.path().join("policies.d"),
        reg.clone(),
    ));
    let _guard = dir.clone().watch(Duration::from_millis(200)).unwrap();
    let file = tmp.path().join("policies.d").join("best-fit.wasm");
    // Write elsewhere and rename in, as an operator's `install` or `mv` does.
    let staged = tmp.path().join("staged.wasm");
    std::fs::write(&staged, arbiter_policies::get("best-fit").unwrap()).unwrap();
    std::fs::rename(&staged, &file).unwrap();
    wait_for("best-fit to load", || {
        reg.find("best-fit").is_some_and(|s| s.active().is_some())
    });
    std::fs::remove_file(&file).unwrap();
    wait_for("best-fit to unload", || {
        reg.find("best-fit").is_some_and(|s| s.active().is_none())
    });
}

/// `NAME.toml` is part of the policy: an edit loads a new generation with it, one the
/// policy refuses (or one that cannot be read) is said once and the running generation
/// stays, and removing it goes back to the policy's default configuration. It had been
/// read only when the component changed, and read as "none" when unreadable.
#[test]
fn the_configuration_beside_a_component_is_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = registry();
    let dir = PolicyDirectory::new(tmp.path(), reg.clone());
    std::fs::write(
        tmp.path().join("fifo.wasm"),
        arbiter_policies::get("fifo").unwrap(),
    )
    .unwrap();
    let toml = tmp.path().join("fifo.toml");
    std::fs::write(&toml, "# one\n").unwrap();
    assert_eq!(dir.reconcile().loaded.len(), 1);
    let slot = reg.find("fifo").unwrap();
    assert_eq!(slot.active().unwrap().config, "# one\n");

    // An edit to the configuration alone is a new generation.
    std::fs::write(&toml, "# two\n").unwrap();
    let r = dir.reconcile();
    assert_eq!(r.loaded.len(), 1, "{r:?}");
    let two = slot.active().unwrap();
    assert_eq!(two.config, "# two\n");

    // A configuration the policy refuses: said once, the running generation stays.
    std::fs::write(&toml, "bogus = 1\n").unwrap();
    let r = dir.reconcile();
    assert!(r.loaded.is_empty() && r.failed.len() == 1, "{r:?}");
    assert!(r.failed[0].1.contains("bogus"), "{r:?}");
    assert_eq!(dir.reconcile(), Default::default());
    assert_eq!(slot.active_id(), Some(two.id));

    // One that cannot be read — not UTF-8, a FIFO — is not "no configuration".
    std::fs::write(&toml, b"# \xff\n").unwrap();
    let r = dir.reconcile();
    assert!(r.loaded.is_empty() && r.failed.len() == 1, "{r:?}");
    assert!(r.failed[0].1.contains("not UTF-8"), "{r:?}");
    assert_eq!(dir.reconcile(), Default::default());
    std::fs::remove_file(&toml).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&toml)
        .status()
        .unwrap();
    assert!(made.success());
    let r = dir.reconcile();
    assert!(r.failed.len() == 1 && r.unloaded.is_empty(), "{r:?}");
    assert!(r.failed[0].1.ends_with("is not a regular file"), "{r:?}");
    assert_eq!(slot.active_id(), Some(two.id));

    // No configuration: the policy's default.
    std::fs::remove_file(&toml).unwrap();
    let r = dir.reconcile();
    assert_eq!(r.loaded.len(), 1, "{r:?}");
    let default = slot.active().unwrap();
    assert_ne!(default.id, two.id);
    assert_eq!(default.config, "");
}
