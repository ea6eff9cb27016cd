//! Noticing directories go away without looking at them: one inotify watch per directory for
//! its own removal or move (`IN_DELETE_SELF`, `IN_MOVE_SELF`). cgroupfs reports `rmdir(2)` of a
//! cgroup as any file system does (the removal goes through the VFS), so a watched target cgroup
//! costs nothing until it goes, whatever the number of targets; the simulated tree of the
//! sandbox is a plain directory and reports the same.
//!
//! A watch says only that something happened to the directory it was put on: the caller looks
//! at the path again before acting (it may have been made anew, or a link may have stood in the
//! path when the watch was added, which `IN_DONT_FOLLOW` refuses only for the last component).
//! A directory renamed with its parent moves without an event; the caller's occasional sweep
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
    /// The directory of this watch was removed or moved, or its watch ended (its file system
    /// was unmounted): look at its path again.
    Gone(Wd),
    /// The kernel's event queue overflowed and events were lost: look at every path again.
    Overflow,
    /// The inotify instance failed; nothing more will be seen.
    Broken(io::Error),
}

/// One inotify instance watching directories for their own removal.
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

    /// Watches the directory `dir` (not following a link there). Fails with `NotFound` when it
    /// does not exist, `NotADirectory` when it is not a directory, and with the kernel's
    /// `ENOSPC` (as [`io::ErrorKind::StorageFull`] or `Other`) when the per-user limit of watches
    /// (`fs.inotify.max_user_watches`) is reached. A directory watched twice gives the same
    /// [`Wd`] both times.
    pub fn add(&mut self, dir: &Path) -> io::Result<Wd> {
        let mask =
            WatchMask::DELETE_SELF | WatchMask::MOVE_SELF | WatchMask::ONLYDIR | WatchMask::DONT_FOLLOW;
        self.watches.add(dir, mask)
    }

    /// Stops watching `wd`. A watch the kernel has ended already (after its directory's
    /// removal) is no error.
    pub fn remove(&mut self, wd: Wd) {
        let _ = self.watches.remove(wd);
    }

    /// The next thing seen; pending until there is one.
    pub async fn next(&mut self) -> Seen {
        loop {
            match self.stream.next().await {
                Some(Ok(e)) if e.mask.contains(EventMask::Q_OVERFLOW) => return Seen::Overflow,
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
    async fn a_removed_or_moved_directory_is_seen_gone_and_a_missing_one_is_not_found() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        for d in [&a, &b] {
            std::fs::create_dir(d).unwrap_or_else(|e| panic!("{e}"));
        }
        let mut w = DirWatch::new().unwrap_or_else(|e| panic!("{e}"));
        let wa = w.add(&a).unwrap_or_else(|e| panic!("{e}"));
        let wb = w.add(&b).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.add(&a).ok(), Some(wa.clone()), "the same directory, the same watch");
        std::fs::remove_dir(&a).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(next(&mut w).await, Seen::Gone(wd) if wd == wa));
        std::fs::rename(&b, tmp.path().join("c")).unwrap_or_else(|e| panic!("{e}"));
        // The removal's IN_IGNORED may come first; the move's event names b's watch.
        loop {
            match next(&mut w).await {
                Seen::Gone(wd) if wd == wb => break,
                Seen::Gone(wd) if wd == wa => {}
                other => panic!("{other:?}"),
            }
        }
        w.remove(wb);
        assert_eq!(w.add(&a).err().map(|e| e.kind()), Some(io::ErrorKind::NotFound));
        let file = tmp.path().join("f");
        std::fs::write(&file, b"").unwrap_or_else(|e| panic!("{e}"));
        assert!(w.add(&file).is_err(), "a file is not a directory");
    }
}
