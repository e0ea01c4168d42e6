//! Epochs and deltas: closing a round's epoch, the delta history a mirror catches up
//! from ([`DeltaFeed`] for other threads), sealing, snapshots.

use super::*;

/// The rounds' deltas since the last resync epoch, newest last, at most
/// [`DELTA_HISTORY`] of them.
#[derive(Debug, Default)]
pub(super) struct DeltaLog {
    /// The epoch after the newest delta (the state's epoch).
    epoch: u64,
    now_ms: u64,
    /// Mirrors older than this epoch cannot catch up by delta.
    resync_epoch: u64,
    deltas: VecDeque<Arc<Delta>>,
}

impl DeltaLog {
    fn push(&mut self, delta: Arc<Delta>) {
        if self.deltas.len() == DELTA_HISTORY {
            self.deltas.pop_front();
        }
        self.epoch = delta.epoch;
        self.now_ms = delta.now_ms;
        self.deltas.push_back(delta);
    }

    /// Forgets every delta: `epoch` is a resync epoch.
    pub(super) fn reset(&mut self, epoch: u64, now_ms: u64) {
        self.deltas.clear();
        self.epoch = epoch;
        self.now_ms = now_ms;
        self.resync_epoch = epoch;
    }

    /// The deltas from `epoch` to the newest, if the log reaches back to it.
    fn since(&self, epoch: u64) -> Option<impl Iterator<Item = &Arc<Delta>> + Clone> {
        if epoch < self.resync_epoch {
            return None;
        }
        let first = self.deltas.iter().position(|d| d.base_epoch == epoch)?;
        Some(self.deltas.iter().skip(first))
    }
}

/// Concatenates consecutive deltas into one from `base_epoch` to `epoch`.
fn merge<'a>(
    base_epoch: u64,
    epoch: u64,
    now_ms: u64,
    parts: impl Iterator<Item = &'a Arc<Delta>> + Clone,
) -> Delta {
    let mut events = Vec::with_capacity(parts.clone().map(|d| d.events.len()).sum());
    for d in parts {
        events.extend(d.events.iter().cloned());
    }
    Delta {
        base_epoch,
        epoch,
        now_ms,
        events,
    }
}

/// A read-only handle on a [`ClusterState`]'s recent deltas that another
/// thread can hold ([`ClusterState::delta_feed`]): what a policy generation
/// loaded off the round loop needs to follow the state up to the round
/// before its activation.
#[derive(Clone, Debug)]
pub struct DeltaFeed {
    /// The [`ClusterState::lineage`] of the state it reads.
    lineage: u64,
    log: Arc<RwLock<DeltaLog>>,
}

impl DeltaFeed {
    /// The [`ClusterState::lineage`] of the state whose deltas these are.
    pub fn lineage(&self) -> u64 {
        self.lineage
    }

    /// The state's epoch as of its last round (or seal, or compaction).
    pub fn epoch(&self) -> u64 {
        self.log.read().epoch
    }

    /// The last resync epoch: a mirror older than it needs a snapshot.
    pub fn resync_epoch(&self) -> u64 {
        self.log.read().resync_epoch
    }

    /// One delta from `epoch` to the feed's epoch, like
    /// [`ClusterState::delta_since`]; `None` if the history no longer
    /// reaches back to `epoch` (or `epoch` is ahead of it). The lock is held
    /// only to copy a few pointers, never while events are cloned, so the
    /// round loop is not held up.
    pub fn delta_since(&self, epoch: u64) -> Option<Delta> {
        let (parts, current, now_ms) = {
            let log = self.log.read();
            if epoch == log.epoch {
                return Some(Delta {
                    base_epoch: epoch,
                    epoch,
                    now_ms: log.now_ms,
                    events: Vec::new(),
                });
            }
            let parts: Vec<Arc<Delta>> = log.since(epoch)?.cloned().collect();
            (parts, log.epoch, log.now_ms)
        };
        Some(merge(epoch, current, now_ms, parts.iter()))
    }
}

