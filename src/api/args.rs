//! The arguments of the mutating methods decoded into engine requests, the same for both
//! interfaces (D-Bus's arguments are first put into the varlink parameter structs): an
//! assignment's size and target, a pool's name, kind and CPU source. A bad argument is
//! `InvalidArgument` naming it.

use cpupool_wire::varlink::params;
use cpupool_wire::{ApiError, ErrorKind};
use serde_json::json;

use crate::api::error::access_denied;
use crate::core::cpuset::CpuSet;
use crate::core::edit::{PoolEdit, Source};
use crate::core::pool::{PoolKind, PoolName, Smt};
use crate::core::state::{AssignSpec, AssignmentId, Size, Target};

fn invalid_argument(argument: &str, reason: &str) -> ApiError {
    ApiError::invalid_argument(argument, reason)
}

/// Decodes `Assign`'s arguments. `cpus` and `millicpus`: exactly one is given.
pub fn assign_spec(
    pool: String,
    target: &str,
    cpus: Option<i64>,
    millicpus: Option<i64>,
    id: Option<&str>,
) -> Result<AssignSpec, ApiError> {
    let target = Target::parse(target).map_err(|e| e.to_api())?;
    let size = match (cpus, millicpus) {
        (Some(n), None) => Size::Cpus(
            u32::try_from(n).map_err(|_| invalid_argument("cpus", "must be between 0 and 4294967295"))?,
        ),
        (None, Some(m)) => Size::Millicpus(
            u64::try_from(m).map_err(|_| invalid_argument("millicpus", "must not be negative"))?,
        ),
        (Some(_), Some(_)) => {
            return Err(invalid_argument("cpus", "give either cpus or millicpus, not both"))
        }
        (None, None) => return Err(invalid_argument("cpus", "give cpus or millicpus")),
    };
    let id = id.map(|id| AssignmentId::new(id).map_err(|e| e.to_api())).transpose()?;
    Ok(AssignSpec::new(pool, target, size, id))
}

/// Decodes `Run`'s arguments: an assignment for process `pid`.
pub fn run_spec(
    pool: String,
    pid: i64,
    cpus: Option<i64>,
    millicpus: Option<i64>,
    id: Option<&str>,
) -> Result<AssignSpec, ApiError> {
    let pid = u32::try_from(pid)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| invalid_argument("pid", "must be a process id (1-4194304)"))?;
    assign_spec(pool, &format!("pid:{pid}"), cpus, millicpus, id).map_err(|e| match e.kind {
        ErrorKind::InvalidArgument if e.params.get("argument") == Some(&json!("target")) => {
            invalid_argument("pid", "must be a process id (1-4194304)")
        }
        _ => e,
    })
}

/// Decides whether the caller `uid` may hand process `pid` to the daemon: root may; anyone
/// else only their own processes. `owner` is the process's owner as procfs says
/// ([`crate::host::procfs::process_owner`]); `None` when there is no such process.
pub fn check_process_owner(owner: Option<u32>, pid: u32, uid: u32) -> Result<(), ApiError> {
    match owner {
        _ if uid == 0 => Ok(()),
        Some(o) if o == uid => Ok(()),
        Some(_) => Err(access_denied(uid)),
        None => Err(invalid_argument("pid", &format!("process {pid} does not exist"))),
    }
}

fn pool_name(name: &str) -> Result<PoolName, ApiError> {
    PoolName::new(name).map_err(|e| invalid_argument("name", &e.to_string()))
}

fn source(cpus: Option<&str>, count: Option<i64>, numa: Option<i64>) -> Result<Source, ApiError> {
    let u32_arg = |arg: &str, v: i64| {
        u32::try_from(v).map_err(|_| invalid_argument(arg, "must be between 0 and 4294967295"))
    };
    match (cpus, count) {
        (Some(list), None) => {
            if numa.is_some() {
                return Err(invalid_argument("numa", "only applies to count (a list names its CPUs)"));
            }
            let set = CpuSet::parse(list).map_err(|e| invalid_argument("cpus", &e.to_string()))?;
            if set.is_empty() {
                return Err(invalid_argument("cpus", "is empty"));
            }
            Ok(Source::Cpus(set))
        }
        (None, Some(n)) => {
            let count = u32_arg("count", n)?;
            if count == 0 {
                return Err(invalid_argument("count", "must be at least 1"));
            }
            Ok(Source::Count { count, numa: numa.map(|n| u32_arg("numa", n)).transpose()? })
        }
        (Some(_), Some(_)) => Err(invalid_argument("cpus", "give either cpus or count, not both")),
        (None, None) => Err(invalid_argument("cpus", "give cpus or count")),
    }
}

