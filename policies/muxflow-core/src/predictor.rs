//! The edge weight: the offline workload's predicted normalised throughput
//! beside an online workload, at the SM share dynamic SM allocation gives it
//! (MuxFlow §5; Alg. 1 l. 7 `P.CalcNormTput(u, v, sm)`).
//!
//! **The paper's predictor** is a multi-layer perceptron per GPU type (§5,
//! §6: 4 layers, 64 × 64, about 2,000 profiled pairs per type) on GPU
//! utilization, SM activity, SM occupancy, solo execution time and the SM
//! percentage. Neither its weights nor its training data are published.
//!
//! **Ours** is a small linear model over physically motivated features,
//! `P = clamp(θ · φ, 0, 1)`, with one weight vector θ per GPU model (and a
//! default for the others), fitted by ridge least squares from (features,
//! observed normalised throughput) samples ([`LinearModel::fit`]). The
//! features, all in `[0, 1]`:
//!
//! | k | φ_k | meaning |
//! |---|---|---|
//! | 0 | 1 | bias |
//! | 1 | r = min(1, s / a_off) | the fraction of the SMs the offline job keeps busy alone (`a_off`, its SM activity) that its share `s` grants: a compute-bound job slows in proportion to the SMs it loses |
//! | 2 | r · u_on · u_off | kernel overlap: the chance both run kernels at once (utilizations alone), when they contend for memory bandwidth, L2 and issue slots even on disjoint SMs |
//! | 3 | r · o_on | the online job's SM occupancy (warp slots it fills; 0 when unknown) |
//! | 4 | r · a_on | the online job's SM activity (contention DynamicSM's complement does not remove) |
//!
//! The default θ = (0, 1, −0.5, 0, 0) is the analytic model
//! `P = r · (1 − 0.5 · u_on · u_off)`: the SM-share term, less half the time
//! both are busy. The 0.5 is ours (no calibration in the paper): a pair of
//! always-busy jobs on complementary SMs each keep half their speed beyond
//! the SM split. An offline job with unknown SM activity (0) counts as
//! needing every SM (`a_off = 1`), so its share alone decides `r`.
//!
//! What the paper's MLP uses and this model does not: the solo execution
//! (iteration) time and the offline job's occupancy, and any nonlinearity
//! beyond the products above; `Profile` carries them so a richer model can
//! be dropped in behind [`Predictor`].

use serde::Deserialize;
use std::collections::BTreeMap;

/// Number of features (and weights) of the linear model.
pub const FEATURES: usize = 5;

/// The default weights: `P = r · (1 − 0.5 · u_on · u_off)` (module doc).
pub const DEFAULT_WEIGHTS: [f64; FEATURES] = [0.0, 1.0, -0.5, 0.0, 0.0];

/// What a workload's profile alone says, in percent (0 = unknown where the
/// contract says so).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Profile {
    pub utilization_pct: u8,
    pub sm_activity_pct: u8,
    pub sm_occupancy_pct: u8,
    /// Solo iteration time, ms (0 unknown). Not used by the linear model.
    pub solo_iteration_ms: u32,
}

/// One candidate pair: the online and offline profiles and the offline SM share.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EdgeFeatures {
    pub online: Profile,
    pub offline: Profile,
    pub sm_pct: u8,
}

fn frac(pct: u8) -> f64 {
    f64::from(pct.min(100)) / 100.0
}

impl EdgeFeatures {
    /// The feature vector φ (module doc).
    pub fn vector(&self) -> [f64; FEATURES] {
        let a_off = match self.offline.sm_activity_pct {
            0 => 1.0,
            a => frac(a),
        };
        let r = (frac(self.sm_pct) / a_off).min(1.0);
        let overlap = frac(self.online.utilization_pct) * frac(self.offline.utilization_pct);
        [
            1.0,
            r,
            r * overlap,
            r * frac(self.online.sm_occupancy_pct),
            r * frac(self.online.sm_activity_pct),
        ]
    }
}

/// `P = clamp(θ · φ, 0, 1)` for one GPU type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinearModel {
    pub weights: [f64; FEATURES],
}

impl Default for LinearModel {
    fn default() -> Self {
        LinearModel {
            weights: DEFAULT_WEIGHTS,
        }
    }
}

impl LinearModel {
    /// Weights that are all finite, or an error naming the bad one.
    pub fn new(weights: [f64; FEATURES]) -> Result<Self, String> {
        match weights.iter().position(|w| !w.is_finite()) {
            Some(k) => Err(format!("predictor weight {k} is not finite")),
            None => Ok(LinearModel { weights }),
        }
    }

