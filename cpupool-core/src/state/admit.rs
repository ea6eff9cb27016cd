//! Which targets may be confined at all: the cgroups whose confinement would defeat the pools.

use super::{Assignment, AssignmentId, CgroupPath, Error, State, Target};

/// Cgroups whose confinement would defeat the pools: the host slices, systemd's own scope and
/// cpupoold's parent slice. Their ancestors count too.
const PROTECTED_CGROUPS: [&str; 4] = ["system.slice", "user.slice", "init.scope", "cpupool.slice"];

/// The cgroup path systemd gives slice unit `name` (`a-b.slice` is `a.slice/a-b.slice`);
/// `None` for `-.slice` (the root) and for units that are not slices, whose place depends on
/// their `Slice=` setting.
pub fn slice_cgroup(name: &str) -> Option<CgroupPath> {
    let stem = name.strip_suffix(".slice")?;
    if stem == "-" || stem.is_empty() {
        return None;
    }
    let mut parts = Vec::new();
    let mut end = 0;
    while let Some(i) = stem[end..].find('-') {
        end += i;
        parts.push(format!("{}.slice", &stem[..end]));
        end += 1;
    }
    parts.push(name.to_owned());
    CgroupPath::new(&parts.join("/")).ok()
}

/// Refuses targets that would defeat the pools, before anything is booked: cpupoold's own
/// slices, the host slices (`system.slice`, `user.slice`, `init.scope`, `-.slice` and the
/// configured `host_cgroups`) and their ancestors, and a cgroup nested inside (or containing)
/// another assignment's target, whose CPUs the kernel would then decide, not the pool.
///
/// `others` are walked one by one; the engine asks [`State::check_target`], which looks the
/// nesting up in an index instead.
pub fn check_target<'a>(
    target: &Target,
    host_cgroups: &[CgroupPath],
    others: impl Iterator<Item = &'a Assignment>,
) -> Result<(), Error> {
    let Some(path) = check_protected(target, host_cgroups)? else { return Ok(()) };
    for a in others {
        let Some(other) = target_cgroup(&a.target) else { continue };
        if path.within(&other) || other.within(&path) {
            return Err(nested(target, &path, &other, a));
        }
    }
    Ok(())
}

/// The cgroup `target` names, for nesting: a cgroup target's path, a slice unit's cgroup.
fn target_cgroup(target: &Target) -> Option<CgroupPath> {
    match target {
        Target::Cgroup(p) => Some(p.clone()),
        Target::Unit(u) => slice_cgroup(u),
        _ => None,
    }
}

/// The refusal of `target` (cgroup `path`) for its nesting with `other`, `a`'s target.
fn nested(target: &Target, path: &CgroupPath, other: &CgroupPath, a: &Assignment) -> Error {
    let how = if path.within(other) { "lies inside" } else { "contains" };
    Error::TargetNotAllowed {
        target: target.to_string(),
        reason: format!(
            "`{path}` {how} `{other}`, the target of assignment `{}` (pool `{}`): the kernel would confine one by the other's CPUs",
            a.id, a.pool
        ),
    }
}

