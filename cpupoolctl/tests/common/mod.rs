//! What the end-to-end tests share: the real `cpupoold` on a sandbox host, found and started
//! as `e2e.rs`'s header says, and `cpupoolctl` run against it.

// Each test crate uses its own part of this.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const CTL: &str = env!("CARGO_BIN_EXE_cpupoolctl");

/// The daemon binary: `$CPUPOOLD_BIN`, or `cpupoold` in this test's target directory
/// (`target/debug/deps/e2e-HASH` → `target/debug/cpupoold`).
pub fn cpupoold_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("CPUPOOLD_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe.parent().and_then(Path::parent).expect("target/debug/deps/..");
    let bin = dir.join("cpupoold");
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo test --workspace --all-targets` (which builds it), \
         `cargo build --bin cpupoold`, or set CPUPOOLD_BIN",
        bin.display()
    );
    bin
}

/// The `dbus-daemon`s serving the private bus of the sandbox in `dir/sb`.
pub fn bus_daemons(dir: &Path) -> Vec<i32> {
    test_support::daemon::bus_daemons(&dir.join("sb"))
}

pub struct Daemon {
    /// The process.
    pub child: Child,
    /// The test's directory (the sandbox is `dir/sb`).
    pub dir: PathBuf,
    /// The sandbox directory.
    pub sb: PathBuf,
    /// Its stderr.
    pub log: PathBuf,
    /// Its banner, up to `READY`.
    pub banner: String,
}

impl Daemon {
    /// Starts the daemon on a fresh 1x4x2:1 sandbox in `dir/sb` and reads its banner up to
    /// `READY`.
    pub fn start(dir: &Path) -> Daemon {
        Daemon::start_shape(dir, "1x4x2:1")
    }

    /// Starts the daemon on the sandbox in `dir/sb` (made with `shape` if it is not there yet)
    /// and reads its banner up to `READY`.
    pub fn start_shape(dir: &Path, shape: &str) -> Daemon {
        // The daemon starts the sandbox's bus; if the daemon is killed, the bus is orphaned.
        // As a subreaper this process inherits it, so Drop can reap it (nothing is left behind
        // as a zombie either).
        static SUBREAPER: std::sync::Once = std::sync::Once::new();
        SUBREAPER.call_once(|| nix::sys::prctl::set_child_subreaper(true).unwrap());
        let sb = dir.join("sb");
        let log = dir.join("daemon.log");
        let test_support::daemon::Spawned { child, banner, ready, .. } =
            test_support::daemon::spawn(&cpupoold_bin(), &sb, shape, &[], &log);
        let d = Daemon { child, dir: dir.to_owned(), sb, log, banner: banner.clone() };
        assert!(ready, "no READY from the daemon:\n{banner}\n{}", d.logs());
        d
    }

    /// A scrape of its metrics endpoint (the banner's `metrics http://ADDR/metrics`): one
    /// HTTP/1.1 GET.
    pub fn metrics(&self) -> String {
        use std::io::{Read, Write};
        let url = self
            .banner
            .lines()
            .find_map(|l| l.trim().strip_prefix("metrics").map(str::trim))
            .unwrap_or_else(|| panic!("no metrics line in the banner:\n{}", self.banner));
        let addr = url.strip_prefix("http://").and_then(|u| u.split('/').next()).unwrap_or(url);
        let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{url}: {e}"));
        s.set_read_timeout(Some(test_support::wait::PATIENCE)).unwrap();
        write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap_or_else(|e| panic!("{url}: {e}"));
        let (head, body) = reply.split_once("\r\n\r\n").unwrap_or_else(|| panic!("{url}: {reply:?}"));
        assert!(head.starts_with("HTTP/1.1 200"), "{url}: {head}");
        body.to_owned()
    }

    /// The sum of the metric lines that start with `series` and contain every one of `labels`.
    pub fn metric_sum(&self, series: &str, labels: &[&str]) -> f64 {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with(series) && labels.iter().all(|x| l.contains(x)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    pub fn logs(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A cgroup directory in the sandbox, for `--cgroup rel`.
    pub fn cgroup(&self, rel: &str) -> PathBuf {
        let p = self.sb.join("cgroup").join(rel);
        fs::create_dir_all(&p).unwrap();
        p
    }

    /// Stops with SIGTERM and checks the exit status.
    pub fn stop(mut self) {
        let log = self.log.clone();
        test_support::daemon::stop(&mut self.child, || fs::read_to_string(&log).unwrap_or_default());
    }
}

impl Drop for Daemon {
    /// After a failed assertion, or a test that did not stop it: leave neither the daemon nor
    /// the sandbox's bus behind. SIGTERM lets the daemon stop the bus itself; whatever is left
    /// after that (or after SIGKILL) is killed and reaped here.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for pid in bus_daemons(&self.dir) {
            let pid = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            // Ours to reap once it was orphaned (see `start`); ECHILD otherwise.
            let _ = nix::sys::wait::waitpid(pid, None);
        }
    }
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// cpupoolctl with the global options that pick the daemon and transport (`via`), run as
/// `wrapper` (e.g. setpriv) if given.
#[derive(Clone)]
pub struct Ctl {
    /// The binary.
    pub bin: PathBuf,
    /// A command it runs under (setpriv ...), if any.
    pub wrapper: Vec<String>,
    /// The global options that pick the daemon and transport.
    pub via: Vec<String>,
}

impl Ctl {
    pub fn new(d: &Daemon, dbus: bool) -> Ctl {
        let mut via = vec!["--sandbox".to_owned(), d.sb.to_string_lossy().into_owned()];
        if dbus {
            via.push("--dbus".into());
        }
        Ctl { bin: PathBuf::from(CTL), wrapper: Vec::new(), via }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = match self.wrapper.split_first() {
            Some((w, rest)) => {
                let mut c = Command::new(w);
                c.args(rest).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        cmd.args(&self.via).args(args);
        cmd
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// `--json ARGS`, which must succeed; the parsed stdout.
    pub fn ok(&self, args: &[&str]) -> Value {
        let out = self.run(&[&["--json"], args].concat());
        assert!(out.status.success(), "{args:?}: {}\n{}", out.status, text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {}", text(&out.stdout)))
    }

    /// `--json ARGS`, which must fail; the exit code and the parsed stderr.
    pub fn err(&self, args: &[&str]) -> (i32, Value) {
        let out = self.run(&[&["--json"], args].concat());
        assert!(!out.status.success(), "{args:?} succeeded: {}", text(&out.stdout));
        assert!(out.stdout.is_empty(), "{args:?} printed on stdout: {}", text(&out.stdout));
        let e = serde_json::from_slice(&out.stderr)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", text(&out.stderr)));
        (out.status.code().unwrap_or(-1), e)
    }

    /// ARGS without --json: exit code, stdout, stderr.
    pub fn human(&self, args: &[&str]) -> (i32, String, String) {
        let out = self.run(args);
        (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
    }

    pub fn pools(&self) -> Value {
        self.ok(&["pool", "list"])["pools"].clone()
    }
}
