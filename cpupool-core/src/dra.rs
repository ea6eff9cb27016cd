//! The DRA device model: what the pools served by DRA (`dra = true`) look like in this node's
//! ResourceSlice, and the decoding of an allocation result back into a request for CPUs. Pure:
//! it reads a state and a topology; the k8s wing encodes what it returns as `resource.k8s.io/v1`
//! objects, and the DRA plugin turns decoded results into one engine transaction.
//!
//! # Why consumable capacity, not one device per CPU
//! A device per CPU makes a claim for N CPUs N allocation results, and a node's CPUs that many
//! devices: the API caps a claim at 32 results and a slice at 128 devices, which is where
//! drivers built that way stop. Here each pool is one device per NUMA node it spans (shared
//! pools: one device, their CPUs are used together), marked `allowMultipleAllocations`, with
//! one capacity `cpu` (a quantity: `4`, `1500m`) that allocations consume. A claim for 4 CPUs is
//! one result that consumed `cpu: 4`; the device count is pools × NUMA nodes, whatever the
//! number of CPUs.
//!
//! The capacity's request policy says what a request may ask: an exclusive pool hands out whole
//! CPUs (`smt = "full-cores"`: whole cores, so the step is the threads per core), a shared pool
//! steps of `kubelet.millicpus_per_device`. An allocation that asks for no amount gets the
//! policy's default, one step: so a pod that asks for the extended resource `cpupool.io/dp: 2`
//! (KEP-5004, served through the DeviceClass's `extendedResourceName`) gets two results of one
//! step each, the same CPUs the device plugin would give it for two devices.
//!
//! Device names are DNS labels: the pool's name with `_` as `-` (pool names have no `-`, so the
//! mapping is one to one), then `-numa<N>` for exclusive pools. Resolving a result looks the
//! name up among the devices the state has now, never parses it.

use std::collections::BTreeMap;
use std::fmt;

use crate::cpuset::CpuSet;
use crate::pool::{Pool, PoolKind, PoolName, Smt};
use crate::state::{Size, State};
use crate::topology::Topology;

/// The one capacity every device has, in CPUs.
pub const CAPACITY: &str = "cpu";
/// The standard attribute for the NUMA node (qualified: it is not in the driver's domain).
pub const ATTR_NUMA: &str = "resource.kubernetes.io/numaNode";

/// An amount of CPU, in thousandths (a Kubernetes quantity like `4` or `1500m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Millis(pub u64);

impl Millis {
    /// Whole CPUs.
    pub fn cpus(n: u64) -> Millis {
        Millis(n.saturating_mul(1000))
    }

    /// Parses a quantity as the API server writes a CPU amount: an integer or a decimal, with
    /// no suffix or `m`, or an integer with `k`. Anything finer than a millicpu, negative or
    /// otherwise spelled (exponents, binary suffixes) is refused, saying so.
    pub fn parse(s: &str) -> Result<Millis, QuantityError> {
        let bad = |reason: &'static str| QuantityError { quantity: crate::echo(s), reason };
        let (number, scale) = match s.as_bytes().last() {
            Some(b'm') => (&s[..s.len() - 1], 1u64),
            Some(b'k') => (&s[..s.len() - 1], 1_000_000),
            Some(b) if b.is_ascii_digit() => (s, 1000),
            Some(_) => return Err(bad("only a plain number, or one ending in m or k, is a CPU amount")),
            None => return Err(bad("it is empty")),
        };
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && frac.is_empty()
            || !(whole.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()))
        {
            return Err(bad("only digits and one decimal point may come before the suffix"));
        }
        let whole: u64 =
            if whole.is_empty() { 0 } else { whole.parse().map_err(|_| bad("it is too large"))? };
        let mut value = whole.checked_mul(scale).ok_or_else(|| bad("it is too large"))?;
        let mut unit = scale;
        for d in frac.bytes() {
            unit /= 10;
            let digit = u64::from(d - b'0');
            if unit == 0 {
                if digit != 0 {
                    return Err(bad("it is finer than a thousandth of a CPU"));
                }
                continue;
            }
            value = value.checked_add(digit * unit).ok_or_else(|| bad("it is too large"))?;
        }
        Ok(Millis(value))
    }
}

