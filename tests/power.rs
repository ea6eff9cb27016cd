//! Power classes on the sandbox's simulated sysfs (cpufreq, PM QoS, cpuidle and
//! intel_uncore_frequency as `sim::power` writes them, modelled on the kernel's
//! documentation): the tests are named `fake_sysfs_*` because the files are plain files, not a
//! kernel. The real thing (PM QoS; the guest has no cpufreq) is proven in the guest
//! (tests/vm/checks/62-power.sh).
//!
//! Host 1x4x2 (CPU c and c+4 are siblings): reserved 0,4; `dp` 1-2,5-6; `web` 3,7. The
//! simulated CPUs start on `powersave`, 800000-3500000 kHz, `balance_performance`, PM QoS `0`
//! (no constraint), uncore 800000-2400000 kHz.

mod common;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Daemon, Varlink};
use serde_json::json;

/// Reserved 0,4, exclusive dp 1-2,5-6 and shared web 3,7; the same file serves
/// src/engine/power/tests.rs.
const POOLS: &str = include_str!("fixtures/power-pools.toml");
/// Every power key for dp, at the top of its range.
const DP_POWER: &str = include_str!("fixtures/power-dp.toml");
const DP: [u32; 4] = [1, 2, 5, 6];
const UNCORE: &str = "sys/devices/system/cpu/intel_uncore_frequency/package_00_die_00";

fn file(sb: &Path, rel: &str) -> String {
    fs::read_to_string(sb.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}")).trim().to_owned()
}

fn policy(sb: &Path, cpu: u32, name: &str) -> String {
    file(sb, &format!("sys/devices/system/cpu/cpufreq/policy{cpu}/{name}"))
}

fn qos(sb: &Path, cpu: u32) -> String {
    file(sb, &format!("sys/devices/system/cpu/cpu{cpu}/power/pm_qos_resume_latency_us"))
}

/// What a CPU of the simulated host holds before anyone writes.
fn pristine(sb: &Path, cpu: u32) -> bool {
    policy(sb, cpu, "scaling_governor") == "powersave"
        && policy(sb, cpu, "scaling_min_freq") == "800000"
        && policy(sb, cpu, "scaling_max_freq") == "3500000"
        && policy(sb, cpu, "energy_performance_preference") == "balance_performance"
        && qos(sb, cpu) == "0"
}

fn in_class(sb: &Path, cpu: u32) -> bool {
    policy(sb, cpu, "scaling_governor") == "performance"
        && policy(sb, cpu, "scaling_min_freq") == "3500000"
        && policy(sb, cpu, "energy_performance_preference") == "performance"
        && qos(sb, cpu) == "n/a"
}

/// Writes `config` and reloads over varlink (what `cpupoolctl reload` does): the reply.
fn reload(d: &Daemon, config: &str) -> Result<serde_json::Value, (String, serde_json::Value)> {
    fs::write(d.sb.join("etc/cpupoold/config.toml"), config).unwrap_or_else(|e| panic!("{e}"));
    Varlink::connect(&d.varlink).call("Reload", json!({}))
}

#[test]
fn fake_sysfs_power_class_is_applied_before_ready_and_restored_on_stop() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let config = format!("{POOLS}{DP_POWER}");
    let args = ["--bus", "none", "--check-interval", "1"];
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(&config), &args);
    let sb = d.sb.clone();
    for cpu in DP {
        assert!(in_class(&sb, cpu), "CPU {cpu}:\n{}", d.logs());
    }
    for cpu in [0, 3, 4, 7] {
        assert!(pristine(&sb, cpu), "CPU {cpu} is in no class");
    }
    assert_eq!(file(&sb, &format!("{UNCORE}/min_freq_khz")), "2400000");
    // What the latency leaves of the CPUs' idle states (cpuidle, read only: POLL has no exit
    // latency, C1 2 µs, C1E 10 µs, C6 133 µs).
    let said =
        "power: dp resume_latency_us = 0 on CPUs 1-2,5-6 (the kernel shows n/a); idle states used: POLL";
    assert!(d.logs().contains(said), "{}", d.logs());
    let memory: serde_json::Value =
        serde_json::from_str(&file(&sb, "state/power.json")).unwrap_or_else(|e| panic!("power.json: {e}"));
    assert_eq!(memory["files"]["devices/system/cpu/cpu5/power/pm_qos_resume_latency_us"], "0");

    // Someone rewrites a value: the drift check puts it back.
    let gov1 = sb.join("sys/devices/system/cpu/cpufreq/policy1/scaling_governor");
    fs::write(&gov1, "powersave\n").unwrap_or_else(|e| panic!("{e}"));
    let deadline = Instant::now() + test_support::wait::PATIENCE;
    while policy(&sb, 1, "scaling_governor") != "performance" {
        assert!(Instant::now() < deadline, "not put back:\n{}", d.logs());
        std::thread::sleep(Duration::from_millis(50));
    }

    d.stop();
    // daemon.power_restore_on_stop defaults to true.
    for cpu in DP {
        assert!(pristine(&sb, cpu), "CPU {cpu} after stop");
    }
    assert_eq!(file(&sb, &format!("{UNCORE}/min_freq_khz")), "800000");
    assert_eq!(file(&sb, &format!("{UNCORE}/max_freq_khz")), "2400000");
}

