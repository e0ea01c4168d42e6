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
/// Layout version; bump on any change to the fields below. Version 2 appended per-device
/// usage and per-process slots (and `Liveness::device_count`); the offsets of version 1's
/// fields did not move.
pub const LAYOUT_VERSION: u64 = 2;
/// Size of the mapped block in bytes.
pub const BLOCK_SIZE: usize = std::mem::size_of::<ControlBlock>();
/// Devices a block accounts separately (device ordinals as the workload sees them, i.e. after
/// `CUDA_VISIBLE_DEVICES`). Allocations on a higher ordinal are charged to the last one.
pub const MAX_DEVICES: usize = 16;
/// Processes of one workload that get a slot of their own; further processes are still
/// enforced, but what they hold cannot be reclaimed if they are killed.
pub const MAX_PROCESSES: usize = 64;
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

/// Cache line 1: node liveness, and the workload's device count.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct Liveness {
    /// `CLOCK_MONOTONIC` ns of the node's last write; 0 disables the staleness check.
    pub heartbeat_ns: AtomicU64,
    /// The block is stale when `now - heartbeat_ns` exceeds this (0 = never stale).
    pub stale_after_ns: AtomicU64,
    /// Number of processes that attached to this block (interposer-written).
    pub attached: AtomicU64,
    /// GPUs the workload was given (node-written). 0 or 1: every allocation is charged to
    /// device 0 without asking the driver which device is current (the single-GPU hot path).
    pub device_count: AtomicU64,
    /// Interposer-written: CUDA runtimes a process of the workload asked `dlopen` to load
    /// with `RTLD_DEEPBIND` (counted before the load, so a load that fails counts too). Such a runtime resolves `dlsym` inside its own scope, around the
    /// interposer: what it allocates and launches is not enforced. The node reports it.
    pub unenforced_loads: AtomicU64,
    /// Node-written: bytes the workload may hold in host-backed memory beyond its quota (host
    /// spill, AntMan's "universal memory" done by the interposer; 0 = none). An allocation the
    /// quota refuses is then served from managed memory kept on the host (`quota`'s spill
    /// path). In layout 2's reserved space: a block written by an older node reads 0.
    pub spill_limit_bytes: AtomicU64,
    _reserved: [AtomicU64; 2],
}

/// Cache line 2: state the interposer updates with CAS (quota and pacing clock).
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct Shared {
    /// Bytes currently reserved or allocated by the workload, on all its devices together.
    pub used_bytes: AtomicU64,
    /// High-water mark of `used_bytes`.
    pub peak_used_bytes: AtomicU64,
    /// Pacer's theoretical arrival time (GCRA) in `CLOCK_MONOTONIC` ns, shared by every
    /// process of the workload so the rate is a per-workload budget.
    pub pace_tat_ns: AtomicU64,
    /// Last `pace_epoch` the pacer re-planned for (interposer-owned).
    pub pace_epoch_applied: AtomicU64,
    /// Training iterations the workload reported finished (`arbiter_iteration()`, exported
    /// by the interposer for the workload or a framework hook to call). In layout 2's
    /// reserved space: a block written by an older interposer reads 0.
    pub iterations: AtomicU64,
    /// `CLOCK_MONOTONIC` ns of the last reported iteration.
    pub last_iteration_ns: AtomicU64,
    /// Bytes the workload holds in host-backed (spilled) memory, reserved with a CAS against
    /// [`Liveness::spill_limit_bytes`]. Not part of `used_bytes`: spilled memory does not
    /// occupy the GPU. In layout 2's reserved space.
    pub spilled_bytes: AtomicU64,
    _reserved: [AtomicU64; 1],
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

/// One device's usage (one cache line each: devices are charged from different threads).
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct DeviceUsage {
    /// Bytes reserved or allocated on this device through the allocators we wrap.
    pub used_bytes: AtomicU64,
    /// High-water mark of `used_bytes`.
    pub peak_used_bytes: AtomicU64,
    /// Node-written: memory the workload holds on this device that no wrapped allocator
    /// charged — CUDA context and module memory, graph memory nodes, pools keeping freed
    /// memory — i.e. NVML's per-process usage of its processes minus `used_bytes`. A
    /// reservation counts it against the quota: `used + unseen + new ≤ quota`.
    pub unseen_bytes: AtomicU64,
    _reserved: [AtomicU64; 5],
}

/// What one process of the workload holds, so that the node can give back what a process
/// killed without running its exit handlers (SIGKILL, OOM killer) still had charged.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct ProcessSlot {
    /// The process's pid (0 = free slot). Claimed with a CAS from 0 by the process itself.
    pub pid: AtomicU64,
    /// Its start time in clock ticks since boot (`/proc/<pid>/stat` field 22), so a reused
    /// pid is not mistaken for the process that claimed the slot.
    pub start_ticks: AtomicU64,
    /// Bytes it holds per device.
    pub held: [AtomicU64; MAX_DEVICES],
    /// Spilled bytes it holds (in the slot's alignment padding of layout 2, so the slot's
    /// size did not change; an older interposer leaves it 0).
    pub spilled: AtomicU64,
}

