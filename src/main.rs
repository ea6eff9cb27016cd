//! `cpupoold`: parse arguments, set up logging, load the settings, connect to the host, run the
//! daemon, print the error chain.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use cpupoold::config::ConfigDirs;
use cpupoold::daemon::{self, BusChoice, RunOptions};
use cpupoold::sandbox::Sandbox;

/// CPU pool daemon: reserved, exclusive and shared CPU pools applied through cgroup v2.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Run against a simulated host created (or reused) in DIR, unprivileged.
    #[arg(long, value_name = "DIR")]
    sandbox: Option<PathBuf>,
    /// Sandbox topology: SOCKETSxCORESxTHREADS[:NUMA] (default 2x8x2:2).
    #[arg(long, value_name = "SHAPE", requires = "sandbox")]
    topology: Option<String>,
    /// Configuration directory (config.toml and config.d/).
    #[arg(long, value_name = "DIR", default_value = "/etc/cpupoold", conflicts_with = "sandbox")]
    config_dir: PathBuf,
    /// Vendor configuration directory (config.d/).
    #[arg(long, value_name = "DIR", default_value = "/usr/lib/cpupoold", conflicts_with = "sandbox")]
    vendor_config_dir: PathBuf,
    /// If the state file is damaged or inconsistent, start from the previous good copy (the
    /// file is kept as state.json.corrupt).
    #[arg(long)]
    restore_previous_state: bool,
    /// Where to serve the D-Bus API: system, session, none, a D-Bus address
    /// (unix:path=...), or private (a bus the sandbox starts in DIR/run/bus.sock). Default:
    /// system; private with --sandbox.
    #[arg(long, value_name = "BUS")]
    bus: Option<BusChoice>,
    /// Where systemd is reached for the systemd backend (system, session or a D-Bus address).
    /// Default: the system bus when systemd runs the host (daemon.backend = "auto").
    #[arg(long, value_name = "BUS")]
    systemd_bus: Option<BusChoice>,
    /// Every SECONDS, read back what the kernel enforces on every assignment's target,
    /// correct what someone changed, and report what cannot be corrected as degraded
    /// (0: only at start and after systemd reloads).
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    check_interval: u64,
    /// Every SECONDS, sample /proc/interrupts, /proc/stat and the pool slices' cpu.stat to
    /// measure isolation health (0: never).
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    health_interval: u64,
    /// Log level (overrides daemon.log_level): error, warn, info, debug, trace.
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<log::LevelFilter>,
    /// Print the CpuPoolNode CustomResourceDefinition (deploy/crd.yaml) and exit. Only in a
    /// build with the `k8s` feature (the packages' build).
    #[arg(long)]
    print_crd: bool,
    /// Print the DeviceClasses of the pools with dra = true in the configuration files
    /// (deploy/deviceclasses.yaml holds the example pools') and exit. Only in a build with the
    /// `k8s` feature (the packages' build).
    #[arg(long)]
    print_deviceclasses: bool,
    /// Internal: spin on the CPU the daemon pins this process to, until killed (a CPU about to
    /// be isolated is kept busy: src/host/cgroupfs/settle.rs). PID is the daemon's.
    #[arg(long, value_name = "PID", hide = true)]
    spin: Option<u32>,
}

/// The exit status of a usage error, as clap's.
#[cfg(not(feature = "k8s"))]
const EXIT_USAGE: u8 = 2;

/// Without the `k8s` feature, the flags of the cluster integration say which build has them,
/// rather than clap's bare "unexpected argument" (or running the daemon).
#[cfg(not(feature = "k8s"))]
fn k8s_flags_not_built(args: &Args) -> Option<ExitCode> {
    let flag = [(args.print_crd, "--print-crd"), (args.print_deviceclasses, "--print-deviceclasses")]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))?;
    eprintln!(
        "cpupoold: {flag} is part of the Kubernetes cluster integration, and this cpupoold was built \
         without the `k8s` feature: use the .deb or .rpm package's cpupoold (built with it), or build \
         with `cargo build --features k8s`"
    );
    Some(ExitCode::from(EXIT_USAGE))
}

