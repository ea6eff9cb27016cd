//! Reclaim: assignments whose target is gone are released, so CPUs never leak.
//!
//! Data flow: the engine's events say which assignments exist; for each one marked `reclaim`
//! this task watches its target and, when the target goes, asks the engine to release it (the
//! release logs and signals like any other). Targets are watched as follows:
//! - `pid:N`: a pidfd, opened only if the process still has the start time recorded when the
//!   assignment was made, so a reused pid can neither keep nor steal the assignment;
//! - `unit:NAME`: systemd's `PropertiesChanged` (`ActiveState`) and `UnitRemoved` signals. A
//!   unit is reclaimed once it is inactive or failed after having been seen running; a scope
//!   that is gone is reclaimed at once, since a scope never starts again;
//! - `cgroup:PATH`: an inotify watch on its parent directory, which names the cgroup when it is
//!   removed ([`crate::host::dirwatch`]; cgroupfs tells only the parent), so a watched cgroup
//!   costs nothing until it goes, whatever the number of targets; a target whose parent cannot
//!   be watched (the per-user limit of watches reached) is checked twice a second instead, and
//!   every target is looked at every [`CGROUP_SWEEP`] off the runtime's workers, for what
//!   inotify does not report (a grandparent renamed, a lost watch).
//!
//! It also re-applies the state when systemd finished reloading or re-executing (`Reloading`
//! false), since a re-exec may re-create units from their files.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc;
use zbus::zvariant::OwnedValue;

use crate::backoff::Backoff;
use crate::core::state::{AssignmentId, Target};
use crate::engine::{Event, Handle};
use crate::error_chain;
use crate::host::cgroupfs::CgroupFs;
use crate::host::dirwatch::{DirWatch, Seen, Wd};
use crate::host::{pidwatch, systemd};

/// How often cgroup targets without an inotify watch are checked.
const CGROUP_PERIOD: Duration = Duration::from_millis(500);
/// How often every cgroup target is checked, watched or not.
const CGROUP_SWEEP: Duration = Duration::from_secs(30);
/// How often every unit target is checked, in case a signal was missed.
const UNIT_SWEEP: Duration = Duration::from_secs(5);
/// The longest wait between retries of corrections that failed.
const MAX_RETRY: Duration = Duration::from_secs(300);

/// systemd's object path for a unit: `/org/freedesktop/systemd1/unit/` and the name with
/// every byte outside `[A-Za-z0-9]` written `_xx` (sd-bus `bus_label_escape`).
pub fn unit_object_path(unit: &str) -> String {
    let mut s = String::from("/org/freedesktop/systemd1/unit/");
    for b in unit.bytes() {
        if b.is_ascii_alphanumeric() {
            s.push(b as char);
        } else {
            s.push_str(&format!("_{b:02x}"));
        }
    }
    s
}

enum Watch {
    Pid(tokio::task::JoinHandle<()>),
    /// The cgroup's path and the inotify watch on its parent; none when it could not be added
    /// (then it is checked every [`CGROUP_PERIOD`]).
    Cgroup(crate::core::state::CgroupPath, Option<Wd>),
    Unit {
        name: String,
        path: String,
        seen_active: bool,
    },
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Watch::Pid(task) = self {
            task.abort();
        }
    }
}

