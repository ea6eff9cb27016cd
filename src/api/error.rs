//! The refusals only the management interfaces make: a caller without the right, a daemon out
//! of room for another connection or call. Every other error a call can end in is the engine's
//! or the state's, mapped below the adapters ([`EngineError::to_api`](crate::engine::EngineError::to_api),
//! [`state::Error::to_api`](crate::core::state::Error::to_api)), so varlink, D-Bus and the
//! kubelet's device plugin name it alike.

pub use cpupool_wire::{ApiError, ErrorKind};
use serde_json::json;

/// `AccessDenied` for `uid`.
pub fn access_denied(uid: u32) -> ApiError {
    ApiError::new(
        ErrorKind::AccessDenied,
        json!({ "uid": uid }),
        format!("uid {uid} may not change pools or assignments: it takes root or the daemon's admin group"),
    )
}

/// `AccessDenied` for `uid`, which could not be told allowed: `why`.
pub fn access_denied_because(uid: u32, why: &str) -> ApiError {
    ApiError::new(
        ErrorKind::AccessDenied,
        json!({ "uid": uid }),
        format!("uid {uid} may not change pools or assignments now: {why}"),
    )
}

/// `Busy`: too many connections.
pub fn busy() -> ApiError {
    ApiError::new(ErrorKind::Busy, json!({}), "too many connections; try again later")
}

/// `Busy`: too many calls in flight (D-Bus) from `whom` ("uid 65534", "unprivileged peers").
pub fn busy_calls(whom: &str) -> ApiError {
    ApiError::new(
        ErrorKind::Busy,
        json!({}),
        format!("too many calls in flight from {whom}; wait for their answers and try again"),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::core::state;
    use crate::engine::EngineError;

    /// The reason is the cause alone (clients say what the kind means); the D-Bus message says
    /// each part once.
    #[test]
    fn engine_errors_say_each_phrase_once() {
        let config = EngineError::Config(Box::new(crate::config::ConfigError::Invalid {
            file: "/etc/cpupoold/config.toml".into(),
            key: "pools.dp.count".into(),
            reason: "must be at least 1".into(),
        }));
        let e = config.to_api();
        assert_eq!(e.kind, "ConfigRejected");
        assert_eq!(
            e.params,
            json!({ "reason": "`/etc/cpupoold/config.toml`: pools.dp.count: must be at least 1" })
        );
        assert_eq!(
            e.message,
            "the new configuration is invalid; the running one stays: \
             `/etc/cpupoold/config.toml`: pools.dp.count: must be at least 1"
        );
        let apply = EngineError::Apply(crate::host::cgroupfs::HostError::Io(crate::host::IoError::Write {
            path: "/sys/fs/cgroup/a/cpuset.cpus".into(),
            data: "2".into(),
            source: std::io::Error::from_raw_os_error(16),
        }));
        let e = apply.to_api();
        assert_eq!(e.kind, "ApplyFailed");
        let reason = e.params["reason"].as_str().unwrap_or_default().to_owned();
        assert!(reason.starts_with("writing `2` to `/sys/fs/cgroup/a/cpuset.cpus`: "), "{reason}");
        assert_eq!(e.message, format!("applying the change failed and was rolled back: {reason}"));
        let stranded = EngineError::Stranded("assignment `a` of pool `dp` holds CPU 3".into());
        let e = stranded.to_api();
        assert_eq!(e.params, json!({ "reason": "assignment `a` of pool `dp` holds CPU 3" }));
        assert_eq!(e.message.matches("the running one stays").count(), 1, "{}", e.message);
    }

    #[test]
    fn every_state_error_has_a_documented_kind() {
        let errors = state::every_error();
        for e in &errors {
            let a = e.to_api();
            assert!(ErrorKind::ALL.contains(&a.kind), "{}", a.kind);
            assert!(!a.message.is_empty());
        }
    }
}