/// The protected part of [`check_target`]: the cgroup `target` names (if any) once it is
/// neither cpupoold's own nor a host slice or an ancestor of one.
fn check_protected(target: &Target, host_cgroups: &[CgroupPath]) -> Result<Option<CgroupPath>, Error> {
    let refuse = |reason: String| Err(Error::TargetNotAllowed { target: target.to_string(), reason });
    let path = match target {
        Target::Cgroup(p) => Some(p.clone()),
        Target::Unit(u) if u == "-.slice" => {
            return refuse("`-.slice` is the root of every cgroup: use a pool's slice or a unit in it".into())
        }
        Target::Unit(u) => slice_cgroup(u).or_else(|| {
            // Scopes and services named like a protected cgroup's last component (init.scope).
            PROTECTED_CGROUPS.iter().find(|p| *p == u).and_then(|p| CgroupPath::new(p).ok())
        }),
        Target::Pid(_) | Target::Kubelet(_) => None,
    };
    let Some(path) = path else { return Ok(None) };
    let top = CgroupPath(PROTECTED_CGROUPS[3].to_owned());
    // cpupool.slice itself, or a pool slice directly below it.
    let pool_slice = path.ancestors().last() == Some(&top)
        && path.as_str().rsplit('/').next().is_some_and(|n| n.starts_with("cpupool-"));
    if path == top || pool_slice {
        return refuse(format!(
            "`{path}` is a slice cpupoold manages for its pools; assign a unit or cgroup inside a pool's slice instead"
        ));
    }
    let protected =
        PROTECTED_CGROUPS.iter().filter_map(|p| CgroupPath::new(p).ok()).chain(host_cgroups.iter().cloned());
    for p in protected {
        if p.within(&path) {
            let what = if p == path { "is" } else { "holds" };
            return refuse(format!(
                "`{path}` {what} `{p}`, which the reserved pool confines for the host's own processes; assign a unit or cgroup inside a pool's slice instead (e.g. `systemd-run --slice=cpupool-POOL.slice`, or `cpupoolctl run`)"
            ));
        }
    }
    Ok(Some(path))
}

/// The cgroup each assignment's target names, ordered by path, so that whether a cgroup
/// encloses or lies inside another target is a few range lookups, not a walk over every
/// assignment.
#[derive(Debug, Clone, Default)]
pub(super) struct CgroupIndex(imbl::OrdSet<(CgroupPath, AssignmentId)>);

impl CgroupIndex {
    pub(super) fn insert(&mut self, a: &Assignment) {
        if let Some(p) = target_cgroup(&a.target) {
            self.0.insert((p, a.id.clone()));
        }
    }

    pub(super) fn remove(&mut self, a: &Assignment) {
        if let Some(p) = target_cgroup(&a.target) {
            self.0.remove(&(p, a.id.clone()));
        }
    }

    /// An assignment other than `except` whose target's cgroup is `path`, encloses it, or lies
    /// inside it.
    fn nested(&self, path: &CgroupPath, except: &AssignmentId) -> Option<(&CgroupPath, &AssignmentId)> {
        let at = |p: CgroupPath| {
            let from = (p.clone(), AssignmentId(String::new()));
            self.0.range(from..).take_while(move |(q, _)| *q == p).find(|(_, id)| id != except)
        };
        let enclosing = path.ancestors().into_iter().chain([path.clone()]).find_map(at);
        // Below `a/b` lie exactly the paths from `a/b/` up to `a/b0` ('0' follows '/').
        let inside = || {
            let lo = (CgroupPath(format!("{path}/")), AssignmentId(String::new()));
            let hi = (CgroupPath(format!("{path}0")), AssignmentId(String::new()));
            self.0.range(lo..hi).find(|(_, id)| id != except)
        };
        enclosing.or_else(inside).map(|(p, id)| (p, id))
    }
}

impl State {
    /// Whether cpupoold may write CPUs into `path` for a container a runtime names (the NRI
    /// plugin's and the device plugin's unpooled containers and pod sandboxes): the rules a
    /// `cgroup:` target passes ([`State::check_target`]), against every assignment. A refusal
    /// is [`Error::TargetNotAllowed`] with the reason.
    pub fn check_container_cgroup(
        &self,
        path: &CgroupPath,
        host_cgroups: &[CgroupPath],
    ) -> Result<(), Error> {
        self.check_target(&Target::Cgroup(path.clone()), host_cgroups, &AssignmentId::none())
    }

    /// [`check_target`] for `target` against the host cgroups and every assignment but
    /// `except`, through the index of target cgroups: its cost does not grow with the number
    /// of assignments.
    pub fn check_target(
        &self,
        target: &Target,
        host_cgroups: &[CgroupPath],
        except: &AssignmentId,
    ) -> Result<(), Error> {
        let Some(path) = check_protected(target, host_cgroups)? else { return Ok(()) };
        let found = self.cgroups.nested(&path, except);
        match found.and_then(|(other, id)| Some((other, self.assignments().get(id)?))) {
            Some((other, a)) => Err(nested(target, &path, other, a)),
            None => Ok(()),
        }
    }
}
