//! `arbiter`: the Arbiter command line.
//!
//! Human output by default, `--json` for scripts. Every failure exits non-zero
//! with a one-line cause chain on standard error.

#![forbid(unsafe_code)]

mod client;
mod node;
mod policy;
mod serve;

use arbiter_proto::endpoint::cause_line;
use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "arbiter",
    version,
    about = "WebAssembly-pluggable policy host for GPU clusters"
)]
struct Cli {
    /// Log filter (`RUST_LOG` syntax), e.g. `info` or `arbiter_host=debug`.
    #[arg(long, global = true, default_value = "warn")]
    log: String,
    /// Logs as JSON lines.
    #[arg(long, global = true)]
    log_json: bool,
    #[command(flatten)]
    conn: ConnBeforeCommand,
    #[command(subcommand)]
    command: Command,
}

/// The connection options, accepted before the command too (`arbiter --server URL jobs`,
/// `arbiter ab --token T status`), as `kubectl` and `docker` take theirs. Hidden here: each
/// command that connects documents its own, and clap hands a value given here down to the
/// command's option of the same name (the command's own, if given too, wins). No default
/// and no environment variable here, so only what was typed travels down.
#[derive(clap::Args)]
struct ConnBeforeCommand {
    #[arg(long, global = true, hide = true)]
    server: Option<String>,
    #[arg(long, global = true, hide = true)]
    token: Option<String>,
    #[arg(long, global = true, hide = true)]
    ca_cert: Option<std::path::PathBuf>,
    #[arg(long, global = true, hide = true)]
    json: bool,
}

/// The ids of [`ConnBeforeCommand`]'s options.
const CONN_OPTIONS: [&str; 4] = ["server", "token", "ca_cert", "json"];

/// Parses the command line. A connection option given before a command that has no such
/// option of its own (`arbiter --server URL serve`) is a usage error, not ignored.
fn parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut command = <Cli as clap::CommandFactory>::command();
    let matches = command.clone().try_get_matches_from(args)?;
    conn_options_apply(&mut command, &matches)?;
    <Cli as clap::FromArgMatches>::from_arg_matches(&matches)
}

fn conn_options_apply(
    command: &mut clap::Command,
    matches: &clap::ArgMatches,
) -> Result<(), clap::Error> {
    command.build();
    let (mut leaf, mut leaf_matches, mut path) = (&*command, matches, String::from("arbiter"));
    while let Some((name, sub_matches)) = leaf_matches.subcommand() {
        let Some(sub) = leaf.find_subcommand(name) else {
            break;
        };
        path = format!("{path} {name}");
        (leaf, leaf_matches) = (sub, sub_matches);
    }
    for id in CONN_OPTIONS {
        let own = leaf
            .get_arguments()
            .any(|arg| arg.get_id() == id && !arg.is_hide_set());
        let typed = leaf_matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
        if typed && !own {
            let flag = id.replace('_', "-");
            return Err(command.error(
                clap::error::ErrorKind::ArgumentConflict,
                format!(
                    "`--{flag}` does not apply to `{path}`, which connects to no control plane"
                ),
            ));
        }
    }
    Ok(())
}

#[derive(Subcommand)]
enum Command {
    /// Inspect and manage policies.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Run the simulator: a built-in example cluster, or real traces.
    Sim(arbiter_repro::SimArgs),
    /// Run the control plane (gRPC API, rounds, experiments, journal).
    Serve(serve::ServeArgs),
    /// Submit a job.
    Submit(client::SubmitArgs),
    /// List jobs.
    Jobs(client::JobsArgs),
    /// Cancel jobs.
    Cancel(client::CancelArgs),
    /// One job in full: where it runs, why it waits, what it reported.
    Describe(client::DescribeJobArgs),
    /// Tell the policies what a job has left to run.
    Progress(client::ProgressArgs),
    /// Tell the policies an inference job's request rate and latency.
    Service(client::ServiceArgs),
    /// A/B experiments: split and shadow.
    #[command(subcommand)]
    Ab(client::AbCommand),
    /// Cluster overview: policy, jobs, nodes.
    Top(client::TopArgs),
    /// Nodes of the control plane.
    #[command(subcommand)]
    Nodes(client::NodesCommand),
    /// Tenants and their tokens.
    #[command(subcommand)]
    Tenant(client::TenantCommand),
    /// The admin's and the nodes' tokens.
    #[command(subcommand)]
    Token(client::TokenCommand),
    /// Replay a decision journal bit for bit, and run a counterfactual.
    Replay(serve::ReplayArgs),
    /// Run a node agent: supervise workloads on this machine's GPUs for a control plane.
    Node(node::NodeArgs),
}

