//! Replies built once per snapshot and shared by every caller reading that snapshot: the
//! varlink list messages and D-Bus's `ListAssignments` structures.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::core::pool::PoolName;
use crate::core::state::{AssignmentId, State};
use crate::engine::Snapshot;

/// What list replies are built from, held so that it can be recognized in a later snapshot.
///
/// A list of assignments depends on the state, on the assignments' health and on the containers
/// read back running on claims' CPUs (their phase), a list of pools on the state and on the
/// partitions. The engine publishes a new `Arc<State>` for every new
/// state and never changes a state behind an `Arc` others hold (this holds one), so the same
/// pointer is the same state. Health and partitions are rebuilt at every publish, even when
/// they did not change (a drift check that found nothing), so those are compared by value;
/// they are small (degraded assignments, one entry per pool, the claims of several devices
/// with a container).
struct Basis {
    state: Arc<State>,
    health: Arc<BTreeMap<AssignmentId, String>>,
    partitions: Arc<BTreeMap<PoolName, String>>,
    kubelet: Arc<crate::engine::KubeletView>,
}

impl Basis {
    fn of(snap: &Snapshot) -> Basis {
        Basis {
            state: snap.state.clone(),
            health: snap.assignment_health.clone(),
            partitions: snap.partitions.clone(),
            kubelet: snap.kubelet.clone(),
        }
    }

    fn matches(&self, snap: &Snapshot) -> bool {
        fn same<T: PartialEq>(a: &Arc<T>, b: &Arc<T>) -> bool {
            Arc::ptr_eq(a, b) || **a == **b
        }
        Arc::ptr_eq(&self.state, &snap.state)
            && same(&self.health, &snap.assignment_health)
            && same(&self.partitions, &snap.partitions)
            && (Arc::ptr_eq(&self.kubelet, &snap.kubelet) || self.kubelet.running == snap.kubelet.running)
    }
}

/// Replies built once per snapshot and shared by every caller reading that snapshot.
///
/// A list of 10,000 assignments is about 1 MB of JSON; building it for each caller, as a tree
/// of values first, made 64 concurrent callers cost the daemon hundreds of MiB. Here the first
/// caller after a change builds the reply (`key` tells apart the lists of one snapshot: all
/// assignments, one pool's, the pools), later and concurrent callers wait for it and get the
/// same `Arc`, and a new snapshot drops what the old one built. What is kept is bounded by the
/// keys callers can ask for: a list per pool that exists plus the whole lists.
pub struct PerSnapshot<T> {
    slot: tokio::sync::Mutex<Built<T>>,
}

struct Built<T> {
    basis: Option<Basis>,
    replies: HashMap<String, Arc<T>>,
}

impl<T> Default for PerSnapshot<T> {
    fn default() -> Self {
        PerSnapshot { slot: tokio::sync::Mutex::new(Built { basis: None, replies: HashMap::new() }) }
    }
}

impl<T> PerSnapshot<T> {
    /// The reply `key` for `snap`: built by `build` unless a caller of the same snapshot built
    /// it already. A failed build is not kept.
    pub async fn get_or_build<E>(
        &self,
        snap: &Snapshot,
        key: &str,
        build: impl FnOnce() -> Result<T, E>,
    ) -> Result<Arc<T>, E> {
        // Held while building, so that callers arriving meanwhile wait for this build instead of
        // each making their own.
        let mut built = self.slot.lock().await;
        if !built.basis.as_ref().is_some_and(|b| b.matches(snap)) {
            built.basis = Some(Basis::of(snap));
            built.replies.clear();
        }
        if let Some(reply) = built.replies.get(key) {
            return Ok(reply.clone());
        }
        let reply = Arc::new(build()?);
        built.replies.insert(key.to_owned(), reply.clone());
        Ok(reply)
    }
}
