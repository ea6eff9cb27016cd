//! The durable state store: one file, `state.json`, in the state directory, and the previous good
//! copy beside it.
//!
//! The engine calls [`Store::save`] after every mutation and acknowledges the mutation only once
//! `save` has returned `Ok`. At start it calls [`Store::load`]; an operator who has been told that
//! `state.json` is damaged starts the daemon with `--restore-previous-state`, which calls
//! [`Store::restore_previous`]. The store is generic over the state type, so it knows nothing of
//! pools or CPUs.
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

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::fsutil::{FsError, Root};

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

const MAGIC: &str = "cpupoold-state";
/// A header is about 60 bytes; anything without a newline this far in is not our header.
const MAX_HEADER: usize = 128;
/// How many numbered `state.json.corrupt.N` names to try before giving up.
const MAX_CORRUPT_COPIES: u32 = 10_000;

/// What [`Store::load`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded<T> {
    /// Neither `state.json` nor `state.json.prev` exists: this is the first start.
    Fresh,
    /// `state.json` is intact and decoded.
    State(T),
}

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
        "`{}` has state format version {found}, this cpupoold reads only version {supported} \
         (was it written by a different cpupoold release?){prev}",
        .path.display()
    )]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// Version from the header.
        found: u32,
        /// [`FORMAT_VERSION`].
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
    /// A restore was asked for but there is no previous copy.
    #[error("cannot restore the previous state: `{}` does not exist", .path.display())]
    NoPrevious {
        /// The missing `state.json.prev`.
        path: PathBuf,
    },
}

impl From<FsError> for StoreError {
    fn from(e: FsError) -> StoreError {
        StoreError::Io { op: e.op, path: e.path, source: e.source }
    }
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

    /// For `--restore-previous-state`: validates `state.json.prev`, moves `state.json` (if any)
    /// aside to the first free name of `state.json.corrupt`, `state.json.corrupt.1`, ..., and
    /// durably installs a copy of `state.json.prev` as `state.json`. Returns the restored state.
    ///
    /// `state.json` is moved aside even if it is intact: the operator asked for the previous
    /// state. `state.json.prev` itself is kept.
    pub fn restore_previous<T: DeserializeOwned>(&self) -> Result<T, StoreError> {
        let (state, bytes) = self.read_previous::<T>()?;
        // Link, not rename: `state.json` keeps its name until the restored copy replaces it, and
        // `link` fails rather than overwrite an earlier corrupt copy.
        if self.root.exists(STATE_FILE) {
            self.link_aside()?;
        }
        // The damaged file must not become the previous copy, hence `keep_prev = false`.
        self.replace_current(&bytes, false)?;
        log::info!("restored `{}` from `{}`", self.current.display(), self.prev.display());
        Ok(state)
    }

    /// Decodes `state.json.prev` without changing any file: what `--restore-previous-state`
    /// would install.
    pub fn previous<T: DeserializeOwned>(&self) -> Result<T, StoreError> {
        self.read_previous().map(|(state, _)| state)
    }

