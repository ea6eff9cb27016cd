//! Unix sockets the daemon listens on: bound in a directory it creates, a stale socket left by
//! a previous run replaced, a live one (another daemon answers) left alone.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::Path;

/// Binds `path` with permissions `mode`, creating its directory. A stale socket there is
/// removed; a live one is an `AddrInUse` error, anything else there `AlreadyExists`.
pub fn bind_unix(path: &Path, mode: u32) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("`{}` is served by another process", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("`{}` exists and is not a socket", path.display()),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_replaces_a_stale_socket_and_refuses_a_live_one() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("run/sock");
        std::fs::create_dir_all(dir.path().join("run")).unwrap_or_else(|e| panic!("{e}"));
        drop(UnixListener::bind(&path).unwrap_or_else(|e| panic!("{e}")));
        let l = bind_unix(&path, 0o666).unwrap_or_else(|e| panic!("{e}"));
        let mode = std::fs::metadata(&path).map(|m| m.permissions().mode() & 0o777).unwrap_or_default();
        assert_eq!(mode, 0o666);
        assert_eq!(bind_unix(&path, 0o666).err().map(|e| e.kind()), Some(io::ErrorKind::AddrInUse));
        drop(l);
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(bind_unix(&file, 0o666).err().map(|e| e.kind()), Some(io::ErrorKind::AlreadyExists));
    }
}
