//! The power manager on the simulated sysfs (`sim::power`): named `fake_sysfs_*`.
//! Host 1x4x2 (CPU c and c+4 are siblings, one package, one die).
use std::collections::BTreeMap;
use std::path::Path;

use super::*;
use crate::config::ConfigError;
use crate::core::classes::ClassState;
use crate::sim::machine::{self, TopologyShape};
use crate::sim::power::{self as simpower, SimPower};

/// Reserved 0,4, exclusive dp 1-2,5-6 and shared web 3,7; the same file serves
/// tests/power.rs.
const POOLS: &str = include_str!("../../../tests/fixtures/power-pools.toml");

/// Every power key for dp, at the top of its range.
const DP_POWER: &str = include_str!("../../../tests/fixtures/power-dp.toml");

struct Host {
    _dir: tempfile::TempDir,
    sys: std::path::PathBuf,
    state: std::path::PathBuf,
    topo: Topology,
}

fn host(what: SimPower) -> Host {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let topo = "1x4x2:1".parse::<TopologyShape>().unwrap_or_else(|e| panic!("{e}")).topology();
    let sys = dir.path().join("sys");
    machine::write_sysfs(&sys, &topo).unwrap_or_else(|e| panic!("{e}"));
    simpower::write_power(&sys, &topo, what).unwrap_or_else(|e| panic!("{e}"));
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap_or_else(|e| panic!("{e}"));
    Host { _dir: dir, sys, state, topo }
}

impl Host {
    fn settings(&self, extra: &str) -> Result<Settings, ConfigError> {
        let mut s = crate::config::load_str(&format!("{POOLS}{extra}"), "test.toml")?;
        s.paths.sysfs_root = self.sys.clone();
        s.paths.state_dir = self.state.clone();
        Ok(s)
    }

    fn ok(&self, extra: &str) -> Settings {
        self.settings(extra).unwrap_or_else(|e| panic!("{}", error_chain(&e)))
    }

    fn file(&self, rel: &str) -> String {
        read(&self.sys.join(rel))
    }

    fn check(&self, extra: &str) -> Result<(), Box<ConfigError>> {
        let s = self.ok(extra);
        let pools = s.resolve_pools(&self.topo).unwrap_or_else(|e| panic!("{e}"));
        check_power(&s, &self.topo, &pools)
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).trim().to_owned()
}

fn pools(dp: &str) -> BTreeMap<String, CpuSet> {
    let c = |s: &str| CpuSet::parse(s).unwrap_or_else(|e| panic!("{e}"));
    BTreeMap::from([("sys".into(), c("0,4")), ("dp".into(), c(dp)), ("web".into(), c("3,7"))])
}

fn gov(cpu: u32) -> String {
    format!("devices/system/cpu/cpufreq/policy{cpu}/scaling_governor")
}
fn qos(cpu: u32) -> String {
    format!("devices/system/cpu/cpu{cpu}/power/pm_qos_resume_latency_us")
}
const UNCORE: &str = "devices/system/cpu/intel_uncore_frequency/package_00_die_00";

