//! AntMan (OSDI '20) reproduced on the simulator: Table 2 (§5.1), two jobs on the one 32 GB
//! V100 left, under the five ways of handling the second arrival. Tolerances and why are in
//! `docs/reproductions/antman.md`.

use arbiter_repro::antman::{PAPER_TABLE_2, Table2, print_table_2, table_2};
use arbiter_sim::models::antman::{AntmanSimConfig, JobEnd};
use std::sync::OnceLock;

fn table() -> &'static Table2 {
    static T: OnceLock<Table2> = OnceLock::new();
    T.get_or_init(|| {
        let t = table_2(&AntmanSimConfig::default()).expect("Table 2 runs");
        print_table_2(&t);
        t
    })
}

fn paper(label: &str) -> (Option<f64>, Option<f64>) {
    let row = PAPER_TABLE_2
        .iter()
        .find(|r| r.0 == label)
        .expect("a Table 2 column");
    (row.1, row.2)
}

#[test]
fn failures_are_exactly_the_papers() {
    let t = table();
    assert_eq!(t.end("Preempt", "job-a"), Some(JobEnd::Killed));
    assert_eq!(t.end("Pack", "job-b"), Some(JobEnd::OutOfMemory));
    for (label, a, b) in PAPER_TABLE_2 {
        assert_eq!(
            t.jct(label, "job-a").is_some(),
            a.is_some(),
            "{label}: Job-A"
        );
        assert_eq!(
            t.jct(label, "job-b").is_some(),
            b.is_some(),
            "{label}: Job-B"
        );
    }
}

#[test]
fn preempt_and_fifo_follow_from_the_decisions() {
    let t = table();
    let within = |label: &str, job: &str, want: f64| {
        let got = t.jct(label, job).expect("finished");
        assert!(
            (got - want).abs() <= 0.2,
            "{label} {job}: {got:.2} vs {want}"
        );
    };
    // Preempt: B runs alone from its arrival; FIFO: B waits for A (43.0 − 26 + 91.1).
    within("Preempt", "job-b", paper("Preempt").1.expect("published"));
    within("FIFO", "job-b", paper("FIFO").1.expect("published"));
    within("FIFO", "job-a", 43.0);
    within("Pack", "job-a", 43.0);
}

#[test]
fn antman_finishes_both_and_keeps_the_guaranteed_job_whole() {
    let t = table();
    let a = t
        .jct("AntMan", "job-a")
        .expect("Job-A finishes under AntMan");
    let b = t
        .jct("AntMan", "job-b")
        .expect("Job-B finishes under AntMan");
    assert!(b <= 1.015 * 91.1, "Job-B {b:.2} min (paper 91.8)");
    assert!(a <= 1.05 * 43.0, "Job-A {a:.2} min (paper 43.9)");
    let m = t.get("AntMan").expect("run");
    assert_eq!(m.policy_faults, 0);
    assert_eq!(m.coordinator_faults, 0);
    assert!(m.coordinator_actions > 0, "the coordinator acted");
    // B's spilled memory moves back to the GPU once the coordinator raises its limit, and A's
    // as the surge allowance goes: each growth costs about one mini-batch (Fig. 11a), inside
    // the bounds above.
    assert!(m.growths >= 1, "{} growths", m.growths);
    let a = m.jobs.iter().find(|j| j.name == "job-a").expect("job-a");
    assert_eq!(
        a.last_spilled_mib, 1_536,
        "A ends with 2 GB on the GPU and 1.5 GB on the host"
    );
    // Before B's memory settles the coordinator keeps room for a surge (ours: 1 GiB for
    // 30 s), so A spills more for a while.
    assert!(a.max_spilled_mib <= 1_536 + 1_024, "{}", a.max_spilled_mib);
}

#[test]
fn universal_memory_alone_saves_the_guaranteed_job_but_not_its_speed() {
    let t = table();
    let b = t.jct("UMem", "job-b").expect("UMem: Job-B does not fail");
    // Ours: 4.7× from the bandwidth ratio; the paper's 5.9× (docs/reproductions/antman.md).
    assert!(b >= 4.0 * 91.1, "UMem Job-B {b:.1} min (paper 541.6)");
    let a = t.jct("UMem", "job-a").expect("finished");
    assert!(
        (a - 43.4).abs() <= 0.05 * 43.4,
        "UMem Job-A {a:.1} (paper 43.4)"
    );
}

