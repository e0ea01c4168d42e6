//! MuxFlow (Zhao et al., "MuxFlow: Efficient and Safe GPU Sharing in
//! Large-Scale Production Deep Learning Clusters", 2023): the cluster half,
//! as a library for the `muxflow` matcher (`policy-muxflow`).
//!
//! * [`km`] — Kuhn–Munkres maximum-weight bipartite matching, `O(|V|³)`, on a
//!   rectangular weight matrix with unmatched rows and columns allowed (§5,
//!   Alg. 1 l. 9–10, Fig. 9).
//! * [`dynamic_sm`](mod@dynamic_sm) — the offline SM percentage complementary to the online
//!   partner's SM activity, within bounds (§4.3, Fig. 8; Alg. 1 l. 5–6).
//! * [`predictor`] — the edge weight, the offline job's predicted normalised
//!   throughput (Alg. 1 l. 7). The paper's per-GPU-type MLP is unpublished;
//!   ours is a documented linear model with per-GPU-model weights, fitted by
//!   ridge least squares from profiled samples.
//!
//! Eq. 3 (the oversold GPU) is a metric, not a decision: the simulator's
//! `arbiter_sim::models::muxflow::oversold_gpu`.
//!
//! The node half (SysMonitor, xCUDA) is the `sysmonitor` coordinator.

pub mod dynamic_sm;
pub mod km;
pub mod predictor;

pub use dynamic_sm::{SmBounds, dynamic_sm};
pub use km::{Matching, WeightMatrix, max_weight_matching};
pub use predictor::{EdgeFeatures, LinearModel, Predictor, PredictorConfig, Profile};
