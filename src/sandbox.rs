//! The sandbox: a simulated host under one directory, for trying the daemon and for tests.
//!
//! `cpupoold --sandbox DIR` runs the real daemon, with every root pointed into `DIR`:
//!
//! ```text
//! DIR/sys/                   simulated sysfs (the topology; cpufreq, PM QoS, cpuidle and
//!                            intel_uncore_frequency as sim::power writes them)
//! DIR/cgroup/                a cgroup2-like tree of plain files
//! DIR/etc/cpupoold/          config.toml (a sample is written once) and config.d/
//! DIR/usr/lib/cpupoold/      vendor config.d/
//! DIR/state/                 state.json
//! DIR/run/                   runtime dir (API sockets)
//! DIR/run/bus.sock           the sandbox's private D-Bus bus (see [`Sandbox::private_bus`]);
//!                            bus.conf its policy, bus.log (and bus.log.1) what it said
//! DIR/proc/                  simulated process attributes: the affinity a pid target or
//!                            `Run` would set, as PID/status (Cpus_allowed_list); processes
//!                            themselves are only read, never changed
//! DIR/proc/sys/kernel/hostname  the host name ("sandbox"), the node's name when neither
//!                            k8s.node_name nor NODE_NAME gives one
//! DIR/proc/irq/, interrupts  simulated interrupts (paths.procfs_root points here; see
//!                            sim::irq for the model, managed IRQs included)
//! DIR/proc/2/ ... 100+N/    simulated kernel threads (stat, status), as a 6.1 kernel leaves
//!                            them: kthreadd, kswapd, khugepaged, jbd2 ... may be moved; per-CPU
//!                            ksoftirqd/N and the unbound kworker are bound (PF_NO_SETAFFINITY)
//! DIR/run/irqbalance/        where an irqbalance socket would be (paths.irqbalance_dir)
//! DIR/resctrl/               simulated resctrl: info/L3, info/MB, the default group
//!                            (paths.resctrl_root points here; see sim::resctrl); never
//!                            mounted
//! DIR/kubelet/               kubelet dir: device-plugins/ holds the plugin's sockets; a
//!                            kubelet-shaped peer puts kubelet.sock there and
//!                            pod-resources/kubelet.sock beside it
//! DIR/run/containerd.sock    where the plugin asks the container runtime (CRI)
//! DIR/topology               the shape the sandbox was made with
//! ```
//!
//! The kernel's part in the daemon's writes to these trees is the simulated kernel's
//! (`crate::sim`), chosen here once: [`Sandbox::confine`] puts it in `paths.kernel` beside the
//! roots, and [`Sandbox::processes`] gives the backend the record of processes' affinities.
//!
//! An existing sandbox is reused as it is, so the daemon can be restarted on it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::config::{ConfigDirs, Settings};
use crate::core::cpuset::CpuSet;
use crate::sim::machine::{self, ShapeError, TopologyShape};

/// The shape used when none is given: 2 sockets × 8 cores × 2 threads, 2 NUMA nodes.
pub const DEFAULT_SHAPE: &str = "2x8x2:2";