#[test]
fn fake_sysfs_class_is_applied_read_back_and_remembered_then_restored_on_stop() {
    let h = host(SimPower::ALL);
    let s = h.ok(DP_POWER);
    let mut m = PowerManager::new(&s);
    m.apply(&h.topo, &pools("1-2,5-6"));
    for cpu in [1, 2, 5, 6] {
        assert_eq!(h.file(&gov(cpu)), "performance");
        let policy = format!("devices/system/cpu/cpufreq/policy{cpu}");
        assert_eq!(h.file(&format!("{policy}/scaling_min_freq")), "3500000");
        assert_eq!(h.file(&format!("{policy}/scaling_max_freq")), "3500000");
        assert_eq!(h.file(&format!("{policy}/energy_performance_preference")), "performance");
        // 0 µs tolerated is the kernel's `n/a`; its `0` would mean no constraint at all.
        assert_eq!(h.file(&qos(cpu)), "n/a");
    }
    for cpu in [0, 3, 4, 7] {
        assert_eq!(h.file(&gov(cpu)), "powersave", "CPU {cpu} is in no class");
        assert_eq!(h.file(&qos(cpu)), "0");
    }
    assert_eq!(h.file(&format!("{UNCORE}/min_freq_khz")), "2400000");
    assert_eq!(h.file(&format!("{UNCORE}/max_freq_khz")), "2400000");

    let rows = m.report();
    assert_eq!(rows.len(), 7, "{rows:#?}");
    for r in &rows {
        assert_eq!(
            (r.pool.as_str(), r.scope.as_str(), &r.state),
            ("dp", "1-2,5-6", &ClassState::Applied),
            "{r:?}"
        );
    }
    let by_key = |k: &str| rows.iter().find(|r| r.key == k).unwrap_or_else(|| panic!("no {k} row"));
    assert_eq!(
        (by_key("resume_latency_us").wanted.as_str(), by_key("resume_latency_us").in_force.as_str()),
        ("0", "n/a")
    );
    assert_eq!(by_key("min_freq").in_force, "3500000");

    // Remembered durably before the writes: what each file held.
    let memory: serde_json::Value =
        serde_json::from_str(&read(&h.state.join(MEMORY.name))).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(memory["files"][gov(1)], "powersave");
    assert_eq!(memory["files"][qos(5)], "0");
    assert_eq!(memory["files"][format!("{UNCORE}/min_freq_khz")], "800000");

    m.restore_all();
    for cpu in [1, 2, 5, 6] {
        assert_eq!(h.file(&gov(cpu)), "powersave");
        assert_eq!(h.file(&qos(cpu)), "0");
        let policy = format!("devices/system/cpu/cpufreq/policy{cpu}");
        assert_eq!(h.file(&format!("{policy}/scaling_min_freq")), "800000");
        assert_eq!(h.file(&format!("{policy}/energy_performance_preference")), "balance_performance");
    }
    assert_eq!(h.file(&format!("{UNCORE}/min_freq_khz")), "800000");
    assert!(read(&h.state.join(MEMORY.name)).contains("\"files\": {}"));
}

#[test]
fn fake_sysfs_a_cpu_leaving_the_pool_and_a_removed_key_get_their_values_back() {
    let h = host(SimPower::ALL);
    let mut m =
        PowerManager::new(&h.ok("[pools.dp.power]\ngovernor = \"performance\"\nresume_latency_us = 20\n"));
    m.apply(&h.topo, &pools("1-2,5-6"));
    assert_eq!(h.file(&qos(6)), "20");
    // Resized: CPUs 2 and 6 leave dp.
    m.apply(&h.topo, &pools("1,5"));
    assert_eq!((h.file(&gov(2)).as_str(), h.file(&qos(6)).as_str()), ("powersave", "0"));
    assert_eq!((h.file(&gov(1)).as_str(), h.file(&qos(5)).as_str()), ("performance", "20"));
    // The key goes: its files come back, the other key stays.
    m.configure(&h.ok("[pools.dp.power]\ngovernor = \"performance\"\n"));
    m.apply(&h.topo, &pools("1,5"));
    assert_eq!((h.file(&gov(1)).as_str(), h.file(&qos(5)).as_str()), ("performance", "0"));
    // Someone rewrites a value: the next pass (the drift check) puts it back.
    std::fs::write(h.sys.join(gov(5)), "powersave\n").unwrap_or_else(|e| panic!("{e}"));
    m.apply(&h.topo, &pools("1,5"));
    assert_eq!(h.file(&gov(5)), "performance");
    // The class goes: all restored.
    m.configure(&h.ok(""));
    m.apply(&h.topo, &pools("1,5"));
    assert_eq!(h.file(&gov(1)), "powersave");
    assert!(m.report().is_empty());
}

