//! Budgets per class of caller, shared by both interfaces: what one peer, and all unprivileged
//! peers together, may hold of the daemon at once.
//!
//! varlink counts connections ([`crate::api::varlink::Limits`]), D-Bus counts calls in flight
//! ([`crate::api::dbus::CallLimits`]); the rule is the same:
//! - *privileged* peers (those the [`Authorizer`](crate::api::auth::Authorizer) lets mutate:
//!   root, the admin group, the sandbox's owner) have room of their own, which unprivileged
//!   peers never use;
//! - every other uid has at most [`Shares::per_uid`], and all of them together at most
//!   [`Shares::unprivileged`].
//!
//! So no unprivileged user, nor all of them together, can take root's room. What is over its
//! budget is refused `Busy` at once, never queued.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The size of each class's room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shares {
    /// Privileged peers, all together.
    pub privileged: usize,
    /// All unprivileged peers together.
    pub unprivileged: usize,
    /// One unprivileged uid.
    pub per_uid: usize,
}

/// Which room a peer draws on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Root, the admin group, the sandbox's owner.
    Privileged,
    /// Anyone else, by uid (`u32::MAX`: a peer without credentials).
    Unprivileged(u32),
}

/// Held, per [`Class`].
#[derive(Debug, Default)]
pub(crate) struct Counts {
    privileged: usize,
    unprivileged: usize,
    pub(crate) per_uid: HashMap<u32, usize>,
}

/// The budgets of [`Shares`]. Each admitted connection or call holds a [`Slot`], given back when
/// it is dropped, however its holder ends.
#[derive(Debug)]
pub struct Budget {
    shares: Shares,
    counts: Mutex<Counts>,
}

/// Which budget was exhausted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// Privileged peers'.
    Privileged,
    /// All unprivileged peers'.
    Unprivileged,
    /// One uid's.
    Uid(u32),
}

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Full::Privileged => write!(f, "privileged peers"),
            Full::Unprivileged => write!(f, "unprivileged peers"),
            Full::Uid(uid) => write!(f, "uid {uid}"),
        }
    }
}

/// One connection's or call's place in the [`Budget`].
#[derive(Debug)]
pub struct Slot {
    budget: Arc<Budget>,
    class: Class,
}

impl Budget {
    /// A budget with nothing held.
    pub fn new(shares: Shares) -> Arc<Budget> {
        Arc::new(Budget { shares, counts: Mutex::new(Counts::default()) })
    }

    pub(crate) fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        // The counters stay consistent even if a holder panicked: each update is one step.
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a peer of `class`, or which budget is full.
    pub fn admit(self: &Arc<Self>, class: Class) -> Result<Slot, Full> {
        let mut c = self.counts();
        match class {
            Class::Privileged if c.privileged >= self.shares.privileged => return Err(Full::Privileged),
            Class::Privileged => c.privileged += 1,
            Class::Unprivileged(uid) => {
                let mine = c.per_uid.get(&uid).copied().unwrap_or(0);
                if mine >= self.shares.per_uid {
                    return Err(Full::Uid(uid));
                }
                if c.unprivileged >= self.shares.unprivileged {
                    return Err(Full::Unprivileged);
                }
                c.unprivileged += 1;
                c.per_uid.insert(uid, mine + 1);
            }
        }
        Ok(Slot { budget: self.clone(), class })
    }

    /// (privileged, unprivileged) places held.
    pub fn held(&self) -> (usize, usize) {
        let c = self.counts();
        (c.privileged, c.unprivileged)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.budget.counts();
        match self.class {
            Class::Privileged => c.privileged = c.privileged.saturating_sub(1),
            Class::Unprivileged(uid) => {
                c.unprivileged = c.unprivileged.saturating_sub(1);
                // Uids holding nothing are forgotten, so the map stays as small as the budget.
                if let Some(n) = c.per_uid.get_mut(&uid) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        c.per_uid.remove(&uid);
                    }
                }
            }
        }
    }
}

/// How long a group-database answer (is this uid in the admin group?) is trusted.
pub const ADMIN_CACHE_TTL: Duration = Duration::from_secs(60);
/// At most this many uids' answers are kept; older ones are dropped first.
const ADMIN_CACHE_SIZE: usize = 1024;

/// Whether uids are privileged, as the group database said recently: a flood from one uid
/// costs one lookup.
#[derive(Debug, Default)]
pub struct AdminCache(HashMap<u32, (bool, Instant)>);

impl AdminCache {
    /// What was said about `uid` within [`ADMIN_CACHE_TTL`].
    pub fn get(&self, uid: u32) -> Option<bool> {
        self.0.get(&uid).filter(|(_, at)| at.elapsed() < ADMIN_CACHE_TTL).map(|(admin, _)| *admin)
    }

    /// Keeps what the group database said about `uid`.
    pub fn insert(&mut self, uid: u32, admin: bool) {
        if self.0.len() >= ADMIN_CACHE_SIZE {
            self.0.retain(|_, (_, at)| at.elapsed() < ADMIN_CACHE_TTL);
            if self.0.len() >= ADMIN_CACHE_SIZE {
                self.0.clear();
            }
        }
        self.0.insert(uid, (admin, Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_keep_room_for_privileged_peers_and_are_given_back() {
        let b = Budget::new(Shares { privileged: 2, unprivileged: 3, per_uid: 2 });
        let nobody = Class::Unprivileged(65534);
        let other = Class::Unprivileged(1000);
        let n1 = b.admit(nobody).unwrap_or_else(|e| panic!("{e}"));
        let _n2 = b.admit(nobody).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.admit(nobody).err(), Some(Full::Uid(65534)));
        let _o1 = b.admit(other).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.admit(other).err(), Some(Full::Unprivileged));
        // Unprivileged peers filled their budget; privileged ones have their own.
        let r1 = b.admit(Class::Privileged).unwrap_or_else(|e| panic!("{e}"));
        let _r2 = b.admit(Class::Privileged).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.admit(Class::Privileged).err(), Some(Full::Privileged));
        assert_eq!(b.held(), (2, 3));
        drop(n1);
        drop(r1);
        assert_eq!(b.held(), (1, 2));
        let _o2 = b.admit(other).unwrap_or_else(|e| panic!("{e}"));
        let _r3 = b.admit(Class::Privileged).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.counts().per_uid.len(), 2);
    }
}
