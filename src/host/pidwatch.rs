//! Process liveness through pidfds: a pidfd refers to one process for good, so a pid the kernel
//! hands to a new process can neither keep nor steal an assignment.
//!
//! A pid alone is checked against the start time recorded when the assignment was made
//! (`/proc/PID/stat` field 22); the pidfd is opened and the start time read again after it, so
//! the pidfd is known to refer to the recorded process. The pidfd becomes readable when that
//! process exits.

use std::io;
use std::os::fd::OwnedFd;

use tokio::io::unix::AsyncFd;

use super::Backend;

/// A live process being watched.
#[derive(Debug)]
pub struct Watched {
    fd: AsyncFd<OwnedFd>,
}

/// Opens a pidfd for `pid` if it is still the process that started at `start` (clock ticks
/// since boot). `Ok(None)`: that process is gone.
pub fn watch(host: &dyn Backend, pid: u32, start: u64) -> io::Result<Option<Watched>> {
    let Some(raw) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) else {
        return Ok(None);
    };
    let fd = match rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::SRCH) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    // Read after the pidfd exists: if the start time still matches, the pidfd is that process.
    if host.process_start(pid) != Some(start) {
        return Ok(None);
    }
    // `with_interest` is deprecated because a type's `as_raw_fd` could change or close its fd
    // behind tokio's back; an `OwnedFd` owned by the `AsyncFd` always returns the same open
    // descriptor until it is dropped, which is exactly the condition tokio asks for (and this
    // crate forbids the `unsafe` spelling of the same call).
    #[allow(deprecated)]
    let fd = AsyncFd::with_interest(fd, tokio::io::Interest::READABLE)?;
    Ok(Some(Watched { fd }))
}

impl Watched {
    /// Returns once the process has exited.
    pub async fn exited(&self) {
        // A pidfd polls readable when the process exits; an error means the same for us.
        let _ = self.fd.readable().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::cgroupfs::CgroupFs;

    #[tokio::test]
    async fn exit_is_seen_and_a_wrong_start_time_is_not_the_process() {
        let host = CgroupFs::new("/nonexistent", "/proc");
        let mut child =
            std::process::Command::new("sleep").arg("30").spawn().unwrap_or_else(|e| panic!("{e}"));
        let pid = child.id();
        let start = host.process_start(pid).unwrap_or_else(|| panic!("no start time for {pid}"));
        assert!(watch(&host, pid, start + 1).unwrap_or_else(|e| panic!("{e}")).is_none());
        let w = watch(&host, pid, start).unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|| panic!("gone"));
        let waiting = tokio::spawn(async move { w.exited().await });
        // Still running: the watch has not fired.
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        let _ = child.kill();
        let _ = child.wait();
        tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .unwrap_or_else(|_| panic!("the pidfd did not report the exit"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(watch(&host, pid, start).unwrap_or_else(|e| panic!("{e}")).is_none());
    }
}
