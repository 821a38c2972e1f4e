//! config (placeholder)
