//! The policies' configuration: a flat TOML table of `key = value` lines.
//!
//! Parsed by hand: the accepted subset is small (integers, floats, quoted
//! strings) and a TOML crate would add far more to every Wasm component than
//! this file does.

use crate::jct::Speedup;

/// Default configuration, as shipped in the manifest.
pub const DEFAULT_CONFIG: &str = r#"# Aryl policy configuration.
# Speed-up of elastic jobs: "linear" (paper §5) or "sub-linear" (§7.2).
speedup = "linear"
# Throughput lost per worker past the midpoint of the scaling range (§7.2).
sublinear_loss = 0.1
# Running time assumed for jobs without an estimate, in milliseconds.
default_estimate_ms = 3600000
# Cell budget of the knapsack DP (bounds the scheduler's running time).
max_dp_cells = 4000000
# Pool names of the dedicated training servers and of the inference servers.
training_pool = "training"
inference_pool = "inference"
# Seed of the Random reclaim baseline (mixed with the round's epoch).
random_seed = 0
# Inelastic jobs on servers slower than the training servers: "if-sooner"
# (only when the slowdown costs less than waiting for fast GPUs to free up,
# judged from the jobs' remaining times) or "always" (§5.3's plain preference).
slow_spill = "if-sooner"
# Units of the capacity phase one and the knapsack share out: "gpus" (the
# unit of the knapsack's item weights) or "reference" (loaned GPUs counted at
# their speed relative to the training GPUs, §5.2).
capacity = "gpus"
"#;

/// What the allocation's capacity counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capacity {
    /// Whole GPUs, whatever their speed: the unit of the item weights.
    Gpus,
    /// GPUs weighted by their speed relative to the reference model.
    Reference,
}

/// When an inelastic job may run on servers slower than the training ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlowSpill {
    /// Only if the stretch is shorter than the wait for fast GPUs.
    IfSooner,
    /// Whenever the training servers are full (§5.3 as written).
    Always,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub speedup: Speedup,
    pub default_estimate_ms: u64,
    pub max_dp_cells: u64,
    pub training_pool: String,
    pub inference_pool: String,
    pub random_seed: u64,
    pub slow_spill: SlowSpill,
    pub capacity: Capacity,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            speedup: Speedup::Linear,
            default_estimate_ms: 3_600_000,
            max_dp_cells: 4_000_000,
            training_pool: "training".into(),
            inference_pool: "inference".into(),
            random_seed: 0,
            slow_spill: SlowSpill::IfSooner,
            capacity: Capacity::Gpus,
        }
    }
}

enum Value<'a> {
    Str(&'a str),
    Num(&'a str),
}

fn parse_value(raw: &str) -> Result<Value<'_>, String> {
    let raw = raw.trim();
    if let Some(rest) = raw.strip_prefix('"') {
        let end = rest
            .find('"')
            .ok_or_else(|| format!("unterminated string `{raw}`"))?;
        let tail = rest[end + 1..].trim();
        if !tail.is_empty() && !tail.starts_with('#') {
            return Err(format!("unexpected `{tail}` after string"));
        }
        Ok(Value::Str(&rest[..end]))
    } else {
        let v = raw.split('#').next().unwrap_or("").trim();
        Ok(Value::Num(v))
    }
}

fn as_str<'a>(key: &str, v: &Value<'a>) -> Result<&'a str, String> {
    match v {
        Value::Str(s) => Ok(s),
        Value::Num(n) => Err(format!("`{key}` must be a string, got `{n}`")),
    }
}

/// One of a fixed set of names.
fn as_choice<T: Copy>(key: &str, v: &Value<'_>, choices: &[(&str, T)]) -> Result<T, String> {
    let name = as_str(key, v)?;
    choices
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, value)| *value)
        .ok_or_else(|| {
            let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
            format!("unknown {key} `{name}` (one of {})", names.join(", "))
        })
}

fn as_u64(key: &str, v: &Value<'_>) -> Result<u64, String> {
    match v {
        Value::Num(n) => n
            .replace('_', "")
            .parse()
            .map_err(|_| format!("`{key}` must be a non-negative integer, got `{n}`")),
        Value::Str(s) => Err(format!("`{key}` must be an integer, got \"{s}\"")),
    }
}

