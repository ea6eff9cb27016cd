//! The durable state store: a snapshot, `state.json`, and a journal of the changes made since,
//! `state.journal`, in the state directory, with the previous generation of each beside them.
//!
//! The engine calls [`Store::append`] with the change a mutation made (for the daemon, a
//! `Delta`) and acknowledges the mutation only once `append` has returned `Ok`: that is one
//! `write` and one `fdatasync` of a small record, whatever the number of assignments, and one per
//! group of mutations the engine decided together. Once the journal has grown past the
//! snapshot's size (at least 1 MiB) [`Store::compact_due`] says so and the engine writes the whole
//! state with [`Store::save`], which starts a new, empty journal. At start it calls
//! [`Store::load`], which reads the snapshot and replays the journal's records after it; the
//! daemon then compacts (a state that loads but cannot be compacted is used as it is, with the
//! store marked stale, see [`Store::mark_stale`]). An operator who has been told that a file is damaged starts the daemon
//! with `--restore-previous-state`, which calls [`Store::restore_previous`] (see `recovery`).
//! The store is generic over the state and change types, so it knows nothing of pools or CPUs.
//!
//! The snapshot's format and checks live in `format`, the journal's in `journal`, the errors in
//! `error`, the load and replay sequence in `load`, what `--restore-previous-state` does in
//! `recovery`, and the keepers' memory of host values ([`Remembered`]) in `remembered`; this file
//! holds the write sequences.
//!
//! # Snapshot format
//!
//! ```text
//! cpupoold-state <format_version> <sequence> <payload_len> <crc32>\n
//! <payload>
//! ```
//!
//! The header is one ASCII line: the magic word, [`FORMAT_VERSION`] in decimal, the sequence
//! number of the last journal record the snapshot includes, the payload's length in bytes in
//! decimal, and the CRC-32 (IEEE, `crc32fast`) of the payload as 8 lowercase hex digits. The
//! payload is the state as pretty-printed JSON followed by a newline (both counted in the length
//! and the checksum). Pretty JSON costs a few bytes and lets an operator read the state with
//! `tail -n +2 state.json | jq`. Version 1 (`cpupoold-state 1 <len> <crc32>`, written before the
//! journal existed) is read as including sequence 0, and version 2 (the same header as 3; its
//! states have no prepared DRA claims) as it is, so an installed daemon upgrades in place.
//!
//! # Journal format
//!
//! ```text
//! cpupoold-journal 1\n
//! r <sequence> <payload_len> <crc32>\n<payload>\n
//! r <sequence + 1> ...
//! ```
//!
//! Each record holds one change as compact JSON. Its CRC-32 covers the sequence number and length
//! as written in its header, then the payload. Sequence numbers go up by one from record to
//! record and across journals; a snapshot's sequence says which records it already includes, and
//! those are skipped when the journal is replayed.
//!
//! # Why an append is durable
//!
//! The journal is opened once (after start, and after each compaction) and kept open, with
//! `O_APPEND`. An append writes the record in one `write` and calls `fdatasync`, which makes the
//! data and the file's new size durable; the file's name was made durable when it was created
//! (a compaction renames it into place and fsyncs the directory; a journal found at start gets
//! one directory fsync before its first append). Before writing, the store checks that the name
//! still stands for the file it holds open and that the directory's file system takes writes: a
//! kept file descriptor outlives a rename of its name and a read-only remount of its directory,
//! and a record written there would be read by no restart. A file system with no free block is
//! refused as well, even if the record would fit in the journal's last block: a compaction could
//! not run there.
//!
//! If the write or the fdatasync fails, the file is cut back to its last good record and synced
//! again, and the error is returned: the engine rolls the mutation back. If even that fails, the
//! next append cuts the file first.
//!
//! # Why a torn tail is ignored, and cut
//!
//! A record is acknowledged only after its fdatasync returned. A crash during the write or the
//! fdatasync can leave the last record cut short, or complete in length but not in content
//! (blocks allocated, data never written): its checksum fails, and nothing good follows, because
//! nothing is ever written after a record before its fdatasync returns. Such a tail is a change
//! that no caller was told happened, and the engine never applied its grow half (CPUs are given
//! only after the append): [`Store::load`] ignores it with a warning naming the file, the offset
//! and the number of bytes, and the next append cuts the file back to the last good record before
//! writing, so that no later record sits behind garbage. A record that does not check but has good
//! records after it, a sequence gap, a record that checks but does not decode, or (with
//! [`Store::load_checked`]) one whose change the caller refuses cannot come from a crash: that is
//! damage, and the load refuses, like a damaged snapshot.
//!
//! # Why compaction is crash-safe
//!
//! [`Store::save`] writes the snapshot with the full sequence below (the previous snapshot kept as
//! `state.json.prev`), then starts a new journal the same way: its header is written to
//! `state.journal.tmp` and fsynced, the current journal is linked to `state.journal.prev`, the
//! new one renamed over `state.journal`, and the directory fsynced. A crash between the two leaves
//! the new snapshot with the old journal, whose records it already includes and which replay
//! skips; a crash inside either leaves the old or the new file at each name. After a compaction
//! `state.json.prev` plus `state.journal.prev` replay to the state in `state.json`, which is what
//! `--restore-previous-state` uses when `state.json` is damaged.
//!
//! Compaction runs inline, on the engine's thread, after the commit that made it due has been
//! acknowledged: at 10,000 assignments a snapshot is about 2 MB and takes about 10 ms, and with a
//! threshold of at least the snapshot's size it runs once per several thousand mutations, so the
//! mutations' p99 does not see it. Running it in the background would need a copy of the state
//! and a hand-over of the journal while appends go on, for no gain a user can see.
//!
//! # The snapshot's write sequence
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
//!    the atomic replacing rename. Sharing the inode is safe because the store never writes a
//!    snapshot in place, only replaces names.
//! 3. **Rename `state.json.tmp` over `state.json`.** `rename` replaces atomically: a reader, or a
//!    crash, sees the old file or the new one, never a mix and never no file.
//! 4. **fsync the directory.** The renames are changes to the directory; until it is synced a crash
//!    may roll them back, so the snapshot is durable only now.
//!
//! The two renames are made durable together by step 4. If a crash persists one and not the other,
//! `state.json` is still a complete file (old or new) and `state.json.prev` is at worst one
//! generation older or equal to `state.json`; stale `*.tmp` files are replaced by the next save.
//!
//! A failure before step 3 leaves `state.json` untouched and removes the temp file (best effort).
//! A failure of step 4 happens after the new file has its name: `state.json` may then hold a
//! state the engine has not acknowledged; the engine's rollback writes the old state again.
//!
//! # Why load never repairs
//!
//! fsync cannot protect against a disk that lies, bit rot, a copy truncated by a full disk or an
//! editor. The headers' lengths and checksums detect these. A damaged file is evidence and the
//! daemon cannot tell which CPUs it had handed out, so [`Store::load`] never rewrites, renames or
//! deletes it: it returns an error naming the file, what is wrong (for the journal, the record's
//! offset and sequence number), and what `--restore-previous-state` would do. The operator
//! decides; [`Store::restore_previous`] moves damaged files aside to `*.corrupt` (`.corrupt.1`,
//! ... if taken) rather than deleting them. (Cutting a torn tail is not a repair of evidence:
//! those bytes are a write that never finished, see above.)

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use serde::Serialize;

