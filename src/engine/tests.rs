//! Engine tests against a sandbox host in a temp dir: real files, real store, real planner.

use std::fs;
use std::path::Path;

use super::*;
use crate::config::Settings;
use crate::core::cpuset::CpuSet;
use crate::core::pool::{PoolKind, PoolName};
use crate::core::state::{
    AssignSpec, Assignment, AssignmentId, Delta, Outcome, Size, State, StateData, Target,
};
use crate::host::store::{Loaded, PrevCopy, Store};
use crate::host::Backend;
use crate::sandbox::Sandbox;

pub(super) const CONFIG: &str = include_str!("../../tests/fixtures/1x4x2.toml");

pub(super) struct Fixture {
    _dir: tempfile::TempDir,
    pub(super) sb: Sandbox,
}

impl Fixture {
    /// A 1x4x2 sandbox (CPU c and c+4 are siblings) with [`CONFIG`].
    pub(super) fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        test_support::files::write_config(dir.path(), CONFIG);
        let sb = Sandbox::prepare(dir.path(), Some("1x4x2:1")).unwrap_or_else(|e| panic!("{e}"));
        Fixture { _dir: dir, sb }
    }

    pub(super) fn settings(&self) -> Settings {
        let mut s = crate::config::load(&self.sb.config_dirs()).unwrap_or_else(|e| panic!("{e}"));
        self.sb.confine(&mut s);
        s
    }

    pub(super) fn start(&self) -> (Engine, StartReport) {
        // The sandbox's CPUs are not this machine's: processes get simulated affinities.
        let backend = crate::sim::cgroupfs(self.sb.cgroupfs(), "/proc").with_processes(self.sb.processes());
        Engine::start(&self.settings(), Box::new(backend), false)
            .unwrap_or_else(|e| panic!("{}", error_chain(&e)))
    }

    pub(super) fn read(&self, rel: &str) -> String {
        // An empty set is written as a newline, as the kernel shows it.
        let text = fs::read_to_string(self.sb.cgroupfs().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        text.trim_end_matches('\n').to_owned()
    }

    pub(super) fn write(&self, rel: &str, data: &str) {
        let p = self.sb.cgroupfs().join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{e}"));
        }
        fs::write(p, data).unwrap_or_else(|e| panic!("{e}"));
    }

    pub(super) fn config(&self, text: &str) {
        fs::write(self.sb.etc().join("config.toml"), text).unwrap_or_else(|e| panic!("{e}"));
    }

    /// The durable state's bytes: the snapshot, then the journal of changes since.
    pub(super) fn state_file(&self) -> Vec<u8> {
        let mut bytes = fs::read(self.sb.state().join("state.json")).unwrap_or_default();
        bytes.extend(fs::read(self.sb.state().join("state.journal")).unwrap_or_default());
        bytes
    }

    /// How many records the state journal holds: one per durable change since the last
    /// compaction.
    pub(super) fn journal_records(&self) -> usize {
        let journal = fs::read_to_string(self.sb.state().join("state.journal")).unwrap_or_default();
        journal.lines().filter(|l| l.starts_with("r ")).count()
    }
}

pub(super) fn spec(pool: &str, target: &str, size: Size, id: Option<&str>) -> AssignSpec {
    AssignSpec::new(
        pool,
        Target::parse(target).unwrap_or_else(|e| panic!("{e}")),
        size,
        id.map(|i| AssignmentId::new(i).unwrap_or_else(|e| panic!("{e}"))),
    )
}

pub(super) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn fresh_start_applies_pool_slices_and_host_cgroups() {
    let f = Fixture::new();
    let (engine, report) = f.start();
    assert!(report.fresh);
    assert_eq!(report.failed_corrections, 0);
    // The reserved pool's slices are the host ones: cpupool.slice holds the other pools.
    assert_eq!(f.read("cpupool.slice/cpuset.cpus"), "1-3,5-7");
    assert_eq!(f.read("cpupool.slice/cpupool-dp.slice/cpuset.cpus"), "1-2,5-6");
    assert_eq!(f.read("cpupool.slice/cpupool-web.slice/cpuset.cpus"), "3,7");
    assert!(!f.sb.cgroupfs().join("cpupool.slice/cpupool-sys.slice").exists());
    assert_eq!(f.read("cpupool.slice/cpupool-dp.slice/cpuset.mems"), "0");
    assert_eq!(f.read("cgroup.subtree_control"), "+cpuset");
    assert_eq!(f.read("cpupool.slice/cgroup.subtree_control"), "+cpuset");
    for host in ["system.slice", "user.slice", "init.scope"] {
        assert_eq!(f.read(&format!("{host}/cpuset.cpus")), "0,4", "{host}");
    }
    assert!(!f.state_file().is_empty());
    drop(engine);
}

#[test]
fn assign_and_release_write_cgroups_save_state_and_signal() {
    let f = Fixture::new();
    let (engine, _) = f.start();
    f.write("k/ctr/cpuset.cpus", "\n");
    let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    let mut events = handle.subscribe();
    rt().block_on(async {
        let a = handle.assign(spec("dp", "cgroup:k/ctr", Size::Cpus(2), Some("x"))).await;
        let a = a.unwrap_or_else(|e| panic!("{e}")).into_inner();
        assert_eq!(a.cpus, CpuSet::parse("1,5").unwrap_or_default());
        assert_eq!(f.read("k/ctr/cpuset.cpus"), "1,5");
        assert_eq!(f.read("k/ctr/cpuset.mems"), "0");
        assert_eq!(
            events.recv().await.ok(),
            Some(Event::AssignmentChanged { id: a.id.clone(), change: Change::Added })
        );
        assert!(
            String::from_utf8_lossy(&f.state_file()).contains("\"k/ctr\"")
                || String::from_utf8_lossy(&f.state_file()).contains("cgroup:k/ctr")
        );
        // An idempotent repeat changes nothing and signals nothing.
        let again = handle.assign(spec("dp", "cgroup:k/ctr", Size::Cpus(2), Some("x"))).await;
        assert!(matches!(again, Ok(Outcome::Identity(_))));
        let snap = handle.snapshot();
        assert_eq!(snap.state.assignments().len(), 1);
        let r = handle.release("x").await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.id, a.id);
        assert_eq!(f.read("k/ctr/cpuset.cpus"), "");
        assert_eq!(handle.snapshot().state.assignments().len(), 0);
        assert!(matches!(
            handle.release("x").await,
            Err(EngineError::State(state::Error::NoSuchAssignment { .. }))
        ));
    });
    drop(handle);
    let _ = thread.join();
}

