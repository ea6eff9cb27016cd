//! The one way the daemon writes files: relative to the directory fd of a trusted root, never
//! through a symbolic link.
//!
//! The daemon runs as root and writes into trees other parties can shape: a container runtime
//! or a delegated user creates cgroups below the cgroup root, the sandbox is a plain directory,
//! an administrator's `config.d/` is edited by hand. A symlink planted at
//! `cgroup/work/app2/cpuset.cpus`, or a directory symlink `cgroup/work/evil -> /tmp/outside`,
//! would otherwise make a root daemon overwrite any file on the host. So every path the daemon
//! writes is opened relative to its [`Root`] (the cgroup root, the state directory, the
//! configuration directory, ...) with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`: a path
//! that holds a symlink anywhere, in a directory component or as the file itself, is refused
//! with [`SymlinkRefused`] naming the link, and a path cannot leave the root. The root itself is
//! configuration and is trusted, symlink or not.
//!
//! Kernels before 5.6 have no `openat2` (`ENOSYS`), and older seccomp filters (systemd's among
//! them) answer unknown system calls with `EPERM`. Then the path is walked one component at a
//! time with `openat(O_NOFOLLOW | O_DIRECTORY)` and the last one opened with `O_NOFOLLOW`, which
//! refuses the same links; `..` and absolute paths are refused up front in both ways.
//!
//! Creating, removing and renaming happen relative to the parent's directory fd opened the same
//! way, and `mkdirat`, `unlinkat`, `renameat` and `linkat` never follow a link in the last
//! component, so they cannot be redirected either.
//!
//! [`Root::replace`] is the one durable write (temporary file, fsync, rename, fsync of the
//! directory) that the state store, the runtime drop-in and the cluster configuration share.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use beneath::{names, not_beneath, open_beneath};

/// A file system operation that failed, naming the file.
#[derive(Debug, thiserror::Error)]
#[error("{op} `{}`", path.display())]
pub struct FsError {
    /// What was being done, e.g. "creating" or "renaming into place".
    pub op: &'static str,
    /// The file or directory, the root joined with the relative path.
    pub path: PathBuf,
    /// The cause; a [`SymlinkRefused`] inside an [`io::Error`] when a link was in the way.
    #[source]
    pub source: io::Error,
}

impl FsError {
    /// The kind of the underlying error.
    pub fn kind(&self) -> io::ErrorKind {
        self.source.kind()
    }
}

/// A symbolic link stood where the daemon was about to open, create or remove something.
#[derive(Debug, thiserror::Error)]
#[error("refusing to follow the symbolic link `{}`", link.display())]
pub struct SymlinkRefused {
    /// The link (the root joined with the part of the path up to the link).
    pub link: PathBuf,
}

/// A relative path that is empty, absolute, or has `.` or `..` components.
#[derive(Debug, thiserror::Error)]
#[error("`{}` is not a path of plain names below the root", path.display())]
pub struct NotBeneath {
    /// The path as given.
    pub path: PathBuf,
}

/// Whether `e` is the refusal of a symbolic link (see [`SymlinkRefused`]).
pub fn is_symlink_refusal(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<SymlinkRefused>())
}

/// The largest state file (`state.json`, the journal, their previous copies) read: generous (a
/// million assignments stay below it), only so that a file that is not the daemon's cannot
/// have it read without end.
pub const MAX_STATE_BYTES: u64 = 256 << 20;
/// The largest remembered-values file (`irq.json`, `power.json`, `housekeeping.json`) read.
pub const MAX_REMEMBERED_BYTES: u64 = 16 << 20;

/// Why a file the daemon keeps or is configured by was not read (the source of the
/// [`io::Error`] the reading sites carry, with the file's path, in their own error types).
#[derive(Debug, thiserror::Error)]
pub enum NotReadable {
    /// Not a regular file: a FIFO would block the reader, a device such as `/dev/zero` never ends.
    #[error("not a regular file but a {kind}")]
    NotRegular {
        /// `FIFO`, `character device`, `directory`, ...
        kind: &'static str,
    },
    /// Larger than the reader takes.
    #[error("larger than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// A file the daemon keeps for itself that every user may write ([`Root::read_own`]).
    #[error(
        "it is writable by every user (mode {mode:04o}, owner uid {uid}), so any local user could have \
         written it and cpupoold does not trust it; check its content, then `chmod o-w` it"
    )]
    WorldWritable {
        /// Its permission bits.
        mode: u32,
        /// Its owner.
        uid: u32,
    },
}

