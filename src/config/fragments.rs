//! Stage 1: finding the fragment files and parsing each one on its own.
//!
//! A fragment is one TOML file. Every field is optional here; whether the merged result is
//! complete is the business of the later stages. Unknown keys are rejected so that a typo
//! (`cont = 4`) fails loudly instead of silently keeping a default.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{ConfigDirs, ConfigError, TomlError};
use crate::core::pool::{PoolKind, Smt};

/// One parsed file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Fragment {
    #[serde(default)]
    pub paths: PathsFragment,
    #[serde(default)]
    pub daemon: DaemonFragment,
    #[serde(default)]
    pub pools: BTreeMap<String, PoolFragment>,
    #[serde(default)]
    pub kubelet: KubeletFragment,
    #[serde(default)]
    pub k8s: K8sFragment,
    #[serde(default)]
    pub metrics: MetricsFragment,
    #[serde(default)]
    pub idle_cpus: IdleCpusFragment,
}

/// `[idle_cpus]` as written in one file: classes for the CPUs in no pool.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct IdleCpusFragment {
    pub power: Option<PowerFragment>,
}

/// `[pools.NAME.power]` or `[idle_cpus.power]` as written in one file; values are checked in
/// the settings stage.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PowerFragment {
    pub governor: Option<String>,
    pub min_freq: Option<FreqValue>,
    pub max_freq: Option<FreqValue>,
    pub epp: Option<String>,
    pub resume_latency_us: Option<i64>,
    pub uncore_min_freq: Option<FreqValue>,
    pub uncore_max_freq: Option<FreqValue>,
}

/// A frequency as written: a number (kHz) or a word (`min`, `base`, `max`), checked in the
/// settings stage so the error can name the file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum FreqValue {
    Number(i64),
    Word(String),
}

impl<'de> Deserialize<'de> for FreqValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = FreqValue;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a frequency in kHz or \"min\", \"base\", \"max\"")
            }
            fn visit_i64<E>(self, v: i64) -> Result<FreqValue, E> {
                Ok(FreqValue::Number(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<FreqValue, E> {
                i64::try_from(v).map(FreqValue::Number).map_err(|_| E::custom("too large"))
            }
            fn visit_str<E>(self, v: &str) -> Result<FreqValue, E> {
                Ok(FreqValue::Word(v.to_owned()))
            }
        }
        // A string or a number: TOML's deserializer hands either to the visitor (its
        // deserialize_str is self-describing), and the man page test's recorder offers a str.
        d.deserialize_str(V)
    }
}

/// `[metrics]` as written in one file: the metrics endpoint.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MetricsFragment {
    pub enabled: Option<bool>,
    pub listen: Option<String>,
}

/// `[k8s]` as written in one file: the cluster integration (the `k8s` cargo feature).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct K8sFragment {
    pub enabled: Option<bool>,
    pub kubeconfig: Option<PathBuf>,
    pub node_name: Option<String>,
    pub namespace: Option<String>,
    pub report_interval_ms: Option<u64>,
}

/// `[kubelet]` as written in one file: the device plugin.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct KubeletFragment {
    pub enabled: Option<bool>,
    pub resource_prefix: Option<String>,
    pub millicpus_per_device: Option<u64>,
    pub release_grace_ms: Option<u64>,
    pub reconcile_interval_ms: Option<u64>,
    pub runtime_endpoint: Option<PathBuf>,
    pub confine_unpooled: Option<bool>,
    pub nri: Option<bool>,
    pub nri_socket: Option<PathBuf>,
}

/// `[paths]` as written in one file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PathsFragment {
    pub sysfs_root: Option<PathBuf>,
    pub cgroup_root: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub runtime_dir: Option<PathBuf>,
    pub kubelet_dir: Option<PathBuf>,
    pub cdi_dir: Option<PathBuf>,
    pub procfs_root: Option<PathBuf>,
    pub irqbalance_dir: Option<PathBuf>,
    pub resctrl_root: Option<PathBuf>,
}

/// `[daemon]` as written in one file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DaemonFragment {
    pub host_cgroups: Option<Vec<String>>,
    pub admin_group: Option<String>,
    pub log_level: Option<String>,
    pub lend_idle: Option<bool>,
    pub backend: Option<String>,
    pub irq_cpus: Option<String>,
    pub irq_restore_on_stop: Option<bool>,
    pub irqbalance: Option<bool>,
    pub cache_restore_on_stop: Option<bool>,
    pub power_restore_on_stop: Option<bool>,
}

/// `[pools.NAME]`: as written in one file, and (as [`PoolInput`]) merged over all of them. The
/// two differ only in `cpus`: text as written (`C = String`), parsed once merged.
///
/// [`PoolInput`]: super::inputs::PoolInput
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PoolFragment<C = String> {
    pub kind: Option<PoolKind>,
    /// Kept as text in a fragment: the inputs stage parses it so the error can carry
    /// [`CpuSetError`] and name the file.
    ///
    /// [`CpuSetError`]: crate::core::cpuset::CpuSetError
    pub cpus: Option<C>,
    pub count: Option<u32>,
    pub numa: Option<u32>,
    pub isolcpus: Option<bool>,
    pub smt: Option<Smt>,
    pub isolate: Option<bool>,
    pub kubelet: Option<bool>,
    pub enforce_quota: Option<bool>,
    pub dra: Option<bool>,
    pub removed: Option<bool>,
    pub irq: Option<String>,
    pub irq_claim: Option<Vec<String>>,
    #[serde(default)]
    pub cache: Option<CacheFragment>,
    pub power: Option<PowerFragment>,
}

