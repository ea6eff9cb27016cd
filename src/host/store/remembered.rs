//! Remembered host values: what a keeper found in a kernel file before its first write there,
//! kept durably in one JSON file of the state directory (`irq.json`, `power.json`,
//! `housekeeping.json`), so that the daemon can put it back when the setting is no longer
//! wanted, when it stops, and after a crash.
//!
//! Data flow: a keeper [`Remembered::load`]s its file once at start, changes the value in memory
//! as it decides (through `Deref`/`DerefMut`), and calls [`Remembered::save`] *before* it writes
//! the kernel file the change is about: a crash after any write then finds the value it replaced
//! on disk. A save is [`Root::replace_with`] (temp file, fsync, rename, fsync of the directory)
//! that first links the outgoing file to `NAME.prev`, as the state store keeps its previous
//! snapshot. A file that cannot be read at start (a disk that lies, an editor) falls back to
//! that previous copy, with an error naming both; the damaged file is not kept as the next
//! previous copy. A memory made [`Remembered::deleted_when_empty`] leaves no file behind once it
//! holds nothing: its save [`Remembered::delete`]s the file and the previous copy instead.
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::host::fsutil::{FsError, Root, MAX_REMEMBERED_BYTES};

/// Which file a keeper's memory lives in, and the words its log lines use.
#[derive(Debug, Clone, Copy)]
pub struct MemoryFile {
    /// The file in the state directory (`irq.json`).
    pub name: &'static str,
    /// The keeper, as its log lines begin (`irq`).
    pub keeper: &'static str,
    /// What it remembers, for people (`the affinities`).
    pub holds: &'static str,
}

impl MemoryFile {
    /// The previous copy's name (`irq.json.prev`).
    pub fn prev(&self) -> String {
        format!("{}.prev", self.name)
    }
}

/// Why a memory file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RememberedError {
    /// The file or its directory could not be read or written.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// The file holds something that is not the memory.
    #[error("`{}` is not readable", path.display())]
    Decode {
        /// The file.
        path: PathBuf,
        /// What the JSON parser said.
        #[source]
        source: serde_json::Error,
    },
    /// The memory could not be encoded.
    #[error("encoding `{}`", path.display())]
    Encode {
        /// The file it was for.
        path: PathBuf,
        /// What the encoder said.
        #[source]
        source: serde_json::Error,
    },
}

/// A keeper's durable memory of host values (module docs).
#[derive(Debug)]
pub struct Remembered<T> {
    dir: PathBuf,
    file: MemoryFile,
    value: T,
    /// Whether the next save keeps the file it replaces as the previous copy: not when start
    /// found it damaged.
    keep_prev: bool,
    /// Whether the value holds nothing, for a memory whose save then deletes its files.
    empty: Option<fn(&T) -> bool>,
}

impl<T: Serialize + DeserializeOwned + Default> Remembered<T> {
    /// The memory `file` in `state_dir` left by an earlier run, its previous copy when it is
    /// damaged, or an empty memory (each fallback logged as an error).
    pub fn load(state_dir: &Path, file: MemoryFile) -> Remembered<T> {
        let root = Root::new(state_dir);
        let prev = state_dir.join(file.prev());
        let (value, keep_prev) = match read(&root, file.name) {
            Ok(value) => (value.unwrap_or_default(), true),
            Err(why) => {
                let why = crate::error_chain(&why);
                let (k, holds) = (file.keeper, file.holds);
                let value = match read(&root, &file.prev()) {
                    Ok(Some(prev_value)) => {
                        log::error!(
                            "{k}: {why}; using the previous copy `{}`: {holds} remembered since its last save \
                             are lost",
                            prev.display()
                        );
                        prev_value
                    }
                    Ok(None) => {
                        log::error!(
                            "{k}: {why}, and there is no previous copy `{}`; {holds} it remembered cannot be \
                             restored",
                            prev.display()
                        );
                        T::default()
                    }
                    Err(prev_why) => {
                        log::error!(
                            "{k}: {why}, and the previous copy cannot be used either: {}; {holds} they \
                             remembered cannot be restored",
                            crate::error_chain(&prev_why)
                        );
                        T::default()
                    }
                };
                (value, false)
            }
        };
        Remembered { dir: state_dir.to_owned(), file, value, keep_prev, empty: None }
    }

    /// This memory, whose [`save`](Remembered::save) deletes the file and its previous copy
    /// when `empty` says the value holds nothing, rather than writing an empty memory.
    pub fn deleted_when_empty(mut self, empty: fn(&T) -> bool) -> Remembered<T> {
        self.empty = Some(empty);
        self
    }

