//! The sandbox's cgroup tree and processes: the kernel's part in what the cgroupfs backend
//! does to a tree of plain files ([`SimCgroups`], the twin of
//! [`crate::host::cgroupfs::HostCgroups`]) and to processes' affinities ([`SimProcesses`], the
//! twin of [`crate::host::cgroupfs::HostProcesses`]).
//!
//! A plain tree has no `cpuset.cpus.effective` below its root and makes no file by itself:
//! [`SimCgroups`] computes the effective CPUs as the kernel would ([`effective_cpus`]), from the
//! partitions the backend keeps between its writes ([`CgroupFs::kept_partitions`]) and the
//! `cpuset.cpus` on the way down; a write creates the file; a directory without
//! `cgroup.subtree_control` has the controller (nothing says it is off); removing a cgroup
//! removes the plain files in it too; no one else removes cgroups, so none vanishes.
//!
//! [`SimProcesses`] never changes a real process: affinities are recorded under its directory
//! (the sandbox's `proc/`) as `PID/status`, in the kernel's `Cpus_allowed_list:` format, and
//! read back from there. Processes are still looked up (read-only) under the procfs root.
#![deny(missing_docs)]

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::core::cpuset::CpuSet;
use crate::core::state::CgroupPath;
use crate::host::cgroupfs::{CgroupFs, CgroupKernel, Partitions, ProcessKernel};
use crate::host::fsutil::{FsError, Root};
use crate::host::{HostError, IoError};

/// The simulated kernel's part in a cgroup tree of plain files (module docs).
#[derive(Debug, Clone, Copy)]
pub struct SimCgroups;

impl CgroupKernel for SimCgroups {
    fn write(&self, root: &Root, rel: &Path, bytes: &[u8]) -> Result<(), FsError> {
        root.write_or_create(rel, bytes, 0o644)
    }

    fn remove(&self, root: &Root, rel: &str) -> Result<(), FsError> {
        match root.remove_dir(rel) {
            // Plain files that the kernel would not let anyone create: removed too.
            Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => root.remove_dir_all(rel),
            r => r,
        }
    }

    fn cpuset_enabled(&self, dir: &Path) -> bool {
        match fs::read_to_string(dir.join("cgroup.subtree_control")) {
            Ok(t) => t.split_whitespace().any(|c| c.trim_start_matches('+') == "cpuset"),
            // A plain directory: nothing says the controller is off.
            Err(_) => true,
        }
    }

    fn cpuset_file_ready(&self, _file: &Path) -> bool {
        // The first write makes it.
        true
    }

    fn vanished(&self, _fs: &CgroupFs, _path: &CgroupPath) -> bool {
        false
    }

    /// [`effective_cpus`], from the kept partitions and parent: a cgroup that is not a
    /// partition has its own `cpuset.cpus` within its parent's effective CPUs, so only its own
    /// file is read (its parent's were read when it was admitted, and are kept until a write).
    fn effective(&self, fs: &CgroupFs, path: &CgroupPath) -> Result<Option<CpuSet>, HostError> {
        if !fs.exists(path) {
            return Ok(None);
        }
        let root = fs.root();
        let partitions = fs.kept_partitions(|| partitions(root));
        if partitions.contains(path) {
            return Ok(Some(effective_in(root, Some(path), &partitions)));
        }
        let parent = match fs.nearest(path.ancestors().last()) {
            Ok(Some(c)) => c.cpus,
            _ => return Ok(Some(effective_in(root, Some(path), &partitions))),
        };
        let own = crate::host::read_small(&fs.dir(path).join("cpuset.cpus"))
            .ok()
            .and_then(|t| CpuSet::parse(t.trim()).ok())
            .unwrap_or_default();
        Ok(Some(below(&parent, &own)))
    }

    fn root_effective(&self, fs: &CgroupFs) -> Result<Option<CpuSet>, HostError> {
        let root = fs.root();
        Ok(Some(effective_in(root, None, &fs.kept_partitions(|| partitions(root)))))
    }
}

