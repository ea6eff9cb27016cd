use std::fs;
use std::path::Path;

use super::*;
use crate::core::cpuset::CpuSet;
use crate::core::pool::{CpuSource, PoolKind, PoolName, Smt};
use crate::core::topology::Topology;

/// The error and its causes on one line, as main prints them.
use crate::error_chain as chain;

fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{}: {e}", parent.display()));
    }
    fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

struct Tree {
    _tmp: tempfile::TempDir,
    dirs: ConfigDirs,
}

impl Tree {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dirs =
            ConfigDirs { etc: tmp.path().join("etc"), vendor: tmp.path().join("vendor"), cluster: None };
        Tree { _tmp: tmp, dirs }
    }
    fn etc(&self, rel: &str, text: &str) -> &Self {
        write(&self.dirs.etc, rel, text);
        self
    }
    fn vendor(&self, rel: &str, text: &str) -> &Self {
        write(&self.dirs.vendor, rel, text);
        self
    }
    fn etc_path(&self, rel: &str) -> std::path::PathBuf {
        self.dirs.etc.join(rel)
    }
    fn vendor_path(&self, rel: &str) -> std::path::PathBuf {
        self.dirs.vendor.join(rel)
    }
    fn load(&self) -> Settings {
        load(&self.dirs).unwrap_or_else(|e| panic!("{}", chain(&e)))
    }
    fn err(&self) -> ConfigError {
        match load(&self.dirs) {
            Ok(s) => panic!("expected an error, got {s:?}"),
            Err(e) => e,
        }
    }
}

fn ok(text: &str) -> Settings {
    load_str(text, "t.toml").unwrap_or_else(|e| panic!("{}", chain(&e)))
}

fn err(text: &str) -> ConfigError {
    match load_str(text, "t.toml") {
        Ok(s) => panic!("expected an error, got {s:?}"),
        Err(e) => e,
    }
}

fn pool<'a>(s: &'a Settings, name: &str) -> &'a crate::core::pool::PoolSpec {
    s.pools
        .iter()
        .find(|p| p.name.as_str() == name)
        .unwrap_or_else(|| panic!("no pool {name} in {:?}", s.pools))
}

fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap_or_else(|e| panic!("{e}"))
}

const RESERVED: &str = "[pools.sys]\nkind = \"reserved\"\ncount = 1\n";

#[test]
fn defaults() {
    let s = ok("[pools.sys]\nkind = \"reserved\"\ncount = 1\n\
                [pools.dp]\nkind = \"exclusive\"\ncpus = \"2-3\"\n\
                [pools.web]\nkind = \"shared\"\ncount = 2\n");
    assert_eq!(s.paths, Paths::default());
    assert_eq!(s.paths.sysfs_root, Path::new("/sys"));
    assert_eq!(s.paths.cgroup_root, Path::new("/sys/fs/cgroup"));
    assert_eq!(s.paths.state_dir, Path::new("/var/lib/cpupoold"));
    assert_eq!(s.paths.runtime_dir, Path::new("/run/cpupoold"));
    assert_eq!(s.paths.kubelet_dir, Path::new("/var/lib/kubelet"));
    assert_eq!(s.kubelet, Kubelet::default());
    assert_eq!(s.kubelet.resource_prefix, "cpupool.io");
    assert!(s.kubelet.enabled);
    let cgroups: Vec<&str> = s.host_cgroups.iter().map(|c| c.as_str()).collect();
    assert_eq!(cgroups, ["system.slice", "user.slice", "init.scope"]);
    assert_eq!(s.admin_group, "cpupool");
    assert_eq!(s.log_level, log::LevelFilter::Info);
    // Name order, kind defaults from PoolSpec::new.
    let names: Vec<&str> = s.pools.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["dp", "sys", "web"]);
    let sys = pool(&s, "sys");
    assert_eq!(sys.source, CpuSource::Request { count: 1, numa: None });
    assert_eq!((sys.smt, sys.isolate, sys.kubelet), (Smt::Threads, false, false));
    let dp = pool(&s, "dp");
    assert_eq!(dp.source, CpuSource::List(set("2-3")));
    assert_eq!((dp.smt, dp.isolate, dp.kubelet), (Smt::FullCores, false, true));
    let web = pool(&s, "web");
    assert_eq!((web.smt, web.isolate, web.kubelet), (Smt::Threads, false, true));
    assert_eq!(ConfigDirs::default().etc, Path::new("/etc/cpupoold"));
    assert_eq!(ConfigDirs::default().vendor, Path::new("/usr/lib/cpupoold"));
}

