//! hub (placeholder)
