//! Cache classes (`[pools.NAME.cache]`) on the sandbox's simulated resctrl (`DIR/resctrl`, see
//! `sim::resctrl`): the tests are named `fake_resctrl_*` because the kernel's part (files
//! appearing on mkdir, schemata checked and merged, CPUs moving between groups) is the
//! sandbox's model of it. The guest has no resctrl; tests/vm/checks/63-cache.sh proves the
//! not-supported path there.
//!
//! Host 1x4x2 (CPU c and c+4 are siblings), one L3 cache id (0) with 12 ways (`fff`), MBA in
//! steps of 10%: reserved 0,4; `dp` 1-2,5-6; `web` 3,7.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Daemon, PrivateBus, Varlink};
use serde_json::{json, Value};

const POOLS: &str = "[pools.sys]\nkind = \"reserved\"\ncpus = \"0,4\"\n\
    [pools.dp]\nkind = \"exclusive\"\ncpus = \"1-2,5-6\"\n\
    [pools.web]\nkind = \"shared\"\ncpus = \"3,7\"\n";
const DP_CACHE: &str = "[pools.dp.cache]\nl3 = \"50%\"\nmb = 50\n";
const WEB_CACHE: &str = "[pools.web.cache]\nl3 = \"0x3\"\n";

fn config(parts: &[&str]) -> String {
    let mut s = POOLS.to_owned();
    for p in parts {
        s.push_str(p);
    }
    s
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"))
}

fn rc(sb: &Path, rel: &str) -> Option<String> {
    fs::read_to_string(sb.join("resctrl").join(rel)).ok().map(|s| s.trim_end().to_owned())
}

