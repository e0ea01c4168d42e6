//! Alibaba generative-AI serving (`genai2026/`, cluster-trace-v2026-GenAI): LoRA image
//! requests, per-container QPS and per-pod GPU series, plus the inference demand curve
//! derived from the requests.
//!
//! Accepted oddities of the real files: 25 `PENDING` requests have empty `prompt_length`,
//! `num_images_per_prompt`, `num_inference_steps` and `checkpoint_model_version_id`
//! (loaded as `None`); whole counts are written as reals (`4.0`); QPS rows of type
//! `API Requests` have an empty `container_ip` (loaded as `container: None`).

use std::io::Read;
use std::num::NonZeroU64;
use std::path::Path;

use crate::error::{Result, TraceError};
use crate::table::{Interner, Table, open_trace};

/// Relative path (under [`crate::traces_dir`]) of the LoRA request trace.
pub const LORA_REQUESTS_FILE: &str = "genai2026/lora_request_trace.csv.gz";
/// Relative path of the per-container QPS samples.
pub const QPS_FILE: &str = "genai2026/qps.csv.gz";
/// Relative path of the per-pod GPU duty cycle (percent busy).
pub const POD_GPU_DUTY_CYCLE_FILE: &str = "genai2026/pod_gpu_duty_cycle_anon.csv.gz";
/// Relative path of the per-pod GPU memory in use (bytes).
pub const POD_GPU_MEMORY_FILE: &str = "genai2026/pod_gpu_memory_used_bytes_anon.csv.gz";

/// Upper bound on the buckets of a [`DemandCurve`], so a tiny bucket width or an absurd
/// execution time in untrusted input cannot exhaust memory.
pub const MAX_DEMAND_BUCKETS: usize = 10_000_000;

/// What the request asked for (`predict_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum PredictType {
    TextToImage,
    ImageToImage,
    Inpainting,
}

/// Outcome of the request (`predict_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum PredictStatus {
    Succeeded,
    Failed,
    Pending,
    Processing,
}

/// One image-generation request.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoraRequest {
    /// `gmt_create`: seconds since 1970-01-01 00:00:00 GMT.
    pub created_at: i64,
    pub predict_type: PredictType,
    pub status: PredictStatus,
    /// `exec_time_seconds`: execution time (0 for requests that never ran).
    pub exec_time_secs: f64,
    /// `num_images_per_prompt`; `None` where the field is empty.
    pub num_images: Option<u32>,
    /// `num_inference_steps`; `None` where the field is empty.
    pub num_inference_steps: Option<u32>,
    /// `num_lora`: LoRA adapters applied.
    pub num_lora: u32,
}

/// Parses the LoRA request trace from CSV text (decompressed). `file` only labels errors.
pub fn read_lora_requests(source: impl Read, file: &Path) -> Result<Vec<LoraRequest>> {
    let mut table = Table::new(source, file)?;
    let gmt_create = table.require("gmt_create")?;
    let predict_type = table.require("predict_type")?;
    let predict_status = table.require("predict_status")?;
    let exec_time = table.require("exec_time_seconds")?;
    let num_images = table.require("num_images_per_prompt")?;
    let num_steps = table.require("num_inference_steps")?;
    let num_lora = table.require("num_lora")?;
    let mut requests = Vec::new();
    while let Some(row) = table.next_row()? {
        let predict_type_value = match row.raw(predict_type) {
            b"TXT_2_IMG" => PredictType::TextToImage,
            b"IMG_2_IMG" => PredictType::ImageToImage,
            b"INPAINTING" => PredictType::Inpainting,
            _ => {
                return Err(row.error(
                    predict_type,
                    "unknown predict type (expected TXT_2_IMG, IMG_2_IMG or INPAINTING)",
                ));
            }
        };
        let status = match row.raw(predict_status) {
            b"SUCCEED" => PredictStatus::Succeeded,
            b"FAILED" => PredictStatus::Failed,
            b"PENDING" => PredictStatus::Pending,
            b"PROCESSING" => PredictStatus::Processing,
            _ => {
                return Err(row.error(
                    predict_status,
                    "unknown status (expected SUCCEED, FAILED, PENDING or PROCESSING)",
                ));
            }
        };
        requests.push(LoraRequest {
            created_at: row.datetime(gmt_create)?,
            predict_type: predict_type_value,
            status,
            exec_time_secs: row.real_seconds(exec_time)?,
            num_images: row.whole_real_or_empty(num_images)?,
            num_inference_steps: row.whole_real_or_empty(num_steps)?,
            num_lora: row.unsigned(num_lora)?,
        });
    }
    Ok(requests)
}

/// Loads the LoRA request trace, decompressing it on the fly when it is gzip.
pub fn load_lora_requests(path: impl AsRef<Path>) -> Result<Vec<LoraRequest>> {
    let path = path.as_ref();
    read_lora_requests(open_trace(path)?, path)
}

/// What a [`DemandCurve`] bucket measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DemandMetric {
    /// Requests created in the bucket.
    Arrivals,
    /// Mean number of requests executing during the bucket: the request-seconds that fall
    /// in it divided by its width. Each request is taken to run for `exec_time_secs` from
    /// its creation (the trace has no start time); this is the quantity to scale to GPUs.
    Concurrency,
}

