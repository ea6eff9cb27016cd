//! Cache classes, kept by the engine: one resctrl control group `cpupool-<pool>` per pool with a
//! `[pools.NAME.cache]` table, holding the pool's CPUs (`cpus_list`) and its L3 ways and memory
//! bandwidth (`schemata`).
//!
//! New settings are checked against the host where the engine takes them ([`check`], at start
//! and before a reload or pool edit is installed): a key the host cannot honour refuses the
//! whole configuration, naming the key, and nothing changes. Each pass ([`Keeper::keep`],
//! after start's reconcile, every installed configuration and every drift check) reads each
//! group back, writes what differs, and reads it back again; what the kernel shows is reported
//! as one [`ClassRow`] per configured key.
//!
//! Tasks are not moved into the groups: a task in the default group takes the allocation of
//! the group whose `cpus_list` holds the CPU it runs on, and the pool's assignments run on the
//! pool's CPUs only, so CPU-based allocation covers them.
//!
//! The groups are their own record: resctrl keeps them until `rmdir` or a reboot, and a
//! restart after a crash finds them by name, adopting those of pools that still want one and
//! removing the others. With `daemon.cache_restore_on_stop` (the default) the daemon removes
//! its groups when it stops, which gives their CPUs back to the default group.
use std::collections::BTreeMap;

use super::error_chain;
use super::handle::Reports;
use super::keeper::{Keeper, Scene};
use super::Event;
use crate::config::{pool_key, Cache, ConfigError, Settings};
use crate::core::cache::{self, CacheError, ResctrlInfo, Wanted};
use crate::core::classes::{ClassKind, ClassRow, ClassState};
use crate::core::cpuset::CpuSet;
use crate::core::pool::PoolName;
use crate::host::resctrl::{self, Resctrl, GROUP_PREFIX};

/// Settings checked against the host, ready to install.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    fs: Resctrl,
    config: Cache,
    /// `None` when no pool has a cache class (resctrl is then not looked at beyond removing
    /// groups left from before).
    info: Option<ResctrlInfo>,
    wanted: BTreeMap<PoolName, Wanted>,
}

/// Checks the cache classes of `settings` against the host's resctrl, mounting it at its
/// default place when it is absent. An error names the key and what is missing or wrong.
pub(crate) fn check(settings: &Settings) -> Result<Prepared, ConfigError> {
    let mut fs = Resctrl::new(&settings.paths.resctrl_root).with_kernel(settings.paths.kernel);
    let config = settings.cache.clone();
    let Some((first_pool, first)) = config.pools.iter().next() else {
        return Ok(Prepared { fs, config, info: None, wanted: BTreeMap::new() });
    };
    let key_of = |pool: &PoolName, key: &str| pool_key(pool.as_str(), &format!("cache.{key}"));
    let file_of = |key: &str| settings.origins.file_for(key).unwrap_or_default();
    let first_key = key_of(first_pool, if first.l3.is_some() { "l3" } else { "mb" });
    let unsupported =
        |key: String, missing: String| ConfigError::Unsupported { file: file_of(&key), key, missing };
    if !fs.mounted() {
        let missing = format!("no resctrl (`{}` is missing)", fs.root().join("info").display());
        // Mounting is the administrator's choice anywhere but the kernel's own place for it
        // (and never in the sandbox, whose root is inside its directory).
        if fs.root() != std::path::Path::new(resctrl::DEFAULT_ROOT) || !fs.root().is_dir() {
            return Err(unsupported(first_key, missing));
        }
        if let Err(e) = fs.mount() {
            let why = std::error::Error::source(&e).map(ToString::to_string).unwrap_or_default();
            let missing = format!(
                "no resctrl (`{}` is missing, and mounting resctrl on `{}` failed: {why})",
                fs.root().join("info").display(),
                fs.root().display()
            );
            return Err(unsupported(first_key, missing));
        }
        log::info!("cache: mounted resctrl on `{}`", fs.root().display());
        if !fs.mounted() {
            return Err(unsupported(first_key, missing));
        }
    }
    let info = fs.info().map_err(|e| unsupported(first_key.clone(), error_chain(&e)))?;
    let wanted = cache::plan(&config.pools, &info).map_err(|e| match e {
        CacheError::Unsupported { pool, key, missing } => unsupported(key_of(&pool, key), missing),
        CacheError::Invalid { pool, key, reason } => {
            let key = key_of(&pool, key);
            ConfigError::Invalid { file: file_of(&key), key, reason }
        }
    })?;
    Ok(Prepared { fs, config, info: Some(info), wanted })
}

