//! `--report <dir>`: per-task CSV, time-series CSV, and one HTML page with
//! inline SVG plots (no scripts, no external files: it opens anywhere).

use crate::metrics::SeriesPoint;
use crate::{RunOutput, SimOutput};
use anyhow::Context;
use std::fmt::Write as _;
use std::path::Path;

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// A run's label in legends: policy, plus the seed when several seeds ran.
fn label(run: &RunOutput, many_seeds: bool) -> String {
    if many_seeds {
        format!("{} (seed {})", run.policy, run.seed)
    } else {
        run.policy.clone()
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or(String::new(), |v| format!("{v:.3}"))
}

/// Writes one CSV file with `csv`'s writer (quoting, escaping).
fn write_csv<const N: usize>(
    path: &Path,
    header: [&str; N],
    rows: impl Iterator<Item = [String; N]>,
) -> anyhow::Result<()> {
    let mut w =
        csv::Writer::from_path(path).with_context(|| format!("creating {}", path.display()))?;
    w.write_record(header)
        .and_then(|()| rows.into_iter().try_for_each(|r| w.write_record(&r)))
        .and_then(|()| w.flush().map_err(csv::Error::from))
        .with_context(|| format!("writing {}", path.display()))
}

/// Writes `tasks.csv`, `series.csv` and `index.html` under `dir`.
pub fn write(dir: &Path, output: &SimOutput) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tasks = output.runs.iter().flat_map(|run| {
        run.records.iter().map(move |r| {
            [
                run.policy.clone(),
                run.seed.to_string(),
                r.task.clone(),
                format!("{:.3}", r.arrival_s),
                opt(r.start_s),
                opt(r.end_s),
                opt(r.queue_s()),
                opt(r.jct_s()),
                r.gpus.to_string(),
                r.outcome.to_string(),
            ]
        })
    });
    write_csv(
        &dir.join("tasks.csv"),
        [
            "policy",
            "seed",
            "task",
            "arrival_s",
            "start_s",
            "end_s",
            "queue_s",
            "jct_s",
            "gpus",
            "outcome",
        ],
        tasks,
    )?;
    let x_name = if output.scenario.protocol.by_arrived_load() {
        "arrived_gpu_pct"
    } else {
        "time_s"
    };
    let series = output.runs.iter().flat_map(|run| {
        run.series.iter().map(move |p| {
            [
                run.policy.clone(),
                run.seed.to_string(),
                format!("{:.3}", p.x),
                format!("{:.4}", p.gpu_alloc_pct),
                opt(p.frag_ratio_pct),
                opt(p.frag_gpus),
                p.pending.to_string(),
                p.running.to_string(),
            ]
        })
    });
    write_csv(
        &dir.join("series.csv"),
        [
            "policy",
            "seed",
            x_name,
            "gpu_alloc_pct",
            "frag_ratio_pct",
            "frag_gpus",
            "pending",
            "running",
        ],
        series,
    )?;
    let write_file = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
    };
    write_file("index.html", &html(output))?;
    // The allocation chart alone, for documents that embed it.
    write_file("allocation.svg", &allocation_chart(output))?;
    Ok(())
}

/// One plotted line.
struct Line {
    name: String,
    points: Vec<(f64, f64)>,
    dashed: bool,
}

