//! orchestrator (placeholder)
