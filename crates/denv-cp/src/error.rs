//! error (placeholder)
