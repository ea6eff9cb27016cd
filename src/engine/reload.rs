//! New settings (a reload) and pool edits (through the runtime drop-in): checked against the
//! host and the live assignments, then installed like any commit.

use std::path::PathBuf;
use std::sync::Arc;

use super::keeper::Pass;
use super::{error_chain, Engine, EngineError, Event};
use crate::config::edit::{self, EditError, PreparedEdit};
use crate::config::runtime::PoolEdit;
use crate::config::{self, ConfigError, Settings};
use crate::core::plan;
use crate::core::pool::{Pool, PoolKind, PoolName};
use crate::core::state::{self, State};
use crate::core::topology::Topology;
use crate::host::sysfs;

/// What a reload did: the configuration keys whose merged value changed (pools, classes,
/// daemon settings alike), whether the layout or state changed, and the keys of the
/// administrator's files (`config.toml`, `config.d/`) that a later file overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Keys whose merged value changed, in order (`pools.dp.cache.l3`).
    pub changed: Vec<String>,
    /// Whether the pools or their placements changed.
    pub applied: bool,
    /// `(key, the file whose value loses, the file that wins)`.
    pub overridden: Vec<(String, PathBuf, PathBuf)>,
}

impl Reloaded {
    /// The keys of `changed` that take effect only at the next restart
    /// ([`crate::config::takes_effect_at_restart`]).
    pub fn at_restart(&self) -> Vec<&str> {
        self.changed
            .iter()
            .map(String::as_str)
            .filter(|k| crate::config::takes_effect_at_restart(k))
            .collect()
    }

    /// Whether the daemon now runs anything it did not before: the files said something new
    /// that a reload applies (keys only a restart applies do not count).
    pub fn any(&self) -> bool {
        self.applied || self.changed.iter().any(|k| !crate::config::takes_effect_at_restart(k))
    }

    /// `2 keys changed: pools.dp.cache.l3, pools.web.count` or `nothing changed`, then the
    /// keys that wait for a restart (`only a restart applies kubelet.resource_prefix`), then each
    /// override: `` `…/90-cpupoold-runtime.toml` overrides pools.web.count of `…/config.toml` ``.
    pub fn summary(&self) -> String {
        const SHOWN: usize = 10;
        let mut out = match self.changed.len() {
            0 if self.applied => "applied".to_owned(),
            0 => "nothing changed".to_owned(),
            n => {
                let mut list = self.changed.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
                if n > SHOWN {
                    list.push_str(&format!(" and {} more", n - SHOWN));
                }
                format!("{n} key{} changed: {list}", if n == 1 { "" } else { "s" })
            }
        };
        let at_restart = self.at_restart();
        if !at_restart.is_empty() {
            out.push_str(&format!("; only a restart applies {}", at_restart.join(", ")));
        }
        for (key, loses, wins) in &self.overridden {
            out.push_str(&format!("; `{}` overrides {key} of `{}`", wins.display(), loses.display()));
        }
        out
    }
}

impl Engine {
    pub(super) fn reload(
        &mut self,
        settings: Result<Box<Settings>, ConfigError>,
    ) -> Result<Reloaded, EngineError> {
        let result = settings.map_err(|e| EngineError::Config(Box::new(e))).and_then(|s| self.try_reload(&s));
        match &result {
            Ok(_) => self.config_error = None,
            Err(e) => self.config_error = Some(error_chain(e)),
        }
        self.publish(Vec::new());
        result
    }

    pub(super) fn try_reload(&mut self, settings: &Settings) -> Result<Reloaded, EngineError> {
        let (topo, next) = self.prepare(settings)?;
        self.install(settings, topo, next)
    }