/// The whole block: version 1's four cache lines, then per-device usage and process slots.
#[repr(C)]
#[derive(Debug)]
pub struct ControlBlock {
    pub limits: Limits,
    pub liveness: Liveness,
    pub shared: Shared,
    pub counters: Counters,
    pub devices: [DeviceUsage; MAX_DEVICES],
    pub processes: [ProcessSlot; MAX_PROCESSES],
}

impl Default for ControlBlock {
    fn default() -> Self {
        ControlBlock {
            limits: Limits::default(),
            liveness: Liveness::default(),
            shared: Shared::default(),
            counters: Counters::default(),
            devices: Default::default(),
            processes: std::array::from_fn(|_| ProcessSlot::default()),
        }
    }
}

/// Initial values the node writes when it creates a block.
#[derive(Debug, Clone, Copy)]
pub struct BlockInit {
    /// Memory quota per device.
    pub quota_bytes: u64,
    pub pace_interval_ns: u64,
    pub pace_burst_ns: u64,
    pub control_period_ns: u64,
    pub stale_after_ns: u64,
    /// GPUs the workload was given (see [`Liveness::device_count`]).
    pub device_count: u64,
    /// Host spill allowance (see [`Liveness::spill_limit_bytes`]; 0 = none).
    pub spill_limit_bytes: u64,
}

