//! The Arbiter control-plane API (`arbiter.v1`), generated from
//! `proto/arbiter/v1/arbiter.proto`.
//!
//! Clients and servers both use this crate; the descriptor set is what the
//! server's reflection service publishes so generic tools (`grpcurl`) work.

#![allow(clippy::large_enum_variant, clippy::doc_lazy_continuation)]

pub mod codec;
pub mod endpoint;

pub mod v1 {
    tonic::include_proto!("arbiter.v1");
}

/// The encoded `FileDescriptorSet` of the API, for `tonic-reflection`.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("arbiter_descriptor");