/// Waits (up to 30 s, for the daemon's next check or reload) until `cond` holds.
fn until(d: &Daemon, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + test_support::wait::PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "{what} did not happen:\n{}", d.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn write_config(d: &Daemon, text: &str) {
    fs::write(d.sb.join("etc/cpupoold/config.toml"), text).unwrap_or_else(|e| panic!("{e}"));
}

/// Writes `text` as the configuration and reloads over varlink: the reply or the error.
fn reload(d: &Daemon, text: &str) -> Result<Value, (String, Value)> {
    write_config(d, text);
    Varlink::connect(&d.varlink).call("Reload", json!({}))
}

fn classes(d: &Daemon, pool: &str) -> Result<Value, (String, Value)> {
    Varlink::connect(&d.varlink).call("GetClasses", json!({ "pool": pool })).map(|r| r["classes"].clone())
}

fn row(d: &Daemon, pool: &str, key: &str) -> Value {
    let all = classes(d, "").unwrap_or_else(|e| panic!("GetClasses: {e:?}"));
    all.as_array()
        .and_then(|a| a.iter().find(|r| r["pool"] == pool && r["key"] == key).cloned())
        .unwrap_or_else(|| panic!("no row {pool} {key} in {all}"))
}

#[test]
fn fake_resctrl_classes_are_applied_read_back_followed_and_removed() {
    let dir = tempdir();
    let bus = PrivateBus::start(dir.path());
    let cfg = config(&[DP_CACHE, WEB_CACHE]);
    let d = Daemon::start_shaped(
        dir.path(),
        "1x4x2:1",
        Some(&cfg),
        &["--bus", &bus.address, "--check-interval", "1"],
    );
    let sb = d.sb.clone();
    // Applied before READY: one group per pool with a cache table, its CPUs and schemata.
    assert_eq!(rc(&sb, "cpupool-dp/cpus_list").as_deref(), Some("1-2,5-6"), "{}", d.logs());
    let dp = rc(&sb, "cpupool-dp/schemata").unwrap_or_default();
    assert!(dp.contains("L3:0=fc0") && dp.contains("MB:0=50"), "50% of 12 ways from the top: {dp}");
    assert_eq!(rc(&sb, "cpupool-web/cpus_list").as_deref(), Some("3,7"));
    assert!(rc(&sb, "cpupool-web/schemata").unwrap_or_default().contains("L3:0=3"));
    assert_eq!(rc(&sb, "cpus_list").as_deref(), Some("0,4"), "the rest stays in the default group");
    assert!(!sb.join("resctrl/cpupool-sys").exists(), "no group for a pool without a cache table");

    // Every surface shows the rows: varlink, D-Bus.
    let l3 = row(&d, "dp", "l3");
    assert_eq!(
        l3,
        json!({ "pool": "dp", "class": "cache", "key": "l3", "wanted": "50%", "in_force": "fc0",
                "scope": "cpupool-dp", "state": "applied", "reason": "" })
    );
    assert_eq!(row(&d, "dp", "mb")["in_force"], "50");
    assert_eq!(row(&d, "web", "l3")["wanted"], "0x3");
    assert_eq!(classes(&d, "dp").map(|c| c.as_array().map(Vec::len)), Ok(Some(2)));
    assert_eq!(classes(&d, "sys"), Ok(json!([])));
    let e = classes(&d, "nope").err().unwrap_or_default();
    assert_eq!(e.0, "org.cpupool.Manager.NoSuchPool", "{e:?}");
    let out = Command::new("busctl")
        .arg(format!("--address={}", bus.address))
        .args(["call", "org.cpupool.Manager1", "/org/cpupool/Manager1", "org.cpupool.Manager1"])
        .args(["GetClasses", "s", "dp"])
        .output()
        .unwrap_or_else(|e| panic!("busctl: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        text.trim(),
        "a(sssssss) 2 \"dp\" \"cache\" \"l3\" \"50%\" \"fc0\" \"cpupool-dp\" \"applied\" \
         \"dp\" \"cache\" \"mb\" \"50\" \"50\" \"cpupool-dp\" \"applied\""
    );

    // Someone rewrites the schemata: the drift check puts it back.
    fs::write(sb.join("resctrl/cpupool-dp/schemata"), "    L3:0=fff\n    MB:0=100\n")
        .unwrap_or_else(|e| panic!("{e}"));
    until(&d, "cpupool-dp's schemata put back", || {
        rc(&sb, "cpupool-dp/schemata").is_some_and(|s| s.contains("L3:0=fc0") && s.contains("MB:0=50"))
    });

    // A resize moves the CPUs between groups.
    let resized =
        cfg.replace("cpus = \"1-2,5-6\"", "cpus = \"1,5\"").replace("cpus = \"3,7\"", "cpus = \"2-3,6-7\"");
    reload(&d, &resized).unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
    assert_eq!(rc(&sb, "cpupool-dp/cpus_list").as_deref(), Some("1,5"));
    assert_eq!(rc(&sb, "cpupool-web/cpus_list").as_deref(), Some("2-3,6-7"));

    // The setting removed: its group goes, its CPUs back to the default group.
    reload(&d, &resized.replace(WEB_CACHE, "")).unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
    assert!(!sb.join("resctrl/cpupool-web").exists());
    assert_eq!(rc(&sb, "cpus_list").as_deref(), Some("0,2-4,6-7"));
    assert_eq!(classes(&d, "web"), Ok(json!([])));

    // The daemon stops: its groups go (daemon.cache_restore_on_stop defaults to true).
    d.stop();
    assert!(!sb.join("resctrl/cpupool-dp").exists());
    assert_eq!(rc(&sb, "cpus_list").as_deref(), Some("0-7"));
}

#[test]
fn fake_resctrl_a_crash_leaves_groups_that_the_restart_adopts_or_removes() {
    let dir = tempdir();
    let args = ["--bus", "none"];
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(&config(&[DP_CACHE, WEB_CACHE])), &args);
    let sb = d.sb.clone();
    assert!(sb.join("resctrl/cpupool-web").exists(), "{}", d.logs());
    // Someone else's group holds a CLOSID and is none of the daemon's business.
    fs::create_dir(sb.join("resctrl/other")).unwrap_or_else(|e| panic!("{e}"));
    for (f, v) in [("cpus_list", "\n"), ("schemata", "    L3:0=fff\n    MB:0=100\n"), ("tasks", "")] {
        fs::write(sb.join("resctrl/other").join(f), v).unwrap_or_else(|e| panic!("{e}"));
    }
    d.kill();
    // The crash left both groups as they were.
    assert_eq!(rc(&sb, "cpupool-dp/cpus_list").as_deref(), Some("1-2,5-6"));
    assert!(sb.join("resctrl/cpupool-web").exists());
    // While it was down: dp's schemata changed, and web no longer wants a group.
    fs::write(sb.join("resctrl/cpupool-dp/schemata"), "    L3:0=fff\n    MB:0=100\n")
        .unwrap_or_else(|e| panic!("{e}"));
    fs::write(
        sb.join("etc/cpupoold/config.toml"),
        config(&[DP_CACHE, "[daemon]\ncache_restore_on_stop = false\n"]),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", None, &args);
    // Adopted and corrected before READY; the stale one removed; the foreign one untouched.
    let dp = rc(&sb, "cpupool-dp/schemata").unwrap_or_default();
    assert!(dp.contains("L3:0=fc0") && dp.contains("MB:0=50"), "{dp}\n{}", d.logs());
    assert!(!sb.join("resctrl/cpupool-web").exists(), "{}", d.logs());
    assert!(sb.join("resctrl/other").exists());
    assert_eq!(row(&d, "dp", "l3")["state"], "applied");
    // cache_restore_on_stop = false: the group outlives the daemon.
    d.stop();
    assert_eq!(rc(&sb, "cpupool-dp/cpus_list").as_deref(), Some("1-2,5-6"));
}

/// A reload of `cache` (a `[pools.NAME.cache]` table or more) is refused naming `key` with
/// `what`, and nothing changes: the running classes, the group, the daemon.
fn refused(d: &Daemon, cache: &str, key: &str, what: &str) {
    let before = (rc(&d.sb, "cpupool-dp/schemata"), rc(&d.sb, "cpupool-dp/cpus_list"), classes(d, ""));
    let (name, params) = reload(d, &config(&[cache])).err().unwrap_or_else(|| panic!("{cache} was taken"));
    assert_eq!(name, "org.cpupool.Manager.ConfigRejected", "{params}");
    let reason = params["reason"].as_str().unwrap_or_default();
    assert!(reason.contains(&format!("{key}: ")) && reason.contains(what), "{cache}: {reason}");
    let after = (rc(&d.sb, "cpupool-dp/schemata"), rc(&d.sb, "cpupool-dp/cpus_list"), classes(d, ""));
    assert_eq!(before, after, "{cache} changed something");
    assert!(!d.sb.join("resctrl/cpupool-web").exists(), "{cache}");
    let status = Varlink::connect(&d.varlink).call("Status", json!({})).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(status["config_error"].as_str().unwrap_or_default().contains(key), "{status}");
}

#[test]
fn fake_resctrl_values_the_host_cannot_take_are_refused_naming_the_key() {
    let dir = tempdir();
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(&config(&[DP_CACHE])), &["--bus", "none"]);
    let sb = d.sb.clone();
    let set =
        |rel: &str, v: &str| fs::write(sb.join("resctrl").join(rel), v).unwrap_or_else(|e| panic!("{e}"));
    let dp = |l3: &str, mb: u32| format!("[pools.dp.cache]\nl3 = \"{l3}\"\nmb = {mb}\n");
    // Syntax: the parser.
    refused(&d, &dp("lots", 50), "pools.dp.cache.l3", "neither a share");
    refused(&d, &dp("50%", 0), "pools.dp.cache.mb", "between 1 and 100");
    refused(&d, "[pools.dp.cache]\nl2 = \"50%\"\n", "pools.dp.cache.l2", "unknown field");
    // What the host offers: info/.
    refused(&d, &dp("0xf0f", 50), "pools.dp.cache.l3", "not contiguous");
    refused(&d, &dp("0x1000", 50), "pools.dp.cache.l3", "outside cbm_mask 0xfff");
    set("info/L3/min_cbm_bits", "2\n");
    refused(&d, &dp("0x8", 50), "pools.dp.cache.l3", "fewer than min_cbm_bits (2)");
    refused(&d, &dp("5%", 50), "pools.dp.cache.l3", "fewer than min_cbm_bits (2)");
    refused(&d, &dp("50%", 55), "pools.dp.cache.mb", "not a multiple of bandwidth_gran (10%)");
    refused(&d, &dp("50%", 5), "pools.dp.cache.mb", "below min_bandwidth (10%)");
    // Two CLOSIDs: the default group's and one more.
    set("info/MB/num_closids", "2\n");
    refused(
        &d,
        &format!("{}{WEB_CACHE}", dp("50%", 50)),
        "pools.web.cache.l3",
        "2 pools set cache classes, but resctrl has 2 CLOSIDs",
    );
    set("info/MB/num_closids", "8\n");
    // What the host lacks.
    fs::remove_dir_all(sb.join("resctrl/info/MB")).unwrap_or_else(|e| panic!("{e}"));
    let missing = format!(
        "not supported on this host: no memory bandwidth allocation (`{}` is missing)",
        sb.join("resctrl/info/MB").display()
    );
    refused(&d, &dp("50%", 50), "pools.dp.cache.mb", &missing);
    fs::remove_dir_all(sb.join("resctrl/info")).unwrap_or_else(|e| panic!("{e}"));
    let missing = format!(
        "not supported on this host: no resctrl (`{}` is missing)",
        sb.join("resctrl/info").display()
    );
    refused(&d, &dp("25%", 50), "pools.dp.cache.l3", &missing);
    // A configuration without cache classes needs no resctrl.
    reload(&d, &config(&[])).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(classes(&d, ""), Ok(json!([])));
    d.stop();
}

#[test]
fn fake_resctrl_a_start_with_a_key_the_host_lacks_is_refused_naming_it() {
    let dir = tempdir();
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(&config(&[])), &["--bus", "none"]);
    let sb = d.sb.clone();
    d.stop();
    fs::remove_dir_all(sb.join("resctrl/info/MB")).unwrap_or_else(|e| panic!("{e}"));
    fs::write(sb.join("etc/cpupoold/config.toml"), config(&[DP_CACHE])).unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(env!("CARGO_BIN_EXE_cpupoold"))
        .arg("--sandbox")
        .arg(&sb)
        .args(["--topology", "1x4x2:1", "--bus", "none"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("pools.dp.cache.mb: not supported on this host: no memory bandwidth allocation"),
        "{stderr}"
    );
    assert!(!sb.join("resctrl/cpupool-dp").exists(), "nothing was applied");
}

#[test]
fn get_classes_through_the_third_party_client() {
    if !test_support::needs::python_varlink() {
        return;
    }
    let dir = tempdir();
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(&config(&[DP_CACHE])), &["--bus", "none"]);
    let target = format!("unix:{}/org.cpupool.Manager.GetClasses", d.varlink.display());
    let out = Command::new("python3")
        .args(["-m", "varlink.cli", "call", &target, "{\"pool\": \"dp\"}"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let rows = reply["classes"].as_array().cloned().unwrap_or_default();
    let keys: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap_or(""),
                r["in_force"].as_str().unwrap_or(""),
                r["state"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(keys, vec![("l3", "fc0", "applied"), ("mb", "50", "applied")], "{reply}");
    d.stop();
}

/// `GET /metrics` on the sandbox's unix metrics socket: the body.
fn scrape(sb: &Path) -> String {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(sb.join("run/metrics.sock"))
        .unwrap_or_else(|e| panic!("metrics socket: {e}"));
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: cpupoold\r\nConnection: close\r\n\r\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap_or_else(|e| panic!("{e}"));
    text
}

#[test]
fn fake_resctrl_a_setting_that_does_not_hold_is_degraded_with_why_on_every_surface() {
    let dir = tempdir();
    let cfg = config(&[DP_CACHE, "[metrics]\nlisten = \"unix:/run/cpupoold/metrics.sock\"\n"]);
    let d =
        Daemon::start_shaped(dir.path(), "1x4x2:1", Some(&cfg), &["--bus", "none", "--check-interval", "1"]);
    let sb = d.sb.clone();
    let sample = |state: &str, v: u8| {
        format!("cpupoold_class_setting_{state}{{pool=\"dp\",class=\"cache\",key=\"l3\"}} {v}")
    };
    let m = scrape(&sb);
    assert!(m.contains(&sample("applied", 1)) && m.contains(&sample("degraded", 0)), "{m}");
    assert!(m.contains(&sample("unsupported", 0)), "{m}");
    // The group's schemata cannot be read or written any more (a directory stands there).
    let schemata = sb.join("resctrl/cpupool-dp/schemata");
    fs::remove_file(&schemata).unwrap_or_else(|e| panic!("{e}"));
    fs::create_dir(&schemata).unwrap_or_else(|e| panic!("{e}"));
    until(&d, "dp's l3 degraded", || row(&d, "dp", "l3")["state"] == "degraded");
    let l3 = row(&d, "dp", "l3");
    assert!(l3["reason"].as_str().unwrap_or_default().contains("cpupool-dp/schemata"), "{l3}");
    let m = scrape(&sb);
    assert!(m.contains(&sample("applied", 0)) && m.contains(&sample("degraded", 1)), "{m}");
    // Put right: the next check applies it again.
    fs::remove_dir(&schemata).unwrap_or_else(|e| panic!("{e}"));
    fs::write(&schemata, "    L3:0=fff\n    MB:0=100\n").unwrap_or_else(|e| panic!("{e}"));
    until(&d, "dp's l3 applied again", || row(&d, "dp", "l3")["state"] == "applied");
    assert!(rc(&sb, "cpupool-dp/schemata").unwrap_or_default().contains("L3:0=fc0"));
    d.stop();
}