use super::fsutil::{FsError, Root};

mod error;
mod format;
mod journal;
mod load;
mod recovery;
pub mod remembered;
#[cfg(test)]
mod tests;

pub use error::{PrevCopy, StoreError};
use format::{frame, len_u64};
pub use remembered::{MemoryFile, Remembered, RememberedError};

/// The snapshot format version written by this build; it reads this one, version 2 (the same
/// header, a state without prepared DRA claims: those were record files, which the engine takes
/// in at start) and version 1.
pub const FORMAT_VERSION: u32 = 3;

/// The current snapshot, in the state directory.
pub const STATE_FILE: &str = "state.json";
/// The previous snapshot.
pub const PREV_FILE: &str = "state.json.prev";
/// Where a new snapshot is written before it replaces [`STATE_FILE`].
pub const TMP_FILE: &str = "state.json.tmp";
/// Where the link to the outgoing snapshot is made before it replaces [`PREV_FILE`].
const PREV_TMP_FILE: &str = "state.json.prev.tmp";
/// Where [`Store::restore_previous`] moves a damaged snapshot (numbered `.1`, `.2`, ... if taken).
pub const CORRUPT_FILE: &str = "state.json.corrupt";
/// The journal of changes since the snapshot.
pub const JOURNAL_FILE: &str = "state.journal";
/// The lock a running daemon holds on its state directory ([`Store::lock_dir`]).
pub const LOCK_FILE: &str = "state.lock";
/// The journal before the last compaction: `state.json.prev` plus it give `state.json`.
pub const JOURNAL_PREV_FILE: &str = "state.journal.prev";
/// Where a new journal is written before it replaces [`JOURNAL_FILE`].
pub const JOURNAL_TMP_FILE: &str = "state.journal.tmp";
const JOURNAL_PREV_TMP_FILE: &str = "state.journal.prev.tmp";
/// Where [`Store::restore_previous`] moves a damaged journal.
pub const JOURNAL_CORRUPT_FILE: &str = "state.journal.corrupt";