/// The simulated kernel's part in processes' affinities: recorded under a directory (module
/// docs).
#[derive(Debug, Clone)]
pub struct SimProcesses {
    dir: PathBuf,
}

impl SimProcesses {
    /// Affinities recorded under `dir` (the sandbox's `proc/`).
    pub fn new(dir: impl Into<PathBuf>) -> SimProcesses {
        SimProcesses { dir: dir.into() }
    }
}

/// The simulated root cgroup's CPUs as its file shows them: every simulated CPU.
fn all_cpus(fs: &CgroupFs) -> CpuSet {
    fs::read_to_string(fs.root().join("cpuset.cpus.effective"))
        .ok()
        .and_then(|t| CpuSet::parse(t.trim()).ok())
        .unwrap_or_default()
}

impl ProcessKernel for SimProcesses {
    /// Records `cpus` (empty: every simulated CPU) as the process's `Cpus_allowed_list`, after
    /// checking that the process exists.
    fn set_affinity(&self, fs: &CgroupFs, pid: u32, cpus: &CpuSet, optional: bool) -> Result<(), HostError> {
        let proc_dir = fs.proc_root().join(pid.to_string());
        if !proc_dir.is_dir() {
            if optional {
                return Ok(());
            }
            return Err(HostError::Io(IoError::Read {
                path: proc_dir,
                source: io::Error::from(io::ErrorKind::NotFound),
            }));
        }
        let all = all_cpus(fs);
        let cpus = if cpus.is_empty() { &all } else { cpus };
        // Inside the sandbox only, and never through a link planted there.
        let root = Root::new(&self.dir);
        let data = format!("Cpus_allowed_list:\t{cpus}\n");
        let status = self.dir.join(pid.to_string()).join("status");
        let err = |e: FsError| {
            HostError::Io(IoError::Write { path: status.clone(), data: data.clone(), source: e.source })
        };
        // Not made durable (no fsync, unlike the state's files): a simulated process's entry
        // means nothing after the process, or the sandbox, is gone.
        match root.create_dir(pid.to_string(), 0o755) {
            Err(e) if e.source.kind() != io::ErrorKind::AlreadyExists => return Err(err(e)),
            _ => {}
        }
        root.write_or_create(format!("{pid}/status"), data.as_bytes(), 0o644).map_err(err)
    }

    fn affinity(&self, fs: &CgroupFs, pid: u32) -> Option<CpuSet> {
        if !fs.proc_root().join(pid.to_string()).is_dir() {
            return None;
        }
        let text = fs::read_to_string(self.dir.join(pid.to_string()).join("status")).unwrap_or_default();
        let listed = text.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"));
        Some(listed.and_then(|l| CpuSet::parse(l.trim()).ok()).unwrap_or_else(|| all_cpus(fs)))
    }

    /// A real process's cgroup is not in the simulated tree: unknown.
    fn cgroup(&self, _fs: &CgroupFs, _pid: u32) -> Option<String> {
        None
    }
}

/// The effective CPUs of cgroup `path` in a simulated cgroupfs under `root`, as the kernel
/// would compute them (Documentation/admin-guide/cgroup-v2.rst, "Cpuset"): the root has the
/// online CPUs of its `cpuset.cpus.effective` less those granted to valid partitions below it;
/// a partition has the CPUs it was granted (`cpuset.cpus.exclusive`, else `cpuset.cpus`) less
/// those of partitions below it; any other cgroup has its `cpuset.cpus` within its parent's
/// effective CPUs, or all of its parent's when that is empty or shares none of them.
///
/// Partitions are looked for in the first level, and in the second below a cgroup that is a
/// partition or grants `cpuset.cpus.exclusive` (the kernel allows no other), which is where
/// cpupoold makes them (`cpupool.slice` and the pool slices). `None` when the cgroup does not
/// exist.
pub fn effective_cpus(root: &Path, path: &CgroupPath) -> Option<CpuSet> {
    if !root.join(path.as_str()).is_dir() {
        return None;
    }
    Some(effective_in(root, Some(path), &partitions(root)))
}