/// Why the sandbox could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// Writing the simulated host failed.
    #[error("preparing the sandbox in `{}`", path.display())]
    Io {
        /// Where.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The topology shape is malformed.
    #[error("--topology")]
    Shape(#[source] ShapeError),
    /// The private bus could not be started.
    #[error("starting a private dbus-daemon for the sandbox (is the `dbus` package installed? `--bus none` runs without D-Bus)")]
    Bus(#[source] io::Error),
    /// The sandbox exists with another shape.
    #[error("sandbox `{}` was made with topology {existing}, not {asked}; remove it or omit --topology", dir.display())]
    ShapeMismatch {
        /// The sandbox.
        dir: PathBuf,
        /// Its shape.
        existing: String,
        /// The shape asked for.
        asked: String,
    },
}

/// The error of preparing the sandbox at `path`.
fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SandboxError {
    let path = path.to_owned();
    move |source| SandboxError::Io { path, source }
}

/// A prepared sandbox.
#[derive(Debug, Clone)]
pub struct Sandbox {
    root: PathBuf,
    shape: TopologyShape,
}

impl Sandbox {
    /// Creates the simulated host under `dir` (or reuses it) with `shape` (default
    /// [`DEFAULT_SHAPE`]).
    pub fn prepare(dir: &Path, shape: Option<&str>) -> Result<Sandbox, SandboxError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let root = fs::canonicalize(dir).map_err(io_err(dir))?;
        let shape_file = root.join("topology");
        let existing = match fs::read_to_string(&shape_file) {
            Ok(s) => Some(s.trim().to_owned()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(&shape_file)(e)),
        };
        let shape: TopologyShape = match (&existing, shape) {
            (Some(have), Some(asked)) => {
                let asked_shape: TopologyShape = asked.parse().map_err(SandboxError::Shape)?;
                if asked_shape.to_string() != *have {
                    return Err(SandboxError::ShapeMismatch {
                        dir: root,
                        existing: have.clone(),
                        asked: asked_shape.to_string(),
                    });
                }
                asked_shape
            }
            (Some(have), None) => have.parse().map_err(SandboxError::Shape)?,
            (None, asked) => asked.unwrap_or(DEFAULT_SHAPE).parse().map_err(SandboxError::Shape)?,
        };
        let sb = Sandbox { root, shape };
        if existing.is_none() {
            sb.write_new(&shape_file)?;
        }
        sb.write_missing()?;
        Ok(sb)
    }

    /// Writes a new sandbox: sysfs, cgroupfs, the directories and the sample configuration, and
    /// last `shape_file`, whose presence means the sandbox is complete.
    fn write_new(&self, shape_file: &Path) -> Result<(), SandboxError> {
        let topo = self.shape.topology();
        machine::write_sysfs(&self.sysfs(), &topo).map_err(io_err(&self.sysfs()))?;
        machine::write_cgroupfs(&self.cgroupfs(), &topo).map_err(io_err(&self.cgroupfs()))?;
        for d in [
            self.etc().join("config.d"),
            self.vendor().join("config.d"),
            self.state(),
            self.run(),
            self.kubelet(),
        ] {
            fs::create_dir_all(&d).map_err(io_err(&d))?;
        }
        let config = self.etc().join("config.toml");
        if !config.exists() {
            fs::write(&config, sample_config(&self.shape)).map_err(io_err(&config))?;
        }
        fs::write(shape_file, format!("{}\n", self.shape)).map_err(io_err(shape_file))
    }

    /// Writes what a sandbox made by an older version lacks, and the kernel's counters.
    fn write_missing(&self) -> Result<(), SandboxError> {
        let sb = self;
        // The device plugin serves its sockets here, and the simulated process attributes go
        // here (older sandboxes lack them).
        for d in [sb.kubelet().join("device-plugins"), sb.procfs()] {
            fs::create_dir_all(&d).map_err(io_err(&d))?;
        }
        // The simulated resctrl (older sandboxes lack it).
        if !sb.resctrl().join("info").exists() {
            let topo = sb.shape.topology();
            let packages = u32::try_from(
                topo.data().cpus.values().map(|c| c.package).collect::<std::collections::BTreeSet<_>>().len(),
            )
            .unwrap_or(1);
            crate::sim::resctrl::write_root(
                &sb.resctrl(),
                &crate::sim::resctrl::SimResctrl::new(&topo.online(), packages),
            )
            .map_err(io_err(&sb.resctrl()))?;
        }
        // The simulated interrupts (older sandboxes lack them).
        if !sb.procfs().join("interrupts").exists() {
            let online = sb.shape.topology().online();
            crate::sim::irq::write_procfs(&sb.procfs(), &online, &crate::sim::irq::default_irqs(&online))
                .map_err(io_err(&sb.procfs()))?;
        }
        // The simulated kernel threads (older sandboxes lack them).
        if !sb.procfs().join("2/stat").exists() {
            write_kthreads(&sb.procfs(), &sb.shape.topology()).map_err(io_err(&sb.procfs()))?;
        }
        // The simulated power trees: cpufreq, PM QoS, cpuidle, uncore (older sandboxes lack them).
        if !sb.sysfs().join("devices/system/cpu/cpufreq").exists() {
            let all = crate::sim::power::SimPower::ALL;
            crate::sim::power::write_power(&sb.sysfs(), &sb.shape.topology(), all)
                .map_err(io_err(&sb.sysfs()))?;
        }
        machine::write_procfs(&sb.procfs(), &sb.shape.topology()).map_err(io_err(&sb.procfs()))
    }

    /// The sandbox directory.
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// The shape.
    pub fn shape(&self) -> &TopologyShape {
        &self.shape
    }
    /// Simulated sysfs.
    pub fn sysfs(&self) -> PathBuf {
        self.root.join("sys")
    }
    /// Simulated cgroupfs.
    pub fn cgroupfs(&self) -> PathBuf {
        self.root.join("cgroup")
    }
    /// `/etc/cpupoold` inside the sandbox.
    pub fn etc(&self) -> PathBuf {
        self.root.join("etc/cpupoold")
    }
    /// `/usr/lib/cpupoold` inside the sandbox.
    pub fn vendor(&self) -> PathBuf {
        self.root.join("usr/lib/cpupoold")
    }
    /// State dir.
    pub fn state(&self) -> PathBuf {
        self.root.join("state")
    }
    /// Runtime dir.
    pub fn run(&self) -> PathBuf {
        self.root.join("run")
    }
    /// The simulated resctrl root.
    pub fn resctrl(&self) -> PathBuf {
        self.root.join("resctrl")
    }
    /// Where the sandbox records what it would have set on real processes (`PID/status`).
    pub fn procfs(&self) -> PathBuf {
        self.root.join("proc")
    }
    /// The record of processes' affinities the backend keeps instead of setting them, under
    /// [`Sandbox::procfs`]: the sandbox never changes a real process.
    pub fn processes(&self) -> std::sync::Arc<dyn crate::host::cgroupfs::ProcessKernel> {
        std::sync::Arc::new(crate::sim::cgroup::SimProcesses::new(self.procfs()))
    }
    /// Kubelet dir.
    pub fn kubelet(&self) -> PathBuf {
        self.root.join("kubelet")
    }

    /// The private bus's socket.
    pub fn bus_socket(&self) -> PathBuf {
        self.run().join("bus.sock")
    }

    /// The sandbox's own bus: a `dbus-daemon` listening on [`Sandbox::bus_socket`], so the
    /// D-Bus API can be tried without touching the system bus. A bus still running from an
    /// earlier run (its daemon was killed) is reused if it is ours: run by this uid with the
    /// configuration this run would write ([`sandbox_bus_config`]); any other is left alone
    /// and a new one started in its place. A bus started here stops when the returned
    /// [`PrivateBus`] is dropped. What it says goes to `DIR/run/bus.log`, at most
    /// [`BUS_LOG_MAX`] bytes, then to `bus.log.1` in turn.
    ///
    /// Its policy lets only this uid own `org.cpupool.Manager1` (as the system bus lets only
    /// root), and everyone own other names and call anything: the daemon's own uid check is
    /// what guards the mutating methods, as on the system bus.
    pub fn private_bus(&self) -> Result<PrivateBus, SandboxError> {
        let sock = self.bus_socket();
        let address = format!("unix:path={}", sock.display());
        let uid = nix::unistd::geteuid().as_raw();
        let conf = self.run().join("bus.conf");
        let config = sandbox_bus_config(&sock, uid);
        if self.running_bus_is_ours(&sock, &conf, &config, uid) {
            return Ok(PrivateBus { address, child: None });
        }
        match fs::remove_file(&sock) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&sock)(e)),
        }
        fs::create_dir_all(self.run()).map_err(io_err(&self.run()))?;
        fs::write(&conf, &config).map_err(io_err(&conf))?;
        let child = start_bus(&conf, &self.run().join("bus.log"))?;
        Ok(PrivateBus { address, child: Some(child) })
    }

    /// Whether a bus listens on `sock` that we may use again: run by `uid` with `config` in
    /// `conf`. Any other is said why, and left alone.
    fn running_bus_is_ours(&self, sock: &Path, conf: &Path, config: &str, uid: u32) -> bool {
        let Ok(running) = std::os::unix::net::UnixStream::connect(sock) else { return false };
        let owner = nix::sys::socket::getsockopt(&running, nix::sys::socket::sockopt::PeerCredentials)
            .map(|c| c.uid());
        let same_config = fs::read_to_string(conf).is_ok_and(|c| c == config);
        match owner {
            Ok(owner) if owner == uid && same_config => return true,
            Ok(owner) if owner != uid => log::warn!(
                "sandbox: the bus on `{}` is run by uid {owner}, not by us (uid {uid}): starting our own",
                sock.display()
            ),
            Ok(_) => log::warn!(
                "sandbox: the bus on `{}` runs with another policy than ours: starting a new one \
                 (the old dbus-daemon keeps running until stopped)",
                sock.display()
            ),
            Err(e) => log::warn!(
                "sandbox: who runs the bus on `{}` cannot be told ({e}): starting our own",
                sock.display()
            ),
        }
        false
    }

    /// Where the sandbox's configuration is read from.
    pub fn config_dirs(&self) -> ConfigDirs {
        ConfigDirs { etc: self.etc(), vendor: self.vendor(), cluster: None }
    }

    /// Points every root of `settings` into the sandbox, whatever the configuration says, so
    /// that nothing is written outside it, with the simulated kernel behind them.
    pub fn confine(&self, settings: &mut Settings) {
        settings.paths.kernel = crate::sim::KERNEL;
        settings.paths.sysfs_root = self.sysfs();
        settings.paths.cgroup_root = self.cgroupfs();
        settings.paths.state_dir = self.state();
        settings.paths.runtime_dir = self.run();
        settings.paths.kubelet_dir = self.kubelet();
        settings.paths.cdi_dir = self.run().join("cdi");
        settings.paths.procfs_root = self.procfs();
        settings.paths.irqbalance_dir = self.run().join("irqbalance");
        settings.paths.resctrl_root = self.resctrl();
        settings.kubelet.runtime_endpoint = self.run().join("containerd.sock");
        settings.kubelet.nri_socket = self.run().join("nri/nri.sock");
        // Loopback on a port of the kernel's choosing (the banner prints it), so that sandboxes
        // side by side never collide; a unix socket goes into the sandbox.
        settings.metrics.listen = match settings.metrics.listen {
            crate::config::Listen::Tcp(_) => {
                crate::config::Listen::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
            }
            crate::config::Listen::Unix(_) => crate::config::Listen::Unix(self.run().join("metrics.sock")),
        };
    }
}

