//! The daemon's lifecycle: start the engine, tell systemd we are ready, serve until SIGTERM,
//! re-read the configuration on SIGHUP, keep the watchdog fed while the engine answers.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::signal::unix::{signal, SignalKind};

use crate::api::varlink;
use crate::config::{self, ConfigDirs, ConfigError, Settings};
use crate::engine::{self, Engine, Handle, StartError};
use crate::host::cgroupfs::CgroupFs;
use crate::sandbox::Sandbox;

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
    let mut settings = config::load(&opts.dirs)?;
    if let Some(sb) = &opts.sandbox {
        sb.confine(&mut settings);
    }
    Ok(settings)
}

/// Runs the daemon until `shutdown` completes or SIGTERM/SIGINT arrives.
pub async fn run(opts: RunOptions, shutdown: impl Future<Output = ()>) -> Result<(), DaemonError> {
    let settings = load_settings(&opts).map_err(DaemonError::Config)?;
    let backend = CgroupFs::new(&settings.paths.cgroup_root, &opts.proc_root);
    let started = std::time::Instant::now();
    let (engine, report) =
        Engine::start(&settings, backend, opts.restore_previous_state).map_err(DaemonError::Start)?;
    let (handle, thread) = engine.spawn();
    let snap = handle.snapshot();
    log::info!(
        "started in {:.1} ms: {}{}; {} corrections applied, {} failed",
        started.elapsed().as_secs_f64() * 1e3,
        snap.summary(),
        if report.fresh { " (new state)" } else { "" },
        report.corrections,
        report.failed_corrections
    );
    for p in snap.state.pools().values() {
        log::info!(POOL = p.name.as_str(); "pool {} ({}): CPUs {}", p.name, p.kind, p.cpus);
    }
    let mut term = signal(SignalKind::terminate()).map_err(DaemonError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(DaemonError::Signals)?;
    let mut hup = signal(SignalKind::hangup()).map_err(DaemonError::Signals)?;

    let varlink_path = varlink::socket_path(&settings.paths.runtime_dir);
    let listener = varlink::bind(&settings.paths.runtime_dir)
        .map_err(|source| DaemonError::Varlink { path: varlink_path.clone(), source })?;
    let auth = varlink::Authorizer {
        admin_gid: admin_gid(&settings.admin_group),
        // The sandbox belongs to whoever runs it.
        owner_uid: opts.sandbox.as_ref().map(|_| nix::unistd::getuid().as_raw()),
    };
    let (stop_api, api_stopped) = tokio::sync::oneshot::channel::<()>();
    let api = tokio::spawn(varlink::serve(listener, handle.clone(), auth, async {
        let _ = api_stopped.await;
    }));

    notify(&[NotifyState::Ready, NotifyState::Status(&snap.summary())]);
    if let Some(sb) = &opts.sandbox {
        print_banner(sb, &handle, &varlink_path);
    }

    let mut usec = 0u64;
    let watchdog = sd_notify::watchdog_enabled(false, &mut usec);
    let period = if watchdog { Duration::from_micros(usec / 2) } else { Duration::from_secs(3600) };
    let mut ticker = tokio::time::interval(period.max(Duration::from_millis(10)));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = term.recv() => { log::info!("SIGTERM: stopping"); break }
            _ = int.recv() => { log::info!("SIGINT: stopping"); break }
            _ = hup.recv() => reload(&opts, &handle).await,
            _ = ticker.tick(), if watchdog => {
                // Only a live engine keeps the watchdog fed: a stuck one gets us restarted.
                match engine::ping_within(&handle, engine::PING_TIMEOUT).await {
                    Some(_) => notify(&[NotifyState::Watchdog]),
                    None => log::error!("the engine did not answer within {:?}; not feeding the watchdog", engine::PING_TIMEOUT),
                }
            }
        }
    }
    notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
    // The API holds engine handles: it must let go before the engine thread can end.
    let _ = stop_api.send(());
    if let Err(e) = api.await {
        log::error!("the varlink server failed: {e}");
    }
    drop(handle);
    if thread.join().is_err() {
        log::error!("the engine thread panicked");
    }
    Ok(())
}

async fn reload(opts: &RunOptions, handle: &Handle) {
    notify(&[NotifyState::Reloading]);
    let result = handle.reload(load_settings(opts)).await;
    match result {
        Ok(true) => log::info!("configuration reloaded: {}", handle.snapshot().summary()),
        Ok(false) => log::info!("configuration reloaded: nothing changed"),
        Err(e) => log::error!("configuration rejected, the running one stays: {}", engine::error_chain(&e)),
    }
    notify(&[NotifyState::Ready, NotifyState::Status(&handle.snapshot().summary())]);
}

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

fn print_banner(sb: &Sandbox, handle: &Handle, varlink_path: &std::path::Path) {
    let snap = handle.snapshot();
    let mut out = format!(
        "cpupoold sandbox ready: {} CPUs ({}), {}\n",
        snap.topology.online().len(),
        sb.shape(),
        snap.summary()
    );
    for p in snap.state.pools().values() {
        out.push_str(&format!("  pool {:<12} {:<9} CPUs {}\n", p.name, p.kind.to_string(), p.cpus));
    }
    out.push_str(&format!(
        "  config    {}\n  cgroupfs  {}\n  state     {}\n  varlink   unix:{}\n  reload    kill -HUP {}\n",
        sb.etc().join("config.toml").display(),
        sb.cgroupfs().display(),
        snap.state_path.display(),
        varlink_path.display(),
        std::process::id()
    ));
    println!("{out}READY");
}
