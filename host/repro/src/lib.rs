//! # Arbiter paper comparisons
//!
//! The `arbiter sim` command and the harnesses that compare the simulator's
//! runs with published figures: which configuration each built-in policy
//! gets (the FGD family's seed and target workload, the Aryl family's seed
//! and speed-up law), the FGD fragmentation measure, the Aryl comparison's
//! cases, constants and headline. The simulator ([`arbiter_sim`]) knows
//! none of this: it runs compiled policies with the configuration text it
//! is given.
//!
//! ```no_run
//! let out = arbiter_repro::run(&arbiter_repro::SimArgs::default())?;
//! out.print(false)?;
//! # Ok::<(), anyhow::Error>(())
//! ```

#![forbid(unsafe_code)]

pub mod antman;
pub mod aryl;
pub mod dynamoml;
pub mod fgd;
pub mod muxflow;
pub mod pai;

use anyhow::{Context, bail};
use arbiter_host::runtime::{CompiledPolicy, PolicyEngine};
use arbiter_policy_sdk::model::Role;
use arbiter_sim::models::{fgd::FgdConfig, replay::ReplayConfig};
use arbiter_sim::prediction::Prediction;
use arbiter_sim::{
    ModelConfig, Protocol, ScenarioSummary, SimOutput, TraceFormat, fgd_summary, parallel_map,
    report, run_many, scenario,
};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A `--prediction` name.
fn parse_prediction(s: &str) -> Result<Prediction, String> {
    match s {
        "none" => Ok(Prediction::None),
        "oracle" => Ok(Prediction::Oracle),
        "best" => Ok(Prediction::Best),
        "group-only" => Ok(Prediction::GroupOnly),
        other => Err(format!(
            "`{other}`: expected none, oracle, best or group-only"
        )),
    }
}

