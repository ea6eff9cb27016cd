//! The metrics endpoint of the real `cpupoold` on a sandbox host, read by third-party parsers:
//! `promtool check metrics` (Debian's `prometheus` package) lints the Prometheus text format,
//! and the PyPI `prometheus_client` parsers read both it and OpenMetrics. The values must be
//! those of the pools and assignments the test made.
//!
//! Without `promtool` or `prometheus_client` the test fails, saying what to install
//! (`test_support::needs`); `.ci/run` installs both.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;

use common::{PrivateBus, Varlink, CONFIG};
use serde_json::{json, Value};

/// A sandbox daemon with [`CONFIG`] and the metrics URL its banner prints.
struct Daemon {
    /// Killed and reaped when the test ends, passing or failing.
    child: test_support::daemon::Reaped,
    log: std::path::PathBuf,
    varlink: std::path::PathBuf,
    /// `127.0.0.1:PORT`.
    addr: String,
    banner: String,
}

impl Daemon {
    fn start(dir: &Path) -> Daemon {
        Daemon::start_with(dir, &["--bus", "none"])
    }

    fn start_with(dir: &Path, args: &[&str]) -> Daemon {
        Daemon::start_config(dir, Some(CONFIG), args)
    }

    /// With `config`, or the sandbox's own sample (an isolated pool with a cache class).
    fn start_config(dir: &Path, config: Option<&str>, args: &[&str]) -> Daemon {
        let sb = dir.join("sb");
        if let Some(config) = config {
            std::fs::create_dir_all(sb.join("etc/cpupoold")).unwrap_or_else(|e| panic!("{e}"));
            std::fs::write(sb.join("etc/cpupoold/config.toml"), config).unwrap_or_else(|e| panic!("{e}"));
        }
        let log = dir.join("daemon.log");
        let bin = Path::new(env!("CARGO_BIN_EXE_cpupoold"));
        let s = test_support::daemon::spawn(bin, &sb, "1x4x2:1", args, &log);
        let logs = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(s.ready, "no READY banner:\n{}\n{logs}", s.banner);
        let url = s
            .banner
            .lines()
            .find_map(|l| l.trim().strip_prefix("metrics").map(str::trim))
            .unwrap_or_else(|| panic!("no metrics line in the banner:\n{}", s.banner));
        let addr = url
            .strip_prefix("http://")
            .and_then(|r| r.strip_suffix("/metrics"))
            .unwrap_or_else(|| panic!("`{url}` is not http://ADDR/metrics"))
            .to_owned();
        assert!(addr.starts_with("127.0.0.1:"), "the sandbox serves metrics on loopback only: {addr}");
        let varlink = s.varlink.unwrap_or_else(|| panic!("no varlink line:\n{}", s.banner));
        Daemon { child: test_support::daemon::Reaped(s.child), log, varlink, addr, banner: s.banner }
    }

    fn stop(mut self) {
        let log = self.log.clone();
        test_support::daemon::stop(&mut self.child, || std::fs::read_to_string(&log).unwrap_or_default());
    }
}

