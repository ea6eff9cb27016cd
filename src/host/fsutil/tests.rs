use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};

use super::*;

/// Both ways of resolving: `openat2` (this kernel has it) and the walk older kernels get.
const MODES: [Resolve; 2] = [Resolve::Auto, Resolve::Walk];

/// A sandbox-shaped tree: `cgroup/work/app1` a real cgroup, `cgroup/work/app2/cpuset.cpus` a
/// link to a file outside, `cgroup/work/evil` a link to a directory outside. Returns the temp
/// dir, the cgroup root, the outside file and the outside directory.
fn crafted() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let root = dir.path().join("cgroup");
    let outside = dir.path().join("outside");
    fs::create_dir_all(root.join("work/app1")).unwrap_or_else(|e| panic!("{e}"));
    fs::create_dir_all(root.join("work/app2")).unwrap_or_else(|e| panic!("{e}"));
    fs::create_dir_all(&outside).unwrap_or_else(|e| panic!("{e}"));
    fs::write(root.join("work/app1/cpuset.cpus"), "0-7\n").unwrap_or_else(|e| panic!("{e}"));
    let target = outside.join("passwd");
    fs::write(&target, "root:x:0:0\n").unwrap_or_else(|e| panic!("{e}"));
    fs::write(outside.join("cpuset.cpus"), "untouched\n").unwrap_or_else(|e| panic!("{e}"));
    symlink(&target, root.join("work/app2/cpuset.cpus")).unwrap_or_else(|e| panic!("{e}"));
    symlink(&outside, root.join("work/evil")).unwrap_or_else(|e| panic!("{e}"));
    (dir, root, target, outside)
}

fn refused_link(e: &FsError) -> PathBuf {
    let inner = e.source.get_ref().and_then(|i| i.downcast_ref::<SymlinkRefused>());
    let Some(refused) = inner else { panic!("not a symlink refusal: {e:?}") };
    assert!(is_symlink_refusal(&e.source));
    refused.link.clone()
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn writes_existing_files_in_one_write_and_creates_only_when_asked() {
    for mode in MODES {
        let (_dir, root_path, _, _) = crafted();
        let root = Root::new(&root_path).with_resolve(mode);
        root.write("work/app1/cpuset.cpus", b"2-3").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read(&root_path.join("work/app1/cpuset.cpus")), "2-3");
        assert_eq!(root.read_to_string("work/app1/cpuset.cpus").ok().as_deref(), Some("2-3"));
        // A kernel file that is not there is not made up.
        let err = root.write("work/app1/cpuset.mems", b"0").err().unwrap_or_else(|| panic!("{mode:?}"));
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(!root_path.join("work/app1/cpuset.mems").exists());
        assert_eq!(
            err.to_string(),
            format!("writing `{}`", root_path.join("work/app1/cpuset.mems").display())
        );
        root.write_or_create("work/app1/cpuset.mems", b"0", 0o644).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read(&root_path.join("work/app1/cpuset.mems")), "0");
    }
}

#[test]
fn a_plain_file_rewritten_with_a_shorter_value_keeps_nothing_of_the_old() {
    for mode in MODES {
        let (_dir, root_path, _, _) = crafted();
        let root = Root::new(&root_path).with_resolve(mode);
        let path = root_path.join("work/app1/cpuset.cpus");
        root.write_or_create("work/app1/cpuset.cpus", b"504-511,1016-1023", 0o644)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read(&path), "504-511,1016-1023");
        // Shorter: nothing of the old value is left behind.
        root.write_or_create("work/app1/cpuset.cpus", b"\n", 0o644).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read(&path), "\n");
        root.write_or_create("work/app1/cpuset.cpus", b"0-3", 0o644).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read(&path), "0-3");
    }
}

#[test]
fn a_file_symlink_is_refused_and_its_target_keeps_its_bytes() {
    for mode in MODES {
        let (_dir, root_path, target, _) = crafted();
        let root = Root::new(&root_path).with_resolve(mode);
        let link = root_path.join("work/app2/cpuset.cpus");
        for result in [
            root.write("work/app2/cpuset.cpus", b"2-3"),
            root.write_or_create("work/app2/cpuset.cpus", b"2-3", 0o644),
            root.read("work/app2/cpuset.cpus").map(drop),
        ] {
            let err = result.err().unwrap_or_else(|| panic!("{mode:?}: followed the link"));
            assert_eq!(refused_link(&err), link, "{mode:?}");
            assert_eq!(err.path, link);
        }
        assert_eq!(read(&target), "root:x:0:0\n", "{mode:?}");
        let chain = crate::error_chain(
            &root.write("work/app2/cpuset.cpus", b"2-3").err().unwrap_or_else(|| panic!("{mode:?}")),
        );
        assert!(chain.contains("refusing to follow the symbolic link"), "{chain}");
    }
}