    /// The unclamped linear prediction.
    pub fn raw(&self, x: &EdgeFeatures) -> f64 {
        self.weights
            .iter()
            .zip(x.vector())
            .map(|(w, f)| w * f)
            .sum()
    }

    /// Predicted normalised throughput of the offline workload, in `[0, 1]`.
    pub fn predict(&self, x: &EdgeFeatures) -> f64 {
        let p = self.raw(x);
        if p.is_finite() {
            p.clamp(0.0, 1.0)
        } else {
            0.0
        }
    }

    /// Ridge least squares: the θ minimising `Σ (θ·φ − y)² + ridge · |θ|²`
    /// over `(features, observed normalised throughput)` samples. Needs a
    /// positive `ridge` or samples that determine every weight.
    pub fn fit(samples: &[(EdgeFeatures, f64)], ridge: f64) -> Result<Self, String> {
        if samples.is_empty() {
            return Err("no samples to fit".into());
        }
        if !(ridge.is_finite() && ridge >= 0.0) {
            return Err(format!("ridge {ridge} is not a non-negative number"));
        }
        // Normal equations (ΦᵀΦ + ridge·I) θ = Φᵀy, augmented, row-major.
        const W: usize = FEATURES + 1;
        let mut a = [0.0f64; FEATURES * W];
        for (x, y) in samples {
            if !y.is_finite() {
                return Err("a sample's throughput is not finite".into());
            }
            let phi = x.vector();
            for i in 0..FEATURES {
                for j in 0..FEATURES {
                    a[i * W + j] += phi[i] * phi[j];
                }
                a[i * W + FEATURES] += phi[i] * y;
            }
        }
        for i in 0..FEATURES {
            a[i * W + i] += ridge;
        }
        // Gaussian elimination with partial pivoting.
        for col in 0..FEATURES {
            let pivot = (col..FEATURES)
                .max_by(|&p, &q| a[p * W + col].abs().total_cmp(&a[q * W + col].abs()))
                .unwrap_or(col);
            if a[pivot * W + col].abs() < 1e-12 {
                return Err(format!(
                    "the samples do not determine weight {col}: vary that feature or raise `ridge`"
                ));
            }
            if pivot != col {
                for k in 0..W {
                    a.swap(col * W + k, pivot * W + k);
                }
            }
            for row in 0..FEATURES {
                if row == col {
                    continue;
                }
                let f = a[row * W + col] / a[col * W + col];
                if f != 0.0 {
                    for k in col..W {
                        a[row * W + k] -= f * a[col * W + k];
                    }
                }
            }
        }
        let mut weights = [0.0; FEATURES];
        for (i, w) in weights.iter_mut().enumerate() {
            *w = a[i * W + FEATURES] / a[i * W + i];
        }
        LinearModel::new(weights)
    }
}

/// The predictor's configuration: the default weights and per-GPU-model
/// overrides (the paper trains one model per GPU type).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PredictorConfig {
    /// θ for GPU models without their own entry.
    pub weights: [f64; FEATURES],
    /// θ per GPU model name (as the cluster names it: "T4", "A10", ...).
    pub per_model: BTreeMap<String, [f64; FEATURES]>,
}

impl Default for PredictorConfig {
    fn default() -> Self {
        PredictorConfig {
            weights: DEFAULT_WEIGHTS,
            per_model: BTreeMap::new(),
        }
    }
}

/// One linear model per GPU model, and a default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Predictor {
    default: LinearModel,
    per_model: BTreeMap<String, LinearModel>,
}

