//! One handler per method of the table ([`cpupool_wire::methods`]), shared by both interfaces.
//!
//! A transport resolves a call to its method, checks [`MethodId::auth`] for the caller, and
//! puts the arguments into the method's parameter struct (varlink decodes its JSON into it,
//! D-Bus converts its arguments); the [`Handler`] then decodes the parameters into an engine
//! request ([`args`]), calls the engine or reads its latest snapshot, and answers with the
//! method's reply view ([`views`](crate::api::views)) or an [`ApiError`]. The transport encodes
//! the reply (varlink as JSON, D-Bus as the structures of the XML) or the error.
//!
//! [`MethodId::auth`]: cpupool_wire::methods::MethodId::auth

use std::future::Future;
use std::time::Instant;

use cpupool_wire::methods::{self as m, Method};
use cpupool_wire::varlink::params;
use cpupool_wire::views;
use cpupool_wire::ApiError;

use crate::api::args;
use crate::api::views::{AssignmentView, ClassesReply, CpuView, IsolationReply, PoolView};
use crate::core::state::Target;
use crate::engine::{EngineError, Handle};

/// What a handler may use besides its parameters.
pub struct Ctx<'a> {
    /// The engine.
    pub handle: &'a Handle,
    /// When the interface started serving (`Status`'s uptime).
    pub started: Instant,
    /// Whether the caller may hand process `pid` to the daemon (`Run`): the transport knows
    /// who calls.
    pub may_hand_over: &'a (dyn Fn(u32) -> Result<(), ApiError> + Sync),
}

/// Answers one method of the table.
pub trait Handler: Method {
    /// The reply to a call with `params`, or why there is none.
    fn handle(
        cx: &Ctx<'_>,
        params: Self::Params,
    ) -> impl Future<Output = Result<Self::Reply, ApiError>> + Send;
}

fn engine(e: EngineError) -> ApiError {
    e.to_api()
}

fn assignment(a: &crate::core::state::Assignment) -> views::AssignmentReply {
    views::AssignmentReply { assignment: AssignmentView::from(a) }
}

impl Handler for m::ListPools {
    async fn handle(cx: &Ctx<'_>, _: params::NoParameters) -> Result<views::Pools, ApiError> {
        Ok(views::Pools { pools: PoolView::all(&cx.handle.snapshot()) })
    }
}

impl Handler for m::GetPool {
    async fn handle(cx: &Ctx<'_>, p: params::GetPool) -> Result<views::PoolReply, ApiError> {
        Ok(views::PoolReply { pool: Some(PoolView::find(&cx.handle.snapshot(), &p.name)?) })
    }
}

impl Handler for m::GetTopology {
    async fn handle(cx: &Ctx<'_>, _: params::NoParameters) -> Result<views::Topology, ApiError> {
        let topo = cx.handle.snapshot().topology;
        Ok(views::Topology {
            online: topo.online().to_string(),
            offline: topo.offline().to_string(),
            isolated: topo.isolated().to_string(),
            cpus: CpuView::all(&topo),
        })
    }
}

impl Handler for m::ListAssignments {
    async fn handle(cx: &Ctx<'_>, p: params::ListAssignments) -> Result<views::Assignments, ApiError> {
        let snap = cx.handle.snapshot();
        Ok(views::Assignments { assignments: AssignmentView::list(&snap, p.pool.as_deref())? })
    }
}

impl Handler for m::GetAssignment {
    async fn handle(cx: &Ctx<'_>, p: params::GetAssignment) -> Result<views::AssignmentReply, ApiError> {
        Ok(views::AssignmentReply { assignment: AssignmentView::find(&cx.handle.snapshot(), &p.id)? })
    }
}

impl Handler for m::Status {
    async fn handle(cx: &Ctx<'_>, _: params::NoParameters) -> Result<views::Status, ApiError> {
        let snap = cx.handle.snapshot();
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        Ok(views::Status {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            uptime_seconds: cx.started.elapsed().as_secs(),
            pools: count(snap.state.pools().len()),
            assignments: count(snap.state.assignments().len()),
            state_file: snap.state_path.display().to_string(),
            config_error: snap.config_error.clone(),
            degraded_assignments: count(snap.assignment_health.len()),
            containers: snap.kubelet.container_path(),
        })
    }
}

impl Handler for m::GetIsolation {
    async fn handle(cx: &Ctx<'_>, p: params::GetIsolation) -> Result<views::Isolation, ApiError> {
        IsolationReply::new(&cx.handle.snapshot(), &p.pool.unwrap_or_default())
    }
}