/// Runs a client future on a small runtime.
pub(crate) fn block_on<F: std::future::Future<Output = anyhow::Result<()>>>(
    f: F,
) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

fn init_logging(filter: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(filter))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Colours only for a terminal: redirected logs stay plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn sim(args: &arbiter_repro::SimArgs) -> anyhow::Result<()> {
    if args.fuel.is_some()
        && !matches!(
            args.protocol,
            None | Some(arbiter_sim::Protocol::Replay | arbiter_sim::Protocol::Fgd)
        )
    {
        anyhow::bail!(
            "--fuel meters the replay and fgd protocols; the paper protocols run their own \
             settings"
        );
    }
    match args.protocol {
        Some(arbiter_sim::Protocol::Aryl) => {
            return arbiter_repro::aryl::run_protocol(args)?.print(args.json);
        }
        Some(arbiter_sim::Protocol::Dynamoml) => {
            return arbiter_repro::dynamoml::run_protocol(args)?.print(args.json);
        }
        Some(arbiter_sim::Protocol::Antman) => {
            return arbiter_repro::antman::run_protocol(args)?.print(args.json);
        }
        Some(arbiter_sim::Protocol::AntmanTrace) => {
            return arbiter_repro::antman::run_trace_protocol(args)?.print(args.json);
        }
        Some(arbiter_sim::Protocol::Muxflow) => {
            return arbiter_repro::muxflow::run_protocol(args)?.print(args.json);
        }
        _ => {}
    }
    arbiter_repro::run(args)?.print(args.json)
}

/// `arbiter top | head -3`: the reader went away. Rust ignores SIGPIPE, so
/// the next print fails and `println!` panics; end quietly instead, with
/// the status a Unix tool killed by SIGPIPE has (128 + 13).
fn quiet_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

