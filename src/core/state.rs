//! The state the daemon owns: the resolved pools and the assignments made from them.
//!
//! Every mutation is a method that either returns an error and leaves the state untouched, or
//! changes it and says whether anything changed ([`Outcome`]), so callers signal only real
//! changes. Per-pool usage is cached and rebuilt on load, never persisted, so a corrupt cache
//! cannot outlive a restart.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::alloc::{self, PickError};
use super::cpuset::CpuSet;
use super::pool::{Pool, PoolKind, PoolName, Smt};
use super::topology::Topology;

/// Longest assignment id.
pub const MAX_ID: usize = 128;
/// Longest cgroup target path.
pub const MAX_CGROUP_PATH: usize = 4096;
/// Longest systemd unit name (systemd's `UNIT_NAME_MAX` is 256 including the NUL).
pub const MAX_UNIT_NAME: usize = 255;

/// The unit types systemd knows (`unit_type_to_string`).
const UNIT_TYPES: [&str; 11] = [
    "service",
    "socket",
    "target",
    "device",
    "mount",
    "automount",
    "swap",
    "timer",
    "path",
    "slice",
    "scope",
];

/// An assignment id: `[A-Za-z0-9_.:@-]{1,128}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AssignmentId(String);

impl AssignmentId {
    /// Validates an id.
    pub fn new(id: &str) -> Result<Self, Error> {
        let ok = !id.is_empty()
            && id.len() <= MAX_ID
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.:@-".contains(&b));
        if ok {
            Ok(AssignmentId(id.to_owned()))
        } else {
            Err(Error::InvalidArgument {
                arg: "id",
                reason: format!(
                    "`{}` must be 1-{MAX_ID} characters of A-Z a-z 0-9 _ . : @ -",
                    id.escape_debug()
                ),
            })
        }
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for AssignmentId {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        AssignmentId::new(&s)
    }
}

impl From<AssignmentId> for String {
    fn from(i: AssignmentId) -> String {
        i.0
    }
}

impl fmt::Display for AssignmentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A cgroup path relative to the cgroup root. By construction it has no `.`/`..` component, no
/// empty component, no leading `/` and no NUL, so joining it to a root can never leave the root.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CgroupPath(String);

impl CgroupPath {
    /// Validates a path. A single trailing `/` is tolerated and dropped.
    pub fn new(path: &str) -> Result<Self, Error> {
        let bad = |reason: &str| Error::InvalidArgument {
            arg: "target",
            reason: format!("cgroup path `{}` {reason}", path.escape_debug()),
        };
        let p = path.strip_suffix('/').unwrap_or(path);
        if p.is_empty() {
            return Err(bad("is empty (the cgroup root itself cannot be a target)"));
        }
        if p.len() > MAX_CGROUP_PATH {
            return Err(bad("is too long"));
        }
        if p.starts_with('/') {
            return Err(bad("must be relative to the cgroup root (no leading /)"));
        }
        for comp in p.split('/') {
            match comp {
                "" => return Err(bad("has an empty component")),
                "." | ".." => return Err(bad("may not contain . or .. components")),
                _ if comp.bytes().any(|b| b == 0 || b.is_ascii_control()) => {
                    return Err(bad("contains control characters"))
                }
                _ if comp.len() > 255 => return Err(bad("has a component longer than 255 bytes")),
                _ => {}
            }
        }
        Ok(CgroupPath(p.to_owned()))
    }

    /// The path, relative, `/`-separated.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The enclosing cgroups, outermost first, not including `self`.
    pub fn ancestors(&self) -> Vec<CgroupPath> {
        let mut out = Vec::new();
        let mut end = 0;
        while let Some(i) = self.0[end..].find('/') {
            end += i;
            out.push(CgroupPath(self.0[..end].to_owned()));
            end += 1;
        }
        out
    }

    /// Number of components.
    pub fn depth(&self) -> usize {
        self.0.split('/').count()
    }

    /// `self/child`; `child` must be one valid component.
    pub fn join(&self, child: &str) -> Result<CgroupPath, Error> {
        CgroupPath::new(&format!("{}/{child}", self.0))
    }
}

impl TryFrom<String> for CgroupPath {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        CgroupPath::new(&s)
    }
}

impl From<CgroupPath> for String {
    fn from(p: CgroupPath) -> String {
        p.0
    }
}

impl fmt::Display for CgroupPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What an assignment applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Target {
    /// A systemd unit (`unit:foo.service`).
    Unit(String),
    /// A cgroup, relative to the cgroup root (`cgroup:kubepods/pod1/ctr`).
    Cgroup(CgroupPath),
    /// A process (`pid:1234`).
    Pid(u32),
    /// CPUs the kubelet allocated to a container not known yet (`kubelet:cpu-3`), named by the
    /// first device id of the allocation. It has no placement on the host: the CPUs are held
    /// until the device plugin retargets the assignment to the container's cgroup.
    Kubelet(String),
}

/// Longest device id (the device plugin API's limit).
pub const MAX_DEVICE_ID: usize = 63;

