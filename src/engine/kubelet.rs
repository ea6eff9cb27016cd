//! What the kubelet wing observes and its device lists depend on, kept by the engine and
//! published in every [`super::Snapshot`], so that the plugin holds no state of its own and
//! every ListAndWatch stream follows one snapshot channel.
//!
//! None of it is saved: each is an observation the wing makes again after a start, within one
//! reconcile tick (the CPUs online from sysfs, the devices held from the kubelet's
//! PodResources) or at the NRI runtime's Synchronize (the containers running on claims' CPUs,
//! read back again there: what ran before a restart is not taken on trust).
//!
//! A plain part: [`update`] records an observation in the view, reading back through the
//! ledger what a container's start claims, and says what to publish; the engine's dispatcher
//! publishes, and moves the isolated partitions ([`follow_pods`]) when the kubelet's pod cgroup
//! comes or goes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::ledger::Ledger;
use crate::core::cpuset::CpuSet;
use crate::core::plan::Key;
use crate::core::plan::Partitions;
use crate::core::state::phase::Phase;
use crate::core::state::{AssignmentId, CgroupPath, Container, State};
use crate::core::topology::Topology;

/// The kubelet wing's observations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeletView {
    /// The CPUs online as last read; `None` until then (the topology's are).
    pub online: Option<CpuSet>,
    /// Devices of shared pools the kubelet holds, by assignment (Allocate and PodResources).
    pub held: BTreeMap<AssignmentId, BTreeSet<String>>,
    /// The container runtime whose NRI the plugin is registered with and synchronized to
    /// (`containerd 1.7.24`): containers get their CPUs when created. `None`: the PodResources
    /// poll confines them after they start.
    pub nri: Option<String>,
    /// The device plugin's PodResources poll interval, once the plugin runs.
    pub poll: Option<std::time::Duration>,
    /// The CPUs the kubelet's pod cgroup (`kubepods.slice`, `kubepods`) has in effect, as last
    /// read; `None` while there is none. A container can run on no other CPU: an isolated
    /// partition elsewhere takes its CPUs away from it.
    pub pod_cpus: Option<CpuSet>,
    /// Containers read back running on the CPUs of kubelet assignments whose target is no
    /// cgroup (a DRA claim of several devices: its container's cgroup is the target of none of
    /// its assignments), by assignment: each container's cgroup and name. Such an assignment is
    /// applied while one runs ([`Phase`]).
    pub running: BTreeMap<AssignmentId, BTreeMap<CgroupPath, Container>>,
}

impl KubeletView {
    /// The CPUs online now, as far as anyone has looked.
    pub fn online(&self, topo: &Topology) -> CpuSet {
        self.online.clone().unwrap_or_else(|| topo.online())
    }

    /// The CPUs a container can be given: online, and in the kubelet's pod cgroup when there
    /// is one. Devices on other CPUs are Unhealthy.
    pub fn usable(&self, topo: &Topology) -> CpuSet {
        let online = self.online(topo);
        match &self.pod_cpus {
            Some(pods) => online.intersection(pods),
            None => online,
        }
    }

    /// How containers get their CPUs, and what it costs, for `status`; `None` without the
    /// device plugin.
    pub fn container_path(&self) -> Option<String> {
        match (&self.nri, self.poll) {
            (Some(runtime), _) => {
                Some(format!("NRI ({runtime}): a container gets its CPUs when it is created"))
            }
            (None, Some(every)) => Some(format!(
                "PodResources poll (no NRI): a container is confined up to {} s after it starts",
                every.as_secs_f64()
            )),
            (None, None) => None,
        }
    }

    /// The shared-pool devices the kubelet holds, of assignments `state` still has.
    pub fn held_devices(&self, state: &State) -> BTreeSet<String> {
        self.held
            .iter()
            .filter(|(id, _)| state.assignments().contains_key(*id))
            .flat_map(|(_, d)| d.iter().cloned())
            .collect()
    }
}