fn as_f64(key: &str, v: &Value<'_>) -> Result<f64, String> {
    match v {
        Value::Num(n) => n
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .ok_or_else(|| format!("`{key}` must be a number, got `{n}`")),
        Value::Str(s) => Err(format!("`{key}` must be a number, got \"{s}\"")),
    }
}

impl Config {
    /// Parses a configuration; keys left out keep their defaults, unknown
    /// keys are an error (a typo must not silently change nothing).
    pub fn parse(text: &str) -> Result<Config, String> {
        let mut cfg = Config::default();
        let mut speedup_name = "linear".to_string();
        let mut loss = 0.1;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, raw) = line
                .split_once('=')
                .ok_or_else(|| format!("line {}: expected `key = value`", n + 1))?;
            let key = key.trim();
            let value = parse_value(raw).map_err(|e| format!("line {}: {e}", n + 1))?;
            let r: Result<(), String> = match key {
                "speedup" => as_str(key, &value).map(|s| speedup_name = s.to_string()),
                "sublinear_loss" => as_f64(key, &value).map(|f| loss = f),
                "default_estimate_ms" => as_u64(key, &value).map(|v| cfg.default_estimate_ms = v),
                "max_dp_cells" => as_u64(key, &value).map(|v| cfg.max_dp_cells = v),
                "training_pool" => as_str(key, &value).map(|s| cfg.training_pool = s.into()),
                "inference_pool" => as_str(key, &value).map(|s| cfg.inference_pool = s.into()),
                "random_seed" => as_u64(key, &value).map(|v| cfg.random_seed = v),
                "slow_spill" => as_choice(
                    key,
                    &value,
                    &[
                        ("if-sooner", SlowSpill::IfSooner),
                        ("always", SlowSpill::Always),
                    ],
                )
                .map(|v| cfg.slow_spill = v),
                "capacity" => as_choice(
                    key,
                    &value,
                    &[("gpus", Capacity::Gpus), ("reference", Capacity::Reference)],
                )
                .map(|v| cfg.capacity = v),
                _ => Err(format!("unknown key `{key}`")),
            };
            r.map_err(|e| format!("line {}: {e}", n + 1))?;
        }
        if !(0.0..=1.0).contains(&loss) {
            return Err(format!("`sublinear_loss` must be in 0..=1, got {loss}"));
        }
        cfg.speedup = match speedup_name.as_str() {
            "linear" => Speedup::Linear,
            "sub-linear" | "sublinear" => Speedup::SubLinear {
                loss_per_step: loss,
            },
            other => return Err(format!("unknown speedup `{other}`")),
        };
        if cfg.default_estimate_ms == 0 {
            return Err("`default_estimate_ms` must be positive".into());
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_document_parses_to_the_defaults() {
        assert_eq!(Config::parse(DEFAULT_CONFIG), Ok(Config::default()));
        assert_eq!(Config::parse(""), Ok(Config::default()));
    }

    #[test]
    fn values_and_errors() {
        let c = Config::parse(
            "speedup = \"sub-linear\"\nsublinear_loss = 0.2 # comment\nrandom_seed = 7",
        )
        .unwrap();
        assert_eq!(c.speedup, Speedup::SubLinear { loss_per_step: 0.2 });
        assert_eq!(c.random_seed, 7);
        assert!(Config::parse("bogus = 1").is_err());
        assert!(Config::parse("max_dp_cells = \"x\"").is_err());
        assert!(Config::parse("speedup = \"quadratic\"").is_err());
        let c = Config::parse("slow_spill = \"always\"\ncapacity = \"reference\"").unwrap();
        assert_eq!(
            (c.slow_spill, c.capacity),
            (SlowSpill::Always, Capacity::Reference)
        );
        assert!(Config::parse("slow_spill = \"never\"").is_err());
        assert!(Config::parse("capacity = \"watts\"").is_err());
        assert!(Config::parse("no equals sign").is_err());
    }
}
