//! One client over either transport, calling the table's methods by type.
//!
//! The command layer (`commands`) calls [`Client::call`] with a method of the table
//! ([`cpupool_wire::methods`]) and its parameter struct, and gets the method's reply view;
//! it never knows which transport is underneath: [`crate::varlink::Client`] sends the
//! parameters as JSON and decodes the reply (here), [`crate::dbus::Client`] puts them into the
//! arguments the introspection XML names and reads the reply's back. Both return the
//! [`cpupool_wire::views`] types and [`Error`], so output and exit codes do not depend on the
//! transport, and a new method needs no client code. The request types below are the
//! commands' arguments, turned into the table's parameter structs.

use serde::de::DeserializeOwned;
use serde_json::Value;

use cpupool_wire::methods::{self as m, Method};
use cpupool_wire::varlink::params;
use cpupool_wire::views::{self, Event, Pool};

use crate::error::Error;
use crate::{dbus, varlink};

/// A connection to cpupoold.
pub enum Client {
    /// Over varlink.
    Varlink(varlink::Client),
    /// Over D-Bus.
    Dbus(dbus::Client),
}

impl Client {
    /// Calls the table's method `M` with `params` and returns its reply.
    pub fn call<M: Method>(&mut self, params: &M::Params) -> Result<M::Reply, Error> {
        match self {
            Client::Varlink(c) => c.call_method::<M>(params),
            Client::Dbus(c) => c.call_method::<M>(params),
        }
    }

    /// Calls `M`, whose reply must carry a pool (`GetPool`, `CreatePool`, `ResizePool`).
    pub fn pool<M: Method<Reply = views::PoolReply>>(&mut self, params: &M::Params) -> Result<Pool, Error> {
        self.call::<M>(params)?.pool.ok_or_else(|| Error::Protocol {
            address: self.address(),
            reason: format!("{} reply: no pool", M::NAME),
        })
    }

    /// Hands every change to `each`, starting with a replay of the pools (change `current`),
    /// until the daemon goes away or `each` fails.
    pub fn monitor(&mut self, each: &mut dyn FnMut(Event) -> Result<(), Error>) -> Result<(), Error> {
        match self {
            Client::Varlink(c) => c.monitor(each),
            Client::Dbus(c) => c.monitor(each),
        }
    }

    /// Where the daemon was reached, for messages.
    fn address(&self) -> String {
        match self {
            Client::Varlink(c) => c.address().to_string(),
            Client::Dbus(c) => c.bus().to_string(),
        }
    }

    /// `ListAssignments`: every assignment, or those of `pool` (for `assignment list`, `run`'s
    /// wait and `top`).
    pub fn assignments(&mut self, pool: Option<&str>) -> Result<Vec<views::Assignment>, Error> {
        Ok(self
            .call::<m::ListAssignments>(&params::ListAssignments { pool: pool.map(str::to_owned) })?
            .assignments)
    }

    /// `GetIsolation` of `pool`, or of every isolated pool (`""`).
    pub fn isolation(&mut self, pool: &str) -> Result<views::Isolation, Error> {
        self.call::<m::GetIsolation>(&params::GetIsolation { pool: Some(pool.to_owned()) })
    }
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
    /// Serve it by DRA; the daemon's default (no) when `None`.
    pub dra: Option<bool>,
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
        dra: req.dra,
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
    pub fn call_method<M: Method>(&mut self, params: &M::Params) -> Result<M::Reply, Error> {
        let reply = self.call(M::NAME, to_value(params))?;
        self.decode(Value::Object(reply), &format!("{} reply", M::NAME))
    }

    /// See [`Client::monitor`].
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
            dra: None,
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
