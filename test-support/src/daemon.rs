//! The real `cpupoold` on a sandbox host: `cpupoold --sandbox SB --topology SHAPE ARGS`, its
//! stderr in a log file, its banner read from stdout up to the `READY` line.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A daemon that printed its banner.
pub struct Spawned {
    /// The process.
    pub child: Child,
    /// The banner's lines, up to `READY` or to the end of stdout (the daemon died).
    pub banner: String,
    /// Whether `READY` came.
    pub ready: bool,
    /// The varlink socket the banner names (`varlink unix:PATH`).
    pub varlink: Option<PathBuf>,
}

/// Starts `bin --sandbox sb --topology shape args`, stderr to `log`, and reads its banner up
/// to `READY`. `NOTIFY_SOCKET` is taken away: the test's own systemd (if any) is not told.
pub fn spawn(bin: &Path, sb: &Path, shape: &str, args: &[&str], log: &Path) -> Spawned {
    spawn_with_env(bin, sb, shape, args, &[], log)
}

/// [`spawn`] with `env` added to the daemon's environment.
pub fn spawn_with_env(
    bin: &Path,
    sb: &Path,
    shape: &str,
    args: &[&str],
    env: &[(&str, &str)],
    log: &Path,
) -> Spawned {
    spawn_wrapped(&[], bin, sb, shape, args, env, log)
}

/// [`spawn_with_env`] run through `wrapper` (a command and its arguments before the daemon's,
/// e.g. `prlimit --nofile=64`), when it is not empty.
pub fn spawn_wrapped(
    wrapper: &[&str],
    bin: &Path,
    sb: &Path,
    shape: &str,
    args: &[&str],
    env: &[(&str, &str)],
    log: &Path,
) -> Spawned {
    let log = fs::File::create(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let mut command = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let mut child = command
        .envs(env.iter().copied())
        .arg("--sandbox")
        .arg(sb)
        .args(["--topology", shape])
        .args(args)
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    let Some(stdout) = child.stdout.take() else { panic!("the daemon's stdout was not piped") };
    let (mut banner, mut ready, mut varlink) = (String::new(), false, None);
    // Lines arrive as the daemon prints them; the end of stdout means it died.
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap_or_else(|e| panic!("reading the daemon's banner: {e}"));
        banner.push_str(&line);
        banner.push('\n');
        if let Some(p) = line.trim().strip_prefix("varlink").map(str::trim) {
            varlink = p.strip_prefix("unix:").map(PathBuf::from);
        }
        if line == "READY" {
            ready = true;
            break;
        }
    }
    Spawned { child, banner, ready, varlink }
}

/// A child process that is killed (SIGKILL) and reaped when dropped: a test that fails, or
/// returns early, leaves no daemon running with its directory gone. Stopping it cleanly first
/// ([`stop`], through the `Deref` to [`Child`]) leaves nothing for the drop to do.
pub struct Reaped(pub Child);

impl std::ops::Deref for Reaped {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Stops `child` with SIGTERM and checks that it exits cleanly within 30 s; `logs` says what
/// it logged, for the failure message.
pub fn stop(child: &mut Child, logs: impl Fn() -> String) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
        .unwrap_or_else(|e| panic!("SIGTERM to the daemon: {e}"));
    let deadline = Instant::now() + crate::wait::PATIENCE;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        assert!(Instant::now() < deadline, "daemon did not exit on SIGTERM:\n{}", logs());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "daemon exited with {status}:\n{}", logs());
}

/// The `dbus-daemon`s serving the private bus of the sandbox `sb`, found by the configuration
/// file on their command line.
pub fn bus_daemons(sb: &Path) -> Vec<i32> {
    let needle = format!("--config-file={}", sb.join("run/bus.conf").display());
    let Ok(procs) = fs::read_dir("/proc") else { return Vec::new() };
    procs
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = fs::read(e.path().join("cmdline")).ok()?;
            cmdline.split(|b| *b == 0).any(|a| a == needle.as_bytes()).then_some(pid)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test that panics while its child runs leaves no process: the child is killed and
    /// reaped (no zombie either) as the panic unwinds.
    #[test]
    fn a_failing_test_leaves_no_process_behind() {
        let child = Command::new("sleep").arg("600").spawn().unwrap_or_else(|e| panic!("sleep: {e}"));
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        let failed = std::panic::catch_unwind(move || {
            let _child = Reaped(child);
            panic!("a failed assertion");
        });
        assert!(failed.is_err());
        // Reaped: the pid names no process, not even a zombie.
        assert_eq!(nix::sys::signal::kill(pid, None), Err(nix::errno::Errno::ESRCH));
    }
}
