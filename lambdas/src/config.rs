//! The functions' configuration, read from the environment the SAM template and the CDK app set.
//! Every error names the variable to fix, so a misconfigured function fails at init, not mid-request.

use std::time::Duration;

use leaselock::config::{DEFAULT_INDEX_NAME, DEFAULT_OWNER_INDEX_NAME};
use leaselock::TableConfig;

pub const TABLE: &str = "LEASELOCK_TABLE";
pub const QUEUE_URL: &str = "LEASELOCK_QUEUE_URL";
pub const INDEX_NAME: &str = "LEASELOCK_INDEX_NAME";
/// Session mode's owner index (keys only), which the reconciler's sweep lists a session's work
/// with (default `lease_owner-index`).
pub const OWNER_INDEX_NAME: &str = "LEASELOCK_OWNER_INDEX_NAME";
pub const KEY_PREFIX: &str = "LEASELOCK_KEY_PREFIX";
pub const LEASE_MS: &str = "LEASELOCK_LEASE_MS";
pub const RENEW_MS: &str = "LEASELOCK_RENEW_MS";
pub const CLOCK_SKEW_MS: &str = "LEASELOCK_CLOCK_SKEW_MS";
pub const METRICS_NAMESPACE: &str = "LEASELOCK_METRICS_NAMESPACE";
pub const OPERATION_BUDGET_MS: &str = "LEASELOCK_OPERATION_BUDGET_MS";
/// `per-item` (default) or `session`.
pub const MODE: &str = "LEASELOCK_MODE";
/// How many orphan-index partition values running work is spread over (default 1; every
/// writer of the table must use the same count).
pub const ORPHAN_SHARDS: &str = "LEASELOCK_ORPHAN_SHARDS";
/// `1` accepts a global table in multi-Region eventual consistency (refused by default; see
/// [`TableConfig::allow_eventual_global_table`]).
pub const ALLOW_EVENTUAL_GLOBAL_TABLE: &str = leaselock::config::ALLOW_EVENTUAL_GLOBAL_TABLE_ENV;
/// Reconciler, session mode: minutes between sweeps of the table for stranded work (default 10;
/// 0 turns the sweep off). See [`crate::reconciler::Sweep`].
pub const SWEEP_INTERVAL_MINUTES: &str = "LEASELOCK_SWEEP_INTERVAL_MINUTES";
/// Reconciler, session mode: how long a session must have been dead, beyond the skew, before its
/// work counts as stranded, ms (default 60000).
pub const SWEEP_GRACE_MS: &str = "LEASELOCK_SWEEP_GRACE_MS";

pub const DEFAULT_METRICS_NAMESPACE: &str = leaselock::metrics::NAMESPACE;

/// Which `TableConfig` field each variable sets, to name the variable when core refuses the field.
const FIELD_VARS: &[(&str, &str)] = &[
    ("table_name", TABLE),
    ("index_name", INDEX_NAME),
    ("owner_index_name", OWNER_INDEX_NAME),
    ("key_prefix", KEY_PREFIX),
    ("lease_duration", LEASE_MS),
    ("renew_interval", RENEW_MS),
    ("clock_skew", CLOCK_SKEW_MS),
    ("operation_budget", OPERATION_BUDGET_MS),
    ("orphan_shards", ORPHAN_SHARDS),
];

/// A variable that is missing or invalid.
#[derive(thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{0} is not set")]
    Missing(&'static str),
    #[error("{var}: {message}")]
    Invalid { var: &'static str, message: String },
}

impl ConfigError {
    /// The variable to fix.
    pub fn var(&self) -> &'static str {
        match self {
            ConfigError::Missing(var) | ConfigError::Invalid { var, .. } => var,
        }
    }
}