impl Handler for m::GetClasses {
    async fn handle(cx: &Ctx<'_>, p: params::GetClasses) -> Result<views::Classes, ApiError> {
        ClassesReply::new(&cx.handle.snapshot(), &p.pool.unwrap_or_default())
    }
}

impl Handler for m::Assign {
    async fn handle(cx: &Ctx<'_>, p: params::Assign) -> Result<views::AssignmentReply, ApiError> {
        let mut spec = args::assign_spec(p.pool, &p.target, p.cpus, p.millicpus, p.id.as_deref())?;
        spec.reclaim = p.reclaim.unwrap_or(true);
        Ok(assignment(&cx.handle.assign(spec).await.map_err(engine)?.into_inner()))
    }
}

impl Handler for m::Run {
    async fn handle(cx: &Ctx<'_>, p: params::Run) -> Result<views::AssignmentReply, ApiError> {
        let spec = args::run_spec(p.pool, p.pid, p.cpus, p.millicpus, p.id.as_deref())?;
        if let Target::Pid(pid) = spec.target {
            (cx.may_hand_over)(pid)?;
        }
        Ok(assignment(&cx.handle.run(spec).await.map_err(engine)?.into_inner()))
    }
}

impl Handler for m::Release {
    async fn handle(cx: &Ctx<'_>, p: params::Release) -> Result<views::AssignmentReply, ApiError> {
        Ok(assignment(&cx.handle.release(&p.id).await.map_err(engine)?))
    }
}

/// Applies a pool edit; the pool as it is now (none when a later edit removed it already).
async fn edit(cx: &Ctx<'_>, edit: crate::core::edit::PoolEdit) -> Result<views::PoolReply, ApiError> {
    let pool = cx.handle.edit_pool(edit).await.map_err(engine)?;
    let snap = cx.handle.snapshot();
    Ok(views::PoolReply { pool: pool.map(|p| PoolView::new(&snap, &p)) })
}

impl Handler for m::CreatePool {
    async fn handle(cx: &Ctx<'_>, p: params::CreatePool) -> Result<views::PoolReply, ApiError> {
        edit(cx, args::create_pool(&p)?).await
    }
}

impl Handler for m::ResizePool {
    async fn handle(cx: &Ctx<'_>, p: params::ResizePool) -> Result<views::PoolReply, ApiError> {
        edit(cx, args::resize_pool(&p)?).await
    }
}

impl Handler for m::DeletePool {
    async fn handle(cx: &Ctx<'_>, p: params::DeletePool) -> Result<views::Nothing, ApiError> {
        edit(cx, args::delete_pool(&p.name)?).await.map(|_| views::Nothing {})
    }
}

impl Handler for m::Reload {
    async fn handle(cx: &Ctx<'_>, _: params::NoParameters) -> Result<views::Reloaded, ApiError> {
        let r = reload(cx.handle).await.map_err(engine)?;
        Ok(views::Reloaded { changed: r.any(), summary: r.summary() })
    }
}

/// Reads the configuration files again and applies them: SIGHUP, and `Reload` over varlink and
/// D-Bus. Tells systemd (`RELOADING=1`, then `READY=1` with the new `STATUS=`) and logs the
/// outcome: every key that changed, and each key of the administrator's files a later file
/// overrides, naming both files.
pub async fn reload(handle: &Handle) -> Result<crate::engine::Reloaded, EngineError> {
    use sd_notify::NotifyState;
    let notify = |states: &[NotifyState<'_>]| {
        if let Err(e) = sd_notify::notify(false, states) {
            log::warn!("sd_notify failed: {e}");
        }
    };
    // systemd 253+ (Type=notify-reload) wants the time with RELOADING=1; older ones ignore it.
    match NotifyState::monotonic_usec_now() {
        Ok(now) => notify(&[NotifyState::Reloading, now]),
        Err(_) => notify(&[NotifyState::Reloading]),
    }
    let result = handle.reload_from_disk().await;
    match &result {
        Ok(r) if r.any() => {
            log::info!("configuration reloaded: {}; {}", r.summary(), handle.snapshot().summary())
        }
        Ok(r) => log::info!("configuration reloaded: {}", r.summary()),
        Err(e) => log::error!("reload: {}", crate::error_chain(e)),
    }
    notify(&[NotifyState::Ready, NotifyState::Status(&handle.snapshot().summary())]);
    result
}
