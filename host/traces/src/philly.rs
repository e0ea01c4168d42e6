//! Microsoft Philly training jobs (`philly/philly_jobs.csv.gz`, the Sia re-export).
//!
//! Jobs are kept in file order, which is **not** chronological: sort by
//! [`PhillyJob::submit_time`] before replaying. The export ends with a blank line, which the
//! CSV reader skips. Cluster names repeat on every row, so they are interned: each job
//! stores an index into [`PhillyTrace::clusters`] instead of its own string.

use std::io::Read;
use std::path::Path;

use crate::error::Result;
use crate::table::{Interner, Table, open_trace};

/// Relative path (under [`crate::traces_dir`]) of the job table.
pub const JOBS_FILE: &str = "philly/philly_jobs.csv.gz";

/// One training job.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PhillyJob {
    /// `timestamp`: submission time as seconds since 1970-01-01 00:00:00 of the trace's
    /// (unnamed) clock.
    pub submit_time: i64,
    /// `duration`: run time in seconds.
    pub duration_secs: f64,
    /// `num_gpus`: at least 1.
    pub num_gpus: u32,
    /// `gpu_time`: GPU-seconds as published (`duration * num_gpus` in the real file).
    pub gpu_time_secs: f64,
    /// Index of the job's virtual cluster in [`PhillyTrace::clusters`].
    pub cluster: u16,
}

/// The Philly jobs and the names of their virtual clusters.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PhillyTrace {
    pub jobs: Vec<PhillyJob>,
    /// Cluster names in order of first appearance; [`PhillyJob::cluster`] indexes this.
    pub clusters: Vec<String>,
}

impl PhillyTrace {
    /// The cluster name of `job`.
    pub fn cluster_name(&self, job: &PhillyJob) -> Option<&str> {
        self.clusters
            .get(usize::from(job.cluster))
            .map(String::as_str)
    }
}

/// Parses the job table from CSV text (decompressed). `file` only labels errors.
pub fn read_jobs(source: impl Read, file: &Path) -> Result<PhillyTrace> {
    let mut table = Table::new(source, file)?;
    let timestamp = table.require("timestamp")?;
    let duration = table.require("duration")?;
    let num_gpus = table.require("num_gpus")?;
    let gpu_time = table.require("gpu_time")?;
    let cluster = table.require("cluster")?;
    let mut clusters = Interner::default();
    let mut jobs = Vec::new();
    while let Some(row) = table.next_row()? {
        let num_gpus_value: u32 = row.unsigned(num_gpus)?;
        if num_gpus_value == 0 {
            return Err(row.error(num_gpus, "a job needs at least one GPU"));
        }
        let cluster_name = row.text(cluster)?;
        if cluster_name.is_empty() {
            return Err(row.error(cluster, "empty value"));
        }
        let cluster_index = clusters
            .intern(cluster_name)
            .and_then(|index| u16::try_from(index).ok())
            .ok_or_else(|| row.error(cluster, "more than 65,536 distinct clusters"))?;
        jobs.push(PhillyJob {
            submit_time: row.datetime(timestamp)?,
            duration_secs: row.real_seconds(duration)?,
            num_gpus: num_gpus_value,
            gpu_time_secs: row.non_negative_real(gpu_time)?,
            cluster: cluster_index,
        });
    }
    Ok(PhillyTrace {
        jobs,
        clusters: clusters.into_names(),
    })
}

/// Loads the job table, decompressing it on the fly when it is gzip.
pub fn load_jobs(path: impl AsRef<Path>) -> Result<PhillyTrace> {
    let path = path.as_ref();
    read_jobs(open_trace(path)?, path)
}
