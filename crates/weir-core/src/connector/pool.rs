//! The per-worker pool of idle upstream connections, keyed by server address.
//!
//! Worker-local (no lock): each worker owns its pool. Connections are reused newest first
//! (warm, least likely to have been closed by the upstream's idle timer). A connection
//! is checked before reuse: one that the upstream closed, or sent unexpected bytes on, while
//! idle is dropped here instead of failing a request. The check costs no syscall when the
//! socket has had no readiness event since it was pooled.
//!
//! Every proxied request takes from and returns to this pool, so it avoids what it can on
//! that path: the key last taken from or put to is remembered, so a request to the server
//! the previous one went to (always, with one server) finds its connections with one
//! comparison instead of a hash-map lookup (two per proxied request; a request to another
//! server pays the comparison and the lookup); the map behind it is hashed with a
//! multiply-rotate hash instead of SipHash (the keys are configured server addresses, not
//! attacker input); `take` and `put` report the idle count for the pool gauge from the
//! same lookup, and the caller passes the time it already read instead of the pool
//! reading the clock again.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use weir_config::UpstreamServer;

use super::stream::UpstreamStream;

/// What a pooled connection can be reused for: the server's address and, for TLS, which
/// TLS client made it (0: plain TCP) and which name it verified, so a plain and a TLS
/// upstream on one address (or two TLS upstreams verifying different names, or two servers
/// `a.example:443` and `b.example:443` of one upstream resolving to one address) never
/// share connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolKey {
    pub addr: SocketAddr,
    pub tls: u64,
    /// `TlsUpstream::name_id` of the server (0 for plain TCP).
    pub name: u32,
}

impl PoolKey {
    /// The key of connections to `server` made with `tls` (or plain).
    #[inline]
    pub fn new(server: &UpstreamServer, tls: Option<&super::TlsUpstream>) -> PoolKey {
        match tls {
            None => PoolKey::from(server.addr),
            Some(t) => PoolKey {
                addr: server.addr,
                tls: t.pool_id,
                name: t.name_id(server),
            },
        }
    }
}

/// Two words for the hasher where the derived `Hash` fed it six pieces (the address's
/// variant, its octets as a length-prefixed slice, the port, `tls`, `name`): the pool is
/// looked up twice per proxied request. Hashes a subset of what `Eq` compares (a v6
/// address's flow label and scope are left out), so equal keys hash equally.
impl Hash for PoolKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let (ip, port) = match self.addr {
            SocketAddr::V4(a) => (u128::from(a.ip().to_bits()), a.port()),
            SocketAddr::V6(a) => (a.ip().to_bits(), a.port()),
        };
        // The port in the low bits: the multiply carries only upward (`AddrHasher`).
        let ip = (ip as u64) ^ ((ip >> 64) as u64).rotate_left(17);
        state.write_u64(ip.rotate_left(16) ^ u64::from(port));
        state.write_u64(self.tls ^ u64::from(self.name).rotate_left(32));
    }
}

impl From<SocketAddr> for PoolKey {
    fn from(addr: SocketAddr) -> Self {
        PoolKey {
            addr,
            tls: 0,
            name: 0,
        }
    }
}

struct Idle {
    stream: UpstreamStream,
    since: Instant,
}

/// Hashes server addresses (FxHash's multiply-rotate step): a few instructions per word
/// where SipHash takes a few hundred per lookup. Also the pending counts of shared rate
/// limits, keyed by the limiter's own (SipHash) hash of a key.
#[derive(Default)]
pub(crate) struct AddrHasher(u64);

impl AddrHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    /// The multiply carries only upward, and the map picks buckets by the low bits: the
    /// well-mixed high bits are rotated down (as rustc-hash 2 does), so that what a key
    /// has in a word's high bits (a TLS key's name) reaches the bucket too.
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }
}

/// Idle connections by key: each key's list in `slots` (newest last), found through
/// `index`, or without it when the key is the one used last.
#[derive(Default)]
pub struct IdlePool {
    /// A key's slot stays once made (an emptied list is kept for the next connection),
    /// so positions in `index` and `last` stay valid until `clear` or `sweep`.
    slots: Vec<(PoolKey, Vec<Idle>)>,
    index: HashMap<PoolKey, usize, BuildHasherDefault<AddrHasher>>,
    /// The slot of the last `take` or `put` (0 while `slots` is empty).
    last: usize,
}

