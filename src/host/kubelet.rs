//! The kubelet as this host shows it to cpupoold, each function given the file or root it
//! reads: the kubelet's CPU manager checkpoint, the cgroup tree where a pod's and a
//! container's cgroups are found, the PodResources socket's place, and the identity of the
//! sockets in its plugin directories. The kubelet's gRPC APIs and our clients of them are the
//! Kubernetes home's plumbing (`crate::kubernetes::grpc`), not a host surface.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::core::cpuset::CpuSet;
use crate::core::state::CgroupPath;

/// The kubelet's PodResources socket under its root directory (`paths.kubelet_dir`).
pub fn pod_resources_socket(kubelet_dir: &Path) -> std::path::PathBuf {
    kubelet_dir.join("pod-resources/kubelet.sock")
}

/// Why the plugin may not run next to the kubelet's CPU manager.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{file}`: the kubelet's CPU manager runs the static policy and has given CPUs {cpus} of pool `{pool}` \
     to containers; set cpuManagerPolicy: none, or keep the pools out of its reach with \
     reservedSystemCPUs covering them, then restart the kubelet (and cpupoold)"
)]
pub struct StaticConflict {
    /// The checkpoint file.
    pub file: String,
    /// The pool.
    pub pool: String,
    /// The CPUs both own.
    pub cpus: CpuSet,
}

/// Checks the kubelet's `cpu_manager_state` (JSON: `policyName`, `defaultCpuSet`, `entries`
/// of pod → container → CPU list) against the pools: the static policy owning a pool's CPUs
/// (exclusive entries) is a conflict. A missing or unreadable file is no conflict.
pub fn check_cpu_manager(file: &Path, pools: &[(String, CpuSet)]) -> Result<(), StaticConflict> {
    let Ok(text) = fs::read_to_string(file) else { return Ok(()) };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else { return Ok(()) };
    if v.get("policyName").and_then(|p| p.as_str()) != Some("static") {
        return Ok(());
    }
    let mut owned = CpuSet::new();
    if let Some(entries) = v.get("entries").and_then(|e| e.as_object()) {
        for containers in entries.values().filter_map(|c| c.as_object()) {
            for cpus in containers.values().filter_map(|c| c.as_str()) {
                owned = owned.union(&CpuSet::parse(cpus).unwrap_or_default());
            }
        }
    }
    for (pool, cpus) in pools {
        let both = owned.intersection(cpus);
        if !both.is_empty() {
            return Err(StaticConflict { file: file.display().to_string(), pool: pool.clone(), cpus: both });
        }
    }
    Ok(())
}

/// The kubelet's pod cgroup, relative to the cgroup root: with the systemd driver, then with
/// the cgroupfs driver.
pub const POD_CGROUPS: [&str; 2] = ["kubepods.slice", "kubepods"];

/// The effective CPUs of the kubelet's pod cgroup: `kubepods.slice` (systemd driver) or
/// `kubepods` (cgroupfs driver), whichever exists; `None` when neither does or its
/// `cpuset.cpus.effective` cannot be read (a cgroup v1 host, a sandbox).
pub fn pod_cpus(root: &Path) -> Option<CpuSet> {
    POD_CGROUPS.iter().find_map(|dir| {
        let text = std::fs::read_to_string(root.join(dir).join("cpuset.cpus.effective")).ok()?;
        CpuSet::parse(text.trim()).ok()
    })
}

/// The cgroup of a container, relative to `root`: the pod's cgroup is found below `kubepods`
/// (cgroupfs driver: `kubepods/[<qos>/]pod<uid>`) or `kubepods.slice` (systemd driver:
/// `kubepods[-<qos>]-pod<uid with _>.slice`), and in it the container's: `<id>` (cgroupfs) or
/// `<runtime>-<id>.scope` (systemd: `cri-containerd-`, `crio-`, `docker-`).
///
/// With the pod's QoS class (from the pod watch) the pod's cgroup is named outright, in both
/// drivers' layouts; without it, or when neither is there, the pod is looked for by its UID.
pub fn find_container(
    root: &Path,
    pod_uid: &str,
    container_id: &str,
    qos: Option<&str>,
) -> Option<CgroupPath> {
    if pod_uid.is_empty() || container_id.is_empty() || container_id.contains('/') || pod_uid.contains('/') {
        return None;
    }
    let systemd_pod = format!("pod{}.slice", pod_uid.replace('-', "_"));
    let cgroupfs_pod = format!("pod{pod_uid}");
    let is_pod = |name: &str| name == cgroupfs_pod || name.ends_with(&format!("-{systemd_pod}"));
    let scope = format!("-{container_id}.scope");
    let is_container = |name: &str| name == container_id || name.ends_with(&scope);
    let in_pod = |rel: &str| {
        children(&root.join(rel))
            .into_iter()
            .find(|c| is_container(c))
            .and_then(|c| CgroupPath::new(&format!("{rel}/{c}")).ok())
    };
    let named = match qos {
        Some("Guaranteed") => {
            Some([format!("kubepods.slice/kubepods-{systemd_pod}"), format!("kubepods/{cgroupfs_pod}")])
        }
        Some(q @ ("Burstable" | "BestEffort")) => {
            let q = q.to_ascii_lowercase();
            Some([
                format!("kubepods.slice/kubepods-{q}.slice/kubepods-{q}-{systemd_pod}"),
                format!("kubepods/{q}/{cgroupfs_pod}"),
            ])
        }
        _ => None,
    };
    if let Some(pod) = named.into_iter().flatten().find(|p| root.join(p).is_dir()) {
        return in_pod(&pod);
    }
    for top in POD_CGROUPS {
        // kubepods/pod, kubepods/<qos>/pod: at most two levels down.
        let mut level = vec![top.to_owned()];
        for _ in 0..2 {
            let mut next = Vec::new();
            for dir in &level {
                for name in children(&root.join(dir)) {
                    let rel = format!("{dir}/{name}");
                    if is_pod(&name) {
                        return in_pod(&rel);
                    }
                    next.push(rel);
                }
            }
            level = next;
        }
    }
    None
}

