//! The plane's clock: wall time when serving, a hand-driven one in tests.
//!
//! Everything the plane decides by time reads this clock — job submit, start
//! and end times, simulated run times, a node agent's silence, retention by
//! age, the matcher's interval, experiment start and end — so a test can
//! move time on instead of sleeping through it. What measures the host's own
//! cost (round and journal latencies) and what paces the round loop stay on
//! the monotonic clock.
//!
//! ```
//! use arbiter_serve::clock::{Clock, ManualClock};
//! use std::time::Duration;
//!
//! let clock = ManualClock::new(1_000);
//! clock.advance(Duration::from_secs(7 * 24 * 3600));
//! assert_eq!(clock.now_ms(), 1_000 + 7 * 24 * 3600 * 1000);
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to.
#[derive(Debug)]
pub struct ManualClock {
    ms: AtomicU64,
}

impl ManualClock {
    /// A clock reading `start_ms` (milliseconds since the Unix epoch).
    pub fn new(start_ms: u64) -> ManualClock {
        ManualClock {
            ms: AtomicU64::new(start_ms),
        }
    }

    /// A clock that starts at the system's time now.
    pub fn starting_now() -> ManualClock {
        ManualClock::new(SystemClock.now_ms())
    }

    /// Moves the clock on by `by`.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.ms.fetch_add(by, Ordering::AcqRel);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.ms.load(Ordering::Acquire)
    }
}
