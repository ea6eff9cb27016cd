//! What can go wrong with the state files, each error naming the file, and what the store knows
//! of the previous copy when the current one cannot be used.

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::host::fsutil::FsError;

/// What the store knows about `state.json.prev` when `state.json` cannot be used. Its `Display`
/// is the hint appended to the error message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrevCopy {
    /// There is no previous copy.
    Absent,
    /// The previous copy at this path is intact and decodes; `--restore-previous-state` uses it.
    Good(PathBuf),
    /// The previous copy at this path exists but cannot be used either.
    Damaged(PathBuf),
    /// The previous copy at this path decodes but breaks the state's rules as well (the caller
    /// checks them; the store knows nothing of them).
    Inconsistent(PathBuf),
    /// The error is about the previous copy itself.
    Itself,
}

impl fmt::Display for PrevCopy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrevCopy::Absent => f.write_str("; there is no previous copy to restore"),
            PrevCopy::Good(path) => write!(
                f,
                "; the previous good copy exists at `{}` (start with --restore-previous-state to use it)",
                path.display()
            ),
            PrevCopy::Damaged(path) => {
                write!(f, "; the previous copy at `{}` is damaged", path.display())
            }
            PrevCopy::Inconsistent(path) => {
                write!(f, "; the previous copy at `{}` is inconsistent too", path.display())
            }
            PrevCopy::Itself => Ok(()),
        }
    }
}

