//! How the `arbiter` command line behaves toward the person using it: output
//! into a closed pipe ends quietly, a duration without a unit is refused,
//! host names are accepted where addresses are, errors say each cause once,
//! and the everyday commands (`nodes ls`/`drain`/`undrain`, `describe`, bulk
//! `cancel`, `ab ls`) work against a real `arbiter serve`.

use std::process::{Command, Stdio};

mod common;

use common::{BIN, cli_json, cli_text, serve};

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    // The reading end is closed before the program writes anything: its
    // first write fails with EPIPE.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(BIN)
        .args(["policy", "ls"])
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(141), "{stderr}");
}

#[test]
fn a_duration_without_a_unit_is_refused_and_errors_say_each_cause_once() {
    let out = Command::new(BIN)
        .args(["submit", "--name", "x", "--duration", "30"])
        .args(["--server", "http://127.0.0.1:1", "--token", "t"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("30s") && stderr.contains("30ms"),
        "{stderr}"
    );

    // Nothing listens on port 1: the connection error, each cause once.
    let out = Command::new(BIN)
        .args(["jobs", "--server", "http://127.0.0.1:1", "--token", "t"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.lines().last().unwrap_or_default();
    let causes: Vec<&str> = line.split(": ").collect();
    let mut seen = std::collections::HashSet::new();
    for c in &causes {
        assert!(seen.insert(*c), "`{c}` said twice: {line}");
    }
}

/// Connection options before the command reach it: the error names the server given
/// first, not the default one.
#[test]
fn connection_options_before_the_command_reach_it() {
    let out = Command::new(BIN)
        .args(["--server", "http://127.0.0.1:1", "--token", "t", "jobs"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("127.0.0.1:1"), "{stderr}");

    // The node agent's token, required, may come before the command too; with none at
    // all the agent says where to find one before it starts anything.
    let state = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["node", "--name", "n1", "--sim-gpus", "1", "--state-dir"])
        .arg(state.path())
        .env_remove("ARBITER_TOKEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("no --token given") && stderr.contains("node.token"),
        "{stderr}"
    );
}

/// `policy ls --dir` lists what it can and says why it cannot list the rest: a FIFO
/// named like a component is not opened (the listing blocked on it until something wrote
/// to it), a file that is not a component is a row with its error, and neither stops the
/// rows after it.
#[test]
fn policy_ls_lists_a_directory_past_files_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new("mkfifo")
        .arg(dir.path().join("a-fifo.wasm"))
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::write(dir.path().join("b-text.wasm"), "not a component").unwrap();
    std::fs::write(
        dir.path().join("c-fifo.wasm"),
        arbiter_policies::get("fifo").unwrap(),
    )
    .unwrap();
    // Output to files, not pipes: the listing is larger than a pipe holds, and this
    // test reads it only once the command has ended.
    let out_dir = tempfile::tempdir().unwrap();
    let (stdout, stderr) = (out_dir.path().join("out"), out_dir.path().join("err"));
    let mut child = Command::new(BIN)
        .args(["policy", "ls", "--json", "--dir"])
        .arg(dir.path())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("`policy ls --dir` blocked on the FIFO");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        child.wait().unwrap().success(),
        "{}",
        std::fs::read_to_string(&stderr).unwrap()
    );
    let rows: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&stdout).unwrap()).unwrap();
    let row = |file: &str| {
        rows.iter()
            .find(|r| r["source"].as_str().is_some_and(|s| s.ends_with(file)))
            .unwrap_or_else(|| panic!("no row for {file}: {rows:?}"))
    };
    let fifo_error = row("a-fifo.wasm")["error"].as_str().unwrap_or_default();
    assert!(
        fifo_error.ends_with("is not a regular file"),
        "{fifo_error}"
    );
    assert_eq!(row("b-text.wasm")["ok"], false);
    assert_eq!(row("c-fifo.wasm")["ok"], true);
    assert_eq!(row("c-fifo.wasm")["name"], "fifo");
}

