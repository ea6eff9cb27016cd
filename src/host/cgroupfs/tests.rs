//! The cgroupfs backend against a temporary directory standing in for the cgroup root, answered
//! by the simulated kernel (`crate::sim`) as the sandbox is.

use super::*;
use crate::core::plan::Partition;

fn cg(s: &str) -> CgroupPath {
    CgroupPath::new(s).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn creates_with_cpuset_enabled_along_the_path_and_writes_files() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let fs_ = crate::sim::cgroupfs(dir.path(), "/proc");
    let p = cg("cpupool.slice/cpupool-dp.slice");
    fs_.apply(&Effect::CreateCgroup(p.clone())).unwrap_or_else(|e| panic!("{e}"));
    for sub in ["", "cpupool.slice"] {
        let ctl = fs::read_to_string(dir.path().join(sub).join("cgroup.subtree_control")).unwrap_or_default();
        assert_eq!(ctl, "+cpuset", "{sub}");
    }
    let set = CpuSet::parse("2-3").unwrap_or_default();
    fs_.apply(&Effect::SetCpus { key: Key::Cgroup(p.clone()), cpus: set.clone(), optional: false })
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        fs::read_to_string(dir.path().join(p.as_str()).join("cpuset.cpus")).unwrap_or_default(),
        "2-3"
    );
    assert_eq!(fs_.read_cpus(&p).ok().flatten(), Some(set));
    assert_eq!(fs_.read_cpus(&cg("nope")).ok().flatten(), None);
    assert_eq!(fs_.children(&cg("cpupool.slice")), vec![p.clone()]);
    // Optional writes to missing cgroups are skipped; required ones fail naming path+data.
    fs_.apply(&Effect::SetCpus {
        key: Key::Cgroup(cg("machine.slice")),
        cpus: CpuSet::range(0, 0),
        optional: true,
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let err = fs_
        .apply(&Effect::SetCpus {
            key: Key::Cgroup(cg("missing/x")),
            cpus: CpuSet::range(0, 1),
            optional: false,
        })
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.starts_with("no cgroup `") && err.ends_with("missing/x`"), "{err}");
    fs_.apply(&Effect::RemoveCgroup(p.clone())).unwrap_or_else(|e| panic!("{e}"));
    assert!(!fs_.exists(&p));
}

/// A missing cpuset.cpus is said as what it is: no cgroup, or a parent without the cpuset
/// controller (enabled by cpupoold below cpupool.slice only), never "Permission denied".
#[test]
fn a_missing_cpuset_file_names_the_cgroup_or_the_parent_without_the_controller() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let fs_ = crate::sim::cgroupfs(dir.path(), "/proc");
    let two = CpuSet::range(2, 2);
    let err = fs_.set_cpus(&cg("nope/x"), &two).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.starts_with("no cgroup `") && err.ends_with("nope/x`"), "{err}");
    // Outside cpupool.slice: the parent's subtree_control lacks cpuset; named, not enabled.
    fs::create_dir_all(dir.path().join("work/app")).unwrap_or_else(|e| panic!("{e}"));
    fs::write(dir.path().join("work/cgroup.subtree_control"), "cpu\n").unwrap_or_else(|e| panic!("{e}"));
    let err = fs_.set_cpus(&cg("work/app"), &two).err();
    assert!(matches!(err, Some(HostError::CpusetNotEnabled { .. })), "{err:?}");
    let text = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(text.contains("work/cgroup.subtree_control"), "{text}");
    assert!(!dir.path().join("work/app/cpuset.cpus").exists());
    assert_eq!(
        fs::read_to_string(dir.path().join("work/cgroup.subtree_control")).unwrap_or_default(),
        "cpu\n"
    );
    // Inside cpupool.slice (ours): enabled along the way, then written.
    fs_.create(&cg("cpupool.slice/cpupool-dp.slice")).unwrap_or_else(|e| panic!("{e}"));
    let slice = dir.path().join("cpupool.slice/cpupool-dp.slice");
    fs::create_dir_all(slice.join("app")).unwrap_or_else(|e| panic!("{e}"));
    fs::write(slice.join("cgroup.subtree_control"), "\n").unwrap_or_else(|e| panic!("{e}"));
    fs_.set_cpus(&cg("cpupool.slice/cpupool-dp.slice/app"), &two).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fs::read_to_string(slice.join("cgroup.subtree_control")).unwrap_or_default(), "+cpuset");
    assert_eq!(fs::read_to_string(slice.join("app/cpuset.cpus")).unwrap_or_default(), "2");
}

