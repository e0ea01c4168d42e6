//! The MuxFlow comparisons (2023, §7): online services from the GenAI serving traces sharing
//! their GPUs with offline training from the Philly trace, on the scenario of
//! [`arbiter_sim::models::muxflow`] — MuxFlow against Online-only, Time-sharing and
//! PB-time-sharing (Fig. 11), its ablations (Fig. 13), and the testbed's online and
//! utilization figures (Fig. 10).

use anyhow::Context;
use arbiter_sim::models::muxflow::{
    MuxflowMetrics, MuxflowSimConfig, OfflinePlan, Physics, ServicePlan, Sharing, run_muxflow,
};
use arbiter_sim::parallel_map;
use std::collections::BTreeMap;
use std::time::Duration;

/// The four offline traces of §7.1: Philly virtual clusters whose job counts (1,435, 1,511,
/// 1,934, 7,423) bracket the paper's "1,410 to 7,287" (by cluster name in the job table).
pub const TRACES: [(&str, &str); 4] = [
    ("A", "0e4a51"),
    ("B", "ee9e8c"),
    ("C", "103959"),
    ("D", "b436b2"),
];

/// §7.2 (testbed): online mean and P99 latency +16.0 %, +15.3 %; GPU utilization 4.0×, SM
/// activity 4.7×, GPU memory 1.5× Online-only's; 1.5 % of offline executions evicted.
pub const PAPER_TESTBED: Testbed = Testbed {
    latency_mean: 1.160,
    latency_p99: 1.153,
    utilization: 4.0,
    sm_activity: 4.7,
    memory: 1.5,
    evicted: 0.015,
};

/// §7.3: MuxFlow's average JCT 1.10–2.24× better and its oversold GPU 1.08–1.97× higher than
/// Time-sharing's and PB-time-sharing's, over the traces.
pub const PAPER_JCT_GAIN: (f64, f64) = (1.10, 2.24);
pub const PAPER_OVERSOLD_GAIN: (f64, f64) = (1.08, 1.97);

/// The testbed's figures, as ratios to Online-only (evictions: a share of executions).
#[derive(Clone, Copy, Debug)]
pub struct Testbed {
    pub latency_mean: f64,
    pub latency_p99: f64,
    pub utilization: f64,
    pub sm_activity: f64,
    pub memory: f64,
    pub evicted: f64,
}

/// `sysmonitor` for a GPU shared under MPS (ours; its other defaults stay): the point of
/// sharing is a GPU that is always busy (NVML utilization near 100 %) with nearly all its SMs
/// in use (dynamic SM shares), so utilization is not a health signal and SM activity alone
/// never makes a GPU Overlimit; overload shows in the SM clock and in memory.
pub const SYSMONITOR_CONFIG: &str =
    "[thresholds]\nutilization_pct = false\nsm_activity_pct = [90.0, 97.0, 100.0]\n";

/// One system of §7.3–7.4.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    pub label: &'static str,
    /// The matcher and its configuration (`None`: no offline work at all).
    pub matcher: Option<(&'static str, &'static str)>,
    /// Whether `sysmonitor` runs on every node.
    pub sysmonitor: bool,
    pub sharing: Sharing,
    /// Periodic global rescheduling of running offline jobs (MuxFlow's).
    pub reschedule: bool,
}

/// The SM share "without dynamic SM allocation": Fig. 8's fixed 40 %.
const FIXED_SM: &str = "[dynamic_sm]\nmin_pct = 40\nmax_pct = 40\n";
const FIXED_SM_ARRIVAL: &str = "order = \"arrival\"\nmin_sm = 40\nmax_sm = 40\n";

