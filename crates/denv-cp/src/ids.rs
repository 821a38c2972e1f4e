//! ids (placeholder)