impl Target {
    /// Parses `unit:NAME`, `cgroup:PATH`, `pid:N` or `kubelet:DEVICE`.
    pub fn parse(s: &str) -> Result<Self, Error> {
        let bad = |reason: String| Error::InvalidArgument { arg: "target", reason };
        let Some((kind, rest)) = s.split_once(':') else {
            return Err(bad(format!("`{}` must be unit:NAME, cgroup:PATH or pid:N", s.escape_debug())));
        };
        match kind {
            "unit" => {
                // systemd's unit_name_is_valid(): NAME.TYPE with a non-empty NAME and a known
                // TYPE, so `..`, `.service` or `x.` never reach a backend that builds a path or
                // a bus call from the name.
                let typed = rest.rsplit_once('.').is_some_and(|(name, kind)| {
                    !name.is_empty() && !name.starts_with('.') && UNIT_TYPES.contains(&kind)
                });
                let ok = typed
                    && rest.len() <= MAX_UNIT_NAME
                    && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b":-_.\\@".contains(&b));
                if ok {
                    Ok(Target::Unit(rest.to_owned()))
                } else {
                    Err(bad(format!("`{}` is not a valid systemd unit name", rest.escape_debug())))
                }
            }
            "cgroup" => Ok(Target::Cgroup(CgroupPath::new(rest)?)),
            "pid" => match rest.parse::<u32>() {
                Ok(pid) if pid > 0 && pid <= 4_194_304 => Ok(Target::Pid(pid)),
                _ => Err(bad(format!("`{}` is not a process id (1-4194304)", rest.escape_debug()))),
            },
            "kubelet" => {
                let ok = !rest.is_empty()
                    && rest.len() <= MAX_DEVICE_ID
                    && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
                if ok {
                    Ok(Target::Kubelet(rest.to_owned()))
                } else {
                    Err(bad(format!(
                        "`{}` is not a device id (1-{MAX_DEVICE_ID} characters of A-Z a-z 0-9 _ . -)",
                        rest.escape_debug()
                    )))
                }
            }
            other => Err(bad(format!(
                "unknown target kind `{}` (use unit:, cgroup: or pid:)",
                other.escape_debug()
            ))),
        }
    }
}

impl TryFrom<String> for Target {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        Target::parse(&s)
    }
}

impl From<Target> for String {
    fn from(t: Target) -> String {
        t.to_string()
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Unit(u) => write!(f, "unit:{u}"),
            Target::Cgroup(p) => write!(f, "cgroup:{p}"),
            Target::Pid(p) => write!(f, "pid:{p}"),
            Target::Kubelet(d) => write!(f, "kubelet:{d}"),
        }
    }
}

/// How much an assignment asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Size {
    /// Whole CPUs.
    Cpus(u32),
    /// Thousandths of a CPU (shared pools only, or whole thousands).
    Millicpus(u64),
    /// Exactly these CPUs (exclusive pools): what the kubelet allocated by device id.
    Cpuset(CpuSet),
}

/// A request for CPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignSpec {
    /// The pool to take from.
    pub pool: String,
    /// What the CPUs are for.
    pub target: Target,
    /// How much.
    pub size: Size,
    /// The caller's id for idempotent retries; one is made up when absent.
    pub id: Option<AssignmentId>,
    /// Release it when the target goes away (the default).
    pub reclaim: bool,
    /// Pid targets: when the process started (the engine fills it in from the host).
    pub process_start: Option<u64>,
}

impl AssignSpec {
    /// A spec with the defaults: reclaimed when the target goes away.
    pub fn new(pool: impl Into<String>, target: Target, size: Size, id: Option<AssignmentId>) -> AssignSpec {
        AssignSpec { pool: pool.into(), target, size, id, reclaim: true, process_start: None }
    }
}

fn yes() -> bool {
    true
}

/// CPUs given to a target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// Its id.
    pub id: AssignmentId,
    /// The pool it came from.
    pub pool: PoolName,
    /// The pool's kind when it was made.
    pub kind: PoolKind,
    /// What it applies to.
    pub target: Target,
    /// The CPUs the target may run on (exclusive: owned; shared: the pool's CPUs).
    pub cpus: CpuSet,
    /// Capacity it holds, in millicpus (exclusive: 1000 per CPU).
    pub millicpus: u64,
    /// Released when its target goes away: the unit stops, the process exits, the cgroup is
    /// removed.
    #[serde(default = "yes")]
    pub reclaim: bool,
    /// Pid targets: when the process started (clock ticks since boot), so that a pid the kernel
    /// reuses is never taken for the assigned process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_start: Option<u64>,
    /// Kubelet assignments: the container holding the devices, once the kubelet has said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<Container>,
}

/// A Kubernetes container, as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name in the pod.
    pub name: String,
}

impl fmt::Display for Container {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.pod, self.name)
    }
}

/// Whether a mutation changed anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The state already was as asked (an idempotent repeat).
    Identity(T),
    /// The state changed.
    Changed(T),
}

impl<T> Outcome<T> {
    /// The value, changed or not.
    pub fn into_inner(self) -> T {
        match self {
            Outcome::Identity(t) | Outcome::Changed(t) => t,
        }
    }
    /// Whether the state changed.
    pub fn changed(&self) -> bool {
        matches!(self, Outcome::Changed(_))
    }
}

