//! Generated code for the denv contract (`proto/denv/v1/`): prost messages, tonic
//! clients and servers, and serde impls whose JSON is exactly the REST API's shapes
//! (spec page `12-ref-rest-api.md`).
//!
//! [`contract`] holds the numbers every party must agree on (protocol versions, size
//! limits, default timeouts), each defined once.
//!
//! This crate depends on no other crate of the workspace: the conversions between the
//! compose `Spec` and the host-stream messages live in `denv_compose::wire` (feature
//! `wire`).

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    tonic::include_proto!("denv.v1");
    include!(concat!(env!("OUT_DIR"), "/denv.v1.serde.rs"));

    /// Encoded `FileDescriptorSet` of the contract (for reflection).
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/denv_descriptor.bin"));
}

pub mod contract;
pub mod json;
