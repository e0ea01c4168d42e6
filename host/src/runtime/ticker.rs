//! The engine's epoch ticker: the clock behind every guest call's deadline,
//! running only while a guest call is in flight.
//!
//! A call's deadline is a number of epoch ticks counted from the epoch at
//! which the call starts, so ticks matter only during calls. A ticker that
//! ran all the time would wake every tick whether or not a policy was
//! running: on a node agent (one short call per 100 ms period) that alone
//! was a third of the agent's CPU. This one parks while no call is in flight
//! and restarts its schedule from the moment one begins; a call then meets
//! its deadline after `deadline_ticks` whole ticks of its own.
//!
//! Invariant: `calls` counts the [`CallGuard`]s alive. The ticker waits on
//! `wake` only after reading `calls == 0` under `lock`, and a guard that
//! takes `calls` from 0 to 1 notifies under the same lock, so no call can
//! start unseen while the ticker goes to sleep.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};
use wasmtime::{Engine, EngineWeak};

/// Shared between the engine's handles and its ticker thread.
#[derive(Debug, Default)]
pub(crate) struct Ticker {
    calls: AtomicUsize,
    stop: AtomicBool,
    /// Epoch increments so far (what the engine's epoch moved by).
    ticks: AtomicU64,
    lock: Mutex<()>,
    wake: Condvar,
}

/// Keeps the ticker running while a guest call is in flight.
pub(crate) struct CallGuard(Arc<Ticker>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0.calls.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Ticker {
    /// Starts the ticker thread for `engine`, ticking every `tick` while calls run.
    pub(crate) fn start(engine: &Engine, tick: Duration) -> std::io::Result<Arc<Ticker>> {
        let ticker = Arc::new(Ticker::default());
        let shared = ticker.clone();
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("arbiter-epoch".into())
            .spawn(move || shared.run(&weak, tick))?;
        Ok(ticker)
    }

    /// Marks a guest call as in flight until the guard drops.
    pub(crate) fn call(self: &Arc<Self>) -> CallGuard {
        if self.calls.fetch_add(1, Ordering::AcqRel) == 0 {
            let _held = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.wake.notify_one();
        }
        CallGuard(self.clone())
    }

    /// Ends the ticker thread (when the engine is dropped).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _held = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.wake.notify_one();
    }

    /// How far the engine's epoch has moved (for tests).
    #[cfg(test)]
    fn ticks(&self) -> u64 {
        self.ticks.load(Ordering::Acquire)
    }

    fn increment(&self, engine: &Engine) {
        engine.increment_epoch();
        self.ticks.fetch_add(1, Ordering::AcqRel);
    }

    fn run(&self, engine: &EngineWeak, tick: Duration) {
        while !self.stop.load(Ordering::Acquire) {
            // Park while no call is in flight.
            {
                let mut held = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
                while self.calls.load(Ordering::Acquire) == 0 && !self.stop.load(Ordering::Acquire)
                {
                    held = self.wake.wait(held).unwrap_or_else(PoisonError::into_inner);
                }
            }
            // Tick against absolute times from the wake-up: sleeping `tick`
            // in a loop lets each oversleep add up, stretching deadlines by
            // ~1.5x on a busy host.
            let start = Instant::now();
            let mut ticks: u32 = 0;
            while self.calls.load(Ordering::Acquire) > 0 && !self.stop.load(Ordering::Acquire) {
                ticks = ticks.wrapping_add(1);
                let next = start + tick.saturating_mul(ticks);
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                let Some(engine) = engine.upgrade() else {
                    return;
                };
                // Catch up on ticks missed while descheduled.
                let now = Instant::now();
                self.increment(&engine);
                while ticks < u32::MAX && start + tick.saturating_mul(ticks + 1) <= now {
                    ticks += 1;
                    self.increment(&engine);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_only_while_a_call_is_in_flight() {
        // Polled with generous limits, never timed: on a loaded machine the ticker thread
        // can be off the CPU for longer than any of these waits.
        fn until(what: &str, mut done: impl FnMut() -> bool) {
            let give_up = std::time::Instant::now() + Duration::from_secs(20);
            while !done() {
                assert!(std::time::Instant::now() < give_up, "{what}");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let engine = Engine::default();
        let ticker = Ticker::start(&engine, Duration::from_millis(1)).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(ticker.ticks(), 0, "ticked with no call in flight");
        {
            let _call = ticker.call();
            until("no 10 ticks during a call at a 1 ms tick", || {
                ticker.ticks() >= 10
            });
        }
        // The ticker notices the end of the call and parks: the count stops moving (one
        // that kept ticking would never settle).
        let mut last = ticker.ticks();
        until("kept ticking after the call", || {
            std::thread::sleep(Duration::from_millis(50));
            let now = ticker.ticks();
            std::mem::replace(&mut last, now) == now
        });
        let settled = ticker.ticks();
        // A second call wakes it again.
        {
            let _call = ticker.call();
            until("no ticks after a second call", || {
                ticker.ticks() >= settled + 10
            });
        }
        ticker.stop();
    }
}
