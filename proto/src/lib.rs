//! The gRPC contract of fanout. Generated code and its codec only; the rules live in the engine.

pub mod codec;
pub mod routing;

pub mod v1 {
    tonic::include_proto!("fanout.v1");
}

/// The encoded `FileDescriptorSet` of every fanout .proto, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("fanout_descriptor");