impl Default for BlockInit {
    fn default() -> Self {
        BlockInit {
            quota_bytes: UNLIMITED,
            pace_interval_ns: 0,
            pace_burst_ns: 0,
            control_period_ns: 100_000_000,
            stale_after_ns: 0,
            device_count: 1,
            spill_limit_bytes: 0,
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
        self.liveness
            .device_count
            .store(init.device_count, Ordering::Relaxed);
        self.liveness.unenforced_loads.store(0, Ordering::Relaxed);
        self.liveness
            .spill_limit_bytes
            .store(init.spill_limit_bytes, Ordering::Relaxed);
        for d in &self.devices {
            d.used_bytes.store(0, Ordering::Relaxed);
            d.peak_used_bytes.store(0, Ordering::Relaxed);
            d.unseen_bytes.store(0, Ordering::Relaxed);
        }
        for p in &self.processes {
            p.pid.store(0, Ordering::Relaxed);
            p.start_ticks.store(0, Ordering::Relaxed);
            for h in &p.held {
                h.store(0, Ordering::Relaxed);
            }
            p.spilled.store(0, Ordering::Relaxed);
        }
        self.shared.used_bytes.store(0, Ordering::Relaxed);
        self.shared.peak_used_bytes.store(0, Ordering::Relaxed);
        self.shared.pace_tat_ns.store(0, Ordering::Relaxed);
        self.shared.pace_epoch_applied.store(0, Ordering::Relaxed);
        self.shared.iterations.store(0, Ordering::Relaxed);
        self.shared.last_iteration_ns.store(0, Ordering::Relaxed);
        self.shared.spilled_bytes.store(0, Ordering::Relaxed);
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

    /// Workload side: one more training iteration finished at `now_ns`; returns the count.
    pub fn record_iteration(&self, now_ns: u64) -> u64 {
        // The time first: a reader that sees the new count sees a time at least this new.
        self.shared
            .last_iteration_ns
            .fetch_max(now_ns, Ordering::AcqRel);
        self.shared.iterations.fetch_add(1, Ordering::AcqRel) + 1
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

    /// The usage of device ordinal `device` (ordinals past [`MAX_DEVICES`] share the last).
    pub fn device(&self, device: usize) -> &DeviceUsage {
        &self.devices[device.min(MAX_DEVICES - 1)]
    }

    /// Reserves `bytes` on `device` against the per-device quota with a CAS loop; never lets
    /// the device's usage exceed the quota.
    pub fn try_reserve(&self, device: usize, bytes: u64) -> bool {
        let d = self.device(device);
        let quota = self
            .limits
            .quota_bytes
            .load(Ordering::Relaxed)
            .saturating_sub(d.unseen_bytes.load(Ordering::Relaxed));
        let mut cur = d.used_bytes.load(Ordering::Relaxed);
        loop {
            let Some(next) = cur.checked_add(bytes) else {
                return false;
            };
            if next > quota {
                return false;
            }
            match d
                .used_bytes
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    d.peak_used_bytes.fetch_max(next, Ordering::Relaxed);
                    self.add_total(bytes);
                    return true;
                }
                Err(actual) => cur = actual,
            }
        }
    }

    fn add_total(&self, bytes: u64) {
        let total = self
            .shared
            .used_bytes
            .fetch_add(bytes, Ordering::AcqRel)
            .saturating_add(bytes);
        self.shared
            .peak_used_bytes
            .fetch_max(total, Ordering::Relaxed);
    }

    /// Charges `bytes` on `device` whatever the quota says: memory that is already allocated
    /// (made while enforcement was fail-open) must be counted, even if that puts the workload
    /// over its quota — its next allocations then fail until it frees enough.
    pub fn charge(&self, device: usize, bytes: u64) {
        let d = self.device(device);
        let next = d
            .used_bytes
            .fetch_add(bytes, Ordering::AcqRel)
            .saturating_add(bytes);
        d.peak_used_bytes.fetch_max(next, Ordering::Relaxed);
        self.add_total(bytes);
    }

    /// Returns previously reserved bytes of `device` (saturating, so a buggy caller cannot
    /// wrap the counters).
    pub fn release(&self, device: usize, bytes: u64) {
        let sub = |c: u64| Some(c.saturating_sub(bytes));
        let _ =
            self.device(device)
                .used_bytes
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, sub);
        let _ = self
            .shared
            .used_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, sub);
    }

    /// Reserves `bytes` of host spill against [`Liveness::spill_limit_bytes`] (CAS, never
    /// overshooting). False when spill is off or the allowance is used up.
    pub fn try_spill(&self, bytes: u64) -> bool {
        let limit = self.liveness.spill_limit_bytes.load(Ordering::Relaxed);
        self.shared
            .spilled_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |cur| {
                cur.checked_add(bytes).filter(|next| *next <= limit)
            })
            .is_ok()
    }

    /// Returns spilled bytes (saturating).
    pub fn unspill(&self, bytes: u64) {
        let _ = self
            .shared
            .spilled_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |c| {
                Some(c.saturating_sub(bytes))
            });
    }

    /// Bytes the workload holds beyond its quota on the device where it is furthest over
    /// (charged + unseen − quota; 0 when within it). The node lowers the quota below what a
    /// workload holds to ask it to give memory back: the interposer cannot take memory away,
    /// but a framework can empty its allocator's cache at an iteration boundary when this is
    /// non-zero (`arbiter_release_requested()`, AntMan's shrink path).
    pub fn release_requested(&self) -> u64 {
        let quota = self.limits.quota_bytes.load(Ordering::Relaxed);
        self.devices
            .iter()
            .map(|d| {
                d.used_bytes
                    .load(Ordering::Relaxed)
                    .saturating_add(d.unseen_bytes.load(Ordering::Relaxed))
                    .saturating_sub(quota)
            })
            .max()
            .unwrap_or(0)
    }

    /// Node side: reconcile `device` with what NVML says the workload's processes use there
    /// (`nvml_bytes`); the part no wrapped allocator charged becomes `unseen_bytes`, which
    /// later reservations count against the quota. `charged_before` is the device's charge read
    /// before NVML was sampled: the larger of it and the charge now is taken, so a free landing
    /// between the sample and this call is not mistaken for unseen memory for a whole period
    /// (an allocation landing there makes the unseen part smaller for one period instead).
    /// Returns the unseen bytes.
    pub fn reconcile(&self, device: usize, nvml_bytes: u64, charged_before: u64) -> u64 {
        let d = self.device(device);
        let charged = charged_before.max(d.used_bytes.load(Ordering::Relaxed));
        let unseen = nvml_bytes.saturating_sub(charged);
        d.unseen_bytes.store(unseen, Ordering::Release);
        unseen
    }

    /// Claims a free process slot for `pid`; `None` when all are taken.
    pub fn claim_process_slot(&self, pid: u64, start_ticks: u64) -> Option<usize> {
        let i = self.processes.iter().position(|p| {
            p.pid
                .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })?;
        let slot = &self.processes[i];
        for h in &slot.held {
            h.store(0, Ordering::Relaxed);
        }
        slot.spilled.store(0, Ordering::Relaxed);
        slot.start_ticks.store(start_ticks, Ordering::Release);
        Some(i)
    }

    /// Node side: gives back what every slot whose process is gone still holds, and frees the
    /// slot. `alive(pid, start_ticks)` says whether that process still exists (the node's
    /// `procfs` answers it: a zombie has already lost its GPU memory; a start time of 0 means
    /// "not recorded yet"). Returns the
    /// bytes given back.
    pub fn reclaim_dead_processes(&self, mut alive: impl FnMut(u64, u64) -> bool) -> u64 {
        let mut reclaimed = 0u64;
        for slot in &self.processes {
            let pid = slot.pid.load(Ordering::Acquire);
            if pid == 0 || alive(pid, slot.start_ticks.load(Ordering::Acquire)) {
                continue;
            }
            for (device, held) in slot.held.iter().enumerate() {
                let bytes = held.swap(0, Ordering::AcqRel);
                if bytes > 0 {
                    self.release(device, bytes);
                    reclaimed = reclaimed.saturating_add(bytes);
                }
            }
            // Host memory goes with the process; only the allowance is given back.
            self.unspill(slot.spilled.swap(0, Ordering::AcqRel));
            slot.start_ticks.store(0, Ordering::Relaxed);
            slot.pid.store(0, Ordering::Release);
        }
        reclaimed
    }
}

