//! Malformed input: every error names the file, the 1-based line, and for a bad field the
//! column and the value.

use std::io::Write;
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};

use arbiter_traces::genai::{self, DemandMetric, LoraRequest, PredictStatus, PredictType};
use arbiter_traces::{TraceError, openb, pai, philly};

const POD_HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time";
const NODE_HEADER: &str = "sn,cpu_milli,memory_mib,gpu,model";

/// Writes `contents` to a fresh temporary file named `name`.
fn temp_file(name: &str, contents: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, contents).unwrap();
    (dir, path)
}

fn gzip(contents: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(contents).unwrap();
    encoder.finish().unwrap()
}

/// Asserts a field error with exactly these coordinates.
#[track_caller]
fn assert_field_error(error: &TraceError, file: &Path, line: u64, column: &str, value: &str) {
    match error {
        TraceError::Field {
            file: error_file,
            line: error_line,
            column: error_column,
            value: error_value,
            ..
        } => {
            assert_eq!(
                (
                    error_file.as_path(),
                    *error_line,
                    error_column.as_str(),
                    error_value.as_str()
                ),
                (file, line, column, value),
                "{error}"
            );
        }
        other => panic!("expected a field error, got {other:?}"),
    }
}

#[test]
fn bad_integer_in_pod_file_reports_path_line_column_value() {
    let contents = format!(
        "{POD_HEADER}\n\
         openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0\n\
         openb-pod-0001,6000,12288,1,abc,,LS,Running,427061,12902960,427061\n"
    );
    let (_dir, path) = temp_file("openb_pod_list_default.csv", contents.as_bytes());
    let error = openb::load_pods(&path).unwrap_err();
    assert_field_error(&error, &path, 3, "gpu_milli", "abc");
    assert_eq!(
        error.to_string(),
        format!(
            "{}:3: column `gpu_milli`: value `abc`: invalid integer",
            path.display()
        )
    );
    assert_eq!((error.line(), error.column()), (Some(3), Some("gpu_milli")));
}

#[test]
fn pod_invariants_are_enforced() {
    let file = Path::new("pods.csv");
    let cases = [
        ("p,1000,1024,1,1500,,LS,Running,0,1,0", "gpu_milli", "1500"),
        ("p,1000,1024,0,500,,LS,Running,0,1,0", "gpu_milli", "500"),
        ("p,1000,1024,2,500,,LS,Running,0,1,0", "gpu_milli", "500"),
        (
            "p,1000,1024,1,500,H100,LS,Running,0,1,0",
            "gpu_spec",
            "H100",
        ),
        (
            "p,1000,1024,1,500,T4||P100,LS,Running,0,1,0",
            "gpu_spec",
            "T4||P100",
        ),
        ("p,1000,1024,1,500,,XX,Running,0,1,0", "qos", "XX"),
        (
            "p,1000,1024,1,500,,LS,Evicted,0,1,0",
            "pod_phase",
            "Evicted",
        ),
        ("p,1000,1024,1,500,,LS,Running,5,1,0", "deletion_time", "1"),
        ("p,1000,1024,1,500,,LS,Running,,1,0", "creation_time", ""),
        ("p,-1000,1024,1,500,,LS,Running,0,1,0", "cpu_milli", "-1000"),
        (
            "p,1000,99999999999,1,500,,LS,Running,0,1,0",
            "memory_mib",
            "99999999999",
        ),
        (",1000,1024,1,500,,LS,Running,0,1,0", "name", ""),
    ];
    for (row, column, value) in cases {
        let contents = format!("{POD_HEADER}\n{row}\n");
        let error = openb::read_pods(contents.as_bytes(), file).unwrap_err();
        assert_field_error(&error, file, 2, column, value);
    }
}

