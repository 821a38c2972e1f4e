//! denv gRPC client.
