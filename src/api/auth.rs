//! Authorization of the mutating methods, shared by both interfaces.
//!
//! varlink knows its peer from `SO_PEERCRED`; D-Bus asks the bus (`GetConnectionUnixUser`),
//! which took the same record from the kernel when the client connected. Either way the
//! decision is the same: uid 0, the sandbox's owner, or a member of the admin group.

use crate::api::error::{access_denied, access_denied_because, ApiError};
use crate::threads::ThreadError;

/// Who may call the mutating methods (`Assign`, `Release`, `CreatePool`, `ResizePool`,
/// `DeletePool`): root, the admin group, and in the sandbox its owner.
#[derive(Debug, Clone, Default)]
pub struct Authorizer {
    /// Members of this group (primary or supplementary) may mutate.
    pub admin_gid: Option<u32>,
    /// This user may mutate too: the sandbox's owner, so an unprivileged sandbox is usable.
    pub owner_uid: Option<u32>,
    /// Where processes are found, to check who owns a process handed to `Run`.
    pub proc_root: std::path::PathBuf,
}

/// What the kernel says about a peer, plus the supplementary groups of its user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Peer {
    /// `SO_PEERCRED` uid.
    pub uid: u32,
    /// `SO_PEERCRED` gid.
    pub gid: u32,
    /// The user's supplementary groups from the group database (only looked up when needed).
    pub groups: Vec<u32>,
}

impl Authorizer {
    /// Whether `peer` may mutate without looking at supplementary groups: root, the owner, or
    /// the admin group as primary group.
    pub fn allows_by_ids(&self, peer: &Peer) -> bool {
        peer.uid == 0 || self.owner_uid == Some(peer.uid) || self.admin_gid == Some(peer.gid)
    }

    /// Whether `peer` may mutate.
    pub fn allows(&self, peer: &Peer) -> bool {
        self.allows_by_ids(peer) || self.admin_gid.is_some_and(|g| peer.groups.contains(&g))
    }

    /// Checks the connection's peer, filling in its groups if the ids alone do not decide.
    ///
    /// Supplementary groups come from the group database for the peer's uid
    /// (`getgrouplist`), not from `/proc/<pid>/status`: the pid in `SO_PEERCRED` may have
    /// exited and been reused by another process by the time we look, and the socket may
    /// have been passed on, so reading that pid's groups could grant a stranger's rights.
    /// The uid and gid themselves are the kernel's record from `connect()` and cannot be
    /// spoofed. The cost: a group change in `/etc/group` counts before the user logs in
    /// again, and groups dropped by the process (`setgroups`) still count.
    pub async fn check(&self, peer: &mut Option<Peer>, looked_up: &mut bool) -> Result<(), ApiError> {
        let Some(p) = peer.as_mut() else {
            // No credentials: cannot decide, so refuse.
            return Err(access_denied(u32::MAX));
        };
        if self.allows_by_ids(p) {
            return Ok(());
        }
        if self.admin_gid.is_some() && !*looked_up {
            p.groups = groups_of(p.uid, p.gid).await.map_err(|e| lookup_failed(p.uid, &e))?;
            *looked_up = true;
        }
        if self.allows(p) {
            Ok(())
        } else {
            Err(access_denied(p.uid))
        }
    }
}

/// `AccessDenied` for `uid` because its groups could not be looked up: it may be allowed, but
/// that cannot be told now.
fn lookup_failed(uid: u32, e: &ThreadError) -> ApiError {
    access_denied_because(uid, &format!("its groups could not be looked up: {}", crate::error_chain(e)))
}

/// [`supplementary_groups`] on a thread of its own ([`crate::threads::run_blocking`]): the group
/// database may be NSS-backed (LDAP, sssd), so it never blocks a runtime worker, and a thread
/// the system refuses is an error, not a panic.
pub async fn groups_of(uid: u32, gid: u32) -> Result<Vec<u32>, ThreadError> {
    crate::threads::run_blocking("a group database lookup", move || supplementary_groups(uid, gid)).await
}

/// The groups of user `uid` (primary group `gid`) in the group database. It may be NSS-backed
/// (LDAP, sssd): call it off the async workers ([`groups_of`]).
pub fn supplementary_groups(uid: u32, gid: u32) -> Vec<u32> {
    use nix::unistd::{getgrouplist, Gid, Uid, User};
    let user = match User::from_uid(Uid::from_raw(uid)) {
        Ok(Some(u)) => u,
        _ => return Vec::new(),
    };
    let Ok(name) = std::ffi::CString::new(user.name) else { return Vec::new() };
    getgrouplist(&name, Gid::from_raw(gid))
        .map(|gs| gs.into_iter().map(Gid::as_raw).collect())
        .unwrap_or_default()
}

impl Authorizer {
    /// Checks that the caller may hand process `pid` to the daemon (`Run`): root and the
    /// sandbox's owner may hand any; others only their own.
    pub fn check_process(&self, pid: u32, uid: u32) -> Result<(), ApiError> {
        let uid = if self.owner_uid == Some(uid) { 0 } else { uid };
        // Root needs no answer from procfs; anyone else is decided by the process's owner.
        let owner =
            if uid == 0 { None } else { crate::host::procfs::process_owner(&self.proc_root, pid).ok() };
        crate::api::args::check_process_owner(owner, pid, uid)
    }

    /// Whether a caller known only by uid (the D-Bus case) may mutate: root and the owner may;
    /// anyone else only by the admin group, as the user database says (its primary group and
    /// supplementary groups, looked up on a thread of its own). `Err`: that thread could not be
    /// started, so it cannot be told.
    pub async fn allows_uid(&self, uid: u32) -> Result<bool, ThreadError> {
        if let Some(decided) = self.decides_uid(uid) {
            return Ok(decided);
        }
        let Some(admin) = self.admin_gid else { return Ok(false) };
        crate::threads::run_blocking("a user database lookup", move || {
            let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)).ok().flatten();
            // An unknown user has no groups: only its uid could decide, and it did not.
            user.is_some_and(|u| {
                u.gid.as_raw() == admin || supplementary_groups(uid, u.gid.as_raw()).contains(&admin)
            })
        })
        .await
    }

    /// Whether `uid` may mutate, when its id alone decides (root, the owner, or no admin group
    /// to be in); `None`: only the user database can tell ([`Authorizer::allows_uid`]).
    pub fn decides_uid(&self, uid: u32) -> Option<bool> {
        if uid == 0 || self.owner_uid == Some(uid) {
            return Some(true);
        }
        self.admin_gid.is_none().then_some(false)
    }

    /// Checks a caller known only by uid: [`Authorizer::allows_uid`], as an API error.
    pub async fn check_uid(&self, uid: u32) -> Result<(), ApiError> {
        match self.allows_uid(uid).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(access_denied(uid)),
            Err(e) => Err(lookup_failed(uid, &e)),
        }
    }
}
