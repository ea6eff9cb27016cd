//! Unix sockets the daemon listens on: bound in a directory it creates, a stale socket left by
//! a previous run replaced, a live one (another daemon answers) left alone.
//!
//! A socket appears at its name only once it listens, with its final mode ([`bind_in_place`]):
//! it is bound under a hidden temporary name beside it, its mode set, and renamed into place.
//! Peers that wait for the file and then dial (the kubelet's plugin watcher sees the name in
//! `plugins_registry/` and dials at once) never find a name that refuses them, nor one of the
//! wrong mode. `bind(2)` and `listen(2)` are two calls, and a name bound in place exists
//! between them: a dial then is refused (ECONNREFUSED), which made a test fail 1 run in 18
//! under load.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Sockets bound so far by this process, to keep their temporary names apart.
static BOUND: AtomicU64 = AtomicU64::new(0);

/// The hidden temporary name `path` is bound under before it is renamed into place: in the
/// same directory (a rename does not cross file systems), short (a socket's whole path must fit
/// in 108 bytes), and starting with a dot, which the kubelet's plugin watcher skips.
fn temporary(path: &Path) -> PathBuf {
    let n = BOUND.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".s{}.{n}", std::process::id()))
}

/// Binds and listens on `path` with permissions `mode`, the name appearing only once both hold
/// (see the module's text). Whatever is at `path` is replaced; the caller decides beforehand
/// whether it may be.
pub fn bind_in_place(path: &Path, mode: u32) -> io::Result<UnixListener> {
    let tmp = temporary(path);
    let listener = UnixListener::bind(&tmp)?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
        .and_then(|()| std::fs::rename(&tmp, path));
    match placed {
        Ok(()) => Ok(listener),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

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
    bind_in_place(path, mode)
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

    /// The name is never created in place: a watcher of the directory (the kubelet's plugin
    /// watcher is one, on inotify) sees it only as a rename's target, at which point the
    /// socket listens with its mode. A name bound in place is an IN_CREATE of a socket that
    /// neither listens nor has its mode yet.
    #[test]
    fn the_name_appears_listening_with_its_mode() {
        use inotify::{EventMask, Inotify, WatchMask};
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("reg.sock");
        let mut watcher = Inotify::init().unwrap_or_else(|e| panic!("{e}"));
        watcher
            .watches()
            .add(dir.path(), WatchMask::CREATE | WatchMask::MOVED_TO)
            .unwrap_or_else(|e| panic!("{e}"));
        let l = bind_in_place(&path, 0o600).unwrap_or_else(|e| panic!("{e}"));
        let mut buf = [0u8; 4096];
        let seen: Vec<(String, bool)> = watcher
            .read_events(&mut buf)
            .unwrap_or_else(|e| panic!("{e}"))
            .map(|e| {
                (
                    e.name.map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
                    e.mask.contains(EventMask::MOVED_TO),
                )
            })
            .collect();
        let of_the_name: Vec<_> = seen.iter().filter(|(n, _)| n == "reg.sock").collect();
        assert_eq!(of_the_name, [&("reg.sock".to_owned(), true)], "events: {seen:?}");
        assert!(seen.iter().all(|(n, _)| n == "reg.sock" || n.starts_with('.')), "events: {seen:?}");
        let mode = std::fs::metadata(&path).map(|m| m.permissions().mode() & 0o777).unwrap_or_default();
        assert_eq!(mode, 0o600);
        std::os::unix::net::UnixStream::connect(&path).unwrap_or_else(|e| panic!("{e}"));
        drop(l);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap_or_else(|e| panic!("{e}"))
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("reg.sock")]);
    }
}
