//! Who may hold the endpoint's connection slots, and who gives way when they are all taken.
//!
//! The endpoint is open to every local user (and, on a TCP address other than loopback, to the
//! network), so a client that connects and sends nothing, or keeps a connection alive between
//! requests, must not be able to hold the slots scrapers need. The rules:
//! - a connection is **idle** while no request is being answered on it: from its accept to its
//!   first complete request head, and between the end of an answer and the next head;
//! - an idle connection gives way only once it has been read and had nothing to read (it
//!   **waited**): a connection just accepted, whose request may be in its socket unread, is
//!   passed over while there is a waited one to close; when only such connections could give way,
//!   the server lets them be read first ([`Admit::Wait`]) and then closes the oldest;
//! - one [`Peer`] holds at most `per_peer` slots; beyond that, its own longest-idle connection is
//!   closed for the new one (or, when all of its connections are answering, the new one is);
//! - when every slot is taken, the longest-idle connection of anyone is closed for the new one,
//!   and only when every connection is answering a request is the new one closed at accept.
//!
//! So connections that ask nothing cost their owner the slot as soon as someone else connects,
//! and a peer flooding connections evicts its own first. This table only decides; the server
//! closes what it is told to (the handle type `H`: the connection task's abort handle there).
#![deny(missing_docs)]

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Who a connection comes from, for the per-peer limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// A remote address (IPv4-mapped IPv6 addresses as IPv4).
    Ip(IpAddr),
    /// Any loopback address: every local user can pick its source address in `127.0.0.0/8`,
    /// so the addresses do not tell local users apart and count as one peer.
    Loopback,
    /// A unix socket peer, by uid (`SO_PEERCRED`).
    Uid(u32),
    /// A peer whose address or credentials could not be read.
    Unknown,
}

impl Peer {
    /// The peer of a TCP connection from `ip`.
    pub fn from_ip(ip: IpAddr) -> Peer {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        if ip.is_loopback() {
            Peer::Loopback
        } else {
            Peer::Ip(ip)
        }
    }
}

/// What one connection is doing, shared by its task (which marks requests) and the table.
#[derive(Debug)]
pub struct Activity {
    /// Requests being answered (HTTP/1 answers one at a time; a count keeps it exact anyway).
    answering: AtomicUsize,
    /// When it last became idle, on the table's clock (a counter: ordering is all that matters).
    idle_since: AtomicU64,
    /// A read found nothing to read (see the module's rules).
    waited: AtomicBool,
    clock: Arc<AtomicU64>,
}

impl Activity {
    /// Marks a request as being answered until the guard is dropped (the server drops it with
    /// the answer's body, once the body has been written out).
    pub fn answering(self: &Arc<Self>) -> Answering {
        self.answering.fetch_add(1, Ordering::SeqCst);
        Answering(self.clone())
    }

    /// Records that a read of the connection found nothing to read.
    pub fn waited(&self) {
        self.waited.store(true, Ordering::SeqCst);
    }

    fn idle(&self) -> bool {
        self.answering.load(Ordering::SeqCst) == 0
    }

    fn has_waited(&self) -> bool {
        self.waited.load(Ordering::SeqCst)
    }
}

/// A request being answered; dropping it makes the connection idle again.
#[derive(Debug)]
pub struct Answering(Arc<Activity>);

