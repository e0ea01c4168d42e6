//! The single error type every loader returns.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while locating or parsing a trace.
///
/// Row-level variants carry the file, the 1-based line the record starts on (line 1 is the
/// header), and for field problems the column name and the offending value, so a message
/// reads like `openb_pod_list_default.csv:123: column `gpu_milli`: value `abc`: invalid integer`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The file could not be opened or read (including a truncated or corrupt gzip stream).
    #[error("{}: {source}", file.display())]
    Io {
        file: PathBuf,
        #[source]
        source: io::Error,
    },

    /// The file has no header line at all (zero bytes, or only blank lines). A header-only
    /// file is not an error: it is a trace with no rows.
    #[error("{}: file is empty (no header line)", file.display())]
    Empty { file: PathBuf },

    /// The header lacks a column the loader needs.
    #[error("{}:1: missing column `{column}` in header", file.display())]
    MissingColumn { file: PathBuf, column: String },

    /// A record is malformed as CSV: wrong number of fields, or a read error mid-file.
    #[error("{}:{line}: {reason}", file.display())]
    Record {
        file: PathBuf,
        line: u64,
        reason: String,
    },

    /// A field holds a value the loader cannot accept.
    #[error("{}:{line}: column `{column}`: value `{value}`: {reason}", file.display())]
    Field {
        file: PathBuf,
        line: u64,
        column: String,
        value: String,
        reason: String,
    },

    /// [`crate::traces_dir`] found no traces folder.
    #[error(
        "traces folder not found: {reason}; set ARBITER_TRACES to the folder that holds \
         openb/, philly/, pai2020/ and genai2026/ (searched: {})",
        display_paths(searched)
    )]
    TracesDirNotFound {
        reason: String,
        searched: Vec<PathBuf>,
    },

    /// A demand curve would need more buckets than [`crate::genai::MAX_DEMAND_BUCKETS`]
    /// (the bucket width is far too small for the span of the requests).
    #[error("demand curve needs {buckets} buckets, more than the limit of {limit}")]
    DemandCurveTooLong { buckets: u128, limit: usize },
}

fn display_paths(paths: &[PathBuf]) -> String {
    let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    shown.join(", ")
}

impl TraceError {
    /// The 1-based line of the offending record, for row-level errors.
    pub fn line(&self) -> Option<u64> {
        match self {
            TraceError::Record { line, .. } | TraceError::Field { line, .. } => Some(*line),
            TraceError::MissingColumn { .. } => Some(1),
            _ => None,
        }
    }

    /// The column name, for field-level errors and missing columns.
    pub fn column(&self) -> Option<&str> {
        match self {
            TraceError::Field { column, .. } | TraceError::MissingColumn { column, .. } => {
                Some(column)
            }
            _ => None,
        }
    }
}

/// Shorthand used by every loader.
pub type Result<T, E = TraceError> = std::result::Result<T, E>;