/// The systems compared: §7.3's four (Fig. 11) and §7.4's ablations (Fig. 13).
pub const SETTINGS: [Setting; 7] = [
    Setting {
        label: "Online-only",
        matcher: None,
        sysmonitor: false,
        sharing: Sharing::Mps,
        reschedule: false,
    },
    Setting {
        label: "Time-sharing",
        matcher: Some(("greedy-matcher", "order = \"arrival\"")),
        sysmonitor: false,
        sharing: Sharing::TimeSlicing,
        reschedule: false,
    },
    Setting {
        label: "PB-time-sharing",
        matcher: Some(("greedy-matcher", "order = \"arrival\"")),
        sysmonitor: false,
        sharing: Sharing::PriorityTimeSlicing,
        reschedule: false,
    },
    Setting {
        label: "MuxFlow",
        matcher: Some(("muxflow", "")),
        sysmonitor: true,
        sharing: Sharing::Mps,
        reschedule: true,
    },
    Setting {
        label: "MuxFlow-S",
        matcher: Some(("muxflow", FIXED_SM)),
        sysmonitor: true,
        sharing: Sharing::Mps,
        reschedule: true,
    },
    Setting {
        label: "MuxFlow-M",
        matcher: Some(("greedy-matcher", "order = \"arrival\"")),
        sysmonitor: true,
        sharing: Sharing::Mps,
        reschedule: false,
    },
    Setting {
        label: "MuxFlow-S-M",
        matcher: Some(("greedy-matcher", FIXED_SM_ARRIVAL)),
        sysmonitor: true,
        sharing: Sharing::Mps,
        reschedule: false,
    },
];

/// What the paper leaves out of §7, our choices (`docs/reproductions/muxflow.md`).
#[derive(Clone, Debug)]
pub struct TraceSetup {
    /// T4 nodes of 8 GPUs (ours: 12, 96 GPUs; the paper's 1,000 take minutes per run here).
    pub nodes: u32,
    /// The online-only GPU utilization the services' duty cycles are rescaled to (MuxFlow
    /// §7.5's production average: 26 %; the GenAI pods average 7 %).
    pub online_utilization: f64,
    /// The memory of the GPUs the GenAI pods ran on, GiB (48 GB-class).
    pub pod_gpu_memory_gib: f64,
    /// The busiest service's memory, share of its GPU, the pods' memory is rescaled to
    /// (MuxFlow §6: the 40 % offline quota presumes online services stay below 60 %; the
    /// GenAI pods peak at 78 % of their GPUs). `None`: as in the trace.
    pub online_memory_peak: Option<f64>,
    /// Offline arrivals are compressed into this window, hours (ours: 12, so that the trace
    /// can finish in the 24 h the paper allows).
    pub arrival_window_h: f64,
    /// Philly run times are capped at this many hours (ours: 6).
    pub max_hours: f64,
    /// Offline jobs per GPU, as a share of the virtual cluster's jobs per 1,000 GPUs (the
    /// paper "repeats the workloads to fit in 1,000 GPUs"; ours: the same density).
    pub jobs_per_gpu_scale: f64,
    pub horizon_h: f64,
    /// The GPU physics (ours, [`Physics::default`]).
    pub physics: Physics,
    /// `sysmonitor`'s configuration on every node ([`SYSMONITOR_CONFIG`]).
    pub sysmonitor_config: String,
    /// Checkpoint and restart of a moved or evicted offline job, ms (ours: 60 s).
    pub restart_ms: u64,
    /// Appended to the `muxflow` matcher's configuration in every setting that runs it (e.g.
    /// [`fitted_predictor_config`]'s weights).
    pub muxflow_config: String,
    pub seeds: Vec<u64>,
}

impl Default for TraceSetup {
    fn default() -> Self {
        TraceSetup {
            nodes: 12,
            online_utilization: 0.26,
            pod_gpu_memory_gib: 48.0,
            online_memory_peak: Some(0.6),
            arrival_window_h: 12.0,
            max_hours: 6.0,
            jobs_per_gpu_scale: 1.0,
            horizon_h: 48.0,
            physics: Physics::default(),
            sysmonitor_config: SYSMONITOR_CONFIG.to_string(),
            restart_ms: 60_000,
            muxflow_config: String::new(),
            seeds: vec![1],
        }
    }
}

/// Per GenAI pod: its duty cycle (percent) and memory (bytes) per sample, in time order.
pub struct PodSeries {
    pub name: String,
    pub duty_pct: Vec<f64>,
    pub memory_bytes: Vec<f64>,
}

