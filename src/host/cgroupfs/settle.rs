//! Isolating a CPU without leaving it to the scheduler's idle load balancing: before a cgroup
//! becomes an isolated partition, each CPU it takes out of the scheduler's domains is kept busy
//! by a spinning child process until it has taken [`TICKS`] ticks, and stays busy across the
//! partition write ([`keep_busy`]; the partition is written while the returned [`Busy`] lives).
//!
//! Why: nohz idle load balancing keeps the idle CPUs whose tick is stopped in the scheduler's
//! `nohz.idle_cpus_mask`, and a busy CPU's tick sends one of them (`find_new_ilb`, the first
//! idle one that is a housekeeping CPU) a function-call IPI to balance on behalf of all
//! (`kick_ilb`), which runs as a SCHED softirq there. A CPU leaves the mask only at a busy tick
//! of its own while it still has a sched domain (`nohz_balancer_kick` calls
//! `nohz_balance_exit_idle`; `sched_balance_trigger` returns first on a NULL domain). An isolated
//! partition's CPUs have a NULL domain: one made isolated while idle stays in the mask for good
//! and is picked again and again (about 250 times a second on Linux 6.1 and 6.12 in the guest,
//! with load on the other CPUs; docs/performance.md), while one that is busy when it loses its
//! domain never enters it again (`nohz_balance_enter_idle` returns on a NULL domain). The kernel
//! chooses the balancer among `nohz_full=` CPUs' complement (HK_TYPE_MISC): CPUs given to
//! `nohz_full=` at boot are never picked, and one task there stops the tick, so they are left out.
//!
//! The children are this daemon's own executable (`/proc/self/exe --spin PID`, [`spin`]), moved
//! into a cgroup of their own below the one becoming a partition (`cpupool-settle`, removed
//! with them) and pinned to one CPU each. They die with the daemon (`PR_SET_PDEATHSIG`) and after
//! [`SPIN_LIMIT`] in any case. Nothing here fails the partition: a CPU that could not be kept
//! busy is isolated as before, with a warning.
#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::core::cpuset::CpuSet;
use crate::core::housekeeping::{parse_cmdline, parse_interrupts};

/// The argument that makes `cpupoold` spin (followed by the parent's PID): see [`spin`].
pub const SPIN_ARG: &str = "--spin";
/// Ticks each CPU takes while busy before the partition is written: the first may have begun
/// while it was still idle.
pub const TICKS: u64 = 2;
/// How long the ticks are waited for (a tick is 1-10 ms; under emulation it may be far longer).
const WAIT: Duration = Duration::from_secs(2);
/// How long a spinning child lives at most, whatever happens to the daemon.
pub const SPIN_LIMIT: Duration = Duration::from_secs(30);
/// The cgroup the children run in, below the one becoming a partition.
const CHILD_CGROUP: &str = "cpupool-settle";

/// The spinning children; dropping it kills them and removes their cgroup.
#[derive(Debug, Default)]
pub struct Busy {
    children: Vec<Child>,
    cgroup: Option<PathBuf>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        for child in &mut self.children {
            // Already gone (SPIN_LIMIT) is fine: there is nothing else to do with the error.
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = &self.cgroup {
            if let Err(e) = fs::remove_dir(dir) {
                log::warn!("removing `{}`: {e}", dir.display());
            }
        }
    }
}