/// `arbiter sim` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct SimArgs {
    /// Policy: a built-in name or a path to a `.wasm` component; several,
    /// comma-separated, to compare them on one scenario.
    #[arg(long, default_value = "best-fit")]
    pub policy: String,
    /// Node list: openb (`sn,cpu_milli,...`) or PAI (`machine,gpu_type,...`), detected by header.
    #[arg(long)]
    pub nodes: Option<PathBuf>,
    /// Task trace: openb pod list or Philly job table (plain or gzip). Without it the built-in example runs.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Trace format, if the header does not tell.
    #[arg(long)]
    pub format: Option<TraceFormat>,
    /// `fgd` (static placement, the FGD paper's protocol), `replay` (time-based; the default),
    /// `aryl` (the Aryl paper's comparison on the Philly trace; `--trace` may name the
    /// Philly job table, `--policy` does not apply), `dynamoml` (DynamoML's §4 scenario
    /// under its Table 2 settings), `antman` (AntMan's Table 2 scenario under its five
    /// settings), `antman-trace` (AntMan's Fig. 13 on the Philly trace) or `muxflow`
    /// (MuxFlow's §7 comparison on the GenAI and Philly traces); for the last four
    /// `--config` may name the scenario's or set-up's TOML and `--policy`, `--nodes` and
    /// `--trace` do not apply.
    #[arg(long)]
    pub protocol: Option<Protocol>,
    /// Seed: task order of the FGD protocol and the policies' tie-breaking.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Runs per policy with seeds `seed`, `seed+1`, ... (the paper uses 10: 42..=51).
    #[arg(long, default_value_t = 1)]
    pub seeds: u32,
    /// FGD protocol: tune the total GPU request to this multiple of capacity.
    #[arg(long, default_value_t = 1.3)]
    pub tune: f64,
    /// Replay: run rounds at most every this many virtual seconds (0 = at every event).
    #[arg(long, default_value_t = 0.0)]
    pub interval_s: f64,
    /// Replay: report every GPU's metrics to the policy this often, in virtual seconds
    /// (the `gpu-metrics` a node agent sends); 0 = never.
    #[arg(long, default_value_t = 0.0)]
    pub gpu_metrics_s: f64,
    /// Replay: what a job's `estimate-ms` says — `none` (the trace's own),
    /// `oracle` (its true run time), `best` (within 25 % for 78 % of jobs,
    /// "MLaaS in the Wild"'s best predictor) or `group-only` (50 %).
    #[arg(long, value_parser = parse_prediction, default_value = "none")]
    pub prediction: Prediction,
    /// A TOML file, or TOML text itself (`'slow_spill = "always"'`): the policy's
    /// configuration instead of the derived one (`seed`, FGD's workload); for the
    /// `dynamoml`, `antman`, `antman-trace` and `muxflow` protocols, the scenario's (see
    /// `docs/reproductions/`).
    #[arg(long)]
    pub config: Option<String>,
    /// Wall-clock bound of one policy call, in milliseconds (the replay, fgd
    /// and aryl protocols; the paper protocols run their settings under 30 s).
    #[arg(long, default_value_t = 10_000)]
    pub deadline_ms: u64,
    /// Meter each policy call in fuel (wasmtime's count of guest instructions),
    /// at most this much per call, and report what the policy consumed: a cost
    /// that is the same on any machine (replay and fgd protocols).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub fuel: Option<u64>,
    /// Runs in parallel (default: the machine's cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print JSON instead of the human summary.
    #[arg(long)]
    pub json: bool,
    /// Write tasks.csv, series.csv and index.html (inline SVG plots) here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Aryl protocol: trace window and cluster size (`ci`, `full` or `paper`; default `ci`).
    #[arg(long, value_enum)]
    pub scale: Option<aryl::ScaleName>,
    /// Aryl protocol: days of the trace window, instead of the scale's.
    #[arg(long)]
    pub days: Option<i64>,
    /// Aryl protocol: keep every n-th job of the window, instead of the scale's.
    #[arg(long)]
    pub sample_every: Option<usize>,
    /// Aryl protocol: training servers, instead of the scale's (the inference pool follows at
    /// 8 : 7 unless `--inference-nodes` is given).
    #[arg(long)]
    pub training_nodes: Option<u32>,
    /// Aryl protocol: inference servers, instead of the scale's.
    #[arg(long)]
    pub inference_nodes: Option<u32>,
}

impl Default for SimArgs {
    fn default() -> Self {
        SimArgs {
            policy: "best-fit".into(),
            nodes: None,
            trace: None,
            format: None,
            protocol: None,
            seed: 42,
            seeds: 1,
            tune: 1.3,
            interval_s: 0.0,
            gpu_metrics_s: 0.0,
            prediction: Prediction::None,
            config: None,
            deadline_ms: 10_000,
            fuel: None,
            threads: None,
            json: false,
            report: None,
            scale: None,
            days: None,
            sample_every: None,
            training_nodes: None,
            inference_nodes: None,
        }
    }
}

/// Compiles the built-in policy `name`.
pub fn compile_builtin(engine: &PolicyEngine, name: &str) -> anyhow::Result<CompiledPolicy> {
    let bytes = arbiter_policies::get(name)
        .with_context(|| format!("`{name}` is not a built-in policy"))?;
    engine
        .compile(bytes)
        .with_context(|| format!("compiling `{name}`"))
}

/// The set-up of a paper's protocol (`dynamoml`, `antman`, `antman-trace`, `muxflow`): these
/// build their own cluster and workload, so `--nodes` and `--trace` are refused; `--config`
/// ([`config_text`]) is read and checked as `C`, and without it `C`'s default runs.
pub(crate) fn protocol_setup<C>(args: &SimArgs) -> anyhow::Result<C>
where
    C: arbiter_sim::models::ModelConfigFile + Default,
{
    let protocol = args
        .protocol
        .map_or_else(|| "this".to_string(), |p| p.to_string());
    if args.nodes.is_some() || args.trace.is_some() {
        bail!(
            "the {protocol} protocol builds its own cluster and workload (from the traces \
             folder where it uses traces); --nodes and --trace do not apply"
        );
    }
    match &args.config {
        Some(value) => {
            let text = config_text(value)?;
            C::from_toml(&text).with_context(|| {
                format!("the {protocol} protocol's scenario configuration `{value}`")
            })
        }
        None => Ok(C::default()),
    }
}