/// Times and durations past the year 9999 are refused where they are read: a simulator
/// turning 1.8e16 seconds into milliseconds saturated, and reported a finished job's JCT
/// as 0 s beside a makespan of 584 million years.
#[test]
fn times_and_durations_past_the_year_9999_are_refused() {
    let too_late = arbiter_traces::MAX_TRACE_SECONDS + 1;
    for (row, column) in [
        (
            format!("p0,1000,1024,1,1000,,LS,Running,0,{too_late},0"),
            "deletion_time",
        ),
        (
            format!("p0,1000,1024,1,1000,,LS,Running,{too_late},{too_late},"),
            "creation_time",
        ),
        (
            format!("p0,1000,1024,1,1000,,LS,Running,0,5,{too_late}"),
            "scheduled_time",
        ),
    ] {
        let contents = format!("{POD_HEADER}\n{row}\n");
        let error = openb::read_pods(contents.as_bytes(), Path::new("pods.csv")).unwrap_err();
        assert_eq!(error.column(), Some(column), "{error}");
        assert!(
            error.to_string().contains("the end of the year 9999"),
            "{error}"
        );
    }
    let last = arbiter_traces::MAX_TRACE_SECONDS;
    let contents = format!("{POD_HEADER}\np0,1000,1024,1,1000,,LS,Running,0,{last},0\n");
    assert!(openb::read_pods(contents.as_bytes(), Path::new("pods.csv")).is_ok());

    let jobs = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,1e300,1,1.0,c\n";
    let error = philly::read_jobs(jobs.as_bytes(), Path::new("jobs.csv")).unwrap_err();
    assert_eq!(error.column(), Some("duration"), "{error}");
}

#[test]
fn wrong_field_count_reports_the_line() {
    let contents = format!("{NODE_HEADER}\nn0,1000,1024,2,T4\nn1,1000,1024,2\n");
    let error = openb::read_nodes(contents.as_bytes(), Path::new("nodes.csv")).unwrap_err();
    assert!(
        matches!(&error, TraceError::Record { line: 3, reason, .. } if reason.contains("expected 5 fields")),
        "{error:?}"
    );
    assert!(error.to_string().starts_with("nodes.csv:3: "), "{error}");
}

#[test]
fn node_model_must_agree_with_gpu_count() {
    let file = Path::new("nodes.csv");
    for (row, value) in [
        ("n,1000,1024,2,", ""),
        ("n,1000,1024,0,T4", "T4"),
        ("n,1000,1024,2,H100", "H100"),
    ] {
        let contents = format!("{NODE_HEADER}\n{row}\n");
        let error = openb::read_nodes(contents.as_bytes(), file).unwrap_err();
        assert_field_error(&error, file, 2, "model", value);
    }
}

#[test]
fn missing_required_column_is_reported_on_line_one() {
    let error =
        openb::read_nodes("sn,cpu_milli,gpu,model\n".as_bytes(), Path::new("n.csv")).unwrap_err();
    assert!(matches!(&error, TraceError::MissingColumn { column, .. } if column == "memory_mib"));
    assert_eq!(
        error.to_string(),
        "n.csv:1: missing column `memory_mib` in header"
    );
}

#[test]
fn partial_time_columns_are_rejected() {
    let header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,scheduled_time\n";
    let error = openb::read_pods(header.as_bytes(), Path::new("p.csv")).unwrap_err();
    assert_eq!(error.column(), Some("deletion_time"));
}

#[test]
fn columns_are_found_by_name_not_position() {
    let contents = "model,gpu,sn,memory_mib,cpu_milli,extra\nT4,2,n0,1024,1000,ignored\n";
    let nodes = openb::read_nodes(contents.as_bytes(), Path::new("n.csv")).unwrap();
    assert_eq!((nodes[0].name.as_str(), nodes[0].gpu_count), ("n0", 2));
}

