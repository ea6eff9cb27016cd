//! Devices: what each pool looks like to the kubelet, and the decoding of device ids back into
//! CPUs. Pure: it reads a state and a topology, does no I/O and decides nothing the engine has
//! not; the kubelet wing (the daemon's `kubernetes::deviceplugin`) encodes what it returns as gRPC messages.
//!
//! Device ids are derived from the topology alone, so they are the same after every restart:
//!
//! - exclusive pool, `smt = "threads"`: one device per logical CPU, `cpu-<N>`;
//! - exclusive pool, `smt = "full-cores"`: one device per core, `core-<N>` (N: the core's
//!   lowest-numbered thread), covering all its threads;
//! - shared pool: one device per `kubelet.millicpus_per_device` millicpus of capacity,
//!   `milli-<pool>-<NNNNN>` (index from 0).
//!
//! A device is `Unhealthy` while a CPU of it is held by an assignment that is not the kubelet's
//! (made over varlink or D-Bus); for shared pools, that many units of capacity, counted from the
//! highest index, skipping units the kubelet holds.

use std::collections::{BTreeMap, BTreeSet};

use crate::alloc;
use crate::cpuset::CpuSet;
use crate::pool::{Pool, PoolKind, Smt};
use crate::state::{AssignSpec, Assignment, AssignmentId, Size, State, Target};
use crate::topology::Topology;

/// `Healthy`, as the kubelet spells it.
pub const HEALTHY: &str = "Healthy";
/// `Unhealthy`.
pub const UNHEALTHY: &str = "Unhealthy";
/// Assignments the plugin makes are called `kubelet-<first device id>`.
pub const ID_PREFIX: &str = "kubelet-";

/// The extended resource of `pool`: `<prefix>/<pool>`.
pub fn resource_name(prefix: &str, pool: &str) -> String {
    format!("{prefix}/{pool}")
}

/// The plugin's socket file name in the device-plugin directory: `cpupoold-<pool>.sock`.
pub fn socket_name(pool: &str) -> String {
    format!("cpupoold-{pool}.sock")
}

/// Whether an assignment was made by the device plugin.
pub fn is_kubelet(a: &Assignment) -> bool {
    a.id.as_str().starts_with(ID_PREFIX)
}

/// A request the plugin refuses: the field at fault and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The protobuf field, e.g. `devices_ids`.
    pub field: &'static str,
    /// What is wrong.
    pub reason: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid {}: {}", self.field, self.reason)
    }
}

/// One device as the kubelet sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// `cpu-<N>`, `core-<N>`, `milli-<pool>-<NNNNN>`.
    pub id: String,
    /// Whether the kubelet may hand it out.
    pub healthy: bool,
    /// The NUMA nodes it spans.
    pub nodes: Vec<u32>,
}

impl Device {
    /// `Healthy` or `Unhealthy`, as the kubelet spells it.
    pub fn health(&self) -> &'static str {
        if self.healthy {
            HEALTHY
        } else {
            UNHEALTHY
        }
    }
}

fn refused(field: &'static str, reason: String) -> Refused {
    Refused { field, reason }
}

/// One device of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Unit {
    id: String,
    /// Sort key: the CPU, core or index number.
    n: u32,
    /// Exclusive pools: the CPUs it covers.
    cpus: CpuSet,
}

/// Every device of `pool`, in id order.
fn units(pool: &Pool, topo: &Topology, millis_per_device: u64) -> Vec<Unit> {
    match (pool.kind, pool.smt) {
        (PoolKind::Exclusive, Smt::Threads) => pool
            .cpus
            .iter()
            .map(|c| Unit { id: format!("cpu-{c}"), n: c, cpus: CpuSet::range(c, c) })
            .collect(),
        (PoolKind::Exclusive, Smt::FullCores) => {
            let mut cores: BTreeMap<u32, CpuSet> = BTreeMap::new();
            for c in pool.cpus.iter() {
                let core = topo.place(c).map_or(c, |p| p.core);
                cores.entry(core).or_default().insert(c);
            }
            cores.into_iter().map(|(core, cpus)| Unit { id: format!("core-{core}"), n: core, cpus }).collect()
        }
        _ => {
            let n = u32::try_from(pool.capacity_millis() / millis_per_device.max(1)).unwrap_or(u32::MAX);
            (0..n)
                .map(|i| Unit { id: format!("milli-{}-{i:05}", pool.name), n: i, cpus: CpuSet::new() })
                .collect()
        }
    }
}

