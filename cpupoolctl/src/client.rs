//! The operations of the manager, behind one trait that both transports implement.
//!
//! The command layer (`commands`) calls a `dyn Manager` and never knows which transport is
//! underneath: [`crate::varlink::Client`] (implemented here, from the JSON replies) or
//! [`crate::dbus::Client`]. Both return the [`cpupool_wire::views`] types and [`Error`], so output and
//! exit codes do not depend on the transport.

use serde::de::DeserializeOwned;
use serde_json::Value;

use cpupool_wire::methods::{self as m, Method};
use cpupool_wire::varlink::params;
use cpupool_wire::views::{self, Assignment, ClassSetting, Event, Isolation, Pool, Status, Topology};

use crate::error::Error;
use crate::varlink;

/// What cpupoold offers.
pub trait Manager {
    /// Every pool.
    fn list_pools(&mut self) -> Result<Vec<Pool>, Error>;
    /// One pool.
    fn get_pool(&mut self, name: &str) -> Result<Pool, Error>;
    /// The host's CPUs.
    fn topology(&mut self) -> Result<Topology, Error>;
    /// Every assignment, or those of one pool.
    fn list_assignments(&mut self, pool: Option<&str>) -> Result<Vec<Assignment>, Error>;
    /// The daemon in brief.
    fn status(&mut self) -> Result<Status, Error>;
    /// Isolation health of one pool, or of every isolated pool (`""`).
    fn isolation(&mut self, pool: &str) -> Result<Isolation, Error>;
    /// The power and cache settings of one pool, or of every pool (`""`).
    fn classes(&mut self, pool: &str) -> Result<Vec<ClassSetting>, Error>;
    /// Assigns CPUs to a target.
    fn assign(&mut self, req: &AssignRequest) -> Result<Assignment, Error>;
    /// Releases an assignment, returning what it held.
    fn release(&mut self, id: &str) -> Result<Assignment, Error>;
    /// Assigns CPUs to a process of the caller's and confines it.
    fn run(&mut self, req: &RunRequest) -> Result<Assignment, Error>;
    /// Adds a pool.
    fn create_pool(&mut self, req: &CreatePoolRequest) -> Result<Pool, Error>;
    /// Gives a pool a new CPU source.
    fn resize_pool(&mut self, name: &str, source: &CpuSource) -> Result<Pool, Error>;
    /// Removes a pool without assignments.
    fn delete_pool(&mut self, name: &str) -> Result<(), Error>;
    /// Has the daemon read its configuration files again and apply them; whether anything
    /// changed. A rejected configuration is an error with the reason.
    fn reload(&mut self) -> Result<bool, Error>;
    /// Hands every change to `each`, starting with a replay of the pools (change `current`),
    /// until the daemon goes away or `each` fails.
    fn monitor(&mut self, each: &mut dyn FnMut(Event) -> Result<(), Error>) -> Result<(), Error>;
}

/// How much an assignment asks for: exactly one of whole CPUs and millicpus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    /// Whole CPUs (exclusive pools).
    Cpus(u32),
    /// Millicpus (shared pools).
    Millicpus(u64),
}

/// The arguments of `Assign`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignRequest {
    /// The pool to assign from.
    pub pool: String,
    /// `unit:NAME`, `cgroup:PATH` or `pid:N`.
    pub target: String,
    /// The size.
    pub amount: Amount,
    /// The id to use; the daemon chooses one when `None`.
    pub id: Option<String>,
    /// Release it when the target goes away (the daemon's default).
    pub reclaim: bool,
}

/// The arguments of `Run`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRequest {
    /// The pool to assign from.
    pub pool: String,
    /// The process (the caller's own).
    pub pid: u32,
    /// The size.
    pub amount: Amount,
    /// The id to use; the daemon chooses one when `None`.
    pub id: Option<String>,
}

/// Where a pool's CPUs come from: an explicit list, or a count (optionally from one NUMA node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuSource {
    /// A kernel CPU list, e.g. `8-15`.
    List(String),
    /// A number of CPUs, packed by the daemon.
    Count {
        /// How many CPUs.
        count: u32,
        /// Take them all from this NUMA node.
        numa: Option<u32>,
    },
}