/// One HTTP/1.1 request: (status, headers, body).
fn http(addr: &str, request: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.set_read_timeout(Some(test_support::wait::PATIENCE)).unwrap_or_else(|e| panic!("{e}"));
    s.write_all(request.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap_or_else(|e| panic!("reading the reply: {e}"));
    let text = String::from_utf8(raw).unwrap_or_else(|e| panic!("{e}"));
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no header end: {text:?}"));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

fn get(addr: &str, accept: &str) -> (String, String) {
    let (status, head, body) = http(
        addr,
        &format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(status, 200, "{head}\n{body}");
    (head, body)
}

/// Runs `cmd` with `text` on its stdin: its status and output.
fn piped(cmd: &mut Command, text: &str) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    child
        .stdin
        .take()
        .map(|mut i| i.write_all(text.as_bytes()))
        .transpose()
        .unwrap_or_else(|e| panic!("{e}"));
    child.wait_with_output().unwrap_or_else(|e| panic!("{e}"))
}

/// `promtool check metrics` (where installed) passes `text` without a single lint remark
/// (naming conventions, units, help text).
fn promtool_finds_nothing(text: &str) {
    if test_support::needs::command(&["promtool", "--version"], "`apt install prometheus` (promtool)") {
        let out = piped(Command::new("promtool").args(["check", "metrics"]), text);
        let said =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics:\n{said}\n{text}");
    }
}

/// Every sample the Python parser read: `name{label="v",...}` (labels sorted) → value.
fn parse_with_python(text: &str, openmetrics: bool) -> serde_json::Map<String, Value> {
    let script = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om
text = sys.stdin.read()
parse = om if sys.argv[1] == "om" else text_string_to_metric_families
out = {}
for fam in parse(text):
    for s in fam.samples:
        labels = ",".join('%s="%s"' % kv for kv in sorted(s.labels.items()))
        out["%s{%s}" % (s.name, labels)] = s.value
print(json.dumps(out))
"#;
    let out =
        piped(Command::new("python3").args(["-c", script, if openmetrics { "om" } else { "text" }]), text);
    assert!(
        out.status.success(),
        "prometheus_client could not parse the scrape:\n{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}"))
}

fn value(samples: &serde_json::Map<String, Value>, key: &str) -> f64 {
    samples.get(key).and_then(Value::as_f64).unwrap_or_else(|| {
        panic!("no sample `{key}` among:\n{}", samples.keys().cloned().collect::<Vec<_>>().join("\n"))
    })
}

#[test]
fn a_scrape_parses_and_shows_the_pools_and_assignments_made() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start(dir.path());
    let mut v = Varlink::connect(&d.varlink);
    // A cgroup target must exist (the sandbox's cgroupfs is plain directories).
    std::fs::create_dir_all(dir.path().join("sb/cgroup/metrics/a")).unwrap_or_else(|e| panic!("{e}"));
    let a = v
        .call("Assign", json!({ "pool": "dp", "target": "cgroup:metrics/a", "cpus": 2 }))
        .unwrap_or_else(|e| panic!("Assign dp: {e:?}"));
    assert_eq!(a["assignment"]["pool"], "dp", "{a}");
    // A pid target: the sandbox records the affinity it would set, the test itself runs on.
    let me = format!("pid:{}", std::process::id());
    v.call("Assign", json!({ "pool": "web", "target": me, "millicpus": 500 }))
        .unwrap_or_else(|e| panic!("Assign web: {e:?}"));
    match v.call("GetPool", json!({ "name": "nosuch" })) {
        Err((name, _)) => assert!(name.ends_with(".NoSuchPool"), "{name}"),
        Ok(p) => panic!("GetPool nosuch answered {p}"),
    }

    // The Prometheus text format: linted by promtool, parsed by prometheus_client.
    let (head, text) = get(&d.addr, "text/plain");
    assert!(head.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{head}");
    promtool_finds_nothing(&text);
    if !test_support::needs::python_module("prometheus_client", "prometheus_client") {
        d.stop();
        return;
    }
    let s = parse_with_python(&text, false);
    // 1x4x2: dp is 1-2,5-6 (4 CPUs), web 3,7; a core of dp (whole cores) and half a CPU of web given out.
    assert_eq!(value(&s, r#"cpupoold_pool_cpus{kind="exclusive",pool="dp"}"#), 4.0);
    assert_eq!(value(&s, r#"cpupoold_pool_capacity_millicpus{pool="dp"}"#), 4000.0);
    assert_eq!(value(&s, r#"cpupoold_pool_free_millicpus{pool="dp"}"#), 2000.0);
    assert_eq!(value(&s, r#"cpupoold_pool_free_millicpus{pool="web"}"#), 1500.0);
    assert_eq!(value(&s, r#"cpupoold_pool_assignments{pool="dp"}"#), 1.0);
    assert_eq!(value(&s, r#"cpupoold_pool_assignments{pool="web"}"#), 1.0);
    assert_eq!(value(&s, r#"cpupoold_pool_assignments{pool="sys"}"#), 0.0);
    assert_eq!(value(&s, r#"cpupoold_assignments{pool="dp",target_kind="cgroup"}"#), 1.0);
    assert_eq!(value(&s, r#"cpupoold_assignments{pool="web",target_kind="pid"}"#), 1.0);
    assert_eq!(value(&s, r#"cpupoold_pool_degraded{pool="dp"}"#), 0.0);
    assert_eq!(value(&s, r#"cpupoold_api_requests_total{method="Assign",transport="varlink"}"#), 2.0);
    assert_eq!(
        value(&s, r#"cpupoold_api_errors_total{error="NoSuchPool",method="GetPool",transport="varlink"}"#),
        1.0
    );
    assert_eq!(
        value(&s, r#"cpupoold_api_request_duration_seconds_count{method="Assign",transport="varlink"}"#),
        2.0
    );
    // Start, and each assignment, saved the state.
    assert!(value(&s, "cpupoold_state_save_duration_seconds_count{}") >= 2.0, "{text}");
    assert!(value(&s, "process_resident_memory_bytes{}") > 0.0, "{text}");
    assert_eq!(value(&s, r#"cpupoold_config_rejected{}"#), 0.0);

    // OpenMetrics, as Prometheus asks for it: the same figures.
    let (head, om) =
        get(&d.addr, "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5");
    assert!(head.to_ascii_lowercase().contains("content-type: application/openmetrics-text"), "{head}");
    assert!(om.ends_with("# EOF\n"), "{om}");
    let s = parse_with_python(&om, true);
    assert_eq!(value(&s, r#"cpupoold_pool_free_millicpus{pool="dp"}"#), 2000.0);
    assert_eq!(value(&s, r#"cpupoold_api_requests_total{method="Assign",transport="varlink"}"#), 2.0);

    // Released: the figures follow.
    let id = a["assignment"]["id"].as_str().unwrap_or_else(|| panic!("no id in {a}")).to_owned();
    v.call("Release", json!({ "id": id })).unwrap_or_else(|e| panic!("Release: {e:?}"));
    let s = parse_with_python(&get(&d.addr, "*/*").1, false);
    assert_eq!(value(&s, r#"cpupoold_pool_free_millicpus{pool="dp"}"#), 4000.0);
    assert_eq!(value(&s, r#"cpupoold_pool_assignments{pool="dp"}"#), 0.0);
    d.stop();
}

#[test]
fn only_get_metrics_is_answered() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start(dir.path());
    assert!(d.banner.contains("  metrics   http://127.0.0.1:"), "{}", d.banner);
    let (status, _, _) = http(&d.addr, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert_eq!(status, 404);
    let (status, head, _) =
        http(&d.addr, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    assert_eq!(status, 405);
    assert!(head.contains("allow: GET, HEAD") || head.contains("Allow: GET, HEAD"), "{head}");
    // A request head larger than the server takes is refused, not buffered.
    let big = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\nConnection: close\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let mut s = TcpStream::connect(&d.addr).unwrap_or_else(|e| panic!("{e}"));
    s.set_read_timeout(Some(test_support::wait::PATIENCE)).unwrap_or_else(|e| panic!("{e}"));
    // The server may close while the head is still being written.
    let _ = s.write_all(big.as_bytes());
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply);
    assert!(!reply.starts_with("HTTP/1.1 200"), "an oversized request head was answered: {reply}");
    // And the endpoint still answers.
    get(&d.addr, "text/plain");
    d.stop();
}

/// Socket activation, as `cpupoold-metrics.socket` does it: `systemd-socket-activate` binds the
/// varlink socket and a loopback TCP socket and passes both; the daemon serves each from the
/// passed descriptors (read once: reading clears the environment), binding neither itself.
#[test]
fn socket_activation_serves_the_passed_tcp_socket() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let sock = dir.path().join("activated.sock");
    let sb = dir.path().join("sb");
    // A free port: the kernel picks it, and the listener is let go for systemd-socket-activate.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap_or_else(|e| panic!("{e}"))
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = test_support::daemon::Reaped(
        Command::new("systemd-socket-activate")
            .arg("--listen")
            .arg(&sock)
            .args(["--listen", &addr])
            .arg(env!("CARGO_BIN_EXE_cpupoold"))
            .arg("--sandbox")
            .arg(&sb)
            .args(["--topology", "1x4x2:1", "--bus", "none"])
            .env_remove("NOTIFY_SOCKET")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("systemd-socket-activate (package systemd): {e}")),
    );
    // It listens before it starts the daemon: wait for the port by connecting, as a scraper
    // would; the connection starts the daemon and is answered once it serves.
    let mut s = loop {
        if let Ok(s) = TcpStream::connect(&addr) {
            break s;
        }
        assert!(child.try_wait().ok().flatten().is_none(), "systemd-socket-activate exited");
        std::thread::yield_now();
    };
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap_or_else(|e| panic!("{e}"));
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap_or_else(|e| panic!("{e}"));
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // The sandbox's sample configuration for 1x4x2: dp is one core, 2 CPUs.
    assert!(reply.contains("\ncpupoold_pool_cpus{pool=\"dp\",kind=\"exclusive\"} 2"), "{reply}");
    let mut banner = String::new();
    for line in BufReader::new(child.stdout.take().unwrap_or_else(|| panic!("stdout"))).lines() {
        let line = line.unwrap_or_else(|e| panic!("{e}"));
        banner.push_str(&line);
        banner.push('\n');
        if line == "READY" {
            break;
        }
    }
    assert!(banner.contains(&format!("  metrics   http://{addr}/metrics")), "{banner}");
    assert!(banner.contains(&format!("varlink   unix:{}", sock.display())), "{banner}");
    assert!(!sb.join("run/org.cpupool.Manager").exists(), "no varlink socket of its own");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap_or_else(|e| panic!("{e}"));
    let status = child.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "{status}");
}

/// D-Bus calls are counted like varlink's, by method and error kind, with `transport="dbus"`.
#[test]
fn dbus_calls_are_counted_by_method_and_error() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let bus = PrivateBus::start(dir.path());
    let d = Daemon::start_with(dir.path(), &["--bus", &bus.address]);
    let busctl = |args: &[&str]| {
        Command::new("busctl")
            .arg(format!("--address={}", bus.address))
            .args(["call", "org.cpupool.Manager1", "/org/cpupool/Manager1", "org.cpupool.Manager1"])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("busctl: {e}"))
    };
    for _ in 0..2 {
        let out = busctl(&["ListPools"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let out = busctl(&["GetPool", "s", "nosuch"]);
    assert!(!out.status.success(), "GetPool nosuch succeeded");
    let (_, text) = get(&d.addr, "text/plain");
    let line = |key: &str| text.lines().find_map(|l| l.strip_prefix(key)).map(str::trim).map(str::to_owned);
    assert_eq!(
        line(r#"cpupoold_api_requests_total{transport="dbus",method="ListPools"}"#).as_deref(),
        Some("2"),
        "{text}"
    );
    assert_eq!(
        line(r#"cpupoold_api_errors_total{transport="dbus",method="GetPool",error="NoSuchPool"}"#).as_deref(),
        Some("1"),
        "{text}"
    );
    d.stop();
}

/// What a restart finds changed while the daemon was away is drift, and counted as such; the
/// first start's writes are not.
#[test]
fn drift_corrected_at_a_restart_is_counted() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let drift = |d: &Daemon| {
        let text = get(&d.addr, "text/plain").1;
        let line = text
            .lines()
            .find(|l| l.starts_with("cpupoold_drift_corrections_total "))
            .unwrap_or_else(|| panic!("no cpupoold_drift_corrections_total in\n{text}"));
        line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or_else(|| panic!("{line}"))
    };
    let d = Daemon::start(dir.path());
    assert_eq!(drift(&d), 0.0, "a first start applies, it corrects no drift");
    d.stop();
    // While it is away, someone narrows web's slice.
    let web = dir.path().join("sb/cgroup/cpupool.slice/cpupool-web.slice/cpuset.cpus");
    let was = std::fs::read_to_string(&web).unwrap_or_else(|e| panic!("{}: {e}", web.display()));
    std::fs::write(&web, "3").unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start(dir.path());
    assert_eq!(std::fs::read_to_string(&web).unwrap_or_default(), was, "the restart put web's CPUs back");
    assert_eq!(drift(&d), 1.0, "one file was corrected");
    d.stop();
}

/// Connections that hold a slot without asking anything, some never sending a request, some
/// idle on a kept-alive connection after one, twice as many as the endpoint has slots (16), do
/// not keep a scraper out: the oldest idle one gives way to a new connection. Before, the 16
/// slots were held until each timed out and every scrape was closed at accept.
#[test]
fn idle_connections_do_not_keep_scrapers_out() {
    const SLOTS: usize = 16;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start(dir.path());
    let mut idle = Vec::new();
    for i in 0..2 * SLOTS {
        let mut s = TcpStream::connect(&d.addr).unwrap_or_else(|e| panic!("connecting to {}: {e}", d.addr));
        if i % 2 == 1 {
            // Kept alive after one answer (a HEAD: no body to read), then idle.
            let _ = s.write_all(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && matches!(s.read(&mut byte), Ok(1)) {
                head.push(byte[0]);
            }
        }
        idle.push(s);
    }
    for _ in 0..5 {
        get(&d.addr, "text/plain");
    }
    drop(idle);
    d.stop();
}

/// The `Family` column of docs/metrics.md's table, `cpupoold_` added where the docs leave it out.
fn documented_families(doc: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in doc.lines().filter(|l| l.starts_with("| `")) {
        let cell = line.split('|').nth(1).unwrap_or_default();
        for name in cell.split('`').skip(1).step_by(2) {
            out.push(if name.starts_with("process_") { name.to_owned() } else { format!("cpupoold_{name}") });
        }
    }
    out
}

/// The family names of the bullets under "Families that appear later".
fn families_said_to_appear_later(doc: &str) -> Vec<String> {
    let start = doc.find("### Families that appear later").unwrap_or_else(|| panic!("no such section"));
    let section = &doc[start..];
    let section = &section[..section[4..].find("\n#").map_or(section.len(), |e| e + 4)];
    section
        .split("\n- ")
        .skip(1)
        .flat_map(|bullet| {
            // Names are the backticked words before each `:`; the text after it may quote files.
            bullet
                .split(';')
                .filter_map(|part| part.split(':').next())
                .flat_map(|names| names.split('`').skip(1).step_by(2).map(|n| format!("cpupoold_{n}")))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every family a scrape shows is documented, and every documented family a fresh sandbox's
/// scrape (the sandbox's own sample configuration) leaves out is one the docs say appears later, and when. (Whether a health sample has
/// happened yet does not matter: a family is either scraped or said to come later.)
#[test]
fn every_documented_family_is_scraped_or_said_to_appear_later() {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"))
        .unwrap_or_else(|e| panic!("docs/metrics.md: {e}"));
    let documented = documented_families(&doc);
    let later = families_said_to_appear_later(&doc);
    assert!(documented.len() >= 30 && later.len() >= 10, "{documented:?}\n{later:?}");
    for name in &later {
        assert!(documented.contains(name), "`{name}` is said to appear later but is not in the table");
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_config(dir.path(), None, &["--bus", "none"]);
    let (_, text) = get(&d.addr, "text/plain");
    let scraped: Vec<&str> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).collect();
    for name in &scraped {
        assert!(documented.iter().any(|d| d == name), "`{name}` is scraped but not in docs/metrics.md");
    }
    for name in &documented {
        assert!(
            scraped.contains(&name.as_str()) || later.contains(name),
            "`{name}` is in docs/metrics.md's table, not in a fresh sandbox's scrape, and not under \
             \"Families that appear later\":\n{text}"
        );
    }
    d.stop();
}

/// Each isolated CPU's interruptions by source are one family with a fixed set of `source`
/// labels per CPU, and the boot isolation's coverage of the isolated pool is counted, as
/// promtool and the PyPI parser read them: the sample's dp (1,5) on a sandbox kernel booted
/// without isolation parameters.
#[test]
fn interruptions_by_source_and_boot_coverage_are_scraped() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_config(dir.path(), None, &["--bus", "none", "--health-interval", "1"]);
    let family = "cpupoold_isolation_interruptions_per_second{";
    let deadline = std::time::Instant::now() + test_support::wait::PATIENCE;
    let text = loop {
        let (_, text) = get(&d.addr, "text/plain");
        if text.contains(family) {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "never scraped `{family}`:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    promtool_finds_nothing(&text);
    if !test_support::needs::python_module("prometheus_client", "prometheus_client") {
        d.stop();
        return;
    }
    let s = parse_with_python(&text, false);
    let mut softirqs =
        ["HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU"]
            .map(|n| format!("softirq:{n}"))
            .to_vec();
    softirqs.extend(["device".to_owned(), "sched:switched_in".to_owned()]);
    for cpu in [1, 5] {
        let mut seen: Vec<String> = s
            .keys()
            .filter_map(|k| {
                let rest = k.strip_prefix(&format!(r#"{family}cpu="{cpu}",pool="dp",source=""#))?;
                Some(rest.strip_suffix("\"}")?.to_owned())
            })
            .collect();
        seen.sort();
        softirqs.sort();
        assert_eq!(seen, softirqs, "CPU {cpu}: every source, one series each:\n{text}");
    }
    let series = s.keys().filter(|k| k.starts_with(family)).count();
    assert_eq!(series, 2 * 12, "two isolated CPUs, twelve sources each:\n{text}");
    for parameter in ["nohz_full", "rcu_nocbs", "isolcpus=managed_irq"] {
        let key = format!(r#"cpupoold_isolation_boot_uncovered_cpus{{parameter="{parameter}",pool="dp"}}"#);
        assert_eq!(value(&s, &key), 2.0, "{parameter}");
    }
    assert_eq!(value(&s, "cpupoold_isolation_boot_unused_cpus{}"), 0.0);
    d.stop();
}
