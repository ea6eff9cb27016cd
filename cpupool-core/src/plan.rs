//! The planner: from the placement the state implies ([`layout`]) before and after a change, the
//! ordered host effects that get from one to the other.
//!
//! Order matters because the kernel sees every intermediate step. Sets that must stay disjoint
//! (pool slices among themselves and against the host slices, exclusive assignments among
//! themselves) are first shrunk to what they keep, and only then grown, each grow waiting until
//! no conflicting set still holds the CPUs it adds. Parents grow before their children and
//! shrink after them. Only a true cycle (two pools swapping CPUs) needs a set to be emptied for a
//! moment; that is the one case where a set is written empty mid-way.
//!
//! Isolated partitions are torn down (back to `member`) before anything else changes and set up
//! again after every CPU list is in place, since the kernel only accepts a partition whose CPUs
//! are exclusive among its siblings and held by its parent. Changing which CPUs are isolated at
//! all tears down every isolated pool for the moment of the change.
//!
//! The planner does not know which backend runs the effects: the cgroupfs backend writes
//! `cpuset.cpus` itself, the systemd backend sets `AllowedCPUs` on units.

use std::collections::{BTreeMap, BTreeSet};

use super::cpuset::CpuSet;
use super::pool::{Pool, PoolKind, PoolName};
use super::state::{Assignment, AssignmentId, CgroupPath, State, Target};
use super::topology::Topology;

mod order;
pub use order::plan;
use order::torn;
#[cfg(test)]
use order::{role_index, ROLES};

/// The slice that holds every pool slice.
pub const TOP_SLICE: &str = "cpupool.slice";

/// The cgroup path of a pool's slice: `cpupool.slice/cpupool-<pool>.slice`.
pub fn pool_slice(pool: &PoolName) -> CgroupPath {
    // Pool names are [a-z0-9_]{1,32}, so this is always a valid path.
    CgroupPath::new(&format!("{TOP_SLICE}/cpupool-{pool}.slice")).unwrap_or_else(|_| unreachable_path())
}

#[allow(clippy::panic)]
fn unreachable_path() -> CgroupPath {
    panic!("pool names are validated to form valid cgroup paths")
}

/// What a placement is restricted on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// A cgroup, relative to the cgroup root.
    Cgroup(CgroupPath),
    /// A systemd unit.
    Unit(String),
    /// A process (all its threads).
    Pid(u32),
}

impl Key {
    fn depth(&self) -> usize {
        match self {
            Key::Cgroup(p) => p.depth(),
            _ => usize::MAX,
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::Cgroup(p) => write!(f, "cgroup {p}"),
            Key::Unit(u) => write!(f, "unit {u}"),
            Key::Pid(p) => write!(f, "pid {p}"),
        }
    }
}

impl Key {
    /// What `t` is restricted on; `None` for a kubelet allocation whose container is not known
    /// yet (its CPUs are held, nothing on the host is restricted).
    pub fn of(t: &Target) -> Option<Key> {
        match t {
            Target::Cgroup(p) => Some(Key::Cgroup(p.clone())),
            Target::Unit(u) => Some(Key::Unit(u.clone())),
            Target::Pid(p) => Some(Key::Pid(*p)),
            Target::Kubelet(_) => None,
        }
    }
}

/// Why a placement exists; decides which placements must stay disjoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// `cpupool.slice`: holds every pool slice.
    Parent,
    /// A pool's slice.
    Pool(PoolKind),
    /// A host slice (system.slice, ...) confined to the reserved pool. Skipped where it does
    /// not exist.
    Host,
    /// A kubelet container that uses no pool: kept off the exclusive pools' CPUs, free to share
    /// the others. Skipped where it does not exist.
    Unpooled,
    /// An exclusive assignment's target.
    Exclusive,
    /// A shared assignment's target.
    Shared,
}

impl Role {
    fn conflicts(&self, other: &Role) -> bool {
        use Role::*;
        matches!(
            (self, other),
            (Pool(_), Pool(_))
                | (Exclusive, Exclusive)
                | (Host, Pool(PoolKind::Shared))
                | (Pool(PoolKind::Shared), Host)
                | (Host, Exclusive)
                | (Exclusive, Host)
                | (Unpooled, Exclusive)
                | (Exclusive, Unpooled)
        )
    }

    /// Placements on cgroups someone else makes and removes: writes skip a missing one.
    fn optional(&self) -> bool {
        matches!(self, Role::Host | Role::Unpooled)
    }

