//! Shared helpers of the control plane's integration tests.
#![allow(dead_code)]

pub mod fake_sidecar;
