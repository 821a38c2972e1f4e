//! state (placeholder)