/// Errors of state operations. The API maps each variant to its own D-Bus / varlink error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No such pool.
    #[error("pool `{pool}` does not exist")]
    NoSuchPool {
        /// The name asked for.
        pool: String,
    },
    /// A pool of that name exists already.
    #[error("pool `{pool}` already exists")]
    PoolExists {
        /// The name.
        pool: String,
    },
    /// The pool still has assignments.
    #[error("pool `{pool}` has {assignments} assignments; release them first")]
    PoolInUse {
        /// The pool.
        pool: String,
        /// How many.
        assignments: usize,
    },
    /// No such assignment.
    #[error("assignment `{id}` does not exist")]
    NoSuchAssignment {
        /// The id asked for.
        id: String,
    },
    /// The pool has not enough free capacity.
    #[error("pool `{pool}` has {free} {unit} free, {requested} requested")]
    InsufficientCapacity {
        /// The pool.
        pool: String,
        /// Amount asked for.
        requested: u64,
        /// Amount free.
        free: u64,
        /// `cpus` or `millicpus`.
        unit: &'static str,
    },
    /// The id is taken by an assignment with another spec.
    #[error("assignment `{id}` already exists with a different pool, target or size")]
    DuplicateId {
        /// The id.
        id: String,
    },
    /// The target already holds an assignment (a target has one cpuset).
    #[error("target `{target}` already holds assignment `{id}` from pool `{pool}`; release it first")]
    TargetBusy {
        /// The target.
        target: String,
        /// Its assignment.
        id: String,
        /// The pool.
        pool: String,
    },
    /// An argument is malformed or not allowed here.
    #[error("invalid {arg}: {reason}")]
    InvalidArgument {
        /// The argument's name.
        arg: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The target is one the pools depend on (a host slice, cpupoold's own slices, their
    /// ancestors) or overlaps another assignment's target: confining it would defeat the pools.
    #[error("target `{target}` cannot be assigned: {reason}")]
    TargetNotAllowed {
        /// The target.
        target: String,
        /// Why, and what to do instead.
        reason: String,
    },
    /// The kernel would not give the target the assigned CPUs: it sits in a cgroup whose
    /// effective CPUs lack them (outside the pool's slice, or below a parent confined
    /// elsewhere). Nothing stays booked.
    #[error(
        "target `{target}` cannot run on CPUs {cpus}: it sits in `{parent}`, whose effective CPUs are {}; {hint}",
        if parent_cpus.is_empty() { "none" } else { parent_cpus.as_str() }
    )]
    TargetOutsidePool {
        /// The target.
        target: String,
        /// The CPUs it would get.
        cpus: String,
        /// The cgroup (or slice) it sits in.
        parent: String,
        /// That cgroup's effective CPUs, as the kernel reports them.
        parent_cpus: String,
        /// What to do instead.
        hint: String,
    },
    /// The reserved pool is not handed out.
    #[error("pool `{pool}` is the reserved pool; it is not assigned from")]
    ReservedPool {
        /// The pool.
        pool: String,
    },
    /// A full-cores pool cannot give exactly the number asked for.
    #[error("pool `{pool}` hands out whole cores: {requested} CPUs is not a whole number of free cores")]
    NotWholeCores {
        /// The pool.
        pool: String,
        /// CPUs asked for.
        requested: u64,
    },
}

/// Usage of one pool, derived from the assignments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPUs owned by exclusive assignments.
    pub taken: CpuSet,
    /// Millicpus held.
    pub millicpus: u64,
    /// Number of assignments.
    pub count: usize,
}

/// Pools and assignments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "StateData", into = "StateData")]
pub struct State {
    data: StateData,
    usage: BTreeMap<PoolName, Usage>,
}

/// The persisted part of [`State`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct StateData {
    /// Pools by name.
    pub pools: BTreeMap<PoolName, Pool>,
    /// Assignments by id.
    pub assignments: BTreeMap<AssignmentId, Assignment>,
    /// Counter for made-up ids.
    pub next_id: u64,
}

impl From<StateData> for State {
    fn from(data: StateData) -> Self {
        let mut s = State { data, usage: BTreeMap::new() };
        s.rebuild_usage();
        s
    }
}

impl From<State> for StateData {
    fn from(s: State) -> Self {
        s.data
    }
}

impl Default for State {
    fn default() -> Self {
        State::from(StateData::default())
    }
}

impl State {
    /// A state with `pools` and no assignment.
    pub fn with_pools(pools: Vec<Pool>) -> Self {
        State::from(StateData {
            pools: pools.into_iter().map(|p| (p.name.clone(), p)).collect(),
            ..StateData::default()
        })
    }

    fn rebuild_usage(&mut self) {
        self.usage = self.data.pools.keys().map(|n| (n.clone(), Usage::default())).collect();
        let assignments: Vec<Assignment> = self.data.assignments.values().cloned().collect();
        for a in &assignments {
            self.add_usage(a);
        }
    }

    fn add_usage(&mut self, a: &Assignment) {
        let exclusive = a.kind == PoolKind::Exclusive;
        let u = self.usage.entry(a.pool.clone()).or_default();
        if exclusive {
            u.taken = u.taken.union(&a.cpus);
        }
        u.millicpus += a.millicpus;
        u.count += 1;
    }

    fn remove_usage(&mut self, a: &Assignment) {
        let exclusive = a.kind == PoolKind::Exclusive;
        if let Some(u) = self.usage.get_mut(&a.pool) {
            if exclusive {
                u.taken = u.taken.difference(&a.cpus);
            }
            u.millicpus = u.millicpus.saturating_sub(a.millicpus);
            u.count = u.count.saturating_sub(1);
        }
    }