/// A quantity that is no CPU amount.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{quantity}` is not a CPU amount: {reason}")]
pub struct QuantityError {
    /// The quantity as given (cut short).
    pub quantity: String,
    /// Why.
    pub reason: &'static str,
}

impl fmt::Display for Millis {
    /// The canonical form: whole CPUs as a plain number, anything else in `m`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(1000) {
            write!(f, "{}", self.0 / 1000)
        } else {
            write!(f, "{}m", self.0)
        }
    }
}

/// One device of the slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraDevice {
    /// Its name: `dp-numa0`, `web`.
    pub name: String,
    /// The pool it hands out.
    pub pool: PoolName,
    /// The pool's kind.
    pub kind: PoolKind,
    /// The CPUs it hands out from (for a shared pool, all of the pool's).
    pub cpus: CpuSet,
    /// The NUMA node, when all of its CPUs are on one.
    pub numa: Option<u32>,
    /// The L3 groups its CPUs are in (the topology's ids).
    pub l3: Vec<u32>,
    /// Whether the pool is isolated (`isolate = true`).
    pub isolated: bool,
    /// Whether it hands out whole cores (`smt = "full-cores"`).
    pub whole_cores: bool,
    /// The capacity: its CPUs (shared pools: 1000 millis each).
    pub capacity: Millis,
    /// What one step of a request is, and what a request that names no amount gets.
    pub step: Millis,
}

/// The driver's name for `resource_prefix` (`kubelet.resource_prefix`): `dra.cpupool.io`. It
/// names the ResourceSlices, the DeviceClasses' selectors, the kubelet plugin and the CDI kind.
pub fn driver_name(resource_prefix: &str) -> String {
    format!("dra.{resource_prefix}")
}

/// The device name of `pool` (and NUMA node, for exclusive pools).
pub fn device_name(pool: &PoolName, numa: Option<u32>) -> String {
    let base = pool.as_str().replace('_', "-");
    match numa {
        Some(n) => format!("{base}-numa{n}"),
        None => base,
    }
}

/// The DeviceClass name of `pool` under the driver: `dp.dra.cpupool.io`. (This node's
/// ResourceSlice pool is the node's name: a device is `<node>/<device>` cluster-wide.)
pub fn class_name(pool: &PoolName, driver: &str) -> String {
    format!("{}.{driver}", pool.as_str().replace('_', "-"))
}

/// The threads per core among `cpus` (1 without SMT), for the step of a full-cores pool.
fn threads_per_core(topo: &Topology, cpus: &CpuSet) -> u64 {
    cpus.iter().map(|c| topo.siblings(c).intersection(cpus).len() as u64).max().unwrap_or(1).max(1)
}

fn l3_of(topo: &Topology, cpus: &CpuSet) -> Vec<u32> {
    topo.l3_groups().iter().filter(|(_, g)| !g.is_disjoint(cpus)).map(|(id, _)| *id).collect()
}