fn main() -> ExitCode {
    quiet_on_broken_pipe();
    let cli = parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit());
    init_logging(&cli.log, cli.log_json);
    let result = match &cli.command {
        Command::Policy(cmd) => policy::run(cmd),
        Command::Sim(args) => sim(args),
        Command::Serve(args) => serve::serve(args),
        Command::Submit(a) => block_on(client::submit(a)),
        Command::Jobs(a) => block_on(client::jobs(a)),
        Command::Cancel(a) => block_on(client::cancel(a)),
        Command::Describe(a) => block_on(client::describe_job(a)),
        Command::Progress(a) => block_on(client::progress(a)),
        Command::Service(a) => block_on(client::service(a)),
        Command::Ab(cmd) => block_on(client::ab(cmd)),
        Command::Top(a) => block_on(client::every(a.watch, || client::top(&a.conn))),
        Command::Nodes(cmd) => block_on(client::nodes(cmd)),
        Command::Tenant(cmd) => block_on(client::tenant(cmd)),
        Command::Token(cmd) => block_on(client::token_command(cmd)),
        Command::Replay(a) => serve::replay(a),
        Command::Node(a) => node::node(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("arbiter: {}", cause_line(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &str) -> Result<Cli, String> {
        parse_from(args.split_whitespace()).map_err(|e| e.to_string())
    }

    fn conn_of(args: &str) -> client::Conn {
        match parsed(args)
            .unwrap_or_else(|e| panic!("{args}: {e}"))
            .command
        {
            Command::Jobs(a) => a.conn,
            Command::Ab(client::AbCommand::Status(a)) => a.conn,
            _ => panic!("{args}: not a command this test reads"),
        }
    }

    #[test]
    fn connection_options_may_come_before_the_command() {
        let c = conn_of("arbiter --server http://plane:1 --token T --json jobs");
        assert_eq!(
            (c.server.as_str(), c.token.as_deref(), c.json),
            ("http://plane:1", Some("T"), true)
        );
        // Before a command group, and the command's own value wins over the earlier one.
        let c = conn_of("arbiter ab --token T --ca-cert ca.pem status e1");
        assert_eq!(c.token.as_deref(), Some("T"));
        assert_eq!(c.ca_cert, Some("ca.pem".into()));
        let c = conn_of("arbiter --server http://a:1 jobs --server http://b:2");
        assert_eq!(c.server, "http://b:2");
        // Nothing typed: the command's default (or environment) stands.
        assert!(!conn_of("arbiter jobs").server.is_empty());
        assert_eq!(conn_of("arbiter jobs").token, None);
        // A command that connects nowhere refuses them rather than ignoring them.
        for args in [
            "arbiter --server http://a:1 serve",
            "arbiter --token T sim",
            "arbiter policy --ca-cert ca.pem check fifo",
        ] {
            let error = parsed(args)
                .err()
                .unwrap_or_else(|| panic!("{args} parsed"));
            assert!(
                error.contains("does not apply to `arbiter "),
                "{args}: {error}"
            );
        }
        // A required option given before the command: `node`'s token is checked after
        // parsing, so the earlier one counts.
        assert!(matches!(
            parsed("arbiter --token T node --name n1 --state-dir d").map(|c| c.command),
            Ok(Command::Node(node::NodeArgs { token: Some(t), .. })) if t == "T"
        ));
        // Where the command has the option itself, it is that option.
        assert!(parsed("arbiter --json sim").is_ok());
        assert!(matches!(
            parsed("arbiter --server http://a:1 policy ls").map(|c| c.command),
            Ok(Command::Policy(policy::PolicyCommand::Ls(policy::LsArgs { server: Some(s), .. }))) if s == "http://a:1"
        ));
    }

    #[test]
    fn a_service_rate_past_the_wire_s_range_is_refused_at_the_command_line() {
        // 1e308 is finite, but as the wire's f32 it is infinity.
        for rate in ["1e308", "inf", "NaN", "-1", "fast"] {
            let error = parsed(&format!(
                "arbiter service 2 --rps={rate} --p50 1ms --p99 2ms"
            ))
            .err()
            .unwrap_or_else(|| panic!("{rate} accepted"));
            assert!(error.contains("is not a rate"), "{rate}: {error}");
        }
        assert!(matches!(
            parsed("arbiter service 2 --rps 3.5e3 --p50 1ms --p99 2ms").map(|c| c.command),
            Ok(Command::Service(client::ServiceArgs { rps, .. })) if rps == 3500.0
        ));
    }

    /// The wire reads a zero as "the default": a typed zero (or anything out of range) is
    /// refused where it was typed, not replaced.
    #[test]
    fn an_experiment_s_guardrail_out_of_range_is_refused_at_the_command_line() {
        for flag in [
            "--alpha 0",
            "--alpha 0.5",
            "--alpha=-0.1",
            "--share 0",
            "--share 1",
            "--min-effect 0",
            "--min-effect 11",
            "--min-samples 0",
            "--max-faults 0",
        ] {
            let args = format!("arbiter ab start e1 --candidate c {flag}");
            assert!(parsed(&args).is_err(), "{flag} accepted");
        }
        let ok = "arbiter ab start e1 --candidate c --alpha 0.01 --share 0.2 --min-effect 10";
        assert!(parsed(ok).is_ok(), "{:?}", parsed(ok).err());
    }

    /// A node agent refuses, where it is typed, what the plane would refuse at every
    /// reconnect (no GPUs, more than a node may have) or what would spin its policy.
    #[test]
    fn a_node_agent_s_simulated_gpus_and_period_are_checked_at_the_command_line() {
        let base = "arbiter node --token t --state-dir s --name n";
        for flags in [
            "--sim-gpus 0",
            "--sim-gpus 1025",
            "--sim-gpus 2 --sim-gpu-memory-mib 0",
            "--sim-gpus 2 --sim-gpu-memory-mib 1152921504606846976",
            "--sim-gpus 2 --period 0ms",
            "--sim-gpus 2 --period 2h",
        ] {
            assert!(
                parsed(&format!("{base} {flags}")).is_err(),
                "{flags} accepted"
            );
        }
        assert!(parsed(&format!("{base} --sim-gpus 1024 --period 10ms")).is_ok());
    }

    #[test]
    fn a_watch_faster_than_a_person_reads_is_refused() {
        for args in ["arbiter top --watch 1ms", "arbiter jobs --watch 0s"] {
            let error = parsed(args)
                .err()
                .unwrap_or_else(|| panic!("{args} accepted"));
            assert!(error.contains("at least 100ms"), "{args}: {error}");
        }
        assert!(parsed("arbiter top --watch 2s").is_ok());
    }

    #[test]
    fn every_flag_says_what_it_is_for() {
        fn missing(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" || arg.is_hide_set() {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    out.push(format!("{path} --{id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                missing(sub, &format!("{path} {}", sub.get_name()), out);
            }
        }
        let mut out = Vec::new();
        missing(
            &<Cli as clap::CommandFactory>::command(),
            "arbiter",
            &mut out,
        );
        assert!(out.is_empty(), "flags without help:\n{}", out.join("\n"));
    }
}
