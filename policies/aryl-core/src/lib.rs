//! # Aryl core
//!
//! The algorithms of *Aryl: An Elastic Cluster Scheduler for Deep Learning*
//! (Li et al.) over plain data, and the glue that maps the SDK cluster mirror
//! onto them. Shared by the `aryl` policy and its reclaim baselines
//! (`aryl-random-reclaim`, `aryl-scf-reclaim`); this crate exports no
//! component itself.
//!
//! * [`jct`] — running time / JCT model of elastic jobs (Eq. 1, Tables 3–4),
//!   linear or sub-linear (§7.2) speed-up;
//! * [`knapsack`] — the multiple-choice knapsack DP (§5.2, `MaxValueDP`);
//! * [`alloc`] — Algorithm 2: SJF on inelastic demand, knapsack on flexible;
//! * [`reclaim`] — Algorithm 1 (server preemption cost), the Random and SCF
//!   baselines and an exhaustive optimum;
//! * [`schedule`] / [`policy`] — the scheduler and reclaim roles.

pub mod alloc;
pub mod config;
pub mod jct;
pub mod knapsack;
pub mod policy;
pub mod reclaim;
pub mod schedule;

pub use config::Config;
pub use policy::{Aryl, GreedyReclaim, RandomReclaim, ReclaimStrategy, ScfReclaim};