/// The kubelet's poll moves an allocation to a running container whose cgroup cannot hold its
/// CPUs: the move stays (taking it back would leave the container unconfined), and the
/// assignment is degraded at once, with the reason, rather than counted as applied.
#[test]
fn a_retarget_the_kernel_does_not_enforce_is_degraded_at_once() {
    let f = Fixture::new();
    let (engine, _) = f.start();
    // The container's pod cgroup has CPU 0 only: no CPU of dp reaches the container.
    f.write("k/cpuset.cpus", "0\n");
    f.write("k/ctr/cpuset.cpus", "\n");
    let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    let mut events = handle.subscribe();
    rt().block_on(async {
        let a = handle.assign(spec("dp", "kubelet:core-1", Size::Cpus(2), Some("kubelet-core-1"))).await;
        let a = a.unwrap_or_else(|e| panic!("{e}")).into_inner();
        while events.try_recv().is_ok() {}
        let target = state::Target::parse("cgroup:k/ctr").unwrap_or_else(|e| panic!("{e}"));
        handle.retarget(a.id.as_str(), target.clone(), None).await.unwrap_or_else(|e| panic!("{e}"));
        let snap = handle.snapshot();
        assert_eq!(snap.state.assignments()[&a.id].target, target);
        let why = snap.assignment_health.get(&a.id).cloned().unwrap_or_default();
        assert!(why.contains("k/ctr"), "{why:?}");
        // Degraded, never said applied first.
        assert_eq!(
            events.recv().await.ok(),
            Some(Event::AssignmentChanged { id: a.id.clone(), change: Change::Degraded })
        );
    });
    drop(handle);
    let _ = thread.join();
}

#[test]
fn failed_apply_rolls_back_and_changes_nothing() {
    let f = Fixture::new();
    let (engine, _) = f.start();
    let before_file = f.state_file();
    let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    rt().block_on(async {
        let err = handle.assign(spec("dp", "cgroup:does/not/exist", Size::Cpus(2), None)).await;
        let Err(EngineError::Apply(e)) = err else { panic!("{err:?}") };
        // Said as what it is, not as the kernel's EACCES on a file that is not there.
        let msg = error_chain(&e);
        assert!(msg.starts_with("no cgroup `") && msg.ends_with("does/not/exist`"), "{msg}");
    });
    assert_eq!(handle.snapshot().state.assignments().len(), 0);
    assert_eq!(f.state_file(), before_file);
    drop(handle);
    let _ = thread.join();
}

#[test]
fn failed_save_rolls_back_the_cgroup_writes() {
    let f = Fixture::new();
    let (engine, _) = f.start();
    f.write("k/ctr/cpuset.cpus", "\n");
    // A directory where the store keeps its journal makes the save fail, even as root.
    let journal = f.sb.state().join("state.journal");
    fs::remove_file(&journal).unwrap_or_else(|e| panic!("{e}"));
    fs::create_dir(&journal).unwrap_or_else(|e| panic!("{e}"));
    fs::write(journal.join("x"), "").unwrap_or_else(|e| panic!("{e}"));
    let before_file = f.state_file();
    let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    rt().block_on(async {
        let err = handle.assign(spec("dp", "cgroup:k/ctr", Size::Cpus(2), None)).await;
        assert!(matches!(err, Err(EngineError::Store(_))), "{err:?}");
    });
    // A new target gets its CPUs only once the state naming it is saved: it was never written.
    assert_eq!(f.read("k/ctr/cpuset.cpus"), "");
    assert_eq!(handle.snapshot().state.assignments().len(), 0);
    assert_eq!(f.state_file(), before_file);
    drop(handle);
    let _ = thread.join();
}

#[test]
fn restart_keeps_assignments_and_restores_files_changed_behind_our_back() {
    let f = Fixture::new();
    let (engine, _) = f.start();
    f.write("k/ctr/cpuset.cpus", "\n");
    let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    rt().block_on(async {
        handle
            .assign(spec("dp", "cgroup:k/ctr", Size::Cpus(2), Some("x")))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let busy = handle.assign(spec("web", "cgroup:k/ctr", Size::Millicpus(700), Some("w"))).await;
        assert!(matches!(busy, Err(EngineError::State(state::Error::TargetBusy { .. }))), "{busy:?}");
    });
    drop(handle);
    let _ = thread.join();
    // Someone rewrites our files and leaves a stale pool slice behind.
    f.write("cpupool.slice/cpupool-dp.slice/cpuset.cpus", "0-7");
    f.write("k/ctr/cpuset.cpus", "0-7");
    f.write("system.slice/cpuset.cpus", "");
    f.write("cpupool.slice/cpupool-old.slice/cpuset.cpus", "3");
    let (engine, report) = f.start();
    assert!(!report.fresh);
    assert_eq!(report.corrections, 4, "{report:?}");
    assert_eq!(f.read("cpupool.slice/cpupool-dp.slice/cpuset.cpus"), "1-2,5-6");
    assert_eq!(f.read("k/ctr/cpuset.cpus"), "1,5");
    assert_eq!(f.read("system.slice/cpuset.cpus"), "0,4");
    assert!(!f.sb.cgroupfs().join("cpupool.slice/cpupool-old.slice").exists());
    let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(handle.snapshot().state.assignments().len(), 1);
    drop(handle);
    let _ = thread.join();
    // A clean restart corrects nothing.
    let (_, report) = f.start();
    assert_eq!(report.corrections, 0);
    // Left with the reserved pool only, a restart removes every pool slice and the top slice.
    let reserved_only = CONFIG.split("[pools.dp]").next().unwrap_or_default().to_owned();
    f.config(&reserved_only);
    // The assignment would be stranded: release it through a fresh state.
    for file in ["state.json", "state.json.prev", "state.journal"] {
        let _ = fs::remove_file(f.sb.state().join(file));
    }
    let (_, report) = f.start();
    assert_eq!(report.failed_corrections, 0);
    assert!(!f.sb.cgroupfs().join("cpupool.slice").exists(), "the top slice stayed");
}

#[test]
fn reload_applies_valid_changes_and_rejects_stranding_ones_whole() {
    let f = Fixture::new();
    let (engine, _) = f.start();
    f.write("k/ctr/cpuset.cpus", "\n");
    let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    let mut events = handle.subscribe();
    rt().block_on(async {
        handle
            .assign(spec("dp", "cgroup:k/ctr", Size::Cpus(2), Some("x")))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        while events.try_recv().is_ok() {}
        // dp gives its free core (2,6) to web.
        f.config(&CONFIG.replace("1-2,5-6", "1,5").replace("3,7", "2-3,6-7"));
        assert!(matches!(handle.reload(Ok(f.settings())).await, Ok(r) if r.any()));
        assert_eq!(f.read("cpupool.slice/cpupool-dp.slice/cpuset.cpus"), "1,5");
        assert_eq!(f.read("cpupool.slice/cpupool-web.slice/cpuset.cpus"), "2-3,6-7");
        let mut changed = Vec::new();
        while let Ok(e) = events.try_recv() {
            changed.push(e);
        }
        assert_eq!(changed.len(), 2, "{changed:?}");
        assert!(matches!(handle.reload(Ok(f.settings())).await, Ok(r) if !r.any()));
        // Taking the assigned core away is refused whole.
        let snapshot = handle.snapshot().state.clone();
        f.config(&CONFIG.replace("1-2,5-6", "2,6").replace("cpus = \"0,4\"", "cpus = \"0-1,4-5\""));
        let err = handle.reload(Ok(f.settings())).await;
        let Err(EngineError::Stranded(msg)) = err else { panic!("{err:?}") };
        assert!(msg.contains("`x`") && msg.contains("1,5"), "{msg}");
        assert_eq!(*handle.snapshot().state, *snapshot);
        assert!(handle.snapshot().config_error.is_some());
        assert_eq!(f.read("cpupool.slice/cpupool-dp.slice/cpuset.cpus"), "1,5");
    });
    drop(handle);
    let _ = thread.join();
}

