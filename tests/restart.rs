//! The one stop the daemon asks for itself: the kubelet's device-plugin directory appears after
//! the start but read-only to the service (systemd's `ReadWritePaths=` takes only what exists at
//! start), so only a start anew can serve it. The daemon stops every task cleanly and exits with
//! status 75, the unit's `RestartForceExitStatus=`.
//!
//! The read-only view is a mount namespace of the daemon's own (`unshare -m`) in which the
//! sandbox's kubelet directory is bound read-only, as systemd's `ProtectSystem=` would leave it;
//! outside, the test creates and removes the directory as a kubelet's installation would.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CONFIG: &str = include_str!("fixtures/1x4x2.toml");

struct Daemon {
    child: Child,
    log: std::path::PathBuf,
}

impl Daemon {
    fn logs(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log holds `what` (or the daemon exits, or 30 s pass).
    fn wait_log(&mut self, what: &str) {
        let deadline = Instant::now() + test_support::wait::PATIENCE;
        while !self.logs().contains(what) {
            let exited = self.child.try_wait().unwrap_or_else(|e| panic!("{e}"));
            assert!(exited.is_none(), "exited with {exited:?} before logging {what:?}:\n{}", self.logs());
            assert!(Instant::now() < deadline, "no {what:?} in the log:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + test_support::wait::PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap_or_else(|e| panic!("{e}")) {
                return status;
            }
            assert!(Instant::now() < deadline, "daemon did not exit:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the daemon on the sandbox `sb` (prepared) with `kubelet` read-only in its namespace,
/// as if systemd had started it (`INVOCATION_ID`).
fn start_with_read_only(sb: &Path, kubelet: &Path, dir: &Path) -> Daemon {
    let log = dir.join("daemon.log");
    let child = Command::new("unshare")
        .args(["-m", "sh", "-c", r#"mount --bind -o ro "$1" "$1" && shift && exec "$@""#, "sh"])
        .arg(kubelet)
        .arg(env!("CARGO_BIN_EXE_cpupoold"))
        .arg("--sandbox")
        .arg(sb)
        .args(["--topology", "1x4x2:1", "--bus", "none"])
        .env("INVOCATION_ID", "0123456789abcdef0123456789abcdef")
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap_or_else(|e| panic!("{e}")))
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    Daemon { child, log }
}

#[test]
fn a_read_only_plugin_directory_made_after_the_start_stops_the_daemon_for_a_restart() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let sb = dir.path().join("sb");
    let sandbox = cpupoold::sandbox::Sandbox::prepare(&sb, Some("1x4x2:1")).unwrap_or_else(|e| panic!("{e}"));
    fs::write(sb.join("etc/cpupoold/config.toml"), CONFIG).unwrap_or_else(|e| panic!("{e}"));
    let kubelet = sandbox.kubelet();
    let plugins = kubelet.join("device-plugins");

    let mut d = start_with_read_only(&sb, &kubelet, dir.path());
    d.wait_log("started in");
    // The kubelet's directory goes away (a reinstall) and comes back, read-only to the daemon.
    fs::remove_dir(&plugins).unwrap_or_else(|e| panic!("{e}"));
    d.wait_log("device plugin: waiting for the kubelet's directory");
    fs::create_dir(&plugins).unwrap_or_else(|e| panic!("{e}"));

    let status = d.wait_exit();
    let logs = d.logs();
    assert_eq!(status.code(), Some(75), "{logs}");
    assert!(logs.contains("stopping, for systemd to start cpupoold again (exit status 75)"), "{logs}");
    assert!(logs.contains(&plugins.display().to_string()), "{logs}");
    // A clean stop: the engine thread ended, nothing panicked on the way.
    assert!(!logs.contains("panicked") && !logs.contains(" failed: "), "{logs}");
}