#[test]
fn fake_sysfs_a_restart_after_a_crash_restores_what_the_new_configuration_no_longer_sets() {
    let h = host(SimPower::ALL);
    let mut m = PowerManager::new(&h.ok(DP_POWER));
    m.apply(&h.topo, &pools("1-2,5-6"));
    // A crash: no restore. The next run starts without the class.
    drop(m);
    let mut m = PowerManager::new(&h.ok(""));
    m.apply(&h.topo, &pools("1-2,5-6"));
    for cpu in [1, 2, 5, 6] {
        assert_eq!((h.file(&gov(cpu)).as_str(), h.file(&qos(cpu)).as_str()), ("powersave", "0"));
    }
    assert_eq!(h.file(&format!("{UNCORE}/max_freq_khz")), "2400000");
    assert_eq!(h.file(&format!("{UNCORE}/min_freq_khz")), "800000");
    // And a restart that keeps the class keeps the first values found, not its own.
    let mut m = PowerManager::new(&h.ok(DP_POWER));
    m.apply(&h.topo, &pools("1-2,5-6"));
    drop(m);
    let mut m = PowerManager::new(&h.ok(DP_POWER));
    m.apply(&h.topo, &pools("1-2,5-6"));
    m.restore_all();
    assert_eq!(h.file(&gov(1)), "powersave");
}

#[test]
fn fake_sysfs_both_frequencies_below_the_current_minimum_are_applied() {
    let h = host(SimPower::ALL);
    let mut m = PowerManager::new(&h.ok("[pools.dp.power]\nmin_freq = 1000000\nmax_freq = 1200000\n"));
    m.apply(&h.topo, &pools("1"));
    let policy = "devices/system/cpu/cpufreq/policy1";
    assert_eq!(h.file(&format!("{policy}/scaling_min_freq")), "1000000");
    assert_eq!(h.file(&format!("{policy}/scaling_max_freq")), "1200000");
    assert!(m.report().iter().all(|r| r.state == ClassState::Applied));
}

#[test]
fn fake_sysfs_invalid_values_are_refused_naming_the_key_and_nothing_is_written() {
    let h = host(SimPower::ALL);
    let cases = [
        (
            "[pools.dp.power]\ngovernor = \"schedutil\"\n",
            "pools.dp.power.governor",
            "not a governor CPU 1 offers",
        ),
        (
            "[pools.dp.power]\nmax_freq = 9000000\n",
            "pools.dp.power.max_freq",
            "outside CPU 1's limits (800000-3500000 kHz)",
        ),
        ("[pools.dp.power]\nmin_freq = 100\n", "pools.dp.power.min_freq", "outside CPU 1's limits"),
        (
            "[pools.dp.power]\nmin_freq = \"max\"\nmax_freq = \"base\"\n",
            "pools.dp.power.min_freq",
            "above max_freq",
        ),
        ("[pools.dp.power]\nepp = \"turbo\"\n", "pools.dp.power.epp", "not a preference CPU 1 offers"),
        (
            "[pools.dp.power]\nuncore_max_freq = 3000000\n",
            "pools.dp.power.uncore_max_freq",
            "outside the uncore of package 0 die 0",
        ),
        (
            "[pools.dp.power]\nuncore_max_freq = \"max\"\n[pools.web.power]\nuncore_max_freq = \"min\"\n",
            "pools.web.power.uncore_max_freq",
            "pool `dp` shares the die",
        ),
    ];
    for (extra, key, reason) in cases {
        let e = h.check(extra).err().unwrap_or_else(|| panic!("{extra} was accepted"));
        let text = error_chain(&*e);
        assert_eq!(e.key(), Some(key), "{text}");
        assert!(text.contains(reason) && text.contains("test.toml"), "{extra}: {text}");
        assert!(matches!(*e, ConfigError::Invalid { .. }), "{e:?}");
    }
    assert_eq!(h.file(&gov(1)), "powersave", "a check writes nothing");
    // Raw EPP numbers are intel_pstate's (the simulated driver).
    h.check("[pools.dp.power]\nepp = \"128\"\n").unwrap_or_else(|e| panic!("{e}"));
    // A syntax error is the parser's.
    let e = h.settings("[pools.dp.power]\nmin_freq = \"fast\"\n").err().unwrap_or_else(|| panic!("accepted"));
    assert_eq!(e.key(), Some("pools.dp.power.min_freq"), "{e}");
}