/// Opens `path` for reading without blocking (`O_NONBLOCK`: opening a FIFO with no writer
/// returns at once) and reads it with [`read_capped`]. Links are followed: a drop-in may be a
/// link to a file elsewhere, and a link to `/dev/null` (how a drop-in masks a vendor file of
/// the same name) reads as empty.
pub fn read_regular_file(path: &Path, cap: u64) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file =
        std::fs::OpenOptions::new().read(true).custom_flags(OFlags::NONBLOCK.bits() as i32).open(path)?;
    let st = rustix::fs::fstat(&file)?;
    let dev_null = rustix::fs::makedev(1, 3);
    if FileType::from_raw_mode(st.st_mode) == FileType::CharacterDevice && st.st_rdev == dev_null {
        return Ok(Vec::new());
    }
    read_capped(file, cap)
}

/// Reads `file` if it is a regular file of at most `cap` bytes, reading no more than `cap + 1`
/// bytes whatever its size claims; anything else is an [`io::ErrorKind::InvalidData`] error with
/// a [`NotReadable`] inside.
pub fn read_capped(file: File, cap: u64) -> io::Result<Vec<u8>> {
    let kind = FileType::from_raw_mode(rustix::fs::fstat(&file)?.st_mode);
    let refuse = |why: NotReadable| io::Error::new(io::ErrorKind::InvalidData, why);
    let name = match kind {
        FileType::RegularFile => None,
        FileType::Fifo => Some("FIFO"),
        FileType::CharacterDevice => Some("character device"),
        FileType::BlockDevice => Some("block device"),
        FileType::Directory => Some("directory"),
        FileType::Socket => Some("socket"),
        _ => Some("special file"),
    };
    if let Some(kind) = name {
        return Err(refuse(NotReadable::NotRegular { kind }));
    }
    let mut bytes = Vec::new();
    file.take(cap.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(refuse(NotReadable::TooLarge { limit: cap }));
    }
    Ok(bytes)
}

/// How paths below a root are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolve {
    /// `openat2` where the kernel has it, else [`Resolve::Walk`].
    Auto,
    /// Component by component with `O_NOFOLLOW`, as on kernels without `openat2`.
    Walk,
}

/// A directory the daemon writes below. Cheap to build: nothing is opened until an operation
/// runs, because roots may not exist yet when the daemon is put together (the sandbox makes its
/// tree later, and a cgroup root may be mounted after start). Each operation opens the root
/// afresh, so a remounted root is followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    path: PathBuf,
    resolve: Resolve,
}