/// The journal is compacted once it holds more than this, or more than the snapshot's size.
pub const COMPACT_MIN_BYTES: u64 = 1 << 20;

/// Test-only: compact after every N records (tests/crash.rs kills the daemon during
/// compaction with it). Read by [`Store::open`].
pub const COMPACT_EVERY_ENV: &str = "CPUPOOL_COMPACT_EVERY";

/// What [`Store::load`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded<T> {
    /// None of `state.json`, `state.json.prev` and `state.journal` exists: this is the first start.
    Fresh,
    /// The snapshot and the journal are intact, and this is the state they hold.
    State(T),
}

/// The journal as this process knows it.
#[derive(Debug, Default)]
struct Journal {
    /// Whether the fields below were learnt from the files (a load, a compaction, a survey).
    known: bool,
    /// The open journal, with the (device, inode) it had when opened; `None` until the first
    /// append after opening the store or rotating.
    file: Option<(File, (u64, u64))>,
    /// The sequence number of the last record durable in the snapshot or the journal.
    seq: u64,
    /// The length of the journal's header and good records.
    good_len: u64,
    /// The file may hold bytes past `good_len` (a torn tail, a failed append): cut them before
    /// the next append.
    cut: bool,
    /// Whether the journal's name is known to be durable in the directory.
    dir_synced: bool,
    /// Records in the journal (including those the snapshot already has).
    records: u64,
    /// The journal's length before the last append, while that append is the last write.
    before_last: Option<u64>,
    /// The engine's state is not what the files replay to (a failed undo, a journal replaced
    /// behind our back): the next write must be a whole snapshot.
    stale: bool,
}

/// The state directory and the files in it. All methods take `&self`; the engine owns the one
/// `Store` and serializes calls (the journal's bookkeeping sits behind a mutex that is never
/// contended).
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
    journal_path: PathBuf,
    last_size: AtomicU64,
    compact_every: Option<u64>,
    journal: Mutex<Journal>,
    /// `state.lock`, held with `flock` while this store writes ([`Store::lock_dir`]).
    dir_lock: std::sync::OnceLock<std::fs::File>,
}