#[test]
fn a_directory_symlink_is_refused_for_every_operation() {
    for mode in MODES {
        let (_dir, root_path, _, outside) = crafted();
        let root = Root::new(&root_path).with_resolve(mode);
        let link = root_path.join("work/evil");
        let results = [
            root.write("work/evil/cpuset.cpus", b"2-3"),
            root.write_or_create("work/evil/new", b"x", 0o644),
            root.create_dir("work/evil/sub", 0o755),
            root.create_dir_all("work/evil/a/b", 0o755),
            root.remove_dir("work/evil/x"),
            root.remove_file("work/evil/cpuset.cpus"),
            root.rename("work/app1/cpuset.cpus", "work/evil/moved"),
            root.hard_link("work/app1/cpuset.cpus", "work/evil/linked"),
            root.replace("work/evil/config.toml", b"x", 0o644),
            root.sync_dir("work/evil"),
        ];
        for (i, result) in results.into_iter().enumerate() {
            let err = result.err().unwrap_or_else(|| panic!("{mode:?} #{i}: went through the link"));
            assert_eq!(refused_link(&err), link, "{mode:?} #{i}");
        }
        assert!(!root.exists("work/evil/cpuset.cpus"));
        let names: Vec<_> = fs::read_dir(&outside)
            .unwrap_or_else(|e| panic!("{e}"))
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(names, ["cpuset.cpus", "passwd"], "{mode:?}");
        assert_eq!(read(&outside.join("cpuset.cpus")), "untouched\n");
        assert!(root_path.join("work/app1/cpuset.cpus").exists());
    }
}

#[test]
fn paths_that_leave_the_root_are_refused() {
    for mode in MODES {
        let (_dir, root_path, target, _) = crafted();
        let root = Root::new(&root_path).with_resolve(mode);
        for bad in ["../outside/passwd", "/etc/passwd", "work/../../outside/passwd", "./work", ""] {
            let err = root.write(bad, b"x").err().unwrap_or_else(|| panic!("{mode:?}: {bad}"));
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{bad}");
            assert!(err.source.get_ref().is_some_and(|i| i.is::<NotBeneath>()), "{bad}: {err:?}");
        }
        assert_eq!(read(&target), "root:x:0:0\n");
    }
}

#[test]
fn the_root_itself_may_be_a_link() {
    // The root is configuration (e.g. /var/lib/cpupoold on another disk): it is trusted.
    let (dir, root_path, _, _) = crafted();
    let alias = dir.path().join("alias");
    symlink(&root_path, &alias).unwrap_or_else(|e| panic!("{e}"));
    Root::new(&alias).write("work/app1/cpuset.cpus", b"5").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(read(&root_path.join("work/app1/cpuset.cpus")), "5");
}

