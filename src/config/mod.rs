//! Configuration, read in three stages so that every error can name the file and the key.
//!
//! 1. **Fragments** (`fragments`): each TOML file is parsed on its own, every key optional,
//!    unknown keys rejected. A parse error names the file, the line and the key path
//!    (`pools.dp.count`).
//! 2. **Inputs** (`inputs`): the fragments merged in order, later files winning key by key, with
//!    the file that last set each key recorded in [`Origins`]. A pool's CPU source (`cpus`,
//!    `count` with its `numa`, `isolcpus`) is one unit: the last file that sets any of them
//!    decides it.
//! 3. **Settings** ([`Settings`]): the merged inputs validated and typed, defaults filled in.
//!    [`Settings::resolve_pools`] then checks the pools against the host's topology.
//!
//! # Files and merge order
//!
//! With the default [`ConfigDirs`], fragments are merged in this order:
//!
//! 1. `/usr/lib/cpupoold/config.d/*.toml`, vendor drop-ins, in lexical order of file name. A
//!    vendor drop-in is skipped (masked, as systemd does it) when `/etc/cpupoold/config.d/` has a
//!    file of the same name; a symlink to `/dev/null` there masks it without replacing it.
//! 2. `/etc/cpupoold/config.toml`, the main file.
//! 3. `/etc/cpupoold/config.d/*.toml`, local drop-ins, in lexical order of file name.
//! 4. The cluster fragment ([`ConfigDirs::cluster`], `/run/cpupoold/cluster.toml`), when the
//!    `k8s` integration has written one from a ConfigMap. It lives in the runtime directory, so
//!    after a reboot without an API server the local files alone apply.
//!
//! The daemon itself writes one local drop-in, `config.d/90-cpupoold-runtime.toml`, for pools
//! created, resized or deleted over the APIs (see [`runtime`]). A pool table with
//! `removed = true` removes the pool defined by earlier files.
//!
//! Missing directories and files are not errors. Only `*.toml` files are read; hidden files and
//! directories are skipped. [`load_str`] reads a single fragment from memory, [`load_strs`]
//! several (tests and the fuzz targets); a Kubernetes ConfigMap is checked as the cluster file
//! would read on top of the local files ([`load_with`]) before it is written.
//!
//! ```toml
//! [paths]
//! state_dir = "/var/lib/cpupoold"
//!
//! [daemon]
//! log_level = "debug"
//!
//! [pools.sys]
//! kind = "reserved"
//! count = 2
//!
//! [pools.dp]
//! kind = "exclusive"
//! count = 8
//! numa = 1
//! isolate = true
//! ```
#![deny(missing_docs)]

mod cluster;
pub mod edit;
mod fragments;
mod inputs;
mod metrics;
pub mod runtime;
mod settings;

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

pub use cluster::{
    K8s, Kubelet, DEFAULT_MILLICPUS_PER_DEVICE, DEFAULT_REPORT_INTERVAL_MS, DEFAULT_RESOURCE_PREFIX,
    MAX_SHARED_DEVICES,
};
pub use metrics::{parse_metrics_listen, Listen, Metrics, DEFAULT_METRICS_PORT};
pub use settings::{
    power_key, Backend, Cache, Irq, IrqPool, Paths, Power, Settings, DEFAULT_ADMIN_GROUP,
    DEFAULT_HOST_CGROUPS, DEFAULT_LOG_LEVEL,
};

use crate::core::cpuset::CpuSetError;
use crate::core::pool::PoolError;
use crate::core::state;

/// The directories fragments are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigDirs {
    /// The administrator's directory: `config.toml` and `config.d/` (`/etc/cpupoold`).
    pub etc: PathBuf,
    /// The package's directory: `config.d/` (`/usr/lib/cpupoold`).
    pub vendor: PathBuf,
    /// The cluster's fragment (`<runtime_dir>/cluster.toml`, written by the `k8s` integration
    /// from the chosen ConfigMap), merged after every other file when it exists. `None`: there
    /// is no cluster integration.
    pub cluster: Option<PathBuf>,
}

impl Default for ConfigDirs {
    fn default() -> Self {
        ConfigDirs { etc: "/etc/cpupoold".into(), vendor: "/usr/lib/cpupoold".into(), cluster: None }
    }
}

