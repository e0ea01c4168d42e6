//! The Alibaba GPU-sharing cluster trace (`openb/`, cluster-trace-gpu-v2023).
//!
//! Node lists give the cluster; pod lists give the tasks to place. Oddities of the real
//! files that are accepted on purpose (everything else is an error):
//!
//! * CPU-only nodes (`openb_node_list_all_node.csv`) have `gpu` 0 and an empty `model`.
//! * `Pending` pods were never scheduled: their `scheduled_time` is empty.
//! * The `multigpu*` variants have only `name,cpu_milli,memory_mib,num_gpu,gpu_milli`: no
//!   `gpu_spec`, `qos`, `pod_phase` or time columns. Missing optional columns are detected
//!   from the header and become "any model" / `None`.
//! * `gpu_spec` may repeat a model (`V100M16|V100M32|V100M32`); the set ignores repeats.

use std::io::Read;
use std::path::Path;

use crate::error::Result;
use crate::gpu::{GpuModel, GpuModelSet};
use crate::table::{Column, Row, Table, open_trace};

/// One whole GPU in milli-GPUs.
pub const MILLI_PER_GPU: u32 = 1000;

/// Relative path (under [`crate::traces_dir`]) of the 1,213 GPU nodes.
pub const GPU_NODES_FILE: &str = "openb/openb_node_list_gpu_node.csv";
/// Relative path of all 1,523 nodes, including the 310 CPU-only ones.
pub const ALL_NODES_FILE: &str = "openb/openb_node_list_all_node.csv";

/// A machine of the openb cluster.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OpenbNode {
    /// `sn`, e.g. `openb-node-0000`.
    pub name: String,
    pub cpu_milli: u32,
    pub memory_mib: u32,
    /// `gpu`: number of GPUs.
    pub gpu_count: u32,
    /// `model`; `None` exactly when the node has no GPU.
    pub gpu_model: Option<GpuModel>,
}

/// Parses a node list from CSV text. `file` only labels errors.
pub fn read_nodes(source: impl Read, file: &Path) -> Result<Vec<OpenbNode>> {
    let mut table = Table::new(source, file)?;
    let name = table.require("sn")?;
    let cpu_milli = table.require("cpu_milli")?;
    let memory_mib = table.require("memory_mib")?;
    let gpu = table.require("gpu")?;
    let model = table.require("model")?;
    let mut nodes = Vec::new();
    while let Some(row) = table.next_row()? {
        let gpu_count: u32 = row.unsigned(gpu)?;
        let model_name = row.text(model)?;
        let gpu_model = match (gpu_count, model_name) {
            (0, "") => None,
            (0, _) => return Err(row.error(model, "node has no GPUs but names a GPU model")),
            (_, "") => return Err(row.error(model, "node has GPUs but no GPU model")),
            (_, listed) => Some(
                listed
                    .parse::<GpuModel>()
                    .map_err(|error| row.error(model, error.to_string()))?,
            ),
        };
        nodes.push(OpenbNode {
            name: row.required_string(name)?,
            cpu_milli: row.unsigned(cpu_milli)?,
            memory_mib: row.unsigned(memory_mib)?,
            gpu_count,
            gpu_model,
        });
    }
    Ok(nodes)
}

/// Loads a node list file (plain or gzip).
pub fn load_nodes(path: impl AsRef<Path>) -> Result<Vec<OpenbNode>> {
    let path = path.as_ref();
    read_nodes(open_trace(path)?, path)
}

/// Kubernetes QoS class of a pod (`qos`). `LS` and `BE` are Alibaba's latency-sensitive
/// and best-effort classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Qos {
    LatencySensitive,
    BestEffort,
    Burstable,
    Guaranteed,
}

impl Qos {
    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "LS" => Qos::LatencySensitive,
            "BE" => Qos::BestEffort,
            "Burstable" => Qos::Burstable,
            "Guaranteed" => Qos::Guaranteed,
            _ => return None,
        })
    }
}