    fn read_previous<T: DeserializeOwned>(&self) -> Result<(T, Vec<u8>), StoreError> {
        let bytes = match self.root.read(PREV_FILE) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StoreError::NoPrevious { path: self.prev.clone() })
            }
            Err(e) => return Err(e.into()),
        };
        let state = decode::<T>(&bytes).map_err(|d| d.into_error(self.prev.clone(), PrevCopy::Itself))?;
        Ok((state, bytes))
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

    /// Links `state.json` to the first free `state.json.corrupt[.N]`.
    fn link_aside(&self) -> Result<PathBuf, StoreError> {
        for n in 0..MAX_CORRUPT_COPIES {
            let name = if n == 0 { CORRUPT_FILE.to_owned() } else { format!("{CORRUPT_FILE}.{n}") };
            let aside = self.dir.join(&name);
            match self.root.hard_link(STATE_FILE, &name) {
                Ok(()) => {
                    log::warn!("moved `{}` aside to `{}`", self.current.display(), aside.display());
                    return Ok(aside);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(StoreError::Io {
                        op: "moving the current state file aside to",
                        path: aside,
                        source: e.source,
                    })
                }
            }
        }
        Err(StoreError::Io {
            op: "finding a free name to move the current state file aside to",
            path: self.dir.join(format!("{CORRUPT_FILE}.{MAX_CORRUPT_COPIES}")),
            source: io::Error::from(io::ErrorKind::AlreadyExists),
        })
    }

    /// Checks `state.json.prev` for an error message. Reads only.
    fn prev_copy<T: DeserializeOwned>(&self) -> PrevCopy {
        match self.root.read(PREV_FILE) {
            Ok(bytes) => match decode::<T>(&bytes) {
                Ok(_) => PrevCopy::Good(self.prev.clone()),
                Err(_) => PrevCopy::Damaged(self.prev.clone()),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => PrevCopy::Absent,
            Err(_) => PrevCopy::Damaged(self.prev.clone()),
        }
    }
}

/// Header line plus payload.
fn frame(payload: &[u8]) -> Vec<u8> {
    let header = format!("{MAGIC} {FORMAT_VERSION} {} {:08x}\n", payload.len(), crc32fast::hash(payload));
    let mut bytes = Vec::with_capacity(header.len() + payload.len());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// What is wrong with a state file's bytes; becomes a [`StoreError`] once the path and the
/// previous copy are known.
#[derive(Debug)]
enum Defect {
    TruncatedHeader { len: u64 },
    Truncated { expected: u64, actual: u64 },
    TrailingData { expected: u64, actual: u64 },
    Checksum { expected: u32, actual: u32 },
    Version { found: u32 },
    BadHeader(String),
    Decode(serde_json::Error),
}

impl Defect {
    fn into_error(self, path: PathBuf, prev: PrevCopy) -> StoreError {
        match self {
            Defect::TruncatedHeader { len } => StoreError::TruncatedHeader { path, len, prev },
            Defect::Truncated { expected, actual } => StoreError::Truncated { path, expected, actual, prev },
            Defect::TrailingData { expected, actual } => {
                StoreError::TrailingData { path, expected, actual, prev }
            }
            Defect::Checksum { expected, actual } => {
                StoreError::ChecksumMismatch { path, expected, actual, prev }
            }
            Defect::Version { found } => {
                StoreError::UnsupportedVersion { path, found, supported: FORMAT_VERSION, prev }
            }
            Defect::BadHeader(reason) => StoreError::BadHeader { path, reason, prev },
            Defect::Decode(source) => StoreError::Decode { path, prev, source },
        }
    }
}

/// Checks the header, length and checksum, then decodes the JSON.
fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Defect> {
    let window = &bytes[..bytes.len().min(MAX_HEADER)];
    let Some(newline) = window.iter().position(|&b| b == b'\n') else {
        let magic = format!("{MAGIC} ");
        // A prefix of a plausible header (including an empty file) is what a cut-off write
        // leaves; anything else is not our file.
        return Err(
            if bytes.len() < MAX_HEADER
                && (magic.as_bytes().starts_with(bytes) || bytes.starts_with(magic.as_bytes()))
            {
                Defect::TruncatedHeader { len: len_u64(bytes) }
            } else if bytes.starts_with(magic.as_bytes()) {
                Defect::BadHeader(format!("no end of header line in the first {MAX_HEADER} bytes"))
            } else {
                Defect::BadHeader(format!("the file does not start with `{MAGIC}`"))
            },
        );
    };
    let header = std::str::from_utf8(&bytes[..newline])
        .map_err(|_| Defect::BadHeader("the header line is not UTF-8".to_owned()))?;
    let payload = &bytes[newline + 1..];
    let fields: Vec<&str> = header.split(' ').collect();
    if fields[0] != MAGIC {
        return Err(Defect::BadHeader(format!("the file does not start with `{MAGIC}`")));
    }
    // The version comes first so that a future format may change everything after it.
    let version = fields.get(1).copied().unwrap_or_default();
    let found = parse_decimal(version)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| Defect::BadHeader(format!("format version {version:?} is not a number")))?;
    if found != FORMAT_VERSION {
        return Err(Defect::Version { found });
    }
    let [_, _, len, crc] = fields[..] else {
        return Err(Defect::BadHeader(format!(
            "expected `{MAGIC} <version> <length> <crc32>`, found {header:?}"
        )));
    };
    let expected_len = parse_decimal(len)
        .ok_or_else(|| Defect::BadHeader(format!("payload length {len:?} is not a number")))?;
    let expected_crc = (crc.len() == 8 && crc.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u32::from_str_radix(crc, 16).ok())
        .flatten()
        .ok_or_else(|| Defect::BadHeader(format!("checksum {crc:?} is not 8 hex digits")))?;
    let actual_len = len_u64(payload);
    if actual_len < expected_len {
        return Err(Defect::Truncated { expected: expected_len, actual: actual_len });
    }
    if actual_len > expected_len {
        return Err(Defect::TrailingData { expected: expected_len, actual: actual_len });
    }
    let actual_crc = crc32fast::hash(payload);
    if actual_crc != expected_crc {
        return Err(Defect::Checksum { expected: expected_crc, actual: actual_crc });
    }
    serde_json::from_slice(payload).map_err(Defect::Decode)
}