impl ConfigDirs {
    /// The fragment files that exist, in merge order (masked vendor drop-ins left out).
    pub fn files(&self) -> Result<Vec<PathBuf>, ConfigError> {
        fragments::files(self)
    }
}

/// Whether a change of `key` takes effect only when the daemon starts again: the roots and
/// directories, the kubelet wing (device plugin, NRI, DRA), the API server client, the metrics
/// listener, the API's admin group and the backend are set up once, at start. A reload
/// applies every other key.
pub fn takes_effect_at_restart(key: &str) -> bool {
    const SECTIONS: [&str; 4] = ["paths.", "kubelet.", "k8s.", "metrics."];
    const KEYS: [&str; 2] = ["daemon.admin_group", "daemon.backend"];
    SECTIONS.iter().any(|s| key.starts_with(s)) || KEYS.contains(&key)
}

/// Whether `name` is a name Kubernetes accepts for a node (an RFC 1123 subdomain).
pub fn is_node_name(name: &str) -> bool {
    cluster::is_dns_subdomain(name)
}

/// Reads, merges and validates every fragment under `dirs`.
pub fn load(dirs: &ConfigDirs) -> Result<Settings, ConfigError> {
    let fragments = fragments::read_all(dirs)?;
    Settings::from_inputs(inputs::Inputs::merge_all(fragments)?)
}

/// Like [`load`], with `replace`'s text standing in for that file: `Some(text)` whether or not the
/// file exists, `None` as if it did not exist. Used to check an edit before it is written.
pub fn load_with(dirs: &ConfigDirs, replace: (&Path, Option<&str>)) -> Result<Settings, ConfigError> {
    let fragments = fragments::read_all_with(dirs, Some(replace))?;
    Settings::from_inputs(inputs::Inputs::merge_all(fragments)?)
}

/// Reads a single fragment held in memory; `name` stands for its file name in errors.
pub fn load_str(text: &str, name: &str) -> Result<Settings, ConfigError> {
    load_strs(&[(name, text)])
}

/// Reads fragments held in memory, `(name, text)` in merge order, through the same three stages
/// as [`load`]; each name stands for its file name in errors.
pub fn load_strs(fragments: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    let parsed = fragments
        .iter()
        .map(|(name, text)| {
            let file = Path::new(name);
            fragments::parse(text, file).map(|f| (file.to_owned(), f))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Settings::from_inputs(inputs::Inputs::merge_all(parsed)?)
}

/// Which file last set each key, with the value it set, and which keys a later file set over
/// an earlier one's different value (a reload names those: an edit of `config.toml` that a
/// drop-in overrides changes nothing, and says which file wins).
///
/// Keys are dotted paths as written in TOML: `paths.state_dir`, `daemon.host_cgroups`,
/// `pools.dp.count`. `pools.NAME` itself records the last file that mentioned the pool at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origins {
    files: BTreeMap<String, PathBuf>,
    /// Each leaf key's merged value, as parsed (`Debug`), to tell a reload what changed.
    values: BTreeMap<String, String>,
    /// Keys a later file set over an earlier file's other value: (earlier, later).
    overridden: BTreeMap<String, (PathBuf, PathBuf)>,
}

impl Origins {
    /// The file for `key`, or failing that for the pool the key belongs to.
    pub(crate) fn file_for(&self, key: &str) -> Option<PathBuf> {
        let pool = key.strip_prefix("pools.").and_then(|rest| {
            // `pools.NAME.field`: NAME may be quoted and contain dots, so cut at the last dot.
            rest.rsplit_once('.').map(|(name, _)| format!("pools.{name}"))
        });
        self.get(key).or_else(|| pool.as_deref().and_then(|p| self.get(p))).map(Path::to_owned)
    }

    /// The file that last set `key`, if any file did.
    pub fn get(&self, key: &str) -> Option<&Path> {
        self.files.get(key).map(PathBuf::as_path)
    }

    /// Every key set by a file, with the file, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Path)> {
        self.files.iter().map(|(k, f)| (k.as_str(), f.as_path()))
    }

    /// The keys whose merged value differs from `before`'s (set, unset or changed), in order.
    pub fn changed_since(&self, before: &Origins) -> Vec<String> {
        let keys: std::collections::BTreeSet<&String> =
            self.values.keys().chain(before.values.keys()).collect();
        keys.into_iter().filter(|k| self.values.get(*k) != before.values.get(*k)).cloned().collect()
    }

    /// Keys a later file set over an earlier file's other value: (key, earlier file, the file
    /// that wins), in key order.
    pub fn overridden(&self) -> impl Iterator<Item = (&str, &Path, &Path)> {
        self.overridden.iter().map(|(k, (a, b))| (k.as_str(), a.as_path(), b.as_path()))
    }

    fn set(&mut self, key: String, file: &Path) {
        self.files.insert(key, file.to_owned());
    }

    /// `key` set by `file` to `value` (its `Debug`).
    fn set_value(&mut self, key: &str, file: &Path, value: String) {
        if let Some(earlier) = self.files.get(key).filter(|f| *f != file) {
            if self.values.get(key) != Some(&value) {
                self.overridden.insert(key.to_owned(), (earlier.clone(), file.to_owned()));
            }
        }
        self.files.insert(key.to_owned(), file.to_owned());
        self.values.insert(key.to_owned(), value);
    }

    /// `key` unset by `file`, which replaces it with keys of its own (a pool's CPU source).
    fn replace(&mut self, key: &str, file: &Path) {
        if let Some(earlier) = self.files.remove(key).filter(|f| f != file) {
            self.overridden.insert(key.to_owned(), (earlier, file.to_owned()));
        }
        self.values.remove(key);
    }
}