/// The GenAI serving pods with both series.
pub fn genai_pods() -> anyhow::Result<Vec<PodSeries>> {
    use arbiter_traces::genai;
    let load = |file: &str| -> anyhow::Result<BTreeMap<String, Vec<(i64, f64)>>> {
        let path = arbiter_traces::trace_file(file)
            .with_context(|| format!("the MuxFlow comparison needs `{file}`"))?;
        let series = genai::load_pod_gpu_series(&path)
            .with_context(|| format!("loading `{}`", path.display()))?;
        let mut by_pod: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
        for s in &series.samples {
            if let Some(name) = series.containers.get(s.container as usize) {
                by_pod
                    .entry(name.clone())
                    .or_default()
                    .push((s.timestamp, s.value));
            }
        }
        for v in by_pod.values_mut() {
            v.sort_by_key(|x| x.0);
        }
        Ok(by_pod)
    };
    let duty = load(genai::POD_GPU_DUTY_CYCLE_FILE)?;
    let memory = load(genai::POD_GPU_MEMORY_FILE)?;
    Ok(duty
        .into_iter()
        .filter_map(|(name, d)| {
            let m = memory.get(&name)?;
            Some(PodSeries {
                duty_pct: d.iter().map(|x| x.1).collect(),
                memory_bytes: m.iter().map(|x| x.1).collect(),
                name,
            })
        })
        .filter(|p| !p.duty_pct.is_empty() && !p.memory_bytes.is_empty())
        .collect())
}

/// One Philly job of a virtual cluster: submit time (s) and run time (s).
pub type PhillyRow = (i64, f64);

/// The jobs of each virtual cluster of [`TRACES`], by cluster name.
pub fn philly_clusters() -> anyhow::Result<BTreeMap<String, Vec<PhillyRow>>> {
    let file = arbiter_traces::trace_file(arbiter_traces::philly::JOBS_FILE)
        .context("the MuxFlow comparison needs the Philly job table")?;
    let trace = arbiter_traces::philly::load_jobs(&file)
        .with_context(|| format!("loading `{}`", file.display()))?;
    let mut out: BTreeMap<String, Vec<PhillyRow>> = BTreeMap::new();
    for j in &trace.jobs {
        let Some(name) = trace.cluster_name(j) else {
            continue;
        };
        if TRACES.iter().any(|(_, vc)| *vc == name)
            && j.duration_secs.is_finite()
            && j.duration_secs > 0.0
        {
            out.entry(name.to_string())
                .or_default()
                .push((j.submit_time, j.duration_secs));
        }
    }
    Ok(out)
}

