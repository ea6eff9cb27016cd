//! The sandbox's kernel threads: `PID/stat` and `PID/status` as plain files under `DIR/proc`,
//! and the kernel's part in setting their affinity ([`SimKthreads`], the twin of
//! [`crate::host::housekeeping::HostKthreads`]).
//!
//! It plays the kernel as the real one answers, and never changes a real process: the thread's
//! `status` file is rewritten instead. A thread flagged `PF_NO_SETAFFINITY` refuses with
//! `EINVAL`, a mask without an allowed CPU refuses with `EINVAL`, a thread gone (or whose pid now
//! names another) is `ESRCH`, and a thread whose directory holds `sim_kernel_keeps` takes the
//! write but keeps its affinity (as a kernel that resets a thread's CPUs itself does); the
//! daemon learns that only from the read-back.
#![deny(missing_docs)]

use std::path::Path;

use crate::core::cpuset::CpuSet;
use crate::host::fsutil::Root;
use crate::host::housekeeping::{affinity_error, HousekeepingError, Kthread, KthreadKernel, Kthreads};

/// The simulated kernel's part in a kernel thread's affinity (module docs).
#[derive(Debug, Clone, Copy)]
pub struct SimKthreads;

impl KthreadKernel for SimKthreads {
    fn set_affinity(&self, fs: &Kthreads, t: &Kthread, cpus: &CpuSet) -> Result<(), HousekeepingError> {
        let err = |errno: nix::Error| affinity_error(t, cpus, errno.into());
        let now = fs.read(t.pid).ok_or_else(|| err(nix::Error::ESRCH))?;
        if now.stat.start != t.stat.start {
            return Err(err(nix::Error::ESRCH));
        }
        if !now.stat.movable_kthread() || cpus.is_empty() {
            return Err(err(nix::Error::EINVAL));
        }
        let root = Root::new(fs.procfs());
        if root.exists(format!("{}/sim_kernel_keeps", t.pid)) {
            return Ok(());
        }
        let rel = format!("{}/status", t.pid);
        let text = root.read_to_string(&rel)?;
        let text: String = text
            .lines()
            .map(|l| {
                if l.starts_with("Cpus_allowed_list:") {
                    format!("Cpus_allowed_list:\t{cpus}\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        root.write(&rel, text.as_bytes())?;
        Ok(())
    }
}

/// Writes a simulated kernel thread under `procfs` (the sandbox's `DIR/proc`): `PID/stat` in
/// the kernel's format with `flags`, and `PID/status` with its name and `allowed` CPUs.
pub fn write_kthread(
    procfs: &Path,
    pid: u32,
    comm: &str,
    flags: u32,
    allowed: &CpuSet,
) -> std::io::Result<()> {
    let dir = procfs.join(pid.to_string());
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("stat"),
        format!("{pid} ({comm}) S 2 0 0 0 -1 {flags} 0 0 0 0 0 0 0 0 20 0 1 0 {} 0 0 18446744073709551615 0 0 0\n", 10 + pid),
    )?;
    std::fs::write(
        dir.join("status"),
        format!(
            "Name:\t{comm}\nState:\tS (sleeping)\nPid:\t{pid}\nPPid:\t2\nCpus_allowed_list:\t{allowed}\n"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::housekeeping::refused_or_gone;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn fake_procfs_kthreads_move_refuse_and_keep_as_the_kernel_would() {
        use crate::core::housekeeping::{PF_KTHREAD, PF_NO_SETAFFINITY};
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let p = dir.path();
        let all = set("0-3");
        write_kthread(p, 2, "kthreadd", PF_KTHREAD, &all).unwrap_or_else(|e| panic!("{e}"));
        write_kthread(p, 20, "migration/2", PF_KTHREAD | PF_NO_SETAFFINITY, &set("2"))
            .unwrap_or_else(|e| panic!("{e}"));
        write_kthread(p, 31, "khugepaged", PF_KTHREAD, &all).unwrap_or_else(|e| panic!("{e}"));
        // A user process and a pid recorded by the sandbox's process affinities (no stat).
        write_kthread(p, 500, "sleep", 0x0040_0000, &all).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(p.join("600")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(p.join("600/status"), "Cpus_allowed_list:\t1\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(p.join("irq")).unwrap_or_else(|e| panic!("{e}"));

        let k = Kthreads::new(p).with_kernel(super::super::KERNEL);
        let list = k.movable().unwrap_or_else(|e| panic!("{e}"));
        let pids: Vec<u32> = list.iter().map(|t| t.pid).collect();
        assert_eq!(pids, [2, 31]);
        assert_eq!(list[0].allowed, all);
        assert_eq!(list[0].stat.comm, "kthreadd");

        // Written to status, the other lines kept.
        k.set_affinity(&list[0], &set("0-1")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(k.read(2).map(|t| t.allowed), Some(set("0-1")));
        let status = std::fs::read_to_string(p.join("2/status")).unwrap_or_default();
        assert!(status.starts_with("Name:\tkthreadd\n"), "{status}");

        // The kernel binds it: EINVAL, nothing written.
        let bound = k.read(20).unwrap_or_else(|| panic!("migration/2"));
        let e = k.set_affinity(&bound, &set("0")).err().unwrap_or_else(|| panic!("accepted"));
        assert!(refused_or_gone(&e), "{e}");
        assert!(e.to_string().contains("migration/2 (20)"), "{e}");
        assert_eq!(k.read(20).map(|t| t.allowed), Some(set("2")));

        // A kernel that puts it back: the write succeeds, the read-back tells.
        std::fs::write(p.join("31/sim_kernel_keeps"), "").unwrap_or_else(|e| panic!("{e}"));
        k.set_affinity(&list[1], &set("0-1")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(k.read(31).map(|t| t.allowed), Some(all.clone()));

        // Gone, or the pid now another thread's: ESRCH, not ours to fix.
        let mut old = list[0].clone();
        old.stat.start += 1;
        assert!(k.set_affinity(&old, &set("0")).err().is_some_and(|e| refused_or_gone(&e)));
        std::fs::remove_dir_all(p.join("2")).unwrap_or_else(|e| panic!("{e}"));
        assert!(k.set_affinity(&list[0], &set("0")).err().is_some_and(|e| refused_or_gone(&e)));
    }
}
