//! Host-side load of the node for the coordinator's view (contract 0.3's
//! `node-view.host-memory-*`, `swap-in-per-s`, `cpu-utilization-pct`): host
//! memory from `/proc/meminfo`, swap-ins from `/proc/vmstat`'s `pswpin`, CPU
//! busy time from `/proc/stat`'s first line. Rates and utilization are over
//! the span between two samples, so the first sample reports 0 for them.

use std::time::Instant;

/// Host memory in MiB: (used = total − available, total).
pub fn parse_meminfo(text: &str) -> Option<(u32, u32)> {
    let field = |name: &str| -> Option<u64> {
        text.lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let total_kib = field("MemTotal:")?;
    let available_kib = field("MemAvailable:")?;
    let mib = |kib: u64| u32::try_from(kib / 1024).unwrap_or(u32::MAX);
    Some((mib(total_kib.saturating_sub(available_kib)), mib(total_kib)))
}

/// Pages swapped in since boot (`pswpin`).
pub fn parse_pswpin(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("pswpin "))?
        .trim()
        .parse()
        .ok()
}

/// CPU time since boot from `/proc/stat`'s `cpu` line, in ticks: (busy, total).
pub fn parse_cpu_ticks(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is in user).
    let total: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// One reading of the host's load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostLoad {
    pub memory_used_mib: u32,
    pub memory_total_mib: u32,
    pub swap_in_per_s: u32,
    pub cpu_utilization_pct: u8,
}

/// Samples [`HostLoad`], keeping the previous counters for rates.
#[derive(Debug, Default)]
pub struct HostSampler {
    last: Option<(Instant, u64, (u64, u64))>,
}

impl HostSampler {
    /// Reads `/proc`; what cannot be read reads as 0 (unknown).
    pub fn sample(&mut self) -> HostLoad {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let (used, total) = read("/proc/meminfo")
            .and_then(|t| parse_meminfo(&t))
            .unwrap_or((0, 0));
        let pswpin = read("/proc/vmstat").and_then(|t| parse_pswpin(&t));
        let cpu = read("/proc/stat").and_then(|t| parse_cpu_ticks(&t));
        let now = Instant::now();
        let mut load = HostLoad {
            memory_used_mib: used,
            memory_total_mib: total,
            ..HostLoad::default()
        };
        if let (Some(pswpin), Some(cpu)) = (pswpin, cpu) {
            if let Some((at, last_swap, (last_busy, last_total))) = self.last {
                let secs = now.duration_since(at).as_secs_f64();
                if secs > 0.0 {
                    load.swap_in_per_s = (pswpin.saturating_sub(last_swap) as f64 / secs) as u32;
                }
                let dt = cpu.1.saturating_sub(last_total);
                if let Some(pct) = (cpu.0.saturating_sub(last_busy) * 100).checked_div(dt) {
                    load.cpu_utilization_pct = pct.min(100) as u8;
                }
            }
            self.last = Some((now, pswpin, cpu));
        }
        load
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_parse() {
        let meminfo = "MemTotal:       16384000 kB\nMemFree:         1000000 kB\nMemAvailable:    8192000 kB\n";
        assert_eq!(parse_meminfo(meminfo), Some((8000, 16000)));
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
        assert_eq!(parse_pswpin("pgpgin 5\npswpin 42\npswpout 7\n"), Some(42));
        let stat = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n";
        assert_eq!(parse_cpu_ticks(stat), Some((150, 1000)));
    }

    #[test]
    fn this_machine_reports_its_memory_and_a_rate_on_the_second_sample() {
        let mut s = HostSampler::default();
        let first = s.sample();
        assert!(first.memory_total_mib > 0 && first.memory_used_mib <= first.memory_total_mib);
        assert_eq!(first.cpu_utilization_pct, 0);
        let second = s.sample();
        assert!(second.cpu_utilization_pct <= 100);
    }
}