#[test]
fn every_key_is_read() {
    let s = ok(r#"
        [paths]
        sysfs_root = "/s"
        cgroup_root = "/c"
        state_dir = "/st"
        runtime_dir = "/r"
        kubelet_dir = "/k"
        [daemon]
        host_cgroups = ["system.slice", "machine.slice/"]
        admin_group = "wheel"
        log_level = "trace"
        [pools.sys]
        kind = "reserved"
        isolcpus = false
        cpus = "0"
        [pools.dp]
        kind = "exclusive"
        count = 4
        numa = 1
        smt = "threads"
        isolate = true
        kubelet = false
        [pools.iso]
        kind = "exclusive"
        isolcpus = true
        [kubelet]
        enabled = false
        resource_prefix = "cpu.example.com"
        millicpus_per_device = 250
        release_grace_ms = 0
        reconcile_interval_ms = 100
        runtime_endpoint = "/run/crio/crio.sock"
        confine_unpooled = false
        nri = false
        nri_socket = "/run/nri/other.sock"
    "#);
    assert_eq!(
        s.kubelet,
        Kubelet {
            enabled: false,
            resource_prefix: "cpu.example.com".into(),
            millicpus_per_device: 250,
            release_grace: std::time::Duration::ZERO,
            reconcile_interval: std::time::Duration::from_millis(100),
            runtime_endpoint: "/run/crio/crio.sock".into(),
            confine_unpooled: false,
            nri: false,
            nri_socket: "/run/nri/other.sock".into(),
        }
    );
    assert_eq!(s.origins.get("kubelet.millicpus_per_device"), Some(Path::new("t.toml")));
    assert_eq!(
        s.paths,
        Paths {
            sysfs_root: "/s".into(),
            cgroup_root: "/c".into(),
            state_dir: "/st".into(),
            runtime_dir: "/r".into(),
            kubelet_dir: "/k".into(),
            cdi_dir: "/var/run/cdi".into(),
            procfs_root: "/proc".into(),
            irqbalance_dir: "/run/irqbalance".into(),
            resctrl_root: "/sys/fs/resctrl".into(),
            kernel: crate::host::kernel::Kernel::HOST,
        }
    );
    let cgroups: Vec<&str> = s.host_cgroups.iter().map(|c| c.as_str()).collect();
    assert_eq!(cgroups, ["system.slice", "machine.slice"]);
    assert_eq!(s.admin_group, "wheel");
    assert_eq!(s.log_level, log::LevelFilter::Trace);
    assert_eq!(pool(&s, "sys").source, CpuSource::List(set("0")));
    let dp = pool(&s, "dp");
    assert_eq!(dp.source, CpuSource::Request { count: 4, numa: Some(1) });
    assert_eq!((dp.smt, dp.isolate, dp.kubelet), (Smt::Threads, true, false));
    assert_eq!(pool(&s, "iso").source, CpuSource::Isolcpus);
    assert_eq!(s.origins.get("pools.dp.numa"), Some(Path::new("t.toml")));
    assert_eq!(s.origins.get("daemon.log_level"), Some(Path::new("t.toml")));
    assert_eq!(s.origins.get("daemon.admin_group"), Some(Path::new("t.toml")));
}

#[test]
fn merge_order_and_masking() {
    let t = Tree::new();
    t.vendor("config.d/10-base.toml", "[daemon]\nlog_level = \"trace\"\nadmin_group = \"vendor\"\n")
        .vendor("config.d/20-masked.toml", "[paths]\nstate_dir = \"/from-vendor\"\n")
        .vendor("config.d/30-nulled.toml", "this is not toml")
        .vendor("config.d/README", "not a fragment")
        .vendor("config.d/.hidden.toml", "not toml either")
        .etc("config.toml", &format!("{RESERVED}[daemon]\nlog_level = \"debug\"\n"))
        .etc("config.d/20-masked.toml", "[paths]\nruntime_dir = \"/from-etc\"\n")
        .etc("config.d/40-last.toml", "[daemon]\nlog_level = \"warn\"\n")
        .etc("config.d/05-first.toml", "[daemon]\nlog_level = \"error\"\n")
        .etc("config.d/notes.txt", "ignored");
    fs::create_dir_all(t.etc_path("config.d/dir.toml")).unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink("/dev/null", t.etc_path("config.d/30-nulled.toml"))
        .unwrap_or_else(|e| panic!("{e}"));

    let files = t.dirs.files().unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(
        files,
        [
            t.vendor_path("config.d/10-base.toml"),
            t.etc_path("config.toml"),
            t.etc_path("config.d/05-first.toml"),
            t.etc_path("config.d/20-masked.toml"),
            t.etc_path("config.d/30-nulled.toml"),
            t.etc_path("config.d/40-last.toml"),
        ]
    );

    let s = t.load();
    // etc drop-ins come after config.toml, whatever their names.
    assert_eq!(s.log_level, log::LevelFilter::Warn);
    assert_eq!(s.origins.get("daemon.log_level"), Some(t.etc_path("config.d/40-last.toml").as_path()));
    // A key only the vendor sets survives.
    assert_eq!(s.admin_group, "vendor");
    assert_eq!(s.origins.get("daemon.admin_group"), Some(t.vendor_path("config.d/10-base.toml").as_path()));
    // The masked vendor file was not read at all.
    assert_eq!(s.paths.state_dir, Path::new("/var/lib/cpupoold"));
    assert_eq!(s.origins.get("paths.state_dir"), None);
    assert_eq!(s.paths.runtime_dir, Path::new("/from-etc"));
    assert_eq!(s.origins.get("pools.sys.kind"), Some(t.etc_path("config.toml").as_path()));
}

#[test]
fn missing_directories_are_fine() {
    let t = Tree::new();
    assert_eq!(t.dirs.files().unwrap_or_else(|e| panic!("{}", chain(&e))), Vec::<PathBuf>::new());
    let e = t.err();
    assert!(matches!(e, ConfigError::NoPools { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "no pool is configured: at least a [pools.NAME] table with kind = \"reserved\" is needed \
         (files read: none)"
    );
    // Only drop-ins, no config.toml.
    t.vendor("config.d/50-pools.toml", RESERVED);
    assert_eq!(t.load().pools.len(), 1);
}

#[test]
fn pools_merge_field_by_field() {
    let t = Tree::new();
    t.vendor(
        "config.d/50-dp.toml",
        "[pools.dp]\nkind = \"exclusive\"\ncount = 4\nnuma = 1\nisolate = true\n\
         [pools.web]\nkind = \"shared\"\ncount = 2\nnuma = 0\n\
         [pools.moved]\nkind = \"shared\"\ncount = 2\nnuma = 0\n",
    )
    .etc("config.toml", RESERVED)
    .etc("config.d/10-kubelet.toml", "[pools.dp]\nkubelet = false\n")
    .etc("config.d/20-size.toml", "[pools.dp]\ncount = 6\n")
    .etc("config.d/30-web.toml", "[pools.web]\ncpus = \"2-3\"\n")
    .etc("config.d/40-moved.toml", "[pools.moved]\nnuma = 1\n");
    let s = t.load();
    let vendor = t.vendor_path("config.d/50-dp.toml");
    let origin = |key: &str| s.origins.get(key).map(Path::to_owned);

    let dp = pool(&s, "dp");
    assert_eq!(dp.kind, PoolKind::Exclusive);
    // count came with no numa, so the source is count = 6 anywhere.
    assert_eq!(dp.source, CpuSource::Request { count: 6, numa: None });
    assert!(dp.isolate);
    assert!(!dp.kubelet);
    assert_eq!(origin("pools.dp.kind"), Some(vendor.clone()));
    assert_eq!(origin("pools.dp.isolate"), Some(vendor.clone()));
    assert_eq!(origin("pools.dp.kubelet"), Some(t.etc_path("config.d/10-kubelet.toml")));
    assert_eq!(origin("pools.dp.count"), Some(t.etc_path("config.d/20-size.toml")));
    assert_eq!(origin("pools.dp.numa"), None);
    assert_eq!(origin("pools.dp"), Some(t.etc_path("config.d/20-size.toml")));

    // cpus replaces the vendor's count and numa instead of clashing with them.
    let web = pool(&s, "web");
    assert_eq!(web.source, CpuSource::List(set("2-3")));
    assert_eq!(origin("pools.web.cpus"), Some(t.etc_path("config.d/30-web.toml")));
    assert_eq!(origin("pools.web.count"), None);
    assert_eq!(origin("pools.web.kind"), Some(vendor.clone()));

    // numa alone moves the counted request.
    assert_eq!(pool(&s, "moved").source, CpuSource::Request { count: 2, numa: Some(1) });
    assert_eq!(origin("pools.moved.count"), Some(vendor));
    assert_eq!(origin("pools.moved.numa"), Some(t.etc_path("config.d/40-moved.toml")));
}

#[test]
fn fragments_in_memory_merge_like_files() {
    let frags = [
        ("vendor/50-dp.toml", "[pools.dp]\nkind = \"exclusive\"\ncount = 4\n"),
        ("etc/config.toml", RESERVED),
        ("etc/config.d/20-size.toml", "[pools.dp]\ncount = 6\n"),
    ];
    let s = load_strs(&frags).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(pool(&s, "dp").source, CpuSource::Request { count: 6, numa: None });
    assert_eq!(s.origins.get("pools.dp.kind"), Some(Path::new("vendor/50-dp.toml")));
    assert_eq!(s.origins.get("pools.dp.count"), Some(Path::new("etc/config.d/20-size.toml")));
    let bad = [("a.toml", RESERVED), ("b.toml", "[pools.dp]\nkind = \"exclusive\"\ncont = 4\n")];
    let e = load_strs(&bad).err().unwrap_or_else(|| panic!("a typo loaded"));
    assert_eq!(e.file(), Some(Path::new("b.toml")), "{e}");
}

#[test]
fn display_puts_file_and_key_first() {
    let t = Tree::new();
    t.etc("config.toml", RESERVED).etc("config.d/10-dp.toml", "[pools.dp]\nkind = \"shared\"\ncount = 0\n");
    let e = t.err();
    assert_eq!(
        e.to_string(),
        format!("`{}`: pools.dp.count: must be at least 1", t.etc_path("config.d/10-dp.toml").display())
    );
    assert_eq!(e.file(), Some(t.etc_path("config.d/10-dp.toml").as_path()));
    assert_eq!(e.key(), Some("pools.dp.count"));
}

/// Each case: the fragment, the key the error must name, and a piece of its message.
#[test]
fn every_validation_error_names_file_and_key() {
    let cases: &[(&str, &str, &str)] = &[
        ("[pools.dp]\ncount = 2\n", "pools.dp.kind", "missing"),
        ("[pools.dp]\nkind = \"shared\"\n", "pools.dp", "no CPU source"),
        ("[pools.dp]\nkind = \"shared\"\nisolcpus = false\n", "pools.dp", "no CPU source"),
        ("[pools.dp]\nkind = \"shared\"\ncount = 2\ncpus = \"1\"\n", "pools.dp.cpus", "only one of"),
        ("[pools.dp]\nkind = \"exclusive\"\ncount = 2\nisolcpus = true\n", "pools.dp.count", "only one of"),
        ("[pools.dp]\nkind = \"shared\"\ncpus = \"1\"\nnuma = 0\n", "pools.dp.numa", "only applies to count"),
        ("[pools.dp]\nkind = \"exclusive\"\nisolcpus = true\nnuma = 0\n", "pools.dp.numa", "only applies"),
        ("[pools.dp]\nkind = \"shared\"\ncount = 0\n", "pools.dp.count", "must be at least 1"),
        ("[pools.\"Bad-Name\"]\nkind = \"shared\"\ncount = 1\n", "pools.Bad-Name", "only a-z, 0-9 and _"),
        ("[pools.\"a.b\"]\nkind = \"shared\"\ncount = 1\n", "pools.\"a.b\"", "only a-z"),
        ("[pools.dp]\nkind = \"shared\"\ncpus = \"0-3,x\"\n", "pools.dp.cpus", "`x` is not a CPU number"),
        ("[pools.dp]\nkind = \"shared\"\ncpus = \"3-1\"\n", "pools.dp.cpus", "`3-1` is reversed"),
        ("[paths]\nstate_dir = \"var/lib\"\n", "paths.state_dir", "`var/lib` must be an absolute path"),
        ("[paths]\nsysfs_root = \"sys\"\n", "paths.sysfs_root", "absolute"),
        ("[paths]\ncgroup_root = \".\"\n", "paths.cgroup_root", "absolute"),
        ("[paths]\nruntime_dir = \"run\"\n", "paths.runtime_dir", "absolute"),
        ("[paths]\nkubelet_dir = \"\"\n", "paths.kubelet_dir", "absolute"),
        ("[daemon]\nhost_cgroups = [\"system.slice\", \"/abs\"]\n", "daemon.host_cgroups[1]", "no leading /"),
        ("[daemon]\nhost_cgroups = [\"a/../b\"]\n", "daemon.host_cgroups[0]", ". or .."),
        ("[daemon]\nlog_level = \"verbose\"\n", "daemon.log_level", "`verbose` is not one of"),
        ("[daemon]\nadmin_group = \"\"\n", "daemon.admin_group", "not a group name"),
        ("[daemon]\nadmin_group = \"a b\"\n", "daemon.admin_group", "not a group name"),
        ("[kubelet]\nresource_prefix = \"Cpu.IO\"\n", "kubelet.resource_prefix", "not a DNS subdomain"),
        ("[kubelet]\nresource_prefix = \"a..b\"\n", "kubelet.resource_prefix", "not a DNS subdomain"),
        ("[kubelet]\nresource_prefix = \"kubernetes.io\"\n", "kubelet.resource_prefix", "reserved"),
        ("[kubelet]\nmillicpus_per_device = 300\n", "kubelet.millicpus_per_device", "must divide 1000"),
        ("[kubelet]\nmillicpus_per_device = 5\n", "kubelet.millicpus_per_device", "at least 10"),
        ("[kubelet]\nmillicpus_per_device = 2000\n", "kubelet.millicpus_per_device", "must divide"),
        ("[kubelet]\nreconcile_interval_ms = 0\n", "kubelet.reconcile_interval_ms", "between 10"),
        ("[kubelet]\nrelease_grace_ms = 99999999999\n", "kubelet.release_grace_ms", "at most"),
        ("[kubelet]\nruntime_endpoint = \"containerd.sock\"\n", "kubelet.runtime_endpoint", "absolute"),
        ("[k8s]\nkubeconfig = \"kube/config\"\n", "k8s.kubeconfig", "must be an absolute path"),
        ("[k8s]\nnode_name = \"Node_1\"\n", "k8s.node_name", "is not a node name"),
        ("[k8s]\nnode_name = \"\"\n", "k8s.node_name", "is not a node name"),
        ("[k8s]\nnamespace = \"a.b\"\n", "k8s.namespace", "is not a namespace name"),
        ("[k8s]\nreport_interval_ms = 1\n", "k8s.report_interval_ms", "between 10 and 3600000"),
    ];
    for (text, key, reason) in cases {
        // With a valid reserved pool beside it, the case's key is the only thing wrong.
        let e = err(&format!("{RESERVED}{text}"));
        let msg = chain(&e);
        assert!(msg.starts_with(&format!("`t.toml`: {key}")), "{text:?}: {msg}");
        assert_eq!(e.key(), Some(*key), "{text:?}: {msg}");
        assert!(msg.contains(reason), "{text:?}: {msg}");
    }
}

#[test]
fn validation_errors_name_the_file_that_set_the_key() {
    let t = Tree::new();
    t.vendor("config.d/10-dp.toml", "[pools.dp]\nkind = \"shared\"\ncpus = \"1\"\n")
        .etc("config.toml", RESERVED)
        .etc("config.d/50-numa.toml", "[pools.dp]\nnuma = 1\n");
    let e = t.err();
    assert_eq!(e.file(), Some(t.etc_path("config.d/50-numa.toml").as_path()), "{e}");
    assert_eq!(e.key(), Some("pools.dp.numa"));

    // A pool an admin drop-in starts without a kind.
    let t = Tree::new();
    t.etc("config.toml", RESERVED).etc("config.d/50-new.toml", "[pools.new]\ncount = 1\n");
    let e = t.err();
    assert_eq!(e.file(), Some(t.etc_path("config.d/50-new.toml").as_path()), "{e}");
    assert_eq!(e.key(), Some("pools.new.kind"));

    // A bad cpus list is an error even when a later file overrides it.
    let t = Tree::new();
    t.vendor("config.d/10-dp.toml", "[pools.dp]\nkind = \"shared\"\ncpus = \"one\"\n")
        .etc("config.toml", &format!("{RESERVED}[pools.dp]\ncount = 1\n"));
    let e = t.err();
    assert!(matches!(e, ConfigError::Cpus { .. }), "{e:?}");
    assert_eq!(e.file(), Some(t.vendor_path("config.d/10-dp.toml").as_path()));
    assert!(chain(&e).ends_with("pools.dp.cpus: `one` is not a CPU number or range (expected e.g. `0-3,8`)"));
}

#[test]
fn unknown_fields_are_rejected_by_key() {
    for (text, key, line) in [
        ("[pools.dp]\nkind = \"shared\"\ncont = 4\n", "pools.dp.cont", 3),
        ("[paths]\nstate = \"/x\"\n", "paths.state", 2),
        ("[daemon]\nloglevel = \"info\"\n", "daemon.loglevel", 2),
        ("[kubelet]\nprefix = \"x\"\n", "kubelet.prefix", 2),
        ("\n[pool.dp]\nkind = \"shared\"\n", "pool", 2),
    ] {
        let e = err(text);
        let ConfigError::Parse { file, pos, key: k, .. } = &e else { panic!("{e:?}") };
        assert_eq!(file, Path::new("t.toml"));
        assert_eq!(k, key);
        assert_eq!(pos.map(|p| p.0), Some(line), "{}", chain(&e));
        assert!(chain(&e).contains("unknown field"), "{}", chain(&e));
    }
    let e = err("[pools.dp]\nkind = \"shared\"\ncont = 4\n");
    assert_eq!(
        chain(&e),
        "`t.toml`:3:1: pools.dp.cont: unknown field `cont`, expected one of `kind`, `cpus`, `count`, \
         `numa`, `isolcpus`, `smt`, `isolate`, `kubelet`, `enforce_quota`, `dra`, `removed`, `irq`, `irq_claim`, \
         `cache`, `power`"
    );
}

#[test]
fn wrong_types_and_values_name_the_key() {
    for (text, key, reason) in [
        ("[pools.dp]\ncount = -1\n", "pools.dp.count", "expected u32"),
        ("[pools.dp]\ncount = \"4\"\n", "pools.dp.count", "expected u32"),
        ("[pools.dp]\nkind = \"big\"\n", "pools.dp.kind", "unknown variant `big`"),
        ("[pools.dp]\nsmt = \"cores\"\n", "pools.dp.smt", "unknown variant `cores`"),
        ("[pools.dp]\ncpus = 3\n", "pools.dp.cpus", "expected a string"),
        ("[daemon]\nhost_cgroups = [\"a\", 3]\n", "daemon.host_cgroups[1]", "expected a string"),
        ("[daemon]\nhost_cgroups = \"a\"\n", "daemon.host_cgroups", "expected a sequence"),
    ] {
        let e = err(text);
        assert!(matches!(e, ConfigError::Parse { .. }), "{e:?}");
        assert_eq!(e.key(), Some(key), "{}", chain(&e));
        assert!(chain(&e).contains(reason), "{}", chain(&e));
    }
}

#[test]
fn bad_toml_names_the_file() {
    let t = Tree::new();
    t.etc("config.toml", RESERVED).etc("config.d/20-broken.toml", "[pools.dp\nkind = 1\n");
    let e = t.err();
    let file = t.etc_path("config.d/20-broken.toml");
    assert_eq!(e.file(), Some(file.as_path()));
    let msg = chain(&e);
    assert!(msg.starts_with(&format!("`{}`:1:", file.display())), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");

    // Duplicate keys are a syntax error too.
    let e = err("[pools.dp]\ncount = 1\ncount = 2\n");
    assert!(chain(&e).contains("duplicate key"), "{}", chain(&e));
}

#[test]
fn unreadable_files_name_the_file() {
    let t = Tree::new();
    t.etc("config.toml", RESERVED);
    fs::create_dir_all(t.etc_path("config.d")).unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink("/nonexistent/x", t.etc_path("config.d/10-dangling.toml"))
        .unwrap_or_else(|e| panic!("{e}"));
    let e = t.err();
    assert!(matches!(e, ConfigError::Read { .. }), "{e:?}");
    assert_eq!(e.file(), Some(t.etc_path("config.d/10-dangling.toml").as_path()));

    // Not UTF-8.
    let t = Tree::new();
    t.etc("config.toml", "");
    fs::write(t.etc_path("config.toml"), b"\xff\xfe").unwrap_or_else(|e| panic!("{e}"));
    let e = t.err();
    assert!(matches!(e, ConfigError::Read { .. }), "{e:?}");
    assert_eq!(e.file(), Some(t.etc_path("config.toml").as_path()));
}

#[test]
fn resolve_errors_name_the_file_that_set_the_key() {
    let topo = Topology::synthetic(1, 4, 2, 1); // CPUs 0-7, siblings c and c+4, node 0
    let t = Tree::new();
    t.vendor("config.d/10-dp.toml", "[pools.dp]\nkind = \"exclusive\"\ncount = 2\nnuma = 0\n")
        .etc("config.toml", RESERVED)
        .etc("config.d/50-numa.toml", "[pools.dp]\nnuma = 3\n");
    let e = t.load().resolve_pools(&topo).err().unwrap_or_else(|| panic!("resolved"));
    assert_eq!(e.file(), Some(t.etc_path("config.d/50-numa.toml").as_path()));
    assert_eq!(e.key(), Some("pools.dp.numa"));
    let source = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<PoolError>());
    assert!(matches!(source, Some(PoolError::UnknownNode { node: 3, .. })), "{e:?}");
    assert_eq!(
        chain(&e),
        format!(
            "`{}`: pools.dp.numa: pool `dp`: numa: node 3 does not exist (nodes: 0)",
            t.etc_path("config.d/50-numa.toml").display()
        )
    );

    // One fragment per case: the key the error must name.
    let cases: &[(&str, &str)] = &[
        ("[pools.a]\nkind = \"shared\"\ncpus = \"6-9\"\n", "pools.a.cpus"),
        ("[pools.a]\nkind = \"exclusive\"\ncpus = \"1-2\"\n", "pools.a.cpus"),
        ("[pools.a]\nkind = \"shared\"\ncount = 9\n", "pools.a.count"),
        ("[pools.a]\nkind = \"exclusive\"\ncount = 3\n", "pools.a.count"),
        ("[pools.a]\nkind = \"shared\"\ncpus = \"1\"\nisolate = true\n", "pools.a.isolate"),
        ("[pools.a]\nkind = \"shared\"\nisolcpus = true\n", "pools.a.isolcpus"),
        ("[pools.a]\nkind = \"exclusive\"\nisolcpus = true\n", "pools.a.isolcpus"),
        ("[pools.a]\nkind = \"shared\"\ncpus = \"\"\n", "pools.a.cpus"),
        ("[pools.a]\nkind = \"reserved\"\ncount = 1\n", "pools.sys.kind"),
        ("[pools.a]\nkind = \"shared\"\ncpus = \"0-7\"\n", "pools.sys.count"),
        (
            "[pools.a]\nkind = \"shared\"\ncpus = \"1-2\"\n[pools.b]\nkind = \"shared\"\ncpus = \"2-3\"\n",
            "pools.b.cpus",
        ),
    ];
    for (text, key) in cases {
        let t = Tree::new();
        t.etc("config.toml", RESERVED).etc("config.d/50-case.toml", text);
        let s = t.load();
        let e = s.resolve_pools(&topo).err().unwrap_or_else(|| panic!("{text:?} resolved"));
        assert_eq!(e.key(), Some(*key), "{text:?}: {}", chain(&e));
        let want = s.origins.get(key).map(Path::to_owned);
        assert!(want.is_some(), "{key}");
        assert_eq!(e.file(), want.as_deref(), "{text:?}: {}", chain(&e));
    }

    // No reserved pool: no single file is at fault.
    let s = ok("[pools.a]\nkind = \"shared\"\ncount = 1\n");
    let e = s.resolve_pools(&topo).err().unwrap_or_else(|| panic!("resolved"));
    assert_eq!((e.file(), e.key()), (None, Some("pools")));
    assert_eq!(chain(&e), "pools: no reserved pool: exactly one pool must have kind = \"reserved\"");

    // Kernel-isolated CPUs that split cores: the isolcpus key is at fault.
    let mut data = topo.data().clone();
    data.isolated = set("1");
    let odd = Topology::new(data);
    let s = ok(&format!("{RESERVED}[pools.a]\nkind = \"exclusive\"\nisolcpus = true\n"));
    let e = s.resolve_pools(&odd).err().unwrap_or_else(|| panic!("resolved"));
    assert_eq!(e.key(), Some("pools.a.isolcpus"), "{}", chain(&e));
}

#[test]
fn a_reserved_pool_the_kernel_isolated_leaves_no_housekeeping_cpu() {
    let mut data = Topology::synthetic(1, 4, 1, 1).data().clone();
    data.isolated = set("0-1");
    let topo = Topology::new(data);
    let s = ok("[pools.sys]\nkind = \"reserved\"\ncpus = \"0-1\"\n[pools.dp]\nkind = \"exclusive\"\ncpus = \"2-3\"\nisolate = true\n");
    let e = s.resolve_pools(&topo).err().unwrap_or_else(|| panic!("resolved"));
    assert_eq!(e.key(), Some("pools.sys.cpus"), "{}", chain(&e));
    assert!(chain(&e).contains("no housekeeping CPU"), "{}", chain(&e));
    // One CPU the kernel left alone is enough.
    let s = ok(
        "[pools.sys]\nkind = \"reserved\"\ncpus = \"0-2\"\n[pools.dp]\nkind = \"exclusive\"\ncpus = \"3\"\n",
    );
    assert!(s.resolve_pools(&topo).is_ok());
}

#[test]
fn resolves() {
    let s = ok(&format!(
        "{RESERVED}[pools.dp]\nkind = \"exclusive\"\ncount = 2\n[pools.web]\nkind = \"shared\"\ncpus = \"3,7\"\n"
    ));
    let pools = s.resolve_pools(&Topology::synthetic(1, 4, 2, 1)).unwrap_or_else(|e| panic!("{}", chain(&e)));
    let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["dp", "sys", "web"]);
    assert_eq!(pools.iter().map(|p| p.cpus.len()).sum::<usize>(), 8);
    assert_eq!(pools[2].cpus, set("3,7"));
    assert_eq!(pools[0].name, PoolName::new("dp").unwrap_or_else(|e| panic!("{e}")));
}

const SHIPPED: &str = include_str!("../../packaging/config.toml");

#[test]
fn shipped_config_loads_and_resolves() {
    let s = load_str(SHIPPED, "/etc/cpupoold/config.toml").unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(s.pools.len(), 1);
    let reserved = &s.pools[0];
    assert_eq!(reserved.kind, PoolKind::Reserved);
    for topo in [Topology::synthetic(1, 1, 1, 1), Topology::synthetic(2, 8, 2, 2)] {
        let pools = s.resolve_pools(&topo).unwrap_or_else(|e| panic!("{}", chain(&e)));
        assert_eq!(pools.len(), 1);
        assert_eq!(pools[0].cpus, topo.online(), "leftover CPUs join the reserved pool");
    }
}

/// Every `# key = value` and `# [table]` line in the shipped file is valid and shows the default:
/// uncommenting them all still loads, and the defaults shown match the real ones.
#[test]
fn shipped_config_comments_are_valid() {
    let uncommented: String = SHIPPED
        .lines()
        .map(|line| match line.strip_prefix("# ") {
            Some(rest)
                if rest.starts_with('[')
                    || rest.split_once(" = ").is_some_and(|(k, _)| {
                        !k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                    }) =>
            {
                rest
            }
            _ => line,
        })
        .map(|line| format!("{line}\n"))
        .collect();
    let s = load_str(&uncommented, "uncommented.toml").unwrap_or_else(|e| panic!("{}", chain(&e)));
    let defaults = ok(RESERVED);
    assert_eq!(s.paths, defaults.paths);
    assert_eq!(s.host_cgroups, defaults.host_cgroups);
    assert_eq!(s.admin_group, defaults.admin_group);
    assert_eq!(s.log_level, defaults.log_level);
    assert_eq!(s.k8s, defaults.k8s);
    assert_eq!(s.metrics, defaults.metrics);
    for key in [
        "metrics.enabled",
        "metrics.listen",
        "k8s.enabled",
        "k8s.kubeconfig",
        "k8s.report_interval_ms",
        "paths.sysfs_root",
        "paths.cgroup_root",
        "paths.state_dir",
        "paths.runtime_dir",
        "paths.kubelet_dir",
        "daemon.host_cgroups",
        "daemon.admin_group",
        "daemon.log_level",
        "pools.dp.numa",
        "pools.web.cpus",
        "pools.dp.isolate",
    ] {
        assert!(s.origins.get(key).is_some(), "{key} is not shown in the shipped config");
    }
    let reserved = pool(&s, "reserved");
    assert_eq!(reserved, pool(&load_str(SHIPPED, "x").unwrap_or_else(|e| panic!("{e}")), "reserved"));
    assert!(pool(&s, "dp").isolate);
    let pools = s.resolve_pools(&Topology::synthetic(1, 8, 2, 1)).unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(pools.len(), 3);
}

#[test]
fn k8s_defaults_and_keys() {
    let s = ok(RESERVED);
    assert_eq!(s.k8s, K8s::default());
    assert!(!s.k8s.enabled);
    assert_eq!(s.k8s.report_interval, std::time::Duration::from_millis(DEFAULT_REPORT_INTERVAL_MS));
    assert_eq!(
        (s.k8s.kubeconfig.as_ref(), s.k8s.node_name.as_ref(), s.k8s.namespace.as_ref()),
        (None, None, None)
    );

    let s = ok(&format!(
        "{RESERVED}[k8s]\nenabled = true\nkubeconfig = \"/etc/cpupoold/kubeconfig\"\n\
         node_name = \"worker-1.example\"\nnamespace = \"kube-system\"\nreport_interval_ms = 500\n"
    ));
    assert_eq!(
        s.k8s,
        K8s {
            enabled: true,
            kubeconfig: Some("/etc/cpupoold/kubeconfig".into()),
            node_name: Some("worker-1.example".into()),
            namespace: Some("kube-system".into()),
            report_interval: std::time::Duration::from_millis(500),
        }
    );
    assert_eq!(s.origins.get("k8s.report_interval_ms"), Some(Path::new("t.toml")));
    // Parse errors name the key too.
    for (text, key, reason) in [
        ("enabled = \"yes\"", "k8s.enabled", "expected a boolean"),
        ("node = \"x\"", "k8s.node", "unknown field `node`"),
    ] {
        let e = err(&format!("{RESERVED}[k8s]\n{text}\n"));
        assert_eq!(e.key(), Some(key), "{text}");
        assert!(chain(&e).contains(reason), "{text}: {}", chain(&e));
    }
    // Empty: the in-cluster account.
    let s = ok(&format!("{RESERVED}[k8s]\nkubeconfig = \"\"\n"));
    assert_eq!(s.k8s.kubeconfig, None);
}

#[test]
fn the_cluster_fragment_is_merged_last() {
    let t = Tree::new();
    t.etc("config.toml", &format!("{RESERVED}[daemon]\nlog_level = \"warn\"\n"))
        // Named after `cluster.toml` in lexical order: still read before it.
        .etc("config.d/zz-local.toml", "[daemon]\nlog_level = \"error\"\nadmin_group = \"local\"\n");
    let mut dirs = t.dirs.clone();
    let cluster = t.etc_path("run/cluster.toml");
    dirs.cluster = Some(cluster.clone());
    // No cluster file yet: the local files alone.
    let s = load(&dirs).unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(s.log_level, log::LevelFilter::Error);
    t.etc("run/cluster.toml", "[daemon]\nlog_level = \"debug\"\n");
    let s = load(&dirs).unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(s.log_level, log::LevelFilter::Debug);
    assert_eq!(s.admin_group, "local", "keys the cluster does not set stay the local ones");
    assert_eq!(s.origins.get("daemon.log_level"), Some(cluster.as_path()));
    assert_eq!(dirs.files().unwrap_or_else(|e| panic!("{e}")).last(), Some(&cluster));

    // A candidate checked in the cluster file's place goes last too, and its errors name it.
    let s = load_with(&dirs, (&cluster, Some("[daemon]\nlog_level = \"trace\"\n")))
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(s.log_level, log::LevelFilter::Trace);
    let Err(e) = load_with(&dirs, (&cluster, Some("[daemon]\nlog_level = \"loud\"\n"))) else {
        panic!("a bad log level in the cluster fragment loaded");
    };
    assert_eq!((e.file(), e.key()), (Some(cluster.as_path()), Some("daemon.log_level")));

    // A local drop-in checked in its place (the runtime drop-in on a pool edit) stays before it.
    let runtime = t.etc_path("config.d/90-cpupoold-runtime.toml");
    let s = load_with(&dirs, (&runtime, Some("[daemon]\nlog_level = \"info\"\nadmin_group = \"rt\"\n")))
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!((s.log_level, s.admin_group.as_str()), (log::LevelFilter::Debug, "local"));
    let s = load_with(&dirs, (&t.etc_path("config.d/zzz.toml"), Some("admin_group = 1\n")));
    assert!(s.is_err(), "an unknown top-level key is refused wherever the file goes");
}

#[test]
fn a_shared_pool_of_too_many_kubelet_devices_is_refused_by_the_unit_key() {
    // 512 CPUs: the shared pool takes 511 of them.
    let topo = Topology::synthetic(2, 128, 2, 8);
    let pools =
        "[pools.sys]\nkind = \"reserved\"\ncpus = \"0\"\n[pools.web]\nkind = \"shared\"\ncpus = \"1-511\"\n";
    // 100 millicpus a device (the default): 5110 devices, fine.
    let t = Tree::new();
    t.etc("config.toml", pools);
    assert!(t.load().resolve_pools(&topo).is_ok());
    // 10: 51,100 devices, refused, naming the key and the file that set it.
    t.etc("config.d/50-fine.toml", "[kubelet]\nmillicpus_per_device = 10\n");
    let e = t.load().resolve_pools(&topo).err().unwrap_or_else(|| panic!("resolved"));
    assert_eq!(e.key(), Some("kubelet.millicpus_per_device"), "{}", chain(&e));
    assert_eq!(e.file(), Some(t.etc_path("config.d/50-fine.toml").as_path()));
    assert!(chain(&e).contains("shared pool `web` (511 CPUs) 51100 devices"), "{}", chain(&e));
    // Not offered to the kubelet (or no kubelet at all): no limit.
    t.etc("config.d/60-off.toml", "[pools.web]\nkubelet = false\n");
    assert!(t.load().resolve_pools(&topo).is_ok());
    t.etc("config.d/60-off.toml", "[kubelet]\nenabled = false\n");
    assert!(t.load().resolve_pools(&topo).is_ok());
}

#[test]
fn irq_keys_defaults_and_errors() {
    use crate::core::isolation::IrqMode;
    let base = "[pools.r]\nkind = \"reserved\"\ncpus = \"0-1\"\n[pools.dp]\nkind = \"exclusive\"\ncpus = \"2-3\"\nisolate = true\n[pools.web]\nkind = \"shared\"\ncpus = \"4-7\"\n";
    let s = ok(base);
    assert_eq!((s.irq.cpus.clone(), s.irq.restore_on_stop, s.irq.irqbalance), (None, true, true));
    let mode = |s: &Settings, p: &str| s.irq.pools[&PoolName::new(p).unwrap_or_else(|e| panic!("{e}"))].mode;
    assert_eq!(
        (mode(&s, "dp"), mode(&s, "web"), mode(&s, "r")),
        (IrqMode::Isolate, IrqMode::None, IrqMode::None)
    );
    assert_eq!(s.paths.procfs_root, Path::new("/proc"));

    let s =
        ok(&format!("[daemon]\nirq_cpus = \"0,4\"\nirq_restore_on_stop = false\nirqbalance = false\n{base}")
            .replace("isolate = true\n", "isolate = true\nirq = \"none\"\nirq_claim = [\"eth0-rx-*\"]\n"));
    assert_eq!(s.irq.cpus, Some(set("0,4")));
    assert!(!s.irq.restore_on_stop && !s.irq.irqbalance);
    assert_eq!(mode(&s, "dp"), IrqMode::None);
    assert_eq!(s.irq.pools[&PoolName::new("dp").unwrap_or_else(|e| panic!("{e}"))].claims, ["eth0-rx-*"]);

    let e = chain(&err(&base.replace("cpus = \"4-7\"\n", "cpus = \"4-7\"\nirq = \"sometimes\"\n")));
    assert!(e.contains("pools.web.irq") && e.contains("t.toml") && e.contains("sometimes"), "{e}");
    let e = chain(&err(&base.replace("isolate = true\n", "isolate = true\nirq = \"sink\"\n")));
    assert!(e.contains("pools.dp.irq"), "{e}");
    let e = chain(&err(&base.replace("isolate = true\n", "isolate = true\nirq_claim = [\"\"]\n")));
    assert!(e.contains("pools.dp.irq_claim[0]"), "{e}");
    let e = chain(&err(&format!("[daemon]\nirq_cpus = \"0-x\"\n{base}")));
    assert!(e.contains("daemon.irq_cpus"), "{e}");
    let e = chain(&err(&format!("[daemon]\nirq_cpus = \"\"\n{base}")));
    assert!(e.contains("daemon.irq_cpus"), "{e}");
}

#[test]
fn metrics_listen_on_loopback_unless_told_otherwise() {
    use crate::config::Listen;
    let base = "[pools.r]\nkind = \"reserved\"\ncount = 1\n";
    let s = ok(base);
    assert!(s.metrics.enabled);
    assert_eq!(s.metrics.listen, Listen::Tcp("127.0.0.1:9465".parse().unwrap_or_else(|e| panic!("{e}"))));
    let s = ok(&format!("{base}[metrics]\nenabled = false\nlisten = \"[::1]:9100\"\n"));
    assert!(!s.metrics.enabled);
    assert_eq!(s.metrics.listen, Listen::Tcp("[::1]:9100".parse().unwrap_or_else(|e| panic!("{e}"))));
    let s = ok(&format!("{base}[metrics]\nlisten = \"unix:/run/m.sock\"\n"));
    assert_eq!(s.metrics.listen, Listen::Unix("/run/m.sock".into()));
}

#[test]
fn a_bad_metrics_listen_names_the_key() {
    let base = "[pools.r]\nkind = \"reserved\"\ncount = 1\n";
    for bad in ["localhost:9465", "127.0.0.1", "unix:run/m.sock", "", "9465"] {
        let e = err(&format!("{base}[metrics]\nlisten = \"{bad}\"\n"));
        assert_eq!(e.key(), Some("metrics.listen"), "{bad:?}: {}", chain(&e));
        assert!(matches!(e, ConfigError::Invalid { .. }), "{bad:?}: {}", chain(&e));
    }
    let e = err(&format!("{base}[metrics]\nport = 9465\n"));
    assert!(chain(&e).contains("port"), "{}", chain(&e));
}

/// `[pools.NAME.power]` and `[idle_cpus.power]`: merged key by key, checked for syntax here
/// (the host's limits are the engine's), each error naming the key and the file.
#[test]
fn power_tables_merge_by_key_and_refuse_bad_syntax_naming_the_key() {
    use crate::core::power::Freq;
    let base = "[pools.sys]\nkind = \"reserved\"\ncount = 1\n[pools.dp]\nkind = \"exclusive\"\ncount = 2\n";
    let s = super::load_strs(&[
        ("a.toml", &format!("{base}[pools.dp.power]\ngovernor = \"performance\"\nmin_freq = 2000000\n")),
        ("b.toml", "[pools.dp.power]\nmin_freq = \"max\"\nresume_latency_us = 0\n[idle_cpus.power]\nepp = \"power\"\n"),
        ("c.toml", "[daemon]\npower_restore_on_stop = false\n"),
    ])
    .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let dp = &s.power.classes["dp"];
    assert_eq!(dp.governor.as_deref(), Some("performance"), "kept from a.toml");
    assert_eq!((dp.min_freq, dp.resume_latency_us), (Some(Freq::Max), Some(0)));
    assert_eq!(s.power.classes[crate::core::classes::IDLE_CPUS].epp.as_deref(), Some("power"));
    assert!(!s.power.restore_on_stop);
    assert_eq!(s.origins.get("pools.dp.power.governor"), Some(Path::new("a.toml")));
    assert!(super::load_str(base, "t.toml").unwrap_or_else(|e| panic!("{e}")).power.restore_on_stop);

    for (table, key, reason) in [
        (
            "[pools.dp.power]\ngovernor = \"per formance\"\n",
            "pools.dp.power.governor",
            "not a name the kernel lists",
        ),
        ("[pools.dp.power]\nepp = \"x\\ny\"\n", "pools.dp.power.epp", "not a name the kernel lists"),
        ("[pools.dp.power]\nmin_freq = \"fast\"\n", "pools.dp.power.min_freq", "not a frequency"),
        ("[pools.dp.power]\nmax_freq = -5\n", "pools.dp.power.max_freq", "not a frequency"),
        (
            "[pools.dp.power]\nmin_freq = 3000\nmax_freq = 2000\n",
            "pools.dp.power.min_freq",
            "above the maximum",
        ),
        ("[pools.dp.power]\nresume_latency_us = -1\n", "pools.dp.power.resume_latency_us", "between 0 and"),
        (
            "[pools.dp.power]\nuncore_min_freq = \"base\"\n",
            "pools.dp.power.uncore_min_freq",
            "no base frequency",
        ),
        ("[idle_cpus.power]\ngovernor = \"\"\n", "idle_cpus.power.governor", "not a name"),
    ] {
        let e = err(&format!("{base}{table}"));
        assert_eq!(e.key(), Some(key), "{}", chain(&e));
        assert!(chain(&e).starts_with("`t.toml`") && chain(&e).contains(reason), "{}", chain(&e));
    }
    let e = err(&format!("{base}[pools.dp.power]\nturbo = true\n"));
    assert_eq!(e.key(), Some("pools.dp.power.turbo"), "{}", chain(&e));
}

/// A drop-in that is not a regular file, or is too large, is an error naming it: before, a FIFO
/// blocked the reader in `open` (the engine, at every reload) and a link to `/dev/zero` was
/// read until memory ran out.
#[test]
fn a_fifo_a_device_or_a_huge_file_is_refused_by_name() {
    let t = Tree::new();
    t.etc("config.toml", RESERVED);
    fs::create_dir_all(t.etc_path("config.d")).unwrap_or_else(|e| panic!("{e}"));
    let fifo = t.etc_path("config.d/50-fifo.toml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
        .unwrap_or_else(|e| panic!("{e}"));
    let e = t.err();
    assert!(matches!(&e, ConfigError::Read { file, .. } if *file == fifo), "{e:?}");
    assert!(chain(&e).contains("not a regular file but a FIFO"), "{}", chain(&e));
    fs::remove_file(&fifo).unwrap_or_else(|e| panic!("{e}"));

    let zero = t.etc_path("config.d/50-zero.toml");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap_or_else(|e| panic!("{e}"));
    let e = t.err();
    assert!(matches!(&e, ConfigError::Read { file, .. } if *file == zero), "{e:?}");
    assert!(chain(&e).contains("not a regular file but a character device"), "{}", chain(&e));
    fs::remove_file(&zero).unwrap_or_else(|e| panic!("{e}"));

    let huge = format!("# {}\n", "x".repeat(usize::try_from(fragments::MAX_FRAGMENT_BYTES).unwrap_or(0)));
    t.etc("config.d/50-huge.toml", &huge);
    let e = t.err();
    assert!(
        matches!(&e, ConfigError::Read { file, .. } if *file == t.etc_path("config.d/50-huge.toml")),
        "{e:?}"
    );
    assert!(chain(&e).contains("larger than 1048576 bytes"), "{}", chain(&e));
    fs::remove_file(t.etc_path("config.d/50-huge.toml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.load().pools.len(), 1);
}

#[test]
fn dra_is_a_pool_key() {
    let s = ok("[pools.sys]\nkind = \"reserved\"\ncpus = \"0\"\n[pools.dp]\nkind = \"exclusive\"\ncount = 2\ndra = true\n");
    assert!(pool(&s, "dp").dra && pool(&s, "dp").kubelet);
    assert!(!pool(&s, "sys").dra);
    assert_eq!(s.origins.get("pools.dp.dra"), Some(Path::new("t.toml")));
}
