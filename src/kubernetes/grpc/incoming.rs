//! The connections the kubelet-facing sockets accept (the device plugin's, within one budget for
//! every pool's socket, and the DRA driver's, within one of their own).
//!
//! tonic serves each accepted connection until its peer goes, and HTTP/2 lets a client keep a
//! connection open without a word; so without a cap, connections that send nothing would take
//! the daemon's descriptors until accept, the engine's reads and every other socket fail with
//! EMFILE. The kubelet needs one connection per pool (ListAndWatch and every call share it),
//! and one more while it registers again, so the budget is small
//! ([`crate::fds::Budgets::device_plugin`]). A connection beyond it is closed at once (the
//! peer reads the end of the stream) and counted in a log line at most every 10 s, never kept
//! waiting for room. A failed accept (EMFILE after all, from something else) backs off instead
//! of spinning: tonic would ask again at once.
//!
//! Only the kubelet's side may take that room: the sockets are the daemon's uid's alone (mode
//! 0600, as the kubelet's own are), and a peer of any uid but root's and the daemon's (where the mode was
//! changed; the name appears only once its mode is set) is closed at accept
//! ([`kubelet_peer`]). Otherwise idle connections of another user could take every slot and
//! lock the kubelet out.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::fds::Refusals;

/// How long a failed accept waits before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Refused device-plugin connections, for every pool's socket.
pub(crate) static REFUSALS: Refusals = Refusals::new("device plugin");

/// Binds `sock` anew (a file left there is removed) for the kubelet alone, as its own sockets
/// are (mode 0600). The name appears only once it listens with that mode
/// ([`crate::host::socket::bind_in_place`]): the kubelet's plugin watcher dials the moment it
/// sees it. A peer of another uid (where the mode was changed) is closed at accept ([`capped`]).
pub(crate) fn bind_private(sock: &std::path::Path) -> io::Result<UnixListener> {
    match std::fs::remove_file(sock) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = crate::host::socket::bind_in_place(sock, 0o600)?;
    listener.set_nonblocking(true)?;
    UnixListener::from_std(listener)
}

/// An accepted connection holding its place in the budget until it is closed.
#[derive(Debug)]
pub struct Capped {
    stream: UnixStream,
    _slot: OwnedSemaphorePermit,
}

/// The connections of `listener`, each holding one of `slots` (shared by every pool's socket);
/// one that finds none left is closed at once. Never ends and never yields an error.
pub(crate) fn capped(
    listener: UnixListener,
    slots: Arc<Semaphore>,
    refusals: &'static Refusals,
) -> impl Stream<Item = io::Result<Capped>> + Send + 'static {
    futures_util::stream::unfold((listener, slots), move |(listener, slots)| async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) if !kubelet_peer(&stream) => {
                    let uid = stream.peer_cred().map_or(u32::MAX, |c| c.uid());
                    refusals.note(&format!("a peer of uid {uid}: only root and the daemon's uid are served"));
                    drop(stream);
                }
                Ok((stream, _)) => match slots.clone().try_acquire_owned() {
                    Ok(slot) => return Some((Ok(Capped { stream, _slot: slot }), (listener, slots))),
                    Err(_) => {
                        refusals.note("every connection of the device-plugin sockets is taken");
                        drop(stream);
                    }
                },
                Err(e) => {
                    refusals.note(&format!("accept: {e}"));
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    })
}

/// Whether the peer of `stream` may be the kubelet: root, or the daemon's own uid (a sandbox's
/// owner, whose kubelet-shaped peer runs as that user).
fn kubelet_peer(stream: &UnixStream) -> bool {
    stream.peer_cred().is_ok_and(|c| c.uid() == 0 || c.uid() == rustix::process::geteuid().as_raw())
}

impl tonic::transport::server::Connected for Capped {
    type ConnectInfo = <UnixStream as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Capped {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Capped {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use tokio::io::AsyncReadExt;

    static TEST_REFUSALS: Refusals = Refusals::new("device plugin (test)");

    #[tokio::test]
    async fn a_connection_beyond_the_budget_is_closed_and_a_freed_slot_is_used_again() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("p.sock");
        let listener = UnixListener::bind(&path).unwrap_or_else(|e| panic!("{e}"));
        let slots = Arc::new(Semaphore::new(2));
        let mut incoming = Box::pin(capped(listener, slots.clone(), &TEST_REFUSALS));
        let connect = || async { UnixStream::connect(&path).await.unwrap_or_else(|e| panic!("{e}")) };
        let (_c1, _c2) = (connect().await, connect().await);
        let first = incoming.next().await;
        let _second = incoming.next().await;
        assert_eq!(slots.available_permits(), 0);
        // The third is closed at accept: its peer reads the end of the stream, while the
        // stream yields nothing.
        let mut third = connect().await;
        let mut buf = [0u8; 1];
        tokio::select! {
            _ = incoming.next() => panic!("a connection beyond the budget was served"),
            n = third.read(&mut buf) => assert_eq!(n.unwrap_or_else(|e| panic!("{e}")), 0),
        }
        drop(first);
        assert_eq!(slots.available_permits(), 1);
        let _c4 = connect().await;
        assert!(matches!(incoming.next().await, Some(Ok(_))));
    }
}