impl IdlePool {
    /// The idle connections of `key`, if it ever had any. Inlined: the comparison with
    /// the last key used is the common path.
    #[inline]
    fn list(&mut self, key: &PoolKey) -> Option<&mut Vec<Idle>> {
        let at = match self.slots.get(self.last) {
            Some((last, _)) if last == key => self.last,
            _ => self.lookup(key)?,
        };
        self.slots.get_mut(at).map(|(_, list)| list)
    }

    /// `key`'s slot through the map (remembered as the last one used).
    #[inline(never)]
    fn lookup(&mut self, key: &PoolKey) -> Option<usize> {
        let at = *self.index.get(key)?;
        self.last = at;
        Some(at)
    }

    /// [`IdlePool::list`], made empty if `key` has no slot yet.
    #[inline]
    fn list_or_new(&mut self, key: PoolKey) -> &mut Vec<Idle> {
        if self.list(&key).is_none() {
            self.last = self.slots.len();
            self.index.insert(key, self.last);
            self.slots.push((key, Vec::new()));
        }
        &mut self.slots[self.last].1
    }

    /// A live idle connection to `addr` that has been idle less than `max_idle_time` at
    /// `now`, and the number of idle connections to `addr` left after taking it.
    pub fn take(
        &mut self,
        key: impl Into<PoolKey>,
        max_idle_time: Duration,
        now: Instant,
    ) -> (Option<UpstreamStream>, usize) {
        let Some(list) = self.list(&key.into()) else {
            return (None, 0);
        };
        if max_idle_time.is_zero() {
            // Nothing is fresh (a connection pooled by a request that started after this
            // one would pass the comparison below).
            list.clear();
            return (None, 0);
        }
        // Idle since after this: fresh. One subtraction per take, not a duration per
        // connection looked at.
        let stale_at_or_before = now.checked_sub(max_idle_time);
        while let Some(idle) = list.pop() {
            let fresh = stale_at_or_before.is_none_or(|stale| idle.since > stale);
            if fresh && still_open(idle.stream.tcp()) {
                return (Some(idle.stream), list.len());
            }
        }
        (None, 0)
    }

    /// Returns a connection that went idle at `now` to the pool; beyond `max_idle` the
    /// oldest is closed. Returns the number of idle connections to `addr`.
    pub fn put(
        &mut self,
        key: impl Into<PoolKey>,
        stream: impl Into<UpstreamStream>,
        max_idle: usize,
        now: Instant,
    ) -> usize {
        let key = key.into();
        if max_idle == 0 {
            return self.idle_count(key);
        }
        let stream = stream.into();
        let list = self.list_or_new(key);
        if list.len() >= max_idle {
            list.remove(0);
        }
        list.push(Idle { stream, since: now });
        list.len()
    }

    /// Idle connections held for `key`.
    pub fn idle_count(&self, key: impl Into<PoolKey>) -> usize {
        let at = self.index.get(&key.into());
        at.map_or(0, |&at| self.slots[at].1.len())
    }

    /// Closes every idle connection (on drain).
    pub fn clear(&mut self) {
        self.slots.clear();
        self.index.clear();
        self.last = 0;
    }

    /// Closes the idle connections no request would take any more: idle for
    /// `longest_idle` (the longest `idle_timeout` of the running config: past it, no
    /// upstream's request takes them) or closed by the server meanwhile; then forgets the
    /// keys left with none. `take` only looks at a key that is asked for again, so without
    /// this a server gone from the config or from DNS kept its connections (and their
    /// descriptors, in CLOSE_WAIT once the server closed them) until the worker ended.
    /// Returns the number of connections closed.
    pub fn sweep(&mut self, longest_idle: Duration, now: Instant) -> usize {
        let stale_at_or_before = now.checked_sub(longest_idle);
        let mut closed = 0;
        for (_, list) in &mut self.slots {
            let before = list.len();
            list.retain(|idle| {
                let fresh = stale_at_or_before.is_none_or(|stale| idle.since > stale);
                fresh && still_open(idle.stream.tcp())
            });
            closed += before - list.len();
        }
        self.slots.retain(|(_, list)| !list.is_empty());
        self.index.clear();
        for (at, (key, _)) in self.slots.iter().enumerate() {
            self.index.insert(*key, at);
        }
        self.last = 0;
        closed
    }
}

