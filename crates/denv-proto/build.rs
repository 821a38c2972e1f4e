//! Compiles `proto/denv/v1/*.proto` with protox (a Rust-native protobuf compiler, so no
//! `protoc` is needed), then generates prost messages, tonic clients/servers, and the
//! pbjson serde impls (proto field names preserved, every field emitted).
use prost::Message;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = [
        root.join("denv/v1/api.proto"),
        root.join("denv/v1/host.proto"),
        root.join("denv/v1/relay.proto"),
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out.join("denv_descriptor.bin");
    std::fs::write(&descriptor_path, fds.encode_to_vec())?;

    tonic_build::configure()
        .file_descriptor_set_path(&descriptor_path)
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_fds(fds)?;

    let descriptors = std::fs::read(&descriptor_path)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        .preserve_proto_field_names()
        .emit_fields()
        .ignore_unknown_fields()
        .build(&[".denv"])?;
    Ok(())
}
