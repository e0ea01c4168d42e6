//! Process identity and signals (Linux `/proc` and `rustix`; no `unsafe`).
//!
//! A pid alone does not identify a process across a node restart: the kernel reuses pids.
//! `(pid, start time)` does — the start time (`/proc/<pid>/stat` field 22, clock ticks since
//! boot) never changes for a process and two processes with the same pid cannot have the
//! same start time.

use rustix::process::{Pid, Signal};
use std::io;

/// What `/proc` says about a process we expect to be `(pid, start_ticks)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Running (or sleeping, stopped, ...): the same process.
    Alive,
    /// Exited but not reaped yet (our own child before `wait`, or a child of a dead parent
    /// waiting for init).
    Zombie,
    /// No such process, or the pid now belongs to another process.
    Gone,
}

/// Fields of `/proc/<pid>/stat` we use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub state: char,
    /// Process group id (field 5).
    pub pgrp: u32,
    pub start_ticks: u64,
}

/// Parse `/proc/<pid>/stat`. `comm` may contain spaces and parentheses, so fields are counted
/// from the *last* `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    // fields[0] is field 3 (`state`), so field N is fields[N - 3].
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let pgrp = fields.get(2)?.parse().ok()?;
    let start_ticks = fields.get(19)?.parse().ok()?;
    Some(Stat {
        state,
        pgrp,
        start_ticks,
    })
}

/// Read `/proc/<pid>/stat`.
pub fn stat(pid: u32) -> io::Result<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{pid}/stat: unexpected format"),
        )
    })
}

/// Whether `(pid, start_ticks)` is still the same, live process.
pub fn liveness(pid: u32, start_ticks: u64) -> Liveness {
    match stat(pid) {
        Ok(s) if s.start_ticks != start_ticks => Liveness::Gone,
        Ok(s) if s.state == 'Z' || s.state == 'X' => Liveness::Zombie,
        Ok(_) => Liveness::Alive,
        Err(_) => Liveness::Gone,
    }
}

/// Whether a process with this pid exists (signal 0: nothing is sent). One syscall, but a pid
/// reused by another process exists too: [`liveness`] tells them apart.
pub fn exists(p: u32) -> bool {
    pid(p).is_ok_and(|p| match rustix::process::test_kill_process(p) {
        Ok(()) => true,
        // It exists; we may not signal it.
        Err(e) => e == rustix::io::Errno::PERM,
    })
}

fn pid(raw: u32) -> io::Result<Pid> {
    i32::try_from(raw)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("bad pid {raw}")))
}

/// Send `sig` to the process group `pgid` (workloads run in their own group, so this reaches
/// every process they forked).
pub fn signal_group(pgid: u32, sig: Signal) -> io::Result<()> {
    rustix::process::kill_process_group(pid(pgid)?, sig).map_err(io::Error::from)
}

/// Send `sig` to one process.
pub fn signal(p: u32, sig: Signal) -> io::Result<()> {
    rustix::process::kill_process(pid(p)?, sig).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_hostile_comm() {
        let line = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                    987654 1000 10 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                state: 'S',
                pgrp: 4242,
                start_ticks: 987654
            })
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn own_process_is_alive_and_a_wrong_start_time_is_gone() {
        let me = std::process::id();
        let s = stat(me).expect("own stat");
        assert_eq!(liveness(me, s.start_ticks), Liveness::Alive);
        assert_eq!(liveness(me, s.start_ticks + 1), Liveness::Gone);
        assert_eq!(liveness(u32::MAX / 2, 1), Liveness::Gone);
    }
}