// `main` returning this error prints its Debug form: make that the readable message.
impl std::fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Everything the router and the reconciler need to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub table: TableConfig,
    /// The START hint queue the workers long-poll.
    pub queue_url: String,
    /// CloudWatch namespace of the EMF metrics.
    pub metrics_namespace: String,
    /// The reconciler's sweep for stranded work.
    pub sweep: crate::reconciler::Sweep,
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads variables through `lookup` (tests pass a map). Empty values count as unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |var: &str| lookup(var).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let required = |var: &'static str| get(var).ok_or(ConfigError::Missing(var));
        let millis = |var: &'static str, default: u64| -> Result<Duration, ConfigError> {
            match get(var) {
                None => Ok(Duration::from_millis(default)),
                Some(v) => v.parse::<u64>().map(Duration::from_millis).map_err(|_| ConfigError::Invalid {
                    var,
                    message: format!("{v:?} is not a whole number of milliseconds"),
                }),
            }
        };

        let table = TableConfig::new(required(TABLE)?)
            .index_name(get(INDEX_NAME).unwrap_or_else(|| DEFAULT_INDEX_NAME.to_string()))
            .owner_index_name(get(OWNER_INDEX_NAME).unwrap_or_else(|| DEFAULT_OWNER_INDEX_NAME.to_string()))
            // The prefix is taken verbatim: spaces may be part of it.
            .key_prefix(lookup(KEY_PREFIX).unwrap_or_default())
            .lease_duration(millis(LEASE_MS, 20_000)?)
            .renew_interval(millis(RENEW_MS, 5_000)?)
            .clock_skew(millis(CLOCK_SKEW_MS, 1_000)?)
            .operation_budget(millis(OPERATION_BUDGET_MS, 10_000)?)
            .orphan_shards(match get(ORPHAN_SHARDS) {
                None => 1,
                Some(v) => v.parse::<u32>().map_err(|_| ConfigError::Invalid {
                    var: ORPHAN_SHARDS,
                    message: format!("{v:?} is not a whole number of shards"),
                })?,
            })
            .allow_eventual_global_table(match get(ALLOW_EVENTUAL_GLOBAL_TABLE) {
                None => false,
                Some(v) => leaselock::config::parse_flag(&v).ok_or_else(|| ConfigError::Invalid {
                    var: ALLOW_EVENTUAL_GLOBAL_TABLE,
                    message: format!("{v:?} is not 1/0, true/false, yes/no or on/off"),
                })?,
            })
            .mode(match get(MODE) {
                None => leaselock::LeaseMode::PerItem,
                Some(v) => leaselock::LeaseMode::parse(&v).ok_or_else(|| ConfigError::Invalid {
                    var: MODE,
                    message: format!("{v:?} is neither per-item nor session"),
                })?,
            });
        table.validate().map_err(|e| match e {
            leaselock::Error::InvalidInput { field, message } => {
                let var = FIELD_VARS.iter().find(|(f, _)| *f == field).map_or(TABLE, |(_, var)| var);
                ConfigError::Invalid { var, message: format!("{field}: {message}") }
            }
            other => ConfigError::Invalid { var: TABLE, message: other.to_string() },
        })?;

        let queue_url = required(QUEUE_URL)?;
        if !(queue_url.starts_with("https://") || queue_url.starts_with("http://")) {
            return Err(ConfigError::Invalid { var: QUEUE_URL, message: format!("{queue_url:?} is not a queue URL") });
        }

        let metrics_namespace = get(METRICS_NAMESPACE).unwrap_or_else(|| DEFAULT_METRICS_NAMESPACE.to_string());
        if metrics_namespace.len() > 255 || metrics_namespace.starts_with(':') {
            return Err(ConfigError::Invalid {
                var: METRICS_NAMESPACE,
                message: "at most 255 characters, not starting with ':'".into(),
            });
        }

        let whole = |var: &'static str, default: u64, max: u64, unit: &str| match get(var) {
            None => Ok(default),
            Some(v) => v.parse::<u64>().ok().filter(|n| *n <= max).ok_or_else(|| ConfigError::Invalid {
                var,
                message: format!("{v:?} is not a whole number of {unit} up to {max}"),
            }),
        };
        let sweep = crate::reconciler::Sweep {
            // A week at most: the sweep is meant to run a few times an hour.
            every_minutes: whole(
                SWEEP_INTERVAL_MINUTES,
                crate::reconciler::DEFAULT_SWEEP_INTERVAL_MINUTES.into(),
                10_080,
                "minutes",
            )? as u32,
            grace_ms: whole(SWEEP_GRACE_MS, crate::reconciler::DEFAULT_SWEEP_GRACE_MS, 86_400_000, "milliseconds")?,
        };

        Ok(Config { table, queue_url, metrics_namespace, sweep })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    const BASE: &[(&str, &str)] = &[(TABLE, "leases"), (QUEUE_URL, "http://127.0.0.1:4566/000000000000/hints")];

    #[test]
    fn defaults_follow_the_design() {
        let c = parse(BASE).unwrap();
        assert_eq!(c.table.table_name, "leases");
        assert_eq!(c.table.index_name, DEFAULT_INDEX_NAME);
        assert_eq!(c.table.owner_index_name, DEFAULT_OWNER_INDEX_NAME);
        assert_eq!(c.table.key_prefix, "");
        assert_eq!((c.table.lease_ms(), c.table.renew_ms(), c.table.skew_ms()), (20_000, 5_000, 1_000));
        assert_eq!(c.metrics_namespace, "leaselock");
        assert!(!c.table.allow_eventual_global_table);
    }

    #[test]
    fn the_sweep_defaults_to_every_10_minutes_with_a_minute_of_grace_and_names_its_variables() {
        let c = parse(BASE).unwrap();
        assert_eq!((c.sweep.every_minutes, c.sweep.grace_ms), (10, 60_000));
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut vars = BASE.to_vec();
            vars.extend_from_slice(extra);
            parse(&vars)
        };
        let c = with(&[(SWEEP_INTERVAL_MINUTES, "0"), (SWEEP_GRACE_MS, "120000")]).unwrap();
        assert_eq!((c.sweep.every_minutes, c.sweep.grace_ms), (0, 120_000), "0 turns it off");
        for bad in ["ten", "-1", "1.5", "10081"] {
            assert_eq!(with(&[(SWEEP_INTERVAL_MINUTES, bad)]).unwrap_err().var(), SWEEP_INTERVAL_MINUTES, "{bad}");
        }
        for bad in ["60s", "-1", "86400001"] {
            assert_eq!(with(&[(SWEEP_GRACE_MS, bad)]).unwrap_err().var(), SWEEP_GRACE_MS, "{bad}");
        }
        let message = format!("{:?}", with(&[(SWEEP_GRACE_MS, "60s")]).unwrap_err());
        assert!(message.starts_with("LEASELOCK_SWEEP_GRACE_MS: \"60s\""), "{message}");
    }

    #[test]
    fn the_eventual_global_table_opt_in_is_read_and_checked() {
        let with = |v: &'static str| {
            let mut vars = BASE.to_vec();
            vars.push((ALLOW_EVENTUAL_GLOBAL_TABLE, v));
            parse(&vars)
        };
        assert!(with("1").unwrap().table.allow_eventual_global_table);
        assert!(with("true").unwrap().table.allow_eventual_global_table);
        assert!(!with("0").unwrap().table.allow_eventual_global_table);
        assert_eq!(with("sure").unwrap_err().var(), ALLOW_EVENTUAL_GLOBAL_TABLE);
    }

    #[test]
    fn every_variable_is_read() {
        let mut vars = BASE.to_vec();
        vars.extend([
            (INDEX_NAME, "by-state"),
            (OWNER_INDEX_NAME, "by-owner"),
            (KEY_PREFIX, "app1/"),
            (LEASE_MS, "10000"),
            (RENEW_MS, "2000"),
            (CLOCK_SKEW_MS, "500"),
            (METRICS_NAMESPACE, "fleet"),
        ]);
        let c = parse(&vars).unwrap();
        assert_eq!(c.table.index_name, "by-state");
        assert_eq!(c.table.owner_index_name, "by-owner");
        assert_eq!(c.table.key_prefix, "app1/");
        assert_eq!((c.table.lease_ms(), c.table.renew_ms(), c.table.skew_ms()), (10_000, 2_000, 500));
        assert_eq!(c.metrics_namespace, "fleet");
    }

    #[test]
    fn errors_name_the_variable() {
        assert_eq!(parse(&[]).unwrap_err(), ConfigError::Missing(TABLE));
        assert_eq!(parse(&[(TABLE, "leases")]).unwrap_err(), ConfigError::Missing(QUEUE_URL));
        assert_eq!(parse(&[(TABLE, " "), (QUEUE_URL, "https://q")]).unwrap_err(), ConfigError::Missing(TABLE));

        let with = |extra: (&'static str, &'static str)| {
            let mut vars = BASE.to_vec();
            vars.push(extra);
            parse(&vars).unwrap_err()
        };
        assert_eq!(with((LEASE_MS, "20s")).var(), LEASE_MS);
        assert_eq!(with((LEASE_MS, "1500")).var(), LEASE_MS);
        assert_eq!(with((RENEW_MS, "19500")).var(), RENEW_MS);
        assert_eq!(with((CLOCK_SKEW_MS, "0")).var(), CLOCK_SKEW_MS);
        assert_eq!(with((TABLE, "x")).var(), TABLE);
        assert_eq!(with((INDEX_NAME, "ab")).var(), INDEX_NAME);
        assert_eq!(with((QUEUE_URL, "hints")).var(), QUEUE_URL);
        assert_eq!(with((METRICS_NAMESPACE, ":x")).var(), METRICS_NAMESPACE);

        let message = format!("{:?}", with((LEASE_MS, "soon")));
        assert!(message.starts_with("LEASELOCK_LEASE_MS: \"soon\""), "{message}");
    }
}

#[cfg(test)]
mod orphan_shard_tests {
    use super::*;

    fn parse(extra: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let mut vars = vec![(TABLE, "leases"), (QUEUE_URL, "http://127.0.0.1:4566/000000000000/hints")];
        vars.extend_from_slice(extra);
        Config::from_lookup(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn orphan_shards_default_to_one_and_are_read_and_bounded() {
        assert_eq!(parse(&[]).unwrap().table.orphan_shards, 1);
        let c = parse(&[(ORPHAN_SHARDS, "16")]).unwrap();
        assert_eq!((c.table.orphan_shards, c.table.started_partitions().len()), (16, 16));
        for bad in ["0", "257", "many", "-1"] {
            let err = parse(&[(ORPHAN_SHARDS, bad)]).unwrap_err();
            assert_eq!(err.var(), ORPHAN_SHARDS, "{bad}: {err}");
        }
    }
}