#[test]
fn empty_files_are_errors_and_header_only_files_are_empty_traces() {
    let nothing: &[u8] = b"";
    let file = Path::new("empty.csv");
    let empty_errors = [
        openb::read_nodes(nothing, file).map(|_| ()),
        openb::read_pods(nothing, file).map(|_| ()),
        pai::read_machines(nothing, file).map(|_| ()),
        pai::read_minibatch(nothing, file).map(|_| ()),
        pai::read_philly_runtimes(nothing, file).map(|_| ()),
        philly::read_jobs(nothing, file).map(|_| ()),
        genai::read_lora_requests(nothing, file).map(|_| ()),
        genai::read_qps(nothing, file).map(|_| ()),
        genai::read_pod_gpu_series(nothing, file).map(|_| ()),
    ];
    for result in empty_errors {
        assert!(
            matches!(result, Err(TraceError::Empty { .. })),
            "{result:?}"
        );
    }
    let (_dir, path) = temp_file("empty.csv", b"");
    let error = openb::load_pods(&path).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("{}: file is empty (no header line)", path.display())
    );

    assert!(
        openb::read_pods(format!("{POD_HEADER}\n").as_bytes(), file)
            .unwrap()
            .is_empty()
    );
    let jobs = philly::read_jobs(
        "timestamp,duration,num_gpus,gpu_time,cluster\n".as_bytes(),
        file,
    );
    assert!(jobs.unwrap().jobs.is_empty());
}

