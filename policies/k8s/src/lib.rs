//! `k8s`: Kubernetes as the DynamoML paper runs it (Table 2) — whole GPUs
//! from the device plugin, worker pods placed one by one, each on the
//! least-allocated node (a job's workers spread; a job starts with the pods
//! that fit), no elastic training, no preemption for inference. Two
//! switches give the paper's other baselines: `inference_scaling = true` is
//! K8S+Scaling (HPA into free GPUs only), `gpu_sharing = true` K8S+Sharing
//! (fractional notebooks). The body is `dynamoml-core`.

use dynamoml_core::{Preset, dynamoml_policy};

/// Native Kubernetes: none of the techniques.
pub struct Kubernetes;

impl Preset for Kubernetes {
    const NAME: &'static str = "k8s";
    const SUMMARY: &'static str = "Kubernetes baseline: whole GPUs, spread workers, optional HPA (inference_scaling) and GPU sharing.";
    const DEFAULT_CONFIG: &'static str = r#"training_scheduler = false
inference_scaling = false
gpu_sharing = false
borrow_from_training = false
target_requests_per_replica = 20.0
latency_target_pct = 80
tolerance_pct = 10
scale_down_delay_s = 60
preempt_after_s = 0
k8s_gang_scheduling = false
"#;
}

dynamoml_policy!(KubernetesPolicy = Kubernetes);

#[cfg(test)]
mod tests {
    use super::*;
    use dynamoml_core::__sdk::prelude::*;

    #[test]
    fn manifest_and_default_configuration() {
        let m = Runtime::<KubernetesPolicy>::new().manifest();
        assert_eq!(m.name, "k8s");
        let cfg = dynamoml_core::Config::parse(&m.default_config).expect("default parses");
        assert!(!cfg.training_scheduler && !cfg.inference_scaling && !cfg.gpu_sharing);
        assert!(!cfg.borrow_from_training);
    }

    #[test]
    fn a_configuration_changes_only_what_it_names() {
        let mut p = KubernetesPolicy::create();
        p.configure("inference_scaling = true").expect("config");
        let cfg = p.config();
        assert!(cfg.inference_scaling, "K8S+Scaling");
        assert!(!cfg.training_scheduler && !cfg.gpu_sharing && !cfg.borrow_from_training);
    }
}