/// The devices of `pool`, in name order; none unless DRA serves it.
pub fn pool_devices(pool: &Pool, topo: &Topology, millis_per_device: u64) -> Vec<DraDevice> {
    if !pool.served_by_dra() || pool.cpus.is_empty() {
        return Vec::new();
    }
    let device = |name: String, numa: Option<u32>, cpus: CpuSet, step: Millis| DraDevice {
        name,
        pool: pool.name.clone(),
        kind: pool.kind,
        l3: l3_of(topo, &cpus),
        capacity: Millis::cpus(cpus.len() as u64),
        cpus,
        numa,
        isolated: pool.isolate,
        whole_cores: pool.smt == Smt::FullCores,
        step,
    };
    match pool.kind {
        PoolKind::Exclusive => {
            let threads = if pool.smt == Smt::FullCores { threads_per_core(topo, &pool.cpus) } else { 1 };
            let mut by_node: BTreeMap<u32, CpuSet> = BTreeMap::new();
            for (node, node_cpus) in topo.nodes() {
                let mine = node_cpus.intersection(&pool.cpus);
                if !mine.is_empty() {
                    by_node.insert(*node, mine);
                }
            }
            by_node
                .into_iter()
                .map(|(node, cpus)| {
                    device(device_name(&pool.name, Some(node)), Some(node), cpus, Millis::cpus(threads))
                })
                .collect()
        }
        _ => {
            let nodes = topo.nodes_of(&pool.cpus);
            let numa = if nodes.len() == 1 { nodes.first() } else { None };
            vec![device(
                device_name(&pool.name, None),
                numa,
                pool.cpus.clone(),
                Millis(millis_per_device.max(1)),
            )]
        }
    }
}

/// Every device DRA serves on this node, in pool order.
pub fn devices(state: &State, topo: &Topology, millis_per_device: u64) -> Vec<DraDevice> {
    state.pools().values().flat_map(|p| pool_devices(p, topo, millis_per_device)).collect()
}

/// What one device's results in a claim come to: the pool, the CPUs to take from, how much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The device.
    pub device: String,
    /// The pool.
    pub pool: PoolName,
    /// Exclusive: the CPUs the assignment must come from (the device's NUMA node).
    pub within: CpuSet,
    /// How much: whole CPUs for an exclusive pool, millicpus for a shared one.
    pub size: Size,
}

/// A result this node cannot honour: the device and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("device `{device}`: {reason}")]
pub struct Unresolved {
    /// The device as the result names it (cut short).
    pub device: String,
    /// Why.
    pub reason: String,
}

/// Decodes a claim's results for this driver and node: `(device, consumed)` pairs, `consumed`
/// `None` where the result names no amount (the step, the policy's default). Results on one
/// device are added up. A device that is no longer served, or an amount off the device's
/// steps or beyond its capacity, is refused, naming the device.
pub fn resolve(
    state: &State,
    topo: &Topology,
    millis_per_device: u64,
    results: &[(String, Option<Millis>)],
) -> Result<Vec<Wanted>, Unresolved> {
    let served: BTreeMap<String, DraDevice> =
        devices(state, topo, millis_per_device).into_iter().map(|d| (d.name.clone(), d)).collect();
    let mut sums: BTreeMap<&str, (&DraDevice, u64)> = BTreeMap::new();
    for (name, consumed) in results {
        let Some(d) = served.get(name) else {
            return Err(Unresolved {
                device: crate::echo(name),
                reason:
                    "no pool on this node is served by DRA as this device (deleted, resized off its NUMA \
                         node, or given back to the device plugin)"
                        .into(),
            });
        };
        let amount = consumed.unwrap_or(d.step).0;
        if amount == 0 || !amount.is_multiple_of(d.step.0) {
            return Err(Unresolved {
                device: name.clone(),
                reason: format!("{} is not a multiple of its step {}", Millis(amount), d.step),
            });
        }
        let sum = sums.entry(d.name.as_str()).or_insert((d, 0));
        sum.1 = sum.1.saturating_add(amount);
    }
    sums.into_values()
        .map(|(d, total)| {
            if total > d.capacity.0 {
                return Err(Unresolved {
                    device: d.name.clone(),
                    reason: format!("{} asked, its capacity is {}", Millis(total), d.capacity),
                });
            }
            let size = match d.kind {
                PoolKind::Exclusive => Size::Cpus(u32::try_from(total / 1000).unwrap_or(u32::MAX)),
                _ => Size::Millicpus(total),
            };
            Ok(Wanted { device: d.name.clone(), pool: d.pool.clone(), within: d.cpus.clone(), size })
        })
        .collect()
}

pub mod names;
#[cfg(test)]
mod tests;
