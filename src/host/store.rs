//! The durable state store: one file, `state.json`, in the state directory, and the previous good
//! copy beside it.
//!
//! The engine calls [`Store::save`] after every mutation and acknowledges the mutation only once
//! `save` has returned `Ok`. At start it calls [`Store::load`]; an operator who has been told that
//! `state.json` is damaged starts the daemon with `--restore-previous-state`, which calls
//! [`Store::restore_previous`]. The store is generic over the state type, so it knows nothing of
//! pools or CPUs.
//!
//! The format and its checks live in `format`, the errors in `error`, and what an operator's
//! `--restore-previous-state` does in `recovery`; this file holds the save and load sequence.
//!
//! # File format
//!
//! ```text
//! cpupoold-state <format_version> <payload_len> <crc32>\n
//! <payload>
//! ```
//!
//! The header is one ASCII line: the magic word, [`FORMAT_VERSION`] in decimal, the payload's length
//! in bytes in decimal, and the CRC-32 (IEEE, `crc32fast`) of the payload as 8 lowercase hex digits.
//! The payload is the state as pretty-printed JSON followed by a newline (both counted in the
//! length and the checksum). Pretty JSON costs a few bytes and lets an operator read the state with
//! `tail -n +2 state.json | jq`.
//!
//! # Why the save sequence is crash-safe
//!
//! [`Store::save`] does, in this order:
//!
//! 1. **Write the whole new file to `state.json.tmp` and fsync it.** A rename changes names, not
//!    data: without this fsync a crash just after step 3 may leave `state.json` naming an inode
//!    whose blocks were never written (a zero-length or garbage file on ext4 without
//!    `auto_da_alloc`, on xfs, ...). After the fsync, the data and inode are on disk before any
//!    name points at them.
//! 2. **Hard-link `state.json` to `state.json.prev.tmp`, then rename that over `state.json.prev`.**
//!    A link rather than a rename of `state.json` itself, so that `state.json` names a complete
//!    file at every instant; `link` cannot replace an existing name, hence the temporary name and
//!    the atomic replacing rename. Sharing the inode is safe because the store never writes a file
//!    in place, only replaces names.
//! 3. **Rename `state.json.tmp` over `state.json`.** `rename` replaces atomically: a reader, or a
//!    crash, sees the old file or the new one, never a mix and never no file.
//! 4. **fsync the directory.** The renames are changes to the directory; until it is synced a crash
//!    may roll them back, so the mutation is durable only now.
//!
//! The two renames are made durable together by step 4. If a crash persists one and not the other,
//! `state.json` is still a complete file (old or new) and `state.json.prev` is at worst one
//! generation older or equal to `state.json`; stale `*.tmp` files are replaced by the next save.
//!
//! A failure before step 3 leaves `state.json` untouched and removes the temp file (best effort).
//! A failure of step 4 happens after the new file has its name: `state.json` may then hold the new
//! state, which the engine has not acknowledged; the engine's rollback saves the old state again.
//!
//! # Why load never repairs
//!
//! fsync cannot protect against a disk that lies, bit rot, a copy truncated by a full disk or an
//! editor. The header's length and checksum detect these. A damaged file is evidence and the
//! daemon cannot tell which CPUs it had handed out, so [`Store::load`] never rewrites, renames or
//! deletes it: it returns an error naming the file, what is wrong, and whether a good previous
//! copy exists. The operator decides; [`Store::restore_previous`] moves the damaged file aside to
//! `state.json.corrupt` (`.corrupt.1`, ... if taken) rather than deleting it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::fsutil::{FsError, Root};

mod error;
mod format;
mod recovery;
#[cfg(test)]
mod tests;

pub use error::{PrevCopy, StoreError};
use format::{decode, frame, len_u64};

/// The on-disk format version written by this build and the only one it reads.
pub const FORMAT_VERSION: u32 = 1;

/// The current state file, in the state directory.
pub const STATE_FILE: &str = "state.json";
/// The previous good copy.
pub const PREV_FILE: &str = "state.json.prev";
/// Where a new state is written before it replaces [`STATE_FILE`].
pub const TMP_FILE: &str = "state.json.tmp";
/// Where the link to the outgoing state is made before it replaces [`PREV_FILE`].
const PREV_TMP_FILE: &str = "state.json.prev.tmp";
/// Where [`Store::restore_previous`] moves a damaged state file (numbered `.1`, `.2`, ... if taken).
pub const CORRUPT_FILE: &str = "state.json.corrupt";