impl Drop for Answering {
    fn drop(&mut self) {
        let a = &self.0;
        a.idle_since.store(a.clock.fetch_add(1, Ordering::SeqCst), Ordering::SeqCst);
        a.answering.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The decision for a new connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit<H> {
    /// There is a free slot.
    Room,
    /// Close this connection (already out of the table) to make room.
    Evict(H),
    /// Only connections not read yet could give way: let them be read, then ask again (with
    /// `patient` false, the oldest of them is evicted instead).
    Wait,
    /// Every connection that could give way is answering: close the new one.
    Refuse,
}

struct Entry<H> {
    peer: Peer,
    activity: Arc<Activity>,
    handle: H,
}

/// The connections being served.
pub struct Slots<H> {
    max: usize,
    per_peer: usize,
    clock: Arc<AtomicU64>,
    conns: Vec<Entry<H>>,
}

impl<H> Slots<H> {
    /// A table of `max` slots, at most `per_peer` of them for one peer (both at least 1).
    pub fn new(max: usize, per_peer: usize) -> Slots<H> {
        Slots {
            max: max.max(1),
            per_peer: per_peer.clamp(1, max.max(1)),
            clock: Arc::default(),
            conns: Vec::new(),
        }
    }

    /// Connections in the table.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.conns.len()
    }

    /// Makes room for a new connection from `peer` (see the module's rules). After
    /// [`Admit::Room`] or [`Admit::Evict`], [`Slots::insert`] the new connection.
    pub fn admit(&mut self, peer: &Peer, patient: bool) -> Admit<H> {
        let own = self.conns.iter().filter(|e| e.peer == *peer).count();
        let mine = |e: &Entry<H>| own < self.per_peer || e.peer == *peer;
        if own < self.per_peer && self.conns.len() < self.max {
            return Admit::Room;
        }
        let waited = self.longest_idle(|e| mine(e) && e.activity.has_waited());
        let victim = match waited {
            Some(i) => i,
            None => match self.longest_idle(mine) {
                Some(_) if patient => return Admit::Wait,
                Some(i) => i,
                None => return Admit::Refuse,
            },
        };
        Admit::Evict(self.conns.remove(victim).handle)
    }

    fn longest_idle(&self, of: impl Fn(&Entry<H>) -> bool) -> Option<usize> {
        self.conns
            .iter()
            .enumerate()
            .filter(|(_, e)| of(e) && e.activity.idle())
            .min_by_key(|(_, e)| e.activity.idle_since.load(Ordering::SeqCst))
            .map(|(i, _)| i)
    }

    /// The activity record of a new connection (idle from now on).
    pub fn activity(&self) -> Arc<Activity> {
        Arc::new(Activity {
            answering: AtomicUsize::new(0),
            idle_since: AtomicU64::new(self.clock.fetch_add(1, Ordering::SeqCst)),
            waited: AtomicBool::new(false),
            clock: self.clock.clone(),
        })
    }

    /// Takes a connection admitted by [`Slots::admit`].
    pub fn insert(&mut self, peer: Peer, activity: Arc<Activity>, handle: H) {
        self.conns.push(Entry { peer, activity, handle });
    }

    /// Forgets the connections whose handle matches (they ended).
    pub fn remove(&mut self, ended: impl Fn(&H) -> bool) {
        self.conns.retain(|e| !ended(&e.handle));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(last: u8) -> Peer {
        Peer::Ip(IpAddr::from([192, 0, 2, last]))
    }

    /// Admits one connection named `id` from `p` that is then read and has nothing to read,
    /// returning the decision.
    fn connect(s: &mut Slots<u32>, p: Peer, id: u32) -> (Admit<u32>, Arc<Activity>) {
        let a = s.admit(&p, true);
        let activity = s.activity();
        if matches!(a, Admit::Room | Admit::Evict(_)) {
            s.insert(p, activity.clone(), id);
        }
        activity.waited();
        (a, activity)
    }

    #[test]
    fn a_full_table_evicts_the_longest_idle_connection() {
        let mut s = Slots::new(3, 3);
        let (_, a1) = connect(&mut s, peer(1), 1);
        let (_, a2) = connect(&mut s, peer(2), 2);
        connect(&mut s, peer(3), 3);
        // 1 answers a request and goes idle again: now 2 has been idle longest.
        drop(a1.answering());
        assert_eq!(connect(&mut s, peer(4), 4).0, Admit::Evict(2));
        // A connection being answered is never evicted.
        let _busy = a2.answering();
        assert_eq!(connect(&mut s, peer(5), 5).0, Admit::Evict(3));
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn a_peer_at_its_limit_evicts_its_own_connections_first() {
        let mut s = Slots::new(4, 2);
        connect(&mut s, peer(9), 1);
        connect(&mut s, Peer::Loopback, 2);
        connect(&mut s, Peer::Loopback, 3);
        // Loopback is at its limit: its own oldest idle gives way, not the older 1.
        assert_eq!(connect(&mut s, Peer::Loopback, 4).0, Admit::Evict(2));
        // Another peer still finds room.
        assert_eq!(connect(&mut s, peer(8), 5).0, Admit::Room);
    }

    #[test]
    fn only_when_everyone_is_answering_is_the_new_connection_refused() {
        let mut s = Slots::new(2, 1);
        let (_, a) = connect(&mut s, peer(1), 1);
        let (_, b) = connect(&mut s, peer(2), 2);
        let (_busy_a, _busy_b) = (a.answering(), b.answering());
        assert_eq!(connect(&mut s, peer(3), 3).0, Admit::Refuse);
        // A peer at its limit with its one connection answering is refused too.
        assert_eq!(connect(&mut s, peer(1), 4).0, Admit::Refuse);
        s.remove(|h| *h == 1);
        assert_eq!(connect(&mut s, peer(3), 5).0, Admit::Room);
    }

    #[test]
    fn a_connection_not_read_yet_gives_way_last() {
        let mut s = Slots::new(2, 2);
        connect(&mut s, peer(1), 1);
        // 2 is accepted but not read yet: its request may be waiting in the socket.
        assert_eq!(s.admit(&peer(2), true), Admit::Room);
        let fresh = s.activity();
        s.insert(peer(2), fresh.clone(), 2);
        // The older 1 has been read and found idle: it gives way, not 2.
        assert_eq!(connect(&mut s, peer(3), 3).0, Admit::Evict(1));
        let _busy = s.conns.iter().find(|e| e.handle == 3).map(|e| e.activity.answering());
        // Only 2 could give way: the server is asked to let it be read first...
        assert_eq!(s.admit(&peer(4), true), Admit::Wait);
        // ...and when it has waited enough, 2 goes.
        assert_eq!(s.admit(&peer(4), false), Admit::Evict(2));
    }

    #[test]
    fn loopback_addresses_are_one_peer() {
        assert_eq!(Peer::from_ip("127.0.0.2".parse().unwrap_or_else(|e| panic!("{e}"))), Peer::Loopback);
        assert_eq!(
            Peer::from_ip("::ffff:127.0.0.1".parse().unwrap_or_else(|e| panic!("{e}"))),
            Peer::Loopback
        );
        assert_eq!(Peer::from_ip("::1".parse().unwrap_or_else(|e| panic!("{e}"))), Peer::Loopback);
        assert_eq!(
            Peer::from_ip("::ffff:192.0.2.7".parse().unwrap_or_else(|e| panic!("{e}"))),
            Peer::Ip(IpAddr::from([192, 0, 2, 7]))
        );
    }
}