/// Start time of process `pid` in clock ticks since boot (`/proc/<pid>/stat` field 22), or
/// `None` if there is no such process.
pub fn process_start_ticks(pid: u64) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is parenthesised and may itself contain spaces or ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
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
    /// Node side: create the file, map it and initialise the block. A file already at
    /// `path` is unlinked, never truncated: a process that still maps it (a workload the
    /// agent lost track of) keeps its pages — truncating them would kill it with SIGBUS
    /// at its next access — and the new block is a fresh file nobody else maps.
    pub fn create(path: &Path, init: &BlockInit) -> io::Result<MappedBlock> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
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
        // Version 1's fields kept their offsets; version 2 appended after them.
        assert_eq!(offset_of!(ControlBlock, limits), 0);
        assert_eq!(offset_of!(ControlBlock, liveness), 64);
        assert_eq!(offset_of!(ControlBlock, shared), 128);
        assert_eq!(offset_of!(ControlBlock, counters), 192);
        assert_eq!(offset_of!(Liveness, device_count), 24);
        assert_eq!(offset_of!(Liveness, unenforced_loads), 32);
        assert_eq!(offset_of!(ControlBlock, devices), 256);
        assert_eq!(offset_of!(ControlBlock, processes), 256 + 64 * MAX_DEVICES);
        assert_eq!(std::mem::size_of::<ProcessSlot>(), 192);
        assert_eq!(BLOCK_SIZE, 256 + 64 * MAX_DEVICES + 192 * MAX_PROCESSES);
        assert_eq!(offset_of!(Limits, quota_bytes), 16);
        assert_eq!(offset_of!(Limits, pace_interval_ns), 24);
        assert_eq!(offset_of!(Limits, flags), 48);
        assert_eq!(offset_of!(Counters, launches), 32);
        assert_eq!(offset_of!(Shared, iterations), 32);
        assert_eq!(offset_of!(Shared, last_iteration_ns), 40);
        assert_eq!(offset_of!(Shared, spilled_bytes), 48);
        assert_eq!(offset_of!(Liveness, spill_limit_bytes), 40);
        assert_eq!(offset_of!(ProcessSlot, spilled), 144);
    }

    #[test]
    fn spill_is_bounded_by_its_allowance_and_reclaimed_with_dead_processes() {
        let b = ControlBlock::default();
        b.initialize(&BlockInit {
            quota_bytes: 100,
            spill_limit_bytes: 50,
            ..Default::default()
        });
        assert!(b.try_spill(30));
        assert!(!b.try_spill(21), "30 + 21 is over the 50 allowed");
        assert!(b.try_spill(20));
        assert_eq!(b.shared.spilled_bytes.load(Ordering::Relaxed), 50);
        assert_eq!(
            b.shared.used_bytes.load(Ordering::Relaxed),
            0,
            "spill is not GPU use"
        );
        b.unspill(30);
        assert_eq!(b.shared.spilled_bytes.load(Ordering::Relaxed), 20);
        let slot = b.claim_process_slot(77, 1).expect("a free slot");
        b.processes[slot].spilled.store(20, Ordering::Relaxed);
        b.reclaim_dead_processes(|_, _| false);
        assert_eq!(b.shared.spilled_bytes.load(Ordering::Relaxed), 0);
        let off = ControlBlock::default();
        off.initialize(&BlockInit::default());
        assert!(!off.try_spill(1), "no allowance, no spill");
    }

    #[test]
    fn release_is_requested_once_the_quota_drops_below_what_is_held() {
        let b = ControlBlock::default();
        b.initialize(&BlockInit {
            quota_bytes: 1000,
            device_count: 2,
            ..Default::default()
        });
        assert!(b.try_reserve(0, 600) && b.try_reserve(1, 900));
        assert_eq!(b.release_requested(), 0);
        b.limits.quota_bytes.store(500, Ordering::Relaxed);
        assert_eq!(b.release_requested(), 400, "device 1 is 400 over");
        b.devices[0].unseen_bytes.store(350, Ordering::Relaxed);
        assert_eq!(
            b.release_requested(),
            450,
            "unseen memory counts: device 0 is 450 over"
        );
        b.limits.quota_bytes.store(UNLIMITED, Ordering::Relaxed);
        assert_eq!(b.release_requested(), 0);
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
                    while b.try_reserve(0, 4096) {
                        granted.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert_eq!(granted.load(Ordering::Relaxed), 1000);
        assert_eq!(b.shared.used_bytes.load(Ordering::Relaxed), 1000 * 4096);
        b.release(0, 4096 * 2000);
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
        let dir = tempfile_dir("arbiter-ctl");
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

    /// A block created where one exists leaves the old one's mappings whole: its reader
    /// reads on (a truncated mapping would have raised SIGBUS and ended this test
    /// process) and sees the old values, not the new block's.
    #[test]
    fn creating_over_a_mapped_block_never_truncates_it() {
        let dir = tempfile_dir("arbiter-ctl-recreate");
        let path = dir.join("1.block");
        let init = |quota_bytes| BlockInit {
            quota_bytes,
            ..Default::default()
        };
        let old_writer = MappedBlock::create(&path, &init(42)).expect("create");
        let old_reader = MappedBlock::open(&path).expect("open").leak();
        drop(old_writer);
        let new_writer = MappedBlock::create(&path, &init(7)).expect("create again");
        assert_eq!(old_reader.limits.quota_bytes.load(Ordering::Relaxed), 42);
        assert_eq!(old_reader.validate(), Ok(()));
        let new_reader = MappedBlock::open(&path).expect("open the new block");
        assert_eq!(new_reader.limits.quota_bytes.load(Ordering::Relaxed), 7);
        new_writer.set_pacing(9, 1);
        assert_eq!(
            old_reader.limits.pace_interval_ns.load(Ordering::Relaxed),
            0
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        dir
    }

    fn block(quota: u64) -> Box<ControlBlock> {
        let b = Box::<ControlBlock>::default();
        b.initialize(&BlockInit {
            quota_bytes: quota,
            device_count: 2,
            ..Default::default()
        });
        b
    }

    #[test]
    fn the_quota_is_per_device_and_the_total_sums_them() {
        let b = block(100);
        assert!(b.try_reserve(0, 100));
        assert!(!b.try_reserve(0, 1), "device 0 is full");
        assert!(b.try_reserve(1, 60), "device 1 has its own quota");
        assert_eq!(b.shared.used_bytes.load(Ordering::Relaxed), 160);
        b.release(0, 40);
        assert_eq!(b.device(0).used_bytes.load(Ordering::Relaxed), 60);
        assert_eq!(b.shared.used_bytes.load(Ordering::Relaxed), 120);
        b.charge(1, 100);
        assert_eq!(b.device(1).used_bytes.load(Ordering::Relaxed), 160);
        assert_eq!(b.device(1).peak_used_bytes.load(Ordering::Relaxed), 160);
        assert!(std::ptr::eq(b.device(99), b.device(MAX_DEVICES - 1)));
    }

    #[test]
    fn memory_the_interposer_cannot_see_counts_against_the_quota() {
        let b = block(100);
        assert!(b.try_reserve(0, 30));
        // NVML: the workload's processes use 50 on device 0, 30 of them charged.
        assert_eq!(b.reconcile(0, 50, 0), 20);
        assert!(!b.try_reserve(0, 51), "30 charged + 20 unseen + 51 > 100");
        assert!(b.try_reserve(0, 50));
        // NVML lagging behind a charge never makes the unseen part negative.
        assert_eq!(b.reconcile(0, 10, 0), 0);
        // A free between the NVML sample and the reconciliation: the charge read before the
        // sample (80) still covers what NVML saw.
        b.release(0, 50);
        assert_eq!(b.reconcile(0, 80, 80), 0);
        assert!(b.try_reserve(1, 100), "device 1 is reconciled on its own");
    }

    #[test]
    fn dead_processes_are_reclaimed_and_live_ones_kept() {
        let b = block(UNLIMITED);
        let live = b.claim_process_slot(100, 7).expect("slot");
        let dead = b.claim_process_slot(200, 9).expect("slot");
        assert_ne!(live, dead);
        for (slot, device, bytes) in [(live, 0, 10), (dead, 0, 20), (dead, 1, 30)] {
            assert!(b.try_reserve(device, bytes));
            b.processes[slot].held[device].fetch_add(bytes, Ordering::Relaxed);
        }
        let reclaimed = b.reclaim_dead_processes(|pid, ticks| pid == 100 && ticks == 7);
        assert_eq!(reclaimed, 50);
        assert_eq!(b.shared.used_bytes.load(Ordering::Relaxed), 10);
        assert_eq!(b.device(1).used_bytes.load(Ordering::Relaxed), 0);
        assert_eq!(
            b.processes[dead].pid.load(Ordering::Relaxed),
            0,
            "slot freed"
        );
        assert_eq!(b.processes[live].pid.load(Ordering::Relaxed), 100);
    }

    #[test]
    fn slots_run_out_without_failing() {
        let b = block(UNLIMITED);
        for pid in 1..=MAX_PROCESSES as u64 {
            assert!(b.claim_process_slot(pid, 0).is_some());
        }
        assert_eq!(b.claim_process_slot(999, 0), None);
    }

    #[test]
    fn this_process_has_a_start_time() {
        let pid = u64::from(std::process::id());
        assert!(process_start_ticks(pid).is_some_and(|t| t > 0));
        assert_eq!(process_start_ticks(u64::from(u32::MAX)), None);
    }
}
