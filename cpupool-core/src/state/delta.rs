//! What a run of mutations changed ([`Changes`]) and its persisted effect ([`Delta`]), one
//! journal record: the assignments and the prepared claims touched, as they are now, and the
//! pools when they were replaced. A claim and the assignments that hold its CPUs change in one
//! record, so a replay never finds one without the other.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{Assignment, AssignmentId, PreparedClaim, State};
use crate::pool::{Pool, PoolName};

/// What a run of mutations touched: the assignments added, removed or changed, the prepared
/// claims recorded or forgotten, and whether the pools were replaced. The engine plans and
/// persists only these ([`State::delta`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Assignments added, removed or changed.
    pub assignments: BTreeSet<AssignmentId>,
    /// Claims (by uid) recorded or forgotten.
    pub claims: BTreeSet<String>,
    /// Whether the pools were replaced (a reload).
    pub pools: bool,
}

impl Changes {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.assignments.is_empty() && self.claims.is_empty() && !self.pools
    }

    /// Adds what `other` touched.
    pub fn merge(&mut self, other: &Changes) {
        self.assignments.extend(other.assignments.iter().cloned());
        self.claims.extend(other.claims.iter().cloned());
        self.pools |= other.pools;
    }
}

/// The persisted effect of some mutations, as one record: what the touched assignments are now
/// (present ones in `upsert`, gone ones in `remove`), the same for the prepared claims, the
/// pools when they were replaced, and the id counter. Applying it to the state it was taken
/// against gives the state it was taken from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Delta {
    /// The pools, when they were replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pools: Option<BTreeMap<PoolName, Pool>>,
    /// Assignments added or changed, whole.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upsert: Vec<Assignment>,
    /// Assignments removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<AssignmentId>,
    /// Claims recorded, whole.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<PreparedClaim>,
    /// Claims forgotten, by uid.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forget: Vec<String>,
    /// The counter for made-up ids.
    pub next_id: u64,
}

impl State {
    /// The record of what `changes` touched, as this state has it now.
    pub fn delta(&self, changes: &Changes) -> Delta {
        let mut delta = Delta {
            pools: changes.pools.then(|| self.data.pools.clone()),
            next_id: self.data.next_id,
            ..Delta::default()
        };
        for id in &changes.assignments {
            match self.data.assignments.get(id) {
                Some(a) => delta.upsert.push(a.clone()),
                None => delta.remove.push(id.clone()),
            }
        }
        for uid in &changes.claims {
            match self.data.claims.get(uid) {
                Some(c) => delta.claims.push(c.clone()),
                None => delta.forget.push(uid.clone()),
            }
        }
        delta
    }

    /// Applies a [`Delta`] (replaying the journal), recording what it touched.
    pub fn apply(&mut self, delta: Delta) {
        if let Some(pools) = delta.pools {
            self.data.pools = pools;
            self.changes.pools = true;
        }
        for id in delta.remove {
            if let Some(a) = self.data.assignments.remove(&id) {
                self.remove_usage(&a);
            }
            self.changes.assignments.insert(id);
        }
        for a in delta.upsert {
            if let Some(old) = self.data.assignments.remove(&a.id) {
                self.remove_usage(&old);
            }
            self.changes.assignments.insert(a.id.clone());
            self.add_usage(&a);
            self.data.assignments.insert(a.id.clone(), a);
        }
        for uid in delta.forget {
            self.data.claims.remove(&uid);
            self.changes.claims.insert(uid);
        }
        for c in delta.claims {
            self.changes.claims.insert(c.uid.clone());
            self.data.claims.insert(c.uid.clone(), c);
        }
        self.data.next_id = delta.next_id;
        if self.changes.pools {
            // New pools start with no usage; rebuild it against them.
            self.rebuild_usage();
        }
    }
}
