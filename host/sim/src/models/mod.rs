//! Workload models: each paper's world on the simulator core — its
//! arrivals, its ground truth (speed, loans, interference), its metrics —
//! configured by a struct that also reads from TOML. Paper comparisons
//! (cases, published constants, tables) are not here: they live in
//! `arbiter-repro`.
//!
//! * [`fgd`]: the FGD paper's static placement protocol;
//! * [`replay`]: time-based replay of a trace;
//! * [`aryl`]: Aryl's training and inference pools with capacity loaning.

pub mod aryl;
pub mod fgd;
pub mod replay;
