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
    #[command(subcommand)]
    command: Command,
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
    let cli = Cli::parse();
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