/// An SVG line chart with axes, ticks and a legend.
fn chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    lines: &[Line],
    y_range: Option<(f64, f64)>,
) -> String {
    let (w, h) = (760.0, 380.0);
    let (left, right, top, bottom) = (64.0, 180.0, 34.0, 48.0);
    let all = lines
        .iter()
        .flat_map(|l| l.points.iter())
        .filter(|(x, y)| x.is_finite() && y.is_finite());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if let Some((a, b)) = y_range {
        (y0, y1) = (a, b);
    }
    if x1 - x0 < 1e-9 {
        x1 = x0 + 1.0;
    }
    if y1 - y0 < 1e-9 {
        y1 = y0 + 1.0;
    }
    let pw = w - left - right;
    let ph = h - top - bottom;
    let sx = |x: f64| left + (x - x0) / (x1 - x0) * pw;
    let sy = |y: f64| top + ph - (y.clamp(y0, y1) - y0) / (y1 - y0) * ph;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{left}" y="20" font-size="14" font-weight="bold">{}</text>"#,
        escape(title)
    );
    for i in 0..=5 {
        let fy = y0 + (y1 - y0) * f64::from(i) / 5.0;
        let py = sy(fy);
        let _ = write!(
            s,
            r##"<line x1="{left}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            left + pw,
            left - 6.0,
            py + 4.0,
            tick(fy)
        );
        let fx = x0 + (x1 - x0) * f64::from(i) / 5.0;
        let px = sx(fx);
        let _ = write!(
            s,
            r##"<line x1="{px:.1}" y1="{top}" x2="{px:.1}" y2="{:.1}" stroke="#f0f0f0"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            top + ph,
            top + ph + 16.0,
            tick(fx)
        );
    }
    let _ = write!(
        s,
        r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
        left + pw / 2.0,
        h - 10.0,
        escape(x_label),
        top + ph / 2.0,
        escape(y_label)
    );
    for (i, line) in lines.iter().enumerate() {
        let color = if line.dashed {
            "#999"
        } else {
            COLORS[i % COLORS.len()]
        };
        let dash = if line.dashed {
            r#" stroke-dasharray="5 4""#
        } else {
            ""
        };
        let mut pts = String::new();
        for &(x, y) in line
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
        {
            let _ = write!(pts, "{:.1},{:.1} ", sx(x), sy(y));
        }
        let _ = write!(
            s,
            r#"<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.8"{dash}/>"#
        );
        let ly = top + 14.0 + 18.0 * i as f64;
        let lx = left + pw + 12.0;
        let _ = write!(
            s,
            r#"<line x1="{lx}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{color}" stroke-width="2.5"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            ly - 4.0,
            lx + 18.0,
            ly - 4.0,
            lx + 24.0,
            ly,
            escape(&line.name)
        );
    }
    s.push_str("</svg>");
    s
}