#[test]
fn create_and_remove_directories() {
    for mode in MODES {
        let (_dir, root_path, _, outside) = crafted();
        let root = Root::new(&root_path).with_resolve(mode);
        root.create_dir("work/app3", 0o755).unwrap_or_else(|e| panic!("{e}"));
        let again = root.create_dir("work/app3", 0o755).err().map(|e| e.kind());
        assert_eq!(again, Some(io::ErrorKind::AlreadyExists));
        root.create_dir_all("work/app3/a/b", 0o700).unwrap_or_else(|e| panic!("{e}"));
        let m = fs::metadata(root_path.join("work/app3/a/b")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.permissions().mode() & 0o777, 0o700);
        root.remove_dir("work/app3/a/b").unwrap_or_else(|e| panic!("{e}"));
        assert!(!root_path.join("work/app3/a/b").exists());

        // A tree holding links: the links go, what they point at stays.
        fs::write(root_path.join("work/app3/a/file"), "x").unwrap_or_else(|e| panic!("{e}"));
        symlink(&outside, root_path.join("work/app3/a/to-outside")).unwrap_or_else(|e| panic!("{e}"));
        symlink(outside.join("passwd"), root_path.join("work/app3/passwd")).unwrap_or_else(|e| panic!("{e}"));
        root.remove_dir_all("work/app3").unwrap_or_else(|e| panic!("{e}"));
        assert!(!root_path.join("work/app3").exists());
        assert_eq!(read(&outside.join("passwd")), "root:x:0:0\n");
        assert_eq!(read(&outside.join("cpuset.cpus")), "untouched\n");

        // Removing "through" a link removes nothing behind it.
        let err = root.remove_dir_all("work/evil").err().unwrap_or_else(|| panic!("{mode:?}"));
        assert_eq!(refused_link(&err), root_path.join("work/evil"));
        assert!(outside.join("passwd").exists());
        let err = root.remove_dir("work/evil").err().unwrap_or_else(|| panic!("{mode:?}"));
        assert_eq!(refused_link(&err), root_path.join("work/evil"));
        assert!(outside.join("passwd").exists());
    }
}

#[test]
fn replace_is_durable_and_never_writes_through_a_link() {
    for mode in MODES {
        let (dir, _, target, _) = crafted();
        let etc = Root::create(dir.path().join("etc/cpupoold"), 0o755).unwrap_or_else(|e| panic!("{e}"));
        let etc = etc.with_resolve(mode);
        etc.create_dir_all("config.d", 0o755).unwrap_or_else(|e| panic!("{e}"));
        etc.replace("config.d/90-x.toml", b"one\n", 0o644).unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join("etc/cpupoold/config.d/90-x.toml");
        assert_eq!(read(&file), "one\n");
        let m = fs::metadata(&file).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.permissions().mode() & 0o777, 0o644);
        assert!(!dir.path().join("etc/cpupoold/config.d/.90-x.toml.tmp").exists());

        // A link planted at the name is replaced, not written through.
        fs::remove_file(&file).unwrap_or_else(|e| panic!("{e}"));
        symlink(&target, &file).unwrap_or_else(|e| panic!("{e}"));
        // And one at the temporary name is removed, not written through.
        let tmp = dir.path().join("etc/cpupoold/config.d/.90-x.toml.tmp");
        symlink(&target, &tmp).unwrap_or_else(|e| panic!("{e}"));
        etc.replace("config.d/90-x.toml", b"two\n", 0o644).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read(&target), "root:x:0:0\n", "{mode:?}");
        assert!(!fs::symlink_metadata(&file).unwrap_or_else(|e| panic!("{e}")).file_type().is_symlink());
        assert_eq!(read(&file), "two\n");
        assert!(fs::symlink_metadata(&tmp).is_err());

        // A failing step before the rename leaves the old content and no temporary file.
        let err = etc
            .replace_with(Path::new("config.d/90-x.toml"), "x.tmp", b"three\n", 0o644, || {
                Err(FsError { op: "linking", path: PathBuf::from("p"), source: io::Error::other("no") })
            })
            .err()
            .map(|e| e.op);
        assert_eq!(err, Some("linking"));
        assert_eq!(read(&file), "two\n");
        assert!(!dir.path().join("etc/cpupoold/config.d/x.tmp").exists());

        // A symlinked config.d is refused.
        fs::remove_file(&file).unwrap_or_else(|e| panic!("{e}"));
        fs::remove_dir(dir.path().join("etc/cpupoold/config.d")).unwrap_or_else(|e| panic!("{e}"));
        symlink(target.parent().unwrap_or(Path::new("/")), dir.path().join("etc/cpupoold/config.d"))
            .unwrap_or_else(|e| panic!("{e}"));
        let err = etc.replace("config.d/90-x.toml", b"four\n", 0o644).err();
        let err = err.unwrap_or_else(|| panic!("{mode:?}: wrote through config.d"));
        assert_eq!(refused_link(&err), dir.path().join("etc/cpupoold/config.d"));
        let err = etc.create_dir_all("config.d", 0o755).err().unwrap_or_else(|| panic!("{mode:?}"));
        assert_eq!(refused_link(&err), dir.path().join("etc/cpupoold/config.d"));
        assert!(!target.with_file_name("90-x.toml").exists());
    }
}