#[test]
fn fake_sysfs_missing_drivers_are_not_supported_naming_the_key_and_what_is_missing() {
    let h = host(SimPower { cpufreq: false, pm_qos: true, cpuidle: false, uncore: false });
    let e =
        h.check("[pools.dp.power]\ngovernor = \"performance\"\n").err().unwrap_or_else(|| panic!("accepted"));
    let text = error_chain(&*e);
    assert!(matches!(*e, ConfigError::Unsupported { .. }), "{e:?}");
    assert!(
        text.contains("pools.dp.power.governor: not supported on this host: no cpufreq driver (`")
            && text.contains("/sys/devices/system/cpu/cpu1/cpufreq` is missing)"),
        "{text}"
    );
    let e =
        h.check("[idle_cpus.power]\nresume_latency_us = 5\n[pools.dp.power]\nuncore_min_freq = \"min\"\n");
    let e = e.err().unwrap_or_else(|| panic!("accepted"));
    assert_eq!(e.key(), Some("pools.dp.power.uncore_min_freq"));
    assert!(error_chain(&*e).contains("no intel_uncore_frequency driver"), "{}", error_chain(&*e));
    // What the host has is fine, and the idle CPUs (none here: the reserved pool takes them)
    // ask nothing.
    h.check("[pools.dp.power]\nresume_latency_us = 0\n[idle_cpus.power]\ngovernor = \"x\"\n")
        .unwrap_or_else(|e| panic!("{e}"));

    // Files that vanish after the check are reported, never a failure.
    let mut m = PowerManager::new(&h.ok("[pools.dp.power]\ngovernor = \"performance\"\n"));
    m.apply(&h.topo, &pools("1"));
    let rows = m.report();
    assert!(
        matches!(&rows[0].state, ClassState::Unsupported(w) if w.contains("no cpufreq driver")),
        "{rows:?}"
    );
}

/// The power rows of the engine's last snapshot.
fn power_rows(engine: &crate::engine::Engine) -> Vec<ClassRow> {
    engine
        .snapshots
        .borrow()
        .report::<Vec<crate::core::classes::ClassRow>>()
        .iter()
        .filter(|r| r.class == ClassKind::Power)
        .cloned()
        .collect()
}

/// The engine's hooks: applied at start, reported in the snapshot, a reload the host cannot
/// apply refused with nothing changed, a resize applied, and the stop restoring.
#[test]
fn fake_sysfs_engine_applies_at_start_refuses_on_reload_and_restores_on_stop() {
    let f = crate::engine::tests::Fixture::new();
    let config = |extra: &str| {
        let text = format!("{}{extra}", include_str!("../../../tests/fixtures/1x4x2.toml"));
        std::fs::write(f.sb.etc().join("config.toml"), text).unwrap_or_else(|e| panic!("{e}"));
        let mut s = crate::config::load(&f.sb.config_dirs()).unwrap_or_else(|e| panic!("{e}"));
        f.sb.confine(&mut s);
        s
    };
    let governor = |cpu: u32| read(&f.sb.sysfs().join(gov(cpu)));
    config("[pools.dp.power]\ngovernor = \"performance\"\n");
    let (mut engine, _) = f.start();
    let rows = power_rows(&engine);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (rows[0].key.as_str(), rows[0].in_force.as_str(), &rows[0].state),
        ("governor", "performance", &ClassState::Applied)
    );
    let dp = rows[0].scope.clone();
    for cpu in CpuSet::parse(&dp).unwrap_or_else(|e| panic!("{e}")).iter() {
        assert_eq!(governor(cpu), "performance");
    }

    let bad = config("[pools.dp.power]\ngovernor = \"ondemand\"\n");
    let e = engine.reload(Ok(Box::new(bad))).err().unwrap_or_else(|| panic!("accepted"));
    assert!(error_chain(&e).contains("pools.dp.power.governor"), "{}", error_chain(&e));
    assert_eq!(power_rows(&engine), rows, "nothing changed");

    let good = config("[pools.dp.power]\ngovernor = \"performance\"\nresume_latency_us = 5\n");
    engine.reload(Ok(Box::new(good))).unwrap_or_else(|e| panic!("{}", error_chain(&e)));
    assert_eq!(power_rows(&engine).len(), 2);
    let first = CpuSet::parse(&dp).unwrap_or_else(|e| panic!("{e}")).first().unwrap_or_default();
    assert_eq!(read(&f.sb.sysfs().join(qos(first))), "5");

    engine.keepers.stop();
    assert_eq!(governor(first), "powersave");
    assert_eq!(read(&f.sb.sysfs().join(qos(first))), "0");
}
