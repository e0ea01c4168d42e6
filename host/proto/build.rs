//! Generates the gRPC code with the vendored `protoc` (none is installed on the
//! build machines) and writes the descriptor set that server reflection serves.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    // `prost::Name` for every message: the strict decoder finds its schema by name.
    config.enable_type_names();
    tonic_prost_build::configure()
        .codec_path("crate::codec::StrictCodec")
        .file_descriptor_set_path(out.join("arbiter_descriptor.bin"))
        .compile_with_config(config, &["proto/arbiter/v1/arbiter.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
