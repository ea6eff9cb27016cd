//! One client-side error for both transports, and what it means for the user.
//!
//! The varlink client turns `{"error": "org.cpupool.Manager.NoSuchPool", "parameters": {..}}`
//! into [`Error::Daemon`] with kind `NoSuchPool`; the D-Bus client turns
//! `org.cpupool.Manager1.Error.NoSuchPool` (whose message is its only detail) into the same
//! kind. The command layer then fills the parameters the D-Bus reply could not carry from the
//! request ([`DaemonError::with_request`]), so the message, the `--json` error document and
//! the exit code are the same whichever transport answered.
//!
//! Exit codes: [`EXIT_DAEMON`] for anything the daemon refused or failed (and for local
//! failures such as a broken reply), [`EXIT_UNREACHABLE`] when no daemon answered; clap
//! exits with 2 on usage errors itself.

use cpupool_wire::ErrorKind;
use serde_json::{json, Map, Value};

/// The daemon answered with an error, or something else failed after arguments were parsed.
pub const EXIT_DAEMON: u8 = 1;

/// Where the messages send a reader for the daemon's log.
pub const JOURNAL: &str = "`journalctl -u cpupoold`";

/// `line` as said to the user of a sandbox daemon, which logs to the terminal it runs in rather
/// than to the journal.
pub fn for_sandbox(line: &str) -> String {
    line.replace(JOURNAL, "the sandbox daemon's output, in its terminal")
}
/// No daemon answered at the address tried.
pub const EXIT_UNREACHABLE: u8 = 3;

/// A typed error answered by the daemon.
#[derive(Debug, Clone, PartialEq)]
pub struct DaemonError {
    /// The kind, e.g. `NoSuchPool` (the name without the interface prefix), or the whole
    /// name for errors outside our interfaces (`org.varlink.service.MethodNotFound`).
    pub kind: String,
    /// The error's parameters (varlink), or those filled from the request (D-Bus).
    pub parameters: Map<String, Value>,
    /// The daemon's own message (D-Bus carries one, varlink does not).
    pub detail: Option<String>,
}

/// Everything a command can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The daemon answered with an error.
    #[error("{}", .0.message())]
    Daemon(DaemonError),
    /// Nothing answered at `address`.
    #[error("cannot reach cpupoold at {address}: {reason}; {hint}")]
    Unreachable {
        /// The address tried, as the user would write it.
        address: String,
        /// What went wrong, e.g. "no socket there".
        reason: String,
        /// What to do about it.
        hint: String,
    },
    /// The peer answered something that is not the protocol.
    #[error("unexpected reply from {address}: {reason}")]
    Protocol {
        /// The address.
        address: String,
        /// What was wrong with the reply.
        reason: String,
    },
    /// A local failure, e.g. writing a man page.
    #[error("{what}: {source}")]
    Local {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Unreachable { .. } => EXIT_UNREACHABLE,
            Error::Daemon(_) | Error::Protocol { .. } | Error::Local { .. } => EXIT_DAEMON,
        }
    }

    /// The name printed before the message and in the JSON document's `error`.
    pub fn name(&self) -> &str {
        match self {
            Error::Daemon(e) => &e.kind,
            Error::Unreachable { .. } => "Unreachable",
            Error::Protocol { .. } => "ProtocolError",
            Error::Local { .. } => "LocalError",
        }
    }

    /// The `--json` error document: `{"error": name, "parameters": {..}, "message": ..}`.
    pub fn to_json(&self) -> Value {
        let parameters = match self {
            Error::Daemon(e) => Value::Object(e.parameters.clone()),
            Error::Unreachable { address, reason, .. } => json!({ "address": address, "reason": reason }),
            Error::Protocol { address, reason } => json!({ "address": address, "reason": reason }),
            Error::Local { what, source } => json!({ "what": what, "reason": source.to_string() }),
        };
        json!({ "error": self.name(), "parameters": parameters, "message": self.to_string() })
    }

    /// The line printed on stderr without `--json`.
    pub fn human(&self) -> String {
        match self {
            Error::Daemon(e) => format!("error {}: {}", e.kind, e.message()),
            other => format!("error: {other}"),
        }
    }

    /// Fills parameters the daemon's reply did not carry from the request (see
    /// [`DaemonError::with_request`]); other errors pass through.
    pub fn with_request(self, request: &[(&str, Value)]) -> Error {
        match self {
            Error::Daemon(e) => Error::Daemon(e.with_request(request)),
            other => other,
        }
    }
}

