//! The policy's configuration. DynamoML publishes no parameters for its token scheduler, so
//! every default here is ours; each says why.
//!
//! The document is TOML (what `meta.configure` passes). Keys left out keep their defaults;
//! unknown keys are an error.

use serde::Deserialize;

/// The default configuration, as returned in the manifest. Parses to [`Config::default`].
pub const DEFAULT_CONFIG: &str = r#"# elastic-share: (request, limit) compute shares, work-conserving.
# Periods without a launch before a workload counts as idle and its request is lent out.
# 3 periods (300 ms at the node's default period): a data-loading pause between
# iterations does not give the share away, a notebook waiting for its user does.
idle_periods = 3
# Pacing delay, in percent of the period, above which a workload counts as wanting more.
throttled_delay_pct = 1.0
# Smallest share change worth an action, permille (a return to the request is always made).
min_step = 10
# Period assumed before two views have been seen, ms.
nominal_period_ms = 100
"#;

/// See [`DEFAULT_CONFIG`] for what each field means and why its default.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub idle_periods: u32,
    pub throttled_delay_pct: f64,
    pub min_step: u32,
    pub nominal_period_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            idle_periods: 3,
            throttled_delay_pct: 1.0,
            min_step: 10,
            nominal_period_ms: 100,
        }
    }
}

impl Config {
    /// Parses and checks a configuration document (empty: the defaults).
    pub fn parse(doc: &str) -> Result<Config, String> {
        let c: Config = toml::from_str(doc).map_err(|e| format!("elastic-share config: {e}"))?;
        if c.idle_periods == 0 {
            return Err("elastic-share config: idle_periods must be at least 1".into());
        }
        if !(c.throttled_delay_pct.is_finite() && c.throttled_delay_pct >= 0.0) {
            return Err("elastic-share config: throttled_delay_pct must be >= 0".into());
        }
        Ok(c)
    }
}