    /// The persisted data.
    pub fn data(&self) -> &StateData {
        &self.data
    }

    /// Pools by name.
    pub fn pools(&self) -> &BTreeMap<PoolName, Pool> {
        &self.data.pools
    }

    /// Assignments by id.
    pub fn assignments(&self) -> &BTreeMap<AssignmentId, Assignment> {
        &self.data.assignments
    }

    /// A pool's usage.
    pub fn usage(&self, pool: &PoolName) -> Usage {
        self.usage.get(pool).cloned().unwrap_or_default()
    }

    /// A pool's free CPUs: for exclusive pools the CPUs no assignment owns, for the others
    /// all of them (shared capacity is counted in millicpus).
    pub fn free_cpus(&self, pool: &Pool) -> CpuSet {
        pool.cpus.difference(&self.usage(&pool.name).taken)
    }

    /// A pool's free millicpus.
    pub fn free_millis(&self, pool: &Pool) -> u64 {
        match pool.kind {
            PoolKind::Exclusive => self.free_cpus(pool).len() as u64 * 1000,
            _ => pool.capacity_millis().saturating_sub(self.usage(&pool.name).millicpus),
        }
    }

    /// A pool by name.
    pub fn pool(&self, name: &str) -> Result<&Pool, Error> {
        PoolName::new(name)
            .ok()
            .and_then(|n| self.data.pools.get(&n))
            .ok_or_else(|| Error::NoSuchPool { pool: name.to_owned() })
    }

    /// Assigns CPUs. Repeating a request with the same id and spec returns the existing
    /// assignment unchanged.
    pub fn assign(&mut self, topo: &Topology, spec: &AssignSpec) -> Result<Outcome<Assignment>, Error> {
        let pool = self.pool(&spec.pool)?.clone();
        if let Some(id) = &spec.id {
            if let Some(existing) = self.data.assignments.get(id) {
                let same_size = match (pool.kind, &spec.size) {
                    (PoolKind::Exclusive, Size::Cpus(n)) => existing.cpus.len() as u64 == u64::from(*n),
                    (_, Size::Cpuset(set)) => existing.cpus == *set,
                    (_, Size::Cpus(n)) => existing.millicpus == u64::from(*n) * 1000,
                    (_, Size::Millicpus(m)) => existing.millicpus == *m,
                };
                if existing.pool == pool.name && existing.target == spec.target && same_size {
                    return Ok(Outcome::Identity(existing.clone()));
                }
                return Err(Error::DuplicateId { id: id.to_string() });
            }
        }
        // A target has one cpuset: it can hold one assignment, from whichever pool.
        if let Some(a) = self.data.assignments.values().find(|a| a.target == spec.target) {
            return Err(Error::TargetBusy {
                target: spec.target.to_string(),
                id: a.id.to_string(),
                // The pool of the assignment that holds it, which says where to release it.
                pool: a.pool.to_string(),
            });
        }
        let (cpus, millicpus) = match pool.kind {
            PoolKind::Reserved => return Err(Error::ReservedPool { pool: pool.name.to_string() }),
            PoolKind::Exclusive => {
                let cpus = match &spec.size {
                    Size::Cpuset(want) => self.exact(topo, &pool, want)?,
                    Size::Cpus(n) => self.pick_whole(topo, &pool, u64::from(*n))?,
                    Size::Millicpus(m) if m % 1000 == 0 => self.pick_whole(topo, &pool, m / 1000)?,
                    Size::Millicpus(m) => {
                        return Err(Error::InvalidArgument {
                            arg: "millicpus",
                            reason: format!(
                                "pool `{}` is exclusive and hands out whole CPUs; {m} is not a multiple of 1000 (use cpus)",
                                pool.name
                            ),
                        })
                    }
                };
                let n = cpus.len() as u64;
                (cpus, n * 1000)
            }
            PoolKind::Shared => {
                let m = match spec.size {
                    Size::Cpus(n) => u64::from(n) * 1000,
                    Size::Millicpus(m) => m,
                    Size::Cpuset(_) => {
                        return Err(Error::InvalidArgument {
                            arg: "cpus",
                            reason: format!(
                                "pool `{}` is shared: its assignments take millicpus, not chosen CPUs",
                                pool.name
                            ),
                        })
                    }
                };
                if m == 0 {
                    let arg = if matches!(spec.size, Size::Cpus(_)) { "cpus" } else { "millicpus" };
                    return Err(Error::InvalidArgument { arg, reason: "must be at least 1".into() });
                }
                let free = self.free_millis(&pool);
                if m > free {
                    return Err(Error::InsufficientCapacity {
                        pool: pool.name.to_string(),
                        requested: m,
                        free,
                        unit: "millicpus",
                    });
                }
                (pool.cpus.clone(), m)
            }
        };
        let id = match &spec.id {
            Some(id) => id.clone(),
            None => loop {
                self.data.next_id += 1;
                let id = AssignmentId(format!("a{}", self.data.next_id));
                if !self.data.assignments.contains_key(&id) {
                    break id;
                }
            },
        };
        let a = Assignment {
            id: id.clone(),
            pool: pool.name.clone(),
            kind: pool.kind,
            target: spec.target.clone(),
            cpus,
            millicpus,
            reclaim: spec.reclaim,
            process_start: spec.process_start,
            container: None,
        };
        self.add_usage(&a);
        self.data.assignments.insert(id, a.clone());
        Ok(Outcome::Changed(a))
    }