/// `pools.NAME.field` (or `pools.NAME` for an empty field), quoting NAME when it is not a bare
/// TOML key so the message shows what to look for in the file.
pub(crate) fn pool_key(name: &str, field: &str) -> String {
    let bare = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let name = if bare { name.to_owned() } else { format!("\"{}\"", name.escape_debug()) };
    if field.is_empty() {
        format!("pools.{name}")
    } else {
        format!("pools.{name}.{field}")
    }
}

/// Why the configuration could not be loaded. Each variant names the file and the key first; the
/// cause, where there is one, is the [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file could not be read.
    #[error("`{}`: cannot read", file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A drop-in directory could not be listed.
    #[error("`{}`: cannot list directory", dir.display())]
    ReadDir {
        /// The directory.
        dir: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A file is not valid TOML, has an unknown key, or a value of the wrong type.
    #[error("{}", head(file, *pos, key))]
    Parse {
        /// The file.
        file: PathBuf,
        /// Line and column (1-based), when the parser knows them.
        pos: Option<(usize, usize)>,
        /// The key path (`pools.dp.count`); empty for a syntax error outside any key.
        key: String,
        /// The parser's message.
        #[source]
        source: TomlError,
    },
    /// A `cpus` value is not a CPU list.
    #[error("{}", head(file, None, key))]
    Cpus {
        /// The file.
        file: PathBuf,
        /// `pools.NAME.cpus`.
        key: String,
        /// What is wrong with it, naming the bad token.
        #[source]
        source: CpuSetError,
    },
    /// A value is missing, malformed or contradicts another.
    #[error("{}: {reason}", head(file, None, key))]
    Invalid {
        /// The file that set the key (or, for a missing key, that last mentioned its table).
        file: PathBuf,
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A `[pools.NAME]` table whose NAME is not a valid pool name.
    #[error("{}", head(file, None, key))]
    PoolName {
        /// The file that last mentioned the pool.
        file: PathBuf,
        /// `pools.NAME`.
        key: String,
        /// Why the name is invalid.
        #[source]
        source: PoolError,
    },
    /// A `daemon.host_cgroups` entry is not a relative cgroup path.
    #[error("{}", head(file, None, key))]
    HostCgroup {
        /// The file.
        file: PathBuf,
        /// `daemon.host_cgroups[i]`.
        key: String,
        /// Why the path is invalid.
        #[source]
        source: Box<state::Error>,
    },
    /// No file defines a pool.
    #[error("no pool is configured: at least a [pools.NAME] table with kind = \"reserved\" is needed (files read: {})", list(files))]
    NoPools {
        /// The files that were merged.
        files: Vec<PathBuf>,
    },
    /// A key needs something this host lacks (a driver, a file system): checked where the
    /// engine takes new settings, since the parser does not look at the host.
    #[error("{}: not supported on this host: {missing}", head(file, None, key))]
    Unsupported {
        /// The file that set the key.
        file: PathBuf,
        /// The key (`pools.dp.cache.l3`, `pools.dp.power.governor`).
        key: String,
        /// What is missing, naming the file or directory looked for.
        missing: String,
    },
    /// The pools do not resolve on this host.
    #[error("{}", match file { Some(file) => head(file, None, key), None => key.clone() })]
    Pool {
        /// The file that set the key at fault; `None` when no single file is (no reserved pool).
        file: Option<PathBuf>,
        /// The key at fault (`pools.dp.count`), or `pools` for the set as a whole.
        key: String,
        /// The resolution error.
        #[source]
        source: PoolError,
    },
}

impl ConfigError {
    /// The file the error is about, if it is about one.
    pub fn file(&self) -> Option<&Path> {
        match self {
            ConfigError::Read { file, .. }
            | ConfigError::Parse { file, .. }
            | ConfigError::Cpus { file, .. }
            | ConfigError::Invalid { file, .. }
            | ConfigError::PoolName { file, .. }
            | ConfigError::HostCgroup { file, .. }
            | ConfigError::Unsupported { file, .. } => Some(file),
            ConfigError::ReadDir { dir, .. } => Some(dir),
            ConfigError::Pool { file, .. } => file.as_deref(),
            ConfigError::NoPools { .. } => None,
        }
    }

    /// The key the error is about, if it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Parse { key, .. }
            | ConfigError::Cpus { key, .. }
            | ConfigError::Invalid { key, .. }
            | ConfigError::PoolName { key, .. }
            | ConfigError::HostCgroup { key, .. }
            | ConfigError::Unsupported { key, .. }
            | ConfigError::Pool { key, .. } => Some(key).filter(|k| !k.is_empty()).map(String::as_str),
            ConfigError::Read { .. } | ConfigError::ReadDir { .. } | ConfigError::NoPools { .. } => None,
        }
    }
}