    /// Writes the memory durably, keeping the file it replaces as the previous copy (unless
    /// that is the damaged file start could not read); or [`delete`](Remembered::delete)s it,
    /// for a memory [`deleted_when_empty`](Remembered::deleted_when_empty) that holds nothing.
    pub fn save(&mut self) -> Result<(), RememberedError> {
        if self.empty.is_some_and(|empty| empty(&self.value)) {
            return self.delete();
        }
        let name = self.file.name;
        let data = serde_json::to_vec_pretty(&self.value)
            .map_err(|source| RememberedError::Encode { path: self.dir.join(name), source })?;
        let root = Root::new(&self.dir);
        let (prev, prev_tmp) = (self.file.prev(), format!(".{name}.prev.tmp"));
        let keep = || if self.keep_prev { root.link_prev(name, &prev_tmp, &prev) } else { Ok(()) };
        root.replace_with(Path::new(name), &format!(".{name}.tmp"), &data, 0o600, keep)?;
        self.keep_prev = true;
        Ok(())
    }

    /// Deletes the file and its previous copy, durably (the directory is synced): nothing is
    /// remembered any more. The value in memory is left as it is; files already gone are fine.
    pub fn delete(&mut self) -> Result<(), RememberedError> {
        let root = Root::new(&self.dir);
        let (prev, mut removed) = (self.file.prev(), false);
        // The file first: a crash before the previous copy goes leaves no memory to read, which
        // is what the deletion says; the previous copy is only read when the file is damaged.
        for name in [self.file.name, prev.as_str()] {
            match root.remove_file(name) {
                Ok(()) => removed = true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        if removed {
            root.sync_dir("")?;
        }
        // Nothing damaged is left to keep out of the previous copy.
        self.keep_prev = true;
        Ok(())
    }

    /// [`Remembered::save`], a failure logged as an error naming the keeper; whether it saved.
    pub fn save_or_log(&mut self) -> bool {
        match self.save() {
            Ok(()) => true,
            Err(e) => {
                log::error!(
                    "{}: saving {} remembered failed: {}",
                    self.file.keeper,
                    self.file.holds,
                    crate::error_chain(&e)
                );
                false
            }
        }
    }

    /// The file's path, for messages.
    pub fn path(&self) -> PathBuf {
        self.dir.join(self.file.name)
    }
}

/// The memory in `name` below `root`: `Ok(None)` when there is none.
fn read<T: DeserializeOwned>(root: &Root, name: &str) -> Result<Option<T>, RememberedError> {
    match root.read_own(name, MAX_REMEMBERED_BYTES) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| RememberedError::Decode { path: root.path().join(name), source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

impl<T> Deref for Remembered<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> DerefMut for Remembered<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const FILE: MemoryFile = MemoryFile { name: "m.json", keeper: "test", holds: "the values" };

    #[test]
    fn a_damaged_memory_falls_back_to_the_copy_before_its_last_save() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let mut m: Remembered<BTreeMap<String, String>> = Remembered::load(dir.path(), FILE);
        assert!(m.is_empty(), "none yet");
        m.insert("a".into(), "1".into());
        m.save().unwrap_or_else(|e| panic!("{e}"));
        assert!(!dir.path().join("m.json.prev").exists(), "first save: nothing to keep");
        m.insert("b".into(), "2".into());
        m.save().unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join("m.json"), "{\"a\": ").unwrap_or_else(|e| panic!("{e}"));
        let mut back: Remembered<BTreeMap<String, String>> = Remembered::load(dir.path(), FILE);
        assert_eq!(*back, BTreeMap::from([("a".to_owned(), "1".to_owned())]));
        // The damaged file is not kept as the previous copy.
        back.save().unwrap_or_else(|e| panic!("{e}"));
        let prev = std::fs::read_to_string(dir.path().join("m.json.prev")).unwrap_or_else(|e| panic!("{e}"));
        assert!(prev.contains("\"a\""), "{prev}");
    }

    #[test]
    fn a_memory_deleted_when_empty_leaves_no_file_and_no_previous_copy() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let load = || {
            Remembered::<BTreeMap<String, String>>::load(dir.path(), FILE)
                .deleted_when_empty(BTreeMap::is_empty)
        };
        let mut m = load();
        m.save().unwrap_or_else(|e| panic!("{e}"));
        assert!(!dir.path().join("m.json").exists(), "nothing remembered: no file written");
        m.insert("a".into(), "1".into());
        m.save().unwrap_or_else(|e| panic!("{e}"));
        m.insert("b".into(), "2".into());
        m.save().unwrap_or_else(|e| panic!("{e}"));
        assert!(dir.path().join("m.json.prev").exists());
        assert_eq!(load().len(), 2);
        m.clear();
        m.save().unwrap_or_else(|e| panic!("{e}"));
        assert!(!dir.path().join("m.json").exists());
        assert!(!dir.path().join("m.json.prev").exists(), "the previous copy goes with it");
        assert!(load().is_empty());
        // Deleting what is already gone is fine.
        m.delete().unwrap_or_else(|e| panic!("{e}"));
        // A memory not made so writes an empty one.
        let mut plain: Remembered<BTreeMap<String, String>> = Remembered::load(dir.path(), FILE);
        plain.save().unwrap_or_else(|e| panic!("{e}"));
        assert!(dir.path().join("m.json").exists());
    }
}