impl DaemonError {
    /// An error from its wire name: the interface prefix (varlink or D-Bus) is dropped.
    pub fn from_name(name: &str, parameters: Map<String, Value>, detail: Option<String>) -> DaemonError {
        // A name that is not ours (org.varlink.service.MethodNotFound, or a nested
        // org.cpupool.Manager.Foo.Bar) is kept whole.
        let kind = ErrorKind::from_error_name(name).map_or_else(|| name.to_owned(), |k| k.name().to_owned());
        DaemonError { kind, parameters, detail }
    }

    /// Fills the parameters that the kind declares and that are arguments of the request
    /// (`pool`, `id`, `target`, ...), where the reply did not carry them. D-Bus errors carry
    /// only a message; this makes their parameters match the varlink error's. Parameters
    /// that name something other than the request's argument of the same name (`TargetBusy`'s
    /// `id` is the assignment holding the target) are never filled.
    pub fn with_request(mut self, request: &[(&str, Value)]) -> DaemonError {
        use ErrorKind as K;
        let keys: &[&str] = match self.kind() {
            Some(K::NoSuchPool | K::PoolExists | K::PoolInUse | K::ReservedPool) => &["pool"],
            Some(K::NoSuchAssignment | K::DuplicateId) => &["id"],
            Some(K::TargetBusy | K::TargetNotAllowed | K::TargetOutsidePool) => &["target"],
            Some(K::NotWholeCores) => &["pool", "requested"],
            Some(K::InsufficientCapacity) => &["pool", "requested", "unit"],
            _ => &[],
        };
        for (key, value) in request {
            if keys.contains(key) && !value.is_null() && !self.parameters.contains_key(*key) {
                self.parameters.insert((*key).to_owned(), value.clone());
            }
        }
        self
    }

    /// The kind, when it is one of ours.
    pub fn kind(&self) -> Option<ErrorKind> {
        self.kind.parse().ok()
    }

    fn param(&self, key: &str) -> Option<String> {
        match self.parameters.get(key)? {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        }
    }

    /// What happened and what to do about it.
    pub fn message(&self) -> String {
        let Some((what, hint)) = self.words() else { return self.as_answered() };
        let what = match what {
            Some(What::Full(w)) => Some(w),
            Some(What::Partial(w)) => Some(self.detail.clone().unwrap_or(w)),
            None => self.detail.clone(),
        };
        // A reason that gives the advice already (the daemon's refusals often do) is not
        // followed by it again; the advice is the hint without its parenthesized example.
        let advice = hint.split(" (").next().unwrap_or(&hint);
        match what {
            Some(what) if advice.is_empty() || what.contains(advice) => what,
            Some(what) => format!("{what}; {hint}"),
            None => hint,
        }
    }

    /// The two halves of the message for the kinds this client has words for. `what` is built
    /// from the parameters. A D-Bus error carries only those filled from the request, so a
    /// sentence that would lack some (`Partial`) gives way to the daemon's own message; without
    /// either the hint stands alone.
    fn words(&self) -> Option<Words> {
        match self.kind() {
            Some(k) => self.pool_words(k).or_else(|| self.target_words(k)).or_else(|| self.daemon_words(k)),
            None if matches!(
                self.kind.as_str(),
                "org.varlink.service.MethodNotFound"
                    | "org.varlink.service.InterfaceNotFound"
                    | "org.freedesktop.DBus.Error.UnknownMethod"
            ) =>
            {
                Some((
                    Some(What::Full("the daemon does not know this call".into())),
                    "is it older than cpupoolctl? `cpupoolctl status` shows its version".into(),
                ))
            }
            None => None,
        }
    }

