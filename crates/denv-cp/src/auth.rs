//! auth (placeholder)