#[test]
fn partitions_on_kernels_with_and_without_cpuset_cpus_exclusive() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let fs_ = crate::sim::cgroupfs(dir.path(), "/proc");
    let top = cg("cpupool.slice");
    let dp = cg("cpupool.slice/cpupool-dp.slice");
    fs_.create(&dp).unwrap_or_else(|e| panic!("{e}"));
    let two_three = CpuSet::range(2, 3);
    for p in [&top, &dp] {
        fs::write(dir.path().join(p.as_str()).join("cpuset.cpus"), "2-3\n").unwrap_or_else(|e| panic!("{e}"));
    }
    // Without cpuset.cpus.exclusive (6.1): the parent becomes a root partition.
    fs_.set_partition(&top, &Partition::Parent(two_three.clone())).unwrap_or_else(|e| panic!("{e}"));
    fs_.set_partition(&dp, &Partition::Isolated(two_three.clone())).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fs_.partition_status(&top).as_deref(), Some("root"));
    assert_eq!(fs_.partition_status(&dp).as_deref(), Some("isolated"));
    assert_eq!(fs_.read_partition(&top).ok(), Some(Partition::Parent(two_three.clone())));
    assert_eq!(fs_.read_partition(&dp).ok(), Some(Partition::Isolated(two_three.clone())));
    // An invalid partition reads as a member, so the plan writes it again.
    fs::write(
        dir.path().join(dp.as_str()).join("cpuset.cpus.partition"),
        "isolated invalid (Cpu list in cpuset.cpus not exclusive)\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fs_.read_partition(&dp).ok(), Some(Partition::Member));
    // With it (6.7+): the parent only grants the CPUs.
    for p in [&top, &dp] {
        fs::write(dir.path().join(p.as_str()).join("cpuset.cpus.exclusive"), "\n")
            .unwrap_or_else(|e| panic!("{e}"));
        fs_.set_partition(p, &Partition::Member).unwrap_or_else(|e| panic!("{e}"));
    }
    fs_.set_partition(&top, &Partition::Parent(two_three.clone())).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fs_.partition_status(&top).as_deref(), Some("member"));
    assert_eq!(fs_.read_partition(&top).ok(), Some(Partition::Parent(two_three.clone())));
    fs_.set_partition(&dp, &Partition::Isolated(two_three.clone())).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        fs::read_to_string(dir.path().join(dp.as_str()).join("cpuset.cpus.exclusive")).unwrap_or_default(),
        "2-3"
    );
    assert!(fs_.has_exclusive_file());
}

