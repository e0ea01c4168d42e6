//! Eq. 3: the oversold GPU, the normalised throughput of the offline
//! workloads (MuxFlow §7, "Metrics").
//!
//! `OversoldGPU = Σ_{w ∈ W_off} T_w^sep / Σ_{w ∈ W_off} T_w^real`, where
//! `T^sep` is a workload's execution time running exclusively and `T^real`
//! its real (shared) execution time.
//!
//! The extracted text of Eq. 3 reads `Σ T^real / Σ T^sep`, which is ≥ 1
//! whenever sharing slows the offline work down (`T^real ≥ T^sep`) and so
//! contradicts the range the paper states for it, `[0, 1]`, "where 0
//! represents that the offline workloads get no GPU computation resource,
//! and 1 represents that [they] get equivalent GPU computation resources as
//! they are executed exclusively". We use the reading consistent with that
//! range: exclusive time over real time.

/// Eq. 3 as `Σ t_sep / Σ t_real` over paired samples (any one unit of time);
/// `None` when the lists differ in length, are empty, hold a negative or
/// non-finite time, or the real times sum to zero.
pub fn oversold_gpu(t_sep: &[f64], t_real: &[f64]) -> Option<f64> {
    if t_sep.len() != t_real.len() || t_sep.is_empty() {
        return None;
    }
    let ok = |t: &f64| t.is_finite() && *t >= 0.0;
    if !t_sep.iter().all(ok) || !t_real.iter().all(ok) {
        return None;
    }
    let real: f64 = t_real.iter().sum();
    (real > 0.0).then(|| t_sep.iter().sum::<f64>() / real)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_workloads_one_slowed_twofold_give_three_quarters() {
        // T_sep = (1 h, 2 h), T_real = (2 h, 2 h): 3 / 4.
        let v = oversold_gpu(&[1.0, 2.0], &[2.0, 2.0]).unwrap();
        assert!((v - 0.75).abs() < 1e-12, "{v}");
        // The literal extraction would give 4 / 3, outside [0, 1].
        assert!(v <= 1.0);
    }

    #[test]
    fn exclusive_speed_is_one_and_bad_input_is_none() {
        assert_eq!(oversold_gpu(&[3.0, 4.0], &[3.0, 4.0]), Some(1.0));
        assert_eq!(oversold_gpu(&[1.0], &[1.0, 2.0]), None);
        assert_eq!(oversold_gpu(&[], &[]), None);
        assert_eq!(oversold_gpu(&[1.0], &[0.0]), None);
        assert_eq!(oversold_gpu(&[-1.0], &[1.0]), None);
        assert_eq!(oversold_gpu(&[f64::NAN], &[1.0]), None);
    }
}