/// The kernel threads of the sandbox's simulated host (see sim::kthreads for how the simulated
/// kernel answers): those a 6.1 kernel leaves on every CPU (kthreadd, RCU,
/// kswapd and kcompactd per node, khugepaged, jbd2, oom_reaper), and threads it binds itself:
/// an unbound kworker (its CPUs follow the workqueue mask) and ksoftirqd/N per CPU.
fn write_kthreads(procfs: &Path, topo: &crate::core::topology::Topology) -> io::Result<()> {
    use crate::core::housekeeping::{PF_KTHREAD, PF_NO_SETAFFINITY};
    use crate::sim::kthreads::write_kthread;
    // PF_NOFREEZE | PF_FORKNOEXEC, as most kernel threads show.
    let movable = PF_KTHREAD | 0x8040;
    let bound = movable | PF_NO_SETAFFINITY;
    let all = topo.online();
    for (pid, comm) in [(2, "kthreadd"), (14, "rcu_preempt"), (30, "oom_reaper"), (31, "khugepaged")] {
        write_kthread(procfs, pid, comm, movable, &all)?;
    }
    write_kthread(procfs, 32, "jbd2/vda1-8", movable, &all)?;
    write_kthread(procfs, 33, "kworker/u64:0-events_unbound", bound | 0x20 /* PF_WQ_WORKER */, &all)?;
    for (i, (node, cpus)) in topo.nodes().iter().enumerate() {
        let i = u32::try_from(i).unwrap_or(0);
        write_kthread(procfs, 34 + 2 * i, &format!("kswapd{node}"), movable, cpus)?;
        write_kthread(procfs, 35 + 2 * i, &format!("kcompactd{node}"), movable, cpus)?;
    }
    for cpu in all.iter() {
        write_kthread(procfs, 100 + cpu, &format!("ksoftirqd/{cpu}"), bound, &CpuSet::range(cpu, cpu))?;
    }
    Ok(())
}

