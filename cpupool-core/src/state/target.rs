//! Names of assignments and what they apply to: ids, cgroup paths, targets.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::Error;

/// Longest assignment id.
pub const MAX_ID: usize = 128;
/// Longest cgroup target path.
pub const MAX_CGROUP_PATH: usize = 4096;
/// Longest systemd unit name (systemd's `UNIT_NAME_MAX` is 256 including the NUL).
pub const MAX_UNIT_NAME: usize = 255;

/// The unit types systemd knows (`unit_type_to_string`).
const UNIT_TYPES: [&str; 11] = [
    "service",
    "socket",
    "target",
    "device",
    "mount",
    "automount",
    "swap",
    "timer",
    "path",
    "slice",
    "scope",
];

/// An assignment id: `[A-Za-z0-9_.:@-]{1,128}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AssignmentId(pub(super) String);

impl AssignmentId {
    /// Validates an id.
    pub fn new(id: &str) -> Result<Self, Error> {
        let ok = !id.is_empty()
            && id.len() <= MAX_ID
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.:@-".contains(&b));
        if ok {
            Ok(AssignmentId(id.to_owned()))
        } else {
            Err(Error::InvalidArgument {
                arg: "id",
                reason: format!(
                    "`{}` must be 1-{MAX_ID} characters of A-Z a-z 0-9 _ . : @ -",
                    crate::echo(id).escape_debug()
                ),
            })
        }
    }

    /// No assignment's id: what [`State::check_target`](super::State::check_target) excepts
    /// when a cgroup is asked about for no assignment.
    pub fn none() -> Self {
        AssignmentId(String::new())
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for AssignmentId {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        AssignmentId::new(&s)
    }
}

impl From<AssignmentId> for String {
    fn from(i: AssignmentId) -> String {
        i.0
    }
}

impl fmt::Display for AssignmentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A cgroup path relative to the cgroup root. By construction it has no `.`/`..` component, no
/// empty component, no leading `/` and no NUL, so joining it to a root can never leave the root.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CgroupPath(pub(super) String);

impl CgroupPath {
    /// Validates a path. A single trailing `/` is tolerated and dropped.
    pub fn new(path: &str) -> Result<Self, Error> {
        let bad = |reason: &str| Error::InvalidArgument {
            arg: "target",
            reason: format!("cgroup path `{}` {reason}", crate::echo(path).escape_debug()),
        };
        let p = path.strip_suffix('/').unwrap_or(path);
        if p.is_empty() {
            return Err(bad("is empty (the cgroup root itself cannot be a target)"));
        }
        if p.len() > MAX_CGROUP_PATH {
            return Err(bad("is too long"));
        }
        if p.starts_with('/') {
            return Err(bad("must be relative to the cgroup root (no leading /)"));
        }
        for comp in p.split('/') {
            match comp {
                "" => return Err(bad("has an empty component")),
                "." | ".." => return Err(bad("may not contain . or .. components")),
                _ if comp.bytes().any(|b| b == 0 || b.is_ascii_control()) => {
                    return Err(bad("contains control characters"))
                }
                _ if comp.len() > 255 => return Err(bad("has a component longer than 255 bytes")),
                _ => {}
            }
        }
        Ok(CgroupPath(p.to_owned()))
    }

    /// The path, relative, `/`-separated.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `self` is `outer` or lies below it.
    pub fn within(&self, outer: &CgroupPath) -> bool {
        self.is_within(outer.as_str())
    }

    fn is_within(&self, outer: &str) -> bool {
        self.0 == outer || self.0.strip_prefix(outer).is_some_and(|rest| rest.starts_with('/'))
    }

    /// Whether the cgroup lies outside `cpupool.slice` (a container's, which the runtime makes
    /// and removes).
    pub fn outside_pools(&self) -> bool {
        !self.is_within(crate::plan::TOP_SLICE)
    }

    /// The enclosing cgroups, outermost first, not including `self`.
    pub fn ancestors(&self) -> Vec<CgroupPath> {
        let mut out = Vec::new();
        let mut end = 0;
        while let Some(i) = self.0[end..].find('/') {
            end += i;
            out.push(CgroupPath(self.0[..end].to_owned()));
            end += 1;
        }
        out
    }

    /// Number of components.
    pub fn depth(&self) -> usize {
        self.0.split('/').count()
    }

    /// `self/child`; `child` must be one valid component.
    pub fn join(&self, child: &str) -> Result<CgroupPath, Error> {
        CgroupPath::new(&format!("{}/{child}", self.0))
    }
}

impl TryFrom<String> for CgroupPath {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        CgroupPath::new(&s)
    }
}

impl From<CgroupPath> for String {
    fn from(p: CgroupPath) -> String {
        p.0
    }
}