/// The ListAndWatch device list of `pool`. `held`: shared units the kubelet holds; `online`:
/// the CPUs online now (CPU hotplug since the topology was read).
pub fn list(
    state: &State,
    topo: &Topology,
    pool: &Pool,
    millis_per_device: u64,
    held: &BTreeSet<String>,
    online: &CpuSet,
) -> Vec<Device> {
    let others: Vec<&Assignment> =
        state.assignments().values().filter(|a| a.pool == pool.name && !is_kubelet(a)).collect();
    let taken = others.iter().fold(CpuSet::new(), |acc, a| acc.union(&a.cpus));
    let units = units(pool, topo, millis_per_device);
    let mut unhealthy: BTreeSet<u32> = BTreeSet::new();
    if pool.kind == PoolKind::Shared {
        // What others use, and what offline CPUs took away, is not for the kubelet.
        let offline = pool.cpus.difference(online).len() as u64 * 1000;
        let used: u64 = others.iter().map(|a| a.millicpus).sum::<u64>() + offline;
        let mut need = used.div_ceil(millis_per_device.max(1));
        for u in units.iter().rev() {
            if need == 0 {
                break;
            }
            if !held.contains(&u.id) {
                unhealthy.insert(u.n);
                need -= 1;
            }
        }
    }
    let pool_nodes = topo.nodes_of(&pool.cpus);
    units
        .into_iter()
        .map(|u| {
            let (nodes, ok) = if pool.kind == PoolKind::Shared {
                (pool_nodes.clone(), !unhealthy.contains(&u.n))
            } else {
                (topo.nodes_of(&u.cpus), u.cpus.is_subset(online) && u.cpus.is_disjoint(&taken))
            };
            Device { id: u.id, healthy: ok, nodes: nodes.iter().collect() }
        })
        .collect()
}

/// Looks up device ids of `pool`, refusing unknown or repeated ones; in id order.
fn lookup(
    pool: &Pool,
    topo: &Topology,
    millis_per_device: u64,
    ids: &[String],
    field: &'static str,
) -> Result<Vec<Unit>, Refused> {
    let all: BTreeMap<String, Unit> =
        units(pool, topo, millis_per_device).into_iter().map(|u| (u.id.clone(), u)).collect();
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let Some(u) = all.get(id) else {
            return Err(refused(
                field,
                format!(
                    "`{}` is not a device of resource pool `{}`",
                    super::echo(id).escape_debug(),
                    pool.name
                ),
            ));
        };
        if !seen.insert(id.as_str()) {
            return Err(refused(field, format!("`{}` is listed twice", super::echo(id))));
        }
        out.push(u.clone());
    }
    out.sort_by_key(|u| u.n);
    Ok(out)
}

/// The number a device id ends with (`cpu-3`, `core-3`, `milli-web-00003`: 3).
fn number(id: &str) -> u32 {
    id.rsplit('-').next().and_then(|n| n.parse().ok()).unwrap_or(u32::MAX)
}

/// The id an allocation of `ids` is named by: the lowest-numbered device, as in
/// [`allocation`].
pub fn first_device<'a>(ids: impl IntoIterator<Item = &'a String>) -> Option<&'a String> {
    ids.into_iter().min_by_key(|id| (number(id), id.as_str()))
}

/// What Allocate records for one container: the assignment to make and what it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// The engine request (`id` is `kubelet-<first device id>`).
    pub spec: AssignSpec,
    /// The device ids, in id order.
    pub devices: Vec<String>,
}