/// What `--config VALUE` says, the same for every protocol: the file `VALUE` if there is
/// one, else `VALUE` itself as TOML text. A value that is neither — no such file, and no
/// `key = value`, `[table]` or `# comment` in it — is an error: passed on as text, `--config b.toml`
/// had been a policy's TOML parse error, or nothing at all for a policy without options.
///
/// ```
/// use arbiter_repro::config_text;
/// assert_eq!(config_text("slow_spill = \"always\"")?, "slow_spill = \"always\"");
/// let error = config_text("no-such-setup.toml").unwrap_err();
/// assert!(error.to_string().contains("no file `no-such-setup.toml`"));
/// # Ok::<(), anyhow::Error>(())
/// ```
pub fn config_text(value: &str) -> anyhow::Result<String> {
    if std::fs::metadata(value).is_ok() {
        return arbiter_host::files::read_config(value.as_ref())
            .with_context(|| format!("reading the configuration `{value}`"));
    }
    if value.trim().is_empty() || value.contains(['=', '[', '#']) {
        return Ok(value.to_string());
    }
    bail!(
        "--config `{value}`: no file `{value}`, and not TOML text (a configuration sets \
         `key = value`)"
    )
}

/// The built-in policy `name`, compiled, to run with `config` (empty: its manifest's default).
pub fn builtin_run_policy(
    engine: &PolicyEngine,
    name: &str,
    config: &str,
) -> anyhow::Result<arbiter_sim::core::RunPolicy> {
    Ok(arbiter_sim::core::RunPolicy {
        compiled: compile_builtin(engine, name)?,
        config: (!config.is_empty()).then(|| config.to_string()),
    })
}

/// The most runs per policy `--seeds` asks for (the FGD paper runs 10).
pub const MAX_SEEDS: u32 = 1_000;

/// The longest `--interval-s` between replay rounds: a year of virtual time.
pub const MAX_INTERVAL_S: f64 = 365.0 * 86_400.0;

/// A policy named on the command line, resolved to component bytes.
pub struct PolicySource {
    /// As given (a built-in name or a path).
    pub label: String,
    pub bytes: Vec<u8>,
}

/// Resolves `name-or-path` as every command does ([`read_policy`]).
pub fn resolve_policy(spec: &str) -> anyhow::Result<PolicySource> {
    Ok(PolicySource {
        label: spec.to_string(),
        bytes: read_policy(spec)?,
    })
}

/// The prefix that names a built-in policy whatever files exist (`builtin:fifo`).
pub const BUILTIN_PREFIX: &str = "builtin:";

/// The component a person names on a command line, read the same way by every command:
/// `builtin:NAME` is that built-in; a path to a file is the file (at most
/// [`MAX_COMPONENT_FILE`](arbiter_host::files::MAX_COMPONENT_FILE) bytes); a bare built-in name with no such file is the built-in
/// (so `./fifo`, if you wrote one, wins over ours). Anything else is an error that lists
/// the built-ins.
///
/// ```
/// use arbiter_repro::read_policy;
/// assert_eq!(read_policy("builtin:fifo")?, read_policy("fifo")?);
/// assert_eq!(&read_policy("fifo")?[..4], b"\0asm");
/// let error = read_policy("no-such-policy").unwrap_err();
/// assert!(error.to_string().starts_with("no file `no-such-policy` and no built-in policy of that name"));
/// # Ok::<(), anyhow::Error>(())
/// ```
pub fn read_policy(spec: &str) -> anyhow::Result<Vec<u8>> {
    let built_ins = || arbiter_policies::names().collect::<Vec<_>>().join(", ");
    if let Some(name) = spec.strip_prefix(BUILTIN_PREFIX) {
        return arbiter_policies::get(name)
            .map(<[u8]>::to_vec)
            .with_context(|| format!("no built-in policy `{name}` (built-ins: {})", built_ins()));
    }
    match arbiter_host::files::read_at_most(spec.as_ref(), arbiter_host::files::MAX_COMPONENT_FILE)
    {
        Ok(bytes) => Ok(bytes),
        Err(e) if arbiter_host::files::is_not_found(&e) => arbiter_policies::get(spec)
            .map(<[u8]>::to_vec)
            .with_context(|| {
                format!(
                    "no file `{spec}` and no built-in policy of that name (built-ins: {})",
                    built_ins()
                )
            }),
        Err(e) => Err(e),
    }
}

