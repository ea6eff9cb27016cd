//! Processes: their start time and the CPU affinity of their threads (`sched_setaffinity`, or
//! the sandbox's record of it under its simulated `proc/`).

use std::fs;
use std::io;
use std::path::Path;

use super::{CgroupFs, HostError};
use crate::core::cpuset::CpuSet;
use crate::host::fsutil::{FsError, Root};

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
        if let Some(dir) = &self.sim_procs {
            return self.set_sim_affinity(dir, pid, cpus, optional);
        }
        let mut set = nix::sched::CpuSet::new();
        let all = CpuSet::range(0, (nix::sched::CpuSet::count() as u32).saturating_sub(1));
        let cpus = if cpus.is_empty() { &all } else { cpus };
        for cpu in cpus.iter() {
            // Beyond what the kernel's mask holds there is nothing to set.
            let _ = set.set(cpu as usize);
        }
        let task_dir = self.proc_root.join(pid.to_string()).join("task");
        let tids: Vec<u32> = match fs::read_dir(&task_dir) {
            Ok(entries) => {
                entries.filter_map(Result::ok).filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && optional => return Ok(()),
            Err(source) => return Err(HostError::Read { path: task_dir, source }),
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

    /// The sandbox's `sched_setaffinity`: records `cpus` (empty: every simulated CPU) as the
    /// process's `Cpus_allowed_list` under `dir`, after checking that the process exists.
    fn set_sim_affinity(&self, dir: &Path, pid: u32, cpus: &CpuSet, optional: bool) -> Result<(), HostError> {
        let proc_dir = self.proc_root.join(pid.to_string());
        if !proc_dir.is_dir() {
            if optional {
                return Ok(());
            }
            return Err(HostError::Read { path: proc_dir, source: io::Error::from(io::ErrorKind::NotFound) });
        }
        let all = self.effective_at_root();
        let cpus = if cpus.is_empty() { &all } else { cpus };
        // Inside the sandbox only, and never through a link planted there.
        let root = Root::new(dir);
        let data = format!("Cpus_allowed_list:\t{cpus}\n");
        let status = dir.join(pid.to_string()).join("status");
        let err =
            |e: FsError| HostError::Write { path: status.clone(), data: data.clone(), source: e.source };
        root.create_dir_all(pid.to_string(), 0o755).map_err(err)?;
        root.write_or_create(format!("{pid}/status"), data.as_bytes(), 0o644).map_err(err)
    }

    fn effective_at_root(&self) -> CpuSet {
        fs::read_to_string(self.root.join("cpuset.cpus.effective"))
            .ok()
            .and_then(|t| CpuSet::parse(t.trim()).ok())
            .unwrap_or_default()
    }

    /// The affinity of `pid`'s main thread, `None` if it is gone.
    pub fn affinity(&self, pid: u32) -> Option<CpuSet> {
        if let Some(dir) = &self.sim_procs {
            if !self.proc_root.join(pid.to_string()).is_dir() {
                return None;
            }
            let text = fs::read_to_string(dir.join(pid.to_string()).join("status")).unwrap_or_default();
            let listed = text.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"));
            return Some(
                listed.and_then(|l| CpuSet::parse(l.trim()).ok()).unwrap_or_else(|| self.effective_at_root()),
            );
        }
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).ok()?);
        let set = nix::sched::sched_getaffinity(pid).ok()?;
        Some(
            (0..nix::sched::CpuSet::count())
                .filter(|c| set.is_set(*c).unwrap_or(false))
                .map(|c| c as u32)
                .collect(),
        )
    }
}