/// The values the paper leaves out, varied one at a time (`--ignored print_sensitivity`):
/// docs/reproductions/antman.md's sensitivity table.
#[test]
#[ignore = "prints the sensitivity table; minutes of runs"]
fn print_sensitivity() {
    use arbiter_sim::models::antman::truth::hotness_from_anchor;
    let base = AntmanSimConfig::default();
    let with_model = |model: &str, f: &dyn Fn(&mut arbiter_sim::models::antman::ModelTruth)| {
        let mut cfg = base.clone();
        if let Some(m) = cfg.models.get_mut(model) {
            f(m);
        }
        cfg
    };
    let cases: Vec<(&str, AntmanSimConfig)> = vec![
        ("defaults", base.clone()),
        (
            "GCN hotness from SR's anchor (-90 % -> 25 % slower)",
            with_model("gcn", &|m| {
                m.spill_hotness = hotness_from_anchor(0.9, 1.0 / 0.75, 75.0)
            }),
        ),
        (
            "ResNet-50 hotness at Fig. 10's bound (-10 % -> 60 % slower)",
            with_model("resnet50", &|m| {
                m.spill_hotness = hotness_from_anchor(0.1, 1.0 / 0.4, 75.0)
            }),
        ),
        (
            "bandwidth ratio 100 (PCIe 3.0 at 9 GB/s)",
            AntmanSimConfig {
                bandwidth_ratio: 100.0,
                ..base.clone()
            },
        ),
        ("GCN demand 0.3", with_model("gcn", &|m| m.demand = 0.3)),
        (
            "ResNet-50 demand 0.7",
            with_model("resnet50", &|m| m.demand = 0.7),
        ),
        (
            "context-switch efficiency 0.8",
            AntmanSimConfig {
                packing_efficiency: 0.8,
                ..base.clone()
            },
        ),
        (
            "coordinator period 5 s",
            AntmanSimConfig {
                coordinator_period_ms: 5_000,
                ..base.clone()
            },
        ),
    ];
    println!("| case | UMem B | AntMan A | AntMan B |");
    println!("|---|---|---|---|");
    for (label, cfg) in cases {
        let t = table_2(&cfg).expect("runs");
        let cell = |v: Option<f64>| v.map_or("Failed".to_string(), |m| format!("{m:.1}"));
        println!(
            "| {label} | {} | {} | {} |",
            cell(t.jct("UMem", "job-b")),
            cell(t.jct("AntMan", "job-a")),
            cell(t.jct("AntMan", "job-b")),
        );
    }
}