#[test]
fn a_reload_names_the_keys_only_a_restart_applies_and_applies_the_log_level() {
    let f = Fixture::new();
    let (engine, _) = f.start();
    let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    rt().block_on(async {
        let extra = "[daemon]\nlend_idle = true\nlog_level = \"debug\"\n\
                     [kubelet]\nresource_prefix = \"example.com\"\n[metrics]\nenabled = false\n";
        f.config(&format!("{CONFIG}\n{extra}"));
        let r = handle.reload(Ok(f.settings())).await.unwrap_or_else(|e| panic!("{}", error_chain(&e)));
        assert_eq!(r.at_restart(), ["kubelet.resource_prefix", "metrics.enabled"]);
        assert!(
            r.summary().ends_with("; only a restart applies kubelet.resource_prefix, metrics.enabled"),
            "{}",
            r.summary()
        );
        // The process's level: no other test of this binary changes daemon.log_level, and a
        // reload that does not change it leaves the level alone.
        assert_eq!(log::max_level(), log::LevelFilter::Debug, "daemon.log_level applies at once");
        f.config(CONFIG);
        let r = handle.reload(Ok(f.settings())).await.unwrap_or_else(|e| panic!("{}", error_chain(&e)));
        assert_eq!(log::max_level(), log::LevelFilter::Info, "and back to its default");
        assert!(r.at_restart().contains(&"kubelet.resource_prefix"), "{:?}", r.at_restart());
        assert!(r.changed.contains(&"daemon.lend_idle".to_owned()), "{:?}", r.changed);
    });
    drop(handle);
    let _ = thread.join();
}

#[test]
fn start_with_a_stranding_config_keeps_the_persisted_pools() {
    let f = Fixture::new();
    let (engine, _) = f.start();
    f.write("k/ctr/cpuset.cpus", "\n");
    let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    rt().block_on(async {
        handle
            .assign(spec("dp", "cgroup:k/ctr", Size::Cpus(2), Some("x")))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    });
    drop(handle);
    let _ = thread.join();
    // The operator deletes the dp pool while it has an assignment.
    f.config("[pools.sys]\nkind = \"reserved\"\ncpus = \"0-7\"\n");
    let (engine, _) = f.start();
    let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    let snap = handle.snapshot();
    assert_eq!(snap.state.assignments().len(), 1);
    assert_eq!(snap.state.pools().len(), 3);
    let err = snap.config_error.clone().unwrap_or_default();
    assert!(err.contains("`x`") && err.contains("no longer exists"), "{err}");
    drop(handle);
    let _ = thread.join();
}

/// An assignment of `pool` (`kind`) to `cgroup:ID` holding `cpus` and `millicpus`, made behind
/// the core's back as a hand edit or a faulty release would.
fn crafted(id: &str, pool: &str, kind: PoolKind, cpus: &str, millicpus: u64) -> Assignment {
    Assignment {
        id: AssignmentId::new(id).unwrap_or_else(|e| panic!("{e}")),
        pool: PoolName::new(pool).unwrap_or_else(|e| panic!("{e}")),
        kind,
        target: Target::parse(&format!("cgroup:{id}")).unwrap_or_else(|e| panic!("{e}")),
        cpus: CpuSet::parse(cpus).unwrap_or_else(|e| panic!("{e}")),
        millicpus,
        reclaim: true,
        process_start: None,
        container: None,
    }
}

#[test]
fn start_refuses_an_inconsistent_state_file_until_told_to_restore() {
    let f = Fixture::new();
    drop(f.start());
    let store = Store::open(&f.sb.state()).unwrap_or_else(|e| panic!("{e}"));
    let good = match store.load(|s: &mut State, d: Delta| s.apply(d)) {
        Ok(Loaded::State(state)) => StateData::from(state),
        other => panic!("{other:?}"),
    };
    let with = |assignments: Vec<Assignment>| {
        let mut data = good.clone();
        data.assignments = assignments.into_iter().map(|a| (a.id.clone(), a)).collect();
        data
    };
    let start = |restore: bool| {
        let backend = crate::sim::cgroupfs(f.sb.cgroupfs(), "/proc");
        Engine::start(&f.settings(), Box::new(backend), restore)
    };
    let state_path = f.sb.state().join("state.json");
    let cases = [
        (
            with(vec![
                crafted("x", "dp", PoolKind::Exclusive, "1,5", 2000),
                crafted("y", "dp", PoolKind::Exclusive, "1-2,5-6", 4000),
            ]),
            "assignments `x` and `y` both own CPUs 1,5",
        ),
        (
            with(vec![crafted("x", "dp", PoolKind::Exclusive, "1,3", 2000)]),
            "assignment `x` holds CPUs 3, which its pool `dp` does not have",
        ),
        (
            with(vec![
                crafted("w1", "web", PoolKind::Shared, "3,7", 1500),
                crafted("w2", "web", PoolKind::Shared, "3,7", 1000),
            ]),
            "shared pool `web` has 2000 millicpus but its assignments `w1`, `w2` hold 2500",
        ),
    ];
    for (bad, violation) in &cases {
        // A good previous copy, then the inconsistent file with a valid checksum.
        store.save(&good).unwrap_or_else(|e| panic!("{e}"));
        store.save(bad).unwrap_or_else(|e| panic!("{e}"));
        let before = f.state_file();
        let cgroups = f.read("cpupool.slice/cpupool-dp.slice/cpuset.cpus");
        let err = start(false).err().unwrap_or_else(|| panic!("started with {violation}"));
        let StartError::Inconsistent { ref path, ref violations, ref prev } = err else { panic!("{err:?}") };
        assert_eq!(path, &state_path);
        assert!(!violations.is_empty());
        assert_eq!(prev, &PrevCopy::Good(f.sb.state().join("state.json.prev")));
        let msg = err.to_string();
        assert!(msg.starts_with(&format!("`{}` has a valid checksum", state_path.display())), "{msg}");
        assert!(msg.contains(violation), "{msg}");
        assert!(msg.contains("--restore-previous-state") && msg.contains("STATE RECOVERY"), "{msg}");
        assert_eq!(f.state_file(), before, "the file is evidence: left alone");
        assert_eq!(f.read("cpupool.slice/cpupool-dp.slice/cpuset.cpus"), cgroups, "the host is left alone");
    }
    // Told to restore: the previous good copy is installed, the inconsistent file kept aside.
    let bad = fs::read(&state_path).unwrap_or_default();
    let (engine, _) = start(true).unwrap_or_else(|e| panic!("{}", error_chain(&e)));
    assert_eq!(engine.ledger.state.data().assignments, good.assignments);
    assert_eq!(fs::read(f.sb.state().join("state.json.corrupt")).unwrap_or_default(), bad);
    drop(engine);

    // The previous copy inconsistent too: said so, and restoring it is refused, moving nothing.
    let (twice, _) = &cases[0];
    store.save(twice).unwrap_or_else(|e| panic!("{e}"));
    store.save(twice).unwrap_or_else(|e| panic!("{e}"));
    let msg = start(false).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(msg.contains("is inconsistent too") && msg.contains("; release the named"), "{msg}");
    let before = f.state_file();
    let err = start(true).err().unwrap_or_else(|| panic!("restored an inconsistent copy"));
    let StartError::Inconsistent { ref path, ref prev, .. } = err else { panic!("{err:?}") };
    assert_eq!((path, prev), (&f.sb.state().join("state.json.prev"), &PrevCopy::Itself));
    assert_eq!(f.state_file(), before);
    assert!(!f.sb.state().join("state.json.corrupt.1").exists());
}

