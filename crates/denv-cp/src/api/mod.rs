//! api (placeholder)