/// Compiles each comma-separated policy once, on up to `threads` threads
/// (compiling is a large share of a short run: about half a second per policy).
pub fn compile_policies(
    engine: &PolicyEngine,
    list: &str,
    threads: usize,
) -> anyhow::Result<Vec<(String, CompiledPolicy)>> {
    let specs: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if specs.is_empty() {
        bail!("--policy names no policy");
    }
    let sources = specs
        .iter()
        .map(|spec| resolve_policy(spec))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let indices: Vec<usize> = (0..sources.len()).collect();
    let compiled = parallel_map(&indices, threads, |&i| {
        engine
            .compile(&sources[i].bytes)
            .with_context(|| format!("compiling policy `{}`", specs[i]))
    })?;
    Ok(sources
        .into_iter()
        .map(|source| source.label)
        .zip(compiled)
        .collect())
}

/// `arbiter sim`: loads the scenario, runs each policy (and seed), and
/// writes the report if asked.
pub fn run(args: &SimArgs) -> anyhow::Result<SimOutput> {
    let span = tracing::info_span!("sim", policy = %args.policy, protocol = ?args.protocol);
    let _guard = span.enter();
    let started = Instant::now();
    arbiter_sim::models::fgd::check_tune(args.tune).context("--tune")?;
    if !(args.interval_s >= 0.0 && args.interval_s <= MAX_INTERVAL_S) {
        bail!(
            "--interval-s must be 0 to {MAX_INTERVAL_S} (a year), got {:?}",
            args.interval_s
        );
    }
    if !(1..=MAX_SEEDS).contains(&args.seeds) {
        bail!("--seeds must be 1 to {MAX_SEEDS}, got {}", args.seeds);
    }
    match args.protocol {
        Some(Protocol::Aryl) => {
            bail!("the aryl protocol has its own driver: `arbiter_repro::aryl::run_protocol`")
        }
        Some(Protocol::Dynamoml) => bail!(
            "the dynamoml protocol has its own driver: `arbiter_repro::dynamoml::run_protocol`"
        ),
        Some(Protocol::Antman) => {
            bail!("the antman protocol has its own driver: `arbiter_repro::antman::run_protocol`")
        }
        Some(Protocol::AntmanTrace) => bail!(
            "the antman-trace protocol has its own driver: `arbiter_repro::antman::run_trace_protocol`"
        ),
        Some(Protocol::Muxflow) => {
            bail!("the muxflow protocol has its own driver: `arbiter_repro::muxflow::run_protocol`")
        }
        _ => {}
    }
    let scenario = scenario::from_files(args.nodes.as_deref(), args.trace.as_deref(), args.format)?;
    let protocol = args.protocol.unwrap_or(Protocol::Replay);
    if scenario.tasks.is_empty() {
        bail!(
            "no task of `{}` fits any node ({} rejected)",
            scenario.name,
            scenario.rejected.len()
        );
    }
    if !(args.gpu_metrics_s.is_finite() && args.gpu_metrics_s >= 0.0) {
        bail!(
            "--gpu-metrics-s must be zero or positive, got {}",
            args.gpu_metrics_s
        );
    }
    let engine =
        arbiter_sim::metered_engine(Duration::from_millis(args.deadline_ms.max(1)), args.fuel)?;
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let policies = compile_policies(&engine, &args.policy, threads)?;
    // A policy without the role would be passed over every round and the run would be the
    // native fallback's under its name.
    for (label, compiled) in &policies {
        if !compiled.has_role(Role::Scheduler) {
            let roles: Vec<&str> = compiled.roles().iter().map(|r| r.as_str()).collect();
            bail!(
                "policy `{label}` is not a scheduler (its roles: {}); `arbiter sim` runs \
                 scheduler policies (the paper protocols run their coordinators and matchers)",
                roles.join(", ")
            );
        }
    }
    if protocol == Protocol::Replay && scenario.tasks.iter().all(|t| t.duration_ms.is_none()) {
        tracing::warn!(
            "`{}` has no time columns: under the replay protocol its tasks arrive at 0 and never \
             depart, so there is no JCT or makespan to report, only where they were placed; \
             `--protocol fgd` is the placement protocol for such a trace",
            scenario.name
        );
    }
    let model = match protocol {
        Protocol::Fgd => ModelConfig::Fgd(FgdConfig { tune: args.tune }),
        _ => ModelConfig::Replay(ReplayConfig {
            round_interval_ms: (args.interval_s * 1000.0).round() as u64,
            gpu_metrics_period_ms: Some((args.gpu_metrics_s * 1000.0).round() as u64)
                .filter(|&p| p > 0),
            prediction: args.prediction,
        }),
    };
    let config = args.config.as_deref().map(config_text).transpose()?;
    let mut jobs = Vec::new();
    for (label, compiled) in &policies {
        for k in 0..args.seeds {
            let seed = args.seed.wrapping_add(u64::from(k));
            jobs.push(fgd::scenario_run(
                &scenario,
                label,
                compiled,
                seed,
                config.clone(),
                model.clone(),
            ));
        }
    }
    let runs = run_many(&scenario, &jobs, threads)?;
    let mut output = SimOutput {
        scenario: ScenarioSummary {
            name: scenario.name.clone(),
            source: scenario.source.clone(),
            protocol,
            nodes: scenario.nodes.len(),
            gpus: scenario.gpu_count(),
            tasks: scenario.tasks.len(),
            rejected: scenario.rejected.len(),
            rejected_examples: scenario.rejected.iter().take(5).cloned().collect(),
        },
        fgd_summary: fgd_summary(&runs),
        runs,
        report_dir: None,
        wall_seconds: 0.0,
    };
    if let Some(dir) = &args.report {
        report::write(dir, &output)?;
        output.report_dir = Some(dir.clone());
    }
    output.wall_seconds = started.elapsed().as_secs_f64();
    Ok(output)
}

#[cfg(test)]
mod tests {
    use super::read_policy;

    #[test]
    fn a_file_wins_over_a_built_in_of_its_name_and_the_prefix_wins_over_both() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mine = dir.path().join("fifo");
        std::fs::write(&mine, b"mine").expect("write");
        let path = mine.to_str().expect("utf-8 temp path");
        assert_eq!(read_policy(path).expect("the file"), b"mine");
        assert_eq!(
            read_policy("builtin:fifo").expect("built in"),
            arbiter_policies::get("fifo").expect("built in")
        );
        let error = read_policy("builtin:nope").expect_err("unknown");
        assert!(
            error
                .to_string()
                .starts_with("no built-in policy `nope` (built-ins: "),
            "{error}"
        );
        // Reading is bounded: `/dev/zero` is refused, not read for ever.
        let error = format!("{:#}", read_policy("/dev/zero").expect_err("endless"));
        assert!(error.contains("larger than 64 MiB"), "{error}");
        // A directory is neither: its read error, not a built-in's.
        let error = read_policy(dir.path().to_str().expect("utf-8")).expect_err("a directory");
        assert!(error.to_string().starts_with("reading "), "{error}");
    }
}
