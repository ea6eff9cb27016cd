//! The DRA claim records of earlier releases: one JSON file per prepared claim, `<uid>.json`,
//! in `<state_dir>/dra/`. A prepared claim is now the engine's state, saved in its journal
//! with the assignments that hold its CPUs ([`crate::core::state::PreparedClaim`]); the engine
//! reads these files once at start, takes the claims they record into the state, and removes
//! them once the state holding them is saved.
//!
//! ```text
//! <state_dir>/dra/<uid>.json ──load (start, once)──► engine state (claims) ──► removed
//! ```
//!
//! A record decides which containers get which CPUs, so it is held to the state files' rule
//! ([`Root::read_own`]: one every user may write is refused, another owner warned of), and it
//! may name only its own claim's assignments (`dra-<uid>-<n>`,
//! [`assignment_name`](crate::core::dra::names::assignment_name)): a record naming another's
//! (`app`, or another claim's) is refused as corrupt, left where it is and said.
//! [`Claims::save`] writes one as earlier releases did (the migration's tests use it).

use std::path::Path;

use crate::core::dra::names::{claim_of, valid_uid, MAX_UID};
// A claim record is the state's prepared claim, as it was written in a file.
use crate::core::state::PreparedClaim;
use crate::host::fsutil::{FsError, Root};

/// The records' directory below the state directory.
pub const DIR: &str = "dra";
/// The largest record written or read (a claim has at most 32 results and 256 pods).
pub const CAP: u64 = crate::core::state::MAX_CLAIM_BYTES;

/// Why the record is not its claim's own: a uid that is not the file's, or an assignment not
/// named by [`crate::core::dra::names::assignment_name`] for it.
fn foreign(rec: &PreparedClaim, uid: &str) -> Option<String> {
    if rec.uid != uid {
        return Some(format!("it says uid `{}`", crate::core::echo(&rec.uid)));
    }
    rec.assignments
        .iter()
        .find(|a| claim_of(a.as_str()) != Some(uid))
        .map(|a| format!("it names assignment `{a}`, which is not one of claim {uid}'s (dra-{uid}-<n>)"))
}

/// Why a record could not be read, written or removed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimsError {
    /// The file system refused.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// The file is no record.
    #[error("`{file}` is not a prepared claim's record")]
    Corrupt {
        /// The file.
        file: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The uid cannot name a file.
    #[error("the claim uid `{0}` is not 1-{MAX_UID} characters of A-Z a-z 0-9 -")]
    Uid(String),
    /// The record is not its claim's own ([`PreparedClaim::foreign`]).
    #[error("`{file}` is not claim {uid}'s own record: {why}; it is not trusted")]
    Foreign {
        /// The file.
        file: String,
        /// The claim.
        uid: String,
        /// What is foreign in it.
        why: String,
    },
    /// The record would not fit [`CAP`].
    #[error(transparent)]
    TooLarge(#[from] crate::core::state::TooLarge),
}

/// The records' directory.
#[derive(Debug, Clone)]
pub struct Claims {
    root: Root,
}

impl Claims {
    /// The records below `state_dir`.
    pub fn new(state_dir: &Path) -> Claims {
        Claims { root: Root::new(state_dir.join(DIR)) }
    }

    fn file(uid: &str) -> Result<String, ClaimsError> {
        if valid_uid(uid) {
            Ok(format!("{uid}.json"))
        } else {
            Err(ClaimsError::Uid(crate::core::echo(uid)))
        }
    }

    /// The record of `uid`, if the claim is prepared.
    pub fn load(&self, uid: &str) -> Result<Option<PreparedClaim>, ClaimsError> {
        let file = Self::file(uid)?;
        if !self.root.path().is_dir() {
            return Ok(None);
        }
        let bytes = match self.root.read_own(&file, CAP) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let path = || self.root.path().join(&file).display().to_string();
        let rec: PreparedClaim =
            serde_json::from_slice(&bytes).map_err(|source| ClaimsError::Corrupt { file: path(), source })?;
        match foreign(&rec, uid) {
            Some(why) => Err(ClaimsError::Foreign { file: path(), uid: uid.to_owned(), why }),
            None => Ok(Some(rec)),
        }
    }

    /// The uids of the records there (file names that are a valid uid and `.json`).
    pub fn uids(&self) -> Result<Vec<String>, ClaimsError> {
        let entries = match std::fs::read_dir(self.root.path()) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(FsError { op: "listing", path: self.root.path().to_owned(), source }.into())
            }
        };
        let mut uids: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".json").map(str::to_owned))
            .filter(|u| valid_uid(u))
            .collect();
        uids.sort();
        Ok(uids)
    }

    /// Writes `claim`'s record durably.
    pub fn save(&self, claim: &PreparedClaim) -> Result<(), ClaimsError> {
        let file = Self::file(&claim.uid)?;
        let data = claim.encode()?;
        let root = Root::create(self.root.path(), 0o700)?;
        root.replace(&file, &data, 0o600)?;
        Ok(())
    }

    /// Removes `uid`'s record, durably; none is no error.
    pub fn remove(&self, uid: &str) -> Result<(), ClaimsError> {
        let file = Self::file(uid)?;
        match self.root.remove_file(&file) {
            Ok(()) => Ok(self.root.sync_dir("")?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use test_support::apiserver;

    use super::*;
    use crate::core::dra::names::assignment_name;
    use crate::core::state::{AssignmentId, PreparedDevice, Target};

    #[test]
    fn records_round_trip_and_refuse_path_uids() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let claims = Claims::new(dir.path());
        assert!(matches!(claims.load("u1"), Ok(None)));
        let c = PreparedClaim {
            uid: "u1".into(),
            namespace: "n".into(),
            name: "c".into(),
            assignments: vec![AssignmentId::new("dra-u1-0").unwrap_or_else(|e| panic!("{e}"))],
            pods: vec!["p1".into()],
            devices: vec![],
        };
        claims.save(&c).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(claims.load("u1").unwrap_or_else(|e| panic!("{e}")), Some(c));
        claims.remove("u1").unwrap_or_else(|e| panic!("{e}"));
        claims.remove("u1").unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(claims.load("u1"), Ok(None)));
        assert!(matches!(claims.load("../x"), Err(ClaimsError::Uid(_))));
        assert!(!valid_uid(&"a".repeat(MAX_UID + 1)));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any uid an API server makes names a record, and each of its claim's up to 32
        /// assignments (an id and a kubelet device id); a record with names at the API's
        /// maxima (namespace 63, claim 253, request 63) reads back the same.
        #[test]
        fn api_server_uids_name_records_and_assignments(uid in apiserver::uids(), n in 0usize..32) {
            prop_assert!(valid_uid(&uid), "{uid}");
            let name = assignment_name(&uid, n);
            let id = AssignmentId::new(&name).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(Target::parse(&format!("kubelet:{name}")).is_ok(), "{name}");
            let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let claims = Claims::new(dir.path());
            let c = PreparedClaim {
                uid: uid.clone(),
                namespace: apiserver::label("team"),
                name: apiserver::subdomain("claim"),
                assignments: vec![id],
                pods: vec![apiserver::uid_from_bytes([7; 16])],
                devices: vec![PreparedDevice {
                    request_names: vec![apiserver::label("cpus")],
                    pool_name: apiserver::subdomain("node"),
                    device_name: "dp-numa0".into(),
                    cdi_device_ids: vec![format!("dra.cpupool.io/cpu={uid}")],
                }],
            };
            claims.save(&c).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(claims.load(&uid).map_err(|e| TestCaseError::fail(e.to_string()))?, Some(c));
        }
    }
}
