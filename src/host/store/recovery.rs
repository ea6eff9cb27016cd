//! What the operator's `--restore-previous-state` does, and what the store tells about the
//! previous copy when the current files cannot be loaded.
//!
//! Two cases, decided from what is damaged:
//!
//! - **The snapshot is intact and the journal is damaged** (a record that does not check with
//!   good ones after it, a sequence gap, a record that does not decode, a change the caller of a
//!   `*_checked` method refuses): the state is the snapshot
//!   plus the journal's records before the damaged one. The journal is moved aside to
//!   `state.journal.corrupt` and a new journal holding those records takes its name. Changes
//!   acknowledged after the damaged record are lost; the error said so before the operator chose.
//! - **Otherwise** (the snapshot is damaged or missing, or everything decodes but the caller found
//!   the state inconsistent): the state is `state.json.prev` plus the records of
//!   `state.journal.prev` and `state.journal` after it. Since a compaction writes both previous
//!   copies, this is the newest state the files describe, not one step back. The snapshot is moved
//!   aside to `state.json.corrupt`; a damaged journal is moved aside too, and its records before
//!   the damage are kept. The result is installed as the snapshot (keeping no previous copy of
//!   the damaged file) with a new, empty journal.
//!
//! Files are moved aside with a link to the first free `NAME.corrupt`, `NAME.corrupt.1`, ...,
//! never deleted.

use std::io;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::format::{decode, frame};
use super::{
    journal, PrevCopy, RecordAt, Store, StoreError, CORRUPT_FILE, JOURNAL_CORRUPT_FILE, JOURNAL_FILE,
    JOURNAL_PREV_FILE, JOURNAL_TMP_FILE, PREV_FILE, STATE_FILE,
};
use crate::host::fsutil::MAX_STATE_BYTES;

/// How many numbered `*.corrupt.N` names to try before giving up.
const MAX_CORRUPT_COPIES: u32 = 10_000;

/// What a restore would install.
enum Plan<T> {
    /// The snapshot plus the journal's records before its damage (`keep`: the journal's bytes up
    /// to there).
    Salvage { state: T, keep: Vec<u8> },
    /// `state.json.prev` and the journals after it.
    Previous {
        state: T,
        seq: u64,
        /// `state.json.prev`'s bytes, installed as they are when no record was replayed.
        prev_bytes: Vec<u8>,
        replayed: bool,
        journal_damaged: bool,
    },
}

impl Store {
    /// For `--restore-previous-state`: see the module docs for what is restored. Moves damaged
    /// files aside and durably installs the result; returns the restored state.
    ///
    /// In the second case `state.json` is moved aside even if it is intact: the operator asked
    /// for the previous state. `state.json.prev` itself is kept.
    pub fn restore_previous<T, D>(&self, mut apply: impl FnMut(&mut T, D)) -> Result<T, StoreError>
    where
        T: Serialize + DeserializeOwned,
        D: DeserializeOwned,
    {
        self.restore_previous_checked(|state: &mut T, change: D, _: &RecordAt| {
            apply(state, change);
            Ok(())
        })
    }

    /// [`Store::restore_previous`] with a caller that checks each change (see
    /// [`Store::load_checked`]): a change it refuses is damage of its journal, as a record that
    /// does not check would be.
    pub fn restore_previous_checked<T, D>(
        &self,
        apply: impl FnMut(&mut T, D, &RecordAt) -> Result<(), String>,
    ) -> Result<T, StoreError>
    where
        T: Serialize + DeserializeOwned,
        D: DeserializeOwned,
    {
        let plan = self.plan::<T, D>(apply)?;
        // Whatever happens below, the journal's bookkeeping is learnt afresh from the files.
        self.lock().known = false;
        match plan {
            Plan::Salvage { state, keep } => {
                let aside = self.link_aside(JOURNAL_FILE, JOURNAL_CORRUPT_FILE)?;
                self.root.replace_with(Path::new(JOURNAL_FILE), JOURNAL_TMP_FILE, &keep, 0o600, || Ok(()))?;
                log::warn!(
                    "restored the state from `{}` and the journal's records before its damage; the damaged \
                     journal is kept as `{}`",
                    self.current.display(),
                    aside.display()
                );
                Ok(state)
            }
            Plan::Previous { state, seq, prev_bytes, replayed, journal_damaged } => {
                let bytes = if replayed {
                    let mut payload = serde_json::to_vec_pretty(&state)
                        .map_err(|source| StoreError::Encode { path: self.current.clone(), source })?;
                    payload.push(b'\n');
                    frame(seq, &payload)
                } else {
                    prev_bytes
                };
                // Link, not rename: `state.json` keeps its name until the restored copy replaces
                // it, and `link` fails rather than overwrite an earlier corrupt copy.
                if self.root.exists(STATE_FILE) {
                    self.link_aside(STATE_FILE, CORRUPT_FILE)?;
                }
                if journal_damaged {
                    self.link_aside(JOURNAL_FILE, JOURNAL_CORRUPT_FILE)?;
                }
                // The damaged file must not become the previous copy, hence `keep_prev = false`.
                self.replace_current(&bytes, false)?;
                if self.root.exists(JOURNAL_FILE) {
                    // Its records are in the restored snapshot (or moved aside with the damage).
                    self.root.replace_with(
                        Path::new(JOURNAL_FILE),
                        JOURNAL_TMP_FILE,
                        journal::HEADER,
                        0o600,
                        || Ok(()),
                    )?;
                }
                log::info!(
                    "restored `{}` from `{}` and the journals",
                    self.current.display(),
                    self.prev.display()
                );
                Ok(state)
            }
        }
    }