/// A file's inode number and change time. The inode number alone does not tell a re-created
/// socket from the old one: ext4 hands a freed inode number to the next file created.
pub type FileId = (u64, i64, i64);

/// The identity of the file at `path` (not followed if a link); `None` when there is none.
pub fn file_id(path: &Path) -> Option<FileId> {
    fs::symlink_metadata(path).ok().map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}

fn children(dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    out.sort();
    out
}

/// Checks the kubelet's CPU manager (its `cpu_manager_state` in `kubelet_dir`) against the pools
/// `served` picks (the device plugin's, or DRA's): its static policy owning CPUs of one of them
/// is a conflict.
pub(crate) fn check_static_policy(
    state: &crate::core::state::State,
    kubelet_dir: &Path,
    served: fn(&crate::core::pool::Pool) -> bool,
) -> Result<(), StaticConflict> {
    let pools: Vec<(String, crate::core::cpuset::CpuSet)> =
        state.pools().values().filter(|p| served(p)).map(|p| (p.name.to_string(), p.cpus.clone())).collect();
    check_cpu_manager(&kubelet_dir.join("cpu_manager_state"), &pools)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn finds_containers_of_both_drivers() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        let uid = "0b5f-42";
        for d in [
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b5f_42.slice/cri-containerd-abc.scope",
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b5f_42.slice/cri-containerd-pause.scope",
            "kubepods/besteffort/pod77/def",
            "kubepods/pod88/xyz",
        ] {
            fs::create_dir_all(r.join(d)).unwrap();
        }
        assert_eq!(
            find_container(r, uid, "abc", None).map(|p| p.to_string()),
            Some("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b5f_42.slice/cri-containerd-abc.scope".into())
        );
        assert_eq!(
            find_container(r, "77", "def", None).map(|p| p.to_string()),
            Some("kubepods/besteffort/pod77/def".into())
        );
        assert_eq!(
            find_container(r, "88", "xyz", None).map(|p| p.to_string()),
            Some("kubepods/pod88/xyz".into())
        );
        assert_eq!(find_container(r, uid, "gone", None), None);
        assert_eq!(find_container(r, "nope", "abc", None), None);
        assert_eq!(find_container(r, uid, "../x", None), None);

        // With the QoS class the pod's cgroup is named outright; a wrong class, or a layout that
        // is neither driver's, falls back to the search by UID.
        let burstable = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b5f_42.slice";
        assert_eq!(
            find_container(r, uid, "abc", Some("Burstable")).map(|p| p.to_string()),
            Some(format!("{burstable}/cri-containerd-abc.scope"))
        );
        assert_eq!(
            find_container(r, "77", "def", Some("BestEffort")).map(|p| p.to_string()),
            Some("kubepods/besteffort/pod77/def".into())
        );
        assert_eq!(
            find_container(r, "88", "xyz", Some("Guaranteed")).map(|p| p.to_string()),
            Some("kubepods/pod88/xyz".into())
        );
        assert_eq!(
            find_container(r, "88", "xyz", Some("Burstable")).map(|p| p.to_string()),
            Some("kubepods/pod88/xyz".into())
        );
        assert_eq!(find_container(r, uid, "gone", Some("Burstable")), None);
        assert_eq!(find_container(r, "../77", "def", Some("BestEffort")), None);
    }

    #[test]
    fn static_policy_owning_pool_cpus_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("cpu_manager_state");
        let pools = vec![("dp".to_owned(), CpuSet::parse("2-5").unwrap())];
        assert_eq!(check_cpu_manager(&f, &pools), Ok(()));
        fs::write(&f, r#"{"policyName":"none","defaultCpuSet":"","checksum":1}"#).unwrap();
        assert_eq!(check_cpu_manager(&f, &pools), Ok(()));
        fs::write(
            &f,
            r#"{"policyName":"static","defaultCpuSet":"0-1,6-7","entries":{"pod":{"c":"6-7"}},"checksum":1}"#,
        )
        .unwrap();
        assert_eq!(check_cpu_manager(&f, &pools), Ok(()));
        fs::write(
            &f,
            r#"{"policyName":"static","defaultCpuSet":"0-1","entries":{"pod":{"c":"4-7"}},"checksum":1}"#,
        )
        .unwrap();
        let e = check_cpu_manager(&f, &pools).unwrap_err();
        assert_eq!(e.cpus, CpuSet::parse("4-5").unwrap());
        assert!(e.to_string().contains("static policy"), "{e}");
    }
}
