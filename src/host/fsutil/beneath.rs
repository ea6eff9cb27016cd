//! Opening a path below a root's directory fd without following any link: `openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` where the kernel has it, else a walk one component at
//! a time with `O_NOFOLLOW` (see the parent module). [`super::Root`]'s operations open through
//! here; `..` and absolute paths are refused before either.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::{NotBeneath, Resolve};

/// Set once `openat2` answered `ENOSYS` or `EPERM`: it will not work in this process.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// `rel`'s names, or an error if it is empty, absolute or has `.` or `..` components.
pub(super) fn names(rel: &Path) -> io::Result<Vec<&OsStr>> {
    let mut out = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => out.push(n),
            _ => return Err(not_beneath(rel)),
        }
    }
    if out.is_empty() {
        return Err(not_beneath(rel));
    }
    Ok(out)
}

pub(super) fn not_beneath(rel: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, NotBeneath { path: rel.to_path_buf() })
}

/// Opens `rel` (checked by [`names`]) below `root` without following any link.
pub(super) fn open_beneath(
    root: BorrowedFd<'_>,
    rel: &Path,
    flags: OFlags,
    mode: Mode,
    resolve: Resolve,
) -> io::Result<OwnedFd> {
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    if resolve == Resolve::Auto && !NO_OPENAT2.load(Ordering::Relaxed) {
        let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS;
        // The kernel answers EAGAIN when a rename raced the lookup; a few tries settle it.
        for _ in 0..8 {
            match rustix::fs::openat2(root, rel, flags, mode, how) {
                Err(Errno::AGAIN) => continue,
                Err(Errno::NOSYS | Errno::PERM) => {
                    NO_OPENAT2.store(true, Ordering::Relaxed);
                    break;
                }
                other => return other.map_err(io::Error::from),
            }
        }
    }
    walk(root, rel, flags, mode)
}

/// The fallback: each directory opened with `O_NOFOLLOW | O_DIRECTORY` relative to the one
/// before, the last name with `O_NOFOLLOW`. A link anywhere fails with `ELOOP`.
fn walk(root: BorrowedFd<'_>, rel: &Path, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    let names = names(rel)?;
    let Some((last, dirs)) = names.split_last() else { return Err(not_beneath(rel)) };
    let mut cur: Option<OwnedFd> = None;
    for d in dirs {
        let at = cur.as_ref().map_or(root, |f| f.as_fd());
        let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        cur = Some(rustix::fs::openat(at, *d, dir_flags, Mode::empty())?);
    }
    let at = cur.as_ref().map_or(root, |f| f.as_fd());
    Ok(rustix::fs::openat(at, *last, flags | OFlags::NOFOLLOW | OFlags::CLOEXEC, mode)?)
}