/// The async runtime's worker threads (the engine has a thread of its own).
const WORKER_THREADS: usize = 2;

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(parent) = args.spin {
        return cpupoold::host::cgroupfs::settle::spin(parent);
    }
    #[cfg(not(feature = "k8s"))]
    if let Some(code) = k8s_flags_not_built(&args) {
        return code;
    }
    #[cfg(feature = "k8s")]
    if args.print_crd {
        return match cpupoold::kubernetes::cluster::crd::crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("cpupoold: generating the CRD: {e}");
                ExitCode::FAILURE
            }
        };
    }
    cpupoold::logging::init(args.log_level.unwrap_or(log::LevelFilter::Info));
    if args.log_level.is_some() {
        cpupoold::logging::keep_command_line_level();
    }
    let opts = match options(&args) {
        Ok(opts) => opts,
        Err(e) => return fail(&*e),
    };
    let (opts, settings) = match daemon::settings(opts) {
        Ok(loaded) => loaded,
        Err(e) => return fail(&e),
    };
    #[cfg(feature = "k8s")]
    if args.print_deviceclasses {
        return match cpupoold::kubernetes::cluster::classes::classes_yaml(&settings) {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("cpupoold: generating the DeviceClasses: {e}");
                ExitCode::FAILURE
            }
        };
    }
    cpupoold::logging::configure(settings.log_level);
    // Before the runtime and the sockets, which take their descriptors from this limit.
    match cpupoold::fds::raise_nofile() {
        Ok(r) if r.soft > r.before => log::info!(
            "descriptors: soft RLIMIT_NOFILE raised from {} to {} (the hard limit)",
            r.before,
            r.soft
        ),
        Ok(r) => log::info!("descriptors: soft RLIMIT_NOFILE {} (the hard limit)", r.soft),
        Err(e) => log::warn!("descriptors: {}; keeping {}", cpupoold::error_chain(&e), e.before),
    }
    // tokio's builder panics when it cannot start its workers (pids.max reached): ask first,
    // for them and the first blocking thread.
    if let Err(e) = cpupoold::threads::probe("the async runtime", WORKER_THREADS + 1) {
        return fail(&e);
    }
    let runtime =
        match tokio::runtime::Builder::new_multi_thread().worker_threads(WORKER_THREADS).enable_all().build()
        {
            Ok(rt) => rt,
            Err(e) => return fail(&e),
        };
    let ran = runtime.block_on(async {
        let host = daemon::Host::connect(&settings, &opts).await?;
        daemon::run(opts, settings, host, std::future::pending()).await
    });
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        // Stopped on purpose, and already said why.
        Err(daemon::DaemonError::NeedsRestart(_)) => ExitCode::from(daemon::EXIT_RESTART),
        Err(e) => fail(&e),
    }
}

/// What the arguments ask for; `--sandbox` prepares (or reuses) the simulated host.
fn options(args: &Args) -> Result<RunOptions, Box<dyn std::error::Error>> {
    let sandbox = match &args.sandbox {
        Some(dir) => Some(Sandbox::prepare(dir, args.topology.as_deref())?),
        None => None,
    };
    let dirs = match &sandbox {
        Some(sb) => sb.config_dirs(),
        None => {
            ConfigDirs { etc: args.config_dir.clone(), vendor: args.vendor_config_dir.clone(), cluster: None }
        }
    };
    let bus = args.bus.clone().unwrap_or(if sandbox.is_some() {
        BusChoice::Private
    } else {
        BusChoice::Bus(cpupoold::api::dbus::Bus::System)
    });
    let systemd_bus = match &args.systemd_bus {
        Some(BusChoice::Bus(b)) => Some(b.clone()),
        Some(other) => {
            return Err(
                UsageError(format!("--systemd-bus {other:?}: give system, session or an address")).into()
            )
        }
        None => None,
    };
    Ok(RunOptions {
        dirs,
        sandbox,
        restore_previous_state: args.restore_previous_state,
        proc_root: "/proc".into(),
        check_interval: std::time::Duration::from_secs(args.check_interval),
        health_interval: std::time::Duration::from_secs(args.health_interval),
        bus,
        systemd_bus,
    })
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct UsageError(String);

fn fail(e: &dyn std::error::Error) -> ExitCode {
    log::error!("{}", cpupoold::error_chain(e));
    ExitCode::FAILURE
}