    /// Checks that `want` can be owned whole by a new assignment of the exclusive `pool`.
    /// `n` free CPUs of exclusive `pool`, chosen by the allocator.
    fn pick_whole(&self, topo: &Topology, pool: &Pool, n: u64) -> Result<CpuSet, Error> {
        if n == 0 {
            return Err(Error::InvalidArgument { arg: "cpus", reason: "must be at least 1".into() });
        }
        let free = self.free_cpus(pool);
        alloc::pick(topo, &free, &CpuSet::new(), n as usize, pool.smt).map_err(|e| match e {
            PickError::Insufficient { available, .. } => Error::InsufficientCapacity {
                pool: pool.name.to_string(),
                requested: n,
                free: available as u64,
                unit: "cpus",
            },
            PickError::NotWholeCores { .. } => {
                Error::NotWholeCores { pool: pool.name.to_string(), requested: n }
            }
        })
    }

    fn exact(&self, topo: &Topology, pool: &Pool, want: &CpuSet) -> Result<CpuSet, Error> {
        let bad = |reason: String| Error::InvalidArgument { arg: "cpus", reason };
        if want.is_empty() {
            return Err(bad("must name at least one CPU".into()));
        }
        let outside = want.difference(&pool.cpus);
        if !outside.is_empty() {
            return Err(bad(format!("CPUs {outside} are not in pool `{}`", pool.name)));
        }
        let taken = want.difference(&self.free_cpus(pool));
        if !taken.is_empty() {
            let holder = self
                .data
                .assignments
                .values()
                .find(|a| a.pool == pool.name && !a.cpus.is_disjoint(&taken))
                .map(|a| a.id.to_string())
                .unwrap_or_default();
            return Err(bad(format!("CPUs {taken} are held by assignment `{holder}`")));
        }
        if pool.smt == Smt::FullCores && !topo.is_whole_cores(want) {
            return Err(Error::NotWholeCores { pool: pool.name.to_string(), requested: want.len() as u64 });
        }
        Ok(want.clone())
    }

    /// Points an assignment at another target, keeping its CPUs, and records the container it
    /// serves: the device plugin moves a kubelet allocation to its container's cgroup once the
    /// container is known.
    pub fn retarget(
        &mut self,
        id: &str,
        target: Target,
        container: Option<Container>,
    ) -> Result<Outcome<Assignment>, Error> {
        let key = AssignmentId::new(id).map_err(|_| Error::NoSuchAssignment { id: id.to_owned() })?;
        let Some(current) = self.data.assignments.get(&key) else {
            return Err(Error::NoSuchAssignment { id: id.to_owned() });
        };
        if current.target == target && current.container == container {
            return Ok(Outcome::Identity(current.clone()));
        }
        if let Some(other) = self.data.assignments.values().find(|a| a.target == target && a.id != key) {
            return Err(Error::TargetBusy {
                target: target.to_string(),
                id: other.id.to_string(),
                pool: other.pool.to_string(),
            });
        }
        let Some(a) = self.data.assignments.get_mut(&key) else {
            return Err(Error::NoSuchAssignment { id: id.to_owned() });
        };
        a.target = target;
        a.container = container;
        Ok(Outcome::Changed(a.clone()))
    }

    /// Releases an assignment, returning what it held.
    pub fn release(&mut self, id: &str) -> Result<Assignment, Error> {
        let key = AssignmentId::new(id).map_err(|_| Error::NoSuchAssignment { id: id.to_owned() })?;
        let a = self
            .data
            .assignments
            .remove(&key)
            .ok_or_else(|| Error::NoSuchAssignment { id: id.to_owned() })?;
        self.remove_usage(&a);
        Ok(a)
    }

    /// Replaces the pools (a config reload). Assignments must still fit: each one's pool must
    /// exist with the same kind and still contain its CPUs. Returns the assignments that do not
    /// fit, without changing anything, when there are any.
    pub fn set_pools(&mut self, pools: Vec<Pool>) -> Result<(), Vec<Misfit>> {
        let new: BTreeMap<PoolName, Pool> = pools.into_iter().map(|p| (p.name.clone(), p)).collect();
        let misfits = misfits(&new, self.data.assignments.values());
        if !misfits.is_empty() {
            return Err(misfits);
        }
        self.data.pools = new;
        // Shared assignments see the whole pool: follow its new CPUs.
        for a in self.data.assignments.values_mut() {
            if let Some(p) = self.data.pools.get(&a.pool) {
                if p.kind == PoolKind::Shared {
                    a.cpus = p.cpus.clone();
                }
            }
        }
        self.rebuild_usage();
        Ok(())
    }
}

/// Cgroups whose confinement would defeat the pools: the host slices, systemd's own scope and
/// cpupoold's parent slice. Their ancestors count too.
const PROTECTED_CGROUPS: [&str; 4] = ["system.slice", "user.slice", "init.scope", "cpupool.slice"];