/// An idle connection must have nothing to read: EOF means the upstream closed it, data
/// means it broke protocol (for TLS: a close_notify, or anything else unasked for; the
/// byte read is lost, but the connection is dropped then anyway). `try_read` only
/// reaches the kernel if readiness was signalled.
fn still_open(stream: &tokio::net::TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpStream;

    /// A pooled-style connection to a listener, and the accepted other end.
    async fn conn(l: &tokio::net::TcpListener) -> (TcpStream, TcpStream) {
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    }

    #[tokio::test]
    async fn takes_newest_first_and_counts_what_is_left() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut pool = IdlePool::default();
        let now = Instant::now();
        let (a, _a) = conn(&l).await;
        let (b, _b) = conn(&l).await;
        let b_port = b.local_addr().unwrap().port();
        assert_eq!(pool.put(addr, a, 8, now), 1);
        assert_eq!(pool.put(addr, b, 8, now), 2);
        let (taken, left) = pool.take(addr, Duration::from_secs(60), now);
        assert_eq!(taken.unwrap().tcp().local_addr().unwrap().port(), b_port);
        assert_eq!(left, 1);
        assert_eq!(pool.idle_count(addr), 1);
        let other: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert!(matches!(
            pool.take(other, Duration::from_secs(60), now),
            (None, 0)
        ));
    }

    /// Two servers in turn: each take and put finds its own key's connections, whether
    /// its key was the last one used or not; `clear` forgets both.
    #[tokio::test]
    async fn alternating_keys_keep_their_own_connections() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let m = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (a, b) = (l.local_addr().unwrap(), m.local_addr().unwrap());
        let mut pool = IdlePool::default();
        let now = Instant::now();
        let (to_a, _a) = conn(&l).await;
        let (to_b, _b) = conn(&m).await;
        let (to_b2, _b2) = conn(&m).await;
        assert_eq!(pool.put(a, to_a, 8, now), 1);
        assert_eq!(pool.put(b, to_b, 8, now), 1);
        assert_eq!(pool.put(b, to_b2, 8, now), 2);
        let peer = |s: Option<UpstreamStream>| s.unwrap().tcp().peer_addr().unwrap();
        let (taken, left) = pool.take(a, Duration::from_secs(60), now);
        assert_eq!((peer(taken), left), (a, 0));
        let (taken, left) = pool.take(b, Duration::from_secs(60), now);
        assert_eq!((peer(taken), left), (b, 1));
        assert!(matches!(
            pool.take(a, Duration::from_secs(60), now),
            (None, 0)
        ));
        assert_eq!(pool.idle_count(b), 1);
        pool.clear();
        assert_eq!(pool.idle_count(b), 0);
        assert!(matches!(
            pool.take(b, Duration::from_secs(60), now),
            (None, 0)
        ));
    }

    #[tokio::test]
    async fn skips_connections_idle_too_long_or_closed_by_the_upstream() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut pool = IdlePool::default();
        let start = Instant::now();
        let (old, _old) = conn(&l).await;
        pool.put(addr, old, 8, start);
        let later = start + Duration::from_secs(10);
        assert!(matches!(
            pool.take(addr, Duration::from_secs(5), later),
            (None, 0)
        ));
        let (closed, server_side) = conn(&l).await;
        drop(server_side);
        // Wait until the close has reached the pooled socket (readiness, not a sleep).
        closed.readable().await.unwrap();
        pool.put(addr, closed, 8, start);
        assert!(matches!(
            pool.take(addr, Duration::from_secs(60), start),
            (None, 0)
        ));
    }

    /// A sweep closes what no take would use (idle past the longest idle timeout, or
    /// closed by the server) under every key, asked for again or not, and forgets the
    /// keys left empty; the keys that keep connections are still found after it.
    #[tokio::test]
    async fn a_sweep_closes_stale_and_closed_connections_of_keys_not_asked_for() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let m = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let n = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (gone, kept, old) = (
            l.local_addr().unwrap(),
            m.local_addr().unwrap(),
            n.local_addr().unwrap(),
        );
        let mut pool = IdlePool::default();
        let start = Instant::now();
        let later = start + Duration::from_secs(100);
        let (closed, server_side) = conn(&l).await;
        drop(server_side);
        closed.readable().await.unwrap();
        pool.put(gone, closed, 8, later);
        let (stale, _stale) = conn(&n).await;
        pool.put(old, stale, 8, start);
        let (fresh, _fresh) = conn(&m).await;
        pool.put(kept, fresh, 8, later);
        assert_eq!(pool.sweep(Duration::from_secs(60), later), 2);
        assert_eq!((pool.idle_count(gone), pool.idle_count(old)), (0, 0));
        assert_eq!(pool.slots.len(), 1, "the emptied keys are forgotten");
        let (taken, left) = pool.take(kept, Duration::from_secs(60), later);
        assert_eq!(taken.unwrap().tcp().peer_addr().unwrap(), kept);
        assert_eq!(left, 0);
    }

    #[tokio::test]
    async fn keeps_at_most_max_idle_dropping_the_oldest() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut pool = IdlePool::default();
        let now = Instant::now();
        let mut ports = Vec::new();
        let mut server_sides = Vec::new();
        for _ in 0..3 {
            let (c, s) = conn(&l).await;
            ports.push(c.local_addr().unwrap().port());
            server_sides.push(s);
            pool.put(addr, c, 2, now);
        }
        assert_eq!(pool.idle_count(addr), 2);
        let taken: Vec<u16> = (0..2)
            .map(|_| pool.take(addr, Duration::from_secs(60), now).0.unwrap())
            .map(|s| s.tcp().local_addr().unwrap().port())
            .collect();
        assert_eq!(taken, vec![ports[2], ports[1]], "the oldest was closed");
        assert_eq!(
            pool.put(addr, TcpStream::from_std(std_conn(addr)).unwrap(), 0, now),
            0
        );
    }

    fn std_conn(addr: SocketAddr) -> std::net::TcpStream {
        let s = std::net::TcpStream::connect(addr).unwrap();
        s.set_nonblocking(true).unwrap();
        s
    }

    #[test]
    fn addresses_hash_apart() {
        use std::hash::BuildHasher;
        let build = BuildHasherDefault::<AddrHasher>::default();
        let a: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:8081".parse().unwrap();
        let c: SocketAddr = "[::1]:8080".parse().unwrap();
        let hashes = [build.hash_one(a), build.hash_one(b), build.hash_one(c)];
        assert_ne!(hashes[0], hashes[1]);
        assert_ne!(hashes[0], hashes[2]);
        assert_eq!(build.hash_one(a), hashes[0]);
    }

    /// The map picks a bucket by the hash's low bits: servers of one address on many
    /// ports must spread over them (they fell in 32 with the port in the high bits alone).
    #[test]
    fn ports_of_one_address_spread_over_the_buckets() {
        use std::hash::BuildHasher;
        let build = BuildHasherDefault::<AddrHasher>::default();
        let buckets: std::collections::HashSet<u64> = (0..1024u16)
            .map(|i| SocketAddr::from(([127, 0, 0, 1], 8000 + i)))
            .map(|addr| build.hash_one(PoolKey::from(addr)) & 1023)
            .collect();
        assert!(buckets.len() > 512, "{} of 1024 buckets", buckets.len());
    }

    /// `idle_timeout = "0s"`: nothing is reused, even a connection pooled by a request
    /// that started after the taker's.
    #[tokio::test]
    async fn a_zero_idle_time_reuses_nothing() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut pool = IdlePool::default();
        let now = Instant::now();
        let (c, _s) = conn(&l).await;
        pool.put(addr, c, 8, now + Duration::from_millis(5));
        assert!(matches!(pool.take(addr, Duration::ZERO, now), (None, 0)));
        assert_eq!(pool.idle_count(addr), 0);
    }
}