/// Plain ASCII digits only (`u64::from_str` would also take a leading `+`).
fn parse_decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn len_u64(bytes: &[u8]) -> u64 {
    u64::try_from(bytes.len()).unwrap_or(u64::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    struct TestState {
        generation: u32,
        pools: Vec<(String, String)>,
    }

    fn state(generation: u32) -> TestState {
        TestState { generation, pools: vec![("infra".into(), "0-1".into()), ("db".into(), "2-7".into())] }
    }

    fn new_store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("var/lib/cpupoold")).unwrap();
        (dir, store)
    }

    /// A store holding state 2 in `state.json` and state 1 in `state.json.prev`.
    fn two_saves() -> (tempfile::TempDir, Store) {
        let (dir, store) = new_store();
        store.save(&state(1)).unwrap();
        store.save(&state(2)).unwrap();
        (dir, store)
    }

    fn load(store: &Store) -> Result<Loaded<TestState>, StoreError> {
        store.load::<TestState>()
    }

    fn frame_with_header(header: &str, payload: &[u8]) -> Vec<u8> {
        let mut bytes = header.as_bytes().to_vec();
        bytes.extend_from_slice(payload);
        bytes
    }

    fn assert_names_file_and_prev(err: &StoreError, store: &Store) {
        let msg = err.to_string();
        assert!(msg.contains(&store.path().display().to_string()), "{msg}");
        assert!(msg.contains(&store.prev_path().display().to_string()), "{msg}");
        assert!(msg.contains("previous good copy exists"), "{msg}");
    }

    #[test]
    fn fresh_start() {
        let (_dir, store) = new_store();
        assert_eq!(load(&store).unwrap(), Loaded::Fresh);
        let mode = fs::metadata(store.dir()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(store.last_size(), 0);
    }

    #[test]
    fn round_trip() {
        let (_dir, store) = new_store();
        store.save(&state(1)).unwrap();
        assert_eq!(load(&store).unwrap(), Loaded::State(state(1)));
        let bytes = fs::read(store.path()).unwrap();
        assert_eq!(store.last_size(), bytes.len() as u64);
        let text = String::from_utf8(bytes).unwrap();
        let (header, payload) = text.split_once('\n').unwrap();
        assert_eq!(
            header,
            format!("cpupoold-state 1 {} {:08x}", payload.len(), crc32fast::hash(payload.as_bytes()))
        );
        assert!(!store.prev_path().exists(), "first save has nothing to keep");
        assert!(!store.dir().join(TMP_FILE).exists());
        let mode = fs::metadata(store.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn second_save_keeps_previous() {
        let (_dir, store) = two_saves();
        assert_eq!(load(&store).unwrap(), Loaded::State(state(2)));
        assert_eq!(store.restore_previous::<TestState>().unwrap(), state(1));
        let (_dir, store) = two_saves();
        store.save(&state(3)).unwrap();
        let prev = fs::read(store.prev_path()).unwrap();
        assert_eq!(decode::<TestState>(&prev).unwrap(), state(2));
        assert!(!store.dir().join(PREV_TMP_FILE).exists());
    }

    #[test]
    fn truncation_is_detected_and_names_prev() {
        let (_dir, store) = two_saves();
        let good = fs::read(store.path()).unwrap();
        let header_len = good.iter().position(|&b| b == b'\n').unwrap() + 1;
        for cut in
            [0, 1, 5, 15, 17, header_len - 1, header_len, header_len + 1, good.len() / 2, good.len() - 1]
        {
            fs::write(store.path(), &good[..cut]).unwrap();
            let err = load(&store).unwrap_err();
            assert!(
                matches!(err, StoreError::TruncatedHeader { .. } | StoreError::Truncated { .. }),
                "cut at {cut}: {err:?}"
            );
            assert_names_file_and_prev(&err, &store);
            assert_eq!(fs::read(store.path()).unwrap(), &good[..cut], "load must not touch the file");
        }
    }

    #[test]
    fn flipped_byte_fails_checksum() {
        let (_dir, store) = two_saves();
        let mut bytes = fs::read(store.path()).unwrap();
        let last = bytes.len() - 3;
        bytes[last] ^= 0x20;
        fs::write(store.path(), &bytes).unwrap();
        let err = load(&store).unwrap_err();
        let StoreError::ChecksumMismatch { expected, actual, .. } = err else { panic!("{err:?}") };
        assert_ne!(expected, actual);
        assert_names_file_and_prev(&err, &store);
        assert_eq!(fs::read(store.path()).unwrap(), bytes);
    }

    #[test]
    fn wrong_version() {
        let (_dir, store) = two_saves();
        fs::write(store.path(), frame_with_header("cpupoold-state 2 whatever\n", b"{}")).unwrap();
        let err = load(&store).unwrap_err();
        assert!(matches!(err, StoreError::UnsupportedVersion { found: 2, supported: 1, .. }), "{err:?}");
        assert_names_file_and_prev(&err, &store);
    }

    #[test]
    fn bad_headers() {
        let (_dir, store) = two_saves();
        for bytes in [
            b"{\"generation\": 1}\n".to_vec(),
            b"not a state file".to_vec(),
            frame_with_header("cpupoold-state x 2 00000000\n", b"{}"),
            frame_with_header("cpupoold-state 1 2\n", b"{}"),
            frame_with_header("cpupoold-state 1 +2 00000000\n", b"{}"),
            frame_with_header("cpupoold-state 1 2 xyz\n", b"{}"),
            vec![b'c'; 200],
        ] {
            fs::write(store.path(), &bytes).unwrap();
            let err = load(&store).unwrap_err();
            assert!(matches!(err, StoreError::BadHeader { .. }), "{bytes:?}: {err:?}");
            assert_names_file_and_prev(&err, &store);
        }
    }

    #[test]
    fn trailing_data() {
        let (_dir, store) = two_saves();
        let mut bytes = fs::read(store.path()).unwrap();
        bytes.extend_from_slice(b"junk");
        fs::write(store.path(), &bytes).unwrap();
        let err = load(&store).unwrap_err();
        assert!(matches!(err, StoreError::TrailingData { .. }), "{err:?}");
    }

    #[test]
    fn json_of_the_wrong_shape() {
        let (_dir, store) = two_saves();
        fs::write(store.path(), frame(b"{\"generation\": \"one\"}\n")).unwrap();
        let err = load(&store).unwrap_err();
        assert!(matches!(err, StoreError::Decode { .. }), "{err:?}");
        assert_names_file_and_prev(&err, &store);
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn damaged_prev_is_reported() {
        let (_dir, store) = two_saves();
        fs::write(store.prev_path(), b"").unwrap();
        fs::write(store.path(), b"").unwrap();
        let msg = load(&store).unwrap_err().to_string();
        assert!(msg.contains("previous copy at") && msg.ends_with("is damaged"), "{msg}");
        let (_dir, store) = new_store();
        store.save(&state(1)).unwrap();
        fs::write(store.path(), b"").unwrap();
        let msg = load(&store).unwrap_err().to_string();
        assert!(msg.contains("no previous copy"), "{msg}");
    }

    #[test]
    fn missing_current_with_prev() {
        let (_dir, store) = two_saves();
        fs::remove_file(store.path()).unwrap();
        let err = load(&store).unwrap_err();
        assert!(matches!(err, StoreError::CurrentMissing { .. }), "{err:?}");
        assert_names_file_and_prev(&err, &store);
        assert_eq!(store.restore_previous::<TestState>().unwrap(), state(1));
        assert!(!store.dir().join(CORRUPT_FILE).exists());
        assert_eq!(load(&store).unwrap(), Loaded::State(state(1)));
    }

    #[test]
    fn restore_previous_moves_corrupt_aside() {
        let (_dir, store) = two_saves();
        let corrupt1 = b"cpupoold-state 1 9".to_vec();
        fs::write(store.path(), &corrupt1).unwrap();
        assert!(load(&store).is_err());
        assert_eq!(store.restore_previous::<TestState>().unwrap(), state(1));
        assert_eq!(load(&store).unwrap(), Loaded::State(state(1)));
        assert_eq!(fs::read(store.dir().join(CORRUPT_FILE)).unwrap(), corrupt1);
        assert_eq!(fs::read(store.path()).unwrap(), fs::read(store.prev_path()).unwrap());
        assert_eq!(store.last_size(), fs::metadata(store.path()).unwrap().len());

        let corrupt2 = b"garbage".to_vec();
        fs::write(store.path(), &corrupt2).unwrap();
        assert_eq!(store.restore_previous::<TestState>().unwrap(), state(1));
        assert_eq!(fs::read(store.dir().join(CORRUPT_FILE)).unwrap(), corrupt1);
        assert_eq!(fs::read(store.dir().join("state.json.corrupt.1")).unwrap(), corrupt2);

        // Saving after a restore works as usual.
        store.save(&state(4)).unwrap();
        assert_eq!(load(&store).unwrap(), Loaded::State(state(4)));
    }

    #[test]
    fn restore_without_or_with_damaged_prev() {
        let (_dir, store) = new_store();
        store.save(&state(1)).unwrap();
        let err = store.restore_previous::<TestState>().unwrap_err();
        assert!(matches!(err, StoreError::NoPrevious { .. }), "{err:?}");

        let (_dir, store) = two_saves();
        fs::write(store.prev_path(), b"cpupoold-state 1 4 00000000\n{}").unwrap();
        let before = fs::read(store.path()).unwrap();
        let err = store.restore_previous::<TestState>().unwrap_err();
        assert!(matches!(err, StoreError::Truncated { .. }), "{err:?}");
        assert!(err.to_string().contains(&store.prev_path().display().to_string()));
        assert_eq!(fs::read(store.path()).unwrap(), before, "nothing moved when prev is bad");
        assert!(!store.dir().join(CORRUPT_FILE).exists());
    }

    // Tests run as root, which ignores mode bits, so failures are made with directories standing
    // where the store wants to create files.

    #[test]
    fn failed_temp_create_leaves_state_alone() {
        let (_dir, store) = two_saves();
        let before = fs::read(store.path()).unwrap();
        let tmp = store.dir().join(TMP_FILE);
        fs::create_dir(&tmp).unwrap();
        let err = store.save(&state(3)).unwrap_err();
        let StoreError::Io { ref path, .. } = err else { panic!("{err:?}") };
        assert_eq!(path, &tmp);
        assert!(err.to_string().contains(&tmp.display().to_string()), "{err}");
        assert!(std::error::Error::source(&err).is_some());
        assert_eq!(fs::read(store.path()).unwrap(), before);
        assert_eq!(load(&store).unwrap(), Loaded::State(state(2)));
    }

    #[test]
    fn failed_prev_link_leaves_state_alone_and_removes_temp() {
        let (_dir, store) = two_saves();
        let before = fs::read(store.path()).unwrap();
        let prev_before = fs::read(store.prev_path()).unwrap();
        let blocker = store.dir().join(PREV_TMP_FILE);
        fs::create_dir_all(blocker.join("x")).unwrap();
        let err = store.save(&state(3)).unwrap_err();
        let StoreError::Io { ref path, .. } = err else { panic!("{err:?}") };
        assert_eq!(path, &blocker);
        assert_eq!(fs::read(store.path()).unwrap(), before);
        assert_eq!(fs::read(store.prev_path()).unwrap(), prev_before);
        assert!(!store.dir().join(TMP_FILE).exists());
    }

    #[test]
    fn blocked_state_path_fails_typed() {
        let (_dir, store) = new_store();
        // A non-empty directory named `state.json`: rename onto it fails.
        fs::create_dir_all(store.path().join("x")).unwrap();
        let err = store.save(&state(1)).unwrap_err();
        assert!(matches!(err, StoreError::Io { .. }), "{err:?}");
        assert!(store.path().join("x").is_dir());
        assert!(!store.dir().join(TMP_FILE).exists());
    }

    #[test]
    fn encode_error_is_typed() {
        use std::collections::HashMap;
        let (_dir, store) = new_store();
        let bad: HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let err = store.save(&bad).unwrap_err();
        assert!(matches!(err, StoreError::Encode { .. }), "{err:?}");
        assert!(!store.path().exists());
    }

    #[test]
    fn links_in_the_state_directory_are_never_followed() {
        let (dir, store) = two_saves();
        let outside = dir.path().join("outside");
        fs::write(&outside, b"precious\n").unwrap();
        // A link at the temporary name: removed, the outside file keeps its bytes.
        std::os::unix::fs::symlink(&outside, store.dir().join(TMP_FILE)).unwrap();
        store.save(&state(3)).unwrap();
        assert_eq!(fs::read(&outside).unwrap(), b"precious\n");
        assert_eq!(load(&store).unwrap(), Loaded::State(state(3)));
        // A link at `state.json`: refused when read, naming the link; restoring moves the link
        // aside and installs a real file.
        fs::remove_file(store.path()).unwrap();
        std::os::unix::fs::symlink(&outside, store.path()).unwrap();
        let err = load(&store).unwrap_err();
        let chain = crate::engine::error_chain(&err);
        assert!(
            chain.contains(&format!("refusing to follow the symbolic link `{}`", store.path().display())),
            "{chain}"
        );
        assert_eq!(store.restore_previous::<TestState>().unwrap(), state(2));
        assert!(!fs::symlink_metadata(store.path()).unwrap().file_type().is_symlink());
        assert_eq!(fs::read(&outside).unwrap(), b"precious\n");
        // A link at `state.json.prev`: refused too.
        fs::remove_file(store.prev_path()).unwrap();
        std::os::unix::fs::symlink(&outside, store.prev_path()).unwrap();
        assert!(matches!(store.previous::<TestState>(), Err(StoreError::Io { .. })));
        let msg = load(&store).map(|_| ()).and_then(|()| store.restore_previous::<TestState>().map(drop));
        assert!(msg.is_err());
        assert_eq!(fs::read(&outside).unwrap(), b"precious\n");
    }
}