impl Predictor {
    pub fn from_config(cfg: &PredictorConfig) -> Result<Self, String> {
        let default = LinearModel::new(cfg.weights)?;
        let per_model = cfg
            .per_model
            .iter()
            .map(|(m, w)| {
                LinearModel::new(*w)
                    .map(|l| (m.clone(), l))
                    .map_err(|e| format!("{e} (model {m})"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Predictor { default, per_model })
    }

    /// The model for GPU model `gpu_model`.
    pub fn model(&self, gpu_model: &str) -> &LinearModel {
        self.per_model.get(gpu_model).unwrap_or(&self.default)
    }

    /// Predicted normalised throughput on a GPU of model `gpu_model`.
    pub fn predict(&self, gpu_model: &str, x: &EdgeFeatures) -> f64 {
        self.model(gpu_model).predict(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(util: u8, sm: u8) -> Profile {
        Profile {
            utilization_pct: util,
            sm_activity_pct: sm,
            ..Profile::default()
        }
    }

    #[test]
    fn the_default_model_is_the_documented_analytic_one() {
        let m = LinearModel::default();
        // Offline needs 80 % SMs, gets 80 %: r = 1; overlap 0.3 · 0.9.
        let x = EdgeFeatures {
            online: p(30, 20),
            offline: p(90, 80),
            sm_pct: 80,
        };
        assert!((m.predict(&x) - (1.0 - 0.5 * 0.27)).abs() < 1e-12);
        // Gets 20 % of the 80 % it needs: r = 0.25.
        let x = EdgeFeatures {
            online: p(90, 80),
            offline: p(90, 80),
            sm_pct: 20,
        };
        assert!((m.predict(&x) - 0.25 * (1.0 - 0.5 * 0.81)).abs() < 1e-12);
        // Unknown offline activity counts as needing every SM.
        let x = EdgeFeatures {
            online: p(0, 0),
            offline: p(0, 0),
            sm_pct: 40,
        };
        assert!((m.predict(&x) - 0.4).abs() < 1e-12);
        // A larger share never predicts less.
        let at = |s| {
            m.predict(&EdgeFeatures {
                online: p(50, 50),
                offline: p(50, 60),
                sm_pct: s,
            })
        };
        assert!(at(10) < at(30) && at(30) < at(60) && at(60) == at(90));
    }

    #[test]
    fn predictions_are_clamped_to_the_unit_interval() {
        let hi = LinearModel::new([2.0, 0.0, 0.0, 0.0, 0.0]).unwrap();
        let lo = LinearModel::new([-2.0, 0.0, 0.0, 0.0, 0.0]).unwrap();
        let x = EdgeFeatures::default();
        assert_eq!(hi.predict(&x), 1.0);
        assert_eq!(lo.predict(&x), 0.0);
        assert!(LinearModel::new([f64::NAN, 0.0, 0.0, 0.0, 0.0]).is_err());
    }

    #[test]
    fn fitting_recovers_the_weights_that_generated_the_samples() {
        let truth = LinearModel::new([0.05, 0.9, -0.35, -0.1, -0.05]).unwrap();
        let mut samples = Vec::new();
        for on_u in (0..=100).step_by(25) {
            for on_a in (5..=95).step_by(30) {
                for off_u in (10..=100).step_by(30) {
                    for off_a in (10..=100).step_by(30) {
                        for sm in [10u8, 35, 60, 90] {
                            let x = EdgeFeatures {
                                online: Profile {
                                    utilization_pct: on_u as u8,
                                    sm_activity_pct: on_a as u8,
                                    sm_occupancy_pct: (on_u as u8) / 2 + (on_a as u8) / 3,
                                    solo_iteration_ms: 0,
                                },
                                offline: p(off_u as u8, off_a as u8),
                                sm_pct: sm,
                            };
                            samples.push((x, truth.raw(&x)));
                        }
                    }
                }
            }
        }
        let fitted = LinearModel::fit(&samples, 0.0).unwrap();
        for (f, t) in fitted.weights.iter().zip(truth.weights) {
            assert!((f - t).abs() < 1e-6, "fitted {:?}", fitted.weights);
        }
        // A tiny ridge barely moves it; no samples or a constant feature set fail.
        let ridged = LinearModel::fit(&samples, 1e-6).unwrap();
        assert!((ridged.weights[1] - 0.9).abs() < 1e-3);
        assert!(LinearModel::fit(&[], 0.1).is_err());
        let one = [(EdgeFeatures::default(), 0.5)];
        assert!(LinearModel::fit(&one, 0.0).is_err(), "underdetermined");
        assert!(LinearModel::fit(&one, 0.1).is_ok());
    }

    #[test]
    fn each_gpu_model_may_have_its_own_weights() {
        let cfg: PredictorConfig = toml::from_str(
            "weights = [0.0, 1.0, -0.5, 0.0, 0.0]\n[per_model]\nT4 = [0.1, 0.5, 0.0, 0.0, 0.0]\n",
        )
        .unwrap();
        let pr = Predictor::from_config(&cfg).unwrap();
        let x = EdgeFeatures {
            online: p(0, 50),
            offline: p(0, 50),
            sm_pct: 50,
        };
        assert!((pr.predict("T4", &x) - 0.6).abs() < 1e-12);
        assert!((pr.predict("A10", &x) - 1.0).abs() < 1e-12);
        assert!(toml::from_str::<PredictorConfig>("weights = [1.0]").is_err());
        assert!(toml::from_str::<PredictorConfig>("wieghts = [0.0, 1.0, 0.0, 0.0, 0.0]").is_err());
    }
}
