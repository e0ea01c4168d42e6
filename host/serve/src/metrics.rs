//! Prometheus text exposition: counters, gauges and latency histograms.

use std::collections::BTreeMap;
use std::fmt::Write;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

#[derive(Clone, Debug, Default)]
pub struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    pub fn observe(&mut self, seconds: f64) {
        self.count += 1;
        self.sum += seconds;
        for (i, bound) in BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                self.counts[i] += 1;
            }
        }
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// Adds another histogram's observations.
    pub fn add(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.count += other.count;
        self.sum += other.sum;
    }

    /// The `q` quantile, by linear interpolation inside its bucket.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let rank = q * self.count as f64;
        let mut lower = (0.0, 0u64);
        for (i, &c) in self.counts.iter().enumerate() {
            if c as f64 >= rank {
                let span = (c - lower.1).max(1) as f64;
                let frac = (rank - lower.1 as f64) / span;
                return lower.0 + (BUCKETS[i] - lower.0) * frac.clamp(0.0, 1.0);
            }
            lower = (BUCKETS[i], c);
        }
        BUCKETS[BUCKETS.len() - 1]
    }
}

/// A metric family being written.
pub struct Exposition {
    out: String,
}

fn labels(pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| {
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{k}=\"{v}\"")
        })
        .collect();
    format!("{{{}}}", inner.join(","))
}

impl Default for Exposition {
    fn default() -> Self {
        Self::new()
    }
}

impl Exposition {
    pub fn new() -> Self {
        Exposition { out: String::new() }
    }

    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    pub fn sample(&mut self, name: &str, pairs: &[(&str, &str)], value: f64) {
        let _ = writeln!(self.out, "{name}{} {value}", labels(pairs));
    }

    pub fn histogram(&mut self, name: &str, pairs: &[(&str, &str)], h: &Histogram) {
        for (i, bound) in BUCKETS.iter().enumerate() {
            let le = bound.to_string();
            let mut with_le = pairs.to_vec();
            with_le.push(("le", &le));
            let _ = writeln!(
                self.out,
                "{name}_bucket{} {}",
                labels(&with_le),
                h.counts[i]
            );
        }
        let mut inf = pairs.to_vec();
        inf.push(("le", "+Inf"));
        let _ = writeln!(self.out, "{name}_bucket{} {}", labels(&inf), h.count);
        let _ = writeln!(self.out, "{name}_sum{} {}", labels(pairs), h.sum);
        let _ = writeln!(self.out, "{name}_count{} {}", labels(pairs), h.count);
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// Round latency per (slot, generation), and fault counters.
#[derive(Clone, Debug, Default)]
pub struct PolicyMetrics {
    /// (slot, generation label) → latency of the policy's part of a round.
    pub latency: BTreeMap<(String, String), Histogram>,
    /// (slot, generation, kind) → faults.
    pub faults: BTreeMap<(String, String, String), u64>,
    /// cell → rounds served by a fallback (older generation or native).
    pub fallbacks: BTreeMap<String, u64>,
    /// cell → rounds.
    pub rounds: BTreeMap<String, u64>,
    /// cell → whole-round latency.
    pub round_latency: BTreeMap<String, Histogram>,
    /// Encoding and appending one journal record.
    pub journal: Histogram,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_quantiles_monotone() {
        let mut h = Histogram::default();
        for ms in [0.05, 0.3, 0.3, 2.0, 40.0] {
            h.observe(ms / 1e3);
        }
        let mut e = Exposition::new();
        e.family("x_seconds", "histogram", "test");
        e.histogram("x_seconds", &[("policy", "a\"b")], &h);
        let text = e.finish();
        assert!(text.contains("x_seconds_bucket{policy=\"a\\\"b\",le=\"0.0001\"} 1"));
        assert!(text.contains("x_seconds_bucket{policy=\"a\\\"b\",le=\"+Inf\"} 5"));
        assert!(text.contains("x_seconds_count{policy=\"a\\\"b\"} 5"));
        assert!(h.quantile(0.5) <= h.quantile(0.99));
        assert!(h.quantile(0.99) <= 0.05);
    }
}
