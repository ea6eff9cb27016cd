//! The prepared DRA claims, one durable owner for each: the claim is the state's
//! ([`crate::core::state::PreparedClaim`]), recorded in the same commit, and so the same
//! journal record, as the assignments that hold its CPUs, and forgotten in the same commit as
//! they are released. The owner loop takes one request at a time, so two prepares of one claim
//! (two pods sharing it), or a prepare and an unprepare, never interleave: the second prepare
//! finds the claim recorded and answers the same, and an unprepare finds all of it or none.
//!
//! ```text
//! PrepareClaim ──► recorded? ──yes──► the record (its CDI spec written again if missing or another)
//!                  └─no─► decide its bookings + record it on one copy ──► commit (one save)
//!                         ──► read back ──► CDI spec written and read back (kubernetes::cdi)
//!                         a failure anywhere: the commit undone, nothing booked or recorded
//! UnprepareClaim ──► release dra-<uid>-<n> + forget it on one copy ──► commit ──► spec removed
//! start ──► records of earlier releases (<state_dir>/dra/<uid>.json) taken into the state,
//!           removed once it is saved; each claim's CDI spec written again if missing or another
//! ```
//!
//! The CDI spec follows from the state: its environment is the CPUs the claim's assignments
//! hold, written after the commit through the CDI directory the settings name, and again when
//! a change of the pools moves them (a shared pool's CPUs, by reload or a pool edit).

pub mod records;

use std::path::{Path, PathBuf};

use super::handle::PrepareClaim;
use super::ledger::{assigned, released, Ledger, Made};
use super::{error_chain, EngineError};
use crate::config::Settings;
use crate::core::cpuset::CpuSet;
use crate::core::dra::names::claim_of;
use crate::core::pool::PoolKind;
use crate::core::state::{self, Assignment, Outcome, PreparedClaim, State};
use crate::kubernetes::cdi::{self, CdiDir};
use records::Claims;

/// Where the prepared claims' CDI specs go, and the driver whose kind they declare.
pub(super) struct ClaimSpecs {
    cdi: CdiDir,
    driver: String,
}

impl ClaimSpecs {
    /// The CDI directory and the driver `settings` name.
    pub(super) fn new(settings: &Settings) -> ClaimSpecs {
        ClaimSpecs {
            cdi: CdiDir::new(&settings.paths.cdi_dir),
            driver: crate::core::dra::driver_name(&settings.kubelet.resource_prefix),
        }
    }

    /// `claim`'s CDI spec: its environment from the CPUs its assignments hold in `state`.
    fn spec(&self, state: &State, claim: &PreparedClaim) -> Result<serde_json::Value, String> {
        let Some(env) = held_env(state, claim) else {
            return Err(
                "its CPUs are no longer held (released behind the driver's back); unprepare it".into()
            );
        };
        cdi::spec(&self.driver, &claim.uid, &env).map_err(|e| format!("its CDI spec: {e}"))
    }

    /// Whether `claim`'s CDI spec is there and what `state` makes it.
    fn current(&self, state: &State, claim: &PreparedClaim) -> bool {
        self.spec(state, claim).is_ok_and(|spec| self.cdi.holds(&claim.uid, &spec))
    }

    /// Writes `claim`'s CDI spec ([`ClaimSpecs::spec`]) and reads it back.
    fn write(&self, state: &State, claim: &PreparedClaim) -> Result<(), String> {
        let spec = self.spec(state, claim)?;
        self.cdi.write(&claim.uid, &spec).map_err(|e| {
            format!("writing its CDI spec in `{}`: {}", self.cdi.path().display(), error_chain(&e))
        })
    }

    /// Removes claim `uid`'s CDI spec; none is no error.
    fn remove(&self, uid: &str) -> Result<(), String> {
        self.cdi.remove(uid).map_err(|e| format!("removing its CDI spec: {}", error_chain(&e)))
    }