/// The engine's cache state.
pub(crate) struct CacheManager {
    prepared: Prepared,
    rows: Vec<ClassRow>,
}

impl CacheManager {
    /// Set up from settings already [`check`]ed.
    pub(crate) fn new(prepared: Prepared) -> CacheManager {
        CacheManager { prepared, rows: Vec::new() }
    }

    /// One pass over the pools' groups (module docs); `pools` the running pools' CPUs.
    fn apply(&mut self, pools: &BTreeMap<PoolName, CpuSet>) {
        let p = &self.prepared;
        if p.config.pools.is_empty() {
            self.remove_stale();
            self.rows.clear();
            return;
        }
        let Some(info) = &p.info else {
            // configure() failed: the rows say why.
            return;
        };
        if !p.fs.mounted() {
            let missing = format!("no resctrl (`{}` is missing)", p.fs.root().join("info").display());
            self.rows = rows_for(&p.config, |_, _| (String::new(), ClassState::Unsupported(missing.clone())));
            return;
        }
        let outcomes: BTreeMap<&PoolName, _> = p
            .config
            .pools
            .keys()
            .map(|pool| {
                let want = p.wanted.get(pool).copied().unwrap_or_default();
                let outcome = match pools.get(pool) {
                    None => Err(format!("pool {pool} is not running (the configuration was not installed)")),
                    Some(cpus) => sync_group(&p.fs, &resctrl::group_name(pool.as_str()), cpus, &want, info),
                };
                (pool, (want, outcome))
            })
            .collect();
        let rows = rows_for(&p.config, |pool, key| match outcomes.get(pool) {
            Some((want, Ok(shown))) => judge(shown, key, want, info),
            Some((_, Err(why))) => (String::new(), ClassState::Degraded(why.clone())),
            None => (String::new(), ClassState::Degraded(format!("pool {pool} was not looked at"))),
        });
        self.remove_stale();
        for r in &rows {
            let before = self.rows.iter().find(|o| o.pool == r.pool && o.key == r.key);
            if before.map(|b| &b.state) != Some(&r.state) {
                match &r.state {
                    ClassState::Applied => log::info!(
                        POOL = r.pool.as_str();
                        "cache: pool {} {} = {} in force ({} in {})", r.pool, r.key, r.wanted, r.in_force, r.scope
                    ),
                    s => log::warn!(POOL = r.pool.as_str(); "cache: pool {} {}: {}", r.pool, r.key, s.why()),
                }
            }
        }
        self.rows = rows;
    }

    /// Removes the daemon's groups that no pool wants any more.
    fn remove_stale(&self) {
        let p = &self.prepared;
        if !p.fs.mounted() {
            return;
        }
        let groups = match p.fs.groups() {
            Ok(g) => g,
            Err(e) => {
                log::warn!("cache: {}", error_chain(&e));
                return;
            }
        };
        for g in groups {
            let Some(pool) = g.strip_prefix(GROUP_PREFIX) else { continue };
            if p.config.pools.keys().any(|n| n.as_str() == pool) {
                continue;
            }
            match p.fs.remove_group(&g) {
                Ok(()) => log::info!("cache: removed the resctrl group {g} (no pool asks for it)"),
                Err(e) => log::warn!("cache: {}", error_chain(&e)),
            }
        }
    }

    /// Removes every group of the daemon's (it stops).
    fn remove_all(&mut self) {
        let fs = &self.prepared.fs;
        if !fs.mounted() {
            return;
        }
        for g in fs.groups().unwrap_or_default() {
            if g.starts_with(GROUP_PREFIX) {
                match fs.remove_group(&g) {
                    Ok(()) => log::info!("cache: removed the resctrl group {g}"),
                    Err(e) => log::warn!("cache: {}", error_chain(&e)),
                }
            }
        }
    }
}