/// The simulated root cgroup's effective CPUs (see [`effective_cpus`]).
pub fn root_effective(root: &Path) -> CpuSet {
    effective_in(root, None, &partitions(root))
}

fn read_list(p: &Path, file: &str) -> CpuSet {
    fs::read_to_string(p.join(file)).ok().and_then(|t| CpuSet::parse(t.trim()).ok()).unwrap_or_default()
}

/// Reads the [`Partitions`] of the simulated cgroupfs under `root`: what [`effective_cpus`]
/// reads besides the `cpuset.cpus` on the way down.
pub fn partitions(root: &Path) -> Partitions {
    let read = read_list;
    let partition_cpus = |p: &Path| -> Option<CpuSet> {
        let status = fs::read_to_string(p.join("cpuset.cpus.partition")).ok()?;
        let word = status.split_whitespace().next()?;
        if !matches!(word, "root" | "isolated") || status.contains("invalid") {
            return None;
        }
        let exclusive = read(p, "cpuset.cpus.exclusive");
        Some(if exclusive.is_empty() { read(p, "cpuset.cpus") } else { exclusive })
    };
    // Valid partitions in the first two levels, by relative path.
    let mut partitions: Vec<(String, CpuSet)> = Vec::new();
    let subdirs = |p: &Path| -> Vec<(String, std::path::PathBuf)> {
        fs::read_dir(p)
            .map(|es| {
                es.filter_map(Result::ok)
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .filter_map(|e| Some((e.file_name().to_str()?.to_owned(), e.path())))
                    .collect()
            })
            .unwrap_or_default()
    };
    for (name, d) in subdirs(root) {
        let partition = partition_cpus(&d);
        // A partition's parent is a partition itself, or grants it CPUs through
        // cpuset.cpus.exclusive (a remote partition): other cgroups hold none below them.
        let grants = partition.is_some() || !read(&d, "cpuset.cpus.exclusive").is_empty();
        if let Some(c) = partition {
            partitions.push((name.clone(), c));
        }
        if !grants {
            continue;
        }
        for (child, cd) in subdirs(&d) {
            if let Some(c) = partition_cpus(&cd) {
                partitions.push((format!("{name}/{child}"), c));
            }
        }
    }
    Partitions(partitions)
}

/// The effective CPUs of `path` (the root for `None`) given the [`Partitions`]: reads the root's
/// `cpuset.cpus.effective` and the `cpuset.cpus` of each cgroup on the way down.
pub fn effective_in(root: &Path, path: Option<&CgroupPath>, partitions: &Partitions) -> CpuSet {
    let partitions = &partitions.0;
    // CPUs granted to partitions strictly below `at` ("" for the root) and not below another
    // partition below it.
    let granted_below = |at: &str| -> CpuSet {
        let below = |p: &str| if at.is_empty() { true } else { p.starts_with(&format!("{at}/")) };
        partitions
            .iter()
            .filter(|(p, _)| below(p))
            .filter(|(p, _)| !partitions.iter().any(|(q, _)| below(q) && p.starts_with(&format!("{q}/"))))
            .fold(CpuSet::new(), |acc, (_, c)| acc.union(c))
    };
    let mut effective = read_list(root, "cpuset.cpus.effective").difference(&granted_below(""));
    let mut at = String::new();
    for comp in path.map(CgroupPath::as_str).unwrap_or_default().split('/').filter(|c| !c.is_empty()) {
        at = if at.is_empty() { comp.to_owned() } else { format!("{at}/{comp}") };
        if let Some((_, granted)) = partitions.iter().find(|(p, _)| *p == at) {
            effective = granted.difference(&granted_below(&at));
            continue;
        }
        effective = below(&effective, &read_list(&root.join(&at), "cpuset.cpus"));
    }
    effective
}