/// The scenario of one trace and seed: a service on every GPU replaying a GenAI pod (rescaled
/// as the set-up says), the virtual cluster's jobs at the set-up's density, arrivals
/// compressed into the window, a model of §7.1 each, uniformly.
pub fn trace_scenario(
    setup: &TraceSetup,
    pods: &[PodSeries],
    jobs: &[PhillyRow],
    seed: u64,
) -> anyhow::Result<MuxflowSimConfig> {
    use rand::seq::{IndexedRandom, SliceRandom};
    use rand::{Rng, SeedableRng};
    if pods.is_empty() || jobs.is_empty() {
        anyhow::bail!("the MuxFlow comparison needs GenAI pods and Philly jobs");
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let gpus = setup.nodes as usize * 8;
    let mut order: Vec<usize> = (0..pods.len()).collect();
    order.shuffle(&mut rng);
    let chosen: Vec<&PodSeries> = (0..gpus).map(|i| &pods[order[i % order.len()]]).collect();
    let scale = duty_scale(&chosen, setup.online_utilization)?;
    let pod_bytes = setup.pod_gpu_memory_gib * f64::from(1u32 << 30);
    let peak = chosen
        .iter()
        .flat_map(|p| p.memory_bytes.iter())
        .fold(0.0f64, |a, &b| a.max(b / pod_bytes));
    let memory_scale = match setup.online_memory_peak {
        Some(target) if peak > 0.0 => target / peak,
        _ => 1.0,
    };
    let services = chosen
        .iter()
        .enumerate()
        .map(|(i, p)| ServicePlan {
            name: format!("svc-{i:03}-{}", &p.name[..p.name.len().min(8)]),
            load: p
                .duty_pct
                .iter()
                .map(|d| (d / 100.0 * scale).clamp(0.0, 1.0))
                .collect(),
            memory: p
                .memory_bytes
                .iter()
                .map(|b| (b / pod_bytes * memory_scale).clamp(0.0, 1.0))
                .collect(),
        })
        .collect();
    let count = ((jobs.len() as f64 * gpus as f64 / 1000.0 * setup.jobs_per_gpu_scale).round()
        as usize)
        .clamp(1, jobs.len());
    let mut picked: Vec<PhillyRow> = jobs.choose_multiple(&mut rng, count).copied().collect();
    picked.sort_by_key(|j| j.0);
    let first = picked.first().map_or(0, |j| j.0);
    let span = (picked.last().map_or(0, |j| j.0) - first).max(1) as f64;
    let models = ["resnet50", "vgg16", "densenet201", "inception-v3"];
    let offline = picked
        .iter()
        .enumerate()
        .map(|(i, &(t, secs))| OfflinePlan {
            name: format!("off-{i:05}"),
            model: models[rng.random_range(0..models.len())].to_string(),
            arrival_min: (t - first) as f64 / span * setup.arrival_window_h * 60.0,
            minutes: (secs.min(setup.max_hours * 3600.0) / 60.0).max(1.0),
        })
        .collect();
    Ok(MuxflowSimConfig {
        nodes: setup.nodes,
        services,
        offline,
        seed,
        horizon_ms: (setup.horizon_h * 3_600_000.0) as u64,
        physics: setup.physics,
        restart_ms: setup.restart_ms,
        ..MuxflowSimConfig::default()
    })
}

/// The factor on the pods' duty cycles that makes their mean (each capped at 100 %) `target`:
/// bisection, as capping bends the mean.
fn duty_scale(pods: &[&PodSeries], target: f64) -> anyhow::Result<f64> {
    let mean = |scale: f64| {
        let (sum, n) = pods
            .iter()
            .flat_map(|p| p.duty_pct.iter())
            .fold((0.0, 0usize), |(s, n), d| {
                (s + (d / 100.0 * scale).min(1.0), n + 1)
            });
        sum / n.max(1) as f64
    };
    anyhow::ensure!(
        mean(1e9) > target,
        "the services cannot reach {target} utilization"
    );
    let (mut lo, mut hi) = (0.0, 1e9);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mean(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(0.5 * (lo + hi))
}

/// Profiles the simulator's GPUs the way MuxFlow profiles pairs (§5: each offline model beside
/// services at many loads, at many SM shares): one sample per (model, load, SM share, pair
/// sensitivity drawn from the scenario's range), its features as the matcher sees them and its
/// normalised throughput from the ground truth.
pub fn profile_samples(
    cfg: &MuxflowSimConfig,
    seed: u64,
) -> Vec<(muxflow_core::EdgeFeatures, f64)> {
    use arbiter_sim::models::muxflow::truth::{Offline, share_gpu};
    use muxflow_core::{EdgeFeatures, Profile};
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let pct = |v: f64| (v * 100.0).round().clamp(0.0, 100.0) as u8;
    let (lo, hi) = cfg.pair_sensitivity;
    let mut samples = Vec::new();
    for model in cfg.models.values() {
        for load_step in 0..=10 {
            let load = f64::from(load_step) / 10.0;
            for sm in (10..=100).step_by(10) {
                let sensitivity = lo + (hi - lo) * rng.random::<f64>();
                let truth = share_gpu(
                    &cfg.physics,
                    Sharing::Mps,
                    load,
                    Some(Offline {
                        fill: model.fill,
                        pair_sensitivity: sensitivity,
                        sm_share: f64::from(sm) / 100.0,
                        pacing: 1.0,
                    }),
                );
                let features = EdgeFeatures {
                    online: Profile {
                        utilization_pct: pct(load),
                        sm_activity_pct: pct(cfg.physics.sm_per_load * load),
                        ..Profile::default()
                    },
                    offline: Profile {
                        utilization_pct: 100,
                        sm_activity_pct: pct(model.fill),
                        sm_occupancy_pct: pct(model.fill),
                        solo_iteration_ms: model.iteration_ms,
                    },
                    sm_pct: sm as u8,
                };
                samples.push((features, truth.offline_speed));
            }
        }
    }
    samples
}

/// The `muxflow` configuration with predictor weights fitted (ridge least squares) to
/// [`profile_samples`]: the predictor trained from profiles the simulator produces.
pub fn fitted_predictor_config(cfg: &MuxflowSimConfig, seed: u64) -> anyhow::Result<String> {
    let model = muxflow_core::LinearModel::fit(&profile_samples(cfg, seed), 1e-6)
        .map_err(anyhow::Error::msg)
        .context("fitting the MuxFlow predictor")?;
    let w = model.weights.map(|x| format!("{x:.6}")).join(", ");
    Ok(format!("\n[predictor]\nweights = [{w}]\n"))
}

/// One trace's runs, in [`SETTINGS`] order.
pub struct TraceRuns {
    pub trace: &'static str,
    pub seed: u64,
    pub runs: Vec<(&'static str, MuxflowMetrics)>,
}

impl TraceRuns {
    pub fn get(&self, label: &str) -> Option<&MuxflowMetrics> {
        self.runs.iter().find(|r| r.0 == label).map(|r| &r.1)
    }
}

/// Runs `settings` on every trace of `traces` (labels of [`TRACES`]) and seed of `setup`.
pub fn compare(
    setup: &TraceSetup,
    traces: &[&str],
    settings: &[Setting],
) -> anyhow::Result<Vec<TraceRuns>> {
    let pods = genai_pods()?;
    let clusters = philly_clusters()?;
    let engine = arbiter_sim::engine(Duration::from_secs(30))?;
    let scheduler = crate::builtin_run_policy(&engine, "fifo", "")?;
    let sysmonitor = crate::builtin_run_policy(&engine, "sysmonitor", &setup.sysmonitor_config)?;
    let policies = settings
        .iter()
        .map(|s| {
            let matcher = s
                .matcher
                .map(|(n, c)| match n {
                    "muxflow" => crate::builtin_run_policy(
                        &engine,
                        n,
                        &format!("{c}{}", setup.muxflow_config),
                    ),
                    _ => crate::builtin_run_policy(&engine, n, c),
                })
                .transpose()?;
            Ok((s, matcher))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut out = Vec::new();
    for &label in traces {
        let (trace, vc) = TRACES
            .iter()
            .find(|(l, _)| *l == label)
            .with_context(|| format!("no trace `{label}` (A to D)"))?;
        let jobs = clusters
            .get(*vc)
            .with_context(|| format!("no jobs of virtual cluster `{vc}`"))?;
        for &seed in &setup.seeds {
            let base = trace_scenario(setup, &pods, jobs, seed)?;
            let metrics = parallel_map(&policies, threads, |(s, matcher)| {
                let cfg = MuxflowSimConfig {
                    sharing: s.sharing,
                    reschedule_running: s.reschedule,
                    ..base.clone()
                };
                let coordinator = s.sysmonitor.then_some(&sysmonitor);
                run_muxflow(&scheduler, matcher.as_ref(), coordinator, &cfg)
                    .with_context(|| format!("trace {trace} seed {seed}: {}", s.label))
            })?;
            out.push(TraceRuns {
                trace,
                seed,
                runs: settings.iter().map(|s| s.label).zip(metrics).collect(),
            });
        }
    }
    Ok(out)
}

/// A table of one trace's runs, normalized as the paper's figures are: latency to
/// Online-only's, JCT and oversold GPU to MuxFlow's.
pub fn print_runs(runs: &TraceRuns) {
    println!("trace {} (seed {})", runs.trace, runs.seed);
    println!(
        "{:<16} {:>8} {:>8} {:>9} {:>9} {:>8} {:>6} {:>6} {:>7} {:>7} {:>6}",
        "system",
        "lat",
        "p99",
        "JCT min",
        "oversold",
        "unfin",
        "util",
        "SM",
        "evict%",
        "migr",
        "wall s"
    );
    // A ratio with nothing under it (no request answered, no offline job finished, as
    // with a horizon too short) is "-", not a measured 0.
    let shown = |v: f64, measured: bool, digits: usize| {
        if measured {
            format!("{v:.digits$}")
        } else {
            "-".to_string()
        }
    };
    for (label, m) in &runs.runs {
        let finished = m.offline.len() > m.unfinished;
        println!(
            "{:<16} {:>8} {:>8} {:>9} {:>9} {:>8} {:>6.2} {:>6.2} {:>7.2} {:>7} {:>6.1}",
            label,
            shown(m.latency_mean_ratio, m.latency_mean_ratio > 0.0, 3),
            shown(m.latency_p99_ratio, m.latency_p99_ratio > 0.0, 3),
            shown(m.mean_jct_min, finished, 1),
            shown(m.oversold_gpu, finished, 3),
            m.unfinished,
            m.utilization,
            m.sm_activity,
            if m.executions > 0 {
                100.0 * m.evictions as f64 / m.executions as f64
            } else {
                0.0
            },
            m.migrations,
            m.wall_seconds
        );
    }
}

/// `arbiter sim --protocol muxflow --config FILE`: the §7 set-up in a TOML table, every key
/// optional ([`TraceSetup::default`]'s value), unknown ones refused. The GPU physics and
/// `sysmonitor`'s configuration stay the reproduction's; the sensitivity table that changes
/// them is the reproduction test's (`docs/reproductions/muxflow.md`).
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TraceProtocolConfig {
    /// Offline traces to run, labels of [`TRACES`] (`"A"` to `"D"`).
    pub traces: Vec<String>,
    /// T4 nodes of 8 GPUs.
    pub nodes: u32,
    pub online_utilization: f64,
    /// The busiest service's memory as a share of its GPU; `0` keeps the trace's.
    pub online_memory_peak: f64,
    pub arrival_window_h: f64,
    pub max_hours: f64,
    pub jobs_per_gpu_scale: f64,
    pub horizon_h: f64,
    /// Checkpoint and restart of a moved or evicted offline job, seconds.
    pub restart_s: f64,
    pub seeds: Vec<u64>,
}

impl Default for TraceProtocolConfig {
    fn default() -> Self {
        let setup = TraceSetup::default();
        TraceProtocolConfig {
            traces: TRACES.iter().map(|t| t.0.to_string()).collect(),
            nodes: setup.nodes,
            online_utilization: setup.online_utilization,
            online_memory_peak: setup.online_memory_peak.unwrap_or(0.0),
            arrival_window_h: setup.arrival_window_h,
            max_hours: setup.max_hours,
            jobs_per_gpu_scale: setup.jobs_per_gpu_scale,
            horizon_h: setup.horizon_h,
            restart_s: setup.restart_ms as f64 / 1000.0,
            seeds: setup.seeds,
        }
    }
}

impl arbiter_sim::models::ModelConfigFile for TraceProtocolConfig {
    const WHAT: &'static str = "the MuxFlow trace experiment's set-up";

    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.traces.is_empty(),
            "traces must name at least one trace"
        );
        for t in &self.traces {
            anyhow::ensure!(
                TRACES.iter().any(|(label, _)| label == t),
                "no trace {t:?} (traces are \"A\" to \"D\")"
            );
        }
        anyhow::ensure!(
            (1..=1_000).contains(&self.nodes),
            "nodes must be 1 to 1,000 (got {})",
            self.nodes
        );
        let share = |name: &str, v: f64, zero_ok: bool| {
            anyhow::ensure!(
                v.is_finite() && (v > 0.0 || (zero_ok && v == 0.0)) && v <= 1.0,
                "{name} must be a share of the GPU, above 0 and at most 1 (got {v:?})"
            );
            Ok(())
        };
        share("online_utilization", self.online_utilization, false)?;
        share("online_memory_peak", self.online_memory_peak, true)?;
        for (name, v) in [
            ("arrival_window_h", self.arrival_window_h),
            ("max_hours", self.max_hours),
            ("horizon_h", self.horizon_h),
            ("jobs_per_gpu_scale", self.jobs_per_gpu_scale),
        ] {
            anyhow::ensure!(
                v.is_finite() && v > 0.0 && v <= 24.0 * 365.0,
                "{name} must be above 0 and at most 8,760 (got {v:?})"
            );
        }
        anyhow::ensure!(
            self.restart_s.is_finite() && (0.0..=86_400.0).contains(&self.restart_s),
            "restart_s must be 0 to 86,400 (got {:?})",
            self.restart_s
        );
        anyhow::ensure!(
            (1..=100).contains(&self.seeds.len()),
            "seeds must list 1 to 100 seeds (got {})",
            self.seeds.len()
        );
        Ok(())
    }
}

impl TraceProtocolConfig {
    pub fn setup(&self) -> TraceSetup {
        TraceSetup {
            nodes: self.nodes,
            online_utilization: self.online_utilization,
            online_memory_peak: (self.online_memory_peak > 0.0).then_some(self.online_memory_peak),
            arrival_window_h: self.arrival_window_h,
            max_hours: self.max_hours,
            jobs_per_gpu_scale: self.jobs_per_gpu_scale,
            horizon_h: self.horizon_h,
            restart_ms: (self.restart_s * 1000.0).round() as u64,
            seeds: self.seeds.clone(),
            ..TraceSetup::default()
        }
    }
}

/// `arbiter sim --protocol muxflow`: every chosen trace's runs.
pub struct MuxflowReport {
    pub traces: Vec<TraceRuns>,
}

/// Runs §7's comparison (the seven systems of [`SETTINGS`]) on the set-up `--config` names
/// (a [`TraceProtocolConfig`] TOML) or the reproduction's default: traces A–D on 96 GPUs,
/// a minute or so on two cores.
pub fn run_protocol(args: &crate::SimArgs) -> anyhow::Result<MuxflowReport> {
    let cfg: TraceProtocolConfig = crate::protocol_setup(args)?;
    let labels: Vec<&str> = cfg.traces.iter().map(String::as_str).collect();
    Ok(MuxflowReport {
        traces: compare(&cfg.setup(), &labels, &SETTINGS)?,
    })
}

impl MuxflowReport {
    pub fn print(&self, json: bool) -> anyhow::Result<()> {
        if json {
            let traces: Vec<_> = self
                .traces
                .iter()
                .map(|t| {
                    let runs: Vec<_> = t
                        .runs
                        .iter()
                        .map(|(label, m)| serde_json::json!({ "system": label, "metrics": m }))
                        .collect();
                    serde_json::json!({ "trace": t.trace, "seed": t.seed, "runs": runs })
                })
                .collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "traces": traces,
                    "paper_latency_mean_ratio": PAPER_TESTBED.latency_mean,
                    "paper_latency_p99_ratio": PAPER_TESTBED.latency_p99,
                    "paper_jct_gain": PAPER_JCT_GAIN,
                    "paper_oversold_gain": PAPER_OVERSOLD_GAIN,
                }))?
            );
            return Ok(());
        }
        for t in &self.traces {
            print_runs(t);
            println!();
        }
        println!(
            "lat / p99: the services' mean and P99 latency over Online-only's (paper: MuxFlow \
             {:.3} / {:.3}); JCT: offline minutes (paper: the baselines' {:.2}-{:.2}x MuxFlow's); \
             oversold: Eq. 3 (paper: MuxFlow {:.2}-{:.2}x the baselines'). See \
             docs/reproductions/muxflow.md.",
            PAPER_TESTBED.latency_mean,
            PAPER_TESTBED.latency_p99,
            PAPER_JCT_GAIN.0,
            PAPER_JCT_GAIN.1,
            PAPER_OVERSOLD_GAIN.0,
            PAPER_OVERSOLD_GAIN.1
        );
        Ok(())
    }
}
