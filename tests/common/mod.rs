//! What the API integration tests share: a private `dbus-daemon`, the real `cpupoold` binary on
//! a sandbox host attached to it, and a small varlink client.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

/// A `dbus-daemon` of the test's own, on a socket in the test's directory. Its policy lets
/// anyone own and call anything, so the daemon's own uid check is what is tested.
pub struct PrivateBus {
    child: Child,
    /// `unix:path=...`.
    pub address: String,
}

impl PrivateBus {
    /// A bus whose policy allows everything.
    pub fn start(dir: &Path) -> PrivateBus {
        let sock = dir.join("bus.sock");
        let conf = dir.join("bus.conf");
        fs::write(&conf, cpupoold::sandbox::permissive_bus_config(&sock)).unwrap();
        PrivateBus::spawn(&conf, &sock, dir)
    }

    /// A bus with the distribution's system bus policy (`/usr/share/dbus-1/system.conf`, its
    /// address, user, pid file and include directories taken out) plus `policy`.
    pub fn system_like(dir: &Path, policy: &Path) -> PrivateBus {
        let sock = dir.join("bus.sock");
        let conf = dir.join("system-bus.conf");
        let system =
            fs::read_to_string("/usr/share/dbus-1/system.conf").expect("the dbus package's system.conf");
        let mut out = String::new();
        for line in system.lines() {
            let t = line.trim_start();
            let dropped = [
                "<listen>",
                "<user>",
                "<pidfile>",
                "<fork/>",
                "<includedir>",
                "<include ",
                "<standard_system_servicedirs/>",
            ];
            if dropped.iter().any(|d| t.starts_with(d)) {
                continue;
            }
            if t.starts_with("</busconfig>") {
                out.push_str(&format!("  <listen>unix:path={}</listen>\n", sock.display()));
                out.push_str(&format!("  <include>{}</include>\n", policy.display()));
            }
            out.push_str(line);
            out.push('\n');
        }
        fs::write(&conf, out).unwrap();
        PrivateBus::spawn(&conf, &sock, dir)
    }

