//! Every trace parser on arbitrary bytes: a row it cannot read is an error
//! naming the row, never a panic.
#![no_main]

use arbiter_traces::{genai, openb, pai, philly};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    let file = Path::new("fuzz.csv");
    if which % 11 == 10 {
        let _ = arbiter_traces::GpuModelSet::parse(&String::from_utf8_lossy(bytes));
        return;
    }
    let _ = match which % 10 {
        0 => openb::read_nodes(bytes, file).map(drop),
        1 => openb::read_pods(bytes, file).map(drop),
        2 => openb::read_reference_alloc(bytes, file).map(drop),
        3 => pai::read_machines(bytes, file).map(drop),
        4 => pai::read_minibatch(bytes, file).map(drop),
        5 => pai::read_philly_runtimes(bytes, file).map(drop),
        6 => philly::read_jobs(bytes, file).map(drop),
        7 => genai::read_lora_requests(bytes, file).map(drop),
        8 => genai::read_qps(bytes, file).map(drop),
        _ => genai::read_pod_gpu_series(bytes, file).map(drop),
    };
});