/// Decodes one container's Allocate request.
pub fn allocation(
    pool: &Pool,
    topo: &Topology,
    millis_per_device: u64,
    ids: &[String],
) -> Result<Allocation, Refused> {
    if ids.is_empty() {
        return Err(refused("devices_ids", "is empty".into()));
    }
    let units = lookup(pool, topo, millis_per_device, ids, "devices_ids")?;
    let first = first_device(units.iter().map(|u| &u.id)).cloned().unwrap_or_default();
    let size = match pool.kind {
        PoolKind::Exclusive => Size::Cpuset(units.iter().fold(CpuSet::new(), |acc, u| acc.union(&u.cpus))),
        _ => Size::Millicpus(units.len() as u64 * millis_per_device),
    };
    let id = AssignmentId::new(&format!("{ID_PREFIX}{first}"))
        .map_err(|e| refused("devices_ids", e.to_string()))?;
    Ok(Allocation {
        // The plugin's reconciliation with the kubelet owns its lifetime: a container that
        // restarts keeps its devices, so its cgroup going away must not release them.
        spec: AssignSpec {
            reclaim: false,
            ..AssignSpec::new(pool.name.to_string(), Target::Kubelet(first), size, Some(id))
        },
        devices: units.into_iter().map(|u| u.id).collect(),
    })
}

/// Container requests one Allocate or GetPreferredAllocation may carry. The kubelet allocates
/// each container on its own (one request per call); a pod's containers together stay far
/// below this.
pub const MAX_CONTAINER_REQUESTS: usize = 64;

/// Refuses more than [`MAX_CONTAINER_REQUESTS`] container requests.
pub fn check_container_count(n: usize) -> Result<(), Refused> {
    if n > MAX_CONTAINER_REQUESTS {
        return Err(refused(
            "container_requests",
            format!("{n} container requests; at most {MAX_CONTAINER_REQUESTS} in one call"),
        ));
    }
    Ok(())
}