    /// What `--restore-previous-state` would install, without changing any file.
    pub fn previous<T, D>(&self, mut apply: impl FnMut(&mut T, D)) -> Result<T, StoreError>
    where
        T: DeserializeOwned,
        D: DeserializeOwned,
    {
        self.previous_checked(|state: &mut T, change: D, _: &RecordAt| {
            apply(state, change);
            Ok(())
        })
    }

    /// [`Store::previous`] with a caller that checks each change (see
    /// [`Store::restore_previous_checked`]).
    pub fn previous_checked<T, D>(
        &self,
        apply: impl FnMut(&mut T, D, &RecordAt) -> Result<(), String>,
    ) -> Result<T, StoreError>
    where
        T: DeserializeOwned,
        D: DeserializeOwned,
    {
        match self.plan(apply)? {
            Plan::Salvage { state, .. } | Plan::Previous { state, .. } => Ok(state),
        }
    }

    fn plan<T, D>(
        &self,
        mut apply: impl FnMut(&mut T, D, &RecordAt) -> Result<(), String>,
    ) -> Result<Plan<T>, StoreError>
    where
        T: DeserializeOwned,
        D: DeserializeOwned,
    {
        let current = self.root.read_own(STATE_FILE, MAX_STATE_BYTES).ok().and_then(|b| decode::<T>(&b).ok());
        if let (Some((mut state, mut seq)), Some(bytes)) = (current, self.read_journal(JOURNAL_FILE)?) {
            if let Err(damage) = self.replay(JOURNAL_FILE, &bytes, &mut state, &mut seq, &mut apply) {
                log::warn!("restoring: {}", crate::error_chain(&damage.error));
                let keep = bytes[..usize::try_from(damage.good_len).unwrap_or(bytes.len())].to_vec();
                return Ok(Plan::Salvage { state, keep });
            }
        }
        let prev_bytes = match self.root.read_own(PREV_FILE, MAX_STATE_BYTES) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StoreError::NoPrevious { path: self.prev.clone() })
            }
            Err(e) => return Err(e.into()),
        };
        let (mut state, mut seq) =
            decode::<T>(&prev_bytes).map_err(|d| d.into_error(self.prev.clone(), PrevCopy::Itself))?;
        let first = seq;
        if let Some(bytes) = self.read_journal(JOURNAL_PREV_FILE)? {
            self.replay(JOURNAL_PREV_FILE, &bytes, &mut state, &mut seq, &mut apply).map_err(|d| d.error)?;
        }
        let mut journal_damaged = false;
        if let Some(bytes) = self.read_journal(JOURNAL_FILE)? {
            if let Err(damage) = self.replay(JOURNAL_FILE, &bytes, &mut state, &mut seq, &mut apply) {
                log::warn!("restoring: {}", crate::error_chain(&damage.error));
                journal_damaged = true;
            }
        }
        Ok(Plan::Previous { state, seq, prev_bytes, replayed: seq != first, journal_damaged })
    }

    /// Links `name` to the first free `corrupt[.N]`.
    fn link_aside(&self, name: &str, corrupt: &str) -> Result<PathBuf, StoreError> {
        let from = self.dir.join(name);
        for n in 0..MAX_CORRUPT_COPIES {
            let to = if n == 0 { corrupt.to_owned() } else { format!("{corrupt}.{n}") };
            let aside = self.dir.join(&to);
            match self.root.hard_link(name, &to) {
                Ok(()) => {
                    log::warn!("moved `{}` aside to `{}`", from.display(), aside.display());
                    return Ok(aside);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(StoreError::Io {
                        op: "moving a damaged file aside to",
                        path: aside,
                        source: e.source,
                    })
                }
            }
        }
        Err(StoreError::Io {
            op: "finding a free name to move a damaged file aside to",
            path: self.dir.join(format!("{corrupt}.{MAX_CORRUPT_COPIES}")),
            source: io::Error::from(io::ErrorKind::AlreadyExists),
        })
    }

    /// Checks `state.json.prev` for an error message. Reads only.
    pub(super) fn prev_copy<T: DeserializeOwned>(&self) -> PrevCopy {
        match self.root.read_own(PREV_FILE, MAX_STATE_BYTES) {
            Ok(bytes) => match decode::<T>(&bytes) {
                Ok(_) => PrevCopy::Good(self.prev.clone()),
                Err(_) => PrevCopy::Damaged(self.prev.clone()),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => PrevCopy::Absent,
            Err(_) => PrevCopy::Damaged(self.prev.clone()),
        }
    }
}