/// What [`Store::load`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded<T> {
    /// Neither `state.json` nor `state.json.prev` exists: this is the first start.
    Fresh,
    /// `state.json` is intact and decoded.
    State(T),
}
/// The state directory and the files in it. All methods take `&self`; the engine owns the one
/// `Store` and serializes calls, so no locking is done here.
///
/// Every file is opened, linked and renamed relative to the directory through
/// [`Root`]: a symbolic link planted at one of the names is refused (reading) or replaced
/// (saving), never followed.
#[derive(Debug)]
pub struct Store {
    root: Root,
    dir: PathBuf,
    current: PathBuf,
    prev: PathBuf,
    prev_tmp: PathBuf,
    last_size: AtomicU64,
}

impl Store {
    /// Opens the store in `state_dir`, creating the directory (mode 0700) and any missing parents
    /// if needed. An existing directory's mode is left alone. Reads no state file.
    pub fn open(state_dir: &Path) -> Result<Store, StoreError> {
        let root = Root::create(state_dir, 0o700)?;
        Ok(Store {
            root,
            dir: state_dir.to_path_buf(),
            current: state_dir.join(STATE_FILE),
            prev: state_dir.join(PREV_FILE),
            prev_tmp: state_dir.join(PREV_TMP_FILE),
            last_size: AtomicU64::new(0),
        })
    }

    /// The path of `state.json`.
    pub fn path(&self) -> &Path {
        &self.current
    }

    /// The path of `state.json.prev`, the previous good copy.
    pub fn prev_path(&self) -> &Path {
        &self.prev
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Size in bytes (header included) of the state file as last saved, loaded or restored by this
    /// `Store`; 0 before any of these.
    pub fn last_size(&self) -> u64 {
        self.last_size.load(Ordering::Relaxed)
    }

    /// Writes `state` durably: when this returns `Ok`, a crash at any later moment leaves
    /// `state.json` holding `state`, and `state.json.prev` holds the state it replaces. See the
    /// module docs for the sequence and why. On error `state.json` is as it was, except after a
    /// failed directory fsync (see the module docs).
    pub fn save<T: Serialize>(&self, state: &T) -> Result<(), StoreError> {
        let mut payload = serde_json::to_vec_pretty(state)
            .map_err(|source| StoreError::Encode { path: self.current.clone(), source })?;
        payload.push(b'\n');
        let bytes = frame(&payload);
        self.replace_current(&bytes, true)
    }

    /// Reads `state.json`. Returns [`Loaded::Fresh`] when neither it nor `state.json.prev`
    /// exists. Never modifies, moves or deletes any file, damaged or not.
    pub fn load<T: DeserializeOwned>(&self) -> Result<Loaded<T>, StoreError> {
        let bytes = match self.root.read(STATE_FILE) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return match self.prev_copy::<T>() {
                    PrevCopy::Absent => Ok(Loaded::Fresh),
                    prev => Err(StoreError::CurrentMissing { path: self.current.clone(), prev }),
                };
            }
            Err(e) => return Err(e.into()),
        };
        match decode::<T>(&bytes) {
            Ok(state) => {
                self.last_size.store(len_u64(&bytes), Ordering::Relaxed);
                Ok(Loaded::State(state))
            }
            Err(defect) => Err(defect.into_error(self.current.clone(), self.prev_copy::<T>())),
        }
    }
    /// Steps 1 to 4 of the module docs ([`Root::replace_with`]); step 2 only when `keep_prev`.
    fn replace_current(&self, bytes: &[u8], keep_prev: bool) -> Result<(), StoreError> {
        let keep = || if keep_prev { self.link_prev() } else { Ok(()) };
        self.root.replace_with(Path::new(STATE_FILE), TMP_FILE, bytes, 0o600, keep)?;
        self.last_size.store(len_u64(bytes), Ordering::Relaxed);
        Ok(())
    }

    /// Makes the outgoing `state.json` the previous copy without ever removing `state.json`.
    fn link_prev(&self) -> Result<(), FsError> {
        // Left over by a crash between link and rename; `link` will not replace it.
        if let Err(e) = self.root.remove_file(PREV_TMP_FILE) {
            if e.kind() != io::ErrorKind::NotFound {
                log::debug!("removing stale `{}`: {e}", self.prev_tmp.display());
            }
        }
        match self.root.hard_link(STATE_FILE, PREV_TMP_FILE) {
            Ok(()) => {}
            // First save: nothing to keep.
            Err(e) if e.kind() == io::ErrorKind::NotFound && !self.root.exists(STATE_FILE) => return Ok(()),
            Err(e) => return Err(e),
        }
        self.root.rename(PREV_TMP_FILE, PREV_FILE)
    }
}
