//! Workload processes (being written).
