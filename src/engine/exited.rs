//! Processes that ended before the reclaim task released their CPUs.
//!
//! `cpupoolctl run` becomes its command in place (the shape of `systemd-run --scope`): the
//! daemon learns the command ended through a pidfd, or systemd's signal for its scope, and the
//! reclaim task then releases the assignment. A booking that comes right after (`cpupoolctl run
//! a; cpupoolctl run b` on a pool with room for one) can reach the engine before that release.
//! So before the engine refuses a booking for want of capacity, it looks at the pool's `Run`
//! assignments itself and releases those whose process is gone: a refusal is never owed to a
//! release that is already due.
//!
//! Only on that path, and only the refusing pool's assignments that hold a process: a pid with
//! the start time recorded when it was assigned (a pid the kernel gave to a new process is not
//! the assigned one), or a `cpupool-run-<pid>-<start>.scope` whose process has ended and whose
//! cgroup the kernel says is empty (the command's children may still run in it; systemd
//! collects the scope a moment after the kernel says so).

use super::ledger::{released, Ledger, Made};
use crate::core::state::{Assignment, Target};

impl Ledger {
    /// Whether `a`'s process has ended (and, for a scope, the scope with it).
    fn ended(&self, a: &Assignment) -> bool {
        if !a.reclaim {
            return false;
        }
        match &a.target {
            Target::Pid(pid) => {
                a.process_start.is_some_and(|start| self.backend.process_start(*pid) != Some(start))
            }
            Target::Unit(unit) => {
                let Some((pid, start)) = a.target.run_scope_process() else { return false };
                self.backend.process_start(pid) != Some(start) && self.backend.unit_runs_nothing(unit)
            }
            Target::Cgroup(_) | Target::Kubelet(_) => false,
        }
    }

    /// Releases, in one commit, the assignments of `pool` whose process has ended; the number
    /// released (none: nothing committed).
    pub(super) fn release_ended(&mut self, pool: &str) -> Made<usize> {
        let ended: Vec<Assignment> = self
            .state
            .assignments()
            .values()
            .filter(|a| a.pool.as_str() == pool && self.ended(a))
            .cloned()
            .collect();
        if ended.is_empty() {
            return (0, Vec::new());
        }
        let mut next = (*self.state).clone();
        for a in &ended {
            let _ = next.release(a.id.as_str());
        }
        if let Err(e) = self.commit(next) {
            // The reclaim task releases them when it learns of the exits, as it would have.
            log::warn!(
                "releasing {} assignments of ended processes failed: {}",
                ended.len(),
                super::error_chain(&e)
            );
            return (0, Vec::new());
        }
        let mut events = Vec::new();
        for a in &ended {
            log::info!(ASSIGNMENT = a.id.as_str(); "assignment {}: its process ended, released before refusing a booking", a.id);
            events.extend(released(a));
        }
        (ended.len(), events)
    }
}