/// The effective CPUs of a cgroup that is not a partition, whose parent has `parent` and
/// which asks for `own` (its `cpuset.cpus`): those within its parent's, or all of its parent's
/// when it asks for none of them.
pub fn below(parent: &CpuSet, own: &CpuSet) -> CpuSet {
    let own = own.intersection(parent);
    if own.is_empty() {
        parent.clone()
    } else {
        own
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::machine::{write_cgroupfs, TopologyShape};

    fn shape(text: &str) -> TopologyShape {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn put(path: &Path, text: &str) -> io::Result<()> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::write(path, text)
    }

    /// The simulated kernel's effective CPUs, on both partition flavours (cgroup-v2.rst).
    #[test]
    fn effective_cpus_follow_the_kernels_rules() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let root = dir.path();
        write_cgroupfs(root, &shape("1x4x2").topology()).unwrap_or_else(|e| panic!("{e}"));
        let p = |s: &str| CgroupPath::new(s).unwrap_or_else(|e| panic!("{e}"));
        let eff = |s: &str| effective_cpus(root, &p(s)).map(|c| c.to_string());
        let put_ = |rel: &str, text: &str| put(&root.join(rel), text).unwrap_or_else(|e| panic!("{e}"));
        // No restriction anywhere: the online CPUs; a list within the parent's; one outside it
        // falls back to all of the parent's.
        put_("work/app/cpuset.cpus", "2-3\n");
        assert_eq!(eff("work").as_deref(), Some("0-7"));
        assert_eq!(eff("work/app").as_deref(), Some("2-3"));
        put_("work/cpuset.cpus", "0-1\n");
        assert_eq!(eff("work/app").as_deref(), Some("0-1"));
        assert_eq!(effective_cpus(root, &p("missing")), None);
        // Linux 6.1: cpupool.slice a root partition of 1-3,5-7, its dp child isolated on 1-2,5-6.
        put_("cpupool.slice/cpuset.cpus", "1-3,5-7\n");
        put_("cpupool.slice/cpuset.cpus.partition", "root\n");
        put_("cpupool.slice/dp/cpuset.cpus", "1-2,5-6\n");
        put_("cpupool.slice/dp/cpuset.cpus.partition", "isolated\n");
        put_("cpupool.slice/web/cpuset.cpus", "3,7\n");
        assert_eq!(root_effective(root).to_string(), "0,4");
        // work asked for 0-1: what remains of it.
        assert_eq!(eff("work").as_deref(), Some("0"));
        assert_eq!(eff("cpupool.slice").as_deref(), Some("3,7"));
        assert_eq!(eff("cpupool.slice/dp").as_deref(), Some("1-2,5-6"));
        assert_eq!(eff("cpupool.slice/web").as_deref(), Some("3,7"));
        // An invalid partition grants nothing.
        put_(
            "cpupool.slice/dp/cpuset.cpus.partition",
            "isolated invalid (Cpu list in cpuset.cpus not exclusive)\n",
        );
        assert_eq!(eff("cpupool.slice").as_deref(), Some("1-3,5-7"));
        // Linux 6.7+: cpupool.slice a member granting cpuset.cpus.exclusive (a remote partition).
        put_("cpupool.slice/cpuset.cpus.partition", "member\n");
        put_("cpupool.slice/cpuset.cpus.exclusive", "1-2,5-6\n");
        put_("cpupool.slice/dp/cpuset.cpus.exclusive", "1-2,5-6\n");
        put_("cpupool.slice/dp/cpuset.cpus.partition", "isolated\n");
        assert_eq!(root_effective(root).to_string(), "0,3-4,7");
        assert_eq!(eff("cpupool.slice").as_deref(), Some("3,7"));
        assert_eq!(eff("cpupool.slice/dp").as_deref(), Some("1-2,5-6"));
    }
}
