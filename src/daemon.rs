//! The daemon's lifecycle: load the settings ([`settings`]), connect to the host
//! ([`Host::connect`]), start the engine, tell systemd we are ready, serve until SIGTERM, re-read
//! the configuration on SIGHUP, keep the watchdog fed while the engine answers, and stop every
//! task through one cancellation token ([`run`]).
//!
//! `run` reads as its steps; the served sockets and adapter tasks it starts are in `tasks`, the
//! periodic jobs (drift check, isolation health, watchdog) in `periodic`.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::dbus::{self, Bus};
use crate::api::varlink;
use crate::config::{ConfigDirs, ConfigError, Settings};
use crate::engine::{self, ConfigSource, Engine, Handle, StartError};
use crate::host::cgroupfs::CgroupFs;
use crate::sandbox::Sandbox;

mod periodic;
mod tasks;

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Where the configuration is read from.
    pub dirs: ConfigDirs,
    /// Run against this simulated host instead of the real one.
    pub sandbox: Option<Sandbox>,
    /// Use the previous good state copy when the current one is damaged.
    pub restore_previous_state: bool,
    /// Where processes are found (normally `/proc`).
    pub proc_root: PathBuf,
    /// How often drift is looked for ([`crate::engine::Handle::check_drift`]); zero: never.
    pub check_interval: Duration,
    /// How often isolation health is sampled; zero: never.
    pub health_interval: Duration,
    /// Where to serve the D-Bus API.
    pub bus: BusChoice,
    /// Where systemd is reached: forces the systemd backend (the system bus on a real host
    /// with `daemon.backend = "auto"`).
    pub systemd_bus: Option<Bus>,
}

/// Where the D-Bus API is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BusChoice {
    /// Not at all.
    None,
    /// On the sandbox's private bus (started if it is not running).
    Private,
    /// On this bus.
    Bus(Bus),
}

impl std::str::FromStr for BusChoice {
    type Err = String;

