//! The sandbox: a simulated host under one directory, for trying the daemon and for tests.
//!
//! `cpupoold --sandbox DIR` runs the real daemon, with every root pointed into `DIR`:
//!
//! ```text
//! DIR/sys/                   simulated sysfs (the topology; cpufreq, PM QoS, cpuidle and
//!                            intel_uncore_frequency as host::simpower writes them)
//! DIR/cgroup/                a cgroup2-like tree of plain files
//! DIR/etc/cpupoold/          config.toml (a sample is written once) and config.d/
//! DIR/usr/lib/cpupoold/      vendor config.d/
//! DIR/state/                 state.json
//! DIR/run/                   runtime dir (API sockets)
//! DIR/run/bus.sock           the sandbox's private D-Bus bus (see [`Sandbox::private_bus`])
//! DIR/proc/                  simulated process attributes: the affinity a pid target or
//!                            `Run` would set, as PID/status (Cpus_allowed_list); processes
//!                            themselves are only read, never changed
//! DIR/proc/irq/, interrupts  simulated interrupts (paths.procfs_root points here; see
//!                            host::simirq for the model, managed IRQs included)
//! DIR/proc/2/ ... 100+N/    simulated kernel threads (stat, status), as a 6.1 kernel leaves
//!                            them: kthreadd, kswapd, khugepaged, jbd2 ... may be moved; per-CPU
//!                            ksoftirqd/N and the unbound kworker are bound (PF_NO_SETAFFINITY)
//! DIR/run/irqbalance/        where an irqbalance socket would be (paths.irqbalance_dir)
//! DIR/resctrl/               simulated resctrl: info/L3, info/MB, the default group
//!                            (paths.resctrl_root points here; see host::simresctrl); never
//!                            mounted
//! DIR/kubelet/               kubelet dir: device-plugins/ holds the plugin's sockets; a
//!                            kubelet-shaped peer puts kubelet.sock there and
//!                            pod-resources/kubelet.sock beside it
//! DIR/run/containerd.sock    where the plugin asks the container runtime (CRI)
//! DIR/topology               the shape the sandbox was made with
//! ```
//!
//! An existing sandbox is reused as it is, so the daemon can be restarted on it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::config::{ConfigDirs, Settings};
use crate::core::cpuset::CpuSet;
use crate::host::simhost::{self, ShapeError, TopologyShape};

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
        let io_err = |path: &Path| {
            let path = path.to_owned();
            move |source| SandboxError::Io { path, source }
        };
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
            let topo = sb.shape.topology();
            simhost::write_sysfs(&sb.sysfs(), &topo).map_err(io_err(&sb.sysfs()))?;
            simhost::write_cgroupfs(&sb.cgroupfs(), &topo).map_err(io_err(&sb.cgroupfs()))?;
            for d in
                [sb.etc().join("config.d"), sb.vendor().join("config.d"), sb.state(), sb.run(), sb.kubelet()]
            {
                fs::create_dir_all(&d).map_err(io_err(&d))?;
            }
            let config = sb.etc().join("config.toml");
            if !config.exists() {
                fs::write(&config, sample_config(&sb.shape)).map_err(io_err(&config))?;
            }
            // Written last: its presence means the sandbox is complete.
            fs::write(&shape_file, format!("{}\n", sb.shape)).map_err(io_err(&shape_file))?;
        }
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
            crate::host::simresctrl::write_root(
                &sb.resctrl(),
                &crate::host::simresctrl::SimResctrl::new(&topo.online(), packages),
            )
            .map_err(io_err(&sb.resctrl()))?;
        }
        // The simulated interrupts (older sandboxes lack them).
        if !sb.procfs().join("interrupts").exists() {
            let online = sb.shape.topology().online();
            crate::host::simirq::write_procfs(
                &sb.procfs(),
                &online,
                &crate::host::simirq::default_irqs(&online),
            )
            .map_err(io_err(&sb.procfs()))?;
        }
        // The simulated kernel threads (older sandboxes lack them).
        if !sb.procfs().join("2/stat").exists() {
            write_kthreads(&sb.procfs(), &sb.shape.topology()).map_err(io_err(&sb.procfs()))?;
        }
        // The simulated power trees: cpufreq, PM QoS, cpuidle, uncore (older sandboxes lack them).
        if !sb.sysfs().join("devices/system/cpu/cpufreq").exists() {
            let all = crate::host::simpower::SimPower::ALL;
            crate::host::simpower::write_power(&sb.sysfs(), &sb.shape.topology(), all)
                .map_err(io_err(&sb.sysfs()))?;
        }
        simhost::write_procfs(&sb.procfs(), &sb.shape.topology()).map_err(io_err(&sb.procfs()))?;
        Ok(sb)
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
    /// earlier run (its daemon was killed) is reused; otherwise one is started, and it stops
    /// when the returned [`PrivateBus`] is dropped. It logs to `DIR/run/bus.log`.
    ///
    /// Its policy lets everyone own and call anything: the daemon's own uid check is what
    /// guards the mutating methods, as on the system bus.
    pub fn private_bus(&self) -> Result<PrivateBus, SandboxError> {
        let sock = self.bus_socket();
        let address = format!("unix:path={}", sock.display());
        if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
            return Ok(PrivateBus { address, child: None });
        }
        let io_err = |path: &Path| {
            let path = path.to_owned();
            move |source| SandboxError::Io { path, source }
        };
        let _ = fs::remove_file(&sock);
        fs::create_dir_all(self.run()).map_err(io_err(&self.run()))?;
        let conf = self.run().join("bus.conf");
        fs::write(&conf, permissive_bus_config(&sock)).map_err(io_err(&conf))?;
        let log = self.run().join("bus.log");
        let log_file = fs::File::create(&log).map_err(io_err(&log))?;
        let mut child = std::process::Command::new("dbus-daemon")
            .arg(format!("--config-file={}", conf.display()))
            .args(["--nofork", "--print-address"])
            // Our service manager's variables are ours: dbus-daemon would send READY=1 for us.
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            // Nothing of ours stays open in it: it may outlive us (it is reused then).
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(log_file)
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
            return Err(SandboxError::Bus(io::Error::other(
                "dbus-daemon exited before it printed its address",
            )));
        }
        Ok(PrivateBus { address, child: Some(child) })
    }

    /// Where the sandbox's configuration is read from.
    pub fn config_dirs(&self) -> ConfigDirs {
        ConfigDirs { etc: self.etc(), vendor: self.vendor(), cluster: None }
    }

    /// Points every root of `settings` into the sandbox, whatever the configuration says, so
    /// that nothing is written outside it.
    pub fn confine(&self, settings: &mut Settings) {
        settings.paths.sysfs_root = self.sysfs();
        settings.paths.cgroup_root = self.cgroupfs();
        settings.paths.state_dir = self.state();
        settings.paths.runtime_dir = self.run();
        settings.paths.kubelet_dir = self.kubelet();
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

/// The kernel threads of the sandbox's simulated host (see host::housekeeping::Kthreads for
/// how the simulated kernel answers): those a 6.1 kernel leaves on every CPU (kthreadd, RCU,
/// kswapd and kcompactd per node, khugepaged, jbd2, oom_reaper), and threads it binds itself:
/// an unbound kworker (its CPUs follow the workqueue mask) and ksoftirqd/N per CPU.
fn write_kthreads(procfs: &Path, topo: &crate::core::topology::Topology) -> io::Result<()> {
    use crate::core::housekeeping::{PF_KTHREAD, PF_NO_SETAFFINITY};
    use crate::host::housekeeping::write_sim_kthread;
    // PF_NOFREEZE | PF_FORKNOEXEC, as most kernel threads show.
    let movable = PF_KTHREAD | 0x8040;
    let bound = movable | PF_NO_SETAFFINITY;
    let all = topo.online();
    for (pid, comm) in [(2, "kthreadd"), (14, "rcu_preempt"), (30, "oom_reaper"), (31, "khugepaged")] {
        write_sim_kthread(procfs, pid, comm, movable, &all)?;
    }
    write_sim_kthread(procfs, 32, "jbd2/vda1-8", movable, &all)?;
    write_sim_kthread(
        procfs,
        33,
        "kworker/u64:0-events_unbound",
        bound | 0x20, /* PF_WQ_WORKER */
        &all,
    )?;
    for (i, (node, cpus)) in topo.nodes().iter().enumerate() {
        let i = u32::try_from(i).unwrap_or(0);
        write_sim_kthread(procfs, 34 + 2 * i, &format!("kswapd{node}"), movable, cpus)?;
        write_sim_kthread(procfs, 35 + 2 * i, &format!("kcompactd{node}"), movable, cpus)?;
    }
    for cpu in all.iter() {
        write_sim_kthread(procfs, 100 + cpu, &format!("ksoftirqd/{cpu}"), bound, &CpuSet::range(cpu, cpu))?;
    }
    Ok(())
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

/// The configuration of a session-type bus on `sock` whose policy lets everyone own and call
/// anything: the sandbox's private bus (and the tests' own buses).
pub fn permissive_bus_config(sock: &Path) -> String {
    let path = sock.display().to_string().replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<!-- Written by cpupoold: a private bus whose policy allows everything (the daemon checks callers). -->
<busconfig>
  <type>session</type>
  <listen>unix:path={path}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
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
