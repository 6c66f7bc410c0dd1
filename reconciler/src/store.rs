//! SQLite state (being written).
