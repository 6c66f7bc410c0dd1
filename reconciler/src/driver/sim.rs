//! Simulated nodes (being written).