/// One observation of the wing's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeletUpdate {
    /// The CPUs online now.
    Online(CpuSet),
    /// The devices an assignment holds (`None`: none any more).
    Held(AssignmentId, Option<BTreeSet<String>>),
    /// The runtime the NRI plugin serves, or none.
    Nri(Option<String>),
    /// The PodResources poll's interval (the device plugin runs).
    Poll(std::time::Duration),
    /// The effective CPUs of the kubelet's pod cgroup (`None`: there is none).
    PodCpus(Option<CpuSet>),
    /// A container starts on the CPUs of these assignments (a claim's) in `cgroup`: recorded
    /// only if the engine reads back that the kernel gives the cgroup exactly their CPUs.
    Running {
        /// The assignments.
        ids: Vec<AssignmentId>,
        /// The container's cgroup.
        cgroup: CgroupPath,
        /// The container.
        container: Container,
    },
    /// These containers stopped or were removed.
    Stopped(BTreeSet<CgroupPath>),
    /// Only these containers run (the runtime's Synchronize): the others are gone.
    Alive(BTreeSet<CgroupPath>),
}

/// What an observation did to the view ([`update`]).
pub(super) struct Seen {
    /// The answer to the wing: whether the view changed, or for `Running` whether the
    /// read-back holds.
    pub(super) answer: bool,
    /// The events to publish, when the snapshot must be published (the view changed).
    pub(super) publish: Option<Vec<super::Event>>,
    /// Whether the pods' cgroup may have come or gone: where isolated partitions go is to be
    /// looked at again ([`follow_pods`]).
    pub(super) follow_pods: bool,
}

/// Records an observation in `view` (copied on write: published snapshots keep theirs),
/// reading back through `ledger`'s backend what a `Running` one claims.
pub(super) fn update(view: &mut Arc<KubeletView>, ledger: &Ledger, update: KubeletUpdate) -> Seen {
    let update = match update_running(view, ledger, update) {
        Ok(seen) => return seen,
        Err(other) => other,
    };
    let v = Arc::make_mut(view);
    let changed = match update {
        KubeletUpdate::Online(cpus) => v.online.replace(cpus.clone()) != Some(cpus),
        KubeletUpdate::Held(id, Some(devices)) => v.held.insert(id, devices.clone()) != Some(devices),
        KubeletUpdate::Held(id, None) => v.held.remove(&id).is_some(),
        KubeletUpdate::PodCpus(cpus) => std::mem::replace(&mut v.pod_cpus, cpus.clone()) != cpus,
        KubeletUpdate::Poll(every) => v.poll.replace(every) != Some(every),
        KubeletUpdate::Nri(runtime) => std::mem::replace(&mut v.nri, runtime.clone()) != runtime,
        KubeletUpdate::Running { .. } | KubeletUpdate::Stopped(_) | KubeletUpdate::Alive(_) => false,
    };
    Seen { answer: changed, publish: None, follow_pods: changed }
}

/// The containers running on assignments' CPUs ([`KubeletView::running`]): `Ok` when `update`
/// is about them (with the assignments whose phase changed to publish), `Err(update)` for the
/// other observations. `Running` answers whether the read-back holds; the others whether
/// anything changed.
fn update_running(
    view: &mut Arc<KubeletView>,
    ledger: &Ledger,
    update: KubeletUpdate,
) -> Result<Seen, KubeletUpdate> {
    let before = view.running.clone();
    let state = &ledger.state;
    let answer = match update {
        KubeletUpdate::Running { ids, cgroup, container } => {
            let not = Seen { answer: false, publish: None, follow_pods: false };
            let Some(want) = cpus_of(state, &ids) else { return Ok(not) };
            match ledger.backend.enforced(&Key::Cgroup(cgroup.clone())) {
                Ok(Some(now)) if now == want => {}
                read => {
                    log::info!(
                        "container {container} ({cgroup}) is not recorded running on {}: its cgroup has {}, not CPUs {want}",
                        ids.iter().map(|i| i.as_str()).collect::<Vec<_>>().join(", "),
                        match read {
                            Ok(Some(now)) => format!("CPUs {now}"),
                            Ok(None) => "no cpuset to read".into(),
                            Err(e) => format!("an error: {}", crate::error_chain(&e)),
                        }
                    );
                    return Ok(not);
                }
            }
            let v = Arc::make_mut(view);
            for id in ids {
                v.running.entry(id).or_default().insert(cgroup.clone(), container.clone());
            }
            true
        }
        KubeletUpdate::Stopped(gone) => keep_running(view, state, |p| !gone.contains(p)),
        KubeletUpdate::Alive(alive) => keep_running(view, state, |p| alive.contains(p)),
        other => return Err(other),
    };
    let publish = (view.running != before).then(|| phase_changes(state, &before, &view.running));
    Ok(Seen { answer, publish, follow_pods: false })
}