    /// Cgroups the daemon creates and removes itself.
    fn owned(&self) -> bool {
        matches!(self, Role::Parent | Role::Pool(_))
    }
}

/// A cgroup's part in cpuset partitioning.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Partition {
    /// An ordinary cgroup (`cpuset.cpus.partition = member`).
    #[default]
    Member,
    /// `cpupool.slice` while pools below it are isolated: it must grant them these CPUs
    /// (`cpuset.cpus.exclusive` where the kernel has it, a `root` partition where it does not).
    Parent(CpuSet),
    /// An isolated partition on these CPUs: no load balancing across them.
    Isolated(CpuSet),
}

/// Where one thing may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Its CPUs.
    pub cpus: CpuSet,
    /// Its memory nodes (cgroups only).
    pub mems: CpuSet,
    /// Why it exists.
    pub role: Role,
    /// Its part in cpuset partitioning (pool slices and their parent only).
    pub partition: Partition,
    /// A CPU time limit in millicpus (shared assignments of pools with `enforce_quota`).
    pub quota: Option<u64>,
}

impl Placement {
    /// A placement that is not a partition and has no quota.
    pub fn new(cpus: CpuSet, mems: CpuSet, role: Role) -> Placement {
        Placement { cpus, mems, role, partition: Partition::Member, quota: None }
    }
}

/// Every placement the daemon maintains.
pub type Layout = BTreeMap<Key, Placement>;

/// One host side effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Create a cgroup (and enable `+cpuset` in its parents' `cgroup.subtree_control`).
    CreateCgroup(CgroupPath),
    /// Restrict `key` to `cpus`. Empty `cpus` lifts the restriction (cgroup: inherit the
    /// parent; unit: `AllowedCPUs=`; pid: every CPU). `optional`: skip if it does not exist.
    SetCpus {
        /// What.
        key: Key,
        /// Its CPUs.
        cpus: CpuSet,
        /// Skip it if it does not exist.
        optional: bool,
    },
    /// Write a cgroup's `cpuset.mems`.
    SetMems {
        /// The cgroup.
        path: CgroupPath,
        /// Its nodes.
        mems: CpuSet,
        /// Skip it if it does not exist.
        optional: bool,
    },
    /// Remove a cgroup the daemon created.
    RemoveCgroup(CgroupPath),
    /// Make a cgroup a partition, or an ordinary member again.
    SetPartition {
        /// The cgroup.
        path: CgroupPath,
        /// What it becomes.
        partition: Partition,
    },
    /// Limit `key`'s CPU time (`None` lifts the limit). Skipped where it does not exist.
    SetQuota {
        /// What.
        key: Key,
        /// Millicpus: 1000 is one CPU's worth of time.
        millis: Option<u64>,
    },
}

/// What the layout depends on besides the state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayoutOptions {
    /// Host cgroups confined to the reserved pool (`daemon.host_cgroups`).
    pub host_cgroups: Vec<CgroupPath>,
    /// Let the host cgroups also use exclusive CPUs that no assignment holds
    /// (`daemon.lend_idle`; never CPUs of isolated pools).
    pub lend_idle: bool,
    /// Cgroups of kubelet containers that use no pool (`kubelet.confine_unpooled`): kept off
    /// the exclusive pools' CPUs, like the kubelet's own shared pool.
    pub unpooled: BTreeSet<CgroupPath>,
    /// Where isolated partitions are made.
    pub partitions: Partitions,
}

/// Where the isolated pools' partitions are made: what the kernel allows and what the CPUs
/// serve decide it (the engine chooses; see docs/behaviour.md, "Isolated pools and containers").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Partitions {
    /// Each isolated pool's slice is a partition on all its CPUs.
    #[default]
    Pools,
    /// The kernel has `cpuset.cpus.exclusive` (Linux 6.7): the CPUs of an isolated pool that
    /// serve kubelet containers (an allocation, or a container's cgroup outside
    /// `cpupool.slice`) leave the pool's partition, and each such container's cgroup is an
    /// isolated partition of its own; the pool's slice keeps the rest.
    Containers,
    /// None: without `cpuset.cpus.exclusive` the parent of isolated pools must be a `root`
    /// partition, which would take every pool's CPUs from the kubelet's containers.
    Off,
}

/// The placements `state` implies: the top slice and one slice per pool (the reserved pool's
/// slices are the host cgroups, confined to its CPUs, plus the idle exclusive CPUs when lending),
/// and every assignment's target.
pub fn layout(state: &State, topo: &Topology, opts: &LayoutOptions) -> Layout {
    let mut out = frame(state, topo, opts);
    for a in state.assignments().values() {
        insert_target(&mut out, state, topo, opts, a);
    }
    out
}

