//! No write goes through a symbolic link: a crafted cgroup tree, state directory or `config.d/`
//! can neither redirect a write of the root daemon nor make it leave its root.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use serde_json::json;

use cpupoold::core::cpuset::CpuSet;
use cpupoold::core::plan::{Effect, Key};
use cpupoold::core::state::CgroupPath;
use cpupoold::engine::error_chain;

fn cg(s: &str) -> CgroupPath {
    CgroupPath::new(s).unwrap_or_else(|e| panic!("{e}"))
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Under `dir`: `outside/` with `passwd` and `cpuset.cpus`, and the links a tenant able to make
/// cgroups could plant in `cgroup_root`: `work/app2/cpuset.cpus -> outside/passwd` and
/// `work/evil -> outside/`. Returns the outside directory.
fn plant(dir: &Path, cgroup_root: &Path) -> PathBuf {
    let outside = dir.join("outside");
    fs::create_dir_all(&outside).unwrap_or_else(|e| panic!("{e}"));
    fs::write(outside.join("passwd"), "root:x:0:0\n").unwrap_or_else(|e| panic!("{e}"));
    fs::write(outside.join("cpuset.cpus"), "untouched\n").unwrap_or_else(|e| panic!("{e}"));
    fs::create_dir_all(cgroup_root.join("work/app2")).unwrap_or_else(|e| panic!("{e}"));
    symlink(outside.join("passwd"), cgroup_root.join("work/app2/cpuset.cpus"))
        .unwrap_or_else(|e| panic!("{e}"));
    symlink(&outside, cgroup_root.join("work/evil")).unwrap_or_else(|e| panic!("{e}"));
    outside
}

fn assert_untouched(outside: &Path) {
    assert_eq!(read(&outside.join("passwd")), "root:x:0:0\n");
    assert_eq!(read(&outside.join("cpuset.cpus")), "untouched\n");
    let mut names: Vec<String> = fs::read_dir(outside)
        .unwrap_or_else(|e| panic!("{e}"))
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["cpuset.cpus", "passwd"]);
}

#[test]
fn cgroupfs_refuses_links_in_a_crafted_tree() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let root = dir.path().join("cgroup");
    let outside = plant(dir.path(), &root);
    let fs_ = cpupoold::sim::cgroupfs(&root, "/proc");
    let set = |path: &str| Effect::SetCpus {
        key: Key::Cgroup(cg(path)),
        cpus: CpuSet::range(2, 3),
        optional: false,
    };
    for effect in [
        set("work/app2"),
        set("work/evil"),
        Effect::SetMems { path: cg("work/evil"), mems: CpuSet::range(0, 0), optional: false },
        Effect::CreateCgroup(cg("work/evil/sub")),
        Effect::RemoveCgroup(cg("work/evil")),
    ] {
        let err = fs_.apply(&effect).err().unwrap_or_else(|| panic!("{effect:?} went through a link"));
        let chain = error_chain(&err);
        assert!(chain.contains("refusing to follow the symbolic link"), "{effect:?}: {chain}");
    }
    let err = fs_.apply(&set("work/app2")).err().map(|e| error_chain(&e)).unwrap_or_default();
    let file = root.join("work/app2/cpuset.cpus");
    assert!(err.starts_with(&format!("writing `2-3` to `{}`", file.display())), "{err}");
    assert!(err.contains(&format!("symbolic link `{}`", file.display())), "{err}");
    let err = fs_.apply(&set("work/evil")).err().map(|e| error_chain(&e)).unwrap_or_default();
    assert!(err.contains(&format!("symbolic link `{}`", root.join("work/evil").display())), "{err}");
    assert_untouched(&outside);
    assert!(fs::symlink_metadata(root.join("work/evil")).is_ok_and(|m| m.file_type().is_symlink()));
}

#[test]
fn the_daemon_refuses_to_write_through_a_planted_link() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = common::Daemon::start(dir.path(), &[]);
    let outside = plant(dir.path(), &d.sb.join("cgroup"));
    let mut v = common::Varlink::connect(&d.varlink);
    for target in ["cgroup:work/app2", "cgroup:work/evil"] {
        let r = v.call("Assign", json!({ "pool": "dp", "target": target, "cpus": 2 }));
        let (name, params) = r.err().unwrap_or_else(|| panic!("{target}: assigned through a link"));
        assert!(name.ends_with(".ApplyFailed"), "{target}: {name} {params}");
        assert!(params.to_string().contains("refusing to follow the symbolic link"), "{target}: {params}");
    }
    assert_untouched(&outside);
    // Nothing was kept: the CPUs are free for a real cgroup.
    let list = v.call("ListAssignments", json!({})).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(list["assignments"], json!([]));
    fs::create_dir_all(d.sb.join("cgroup/work/app1")).unwrap_or_else(|e| panic!("{e}"));
    v.call("Assign", json!({ "pool": "dp", "target": "cgroup:work/app1", "cpus": 2 }))
        .unwrap_or_else(|e| panic!("{e:?}"));
    d.stop();
}
