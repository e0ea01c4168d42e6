//! Metrics: the plane's latency histograms (with the quantiles `top` shows)
//! and their exposition, encoded by `prometheus-client`.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;

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

    /// (upper bound, observations in that bucket alone), `+Inf` last.
    fn buckets(&self) -> Vec<(f64, u64)> {
        let mut below = 0;
        let mut out: Vec<(f64, u64)> = BUCKETS
            .iter()
            .zip(self.counts)
            .map(|(&bound, cumulative)| {
                let here = cumulative - below;
                below = cumulative;
                (bound, here)
            })
            .collect();
        out.push((f64::INFINITY, self.count - below));
        out
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

/// Label pairs of one sample.
type Labels = Vec<(String, String)>;

fn owned(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// A gauge's value: integral ones print as integers.
#[derive(Clone, Copy, Debug)]
pub enum GaugeValue {
    Int(i64),
    Float(f64),
}

#[derive(Debug)]
enum Samples {
    Counter(Vec<(Labels, u64)>),
    Gauge(Vec<(Labels, GaugeValue)>),
    Histogram(Vec<(Labels, Histogram)>),
}

#[derive(Debug)]
struct Family {
    name: String,
    help: String,
    samples: Samples,
}

/// One scrape: metric families read from the plane's own counters, encoded
/// in the OpenMetrics text format by `prometheus-client` (names, label
/// escaping, `_total` and histogram series, `# EOF`).
#[derive(Debug, Default)]
pub struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    pub fn new() -> Self {
        Exposition::default()
    }

    /// A counter family; `name` without `_total` (the encoder adds it).
    pub fn counter<'a>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Vec<(&'a str, &'a str)>, u64)>,
    ) {
        let samples = samples.into_iter().map(|(l, v)| (owned(&l), v)).collect();
        self.push(name, help, Samples::Counter(samples));
    }

    pub fn gauge<'a>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Vec<(&'a str, &'a str)>, GaugeValue)>,
    ) {
        let samples = samples.into_iter().map(|(l, v)| (owned(&l), v)).collect();
        self.push(name, help, Samples::Gauge(samples));
    }

    pub fn histogram<'a>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Vec<(&'a str, &'a str)>, &'a Histogram)>,
    ) {
        let samples = samples
            .into_iter()
            .map(|(l, h)| (owned(&l), h.clone()))
            .collect();
        self.push(name, help, Samples::Histogram(samples));
    }

    fn push(&mut self, name: &str, help: &str, samples: Samples) {
        self.families.push(Family {
            name: name.to_string(),
            help: help.to_string(),
            samples,
        });
    }

    /// The OpenMetrics text.
    pub fn finish(self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &registry) {
            // Writing to a String cannot fail; a collector bug must not take the endpoint down.
            tracing::error!(error = %e, "encoding metrics");
        }
        out
    }
}

/// Encodes one sample, under its labels if it has any (no `{}` otherwise).
fn with_labels(
    metric: &mut MetricEncoder<'_>,
    labels: &Labels,
    encode: impl FnOnce(&mut MetricEncoder<'_>) -> Result<(), std::fmt::Error>,
) -> Result<(), std::fmt::Error> {
    if labels.is_empty() {
        encode(metric)
    } else {
        encode(&mut metric.encode_family(labels)?)
    }
}

impl Collector for Exposition {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in &self.families {
            let kind = match family.samples {
                Samples::Counter(_) => MetricType::Counter,
                Samples::Gauge(_) => MetricType::Gauge,
                Samples::Histogram(_) => MetricType::Histogram,
            };
            let mut metric = encoder.encode_descriptor(&family.name, &family.help, None, kind)?;
            match &family.samples {
                Samples::Counter(samples) => {
                    for (labels, value) in samples {
                        with_labels(&mut metric, labels, |m| {
                            m.encode_counter::<NoLabelSet, _, u64>(value, None)
                        })?;
                    }
                }
                Samples::Gauge(samples) => {
                    for (labels, value) in samples {
                        with_labels(&mut metric, labels, |m| match *value {
                            GaugeValue::Int(v) => m.encode_gauge(&v),
                            GaugeValue::Float(v) => m.encode_gauge(&v),
                        })?;
                    }
                }
                Samples::Histogram(samples) => {
                    for (labels, h) in samples {
                        with_labels(&mut metric, labels, |m| {
                            m.encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets(), None)
                        })?;
                    }
                }
            }
        }
        Ok(())
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
    /// (slot, generation label) → fuel its rounds consumed (with `--fuel`).
    pub fuel: BTreeMap<(String, String), u64>,
    /// cell → rounds.
    pub rounds: BTreeMap<String, u64>,
    /// cell → whole-round latency.
    pub round_latency: BTreeMap<String, Histogram>,
    /// Encoding and appending one journal record.
    pub journal: Histogram,
    /// Node-link updates acknowledged, by outcome ("applied", "refused").
    pub node_updates: BTreeMap<&'static str, u64>,
    /// Ended jobs dropped by retention.
    pub jobs_dropped: u64,
    /// Jobs that ended, by final state name.
    pub jobs_ended: BTreeMap<&'static str, u64>,
}

/// How a serving generation is labelled in the metrics: its id, or `native`.
pub fn generation_label(generation: Option<u64>) -> String {
    generation.map_or_else(|| "native".to_string(), |g| g.to_string())
}

impl PolicyMetrics {
    /// Counts one fault of `slot`'s `generation` (`None`: the native policy) of `kind`.
    pub fn count_fault(&mut self, slot: &str, generation: Option<u64>, kind: &str) {
        *self
            .faults
            .entry((
                slot.to_string(),
                generation_label(generation),
                kind.to_string(),
            ))
            .or_default() += 1;
    }
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
        e.histogram("x_seconds", "test", [(vec![("policy", "a\"b")], &h)]);
        e.counter("x_rounds", "test", [(vec![("cell", "c")], 3)]);
        e.gauge("x_up", "test", [(vec![], GaugeValue::Int(1))]);
        let text = e.finish();
        assert!(
            text.contains("x_seconds_bucket{le=\"0.0001\",policy=\"a\\\"b\"} 1"),
            "{text}"
        );
        assert!(text.contains("x_seconds_bucket{le=\"+Inf\",policy=\"a\\\"b\"} 5"));
        assert!(text.contains("x_seconds_count{policy=\"a\\\"b\"} 5"));
        assert!(text.contains("# TYPE x_rounds counter"));
        assert!(text.contains("x_rounds_total{cell=\"c\"} 3"));
        assert!(text.contains("x_up 1\n"));
        assert!(text.ends_with("# EOF\n"));
        assert!(h.quantile(0.5) <= h.quantile(0.99));
        assert!(h.quantile(0.99) <= 0.05);
    }
}