    fn spawn(conf: &Path, sock: &Path, dir: &Path) -> PrivateBus {
        let mut child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", conf.display()))
            .args(["--nofork", "--print-address"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("dbus-daemon (package dbus) is needed");
        // It prints its address once it listens.
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert!(!line.is_empty(), "dbus-daemon did not start with {}", conf.display());
        open_to_everyone(dir);
        PrivateBus { child, address: format!("unix:path={}", sock.display()) }
    }
}

impl Drop for PrivateBus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Lets an unprivileged uid reach sockets under `dir` (and the tests' temp dir above it).
pub fn open_to_everyone(dir: &Path) {
    for d in dir.ancestors().take(3) {
        if let Ok(m) = fs::metadata(d) {
            let mut p = m.permissions();
            p.set_mode(p.mode() | 0o755);
            let _ = fs::set_permissions(d, p);
        }
    }
}

/// The real daemon on a sandbox host.
pub struct Daemon {
    child: Child,
    /// The sandbox directory.
    pub sb: PathBuf,
    /// The varlink socket.
    pub varlink: PathBuf,
    log: PathBuf,
}

/// The sandbox configuration the API tests use, on a 1x4x2 host (CPU c and c+4 are siblings):
/// reserved 0,4; exclusive `dp` 1-2,5-6 in whole cores; shared `web` 3,7.
pub const CONFIG: &str = include_str!("../fixtures/1x4x2.toml");

impl Daemon {
    /// Starts `cpupoold --sandbox DIR/sb --topology 1x4x2:1 ARGS` with [`CONFIG`] and waits for
    /// the READY banner.
    pub fn start(dir: &Path, args: &[&str]) -> Daemon {
        Daemon::start_with(dir, Some(CONFIG), args)
    }

    /// Like [`Daemon::start`] with the sandbox's own sample configuration for 1x4x2: reserved
    /// 0,4; exclusive `dp` 2 CPUs in whole cores; shared `web` the four others.
    pub fn start_sample(dir: &Path, args: &[&str]) -> Daemon {
        Daemon::start_with(dir, None, args)
    }

    fn start_with(dir: &Path, config: Option<&str>, args: &[&str]) -> Daemon {
        Daemon::start_shaped(dir, "1x4x2:1", config, args)
    }

    /// Like [`Daemon::start`] on a host of another shape (`SxCxT:N`), with `config` (or the
    /// sandbox's sample).
    pub fn start_shaped(dir: &Path, shape: &str, config: Option<&str>, args: &[&str]) -> Daemon {
        Daemon::start_shaped_env(dir, shape, config, args, &[])
    }

    /// Like [`Daemon::start_shaped`] with `env` added to the daemon's environment.
    pub fn start_shaped_env(
        dir: &Path,
        shape: &str,
        config: Option<&str>,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        Daemon::start_wrapped(dir, &[], shape, config, args, env)
    }

    /// Like [`Daemon::start_shaped_env`], the daemon run through `wrapper` (e.g.
    /// `["prlimit", "--nofile=64"]`).
    pub fn start_wrapped(
        dir: &Path,
        wrapper: &[&str],
        shape: &str,
        config: Option<&str>,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        let sb = dir.join("sb");
        fs::create_dir_all(sb.join("etc/cpupoold")).unwrap();
        if let Some(config) = config.filter(|_| !sb.join("etc/cpupoold/config.toml").exists()) {
            fs::write(sb.join("etc/cpupoold/config.toml"), config).unwrap();
        }
        let log = dir.join("daemon.log");
        let bin = Path::new(env!("CARGO_BIN_EXE_cpupoold"));
        let test_support::daemon::Spawned { child, banner, varlink, .. } =
            test_support::daemon::spawn_wrapped(wrapper, bin, &sb, shape, args, env, &log);
        let log_text = fs::read_to_string(&log).unwrap_or_default();
        let varlink = varlink.unwrap_or_else(|| panic!("no READY banner:\n{banner}\n{log_text}"));
        open_to_everyone(&sb.join("run"));
        Daemon { child, sb, varlink, log }
    }

    /// `unix:` + the varlink socket.
    pub fn address(&self) -> String {
        format!("unix:{}", self.varlink.display())
    }

    pub fn logs(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The sandbox's cgroupfs file `rel`.
    pub fn cgroup(&self, rel: &str) -> Option<String> {
        // The daemon writes an empty set as a newline, as the kernel shows it.
        fs::read_to_string(self.sb.join("cgroup").join(rel)).ok().map(|s| s.trim_end_matches('\n').to_owned())
    }

    /// Every assignment the daemon serves (over varlink), after checking it against the host:
    /// every target is a cgroup whose `cpuset.cpus` holds the assignment's CPUs, and no CPU of the
    /// exclusive pool `exclusive` is owned twice. `ctx` prefixes every failure.
    pub fn served_assignments(&self, exclusive: &str, ctx: &str) -> Vec<Value> {
        let mut v = Varlink::connect(&self.varlink);
        let list = v.call("ListAssignments", json!({})).unwrap();
        let list = list["assignments"].as_array().unwrap().clone();
        let mut owned = std::collections::BTreeSet::new();
        for a in &list {
            let (id, cpus) = (a["id"].as_str().unwrap(), a["cpus"].as_str().unwrap());
            let target = a["target"].as_str().unwrap();
            let rel =
                target.strip_prefix("cgroup:").unwrap_or_else(|| panic!("{ctx}: {id} targets {target}"));
            let file = self.cgroup(&format!("{rel}/cpuset.cpus"));
            assert_eq!(file.as_deref(), Some(cpus), "{ctx}: cgroup file of {id} ({rel})");
            if a["pool"] == exclusive {
                for cpu in cpupoold::core::cpuset::CpuSet::parse(cpus).unwrap().iter() {
                    assert!(owned.insert(cpu), "{ctx}: CPU {cpu} owned twice ({id})");
                }
            }
        }
        list
    }

    /// The durable state's bytes: the snapshot, then the journal of changes since.
    pub fn state_file(&self) -> Vec<u8> {
        let mut bytes = fs::read(self.sb.join("state/state.json")).unwrap_or_default();
        bytes.extend(fs::read(self.sb.join("state/state.journal")).unwrap_or_default());
        bytes
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The daemon's resident memory (`VmRSS` of `/proc/PID/status`), in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS in /proc/PID/status");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL, as a crash: no chance to finish anything.
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL the daemon");
        self.child.wait().expect("reap the daemon");
    }

    /// Stops with SIGTERM and checks for a clean exit.
    pub fn stop(mut self) {
        let log = self.log.clone();
        test_support::daemon::stop(&mut self.child, || fs::read_to_string(&log).unwrap_or_default());
    }

    /// Stops the daemon and returns its whole log: what its threads were still writing when
    /// the last call returned is in it (read before the stop, it may not be yet).
    pub fn stop_with_logs(self) -> String {
        let log = self.log.clone();
        self.stop();
        fs::read_to_string(&log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A daemon killed so leaves its sandbox's private bus running, for a next start to use
        // again; the test's directory goes now, and the bus with it.
        for pid in test_support::daemon::bus_daemons(&self.sb) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
        }
    }
}

/// A minimal varlink client: one connection, calls answered in order.
pub struct Varlink {
    stream: UnixStream,
    buf: Vec<u8>,
}

impl Varlink {
    pub fn connect(path: &Path) -> Varlink {
        Varlink::try_connect(path).unwrap()
    }

    /// Like [`Varlink::connect`], with an `Err` when nothing listens.
    pub fn try_connect(path: &Path) -> std::io::Result<Varlink> {
        Ok(Varlink { stream: UnixStream::connect(path)?, buf: Vec::new() })
    }

    /// Calls `org.cpupool.Manager.METHOD`: the reply's parameters, or (error name, parameters).
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, (String, Value)> {
        self.try_call(method, params).expect("the daemon answers")
    }

    /// Like [`Varlink::call`], with an `Err` when the connection fails (the daemon died).
    pub fn try_call(
        &mut self,
        method: &str,
        params: Value,
    ) -> std::io::Result<Result<Value, (String, Value)>> {
        let mut msg = serde_json::to_vec(&json!({
            "method": format!("org.cpupool.Manager.{method}"),
            "parameters": params,
        }))
        .unwrap();
        msg.push(0);
        self.send_raw(&msg)?;
        let reply = self.read()?;
        Ok(match reply.get("error").and_then(Value::as_str) {
            Some(e) => Err((e.to_owned(), reply["parameters"].clone())),
            None => Ok(reply["parameters"].clone()),
        })
    }

    /// Makes reads and writes fail after `limit` instead of waiting for good.
    pub fn set_timeout(&self, limit: std::time::Duration) {
        self.stream.set_read_timeout(Some(limit)).unwrap();
        self.stream.set_write_timeout(Some(limit)).unwrap();
    }

    /// The connection itself.
    pub fn into_stream(self) -> UnixStream {
        self.stream
    }

    /// Calls `Monitor` and waits for its first reply, the replay of a pool as `current`: the
    /// daemon subscribes before it replays, so every change made after this returns is on the
    /// stream (a change made before the first reply could fall before the subscription).
    pub fn monitor(&mut self) -> std::io::Result<()> {
        self.send_raw(b"{\"method\":\"org.cpupool.Manager.Monitor\",\"more\":true}\0")?;
        let first = self.read()?;
        assert_eq!(first["parameters"]["event"]["change"], "current", "Monitor's first reply: {first}");
        Ok(())
    }

    /// Sends bytes as they are (a frame ends at a NUL).
    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// The next reply, whole.
    pub fn read(&mut self) -> std::io::Result<Value> {
        loop {
            if let Some(end) = self.buf.iter().position(|b| *b == 0) {
                let frame: Vec<u8> = self.buf.drain(..=end).collect();
                return serde_json::from_slice(&frame[..end]).map_err(std::io::Error::other);
            }
            let mut chunk = [0u8; 65536];
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the daemon closed the connection",
                ));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// The kubelet's side the device plugin needs, for the sandbox `sb`, served on `rt`: the
/// registration socket in `sb/kubelet/device-plugins` (each Register handed to `registration`)
/// and PodResources in `sb/kubelet/pod-resources` answered from `pods`. No CRI socket.
pub fn kubelet_peer(
    rt: &tokio::runtime::Runtime,
    sb: &Path,
    pods: test_support::kubelet::MemoryPods,
    registration: test_support::kubelet::Registration,
) -> test_support::kubelet::Kubelet {
    let plugins = sb.join("kubelet/device-plugins");
    fs::create_dir_all(&plugins).unwrap();
    fs::create_dir_all(sb.join("kubelet/pod-resources")).unwrap();
    let _guard = rt.enter();
    test_support::kubelet::serve_pod_resources(&sb.join("kubelet/pod-resources/kubelet.sock"), pods).unwrap();
    test_support::kubelet::Kubelet::serve(&plugins, registration).unwrap()
}
