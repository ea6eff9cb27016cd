//! The keepers as the engine holds them: the registry of every [`Keeper`] (one line each in
//! [`Keepers::new`]), the checks new settings pass before any keeper takes them ([`check`]), and
//! the one place the engine drives them from ([`Engine::keep_host`] after a reconcile,
//! [`Engine::reconfigure_keepers`] for installed settings, [`Engine::keepers_reports`] for each
//! snapshot, [`Engine::stop_keepers`] on the way out). Housekeeping joins after start
//! ([`Engine::with_housekeeping`]) and samples the isolated CPUs on the daemon's health tick
//! ([`Engine::sample_isolation`]), so it is held by type. The contract itself is
//! [`super::keeper`].

use super::handle::Reports;
use super::housekeeping::{Housekeeping, Roots};
use super::keeper::{Keeper, Pass, Scene};
use super::{cache, irq, power, Engine, Event};
use crate::config::{ConfigError, Settings};
use crate::core::pool::Pool;
use crate::core::topology::Topology;

/// Every keeper, in the order they pass: housekeeping last, once it has joined.
pub(crate) struct Keepers {
    /// Interrupts, power classes, cache classes.
    keepers: Vec<Box<dyn Keeper>>,
    /// Housekeeping, held by type for its health tick; `None` until
    /// [`Engine::with_housekeeping`].
    housekeeping: Option<Housekeeping>,
}

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
        let keepers: Vec<Box<dyn Keeper>> = vec![
            Box::new(irq::IrqManager::new(settings)),
            Box::new(power::PowerManager::new(settings)),
            Box::new(cache::CacheManager::new(checked.cache)),
        ];
        Keepers { keepers, housekeeping: None }
    }

    /// Adds housekeeping, which passes after the others.
    pub(crate) fn join_housekeeping(&mut self, hk: Housekeeping) {
        self.housekeeping = Some(hk);
    }

    /// Housekeeping, once it has joined.
    pub(crate) fn housekeeping(&mut self) -> Option<&mut Housekeeping> {
        self.housekeeping.as_mut()
    }

    fn iter(&self) -> impl Iterator<Item = &dyn Keeper> {
        let hk = self.housekeeping.iter().map(|h| h as &dyn Keeper);
        self.keepers.iter().map(|k| &**k).chain(hk)
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut dyn Keeper> {
        let hk = self.housekeeping.iter_mut().map(|h| h as &mut dyn Keeper);
        self.keepers.iter_mut().map(|k| &mut **k as &mut dyn Keeper).chain(hk)
    }
}

impl Engine {
    /// One pass over the current pools of the keepers that pass for `pass`; the events of
    /// pools whose reports changed.
    pub(crate) fn keep_host(&mut self, pass: Pass) -> Vec<Event> {
        let scene = Scene {
            state: &self.ledger.state,
            topo: &self.ledger.topo,
            backend: &*self.ledger.backend,
            partitions: self.ledger.opts.partitions,
        };
        let mut events = Vec::new();
        for k in self.keepers.iter_mut().filter(|k| pass.includes(&**k)) {
            events.extend(k.keep(&scene));
        }
        events
    }

    /// Hands every keeper installed settings, then runs a pass for `pass`.
    pub(crate) fn reconfigure_keepers(&mut self, settings: &Settings, pass: Pass) -> Vec<Event> {
        for k in self.keepers.iter_mut() {
            k.configure(settings);
        }
        self.keep_host(pass)
    }

    /// Waits for what the last passes handed to threads (see [`Keeper::settle`]).
    pub(crate) fn settle_keepers(&mut self) {
        for k in self.keepers.iter_mut() {
            k.settle();
        }
    }

    /// Every keeper's report, for the snapshot being built.
    pub(crate) fn keepers_reports(&self) -> Reports {
        let mut reports = Reports::default();
        for k in self.keepers.iter() {
            k.publish(&mut reports);
        }
        reports
    }

    /// Every keeper puts back what it remembers, if so configured (the daemon stops).
    pub(crate) fn stop_keepers(&mut self) {
        for k in self.keepers.iter_mut() {
            k.stop();
        }
    }
}

impl Engine {
    /// Lets the engine keep kernel housekeeping off the isolated pools and measure them: the
    /// housekeeping keeper joins the others and passes now.
    pub fn with_housekeeping(mut self, roots: Roots) -> Engine {
        let hk = Housekeeping::new(roots, &self.ledger.topo.online().union(self.ledger.topo.offline()));
        self.keepers.join_housekeeping(hk);
        let events = self.keep_host(Pass::Layout);
        self.sample_isolation();
        self.publish(events);
        self
    }

    /// Takes a sample of the counters and measures each isolated pool since the last one.
    pub(super) fn sample_isolation(&mut self) {
        let (state, partitions) = (&self.ledger.state, self.ledger.opts.partitions);
        if let Some(hk) = self.keepers.housekeeping() {
            hk.sample(state, partitions);
        }
    }
}