/// A container's cgroup outside cpupool.slice becomes an isolated partition with its CPUs
/// granted down the kubelet's slices (modelled on the kernel's files: every cpuset cgroup of a
/// 6.7+ kernel has `cpuset.cpus.exclusive`); when it goes back to member, or is gone already,
/// each slice keeps what its other children hold.
#[test]
fn a_containers_partition_is_granted_down_the_kubelets_slices_and_taken_back() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let fs_ = crate::sim::cgroupfs(dir.path(), "/proc");
    let pods = cg("kubepods.slice");
    let pod = cg("kubepods.slice/kubepods-podA.slice");
    let (a, b) = (
        cg("kubepods.slice/kubepods-podA.slice/cri-a.scope"),
        cg("kubepods.slice/kubepods-podA.slice/cri-b.scope"),
    );
    for p in [&pods, &pod, &a, &b] {
        let d = dir.path().join(p.as_str());
        fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
        fs::write(d.join("cpuset.cpus.exclusive"), "\n").unwrap_or_else(|e| panic!("{e}"));
        fs::write(d.join("cpuset.cpus.partition"), "member\n").unwrap_or_else(|e| panic!("{e}"));
    }
    let read = |p: &CgroupPath| {
        fs::read_to_string(dir.path().join(p.as_str()).join("cpuset.cpus.exclusive")).unwrap_or_default()
    };
    fs_.set_partition(&a, &Partition::Isolated(CpuSet::range(3, 3))).unwrap_or_else(|e| panic!("{e}"));
    fs_.set_partition(&b, &Partition::Isolated(CpuSet::range(4, 5))).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (read(&pods), read(&pod), read(&a), read(&b)),
        ("3-5".into(), "3-5".into(), "3".into(), "4-5".into())
    );
    assert_eq!(fs_.partition_status(&a).as_deref(), Some("isolated"));
    fs_.set_partition(&a, &Partition::Member).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((read(&pods), read(&pod), read(&a)), ("4-5".into(), "4-5".into(), "\n".into()));
    // The container went with its cgroup before it was torn down: the slices still give back.
    fs::remove_dir_all(dir.path().join(b.as_str())).unwrap_or_else(|e| panic!("{e}"));
    fs_.set_partition(&b, &Partition::Member).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((read(&pods), read(&pod)), ("\n".into(), "\n".into()));
}

#[test]
fn process_start_time_survives_odd_command_names() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    fs::create_dir_all(dir.path().join("42")).unwrap_or_else(|e| panic!("{e}"));
    // From proc(5): pid (comm) state ppid ... starttime is field 22.
    let fields: Vec<String> = (4..=52).map(|i| i.to_string()).collect();
    let stat = format!("42 (a) b (c)) S {}\n", fields.join(" "));
    fs::write(dir.path().join("42/stat"), stat).unwrap_or_else(|e| panic!("{e}"));
    let fs_ = CgroupFs::new(dir.path(), dir.path());
    assert_eq!(fs_.process_start(42), Some(22));
    assert_eq!(fs_.process_start(43), None);
    let me = CgroupFs::new("/nonexistent", "/proc");
    assert!(me.process_start(std::process::id()).is_some());
}

#[test]
fn affinity_of_a_child_process() {
    let fs_ = CgroupFs::new("/nonexistent", "/proc");
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap_or_else(|e| panic!("{e}"));
    let pid = child.id();
    let before = fs_.affinity(pid).unwrap_or_default();
    let first = before.first().unwrap_or(0);
    let one = CpuSet::range(first, first);
    fs_.set_affinity(pid, &one, false).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fs_.affinity(pid), Some(one));
    // Empty lifts the restriction: back to every CPU the process may use.
    fs_.set_affinity(pid, &CpuSet::new(), false).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fs_.affinity(pid), Some(before));
    let _ = child.kill();
    let _ = child.wait();
    assert!(fs_.set_affinity(pid, &CpuSet::range(0, 0), true).is_ok());
    assert!(fs_.set_affinity(pid, &CpuSet::range(0, 0), false).is_err());
}

/// A simulated root with 8 CPUs, pool slice `cpupool.slice/cpupool-web.slice` on 2-3 and a
/// target `app` below it.
fn sim_tree() -> (tempfile::TempDir, CgroupFs, CgroupPath, CgroupPath) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    fs::write(dir.path().join("cpuset.cpus.effective"), "0-7\n").unwrap_or_else(|e| panic!("{e}"));
    let fs_ = crate::sim::cgroupfs(dir.path(), "/proc");
    let web = cg("cpupool.slice/cpupool-web.slice");
    let app = cg("cpupool.slice/cpupool-web.slice/app");
    fs_.create(&app).unwrap_or_else(|e| panic!("{e}"));
    fs_.set_cpus(&cg("cpupool.slice"), &CpuSet::range(2, 5)).unwrap_or_else(|e| panic!("{e}"));
    fs_.set_cpus(&web, &CpuSet::range(2, 3)).unwrap_or_else(|e| panic!("{e}"));
    (dir, fs_, web, app)
}

