//! native module