/// Decodes `CreatePool`'s arguments.
pub fn create_pool(o: &params::CreatePool) -> Result<PoolEdit, ApiError> {
    let name = pool_name(&o.name)?;
    let kind = match o.kind.as_str() {
        "reserved" => PoolKind::Reserved,
        "exclusive" => PoolKind::Exclusive,
        "shared" => PoolKind::Shared,
        other => {
            return Err(invalid_argument(
                "kind",
                &format!(
                    "`{}` is not one of reserved, exclusive, shared",
                    crate::core::echo(other).escape_debug()
                ),
            ))
        }
    };
    let smt = match o.smt.as_deref() {
        None => None,
        Some("full-cores") => Some(Smt::FullCores),
        Some("threads") => Some(Smt::Threads),
        Some(other) => {
            return Err(invalid_argument(
                "smt",
                &format!("`{}` is not one of full-cores, threads", crate::core::echo(other).escape_debug()),
            ))
        }
    };
    let source = source(o.cpus.as_deref(), o.count, o.numa)?;
    Ok(PoolEdit::Create { name, kind, source, smt, isolate: o.isolate, kubelet: o.kubelet, dra: o.dra })
}

/// Decodes `ResizePool`'s arguments (only the CPU source changes: its parameters have no
/// other keys).
pub fn resize_pool(o: &params::ResizePool) -> Result<PoolEdit, ApiError> {
    Ok(PoolEdit::Resize { name: pool_name(&o.name)?, source: source(o.cpus.as_deref(), o.count, o.numa)? })
}

/// Decodes `DeletePool`'s argument.
pub fn delete_pool(name: &str) -> Result<PoolEdit, ApiError> {
    Ok(PoolEdit::Delete { name: pool_name(name)? })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn pool_arguments_name_the_argument() {
        let o = |name: &str, kind: &str, cpus: Option<&'static str>, count: Option<i64>| params::CreatePool {
            name: name.into(),
            kind: kind.into(),
            cpus: cpus.map(Into::into),
            count,
            ..Default::default()
        };
        let arg =
            |r: Result<PoolEdit, ApiError>| r.unwrap_err().params["argument"].as_str().unwrap().to_owned();
        assert_eq!(arg(create_pool(&o("Web", "shared", Some("1"), None))), "name");
        assert_eq!(arg(create_pool(&o("web", "sharde", Some("1"), None))), "kind");
        assert_eq!(arg(create_pool(&o("web", "shared", Some("1-"), None))), "cpus");
        assert_eq!(arg(create_pool(&o("web", "shared", Some("1"), Some(2)))), "cpus");
        assert_eq!(arg(create_pool(&o("web", "shared", None, None))), "cpus");
        assert_eq!(arg(create_pool(&o("web", "shared", None, Some(0)))), "count");
        assert_eq!(arg(create_pool(&o("web", "shared", None, Some(-1)))), "count");
        let bad_smt = params::CreatePool { smt: Some("half".into()), ..o("web", "shared", None, Some(1)) };
        assert_eq!(arg(create_pool(&bad_smt)), "smt");
        let numa_with_list = params::ResizePool {
            name: "web".into(),
            cpus: Some("1".into()),
            numa: Some(0),
            ..Default::default()
        };
        assert_eq!(arg(resize_pool(&numa_with_list)), "numa");
        assert!(create_pool(&o("web", "shared", None, Some(2))).is_ok());
    }

    #[test]
    fn assign_arguments_name_the_argument() {
        let arg =
            |r: Result<AssignSpec, ApiError>| r.unwrap_err().params["argument"].as_str().unwrap().to_owned();
        assert_eq!(arg(assign_spec("p".into(), "pid:1", None, None, None)), "cpus");
        assert_eq!(arg(assign_spec("p".into(), "pid:1", Some(1), Some(1), None)), "cpus");
        assert_eq!(arg(assign_spec("p".into(), "pid:1", Some(-1), None, None)), "cpus");
        assert_eq!(arg(assign_spec("p".into(), "pid:1", None, Some(-5), None)), "millicpus");
        assert_eq!(
            assign_spec("p".into(), "cgroup:../../etc", Some(1), None, None).unwrap_err().kind,
            "InvalidArgument"
        );
    }
}
