//! The engine: the one owner of the state.
//!
//! It runs on its own thread. Adapters send it [`Request`]s through a [`Handle`] and await the
//! reply; reads never wait for it, because every committed state is published as an immutable
//! [`Snapshot`] on a watch channel.
//!
//! A mutation is decided by the pure core on a copy of the state, turned into effects by the
//! planner, executed by the backend, made durable by the store, and only then published and
//! acknowledged. Effects that take CPUs away run before the save and those that give CPUs after
//! it ([`crate::core::plan::kept`]), so a crash never leaves CPUs with a target the saved state
//! lacks. If an effect or the save fails, the effects already executed are undone by executing
//! the reverse plan, and the caller is told.
//!
//! The engine is a few owned parts under one dispatcher:
//! - [`handle`]: the contract adapters use (requests, the handle, snapshots with the keepers'
//!   reports under their types, events);
//! - [`view`]: the snapshot's read model: the questions adapters ask it (a container's CPUs for
//!   its devices, a claim's assignments, the unpooled CPUs), answered by the core;
//! - `actor`: start-up, the owner loop (`Engine::run` groups queued Assign and Release
//!   requests) and publishing snapshots;
//! - `commands`: what each request kind does, in one dispatch (`Engine::handle`): which parts
//!   it drives and what it publishes. **A new request kind** is a `Request` variant and its
//!   `Handle` method in `handle`, and its arm in `commands` (plus the part's own work, where
//!   a part must learn something new);
//! - `ledger`: the part that alone holds the state, the store and the backend, and the commit
//!   path (decide, plan, apply, save, read back, undo), returning the events of what it made;
//!   `batch`: its all-or-nothing assignment of several targets; `exited`: its release of
//!   assignments whose process ended, before it refuses a booking for want of capacity;
//! - `claims`: the prepared DRA claims: the ledger's prepare (the claim's assignments booked
//!   and the claim recorded in one commit) and unprepare (released and forgotten in one), the
//!   CDI specs that follow from the state (written after the commit, again at start when
//!   missing), and the claim records of earlier releases (`claims/records.rs`, exported as
//!   `claim_records` for the migration's tests) taken into the state at start;
//! - `reload`: new settings and pool edits;
//! - `observe`: reading the host against a state, off the engine thread (the drift check's first
//!   half), for reconciling and for the ledger's read-back;
//! - `drift`: the drift check's second half, judging what the reading found against the current
//!   state, and the corrections;
//! - `kubelet`: what the kubelet wing reports (pods, containers) folded into the state;
//! - `keeper`: the contract of the keepers of host settings beside the cpusets (it names none);
//! - `keepers`: their registry, the checks of new settings, and the one place the engine
//!   drives them from (start, reload, drift check, reapply, health tick, stop);
//! - the keepers: `irq` (device interrupts off isolated CPUs), [`power`] (the sysfs files of the
//!   power classes), `cache` (the resctrl groups of the cache classes) and [`housekeeping`] (the
//!   unbound workqueue masks, kernel threads, partition validity and isolation health), which
//!   passes after every reconcile.

mod actor;
mod batch;
mod cache;
mod claims;
mod commands;
mod drift;
mod exited;
pub mod handle;
pub mod housekeeping;
mod irq;
mod keeper;
mod keepers;
mod kubelet;
mod ledger;
mod observe;
pub mod power;
mod reload;
pub mod view;

use std::sync::Arc;

use tokio::sync::{broadcast, watch};

pub use crate::config::edit::ConfigSource;
pub use actor::{StartError, StartReport};
pub use claims::records as claim_records;
pub use handle::{
    ping_within, Change, DriftReport, Event, Handle, PrepareClaim, Reports, Request, Snapshot, PING_TIMEOUT,
};
pub use housekeeping::IsolationReport;
pub use irq::IrqReport;
pub use kubelet::{KubeletUpdate, KubeletView};
pub use ledger::describe;
pub use observe::Found as DriftFound;
pub use reload::Reloaded;
pub use view::{AtStart, ClaimFor, ClaimHeld, DraWanted, HeldError, Overlap, Server};

