//! Loading: the snapshot read and checked, the journal's records after it replayed onto it
//! ([`Store::load`], [`Store::load_checked`]), and the survey that learns the journal's sequence
//! when this process has not loaded yet. The formats and why a torn tail is ignored are in the
//! store's module docs.

use std::io;
use std::sync::atomic::Ordering;

use serde::de::DeserializeOwned;

use super::format::{decode, len_u64};
use super::{journal, Journal, Loaded, PrevCopy, RecordAt, Store, StoreError, JOURNAL_FILE, STATE_FILE};
use crate::host::fsutil::MAX_STATE_BYTES;

/// The records of one journal file replayed onto a state.
pub(super) struct Replayed {
    pub(super) good_len: u64,
    pub(super) records: u64,
    pub(super) torn: bool,
}

/// Where replaying a journal stopped on damage: the error, and the length of the records before
/// the damaged one (the state holds those).
pub(super) struct Damage {
    pub(super) error: StoreError,
    pub(super) good_len: u64,
}

impl Store {
    /// Reads the snapshot and replays the journal's records after it. Returns [`Loaded::Fresh`]
    /// when none of `state.json`, `state.json.prev` and `state.journal` exists. A torn tail of the
    /// journal is ignored with a warning (and cut before the next append); any other damage is
    /// an error. Never modifies, moves or deletes any file, damaged or not.
    pub fn load<T, D>(&self, mut apply: impl FnMut(&mut T, D)) -> Result<Loaded<T>, StoreError>
    where
        T: DeserializeOwned,
        D: DeserializeOwned,
    {
        self.load_checked(|state: &mut T, change: D, _: &RecordAt| {
            apply(state, change);
            Ok(())
        })
    }

    /// [`Store::load`] with a caller that checks each change as it replays it, and learns where
    /// each one was found. `apply` returns `Err(reason)` for a change it refuses, and must then
    /// leave the state as it was: the load fails with [`StoreError::JournalRejected`] naming the
    /// journal, the record and its offset, like any other damage of the journal (which
    /// `--restore-previous-state` salvages, keeping the records before it).
    pub fn load_checked<T, D>(
        &self,
        mut apply: impl FnMut(&mut T, D, &RecordAt) -> Result<(), String>,
    ) -> Result<Loaded<T>, StoreError>
    where
        T: DeserializeOwned,
        D: DeserializeOwned,
    {
        let bytes = match self.root.read_own(STATE_FILE, MAX_STATE_BYTES) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return match self.prev_copy::<T>() {
                    PrevCopy::Absent if !self.root.exists(JOURNAL_FILE) => Ok(Loaded::Fresh),
                    prev => Err(StoreError::CurrentMissing { path: self.current.clone(), prev }),
                };
            }
            Err(e) => return Err(e.into()),
        };
        let (mut state, mut seq) = match decode::<T>(&bytes) {
            Ok(found) => found,
            Err(defect) => return Err(defect.into_error(self.current.clone(), self.prev_copy::<T>())),
        };
        let replayed = match self.read_journal(JOURNAL_FILE)? {
            Some(journal) => {
                self.replay(JOURNAL_FILE, &journal, &mut state, &mut seq, &mut apply).map_err(|d| d.error)?
            }
            None => Replayed { good_len: 0, records: 0, torn: false },
        };
        self.last_size.store(len_u64(&bytes), Ordering::Relaxed);
        let mut j = self.lock();
        *j = Journal {
            known: true,
            seq,
            good_len: replayed.good_len,
            cut: replayed.torn,
            records: replayed.records,
            ..Journal::default()
        };
        Ok(Loaded::State(state))
    }

    /// Learns the journal's sequence and length from the files when this process has not yet
    /// loaded, saved or restored: a save or an append must continue the sequence.
    pub(super) fn survey(&self, j: &mut Journal) -> Result<(), StoreError> {
        if j.known {
            return Ok(());
        }
        let mut seq = match self.root.read_own(STATE_FILE, MAX_STATE_BYTES) {
            Ok(bytes) => {
                decode::<serde::de::IgnoredAny>(&bytes)
                    .map_err(|d| d.into_error(self.current.clone(), PrevCopy::Itself))?
                    .1
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e.into()),
        };
        let mut skip = |_: &mut (), _: serde::de::IgnoredAny, _: &RecordAt| Ok(());
        let replayed = match self.read_journal(JOURNAL_FILE)? {
            Some(journal) => {
                self.replay(JOURNAL_FILE, &journal, &mut (), &mut seq, &mut skip).map_err(|d| d.error)?
            }
            None => Replayed { good_len: 0, records: 0, torn: false },
        };
        *j = Journal {
            known: true,
            seq,
            good_len: replayed.good_len,
            cut: replayed.torn,
            records: replayed.records,
            stale: j.stale,
            ..Journal::default()
        };
        Ok(())
    }

    /// The bytes of the journal `name`, or `None` if there is none.
    pub(super) fn read_journal(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self.root.read_own(name, MAX_STATE_BYTES) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Applies the records of the journal `name` (its `bytes`) that come after `seq` to `state`,
    /// advancing `seq`. On damage, `state` holds the records before it.
    pub(super) fn replay<T, D: DeserializeOwned>(
        &self,
        name: &str,
        bytes: &[u8],
        state: &mut T,
        seq: &mut u64,
        apply: &mut impl FnMut(&mut T, D, &RecordAt) -> Result<(), String>,
    ) -> Result<Replayed, Damage> {
        let path = self.dir.join(name);
        let scan = journal::scan(bytes);
        for r in &scan.records {
            if r.seq <= *seq {
                // Already in the snapshot: a crash between a snapshot and its new journal.
                continue;
            }
            if r.seq != *seq + 1 {
                let error =
                    StoreError::JournalSequence { path, offset: r.offset, expected: *seq + 1, found: r.seq };
                return Err(Damage { error, good_len: r.offset });
            }
            let change = serde_json::from_slice(r.payload).map_err(|source| Damage {
                error: StoreError::JournalDecode { path: path.clone(), offset: r.offset, seq: r.seq, source },
                good_len: r.offset,
            })?;
            let at = RecordAt { path: path.clone(), seq: r.seq, offset: r.offset };
            if let Err(reason) = apply(state, change, &at) {
                let error = StoreError::JournalRejected { path, offset: r.offset, seq: r.seq, reason };
                return Err(Damage { error, good_len: r.offset });
            }
            *seq = r.seq;
        }
        let records = u64::try_from(scan.records.len()).unwrap_or(u64::MAX);
        match scan.end {
            journal::End::Clean => Ok(Replayed { good_len: len_u64(bytes), records, torn: false }),
            journal::End::Torn { offset, bytes } => {
                log::warn!(
                    "ignoring the torn end of `{}`: {bytes} bytes from byte {offset} (a write whose \
                     fdatasync never returned, so never acknowledged)",
                    path.display()
                );
                Ok(Replayed { good_len: offset, records, torn: true })
            }
            journal::End::Damaged { offset, seq, reason } => Err(Damage {
                error: StoreError::JournalCorrupt { path, offset, seq, reason },
                good_len: offset,
            }),
        }
    }
}