    /// After the pools changed from `before` to `after`: writes again the CDI spec of each
    /// claim whose environment changed with them (a shared pool's assignments follow its CPUs).
    /// Containers that run keep the environment they started with, as the kubelet's device
    /// plugin env does; the next container of the claim reads the new CPUs. A spec that cannot
    /// be written stays as it was, and says so.
    pub(super) fn follow(&self, before: &State, after: &State) {
        for (uid, claim) in after.claims() {
            if held_env(before, claim) == held_env(after, claim) {
                continue;
            }
            match self.write(after, claim) {
                Ok(()) => log::info!("DRA: claim {uid}: its CDI spec follows its pool's new CPUs"),
                Err(e) => log::error!("DRA: claim {uid}: {e}; its spec names the CPUs it held before"),
            }
        }
    }

    /// At start: writes again the CDI spec of each claim of `state` whose spec is missing or
    /// not what the state makes it (the pools changed while the daemon was down), and whose
    /// CPUs are all held.
    pub(super) fn restore(&self, state: &State) {
        for (uid, claim) in state.claims() {
            if self.current(state, claim) {
                continue;
            }
            let had = self.cdi.has(uid);
            match self.write(state, claim) {
                Ok(()) if had => {
                    log::info!(
                        "DRA: claim {uid}: its CDI spec was not what the state makes it and is written again"
                    )
                }
                Ok(()) => log::info!("DRA: claim {uid}: its CDI spec was missing and is written again"),
                Err(e) => log::warn!("DRA: claim {uid}: {e}"),
            }
        }
    }
}

impl Ledger {
    /// [`super::Request::PrepareClaim`]: see the module docs.
    pub(super) fn prepare_claim(
        &mut self,
        p: PrepareClaim,
        specs: &ClaimSpecs,
    ) -> Result<Made<Outcome<PreparedClaim>>, EngineError> {
        let uid = p.claim.uid.clone();
        if let Some(had) = self.state.claim(&uid).cloned() {
            if !specs.current(&self.state, &had) {
                specs.write(&self.state, &had).map_err(EngineError::Claim)?;
                log::info!("DRA: claim {uid}: its CDI spec was missing or another and is written again");
            }
            return Ok((Outcome::Identity(had), Vec::new()));
        }
        own_bookings(&p)?;
        let mut next = (*self.state).clone();
        let mut made = Vec::new();
        for spec in p.specs {
            let spec = self.stamp(spec)?;
            if let Outcome::Changed(a) = self.decide(&mut next, &spec)? {
                made.push(a);
            }
        }
        next.record_claim(p.claim.clone());
        let before = self.state.clone();
        let changes = self.commit(next)?;
        let failed = match made.iter().find_map(|a| self.verify(a).err()) {
            Some(e) => Some(e),
            None => specs.write(&self.state, &p.claim).err().map(|e| {
                let _ = specs.remove(&uid);
                EngineError::Claim(format!("{e}; its CPUs were given back"))
            }),
        };
        if let Some(e) = failed {
            let mut back = (*before).clone();
            back.mark(&changes);
            if let Err(undo) = self.commit(back) {
                log::error!("DRA: taking back claim {uid} failed: {}", error_chain(&undo));
            }
            return Err(e);
        }
        let events = made.iter().flat_map(assigned).collect();
        Ok((Outcome::Changed(p.claim), events))
    }

    /// [`super::Request::UnprepareClaim`]: its assignments (found by their names, so that
    /// bookings a crash of an earlier release left without a record go too) released and the
    /// claim forgotten in one commit, then its CDI spec removed.
    pub(super) fn unprepare_claim(
        &mut self,
        uid: &str,
        specs: &ClaimSpecs,
    ) -> Result<Made<Vec<Assignment>>, EngineError> {
        let mut next = (*self.state).clone();
        let ids: Vec<state::AssignmentId> =
            next.assignments().keys().filter(|id| claim_of(id.as_str()) == Some(uid)).cloned().collect();
        let mut gone = Vec::with_capacity(ids.len());
        for id in &ids {
            gone.push(next.release(id.as_str())?);
        }
        next.forget_claim(uid);
        if !next.changes().is_empty() {
            self.commit(next)?;
        }
        specs.remove(uid).map_err(EngineError::Claim)?;
        let events = gone.iter().flat_map(released).collect();
        Ok((gone, events))
    }