/// The CPUs of `ids` together; `None` when one is not held.
fn cpus_of(state: &State, ids: &[AssignmentId]) -> Option<CpuSet> {
    let all = state.assignments();
    ids.iter().try_fold(CpuSet::new(), |acc, id| Some(acc.union(&all.get(id)?.cpus)))
}

/// Keeps the running containers whose cgroup `keep` says still run, and those of
/// assignments `state` still has; whether anything went.
fn keep_running(view: &mut Arc<KubeletView>, state: &State, keep: impl Fn(&CgroupPath) -> bool) -> bool {
    let v = Arc::make_mut(view);
    let before = v.running.len() + v.running.values().map(BTreeMap::len).sum::<usize>();
    v.running.retain(|id, containers| {
        containers.retain(|p, _| keep(p));
        !containers.is_empty() && state.assignments().contains_key(id)
    });
    before != v.running.len() + v.running.values().map(BTreeMap::len).sum::<usize>()
}

/// The events of the assignments that became allocated or applied between `before` and `now`
/// (the running containers as they were, and are).
fn phase_changes(state: &State, before: &Running, now: &Running) -> Vec<super::Event> {
    let ids: BTreeSet<&AssignmentId> = before.keys().chain(now.keys()).collect();
    ids.into_iter()
        .filter_map(|id| {
            let a = state.assignments().get(id)?;
            let (was, is) = (a.phase(None, before.contains_key(id)), a.phase(None, now.contains_key(id)));
            let change = match (was, is) {
                (Phase::Allocated, Phase::Applied) => super::Change::Applied,
                (Phase::Applied, Phase::Allocated) => super::Change::Allocated,
                _ => return None,
            };
            Some(super::Event::AssignmentChanged { id: id.clone(), change })
        })
        .collect()
}

/// The running containers, by assignment.
type Running = BTreeMap<AssignmentId, BTreeMap<CgroupPath, Container>>;