    /// An error this client has no words for, shown as it came.
    fn as_answered(&self) -> String {
        let what = if self.parameters.is_empty() {
            format!("the daemon answered {}", self.kind)
        } else {
            format!("the daemon answered {} {}", self.kind, Value::Object(self.parameters.clone()))
        };
        match &self.detail {
            Some(d) => format!("{what}: {d}"),
            None => what,
        }
    }

    /// The words for a refusal about a pool or a size asked of it.
    fn pool_words(&self, kind: ErrorKind) -> Option<Words> {
        use ErrorKind as K;
        use What::{Full, Partial};
        let p = |k: &str| self.param(k);
        Some(match kind {
            K::NoSuchPool => (
                p("pool").map(|x| Full(format!("no pool `{x}`"))),
                "`cpupoolctl pool list` shows the pools".into(),
            ),
            K::PoolExists => (
                p("pool").map(|x| Full(format!("a pool `{x}` exists already"))),
                "choose another name; `cpupoolctl pool list` shows the pools".into(),
            ),
            K::PoolInUse => {
                let pool = p("pool").unwrap_or_else(|| "POOL".into());
                (
                    p("pool").map(|x| match p("assignments") {
                        Some(n) if n == "1" => Full(format!("pool `{x}` still has 1 assignment")),
                        Some(n) => Full(format!("pool `{x}` still has {n} assignments")),
                        None => Partial(format!("pool `{x}` still has assignments")),
                    }),
                    format!("release them first; `cpupoolctl assignments --pool {pool}` lists them"),
                )
            }
            K::NoSuchAssignment => (
                p("id").map(|x| Full(format!("no assignment `{x}`"))),
                "`cpupoolctl assignments` lists the assignments".into(),
            ),
            K::InsufficientCapacity => {
                let pool = p("pool").unwrap_or_else(|| "POOL".into());
                let what = match (p("pool"), p("requested"), p("free"), p("unit")) {
                    (Some(x), Some(r), Some(f), Some(u)) => {
                        Some(Full(format!("pool `{x}` has {f} {u} free, {r} asked")))
                    }
                    (Some(x), Some(r), None, Some(u)) => {
                        Some(Partial(format!("pool `{x}` has fewer than {r} {u} free")))
                    }
                    _ => None,
                };
                (what, format!("ask for less or release an assignment; `cpupoolctl pool show {pool}` shows what is free"))
            }
            K::DuplicateId => (
                p("id").map(|x| {
                    Full(format!("id `{x}` belongs to an assignment with another pool, target or size"))
                }),
                "choose another --id, or release that assignment first (`cpupoolctl pool release ID`)".into(),
            ),
            K::ReservedPool => (
                p("pool").map(|x| Full(format!("`{x}` is the reserved pool, which is not assigned from"))),
                "choose an exclusive or shared pool; `cpupoolctl pool list` shows the pools".into(),
            ),
            K::NotWholeCores => (
                match (p("pool"), p("requested")) {
                    // The daemon's own words (core::state::Error::NotWholeCores), as D-Bus
                    // gives them.
                    (Some(x), Some(r)) => Some(Full(format!(
                        "pool `{x}` hands out whole cores: {r} {} is not a whole number of free cores",
                        if r == "1" { "CPU" } else { "CPUs" }
                    ))),
                    (Some(x), None) => Some(Partial(format!("pool `{x}` hands out whole cores"))),
                    _ => None,
                },
                "ask for a multiple of the threads per core; `cpupoolctl topology` shows the cores".into(),
            ),
            _ => return None,
        })
    }