/// Watches every reclaimable assignment's target until `stop` completes. `systemd` is the
/// connection to systemd, where it runs.
pub async fn run(
    handle: Handle,
    fs: CgroupFs,
    systemd: Option<zbus::Connection>,
    stop: impl Future<Output = ()>,
) {
    let mut r = Reclaimer::new(handle, fs, systemd);
    let mut events = r.handle.subscribe();
    // zbus reads the connection in order and waits when a signal stream is full. This loop
    // calls systemd (and the engine, which calls systemd) on the same connection, so if it read
    // the streams itself, a flood of signals (systemd re-executing announces every unit) would
    // stall the replies it waits for. A task of its own drains them instead.
    let (signals_tx, mut signals) = mpsc::unbounded_channel();
    let forwarder = r.forward_signals(signals_tx).await;
    r.sync().await;
    let mut cgroup_tick = tokio::time::interval(CGROUP_PERIOD);
    // Not at once: the start has just looked at every target.
    let mut sweep_tick = tokio::time::interval_at(tokio::time::Instant::now() + CGROUP_SWEEP, CGROUP_SWEEP);
    sweep_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut unit_tick = tokio::time::interval(UNIT_SWEEP);
    // The first retry comes at once, the next after two sweeps, doubling from there.
    let mut retry = Retry { backoff: Backoff::new(UNIT_SWEEP * 2, MAX_RETRY), at: std::time::Instant::now() };
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            ev = events.recv() => match ev {
                // One assignment changed: only it is looked at, so an event costs the same
                // whatever the number of assignments.
                Ok(Event::AssignmentChanged { id, .. }) => r.sync_one(&id).await,
                // Events were missed: everything is looked at again.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => r.sync().await,
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            },
            Some((id, why)) = r.gone.1.recv() => r.reclaim(&id, &why).await,
            seen = next_seen(&mut r.dirs) => r.dir_seen(seen).await,
            _ = cgroup_tick.tick() => r.check_unwatched_cgroups().await,
            _ = sweep_tick.tick() => r.sweep_cgroups().await,
            _ = unit_tick.tick() => {
                r.sweep_units().await;
                r.retry_failed(&mut retry).await;
            }
            Some(sig) = signals.recv() => r.signal(sig).await,
        }
    }
    for task in forwarder {
        task.abort();
    }
}

/// What systemd said, as the forwarder passes it on.
enum Signal {
    /// `PropertiesChanged` on a unit object, with the new `ActiveState` if it was included.
    UnitChanged { path: String, active_state: Option<String> },
    /// `UnitRemoved`.
    UnitRemoved(String),
    /// `Reloading(false)`: a reload or re-exec finished.
    Reloaded,
}

/// An assignment whose target is gone, and why.
type Gone = (AssignmentId, String);

struct Reclaimer {
    handle: Handle,
    fs: CgroupFs,
    systemd: Option<zbus::Connection>,
    watches: HashMap<AssignmentId, Watch>,
    /// Pid watchers report here: (assignment, why it is gone).
    gone: (mpsc::UnboundedSender<Gone>, mpsc::UnboundedReceiver<Gone>),
    /// The inotify watches on cgroup targets; none when inotify could not be set up.
    dirs: Option<DirWatch>,
    /// The assignments each watch (on a parent directory) is for, by the name of their target
    /// in it: one per name, unless a released assignment and a new one on the same target
    /// overlap for a moment.
    by_wd: HashMap<Wd, HashMap<String, Vec<AssignmentId>>>,
    /// Whether a target that could not be watched was logged.
    warned_unwatched: bool,
}

/// The next thing the inotify watches saw; pending forever without them.
async fn next_seen(dirs: &mut Option<DirWatch>) -> Seen {
    match dirs {
        Some(d) => d.next().await,
        None => std::future::pending().await,
    }
}

/// When what failed to apply is tried again.
struct Retry {
    backoff: Backoff,
    /// Not before this.
    at: std::time::Instant,
}

impl Reclaimer {
    /// The reclaimer of `handle`'s assignments, watching cgroup targets with inotify where it
    /// can.
    fn new(handle: Handle, fs: CgroupFs, systemd: Option<zbus::Connection>) -> Reclaimer {
        let dirs = DirWatch::new()
            .map_err(|e| {
                log::warn!("cannot watch cgroup targets with inotify ({e}); checking them twice a second")
            })
            .ok();
        Reclaimer {
            handle,
            fs,
            systemd,
            watches: HashMap::new(),
            gone: mpsc::unbounded_channel(),
            dirs,
            by_wd: HashMap::new(),
            warned_unwatched: false,
        }
    }

    /// What systemd could not be told (it was away, e.g. re-executing) is tried again, backing
    /// off from 5 s to 5 min while it keeps failing (a unit that no longer exists fails every
    /// time until its assignment is released).
    async fn retry_failed(&self, retry: &mut Retry) {
        if self.systemd.is_some() && !self.handle.snapshot().degraded.is_empty() {
            if std::time::Instant::now() >= retry.at {
                match self.handle.reapply().await {
                    Ok(n) => log::info!("re-applied what failed before: {n} corrections"),
                    Err(e) => log::error!("re-applying: {}", error_chain(&e)),
                }
                retry.at = std::time::Instant::now() + retry.backoff.fail();
            }
        } else {
            retry.backoff.reset();
            retry.at = std::time::Instant::now();
        }
    }