/// Where a journal record was found: given to the callers that check each change as it is
/// replayed ([`Store::load_checked`]), so that a change they refuse is named by its file, record
/// and offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordAt {
    /// The journal file.
    pub path: PathBuf,
    /// The record's sequence number.
    pub seq: u64,
    /// Where its header starts, in bytes from the start of the file.
    pub offset: u64,
}

impl std::fmt::Display for RecordAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` record {} (byte {})", self.path.display(), self.seq, self.offset)
    }
}

impl Store {
    /// Opens the store in `state_dir`, creating the directory (mode 0700) and any missing parents
    /// if needed. An existing directory's mode is left alone. Reads no state file.
    pub fn open(state_dir: &Path) -> Result<Store, StoreError> {
        let root = Root::create(state_dir, 0o700)?;
        let compact_every =
            std::env::var(COMPACT_EVERY_ENV).ok().and_then(|v| v.parse::<u64>().ok()).filter(|n| *n > 0);
        Ok(Store {
            root,
            dir: state_dir.to_path_buf(),
            current: state_dir.join(STATE_FILE),
            prev: state_dir.join(PREV_FILE),
            journal_path: state_dir.join(JOURNAL_FILE),
            last_size: AtomicU64::new(0),
            compact_every,
            journal: Mutex::new(Journal::default()),
            dir_lock: std::sync::OnceLock::new(),
        })
    }

    /// Takes the state directory for this process: an exclusive `flock` on `state.lock`, held
    /// until the store is dropped (the kernel drops it when the process dies, so a crash leaves
    /// no stale lock). A second daemon on the same directory would otherwise compact and rotate
    /// the journal under the first one. Fails with [`StoreError::Locked`] when another process
    /// holds it.
    pub fn lock_dir(&self) -> Result<(), StoreError> {
        if self.dir_lock.get().is_some() {
            return Ok(());
        }
        let file = self.root.open_or_create(LOCK_FILE, 0o600)?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {
                let _ = self.dir_lock.set(file);
                Ok(())
            }
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                Err(StoreError::Locked { path: self.dir.join(LOCK_FILE) })
            }
            Err(e) => Err(StoreError::Io { op: "locking", path: self.dir.join(LOCK_FILE), source: e.into() }),
        }
    }

    /// The same store, compacting after every `n` records (tests).
    pub fn with_compact_every(mut self, n: u64) -> Store {
        self.compact_every = Some(n).filter(|n| *n > 0);
        self
    }

    /// The path of `state.json`.
    pub fn path(&self) -> &Path {
        &self.current
    }

    /// The path of `state.json.prev`, the previous good copy.
    pub fn prev_path(&self) -> &Path {
        &self.prev
    }

    /// The path of `state.journal`.
    pub fn journal_path(&self) -> &Path {
        &self.journal_path
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Size in bytes (header included) of the snapshot as last saved, loaded or restored by this
    /// `Store`; 0 before any of these.
    pub fn last_size(&self) -> u64 {
        self.last_size.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Journal> {
        // A panic while holding it cannot leave the bookkeeping half-updated in a way that
        // matters more than the panic itself; go on with what is there.
        self.journal.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the next write must be a whole snapshot ([`Store::save`]) rather than an
    /// [`Store::append`]: the files do not hold the engine's state (see [`Store::mark_stale`]).
    pub fn snapshot_needed(&self) -> bool {
        self.lock().stale
    }

    /// Says that the files no longer replay to the engine's state (putting a failed change back
    /// on disk failed): the next write is a whole snapshot.
    pub fn mark_stale(&self) {
        self.lock().stale = true;
    }

    /// Whether the journal has grown enough that [`Store::save`] should compact it: past the
    /// snapshot's size and [`COMPACT_MIN_BYTES`] (or [`COMPACT_EVERY_ENV`] records), or when a
    /// snapshot is needed anyway.
    pub fn compact_due(&self) -> bool {
        let j = self.lock();
        if !j.known {
            return false;
        }
        j.stale
            || self.compact_every.is_some_and(|n| j.records >= n)
            || j.good_len > COMPACT_MIN_BYTES.max(self.last_size())
    }

    /// Appends `change` to the journal durably: when this returns `Ok`, a crash at any later
    /// moment leaves it replayed by [`Store::load`]. One `write` and one `fdatasync`. On error
    /// the journal is as it was (cut back to its last good record), or will be cut back before
    /// the next append.
    pub fn append<D: Serialize>(&self, change: &D) -> Result<(), StoreError> {
        let payload = serde_json::to_vec(change)
            .map_err(|source| StoreError::Encode { path: self.journal_path.clone(), source })?;
        let mut guard = self.lock();
        // Through a plain reference, so that the open file and the counters can be borrowed apart.
        let j = &mut *guard;
        j.before_last = None;
        self.survey(j)?;
        if j.stale {
            return Err(StoreError::JournalReplaced { path: self.journal_path.clone() });
        }
        let seq = j.seq + 1;
        let bytes = journal::record(seq, &payload);
        self.check_journal(j)?;
        let io = |op: &'static str| {
            let path = self.journal_path.clone();
            move |source| StoreError::Io { op, path, source }
        };
        if j.file.is_none() {
            if !self.root.exists(JOURNAL_FILE) {
                // No journal yet (a store saved by a release without one): start one.
                self.rotate(j)?;
            }
            let file = self.root.open_append(JOURNAL_FILE)?;
            let st = rustix::fs::fstat(&file).map_err(|e| io("checking")(e.into()))?;
            j.file = Some((file, (st.st_dev, st.st_ino)));
        }
        if !j.dir_synced {
            self.root.sync_dir("")?;
            j.dir_synced = true;
        }
        let good_len = j.good_len;
        let Some((file, _)) = j.file.as_mut() else {
            return Err(StoreError::JournalReplaced { path: self.journal_path.clone() });
        };
        if j.cut {
            file.set_len(good_len).map_err(io("cutting the torn tail of"))?;
        }
        let written = file
            .write_all(&bytes)
            .map_err(io("appending to"))
            .and_then(|()| file.sync_data().map_err(io("fdatasyncing")));
        if let Err(e) = written {
            // Whatever reached the file is a change nobody will be told about: cut it now, or
            // before the next append.
            let cut = file.set_len(good_len).and_then(|()| file.sync_data());
            if let Err(cut) = &cut {
                log::warn!("cutting `{}` back after a failed append: {cut}", self.journal_path.display());
            }
            j.cut = cut.is_err();
            return Err(e);
        }
        j.cut = false;
        j.before_last = Some(good_len);
        j.good_len += len_u64(&bytes);
        j.seq = seq;
        j.records += 1;
        Ok(())
    }

    /// Takes back the last [`Store::append`], when it is the last write: the engine could not
    /// apply the change after all and has not acknowledged it. The journal is cut back to its
    /// length before that record and synced, so the files are as if it had never been written
    /// (a crash before this returns leaves the record, a change wholly made or wholly not).
    pub fn retract(&self) -> Result<(), StoreError> {
        let mut guard = self.lock();
        let j = &mut *guard;
        let (Some(before), Some((file, _))) = (j.before_last, j.file.as_mut()) else {
            return Err(StoreError::NothingToRetract { path: self.journal_path.clone() });
        };
        let io = |op: &'static str| {
            let path = self.journal_path.clone();
            move |source| StoreError::Io { op, path, source }
        };
        file.set_len(before).map_err(io("cutting the last record of"))?;
        // The cut must be durable before the next record reuses the sequence number.
        file.sync_data().map_err(io("fdatasyncing"))?;
        j.before_last = None;
        j.good_len = before;
        j.seq -= 1;
        j.records = j.records.saturating_sub(1);
        Ok(())
    }

    /// Checks, before an append, that the journal's name still stands for the file held open
    /// and that its file system takes writes (see the module docs).
    fn check_journal(&self, j: &mut Journal) -> Result<(), StoreError> {
        let fail = |errno: rustix::io::Errno| StoreError::Io {
            op: "appending to",
            path: self.journal_path.clone(),
            source: errno.into(),
        };
        let (st, vfs) = match self.root.stat_now(JOURNAL_FILE) {
            Ok(found) => found,
            Err(e) if e.kind() == io::ErrorKind::NotFound && j.file.is_none() => {
                // Created below; the directory's file system is checked by creating it.
                return Ok(());
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                j.file = None;
                j.stale = true;
                return Err(StoreError::JournalReplaced { path: self.journal_path.clone() });
            }
            Err(e) => return Err(e.into()),
        };
        if let Some((_, id)) = &j.file {
            if *id != (st.st_dev, st.st_ino) {
                j.file = None;
                j.stale = true;
                return Err(StoreError::JournalReplaced { path: self.journal_path.clone() });
            }
        }
        if vfs.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY) {
            return Err(fail(rustix::io::Errno::ROFS));
        }
        if vfs.f_bfree == 0 {
            return Err(fail(rustix::io::Errno::NOSPC));
        }
        Ok(())
    }

    /// Writes `state` as the snapshot and starts a new, empty journal (a compaction): when this
    /// returns `Ok`, a crash at any later moment leaves `state.json` holding `state`,
    /// `state.json.prev` the snapshot it replaces, and `state.journal.prev` the journal it
    /// replaces. See the module docs for the sequence and why. On error `state.json` is as it
    /// was, except after a failed directory fsync (see the module docs); a failure after the
    /// snapshot is in place leaves the old journal, whose records the snapshot includes.
    pub fn save<T: Serialize>(&self, state: &T) -> Result<(), StoreError> {
        let mut payload = serde_json::to_vec_pretty(state)
            .map_err(|source| StoreError::Encode { path: self.current.clone(), source })?;
        payload.push(b'\n');
        let mut j = self.lock();
        self.survey(&mut j)?;
        let bytes = frame(j.seq, &payload);
        self.replace_current(&bytes, true)?;
        self.rotate(&mut j)?;
        j.stale = false;
        Ok(())
    }

    /// Replaces the journal with a new one holding only its header, keeping the outgoing one as
    /// `state.journal.prev`.
    fn rotate(&self, j: &mut Journal) -> Result<(), StoreError> {
        j.file = None;
        j.before_last = None;
        let keep = || self.link_prev(JOURNAL_FILE, JOURNAL_PREV_TMP_FILE, JOURNAL_PREV_FILE);
        self.root.replace_with(Path::new(JOURNAL_FILE), JOURNAL_TMP_FILE, journal::HEADER, 0o600, keep)?;
        j.good_len = len_u64(journal::HEADER);
        j.cut = false;
        j.dir_synced = true;
        j.records = 0;
        Ok(())
    }

    /// Steps 1 to 4 of the module docs ([`Root::replace_with`]); step 2 only when `keep_prev`.
    fn replace_current(&self, bytes: &[u8], keep_prev: bool) -> Result<(), StoreError> {
        let keep = || if keep_prev { self.link_prev(STATE_FILE, PREV_TMP_FILE, PREV_FILE) } else { Ok(()) };
        self.root.replace_with(Path::new(STATE_FILE), TMP_FILE, bytes, 0o600, keep)?;
        self.last_size.store(len_u64(bytes), Ordering::Relaxed);
        Ok(())
    }

    /// Makes the outgoing `name` the previous copy `prev` (through the link `tmp`) without
    /// ever removing `name`.
    fn link_prev(&self, name: &str, tmp: &str, prev: &str) -> Result<(), FsError> {
        self.root.link_prev(name, tmp, prev)
    }
}