/// The parts of [`layout`] of `before` and of `after` (a state derived from it) that a change
/// to the assignments `ids` can touch: the pool-level placements (the top slice, the pool
/// slices, the host cgroups and unpooled containers, whose lent CPUs move with exclusive
/// assignments), the targets of `ids`, and any other target that encloses one of those.
///
/// Planning between these gives exactly the effects of planning between the whole layouts
/// ([`plan`] and [`kept`]): every other placement is the same on both sides, so it is never
/// written, and since a layout keeps conflicting sets apart, its CPUs never stand in the way of
/// a set that grows; what could (a parent a child waits for, the partitions that are torn down
/// and set up as a whole) is included. So a mutation costs the same with 10 assignments as with
/// 10,000.
pub fn partial_layouts(
    before: &State,
    after: &State,
    topo: &Topology,
    opts: &LayoutOptions,
    ids: &BTreeSet<AssignmentId>,
) -> (Layout, Layout) {
    touched_layouts(before, after, topo, opts, ids, true)
}

/// The layouts a commit plans between: [`partial_layouts`], without the pool-level placements
/// when the change cannot touch them ([`frame_untouched`]). Those are then the same on both
/// sides, so they give no effect, and they neither enclose nor lie below a touched target, so
/// no grow or shrink waits on them: planning without them plans what planning with them does
/// (the planner's property tests check it), at the cost of the targets alone rather than of
/// every pool slice twice over.
pub fn mutation_layouts(
    before: &State,
    after: &State,
    topo: &Topology,
    opts: &LayoutOptions,
    ids: &BTreeSet<AssignmentId>,
) -> (Layout, Layout) {
    let frame = !frame_untouched(before, after, opts, ids);
    touched_layouts(before, after, topo, opts, ids, frame)
}

/// Whether the change from `before` to `after` of the assignments `ids` leaves every
/// pool-level placement of [`frame`] as it was and touches no cgroup at, above or below one:
/// the same pools; no exclusive assignment touched when idle exclusive CPUs are lent (lending
/// follows what the exclusive pools hold free); and no touched target in `cpupool.slice`, at or
/// below a host cgroup or an unpooled container, or above one of those.
fn frame_untouched(
    before: &State,
    after: &State,
    opts: &LayoutOptions,
    ids: &BTreeSet<AssignmentId>,
) -> bool {
    if before.pools() != after.pools() {
        return false;
    }
    let touched =
        || ids.iter().flat_map(|id| [before.assignments().get(id), after.assignments().get(id)]).flatten();
    if opts.lend_idle && touched().any(|a| a.kind == PoolKind::Exclusive) {
        return false;
    }
    // A container's CPUs leave or rejoin its isolated pool's partition.
    let isolated = |a: &Assignment| after.pools().get(&a.pool).is_some_and(|p| p.isolate);
    if opts.partitions == Partitions::Containers && touched().any(isolated) {
        return false;
    }
    let within = |inner: &str, outer: &str| {
        inner == outer || inner.strip_prefix(outer).is_some_and(|rest| rest.starts_with('/'))
    };
    !touched().any(|a| match &a.target {
        Target::Cgroup(p) => {
            let path = p.as_str();
            within(path, TOP_SLICE)
                || opts.host_cgroups.iter().any(|h| within(path, h.as_str()) || within(h.as_str(), path))
                // Unpooled containers may be many: look them up at or above the target, and
                // below it among the paths that start with it (contiguous in path order).
                || opts.unpooled.contains(p)
                || p.ancestors().iter().any(|up| opts.unpooled.contains(up))
                || opts
                    .unpooled
                    .range::<CgroupPath, _>((std::ops::Bound::Excluded(p), std::ops::Bound::Unbounded))
                    .take_while(|next| next.as_str().starts_with(path))
                    .any(|next| within(next.as_str(), path))
        }
        _ => false,
    })
}

