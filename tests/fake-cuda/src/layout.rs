//! Layout of the fake driver's state file: one definition, shared by the
//! fake (which writes it) and `cuda-workload` (which reads it in tests) via
//! `#[path]`, because the fake is a cdylib that other crates cannot link.

/// Index of each counter in the state file.
#[repr(usize)]
#[derive(Clone, Copy, Debug)]
pub enum Slot {
    Magic = 0,
    MemTotal,
    MemUsed,
    MemPeak,
    Allocs,
    Frees,
    Launches,
    LaunchesPtsz,
    GraphLaunches,
    KernelNs,
    CtxLive,
    CtxDestroyed,
    Syncs,
    Inits,
    BusyUntil,
    CoopLaunches,
    LaunchesEx,
    VmmBytes,
    ManagedBytes,
    AsyncBytes,
    PitchBytes,
    /// Bytes allocated through the per-thread-default-stream (`_ptsz`) async allocators.
    AsyncPtszBytes,
    /// Bytes of arrays and mipmapped arrays (with the fake's row padding).
    ArrayBytes,
    /// Bytes advised `SET_PREFERRED_LOCATION = host` (`cuMemAdvise_v2` / `cuMemAdvise`).
    HostPreferredBytes,
    /// Bytes advised `SET_ACCESSED_BY` a device.
    AccessedByBytes,
}
/// Number of u64 slots in the state file.
pub const SLOTS: usize = 32;
/// Value of slot 0 once the fake initialised the file.
pub const STATE_MAGIC: u64 = u64::from_le_bytes(*b"FAKECUDA");
