//! The [`Policy`] trait and the [`Runtime`] that drives one.
//!
//! `Runtime` is what runs inside a component (the export macro forwards every
//! WIT call to it) and what the host runs natively for its built-in fallback
//! policy: both paths keep the mirror with the same code.

use crate::cluster::{Cluster, MirrorError};
use crate::model::*;

/// A policy. Implement the roles you list in [`Policy::manifest`]; the others
/// keep their default, which answers `unsupported` (the host never calls a
/// role a manifest does not declare).
pub trait Policy: 'static {
    /// Name, version, roles and default configuration.
    fn manifest() -> Manifest;

    /// A fresh instance with its default configuration.
    fn create() -> Self
    where
        Self: Sized;

    /// Applies a configuration document (TOML), before any round. The default is a policy
    /// without options: it refuses a document that sets any ([`no_options`]), so a
    /// configuration meant for another policy is an error, not silently ignored.
    fn configure(&mut self, config: &str) -> Result<(), PolicyError> {
        no_options(config)
    }

    /// Role `scheduler`: the round's decisions.
    fn schedule(
        &mut self,
        cluster: &Cluster,
        round: &RoundInfo,
    ) -> Result<Vec<Decision>, PolicyError> {
        let _ = (cluster, round);
        Err(PolicyError::Unsupported(Role::Scheduler.as_str().into()))
    }

    /// Role `reclaim`: which servers to return and what to stop on them.
    fn reclaim(
        &mut self,
        cluster: &Cluster,
        request: &ReclaimRequest,
    ) -> Result<ReclaimPlan, PolicyError> {
        let _ = (cluster, request);
        Err(PolicyError::Unsupported(Role::Reclaim.as_str().into()))
    }

    /// Role `matcher`: online/offline pairs with SM shares.
    fn match_workloads(
        &mut self,
        cluster: &Cluster,
        request: &MatchRequest,
    ) -> Result<Vec<Pairing>, PolicyError> {
        let _ = (cluster, request);
        Err(PolicyError::Unsupported(Role::Matcher.as_str().into()))
    }

    /// Role `coordinator`: node-local actions for one control period.
    fn tick(&mut self, view: &NodeView) -> Result<Vec<NodeAction>, PolicyError> {
        let _ = view;
        Err(PolicyError::Unsupported(Role::Coordinator.as_str().into()))
    }

    /// Role `tenant`: order and hold a tenant's pending jobs.
    fn order(&mut self, view: &TenantView) -> Result<TenantVerdict, PolicyError> {
        let _ = view;
        Err(PolicyError::Unsupported(Role::Tenant.as_str().into()))
    }
}

/// A policy plus its mirror of the cluster.
pub struct Runtime<P> {
    cluster: Option<Cluster>,
    policy: P,
}

impl<P: Policy> Default for Runtime<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: Policy> Runtime<P> {
    pub fn new() -> Self {
        Runtime {
            cluster: None,
            policy: P::create(),
        }
    }

    pub fn manifest(&self) -> Manifest {
        P::manifest()
    }

    pub fn configure(&mut self, config: &str) -> Result<(), PolicyError> {
        self.policy.configure(config)
    }

    /// Replaces the mirror with a snapshot.
    pub fn resync(&mut self, snapshot: Snapshot) -> Result<(), PolicyError> {
        match Cluster::from_snapshot(snapshot) {
            Ok(cluster) => {
                self.cluster = Some(cluster);
                Ok(())
            }
            Err(e) => {
                self.cluster = None;
                Err(PolicyError::Failed(format!("bad snapshot: {e}")))
            }
        }
    }

    /// Applies a delta; a mirror at another epoch answers `stale`.
    pub fn apply(&mut self, delta: &Delta) -> Result<(), PolicyError> {
        self.apply_with(delta.base_epoch, |cluster| cluster.apply(delta))
    }

    /// Applies a delta that `update` writes into the mirror (the guest
    /// applies a 0.4 delta's columns without building per-job events);
    /// a mirror at another epoch than `base_epoch` answers `stale`.
    pub(crate) fn apply_with(
        &mut self,
        base_epoch: u64,
        update: impl FnOnce(&mut Cluster) -> Result<(), MirrorError>,
    ) -> Result<(), PolicyError> {
        let Some(cluster) = self.cluster.as_mut() else {
            return Err(PolicyError::Stale(0));
        };
        if cluster.epoch() != base_epoch {
            return Err(PolicyError::Stale(cluster.epoch()));
        }
        // An event that fails part-way leaves the mirror half-updated: drop
        // it, so the host's next call gets `stale` and resyncs.
        if let Err(e) = update(cluster) {
            self.cluster = None;
            return Err(PolicyError::Failed(format!("bad delta: {e}")));
        }
        Ok(())
    }

    pub fn schedule(&mut self, round: RoundInfo) -> Result<Vec<Decision>, PolicyError> {
        let cluster = mirror_at(&self.cluster, round.epoch)?;
        self.policy.schedule(cluster, &round)
    }

    pub fn reclaim(&mut self, request: ReclaimRequest) -> Result<ReclaimPlan, PolicyError> {
        let cluster = mirror_at(&self.cluster, request.epoch)?;
        self.policy.reclaim(cluster, &request)
    }

    pub fn match_workloads(&mut self, request: MatchRequest) -> Result<Vec<Pairing>, PolicyError> {
        let cluster = mirror_at(&self.cluster, request.epoch)?;
        self.policy.match_workloads(cluster, &request)
    }

    pub fn tick(&mut self, view: NodeView) -> Result<Vec<NodeAction>, PolicyError> {
        self.policy.tick(&view)
    }

    pub fn order(&mut self, view: TenantView) -> Result<TenantVerdict, PolicyError> {
        self.policy.order(&view)
    }

    /// The mirror, if synchronised.
    pub fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_ref()
    }
}

/// The mirror if it is at `epoch`; otherwise `stale` with the mirror's epoch.
fn mirror_at(cluster: &Option<Cluster>, epoch: u64) -> Result<&Cluster, PolicyError> {
    match cluster {
        Some(c) if c.epoch() == epoch => Ok(c),
        Some(c) => Err(PolicyError::Stale(c.epoch())),
        None => Err(PolicyError::Stale(0)),
    }
}

/// The configuration check of a policy that takes no options: a document of blank lines
/// and comments passes; the first line that sets anything is refused, quoted.
///
/// ```
/// use arbiter_policy_sdk::runtime::no_options;
/// assert!(no_options("").is_ok());
/// assert!(no_options("# fifo takes no options\n\n").is_ok());
/// let refused = no_options("# mine\nseed = 7\n").unwrap_err();
/// assert!(refused.to_string().contains("takes no configuration options; `seed = 7` sets one"));
/// ```
pub fn no_options(config: &str) -> Result<(), PolicyError> {
    /// Enough of a line to recognise it.
    const QUOTED_CHARS: usize = 80;
    match config
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'))
    {
        None => Ok(()),
        Some(line) => Err(PolicyError::Failed(format!(
            "this policy takes no configuration options; `{}` sets one",
            line.chars().take(QUOTED_CHARS).collect::<String>()
        ))),
    }
}