#[test]
fn fake_sysfs_reload_resizes_restores_and_refuses_what_the_host_lacks_naming_the_key() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(POOLS), &["--bus", "none"]);
    let sb = d.sb.clone();
    assert!(DP.iter().all(|&c| pristine(&sb, c)));

    // The class arrives with a reload.
    let config = format!("{POOLS}{DP_POWER}");
    reload(&d, &config).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(DP.iter().all(|&c| in_class(&sb, c)), "{}", d.logs());

    // Bad values are refused naming the key, and nothing changes.
    for (bad, key) in [
        (config.replace("\"performance\"\nmin", "\"ondemand\"\nmin"), "pools.dp.power.governor"),
        (config.replace("max_freq = \"max\"", "max_freq = 5000000"), "pools.dp.power.max_freq"),
        (
            config.replace("uncore_min_freq = \"max\"", "uncore_min_freq = 100"),
            "pools.dp.power.uncore_min_freq",
        ),
        (config.replace("epp = \"performance\"", "epp = \"fast\""), "pools.dp.power.epp"),
    ] {
        let (name, params) = reload(&d, &bad).err().unwrap_or_else(|| panic!("{key}: accepted"));
        let reason = params["reason"].as_str().unwrap_or_default();
        assert!(name.ends_with("ConfigRejected") && reason.contains(key), "{key}: {name} {params}");
        assert!(DP.iter().all(|&c| in_class(&sb, c)), "{key}: nothing changes");
    }

    // dp shrinks to 1,5: CPUs 2 and 6 join the reserved pool and get their values back.
    let resized = config.replace("cpus = \"1-2,5-6\"", "cpus = \"1,5\"");
    reload(&d, &resized).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(pristine(&sb, 2) && pristine(&sb, 6), "{}", d.logs());
    assert!(in_class(&sb, 1) && in_class(&sb, 5));

    // A key removed: its files come back, the others stay.
    reload(&d, &resized.replace("resume_latency_us = 0\n", "")).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!((qos(&sb, 1).as_str(), policy(&sb, 1, "scaling_governor").as_str()), ("0", "performance"));

    // The host loses its cpufreq driver: a class that needs it is not supported, naming what is
    // missing, and the running configuration stays.
    for cpu in 0..8 {
        fs::remove_file(sb.join(format!("sys/devices/system/cpu/cpu{cpu}/cpufreq")))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let (_, params) = reload(&d, &config).err().unwrap_or_else(|| panic!("accepted without cpufreq"));
    let reason = params["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("pools.dp.power.governor: not supported on this host: no cpufreq driver (`")
            && reason.contains("/sys/devices/system/cpu/cpu1/cpufreq` is missing)"),
        "{reason}"
    );
    assert!(pristine(&sb, 2), "nothing changed");
    // PM QoS alone is still supported.
    reload(&d, &format!("{POOLS}[pools.dp.power]\nresume_latency_us = 50\n"))
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(qos(&sb, 6), "50");
    // What it set through the policies' own files is put back (the memory names those, not
    // the links).
    assert_eq!(policy(&sb, 1, "scaling_governor"), "powersave");
    assert!(!file(&sb, "state/power.json").contains("scaling_governor"));
    d.stop();
    assert_eq!(qos(&sb, 6), "0");
}

#[test]
fn fake_sysfs_sigkill_and_restart_without_the_class_restores_the_values_found() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let config = format!("[daemon]\npower_restore_on_stop = false\n{POOLS}{DP_POWER}");
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(&config), &["--bus", "none"]);
    let sb = d.sb.clone();
    assert!(DP.iter().all(|&c| in_class(&sb, c)), "{}", d.logs());
    d.kill();
    // After the crash the values stay, and so does their memory.
    assert!(DP.iter().all(|&c| in_class(&sb, c)));
    fs::write(sb.join("etc/cpupoold/config.toml"), POOLS).unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", None, &["--bus", "none"]);
    for cpu in DP {
        assert!(pristine(&sb, cpu), "CPU {cpu} after the restart:\n{}", d.logs());
    }
    assert_eq!(file(&sb, &format!("{UNCORE}/min_freq_khz")), "800000");

    // With power_restore_on_stop = false, a clean stop leaves the values; the next start that
    // no longer sets them puts them back.
    fs::write(sb.join("etc/cpupoold/config.toml"), &config).unwrap_or_else(|e| panic!("{e}"));
    reload(&d, &config).unwrap_or_else(|e| panic!("{e:?}"));
    d.stop();
    assert!(DP.iter().all(|&c| in_class(&sb, c)), "kept on stop");
    fs::write(sb.join("etc/cpupoold/config.toml"), POOLS).unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", None, &["--bus", "none"]);
    assert!(DP.iter().all(|&c| pristine(&sb, c)), "{}", d.logs());
    d.stop();
}

