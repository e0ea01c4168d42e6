//! `arbiter sim` without the rest of the CLI: handy for timing runs.
//! `cargo run --release -p arbiter-sim --example sim -- --help`

use clap::Parser;

#[derive(Parser)]
#[command(name = "sim", about = "Arbiter simulator (the `arbiter sim` flags)")]
struct Cli {
    #[command(flatten)]
    args: arbiter_repro::SimArgs,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let output = arbiter_repro::run(&cli.args)?;
    output.print(cli.args.json)
}
