//! Files a test lays out before it starts a daemon or a server: the configuration of a sandbox,
//! a directory standing for a cgroup, permissions for peers of other uids. Each panics with the
//! path on failure, as a test should.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Writes `text` as `ROOT/etc/cpupoold/config.toml`, where a sandbox rooted at `root` reads it.
pub fn write_config(root: &Path, text: &str) {
    let etc = root.join("etc/cpupoold");
    make_dirs(&etc);
    let file = etc.join("config.toml");
    std::fs::write(&file, text).unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
}

/// Creates `path` and its parents (a cgroup in a sandbox's plain-file cgroupfs, a directory).
pub fn make_dirs(path: &Path) {
    std::fs::create_dir_all(path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
}

/// Makes the directories above `path`, up to `/tmp`, reachable by other uids (mode 0755), so
/// unprivileged peers can reach a socket in it.
pub fn open_to_others(path: &Path) {
    for d in path.ancestors().skip(1).take_while(|d| *d != Path::new("/tmp")) {
        // Best effort: a directory that is not ours stays as it is, and the peer's connect says so.
        let _ = std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755));
    }
}
