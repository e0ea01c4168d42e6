//! The two distributions the statistics need, from `statrs`: the standard
//! normal and Student's t (standard location and scale).

use statrs::distribution::{ContinuousCDF, Normal, StudentsT};

fn standard_normal() -> Normal {
    Normal::standard()
}

/// Student's t with `dof` degrees of freedom (at least 1); `None` for a
/// non-finite `dof`, which callers read as the normal.
fn students_t(dof: f64) -> Option<StudentsT> {
    StudentsT::new(0.0, 1.0, dof.max(1.0)).ok()
}

/// Standard normal CDF.
pub fn normal_cdf(z: f64) -> f64 {
    standard_normal().cdf(z)
}

/// Standard normal quantile.
pub fn normal_quantile(p: f64) -> f64 {
    standard_normal().inverse_cdf(p)
}

/// Student's t CDF with `dof` degrees of freedom.
pub fn t_cdf(t: f64, dof: f64) -> f64 {
    students_t(dof).map_or_else(|| normal_cdf(t), |d| d.cdf(t))
}

/// Student's t quantile with `dof` degrees of freedom.
pub fn t_quantile(p: f64, dof: f64) -> f64 {
    students_t(dof).map_or_else(|| normal_quantile(p), |d| d.inverse_cdf(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn textbook_values() {
        assert!((normal_cdf(1.96) - 0.975).abs() < 1e-4);
        assert!((normal_quantile(0.975) - 1.959_964).abs() < 1e-5);
        assert!((t_quantile(0.975, 4.0) - 2.776_445).abs() < 1e-5);
        assert!((t_quantile(0.975, 30.0) - 2.042_272).abs() < 1e-5);
        // Far tails stay finite and ordered (the case a smaller crate overflowed on).
        let tail = t_cdf(-40.0, 150.0);
        assert!(tail > 0.0 && tail < 1e-60);
        assert!(t_cdf(-4.0, 150.0) > normal_cdf(-4.0));
    }
}
