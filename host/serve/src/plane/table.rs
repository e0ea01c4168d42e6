//! The job table: every job the plane holds, by id, and which changed since
//! they were last published on the [`Board`](crate::board::Board).
//!
//! Records are shared with the board (`Arc`): publishing a change copies a
//! reference, and the plane's next change to a published record copies the
//! record first (`Arc::make_mut`), so readers never see a half-made change.

use crate::records::StoredJob;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

#[derive(Default)]
pub(super) struct JobTable {
    jobs: BTreeMap<u64, Arc<StoredJob>>,
    /// Ids inserted, changed or removed since the last [`JobTable::take_changes`].
    changed: BTreeSet<u64>,
}

impl JobTable {
    pub(super) fn get(&self, id: &u64) -> Option<&StoredJob> {
        self.jobs.get(id).map(Arc::as_ref)
    }

    /// The record to change in place; marks it changed.
    pub(super) fn get_mut(&mut self, id: &u64) -> Option<&mut StoredJob> {
        let job = self.jobs.get_mut(id)?;
        self.changed.insert(*id);
        Some(Arc::make_mut(job))
    }

    pub(super) fn insert(&mut self, id: u64, job: StoredJob) {
        self.changed.insert(id);
        self.jobs.insert(id, Arc::new(job));
    }

    pub(super) fn remove(&mut self, id: &u64) -> Option<StoredJob> {
        let job = self.jobs.remove(id)?;
        self.changed.insert(*id);
        Some(Arc::unwrap_or_clone(job))
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &StoredJob> + '_ {
        self.jobs.values().map(Arc::as_ref)
    }

    /// What changed since the last call: `Ok` each record as it is now,
    /// `Err(id)` each one removed.
    pub(super) fn take_changes(&mut self) -> Vec<Result<Arc<StoredJob>, u64>> {
        std::mem::take(&mut self.changed)
            .into_iter()
            .map(|id| self.jobs.get(&id).map(Arc::clone).ok_or(id))
            .collect()
    }

    /// Marks job `id` changed without changing its record (what is
    /// published with it, its progress, did).
    pub(super) fn touch(&mut self, id: u64) {
        if self.jobs.contains_key(&id) {
            self.changed.insert(id);
        }
    }
}