/// "`file`:line:column: key", leaving out what is unknown.
fn head(file: &Path, pos: Option<(usize, usize)>, key: &str) -> String {
    let mut s = format!("`{}`", file.display());
    if let Some((line, col)) = pos {
        s.push_str(&format!(":{line}:{col}"));
    }
    if !key.is_empty() {
        s.push_str(": ");
        s.push_str(key);
    }
    s
}

fn list(files: &[PathBuf]) -> String {
    if files.is_empty() {
        return "none".to_owned();
    }
    files.iter().map(|f| format!("`{}`", f.display())).collect::<Vec<_>>().join(", ")
}

/// A TOML parser error. It displays only the parser's message: the file, position and key are
/// already in the [`ConfigError`] that holds it, and the parser's own rendering (a multi-line
/// source excerpt) does not belong in a log line.
#[derive(Debug)]
pub struct TomlError(pub Box<toml::de::Error>);

impl fmt::Display for TomlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Some messages span lines ("invalid table header\nexpected `.`, `]`"); keep one line.
        let mut lines = self.0.message().lines().map(str::trim).filter(|l| !l.is_empty());
        if let Some(first) = lines.next() {
            f.write_str(first)?;
        }
        for line in lines {
            write!(f, "; {line}")?;
        }
        Ok(())
    }
}

impl std::error::Error for TomlError {}

/// `ConfigError::Invalid` for `key`, naming the file that set it.
fn invalid(origins: &Origins, key: &str, reason: String) -> ConfigError {
    ConfigError::Invalid { file: origins.file_for(key).unwrap_or_default(), key: key.to_owned(), reason }
}

/// `value` when it is an absolute path, `default` when unset; else an error naming `key`.
fn absolute(
    origins: &Origins,
    value: Option<PathBuf>,
    default: PathBuf,
    key: &str,
) -> Result<PathBuf, ConfigError> {
    match value {
        None => Ok(default),
        Some(p) if p.is_absolute() => Ok(p),
        Some(p) => Err(invalid(origins, key, format!("`{}` must be an absolute path", p.display()))),
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod manpage_tests;
