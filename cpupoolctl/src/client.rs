//! The operations of the manager, behind one trait that both transports implement.
//!
//! The command layer (`commands`) calls a `dyn Manager` and never knows which transport is
//! underneath: [`crate::varlink::Client`] (implemented here, from the JSON replies) or
//! [`crate::dbus::Client`]. Both return the [`crate::wire`] types and [`Error`], so output and
//! exit codes do not depend on the transport.

use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};

use crate::error::Error;
use crate::varlink;
use crate::wire::{
    Amount, AssignRequest, Assignment, CpuSource, CreatePoolRequest, Event, Pool, RunRequest, Status,
    Topology,
};

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
    fn isolation(&mut self, pool: &str) -> Result<crate::wire::Isolation, Error>;
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

/// The varlink parameters of a CPU source.
fn source_params(source: &CpuSource, params: &mut Map<String, Value>) {
    match source {
        CpuSource::List(cpus) => {
            params.insert("cpus".into(), json!(cpus));
        }
        CpuSource::Count { count, numa } => {
            params.insert("count".into(), json!(count));
            if let Some(n) = numa {
                params.insert("numa".into(), json!(n));
            }
        }
    }
}

/// The size and the optional id, as `Assign` and `Run` take them.
fn amount_params(amount: Amount, id: Option<&String>, p: &mut Map<String, Value>) {
    match amount {
        Amount::Cpus(n) => p.insert("cpus".into(), json!(n)),
        Amount::Millicpus(m) => p.insert("millicpus".into(), json!(m)),
    };
    if let Some(id) = id {
        p.insert("id".into(), json!(id));
    }
}

/// `Assign`'s parameters; absent optionals are left out.
pub fn assign_params(req: &AssignRequest) -> Value {
    let mut p = Map::new();
    p.insert("pool".into(), json!(req.pool));
    p.insert("target".into(), json!(req.target));
    amount_params(req.amount, req.id.as_ref(), &mut p);
    if !req.reclaim {
        p.insert("reclaim".into(), json!(false));
    }
    Value::Object(p)
}

/// `Run`'s parameters; absent optionals are left out.
pub fn run_params(req: &RunRequest) -> Value {
    let mut p = Map::new();
    p.insert("pool".into(), json!(req.pool));
    p.insert("pid".into(), json!(req.pid));
    amount_params(req.amount, req.id.as_ref(), &mut p);
    Value::Object(p)
}

/// `CreatePool`'s parameters; absent optionals are left out.
pub fn create_params(req: &CreatePoolRequest) -> Value {
    let mut p = Map::new();
    p.insert("name".into(), json!(req.name));
    p.insert("kind".into(), json!(req.kind));
    source_params(&req.source, &mut p);
    if let Some(smt) = &req.smt {
        p.insert("smt".into(), json!(smt));
    }
    if let Some(isolate) = req.isolate {
        p.insert("isolate".into(), json!(isolate));
    }
    if let Some(kubelet) = req.kubelet {
        p.insert("kubelet".into(), json!(kubelet));
    }
    Value::Object(p)
}

/// `ResizePool`'s parameters.
pub fn resize_params(name: &str, source: &CpuSource) -> Value {
    let mut p = Map::new();
    p.insert("name".into(), json!(name));
    source_params(source, &mut p);
    Value::Object(p)
}

impl varlink::Client {
    fn decode<T: DeserializeOwned>(&self, value: Value, what: &str) -> Result<T, Error> {
        serde_json::from_value(value).map_err(|e| Error::Protocol {
            address: self.address().to_string(),
            reason: format!("{what}: {e}"),
        })
    }

    /// Calls `method` and decodes the reply's field `key`.
    fn call_field<T: DeserializeOwned>(
        &mut self,
        method: &str,
        params: Value,
        key: &str,
    ) -> Result<T, Error> {
        let mut reply = self.call(method, params)?;
        let value = reply.remove(key).unwrap_or(Value::Null);
        self.decode(value, &format!("{method} reply field `{key}`"))
    }
}

impl Manager for varlink::Client {
    fn list_pools(&mut self) -> Result<Vec<Pool>, Error> {
        self.call_field("ListPools", json!({}), "pools")
    }

    fn get_pool(&mut self, name: &str) -> Result<Pool, Error> {
        self.call_field("GetPool", json!({ "name": name }), "pool")
    }

    fn topology(&mut self) -> Result<Topology, Error> {
        let reply = self.call("GetTopology", json!({}))?;
        self.decode(Value::Object(reply), "GetTopology reply")
    }

    fn list_assignments(&mut self, pool: Option<&str>) -> Result<Vec<Assignment>, Error> {
        let params = match pool {
            Some(p) => json!({ "pool": p }),
            None => json!({}),
        };
        self.call_field("ListAssignments", params, "assignments")
    }

    fn status(&mut self) -> Result<Status, Error> {
        let reply = self.call("Status", json!({}))?;
        self.decode(Value::Object(reply), "Status reply")
    }

    fn isolation(&mut self, pool: &str) -> Result<crate::wire::Isolation, Error> {
        let reply = self.call("GetIsolation", json!({ "pool": pool }))?;
        self.decode(Value::Object(reply), "GetIsolation reply")
    }

    fn assign(&mut self, req: &AssignRequest) -> Result<Assignment, Error> {
        self.call_field("Assign", assign_params(req), "assignment")
    }

    fn run(&mut self, req: &RunRequest) -> Result<Assignment, Error> {
        self.call_field("Run", run_params(req), "assignment")
    }

    fn release(&mut self, id: &str) -> Result<Assignment, Error> {
        self.call_field("Release", json!({ "id": id }), "assignment")
    }

    fn create_pool(&mut self, req: &CreatePoolRequest) -> Result<Pool, Error> {
        self.call_field("CreatePool", create_params(req), "pool")
    }

    fn resize_pool(&mut self, name: &str, source: &CpuSource) -> Result<Pool, Error> {
        self.call_field("ResizePool", resize_params(name, source), "pool")
    }

    fn delete_pool(&mut self, name: &str) -> Result<(), Error> {
        self.call("DeletePool", json!({ "name": name })).map(|_| ())
    }

    fn reload(&mut self) -> Result<bool, Error> {
        self.call_field("Reload", json!({}), "changed")
    }

    fn monitor(&mut self, each: &mut dyn FnMut(Event) -> Result<(), Error>) -> Result<(), Error> {
        let address = self.address().to_string();
        let ended = self.call_more("Monitor", json!({}), &mut |mut reply| {
            let value = reply.remove("event").unwrap_or(Value::Null);
            let event: Event = serde_json::from_value(value).map_err(|e| Error::Protocol {
                address: address.clone(),
                reason: format!("Monitor event: {e}"),
            })?;
            each(event)
        });
        ended
    }
}

#[cfg(test)]
mod tests {
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
        assert_eq!(assign_params(&req), json!({"pool": "dp", "target": "cgroup:a/b", "cpus": 2}));
        let req = AssignRequest { amount: Amount::Millicpus(1500), id: Some("x".into()), ..req };
        assert_eq!(
            assign_params(&req),
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
            create_params(&create),
            json!({"name": "batch", "kind": "shared", "cpus": "4-5", "kubelet": false})
        );
        assert_eq!(
            resize_params("dp", &CpuSource::Count { count: 4, numa: None }),
            json!({"name": "dp", "count": 4})
        );
        assert_eq!(
            resize_params("dp", &CpuSource::Count { count: 4, numa: Some(0) }),
            json!({"name": "dp", "count": 4, "numa": 0})
        );
    }
}
