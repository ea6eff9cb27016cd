//! The runtime drop-in: pools created, resized and deleted over the APIs.
//!
//! `CreatePool`, `ResizePool` and `DeletePool` are persisted as one drop-in that the daemon owns,
//! [`DROPIN_NAME`] in the administrator's `config.d/` (`/etc/cpupoold/config.d/`). The
//! configuration files stay the one source of truth for pools, as `systemctl set-property` keeps
//! unit properties in drop-ins: `cat` shows what was changed, deleting the file undoes every
//! run-time change at the next reload, and a restart or a reload applies the same pools as the
//! running daemon has.
//!
//! The drop-in is read last among the files that usually exist (`90-` sorts after the `50-local`
//! convention), and it is an ordinary fragment: it merges key by key over the files before it.
//! A pool it creates takes any key it does not set from earlier files that define the same name;
//! a deleted pool is `removed = true` (or no table at all when no other file defines it). A file
//! read after it that sets the same keys would make an edit ineffective; the engine checks the
//! merged result's [`Origins`](super::Origins) and refuses such an edit instead of reporting a
//! change that did not happen.
//!
//! Writes are durable (a hidden temporary file in the same directory, fsync, rename, fsync of the
//! directory), so a crash leaves either the old or the new drop-in.

use std::io;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

use super::{fragments, ConfigDirs, ConfigError, TomlError};
use crate::core::pool::PoolName;
use crate::host::fsutil::{FsError, Root};

/// The drop-in's file name, in `config.d/` of the administrator's directory.
pub const DROPIN_NAME: &str = "90-cpupoold-runtime.toml";

const HEADER: &str = "\
# Written by cpupoold for `cpupoolctl pool create`, `resize` and `delete` (the CreatePool,
# ResizePool and DeletePool methods). It is an ordinary drop-in, read after the files before it
# in file-name order. Delete it and reload to undo every run-time pool change; comments added
# here are not kept.
";

// The edit is the engine's request type (core owns it); the drop-in writer takes it.
pub use crate::core::edit::{PoolEdit, Source};

/// Why the drop-in could not be written.
#[derive(Debug, thiserror::Error)]
#[error("{op} `{}`", path.display())]
pub struct DropinError {
    /// What was being done.
    pub op: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// The I/O error.
    #[source]
    pub source: io::Error,
}

/// The drop-in's pools, as read from disk and edited in memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Dropin {
    /// The administrator's configuration directory, which the drop-in is written below.
    etc: Root,
    path: PathBuf,
    pools: Table,
}