#[test]
fn sandbox_confines_every_root() {
    let f = Fixture::new();
    f.config(&format!(
        "{CONFIG}\n[paths]\nstate_dir = \"/tmp/cpupoold-escape/state\"\ncgroup_root = \"/tmp/cpupoold-escape/cg\"\n"
    ));
    let s = f.settings();
    for p in [
        &s.paths.sysfs_root,
        &s.paths.cgroup_root,
        &s.paths.state_dir,
        &s.paths.runtime_dir,
        &s.paths.kubelet_dir,
        &s.paths.procfs_root,
        &s.paths.irqbalance_dir,
    ] {
        assert!(p.starts_with(f.sb.root()), "{}", p.display());
    }
    assert!(!Path::new("/tmp/cpupoold-escape").exists());
}

mod pool_edits {
    use super::*;
    use crate::config::runtime::{PoolEdit, Source, DROPIN_NAME};
    use crate::core::pool::{PoolName, Smt};

    fn name(s: &str) -> PoolName {
        PoolName::new(s).unwrap_or_else(|e| panic!("{e}"))
    }

    pub(super) fn spawn(f: &Fixture) -> (Handle, std::thread::JoinHandle<()>) {
        let (engine, _) = f.start();
        let sb = f.sb.clone();
        let source = ConfigSource { dirs: f.sb.config_dirs(), adjust: Box::new(move |s| sb.confine(s)) };
        engine.with_config(source).spawn().unwrap_or_else(|e| panic!("{e}"))
    }

    fn dropin(f: &Fixture) -> Option<String> {
        fs::read_to_string(f.sb.etc().join("config.d").join(DROPIN_NAME)).ok()
    }

    fn create(n: &str, kind: PoolKind, cpus: &str) -> PoolEdit {
        PoolEdit::Create {
            name: name(n),
            kind,
            source: Source::Cpus(CpuSet::parse(cpus).unwrap_or_default()),
            smt: Some(Smt::Threads),
            isolate: None,
            kubelet: None,
            dra: None,
        }
    }

    fn resize(n: &str, cpus: &str) -> PoolEdit {
        PoolEdit::Resize { name: name(n), source: Source::Cpus(CpuSet::parse(cpus).unwrap_or_default()) }
    }

    #[test]
    fn create_resize_delete_persist_apply_and_survive_a_restart() {
        let f = Fixture::new();
        let (handle, thread) = spawn(&f);
        let mut events = handle.subscribe();
        rt().block_on(async {
            // Room for a new pool: dp gives up 2,6.
            let dp = handle.edit_pool(resize("dp", "1,5")).await.unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(dp.map(|p| p.cpus.to_string()), Some("1,5".into()));
            assert_eq!(events.recv().await.ok(), Some(Event::PoolChanged(name("dp"))));
            let batch = handle.edit_pool(create("batch", PoolKind::Shared, "2,6")).await;
            let batch = batch.unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|| panic!("no pool"));
            assert_eq!(batch.cpus.to_string(), "2,6");
            assert_eq!(f.read("cpupool.slice/cpupool-batch.slice/cpuset.cpus"), "2,6");
            let text = dropin(&f).unwrap_or_default();
            assert!(text.contains("[pools.batch]") && text.contains("[pools.dp]"), "{text}");
        });
        drop(handle);
        let _ = thread.join();