    /// The words for a refusal about the target (a unit, cgroup or process).
    fn target_words(&self, kind: ErrorKind) -> Option<Words> {
        use ErrorKind as K;
        use What::{Full, Partial};
        let p = |k: &str| self.param(k);
        Some(match kind {
            K::TargetBusy => {
                let what = match (p("target"), p("id"), p("pool")) {
                    (Some(t), Some(i), Some(x)) => {
                        Some(Full(format!("target `{t}` already has assignment `{i}` from pool `{x}`")))
                    }
                    (Some(t), _, _) => Some(Partial(format!("target `{t}` already has an assignment"))),
                    _ => None,
                };
                let hint = match p("id") {
                    Some(id) => format!(
                        "a target holds one assignment: release it first (`cpupoolctl pool release {id}`)"
                    ),
                    None => {
                        "a target holds one assignment: release it first (`cpupoolctl assignments` shows it)"
                            .into()
                    }
                };
                (what, hint)
            }
            K::TargetNotAllowed => (
                match (p("target"), p("reason")) {
                    (Some(t), Some(r)) => Some(Full(format!("target `{t}` cannot be assigned: {r}"))),
                    (Some(t), None) => Some(Partial(format!("target `{t}` cannot be assigned"))),
                    _ => None,
                },
                "assign a unit or cgroup inside a pool's slice (`cpupool-POOL.slice`)".into(),
            ),
            K::TargetOutsidePool => {
                let what = match (p("target"), p("cpus"), p("parent"), p("parent_cpus")) {
                    (Some(t), Some(c), Some(par), Some(pc)) => Some(Full(format!(
                    "target `{t}` cannot run on CPUs {c}: it sits in `{par}`, whose effective CPUs are {}",
                    if pc.is_empty() { "none".to_owned() } else { pc }
                ))),
                    (Some(t), ..) => {
                        Some(Partial(format!("target `{t}` cannot run on the pool's CPUs where it is")))
                    }
                    _ => None,
                };
                let hint = p("hint").unwrap_or_else(|| {
                "start it in the pool's slice (`systemd-run --slice=cpupool-POOL.slice`) or use `cpupoolctl run`".into()
            });
                (what, hint)
            }
            _ => return None,
        })
    }

    /// The words for the rest: a bad argument, the caller's rights, and the daemon's own state
    /// (a failed apply or save, a rejected configuration, shutting down, too busy).
    fn daemon_words(&self, kind: ErrorKind) -> Option<Words> {
        use ErrorKind as K;
        use What::{Full, Partial};
        let p = |k: &str| self.param(k);
        Some(match kind {
            K::InvalidArgument => {
                let what = match (p("argument"), p("reason")) {
                    (Some(a), Some(r)) => Some(Full(format!("invalid {a}: {r}"))),
                    _ => None,
                };
                (what, "`cpupoolctl --help` describes the arguments".into())
            }
            K::AccessDenied => (
                Some(match p("uid") {
                    Some(uid) => Full(format!("uid {uid} may not change pools or assignments")),
                    None => Partial("you may not change pools or assignments".into()),
                }),
                "run as root or as a member of the admin group (daemon.admin_group, default `cpupool`)"
                    .into(),
            ),
            K::ApplyFailed => (
                // Worded as the daemon's D-Bus message is, so both transports print the same.
                p("reason").map(|r| Full(format!("applying the change failed and was rolled back: {r}"))),
                "the daemon's log says more (`journalctl -u cpupoold`)".into(),
            ),
            K::NotDurable => (
                p("reason")
                    .map(|r| Full(format!("the change could not be saved, and it was rolled back: {r}"))),
                "check the state directory and its disk (`journalctl -u cpupoold`)".into(),
            ),
            K::ConfigRejected => (
                p("reason")
                    .map(|r| Full(format!("the new configuration is invalid; the running one stays: {r}"))),
                "fix what it names, then `cpupoolctl reload`; `cpupoolctl pool list` and \
             `cpupoolctl topology` show what there is"
                    .into(),
            ),
            K::AssignmentsStranded => (
                p("reason").map(|r| {
                    Full(format!(
                        "the new configuration would strand assignments; the running one stays: {r}"
                    ))
                }),
                "release them first; `cpupoolctl assignments` lists them".into(),
            ),
            K::TopologyFailed => (
                p("reason").map(|r| Full(format!("reading the CPU topology failed: {r}"))),
                "the daemon's log says more (`journalctl -u cpupoold`)".into(),
            ),
            K::ShuttingDown => (
                Some(Full("the daemon is shutting down".into())),
                "try again when it is back (`systemctl status cpupoold`)".into(),
            ),
            K::Busy => (Some(Full("the daemon has too many connections".into())), "try again later".into()),
            _ => return None,
        })
    }
}

