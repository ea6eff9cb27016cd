//! New settings (a reload) and pool edits (through the runtime drop-in): checked against the
//! host and the live assignments, then installed like any commit.

use std::sync::Arc;

use super::actor::current_cpus;
use super::{error_chain, Engine, EngineError, Event};
use crate::config::runtime::{Dropin, PoolEdit};
use crate::config::{self, ConfigDirs, ConfigError, Settings};
use crate::core::plan;
use crate::core::pool::{Pool, PoolKind, PoolName};
use crate::core::state::{self, State};
use crate::core::topology::Topology;
use crate::host::sysfs;

/// Where the engine reads its configuration: on a reload request and to check a pool edit.
pub struct ConfigSource {
    /// The configuration directories.
    pub dirs: ConfigDirs,
    /// Adjusts what was loaded (the sandbox confines every root to its directory).
    pub adjust: Box<dyn Fn(&mut Settings) + Send>,
}

impl ConfigSource {
    /// Loads the settings, with `replace` standing in for one file if given.
    pub fn load(&self, replace: Option<(&std::path::Path, Option<&str>)>) -> Result<Settings, ConfigError> {
        let mut settings = match replace {
            Some(r) => config::load_with(&self.dirs, r)?,
            None => config::load(&self.dirs)?,
        };
        (self.adjust)(&mut settings);
        Ok(settings)
    }
}

impl Engine {
    pub(super) fn reload(
        &mut self,
        settings: Result<Box<Settings>, ConfigError>,
    ) -> Result<bool, EngineError> {
        let result = settings.map_err(|e| EngineError::Config(Box::new(e))).and_then(|s| self.try_reload(&s));
        match &result {
            Ok(_) => self.config_error = None,
            Err(e) => self.config_error = Some(error_chain(e)),
        }
        self.publish(Vec::new());
        result
    }

    pub(super) fn try_reload(&mut self, settings: &Settings) -> Result<bool, EngineError> {
        let (topo, next) = self.prepare(settings)?;
        self.install(settings, topo, next)
    }

