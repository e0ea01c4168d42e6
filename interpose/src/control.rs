//! The per-workload control block: the one definition of the shared-memory layout that the
//! node writes and the interposer reads.
//!
//! The block is a plain file (normally under `/dev/shm`) mapped `MAP_SHARED` by the node and
//! by every process of the workload. Every field is a naturally aligned 64-bit atomic, so both
//! sides read and write it with atomics only: no locks, no syscalls. Fields the node writes
//! and fields the interposer hammers (counters, the quota counter, the pacing clock) live on
//! separate cache lines so that counting launches does not slow down reading the limits.
//!
//! Versioning: [`MAGIC`] and [`LAYOUT_VERSION`] are checked when the interposer maps the block.
//! New fields may only be appended (into the reserved tail) with a version bump; a block with a
//! different version is treated as missing (fail-open or fail-closed, as configured).
//!
//! Units: bytes, nanoseconds of `CLOCK_MONOTONIC` (system-wide on Linux, so comparable between
//! the node and the workload), counts.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// `b"ARBITER1"` read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"ARBITER1");
/// Layout version; bump on any change to the fields below.
pub const LAYOUT_VERSION: u64 = 1;
/// Size of the mapped block in bytes (four cache lines).
pub const BLOCK_SIZE: usize = std::mem::size_of::<ControlBlock>();
/// `quota_bytes` value meaning "no memory limit".
pub const UNLIMITED: u64 = u64::MAX;

/// `flags` bit: the node froze the workload; launches wait until the bit clears.
pub const FLAG_FREEZE: u64 = 1 << 0;
/// `flags` bit: the node asks the workload to exit gracefully (same path as SIGTERM).
pub const FLAG_EXIT: u64 = 1 << 1;

/// Cache line 0: identity and the limits, written by the node, read on the hot path.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct Limits {
    /// [`MAGIC`].
    pub magic: AtomicU64,
    /// [`LAYOUT_VERSION`].
    pub version: AtomicU64,
    /// Memory quota in bytes for the whole workload ([`UNLIMITED`] for none).
    pub quota_bytes: AtomicU64,
    /// Minimum spacing between kernel launches in ns (0 = unthrottled). The node derives it from
    /// the compute share it wants: `interval = mean_kernel_ns / share`.
    pub pace_interval_ns: AtomicU64,
    /// Burst allowance of the pacer in ns (how far launches may run ahead of the schedule).
    pub pace_burst_ns: AtomicU64,
    /// Incremented by the node whenever it changes the pacing rate, so waiting launches
    /// re-plan with the new rate instead of finishing a wait computed with the old one.
    pub pace_epoch: AtomicU64,
    /// [`FLAG_FREEZE`] | [`FLAG_EXIT`].
    pub flags: AtomicU64,
    /// Control period of the node in ns (informational; a rate change applies within it).
    pub control_period_ns: AtomicU64,
}

/// Cache line 1: node liveness.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct Liveness {
    /// `CLOCK_MONOTONIC` ns of the node's last write; 0 disables the staleness check.
    pub heartbeat_ns: AtomicU64,
    /// The block is stale when `now - heartbeat_ns` exceeds this (0 = never stale).
    pub stale_after_ns: AtomicU64,
    /// Number of processes that attached to this block (interposer-written).
    pub attached: AtomicU64,
    _reserved: [AtomicU64; 5],
}

/// Cache line 2: state the interposer updates with CAS (quota and pacing clock).
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct Shared {
    /// Bytes currently reserved or allocated by the workload.
    pub used_bytes: AtomicU64,
    /// High-water mark of `used_bytes`.
    pub peak_used_bytes: AtomicU64,
    /// Pacer's theoretical arrival time (GCRA) in `CLOCK_MONOTONIC` ns, shared by every
    /// process of the workload so the rate is a per-workload budget.
    pub pace_tat_ns: AtomicU64,
    /// Last `pace_epoch` the pacer re-planned for (interposer-owned).
    pub pace_epoch_applied: AtomicU64,
    _reserved: [AtomicU64; 4],
}

