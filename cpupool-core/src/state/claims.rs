//! The prepared DRA claims: one entry per claim uid in the state, saved with the assignments
//! that hold its CPUs (`dra-<uid>-<n>`) in the same journal record, so a claim is recorded
//! exactly when it is booked. An entry adds what the assignments do not say: the claim's
//! namespace and name, the pods in its `status.reservedFor` (only their containers get its
//! CPUs), and the devices answered to the kubelet with their CDI ids. The CDI spec a runtime
//! reads follows from an entry (the engine writes it after the commit, and again at start
//! when it is missing).

use serde::{Deserialize, Serialize};

use super::AssignmentId;

/// One device answered for a claim (the kubelet's `Device`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    /// The claim's requests it serves.
    pub request_names: Vec<String>,
    /// The ResourceSlice pool (the node's name).
    pub pool_name: String,
    /// The device (`dp-numa0`).
    pub device_name: String,
    /// Its CDI device ids.
    pub cdi_device_ids: Vec<String>,
}

/// A prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedClaim {
    /// The claim's uid.
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The engine's assignments that hold its CPUs.
    pub assignments: Vec<AssignmentId>,
    /// The uids of the pods in its `status.reservedFor`: only their containers get its CPUs.
    pub pods: Vec<String>,
    /// What the kubelet was answered.
    pub devices: Vec<PreparedDevice>,
}

/// The largest claim entry taken, as JSON (a claim has at most 32 results and 256 pods): one
/// journal record stays small, and none is written that a restart could not read back.
pub const MAX_CLAIM_BYTES: u64 = 256 * 1024;

/// A claim entry over [`MAX_CLAIM_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("its record would take {bytes} bytes ({pods} pods reserved), over the {MAX_CLAIM_BYTES} cpupoold reads back")]
pub struct TooLarge {
    /// Its size.
    pub bytes: usize,
    /// The pods it names.
    pub pods: usize,
}

impl PreparedClaim {
    /// The entry's bytes as a record file held them; an error when they would not fit
    /// [`MAX_CLAIM_BYTES`].
    pub fn encode(&self) -> Result<Vec<u8>, TooLarge> {
        let data = serde_json::to_vec_pretty(self).unwrap_or_default();
        if data.len() as u64 > MAX_CLAIM_BYTES {
            return Err(TooLarge { bytes: data.len(), pods: self.pods.len() });
        }
        Ok(data)
    }
}

impl super::State {
    /// The prepared claims by uid.
    pub fn claims(&self) -> &imbl::OrdMap<String, PreparedClaim> {
        &self.data.claims
    }

    /// Prepared claim `uid`, if it is recorded.
    pub fn claim(&self, uid: &str) -> Option<&PreparedClaim> {
        self.data.claims.get(uid)
    }

    /// Records `claim` (its assignments are booked in the same change); recording it again as
    /// it is is no change.
    pub fn record_claim(&mut self, claim: PreparedClaim) -> super::Outcome<()> {
        if self.data.claims.get(&claim.uid) == Some(&claim) {
            return super::Outcome::Identity(());
        }
        self.changes.claims.insert(claim.uid.clone());
        self.data.claims.insert(claim.uid.clone(), claim);
        super::Outcome::Changed(())
    }

    /// Forgets claim `uid`, returning what it recorded.
    pub fn forget_claim(&mut self, uid: &str) -> Option<PreparedClaim> {
        let gone = self.data.claims.remove(uid)?;
        self.changes.claims.insert(uid.to_owned());
        Some(gone)
    }
}

#[cfg(test)]
mod tests {
    use test_support::apiserver;

    use super::super::{Delta, State, StateData};
    use super::*;

    /// A claim recorded or forgotten is one journal record's worth, replayed the same; a state
    /// of the format before claims were state (version 2) reads as one with none.
    #[test]
    fn a_claim_replays_from_its_record_and_an_older_state_has_none() {
        let uid = apiserver::uid_digit_first();
        let claim = PreparedClaim {
            uid: uid.clone(),
            namespace: apiserver::label("team"),
            name: apiserver::subdomain("claim"),
            assignments: vec![AssignmentId::new(&format!("dra-{uid}-0")).unwrap_or_else(|e| panic!("{e}"))],
            pods: vec![apiserver::uid()],
            devices: Vec::new(),
        };
        let mut s = State::default();
        assert!(s.record_claim(claim.clone()).changed());
        assert!(!s.record_claim(claim.clone()).changed(), "recorded again as it is: no change");
        let changes = s.take_changes();
        let delta = s.delta(&changes);
        assert_eq!(delta.claims, vec![claim.clone()]);
        let json = serde_json::to_string(&delta).unwrap_or_else(|e| panic!("{e}"));
        let mut replayed = State::default();
        replayed.apply(serde_json::from_str::<Delta>(&json).unwrap_or_else(|e| panic!("{e}")));
        assert_eq!(replayed, s);
        assert_eq!(s.forget_claim(&uid), Some(claim));
        let changes = s.take_changes();
        let delta = s.delta(&changes);
        assert_eq!(delta.forget, vec![uid.clone()]);
        replayed.apply(delta);
        assert_eq!(replayed.claim(&uid), None);

        let old: StateData = serde_json::from_str(r#"{"pools":{},"assignments":{},"next_id":3}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(old.claims.is_empty());
        let none = serde_json::to_string(&StateData::default()).unwrap_or_else(|e| panic!("{e}"));
        assert!(!none.contains("claims"), "{none}");
    }
}
