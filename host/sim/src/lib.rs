//! Arbiter simulator.
