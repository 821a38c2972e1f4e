//! Shared helpers of the control plane's integration tests.
#![allow(dead_code)]

pub use denv_testkit::sidecar as fake_sidecar;