/// Demand per fixed-width time bucket, with the summary needed to scale it to a pool.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DemandCurve {
    /// Start of bucket 0, in the requests' clock; a multiple of `bucket_secs` so daily
    /// buckets start at midnight.
    pub start: i64,
    pub bucket_secs: u64,
    /// Raw demand per bucket; buckets with no demand are present as 0.
    pub values: Vec<f64>,
    /// Largest value (0 for an empty curve).
    pub peak: f64,
    /// Mean over all buckets (0 for an empty curve).
    pub mean: f64,
}

impl DemandCurve {
    /// Start time of bucket `index`.
    pub fn bucket_start(&self, index: usize) -> i64 {
        let offset =
            i64::try_from(index as u128 * u128::from(self.bucket_secs)).unwrap_or(i64::MAX);
        self.start.saturating_add(offset)
    }

    /// Values divided by the peak, in `0..=1` (all zeros when the peak is 0).
    pub fn normalized(&self) -> Vec<f64> {
        self.scaled_to_peak(1.0)
    }

    /// Values scaled so the peak bucket equals `peak` (e.g. the GPUs of an inference pool).
    pub fn scaled_to_peak(&self, peak: f64) -> Vec<f64> {
        if self.peak <= 0.0 {
            return vec![0.0; self.values.len()];
        }
        let factor = peak / self.peak;
        self.values.iter().map(|value| value * factor).collect()
    }

    /// Peak divided by mean (burstiness); 0 for an empty or all-zero curve.
    pub fn peak_to_mean(&self) -> f64 {
        if self.mean > 0.0 {
            self.peak / self.mean
        } else {
            0.0
        }
    }
}

/// Builds the demand curve of `requests` (any order) in buckets of `bucket_secs`.
///
/// Filter the requests first if only some should count (e.g. `SUCCEED` ones). An empty
/// slice gives an empty curve. Fails only when the curve would exceed
/// [`MAX_DEMAND_BUCKETS`].
pub fn demand_curve(
    requests: &[LoraRequest],
    bucket_secs: NonZeroU64,
    metric: DemandMetric,
) -> Result<DemandCurve> {
    let width = bucket_secs.get();
    let Some(first) = requests.iter().map(|request| request.created_at).min() else {
        return Ok(DemandCurve {
            start: 0,
            bucket_secs: width,
            values: Vec::new(),
            peak: 0.0,
            mean: 0.0,
        });
    };
    // Work in i128 seconds so no timestamp and width combination can overflow.
    let width_wide = i128::from(width);
    let start = i128::from(first).div_euclid(width_wide) * width_wide;
    let end_of = |request: &LoraRequest| match metric {
        DemandMetric::Arrivals => request.created_at as f64,
        DemandMetric::Concurrency => request.created_at as f64 + busy_secs(request),
    };
    let last_end = requests.iter().map(end_of).fold(f64::MIN, f64::max);
    let span_buckets = ((last_end - start as f64) / width as f64).floor() + 1.0;
    if span_buckets.is_nan() || span_buckets > MAX_DEMAND_BUCKETS as f64 {
        return Err(TraceError::DemandCurveTooLong {
            buckets: if span_buckets.is_finite() {
                span_buckets as u128
            } else {
                u128::MAX
            },
            limit: MAX_DEMAND_BUCKETS,
        });
    }
    let bucket_count = span_buckets as usize;
    let mut values = vec![0.0; bucket_count];
    let bucket_of = |time: f64| -> usize {
        let index = ((time - start as f64) / width as f64).floor();
        // Clamped: `time` lies in the span by construction, and rounding must not index out.
        (index.max(0.0) as usize).min(bucket_count - 1)
    };
    match metric {
        DemandMetric::Arrivals => {
            for request in requests {
                values[bucket_of(request.created_at as f64)] += 1.0;
            }
        }
        DemandMetric::Concurrency => {
            // Partial overlaps go straight into `values`; buckets a request covers
            // completely go through a difference array, so a long request costs O(1).
            let mut full_cover_delta = vec![0.0; bucket_count + 1];
            let width_f = width as f64;
            for request in requests {
                let begin = request.created_at as f64;
                let end = begin + busy_secs(request);
                let first_bucket = bucket_of(begin);
                let last_bucket = bucket_of(end);
                if first_bucket == last_bucket {
                    values[first_bucket] += end - begin;
                    continue;
                }
                let first_boundary = start as f64 + (first_bucket as f64 + 1.0) * width_f;
                let last_boundary = start as f64 + last_bucket as f64 * width_f;
                values[first_bucket] += first_boundary - begin;
                values[last_bucket] += end - last_boundary;
                full_cover_delta[first_bucket + 1] += width_f;
                full_cover_delta[last_bucket] -= width_f;
            }
            let mut covered = 0.0;
            for (value, delta) in values.iter_mut().zip(&full_cover_delta) {
                covered += delta;
                *value = (*value + covered) / width_f;
            }
        }
    }
    let peak = values.iter().copied().fold(0.0, f64::max);
    let mean = values.iter().sum::<f64>() / bucket_count as f64;
    Ok(DemandCurve {
        start: i64::try_from(start).unwrap_or(i64::MIN),
        bucket_secs: width,
        values,
        peak,
        mean,
    })
}