/// Final phase of the pod in the source cluster (`pod_phase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl PodPhase {
    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "Pending" => PodPhase::Pending,
            "Running" => PodPhase::Running,
            "Succeeded" => PodPhase::Succeeded,
            "Failed" => PodPhase::Failed,
            _ => return None,
        })
    }
}

/// Lifetime of a pod, in trace seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodTimes {
    pub creation: u64,
    /// Never before `creation`.
    pub deletion: u64,
    /// `None` when the pod was never scheduled (empty in the file; the `Pending` pods).
    pub scheduled: Option<u64>,
}

impl PodTimes {
    /// Seconds from creation to deletion (0 for a hand-built value with deletion first).
    pub const fn lifetime(&self) -> u64 {
        self.deletion.saturating_sub(self.creation)
    }
}

/// A task of an openb pod list.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OpenbPod {
    pub name: String,
    pub cpu_milli: u32,
    pub memory_mib: u32,
    /// Number of GPUs requested; 0 for CPU-only tasks.
    pub num_gpu: u32,
    /// Share of each requested GPU in milli-GPUs (0..=1000). Below 1000 only with
    /// `num_gpu == 1`: a GPU-sharing task.
    pub gpu_milli: u32,
    /// Allowed GPU models; [`GpuModelSet::ANY`] when empty or when the column is absent.
    pub gpu_spec: GpuModelSet,
    /// `None` when the variant has no `qos` column.
    pub qos: Option<Qos>,
    /// `None` when the variant has no `pod_phase` column.
    pub phase: Option<PodPhase>,
    /// `None` when the variant has no time columns (`multigpu*`).
    pub times: Option<PodTimes>,
}

impl OpenbPod {
    /// Total GPU request in milli-GPUs (`num_gpu * gpu_milli`).
    pub const fn total_gpu_milli(&self) -> u64 {
        self.num_gpu as u64 * self.gpu_milli as u64
    }

    /// Whether this task shares a GPU with others (a fraction of one GPU).
    pub const fn is_gpu_sharing(&self) -> bool {
        self.num_gpu == 1 && self.gpu_milli < MILLI_PER_GPU
    }
}

/// The published pod-list variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum PodListVariant {
    Default,
    GpuShare20,
    GpuShare40,
    GpuShare60,
    GpuShare80,
    GpuShare100,
    GpuSpec10,
    GpuSpec20,
    Cpu050,
    Cpu100,
    MultiGpu20,
    MultiGpu30,
    MultiGpu40,
}

impl PodListVariant {
    /// Every variant.
    pub const ALL: [PodListVariant; 13] = [
        PodListVariant::Default,
        PodListVariant::GpuShare20,
        PodListVariant::GpuShare40,
        PodListVariant::GpuShare60,
        PodListVariant::GpuShare80,
        PodListVariant::GpuShare100,
        PodListVariant::GpuSpec10,
        PodListVariant::GpuSpec20,
        PodListVariant::Cpu050,
        PodListVariant::Cpu100,
        PodListVariant::MultiGpu20,
        PodListVariant::MultiGpu30,
        PodListVariant::MultiGpu40,
    ];

    /// Path of the variant's file relative to [`crate::traces_dir`].
    pub const fn relative_path(self) -> &'static str {
        match self {
            PodListVariant::Default => "openb/openb_pod_list_default.csv",
            PodListVariant::GpuShare20 => "openb/openb_pod_list_gpushare20.csv",
            PodListVariant::GpuShare40 => "openb/openb_pod_list_gpushare40.csv",
            PodListVariant::GpuShare60 => "openb/openb_pod_list_gpushare60.csv",
            PodListVariant::GpuShare80 => "openb/openb_pod_list_gpushare80.csv",
            PodListVariant::GpuShare100 => "openb/openb_pod_list_gpushare100.csv",
            PodListVariant::GpuSpec10 => "openb/openb_pod_list_gpuspec10.csv",
            PodListVariant::GpuSpec20 => "openb/openb_pod_list_gpuspec20.csv",
            PodListVariant::Cpu050 => "openb/openb_pod_list_cpu050.csv",
            PodListVariant::Cpu100 => "openb/openb_pod_list_cpu100.csv",
            PodListVariant::MultiGpu20 => "openb/openb_pod_list_multigpu20.csv",
            PodListVariant::MultiGpu30 => "openb/openb_pod_list_multigpu30.csv",
            PodListVariant::MultiGpu40 => "openb/openb_pod_list_multigpu40.csv",
        }
    }
}