    /// Checks new settings against the host and the live assignments, changing nothing.
    pub(super) fn prepare(&self, settings: &Settings) -> Result<(Topology, State), EngineError> {
        let topo = sysfs::read_topology(&settings.paths.sysfs_root).map_err(EngineError::Topology)?;
        // Count pools keep their CPUs: editing one pool does not move the others.
        let pools = settings
            .resolve_pools_keeping(&topo, &crate::core::plan::pool_cpus(&self.ledger.state))
            .map_err(|e| EngineError::Config(Box::new(e)))?;
        super::keepers::check(settings, &topo, &pools).map_err(EngineError::Config)?;
        let mut next = (*self.ledger.state).clone();
        next.set_pools(pools).map_err(|m| {
            EngineError::Stranded(m.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
        })?;
        check_cpu_manager(settings, &self.ledger.state, &next)?;
        Ok((topo, next))
    }

    /// Applies and saves prepared settings; says what changed.
    pub(super) fn install(
        &mut self,
        settings: &Settings,
        topo: Topology,
        next: State,
    ) -> Result<Reloaded, EngineError> {
        let changed = settings.origins.changed_since(&self.origins);
        let applied = self.install_pools(settings, topo, next)?;
        self.origins = settings.origins.clone();
        let etc = self.config.as_ref().map(|c| c.dirs.etc.clone());
        let overridden = settings
            .origins
            .overridden()
            .filter(|(_, loses, _)| etc.as_ref().is_some_and(|etc| loses.starts_with(etc)))
            .map(|(k, loses, wins)| (k.to_owned(), loses.to_owned(), wins.to_owned()))
            .collect();
        // A reload applies the log level; the keys read only at start wait for a restart.
        if changed.iter().any(|k| k == "daemon.log_level") {
            crate::logging::configure(settings.log_level);
        }
        let reloaded = Reloaded { changed, applied, overridden };
        let at_restart = reloaded.at_restart();
        if !at_restart.is_empty() {
            log::warn!(
                "configuration: only a restart applies {} (systemctl restart cpupoold)",
                at_restart.join(", ")
            );
        }
        Ok(reloaded)
    }

    /// [`Engine::install`]'s pools and placements; `Ok(false)` when they did not change.
    fn install_pools(
        &mut self,
        settings: &Settings,
        topo: Topology,
        mut next: State,
    ) -> Result<bool, EngineError> {
        let old_topo = std::mem::replace(&mut self.ledger.topo, Arc::new(topo));
        let old_lend = std::mem::replace(&mut self.lend_idle, settings.lend_idle);
        let new_opts = self.layout_options(&next, &settings.host_cgroups);
        let old_opts = std::mem::replace(&mut self.ledger.opts, new_opts);
        let before = plan::layout(&self.ledger.state, &old_topo, &old_opts);
        let after = self.ledger.layout(&next);
        if before == after && next == *self.ledger.state {
            // Interrupt, power or cache settings alone may have changed.
            self.keepers.configure(settings);
            let events = self.keep_host(Pass::Settings);
            self.publish(events);
            return Ok(false);
        }
        let names: std::collections::BTreeSet<&PoolName> =
            self.ledger.state.pools().keys().chain(next.pools().keys()).collect();
        let changed: Vec<Event> = names
            .into_iter()
            .filter(|n| self.ledger.state.pools().get(*n) != next.pools().get(*n))
            .map(|n| Event::PoolChanged(n.clone()))
            .collect();
        if let Err(e) = self.ledger.commit_layouts(&before, &after, &next) {
            self.ledger.topo = old_topo;
            self.lend_idle = old_lend;
            self.ledger.opts = old_opts;
            return Err(e);
        }
        next.take_changes();
        let before = std::mem::replace(&mut self.ledger.state, Arc::new(next));
        self.claims.follow(&before, &self.ledger.state);
        self.keepers.configure(settings);
        let kept = self.keep_host(Pass::Pools);
        for p in self.ledger.state.pools().values() {
            log::info!(POOL = p.name.as_str(); "pool {} ({}): CPUs {}", p.name, p.kind, p.cpus);
        }
        let mut changed = changed;
        changed.extend(kept);
        self.publish(changed);
        Ok(true)
    }

    /// A pool edit: checked against the state, merged into the runtime drop-in, validated as a
    /// whole configuration, written durably, then applied like a reload. If applying fails, the
    /// previous drop-in is written back.
    pub(super) fn edit_pool(&mut self, edit: &PoolEdit) -> Result<Option<Pool>, EngineError> {
        let name = edit.name();
        let current = self.ledger.state.pools().get(name);
        match (edit, current) {
            (PoolEdit::Create { .. }, Some(_)) => {
                return Err(state::Error::PoolExists { pool: name.to_string() }.into())
            }
            (PoolEdit::Resize { .. } | PoolEdit::Delete { .. }, None) => {
                return Err(state::Error::NoSuchPool { pool: name.to_string() }.into())
            }
            (PoolEdit::Delete { .. }, Some(p)) if p.kind == PoolKind::Reserved => {
                return Err(state::Error::InvalidArgument {
                    arg: "name",
                    reason: format!("`{name}` is the reserved pool, which every host needs"),
                }
                .into())
            }
            (PoolEdit::Delete { .. }, Some(p)) if self.ledger.state.usage(&p.name).count > 0 => {
                return Err(state::Error::PoolInUse {
                    pool: name.to_string(),
                    assignments: self.ledger.state.usage(&p.name).count,
                }
                .into())
            }
            _ => {}
        }
        let src = self.config.as_ref().ok_or(EngineError::NoConfigFiles)?;
        let PreparedEdit { old, new, settings } = edit::prepare(src, edit)
            .map_err(|e| match e {
                EditError::Read(e) => EngineError::Config(e),
                EditError::Invalid { dropin, source } => edit_error(name, &dropin, *source),
                EditError::Overridden { key, file, dropin } => EngineError::Overridden { key, file, dropin },
            })
            .map_err(|e| self.blame_the_edit(edit, e))?;
        let (topo, next) = self
            .prepare(&settings)
            .map_err(|e| match e {
                EngineError::Config(c) => edit_error(name, new.path(), *c),
                other => other,
            })
            .map_err(|e| self.blame_the_edit(edit, e))?;
        if let Err(e) = new.write() {
            // The rename may have happened before a later step failed: put the old one back.
            if let Err(e2) = old.write() {
                log::error!("writing back the previous runtime drop-in failed: {}", error_chain(&e2));
            }
            return Err(EngineError::Dropin(e));
        }
        if let Err(e) = self.install(&settings, topo, next) {
            if let Err(e2) = old.write() {
                log::error!("writing back the previous runtime drop-in failed: {}", error_chain(&e2));
            }
            return Err(e);
        }
        self.config_error = None;
        self.publish(Vec::new());
        let verb = match edit {
            PoolEdit::Create { .. } => "created",
            PoolEdit::Resize { .. } => "resized",
            PoolEdit::Delete { .. } => "deleted",
        };
        log::info!(POOL = name.as_str(); "pool {name} {verb}; persisted in `{}`", new.path().display());
        Ok(self.ledger.state.pools().get(name).cloned())
    }
}

impl Engine {
    /// A configuration error about a key the edit does not write (another pool's `count`,
    /// say) is still the edit's doing when the configuration without the edit, as it is on
    /// disk, is valid: then it is an invalid argument, the edit's CPU source, and says what it
    /// breaks. Otherwise (the files on disk are broken anyway) it stays a rejected
    /// configuration naming the file and key.
    fn blame_the_edit(&self, edit: &PoolEdit, e: EngineError) -> EngineError {
        let EngineError::Config(c) = &e else { return e };
        let (PoolEdit::Create { source, .. } | PoolEdit::Resize { source, .. }) = edit else { return e };
        let Some(src) = self.config.as_ref() else { return e };
        let valid_without = src.load(None).ok().is_some_and(|s| self.prepare(&s).is_ok());
        if !valid_without {
            return e;
        }
        let (arg, what) = match source {
            crate::core::edit::Source::Cpus(cpus) => ("cpus", format!("CPUs {cpus}")),
            crate::core::edit::Source::Count { count, numa: None } => ("count", format!("{count} CPUs")),
            crate::core::edit::Source::Count { count, numa: Some(n) } => {
                ("count", format!("{count} CPUs of NUMA node {n}"))
            }
        };
        let reason = format!(
            "with {what} for pool `{}`, the other pools no longer fit: {}",
            edit.name(),
            error_chain(c.as_ref())
        );
        EngineError::State(state::Error::InvalidArgument { arg, reason })
    }
}

/// A configuration error caused by an edit: about one of the edit's own keys in the runtime
/// drop-in, it is an invalid argument of that name; otherwise the configuration is rejected.
/// The start's check of the kubelet's static CPU manager (the device plugin and the DRA driver
/// are not started beside it owning CPUs they would serve), made for what a reload or a pool
/// edit newly gives the kubelet: the CPUs of a pool turned over to the device plugin or DRA, or
/// grown while served. What was served already was checked when its server started.
fn check_cpu_manager(settings: &Settings, now: &State, next: &State) -> Result<(), EngineError> {
    if !settings.kubelet.enabled {
        return Ok(());
    }
    let served = |p: &Pool| p.served_by_device_plugin() || p.served_by_dra();
    let given: Vec<(String, crate::core::cpuset::CpuSet)> = next
        .pools()
        .values()
        .filter(|p| served(p))
        .map(|p| {
            let before =
                now.pools().get(&p.name).filter(|o| served(o)).map(|o| o.cpus.clone()).unwrap_or_default();
            (p.name.to_string(), p.cpus.difference(&before))
        })
        .filter(|(_, cpus)| !cpus.is_empty())
        .collect();
    let file = settings.paths.kubelet_dir.join("cpu_manager_state");
    crate::host::kubelet::check_cpu_manager(&file, &given).map_err(EngineError::StaticCpuManager)
}

fn edit_error(name: &PoolName, dropin: &std::path::Path, e: ConfigError) -> EngineError {
    const ARGS: [&str; 8] = ["cpus", "count", "numa", "kind", "smt", "isolate", "kubelet", "dra"];
    let prefix = config::pool_key(name.as_str(), "");
    let field = e.key().and_then(|k| k.strip_prefix(prefix.as_str())).and_then(|f| f.strip_prefix('.'));
    match field.and_then(|f| ARGS.into_iter().find(|a| *a == f)) {
        Some(arg) if e.file() == Some(dropin) => {
            let reason = error_chain(&e);
            EngineError::State(state::Error::InvalidArgument { arg, reason })
        }
        _ => EngineError::Config(Box::new(e)),
    }
}