impl Dropin {
    /// Reads the drop-in under `dirs`; a missing file has no pools.
    pub fn read(dirs: &ConfigDirs) -> Result<Dropin, ConfigError> {
        let path = dirs.etc.join("config.d").join(DROPIN_NAME);
        let text = match fragments::read_fragment(&path) {
            Ok(text) => text,
            Err(ConfigError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                String::new()
            }
            Err(e) => return Err(e),
        };
        // Checked as a fragment first, so that a hand-edited file gets the usual errors.
        fragments::parse(&text, &path)?;
        let mut table: Table = text.parse().map_err(|e| ConfigError::Parse {
            file: path.clone(),
            pos: None,
            key: String::new(),
            source: TomlError(Box::new(e)),
        })?;
        let pools = match table.remove("pools") {
            Some(Value::Table(pools)) => pools,
            _ => Table::new(),
        };
        Ok(Dropin { etc: Root::new(&dirs.etc), path, pools })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's text; `None` when it defines nothing (the file is then removed).
    pub fn text(&self) -> Option<String> {
        if self.pools.is_empty() {
            return None;
        }
        let mut doc = Table::new();
        doc.insert("pools".into(), Value::Table(self.pools.clone()));
        // A table of tables of scalars always serializes.
        let body = toml::to_string(&doc).unwrap_or_default();
        Some(format!("{HEADER}\n{}\n", body.trim_end()))
    }

    /// Applies `edit` to the pool's table.
    pub fn apply(&mut self, edit: &PoolEdit) {
        let name = edit.name().as_str().to_owned();
        let set_source = |t: &mut Table, source: &Source| {
            for k in ["cpus", "count", "numa", "isolcpus"] {
                t.remove(k);
            }
            match source {
                Source::Cpus(cpus) => {
                    t.insert("cpus".into(), Value::String(cpus.to_string()));
                }
                Source::Count { count, numa } => {
                    t.insert("count".into(), Value::Integer(i64::from(*count)));
                    if let Some(n) = numa {
                        t.insert("numa".into(), Value::Integer(i64::from(*n)));
                    }
                }
            }
        };
        match edit {
            PoolEdit::Create { kind, source, smt, isolate, kubelet, dra, .. } => {
                let mut t = Table::new();
                t.insert("kind".into(), Value::String(kind.to_string()));
                set_source(&mut t, source);
                if let Some(smt) = smt {
                    t.insert("smt".into(), Value::String(smt.to_string()));
                }
                if let Some(b) = isolate {
                    t.insert("isolate".into(), Value::Boolean(*b));
                }
                if let Some(b) = kubelet {
                    t.insert("kubelet".into(), Value::Boolean(*b));
                }
                if let Some(b) = dra {
                    t.insert("dra".into(), Value::Boolean(*b));
                }
                self.pools.insert(name, Value::Table(t));
            }
            PoolEdit::Resize { source, .. } => {
                let entry = self.pools.entry(name).or_insert_with(|| Value::Table(Table::new()));
                if !entry.is_table() {
                    *entry = Value::Table(Table::new());
                }
                if let Value::Table(t) = entry {
                    set_source(t, source);
                }
            }
            PoolEdit::Delete { .. } => {
                let mut t = Table::new();
                t.insert("removed".into(), Value::Boolean(true));
                self.pools.insert(name, Value::Table(t));
            }
        }
    }

    /// Sets `removed = false` for the pool: it undoes an earlier file's `removed = true`.
    pub fn restore(&mut self, name: &PoolName) {
        let entry = self.pools.entry(name.as_str().to_owned()).or_insert_with(|| Value::Table(Table::new()));
        if let Value::Table(t) = entry {
            t.insert("removed".into(), Value::Boolean(false));
        }
    }

    /// Drops the pool's table altogether (a deleted pool no other file defines).
    pub fn forget(&mut self, name: &PoolName) {
        self.pools.remove(name.as_str());
    }

    /// Writes the drop-in durably, or removes it when it defines nothing. A symbolic link at
    /// `config.d/` or at the drop-in's name is not written through ([`Root`]).
    pub fn write(&self) -> Result<(), DropinError> {
        let rel = Path::new("config.d").join(DROPIN_NAME);
        match self.text() {
            None => match self.etc.remove_file(&rel) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(e.into()),
            },
            Some(text) => {
                Root::create(self.etc.path(), 0o755)?;
                self.etc.create_dir_all("config.d", 0o755)?;
                // The temporary file is hidden: a concurrent reader of config.d never takes it
                // for a drop-in.
                return Ok(self.etc.replace(&rel, text.as_bytes(), 0o644)?);
            }
        }
        Ok(self.etc.sync_dir("config.d")?)
    }
}