impl fmt::Display for CgroupPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What an assignment applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Target {
    /// A systemd unit (`unit:foo.service`).
    Unit(String),
    /// A cgroup, relative to the cgroup root (`cgroup:kubepods/pod1/ctr`).
    Cgroup(CgroupPath),
    /// A process (`pid:1234`).
    Pid(u32),
    /// CPUs the kubelet allocated to a container not known yet (`kubelet:cpu-3`), named by the
    /// first device id of the allocation. It has no placement on the host: the CPUs are held
    /// until the device plugin retargets the assignment to the container's cgroup.
    Kubelet(String),
}

impl Target {
    /// Whether the target lies outside `cpupool.slice`: a kubelet allocation (its container is
    /// not known yet) or a cgroup elsewhere (a container's). A pool slice's partition cannot
    /// hold its CPUs.
    pub fn outside_pools(&self) -> bool {
        match self {
            Target::Kubelet(_) => true,
            Target::Cgroup(p) => p.outside_pools(),
            Target::Unit(_) | Target::Pid(_) => false,
        }
    }

    /// The scope `Run` puts process `pid`, started at `start`, in (where systemd runs):
    /// `cpupool-run-<pid>-<start>.scope`, a valid unit name for any pid and start.
    pub fn run_scope(pid: u32, start: u64) -> String {
        format!("cpupool-run-{pid}-{start}.scope")
    }

    /// The process (pid and start time) a unit target named by [`Target::run_scope`] was made
    /// for; `None` for any other target.
    pub fn run_scope_process(&self) -> Option<(u32, u64)> {
        let Target::Unit(unit) = self else { return None };
        let (pid, start) = unit.strip_prefix("cpupool-run-")?.strip_suffix(".scope")?.split_once('-')?;
        Some((pid.parse().ok()?, start.parse().ok()?))
    }
}

/// Longest device id (the device plugin API's limit).
pub const MAX_DEVICE_ID: usize = 63;

impl Target {
    /// Parses `unit:NAME`, `cgroup:PATH`, `pid:N` or `kubelet:DEVICE`.
    pub fn parse(s: &str) -> Result<Self, Error> {
        let bad = |reason: String| Error::InvalidArgument { arg: "target", reason };
        let Some((kind, rest)) = s.split_once(':') else {
            return Err(bad(format!(
                "`{}` must be unit:NAME, cgroup:PATH or pid:N",
                crate::echo(s).escape_debug()
            )));
        };
        match kind {
            "unit" => {
                // systemd's unit_name_is_valid(): NAME.TYPE with a non-empty NAME and a known
                // TYPE, so `..`, `.service` or `x.` never reach a backend that builds a path or
                // a bus call from the name.
                let typed = rest.rsplit_once('.').is_some_and(|(name, kind)| {
                    !name.is_empty() && !name.starts_with('.') && UNIT_TYPES.contains(&kind)
                });
                let ok = typed
                    && rest.len() <= MAX_UNIT_NAME
                    && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b":-_.\\@".contains(&b));
                if ok {
                    Ok(Target::Unit(rest.to_owned()))
                } else {
                    Err(bad(format!(
                        "`{}` is not a valid systemd unit name",
                        crate::echo(rest).escape_debug()
                    )))
                }
            }
            "cgroup" => Ok(Target::Cgroup(CgroupPath::new(rest)?)),
            "pid" => match rest.parse::<u32>() {
                Ok(pid) if pid > 0 && pid <= 4_194_304 => Ok(Target::Pid(pid)),
                _ => Err(bad(format!(
                    "`{}` is not a process id (1-4194304)",
                    crate::echo(rest).escape_debug()
                ))),
            },
            "kubelet" => {
                let ok = !rest.is_empty()
                    && rest.len() <= MAX_DEVICE_ID
                    && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
                if ok {
                    Ok(Target::Kubelet(rest.to_owned()))
                } else {
                    Err(bad(format!(
                        "`{}` is not a device id (1-{MAX_DEVICE_ID} characters of A-Z a-z 0-9 _ . -)",
                        crate::echo(rest).escape_debug()
                    )))
                }
            }
            other => Err(bad(format!(
                "unknown target kind `{}` (use unit:, cgroup: or pid:)",
                crate::echo(other).escape_debug()
            ))),
        }
    }
}

impl TryFrom<String> for Target {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        Target::parse(&s)
    }
}

impl From<Target> for String {
    fn from(t: Target) -> String {
        t.to_string()
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Unit(u) => write!(f, "unit:{u}"),
            Target::Cgroup(p) => write!(f, "cgroup:{p}"),
            Target::Pid(p) => write!(f, "pid:{p}"),
            Target::Kubelet(d) => write!(f, "kubelet:{d}"),
        }
    }
}
