//! Which targets may be confined at all: the cgroups whose confinement would defeat the pools.

use super::{Assignment, CgroupPath, Error, Target};

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

/// Whether `a` is `b` or lies below it.
fn within(a: &CgroupPath, b: &CgroupPath) -> bool {
    a == b || a.as_str().strip_prefix(b.as_str()).is_some_and(|rest| rest.starts_with('/'))
}

/// Refuses targets that would defeat the pools, before anything is booked: cpupoold's own
/// slices, the host slices (`system.slice`, `user.slice`, `init.scope`, `-.slice` and the
/// configured `host_cgroups`) and their ancestors, and a cgroup nested inside (or containing)
/// another assignment's target, whose CPUs the kernel would then decide, not the pool.
pub fn check_target<'a>(
    target: &Target,
    host_cgroups: &[CgroupPath],
    others: impl Iterator<Item = &'a Assignment>,
) -> Result<(), Error> {
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
    let Some(path) = path else { return Ok(()) };
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
        if within(&p, &path) {
            let what = if p == path { "is" } else { "holds" };
            return refuse(format!(
                "`{path}` {what} `{p}`, which the reserved pool confines for the host's own processes; assign a unit or cgroup inside a pool's slice instead (e.g. `systemd-run --slice=cpupool-POOL.slice`, or `cpupoolctl run`)"
            ));
        }
    }
    for a in others {
        let other = match &a.target {
            Target::Cgroup(p) => Some(p.clone()),
            Target::Unit(u) => slice_cgroup(u),
            _ => None,
        };
        let Some(other) = other else { continue };
        if within(&path, &other) || within(&other, &path) {
            let how = if within(&path, &other) { "lies inside" } else { "contains" };
            return refuse(format!(
                "`{path}` {how} `{other}`, the target of assignment `{}` (pool `{}`): the kernel would confine one by the other's CPUs",
                a.id, a.pool
            ));
        }
    }
    Ok(())
}
