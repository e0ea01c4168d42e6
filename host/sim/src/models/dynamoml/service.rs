//! The inference service's ground truth: how many clients are active each
//! minute (the demand curve) and what response time and request rate a
//! number of ready replicas gives them.
//!
//! DynamoML's clients are closed-loop ("the number of concurrent active web
//! clients", §4): each sends a request, waits for the answer, thinks, and
//! sends the next. So an overloaded service does not build an unbounded
//! queue — its response time grows with clients per replica, and its
//! request rate saturates at its capacity. The model is exact Mean Value
//! Analysis of that closed network: a delay station (think time `Z`) and
//! `c` replicas of service time `S` each, the multi-server station taken as
//! Seidmann's approximation (a queue of demand `S/c` plus a delay of
//! `S·(c−1)/c`). It gives the mean response time; every request of an
//! interval is counted at that mean (tails within an interval are not
//! modelled).

use crate::models::aryl::InferenceDemand;
use anyhow::{Context, bail};
use arbiter_traces::genai::LoraRequest;
use serde::{Deserialize, Serialize};

/// Mean response time (ms) and throughput (requests/s) of `clients`
/// closed-loop clients on `replicas` replicas; fractional clients are
/// interpolated between the neighbouring whole numbers. No replica: no
/// answers (infinite response time, no throughput).
pub fn closed_loop(clients: f64, replicas: u32, service_ms: f64, think_ms: f64) -> (f64, f64) {
    if replicas == 0 {
        return (f64::INFINITY, 0.0);
    }
    let clients = clients.max(0.0);
    let low = clients.floor();
    let frac = clients - low;
    let (r0, x0) = mva(low as u64, replicas, service_ms, think_ms);
    if frac == 0.0 {
        return (r0, x0);
    }
    let (r1, x1) = mva(low as u64 + 1, replicas, service_ms, think_ms);
    (r0 + frac * (r1 - r0), x0 + frac * (x1 - x0))
}

/// Exact MVA for `n` clients; (response ms, throughput per second).
fn mva(n: u64, replicas: u32, service_ms: f64, think_ms: f64) -> (f64, f64) {
    let c = f64::from(replicas);
    let queueing = service_ms / c;
    let delay = service_ms - queueing;
    if n == 0 {
        return (service_ms, 0.0);
    }
    let mut queue = 0.0;
    let mut response = queueing;
    let mut throughput = 0.0;
    for k in 1..=n {
        response = queueing * (1.0 + queue);
        throughput = k as f64 / (response + delay + think_ms);
        queue = throughput * response;
    }
    (response + delay, throughput * 1000.0)
}

/// Where the demand curve comes from (every field has a default).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DemandShape {
    /// Width of a bucket of the trace's typical day; one bucket is one
    /// minute of the scenario.
    pub bucket_s: u64,
    /// Second of the day of the first bucket (ours: 17:20, the evening of
    /// the LoRA trace's day, where it rises, falls and rises again as
    /// DynamoML's Fig. 4 does).
    pub start_of_day_s: u64,
    /// Minutes of the scenario's curve; it repeats after them.
    pub minutes: u32,
    /// Replicas the busiest minute needs (the paper: 12).
    pub peak_replicas: f64,
    /// Replicas the minutes `low_from..low_to` need on average (the paper:
    /// 4 at 18–20 min).
    pub low_replicas: f64,
    pub low_from: u32,
    pub low_to: u32,
}

impl Default for DemandShape {
    fn default() -> Self {
        DemandShape {
            bucket_s: 600,
            start_of_day_s: 17 * 3600 + 20 * 60,
            minutes: 30,
            peak_replicas: 12.0,
            low_replicas: 4.0,
            low_from: 18,
            low_to: 21,
        }
    }
}

impl DemandShape {
    pub fn check(&self) -> anyhow::Result<()> {
        if self.bucket_s == 0 || 86_400 % self.bucket_s != 0 {
            bail!("bucket_s must divide a day");
        }
        if self.minutes == 0 || self.low_from >= self.low_to || self.low_to > self.minutes {
            bail!("need 0 <= low_from < low_to <= minutes, minutes > 0");
        }
        if !(self.peak_replicas > self.low_replicas && self.low_replicas > 0.0) {
            bail!("need peak_replicas > low_replicas > 0");
        }
        Ok(())
    }
}

/// Replicas the service needs, minute by minute (repeating).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServiceDemand {
    pub replicas: Vec<f64>,
}

