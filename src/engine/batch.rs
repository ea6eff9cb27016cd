//! Several assignments as one change: all are made, or none ([`super::Handle::assign_all`]).
//!
//! The kubelet's Allocate names one container per entry, and a pod's containers either all get
//! their CPUs or the pod does not start: deciding them on one copy of the state, applying and
//! saving once, and reading every target back before the acknowledgement means a refusal or a
//! failure partway leaves nothing booked and nothing applied, with no undo left to the caller.

use super::ledger::{assigned, Ledger, Made};
use super::{error_chain, EngineError};
use crate::core::state::{AssignSpec, Assignment, Outcome};

impl Ledger {
    /// Decides every spec in order on one copy of the state (each admitted against the ones
    /// before it), applies and saves the result once, then reads back what the kernel enforces
    /// on every new target; any refusal, failure or difference leaves the state, the host and
    /// the state file as they were. A spec the state already holds as asked answers
    /// [`Outcome::Identity`].
    pub(super) fn assign_all(
        &mut self,
        specs: Vec<AssignSpec>,
    ) -> Result<Made<Vec<Outcome<Assignment>>>, EngineError> {
        let mut next = (*self.state).clone();
        let mut outs = Vec::with_capacity(specs.len());
        for spec in specs {
            let spec = self.stamp(spec)?;
            outs.push(self.decide(&mut next, &spec)?);
        }
        let made: Vec<&Assignment> = outs
            .iter()
            .filter_map(|o| match o {
                Outcome::Changed(a) => Some(a),
                Outcome::Identity(_) => None,
            })
            .collect();
        if made.is_empty() {
            return Ok((outs, Vec::new()));
        }
        let mut before = (*self.state).clone();
        let changes = self.commit(next)?;
        if let Some((a, e)) = made.iter().find_map(|a| self.verify(a).err().map(|e| (a, e))) {
            log::warn!(
                TARGET = a.target.to_string().as_str();
                "refusing {} assignments together: {} of CPUs {} to {}: {}", made.len(), a.id, a.cpus, a.target, error_chain(&e)
            );
            before.mark(&changes);
            if let Err(undo) = self.commit(before) {
                log::error!("taking back {} assignments failed: {}", made.len(), error_chain(&undo));
            }
            return Err(e);
        }
        let events = made.iter().flat_map(|a| assigned(a)).collect();
        Ok((outs, events))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{rt, spec, Fixture};
    use super::*;
    use crate::core::state::{self, Size};
    use crate::engine::{Change, Event};

    #[test]
    fn all_are_made_with_one_save() {
        let f = Fixture::new();
        f.write("k/a/cpuset.cpus", "\n");
        f.write("k/b/cpuset.cpus", "\n");
        let (engine, _) = f.start();
        let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
        let mut events = handle.subscribe();
        let outs = rt().block_on(handle.assign_all(vec![
            spec("dp", "cgroup:k/a", Size::Cpus(2), Some("a")),
            spec("web", "cgroup:k/b", Size::Millicpus(500), Some("b")),
        ]));
        let outs = outs.unwrap_or_else(|e| panic!("{}", error_chain(&e)));
        assert!(outs.iter().all(Outcome::changed), "{outs:?}");
        assert_eq!(f.read("k/a/cpuset.cpus"), "1,5");
        assert_eq!(f.read("k/b/cpuset.cpus"), "3,7");
        assert_eq!(handle.snapshot().state.assignments().len(), 2);
        // Two saves would have left the first assignment in the previous copy.
        assert_eq!(f.journal_records(), 1, "one save for the whole batch");
        let mut added = Vec::new();
        while let Ok(e) = events.try_recv() {
            if let Event::AssignmentChanged { id, change: Change::Added } = e {
                added.push(id.to_string());
            }
        }
        assert_eq!(added, ["a", "b"]);

        // Asked again (the kubelet repeats Allocate): the same answers, and no save at all.
        let file = f.state_file();
        let again = rt().block_on(handle.assign_all(vec![
            spec("dp", "cgroup:k/a", Size::Cpus(2), Some("a")),
            spec("web", "cgroup:k/b", Size::Millicpus(500), Some("b")),
        ]));
        let again = again.unwrap_or_else(|e| panic!("{}", error_chain(&e)));
        assert!(again.iter().all(|o| !o.changed()), "{again:?}");
        assert_eq!(f.state_file(), file);
        drop(handle);
        let _ = thread.join();
    }

    #[test]
    fn a_refusal_or_a_failure_partway_leaves_nothing_booked_or_applied() {
        let f = Fixture::new();
        f.write("k/a/cpuset.cpus", "\n");
        f.write("k/b/cpuset.cpus", "\n");
        let (engine, _) = f.start();
        let file = f.state_file();
        let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
        // The second does not fit beside the first: refused by the core, nothing applied.
        let err = rt().block_on(handle.assign_all(vec![
            spec("dp", "cgroup:k/a", Size::Cpus(2), Some("a")),
            spec("dp", "cgroup:k/b", Size::Cpus(4), Some("b")),
        ]));
        assert!(matches!(err, Err(EngineError::State(state::Error::InsufficientCapacity { .. }))), "{err:?}");
        // The second's cgroup does not exist: applying fails after the first was written.
        let err = rt().block_on(handle.assign_all(vec![
            spec("dp", "cgroup:k/a", Size::Cpus(2), Some("a")),
            spec("web", "cgroup:k/gone", Size::Millicpus(500), Some("b")),
        ]));
        assert!(matches!(err, Err(EngineError::Apply(_))), "{err:?}");
        // The same target twice: the second is refused against the first.
        let err = rt().block_on(handle.assign_all(vec![
            spec("dp", "cgroup:k/a", Size::Cpus(2), Some("a")),
            spec("web", "cgroup:k/a", Size::Millicpus(500), Some("b")),
        ]));
        assert!(matches!(err, Err(EngineError::State(state::Error::TargetBusy { .. }))), "{err:?}");
        assert_eq!(handle.snapshot().state.assignments().len(), 0);
        assert_eq!(f.read("k/a/cpuset.cpus"), "");
        assert_eq!(f.read("k/b/cpuset.cpus"), "");
        assert_eq!(f.state_file(), file);
        drop(handle);
        let _ = thread.join();
    }
}