impl PodListVariant {
    /// The variant's short name, as the reference results name it
    /// (`default`, `gpushare20`, …, `multigpu40`): the file name's suffix.
    pub fn name(self) -> &'static str {
        let path = self.relative_path();
        let stem = path.strip_suffix(".csv").unwrap_or(path);
        stem.rsplit("openb_pod_list_").next().unwrap_or(stem)
    }

    /// The variant named `name` ([`PodListVariant::name`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.name() == name)
    }
}

/// Relative path of the FGD authors' own simulator results (see the traces README).
pub const REFERENCE_ALLOC_FILE: &str = "openb/reference_alloc.csv";

/// One run of the FGD authors' simulator: GPU allocation (percent of GPUs)
/// when the arrived GPU requests reach 100 % and 130 % of capacity.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReferenceAlloc {
    pub variant: PodListVariant,
    /// The paper's policy name (`Random`, `DotProd`, `GpuClustering`,
    /// `GpuPacking`, `BestFit`, `FGD`).
    pub policy: String,
    pub seed: u64,
    pub alloc_pct_at_100: f64,
    pub alloc_pct_at_130: f64,
}

/// Parses reference results from CSV text. `file` only labels errors.
pub fn read_reference_alloc(source: impl Read, file: &Path) -> Result<Vec<ReferenceAlloc>> {
    let mut table = Table::new(source, file)?;
    let trace = table.require("trace")?;
    let policy = table.require("policy")?;
    let seed = table.require("seed")?;
    let at_100 = table.require("alloc_pct_at_100")?;
    let at_130 = table.require("alloc_pct_at_130")?;
    let mut out = Vec::new();
    while let Some(row) = table.next_row()? {
        let name = row.text(trace)?;
        let variant = PodListVariant::from_name(name).ok_or_else(|| {
            row.error(trace, format!("`{name}` is not an openb pod list variant"))
        })?;
        let percent = |column| -> Result<f64> {
            let v = row.non_negative_real(column)?;
            if v > 100.0 {
                return Err(row.error(column, "an allocation above 100 %"));
            }
            Ok(v)
        };
        out.push(ReferenceAlloc {
            variant,
            policy: row.required_string(policy)?,
            seed: row.unsigned(seed)?,
            alloc_pct_at_100: percent(at_100)?,
            alloc_pct_at_130: percent(at_130)?,
        });
    }
    Ok(out)
}

/// Reads reference results from a file ([`REFERENCE_ALLOC_FILE`]).
pub fn load_reference_alloc(path: impl AsRef<Path>) -> Result<Vec<ReferenceAlloc>> {
    let path = path.as_ref();
    read_reference_alloc(open_trace(path)?, path)
}

