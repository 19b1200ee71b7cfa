//! Consistent hashing on a ring (ketama style).
//!
//! Each member is placed on a 64-bit ring at `points_per_weight x weight` points derived
//! from its name, so a member's points do not depend on the other members: adding or
//! removing one moves only the keys that land on (or leave) its arcs, about 1/n of them.
//! A key goes to the member owning the first point at or after the key's hash; if that
//! member is unavailable, the walk continues clockwise to the next available one, so the
//! keys of a down member spread over the others instead of all moving to one neighbour.

use super::Candidates;

/// Points per unit of weight (160, as ketama), reduced for large pools so the ring stays
/// under [`MAX_POINTS`].
const POINTS_PER_WEIGHT: u64 = 160;
const MAX_POINTS: u64 = 64 * 1024;

/// A built ring: sorted `(point, member)` pairs. Immutable; lives in the pool snapshot.
#[derive(Debug, Clone, Default)]
pub struct Ring {
    points: Box<[(u64, u32)]>,
}

impl Ring {
    /// `members`: each member's stable name (the server address as configured) and weight.
    pub fn new<'a>(members: impl IntoIterator<Item = (&'a str, u32)>) -> Ring {
        let members: Vec<(&str, u32)> = members.into_iter().collect();
        let total_weight: u64 = members.iter().map(|(_, w)| u64::from(*w)).sum();
        let per_weight = POINTS_PER_WEIGHT
            .min(MAX_POINTS / total_weight.max(1))
            .max(1);
        let mut points = Vec::with_capacity((total_weight * per_weight) as usize);
        for (member, (name, weight)) in members.iter().enumerate() {
            for k in 0..u64::from(*weight) * per_weight {
                let mut h = Fnv::new();
                h.write(name.as_bytes());
                h.write(b"#");
                h.write(&k.to_le_bytes());
                points.push((h.finish(), member as u32));
            }
        }
        points.sort_unstable();
        Ring {
            points: points.into_boxed_slice(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The member for `key_hash`: the owner of the first point clockwise whose member is
    /// available (`weight > 0`).
    pub fn pick(&self, key_hash: u64, c: &impl Candidates) -> Option<usize> {
        let n = self.points.len();
        if n == 0 {
            return None;
        }
        let start = self.points.partition_point(|(p, _)| *p < key_hash);
        let mut checked = 0u64;
        for k in 0..n {
            let member = self.points[(start + k) % n].1 as usize;
            if c.weight(member) > 0 {
                return Some(member);
            }
            // Stop early once every member has been seen unavailable.
            checked |= 1u64.checked_shl(member as u32).unwrap_or(0);
            if c.len() <= 64 && checked.count_ones() as usize >= c.len() {
                return None;
            }
        }
        None
    }
}

/// 64-bit FNV-1a with a final avalanche (murmur3's fmix64), for ring points and keys.
#[derive(Debug, Clone, Copy)]
pub struct Fnv(u64);

impl Fnv {
    pub fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    pub fn finish(self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv::new()
    }
}

/// The hash of a request key (client address, header or cookie value, path).
pub fn hash_key(key: &[u8]) -> u64 {
    let mut h = Fnv::new();
    h.write(key);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::lb::Fixed;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("10.0.0.{}:8080", i + 1)).collect()
    }

    fn ring(names: &[String]) -> Ring {
        Ring::new(names.iter().map(|n| (n.as_str(), 1)))
    }

    fn key(i: u32) -> u64 {
        hash_key(format!("client-{i}").as_bytes())
    }

    #[test]
    fn same_key_same_member() {
        let r = ring(&names(3));
        let c = Fixed::new(&[1, 1, 1]);
        for i in 0..100 {
            assert_eq!(r.pick(key(i), &c), r.pick(key(i), &c));
        }
    }

    #[test]
    fn adding_a_fourth_member_moves_at_most_30_percent_of_keys() {
        let three = ring(&names(3));
        let four = ring(&names(4));
        let (c3, c4) = (Fixed::new(&[1; 3]), Fixed::new(&[1; 4]));
        let mut counts = [0u32; 4];
        let mut moved = 0;
        for i in 0..10_000 {
            let before = three.pick(key(i), &c3).unwrap();
            let after = four.pick(key(i), &c4).unwrap();
            counts[after] += 1;
            if before != after {
                assert_eq!(after, 3, "a key only ever moves to the new member");
                moved += 1;
            }
        }
        assert!(moved <= 3000, "{moved} of 10000 keys moved");
        assert!(counts.iter().all(|&n| n > 1800), "balanced: {counts:?}");
    }

    #[test]
    fn a_down_members_keys_spread_and_come_back() {
        let r = ring(&names(3));
        let up = Fixed::new(&[1, 1, 1]);
        let one_down = Fixed::new(&[1, 0, 1]);
        let mut to = [0u32; 3];
        for i in 0..3000 {
            let normal = r.pick(key(i), &up).unwrap();
            let degraded = r.pick(key(i), &one_down).unwrap();
            if normal == 1 {
                to[degraded] += 1;
            } else {
                assert_eq!(normal, degraded, "keys of up members stay");
            }
        }
        assert_eq!(to[1], 0);
        assert!(
            to[0] > 200 && to[2] > 200,
            "spread over both others: {to:?}"
        );
        assert_eq!(r.pick(key(1), &Fixed::new(&[0, 0, 0])), None);
    }

    #[test]
    fn weight_scales_the_share() {
        let names = names(2);
        let r = Ring::new([(names[0].as_str(), 1), (names[1].as_str(), 3)]);
        let c = Fixed::new(&[1, 1]);
        let heavy = (0..10_000)
            .filter(|&i| r.pick(key(i), &c) == Some(1))
            .count();
        assert!((6_800..8_200).contains(&heavy), "{heavy}");
    }
}
