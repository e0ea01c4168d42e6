//! The inference autoscaler's rule (DynamoML §3.3): Kubernetes' Horizontal
//! Pod Autoscaler on a request-rate metric, plus the response time the
//! controller watches against the service's objective.
//!
//! HPA's rule is `desired = ⌈current · metric / target⌉` with a tolerance
//! band around 1 in which nothing changes. On a requests-per-second metric
//! that is `⌈requests_per_s / target_per_replica⌉`. A saturated service
//! serves no more than its capacity, so its request rate understates the
//! demand; the response time does not: past `latency_target_pct` of the
//! objective the controller scales by how far the p99 is over it (in a
//! closed system response time grows with clients per replica).

use crate::Config;

/// What the autoscaler knows of one service this round.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServiceLoad {
    pub replicas: u32,
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub requests_per_s: f32,
    pub p99_latency_ms: u32,
    /// 0: no objective.
    pub slo_ms: u32,
}

/// The replica count the service should have, or `None` while it has
/// reported nothing (a fresh service is left as it was started).
pub fn desired_replicas(cfg: &Config, load: &ServiceLoad) -> Option<u32> {
    // A NaN or negative rate from a broken exporter counts as none.
    let rps = if load.requests_per_s.is_finite() {
        f64::from(load.requests_per_s.max(0.0))
    } else {
        0.0
    };
    if rps == 0.0 && load.p99_latency_ms == 0 {
        return None;
    }
    let current = f64::from(load.replicas.max(1));
    let by_rate = rps / (current * cfg.target_requests_per_replica);
    let aim = f64::from(load.slo_ms) * f64::from(cfg.latency_target_pct) / 100.0;
    let by_latency = if load.slo_ms > 0 && f64::from(load.p99_latency_ms) > aim {
        f64::from(load.p99_latency_ms) / aim
    } else {
        0.0
    };
    // HPA's usage ratio, with its tolerance: a ratio within the band is noise.
    let ratio = by_rate.max(by_latency);
    if (ratio - 1.0).abs() <= f64::from(cfg.tolerance_pct) / 100.0 {
        return Some(load.replicas.max(1));
    }
    let raw = (current * ratio).ceil().min(f64::from(u32::MAX)) as u32;
    let wanted = raw.clamp(load.min_replicas.max(1), load.max_replicas.max(1));
    Some(wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(replicas: u32, rps: f32, p99: u32) -> ServiceLoad {
        ServiceLoad {
            replicas,
            min_replicas: 1,
            max_replicas: 12,
            requests_per_s: rps,
            p99_latency_ms: p99,
            slo_ms: 128,
        }
    }

    #[test]
    fn request_rate_over_target_scales_out_and_under_scales_in() {
        let cfg = Config::default();
        let t = cfg.target_requests_per_replica as f32;
        assert_eq!(desired_replicas(&cfg, &load(2, 4.0 * t, 40)), Some(4));
        assert_eq!(desired_replicas(&cfg, &load(8, 2.5 * t, 40)), Some(3));
        // Never past the bounds.
        assert_eq!(desired_replicas(&cfg, &load(8, 40.0 * t, 40)), Some(12));
        assert_eq!(desired_replicas(&cfg, &load(3, 0.1, 40)), Some(1));
    }

    #[test]
    fn a_slow_service_grows_by_its_latency_even_when_its_rate_is_capped() {
        let cfg = Config::default();
        let aim = 128 * cfg.latency_target_pct / 100;
        // Saturated: the rate says 2, the latency says three times as many.
        let rate = 2.0 * cfg.target_requests_per_replica as f32;
        assert_eq!(desired_replicas(&cfg, &load(2, rate, 3 * aim)), Some(6));
    }

    #[test]
    fn within_the_tolerance_nothing_changes_and_silence_is_not_a_signal() {
        let cfg = Config::default();
        let t = cfg.target_requests_per_replica as f32;
        assert_eq!(desired_replicas(&cfg, &load(10, 10.8 * t, 40)), Some(10));
        assert_eq!(desired_replicas(&cfg, &load(10, 11.5 * t, 40)), Some(12));
        assert_eq!(desired_replicas(&cfg, &load(4, 0.0, 0)), None);
    }
}