/// Keeps each of `cpus` busy, from a cgroup below the cgroup directory `dir`, until each has
/// taken [`TICKS`] ticks (`/proc/interrupts`' LOC, under `proc_root`); `nohz_full=` CPUs
/// (`/proc/cmdline`) are left out. Write the partition, then drop the result.
pub fn keep_busy(dir: &Path, proc_root: &Path, cpus: &CpuSet) -> Busy {
    let mut busy = Busy::default();
    let cmdline = fs::read_to_string(proc_root.join("cmdline")).unwrap_or_default();
    let cpus = cpus.difference(&parse_cmdline(&cmdline).nohz_full);
    if cpus.is_empty() {
        return busy;
    }
    let cgroup = dir.join(CHILD_CGROUP);
    match fs::create_dir(&cgroup) {
        Ok(()) => busy.cgroup = Some(cgroup.clone()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => busy.cgroup = Some(cgroup.clone()),
        Err(e) => {
            log::warn!("CPUs {cpus}: not kept busy while isolated (creating `{}`: {e})", cgroup.display());
            return busy;
        }
    }
    for cpu in cpus.iter() {
        match spawn_on(&cgroup, cpu) {
            Ok(child) => busy.children.push(child),
            Err(e) => {
                log::warn!("CPU {cpu}: not kept busy while isolated: {e}");
                return busy;
            }
        }
    }
    // Counted from now, when each child is pinned to its CPU.
    let start = ticks(proc_root);
    let deadline = Instant::now() + WAIT;
    loop {
        let now = ticks(proc_root);
        let waiting: CpuSet = cpus
            .iter()
            .filter(|c| now.get(c).copied().unwrap_or(0) < start.get(c).copied().unwrap_or(0) + TICKS)
            .collect();
        if waiting.is_empty() {
            return busy;
        }
        if Instant::now() >= deadline {
            log::warn!(
                "CPUs {waiting}: no busy tick within {} s; isolated anyway (the scheduler's idle \
                 balancing may keep waking them)",
                WAIT.as_secs()
            );
            return busy;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The tick count of every CPU (`LOC` in `/proc/interrupts`); empty when unreadable.
fn ticks(proc_root: &Path) -> BTreeMap<u32, u64> {
    let text = fs::read_to_string(proc_root.join("interrupts")).unwrap_or_default();
    parse_interrupts(&text).remove("LOC").map(|l| l.counts).unwrap_or_default()
}

/// Starts a spinning child, moves it into `cgroup` and pins it to `cpu`; killed on failure.
fn spawn_on(cgroup: &Path, cpu: u32) -> io::Result<Child> {
    let mut child = Command::new("/proc/self/exe")
        .arg(SPIN_ARG)
        .arg(std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let placed = fs::write(cgroup.join("cgroup.procs"), child.id().to_string()).and_then(|()| {
        let mut set = nix::sched::CpuSet::new();
        set.set(cpu as usize).map_err(io::Error::from)?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        nix::sched::sched_setaffinity(pid, &set).map_err(io::Error::from)
    });
    if let Err(e) = placed {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    Ok(child)
}

/// The child's part (`cpupoold --spin PARENT`): spin until killed, until the parent is gone
/// (`PR_SET_PDEATHSIG`, and a parent that died before that was set), or for [`SPIN_LIMIT`].
pub fn spin(parent: u32) -> std::process::ExitCode {
    let started = Instant::now();
    if nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).is_err() {
        return std::process::ExitCode::FAILURE;
    }
    while u32::try_from(nix::unistd::getppid().as_raw()).ok() == Some(parent)
        && started.elapsed() < SPIN_LIMIT
    {
        for _ in 0..1_000_000 {
            std::hint::spin_loop();
        }
    }
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPUs booted with `nohz_full=` are never chosen for idle balancing: nothing is started
    /// for them, and no cgroup is made.
    #[test]
    fn nohz_full_cpus_are_left_out() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let proc_root = dir.path().join("proc");
        fs::create_dir_all(&proc_root).unwrap_or_else(|e| panic!("{e}"));
        fs::write(proc_root.join("cmdline"), "quiet nohz_full=2-3 rcu_nocbs=2-3\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let cpus = CpuSet::parse("2-3").unwrap_or_else(|e| panic!("{e}"));
        let busy = keep_busy(dir.path(), &proc_root, &cpus);
        assert!(busy.children.is_empty());
        assert!(!dir.path().join(CHILD_CGROUP).exists());
    }
}
