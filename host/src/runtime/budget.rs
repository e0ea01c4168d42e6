//! Memory budgets: one per policy instance, over **all** its linear memories
//! and tables together (a component may define many memories; a cap per
//! memory would let fifteen 60 MiB memories through a 64 MiB cap), and
//! optionally one shared by every instance charged to the same account — a
//! tenant's slots, say — so a tenant cannot multiply its budget by loading
//! more generations.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What one table element costs the host (a function reference).
pub const TABLE_ELEMENT_BYTES: usize = 16;

/// A budget shared by several instances (e.g. every policy of one tenant).
/// Instances charge it as their memories and tables grow and give back what
/// they held when they are dropped.
#[derive(Debug)]
pub struct MemoryAccount {
    name: String,
    limit: usize,
    used: AtomicUsize,
}

impl MemoryAccount {
    pub fn new(name: impl Into<String>, limit: usize) -> Arc<MemoryAccount> {
        Arc::new(MemoryAccount {
            name: name.into(),
            limit,
            used: AtomicUsize::new(0),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes held now by the account's live instances.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn charge(&self, bytes: usize) -> Result<(), BudgetExceeded> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&u| u <= self.limit)
            })
            .map(|_| ())
            .map_err(|used| BudgetExceeded {
                shared: true,
                scope: format!("account `{}`", self.name),
                want: used.saturating_add(bytes),
                budget: self.limit,
            })
    }

    fn release(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// A memory or table growth the budget refused. It travels inside
/// wasmtime's error to the call site, where it becomes
/// [`PolicyFault::MemoryCap`](super::PolicyFault::MemoryCap).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error(
    "memory budget of {scope} exceeded: {want} bytes over all memories and tables, the budget is {budget}"
)]
pub struct BudgetExceeded {
    /// Whether it is a budget shared by several instances (an account),
    /// not the instance's own.
    pub shared: bool,
    pub scope: String,
    pub want: usize,
    pub budget: usize,
}

/// The store's `ResourceLimiter`: sums every memory and table of the
/// instance against its budget (and the shared account, if any).
pub(crate) struct SandboxLimiter {
    budget: usize,
    used: usize,
    account: Option<Arc<MemoryAccount>>,
}

impl SandboxLimiter {
    pub(crate) fn new(budget: usize, account: Option<Arc<MemoryAccount>>) -> SandboxLimiter {
        SandboxLimiter {
            budget,
            used: 0,
            account,
        }
    }

    /// Bytes the instance holds in memories and tables.
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    fn grow(&mut self, bytes: usize) -> Result<bool, wasmtime::Error> {
        let want = self.used.saturating_add(bytes);
        if want > self.budget {
            return Err(BudgetExceeded {
                shared: false,
                scope: "the instance".into(),
                want,
                budget: self.budget,
            }
            .into());
        }
        if let Some(account) = &self.account {
            account.charge(bytes)?;
        }
        self.used = want;
        Ok(true)
    }
}

impl Drop for SandboxLimiter {
    fn drop(&mut self) {
        if let Some(account) = &self.account {
            account.release(self.used);
        }
    }
}

impl wasmtime::ResourceLimiter for SandboxLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> Result<bool, wasmtime::Error> {
        self.grow(desired.saturating_sub(current))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> Result<bool, wasmtime::Error> {
        self.grow(
            desired
                .saturating_sub(current)
                .saturating_mul(TABLE_ELEMENT_BYTES),
        )
    }

    fn instances(&self) -> usize {
        64
    }

    fn tables(&self) -> usize {
        64
    }

    fn memories(&self) -> usize {
        16
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::ResourceLimiter;

    #[test]
    fn the_budget_covers_all_memories_together() {
        let mut limiter = SandboxLimiter::new(128 << 20, None);
        for _ in 0..3 {
            assert!(limiter.memory_growing(0, 30 << 20, None).unwrap());
        }
        let err = limiter.memory_growing(0, 40 << 20, None).unwrap_err();
        let exceeded = err.downcast_ref::<BudgetExceeded>().unwrap();
        assert_eq!(exceeded.want, 130 << 20);
        assert_eq!(limiter.used(), 90 << 20);
        // Growth counts only what is added; tables count too.
        assert!(limiter.memory_growing(30 << 20, 40 << 20, None).unwrap());
        assert!(limiter.table_growing(10, 1010, None).unwrap());
        assert_eq!(limiter.used(), (100 << 20) + 16_000);
    }

    #[test]
    fn an_account_is_shared_and_given_back_on_drop() {
        let account = MemoryAccount::new("tenant-a", 50 << 20);
        let mut a = SandboxLimiter::new(64 << 20, Some(account.clone()));
        let mut b = SandboxLimiter::new(64 << 20, Some(account.clone()));
        assert!(a.memory_growing(0, 30 << 20, None).unwrap());
        let err = b.memory_growing(0, 30 << 20, None).unwrap_err();
        assert!(err.to_string().contains("account `tenant-a`"), "{err}");
        assert_eq!(b.used(), 0);
        assert_eq!(account.used(), 30 << 20);
        drop(a);
        assert_eq!(account.used(), 0);
        assert!(b.memory_growing(0, 30 << 20, None).unwrap());
    }
}
