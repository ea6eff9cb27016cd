//! Processes: their start time and the CPU affinity of their threads, through the
//! [`ProcessKernel`] chosen at start: `sched_setaffinity` on the host's ([`HostProcesses`]), or
//! the sandbox's record of it.

use std::fs;
use std::io;

use super::{CgroupFs, HostError, ProcessKernel};
use crate::core::cpuset::CpuSet;
use crate::core::state::CgroupPath;
use crate::host::IoError;

impl CgroupFs {
    /// When process `pid` started: field 22 of `/proc/PID/stat`, in clock ticks since boot.
    pub fn process_start(&self, pid: u32) -> Option<u64> {
        let stat = fs::read_to_string(self.proc_root.join(pid.to_string()).join("stat")).ok()?;
        // The command name (field 2) is in parentheses and may hold spaces or `)`: fields
        // after it are counted from the last `)`.
        let rest = &stat[stat.rfind(')')? + 1..];
        rest.split_whitespace().nth(19)?.parse().ok()
    }

    /// Sets the affinity of every thread of `pid`. Empty `cpus` means every CPU (the kernel
    /// still confines the threads to their cpuset). A process that is gone is not an error
    /// when `optional`.
    pub fn set_affinity(&self, pid: u32, cpus: &CpuSet, optional: bool) -> Result<(), HostError> {
        self.procs.set_affinity(self, pid, cpus, optional)
    }

    /// The affinity of `pid`'s main thread, `None` if it is gone.
    pub fn affinity(&self, pid: u32) -> Option<CpuSet> {
        self.procs.affinity(self, pid)
    }
}

/// The host's kernel: `sched_setaffinity` and `sched_getaffinity` on the real processes, found
/// under the procfs root.
#[derive(Debug, Clone, Copy)]
pub struct HostProcesses;

impl ProcessKernel for HostProcesses {
    fn set_affinity(&self, fs: &CgroupFs, pid: u32, cpus: &CpuSet, optional: bool) -> Result<(), HostError> {
        let mut set = nix::sched::CpuSet::new();
        let all = CpuSet::range(0, (nix::sched::CpuSet::count() as u32).saturating_sub(1));
        let cpus = if cpus.is_empty() { &all } else { cpus };
        for cpu in cpus.iter() {
            // Beyond what the kernel's mask holds there is nothing to set.
            let _ = set.set(cpu as usize);
        }
        let task_dir = fs.proc_root.join(pid.to_string()).join("task");
        let tids: Vec<u32> = match fs::read_dir(&task_dir) {
            Ok(entries) => {
                entries.filter_map(Result::ok).filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && optional => return Ok(()),
            Err(source) => return Err(HostError::Io(IoError::Read { path: task_dir, source })),
        };
        for tid in tids {
            let tid_i = i32::try_from(tid).unwrap_or(i32::MAX);
            match nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(tid_i), &set) {
                Ok(()) => {}
                // A thread that exited between listing and setting is fine.
                Err(nix::Error::ESRCH) => {}
                Err(source) => return Err(HostError::Affinity { pid, tid, cpus: cpus.to_string(), source }),
            }
        }
        Ok(())
    }

    fn affinity(&self, _fs: &CgroupFs, pid: u32) -> Option<CpuSet> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).ok()?);
        let set = nix::sched::sched_getaffinity(pid).ok()?;
        Some(
            (0..nix::sched::CpuSet::count())
                .filter(|c| set.is_set(*c).unwrap_or(false))
                .map(|c| c as u32)
                .collect(),
        )
    }

    fn keep_busy(&self, fs: &CgroupFs, path: &CgroupPath, cpus: &CpuSet) -> super::settle::Busy {
        super::settle::keep_busy(&fs.dir(path), &fs.proc_root, cpus)
    }

    fn cgroup(&self, fs: &CgroupFs, pid: u32) -> Option<String> {
        let text = fs::read_to_string(fs.proc_root.join(pid.to_string()).join("cgroup")).ok()?;
        // cgroup v2: the one line "0::/path".
        let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
        Some(rel.trim().trim_start_matches('/').to_owned())
    }
}