/// The cgroup path systemd gives slice unit `name` (`a-b.slice` is `a.slice/a-b.slice`);
/// `None` for `-.slice` (the root) and for units that are not slices, whose place depends on
/// their `Slice=` setting.
pub fn slice_cgroup(name: &str) -> Option<CgroupPath> {
    let stem = name.strip_suffix(".slice")?;
    if stem == "-" || stem.is_empty() {
        return None;
    }
    let mut parts = Vec::new();
    let mut end = 0;
    while let Some(i) = stem[end..].find('-') {
        end += i;
        parts.push(format!("{}.slice", &stem[..end]));
        end += 1;
    }
    parts.push(name.to_owned());
    CgroupPath::new(&parts.join("/")).ok()
}

/// Whether `a` is `b` or lies below it.
fn within(a: &CgroupPath, b: &CgroupPath) -> bool {
    a == b || a.as_str().strip_prefix(b.as_str()).is_some_and(|rest| rest.starts_with('/'))
}

/// Refuses targets that would defeat the pools, before anything is booked: cpupoold's own
/// slices, the host slices (`system.slice`, `user.slice`, `init.scope`, `-.slice` and the
/// configured `host_cgroups`) and their ancestors, and a cgroup nested inside (or containing)
/// another assignment's target, whose CPUs the kernel would then decide, not the pool.
pub fn check_target<'a>(
    target: &Target,
    host_cgroups: &[CgroupPath],
    others: impl Iterator<Item = &'a Assignment>,
) -> Result<(), Error> {
    let refuse = |reason: String| Err(Error::TargetNotAllowed { target: target.to_string(), reason });
    let path = match target {
        Target::Cgroup(p) => Some(p.clone()),
        Target::Unit(u) if u == "-.slice" => {
            return refuse("`-.slice` is the root of every cgroup: use a pool's slice or a unit in it".into())
        }
        Target::Unit(u) => slice_cgroup(u).or_else(|| {
            // Scopes and services named like a protected cgroup's last component (init.scope).
            PROTECTED_CGROUPS.iter().find(|p| *p == u).and_then(|p| CgroupPath::new(p).ok())
        }),
        Target::Pid(_) | Target::Kubelet(_) => None,
    };
    let Some(path) = path else { return Ok(()) };
    let top = CgroupPath(PROTECTED_CGROUPS[3].to_owned());
    // cpupool.slice itself, or a pool slice directly below it.
    let pool_slice = path.ancestors().last() == Some(&top)
        && path.as_str().rsplit('/').next().is_some_and(|n| n.starts_with("cpupool-"));
    if path == top || pool_slice {
        return refuse(format!(
            "`{path}` is a slice cpupoold manages for its pools; assign a unit or cgroup inside a pool's slice instead"
        ));
    }
    let protected =
        PROTECTED_CGROUPS.iter().filter_map(|p| CgroupPath::new(p).ok()).chain(host_cgroups.iter().cloned());
    for p in protected {
        if within(&p, &path) {
            let what = if p == path { "is" } else { "holds" };
            return refuse(format!(
                "`{path}` {what} `{p}`, which the reserved pool confines for the host's own processes; assign a unit or cgroup inside a pool's slice instead (e.g. `systemd-run --slice=cpupool-POOL.slice`, or `cpupoolctl run`)"
            ));
        }
    }
    for a in others {
        let other = match &a.target {
            Target::Cgroup(p) => Some(p.clone()),
            Target::Unit(u) => slice_cgroup(u),
            _ => None,
        };
        let Some(other) = other else { continue };
        if within(&path, &other) || within(&other, &path) {
            let how = if within(&path, &other) { "lies inside" } else { "contains" };
            return refuse(format!(
                "`{path}` {how} `{other}`, the target of assignment `{}` (pool `{}`): the kernel would confine one by the other's CPUs",
                a.id, a.pool
            ));
        }
    }
    Ok(())
}

/// One value of every [`Error`] variant: the API tests check that each maps to its own
/// documented error, so a new variant goes here once.
#[cfg(test)]
pub(crate) fn every_error() -> Vec<Error> {
    vec![
        Error::NoSuchPool { pool: "p".into() },
        Error::NoSuchAssignment { id: "a".into() },
        Error::InsufficientCapacity { pool: "p".into(), requested: 3, free: 2, unit: "cpus" },
        Error::DuplicateId { id: "a".into() },
        Error::TargetBusy { target: "pid:1".into(), id: "a".into(), pool: "p".into() },
        Error::TargetNotAllowed { target: "unit:system.slice".into(), reason: "r".into() },
        Error::TargetOutsidePool {
            target: "cgroup:w/a".into(),
            cpus: "2".into(),
            parent: "w".into(),
            parent_cpus: "0-1".into(),
            hint: "h".into(),
        },
        Error::InvalidArgument { arg: "cpus", reason: "r".into() },
        Error::ReservedPool { pool: "p".into() },
        Error::NotWholeCores { pool: "p".into(), requested: 3 },
        Error::PoolExists { pool: "p".into() },
        Error::PoolInUse { pool: "p".into(), assignments: 1 },
    ]
}

/// An assignment that no longer fits the configured pools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Misfit {
    /// The assignment.
    pub id: AssignmentId,
    /// Its pool.
    pub pool: PoolName,
    /// Why it no longer fits.
    pub reason: String,
}

