//! Arbitrary input never panics a parser: it loads or returns an error.

use std::path::Path;

use proptest::prelude::*;

use arbiter_traces::{genai, openb, pai, philly};

/// Runs every reader on `input`, discarding the results: only a panic fails.
fn parse_with_every_reader(input: &[u8]) {
    let file = Path::new("fuzz.csv");
    let _ = openb::read_nodes(input, file);
    let _ = openb::read_pods(input, file);
    let _ = pai::read_machines(input, file);
    let _ = pai::read_minibatch(input, file);
    let _ = pai::read_philly_runtimes(input, file);
    let _ = philly::read_jobs(input, file);
    let _ = genai::read_qps(input, file);
    let _ = genai::read_pod_gpu_series(input, file);
    if let Ok(requests) = genai::read_lora_requests(input, file) {
        for metric in [
            genai::DemandMetric::Arrivals,
            genai::DemandMetric::Concurrency,
        ] {
            let width = std::num::NonZeroU64::new(60).expect("60 is not zero");
            let _ = genai::demand_curve(&requests, width, metric);
        }
    }
}

/// Real headers, so random rows reach the field parsers instead of failing on the header.
const HEADERS: [&str; 9] = [
    "sn,cpu_milli,memory_mib,gpu,model",
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time",
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli",
    "machine,gpu_type,cap_cpu,cap_mem,cap_gpu",
    ",worker,gpu,time,batch_time_norm",
    "runtime",
    "timestamp,duration,num_gpus,gpu_time,cluster",
    "gmt_create,predict_type,predict_status,exec_time_seconds,groupId,prompt_length,negative_prompt_length,num_images_per_prompt,num_inference_steps,checkpoint_model_version_id,num_lora",
    "timestamp_anon,value,container_ip,request_type",
];

/// Fields drawn from values the real files use plus near misses.
fn field() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{0,21}",
        "-?[0-9]{1,5}\\.[0-9]{0,3}",
        "(T4|G2|V100M32|CPU|MISC|LS|BE|Pending|Running|SUCCEED|TXT_2_IMG|API Requests|NaN|inf|)",
        "[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}",
        "[A-Za-z0-9|\"\n -]{0,8}",
    ]
}

fn structured_input() -> impl Strategy<Value = Vec<u8>> {
    let rows = prop::collection::vec(prop::collection::vec(field(), 1..12), 0..6);
    (0..HEADERS.len(), rows).prop_map(|(header, rows)| {
        let mut text = String::from(HEADERS[header]);
        for row in rows {
            text.push('\n');
            text.push_str(&row.join(","));
        }
        text.into_bytes()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(input in prop::collection::vec(any::<u8>(), 0..512)) {
        parse_with_every_reader(&input);
    }

    #[test]
    fn arbitrary_rows_under_real_headers_never_panic(input in structured_input()) {
        parse_with_every_reader(&input);
    }
}

fn lora_request(created_at: i64, exec_time_secs: f64) -> genai::LoraRequest {
    genai::LoraRequest {
        created_at,
        predict_type: genai::PredictType::TextToImage,
        status: genai::PredictStatus::Succeeded,
        exec_time_secs,
        num_images: None,
        num_inference_steps: None,
        num_lora: 0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Busy time is redistributed across buckets, never created or lost, and arrivals are
    /// all counted, whatever the bucket width and request placement.
    #[test]
    fn demand_curve_conserves_requests_and_busy_time(
        requests in prop::collection::vec((1_600_000_000i64..1_600_100_000, 0.0f64..5_000.0), 1..50),
        width in 1u64..4_000,
    ) {
        let requests: Vec<_> = requests.into_iter().map(|(at, exec)| lora_request(at, exec)).collect();
        let width = std::num::NonZeroU64::new(width).expect("range starts at 1");
        let arrivals = genai::demand_curve(&requests, width, genai::DemandMetric::Arrivals).unwrap();
        prop_assert_eq!(arrivals.values.iter().sum::<f64>(), requests.len() as f64);
        let busy = genai::demand_curve(&requests, width, genai::DemandMetric::Concurrency).unwrap();
        let expected: f64 = requests.iter().map(|r| r.exec_time_secs).sum();
        let measured = busy.values.iter().sum::<f64>() * width.get() as f64;
        prop_assert!((measured - expected).abs() < 1e-6 * expected.max(1.0), "{} vs {}", measured, expected);
        prop_assert!(busy.values.iter().all(|v| *v >= -1e-9 && *v <= busy.peak));
    }

    #[test]
    fn demand_curve_never_panics_on_hand_built_requests(
        requests in prop::collection::vec((any::<i64>(), any::<f64>()), 0..8),
        width in 1u64..u64::MAX,
    ) {
        let requests: Vec<_> = requests.into_iter().map(|(at, exec)| lora_request(at, exec)).collect();
        let width = std::num::NonZeroU64::new(width).expect("range starts at 1");
        for metric in [genai::DemandMetric::Arrivals, genai::DemandMetric::Concurrency] {
            if let Ok(curve) = genai::demand_curve(&requests, width, metric) {
                let _ = curve.normalized();
                let _ = curve.bucket_start(curve.values.len());
            }
        }
    }
}
