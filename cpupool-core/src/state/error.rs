//! Why a state operation was refused.

/// Errors of state operations. The API maps each variant to its own D-Bus / varlink error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No such pool.
    #[error("pool `{pool}` does not exist")]
    NoSuchPool {
        /// The name asked for.
        pool: String,
    },
    /// A pool of that name exists already.
    #[error("pool `{pool}` already exists")]
    PoolExists {
        /// The name.
        pool: String,
    },
    /// The pool still has assignments.
    #[error("pool `{pool}` has {}; release them first", counted(*assignments as u64, "assignment"))]
    PoolInUse {
        /// The pool.
        pool: String,
        /// How many.
        assignments: usize,
    },
    /// No such assignment.
    #[error("assignment `{id}` does not exist")]
    NoSuchAssignment {
        /// The id asked for.
        id: String,
    },
    /// The pool has not enough free capacity.
    #[error("pool `{pool}` has {free} {unit} free, {requested} requested")]
    InsufficientCapacity {
        /// The pool.
        pool: String,
        /// Amount asked for.
        requested: u64,
        /// Amount free.
        free: u64,
        /// `cpus` or `millicpus`.
        unit: &'static str,
    },
    /// The id is taken by an assignment with another spec.
    #[error("assignment `{id}` already exists with a different pool, target or size")]
    DuplicateId {
        /// The id.
        id: String,
    },
    /// The target already holds an assignment (a target has one cpuset).
    #[error("target `{target}` already holds assignment `{id}` from pool `{pool}`; release it first")]
    TargetBusy {
        /// The target.
        target: String,
        /// Its assignment.
        id: String,
        /// The pool.
        pool: String,
    },
    /// An argument is malformed or not allowed here.
    #[error("invalid {arg}: {reason}")]
    InvalidArgument {
        /// The argument's name.
        arg: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The target is one the pools depend on (a host slice, cpupoold's own slices, their
    /// ancestors) or overlaps another assignment's target: confining it would defeat the pools.
    #[error("target `{target}` cannot be assigned: {reason}")]
    TargetNotAllowed {
        /// The target.
        target: String,
        /// Why, and what to do instead.
        reason: String,
    },
    /// The kernel would not give the target the assigned CPUs: it sits in a cgroup whose
    /// effective CPUs lack them (outside the pool's slice, or below a parent confined
    /// elsewhere). Nothing stays booked.
    #[error(
        "target `{target}` cannot run on CPUs {cpus}: it sits in `{parent}`, whose effective CPUs are {}; {hint}",
        if parent_cpus.is_empty() { "none" } else { parent_cpus.as_str() }
    )]
    TargetOutsidePool {
        /// The target.
        target: String,
        /// The CPUs it would get.
        cpus: String,
        /// The cgroup (or slice) it sits in.
        parent: String,
        /// That cgroup's effective CPUs, as the kernel reports them.
        parent_cpus: String,
        /// What to do instead.
        hint: String,
    },
    /// The reserved pool is not handed out.
    #[error("pool `{pool}` is the reserved pool; it is not assigned from")]
    ReservedPool {
        /// The pool.
        pool: String,
    },
    /// A full-cores pool cannot give exactly the number asked for.
    #[error("pool `{pool}` hands out whole cores: {} is not a whole number of free cores", counted(*requested, "CPU"))]
    NotWholeCores {
        /// The pool.
        pool: String,
        /// CPUs asked for.
        requested: u64,
    },
}

impl Error {
    /// The error as both management interfaces send it: each variant its own kind, with the
    /// IDL's parameters. Here, below every adapter, so that varlink, D-Bus and the kubelet's
    /// device plugin name a refusal alike.
    pub fn to_api(&self) -> cpupool_wire::ApiError {
        use cpupool_wire::{ApiError, ErrorKind};
        use serde_json::json;
        let (kind, params) = match self {
            Error::NoSuchPool { pool } => (ErrorKind::NoSuchPool, json!({ "pool": pool })),
            Error::PoolExists { pool } => (ErrorKind::PoolExists, json!({ "pool": pool })),
            Error::PoolInUse { pool, assignments } => {
                (ErrorKind::PoolInUse, json!({ "pool": pool, "assignments": assignments }))
            }
            Error::NoSuchAssignment { id } => (ErrorKind::NoSuchAssignment, json!({ "id": id })),
            Error::InsufficientCapacity { pool, requested, free, unit } => (
                ErrorKind::InsufficientCapacity,
                json!({ "pool": pool, "requested": requested, "free": free, "unit": unit }),
            ),
            Error::DuplicateId { id } => (ErrorKind::DuplicateId, json!({ "id": id })),
            Error::TargetBusy { target, id, pool } => {
                (ErrorKind::TargetBusy, json!({ "target": target, "id": id, "pool": pool }))
            }
            Error::TargetNotAllowed { target, reason } => {
                (ErrorKind::TargetNotAllowed, json!({ "target": target, "reason": reason }))
            }
            Error::TargetOutsidePool { target, cpus, parent, parent_cpus, hint } => (
                ErrorKind::TargetOutsidePool,
                json!({ "target": target, "cpus": cpus, "parent": parent, "parent_cpus": parent_cpus, "hint": hint }),
            ),
            Error::InvalidArgument { arg, reason } => return ApiError::invalid_argument(arg, reason),
            Error::ReservedPool { pool } => (ErrorKind::ReservedPool, json!({ "pool": pool })),
            Error::NotWholeCores { pool, requested } => {
                (ErrorKind::NotWholeCores, json!({ "pool": pool, "requested": requested }))
            }
        };
        ApiError::new(kind, params, self.to_string())
    }
}

/// One value of every [`Error`] variant: the API tests check that each maps to its own
/// documented error, so a new variant goes here once.
#[cfg(any(test, feature = "testing"))]
pub fn every_error() -> Vec<Error> {
    vec![
        Error::NoSuchPool { pool: "p".into() },
        Error::NoSuchAssignment { id: "a".into() },
        Error::InsufficientCapacity { pool: "p".into(), requested: 3, free: 2, unit: "cpus" },
        Error::DuplicateId { id: "a".into() },
        Error::TargetBusy { target: "pid:1".into(), id: "a".into(), pool: "p".into() },
        Error::TargetNotAllowed { target: "unit:system.slice".into(), reason: "r".into() },
        Error::TargetOutsidePool {
            target: "cgroup:w/a".into(),
            cpus: "2".into(),
            parent: "w".into(),
            parent_cpus: "0-1".into(),
            hint: "h".into(),
        },
        Error::InvalidArgument { arg: "cpus", reason: "r".into() },
        Error::ReservedPool { pool: "p".into() },
        Error::NotWholeCores { pool: "p".into(), requested: 3 },
        Error::PoolExists { pool: "p".into() },
        Error::PoolInUse { pool: "p".into(), assignments: 1 },
    ]
}

/// `1 CPU`, `2 CPUs`: a count with its noun, for messages people read.
pub fn counted(n: u64, one: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {one}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_as_people_write_them() {
        let one = Error::NotWholeCores { pool: "dp".into(), requested: 1 };
        assert_eq!(
            one.to_string(),
            "pool `dp` hands out whole cores: 1 CPU is not a whole number of free cores"
        );
        let busy = Error::PoolInUse { pool: "dp".into(), assignments: 3 };
        assert_eq!(busy.to_string(), "pool `dp` has 3 assignments; release them first");
        assert_eq!(counted(1, "assignment"), "1 assignment");
        assert_eq!(counted(0, "pool"), "0 pools");
    }
}