fn tick(v: f64) -> String {
    if v.abs() >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v.abs() >= 100.0 || v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn lines(output: &SimOutput, f: impl Fn(&SeriesPoint) -> Option<f64>, x_scale: f64) -> Vec<Line> {
    let many_seeds = output.runs.len() > output.fgd_summary.len().max(1) || {
        let mut seeds: Vec<u64> = output.runs.iter().map(|r| r.seed).collect();
        seeds.dedup();
        seeds.len() > 1
    };
    output
        .runs
        .iter()
        .map(|run| Line {
            name: label(run, many_seeds),
            points: run
                .series
                .iter()
                .filter_map(|p| f(p).map(|y| (p.x / x_scale, y)))
                .collect(),
            dashed: false,
        })
        .collect()
}

/// Seconds → the unit that suits the replay's length.
fn time_unit(output: &SimOutput) -> (f64, &'static str) {
    let end = output
        .runs
        .iter()
        .flat_map(|r| r.series.last())
        .map(|p| p.x)
        .fold(0.0, f64::max);
    if end > 3.0 * 86_400.0 {
        (86_400.0, "days")
    } else if end > 3.0 * 3600.0 {
        (3600.0, "hours")
    } else {
        (60.0, "minutes")
    }
}

fn allocation_chart(output: &SimOutput) -> String {
    if output.scenario.protocol.by_arrived_load() {
        let mut l = lines(output, |p| Some(p.gpu_alloc_pct), 1.0);
        let end = output
            .runs
            .iter()
            .flat_map(|r| r.series.last())
            .map(|p| p.x)
            .fold(100.0, f64::max);
        l.push(Line {
            name: "arrived = allocated".into(),
            points: vec![(0.0, 0.0), (100.0, 100.0), (end, 100.0)],
            dashed: true,
        });
        chart(
            "GPU allocation vs arrived GPU request",
            "arrived GPU request (% of capacity)",
            "GPUs allocated (%)",
            &l,
            Some((0.0, 100.0)),
        )
    } else {
        let (scale, unit) = time_unit(output);
        chart(
            "GPU allocation over time",
            &format!("virtual time ({unit})"),
            "GPUs allocated (%)",
            &lines(output, |p| Some(p.gpu_alloc_pct), scale),
            Some((0.0, 100.0)),
        )
    }
}

fn html(output: &SimOutput) -> String {
    let s = &output.scenario;
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Arbiter simulation: {}</title>\
<style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}}table{{border-collapse:collapse}}\
td,th{{padding:4px 10px;border-bottom:1px solid #ddd;text-align:right}}th:first-child,td:first-child{{text-align:left}}\
pre{{background:#f6f6f6;padding:1em;overflow:auto}}</style></head><body>",
        escape(&s.name)
    );
    let _ = write!(
        h,
        "<h1>{}</h1><p>{} protocol · {} nodes · {} GPUs · {} tasks{}</p>",
        escape(&s.name),
        s.protocol,
        s.nodes,
        s.gpus,
        s.tasks,
        if s.rejected > 0 {
            format!(" · {} rejected up front", s.rejected)
        } else {
            String::new()
        }
    );
    let _ = write!(h, "<pre>{}</pre>", escape(&output.human()));
    h.push_str(&allocation_chart(output));
    if s.protocol.by_arrived_load() {
        let l = lines(output, |p| p.frag_ratio_pct, 1.0);
        h.push_str(&chart(
            "GPU fragmentation ratio (FGD's F(M) / idle GPU capacity)",
            "arrived GPU request (% of capacity)",
            "fragmentation (% of idle)",
            &l,
            Some((0.0, 100.0)),
        ));
        let l = lines(output, |p| p.frag_gpus, 1.0);
        h.push_str(&chart(
            "GPU fragmentation amount",
            "arrived GPU request (% of capacity)",
            "fragmented GPUs",
            &l,
            None,
        ));
    } else {
        let (scale, unit) = time_unit(output);
        let x = format!("virtual time ({unit})");
        h.push_str(&chart(
            "Jobs waiting",
            &x,
            "pending jobs",
            &lines(output, |p| Some(p.pending as f64), scale),
            None,
        ));
        h.push_str(&chart(
            "GPU fragmentation ratio (FGD's F(M) / idle GPU capacity)",
            &x,
            "fragmentation (% of idle)",
            &lines(output, |p| p.frag_ratio_pct, scale),
            Some((0.0, 100.0)),
        ));
        // Queueing delay CDF per run.
        let mut cdf = Vec::new();
        for run in &output.runs {
            let mut q: Vec<f64> = run.records.iter().filter_map(|r| r.queue_s()).collect();
            q.sort_by(f64::total_cmp);
            let n = q.len().max(1) as f64;
            let step = (q.len() / 400).max(1);
            let points = q
                .iter()
                .enumerate()
                .filter(|(i, _)| i % step == 0 || *i + 1 == q.len())
                .map(|(i, v)| (v / 60.0, 100.0 * (i + 1) as f64 / n))
                .collect();
            cdf.push(Line {
                name: run.policy.clone(),
                points,
                dashed: false,
            });
        }
        h.push_str(&chart(
            "Queueing delay (CDF)",
            "queueing delay (minutes)",
            "jobs started (%)",
            &cdf,
            Some((0.0, 100.0)),
        ));
    }
    h.push_str("<p>Data: <a href=\"tasks.csv\">tasks.csv</a> · <a href=\"series.csv\">series.csv</a></p></body></html>\n");
    h
}