    /// A signal from systemd: a unit changed or went away, or systemd reloaded.
    async fn signal(&mut self, sig: Signal) {
        match sig {
            Signal::UnitChanged { path, active_state } => self.unit_changed(&path, active_state).await,
            Signal::UnitRemoved(unit) => self.unit_gone(&unit).await,
            Signal::Reloaded => match self.handle.reapply().await {
                Ok(n) => {
                    // systemd's reload rewrote what it realizes: drift, corrected.
                    crate::counters::counters().drift(n, 0);
                    log::info!("systemd reloaded: state re-applied ({n} corrections)")
                }
                Err(e) => log::error!("re-applying after systemd reloaded: {}", error_chain(&e)),
            },
        }
    }

    /// Starts the tasks that drain systemd's signal streams into `tx`.
    async fn forward_signals(&self, tx: mpsc::UnboundedSender<Signal>) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        if let Some(mut stream) = self.unit_changes().await {
            let tx = tx.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(msg) = stream.next().await {
                    let Ok(msg) = msg else { continue };
                    let Some(path) = msg.header().path().map(|p| p.to_string()) else { continue };
                    let body = msg.body();
                    let changed: Option<(String, HashMap<String, OwnedValue>, Vec<String>)> =
                        body.deserialize().ok();
                    let active_state = changed.and_then(|(_, props, _)| {
                        props.get("ActiveState").and_then(|v| String::try_from(v.clone()).ok())
                    });
                    if tx.send(Signal::UnitChanged { path, active_state }).is_err() {
                        break;
                    }
                }
            }));
        }
        let (removed, reloading) = self.manager_signals().await;
        if let Some(mut removed) = removed {
            let tx = tx.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(sig) = removed.next().await {
                    let Ok(args) = sig.args() else { continue };
                    if tx.send(Signal::UnitRemoved(args.unit.clone())).is_err() {
                        break;
                    }
                }
            }));
        }
        if let Some(mut reloading) = reloading {
            tasks.push(tokio::spawn(async move {
                while let Some(sig) = reloading.next().await {
                    let Ok(args) = sig.args() else { continue };
                    if !args.active && tx.send(Signal::Reloaded).is_err() {
                        break;
                    }
                }
            }));
        }
        tasks
    }

    async fn unit_changes(&self) -> Option<zbus::MessageStream> {
        let conn = self.systemd.as_ref()?;
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender("org.freedesktop.systemd1")
            .and_then(|b| b.interface("org.freedesktop.DBus.Properties"))
            .and_then(|b| b.member("PropertiesChanged"))
            .and_then(|b| b.add_arg("org.freedesktop.systemd1.Unit"))
            .map(|b| b.build());
        let stream = match rule {
            Ok(rule) => zbus::MessageStream::for_match_rule(rule, conn, Some(256)).await,
            Err(e) => Err(e),
        };
        stream.map_err(|e| log::error!("watching systemd units: {e}")).ok()
    }

    async fn manager_signals(
        &self,
    ) -> (Option<systemd::UnitRemovedStream>, Option<systemd::ReloadingStream>) {
        let Some(conn) = &self.systemd else { return (None, None) };
        let m = match systemd::ManagerProxy::new(conn).await {
            Ok(m) => m,
            Err(e) => {
                log::error!("watching systemd: {e}");
                return (None, None);
            }
        };
        let removed =
            m.receive_unit_removed().await.map_err(|e| log::error!("watching UnitRemoved: {e}")).ok();
        let reloading = m.receive_reloading().await.map_err(|e| log::error!("watching Reloading: {e}")).ok();
        (removed, reloading)
    }

    /// Starts watching new reclaimable assignments and stops watching released ones: all of
    /// them, at start and after missed events.
    async fn sync(&mut self) {
        let snap = self.handle.snapshot();
        let live = snap.state.assignments();
        let stale: Vec<AssignmentId> =
            self.watches.keys().filter(|id| !live.get(*id).is_some_and(|a| a.reclaim)).cloned().collect();
        for id in stale {
            self.forget(&id);
        }
        for a in live.values().filter(|a| a.reclaim) {
            if !self.watches.contains_key(&a.id) {
                self.watch(a).await;
            }
        }
    }

    /// [`Reclaimer::sync`] for the one assignment an event names.
    async fn sync_one(&mut self, id: &AssignmentId) {
        let snap = self.handle.snapshot();
        match snap.state.assignments().get(id) {
            Some(a) if a.reclaim => {
                if !self.watches.contains_key(id) {
                    self.watch(a).await;
                }
            }
            _ => {
                self.forget(id);
            }
        }
    }

    /// Starts watching `a`'s target.
    async fn watch(&mut self, a: &crate::core::state::Assignment) {
        let watch = match &a.target {
            Target::Pid(pid) => {
                let start = a.process_start.or_else(|| self.fs.process_start(*pid));
                let (id, tx, pid) = (a.id.clone(), self.gone.0.clone(), *pid);
                let watched = start.map(|s| pidwatch::watch(&self.fs, pid, s));
                Watch::Pid(tokio::spawn(async move {
                    let why = match watched {
                        Some(Ok(Some(w))) => {
                            w.exited().await;
                            format!("process {pid} exited")
                        }
                        Some(Err(e)) => {
                            // Cannot watch: keep the assignment rather than guess.
                            log::warn!("cannot watch process {pid} of assignment {id}: {e}");
                            return;
                        }
                        _ => format!("process {pid} is gone"),
                    };
                    let _ = tx.send((id, why));
                }))
            }
            Target::Cgroup(path) => {
                let wd = self.watch_dir(&a.id, path);
                Watch::Cgroup(path.clone(), wd)
            }
            // Not placed yet; the device plugin owns kubelet assignments.
            Target::Kubelet(_) => return,
            Target::Unit(name) => {
                let state = self.unit_state(name).await;
                Watch::Unit {
                    name: name.clone(),
                    path: unit_object_path(name),
                    seen_active: state.flatten().as_deref().is_some_and(running),
                }
            }
        };
        self.watches.insert(a.id.clone(), watch);
    }

    /// Adds the inotify watch on `path`'s parent for `id`; none when it cannot be added. A
    /// target that does not exist (now that removing it would be seen) is reported gone, as a
    /// check would find it.
    fn watch_dir(&mut self, id: &AssignmentId, path: &crate::core::state::CgroupPath) -> Option<Wd> {
        let (parent, name) = path.as_str().rsplit_once('/').unwrap_or(("", path.as_str()));
        let added = self.dirs.as_mut()?.add(&self.fs.root().join(parent));
        // Looked at after the watch is in place, so that a removal in between is not missed.
        let exists = self.fs.exists(path);
        let wd = match added {
            Ok(wd) => {
                self.by_wd
                    .entry(wd.clone())
                    .or_default()
                    .entry(name.to_owned())
                    .or_default()
                    .push(id.clone());
                Some(wd)
            }
            Err(e) => {
                if exists && !self.warned_unwatched {
                    self.warned_unwatched = true;
                    log::warn!(
                        "cannot watch the parent of cgroup {path} with inotify ({e}; see \
                         fs.inotify.max_user_watches): such targets are checked twice a second"
                    );
                }
                None
            }
        };
        if !exists {
            let _ = self.gone.0.send((id.clone(), format!("cgroup {path} was removed")));
        }
        wd
    }

    /// Stops watching `id`'s target.
    fn forget(&mut self, id: &AssignmentId) -> Option<Watch> {
        let w = self.watches.remove(id)?;
        if let Watch::Cgroup(path, Some(wd)) = &w {
            self.unwatch(wd, path, id);
        }
        Some(w)
    }

    /// Takes `id` (whose target is `path`) off the watch `wd`, and the watch off the directory
    /// when no target is left under it.
    fn unwatch(&mut self, wd: &Wd, path: &crate::core::state::CgroupPath, id: &AssignmentId) {
        let name = path.as_str().rsplit('/').next().unwrap_or_default();
        let Some(names) = self.by_wd.get_mut(wd) else { return };
        if let Some(ids) = names.get_mut(name) {
            ids.retain(|i| i != id);
            if ids.is_empty() {
                names.remove(name);
            }
        }
        if names.is_empty() {
            self.by_wd.remove(wd);
            if let Some(d) = self.dirs.as_mut() {
                d.remove(wd.clone());
            }
        }
    }

    /// What the inotify watches saw: a target that is gone now is reclaimed; one that is there
    /// again (made anew) is kept, and watched again if its parent's watch ended.
    async fn dir_seen(&mut self, seen: Seen) {
        let (ids, rewatch) = match seen {
            Seen::ChildGone(wd, name) => {
                let ids = self.by_wd.get(&wd).and_then(|names| names.get(&name)).cloned().unwrap_or_default();
                (ids, false)
            }
            Seen::Gone(wd) => {
                let names = self.by_wd.remove(&wd).unwrap_or_default();
                if let Some(d) = self.dirs.as_mut() {
                    d.remove(wd);
                }
                (names.into_values().flatten().collect(), true)
            }
            Seen::Overflow => {
                log::warn!("inotify events on cgroup targets were lost; looking at every target");
                self.sweep_cgroups().await;
                return;
            }
            Seen::Broken(e) => {
                log::warn!("watching cgroup targets with inotify failed ({e}); checking them twice a second");
                self.dirs = None;
                self.by_wd.clear();
                for w in self.watches.values_mut() {
                    if let Watch::Cgroup(_, wd) = w {
                        *wd = None;
                    }
                }
                return;
            }
        };
        for id in ids {
            let Some(Watch::Cgroup(path, _)) = self.watches.get(&id) else { continue };
            let path = path.clone();
            if !self.fs.exists(&path) {
                self.reclaim(&id, &format!("cgroup {path} was removed")).await;
            } else if rewatch {
                let wd = self.watch_dir(&id, &path);
                if let Some(Watch::Cgroup(_, slot)) = self.watches.get_mut(&id) {
                    *slot = wd;
                }
            }
        }
    }

    async fn reclaim(&mut self, id: &AssignmentId, why: &str) {
        if self.forget(id).is_none() {
            return;
        }
        match self.handle.release(id.as_str()).await {
            Ok(a) => {
                crate::counters::counters().reclaimed(a.pool.as_str());
                log::info!(
                    ASSIGNMENT = id.as_str(), POOL = a.pool.as_str();
                    "reclaimed assignment {id} (CPUs {} of pool {}): {why}", a.cpus, a.pool
                )
            }
            // Released meanwhile by its owner: nothing to do.
            Err(crate::engine::EngineError::State(crate::core::state::Error::NoSuchAssignment {
                ..
            })) => {}
            Err(e) => log::error!("reclaiming assignment {id} ({why}): {}", error_chain(&e)),
        }
    }

    /// Checks the cgroup targets that have no inotify watch: none until one could not be
    /// added.
    async fn check_unwatched_cgroups(&mut self) {
        if self.dirs.is_some() && !self.warned_unwatched {
            return;
        }
        self.check_cgroups(false).await;
    }

    /// Checks every cgroup target, watched or not.
    async fn sweep_cgroups(&mut self) {
        self.check_cgroups(true).await;
    }

    /// Reclaims the cgroup targets that are gone: every one, or (`all` false) those without a
    /// watch. The stats run on a blocking thread (at 10,000 targets, 10,000 of them).
    async fn check_cgroups(&mut self, all: bool) {
        let targets: Vec<(AssignmentId, crate::core::state::CgroupPath)> = self
            .watches
            .iter()
            .filter_map(|(id, w)| match w {
                Watch::Cgroup(path, wd) if all || wd.is_none() => Some((id.clone(), path.clone())),
                _ => None,
            })
            .collect();
        if targets.is_empty() {
            return;
        }
        let fs = self.fs.clone();
        // A thread of its own: tokio's blocking pool panics when no thread can be started
        // (pids.max reached), which ended the reclaimer; this way the check is tried again.
        let gone = match crate::threads::run_blocking("the reclaimer's cgroup check", move || {
            targets.into_iter().filter(|(_, path)| !fs.exists(path)).collect::<Vec<_>>()
        })
        .await
        {
            Ok(gone) => gone,
            Err(e) => {
                log::warn!("reclaim: checking cgroup targets: {}", crate::error_chain(&e));
                return;
            }
        };
        for (id, path) in gone {
            // Still the same target: it may have been released and assigned anew meanwhile.
            if matches!(self.watches.get(&id), Some(Watch::Cgroup(p, _)) if *p == path) {
                self.reclaim(&id, &format!("cgroup {path} was removed")).await;
            }
        }
    }

    /// `Some(Some(ActiveState))` of a loaded unit, `Some(None)` when systemd says it is not
    /// loaded (`NoSuchUnit`), `None` when systemd could not be asked: then nothing is decided.
    async fn unit_state(&self, name: &str) -> Option<Option<String>> {
        let conn = self.systemd.as_ref()?;
        let m = systemd::ManagerProxy::new(conn).await.ok()?;
        let path = match m.get_unit(name).await {
            Ok(p) => p,
            Err(zbus::Error::MethodError(e, _, _)) if e.as_str() == "org.freedesktop.systemd1.NoSuchUnit" => {
                return Some(None)
            }
            Err(e) => {
                log::debug!("asking systemd about {name}: {e}");
                return None;
            }
        };
        let unit = systemd::UnitProxy::builder(conn)
            .path(path)
            .ok()?
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .ok()?;
        unit.active_state().await.ok().map(Some)
    }

    /// Decides on a unit in `state` (`Some(None)`: not loaded; `None`: unknown).
    async fn judge(&mut self, id: AssignmentId, state: Option<Option<String>>) {
        let Some(state) = state else { return };
        let Some(Watch::Unit { name, seen_active, .. }) = self.watches.get_mut(&id) else { return };
        let name = name.clone();
        match state.as_deref() {
            Some(s) if running(s) => *seen_active = true,
            Some(s @ ("inactive" | "failed")) if *seen_active => {
                self.reclaim(&id, &format!("unit {name} is {s}")).await;
            }
            None if *seen_active || name.ends_with(".scope") => {
                self.reclaim(&id, &format!("unit {name} is gone")).await;
            }
            _ => {}
        }
    }

    fn unit_ids(&self, pred: impl Fn(&str, &str) -> bool) -> Vec<AssignmentId> {
        self.watches
            .iter()
            .filter_map(|(id, w)| match w {
                Watch::Unit { name, path, .. } if pred(name, path) => Some(id.clone()),
                _ => None,
            })
            .collect()
    }

    async fn unit_changed(&mut self, path: &str, state: Option<String>) {
        let ids = self.unit_ids(|_, p| p == path);
        for id in ids {
            let (name, state) = match (&state, self.watches.get(&id)) {
                (Some(s), _) => (None, Some(Some(s.clone()))),
                (None, Some(Watch::Unit { name, .. })) => (Some(name.clone()), None),
                _ => continue,
            };
            let state = match name {
                Some(n) => self.unit_state(&n).await,
                None => state,
            };
            self.judge(id, state).await;
        }
    }

    async fn unit_gone(&mut self, unit: &str) {
        for id in self.unit_ids(|n, _| n == unit) {
            // Unloaded; it may be loaded again at once (a restart): ask.
            let state = self.unit_state(unit).await;
            self.judge(id, state).await;
        }
    }

    async fn sweep_units(&mut self) {
        if self.systemd.is_none() {
            return;
        }
        for id in self.unit_ids(|_, _| true) {
            let Some(Watch::Unit { name, .. }) = self.watches.get(&id) else { continue };
            let name = name.clone();
            let state = self.unit_state(&name).await;
            self.judge(id, state).await;
        }
    }
}

/// States in which a unit counts as running.
fn running(state: &str) -> bool {
    matches!(state, "active" | "activating" | "reloading" | "deactivating")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// systemd's own paths, as `busctl tree org.freedesktop.systemd1` shows them.
    #[test]
    fn unit_paths_are_escaped_like_systemd() {
        assert_eq!(unit_object_path("system.slice"), "/org/freedesktop/systemd1/unit/system_2eslice");
        assert_eq!(
            unit_object_path("cpupool-dp.slice"),
            "/org/freedesktop/systemd1/unit/cpupool_2ddp_2eslice"
        );
        assert_eq!(
            unit_object_path("getty@tty1.service"),
            "/org/freedesktop/systemd1/unit/getty_40tty1_2eservice"
        );
    }
}
