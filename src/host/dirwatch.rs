//! Noticing directories go away without looking at them: an inotify watch on a directory's
//! *parent* reports the directory removed or renamed away (`IN_DELETE`, `IN_MOVED_FROM`, with its
//! name). Watching the directory itself would not do: cgroupfs sends no `IN_DELETE_SELF` when a
//! cgroup is removed (the watch keeps its inode alive, and kernfs reports the removal only to
//! the parent), which the guest suite showed on 6.1 and 6.12. Targets that share a parent share
//! one watch, and a watched target costs nothing until it goes, whatever the number of targets;
//! the simulated tree of the sandbox is a plain directory and reports the same.
//!
//! A watch says only that something happened: the caller looks at the path again before acting
//! (a directory of the same name may have been made anew, or a link may have stood in the path
//! when the watch was added, which `IN_DONT_FOLLOW` refuses only for the last component). A
//! directory whose grandparent is renamed moves without an event; the caller's occasional sweep
//! catches that.

use std::io;
use std::path::Path;

use futures_util::StreamExt;
use inotify::{EventMask, Inotify, WatchMask};

/// A watch, as [`DirWatch::add`] returned it.
pub type Wd = inotify::WatchDescriptor;

/// What a [`DirWatch`] saw.
#[derive(Debug)]
pub enum Seen {
    /// In the directory of this watch, the entry of this name was removed or renamed away.
    ChildGone(Wd, String),
    /// The watched directory itself was removed or moved, or its watch ended (its file system
    /// was unmounted): look at every path below it again.
    Gone(Wd),
    /// The kernel's event queue overflowed and events were lost: look at every path again.
    Overflow,
    /// The inotify instance failed; nothing more will be seen.
    Broken(io::Error),
}

/// One inotify instance watching directories for entries removed from them.
pub struct DirWatch {
    watches: inotify::Watches,
    stream: inotify::EventStream<Vec<u8>>,
}

impl DirWatch {
    /// A new inotify instance; fails when the per-user limit of instances is reached.
    pub fn new() -> io::Result<DirWatch> {
        let inotify = Inotify::init()?;
        let watches = inotify.watches();
        let stream = inotify.into_event_stream(vec![0u8; 4096])?;
        Ok(DirWatch { watches, stream })
    }

    /// Watches the directory `dir` (not following a link there) for entries removed or renamed
    /// away, and for its own removal. Fails with `NotFound` when it does not exist,
    /// `NotADirectory` when it is not a directory, and with the kernel's `ENOSPC` when the
    /// per-user limit of watches (`fs.inotify.max_user_watches`) is reached. A directory
    /// watched twice gives the same [`Wd`] both times.
    pub fn add(&mut self, dir: &Path) -> io::Result<Wd> {
        let mask = WatchMask::DELETE
            | WatchMask::MOVED_FROM
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF
            | WatchMask::ONLYDIR
            | WatchMask::DONT_FOLLOW;
        self.watches.add(dir, mask)
    }

    /// Stops watching `wd`. A watch the kernel has ended already is no error.
    pub fn remove(&mut self, wd: Wd) {
        let _ = self.watches.remove(wd);
    }

    /// The next thing seen; pending until there is one.
    pub async fn next(&mut self) -> Seen {
        loop {
            match self.stream.next().await {
                Some(Ok(e)) if e.mask.contains(EventMask::Q_OVERFLOW) => return Seen::Overflow,
                Some(Ok(e)) if e.mask.intersects(EventMask::DELETE | EventMask::MOVED_FROM) => {
                    if let Some(name) = e.name.as_ref().and_then(|n| n.to_str()) {
                        return Seen::ChildGone(e.wd, name.to_owned());
                    }
                }
                Some(Ok(e))
                    if e.mask
                        .intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED) =>
                {
                    return Seen::Gone(e.wd)
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Seen::Broken(e),
                None => {
                    return Seen::Broken(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "the inotify stream ended",
                    ))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn next(w: &mut DirWatch) -> Seen {
        tokio::time::timeout(std::time::Duration::from_secs(10), w.next())
            .await
            .unwrap_or_else(|_| panic!("nothing seen within 10 s"))
    }

    #[tokio::test]
    async fn a_child_removed_or_renamed_away_is_named_and_a_removed_directory_is_gone() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = tmp.path().join("slice");
        for d in ["a", "b"] {
            std::fs::create_dir_all(dir.join(d)).unwrap_or_else(|e| panic!("{e}"));
        }
        let mut w = DirWatch::new().unwrap_or_else(|e| panic!("{e}"));
        let wd = w.add(&dir).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.add(&dir).ok(), Some(wd.clone()), "the same directory, the same watch");
        std::fs::remove_dir(dir.join("a")).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(next(&mut w).await, Seen::ChildGone(at, name) if at == wd && name == "a"));
        std::fs::rename(dir.join("b"), dir.join("c")).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(next(&mut w).await, Seen::ChildGone(at, name) if at == wd && name == "b"));
        std::fs::remove_dir(dir.join("c")).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(next(&mut w).await, Seen::ChildGone(_, name) if name == "c"));
        std::fs::remove_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(next(&mut w).await, Seen::Gone(at) if at == wd));
        assert_eq!(w.add(&dir).err().map(|e| e.kind()), Some(io::ErrorKind::NotFound));
        let file = tmp.path().join("f");
        std::fs::write(&file, b"").unwrap_or_else(|e| panic!("{e}"));
        assert!(w.add(&file).is_err(), "a file is not a directory");
    }
}