/// The arguments of `CreatePool`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatePoolRequest {
    /// The new pool's name.
    pub name: String,
    /// `reserved`, `exclusive` or `shared`.
    pub kind: String,
    /// Its CPUs.
    pub source: CpuSource,
    /// `full-cores` or `threads`; the daemon's default when `None`.
    pub smt: Option<String>,
    /// Run as an isolated cpuset partition; the daemon's default when `None`.
    pub isolate: Option<bool>,
    /// Offer the pool to the kubelet; the daemon's default when `None`.
    pub kubelet: Option<bool>,
}

/// A CPU source as `CreatePool` and `ResizePool` take it: `(cpus, count, numa)`.
fn source_params(source: &CpuSource) -> (Option<String>, Option<i64>, Option<i64>) {
    match source {
        CpuSource::List(cpus) => (Some(cpus.clone()), None, None),
        CpuSource::Count { count, numa } => (None, Some(i64::from(*count)), numa.map(i64::from)),
    }
}

/// The size as `Assign` and `Run` take it: `(cpus, millicpus)`.
fn amount_params(amount: Amount) -> (Option<i64>, Option<i64>) {
    match amount {
        Amount::Cpus(n) => (Some(i64::from(n)), None),
        // Beyond any pool's capacity either way; the daemon names the argument.
        Amount::Millicpus(m) => (None, Some(i64::try_from(m).unwrap_or(i64::MAX))),
    }
}

fn to_value(p: &impl serde::Serialize) -> Value {
    // Structs of strings, numbers and options always serialize.
    serde_json::to_value(p).unwrap_or_default()
}

/// `Assign`'s parameters.
pub fn assign_params(req: &AssignRequest) -> params::Assign {
    let (cpus, millicpus) = amount_params(req.amount);
    params::Assign {
        pool: req.pool.clone(),
        target: req.target.clone(),
        cpus,
        millicpus,
        id: req.id.clone(),
        // The daemon's default is true: sent only when it differs.
        reclaim: (!req.reclaim).then_some(false),
    }
}

/// `Run`'s parameters.
pub fn run_params(req: &RunRequest) -> params::Run {
    let (cpus, millicpus) = amount_params(req.amount);
    params::Run { pool: req.pool.clone(), pid: i64::from(req.pid), cpus, millicpus, id: req.id.clone() }
}

/// `CreatePool`'s parameters.
pub fn create_params(req: &CreatePoolRequest) -> params::CreatePool {
    let (cpus, count, numa) = source_params(&req.source);
    params::CreatePool {
        name: req.name.clone(),
        kind: req.kind.clone(),
        cpus,
        count,
        numa,
        smt: req.smt.clone(),
        isolate: req.isolate,
        kubelet: req.kubelet,
    }
}

/// `ResizePool`'s parameters.
pub fn resize_params(name: &str, source: &CpuSource) -> params::ResizePool {
    let (cpus, count, numa) = source_params(source);
    params::ResizePool { name: name.to_owned(), cpus, count, numa }
}

impl varlink::Client {
    fn decode<T: DeserializeOwned>(&self, value: Value, what: &str) -> Result<T, Error> {
        serde_json::from_value(value).map_err(|e| Error::Protocol {
            address: self.address().to_string(),
            reason: format!("{what}: {e}"),
        })
    }

    /// Calls the table's method `M` with `params` (absent optionals left out) and decodes its
    /// reply.
    fn call_method<M: Method>(&mut self, params: &M::Params) -> Result<M::Reply, Error> {
        let reply = self.call(M::NAME, to_value(params))?;
        self.decode(Value::Object(reply), &format!("{} reply", M::NAME))
    }

    /// The pool of a reply that must have one.
    fn pool_of(&self, reply: views::PoolReply, method: &str) -> Result<Pool, Error> {
        reply.pool.ok_or_else(|| Error::Protocol {
            address: self.address().to_string(),
            reason: format!("{method} reply: no pool"),
        })
    }
}

impl Manager for varlink::Client {
    fn list_pools(&mut self) -> Result<Vec<Pool>, Error> {
        Ok(self.call_method::<m::ListPools>(&params::NoParameters {})?.pools)
    }

    fn get_pool(&mut self, name: &str) -> Result<Pool, Error> {
        let reply = self.call_method::<m::GetPool>(&params::GetPool { name: name.to_owned() })?;
        self.pool_of(reply, m::GetPool::NAME)
    }