/// `[pools.NAME.cache]` as written in one file: the pool's resctrl allocation. Each key merges
/// on its own.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CacheFragment {
    /// `"50%"` or `"0xff0"`, parsed in the settings stage so the error names the file.
    pub l3: Option<String>,
    pub mb: Option<u32>,
}

impl<C> PoolFragment<C> {
    /// Whether this fragment redefines where the pool's CPUs come from.
    pub fn sets_source(&self) -> bool {
        self.cpus.is_some() || self.count.is_some() || self.isolcpus.is_some()
    }
}

/// Parses one fragment. `file` only names it in errors.
pub(crate) fn parse(text: &str, file: &Path) -> Result<Fragment, ConfigError> {
    let de = toml::Deserializer::new(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let key = e.path().to_string();
        // An error at the top level (TOML syntax) has no key; the path prints it as ".".
        let key = if key == "." { String::new() } else { key };
        let inner = e.into_inner();
        let pos = inner.span().map(|span| line_col(text, span.start));
        ConfigError::Parse { file: file.to_owned(), pos, key, source: TomlError(Box::new(inner)) }
    })
}

/// 1-based line and column (in characters) of byte `offset`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// Reads and parses every fragment, in merge order.
pub(crate) fn read_all(dirs: &ConfigDirs) -> Result<Vec<(PathBuf, Fragment)>, ConfigError> {
    read_all_with(dirs, None)
}

/// Like [`read_all`], with `replace`'s text standing in for that file (which need not exist, and
/// is left out when the text is `None`).
pub(crate) fn read_all_with(
    dirs: &ConfigDirs,
    replace: Option<(&Path, Option<&str>)>,
) -> Result<Vec<(PathBuf, Fragment)>, ConfigError> {
    let mut files = files(dirs)?;
    if let Some((path, text)) = replace {
        files.retain(|f| f != path);
        if text.is_some() {
            // The cluster fragment goes last; any other file takes its place among the local
            // drop-ins, which are read in file-name order before the cluster fragment.
            let cluster = dirs.cluster.as_deref();
            let at = if cluster == Some(path) {
                files.len()
            } else {
                let dropins = dirs.etc.join("config.d");
                files
                    .iter()
                    .position(|f| {
                        Some(f.as_path()) == cluster
                            || (f.parent() == Some(dropins.as_path()) && f.file_name() > path.file_name())
                    })
                    .unwrap_or(files.len())
            };
            files.insert(at, path.to_owned());
        }
    }
    files
        .into_iter()
        .map(|file| {
            let text = match replace {
                Some((path, Some(text))) if path == file => text.to_owned(),
                _ => read_fragment(&file)?,
            };
            let fragment = parse(&text, &file)?;
            Ok((file, fragment))
        })
        .collect()
}

/// The largest configuration file read: far above any real one, and a file that never ends
/// (a link to `/dev/zero`) is refused at it rather than read until memory runs out.
pub const MAX_FRAGMENT_BYTES: u64 = 1 << 20;

/// Reads one configuration file: a regular file of at most [`MAX_FRAGMENT_BYTES`], opened
/// without blocking, so that a FIFO in a drop-in directory is an error naming it rather than an
/// engine stuck in `open` at every reload.
pub(crate) fn read_fragment(file: &Path) -> Result<String, ConfigError> {
    let read = |file: &Path| -> io::Result<String> {
        let bytes = crate::host::fsutil::read_regular_file(file, MAX_FRAGMENT_BYTES)?;
        String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    };
    read(file).map_err(|source| ConfigError::Read { file: file.to_owned(), source })
}

/// The fragment files that exist, in merge order. See the [module docs](super) for the order.
pub(crate) fn files(dirs: &ConfigDirs) -> Result<Vec<PathBuf>, ConfigError> {
    let etc_dropins = dropins(&dirs.etc.join("config.d"))?;
    let masked: BTreeSet<&OsString> = etc_dropins.keys().collect();
    let mut out: Vec<PathBuf> = dropins(&dirs.vendor.join("config.d"))?
        .into_iter()
        .filter(|(name, _)| !masked.contains(name))
        .map(|(_, path)| path)
        .collect();
    let main = dirs.etc.join("config.toml");
    match fs::metadata(&main) {
        Ok(_) => out.push(main),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(ConfigError::Read { file: main, source }),
    }
    out.extend(etc_dropins.into_values());
    if let Some(cluster) = &dirs.cluster {
        match fs::metadata(cluster) {
            Ok(_) => out.push(cluster.clone()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(ConfigError::Read { file: cluster.clone(), source }),
        }
    }
    Ok(out)
}

/// `dir/*.toml` by file name (so in lexical byte order). A missing directory has none. Hidden
/// files (editor backups such as `.#x.toml`) and directories are skipped; anything else with the
/// suffix counts, including a symlink to `/dev/null`, which masks a vendor file systemd style.
fn dropins(dir: &Path) -> Result<BTreeMap<OsString, PathBuf>, ConfigError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(source) => return Err(ConfigError::ReadDir { dir: dir.to_owned(), source }),
    };
    let mut out = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(|source| ConfigError::ReadDir { dir: dir.to_owned(), source })?;
        let path = entry.path();
        let name = entry.file_name();
        let hidden = name.as_encoded_bytes().first() == Some(&b'.');
        if hidden || !matches!(path.extension(), Some(ext) if ext == "toml") {
            continue;
        }
        // Follows symlinks; a dangling one is reported when it is read.
        if fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        out.insert(name, path);
    }
    Ok(out)
}
