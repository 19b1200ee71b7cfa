//! Load-balancing policies, one file each.
//!
//! A policy is a small pure unit: it sees a group of servers through [`Candidates`]
//! (current effective weight, 0 meaning "not available for this pick", and this worker's
//! in-flight count), keeps its own per-worker state (a cursor, smooth-WRR weights, EWMA
//! estimates), and returns a member index. No I/O, no clock (time is passed in), no shared
//! mutable state: the caller (`upstream::select`) owns availability, groups (primary and
//! backup) and exclusion of already-tried servers.

pub mod consistent_hash;
pub mod least_connections;
pub mod p2c_ewma;
pub mod random;
pub mod rng;
pub mod round_robin;
pub mod sticky_cookie;
pub mod weighted_round_robin;

/// What a policy sees of a group of servers when it picks one. Members are `0..len()`.
pub trait Candidates {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The member's current effective weight; 0 = not available for this pick (down,
    /// ejected, at `max_connections`, or already tried by this request).
    fn weight(&self, member: usize) -> u32;
    /// Requests this worker has in flight to the member.
    fn in_flight(&self, member: usize) -> u32;
}

/// A fixed set of candidates, for tests and benchmarks.
#[derive(Debug, Clone, Default)]
pub struct Fixed {
    pub weights: Vec<u32>,
    pub in_flight: Vec<u32>,
}

impl Fixed {
    pub fn new(weights: &[u32]) -> Fixed {
        Fixed {
            weights: weights.to_vec(),
            in_flight: vec![0; weights.len()],
        }
    }
}

impl Candidates for Fixed {
    fn len(&self) -> usize {
        self.weights.len()
    }

    fn weight(&self, member: usize) -> u32 {
        self.weights[member]
    }

    fn in_flight(&self, member: usize) -> u32 {
        self.in_flight[member]
    }
}
