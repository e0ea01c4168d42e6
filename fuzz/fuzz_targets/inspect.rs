//! Static inspection of a `.wasm` file, the first host code a tenant's upload meets
//! (`PolicyEngine::compile` runs it before wasmtime sees a byte): on any bytes it
//! returns an inspection or an error and the compile limits a verdict, never a panic,
//! and nothing it reads recurses with the input (a stack overflow aborts the fuzzer as
//! it would the host). Seeded with a real component and small nesting cases
//! (`fuzz/seeds/inspect/`).
#![no_main]

use arbiter_host::runtime::{CompileLimits, inspect_component};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(inspection) = inspect_component(data) {
        assert_eq!(inspection.size_bytes, data.len());
        let _ = CompileLimits::default().check(inspection.size_bytes, &inspection.code);
    }
});