/// The two halves of a message: what happened (if the parameters or the daemon say) and the hint.
type Words = (Option<What>, String);

/// The first half of a message, and whether it says all the parameters would.
enum What {
    /// Built from every parameter it needs.
    Full(String),
    /// Some were missing: the daemon's message, if any, says more.
    Partial(String),
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn params(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn names_lose_their_interface_prefix() {
        let v = DaemonError::from_name("org.cpupool.Manager.NoSuchPool", Map::new(), None);
        let d = DaemonError::from_name("org.cpupool.Manager1.Error.NoSuchPool", Map::new(), None);
        assert_eq!((v.kind.as_str(), d.kind.as_str()), ("NoSuchPool", "NoSuchPool"));
        let other = DaemonError::from_name("org.varlink.service.MethodNotFound", Map::new(), None);
        assert_eq!(other.kind, "org.varlink.service.MethodNotFound");
    }

    #[test]
    fn both_transports_give_the_same_message_and_json() {
        let varlink =
            DaemonError::from_name("org.cpupool.Manager.NoSuchPool", params(json!({"pool": "x"})), None);
        let dbus = DaemonError::from_name(
            "org.cpupool.Manager1.Error.NoSuchPool",
            Map::new(),
            Some("no pool `x`".into()),
        )
        .with_request(&[("pool", json!("x")), ("id", json!("a"))]);
        assert_eq!(varlink.message(), "no pool `x`; `cpupoolctl pool list` shows the pools");
        assert_eq!(dbus.message(), varlink.message());
        let (v, d) = (Error::Daemon(varlink), Error::Daemon(dbus));
        assert_eq!(v.to_json(), d.to_json());
        assert_eq!(
            v.to_json(),
            json!({"error": "NoSuchPool", "parameters": {"pool": "x"},
                   "message": "no pool `x`; `cpupoolctl pool list` shows the pools"})
        );
        assert_eq!((v.exit_code(), d.exit_code()), (EXIT_DAEMON, EXIT_DAEMON));
        assert_eq!(v.human(), "error NoSuchPool: no pool `x`; `cpupoolctl pool list` shows the pools");
    }

    #[test]
    fn request_fills_only_matching_parameters() {
        // TargetBusy's id is the assignment holding the target, not the requested id.
        let e = DaemonError::from_name("org.cpupool.Manager1.Error.TargetBusy", Map::new(), None)
            .with_request(&[("pool", json!("dp")), ("id", json!("mine")), ("target", json!("unit:a"))]);
        assert_eq!(Value::Object(e.parameters), json!({"target": "unit:a"}));
        // Parameters from the reply win.
        let e = DaemonError::from_name("org.cpupool.Manager.NoSuchPool", params(json!({"pool": "a"})), None)
            .with_request(&[("pool", json!("b"))]);
        assert_eq!(e.param("pool").as_deref(), Some("a"));
        // Absent request arguments are not filled.
        let e = DaemonError::from_name("DuplicateId", Map::new(), None).with_request(&[("id", Value::Null)]);
        assert!(e.parameters.is_empty());
    }

    #[test]
    fn messages_say_what_to_do() {
        let m = |name: &str, p: Value, detail: Option<&str>| {
            DaemonError::from_name(name, params(p), detail.map(str::to_owned)).message()
        };
        assert_eq!(
            m("AccessDenied", json!({"uid": 65534}), None),
            "uid 65534 may not change pools or assignments; run as root or as a member of the admin \
             group (daemon.admin_group, default `cpupool`)"
        );
        assert!(m("AccessDenied", json!({}), Some("denied")).contains("daemon.admin_group"));
        assert_eq!(
            m("InsufficientCapacity", json!({"pool": "dp", "requested": 4, "free": 2, "unit": "cpus"}), None),
            "pool `dp` has 2 cpus free, 4 asked; ask for less or release an assignment; \
             `cpupoolctl pool show dp` shows what is free"
        );
        assert!(m("TargetBusy", json!({"target": "unit:a", "id": "x", "pool": "dp"}), None)
            .contains("`cpupoolctl pool release x`"));
        assert_eq!(
            m("InvalidArgument", json!({"argument": "target", "reason": "empty"}), None),
            "invalid target: empty; `cpupoolctl --help` describes the arguments"
        );
        // The reason is the cause alone: each phrase once (the daemon's D-Bus message reads the same).
        assert_eq!(
            m("ApplyFailed", json!({"reason": "writing `2` to x: EBUSY"}), None),
            "applying the change failed and was rolled back: writing `2` to x: EBUSY; \
             the daemon's log says more (`journalctl -u cpupoold`)"
        );
        assert_eq!(
            m("ConfigRejected", json!({"reason": "`c.toml`: pools.x.count: must be at least 1"}), None),
            "the new configuration is invalid; the running one stays: `c.toml`: pools.x.count: must be at \
             least 1; fix what it names, then `cpupoolctl reload`; `cpupoolctl pool list` and \
             `cpupoolctl topology` show what there is"
        );
        // Without parameters the daemon's message is the first half.
        assert_eq!(
            m("ApplyFailed", json!({}), Some("writing `2` to x: EBUSY")),
            "writing `2` to x: EBUSY; the daemon's log says more (`journalctl -u cpupoold`)"
        );
        // A D-Bus error missing `free`: the daemon's message says more than the partial sentence.
        assert_eq!(
            m("InsufficientCapacity", json!({"pool": "dp", "requested": 4, "unit": "cpus"}), Some("only 2 free")),
            "only 2 free; ask for less or release an assignment; `cpupoolctl pool show dp` shows what is free"
        );
        assert_eq!(
            m("InsufficientCapacity", json!({"pool": "dp", "requested": 4, "unit": "cpus"}), None),
            "pool `dp` has fewer than 4 cpus free; ask for less or release an assignment; \
             `cpupoolctl pool show dp` shows what is free"
        );
        // A reason that gives the advice already is not followed by it again.
        let said = m(
            "TargetNotAllowed",
            json!({"target": "cgroup:system.slice", "reason": "`system.slice` is a host slice; assign a unit or cgroup inside a pool's slice instead (e.g. `cpupoolctl run`)"}),
            None,
        );
        assert_eq!(said.matches("inside a pool's slice").count(), 1, "{said}");
        let unsaid = m("TargetNotAllowed", json!({"target": "cgroup:a", "reason": "nested"}), None);
        assert!(
            unsaid.ends_with("; assign a unit or cgroup inside a pool's slice (`cpupool-POOL.slice`)"),
            "{unsaid}"
        );
        // A sandbox's log is its terminal.
        let failed = m("ApplyFailed", json!({"reason": "EBUSY"}), None);
        assert!(for_sandbox(&failed).ends_with("(the sandbox daemon's output, in its terminal)"), "{failed}");
        // Unknown errors are shown as they came.
        assert_eq!(
            m("org.example.Odd", json!({"a": 1}), Some("why")),
            "the daemon answered org.example.Odd {\"a\":1}: why"
        );
        assert!(m("org.varlink.service.MethodNotFound", json!({"method": "x"}), None).contains("older"));
    }

    #[test]
    fn exit_codes() {
        let unreachable = Error::Unreachable {
            address: "unix:/x".into(),
            reason: "no socket".into(),
            hint: "start it".into(),
        };
        assert_eq!(unreachable.exit_code(), EXIT_UNREACHABLE);
        assert_eq!(unreachable.to_string(), "cannot reach cpupoold at unix:/x: no socket; start it");
        assert_eq!(unreachable.to_json()["error"], "Unreachable");
        assert_eq!(unreachable.to_json()["parameters"]["address"], "unix:/x");
        let protocol = Error::Protocol { address: "unix:/x".into(), reason: "not JSON".into() };
        assert_eq!(protocol.exit_code(), EXIT_DAEMON);
    }
}
