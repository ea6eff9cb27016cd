//! A pool edit turned into configuration: the runtime drop-in changed by the edit, the whole
//! configuration it yields, and the proof that the edit takes effect (no file read after the
//! drop-in sets the same keys again). Nothing is written here; the engine writes the drop-in
//! once the new pools fit the live assignments, and writes the old one back if applying fails.

use std::path::{Path, PathBuf};

use super::runtime::{Dropin, PoolEdit};
use super::{pool_key, ConfigDirs, ConfigError, Settings};

/// Where the engine reads its configuration: on a reload request and to check a pool edit.
pub struct ConfigSource {
    /// The configuration directories.
    pub dirs: ConfigDirs,
    /// Adjusts what was loaded (the sandbox confines every root to its directory).
    pub adjust: Box<dyn Fn(&mut Settings) + Send>,
}

impl ConfigSource {
    /// Loads the settings, with `replace` standing in for one file if given.
    pub fn load(&self, replace: Option<(&Path, Option<&str>)>) -> Result<Settings, ConfigError> {
        let mut settings = match replace {
            Some(r) => super::load_with(&self.dirs, r)?,
            None => super::load(&self.dirs)?,
        };
        (self.adjust)(&mut settings);
        Ok(settings)
    }
}

/// An edit ready to be written: the drop-in before and after, and the settings after.
pub struct PreparedEdit {
    /// The runtime drop-in as it is on disk (written back if applying the edit fails).
    pub old: Dropin,
    /// The runtime drop-in with the edit.
    pub new: Dropin,
    /// The whole configuration with `new` in place.
    pub settings: Settings,
}

/// Why an edit cannot be made; nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    /// The configuration on disk cannot be read as it is.
    #[error("reading the configuration")]
    Read(#[source] Box<ConfigError>),
    /// The configuration with the edit is invalid (`dropin` is the runtime drop-in, so a
    /// caller can tell an error in the edit's own keys from one elsewhere).
    #[error("the configuration with the edit is invalid")]
    Invalid {
        /// The runtime drop-in.
        dropin: PathBuf,
        /// What the parser said.
        #[source]
        source: Box<ConfigError>,
    },
    /// A file read after the runtime drop-in sets the key again, so the edit would not take
    /// effect.
    #[error("`{key}` is set again by `{}`, which is read after `{}`; change it there", file.display(), dropin.display())]
    Overridden {
        /// The key.
        key: String,
        /// The file that wins.
        file: PathBuf,
        /// The runtime drop-in.
        dropin: PathBuf,
    },
}

/// Merges `edit` into the runtime drop-in and loads the whole configuration with it, checking
/// that the edit takes effect.
pub fn prepare(src: &ConfigSource, edit: &PoolEdit) -> Result<PreparedEdit, EditError> {
    let name = edit.name();
    let old = Dropin::read(&src.dirs).map_err(|e| EditError::Read(Box::new(e)))?;
    let mut new = old.clone();
    let load = |d: &Dropin| {
        let text = d.text();
        src.load(Some((d.path(), text.as_deref())))
            .map_err(|e| EditError::Invalid { dropin: d.path().to_owned(), source: Box::new(e) })
    };
    let defines = |s: &Settings| s.pools.iter().any(|p| &p.name == name);
    let settings = match edit {
        PoolEdit::Delete { .. } => {
            // Without a table, unless another file defines the pool too.
            new.forget(name);
            let settings = load(&new)?;
            if defines(&settings) {
                new.apply(edit);
                load(&new)?
            } else {
                settings
            }
        }
        _ => {
            new.apply(edit);
            let settings = load(&new)?;
            if defines(&settings) {
                settings
            } else {
                // An earlier file removes a pool of this name: bring it back.
                new.restore(name);
                load(&new)?
            }
        }
    };
    let wins = |key: &str| settings.origins.get(key).filter(|f| *f != new.path()).map(ToOwned::to_owned);
    let overridden = |key: String, file: Option<PathBuf>| EditError::Overridden {
        key,
        file: file.unwrap_or_default(),
        dropin: new.path().to_owned(),
    };
    let removed = pool_key(name.as_str(), "removed");
    match edit {
        PoolEdit::Delete { .. } if defines(&settings) => {
            let file = wins(&removed).or_else(|| wins(&pool_key(name.as_str(), "")));
            return Err(overridden(removed, file));
        }
        PoolEdit::Delete { .. } => {}
        _ if !defines(&settings) => {
            let file = wins(&removed);
            return Err(overridden(removed, file));
        }
        _ => {
            for field in edit.keys() {
                let key = pool_key(name.as_str(), field);
                if let Some(file) = wins(&key) {
                    return Err(overridden(key, Some(file)));
                }
            }
        }
    }
    Ok(PreparedEdit { old, new, settings })
}