    /// Checks new settings against the host and the live assignments, changing nothing.
    pub(super) fn prepare(&self, settings: &Settings) -> Result<(Topology, State), EngineError> {
        let topo = sysfs::read_topology(&settings.paths.sysfs_root).map_err(EngineError::Topology)?;
        // Count pools keep their CPUs: editing one pool does not move the others.
        let pools = settings
            .resolve_pools_keeping(&topo, &current_cpus(&self.state))
            .map_err(|e| EngineError::Config(Box::new(e)))?;
        let mut next = (*self.state).clone();
        next.set_pools(pools).map_err(|m| {
            EngineError::Stranded(m.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
        })?;
        Ok((topo, next))
    }

    /// Applies and saves prepared settings; `Ok(false)` when nothing changed.
    pub(super) fn install(
        &mut self,
        settings: &Settings,
        topo: Topology,
        next: State,
    ) -> Result<bool, EngineError> {
        let old_topo = std::mem::replace(&mut self.topo, Arc::new(topo));
        let old_lend = std::mem::replace(&mut self.lend_idle, settings.lend_idle);
        let new_opts = self.layout_options(&next, &settings.host_cgroups);
        let old_opts = std::mem::replace(&mut self.opts, new_opts);
        let before = plan::layout(&self.state, &old_topo, &old_opts);
        let after = self.layout(&next);
        if before == after && next == *self.state {
            // Interrupt settings alone may have changed.
            self.irq.configure(settings);
            self.apply_irqs();
            self.publish(Vec::new());
            return Ok(false);
        }
        let names: std::collections::BTreeSet<&PoolName> =
            self.state.pools().keys().chain(next.pools().keys()).collect();
        let changed: Vec<Event> = names
            .into_iter()
            .filter(|n| self.state.pools().get(*n) != next.pools().get(*n))
            .map(|n| Event::PoolChanged(n.clone()))
            .collect();
        if let Err(e) = self.commit_layouts(&before, &after, &next) {
            self.topo = old_topo;
            self.lend_idle = old_lend;
            self.opts = old_opts;
            return Err(e);
        }
        self.state = Arc::new(next);
        self.irq.configure(settings);
        self.apply_irqs();
        for p in self.state.pools().values() {
            log::info!(POOL = p.name.as_str(); "pool {} ({}): CPUs {}", p.name, p.kind, p.cpus);
        }
        let mut changed = changed;
        changed.extend(self.sync_housekeeping());
        self.publish(changed);
        Ok(true)
    }

    /// A pool edit: checked against the state, merged into the runtime drop-in, validated as a
    /// whole configuration, written durably, then applied like a reload. If applying fails, the
    /// previous drop-in is written back.
    pub(super) fn edit_pool(&mut self, edit: &PoolEdit) -> Result<Option<Pool>, EngineError> {
        let name = edit.name();
        let current = self.state.pools().get(name);
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
            (PoolEdit::Delete { .. }, Some(p)) if self.state.usage(&p.name).count > 0 => {
                return Err(state::Error::PoolInUse {
                    pool: name.to_string(),
                    assignments: self.state.usage(&p.name).count,
                }
                .into())
            }
            _ => {}
        }
        let src = self.config.as_ref().ok_or(EngineError::NoConfigFiles)?;
        let old = Dropin::read(&src.dirs).map_err(|e| EngineError::Config(Box::new(e)))?;
        let mut new = old.clone();
        let load = |d: &Dropin| {
            let text = d.text();
            src.load(Some((d.path(), text.as_deref()))).map_err(|e| edit_error(name, d.path(), e))
        };
        let settings = match edit {
            PoolEdit::Delete { .. } => {
                // Without a table, unless another file defines the pool too.
                new.forget(name);
                let settings = load(&new)?;
                if settings.pools.iter().any(|p| &p.name == name) {
                    new.apply(edit);
                    load(&new)?
                } else {
                    settings
                }
            }
            _ => {
                new.apply(edit);
                let settings = load(&new)?;
                if settings.pools.iter().any(|p| &p.name == name) {
                    settings
                } else {
                    // An earlier file removes a pool of this name: bring it back.
                    new.restore(name);
                    load(&new)?
                }
            }
        };
        let wins = |key: &str| settings.origins.get(key).filter(|f| *f != new.path()).map(ToOwned::to_owned);
        match edit {
            PoolEdit::Delete { .. } => {
                if settings.pools.iter().any(|p| &p.name == name) {
                    let key = config::pool_key(name.as_str(), "removed");
                    let file = wins(&key).or_else(|| wins(&config::pool_key(name.as_str(), "")));
                    return Err(EngineError::Overridden {
                        key,
                        file: file.unwrap_or_default(),
                        dropin: new.path().to_owned(),
                    });
                }
            }
            _ => {
                if !settings.pools.iter().any(|p| &p.name == name) {
                    let key = config::pool_key(name.as_str(), "removed");
                    return Err(EngineError::Overridden {
                        key: key.clone(),
                        file: wins(&key).unwrap_or_default(),
                        dropin: new.path().to_owned(),
                    });
                }
                for field in edit.keys() {
                    let key = config::pool_key(name.as_str(), field);
                    if let Some(file) = wins(&key) {
                        return Err(EngineError::Overridden { key, file, dropin: new.path().to_owned() });
                    }
                }
            }
        }
        let (topo, next) = self.prepare(&settings).map_err(|e| match e {
            EngineError::Config(c) => edit_error(name, new.path(), *c),
            other => other,
        })?;
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
        Ok(self.state.pools().get(name).cloned())
    }
}

/// A configuration error caused by an edit: about one of the edit's own keys in the runtime
/// drop-in, it is an invalid argument of that name; otherwise the configuration is rejected.
fn edit_error(name: &PoolName, dropin: &std::path::Path, e: ConfigError) -> EngineError {
    const ARGS: [&str; 7] = ["cpus", "count", "numa", "kind", "smt", "isolate", "kubelet"];
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