/// `sim --config` means one thing for every protocol: a file if there is one, else TOML
/// text. It was text for the policy protocols (a file name reached FGD as TOML, and a
/// policy without options ignored it) and a file for the paper protocols. A policy
/// without options refuses a configuration that sets one.
#[test]
fn sim_config_is_a_file_or_toml_text_and_a_policy_without_options_refuses_one() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fgd.toml");
    std::fs::write(&file, "bogus = 1\n").unwrap();
    let sim = |policy: &str, config: &str| {
        Command::new(BIN)
            .args(["sim", "--policy", policy, "--config", config])
            .output()
            .unwrap()
    };
    let file = file.to_str().unwrap();
    for (policy, config, says) in [
        // The file's content reached the policy: FGD names the key it does not know.
        ("fgd", file, "unknown key `bogus`"),
        ("fgd", "bogus = 1", "unknown key `bogus`"),
        (
            "best-fit",
            file,
            "takes no configuration options; `bogus = 1` sets one",
        ),
        (
            "best-fit",
            "nope.toml",
            "no file `nope.toml`, and not TOML text",
        ),
    ] {
        let out = sim(policy, config);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{policy} {config}: {stderr}");
        assert!(stderr.contains(says), "{policy} {config}: {stderr}");
    }
    let out = sim("best-fit", "# no options\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `sim --fuel`: what the policy consumed in fuel, reported per run and the same in two
/// runs of the same seed (its time inside the policy is not); a budget too small to load
/// the policy is an error; the paper protocols refuse the option.
#[test]
fn sim_fuel_is_the_policys_cost_and_the_same_in_every_run() {
    let sim = |args: &[&str]| Command::new(BIN).arg("sim").args(args).output().unwrap();
    let fuel_of = |budget: &str| -> (u64, u64) {
        let out = sim(&["--fuel", budget, "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let run = &json["runs"][0];
        (
            run["policy_fuel"].as_u64().unwrap_or(0),
            run["fallback_rounds"].as_u64().unwrap_or(0),
        )
    };
    let (first, fallbacks) = fuel_of("4000000000");
    assert!(first > 0 && fallbacks == 0, "{first} {fallbacks}");
    assert_eq!(fuel_of("4000000000"), (first, 0));
    // Too little to load the policy: said before anything runs.
    let out = sim(&["--fuel", "1000"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("ran out of fuel"),
        "{stderr}"
    );
    // Without metering, no fuel in the report.
    let out = sim(&["--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(json["runs"][0].get("policy_fuel").is_none(), "{json}");
    let out = sim(&["--protocol", "dynamoml", "--fuel", "1000"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--fuel meters"),
        "{stderr}"
    );
}

/// An embedded pool one machine cannot hold, or a node past the contract's GPU count, is
/// a usage error: the first aborted allocating 9.6 GB, the second overflowed a
/// multiplication (a panic in a debug build, a wrong pool in a release one).
#[test]
fn an_embedded_pool_out_of_range_is_refused_before_anything_starts() {
    for (flag, value) in [("--nodes", "100000000"), ("--gpus-per-node", "100000")] {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(BIN)
            .args(["serve", flag, value, "--listen", "127.0.0.1:0"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("is not in"), "{stderr}");
        assert!(!dir.path().join("arbiter-data").exists(), "nothing written");
    }
}

/// openb's `multigpu*` variants have no time columns: replayed, nothing
/// ever departs, and the run says so rather than print a JCT of 0 s as if
/// measured. The FGD protocol on the same files says nothing.
#[test]
fn a_replay_of_a_trace_without_times_says_it_has_none() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = dir.path().join("nodes.csv");
    let pods = dir.path().join("pods.csv");
    std::fs::write(
        &nodes,
        "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,8,V100M32\n",
    )
    .unwrap();
    std::fs::write(
        &pods,
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,4000,8192,2,1000\np1,2000,4096,1,500\n",
    )
    .unwrap();
    let sim = |protocol: &str| {
        Command::new(BIN)
            .args(["sim", "--protocol", protocol, "--nodes"])
            .arg(&nodes)
            .arg("--trace")
            .arg(&pods)
            .output()
            .unwrap()
    };
    let replay = sim("replay");
    let stderr = String::from_utf8_lossy(&replay.stderr);
    assert!(replay.status.success(), "{stderr}");
    assert!(
        stderr.contains("no time columns") && stderr.contains("--protocol fgd"),
        "{stderr}"
    );
    let fgd = sim("fgd");
    let stderr = String::from_utf8_lossy(&fgd.stderr);
    assert!(fgd.status.success(), "{stderr}");
    assert!(!stderr.contains("no time columns"), "{stderr}");
}

#[test]
fn everyday_commands_against_a_live_plane() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // A host name where an address goes.
    let server = serve(&data, "localhost:0");
    let admin = std::fs::read_to_string(data.join("admin.token"))
        .unwrap()
        .trim()
        .to_string();
    let url = server.url.clone();

    // `nodes ls` is the node table, not `top`'s overview.
    let table = cli_text(&url, &admin, &["nodes", "ls"]);
    assert!(table.starts_with("NODE"), "{table}");
    let drained = cli_json(&url, &admin, &["nodes", "drain", "sim-00"]);
    assert_eq!(drained["state"], "draining", "{drained}");
    let back = cli_json(&url, &admin, &["nodes", "undrain", "sim-00"]);
    assert_eq!(back["state"], "ready", "{back}");

    // `default` is not a tenant one can add; jobs for an unknown tenant are refused.
    let refused = Command::new(BIN)
        .args([
            "tenant", "add", "default", "--server", &url, "--token", &admin,
        ])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("reserved"));
    let ghost = Command::new(BIN)
        .args(["submit", "--name", "g", "--tenant", "ghost"])
        .args(["--server", &url, "--token", &admin])
        .output()
        .unwrap();
    assert!(!ghost.status.success());
    assert!(String::from_utf8_lossy(&ghost.stderr).contains("no tenant `ghost`"));

    // Describe one job; cancel several at once.
    let ids: Vec<String> = (0..3)
        .map(|i| {
            let j = cli_json(
                &url,
                &admin,
                &[
                    "submit",
                    "--name",
                    &format!("j{i}"),
                    "--gpus",
                    "8",
                    "--duration",
                    "10m",
                ],
            );
            j["id"].to_string()
        })
        .collect();
    let one = cli_json(&url, &admin, &["describe", &ids[0]]);
    assert_eq!(one["name"], "j0", "{one}");
    let text = cli_text(&url, &admin, &["describe", &ids[0]]);
    assert!(
        text.lines()
            .any(|l| l.starts_with("name") && l.ends_with("j0")),
        "{text}"
    );
    let mut args = vec!["cancel"];
    args.extend(ids.iter().map(String::as_str));
    let cancelled = cli_json(&url, &admin, &args);
    assert_eq!(
        cancelled["cancelled"].as_array().map(Vec::len),
        Some(3),
        "{cancelled}"
    );

    // `ab ls` lists experiments (none yet).
    let experiments = cli_json(&url, &admin, &["ab", "ls"]);
    assert_eq!(
        experiments.as_array().map(Vec::len),
        Some(0),
        "{experiments}"
    );
    // `ab stop` is `ab abort` by its other name: the same refusal for an
    // experiment that does not exist.
    let refusals: Vec<String> = ["abort", "stop"]
        .iter()
        .map(|verb| {
            let out = Command::new(BIN)
                .args(["ab", verb, "ghost", "--server", &url, "--token", &admin])
                .output()
                .unwrap();
            assert!(!out.status.success(), "ab {verb} ghost succeeded");
            String::from_utf8_lossy(&out.stderr).into_owned()
        })
        .collect();
    assert!(refusals[0].contains("ghost"), "{}", refusals[0]);
    assert_eq!(refusals[0], refusals[1]);

    // Tokens rotate: the old one stops working at once, the new one works,
    // and the admin token file follows.
    let team = cli_json(&url, &admin, &["tenant", "add", "team"]);
    let old_team = team["token"].as_str().unwrap().to_string();
    let rotated = cli_json(&url, &admin, &["tenant", "rotate", "team"]);
    let new_team = rotated["token"].as_str().unwrap().to_string();
    assert_ne!(old_team, new_team);
    let refused = Command::new(BIN)
        .args(["jobs", "--server", &url, "--token", &old_team])
        .output()
        .unwrap();
    assert!(
        !refused.status.success(),
        "the old tenant token still works"
    );
    cli_json(&url, &new_team, &["jobs"]);
    let new_admin = cli_json(&url, &admin, &["token", "rotate", "admin"])["token"]
        .as_str()
        .unwrap()
        .to_string();
    let on_disk = std::fs::read_to_string(data.join("admin.token")).unwrap();
    assert_eq!(on_disk.trim(), new_admin);
    let refused = Command::new(BIN)
        .args(["jobs", "--server", &url, "--token", &admin])
        .output()
        .unwrap();
    assert!(!refused.status.success(), "the old admin token still works");
    // A tenant with live jobs stays; without, it goes, and its token with it.
    cli_json(
        &url,
        &new_team,
        &["submit", "--name", "live", "--duration", "10m"],
    );
    let busy = Command::new(BIN)
        .args([
            "tenant", "rm", "team", "--server", &url, "--token", &new_admin,
        ])
        .output()
        .unwrap();
    assert!(!busy.status.success());
    assert!(String::from_utf8_lossy(&busy.stderr).contains("live jobs"));
    let live: Vec<String> = cli_json(&url, &new_team, &["jobs"])
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].to_string())
        .collect();
    let mut args = vec!["cancel"];
    args.extend(live.iter().map(String::as_str));
    cli_json(&url, &new_team, &args);
    cli_json(&url, &new_admin, &["tenant", "rm", "team"]);
    let gone = Command::new(BIN)
        .args(["jobs", "--server", &url, "--token", &new_team])
        .output()
        .unwrap();
    assert!(
        !gone.status.success(),
        "a removed tenant's token still works"
    );
}

/// A node agent the plane refuses for a reason the next attempt would repeat — a name it
/// cannot take, a token it does not know — says why and exits, instead of retrying (and
/// warning) for ever.
#[test]
fn a_node_agent_the_plane_refuses_says_why_and_exits() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = serve(&data, "127.0.0.1:0");
    let node_token = std::fs::read_to_string(data.join("node.token"))
        .unwrap()
        .trim()
        .to_string();
    for (name, token, says) in [
        ("a b", node_token.as_str(), "node name must be"),
        ("n1", "not-a-token", "unknown token"),
    ] {
        let mut child = Command::new(BIN)
            .args(["node", "--server", &server.url, "--token", token])
            .args(["--name", name, "--sim-gpus", "1"])
            .arg("--state-dir")
            .arg(dir.path().join(format!("state-{}", name.len())))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Before the fix it never ended: bound the wait, far above the one attempt it takes.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("`arbiter node --name {name:?}` still retrying after 60 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("refuses this node") && stderr.contains(says),
            "{stderr}"
        );
    }
}

/// `arbiter node --policy-config`: a configuration the node's policy refuses stops the agent
/// before it starts, saying why (not a node running its policy's defaults instead), and one
/// given to `--policy none` is refused as a contradiction.
#[test]
fn a_node_policy_configuration_the_policy_refuses_stops_the_agent_with_the_reason() {
    let state = tempfile::tempdir().unwrap();
    let config = state.path().join("sysmonitor.toml");
    std::fs::write(&config, "unhealthy_share_cap = 0").unwrap();
    let run = |policy: &str| {
        // `timeout`: an agent that started would retry its link to the (absent) plane forever.
        let out = Command::new("timeout")
            .arg("120")
            .arg(BIN)
            .args(["node", "--server", "http://127.0.0.1:1", "--token", "t"])
            .args(["--name", "n1", "--sim-gpus", "1", "--policy", policy])
            .arg("--state-dir")
            .arg(state.path().join("state"))
            .arg("--policy-config")
            .arg(&config)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let refused = run("sysmonitor");
    assert!(
        refused.contains("node policy sysmonitor") && refused.contains("unhealthy_share_cap"),
        "{refused}"
    );
    let contradiction = run("none");
    assert!(
        contradiction.contains("--policy-config configures --policy, and --policy is none"),
        "{contradiction}"
    );
}
