//! The node report: the `CpuPoolNode` object named after the node, whose status follows the
//! engine's committed state.
//!
//! ```text
//! engine events ─┐
//! cluster config ┼─► dirty ─► wait until report_interval after the last write ─► snapshot
//! pod index ─────┘                                                              │
//!                   server-side apply (field manager cpupoold, force) ◄─────────┘
//!                   on the status subresource; 404: apply the object first
//! ```
//!
//! Changes that arrive while a write is pending, or within `k8s.report_interval_ms` of the last
//! one, make one later write with the latest snapshot: a burst of N assignments costs about
//! one write per interval, and the last write always carries the final state. A failed write is
//! retried with backoff (0.5 s doubling to 30 s); a `409 Conflict` is applied again at once.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use tokio::sync::{broadcast, watch};

use super::crd::{
    AssignmentStatus, CpuPoolNode, CpuPoolNodeStatus, NodeCondition, Owner, PoolStatus, TopologySummary,
};
use super::pods::PodIndex;
use super::ClusterStatus;
use crate::core::pool::PoolKind;
use crate::core::state::{State, Target};
use crate::engine::{Handle, Snapshot};

/// The field manager of every write.
pub const FIELD_MANAGER: &str = "cpupoold";

/// The status for `snap`, with the cluster configuration's state and the pods' owners.
/// Conditions keep their transition time from `previous` while their status stays.
pub fn build_status(
    snap: &Snapshot,
    cluster: &ClusterStatus,
    pods: &PodIndex,
    previous: Option<&CpuPoolNodeStatus>,
    now: &str,
) -> CpuPoolNodeStatus {
    let topo = &snap.topology;
    let topology = TopologySummary {
        online: topo.online().to_string(),
        cpu_count: topo.online().len() as u32,
        cores: topo.cores().len() as u32,
        numa_nodes: topo.nodes().len() as u32,
        isolated: topo.isolated().to_string(),
    };
    let pools = pool_statuses(snap);
    let assignments = assignment_statuses(&snap.state, pods);

    let ready = if snap.degraded.is_empty() {
        ("True", "PoolsApplied", format!("{}; {} backend", snap.summary(), snap.backend))
    } else {
        ("False", "Degraded", format!("pools not fully applied: {}", snap.degraded.join(", ")))
    };
    let invalid = match (&cluster.rejected, &snap.config_error) {
        (Some(reason), _) => ("True", "ConfigMapRejected", reason.clone()),
        (None, Some(reason)) => ("True", "LocalConfigRejected", reason.clone()),
        (None, None) => ("False", "ConfigApplied", "the configuration in use is valid".to_owned()),
    };
    let condition = |type_: &str, (status, reason, message): (&str, &str, String)| {
        let since = previous
            .and_then(|p| p.conditions.iter().find(|c| c.type_ == type_))
            .filter(|c| c.status == status)
            .map_or_else(|| now.to_owned(), |c| c.last_transition_time.clone());
        NodeCondition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            last_transition_time: since,
        }
    };
    CpuPoolNodeStatus {
        topology,
        pools,
        assignments,
        config_generation: cluster.generation.clone(),
        conditions: vec![condition("Ready", ready), condition("ConfigInvalid", invalid)],
    }
}

/// Each pool: its kind, CPUs, what is free, its partition as the kernel reports it, and
/// whether the device plugin or DRA offers it to the kubelet.
fn pool_statuses(snap: &Snapshot) -> Vec<PoolStatus> {
    let state = &snap.state;
    state
        .pools()
        .values()
        .map(|p| {
            let shared = p.kind == PoolKind::Shared;
            PoolStatus {
                name: p.name.to_string(),
                kind: p.kind.to_string(),
                cpus: p.cpus.to_string(),
                free: state.free_cpus(p).to_string(),
                free_millicpus: shared.then(|| state.free_millis(p)),
                partition: snap.partitions.get(&p.name).cloned(),
                served_by: match (p.served_by_device_plugin(), p.served_by_dra()) {
                    (true, _) => Some("devicePlugin".to_owned()),
                    (_, true) => Some("dra".to_owned()),
                    _ => None,
                },
            }
        })
        .collect()
}

/// Each assignment, with the pod and container that hold it when the pod watch knows them.
fn assignment_statuses(state: &State, pods: &PodIndex) -> Vec<AssignmentStatus> {
    state
        .assignments()
        .values()
        .map(|a| {
            let mut owner = Owner { target: a.target.to_string(), ..Owner::default() };
            if let Target::Cgroup(path) = &a.target {
                if let Some(((ns, pod, container), info)) = pods.find_by_id_in(path.as_str()) {
                    owner.namespace = Some(ns);
                    owner.pod = Some(pod);
                    owner.container = Some(container);
                    owner.pod_uid = Some(info.pod_uid);
                }
            }
            AssignmentStatus {
                id: a.id.as_str().to_owned(),
                pool: a.pool.to_string(),
                cpus: a.cpus.to_string(),
                millicpus: (a.kind == PoolKind::Shared).then_some(a.millicpus),
                owner,
            }
        })
        .collect()
}

