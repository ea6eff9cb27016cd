//! The sandbox: a simulated host under one directory, for trying the daemon and for tests.
//!
//! `cpupoold --sandbox DIR` runs the real daemon, with every root pointed into `DIR`:
//!
//! ```text
//! DIR/sys/                   simulated sysfs (the topology)
//! DIR/cgroup/                a cgroup2-like tree of plain files
//! DIR/etc/cpupoold/          config.toml (a sample is written once) and config.d/
//! DIR/usr/lib/cpupoold/      vendor config.d/
//! DIR/state/                 state.json
//! DIR/run/                   runtime dir (API sockets)
//! DIR/kubelet/               kubelet dir (device-plugin sockets)
//! DIR/topology               the shape the sandbox was made with
//! ```
//!
//! An existing sandbox is reused as it is, so the daemon can be restarted on it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::config::{ConfigDirs, Settings};
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
            for d in [sb.etc().join("config.d"), sb.vendor().join("config.d"), sb.state(), sb.run(), sb.kubelet()] {
                fs::create_dir_all(&d).map_err(io_err(&d))?;
            }
            let config = sb.etc().join("config.toml");
            if !config.exists() {
                fs::write(&config, sample_config(&sb.shape)).map_err(io_err(&config))?;
            }
            // Written last: its presence means the sandbox is complete.
            fs::write(&shape_file, format!("{}\n", sb.shape)).map_err(io_err(&shape_file))?;
        }
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
    /// Kubelet dir.
    pub fn kubelet(&self) -> PathBuf {
        self.root.join("kubelet")
    }

    /// Where the sandbox's configuration is read from.
    pub fn config_dirs(&self) -> ConfigDirs {
        ConfigDirs { etc: self.etc(), vendor: self.vendor() }
    }

    /// Points every root of `settings` into the sandbox, whatever the configuration says, so
    /// that nothing is written outside it.
    pub fn confine(&self, settings: &mut Settings) {
        settings.paths.sysfs_root = self.sysfs();
        settings.paths.cgroup_root = self.cgroupfs();
        settings.paths.state_dir = self.state();
        settings.paths.runtime_dir = self.run();
        settings.paths.kubelet_dir = self.kubelet();
    }
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
    }
    if web > 0 {
        s.push_str(&format!("\n[pools.web]\nkind = \"shared\"\ncount = {web}\n"));
    }
    s
}