impl fmt::Display for Misfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "assignment `{}` (pool `{}`): {}", self.id, self.pool, self.reason)
    }
}

/// The assignments that do not fit `pools`.
pub fn misfits<'a>(
    pools: &BTreeMap<PoolName, Pool>,
    assignments: impl Iterator<Item = &'a Assignment>,
) -> Vec<Misfit> {
    let mut out = Vec::new();
    let mut shared_use: BTreeMap<&PoolName, u64> = BTreeMap::new();
    for a in assignments {
        let misfit = |reason: String| Misfit { id: a.id.clone(), pool: a.pool.clone(), reason };
        match pools.get(&a.pool) {
            None => out.push(misfit("its pool no longer exists".into())),
            Some(p) if p.kind != a.kind => {
                out.push(misfit(format!("the pool changed kind from {} to {}", a.kind, p.kind)))
            }
            Some(p) if p.kind == PoolKind::Exclusive => {
                let lost = a.cpus.difference(&p.cpus);
                if !lost.is_empty() {
                    out.push(misfit(format!("the pool no longer contains its CPUs {lost}")));
                }
            }
            Some(p) => *shared_use.entry(&p.name).or_default() += a.millicpus,
        }
    }
    for (name, used) in shared_use {
        if let Some(p) = pools.get(name) {
            if used > p.capacity_millis() {
                out.push(Misfit {
                    id: AssignmentId("*".into()),
                    pool: name.clone(),
                    reason: format!(
                        "assignments hold {used} millicpus but the pool would only have {}",
                        p.capacity_millis()
                    ),
                });
            }
        }
    }
    out
}

/// A way a state breaks the rules that every state [`State`]'s methods make keeps. A state file
/// can hold one when it was edited by hand or written by a faulty release: its checksum proves
/// only that it is the file that was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// An assignment is filed under another id than its own.
    MisfiledAssignment {
        /// The id it is filed under.
        key: AssignmentId,
        /// Its own id.
        id: AssignmentId,
    },
    /// A pool is filed under another name than its own.
    MisfiledPool {
        /// The name it is filed under.
        key: PoolName,
        /// Its own name.
        name: PoolName,
    },
    /// Two pools have CPUs in common.
    PoolsOverlap {
        /// One pool.
        pool: PoolName,
        /// The other.
        other: PoolName,
        /// The CPUs both have.
        cpus: CpuSet,
    },
    /// An assignment names a pool the state does not have.
    UnknownPool {
        /// The assignment.
        id: AssignmentId,
        /// The pool it names.
        pool: PoolName,
    },
    /// An assignment's kind is not its pool's.
    KindMismatch {
        /// The assignment.
        id: AssignmentId,
        /// Its pool.
        pool: PoolName,
        /// The assignment's kind.
        kind: PoolKind,
        /// The pool's kind.
        pool_kind: PoolKind,
    },
    /// An assignment takes from the reserved pool, which is not assigned from.
    FromReserved {
        /// The assignment.
        id: AssignmentId,
        /// The reserved pool.
        pool: PoolName,
    },
    /// An assignment holds CPUs its pool does not have.
    OutsidePool {
        /// The assignment.
        id: AssignmentId,
        /// Its pool.
        pool: PoolName,
        /// The CPUs outside the pool.
        cpus: CpuSet,
    },
    /// An assignment holds nothing: no CPU, or no capacity.
    Empty {
        /// The assignment.
        id: AssignmentId,
    },
    /// An exclusive assignment's capacity is not 1000 millicpus per CPU it owns.
    CapacityMismatch {
        /// The assignment.
        id: AssignmentId,
        /// The capacity it records.
        millicpus: u64,
        /// The CPUs it owns.
        cpus: u64,
    },
    /// Two exclusive assignments own the same CPUs.
    OwnedTwice {
        /// One assignment.
        id: AssignmentId,
        /// The other.
        other: AssignmentId,
        /// The CPUs both own.
        cpus: CpuSet,
    },
    /// A shared pool's assignments hold more than the pool has.
    Overcommitted {
        /// The pool.
        pool: PoolName,
        /// Its capacity, in millicpus.
        capacity: u64,
        /// What its assignments hold, in millicpus.
        held: u64,
        /// Its assignments.
        ids: Vec<AssignmentId>,
    },
    /// Two assignments apply to one target (a target has one cpuset).
    TargetTwice {
        /// One assignment.
        id: AssignmentId,
        /// The other.
        other: AssignmentId,
        /// The target.
        target: Target,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::MisfiledAssignment { key, id } => {
                write!(f, "the assignment filed as `{key}` has the id `{id}`")
            }
            Violation::MisfiledPool { key, name } => write!(f, "the pool filed as `{key}` is named `{name}`"),
            Violation::PoolsOverlap { pool, other, cpus } => {
                write!(f, "pools `{pool}` and `{other}` both have CPUs {cpus}")
            }
            Violation::UnknownPool { id, pool } => {
                write!(f, "assignment `{id}` is from pool `{pool}`, which the state does not have")
            }
            Violation::KindMismatch { id, pool, kind, pool_kind } => {
                write!(f, "assignment `{id}` is {kind} but its pool `{pool}` is {pool_kind}")
            }
            Violation::FromReserved { id, pool } => {
                write!(f, "assignment `{id}` takes from the reserved pool `{pool}`")
            }
            Violation::OutsidePool { id, pool, cpus } => {
                write!(f, "assignment `{id}` holds CPUs {cpus}, which its pool `{pool}` does not have")
            }
            Violation::Empty { id } => write!(f, "assignment `{id}` holds no CPU or no capacity"),
            Violation::CapacityMismatch { id, millicpus, cpus } => {
                write!(f, "assignment `{id}` owns {cpus} CPUs but counts {millicpus} millicpus")
            }
            Violation::OwnedTwice { id, other, cpus } => {
                write!(f, "assignments `{id}` and `{other}` both own CPUs {cpus}")
            }
            Violation::Overcommitted { pool, capacity, held, ids } => {
                let ids: Vec<String> = ids.iter().map(|i| format!("`{i}`")).collect();
                write!(
                    f,
                    "shared pool `{pool}` has {capacity} millicpus but its assignments {} hold {held}",
                    ids.join(", ")
                )
            }
            Violation::TargetTwice { id, other, target } => {
                write!(f, "assignments `{id}` and `{other}` both apply to `{target}`")
            }
        }
    }
}