        // A restart reads the drop-in: the same pools.
        let (handle, thread) = spawn(&f);
        rt().block_on(async {
            let snap = handle.snapshot();
            assert_eq!(
                snap.state.pools().get(&name("batch")).map(|p| p.cpus.to_string()),
                Some("2,6".into())
            );
            assert_eq!(handle.edit_pool(PoolEdit::Delete { name: name("batch") }).await.ok(), Some(None));
            assert!(handle.snapshot().state.pools().get(&name("batch")).is_none());
            assert!(!f.sb.cgroupfs().join("cpupool.slice/cpupool-batch.slice").exists());
            // Only the runtime drop-in defined it, so its table is gone rather than `removed`.
            let text = dropin(&f).unwrap_or_default();
            assert!(!text.contains("batch"), "{text}");
            // dp, defined in config.toml, is removed with a marker.
            assert!(handle.edit_pool(PoolEdit::Delete { name: name("dp") }).await.is_ok());
            assert!(dropin(&f).unwrap_or_default().contains("[pools.dp]\nremoved = true"));
            // Its CPUs join the reserved pool.
            let sys = handle.snapshot().state.pools().get(&name("sys")).map(|p| p.cpus.to_string());
            assert_eq!(sys, Some("0-2,4-6".into()));
        });
        drop(handle);
        let _ = thread.join();
    }

    #[test]
    fn refused_edits_name_the_reason_and_change_nothing() {
        let f = Fixture::new();
        f.write("k/a/cpuset.cpus", "\n");
        let (handle, thread) = spawn(&f);
        rt().block_on(async {
            let held = handle.assign(spec("dp", "cgroup:k/a", Size::Cpus(2), Some("a"))).await;
            let held = held.unwrap_or_else(|e| panic!("{e}")).into_inner();
            let state_before = f.state_file();
            let pools_before = handle.snapshot().state.pools().clone();
            let cases: Vec<(PoolEdit, &str)> = vec![
                (create("web", PoolKind::Shared, "3"), "PoolExists"),
                (resize("nope", "3"), "NoSuchPool"),
                (PoolEdit::Delete { name: name("nope") }, "NoSuchPool"),
                (PoolEdit::Delete { name: name("dp") }, "PoolInUse"),
                (PoolEdit::Delete { name: name("sys") }, "InvalidArgument"),
                // dp's assignment holds 1,5: shrinking dp to 2,6 would strand it.
                (resize("dp", "2,6"), "AssignmentsStranded"),
                // CPU 9 does not exist: an invalid `cpus` argument.
                (create("big", PoolKind::Shared, "9"), "InvalidArgument"),
                // CPU 3 is web's: the edit's `cpus` leaves web no room, which is the edit's
                // doing (the files are valid without it), not a key of config.toml.
                (create("two", PoolKind::Shared, "3"), "InvalidArgument"),
            ];
            for (edit, kind) in cases {
                let err = handle
                    .edit_pool(edit.clone())
                    .await
                    .err()
                    .unwrap_or_else(|| panic!("{edit:?} succeeded"));
                assert_eq!(err.to_api().kind, kind, "{edit:?}: {}", error_chain(&err));
                assert_eq!(f.state_file(), state_before, "{edit:?}");
                assert_eq!(handle.snapshot().state.pools(), &pools_before, "{edit:?}");
                assert_eq!(dropin(&f), None, "{edit:?}");
            }
            let invalid = handle.edit_pool(create("big", PoolKind::Shared, "9")).await.err();
            let api = invalid.as_ref().map(EngineError::to_api);
            assert_eq!(api.map(|a| a.params["argument"].clone()), Some(serde_json::json!("cpus")));
            let taken = handle.edit_pool(create("two", PoolKind::Shared, "3")).await.err();
            let reason = taken.as_ref().map(|e| e.to_api().params["reason"].clone());
            let reason = reason.and_then(|r| r.as_str().map(str::to_owned)).unwrap_or_default();
            assert!(
                reason.starts_with("with CPUs 3 for pool `two`, the other pools no longer fit: "),
                "{reason}"
            );
            // Files on disk that are invalid without the edit: still the configuration's fault,
            // named by its file and key, whatever the edit.
            f.config(&format!("{CONFIG}\n[pools.extra]\nkind = \"shared\"\ncpus = \"3\"\n"));
            let err =
                handle.edit_pool(resize("dp", "1-2,5-6")).await.err().unwrap_or_else(|| panic!("accepted"));
            assert_eq!(err.to_api().kind, "ConfigRejected", "{}", error_chain(&err));
            assert!(error_chain(&err).contains("config.toml"), "{}", error_chain(&err));
            assert_eq!(f.state_file(), state_before);
            assert_eq!(dropin(&f), None);
            f.config(CONFIG);
            assert_eq!(f.read("k/a/cpuset.cpus"), held.cpus.to_string());
        });
        drop(handle);
        let _ = thread.join();
    }

    #[test]
    fn an_edit_a_later_file_would_override_is_refused() {
        let f = Fixture::new();
        let later = f.sb.etc().join("config.d/99-local.toml");
        fs::create_dir_all(later.parent().unwrap_or(Path::new("/"))).unwrap_or_else(|e| panic!("{e}"));
        fs::write(&later, "[pools.web]\ncpus = \"3,7\"\n").unwrap_or_else(|e| panic!("{e}"));
        let (handle, thread) = spawn(&f);
        rt().block_on(async {
            let err = handle.edit_pool(resize("web", "3")).await.err().unwrap_or_else(|| panic!("resized"));
            let msg = error_chain(&err);
            assert!(matches!(err, EngineError::Overridden { .. }), "{msg}");
            assert!(msg.contains("pools.web.cpus") && msg.contains("99-local.toml"), "{msg}");
            assert_eq!(dropin(&f), None);
        });
        drop(handle);
        let _ = thread.join();
    }

    #[test]
    fn reload_from_disk_reads_the_files_again() {
        let f = Fixture::new();
        let (handle, thread) = spawn(&f);
        f.config(&CONFIG.replace("cpus = \"3,7\"", "cpus = \"3\""));
        rt().block_on(async {
            assert!(matches!(handle.reload_from_disk().await, Ok(r) if r.any()));
            let web = handle.snapshot().state.pools().get(&name("web")).map(|p| p.cpus.to_string());
            assert_eq!(web, Some("3".into()));
        });
        drop(handle);
        let _ = thread.join();
    }
    #[test]
    fn a_pool_an_earlier_file_removed_can_be_created_again() {
        let f = Fixture::new();
        // The main file defines web; an admin drop-in read before the runtime one removes it.
        let early = f.sb.etc().join("config.d/10-no-web.toml");
        fs::create_dir_all(early.parent().unwrap_or(Path::new("/"))).unwrap_or_else(|e| panic!("{e}"));
        fs::write(&early, "[pools.web]\nremoved = true\n").unwrap_or_else(|e| panic!("{e}"));
        let (handle, thread) = spawn(&f);
        rt().block_on(async {
            assert!(handle.snapshot().state.pools().get(&name("web")).is_none());
            let pool = handle
                .edit_pool(create("web", PoolKind::Shared, "3"))
                .await
                .unwrap_or_else(|e| panic!("{}", error_chain(&e)));
            assert_eq!(pool.map(|p| p.cpus.to_string()), Some("3".into()));
            let text = dropin(&f).unwrap_or_default();
            assert!(text.contains("removed = false"), "{text}");
        });
        drop(handle);
        let _ = thread.join();
    }
}

#[test]
fn concurrent_mutations_grouped_or_not_answer_as_if_alone() {
    let f = Fixture::new();
    for i in 0..24 {
        if i != 7 {
            f.write(&format!("g/{i}/cpuset.cpus"), "\n");
        }
    }
    let (engine, _) = f.start();
    let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let results: Vec<(usize, Result<Assignment, EngineError>)> = rt.block_on(async {
        let tasks: Vec<_> = (0..24)
            .map(|i| {
                let h = handle.clone();
                tokio::spawn(async move {
                    // 24 × 100 millicpus on web's 2000: the last four cannot fit.
                    let r = h
                        .assign(spec(
                            "web",
                            &format!("cgroup:g/{i}"),
                            Size::Millicpus(100),
                            Some(&format!("a{i}")),
                        ))
                        .await;
                    (i, r.map(Outcome::into_inner))
                })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap_or_else(|e| panic!("{e}")));
        }
        out
    });
    let snap = handle.snapshot();
    let mut ok = 0;
    for (i, r) in &results {
        match r {
            Ok(a) => {
                ok += 1;
                assert!(snap.state.assignments().contains_key(&a.id), "{i}");
                assert_eq!(f.read(&format!("g/{i}/cpuset.cpus")), "3,7");
            }
            // g/7 does not exist: only that one fails to apply, whatever it was grouped with.
            Err(EngineError::Apply(_)) => assert_eq!(*i, 7),
            Err(EngineError::State(state::Error::InsufficientCapacity { .. })) => {}
            Err(e) => panic!("{i}: {}", error_chain(e)),
        }
    }
    assert_eq!(ok, 20, "web holds 20 × 100 millicpus");
    assert_eq!(snap.state.assignments().len(), 20);
    assert!(results.iter().any(|(i, r)| *i == 7 && r.is_err()));
    drop(handle);
    let _ = thread.join();
    // What was acknowledged is what was saved.
    let (engine, _) = f.start();
    assert_eq!(engine.ledger.state.assignments().len(), 20);
}

