//! gateway (placeholder)