impl Root {
    /// The root at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Root {
        Root { path: path.into(), resolve: Resolve::Auto }
    }

    /// The same root, resolving paths as `resolve` says (tests of the fallback use
    /// [`Resolve::Walk`]).
    pub fn with_resolve(mut self, resolve: Resolve) -> Root {
        self.resolve = resolve;
        self
    }

    /// The root's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Creates the root directory and missing parents with `mode` (an existing one is left
    /// alone), then fsyncs the parent of each directory it made, so that the root's own name is
    /// durable before anything written below it relies on it.
    pub fn create(path: impl Into<PathBuf>, mode: u32) -> Result<Root, FsError> {
        use std::os::unix::fs::DirBuilderExt;
        let root = Root::new(path);
        let dir = root.path.as_path();
        let missing: Vec<&Path> =
            dir.ancestors().take_while(|d| !d.as_os_str().is_empty() && !d.exists()).collect();
        std::fs::DirBuilder::new().recursive(true).mode(mode).create(dir).map_err(|source| FsError {
            op: "creating the directory",
            path: dir.to_path_buf(),
            source,
        })?;
        for created in missing.iter().rev() {
            let parent = match created.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            let err = |op| move |source| FsError { op, path: parent.to_path_buf(), source };
            File::open(parent).map_err(err("opening the directory"))?.sync_all().map_err(err("fsyncing"))?;
        }
        Ok(root)
    }

    /// Writes `data` to the existing file `rel` in one `write(2)`, as kernel files (cgroupfs,
    /// sysfs, procfs) expect: a file that does not exist is an error, never created.
    pub fn write(&self, rel: impl AsRef<Path>, data: &[u8]) -> Result<(), FsError> {
        self.write_with(rel.as_ref(), data, None)
    }

    /// Like [`Root::write`] for plain files that stand in for kernel files (the sandbox's
    /// simulated cgroupfs, tests): creates the file with `mode` if it does not exist, and
    /// replaces its contents in place, `data` written at offset 0 and the file then cut to its
    /// length. Not `O_TRUNC`: on a disk file system that frees the file's block and allocates
    /// another at every write (on ext4, a discard when mounted with `-o discard`, and a
    /// writeback started at close), which a kernel file, kept in memory, never costs; the
    /// sandbox's figures would measure the disk instead of the daemon. A reader racing the
    /// write may see a mix of old and new, as it could see the empty file `O_TRUNC` leaves.
    pub fn write_or_create(&self, rel: impl AsRef<Path>, data: &[u8], mode: u32) -> Result<(), FsError> {
        self.write_with(rel.as_ref(), data, Some(mode))
    }

    fn write_with(&self, rel: &Path, data: &[u8], create: Option<u32>) -> Result<(), FsError> {
        let err = self.err("writing", rel);
        let flags = match create {
            Some(_) => OFlags::WRONLY | OFlags::CREATE,
            None => OFlags::WRONLY | OFlags::TRUNC,
        };
        let fd = self.open_file(rel, flags, create.unwrap_or(0)).map_err(err)?;
        // One write(2): a kernel file takes the whole value or refuses it, and splitting it
        // would hand the kernel two values.
        let n = match create {
            Some(_) => rustix::io::pwrite(&fd, data, 0),
            None => rustix::io::write(&fd, data),
        }
        .map_err(|e| err(e.into()))?;
        if n != data.len() {
            return Err(err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("only {n} of {} bytes were taken", data.len()),
            )));
        }
        if create.is_some() {
            rustix::fs::ftruncate(&fd, n as u64).map_err(|e| err(e.into()))?;
        }
        Ok(())
    }

    /// Reads the whole file `rel`.
    pub fn read(&self, rel: impl AsRef<Path>) -> Result<Vec<u8>, FsError> {
        let rel = rel.as_ref();
        let err = self.err("reading", rel);
        let fd = self.open_file(rel, OFlags::RDONLY, 0).map_err(err)?;
        let mut bytes = Vec::new();
        File::from(fd).read_to_end(&mut bytes).map_err(err)?;
        Ok(bytes)
    }

    /// Reads the regular file `rel`, of at most `cap` bytes, without blocking on a FIFO or
    /// reading a device without end: see [`read_capped`]. For the daemon's own files (state,
    /// remembered host values), never kernel files.
    pub fn read_regular(&self, rel: impl AsRef<Path>, cap: u64) -> Result<Vec<u8>, FsError> {
        let rel = rel.as_ref();
        let err = self.err("reading", rel);
        let fd = self.open_file(rel, OFlags::RDONLY | OFlags::NONBLOCK, 0).map_err(err)?;
        read_capped(File::from(fd), cap).map_err(err)
    }

    /// [`Root::read_regular`] for a file the daemon writes for itself (the state, the values
    /// it remembers of the host), checking the file as opened: one every user may write is
    /// refused ([`NotReadable::WorldWritable`]); one owned by another user than the daemon's, or
    /// that its group may write, is read with a warning naming the file, its owner and mode.
    /// The daemon creates them all with mode 0600.
    pub fn read_own(&self, rel: impl AsRef<Path>, cap: u64) -> Result<Vec<u8>, FsError> {
        let rel = rel.as_ref();
        let err = self.err("reading", rel);
        let fd = self.open_file(rel, OFlags::RDONLY | OFlags::NONBLOCK, 0).map_err(err)?;
        let st = rustix::fs::fstat(&fd).map_err(|e| err(e.into()))?;
        let (mode, uid) = (st.st_mode & 0o7777, st.st_uid);
        if mode & 0o002 != 0 {
            return Err(err(io::Error::other(NotReadable::WorldWritable { mode, uid })));
        }
        let path = self.path.join(rel);
        let me = rustix::process::geteuid().as_raw();
        if uid != me {
            log::warn!(
                "`{}` is owned by uid {uid}, not by cpupoold's uid {me} (mode {mode:04o}): another user \
                 could have written it",
                path.display()
            );
        }
        if mode & 0o020 != 0 {
            log::warn!(
                "`{}` is writable by its group (mode {mode:04o}, owner uid {uid}): cpupoold writes it with \
                 mode 0600; `chmod g-w` it",
                path.display()
            );
        }
        read_capped(File::from(fd), cap).map_err(err)
    }

    /// Makes the file `name` also `prev` (through a hard link at `tmp`, renamed over `prev`),
    /// never removing `name`: the previous copy a file replaced by [`Root::replace_with`] keeps
    /// (call it as `before_rename`). Nothing to keep when `name` does not exist.
    pub fn link_prev(&self, name: &str, tmp: &str, prev: &str) -> Result<(), FsError> {
        // Left over by a crash between link and rename; `link` will not replace it.
        if let Err(e) = self.remove_file(tmp) {
            if e.kind() != io::ErrorKind::NotFound {
                log::debug!("removing stale `{}`: {e}", self.path.join(tmp).display());
            }
        }
        match self.hard_link(name, tmp) {
            Ok(()) => {}
            // First save: nothing to keep.
            Err(e) if e.kind() == io::ErrorKind::NotFound && !self.exists(name) => return Ok(()),
            Err(e) => return Err(e),
        }
        self.rename(tmp, prev)
    }

    /// Reads the whole file `rel` as UTF-8.
    pub fn read_to_string(&self, rel: impl AsRef<Path>) -> Result<String, FsError> {
        let rel = rel.as_ref();
        let bytes = self.read(rel)?;
        String::from_utf8(bytes)
            .map_err(|e| self.err("reading", rel)(io::Error::new(io::ErrorKind::InvalidData, e)))
    }

    /// Creates the directory `rel` (its parent must exist). An existing one is an error of kind
    /// [`io::ErrorKind::AlreadyExists`].
    pub fn create_dir(&self, rel: impl AsRef<Path>, mode: u32) -> Result<(), FsError> {
        let rel = rel.as_ref();
        let err = self.err("creating", rel);
        let (dir, name) = self.parent(rel).map_err(err)?;
        rustix::fs::mkdirat(&dir, name, Mode::from_bits_truncate(mode)).map_err(|e| err(e.into()))
    }

    /// Creates `rel` and the directories above it that are missing, with `mode`, and fsyncs the
    /// directory each new one was made in.
    pub fn create_dir_all(&self, rel: impl AsRef<Path>, mode: u32) -> Result<(), FsError> {
        let rel = rel.as_ref();
        if rel.as_os_str().is_empty() {
            return Ok(());
        }
        let mut done = PathBuf::new();
        for name in names(rel).map_err(self.err("creating", rel))? {
            done.push(name);
            let err = self.err("creating", &done);
            let (dir, _) = self.parent(&done).map_err(err)?;
            match rustix::fs::mkdirat(&dir, name, Mode::from_bits_truncate(mode)) {
                Ok(()) => rustix::fs::fsync(&dir).map_err(|e| err(e.into()))?,
                Err(Errno::EXIST) => {}
                Err(e) => return Err(err(e.into())),
            }
        }
        // What exists must be a directory reached without links.
        self.open_file(rel, OFlags::RDONLY | OFlags::DIRECTORY, 0).map_err(self.err("creating", rel))?;
        Ok(())
    }

    /// Removes the empty directory `rel`.
    pub fn remove_dir(&self, rel: impl AsRef<Path>) -> Result<(), FsError> {
        let rel = rel.as_ref();
        let err = self.err("removing", rel);
        let (dir, name) = self.parent(rel).map_err(err)?;
        rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR).map_err(|e| err(self.refusal(rel, e)))
    }

    /// Removes the directory `rel` and everything in it. Links inside are removed, not followed.
    pub fn remove_dir_all(&self, rel: impl AsRef<Path>) -> Result<(), FsError> {
        let rel = rel.as_ref();
        let err = self.err("removing", rel);
        let (dir, name) = self.parent(rel).map_err(err)?;
        let sub = rustix::fs::openat(
            &dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| err(self.refusal(rel, e)))?;
        empty_dir(sub).map_err(err)?;
        rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR).map_err(|e| err(e.into()))
    }

    /// Removes the file (or link) `rel`.
    pub fn remove_file(&self, rel: impl AsRef<Path>) -> Result<(), FsError> {
        let rel = rel.as_ref();
        let err = self.err("removing", rel);
        let (dir, name) = self.parent(rel).map_err(err)?;
        rustix::fs::unlinkat(&dir, name, AtFlags::empty()).map_err(|e| err(e.into()))
    }

    /// Renames `from` over `to` (atomically replacing it).
    pub fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<(), FsError> {
        let (from, to) = (from.as_ref(), to.as_ref());
        let err = self.err("renaming into place", to);
        let (from_dir, from_name) = self.parent(from).map_err(self.err("renaming", from))?;
        let (to_dir, to_name) = self.parent(to).map_err(err)?;
        rustix::fs::renameat(&from_dir, from_name, &to_dir, to_name).map_err(|e| err(e.into()))
    }

    /// Makes `to` a new name of the file `from`. An existing `to` is an error of kind
    /// [`io::ErrorKind::AlreadyExists`]; a link at `from` is linked, not followed.
    pub fn hard_link(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<(), FsError> {
        let (from, to) = (from.as_ref(), to.as_ref());
        let err = self.err("linking to", to);
        let (from_dir, from_name) = self.parent(from).map_err(self.err("linking", from))?;
        let (to_dir, to_name) = self.parent(to).map_err(err)?;
        rustix::fs::linkat(&from_dir, from_name, &to_dir, to_name, AtFlags::empty())
            .map_err(|e| err(e.into()))
    }

    /// Opens the existing file `rel` for appending (`O_APPEND`), refusing links: the state
    /// store's journal, kept open between writes.
    pub fn open_append(&self, rel: impl AsRef<Path>) -> Result<File, FsError> {
        let rel = rel.as_ref();
        let fd = self.open_file(rel, OFlags::WRONLY | OFlags::APPEND, 0).map_err(self.err("opening", rel))?;
        Ok(File::from(fd))
    }

    /// Opens `rel` for writing, creating it with `mode` if missing, refusing links: a lock file.
    pub fn open_or_create(&self, rel: impl AsRef<Path>, mode: u32) -> Result<File, FsError> {
        let rel = rel.as_ref();
        let fd = self
            .open_file(rel, OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC, mode)
            .map_err(self.err("opening", rel))?;
        Ok(File::from(fd))
    }

    /// What the name `rel` stands for now (not following a link there) and the file system of
    /// its directory as reached through the root's path today: a file kept open outlives a
    /// rename of its name and a remount of its directory, and this tells the two apart.
    pub fn stat_now(
        &self,
        rel: impl AsRef<Path>,
    ) -> Result<(rustix::fs::Stat, rustix::fs::StatVfs), FsError> {
        let rel = rel.as_ref();
        let err = self.err("checking", rel);
        let (dir, name) = self.parent(rel).map_err(err)?;
        let st = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| err(e.into()))?;
        let vfs = rustix::fs::fstatvfs(&dir).map_err(|e| err(e.into()))?;
        Ok((st, vfs))
    }

    /// Whether `rel` exists, reached without links.
    pub fn exists(&self, rel: impl AsRef<Path>) -> bool {
        self.open_file(rel.as_ref(), OFlags::PATH, 0).is_ok()
    }

    /// fsyncs the directory `rel` (empty: the root), so that names made or replaced in it
    /// survive a crash.
    pub fn sync_dir(&self, rel: impl AsRef<Path>) -> Result<(), FsError> {
        let rel = rel.as_ref();
        let err = self.err("fsyncing the directory", rel);
        let fd = if rel.as_os_str().is_empty() {
            self.open_root()
        } else {
            self.open_file(rel, OFlags::RDONLY | OFlags::DIRECTORY, 0)
        }
        .map_err(err)?;
        rustix::fs::fsync(&fd).map_err(|e| err(e.into()))
    }

    /// Replaces `rel` durably with `data`: when this returns `Ok`, a crash at any later moment
    /// leaves `rel` holding `data`, and at no moment does `rel` hold anything but the old or the
    /// new content. The temporary file is `.NAME.tmp` beside it, hidden so that a reader of the
    /// directory (`config.d/*.toml`) never takes it for a file of its own.
    pub fn replace(&self, rel: impl AsRef<Path>, data: &[u8], mode: u32) -> Result<(), FsError> {
        let rel = rel.as_ref();
        let name = rel.file_name().unwrap_or_default().to_string_lossy();
        self.replace_with(rel, &format!(".{name}.tmp"), data, mode, || Ok(()))
    }

    /// [`Root::replace`] with a temporary file named `tmp_name` (in `rel`'s directory), running
    /// `before_rename` once the new content is durable and before it takes the name: the state
    /// store keeps the outgoing file as its previous copy there. The sequence:
    ///
    /// 1. Write the whole new content to the temporary file and fsync it: a rename changes names,
    ///    not data, so without it a crash after step 3 may leave the name on blocks never written.
    /// 2. `before_rename`.
    /// 3. Rename the temporary file over `rel`: readers and crashes see the old or the new file.
    /// 4. fsync the directory: the rename is a change of the directory, durable only now.
    ///
    /// A failure before step 3 leaves `rel` as it was and removes the temporary file.
    pub fn replace_with(
        &self,
        rel: &Path,
        tmp_name: &str,
        data: &[u8],
        mode: u32,
        before_rename: impl FnOnce() -> Result<(), FsError>,
    ) -> Result<(), FsError> {
        let (dir, name) = self.parent(rel).map_err(self.err("replacing", rel))?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        let tmp = parent.join(tmp_name);
        let result = write_synced(&dir, tmp_name, data, mode)
            .map_err(|(op, e)| self.err(op, &tmp)(e))
            .and_then(|()| before_rename())
            .and_then(|()| {
                rustix::fs::renameat(&dir, tmp_name, &dir, name)
                    .map_err(|e| self.err("renaming into place", rel)(e.into()))
            });
        if let Err(e) = result {
            // Best effort: the error says what failed, and a leftover is replaced next time.
            if let Err(rm) = rustix::fs::unlinkat(&dir, tmp_name, AtFlags::empty()) {
                if rm != Errno::NOENT {
                    log::warn!("removing `{}` after a failed write: {rm}", self.path.join(&tmp).display());
                }
            }
            return Err(e);
        }
        rustix::fs::fsync(&dir).map_err(|e| self.err("fsyncing the directory", parent)(e.into()))
    }

    /// An error maker for `op` on `rel`.
    fn err<'a>(&'a self, op: &'static str, rel: &'a Path) -> impl Fn(io::Error) -> FsError + Copy + 'a {
        move |source| FsError { op, path: self.path.join(rel), source }
    }

    fn open_root(&self) -> io::Result<OwnedFd> {
        rustix::fs::open(&self.path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(io::Error::from)
    }

    /// Opens `rel` below the root with `flags`, refusing links.
    fn open_file(&self, rel: &Path, flags: OFlags, mode: u32) -> io::Result<OwnedFd> {
        names(rel)?;
        let root = self.open_root()?;
        open_beneath(root.as_fd(), rel, flags, Mode::from_bits_truncate(mode), self.resolve)
            .map_err(|e| self.refusal_at(root.as_fd(), rel, e))
    }

    /// The directory holding `rel`, opened without links, and `rel`'s last name.
    fn parent<'r>(&self, rel: &'r Path) -> io::Result<(OwnedFd, &'r OsStr)> {
        let names = names(rel)?;
        let Some((last, _)) = names.split_last() else {
            return Err(not_beneath(rel));
        };
        let root = self.open_root()?;
        match rel.parent().filter(|p| !p.as_os_str().is_empty()) {
            None => Ok((root, *last)),
            Some(parent) => {
                let flags = OFlags::RDONLY | OFlags::DIRECTORY;
                let dir = open_beneath(root.as_fd(), parent, flags, Mode::empty(), self.resolve)
                    .map_err(|e| self.refusal_at(root.as_fd(), parent, e))?;
                Ok((dir, *last))
            }
        }
    }

    /// `ELOOP` from an open that follows no link, or `ENOTDIR` from one that wants a directory,
    /// may mean a link was in the way: say which.
    fn refusal(&self, rel: &Path, e: Errno) -> io::Error {
        match self.open_root() {
            Ok(root) => self.refusal_at(root.as_fd(), rel, e.into()),
            Err(_) => e.into(),
        }
    }

    fn refusal_at(&self, root: BorrowedFd<'_>, rel: &Path, e: io::Error) -> io::Error {
        let code = e.raw_os_error();
        if code != Some(Errno::LOOP.raw_os_error()) && code != Some(Errno::NOTDIR.raw_os_error()) {
            return e;
        }
        // The first component that is a link; all before it are directories, so this looks no
        // further than the root.
        let mut prefix = PathBuf::new();
        for c in rel.components() {
            prefix.push(c);
            let is_link = rustix::fs::statat(root, &prefix, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| FileType::from_raw_mode(st.st_mode).is_symlink());
            if is_link {
                return io::Error::other(SymlinkRefused { link: self.path.join(prefix) });
            }
        }
        e
    }
}