/// Where a kernel without `cpuset.cpus.exclusive` gets a kubelet pod cgroup, or loses it
/// (seen by the wing's reading of its CPUs), the isolated pools' partitions go or come back
/// ([`crate::core::plan::partitions`]): the ledger lays them out again; returns whether it did
/// (the keepers that read the layout back are then to pass).
pub(super) fn follow_pods(ledger: &mut Ledger) -> bool {
    let pods = ledger.backend.kubelet_pods();
    let want = crate::core::plan::partitions(&ledger.state, ledger.backend.remote_partitions(), pods);
    if want == ledger.opts.partitions {
        return false;
    }
    if want == Partitions::Off {
        log::warn!("{}", crate::core::plan::no_partitions_reason(&ledger.state));
    } else {
        log::info!("the kubelet's pod cgroup is gone: isolated pools are partitions again");
    }
    if let Err(e) = ledger.relayout(|o| o.partitions = want) {
        log::error!("changing where isolated partitions are: {}", crate::engine::error_chain(&e));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::super::tests::{rt, Fixture};
    use super::*;

    /// A kernel without `cpuset.cpus.exclusive` (the sandbox's): once the kubelet's pod cgroup
    /// exists, the isolated pool is no partition (a root partition above it would take every
    /// pool's CPUs from the pods), and its report says why; when it is gone, it is one again.
    #[test]
    fn without_exclusive_cpus_the_kubelets_pods_end_isolated_partitions_and_say_why() {
        let f = Fixture::new();
        f.config(
            &super::super::tests::CONFIG.replace("cpus = \"1-2,5-6\"", "cpus = \"1-2,5-6\"\nisolate = true"),
        );
        let (engine, _) = f.start();
        let roots = super::super::housekeeping::Roots {
            procfs: f.sb.procfs(),
            sysfs: f.sb.sysfs(),
            cgroup: f.sb.cgroupfs(),
            state_dir: f.sb.state(),
            kernel: crate::sim::KERNEL,
        };
        let (handle, thread) = engine.with_housekeeping(roots).spawn().unwrap_or_else(|e| panic!("{e}"));
        let dp = crate::core::pool::PoolName::new("dp").unwrap_or_else(|e| panic!("{e}"));
        let partition = || f.read("cpupool.slice/cpupool-dp.slice/cpuset.cpus.partition");
        assert_eq!(partition(), "isolated");
        assert_eq!(handle.snapshot().layout.partitions, Partitions::Pools);
        let pods = f.sb.cgroupfs().join("kubepods.slice");
        std::fs::create_dir_all(&pods).unwrap_or_else(|e| panic!("{e}"));
        rt().block_on(async {
            let all = handle.snapshot().topology.online();
            assert!(handle.set_pod_cpus(Some(all)).await.unwrap_or_else(|e| panic!("{e}")));
        });
        let snap = handle.snapshot();
        assert_eq!(snap.layout.partitions, Partitions::Off);
        assert_eq!(partition(), "member");
        let summary = snap.report::<crate::engine::IsolationReport>().pools[&dp].summary();
        assert!(summary.starts_with("degraded: no isolated partition"), "{summary}");
        assert!(summary.contains("pool(s) dp, web"), "{summary}");
        std::fs::remove_dir(&pods).unwrap_or_else(|e| panic!("{e}"));
        rt().block_on(async {
            assert!(handle.set_pod_cpus(None).await.unwrap_or_else(|e| panic!("{e}")));
        });
        assert_eq!(handle.snapshot().layout.partitions, Partitions::Pools);
        assert_eq!(partition(), "isolated");
        assert_eq!(handle.snapshot().report::<crate::engine::IsolationReport>().pools[&dp].invalid, None);
        drop(handle);
        let _ = thread.join();
        // A start that finds the pods' cgroup makes no partition in the first place.
        std::fs::create_dir_all(&pods).unwrap_or_else(|e| panic!("{e}"));
        let (engine, _) = f.start();
        assert_eq!(engine.ledger.opts.partitions, Partitions::Off);
        assert_eq!(partition(), "member");
    }

    #[test]
    fn observations_are_published_once_each() {
        let f = Fixture::new();
        let (engine, _) = f.start();
        let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
        let mut snaps = handle.watch();
        snaps.borrow_and_update();
        let all = handle.snapshot().topology.online();
        assert_eq!(handle.snapshot().kubelet.online(&handle.snapshot().topology), all);
        let fewer = all.difference(&CpuSet::parse("7").unwrap_or_default());
        let id = AssignmentId::new("kubelet-milli-web-00001").unwrap_or_else(|e| panic!("{e}"));
        let devs = BTreeSet::from(["milli-web-00001".to_owned()]);
        rt().block_on(async {
            assert!(handle.set_online(fewer.clone()).await.unwrap_or_else(|e| panic!("{e}")));
            assert!(snaps.has_changed().unwrap_or(false));
            snaps.borrow_and_update();
            // The same again changes nothing, and nothing is published.
            assert!(!handle.set_online(fewer.clone()).await.unwrap_or_else(|e| panic!("{e}")));
            assert!(!snaps.has_changed().unwrap_or(true));
            assert!(handle.set_held(id.clone(), Some(devs.clone())).await.unwrap_or_else(|e| panic!("{e}")));
            assert!(!handle.set_held(id.clone(), Some(devs.clone())).await.unwrap_or_else(|e| panic!("{e}")));
        });
        let snap = handle.snapshot();
        assert_eq!(snap.kubelet.online(&snap.topology), fewer);
        assert_eq!(snap.kubelet.held.get(&id), Some(&devs));
        // Held devices of an assignment the state does not have are not counted.
        assert!(snap.kubelet.held_devices(&snap.state).is_empty());
        rt().block_on(async {
            assert!(handle.set_held(id.clone(), None).await.unwrap_or_else(|e| panic!("{e}")));
            assert!(!handle.set_held(id.clone(), None).await.unwrap_or_else(|e| panic!("{e}")));
        });
        assert!(handle.snapshot().kubelet.held.is_empty());
        drop(handle);
        let _ = thread.join();
    }
}
