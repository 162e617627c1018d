//! Reading `/proc`: CPU time and peak RSS of a process, the servers' pids (found by command
//! line), whole-machine CPU (to see the load of processes outside the benchmark), and a
//! description of the machine.

use std::collections::BTreeMap;

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
pub fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime of `pid` (all its threads), in seconds; 0 if it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces: fields start after the last ')'.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime field 15.
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<f64>().ok());
    (field(14).unwrap_or(0.0) + field(15).unwrap_or(0.0)) / ticks_per_second()
}

/// `VmHWM` (peak resident set) of `pid` in MiB.
pub fn peak_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// Pids of processes whose command line contains every one of `needles`.
pub fn pids_matching(needles: &[&str]) -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if needles.iter().all(|n| cmdline.contains(n)) {
            pids.push(pid);
        }
    }
    pids
}

/// Whole-machine (busy, total) jiffies from the first line of `/proc/stat`.
pub fn machine_jiffies() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let values: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: f64 = values.iter().take(8).sum();
    // idle + iowait are not busy.
    let idle = values.get(3).copied().unwrap_or(0.0) + values.get(4).copied().unwrap_or(0.0);
    (total - idle, total)
}

/// The processes whose CPU the benchmark reports, by role.
#[derive(Debug, Clone, Default)]
pub struct Watched {
    pub pids: BTreeMap<&'static str, Vec<u32>>,
}

/// CPU seconds per role at one instant, plus the machine's busy jiffies.
#[derive(Debug, Clone)]
pub struct CpuSample {
    per_role: BTreeMap<&'static str, f64>,
    machine_busy: f64,
}

/// CPU seconds per role between two samples, and the rest of the machine's busy time.
#[derive(Debug, Clone, Default)]
pub struct CpuSplit {
    pub per_role: BTreeMap<&'static str, f64>,
    /// Busy CPU seconds of every other process on the machine (other builds, tests, ...).
    pub others: f64,
    pub wall: f64,
}

impl Watched {
    pub fn sample(&self) -> CpuSample {
        let per_role = self
            .pids
            .iter()
            .map(|(role, pids)| (*role, pids.iter().map(|&p| cpu_seconds(p)).sum()))
            .collect();
        CpuSample {
            per_role,
            machine_busy: machine_jiffies().0 / ticks_per_second(),
        }
    }
}

impl CpuSample {
    /// What happened between `self` (earlier) and `later`, over `wall` seconds.
    pub fn until(&self, later: &CpuSample, wall: f64) -> CpuSplit {
        let per_role: BTreeMap<&'static str, f64> = later
            .per_role
            .iter()
            .map(|(role, s)| (*role, s - self.per_role.get(role).copied().unwrap_or(0.0)))
            .collect();
        let ours: f64 = per_role.values().sum();
        CpuSplit {
            others: (later.machine_busy - self.machine_busy - ours).max(0.0),
            per_role,
            wall,
        }
    }
}

impl CpuSplit {
    pub fn of(&self, role: &str) -> f64 {
        self.per_role.get(role).copied().unwrap_or(0.0)
    }

    /// "relay 0.9 s (45 %), mariadbd ..." — percentages of one core over the wall time.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .per_role
            .iter()
            .map(|(role, s)| format!("{role} {s:.1} s ({:.0} %)", 100.0 * s / self.wall))
            .collect();
        parts.push(format!(
            "other processes {:.1} s ({:.0} %)",
            self.others,
            100.0 * self.others / self.wall
        ));
        parts.join(", ")
    }
}

/// `nproc`, CPU model, RAM, kernel, load average.
pub fn machine_description() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let ram_gib = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cores} cores ({model}), {ram_gib:.0} GiB RAM, Linux {}",
        kernel.trim()
    )
}

pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}
