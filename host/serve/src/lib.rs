//! `arbiter serve`: the Arbiter control plane.
//!
//! * [`plane`]: jobs, tenants, policy slots, experiments and the cells that
//!   run rounds over the host core (`arbiter-host`).
//! * [`board`]: the read side the plane publishes and the API reads from,
//!   so that no read waits on a round; [`views`]: what it holds (plain data).
//! * [`records`] (jobs, tenants, experiments, slots; the write API's domain
//!   types), [`link`] (the node link's messages) and [`launch`] (from a
//!   placement to each node's launch): the plane's domain types.
//! * [`api`]: the gRPC services of `arbiter.v1` over the plane, with token
//!   authentication; [`convert`]: the one translation between their
//!   messages and the domain types (no protobuf below the API); [`server`]
//!   wires them with reflection and a Prometheus endpoint, and
//!   [`policies_dir`] loads a watched directory's policies through the plane.
//! * [`clock`]: the plane's clock (wall time, or a hand-driven one in tests).
//! * [`store`]: the embedded durable store (redb) with group commit.
//! * [`journal`] and [`replay`]: the append-only decision journal, bit-for-bit
//!   replay and counterfactual runs.
//! * [`shadow`] and [`stats`]: shadow execution and the per-arm statistics
//!   behind guardrails.

#![forbid(unsafe_code)]

pub mod api;
pub mod board;
pub mod clock;
pub mod convert;
pub mod files;
pub mod journal;
pub mod launch;
pub mod link;
pub mod metrics;
pub mod plane;
pub mod policies_dir;
pub mod records;
pub mod replay;
pub mod server;
pub mod shadow;
pub mod stats;
pub mod store;
pub mod tls;
pub mod views;
pub mod waiting;

pub use plane::{Caller, Plane, PlaneConfig};
pub use server::{ServeConfig, serve};
