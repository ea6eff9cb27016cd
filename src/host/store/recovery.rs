//! What the operator's `--restore-previous-state` does: install the previous good copy, moving
//! the damaged file aside rather than deleting it; and what the store tells about that copy when
//! the current file cannot be loaded.

use std::io;
use std::path::PathBuf;

use serde::de::DeserializeOwned;

use super::format::decode;
use super::{PrevCopy, Store, StoreError, CORRUPT_FILE, PREV_FILE, STATE_FILE};

/// How many numbered `state.json.corrupt.N` names to try before giving up.
const MAX_CORRUPT_COPIES: u32 = 10_000;

impl Store {
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
    pub(super) fn prev_copy<T: DeserializeOwned>(&self) -> PrevCopy {
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
