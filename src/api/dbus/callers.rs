//! Who calls the D-Bus interface, and what their calls in flight hold: the caller's uid (the
//! bus's answer to `GetConnectionUnixUser`, kept per unique name), whether it is privileged,
//! and its place in the budget of calls in flight ([`CallLimits`], the same rule as varlink's
//! connections, see [`crate::api::budget`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::Error;
use crate::api::auth::Authorizer;
use crate::api::budget::{AdminCache, Budget, Class, Shares, Slot};
use crate::api::error::{access_denied, access_denied_because, busy_calls};

/// How many calls may await their answer at once, per class of caller (see
/// [`crate::api::budget`]); a call beyond is answered `Busy`.
pub struct CallLimits;

impl CallLimits {
    /// Root, the admin group and the sandbox's owner, together: far more than `cpupoolctl` and
    /// monitors need.
    pub const PRIVILEGED: usize = 256;
    /// All unprivileged uids together.
    pub const UNPRIVILEGED: usize = 64;
    /// One unprivileged uid.
    pub const PER_UID: usize = 16;
    /// The shares of [`Budget`].
    pub const SHARES: Shares = Shares {
        privileged: CallLimits::PRIVILEGED,
        unprivileged: CallLimits::UNPRIVILEGED,
        per_uid: CallLimits::PER_UID,
    };
}

/// Callers' uids by unique name: a name is never given to another connection during the bus's
/// life, so an answer stays true. At most this many are kept; the oldest go first.
const SENDERS_KEPT: usize = 4096;

/// Unique names to what is known of them, and the names in the order they came.
type Senders = (HashMap<String, Arc<Sender>>, std::collections::VecDeque<String>);

/// One connection calling: its uid once the bus said it, and how many of its calls wait for
/// that answer.
#[derive(Default)]
pub(super) struct Sender {
    pub(super) uid: tokio::sync::OnceCell<u32>,
    waiting: AtomicUsize,
}