/// Decodes a whole Allocate request, one [`allocation`] per container request, refusing more
/// than [`MAX_CONTAINER_REQUESTS`] of them and a device listed for two containers: the
/// kubelet gives each device to one container, and two containers given one device would
/// share exclusive CPUs.
pub fn allocations<'a>(
    pool: &Pool,
    topo: &Topology,
    millis_per_device: u64,
    requests: impl ExactSizeIterator<Item = &'a [String]>,
) -> Result<Vec<Allocation>, Refused> {
    check_container_count(requests.len())?;
    let mut owner: BTreeMap<&str, usize> = BTreeMap::new();
    let mut out = Vec::with_capacity(requests.len());
    for (i, ids) in requests.enumerate() {
        out.push(allocation(pool, topo, millis_per_device, ids)?);
        for id in ids {
            if let Some(first) = owner.insert(id.as_str(), i) {
                return Err(refused(
                    "container_requests",
                    format!(
                        "device `{}` is listed for container requests {first} and {i}; each device goes to one container",
                        super::echo(id).escape_debug()
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// Whether `existing` is what `alloc` would make (a repeated Allocate).
pub fn same(existing: &Assignment, alloc: &Allocation) -> bool {
    Some(&existing.id) == alloc.spec.id.as_ref()
        && existing.pool.as_str() == alloc.spec.pool
        && match &alloc.spec.size {
            Size::Cpuset(c) => existing.cpus == *c,
            Size::Millicpus(m) => existing.millicpus == *m,
            Size::Cpus(_) => false,
        }
}

/// The environment a container gets for `a`.
pub fn envs(a: &Assignment) -> std::collections::HashMap<String, String> {
    use cpupool_wire::names;
    let cpus = a.cpus.to_string();
    let compat = if a.kind == PoolKind::Exclusive { "EXCLUSIVE_CPUS" } else { "SHARED_CPUS" };
    let mut envs = std::collections::HashMap::from([
        (names::ENV_CPUS.to_owned(), cpus.clone()),
        (names::ENV_POOL.to_owned(), a.pool.to_string()),
        (compat.to_owned(), cpus),
        (names::ENV_ASSIGNMENT.to_owned(), a.id.to_string()),
    ]);
    if a.kind == PoolKind::Shared {
        envs.insert(names::ENV_MILLICPUS.to_owned(), a.millicpus.to_string());
    }
    envs
}

/// GetPreferredAllocation for one container: `size` devices from `available`, including
/// `must_include`; exclusive pools pick with the daemon's allocator (whole cores, fewest NUMA
/// nodes and L3 groups), shared pools take the lowest units.
pub fn preferred(
    pool: &Pool,
    topo: &Topology,
    millis_per_device: u64,
    available: &[String],
    must_include: &[String],
    size: i32,
) -> Result<Vec<String>, Refused> {
    let avail = lookup(pool, topo, millis_per_device, available, "available_deviceIDs")?;
    let must = lookup(pool, topo, millis_per_device, must_include, "must_include_deviceIDs")?;
    let size =
        usize::try_from(size).map_err(|_| refused("allocation_size", format!("{size} is negative")))?;
    if size > avail.len() {
        return Err(refused(
            "allocation_size",
            format!("{size} is more than the {} available devices", avail.len()),
        ));
    }
    if must.len() > size {
        return Err(refused(
            "must_include_deviceIDs",
            format!("{} devices must be included but only {size} are asked for", must.len()),
        ));
    }
    if let Some(m) = must.iter().find(|m| !avail.iter().any(|a| a.id == m.id)) {
        return Err(refused(
            "must_include_deviceIDs",
            format!("`{}` is not among the available devices", m.id),
        ));
    }
    let in_order = || {
        let mut out: Vec<String> = must.iter().map(|u| u.id.clone()).collect();
        out.extend(avail.iter().filter(|a| !must.contains(a)).map(|a| a.id.clone()).take(size - must.len()));
        out
    };
    if pool.kind != PoolKind::Exclusive {
        return Ok(in_order());
    }
    let cpus = |us: &[Unit]| us.iter().fold(CpuSet::new(), |acc, u| acc.union(&u.cpus));
    match alloc::pick_devices(topo, &cpus(&avail), &cpus(&must), size, pool.smt) {
        Ok(chosen) => Ok(avail.iter().filter(|u| u.cpus.is_subset(&chosen)).map(|u| u.id.clone()).collect()),
        // The kubelet's own choice is still valid: never fail the pod for a preference.
        Err(_) => Ok(in_order()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::pool::PoolName;

    fn pool(name: &str, kind: PoolKind, cpus: &str, smt: Smt) -> Pool {
        Pool {
            name: PoolName::new(name).unwrap(),
            kind,
            cpus: CpuSet::parse(cpus).unwrap(),
            smt,
            isolate: false,
            kubelet: true,
            enforce_quota: false,
            dra: false,
        }
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    /// 2 sockets x 4 cores x 2 threads, 2 nodes: cores 0-3 on node 0 (siblings c+8).
    fn host() -> (Topology, State, Pool, Pool, Pool) {
        let t = Topology::synthetic(2, 4, 2, 2);
        let cores = pool("dp", PoolKind::Exclusive, "1-3,5-7,9-11,13-15", Smt::FullCores);
        let threads = pool("th", PoolKind::Exclusive, "4,12", Smt::Threads);
        let shared = pool("web", PoolKind::Shared, "0,8", Smt::Threads);
        let s = State::with_pools(vec![cores.clone(), threads.clone(), shared.clone()]);
        (t, s, cores, threads, shared)
    }

    #[test]
    fn one_device_for_two_containers_or_too_many_containers_are_refused() {
        let (t, _, cores, _, _) = host();
        let reqs = [ids(&["core-1", "core-2"]), ids(&["core-3"]), ids(&["core-5", "core-2"])];
        let e = allocations(&cores, &t, 100, reqs.iter().map(Vec::as_slice)).unwrap_err();
        assert_eq!(e.field, "container_requests");
        assert!(e.reason.contains("`core-2` is listed for container requests 0 and 2"), "{e}");
        let ok = allocations(&cores, &t, 100, reqs[..2].iter().map(Vec::as_slice)).unwrap();
        assert_eq!(ok.len(), 2);
        let many = vec![ids(&["core-1"]); MAX_CONTAINER_REQUESTS + 1];
        let e = allocations(&cores, &t, 100, many.iter().map(Vec::as_slice)).unwrap_err();
        assert!(e.reason.contains(&format!("{} container requests", MAX_CONTAINER_REQUESTS + 1)), "{e}");
        assert!(check_container_count(MAX_CONTAINER_REQUESTS).is_ok());
    }

    #[test]
    fn ids_health_and_numa() {
        let (t, mut s, cores, threads, shared) = host();
        let on = t.online();
        let l = list(&s, &t, &cores, 100, &BTreeSet::new(), &on);
        let got: Vec<(&str, &str, Vec<u32>)> =
            l.iter().map(|d| (d.id.as_str(), d.health(), d.nodes.clone())).collect();
        assert_eq!(got.len(), 6);
        assert_eq!(got[0], ("core-1", HEALTHY, vec![0]));
        assert_eq!(got[5], ("core-7", HEALTHY, vec![1]));
        let l = list(&s, &t, &threads, 100, &BTreeSet::new(), &on);
        assert_eq!(l.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), ["cpu-4", "cpu-12"]);
        let l = list(&s, &t, &shared, 250, &BTreeSet::new(), &on);
        assert_eq!(l.len(), 8);
        assert_eq!(l[0].id, "milli-web-00000");

        // A varlink assignment takes core 2 and 300 millicpus: those devices turn Unhealthy.
        let spec = |pool: &str, size, id: &str| {
            AssignSpec::new(
                pool,
                Target::parse(&format!("cgroup:{id}")).unwrap(),
                size,
                Some(AssignmentId::new(id).unwrap()),
            )
        };
        s.assign(&t, &spec("dp", Size::Cpuset(CpuSet::parse("2,10").unwrap()), "a")).unwrap();
        s.assign(&t, &spec("web", Size::Millicpus(300), "b")).unwrap();
        let sick =
            |l: Vec<Device>| -> Vec<String> { l.into_iter().filter(|d| !d.healthy).map(|d| d.id).collect() };
        assert_eq!(sick(list(&s, &t, &cores, 100, &BTreeSet::new(), &on)), ["core-2"]);
        let held = BTreeSet::from(["milli-web-00007".to_owned()]);
        assert_eq!(sick(list(&s, &t, &shared, 250, &held, &on)), ["milli-web-00005", "milli-web-00006"]);
        // The kubelet's own assignments keep their devices healthy.
        let a = allocation(&cores, &t, 100, &ids(&["core-3"])).unwrap();
        s.assign(&t, &a.spec).unwrap();
        assert_eq!(sick(list(&s, &t, &cores, 100, &BTreeSet::new(), &on)), ["core-2"]);

        // CPU 15 goes offline (hotplug after the topology was read): core 7's device turns
        // Unhealthy; CPU 8 going takes 1000 millicpus (4 units) from the shared pool.
        let on = on.difference(&CpuSet::parse("8,15").unwrap());
        assert_eq!(sick(list(&s, &t, &cores, 100, &BTreeSet::new(), &on)), ["core-2", "core-7"]);
        assert_eq!(
            sick(list(&s, &t, &shared, 250, &held, &on)),
            [
                "milli-web-00001",
                "milli-web-00002",
                "milli-web-00003",
                "milli-web-00004",
                "milli-web-00005",
                "milli-web-00006"
            ]
        );
    }

    #[test]
    fn allocation_decodes_and_refuses_by_field() {
        let (t, _, cores, threads, shared) = host();
        let a = allocation(&cores, &t, 100, &ids(&["core-5", "core-1"])).unwrap();
        assert_eq!(a.devices, ["core-1", "core-5"]);
        assert_eq!(a.spec.id.as_ref().map(AssignmentId::as_str), Some("kubelet-core-1"));
        assert_eq!(a.spec.target, Target::Kubelet("core-1".into()));
        assert_eq!(a.spec.size, Size::Cpuset(CpuSet::parse("1,5,9,13").unwrap()));
        let a = allocation(&shared, &t, 250, &ids(&["milli-web-00003", "milli-web-00001"])).unwrap();
        assert_eq!(a.spec.size, Size::Millicpus(500));
        assert_eq!(a.spec.target, Target::Kubelet("milli-web-00001".into()));
        for (p, v, why) in [
            (&cores, vec![], "is empty"),
            (&cores, vec!["cpu-1"], "`cpu-1` is not a device of resource pool `dp`"),
            (&cores, vec!["core-1", "core-1"], "listed twice"),
            (&threads, vec!["cpu-5"], "not a device"),
        ] {
            let e = allocation(p, &t, 100, &ids(&v)).unwrap_err();
            assert_eq!(e.field, "devices_ids");
            assert!(e.reason.contains(why), "{e}");
        }
    }

    #[test]
    fn preferred_whole_cores_and_numa_packing() {
        let (t, _, cores, threads, shared) = host();
        let all: Vec<String> = list(&State::default(), &t, &cores, 100, &BTreeSet::new(), &t.online())
            .into_iter()
            .map(|d| d.id)
            .collect();
        // Node 0 has cores 1-3, node 1 cores 5-7: two cores from one node.
        let got = preferred(&cores, &t, 100, &all, &[], 2).unwrap();
        assert_eq!(got, ["core-1", "core-2"]);
        // Must include core 6: the other comes from node 1 too.
        let got = preferred(&cores, &t, 100, &all, &ids(&["core-6"]), 2).unwrap();
        assert_eq!(got, ["core-5", "core-6"]);
        // Node 0 has one core left, node 1 three: 3 cores fit node 1 whole.
        let avail = ids(&["core-3", "core-5", "core-6", "core-7"]);
        assert_eq!(preferred(&cores, &t, 100, &avail, &[], 3).unwrap(), ["core-5", "core-6", "core-7"]);
        assert_eq!(preferred(&threads, &t, 100, &ids(&["cpu-4", "cpu-12"]), &[], 1).unwrap(), ["cpu-4"]);
        assert_eq!(
            preferred(&shared, &t, 500, &ids(&["milli-web-00009"]), &[], 1).unwrap_err().field,
            "available_deviceIDs"
        );
        let s = ids(&["milli-web-00002", "milli-web-00000", "milli-web-00001"]);
        assert_eq!(
            preferred(&shared, &t, 250, &s, &ids(&["milli-web-00002"]), 2).unwrap(),
            ["milli-web-00002", "milli-web-00000"]
        );
        let e = preferred(&cores, &t, 100, &all, &[], 7).unwrap_err();
        assert_eq!(e.field, "allocation_size");
        let e = preferred(&cores, &t, 100, &all, &[], -1).unwrap_err();
        assert_eq!(e.field, "allocation_size");
        let e = preferred(&cores, &t, 100, &all[..2], &ids(&["core-7"]), 1).unwrap_err();
        assert_eq!(e.field, "must_include_deviceIDs");
    }

    #[test]
    fn envs_name_the_pool_and_cpus() {
        let (t, mut s, cores, _, shared) = host();
        let a =
            s.assign(&t, &allocation(&cores, &t, 100, &ids(&["core-1"])).unwrap().spec).unwrap().into_inner();
        let e = envs(&a);
        assert_eq!(e["CPUPOOL_CPUS"], "1,9");
        assert_eq!(e["EXCLUSIVE_CPUS"], "1,9");
        assert_eq!(e["CPUPOOL_POOL"], "dp");
        assert_eq!(e["CPUPOOL_ASSIGNMENT"], "kubelet-core-1");
        assert!(!e.contains_key("CPUPOOL_MILLICPUS"));
        let a = s
            .assign(&t, &allocation(&shared, &t, 100, &ids(&["milli-web-00000"])).unwrap().spec)
            .unwrap()
            .into_inner();
        assert_eq!(envs(&a)["SHARED_CPUS"], "0,8");
        assert!(!envs(&a).contains_key("EXCLUSIVE_CPUS"));
        assert_eq!(envs(&a)["CPUPOOL_MILLICPUS"], "100");
        assert_eq!(envs(&a)["CPUPOOL_ASSIGNMENT"], "kubelet-milli-web-00000");
    }
}