/// `lend_idle`: the host slices also run on exclusive CPUs nobody holds, and give them back
/// before an assignment gets them; an isolated pool lends nothing.
#[test]
fn lend_idle_lends_free_exclusive_cpus_and_takes_them_back_first() {
    let f = Fixture::new();
    f.config(&format!("[daemon]\nlend_idle = true\n{CONFIG}"));
    let (handle, thread) = pool_edits::spawn(&f);
    assert_eq!(f.read("system.slice/cpuset.cpus"), "0-2,4-6");
    f.write("k/ctr/cpuset.cpus", "\n");
    rt().block_on(async {
        let a = handle.assign(spec("dp", "cgroup:k/ctr", Size::Cpus(2), Some("x"))).await;
        let a = a.unwrap_or_else(|e| panic!("{e}")).into_inner();
        assert_eq!(f.read("k/ctr/cpuset.cpus"), a.cpus.to_string());
        let lent = CpuSet::parse("0,4")
            .unwrap_or_default()
            .union(&CpuSet::parse("1-2,5-6").unwrap_or_default().difference(&a.cpus));
        assert_eq!(f.read("system.slice/cpuset.cpus"), lent.to_string());
        handle.release("x").await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f.read("system.slice/cpuset.cpus"), "0-2,4-6");
        // Isolating the pool ends the lending.
        let isolated = CONFIG.replace("cpus = \"1-2,5-6\"", "cpus = \"1-2,5-6\"\nisolate = true");
        f.config(&format!("[daemon]\nlend_idle = true\n{isolated}"));
        handle.reload_from_disk().await.unwrap_or_else(|e| panic!("{e}"));
    });
    assert_eq!(f.read("system.slice/cpuset.cpus"), "0,4");
    assert_eq!(f.read("cpupool.slice/cpupool-dp.slice/cpuset.cpus.partition"), "isolated");
    assert_eq!(
        handle
            .snapshot()
            .partitions
            .get(&PoolName::new("dp").unwrap_or_else(|e| panic!("{e}")))
            .map(String::as_str),
        Some("isolated")
    );
    drop(handle);
    let _ = thread.join();
}

/// `enforce_quota`: a shared assignment's CPU time is limited to its millicpus (`cpu.max`),
/// and the limit goes with the assignment.
#[test]
fn enforce_quota_writes_cpu_max_for_shared_assignments() {
    let f = Fixture::new();
    f.config(&format!("{CONFIG}enforce_quota = true\n"));
    let (engine, _) = f.start();
    f.write("k/web/cpuset.cpus", "\n");
    let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    rt().block_on(async {
        handle
            .assign(spec("web", "cgroup:k/web", Size::Millicpus(1500), Some("w")))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f.read("k/web/cpuset.cpus"), "3,7");
        assert_eq!(f.read("k/web/cpu.max"), "150000 100000");
        handle.release("w").await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f.read("k/web/cpu.max"), "max 100000");
    });
    drop(handle);
    let _ = thread.join();
}

/// A pid target records the process's start time; a pid that names no process is refused.
#[test]
fn pid_targets_record_the_start_time_and_need_a_live_process() {
    let f = Fixture::new();
    let (engine, _) = f.start();
    let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap_or_else(|e| panic!("{e}"));
    let pid = child.id();
    rt().block_on(async {
        // dp's first core (CPU 1) exists on any test machine with two CPUs.
        let a = handle.assign(spec("dp", &format!("pid:{pid}"), Size::Cpus(2), None)).await;
        let a = a.unwrap_or_else(|e| panic!("{e}")).into_inner();
        let host = crate::host::cgroupfs::CgroupFs::new("/nonexistent", "/proc");
        assert_eq!(a.process_start, host.process_start(pid));
        assert!(a.process_start.is_some());
        let _ = child.kill();
        let _ = child.wait();
        let gone = handle.assign(spec("dp", &format!("pid:{pid}"), Size::Cpus(2), Some("gone"))).await;
        assert!(
            matches!(&gone, Err(EngineError::State(state::Error::InvalidArgument { arg: "target", reason })) if reason.contains("does not exist")),
            "{gone:?}"
        );
    });
    drop(handle);
    let _ = thread.join();
}

/// Issue 34 §6: `cpupoolctl run` becomes its command, and the daemon releases the assignment
/// when the reclaim task learns of the exit. A booking that comes before that (`run a; run b`
/// on a pool with room for one) is not refused for capacity an ended process holds: the engine
/// releases the pool's assignments whose process ended first. A live process, a pid the kernel
/// gave to another process since, and an assignment not marked for reclaim are not touched.
#[test]
fn a_booking_is_not_refused_for_capacity_an_ended_process_holds() {
    let f = Fixture::new();
    let (engine, _) = f.start();
    let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    let sleep = || std::process::Command::new("sleep").arg("30").spawn().unwrap_or_else(|e| panic!("{e}"));
    let (mut ended, mut live, mut kept) = (sleep(), sleep(), sleep());
    rt().block_on(async {
        let run = |pid: u32, id: &str| {
            let mut s = spec("dp", &format!("pid:{pid}"), Size::Cpus(2), Some(id));
            s.reclaim = true;
            handle.run(s)
        };
        // dp (1-2,5-6) holds two cores: one for the ended process, one for the live one.
        run(ended.id(), "ended").await.unwrap_or_else(|e| panic!("{e}"));
        run(live.id(), "live").await.unwrap_or_else(|e| panic!("{e}"));
        let full = run(kept.id(), "refused").await;
        assert!(
            matches!(&full, Err(EngineError::State(state::Error::InsufficientCapacity { .. }))),
            "{full:?}"
        );
        let _ = ended.kill();
        let _ = ended.wait();
        // No reclaim task runs here: only the engine's own look can free the core.
        let next = run(kept.id(), "next").await;
        assert!(next.is_ok(), "{next:?}");
        let snap = handle.snapshot();
        let ids: Vec<&str> = snap.state.assignments().keys().map(|id| id.as_str()).collect();
        assert_eq!(ids, ["live", "next"]);
        // Not marked for reclaim: an ended process's assignment is the caller's to release.
        handle.release("next").await.unwrap_or_else(|e| panic!("{e}"));
        let mut own = spec("dp", &format!("pid:{}", kept.id()), Size::Cpus(2), Some("own"));
        own.reclaim = false;
        handle.assign(own).await.unwrap_or_else(|e| panic!("{e}"));
        let _ = kept.kill();
        let _ = kept.wait();
        let mut one_more = sleep();
        let refused = run(one_more.id(), "more").await;
        let _ = one_more.kill();
        let _ = one_more.wait();
        assert!(
            matches!(&refused, Err(EngineError::State(state::Error::InsufficientCapacity { .. }))),
            "{refused:?}"
        );
        let snap = handle.snapshot();
        let ids: Vec<&str> = snap.state.assignments().keys().map(|id| id.as_str()).collect();
        assert_eq!(ids, ["live", "own"]);
        // All or nothing (the kubelet's bookings) too.
        let _ = live.kill();
        let _ = live.wait();
        f.write("k/a/cpuset.cpus", "\n");
        let all = handle.assign_all(vec![spec("dp", "cgroup:k/a", Size::Cpus(2), Some("all"))]).await;
        assert!(all.is_ok(), "{all:?}");
        let snap = handle.snapshot();
        let ids: Vec<&str> = snap.state.assignments().keys().map(|id| id.as_str()).collect();
        assert_eq!(ids, ["all", "own"]);
    });
    drop(handle);
    let _ = thread.join();
}

mod housekeeping_tests {
    use super::*;
    use crate::engine::keeper::Pass;

    const WQ: &str = "devices/virtual/workqueue/cpumask";
    const WB: &str = "devices/virtual/workqueue/writeback/cpumask";