/// The execution time a request contributes to [`DemandMetric::Concurrency`]. Loaders
/// only produce finite non-negative times; a hand-built request with a negative or NaN time
/// counts as zero rather than corrupting neighbouring buckets.
fn busy_secs(request: &LoraRequest) -> f64 {
    if request.exec_time_secs >= 0.0 {
        request.exec_time_secs
    } else {
        0.0
    }
}

/// Kind of traffic a QPS sample counts (`request_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum QpsRequestType {
    /// `API Requests`: gateway traffic, not tied to a container.
    Api,
    /// `Generative Requests`: served by one container.
    Generative,
}

/// One QPS sample.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct QpsSample {
    /// `timestamp_anon`: anonymized seconds (offsets are real, the origin is not).
    pub timestamp: i64,
    /// `value`: queries per second.
    pub qps: f64,
    /// Index into [`QpsTrace::containers`]; `None` for an empty `container_ip`.
    pub container: Option<u32>,
    pub request_type: QpsRequestType,
}

/// QPS samples and the anonymized container ids they refer to.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct QpsTrace {
    pub samples: Vec<QpsSample>,
    pub containers: Vec<String>,
}

/// Parses `qps.csv` from CSV text (decompressed). `file` only labels errors.
pub fn read_qps(source: impl Read, file: &Path) -> Result<QpsTrace> {
    let mut table = Table::new(source, file)?;
    let timestamp = table.require("timestamp_anon")?;
    let value = table.require("value")?;
    let container_ip = table.require("container_ip")?;
    let request_type = table.require("request_type")?;
    let mut containers = Interner::default();
    let mut samples = Vec::new();
    while let Some(row) = table.next_row()? {
        let request_type_value = match row.raw(request_type) {
            b"API Requests" => QpsRequestType::Api,
            b"Generative Requests" => QpsRequestType::Generative,
            _ => {
                return Err(row.error(
                    request_type,
                    "unknown request type (expected `API Requests` or `Generative Requests`)",
                ));
            }
        };
        let container = intern_optional(&mut containers, &row, container_ip)?;
        samples.push(QpsSample {
            timestamp: row.whole_seconds(timestamp)?,
            qps: row.non_negative_real(value)?,
            container,
            request_type: request_type_value,
        });
    }
    Ok(QpsTrace {
        samples,
        containers: containers.into_names(),
    })
}

/// Loads `qps.csv.gz`, decompressing it on the fly when it is gzip.
pub fn load_qps(path: impl AsRef<Path>) -> Result<QpsTrace> {
    let path = path.as_ref();
    read_qps(open_trace(path)?, path)
}

/// One sample of a per-pod GPU series.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PodGpuSample {
    /// `timestamp_anon`: anonymized seconds, same clock as the QPS trace.
    pub timestamp: i64,
    /// `value`: duty cycle in percent (0 to 100) or memory in bytes, depending on the file.
    pub value: f64,
    /// Index into [`PodGpuSeries::containers`].
    pub container: u32,
}

/// A per-pod GPU series (duty cycle or memory used) and its anonymized container ids.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PodGpuSeries {
    pub samples: Vec<PodGpuSample>,
    pub containers: Vec<String>,
}

/// Parses `pod_gpu_duty_cycle_anon.csv` or `pod_gpu_memory_used_bytes_anon.csv` (they
/// differ only in column order). `file` only labels errors.
pub fn read_pod_gpu_series(source: impl Read, file: &Path) -> Result<PodGpuSeries> {
    let mut table = Table::new(source, file)?;
    let timestamp = table.require("timestamp_anon")?;
    let value = table.require("value")?;
    let container_ip = table.require("container_ip")?;
    let mut containers = Interner::default();
    let mut samples = Vec::new();
    while let Some(row) = table.next_row()? {
        let container = intern_optional(&mut containers, &row, container_ip)?
            .ok_or_else(|| row.error(container_ip, "empty value"))?;
        samples.push(PodGpuSample {
            timestamp: row.whole_seconds(timestamp)?,
            value: row.non_negative_real(value)?,
            container,
        });
    }
    Ok(PodGpuSeries {
        samples,
        containers: containers.into_names(),
    })
}

/// Loads a per-pod GPU series file, decompressing it on the fly when it is gzip.
pub fn load_pod_gpu_series(path: impl AsRef<Path>) -> Result<PodGpuSeries> {
    let path = path.as_ref();
    read_pod_gpu_series(open_trace(path)?, path)
}

fn intern_optional(
    interner: &mut Interner,
    row: &crate::table::Row<'_>,
    column: crate::table::Column,
) -> Result<Option<u32>> {
    let name = row.text(column)?;
    if name.is_empty() {
        return Ok(None);
    }
    interner
        .intern(name)
        .map(Some)
        .ok_or_else(|| row.error(column, "too many distinct containers"))
}