/// Starts `dbus-daemon` with the configuration `conf`, once it listens; what it says goes to
/// `log` (see [`copy_capped`]).
fn start_bus(conf: &Path, log: &Path) -> Result<std::process::Child, SandboxError> {
    let mut child = std::process::Command::new("dbus-daemon")
        .arg(format!("--config-file={}", conf.display()))
        .args(["--nofork", "--print-address"])
        // Our service manager's variables are ours: dbus-daemon would send READY=1 for us.
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID")
        // Nothing of ours stays open in it but the pipes: it may outlive us (it is reused
        // then, and what it says after goes nowhere).
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(SandboxError::Bus)?;
    // The address line is printed once the socket listens.
    let mut line = String::new();
    let ready = child
        .stdout
        .take()
        .map(|out| io::BufRead::read_line(&mut io::BufReader::new(out), &mut line))
        .transpose()
        .map_err(SandboxError::Bus)?;
    if ready.unwrap_or(0) == 0 {
        let _ = child.kill();
        let _ = child.wait();
        // It has exited: what it said is all there, and short.
        let mut said = String::new();
        if let Some(err) = child.stderr.take() {
            let _ = io::Read::read_to_string(&mut io::Read::take(err, 4096), &mut said);
        }
        return Err(SandboxError::Bus(io::Error::other(format!(
            "dbus-daemon exited before it printed its address: {}",
            said.trim()
        ))));
    }
    if let Some(err) = child.stderr.take() {
        let log = log.to_owned();
        let copy = std::thread::Builder::new()
            .name("cpupoold-buslog".into())
            .spawn(move || copy_capped(err, &log, BUS_LOG_MAX));
        if let Err(e) = copy {
            // The pipe is closed with the thread's closure: the bus's words are lost.
            log::warn!("sandbox: no thread to keep the bus's log ({e}); it is not kept");
        }
    }
    Ok(child)
}

