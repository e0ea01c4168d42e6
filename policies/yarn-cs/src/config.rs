//! The policy's configuration: one flat TOML document. Keys left out keep their defaults;
//! unknown keys are an error.
//!
//! AntMan (§5.2) runs YARN-CS twice: as the production baseline (no preemption) and as
//! "YARN-CS-preempt", which "allows jobs in Tenant-A to preempt jobs in Tenant-B". That is
//! [`Config::preemption`]. The paper gives no other setting; [`DEFAULT_CONFIG`] says what
//! we chose and why.

use arbiter_policy_sdk::model::PolicyError;
use serde::Deserialize;

/// The default configuration, as returned in the manifest. Parses to [`Config::default`].
pub const DEFAULT_CONFIG: &str = r#"# yarn-cs: YARN's capacity scheduler, AntMan's (OSDI '20) production baseline.

# §5.2 "YARN-CS-preempt": a waiting job that fits its tenant's quota preempts running jobs
# of tenants above their quota (or without one), most recently started first, just enough
# for it to fit, and only when that makes it fit. The production baseline runs without.
preemption = false

# Ours (YARN's container reservation for an under-capacity queue): while a job that fits
# its tenant's quota waits for GPUs, no job starts beyond its tenant's quota, so the GPUs
# that free up are kept for it instead of being lent out again. false: idle GPUs are lent
# whenever they are free (an under-quota gang can then wait behind borrowed work).
hold_idle_for_quota = true
"#;

/// The configuration (see [`DEFAULT_CONFIG`]).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Preempt over-quota work for a waiting job within its tenant's quota.
    pub preemption: bool,
    /// Lend no idle GPU while a job within its tenant's quota waits for GPUs.
    pub hold_idle_for_quota: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            preemption: false,
            hold_idle_for_quota: true,
        }
    }
}

impl Config {
    /// Parses a configuration document (empty: the defaults).
    pub fn parse(text: &str) -> Result<Config, PolicyError> {
        toml::from_str(text).map_err(|e| PolicyError::Failed(format!("yarn-cs config: {e}")))
    }
}