impl ClusterState {
    /// Closes the current epoch: returns the delta since the last round and the round's info.
    ///
    /// When the string table is due for compaction
    /// ([`ClusterState::compaction_due`]), the round first opens a resync
    /// epoch of its own ([`ClusterState::compact_strings`]), so the round's
    /// epoch is two past the last one and its delta starts at the resync
    /// epoch (a mirror from before it resyncs).
    /// The delta is the one the history keeps (shared, not copied: at ten
    /// times PAI's scale a round's delta holds tens of thousands of events).
    pub fn begin_round(&mut self, max_decisions: u32) -> (Arc<Delta>, RoundInfo) {
        if self.compaction_due()
            && let Err(e) = self.compact_strings()
        {
            // Unreachable for a consistent state; never fail a round for it.
            tracing::error!(error = %e, "string compaction failed; automatic compaction is off");
            self.compaction_floor = None;
        }
        let base_epoch = self.cluster.epoch();
        let epoch = base_epoch + 1;
        self.strings_event = None;
        let delta = Arc::new(Delta {
            base_epoch,
            epoch,
            now_ms: self.now_ms,
            events: std::mem::take(&mut self.events),
        });
        self.cluster.set_epoch(epoch, self.now_ms);
        self.history.write().push(delta.clone());
        (
            delta,
            RoundInfo {
                epoch,
                now_ms: self.now_ms,
                max_decisions,
            },
        )
    }

    /// One delta that takes a mirror at `epoch` to the current epoch, if the
    /// history still reaches back that far (else the mirror must resync).
    pub fn delta_since(&self, epoch: u64) -> Option<Delta> {
        let current = self.cluster.epoch();
        if epoch < self.resync_epoch {
            return None;
        }
        if epoch == current {
            return Some(Delta {
                base_epoch: epoch,
                epoch,
                now_ms: self.now_ms,
                events: Vec::new(),
            });
        }
        let log = self.history.read();
        let parts = log.since(epoch)?;
        Some(merge(epoch, current, self.now_ms, parts))
    }

    /// A handle on this state's delta history that other threads can read:
    /// a policy generation loaded off the round loop catches up with it
    /// before it is activated, so its first round applies one round's delta
    /// instead of every delta since its snapshot.
    pub fn delta_feed(&self) -> DeltaFeed {
        DeltaFeed {
            lineage: self.lineage,
            log: self.history.clone(),
        }
    }

    /// Whether events are waiting for the next round.
    pub fn has_pending_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Closes the current epoch if changes are pending (without a round), so
    /// that a snapshot and the deltas after it line up exactly.
    pub fn seal(&mut self) {
        if !self.events.is_empty() {
            self.begin_round(0);
        }
    }

    /// This state's identity, unique in the process. Epochs and deltas only
    /// mean something within one state's history: a policy instance asked
    /// about several states (the control plane's `matcher` and `reclaim`
    /// slots answer for every cell) resyncs when the state changes, even at
    /// an epoch its mirror has ([`crate::runtime::PolicyInstance::sync_to`]).
    pub fn lineage(&self) -> u64 {
        self.lineage
    }

    /// The full state, exact at the epoch it is labelled with (pending
    /// changes are sealed into a new epoch first; a snapshot labelled with
    /// the old epoch would make a mirror apply them twice).
    pub fn snapshot(&mut self) -> Snapshot {
        self.seal();
        self.cluster.to_snapshot()
    }

    /// The full state at `epoch()` without sealing: `None` while changes are
    /// pending. Within a round (after `begin_round`) it is always `Some`.
    pub fn snapshot_at_epoch(&self) -> Option<Snapshot> {
        self.events.is_empty().then(|| self.cluster.to_snapshot())
    }

    /// The epoch the last compaction opened (0 = none). A mirror at an older
    /// epoch cannot be caught up by a delta; it resyncs.
    pub fn resync_epoch(&self) -> u64 {
        self.resync_epoch
    }
}