/// The sandbox's bus; dropping it stops the `dbus-daemon` it started.
#[derive(Debug)]
pub struct PrivateBus {
    /// `unix:path=...`.
    pub address: String,
    child: Option<std::process::Child>,
}

impl Drop for PrivateBus {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The largest `bus.log`: beyond, it becomes `bus.log.1` (replacing the one before) and a new
/// one starts. A flood of calls can make the bus warn many times a second.
pub const BUS_LOG_MAX: u64 = 1 << 20;

/// Copies `from` to `path` until `from` ends, in files of at most `max` bytes: a full one is
/// renamed `<path>.1`. Errors end the copy (the rest goes nowhere); it is a log.
fn copy_capped(from: impl io::Read, path: &Path, max: u64) {
    use std::io::{BufRead, Read, Write};
    let rotated = path.with_extension("log.1");
    let Ok(mut file) = fs::File::create(path) else { return };
    let mut written = 0u64;
    let mut lines = io::BufReader::new(from);
    let mut line = Vec::new();
    loop {
        line.clear();
        // A line is at most 64 KiB here: a longer one is cut.
        match (&mut lines).take(64 * 1024).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let n = n as u64;
                if written + n > max && written > 0 {
                    if fs::rename(path, &rotated).is_err() {
                        return;
                    }
                    match fs::File::create(path) {
                        Ok(f) => (file, written) = (f, 0),
                        Err(_) => return,
                    }
                }
                if file.write_all(&line).is_err() {
                    return;
                }
                written += n;
            }
        }
    }
}

/// The configuration of the sandbox's private bus on `sock`: only `uid` (the daemon's) may own
/// `org.cpupool.Manager1`, as only root may on the system bus
/// (`dbus/org.cpupool.Manager1.conf`); everyone may connect, own other names and call anything.
pub fn sandbox_bus_config(sock: &Path, uid: u32) -> String {
    let name = crate::api::dbus::BUS_NAME;
    bus_config(
        sock,
        &format!(
            "Written by cpupoold: the sandbox's private bus. Only uid {uid} may own {name}; the daemon checks callers."
        ),
        &format!(
            r#"  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <deny own="{name}"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
  <policy user="{uid}">
    <allow own="{name}"/>
  </policy>
"#
        ),
    )
}

/// The configuration of a session-type bus on `sock` whose policy lets everyone own and call
/// anything: the tests' own buses.
pub fn permissive_bus_config(sock: &Path) -> String {
    bus_config(
        sock,
        "Written by cpupoold: a private bus whose policy allows everything (the daemon checks callers).",
        r#"  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
"#,
    )
}