/// A call of a connection whose uid (or whether that uid is privileged) is not known yet: it is
/// asked on a task of its own ([`super::Core::admit`]). At most [`CallLimits::PER_UID`] of a
/// connection's calls wait so (a bus round trip, once per connection: until then it counts as
/// unprivileged); more are `Busy`, so new connections cannot pile up tasks without bound either.
pub(super) struct Waiting(Option<Arc<Sender>>);

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(sender) = &self.0 {
            sender.waiting.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// What zbus's dispatcher decides about a call before it reads the next message, so that a
/// flood of unprivileged calls on the daemon's one bus connection is refused as it is read and
/// a privileged call behind it starts at once, on a task of its own (see [`super::interface`]).
pub(super) enum Gate {
    /// Admitted within its caller's budget.
    Admitted(Caller),
    /// Its caller is not known yet: a task asks who it is, then admits or refuses it.
    Unknown(Waiting),
    /// Beyond its caller's budget: `Busy`, decided at once (sent by [`super::refusals`]).
    Refused(Error),
}

/// Who calls, and what their calls in flight hold.
pub(super) struct Callers {
    pub(super) budget: Arc<Budget>,
    /// Privileged calls go first.
    pub(super) priority: Arc<Priority>,
    /// Unique name to uid (asked of the bus once, however many calls of the connection arrive
    /// at once), and the names in the order they came.
    senders: std::sync::Mutex<Senders>,
    /// Whether uids are privileged; held while the user database is asked, so that a flood of
    /// one uid's calls asks once.
    pub(super) admins: tokio::sync::Mutex<AdminCache>,
}

/// Privileged calls admitted and not yet answered. An admitted unprivileged call starts its
/// handler only when there are none, so that root's call read behind a flood does not wait for
/// the CPU behind the unprivileged calls admitted before it (they hold their place in the
/// budget meanwhile, so the wait is bounded too).
///
/// They also wait [`ANTICIPATE`] after the last privileged call is answered: a privileged
/// client's next call is usually on its way (one bus round trip), and the `Busy` answers and
/// handlers let go in between would bring as many new unprivileged calls into the socket in
/// front of it (as an anticipatory I/O scheduler waits for the next read of the process it
/// just served).
#[derive(Default)]
pub(super) struct Priority {
    privileged: AtomicUsize,
    idle: tokio::sync::Notify,
    /// When the last privileged call was answered.
    last: Mutex<Option<std::time::Instant>>,
}

/// How long unprivileged calls wait after a privileged call is answered: longer than a bus
/// round trip under load, short enough that a flood is answered all the same.
pub(super) const ANTICIPATE: std::time::Duration = std::time::Duration::from_millis(5);

/// One privileged call in [`Priority`], until dropped.
pub(super) struct Ahead(Arc<Priority>);

impl Priority {
    /// Counts a privileged call until the guard is dropped.
    pub(super) fn ahead(self: &Arc<Self>) -> Ahead {
        self.privileged.fetch_add(1, Ordering::AcqRel);
        Ahead(self.clone())
    }

    /// Returns once no privileged call is admitted and unanswered.
    pub(super) async fn after_privileged(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.privileged.load(Ordering::Acquire) == 0 {
                let last = *self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let Some(wait) = last.and_then(|at| ANTICIPATE.checked_sub(at.elapsed())) else {
                    return;
                };
                tokio::time::sleep(wait).await;
                continue;
            }
            idle.await;
        }
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        *self.0.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(std::time::Instant::now());
        if self.0.privileged.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// An admitted call: its caller and its place in the budget, held until it is answered.
pub(super) struct Caller {
    pub(super) uid: u32,
    /// `Err`: whether it is privileged could not be told (the reason).
    privileged: Result<bool, String>,
    _slot: Slot,
}

impl Callers {
    pub(super) fn new() -> Callers {
        Callers {
            budget: Budget::new(CallLimits::SHARES),
            priority: Arc::default(),
            senders: std::sync::Mutex::new(Default::default()),
            admins: tokio::sync::Mutex::new(AdminCache::default()),
        }
    }

    /// A call of `uid` (`privileged`: whether it may mutate), within its budget, or `Busy`.
    pub(super) fn admit(&self, uid: u32, privileged: Result<bool, String>) -> Result<Caller, Error> {
        let class = if privileged == Ok(true) { Class::Privileged } else { Class::Unprivileged(uid) };
        match self.budget.admit(class) {
            Ok(slot) => Ok(Caller { uid, privileged, _slot: slot }),
            Err(full) => {
                CALL_REFUSALS.note(&format!("the calls in flight of {full} at their limit"));
                Err(busy_calls(&full.to_string()).into())
            }
        }
    }

    /// Decides at once about a call of `sender` (`None`: a peer-to-peer call, never known) when
    /// its uid and whether it is privileged are known: the uid from an earlier call of the same
    /// connection, the privilege from its id alone or from [`AdminCache`] if nobody is writing
    /// it just now. Never waits.
    pub(super) fn gate(&self, auth: &Authorizer, sender: Option<&str>) -> Gate {
        let Some(sender) = sender.map(|s| self.sender(s)) else { return Gate::Unknown(Waiting(None)) };
        if let Some(&uid) = sender.uid.get() {
            let known = auth.decides_uid(uid).or_else(|| self.admins.try_lock().ok()?.get(uid));
            if let Some(privileged) = known {
                return match self.admit(uid, Ok(privileged)) {
                    Ok(caller) => Gate::Admitted(caller),
                    Err(e) => Gate::Refused(e),
                };
            }
        }
        let before = sender.waiting.fetch_add(1, Ordering::AcqRel);
        let waiting = Waiting(Some(sender));
        if before >= CallLimits::PER_UID {
            CALL_REFUSALS.note("the calls of a connection not identified yet at their limit");
            return Gate::Refused(busy_calls("a connection not identified yet").into());
        }
        Gate::Unknown(waiting)
    }

    /// What is known of `sender`, kept for its next calls.
    pub(super) fn sender(&self, sender: &str) -> Arc<Sender> {
        let mut guard = self.senders.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (map, order) = &mut *guard;
        if let Some(cell) = map.get(sender) {
            return cell.clone();
        }
        let cell = Arc::new(Sender::default());
        map.insert(sender.to_owned(), cell.clone());
        order.push_back(sender.to_owned());
        while order.len() > SENDERS_KEPT {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
        cell
    }
}

/// Calls refused `Busy`, in a log line at most every 10 s.
static CALL_REFUSALS: crate::fds::Refusals = crate::fds::Refusals::calls("D-Bus");

impl Caller {
    /// Whether the caller may mutate (so its calls go first).
    pub(super) fn is_privileged(&self) -> bool {
        self.privileged == Ok(true)
    }

    /// Checks that the caller may mutate; its uid.
    pub(super) fn authorize(&self) -> Result<u32, Error> {
        match &self.privileged {
            Ok(true) => Ok(self.uid),
            Ok(false) => Err(access_denied(self.uid).into()),
            Err(why) => Err(access_denied_because(
                self.uid,
                &format!("whether it is in the admin group could not be told: {why}"),
            )
            .into()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::api::dbus::ERROR_PREFIX;

    #[test]
    fn calls_beyond_an_unprivileged_share_are_busy_and_root_keeps_its_room() {
        let callers = Callers::new();
        let nobody: Vec<Caller> = (0..CallLimits::PER_UID)
            .map(|_| callers.admit(65534, Ok(false)).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        let e = callers.admit(65534, Ok(false)).err().unwrap_or_else(|| panic!("admitted beyond the share"));
        assert_eq!(e.name(), format!("{ERROR_PREFIX}.Busy"));
        assert!(e.message.contains("uid 65534"), "{e}");
        // Other uids fill the unprivileged budget; root and a caller whose privilege could not
        // be told are apart: root has its room, the other counts as unprivileged.
        let others: Vec<Caller> = (0..CallLimits::UNPRIVILEGED - CallLimits::PER_UID)
            .map(|i| callers.admit(1000 + (i % 4) as u32, Ok(false)).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        assert!(callers.admit(2000, Err("no thread".into())).is_err());
        let root: Vec<Caller> = (0..CallLimits::PRIVILEGED)
            .map(|_| callers.admit(0, Ok(true)).unwrap_or_else(|e| panic!("root refused: {e}")))
            .collect();
        assert!(root[0].authorize().is_ok());
        assert_eq!(
            nobody[0].authorize().err().map(|e| e.name().to_owned()),
            Some(format!("{ERROR_PREFIX}.AccessDenied"))
        );
        // Answered calls give their room back.
        drop(nobody);
        assert!(callers.admit(65534, Ok(false)).is_ok());
        drop((others, root));
        assert_eq!(callers.budget.held(), (0, 0));
    }

    #[test]
    fn a_caller_whose_privilege_cannot_be_told_is_denied_with_the_reason() {
        let callers = Callers::new();
        let c =
            callers.admit(1000, Err("starting a thread: EAGAIN".into())).unwrap_or_else(|e| panic!("{e}"));
        let e = c.authorize().err().unwrap_or_else(|| panic!("allowed"));
        assert_eq!(e.name(), format!("{ERROR_PREFIX}.AccessDenied"));
        assert!(e.message.contains("EAGAIN"), "{e}");
    }
}