/// Cache line 3: counters reported back to the node (interposer-written, relaxed).
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct Counters {
    /// Successful allocations (every allocator).
    pub allocations: AtomicU64,
    /// Successful frees / releases.
    pub frees: AtomicU64,
    /// Allocations refused because of the quota.
    pub quota_denials: AtomicU64,
    /// Total bytes ever allocated.
    pub bytes_allocated: AtomicU64,
    /// Kernel and graph launches admitted.
    pub launches: AtomicU64,
    /// Launches that had to wait for the pacer.
    pub throttled_launches: AtomicU64,
    /// Total time launches spent waiting in the pacer or frozen, in ns.
    pub pacing_delay_ns: AtomicU64,
    /// Total bytes ever freed.
    pub bytes_freed: AtomicU64,
}

/// The whole block (256 bytes).
#[repr(C)]
#[derive(Debug, Default)]
pub struct ControlBlock {
    pub limits: Limits,
    pub liveness: Liveness,
    pub shared: Shared,
    pub counters: Counters,
}

/// Initial values the node writes when it creates a block.
#[derive(Debug, Clone, Copy)]
pub struct BlockInit {
    pub quota_bytes: u64,
    pub pace_interval_ns: u64,
    pub pace_burst_ns: u64,
    pub control_period_ns: u64,
    pub stale_after_ns: u64,
}

impl Default for BlockInit {
    fn default() -> Self {
        BlockInit {
            quota_bytes: UNLIMITED,
            pace_interval_ns: 0,
            pace_burst_ns: 0,
            control_period_ns: 100_000_000,
            stale_after_ns: 0,
        }
    }
}

/// Why a mapped block was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockError {
    BadMagic,
    BadVersion(u64),
}

impl ControlBlock {
    /// Checks magic and version.
    pub fn validate(&self) -> Result<(), BlockError> {
        if self.limits.magic.load(Ordering::Acquire) != MAGIC {
            return Err(BlockError::BadMagic);
        }
        let v = self.limits.version.load(Ordering::Relaxed);
        if v != LAYOUT_VERSION {
            return Err(BlockError::BadVersion(v));
        }
        Ok(())
    }