/// A session-type bus on `sock` with `policy`, `comment` at its head.
fn bus_config(sock: &Path, comment: &str, policy: &str) -> String {
    let path = sock.display().to_string().replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<!-- {comment} -->
<busconfig>
  <type>session</type>
  <listen>unix:path={path}</listen>
  <auth>EXTERNAL</auth>
{policy}</busconfig>
"#
    )
}

/// A sample configuration for `shape`: a one-core reserved pool, an isolated exclusive pool
/// with half of the rest in whole cores on the last NUMA node where it fits, and a shared pool
/// with what remains.
pub fn sample_config(shape: &TopologyShape) -> String {
    let total = shape.total_cpus();
    let core = u64::from(shape.threads);
    let rest = total.saturating_sub(core);
    let dp = (rest / 2) / core * core;
    let web = rest.saturating_sub(dp);
    let per_node = total / u64::from(shape.numa.max(1));
    let numa = if dp > 0 && dp <= per_node.saturating_sub(core) && shape.numa > 1 {
        format!("numa = {}\n", shape.numa - 1)
    } else {
        String::new()
    };
    let mut s = format!(
        "# Sandbox configuration for a simulated {shape} host ({total} CPUs).\n\
         # Edit it and send SIGHUP (or restart) to apply. Reference: README.md.\n\n\
         [pools.reserved]\nkind = \"reserved\"\ncount = {core}\n"
    );
    if dp > 0 {
        s.push_str(&format!(
            "\n[pools.dp]\nkind = \"exclusive\"\ncount = {dp}\n{numa}smt = \"full-cores\"\nisolate = true\n"
        ));
        // A cache class, applied to the simulated resctrl under resctrl/.
        s.push_str("\n[pools.dp.cache]\nl3 = \"50%\"          # half the L3 ways (resctrl)\n");
    }
    if web > 0 {
        s.push_str(&format!("\n[pools.web]\nkind = \"shared\"\ncount = {web}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_bus_log_is_kept_in_two_files_of_at_most_the_cap() {
        let dir = tempdir();
        let log = dir.path().join("bus.log");
        let lines: String = (0..5000).map(|i| format!("warning {i:05}: a flood of calls\n")).collect();
        copy_capped(lines.as_bytes(), &log, 10_000);
        let now = fs::read_to_string(&log).unwrap_or_default();
        let before = fs::read_to_string(dir.path().join("bus.log.1")).unwrap_or_default();
        assert!(now.len() <= 10_000 && before.len() <= 10_000, "{} and {} bytes", now.len(), before.len());
        assert!(now.ends_with("warning 04999: a flood of calls\n"), "the latest lines are kept: {now:?}");
        assert!(before.len() > 9_000, "the file before was full: {}", before.len());
        // Whole lines, continued from one file to the next.
        let first_now = now.lines().next().unwrap_or_default();
        let last_before = before.lines().last().unwrap_or_default();
        let n = |l: &str| l[8..13].parse::<u32>().unwrap_or(0);
        assert_eq!(n(first_now), n(last_before) + 1);
    }

    #[test]
    fn a_running_bus_of_ours_is_used_again() {
        if std::process::Command::new("dbus-daemon").arg("--version").output().is_err() {
            eprintln!("skipped: no dbus-daemon");
            return;
        }
        let dir = tempdir();
        let sb = Sandbox::prepare(dir.path(), Some("1x2x1:1")).unwrap_or_else(|e| panic!("{e}"));
        let first = sb.private_bus().unwrap_or_else(|e| panic!("{e}"));
        assert!(first.child.is_some());
        let conf = fs::read_to_string(sb.run().join("bus.conf")).unwrap_or_default();
        let uid = nix::unistd::geteuid().as_raw();
        assert!(conf.contains(&format!(r#"<policy user="{uid}">"#)), "{conf}");
        assert!(conf.contains(r#"<deny own="org.cpupool.Manager1"/>"#), "{conf}");
        // As after a daemon killed with its bus still running: the bus is ours, and used.
        let again = sb.private_bus().unwrap_or_else(|e| panic!("{e}"));
        assert!(again.child.is_none(), "a bus was started beside our running one");
        assert_eq!(again.address, first.address);
    }
}