    impl Fixture {
        fn roots(&self) -> housekeeping::Roots {
            housekeeping::Roots {
                procfs: self.sb.procfs(),
                sysfs: self.sb.sysfs(),
                cgroup: self.sb.cgroupfs(),
                state_dir: self.sb.state(),
                kernel: crate::sim::KERNEL,
            }
        }

        fn sys(&self, rel: &str) -> String {
            fs::read_to_string(self.sb.sysfs().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
        }
    }

    fn isolated_dp() -> String {
        CONFIG.replace("cpus = \"1-2,5-6\"", "cpus = \"1-2,5-6\"\nisolate = true")
    }

    #[test]
    fn workqueue_masks_leave_isolated_cpus_and_come_back() {
        let f = Fixture::new();
        assert_eq!(f.sys(WQ), "ff\n");
        f.config(&isolated_dp());
        let (engine, _) = f.start();
        let engine = engine.with_housekeeping(f.roots());
        // Narrowed to sys and web (0,3-4,7), read back, and the masks found recorded.
        assert_eq!(f.sys(WQ), "99\n");
        assert_eq!(f.sys(WB), "99\n");
        let saved = fs::read_to_string(f.sb.state().join("housekeeping.json")).unwrap_or_default();
        assert!(saved.contains("\"workqueue\": \"ff\""), "{saved}");
        let snap = engine.snapshots.borrow().clone();
        assert!(
            snap.report::<crate::engine::IsolationReport>().masks.iter().all(|m| m.by == "cpupoold"),
            "{:?}",
            snap.report::<crate::engine::IsolationReport>().masks
        );
        // A kill -9: the next start finds the record and keeps the masks as they are.
        drop(engine);
        let (engine, _) = f.start();
        let (handle, thread) = engine.with_housekeeping(f.roots()).spawn().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f.sys(WQ), "99\n");
        rt().block_on(async {
            // Isolation ends: the masks found before go back and the record goes.
            f.config(CONFIG);
            assert!(matches!(handle.reload(Ok(f.settings())).await, Ok(r) if r.any()));
        });
        assert_eq!(f.sys(WQ), "ff\n");
        assert_eq!(f.sys(WB), "ff\n");
        assert!(!f.sb.state().join("housekeeping.json").exists());
        drop(handle);
        let _ = thread.join();
    }

    /// `housekeeping.json` damaged (a disk that lies, an editor): start falls back to the
    /// previous copy, so the mask found before isolation still goes back when it ends; once
    /// nothing is remembered, the file and its previous copy both go.
    #[test]
    fn a_damaged_record_falls_back_to_its_previous_copy() {
        let f = Fixture::new();
        f.config(&isolated_dp());
        let (engine, _) = f.start();
        drop(engine.with_housekeeping(f.roots()));
        assert_eq!(f.sys(WQ), "99\n");
        let (file, prev) =
            (f.sb.state().join("housekeeping.json"), f.sb.state().join("housekeeping.json.prev"));
        // The workqueue mask was recorded first, the writeback mask at the next save.
        let kept = fs::read_to_string(&prev).unwrap_or_else(|e| panic!("{e}"));
        assert!(kept.contains("\"workqueue\": \"ff\""), "{kept}");
        fs::write(&file, "{\"workqueue\": ").unwrap_or_else(|e| panic!("{e}"));
        f.config(CONFIG);
        let (engine, _) = f.start();
        drop(engine.with_housekeeping(f.roots()));
        assert_eq!(f.sys(WQ), "ff\n", "restored from the previous copy");
        assert!(!file.exists() && !prev.exists());
    }

    #[test]
    fn isolation_ended_while_down_is_restored_at_start() {
        let f = Fixture::new();
        f.config(&isolated_dp());
        let (engine, _) = f.start();
        drop(engine.with_housekeeping(f.roots()));
        assert_eq!(f.sys(WQ), "99\n");
        f.config(CONFIG);
        let (engine, _) = f.start();
        drop(engine.with_housekeeping(f.roots()));
        assert_eq!(f.sys(WQ), "ff\n");
        assert!(!f.sb.state().join("housekeeping.json").exists());
    }

    #[test]
    fn a_kernel_that_keeps_isolated_cpus_off_itself_is_left_alone() {
        let f = Fixture::new();
        // Linux 6.12 shows the mask without the isolated partitions' CPUs.
        fs::write(f.sb.sysfs().join(WQ), "99\n").unwrap_or_else(|e| panic!("{e}"));
        f.config(&isolated_dp());
        let (engine, _) = f.start();
        let engine = engine.with_housekeeping(f.roots());
        assert_eq!(f.sys(WQ), "99\n");
        let snap = engine.snapshots.borrow().clone();
        let iso = snap.report::<crate::engine::IsolationReport>();
        let wq = iso.masks.iter().find(|m| m.file == WQ).unwrap_or_else(|| panic!("no mask"));
        assert_eq!(wq.by, "kernel");
        let saved = fs::read_to_string(f.sb.state().join("housekeeping.json")).unwrap_or_default();
        assert!(!saved.contains("workqueue"), "{saved}");
    }

    #[test]
    fn an_invalid_partition_degrades_the_pool_with_the_kernels_reason() {
        let f = Fixture::new();
        f.config(&isolated_dp());
        let (engine, _) = f.start();
        let mut engine = engine.with_housekeeping(f.roots());
        let dp = PoolName::new("dp").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            engine
                .snapshots
                .borrow()
                .report::<crate::engine::IsolationReport>()
                .pools
                .get(&dp)
                .map(|p| p.invalid.clone()),
            Some(None)
        );
        // What the kernel answers when the pool's CPUs cannot be made exclusive; the sandbox's
        // plain file would be rewritten by a reconcile, so the read-back is driven directly.
        f.write(
            "cpupool.slice/cpupool-dp.slice/cpuset.cpus.partition",
            "isolated invalid (Cpu list in cpuset.cpus not exclusive)\n",
        );
        let events = engine.keep_host(Pass::Layout);
        assert!(
            events.iter().any(|e| matches!(e, Event::PoolChanged(p) if p.as_str() == "dp")),
            "{events:?}"
        );
        engine.publish(events);
        let snap = engine.snapshots.borrow().clone();
        let p = &snap.report::<crate::engine::IsolationReport>().pools[&dp];
        assert_eq!(p.state(), "degraded");
        assert!(p.summary().contains("Cpu list in cpuset.cpus not exclusive"), "{}", p.summary());
        // Once is enough: the same reason again is no new event.
        assert!(engine.keep_host(Pass::Layout).is_empty());
    }

    #[test]
    fn fake_procfs_health_names_the_irq_on_the_isolated_cpu() {
        let f = Fixture::new();
        f.config(&isolated_dp());
        let (engine, _) = f.start();
        let (handle, thread) = engine.with_housekeeping(f.roots()).spawn().unwrap_or_else(|e| panic!("{e}"));
        let dp = PoolName::new("dp").unwrap_or_else(|e| panic!("{e}"));
        let online: Vec<u32> = (0..8).collect();
        rt().block_on(async {
            handle.sample_isolation().await.unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                handle.snapshot().report::<crate::engine::IsolationReport>().pools[&dp].summary(),
                "holds"
            );
            let mut counts = std::collections::BTreeMap::new();
            counts.insert(("32", 2), 500);
            counts.insert(("LOC", 2), 100);
            let text = crate::sim::machine::interrupts_text(&online, &counts);
            fs::write(f.sb.procfs().join("interrupts"), text).unwrap_or_else(|e| panic!("{e}"));
            handle.sample_isolation().await.unwrap_or_else(|e| panic!("{e}"));
        });
        let snap = handle.snapshot();
        let p = &snap.report::<crate::engine::IsolationReport>().pools[&dp];
        assert_eq!(p.state(), "leaks");
        let s = p.summary();
        assert!(s.contains("IRQ/s from irq 32 virtio1-requests on CPU 2"), "{s}");
        drop(handle);
        let _ = thread.join();
    }
}