/// Makes `group` hold `cpus` and `want`, writing only what differs; what the kernel shows after.
fn sync_group(
    fs: &Resctrl,
    group: &str,
    cpus: &CpuSet,
    want: &Wanted,
    info: &ResctrlInfo,
) -> Result<String, String> {
    let err = |e: resctrl::ResctrlError| error_chain(&e);
    if !fs.has_group(group) {
        fs.create_group(group).map_err(err)?;
        log::info!("cache: created the resctrl group {group}");
    }
    if fs.cpus(group).ok().as_ref() != Some(cpus) {
        fs.set_cpus(group, cpus).map_err(err)?;
    }
    let shown = fs.schemata(group).map_err(err)?;
    let holds = |s: &str| ["l3", "mb"].iter().all(|k| judge(s, k, want, info).1 == ClassState::Applied);
    if !holds(&shown) {
        fs.set_schemata(group, &cache::schemata(want, info)).map_err(err)?;
    }
    let now = fs.cpus(group).map_err(err)?;
    if &now != cpus {
        return Err(format!("wrote CPUs {cpus} to {group}, the kernel holds {now}"));
    }
    fs.schemata(group).map_err(err)
}

/// `key`'s value in the shown schemata, and whether it is the one wanted (a key not wanted
/// holds trivially).
fn judge(shown: &str, key: &str, want: &Wanted, info: &ResctrlInfo) -> (String, ClassState) {
    let parsed = cache::parse_schemata(shown);
    let (res, domains, value, radix) = match key {
        "l3" => match (want.l3, &info.l3) {
            (Some(m), Ok(l3)) => ("L3", &l3.domains, m, 16),
            _ => return (String::new(), ClassState::Applied),
        },
        _ => match (want.mb, &info.mb) {
            (Some(b), Ok(mb)) => ("MB", &mb.domains, u64::from(b), 10),
            _ => return (String::new(), ClassState::Applied),
        },
    };
    let (in_force, ok) = cache::in_force(&parsed, res, domains, value, radix);
    let state = if ok {
        ClassState::Applied
    } else {
        let wanted = if radix == 16 { format!("{value:x}") } else { value.to_string() };
        ClassState::Degraded(format!("wrote {res} {wanted}, the kernel shows {in_force}"))
    };
    (in_force, state)
}

fn rows_for(config: &Cache, mut f: impl FnMut(&PoolName, &str) -> (String, ClassState)) -> Vec<ClassRow> {
    let mut rows = Vec::new();
    for (pool, class) in &config.pools {
        for (key, wanted) in class.keys() {
            let (in_force, state) = f(pool, key);
            rows.push(ClassRow {
                pool: pool.to_string(),
                class: ClassKind::Cache,
                key: key.to_owned(),
                wanted,
                in_force,
                scope: resctrl::group_name(pool.as_str()),
                state,
            });
        }
    }
    rows
}

impl Keeper for CacheManager {
    /// Takes new settings (a reload): checked again, since the host may have changed since
    /// [`check`] passed; if they no longer pass, every key is reported degraded with why.
    fn configure(&mut self, settings: &Settings) {
        match check(settings) {
            Ok(p) => self.prepared = p,
            Err(e) => {
                log::error!("cache: {}", error_chain(&e));
                self.prepared = Prepared {
                    fs: Resctrl::new(&settings.paths.resctrl_root).with_kernel(settings.paths.kernel),
                    config: settings.cache.clone(),
                    info: None,
                    wanted: BTreeMap::new(),
                };
                self.rows = rows_for(&self.prepared.config, |_, _| {
                    ("".into(), ClassState::Degraded(error_chain(&e)))
                });
            }
        }
    }

    /// One cache pass over the running pools (see [`CacheManager`]); no pool events.
    fn keep(&mut self, scene: &Scene<'_>) -> Vec<Event> {
        let pools = scene.state.pools().values().map(|p| (p.name.clone(), p.cpus.clone())).collect();
        self.apply(&pools);
        Vec::new()
    }

    fn publish(&self, reports: &mut Reports) {
        reports.update(|rows: &mut Vec<ClassRow>| rows.extend(self.rows.iter().cloned()));
    }

    /// Removes the daemon's resctrl groups, if so configured (the daemon stops).
    fn stop(&mut self) {
        if self.prepared.config.restore_on_stop {
            self.remove_all();
        }
    }
}