fn touched_layouts(
    before: &State,
    after: &State,
    topo: &Topology,
    opts: &LayoutOptions,
    ids: &BTreeSet<AssignmentId>,
    with_frame: bool,
) -> (Layout, Layout) {
    let tb: Vec<&Assignment> = ids.iter().filter_map(|id| before.assignments().get(id)).collect();
    let ta: Vec<&Assignment> = ids.iter().filter_map(|id| after.assignments().get(id)).collect();
    // Cgroups enclosing a touched target, on either side: whoever holds one there is in both.
    let enclosing: BTreeSet<CgroupPath> = tb
        .iter()
        .chain(&ta)
        .filter_map(|a| match &a.target {
            Target::Cgroup(p) => Some(p.ancestors()),
            _ => None,
        })
        .flatten()
        .collect();
    let part = |s: &State, touched: &[&Assignment]| {
        let mut out = if with_frame { frame(s, topo, opts) } else { Layout::new() };
        // A frame key some assignment also targets is that assignment's placement, as in
        // `layout`; an assignment's target enclosing a frame key (a pod cgroup above an unpooled
        // container) is in too, since the frame key's writes may wait on it.
        let cgroups: BTreeSet<CgroupPath> = out
            .keys()
            .filter_map(|k| match k {
                Key::Cgroup(p) => Some(p.ancestors().into_iter().chain([p.clone()])),
                _ => None,
            })
            .flatten()
            .chain(enclosing.iter().cloned())
            .collect();
        for p in cgroups {
            if let Some(h) = s.holder(&Target::Cgroup(p)) {
                insert_target(&mut out, s, topo, opts, h);
            }
        }
        for a in touched {
            insert_target(&mut out, s, topo, opts, a);
        }
        out
    };
    (part(before, &tb), part(after, &ta))
}

/// The pool-level placements of [`layout`]: everything but the assignments' targets.
fn frame(state: &State, topo: &Topology, opts: &LayoutOptions) -> Layout {
    let mut out = Layout::new();
    let pools = || state.pools().values().filter(|p| p.kind != PoolKind::Reserved);
    let all = pools().fold(CpuSet::new(), |acc, p| acc.union(&p.cpus));
    // What each isolated pool's partition holds: its CPUs, less those serving containers when
    // those have partitions of their own.
    let partitioned = |p: &Pool| match opts.partitions {
        Partitions::Pools => p.cpus.clone(),
        Partitions::Containers => p.cpus.difference(&state.usage(&p.name).containers),
        Partitions::Off => CpuSet::new(),
    };
    let isolated = pools().filter(|p| p.isolate).fold(CpuSet::new(), |acc, p| acc.union(&partitioned(p)));
    if let (Ok(top), false) = (CgroupPath::new(TOP_SLICE), all.is_empty()) {
        let mut top_place = Placement::new(all.clone(), topo.nodes_of(&all), Role::Parent);
        if !isolated.is_empty() {
            top_place.partition = Partition::Parent(isolated);
        }
        out.insert(Key::Cgroup(top), top_place);
    }
    for p in pools() {
        let mut place = Placement::new(p.cpus.clone(), topo.nodes_of(&p.cpus), Role::Pool(p.kind));
        let own = partitioned(p);
        if p.isolate && !own.is_empty() {
            place.partition = Partition::Isolated(own);
        }
        out.insert(Key::Cgroup(pool_slice(&p.name)), place);
    }
    let lent = lent_cpus(state, opts);
    if let Some(reserved) = state.pools().values().find(|p| p.kind == PoolKind::Reserved) {
        let host = reserved.cpus.union(&lent);
        for h in &opts.host_cgroups {
            out.insert(
                Key::Cgroup(h.clone()),
                Placement::new(host.clone(), topo.nodes_of(&host), Role::Host),
            );
        }
    }
    if !opts.unpooled.is_empty() {
        let cpus = unpooled_cpus(state, topo, opts);
        for c in &opts.unpooled {
            out.insert(
                Key::Cgroup(c.clone()),
                Placement::new(cpus.clone(), topo.nodes_of(&cpus), Role::Unpooled),
            );
        }
    }
    out
}

/// Idle exclusive CPUs lent to the host cgroups and unpooled containers (`lend_idle`).
fn lent_cpus(state: &State, opts: &LayoutOptions) -> CpuSet {
    let mut lent = CpuSet::new();
    if opts.lend_idle {
        for p in state.pools().values().filter(|p| p.kind == PoolKind::Exclusive && !p.isolate) {
            lent = lent.union(&state.free_cpus(p));
        }
    }
    lent
}

/// Every exclusive pool's CPUs.
pub fn exclusive_cpus(state: &State) -> CpuSet {
    state
        .pools()
        .values()
        .filter(|p| p.kind == PoolKind::Exclusive)
        .fold(CpuSet::new(), |acc, p| acc.union(&p.cpus))
}

/// The CPUs of a container that uses no pool: every online CPU but the exclusive pools', plus
/// those lent while idle.
pub fn unpooled_cpus(state: &State, topo: &Topology, opts: &LayoutOptions) -> CpuSet {
    topo.online().difference(&exclusive_cpus(state)).union(&lent_cpus(state, opts))
}

