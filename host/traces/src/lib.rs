//! Parsers for the real cluster traces Arbiter replays.
//!
//! One module per trace family, each loader in two forms: `read_*` parses CSV text from
//! any [`std::io::Read`] (the `file` argument only labels errors), and `load_*` opens a
//! path, decompressing gzip on the fly (detected by magic bytes, not by name).
//!
//! | module | files | loaders |
//! |---|---|---|
//! | [`openb`] | `openb/openb_node_list_*.csv`, `openb/openb_pod_list_*.csv` | [`openb::load_nodes`], [`openb::load_pods`] |
//! | [`pai`] | `pai2020/pai_machine_spec.csv`, `minibatch_job_{1..4}_norm.csv`, `philly_runtime.csv` | [`pai::load_machines`], [`pai::load_minibatch`], [`pai::load_philly_runtimes`] |
//! | [`philly`] | `philly/philly_jobs.csv.gz` | [`philly::load_jobs`] |
//! | [`genai`] | `genai2026/*.csv.gz` | [`genai::load_lora_requests`], [`genai::demand_curve`], [`genai::load_qps`], [`genai::load_pod_gpu_series`] |
//!
//! [`traces_dir`] finds the shared traces folder (`ARBITER_TRACES`, else `shared/traces`
//! beside the checkout) and [`trace_file`] joins a relative path such as
//! [`philly::JOBS_FILE`] onto it.
//!
//! # Error policy
//!
//! Loaders are strict: the first malformed row ends the load with a [`TraceError`] that
//! names the file, the 1-based line (the header is line 1), and for a bad field the column
//! and the value. Rows are never skipped silently: the traces are fixed public files, so a
//! bad row means a wrong or damaged file, and dropping it would shift the totals that
//! published results are compared against. Header columns are found by name, so column
//! order does not matter and extra columns are ignored; whitespace around a field and a
//! UTF-8 byte-order mark before the header are dropped; times and durations past
//! [`MAX_TRACE_SECONDS`] (the end of the year 9999) are refused; a record with a different field
//! count than the header is an error, and so is one longer than [`MAX_RECORD_BYTES`] (a file
//! that is one endless line); blank lines are skipped. A zero-byte file is
//! [`TraceError::Empty`]; a header with no rows loads as an empty trace.
//!
//! The oddities that the real files legitimately contain are accepted explicitly and
//! documented on each module (e.g. empty `scheduled_time` for pending openb pods, the
//! `multigpu*` pod lists without time columns, `CPU` machines in PAI, the Philly export's
//! trailing blank line). No input makes a loader panic.
//!
//! # Example
//!
//! ```
//! use std::path::Path;
//! use arbiter_traces::{GpuModel, TraceError, openb};
//!
//! let csv = "\
//! name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
//! pod-a,6000,12288,1,460,T4|P100,LS,Running,10,250,12
//! pod-b,8000,30517,0,0,,BE,Pending,20,90,
//! ";
//! let pods = openb::read_pods(csv.as_bytes(), Path::new("inline.csv"))?;
//! assert_eq!(pods.len(), 2);
//! assert!(pods[0].is_gpu_sharing());
//! assert!(pods[0].gpu_spec.allows(GpuModel::T4) && !pods[0].gpu_spec.allows(GpuModel::G2));
//! assert_eq!(pods[1].times.map(|times| times.scheduled), Some(None));
//!
//! let broken = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\npod-c,1000,1024,1,abc\n";
//! let error = openb::read_pods(broken.as_bytes(), Path::new("pods.csv")).unwrap_err();
//! assert_eq!(
//!     error.to_string(),
//!     "pods.csv:2: column `gpu_milli`: value `abc`: invalid integer"
//! );
//! # Ok::<(), TraceError>(())
//! ```

#![forbid(unsafe_code)]

mod error;
mod gpu;
mod location;
mod table;

pub mod genai;
pub mod openb;
pub mod pai;
pub mod philly;

pub use error::{Result, TraceError};
pub use gpu::{GpuModel, GpuModelSet, UnknownGpuModel};
pub use location::{TRACES_DIR_ENV, trace_file, traces_dir};
pub use table::{
    MAX_RECORD_BYTES, MAX_TRACE_SECONDS, TraceReader, header_columns, open_trace,
    read_header_columns,
};