    /// `system`, `session`, `private`, `none`, or a D-Bus address (`unix:path=...`).
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "none" => BusChoice::None,
            "private" => BusChoice::Private,
            "system" => BusChoice::Bus(Bus::System),
            "session" => BusChoice::Bus(Bus::Session),
            a if a.contains(':') => BusChoice::Bus(Bus::Address(a.to_owned())),
            other => {
                return Err(format!(
                    "`{other}` is not system, session, private, none or a D-Bus address such as unix:path=/run/bus"
                ))
            }
        })
    }
}

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The configuration could not be read.
    #[error("reading the configuration")]
    Config(#[source] ConfigError),
    /// The engine could not start.
    #[error("starting")]
    Start(#[source] StartError),
    /// Installing a signal handler failed.
    #[error("installing signal handlers")]
    Signals(#[source] std::io::Error),
    /// The D-Bus API could not be served.
    #[error("serving the D-Bus API on {bus}")]
    DBus {
        /// The bus.
        bus: String,
        /// Why.
        #[source]
        source: zbus::Error,
    },
    /// `--bus private` without a sandbox.
    #[error("--bus private needs --sandbox (the private bus lives in the sandbox directory)")]
    PrivateBusWithoutSandbox,
    /// The sandbox's private bus could not be started.
    #[error("starting the sandbox's bus")]
    PrivateBus(#[source] crate::sandbox::SandboxError),
    /// The engine could not be started on a thread of its own.
    #[error("starting the engine")]
    EngineThread(#[source] crate::threads::ThreadError),
    /// systemd could not be reached for the systemd backend.
    #[error("connecting to systemd on {bus} (daemon.backend = \"cgroupfs\" runs without it)")]
    Systemd {
        /// The bus.
        bus: String,
        /// Why.
        #[source]
        source: zbus::Error,
    },
    /// `[k8s] enabled = true` in a daemon built without the `k8s` feature.
    #[error("k8s.enabled = true, but this cpupoold was built without the `k8s` feature (cargo build --features k8s); \
             set k8s.enabled = false or install a build with it")]
    K8sNotBuilt,
    /// Only a start anew can serve what the daemon must (the device plugin's directory was made
    /// after the start, read-only to this service): it stopped cleanly for systemd to start it
    /// again (exit status [`EXIT_RESTART`]).
    #[error("{0}")]
    NeedsRestart(String),
    /// The varlink socket could not be bound.
    #[error("binding the varlink socket `{}`", path.display())]
    Varlink {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Loads the settings for `opts`, confined to the sandbox when there is one.
pub fn load_settings(opts: &RunOptions) -> Result<Settings, ConfigError> {
    config_source(opts).load(None)
}

/// Where the engine reads the configuration again (SIGHUP, pool edits).
fn config_source(opts: &RunOptions) -> ConfigSource {
    let sandbox = opts.sandbox.clone();
    ConfigSource {
        dirs: opts.dirs.clone(),
        adjust: Box::new(move |settings| {
            if let Some(sb) = &sandbox {
                sb.confine(settings);
            }
        }),
    }
}

/// The settings to start with, loaded once by `main` and handed to [`Host::connect`] and [`run`].
/// With `[k8s]` enabled, the cluster fragment (`<runtime_dir>/cluster.toml`, written from a
/// ConfigMap earlier in this boot) is merged last, here and on every reload (the returned options
/// name it); one that no longer loads is removed and the local files apply. Without the `k8s`
/// feature, `k8s.enabled = true` is an error rather than silently ignored.
#[allow(clippy::result_large_err)] // the daemon's own error, made once at start
pub fn settings(opts: RunOptions) -> Result<(RunOptions, Settings), DaemonError> {
    let settings = load_settings(&opts).map_err(DaemonError::Config)?;
    if !settings.k8s.enabled {
        return Ok((opts, settings));
    }
    #[cfg(not(feature = "k8s"))]
    {
        Err(DaemonError::K8sNotBuilt)
    }
    #[cfg(feature = "k8s")]
    {
        let mut opts = opts;
        let path = crate::kubernetes::cluster::cluster_file(&settings.paths.runtime_dir);
        opts.dirs.cluster = Some(path.clone());
        match load_settings(&opts) {
            Ok(with_cluster) => Ok((opts, with_cluster)),
            Err(e) => {
                log::error!(
                    "k8s: the cluster configuration `{}` no longer loads ({}); removing it, the local files apply",
                    path.display(),
                    crate::error_chain(&e)
                );
                if let Err(e) = std::fs::remove_file(&path) {
                    log::error!("k8s: removing `{}`: {e}", path.display());
                }
                Ok((opts, settings))
            }
        }
    }
}

/// The host the daemon acts on: the backend that applies effects, the cgroup tree it reads
/// back (the reclaimer watches it too), and the connection to systemd when that backend runs.
pub struct Host {
    backend: Box<dyn crate::host::Backend>,
    fs: CgroupFs,
    systemd: Option<zbus::Connection>,
}

impl Host {
    /// The host `settings` and `opts` ask for: the systemd backend when `daemon.backend` says so
    /// (or `auto` finds systemd running the host), the cgroupfs backend otherwise.
    pub async fn connect(settings: &Settings, opts: &RunOptions) -> Result<Host, DaemonError> {
        use crate::config::Backend as Choice;
        let mut fs =
            CgroupFs::new(&settings.paths.cgroup_root, &opts.proc_root).with_kernel(settings.paths.kernel);
        if let Some(sb) = &opts.sandbox {
            // The sandbox never changes a real process: affinities are recorded in DIR/proc.
            fs = fs.with_processes(sb.processes());
        }
        let systemd = match settings.backend {
            Choice::Cgroupfs => false,
            Choice::Systemd => true,
            // The sandbox's cgroupfs is a directory of plain files: systemd has no say there.
            Choice::Auto => {
                opts.systemd_bus.is_some()
                    || (opts.sandbox.is_none() && std::path::Path::new("/run/systemd/system").is_dir())
            }
        };
        if !systemd {
            return Ok(Host { backend: Box::new(fs.clone()), fs, systemd: None });
        }
        let bus = opts.systemd_bus.clone().unwrap_or(Bus::System);
        let backend =
            crate::host::systemd::Systemd::connect(&bus, fs.clone(), tokio::runtime::Handle::current())
                .await
                .map_err(|source| DaemonError::Systemd { bus: bus.to_string(), source })?;
        let conn = backend.connection().clone();
        Ok(Host { backend: Box::new(backend), fs, systemd: Some(conn) })
    }
}

/// Runs the daemon on `host` with `settings` (both from [`settings`] and [`Host::connect`])
/// until `shutdown` completes, SIGTERM/SIGINT arrives, or the device plugin asks for a start
/// anew.
///
/// Every task started here stops on one [`CancellationToken`] and is tracked by one
/// [`TaskTracker`]. The order of the stop: the D-Bus name and object go first (no new calls), then
/// the token stops the varlink server, the reclaimer, the cluster integration and the device
/// plugin; once all of them have let go of their engine handles, the engine thread ends.
pub async fn run(
    opts: RunOptions,
    settings: Settings,
    host: Host,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DaemonError> {
    let Host { backend, fs, systemd } = host;
    let (handle, thread, summary) = start_engine(&opts, &settings, backend).await?;
    let stop = CancellationToken::new();
    // An early return (a bus or socket that cannot be served) stops what was started too.
    let _stop_on_return = stop.clone().drop_guard();
    let tasks = TaskTracker::new();
    tasks.spawn(crate::reclaim::run(handle.clone(), fs, systemd, stop.clone().cancelled_owned()));
    let signals = Signals::install()?;
    // Sockets passed by the service manager: read once (reading clears the environment), for
    // the varlink socket and the metrics endpoint.
    let mut passed = listenfd::ListenFd::from_env();
    let (listener, varlink_path) = bind_varlink(&settings, &mut passed)?;
    let auth = authorizer(&opts, &settings);
    let budgets = crate::fds::Budgets::current();
    tasks::log_budgets(&budgets);
    tasks::serve_varlink(listener, &handle, auth.clone(), &budgets, &tasks, &stop);
    let metrics_at = tasks::serve_metrics(&settings, &handle, &tasks, &stop, &mut passed);
    // Why the device plugin needs the daemon started anew, if it does.
    let restart = tasks::spawn_adapters(&opts, &settings, &handle, budgets.device_plugin, &tasks, &stop);
    // The sandbox's own bus lives as long as this function (unless it was already running).
    let (bus, _private_bus) = choose_bus(&opts)?;
    let dbus = serve_dbus(bus.as_ref(), &handle, auth).await?;

    notify(&[NotifyState::Ready, NotifyState::Status(&summary)]);
    if let Some(sb) = &opts.sandbox {
        print_banner(sb, &handle, &varlink_path, bus.as_ref(), &metrics_at);
    }
    serve(&opts, &handle, signals, &tasks, &stop, shutdown).await;
    let restart = restart.get().cloned();
    if let Some(why) = &restart {
        log::warn!("{why}: stopping, for systemd to start cpupoold again (exit status {EXIT_RESTART})");
    }
    notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
    // The APIs hold engine handles: they must let go before the engine thread can end.
    if let Some(d) = dbus {
        d.stop().await;
    }
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    drop(handle);
    if thread.join().is_err() {
        log::error!("the engine thread panicked");
    }
    match restart {
        Some(why) => Err(DaemonError::NeedsRestart(why)),
        None => Ok(()),
    }
}

/// Starts the engine on `backend` and on a thread of its own; returns its handle, its thread, and
/// the summary of what it started with (logged, and systemd's first `STATUS=`).
async fn start_engine(
    opts: &RunOptions,
    settings: &Settings,
    backend: Box<dyn crate::host::Backend>,
) -> Result<(Handle, std::thread::JoinHandle<()>, String), DaemonError> {
    log::info!("applying pools through the {} backend", backend.name());
    let started = std::time::Instant::now();
    // Starting blocks (files, fsync, and the systemd backend's calls, which wait on this
    // runtime): off the async workers.
    let (start_settings, restore) = (settings.clone(), opts.restore_previous_state);
    let roots = engine::housekeeping::Roots {
        // The kernel's counters: the sandbox simulates them in DIR/proc.
        procfs: opts.sandbox.as_ref().map_or_else(|| opts.proc_root.clone(), |sb| sb.procfs()),
        sysfs: settings.paths.sysfs_root.clone(),
        cgroup: settings.paths.cgroup_root.clone(),
        state_dir: settings.paths.state_dir.clone(),
        kernel: settings.paths.kernel,
    };
    let (engine, report) = crate::threads::run_blocking("the engine's start", move || {
        Engine::start(&start_settings, backend, restore).map(|(e, r)| (e.with_housekeeping(roots), r))
    })
    .await
    .map_err(DaemonError::EngineThread)?
    .map_err(DaemonError::Start)?;
    let (handle, thread) =
        engine.with_config(config_source(opts)).spawn().map_err(DaemonError::EngineThread)?;
    let snap = handle.snapshot();
    log::info!(
        "started in {:.1} ms: {}{}; {} corrections applied, {} failed",
        started.elapsed().as_secs_f64() * 1e3,
        snap.summary(),
        if report.fresh { " (new state)" } else { "" },
        report.corrections,
        report.failed_corrections
    );
    if !report.fresh {
        // What a restart finds different from the saved state drifted while the daemon was
        // away; a first start's writes are the initial apply, not drift.
        crate::counters::counters().drift(report.corrections, report.failed_corrections);
    }
    for p in snap.state.pools().values() {
        log::info!(POOL = p.name.as_str(); "pool {} ({}): CPUs {}", p.name, p.kind, p.cpus);
    }
    Ok((handle, thread, snap.summary()))
}

/// The varlink socket: the one the service manager passed, or one bound under the runtime
/// directory; and its path.
#[allow(clippy::result_large_err)] // run()'s own error, made once at start
fn bind_varlink(
    settings: &Settings,
    passed: &mut listenfd::ListenFd,
) -> Result<(tokio::net::UnixListener, PathBuf), DaemonError> {
    varlink::listen_from(&settings.paths.runtime_dir, passed).map_err(|source| DaemonError::Varlink {
        path: varlink::socket_path(&settings.paths.runtime_dir),
        source,
    })
}

/// Who may call the APIs: root, the admin group, and in the sandbox whoever runs it.
fn authorizer(opts: &RunOptions, settings: &Settings) -> varlink::Authorizer {
    varlink::Authorizer {
        admin_gid: admin_gid(&settings.admin_group),
        // The sandbox belongs to whoever runs it.
        owner_uid: opts.sandbox.as_ref().map(|_| nix::unistd::getuid().as_raw()),
        proc_root: opts.proc_root.clone(),
    }
}

/// The bus to serve the D-Bus API on, and the sandbox's private bus when `--bus private` started
/// it (it lives as long as the caller keeps it).
#[allow(clippy::result_large_err)] // run()'s own error, made once at start
fn choose_bus(opts: &RunOptions) -> Result<(Option<Bus>, Option<crate::sandbox::PrivateBus>), DaemonError> {
    Ok(match &opts.bus {
        BusChoice::None => (None, None),
        BusChoice::Bus(b) => (Some(b.clone()), None),
        BusChoice::Private => {
            let sb = opts.sandbox.as_ref().ok_or(DaemonError::PrivateBusWithoutSandbox)?;
            let pb = sb.private_bus().map_err(DaemonError::PrivateBus)?;
            let address = pb.address.clone();
            (Some(Bus::Address(address)), Some(pb))
        }
    })
}

/// Serves the D-Bus API on `bus`, if there is one.
async fn serve_dbus(
    bus: Option<&Bus>,
    handle: &Handle,
    auth: varlink::Authorizer,
) -> Result<Option<dbus::Service>, DaemonError> {
    let Some(b) = bus else { return Ok(None) };
    let served = dbus::serve(b, handle.clone(), auth)
        .await
        .map_err(|source| DaemonError::DBus { bus: b.to_string(), source })?;
    log::info!("serving {} on {b}", dbus::BUS_NAME);
    Ok(Some(served))
}

/// The signals the daemon answers, installed before it says it is ready.
struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    #[allow(clippy::result_large_err)] // run()'s own error, made once at start
    fn install() -> Result<Signals, DaemonError> {
        let on = |kind| signal(kind).map_err(DaemonError::Signals);
        Ok(Signals {
            term: on(SignalKind::terminate())?,
            int: on(SignalKind::interrupt())?,
            hup: on(SignalKind::hangup())?,
        })
    }
}

/// Serves until `shutdown` completes, SIGTERM or SIGINT arrives, or `stop` is cancelled (the device
/// plugin asking for a start anew): re-reads the configuration on SIGHUP, while the periodic jobs
/// ([`periodic`]) look for drift, sample isolation health and feed systemd's watchdog.
async fn serve(
    opts: &RunOptions,
    handle: &Handle,
    mut signals: Signals,
    tasks: &TaskTracker,
    stop: &CancellationToken,
    shutdown: impl Future<Output = ()>,
) {
    let mut usec = 0u64;
    let watchdog = sd_notify::watchdog_enabled(false, &mut usec).then(|| Duration::from_micros(usec / 2));
    let schedule = periodic::Schedule {
        drift: Some(opts.check_interval).filter(|d| !d.is_zero()),
        health: Some(opts.health_interval).filter(|d| !d.is_zero()),
        watchdog,
    };
    periodic::spawn_periodic(tasks, stop, schedule, periodic::EngineJobs(handle.clone()));
    tokio::pin!(shutdown);
    tokio::select! {
        _ = &mut shutdown => {}
        _ = stop.cancelled() => {}
        _ = signals.term.recv() => log::info!("SIGTERM: stopping"),
        _ = signals.int.recv() => log::info!("SIGINT: stopping"),
        _ = async {
            while signals.hup.recv().await.is_some() {
                // The outcome is logged and shown in STATUS=; `cpupoolctl reload` reports it too.
                let _ = crate::api::handlers::reload(handle).await;
            }
            // No more SIGHUPs cannot happen while the handler is installed; never a reason to stop.
            std::future::pending::<()>().await
        } => {}
    }
}

/// The exit status that asks systemd for a start anew (the unit's `RestartForceExitStatus=`;
/// EX_TEMPFAIL), with [`DaemonError::NeedsRestart`].
pub const EXIT_RESTART: u8 = 75;

fn notify(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, states) {
        log::warn!("sd_notify failed: {e}");
    }
}

/// The admin group's gid; a missing group leaves mutations to root.
fn admin_gid(name: &str) -> Option<u32> {
    match nix::unistd::Group::from_name(name) {
        Ok(Some(g)) => Some(g.gid.as_raw()),
        Ok(None) => {
            log::info!("admin group `{name}` does not exist; no group may change assignments over the APIs");
            None
        }
        Err(e) => {
            log::warn!("looking up admin group `{name}`: {e}; no group may change assignments over the APIs");
            None
        }
    }
}

fn print_banner(
    sb: &Sandbox,
    handle: &Handle,
    varlink_path: &std::path::Path,
    bus: Option<&Bus>,
    metrics: &Result<crate::config::Listen, String>,
) {
    let snap = handle.snapshot();
    let mut out = format!(
        "cpupoold sandbox ready: {} ({}), {}\n",
        crate::core::state::counted(snap.topology.online().len() as u64, "CPU"),
        sb.shape(),
        snap.summary()
    );
    for p in snap.state.pools().values() {
        out.push_str(&format!("  pool {:<12} {:<9} CPUs {}\n", p.name, p.kind.to_string(), p.cpus));
    }
    // What isolation moved off the isolated pools' CPUs, so a newcomer sees it happen.
    for (what, line) in [
        ("irqs", snap.report::<crate::engine::IrqReport>().summary()),
        ("kthreads", snap.report::<crate::engine::IsolationReport>().kthreads.summary()),
    ] {
        if !line.is_empty() {
            out.push_str(&format!("  {what:<9} {line}\n"));
        }
    }
    let dbus = match bus {
        Some(Bus::Address(a)) => a.clone(),
        Some(Bus::System) => "system bus".into(),
        Some(Bus::Session) => "session bus".into(),
        None => "off".into(),
    };
    out.push_str(&format!("  dbus      {dbus}\n"));
    out.push_str(&format!(
        "  config    {}\n  cgroupfs  {}\n  state     {}\n  varlink   unix:{}\n  reload    kill -HUP {}\n",
        sb.etc().join("config.toml").display(),
        sb.cgroupfs().display(),
        snap.state_path.display(),
        varlink_path.display(),
        std::process::id()
    ));
    match metrics {
        Ok(at) => out.push_str(&format!("  metrics   {at}\n")),
        Err(why) => out.push_str(&format!("  metrics   {why}\n")),
    }
    println!("{out}READY");
}
