//! The keepers as the engine holds them: the registry of every [`Keeper`] (one line each in
//! [`Keepers::new`]), the checks new settings pass before any keeper takes them ([`check`]), and
//! the one place the engine drives them from ([`Engine::keep_host`]: a pass over the ledger's
//! pools after a reconcile, for installed settings, at a drift check; [`Keepers::reports`] for
//! each snapshot; [`Keepers::stop`] on the way out). Housekeeping joins after start
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

impl Keepers {
    /// One pass over `scene` of the keepers that pass for `pass`; the events of pools whose
    /// reports changed.
    pub(crate) fn keep(&mut self, scene: &Scene<'_>, pass: Pass) -> Vec<Event> {
        let mut events = Vec::new();
        for k in self.iter_mut().filter(|k| pass.includes(&**k)) {
            events.extend(k.keep(scene));
        }
        events
    }

    /// Hands every keeper installed settings.
    pub(crate) fn configure(&mut self, settings: &Settings) {
        for k in self.iter_mut() {
            k.configure(settings);
        }
    }

    /// Waits for what the last passes handed to threads (see [`Keeper::settle`]).
    pub(crate) fn settle(&mut self) {
        for k in self.iter_mut() {
            k.settle();
        }
    }

    /// Every keeper's report, for the snapshot being built.
    pub(crate) fn reports(&self) -> Reports {
        let mut reports = Reports::default();
        for k in self.iter() {
            k.publish(&mut reports);
        }
        reports
    }

    /// Every keeper puts back what it remembers, if so configured (the daemon stops).
    pub(crate) fn stop(&mut self) {
        for k in self.iter_mut() {
            k.stop();
        }
    }
}

impl Engine {
    /// One pass of the keepers that pass for `pass` over the ledger's pools as they are now;
    /// the events of pools whose reports changed.
    pub(crate) fn keep_host(&mut self, pass: Pass) -> Vec<Event> {
        let l = &self.ledger;
        let scene =
            Scene { state: &l.state, topo: &l.topo, backend: &*l.backend, partitions: l.opts.partitions };
        self.keepers.keep(&scene, pass)
    }

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