/// Fig. 13 (§5.2) on 64 simulated V100s with Philly run times, GPU counts and arrivals: AntMan's
/// average JCT against YARN-CS and Gandiva, medians over five seeds (Fig. 13a), and
/// Tenant-A's jobs (Fig. 13b): under AntMan as fast as under YARN-CS-preempt but with no
/// preemption, slower under Gandiva. The set-up's choices (job count, load, caps) and why
/// Gandiva's ratio and the preempted share miss are in docs/reproductions/antman.md.
#[test]
fn fig_13_antman_cuts_average_jct_against_yarn_cs_and_gandiva() {
    use arbiter_repro::antman::{PAPER_FIG_13_RATIOS, PAPER_FIG_13B_PREEMPTED, TraceSetup, fig_13};
    let seeds = fig_13(&TraceSetup::default()).expect("Fig. 13 runs");
    let mut yarn = Vec::new();
    let mut gandiva = Vec::new();
    let mut gandiva_delays_a = Vec::new();
    for s in &seeds {
        for (label, m) in &s.runs {
            assert_eq!(m.policy_faults, 0, "seed {} {label}", s.seed);
            assert_eq!(m.coordinator_faults, 0, "seed {} {label}", s.seed);
            assert!(
                m.jobs.iter().all(|j| j.end == JobEnd::Finished),
                "seed {} {label}: every job finishes",
                s.seed
            );
        }
        let (y, g) = s.ratios().expect("three runs");
        println!(
            "seed {}: YARN-CS / AntMan {y:.2}, Gandiva / AntMan {g:.2}",
            s.seed
        );
        // Fig. 13b: Tenant-A's jobs.
        let a = |l| s.tenant_a_mean_jct(l).expect("Tenant-A jobs");
        let (all, b) = s.preempted_share("YARN-CS-preempt").expect("a run");
        println!(
            "  Tenant-A mean JCT: YARN-CS {:.1}, YARN-CS-preempt {:.1}, Gandiva {:.1}, AntMan {:.1} min; YARN-CS-preempt preempted {:.0} % of the jobs ({:.0} % of Tenant-B's; paper {:.0} %)",
            a("YARN-CS"),
            a("YARN-CS-preempt"),
            a("Gandiva"),
            a("AntMan"),
            all * 100.0,
            b * 100.0,
            PAPER_FIG_13B_PREEMPTED * 100.0,
        );
        let near_preempt = a("AntMan") / a("YARN-CS-preempt");
        assert!(
            near_preempt <= 1.05,
            "seed {}: Tenant-A's JCT under AntMan within 5 % of YARN-CS-preempt's ({near_preempt:.3})",
            s.seed
        );
        assert_eq!(
            s.preempted_share("AntMan").expect("a run").0,
            0.0,
            "seed {}: AntMan preempts nothing",
            s.seed
        );
        assert!(all > 0.0, "seed {}: YARN-CS-preempt preempts", s.seed);
        gandiva_delays_a.push(a("Gandiva") / a("AntMan"));
        // The paper's order in every seed: AntMan ahead of Gandiva, Gandiva of YARN-CS.
        assert!(
            y > g && g > 1.0,
            "seed {}: AntMan < Gandiva < YARN-CS in mean JCT (Gandiva / AntMan {g:.2}, YARN-CS / AntMan {y:.2})",
            s.seed
        );
        yarn.push(y);
        gandiva.push(g);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (y, g) = (median(&mut yarn), median(&mut gandiva));
    println!(
        "median YARN-CS / AntMan {y:.2} (paper {}), Gandiva / AntMan {g:.2} (paper {})",
        PAPER_FIG_13_RATIOS.0, PAPER_FIG_13_RATIOS.1
    );
    let (py, _) = PAPER_FIG_13_RATIOS;
    assert!(
        (y - py).abs() <= 0.2 * py,
        "YARN-CS / AntMan {y:.2} within 20 % of {py}"
    );
    // Not the paper's 1.84 (± 20 % would need 1.47): Gandiva's packing costs less in our
    // model than on the paper's cluster (see the doc); AntMan stays ahead of it.
    assert!(g >= 1.1, "Gandiva / AntMan {g:.2}");
    // Fig. 13b: "Gandiva delays the completion time of these jobs [Tenant-A's] because of
    // the lack of performance isolation".
    let d = median(&mut gandiva_delays_a);
    println!("median Tenant-A JCT, Gandiva / AntMan {d:.2}");
    assert!(d > 1.0, "Gandiva delays Tenant-A's jobs ({d:.2})");
}

/// Fig. 13's median ratios (YARN-CS / AntMan, Gandiva / AntMan) over the set-up's seeds.
fn fig_13_medians(setup: &arbiter_repro::antman::TraceSetup) -> (f64, f64) {
    medians(&arbiter_repro::antman::fig_13(setup).expect("Fig. 13 runs"))
}

fn medians(seeds: &[arbiter_repro::antman::Fig13Seed]) -> (f64, f64) {
    let median = |pick: fn((f64, f64)) -> f64| {
        let mut v: Vec<f64> = seeds.iter().filter_map(|s| s.ratios()).map(pick).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (median(|r| r.0), median(|r| r.1))
}

/// A setting's mean wait (submit → first start) and mean time from first start to end, in
/// minutes, over every job of every seed: whether it lost by queueing or by running slower.
fn wait_and_run(seeds: &[arbiter_repro::antman::Fig13Seed], label: &str) -> (f64, f64) {
    let (mut wait, mut run, mut n) = (0.0, 0.0, 0.0);
    for (_, metrics) in seeds.iter().flat_map(|s| &s.runs).filter(|r| r.0 == label) {
        for job in &metrics.jobs {
            if let (Some(start), Some(end)) = (job.start_min, job.end_min) {
                wait += start - job.submit_min;
                run += end - start;
                n += 1.0;
            }
        }
    }
    (wait / n, run / n)
}

/// How Fig. 13's ratios move with the time-slicing interference below saturation: none (the
/// model before it was measured), the H100's (the default), and two and four times that
/// (jobs that synchronise many times per step, as ESPnet's decoding does, lose more to
/// every collision than the measured jobs, which synchronise once).
#[test]
#[ignore = "prints the table; minutes of runs"]
fn print_fig_13_interference_sensitivity() {
    use arbiter_repro::antman::TraceSetup;
    let base = TraceSetup::default();
    println!("| κ | YARN-CS / AntMan | Gandiva / AntMan |");
    println!("|---|---|---|");
    for k in [0.0, base.timeslice_interference, 2.42, 4.84] {
        let (y, g) = fig_13_medians(&TraceSetup {
            timeslice_interference: k,
            ..base.clone()
        });
        println!("| {k} | {y:.2} | {g:.2} |");
    }
}

/// How Fig. 13's ratios move when some models synchronise with the host many times per step
/// (the H100's crowding-out below saturation, `truth`'s sync rule): ESPnet (decoding), then
/// also the graph models (sampling), at rates from a few per ms of GPU work to the measured
/// synthetic job's 12 (a sync after every 80 µs kernel). No model's rate is measured.
#[test]
#[ignore = "prints the table; minutes of runs"]
fn print_fig_13_sync_sensitivity() {
    use arbiter_repro::antman::TraceSetup;
    let base = TraceSetup::default();
    println!(
        "| models that synchronise often | syncs per ms of GPU work | YARN-CS / AntMan | Gandiva / AntMan |"
    );
    println!("|---|---|---|---|");
    for (models, rate) in [
        (&["espnet"][..], 1.0),
        (&["espnet"][..], 4.0),
        (&["espnet"][..], 12.0),
        (&["espnet", "graphsage", "gcn"][..], 4.0),
        (&["espnet", "graphsage", "gcn"][..], 12.0),
    ] {
        let mut setup = base.clone();
        for name in models {
            setup
                .models
                .get_mut(*name)
                .expect("a Table 3 model")
                .sync_rate = rate;
        }
        let (y, g) = fig_13_medians(&setup);
        println!("| {} | {rate} | {y:.2} | {g:.2} |", models.join(", "));
    }
}

/// How Fig. 13's ratios move when packed pairs are denser than our demands make them: the
/// graph and recommendation models' demands (ours, not measured; ESPnet's 0.3 is Fig. 12's
/// anchor and kept) raised by a step, doubled, or made as dense as VGG16. Gandiva packs
/// wherever memory fits (the least-utilized such GPU, with no bound on its utilization), so
/// denser light models make its pairs collide and saturate; AntMan lends only GPUs below M
/// and paces the opportunistic side of a guaranteed GPU.
#[test]
#[ignore = "prints the table; minutes of runs"]
fn print_fig_13_demand_sensitivity() {
    use arbiter_repro::antman::TraceSetup;
    const LIGHT: [&str; 4] = ["graphsage", "gcn", "din", "wide-deep"];
    let base = TraceSetup::default();
    println!(
        "| graph and recommendation models' demand | YARN-CS / AntMan | Gandiva / AntMan | AntMan wait, run (min) | Gandiva wait, run |"
    );
    println!("|---|---|---|---|---|");
    type DemandChange = fn(f64) -> f64;
    let rows: [(&str, DemandChange); 4] = [
        ("ours (0.1–0.3, the default)", |d| d),
        ("+ 0.2", |d| d + 0.2),
        ("× 2", |d| d * 2.0),
        ("0.8 (as dense as VGG16)", |_| 0.8),
    ];
    for (label, change) in rows {
        let mut setup = base.clone();
        for name in LIGHT {
            let model = setup.models.get_mut(name).expect("a Table 3 model");
            model.demand = change(model.demand);
        }
        let seeds = arbiter_repro::antman::fig_13(&setup).expect("Fig. 13 runs");
        let (y, g) = medians(&seeds);
        let (aw, ar) = wait_and_run(&seeds, "AntMan");
        let (gw, gr) = wait_and_run(&seeds, "Gandiva");
        println!("| {label} | {y:.2} | {g:.2} | {aw:.0}, {ar:.0} | {gw:.0}, {gr:.0} |");
    }
}

/// How Fig. 13's Gandiva ratio moves when Gandiva has no tenants, as OSDI '18 built it:
/// every job opportunistic to it and any two packed on a GPU, Tenant-A's with each other
/// included (ours by default: Tenant-A's jobs stay guaranteed, so Gandiva packs only a
/// Tenant-B job beside a Tenant-A one). Also Tenant-A's mean JCT (Fig. 13b: "Gandiva delays
/// the completion time of these jobs because of the lack of performance isolation").
#[test]
#[ignore = "prints the table; minutes of runs"]
fn print_fig_13_gandiva_without_tenants() {
    use arbiter_repro::antman::TraceSetup;
    let base = TraceSetup::default();
    println!(
        "| Gandiva | YARN-CS / AntMan | Gandiva / AntMan | Gandiva wait, run (min) | Tenant-A mean JCT: YARN-CS, Gandiva, AntMan |"
    );
    println!("|---|---|---|---|---|");
    for (label, keeps) in [("keeps the QoS (the default)", true), ("no tenants", false)] {
        let seeds = arbiter_repro::antman::fig_13(&TraceSetup {
            gandiva_keeps_qos: keeps,
            ..base.clone()
        })
        .expect("Fig. 13 runs");
        let (y, g) = medians(&seeds);
        let (gw, gr) = wait_and_run(&seeds, "Gandiva");
        println!(
            "| {label} | {y:.2} | {g:.2} | {gw:.0}, {gr:.0} | {:.0}, {:.0}, {:.0} |",
            tenant_a_jct(&seeds, "YARN-CS"),
            tenant_a_jct(&seeds, "Gandiva"),
            tenant_a_jct(&seeds, "AntMan")
        );
    }
}

/// How Fig. 13a's ratios and Fig. 13b's figures move with the offered load: Tenant-A's
/// mean JCT under AntMan over YARN-CS-preempt's (paper: "almost the same") and the share of
/// jobs YARN-CS-preempt preempts (paper: 46 %), a measure of how contended the cluster is.
#[test]
#[ignore = "prints the table; minutes of runs"]
fn print_fig_13_load_sensitivity() {
    use arbiter_repro::antman::TraceSetup;
    let base = TraceSetup::default();
    println!(
        "| load | YARN-CS / AntMan | Gandiva / AntMan | Tenant-A JCT, AntMan / YARN-CS-preempt | preempted by YARN-CS-preempt: all jobs, Tenant-B's |"
    );
    println!("|---|---|---|---|---|");
    for load in [1.0, 1.5, 2.0, 3.0, 4.0] {
        let seeds = arbiter_repro::antman::fig_13(&TraceSetup {
            load,
            ..base.clone()
        })
        .expect("Fig. 13 runs");
        let (y, g) = medians(&seeds);
        let a = tenant_a_jct(&seeds, "AntMan") / tenant_a_jct(&seeds, "YARN-CS-preempt");
        let shares: Vec<(f64, f64)> = seeds
            .iter()
            .map(|s| s.preempted_share("YARN-CS-preempt").expect("a run"))
            .collect();
        let n = shares.len() as f64;
        let all = shares.iter().map(|s| s.0).sum::<f64>() / n;
        let b = shares.iter().map(|s| s.1).sum::<f64>() / n;
        println!(
            "| {load} | {y:.2} | {g:.2} | {a:.3} | {:.0} %, {:.0} % |",
            all * 100.0,
            b * 100.0
        );
    }
}

/// How Fig. 13 moves with the arrival process (the paper gives none; ours Philly's own,
/// Poisson the alternative), and Fig. 13b's "46 % of jobs being preempted" read two ways —
/// jobs preempted at least once, and preemptions per job (a job preempted twice counted
/// twice) — over all jobs and over Tenant-B's, for YARN-CS-preempt as we run it (no GPU
/// lent while a Tenant-A job waits) and for one that lends every idle GPU at once.
#[test]
#[ignore = "prints the table; minutes of runs"]
fn print_fig_13_arrival_sensitivity() {
    use arbiter_repro::antman::{Arrivals, FIG_13_SETTINGS, Setting, TraceSetup, fig_13_with};
    const LENDING: &str = "lending while Tenant-A waits";
    let mut settings = FIG_13_SETTINGS.to_vec();
    settings.push(Setting {
        label: LENDING,
        config: "preemption = true\nhold_idle_for_quota = false",
        ..FIG_13_SETTINGS[3]
    });
    println!(
        "| arrivals | YARN-CS-preempt | YARN-CS / AntMan: median (seeds' range) | Gandiva / AntMan | Tenant-A JCT, AntMan / YARN-CS-preempt | preempted at least once: all jobs, Tenant-B's | preemptions per job: all, Tenant-B's |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mean = |v: Vec<(f64, f64)>| {
        let n = v.len() as f64;
        (
            v.iter().map(|x| x.0).sum::<f64>() / n,
            v.iter().map(|x| x.1).sum::<f64>() / n,
        )
    };
    for arrivals in [Arrivals::Poisson, Arrivals::Philly] {
        let setup = TraceSetup {
            arrivals,
            ..TraceSetup::default()
        };
        let seeds = fig_13_with(&setup, &settings).expect("Fig. 13 runs");
        let (y, g) = medians(&seeds);
        let range = |pick: fn((f64, f64)) -> f64| {
            let v: Vec<f64> = seeds.iter().filter_map(|s| s.ratios()).map(pick).collect();
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!("({lo:.2}–{hi:.2})")
        };
        let (yr, gr) = (range(|r| r.0), range(|r| r.1));
        for label in ["YARN-CS-preempt", LENDING] {
            let a = tenant_a_jct(&seeds, "AntMan") / tenant_a_jct(&seeds, label);
            let share = mean(
                seeds
                    .iter()
                    .map(|s| s.preempted_share(label).expect("a run"))
                    .collect(),
            );
            let events = mean(
                seeds
                    .iter()
                    .map(|s| s.preemptions_per_job(label).expect("a run"))
                    .collect(),
            );
            println!(
                "| {arrivals:?} | {label} | {y:.2} {yr} | {g:.2} {gr} | {a:.3} | {:.0} %, {:.0} % | {:.2}, {:.2} |",
                share.0 * 100.0,
                share.1 * 100.0,
                events.0,
                events.1
            );
        }
    }
}

/// `Arrivals::Philly`: a seed's jobs are consecutive Philly submissions, in order, with
/// their own run times and GPU counts, at the set-up's offered load, and burstier than
/// Poisson (the gaps' coefficient of variation 1.3 times Poisson's 1 or more; 1.7–11.5 in seeds 1–5).
#[test]
fn philly_arrivals_are_consecutive_submissions_at_the_offered_load() {
    use arbiter_repro::antman::{Arrivals, TraceSetup, philly_shapes, trace_scenario};
    let setup = TraceSetup {
        arrivals: Arrivals::Philly,
        ..TraceSetup::default()
    };
    let shapes = philly_shapes(&setup).expect("the Philly table");
    let poisson_setup = TraceSetup {
        arrivals: Arrivals::Poisson,
        ..TraceSetup::default()
    };
    let poisson_shapes = philly_shapes(&poisson_setup).expect("the Philly table");
    assert!(
        shapes.is_sorted_by_key(|j| j.submit_s),
        "in submission order for Philly arrivals"
    );
    let gaps_cv = |arrivals: &[f64]| {
        let gaps: Vec<f64> = arrivals.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        var.sqrt() / mean
    };
    for seed in 1..=5 {
        let cfg = trace_scenario(&setup, &shapes, &[], seed).expect("a scenario");
        let jobs = &cfg.jobs;
        assert_eq!(jobs.len(), setup.jobs);
        // A window of the table in submission order, found by its shapes, its gaps scaled
        // by one factor.
        let start = (0..=shapes.len() - jobs.len())
            .find(|&k| {
                jobs.iter()
                    .zip(&shapes[k..])
                    .all(|(j, s)| (j.minutes - s.secs / 60.0).abs() < 1e-9 && j.workers == s.gpus)
            })
            .expect("the jobs are a run of consecutive Philly submissions");
        let window = &shapes[start..start + jobs.len()];
        let since_first =
            |s: &arbiter_repro::antman::PhillyShape| (s.submit_s - window[0].submit_s) as f64;
        let factor = jobs[jobs.len() - 1].arrival_min / since_first(&window[window.len() - 1]);
        for (j, s) in jobs.iter().zip(window) {
            assert!(
                (j.arrival_min - since_first(s) * factor).abs() < 1e-6,
                "seed {seed}: {} arrives at {} min, its submission scaled is {}",
                j.name,
                j.arrival_min,
                since_first(s) * factor
            );
        }
        let arrivals: Vec<f64> = jobs.iter().map(|j| j.arrival_min).collect();
        assert!(
            arrivals.windows(2).all(|w| w[0] <= w[1]),
            "in submission order"
        );
        // Offered load: the mean gap is the Poisson one, 1 / rate with rate · mean GPU-min = 64.
        let mean_gpu_min = jobs
            .iter()
            .map(|j| j.minutes * f64::from(j.workers))
            .sum::<f64>()
            / jobs.len() as f64;
        let mean_gap = (arrivals[arrivals.len() - 1] - arrivals[0]) / (arrivals.len() - 1) as f64;
        let load = mean_gpu_min / mean_gap / 64.0;
        assert!(
            (load - setup.load).abs() < 1e-9,
            "seed {seed}: offered load {load}"
        );
        let poisson =
            trace_scenario(&poisson_setup, &poisson_shapes, &[], seed).expect("a scenario");
        let poisson: Vec<f64> = poisson.jobs.iter().map(|j| j.arrival_min).collect();
        let (cv, cv_poisson) = (gaps_cv(&arrivals), gaps_cv(&poisson));
        println!(
            "seed {seed}: gaps' coefficient of variation, Philly {cv:.2}, Poisson {cv_poisson:.2}"
        );
        assert!(
            cv > 1.3 * cv_poisson,
            "seed {seed}: Philly's arrivals bunch ({cv:.2} vs {cv_poisson:.2})"
        );
    }
}

/// Tenant-A's mean JCT under `label`, the mean over the seeds.
fn tenant_a_jct(seeds: &[arbiter_repro::antman::Fig13Seed], label: &str) -> f64 {
    let v: Vec<f64> = seeds
        .iter()
        .map(|s| s.tenant_a_mean_jct(label).expect("Tenant-A finished jobs"))
        .collect();
    v.iter().sum::<f64>() / v.len() as f64
}

/// Fig. 12 (§5.1) end to end: packed without control, ESPnet crawls (the calibration's
/// anchor: 20.1 → 105.2 min); under AntMan's coordinator it keeps its speed (paper 20.8)
/// while ResNet-50 gets what ESPnet leaves.
#[test]
fn fig_12_the_coordinator_keeps_espnet_at_its_speed_beside_resnet50() {
    use arbiter_repro::antman::{PAPER_FIG_12_ESPNET_MIN, fig_12};
    let runs = fig_12().expect("Fig. 12 runs");
    let jct = |label: &str, job: &str| {
        runs.iter()
            .find(|r| r.0 == label)
            .and_then(|r| r.1.jobs.iter().find(|j| j.name == job))
            .and_then(|j| j.jct_min)
            .unwrap_or_else(|| panic!("{label}: {job} finished"))
    };
    let (alone, packed, _) = PAPER_FIG_12_ESPNET_MIN;
    let g = jct("Gandiva", "espnet");
    let a = jct("AntMan", "espnet");
    println!(
        "ESPnet: Gandiva {g:.1} min (paper {packed}), AntMan {a:.1} min (paper {}); \
         ResNet-50: Gandiva {:.1}, AntMan {:.1} min (120 alone)",
        PAPER_FIG_12_ESPNET_MIN.2,
        jct("Gandiva", "resnet50"),
        jct("AntMan", "resnet50")
    );
    assert!(g >= 3.0 * alone, "packed ESPnet slows >= 3x: {g:.1}");
    assert!(a <= 1.05 * alone, "ESPnet under AntMan within 5 %: {a:.1}");
}

/// The PAI mini-batch traces' straggler factors (Σ slowest / Σ median worker per step), which
/// the trace experiment gives its gangs: 1.09–1.12 for jobs 1–3, 2.80 for job 4 (workers on
/// half a GPU each), as measured for the brief.
#[test]
fn pai_mini_batch_traces_give_the_straggler_factors() {
    let f = arbiter_repro::antman::pai_straggler_factors().expect("the mini-batch traces");
    assert_eq!(f.len(), 4);
    for (job, &x) in f.iter().enumerate().take(3) {
        assert!((1.08..=1.13).contains(&x), "job {}: {x:.3}", job + 1);
    }
    assert!((f[3] - 2.80).abs() < 0.05, "job 4: {:.3}", f[3]);
}