/// The placement of `a`'s target in the layout of `state` (`None` for a kubelet allocation
/// whose container is not known yet).
pub fn layout_of(state: &State, topo: &Topology, opts: &LayoutOptions, a: &Assignment) -> Option<Placement> {
    let mut out = Layout::new();
    insert_target(&mut out, state, topo, opts, a);
    out.into_values().next()
}

/// Adds `a`'s target to `out`: a container holding CPUs of an isolated pool is an isolated
/// partition of its own where [`Partitions::Containers`].
fn insert_target(out: &mut Layout, state: &State, topo: &Topology, opts: &LayoutOptions, a: &Assignment) {
    let Some(key) = Key::of(&a.target) else { return };
    let role = if a.kind == PoolKind::Exclusive { Role::Exclusive } else { Role::Shared };
    let mut place = Placement::new(a.cpus.clone(), topo.nodes_of(&a.cpus), role);
    let pool = state.pools().get(&a.pool);
    if a.kind == PoolKind::Shared && pool.is_some_and(|p| p.enforce_quota) {
        place.quota = Some(a.millicpus);
    }
    if opts.partitions == Partitions::Containers
        && a.kind == PoolKind::Exclusive
        && pool.is_some_and(|p| p.isolate)
        && matches!(&a.target, Target::Cgroup(_))
        && a.target.outside_pools()
    {
        place.partition = Partition::Isolated(a.cpus.clone());
    }
    out.insert(key, place);
}

/// What of `before` can stay while a change to `after` is being saved: the placements `after`
/// keeps, each shrunk to the CPUs it keeps (unless that is nothing or its role changes, where
/// it stays as it was). Placements `after` drops are left out.
///
/// The engine runs `plan(before, kept)` before it saves the new state and `plan(kept, after)`
/// only once the save is durable. Whenever a crash stops it, every target then holds CPUs only
/// if the state on disk names it (with those CPUs or more): nothing unsaved is half applied, and
/// the reconcile at the next start completes the rest from the saved state.
///
/// A partition that changes, and every one below a parent whose grant changes, is a member in
/// the kept layout (torn down before the save, set up again after it), so no partition is ever
/// set up on CPUs it is about to lose.
pub fn kept(before: &Layout, after: &Layout) -> Layout {
    let mut out: Layout = before
        .iter()
        .filter_map(|(k, old)| {
            let new = after.get(k)?;
            let keep = old.cpus.intersection(&new.cpus);
            let mut p = old.clone();
            if old.role == new.role && !keep.is_empty() {
                p.cpus = keep;
            }
            Some((k.clone(), p))
        })
        .collect();
    for k in torn(before, after) {
        if let Some(p) = out.get_mut(k) {
            p.partition = Partition::Member;
        }
    }
    out
}

/// Each pool's CPUs, for resolving count pools where they are.
pub fn pool_cpus(state: &State) -> BTreeMap<PoolName, CpuSet> {
    state.pools().values().map(|p| (p.name.clone(), p.cpus.clone())).collect()
}

/// Where isolated partitions go: containers' own cgroups where the kernel has
/// `cpuset.cpus.exclusive`; nowhere where it has not, the kubelet's pod cgroup exists
/// (`pods`) and some pool is offered to the kubelet (the `root` partition an older kernel needs
/// above the isolated pools would take every pool's CPUs from the kubelet's containers); the
/// pools' slices otherwise.
pub fn partitions(state: &State, remote: bool, pods: bool) -> Partitions {
    let kubelet = pods && state.pools().values().any(|p| p.offered_to_kubelet());
    match (remote, kubelet) {
        (true, _) => Partitions::Containers,
        (false, true) => Partitions::Off,
        (false, false) => Partitions::Pools,
    }
}

/// Why no isolated pool is a partition ([`Partitions::Off`]), for the log and `pool show`.
pub fn no_partitions_reason(state: &State) -> String {
    let offered: Vec<&str> =
        state.pools().values().filter(|p| p.offered_to_kubelet()).map(|p| p.name.as_str()).collect();
    format!(
        "no isolated partition: this kernel has no cpuset.cpus.exclusive (Linux 6.7), and the root partition \
         it would need above the isolated pools would take the CPUs of pool(s) {} from the kubelet's \
         containers. Interrupts and kernel threads still keep off the isolated CPUs; the scheduler \
         still balances load onto them (boot with isolcpus= for that, or use Linux 6.7 or later)",
        offered.join(", ")
    )
}

#[cfg(test)]
mod tests;