    /// Start: takes the claim records of earlier releases found below `state_dir` into the
    /// state (a record that cannot be trusted or read is left where it is, and said); returns
    /// the uids taken, whose files go once the state holding them is saved ([`remove_records`]).
    pub(super) fn take_records(&mut self, state_dir: &Path) -> Vec<String> {
        let records = Claims::new(state_dir);
        let uids = match records.uids() {
            Ok(u) => u,
            Err(e) => {
                log::warn!("DRA: listing the claim records of an earlier release: {}", error_chain(&e));
                return Vec::new();
            }
        };
        let mut next = (*self.state).clone();
        let mut taken = Vec::new();
        for uid in uids {
            match records.load(&uid) {
                Ok(Some(rec)) => {
                    next.record_claim(rec);
                    taken.push(uid);
                }
                Ok(None) => {}
                Err(e) => log::error!("DRA: claim {uid}: {}; it is not served", error_chain(&e)),
            }
        }
        // Saved whole by the start's compaction, like everything loaded.
        next.take_changes();
        self.state = std::sync::Arc::new(next);
        taken
    }
}

/// Removes the records `uids` taken into the state (the state holding them is saved).
pub(super) fn remove_records(state_dir: &Path, uids: &[String]) {
    let records = Claims::new(state_dir);
    for uid in uids {
        match records.remove(uid) {
            Ok(()) => log::info!("DRA: claim {uid}: its record of an earlier release is now in the state"),
            Err(e) => {
                log::warn!("DRA: claim {uid}: removing its record, now in the state: {}", error_chain(&e))
            }
        }
    }
    // The directory goes once it is empty; one left holding a record not taken stays.
    let _ = std::fs::remove_dir(PathBuf::from(state_dir).join(records::DIR));
}

/// Refuses a prepare whose bookings are not the claim's own assignments, in order.
fn own_bookings(p: &PrepareClaim) -> Result<(), state::Error> {
    let uid = p.claim.uid.as_str();
    let own = p.claim.assignments.iter().all(|a| claim_of(a.as_str()) == Some(uid))
        && p.claim.assignments.iter().eq(p.specs.iter().filter_map(|s| s.id.as_ref()))
        && p.specs.len() == p.claim.assignments.len();
    if own {
        return Ok(());
    }
    Err(state::Error::InvalidArgument {
        arg: "assignments",
        reason: format!(
            "claim {}: its bookings are not its assignments dra-<uid>-<n>, in order",
            crate::core::echo(uid)
        ),
    })
}

/// The container environment of `claim` in `state`; `None` when some of its CPUs are no
/// longer held there.
fn held_env(state: &State, claim: &PreparedClaim) -> Option<Vec<(String, String)>> {
    let held: Option<Vec<&Assignment>> =
        claim.assignments.iter().map(|id| state.assignments().get(id)).collect();
    held.map(|held| env(&claim.uid, &held))
}

/// The container environment of a claim holding `held`: as the device plugin gives its
/// containers, with the claim named for the NRI plugin.
fn env(uid: &str, held: &[&Assignment]) -> Vec<(String, String)> {
    use cpupool_wire::names as n;
    let cpus = held.iter().fold(CpuSet::new(), |acc, a| acc.union(&a.cpus)).to_string();
    let join = |f: &dyn Fn(&Assignment) -> String| held.iter().map(|a| f(a)).collect::<Vec<_>>().join(",");
    let exclusive = held.iter().all(|a| a.kind == PoolKind::Exclusive);
    vec![
        (n::ENV_CPUS.to_owned(), cpus.clone()),
        (n::ENV_POOL.to_owned(), join(&|a| a.pool.to_string())),
        ((if exclusive { n::ENV_EXCLUSIVE_CPUS } else { n::ENV_SHARED_CPUS }).to_owned(), cpus),
        (n::ENV_ASSIGNMENT.to_owned(), join(&|a| a.id.to_string())),
        (n::ENV_CLAIM.to_owned(), uid.to_owned()),
    ]
}

#[cfg(test)]
mod tests;