    /// Writes every node-owned field and zeroes the rest; the magic is published last.
    pub fn initialize(&self, init: &BlockInit) {
        self.limits.magic.store(0, Ordering::Relaxed);
        self.limits.version.store(LAYOUT_VERSION, Ordering::Relaxed);
        self.limits
            .quota_bytes
            .store(init.quota_bytes, Ordering::Relaxed);
        self.limits
            .pace_interval_ns
            .store(init.pace_interval_ns, Ordering::Relaxed);
        self.limits
            .pace_burst_ns
            .store(init.pace_burst_ns, Ordering::Relaxed);
        self.limits.pace_epoch.store(0, Ordering::Relaxed);
        self.limits.flags.store(0, Ordering::Relaxed);
        self.limits
            .control_period_ns
            .store(init.control_period_ns, Ordering::Relaxed);
        self.liveness.heartbeat_ns.store(0, Ordering::Relaxed);
        self.liveness
            .stale_after_ns
            .store(init.stale_after_ns, Ordering::Relaxed);
        self.liveness.attached.store(0, Ordering::Relaxed);
        self.shared.used_bytes.store(0, Ordering::Relaxed);
        self.shared.peak_used_bytes.store(0, Ordering::Relaxed);
        self.shared.pace_tat_ns.store(0, Ordering::Relaxed);
        self.shared.pace_epoch_applied.store(0, Ordering::Relaxed);
        for c in [
            &self.counters.allocations,
            &self.counters.frees,
            &self.counters.quota_denials,
            &self.counters.bytes_allocated,
            &self.counters.launches,
            &self.counters.throttled_launches,
            &self.counters.pacing_delay_ns,
            &self.counters.bytes_freed,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        self.limits.magic.store(MAGIC, Ordering::Release);
    }

    /// Node side: change the pacing rate (applies to waiting launches within one pacer slice).
    pub fn set_pacing(&self, interval_ns: u64, burst_ns: u64) {
        self.limits.pace_burst_ns.store(burst_ns, Ordering::Relaxed);
        self.limits
            .pace_interval_ns
            .store(interval_ns, Ordering::Release);
        self.limits.pace_epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// Node side: pacing interval for a target compute share given the mean device time of one
    /// launch. `share` is clamped to (0, 1]; a share of 1 means unthrottled.
    pub fn interval_for_share(mean_kernel_ns: u64, share: f64) -> u64 {
        if share.is_nan() || share <= 0.0 || share >= 1.0 {
            return 0;
        }
        (mean_kernel_ns as f64 / share).round() as u64
    }

    /// Node side: set or clear flag bits.
    pub fn set_flag(&self, flag: u64, on: bool) {
        if on {
            self.limits.flags.fetch_or(flag, Ordering::AcqRel);
        } else {
            self.limits.flags.fetch_and(!flag, Ordering::AcqRel);
        }
    }

    /// Node side: record liveness now.
    pub fn heartbeat(&self) {
        self.liveness
            .heartbeat_ns
            .store(monotonic_ns(), Ordering::Release);
    }

    /// Whether the node's heartbeat is older than `stale_after_ns` at `now`.
    pub fn is_stale(&self, now: u64) -> bool {
        let hb = self.liveness.heartbeat_ns.load(Ordering::Acquire);
        let limit = self.liveness.stale_after_ns.load(Ordering::Relaxed);
        hb != 0 && limit != 0 && now.saturating_sub(hb) > limit
    }

    /// Reserves `bytes` against the quota with a CAS loop; never lets `used` exceed the quota.
    pub fn try_reserve(&self, bytes: u64) -> bool {
        let quota = self.limits.quota_bytes.load(Ordering::Relaxed);
        let used = &self.shared.used_bytes;
        let mut cur = used.load(Ordering::Relaxed);
        loop {
            let Some(next) = cur.checked_add(bytes) else {
                return false;
            };
            if next > quota {
                return false;
            }
            match used.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    self.shared
                        .peak_used_bytes
                        .fetch_max(next, Ordering::Relaxed);
                    return true;
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Charges `bytes` whatever the quota says: memory that is already allocated (made while
    /// enforcement was fail-open) must be counted, even if that puts the workload over its
    /// quota — its next allocations then fail until it frees enough.
    pub fn charge(&self, bytes: u64) {
        let next = self
            .shared
            .used_bytes
            .fetch_add(bytes, Ordering::AcqRel)
            .saturating_add(bytes);
        self.shared
            .peak_used_bytes
            .fetch_max(next, Ordering::Relaxed);
    }

    /// Returns previously reserved bytes (saturating, so a buggy caller cannot wrap it).
    pub fn release(&self, bytes: u64) {
        let _ = self
            .shared
            .used_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |c| {
                Some(c.saturating_sub(bytes))
            });
    }
}

/// `CLOCK_MONOTONIC` in ns (vDSO; no syscall on Linux x86-64/aarch64).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// A control block mapped from a file. Used by the interposer (read side) and by the node
/// (which creates and writes it).
#[derive(Debug)]
pub struct MappedBlock {
    ptr: *mut ControlBlock,
    _file: File,
}

// SAFETY: the mapping is only accessed through `&ControlBlock`, whose fields are all atomics.
unsafe impl Send for MappedBlock {}
// SAFETY: as above; shared access to atomics is thread-safe.
unsafe impl Sync for MappedBlock {}

impl MappedBlock {
    /// Node side: create (or truncate) the file, map it and initialise the block.
    pub fn create(path: &Path, init: &BlockInit) -> io::Result<MappedBlock> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        file.set_len(BLOCK_SIZE as u64)?;
        let block = Self::map(file)?;
        block.initialize(init);
        Ok(block)
    }

    /// Map an existing block and validate it.
    pub fn open(path: &Path) -> io::Result<MappedBlock> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        if file.metadata()?.len() < BLOCK_SIZE as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "control block too small",
            ));
        }
        let block = Self::map(file)?;
        block
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{e:?}")))?;
        Ok(block)
    }

    fn map(file: File) -> io::Result<MappedBlock> {
        use std::os::fd::AsRawFd;
        // SAFETY: mapping BLOCK_SIZE bytes of a file we hold open and that is at least that
        // long; the result is checked against MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BLOCK_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(MappedBlock {
            ptr: p.cast(),
            _file: file,
        })
    }

    /// Leak the mapping and return a `'static` reference (the interposer keeps its block for
    /// the life of the process).
    pub fn leak(self) -> &'static ControlBlock {
        let ptr = self.ptr;
        std::mem::forget(self);
        // SAFETY: the mapping is never unmapped after `forget`, page-aligned, BLOCK_SIZE long,
        // and ControlBlock consists of atomics only, valid for any bit pattern.
        unsafe { &*ptr }
    }
}