/// Why the state could not be saved, loaded or restored. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file system operation failed.
    #[error("{op} `{}`", .path.display())]
    Io {
        /// What was being done, e.g. "fsyncing".
        op: &'static str,
        /// The file or directory it was done to.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Another process holds the state directory's lock.
    #[error(
        "another process holds `{}`: only one cpupoold may use a state directory (is cpupoold already running?)",
        .path.display()
    )]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// The state could not be encoded as JSON (e.g. a map with non-string keys).
    #[error("encoding the state for `{}` as JSON", .path.display())]
    Encode {
        /// The file it was meant for.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The file ends inside its header line.
    #[error(
        "`{}` is truncated: it ends inside its header line ({len} bytes in the file){prev}",
        .path.display()
    )]
    TruncatedHeader {
        /// The damaged file.
        path: PathBuf,
        /// The file's length in bytes.
        len: u64,
        /// The previous copy.
        prev: PrevCopy,
    },
    /// The payload is shorter than the header says.
    #[error(
        "`{}` is truncated: its header announces {expected} payload bytes but only {actual} follow{prev}",
        .path.display()
    )]
    Truncated {
        /// The damaged file.
        path: PathBuf,
        /// Payload length from the header.
        expected: u64,
        /// Payload bytes present.
        actual: u64,
        /// The previous copy.
        prev: PrevCopy,
    },
    /// The payload is longer than the header says.
    #[error(
        "`{}` is damaged: its header announces {expected} payload bytes but {actual} follow{prev}",
        .path.display()
    )]
    TrailingData {
        /// The damaged file.
        path: PathBuf,
        /// Payload length from the header.
        expected: u64,
        /// Payload bytes present.
        actual: u64,
        /// The previous copy.
        prev: PrevCopy,
    },
    /// The payload's CRC-32 differs from the header's.
    #[error(
        "`{}` is corrupt: checksum mismatch (header says {expected:08x}, payload has {actual:08x}){prev}",
        .path.display()
    )]
    ChecksumMismatch {
        /// The damaged file.
        path: PathBuf,
        /// CRC-32 from the header.
        expected: u32,
        /// CRC-32 of the payload as read.
        actual: u32,
        /// The previous copy.
        prev: PrevCopy,
    },
    /// The file is in a format version this build does not read.
    #[error(
        "`{}` has state format version {found}, this cpupoold reads versions 1 to {supported} \
         (was it written by a different cpupoold release?){prev}",
        .path.display()
    )]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// Version from the header.
        found: u32,
        /// The newest version read, [`FORMAT_VERSION`](super::FORMAT_VERSION).
        supported: u32,
        /// The previous copy.
        prev: PrevCopy,
    },
    /// The first line is not a `cpupoold-state` header.
    #[error("`{}` has a bad header: {reason}{prev}", .path.display())]
    BadHeader {
        /// The file.
        path: PathBuf,
        /// What is wrong with the header.
        reason: String,
        /// The previous copy.
        prev: PrevCopy,
    },
    /// The checksum matches but the JSON does not decode into the state type.
    #[error(
        "`{}` has an intact checksum but its JSON does not decode as cpupoold state{prev}",
        .path.display()
    )]
    Decode {
        /// The file.
        path: PathBuf,
        /// The previous copy.
        prev: PrevCopy,
        /// The cause, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// `state.json` is gone but `state.json.prev` is there, so this is not a first start.
    #[error(
        "`{}` is missing but a previous copy exists, so this is not a first start \
         (was the state file deleted?){prev}",
        .path.display()
    )]
    CurrentMissing {
        /// The missing `state.json`.
        path: PathBuf,
        /// The previous copy (never [`PrevCopy::Absent`]).
        prev: PrevCopy,
    },
    /// A journal record does not check and good records follow it, or the file does not start
    /// with the journal's header: not a write cut short by a crash, but damage.
    #[error(
        "`{}` is damaged at byte {offset}{}: {reason}{JOURNAL_HINT}",
        .path.display(),
        .seq.map(|s| format!(" (record {s})")).unwrap_or_default()
    )]
    JournalCorrupt {
        /// The journal file.
        path: PathBuf,
        /// Where the damaged record (or the header) starts.
        offset: u64,
        /// The damaged record's sequence number, when its header could be read.
        seq: Option<u64>,
        /// What is wrong.
        reason: String,
    },
    /// A journal record's sequence number is not the one that must come next: records are
    /// missing between the snapshot (or the journal before) and this record.
    #[error(
        "`{}` has record {found} at byte {offset} where record {expected} must come next          (records are missing){JOURNAL_HINT}",
        .path.display()
    )]
    JournalSequence {
        /// The journal file.
        path: PathBuf,
        /// Where the record starts.
        offset: u64,
        /// The sequence number that must come next.
        expected: u64,
        /// The one found.
        found: u64,
    },
    /// A journal record checks but does not decode as a change of the state.
    #[error(
        "`{}` has an intact checksum on record {seq} at byte {offset} but it does not decode as a \
         cpupoold state change{JOURNAL_HINT}",
        .path.display()
    )]
    JournalDecode {
        /// The journal file.
        path: PathBuf,
        /// Where the record starts.
        offset: u64,
        /// Its sequence number.
        seq: u64,
        /// The cause, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// A journal record checks and decodes, but the caller refused the change it holds
    /// ([`Store::load_checked`](super::Store::load_checked)): applied, it would break the
    /// state's rules. Damage, not a crash: the daemon wrote no such record.
    #[error(
        "`{}` has an intact checksum on record {seq} at byte {offset} but the change it holds breaks \
         the state's rules: {reason}{JOURNAL_HINT}",
        .path.display()
    )]
    JournalRejected {
        /// The journal file.
        path: PathBuf,
        /// Where the record starts.
        offset: u64,
        /// Its sequence number.
        seq: u64,
        /// Why the change was refused.
        reason: String,
    },
    /// The journal file this daemon keeps open is no longer the one at its name (moved, removed
    /// or replaced behind its back): writes to it would be read by no restart.
    #[error(
        "`{}` is no longer the journal this daemon writes (was it moved, removed or replaced?); \
         the next change writes the whole state afresh",
        .path.display()
    )]
    JournalReplaced {
        /// The journal's name.
        path: PathBuf,
    },
    /// [`Store::retract`](super::Store::retract) was called when the last write was not an
    /// append.
    #[error("there is no record to take back from `{}`: the last write to it was not an append", .path.display())]
    NothingToRetract {
        /// The journal.
        path: PathBuf,
    },
    /// A restore was asked for but there is no previous copy.
    #[error("cannot restore the previous state: `{}` does not exist", .path.display())]
    NoPrevious {
        /// The missing `state.json.prev`.
        path: PathBuf,
    },
}

/// What an operator can do about a damaged journal.
const JOURNAL_HINT: &str = "; start with --restore-previous-state to keep the snapshot and the journal's \
     records before this one (the journal is moved aside to `state.journal.corrupt`)";

impl From<FsError> for StoreError {
    fn from(e: FsError) -> StoreError {
        StoreError::Io { op: e.op, path: e.path, source: e.source }
    }
}