use crate::config::runtime::DropinError;
use crate::config::ConfigError;
use crate::core::state;
use crate::host::cgroupfs::HostError;
use crate::host::store::StoreError;
use crate::host::sysfs::SysfsError;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request itself was refused; nothing changed.
    #[error(transparent)]
    State(#[from] state::Error),
    /// Applying the change to the host failed; it was rolled back.
    #[error("applying the change failed and was rolled back")]
    Apply(#[source] HostError),
    /// Reading back what the kernel enforces on a target failed (its file gone, the daemon
    /// out of descriptors): no answer about the target, so the change is undone as a failed
    /// write would be, or a kept binding reported degraded.
    #[error("reading back what the kernel enforces on {target} failed")]
    ReadBack {
        /// The target.
        target: String,
        /// The host's error: the file and the kernel's answer.
        #[source]
        source: HostError,
    },
    /// The change could not be made durable; it was rolled back.
    #[error("saving the state failed; the change was rolled back")]
    Store(#[source] StoreError),
    /// A new configuration is invalid; the running one stays.
    #[error("the new configuration is invalid; the running one stays")]
    Config(#[source] Box<ConfigError>),
    /// A new configuration would take CPUs from live assignments; the running one stays.
    #[error("the new configuration would strand assignments; the running one stays: {0}")]
    Stranded(String),
    /// A new configuration gives the kubelet (its device plugin, or DRA) CPUs its static CPU
    /// manager has given to containers; the running one stays. (At start the same conflict
    /// leaves the device plugin or the DRA driver not started.)
    #[error("the new configuration would serve to the kubelet CPUs its static CPU manager holds; the running one stays")]
    StaticCpuManager(#[source] crate::host::kubelet::StaticConflict),
    /// Reading the topology failed.
    #[error("reading the CPU topology failed")]
    Topology(#[source] SysfsError),
    /// The runtime drop-in could not be written; nothing changed.
    #[error("writing the runtime drop-in failed; nothing changed")]
    Dropin(#[source] DropinError),
    /// A pool edit would not take effect: a file read after the runtime drop-in sets the key.
    #[error("`{key}` is set again by `{}`, which is read after `{}`; change it there", file.display(), dropin.display())]
    Overridden {
        /// The key.
        key: String,
        /// The file that wins.
        file: std::path::PathBuf,
        /// The runtime drop-in.
        dropin: std::path::PathBuf,
    },
    /// Pool edits need configuration files, and this engine has none.
    #[error("this daemon runs without configuration files, so pools cannot be changed at run time")]
    NoConfigFiles,
    /// A thread the work needs could not be started; nothing changed.
    #[error("the host could not be read")]
    Thread(#[source] crate::threads::ThreadError),
    /// A prepared claim's CDI spec could not be written or removed (said why); a prepare
    /// that fails so gave its CPUs back.
    #[error("{0}")]
    Claim(String),
    /// The engine is gone (shutting down).
    #[error("the daemon is shutting down")]
    Stopped,
}

impl EngineError {
    /// The error as both management interfaces and the device plugin name it: each kind its
    /// own [`ErrorKind`](cpupool_wire::ErrorKind); the reason is the whole cause chain.
    pub fn to_api(&self) -> cpupool_wire::ApiError {
        use cpupool_wire::{ApiError, ErrorKind};
        let kind = match self {
            EngineError::State(s) => return s.to_api(),
            EngineError::Apply(_)
            | EngineError::ReadBack { .. }
            | EngineError::Thread(_)
            | EngineError::Claim(_) => ErrorKind::ApplyFailed,
            EngineError::Store(_) | EngineError::Dropin(_) => ErrorKind::NotDurable,
            EngineError::Config(_)
            | EngineError::Overridden { .. }
            | EngineError::NoConfigFiles
            | EngineError::StaticCpuManager(_) => ErrorKind::ConfigRejected,
            EngineError::Stranded(_) => ErrorKind::AssignmentsStranded,
            EngineError::Topology(_) => ErrorKind::TopologyFailed,
            EngineError::Stopped => return ApiError::shutting_down(),
        };
        // The kind already says what failed and that nothing changed (clients word it their own
        // way, cpupoolctl: "applying the change to the host failed, and it was rolled back: ..."),
        // so the reason is the cause alone; the D-Bus message, which has no kind to lean on, is
        // the whole chain.
        let reason = match (self, std::error::Error::source(self)) {
            (EngineError::Stranded(misfits), _) => misfits.clone(),
            (_, Some(cause)) => crate::error_chain(cause),
            (_, None) => self.to_string(),
        };
        ApiError::new(kind, serde_json::json!({ "reason": reason }), crate::error_chain(self))
    }
}

/// The engine. Build it with [`Engine::start`], then [`Engine::spawn`] it.
pub struct Engine {
    /// The state, the store and the backend, and the commit path ([`ledger`]).
    ledger: ledger::Ledger,
    /// `daemon.lend_idle` as configured; see [`Engine::layout_options`].
    lend_idle: bool,
    config_error: Option<String>,
    /// What the drift checks found ([`drift`]).
    drift: drift::Drift,
    /// See [`Snapshot::state_warnings`].
    state_warnings: Vec<String>,
    events: broadcast::Sender<Event>,
    snapshots: watch::Sender<Snapshot>,
    config: Option<ConfigSource>,
    /// Interrupts, power classes, cache classes, and housekeeping once it has joined
    /// ([`Engine::with_housekeeping`]) ([`keeper`]).
    keepers: keepers::Keepers,
    kubelet: Arc<KubeletView>,
    /// Each pool's slice path, as [`Engine::publish`] last built them (pools change seldom;
    /// every mutation publishes).
    slices: std::cell::RefCell<Vec<(crate::core::pool::PoolName, crate::core::state::CgroupPath)>>,
    /// The keys of the settings last installed, with their values and files: what a reload
    /// compares with ([`Reloaded`]).
    origins: crate::config::Origins,
    /// Where the prepared claims' CDI specs go ([`claims`]).
    claims: claims::ClaimSpecs,
}

pub use crate::error_chain;

#[cfg(test)]
mod tests;