/// Keeps the node's report current until `stop` is set.
pub async fn run(
    client: Client,
    node: String,
    handle: Handle,
    mut cluster: watch::Receiver<ClusterStatus>,
    pods: PodIndex,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<CpuPoolNode> = Api::all(client);
    let mut events = handle.subscribe();
    let mut pod_changes = pods.subscribe();
    let mut writer = Writer { api, node, exists: false, written: None, failing: false, stale: false };
    let mut dirty = true;
    // Written again now and then even when nothing changed, so a CpuPoolNode deleted (or
    // edited) by hand comes back: every 150 intervals (5 min at the default 2 s).
    let mut resync = tokio::time::interval_at(tokio::time::Instant::now() + interval * 150, interval * 150);
    let mut last_write: Option<Instant> = None;
    let mut backoff = crate::backoff::Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    loop {
        // Wait for something to report, or for the spacing after the last write to pass; every
        // change that comes meanwhile is absorbed into the one write that follows.
        let due = match (dirty, last_write) {
            (false, _) => None,
            (true, None) => Some(tokio::time::Instant::now()),
            (true, Some(t)) => Some(tokio::time::Instant::from_std(t + interval.max(backoff.pause()))),
        };
        let sleep = async {
            match due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = crate::kubernetes::apiserver::stopped(&mut stop) => return,
            e = events.recv() => match e {
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => dirty = true,
                Err(broadcast::error::RecvError::Closed) => return,
            },
            r = cluster.changed() => match r {
                Ok(()) => dirty = true,
                Err(_) => return,
            },
            r = pod_changes.changed() => match r {
                Ok(()) => dirty = true,
                Err(_) => return,
            },
            _ = resync.tick() => {
                writer.stale = true;
                dirty = true;
            }
            _ = sleep => {
                dirty = false;
                let status = build_status(
                    &handle.snapshot(),
                    &cluster.borrow_and_update(),
                    &pods,
                    writer.written.as_ref(),
                    &rfc3339(SystemTime::now()),
                );
                match writer.write(status).await {
                    Ok(()) => backoff.reset(),
                    Err(()) => {
                        dirty = true;
                        backoff.fail();
                    }
                }
                last_write = Some(Instant::now());
            }
        }
    }
}

/// Writes the status; remembers what was written and whether the object exists.
struct Writer {
    api: Api<CpuPoolNode>,
    node: String,
    exists: bool,
    written: Option<CpuPoolNodeStatus>,
    failing: bool,
    /// Write even what was written already (the periodic resync).
    stale: bool,
}

impl Writer {
    /// One write (and the object's creation first when needed). `Err` when it must be retried
    /// later; the cause is logged, once per outage.
    async fn write(&mut self, status: CpuPoolNodeStatus) -> Result<(), ()> {
        if self.written.as_ref() == Some(&status) && self.exists && !self.stale {
            return Ok(());
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let mut conflicts = 0;
        loop {
            let result = if self.exists {
                let body = serde_json::json!({
                    "apiVersion": "cpupool.io/v1alpha1",
                    "kind": "CpuPoolNode",
                    "metadata": { "name": self.node },
                    "status": status,
                });
                self.api.patch_status(&self.node, &params, &Patch::Apply(body)).await.map(|_| ())
            } else {
                let body = serde_json::json!({
                    "apiVersion": "cpupool.io/v1alpha1",
                    "kind": "CpuPoolNode",
                    "metadata": { "name": self.node },
                    "spec": { "nodeName": self.node },
                });
                self.api.patch(&self.node, &params, &Patch::Apply(body)).await.map(|_| ())
            };
            match result {
                Ok(()) if !self.exists => self.exists = true,
                Ok(()) => {
                    if self.failing {
                        log::info!("k8s: the node report is written again");
                    }
                    self.failing = false;
                    self.stale = false;
                    self.written = Some(status);
                    return Ok(());
                }
                // Someone else's write came between: apply ours again (a few times at once).
                Err(kube::Error::Api(r)) if r.code == 409 && conflicts < 3 => {
                    conflicts += 1;
                    log::info!("k8s: the node report conflicted with another write (409); applying it again");
                }
                Err(kube::Error::Api(r)) if r.code == 404 && self.exists => {
                    log::info!("k8s: CpuPoolNode/{} is gone; creating it again", self.node);
                    self.exists = false;
                }
                Err(e) => {
                    let msg = crate::kubernetes::apiserver::describe(&e);
                    if !self.failing {
                        log::warn!(
                            "k8s: writing the node report CpuPoolNode/{}: {msg}; retrying with backoff",
                            self.node
                        );
                    } else {
                        log::debug!("k8s: writing the node report: {msg}");
                    }
                    self.failing = true;
                    return Err(());
                }
            }
        }
    }
}

/// `2026-11-22T08:00:00Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400 + 3_723)), "2000-02-29T01:02:03Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(1_795_132_800)), "2026-11-20T00:00:00Z");
    }
}