impl StateData {
    /// Checks the rules every state made by [`State`]'s methods keeps (the property tests hold
    /// every state to them): pools are disjoint; each assignment is from a pool the state has,
    /// of the pool's kind and not the reserved one, within the pool's CPUs, and holds something;
    /// exclusive assignments count 1000 millicpus per CPU and no CPU is owned twice; no shared
    /// pool's assignments hold more than the pool has; no target has two assignments.
    ///
    /// Whole cores in full-cores pools depend on the topology and are not checked here.
    pub fn validate(&self) -> Result<(), Vec<Violation>> {
        let mut out = Vec::new();
        let pools: Vec<&Pool> = self.pools.values().collect();
        for (key, p) in &self.pools {
            if *key != p.name {
                out.push(Violation::MisfiledPool { key: key.clone(), name: p.name.clone() });
            }
        }
        for (i, p) in pools.iter().enumerate() {
            for q in &pools[i + 1..] {
                let both = p.cpus.intersection(&q.cpus);
                if !both.is_empty() {
                    out.push(Violation::PoolsOverlap {
                        pool: p.name.clone(),
                        other: q.name.clone(),
                        cpus: both,
                    });
                }
            }
        }
        let mut owners: Vec<&Assignment> = Vec::new();
        let mut targets: BTreeMap<&Target, &AssignmentId> = BTreeMap::new();
        let mut shared: BTreeMap<&PoolName, (u64, Vec<AssignmentId>)> = BTreeMap::new();
        for (key, a) in &self.assignments {
            let id = || a.id.clone();
            if *key != a.id {
                out.push(Violation::MisfiledAssignment { key: key.clone(), id: id() });
            }
            if let Some(other) = targets.insert(&a.target, &a.id) {
                out.push(Violation::TargetTwice { id: other.clone(), other: id(), target: a.target.clone() });
            }
            let Some(p) = self.pools.get(&a.pool) else {
                out.push(Violation::UnknownPool { id: id(), pool: a.pool.clone() });
                continue;
            };
            if p.kind != a.kind {
                out.push(Violation::KindMismatch {
                    id: id(),
                    pool: p.name.clone(),
                    kind: a.kind,
                    pool_kind: p.kind,
                });
            }
            if p.kind == PoolKind::Reserved || a.kind == PoolKind::Reserved {
                out.push(Violation::FromReserved { id: id(), pool: p.name.clone() });
            }
            let outside = a.cpus.difference(&p.cpus);
            if !outside.is_empty() {
                out.push(Violation::OutsidePool { id: id(), pool: p.name.clone(), cpus: outside });
            }
            if a.cpus.is_empty() || a.millicpus == 0 {
                out.push(Violation::Empty { id: id() });
            }
            match a.kind {
                PoolKind::Exclusive => {
                    let cpus = a.cpus.len() as u64;
                    if a.millicpus != cpus * 1000 {
                        out.push(Violation::CapacityMismatch { id: id(), millicpus: a.millicpus, cpus });
                    }
                    for other in &owners {
                        let both = other.cpus.intersection(&a.cpus);
                        if !both.is_empty() {
                            out.push(Violation::OwnedTwice { id: other.id.clone(), other: id(), cpus: both });
                        }
                    }
                    owners.push(a);
                }
                PoolKind::Shared => {
                    let entry = shared.entry(&p.name).or_default();
                    entry.0 = entry.0.saturating_add(a.millicpus);
                    entry.1.push(id());
                }
                PoolKind::Reserved => {}
            }
        }
        for (name, (held, ids)) in shared {
            let Some(p) = self.pools.get(name) else { continue };
            if held > p.capacity_millis() {
                out.push(Violation::Overcommitted {
                    pool: name.clone(),
                    capacity: p.capacity_millis(),
                    held,
                    ids,
                });
            }
        }
        if out.is_empty() {
            Ok(())
        } else {
            Err(out)
        }
    }
}

impl State {
    /// [`StateData::validate`] on this state.
    pub fn check(&self) -> Result<(), Vec<Violation>> {
        self.data.validate()
    }
}

#[cfg(test)]
mod tests;