#[test]
fn missing_file_is_an_io_error_naming_the_path() {
    let error = philly::load_jobs("/nonexistent/philly_jobs.csv.gz").unwrap_err();
    assert!(matches!(error, TraceError::Io { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .starts_with("/nonexistent/philly_jobs.csv.gz: "),
        "{error}"
    );
}

const PHILLY_CSV: &str = "timestamp,duration,num_gpus,gpu_time,cluster\n\
    2017-10-09 07:01:55,66.0,1,66.0,11cb48\n\
    2017-10-09 06:13:03,2951.0,2,5902.0,6214e9\n\
    2017-09-29 07:58:32,860662.0,1,860662.0,11cb48\n\n";

#[test]
fn gzip_and_plain_files_load_the_same() {
    let (_plain_dir, plain) = temp_file("jobs.csv", PHILLY_CSV.as_bytes());
    let (_gzip_dir, gzipped) = temp_file("jobs.csv.gz", &gzip(PHILLY_CSV.as_bytes()));
    let from_plain = philly::load_jobs(&plain).unwrap();
    assert_eq!(from_plain, philly::load_jobs(&gzipped).unwrap());
    assert_eq!(from_plain.jobs.len(), 3);
    assert_eq!(from_plain.clusters, ["11cb48", "6214e9"]);
    assert_eq!(from_plain.jobs[2].cluster, 0);
}

#[test]
fn a_gzip_cut_short_is_reported_at_the_record_it_stopped() {
    let rows: String = (0..2_000)
        .map(|i| format!("2017-10-09 07:01:55,{i}.0,1,{i}.0,c{}\n", i % 97))
        .collect();
    let text = format!("timestamp,duration,num_gpus,gpu_time,cluster\n{rows}");
    let compressed = gzip(text.as_bytes());
    let cut = &compressed[..compressed.len() / 2];
    // What a gzip reader recovers before the stream ends: the rows it holds whole, then
    // the record the reader was inside.
    let mut recovered = Vec::new();
    let _ = std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(cut), &mut recovered);
    let whole_lines = recovered.iter().filter(|&&b| b == b'\n').count() as u64;
    assert!(whole_lines > 1, "the cut keeps some rows");

    let (_dir, path) = temp_file("jobs.csv.gz", cut);
    let error = philly::load_jobs(&path).unwrap_err();
    assert_eq!(error.line(), Some(whole_lines + 1), "{error}");
    assert!(
        error.to_string().starts_with(&format!(
            "{}:{}: read error: ",
            path.display(),
            whole_lines + 1
        )) && error.to_string().contains("truncated or damaged"),
        "{error}"
    );

    // Cut inside the header: nothing to locate, the file's read error.
    let (_dir, path) = temp_file("jobs.csv.gz", &compressed[..12]);
    let error = philly::load_jobs(&path).unwrap_err();
    assert!(
        matches!(&error, TraceError::Io { file, .. } if file == &path),
        "{error:?}"
    );
}

/// What spreadsheets and hand edits make of a trace — a byte-order mark, quoted names,
/// spaces after the commas, CRLF line ends — loads as the plain file does.
#[test]
fn exported_forms_of_a_trace_load_as_the_plain_file() {
    let plain = format!(
        "{POD_HEADER}\npod-a,6000,12288,1,460,T4|P100,LS,Running,10,250,12\n\
         pod-b,8000,30517,0,0,,BE,Pending,20,90,\n"
    );
    let quoted_header = POD_HEADER
        .split(',')
        .map(|name| format!("\"{name}\""))
        .collect::<Vec<_>>()
        .join(",");
    let exported = format!("\u{feff}{quoted_header}\n")
        + &plain
            .lines()
            .skip(1)
            .map(|row| row.replace(',', ", ") + " \r\n")
            .collect::<String>();
    let read = |text: &str| openb::read_pods(text.as_bytes(), Path::new("pods.csv"));
    let (from_plain, from_export) = (read(&plain).unwrap(), read(&exported).unwrap());
    assert_eq!(format!("{from_plain:?}"), format!("{from_export:?}"));
    assert_eq!(
        arbiter_traces::read_header_columns(exported.as_bytes(), Path::new("pods.csv")).unwrap(),
        POD_HEADER.split(',').collect::<Vec<_>>()
    );
}

#[test]
fn philly_rows_are_validated() {
    let file = Path::new("philly.csv");
    let header = "timestamp,duration,num_gpus,gpu_time,cluster";
    let cases = [
        (
            "2017-02-30 00:00:00,1.0,1,1.0,c",
            "timestamp",
            "2017-02-30 00:00:00",
        ),
        ("2017-10-09,1.0,1,1.0,c", "timestamp", "2017-10-09"),
        ("2017-10-09 07:01:55,NaN,1,1.0,c", "duration", "NaN"),
        ("2017-10-09 07:01:55,-3.0,1,1.0,c", "duration", "-3.0"),
        ("2017-10-09 07:01:55,1.0,0,1.0,c", "num_gpus", "0"),
        ("2017-10-09 07:01:55,1.0,1,inf,c", "gpu_time", "inf"),
        ("2017-10-09 07:01:55,1.0,1,1.0,", "cluster", ""),
    ];
    for (row, column, value) in cases {
        let contents = format!("{header}\n{row}\n");
        let error = philly::read_jobs(contents.as_bytes(), file).unwrap_err();
        assert_field_error(&error, file, 2, column, value);
    }
}

#[test]
fn pai_rows_are_validated() {
    let file = Path::new("pai.csv");
    let header = "machine,gpu_type,cap_cpu,cap_mem,cap_gpu";
    for (row, column, value) in [
        ("m,CPU,96,512,8", "cap_gpu", "8"),
        ("m,P100,96,512,0", "cap_gpu", "0"),
        ("m,K80,96,512,8", "gpu_type", "K80"),
        ("m,P100,96.5,512,2", "cap_cpu", "96.5"),
    ] {
        let contents = format!("{header}\n{row}\n");
        let error = pai::read_machines(contents.as_bytes(), file).unwrap_err();
        assert_field_error(&error, file, 2, column, value);
    }
    let minibatch = ",worker,gpu,time,batch_time_norm\n0,0,25,1,476\n1,1,250,1,509\n";
    let error = pai::read_minibatch(minibatch.as_bytes(), file).unwrap_err();
    assert_field_error(&error, file, 3, "gpu", "250");
}

#[test]
fn invalid_utf8_name_is_a_field_error() {
    let mut contents = format!("{NODE_HEADER}\n").into_bytes();
    contents.extend_from_slice(b"n\xff,1000,1024,2,T4\n");
    let file = Path::new("nodes.csv");
    let error = openb::read_nodes(contents.as_slice(), file).unwrap_err();
    assert_field_error(&error, file, 2, "sn", "n\u{fffd}");
}

/// A file that is one endless line (or one endless quoted field) ends in an error at the
/// record it is in, once the record passes `MAX_RECORD_BYTES`: the reader here never
/// ends, so without the bound this test would not.
#[test]
fn an_endless_record_is_refused_at_its_line() {
    use std::io::Read;
    let file = Path::new("nodes.csv");
    let endless =
        |prefix: &'static str, filler: u8| prefix.as_bytes().chain(std::io::repeat(filler));
    let too_long = format!(
        "a record longer than {} MiB",
        arbiter_traces::MAX_RECORD_BYTES >> 20
    );
    for (source, line) in [
        (endless("", b'x'), 1),
        (
            endless(
                "sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1024,2,T4\n",
                b'x',
            ),
            3,
        ),
        (endless("sn,cpu_milli,memory_mib,gpu,model\n\"", b'\n'), 2),
    ] {
        let error = openb::read_nodes(source, file).unwrap_err();
        assert_eq!(error.line(), Some(line), "{error}");
        assert!(error.to_string().contains(&too_long), "{error}");
    }
    // A record just under the bound is read, first after the header or after another.
    let name = "n".repeat(arbiter_traces::MAX_RECORD_BYTES as usize - 100);
    let long_header = format!("{NODE_HEADER},{}", "x".repeat(60_000));
    let long_row = format!("{name},1000,1024,2,T4,");
    for contents in [
        format!("{long_header}\n{long_row}\nn0,1000,1024,2,T4,\n"),
        format!("{long_header}\nn0,1000,1024,2,T4,\n{long_row}\n"),
    ] {
        let nodes = openb::read_nodes(contents.as_bytes(), file).unwrap();
        assert_eq!(nodes.len(), 2);
    }
}

#[test]
fn quoted_multiline_field_reports_the_record_start_line() {
    let contents = format!("{NODE_HEADER}\nn0,1000,1024,2,T4\n\"n\n1\",1000,x,2,T4\n");
    let file = Path::new("nodes.csv");
    let error = openb::read_nodes(contents.as_bytes(), file).unwrap_err();
    assert_field_error(&error, file, 3, "memory_mib", "x");
}

#[test]
fn genai_rows_are_validated() {
    let file = Path::new("lora.csv");
    let header = "gmt_create,predict_type,predict_status,exec_time_seconds,num_images_per_prompt,num_inference_steps,num_lora";
    for (row, column, value) in [
        (
            "2024-11-15 16:57:50,TXT_2_VIDEO,SUCCEED,1.0,1.0,30.0,0",
            "predict_type",
            "TXT_2_VIDEO",
        ),
        (
            "2024-11-15 16:57:50,TXT_2_IMG,DONE,1.0,1.0,30.0,0",
            "predict_status",
            "DONE",
        ),
        (
            "2024-11-15 16:57:50,TXT_2_IMG,SUCCEED,1.0,1.5,30.0,0",
            "num_images_per_prompt",
            "1.5",
        ),
        (
            "2024-11-15 16:57:50,TXT_2_IMG,SUCCEED,1.0,1e30,30.0,0",
            "num_images_per_prompt",
            "1e30",
        ),
    ] {
        let contents = format!("{header}\n{row}\n");
        let error = genai::read_lora_requests(contents.as_bytes(), file).unwrap_err();
        assert_field_error(&error, file, 2, column, value);
    }
    let qps = "timestamp_anon,value,container_ip,request_type\n1.5,0.1,,API Requests\n";
    let error = genai::read_qps(qps.as_bytes(), file).unwrap_err();
    assert_field_error(&error, file, 2, "timestamp_anon", "1.5");
    let series = "value,timestamp_anon,container_ip\n0.0,1662858720.0,\n";
    let error = genai::read_pod_gpu_series(series.as_bytes(), file).unwrap_err();
    assert_field_error(&error, file, 2, "container_ip", "");
}

fn request(created_at: i64, exec_time_secs: f64) -> LoraRequest {
    LoraRequest {
        created_at,
        predict_type: PredictType::TextToImage,
        status: PredictStatus::Succeeded,
        exec_time_secs,
        num_images: Some(1),
        num_inference_steps: Some(30),
        num_lora: 0,
    }
}

#[test]
fn demand_curve_splits_busy_time_across_buckets() {
    let ten = NonZeroU64::new(10).unwrap();
    // Buckets start at 100 (aligned); the first request covers 105..135.
    let requests = [request(105, 30.0), request(112, 2.0)];
    let curve = genai::demand_curve(&requests, ten, DemandMetric::Concurrency).unwrap();
    assert_eq!(curve.start, 100);
    assert_eq!(curve.values, [0.5, 1.2, 1.0, 0.5]);
    assert_eq!(curve.peak, 1.2);
    assert_eq!(curve.bucket_start(3), 130);
    let arrivals = genai::demand_curve(&requests, ten, DemandMetric::Arrivals).unwrap();
    assert_eq!(arrivals.values, [1.0, 1.0]);
    assert_eq!((arrivals.mean, arrivals.peak_to_mean()), (1.0, 1.0));
}

#[test]
fn demand_curve_edge_cases() {
    let one = NonZeroU64::new(1).unwrap();
    let empty = genai::demand_curve(&[], one, DemandMetric::Arrivals).unwrap();
    assert!(empty.values.is_empty() && empty.normalized().is_empty());
    assert_eq!(empty.peak_to_mean(), 0.0);
    let idle = genai::demand_curve(&[request(7, 0.0)], one, DemandMetric::Concurrency).unwrap();
    assert_eq!(idle.normalized(), [0.0]);
    let endless = [request(0, 1e300)];
    let error = genai::demand_curve(&endless, one, DemandMetric::Concurrency).unwrap_err();
    assert!(
        matches!(error, TraceError::DemandCurveTooLong { .. }),
        "{error:?}"
    );
    let far_apart = [request(i64::MIN, 0.0), request(i64::MAX, 0.0)];
    let error = genai::demand_curve(&far_apart, one, DemandMetric::Arrivals).unwrap_err();
    assert!(
        matches!(error, TraceError::DemandCurveTooLong { .. }),
        "{error:?}"
    );
}

#[test]
fn reference_results_name_known_variants_and_plausible_percentages() {
    let header = "trace,policy,seed,alloc_pct_at_100,alloc_pct_at_130\n";
    let good = format!("{header}gpushare40,FGD,42,91.5,93.25\n");
    let (_d, path) = temp_file("reference_alloc.csv", good.as_bytes());
    let rows = openb::load_reference_alloc(&path).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].variant, openb::PodListVariant::GpuShare40);
    assert_eq!((rows[0].seed, rows[0].alloc_pct_at_130), (42, 93.25));

    let unknown = format!("{header}default,FGD,42,91.5,93.2\ngpushare33,FGD,42,91.5,93.2\n");
    let (_d, path) = temp_file("reference_alloc.csv", unknown.as_bytes());
    let error = openb::load_reference_alloc(&path).unwrap_err();
    assert_field_error(&error, &path, 3, "trace", "gpushare33");

    let over = format!("{header}default,FGD,42,101.5,93.2\n");
    let (_d, path) = temp_file("reference_alloc.csv", over.as_bytes());
    let error = openb::load_reference_alloc(&path).unwrap_err();
    assert_field_error(&error, &path, 2, "alloc_pct_at_100", "101.5");

    let negative = format!("{header}default,FGD,-1,91.5,93.2\n");
    let (_d, path) = temp_file("reference_alloc.csv", negative.as_bytes());
    let error = openb::load_reference_alloc(&path).unwrap_err();
    assert_field_error(&error, &path, 2, "seed", "-1");
}