    fn topology(&mut self) -> Result<Topology, Error> {
        self.call_method::<m::GetTopology>(&params::NoParameters {})
    }

    fn list_assignments(&mut self, pool: Option<&str>) -> Result<Vec<Assignment>, Error> {
        let params = params::ListAssignments { pool: pool.map(str::to_owned) };
        Ok(self.call_method::<m::ListAssignments>(&params)?.assignments)
    }

    fn status(&mut self) -> Result<Status, Error> {
        self.call_method::<m::Status>(&params::NoParameters {})
    }

    fn isolation(&mut self, pool: &str) -> Result<Isolation, Error> {
        self.call_method::<m::GetIsolation>(&params::GetIsolation { pool: Some(pool.to_owned()) })
    }

    fn classes(&mut self, pool: &str) -> Result<Vec<ClassSetting>, Error> {
        Ok(self.call_method::<m::GetClasses>(&params::GetClasses { pool: Some(pool.to_owned()) })?.classes)
    }

    fn assign(&mut self, req: &AssignRequest) -> Result<Assignment, Error> {
        Ok(self.call_method::<m::Assign>(&assign_params(req))?.assignment)
    }

    fn run(&mut self, req: &RunRequest) -> Result<Assignment, Error> {
        Ok(self.call_method::<m::Run>(&run_params(req))?.assignment)
    }

    fn release(&mut self, id: &str) -> Result<Assignment, Error> {
        Ok(self.call_method::<m::Release>(&params::Release { id: id.to_owned() })?.assignment)
    }

    fn create_pool(&mut self, req: &CreatePoolRequest) -> Result<Pool, Error> {
        let reply = self.call_method::<m::CreatePool>(&create_params(req))?;
        self.pool_of(reply, m::CreatePool::NAME)
    }

    fn resize_pool(&mut self, name: &str, source: &CpuSource) -> Result<Pool, Error> {
        let reply = self.call_method::<m::ResizePool>(&resize_params(name, source))?;
        self.pool_of(reply, m::ResizePool::NAME)
    }

    fn delete_pool(&mut self, name: &str) -> Result<(), Error> {
        self.call_method::<m::DeletePool>(&params::DeletePool { name: name.to_owned() }).map(|_| ())
    }

    fn reload(&mut self) -> Result<bool, Error> {
        Ok(self.call_method::<m::Reload>(&params::NoParameters {})?.changed)
    }

    fn monitor(&mut self, each: &mut dyn FnMut(Event) -> Result<(), Error>) -> Result<(), Error> {
        let address = self.address().to_string();
        let ended = self.call_more(m::Monitor::NAME, to_value(&params::NoParameters {}), &mut |reply| {
            let reply: views::EventReply = serde_json::from_value(Value::Object(reply)).map_err(|e| {
                Error::Protocol { address: address.clone(), reason: format!("Monitor event: {e}") }
            })?;
            each(reply.event)
        });
        ended
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn varlink_parameters_leave_absent_optionals_out() {
        let req = AssignRequest {
            pool: "dp".into(),
            target: "cgroup:a/b".into(),
            amount: Amount::Cpus(2),
            id: None,
            reclaim: true,
        };
        assert_eq!(to_value(&assign_params(&req)), json!({"pool": "dp", "target": "cgroup:a/b", "cpus": 2}));
        let req = AssignRequest { amount: Amount::Millicpus(1500), id: Some("x".into()), ..req };
        assert_eq!(
            to_value(&assign_params(&req)),
            json!({"pool": "dp", "target": "cgroup:a/b", "millicpus": 1500, "id": "x"})
        );
        let create = CreatePoolRequest {
            name: "batch".into(),
            kind: "shared".into(),
            source: CpuSource::List("4-5".into()),
            smt: None,
            isolate: None,
            kubelet: Some(false),
        };
        assert_eq!(
            to_value(&create_params(&create)),
            json!({"name": "batch", "kind": "shared", "cpus": "4-5", "kubelet": false})
        );
        assert_eq!(
            to_value(&resize_params("dp", &CpuSource::Count { count: 4, numa: None })),
            json!({"name": "dp", "count": 4})
        );
        assert_eq!(
            to_value(&resize_params("dp", &CpuSource::Count { count: 4, numa: Some(0) })),
            json!({"name": "dp", "count": 4, "numa": 0})
        );
    }
}