impl std::ops::Deref for MappedBlock {
    type Target = ControlBlock;
    fn deref(&self) -> &ControlBlock {
        // SAFETY: `ptr` points to a live BLOCK_SIZE mapping for as long as `self` lives;
        // every field is an atomic, valid for any bit pattern.
        unsafe { &*self.ptr }
    }
}

impl Drop for MappedBlock {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the region mapped in `map`; no reference outlives `self`
        // (leak() forgets self instead of dropping it).
        unsafe { libc::munmap(self.ptr.cast(), BLOCK_SIZE) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn layout_is_stable() {
        assert_eq!(BLOCK_SIZE, 256);
        assert_eq!(offset_of!(ControlBlock, limits), 0);
        assert_eq!(offset_of!(ControlBlock, liveness), 64);
        assert_eq!(offset_of!(ControlBlock, shared), 128);
        assert_eq!(offset_of!(ControlBlock, counters), 192);
        assert_eq!(offset_of!(Limits, quota_bytes), 16);
        assert_eq!(offset_of!(Limits, pace_interval_ns), 24);
        assert_eq!(offset_of!(Limits, flags), 48);
        assert_eq!(offset_of!(Counters, launches), 32);
    }

    #[test]
    fn reservation_never_overshoots_under_contention() {
        let b = ControlBlock::default();
        b.initialize(&BlockInit {
            quota_bytes: 1000 * 4096 + 17,
            ..Default::default()
        });
        let granted = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..16 {
                s.spawn(|| {
                    while b.try_reserve(4096) {
                        granted.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert_eq!(granted.load(Ordering::Relaxed), 1000);
        assert_eq!(b.shared.used_bytes.load(Ordering::Relaxed), 1000 * 4096);
        b.release(4096 * 2000);
        assert_eq!(b.shared.used_bytes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn staleness_and_share() {
        let b = ControlBlock::default();
        b.initialize(&BlockInit {
            stale_after_ns: 1_000,
            ..Default::default()
        });
        assert!(!b.is_stale(10_000), "heartbeat 0 disables the check");
        b.liveness.heartbeat_ns.store(5_000, Ordering::Relaxed);
        assert!(!b.is_stale(5_500));
        assert!(b.is_stale(7_000));
        assert_eq!(ControlBlock::interval_for_share(1_000, 0.25), 4_000);
        assert_eq!(ControlBlock::interval_for_share(1_000, 1.0), 0);
        assert_eq!(ControlBlock::interval_for_share(1_000, f64::NAN), 0);
    }

    #[test]
    fn file_roundtrip_and_validation() {
        let dir = std::env::temp_dir().join(format!("arbiter-ctl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let path = dir.join("block");
        let w = MappedBlock::create(
            &path,
            &BlockInit {
                quota_bytes: 42,
                ..Default::default()
            },
        )
        .expect("create");
        let r = MappedBlock::open(&path).expect("open");
        assert_eq!(r.limits.quota_bytes.load(Ordering::Relaxed), 42);
        w.set_pacing(7, 3);
        assert_eq!(r.limits.pace_interval_ns.load(Ordering::Relaxed), 7);
        assert_eq!(r.limits.pace_epoch.load(Ordering::Relaxed), 1);
        w.limits.version.store(99, Ordering::Relaxed);
        assert!(MappedBlock::open(&path).is_err());
        drop((w, r));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
