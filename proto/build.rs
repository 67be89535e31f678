//! Compiles the .proto files with protox (pure Rust, no `protoc` needed) and
//! hands the descriptor set to tonic-prost-build.

use std::path::PathBuf;

use prost::Message;

const PROTOS: &[&str] = &["fanout/v1/notifications.proto", "fanout/v1/publish.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(PROTOS, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // The descriptor set is also served by gRPC reflection.
    std::fs::write(out.join("fanout_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // A message that does not decode answers INVALID_ARGUMENT.
        .codec_path("crate::codec::ProtobufCodec")
        .compile_fds(fds)?;
    Ok(())
}
