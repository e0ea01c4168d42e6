//! `dynamoml`: DynamoML (Chiang & Chou, CLOSER '21) — shared GPUs for
//! notebooks, gang-packed elastic training, and inference autoscaling with
//! the highest priority, borrowing training workers (never a chief). The
//! body is `dynamoml-core`; `k8s` is the same body with the techniques off,
//! the paper's baselines.

use dynamoml_core::{Preset, dynamoml_policy};

/// All three techniques of the paper's Table 2.
pub struct DynamoMl;

impl Preset for DynamoMl {
    const NAME: &'static str = "dynamoml";
    const SUMMARY: &'static str = "DynamoML: shared GPUs, gang-packed elastic training, inference autoscaling that borrows from training.";
    const DEFAULT_CONFIG: &'static str = r#"training_scheduler = true
inference_scaling = true
gpu_sharing = true
borrow_from_training = true
target_requests_per_replica = 20.0
latency_target_pct = 80
tolerance_pct = 10
scale_down_delay_s = 60
preempt_after_s = 1800
"#;
}

dynamoml_policy!(DynamoMlPolicy = DynamoMl);

#[cfg(test)]
mod tests {
    use super::*;
    use dynamoml_core::__sdk::prelude::*;

    #[test]
    fn manifest_and_default_configuration() {
        let m = Runtime::<DynamoMlPolicy>::new().manifest();
        assert_eq!(m.name, "dynamoml");
        assert_eq!(m.roles, vec!["scheduler"]);
        let cfg = dynamoml_core::Config::parse(&m.default_config).expect("default parses");
        assert_eq!(cfg, dynamoml_core::Config::default());
    }
}