/// Parses a pod list from CSV text; optional column groups are detected from the header.
/// `file` only labels errors.
pub fn read_pods(source: impl Read, file: &Path) -> Result<Vec<OpenbPod>> {
    let mut table = Table::new(source, file)?;
    let name = table.require("name")?;
    let cpu_milli = table.require("cpu_milli")?;
    let memory_mib = table.require("memory_mib")?;
    let num_gpu = table.require("num_gpu")?;
    let gpu_milli = table.require("gpu_milli")?;
    let gpu_spec = table.column("gpu_spec");
    let qos = table.column("qos");
    let phase = table.column("pod_phase");
    // The three times come as a group: a header with only some of them is a broken file,
    // not a variant, so name the first one that is missing.
    let creation = table.column("creation_time");
    let deletion = table.column("deletion_time");
    let scheduled = table.column("scheduled_time");
    let time_columns = match (creation, deletion, scheduled) {
        (None, None, None) => None,
        (Some(creation), Some(deletion), Some(scheduled)) => Some((creation, deletion, scheduled)),
        _ => {
            let missing = [
                ("creation_time", creation),
                ("deletion_time", deletion),
                ("scheduled_time", scheduled),
            ]
            .into_iter()
            .find_map(|(column_name, found)| found.is_none().then_some(column_name))
            .unwrap_or("creation_time");
            return Err(table.missing(missing));
        }
    };

    let mut pods = Vec::new();
    while let Some(row) = table.next_row()? {
        let num_gpu_value: u32 = row.unsigned(num_gpu)?;
        let gpu_milli_value: u32 = row.unsigned(gpu_milli)?;
        check_gpu_request(&row, num_gpu_value, gpu_milli_value, gpu_milli)?;
        let gpu_spec_value = match gpu_spec {
            Some(column) => GpuModelSet::parse(row.text(column)?)
                .map_err(|error| row.error(column, error.to_string()))?,
            None => GpuModelSet::ANY,
        };
        let qos_value = match qos {
            Some(column) => Some(Qos::parse(row.text(column)?).ok_or_else(|| {
                row.error(
                    column,
                    "unknown QoS class (expected LS, BE, Burstable or Guaranteed)",
                )
            })?),
            None => None,
        };
        let phase_value = match phase {
            Some(column) => Some(PodPhase::parse(row.text(column)?).ok_or_else(|| {
                row.error(
                    column,
                    "unknown pod phase (expected Pending, Running, Succeeded or Failed)",
                )
            })?),
            None => None,
        };
        let times = match time_columns {
            Some((creation, deletion, scheduled)) => {
                Some(read_times(&row, creation, deletion, scheduled)?)
            }
            None => None,
        };
        pods.push(OpenbPod {
            name: row.required_string(name)?,
            cpu_milli: row.unsigned(cpu_milli)?,
            memory_mib: row.unsigned(memory_mib)?,
            num_gpu: num_gpu_value,
            gpu_milli: gpu_milli_value,
            gpu_spec: gpu_spec_value,
            qos: qos_value,
            phase: phase_value,
            times,
        });
    }
    Ok(pods)
}

/// Loads a pod list file (plain or gzip).
pub fn load_pods(path: impl AsRef<Path>) -> Result<Vec<OpenbPod>> {
    let path = path.as_ref();
    read_pods(open_trace(path)?, path)
}

/// The invariants the FGD simulator relies on: a share is at most one GPU, a GPU request
/// has a share and a share has a GPU, and only single-GPU tasks share.
fn check_gpu_request(
    row: &Row<'_>,
    num_gpu: u32,
    gpu_milli: u32,
    gpu_milli_column: Column,
) -> Result<()> {
    let reason = if gpu_milli > MILLI_PER_GPU {
        "more than one whole GPU (1000)"
    } else if (num_gpu == 0) != (gpu_milli == 0) {
        "must be 0 exactly when num_gpu is 0"
    } else if num_gpu > 1 && gpu_milli != MILLI_PER_GPU {
        "multi-GPU tasks must request whole GPUs (1000)"
    } else {
        return Ok(());
    };
    Err(row.error(gpu_milli_column, reason))
}

fn read_times(
    row: &Row<'_>,
    creation: Column,
    deletion: Column,
    scheduled: Column,
) -> Result<PodTimes> {
    let creation_value = row.seconds(creation)?;
    let deletion_value = row.seconds(deletion)?;
    if deletion_value < creation_value {
        return Err(row.error(deletion, "deletion before creation"));
    }
    Ok(PodTimes {
        creation: creation_value,
        deletion: deletion_value,
        scheduled: row.seconds_or_empty(scheduled)?,
    })
}

/// Sum of `gpu_count` over nodes: the cluster's GPU capacity.
pub fn total_gpus(nodes: &[OpenbNode]) -> u64 {
    nodes.iter().map(|node| u64::from(node.gpu_count)).sum()
}
