//! Process facts from procfs, given its root (`/proc`, or the sandbox's).

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The uid owning process `pid`: the owner of `<proc_root>/<pid>`. `NotFound` when there is
/// no such process.
pub fn process_owner(proc_root: &Path, pid: u32) -> io::Result<u32> {
    std::fs::metadata(proc_root.join(pid.to_string())).map(|m| m.uid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_of_a_process_directory() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir(dir.path().join("42")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(process_owner(dir.path(), 42).ok(), Some(nix::unistd::getuid().as_raw()));
        assert_eq!(process_owner(dir.path(), 43).map_err(|e| e.kind()).err(), Some(io::ErrorKind::NotFound));
    }
}