#[test]
fn fake_sysfs_start_is_refused_naming_the_key_when_the_host_lacks_the_driver() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(POOLS), &["--bus", "none"]);
    let sb = d.sb.clone();
    d.stop();
    fs::remove_dir_all(sb.join("sys/devices/system/cpu/intel_uncore_frequency"))
        .unwrap_or_else(|e| panic!("{e}"));
    fs::write(sb.join("etc/cpupoold/config.toml"), format!("{POOLS}{DP_POWER}"))
        .unwrap_or_else(|e| panic!("{e}"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cpupoold"))
        .arg("--sandbox")
        .arg(&sb)
        .args(["--bus", "none"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "pools.dp.power.uncore_max_freq: not supported on this host: no intel_uncore_frequency driver"
        ),
        "{stderr}"
    );
    assert!(DP.iter().all(|&c| pristine(&sb, c)), "nothing was written");
}

/// A remembered value is restored only when the daemon could have remembered it: a file a
/// power class writes, of a CPU of the host, holding what such a file holds. `cpu5/online = 0`
/// (which would take CPU 5 offline on a host) is refused naming `power.json`, and forgotten.
#[test]
fn fake_sysfs_remembered_values_the_daemon_never_writes_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(POOLS), &["--bus", "none"]);
    let sb = d.sb.clone();
    d.stop();
    let online = sb.join("sys/devices/system/cpu/cpu5/online");
    let before = file(&sb, "sys/devices/system/cpu/cpu5/online");
    // As a crash would leave it: a class's governor in force, and its original remembered.
    let gov1 = sb.join("sys/devices/system/cpu/cpufreq/policy1/scaling_governor");
    fs::write(&gov1, "performance\n").unwrap_or_else(|e| panic!("{e}"));
    let memory = json!({ "files": {
        "devices/system/cpu/cpu5/online": "0",
        "devices/system/cpu/cpu9/power/pm_qos_resume_latency_us": "0",
        "devices/system/cpu/cpufreq/policy2/scaling_max_freq": "99999999",
        "devices/system/cpu/cpufreq/policy1/scaling_governor": "powersave",
    }});
    let path = sb.join("state/power.json");
    fs::write(&path, memory.to_string()).unwrap_or_else(|e| panic!("{e}"));

    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", None, &["--bus", "none"]);
    let logs = d.logs();
    assert_eq!(file(&sb, "sys/devices/system/cpu/cpu5/online"), before, "{logs}");
    assert_eq!(policy(&sb, 2, "scaling_max_freq"), "3500000", "{logs}");
    // The one the daemon could have written is restored.
    assert_eq!(policy(&sb, 1, "scaling_governor"), "powersave", "{logs}");
    for (rel, why) in [
        ("devices/system/cpu/cpu5/online", "not a file a power class writes"),
        ("devices/system/cpu/cpu9/power/pm_qos_resume_latency_us", "CPU 9 is not an online CPU of this host"),
        ("devices/system/cpu/cpufreq/policy2/scaling_max_freq", "99999999 is above the maximum 3500000"),
    ] {
        let said = format!("power: `{}` remembers `{rel}` = `", path.display());
        let line = logs.lines().find(|l| l.contains(&said)).unwrap_or_else(|| panic!("{rel}:\n{logs}"));
        assert!(
            line.contains("cpupoold error: ") && line.contains(why) && line.contains("it is not restored"),
            "{line}"
        );
    }
    let kept: serde_json::Value =
        serde_json::from_str(&file(&sb, "state/power.json")).unwrap_or_else(|e| panic!("power.json: {e}"));
    assert_eq!(kept["files"], json!({}), "refused values are forgotten");
    assert!(online.exists());
    d.stop();
}

/// `housekeeping.json` remembering a workqueue mask narrower than the one in force is not one
/// the daemon recorded (it only narrows the mask it remembers): it is refused naming the file,
/// and the mask in force is left alone.
#[test]
fn fake_sysfs_a_remembered_workqueue_mask_the_daemon_never_recorded_is_not_restored() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(POOLS), &["--bus", "none"]);
    let sb = d.sb.clone();
    d.stop();
    let mask = "sys/devices/virtual/workqueue/cpumask";
    let before = file(&sb, mask);
    let path = sb.join("state/housekeeping.json");
    fs::write(&path, json!({ "workqueue": "1" }).to_string()).unwrap_or_else(|e| panic!("{e}"));

    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", None, &["--bus", "none"]);
    let logs = d.logs();
    assert_eq!(file(&sb, mask), before, "{logs}");
    let said = format!("`{}` remembers `1` for `devices/virtual/workqueue/cpumask`", path.display());
    let line = logs.lines().find(|l| l.contains(&said)).unwrap_or_else(|| panic!("{logs}"));
    assert!(line.contains("cpupoold error: ") && line.contains("it is not restored"), "{line}");
    assert!(!path.exists(), "the refused record is forgotten");
    d.stop();
}
