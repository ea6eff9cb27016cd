//! The keepers of host settings beside the cpusets, behind one contract, driven from one place.
//!
//! A keeper owns one kind of host setting that follows the pools: device interrupts off
//! isolated CPUs (`irq`), the sysfs files of the power classes (`power`), the resctrl groups of
//! the cache classes (`cache`). Each runs the same lifecycle, the [`Keeper`] trait:
//!
//! 1. **check**: new settings are checked against the host before the engine takes them
//!    ([`check`], at start and before a reload or pool edit is installed); a key the host cannot
//!    honour refuses the configuration, naming it, and nothing changes;
//! 2. **configure**: the engine hands over settings it installed ([`Keeper::configure`]);
//! 3. **keep**: one pass over the pools as they are now ([`Keeper::keep`]): plan (the pure part
//!    in `core`), remember what is about to change (a [`crate::host::store::Remembered`] value,
//!    durable before the first write, so a crash finds it), write what differs, read it back,
//!    and report what holds and what does not;
//! 4. **publish**: the last pass's report goes into each snapshot ([`Keeper::publish`]);
//! 5. **restore**: when the daemon stops, what was remembered is put back, if so configured
//!    ([`Keeper::stop`]); a restart after a crash restores what no pool wants any more at its
//!    first pass.
//!
//! The engine drives them all from here: [`Engine::keep_host`] after start's reconcile, every
//! installed configuration ([`Engine::reconfigure_keepers`]) and every drift check, and
//! [`Engine::stop_keepers`] on the way out. A new keeper implements [`Keeper`] in its own file
//! and is registered by one line in [`Keepers::new`] (plus its check in [`check`], if it has
//! one).
//!
//! They are trait objects because the engine treats them alike everywhere but in their reports,
//! which each writes into the snapshot itself. Housekeeping (workqueue masks, kernel threads,
//! partition validity) is not one of them yet: it reads partitions through the backend and
//! returns events, and runs at other moments (after every reconcile).
use super::{cache, irq, power, Engine};
use crate::config::{ConfigError, Settings};
use crate::core::pool::Pool;
use crate::core::state::State;
use crate::core::topology::Topology;

use super::handle::Snapshot;

/// What a pass looks at: the pools as the state holds them now, and the host's CPUs.
pub(crate) struct Scene<'a> {
    /// The committed state.
    pub state: &'a State,
    /// The topology the state was laid out on.
    pub topo: &'a Topology,
}

/// One keeper's lifecycle (module docs).
pub(crate) trait Keeper: Send {
    /// Takes new settings (start's are given to its constructor; this is a reload or pool edit).
    fn configure(&mut self, settings: &Settings);
    /// One pass over `scene`: plan, remember, write, read back, report.
    fn keep(&mut self, scene: &Scene<'_>);
    /// Waits for work a pass handed to a thread of its own (start does, before the daemon says
    /// it is ready).
    fn settle(&mut self) {}
    /// Writes the last pass's report into the snapshot.
    fn publish(&self, snap: &mut Snapshot);
    /// Puts back what it remembers, if so configured (the daemon stops).
    fn stop(&mut self);
}

/// Every keeper, in the order they pass.
pub(crate) struct Keepers(Vec<Box<dyn Keeper>>);

/// What [`check`] prepared for the keepers it checked.
pub(crate) struct Checked {
    cache: cache::Prepared,
}

/// Checks new settings against the host for every keeper that checks (module docs).
pub(crate) fn check(
    settings: &Settings,
    topo: &Topology,
    pools: &[Pool],
) -> Result<Checked, Box<ConfigError>> {
    super::housekeeping::check_housekeeping(settings, pools)?;
    let cache = cache::check(settings).map_err(Box::new)?;
    power::check_power(settings, topo, pools)?;
    Ok(Checked { cache })
}

impl Keepers {
    /// Every keeper, set up from `settings` as [`check`]ed, reading what earlier runs remembered.
    pub(crate) fn new(settings: &Settings, checked: Checked) -> Keepers {
        Keepers(vec![
            Box::new(irq::IrqManager::new(settings)),
            Box::new(power::PowerManager::new(settings)),
            Box::new(cache::CacheManager::new(checked.cache)),
        ])
    }
}

impl Engine {
    /// One pass of every keeper over the current pools.
    pub(crate) fn keep_host(&mut self) {
        let scene = Scene { state: &self.state, topo: &self.topo };
        for k in &mut self.keepers.0 {
            k.keep(&scene);
        }
    }

    /// Hands every keeper installed settings, then runs a pass.
    pub(crate) fn reconfigure_keepers(&mut self, settings: &Settings) {
        for k in &mut self.keepers.0 {
            k.configure(settings);
        }
        self.keep_host();
    }

    /// Waits for what the last passes handed to threads (see [`Keeper::settle`]).
    pub(crate) fn settle_keepers(&mut self) {
        for k in &mut self.keepers.0 {
            k.settle();
        }
    }

    /// Every keeper's report, into the snapshot being built.
    pub(crate) fn publish_keepers(&self, snap: &mut Snapshot) {
        for k in &self.keepers.0 {
            k.publish(snap);
        }
    }

    /// Every keeper puts back what it remembers, if so configured (the daemon stops).
    pub(crate) fn stop_keepers(&mut self) {
        for k in &mut self.keepers.0 {
            k.stop();
        }
    }
}