/// The kubelet's checkpoint with the static policy, as the kubelet writes it: pod → container →
/// the CPUs it gave.
const STATIC_CPU_MANAGER: &str = r#"{"policyName":"static","defaultCpuSet":"0,2-7","entries":{"0b5f42a1-9c3e-4d6b-8f21-7a9e3c1d2b4f":{"app":"1"}},"checksum":1}"#;

#[test]
fn a_reload_serving_the_kubelet_cpus_its_static_cpu_manager_holds_is_refused() {
    let f = Fixture::new();
    // dp is kept from the kubelet at first; the static CPU manager holds CPU 1 of it.
    f.config(&CONFIG.replace("cpus = \"1-2,5-6\"", "cpus = \"1-2,5-6\"\nkubelet = false"));
    let (engine, _) = f.start();
    fs::create_dir_all(f.sb.kubelet()).unwrap_or_else(|e| panic!("{e}"));
    fs::write(f.sb.kubelet().join("cpu_manager_state"), STATIC_CPU_MANAGER).unwrap_or_else(|e| panic!("{e}"));
    let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    rt().block_on(async {
        let snapshot = handle.snapshot().state.clone();
        for dra in ["", "\ndra = true"] {
            f.config(&CONFIG.replace("cpus = \"1-2,5-6\"", &format!("cpus = \"1-2,5-6\"{dra}")));
            let err = handle.reload(Ok(f.settings())).await;
            let Err(e @ EngineError::StaticCpuManager(_)) = err else { panic!("{dra}: {err:?}") };
            let chain = error_chain(&e);
            assert!(
                chain.contains("cpu_manager_state`: the kubelet's CPU manager runs the static policy and has given CPUs 1 of pool `dp`"),
                "{chain}"
            );
            assert_eq!(e.to_api().kind, cpupool_wire::ErrorKind::ConfigRejected);
            assert_eq!(*handle.snapshot().state, *snapshot, "nothing changed");
            assert!(handle.snapshot().config_error.is_some());
        }
        // A change that gives the kubelet none of the CPUs the checkpoint holds is applied.
        f.config(&CONFIG.replace("cpus = \"1-2,5-6\"", "cpus = \"1-2,5-6\"\nkubelet = false").replace("cpus = \"3,7\"", "cpus = \"3,7\"\nkubelet = false"));
        assert!(handle.reload(Ok(f.settings())).await.is_ok_and(|r| r.any()));
        // Without the static policy, dp is served.
        fs::write(f.sb.kubelet().join("cpu_manager_state"), STATIC_CPU_MANAGER.replace("static", "none"))
            .unwrap_or_else(|e| panic!("{e}"));
        f.config(CONFIG);
        assert!(handle.reload(Ok(f.settings())).await.is_ok_and(|r| r.any()));
    });
    drop(handle);
    let _ = thread.join();
}

/// The sandbox's backend, but every read-back of what the kernel enforces fails as it does
/// when the daemon has run out of descriptors (EMFILE): writes go through, answers never come.
struct OutOfDescriptors(crate::host::cgroupfs::CgroupFs);

impl Backend for OutOfDescriptors {
    fn name(&self) -> &'static str {
        "cgroupfs"
    }
    fn apply(&self, effect: &crate::core::plan::Effect) -> Result<(), crate::host::HostError> {
        self.0.apply(effect)
    }
    fn observe(
        &self,
        key: &crate::core::plan::Key,
    ) -> Result<Option<crate::host::Observed>, crate::host::HostError> {
        self.0.observe(key)
    }
    fn children(&self, top: &crate::core::state::CgroupPath) -> Vec<crate::core::state::CgroupPath> {
        self.0.children(top)
    }
    fn partition_status(&self, path: &crate::core::state::CgroupPath) -> Option<String> {
        self.0.partition_status(path)
    }
    fn remote_partitions(&self) -> bool {
        self.0.has_exclusive_file()
    }
    fn process_start(&self, pid: u32) -> Option<u64> {
        self.0.process_start(pid)
    }
    fn enforced(&self, key: &crate::core::plan::Key) -> Result<Option<CpuSet>, crate::host::HostError> {
        let path = std::path::PathBuf::from(format!("{key:?}/cpuset.cpus.effective"));
        let source = std::io::Error::from_raw_os_error(libc::EMFILE);
        Err(crate::host::HostError::Io(crate::host::IoError::Read { path, source }))
    }
    fn confinement(
        &self,
        key: &crate::core::plan::Key,
    ) -> Result<Option<crate::host::Confinement>, crate::host::HostError> {
        self.0.confinement(key)
    }
    fn can_read_units(&self) -> bool {
        false
    }
    fn refresh(&self) {
        Backend::refresh(&self.0);
    }
}

/// Issue 34 §2: with the descriptors gone, an Assign failed as `TargetOutsidePool`, as if the
/// target sat in the wrong place. A read-back that fails is a failure to apply, said with the
/// file and the kernel's error, and the assignment is undone.
#[test]
fn a_read_back_that_fails_is_a_failure_to_apply_not_a_refusal_of_the_target() {
    let f = Fixture::new();
    let backend = crate::sim::cgroupfs(f.sb.cgroupfs(), "/proc").with_processes(f.sb.processes());
    let (engine, _) = Engine::start(&f.settings(), Box::new(OutOfDescriptors(backend)), false)
        .unwrap_or_else(|e| panic!("{}", error_chain(&e)));
    f.write("k/a/cpuset.cpus", "\n");
    let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    rt().block_on(async {
        for size in [Size::Cpus(2), Size::Millicpus(500)] {
            let pool = if matches!(size, Size::Cpus(_)) { "dp" } else { "web" };
            let err = handle.assign(spec(pool, "cgroup:k/a", size, None)).await;
            let Err(e) = err else { panic!("{err:?}") };
            assert!(matches!(e, EngineError::ReadBack { .. }), "{e:?}");
            assert_eq!(e.to_api().kind, cpupool_wire::ErrorKind::ApplyFailed, "{e:?}");
            let said = error_chain(&e);
            assert!(said.contains("cpuset.cpus.effective") && said.contains("Too many open files"), "{said}");
        }
    });
    // Undone (journaled as a change and its undo): nothing stays booked.
    assert_eq!(handle.snapshot().state.assignments().len(), 0);
    drop(handle);
    let _ = thread.join();
}