impl From<FsError> for DropinError {
    fn from(e: FsError) -> DropinError {
        DropinError { op: e.op, path: e.path, source: e.source }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::core::cpuset::CpuSet;
    use crate::core::pool::{PoolKind, Smt};
    use std::fs;

    fn name(s: &str) -> PoolName {
        PoolName::new(s).unwrap()
    }

    fn dirs(root: &Path) -> ConfigDirs {
        ConfigDirs { etc: root.join("etc"), vendor: root.join("vendor"), cluster: None }
    }

    #[test]
    fn create_resize_delete_round_trip_through_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = dirs(tmp.path());
        let mut d = Dropin::read(&dirs).unwrap();
        assert_eq!(d.text(), None);
        d.apply(&PoolEdit::Create {
            name: name("web"),
            kind: PoolKind::Shared,
            source: Source::Cpus(CpuSet::parse("2-3").unwrap()),
            smt: Some(Smt::Threads),
            isolate: None,
            kubelet: Some(false),
            dra: None,
        });
        d.write().unwrap();
        let text = fs::read_to_string(d.path()).unwrap();
        assert!(text.starts_with("# Written by cpupoold") && text.ends_with("\n"), "{text}");
        for line in ["[pools.web]\n", "\nkind = \"shared\"\n", "\ncpus = \"2-3\"\n", "\nsmt = \"threads\"\n"]
        {
            assert!(text.contains(line), "{line:?} in {text}");
        }

        let mut again = Dropin::read(&dirs).unwrap();
        assert_eq!(again, d);
        again.apply(&PoolEdit::Resize {
            name: name("web"),
            source: Source::Count { count: 4, numa: Some(1) },
        });
        let text = again.text().unwrap();
        assert!(!text.contains("cpus ="), "the old source is gone: {text}");
        assert!(text.contains("\ncount = 4\n") && text.contains("\nnuma = 1\n"), "{text}");
        assert!(text.contains("kubelet = false"), "other keys stay: {text}");

        again.apply(&PoolEdit::Delete { name: name("web") });
        assert!(again.text().unwrap().contains("[pools.web]\nremoved = true\n"));
        again.forget(&name("web"));
        again.write().unwrap();
        assert!(!d.path().exists(), "an empty drop-in is removed");
        // And removing what is not there is fine.
        again.write().unwrap();
    }

    #[test]
    fn the_drop_in_is_never_written_through_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = dirs(tmp.path());
        let outside = tmp.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("passwd"), "root:x:0:0\n").unwrap();
        fs::create_dir_all(&dirs.etc).unwrap();
        let create = PoolEdit::Create {
            name: name("web"),
            kind: PoolKind::Shared,
            source: Source::Cpus(CpuSet::parse("2-3").unwrap()),
            smt: None,
            isolate: None,
            kubelet: None,
            dra: None,
        };
        // config.d a link to a directory elsewhere: refused, naming the link.
        std::os::unix::fs::symlink(&outside, dirs.etc.join("config.d")).unwrap();
        let mut d = Dropin::read(&dirs).unwrap();
        d.apply(&create);
        let err = d.write().unwrap_err();
        let chain = crate::error_chain(&err);
        let link = dirs.etc.join("config.d");
        assert!(
            chain.contains(&format!("refusing to follow the symbolic link `{}`", link.display())),
            "{chain}"
        );
        assert!(!outside.join(DROPIN_NAME).exists());
        // The drop-in's own name a link to a file elsewhere: the link is replaced, the file kept.
        fs::remove_file(&link).unwrap();
        fs::create_dir_all(&link).unwrap();
        std::os::unix::fs::symlink(outside.join("passwd"), link.join(DROPIN_NAME)).unwrap();
        d.write().unwrap();
        assert_eq!(fs::read_to_string(outside.join("passwd")).unwrap(), "root:x:0:0\n");
        assert!(!fs::symlink_metadata(d.path()).unwrap().file_type().is_symlink());
        assert!(fs::read_to_string(d.path()).unwrap().contains("[pools.web]"));
    }

    #[test]
    fn a_broken_hand_edit_is_reported_with_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = dirs(tmp.path());
        fs::create_dir_all(dirs.etc.join("config.d")).unwrap();
        fs::write(dirs.etc.join("config.d").join(DROPIN_NAME), "[pools.web]\ncolour = 1\n").unwrap();
        let err = Dropin::read(&dirs).unwrap_err();
        assert_eq!(err.key(), Some("pools.web.colour"));
        assert!(err.file().unwrap().ends_with(DROPIN_NAME));
    }

    #[test]
    fn edit_keys() {
        let e = PoolEdit::Create {
            name: name("a"),
            kind: PoolKind::Exclusive,
            source: Source::Count { count: 2, numa: None },
            smt: None,
            isolate: Some(true),
            kubelet: None,
            dra: Some(true),
        };
        assert_eq!(e.keys(), ["kind", "count", "isolate", "dra"]);
        assert_eq!(PoolEdit::Delete { name: name("a") }.keys(), ["removed"]);
    }
}