impl ServiceDemand {
    /// From the GenAI LoRA trace's typical day (mean concurrency per bucket
    /// over its whole days): `shape.minutes` buckets from
    /// `shape.start_of_day_s`, mapped affinely so that the window's busiest
    /// bucket needs `peak_replicas` and the low minutes need `low_replicas`
    /// on average — the two facts the paper states about its curve. A bucket
    /// below the map's zero needs none.
    pub fn from_lora(requests: &[LoraRequest], shape: &DemandShape) -> anyhow::Result<Self> {
        shape.check()?;
        let day = InferenceDemand::from_lora(requests, shape.bucket_s, 1.0)
            .context("the LoRA trace's daily profile")?;
        let per_day = day.utilization.len();
        let first = (shape.start_of_day_s / shape.bucket_s) as usize;
        let window: Vec<f64> = (0..shape.minutes as usize)
            .map(|m| day.utilization[(first + m) % per_day])
            .collect();
        Self::shaped(&window, shape)
    }

    /// `window` (any unit) mapped as [`ServiceDemand::from_lora`] says.
    pub fn shaped(window: &[f64], shape: &DemandShape) -> anyhow::Result<Self> {
        shape.check()?;
        let peak = window.iter().copied().fold(f64::MIN, f64::max);
        let low_range = shape.low_from as usize..(shape.low_to as usize).min(window.len());
        let low_values = window.get(low_range).unwrap_or(&[]);
        if low_values.is_empty() {
            bail!("the window has no low minutes");
        }
        let low = low_values.iter().sum::<f64>() / low_values.len() as f64;
        if peak.is_nan() || low.is_nan() || peak <= low {
            bail!("the window's peak ({peak}) is not above its low minutes ({low})");
        }
        let per_unit = (shape.peak_replicas - shape.low_replicas) / (peak - low);
        Ok(ServiceDemand {
            replicas: window
                .iter()
                .map(|v| (shape.low_replicas + (v - low) * per_unit).max(0.0))
                .collect(),
        })
    }

    /// Replicas needed during minute `minute` (the curve repeats).
    pub fn at_minute(&self, minute: u64) -> f64 {
        if self.replicas.is_empty() {
            return 0.0;
        }
        self.replicas[(minute % self.replicas.len() as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_client_alone_waits_only_for_service() {
        let (r, x) = closed_loop(1.0, 4, 40.0, 100.0);
        assert!((r - 40.0).abs() < 1e-9);
        assert!((x - 1000.0 / 140.0).abs() < 1e-9);
    }

    #[test]
    fn overload_grows_the_response_time_with_clients_per_replica() {
        // Far past saturation MVA tends to N·S/c − Z and capacity c/S.
        let (r, x) = closed_loop(400.0, 2, 40.0, 100.0);
        assert!((r - (400.0 * 40.0 / 2.0 - 100.0)).abs() / r < 0.01, "{r}");
        assert!((x - 50.0).abs() < 0.5, "{x}");
        // More replicas, less waiting; none, no answers.
        assert!(closed_loop(30.0, 11, 40.0, 100.0).0 < closed_loop(30.0, 4, 40.0, 100.0).0);
        assert_eq!(closed_loop(3.0, 0, 40.0, 100.0).1, 0.0);
    }

    #[test]
    fn fractional_clients_interpolate() {
        let (r2, _) = closed_loop(2.0, 1, 40.0, 100.0);
        let (r3, _) = closed_loop(3.0, 1, 40.0, 100.0);
        let (r, _) = closed_loop(2.5, 1, 40.0, 100.0);
        assert!((r - (r2 + r3) / 2.0).abs() < 1e-9);
    }

    #[test]
    fn the_curve_is_mapped_to_the_stated_peak_and_low() {
        let shape = DemandShape {
            minutes: 6,
            low_from: 3,
            low_to: 5,
            ..DemandShape::default()
        };
        let d = ServiceDemand::shaped(&[2.0, 6.0, 10.0, 4.0, 2.0, 0.0], &shape).expect("shape");
        assert_eq!(d.replicas[2], 12.0);
        assert_eq!((d.replicas[3] + d.replicas[4]) / 2.0, 4.0);
        assert!(
            (d.replicas[5] - (4.0 - 3.0 * 8.0 / 7.0)).abs() < 1e-9,
            "affine"
        );
        assert_eq!(d.at_minute(8), d.replicas[2], "repeats");
        assert!(ServiceDemand::shaped(&[1.0; 6], &shape).is_err(), "flat");
    }
}