/// Creates `name` in `dir` afresh (a leftover of that name, file or link, is removed first, so
/// nothing is written through it) and writes and fsyncs `data`. The error says which step.
fn write_synced(dir: &OwnedFd, name: &str, data: &[u8], mode: u32) -> Result<(), (&'static str, io::Error)> {
    // Not there is the usual case; anything else standing there makes the create fail below,
    // which names the file.
    let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, name, flags, Mode::from_bits_truncate(mode))
        .map_err(|e| ("creating", e.into()))?;
    let mut file = File::from(fd);
    file.write_all(data).map_err(|e| ("writing", e))?;
    file.sync_all().map_err(|e| ("fsyncing", e))
}

/// Removes everything in the directory `dir`, links as links.
fn empty_dir(dir: OwnedFd) -> io::Result<()> {
    let mut subdirs = Vec::new();
    let mut files = Vec::new();
    for entry in rustix::fs::Dir::read_from(&dir)? {
        let entry = entry?;
        let name = entry.file_name().to_owned();
        if name.as_bytes() == b"." || name.as_bytes() == b".." {
            continue;
        }
        let kind = match entry.file_type() {
            FileType::Unknown => rustix::fs::statat(&dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
                .map(|st| FileType::from_raw_mode(st.st_mode))?,
            k => k,
        };
        if kind == FileType::Directory {
            subdirs.push(name);
        } else {
            files.push(name);
        }
    }
    for name in files {
        rustix::fs::unlinkat(&dir, name.as_c_str(), AtFlags::empty())?;
    }
    for name in subdirs {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let sub = rustix::fs::openat(&dir, name.as_c_str(), flags, Mode::empty())?;
        empty_dir(sub)?;
        rustix::fs::unlinkat(&dir, name.as_c_str(), AtFlags::REMOVEDIR)?;
    }
    Ok(())
}

mod beneath;
#[cfg(test)]
mod tests;