fn confined(fs_: &CgroupFs, key: &CgroupPath) -> CpuSet {
    match fs_.confinement(&Key::Cgroup(key.clone())) {
        Ok(Some(c)) => c.cpus,
        other => panic!("{other:?}"),
    }
}

#[test]
fn kept_reads_follow_the_backends_own_writes_and_others_after_a_refresh() {
    let (dir, fs_, web, app) = sim_tree();
    assert_eq!(confined(&fs_, &app), CpuSet::range(2, 3));
    // Written by someone else: kept until the drift check refreshes.
    fs::write(dir.path().join(web.as_str()).join("cpuset.cpus"), "3\n").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(confined(&fs_, &app), CpuSet::range(2, 3));
    crate::host::Backend::refresh(&fs_);
    assert_eq!(confined(&fs_, &app), CpuSet::range(3, 3));
    // Written through the backend: read back at once, the pool slice's and what is below it.
    fs_.set_cpus(&web, &CpuSet::range(2, 3)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(confined(&fs_, &app), CpuSet::range(2, 3));
    fs_.set_cpus(&app, &CpuSet::range(2, 2)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fs_.enforced(&Key::Cgroup(app.clone())).ok().flatten(), Some(CpuSet::range(2, 2)));
    // A target's own CPUs are never kept: read back whoever wrote them.
    fs::write(dir.path().join(app.as_str()).join("cpuset.cpus"), "3\n").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fs_.enforced(&Key::Cgroup(app.clone())).ok().flatten(), Some(CpuSet::range(3, 3)));
    // A target's write leaves its parent's kept CPUs (someone else's change is not seen yet)...
    fs::write(dir.path().join(web.as_str()).join("cpuset.cpus"), "2\n").unwrap_or_else(|e| panic!("{e}"));
    fs_.set_cpus(&app, &CpuSet::range(2, 3)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(confined(&fs_, &app), CpuSet::range(2, 3));
    // ...a new cgroup or a partition written anywhere forgets everything.
    let other = cg("cpupool.slice/cpupool-dp.slice");
    fs_.create(&other).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(confined(&fs_, &app), CpuSet::range(2, 2));
    fs::write(dir.path().join(web.as_str()).join("cpuset.cpus"), "3\n").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(confined(&fs_, &app), CpuSet::range(2, 2));
    fs_.set_partition(&other, &Partition::Member).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(confined(&fs_, &app), CpuSet::range(3, 3));
}

#[test]
fn kept_partition_status_is_forgotten_by_a_write_of_the_pool_level() {
    let (dir, fs_, web, _) = sim_tree();
    fs_.set_partition(&web, &Partition::Isolated(CpuSet::range(2, 3))).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fs_.kept_partition_status(&web).as_deref(), Some("isolated"));
    let file = dir.path().join(web.as_str()).join("cpuset.cpus.partition");
    let invalid = "isolated invalid (Cpu list in cpuset.cpus not exclusive)";
    fs::write(&file, format!("{invalid}\n")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fs_.kept_partition_status(&web).as_deref(), Some("isolated"));
    // The fresh read is the kernel's word, and is kept.
    assert_eq!(fs_.partition_status(&web).as_deref(), Some(invalid));
    assert_eq!(fs_.kept_partition_status(&web).as_deref(), Some(invalid));
    fs::write(&file, "isolated\n").unwrap_or_else(|e| panic!("{e}"));
    fs_.set_cpus(&cg("cpupool.slice"), &CpuSet::range(2, 5)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fs_.kept_partition_status(&web).as_deref(), Some("isolated"));
}
